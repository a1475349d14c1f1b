//! [`HybridStore`]: decide in process, share counts through a store in batches.
//!
//! Every decision is local (a hash-map lookup, no network), and every `sync_every` a background
//! task pushes the units granted since the last sync to the shared store (one
//! [`Store::check_many`] for all keys: with a [`RedisStore`](crate::store::RedisStore), one
//! batched script call) and reads back how much of the limit is left, `R`. The instance may then
//! grant its share of that, `⌈R / k⌉` for `k` instances, until the next sync. A key seen for the
//! first time starts with `⌈B / k⌉` (`B` = burst).
//!
//! **Over-admission bound.** With `k` instances, burst `B` and no replenishment in between
//! (e.g. within one fixed window, or a bucket that does not refill meanwhile), the instances
//! together admit at most
//!
//! ```text
//! B + k · ⌈B / k⌉        (≤ 2B + k)
//! ```
//!
//! Proof: until the store's count reaches `B`, everything admitted is either counted in the
//! store (< `B`) or covered by some instance's current allowance; once it reaches `B`, every
//! new allowance is 0, so what is admitted afterwards was covered by the allowances handed out
//! before, each at most `⌈B / k⌉`. With replenishment, add what the store itself would grant
//! over one more sync interval. With evenly spaced syncs the overshoot is far smaller in
//! practice — about `B·(k − 1)/(2k)` in the worst phase alignment — see `tests/hybrid.rs`, which
//! drives 3 instances at 5× the limit and checks the bound. Under-admission is at most the
//! allowances left unused when the traffic stops.
//!
//! The trade: no network round trip per decision and one store call per key per interval
//! instead of one per request, for a bounded overshoot. Decisions carry the store's figures
//! from the last sync (`reset_after`), minus what this instance granted since (`remaining`).
//! When the store fails, units stay pending and are pushed at the next successful sync; in the
//! meantime the instance grants at most what is left of its allowance.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use super::{Ask, Store, StoreError};
use crate::clock::Nanos;
use crate::decision::Decision;
use crate::quota::{Algorithm, Quota};

/// Default time between syncs.
pub const DEFAULT_SYNC_EVERY: Duration = Duration::from_millis(50);

/// Keys idle this many syncs are forgotten locally.
const IDLE_SYNCS: u32 = 100;

/// Local decisions, synchronized with a shared store in batches. See the [module docs](self).
#[derive(Debug)]
pub struct HybridStore<S> {
    shared: Arc<Shared<S>>,
    /// The background sync task, stopped when the store is dropped; `None` when the caller
    /// syncs ([`HybridStoreBuilder::build_manual`]).
    #[cfg(feature = "tokio")]
    task: Option<tokio::task::JoinHandle<()>>,
}

#[derive(Debug)]
struct Shared<S> {
    /// The shared store the counts go to.
    store: S,
    /// Instances sharing the store (`k`).
    instances: u64,
    /// Time between syncs, in ns.
    sync_every: Nanos,
    /// Per (key, algorithm): this instance's view.
    keys: Mutex<HashMap<(Box<str>, Algorithm), Entry>>,
}

#[derive(Debug, Clone)]
struct Entry {
    /// The quota last used with the key.
    quota: Quota,
    /// Units this instance may still grant before the next sync.
    allowance: u64,
    /// Units granted since the last sync, not yet in the store.
    pending: u64,
    /// The store's answer at the last sync (`None` before the first).
    global: Option<Decision>,
    /// Syncs since the key was last used.
    idle: u32,
}

/// Builds a [`HybridStore`].
#[derive(Debug)]
pub struct HybridStoreBuilder<S> {
    store: S,
    instances: u64,
    sync_every: Duration,
}

impl<S: Store> HybridStore<S> {
    /// A builder over `store`: one instance, syncing every [`DEFAULT_SYNC_EVERY`].
    pub fn builder(store: S) -> HybridStoreBuilder<S> {
        HybridStoreBuilder {
            store,
            instances: 1,
            sync_every: DEFAULT_SYNC_EVERY,
        }
    }
}

