//! A connection to the master that Redis Sentinel names, following failovers: it is made
//! on the first call (the master's address asked of the sentinels), and after any failed
//! call it is dropped, so the next call asks the sentinels again and connects to whichever
//! node is master by then. Calls in between fail fast into the store's failure policy.

use std::sync::Mutex;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::sentinel::{SentinelClient, SentinelServerType};
use redis::{AsyncConnectionConfig, RedisResult};

/// How long connecting to a master (after asking the sentinels) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

pub(crate) struct SentinelConnection {
    client: tokio::sync::Mutex<SentinelClient>,
    current: Mutex<Option<MultiplexedConnection>>,
    /// The address of the master `current` is connected to.
    master: Mutex<Option<String>>,
}

impl SentinelConnection {
    /// The master called `master` of the sentinels at `sentinels` (`redis://host:port`).
    pub(crate) fn new(sentinels: Vec<String>, master: &str) -> RedisResult<Self> {
        let client = SentinelClient::build(
            sentinels,
            master.to_owned(),
            None,
            SentinelServerType::Master,
        )?;
        Ok(Self {
            client: tokio::sync::Mutex::new(client),
            current: Mutex::new(None),
            master: Mutex::new(None),
        })
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
