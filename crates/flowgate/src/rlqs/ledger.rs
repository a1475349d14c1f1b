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
//! **Applying a division.** An instance assigns each of its members the smaller of its
//! share in this tick's division and what it held before — its share in the previous tick's
//! division, or its claim ([`Holding::apply`]): a share that goes down does so at once, one
//! that goes up waits a tick. Instances tick at slightly different moments, but while each is
//! at most one tick behind, every member holds at most its share of the older of two
//! consecutive divisions, or its claim — so the tokens held never exceed one division's pool
//! plus the claims.
//!
//! **Joining.** A member that reports for the first time ([`join`]) is recorded (its demand
//! unknown) and claims a first share, in the store: from the tick's join budget, the
//! division's floor but at most half of what is left — or, when nobody holds anything (no
//! division with shares this tick or the last, no claims last tick), from all a division could
//! hand out, a quarter of what is left each, so that a fleet starting at once gets a share
//! each. A claim counts against the next tick's budget too (the member holds it until its
//! instance ticks again), so the claims held at any moment stay within one budget. Once a
//! division lists the member, its share comes from there.

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
    /// Join budget spent in the previous tick (claims that may still be held).
    pub claimed_before: u64,
    /// When `current` is `None` and members were asked for: every live member with its
    /// demand, to compute the division from.
    pub members: Vec<Member>,
}

/// What a joining member asks of a tick's join budget ([`Ledger::claim`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Claim {
    /// The most tokens it wants.
    pub ask: u64,
    /// The part of what is left of the budget it may take (0–1).
    pub fraction: f64,
    /// [`Fairness::burst`]: a share of `t` tokens costs `t + max(1, ⌈t × burst⌉)`.
    pub burst: f64,
    /// The tick's budget (tokens and buckets).
    pub budget: u64,
}

impl Claim {
    /// The tokens granted and their cost when `spent` of the budget is gone:
    /// `min(ask, ⌊left × fraction / (1 + burst)⌋)` and at least one, if the cost fits in what
    /// is left; else `None`. The Redis script computes exactly this (the same floating-point
    /// operations).
    pub fn grant(&self, spent: u64) -> Option<(u64, u64)> {
        let left = self.budget.saturating_sub(spent);
        let most = (left as f64 * self.fraction / (1.0 + self.burst)).floor();
        let tokens = if most >= self.ask as f64 {
            self.ask
        } else {
            most as u64
        }
        .max(1);
        let bucket = ((tokens as f64 * self.burst).ceil() as u64).max(1);
        let cost = tokens.checked_add(bucket)?;
        (cost <= left).then_some((tokens, cost))
    }
}

/// What a member's claim on the join budget got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claimed {
    /// Granted this many tokens; their cost was taken from the tick's budget.
    Granted(u64),
    /// The tick's budget cannot cover even one token.
    Exhausted,
    /// The store's time is in another tick than the claim was for.
    TickPassed,
}

/// The storage a [`tick`] and a [`join`] run on: a few atomic operations per rule instance
/// (named by `rule`, an opaque string). Implemented by [`MemoryLedger`] and the Redis ledger.
pub trait Ledger: Send + Sync {
    /// Records `demands` (refreshing those members), drops members not refreshed for
    /// `timing.stale_after`, and returns the current and previous ticks' divisions and the
    /// previous tick's claims — and, when the current tick has no division yet and `members`
    /// is set, the live members to compute it from.
    fn sync<'a>(
        &'a self,
        rule: &'a str,
        timing: &'a Timing,
        demands: &'a [Demand<'a>],
        members: bool,
    ) -> BoxFuture<'a, Result<Synced, StoreError>>;

    /// Stores `division` for `tick` unless one is stored already; returns the stored one.
    fn publish<'a>(
        &'a self,
        rule: &'a str,
        timing: &'a Timing,
        tick: u64,
        division: &'a str,
    ) -> BoxFuture<'a, Result<String, StoreError>>;

    /// Grants `claim` from `tick`'s join budget ([`Claim::grant`] on what is spent), if the
    /// store's time is still in `tick`, and takes its cost from this tick's and the next
    /// tick's budget: until its instance ticks, the member still holds it in the next tick.
    fn claim<'a>(
        &'a self,
        rule: &'a str,
        timing: &'a Timing,
        tick: u64,
        claim: &'a Claim,
    ) -> BoxFuture<'a, Result<Claimed, StoreError>>;

    /// Forgets `members` (abandoned, or never to report again).
    fn remove<'a>(
        &'a self,
        rule: &'a str,
        members: &'a [&'a str],
    ) -> BoxFuture<'a, Result<(), StoreError>>;
}

