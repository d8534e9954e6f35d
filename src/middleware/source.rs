//! Where a layer's services find what they share: a [`Source`] is either fixed (a layer
//! built once) or live (rules that are reloaded while requests run). One layer, one
//! service and one limiter handle serve both; a live source is loaded once per request.

use std::sync::Arc;

use crate::limiter::Handle;
use crate::middleware::shared::{Shared, Version};
use crate::store::Store;
#[cfg(feature = "rules")]
use {
    crate::limiter::{Applied, Calls, LimiterError},
    crate::observe::offenders::RefusedKey,
    crate::store::Op,
    std::time::Duration,
};

/// What is current in a live source (rules): loaded once per request, or per call of a
/// limiter handle. Implemented by the rules, which own what keeps it current.
#[cfg(feature = "rules")]
pub(crate) trait Live<St: Store, R>: Send + Sync + 'static {
    /// The current version.
    fn current(&self) -> arc_swap::Guard<Arc<Version<St, R>>>;
}

/// What a layer's services share: fixed, or the current version of a live source.
pub(crate) enum Source<St: Store, R> {
    Fixed(Arc<Version<St, R>>),
    #[cfg(feature = "rules")]
    Live(Arc<dyn Live<St, R>>),
}

impl<St: Store, R> Clone for Source<St, R> {
    fn clone(&self) -> Self {
        match self {
            Source::Fixed(shared) => Source::Fixed(shared.clone()),
            #[cfg(feature = "rules")]
            Source::Live(live) => Source::Live(live.clone()),
        }
    }
}

impl<St: Store, R: 'static> Source<St, R> {
    /// Runs `f` on what is current.
    #[inline]
    pub(crate) fn with<T>(&self, f: impl FnOnce(&Arc<Shared<St, R>>) -> T) -> T {
        self.with_version(|version| f(&version.shared))
    }

    /// Runs `f` on the current version (what is current, and its request handles).
    #[inline]
    pub(crate) fn with_version<T>(&self, f: impl FnOnce(&Arc<Version<St, R>>) -> T) -> T {
        match self {
            Source::Fixed(version) => f(version),
            #[cfg(feature = "rules")]
            Source::Live(live) => f(&live.current()),
        }
    }
}

impl<St: Store, R: Send + Sync + 'static> Source<St, R> {
    /// A limiter handle on this source: fixed, or following every reload.
    pub(crate) fn handle(&self) -> Arc<dyn Handle> {
        match self {
            Source::Fixed(version) => version.shared.clone(),
            #[cfg(feature = "rules")]
            Source::Live(live) => Arc::new(LiveHandle(live.clone())),
        }
    }
}

/// A limiter handle that asks a live source for the current version at each call.
#[cfg(feature = "rules")]
struct LiveHandle<St: Store, R>(Arc<dyn Live<St, R>>);

#[cfg(feature = "rules")]
impl<St: Store, R: Send + Sync + 'static> Handle for LiveHandle<St, R> {
    fn apply(&self, op: Op, calls: Calls<'_>, max_wait: Duration) -> Result<Applied, LimiterError> {
        self.0.current().shared.apply(op, calls, max_wait)
    }

    fn names(&self) -> Vec<&'static str> {
        self.0.current().shared.names()
    }

    fn top_refused(&self, limit: &str, n: usize) -> Result<Vec<RefusedKey>, LimiterError> {
        self.0.current().shared.top_refused(limit, n)
    }

    fn can_settle(&self, limit: &str) -> Result<(), LimiterError> {
        self.0.current().shared.can_settle(limit)
    }

    fn bans(&self, limit: &str) -> Result<Vec<crate::engine::ban::BannedKey>, LimiterError> {
        self.0.current().shared.bans(limit)
    }

    fn set_ban(
        &self,
        limit: &str,
        key: crate::model::key::Key,
        length: Option<Duration>,
    ) -> Result<(), LimiterError> {
        self.0.current().shared.set_ban(limit, key, length)
    }

    fn algorithm(&self, limit: &str) -> Option<crate::algo::algorithm::Algorithm> {
        self.0.current().shared.algorithm(limit)
    }

    fn paced(&self, limit: &str) -> Option<crate::limiter::Paced> {
        self.0.current().shared.paced(limit)
    }

    fn key_for(
        &self,
        limit: &str,
        parts: &http::request::Parts,
    ) -> Option<Result<Option<crate::model::key::Key>, LimiterError>> {
        self.0.current().shared.key_for(limit, parts)
    }
}
