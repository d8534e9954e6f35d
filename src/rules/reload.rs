//! [`Rules`]: compiled rules behind an `ArcSwap`, replaced whole on reload, and the live
//! source their layer and limiter read. How they are built is in `reload/builder.rs`.

mod builder;

pub use builder::RulesBuilder;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use sha2::{Digest, Sha256};

use crate::base::error::ConfigError;
use crate::engine::delay::WaitCounts;
use crate::limiter::Limiter;
use crate::middleware::builder::RateLimitBuilder;
use crate::middleware::layer::RateLimitLayer;
use crate::middleware::shared::{Shared, Version};
use crate::middleware::source::Live;
use crate::rules::compile::{CustomKeys, compile_maybe_empty, rebase};
use crate::rules::document::Document;
use crate::rules::format::Format;
use crate::rules::locate::Tree;
use crate::rules::read::{DEFAULT_MAX_FILE_SIZE, DEFAULT_READ_TIMEOUT, FileReader};
use crate::rules::watch::{self, Watcher};
use crate::store::Store;
use crate::web::response::DefaultOnRejection;

/// What [`RulesBuilder::configure`] does to the builder of every compiled version.
type Configure<St> =
    Arc<dyn Fn(RateLimitBuilder<St>) -> RateLimitBuilder<St> + Send + Sync + 'static>;

/// Told each reload's outcome.
type OnReload = Arc<dyn Fn(Result<&Document, &ConfigError>) + Send + Sync + 'static>;

/// What asked for a reload (in logs).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Trigger {
    File,
    Signal,
    Call,
    /// A poll of the `RateLimitRule` table.
    #[cfg(feature = "rules-sql")]
    Sql,
}

/// Reload counts and the last error, from [`Rules::status`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReloadStatus {
    /// Reloads that replaced the rules (the first load is not counted).
    pub reloads: u64,
    /// Reloads refused because the new rules were invalid or unreadable.
    pub failures: u64,
    /// The error of the latest refused reload (kept after later successes: compare
    /// [`healthy`](Self::healthy)).
    pub last_error: Option<ConfigError>,
    /// Whether the latest reload (or the first load) succeeded: the running rules are the
    /// newest ones.
    pub healthy: bool,
}

/// Rules loaded from a file (or text, or a [`Document`]), compiled into a rate limiting
/// engine, and replaced whole when they change. A cheap handle: clones share everything.
///
/// [`layer`](Self::layer) is the middleware; each request loads the current rules once
/// and finishes on them, even if a reload happens meanwhile. A reload compiles the new
/// rules with the same store: a limit whose name is unchanged keeps its buckets (with its
/// new quota, if that changed); a removed limit is no longer checked. Invalid rules are
/// refused whole: the running rules stay, one `ERROR` event is logged (target
/// `tollgate::rules`) and [`status`](Self::status) counts it.
///
/// See the [module docs](crate::rules) for the document and an example.
pub struct Rules<St: Store, R = DefaultOnRejection> {
    inner: Arc<Reloadable<St, R>>,
}

impl<St: Store, R> Clone for Rules<St, R> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<St: Store, R> fmt::Debug for Rules<St, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rules")
            .field("file", &self.inner.file)
            .field("format", &self.inner.format)
            .field("limits", &self.inner.limit_names())
            .field("status", &self.inner.status())
            .finish_non_exhaustive()
    }
}

struct Reloadable<St: Store, R> {
    current: ArcSwap<Version<St, R>>,
    document: ArcSwap<Document>,
    /// What every version is compiled with.
    compiler: Compiler<St, R>,
    file: Option<PathBuf>,
    format: Format,
    on_reload: Option<OnReload>,
    /// Reads the file, bounded in size and time.
    reader: FileReader,
    /// Whether a reload of the file is running, and whether another was asked for
    /// meanwhile: one at a time, later ones merged into one more.
    file_reload: Mutex<FileReload>,
    /// Counts and the last outcome; held only to update them and to swap the rules,
    /// never while reading or compiling.
    state: Mutex<State>,
    /// Kept alive with the rules.
    watcher: Mutex<Option<Watcher>>,
    #[cfg(unix)]
    hangup: Mutex<Option<tokio::task::AbortHandle>>,
    /// Tasks that serve these rules (the SQL poller), aborted with them.
    #[cfg(feature = "rules-sql")]
    tasks: Mutex<Vec<tokio::task::AbortHandle>>,
}

