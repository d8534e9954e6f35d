//! Pure rate-limiting arithmetic: GCRA, the three windows, the algorithm choice and the
//! quota. Integer functions of a state and a time; no store, no clock, no HTTP.

pub(crate) mod algorithm;
#[cfg(feature = "calendar")]
pub mod calendar;
pub mod gcra;
pub(crate) mod quota;
pub mod window;
