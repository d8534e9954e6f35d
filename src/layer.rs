//! [`RateLimitLayer`] and its builder.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::Method;
use http::header::HeaderValue;
use smallvec::SmallVec;
use tower_layer::Layer;

use crate::error::ConfigError;
use crate::headers::{self, HeaderStyle, RetryAfterFormat};
use crate::key::KeyExtractor;
use crate::limit::{Limit, Mode};
use crate::quota::Quota;
use crate::response::DefaultOnRejection;
use crate::service::RateLimit;
use crate::store::Store;
use crate::throttle::LogThrottle;

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
                    .bounds
                    .iter()
                    .map(|b| &b.limit)
                    .collect::<Vec<_>>(),
            )
            .field("routes", &self.shared.routes.len())
            .field("headers", &self.shared.style)
            .finish_non_exhaustive()
    }
}

/// One limit, bound to its table in the store.
pub(crate) struct Bound<St: Store> {
    pub(crate) limit: Limit,
    pub(crate) table: St::Table,
    /// The start of this limit's `RateLimit` member, `"name";r=`.
    pub(crate) ietf_prefix: Box<str>,
    /// Misconfigurations hit by requests: logged once a minute.
    pub(crate) misconfigured_log: LogThrottle,
    /// Shadow "would refuse"s: logged once per [`SHADOW_LOG_EVERY`], with a count.
    pub(crate) shadow_log: LogThrottle,
}

/// The limits that apply to one kind of request.
pub(crate) struct Group {
    pub(crate) limits: SmallVec<[usize; 4]>,
    /// `RateLimit-Policy` for the usual case: every reported limit with its own quota.
    pub(crate) policy: Option<HeaderValue>,
    /// How many limits that usual case reports.
    pub(crate) reported: usize,
    /// Whether a limit of the group chooses its quota per request.
    pub(crate) dynamic_quota: bool,
    /// Whether a limit of the group is in shadow mode.
    pub(crate) shadow: bool,
}

/// A route's entries: (method, or any method; group of limits).
pub(crate) type Entries = SmallVec<[(Option<Method>, usize); 2]>;

/// The routes of a layer: found by their template (axum's `MatchedPath`), or by matching a
/// request path against the templates, with axum's syntax and priorities (`matchit`).
#[derive(Default)]
pub(crate) struct RouteTable {
    /// Template to its index in `entries`.
    by_template: HashMap<Box<str>, usize>,
    /// The same templates, for request paths.
    matcher: matchit::Router<usize>,
    entries: Vec<Entries>,
}

impl RouteTable {
    /// How many route templates there are.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entries of the route whose template is `template` (a router's matched path).
    #[cfg(feature = "axum")]
    pub(crate) fn for_template(&self, template: &str) -> Option<&Entries> {
        self.by_template.get(template).map(|&i| &self.entries[i])
    }

    /// The entries of the route whose template matches the request path `path`.
    pub(crate) fn for_path(&self, path: &str) -> Option<&Entries> {
        self.matcher.at(path).ok().map(|m| &self.entries[*m.value])
    }

    /// The entries of `template`, added if new; matchit's error if the template is not
    /// valid or conflicts with another one.
    fn entries_mut(&mut self, template: &str) -> Result<&mut Entries, matchit::InsertError> {
        let index = match self.by_template.get(template) {
            Some(&i) => i,
            None => {
                let i = self.entries.len();
                self.matcher.insert(template, i)?;
                self.by_template.insert(template.into(), i);
                self.entries.push(Entries::new());
                i
            }
        };
        Ok(&mut self.entries[index])
    }
}

/// A function told every decision (see [`RateLimitBuilder::on_decision`]).
pub(crate) type Observer = Arc<dyn Fn(&crate::Decision, &http::request::Parts) + Send + Sync>;

