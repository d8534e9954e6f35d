//! What is sent to Redis: the Lua scripts (loaded once, run by `EVALSHA`), the widths
//! of their replies, and the connection, single node or cluster.

use std::sync::atomic::AtomicUsize;

use super::*;

/// A Lua script: loaded once, run by `EVALSHA`; its text kept for `EVAL` where
/// `SCRIPT LOAD` is refused.
pub(super) struct Lua {
    script: Script,
    code: &'static str,
}

impl Lua {
    pub(super) fn new(code: &'static str) -> Self {
        Self {
            script: Script::new(code),
            code,
        }
    }

    /// The script's SHA-1, what `EVALSHA` names it by.
    pub(super) fn get_hash(&self) -> &str {
        self.script.get_hash()
    }
}

pub(super) static GCRA: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("../../../lua/window.lua"),
        include_str!("../../../lua/gcra.lua")
    ))
});
pub(super) static REFUND: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("../../../lua/refund.lua")));
pub(super) static OPS: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("../../../lua/window.lua"),
        include_str!("../../../lua/ops.lua")
    ))
});

pub(super) static BAN: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("../../../lua/ban.lua")));

/// Integers per GCRA limit in a `gcra.lua` reply (after the leading `now`).
pub(super) const REPLY_WIDTH: usize = 3;
/// Integers per window limit in a `gcra.lua` reply.
pub(super) const WINDOW_REPLY_WIDTH: usize = 5;
/// The largest integer Lua's doubles hold exactly (2^53 − 1).
pub(super) const MAX_EXACT: u64 = (1 << 53) - 1;

#[derive(Clone)]
pub(super) enum Connection {
    Single(ConnectionManager),
    /// Several connections to one server, taken in turn call by call.
    Pool(Arc<Pool>),
    #[cfg(feature = "redis-cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
    #[cfg(feature = "redis-sentinel")]
    Sentinel(std::sync::Arc<super::sentinel::SentinelConnection>),
}

impl Connection {
    /// Sends `evalsha` (an `EVALSHA` of `script`); on NOSCRIPT (after a restart, a failover
    /// or `SCRIPT FLUSH`) loads the script (on every node of a cluster) and sends it again,
    /// or sends it by `EVAL` where `SCRIPT LOAD` is refused.
    pub(super) async fn eval<T: redis::FromRedisValue>(
        &self,
        evalsha: &redis::Cmd,
        script: &Lua,
    ) -> redis::RedisResult<T> {
        match self {
            Connection::Single(c) => eval_on(&mut c.clone(), evalsha, script).await,
            Connection::Pool(p) => eval_on(&mut p.next(), evalsha, script).await,
            #[cfg(feature = "redis-cluster")]
            Connection::Cluster(c) => eval_on(&mut c.clone(), evalsha, script).await,
            #[cfg(feature = "redis-sentinel")]
            Connection::Sentinel(s) => {
                let result = eval_on(&mut s.connection().await?, evalsha, script).await;
                if result.is_err() {
                    s.failed();
                }
                result
            }
        }
    }

    /// Sends one command (on a cluster, to the node of its key).
    pub(super) async fn query<T: redis::FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
    ) -> redis::RedisResult<T> {
        match self {
            Connection::Single(c) => cmd.query_async(&mut c.clone()).await,
            Connection::Pool(p) => cmd.query_async(&mut p.next()).await,
            #[cfg(feature = "redis-cluster")]
            Connection::Cluster(c) => cmd.query_async(&mut c.clone()).await,
            #[cfg(feature = "redis-sentinel")]
            Connection::Sentinel(s) => {
                let result = cmd.query_async(&mut s.connection().await?).await;
                if result.is_err() {
                    s.failed();
                }
                result
            }
        }
    }

    /// How many connections calls are spread over (a cluster's or a sentinel's: one).
    pub(super) fn connections(&self) -> usize {
        match self {
            Connection::Pool(p) => p.conns.len(),
            _ => 1,
        }
    }

    pub(super) fn is_cluster(&self) -> bool {
        match self {
            Connection::Single(_) | Connection::Pool(_) => false,
            #[cfg(feature = "redis-cluster")]
            Connection::Cluster(_) => true,
            #[cfg(feature = "redis-sentinel")]
            Connection::Sentinel(_) => false,
        }
    }
}

/// Connections to one server, each multiplexed, used in turn: each has its own socket and
/// its own task reading replies, so one server's traffic is not bound to one thread of the
/// runtime.
pub(super) struct Pool {
    conns: Box<[ConnectionManager]>,
    turn: AtomicUsize,
}

impl Pool {
    /// At least one connection (the store makes one `Single` otherwise).
    pub(super) fn new(conns: Vec<ConnectionManager>) -> Self {
        Self {
            conns: conns.into_boxed_slice(),
            turn: AtomicUsize::new(0),
        }
    }

    /// The next connection in turn.
    fn next(&self) -> ConnectionManager {
        let i = self.turn.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.conns[i % self.conns.len()].clone()
    }
}

pub(super) async fn eval_on<T: redis::FromRedisValue>(
    conn: &mut impl redis::aio::ConnectionLike,
    evalsha: &redis::Cmd,
    script: &Lua,
) -> redis::RedisResult<T> {
    match evalsha.query_async(conn).await {
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            match script.script.load_async(conn).await {
                Ok(_) => evalsha.query_async(conn).await,
                Err(e) if super::admin::is_refusal(&e) => {
                    super::admin::refused(super::admin::Admin::ScriptLoad, &e);
                    as_eval(evalsha, script).query_async(conn).await
                }
                Err(e) => Err(e),
            }
        }
        result => result,
    }
}

/// `evalsha` as an `EVAL` of `script`'s text, with the same keys and arguments.
fn as_eval(evalsha: &redis::Cmd, script: &Lua) -> redis::Cmd {
    let mut eval = redis::cmd("EVAL");
    eval.arg(script.code);
    for arg in evalsha.args_iter().skip(2) {
        if let redis::Arg::Simple(bytes) = arg {
            eval.arg(bytes);
        }
    }
    eval
}

/// The head of an `EVALSHA` of `script` with `keys` keys: the caller appends the keys,
/// then the script's arguments.
pub(super) fn evalsha(script: &Lua, keys: usize) -> redis::Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.get_hash()).arg(keys);
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_evalsha_becomes_the_same_eval() {
        let mut cmd = evalsha(&REFUND, 2);
        cmd.arg("k1").arg(b"k2".as_slice()).arg(7);
        let eval = as_eval(&cmd, &REFUND);
        let args: Vec<Vec<u8>> = eval
            .args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => b.to_vec(),
                _ => Vec::new(),
            })
            .collect();
        assert_eq!(args[0], b"EVAL");
        assert_eq!(args[1], REFUND.code.as_bytes());
        assert_eq!(
            &args[2..],
            [b"2".to_vec(), b"k1".to_vec(), b"k2".to_vec(), b"7".to_vec()]
        );
    }
}
