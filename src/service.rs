//! [`RateLimit`]: the middleware service.

use std::fmt;
use std::mem;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use http::header::{CACHE_CONTROL, HeaderValue};
use http::request::Parts;
use http::{Method, Request, Response};
use smallvec::SmallVec;
use tower_service::Service;

use crate::decision::{Decision, LimitDecision, Overall};
use crate::future::ResponseFuture;
use crate::headers::{self, Fields, HeaderStyle, Report};
use crate::key::{Key, KeyBuilder, KeyError};
use crate::layer::{Bound, Shared};
use crate::limit::{MissingKey, Mode};
use crate::quota::Quota;
use crate::response::{OnRejection, Rejection};
use crate::store::{Checked, Item, Statuses, Store};

/// The rate limiting middleware; made by [`RateLimitLayer`](crate::RateLimitLayer).
///
/// `poll_ready` only asks the inner service; the limits are checked in `call`. Its error
/// is the inner service's error: every outcome of the limiter is a response (429, 503,
/// 4xx or 500), never an error. Clones share all state.
pub struct RateLimit<S, St: Store, R> {
    pub(crate) inner: S,
    pub(crate) shared: Arc<Shared<St, R>>,
}

impl<S, St: Store, R> RateLimit<S, St, R> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, St: Store, R> Clone for RateLimit<S, St, R> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: fmt::Debug, St: Store, R> fmt::Debug for RateLimit<S, St, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

/// What is remembered of each checked limit while the store answers.
#[derive(Clone, Copy)]
pub(crate) struct Planned {
    bound: usize,
    quota: Quota,
    cost: u32,
    /// For Retry-After jitter: a hash of the key that is the same in every process.
    key_hash: u64,
}

pub(crate) type Plan = SmallVec<[Planned; 4]>;

/// What to do after the check.
pub(crate) enum Next<B> {
    /// Call the service, then add these fields to its response.
    Proceed(Fields),
    /// Answer with this response.
    Refuse(Response<B>),
}

impl<S, St, R, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S, St, R>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    St: Store,
    R: OnRejection<ResBody>,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S, St, R, ReqBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let (mut parts, body) = req.into_parts();
        let shared = &*self.shared;
        let mut items = SmallVec::<[Item<'_, St::Table>; 4]>::new();
        let mut plan = Plan::new();
        let group = match prepare(shared, &parts, &mut items, &mut plan) {
            Ok(group) => group,
            Err(response) => return ResponseFuture::done(response),
        };
        // A request no limit applies to (skipped keys, a route without limits) never
        // reaches the store.
        let checked = if items.is_empty() {
            Checked::Ready(Statuses::new())
        } else {
            shared.store.check(&items)
        };
        match checked {
            Checked::Ready(statuses) => {
                drop(items);
                match finish(shared, group, &plan, statuses, &mut parts) {
                    Next::Proceed(fields) => {
                        let future = self.inner.call(Request::from_parts(parts, body));
                        ResponseFuture::calling(future, fields)
                    }
                    Next::Refuse(response) => ResponseFuture::done(response),
                }
            }
            Checked::Pending(check) => {
                drop(items);
                // Take the service that was made ready; leave a clone for the next call.
                let clone = self.inner.clone();
                let service = mem::replace(&mut self.inner, clone);
                ResponseFuture::checking(
                    check,
                    service,
                    self.shared.clone(),
                    group,
                    plan,
                    parts,
                    body,
                )
            }
        }
    }
}

/// The group of limits for a request: its route's, or the default group.
fn group_for<St: Store, R>(shared: &Shared<St, R>, parts: &Parts) -> usize {
    if shared.routes.is_empty() {
        return 0;
    }
    // After axum's router, its matched template names the route; elsewhere (`Router::layer`,
    // plain hyper) the request path is matched against the templates.
    #[cfg(feature = "axum")]
    let entries = match parts.extensions.get::<axum::extract::MatchedPath>() {
        Some(matched) => shared.routes.for_template(matched.as_str()),
        None => shared.routes.for_path(parts.uri.path()),
    };
    #[cfg(not(feature = "axum"))]
    let entries = shared.routes.for_path(parts.uri.path());
    let Some(entries) = entries else {
        return 0;
    };
    let with = |m: &Method| entries.iter().find(|(em, _)| em.as_ref() == Some(m));
    with(&parts.method)
        .or_else(|| {
            (parts.method == Method::HEAD)
                .then(|| with(&Method::GET))
                .flatten()
        })
        .or_else(|| entries.iter().find(|(m, _)| m.is_none()))
        .map_or(0, |&(_, g)| g)
}

