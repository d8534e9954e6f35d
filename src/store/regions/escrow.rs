//! What a mover asks of one region's store: its demand, and transfers applied once.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::algo::quota::Quota;
use crate::model::key::Key;
use crate::store::StoreError;

/// The answer of an [`Escrow`] call.
pub type EscrowFuture<T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send>>;

/// The demand one key of one limit met in a region lately, as its store counted it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Demand {
    /// The bucket.
    pub key: Key,
    /// Requests granted over the last whole mover interval.
    pub granted: u64,
    /// Requests refused over the last whole interval and the current one.
    pub refused: u64,
    /// The tokens the region's bucket holds now, under the region's part of the quota.
    pub remaining: u64,
}

impl Demand {
    /// A key's demand.
    pub fn new(key: Key, granted: u64, refused: u64, remaining: u64) -> Self {
        Self {
            key,
            granted,
            refused,
            remaining,
        }
    }
}

/// The name of one transfer, unique across the regions and the movers' restarts: the
/// source region's index, the mover's epoch (when it started, or a random number) and a
/// sequence number. The debit at the source and the credit at the destination are each
/// applied once under it, however often they are sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TransferId {
    /// The source region's index.
    pub region: u32,
    /// The mover's epoch.
    pub epoch: u64,
    /// The transfer's number in that mover's life.
    pub seq: u64,
}

impl fmt::Display for TransferId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{:x}-{}", self.region, self.epoch, self.seq)
    }
}

impl TransferId {
    /// The id its [`Display`](fmt::Display) wrote (`region-epoch in hex-seq`).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn parse(s: &str) -> Option<Self> {
        let mut parts = s.splitn(3, '-');
        let region = parts.next()?.parse().ok()?;
        let epoch = u64::from_str_radix(parts.next()?, 16).ok()?;
        let seq = parts.next()?.parse().ok()?;
        Some(Self { region, epoch, seq })
    }
}

/// One transfer as its source region's store records it: its id, the bucket it moves
/// tokens of (a limit and a key) and the region it moves them to (its index).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Transfer {
    /// Its name, the debit's and the credit's.
    pub id: TransferId,
    /// The limit's name.
    pub table: String,
    /// The bucket.
    pub key: Key,
    /// The destination region's index.
    pub to: u32,
}

impl Transfer {
    /// A transfer of the bucket `key` of `table` to region `to`, under `id`.
    pub fn new(id: TransferId, table: impl Into<String>, key: Key, to: u32) -> Self {
        Self {
            id,
            table: table.into(),
            key,
            to,
        }
    }
}

/// One region's store as a [`Mover`](super::Mover) reaches it: its own region's, or
/// another's through the link between them.
///
/// `debit` and `credit` are idempotent by id: sent again (a lost answer, a retry after a
/// partition), they do nothing more and answer as the first time.
///
/// A region has one transfer outstanding at most (debited, not yet settled), and its
/// store keeps it: whichever mover leads the region finishes it (a mover that loses the
/// lead mid-transfer, stopped, killed or only slow, leaves it to the next), and a debit
/// while another transfer is outstanding takes nothing. The tokens out of a region's
/// buckets at once are those of one transfer, whoever leads.
pub trait Escrow: Send + Sync + 'static {
    /// The keys of limit `table` refused or granted lately, with their buckets' tokens
    /// under `quota` (this region's part).
    fn demand(&self, table: &str, quota: Quota) -> EscrowFuture<Vec<Demand>>;

    /// Takes up to `most` tokens from the bucket of `transfer` (under `quota`), leaving
    /// at least `keep`, records the amount taken under the transfer's id and, if any, the
    /// transfer as this region's outstanding one; answers the amount. Sent again under the
    /// same id, takes nothing and answers the recorded amount. With another transfer
    /// outstanding, takes nothing, records nothing and answers 0.
    fn debit(&self, transfer: &Transfer, quota: Quota, most: u64, keep: u64) -> EscrowFuture<u64>;

    /// Gives `amount` tokens to the bucket `key` of `table` (under `quota`; never beyond
    /// a full bucket), once under `id`: `true` if applied now, `false` if it was already.
    fn credit(
        &self,
        id: TransferId,
        table: &str,
        key: &Key,
        quota: Quota,
        amount: u64,
    ) -> EscrowFuture<bool>;

    /// This region's outstanding transfer, with the amount debited: one a debit recorded
    /// and no [`settle`](Self::settle) cleared yet.
    fn outstanding(&self) -> EscrowFuture<Option<(Transfer, u64)>>;

    /// Clears the outstanding transfer if it is `id` (its credit landed); `true` if it
    /// was.
    fn settle(&self, id: TransferId) -> EscrowFuture<bool>;

    /// Whether `holder` leads this region's movers for `ttl` from now (taken if free or
    /// already `holder`'s; Redis: `SET NX PX`, renewed by its holder). By default every
    /// caller leads (a region with one mover).
    fn lead(&self, holder: &str, ttl: Duration) -> EscrowFuture<bool> {
        let _ = (holder, ttl);
        Box::pin(async { Ok(true) })
    }
}

