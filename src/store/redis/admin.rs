//! Commands that managed services rename, disable or leave out of an ACL user's rights:
//! how the store tells such a refusal from a failure, and the one log line it writes for
//! each, whatever the number of stores and calls.
//!
//! None of them decides a request. `INFO` (the probe reads `run_id` and evictions) and
//! `CLUSTER SLOTS` (the probe's one marker per master) only help notice a lost state;
//! without them the probe reads the marker it can. `SCRIPT LOAD` only saves sending a
//! script's text: without it the script goes once by `EVAL`, which caches it too.

use std::sync::atomic::{AtomicBool, Ordering};

/// An admin command the store can do without.
#[derive(Clone, Copy, Debug)]
pub(super) enum Admin {
    Info,
    ClusterSlots,
    ScriptLoad,
}

static LOGGED: [AtomicBool; 3] = [
    AtomicBool::new(false),
    AtomicBool::new(false),
    AtomicBool::new(false),
];

/// Whether `error` is Redis refusing the command — `NOPERM` (an ACL user without it) or
/// an unknown command (renamed or disabled) — rather than failing to answer.
pub(super) fn is_refusal(error: &redis::RedisError) -> bool {
    match error.kind() {
        redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm) => true,
        redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError) => error
            .detail()
            .is_some_and(|d| d.to_ascii_lowercase().contains("unknown command")),
        _ => false,
    }
}

/// Logs, once per process, that Redis refuses `command` and what the store does instead.
pub(super) fn refused(command: Admin, error: &redis::RedisError) {
    if LOGGED[command as usize].swap(true, Ordering::Relaxed) {
        return;
    }
    let code = error.code().unwrap_or("ERR");
    match command {
        Admin::Info => tracing::warn!(
            code,
            "tollgate: Redis refuses INFO (renamed, disabled or not granted); a restart or an eviction is noticed by the epoch marker alone"
        ),
        Admin::ClusterSlots => tracing::warn!(
            code,
            "tollgate: Redis refuses CLUSTER SLOTS (renamed, disabled or not granted); the epoch marker is kept on one master only, so a loss of state on another is not noticed"
        ),
        Admin::ScriptLoad => tracing::warn!(
            code,
            "tollgate: Redis refuses SCRIPT LOAD (renamed, disabled or not granted); a script missing from its cache is sent once by EVAL instead"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(kind: redis::ServerErrorKind, detail: &str) -> redis::RedisError {
        redis::RedisError::from((redis::ErrorKind::Server(kind), "refused", detail.to_owned()))
    }

    #[test]
    fn a_refusal_is_noperm_or_an_unknown_command_not_a_failure() {
        assert!(is_refusal(&error(
            redis::ServerErrorKind::NoPerm,
            "this user has no permissions to run the 'info' command"
        )));
        assert!(is_refusal(&error(
            redis::ServerErrorKind::ResponseError,
            "unknown command 'INFO', with args beginning with: "
        )));
        assert!(!is_refusal(&error(
            redis::ServerErrorKind::ResponseError,
            "wrong number of arguments"
        )));
        assert!(!is_refusal(&redis::RedisError::from((
            redis::ErrorKind::Io,
            "broken pipe"
        ))));
    }
}
