//! The layer decides a single limit in a store that answers at once (the memory store) in
//! `call`, without a future; every other request goes through the store's futures. Both paths
//! must answer alike: the same requests, in the same order, at the same times, get the same
//! status, headers, body and counters whichever path decided them.
#![cfg(feature = "tower")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use flowgate::clock::ManualClock;
use flowgate::http::key::{Global, Header, PeerAddr, PeerIp};
use flowgate::http::{Limit, Limits, RateLimitLayer, StatsSnapshot};
use flowgate::store::{Ask, MemoryStore, Store, StoreError};
use flowgate::{Algorithm, Decision, Quota};
use http::{HeaderMap, HeaderName, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use proptest::prelude::*;
use tower::{Layer, ServiceExt, service_fn};

/// A real memory store whose answers arrive one poll late (as a networked store's would): it
/// never answers at once, so the layer takes its asynchronous path, including the wait.
struct OnePollLate(MemoryStore<ManualClock>);

impl Store for OnePollLate {
    async fn check(&self, ask: Ask<'_>) -> Result<Decision, StoreError> {
        tokio::task::yield_now().await;
        self.0.check(ask).await
    }
    async fn refund(&self, ask: Ask<'_>) -> Result<(), StoreError> {
        tokio::task::yield_now().await;
        self.0.refund(ask).await
    }
    async fn reset(&self, ask: Ask<'_>) -> Result<(), StoreError> {
        self.0.reset(ask).await
    }
}

/// One request of a trace: time passes, then a client asks.
#[derive(Debug, Clone)]
struct Step {
    advance_ms: u64,
    peer: u8,
    plan: Option<&'static str>,
    api_key: bool,
    grpc: bool,
}

fn step() -> impl Strategy<Value = Step> {
    (
        0u64..900,
        0u8..3,
        proptest::option::of(proptest::sample::select(vec!["free", "pro", "gold"])),
        proptest::bool::weighted(0.9),
        proptest::bool::weighted(0.2),
    )
        .prop_map(|(advance_ms, peer, plan, api_key, grpc)| Step {
            advance_ms,
            peer,
            plan,
            api_key,
            grpc,
        })
}

fn request(step: &Step) -> Request<Full<Bytes>> {
    let mut request = Request::get("/");
    if let Some(plan) = step.plan {
        request = request.header("x-plan", plan);
    }
    if step.api_key {
        request = request.header("x-api-key", "k-1");
    }
    if step.grpc {
        request = request.header("content-type", "application/grpc");
    }
    let mut request = request.body(Full::new(Bytes::new())).unwrap();
    let peer = format!("192.0.2.{}:4000", step.peer);
    request
        .extensions_mut()
        .insert(PeerAddr(peer.parse().unwrap()));
    request
}

/// What a client sees of a response.
#[derive(Debug, PartialEq)]
struct Seen {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

/// Runs `steps` through a layer over `store` (one service call per step) and returns what each
/// response looked like, and the layer's counters.
fn run<St: Store + 'static>(
    store: St,
    clock: &ManualClock,
    policy: Limits,
    legacy: bool,
    steps: &[Step],
) -> (Vec<Seen>, StatsSnapshot) {
    let layer = RateLimitLayer::builder(store, policy)
        .legacy_headers(legacy)
        .build()
        .unwrap();
    let service = layer.layer(service_fn(|_: Request<Full<Bytes>>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
    }));
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let seen = steps
        .iter()
        .map(|step| {
            clock.advance(Duration::from_millis(step.advance_ms));
            rt.block_on(async {
                let response = service.clone().oneshot(request(step)).await.unwrap();
                let (parts, body) = response.into_parts();
                Seen {
                    status: parts.status,
                    headers: parts.headers,
                    body: body.collect().await.unwrap().to_bytes(),
                }
            })
        })
        .collect();
    (seen, layer.stats().snapshot())
}

/// The policies both paths are compared on: all but the last have a single limit.
const POLICIES: [&str; 6] = [
    "per-ip",
    "tiered, unknown tiers skipped",
    "tiered, unknown tiers otherwise",
    "shadow",
    "cost 2",
    "two limits",
];

