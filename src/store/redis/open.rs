//! Opening a [`RedisStore`]: from a URL (one connection or a pool, TLS with
//! certificates), from connections made by the caller, on a Redis Cluster, or through
//! Redis Sentinel.

use std::sync::Arc;

use redis::aio::ConnectionManager;

use super::command::{self, Connection};
#[cfg(feature = "redis-sentinel")]
use super::sentinel::{self, SentinelOptions};
#[cfg(feature = "redis-tls")]
use super::tls::{self, RedisTls};
use super::url;
use super::{RedisBackend, RedisStore};
use crate::base::error::ConfigError;
use crate::store::resilient::Resilient;

/// The most connections [`RedisStore::open_pool`] opens.
const MAX_CONNECTIONS: usize = 64;

/// How long a connection waits for a reply before it gives the call up: long past the
/// failure policy's own timeout, so that the answer of a call that timed out there is
/// still read when it comes late (a Redis slow but alive: it decided the call, and what
/// it decided is settled, see `Resilient`). redis-rs's default, 500 ms, dropped those
/// answers: a check Redis granted was lost, one it refused went uncharged.
const RESPONSE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

impl RedisStore {
    /// A store on the Redis server at `url` (`redis://[user:password@]host[:port][/db]`,
    /// `rediss://` with the feature `redis-tls`, `unix:///path`) that never fails
    /// because Redis is down: the connection is made on the first request and remade
    /// whenever it is lost, and until Redis answers each limit follows its
    /// [`FailurePolicy`](crate::FailurePolicy). Connecting waits at most 1 s per attempt.
    ///
    /// An error only if the URL does not parse (the error names the URL, its password
    /// hidden) or if it is called outside a Tokio runtime (the connection's task needs
    /// one).
    ///
    /// `?protocol=resp3` at the end of the URL speaks RESP3 (Redis 6 and later): the
    /// scripts' answers read the same, and in a benchmark of 64 concurrent single-limit
    /// checks it decided 1.14–1.16× as many per second as RESP2, Redis spending about 9%
    /// less CPU per decision (three limits per request: within noise). RESP2 stays the
    /// default, which every Redis version speaks.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tollgate::ConfigError> {
    /// use tollgate::store::RedisStore;
    ///
    /// // Nothing listens on port 1: the store is made all the same.
    /// let store = RedisStore::open("redis://127.0.0.1:1/")?;
    /// assert!(RedisStore::open("http://127.0.0.1/").is_err());
    /// # let _ = store; Ok(()) }
    /// ```
    pub fn open(url: &str) -> Result<Self, ConfigError> {
        Self::open_pool(url, 1)
    }

    /// [`open`](Self::open) with `connections` connections to the server, each multiplexed,
    /// that calls take in turn (at most 64; 0 counts as 1).
    ///
    /// One connection carries any number of concurrent calls, but one task reads all its
    /// replies, so the client side of one store's traffic runs on one thread at a time. On a
    /// machine with many cores and a busy store, several connections spread that work;
    /// each connection also gets its own in-flight batches (see [`batch`](Self::batch)).
    ///
    /// Measure before choosing more than one. On a 2-core machine, where Redis's own core
    /// is the limit, two worker threads and 64 tasks of one limit each decided about 0.86×
    /// as many per second over 2 connections as over one, and 0.74× over 4 (medians of
    /// three rounds); with 256 tasks, 1.11× and 0.95×, within the rounds' spread. Redis
    /// spends more time per decision there, since more calls in flight make smaller batches.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tollgate::ConfigError> {
    /// use tollgate::store::RedisStore;
    ///
    /// let store = RedisStore::open_pool("redis://127.0.0.1:1/", 4)?;
    /// # let _ = store; Ok(()) }
    /// ```
    pub fn open_pool(url: &str, connections: usize) -> Result<Self, ConfigError> {
        let info = url::connection_info(url, "redis_url")?;
        #[cfg(feature = "redis-tls")]
        if url::is_tls(url) {
            tls::install_provider();
        }
        let client = redis::Client::open(info).map_err(|e| {
            ConfigError::new("redis_url", format!("`{}`: {e}", url::hide_password(url)))
        })?;
        Self::open_client(client, url, connections)
    }

