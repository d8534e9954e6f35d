//! What a layer and its services share ([`Shared`]: the engine, the HTTP policy, the
//! rejection responses), and the request path once the store has answered: [`proceed`]
//! to the service with the request's guards, or the refusal.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::Response;
use http::header::{CACHE_CONTROL, HeaderValue, RETRY_AFTER, WWW_AUTHENTICATE};
use http::request::Parts;

use crate::engine::Engine;
use crate::limiter::{Applied, Calls, Handle, Limiter, LimiterError};
use crate::middleware::body::AfterBody;
use crate::middleware::guard::{ChargeGuard, DelayGuard, HeldGuard, PendingCharge};
use crate::middleware::handles::Handles;
use crate::middleware::routed::PaceGuard;
use crate::middleware::settle::SettleGuard;
use crate::model::decision::Decision;
use crate::observe::offenders::RefusedKey;
use crate::store::{Op, Statuses, Store};
use crate::web::headers::{self, Fields};
use crate::web::hooks::Keys;
use crate::web::policy::{Next, Policy, Prepared};
use crate::web::response::{OnRejection, Rejection};

/// Everything a layer and its services share.
pub(crate) struct Shared<St: Store, R> {
    /// The limits and their store; the request guards and limiter handles keep it too.
    pub(crate) engine: Arc<Engine<St>>,
    pub(crate) policy: Policy,
    pub(crate) on_rejection: R,
    /// How refused gRPC calls are answered; `None`: as any HTTP request.
    #[cfg(feature = "grpc")]
    pub(crate) grpc: Option<crate::middleware::grpc::Grpc>,
}

impl<St: Store, R> Shared<St, R> {
    /// The response to a request refused before the store was asked, with the
    /// `WWW-Authenticate` challenge of a 401 for a missing key if the response has none.
    pub(crate) fn early<B>(&self, rejection: &Rejection<'_>) -> Response<B>
    where
        R: OnRejection<B>,
    {
        let mut response = self.on_rejection.on_rejection(rejection);
        if let Rejection::MissingKey {
            challenge: Some(challenge),
            ..
        } = rejection
            && response.status() == http::StatusCode::UNAUTHORIZED
            // Checked when the layer was built; a response without it is still a 401.
            && let Ok(value) = HeaderValue::from_str(challenge)
        {
            response
                .headers_mut()
                .entry(WWW_AUTHENTICATE)
                .or_insert(value);
        }
        // A banned key: how long the ban has left.
        if let Some(wait) = rejection.retry_after() {
            let headers = response.headers_mut();
            headers.entry(RETRY_AFTER).or_insert_with(|| {
                headers::retry_after(wait, self.policy.options.retry_format, SystemTime::now)
            });
            headers
                .entry(CACHE_CONTROL)
                .or_insert_with(|| HeaderValue::from_static("no-store"));
        }
        response
    }

    /// The response to a refused request, with the layer's rate-limit fields (IETF lists
    /// appended to any the response has; single-valued styles only if absent), and
    /// `Retry-After` and `Cache-Control` if absent.
    fn refuse<B>(&self, rejection: &Rejection<'_>, fields: Fields) -> Response<B>
    where
        R: OnRejection<B>,
    {
        let mut response = self.on_rejection.on_rejection(rejection);
        if self.policy.options.bare_refusals {
            return response;
        }
        let headers = response.headers_mut();
        fields.apply(headers);
        // One lookup each (`entry`), not a lookup and an insert.
        if let Some(wait) = rejection.retry_after() {
            headers.entry(RETRY_AFTER).or_insert_with(|| {
                headers::retry_after(wait, self.policy.options.retry_format, SystemTime::now)
            });
        }
        headers
            .entry(CACHE_CONTROL)
            .or_insert_with(|| HeaderValue::from_static("no-store"));
        response
    }
}

/// One version of what a layer's requests share (fixed for a built layer, replaced whole
/// on each reload of rules), and the [`Limiter`] handles it puts in their extensions, one
/// per thread slot ([`Handles`]): no request writes a reference count that every core
/// writes.
pub(crate) struct Version<St: Store, R> {
    pub(crate) shared: Arc<Shared<St, R>>,
    handles: Handles,
}

impl<St: Store, R> Version<St, R> {
    pub(crate) fn new(shared: Arc<Shared<St, R>>) -> Self {
        Self {
            shared,
            handles: Handles::new(),
        }
    }
}

impl<St: Store, R: Send + Sync + 'static> Version<St, R> {
    /// A limiter handle for a request on this version.
    pub(crate) fn limiter(&self) -> Limiter {
        self.handles.limiter(&self.shared)
    }
}

/// A request the limits let through: the fields for its response, the charges to settle
/// when it comes, and in delay mode how long it waits first (and what it holds meanwhile).
pub(crate) struct Passed<St: Store> {
    pub(crate) fields: Fields,
    pub(crate) charge: PendingCharge<St>,
    /// (Boxed: delay mode is rare, and `Passed` is moved on every request.)
    pub(crate) delay: Option<(Duration, Box<DelayGuard<St>>)>,
    /// What the request holds until its response body ends (in-flight slots).
    pub(crate) after: Option<Box<dyn AfterBody>>,
    /// The pacers of its request body (limits of bytes received on its route).
    pub(crate) upload: Vec<crate::limiter::pace::Pacer>,
}

impl<St: Store> Passed<St> {
    /// `body`, paced by the request's limits of bytes received, if it has any.
    #[inline]
    pub(crate) fn pace<B: 'static>(&mut self, body: B) -> B {
        if self.upload.is_empty() {
            body
        } else {
            crate::middleware::routed::paced_request(body, std::mem::take(&mut self.upload))
        }
    }
}

