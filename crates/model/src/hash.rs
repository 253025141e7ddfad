//! The hash of every map keyed by what clients send: trace ids in the assembly's maps,
//! trace and span ids in the analysis's (the lineage's parent index, the offline duplicate
//! check, the live chunking), service, hint and operation names in the lineage's (clock
//! bounds, edges), attribute names in the encoder's alias table.
//!
//! Every accepted span is looked up by its trace id in the open-trace map and in both
//! generations of released ids, so the hash runs three times per span, and once per
//! attribute. std's SipHash-1-3 took ~4% of the collector's CPU under load (`perf record`,
//! issue 6). Ids are random by W3C Trace Context, but chosen by clients: this hash is
//! keyed with a random seed per process and ends with a full avalanche (murmur3's fmix64),
//! so every bit of a key reaches the bucket bits and colliding keys cannot be precomputed.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, Hasher};

/// A map keyed by what clients send (names, ids), with [`KeyedHash`].
pub type KeyedMap<K, V> = HashMap<K, V, KeyedHash>;
/// A set of what clients send, with [`KeyedHash`].
pub type KeyedSet<K> = HashSet<K, KeyedHash>;

/// Builds [`KeyedHasher`]s sharing one random seed.
#[derive(Clone, Copy, Debug)]
pub struct KeyedHash {
    seed: u64,
}

impl Default for KeyedHash {
    fn default() -> Self {
        KeyedHash {
            seed: std::hash::RandomState::new().hash_one(0x5eed_u64),
        }
    }
}

impl BuildHasher for KeyedHash {
    type Hasher = KeyedHasher;

    fn build_hasher(&self) -> KeyedHasher {
        KeyedHasher { state: self.seed }
    }
}

/// Multiply-rotate over 8-byte words, fmix64 at the end.
#[derive(Clone, Copy, Debug)]
pub struct KeyedHasher {
    state: u64,
}

const K: u64 = 0x9e37_79b9_7f4a_7c15;

impl KeyedHasher {
    fn mix(&mut self, word: u64) {
        self.state = (self.state ^ word).wrapping_mul(K).rotate_left(31);
    }
}

impl Hasher for KeyedHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.mix(u64::from_le_bytes(word));
        }
        // The last 1-7 bytes as one word, read in fixed-size pieces (overlapping where the
        // length is not a power of two) so every byte lands in it: copying them into a
        // zeroed word took a `memcpy` call per string hashed (callgrind of the lineage,
        // whose maps key by service and operation names).
        let rest = chunks.remainder();
        let n = rest.len();
        let word = match n {
            0 => return,
            1..=3 => {
                u64::from(rest[0]) | u64::from(rest[n / 2]) << 8 | u64::from(rest[n - 1]) << 16
            }
            _ => {
                let piece = |at: usize| {
                    let mut word = [0u8; 4];
                    word.copy_from_slice(&rest[at..at + 4]);
                    u64::from(u32::from_le_bytes(word))
                };
                piece(0) | piece(n - 4) << 32
            }
        };
        self.mix(word ^ ((n as u64) << 56));
    }

    // `str`'s terminator (and any byte key) mixes as a word, not through `write`'s loop.
    fn write_u8(&mut self, n: u8) {
        self.mix(u64::from(n));
    }

    fn write_usize(&mut self, n: usize) {
        self.mix(n as u64);
    }

    // Integer ids (the lineage's index keys) mix as words, without the byte loop `write`
    // would run for them.
    fn write_u64(&mut self, n: u64) {
        self.mix(n);
    }

    fn write_u128(&mut self, n: u128) {
        self.mix(n as u64);
        self.mix((n >> 64) as u64);
    }

    fn finish(&self) -> u64 {
        let mut h = self.state;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^ (h >> 33)
    }
}

/// A hash of `parts` that every process computes alike (a fixed seed), for values kept in
/// the span table and compared for equality only (see `schema::TARGET_HASH`). Each part is
/// followed by its length, so `("a", "b")` and `("ab", "")` differ.
pub fn fixed_hash(parts: &[&[u8]]) -> i64 {
    let mut hasher = KeyedHasher {
        state: 0x7374_6f72_6d67_6c73,
    };
    for part in parts {
        hasher.write(part);
        hasher.write_usize(part.len());
    }
    hasher.finish() as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Strings of every length up to three words: changing any one byte changes the hash;
    /// a byte the tail read missed would leave it equal every time.
    #[test]
    fn every_byte_of_a_string_reaches_the_hash() {
        let hash = KeyedHash::default();
        for len in 1..=24 {
            let text: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
            let base = hash.hash_one(&text[..]);
            for at in 0..len {
                let mut changed = text.clone();
                changed[at] ^= 0x20;
                assert_ne!(hash.hash_one(&changed[..]), base, "length {len}, byte {at}");
            }
        }
    }

    /// Flipping any one of the 128 bits of an id, as bytes or as one integer, flips about
    /// half of the hash's bits (full avalanche), and almost always changes both the low
    /// (bucket) bits and the top 7 bits hashbrown probes with; two builders of one instance
    /// agree, two instances do not. The bounds sit many standard deviations from what a
    /// good hash gives, whatever the random seed.
    #[test]
    fn every_bit_reaches_the_bucket_bits() {
        const TRIALS: u32 = 256;
        let hash = KeyedHash::default();
        let as_bytes = |id: [u8; 16]| hash.hash_one(id);
        let as_integer = |id: [u8; 16]| hash.hash_one(u128::from_le_bytes(id));
        for (form, hash_of) in [
            ("bytes", &as_bytes as &dyn Fn(_) -> u64),
            ("u128", &as_integer),
        ] {
            for bit in 0..128 {
                let (mut flipped_bits, mut low_changed, mut top_changed) = (0, 0, 0);
                for t in 0..TRIALS {
                    let base = (u128::from(t) + 1)
                        .wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835)
                        .to_le_bytes();
                    let mut id = base;
                    id[bit / 8] ^= 1 << (bit % 8);
                    let diff = hash_of(base) ^ hash_of(id);
                    flipped_bits += diff.count_ones();
                    low_changed += u32::from(diff & 0xff != 0);
                    top_changed += u32::from(diff >> 57 != 0);
                }
                let mean = f64::from(flipped_bits) / f64::from(TRIALS);
                assert!(
                    (28.0..36.0).contains(&mean),
                    "{form} bit {bit}: {mean} bits flip"
                );
                assert!(
                    low_changed >= TRIALS - 16,
                    "{form} bit {bit}: low bits {low_changed}"
                );
                assert!(
                    top_changed >= TRIALS - 16,
                    "{form} bit {bit}: top bits {top_changed}"
                );
            }
        }
        let id = [0x5au8; 16];
        assert_eq!(hash.hash_one(id), hash.clone().hash_one(id));
        assert_ne!(
            KeyedHash::default().hash_one(id),
            hash.hash_one(id),
            "seeded"
        );
    }
}
