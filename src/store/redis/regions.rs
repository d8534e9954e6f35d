//! A limit across regions on Redis: a region's Redis as its movers reach it
//! ([`RedisEscrow`], `lua/regions.lua`), and the regions of one limit
//! ([`RedisStore::regions`]).

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use super::command::{Lua, evalsha};
use super::keys::{bucket_key, table_prefix};
use super::*;
use crate::base::error::ConfigError;
use crate::store::regions::{
    Demand, Escrow, EscrowFuture, Mover, MoverSettings, Regional, Transfer, TransferId,
};

pub(super) static REGIONS: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("../../../lua/regions.lua")));

/// How long a transfer's record stays in Redis: longer than any partition a mover retries
/// through (a credit sent after it is applied again).
const RECORD_LIFE: Duration = Duration::from_secs(24 * 3600);

/// The most keys of one limit a look reads (SCAN), in batches of `LOOK_BATCH`.
const MAX_LOOK_KEYS: usize = 10_000;
const LOOK_BATCH: usize = 500;

/// Each key's TAT and Redis's time at an escrow's previous look, by limit and key (µs):
/// the keys that look read, at most [`MAX_LOOK_KEYS`] per limit.
type Seen = HashMap<String, HashMap<Key, (u64, u64)>>;

/// One region's Redis as a [`Mover`] reaches it: debits and credits by `lua/regions.lua`
/// under the transfer's id (a key `{prefix}regions:transfer:{id}:{debit|credit}` kept a
/// day), the region's lead by `SET NX PX` on `{prefix}regions:lead`, and the demand from
/// the buckets themselves: each look `SCAN`s a limit's keys (at most 10,000) and reads
/// their TATs; what a bucket's TAT moved since this escrow's previous look is what its
/// region spent. One Redis server or a Sentinel's master per region (a `SCAN` on a
/// cluster reaches one node only).
#[derive(Clone)]
pub struct RedisEscrow {
    backend: RedisBackend,
    /// Each key's TAT and Redis's time at the previous look (µs).
    seen: Arc<Mutex<Seen>>,
}

impl fmt::Debug for RedisEscrow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisEscrow")
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

fn failed(e: redis::RedisError) -> StoreError {
    StoreError::new(e)
}

impl RedisEscrow {
    fn new(backend: RedisBackend) -> Self {
        Self {
            backend,
            seen: Arc::default(),
        }
    }

    /// The region's outstanding transfer (a hash: its id, limit, bucket key, destination
    /// and amount).
    fn outstanding_key(&self) -> Vec<u8> {
        let mut k = self.backend.prefix.to_vec();
        k.extend_from_slice(b"regions:outstanding");
        k
    }

    fn record_key(&self, id: TransferId, what: &str) -> Vec<u8> {
        let mut k = self.backend.prefix.to_vec();
        k.extend_from_slice(format!("regions:transfer:{id}:{what}").as_bytes());
        k
    }

    /// The bucket keys of `table` in Redis, each once (at most [`MAX_LOOK_KEYS`]).
    async fn scan(conn: &Connection, table: &[u8]) -> Result<Vec<Vec<u8>>, StoreError> {
        let mut pattern = Vec::with_capacity(table.len() + 1);
        for &b in table {
            if matches!(b, b'*' | b'?' | b'[' | b']' | b'\\') {
                pattern.push(b'\\');
            }
            pattern.push(b);
        }
        pattern.push(b'*');
        // A SCAN may return a key twice (the keyspace resized meanwhile): each once.
        let mut keys = Vec::new();
        let mut found = HashSet::new();
        let mut cursor = 0u64;
        loop {
            let mut cmd = redis::cmd("SCAN");
            cmd.arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000);
            let (next, batch): (u64, Vec<Vec<u8>>) = conn.query(&cmd).await.map_err(failed)?;
            for key in batch {
                if found.insert(key.clone()) {
                    keys.push(key);
                }
            }
            cursor = next;
            if cursor == 0 || keys.len() >= MAX_LOOK_KEYS {
                break;
            }
        }
        keys.truncate(MAX_LOOK_KEYS);
        Ok(keys)
    }
}

/// A bucket's tokens at `now` (µs) under `quota`, from its TAT (0: absent, full).
fn remaining(quota: Quota, tat: u64, now: u64) -> u64 {
    let t = quota.t_us().max(1);
    let tau = quota.burst_size().saturating_mul(t);
    ((now + tau).saturating_sub(tat.max(now)) / t).min(quota.burst_size())
}

