//! Where limits are kept when several tasks, processes or machines must share them.
//!
//! [`Store`] is the one trait every backend implements: [`MemoryStore`] (embedded, the
//! default) and, behind features, Redis. A store is handed the quota on every call, so the same
//! store serves any number of limits, and every store takes the same decisions for the same
//! trace of calls — `tests/conformance.rs` runs one table of traces against each of them.

pub mod fallback;
pub mod hybrid;
pub mod key;
pub mod list;
mod memory;
mod names;
#[cfg(feature = "redis")]
pub mod redis;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

pub use fallback::{FallbackStats, FallbackStore, FallbackStoreBuilder, local_share};
pub use hybrid::{HybridStore, HybridStoreBuilder};
pub use memory::{MemoryStore, MemoryStoreBuilder};
#[cfg(feature = "redis")]
pub use redis::{RedisStore, RedisStoreBuilder};

use crate::decision::{Decision, FailMode};
use crate::quota::{InsufficientCapacity, Quota};

/// Why a store could not decide.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The cost exceeds the quota's burst: it can never be granted. Not transient.
    #[error(transparent)]
    Capacity(#[from] InsufficientCapacity),
    /// The store did not answer in time. Transient.
    #[error("the store did not answer within {0:?}")]
    Timeout(std::time::Duration),
    /// The store cannot be reached (connection refused or lost, circuit breaker open).
    /// Transient.
    #[error("the store is unavailable: {0}")]
    Unavailable(String),
    /// The store answered with an error that retrying will not fix (a script error, a key of
    /// the wrong type). Not transient.
    #[error("the store failed: {0}")]
    Backend(String),
}

impl StoreError {
    /// Whether trying again later may succeed: timeouts and unreachable stores. Fail-open,
    /// fail-closed and local fallback apply to transient errors only.
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Timeout(_) | StoreError::Unavailable(_))
    }
}

/// One limit as one request meets it: `cost` units of the counter `key` under `quota`, whether
/// a denial of it denies the request, and what to do if the store cannot answer.
///
/// Every [`Store`] verb takes one (`peek` and `reset` ignore the cost, `refund` gives `cost`
/// back), and [`decide`](crate::pipeline::decide) takes a request's asks together.
///
/// A *charge* ([`Ask::charge`]) records usage that already happened (the tokens an LLM
/// response used, reported when it ends): [`Store::check`] then always takes the units, may run
/// the key past its limit into debt, never answers [`StoreError::Capacity`], and returns the
/// state after it (see [`State::charge`](crate::algorithm::State::charge)).
///
/// ```
/// use flowgate::{store::Ask, FailMode, Quota};
/// let quota = Quota::per_minute(100);
/// let ask = Ask::new("tenant:42", &quota).cost(5).fail(FailMode::Closed);
/// assert_eq!((ask.cost, ask.fail, ask.shadow), (5, Some(FailMode::Closed), false));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Ask<'a> {
    /// The counter's key.
    pub key: &'a str,
    /// The quota to enforce on it.
    pub quota: &'a Quota,
    /// Units asked for (default 1; 0 peeks).
    pub cost: u64,
    /// What to decide if the store cannot be reached; `None` leaves it to the store's default.
    /// Applied by stores whose [`Store::applies_fail_modes`] is true (a
    /// [`FallbackStore`]; the memory store, which is never away); the front ends refuse a
    /// limit that sets one over a store that would ignore it.
    pub fail: Option<FailMode>,
    /// Counted but never denies the request (a limit tried out on live traffic). Stores ignore
    /// it; [`decide`](crate::pipeline::decide) does not let it deny.
    pub shadow: bool,
    /// A charge: usage that already happened. Always taken (into debt past the limit if need
    /// be), never [`StoreError::Capacity`], never refunded by
    /// [`decide`](crate::pipeline::decide).
    pub charge: bool,
    /// One of the request's quota-mode limits: [`decide`](crate::pipeline::decide) denies the
    /// request for them only when every quota-mode ask is denied (a shadow one never is).
    /// Stores ignore it.
    pub quota_mode: bool,
    /// With `quota_mode`: another limit of the same quota-mode descriptor as the ask before it
    /// (a rule with several limits), so the two deny together — the descriptor denies when
    /// any of its limits does, and counts once among the quota-mode limits. Stores ignore it.
    pub joins_previous: bool,
}

impl<'a> Ask<'a> {
    /// One unit of `key` under `quota`, enforced, the store's default fail mode.
    #[inline]
    pub fn new(key: &'a str, quota: &'a Quota) -> Self {
        Ask {
            key,
            quota,
            cost: 1,
            fail: None,
            shadow: false,
            charge: false,
            quota_mode: false,
            joins_previous: false,
        }
    }

