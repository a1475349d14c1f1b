//! Property tests for the algorithms' invariants, on random traces of (time step, cost).
//!
//! * GCRA grants at most `burst + t / T` units in any interval of length `t`.
//! * The leaky bucket and GCRA take identical decisions (ITU-T I.371's equivalence).
//! * Fixed window: at most `limit` per aligned window. Sliding log: at most `limit` in any
//!   window of `period` (exact).
//! * Sliding-window counter: fewer than `2 × limit` in any window of `period` (its documented
//!   worst case) — and that worst case is actually reached.
//! * For every algorithm: a denial changes nothing; `retry_after` is exact (granted after
//!   waiting it, still denied 1 ns earlier); `remaining` is exact (that many more fit, one more
//!   does not); after `reset_after` the full capacity is back.
//!
//! Failing cases are saved to `tests/properties.proptest-regressions`, which is committed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use flowgate::algorithm::{FixedWindow, Gcra, LeakyBucket, SlidingLog, SlidingWindow, State};
use flowgate::clock::Nanos;
use flowgate::{Algorithm, Decision, Quota};
use proptest::prelude::*;

const START: Nanos = 1_700_006_400 * 1_000_000_000;

/// A quota for `algorithm` with a small limit and a period between 1 µs and 10 s.
fn quota(algorithm: Algorithm) -> impl Strategy<Value = Quota> {
    (1u64..=20, 1_000u64..=10_000_000_000, 1u64..=40).prop_map(move |(limit, period, burst)| {
        let q = Quota::new(limit, Duration::from_nanos(period))
            .unwrap()
            .with_algorithm(algorithm)
            .unwrap();
        if algorithm.has_burst() {
            q.with_burst(burst).unwrap()
        } else {
            q
        }
    })
}

/// Steps of (time advance as a fraction of the period in 1/64ths, cost as a fraction of the
/// burst in 1/8ths): scale-free, so every quota sees bursts, idles and boundaries.
fn steps() -> impl Strategy<Value = Vec<(u64, u64)>> {
    prop::collection::vec(
        (
            prop_oneof![3 => Just(0u64), 5 => 0u64..16, 2 => 0u64..200],
            prop_oneof![1 => Just(0u64), 6 => Just(1u64), 3 => 0u64..=8],
        ),
        1..80,
    )
}

/// Replays `steps` on a fresh state; returns every call's time, cost and decision.
fn replay<S: State>(q: &Quota, steps: &[(u64, u64)]) -> Vec<(Nanos, u64, Decision)> {
    let mut state = S::default();
    let mut now = START;
    let mut out = Vec::new();
    for &(advance, cost) in steps {
        now += (q.period().as_nanos() as u64) * advance / 64;
        let cost = if cost <= 1 {
            cost
        } else {
            (q.burst() * cost / 8).max(1)
        };
        out.push((now, cost, state.check(q, cost, now)));
    }
    out
}

fn granted(trace: &[(Nanos, u64, Decision)]) -> Vec<(Nanos, u64)> {
    trace
        .iter()
        .filter(|(_, cost, d)| d.allowed && *cost > 0)
        .map(|&(t, c, _)| (t, c))
        .collect()
}

/// The most units granted within any half-open window `[t, t + span)` starting at a grant.
fn busiest_window(grants: &[(Nanos, u64)], span: Nanos) -> u64 {
    grants
        .iter()
        .map(|&(t, _)| {
            grants
                .iter()
                .filter(|&&(u, _)| u >= t && u < t + span)
                .map(|&(_, c)| c)
                .sum()
        })
        .max()
        .unwrap_or(0)
}

