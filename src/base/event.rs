//! `tracing` events at a level chosen at run time (`tracing`'s macros take a constant).

/// `tracing::event!` at the run-time `Level` `$level`, with target `$target`.
macro_rules! event_at {
    ($level:expr, $target:literal, $($rest:tt)*) => {
        match $level {
            Level::ERROR => tracing::event!(target: $target, Level::ERROR, $($rest)*),
            Level::WARN => tracing::event!(target: $target, Level::WARN, $($rest)*),
            Level::INFO => tracing::event!(target: $target, Level::INFO, $($rest)*),
            Level::DEBUG => tracing::event!(target: $target, Level::DEBUG, $($rest)*),
            Level::TRACE => tracing::event!(target: $target, Level::TRACE, $($rest)*),
        }
    };
}
pub(crate) use event_at;

/// Whether an event of `$target` at the run-time `$level` would be recorded: checked
/// before rendering what the event would carry.
macro_rules! enabled_at {
    ($level:expr, $target:literal) => {
        match $level {
            Level::ERROR => tracing::enabled!(target: $target, Level::ERROR),
            Level::WARN => tracing::enabled!(target: $target, Level::WARN),
            Level::INFO => tracing::enabled!(target: $target, Level::INFO),
            Level::DEBUG => tracing::enabled!(target: $target, Level::DEBUG),
            Level::TRACE => tracing::enabled!(target: $target, Level::TRACE),
        }
    };
}
pub(crate) use enabled_at;