impl<S: Store + 'static> HybridStoreBuilder<S> {
    /// How many instances share the store (`k`, default 1): each takes `1/k` of what is left
    /// at every sync.
    pub fn instances(mut self, instances: u64) -> Self {
        self.instances = instances.max(1);
        self
    }

    /// Time between syncs (default [`DEFAULT_SYNC_EVERY`]; at least 1 ms).
    pub fn sync_every(mut self, every: Duration) -> Self {
        self.sync_every = every.max(Duration::from_millis(1));
        self
    }

    /// Builds the store and starts its sync task on the current tokio runtime.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime (as `tokio::spawn` does).
    #[cfg(feature = "tokio")]
    pub fn build(self) -> HybridStore<S> {
        let every = self.sync_every;
        let mut store = self.build_manual();
        store.task = Some(tokio::spawn(sync_loop(
            Arc::downgrade(&store.shared),
            every,
        )));
        store
    }

    /// Builds the store without a sync task: counts reach the shared store only when the
    /// caller calls [`sync_now`](HybridStore::sync_now), e.g. every `sync_every` of a
    /// simulated clock ([`crate::simulate`] does this). `sync_every` is still the wait that
    /// denials report. Needs no runtime.
    ///
    /// ```
    /// use flowgate::store::{Ask, HybridStore, MemoryStore, Store};
    /// use flowgate::Quota;
    /// let store = HybridStore::builder(MemoryStore::new()).instances(2).build_manual();
    /// let quota = Quota::per_minute(10);
    /// // Before the first sync each of the 2 instances may grant ⌈10 / 2⌉ = 5.
    /// let granted = (0..10)
    ///     .filter(|_| store.check_now(Ask::new("k", &quota)).unwrap().unwrap().allowed)
    ///     .count();
    /// assert_eq!(granted, 5);
    /// ```
    pub fn build_manual(self) -> HybridStore<S> {
        let shared = Arc::new(Shared {
            store: self.store,
            instances: self.instances,
            sync_every: crate::clock::nanos(self.sync_every),
            keys: Mutex::new(HashMap::new()),
        });
        HybridStore {
            shared,
            #[cfg(feature = "tokio")]
            task: None,
        }
    }
}

#[cfg(feature = "tokio")]
impl<S> Drop for HybridStore<S> {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

#[cfg(feature = "tokio")]
async fn sync_loop<S: Store>(shared: std::sync::Weak<Shared<S>>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        shared.sync().await;
    }
}

fn share(units: u64, instances: u64) -> u64 {
    units.div_ceil(instances)
}

impl<S: Store> Shared<S> {
    /// Pushes pending units and refreshes allowances, for every key used recently.
    async fn sync(&self) {
        let batch: Vec<(Box<str>, Quota, u64)> = {
            let mut keys = self.keys.lock();
            keys.retain(|_, e| e.pending > 0 || e.idle < IDLE_SYNCS);
            keys.iter_mut()
                .filter_map(|((key, _), e)| {
                    e.idle += 1;
                    let pending = std::mem::take(&mut e.pending);
                    (e.idle <= 2 || pending > 0).then(|| (key.clone(), e.quota, pending))
                })
                .collect()
        };
        if batch.is_empty() {
            return;
        }
        let requests: Vec<Ask<'_>> = batch
            .iter()
            .map(|(key, quota, pending)| Ask::new(key, quota).cost(*pending))
            .collect();
        let mut results = self.store.check_many(&requests).await;
        // Units that did not fit were granted here already (the overshoot): push what still
        // fits, so the store's count reaches the limit and every allowance drops to 0.
        let overflow: Vec<(usize, u64)> = results
            .iter()
            .enumerate()
            .filter_map(|(i, r)| match r {
                Ok(d) if !d.allowed && d.remaining > 0 => Some((i, d.remaining)),
                _ => None,
            })
            .collect();
        if !overflow.is_empty() {
            let retry: Vec<Ask<'_>> = overflow
                .iter()
                .map(|&(i, fits)| requests[i].cost(fits.min(requests[i].cost)))
                .collect();
            let again = self.store.check_many(&retry).await;
            for (&(i, _), result) in overflow.iter().zip(again) {
                results[i] = result;
            }
        }
        let mut keys = self.keys.lock();
        for ((key, quota, pending), result) in batch.into_iter().zip(results) {
            let Some(entry) = keys.get_mut(&(key, quota.algorithm())) else {
                continue;
            };
            match result {
                Ok(global) => {
                    // Granted here since the snapshot was taken count against the new share.
                    entry.allowance =
                        share(global.remaining, self.instances).saturating_sub(entry.pending);
                    entry.global = Some(global);
                }
                Err(e) if e.is_transient() => entry.pending += pending,
                // A store that cannot take these units never will: drop them, keep deciding.
                Err(_) => {}
            }
        }
    }
}

