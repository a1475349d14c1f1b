//! The `flowgate` binary: `check-config` messages and exit codes, and `serve` shutting down
//! gracefully on SIGTERM.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use flowgate_testing::binary::Serving;
use flowgate_testing::http::http_get;
use flowgate_testing::net::ClosedPort;

const FLOWGATE: &str = env!("CARGO_BIN_EXE_flowgate");

#[test]
fn check_config_accepts_valid_files_and_names_line_and_column_of_errors() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.yaml");
    std::fs::write(
        &good,
        "domain: good\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    )
    .unwrap();
    let out = Command::new(FLOWGATE)
        .arg("check-config")
        .arg(&good)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("ok: 1 file(s), 1 domain(s), 1 limit(s)")
    );

    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "domain: bad\ndescriptors:\n  - key: k\n    rate_limit:\n      unlimited: true\n      unit: second\n  - key: k\n  - key: j\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: fastest}\n",
    )
    .unwrap();
    let out = Command::new(FLOWGATE)
        .arg("check-config")
        .arg(&good)
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let bad_name = bad.display().to_string();
    assert!(
        stderr.contains(&format!(
            "{bad_name}:6:13: `rate_limit.unit`: must not be set when `unlimited` is true"
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "{bad_name}:9:65: `rate_limit.algorithm`: unknown algorithm `fastest`"
        )),
        "{stderr}"
    );

    let dup = dir.path().join("dup.yaml");
    std::fs::write(&dup, "domain: good\n").unwrap();
    let out = Command::new(FLOWGATE)
        .args(["check-config"])
        .arg(&good)
        .arg(&dup)
        .arg(dir.path().join("missing.yaml"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("missing.yaml: cannot read"), "{stderr}");
}

/// `check-config` lists every problem of every file at once — unknown fields do not stop it
/// — each with file, line, column and the field (a wrong type names its field too).
#[test]
fn check_config_lists_every_problem_with_its_field() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("many.yaml");
    std::fs::write(
        &file,
        "domain: many\ndescriptors:\n  - key: a\n    valeu: x\n    rate_limit: {unit: second, requests_per_unit: lots}\n  - key: b\n    shadow: true\n    rate_limit: {unit: second, requests_per_unit: 1, fail: sometimes}\nwebsocket:\n  upstream: ws://127.0.0.1:9000\n  limits: {concurrent_per_ip: -1, slowmode: 0s}\n",
    )
    .unwrap();
    let out = Command::new(FLOWGATE)
        .arg("check-config")
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let name = file.display().to_string();
    let lines: Vec<&str> = stderr.lines().collect();
    let expected = [
        format!("{name}:4:5: unknown field `valeu`; expected one of"),
        format!(
            "{name}:5:51: `rate_limit.requests_per_unit`: invalid type: string \"lots\", expected u64"
        ),
        format!("{name}:7:5: unknown field `shadow`; expected one of"),
        format!("{name}:8:60: `rate_limit.fail`: unknown failure mode `sometimes`"),
        format!(
            "{name}:11:31: `websocket.limits.concurrent_per_ip`: invalid value: integer `-1`, expected u32"
        ),
        format!("{name}:11:45: `websocket.limits.slowmode`: must be longer than zero"),
    ];
    assert_eq!(lines.len(), expected.len(), "{stderr}");
    for (line, expected) in lines.iter().zip(&expected) {
        assert!(
            line.starts_with(expected.as_str()),
            "{line}\nexpected {expected}"
        );
    }
}

