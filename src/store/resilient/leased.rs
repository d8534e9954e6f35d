//! Lease mode's glue (the state is in `lease.rs`): a check decided from the tokens held
//! (`leased`), leases taken and given back in the background (`take_lease`,
//! `give_back`), a request waiting for a lease on its way (`wait_for_lease`), and the
//! one lease table per limit name.

use std::sync::Arc;

use smallvec::SmallVec;

use super::lease::{self, Answer, Ask, Asking, Backed, GiveBack, LeaseTable, Local, Take};
use super::{Part, Resilient, ResilientTable, refuses};
use crate::base::clock::Clock;
use crate::model::decision::Status;
use crate::model::key::Key;
use crate::model::policy::Mode;
use crate::store::breaker::Permit;
use crate::store::{Backend, Checked, Item, Op, Statuses, Store};

/// A leased item decided here: its table, key and cost (given back if the request does
/// not pass).
type Taken = SmallVec<[(Arc<LeaseTable>, Key, u32); 4]>;

impl<B: Backend> Resilient<B> {
    /// Lease mode: decides a check here when the leases of its leased items say so (all
    /// taken from leases, or one refused while this instance waits for tokens), asking
    /// the backend only for the other items. `None`: the check goes to the backend whole,
    /// and leases are taken meanwhile for the next requests.
    pub(super) fn leased(
        &self,
        items: &[Item<'_, ResilientTable<B::Table>>],
    ) -> Option<Checked<<Self as Store>::Future>> {
        let inner = &*self.inner;
        // While the backend fails, tokens held are still spent (they were taken from the
        // shared bucket); once they are gone, every item follows its policy.
        let offline = inner.breaker.is_open();
        let now = inner.clock.now();
        let mut locals: SmallVec<[Option<Local>; 4]> = SmallVec::new();
        let (mut remote, mut refused) = (false, false);
        for item in items {
            let lease = item.lease.filter(|_| {
                LeaseTable::applies(item.mode, item.cost, item.max_wait, item.algorithm)
            });
            let Some(lease) = lease else {
                locals.push(None);
                continue;
            };
            let ask = Ask {
                quota: item.quota,
                algorithm: item.algorithm,
                lease,
                cost: item.cost,
            };
            let leases = &item.table.leases;
            let asking = if offline {
                Asking::Offline
            } else {
                Asking::Online
            };
            let decided = leases.decide(&item.key, ask, now, asking);
            self.give_back(leases, decided.give_back);
            if let Some(take) = decided.take {
                self.take_lease(leases, &item.key, ask, take);
            }
            match decided.local {
                Local::Remote | Local::Wait => remote = true,
                Local::Refused(_) => refused = true,
                Local::Taken(_) => {}
            }
            locals.push(Some(decided.local));
        }
        // The leased items decided here from their tokens.
        let taken = || {
            items
                .iter()
                .zip(&locals)
                .filter(|(_, l)| matches!(l, Some(Local::Taken(_))))
                .map(|(item, _)| item)
        };
        if refused || remote {
            for item in taken() {
                item.table.leases.undo(&item.key, item.cost);
            }
        }
        if refused {
            // Refused here: nothing is consumed, the other items are not asked.
            let statuses = locals
                .iter()
                .map(|l| match l {
                    Some(l @ Local::Refused(_)) => lease::status(l),
                    _ => Status::Unchecked,
                })
                .collect();
            return Some(Checked::Ready(statuses));
        }
        if let ([item], [Some(Local::Wait)]) = (items, &locals[..]) {
            // One leased limit whose lease is on its way: wait for it rather than call.
            let ask = Ask {
                quota: item.quota,
                algorithm: item.algorithm,
                lease: item.lease.unwrap_or_default(),
                cost: item.cost,
            };
            let part = self.part(item);
            return Some(Checked::Pending(Box::pin(
                self.clone().wait_for_lease(part, ask),
            )));
        }
        if remote {
            if locals.iter().any(|l| matches!(l, Some(Local::Wait))) {
                // Several items: no waiting, the request is asked as a whole.
                for (item, local) in items.iter().zip(&locals) {
                    if matches!(local, Some(Local::Wait)) {
                        item.table.leases.count_remote(&item.key);
                    }
                }
            }
            return None;
        }
        let mut statuses: Statuses = locals
            .iter()
            .map(|l| l.as_ref().map_or(Status::Unchecked, lease::status))
            .collect();
        let rest: SmallVec<[usize; 4]> =
            (0..items.len()).filter(|&i| locals[i].is_none()).collect();
        if rest.is_empty() {
            return Some(Checked::Ready(statuses));
        }
        // The other items, all or nothing with the leased ones: asked as usual. The leased
        // ones' tokens go back if they refuse, after this call: the tables are kept.
        let others: SmallVec<[Item<'_, ResilientTable<B::Table>>; 4]> = rest
            .iter()
            .map(|&i| items[i].on(items[i].table).lease(None))
            .collect();
        let taken: Taken = taken()
            .map(|item| (item.table.leases.clone(), item.key.clone(), item.cost))
            .collect();
        let modes: SmallVec<[Mode; 4]> = others.iter().map(|i| i.mode).collect();
        let merge = move |answered: Statuses, statuses: &mut Statuses| {
            let refused = answered.iter().zip(&modes).any(|(s, &m)| refuses(s, m));
            if refused {
                undo(&taken);
            }
            for (&i, s) in rest.iter().zip(answered) {
                statuses[i] = s;
            }
        };
        Some(match self.apply(Op::Check, &others) {
            Checked::Ready(answered) => {
                merge(answered, &mut statuses);
                Checked::Ready(statuses)
            }
            Checked::Pending(call) => Checked::Pending(Box::pin(async move {
                merge(call.await, &mut statuses);
                statuses
            })),
        })
    }

    /// Takes a lease of `want` tokens for `key` in the background (and, if the bucket
    /// had fewer but enough, what it had).
    fn take_lease(&self, leases: &Arc<LeaseTable>, key: &Key, ask: Ask, take: Take) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            let now = self.inner.clock.now();
            let failed = Answer {
                asked: take.tokens,
                generation: take.generation,
                sent_at: now,
                answered_at: now,
                outcome: None,
                last: true,
            };
            leases.settle(key, ask, failed);
            return;
        };
        leases.sweep_in_background();
        let this = self.clone();
        let leases = leases.clone();
        let key = key.clone();
        runtime.spawn(async move {
            let inner = &*this.inner;
            let name = inner.backend.name();
            let mut asked = take.tokens;
            // A call that timed out, still on its way: its answer is waited for below.
            let mut late = None;
            for attempt in 0..2 {
                let sent_at = inner.clock.now();
                this.sending(sent_at);
                let cost = u32::try_from(asked).unwrap_or(u32::MAX);
                let mut call = leases.remote.call(
                    Op::Check,
                    &key,
                    ask.quota,
                    ask.algorithm,
                    cost,
                    take.max_wait,
                );
                // No request waits for this call: it may take twice a request's timeout
                // (a late answer is still an answer, timed from the send).
                leases.patience(this.usual_round_trip());
                let timeout = this.call_timeout().saturating_mul(2);
                let answer = match tokio::time::timeout(timeout, &mut call).await {
                    Ok(Ok(s)) if s.len() == 1 => {
                        this.answered(sent_at);
                        inner.breaker.success(name);
                        this.repay();
                        s[0].outcome().copied()
                    }
                    Ok(Ok(_)) => {
                        inner.breaker.failure(
                            inner.clock.now(),
                            name,
                            &"a wrong number of statuses",
                        );
                        None
                    }
                    Ok(Err(e)) => {
                        inner.breaker.failure(inner.clock.now(), name, &e);
                        None
                    }
                    Err(_) => {
                        if this.silent() {
                            inner
                                .breaker
                                .failure(inner.clock.now(), name, &"no answer in time");
                        }
                        late = Some((call, asked, sent_at));
                        None
                    }
                };
                if let Some(o) = &answer {
                    // A lease that left nothing (refused, the last tokens, or reserved:
                    // the bucket is spent until its tokens are due): written back if the
                    // backend loses it.
                    this.remember(&leases, &key, ask.quota, ask.algorithm, sent_at, o);
                    this.lease_traffic(&leases, &key, ask, asked, sent_at, o);
                }
                let settled = Answer {
                    asked,
                    generation: take.generation,
                    sent_at,
                    answered_at: inner.clock.now(),
                    outcome: answer,
                    last: attempt == 1,
                };
                if late.is_some() {
                    // Before the failure is settled: no other lease starts meanwhile.
                    leases.timed_out(&key, ask, take.generation, sent_at);
                }
                let (again, give_back) = leases.settle(&key, ask, settled);
                this.give_back(&leases, give_back);
                match again {
                    Some(n) => asked = n,
                    None => break,
                }
            }
            if let Some((call, asked, sent_at)) = late {
                // The requests went on without it (settled as failed); the backend may
                // still grant it, and then its tokens are counted there: they are spent
                // here, or given back.
                let Ok(Ok(s)) = tokio::time::timeout(super::calls::LATE_FOR, call).await else {
                    return;
                };
                let Some(o) = s
                    .first()
                    .and_then(|s| s.outcome().copied())
                    .filter(|_| s.len() == 1)
                else {
                    return;
                };
                this.answered(sent_at);
                this.remember(&leases, &key, ask.quota, ask.algorithm, sent_at, &o);
                this.lease_traffic(&leases, &key, ask, asked, sent_at, &o);
                let answered = Answer {
                    asked,
                    generation: take.generation,
                    sent_at,
                    answered_at: inner.clock.now(),
                    outcome: Some(o),
                    last: false,
                };
                let give_back = leases.late(&key, ask, answered);
                this.give_back(&leases, give_back);
            }
        });
    }

