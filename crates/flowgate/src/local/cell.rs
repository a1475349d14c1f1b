//! Cells: where one key's state lives, and how it is updated atomically.
//!
//! * [`WordCell`] holds a state that fits 63 bits (GCRA's time stamp) in an `AtomicU64` and
//!   updates it with a compare-and-swap loop: lock-free, 8 bytes.
//! * [`WideCell`] holds a state of up to 127 bits (leaky bucket, fixed and sliding window) in a
//!   128-bit atomic (`cmpxchg16b` on x86-64, `casp` on aarch64): lock-free, 16 bytes.
//! * [`LockCell`] holds a state that does not fit a word (the sliding log) behind a mutex.
//!
//! The top bit of an atomic cell marks it occupied, so a table slot needs no separate flag.
//! Occupancy only changes through `&mut` (under the table's write lock); concurrent updates
//! always keep the bit set.

use parking_lot::Mutex;

use crate::algorithm::{FixedWindow, Gcra, LeakyBucket, SlidingLog, SlidingWindow, State};
use crate::quota::Quota;

use std::sync::atomic::{AtomicU64, Ordering};

/// One key's state, updated atomically.
pub(crate) trait Cell: Send + Sync + 'static {
    /// The algorithm state the cell holds.
    type State: State + PartialEq;

    /// A cell holding nothing (an empty table slot).
    fn vacant() -> Self;

    /// A cell holding `state`.
    fn occupied(state: Self::State) -> Self;

    /// Whether the cell holds a state.
    fn is_occupied(&self) -> bool;

    /// Applies `f` to the state atomically: `f` sees a consistent state and its changes are
    /// kept only if no other update intervened (otherwise `f` runs again on the newer state).
    /// `f` must therefore be a pure function of the state.
    fn update<R>(&self, f: impl FnMut(&mut Self::State) -> R) -> R;

    /// A copy of the state.
    fn load(&self) -> Self::State;

    /// When the state becomes idle (see [`State::idle_at`]).
    fn idle_at(&self, quota: &Quota) -> crate::clock::Nanos {
        self.load().idle_at(quota)
    }
}

/// Marks an atomic cell as occupied.
const OCCUPIED: u64 = 1 << 63;

/// The compare-and-swap loop behind every lock-free cell: decode the current value, let `f`
/// update the state, encode it (keeping the occupancy mark of `current`), and swap it in if
/// nobody changed the value meanwhile — otherwise retry on the value found. A state `f` left
/// unchanged is not written at all, so denials and peeks never contend for the cache line.
///
/// `cas(expected, new)` must store `new` only if the value is still `expected`, returning the
/// value found otherwise. The loom model test drives this very function with loom's atomics.
#[inline]
pub(crate) fn cas_update<W: Copy + Eq, S, R>(
    mut current: W,
    decode: impl Fn(W) -> S,
    encode: impl Fn(&S, W) -> W,
    mut cas: impl FnMut(W, W) -> Result<(), W>,
    mut f: impl FnMut(&mut S) -> R,
) -> R {
    loop {
        let mut state = decode(current);
        let result = f(&mut state);
        let next = encode(&state, current);
        if next == current {
            return result;
        }
        match cas(current, next) {
            Ok(()) => return result,
            Err(actual) => current = actual,
        }
    }
}

/// [`cas_update`] for a [`WordCell`]'s encoding.
#[inline]
fn word_update<S: Word, R>(
    current: u64,
    cas: impl FnMut(u64, u64) -> Result<(), u64>,
    f: impl FnMut(&mut S) -> R,
) -> R {
    cas_update(
        current,
        |w| S::from_word(w & !OCCUPIED),
        |s, current| s.to_word() | (current & OCCUPIED),
        cas,
        f,
    )
}

/// A one-word state for [`WordCell`]: must fit in 63 bits.
pub(crate) trait Word: State + PartialEq + Copy {
    fn to_word(self) -> u64;
    fn from_word(word: u64) -> Self;
}

impl Word for Gcra {
    #[inline]
    fn to_word(self) -> u64 {
        // tat ≤ now + tolerance < 2^61 + 2^61: the top bit is free.
        self.tat
    }
    #[inline]
    fn from_word(word: u64) -> Self {
        Gcra { tat: word }
    }
}

