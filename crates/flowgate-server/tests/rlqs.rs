//! The RLQS service (`StreamRateLimitQuotas`) over real gRPC streams on loopback, on a manual
//! clock with ticks run by hand: assignments from the rules, blanket and unmatched buckets,
//! abandonment, the drain (time to live 0, `UNAVAILABLE`), `ShouldRateLimit` beside it on the
//! same listener — and every kind of malformed or hostile stream getting a clear status,
//! bounded, and counted.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use flowgate::clock::{Clock, ManualClock, Nanos};
use flowgate::rlqs::client::{BucketSettings, Phase, Strategy, TokenBucket};
use flowgate_server::rlqs::bucket::read_action;
use flowgate_server::rlqs::client::{Envoy, bucket};
use flowgate_server::rlqs::{ManualTicks, RlqsOptions};
use flowgate_server::server::ServerConfig;
use flowgate_testing::server::TestServer;
use tokio::sync::mpsc;
use tonic::Streaming;

const S: Nanos = 1_000_000_000;
const START: Nanos = 1_800_000_000 * S;

const POLICY: &str = "domain: edge
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: free
    rate_limit: {unlimited: true}
  - key: banned
    rate_limit: {unit: second, requests_per_unit: 0}
rlqs:
  report_interval: 1s
  assignment_ttl: 3s
  abandon_after: 5s
";

/// A server of `files` whose RLQS service runs on `clock` and ticks when told.
async fn start(files: &[(&str, &str)], clock: &ManualClock, ticks: &ManualTicks) -> TestServer {
    start_with(files, clock, ticks, |_| {}).await
}

async fn start_with(
    files: &[(&str, &str)],
    clock: &ManualClock,
    ticks: &ManualTicks,
    tweak: impl FnOnce(&mut ServerConfig),
) -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    let mut paths = Vec::new();
    for (name, text) in files {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        paths.push(path);
    }
    let mut config = ServerConfig::load(paths.clone()).unwrap();
    config.rlqs = RlqsOptions {
        clock: Some(Arc::new(clock.clone())),
        ticks: Some(ticks.clone()),
        ..RlqsOptions::default()
    };
    tweak(&mut config);
    TestServer::start_with(config, dir, paths).await
}

fn target(server: &TestServer) -> Vec<String> {
    vec![format!("http://{}", server.grpc)]
}

/// A raw stream: what to send, and what comes back.
async fn raw(
    server: &TestServer,
) -> (
    mpsc::Sender<RateLimitQuotaUsageReports>,
    Streaming<RateLimitQuotaResponse>,
) {
    let mut client = RateLimitQuotaServiceClient::connect(format!("http://{}", server.grpc))
        .await
        .unwrap();
    let (tx, rx) = mpsc::channel(64);
    let outbound =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
    let inbound = client
        .stream_rate_limit_quotas(outbound)
        .await
        .unwrap()
        .into_inner();
    (tx, inbound)
}

fn id(pairs: &[(&str, &str)]) -> BucketId {
    BucketId {
        bucket: pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    }
}

fn usage(pairs: &[(&str, &str)], allowed: u64, denied: u64) -> BucketQuotaUsage {
    BucketQuotaUsage {
        bucket_id: Some(id(pairs)),
        time_elapsed: None,
        num_requests_allowed: allowed,
        num_requests_denied: denied,
    }
}

fn report(domain: &str, usages: Vec<BucketQuotaUsage>) -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports {
        domain: domain.to_owned(),
        bucket_quota_usages: usages,
    }
}

/// The next message, within 10 s of real time (a wait, not a timing assertion).
async fn next(
    inbound: &mut Streaming<RateLimitQuotaResponse>,
) -> Result<Option<RateLimitQuotaResponse>, tonic::Status> {
    tokio::time::timeout(Duration::from_secs(10), inbound.message())
        .await
        .expect("the server answers within 10 s")
}

/// The status a stream ends with, skipping messages before it.
async fn ending(inbound: &mut Streaming<RateLimitQuotaResponse>) -> tonic::Status {
    loop {
        match next(inbound).await {
            Ok(Some(_)) => continue,
            Ok(None) => return tonic::Status::ok(""),
            Err(status) => return status,
        }
    }
}