/// docs/service.md's `check-config` example prints what the document shows.
#[test]
fn the_documented_check_config_example_prints_what_the_document_shows() {
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/service.md"
    ))
    .unwrap();
    let block = doc
        .split("```\n$ cat edge.yaml\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("the example");
    let (file, output) = block
        .split_once("$ flowgate check-config edge.yaml\n")
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("edge.yaml"), file).unwrap();
    let out = Command::new(FLOWGATE)
        .args(["check-config", "edge.yaml"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(String::from_utf8_lossy(&out.stderr), output);
}

/// `serve --help` names the settings that have no flag (`FLOWGATE_ADMIN_TOKEN`), and says
/// that the request-head limits hold on every HTTP listener, the HTTP API included.
#[test]
fn serve_help_names_the_admin_token_and_where_the_head_limits_apply() {
    let out = Command::new(FLOWGATE)
        .args(["serve", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let help = String::from_utf8_lossy(&out.stdout);
    let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        help.contains("FLOWGATE_ADMIN_TOKEN Enables the admin endpoints"),
        "{help}"
    );
    for flag in ["--max-header-bytes", "--header-read-timeout"] {
        let text = help.split(flag).nth(1).unwrap();
        let text = &text[..text.find(" --").unwrap_or(text.len())];
        assert!(
            text.contains("the HTTP API, the gateway and the WebSocket gateway"),
            "{flag}: {text}"
        );
    }
}

/// `--http` and `--grpc` take host names, as `loadgen --target` does: `localhost` resolves
/// to a loopback address, which is served (and logged with the port bound).
#[test]
fn serve_listens_on_a_host_name() {
    let mut child = Command::new(FLOWGATE)
        .args([
            "serve",
            "--http",
            "localhost:0",
            "--grpc",
            "localhost:0",
            "--log-format",
            "json",
            "--drain-period",
            "0s",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (lines, serving) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    let http: std::net::SocketAddr = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = serving
            .recv_timeout(left)
            .expect("flowgate serving, logged");
        let log: serde_json::Value = serde_json::from_str(&line).unwrap();
        if log["fields"]["message"] == "flowgate serving" {
            break log["fields"]["http"].as_str().unwrap().parse().unwrap();
        }
    };
    assert!(http.ip().is_loopback() && http.port() != 0, "{http}");
    assert!(http_get(http, "/healthz").unwrap().contains("ok"));
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn serve_with_the_builtin_policy_then_sigterm_finishes_in_flight_calls_and_exits_0() {
    let mut serving = Serving::start(
        Command::new(FLOWGATE)
            .args(["serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
            .stdout(Stdio::null()),
    );
    let http = serving.http;
    // The built-in policy: domain `default`.
    let config = http_get(http, "/v1/config").unwrap();
    assert!(config.contains("\"domains\":[\"default\"]"), "{config}");

    // Callers keep checking while SIGTERM arrives: every response that arrives is complete.
    let callers: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(move || {
                let (mut complete, mut refused) = (0, 0);
                let body = r#"{"domain":"default","descriptors":[{"entries":[{"key":"user","value":"u"}]}]}"#;
                for _ in 0..2000 {
                    let Ok(mut conn) = TcpStream::connect_timeout(&http, Duration::from_secs(1)) else {
                        refused += 1;
                        break;
                    };
                    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                    let request = format!(
                        "POST /v1/check HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if conn.write_all(request.as_bytes()).is_err() {
                        refused += 1;
                        break;
                    }
                    let mut response = String::new();
                    match conn.read_to_string(&mut response) {
                        Ok(_) if response.is_empty() => {
                            refused += 1;
                            break;
                        }
                        Ok(_) => {
                            assert!(response.ends_with('}'), "truncated: {response}");
                            complete += 1;
                        }
                        Err(_) => {
                            refused += 1;
                            break;
                        }
                    }
                }
                (complete, refused)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    serving.signal("TERM");
    let exit = serving.wait_exit(Duration::from_secs(10));
    assert!(exit.success(), "{exit:?}");
    let completed: i32 = callers.into_iter().map(|c| c.join().unwrap().0).sum();
    assert!(completed > 0);
    assert!(http_get(http, "/healthz").is_none(), "no longer accepting");
}

#[test]
fn serve_refuses_an_upstream_it_cannot_use() {
    for (args, expected) in [
        (
            &["serve", "--upstream", "ftp://127.0.0.1:1"][..],
            "only http:// and https:// upstreams are supported",
        ),
        (
            &[
                "serve",
                "--upstream",
                "http://127.0.0.1:1",
                "--upstream-ca-file",
                "/nonexistent/ca.pem",
            ][..],
            "needs an https:// upstream",
        ),
        (
            &[
                "serve",
                "--upstream",
                "https://127.0.0.1:1",
                "--upstream-ca-file",
                "/nonexistent/ca.pem",
            ][..],
            "/nonexistent/ca.pem: cannot read",
        ),
        (
            &["serve", "--upstream", "http://127.0.0.1:1/prefix"][..],
            "a path or query is not supported",
        ),
        (&["serve", "--gateway", "127.0.0.1:0"][..], "--upstream"),
    ] {
        let out = Command::new(FLOWGATE).args(args).output().unwrap();
        assert!(!out.status.success(), "{args:?}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}

#[test]
fn sighup_with_the_builtin_policy_does_not_kill_the_server() {
    let mut serving = Serving::start(
        Command::new(FLOWGATE)
            .args(["serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
            .stdout(Stdio::null()),
    );
    let (http, child) = (serving.http, &mut serving.child);
    // Signals no longer kill it once it serves; an answer means its tasks, the reload watcher's
    // included, have started.
    assert!(http_get(http, "/healthz").unwrap().contains("ok"));
    for _ in 0..3 {
        let status = Command::new("kill")
            .args(["-HUP", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            child.try_wait().unwrap().is_none(),
            "SIGHUP killed the server"
        );
    }
    assert!(http_get(http, "/healthz").unwrap().contains("ok"));
    serving.signal("TERM");
    assert!(serving.wait_exit(Duration::from_secs(10)).success());
    let log = serving.log();
    assert_eq!(
        log.matches("SIGHUP: no configuration file to reload")
            .count(),
        3,
        "{log}"
    );
}

/// A one-connection upstream for the drain tests: answers its first request with a 10-byte
/// body, sends the first 5 bytes at once and the rest when `release` says so (never, if it is
/// dropped). Reports on `got` once the request has arrived.
fn streaming_upstream() -> (
    std::net::SocketAddr,
    std::sync::mpsc::Receiver<()>,
    std::sync::mpsc::Sender<()>,
) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (got_tx, got) = std::sync::mpsc::channel();
    let (release, release_rx) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if conn.read(&mut byte).unwrap_or(0) == 0 {
                return;
            }
            head.push(byte[0]);
        }
        conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhello")
            .unwrap();
        let _ = got_tx.send(());
        if release_rx.recv().is_ok() {
            let _ = conn.write_all(b"world");
        }
        // Hold the connection until the gateway closes it.
        let _ = conn.read(&mut byte);
    });
    (addr, got, release)
}

/// Runs the binary as a gateway in front of `upstream` with the given drain and grace periods.
fn gateway_child(upstream: std::net::SocketAddr, drain: &str, grace: &str) -> Serving {
    Serving::start(
        Command::new(FLOWGATE)
            .args(["serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
            .args(["--upstream", &format!("http://{upstream}")])
            .args(["--gateway", "127.0.0.1:0"])
            .args(["--drain-period", drain, "--grace-period", grace])
            .stdout(Stdio::null()),
    )
}

/// Opens a response through the gateway and reads its head and first 5 body bytes.
fn open_stream(gateway: std::net::SocketAddr, got: &std::sync::mpsc::Receiver<()>) -> TcpStream {
    let mut client = TcpStream::connect(gateway).unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    client
        .write_all(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    got.recv_timeout(Duration::from_secs(10))
        .expect("the request reached the upstream");
    let mut seen = Vec::new();
    let mut buf = [0u8; 256];
    while !seen.ends_with(b"hello") {
        let n = client.read(&mut buf).unwrap();
        assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    assert!(seen.starts_with(b"HTTP/1.1 200"), "{seen:?}");
    client
}

#[test]
fn sigterm_drains_then_stops_accepting_and_finishes_a_stream_in_flight() {
    let (upstream, got, release) = streaming_upstream();
    let mut serving = gateway_child(upstream, "1500ms", "20s");
    let (http, gateway) = (serving.http, serving.gateway.unwrap());
    let ready = http_get(http, "/readyz").unwrap();
    assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
    let mut client = open_stream(gateway, &got);

    let signalled = Instant::now();
    serving.signal("TERM");
    // During the drain period: still serving, but unready.
    let deadline = Instant::now() + Duration::from_secs(10);
    let unready = loop {
        let answer = http_get(http, "/readyz").expect("the API still serves while draining");
        if answer.starts_with("HTTP/1.1 503") {
            break answer;
        }
        assert!(Instant::now() < deadline, "/readyz never failed: {answer}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(unready.contains("\"draining\":true"), "{unready}");
    assert!(
        signalled.elapsed() < Duration::from_millis(1500),
        "the drain period was over before /readyz failed; the test proves nothing"
    );
    assert!(serving.child.try_wait().unwrap().is_none());

    // After it: the listeners close, the stream in flight carries on.
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect_timeout(&gateway, Duration::from_secs(1)).is_ok() {
        assert!(Instant::now() < deadline, "the gateway still accepts");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        signalled.elapsed() >= Duration::from_millis(1500),
        "stopped accepting before the drain period ended"
    );
    assert!(
        serving.child.try_wait().unwrap().is_none(),
        "exited with a stream in flight"
    );
    release.send(()).unwrap();
    let mut rest = Vec::new();
    let mut buf = [0u8; 64];
    while !rest.ends_with(b"world") {
        let n = client.read(&mut buf).unwrap();
        assert!(n > 0, "the stream was cut: {rest:?}");
        rest.extend_from_slice(&buf[..n]);
    }
    let exit = serving.wait_exit(Duration::from_secs(10));
    assert_eq!(exit.code(), Some(0), "{exit:?}");
    assert!(http_get(http, "/healthz").is_none(), "no longer accepting");
}

#[test]
fn sigterm_closes_what_outlives_the_grace_period_and_still_exits_0() {
    let (upstream, got, release) = streaming_upstream();
    let mut serving = gateway_child(upstream, "0s", "500ms");
    let mut client = open_stream(serving.gateway.unwrap(), &got);
    let signalled = Instant::now();
    serving.signal("TERM");
    let exit = serving.wait_exit(Duration::from_secs(10));
    assert_eq!(exit.code(), Some(0), "{exit:?}");
    assert!(
        signalled.elapsed() >= Duration::from_millis(500),
        "exited before the grace period ended"
    );
    // The stream never finished: its connection was closed.
    let mut buf = [0u8; 64];
    assert!(matches!(client.read(&mut buf), Ok(0) | Err(_)));
    drop(release);
}

#[test]
fn serve_takes_its_flags_from_flowgate_environment_variables_and_logs_json() {
    let mut serving = Serving::start(
        Command::new(FLOWGATE)
            .arg("serve")
            .env("FLOWGATE_HTTP", "127.0.0.1:0")
            .env("FLOWGATE_GRPC", "127.0.0.1:0")
            .env("FLOWGATE_MAX_BODY_BYTES", "100")
            .env("FLOWGATE_DRAIN_PERIOD", "0s")
            .env("FLOWGATE_LOG_FORMAT", "json")
            .stdout(Stdio::null()),
    );
    let http = serving.http;
    let big = format!(
        r#"{{"domain":"default","descriptors":[{{"entries":[{{"key":"user","value":"{}"}}]}}]}}"#,
        "u".repeat(200)
    );
    let answer = flowgate_testing::http::http_post(http, "/v1/check", &big);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    serving.signal("TERM");
    assert!(serving.wait_exit(Duration::from_secs(10)).success());
    let log = serving.log();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    assert!(
        lines
            .iter()
            .any(|l| l["fields"]["message"] == "flowgate serving" && l["level"] == "INFO"),
        "{log}"
    );
}

#[test]
fn the_access_log_has_one_line_per_gateway_request_without_the_query() {
    // Nothing listens upstream: the request is answered 502, and logged.
    let upstream = ClosedPort::new();
    let mut serving = Serving::start(
        Command::new(FLOWGATE)
            .args(["serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
            .args(["--upstream", &format!("http://{}", upstream.addr())])
            .args(["--gateway", "127.0.0.1:0", "--drain-period", "0s"])
            .args(["--access-log", "--log-format", "json"])
            .stdout(Stdio::null()),
    );
    let answer = http_get(serving.gateway.unwrap(), "/orders/7?token=s3cr3t").unwrap();
    assert!(answer.starts_with("HTTP/1.1 502"), "{answer}");
    serving.signal("TERM");
    assert!(serving.wait_exit(Duration::from_secs(10)).success());
    let log = serving.log();
    let access: Vec<serde_json::Value> = log
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .filter(|l| l["target"] == "flowgate::access")
        .collect();
    assert_eq!(access.len(), 1, "{log}");
    let fields = &access[0]["fields"];
    assert_eq!(fields["method"], "GET");
    assert_eq!(fields["path"], "/orders/7");
    assert_eq!(fields["status"], 502);
    assert!(fields["peer"].as_str().unwrap().starts_with("127.0.0.1:"));
    assert!(!log.contains("s3cr3t"), "{log}");
}