/// What follows the store's answer: the request passes, or the refusal.
pub(crate) fn proceed<St, R, B>(
    version: &Version<St, R>,
    prepared: &mut Prepared,
    statuses: Statuses,
    parts: &mut Parts,
    keys: &(impl Keys + ?Sized),
) -> Result<Passed<St>, Response<B>>
where
    St: Store,
    R: OnRejection<B> + Send + Sync + 'static,
{
    let shared = &version.shared;
    let policy = &shared.policy;
    // A key another instance banned: refused by its blocked bucket, answered as the ban
    // it is (as a ban this instance knew is, before the store).
    if let Some(rejection) =
        policy.banned_by_store(&shared.engine, prepared, &statuses, parts, keys)
    {
        return Err(shared.early(&rejection));
    }
    // Settled costs: the limits whose estimate was taken (read before `finish` takes the
    // statuses).
    let settle = prepared.settle_keys.as_deref().and_then(|keys| {
        SettleGuard::for_request(&shared.engine, policy, &prepared.plan, keys, &statuses)
    });
    // In-flight limits: the units taken, held until the response body ends.
    let held = policy.held(prepared, &statuses);
    match policy.finish(&shared.engine, prepared, statuses, parts, keys) {
        Next::Proceed {
            fields,
            charged,
            delay,
        } => {
            insert_limiter(version, parts);
            let engine = &shared.engine;
            let after = held.map(|held| HeldGuard::boxed(engine, &prepared.plan, held));
            let delay = delay.map(|d| {
                (
                    d.wait,
                    Box::new(DelayGuard::new(engine, &prepared.plan, *d)),
                )
            });
            let charge = ChargeGuard::new(
                engine,
                policy,
                &prepared.plan,
                prepared.charge_keys.take(),
                &charged,
            );
            let (paced, upload) = match prepared.paced.take() {
                None => (None, Vec::new()),
                Some(paced) => PaceGuard::pacers(
                    || version.limiter(),
                    paced.into_iter().map(|(i, key)| {
                        let stream = &engine.bounds[i].spec.stream;
                        let (unit, direction) = (stream.unit.unwrap_or(1), stream.direction);
                        (
                            engine.bounds[i].name,
                            unit,
                            direction.unwrap_or_default(),
                            key,
                        )
                    }),
                    policy.hooks.audit.as_ref().map(|a| a.for_stream(parts)),
                ),
            };
            let after = crate::middleware::settle::chain(after, settle);
            Ok(Passed {
                fields,
                charge,
                delay,
                after: crate::middleware::settle::chain(after, paced),
                upload,
            })
        }
        Next::Refuse {
            decision,
            unavailable,
            wait,
            fields,
        } => {
            if !unavailable {
                // Bans count the refusals of their limits (never a banned request's:
                // those are refused before the store).
                if policy.groups[prepared.group].banned {
                    offended(&shared.engine, &policy.hooks, &decision, prepared, keys);
                }
                policy.hooks.refused(
                    prepared.plan.iter().map(|p| p.bound),
                    &decision,
                    wait,
                    parts,
                    keys,
                );
            }
            let rejection = Rejection::refused(
                &decision,
                unavailable,
                wait,
                policy.options.unavailable_retry,
            );
            #[cfg(feature = "grpc")]
            if let Some(grpc) = &shared.grpc
                && let Some(content_type) = grpc.answer_type(parts)
            {
                return Err(crate::middleware::grpc::refuse(
                    grpc,
                    &shared.on_rejection,
                    content_type,
                    &rejection,
                    fields,
                ));
            }
            Err(shared.refuse(&rejection, fields))
        }
    }
}