/// A lock-free cell for a one-word state.
#[derive(Debug)]
pub(crate) struct WordCell<S> {
    word: AtomicU64,
    _state: std::marker::PhantomData<S>,
}

impl<S: Word> Cell for WordCell<S> {
    type State = S;

    fn vacant() -> Self {
        WordCell {
            word: AtomicU64::new(0),
            _state: std::marker::PhantomData,
        }
    }

    fn occupied(state: S) -> Self {
        WordCell {
            word: AtomicU64::new(state.to_word() | OCCUPIED),
            _state: std::marker::PhantomData,
        }
    }

    #[inline]
    fn is_occupied(&self) -> bool {
        self.word.load(Ordering::Relaxed) & OCCUPIED != 0
    }

    #[inline]
    fn update<R>(&self, f: impl FnMut(&mut S) -> R) -> R {
        word_update(
            self.word.load(Ordering::Acquire),
            |current, next| {
                self.word
                    .compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire)
                    .map(drop)
            },
            f,
        )
    }

    #[inline]
    fn load(&self) -> S {
        S::from_word(self.word.load(Ordering::Acquire) & !OCCUPIED)
    }
}

/// A two-word state for [`WideCell`]: must fit in 127 bits (the top bit of `hi` is the mark).
pub(crate) trait Wide: State + PartialEq + Copy {
    fn to_wide(self) -> (u64, u64);
    fn from_wide(hi: u64, lo: u64) -> Self;
}

impl Wide for LeakyBucket {
    #[inline]
    fn to_wide(self) -> (u64, u64) {
        // level ≤ tolerance ≤ 2^61.
        (self.level, self.updated)
    }
    #[inline]
    fn from_wide(hi: u64, lo: u64) -> Self {
        LeakyBucket {
            level: hi,
            updated: lo,
        }
    }
}

impl Wide for FixedWindow {
    #[inline]
    fn to_wide(self) -> (u64, u64) {
        // window = now / period (or a calendar period's start in seconds) < 2^63.
        (self.window, self.count)
    }
    #[inline]
    fn from_wide(hi: u64, lo: u64) -> Self {
        FixedWindow {
            window: hi,
            count: lo,
        }
    }
}

impl Wide for SlidingWindow {
    #[inline]
    fn to_wide(self) -> (u64, u64) {
        // Counts are at most the limit, which `Quota` caps at u32::MAX for this algorithm.
        (
            self.window,
            (self.current << 32) | (self.previous & 0xFFFF_FFFF),
        )
    }
    #[inline]
    fn from_wide(hi: u64, lo: u64) -> Self {
        SlidingWindow {
            window: hi,
            current: lo >> 32,
            previous: lo & 0xFFFF_FFFF,
        }
    }
}

mod wide {
    use super::*;
    use portable_atomic::AtomicU128;

    fn join(hi: u64, lo: u64) -> u128 {
        (u128::from(hi) << 64) | u128::from(lo)
    }

    fn split(v: u128) -> (u64, u64) {
        ((v >> 64) as u64, v as u64)
    }

    /// A lock-free cell for a two-word state.
    #[derive(Debug)]
    pub(crate) struct WideCell<S> {
        wide: AtomicU128,
        _state: std::marker::PhantomData<S>,
    }

    impl<S: Wide> Cell for WideCell<S> {
        type State = S;

        fn vacant() -> Self {
            WideCell {
                wide: AtomicU128::new(0),
                _state: std::marker::PhantomData,
            }
        }

        fn occupied(state: S) -> Self {
            let (hi, lo) = state.to_wide();
            WideCell {
                wide: AtomicU128::new(join(hi | OCCUPIED, lo)),
                _state: std::marker::PhantomData,
            }
        }

        #[inline]
        fn is_occupied(&self) -> bool {
            split(self.wide.load(Ordering::Relaxed)).0 & OCCUPIED != 0
        }