/// The transfers a store applied, kept for `ttl` (a retry after that is a new transfer:
/// the ttl must outlast any partition a mover retries through). What the Redis script
/// keeps in keys with a TTL, for stores kept in memory (the simulated backend).
#[derive(Debug)]
pub struct Ledger {
    debits: HashMap<TransferId, (u64, u64)>,
    credits: HashMap<TransferId, u64>,
    /// The outstanding transfer, its amount, when it was debited.
    outstanding: Option<(Transfer, u64, u64)>,
    ttl: u64,
    pruned: u64,
}

impl Ledger {
    /// A ledger keeping what it applied for `ttl`.
    pub fn new(ttl: Duration) -> Self {
        Self {
            debits: HashMap::new(),
            credits: HashMap::new(),
            outstanding: None,
            ttl: u64::try_from(ttl.as_nanos()).unwrap_or(u64::MAX),
            pruned: 0,
        }
    }

    /// The debit of `transfer` at `now` (ns): `take()` once, its amount recorded and
    /// answered, and the transfer outstanding if the amount is not 0; the recorded amount
    /// afterwards. With another transfer outstanding, nothing (0, `take` not called).
    pub fn debit(&mut self, transfer: &Transfer, now: u64, take: impl FnOnce() -> u64) -> u64 {
        self.prune(now);
        if let Some(&(amount, _)) = self.debits.get(&transfer.id) {
            return amount;
        }
        if self.outstanding(now).is_some() {
            return 0;
        }
        let amount = take();
        self.debits.insert(transfer.id, (amount, now));
        if amount > 0 {
            self.outstanding = Some((transfer.clone(), amount, now));
        }
        amount
    }

    /// The outstanding transfer at `now` (ns) and its amount: debited less than `ttl` ago
    /// and not settled.
    pub fn outstanding(&mut self, now: u64) -> Option<(Transfer, u64)> {
        if let Some((_, _, at)) = &self.outstanding
            && at.saturating_add(self.ttl) <= now
        {
            self.outstanding = None;
        }
        self.outstanding.as_ref().map(|(t, n, _)| (t.clone(), *n))
    }

    /// Clears the outstanding transfer if it is `id`; `true` if it was.
    pub fn settle(&mut self, id: TransferId) -> bool {
        let mine = self.outstanding.as_ref().is_some_and(|(t, ..)| t.id == id);
        if mine {
            self.outstanding = None;
        }
        mine
    }

    /// The credit `id` at `now` (ns): `give()` once (`true`); nothing afterwards (`false`).
    pub fn credit(&mut self, id: TransferId, now: u64, give: impl FnOnce()) -> bool {
        self.prune(now);
        if self.credits.contains_key(&id) {
            return false;
        }
        give();
        self.credits.insert(id, now);
        true
    }

    /// How many transfers the ledger remembers.
    pub fn len(&self) -> usize {
        self.debits.len() + self.credits.len()
    }

