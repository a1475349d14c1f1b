//! The heaviest keys of an unbounded stream in fixed memory: [`TopKeys`], for "which keys are
//! limited most" (a dashboard's top limited keys, fed every denied request).
//!
//! [`TopKeys`] is the Space-Saving algorithm (Metwally, Agrawal and El Abbadi, 2005), sharded
//! by key hash with a mutex per shard so that many threads can record at once. It keeps a
//! fixed number of counters, allocated when it is built: memory does not grow with the number
//! of distinct keys, and recording allocates nothing ([`TopKeys::memory_bytes`]).
//!
//! ## Error bound
//!
//! A shard with `c` counters that has seen `N` units (the sum of the weights recorded for its
//! keys) guarantees, for every key routed to it (Metwally et al., lemmas 3.3–3.5):
//!
//! * **no key is missed**: every key whose true count exceeds the shard's smallest counter
//!   `m` — and so every key with a true count above `N / c`, since `m ≤ N / c` — has a
//!   counter;
//! * **counts are close**: a reported [`count`](TopKey::count) is never below the true count
//!   and overestimates it by at most the key's [`error`](TopKey::error), which is at most `m`.
//!   So the true count lies in `[count − error, count]`.
//!
//! Keys are spread over the shards by a keyed hash, so each shard sees about `N_total / S`
//! units with `c = capacity / S` counters: the bound is about `N_total / capacity` for every
//! shard, as for one unsharded table of `capacity` counters, up to the spread between shards.
//! [`TopKeys::floors`] reports each shard's `m`.
//!
//! Keys are identified by a 64-bit keyed hash (seeded at random per `TopKeys`): two keys
//! share a counter only if their hashes collide, about one chance in 2⁶⁴ per pair. A key's
//! name is kept for display up to [`MAX_KEY_LEN`] bytes ([`TopKey::truncated`] beyond).
//!
//! ```
//! use flowgate::top::TopKeys;
//!
//! let top = TopKeys::new(64);
//! for i in 0..10_000u32 {
//!     top.record(format!("client-{}", i % 1_000)); // 1,000 keys, 10 each
//!     top.record("abuser");                         // one key, 10,000
//! }
//! let heaviest = &top.top(1)[0];
//! assert_eq!(heaviest.key, "abuser");
//! assert!(heaviest.count - heaviest.error <= 10_000 && 10_000 <= heaviest.count);
//! ```

mod space_saving;

use std::hash::BuildHasher;

use parking_lot::Mutex;

use space_saving::Table;

/// Bytes of a key's name kept for display (the service's counter names run to 60–100 bytes).
pub const MAX_KEY_LEN: usize = 96;

/// Counters of [`TopKeys::default`].
pub const DEFAULT_CAPACITY: usize = 1024;

/// One heavy key, as [`TopKeys::top`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopKey {
    /// The key's name (its first [`MAX_KEY_LEN`] bytes; invalid UTF-8 replaced).
    pub key: String,
    /// Whether the name was cut at [`MAX_KEY_LEN`] bytes.
    pub truncated: bool,
    /// The estimated count: at least the true count, and at most `error` above it.
    pub count: u64,
    /// The most by which `count` may overestimate the true count.
    pub error: u64,
}

impl TopKey {
    /// The least the true count can be: `count − error`.
    pub fn guaranteed(&self) -> u64 {
        self.count - self.error
    }
}

/// The heaviest keys of a stream, in fixed memory, safe to feed from many threads. See the
/// [module docs](self) for the error bound.
///
/// ```
/// use flowgate::top::TopKeys;
/// let top = TopKeys::with_shards(256, 4);
/// top.record_n("tenant:7", 5);
/// top.record("tenant:9");
/// let keys: Vec<(String, u64)> = top.top(10).into_iter().map(|k| (k.key, k.count)).collect();
/// assert_eq!(keys, [("tenant:7".to_owned(), 5), ("tenant:9".to_owned(), 1)]);
/// assert_eq!(top.total(), 6);
/// ```
pub struct TopKeys {
    /// Space-Saving tables; a key goes to the shard its hash's top bits name.
    shards: Box<[Mutex<Table>]>,
    /// Keyed hash of key names (random seed per instance).
    hasher: foldhash::quality::RandomState,
    /// log2 of the number of shards (0 for one shard).
    shard_bits: u32,
}

impl Default for TopKeys {
    /// [`DEFAULT_CAPACITY`] counters.
    fn default() -> Self {
        TopKeys::new(DEFAULT_CAPACITY)
    }
}

impl std::fmt::Debug for TopKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TopKeys")
            .field("capacity", &self.capacity())
            .field("shards", &self.shards.len())
            .finish_non_exhaustive()
    }
}