/// Extracts each limit's key, quota and cost into `items` and `plan`, and returns the
/// group; or the response when a key is missing and the limit refuses such requests, or
/// the app is misconfigured.
fn prepare<'a, St: Store, R, B>(
    shared: &'a Shared<St, R>,
    parts: &Parts,
    items: &mut SmallVec<[Item<'a, St::Table>; 4]>,
    plan: &mut Plan,
) -> Result<usize, Response<B>>
where
    R: OnRejection<B>,
{
    let group = group_for(shared, parts);
    for &index in &shared.groups[group].limits {
        let bound = &shared.bounds[index];
        let limit = &bound.limit;
        let mut builder = KeyBuilder::new();
        let key = match limit.key.extract(parts, &mut builder) {
            Ok(()) => builder.take(),
            Err(KeyError::Missing) => match limit.missing {
                MissingKey::SharedBucket => Key::missing(),
                MissingKey::Skip => continue,
                MissingKey::Reject(status) => {
                    let rejection = Rejection::MissingKey {
                        limit: &limit.name,
                        status,
                    };
                    return Err(shared.on_rejection.on_rejection(&rejection));
                }
            },
            Err(KeyError::Misconfigured(reason)) => {
                log_misconfiguration(bound, reason);
                let rejection = Rejection::Misconfigured {
                    limit: &limit.name,
                    reason,
                };
                return Err(shared.on_rejection.on_rejection(&rejection));
            }
        };
        let quota = limit.quota_for(parts);
        let cost = limit.cost.resolve(parts);
        let key_hash = if shared.jitter > 0.0 {
            key.stable_hash()
        } else {
            0
        };
        plan.push(Planned {
            bound: index,
            quota,
            cost,
            key_hash,
        });
        items.push(
            Item::new(&bound.table, key, quota, cost)
                .mode(limit.mode)
                .on_failure(limit.on_failure),
        );
    }
    Ok(group)
}

/// Logs a misconfiguration at most once a minute per limit.
fn log_misconfiguration<St: Store>(bound: &Bound<St>, reason: &str) {
    if let Some(suppressed) = bound.misconfigured_log.permit(Duration::from_secs(60)) {
        tracing::error!(
            limit = &*bound.limit.name,
            suppressed,
            "tollgate cannot apply this limit: {reason}"
        );
    }
}

/// How often a shadow limit's "would refuse" is logged (with the count since the last line).
pub(crate) const SHADOW_LOG_EVERY: Duration = Duration::from_secs(10);