    /// The same, for `cost` units.
    #[inline]
    pub fn cost(mut self, cost: u64) -> Self {
        self.cost = cost;
        self
    }

    /// The same, with this [`FailMode`] (`None`: the store's default).
    #[inline]
    pub fn fail(mut self, mode: impl Into<Option<FailMode>>) -> Self {
        self.fail = mode.into();
        self
    }

    /// The same, in shadow mode (`true`: counted, never denies) or enforced.
    #[inline]
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.shadow = shadow;
        self
    }

    /// The same as a charge (`true`: usage that already happened, always taken, may run the
    /// key into debt) or as a request that may be denied.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use flowgate::{clock::ManualClock, store::{Ask, MemoryStore, Store}, Quota};
    /// let store = MemoryStore::builder().clock(ManualClock::new(1 << 40)).build();
    /// let quota = Quota::per_minute(1000);
    /// // 5000 tokens used: five minutes' worth, charged although the burst is 1000.
    /// let charged = store.check(Ask::new("tenant:42", &quota).cost(5000).charge(true)).await?;
    /// assert!(charged.allowed);
    /// assert_eq!(charged.remaining, 0);
    /// // Refused until the debt of 4000 units (and one more) is repaid: 4001 × 60 ms.
    /// let next = store.check(Ask::new("tenant:42", &quota)).await?;
    /// assert!(!next.allowed);
    /// assert_eq!(next.retry_after, std::time::Duration::from_millis(4001 * 60));
    /// # Ok(()) }
    /// ```
    #[inline]
    pub fn charge(mut self, charge: bool) -> Self {
        self.charge = charge;
        self
    }

    /// Whether the store can ever grant this ask: a charge always; otherwise `cost ≤ burst`.
    #[inline]
    pub(crate) fn check_cost(&self) -> Result<(), InsufficientCapacity> {
        if self.charge {
            Ok(())
        } else {
            self.quota.check_cost(self.cost)
        }
    }

    /// This ask's transition on `state` at `now`: a check or a charge.
    #[cfg(feature = "redis")]
    #[inline]
    pub(crate) fn apply<S: crate::algorithm::State>(
        &self,
        state: &mut S,
        now: crate::clock::Nanos,
    ) -> Decision {
        if self.charge {
            state.charge(self.quota, self.cost, now)
        } else {
            state.check(self.quota, self.cost, now)
        }
    }

    /// The same, in quota mode (`true`: denies only with every other quota-mode ask).
    #[inline]
    pub fn quota_mode(mut self, quota_mode: bool) -> Self {
        self.quota_mode = quota_mode;
        self
    }

    /// The same, joining the quota-mode limit of the ask before it
    /// ([`joins_previous`](Self::joins_previous)).
    #[inline]
    pub fn joins_previous(mut self, joins_previous: bool) -> Self {
        self.joins_previous = joins_previous;
        self
    }
}

/// A place to keep limits' state: the embedded [`MemoryStore`], Redis, or your own.
///
/// Every verb takes an [`Ask`], whose quota travels with it, so one store serves any number of
/// limits; a key must always be used with the same algorithm (the front ends build keys that
/// guarantee it, see [`key`]). The verbs are those of the in-process limiters: `check` asks for
/// units and takes them if granted, `peek` takes nothing, `refund` gives units back, `reset`
/// forgets a key.
///
/// A store that decides in this process answers at once as well (`check_now`, `refund_now`):
/// either for every ask or for none, so that [`decide_now`](crate::pipeline::decide_now)
/// can decide a whole request without waiting.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use flowgate::{clock::ManualClock, store::{Ask, MemoryStore, Store}, Quota};
/// let store = MemoryStore::builder().clock(ManualClock::new(0)).build();
/// let quota = Quota::per_minute(100);
/// let decision = store.check(Ask::new("tenant:42", &quota)).await?;
/// assert!(decision.allowed);
/// assert_eq!(decision.remaining, 99);
/// store.refund(Ask::new("tenant:42", &quota)).await?;
/// assert_eq!(store.peek(Ask::new("tenant:42", &quota)).await?.remaining, 100);
/// # Ok(()) }
/// ```
pub trait Store: Send + Sync {
    /// Asks for `ask.cost` units of `ask.key`. A denial is `Ok` with `allowed == false`;
    /// `cost > burst` is [`StoreError::Capacity`]. A [charge](Ask::charge) is always taken.
    ///
    /// (Every method takes one lifetime for the store and its arguments, so stores may return
    /// boxed futures; callers' shorter-lived keys are fine.)
    fn check<'a>(
        &'a self,
        ask: Ask<'a>,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send + 'a;

