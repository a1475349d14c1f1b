//! The division of one rule's limit among the Envoys reporting demand for it: a pure,
//! deterministic function of the limit, the [`Fairness`] settings and the members' demands.
//! Every Flowgate instance computes the same [`Division`] from the same input, and the
//! [`ledger`](super::ledger) makes sure they all take it from the same input.
//!
//! **What each member gets** (L = the rule's limit per period, N members):
//!
//! 1. The **pool** `L'` handed out as token rates: at most `L`, and small enough that the rates
//!    plus every member's bucket plus the join budget fit in `L × (1 + overshoot)` — so a
//!    window of one period admits at most that much (see [`Division::bound`]). When `L` is
//!    too small for that (fewer than about `N / overshoot` tokens per period), every member
//!    still gets at least one token per period, and the bound says how much higher that goes.
//! 2. A **floor** `f = max(1, ⌊L' × floor / N⌋)` for every member: no Envoy starves.
//! 3. The rest by **max-min fairness** on the reported demand times `headroom`: a member
//!    that asks for less than an equal split of what is left gets all it asks for; the others
//!    share the remainder equally. A member whose demand is not known yet (it has not
//!    reported a full interval) counts as wanting everything.
//! 4. What nobody asked for (the **spare**) is split equally, so a member whose demand grows
//!    can use it at once; the shares always add up to exactly `L'`.
//!
//! Each share comes with the size of its Envoy's token bucket: `max(1, ⌈share × burst⌉)`.
//! Ties are broken by member id, so the result never depends on the input's order.
//!
//! ```
//! use flowgate::rlqs::{Division, Fairness, Member};
//! let members = vec![
//!     Member::new("a", Some(900)),
//!     Member::new("b", Some(200)),
//!     Member::new("c", None),
//! ];
//! let division = Division::compute(1000, &Fairness::default(), members);
//! let share = |id| division.get(id).unwrap().tokens;
//! // b asks for 200 (× 1.1 headroom); a and c split the rest equally.
//! assert_eq!(share("b"), 220);
//! assert!(share("a").abs_diff(share("c")) <= 1);
//! assert_eq!(share("a") + share("b") + share("c"), division.pool());
//! assert!(division.bound() <= 1050);
//! ```

use std::fmt::Write as _;

/// How a rule's limit is divided (the `rlqs.fairness` section of a configuration file).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fairness {
    /// The part of an equal split every member gets whatever its demand (0–1).
    pub floor: f64,
    /// A member below the fair level gets its demand times this (≥ 1, to a thousandth), so
    /// that it can grow a little before its next report.
    pub headroom: f64,
    /// Each member's token bucket holds this fraction of its share (0–1), and at least one
    /// token.
    pub burst: f64,
    /// How much above the limit a window of one period may go (0–1): the rates and the
    /// buckets together fit in `limit × (1 + overshoot)`.
    pub overshoot: f64,
    /// The part of the limit (0–1) that members joining between two divisions may claim
    /// at once, each a floor's worth; it is kept out of the pool, within the overshoot.
    pub join_budget: f64,
}

impl Default for Fairness {
    /// `floor` 0.2, `headroom` 1.1, `burst` 0.02, `overshoot` 0.05, `join_budget` 0.02.
    fn default() -> Self {
        Fairness {
            floor: 0.2,
            headroom: 1.1,
            burst: 0.02,
            overshoot: 0.05,
            join_budget: 0.02,
        }
    }
}

impl Fairness {
    /// Why these settings cannot be used, naming the field; `Ok` when they can.
    pub fn validate(&self) -> Result<(), (&'static str, &'static str)> {
        let unit = |v: f64| v.is_finite() && (0.0..=1.0).contains(&v);
        if !unit(self.floor) {
            return Err(("floor", "must be between 0 and 1"));
        }
        if !(self.headroom.is_finite() && (1.0..=100.0).contains(&self.headroom)) {
            return Err(("headroom", "must be between 1 and 100"));
        }
        if !unit(self.burst) {
            return Err(("burst", "must be between 0 and 1"));
        }
        if !unit(self.overshoot) {
            return Err(("overshoot", "must be between 0 and 1"));
        }
        if !(self.join_budget.is_finite() && (0.0..=0.5).contains(&self.join_budget)) {
            return Err(("join_budget", "must be between 0 and 0.5"));
        }
        Ok(())
    }

    /// The size of the token bucket that goes with a share of `tokens` per period:
    /// `max(1, ⌈tokens × burst⌉)`, and 0 for no tokens.
    pub fn bucket(&self, tokens: u64) -> u64 {
        if tokens == 0 {
            return 0;
        }
        let scaled = (tokens as f64 * self.burst).ceil();
        if scaled >= u64::MAX as f64 {
            u64::MAX
        } else {
            (scaled as u64).max(1)
        }
    }
}

