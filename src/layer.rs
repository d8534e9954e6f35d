//! [`RateLimitLayer`] and its builder.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::Response;
use http::header::{CACHE_CONTROL, HeaderValue};
use http::request::Parts;
use ipnet::IpNet;
use smallvec::SmallVec;
use tower_layer::Layer;

use crate::algorithm::Algorithm;
use crate::audit::Recorder;
use crate::decision::Decision;
use crate::delay::WaitCounts;
use crate::engine::{Bound, Engine, Group, Next, Observer, Prepared};
use crate::error::ConfigError;
use crate::guard::{ChargeGuard, DelayGuard, PendingCharge};
use crate::headers::{self, Fields, HeaderStyle, RetryAfterFormat};
use crate::key::{ClientIp, KeyExtractor};
use crate::limit::Limit;
use crate::limiter::Limiter;
use crate::lists::{Address, Lists, Predicate};
use crate::observe::{HookSettings, Hooks, Keys};
use crate::policy::Mode;
use crate::quota::Quota;
use crate::response::{DefaultOnRejection, OnRejection, Rejection};
use crate::routes::{RouteTable, parse_route};
use crate::service::RateLimit;
use crate::store::{Statuses, Store};

/// Applies [`RateLimit`] to services: the rate limiting middleware.
///
/// The layer holds everything in one `Arc`: applying it to many routes, and cloning the
/// services it makes (axum clones per route and per connection), shares the same limits
/// and the same store. `Layer::layer` creates no state.
///
/// See the [crate docs](crate) for examples.
pub struct RateLimitLayer<St: Store, R = DefaultOnRejection> {
    pub(crate) shared: Arc<Shared<St, R>>,
}

impl<St: Store, R> Clone for RateLimitLayer<St, R> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<St: Store, R> fmt::Debug for RateLimitLayer<St, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field(
                "limits",
                &self
                    .shared
                    .engine
                    .bounds
                    .iter()
                    .map(|b| &b.limit)
                    .collect::<Vec<_>>(),
            )
            .field("routes", &self.shared.engine.routes.len())
            .field("headers", &self.shared.engine.style)
            .finish_non_exhaustive()
    }
}

/// Everything a layer and its services share: the engine, and the rejection responses.
pub(crate) struct Shared<St: Store, R> {
    pub(crate) engine: Engine<St>,
    pub(crate) on_rejection: R,
}

