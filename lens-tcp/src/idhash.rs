//! A cheap hasher for the maps keyed by connection names and ranks.
//!
//! Those keys are chosen by this process, never by a peer: each accepted connection is
//! named by a counter, and ranks are bounded by the world size. So nothing a
//! stranger sends can pick colliding keys, and the default hasher's defence against that
//! (SipHash with a random key) is not needed; it cost about a sixth of a round's
//! instructions on a rank (several lookups per frame).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Multiplies in each word: enough to spread counters and small integers over the table.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct IdHasher(u64);

/// An odd constant with its bits well mixed (the golden ratio's fraction, 2^64 / φ).
const MIX: u64 = 0x9E37_79B9_7F4A_7C15;

impl IdHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(26) ^ word).wrapping_mul(MIX);
    }
}

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            // The length too, so that [1] and [1, 0] differ.
            self.add(u64::from_le_bytes(w) ^ ((rest.len() as u64) << 56));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.add(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }

    fn finish(&self) -> u64 {
        // hashbrown takes the top 7 bits for its tags and the low bits for the bucket: mix
        // once more so that both see every input bit.
        let x = (self.0 ^ (self.0 >> 32)).wrapping_mul(MIX);
        x ^ (x >> 29)
    }
}

/// A map with keys this process chose (see the module's docs).
pub(crate) type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::hash::BuildHasher as _;

    fn hash<T: std::hash::Hash + ?Sized>(t: &T) -> u64 {
        BuildHasherDefault::<IdHasher>::default().hash_one(t)
    }

    #[test]
    fn connection_names_and_ranks_spread_over_buckets() {
        // Accepted connections' names: the side, then a counter from 2^20, as `ConnId`
        // hashes them.
        let names: Vec<(u8, usize)> = (0..4096usize).map(|i| (0u8, (1 << 20) + i)).collect();
        for (what, hashes) in [
            ("names", names.iter().map(hash).collect::<Vec<_>>()),
            ("ranks", (0..4096usize).map(|r| hash(&r)).collect()),
        ] {
            assert_eq!(hashes.iter().collect::<HashSet<_>>().len(), 4096, "{what}");
            // The low 10 bits pick among 1,024 buckets: each should get a few.
            let used = hashes
                .iter()
                .map(|h| h & 1023)
                .collect::<HashSet<_>>()
                .len();
            assert!(used > 900, "{what}: {used} of 1024 buckets used");
            // hashbrown's tags: the top 7 bits.
            let tags = hashes.iter().map(|h| h >> 57).collect::<HashSet<_>>().len();
            assert!(tags > 100, "{what}: {tags} of 128 tags used");
        }
    }

    #[test]
    fn a_trailing_zero_byte_changes_the_hash() {
        assert_ne!(hash(&[1u8][..]), hash(&[1u8, 0][..]));
        let mut a = IdHasher::default();
        a.write(&[1]);
        let mut b = IdHasher::default();
        b.write(&[1, 0]);
        assert_ne!(a.finish(), b.finish());
    }
}