/// What a message assigns, by bucket (the strategy and time to live; `None`: abandon).
fn actions(
    message: &RateLimitQuotaResponse,
) -> HashMap<String, Option<(Strategy, Option<Duration>)>> {
    message
        .bucket_action
        .iter()
        .map(|a| {
            let (what, key) = read_action(a).unwrap();
            let name = key
                .iter()
                .map(|e| format!("{}={}", e.key, e.value))
                .collect::<Vec<_>>()
                .join(",");
            (name, what)
        })
        .collect()
}

fn token_bucket(max: u64, per_second: u64) -> Strategy {
    Strategy::TokenBucket(TokenBucket {
        max_tokens: max,
        tokens_per_fill: per_second,
        fill_interval: Duration::from_secs(1),
    })
}

#[tokio::test]
async fn an_envoy_gets_the_rules_limit_blanket_rules_and_abandonment() {
    let clock = ManualClock::new(START);
    let ticks = ManualTicks::new();
    let server = start(&[("edge.yaml", POLICY)], &clock, &ticks).await;
    let (tx, mut inbound) = raw(&server).await;

    // First report: the tenant's bucket claims a first share (nobody holds any: a quarter of
    // the 103 a division could hand out), the others are blanket rules, a bucket no rule
    // matches is allowed (the default).
    tx.send(report(
        "edge",
        vec![
            usage(&[("tenant", "t1")], 1, 0),
            usage(&[("free", "x")], 1, 0),
            usage(&[("banned", "y")], 1, 0),
            usage(&[("path", "/nothing")], 1, 0),
        ],
    ))
    .await
    .unwrap();
    let first = next(&mut inbound).await.unwrap().unwrap();
    let got = actions(&first);
    let ttl = Some(Duration::from_secs(3));
    assert_eq!(got["tenant=t1"], Some((token_bucket(1, 25), ttl)));
    assert_eq!(got["free=x"], Some((Strategy::AllowAll, ttl)));
    assert_eq!(got["banned=y"], Some((Strategy::DenyAll, ttl)));
    assert_eq!(got["path=/nothing"], Some((Strategy::AllowAll, ttl)));

    // Each tick refreshes every assignment.
    clock.advance(Duration::from_secs(1));
    tx.send(report(
        "",
        vec![
            usage(&[("tenant", "t1")], 80, 0),
            usage(&[("free", "x")], 5, 0),
            usage(&[("banned", "y")], 0, 5),
            usage(&[("path", "/nothing")], 1, 0),
        ],
    ))
    .await
    .unwrap();
    flowgate_testing::server::wait_metric(&server, "flowgate_rlqs_reports_total", 8.0).await;
    assert!(ticks.tick().await);
    let refreshed = actions(&next(&mut inbound).await.unwrap().unwrap());
    assert_eq!(refreshed.len(), 4);
    assert_eq!(refreshed["tenant=t1"], Some((token_bucket(1, 25), ttl)));

    // Buckets that report nothing for `abandon_after` (5 s) are abandoned. Each report is
    // taken at the server's time when it arrives: wait for it before moving the clock.
    for step in 0..6 {
        clock.advance(Duration::from_secs(1));
        tx.send(report(
            "edge",
            vec![
                usage(&[("tenant", "t1")], 10, 0),
                usage(&[("free", "x")], 0, 0),
                usage(&[("banned", "y")], 0, 0),
                usage(&[("path", "/nothing")], 0, 0),
            ],
        ))
        .await
        .unwrap();
        flowgate_testing::server::wait_metric(
            &server,
            "flowgate_rlqs_reports_total",
            12.0 + 4.0 * f64::from(step),
        )
        .await;
        if step < 5 {
            assert!(ticks.tick().await);
            let message = actions(&next(&mut inbound).await.unwrap().unwrap());
            // From the second tick on, the whole limit.
            assert_eq!(
                message["tenant=t1"],
                Some((token_bucket(2, 100), ttl)),
                "{step}"
            );
        }
    }
    assert!(ticks.tick().await);
    let later = actions(&next(&mut inbound).await.unwrap().unwrap());
    assert_eq!(later["free=x"], None);
    assert_eq!(later["banned=y"], None);
    assert_eq!(later["path=/nothing"], None);
    assert!(later["tenant=t1"].is_some());
    assert_eq!(server.metric("flowgate_rlqs_buckets").await, 1.0);
    assert_eq!(server.metric("flowgate_rlqs_streams").await, 1.0);
    assert_eq!(
        server
            .metric("flowgate_rlqs_assignments_total{action=\"abandon\"}")
            .await,
        3.0
    );
    assert_eq!(
        server
            .metric("flowgate_rlqs_share_tokens{domain=\"edge\",rule=\"tenant\"}")
            .await,
        100.0
    );
    assert_eq!(
        server
            .metric("flowgate_rlqs_reported_requests_total{decision=\"denied\"}")
            .await,
        5.0
    );

    // The dashboard shows the stream and the shares.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let view = server.get("/dashboard/snapshot").await.json();
        let rlqs = &view["rlqs"];
        if rlqs["streams"] == 1 && rlqs["rules"][0]["tokens"] == 100 {
            assert_eq!(rlqs["rules"][0]["rule"], "tenant");
            assert_eq!(rlqs["rules"][0]["members"], 1);
            assert_eq!(rlqs["buckets"], 1);
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{rlqs}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // ShouldRateLimit still answers on the same listener.
    let mut rls = server.rls().await;
    let answer = flowgate_testing::grpc::should(
        &mut rls,
        flowgate_testing::grpc::request(
            "edge",
            vec![flowgate_testing::grpc::descriptor(&[("tenant", "t9")])],
        ),
    )
    .await;
    assert_eq!(answer.overall_code, flowgate_testing::grpc::OK);
    server.stop().await;
}

#[tokio::test]
async fn the_simulated_envoy_enforces_what_it_is_assigned() {
    let clock = ManualClock::new(START);
    let ticks = ManualTicks::new();
    let server = start(&[("edge.yaml", POLICY)], &clock, &ticks).await;
    let mut envoy = Envoy::new("edge", &target(&server), BucketSettings::default()).unwrap();
    let t1 = bucket(&[("tenant", "t1")]);
    // No assignment yet: allowed (Envoy's default), reported at once, then assigned.
    assert!(envoy.request(&t1, clock.now()));
    envoy.flush().await;
    assert!(envoy.receive_one(clock.now()).await);
    assert_eq!(
        envoy.phase(&t1, clock.now()),
        Some(Phase::Active(token_bucket(1, 25)))
    );
    // Two ticks later, the whole limit.
    for reports in [2.0, 3.0] {
        clock.advance(Duration::from_secs(1));
        envoy.report(clock.now()).await;
        flowgate_testing::server::wait_metric(&server, "flowgate_rlqs_reports_total", reports)
            .await;
        assert!(ticks.tick().await);
        assert!(envoy.receive_one(clock.now()).await);
    }
    assert_eq!(
        envoy.phase(&t1, clock.now()),
        Some(Phase::Active(token_bucket(2, 100)))
    );
    // 100 per second and a bucket of 2: 500 requests evenly over a second admit 2 + 99.
    let start = clock.now();
    let admitted = (0..500)
        .filter(|i| envoy.request(&t1, start + i * S / 500))
        .count();
    assert_eq!(admitted, 2 + 99);
    server.stop().await;
}

#[tokio::test]
async fn draining_expires_every_assignment_and_ends_the_streams() {
    let clock = ManualClock::new(START);
    let ticks = ManualTicks::new();
    let server = start_with(&[("edge.yaml", POLICY)], &clock, &ticks, |c| {
        c.drain_period = Duration::from_secs(30);
    })
    .await;
    let (tx, mut inbound) = raw(&server).await;
    tx.send(report(
        "edge",
        vec![
            usage(&[("tenant", "a")], 1, 0),
            usage(&[("free", "b")], 1, 0),
        ],
    ))
    .await
    .unwrap();
    next(&mut inbound).await.unwrap().unwrap();
    let grpc = server.grpc;
    let stopping = tokio::spawn(server.stop());
    // Time to live 0 for every bucket, then UNAVAILABLE.
    let expired = actions(&next(&mut inbound).await.unwrap().unwrap());
    assert_eq!(
        expired["tenant=a"],
        Some((token_bucket(1, 25), Some(Duration::ZERO)))
    );
    assert_eq!(
        expired["free=b"],
        Some((Strategy::AllowAll, Some(Duration::ZERO)))
    );
    let status = ending(&mut inbound).await;
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    // While draining, new streams are refused.
    let mut client = RateLimitQuotaServiceClient::connect(format!("http://{grpc}"))
        .await
        .unwrap();
    let (_tx2, rx2) = mpsc::channel::<RateLimitQuotaUsageReports>(1);
    let outbound =
        futures_util::stream::unfold(
            rx2,
            |mut rx| async move { rx.recv().await.map(|m| (m, rx)) },
        );
    let refused = client.stream_rate_limit_quotas(outbound).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable);
    stopping.abort();
}

