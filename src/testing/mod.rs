//! A simulation kit, to test your own limits and failure policy deterministically
//! (feature `testing`, for your dev-dependencies): a shared store simulated in the test's
//! process ([`SimBackend`]), whose calls take time each way and which fails, goes silent,
//! answers late, loses its state or comes back from an older snapshot when the test says;
//! several instances over it, each a [`Resilient`](crate::store::Resilient) store as a
//! `RedisStore` is; and tokio's clock ([`TokioClock`]), paused, so that seconds of
//! traffic and outages run in milliseconds and give the same figures on every run.
//!
//! The guide's chapter [Testing your limits](crate::guide::testing) walks through a
//! login limit across three instances and an outage of their store. tollgate's own
//! property tests of shared limits (`tests/lease_world.rs`) run on this kit.
//!
//! ```toml
//! [dev-dependencies]
//! tollgate = { version = "0.1", features = ["testing"] }
//! tokio = { version = "1", features = ["macros", "rt", "test-util"] }
//! ```
//!
//! The kit itself needs only tokio's timer; pausing the clock needs tokio's `test-util`,
//! in your dev-dependencies: `#[tokio::test(start_paused = true)]`.
//!
//! ```
//! use std::time::Duration;
//! use tollgate::testing::SimBackend;
//! use tollgate::{LimitSpec, Limiter, Quota};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! // In a test: #[tokio::test(start_paused = true)] async fn outage() { ... }
//! let backend = SimBackend::builder().instances(2).build();
//! let spec = LimitSpec::new("api", Quota::per_minute(60).burst(10));
//! let limiters: Vec<Limiter> = backend
//!     .stores()
//!     .into_iter()
//!     .map(|store| Limiter::builder(store).limit(spec.clone()).build().unwrap())
//!     .collect();
//!
//! // The store goes down: each instance spends its share of the limit (half of it).
//! backend.outage(true);
//! let mut granted = 0;
//! for i in 0..20 {
//!     if limiters[i % 2].check("api", "k", 1).await.unwrap().allowed() {
//!         granted += 1;
//!     }
//! }
//! assert_eq!(granted, 10);
//! backend.outage(false);
//! # }
//! ```

mod backend;
mod book;
mod clock;
mod regions;

pub use backend::{SimBackend, SimBackendBuilder};
pub use clock::TokioClock;
pub use regions::{SimRegions, SimRegionsBuilder};
