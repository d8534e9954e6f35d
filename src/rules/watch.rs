//! Reload triggers: changes in the rules file's directory (debounced), and `SIGHUP`.

use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use notify::event::{AccessKind, AccessMode};
use notify::{Event, EventKind, RecursiveMode, Watcher as _};

use crate::base::error::ConfigError;

/// Watches the directories of a rules file while it lives.
pub(crate) struct Watcher {
    /// Shared with the thread only as a `Weak`, to watch more directories: dropping this
    /// ends the watch, which ends the thread.
    _watcher: Arc<Mutex<notify::RecommendedWatcher>>,
}

/// Calls `changed` once things have been quiet for `debounce` (at most 10 × `debounce`)
/// after a change of `file` in its directory (and, when `file` is a link to another
/// directory, in that one), on a thread of its own, until `changed` returns `false` or the
/// watcher is dropped.
///
/// The directory is watched rather than the file: a file replaced by a rename (editors,
/// `mv`) or a link swapped (Kubernetes ConfigMaps swap a `..data` link) is a new file
/// that a watch on the old one would never report. Where the file leads is looked up
/// again after each change, before `changed` runs: a file that becomes a link to another
/// directory (or a link that comes to point elsewhere) is followed there.
pub(crate) fn watch(
    file: &Path,
    debounce: Duration,
    changed: impl Fn() -> bool + Send + 'static,
) -> Result<Watcher, ConfigError> {
    let names = Arc::new(Mutex::new(names(file)));
    // One pending wake-up is enough: however many events come, memory stays the same.
    let (tx, rx) = mpsc::sync_channel::<()>(1);
    let ours_names = names.clone();
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
        let ours = {
            let names = ours_names.lock().unwrap_or_else(PoisonError::into_inner);
            event
                .paths
                .iter()
                .any(|p| p.file_name().is_some_and(|n| names.iter().any(|m| m == n)))
        };
        if ours {
            let _ = tx.try_send(());
        }
    })
    .map_err(|e| failed(file, &e))?;
    let mut watched = Vec::new();
    for dir in directories(file) {
        watcher
            .watch(&dir, RecursiveMode::NonRecursive)
            .map_err(|e| failed(&dir, &e))?;
        watched.push(dir);
    }
    let watcher = Arc::new(Mutex::new(watcher));
    let mut follow = Follow {
        file: file.to_owned(),
        names,
        watcher: Arc::downgrade(&watcher),
        watched,
    };
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
                follow.again();
                if !changed() {
                    return;
                }
            }
        })
        .map_err(|e| failed(file, &e))?;
    Ok(Watcher { _watcher: watcher })
}

/// Where the file leads, looked up again after each change.
struct Follow {
    file: PathBuf,
    /// The names the event handler listens for.
    names: Arc<Mutex<Vec<OsString>>>,
    watcher: Weak<Mutex<notify::RecommendedWatcher>>,
    /// The directories watched so far (never unwatched: the names filter their events).
    watched: Vec<PathBuf>,
}

impl Follow {
    /// Listens for the names the file leads through now, in the directories it leads to
    /// now.
    fn again(&mut self) {
        *self.names.lock().unwrap_or_else(PoisonError::into_inner) = names(&self.file);
        let Some(watcher) = self.watcher.upgrade() else {
            return;
        };
        for dir in directories(&self.file) {
            if self.watched.contains(&dir) {
                continue;
            }
            let watching = watcher
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .watch(&dir, RecursiveMode::NonRecursive);
            match watching {
                Ok(()) => self.watched.push(dir),
                Err(e) => tracing::warn!(
                    target: "tollgate::rules",
                    error = %failed(&dir, &e),
                    "the rules file now leads to a directory that cannot be watched; \
                     SIGHUP still reloads it"
                ),
            }
        }
    }
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
