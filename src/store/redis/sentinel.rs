//! A connection to the master that Redis Sentinel names, following failovers: it is made
//! on the first call (the master's address asked of the sentinels), and after any failed
//! call it is dropped, so the next call asks the sentinels again and connects to whichever
//! node is master by then. Calls in between fail fast into the store's failure policy.
//!
//! [`SentinelOptions`]: how the store logs in to the master and whether it speaks TLS to
//! it (the sentinels' own user, password and TLS are in their URLs).

use std::fmt;
use std::sync::Mutex;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{AsyncConnectionConfig, ConnectionAddr, ConnectionInfo, RedisResult, TlsMode};

/// How a store under Redis Sentinel reaches the master the sentinels name (feature
/// `redis-sentinel`): the master's ACL user and password, TLS to it, and (feature
/// `redis-tls`) the certificates of TLS to the master and to the sentinels. The sentinels'
/// own user and password are in their URLs (`redis://user:password@host:26379`), and
/// `rediss://` sentinel URLs speak TLS to the sentinels. `Debug` hides the password.
///
/// ```
/// use tollgate::store::{RedisStore, SentinelOptions};
///
/// let options = SentinelOptions::new().master_auth(Some("app"), "secret");
/// let store = RedisStore::sentinel_with(["redis://127.0.0.1:26379"], "mymaster", options)?;
/// # let _ = store;
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[derive(Clone, Default)]
pub struct SentinelOptions {
    user: Option<String>,
    password: Option<String>,
    master_tls: Option<bool>,
    #[cfg(feature = "redis-tls")]
    tls: Option<super::RedisTls>,
}

impl fmt::Debug for SentinelOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("SentinelOptions");
        d.field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("master_tls", &self.master_tls);
        #[cfg(feature = "redis-tls")]
        d.field("tls", &self.tls);
        d.finish()
    }
}

impl SentinelOptions {
    /// No password for the master; TLS to it when the sentinels' URLs are `rediss://`.
    pub fn new() -> Self {
        Self::default()
    }

    /// Logs in to the master as `user` (`None`: the `default` user) with `password`.
    pub fn master_auth(mut self, user: Option<&str>, password: &str) -> Self {
        self.user = user.map(str::to_owned);
        self.password = Some(password.to_owned());
        self
    }

    /// TLS to the master, or not, whatever the sentinels' URLs say.
    pub fn master_tls(mut self, tls: bool) -> Self {
        self.master_tls = Some(tls);
        self
    }

    /// The certificates of TLS to the master and to `rediss://` sentinels (feature
    /// `redis-tls`): a CA instead of the platform's roots, a client certificate.
    #[cfg(feature = "redis-tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis-tls")))]
    pub fn certificates(mut self, tls: super::RedisTls) -> Self {
        self.tls = Some(tls);
        self
    }
}

/// How long connecting to a master (after asking the sentinels) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

pub(crate) struct SentinelConnection {
    client: tokio::sync::Mutex<SentinelClient>,
    current: Mutex<Option<MultiplexedConnection>>,
    /// The address of the master `current` is connected to.
    master: Mutex<Option<String>>,
}

impl SentinelConnection {
    /// The master called `master` of the sentinels at `sentinels`, reached as `options`
    /// say.
    pub(crate) fn new(
        sentinels: Vec<ConnectionInfo>,
        master: &str,
        options: &SentinelOptions,
    ) -> RedisResult<Self> {
        let tls = |info: &ConnectionInfo| matches!(info.addr(), ConnectionAddr::TcpTls { .. });
        let master_tls = options
            .master_tls
            .unwrap_or_else(|| sentinels.iter().any(tls));
        #[cfg(feature = "redis-tls")]
        if let Some(certs) = &options.tls {
            super::tls::install_provider();
            // Certificates of the master's connections: only the builder passes them on.
            let first = sentinels.first().map(|s| s.redis_settings().clone());
            let all_tls = sentinels.iter().all(tls);
            let mut builder = redis::sentinel::SentinelClientBuilder::new(
                sentinels.iter().map(|s| s.addr().clone()),
                master,
                SentinelServerType::Master,
            )?
            .set_client_to_redis_certificates(certs.certificates());
            if all_tls {
                builder = builder.set_client_to_sentinel_certificates(certs.certificates());
            }
            if let Some(first) = first {
                if let Some(user) = first.username() {
                    builder = builder.set_client_to_sentinel_username(user);
                }
                if let Some(password) = first.password() {
                    builder = builder.set_client_to_sentinel_password(password);
                }
            }
            if master_tls {
                builder = builder.set_client_to_redis_tls_mode(TlsMode::Secure);
            }
            if let Some(user) = &options.user {
                builder = builder.set_client_to_redis_username(user);
            }
            if let Some(password) = &options.password {
                builder = builder.set_client_to_redis_password(password);
            }
            return Ok(Self::with_client(builder.build()?));
        }
        let mut redis = redis::RedisConnectionInfo::default().set_skip_set_lib_name();
        if let Some(user) = &options.user {
            redis = redis.set_username(user);
        }
        if let Some(password) = &options.password {
            redis = redis.set_password(password);
        }
        let mut node = SentinelNodeConnectionInfo::default().set_redis_connection_info(redis);
        if master_tls {
            node = node.set_tls_mode(TlsMode::Secure);
        }
        let master: String = master.into();
        let client =
            SentinelClient::build(sentinels, master, Some(node), SentinelServerType::Master)?;
        Ok(Self::with_client(client))
    }

    fn with_client(client: SentinelClient) -> Self {
        Self {
            client: tokio::sync::Mutex::new(client),
            current: Mutex::new(None),
            master: Mutex::new(None),
        }
    }

    fn current(&self) -> Option<MultiplexedConnection> {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The connection to the current master, made if there is none.
    pub(crate) async fn connection(&self) -> RedisResult<MultiplexedConnection> {
        if let Some(c) = self.current() {
            return Ok(c);
        }
        let mut client = self.client.lock().await;
        if let Some(c) = self.current() {
            return Ok(c); // made by another call meanwhile
        }
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(CONNECT_TIMEOUT));
        let master = tokio::time::timeout(CONNECT_TIMEOUT, client.async_get_client())
            .await
            .map_err(|_| timed_out("asking the sentinels for the master"))??;
        let conn = master
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        *self.master.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(master.get_connection_info().addr().to_string());
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = Some(conn.clone());
        Ok(conn)
    }

    /// Asks the sentinels which node is master (at most 1 s, and not while a connection
    /// is being made): once they announce another than the one connected to, the
    /// connection is dropped and the next call connects to the new master, rather than
    /// keep writing to a demoted one until a call fails.
    pub(crate) async fn follow(&self) {
        let Some(known) = self
            .master
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
        else {
            return;
        };
        let Ok(mut client) = self.client.try_lock() else {
            return;
        };
        let asked = tokio::time::timeout(CONNECT_TIMEOUT, client.async_get_client()).await;
        drop(client);
        if let Ok(Ok(master)) = asked {
            let now = master.get_connection_info().addr().to_string();
            if now != known {
                tracing::info!(
                    from = %known,
                    to = %now,
                    "tollgate: the sentinels name another Redis master; following"
                );
                self.failed();
            }
        }
    }

    /// A call failed: the master may have changed (a demoted master answers `READONLY`, a
    /// dead one nothing). The next call asks the sentinels again.
    pub(crate) fn failed(&self) {
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = None;
        *self.master.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

fn timed_out(what: &'static str) -> redis::RedisError {
    redis::RedisError::from((redis::ErrorKind::Io, "timed out", what.to_owned()))
}
