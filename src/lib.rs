//! Rate limiting for axum and hyper: a tower layer that checks each request against named
//! limits, in memory or in Redis, and answers refusals with `429 Too Many Requests` and
//! the standard headers.
//!
//! ```no_run
//! use std::net::SocketAddr;
//! use axum::{routing::get, Router};
//! use tollgate::{key::PeerIp, store::MemoryStore, Limit, Quota, RateLimitLayer};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let limits = RateLimitLayer::builder(MemoryStore::new())
//!     .limit(Limit::new("per-ip", Quota::per_second(5).burst(10)).key(PeerIp::new()))
//!     .limit(Limit::new("global", Quota::per_second(100).burst(200)))
//!     .build()?;
//!
//! let app = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .route_layer(limits);
//!
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
//! # Ok(()) }
//! ```
//!
//! Every response of a limited route carries the IETF fields, one member per limit:
//!
//! ```text
//! RateLimit-Policy: "per-ip";q=10;w=2, "global";q=200;w=2
//! RateLimit: "per-ip";r=9;t=1, "global";r=199;t=1
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]

pub mod clock;
mod cost;
mod decision;
mod error;
mod future;
pub mod gcra;
pub mod headers;
pub mod key;
mod layer;
mod limit;
mod quota;
pub mod response;
mod service;
pub mod store;

pub use cost::Cost;
pub use decision::{Decision, LimitDecision, Outcome, Overall, Status, Verdict};
pub use error::ConfigError;
pub use future::ResponseFuture;
pub use headers::{HeaderStyle, ResetFormat, RetryAfterFormat};
pub use layer::{RateLimitBuilder, RateLimitLayer};
pub use limit::{FailurePolicy, Limit, MissingKey, Mode};
pub use quota::Quota;
pub use service::RateLimit;