        #[inline]
        fn update<R>(&self, f: impl FnMut(&mut S) -> R) -> R {
            cas_update(
                self.wide.load(Ordering::Acquire),
                |v| {
                    let (hi, lo) = split(v);
                    S::from_wide(hi & !OCCUPIED, lo)
                },
                |state, current| {
                    let (hi, lo) = state.to_wide();
                    join(hi | (split(current).0 & OCCUPIED), lo)
                },
                |current, next| {
                    self.wide
                        .compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire)
                        .map(drop)
                },
                f,
            )
        }

        #[inline]
        fn load(&self) -> S {
            let (hi, lo) = split(self.wide.load(Ordering::Acquire));
            S::from_wide(hi & !OCCUPIED, lo)
        }
    }
}

pub(crate) use wide::WideCell;

/// A cell for states that do not fit in atomics, behind a mutex.
#[derive(Debug)]
pub(crate) struct LockCell<S> {
    /// `None` for a vacant slot.
    state: Mutex<Option<S>>,
    /// Mirrors `state.is_some()` so probes need not lock; only changes through `&mut`.
    occupied: bool,
}

impl<S: State + PartialEq> Cell for LockCell<S> {
    type State = S;

    fn vacant() -> Self {
        LockCell {
            state: Mutex::new(None),
            occupied: false,
        }
    }

    fn occupied(state: S) -> Self {
        LockCell {
            state: Mutex::new(Some(state)),
            occupied: true,
        }
    }

    #[inline]
    fn is_occupied(&self) -> bool {
        self.occupied
    }

    fn update<R>(&self, mut f: impl FnMut(&mut S) -> R) -> R {
        let mut guard = self.state.lock();
        f(guard.get_or_insert_with(S::default))
    }

    fn load(&self) -> S {
        self.state.lock().clone().unwrap_or_default()
    }

    fn idle_at(&self, quota: &Quota) -> crate::clock::Nanos {
        self.state.lock().as_ref().map_or(0, |s| s.idle_at(quota))
    }
}

/// The cell type that holds each algorithm's state.
pub(crate) type GcraCell = WordCell<Gcra>;
pub(crate) type LeakyCell = WideCell<LeakyBucket>;
pub(crate) type FixedCell = WideCell<FixedWindow>;
pub(crate) type SlidingCell = WideCell<SlidingWindow>;
pub(crate) type LogCell = LockCell<SlidingLog>;

/// Asks a cell for `cost` units. Shared by every limiter so the transition is written once.
#[inline]
pub(crate) fn check<C: Cell>(
    cell: &C,
    quota: &Quota,
    cost: u64,
    now: crate::clock::Nanos,
) -> crate::Decision {
    cell.update(|state| state.check(quota, cost, now))
}

/// One GCRA check through the same compare-and-swap loop and encoding as [`WordCell`], on
/// a word the caller owns: exposed (hidden) so `tests/loom.rs` can run it on loom's atomics
/// and explore every interleaving.
#[doc(hidden)]
pub fn model_gcra_check(
    current: u64,
    cas: impl FnMut(u64, u64) -> Result<(), u64>,
    quota: &Quota,
    cost: u64,
    now: crate::clock::Nanos,
) -> crate::Decision {
    word_update::<Gcra, _>(current, cas, |state| state.check(quota, cost, now))
}

/// The value of a [`WordCell`] holding a fresh GCRA state, for the loom model test.
#[doc(hidden)]
pub const MODEL_GCRA_FRESH: u64 = OCCUPIED;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wide_states_round_trip_and_keep_the_mark() {
        let s = SlidingWindow {
            window: 123_456,
            current: u64::from(u32::MAX),
            previous: 7,
        };
        let cell = SlidingCell::occupied(s);
        assert!(cell.is_occupied());
        assert_eq!(cell.load(), s);
        cell.update(|st| st.current = 0);
        assert!(cell.is_occupied());
        assert_eq!(cell.load().previous, 7);
        assert!(!SlidingCell::vacant().is_occupied());
    }

    #[test]
    fn word_cell_keeps_the_mark_across_updates() {
        let cell = GcraCell::occupied(Gcra { tat: 0 });
        assert!(cell.is_occupied());
        cell.update(|s| s.tat = 42);
        assert_eq!(cell.load().tat, 42);
        assert!(cell.is_occupied());
    }
}
