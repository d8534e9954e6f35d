//! [`RulesBuilder`]: where rules come from (a file, text, a document), what triggers a
//! reload (file changes, `SIGHUP`), the bounds on reading, and what every compiled version
//! is built with; `build` makes the first version and starts the triggers.

use super::*;

/// Builds [`Rules`]: where they come from, what triggers a reload, and what the layer
/// adds to them.
pub struct RulesBuilder<St, R = DefaultOnRejection> {
    store: St,
    on_rejection: R,
    source: Source,
    format: Option<Format>,
    watch: bool,
    debounce: Duration,
    sighup: bool,
    configure: Option<Configure<St>>,
    keys: CustomKeys,
    waits: WaitCounts,
    on_reload: Option<OnReload>,
    max_file_size: u64,
    read_timeout: Duration,
    max_limits: usize,
}

enum Source {
    None,
    File(PathBuf),
    Text(String),
    Document(Box<Document>),
}

impl<St: Store, R> fmt::Debug for RulesBuilder<St, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let source = match &self.source {
            Source::None => "none".to_owned(),
            Source::File(p) => format!("file {}", p.display()),
            Source::Text(_) => "text".to_owned(),
            Source::Document(_) => "document".to_owned(),
        };
        f.debug_struct("RulesBuilder")
            .field("source", &source)
            .field("format", &self.format)
            .field("watch", &self.watch)
            .field("debounce", &self.debounce)
            .field("sighup", &self.sighup)
            .field("max_file_size", &self.max_file_size)
            .field("read_timeout", &self.read_timeout)
            .field("max_limits", &self.max_limits)
            .finish_non_exhaustive()
    }
}

impl<St: Store> Rules<St> {
    /// Rules kept in `store`; name where they come from with
    /// [`file`](RulesBuilder::file), [`text`](RulesBuilder::text) or
    /// [`document`](RulesBuilder::document).
    pub fn builder(store: St) -> RulesBuilder<St> {
        RulesBuilder {
            store,
            on_rejection: DefaultOnRejection::new(),
            source: Source::None,
            format: None,
            watch: true,
            debounce: Duration::from_millis(150),
            sighup: true,
            configure: None,
            keys: CustomKeys::new(),
            waits: WaitCounts::default(),
            on_reload: None,
            max_file_size: DEFAULT_MAX_FILE_SIZE,
            read_timeout: DEFAULT_READ_TIMEOUT,
            max_limits: crate::DEFAULT_MAX_LIMITS,
        }
    }
}

impl<St: Store, R> RulesBuilder<St, R> {
    /// Reads the rules from `path` (JSON if it ends in `.json`, else TOML; see
    /// [`format`](Self::format)), and by default reloads them when the file changes and on
    /// `SIGHUP`. Only a regular file (links followed) of at most
    /// [`max_file_size`](Self::max_file_size) bytes is read.
    pub fn file(mut self, path: impl Into<PathBuf>) -> Self {
        self.source = Source::File(path.into());
        self
    }

    /// The first rules, as text (TOML unless [`format`](Self::format) says otherwise).
    pub fn text(mut self, text: impl Into<String>) -> Self {
        self.source = Source::Text(text.into());
        self
    }

    /// The first rules, as a document built by code (e.g. from database rows); later
    /// versions go to [`Rules::reload_document`]. It may have no limits (then the rules
    /// limit nothing), unlike rules text, where an empty or truncated file is refused.
    pub fn document(mut self, document: Document) -> Self {
        self.source = Source::Document(Box::new(document));
        self
    }

    /// The format of the text and of the file, whatever its name.
    pub fn format(mut self, format: Format) -> Self {
        self.format = Some(format);
        self
    }

    /// Whether a change of the file reloads it (default: yes). The file's directory is
    /// watched, so a file written in place, replaced by a rename, or reached through a
    /// link that is swapped (Kubernetes ConfigMaps) is seen; a file that becomes a link to
    /// another directory after the start is followed there; a change that leaves the text
    /// as it was reloads nothing. The reload runs on the watcher's own thread.
    pub fn watch(mut self, watch: bool) -> Self {
        self.watch = watch;
        self
    }

    /// How long the file's directory must be quiet after a change before the file is read
    /// (default 150 ms): one reload per save, not one per write.
    pub fn debounce(mut self, quiet: Duration) -> Self {
        self.debounce = quiet;
        self
    }