impl TopKeys {
    /// About `capacity` counters in all (at least one per shard), over 4 shards per CPU
    /// (rounded to a power of two, at most 64, and no more than `capacity / 16` so each shard
    /// keeps enough counters for the bound).
    pub fn new(capacity: usize) -> Self {
        let cpus = std::thread::available_parallelism().map_or(4, |n| n.get());
        let shards = (cpus * 4).min(64).min(capacity / 16).max(1);
        Self::with_shards(capacity, shards)
    }

    /// `capacity` counters spread over `shards` shards (rounded up to a power of two; each
    /// gets `⌈capacity / shards⌉`, at least 1).
    pub fn with_shards(capacity: usize, shards: usize) -> Self {
        let shards = shards.clamp(1, 1 << 16).next_power_of_two();
        let per_shard = capacity.div_ceil(shards).max(1);
        TopKeys {
            shards: (0..shards)
                .map(|_| Mutex::new(Table::new(per_shard)))
                .collect(),
            hasher: foldhash::quality::RandomState::default(),
            shard_bits: shards.trailing_zeros(),
        }
    }

    /// Records one occurrence of `key`.
    #[inline]
    pub fn record(&self, key: impl AsRef<[u8]>) {
        self.record_n(key, 1);
    }

    /// Records `weight` occurrences of `key` at once (e.g. a request's cost).
    #[inline]
    pub fn record_n(&self, key: impl AsRef<[u8]>, weight: u64) {
        let key = key.as_ref();
        let hash = self.hasher.hash_one(key);
        let shard = if self.shard_bits == 0 {
            0
        } else {
            (hash >> (64 - self.shard_bits)) as usize
        };
        self.shards[shard].lock().record(hash, key, weight);
    }

    /// The `n` keys with the highest counts, highest first (equal counts: by name, then by
    /// hash, so the order is stable).
    pub fn top(&self, n: usize) -> Vec<TopKey> {
        let mut all: Vec<(TopKey, u64)> = Vec::new();
        for shard in self.shards.iter() {
            let table = shard.lock();
            all.extend(table.entries().map(|e| {
                (
                    TopKey {
                        key: String::from_utf8_lossy(&e.name[..e.len as usize]).into_owned(),
                        truncated: e.truncated,
                        count: e.count,
                        error: e.error,
                    },
                    e.hash,
                )
            }));
        }
        all.sort_unstable_by(|(a, ha), (b, hb)| {
            b.count
                .cmp(&a.count)
                .then_with(|| a.key.cmp(&b.key))
                .then(ha.cmp(hb))
        });
        all.truncate(n);
        all.into_iter().map(|(key, _)| key).collect()
    }

    /// Units recorded since the start (or the last [`clear`](Self::clear)).
    pub fn total(&self) -> u64 {
        self.shards.iter().map(|s| s.lock().total).sum()
    }

    /// Each shard's smallest counter (0 while it has free counters): the most any key it
    /// does not report can have had, and the bound on the error of those it does.
    pub fn floors(&self) -> Vec<u64> {
        self.shards.iter().map(|s| s.lock().floor()).collect()
    }

    /// Counters in all.
    pub fn capacity(&self) -> usize {
        self.shards.len() * self.per_shard()
    }

    fn per_shard(&self) -> usize {
        self.shards
            .first()
            .map_or(0, |s| s.lock().entries_capacity())
    }

    /// Bytes this summary occupies — all allocated when it was built; recording never
    /// allocates, whatever the number of distinct keys.
    pub fn memory_bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + std::mem::size_of_val(&*self.shards)
            + self
                .shards
                .iter()
                .map(|s| s.lock().heap_bytes())
                .sum::<usize>()
    }

    /// Forgets every key (the counters stay allocated).
    pub fn clear(&self) {
        for shard in self.shards.iter() {
            shard.lock().clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sharded_tables_report_the_heaviest_keys_in_order() {
        let top = TopKeys::with_shards(64, 4);
        assert_eq!(top.capacity(), 64);
        for (key, n) in [("a", 30u64), ("b", 20), ("c", 10), ("d", 10)] {
            for _ in 0..n {
                top.record(key);
            }
        }
        let got: Vec<(String, u64, u64)> = top
            .top(3)
            .into_iter()
            .map(|k| (k.key, k.count, k.error))
            .collect();
        assert_eq!(
            got,
            [
                ("a".into(), 30, 0),
                ("b".into(), 20, 0),
                ("c".into(), 10, 0)
            ]
        );
        assert_eq!(top.total(), 70);
        assert_eq!(top.floors(), [0, 0, 0, 0]);
        let before = top.memory_bytes();
        top.clear();
        assert_eq!((top.total(), top.top(10).len()), (0, 0));
        assert_eq!(top.memory_bytes(), before);
        assert!(format!("{top:?}").contains("capacity: 64"));
    }
}
