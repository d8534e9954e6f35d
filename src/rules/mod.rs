//! Rules as data (feature `rules`): the limits of a layer written in a TOML (or JSON)
//! file, checked with errors that name the file, the line and the field, and reloaded
//! while the server runs.
//!
//! ```toml
//! [settings]
//! headers = "draft-11"             # draft-11 | draft-7 | draft-6 | legacy | none
//! trusted_proxies = ["10.0.0.0/8"] # for client_ip; or hops = 1
//!
//! [[limits]]
//! name = "per-ip"
//! key = "client_ip"
//! quota = "5/s; burst=10"
//! routes = ["POST /login"]
//! ```
//!
//! Every field, its values and defaults are described in the guide ([Rules from a
//! file](crate::guide::rules)) and on [`Document`], [`Settings`] and [`LimitRule`]; each maps onto the
//! builder API ([`Limit`](crate::Limit), [`Quota`](crate::Quota)'s string syntax, the
//! [`key`](crate::web::key) extractors, [`Cost`](crate::Cost), ...), so a file can say nothing
//! code could not.
//!
//! [`Rules`] holds the compiled rules behind an `ArcSwap` and serves them through
//! [`Rules::layer`]. They are replaced whole when the file changes (its directory is
//! watched: writes in place, renames over it and swapped links are all seen), on `SIGHUP`,
//! or by [`Rules::reload`], [`Rules::reload_file`] and [`Rules::reload_document`] (the
//! door for rules that come from elsewhere; rules from a `RateLimitRule` table are
//! polled by `RulesBuilder::build_sql`, feature `rules-sql`). A limit that keeps its
//! name keeps its buckets; invalid rules are refused whole and the running ones stay.
//!
//! A file is read, parsed and compiled off the request path (requests never wait for a
//! reload), and only if it is a regular file of at most
//! [`max_file_size`](RulesBuilder::max_file_size) bytes whose bytes come within
//! [`read_timeout`](RulesBuilder::read_timeout), nested at most 128 levels deep: anything
//! else is refused with an error naming the file, and the running rules stay.
//!
//! ```
//! use tollgate::rules::Rules;
//! use tollgate::store::MemoryStore;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tollgate::ConfigError> {
//! let rules = Rules::builder(MemoryStore::new())
//!     .text(r#"
//!         [[limits]]
//!         name = "per-ip"
//!         key = "peer_ip"
//!         quota = "5/s; burst=10"
//!     "#)
//!     .build()?;
//! let layer = rules.layer(); // `Router::route_layer(layer)`
//! # let _ = layer;
//!
//! // A bad quota is refused with its line and field; the running rules stay.
//! let err = rules
//!     .reload("[[limits]]\nname = \"per-ip\"\nquota = \"5/fortnight\"\n")
//!     .unwrap_err();
//! assert_eq!(err.line(), Some(3));
//! assert_eq!(err.field(), "limits[0].quota");
//! assert_eq!(rules.status().failures, 1);
//! assert_eq!(rules.document().limits[0].quota.as_deref(), Some("5/s; burst=10"));
//! # Ok(()) }
//! ```
//!
//! Rules can be rehearsed on an access log before they are deployed: [`Simulation`]
//! replays the log through them on a simulated clock (`tollgate-rules simulate`).
//!
//! From a file, watched and reloaded on `SIGHUP`:
//!
//! ```no_run
//! # use tollgate::{rules::Rules, store::MemoryStore};
//! # async fn run() -> Result<(), tollgate::ConfigError> {
//! let rules = Rules::builder(MemoryStore::new())
//!     .file("/etc/myapp/rules.toml")
//!     .on_reload(|outcome| match outcome {
//!         Ok(doc) => println!("rules:\n{doc}"),
//!         Err(e) => eprintln!("rules refused: {e}"),
//!     })
//!     .build()?;
//! # let _ = rules; Ok(()) }
//! ```

mod compile;
mod document;
mod format;
mod locate;
mod read;
mod reload;
mod simulate;
mod summary;
mod watch;