/// One Envoy (one stream's subscription to a rule instance) taking part in a division.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Unique among the members (the stream's id).
    pub id: String,
    /// Requests per period it reported (allowed + denied); `None` until it reported a full
    /// interval.
    pub demand: Option<u64>,
}

impl Member {
    /// A member.
    pub fn new(id: impl Into<String>, demand: Option<u64>) -> Self {
        Member {
            id: id.into(),
            demand,
        }
    }
}

/// What one member is assigned: a token rate and the size of its bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Share {
    /// Tokens per period (the rule's period).
    pub tokens: u64,
    /// The bucket's capacity, which a new bucket starts with.
    pub bucket: u64,
}

/// The shares of every member of one rule instance for one tick. See the [module docs](self).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Division {
    /// The rule's limit per period.
    limit: u64,
    /// The tokens per period handed out (the sum of the shares).
    pool: u64,
    /// Every member's minimum.
    floor: u64,
    /// Tokens plus buckets that joining members may claim per tick.
    join_budget: u64,
    /// Each member's share, sorted by id.
    shares: Vec<(String, Share)>,
}

/// `limit × fraction`, rounded down, computed exactly enough for any `u64` limit.
fn part(limit: u64, fraction: f64) -> u64 {
    let v = (limit as f64 * fraction).floor();
    if v >= u64::MAX as f64 {
        u64::MAX
    } else {
        v.max(0.0) as u64
    }
}

impl Division {
    /// Divides `limit` per period among `members` (duplicate ids count once, with the last
    /// demand given). See the [module docs](self) for the rules.
    pub fn compute(limit: u64, fairness: &Fairness, mut members: Vec<Member>) -> Division {
        members.sort_by(|a, b| a.id.cmp(&b.id));
        members.reverse();
        members.dedup_by(|later, earlier| later.id == earlier.id);
        members.reverse();
        let join_budget = part(limit, fairness.join_budget);
        let cap = limit.saturating_add(part(limit, fairness.overshoot));
        let budget = cap.saturating_sub(join_budget);
        let mut division = Division {
            limit,
            pool: 0,
            floor: 0,
            join_budget,
            shares: Vec::with_capacity(members.len()),
        };
        if members.is_empty() || limit == 0 {
            division.shares = members
                .into_iter()
                .map(|m| (m.id, Share::default()))
                .collect();
            return division;
        }
        // Members that get a share: each needs a token per period; with more members than
        // tokens, those with the highest demand (unknown first), ties by id.
        let n = members.len() as u64;
        let served = n.min(limit) as usize;
        let mut chosen: Vec<usize> = (0..members.len()).collect();
        if served < members.len() {
            chosen.sort_by(|&a, &b| {
                let key = |m: &Member| std::cmp::Reverse(m.demand.unwrap_or(u64::MAX));
                key(&members[a])
                    .cmp(&key(&members[b]))
                    .then(members[a].id.cmp(&members[b].id))
            });
            chosen.truncate(served);
            chosen.sort_unstable();
        }
        let m = served as u64;
        // Rates + buckets ≤ budget, with buckets ≤ 1 + share × burst each.
        let fitting = part(budget.saturating_sub(m), 1.0 / (1.0 + fairness.burst));
        let mut pool = fitting.clamp(m, limit);
        let mut tokens = allocate(pool, fairness, &members, &chosen);
        // The float estimate above may be off by a rounding; shrink the pool until the real
        // buckets fit too (never below one token per member).
        loop {
            let cost: u64 = tokens
                .iter()
                .map(|&t| t.saturating_add(fairness.bucket(t)))
                .fold(0u64, u64::saturating_add);
            if cost <= budget || pool <= m {
                break;
            }
            pool = pool.saturating_sub((cost - budget).max(1)).max(m);
            tokens = allocate(pool, fairness, &members, &chosen);
        }
        division.pool = pool;
        division.floor = floor_of(pool, fairness, m);
        let mut next = chosen.iter().zip(tokens).peekable();
        for (i, member) in members.into_iter().enumerate() {
            let share = match next.peek() {
                Some(&(&c, t)) if c == i => {
                    next.next();
                    Share {
                        tokens: t,
                        bucket: fairness.bucket(t),
                    }
                }
                _ => Share::default(),
            };
            division.shares.push((member.id, share));
        }
        division
    }

    /// The rule's limit per period.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The tokens per period handed out: the sum of the shares.
    pub fn pool(&self) -> u64 {
        self.pool
    }

    /// Every member's minimum share (0 without members).
    pub fn floor(&self) -> u64 {
        self.floor
    }

