//! [`RateLimitLayer`]: applies [`RateLimit`] to services.

use std::fmt;
use std::sync::Arc;

use tower_layer::Layer;

use crate::limiter::Limiter;
use crate::middleware::service::RateLimit;
use crate::middleware::shared::{Shared, Version};
use crate::middleware::source::Source;
use crate::store::Store;
use crate::web::response::DefaultOnRejection;

/// Applies [`RateLimit`] to services: the rate limiting middleware.
///
/// The layer holds everything in one `Arc`: applying it to many routes, and cloning the
/// services it makes (axum clones per route and per connection), shares the same limits
/// and the same store. `Layer::layer` creates no state.
///
/// See the [crate docs](crate) for examples.
pub struct RateLimitLayer<St: Store, R = DefaultOnRejection> {
    pub(crate) source: Source<St, R>,
}

impl<St: Store, R> RateLimitLayer<St, R> {
    /// A layer on `shared`, fixed for its life.
    pub(crate) fn fixed(shared: Shared<St, R>) -> Self {
        Self {
            source: Source::Fixed(Arc::new(Version::new(Arc::new(shared)))),
        }
    }

    /// A layer on whatever `live` holds when each request arrives (reloaded rules).
    #[cfg(feature = "rules")]
    pub(crate) fn live(live: Arc<dyn crate::middleware::source::Live<St, R>>) -> Self {
        Self {
            source: Source::Live(live),
        }
    }
}

impl<St: Store, R> Clone for RateLimitLayer<St, R> {
    fn clone(&self) -> Self {
        Self {
            source: self.source.clone(),
        }
    }
}

impl<St: Store, R: 'static> fmt::Debug for RateLimitLayer<St, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.source.with(|shared| {
            f.debug_struct("RateLimitLayer")
                .field(
                    "limits",
                    &shared
                        .policy
                        .limits
                        .iter()
                        .map(|l| &l.limit)
                        .collect::<Vec<_>>(),
                )
                .field("routes", &shared.policy.routes.len())
                .field("headers", &shared.policy.options.style)
                .finish_non_exhaustive()
        })
    }
}

impl<St: Store, R: Send + Sync + 'static> RateLimitLayer<St, R> {
    /// The [`Limiter`] handle on this layer's limits and store: what handlers, background
    /// jobs and other stacks use to peek, check, refund, penalize, block and reset the
    /// same buckets. Handlers get it from the router's state (`Router::with_state`); it is
    /// in every request's extensions only with
    /// [`RateLimitBuilder::limiter_extension(true)`](crate::RateLimitBuilder::limiter_extension).
    pub fn limiter(&self) -> Limiter {
        Limiter::from_handle(self.source.handle())
    }
}

impl<S, St: Store, R> Layer<S> for RateLimitLayer<St, R> {
    type Service = RateLimit<S, St, R>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            source: self.source.clone(),
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

    /// The rules' `simulate` reads only a refusal's status: its refusals carry neither
    /// `Retry-After` nor `Cache-Control`, and are refused all the same.
    #[cfg(feature = "rules")]
    #[tokio::test]
    async fn bare_refusals_have_the_status_and_no_fields() {
        use http::{Request, Response, StatusCode, header};
        use http_body_util::Full;
        use tower::{Layer, ServiceExt, service_fn};

        for bare in [false, true] {
            let mut builder = RateLimitLayer::builder(MemoryStore::new())
                .limit(Limit::new("a", Quota::per_minute(1)));
            if bare {
                builder = builder.bare_refusals();
            }
            let service = builder.build().unwrap().layer(service_fn(
                |_: Request<Full<bytes::Bytes>>| async {
                    Ok::<_, std::convert::Infallible>(
                        Response::new(Full::<bytes::Bytes>::default()),
                    )
                },
            ));
            let mut answers = Vec::new();
            for _ in 0..2 {
                let answer = service.clone().oneshot(Request::new(Full::default()));
                answers.push(answer.await.unwrap());
            }
            assert_eq!(answers[0].status(), StatusCode::OK);
            let refused = &answers[1];
            assert_eq!(
                refused.status(),
                StatusCode::TOO_MANY_REQUESTS,
                "bare: {bare}"
            );
            assert_eq!(refused.headers().contains_key(header::RETRY_AFTER), !bare);
            assert_eq!(refused.headers().contains_key(header::CACHE_CONTROL), !bare);
        }
    }
}