    /// A lease call's answer is this instance's traffic on the key, as a check's is: the
    /// tokens it took, and how far the shared bucket moved (what `Share` follows during an
    /// outage; a leased key's requests are mostly decided without a call, so without this
    /// its fraction would count only the few checks that asked the backend).
    fn lease_traffic(
        &self,
        leases: &Arc<LeaseTable>,
        key: &Key,
        ask: Ask,
        asked: u64,
        sent_at: u64,
        o: &crate::model::decision::Outcome,
    ) {
        let granted = if o.is_allowed() {
            u32::try_from(asked).unwrap_or(u32::MAX)
        } else {
            0
        };
        let inner = &*self.inner;
        inner.traffic.observe(
            Arc::as_ptr(leases) as usize,
            key,
            ask.quota,
            ask.algorithm,
            sent_at,
            inner.clock.now(),
            granted,
            o,
        );
    }

    /// Gives unspent leased tokens back to the backend, in the background.
    fn give_back(&self, leases: &Arc<LeaseTable>, give_back: GiveBack) {
        if let Some((key, quota, algorithm, tokens)) = give_back {
            leases.give_back(&key, quota, algorithm, tokens);
        }
    }
}

impl<B: Backend> Resilient<B> {
    /// The lease table of the limit called `name`: one per name in this store, shared by
    /// every limit, layer or reloaded rule set of that name, so that the tokens one
    /// instance holds for a key are counted once (at most `L`).
    pub(super) fn lease_table(&self, name: &str) -> Arc<LeaseTable> {
        let inner = &*self.inner;
        let mut by_name = inner
            .lease_by_name
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(live) = by_name.get(name).and_then(std::sync::Weak::upgrade) {
            return live;
        }
        by_name.retain(|_, t| t.strong_count() > 0);
        let remote = Backed {
            backend: inner.backend.clone(),
            table: inner.backend.table(name),
        };
        let leases = Arc::new(LeaseTable::new(
            Box::new(remote),
            inner.lease_keys.clone(),
            inner.lease_counters.clone(),
            inner.clock.clone(),
            inner.timeout,
        ));
        by_name.insert(name.to_owned(), Arc::downgrade(&leases));
        leases
    }
}

