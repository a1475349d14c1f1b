//! Property tests of the RLQS division and ledger (`flowgate::rlqs`):
//!
//! * a division hands out exactly its pool, never more than the limit, at least the floor to
//!   every member it serves (every member when there are no more members than tokens), and
//!   keeps rates + buckets + join budget within `limit × (1 + overshoot)` whenever that
//!   leaves a token per member;
//! * it is max-min fair: a member that gets less than it asks for has at most one token less
//!   than anyone; a member that asks for less than that gets all it asks for;
//! * it does not depend on the members' order, and survives its text form;
//! * through the ledger, with members spread over several instances that tick in any order
//!   within a tick, joining and leaving: a joining member gets a share at its first report
//!   while the join budget lasts (always on a fresh rule), and the shares and buckets
//!   assigned at any moment — claims included — stay within the bound.
//!
//! Failing cases are saved to `tests/rlqs_division.proptest-regressions`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use flowgate::clock::{ManualClock, Nanos};
use flowgate::rlqs::ledger::{self, Holding, Joined, Terms, Timing};
use flowgate::rlqs::{Division, Fairness, Member, MemoryLedger};
use proptest::prelude::*;

fn fairness() -> impl Strategy<Value = Fairness> {
    (
        0.0..=1.0f64,
        1.0..=3.0f64,
        0.0..=0.2f64,
        0.0..=0.2f64,
        0.0..=0.1f64,
    )
        .prop_map(
            |(floor, headroom, burst, overshoot, join_budget)| Fairness {
                floor,
                headroom,
                burst,
                overshoot,
                join_budget,
            },
        )
}

fn members() -> impl Strategy<Value = Vec<Member>> {
    prop::collection::vec(
        prop_oneof![
            1 => Just(None),
            6 => (0u64..5000).prop_map(Some),
        ],
        0..40,
    )
    .prop_map(|demands| {
        demands
            .into_iter()
            .enumerate()
            .map(|(i, d)| Member::new(format!("m{i:03}"), d))
            .collect()
    })
}

/// `limit × fraction`, rounded down (as the division computes it).
fn part(limit: u64, fraction: f64) -> u64 {
    (limit as f64 * fraction).floor() as u64
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn divisions_keep_their_invariants(
        limit in prop_oneof![1u64..50, 50u64..100_000],
        fairness in fairness(),
        members in members(),
        seed in any::<u64>(),
    ) {
        let d = Division::compute(limit, &fairness, members.clone());
        let n = members.len() as u64;
        let tokens: Vec<u64> = d.shares().map(|(_, s)| s.tokens).collect();
        let total: u64 = tokens.iter().sum();
        prop_assert_eq!(total, d.pool());
        prop_assert!(d.pool() <= limit);
        prop_assert_eq!(d.len() as u64, n);
        if n > 0 {
            prop_assert!(d.pool() >= n.min(limit));
            let served = tokens.iter().filter(|&&t| t > 0).count() as u64;
            prop_assert_eq!(served, n.min(limit));
            prop_assert!(d.floor() >= 1);
            prop_assert!(tokens.iter().all(|&t| t == 0 || t >= d.floor()));
        }
        for (_, share) in d.shares() {
            prop_assert_eq!(share.bucket, fairness.bucket(share.tokens));
        }
        // The bound: whenever the budget leaves a token per member, it holds.
        let cap = limit + part(limit, fairness.overshoot);
        let join = part(limit, fairness.join_budget);
        let fitting = ((cap - join.min(cap)).saturating_sub(n) as f64 / (1.0 + fairness.burst)).floor() as u64;
        if n <= limit && fitting >= n {
            prop_assert!(d.bound() <= cap, "bound {} > cap {}", d.bound(), cap);
        } else {
            prop_assert_eq!(d.pool(), n.min(limit));
        }
        // Max-min fairness among the members served.
        let wants: BTreeMap<&str, u64> = members.iter().map(|m| {
            let milli = (fairness.headroom * 1000.0).round() as u128;
            let want = m.demand.map_or(u64::MAX, |dm| (u128::from(dm) * milli).div_ceil(1000) as u64);
            (m.id.as_str(), want.max(d.floor()))
        }).collect();
        for (id, share) in d.shares() {
            if share.tokens == 0 {
                continue;
            }
            if share.tokens < wants[id] {
                for (_, other) in d.shares() {
                    prop_assert!(other.tokens <= share.tokens + 1,
                        "{} has {} (wants {}), another has {}", id, share.tokens, wants[id], other.tokens);
                }
            }
        }
        // Any order, same division; the text form round-trips.
        let mut shuffled = members;
        let mut s = seed | 1;
        for i in (1..shuffled.len()).rev() {
            s ^= s << 13; s ^= s >> 7; s ^= s << 17;
            shuffled.swap(i, (s % (i as u64 + 1)) as usize);
        }
        prop_assert_eq!(&Division::compute(limit, &fairness, shuffled), &d);
        let decoded = Division::decode(&d.encode());
        prop_assert_eq!(decoded.as_ref(), Some(&d));
    }
}

