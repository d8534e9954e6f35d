//! Feature `axum`: [`Limiter`] and [`Decision`] as extractors of the request extensions the
//! layer fills, whose rejection names the builder option that puts them there (not axum's
//! bare "missing request extension").

use std::convert::Infallible;
use std::fmt;

use axum::extract::{FromRequestParts, OptionalFromRequestParts};
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use http::request::Parts;

use crate::base::throttle::LogOnce;
use crate::limiter::Limiter;
use crate::model::decision::Decision;

const NO_LIMITER: &str = "no tollgate::Limiter in the request's extensions: the layer puts \
    one there only when built with `.limiter_extension(true)` (rules: \
    `Rules::builder(..).configure(|b| b.limiter_extension(true))`), and only for the routes \
    it wraps. Or give handlers the layer's handle from the router's state, for nothing per \
    request: `Router::with_state(layer.limiter())` and `State<Limiter>`";

const NO_DECISION: &str = "no tollgate::Decision in the request's extensions: the layer puts \
    one there for every request it checks, unless built with `.decision_extension(false)` \
    (turn it on with `.decision_extension(true)`). A request it did not check (a route it \
    does not wrap, an allow-listed client, a route no limit applies to) has none: extract \
    `Option<Decision>` there";

/// Logged once per process for each type, as the 500s say on every request.
static LIMITER_LOGGED: LogOnce = LogOnce::new();
static DECISION_LOGGED: LogOnce = LogOnce::new();

/// The rejection of the [`Limiter`] and [`Decision`] extractors: the request holds none,
/// because the layer was not asked to put it there (or did not check the request). Its
/// response is a 500 whose body names the builder option to turn on; the first one of
/// each type is also logged.
///
/// ```
/// use axum::{Router, body::Body, http::{Request, StatusCode}, routing::get};
/// use tollgate::{Limit, Limiter, Quota, RateLimitLayer, store::MemoryStore};
/// use tower::ServiceExt;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let layer = RateLimitLayer::builder(MemoryStore::new())
///     .limit(Limit::new("global", Quota::per_second(100)))
///     .build()?; // no `.limiter_extension(true)`
/// let app = Router::new()
///     .route("/", get(|limiter: Limiter| async move { limiter.limits().join(",") }))
///     .route_layer(layer);
/// let response = app.oneshot(Request::get("/").body(Body::empty())?).await?;
/// assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
/// let body = axum::body::to_bytes(response.into_body(), 4096).await?;
/// assert!(String::from_utf8(body.to_vec())?.contains(".limiter_extension(true)"));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MissingExtension {
    message: &'static str,
}

impl MissingExtension {
    fn limiter() -> Self {
        if LIMITER_LOGGED.first() {
            tracing::error!("{NO_LIMITER}");
        }
        Self {
            message: NO_LIMITER,
        }
    }

    fn decision() -> Self {
        if DECISION_LOGGED.first() {
            tracing::error!("{NO_DECISION}");
        }
        Self {
            message: NO_DECISION,
        }
    }

    /// What is missing and which option puts it there (the body of the response).
    pub fn message(&self) -> &'static str {
        self.message
    }
}

impl fmt::Display for MissingExtension {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message)
    }
}

impl std::error::Error for MissingExtension {}

impl IntoResponse for MissingExtension {
    fn into_response(self) -> Response {
        (StatusCode::INTERNAL_SERVER_ERROR, self.message).into_response()
    }
}

/// The layer's handle in the request's extensions, there with
/// [`limiter_extension(true)`](crate::RateLimitBuilder::limiter_extension); else
/// [`MissingExtension`]. `Option<Limiter>` is `None` instead.
impl<S: Send + Sync> FromRequestParts<S> for Limiter {
    type Rejection = MissingExtension;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<Limiter>()
            .cloned()
            .ok_or_else(MissingExtension::limiter)
    }
}

impl<S: Send + Sync> OptionalFromRequestParts<S> for Limiter {
    type Rejection = Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        _state: &S,
    ) -> Result<Option<Self>, Self::Rejection> {
        Ok(parts.extensions.get::<Limiter>().cloned())
    }
}

/// The request's decision, in its extensions unless the layer was built with
/// [`decision_extension(false)`](crate::RateLimitBuilder::decision_extension); else
/// [`MissingExtension`]. `Option<Decision>` is `None` instead.
impl<S: Send + Sync> FromRequestParts<S> for Decision {
    type Rejection = MissingExtension;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<Decision>()
            .cloned()
            .ok_or_else(MissingExtension::decision)
    }
}

impl<S: Send + Sync> OptionalFromRequestParts<S> for Decision {
    type Rejection = Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        _state: &S,
    ) -> Result<Option<Self>, Self::Rejection> {
        Ok(parts.extensions.get::<Decision>().cloned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts() -> Parts {
        http::Request::new(()).into_parts().0
    }

    #[tokio::test]
    async fn absent_extensions_name_the_option_and_optional_ones_are_none() {
        let mut parts = parts();
        let limiter = <Limiter as FromRequestParts<()>>::from_request_parts(&mut parts, &()).await;
        let rejection = limiter.unwrap_err();
        assert!(rejection.message().contains(".limiter_extension(true)"));
        assert!(rejection.to_string().contains("State<Limiter>"));
        let response = rejection.into_response();
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);

        let decision =
            <Decision as FromRequestParts<()>>::from_request_parts(&mut parts, &()).await;
        assert!(
            decision
                .unwrap_err()
                .message()
                .contains(".decision_extension(true)")
        );

        let none = <Limiter as OptionalFromRequestParts<()>>::from_request_parts(&mut parts, &());
        assert!(none.await.unwrap().is_none());
        let none = <Decision as OptionalFromRequestParts<()>>::from_request_parts(&mut parts, &());
        assert!(none.await.unwrap().is_none());
    }

    #[tokio::test]
    async fn a_present_decision_is_extracted() {
        let mut parts = parts();
        parts.extensions.insert(Decision {
            limits: smallvec::SmallVec::new(),
        });
        let decision = <Decision as FromRequestParts<()>>::from_request_parts(&mut parts, &());
        assert!(decision.await.is_ok());
        let some = <Decision as OptionalFromRequestParts<()>>::from_request_parts(&mut parts, &());
        assert!(some.await.unwrap().is_some());
    }
}
