//! Bans in Redis (`lua/ban.lua`): a key's refusal count, ban and repeat level, in the hash
//! slot of its bucket, so that a Redis Cluster runs the script on one node.

use super::command::{BAN, evalsha};
use super::keys;
use super::{RedisBackend, RedisTable};
use crate::model::key::Key;
use crate::store::{BanCall, BanFuture, BanReply, StoreError};

/// The three keys of a bucket's ban state: `suffix`es of the bucket key that keep its hash
/// slot ([`keys::beside`]).
pub(super) fn ban_keys(bucket: &[u8]) -> [Vec<u8>; 3] {
    ["n", "ban", "lvl"].map(|suffix| keys::beside(bucket, suffix.as_bytes()))
}

fn ms_ceil(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

impl RedisBackend {
    /// Runs `ban.lua` for `key` of `table`.
    pub(super) fn ban_call(&self, table: &RedisTable, key: &Key, call: BanCall) -> BanFuture {
        self.ban_call_on(&keys::bucket_key(&table.prefix, key), call)
    }

    /// Runs `ban.lua` for the key whose bucket is `bucket` (its Redis key, without a
    /// calendar window).
    pub(super) fn ban_call_on(&self, bucket: &[u8], call: BanCall) -> BanFuture {
        let mut cmd = evalsha(&BAN, 3);
        for k in ban_keys(bucket) {
            cmd.arg(k);
        }
        match call {
            BanCall::Offend(ban) => {
                cmd.arg("offend")
                    .arg(ban.after)
                    .arg(ms_ceil(ban.within))
                    .arg(ms_ceil(ban.for_))
                    .arg(ban.escalate)
                    .arg(ms_ceil(ban.max))
                    .arg(ms_ceil(ban.forget));
            }
            BanCall::Set(d) => {
                cmd.arg("set").arg(ms_ceil(d).max(1));
            }
            BanCall::Lift => {
                cmd.arg("lift");
            }
            BanCall::Remaining => {
                cmd.arg("remaining");
            }
        }
        let conn = self.conn.clone();
        Box::pin(async move {
            let (left, began, level): (i64, i64, i64) =
                conn.eval(&cmd, &BAN).await.map_err(StoreError::new)?;
            let remaining =
                (left > 0).then(|| std::time::Duration::from_millis(left.unsigned_abs()));
            Ok(BanReply::new(
                remaining,
                began == 1,
                u32::try_from(level.max(0)).unwrap_or(u32::MAX),
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_keep_the_bucket_slot() {
        let plain = b"tollgate:login:@203.0.113.7";
        let [n, ban, lvl] = ban_keys(plain);
        assert_eq!(ban, b"{tollgate:login:@203.0.113.7}:ban");
        assert_eq!(keys::slot(&n), keys::slot(plain));
        assert_eq!(keys::slot(&ban), keys::slot(plain));
        assert_eq!(keys::slot(&lvl), keys::slot(plain));
        let tagged = b"{rl}:login:@203.0.113.7";
        let [n, ban, _] = ban_keys(tagged);
        assert_eq!(ban, b"{rl}:login:@203.0.113.7:ban");
        assert_eq!(keys::slot(&n), keys::slot(tagged));
        // A stray `}` without a tag: the three keys still share a slot.
        let odd = ban_keys(b"a}b:login:k");
        assert_eq!(keys::slot(&odd[0]), keys::slot(&odd[2]));
    }
}