/// Everything a layer and its services share.
pub(crate) struct Shared<St: Store, R> {
    pub(crate) store: St,
    pub(crate) bounds: Vec<Bound<St>>,
    /// Group 0 applies to requests that match no route entry.
    pub(crate) groups: Vec<Group>,
    /// Route template to (method or any, group).
    pub(crate) routes: RouteTable,
    pub(crate) style: HeaderStyle,
    pub(crate) shadow_headers: bool,
    pub(crate) retry_format: RetryAfterFormat,
    pub(crate) jitter: f64,
    pub(crate) unavailable_retry: Duration,
    pub(crate) decision_extension: bool,
    pub(crate) observer: Option<Observer>,
    pub(crate) on_rejection: R,
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
            always: Vec::new(),
            routes: Vec::new(),
            route_default: Vec::new(),
            style: HeaderStyle::Ietf,
            shadow_headers: false,
            retry_format: RetryAfterFormat::Seconds,
            jitter: 0.0,
            unavailable_retry: Duration::from_secs(1),
            decision_extension: true,
            observer: None,
            on_rejection: DefaultOnRejection::new(),
        }
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
    always: Vec<Limit>,
    routes: Vec<(String, Limit)>,
    route_default: Vec<Limit>,
    style: HeaderStyle,
    shadow_headers: bool,
    retry_format: RetryAfterFormat,
    jitter: f64,
    unavailable_retry: Duration,
    decision_extension: bool,
    observer: Option<Observer>,
    on_rejection: R,
}

impl<St: Store, R> fmt::Debug for RateLimitBuilder<St, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitBuilder")
            .field("limits", &self.always)
            .field("routes", &self.routes)
            .field("route_default", &self.route_default)
            .field("headers", &self.style)
            .finish_non_exhaustive()
    }
}

