//! Reload triggers: changes in the rules file's directory (debounced), and `SIGHUP`.

use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use notify::event::{AccessKind, AccessMode};
use notify::{Event, EventKind, RecursiveMode, Watcher as _};

use crate::error::ConfigError;

/// Watches the directories of a rules file while it lives.
pub(crate) struct Watcher {
    _watcher: notify::RecommendedWatcher,
}

/// Calls `changed` once things have been quiet for `debounce` (at most 10 × `debounce`)
/// after a change of `file` in its directory (and, when `file` is a link to another
/// directory, in that one), on a thread of its own, until `changed` returns `false` or the
/// watcher is dropped.
///
/// The directory is watched rather than the file: a file replaced by a rename (editors,
/// `mv`) or a link swapped (Kubernetes ConfigMaps swap a `..data` link) is a new file
/// that a watch on the old one would never report.
pub(crate) fn watch(
    file: &Path,
    debounce: Duration,
    changed: impl Fn() -> bool + Send + 'static,
) -> Result<Watcher, ConfigError> {
    let names = names(file);
    let (tx, rx) = mpsc::channel::<()>();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<Event>| {
        let Ok(event) = event else { return };
        // Reads (ours too) change nothing.
        if matches!(event.kind, EventKind::Access(_))
            && event.kind != EventKind::Access(AccessKind::Close(AccessMode::Write))
        {
            return;
        }
        // Only the file and the links that lead to it: a log written in the same
        // directory must not keep the quiet period from ever ending.
        let ours = event
            .paths
            .iter()
            .any(|p| p.file_name().is_some_and(|n| names.iter().any(|m| m == n)));
        if ours {
            let _ = tx.send(());
        }
    })
    .map_err(|e| failed(file, &e))?;
    for dir in directories(file) {
        watcher
            .watch(&dir, RecursiveMode::NonRecursive)
            .map_err(|e| failed(&dir, &e))?;
    }
    // Changes that never pause still reload this often.
    let longest = debounce.saturating_mul(10);
    std::thread::Builder::new()
        .name("tollgate-rules-watch".into())
        .spawn(move || {
            while rx.recv().is_ok() {
                // Wait for a quiet `debounce`: one reload per burst of events.
                let first = Instant::now();
                while first.elapsed() < longest {
                    match rx.recv_timeout(debounce) {
                        Ok(()) => continue,
                        Err(RecvTimeoutError::Timeout) => break,
                        Err(RecvTimeoutError::Disconnected) => return,
                    }
                }
                if !changed() {
                    return;
                }
            }
        })
        .map_err(|e| failed(file, &e))?;
    Ok(Watcher { _watcher: watcher })
}

/// The names whose changes may change the file's text: its own, the first step of the
/// link it is (`..data` for Kubernetes' `rules.toml -> ..data/rules.toml`), and the name
/// of what it finally points to.
fn names(file: &Path) -> Vec<OsString> {
    let mut names: Vec<OsString> = file.file_name().map(Into::into).into_iter().collect();
    if let Ok(target) = std::fs::read_link(file)
        && let Some(Component::Normal(first)) = target.components().next()
    {
        names.push(first.to_owned());
    }
    if let Some(name) = std::fs::canonicalize(file)
        .ok()
        .and_then(|t| t.file_name().map(Into::into))
    {
        names.push(name);
    }
    names
}

fn failed(path: &Path, e: &dyn std::fmt::Display) -> ConfigError {
    ConfigError::new("watch", format!("cannot watch {}: {e}", path.display()))
}

/// The file's directory, and the directory of what it links to if that is elsewhere.
fn directories(file: &Path) -> Vec<PathBuf> {
    let parent = |p: &Path| match p.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let dir = parent(file);
    let mut dirs = vec![dir.clone()];
    if let (Ok(target), Ok(dir)) = (std::fs::canonicalize(file), std::fs::canonicalize(&dir)) {
        let target_dir = parent(&target);
        if !target_dir.starts_with(&dir) {
            dirs.push(target_dir);
        }
    }
    dirs
}
