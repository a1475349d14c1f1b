//! [`FallbackStore`]: what to decide when the shared store cannot answer.
//!
//! Wraps any [`Store`] (typically a [`RedisStore`](crate::store::RedisStore)). On a *transient*
//! error (timeout, unreachable) a request is decided by its [`FailMode`] instead of failing:
//!
//! * [`Open`](FailMode::Open): allowed, reported as if the limit were untouched;
//! * [`Closed`](FailMode::Closed): denied, with `retry_after` the time until the store is tried
//!   again;
//! * [`Local`](FailMode::Local): decided by an in-process [`MemoryStore`] holding this
//!   instance's share of the quota: `limit / instances` and `burst / instances` (at least 1),
//!   where `instances` is how many service instances share the store. Together the instances
//!   then admit about the quota while the store is away.
//!
//! A [charge](Ask::charge) is never denied: open and closed record it nowhere (it is lost,
//! and counted), local charges this instance's share.
//!
//! Every such decision has [`Decision::fallback`] set to the mode used, and is counted in
//! [`FallbackStats`] (for metrics). Errors that retrying cannot fix (a cost above the burst, a
//! script error) are returned as they are.
//!
//! A **circuit breaker** keeps a dead store from costing a timeout on every call: after
//! `failure_threshold` consecutive transient failures it opens, and calls fall back at once,
//! without touching the store. Every `open_for` one call is let through as a probe; when it
//! succeeds the breaker closes and everything goes to the store again. So an outage costs at
//! most a timeout for the first few calls and one probe per `open_for` after that, and recovery
//! takes at most `open_for` once the store is back.
//!
//! With the `tracing` feature, the breaker logs each change: a WARN line when it opens (with
//! the error that opened it) and an INFO line when it closes (with how long it was open) —
//! one pair per outage, however many requests fell back.
//!
//! Each request's mode travels with it ([`Ask::fail`]), so limits with different `fail`
//! settings can share one store; a request that names none gets the store's default
//! ([`FallbackStoreBuilder::fail`], [`FailMode::Open`] unless set). This wrapper is the one
//! place where fail modes are applied: the tower layer, the gateway and the service only
//! render what it decided.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use flowgate::{store::{Ask, FallbackStore, MemoryStore, Store}, FailMode, Quota};
//! // Any store works; in production this wraps a RedisStore.
//! let store = FallbackStore::builder(MemoryStore::new())
//!     .fail(FailMode::Local)
//!     .instances(4)
//!     .build();
//! let quota = Quota::per_minute(100);
//! let decision = store.check(Ask::new("tenant:1", &quota)).await?;
//! assert_eq!(decision.fallback, None); // the store answered
//! // This one request fails closed instead if the store is away:
//! let decision = store.check(Ask::new("tenant:1", &quota).fail(FailMode::Closed)).await?;
//! assert!(decision.allowed);
//! # Ok(()) }
//! ```

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use super::{Ask, MemoryStore, Store, StoreError};
use crate::clock::{Clock, MonotonicClock, Nanos, nanos};
use crate::decision::{Decision, FailMode};
use crate::quota::Quota;

/// Consecutive transient failures that open the breaker, by default.
pub const DEFAULT_FAILURE_THRESHOLD: u32 = 3;

/// How long the breaker stays open before a probe, by default.
pub const DEFAULT_OPEN_FOR: Duration = Duration::from_millis(200);

/// A [`Store`] that falls back to a [`FailMode`] when the wrapped store fails transiently, with
/// a circuit breaker. See the [module docs](self).
#[derive(Debug)]
pub struct FallbackStore<S, C: Clock = MonotonicClock> {
    /// The shared store being protected.
    inner: S,
    /// Mode for the plain [`Store`] methods.
    default_mode: FailMode,
    /// Service instances sharing the store: the local limiter's quota is divided by it.
    instances: u64,
    /// This instance's own limits, used while the store is away in [`FailMode::Local`].
    local: MemoryStore<C>,
    /// Reads time for the breaker.
    clock: C,
    breaker: Breaker,
    counters: Counters,
}

/// Builds a [`FallbackStore`].
#[derive(Debug)]
pub struct FallbackStoreBuilder<S, C = MonotonicClock> {
    inner: S,
    clock: C,
    default_mode: FailMode,
    instances: u64,
    failure_threshold: u32,
    open_for: Duration,
}

