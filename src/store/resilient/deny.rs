//! The deny cache: a key the backend refused is refused here, without a call, until it
//! could pass a request of cost 1 (see [`Resilient`]); tokens given
//! back (a refund, a credit, a reset) clear it, a block the backend applied raises it.

use std::time::Duration;

use smallvec::SmallVec;

use super::{Part, Resilient, ResilientTable};
use crate::algo::gcra::{self, Params};
use crate::algo::quota::Quota;
use crate::base::clock::{Clock, SharedClock};
use crate::model::decision::{Outcome, Status};
use crate::model::key::Key;
use crate::model::policy::Mode;
use crate::store::memory::{MemoryStore, MemoryTable};
use crate::store::{Backend, Item, Op, Statuses};

/// A fingerprint of a quota: a denial remembered under one quota says nothing about
/// another (after a plan upgrade the key may pass at once).
pub(super) fn quota_salt(q: &Quota) -> u64 {
    q.t_ns().wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ q.burst_size().rotate_left(29)
}

/// Salts a key's "tokens given back at" marker apart from its denial marker.
const GIVEN_BACK: u64 = 0x6a09_e667_f3bc_c909;

/// What a remembered denial tells the client: no token for `wait_ns`.
pub(super) fn cached_outcome(quota: &Quota, cost: u32, wait_ns: u64) -> Outcome {
    let params = Params::new(quota.t_ns(), quota.burst_size());
    let verdict = if u64::from(cost) > quota.burst_size() {
        gcra::Admission::Never
    } else {
        gcra::Admission::Denied {
            retry_after: wait_ns + u64::from(cost - 1) * params.t(),
        }
    };
    // One token is free at TAT + T - tau, `wait_ns` from now: the TAT is this far off.
    let reset_after = (wait_ns + params.tau()).saturating_sub(params.t());
    Outcome::new(verdict, reset_after, params, 1)
}

