//! A call to the backend: its timeout (sized by the round trips observed), the breaker
//! glue (when a failure or a timeout counts against it), and its answer settled into
//! statuses (the deny cache, the write-back list and held units updated).

use std::future::Future;
use std::time::Duration;

use smallvec::SmallVec;

use super::deny::quota_salt;
use super::{Part, Resilient};
use crate::base::clock::Clock;
use crate::model::decision::Status;
use crate::model::policy::Mode;
use crate::store::{Backend, Op, Statuses, StoreError};

/// How long the answer of a check that timed out is still waited for, in the background.
pub(super) const LATE_FOR: Duration = Duration::from_secs(10);

/// A backend silent this long (no call answered) is failing: timeouts count against the
/// breaker from then on.
const QUIET_NS: u64 = 1_000_000_000;

impl<B: Backend> Resilient<B> {
    pub(super) async fn run<F>(self, op: Op, parts: SmallVec<[Part; 4]>, call: F) -> Statuses
    where
        F: Future<Output = Result<Statuses, StoreError>> + Send + 'static,
    {
        let inner = &*self.inner;
        let sent_at = inner.clock.now();
        self.sending(sent_at);
        let timeout = self.call_timeout();
        let mut call = Box::pin(call);
        let (result, late) = match tokio::time::timeout(timeout, &mut call).await {
            Ok(result) => {
                if result.is_ok() {
                    self.answered(sent_at);
                }
                (result, false)
            }
            Err(_) => (
                Err(StoreError::new(format!("no answer within {timeout:?}"))),
                true,
            ),
        };
        let late_call = late.then_some(call);
        {
            use crate::observe::probe::ErrorKind;
            let m = &inner.metrics;
            m.duration(inner.clock.now().saturating_sub(sent_at));
            match &result {
                Err(_) if late => m.error(ErrorKind::Timeout),
                Err(_) => m.error(ErrorKind::Backend),
                Ok(s) if s.len() != parts.len() => m.error(ErrorKind::Protocol),
                Ok(_) => {}
            }
        }
        let name = inner.backend.name();
        if matches!(op, Op::Refund | Op::Credit | Op::Reset)
            && let Some(cache) = &inner.deny_cache
        {
            // Applied (or not): checks sent until now may have been decided before it.
            for p in &parts {
                if let Some(table) = &p.deny {
                    self.given_back(cache, table, &p.key, quota_salt(&p.quota));
                }
            }
        }
        let statuses = self.settle(op, &parts, sent_at, result, late, name);
        inner.metrics.breaker(inner.breaker.is_open());
        if let Some(call) = late_call
            && op == Op::Check
        {
            self.follow_late(call, parts, statuses.clone(), sent_at);
        }
        statuses
    }

    /// A timed-out check the backend granted while the failure policy refused it: the
    /// request did not proceed, so the backend's tokens go back (`Op::Refund`, GCRA).
    async fn give_back_late(&self, parts: &[Part], local: &Statuses, server: &Statuses) {
        use super::refuses;
        let refused_here = local.iter().zip(parts).any(|(s, p)| refuses(s, p.mode));
        let passed_there = !server.iter().zip(parts).any(|(s, p)| refuses(s, p.mode));
        if !(refused_here && passed_there) {
            return;
        }
        let timeout = self.call_timeout();
        for p in parts {
            if p.algorithm != crate::algo::algorithm::Algorithm::Gcra || p.cost == 0 {
                continue;
            }
            let call = p.remote.remote.call(
                Op::Refund,
                &p.key,
                p.quota,
                p.algorithm,
                p.cost,
                Duration::ZERO,
            );
            let _ = tokio::time::timeout(timeout, call).await;
        }
    }