impl<S: Store> FallbackStore<S> {
    /// A builder wrapping `inner`: [`FailMode::default()`] (open), one instance, a breaker
    /// opening after [`DEFAULT_FAILURE_THRESHOLD`] failures for [`DEFAULT_OPEN_FOR`].
    pub fn builder(inner: S) -> FallbackStoreBuilder<S> {
        FallbackStoreBuilder {
            inner,
            clock: MonotonicClock::new(),
            default_mode: FailMode::default(),
            instances: 1,
            failure_threshold: DEFAULT_FAILURE_THRESHOLD,
            open_for: DEFAULT_OPEN_FOR,
        }
    }
}

impl<S: Store> FallbackStoreBuilder<S> {
    /// Reads time from `clock` (the breaker's and the local limiter's).
    pub fn clock<C: Clock + Clone>(self, clock: C) -> FallbackStoreBuilder<S, C> {
        FallbackStoreBuilder {
            inner: self.inner,
            clock,
            default_mode: self.default_mode,
            instances: self.instances,
            failure_threshold: self.failure_threshold,
            open_for: self.open_for,
        }
    }
}

impl<S: Store, C: Clock + Clone> FallbackStoreBuilder<S, C> {
    /// The mode of requests that name none ([`Ask::fail`] is `None`; default
    /// [`FailMode::Open`]).
    pub fn fail(mut self, mode: FailMode) -> Self {
        self.default_mode = mode;
        self
    }

    /// How many service instances share the store (default 1): [`FailMode::Local`] grants each
    /// instance `1 / instances` of every quota.
    pub fn instances(mut self, instances: u64) -> Self {
        self.instances = instances.max(1);
        self
    }

    /// Consecutive transient failures that open the breaker (default 3; at least 1).
    pub fn failure_threshold(mut self, failures: u32) -> Self {
        self.failure_threshold = failures.max(1);
        self
    }

    /// How long the breaker stays open before letting a probe through (default 200 ms).
    pub fn open_for(mut self, open_for: Duration) -> Self {
        self.open_for = open_for;
        self
    }

    /// Builds the store.
    pub fn build(self) -> FallbackStore<S, C> {
        FallbackStore {
            inner: self.inner,
            default_mode: self.default_mode,
            instances: self.instances,
            local: MemoryStore::builder().clock(self.clock.clone()).build(),
            clock: self.clock,
            breaker: Breaker {
                open_until: AtomicU64::new(0),
                failures: AtomicU32::new(0),
                threshold: self.failure_threshold,
                open_for: nanos(self.open_for).max(1),
            },
            counters: Counters::default(),
        }
    }
}

/// The circuit breaker's whole state is one time stamp: 0 while closed, else the time until
/// which calls do not go to the store. The caller that first finds it passed moves it one
/// `open_for` further and probes; so does the next one if the probe is lost.
#[derive(Debug)]
struct Breaker {
    /// 0 when closed; otherwise no call before this time goes to the store.
    open_until: AtomicU64,
    /// Consecutive transient failures while closed.
    failures: AtomicU32,
    /// Failures that open the breaker.
    threshold: u32,
    /// How long it stays open between probes, in ns.
    open_for: Nanos,
}