    /// The answer to [`check`](Self::check) without waiting, from a store that decides in
    /// memory; `None` (the default) when the store has to be asked asynchronously. When it
    /// answers, it has taken the units exactly as `check` would have. A store answers every
    /// ask at once or none.
    ///
    /// ```
    /// use flowgate::{store::{Ask, MemoryStore, Store}, Quota};
    /// let store = MemoryStore::new();
    /// let quota = Quota::per_minute(100);
    /// let decision = store.check_now(Ask::new("tenant:42", &quota)).expect("in memory")?;
    /// assert_eq!(decision.remaining, 99);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn check_now(&self, ask: Ask<'_>) -> Option<Result<Decision, StoreError>> {
        let _ = ask;
        None
    }

    /// Asks for several counters at once, each decided on its own (not all-or-nothing: see
    /// [`pipeline::decide`](crate::pipeline::decide) for that). Stores that talk to a server
    /// send them together; the default asks one after another. Asks for the same key within
    /// one call may be decided in either order, as concurrent calls would be.
    fn check_many<'a>(
        &'a self,
        asks: &'a [Ask<'a>],
    ) -> impl Future<Output = Vec<Result<Decision, StoreError>>> + Send + 'a {
        async move {
            let mut decisions = Vec::with_capacity(asks.len());
            for ask in asks {
                decisions.push(self.check(*ask).await);
            }
            decisions
        }
    }

    /// What a request would be told now, taking nothing (`ask.cost` is ignored).
    fn peek<'a>(
        &'a self,
        ask: Ask<'a>,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send + 'a {
        self.check(ask.cost(0))
    }

    /// Gives back `ask.cost` units taken earlier (a request another limit denied, cancelled
    /// work).
    fn refund<'a>(
        &'a self,
        ask: Ask<'a>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a;

    /// [`refund`](Self::refund) without waiting, from a store whose
    /// [`check_now`](Self::check_now) answers; `None` (the default) otherwise.
    fn refund_now(&self, ask: Ask<'_>) -> Option<Result<(), StoreError>> {
        let _ = ask;
        None
    }

    /// Forgets `ask.key`: its next request sees the full quota (`ask.cost` is ignored).
    fn reset<'a>(
        &'a self,
        ask: Ask<'a>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a;

    /// Whether the store applies each ask's [`fail`](Ask::fail) mode: true for a
    /// [`FallbackStore`], and for stores that are never away (the memory store); false (the
    /// default) for a store that reports its outages as errors (Redis on its own). The front
    /// ends refuse limits that name a fail mode over a store that would ignore it.
    fn applies_fail_modes(&self) -> bool {
        false
    }
}

/// A boxed future, for [`DynStore`].
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// [`Store`] in a form that can be a trait object (`Arc<dyn DynStore>`), for choosing the
/// backend at run time. Every `Store` is a `DynStore`, and `dyn DynStore` (so also
/// `Arc<dyn DynStore>`) is a `Store`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use flowgate::{store::{Ask, DynStore, MemoryStore, Store}, Quota};
/// let store: Arc<dyn DynStore> = Arc::new(MemoryStore::new());
/// let quota = Quota::per_second(5);
/// assert!(store.check(Ask::new("k", &quota)).await?.allowed);
/// assert_eq!(store.peek(Ask::new("k", &quota)).await?.remaining, 4);
/// # Ok(()) }
/// ```
pub trait DynStore: Send + Sync {
    /// See [`Store::check`].
    fn check_boxed<'a>(&'a self, ask: Ask<'a>) -> BoxFuture<'a, Result<Decision, StoreError>>;
    /// See [`Store::check_now`].
    fn check_now_dyn(&self, ask: Ask<'_>) -> Option<Result<Decision, StoreError>>;
    /// See [`Store::check_many`].
    fn check_many_boxed<'a>(
        &'a self,
        asks: &'a [Ask<'a>],
    ) -> BoxFuture<'a, Vec<Result<Decision, StoreError>>>;
    /// See [`Store::peek`].
    fn peek_boxed<'a>(&'a self, ask: Ask<'a>) -> BoxFuture<'a, Result<Decision, StoreError>>;
    /// See [`Store::refund`].
    fn refund_boxed<'a>(&'a self, ask: Ask<'a>) -> BoxFuture<'a, Result<(), StoreError>>;
    /// See [`Store::refund_now`].
    fn refund_now_dyn(&self, ask: Ask<'_>) -> Option<Result<(), StoreError>>;
    /// See [`Store::reset`].
    fn reset_boxed<'a>(&'a self, ask: Ask<'a>) -> BoxFuture<'a, Result<(), StoreError>>;
    /// See [`Store::applies_fail_modes`].
    fn applies_fail_modes_dyn(&self) -> bool;
}