/// Checks, on a state that has seen `trace`, the exactness of `remaining`, `retry_after`
/// and `reset_after` from the last call's point of view.
fn check_exact_answers<S: State>(q: &Quota, steps: &[(u64, u64)]) -> Result<(), TestCaseError> {
    let mut state = S::default();
    let mut now = START;
    for &(advance, cost) in steps {
        now += (q.period().as_nanos() as u64) * advance / 64;
        let cost = if cost <= 1 {
            cost
        } else {
            (q.burst() * cost / 8).max(1)
        };
        let before = state.clone();
        let d = state.check(q, cost, now);
        if d.allowed {
            // `remaining` more fit right now; one more does not.
            let r = d.remaining;
            if r > 0 && r <= q.burst() {
                prop_assert!(
                    state.clone().check(q, r, now).allowed,
                    "remaining {r} should fit"
                );
            }
            if r < q.burst() {
                prop_assert!(
                    !state.clone().check(q, r + 1, now).allowed,
                    "{} should not fit",
                    r + 1
                );
            }
        } else {
            prop_assert_eq!(
                state.clone().check(q, 0, now),
                state.clone().check(q, 0, now)
            );
            // A denial changes nothing observable.
            prop_assert_eq!(
                before.clone().check(q, 0, now),
                state.clone().check(q, 0, now),
                "a denial changed the state"
            );
            let retry = d.retry_after.as_nanos() as Nanos;
            prop_assert!(retry > 0);
            prop_assert!(
                state.clone().check(q, cost, now + retry).allowed,
                "not granted after retry_after {retry}"
            );
            prop_assert!(
                !state.clone().check(q, cost, now + retry - 1).allowed,
                "granted 1 ns before retry_after {retry}"
            );
        }
        // After reset_after, everything is back.
        let reset = d.reset_after.as_nanos() as Nanos;
        let full = state.clone().check(q, 0, now + reset);
        prop_assert_eq!(
            full.remaining,
            q.burst(),
            "not full after reset_after {}",
            reset
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn gcra_grants_at_most_burst_plus_rate_times_t(q in quota(Algorithm::Gcra), s in steps()) {
        let grants = granted(&replay::<Gcra>(&q, &s));
        for (i, &(a, _)) in grants.iter().enumerate() {
            let mut units = 0;
            for &(b, c) in &grants[i..] {
                units += c;
                let bound = q.burst() + (b - a) / (q.emission_interval().as_nanos() as u64);
                prop_assert!(units <= bound, "{units} units in {} ns > {bound}", b - a);
            }
        }
    }

    #[test]
    fn leaky_bucket_decides_exactly_like_gcra(
        q in quota(Algorithm::Gcra),
        s in steps(),
        refunds in prop::collection::vec(0u64..3, 80),
    ) {
        let leaky_q = q.with_algorithm(Algorithm::LeakyBucket).unwrap();
        let (mut gcra, mut leaky) = (Gcra::default(), LeakyBucket::default());
        let mut now = START;
        for (i, &(advance, cost)) in s.iter().enumerate() {
            now += (q.period().as_nanos() as u64) * advance / 64;
            let cost = cost.min(q.burst());
            prop_assert_eq!(gcra.check(&q, cost, now), leaky.check(&leaky_q, cost, now));
            if refunds[i] > 0 {
                gcra.refund(&q, refunds[i], now);
                leaky.refund(&leaky_q, refunds[i], now);
            }
        }
    }

    #[test]
    fn fixed_window_grants_at_most_limit_per_window(q in quota(Algorithm::FixedWindow), s in steps()) {
        let p = q.period().as_nanos() as u64;
        let grants = granted(&replay::<FixedWindow>(&q, &s));
        let mut per_window = std::collections::HashMap::<u64, u64>::new();
        for (t, c) in grants {
            *per_window.entry(t / p).or_default() += c;
        }
        prop_assert!(per_window.values().all(|&n| n <= q.limit()));
    }

    #[test]
    fn sliding_log_never_exceeds_limit_in_any_window(q in quota(Algorithm::SlidingLog), s in steps()) {
        let grants = granted(&replay::<SlidingLog>(&q, &s));
        prop_assert!(busiest_window(&grants, q.period().as_nanos() as u64) <= q.limit());
    }

    #[test]
    fn sliding_window_stays_under_twice_the_limit(q in quota(Algorithm::SlidingWindow), s in steps()) {
        let grants = granted(&replay::<SlidingWindow>(&q, &s));
        prop_assert!(busiest_window(&grants, q.period().as_nanos() as u64) < 2 * q.limit());
    }

    #[test]
    fn answers_are_exact_for_gcra(q in quota(Algorithm::Gcra), s in steps()) {
        check_exact_answers::<Gcra>(&q, &s)?;
    }

    #[test]
    fn answers_are_exact_for_leaky_bucket(q in quota(Algorithm::LeakyBucket), s in steps()) {
        check_exact_answers::<LeakyBucket>(&q, &s)?;
    }

    #[test]
    fn answers_are_exact_for_fixed_window(q in quota(Algorithm::FixedWindow), s in steps()) {
        check_exact_answers::<FixedWindow>(&q, &s)?;
    }

    #[test]
    fn answers_are_exact_for_sliding_window(q in quota(Algorithm::SlidingWindow), s in steps()) {
        check_exact_answers::<SlidingWindow>(&q, &s)?;
    }

    #[test]
    fn answers_are_exact_for_sliding_log(q in quota(Algorithm::SlidingLog), s in steps()) {
        check_exact_answers::<SlidingLog>(&q, &s)?;
    }
}

/// The sliding-window counter's worst case is real: the previous window's whole limit at its
/// last nanosecond, then the current window filled as the estimate allows, puts `2 × limit − 1`
/// units within one period. This is why the bound above is not smaller.
#[test]
fn sliding_window_worst_case_reaches_twice_the_limit_minus_one() {
    let q = Quota::new(10, Duration::from_secs(10))
        .unwrap()
        .with_algorithm(Algorithm::SlidingWindow)
        .unwrap();
    let p = q.period().as_nanos() as u64;
    let mut state = SlidingWindow::default();
    let end_of_window = START + p - 1;
    let mut grants = vec![(end_of_window, 10)];
    assert!(state.check(&q, 10, end_of_window).allowed);
    // Keep taking one unit whenever it fits, until the window starting at the burst closes.
    let mut t = START + p;
    while t < end_of_window + p {
        let d = state.check(&q, 1, t);
        if d.allowed {
            grants.push((t, 1));
        } else {
            t += d.retry_after.as_nanos() as Nanos;
        }
    }
    assert_eq!(busiest_window(&grants, p), 2 * q.limit() - 1);
}

proptest! {
    /// A key whose quota changes (a configuration reload) keeps its state; whatever the old and
    /// new quotas, no transition panics and no grant exceeds the new quota's capacity at once.
    #[test]
    fn a_changed_quota_never_panics(
        algorithm in prop::sample::select(Algorithm::ALL.to_vec()),
        limits in (1u64..=20, 1u64..=20),
        s in steps(),
    ) {
        let old = Quota::per_second(limits.0).with_algorithm(algorithm).unwrap();
        let new = Quota::per_second(limits.1).with_algorithm(algorithm).unwrap();
        fn run<S: State>(old: &Quota, new: &Quota, steps: &[(u64, u64)]) -> Result<(), TestCaseError> {
            let mut state = S::default();
            let mut now = START;
            for (i, &(advance, cost)) in steps.iter().enumerate() {
                now += (old.period().as_nanos() as u64) * advance / 64;
                let q = if i % 2 == 0 { old } else { new };
                let d = state.check(q, cost.min(q.burst()), now);
                prop_assert!(d.remaining <= q.burst());
                state.refund(q, cost % 2, now);
            }
            Ok(())
        }
        match algorithm {
            Algorithm::Gcra => run::<Gcra>(&old, &new, &s)?,
            Algorithm::LeakyBucket => run::<LeakyBucket>(&old, &new, &s)?,
            Algorithm::FixedWindow => run::<FixedWindow>(&old, &new, &s)?,
            Algorithm::SlidingWindow => run::<SlidingWindow>(&old, &new, &s)?,
            Algorithm::SlidingLog => run::<SlidingLog>(&old, &new, &s)?,
            other => panic!("no state type for {other:?}: add it to this test"),
        }
    }
}

// ------------------------------------------------------------------ charges

/// Each algorithm's state, boxed behind one interface for the charge properties.
fn charge_then_probe<S: State>(
    q: &Quota,
    steps: &[(u64, u64)],
    charge: u64,
) -> Result<(), TestCaseError> {
    let mut state = S::default();
    let mut now = START;
    for &(advance, cost) in steps {
        now += (q.period().as_nanos() as u64) * advance / 64;
        let _ = state.check(q, cost.min(q.burst()), now);
    }
    let charged = state.charge(q, charge, now);
    prop_assert!(charged.allowed, "a charge is always taken");
    // Out of debt exactly when the charge said: a peek is allowed then, not a nanosecond before.
    let out = crate_nanos(charged.retry_after);
    if out > 0 {
        prop_assert!(!state.clone().check(q, 0, now + out - 1).allowed);
    }
    prop_assert!(
        state.clone().check(q, 0, now + out).allowed,
        "still in debt after {out} ns"
    );
    // A unit is refused exactly until the retry_after it is told.
    let first = state.clone().check(q, 1, now);
    if !first.allowed {
        let ready = now + crate_nanos(first.retry_after);
        prop_assert!(!state.clone().check(q, 1, ready - 1).allowed);
        prop_assert!(
            state.clone().check(q, 1, ready).allowed,
            "refused at {ready}"
        );
    }
    Ok(())
}

fn crate_nanos(d: Duration) -> Nanos {
    d.as_nanos() as Nanos
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// A charge on a fresh bucket is repaid at exactly the refill rate: `c` units at `t0` leave
    /// the key refused until `t0 + c·T + T − τ` (one unit fits again), through the memory store
    /// with an injected clock.
    #[test]
    fn a_bucket_charge_is_repaid_at_exactly_the_refill_rate(
        q in prop_oneof![quota(Algorithm::Gcra), quota(Algorithm::LeakyBucket)],
        times_burst in 0u64..=5,
        extra in 0u64..=40,
    ) {
        use flowgate::clock::ManualClock;
        use flowgate::store::{Ask, MemoryStore, Store};
        let clock = ManualClock::new(START);
        let store = MemoryStore::builder().clock(clock.clone()).build();
        let charge = q.burst() * times_burst + extra;
        let t = q.emission_interval().as_nanos() as Nanos;
        let tau = q.burst() * t;
        let charged = store
            .check_now(Ask::new("k", &q).cost(charge).charge(true))
            .unwrap()
            .unwrap();
        prop_assert!(charged.allowed);
        prop_assert_eq!(crate_nanos(charged.retry_after), (charge * t).saturating_sub(tau));
        prop_assert_eq!(crate_nanos(charged.reset_after), charge * t);
        if charge >= q.burst() {
            prop_assert_eq!(charged.remaining, 0);
        }
        let ready = START + (charge * t + t).saturating_sub(tau);
        if ready > START {
            clock.set(ready - 1);
            let refused = store.check_now(Ask::new("k", &q)).unwrap().unwrap();
            prop_assert!(!refused.allowed);
            prop_assert_eq!(refused.retry_after, Duration::from_nanos(1));
        }
        clock.set(ready);
        prop_assert!(store.check_now(Ask::new("k", &q)).unwrap().unwrap().allowed);
    }

    #[test]
    fn charges_are_refused_exactly_until_repaid_for_gcra(q in quota(Algorithm::Gcra), s in steps(), c in 0u64..100) {
        charge_then_probe::<Gcra>(&q, &s, c)?;
    }

    #[test]
    fn charges_are_refused_exactly_until_repaid_for_leaky_bucket(q in quota(Algorithm::LeakyBucket), s in steps(), c in 0u64..100) {
        charge_then_probe::<LeakyBucket>(&q, &s, c)?;
    }

    #[test]
    fn charges_are_refused_exactly_until_repaid_for_fixed_window(q in quota(Algorithm::FixedWindow), s in steps(), c in 0u64..100) {
        charge_then_probe::<FixedWindow>(&q, &s, c)?;
    }

    #[test]
    fn charges_are_refused_exactly_until_repaid_for_sliding_window(q in quota(Algorithm::SlidingWindow), s in steps(), c in 0u64..100) {
        charge_then_probe::<SlidingWindow>(&q, &s, c)?;
    }

    #[test]
    fn charges_are_refused_exactly_until_repaid_for_sliding_log(q in quota(Algorithm::SlidingLog), s in steps(), c in 0u64..100) {
        charge_then_probe::<SlidingLog>(&q, &s, c)?;
    }
}

/// Absurd charges saturate at the documented caps instead of overflowing.
#[test]
fn absurd_charges_stop_at_the_caps() {
    use flowgate::algorithm::{MAX_CHARGE, MAX_DEBT};
    let q = Quota::per_minute(1000);
    let mut gcra = Gcra::default();
    let d = gcra.charge(&q, u64::MAX, START);
    assert!(d.allowed);
    assert_eq!(
        d.reset_after,
        Duration::from_secs(60) + Duration::from_nanos(MAX_DEBT)
    );
    let d = gcra.charge(&q, u64::MAX, START);
    assert_eq!(
        d.reset_after,
        Duration::from_secs(60) + Duration::from_nanos(MAX_DEBT)
    );
    let fq = q.with_algorithm(Algorithm::FixedWindow).unwrap();
    let mut fixed = FixedWindow::default();
    for _ in 0..3 {
        assert!(fixed.charge(&fq, u64::MAX, START).allowed);
    }
    assert!(!fixed.check(&fq, 0, START).allowed);
    let sq = q.with_algorithm(Algorithm::SlidingWindow).unwrap();
    let mut sliding = SlidingWindow::default();
    for _ in 0..3 {
        assert!(sliding.charge(&sq, MAX_CHARGE, START).allowed);
    }
    let lq = q.with_algorithm(Algorithm::SlidingLog).unwrap();
    let mut log = SlidingLog::default();
    assert_eq!(log.charge(&lq, u64::MAX, START).remaining, 0);
    assert_eq!(log.total(), 1000, "the log keeps at most `limit` units");
}
