//! Noticing that Redis lost the buckets: a restart without persistence, `FLUSHALL`, a
//! failover to a replica that missed writes. Every bucket would then start full again, so
//! an exhausted key would get a whole burst back.
//!
//! Each store writes one marker key, `{prefix}__epoch`, holding a random value (on Redis
//! Cluster, one per master, each with a hash tag that puts it in that master's slots), and
//! reads them back at most once a second. A marker that is gone (or that another instance
//! wrote anew) means the state was lost: the store counts a reset, which
//! [`Resilient`](crate::store::Resilient) answers by writing back what it remembers of the
//! keys it saw refused, each with a block that only moves a bucket's state forward.

use std::collections::HashMap;
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
    /// Each marker's value, as this store last saw it.
    known: Mutex<HashMap<Vec<u8>, String>>,
    /// Resets seen so far.
    resets: AtomicU64,
}

impl Default for Epoch {
    fn default() -> Self {
        Self {
            started: Instant::now(),
            probed_ms: AtomicU64::new(u64::MAX),
            known: Mutex::new(HashMap::new()),
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

    /// Reads the markers of `prefix` (and writes those that are missing): counts a reset
    /// if a value is not the one this store saw last.
    pub(super) async fn probe(&self, conn: &Connection, prefix: &[u8]) -> redis::RedisResult<()> {
        let mut lost = false;
        for key in marker_keys(conn, prefix).await? {
            let fresh = format!("{:016x}", random());
            // SET NX, then GET: the marker that is there after both is the current one.
            let mut set = redis::cmd("SET");
            set.arg(&key).arg(&fresh).arg("NX");
            let _: Option<String> = conn.query(&set).await?;
            let mut get = redis::cmd("GET");
            get.arg(&key);
            let seen: Option<String> = conn.query(&get).await?;
            let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
            match (known.get(&key), seen) {
                (Some(before), Some(now)) if *before == now => {}
                (Some(_), now) => {
                    lost = true;
                    match now {
                        Some(now) => known.insert(key, now),
                        None => known.remove(&key),
                    };
                }
                (None, Some(now)) => {
                    known.insert(key, now);
                }
                (None, None) => {}
            }
        }
        if lost {
            tracing::warn!(
                "tollgate: Redis lost its rate-limit state (a restart without persistence, a flush or a failover); writing back the keys this instance saw refused"
            );
            self.resets.fetch_add(1, Ordering::AcqRel);
        }
        Ok(())
    }
}

/// The marker keys: `{prefix}__epoch`; on a cluster (unless the prefix holds a hash tag,
/// which puts every key in one slot), one per master: `{prefix}__epoch{tollgate-epoch-N}`
/// with the first `N` whose slot is the master's.
async fn marker_keys(conn: &Connection, prefix: &[u8]) -> redis::RedisResult<Vec<Vec<u8>>> {
    let mut base = prefix.to_vec();
    base.extend_from_slice(b"__epoch");
    if !conn.is_cluster() || has_hash_tag(prefix) {
        return Ok(vec![base]);
    }
    let ranges: Vec<redis::Value> = conn
        .query(&redis::cmd("CLUSTER").arg("SLOTS").clone())
        .await?;
    let mut keys = Vec::new();
    for range in ranges {
        let redis::Value::Array(fields) = range else {
            continue;
        };
        let (Some(redis::Value::Int(start)), Some(redis::Value::Int(end))) =
            (fields.first(), fields.get(1))
        else {
            continue;
        };
        let (start, end) = (*start as u16, *end as u16);
        let tag = (0u32..100_000)
            .find(|n| (start..=end).contains(&slot_of(format!("tollgate-epoch-{n}").as_bytes())));
        if let Some(n) = tag {
            let mut key = base.clone();
            key.extend_from_slice(format!("{{tollgate-epoch-{n}}}").as_bytes());
            keys.push(key);
        }
    }
    Ok(keys)
}

/// Whether `key` holds a hash tag (`{...}` with something inside).
fn has_hash_tag(key: &[u8]) -> bool {
    key.iter().position(|&b| b == b'{').is_some_and(|open| {
        key[open + 1..]
            .iter()
            .position(|&b| b == b'}')
            .is_some_and(|len| len > 0)
    })
}

/// The cluster slot of a hash tag's content: CRC16 (XMODEM) modulo 16384.
fn slot_of(tag: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in tag {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16_384
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_redis_cluster_slots() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(slot_of(b"123456789"), 0x31c3); // below 16,384: the CRC itself
        assert_eq!(slot_of(b"foo"), 12_182);
        assert_eq!(slot_of(b"user1000"), 3_443);
    }

    #[test]
    fn a_prefix_with_a_hash_tag_keeps_one_marker() {
        assert!(has_hash_tag(b"{rl}:"));
        assert!(!has_hash_tag(b"{}:"));
        assert!(!has_hash_tag(b"tollgate:"));
    }
}
