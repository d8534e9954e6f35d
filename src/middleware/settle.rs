//! [`SettleGuard`]: what a request admitted on estimates carries to its response body's
//! end, where each settled limit's actual cost is read and the difference taken or given
//! back, once.

use std::sync::Arc;

use http::{Extensions, HeaderMap, StatusCode};
use smallvec::SmallVec;

use crate::algo::quota::Quota;
use crate::engine::{ChargeKeys, Engine, Plan};
use crate::middleware::body::{AfterBody, Ending};
use crate::model::key::Key;
use crate::store::{Statuses, Store};
use crate::web::policy::Policy;
use crate::web::settle::Settle;

/// The limits of one request that settle when its response ends. Each is settled at most
/// once: at the body's end (complete: the value from the trailers or the head, or the
/// estimate), or when the body fails or is dropped (the value known from the head, else
/// the estimate stands: nothing to do). A guard dropped unended (the service failed, the
/// response never came) leaves every estimate as the cost.
pub(crate) struct SettleGuard<St: Store> {
    engine: Arc<Engine<St>>,
    pending: SmallVec<[Pending; 1]>,
}

struct Pending {
    bound: usize,
    key: Key,
    quota: Quota,
    estimate: u32,
    settle: Settle,
    /// The actual cost found so far.
    actual: Option<u32>,
}

impl<St: Store> SettleGuard<St> {
    /// A guard for the settled limits (`keys`: plan indices and keys) whose estimate the
    /// store took (`statuses`, before the policy reads them), if any.
    pub(crate) fn for_request(
        engine: &Arc<Engine<St>>,
        policy: &Policy,
        plan: &Plan,
        keys: &ChargeKeys,
        statuses: &Statuses,
    ) -> Option<Box<dyn AfterBody>> {
        let pending: SmallVec<[Pending; 1]> = keys
            .iter()
            .filter(|(i, _)| {
                statuses
                    .get(*i)
                    .and_then(|s| s.outcome())
                    .is_some_and(|o| o.is_allowed())
            })
            .filter_map(|(i, key)| {
                let p = &plan[*i];
                let settle = policy.limits[p.bound].limit.settle.clone()?;
                Some(Pending {
                    bound: p.bound,
                    key: key.clone(),
                    quota: p.quota,
                    estimate: p.cost,
                    settle,
                    actual: None,
                })
            })
            .collect();
        (!pending.is_empty()).then(|| {
            Box::new(Self {
                engine: engine.clone(),
                pending,
            }) as Box<dyn AfterBody>
        })
    }
}

impl<St: Store> AfterBody for SettleGuard<St> {
    fn head(&mut self, status: StatusCode, headers: &HeaderMap, extensions: &Extensions) {
        for p in &mut self.pending {
            p.actual = p.settle.from_head(status, headers, extensions);
        }
    }

    fn trailers(&mut self, trailers: &HeaderMap) {
        for p in &mut self.pending {
            if let Some(actual) = p.settle.from_trailers(trailers) {
                p.actual = Some(actual);
            }
        }
    }

    fn ended(&mut self, _ending: Ending) {
        // Complete, failed or dropped: what is known is settled; nothing known, the
        // estimate stands.
        for p in std::mem::take(&mut self.pending) {
            if let Some(actual) = p.actual {
                self.engine
                    .settle_in_background(p.bound, p.key, p.quota, p.estimate, actual);
            }
        }
    }
}

/// Two after-body guards as one (a request with in-flight units and settled costs):
/// each is told the head, the trailers and the end.
struct Both(Box<dyn AfterBody>, Box<dyn AfterBody>);

impl AfterBody for Both {
    fn head(&mut self, status: StatusCode, headers: &HeaderMap, extensions: &Extensions) {
        self.0.head(status, headers, extensions);
        self.1.head(status, headers, extensions);
    }

    fn trailers(&mut self, trailers: &HeaderMap) {
        self.0.trailers(trailers);
        self.1.trailers(trailers);
    }

    fn ended(&mut self, ending: Ending) {
        self.0.ended(ending);
        self.1.ended(ending);
    }

    fn take_pacers(&mut self) -> Vec<crate::limiter::pace::Pacer> {
        let mut pacers = self.0.take_pacers();
        pacers.append(&mut self.1.take_pacers());
        pacers
    }
}

/// `a` and `b`, whichever exist, as one guard.
#[inline]
pub(crate) fn chain(
    a: Option<Box<dyn AfterBody>>,
    b: Option<Box<dyn AfterBody>>,
) -> Option<Box<dyn AfterBody>> {
    match (a, b) {
        (Some(a), Some(b)) => Some(Box::new(Both(a, b))),
        (a, b) => a.or(b),
    }
}
