//! A fast hasher for the tokenizer's tables.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// Multiplicative hashing for the merge table's integer keys (SipHash is several times slower
/// here and its DoS resistance buys nothing for keys read from a model file).
#[derive(Default)]
pub(super) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        // The product's high bits depend on every input bit, its low bits only on the low input
        // bits; hash tables index by the low bits, so bring the high ones down.
        self.0.rotate_left(26)
    }
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

pub(super) type IdMap<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;
pub(super) type IdSet = HashSet<u64, BuildHasherDefault<IdHasher>>;
/// Token text → id. Lookups hash every candidate merge, so speed matters more than SipHash's
/// flooding resistance (the keys come from the model file, not from users).
pub(super) type StrMap<V> = HashMap<Box<str>, V, BuildHasherDefault<IdHasher>>;
