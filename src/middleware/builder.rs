//! [`RateLimitBuilder`]: every setting of a layer, in one place; [`build`](RateLimitBuilder::build)
//! checks them and compiles the engine (`build.rs`).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::algo::quota::Quota;
use crate::audit::AuditLog;
use crate::base::error::ConfigError;
#[cfg(feature = "rules")]
use crate::engine::delay::WaitCounts;
#[cfg(feature = "grpc")]
use crate::middleware::grpc::Grpc;
use crate::middleware::layer::RateLimitLayer;
use crate::middleware::shared::Shared;
use crate::observe::offenders::OffenderTracking;
use crate::store::Store;
use crate::web::compile::{Settings, compile};
use crate::web::headers::{HeaderStyle, RetryAfterFormat};
use crate::web::hooks::RefusalLog;
use crate::web::key::{ClientIp, KeyExtractor};
use crate::web::limit::Limit;
use crate::web::lists::Address;
use crate::web::response::DefaultOnRejection;

/// Builds a [`RateLimitLayer`]: limits for every request, limits per route, headers and
/// responses. [`build`](RateLimitBuilder::build) checks the whole configuration.
///
/// ```
/// use tollgate::{key::{Header, PeerIp}, headers::HeaderStyle, store::MemoryStore, Limit, Quota, RateLimitLayer};
///
/// let layer = RateLimitLayer::builder(MemoryStore::new())
///     // Every request:
///     .limit(Limit::new("per-ip", Quota::per_second(5).burst(10)).key(PeerIp::new()))
///     .limit(Limit::new("global", Quota::per_second(1_000)))
///     // Only these routes (matched path, with or without a method):
///     .route("POST /login", Limit::new("login", Quota::per_minute(5)).key(PeerIp::new()))
///     .route("/search", Limit::new("search", Quota::per_second(2)).key(Header::new("x-api-key")))
///     // Routes without an entry:
///     .route_default(Limit::new("other", Quota::per_second(20)).key(PeerIp::new()))
///     .headers(HeaderStyle::Ietf)
///     .build()?;
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
pub struct RateLimitBuilder<St, R = DefaultOnRejection> {
    store: St,
    pub(crate) settings: Settings,
    on_rejection: R,
    /// How refused gRPC calls are answered.
    #[cfg(feature = "grpc")]
    grpc: Option<Grpc>,
}

impl<St: Store, R> fmt::Debug for RateLimitBuilder<St, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitBuilder")
            .field("limits", &self.settings.always)
            .field("routes", &self.settings.routes)
            .field("route_default", &self.settings.route_default)
            .field("headers", &self.settings.options.style)
            .finish_non_exhaustive()
    }
}

impl<St: Store> RateLimitLayer<St> {
    /// One limit: `quota` per key from `key`, in `store`. The limit is called `"default"`
    /// in the headers.
    ///
    /// ```
    /// use tollgate::{key::PeerIp, store::MemoryStore, Quota, RateLimitLayer};
    ///
    /// let layer = RateLimitLayer::new(Quota::per_second(10).burst(20), PeerIp::new(), MemoryStore::new());
    /// # let _ = layer;
    /// ```
    pub fn new(quota: Quota, key: impl KeyExtractor, store: St) -> Self {
        Self::builder(store)
            .limit(Limit::new("default", quota).key(key))
            .build()
            .expect("a single default limit with a valid quota is always valid")
    }

    /// A layer with several limits, per-route limits, and other settings.
    pub fn builder(store: St) -> RateLimitBuilder<St> {
        RateLimitBuilder::new(store)
    }
}

impl<St: Store> RateLimitBuilder<St> {
    /// A builder with no limits and the default settings ([`RateLimitLayer::builder`]).
    pub(crate) fn new(store: St) -> Self {
        Self {
            store,
            settings: Settings::default(),
            on_rejection: DefaultOnRejection::new(),
            #[cfg(feature = "grpc")]
            grpc: None,
        }
    }
}

impl<St: Store, R> RateLimitBuilder<St, R> {
    /// A limit checked on every request.
    pub fn limit(mut self, limit: Limit) -> Self {
        self.settings.always.push(limit);
        self
    }

