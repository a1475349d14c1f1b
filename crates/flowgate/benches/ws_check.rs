//! The per-message decision cost of `ws::Session::check`, against Centrifugo PRO's published
//! ~50 ns per bucket / ~130 ns per layer.
//!
//! `cargo bench -p flowgate --features ws --bench ws_check`
//!
//! Every message is allowed (quotas far above what one thread sends), so every configured
//! layer is asked each time:
//!
//! * `none`: a session with no layer (the fixed cost: size accounting, cost lookup);
//! * `connection`: messages per connection (one in-memory bucket);
//! * `store`: user, room and slowmode in a `MemoryStore` (three keyed buckets, checked
//!   together so that a later denial gives the earlier units back);
//! * `all`: every in-memory layer — size, messages per connection, the flood multiple,
//!   bytes, user, room, slowmode — plus costs by type and the close ladder. Seven layers.
//!
//! The store is in memory and the future completes without waiting, so it is polled once
//! with a no-op waker: no runtime is timed.

#![allow(clippy::unwrap_used, clippy::expect_used)] // setup failures in a benchmark may panic

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use flowgate::Quota;
use flowgate::store::MemoryStore;
use flowgate::ws::{Action, Client, MessageInfo, WsLimiter};

/// Polls a future that completes without waiting.
fn now<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("an in-memory check waited"),
    }
}

fn huge() -> Quota {
    Quota::per_second(1_000_000_000)
}

fn check(c: &mut Criterion) {
    let mut group = c.benchmark_group("ws_check");
    group.throughput(Throughput::Elements(1));
    let cases: [(&str, WsLimiter); 4] = [
        ("none", WsLimiter::builder().build().unwrap()),
        (
            "connection",
            WsLimiter::builder().messages(huge()).build().unwrap(),
        ),
        (
            "store",
            WsLimiter::builder()
                .user_messages(huge())
                .room_messages(huge())
                .slowmode(Duration::from_nanos(1))
                .build()
                .unwrap(),
        ),
        (
            "all",
            WsLimiter::builder()
                .max_message_size(64 * 1024)
                .messages(huge())
                .close_at_multiple(20)
                .bytes(huge())
                .user_messages(huge())
                .room_messages(huge())
                .slowmode(Duration::from_nanos(1))
                .cost("subscribe", 5)
                .cost("ping", 0)
                .release("unsubscribe")
                .close_after(3, Duration::from_secs(10))
                .build()
                .unwrap(),
        ),
    ];
    for (name, limiter) in cases {
        let store = MemoryStore::new();
        let mut session = limiter
            .admit(Client::new("192.0.2.1").user("ann").room("lobby"))
            .unwrap();
        let message = MessageInfo::new(64).kind("chat");
        assert_eq!(now(session.check(&store, &message)), Action::Forward);
        group.bench_function(name, |b| {
            b.iter(|| black_box(now(session.check(&store, black_box(&message)))))
        });
    }
    group.finish();
}

criterion_group!(benches, check);
criterion_main!(benches);