#[tokio::test]
async fn malformed_streams_get_clear_statuses_and_are_counted() {
    let clock = ManualClock::new(START);
    let ticks = ManualTicks::new();
    let server = start(&[("edge.yaml", POLICY)], &clock, &ticks).await;
    let cases: Vec<(&str, Vec<RateLimitQuotaUsageReports>, tonic::Code, &str)> = vec![
        (
            "no_domain",
            vec![report("", vec![usage(&[("tenant", "a")], 1, 0)])],
            tonic::Code::InvalidArgument,
            "must name its domain",
        ),
        (
            "unknown_domain",
            vec![report("nope", vec![usage(&[("tenant", "a")], 1, 0)])],
            tonic::Code::NotFound,
            "no rules for domain `nope`",
        ),
        (
            "domain_changed",
            vec![
                report("edge", vec![usage(&[("tenant", "a")], 1, 0)]),
                report("other", vec![usage(&[("tenant", "a")], 1, 0)]),
            ],
            tonic::Code::InvalidArgument,
            "cannot change",
        ),
        (
            "malformed_bucket",
            vec![report("edge", vec![usage(&[], 1, 0)])],
            tonic::Code::InvalidArgument,
            "at least one entry",
        ),
        (
            "absurd_count",
            vec![report("edge", vec![usage(&[("tenant", "a")], u64::MAX, 1)])],
            tonic::Code::InvalidArgument,
            "counts more than",
        ),
    ];
    for (reason, messages, code, says) in cases {
        let (tx, mut inbound) = raw(&server).await;
        for m in messages {
            tx.send(m).await.unwrap();
        }
        let status = ending(&mut inbound).await;
        assert_eq!(status.code(), code, "{reason}: {status:?}");
        assert!(status.message().contains(says), "{reason}: {status:?}");
        let series = format!("flowgate_rlqs_stream_errors_total{{reason=\"{reason}\"}}");
        flowgate_testing::server::wait_metric(&server, &series, 1.0).await;
    }
    flowgate_testing::server::wait_metric(&server, "flowgate_rlqs_streams", 0.0).await;
    assert_eq!(server.metric("flowgate_rlqs_buckets").await, 0.0);
    server.stop().await;
}