    /// A check that timed out is still on its way: its answer, when it comes (within
    /// [`LATE_FOR`]), is a round trip observed (so the timeout grows to what the backend
    /// takes) and says what the backend did. An item `Share` granted locally that the
    /// backend refused was granted beyond the limit's count: it is owed, and charged back
    /// at once; a check the backend granted and the policy refused gives its tokens back.
    fn follow_late<F>(
        &self,
        call: std::pin::Pin<Box<F>>,
        parts: SmallVec<[Part; 4]>,
        local: Statuses,
        sent_at: u64,
    ) where
        F: Future<Output = Result<Statuses, StoreError>> + Send + 'static,
    {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let this = self.clone();
        runtime.spawn(async move {
            let Ok(Ok(server)) = tokio::time::timeout(LATE_FOR, call).await else {
                return;
            };
            if server.len() != parts.len() {
                return;
            }
            this.answered(sent_at);
            if this.owe_late(&parts, &local, &server) {
                this.repay();
            }
            this.give_back_late(&parts, &local, &server).await;
        });
    }

    /// A call sent at `sent_at` was answered now: a round trip observed, and the backend
    /// answers.
    pub(super) fn answered(&self, sent_at: u64) {
        let inner = &*self.inner;
        let now = inner.clock.now();
        inner.rtt.observe(now.saturating_sub(sent_at));
        inner
            .answered_at
            .fetch_max(now, std::sync::atomic::Ordering::Relaxed);
    }

    /// A call is sent at `at`: the first one starts the time the backend has to answer
    /// before it is silent (see [`silent`](Self::silent)).
    pub(super) fn sending(&self, at: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        let inner = &*self.inner;
        if !inner.called.load(Relaxed) && !inner.called.swap(true, Relaxed) {
            inner.answered_at.fetch_max(at, Relaxed);
        }
    }

    /// Whether the backend has been silent for `QUIET` (no call answered, nor since the
    /// first call was sent): only then does a timeout count against the breaker. A
    /// timeout while calls are answered is this side being slow (a busy instance, a queue
    /// of calls), not a backend that does not answer; and a store that has not heard from
    /// its backend yet gives it the time to answer its first calls and its own probe
    /// (whose round trip sizes the timeout) before it calls it failing, however long it
    /// waited for its first request (issue 41, item 8: servers started a while before
    /// their load, Redis 30 ms away, opened their breakers on their first calls).
    pub(super) fn silent(&self) -> bool {
        let inner = &*self.inner;
        let heard = inner.answered_at.load(std::sync::atomic::Ordering::Relaxed);
        inner.clock.now().saturating_sub(heard) >= QUIET_NS
    }

    /// How long the next call may take: the configured timeout, or what the round trips
    /// observed (and the backend's own, e.g. Redis's probe) say when that is longer.
    pub(super) fn call_timeout(&self) -> Duration {
        let inner = &*self.inner;
        inner.rtt.timeout(inner.timeout, inner.backend.round_trip())
    }

    /// How long a call usually takes (see [`RoundTrips::usual`](crate::store::rtt::RoundTrips::usual)).
    pub(super) fn usual_round_trip(&self) -> Duration {
        let inner = &*self.inner;
        inner.rtt.usual(inner.timeout, inner.backend.round_trip())
    }