/// One rule instance's division as of one tick: what [`tick`] answers.
#[derive(Debug, Clone)]
pub struct Tick {
    /// The store's time.
    pub now: Nanos,
    /// The tick number.
    pub number: u64,
    /// This tick's division.
    pub current: Arc<Division>,
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

/// What `limit × fraction` rounds down to (as the division computes its parts).
fn part(limit: u64, fraction: f64) -> u64 {
    let v = (limit as f64 * fraction).floor();
    if v >= u64::MAX as f64 {
        u64::MAX
    } else {
        v.max(0.0) as u64
    }
}

/// Refreshes `demands` and returns this tick's division of `rule`, computing and storing it
/// if no instance has yet. See the [module docs](self).
pub async fn tick(
    ledger: &(dyn Ledger + '_),
    rule: &str,
    terms: &Terms,
    demands: &[Demand<'_>],
) -> Result<Tick, StoreError> {
    let synced = ledger.sync(rule, &terms.timing, demands, true).await?;
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
    })
}

/// How a member's claim was answered by [`join`] or [`claim_first_share`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Joined {
    /// A first share, claimed from the join budget of tick `tick`.
    Claimed {
        /// The share.
        share: Share,
        /// The tick it was claimed in.
        tick: u64,
    },
    /// The budget is spent; it gets its share from a later division.
    Waiting,
}

impl Joined {
    /// The share it may use now, if any.
    pub fn share(&self) -> Option<Share> {
        match *self {
            Joined::Claimed { share, .. } => Some(share),
            Joined::Waiting => None,
        }
    }
}

