//! Maps keyed by ids and digests on the hot path, with hashers made for their keys.

/// Maps keyed by ids and digests on the hot path: a fast, DoS-resistant-enough seeded hasher
/// instead of SipHash.
pub(crate) type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// A call's identity: the SHA-256 digest of its tool's name and canonical input (RFC 8785).
/// Identical calls have equal digests; the cache and the loop detector key on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct CallDigest(pub(crate) [u8; 32]);

/// Maps keyed by call digests (the cache): see [`digest_hash`].
pub(crate) type DigestMap<V> = std::collections::HashMap<CallDigest, V, digest_hash::DigestState>;

mod digest_hash {
    //! A hasher for keys that are SHA-256 digests. Their bits are already uniform, so hashing
    //! all 32 bytes again (as a general hasher must) is wasted work: the first 8 bytes, folded
    //! with a per-process secret, make the hash. The secret keeps bucket positions unpredictable,
    //! so crafted inputs cannot pile into one bucket.

    use std::hash::{BuildHasher, Hasher};
    use std::sync::OnceLock;

    /// Builds [`DigestHasher`]s seeded with the process's secret.
    #[derive(Clone, Copy, Debug)]
    pub(crate) struct DigestState(u64);

    impl Default for DigestState {
        fn default() -> Self {
            static SEED: OnceLock<u64> = OnceLock::new();
            Self(*SEED.get_or_init(rand::random))
        }
    }

    impl BuildHasher for DigestState {
        type Hasher = DigestHasher;

        fn build_hasher(&self) -> DigestHasher {
            DigestHasher(self.0)
        }
    }

    /// Hashes the first 8 bytes it is given (a digest's) with the seed.
    pub(crate) struct DigestHasher(u64);

    impl Hasher for DigestHasher {
        fn write(&mut self, bytes: &[u8]) {
            let mut word = [0u8; 8];
            let n = bytes.len().min(8);
            word[..n].copy_from_slice(&bytes[..n]);
            // A folded multiply: every output bit depends on every bit of the word and seed.
            let product = u128::from(self.0 ^ u64::from_le_bytes(word))
                * u128::from(0x9E37_79B9_7F4A_7C15_u64);
            self.0 = (product as u64) ^ ((product >> 64) as u64);
        }

        /// The length an array or slice hashes first: the same for every digest.
        fn write_usize(&mut self, _: usize) {}

        fn finish(&self) -> u64 {
            self.0
        }
    }

    #[cfg(test)]
    mod tests {
        use std::hash::BuildHasher;

        use super::DigestState;

        #[test]
        fn digests_that_differ_hash_apart_and_equal_ones_alike() {
            // Fixed seeds (the process's is random): the test is the same on every run.
            for seed in [0, 1, 0xdead_beef, u64::MAX] {
                let state = DigestState(seed);
                let a = [7u8; 32];
                let mut b = a;
                b[0] = 8;
                assert_eq!(state.hash_one(a), state.hash_one(a));
                assert_ne!(state.hash_one(a), state.hash_one(b));
                // The low bits (a table's bucket) spread too, not just the high ones: 4,096 keys
                // that differ only in their first two bytes fill 64 buckets evenly.
                let mut buckets = [0u32; 64];
                for i in 0..4096u16 {
                    let mut k = [0u8; 32];
                    k[..2].copy_from_slice(&i.to_le_bytes());
                    buckets[(state.hash_one(k) & 0x3f) as usize] += 1;
                }
                let (min, max) = (buckets.iter().min(), buckets.iter().max());
                assert!(
                    min >= Some(&32) && max <= Some(&96),
                    "seed {seed}: {min:?}..{max:?} per bucket, 64 expected"
                );
            }
        }
    }
}