#[derive(Default)]
struct State {
    reloads: u64,
    failures: u64,
    last_error: Option<ConfigError>,
    healthy: bool,
    /// The SHA-256 of the text last read from the file: a change event that leaves it as
    /// it was (a `touch`, a rewrite of the same text) reloads nothing.
    last_hash: Option<[u8; 32]>,
    /// `tollgate_reloads_total` and `tollgate_rules_healthy` (feature `metrics`).
    metrics: crate::observe::probe::ReloadMetrics,
}

#[derive(Default)]
struct FileReload {
    running: bool,
    again: bool,
}

/// Ends a claim on [`Reloadable::file_reload`] however the reload ends (a panicking
/// `on_reload` too), unless [`Reloadable::run_file_reloads`] ended it first.
struct Claim<'a> {
    queue: &'a Mutex<FileReload>,
    done: bool,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if !self.done {
            let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
            queue.running = false;
            queue.again = false;
        }
    }
}

fn sha256(text: &str) -> [u8; 32] {
    Sha256::digest(text.as_bytes()).into()
}

impl<St: Store, R> Drop for Reloadable<St, R> {
    fn drop(&mut self) {
        #[cfg(feature = "rules-sql")]
        for task in self
            .tasks
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
        {
            task.abort();
        }
        #[cfg(unix)]
        if let Some(task) = self
            .hangup
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            task.abort();
        }
    }
}

/// A document with more than `max_limits` limits is refused before anything is built.
fn check_count(doc: &Document, max_limits: usize) -> Result<(), ConfigError> {
    let count = doc.limits.len();
    if count > max_limits {
        return Err(ConfigError::new(
            "limits",
            format!("{count} limits, more than the {max_limits} these rules take (`max_limits`)"),
        ));
    }
    Ok(())
}

/// What every version of the rules is compiled with: the store, the rejection responses,
/// the code's additions, and the bounds.
struct Compiler<St, R> {
    store: St,
    on_rejection: R,
    configure: Option<Configure<St>>,
    keys: CustomKeys,
    /// Delay mode's waiter counts, shared by every version of the rules.
    waits: WaitCounts,
    /// The most limits a document may have.
    max_limits: usize,
}

impl<St: Store, R: Clone> Compiler<St, R> {
    /// Compiles `doc` into an engine over the store. `text`: the text it was read from,
    /// its format and its file name (empty if none), to locate errors. A document built
    /// by code (no text) may have no limits; rules text may not. A document over
    /// `max_limits` is refused before anything is built.
    fn build(
        &self,
        doc: &Document,
        text: Option<(&str, Format, &str)>,
    ) -> Result<Arc<Shared<St, R>>, ConfigError> {
        let built = check_count(doc, self.max_limits)
            .and_then(|()| compile_maybe_empty(doc, &self.keys, text.is_none()))
            .and_then(|compiled| {
                let mut builder = compiled
                    .apply(RateLimitLayer::builder(self.store.clone()).max_limits(self.max_limits))
                    .wait_counts(self.waits.clone());
                if let Some(configure) = &self.configure {
                    builder = configure(builder);
                }
                builder
                    .on_rejection(self.on_rejection.clone())
                    .build_shared()
                    .map_err(|e| rebase(doc, e))
            });
        match (built, text) {
            (Ok(shared), _) => Ok(Arc::new(shared)),
            (Err(e), None) => Err(e),
            (Err(e), Some((text, format, file))) => {
                let line = Tree::parse(text, format)
                    .ok()
                    .and_then(|tree| tree.line(text, e.field()));
                let file = (!file.is_empty()).then_some(file);
                Err(e.located(file, line))
            }
        }
    }
}