impl<St: Store, R> Shared<St, R> {
    /// The response to a request refused before the store was asked.
    pub(crate) fn early<B>(&self, rejection: &Rejection<'_>) -> Response<B>
    where
        R: OnRejection<B>,
    {
        self.on_rejection.on_rejection(rejection)
    }

    /// The response to a refused request, with the layer's rate-limit fields (IETF lists
    /// appended to any the response has; single-valued styles only if absent), and
    /// `Retry-After` and `Cache-Control` if absent.
    pub(crate) fn refuse<B>(
        &self,
        decision: &Decision,
        unavailable: bool,
        wait: Option<Duration>,
        fields: Fields,
    ) -> Response<B>
    where
        R: OnRejection<B>,
    {
        let rejection = if unavailable {
            Rejection::Unavailable {
                decision,
                retry_after: wait.unwrap_or(self.engine.unavailable_retry),
            }
        } else {
            Rejection::Limited {
                decision,
                retry_after: wait,
            }
        };
        let mut response = self.on_rejection.on_rejection(&rejection);
        let headers = response.headers_mut();
        fields.apply(headers);
        if let Some(wait) = wait
            && !headers.contains_key(headers::RETRY_AFTER_NAME)
        {
            headers.insert(
                headers::RETRY_AFTER_NAME,
                headers::retry_after(wait, self.engine.retry_format, SystemTime::now),
            );
        }
        if !headers.contains_key(CACHE_CONTROL) {
            headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        }
        response
    }
}

/// A request the limits let through: the fields for its response, the charges to settle
/// when it comes, and in delay mode how long it waits first (and what it holds meanwhile).
pub(crate) struct Passed<St: Store, R> {
    pub(crate) fields: Fields,
    pub(crate) charge: PendingCharge<St, R>,
    pub(crate) delay: Option<(Duration, DelayGuard<St, R>)>,
}

/// What follows the store's answer: the request passes, or the refusal.
pub(crate) fn proceed<St, R, B>(
    shared: &Arc<Shared<St, R>>,
    prepared: Prepared,
    statuses: Statuses,
    parts: &mut Parts,
    keys: &(impl Keys + ?Sized),
) -> Result<Passed<St, R>, Response<B>>
where
    St: Store,
    R: OnRejection<B> + Send + Sync + 'static,
{
    match shared.engine.finish(&prepared, statuses, parts, keys) {
        Next::Proceed {
            fields,
            charged,
            delay,
        } => {
            insert_limiter(shared, parts);
            let delay = delay.map(|d| (d.wait, DelayGuard::new(shared, &prepared.plan, d)));
            let charge = ChargeGuard::new(shared, &prepared.plan, prepared.charge_keys, &charged);
            Ok(Passed {
                fields,
                charge,
                delay,
            })
        }
        Next::Refuse {
            decision,
            unavailable,
            wait,
            fields,
        } => {
            if !unavailable {
                let hooks = &shared.engine.hooks;
                hooks.refused(&prepared.plan, &decision, wait, parts, keys);
            }
            #[cfg(feature = "grpc")]
            if let Some(content_type) = shared.engine.hooks.settings.grpc.answer_type(parts) {
                return Err(crate::grpc::refuse(
                    shared,
                    content_type,
                    &decision,
                    unavailable,
                    wait,
                    fields,
                ));
            }
            Err(shared.refuse(&decision, unavailable, wait, fields))
        }
    }
}

/// Puts the [`Limiter`] in the request's extensions, if the layer does.
pub(crate) fn insert_limiter<St: Store, R: Send + Sync + 'static>(
    shared: &Arc<Shared<St, R>>,
    parts: &mut Parts,
) {
    if shared.engine.limiter_extension {
        parts.extensions.insert(Limiter::new(shared.clone()));
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
        RateLimitBuilder {
            store,
            settings: Settings::default(),
            on_rejection: DefaultOnRejection::new(),
        }
    }
}

impl<St: Store, R: Send + Sync + 'static> RateLimitLayer<St, R> {
    /// The [`Limiter`] handle on this layer's limits and store: what handlers, background
    /// jobs and other stacks use to peek, check, refund, penalize, block and reset the
    /// same buckets. With the default settings it is also in every request's extensions
    /// (see [`RateLimitBuilder::limiter_extension`]).
    pub fn limiter(&self) -> Limiter {
        Limiter::new(self.shared.clone())
    }
}

impl<S, St: Store, R> Layer<S> for RateLimitLayer<St, R> {
    type Service = RateLimit<S, St, R>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// Builds a [`RateLimitLayer`]: limits for every request, limits per route, headers and
/// responses. [`build`](RateLimitBuilder::build) checks the whole configuration.
///
/// ```
/// use tollgate::{key::{Header, PeerIp}, store::MemoryStore, HeaderStyle, Limit, Quota, RateLimitLayer};
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
pub struct RateLimitBuilder<St: Store, R = DefaultOnRejection> {
    store: St,
    pub(crate) settings: Settings,
    on_rejection: R,
}

/// The default [`RateLimitBuilder::max_limits`]: far more than real configurations have,
/// few enough that building stays quick and small.
pub const DEFAULT_MAX_LIMITS: usize = 1_000;

/// Everything a builder collects besides the store and the rejection responses.
pub(crate) struct Settings {
    pub(crate) always: Vec<Limit>,
    pub(crate) routes: Vec<(String, Limit)>,
    pub(crate) route_default: Vec<Limit>,
    pub(crate) style: HeaderStyle,
    pub(crate) shadow_headers: bool,
    pub(crate) retry_format: RetryAfterFormat,
    pub(crate) jitter: f64,
    pub(crate) unavailable_retry: Duration,
    pub(crate) decision_extension: bool,
    pub(crate) limiter_extension: bool,
    pub(crate) observer: Option<Observer>,
    pub(crate) allow: Vec<String>,
    pub(crate) deny: Vec<String>,
    pub(crate) allow_if: Option<Predicate>,
    pub(crate) address: Address,
    /// Refusal events, offenders, metrics and gRPC settings.
    pub(crate) hooks: HookSettings,
    /// Delay mode's waiter counts, when they outlive this layer (reloaded rules).
    pub(crate) wait_counts: Option<WaitCounts>,
    /// Whether a layer without limits is valid (rules built by code with no limit, e.g.
    /// a `RateLimitRule` table with no active row): it limits nothing.
    pub(crate) no_limits_ok: bool,
    /// The most limits (route entries counted one by one) a layer takes.
    pub(crate) max_limits: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            always: Vec::new(),
            routes: Vec::new(),
            route_default: Vec::new(),
            style: HeaderStyle::Ietf,
            shadow_headers: false,
            retry_format: RetryAfterFormat::Seconds,
            jitter: 0.0,
            unavailable_retry: Duration::from_secs(1),
            decision_extension: true,
            limiter_extension: true,
            observer: None,
            allow: Vec::new(),
            deny: Vec::new(),
            allow_if: None,
            address: Address::Peer,
            hooks: HookSettings::default(),
            wait_counts: None,
            no_limits_ok: false,
            max_limits: DEFAULT_MAX_LIMITS,
        }
    }
}

