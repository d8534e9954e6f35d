//! The HTTP policy: key extractors, `Limit` (a limit with its key, cost and charge
//! rules), route tables, allow and deny lists, the rate-limit header fields, rejections,
//! and the hooks that report decisions. Knows `http::request::Parts`, not tower.

pub(crate) mod arena;
pub(crate) mod charge;
pub(crate) mod compile;
pub(crate) mod cost;
pub(crate) mod deadline;
#[cfg(feature = "axum")]
pub(crate) mod extract;
pub mod headers;
pub(crate) mod hooks;
pub mod key;
pub(crate) mod limit;
pub(crate) mod lists;
pub(crate) mod numbers;
pub(crate) mod overlap;
pub(crate) mod plan;
pub(crate) mod policy;
pub mod response;
pub(crate) mod routes;
pub(crate) mod settle;