impl Escrow for RedisEscrow {
    fn demand(&self, table: &str, quota: Quota) -> EscrowFuture<Vec<Demand>> {
        let this = self.clone();
        let table = table.to_owned();
        Box::pin(async move {
            let prefix = table_prefix(&this.backend.prefix, &table);
            let keys = Self::scan(&this.backend.conn, &prefix).await?;
            let now_arg = this.backend.now_arg();
            let mut out = Vec::new();
            let before = {
                let mut seen = this.seen.lock().unwrap_or_else(|e| e.into_inner());
                seen.remove(&table).unwrap_or_default()
            };
            let mut fresh = HashMap::with_capacity(keys.len());
            for chunk in keys.chunks(LOOK_BATCH) {
                let mut cmd = evalsha(&REGIONS, chunk.len());
                for k in chunk {
                    cmd.arg(k.as_slice());
                }
                cmd.arg(&now_arg).arg("look");
                let reply: Vec<u64> = this
                    .backend
                    .conn
                    .eval(&cmd, &REGIONS)
                    .await
                    .map_err(failed)?;
                let Some((&now, tats)) = reply.split_first() else {
                    continue;
                };
                for (k, &tat) in chunk.iter().zip(tats) {
                    let Some(key) = Key::from_rendered(&k[prefix.len()..]) else {
                        continue;
                    };
                    // Spent since the previous look: how far the TAT moved past where it was
                    // (or past the previous look's time, for a bucket that was full).
                    let granted = before.get(&key).map_or(0, |&(tat0, now0)| {
                        tat.saturating_sub(tat0.max(now0)) / quota.t_us().max(1)
                    });
                    fresh.insert(key.clone(), (tat, now));
                    out.push(Demand::new(key, granted, 0, remaining(quota, tat, now)));
                }
            }
            let mut seen = this.seen.lock().unwrap_or_else(|e| e.into_inner());
            seen.insert(table, fresh);
            Ok(out)
        })
    }

    fn debit(&self, transfer: &Transfer, quota: Quota, most: u64, keep: u64) -> EscrowFuture<u64> {
        let mut rendered = Vec::new();
        transfer.key.render_into(&mut rendered);
        let mut cmd = evalsha(&REGIONS, 3);
        cmd.arg(bucket_key(
            &table_prefix(&self.backend.prefix, &transfer.table),
            &transfer.key,
        ))
        .arg(self.record_key(transfer.id, "debit"))
        .arg(self.outstanding_key())
        .arg(self.backend.now_arg())
        .arg("debit")
        .arg(quota.t_us().max(1))
        .arg(quota.burst_size())
        .arg(most)
        .arg(keep)
        .arg(RECORD_LIFE.as_millis() as u64)
        .arg(transfer.id.to_string())
        .arg(transfer.table.as_str())
        .arg(rendered)
        .arg(transfer.to);
        let conn = self.backend.conn.clone();
        Box::pin(async move { conn.eval::<u64>(&cmd, &REGIONS).await.map_err(failed) })
    }

    fn outstanding(&self) -> EscrowFuture<Option<(Transfer, u64)>> {
        let mut cmd = redis::cmd("HGETALL");
        cmd.arg(self.outstanding_key());
        let conn = self.backend.conn.clone();
        Box::pin(async move {
            let fields: HashMap<String, Vec<u8>> = conn.query(&cmd).await.map_err(failed)?;
            if fields.is_empty() {
                return Ok(None);
            }
            let text = |name: &str| {
                fields
                    .get(name)
                    .and_then(|v| std::str::from_utf8(v).ok())
                    .map(str::to_owned)
            };
            let read = || {
                let id = TransferId::parse(&text("id")?)?;
                let key = Key::from_rendered(fields.get("key")?)?;
                let to = text("to")?.parse().ok()?;
                let amount = text("amount")?.parse().ok()?;
                Some((Transfer::new(id, text("table")?, key, to), amount))
            };
            read()
                .map(Some)
                .ok_or_else(|| StoreError::new("a malformed outstanding transfer"))
        })
    }

    fn settle(&self, id: TransferId) -> EscrowFuture<bool> {
        let mut cmd = evalsha(&REGIONS, 1);
        cmd.arg(self.outstanding_key())
            .arg(self.backend.now_arg())
            .arg("settle")
            .arg(id.to_string());
        let conn = self.backend.conn.clone();
        Box::pin(async move {
            let cleared: i64 = conn.eval(&cmd, &REGIONS).await.map_err(failed)?;
            Ok(cleared == 1)
        })
    }

    fn credit(
        &self,
        id: TransferId,
        table: &str,
        key: &Key,
        quota: Quota,
        amount: u64,
    ) -> EscrowFuture<bool> {
        let mut cmd = evalsha(&REGIONS, 2);
        cmd.arg(bucket_key(&table_prefix(&self.backend.prefix, table), key))
            .arg(self.record_key(id, "credit"))
            .arg(self.backend.now_arg())
            .arg("credit")
            .arg(quota.t_us().max(1))
            .arg(quota.burst_size())
            .arg(amount)
            .arg(0)
            .arg(RECORD_LIFE.as_millis() as u64);
        let conn = self.backend.conn.clone();
        Box::pin(async move {
            let applied: i64 = conn.eval(&cmd, &REGIONS).await.map_err(failed)?;
            Ok(applied == 1)
        })
    }