    /// The statuses of a call's answer (`late`: it timed out; the request follows its
    /// policy, and the timeout counts against the breaker only if no call was answered
    /// since this one was sent).
    fn settle(
        &self,
        op: Op,
        parts: &[Part],
        sent_at: u64,
        result: Result<Statuses, StoreError>,
        late: bool,
        name: &'static str,
    ) -> Statuses {
        let inner = &*self.inner;
        match result {
            Ok(statuses) if statuses.len() == parts.len() => {
                inner.breaker.success(name);
                self.repay();
                match op {
                    Op::Check => {
                        self.hold_granted(parts, &statuses);
                        self.observe_traffic(parts, &statuses, sent_at);
                        for (p, s) in parts.iter().zip(&statuses) {
                            if let Status::Checked(o) = s
                                && p.mode == Mode::Enforce
                            {
                                if !o.is_allowed() {
                                    self.remember_denial(p, sent_at, o);
                                }
                                p.remote.observe(&p.key, &p.quota, sent_at, o);
                                // Refused, or granted its last token: spent.
                                self.remember_refusal(p, sent_at, o);
                            }
                        }
                    }
                    // Only once applied: a block the backend did not make must not refuse
                    // a key the backend lets pass.
                    Op::Block(d) => {
                        for p in parts {
                            self.remember_block(p, sent_at, d);
                        }
                    }
                    _ => {}
                }
                statuses
            }
            Ok(statuses) => {
                let error = format!("{} statuses for {} items", statuses.len(), parts.len());
                tracing::debug!(%error, "tollgate: {name} answered wrongly");
                inner.breaker.failure(inner.clock.now(), name, &error);
                self.on_failure(op, parts, false)
            }
            Err(error) => {
                tracing::debug!(%error, "tollgate: {name} call failed");
                if !late || self.silent() {
                    inner.breaker.failure(inner.clock.now(), name, &error);
                }
                // A call that timed out may have been applied: nothing is owed for it.
                self.on_failure_busy(op, parts, !late, late)
            }
        }
    }
}

#[cfg(test)]
#[cfg(feature = "testing")]
mod tests {
    use std::time::Duration;

    use crate::algo::algorithm::Algorithm;
    use crate::algo::quota::Quota;
    use crate::model::decision::Status;
    use crate::model::key::Key;
    use crate::model::policy::FailurePolicy;
    use crate::store::{Checked, Item, Op, Store};
    use crate::testing::SimBackend;

    /// A check that timed out, which the failure policy refused but the shared store
    /// granted when it arrived: the request did not proceed, so its token goes back. A
    /// window's count is not given back: the refund could land in the next window, on a
    /// count that never held the request. A request the policy let through keeps the
    /// token the store took.
    #[tokio::test(start_paused = true)]
    async fn a_late_grant_the_policy_refused_gives_its_token_back_to_a_bucket_only() {
        use FailurePolicy::{Allow, Deny};
        for (algorithm, policy, here, expected) in [
            (Algorithm::Gcra, Deny, Status::FailedClosed, 4),
            (Algorithm::fixed_window(), Deny, Status::FailedClosed, 3),
            (Algorithm::Gcra, Allow, Status::FailedOpen, 3),
        ] {
            let backend = SimBackend::builder()
                .latency(Duration::from_millis(600))
                .build();
            let store = backend.store().timeout(Duration::from_millis(10));
            let table = store.table("api");
            let check = || async {
                // 5 an hour: nothing refills during the test.
                let item = Item::new(&table, Key::from_part("k"), Quota::per_hour(5), 1)
                    .algorithm(algorithm)
                    .on_failure(policy);
                match store.apply(Op::Check, &[item]) {
                    Checked::Ready(s) => s[0],
                    Checked::Pending(f) => f.await[0],
                }
            };
            let timed_out = check().await;
            assert_eq!(timed_out, here, "{algorithm:?}");
            // A round trip of 1.2 s against a timeout of at most 1 s (three times the
            // round trip the backend reports, capped). The late answer comes 1.2 s after
            // the send; the refund reaches the server 600 ms later.
            tokio::time::sleep(Duration::from_millis(1_200)).await;
            backend.set_latency(Duration::ZERO);
            let next = check().await;
            let left = next.outcome().map(|o| o.remaining());
            assert_eq!(left, Some(expected), "{algorithm:?}: {next:?}");
        }
    }

    /// A backend that answers every call with no status.
    #[derive(Clone)]
    struct Short;

    impl crate::store::Backend for Short {
        type Table = ();
        type Future = std::future::Ready<Result<crate::store::Statuses, crate::store::StoreError>>;
        fn table(&self, _: &str) {}
        fn apply(&self, _: Op, _: &[Item<'_, ()>]) -> Self::Future {
            std::future::ready(Ok(crate::store::Statuses::new()))
        }
    }

