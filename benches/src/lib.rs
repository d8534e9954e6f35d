//! What the benchmark programs share.

/// Reading a Redis server's own accounting (`INFO`).
#[cfg(feature = "redis")]
pub mod redis_stats {
    /// `(calls, usec)` of the scripts (`EVALSHA`, `EVAL`) in `INFO commandstats`: what the
    /// clients send (the commands a script runs inside are counted apart by Redis, and
    /// their time is in the script's).
    pub async fn scripts(conn: &mut redis::aio::MultiplexedConnection) -> (u64, f64) {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(conn)
            .await
            .expect("INFO commandstats");
        let mut calls = 0;
        let mut usec = 0.0;
        for line in info.lines().filter(|l| l.starts_with("cmdstat_")) {
            let name = line.split(':').next().unwrap_or("");
            if name != "cmdstat_evalsha" && name != "cmdstat_eval" {
                continue;
            }
            for field in line.split([':', ',']) {
                if let Some(v) = field.strip_prefix("calls=") {
                    calls += v.parse::<u64>().unwrap_or(0);
                } else if let Some(v) = field.strip_prefix("usec=") {
                    usec += v.parse::<f64>().unwrap_or(0.0);
                }
            }
        }
        (calls, usec)
    }

    /// The server's CPU time so far, user and system, in microseconds (`INFO cpu`):
    /// everything it did, reading and answering clients included.
    pub async fn cpu_us(conn: &mut redis::aio::MultiplexedConnection) -> f64 {
        let info: String = redis::cmd("INFO")
            .arg("cpu")
            .query_async(conn)
            .await
            .expect("INFO cpu");
        info.lines()
            .filter(|l| l.starts_with("used_cpu_sys:") || l.starts_with("used_cpu_user:"))
            .filter_map(|l| l.split(':').nth(1)?.trim().parse::<f64>().ok())
            .sum::<f64>()
            * 1e6
    }
}

/// The command line of the programs counted under cachegrind (`scripts/valgrind.sh`'s
/// `instructions CASE N`): a case by name, then how many times to run it.
pub mod counted {
    use std::process::ExitCode;

    /// The first argument, the case it names (found by `lookup`) and the count in the
    /// second; on a bad command line, the error already printed and the exit code (2).
    /// `usage` names the arguments, e.g. `"<algorithm> <checks>"`.
    pub fn args<T>(
        program: &str,
        usage: &str,
        lookup: impl FnOnce(&str) -> Option<T>,
    ) -> Result<(String, T, u64), ExitCode> {
        let mut args = std::env::args().skip(1);
        let name = args.next().unwrap_or_default();
        let Some(Ok(count)) = args.next().map(|n| n.parse()) else {
            eprintln!("usage: {program} {usage}");
            return Err(ExitCode::from(2));
        };
        let Some(case) = lookup(&name) else {
            eprintln!("unknown case `{name}`");
            return Err(ExitCode::from(2));
        };
        Ok((name, case, count))
    }
}

/// The routers of the middleware benchmark (`benches/middleware.rs`), shared with
/// `bin/middleware_requests.rs`: one axum route, `GET /` answering `"hello"`.
pub mod routers {
    use std::net::SocketAddr;
    use std::time::Duration;

    use axum::Router;
    use axum::body::Body;
    use axum::extract::ConnectInfo;
    use axum::routing::get;
    use http::Request;
    use tollgate::key::PeerIp;
    use tollgate::store::MemoryStore;
    use tollgate::{Quota, RateLimitLayer};
    use tower_governor::GovernorLayer;
    use tower_governor::governor::GovernorConfigBuilder;

    /// `GET /` from one peer, its address in `ConnectInfo` as `axum::serve` puts it.
    pub fn request() -> Request<Body> {
        let mut request = Request::get("/").body(Body::empty()).unwrap();
        let peer = SocketAddr::from(([203, 0, 113, 7], 41_000));
        request.extensions_mut().insert(ConnectInfo(peer));
        request
    }

    /// No limiter.
    pub fn bare() -> Router {
        Router::new().route("/", get(|| async { "hello" }))
    }

    /// `RateLimitLayer` on the route, keyed by the peer IP, default headers.
    pub fn tollgate(quota: Quota) -> Router {
        bare().route_layer(RateLimitLayer::new(
            quota,
            PeerIp::new(),
            MemoryStore::new(),
        ))
    }

    /// `tower_governor` on the route, keyed by the peer IP, with its headers: one token
    /// every `period`, a bucket of `burst`.
    pub fn tower_governor(period: Duration, burst: u32) -> Router {
        let config = GovernorConfigBuilder::default()
            .period(period)
            .burst_size(burst)
            .use_headers()
            .finish()
            .expect("a valid tower_governor configuration");
        bare().route_layer(GovernorLayer::new(config))
    }
}
