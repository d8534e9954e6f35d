//! Stores: where bucket state lives.
//!
//! | store | state | failure |
//! |---|---|---|
//! | [`MemoryStore`] | in this process, lock-free per key, evicted when idle | cannot fail |
//! | `RedisStore` (feature `redis`) | in Redis, shared by every instance, one atomic script per request | per-limit [`FailurePolicy`] |
//!
//! A store checks all the limits of one request at once and makes the result all or
//! nothing: a request refused by one enforcing limit consumes nothing from any limit.
//!
//! [`FailurePolicy`]: crate::FailurePolicy

mod memory;
#[cfg(feature = "redis")]
mod redis;

use std::future::Future;

use smallvec::SmallVec;

pub use crate::decision::Status;
pub use memory::{DEFAULT_MAX_KEYS, MemoryStore, MemoryTable};
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use redis::{RedisStore, RedisTable};

use crate::key::Key;
use crate::limit::{FailurePolicy, Mode};
use crate::quota::Quota;

/// One limit of one request, as the store sees it.
#[derive(Debug)]
#[non_exhaustive]
pub struct Item<'a, T> {
    /// The limit's table, from [`Store::table`].
    pub table: &'a T,
    /// The bucket within the table.
    pub key: Key,
    /// The quota for this request.
    pub quota: Quota,
    /// Tokens this request takes (0: look without consuming).
    pub cost: u32,
    /// Whether the limit may refuse the request.
    pub mode: Mode,
    /// What to do if the store fails.
    pub on_failure: FailurePolicy,
}

impl<'a, T> Item<'a, T> {
    /// A check of `cost` tokens from the bucket `key` of `table`, enforcing, falling back
    /// to a local limiter if the store fails.
    ///
    /// For using a store without the middleware:
    ///
    /// ```
    /// use tollgate::{key::Key, store::{Checked, Item, MemoryStore, Store}, Quota};
    ///
    /// let store = MemoryStore::new();
    /// let logins = store.table("logins");
    /// let item = Item::new(&logins, Key::from_part("alice"), Quota::per_minute(5), 1);
    /// let Checked::Ready(statuses) = store.check(&[item]) else { unreachable!() };
    /// assert!(statuses[0].outcome().unwrap().is_allowed());
    /// assert_eq!(statuses[0].outcome().unwrap().remaining(), 4);
    /// ```
    pub fn new(table: &'a T, key: Key, quota: Quota, cost: u32) -> Self {
        Self {
            table,
            key,
            quota,
            cost,
            mode: Mode::Enforce,
            on_failure: FailurePolicy::Fallback,
        }
    }

    /// Sets whether the limit may refuse (see [`Mode`]).
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// Sets what happens if the store fails.
    pub fn on_failure(mut self, policy: FailurePolicy) -> Self {
        self.on_failure = policy;
        self
    }
}

/// One [`Status`] per item, in the items' order.
pub type Statuses = SmallVec<[Status; 4]>;

/// A store's answer: at once, or later.
// The statuses stay inline (no allocation for up to four limits); the value is taken
// apart right after it is returned.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub enum Checked<F> {
    /// Decided synchronously (the memory store; or a local denial).
    Ready(Statuses),
    /// Decided when the future completes (a network round trip).
    Pending(F),
}

/// Where bucket state lives, and how a request's limits are checked against it.
///
/// `check` must decide the request all or nothing: if any [`Mode::Enforce`] item is
/// refused ([`Status::Checked`] or [`Status::Fallback`] with a denial, or
/// [`Status::FailedClosed`]), nothing is consumed and the items that would have passed
/// report their unchanged state; otherwise every passing item consumes its cost (shadow
/// items too), and a shadow item that would refuse consumes nothing.
pub trait Store: Clone + Send + Sync + 'static {
    /// A handle to one limit's buckets, made once when the layer is built.
    type Table: Send + Sync + 'static;
    /// The answer of a check that needs I/O.
    type Future: Future<Output = Statuses> + Send + 'static;

    /// The table of the limit called `name` (the same name gives the same buckets).
    fn table(&self, name: &str) -> Self::Table;

    /// Checks one request against each of its limits.
    fn check(&self, items: &[Item<'_, Self::Table>]) -> Checked<Self::Future>;
}