/// Builds the decision from the store's answer and decides what happens to the request.
pub(crate) fn finish<St: Store, R, B>(
    shared: &Shared<St, R>,
    group: usize,
    plan: &[Planned],
    statuses: Statuses,
    parts: &mut Parts,
) -> Next<B>
where
    R: OnRejection<B>,
{
    let limits = plan
        .iter()
        .zip(statuses)
        .map(|(p, status)| {
            let limit = &shared.bounds[p.bound].limit;
            LimitDecision {
                name: limit.name.clone(),
                quota: p.quota,
                cost: p.cost,
                mode: limit.mode,
                status,
            }
        })
        .collect();
    let decision = Decision { limits };
    let g = &shared.groups[group];
    if g.shadow {
        for (l, p) in decision.limits().zip(plan) {
            if l.mode() == Mode::Shadow && !l.allowed() {
                log_shadow_refusal(&shared.bounds[p.bound], parts);
            }
        }
    }
    if let Some(observer) = &shared.observer {
        observer(&decision, parts);
    }
    let overall = decision.overall();
    let mut fields = Fields::default();
    let wait = match overall {
        Overall::Limited => decision
            .retry_after()
            .map(|w| jittered(shared, plan, &decision, w)),
        _ => None,
    };
    if shared.style != HeaderStyle::None {
        let reports: SmallVec<[Report<'_>; 4]> = decision
            .limits()
            .zip(plan)
            .filter(|(l, _)| l.mode() == Mode::Enforce || shared.shadow_headers)
            .filter_map(|(l, p)| {
                let o = l.outcome()?;
                Some(Report {
                    name: l.name(),
                    prefix: &shared.bounds[p.bound].ietf_prefix,
                    burst: l.quota.burst_size(),
                    window: l.quota.window_secs(),
                    remaining: o.remaining(),
                    next_after: o.next_after(),
                    reset_after: o.reset_after(),
                    violated: l.denies(),
                })
            })
            .collect();
        let usual = reports.len() == g.reported
            && (!g.dynamic_quota
                || decision
                    .limits()
                    .zip(plan)
                    .all(|(l, p)| l.quota == shared.bounds[p.bound].limit.quota));
        let policy = if usual { g.policy.as_ref() } else { None };
        headers::rate_limit_fields(
            shared.style,
            &reports,
            policy,
            SystemTime::now,
            wait,
            &mut fields,
        );
    }
    match overall {
        Overall::Allowed => {
            if shared.decision_extension {
                // Stacked layers: the handler sees every layer's limits in one decision.
                match parts.extensions.get_mut::<Decision>() {
                    Some(outer) => outer.limits.extend(decision.limits),
                    None => {
                        parts.extensions.insert(decision);
                    }
                }
            }
            Next::Proceed(fields)
        }
        Overall::Limited => {
            tracing::debug!(method = %parts.method, path = parts.uri.path(), retry_after = ?wait, "request rate limited");
            let rejection = Rejection::Limited {
                decision: &decision,
                retry_after: wait,
            };
            Next::Refuse(refuse(shared, &rejection, fields, wait))
        }
        Overall::Unavailable => {
            let wait = shared.unavailable_retry;
            let rejection = Rejection::Unavailable {
                decision: &decision,
                retry_after: wait,
            };
            Next::Refuse(refuse(shared, &rejection, fields, Some(wait)))
        }
    }
}

/// Logs that a shadow limit would have refused a request: the first time, then once per
/// [`SHADOW_LOG_EVERY`] per limit with the number of refusals in between, whatever the
/// flood.
fn log_shadow_refusal<St: Store>(bound: &Bound<St>, parts: &Parts) {
    if let Some(suppressed) = bound.shadow_log.permit(SHADOW_LOG_EVERY) {
        tracing::info!(
            limit = &*bound.limit.name,
            method = %parts.method,
            path = parts.uri.path(),
            more_since_last_line = suppressed,
            "shadow limit would refuse this request"
        );
    }
}

/// The rejection response with the layer's rate-limit fields (IETF lists appended to any
/// the response has; single-valued styles only if absent), and `Retry-After` and
/// `Cache-Control` if absent.
fn refuse<St: Store, R, B>(
    shared: &Shared<St, R>,
    rejection: &Rejection<'_>,
    fields: Fields,
    wait: Option<Duration>,
) -> Response<B>
where
    R: OnRejection<B>,
{
    let mut response = shared.on_rejection.on_rejection(rejection);
    let headers = response.headers_mut();
    fields.apply(headers);
    if let Some(wait) = wait
        && !headers.contains_key(headers::RETRY_AFTER_NAME)
    {
        headers.insert(
            headers::RETRY_AFTER_NAME,
            headers::retry_after(wait, shared.retry_format, SystemTime::now),
        );
    }
    if !headers.contains_key(CACHE_CONTROL) {
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}

/// The wait, lengthened by up to `jitter` of itself, by an amount fixed per client key.
fn jittered<St: Store, R>(
    shared: &Shared<St, R>,
    plan: &[Planned],
    decision: &Decision,
    wait: Duration,
) -> Duration {
    if shared.jitter <= 0.0 {
        return wait;
    }
    // Seeded by the key of the limit that imposes the wait.
    let hash = decision
        .limits()
        .zip(plan)
        .filter(|(l, _)| l.denies())
        .max_by_key(|(l, _)| l.retry_after())
        .map_or(0, |(_, p)| p.key_hash);
    let fraction = (hash >> 11) as f64 / (1u64 << 53) as f64;
    wait + wait.mul_f64(shared.jitter * fraction)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Limit, RateLimitLayer, store::MemoryStore};

    #[test]
    fn routes_are_matched_by_path_and_method() {
        let q = Quota::per_second(1);
        let layer = RateLimitLayer::builder(MemoryStore::new())
            .route("POST /login", Limit::new("login-post", q))
            .route("/login", Limit::new("login-any", q))
            .route("GET /items", Limit::new("items", q))
            .route_default(Limit::new("other", q))
            .build()
            .unwrap();
        let shared = &*layer.shared;
        let name = |m: Method, p: &str| names_for(shared, m, p);
        assert_eq!(name(Method::POST, "/login"), ["login-post"]);
        assert_eq!(name(Method::GET, "/login"), ["login-any"]);
        assert_eq!(name(Method::GET, "/items"), ["items"]);
        assert_eq!(name(Method::HEAD, "/items"), ["items"]);
        assert_eq!(name(Method::POST, "/items"), ["other"]);
        assert_eq!(name(Method::GET, "/elsewhere"), ["other"]);
    }

    /// The names of the limits a request gets, without axum's `MatchedPath`.
    fn names_for(
        shared: &Shared<MemoryStore, crate::response::DefaultOnRejection>,
        method: Method,
        path: &str,
    ) -> Vec<String> {
        let (parts, _) = Request::builder()
            .method(method)
            .uri(path)
            .body(())
            .unwrap()
            .into_parts();
        let g = group_for(shared, &parts);
        shared.groups[g]
            .limits
            .iter()
            .map(|&i| shared.bounds[i].limit.name().to_owned())
            .collect()
    }

    #[test]
    fn without_a_matched_path_templates_match_the_request_path() {
        let q = Quota::per_second(1);
        let layer = RateLimitLayer::builder(MemoryStore::new())
            .route("/users/{id}", Limit::new("user", q))
            .route("POST /users/{id}", Limit::new("user-post", q))
            .route("GET /users/me", Limit::new("me", q))
            .route("/files/{*rest}", Limit::new("files", q))
            .route("/orgs/{org}/repos/{repo}", Limit::new("repo", q))
            .route("/plain", Limit::new("plain", q))
            .route_default(Limit::new("other", q))
            .build()
            .unwrap();
        let shared = &*layer.shared;
        let name = |m: Method, p: &str| names_for(shared, m, p);
        assert_eq!(name(Method::GET, "/users/7"), ["user"]);
        assert_eq!(name(Method::GET, "/users/8"), ["user"]);
        assert_eq!(name(Method::DELETE, "/users/8"), ["user"]);
        assert_eq!(name(Method::POST, "/users/7"), ["user-post"]);
        assert_eq!(name(Method::GET, "/users/me"), ["me"], "static wins");
        assert_eq!(name(Method::HEAD, "/users/me"), ["me"], "HEAD uses GET");
        assert_eq!(name(Method::POST, "/users/me"), ["other"]);
        assert_eq!(name(Method::GET, "/files/a/b.txt"), ["files"]);
        assert_eq!(name(Method::GET, "/orgs/x/repos/y"), ["repo"]);
        assert_eq!(name(Method::GET, "/plain"), ["plain"]);
        assert_eq!(
            name(Method::GET, "/plain?q=1"),
            ["plain"],
            "the query is not the path"
        );
        for unmatched in [
            "/users",
            "/users/7/x",
            "/users/",
            "/files/",
            "/plain/",
            "/x",
        ] {
            assert_eq!(name(Method::GET, unmatched), ["other"], "{unmatched}");
        }
        // The template itself, as a raw path, is just a path like any other.
        assert_eq!(name(Method::GET, "/users/%7Bid%7D"), ["user"]);
    }
}