    /// Tokens plus buckets that members joining before the next division may claim.
    pub fn join_budget(&self) -> u64 {
        self.join_budget
    }

    /// The most one window of one period can admit while this division is in force, its
    /// join budget spent, and no share changed during the window: every rate, every bucket
    /// (full at the window's start) and the join budget.
    pub fn bound(&self) -> u64 {
        self.shares
            .iter()
            .map(|(_, s)| s.tokens.saturating_add(s.bucket))
            .fold(self.join_budget, u64::saturating_add)
    }

    /// The share of member `id`, if it is a member.
    pub fn get(&self, id: &str) -> Option<Share> {
        self.shares
            .binary_search_by(|(m, _)| m.as_str().cmp(id))
            .ok()
            .map(|i| self.shares[i].1)
    }

    /// Every member and its share, by id.
    pub fn shares(&self) -> impl ExactSizeIterator<Item = (&str, Share)> {
        self.shares.iter().map(|(id, s)| (id.as_str(), *s))
    }

    /// Members (with or without a share).
    pub fn len(&self) -> usize {
        self.shares.len()
    }

    /// Whether there are no members.
    pub fn is_empty(&self) -> bool {
        self.shares.is_empty()
    }

    /// What a member joining before the next division claims: the floor (or, without
    /// members, `limit × floor`), and at least one token.
    pub fn first_share(&self, fairness: &Fairness) -> u64 {
        if self.floor > 0 {
            self.floor
        } else {
            part(self.limit, fairness.floor).max(1)
        }
    }

    /// A compact text form, for the shared store: [`Division::decode`] reads it back. Member
    /// ids must not contain `,`, `=`, `/` or `;`.
    pub fn encode(&self) -> String {
        let mut out = String::with_capacity(32 + self.shares.len() * 24);
        let _ = write!(
            out,
            "1;{};{};{};{};",
            self.limit, self.pool, self.floor, self.join_budget
        );
        for (i, (id, share)) in self.shares.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let _ = write!(out, "{id}={}/{}", share.tokens, share.bucket);
        }
        out
    }

    /// Reads [`Division::encode`]'s form; `None` if it is not one.
    pub fn decode(text: &str) -> Option<Division> {
        let mut parts = text.splitn(6, ';');
        if parts.next()? != "1" {
            return None;
        }
        let mut number = || parts.next()?.parse::<u64>().ok();
        let (limit, pool, floor, join_budget) = (number()?, number()?, number()?, number()?);
        let rest = parts.next()?;
        let mut shares = Vec::new();
        if !rest.is_empty() {
            for item in rest.split(',') {
                let (id, share) = item.split_once('=')?;
                let (tokens, bucket) = share.split_once('/')?;
                shares.push((
                    id.to_owned(),
                    Share {
                        tokens: tokens.parse().ok()?,
                        bucket: bucket.parse().ok()?,
                    },
                ));
            }
        }
        if !shares.windows(2).all(|w| w[0].0 < w[1].0) {
            return None;
        }
        Some(Division {
            limit,
            pool,
            floor,
            join_budget,
            shares,
        })
    }
}

/// Every served member's minimum: `max(1, ⌊pool × floor / m⌋)`.
fn floor_of(pool: u64, fairness: &Fairness, m: u64) -> u64 {
    if m == 0 {
        return 0;
    }
    (part(pool, fairness.floor) / m).max(1)
}

