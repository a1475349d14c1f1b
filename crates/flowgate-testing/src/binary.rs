//! The `flowgate` binary as a child process, serving on ports the system chose.
//!
//! Give it `--http 127.0.0.1:0 --grpc 127.0.0.1:0` (and `--gateway 127.0.0.1:0`,
//! `--websocket 127.0.0.1:0`, or the `FLOWGATE_*` variables): `flowgate serve` binds them, then
//! logs the addresses it bound — the `gateway proxying` and `websocket gateway relaying` lines,
//! then `flowgate serving` last, once every listener is bound. [`Serving::start`] reads them
//! from its log (text or `--log-format json`) as it comes, so a test never guesses a free port
//! and never polls for readiness.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long the binary may take to bind its listeners (a debug build on a loaded machine).
const START: Duration = Duration::from_secs(30);

/// A running `flowgate serve`, killed when dropped.
#[derive(Debug)]
pub struct Serving {
    /// The process.
    pub child: Child,
    /// The HTTP API's address.
    pub http: SocketAddr,
    /// The gRPC API's address.
    pub grpc: SocketAddr,
    /// The gateway's address, with `--upstream`.
    pub gateway: Option<SocketAddr>,
    /// The WebSocket gateway's address, with a `websocket` section.
    pub websocket: Option<SocketAddr>,
    /// Everything the process wrote to stderr so far.
    log: Arc<Mutex<String>>,
    /// Reads stderr into `log` until the process closes it.
    reader: Option<JoinHandle<()>>,
}

impl Serving {
    /// Spawns `command` (a `flowgate serve …` command) with its stderr captured and waits until
    /// it logs `flowgate serving`. Panics, with the log, when it exits first or says nothing
    /// within 30 s. The log must include INFO lines (the default; not `RUST_LOG=warn`).
    pub fn start(command: &mut Command) -> Serving {
        let mut child = command
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn flowgate");
        let stderr = child.stderr.take().expect("stderr is piped");
        let log = Arc::new(Mutex::new(String::new()));
        let (lines, read) = mpsc::channel::<String>();
        let written = log.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { return };
                let mut log = written.lock().unwrap_or_else(|e| e.into_inner());
                log.push_str(&line);
                log.push('\n');
                drop(log);
                let _ = lines.send(line);
            }
        });
        let (mut gateway, mut websocket) = (None, None);
        let deadline = Instant::now() + START;
        let (http, grpc) = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match read.recv_timeout(left) {
                Ok(line) => line,
                Err(RecvTimeoutError::Disconnected) => {
                    let status = child.wait();
                    let _ = reader.join();
                    panic!(
                        "flowgate exited ({status:?}) before serving:\n{}",
                        log.lock().unwrap_or_else(|e| e.into_inner())
                    );
                }
                Err(RecvTimeoutError::Timeout) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    let _ = reader.join();
                    panic!(
                        "flowgate did not serve within {START:?}:\n{}",
                        log.lock().unwrap_or_else(|e| e.into_inner())
                    );
                }
            };
            let line = Line::parse(&line);
            if line.message == "gateway proxying" {
                gateway = line.addr("gateway");
            } else if line.message == "websocket gateway relaying" {
                websocket = line.addr("websocket");
            } else if line.message == "flowgate serving" {
                let http = line.addr("http").expect("`http` in `flowgate serving`");
                let grpc = line.addr("grpc").expect("`grpc` in `flowgate serving`");
                break (http, grpc);
            }
        };
        Serving {
            child,
            http,
            grpc,
            gateway,
            websocket,
            log,
            reader: Some(reader),
        }
    }

    /// What the process wrote to stderr so far (all of it once it has exited: see
    /// [`wait_exit`](Self::wait_exit)).
    pub fn log(&self) -> String {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Sends `signal` (`"TERM"`, `"HUP"`, …) with `kill`.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} failed");
    }

    /// Waits (at most `within`) for the process to exit and for its log to end; kills it and
    /// fails the test when it does not.
    pub fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                break status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("flowgate did not exit within {within:?}:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        status
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One log line: its message and fields, from the text format (colours or not) or from JSON.
struct Line {
    /// The message.
    message: String,
    /// `name=value` fields, in order.
    fields: Vec<(String, String)>,
}

impl Line {
    fn parse(line: &str) -> Line {
        if let Ok(serde_json::Value::Object(object)) = serde_json::from_str(line) {
            let mut fields = Vec::new();
            let mut message = String::new();
            if let Some(serde_json::Value::Object(map)) = object.get("fields") {
                for (name, value) in map {
                    let value = match value {
                        serde_json::Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    if name == "message" {
                        message = value;
                    } else {
                        fields.push((name.clone(), value));
                    }
                }
            }
            return Line { message, fields };
        }
        // `2026-12-02T…Z  INFO target: message name=value name=value`, maybe with ANSI colours.
        let plain = strip_ansi(line);
        let rest = plain
            .split_once(": ")
            .map_or(plain.as_str(), |(_, rest)| rest);
        let mut message = Vec::new();
        let mut fields = Vec::new();
        for word in rest.split_whitespace() {
            match word.split_once('=') {
                Some((name, value)) => fields.push((name.to_owned(), value.to_owned())),
                None if fields.is_empty() => message.push(word),
                None => {}
            }
        }
        Line {
            message: message.join(" "),
            fields,
        }
    }

    /// Field `name` as a socket address.
    fn addr(&self, name: &str) -> Option<SocketAddr> {
        self.fields
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.trim_matches('"').parse().ok())
    }
}

/// `text` without ANSI escape sequences (`ESC [ … letter`).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_addresses_from_text_with_colours_and_from_json() {
        let text = "\u{1b}[2m2026-12-02T02:34:07.527845Z\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m \u{1b}[2mflowgate_server::cli::serve\u{1b}[0m\u{1b}[2m:\u{1b}[0m flowgate serving \u{1b}[3mhttp\u{1b}[0m\u{1b}[2m=\u{1b}[0m127.0.0.1:18080 \u{1b}[3mgrpc\u{1b}[0m\u{1b}[2m=\u{1b}[0m127.0.0.1:18081 \u{1b}[3mstore\u{1b}[0m\u{1b}[2m=\u{1b}[0m\"local\"";
        let line = Line::parse(text);
        assert_eq!(line.message, "flowgate serving");
        assert_eq!(line.addr("http"), "127.0.0.1:18080".parse().ok());
        assert_eq!(line.addr("grpc"), "127.0.0.1:18081".parse().ok());
        let json = r#"{"timestamp":"…","level":"INFO","fields":{"message":"gateway proxying","gateway":"127.0.0.1:9","upstream":"http://x"},"target":"flowgate_server::cli::serve"}"#;
        let line = Line::parse(json);
        assert_eq!(line.message, "gateway proxying");
        assert_eq!(line.addr("gateway"), "127.0.0.1:9".parse().ok());
    }
}
