//! The bottom layer: errors, clocks, interned names, log throttling and text written on
//! the stack. Imports nothing of the crate.

pub mod clock;
pub(crate) mod error;
pub(crate) mod event;
pub(crate) mod intern;
pub(crate) mod memo;
pub(crate) mod round;
pub(crate) mod text;
pub(crate) mod throttle;
