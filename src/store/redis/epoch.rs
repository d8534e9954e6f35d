//! Noticing that Redis lost the buckets: a restart without persistence, `FLUSHALL`, a
//! failover to a replica that missed writes. Every bucket would then start full again, so
//! an exhausted key would get a whole burst back.
//!
//! Each store writes one marker key, `{prefix}__epoch`, holding a random value (on Redis
//! Cluster, one per master, each with a hash tag that puts it in that master's slots), and
//! reads them back at most once a second. A marker that is gone (or that another instance
//! wrote anew) means the state was lost: the store counts a reset, which
//! [`Resilient`](crate::store::Resilient) answers by writing back what it remembers of the
//! keys it saw spent, each with an operation that only moves a bucket's state forward.
//!
//! A wipe is not the only loss: a restart from an older RDB/AOF file, or a failover to a
//! replica that lagged, brings back the marker with the rest of an *older* state, and
//! eviction (`maxmemory-policy` other than `noeviction`) drops buckets but not the marker.
//! So the same probe also reads `INFO` (except on a cluster, whose nodes each have their
//! own): a `run_id` that changed (a restart, or another server after a failover) or an
//! `evicted_keys` count that moved counts a reset too, and a policy that evicts is logged
//! once at `WARN`. A write-back when nothing was lost costs calls, never tokens.
//!
//! The probe also counts the live instances: each store adds its process's name (or the
//! name it was given) to a sorted set, `{prefix}__instances`, with the server's time, and
//! drops entries older than [`LIVE_FOR`], so a process counts once per prefix however many
//! stores it makes; the count sizes the share of a key no traffic history covers while
//! Redis is out of reach ([`FailurePolicy::Share`](crate::FailurePolicy)). Under Sentinel, the probe also asks
//! the sentinels for the master: once they announce another, the connection to the old one
//! is dropped and the next call goes to the new one.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::admin::{Admin, is_refusal, refused};
use super::command::Connection;

/// How often a store reads the marker back.
pub(super) const PROBE_EVERY: Duration = Duration::from_secs(1);
/// An instance that has not probed for this long is no longer counted live.
const LIVE_FOR: Duration = Duration::from_secs(5);

/// Adds this instance to the live set with the server's time, drops the entries older
/// than `ARGV[2]` ms, and answers how many are left.
const HEARTBEAT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return redis.call('ZCARD', KEYS[1])
";

/// What the probe last read of the server (`INFO`).
#[derive(Default)]
struct Server {
    run_id: Option<String>,
    evicted: Option<u64>,
    policy_warned: bool,
}

/// What a store knows of the marker.
pub(super) struct Epoch {
    started: Instant,
    /// When the marker was last read, in ms since `started` (`u64::MAX`: never).
    probed_ms: AtomicU64,
    /// Each marker's value, as this store last saw it.
    known: Mutex<HashMap<Vec<u8>, String>>,
    /// Resets seen so far.
    resets: AtomicU64,
    /// What the server said last.
    server: Mutex<Server>,
    /// Whether the server refused `INFO` (renamed, disabled, not granted): not asked again.
    info_refused: AtomicBool,
    /// This store's own name (whose in-flight units an entry counts), and the most live
    /// instances counted within the last `LIVE_FOR` (0 until counted), with when that
    /// most was last seen (ms since `started`).
    id: String,
    instances: AtomicU64,
    instances_at_ms: AtomicU64,
    /// The heartbeat's last round trip in nanoseconds (0: none yet).
    round_trip_ns: AtomicU64,
    /// Whether the probe's timer runs (see `RedisBackend::probe_epoch`).
    ticking: AtomicBool,
}

impl Default for Epoch {
    fn default() -> Self {
        Self {
            started: Instant::now(),
            probed_ms: AtomicU64::new(u64::MAX),
            known: Mutex::new(HashMap::new()),
            resets: AtomicU64::new(0),
            server: Mutex::default(),
            info_refused: AtomicBool::new(false),
            id: format!("{:016x}", random()),
            instances: AtomicU64::new(0),
            instances_at_ms: AtomicU64::new(0),
            round_trip_ns: AtomicU64::new(0),
            ticking: AtomicBool::new(false),
        }
    }
}

impl Epoch {
    /// This store's own name: whose in-flight units an entry counts.
    pub(super) fn id(&self) -> &str {
        &self.id
    }

    /// Resets seen so far.
    pub(super) fn resets(&self) -> u64 {
        self.resets.load(Ordering::Acquire)
    }

    /// The heartbeat's last round trip, if one was measured.
    pub(super) fn round_trip(&self) -> Option<Duration> {
        match self.round_trip_ns.load(Ordering::Relaxed) {
            0 => None,
            ns => Some(Duration::from_nanos(ns)),
        }
    }

    /// The most live instances counted within the last 5 s (at least 1 once counted; 0
    /// while this store has never counted them: it knows nothing of the others yet): a
    /// count never drops at once, so a Redis that comes back empty (whose live set refills
    /// as each instance probes it) does not hand the first instances to probe a whole
    /// quota each.
    pub(super) fn instances(&self) -> u64 {
        self.instances.load(Ordering::Relaxed)
    }