impl<B: Backend> Resilient<B> {
    /// A request of one leased limit whose lease is on its way: waits until a lease call
    /// of its key is settled (at most a call's timeout, the time its own call would
    /// have taken), then decides again; asks the backend if the lease did not bring it a
    /// token.
    async fn wait_for_lease(self, part: Part, ask: Ask) -> Statuses {
        let leases = part.remote.clone();
        leases
            .waiting
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let deadline = tokio::time::Instant::now() + self.call_timeout();
        let decided = loop {
            let asking = if self.inner.breaker.is_open() {
                Asking::Offline
            } else {
                Asking::Waited
            };
            let decided = leases.decide(&part.key, ask, self.inner.clock.now(), asking);
            self.give_back(&leases, decided.give_back);
            if let Some(take) = decided.take {
                self.take_lease(&leases, &part.key, ask, take);
            }
            match decided.local {
                Local::Wait if tokio::time::Instant::now() < deadline => {
                    leases.wait(&part.key, deadline).await;
                }
                local => break local,
            }
        };
        leases
            .waiting
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        match decided {
            l @ (Local::Taken(_) | Local::Refused(_)) => {
                std::iter::once(lease::status(&l)).collect()
            }
            Local::Wait | Local::Remote => {
                if matches!(decided, Local::Wait) {
                    leases.count_remote(&part.key);
                }
                if self.inner.breaker.permit(self.inner.clock.now()) == Permit::Skip {
                    return self.on_failure(Op::Check, &[part], true);
                }
                let call = leases.remote.call(
                    Op::Check,
                    &part.key,
                    part.quota,
                    part.algorithm,
                    part.cost,
                    part.max_wait,
                );
                let mut parts = SmallVec::new();
                parts.push(part);
                self.run(Op::Check, parts, call).await
            }
        }
    }
}

/// Gives back the tokens leased items took for a request that does not pass.
fn undo(taken: &Taken) {
    for (leases, key, cost) in taken {
        leases.undo(key, *cost);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::store::resilient::Resilient;
    use crate::store::resilient::tests::Down;

    /// One lease table per limit name while it lives (every limit of that name shares
    /// it); a table no limit holds any more is forgotten when another is made.
    #[test]
    fn a_name_has_one_lease_table_while_it_lives_and_none_after() {
        let store = Resilient::new(Down);
        let a = store.lease_table("a");
        let b = store.lease_table("b");
        assert!(Arc::ptr_eq(&a, &store.lease_table("a")), "a was kept");
        assert!(Arc::ptr_eq(&b, &store.lease_table("b")));
        drop(a);
        let _c = store.lease_table("c");
        let names = store.inner.lease_by_name.lock().unwrap();
        let mut names: Vec<&String> = names.keys().collect();
        names.sort();
        assert_eq!(names, ["b", "c"], "a, no longer held, was forgotten");
    }
}