    /// Whether it remembers none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn prune(&mut self, now: u64) {
        // At most once per ttl, so that a ledger of many transfers is not scanned each time.
        if now < self.pruned.saturating_add(self.ttl) {
            return;
        }
        self.pruned = now;
        let ttl = self.ttl;
        self.debits
            .retain(|_, (_, at)| at.saturating_add(ttl) > now);
        self.credits.retain(|_, at| at.saturating_add(ttl) > now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(seq: u64) -> TransferId {
        TransferId {
            region: 1,
            epoch: 0xab,
            seq,
        }
    }

    fn t(seq: u64) -> Transfer {
        Transfer::new(id(seq), "api", Key::from_part("k"), 0)
    }

    #[test]
    fn a_debit_and_a_credit_apply_once_per_id() {
        let mut ledger = Ledger::new(Duration::from_secs(60));
        let mut taken = 0;
        assert_eq!(
            ledger.debit(&t(1), 0, || {
                taken += 5;
                5
            }),
            5
        );
        assert_eq!(
            ledger.debit(&t(1), 10, || {
                taken += 7;
                7
            }),
            5
        );
        assert_eq!(taken, 5);
        assert!(ledger.settle(id(1)));
        assert_eq!(ledger.debit(&t(2), 10, || 3), 3);
        let mut given = 0;
        assert!(ledger.credit(id(1), 20, || given += 5));
        assert!(!ledger.credit(id(1), 30, || given += 5));
        assert_eq!(given, 5);
        assert_eq!(ledger.len(), 3);
        assert_eq!(id(4).to_string(), "1-ab-4");
    }

    #[test]
    fn a_transfer_id_reads_back_from_its_display() {
        let far = TransferId {
            region: u32::MAX,
            epoch: u64::MAX,
            seq: u64::MAX,
        };
        for id in [id(4), far] {
            assert_eq!(TransferId::parse(&id.to_string()), Some(id));
        }
        for bad in ["", "1", "1-ab", "1-zz-4", "x-ab-4", "1-ab-4-5", "1-ab-"] {
            assert_eq!(TransferId::parse(bad), None, "{bad}");
        }
    }

    /// One transfer outstanding at most: a debit under another id takes nothing until the
    /// outstanding one is settled (by its id only), and one that took nothing is never
    /// outstanding.
    #[test]
    fn a_debit_waits_for_the_outstanding_transfer_to_settle() {
        let mut ledger = Ledger::new(Duration::from_secs(60));
        assert_eq!(ledger.outstanding(0), None);
        assert_eq!(ledger.debit(&t(1), 0, || 4), 4);
        assert_eq!(ledger.outstanding(1), Some((t(1), 4)));
        assert_eq!(ledger.debit(&t(2), 2, || unreachable!("fenced")), 0);
        assert!(!ledger.settle(id(2)));
        assert_eq!(ledger.outstanding(3), Some((t(1), 4)));
        assert!(ledger.settle(id(1)));
        assert!(!ledger.settle(id(1)));
        assert_eq!(ledger.outstanding(4), None);
        // Sent again after its settle, the debit answers its amount, and is not outstanding.
        assert_eq!(ledger.debit(&t(1), 5, || 9), 4);
        assert_eq!(ledger.outstanding(5), None);
        assert_eq!(ledger.debit(&t(3), 6, || 0), 0);
        assert_eq!(ledger.outstanding(6), None);
        assert_eq!(ledger.debit(&t(4), 7, || 2), 2);
        assert_eq!(ledger.outstanding(8), Some((t(4), 2)));
    }

    #[test]
    fn an_outstanding_transfer_is_forgotten_one_ttl_after_its_debit() {
        let mut ledger = Ledger::new(Duration::from_nanos(100));
        assert_eq!(ledger.debit(&t(1), 10, || 4), 4);
        assert_eq!(ledger.outstanding(109), Some((t(1), 4)));
        assert_eq!(ledger.outstanding(110), None);
        assert_eq!(ledger.debit(&t(2), 110, || 3), 3);
    }

    #[test]
    fn what_is_older_than_the_ttl_is_forgotten() {
        let mut ledger = Ledger::new(Duration::from_nanos(100));
        assert!(ledger.is_empty());
        ledger.debit(&t(1), 0, || 5);
        ledger.credit(id(1), 60, || ());
        ledger.settle(id(1));
        ledger.debit(&t(9), 140, || 4);
        ledger.settle(id(9));
        ledger.debit(&t(2), 150, || 1); // the prune at 140 forgot the debit of 0
        ledger.settle(id(2));
        assert_eq!(ledger.len(), 3);
        assert!(!ledger.credit(id(1), 160, || ()));
        assert_eq!(ledger.debit(&t(9), 160, || 7), 4, "kept through the prune");
        // One ttl after the last prune, exactly: everything up to 150 goes.
        assert_eq!(ledger.debit(&t(3), 250, || 2), 2);
        assert_eq!(ledger.len(), 1);
        assert!(!ledger.is_empty());
    }

    /// The boundaries: the prune runs exactly one ttl after the last, and a credit applied
    /// exactly one ttl before is forgotten by it (applied again if it comes again).
    #[test]
    fn a_credit_is_forgotten_exactly_one_ttl_after_it() {
        let mut ledger = Ledger::new(Duration::from_nanos(100));
        let mut given = 0;
        assert!(ledger.credit(id(1), 0, || given += 1));
        assert!(!ledger.credit(id(1), 99, || given += 1));
        assert!(ledger.credit(id(1), 100, || given += 1));
        assert_eq!(given, 2);
        assert_eq!(ledger.len(), 1);
    }
}
