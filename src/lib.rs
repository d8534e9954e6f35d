//! Rate limiting for axum and hyper: a tower layer that checks each request against named
//! limits, in memory or in Redis, and answers refusals with `429 Too Many Requests` and the
//! standard headers.
//!
//! ```no_run
//! use std::net::SocketAddr;
//! use axum::{routing::get, Router};
//! use tollgate::{key::PeerIp, store::MemoryStore, Limit, Quota, RateLimitLayer};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let limits = RateLimitLayer::builder(MemoryStore::new())
//!     .limit(Limit::new("per-ip", Quota::per_minute(10)).key(PeerIp::new()))
//!     .limit(Limit::new("global", Quota::per_second(100).burst(200)))
//!     .build()?;
//!
//! let app = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .route_layer(limits);
//!
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! // `PeerIp` needs each connection's address, which axum keeps only when served this
//! // way: with plain `axum::serve(listener, app)` every request gets a 500 that says so.
//! axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
//! # Ok(()) }
//! ```
//!
//! Every response of a limited route carries the IETF fields, one member per limit, and a
//! refusal also `Retry-After` (rounded up), `Cache-Control: no-store` and an
//! `application/problem+json` body:
//!
//! ```text
//! RateLimit-Policy: "per-ip";q=10;w=60, "global";q=200;w=2
//! RateLimit: "per-ip";r=9;t=6, "global";r=199;t=1
//! ```
//!
//! # The pieces
//!
//! - A [`Limit`] is a name, a [`Quota`], a key extractor ([`key`]: peer IP, client IP behind
//!   trusted proxies, header, query, extension, route, closures, combinations), a [`Cost`],
//!   a [`Mode`] (enforce or shadow), and policies for requests without a key
//!   ([`MissingKey`]) and for store failures ([`FailurePolicy`]).
//! - A [`RateLimitLayer`] holds limits for every request, limits per route (a route table
//!   of axum-style templates and methods, see [where to put the
//!   layer](#where-to-put-the-layer)), the header style ([`HeaderStyle`](headers::HeaderStyle)) and the
//!   rejection responses ([`response`]). Built with [`RateLimitLayer::builder`], checked at
//!   [`build`](RateLimitBuilder::build): bad configuration is a [`ConfigError`] naming the
//!   field.
//! - A [`store`] keeps the buckets: [`store::MemoryStore`] in this process, or `RedisStore`
//!   (feature `redis`) shared by every instance, with Redis Cluster (feature
//!   `redis-cluster`). Several limits of one request are checked all or nothing: a request
//!   refused by one limit consumes nothing from the others.
//! - A [`Limiter`] handle reaches the same limits and buckets from code (handlers,
//!   background jobs): `peek`, `check`, `check_all`, `refund`, `penalize`, `block`,
//!   `reset` — e.g. the failed-login pattern. A limit can also count only some outcomes
//!   ([`Charge::when`]), and a layer can skip or refuse clients by address before any
//!   limit ([`RateLimitBuilder::allow_cidrs`], [`RateLimitBuilder::deny_cidrs`]).
//! - Stores follow one contract ([`store::Store`], operations [`store::Op`]); a store that
//!   can fail implements [`store::Backend`] and gets the timeout, breaker, failure
//!   policies, fallback and deny cache of [`store::Resilient`].
//! - Each request's [`Decision`] is put in its extensions (handlers read it with
//!   `Extension<Decision>`) and given to [`on_decision`](RateLimitBuilder::on_decision).
//!   Refusals are `tracing` events (target `tollgate::refused`, throttled: see
//!   [`RefusalLog`]); the most refused keys are kept in a bounded summary
//!   ([`RateLimitBuilder::track_offenders`], [`Limiter::top_refused`]); feature `metrics`
//!   reports a fixed metrics schema; feature `grpc` answers refused gRPC calls the gRPC way.
//! - Every refusal can be recorded in an [audit log](audit) ([`RateLimitBuilder::audit`]):
//!   a bounded queue that never makes a request wait, written in batches by a background
//!   task to `tracing` ([`audit::TracingSink`]), SQL (feature `audit-sql`) or a sink of
//!   your own.
//! - Feature `rules`: the same limits written in a TOML or JSON file, with errors naming
//!   the file, line and field, reloaded on change or `SIGHUP` with buckets kept (`rules`
//!   module when enabled); feature `rules-sql`: the same from the rows of a
//!   `RateLimitRule` table, polled (`sql` module).
//!
//! # Where to put the layer
//!
//! - `Router::route_layer` (or a layer on one route): only requests that match one of the
//!   app's routes are checked; a 404 never touches a limit.
//! - `Router::layer`: every request is checked, 404s (axum's fallback) included.
//! - Plain hyper or tower: every request the service gets.
//!
//! A route table entry ([`route`](RateLimitBuilder::route)) means the same in all three,
//! and in `tollgate-rules simulate`: its pattern is matched against the path the client
//! sent, as axum's router matches its routes (`/users/7` gets `/users/{id}`, `/api/items`
//! gets `/api/{*rest}`). `key::Route` reads axum's `MatchedPath`, which axum 0.8 gives the
//! requests of a matched route under both `route_layer` and `layer`; a 404 and plain hyper
//! have none.
//!
//! # The algorithm
//!
//! Each bucket is a token bucket of capacity `burst`, refilled with `rate` tokens per
//! `period`, computed as GCRA ([`gcra`]): one number per key, the theoretical arrival time.
//! A full bucket admits `burst` requests at once, then one every `T = period / rate`; over any
//! interval of length `d` at most `burst + d / T` tokens are granted. That is not a fixed
//! window: `Quota::per_minute(60)` is a bucket of 60 refilled at one per second, not "60 per
//! clock minute", so it never lets 2 × 60 through around a minute boundary.
//!
//! # Features
//!
//! | feature | default | what |
//! |---|---|---|
//! | `axum` | yes | peer addresses from axum's `ConnectInfo`, the matched route (`MatchedPath`) for route tables and `key::Route` |
//! | `redis` | no | `store::RedisStore` on the `redis` crate's `ConnectionManager` |
//! | `redis-cluster` | no | `RedisStore::cluster` for Redis Cluster |
//! | `redis-sentinel` | no | `RedisStore::sentinel`: the master Redis Sentinel names, following failovers |
//! | `redis-tls` | no | `rediss://` on rustls, `RedisStore::open_tls` and `RedisTls` (a CA, client certificates) |
//! | `metrics` | no | metrics through the `metrics` facade, a fixed schema (module `metrics` when enabled) |
//! | `grpc` | no | gRPC refusals for tonic services, `PeerIp` from tonic's `TcpConnectInfo` (`grpc` module when enabled) |
//! | `audit-sql` | no | `SqlViolationSink`, the audit log into SQLite's `RateLimitViolation` table, with the `RateLimitRule` / `RateLimitViolation` schema and its migration (`sqlx`, SQLite only; `sql` module when enabled); nothing of the rules stack |
//! | `rules-sql` | no | rules from the `RateLimitRule` table, polled and reloaded on change (`RulesBuilder::build_sql`, `sql::fetch_rules`, `sql::rules_document`; enables `rules` and `audit-sql`) |
//! | `rules-postgres` | no | `rules-sql` on PostgreSQL too, for the rules and the audit sink |
//! | `rules` | no | limits from a TOML or JSON file, errors with file, line and field, hot reload on file change, `SIGHUP` or call (`rules` module when enabled; the `tollgate-rules check` tool) |
//! | `testing` | no | a simulation kit for your tests: a shared store with latency and faults (outages, black holes, late answers, wipes, older snapshots), instances over it, tokio's paused clock (`testing` module when enabled) |
//!
//! Without `axum` the layer works with any tower/hyper stack: peer addresses come from a
//! [`key::PeerAddr`] extension and route templates are matched against the request path.
//!
//! # The guide
//!
//! The [`guide`] has the rest, one chapter per module: [common questions](guide::faq),
//! [rules files](guide::rules), [Redis](guide::redis), [leases](guide::leases), the
//! [algorithms](guide::algorithms), [metrics](guide::metrics), the [audit
//! log](guide::audit), [gRPC](guide::grpc), the [benchmarks](guide::benchmarks), [testing
//! your limits](guide::testing) against a simulated shared store, and more.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]

