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