impl<St: Store, R: Clone + Send + Sync + 'static> Reloadable<St, R> {
    /// Reads the file and installs it; `if_changed`: only if its text changed. If a reload
    /// of the file is already running, this one is merged into it (the running one reads
    /// the file once more when it is done) and returns at once.
    fn reload_file(&self, trigger: Trigger, if_changed: bool) -> Result<(), ConfigError> {
        if !self.claim_file_reload() {
            return Ok(());
        }
        self.run_file_reloads(trigger, if_changed)
    }

    /// Claims the one reload of the file that may run; `false` if one is running (it will
    /// read the file once more when it is done).
    fn claim_file_reload(&self) -> bool {
        let mut queue = self
            .file_reload
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if queue.running {
            queue.again = true;
            tracing::debug!(
                target: "tollgate::rules",
                "a reload of the rules file is running; it reads the file once more when done"
            );
            return false;
        }
        queue.running = true;
        true
    }

    /// Gives back a claim that ran nothing.
    fn release_file_reload(&self) {
        drop(Claim {
            queue: &self.file_reload,
            done: false,
        });
    }

    /// With the claim of [`claim_file_reload`](Self::claim_file_reload): reloads the file,
    /// and again (if it changed) as long as reloads were asked for meanwhile.
    fn run_file_reloads(&self, trigger: Trigger, if_changed: bool) -> Result<(), ConfigError> {
        let mut claim = Claim {
            queue: &self.file_reload,
            done: false,
        };
        let mut if_changed = if_changed;
        loop {
            let outcome = self.reload_file_once(trigger, if_changed);
            let mut queue = claim.queue.lock().unwrap_or_else(PoisonError::into_inner);
            if queue.again {
                queue.again = false;
                if_changed = true;
                continue;
            }
            queue.running = false;
            claim.done = true;
            return outcome;
        }
    }

    fn reload_file_once(&self, trigger: Trigger, if_changed: bool) -> Result<(), ConfigError> {
        let Some(path) = &self.file else {
            return Err(ConfigError::new(
                "file",
                "these rules were not read from a file",
            ));
        };
        let text = match self.reader.read(path) {
            Ok(text) => text,
            Err(e) => return Err(self.refused(trigger, e)),
        };
        let hash = sha256(&text);
        {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            if if_changed && state.last_hash == Some(hash) {
                return Ok(());
            }
            state.last_hash = Some(hash);
        }
        let name = path.display().to_string();
        self.install_text(trigger, &text, Some(&name))
    }

    /// Parses and compiles `text` (without a lock), then installs it.
    fn install_text(
        &self,
        trigger: Trigger,
        text: &str,
        file: Option<&str>,
    ) -> Result<(), ConfigError> {
        let built = Document::parse(text, self.format, file).and_then(|doc| {
            let located = (text, self.format, file.unwrap_or(""));
            let shared = self.compiler.build(&doc, Some(located))?;
            Ok((doc, shared))
        });
        match built {
            Ok((doc, shared)) => {
                self.installed(trigger, doc, shared);
                Ok(())
            }
            Err(e) => Err(self.refused(trigger, e)),
        }
    }

    fn install_document(&self, trigger: Trigger, doc: Document) -> Result<(), ConfigError> {
        let built = self.compiler.build(&doc, None);
        match built {
            Ok(shared) => {
                self.installed(trigger, doc, shared);
                Ok(())
            }
            Err(e) => Err(self.refused(trigger, e)),
        }
    }

    /// Swaps in compiled rules: the rules and their document together, under the lock.
    fn installed(&self, trigger: Trigger, doc: Document, shared: Arc<Shared<St, R>>) {
        let doc = Arc::new(doc);
        {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            self.current.store(Arc::new(Version::new(shared)));
            self.document.store(doc.clone());
            state.reloads += 1;
            state.healthy = true;
            state.metrics.reloaded(true);
        }
        tracing::info!(
            target: "tollgate::rules",
            trigger = ?trigger,
            limits = doc.limits.len(),
            "rules reloaded"
        );
        if let Some(on_reload) = &self.on_reload {
            on_reload(Ok(&doc));
        }
    }

    fn refused(&self, trigger: Trigger, e: ConfigError) -> ConfigError {
        self.refused_quietly(trigger, e, true)
    }

    /// Counts a refused reload; `announce`: log it as an `ERROR` and tell `on_reload`
    /// (else a `DEBUG` event: a failure repeated at each poll is announced once in a
    /// while).
    fn refused_quietly(&self, trigger: Trigger, e: ConfigError, announce: bool) -> ConfigError {
        {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            state.failures += 1;
            state.healthy = false;
            state.metrics.reloaded(false);
            state.last_error = Some(e.clone());
        }
        if !announce {
            tracing::debug!(
                target: "tollgate::rules",
                trigger = ?trigger,
                error = %e,
                "rules not reloaded (again), the running rules stay"
            );
            return e;
        }
        tracing::error!(
            target: "tollgate::rules",
            trigger = ?trigger,
            error = %e,
            "rules not reloaded, the running rules stay"
        );
        if let Some(on_reload) = &self.on_reload {
            on_reload(Err(&e));
        }
        e
    }
}

impl<St: Store, R> Reloadable<St, R> {
    fn status(&self) -> ReloadStatus {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        ReloadStatus {
            reloads: state.reloads,
            failures: state.failures,
            last_error: state.last_error.clone(),
            healthy: state.healthy,
        }
    }

    fn limit_names(&self) -> Vec<String> {
        self.document
            .load()
            .limits
            .iter()
            .map(|l| l.name.clone())
            .collect()
    }
}

