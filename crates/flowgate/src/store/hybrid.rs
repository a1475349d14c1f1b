//! [`HybridStore`]: decide in process, share counts through a store in batches.
//!
//! Every decision is local (a hash-map lookup, no network), and every `sync_every` a background
//! task pushes the units granted since the last sync to the shared store as a
//! [charge](Ask::charge) (one
//! [`Store::check_many`] for all keys: with a [`RedisStore`](crate::store::RedisStore), one
//! batched script call) and reads back how much of the limit is left, `R`. The instance may then
//! grant its share of that until the next sync. A key seen for the first time starts with its
//! share of `B` (the burst).
//!
//! **Shares.** Instance `i` of `k` ([`HybridStoreBuilder::instance`]) takes `⌊(R + s) / k⌋`
//! units, where the slot `s = (i + hash(key)) mod k`. The `k` slots of a key are distinct when
//! the instances' numbers are, so the shares sum to exactly `R` (Hermite's identity): when one
//! unit is left, one instance may grant it, not all `k`; and which instance takes the
//! remainder varies from key to key. An instance without a number draws one at random: the
//! shares then sum to `R` on average and to at most `k · ⌈R / k⌉`.
//!
//! **Over-admission bound.** With `k` instances, burst `B` and no replenishment in between
//! (e.g. within one fixed window, or a bucket that does not refill meanwhile), the instances
//! together admit at most
//!
//! ```text
//! 2B                     with distinct instance numbers
//! B + k · ⌈B / k⌉        (≤ 2B + k) without
//! ```
//!
//! Proof: until the store's count reaches `B`, everything admitted is either counted in the
//! store (< `B`) or covered by some instance's current allowance; once it reaches `B`, every
//! new allowance is 0, so what is admitted afterwards was covered by the allowances handed out
//! before, at most one outstanding per instance, each at most `⌈B / k⌉` — and with distinct
//! slots, at most `Σ ⌊(B + s) / k⌋ = B` together. With replenishment, add what the store itself would grant
//! over one more sync interval. The overshoot is charged to the store as debt, so the fleet
//! repays it before the key admits again: over a long run the admitted rate stays at the
//! quota's. With evenly spaced syncs the overshoot is far smaller in
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
    /// This instance's number, `0..k`.
    instance: u64,
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
    instance: Option<u64>,
    sync_every: Duration,
}