#[cfg(feature = "rules-sql")]
pub(crate) use compile::CustomKeys;
pub use compile::{MAX_PLAN_KEYS, RegionsPlan};
pub use document::{
    BanRule, CostSpec, Document, Factor, KeySpec, LeaseSpec, LimitRule, Plans, RegionsRule,
    Settings,
};
pub use format::Format;
pub use reload::{ReloadStatus, Rules, RulesBuilder};
#[cfg(feature = "rules-sql")]
pub(crate) use reload::{Trigger, WeakRules};
/// `tollgate-rules suggest`: limits suggested from an access log ([`suggest::Suggestion`]).
pub use simulate::suggest;
pub use simulate::{
    BadLine, CombinedFields, DEFAULT_MAX_HELD, DEFAULT_MAX_KEYS, DEFAULT_MAX_LINE, Difference,
    JsonFields, LimitReport, LogFormat, MAX_BAN_LEVELS, MAX_MINUTES, Report, SimulateError,
    Simulation, TIMELINE_BUCKETS, Timeline,
};

use crate::base::error::ConfigError;
use crate::middleware::layer::RateLimitLayer;
use crate::store::Store;

impl Document {
    /// Checks the whole document as [`Rules`] would check rules text (every value,
    /// duplicate names, routes, at least one limit): the error names the field
    /// (`limits[2].quota`), without a line (see [`Document::from_toml`] and [`Rules`] for
    /// located errors). A document given to [`Rules`] by code may have no limits.
    pub fn check(&self) -> Result<(), ConfigError> {
        self.layer(crate::store::MemoryStore::new()).map(drop)
    }

    /// The limits' `routes` entries (`"POST /login"`, `"/api/{*rest}"`) that can meet none
    /// of the app's routes listed in `settings.app_routes`, each once, in the document's
    /// order; none without that list. These are what a load logs, and what `tollgate-rules
    /// check` prints as warnings.
    ///
    /// ```
    /// use tollgate::rules::Document;
    ///
    /// let doc = Document::from_toml(r#"
    ///     [settings]
    ///     app_routes = ["/api/items", "/api/items/{id}"]
    ///
    ///     [[limits]]
    ///     name = "api"
    ///     quota = "10/s"
    ///     routes = ["/api/{*rest}", "/v1/{*rest}"]
    /// "#)?;
    /// assert_eq!(doc.unmet_routes()?, ["/v1/{*rest}"]);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn unmet_routes(&self) -> Result<Vec<String>, ConfigError> {
        compile::unmet_routes(self)
    }

    /// The document's `[regions]`, checked (`None` without one): the regions, the local
    /// one, their stores and the movers' settings, and the limits the movers move (see
    /// [`RegionsPlan::open`] for the stores, with feature `redis`).
    ///
    /// ```
    /// use tollgate::rules::Document;
    ///
    /// let doc = Document::from_toml(r#"
    ///     [[limits]]
    ///     name = "api"
    ///     quota = "1000/s"
    ///
    ///     [regions]
    ///     local = "eu"
    ///     link_delay = "80ms"
    ///     [regions.stores]
    ///     eu = "redis://eu.internal:6379"
    ///     us = "redis://us.internal:6379"
    /// "#)?;
    /// let plan = doc.regions()?.unwrap();
    /// assert_eq!(plan.names(), ["eu", "us"]);
    /// assert_eq!(plan.movers().max_move(plan.limits()[0].1), 260);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn regions(&self) -> Result<Option<RegionsPlan>, ConfigError> {
        compile::regions_plan(self)
    }

    /// A [`RateLimitLayer`] with these rules over `store`, for rules read once, without
    /// reloading.
    pub fn layer<St: Store>(&self, store: St) -> Result<RateLimitLayer<St>, ConfigError> {
        self.layer_with(store, &compile::CustomKeys::new(), false)
    }

    /// [`check`](Self::check) of a document built by code, which may have no limits, with
    /// key parts registered by code (`custom:<name>`).
    #[cfg(feature = "rules-sql")]
    pub(crate) fn check_with(&self, keys: &CustomKeys) -> Result<(), ConfigError> {
        self.layer_with(crate::store::MemoryStore::new(), keys, true)
            .map(drop)
    }

    fn layer_with<St: Store>(
        &self,
        store: St,
        keys: &compile::CustomKeys,
        empty_ok: bool,
    ) -> Result<RateLimitLayer<St>, ConfigError> {
        let compiled = compile::compile_maybe_empty(self, keys, empty_ok)?;
        compiled
            .apply(RateLimitLayer::builder(store))
            .build()
            .map_err(|e| compile::rebase(self, e))
    }
}