    fn lead(&self, holder: &str, ttl: Duration) -> EscrowFuture<bool> {
        let mut lock = self.backend.prefix.to_vec();
        lock.extend_from_slice(b"regions:lead");
        let mut cmd = evalsha(&REGIONS, 1);
        cmd.arg(lock)
            .arg(self.backend.now_arg())
            .arg("lead")
            .arg(holder)
            .arg((ttl.as_millis() as u64).max(1));
        let conn = self.backend.conn.clone();
        Box::pin(async move {
            let leads: i64 = conn.eval(&cmd, &REGIONS).await.map_err(failed)?;
            Ok(leads == 1)
        })
    }
}

/// The regions of a limit across regions on Redis, seen from one of them:
/// [`RedisStore::regions`].
#[derive(Clone, Debug)]
pub struct RedisRegions {
    names: Vec<String>,
    stores: Vec<RedisStore>,
    local: usize,
}

impl RedisStore {
    /// One limit across regions: a `RedisStore` per region, by name, and the name of the
    /// region this process runs in. Its [`store`](RedisRegions::store) decides every
    /// request from the local region's Redis alone, on the region's part of each quota;
    /// its [`mover`](RedisRegions::mover) moves unspent tokens between the regions (see
    /// [`regions`](crate::store::regions) for the bound).
    ///
    /// A [`ConfigError`] naming `regions` for no region or a name given twice, and
    /// `regions.local` for a local region that is not one of them.
    ///
    /// ```no_run
    /// use tollgate::store::RedisStore;
    ///
    /// # fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// let eu = RedisStore::open("redis://eu.example:6379")?;
    /// let us = RedisStore::open("redis://us.example:6379")?;
    /// let regions = RedisStore::regions([("eu", eu), ("us", us)], "eu")?;
    /// let store = regions.store(); // for the layers of this region's instances
    /// # let _ = store; Ok(()) }
    /// ```
    pub fn regions<N: Into<String>>(
        regions: impl IntoIterator<Item = (N, RedisStore)>,
        local: &str,
    ) -> Result<RedisRegions, ConfigError> {
        let (names, stores): (Vec<String>, Vec<RedisStore>) =
            regions.into_iter().map(|(n, s)| (n.into(), s)).unzip();
        if names.is_empty() {
            return Err(ConfigError::new("regions", "no region"));
        }
        for (i, n) in names.iter().enumerate() {
            if names[..i].contains(n) {
                return Err(ConfigError::new(
                    "regions",
                    format!("the region {n:?} is named twice"),
                ));
            }
        }
        let Some(local) = names.iter().position(|n| n == local) else {
            return Err(ConfigError::new(
                "regions.local",
                format!("{local:?} is not one of the regions {names:?}"),
            ));
        };
        Ok(RedisRegions {
            names,
            stores,
            local,
        })
    }

    /// This store's Redis as a region's movers reach it.
    pub fn escrow(&self) -> RedisEscrow {
        RedisEscrow::new(self.0.backend().clone())
    }
}

impl RedisRegions {
    /// The regions' names, in order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The local region's name.
    pub fn local(&self) -> &str {
        &self.names[self.local]
    }

    /// The store of this region's layers: the local region's part of each quota, on the
    /// local Redis alone, without a deny cache (a mover's credit lands in Redis, where a
    /// cached denial would not see it).
    pub fn store(&self) -> Regional<RedisStore> {
        Regional::new(
            self.stores[self.local].clone().deny_cache(false),
            self.local,
            self.names.len(),
        )
    }

    /// A mover of the local region for `limits` (each limit's name and global quota),
    /// named `holder` in the region's election (one per process: its instance name),
    /// numbering its transfers from `epoch` (unique per mover's life: the time it
    /// started). Spawn [`Mover::run`]; each instance may run one, one leads at a time.
    pub fn mover<N: Into<String>>(
        &self,
        limits: impl IntoIterator<Item = (N, Quota)>,
        settings: MoverSettings,
        holder: impl Into<String>,
        epoch: u64,
    ) -> Mover {
        let escrows: Vec<Arc<dyn Escrow>> = self
            .stores
            .iter()
            .map(|s| -> Arc<dyn Escrow> { Arc::new(s.escrow()) })
            .collect();
        Mover::new(
            self.local,
            escrows,
            limits.into_iter().map(|(n, q)| (n.into(), q)).collect(),
            settings,
            holder,
            epoch,
        )
        .region(self.local())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buckets_tokens_from_its_tat() {
        let q = Quota::per_second(10); // t = 100,000 µs, burst 10
        assert_eq!(remaining(q, 0, 5_000_000), 10);
        assert_eq!(remaining(q, 5_000_000, 5_000_000), 10);
        assert_eq!(remaining(q, 5_300_000, 5_000_000), 7);
        assert_eq!(remaining(q, 6_000_000, 5_000_000), 0);
        assert_eq!(remaining(q, 9_000_000, 5_000_000), 0);
    }
}