/// The tokens of each member of `chosen` (indices into `members`, ascending): the floor,
/// then max-min fairness on demand × headroom, then the spare split equally. Sums to `pool`
/// (which is at least `chosen.len()`).
fn allocate(pool: u64, fairness: &Fairness, members: &[Member], chosen: &[usize]) -> Vec<u64> {
    let m = chosen.len();
    let floor = floor_of(pool, fairness, m as u64);
    let mut tokens = vec![floor; m];
    let mut left = pool - floor * m as u64;
    // What each wants beyond the floor.
    let extra: Vec<u64> = chosen
        .iter()
        .map(|&i| match members[i].demand {
            None => u64::MAX,
            Some(d) => {
                // Exact: the headroom in thousandths (so 200 × 1.1 is 220, not 221).
                let milli = (fairness.headroom * 1000.0).round() as u128;
                let want = (u128::from(d) * milli).div_ceil(1000);
                u64::try_from(want)
                    .unwrap_or(u64::MAX)
                    .saturating_sub(floor)
            }
        })
        .collect();
    // Positions in `chosen` (so in id order) from the smallest want up.
    let mut order: Vec<usize> = (0..m).collect();
    order.sort_by_key(|&p| (extra[p], p));
    for (at, &p) in order.iter().enumerate() {
        let unserved = (m - at) as u64;
        let level = left / unserved;
        if extra[p] <= level {
            tokens[p] += extra[p];
            left -= extra[p];
            continue;
        }
        // Everyone from here on wants more than an equal split: each gets the level, and
        // the remainder goes one token each to the lowest ids among them.
        let mut capped: Vec<usize> = order[at..].to_vec();
        capped.sort_unstable();
        let mut ones = left - level * unserved;
        for &q in &capped {
            tokens[q] += level;
            if ones > 0 {
                tokens[q] += 1;
                ones -= 1;
            }
        }
        return tokens;
    }
    // Every want is met: split the spare equally, the remainder to the lowest ids.
    let each = left / m as u64;
    let mut ones = left - each * m as u64;
    for t in &mut tokens {
        *t += each;
        if ones > 0 {
            *t += 1;
            ones -= 1;
        }
    }
    tokens
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shares(d: &Division) -> Vec<u64> {
        d.shares().map(|(_, s)| s.tokens).collect()
    }

    #[test]
    fn skewed_demand_gets_max_min_fair_shares_within_the_bound() {
        let f = Fairness::default();
        // Zipf-like: 2000, 500, 222, 125, 80, 55, 40, 31, 24, 20, ...
        let members: Vec<Member> = (0..20u64)
            .map(|i| Member::new(format!("e{i:02}"), Some(2000 / ((i + 1) * (i + 1)))))
            .collect();
        let d = Division::compute(1000, &f, members);
        assert_eq!(d.pool(), 990);
        assert_eq!(shares(&d).iter().sum::<u64>(), 990);
        assert_eq!(d.floor(), 9);
        assert!(d.bound() <= 1050, "{}", d.bound());
        assert!(shares(&d).iter().all(|&t| t >= d.floor()));
        // The light ones get demand × 1.1 (e09: 20 → 22; e19: 5 → the floor, 9)...
        assert_eq!(d.get("e09").unwrap().tokens, 22);
        assert_eq!(d.get("e19").unwrap().tokens, 9);
        // ...the heavy ones split the rest equally.
        let heavy = d.get("e00").unwrap().tokens;
        assert!(heavy.abs_diff(d.get("e01").unwrap().tokens) <= 1);
        assert!(heavy.abs_diff(d.get("e02").unwrap().tokens) <= 1);
        assert!(heavy > 125);
    }

    #[test]
    fn idle_members_keep_the_floor_and_the_spare_is_split() {
        let f = Fairness::default();
        let d = Division::compute(
            100,
            &f,
            vec![Member::new("a", Some(0)), Member::new("b", Some(10))],
        );
        // floor = ⌊pool × 0.2 / 2⌋; b wants 13; the rest is split.
        assert_eq!(shares(&d).iter().sum::<u64>(), d.pool());
        assert!(d.get("a").unwrap().tokens >= d.floor());
        assert!(d.get("b").unwrap().tokens >= 13);
    }

    #[test]
    fn more_members_than_tokens_serves_the_busiest_with_one_token_each() {
        let f = Fairness::default();
        let members = (0..5)
            .map(|i| Member::new(format!("m{i}"), Some(i)))
            .collect();
        let d = Division::compute(3, &f, members);
        assert_eq!(shares(&d), vec![0, 0, 1, 1, 1]);
        assert_eq!(d.get("m0").unwrap(), Share::default());
        assert_eq!(d.get("m4").unwrap().bucket, 1);
    }

    #[test]
    fn encoding_round_trips_and_rejects_garbage() {
        let f = Fairness::default();
        let d = Division::compute(
            1000,
            &f,
            vec![Member::new("x:1", Some(5)), Member::new("y:2", None)],
        );
        assert_eq!(Division::decode(&d.encode()), Some(d));
        let empty = Division::compute(10, &f, vec![]);
        assert_eq!(Division::decode(&empty.encode()), Some(empty));
        for bad in [
            "",
            "2;1;1;1;1;",
            "1;1;1;1;1;a=1",
            "1;x;1;1;1;",
            "1;1;1;1;1;b=1/1,a=1/1",
        ] {
            assert_eq!(Division::decode(bad), None, "{bad}");
        }
    }

    #[test]
    fn fairness_settings_are_validated() {
        assert!(Fairness::default().validate().is_ok());
        let bad = Fairness {
            headroom: 0.5,
            ..Fairness::default()
        };
        assert_eq!(bad.validate().unwrap_err().0, "headroom");
        let nan = Fairness {
            floor: f64::NAN,
            ..Fairness::default()
        };
        assert_eq!(nan.validate().unwrap_err().0, "floor");
        assert_eq!(Fairness::default().bucket(0), 0);
        assert_eq!(Fairness::default().bucket(10), 1);
        assert_eq!(Fairness::default().bucket(1000), 20);
    }
}
