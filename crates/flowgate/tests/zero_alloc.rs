//! Proof that a check allocates nothing once its key exists: a counting global allocator
//! counts the allocations made by this thread while checks run.
#![allow(clippy::unwrap_used)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use flowgate::clock::ManualClock;
use flowgate::local::{KeyedRateLimiter, RateLimiter};
use flowgate::store::{Ask, MemoryStore, Store};
use flowgate::{Algorithm, Quota};

/// Counts allocations of the current thread while `COUNTING` is set.
struct CountingAllocator;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

#[allow(unsafe_code)]
// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCATIONS.with(|n| n.set(n.get() + 1));
        }
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCATIONS.with(|n| n.set(n.get() + 1));
        }
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// How many allocations `f` makes on this thread.
fn allocations(f: impl FnOnce()) -> u64 {
    ALLOCATIONS.with(|n| n.set(0));
    COUNTING.with(|c| c.set(true));
    f();
    COUNTING.with(|c| c.set(false));
    ALLOCATIONS.with(Cell::get)
}

const START: u64 = 1_700_006_400_000_000_000;

fn quota(algorithm: Algorithm) -> Quota {
    Quota::per_second(50).with_algorithm(algorithm).unwrap()
}

#[test]
fn the_counter_counts() {
    assert_eq!(allocations(|| drop(vec![1u8; 16])), 1);
}

#[test]
fn direct_checks_allocate_nothing() {
    for algorithm in Algorithm::ALL {
        let clock = ManualClock::new(START);
        let limiter = RateLimiter::with_clock(quota(algorithm), clock.clone());
        // Warm up: let the sliding log grow its buffer to its steady size.
        for _ in 0..200 {
            let _ = limiter.check();
            clock.advance(std::time::Duration::from_millis(7));
        }
        let n = allocations(|| {
            for _ in 0..10_000 {
                let _ = std::hint::black_box(limiter.check());
                clock.advance(std::time::Duration::from_millis(7));
            }
        });
        assert_eq!(n, 0, "{algorithm}");
    }
}

#[test]
fn keyed_checks_on_existing_keys_allocate_nothing() {
    for algorithm in Algorithm::ALL {
        let clock = ManualClock::new(START);
        let limiter = KeyedRateLimiter::<u64>::builder(quota(algorithm))
            .clock(clock.clone())
            .build();
        for round in 0..200u64 {
            for key in 0..1000u64 {
                let _ = limiter.check_key(&key);
            }
            clock.advance(std::time::Duration::from_millis(7 + round % 3));
        }
        let n = allocations(|| {
            for i in 0..100_000u64 {
                let _ = std::hint::black_box(limiter.check_key(&(i % 1000)));
                if i % 1000 == 0 {
                    clock.advance(std::time::Duration::from_millis(7));
                }
            }
        });
        assert_eq!(n, 0, "{algorithm}");
    }
}

#[test]
fn memory_store_checks_on_existing_keys_allocate_nothing() {
    for algorithm in Algorithm::ALL {
        let clock = ManualClock::new(START);
        let store = MemoryStore::builder().clock(clock.clone()).build();
        let keys: Vec<String> = (0..100).map(|k| format!("user:{k}")).collect();
        let q = quota(algorithm);
        for _ in 0..200 {
            for key in &keys {
                let _ = store
                    .check_now(Ask::new(key, &q))
                    .expect("in memory")
                    .unwrap();
            }
            clock.advance(std::time::Duration::from_millis(7));
        }
        let n = allocations(|| {
            for i in 0..10_000 {
                let _ = std::hint::black_box(
                    store
                        .check_now(Ask::new(&keys[i % 100], &q))
                        .expect("in memory")
                        .unwrap(),
                );
                if i % 100 == 0 {
                    clock.advance(std::time::Duration::from_millis(7));
                }
            }
        });
        assert_eq!(n, 0, "{algorithm}");
    }
}