impl<S: Store> DynStore for S {
    fn check_boxed<'a>(&'a self, ask: Ask<'a>) -> BoxFuture<'a, Result<Decision, StoreError>> {
        Box::pin(self.check(ask))
    }
    fn check_now_dyn(&self, ask: Ask<'_>) -> Option<Result<Decision, StoreError>> {
        self.check_now(ask)
    }
    fn check_many_boxed<'a>(
        &'a self,
        asks: &'a [Ask<'a>],
    ) -> BoxFuture<'a, Vec<Result<Decision, StoreError>>> {
        Box::pin(self.check_many(asks))
    }
    fn peek_boxed<'a>(&'a self, ask: Ask<'a>) -> BoxFuture<'a, Result<Decision, StoreError>> {
        Box::pin(self.peek(ask))
    }
    fn refund_boxed<'a>(&'a self, ask: Ask<'a>) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.refund(ask))
    }
    fn refund_now_dyn(&self, ask: Ask<'_>) -> Option<Result<(), StoreError>> {
        self.refund_now(ask)
    }
    fn reset_boxed<'a>(&'a self, ask: Ask<'a>) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.reset(ask))
    }
    fn applies_fail_modes_dyn(&self) -> bool {
        self.applies_fail_modes()
    }
}

// The futures are the boxed ones, named types, so callers can prove them `Send` (an `async fn`
// here would hide that behind an opaque type). For every object lifetime, so that async code
// generic over a store can be proven `Send` for `&dyn DynStore` too.
impl Store for dyn DynStore + '_ {
    fn check<'a>(
        &'a self,
        ask: Ask<'a>,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send + 'a {
        self.check_boxed(ask)
    }
    fn check_now(&self, ask: Ask<'_>) -> Option<Result<Decision, StoreError>> {
        self.check_now_dyn(ask)
    }
    fn check_many<'a>(
        &'a self,
        asks: &'a [Ask<'a>],
    ) -> impl Future<Output = Vec<Result<Decision, StoreError>>> + Send + 'a {
        self.check_many_boxed(asks)
    }
    fn peek<'a>(
        &'a self,
        ask: Ask<'a>,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send + 'a {
        self.peek_boxed(ask)
    }
    fn refund<'a>(
        &'a self,
        ask: Ask<'a>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a {
        self.refund_boxed(ask)
    }
    fn refund_now(&self, ask: Ask<'_>) -> Option<Result<(), StoreError>> {
        self.refund_now_dyn(ask)
    }
    fn reset<'a>(
        &'a self,
        ask: Ask<'a>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a {
        self.reset_boxed(ask)
    }
    fn applies_fail_modes(&self) -> bool {
        self.applies_fail_modes_dyn()
    }
}

/// A shared store is a store: `Arc<MemoryStore>`, `Arc<RedisStore>`, `Arc<dyn DynStore>`.
impl<S: Store + ?Sized> Store for Arc<S> {
    #[inline]
    fn check<'a>(
        &'a self,
        ask: Ask<'a>,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send + 'a {
        (**self).check(ask)
    }
    #[inline]
    fn check_now(&self, ask: Ask<'_>) -> Option<Result<Decision, StoreError>> {
        (**self).check_now(ask)
    }
    fn check_many<'a>(
        &'a self,
        asks: &'a [Ask<'a>],
    ) -> impl Future<Output = Vec<Result<Decision, StoreError>>> + Send + 'a {
        (**self).check_many(asks)
    }
    fn peek<'a>(
        &'a self,
        ask: Ask<'a>,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send + 'a {
        (**self).peek(ask)
    }
    fn refund<'a>(
        &'a self,
        ask: Ask<'a>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a {
        (**self).refund(ask)
    }
    #[inline]
    fn refund_now(&self, ask: Ask<'_>) -> Option<Result<(), StoreError>> {
        (**self).refund_now(ask)
    }
    fn reset<'a>(
        &'a self,
        ask: Ask<'a>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a {
        (**self).reset(ask)
    }
    fn applies_fail_modes(&self) -> bool {
        (**self).applies_fail_modes()
    }
}