#[tokio::test]
async fn a_report_larger_than_the_body_limit_is_refused() {
    let clock = ManualClock::new(START);
    let ticks = ManualTicks::new();
    let server = start_with(&[("edge.yaml", POLICY)], &clock, &ticks, |c| {
        c.max_body_bytes = 4096;
    })
    .await;
    let (tx, mut inbound) = raw(&server).await;
    let many: Vec<BucketQuotaUsage> = (0..200)
        .map(|i| {
            usage(
                &[("tenant", &format!("tenant-with-a-long-name-{i:04}"))],
                1,
                0,
            )
        })
        .collect();
    tx.send(report("edge", many)).await.unwrap();
    let status = ending(&mut inbound).await;
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{status:?}");
    flowgate_testing::server::wait_metric(
        &server,
        "flowgate_rlqs_stream_errors_total{reason=\"malformed_message\"}",
        1.0,
    )
    .await;
    assert_eq!(server.metric("flowgate_rlqs_buckets").await, 0.0);
    server.stop().await;
}

#[tokio::test]
async fn streams_and_buckets_per_stream_are_capped() {
    let clock = ManualClock::new(START);
    let ticks = ManualTicks::new();
    let server = start_with(&[("edge.yaml", POLICY)], &clock, &ticks, |c| {
        c.rlqs.max_streams = 2;
        c.rlqs.max_buckets_per_stream = 3;
    })
    .await;
    // Buckets: the fourth ends the stream.
    let (tx, mut inbound) = raw(&server).await;
    let four: Vec<BucketQuotaUsage> = (0..4)
        .map(|i| usage(&[("tenant", &format!("t{i}"))], 1, 0))
        .collect();
    tx.send(report("edge", four)).await.unwrap();
    let status = ending(&mut inbound).await;
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("at most 3 buckets"));
    flowgate_testing::server::wait_metric(
        &server,
        "flowgate_rlqs_stream_errors_total{reason=\"too_many_buckets\"}",
        1.0,
    )
    .await;
    flowgate_testing::server::wait_metric(&server, "flowgate_rlqs_streams", 0.0).await;
    // Streams: the third is refused while two are open.
    let (_a, mut one) = raw(&server).await;
    let (_b, mut two) = raw(&server).await;
    flowgate_testing::server::wait_metric(&server, "flowgate_rlqs_streams", 2.0).await;
    let mut client = RateLimitQuotaServiceClient::connect(format!("http://{}", server.grpc))
        .await
        .unwrap();
    let (_c, rx) = mpsc::channel::<RateLimitQuotaUsageReports>(1);
    let outbound =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
    let refused = client.stream_rate_limit_quotas(outbound).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
    assert_eq!(
        server
            .metric("flowgate_rlqs_streams_refused_total{reason=\"capacity\"}")
            .await,
        1.0
    );
    drop((_a, _b));
    assert_eq!(ending(&mut one).await.code(), tonic::Code::Ok);
    assert_eq!(ending(&mut two).await.code(), tonic::Code::Ok);
    server.stop().await;
}