    /// A limit checked on the requests of one route, in addition to those of
    /// [`limit`](Self::limit).
    ///
    /// `route` is a pattern in axum's syntax (`/login`, `/users/{id}`, `/files/{*rest}`),
    /// optionally preceded by a method: `"POST /login"`. It is matched against the path
    /// the client sent, as axum's router matches its routes, wherever the layer sits
    /// (`Router::route_layer`, `Router::layer`, plain hyper or tower) and in `tollgate-rules
    /// simulate`: `/users/7` gets the `/users/{id}` entry, a static pattern such as
    /// `/users/me` wins over a parameter, and `/api/{*rest}` covers everything under
    /// `/api/`. The patterns need not be the app's own routes. In a router nested with
    /// `Router::nest`, the path is the full one the client sent (axum's `OriginalUri`), not
    /// the part the nested router sees. Give the app's routes to
    /// [`app_routes`](Self::app_routes) to have an entry that can never meet them logged.
    ///
    /// A method-specific entry wins over a method-less one for the same template; `HEAD`
    /// requests use the `GET` entry when there is no `HEAD` entry. The path chooses the
    /// template first, as in axum's router: with entries `GET /users/me` and
    /// `/users/{id}`, a `POST /users/me` meets neither (axum, too, would answer it 405
    /// rather than try `/users/{id}`). Call it several times to
    /// put several limits on a route. A template axum's router would refuse (bad syntax,
    /// or two templates that conflict, such as `/users/{id}` and `/users/{name}`) is a
    /// [`ConfigError`] naming the route, and so is an entry no request could match:
    ///
    /// - a method other than the standard `GET`, `HEAD`, `POST`, `PUT`, `DELETE`,
    ///   `CONNECT`, `OPTIONS`, `TRACE` and `PATCH` (those axum's method routing knows).
    ///   Methods are case-sensitive: `"post /login"` is refused with a hint to write
    ///   `POST`. An extension method (`PURGE`) is refused too, so that a misspelt method
    ///   (`PSOT`) cannot pass for one: an entry without a method covers every method;
    /// - a path that does not start with `/`, or holds whitespace, a query (`?`) or a
    ///   fragment (`#`): routes match the request path alone;
    /// - a segment in axum 0.7's syntax, `/users/:id` or `/files/*rest`, which axum 0.8
    ///   takes literally: write `/users/{id}` and `/files/{*rest}`.
    pub fn route(mut self, route: impl Into<String>, limit: Limit) -> Self {
        self.settings.routes.push((route.into(), limit));
        self
    }

