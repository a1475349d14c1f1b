//! The memory store's names directory: the names of its counters, which its tables keep only
//! as hashes, so that they can be listed ([`ListKeys`](super::list::ListKeys)). Opt-in
//! ([`MemoryStoreBuilder::list_keys`](super::MemoryStoreBuilder::list_keys)).
//!
//! * **Written only when a key is first inserted** (right after the insertion, once the
//!   shard's lock is released), never on the path of a key that exists: that path stays as it
//!   was, allocation-free.
//! * **Bounded**: at most as many names as one algorithm's table holds keys. When it is full,
//!   a new name is not recorded and the directory counts it as missing; a listing then says
//!   it may be incomplete ([`KeyPage::complete`](super::list::KeyPage::complete)) until a
//!   prune finds that the directory names every key again.
//! * **Pruned lazily**: names of keys that were reset are dropped at once; names of keys that
//!   were swept or evicted are dropped when a listing meets them, and by [`Names::prune`]
//!   (a listing of a directory that had to drop names, and
//!   [`MemoryStore::forget_idle`](super::MemoryStore::forget_idle)).
//! * **Sorted**: a listing walks the names in order from its cursor (the last name returned),
//!   so a name present the whole time is returned exactly once.
//!
//! The directory's lock is never held with a shard's: recording happens after the insertion,
//! and a listing or a prune holds it only to copy names out or drop them, never while asking
//! a table.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

/// A name's entry: the algorithms (a bit per [`Algorithm`](crate::Algorithm) index) whose
/// tables may hold it, and when it was last recorded (so that a prune never drops a name that
/// was recorded again after the prune looked at it).
#[derive(Debug, Clone, Copy)]
struct Entry {
    algorithms: u8,
    recorded: u64,
}

/// The directory. See the module docs.
#[derive(Debug)]
pub(crate) struct Names {
    names: Mutex<BTreeMap<Box<str>, Entry>>,
    /// The most names held.
    capacity: usize,
    /// Recordings so far (the clock of [`Entry::recorded`]).
    recordings: AtomicU64,
    /// Names not recorded (the directory was full) since it last named every key.
    missing: AtomicU64,
}

/// Names copied out of the directory for a listing: each with its algorithms and recording.
pub(crate) type Candidates = Vec<(String, u8, u64)>;

impl Names {
    /// A directory of at most `capacity` names.
    pub(crate) fn new(capacity: usize) -> Self {
        Names {
            names: Mutex::new(BTreeMap::new()),
            capacity: capacity.max(1),
            recordings: AtomicU64::new(0),
            missing: AtomicU64::new(0),
        }
    }

    /// Records that `name` was inserted into the table of algorithm `index`. Called on an
    /// insertion only.
    #[cold]
    #[inline(never)]
    pub(crate) fn record(&self, name: &str, index: usize) {
        let bit = 1u8 << index;
        let recorded = self.recordings.fetch_add(1, Ordering::Relaxed) + 1;
        let mut names = self.names.lock();
        if let Some(entry) = names.get_mut(name) {
            entry.algorithms |= bit;
            entry.recorded = recorded;
            return;
        }
        if names.len() >= self.capacity {
            self.missing.fetch_add(1, Ordering::Relaxed);
            return;
        }
        names.insert(
            name.into(),
            Entry {
                algorithms: bit,
                recorded,
            },
        );
    }

    /// Drops `name` for algorithm `index` (its key was reset).
    pub(crate) fn forget(&self, name: &str, index: usize) {
        let mut names = self.names.lock();
        if let Some(entry) = names.get_mut(name) {
            entry.algorithms &= !(1u8 << index);
            if entry.algorithms == 0 {
                names.remove(name);
            }
        }
    }

    /// Up to `limit` names starting with `prefix` after `after` (exclusive), in order; and
    /// whether the names starting with `prefix` end there.
    pub(crate) fn page(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> (Candidates, bool) {
        let names = self.names.lock();
        let start = match after {
            Some(after) if after >= prefix => Bound::Excluded(after),
            _ => Bound::Included(prefix),
        };
        let mut out = Vec::with_capacity(limit.min(names.len()));
        let mut range = names
            .range::<str, _>((start, Bound::Unbounded))
            .take_while(|(name, _)| name.starts_with(prefix));
        for (name, entry) in range.by_ref().take(limit) {
            out.push((String::from(&**name), entry.algorithms, entry.recorded));
        }
        let done = range.next().is_none();
        (out, done)
    }

    /// Drops the names `stale` (each with the algorithms it is no longer held under and the
    /// recording it was seen at), unless recorded again since.
    pub(crate) fn drop_stale(&self, stale: &[(String, u8, u64)]) {
        if stale.is_empty() {
            return;
        }
        let mut names = self.names.lock();
        for (name, gone, recorded) in stale {
            if let Some(entry) = names.get_mut(name.as_str())
                && entry.recorded == *recorded
            {
                entry.algorithms &= !gone;
                if entry.algorithms == 0 {
                    names.remove(name.as_str());
                }
            }
        }
    }

    /// Whether names were dropped since the directory last named every key.
    pub(crate) fn missing(&self) -> bool {
        self.missing.load(Ordering::Relaxed) > 0
    }

    /// Drops the names of keys no table holds any more (`held(name, algorithms)` answers the
    /// algorithms whose table still holds it), in runs of at most `run` names copied out at a
    /// time; then, if the names left account for `keys` keys (every key the tables hold),
    /// the directory names every key again.
    pub(crate) fn prune(&self, run: usize, keys: usize, held: impl Fn(&str, u8) -> u8) {
        let missing = self.missing.load(Ordering::Relaxed);
        let mut after: Option<String> = None;
        let mut named = 0usize;
        loop {
            let (page, done) = self.page("", after.as_deref(), run);
            let mut stale = Vec::new();
            for (name, algorithms, recorded) in &page {
                let live = held(name, *algorithms);
                named += live.count_ones() as usize;
                if live != *algorithms {
                    stale.push((name.clone(), algorithms & !live, *recorded));
                }
            }
            self.drop_stale(&stale);
            after = page.into_iter().last().map(|(name, _, _)| name);
            if done || after.is_none() {
                break;
            }
        }
        if named >= keys {
            // Unless names were dropped meanwhile.
            let _ = self
                .missing
                .compare_exchange(missing, 0, Ordering::Relaxed, Ordering::Relaxed);
        }
    }
}
