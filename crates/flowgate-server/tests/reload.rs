//! Reloading: new limits apply while calls keep succeeding; a broken file is rejected, counted
//! and the running policy stays live; counters of unchanged rules are kept.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use flowgate_testing::grpc::{OK, OVER_LIMIT, descriptor, request, should};
use flowgate_testing::server::TestServer;

/// The test's policy. GCRA, not a fixed window: a window aligned to the wall clock's minute
/// resets when the test happens to run across a minute's end (it did once, in a clean clone's
/// CI run), and the counts below would not be the ones asserted. `team` refills one unit in
/// six minutes, `user` (at 2) one in 30 s: far longer than the test takes.
fn policy(user_limit: u64) -> String {
    format!(
        "domain: app\ndescriptors:\n  - key: user\n    rate_limit: {{unit: minute, requests_per_unit: {user_limit}, algorithm: gcra}}\n  - key: team\n    rate_limit: {{unit: hour, requests_per_unit: 10, algorithm: gcra}}\n  - key: load\n    rate_limit: {{unit: minute, requests_per_unit: 1000000, algorithm: fixed_window}}\n"
    )
}

/// Polls `/v1/config` until the configuration version is `version` (bounded: 10 s).
async fn wait_for_version(server: &TestServer, version: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let current = server.get("/v1/config").await.json()["version"].as_u64();
        if current == Some(version) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "version {version} never came (at {current:?})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_under_load_applies_new_limits_without_failed_calls() {
    let server = TestServer::start(&[("app.yaml", &policy(1000))]).await;
    let mut rls = server.rls().await;
    // Take 3 of team's 10 before the reload.
    for _ in 0..3 {
        should(&mut rls, request("app", vec![descriptor(&[("team", "t")])])).await;
    }

    // Load: 4 callers until told to stop (bounded by 20 s), counting every outcome.
    let stop = Arc::new(AtomicBool::new(false));
    let (calls, failures) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut callers = Vec::new();
    for _ in 0..4 {
        let (stop, calls, failures) = (stop.clone(), calls.clone(), failures.clone());
        let mut client = server.rls().await;
        callers.push(tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(20);
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                let r = client
                    .should_rate_limit(request("app", vec![descriptor(&[("load", "x")])]))
                    .await;
                calls.fetch_add(1, Ordering::Relaxed);
                if !matches!(r, Ok(ref r) if r.get_ref().overall_code == OK) {
                    failures.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    std::fs::write(&server.files[0], policy(2)).unwrap();
    wait_for_version(&server, 2).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.store(true, Ordering::Relaxed);
    for caller in callers {
        caller.await.unwrap();
    }
    assert!(calls.load(Ordering::Relaxed) > 20, "the load ran");
    assert_eq!(
        failures.load(Ordering::Relaxed),
        0,
        "no call failed during the reload"
    );

    // The new limit applies: 2 per minute.
    let user = || request("app", vec![descriptor(&[("user", "u")])]);
    assert_eq!(should(&mut rls, user()).await.overall_code, OK);
    assert_eq!(should(&mut rls, user()).await.overall_code, OK);
    assert_eq!(should(&mut rls, user()).await.overall_code, OVER_LIMIT);
    // The unchanged rule kept its counter: 3 taken before, this is the 4th.
    let team = should(&mut rls, request("app", vec![descriptor(&[("team", "t")])])).await;
    assert_eq!(team.statuses[0].limit_remaining, 6);
    assert_eq!(
        server
            .metric("flowgate_config_reloads_total{result=\"ok\",source=\"files\"}")
            .await,
        1.0
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_reload_keeps_the_running_policy() {
    let server = TestServer::start(&[("app.yaml", &policy(1))]).await;
    let mut rls = server.rls().await;
    std::fs::write(
        &server.files[0],
        "domain: app\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5, colour: red}\n",
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while server
        .metric("flowgate_config_reloads_total{result=\"failed\",source=\"files\"}")
        .await
        < 1.0
    {
        assert!(Instant::now() < deadline, "the broken file was never seen");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(server.get("/v1/config").await.json()["version"], 1);
    // Still 1 per minute.
    let user = || request("app", vec![descriptor(&[("user", "b")])]);
    assert_eq!(should(&mut rls, user()).await.overall_code, OK);
    assert_eq!(should(&mut rls, user()).await.overall_code, OVER_LIMIT);
    // Fixing the file installs it.
    std::fs::write(&server.files[0], policy(5)).unwrap();
    wait_for_version(&server, 2).await;
    let fresh = should(&mut rls, request("app", vec![descriptor(&[("user", "c")])])).await;
    assert_eq!(fresh.statuses[0].limit_remaining, 4);
    server.stop().await;
}

/// Polls until `series` reaches `at_least` (bounded: 10 s).
async fn wait_for_metric(server: &TestServer, series: &str, at_least: f64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.metric(series).await < at_least {
        assert!(
            Instant::now() < deadline,
            "{series} never reached {at_least}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotating_a_key_file_is_a_change_and_a_broken_key_keeps_the_old_policy() {
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let first =
        std::fs::read(fixtures.join("flowgate/tests/fixtures/jwt-test-rs256.pub.pem")).unwrap();
    let rotated =
        std::fs::read(fixtures.join("flowgate-server/tests/fixtures/jwt-rotated-rs256.pub.pem"))
            .unwrap();
    let dir = tempfile::tempdir().unwrap();
    // The key file in a directory of its own, as a mounted Kubernetes Secret would be.
    std::fs::create_dir(dir.path().join("keys")).unwrap();
    let key = dir.path().join("keys/jwt.pem");
    std::fs::write(&key, &first).unwrap();
    let file = dir.path().join("app.yaml");
    std::fs::write(
        &file,
        "domain: app\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\ngateway:\n  jwt: {rs256_public_key_file: keys/jwt.pem}\n  descriptors:\n    - [{key: jwt_claim, claim: sub, as: user}]\n",
    )
    .unwrap();
    let config = flowgate_server::server::ServerConfig::load(vec![file.clone()]).unwrap();
    let server = TestServer::start_with(config, dir, vec![file]).await;
    let digest = || async { server.get("/v1/config").await.json()["digest"].clone() };
    let before = digest().await;

    // A key file that is no key: rejected, the running policy (and its key) stays.
    std::fs::write(&key, b"not a key").unwrap();
    wait_for_metric(
        &server,
        "flowgate_config_reloads_total{result=\"failed\",source=\"files\"}",
        1.0,
    )
    .await;
    assert_eq!(server.get("/v1/config").await.json()["version"], 1);
    assert_eq!(digest().await, before);

    // A new key: a change, installed.
    std::fs::write(&key, &rotated).unwrap();
    wait_for_version(&server, 2).await;
    assert_ne!(digest().await, before);
    assert_eq!(
        server
            .metric("flowgate_config_reloads_total{result=\"ok\",source=\"files\"}")
            .await,
        1.0
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_drops_the_series_of_removed_rules() {
    let server = TestServer::start(&[("app.yaml", &policy(1000))]).await;
    let mut rls = server.rls().await;
    should(&mut rls, request("app", vec![descriptor(&[("team", "t")])])).await;
    let team = "flowgate_hits_total{domain=\"app\",rule=\"team\"}";
    assert_eq!(server.metric(team).await, 1.0);
    // The same file without `team`.
    let without: String = policy(1000)
        .lines()
        .filter(|l| !l.contains("team") && !l.contains("requests_per_unit: 10,"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(!without.contains("team"), "{without}");
    std::fs::write(&server.files[0], &without).unwrap();
    wait_for_version(&server, 2).await;
    let text = server.get("/metrics").await.body;
    assert!(!text.contains("rule=\"team\""), "{text}");
    assert!(text.contains("rule=\"user\""), "{text}");
    server.stop().await;
}
