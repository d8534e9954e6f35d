//! [`RateLimitLayer`], and what its services share: the engine with the rejection
//! responses ([`Shared`]) and the request path after the store answers ([`proceed`]).

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::Response;
use http::header::{CACHE_CONTROL, HeaderValue};
use http::request::Parts;
use tower_layer::Layer;

use crate::engine::{Engine, Next, Prepared};
use crate::limiter::Limiter;
use crate::middleware::guard::{ChargeGuard, DelayGuard, PendingCharge};
use crate::middleware::service::RateLimit;
use crate::model::decision::Decision;
use crate::store::{Statuses, Store};
use crate::web::headers::{self, Fields};
use crate::web::hooks::Keys;
use crate::web::response::{DefaultOnRejection, OnRejection, Rejection};

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
    /// How refused gRPC calls are answered.
    #[cfg(feature = "grpc")]
    pub(crate) grpc: crate::middleware::grpc::Grpc,
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
                hooks.refused(
                    prepared.plan.iter().map(|p| p.bound),
                    &decision,
                    wait,
                    parts,
                    keys,
                );
            }
            #[cfg(feature = "grpc")]
            if let Some(content_type) = shared.grpc.answer_type(parts) {
                return Err(crate::middleware::grpc::refuse(
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

impl<St: Store, R: Send + Sync + 'static> RateLimitLayer<St, R> {
    /// The [`Limiter`] handle on this layer's limits and store: what handlers, background
    /// jobs and other stacks use to peek, check, refund, penalize, block and reset the
    /// same buckets. With the default settings it is also in every request's extensions
    /// (see [`RateLimitBuilder::limiter_extension`](crate::RateLimitBuilder::limiter_extension)).
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;
    use crate::{Limit, Quota};

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