impl Breaker {
    /// Whether a call at `now` may go to the store (as a normal call, or as the probe).
    fn admit(&self, now: Nanos) -> bool {
        let until = self.open_until.load(Ordering::Acquire);
        if until == 0 {
            return true;
        }
        until <= now
            && self
                .open_until
                .compare_exchange(
                    until,
                    now + self.open_for,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
    }

    /// Records a success; returns whether it closed the breaker (true for one caller only).
    fn success(&self) -> bool {
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
        self.open_until.load(Ordering::Relaxed) != 0
            && self.open_until.swap(0, Ordering::AcqRel) != 0
    }

    /// Records a transient failure; returns whether it opened the breaker.
    fn failure(&self, now: Nanos) -> bool {
        let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if failures < self.threshold {
            return false;
        }
        // Closed → open; when already open (a failed probe) `admit` has moved the time on.
        self.open_until
            .compare_exchange(0, now + self.open_for, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    fn is_open(&self) -> bool {
        self.open_until.load(Ordering::Relaxed) != 0
    }
}

#[derive(Debug, Default)]
struct Counters {
    open: AtomicU64,
    closed: AtomicU64,
    local: AtomicU64,
    store_errors: AtomicU64,
    short_circuited: AtomicU64,
    breaker_opened: AtomicU64,
    /// When the breaker last opened (for the log line when it closes).
    opened_at: AtomicU64,
}

/// Counts since the store was built, for metrics (e.g.
/// `flowgate_fallback_decisions_total{mode="open"}`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FallbackStats {
    /// Requests allowed by [`FailMode::Open`].
    pub open: u64,
    /// Requests denied by [`FailMode::Closed`].
    pub closed: u64,
    /// Requests decided by the local limiter ([`FailMode::Local`]).
    pub local: u64,
    /// Calls to the store that failed transiently.
    pub store_errors: u64,
    /// Requests that fell back without trying the store because the breaker was open.
    pub short_circuited: u64,
    /// Times the breaker opened.
    pub breaker_opened: u64,
    /// Whether the breaker is open now.
    pub breaker_open: bool,
}

impl<S: Store, C: Clock + Clone> FallbackStore<S, C> {
    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// The mode used when a request names none (see [`FallbackStoreBuilder::fail`]).
    pub fn fail_mode(&self) -> FailMode {
        self.default_mode
    }

    /// Counts of fallback decisions and breaker events so far.
    pub fn stats(&self) -> FallbackStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        FallbackStats {
            open: get(&c.open),
            closed: get(&c.closed),
            local: get(&c.local),
            store_errors: get(&c.store_errors),
            short_circuited: get(&c.short_circuited),
            breaker_opened: get(&c.breaker_opened),
            breaker_open: self.breaker.is_open(),
        }
    }

    /// The mode `ask` falls back to.
    #[inline]
    fn mode(&self, ask: &Ask<'_>) -> FailMode {
        ask.fail.unwrap_or(self.default_mode)
    }

    /// The decision for one answer of the inner store: as it is, or — for a transient error —
    /// the fallback's.
    fn settle(
        &self,
        ask: &Ask<'_>,
        result: Result<Decision, StoreError>,
    ) -> Result<Decision, StoreError> {
        match result {
            Err(e) if e.is_transient() => {
                self.counters.store_errors.fetch_add(1, Ordering::Relaxed);
                self.fall_back(ask)
            }
            other => other,
        }
    }

    /// Whether the store may be asked now; if not, the breaker is open and `asks` are counted
    /// as short-circuited.
    fn admit(&self, asks: usize) -> bool {
        if self.breaker.admit(self.clock.now()) {
            return true;
        }
        self.counters
            .short_circuited
            .fetch_add(asks as u64, Ordering::Relaxed);
        false
    }

    /// Feeds the breaker one answer of the store: `failure` is its transient error, if any.
    fn record(&self, failure: Option<&StoreError>) {
        match failure {
            None => {
                if self.breaker.success() {
                    self.closed();
                }
            }
            Some(error) => {
                let now = self.clock.now();
                if self.breaker.failure(now) {
                    self.counters.breaker_opened.fetch_add(1, Ordering::Relaxed);
                    self.counters.opened_at.store(now, Ordering::Relaxed);
                    self.opened(error);
                }
            }
        }
    }

    /// Says that the breaker opened because of `error`.
    #[cfg_attr(not(feature = "tracing"), allow(unused_variables))]
    fn opened(&self, error: &StoreError) {
        #[cfg(feature = "tracing")]
        tracing::warn!(
            failures = self.breaker.threshold,
            %error,
            probe_every = ?Duration::from_nanos(self.breaker.open_for),
            "shared store failing: circuit breaker open; requests are decided by their fail mode until a probe succeeds"
        );
    }

    /// Says that the breaker closed.
    fn closed(&self) {
        #[cfg(feature = "tracing")]
        {
            let opened_at = self.counters.opened_at.load(Ordering::Relaxed);
            let open = Duration::from_nanos(self.clock.now().saturating_sub(opened_at));
            tracing::info!(
                open_for = ?open,
                "shared store answering again: circuit breaker closed"
            );
        }
    }

    /// Decides `ask` by its mode, without the store.
    fn fall_back(&self, ask: &Ask<'_>) -> Result<Decision, StoreError> {
        let quota = ask.quota;
        ask.check_cost()?;
        let mode = self.mode(ask);
        let decision = match mode {
            FailMode::Open => {
                self.counters.open.fetch_add(1, Ordering::Relaxed);
                Decision::allow(quota, quota.burst().saturating_sub(ask.cost), 0)
            }
            // A charge is usage that happened: never denied, here recorded nowhere.
            FailMode::Closed if ask.charge => {
                self.counters.closed.fetch_add(1, Ordering::Relaxed);
                Decision::allow(quota, quota.burst().saturating_sub(ask.cost), 0)
            }
            FailMode::Closed => {
                self.counters.closed.fetch_add(1, Ordering::Relaxed);
                Decision::deny(quota, 0, 0, self.breaker.open_for)
            }
            FailMode::Local => {
                self.counters.local.fetch_add(1, Ordering::Relaxed);
                let share = local_share(quota, self.instances);
                if !ask.charge && ask.cost > share.burst() {
                    // More than this instance's share can ever grant: wait for the store.
                    Decision::deny(&share, share.burst(), 0, self.breaker.open_for)
                } else {
                    self.local.answer(Ask {
                        quota: &share,
                        ..*ask
                    })?
                }
            }
        };
        Ok(decision.with_fallback(mode))
    }
}

/// `quota` divided among `instances`: limit and burst divided (at least 1), same period (or
/// calendar) and algorithm. A quota that cannot be divided (it would break a validation rule) is kept whole.
pub fn local_share(quota: &Quota, instances: u64) -> Quota {
    if instances <= 1 {
        return *quota;
    }
    let limit = (quota.limit() / instances).max(1);
    let burst = (quota.burst() / instances).max(1);
    quota.with_limit(limit, burst).unwrap_or(*quota)
}

impl<S: Store, C: Clock + Clone> Store for FallbackStore<S, C> {
    async fn check(&self, ask: Ask<'_>) -> Result<Decision, StoreError> {
        if !self.admit(1) {
            return self.fall_back(&ask);
        }
        let result = self.inner.check(ask).await;
        self.record(result.as_ref().err().filter(|e| e.is_transient()));
        self.settle(&ask, result)
    }