impl<St: Store, R> fmt::Debug for RateLimitBuilder<St, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitBuilder")
            .field("limits", &self.settings.always)
            .field("routes", &self.settings.routes)
            .field("route_default", &self.settings.route_default)
            .field("headers", &self.settings.style)
            .finish_non_exhaustive()
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
    /// `route` is a route template in axum's syntax (`/login`, `/users/{id}`,
    /// `/files/{*rest}`), optionally preceded by a method: `"POST /login"`. Which entry a
    /// request gets depends on where the layer sits:
    ///
    /// - after axum's router has matched (`Router::route_layer`, or a layer on a route), the
    ///   request carries axum's `MatchedPath`: the entry whose template is exactly that
    ///   path applies (in a nested router, the full template, e.g. `/api/users/{id}`);
    /// - before routing (`Router::layer`, which also sees requests that match no route) and
    ///   on plain hyper or tower, there is no `MatchedPath`: the request path is matched
    ///   against the templates as axum matches it, so `/users/7` gets the `/users/{id}`
    ///   entry (a static template such as `/users/me` wins over a parameter).
    ///
    /// A method-specific entry wins over a method-less one for the same template; `HEAD`
    /// requests use the `GET` entry when there is no `HEAD` entry. Call it several times to
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

    /// A limit checked on the requests that match no [`route`](Self::route) entry.
    pub fn route_default(mut self, limit: Limit) -> Self {
        self.settings.route_default.push(limit);
        self
    }

    /// Which rate-limit fields responses carry (default [`HeaderStyle::Ietf`]).
    pub fn headers(mut self, style: HeaderStyle) -> Self {
        self.settings.style = style;
        self
    }

    /// Whether shadow limits appear in the rate-limit fields (default: no, since they do
    /// not limit the client).
    pub fn shadow_headers(mut self, show: bool) -> Self {
        self.settings.shadow_headers = show;
        self
    }

    /// How `Retry-After` is written (default: whole seconds).
    pub fn retry_after_format(mut self, format: RetryAfterFormat) -> Self {
        self.settings.retry_format = format;
        self
    }

    /// Spreads the retries of clients refused at the same moment: `Retry-After` grows by up
    /// to `fraction` of the wait (0.5: up to 50 % longer), by an amount fixed per client
    /// key, so a client always gets the same offset. Never shorter than the real wait.
    /// Must be within `0.0..=1.0`.
    pub fn retry_after_jitter(mut self, fraction: f64) -> Self {
        self.settings.jitter = fraction;
        self
    }

    /// The `Retry-After` of a 503 when a store fails under
    /// [`FailurePolicy::Deny`](crate::FailurePolicy) (default 1 s).
    pub fn unavailable_retry_after(mut self, wait: Duration) -> Self {
        self.settings.unavailable_retry = wait;
        self
    }

    /// Whether the [`Decision`](crate::Decision) is put in the request extensions for the
    /// handler (default: yes).
    pub fn decision_extension(mut self, insert: bool) -> Self {
        self.settings.decision_extension = insert;
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
        self.settings.observer = Some(Arc::new(observer));
        self
    }

    /// Replaces the responses to refused requests (see [`crate::response`]).
    pub fn on_rejection<R2>(self, on_rejection: R2) -> RateLimitBuilder<St, R2> {
        RateLimitBuilder {
            store: self.store,
            settings: self.settings,
            on_rejection,
        }
    }

    /// Whether the [`Limiter`] handle is put in the request extensions for the handler
    /// (default: yes), where axum's `Extension<Limiter>` finds it.
    pub fn limiter_extension(mut self, insert: bool) -> Self {
        self.settings.limiter_extension = insert;
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
    /// checked (see [`Rejection::Blocked`]). Same address rules as
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

    /// The most limits the layer takes (default [`DEFAULT_MAX_LIMITS`]); more is a
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

    /// A layer without limits is valid: it limits nothing (the allow and deny lists still
    /// apply). For rules built by code that have no limit.
    #[cfg(feature = "rules")]
    pub(crate) fn allow_no_limits(mut self) -> Self {
        self.settings.no_limits_ok = true;
        self
    }

    /// Checks the configuration and builds the layer, or names the first bad field.
    pub fn build(self) -> Result<RateLimitLayer<St, R>, ConfigError> {
        Ok(RateLimitLayer {
            shared: Arc::new(Shared {
                engine: compile(self.store, self.settings)?,
                on_rejection: self.on_rejection,
            }),
        })
    }
}

