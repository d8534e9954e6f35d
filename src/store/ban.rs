//! Bans kept in a shared store: what the engine asks ([`BanCall`]) and what it learns
//! ([`BanReply`]). A store that keeps no bans of its own (the memory store) answers
//! `None` to [`Store::ban`](super::Store::ban), and the engine's own ban table
//! (`engine/ban.rs`) is the only one; a shared store (Redis) keeps the refusal counts,
//! the bans and their repeat levels, and the engine caches the bans it learns.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::model::ban::Ban;
use crate::store::StoreError;

/// One operation on a key's ban state in a shared store.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum BanCall {
    /// The key was refused: count it (unless it is banned), and ban it if this is its
    /// `after`-th refusal within `within` (the ban's length from its repeat level).
    Offend(Ban),
    /// Ban the key for this long from now (by hand); the repeat level is left as it is.
    Set(Duration),
    /// Lift the key's ban and forget its refusals and repeat level.
    Lift,
    /// How long the key's ban has left, if any (a cached ban's re-check).
    Remaining,
}

/// The key's ban state after a [`BanCall`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct BanReply {
    /// The time the key's ban has left; `None`: not banned.
    pub remaining: Option<Duration>,
    /// Whether this call began the ban (so that it is logged once, by one instance).
    pub began: bool,
    /// The ban's repeat level (0: a first ban).
    pub level: u32,
}

impl BanReply {
    /// A reply: banned for `remaining` (if any), begun by this call or not, at `level`.
    pub fn new(remaining: Option<Duration>, began: bool, level: u32) -> Self {
        Self {
            remaining,
            began,
            level,
        }
    }
}

/// The answer of a shared store to a [`BanCall`].
pub type BanFuture = Pin<Box<dyn Future<Output = Result<BanReply, StoreError>> + Send>>;