    /// The inner store's answer at once, if it gives one (a memory store's), with the same
    /// fallback; `None` otherwise (a remote store: ask [`check`](Store::check)).
    fn check_now(&self, ask: Ask<'_>) -> Option<Result<Decision, StoreError>> {
        let result = self.inner.check_now(ask)?;
        if let Err(e) = &result
            && e.is_transient()
        {
            self.record(Some(e));
        }
        Some(self.settle(&ask, result))
    }

    async fn check_many(&self, asks: &[Ask<'_>]) -> Vec<Result<Decision, StoreError>> {
        if !self.admit(asks.len()) {
            return asks.iter().map(|ask| self.fall_back(ask)).collect();
        }
        let results = self.inner.check_many(asks).await;
        self.record(
            results
                .iter()
                .find_map(|r| r.as_ref().err().filter(|e| e.is_transient())),
        );
        results
            .into_iter()
            .zip(asks)
            .map(|(result, ask)| self.settle(ask, result))
            .collect()
    }

    /// Refunds in the store; while the breaker is open, reports the store unavailable.
    async fn refund(&self, ask: Ask<'_>) -> Result<(), StoreError> {
        if self.breaker.is_open() {
            return Err(StoreError::Unavailable("circuit breaker open".into()));
        }
        self.inner.refund(ask).await
    }

    /// The inner store's refund at once, if it gives one.
    fn refund_now(&self, ask: Ask<'_>) -> Option<Result<(), StoreError>> {
        self.inner.refund_now(ask)
    }

    /// Resets the key in the store and in the local limiter.
    async fn reset(&self, ask: Ask<'_>) -> Result<(), StoreError> {
        let share = local_share(ask.quota, self.instances);
        self.local.forget(Ask {
            quota: &share,
            ..ask
        });
        self.inner.reset(ask).await
    }

    /// Every ask's fail mode is applied here.
    fn applies_fail_modes(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use std::sync::atomic::AtomicBool;

    /// A store that fails (transiently) while told to, and counts its calls.
    #[derive(Default)]
    struct Flaky {
        down: AtomicBool,
        calls: AtomicU64,
        memory: MemoryStore,
    }

    impl Store for Flaky {
        async fn check(&self, ask: Ask<'_>) -> Result<Decision, StoreError> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            if self.down.load(Ordering::Relaxed) {
                return Err(StoreError::Unavailable("down".into()));
            }
            self.memory.answer(ask)
        }
        fn check_now(&self, ask: Ask<'_>) -> Option<Result<Decision, StoreError>> {
            if self.down.load(Ordering::Relaxed) {
                return Some(Err(StoreError::Unavailable("down".into())));
            }
            Some(self.memory.answer(ask))
        }
        async fn refund(&self, _: Ask<'_>) -> Result<(), StoreError> {
            Ok(())
        }
        async fn reset(&self, _: Ask<'_>) -> Result<(), StoreError> {
            Ok(())
        }
    }

    /// While the store is away a charge is never denied: open and closed take it nowhere
    /// (marked), local charges this instance's share into debt.
    #[tokio::test]
    async fn charges_fall_back_without_being_denied() {
        let clock = ManualClock::new(1 << 40);
        let store = FallbackStore::builder(Flaky::default())
            .clock(clock.clone())
            .build();
        store.inner().down.store(true, Ordering::Relaxed);
        let q = Quota::per_second(10);
        for mode in [FailMode::Open, FailMode::Closed, FailMode::Local] {
            let key = format!("{mode:?}");
            let charge = Ask::new(&key, &q).cost(50).charge(true).fail(mode);
            let d = store.check(charge).await.unwrap();
            assert_eq!((d.allowed, d.fallback), (true, Some(mode)), "{mode:?}");
            assert_eq!(d.remaining, 0, "{mode:?}");
        }
        let local = store
            .check(Ask::new("Local", &q).fail(FailMode::Local))
            .await
            .unwrap();
        assert!(!local.allowed, "the local share is in debt: {local:?}");
    }

    #[tokio::test]
    async fn breaker_opens_after_threshold_probes_and_closes() {
        let clock = ManualClock::new(1 << 40);
        let store = FallbackStore::builder(Flaky::default())
            .clock(clock.clone())
            .failure_threshold(3)
            .open_for(Duration::from_millis(100))
            .fail(FailMode::Closed)
            .build();
        let q = Quota::per_second(10);
        assert_eq!(store.check(Ask::new("k", &q)).await.unwrap().fallback, None);
        store.inner().down.store(true, Ordering::Relaxed);
        for _ in 0..3 {
            let d = store.check(Ask::new("k", &q)).await.unwrap();
            assert_eq!((d.allowed, d.fallback), (false, Some(FailMode::Closed)));
            assert_eq!(d.retry_after, Duration::from_millis(100));
        }
        assert!(store.stats().breaker_open);
        assert_eq!(store.inner().calls.load(Ordering::Relaxed), 4);
        // Open: no calls reach the store.
        for _ in 0..10 {
            assert!(!store.check(Ask::new("k", &q)).await.unwrap().allowed);
        }
        assert_eq!(store.inner().calls.load(Ordering::Relaxed), 4);
        // After open_for, one probe; it fails: open again for another period.
        clock.advance(Duration::from_millis(100));
        let _ = store.check(Ask::new("k", &q)).await.unwrap();
        let _ = store.check(Ask::new("k", &q)).await.unwrap();
        assert_eq!(store.inner().calls.load(Ordering::Relaxed), 5);
        // The store comes back; the next probe closes the breaker.
        store.inner().down.store(false, Ordering::Relaxed);
        clock.advance(Duration::from_millis(100));
        assert_eq!(store.check(Ask::new("k", &q)).await.unwrap().fallback, None);
        assert!(!store.stats().breaker_open);
        assert_eq!(store.check(Ask::new("k", &q)).await.unwrap().fallback, None);
        let stats = store.stats();
        assert_eq!(
            (
                stats.closed,
                stats.store_errors,
                stats.short_circuited,
                stats.breaker_opened
            ),
            (15, 4, 11, 1)
        );
    }

    /// Log lines written while `run` runs on this thread.
    #[cfg(feature = "tracing")]
    async fn logged<F: std::future::Future<Output = ()>>(run: F) -> String {
        use std::sync::{Arc, Mutex};
        #[derive(Clone, Default)]
        struct Lines(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Lines {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::DEBUG)
            .finish();
        let guard = tracing::subscriber::set_default(subscriber);
        run.await;
        drop(guard);
        let bytes = lines.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    #[cfg(feature = "tracing")]
    #[tokio::test]
    async fn the_breaker_logs_once_when_it_opens_and_once_when_it_closes() {
        let clock = ManualClock::new(1 << 40);
        let store = FallbackStore::builder(Flaky::default())
            .clock(clock.clone())
            .failure_threshold(2)
            .open_for(Duration::from_millis(100))
            .build();
        let q = Quota::per_second(10);
        let log = logged(async {
            let _ = store.check(Ask::new("k", &q)).await.unwrap();
            store.inner().down.store(true, Ordering::Relaxed);
            // Two failures open it; the calls while open and a failed probe say nothing more.
            for _ in 0..5 {
                let _ = store.check(Ask::new("k", &q)).await.unwrap();
            }
            clock.advance(Duration::from_millis(100));
            let _ = store.check(Ask::new("k", &q)).await.unwrap();
            store.inner().down.store(false, Ordering::Relaxed);
            clock.advance(Duration::from_millis(150));
            // The probe succeeds and closes it; later successes say nothing.
            for _ in 0..3 {
                let _ = store.check(Ask::new("k", &q)).await.unwrap();
            }
        })
        .await;
        let lines: Vec<&str> = log.lines().collect();
        assert_eq!(lines.len(), 2, "{log}");
        assert!(lines[0].contains("WARN"), "{log}");
        assert!(lines[0].contains("circuit breaker open"), "{log}");
        assert!(lines[0].contains("the store is unavailable: down"), "{log}");
        assert!(lines[0].contains("failures=2"), "{log}");
        assert!(lines[1].contains("INFO"), "{log}");
        assert!(lines[1].contains("circuit breaker closed"), "{log}");
        assert!(lines[1].contains("open_for=250ms"), "{log}");
        assert_eq!(store.stats().breaker_opened, 1);
    }

    #[tokio::test]
    async fn modes_decide_per_request_and_local_holds_this_instances_share() {
        let clock = ManualClock::new(1 << 40);
        let store = FallbackStore::builder(Flaky::default())
            .clock(clock.clone())
            .instances(4)
            .build();
        store.inner().down.store(true, Ordering::Relaxed);
        let q = Quota::per_minute(40);
        let asks = [
            Ask::new("a", &q).fail(FailMode::Open),
            Ask::new("b", &q).fail(FailMode::Closed),
            Ask::new("c", &q).fail(FailMode::Local),
        ];
        let r = store.check_many(&asks).await;
        let d: Vec<_> = r.into_iter().map(Result::unwrap).collect();
        assert!(d[0].allowed && d[0].fallback == Some(FailMode::Open));
        assert!(!d[1].allowed && d[1].fallback == Some(FailMode::Closed));
        assert!(d[2].allowed && d[2].fallback == Some(FailMode::Local));
        // The local share is 40 / 4 = 10 per minute: 9 more, then denied.
        let local = Ask::new("c", &q).fail(FailMode::Local);
        for _ in 0..9 {
            assert!(store.check(local).await.unwrap().allowed);
        }
        assert!(!store.check(local).await.unwrap().allowed);
        // Asking at once (the inner store could answer so) falls back the same way.
        assert!(!store.check_now(local).unwrap().unwrap().allowed);
        // A request that names no mode gets the store's default: open.
        let d = store.check(Ask::new("d", &q)).await.unwrap();
        assert_eq!(d.fallback, Some(FailMode::Open));
        // A cost that can never fit is an error whatever the mode.
        assert!(matches!(
            store
                .check(Ask::new("c", &q).cost(41).fail(FailMode::Open))
                .await,
            Err(StoreError::Capacity(_))
        ));
        let s = store.stats();
        assert_eq!((s.open, s.closed, s.local), (2, 1, 12));
    }

    #[test]
    fn local_share_divides_limit_and_burst() {
        let q = Quota::per_second(10).with_burst(30).unwrap();
        let s = local_share(&q, 3);
        assert_eq!((s.limit(), s.burst(), s.period()), (3, 10, q.period()));
        let tiny = local_share(&Quota::per_second(2), 5);
        assert_eq!((tiny.limit(), tiny.burst()), (1, 1));
    }
}
