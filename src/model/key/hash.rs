//! The hashes of a [`Key`]: its compact form in a store's table, a hash that is the same
//! in every process (for jitter), and the seed of a random window phase.

use std::hash::Hasher;

use siphasher::sip128::{Hasher128, SipHasher13};

use super::identity::{Key, Repr};

impl Key {
    /// 16 bytes that identify the key within one table of a store, keyed by `secret` so
    /// that request input cannot aim at a collision. Addresses are kept exactly.
    #[inline]
    pub(crate) fn compact(&self, secret: &(u64, u64)) -> u128 {
        match &self.repr {
            Repr::Ip { addr, .. } => u128::from_be_bytes(*addr),
            Repr::Text { len, buf } => {
                let mut h = SipHasher13::new_with_keys(secret.0, secret.1);
                h.write(&buf[..*len as usize]);
                h.finish128().as_u128()
            }
            Repr::Digest(d) => {
                let mut first = [0; 16];
                first.copy_from_slice(&d[..16]);
                // A digest never equals a text key's SipHash output by construction
                // (different inputs to a PRF); xor-ing the secret keeps it unpredictable.
                u128::from_be_bytes(first) ^ ((secret.0 as u128) << 64 | secret.1 as u128)
            }
        }
    }

    /// A hash that is the same in every process: for Retry-After jitter, which should give
    /// one client the same offset whichever instance answers.
    pub(crate) fn stable_hash(&self) -> u64 {
        let mut h = SipHasher13::new_with_keys(0x746f_6c6c_6761_7465, 0x6a69_7474_6572_0001);
        match &self.repr {
            Repr::Ip { addr, prefix } => {
                h.write(addr);
                h.write_u8(*prefix);
            }
            Repr::Text { len, buf } => h.write(&buf[..*len as usize]),
            Repr::Digest(d) => h.write(d),
        }
        h.finish()
    }

    /// A cheap hash that is the same in every process and version of this crate (its
    /// definition is part of the stored format): the seed of a key's random window phase,
    /// computed on every check of such a limit. Not for adversarial use (it chooses a
    /// phase, nothing a collision could exploit).
    #[inline]
    pub(crate) fn phase_hash(&self) -> u64 {
        #[inline(always)]
        fn mix(h: u64, word: u64) -> u64 {
            let m = u128::from(h ^ word) * 0x9e37_79b9_7f4a_7c15;
            (m as u64) ^ ((m >> 64) as u64)
        }
        fn words(mut h: u64, bytes: &[u8]) -> u64 {
            let mut chunks = bytes.chunks_exact(8);
            for c in &mut chunks {
                h = mix(h, u64::from_le_bytes(c.try_into().expect("8 bytes")));
            }
            let mut last = [0u8; 8];
            last[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
            mix(h, u64::from_le_bytes(last) ^ (bytes.len() as u64) << 56)
        }
        match &self.repr {
            Repr::Ip { addr, prefix } => {
                let hi = u64::from_le_bytes(addr[..8].try_into().expect("8 bytes"));
                let lo = u64::from_le_bytes(addr[8..].try_into().expect("8 bytes"));
                mix(mix(u64::from(*prefix), hi), lo)
            }
            Repr::Text { len, buf } => words(0x7465_7874, &buf[..*len as usize]),
            Repr::Digest(d) => words(0x6469_6765_7374, d),
        }
    }
}