    /// The app's own route templates (as given to axum's `Router::route`, each optionally
    /// with a method: `"POST /login"`), so that the layer can tell a route entry that can
    /// never meet them: each such entry is logged once, when the layer is built, as a
    /// warning (target `tollgate::routes`). Nothing else changes: entries match request
    /// paths whether or not the app's routes are known. A route here that no request could
    /// match is a [`ConfigError`] naming it (`app_routes["..."]`), and so are more than
    /// 10,000 routes (each build compares every route entry with every app route).
    ///
    /// ```
    /// use tollgate::{Limit, Quota, RateLimitLayer, store::MemoryStore};
    ///
    /// // Logs that `/v1/{*rest}` meets none of the app's routes (they are under `/api`).
    /// let layer = RateLimitLayer::builder(MemoryStore::new())
    ///     .route("/v1/{*rest}", Limit::new("v1", Quota::per_second(10)))
    ///     .route("/api/{*rest}", Limit::new("api", Quota::per_second(10)))
    ///     .app_routes(["/api/items", "/api/items/{id}", "GET /health"])
    ///     .build()?;
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn app_routes<I>(mut self, routes: I) -> Self
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        self.settings.app_routes = Some(routes.into_iter().map(Into::into).collect());
        self
    }

    /// A limit checked on the requests that match no [`route`](Self::route) entry.
    pub fn route_default(mut self, limit: Limit) -> Self {
        self.settings.route_default.push(limit);
        self
    }

    /// Which rate-limit fields responses carry (default [`HeaderStyle::Ietf`]).
    pub fn headers(mut self, style: HeaderStyle) -> Self {
        self.settings.options.style = style;
        self
    }

    /// Whether shadow limits appear in the rate-limit fields (default: no, since they do
    /// not limit the client).
    pub fn shadow_headers(mut self, show: bool) -> Self {
        self.settings.options.shadow_headers = show;
        self
    }

    /// How `Retry-After` is written (default: whole seconds).
    pub fn retry_after_format(mut self, format: RetryAfterFormat) -> Self {
        self.settings.options.retry_format = format;
        self
    }

    /// Spreads the retries of clients refused at the same moment: `Retry-After` grows by up
    /// to `fraction` of the wait (0.5: up to 50 % longer), by an amount fixed per client
    /// key, so a client always gets the same offset. Never shorter than the real wait.
    /// Must be within `0.0..=1.0`.
    pub fn retry_after_jitter(mut self, fraction: f64) -> Self {
        self.settings.options.jitter = fraction;
        self
    }

    /// The `Retry-After` of a 503 when a store fails under
    /// [`FailurePolicy::Deny`](crate::FailurePolicy) (default 1 s).
    pub fn unavailable_retry_after(mut self, wait: Duration) -> Self {
        self.settings.options.unavailable_retry = wait;
        self
    }

    /// Whether the [`Decision`](crate::Decision) is put in the request extensions for the
    /// handler (default: yes), where a handler extracts it as `decision: Decision` (feature
    /// `axum`) or `Extension<Decision>`.
    ///
    /// Each value in a request's extensions costs that request one allocation
    /// (`http::Extensions` boxes what it holds). An application whose handlers do not read
    /// the decision can turn it off (in this crate's middleware benchmark,
    /// `scripts/middleware_count.sh`, turning off both this and the `Limiter` extension
    /// saved an allowed request about 6% of its instructions). [`on_decision`](Self::on_decision) sees every decision either way. A
    /// handler that extracts `Decision` from a layer built with `false` gets a 500 that
    /// names this option (`MissingExtension`, with the `axum` feature).
    pub fn decision_extension(mut self, insert: bool) -> Self {
        self.settings.options.decision_extension = insert;
        self
    }

    /// Calls `observer` with the decision of every request the limits were checked for,
    /// allowed or refused: the place for metrics (allowed, denied, shadow "would deny", per
    /// limit) and for logging refusals. It runs on the request path: keep it quick.
    ///
    /// ```
    /// use std::sync::atomic::{AtomicU64, Ordering};
    /// use std::sync::Arc;
    /// use tollgate::{store::MemoryStore, Limit, Quota, RateLimitLayer};
    ///
    /// let denied = Arc::new(AtomicU64::new(0));
    /// let counter = denied.clone();
    /// let layer = RateLimitLayer::builder(MemoryStore::new())
    ///     .limit(Limit::new("global", Quota::per_second(100)))
    ///     .on_decision(move |decision, _parts| {
    ///         if !decision.allowed() {
    ///             counter.fetch_add(1, Ordering::Relaxed);
    ///         }
    ///     })
    ///     .build()?;
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn on_decision<F>(mut self, observer: F) -> Self
    where
        F: Fn(&crate::Decision, &http::request::Parts) + Send + Sync + 'static,
    {
        self.settings.options.observer = Some(Arc::new(observer));
        self
    }

    /// Replaces the responses to refused requests (see [`crate::web::response`]).
    pub fn on_rejection<R2>(self, on_rejection: R2) -> RateLimitBuilder<St, R2> {
        RateLimitBuilder {
            store: self.store,
            settings: self.settings,
            on_rejection,
            #[cfg(feature = "grpc")]
            grpc: self.grpc,
        }
    }

    /// Whether the [`Limiter`](crate::Limiter) handle is put in the request extensions for
    /// the handler (default: no), where a handler extracts it as `limiter: Limiter`
    /// (feature `axum`) or `Extension<Limiter>`.
    ///
    /// It costs each request one allocation (see
    /// [`decision_extension`](Self::decision_extension)), so it is off unless asked for:
    /// handlers have the same handle for nothing per request from the router's state, as
    /// below. A handler that extracts `Limiter` from a layer built without it gets a 500
    /// that names this option (`MissingExtension`, with the `axum` feature). With rules
    /// that reload, the handle in the extensions is the one of the rules the request runs
    /// on (`Rules::builder(..).configure(|b| b.limiter_extension(true))`), the state's
    /// follows the current rules.
    ///
    /// ```
    /// use axum::{Router, extract::State, routing::get};
    /// use tollgate::{Limit, Limiter, Quota, RateLimitLayer, store::MemoryStore};
    ///
    /// let layer = RateLimitLayer::builder(MemoryStore::new())
    ///     .limit(Limit::new("global", Quota::per_second(100)))
    ///     .build()?;
    /// let app: Router = Router::new()
    ///     .route(
    ///         "/limits",
    ///         get(|State(limiter): State<Limiter>| async move { limiter.limits().join(",") }),
    ///     )
    ///     .with_state(layer.limiter())
    ///     .route_layer(layer);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn limiter_extension(mut self, insert: bool) -> Self {
        self.settings.options.limiter_extension = insert;
        self
    }

    /// Clients in these networks (CIDRs such as `"10.0.0.0/8"` or single addresses) skip
    /// every limit: no store call, no rate-limit fields. The address is the peer's unless
    /// [`client_ip`](Self::client_ip) names trusted proxies (never a header a client can
    /// forge). The allow list wins over the deny list. Bad entries are a [`ConfigError`] at
    /// [`build`](Self::build) naming `allow[i]`.
    pub fn allow_cidrs<I, S>(mut self, nets: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.settings.allow.extend(nets.into_iter().map(Into::into));
        self
    }

    /// Clients in these networks are refused with `403 Forbidden` before any limit is
    /// checked (see [`Rejection::Blocked`](crate::response::Rejection::Blocked)). Same address rules as
    /// [`allow_cidrs`](Self::allow_cidrs); bad entries name `deny[i]`.
    pub fn deny_cidrs<I, S>(mut self, nets: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.settings.deny.extend(nets.into_iter().map(Into::into));
        self
    }

    /// Requests for which `allow` is true skip every limit (e.g. health checks from an
    /// internal network marked by an authenticated extension). It runs on every request:
    /// keep it quick, and base it on nothing a client can forge.
    pub fn allow_if<F>(mut self, allow: F) -> Self
    where
        F: Fn(&http::request::Parts) -> bool + Send + Sync + 'static,
    {
        self.settings.allow_if = Some(Arc::new(allow));
        self
    }

    /// Where the allow and deny lists (and the [audit log](Self::audit)) read the client's
    /// address: the client behind these trusted proxies, instead of the connection's peer.
    pub fn client_ip(mut self, client: ClientIp) -> Self {
        self.settings.address = Address::Client(client);
        self
    }

    /// The most limits the layer takes (default [`DEFAULT_MAX_LIMITS`](crate::DEFAULT_MAX_LIMITS)); more is a
    /// [`ConfigError`] naming `limits` at [`build`](Self::build). Each entry counts: a
    /// limit on three routes counts three.
    ///
    /// Real configurations have a few to a few hundred limits. The cap is there for
    /// configuration that comes from elsewhere (a rules file, a database table): each
    /// limit costs memory in the store (about 9 KB for a table of the memory store) and
    /// time at every build, so a runaway file or table must not take the process down.
    pub fn max_limits(mut self, n: usize) -> Self {
        self.settings.max_limits = n;
        self
    }

    /// Delay mode's waiter counts from outside the layer, so that successive versions of
    /// reloaded rules count the same waiting requests.
    #[cfg(feature = "rules")]
    pub(crate) fn wait_counts(mut self, counts: WaitCounts) -> Self {
        self.settings.wait_counts = Some(counts);
        self
    }

    /// Tells `tap` of every refusal with its limit and key (the rules' `simulate`).
    #[cfg(feature = "rules")]
    pub(crate) fn tap(mut self, tap: crate::web::hooks::Tap) -> Self {
        self.settings.hooks.tap = Some(tap);
        self
    }

    /// Refusals without `Retry-After` or `Cache-Control`: only the rejection handler's
    /// response (the rules' `simulate`, which reads nothing but the status).
    #[cfg(feature = "rules")]
    pub(crate) fn bare_refusals(mut self) -> Self {
        self.settings.options.bare_refusals = true;
        self
    }

    /// A layer without limits is valid: it limits nothing (the allow and deny lists still
    /// apply). For rules built by code that have no limit.
    #[cfg(feature = "rules")]
    pub(crate) fn allow_no_limits(mut self) -> Self {
        self.settings.no_limits_ok = true;
        self
    }

    /// Checks the configuration and builds the layer, or names the first bad field.
    pub fn build(self) -> Result<RateLimitLayer<St, R>, ConfigError> {
        self.build_shared().map(RateLimitLayer::fixed)
    }

    /// What the layer's services share: for a layer, or one version of reloaded rules.
    pub(crate) fn build_shared(self) -> Result<Shared<St, R>, ConfigError> {
        let (engine, policy) = compile(self.store, self.settings)?;
        Ok(Shared {
            engine: Arc::new(engine),
            policy,
            on_rejection: self.on_rejection,
            #[cfg(feature = "grpc")]
            grpc: self.grpc,
        })
    }

    /// How refused requests are logged (default [`RefusalLog::new`]: `INFO`, target
    /// `tollgate::refused`, at most one line per limit every 100 ms with the count of the
    /// others).
    pub fn refusal_log(mut self, log: RefusalLog) -> Self {
        self.settings.hooks.refusal_log = log;
        self
    }

    /// Whether keys appear in refusal events and offender summaries as a hash (`#` and 16
    /// hex digits, the same in every process) instead of their text: `true` hashes every
    /// key, `false` none. By default addresses are shown (`@203.0.113.7`) and every other
    /// key is hashed, since a header or query key is often a credential (an API key) that
    /// must not reach logs. Keys are never metric labels either way.
    pub fn redact_keys(mut self, redact: bool) -> Self {
        self.settings.hooks.redact_keys = Some(redact);
        self
    }

    /// Keeps a bounded summary of the most refused keys of each limit (Space-Saving, fixed
    /// memory, sharded; sampled 1 in 16 with weight 16 while a thread refuses more than
    /// 25,600 requests a second, exact below; see [`OffenderTracking`]), read with
    /// [`Limiter::top_refused`](crate::Limiter::top_refused) and logged periodically
    /// (`INFO`, target `tollgate::offenders`). Off by default; costs nothing on allowed
    /// requests.
    ///
    /// ```
    /// use tollgate::{key::PeerIp, store::MemoryStore, Limit, OffenderTracking, Quota, RateLimitLayer};
    ///
    /// let layer = RateLimitLayer::builder(MemoryStore::new())
    ///     .limit(Limit::new("per-ip", Quota::per_second(5)).key(PeerIp::new()))
    ///     .track_offenders(OffenderTracking::new())
    ///     .build()?;
    /// let top = layer.limiter().top_refused("per-ip", 10)?;
    /// assert!(top.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn track_offenders(mut self, tracking: OffenderTracking) -> Self {
        self.settings.hooks.offenders = Some(tracking);
        self
    }

    /// The fraction of a limit's burst below which an allowed request counts in
    /// `tollgate_near_limit_total` (feature `metrics`; default 0.2). Must be within
    /// `0.0..=1.0`.
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn near_limit_fraction(mut self, fraction: f64) -> Self {
        self.settings.hooks.near_limit = fraction;
        self
    }

    /// Records every refusal in `log`, off the request path: the limit, the key (hashed as
    /// in refusal events, see [`redact_keys`](Self::redact_keys)), the client's address
    /// (behind trusted proxies with [`client_ip`](Self::client_ip)), the route, the tokens
    /// left, the limit's [`rule_id`](crate::Limit::rule_id) and the time; shadow limits'
    /// "would refuse" too, flagged. Refusals before any limit is checked (deny lists,
    /// missing keys under `Reject`, misconfigurations) and store failures under `Deny` are
    /// not violations and are not recorded, nor are the [`Limiter`](crate::Limiter)
    /// handle's refusals (its caller has the answer). See [`crate::audit`].
    pub fn audit(mut self, log: AuditLog) -> Self {
        self.settings.hooks.audit = Some(log);
        self
    }

    /// Answers refused gRPC calls the gRPC way (feature `grpc`; see [`crate::grpc`]):
    /// requests whose `content-type` is `application/grpc…` (or every request, with
    /// [`Grpc::always`]) get a Trailers-Only response with `grpc-status`. Without it, a
    /// layer answers every request as HTTP, whoever else enabled the feature.
    #[cfg(feature = "grpc")]
    #[cfg_attr(docsrs, doc(cfg(feature = "grpc")))]
    pub fn grpc(mut self, grpc: Grpc) -> Self {
        self.grpc = Some(grpc);
        self
    }
}