#[tokio::test]
async fn a_client_that_never_reads_is_ended_and_bounded() {
    let clock = ManualClock::new(START);
    let ticks = ManualTicks::new();
    let server = start(&[("edge.yaml", POLICY)], &clock, &ticks).await;
    // A client with HTTP/2 windows of 64 KiB (hyper's default is 2 MiB a stream).
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.grpc))
        .unwrap()
        .initial_stream_window_size(65_535)
        .initial_connection_window_size(65_535)
        .connect()
        .await
        .unwrap();
    let (tx, rx) = mpsc::channel(4);
    let outbound =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
    let inbound = RateLimitQuotaServiceClient::new(channel)
        .stream_rate_limit_quotas(outbound)
        .await
        .unwrap()
        .into_inner();
    // 900 buckets: each tick's message is tens of kilobytes, so HTTP/2 flow control stops the
    // server's writes after a few, and then the stream's queue fills.
    let many: Vec<BucketQuotaUsage> = (0..900)
        .map(|i| usage(&[("path", &format!("/resource/{i:04}"))], 1, 0))
        .collect();
    tx.send(report("edge", many)).await.unwrap();
    flowgate_testing::server::wait_metric(&server, "flowgate_rlqs_buckets", 900.0).await;
    let mut ended = false;
    for _ in 0..40 {
        clock.advance(Duration::from_secs(1));
        assert!(ticks.tick().await);
        if server
            .metric("flowgate_rlqs_stream_errors_total{reason=\"not_reading\"}")
            .await
            == 1.0
        {
            ended = true;
            break;
        }
    }
    assert!(ended, "the stream that is never read is ended");
    // Its state is gone: nothing more is kept or queued for it.
    flowgate_testing::server::wait_metric(&server, "flowgate_rlqs_streams", 0.0).await;
    assert_eq!(server.metric("flowgate_rlqs_buckets").await, 0.0);
    drop((tx, inbound));
    server.stop().await;
}

#[tokio::test]
async fn unmatched_buckets_follow_the_domains_setting() {
    let clock = ManualClock::new(START);
    let ticks = ManualTicks::new();
    let deny = "domain: strict\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 10}\nrlqs:\n  unmatched: deny\n";
    let divide = "domain: shared\ndescriptors: []\nrlqs:\n  unmatched: divide\n  unmatched_limit: {limit: 50, per: 1s}\n";
    let server = start(
        &[("strict.yaml", deny), ("shared.yaml", divide)],
        &clock,
        &ticks,
    )
    .await;
    let (tx, mut inbound) = raw(&server).await;
    tx.send(report(
        "strict",
        vec![
            usage(&[("user", "u")], 1, 0),
            usage(&[("tenant", "a"), ("extra", "x")], 1, 0),
        ],
    ))
    .await
    .unwrap();
    let got = actions(&next(&mut inbound).await.unwrap().unwrap());
    // A bucket whose entries the rules do not all use is unmatched too.
    assert_eq!(
        got["user=u"],
        Some((Strategy::DenyAll, Some(Duration::from_secs(3))))
    );
    assert_eq!(
        got["extra=x,tenant=a"],
        Some((Strategy::DenyAll, Some(Duration::from_secs(3))))
    );
    let (tx2, mut inbound2) = raw(&server).await;
    tx2.send(report("shared", vec![usage(&[("anything", "1")], 1, 0)]))
        .await
        .unwrap();
    let got = actions(&next(&mut inbound2).await.unwrap().unwrap());
    assert_eq!(
        got["anything=1"],
        Some((token_bucket(1, 12), Some(Duration::from_secs(3))))
    );
    server.stop().await;
}
