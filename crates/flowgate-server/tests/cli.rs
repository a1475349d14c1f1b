//! The `flowgate` binary: `check-config` messages and exit codes, and `serve` shutting down
//! gracefully on SIGTERM.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{free_port, http_get};

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

#[test]
fn serve_with_the_builtin_policy_then_sigterm_finishes_in_flight_calls_and_exits_0() {
    let (http, grpc) = (free_port(), free_port());
    let mut child = Command::new(FLOWGATE)
        .args([
            "serve",
            "--http",
            &http.to_string(),
            "--grpc",
            &grpc.to_string(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while http_get(http, "/healthz").is_none() {
        assert!(Instant::now() < deadline, "the server never came up");
        std::thread::sleep(Duration::from_millis(20));
    }
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
                        "POST /v1/check HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
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
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let exit = loop {
        if let Some(exit) = child.try_wait().unwrap() {
            break exit;
        }
        assert!(Instant::now() < deadline, "no exit within 10 s of SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(exit.success(), "{exit:?}");
    let completed: i32 = callers.into_iter().map(|c| c.join().unwrap().0).sum();
    assert!(completed > 0);
    assert!(http_get(http, "/healthz").is_none(), "no longer accepting");
}

#[test]
fn serve_refuses_an_upstream_that_is_not_plain_http() {
    for (args, expected) in [
        (
            &["serve", "--upstream", "https://127.0.0.1:1"][..],
            "only http:// upstreams are supported",
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
    let (http, grpc) = (free_port(), free_port());
    let mut child = Command::new(FLOWGATE)
        .args([
            "serve",
            "--http",
            &http.to_string(),
            "--grpc",
            &grpc.to_string(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while http_get(http, "/healthz").is_none() {
        assert!(Instant::now() < deadline, "the server never came up");
        std::thread::sleep(Duration::from_millis(20));
    }
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
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let mut log = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut log)
        .unwrap();
    assert!(child.wait().unwrap().success());
    assert_eq!(log.matches("SIGHUP: nothing to reload").count(), 3, "{log}");
}
