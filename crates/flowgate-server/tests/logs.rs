//! What an operator reads in the log of the real binary: plain text when the log goes to a
//! file (colour only on a terminal); an answer to every SIGHUP, also when nothing changed; and
//! a line when the Redis circuit breaker opens (WARN) and when it closes (INFO).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[cfg(feature = "redis")]
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const FLOWGATE: &str = env!("CARGO_BIN_EXE_flowgate");

/// A `flowgate serve` whose stderr goes to a file, as under systemd or in a container.
struct Served {
    child: Child,
    http: std::net::SocketAddr,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Served {
    /// Starts `flowgate serve` with `args` (besides the listeners) and waits for `/healthz`.
    fn start(args: &[&str], dir: tempfile::TempDir) -> Served {
        let log = dir.path().join("stderr.log");
        let child = Command::new(FLOWGATE)
            .arg("serve")
            .args(["--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
            .args(["--drain-period", "0s"])
            .args(args)
            .env_remove("RUST_LOG")
            .env_remove("NO_COLOR")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        // The server logs the addresses it bound, last, once it serves.
        let deadline = Instant::now() + Duration::from_secs(30);
        let http = loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if let Some(addr) = text
                .lines()
                .find(|l| l.contains("flowgate serving"))
                .and_then(|l| l.split_whitespace().find_map(|f| f.strip_prefix("http=")))
            {
                break addr.parse().unwrap();
            }
            assert!(
                Instant::now() < deadline,
                "the server never served:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        Served {
            child,
            http,
            log,
            _dir: dir,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap()
    }

    /// Waits until the log has `count` lines containing `text` (10 s at most), doing `poke`
    /// between looks; the log.
    fn wait_for(&self, text: &str, count: usize, mut poke: impl FnMut()) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let log = self.log();
            if log.lines().filter(|l| l.contains(text)).count() >= count {
                return log;
            }
            assert!(Instant::now() < deadline, "no {count}× `{text}` in:\n{log}");
            poke();
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// SIGTERM, and the whole log once the process has exited.
    fn stop(mut self) -> String {
        self.signal("TERM");
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.child.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "no exit after SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
        self.log()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        // A test that failed midway leaves no server behind.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The ESC of an ANSI colour sequence.
const ESC: char = '\u{1b}';

#[test]
fn text_logs_to_a_file_or_a_pipe_have_no_colour_codes() {
    // A pipe: a failed start's error line.
    let out = Command::new(FLOWGATE)
        .args(["serve", "--config", "/nonexistent/flowgate.yaml"])
        .env_remove("NO_COLOR")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("ERROR"), "{stderr}");
    assert!(!stderr.contains(ESC), "colour codes in a pipe: {stderr:?}");
    // A file: a whole run.
    let served = Served::start(&[], tempfile::tempdir().unwrap());
    let log = served.stop();
    assert!(log.contains(" INFO "), "{log}");
    assert!(log.contains("flowgate serving"), "{log}");
    assert!(!log.contains(ESC), "colour codes in a file: {log:?}");
}

fn write(path: &Path, limit: u32) {
    std::fs::write(
        path,
        format!("domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {{unit: minute, requests_per_unit: {limit}}}\n"),
    )
    .unwrap();
}

#[test]
fn every_sighup_is_answered_in_the_log_at_info_also_when_nothing_changed() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("edge.yaml");
    write(&config, 5);
    let served = Served::start(&["--config", config.to_str().unwrap()], dir);
    served.signal("HUP");
    let log = served.wait_for("nothing changed", 1, || {});
    let line = log.lines().find(|l| l.contains("nothing changed")).unwrap();
    assert!(line.contains(" INFO "), "{line}");
    assert!(line.contains("SIGHUP: reload requested"), "{line}");
    // A change is reloaded once (by the file watch or the signal, whichever comes first), and
    // the next SIGHUP again finds nothing changed.
    write(&config, 6);
    served.signal("HUP");
    served.wait_for("configuration reloaded", 1, || {});
    served.signal("HUP");
    let log = served.wait_for("nothing changed", 2, || {});
    assert_eq!(
        log.matches("configuration reloaded").count(),
        1,
        "one change, one reload: {log}"
    );
    served.stop();
}

#[cfg(feature = "redis")]
#[test]
fn the_redis_circuit_breaker_says_when_it_opens_and_when_it_closes() {
    let Some(mut redis) = flowgate_testing::redis::RedisServer::start(
        "the_redis_circuit_breaker_says_when_it_opens_and_when_it_closes",
    ) else {
        return;
    };
    let url = redis.url();
    let served = Served::start(
        &["--redis", &url, "--redis-timeout", "200ms"],
        tempfile::tempdir().unwrap(),
    );
    let check = r#"{"domain":"default","descriptors":[{"entries":[{"key":"user","value":"u"}]}]}"#;
    let http = served.http;
    let ask = || {
        flowgate_testing::http::http_post(http, "/v1/check", check);
    };
    ask();
    assert!(
        !served.log().contains("circuit breaker"),
        "{}",
        served.log()
    );
    redis.kill();
    let log = served.wait_for("circuit breaker open", 1, ask);
    let line = log
        .lines()
        .find(|l| l.contains("circuit breaker open"))
        .unwrap();
    assert!(line.contains(" WARN "), "{line}");
    assert!(
        line.contains("requests are decided by their fail mode"),
        "{line}"
    );
    redis.restart();
    let log = served.wait_for("circuit breaker closed", 1, ask);
    let line = log
        .lines()
        .find(|l| l.contains("circuit breaker closed"))
        .unwrap();
    assert!(line.contains(" INFO "), "{line}");
    assert!(line.contains("open_for="), "{line}");
    let log = served.stop();
    assert_eq!(
        log.matches("circuit breaker open").count(),
        1,
        "one outage: {log}"
    );
}