/// Checks a configuration and compiles it into an engine.
pub(crate) fn compile<St: Store>(store: St, mut s: Settings) -> Result<Engine<St>, ConfigError> {
    if !s.no_limits_ok && s.always.is_empty() && s.routes.is_empty() && s.route_default.is_empty() {
        return Err(ConfigError::new("limits", "no limit is configured"));
    }
    if !(0.0..=1.0).contains(&s.jitter) {
        return Err(ConfigError::new(
            "retry_after_jitter",
            "must be a fraction within 0.0..=1.0",
        ));
    }
    let count = s.always.len() + s.routes.len() + s.route_default.len();
    if count > s.max_limits {
        return Err(ConfigError::new(
            "limits",
            format!(
                "{count} limits, more than the {} a layer takes (`max_limits`)",
                s.max_limits
            ),
        ));
    }
    let mut bounds: Vec<Bound<St>> = Vec::with_capacity(count);
    let waits = s.wait_counts.clone().unwrap_or_default();
    // The algorithm of each name bound so far: a table (one name) serves one algorithm,
    // whose state means nothing to another.
    let mut algorithms: HashMap<Arc<str>, Algorithm> = HashMap::with_capacity(count);
    let mut bind = |limit: Limit| -> Result<usize, ConfigError> {
        limit.validate()?;
        match algorithms.get(&limit.name) {
            Some(other) if *other != limit.algorithm => {
                return Err(ConfigError::new(
                    "algorithm",
                    format!(
                        "{:?} here, {:?} in another limit of the same name: limits that share buckets must count alike",
                        limit.algorithm, other
                    ),
                )
                .within(format!("limits[{:?}]", &*limit.name)));
            }
            Some(_) => {}
            None => {
                algorithms.insert(limit.name.clone(), limit.algorithm);
            }
        }
        bounds.push(Bound::new(limit, &store, &waits)?);
        Ok(bounds.len() - 1)
    };
    let always = s
        .always
        .into_iter()
        .map(&mut bind)
        .collect::<Result<SmallVec<[usize; 4]>, _>>()?;
    let mut group_limits = vec![always.clone()];
    for limit in s.route_default {
        group_limits[0].push(bind(limit)?);
    }
    let mut routes = RouteTable::default();
    for (spec, limit) in s.routes {
        let (method, path) = parse_route(&spec)?;
        let entries = routes
            .entries_mut(path)
            .map_err(|e| ConfigError::new(format!("routes[{spec:?}]"), format!("`{path}`: {e}")))?;
        let group = match entries.iter().find(|(m, _)| *m == method) {
            Some(&(_, g)) => g,
            None => {
                group_limits.push(always.clone());
                entries.push((method, group_limits.len() - 1));
                group_limits.len() - 1
            }
        };
        let index = bind(limit).map_err(|e| e.within(format!("routes[{spec:?}]")))?;
        group_limits[group].push(index);
    }
    let shadow_headers = s.shadow_headers;
    let groups = group_limits
        .into_iter()
        .map(|limits| {
            check_unique(&bounds, &limits)?;
            let reported: Vec<&Limit> = limits
                .iter()
                .map(|&i| &bounds[i].limit)
                .filter(|l| l.mode == Mode::Enforce || shadow_headers)
                .collect();
            // Beyond `MAX_MEMBERS` limits, responses describe the most restrictive ones,
            // which vary: their policy is rendered per response.
            let policy = (reported.len() <= headers::MAX_MEMBERS)
                .then(|| {
                    headers::static_policy(reported.iter().map(|l| {
                        (
                            &*l.name,
                            l.quota.burst_size(),
                            l.algorithm.window_secs(&l.quota),
                        )
                    }))
                })
                .flatten();
            let limit = |&i: &usize| &bounds[i].limit;
            Ok(Group {
                reported: reported.len(),
                policy,
                dynamic_quota: limits.iter().map(limit).any(|l| l.quota_fn.is_some()),
                shadow: limits.iter().map(limit).any(|l| l.mode == Mode::Shadow),
                charged: limits.iter().map(limit).any(|l| l.charge.is_conditional()),
                delayed: limits.iter().any(|&i| bounds[i].waiters.is_some()),
                limits,
            })
        })
        .collect::<Result<Vec<_>, ConfigError>>()?;
    let parse_nets = |field: &str, nets: Vec<String>| {
        nets.iter()
            .enumerate()
            .map(|(i, n)| {
                parse_net(n).map_err(|reason| ConfigError::new(format!("{field}[{i}]"), reason))
            })
            .collect::<Result<Vec<IpNet>, ConfigError>>()
    };
    let allow = parse_nets("allow", s.allow)?;
    let deny = parse_nets("deny", s.deny)?;
    let audit = s.hooks.audit.take().map(|log| {
        let rule_ids = bounds
            .iter()
            .map(|b| (b.limit.rule_id, b.limit.rule_id_by.clone()));
        Recorder::new(log, s.address.clone(), s.hooks.redact_keys, rule_ids)
    });
    let lists = (!allow.is_empty() || !deny.is_empty() || s.allow_if.is_some())
        .then(|| Lists::new(allow, deny, s.allow_if, s.address));
    let mut by_name = HashMap::new();
    for (i, b) in bounds.iter().enumerate() {
        by_name.entry(b.name).or_insert(i);
    }
    #[cfg(feature = "metrics")]
    if !(0.0..=1.0).contains(&s.hooks.near_limit) {
        return Err(ConfigError::new(
            "near_limit_fraction",
            "must be a fraction within 0.0..=1.0",
        ));
    }
    let names: Vec<&'static str> = bounds.iter().map(|b| b.name).collect();
    let hooks = Hooks::new(s.hooks, &names, audit);
    Ok(Engine {
        store,
        bounds,
        by_name,
        groups,
        routes,
        lists,
        style: s.style,
        shadow_headers,
        retry_format: s.retry_format,
        jitter: s.jitter,
        unavailable_retry: s.unavailable_retry,
        decision_extension: s.decision_extension,
        limiter_extension: s.limiter_extension,
        observer: s.observer,
        hooks,
    })
}