impl<B: Backend> Resilient<B> {
    /// The statuses of a call refused by a remembered denial, without asking the backend.
    ///
    /// A remembered denial says when the key's next token can exist at the earliest. Once
    /// that instant has come, the requests that arrive before the backend's next answer
    /// would all be sent (one round trip is many requests on a hot key refused far over its
    /// limit); instead each request claims its tokens from the remembered instant, as the
    /// backend's bucket would take them, and only requests that find tokens are sent: a
    /// refused key costs the backend about one call per token it can grant. The claims only
    /// follow this instance's own requests, so the backend's bucket is never behind them,
    /// and nothing the backend would allow is refused here.
    pub(super) fn cached_denial(
        &self,
        items: &[Item<'_, ResilientTable<B::Table>>],
    ) -> Option<Statuses> {
        let cache = self.inner.deny_cache.as_ref()?;
        // A reservation may pass where a check is refused: the store decides. So it does
        // for a limit that bans: its refusal says whether the key is banned (`Item::bans`),
        // which another instance may have done since the denial was remembered (and each
        // of its refusals counts towards a ban in the store anyway).
        fn remembered<'a, T>(item: &'a Item<'_, ResilientTable<T>>) -> Option<&'a MemoryTable> {
            let speaks = item.mode == Mode::Enforce
                && item.cost > 0
                && item.max_wait.is_zero()
                && !item.bans;
            item.table.deny.as_ref().filter(|_| speaks)
        }
        let refuse = |at: usize, wait: u64| -> Statuses {
            items[at].table.deny_hits.increment(1);
            let mut statuses: Statuses = items.iter().map(|_| Status::Unchecked).collect();
            let item = &items[at];
            statuses[at] = Status::Checked(cached_outcome(&item.quota, item.cost, wait));
            statuses
        };
        // A live denial refuses the request: read only.
        let mut refused = false;
        let statuses = items
            .iter()
            .map(|item| {
                let table = remembered(item)?;
                let (until, now) = cache.marker(table, &item.key, quota_salt(&item.quota));
                if until <= now {
                    return None;
                }
                refused = true;
                item.table.deny_hits.increment(1);
                Some(Status::Checked(cached_outcome(
                    &item.quota,
                    item.cost,
                    until - now,
                )))
            })
            .map(|s| s.unwrap_or(Status::Unchecked))
            .collect();
        if refused {
            return Some(statuses);
        }
        // Otherwise the request claims its tokens; one it cannot have (a concurrent request
        // took them) refuses it, and the claims made for its other limits go back.
        let mut claimed: SmallVec<[(usize, u64); 4]> = SmallVec::new();
        for (i, item) in items.iter().enumerate() {
            let Some(table) = remembered(item) else {
                continue;
            };
            let t = u64::try_from(item.quota.emission_interval().as_nanos()).unwrap_or(u64::MAX);
            let step = t.saturating_mul(u64::from(item.cost));
            let tau = t.saturating_mul(item.quota.burst_size().saturating_sub(1));
            let salt = quota_salt(&item.quota);
            match cache.claim_marker(table, &item.key, salt, step, tau) {
                (Ok(true), _) => claimed.push((i, step)),
                (Ok(false), _) => {}
                (Err(until), now) => {
                    for &(j, step) in &claimed {
                        let item = &items[j];
                        let table = remembered(item).expect("claimed");
                        cache.unclaim_marker(table, &item.key, quota_salt(&item.quota), step);
                    }
                    return Some(refuse(i, until.saturating_sub(now)));
                }
            }
        }
        None
    }

    /// Keeps the deny cache true to an operation other than a check made through this
    /// store, before it is sent: tokens given back clear a remembered denial. (A block is
    /// remembered once the backend has applied it, see [`run`](Self::run).)
    pub(super) fn update_deny_cache(&self, op: Op, items: &[Item<'_, ResilientTable<B::Table>>]) {
        let Some(cache) = &self.inner.deny_cache else {
            return;
        };
        if !matches!(op, Op::Refund | Op::Credit | Op::Reset) {
            return;
        }
        for item in items {
            if let Some(table) = &item.table.deny {
                self.given_back(cache, table, &item.key, quota_salt(&item.quota));
            }
        }
    }

    /// Remembers a block the backend applied: refused until `d` from `sent_at` (never
    /// later than the backend's own end of the block).
    pub(super) fn remember_block(&self, part: &Part, sent_at: u64, d: Duration) {
        let (Some(cache), Some(table)) = (&self.inner.deny_cache, &part.deny) else {
            return;
        };
        if part.algorithm.is_window() {
            return; // window denials are not remembered (see `remember_denial`)
        }
        let d = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        cache.raise_marker(
            table,
            &part.key,
            quota_salt(&part.quota),
            sent_at.saturating_add(d),
        );
    }

    /// Tokens of `key` are being given back (when the refund or reset is issued, and again
    /// when the backend has applied it): forgets its remembered denial, and notes the time,
    /// so that a denial the backend decided before the tokens came back, but whose answer
    /// is processed after, is not remembered (see [`remember_denial`](Self::remember_denial)).
    pub(super) fn given_back(
        &self,
        cache: &MemoryStore<SharedClock>,
        table: &MemoryTable,
        key: &Key,
        salt: u64,
    ) {
        cache.clear_marker(table, key, salt);
        // Kept for one timeout: an answer to a check sent before now comes within it, or
        // is dropped.
        let until = self.inner.clock.now().saturating_add(self.timeout_ns());
        cache.raise_marker(table, key, salt ^ GIVEN_BACK, until);
    }

    fn timeout_ns(&self) -> u64 {
        u64::try_from(self.inner.timeout.as_nanos()).unwrap_or(u64::MAX)
    }

    /// Remembers that `part` cannot pass a request of cost 1 for the outcome's wait,
    /// counted from `sent_at` — unless tokens of the key were given back since `sent_at`:
    /// the backend may have decided before they came back.
    pub(super) fn remember_denial(&self, part: &Part, sent_at: u64, o: &Outcome) {
        let (Some(cache), Some(table)) = (&self.inner.deny_cache, &part.deny) else {
            return;
        };
        if o.remaining() > 0 || part.algorithm.is_window() {
            // A smaller request could pass; or a window limit, whose denials are not
            // remembered (its wait depends on the cost and, for a sliding window, on
            // how the previous window's weight decays).
            return;
        }
        let salt = quota_salt(&part.quota);
        let (given_back_until, _) = cache.marker(table, &part.key, salt ^ GIVEN_BACK);
        if given_back_until != 0 && sent_at <= given_back_until.saturating_sub(self.timeout_ns()) {
            return;
        }
        if let Some(wait) = o.next_after() {
            let wait = u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX);
            cache.raise_marker(table, &part.key, salt, sent_at.saturating_add(wait));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::decision::Verdict;

    #[test]
    fn cached_denials_report_the_remembered_wait() {
        let q = Quota::per_second(10); // T = 100 ms, burst 10
        let o = cached_outcome(&q, 3, 40_000_000);
        assert_eq!(
            o.verdict(),
            Verdict::Denied {
                retry_after: Duration::from_millis(240)
            }
        );
        assert_eq!(o.next_after(), Some(Duration::from_millis(40)));
        assert_eq!(o.reset_after(), Duration::from_millis(940));
        assert_eq!(cached_outcome(&q, 11, 1).verdict(), Verdict::Never);
        // A cost of the whole burst can pass once the bucket is full: a wait, not never.
        assert_eq!(
            cached_outcome(&q, 10, 40_000_000).verdict(),
            Verdict::Denied {
                retry_after: Duration::from_millis(940)
            }
        );
    }

    /// A denial remembered under one quota says nothing about another: no two of a grid
    /// of rates and bursts share a salt (a plan upgrade's key is asked again).
    #[test]
    fn no_two_quotas_of_a_grid_share_a_salt() {
        let mut seen = std::collections::HashMap::new();
        for per_second in [1, 2, 3, 5, 10, 100, 1_000, 10_000] {
            for burst in 1..=256 {
                let q = Quota::per_second(per_second).burst(burst);
                if let Some(other) = seen.insert(quota_salt(&q), (per_second, burst)) {
                    panic!("{per_second}/s burst {burst} salted as {other:?}");
                }
            }
        }
    }
}

#[cfg(test)]
#[cfg(feature = "testing")]
mod speaking {
    use std::time::Duration;

    use std::future::Future;
    use std::pin::Pin;

    use crate::algo::quota::Quota;
    use crate::model::decision::Status;
    use crate::model::key::Key;
    use crate::model::policy::Mode;
    use crate::store::resilient::Resilient;
    use crate::store::{Checked, Item, Op, Store};
    use crate::testing::SimBackend;

    type Table = <Resilient<SimBackend> as Store>::Table;

    /// The store's answer to `op` on `item`: from its remembered denial, or the backend's.
    fn ask(
        store: &Resilient<SimBackend>,
        op: Op,
        item: Item<'_, Table>,
    ) -> Pin<Box<dyn Future<Output = Status> + Send>> {
        match store.apply(op, &[item]) {
            Checked::Ready(s) => Box::pin(std::future::ready(s[0])),
            Checked::Pending(f) => Box::pin(async move { f.await[0] }),
        }
    }

    /// A backend `latency` away, its store remembering denials, and the store's table of
    /// the limit "api".
    fn set_up(latency: Duration) -> (SimBackend, Resilient<SimBackend>, Table) {
        let backend = SimBackend::builder().latency(latency).build();
        let store = backend.store().deny_cache(true);
        let table = store.table("api");
        (backend, store, table)
    }

    /// A request of key "k" costing `cost`, under `quota`.
    fn request(table: &Table, quota: Quota, cost: u32) -> Item<'_, Table> {
        Item::new(table, Key::from_part("k"), quota, cost)
    }

    /// A remembered denial refuses here only the requests it speaks for: enforced ones
    /// that take a token, refused at once. A shadow request, a look (cost 0), a request
    /// that may wait, and a request of a limit that bans all ask the shared store.
    #[tokio::test(start_paused = true)]
    async fn a_remembered_denial_speaks_only_for_enforced_requests_refused_at_once() {
        let (backend, store, table) = set_up(Duration::ZERO);
        let item = || request(&table, Quota::per_hour(1), 1);
        let ask = |item| ask(&store, Op::Check, item);
        assert!(ask(item()).await.outcome().unwrap().is_allowed());
        assert!(!ask(item()).await.outcome().unwrap().is_allowed());
        let calls = backend.calls();
        assert!(!ask(item()).await.outcome().unwrap().is_allowed());
        assert_eq!(backend.calls(), calls, "refused from the remembered denial");
        let others = [
            ("shadow", item().mode(Mode::Shadow)),
            ("a look", request(&table, Quota::per_hour(1), 0)),
            ("may wait", item().max_wait(Duration::from_millis(10))),
            ("bans", item().bans(true)),
        ];
        for (what, other) in others {
            let calls = backend.calls();
            ask(other).await;
            assert_eq!(backend.calls(), calls + 1, "{what}: asks the shared store");
        }
    }

    /// Only tokens given back clear a remembered denial, and a refund clears it as it is
    /// sent: a charge (`Penalize`) leaves it; a check sent while a refund is on its way
    /// asks the shared store.
    #[tokio::test(start_paused = true)]
    async fn a_remembered_denial_is_cleared_by_tokens_given_back_only() {
        let (backend, store, table) = set_up(Duration::from_millis(5));
        let item = || request(&table, Quota::per_hour(1), 1);
        let ask = |op, item| ask(&store, op, item);
        ask(Op::Check, item()).await;
        ask(Op::Check, item()).await;
        ask(Op::Penalize, item()).await;
        let calls = backend.calls();
        assert!(!ask(Op::Check, item()).await.outcome().unwrap().is_allowed());
        assert_eq!(backend.calls(), calls, "a charge leaves the denial");
        let refund = ask(Op::Refund, item());
        let calls = backend.calls();
        ask(Op::Check, item()).await;
        assert_eq!(backend.calls(), calls + 1, "cleared as the refund was sent");
        refund.await;
    }

    /// A denial the shared store decided before tokens came back, whose answer comes
    /// after they did, is not remembered: the next request asks the store, and passes.
    #[tokio::test(start_paused = true)]
    async fn a_denial_decided_before_a_refund_but_answered_after_is_not_remembered() {
        let (backend, store, table) = set_up(Duration::from_millis(5));
        let item = || request(&table, Quota::per_hour(1), 1);
        let ask = |op, item| ask(&store, op, item);
        assert!(ask(Op::Check, item()).await.outcome().unwrap().is_allowed());
        // The check is refused at the store at 5 ms and answered at 10 ms; the refund,
        // sent at 4.5 ms over a link now 1 ms long, reaches the store after the check
        // (5.5 ms) and is answered before it (6.5 ms).
        let (denied, _) = tokio::join!(ask(Op::Check, item()), async {
            tokio::time::sleep(Duration::from_micros(4_500)).await;
            backend.set_latency(Duration::from_millis(1));
            ask(Op::Refund, item()).await
        });
        assert!(!denied.outcome().unwrap().is_allowed());
        let calls = backend.calls();
        let next = ask(Op::Check, item()).await;
        assert_eq!(backend.calls(), calls + 1, "the denial was not remembered");
        assert!(next.outcome().unwrap().is_allowed(), "{next:?}");
    }

    /// A request refused because it costs more than the tokens left is not remembered:
    /// a smaller request could pass, and asks the shared store.
    #[tokio::test(start_paused = true)]
    async fn a_denial_of_a_request_bigger_than_what_is_left_is_not_remembered() {
        let (backend, store, table) = set_up(Duration::ZERO);
        let q = Quota::per_hour(10); // burst 10
        let ask = |cost| ask(&store, Op::Check, request(&table, q, cost));
        assert!(ask(8).await.outcome().unwrap().is_allowed());
        let denied = ask(5).await;
        let denied = denied.outcome().unwrap();
        assert!(!denied.is_allowed());
        assert_eq!(denied.remaining(), 2);
        let calls = backend.calls();
        let small = ask(1).await;
        assert_eq!(backend.calls(), calls + 1, "the denial was not remembered");
        assert!(small.outcome().unwrap().is_allowed(), "{small:?}");
    }

    /// A denial decided after tokens came back is remembered again: the give-back only
    /// speaks for the checks sent before it.
    #[tokio::test(start_paused = true)]
    async fn a_denial_sent_after_a_refund_is_remembered() {
        let (backend, store, table) = set_up(Duration::from_millis(1));
        let item = || request(&table, Quota::per_hour(1), 1);
        let ask = |op, item| ask(&store, op, item);
        assert!(ask(Op::Check, item()).await.outcome().unwrap().is_allowed());
        ask(Op::Refund, item()).await;
        // Sent 2 ms after the refund, well inside the give-back's timeout (50 ms).
        assert!(ask(Op::Check, item()).await.outcome().unwrap().is_allowed());
        assert!(!ask(Op::Check, item()).await.outcome().unwrap().is_allowed());
        let calls = backend.calls();
        assert!(!ask(Op::Check, item()).await.outcome().unwrap().is_allowed());
        assert_eq!(backend.calls(), calls, "refused from the remembered denial");
    }
}