/// Polls a memory ledger's future, which is always ready.
fn now<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    match f
        .as_mut()
        .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
    {
        std::task::Poll::Ready(v) => v,
        std::task::Poll::Pending => panic!("the memory ledger answers at once"),
    }
}

/// One step of a fleet's life within a tick.
#[derive(Debug, Clone)]
enum Event {
    /// A new member joins on instance `instance`.
    Join { instance: usize },
    /// Member `index` (mod the live ones) changes its demand.
    Demand { index: usize, demand: u64 },
    /// Member `index` (mod the live ones) leaves (its entry goes stale).
    Leave { index: usize },
}

fn events() -> impl Strategy<Value = Vec<Vec<Event>>> {
    let event = prop_oneof![
        2 => (0usize..3).prop_map(|instance| Event::Join { instance }),
        3 => (any::<usize>(), 0u64..3000).prop_map(|(index, demand)| Event::Demand { index, demand }),
        1 => any::<usize>().prop_map(|index| Event::Leave { index }),
    ];
    prop::collection::vec(prop::collection::vec(event, 0..6), 1..12)
}

/// A member as its instance sees it.
#[derive(Debug, Clone)]
struct Held {
    instance: usize,
    demand: Option<u64>,
    /// What it holds.
    holding: Holding,
    /// Whether it left (stopped reporting).
    gone: bool,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_fleet_over_several_instances_stays_within_the_bound(
        limit in 100u64..5000,
        plan in events(),
        order in prop::collection::vec(0usize..6, 12),
    ) {
        const S: Nanos = 1_000_000_000;
        let clock = ManualClock::new(1_000 * S);
        let store = MemoryLedger::with_clock(clock.clone());
        let terms = Terms {
            limit,
            fairness: Fairness::default(),
            timing: Timing { tick: Duration::from_secs(1), stale_after: Duration::from_secs(2) },
        };
        let cap = limit + part(limit, terms.fairness.overshoot);
        let mut held: BTreeMap<String, Held> = BTreeMap::new();
        let mut next_id = 0u32;
        let assigned = |held: &BTreeMap<String, Held>| -> u64 {
            held.values().filter_map(|h| h.holding.current()).map(|s| s.tokens + s.bucket).sum()
        };
        for (k, events) in plan.iter().enumerate() {
            // The three instances tick at the start of the tick, in an order of the plan's;
            // an instance ticks only the rule instances it has members of.
            let mut instances = vec![0usize, 1, 2];
            instances.rotate_left(order[k % order.len()] % 3);
            for &instance in &instances {
                let demands: Vec<(String, Option<u64>)> = held
                    .iter()
                    .filter(|(_, h)| h.instance == instance && !h.gone)
                    .map(|(id, h)| (id.clone(), h.demand))
                    .collect();
                if demands.is_empty() {
                    continue;
                }
                let refs: Vec<(&str, Option<u64>)> =
                    demands.iter().map(|(id, d)| (id.as_str(), *d)).collect();
                let tick = now(ledger::tick(&store, "rule", &terms, &refs)).unwrap();
                for (id, _) in &demands {
                    let h = held.get_mut(id).unwrap();
                    if h.holding.apply(tick.number, tick.current.get(id)).is_none() {
                        let claimed = now(ledger::claim_first_share(&store, "rule", &terms, &tick)).unwrap();
                        if let Joined::Claimed { share, tick } = claimed {
                            h.holding.claimed(tick, share);
                        }
                    }
                }
                prop_assert!(assigned(&held) <= cap, "tick {}: {} assigned > {}", k, assigned(&held), cap);
            }
            // Events within the tick.
            for event in events {
                let live: Vec<String> = held.iter().filter(|(_, h)| !h.gone).map(|(id, _)| id.clone()).collect();
                match event {
                    Event::Join { instance } => {
                        let id = format!("i{instance}:{next_id}");
                        next_id += 1;
                        let joined = now(ledger::join(&store, "rule", &terms, &id)).unwrap();
                        if next_id == 1 {
                            // Nobody held anything: a share at once.
                            prop_assert!(joined.share().is_some(), "{:?}", joined);
                        }
                        let mut holding = Holding::default();
                        if let Joined::Claimed { share, tick } = joined {
                            prop_assert!(share.tokens >= 1);
                            holding.claimed(tick, share);
                        }
                        held.insert(id, Held { instance: *instance, demand: None, holding, gone: false });
                    }
                    Event::Demand { index, demand } if !live.is_empty() => {
                        held.get_mut(&live[index % live.len()]).unwrap().demand = Some(*demand);
                    }
                    Event::Leave { index } if !live.is_empty() => {
                        held.get_mut(&live[index % live.len()]).unwrap().gone = true;
                    }
                    _ => {}
                }
                // Members that left keep what they hold until their entry goes stale.
                prop_assert!(assigned(&held) <= cap, "tick {}: {} assigned > {} after {:?}", k, assigned(&held), cap, event);
            }
            clock.advance(Duration::from_secs(1));
            // A member that left a tick ago no longer holds anything (its assignment
            // expired; the ledger forgets it only once stale, later).
            for h in held.values_mut() {
                if h.gone {
                    h.holding.reset();
                }
            }
        }
    }
}