    /// Whether `SIGHUP` reloads the file (default: yes, on Unix, for a file). It needs a
    /// Tokio runtime with I/O enabled when [`build`](Self::build) runs. Listening replaces
    /// the signal's default action (ending the process) for the whole process. The file is
    /// read and compiled on threads of their own, never on the runtime's: requests do not
    /// wait for a reload.
    pub fn sighup(mut self, listen: bool) -> Self {
        self.sighup = listen;
        self
    }

    /// The largest rules file read, in bytes (default 16 MiB). A larger file is refused
    /// with an error naming the file and the limit; reading stops one byte past it, so a
    /// file that never ends costs no more.
    ///
    /// Whatever the limit, only a regular file is read (links are followed): a FIFO, a
    /// device such as `/dev/zero`, a directory or a socket is refused, without waiting
    /// for a FIFO's writer.
    pub fn max_file_size(mut self, bytes: u64) -> Self {
        self.max_file_size = bytes;
        self
    }

    /// The most limits a document may have (default
    /// [`DEFAULT_MAX_LIMITS`](crate::DEFAULT_MAX_LIMITS), 1,000): a document with more is
    /// refused before anything is built, with an error naming `limits` and the cap, and
    /// the running rules stay. Rules from a file, text, code or a `RateLimitRule` table
    /// alike. It is also the layer's [`max_limits`](RateLimitBuilder::max_limits), which a
    /// [`configure`](Self::configure) function may change for what it adds.
    pub fn max_limits(mut self, n: usize) -> Self {
        self.max_limits = n;
        self
    }

    /// How long a load waits for the file's bytes (default 30 s): the first load, each
    /// reload on a change, on `SIGHUP` or by [`Rules::reload_file`]. A read that takes
    /// longer (a hung network filesystem) is abandoned and counted as a failed reload in
    /// [`Rules::status`]; the running rules stay. Its thread may stay blocked in the
    /// read: until it returns, later reloads of the file are refused with an error
    /// rather than blocking another thread.
    pub fn read_timeout(mut self, timeout: Duration) -> Self {
        self.read_timeout = timeout;
        self
    }

    /// Applied to the builder of every version of the rules, after the document's limits
    /// and settings: what a file does not say (an [`on_decision`](RateLimitBuilder::on_decision)
    /// observer, refusal logs, more limits written in code).
    pub fn configure<F>(mut self, configure: F) -> Self
    where
        F: Fn(RateLimitBuilder<St>) -> RateLimitBuilder<St> + Send + Sync + 'static,
    {
        self.configure = Some(Arc::new(configure));
        self
    }

    /// Called after every reload, successful (with the new document) or not (with the
    /// error), and after the first load: e.g. to print the rules.
    pub fn on_reload<F>(mut self, on_reload: F) -> Self
    where
        F: Fn(Result<&Document, &ConfigError>) + Send + Sync + 'static,
    {
        self.on_reload = Some(Arc::new(on_reload));
        self
    }

    /// Registers a key part that documents name `custom:<name>` (a key no string can
    /// describe, such as a request extension's type).
    #[cfg(feature = "rules-sql")]
    pub(crate) fn custom_key(
        mut self,
        name: &str,
        key: Arc<dyn crate::web::key::KeyExtractor>,
    ) -> Self {
        self.keys.insert(name.to_owned(), key);
        self
    }

    /// Replaces the responses to refused requests (see [`crate::web::response`]).
    pub fn on_rejection<R2>(self, on_rejection: R2) -> RulesBuilder<St, R2> {
        RulesBuilder {
            store: self.store,
            on_rejection,
            source: self.source,
            format: self.format,
            watch: self.watch,
            debounce: self.debounce,
            sighup: self.sighup,
            configure: self.configure,
            keys: self.keys,
            waits: self.waits,
            on_reload: self.on_reload,
            max_file_size: self.max_file_size,
            read_timeout: self.read_timeout,
            max_limits: self.max_limits,
        }
    }
}