impl<St: Store, R> RateLimitBuilder<St, R> {
    /// A limit checked on every request.
    pub fn limit(mut self, limit: Limit) -> Self {
        self.always.push(limit);
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
    /// [`ConfigError`] naming the route.
    pub fn route(mut self, route: impl Into<String>, limit: Limit) -> Self {
        self.routes.push((route.into(), limit));
        self
    }

    /// A limit checked on the requests that match no [`route`](Self::route) entry.
    pub fn route_default(mut self, limit: Limit) -> Self {
        self.route_default.push(limit);
        self
    }

    /// Which rate-limit fields responses carry (default [`HeaderStyle::Ietf`]).
    pub fn headers(mut self, style: HeaderStyle) -> Self {
        self.style = style;
        self
    }

    /// Whether shadow limits appear in the rate-limit fields (default: no, since they do
    /// not limit the client).
    pub fn shadow_headers(mut self, show: bool) -> Self {
        self.shadow_headers = show;
        self
    }

    /// How `Retry-After` is written (default: whole seconds).
    pub fn retry_after_format(mut self, format: RetryAfterFormat) -> Self {
        self.retry_format = format;
        self
    }

    /// Spreads the retries of clients refused at the same moment: `Retry-After` grows by up
    /// to `fraction` of the wait (0.5: up to 50 % longer), by an amount fixed per client
    /// key, so a client always gets the same offset. Never shorter than the real wait.
    /// Must be within `0.0..=1.0`.
    pub fn retry_after_jitter(mut self, fraction: f64) -> Self {
        self.jitter = fraction;
        self
    }

    /// The `Retry-After` of a 503 when a store fails under
    /// [`FailurePolicy::Deny`](crate::FailurePolicy) (default 1 s).
    pub fn unavailable_retry_after(mut self, wait: Duration) -> Self {
        self.unavailable_retry = wait;
        self
    }

    /// Whether the [`Decision`](crate::Decision) is put in the request extensions for the
    /// handler (default: yes).
    pub fn decision_extension(mut self, insert: bool) -> Self {
        self.decision_extension = insert;
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
        self.observer = Some(Arc::new(observer));
        self
    }

    /// Replaces the responses to refused requests (see [`crate::response`]).
    pub fn on_rejection<R2>(self, on_rejection: R2) -> RateLimitBuilder<St, R2> {
        RateLimitBuilder {
            store: self.store,
            always: self.always,
            routes: self.routes,
            route_default: self.route_default,
            style: self.style,
            shadow_headers: self.shadow_headers,
            retry_format: self.retry_format,
            jitter: self.jitter,
            unavailable_retry: self.unavailable_retry,
            decision_extension: self.decision_extension,
            observer: self.observer,
            on_rejection,
        }
    }

    /// Checks the configuration and builds the layer, or names the first bad field.
    pub fn build(self) -> Result<RateLimitLayer<St, R>, ConfigError> {
        if self.always.is_empty() && self.routes.is_empty() && self.route_default.is_empty() {
            return Err(ConfigError::new("limits", "no limit is configured"));
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            return Err(ConfigError::new(
                "retry_after_jitter",
                "must be a fraction within 0.0..=1.0",
            ));
        }
        let mut bounds: Vec<Bound<St>> = Vec::new();
        let mut bind = |limit: Limit| -> Result<usize, ConfigError> {
            limit.validate()?;
            let table = self.store.table(&limit.name);
            bounds.push(Bound {
                ietf_prefix: headers::limit_prefix(&limit.name),
                limit,
                table,
                misconfigured_log: LogThrottle::new(),
                shadow_log: LogThrottle::new(),
            });
            Ok(bounds.len() - 1)
        };
        let always = self
            .always
            .into_iter()
            .map(&mut bind)
            .collect::<Result<SmallVec<[usize; 4]>, _>>()?;
        let mut group_limits = vec![always.clone()];
        for limit in self.route_default {
            group_limits[0].push(bind(limit)?);
        }
        let mut routes = RouteTable::default();
        for (spec, limit) in self.routes {
            let (method, path) = parse_route(&spec)?;
            let entries = routes.entries_mut(path).map_err(|e| {
                ConfigError::new(format!("routes[{spec:?}]"), format!("`{path}`: {e}"))
            })?;
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
        let groups = group_limits
            .into_iter()
            .map(|limits| {
                check_unique(&bounds, &limits)?;
                let reported: Vec<&Limit> = limits
                    .iter()
                    .map(|&i| &bounds[i].limit)
                    .filter(|l| l.mode == Mode::Enforce || self.shadow_headers)
                    .collect();
                let policy = headers::static_policy(
                    reported
                        .iter()
                        .map(|l| (&*l.name, l.quota.burst_size(), l.quota.window_secs())),
                );
                let limit = |&i: &usize| &bounds[i].limit;
                Ok(Group {
                    reported: reported.len(),
                    policy,
                    dynamic_quota: limits.iter().map(limit).any(|l| l.quota_fn.is_some()),
                    shadow: limits.iter().map(limit).any(|l| l.mode == Mode::Shadow),
                    limits,
                })
            })
            .collect::<Result<Vec<_>, ConfigError>>()?;
        Ok(RateLimitLayer {
            shared: Arc::new(Shared {
                store: self.store,
                bounds,
                groups,
                routes,
                style: self.style,
                shadow_headers: self.shadow_headers,
                retry_format: self.retry_format,
                jitter: self.jitter,
                unavailable_retry: self.unavailable_retry,
                decision_extension: self.decision_extension,
                observer: self.observer,
                on_rejection: self.on_rejection,
            }),
        })
    }
}

/// `"POST /login"` or `"/login"`.
fn parse_route(spec: &str) -> Result<(Option<Method>, &str), ConfigError> {
    let field = || format!("routes[{spec:?}]");
    let spec_trimmed = spec.trim();
    let (method, path) = match spec_trimmed.split_once(char::is_whitespace) {
        Some((m, p)) if !m.starts_with('/') => {
            let m = Method::from_bytes(m.as_bytes())
                .map_err(|_| ConfigError::new(field(), format!("`{m}` is not a method")))?;
            (Some(m), p.trim())
        }
        _ => (None, spec_trimmed),
    };
    if !path.starts_with('/') {
        return Err(ConfigError::new(
            field(),
            "expected a path starting with `/`, optionally after a method (`POST /login`)",
        ));
    }
    // A request path never contains whitespace: such a route could never match.
    if path.contains(char::is_whitespace) {
        return Err(ConfigError::new(
            field(),
            format!(
                "the path `{path}` contains whitespace, which no request path can; \
                 expected `<path>` or `<METHOD> <path>`"
            ),
        ));
    }
    Ok((method, path))
}

/// Two limits of one request must not share a name: their headers and buckets would mix.
fn check_unique<St: Store>(bounds: &[Bound<St>], limits: &[usize]) -> Result<(), ConfigError> {
    for (n, &i) in limits.iter().enumerate() {
        let name = &bounds[i].limit.name;
        if limits[..n].iter().any(|&j| bounds[j].limit.name == *name) {
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
