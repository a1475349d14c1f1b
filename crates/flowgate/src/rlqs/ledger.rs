//! Where the members of a rule instance, their demand and each tick's [`Division`] are kept,
//! so that every Flowgate instance serving one fleet hands out shares of **one** division:
//! [`MemoryLedger`] in one process, the Redis ledger
//! ([`RedisStore::quota_ledger`](crate::store::RedisStore::quota_ledger), feature `redis`)
//! across instances. No instance talks to another; exactness comes from the store.
//!
//! **Ticks.** Time (the store's) is cut into ticks of the rule's report interval. The first
//! instance to ask for a rule instance's division in tick `k` ([`tick`]) computes it from the
//! demands then recorded and stores it if none is there yet; every other instance reads that
//! one. So all shares handed out for tick `k` come from one division, whose shares add up to
//! at most the pool.
//!
//! **Applying a division.** An instance assigns each of its members
//! `min(what it last assigned it, its share in division k)` ([`next_share`]): a share that
//! goes down does so at once, one that goes up waits a tick. Instances tick at slightly
//! different moments, but while each is at most one tick behind, every member holds at most
//! its share of the older of two consecutive divisions — so the tokens handed out never exceed
//! one division's pool.
//!
//! **Joining.** A member that reports for the first time ([`join`]) takes its share from
//! the division at once if there was no division the tick before (nobody else holds
//! anything); otherwise it claims a first share (the floor) from the tick's join budget, all
//! or nothing, in the store. A claim counts against the next tick's budget too (the member
//! holds it until its instance ticks again), so the claims held at any moment stay within
//! one budget. Once a division lists the member, it gets its share from there.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::division::{Division, Fairness, Member, Share};
use crate::clock::{Clock, MonotonicClock, Nanos, nanos};
use crate::store::{BoxFuture, StoreError};

/// How long ticks are, and when a silent member stops counting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// The length of a tick (the report interval the server expects).
    pub tick: Duration,
    /// A member whose demand was not refreshed for this long is dropped from divisions.
    pub stale_after: Duration,
}

impl Timing {
    /// The tick containing `now`.
    pub fn tick_of(&self, now: Nanos) -> u64 {
        now / nanos(self.tick).max(1)
    }
}

/// A member's demand as recorded: requests per period, `None` while unknown.
pub type Demand<'a> = (&'a str, Option<u64>);

/// What [`Ledger::sync`] answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Synced {
    /// The store's time.
    pub now: Nanos,
    /// The tick it falls in.
    pub tick: u64,
    /// This tick's division, if one was stored ([`Division::encode`]'s form).
    pub current: Option<String>,
    /// The previous tick's division, if one was stored.
    pub previous: Option<String>,
    /// When `current` is `None`: every live member with its demand, to compute it from.
    pub members: Vec<Member>,
}

/// What a member's claim on the join budget got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claimed {
    /// Granted: the cost was taken from the tick's budget.
    Granted,
    /// The tick's budget cannot cover it.
    Exhausted,
    /// The store's time is in another tick than the claim was for.
    TickPassed,
}

/// The storage a [`tick`] and a [`join`] run on: a few atomic operations per rule instance
/// (named by `rule`, an opaque string). Implemented by [`MemoryLedger`] and the Redis ledger.
pub trait Ledger: Send + Sync {
    /// Records `demands` (refreshing those members), drops members not refreshed for
    /// `timing.stale_after`, and returns the current and previous ticks' divisions — or, when
    /// the current tick has none yet, the live members to compute it from.
    fn sync<'a>(
        &'a self,
        rule: &'a str,
        timing: &'a Timing,
        demands: &'a [Demand<'a>],
    ) -> BoxFuture<'a, Result<Synced, StoreError>>;

    /// Stores `division` for `tick` unless one is stored already; returns the stored one.
    fn publish<'a>(
        &'a self,
        rule: &'a str,
        timing: &'a Timing,
        tick: u64,
        division: &'a str,
    ) -> BoxFuture<'a, Result<String, StoreError>>;

    /// Takes `cost` from `tick`'s join budget of `budget`, all or nothing — if the store's
    /// time is still in `tick` — and from the next tick's too: until its instance ticks, the
    /// member still holds the claimed share in the next tick.
    fn claim<'a>(
        &'a self,
        rule: &'a str,
        timing: &'a Timing,
        tick: u64,
        cost: u64,
        budget: u64,
    ) -> BoxFuture<'a, Result<Claimed, StoreError>>;

    /// Forgets `members` (abandoned, or never to report again).
    fn remove<'a>(
        &'a self,
        rule: &'a str,
        members: &'a [&'a str],
    ) -> BoxFuture<'a, Result<(), StoreError>>;
}