/// Counts the refusals of a request's limits that ban (see [`Engine::offended`]); a ban
/// that began is told to the hooks.
#[inline(never)]
fn offended<St: Store>(
    engine: &Engine<St>,
    hooks: &crate::web::hooks::Hooks,
    decision: &Decision,
    prepared: &Prepared,
    keys: &(impl Keys + ?Sized),
) {
    for (i, (l, p)) in decision.limits().zip(&prepared.plan).enumerate() {
        if l.denies()
            && let Some(key) = keys.key(i)
            && let Some(began) = engine.offended(p.bound, key)
        {
            hooks.ban_began(l.name, key, began.level);
        }
    }
}

/// Puts the [`Limiter`] in the request's extensions, if the layer does (opt-in:
/// `.limiter_extension(true)`): the handle of the calling thread's slot (see [`Version`]).
#[inline]
pub(crate) fn insert_limiter<St: Store, R: Send + Sync + 'static>(
    version: &Version<St, R>,
    parts: &mut Parts,
) {
    if version.shared.policy.options.limiter_extension {
        parts.extensions.insert(version.limiter());
    }
}

/// A layer's limiter reaches its engine, and its refusal hooks for the top offenders.
impl<St: Store, R: Send + Sync + 'static> Handle for Shared<St, R> {
    fn apply(&self, op: Op, calls: Calls<'_>, max_wait: Duration) -> Result<Applied, LimiterError> {
        self.engine.apply(op, calls, max_wait)
    }

    fn names(&self) -> Vec<&'static str> {
        self.engine.names()
    }

    fn top_refused(&self, limit: &str, n: usize) -> Result<Vec<RefusedKey>, LimiterError> {
        let index = self
            .engine
            .find(limit)
            .ok_or_else(|| LimiterError::unknown(limit, self.engine.names()))?;
        Ok(self.policy.hooks.top_refused(index, n))
    }

    fn can_settle(&self, limit: &str) -> Result<(), LimiterError> {
        self.engine.can_settle(limit)
    }

    fn bans(&self, limit: &str) -> Result<Vec<crate::engine::ban::BannedKey>, LimiterError> {
        self.engine.handle_bans(limit)
    }

    fn set_ban(
        &self,
        limit: &str,
        key: crate::model::key::Key,
        length: Option<Duration>,
    ) -> Result<(), LimiterError> {
        self.engine.handle_set_ban(limit, key, length)
    }

    fn algorithm(&self, limit: &str) -> Option<crate::algo::algorithm::Algorithm> {
        self.engine.algorithm(limit)
    }

    fn paced(&self, limit: &str) -> Option<crate::limiter::Paced> {
        self.engine.paced(limit)
    }

    fn key_for(
        &self,
        limit: &str,
        parts: &Parts,
    ) -> Option<Result<Option<crate::model::key::Key>, LimiterError>> {
        let Some(index) = self.engine.find(limit) else {
            return Some(Err(LimiterError::unknown(limit, self.engine.names())));
        };
        Some(self.policy.key_for(index, parts))
    }
}