    /// Whether the probe's own timer is to be started now (the first caller only).
    pub(super) fn start_ticking(&self) -> bool {
        !self.ticking.load(Ordering::Relaxed) && !self.ticking.swap(true, Ordering::AcqRel)
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
    pub(super) async fn probe(
        &self,
        conn: &Connection,
        prefix: &[u8],
        live_as: &str,
    ) -> redis::RedisResult<()> {
        #[cfg(feature = "redis-sentinel")]
        if let Connection::Sentinel(s) = conn {
            s.follow().await;
        }
        let mut lost = self.markers(conn, prefix).await?;
        if !conn.is_cluster() && !self.info_refused.load(Ordering::Relaxed) {
            // `INFO` renamed, disabled or not granted: only the marker is read.
            match self.server(conn).await {
                Ok(changed) => lost |= changed,
                Err(error) if is_refusal(&error) => {
                    self.info_refused.store(true, Ordering::Relaxed);
                    refused(Admin::Info, &error);
                }
                Err(error) => tracing::debug!(%error, "tollgate: reading Redis INFO failed"),
            }
        }
        if lost {
            tracing::warn!(
                "tollgate: Redis lost rate-limit state (a restart, a flush, a failover, an older snapshot or an eviction); writing back the keys this instance saw spent"
            );
            self.resets.fetch_add(1, Ordering::AcqRel);
        }
        self.heartbeat(conn, prefix, live_as).await
    }

    /// Counts this instance live (as `live_as`), and the live ones.
    async fn heartbeat(
        &self,
        conn: &Connection,
        prefix: &[u8],
        live_as: &str,
    ) -> redis::RedisResult<()> {
        let mut key = prefix.to_vec();
        key.extend_from_slice(b"__instances");
        let mut eval = redis::cmd("EVAL");
        eval.arg(HEARTBEAT)
            .arg(1)
            .arg(key)
            .arg(live_as)
            .arg(u64::try_from(LIVE_FOR.as_millis()).unwrap_or(5_000));
        let sent = Instant::now();
        let live: u64 = conn.query(&eval).await?;
        let rtt = u64::try_from(sent.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.round_trip_ns.store(rtt.max(1), Ordering::Relaxed);
        self.count_instances(live.max(1));
        Ok(())
    }

    /// Keeps the most instances counted within `LIVE_FOR`.
    fn count_instances(&self, live: u64) {
        let now = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let most = self.instances.load(Ordering::Relaxed);
        let at = self.instances_at_ms.load(Ordering::Relaxed);
        let window = u64::try_from(LIVE_FOR.as_millis()).unwrap_or(5_000);
        if live >= most || now.saturating_sub(at) > window {
            self.instances.store(live, Ordering::Relaxed);
            self.instances_at_ms.store(now, Ordering::Relaxed);
        }
    }

    /// Reads `INFO`: whether the server restarted or changed (`run_id`), or evicted keys,
    /// since the last probe.
    async fn server(&self, conn: &Connection) -> redis::RedisResult<bool> {
        let info: String = conn.query(&redis::cmd("INFO")).await?;
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .map(str::trim)
        };
        let run_id = field("run_id").map(str::to_owned);
        let evicted = field("evicted_keys").and_then(|v| v.parse::<u64>().ok());
        let policy = field("maxmemory_policy").unwrap_or("noeviction");
        let mut seen = self.server.lock().unwrap_or_else(|e| e.into_inner());
        if policy != "noeviction" && !seen.policy_warned {
            seen.policy_warned = true;
            tracing::warn!(
                policy,
                "tollgate: Redis may evict rate-limit buckets under memory pressure (maxmemory-policy is not noeviction); each eviction is taken for a loss of state and written back, but a bucket evicted between two probes starts full"
            );
        }
        let restarted = matches!((&seen.run_id, &run_id), (Some(a), Some(b)) if a != b);
        let evicting = matches!((seen.evicted, evicted), (Some(a), Some(b)) if b > a);
        if restarted {
            tracing::info!("tollgate: Redis restarted or failed over (its run_id changed)");
        }
        if evicting {
            tracing::info!("tollgate: Redis evicted keys since the last probe");
        }
        seen.run_id = run_id.or(seen.run_id.take());
        seen.evicted = evicted.or(seen.evicted);
        Ok(restarted || evicting)
    }

    /// Reads the markers (and writes those that are missing): whether one is not the
    /// value this store saw last.
    async fn markers(&self, conn: &Connection, prefix: &[u8]) -> redis::RedisResult<bool> {
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
        Ok(lost)
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
    let ranges: Vec<redis::Value> = match conn
        .query(&redis::cmd("CLUSTER").arg("SLOTS").clone())
        .await
    {
        Ok(ranges) => ranges,
        // Renamed, disabled or not granted: the one marker of the prefix.
        Err(error) if is_refusal(&error) => {
            refused(Admin::ClusterSlots, &error);
            return Ok(vec![base]);
        }
        Err(error) => return Err(error),
    };
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
/// This process's name in the live sets: the same for every store it makes, so that a
/// process counts once per prefix.
pub(super) fn process_name() -> &'static str {
    static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NAME.get_or_init(|| format!("p{:016x}", random()))
}

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

    #[test]
    fn the_instance_count_never_drops_at_once() {
        let e = Epoch::default();
        assert_eq!(e.instances(), 0, "not counted yet");
        e.count_instances(4);
        assert_eq!(e.instances(), 4);
        // Redis came back empty: the live set refills one probe at a time.
        e.count_instances(1);
        e.count_instances(2);
        assert_eq!(e.instances(), 4);
        e.count_instances(6);
        assert_eq!(e.instances(), 6);
    }
}