/// One rule instance's divisions as of one tick: what [`tick`] answers.
#[derive(Debug, Clone)]
pub struct Tick {
    /// The store's time.
    pub now: Nanos,
    /// The tick number.
    pub number: u64,
    /// This tick's division.
    pub current: Arc<Division>,
    /// Whether the previous tick had a division (if not, nobody holds a share from it).
    pub had_previous: bool,
}

/// What a rule instance is divided by.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Terms {
    /// The limit per period.
    pub limit: u64,
    /// How it is divided.
    pub fairness: Fairness,
    /// Ticks and staleness.
    pub timing: Timing,
}

fn malformed() -> StoreError {
    StoreError::Backend("the ledger holds a malformed division".into())
}

/// Refreshes `demands` and returns this tick's division of `rule`, computing and storing it
/// if no instance has yet. See the [module docs](self).
pub async fn tick(
    ledger: &(dyn Ledger + '_),
    rule: &str,
    terms: &Terms,
    demands: &[Demand<'_>],
) -> Result<Tick, StoreError> {
    let synced = ledger.sync(rule, &terms.timing, demands).await?;
    let current = match synced.current {
        Some(text) => Division::decode(&text).ok_or_else(malformed)?,
        None => {
            let division = Division::compute(terms.limit, &terms.fairness, synced.members);
            let stored = ledger
                .publish(rule, &terms.timing, synced.tick, &division.encode())
                .await?;
            Division::decode(&stored).ok_or_else(malformed)?
        }
    };
    Ok(Tick {
        now: synced.now,
        number: synced.tick,
        current: Arc::new(current),
        had_previous: synced.previous.is_some(),
    })
}

/// How a member's first report was answered by [`join`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Joined {
    /// Its share in this tick's division: nobody held a share before this tick.
    Divided(Share),
    /// A first share, claimed from the tick's join budget.
    Claimed(Share),
    /// The join budget is spent; it gets its share from a later division.
    Waiting,
}

impl Joined {
    /// The share it may use now, if any.
    pub fn share(&self) -> Option<Share> {
        match *self {
            Joined::Divided(s) | Joined::Claimed(s) => Some(s),
            Joined::Waiting => None,
        }
    }
}

/// A member reporting for the first time: records it (demand unknown) and gets it a first
/// share if it can have one now. See the [module docs](self).
pub async fn join(
    ledger: &(dyn Ledger + '_),
    rule: &str,
    terms: &Terms,
    member: &str,
) -> Result<(Tick, Joined), StoreError> {
    let now = tick(ledger, rule, terms, &[(member, None)]).await?;
    if !now.had_previous
        && let Some(share) = now.current.get(member)
        && share.tokens > 0
    {
        return Ok((now, Joined::Divided(share)));
    }
    let joined = claim_first_share(ledger, rule, terms, &now).await?;
    Ok((now, joined))
}

/// Claims a first share in `now`'s tick: the division's first share, but no more than half
/// the join budget (so that at least two members can join in a tick); else a single token.
/// When nobody holds a share (no division handed any out this tick or the last), the budget
/// is the whole of what a division could hand out.
pub async fn claim_first_share(
    ledger: &(dyn Ledger + '_),
    rule: &str,
    terms: &Terms,
    now: &Tick,
) -> Result<Joined, StoreError> {
    // Nobody holds a share when neither this tick's division nor the last one handed any
    // out: then the claims may take what the division would have.
    let budget = if !now.had_previous && now.current.pool() == 0 {
        let limit = now.current.limit();
        let cap = limit.saturating_add((limit as f64 * terms.fairness.overshoot).floor() as u64);
        cap.saturating_sub(now.current.join_budget())
    } else {
        now.current.join_budget()
    };
    let half = budget / 2;
    // The largest share whose tokens and bucket fit in half the budget.
    let mut most = half.saturating_sub(terms.fairness.bucket(half));
    while most > 1 && most + terms.fairness.bucket(most) > half {
        most -= 1;
    }
    let first = now.current.first_share(&terms.fairness).min(most.max(1));
    for tokens in [first, 1] {
        let share = Share {
            tokens,
            bucket: terms.fairness.bucket(tokens),
        };
        let cost = share.tokens.saturating_add(share.bucket);
        if cost > budget {
            continue;
        }
        match ledger
            .claim(rule, &terms.timing, now.number, cost, budget)
            .await?
        {
            Claimed::Granted => return Ok(Joined::Claimed(share)),
            Claimed::Exhausted => {}
            Claimed::TickPassed => return Ok(Joined::Waiting),
        }
        if tokens == 1 {
            break;
        }
    }
    Ok(Joined::Waiting)
}

/// The share to assign a member now: `min(last assigned, share in this tick's division)`
/// (a decrease at once, an increase one tick later); `None` if it is not in the division.
///
/// ```
/// use flowgate::rlqs::{ledger::next_share, Share};
/// let s = |tokens, bucket| Share { tokens, bucket };
/// assert_eq!(next_share(Some(s(50, 1)), Some(s(80, 2))), Some(s(50, 1)));
/// assert_eq!(next_share(Some(s(50, 1)), Some(s(30, 1))), Some(s(30, 1)));
/// assert_eq!(next_share(None, Some(s(30, 1))), Some(s(0, 0)));
/// assert_eq!(next_share(Some(s(5, 1)), None), None);
/// ```
pub fn next_share(last: Option<Share>, divided: Option<Share>) -> Option<Share> {
    let divided = divided?;
    let last = last.unwrap_or_default();
    Some(if last.tokens <= divided.tokens {
        last
    } else {
        divided
    })
}

/// One rule instance's record in a [`MemoryLedger`].
#[derive(Debug, Default)]
struct Book {
    /// Member → (demand, when it was refreshed).
    members: HashMap<String, (Option<u64>, Nanos)>,
    /// Tick → its division.
    divisions: BTreeMap<u64, String>,
    /// Tick → join budget spent.
    claims: BTreeMap<u64, u64>,
    /// Last time the record was used.
    touched: Nanos,
}

/// A [`Ledger`] in this process's memory, for one instance (or a simulation) on `clock`.
/// Rule instances nobody asked about for a while are forgotten.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), flowgate::store::StoreError> {
/// use std::time::Duration;
/// use flowgate::rlqs::{ledger, Fairness, MemoryLedger};
/// let ledger = MemoryLedger::new();
/// let terms = ledger::Terms {
///     limit: 100,
///     fairness: Fairness::default(),
///     timing: ledger::Timing { tick: Duration::from_secs(1), stale_after: Duration::from_secs(5) },
/// };
/// let (_, first) = ledger::join(&ledger, "rule", &terms, "envoy-1").await?;
/// // Alone: the whole limit.
/// assert_eq!(first.share().unwrap().tokens, 100);
/// # Ok(()) }
/// ```
pub struct MemoryLedger<C: Clock = MonotonicClock> {
    clock: C,
    books: parking_lot::Mutex<HashMap<String, Book>>,
    /// Calls so far, to sweep forgotten rule instances now and then.
    calls: AtomicU64,
}

impl<C: Clock> std::fmt::Debug for MemoryLedger<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryLedger")
            .field("rules", &self.books.lock().len())
            .finish()
    }
}

impl MemoryLedger {
    /// A ledger on the default clock.
    pub fn new() -> Self {
        Self::with_clock(MonotonicClock::default())
    }
}

impl Default for MemoryLedger {
    fn default() -> Self {
        Self::new()
    }
}

/// How many calls pass between sweeps of forgotten rule instances.
const SWEEP_EVERY: u64 = 1024;

impl<C: Clock> MemoryLedger<C> {
    /// A ledger on `clock`.
    pub fn with_clock(clock: C) -> Self {
        MemoryLedger {
            clock,
            books: parking_lot::Mutex::default(),
            calls: AtomicU64::new(0),
        }
    }

    /// Rule instances it holds a record of.
    pub fn rules(&self) -> usize {
        self.books.lock().len()
    }

    fn with_book<T>(
        &self,
        rule: &str,
        timing: &Timing,
        f: impl FnOnce(&mut Book, Nanos) -> T,
    ) -> T {
        let now = self.clock.now();
        let mut books = self.books.lock();
        if self.calls.fetch_add(1, Ordering::Relaxed) % SWEEP_EVERY == SWEEP_EVERY - 1 {
            let forget = nanos(timing.stale_after).saturating_add(nanos(timing.tick) * 2);
            books.retain(|_, book| now.saturating_sub(book.touched) < forget);
        }
        let book = books.entry(rule.to_owned()).or_default();
        book.touched = now;
        f(book, now)
    }
}

impl<C: Clock> Ledger for MemoryLedger<C> {
    fn sync<'a>(
        &'a self,
        rule: &'a str,
        timing: &'a Timing,
        demands: &'a [Demand<'a>],
    ) -> BoxFuture<'a, Result<Synced, StoreError>> {
        let synced = self.with_book(rule, timing, |book, now| {
            let k = timing.tick_of(now);
            for &(member, demand) in demands {
                book.members.insert(member.to_owned(), (demand, now));
            }
            let stale = nanos(timing.stale_after);
            book.members
                .retain(|_, (_, seen)| now.saturating_sub(*seen) <= stale);
            book.divisions.retain(|&t, _| t + 1 >= k);
            book.claims.retain(|&t, _| t >= k);
            let current = book.divisions.get(&k).cloned();
            let members = if current.is_none() {
                book.members
                    .iter()
                    .map(|(id, (demand, _))| Member::new(id.clone(), *demand))
                    .collect()
            } else {
                Vec::new()
            };
            Synced {
                now,
                tick: k,
                previous: k
                    .checked_sub(1)
                    .and_then(|p| book.divisions.get(&p).cloned()),
                current,
                members,
            }
        });
        Box::pin(std::future::ready(Ok(synced)))
    }

    fn publish<'a>(
        &'a self,
        rule: &'a str,
        timing: &'a Timing,
        tick: u64,
        division: &'a str,
    ) -> BoxFuture<'a, Result<String, StoreError>> {
        let stored = self.with_book(rule, timing, |book, _| {
            book.divisions
                .entry(tick)
                .or_insert_with(|| division.to_owned())
                .clone()
        });
        Box::pin(std::future::ready(Ok(stored)))
    }

    fn claim<'a>(
        &'a self,
        rule: &'a str,
        timing: &'a Timing,
        tick: u64,
        cost: u64,
        budget: u64,
    ) -> BoxFuture<'a, Result<Claimed, StoreError>> {
        let claimed = self.with_book(rule, timing, |book, now| {
            if timing.tick_of(now) != tick {
                return Claimed::TickPassed;
            }
            let spent = book.claims.entry(tick).or_default();
            if spent.saturating_add(cost) <= budget {
                *spent += cost;
                *book.claims.entry(tick + 1).or_default() += cost;
                Claimed::Granted
            } else {
                Claimed::Exhausted
            }
        });
        Box::pin(std::future::ready(Ok(claimed)))
    }

    fn remove<'a>(
        &'a self,
        rule: &'a str,
        members: &'a [&'a str],
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        if let Some(book) = self.books.lock().get_mut(rule) {
            for member in members {
                book.members.remove(*member);
            }
        }
        Box::pin(std::future::ready(Ok(())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    const S: Nanos = 1_000_000_000;

    fn terms() -> Terms {
        Terms {
            limit: 1000,
            fairness: Fairness::default(),
            timing: Timing {
                tick: Duration::from_secs(1),
                stale_after: Duration::from_secs(3),
            },
        }
    }

    fn run<F: std::future::Future>(f: F) -> F::Output {
        let mut f = std::pin::pin!(f);
        match f
            .as_mut()
            .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
        {
            std::task::Poll::Ready(v) => v,
            std::task::Poll::Pending => panic!("the memory ledger answers at once"),
        }
    }

    #[test]
    fn the_first_member_takes_the_pool_later_ones_claim_then_share() {
        let clock = ManualClock::new(100 * S);
        let ledger = MemoryLedger::with_clock(clock.clone());
        let t = terms();
        let (_, a) = run(join(&ledger, "r", &t, "a")).unwrap();
        // Alone: the whole limit (1000 tokens and a bucket of 20 fit in 1050 - 20).
        assert_eq!(
            a,
            Joined::Divided(Share {
                tokens: 1000,
                bucket: 20
            })
        );
        // Same tick: b claims a first share from the join budget (20): the floor (200), cut
        // to what fits in half the budget (9 tokens and a bucket of 1).
        let (_, b) = run(join(&ledger, "r", &t, "b")).unwrap();
        assert_eq!(
            b,
            Joined::Claimed(Share {
                tokens: 9,
                bucket: 1
            })
        );
        let (_, c) = run(join(&ledger, "r", &t, "c")).unwrap();
        assert_eq!(
            c,
            Joined::Claimed(Share {
                tokens: 9,
                bucket: 1
            })
        );
        // The budget is spent: d waits for the next division.
        let (_, d) = run(join(&ledger, "r", &t, "d")).unwrap();
        assert_eq!(d, Joined::Waiting);
        clock.advance(Duration::from_secs(1));
        let next = run(tick(&ledger, "r", &t, &[("a", Some(800)), ("b", None)])).unwrap();
        assert_eq!(next.current.len(), 4);
        assert!(next.had_previous);
        assert!(next.current.bound() <= 1050);
    }

    #[test]
    fn every_caller_of_a_tick_gets_the_same_division_and_stale_members_drop() {
        let clock = ManualClock::new(100 * S);
        let ledger = MemoryLedger::with_clock(clock.clone());
        let t = terms();
        let first = run(tick(&ledger, "r", &t, &[("a", Some(10))])).unwrap();
        let second = run(tick(&ledger, "r", &t, &[("b", Some(500))])).unwrap();
        assert_eq!(first.current, second.current);
        assert_eq!(first.current.len(), 1);
        clock.advance(Duration::from_secs(1));
        let next = run(tick(&ledger, "r", &t, &[])).unwrap();
        assert_eq!(next.current.len(), 2);
        clock.advance(Duration::from_secs(3));
        let later = run(tick(&ledger, "r", &t, &[("b", Some(500))])).unwrap();
        assert_eq!(later.current.len(), 1);
        assert!(!later.had_previous);
        run(ledger.remove("r", &["b"])).unwrap();
        clock.advance(Duration::from_secs(1));
        assert!(run(tick(&ledger, "r", &t, &[])).unwrap().current.is_empty());
    }

    #[test]
    fn claims_are_all_or_nothing_within_the_tick() {
        let clock = ManualClock::new(100 * S);
        let ledger = MemoryLedger::with_clock(clock.clone());
        let t = terms().timing;
        assert_eq!(
            run(ledger.claim("r", &t, 100, 15, 20)).unwrap(),
            Claimed::Granted
        );
        assert_eq!(
            run(ledger.claim("r", &t, 100, 6, 20)).unwrap(),
            Claimed::Exhausted
        );
        assert_eq!(
            run(ledger.claim("r", &t, 100, 5, 20)).unwrap(),
            Claimed::Granted
        );
        assert_eq!(
            run(ledger.claim("r", &t, 99, 1, 20)).unwrap(),
            Claimed::TickPassed
        );
        // The next tick starts with this tick's claims spent.
        clock.advance(Duration::from_secs(1));
        assert_eq!(
            run(ledger.claim("r", &t, 101, 1, 20)).unwrap(),
            Claimed::Exhausted
        );
        assert_eq!(
            run(ledger.claim("r", &t, 101, 1, 21)).unwrap(),
            Claimed::Granted
        );
    }
}
