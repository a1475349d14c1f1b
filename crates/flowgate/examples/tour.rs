//! The README tour's library in ten lines: `cargo run -p flowgate --example tour`.
#![allow(clippy::print_stdout)]

use flowgate::{KeyedRateLimiter, Quota};

fn main() {
    // 3 requests per second per client, bursts of 3 (GCRA, the default algorithm).
    let limiter = KeyedRateLimiter::<String>::new(Quota::per_second(3));
    for i in 1..=5 {
        let decision = limiter.check_key("client-7");
        println!(
            "request {i}: allowed={} remaining={} retry_after={:?}",
            decision.allowed, decision.remaining, decision.retry_after
        );
    }
}