impl<St: Store, R: Clone + Send + Sync + 'static> RulesBuilder<St, R> {
    /// Loads and compiles the first rules, and starts the reload triggers. Invalid rules
    /// are a [`ConfigError`] naming the file, the line and the field
    /// (`rules.toml:14: limits[2].quota: ...`); so is a file that cannot be read as rules
    /// (not a regular file, over [`max_file_size`](Self::max_file_size), not UTF-8, or
    /// not read within [`read_timeout`](Self::read_timeout)).
    pub fn build(self) -> Result<Rules<St, R>, ConfigError> {
        let (file, format) = match &self.source {
            Source::File(path) => (
                Some(path.clone()),
                self.format.unwrap_or(Format::from_path(path)),
            ),
            _ => (None, self.format.unwrap_or_default()),
        };
        let reader = FileReader::new(self.max_file_size, self.read_timeout);
        let compiler = Compiler {
            store: self.store,
            on_rejection: self.on_rejection,
            configure: self.configure,
            keys: self.keys,
            waits: self.waits,
            max_limits: self.max_limits,
        };
        let (document, shared, hash) = match self.source {
            Source::None => {
                return Err(ConfigError::new(
                    "rules",
                    "no source: call `file`, `text` or `document`",
                ));
            }
            Source::File(path) => {
                let text = reader.read(&path)?;
                let name = path.display().to_string();
                let doc = Document::parse(&text, format, Some(&name))?;
                let shared = compiler.build(&doc, Some((&text, format, &name)))?;
                (doc, shared, Some(sha256(&text)))
            }
            Source::Text(text) => {
                let doc = Document::parse(&text, format, None)?;
                let shared = compiler.build(&doc, Some((&text, format, "")))?;
                (doc, shared, None)
            }
            Source::Document(doc) => {
                let shared = compiler.build(&doc, None)?;
                (*doc, shared, None)
            }
        };
        let inner = Arc::new(Reloadable {
            current: ArcSwap::new(Arc::new(Version::new(shared))),
            document: ArcSwap::from_pointee(document),
            compiler,
            file,
            format,
            on_reload: self.on_reload,
            reader,
            file_reload: Mutex::default(),
            state: Mutex::new({
                let state = State {
                    healthy: true,
                    last_hash: hash,
                    ..State::default()
                };
                state.metrics.healthy(true);
                state
            }),
            watcher: Mutex::new(None),
            #[cfg(unix)]
            hangup: Mutex::new(None),
            #[cfg(feature = "rules-sql")]
            tasks: Mutex::new(Vec::new()),
        });
        if let Some(on_reload) = &inner.on_reload {
            on_reload(Ok(&inner.document.load()));
        }
        if let Some(path) = &inner.file {
            if self.watch {
                let weak = Arc::downgrade(&inner);
                let watcher = watch::watch(path, self.debounce, move || match weak.upgrade() {
                    Some(rules) => {
                        // Refusals are logged and counted; the running rules stay.
                        let _ = rules.reload_file(Trigger::File, true);
                        true
                    }
                    None => false,
                })?;
                *inner.watcher.lock().unwrap_or_else(PoisonError::into_inner) = Some(watcher);
            }
            #[cfg(unix)]
            if self.sighup {
                let task = listen_hangup(Arc::downgrade(&inner))?;
                *inner.hangup.lock().unwrap_or_else(PoisonError::into_inner) = Some(task);
            }
        }
        Ok(Rules { inner })
    }
}

/// Reloads the file on each `SIGHUP` while the rules live: on a thread of its own, so the
/// runtime's threads never block on the file; a signal that comes while a reload of the
/// file is running is merged into it.
#[cfg(unix)]
fn listen_hangup<St: Store, R: Clone + Send + Sync + 'static>(
    rules: Weak<Reloadable<St, R>>,
) -> Result<tokio::task::AbortHandle, ConfigError> {
    use tokio::signal::unix::{SignalKind, signal};
    let no_signal = |reason: String| ConfigError::new("sighup", reason);
    let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
        no_signal("listening for SIGHUP needs a Tokio runtime: build the rules inside one, or call `sighup(false)`".into())
    })?;
    let _entered = runtime.enter();
    let mut hangup = signal(SignalKind::hangup())
        .map_err(|e| no_signal(format!("cannot listen for SIGHUP: {e}")))?;
    let task = runtime.spawn(async move {
        while hangup.recv().await.is_some() {
            let Some(rules) = rules.upgrade() else { break };
            if !rules.claim_file_reload() {
                continue;
            }
            let claimed = rules.clone();
            let spawned = std::thread::Builder::new()
                .name("tollgate-rules-reload".into())
                .spawn(move || {
                    // Refusals are logged and counted; the running rules stay.
                    let _ = claimed.run_file_reloads(Trigger::Signal, false);
                });
            if let Err(e) = spawned {
                rules.release_file_reload();
                let e = ConfigError::new("sighup", format!("no thread to reload on: {e}"));
                rules.refused(Trigger::Signal, e);
            }
        }
    });
    Ok(task.abort_handle())
}
