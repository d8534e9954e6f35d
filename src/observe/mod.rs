//! Observability sinks: metrics (feature `metrics`) and the top-offender tables. They
//! import only the lowest layers (base, algorithms, vocabulary) and never call up.

#[cfg(feature = "metrics")]
pub mod metrics;
pub(crate) mod offenders;
pub(crate) mod probe;
