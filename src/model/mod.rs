//! The vocabulary every layer above speaks: bucket keys, decisions and outcomes, and the
//! policy enums (mode, failure policy, missing keys, what a refusal does).

pub(crate) mod ban;
pub(crate) mod decision;
pub(crate) mod key;
pub(crate) mod lease;
pub(crate) mod policy;
pub(crate) mod spec;
pub(crate) mod stream;