impl<St: Store, R: Clone + Send + Sync + 'static> Rules<St, R> {
    /// The middleware: requests are limited by the rules current when they arrive.
    pub fn layer(&self) -> RateLimitLayer<St, R> {
        RateLimitLayer::live(self.inner.clone())
    }

    /// A [`Limiter`] handle on the current rules: each call uses the rules current at that
    /// moment (a limit removed by a reload is then
    /// [`UnknownLimit`](crate::LimiterError::UnknownLimit)). The handle in a request's
    /// extensions is the one of the rules that request runs on.
    pub fn limiter(&self) -> Limiter {
        self.layer().limiter()
    }

    /// The current document.
    pub fn document(&self) -> Arc<Document> {
        self.inner.document.load_full()
    }

    /// Reload counts and the last error.
    pub fn status(&self) -> ReloadStatus {
        self.inner.status()
    }

    /// The file the rules are read from, if any.
    pub fn file(&self) -> Option<&Path> {
        self.inner.file.as_deref()
    }

    /// Reads the file again and installs it (what a file change and `SIGHUP` do). On an
    /// error the running rules stay.
    ///
    /// It reads and compiles in the calling thread, waiting up to
    /// [`read_timeout`](RulesBuilder::read_timeout) for the file: from async code, call it
    /// in `spawn_blocking`. If a reload of the file is already running (a change, a
    /// `SIGHUP`, another call), this call is merged into it: it returns `Ok` at once, and
    /// the running reload reads the file once more when it is done.
    pub fn reload_file(&self) -> Result<(), ConfigError> {
        self.inner.reload_file(Trigger::Call, false)
    }

    /// Installs rules given as text, in the builder's format. On an error the running
    /// rules stay.
    pub fn reload(&self, text: &str) -> Result<(), ConfigError> {
        self.inner.install_text(Trigger::Call, text, None)
    }

    /// Installs a document built by code (e.g. read from a database). On an error the
    /// running rules stay. A document built by code may have no limits: the rules then
    /// limit nothing (rules text without a limit is refused).
    pub fn reload_document(&self, document: Document) -> Result<(), ConfigError> {
        self.inner.install_document(Trigger::Call, document)
    }

    /// Installs `document` for `trigger` (the SQL poller's reloads).
    #[cfg(feature = "rules-sql")]
    pub(crate) fn install(&self, trigger: Trigger, document: Document) -> Result<(), ConfigError> {
        self.inner.install_document(trigger, document)
    }

    /// Counts a reload that failed before any document (a failed query, rows that do not
    /// map); `announce` as in `refused_quietly`.
    #[cfg(feature = "rules-sql")]
    pub(crate) fn refuse(&self, trigger: Trigger, e: ConfigError, announce: bool) {
        self.inner.refused_quietly(trigger, e, announce);
    }

    /// The source is readable again and still holds the running rules: healthy, without
    /// a reload.
    #[cfg(feature = "rules-sql")]
    pub(crate) fn recovered(&self, trigger: Trigger) {
        let mut state = self
            .inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if !state.healthy {
            state.healthy = true;
            state.metrics.healthy(true);
            tracing::info!(
                target: "tollgate::rules",
                trigger = ?trigger,
                "rules readable again; they have not changed"
            );
        }
    }

    /// Ends `task` when the rules are dropped.
    #[cfg(feature = "rules-sql")]
    pub(crate) fn own_task(&self, task: tokio::task::AbortHandle) {
        self.inner
            .tasks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(task);
    }

    /// A handle that does not keep the rules alive.
    #[cfg(feature = "rules-sql")]
    pub(crate) fn downgrade(&self) -> WeakRules<St, R> {
        WeakRules(Arc::downgrade(&self.inner))
    }
}

/// [`Rules`] not kept alive: the SQL poller's hold, which ends with the rules.
#[cfg(feature = "rules-sql")]
pub(crate) struct WeakRules<St: Store, R>(Weak<Reloadable<St, R>>);

#[cfg(feature = "rules-sql")]
impl<St: Store, R> WeakRules<St, R> {
    pub(crate) fn upgrade(&self) -> Option<Rules<St, R>> {
        self.0.upgrade().map(|inner| Rules { inner })
    }
}

/// The rules are a live source for their layer: each request loads the version current
/// when it arrives.
impl<St: Store, R: Send + Sync + 'static> Live<St, R> for Reloadable<St, R> {
    fn current(&self) -> arc_swap::Guard<Arc<Version<St, R>>> {
        self.current.load()
    }
}