/// Limits `kind`, its quotas built by `quota(limit)`.
fn policy(kind: &str, quota: impl Fn(u64) -> Quota, limit: u64) -> Limits {
    let (base, more) = (quota(limit), quota(limit * 2));
    let one = |limit| Limits::new().limit(limit);
    match kind {
        "per-ip" => one(Limit::new("per-ip", PeerIp::new(), base)),
        "tiered, unknown tiers skipped" => one(Limit::tiered("per-key", api_key(), plan())
            .tier("free", base)
            .tier("pro", more)),
        "tiered, unknown tiers otherwise" => one(Limit::tiered("per-key", api_key(), plan())
            .tier("pro", more)
            .otherwise(base)),
        "shadow" => one(Limit::new("shadow", PeerIp::new(), base).shadow(true)),
        "cost 2" => one(Limit::new("heavy", Global::default(), quota(4)).cost(2)),
        "two limits" => Limits::new()
            .limit(Limit::new("per-ip", PeerIp::new(), base))
            .limit(Limit::new("all", Global::default(), quota(5))),
        _ => unreachable!("no policy {kind}"),
    }
}

fn api_key() -> Header {
    Header::new(HeaderName::from_static("x-api-key"))
}

fn plan() -> Header {
    Header::new(HeaderName::from_static("x-plan"))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn deciding_at_once_answers_exactly_like_waiting_for_the_store(
        algorithm in proptest::sample::select(Algorithm::ALL.to_vec()),
        limit in 1u64..5,
        legacy in any::<bool>(),
        steps in proptest::collection::vec(step(), 1..40),
    ) {
        let quota = |limit| {
            Quota::new(limit, Duration::from_secs(2))
                .unwrap()
                .with_algorithm(algorithm)
                .unwrap()
        };
        for kind in POLICIES {
            let start = 1_700_000_000_000_000_000;
            let (now, later) = (ManualClock::new(start), ManualClock::new(start));
            let at_once = MemoryStore::builder().clock(now.clone()).build();
            let waiting = OnePollLate(MemoryStore::builder().clock(later.clone()).build());
            let (seen_now, stats_now) =
                run(at_once, &now, policy(kind, quota, limit), legacy, &steps);
            let (seen_later, stats_later) =
                run(waiting, &later, policy(kind, quota, limit), legacy, &steps);
            for (i, (a, b)) in seen_now.iter().zip(&seen_later).enumerate() {
                prop_assert_eq!(a, b, "{}: step {} ({:?})", kind, i, &steps[i]);
            }
            prop_assert_eq!(stats_now, stats_later, "{}", kind);
        }
    }
}

#[test]
fn the_traces_reach_denials_rejections_and_passes() {
    // One fixed trace on the path that decides at once, to show that the comparison above
    // covers every kind of answer.
    let quota = Quota::new(2, Duration::from_secs(2)).unwrap();
    let step = |advance_ms, api_key, grpc| Step {
        advance_ms,
        peer: 1,
        plan: Some("free"),
        api_key,
        grpc,
    };
    let steps = [
        step(0, true, false),
        step(0, true, false),
        step(0, true, false),
        step(0, true, true),
        step(0, false, false),
        step(1_500, true, false),
    ];
    let clock = ManualClock::new(1_700_000_000_000_000_000);
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let policy = policy("tiered, unknown tiers skipped", |_| quota, 2);
    let (seen, stats) = run(store, &clock, policy, true, &steps);
    let statuses: Vec<u16> = seen.iter().map(|s| s.status.as_u16()).collect();
    // gRPC refusals are HTTP 200 with a grpc-status.
    assert_eq!(statuses, [200, 200, 429, 200, 401, 200]);
    assert_eq!(seen[3].headers["grpc-status"], "8");
    assert_eq!(seen[2].headers["ratelimit"], r#""per-key";r=0;t=1"#);
    assert_eq!(seen[2].headers["x-ratelimit-remaining"], "0");
    assert_eq!(
        stats,
        StatsSnapshot {
            allowed: 3,
            limited: 2,
            rejected: 1,
            ..StatsSnapshot::default()
        }
    );
}