    /// [`open`](Self::open) over TLS with the certificates of `tls` (feature `redis-tls`):
    /// `url` is a `rediss://` URL, the server's certificate must chain to `tls`'s CA (or to
    /// the platform's roots without one), and `tls`'s client certificate, if any, is
    /// presented to a server that asks for one (mutual TLS).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tollgate::ConfigError> {
    /// use tollgate::store::{RedisStore, RedisTls};
    ///
    /// let tls = RedisTls::new()
    ///     .ca_file("/etc/redis/ca.pem")?
    ///     .client_files("/etc/redis/client.pem", "/etc/redis/client.key")?;
    /// let store = RedisStore::open_tls("rediss://app:secret@redis.internal:6380/", 1, &tls)?;
    /// # let _ = store; Ok(()) }
    /// ```
    #[cfg(feature = "redis-tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis-tls")))]
    pub fn open_tls(url: &str, connections: usize, tls: &RedisTls) -> Result<Self, ConfigError> {
        let shown = url::hide_password(url);
        if !url::is_tls(url) {
            return Err(ConfigError::new(
                "redis_url",
                format!("`{shown}`: certificates are for a `rediss://` URL"),
            ));
        }
        let info = url::connection_info(url, "redis_url")?;
        tls::install_provider();
        let client = redis::Client::build_with_tls(info, tls.certificates())
            .map_err(|e| ConfigError::new("tls", format!("`{shown}`: {e}")))?;
        Self::open_client(client, url, connections)
    }