/// The HTTP rate-limit layer on its fast path (one limit, in the memory store): deciding a
/// passing request and adding its fields allocates once, for the `RateLimit` value the response
/// keeps — no boxed future, key string or list.
#[cfg(feature = "tower")]
#[test]
fn the_http_layer_allocates_only_the_ratelimit_value() {
    use std::future::Future;
    use std::sync::{Arc, Mutex};
    use std::task::{Context, Poll, Waker};

    use flowgate::http::key::{PeerAddr, PeerIp};
    use flowgate::http::{Limit, Limits, RateLimitLayer};
    use http::{HeaderMap, Request, Response};
    use tower::{Layer, Service, service_fn};

    const REQUESTS: usize = 1_000;
    const WARM_UP: usize = 10;
    let clock = ManualClock::new(START);
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let quota = Quota::per_second(1_000_000);
    let policy = Limits::new().limit(Limit::new("per-ip", PeerIp::new(), quota));
    // The inner service hands out responses made beforehand, with room for the fields, so that
    // only the layer's allocations are counted.
    let responses: Vec<Response<()>> = (0..REQUESTS + WARM_UP)
        .map(|_| {
            let mut response = Response::new(());
            *response.headers_mut() = HeaderMap::with_capacity(8);
            response
        })
        .collect();
    let responses = Arc::new(Mutex::new(responses));
    let inner = service_fn(move |_: Request<()>| {
        let response = responses.lock().unwrap().pop().unwrap();
        std::future::ready(Ok::<_, std::convert::Infallible>(response))
    });
    let mut service = RateLimitLayer::new(store, policy).unwrap().layer(inner);
    let requests: Vec<Request<()>> = (0..REQUESTS + WARM_UP)
        .map(|i| {
            let mut request = Request::new(());
            let peer = format!("192.0.2.{}:4000", i % 3);
            request
                .extensions_mut()
                .insert(PeerAddr(peer.parse().unwrap()));
            request
        })
        .collect();
    let mut cx = Context::from_waker(Waker::noop());
    let mut send = |request| {
        assert!(service.poll_ready(&mut cx).is_ready());
        let mut future = std::pin::pin!(service.call(request));
        let Poll::Ready(Ok(response)) = future.as_mut().poll(&mut cx) else {
            panic!("the memory store answers at once");
        };
        assert_eq!(
            response.headers()["ratelimit-policy"],
            r#""per-ip";q=1000000;w=1"#
        );
        response
    };
    let mut requests = requests.into_iter();
    for request in requests.by_ref().take(WARM_UP) {
        drop(send(request));
    }
    let mut kept = Vec::with_capacity(REQUESTS);
    let n = allocations(|| {
        for request in requests {
            kept.push(send(request));
        }
    });
    assert_eq!(n, REQUESTS as u64);
}

/// A descriptor matched to a rule with one limit costs `envoy::check` its two vectors (the
/// resolved limits and the verdict) and nothing per limit: the key is written in a reused
/// buffer. Several limits on a rule change nothing for rules with one.
#[cfg(feature = "envoy")]
#[test]
fn an_envoy_check_of_a_one_limit_rule_allocates_only_its_two_vectors() {
    use flowgate::envoy::{Descriptor, DomainSpec, Entry, LimitSpec, Rate, RuleSet, RuleSpec};
    use std::future::Future;
    use std::task::{Context, Poll, Waker};

    let limit = |n| LimitSpec::new(Rate::Limited(quota(Algorithm::Gcra).with_burst(n).unwrap()));
    let rules = RuleSet::build(vec![DomainSpec::new(
        "d",
        vec![
            RuleSpec::new("one").with_limit(limit(50)),
            RuleSpec::new("two")
                .with_limit(limit(50))
                .with_limit(LimitSpec::new(Rate::Limited(Quota::per_minute(1000)))),
        ],
    )])
    .unwrap();
    let store = MemoryStore::builder()
        .clock(ManualClock::new(START))
        .build();
    let request = [Descriptor::new(vec![Entry::new("one", "v")])];
    let check = || {
        let mut future = std::pin::pin!(flowgate::envoy::check(&rules, &store, "d", &request, 1));
        let Poll::Ready(verdict) = future
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
        else {
            panic!("the memory store answers at once");
        };
        assert!(verdict.allowed);
    };
    check();
    assert_eq!(allocations(check), 2);
    // Two limits: still decided at once, at the cost of their keys and the grouping.
    let two = [Descriptor::new(vec![Entry::new("two", "v")])];
    let mut future = std::pin::pin!(flowgate::envoy::check(&rules, &store, "d", &two, 1));
    let polled = future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()));
    assert!(matches!(polled, Poll::Ready(v) if v.allowed && v.descriptors[0].others.len() == 1));
}