// The crate is built in layers; each imports only the layers below it (ARCHITECTURE.md
// draws them; tests/layering.rs checks them).
mod algo;
pub mod audit;
mod base;
mod engine;
#[cfg(any(doc, doctest))]
pub mod guide;
mod limiter;
mod middleware;
mod model;
mod observe;
#[cfg(feature = "rules")]
#[cfg_attr(docsrs, doc(cfg(feature = "rules")))]
pub mod rules;
#[cfg(feature = "audit-sql")]
#[cfg_attr(docsrs, doc(cfg(feature = "audit-sql")))]
pub mod sql;
pub mod store;
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;
mod web;

#[cfg(feature = "calendar")]
pub use algo::calendar;
pub use algo::{gcra, window};
pub use base::clock;
#[cfg(feature = "grpc")]
#[cfg_attr(docsrs, doc(cfg(feature = "grpc")))]
pub use middleware::grpc;
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub use observe::metrics;
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub use web::extract::MissingExtension;
pub use web::{headers, key, response};

/// The tower service a [`RateLimitLayer`] makes, and its response future: named in type
/// signatures, rarely written.
pub mod service {
    pub use crate::middleware::body::{Follow, ResponseBody};
    pub use crate::middleware::future::ResponseFuture;
    pub use crate::middleware::service::RateLimit;
}