/// A CIDR (`10.0.0.0/8`) or a single address.
fn parse_net(text: &str) -> Result<IpNet, String> {
    let t = text.trim();
    t.parse::<IpNet>()
        .or_else(|_| t.parse::<std::net::IpAddr>().map(IpNet::from))
        .map_err(|_| format!("`{text}` is neither a CIDR (`10.0.0.0/8`) nor an address"))
}

/// Two limits of one request must not share a name: their headers and buckets would mix.
fn check_unique<St: Store>(bounds: &[Bound<St>], limits: &[usize]) -> Result<(), ConfigError> {
    let mut seen = std::collections::HashSet::with_capacity(limits.len());
    for &i in limits {
        let name = &bounds[i].limit.name;
        if !seen.insert(&**name) {
            return Err(ConfigError::new(
                format!("limits[{name:?}].name"),
                "is used by two limits of the same request",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;

    #[test]
    fn configuration_errors_name_the_field() {
        let q = Quota::per_second(1);
        let b = || RateLimitLayer::builder(MemoryStore::new());
        assert_eq!(b().build().unwrap_err().field(), "limits");
        let err = b()
            .limit(Limit::new("a", q))
            .limit(Limit::new("a", q))
            .build()
            .unwrap_err();
        assert_eq!(err.field(), r#"limits["a"].name"#);
        let err = b()
            .limit(Limit::new("a", q))
            .route("GET /x", Limit::new("a", q))
            .build()
            .unwrap_err();
        assert_eq!(err.field(), r#"limits["a"].name"#);
        // The same name on two different routes is fine: they share buckets.
        assert!(
            b().route("/x", Limit::new("a", q))
                .route("/y", Limit::new("a", q))
                .build()
                .is_ok()
        );
        let err = b().route("login", Limit::new("a", q)).build().unwrap_err();
        assert_eq!(err.field(), r#"routes["login"]"#);
        let err = b()
            .route("P@ST /x", Limit::new("a", q))
            .build()
            .unwrap_err();
        assert_eq!(err.field(), r#"routes["P@ST /x"]"#);
        for bad in ["GET /x extra", "/x y", "GET /x\textra", "POST  /a /b"] {
            let err = b().route(bad, Limit::new("a", q)).build().unwrap_err();
            assert_eq!(err.field(), format!("routes[{bad:?}]"), "{err}");
            assert!(err.reason().contains("whitespace"), "{bad:?}: {err}");
        }
        // Spaces around the parts are fine.
        assert!(b().route("  GET   /x ", Limit::new("a", q)).build().is_ok());
        // Templates matchit (axum's router) refuses, with its reason.
        for (bad, reason) in [
            ("/users/{id", "valid name"),
            ("GET /files/{*rest}/x", "Catch-all"),
            ("/a/{x}{y}", "one parameter"),
        ] {
            let err = b().route(bad, Limit::new("a", q)).build().unwrap_err();
            assert_eq!(err.field(), format!("routes[{bad:?}]"), "{err}");
            assert!(err.reason().contains(reason), "{bad:?}: {err}");
        }
        let err = b()
            .route("/users/{id}", Limit::new("a", q))
            .route("POST /users/{name}", Limit::new("b", q))
            .build()
            .unwrap_err();
        assert_eq!(err.field(), r#"routes["POST /users/{name}"]"#);
        assert!(err.reason().contains("conflict"), "{err}");
        assert!(err.reason().contains("/users/{id}"), "{err}");
        // One template with several methods is one route.
        assert!(
            b().route("GET /users/{id}", Limit::new("a", q))
                .route("POST /users/{id}", Limit::new("b", q))
                .route("/users/{id}", Limit::new("c", q))
                .route("/users/me", Limit::new("d", q))
                .build()
                .is_ok()
        );
        let err = b().limit(Limit::new("café", q)).build().unwrap_err();
        assert_eq!(err.field(), r#"limits["café"].name"#);
        let err = b()
            .route("/x", Limit::new("a", q).cost(2))
            .build()
            .unwrap_err();
        assert_eq!(err.field(), r#"routes["/x"].limits["a"].cost"#);
        for bad in [-0.1, 1.5, f64::NAN, f64::INFINITY] {
            let err = b()
                .limit(Limit::new("a", q))
                .retry_after_jitter(bad)
                .build()
                .unwrap_err();
            assert_eq!(err.field(), "retry_after_jitter");
        }
    }
}
