//! Noticing that Redis lost the buckets: a restart without persistence, `FLUSHALL`, a
//! failover to a replica that missed writes. Every bucket would then start full again, so
//! an exhausted key would get a whole burst back.
//!
//! Each store writes one marker key, `{prefix}__epoch`, holding a random value, and reads
//! it back at most once a second, piggybacked on its calls. A marker that is gone (or that
//! another instance wrote anew) means the state was lost: the store counts a reset, which
//! [`Resilient`](crate::store::Resilient) answers by writing back what it remembers of the
//! keys it saw refused, each with a block that only moves a bucket's state forward.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::command::Connection;

/// How often a store reads the marker back.
const PROBE_EVERY: Duration = Duration::from_secs(1);

/// What a store knows of the marker.
pub(super) struct Epoch {
    started: Instant,
    /// When the marker was last read, in ms since `started` (`u64::MAX`: never).
    probed_ms: AtomicU64,
    /// The marker's value this store last saw.
    known: Mutex<Option<String>>,
    /// Resets seen so far.
    resets: AtomicU64,
}

impl Default for Epoch {
    fn default() -> Self {
        Self {
            started: Instant::now(),
            probed_ms: AtomicU64::new(u64::MAX),
            known: Mutex::new(None),
            resets: AtomicU64::new(0),
        }
    }
}

impl Epoch {
    /// Resets seen so far.
    pub(super) fn resets(&self) -> u64 {
        self.resets.load(Ordering::Acquire)
    }

    /// Whether a probe is due now; claims it if so (one caller wins).
    pub(super) fn due(&self) -> bool {
        let now = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX - 1);
        let last = self.probed_ms.load(Ordering::Relaxed);
        let every = u64::try_from(PROBE_EVERY.as_millis()).unwrap_or(1_000);
        if last != u64::MAX && now.saturating_sub(last) < every {
            return false;
        }
        self.probed_ms
            .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }

    /// Reads the marker at `key` (and writes one if there is none): counts a reset if the
    /// value is not the one this store saw last.
    pub(super) async fn probe(&self, conn: &Connection, key: &[u8]) -> redis::RedisResult<()> {
        let fresh = format!("{:016x}", random());
        // SET NX, then GET: the marker that is there after both is the current one.
        let mut set = redis::cmd("SET");
        set.arg(key).arg(&fresh).arg("NX");
        let _: Option<String> = conn.query(&set).await?;
        let mut get = redis::cmd("GET");
        get.arg(key);
        let seen: Option<String> = conn.query(&get).await?;
        let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        match (&*known, seen) {
            (Some(before), Some(now)) if *before == now => {}
            (Some(_), now) => {
                tracing::warn!(
                    "tollgate: Redis lost its rate-limit state (a restart without persistence, a flush or a failover); writing back the keys this instance saw refused"
                );
                self.resets.fetch_add(1, Ordering::AcqRel);
                *known = now;
            }
            (None, now) => *known = now,
        }
        Ok(())
    }
}

/// A random 64-bit value (the marker only has to differ between writers).
fn random() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}