/// Limits inside long-lived requests: the units of a stream (messages, bytes) charged to
/// a limit one by one ([`Pacer`](pace::Pacer), made by [`Limiter::pacer`]), bodies
/// paced to a rate per key ([`PacedBody`](pace::PacedBody)), and server-sent events
/// paced per key ([`PacedEvents`](pace::PacedEvents)). Guide chapter
/// [`streams`](crate::guide::streams).
pub mod pace {
    pub use crate::limiter::pace::{PaceError, Pacer};
    pub use crate::middleware::events::PacedEvents;
    pub use crate::middleware::pace::{BoxError, PacedBody};
    pub use crate::model::stream::{DEFAULT_MAX_WAITERS, Direction, OverLimit, Per};
}

/// WebSocket messages charged to limits of messages or bytes: [`Limited`](ws::Limited),
/// over axum's `WebSocket` (feature `ws`). Guide chapter
/// [`streams`](crate::guide::streams).
#[cfg(feature = "ws")]
#[cfg_attr(docsrs, doc(cfg(feature = "ws")))]
pub mod ws {
    pub use crate::middleware::ws::{Close, Limited};
}

pub use algo::algorithm::{Algorithm, Phase};
pub use algo::quota::Quota;
pub use base::error::ConfigError;
pub use engine::DEFAULT_MAX_LIMITS;
pub use engine::ban::{BannedKey, DEFAULT_MAX_BAN_KEYS, RECHECK as BAN_RECHECK};
pub use limiter::estimate::Estimate;
pub use limiter::permit::Permit;
pub use limiter::reservation::Reservation;
pub use limiter::{Limiter, LimiterBuilder, LimiterError};
pub use middleware::builder::RateLimitBuilder;
pub use middleware::layer::RateLimitLayer;
pub use model::ban::Ban;
pub use model::decision::{Decision, LimitDecision, Outcome, Overall, Status, Verdict};
pub use model::lease::Lease;
pub use model::policy::{FailurePolicy, MissingKey, Mode, OnLimit};
pub use model::spec::LimitSpec;
pub use observe::offenders::{OffenderTracking, RefusedKey};
pub use web::charge::Charge;
pub use web::cost::Cost;
pub use web::hooks::RefusalLog;
pub use web::limit::Limit;
pub use web::plan::Plan;
pub use web::settle::{ActualCost, Settle};

/// The README's Rust blocks, compiled (and run, unless marked `no_run`) as doctests, so
/// that what a new user pastes builds. Only with the features the README uses. (The
/// guide's chapters are doctests of their modules: `guide`.)
#[cfg(all(doctest, feature = "axum"))]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