/// A member reporting for the first time: records it (demand unknown) and claims it a first
/// share. See the [module docs](self).
pub async fn join(
    ledger: &(dyn Ledger + '_),
    rule: &str,
    terms: &Terms,
    member: &str,
) -> Result<Joined, StoreError> {
    let synced = ledger
        .sync(rule, &terms.timing, &[(member, None)], false)
        .await?;
    let decode = |text: &Option<String>| -> Result<Option<Division>, StoreError> {
        text.as_deref()
            .map(|t| Division::decode(t).ok_or_else(malformed))
            .transpose()
    };
    let (current, previous) = (decode(&synced.current)?, decode(&synced.previous)?);
    let fairness = &terms.fairness;
    let join_budget = part(terms.limit, fairness.join_budget);
    let handed_out = |d: &Option<Division>| d.as_ref().is_some_and(|d| d.pool() > 0);
    let nobody_holds =
        !handed_out(&previous) && !handed_out(&current) && synced.claimed_before == 0;
    let claim = if nobody_holds {
        // A quarter of what is left of all a division could hand out.
        let cap = terms
            .limit
            .saturating_add(part(terms.limit, fairness.overshoot));
        Claim {
            ask: u64::MAX,
            fraction: 0.25,
            burst: fairness.burst,
            budget: cap.saturating_sub(join_budget),
        }
    } else {
        let floor = current
            .as_ref()
            .or(previous.as_ref())
            .map_or(0, Division::floor);
        Claim {
            ask: if floor > 0 {
                floor
            } else {
                part(terms.limit, fairness.floor).max(1)
            },
            fraction: 0.5,
            burst: fairness.burst,
            budget: join_budget,
        }
    };
    claim_share(ledger, rule, terms, synced.tick, &claim).await
}

/// Claims a first share in `now`'s tick for a member the division does not give one yet:
/// the floor, but at most half of what is left of the join budget.
pub async fn claim_first_share(
    ledger: &(dyn Ledger + '_),
    rule: &str,
    terms: &Terms,
    now: &Tick,
) -> Result<Joined, StoreError> {
    let claim = Claim {
        ask: now.current.first_share(&terms.fairness),
        fraction: 0.5,
        burst: terms.fairness.burst,
        budget: now.current.join_budget(),
    };
    claim_share(ledger, rule, terms, now.number, &claim).await
}

async fn claim_share(
    ledger: &(dyn Ledger + '_),
    rule: &str,
    terms: &Terms,
    tick: u64,
    claim: &Claim,
) -> Result<Joined, StoreError> {
    Ok(
        match ledger.claim(rule, &terms.timing, tick, claim).await? {
            Claimed::Granted(tokens) => Joined::Claimed {
                share: Share {
                    tokens,
                    bucket: terms.fairness.bucket(tokens),
                },
                tick,
            },
            Claimed::Exhausted | Claimed::TickPassed => Joined::Waiting,
        },
    )
}

/// What one member holds, as its instance tracks it between ticks: its share in the last
/// division it was in, its claim, what it was last assigned. [`Holding::apply`] is the rule
/// of the [module docs](self).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Holding {
    /// Its share in the last division that listed it, and that division's tick.
    divided: Option<(u64, Share)>,
    /// Its claim and the tick of the claim.
    claim: Option<(u64, Share)>,
    /// What it holds now.
    current: Option<Share>,
}

impl Holding {
    /// What it holds now (`None`: nothing from the ledger).
    pub fn current(&self) -> Option<Share> {
        self.current
    }

    /// It was granted `share` by a claim in `tick`.
    pub fn claimed(&mut self, tick: u64, share: Share) {
        self.claim = Some((tick, share));
        self.current = Some(share);
    }

    /// Applies tick `tick`, whose division gives it `divided` (`None`: not a member), and
    /// answers what it holds now: the smaller of that and what it held before (its share in
    /// the previous tick's division, or its claim, which holds for its tick and the next);
    /// a claim when the division does not list it. `None`: nothing — it should claim.
    /// Applying the same tick again changes nothing.
    ///
    /// ```
    /// use flowgate::rlqs::{ledger::Holding, Share};
    /// let s = |tokens| Share { tokens, bucket: 1 };
    /// let mut h = Holding::default();
    /// h.claimed(10, s(9));
    /// assert_eq!(h.apply(11, Some(s(50))), Some(s(9))); // up: a tick later
    /// assert_eq!(h.apply(12, Some(s(60))), Some(s(50)));
    /// assert_eq!(h.apply(13, Some(s(30))), Some(s(30))); // down: at once
    /// assert_eq!(h.apply(13, Some(s(30))), Some(s(30)));
    /// assert_eq!(h.apply(15, None), None); // missed a tick and not listed: claim again
    /// ```
    pub fn apply(&mut self, tick: u64, divided: Option<Share>) -> Option<Share> {
        let before = match self.divided {
            Some((at, _)) if at == tick => return self.current,
            Some((at, share)) if at + 1 == tick => Some(share),
            _ => None,
        };
        let claim = self
            .claim
            .filter(|&(at, _)| at + 1 >= tick)
            .map(|(_, share)| share);
        let next = match divided {
            Some(d) => before.or(claim).map(|held| smaller(held, d)),
            None => claim,
        };
        if let Some(d) = divided {
            self.divided = Some((tick, d));
            self.claim = None;
        }
        self.current = next;
        next
    }

    /// Forgets everything (the ledger was away: start over).
    pub fn reset(&mut self) {
        *self = Holding::default();
    }
}

/// The smaller of two shares (by tokens).
fn smaller(a: Share, b: Share) -> Share {
    if a.tokens <= b.tokens { a } else { b }
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
/// let first = ledger::join(&ledger, "rule", &terms, "envoy-1").await?;
/// // Nobody held anything: a quarter of all a division could hand out (105 - 2).
/// assert_eq!(first.share().unwrap().tokens, 25);
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
        members: bool,
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
            book.claims.retain(|&t, _| t + 1 >= k);
            let current = book.divisions.get(&k).cloned();
            let members = if current.is_none() && members {
                book.members
                    .iter()
                    .map(|(id, (demand, _))| Member::new(id.clone(), *demand))
                    .collect()
            } else {
                Vec::new()
            };
            let before = k.checked_sub(1);
            Synced {
                now,
                tick: k,
                previous: before.and_then(|p| book.divisions.get(&p).cloned()),
                claimed_before: before
                    .and_then(|p| book.claims.get(&p).copied())
                    .unwrap_or(0),
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
        claim: &'a Claim,
    ) -> BoxFuture<'a, Result<Claimed, StoreError>> {
        let claimed = self.with_book(rule, timing, |book, now| {
            if timing.tick_of(now) != tick {
                return Claimed::TickPassed;
            }
            let spent = book.claims.get(&tick).copied().unwrap_or(0);
            match claim.grant(spent) {
                Some((tokens, cost)) => {
                    *book.claims.entry(tick).or_default() += cost;
                    *book.claims.entry(tick + 1).or_default() += cost;
                    Claimed::Granted(tokens)
                }
                None => Claimed::Exhausted,
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

    fn tokens(joined: Joined) -> u64 {
        joined.share().map_or(0, |s| s.tokens)
    }

    #[test]
    fn a_fleet_starting_at_once_claims_quarters_later_ones_the_floor() {
        let clock = ManualClock::new(100 * S);
        let ledger = MemoryLedger::with_clock(clock.clone());
        let t = terms();
        // Nobody holds anything: each takes a quarter of what is left of 1030 (1050 - 20).
        let shares: Vec<u64> = ["a", "b", "c", "d"]
            .iter()
            .map(|m| tokens(run(join(&ledger, "r", &t, m)).unwrap()))
            .collect();
        assert_eq!(shares, vec![252, 189, 141, 106]);
        // The next tick divides among all four. Its join budget still carries the last
        // tick's claims: a joiner waits.
        clock.advance(Duration::from_secs(1));
        let next = run(tick(&ledger, "r", &t, &[("a", Some(800)), ("b", None)])).unwrap();
        assert_eq!(next.current.len(), 4);
        assert!(next.current.bound() <= 1050);
        assert_eq!(run(join(&ledger, "r", &t, "e")).unwrap(), Joined::Waiting);
        // A tick later, joiners claim the floor, at most half of what is left of 20 each.
        clock.advance(Duration::from_secs(1));
        run(tick(&ledger, "r", &t, &[("a", Some(800))])).unwrap();
        assert_eq!(tokens(run(join(&ledger, "r", &t, "f")).unwrap()), 9);
        assert_eq!(tokens(run(join(&ledger, "r", &t, "g")).unwrap()), 4);
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
        run(ledger.remove("r", &["b"])).unwrap();
        clock.advance(Duration::from_secs(1));
        assert!(run(tick(&ledger, "r", &t, &[])).unwrap().current.is_empty());
    }

    #[test]
    fn claims_take_their_part_of_what_is_left_within_the_tick() {
        let clock = ManualClock::new(100 * S);
        let ledger = MemoryLedger::with_clock(clock.clone());
        let t = terms().timing;
        let half = |ask| Claim {
            ask,
            fraction: 0.5,
            burst: 0.02,
            budget: 20,
        };
        let claim = |tick, c| run(ledger.claim("r", &t, tick, &c)).unwrap();
        assert_eq!(claim(100, half(50)), Claimed::Granted(9));
        assert_eq!(claim(100, half(3)), Claimed::Granted(3));
        assert_eq!(claim(100, half(50)), Claimed::Granted(2));
        assert_eq!(claim(100, half(50)), Claimed::Granted(1));
        assert_eq!(claim(100, half(50)), Claimed::Exhausted);
        assert_eq!(claim(99, half(1)), Claimed::TickPassed);
        // The next tick starts with this tick's claims spent.
        clock.advance(Duration::from_secs(1));
        assert_eq!(claim(101, half(1)), Claimed::Exhausted);
        let synced = run(ledger.sync("r", &t, &[], false)).unwrap();
        assert_eq!(synced.claimed_before, 10 + 4 + 3 + 2);
    }

    #[test]
    fn holdings_go_down_at_once_and_up_a_tick_later() {
        let s = |tokens| Share { tokens, bucket: 1 };
        let mut h = Holding::default();
        // Listed before it ever held anything: nothing yet (it should claim).
        assert_eq!(h.apply(1, Some(s(40))), None);
        assert_eq!(h.apply(2, Some(s(50))), Some(s(40)));
        assert_eq!(h.apply(3, Some(s(20))), Some(s(20)));
        // A claim holds for its tick and the next, while no division lists it.
        let mut c = Holding::default();
        c.claimed(5, s(9));
        assert_eq!(c.apply(5, None), Some(s(9)));
        assert_eq!(c.apply(6, None), Some(s(9)));
        assert_eq!(c.apply(7, None), None);
        c.reset();
        assert_eq!(c.current(), None);
    }
}
