//! The guide: everything the README leaves out, one chapter per module.
//!
//! Each chapter is a markdown file of the repository's `guide/` folder, shown here as a
//! module's page (the pattern `clap` uses for its tutorial and cookbook). Their Rust blocks
//! are doctests, compiled (and run, unless marked `no_run`) by `cargo test --doc` with the
//! features the chapter names; their `toml` rules documents are compiled by
//! `tests/readme.rs`. The README is the front door: what tollgate is, how to try it and
//! the 30-second example.
//!
//! # Start here
//!
//! - [What it does](overview): every feature in one list.
//! - [Common questions](faq): a per-key limit on one route, the remaining quota in a
//!   handler, what was refused, `Limit` or `LimitSpec`, `route_layer` or `layer`, Redis
//!   down.
//! - [Recipes](recipes): nine common wants, each a rules file and the axum code: per-IP
//!   limits, a stricter login, plans per API key, a token budget, concurrency per key,
//!   bans, a monthly quota, Redis, a rehearsal on an access log.
//! - [Use it from code](limiter): the `Limiter` handle (failed logins), limits that count
//!   only some outcomes, allow and deny lists.
//!
//! # Kinds of limits
//!
//! - [Algorithms](algorithms): GCRA, fixed and sliding windows, sliding logs.
//! - [Calendar quotas](calendar): per hour, day, ISO week or month of a time zone.
//! - [Waiting instead of refusing](waiting): reservations and delay mode.
//! - [Settled costs](settle): token budgets, the actual cost settled when the body ends.
//! - [Bans](bans): keys refused too often, banned with escalating lengths.
//! - [In-flight requests per key](in_flight): concurrency, released when the body ends.
//! - [Hot keys](hot_keys): one key checked by many cores, split into stripes.
//! - [Limits inside long-lived requests](streams): messages and bytes per second per key,
//!   charged as they pass (pacers, paced bodies, WebSockets), waiting or ending over the
//!   limit.
//!
//! # Configuration
//!
//! - [Rules from a file](rules): TOML or JSON, located errors, hot reload.
//! - [Rehearsing rules on an access log](simulate): `tollgate-rules simulate` and its HTML
//!   report.
//! - [Suggesting limits from an access log](suggest): `tollgate-rules suggest`.
//! - [Rules from a SQL table](sql): the `RateLimitRule` rows, polled.
//!
//! # Sharing limits
//!
//! - [Sharing limits across instances (Redis)](redis): failure policies, the outage bound,
//!   RESP3, pools, Sentinel, lost state.
//! - [Connecting to a managed Redis](managed_redis): TLS (`rediss://`, a CA, client
//!   certificates), ACL users and the least rule, renamed or forbidden commands, and the
//!   URL forms of Azure Cache, ElastiCache and MemoryDB, Memorystore, Redis Cloud and
//!   Upstash.
//! - [Leases](leases): shared limits without a call per request.
//! - [One limit across regions](regions): a Redis per region, the quota split between
//!   them and moved where it is spent, the over-grant bound through partitions.
//! - [Testing your limits](testing): a simulated shared store with latency, outages and
//!   restarts, instances over it and tokio's paused clock (feature `testing`), for
//!   deterministic tests of your limits and failure policy.
//!
//! # Watching
//!
//! - [Metrics](metrics): the schema.
//! - [Operations](operations): the Grafana dashboard and Prometheus alerts of
//!   `dashboards/`, and what to do when an alert fires.
//! - [Audit log](audit): every refusal, to `tracing`, SQL or a sink of your own.
//! - [gRPC](grpc): refused calls answered the gRPC way.
//!
//! # Figures
//!
//! - [Benchmarks](benchmarks): the memory store, HTTP, the algorithms, the middleware and
//!   Redis, as ratios against their anchors.
//!
//! Every chapter is also listed below, by module name.

/// One chapter: `chapter!(name)` is `guide/name.md` as module `name`, its Rust blocks
/// doctests under every feature set; `chapter!(name if <cfg>)` compiles its Rust blocks
/// only where `<cfg>` holds (the page itself is shown by every `cargo doc` and on
/// docs.rs, which builds with all features).
macro_rules! chapter {
    ($name:ident) => {
        pub mod $name {
            #![doc = include_str!(concat!("../guide/", stringify!($name), ".md"))]
        }
    };
    ($name:ident if $($cfg:tt)+) => {
        pub mod $name {
            #![cfg_attr(
                any(not(doctest), $($cfg)+),
                doc = include_str!(concat!("../guide/", stringify!($name), ".md"))
            )]
        }
    };
}

chapter!(overview);
chapter!(faq if all(feature = "axum", feature = "redis"));
chapter!(recipes if all(feature = "axum", feature = "rules", feature = "redis"));
chapter!(limiter);
chapter!(algorithms);
chapter!(calendar if feature = "calendar");
chapter!(waiting);
chapter!(settle);
chapter!(bans);
chapter!(in_flight);
chapter!(hot_keys);
chapter!(streams if feature = "axum");
chapter!(rules if all(feature = "rules", feature = "axum"));
chapter!(simulate if feature = "rules");
chapter!(suggest if feature = "rules");
chapter!(sql if feature = "rules-sql");
chapter!(redis if feature = "redis");
chapter!(managed_redis if all(feature = "redis-tls", feature = "redis-cluster", feature = "redis-sentinel"));
chapter!(leases);
chapter!(regions if all(feature = "testing", feature = "redis"));
chapter!(metrics);
chapter!(operations);
chapter!(audit);
chapter!(grpc if feature = "grpc");
chapter!(testing if all(feature = "testing", feature = "axum"));
chapter!(benchmarks);
