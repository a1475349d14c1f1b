//! `flowgate serve` with one CPU to run on (a container limited to one CPU, `taskset -c 0`)
//! runs tokio's current-thread scheduler, and every front end works on it: the HTTP API's
//! decisions, the gateway, the WebSocket gateway and a clean stop on SIGTERM. With more CPUs it
//! runs the multi-thread one. (Why: `cli::runtime`'s documentation and BENCHMARKS.md.)
//!
//! The CPU is taken away with `taskset` (util-linux); without it these tests skip loudly,
//! unless `FLOWGATE_REQUIRE_TASKSET=1` (set by CI) makes that an error.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Stdio};
use std::time::Duration;

use http_body_util::Full;
use hyper::Request;
use hyper::body::Bytes;

use flowgate_testing::binary::Serving;
use flowgate_testing::upstream::{Upstream, client, send};
use flowgate_testing::ws::{self as websocket, EchoUpstream, Got};

const FLOWGATE: &str = env!("CARGO_BIN_EXE_flowgate");

/// Whether `taskset` is on `PATH`; when not, says loudly that the test is skipped.
fn taskset_found() -> bool {
    let found = Command::new("taskset")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if found {
        return true;
    }
    if std::env::var("FLOWGATE_REQUIRE_TASKSET").as_deref() == Ok("1") {
        panic!("taskset is not on PATH but FLOWGATE_REQUIRE_TASKSET=1");
    }
    eprintln!(
        "\n!!!!!!!! SKIPPED a one-CPU test: taskset is not on PATH (install util-linux; set FLOWGATE_REQUIRE_TASKSET=1 to make this an error) !!!!!!!!\n"
    );
    false
}

/// A CPU this process may run on (the first of its affinity mask).
fn one_cpu() -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .expect("Cpus_allowed_list in /proc/self/status")
        .trim();
    list.split([',', '-']).next().unwrap().to_owned()
}

/// Two requests a minute per user on the HTTP API; the WebSocket gateway in front of `echo`.
fn config(dir: &tempfile::TempDir, echo: &EchoUpstream) -> String {
    let path = dir.path().join("one.yaml");
    std::fs::write(
        &path,
        format!(
            "domain: one\ndescriptors:\n  - key: user\n    rate_limit: {{unit: minute, requests_per_unit: 2}}\nwebsocket:\n  upstream: {}\n",
            echo.url()
        ),
    )
    .unwrap();
    path.to_str().unwrap().to_owned()
}

/// `flowgate serve` with `config`, the gateway in front of `upstream`, every listener on a
/// port the system chooses; on CPU `cpu` alone (through `taskset`) when given.
fn serve(cpu: Option<&str>, config: &str, upstream: &Upstream) -> Serving {
    let mut command = match cpu {
        Some(cpu) => {
            let mut taskset = Command::new("taskset");
            taskset.args(["-c", cpu, FLOWGATE]);
            taskset
        }
        None => Command::new(FLOWGATE),
    };
    command
        .args(["serve", "--config", config])
        .args(["--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
        .args(["--gateway", "127.0.0.1:0", "--upstream", &upstream.url()])
        .args(["--websocket", "127.0.0.1:0"])
        // Its own choice of CPUs, whatever the environment of the tests says.
        .env_remove("TOKIO_WORKER_THREADS")
        .stdout(Stdio::null());
    Serving::start(&mut command)
}

/// The `flowgate serving` line of `log`.
fn serving_line(log: &str) -> &str {
    log.lines()
        .find(|l| l.contains("flowgate serving"))
        .expect("a `flowgate serving` line")
}

#[tokio::test]
async fn on_one_cpu_serve_runs_the_current_thread_scheduler_and_every_front_end_works() {
    if !taskset_found() {
        return;
    }
    let echo = EchoUpstream::start().await;
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = config(&dir, &echo);
    let cpu = one_cpu();
    let mut serving = serve(Some(&cpu), &config, &upstream);
    let log = serving.log();
    assert!(
        serving_line(&log).contains("current-thread"),
        "one CPU: the current-thread scheduler\n{log}"
    );

    // The HTTP API decides: two allowed, the third over the limit.
    let check = r#"{"domain":"one","descriptors":[{"entries":[{"key":"user","value":"u"}]}]}"#;
    let mut allowed = Vec::new();
    for _ in 0..3 {
        let request = Request::post(format!("http://{}/v1/check", serving.http))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(check.as_bytes())))
            .unwrap();
        let answer = send(&client(), request).await;
        allowed.push(
            answer.json()["allowed"]
                .as_bool()
                .expect("`allowed` in the answer"),
        );
    }
    assert_eq!(allowed, [true, true, false]);

    // The gateway proxies to the upstream.
    let gateway = serving.gateway.expect("a gateway");
    let request = Request::get(format!("http://{gateway}/through"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(send(&client(), request).await.status, 201);
    assert_eq!(upstream.seen().len(), 1);
    assert_eq!(upstream.seen()[0].uri, "/through");

    // The WebSocket gateway relays both ways.
    let mut ws = websocket::open(serving.websocket.expect("a WebSocket gateway"), "/", &[]).await;
    for text in ["one", "two"] {
        websocket::send(&mut ws, text).await;
        assert_eq!(websocket::next(&mut ws).await, Got::Text(text.to_owned()));
    }
    drop(ws);

    // SIGTERM: it stops cleanly.
    serving.signal("TERM");
    let status = serving.wait_exit(Duration::from_secs(30));
    assert!(status.success(), "{status:?}\n{}", serving.log());
    assert!(serving.log().contains("stopped"), "{}", serving.log());
}

#[tokio::test]
async fn with_more_than_one_cpu_serve_runs_the_multi_thread_scheduler() {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpus < 2 {
        eprintln!(
            "\n!!!!!!!! SKIPPED a multi-CPU test: this process may run on {cpus} CPU !!!!!!!!\n"
        );
        return;
    }
    let echo = EchoUpstream::start().await;
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = config(&dir, &echo);
    let serving = serve(None, &config, &upstream);
    let log = serving.log();
    assert!(
        serving_line(&log).contains("multi-thread"),
        "{cpus} CPUs: the multi-thread scheduler\n{log}"
    );
}