    /// An answer with the wrong number of statuses is a failure: the request follows its
    /// failure policy, and the breaker counts it.
    #[tokio::test]
    async fn an_answer_of_the_wrong_length_follows_the_failure_policy() {
        let store = crate::store::Resilient::new(Short).breaker(1, Duration::from_secs(60));
        let table = store.table("api");
        let item = Item::new(&table, Key::from_part("k"), Quota::per_hour(5), 1)
            .on_failure(FailurePolicy::Deny);
        let statuses = match store.apply(Op::Check, &[item]) {
            Checked::Ready(s) => s,
            Checked::Pending(f) => f.await,
        };
        assert_eq!(statuses.as_slice(), [Status::FailedClosed]);
        assert!(store.is_unavailable(), "one failure opens a breaker of one");
    }

    /// A lease call answered with the wrong number of statuses is a failure when it
    /// comes: the request waiting for the lease is decided then (by its failure policy),
    /// not when its wait for the lease runs out.
    #[tokio::test(start_paused = true)]
    async fn a_lease_answered_with_the_wrong_length_fails_the_waiting_request_at_once() {
        let store = crate::store::Resilient::new(Short).breaker(1, Duration::from_secs(60));
        let table = store.table("api");
        let item = Item::new(&table, Key::from_part("k"), Quota::per_hour(5), 1)
            .on_failure(FailurePolicy::Deny)
            .lease(Some(crate::model::lease::Lease::auto()));
        let start = tokio::time::Instant::now();
        let statuses = match store.apply(Op::Check, &[item]) {
            Checked::Ready(s) => s,
            Checked::Pending(f) => f.await,
        };
        assert_eq!(statuses.as_slice(), [Status::FailedClosed]);
        assert_eq!(
            start.elapsed(),
            Duration::ZERO,
            "decided when the lease failed"
        );
        assert!(store.is_unavailable());
    }

    /// Lease calls to a backend whose round trip (200 ms, as it reports before any call
    /// was answered) is more than half the time the bucket takes to fill (100 ms) hold
    /// no request that comes in their first 150 ms: such a request asks the backend
    /// itself. Before, the first lease call was thought usual for the configured timeout
    /// (50 ms) only, so requests waited for it, and then asked the backend when it came
    /// too small for them: 380 ms, nearly two round trips.
    #[tokio::test(start_paused = true)]
    async fn a_far_backends_lease_calls_hold_no_request_past_one_round_trip() {
        let backend = SimBackend::builder()
            .latency(Duration::from_millis(100))
            .build();
        let store = backend.store();
        let table = store.table("api");
        let check = || async {
            let item = Item::new(
                &table,
                Key::from_part("k"),
                Quota::per_second(1_000).burst(100),
                1,
            )
            .lease(Some(crate::model::lease::Lease::auto()));
            match store.apply(Op::Check, &[item]) {
                Checked::Ready(s) => s[0],
                Checked::Pending(f) => f.await[0],
            }
        };
        // 500 requests a second, half the limit, for 400 ms.
        let requests = (0..200u64).map(|i| async move {
            tokio::time::sleep(Duration::from_millis(2 * i)).await;
            let started = tokio::time::Instant::now();
            let s = check().await;
            (
                s.outcome().is_some_and(|o| o.is_allowed()),
                started.elapsed(),
            )
        });
        let at = futures_util::future::join_all(requests).await;
        assert!(at.iter().all(|&(allowed, _)| allowed));
        let slowest = at.iter().map(|&(_, d)| d).max().unwrap();
        // Those that come in a lease call's last 50 ms wait for it, and ask the backend
        // if it is too small for them: at most one round trip and half the fill time.
        assert!(slowest <= Duration::from_millis(250), "{slowest:?}");
        let waited = at
            .iter()
            .filter(|&&(_, d)| d > Duration::from_millis(200))
            .count();
        assert!(waited > 0, "no request waited for a lease");
    }
}