impl<S: Store> HybridStore<S> {
    /// Pushes pending counts now, as the background task does every `sync_every`.
    pub async fn sync_now(&self) {
        self.shared.sync().await;
    }

    /// The shared store.
    pub fn inner(&self) -> &S {
        &self.shared.store
    }

    fn decide(&self, ask: Ask<'_>) -> Result<Decision, StoreError> {
        let Ask {
            key, quota, cost, ..
        } = ask;
        quota.check_cost(cost)?;
        let shared = &*self.shared;
        let mut keys = shared.keys.lock();
        let entry = keys
            .entry((Box::from(key), quota.algorithm()))
            .or_insert_with(|| Entry {
                quota: *quota,
                allowance: share(quota.burst(), shared.instances),
                pending: 0,
                global: None,
                idle: 0,
            });
        entry.quota = *quota;
        entry.idle = 0;
        let (remaining, reset, retry) = match entry.global {
            Some(g) => (
                g.remaining,
                crate::clock::nanos(g.reset_after),
                crate::clock::nanos(g.retry_after),
            ),
            None => (quota.burst(), 0, 0),
        };
        if cost > entry.allowance {
            let remaining = remaining.saturating_sub(entry.pending);
            // More may be handed out at the next sync, unless the store had nothing left.
            let wait = if remaining > 0 {
                shared.sync_every
            } else {
                retry.max(shared.sync_every)
            };
            return Ok(Decision::deny(quota, remaining, reset, wait));
        }
        entry.allowance -= cost;
        entry.pending += cost;
        let remaining = remaining.saturating_sub(entry.pending);
        Ok(Decision::allow(quota, remaining, reset))
    }
}

impl<S: Store> Store for HybridStore<S> {
    async fn check(&self, ask: Ask<'_>) -> Result<Decision, StoreError> {
        self.decide(ask)
    }

    /// Always answers: every decision is local.
    fn check_now(&self, ask: Ask<'_>) -> Option<Result<Decision, StoreError>> {
        Some(self.decide(ask))
    }

    /// Gives back units not yet pushed; the rest are refunded in the store.
    async fn refund(&self, key: &str, quota: &Quota, units: u64) -> Result<(), StoreError> {
        let left = {
            let mut keys = self.shared.keys.lock();
            match keys.get_mut(&(Box::from(key), quota.algorithm())) {
                Some(e) => {
                    let back = units.min(e.pending);
                    e.pending -= back;
                    e.allowance += back;
                    units - back
                }
                None => units,
            }
        };
        if left > 0 {
            self.shared.store.refund(key, quota, left).await?;
        }
        Ok(())
    }

    async fn reset(&self, key: &str, quota: &Quota) -> Result<(), StoreError> {
        self.shared
            .keys
            .lock()
            .remove(&(Box::from(key), quota.algorithm()));
        self.shared.store.reset(key, quota).await
    }
}

#[cfg(all(test, feature = "tokio"))]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::store::MemoryStore;

    #[tokio::test]
    async fn grants_its_share_between_syncs_and_pushes_counts() {
        let clock = ManualClock::new(1 << 40);
        let memory = MemoryStore::builder().clock(clock.clone()).build();
        let store = HybridStore::builder(memory)
            .instances(3)
            .sync_every(Duration::from_secs(3600))
            .build();
        let q = Quota::per_hour(30);
        // Before any sync: ⌈30 / 3⌉ = 10.
        for _ in 0..10 {
            assert!(store.check(Ask::new("k", &q)).await.unwrap().allowed);
        }
        assert!(!store.check(Ask::new("k", &q)).await.unwrap().allowed);
        store.sync_now().await;
        // The store has 10 of 30 used: ⌈20 / 3⌉ = 7 more here.
        assert_eq!(store.inner().peek("k", &q).await.unwrap().remaining, 20);
        for _ in 0..7 {
            assert!(store.check(Ask::new("k", &q)).await.unwrap().allowed);
        }
        let d = store.check(Ask::new("k", &q)).await.unwrap();
        assert!(!d.allowed);
        assert_eq!(d.remaining, 13);
        // Refunds come out of pending first.
        store.refund("k", &q, 2).await.unwrap();
        store.sync_now().await;
        assert_eq!(store.inner().peek("k", &q).await.unwrap().remaining, 15);
    }
}
