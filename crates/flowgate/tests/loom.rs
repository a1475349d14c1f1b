//! Model checking of the lock-free GCRA cell with loom: every interleaving of the
//! compare-and-swap loop (the very function `WordCell` uses, run on loom's atomics) grants
//! exactly what a sequential run would, and loses no update.
#![allow(clippy::unwrap_used)]

use flowgate::Quota;
use flowgate::clock::Nanos;
use flowgate::local::__private::{MODEL_GCRA_FRESH, model_gcra_check};
use loom::sync::Arc;
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::thread;

const NOW: Nanos = 1_700_006_400_000_000_000;
const MARK: u64 = MODEL_GCRA_FRESH;

fn acquire(word: &AtomicU64, quota: &Quota, cost: u64, now: Nanos) -> bool {
    model_gcra_check(
        word.load(Ordering::Acquire),
        |current, next| {
            word.compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire)
                .map(drop)
        },
        quota,
        cost,
        now,
    )
    .allowed
}

#[test]
fn three_threads_never_get_more_than_the_burst_and_lose_no_update() {
    // Bounding preemptions keeps the exploration to seconds; loom's documentation notes that
    // most concurrency bugs need only two or three preemptions to show.
    let mut model = loom::model::Builder::new();
    model.preemption_bound = Some(3);
    model.check(|| {
        let quota = Quota::per_hour(1).with_burst(2).unwrap();
        let word = Arc::new(AtomicU64::new(MARK));
        let handles: Vec<_> = (0..3)
            .map(|_| {
                let word = word.clone();
                thread::spawn(move || acquire(&word, &quota, 1, NOW))
            })
            .collect();
        let granted = handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .filter(|&g| g)
            .count() as u64;
        assert_eq!(granted, 2);
        let tat = word.load(Ordering::Acquire) & !MARK;
        assert_eq!(
            tat,
            NOW + granted * (quota.emission_interval().as_nanos() as u64)
        );
    });
}

#[test]
fn weighted_costs_at_different_times_match_a_sequential_order() {
    loom::model(|| {
        // 1 unit per second, burst 3: `a` takes 2 at t0, `b` takes 2 at t0 + 1 s. In that order
        // both fit; the other way round `a` finds 3 s of debt and is denied.
        let quota = Quota::per_second(1).with_burst(3).unwrap();
        let word = Arc::new(AtomicU64::new(MARK));
        let a = {
            let word = word.clone();
            thread::spawn(move || acquire(&word, &quota, 2, NOW))
        };
        let b = {
            let word = word.clone();
            thread::spawn(move || acquire(&word, &quota, 2, NOW + 1_000_000_000))
        };
        let (a, b) = (a.join().unwrap(), b.join().unwrap());
        let tat = word.load(Ordering::Acquire) & !MARK;
        // Whatever the order, the result is one of the sequential outcomes.
        let second = 1_000_000_000;
        let a_then_b = (true, true, NOW + 4 * second); // b at +1 s: debt 1 s + 2 s = 3 s ≤ τ
        let b_then_a = (false, true, NOW + 3 * second); // a at t0 sees 3 s of debt ahead
        assert!(
            (a, b, tat) == a_then_b || (a, b, tat) == b_then_a,
            "a={a} b={b} tat={tat}"
        );
    });
}
