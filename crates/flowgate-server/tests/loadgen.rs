//! `flowgate loadgen` against a real server, over every protocol.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use clap::Parser;
use flowgate_server::cli::loadgen::measure;
use flowgate_server::cli::{Cli, Command, LoadgenArgs};
use flowgate_testing::server::TestServer;

/// 10 an hour. GCRA (burst 10, one unit back every 6 minutes), not a fixed window: a window
/// aligned to the wall clock's hour starts again when a run crosses the hour's end, and the
/// counts asserted below (10 allowed of 150, `k0` used up for the later runs) would not hold.
const POLICY: &str = "domain: lg\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: gcra}\n";

fn args(target: String, extra: &[&str]) -> LoadgenArgs {
    let mut argv = vec![
        "flowgate", "loadgen", "--target", &target, "--domain", "lg", "--key", "k",
    ];
    argv.extend_from_slice(extra);
    match Cli::parse_from(argv).command {
        Command::Loadgen(args) => args,
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_allowed_and_limited_requests_on_every_protocol() {
    let server = TestServer::start(&[("lg.yaml", POLICY)]).await;
    let targets = [
        format!("grpc://{}", server.grpc),
        format!("http://{}/json", server.http),
        format!("http://{}/v1/check", server.http),
    ];
    for target in targets {
        let report = measure(&args(
            target.clone(),
            &["--keys", "1", "--requests", "50", "-c", "8"],
        ))
        .await
        .unwrap();
        assert_eq!(
            (report.requests, report.errors),
            (50, 0),
            "{target}: {report:?}"
        );
        assert_eq!(report.ok + report.over_limit, 50);
        // A loopback round trip takes well over 10 µs; the percentiles are ordered.
        let l = report.latency_us;
        assert!(
            l.p50 >= 10 && l.p50 <= l.p90 && l.p90 <= l.p99 && l.p99 <= l.p999 && l.p999 <= l.max,
            "{l:?}"
        );
        assert!(
            l.mean >= l.p50 as f64 / 4.0 && l.mean <= l.max as f64,
            "{l:?}"
        );
        assert!(report.throughput > 0.0);
    }
    // All three runs sent the one value `k0`: 150 hits, of which the limit allowed 10.
    let hits = server
        .metric("flowgate_hits_total{domain=\"lg\",rule=\"k\"}")
        .await;
    assert_eq!(hits, 150.0);
    let within = server
        .metric("flowgate_within_limit_total{domain=\"lg\",rule=\"k\"}")
        .await;
    assert_eq!(within, 10.0);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zipf_keys_for_a_duration_and_json_output_from_the_binary() {
    let server = TestServer::start(&[("lg.yaml", POLICY)]).await;
    let report = measure(&args(
        format!("grpc://{}", server.grpc),
        &[
            "--keys",
            "100",
            "--distribution",
            "zipf",
            "--duration",
            "300ms",
            "-c",
            "4",
        ],
    ))
    .await
    .unwrap();
    assert!(report.requests > 0 && report.errors == 0);
    assert!(
        (0.2..1.0).contains(&report.elapsed_s),
        "{}",
        report.elapsed_s
    );
    // Zipf: the top keys are hot, so many requests are over their limit of 10.
    assert!(report.over_limit > 0);

    let target = format!("http://{}/v1/check", server.http);
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_flowgate"))
            .args([
                "loadgen", "--target", &target, "--domain", "lg", "--key", "k",
            ])
            .args([
                "--requests",
                "20",
                "--keys",
                "1000",
                "--seed",
                "9",
                "--json",
            ])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(out.status.success(), "{out:?}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["requests"], 20);
    assert_eq!(json["protocol"], "http /v1/check");
    for p in ["p50", "p90", "p99", "p999", "max"] {
        assert!(json["latency_us"][p].as_u64().unwrap() > 0, "{p}");
    }
    // A bad target is an error, not a hang.
    let bad = measure(&args("ftp://nowhere".into(), &["--requests", "1"])).await;
    assert!(bad.is_err());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heavy_requests_are_denied_by_the_counter_and_threads_share_the_callers() {
    let server = TestServer::start(&[("lg.yaml", POLICY)]).await;
    let grpc = format!("grpc://{}", server.grpc);
    // Every request asks for the whole limit (10): the first is allowed, the others denied.
    let report = measure(&args(
        grpc.clone(),
        &[
            "--keys",
            "1",
            "--requests",
            "5",
            "-c",
            "1",
            "--heavy-share",
            "1",
            "--heavy-hits",
            "10",
        ],
    ))
    .await
    .unwrap();
    assert_eq!(
        (report.ok, report.over_limit, report.errors),
        (1, 4, 0),
        "{report:?}"
    );
    let hits = "flowgate_hits_total{domain=\"lg\",rule=\"k\"}";
    assert_eq!(server.metric(hits).await, 50.0);

    // Two threads, each with its own connection and two of the four callers; about half of
    // the 40 requests (a seeded draw) ask for 3 units, the others for 1.
    let report = measure(&args(
        grpc,
        &[
            "--keys",
            "1",
            "--requests",
            "40",
            "-c",
            "4",
            "--connections",
            "2",
            "--threads",
            "2",
            "--heavy-share",
            "0.5",
            "--heavy-hits",
            "3",
        ],
    ))
    .await
    .unwrap();
    assert_eq!(report.threads, 2);
    assert_eq!((report.requests, report.errors), (40, 0), "{report:?}");
    // k0 is used up: everything is denied, and every unit asked for is counted.
    assert_eq!(report.over_limit, 40);
    let heavy_units = server.metric(hits).await - 50.0 - 40.0;
    assert!(
        heavy_units > 0.0 && heavy_units < 80.0 && heavy_units % 2.0 == 0.0,
        "{heavy_units}"
    );

    // More threads than connections: one per connection.
    let report = measure(&args(
        format!("grpc://{}", server.grpc),
        &["--requests", "10", "--connections", "1", "--threads", "4"],
    ))
    .await
    .unwrap();
    assert_eq!((report.threads, report.requests), (1, 10));

    // A share is between 0 and 1.
    for bad in ["1.5", "-0.1", "x"] {
        let parsed = Cli::try_parse_from(["flowgate", "loadgen", "--heavy-share", bad]);
        assert!(parsed.is_err(), "{bad}");
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_paces_the_callers_on_a_schedule() {
    let server = TestServer::start(&[("lg.yaml", POLICY)]).await;
    // 100 requests at 200 per second over 4 callers: the schedule alone takes ~0.5 s, however
    // fast the server is (a lower bound, which load on the machine cannot break).
    let report = measure(&args(
        format!("grpc://{}", server.grpc),
        &["--requests", "100", "--rate", "200", "-c", "4"],
    ))
    .await
    .unwrap();
    assert_eq!((report.requests, report.errors), (100, 0), "{report:?}");
    assert!(report.elapsed_s >= 0.45, "{report:?}");
    let bad = Cli::try_parse_from(["flowgate", "loadgen", "--rate", "0"]);
    assert!(bad.is_err());
    server.stop().await;
}