impl<S: Store> HybridStore<S> {
    /// A builder over `store`: one instance, syncing every [`DEFAULT_SYNC_EVERY`].
    pub fn builder(store: S) -> HybridStoreBuilder<S> {
        HybridStoreBuilder {
            store,
            instances: 1,
            instance: None,
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

    /// This instance's number among the `k` (`0..k`, taken modulo `k`; e.g. a StatefulSet
    /// ordinal). Distinct numbers make the instances' shares of what is left sum to exactly
    /// what is left (see the [module docs](self)); without one, a random number is drawn.
    pub fn instance(mut self, instance: u64) -> Self {
        self.instance = Some(instance);
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
    /// simulated clock (`flowgate::simulate`, feature `simulate`, does this). `sync_every` is still the wait that
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
        let instance = self.instance.unwrap_or_else(random_u64) % self.instances;
        let shared = Arc::new(Shared {
            store: self.store,
            instances: self.instances,
            instance,
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

/// A random number, from the standard library's per-process hash keys.
fn random_u64() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(0u64)
}

/// FNV-1a: the same value for a key on every instance (std's hashers are seeded per process).
fn key_hash(key: &str) -> u64 {
    key.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

impl<S> Shared<S> {
    /// This instance's share of `units` for `key`: `⌊(units + slot) / k⌋`, the slots of a key
    /// distinct across distinctly numbered instances, so the `k` shares sum to `units`.
    fn share(&self, key: &str, units: u64) -> u64 {
        let k = self.instances;
        let slot = (self.instance + key_hash(key) % k) % k;
        // Written so that `units + slot` cannot overflow: ⌊(u + s)/k⌋ = ⌊u/k⌋ + ⌊(u%k + s)/k⌋.
        units / k + (units % k + slot) / k
    }
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
        // Units granted here were used already: they are charged, so the store counts all of
        // them, the overshoot included (as debt), and every allowance drops to 0 once the
        // limit is reached. A key with nothing pending is peeked.
        let requests: Vec<Ask<'_>> = batch
            .iter()
            .map(|(key, quota, pending)| Ask::new(key, quota).cost(*pending).charge(true))
            .collect();
        let results = self.store.check_many(&requests).await;
        let mut keys = self.keys.lock();
        for ((key, quota, pending), result) in batch.into_iter().zip(results) {
            let id = (key, quota.algorithm());
            let Some(entry) = keys.get_mut(&id) else {
                continue;
            };
            match result {
                Ok(global) => {
                    // Granted here since the snapshot was taken count against the new share.
                    entry.allowance = self
                        .share(&id.0, global.remaining)
                        .saturating_sub(entry.pending);
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

    /// Gives back `ask.cost` units from those granted here and not pushed yet; returns how
    /// many must be refunded in the shared store instead. With `partly` false, gives back
    /// nothing unless all of them can be.
    fn give_back_pending(&self, ask: Ask<'_>, partly: bool) -> u64 {
        let mut keys = self.shared.keys.lock();
        let Some(e) = keys.get_mut(&(Box::from(ask.key), ask.quota.algorithm())) else {
            return ask.cost;
        };
        let back = ask.cost.min(e.pending);
        if back < ask.cost && !partly {
            return ask.cost;
        }
        e.pending -= back;
        e.allowance += back;
        ask.cost - back
    }

    fn decide(&self, ask: Ask<'_>) -> Result<Decision, StoreError> {
        ask.check_cost()?;
        let Ask {
            key, quota, cost, ..
        } = ask;
        let shared = &*self.shared;
        let mut keys = shared.keys.lock();
        let entry = keys
            .entry((Box::from(key), quota.algorithm()))
            .or_insert_with(|| Entry {
                quota: *quota,
                allowance: shared.share(key, quota.burst()),
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
        if ask.charge {
            // Usage that happened: pending like any grant (pushed as a charge at the next
            // sync), whatever is left of the allowance.
            entry.allowance = entry.allowance.saturating_sub(cost);
            entry.pending = entry.pending.saturating_add(cost);
            let remaining = remaining.saturating_sub(entry.pending);
            return Ok(Decision::allow(quota, remaining, reset));
        }
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
    async fn refund(&self, ask: Ask<'_>) -> Result<(), StoreError> {
        let left = self.give_back_pending(ask, true);
        if left > 0 {
            self.shared.store.refund(ask.cost(left)).await?;
        }
        Ok(())
    }

    /// Answers at once when every unit is still pending here (the usual case: a refund right
    /// after the check that took them); `None`, giving nothing back, when some were pushed.
    fn refund_now(&self, ask: Ask<'_>) -> Option<Result<(), StoreError>> {
        (self.give_back_pending(ask, false) == 0).then_some(Ok(()))
    }

    async fn reset(&self, ask: Ask<'_>) -> Result<(), StoreError> {
        self.shared
            .keys
            .lock()
            .remove(&(Box::from(ask.key), ask.quota.algorithm()));
        self.shared.store.reset(ask).await
    }
}

#[cfg(all(test, feature = "tokio"))]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::store::MemoryStore;

    type Memory = Arc<MemoryStore<ManualClock>>;

    /// `k` numbered instances over one memory store, syncing only when told.
    fn fleet(k: u64) -> (Vec<HybridStore<Memory>>, Memory) {
        let clock = ManualClock::new(1 << 40);
        let memory = Arc::new(MemoryStore::builder().clock(clock).build());
        let fleet = (0..k)
            .map(|i| {
                HybridStore::builder(memory.clone())
                    .instances(k)
                    .instance(i)
                    .build_manual()
            })
            .collect();
        (fleet, memory)
    }

    /// Grants on `store` until it denies.
    #[allow(clippy::unwrap_used)] // a test helper: a failing store fails the test
    async fn drain(store: &HybridStore<Memory>, key: &str, q: &Quota) -> u64 {
        let mut granted = 0;
        while store.check(Ask::new(key, q)).await.unwrap().allowed {
            granted += 1;
            assert!(granted <= q.burst(), "granted more than the burst");
        }
        granted
    }

    #[tokio::test]
    async fn grants_its_share_between_syncs_and_pushes_counts() {
        let (fleet, memory) = fleet(3);
        let store = &fleet[0];
        let q = Quota::per_hour(30);
        // Before any sync: 30 / 3 = 10.
        assert_eq!(drain(store, "k", &q).await, 10);
        store.sync_now().await;
        assert_eq!(memory.peek(Ask::new("k", &q)).await.unwrap().remaining, 20);
        // Its share of the 20 left: 6 or 7, as its slot for "k" says.
        let share = drain(store, "k", &q).await;
        assert!((6..=7).contains(&share), "{share}");
        let d = store.check(Ask::new("k", &q)).await.unwrap();
        assert!(!d.allowed);
        assert_eq!(d.remaining, 20 - share);
        // Refunds come out of pending first.
        store.refund(Ask::new("k", &q).cost(2)).await.unwrap();
        store.sync_now().await;
        assert_eq!(
            memory.peek(Ask::new("k", &q)).await.unwrap().remaining,
            22 - share
        );
    }

    /// A charge is taken here whatever the allowance, and pushed as a charge: the shared
    /// store goes into debt, and every instance refuses after the next sync.
    #[tokio::test]
    async fn charges_are_taken_and_pushed_into_debt() {
        let (fleet, memory) = fleet(2);
        let q = Quota::per_hour(10);
        let d = fleet[0]
            .check(Ask::new("k", &q).cost(25).charge(true))
            .await
            .unwrap();
        assert!(d.allowed);
        assert_eq!(d.remaining, 0);
        fleet[0].sync_now().await;
        let shared = memory.peek(Ask::new("k", &q)).await.unwrap();
        assert!(!shared.allowed, "15 units of debt: {shared:?}");
        // 15 units beyond the bucket at 6 min each: 90 min until out of debt.
        assert_eq!(shared.retry_after, Duration::from_secs(90 * 60));
        for store in &fleet {
            let _registered = store.check(Ask::new("k", &q).cost(0)).await.unwrap();
            store.sync_now().await;
            assert!(!store.check(Ask::new("k", &q)).await.unwrap().allowed);
        }
    }

    #[tokio::test]
    async fn numbered_instances_share_exactly_what_is_left() {
        let q = Quota::per_hour(100);
        for k in [2u64, 3, 7] {
            for left in [0u64, 1, 2, 5, 13, 99] {
                let (fleet, memory) = fleet(k);
                // Use up all but `left` in the store, then let every instance see it.
                let key = format!("key-{k}-{left}");
                let used = Ask::new(&key, &q).cost(100 - left);
                assert!(memory.check(used).await.unwrap().allowed);
                for store in &fleet {
                    let _registered = store.check(Ask::new(&key, &q).cost(0)).await.unwrap();
                    store.sync_now().await;
                }
                let mut granted = 0;
                for store in &fleet {
                    granted += drain(store, &key, &q).await;
                }
                // Not k · ⌈left / k⌉ (one unit left would be granted k times): exactly `left`.
                assert_eq!(granted, left, "k = {k}, left = {left}");
            }
        }
    }

    #[test]
    fn shares_sum_to_the_units_for_every_key() {
        for k in 1..=9u64 {
            let shareds: Vec<Shared<()>> = (0..k)
                .map(|instance| Shared {
                    store: (),
                    instances: k,
                    instance,
                    sync_every: 1,
                    keys: Mutex::new(HashMap::new()),
                })
                .collect();
            for key in ["a", "b", "user:42", ""] {
                for units in [0, 1, 2, k - 1, k, k + 1, 1000, u64::MAX] {
                    let total: u128 = shareds
                        .iter()
                        .map(|s| u128::from(s.share(key, units)))
                        .sum();
                    assert_eq!(total, u128::from(units), "k {k} key {key:?} units {units}");
                }
            }
        }
    }
}