    fn open_client(
        client: redis::Client,
        url: &str,
        connections: usize,
    ) -> Result<Self, ConfigError> {
        let shown = url::hide_password(url);
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(ConfigError::new(
                "redis_url",
                format!(
                    "`{shown}`: RedisStore::open needs a Tokio runtime (call it from async code)"
                ),
            ));
        }
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(std::time::Duration::from_secs(1)))
            .set_response_timeout(Some(RESPONSE_TIMEOUT));
        let conns = (0..connections.clamp(1, MAX_CONNECTIONS))
            .map(|_| client.get_connection_manager_lazy(config.clone()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ConfigError::new("redis_url", format!("`{shown}`: {e}")))?;
        Self::pool(conns).ok_or_else(|| ConfigError::new("redis_url", "no connection"))
    }

    /// A store on one Redis server over several connections, taken in turn call by call
    /// (see [`open_pool`](Self::open_pool)); `None` without any.
    pub fn pool(conns: impl IntoIterator<Item = ConnectionManager>) -> Option<Self> {
        let mut conns: Vec<ConnectionManager> = conns.into_iter().collect();
        let conn = match conns.len() {
            0 => return None,
            1 => Connection::Single(conns.pop().expect("one")),
            _ => Connection::Pool(Arc::new(command::Pool::new(conns))),
        };
        Some(Self(Resilient::new(RedisBackend::with_connection(conn))))
    }

    /// A store on one Redis server (or a primary with replicas behind one address),
    /// through an auto-reconnecting connection manager.
    ///
    /// Give the manager a response timeout of several seconds
    /// (`ConnectionManagerConfig::set_response_timeout`; [`open`](Self::open) sets 10 s):
    /// with redis-rs's default of 500 ms, a reply later than that is dropped, and a check
    /// that timed out into the failure policy can no longer be settled with what Redis
    /// decided. The store's own [`timeout`](Self::timeout) bounds how long a request
    /// waits.
    pub fn new(conn: ConnectionManager) -> Self {
        Self(Resilient::new(RedisBackend::with_connection(
            Connection::Single(conn),
        )))
    }

    /// A store on a Redis Cluster (feature `redis-cluster`).
    #[cfg(feature = "redis-cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis-cluster")))]
    pub fn cluster(conn: redis::cluster_async::ClusterConnection) -> Self {
        Self(Resilient::new(RedisBackend::with_connection(
            Connection::Cluster(conn),
        )))
    }

    /// A store on the master that Redis Sentinel calls `master`, asking the sentinels at
    /// `sentinels` (`redis://host:port` each) where it is (feature `redis-sentinel`).
    ///
    /// It follows failovers: the connection is made on the first request, and after a
    /// failed call (a dead master, or a demoted one answering `READONLY`) the next call asks
    /// the sentinels again. Meanwhile the limits follow their failure policy, as with any
    /// Redis outage. Like [`open`](Self::open), it never fails because Redis or the
    /// sentinels are down; an error only if a URL does not parse.
    ///
    /// ```
    /// use tollgate::store::RedisStore;
    ///
    /// let store = RedisStore::sentinel(
    ///     ["redis://127.0.0.1:26379", "redis://127.0.0.1:26380", "redis://127.0.0.1:26381"],
    ///     "mymaster",
    /// )?;
    /// # let _ = store;
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    #[cfg(feature = "redis-sentinel")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis-sentinel")))]
    pub fn sentinel(
        sentinels: impl IntoIterator<Item = impl AsRef<str>>,
        master: &str,
    ) -> Result<Self, ConfigError> {
        Self::sentinel_with(sentinels, master, SentinelOptions::new())
    }

    /// [`sentinel`](Self::sentinel) with the master reached as `options` say: its ACL
    /// user and password, TLS to it, and (feature `redis-tls`) the certificates of TLS to
    /// it and to `rediss://` sentinels. The sentinels' user and password are in their
    /// URLs. Without options the master gets no password, and TLS when the sentinels'
    /// URLs are `rediss://`.
    #[cfg(feature = "redis-sentinel")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis-sentinel")))]
    pub fn sentinel_with(
        sentinels: impl IntoIterator<Item = impl AsRef<str>>,
        master: &str,
        options: SentinelOptions,
    ) -> Result<Self, ConfigError> {
        let sentinels: Vec<String> = sentinels
            .into_iter()
            .map(|s| s.as_ref().to_owned())
            .collect();
        let shown: Vec<String> = sentinels.iter().map(|s| url::hide_password(s)).collect();
        if sentinels.is_empty() {
            return Err(ConfigError::new(
                "sentinels",
                "at least one sentinel is needed",
            ));
        }
        let infos = sentinels
            .iter()
            .map(|s| url::connection_info(s, "sentinels"))
            .collect::<Result<Vec<_>, _>>()?;
        #[cfg(feature = "redis-tls")]
        if sentinels.iter().any(|s| url::is_tls(s)) {
            tls::install_provider();
        }
        let conn = sentinel::SentinelConnection::new(infos, master, &options)
            .map_err(|e| ConfigError::new("sentinels", format!("{}: {e}", shown.join(", "))))?;
        Ok(Self(Resilient::new(RedisBackend::with_connection(
            Connection::Sentinel(Arc::new(conn)),
        ))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_refuses_a_bad_url_naming_it_without_its_password() {
        let err = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async { RedisStore::open("http://u:secret@127.0.0.1/").unwrap_err() });
        assert_eq!(err.field(), "redis_url");
        assert!(err.reason().contains("http://u:***@127.0.0.1/"), "{err}");
        assert!(!err.to_string().contains("secret"), "{err}");
    }

    #[test]
    fn open_outside_a_runtime_is_an_error_not_a_panic() {
        let err = RedisStore::open("redis://127.0.0.1:1/").unwrap_err();
        assert!(err.reason().contains("Tokio runtime"), "{err}");
    }
}
