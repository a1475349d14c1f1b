//! Headless Chromium driven over the DevTools protocol (a WebSocket; the client is
//! tokio-tungstenite): the one browser helper of the workspace's tests, used by
//! `examples/ws-chat/tests/browser.rs` and `crates/flowgate-server/tests/dashboard_browser.rs`.
//!
//! Chromium is looked for as `$FLOWGATE_CHROMIUM`, else `chromium`, `chromium-browser`,
//! `google-chrome-stable` or `google-chrome` on `PATH` (Debian: `apt-get install chromium`).
//! When it is missing or does not start, [`Chromium::start`] prints a loud message and
//! answers `None` — unless `FLOWGATE_REQUIRE_CHROMIUM=1`, which makes that a panic (CI sets
//! it).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream, connect_async};

/// The flags that keep Chromium from reaching for the network (there is none: without them it
/// hangs on lookups) or for a GPU and a sandbox (containers have neither).
pub const FLAGS: &[&str] = &[
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1024,900",
    "--remote-debugging-port=0",
];

/// How long Chromium may take to start: a first start from a cold disk cache on a loaded
/// 2-core machine once took more than 30 s (the same test then passed in 17 s).
pub const START: Duration = Duration::from_secs(90);
/// How long one DevTools call may take to answer.
pub const CALL: Duration = Duration::from_secs(15);

/// Says loudly why the browser test does not run — or fails, when it is required.
pub fn unavailable<T>(why: &str) -> Option<T> {
    if std::env::var("FLOWGATE_REQUIRE_CHROMIUM").as_deref() == Ok("1") {
        panic!("the browser test needs Chromium but FLOWGATE_REQUIRE_CHROMIUM=1: {why}");
    }
    eprintln!(
        "\n!!!!!!!! SKIPPED a browser test: {why} (apt-get install chromium; set FLOWGATE_REQUIRE_CHROMIUM=1 to make this an error) !!!!!!!!\n"
    );
    None
}

/// The Chromium to run, if there is one.
pub fn find_chromium() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("FLOWGATE_CHROMIUM") {
        return Some(PathBuf::from(path));
    }
    let path = std::env::var_os("PATH")?;
    let names = [
        "chromium",
        "chromium-browser",
        "google-chrome-stable",
        "google-chrome",
    ];
    names.iter().find_map(|name| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(name))
            .find(|candidate| candidate.is_file())
    })
}

/// A headless Chromium with a fresh profile, killed when dropped.
pub struct Chromium {
    child: Child,
    /// The browser's DevTools endpoint, `ws://127.0.0.1:PORT/devtools/browser/ID`.
    endpoint: String,
    /// The profile; holds Chromium's log (`stderr.log`) too.
    profile: tempfile::TempDir,
}

impl Chromium {
    /// Starts Chromium and waits for its DevTools endpoint; `None` (after a loud message) when
    /// it cannot.
    pub fn start() -> Option<Chromium> {
        let Some(binary) = find_chromium() else {
            return unavailable(
                "no Chromium found (looked for $FLOWGATE_CHROMIUM, chromium, chromium-browser, google-chrome)",
            );
        };
        let profile = tempfile::tempdir().unwrap();
        let log = File::create(profile.path().join("stderr.log")).unwrap();
        let spawned = Command::new(&binary)
            .args(FLAGS)
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn();
        let child = match spawned {
            Ok(child) => child,
            Err(e) => return unavailable(&format!("{} does not start: {e}", binary.display())),
        };
        let mut chromium = Chromium {
            child,
            endpoint: String::new(),
            profile,
        };
        // Chromium writes the port it picked, and the browser target's path, to this file.
        let port_file = chromium.profile.path().join("DevToolsActivePort");
        let deadline = Instant::now() + START;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = chromium.child.try_wait() {
                let log = chromium.log();
                return unavailable(&format!("Chromium exited ({status}) at start:\n{log}"));
            }
            if let Ok(text) = std::fs::read_to_string(&port_file)
                && let [port, path] = text.lines().collect::<Vec<_>>()[..]
            {
                chromium.endpoint = format!("ws://127.0.0.1:{port}{path}");
                return Some(chromium);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let log = chromium.log();
        unavailable(&format!(
            "Chromium did not open DevTools within {START:?}:\n{log}"
        ))
    }

    /// The end of Chromium's own log.
    pub fn log(&self) -> String {
        let log =
            std::fs::read_to_string(self.profile.path().join("stderr.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// A new tab, attached.
    pub async fn tab(&self) -> Tab {
        let (ws, _) = connect_async(self.endpoint.as_str())
            .await
            .unwrap_or_else(|e| panic!("DevTools at {}: {e}", self.endpoint));
        let mut tab = Tab {
            ws,
            session: None,
            next_id: 0,
        };
        let target = tab
            .call("Target.createTarget", json!({"url": "about:blank"}))
            .await
            .unwrap();
        let attached = tab
            .call(
                "Target.attachToTarget",
                json!({"targetId": target["targetId"], "flatten": true}),
            )
            .await
            .unwrap();
        tab.session = Some(attached["sessionId"].as_str().unwrap().to_owned());
        tab
    }
}

impl Chromium {
    /// Asks the browser to quit (through `tab`, the connection to it), and waits a little for
    /// it and its helper processes to go; whatever is left is killed on drop.
    pub async fn quit(mut self, mut tab: Tab) {
        tab.session = None;
        let _ = tab.call("Browser.close", json!({})).await;
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None)) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Chromium {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One tab over the DevTools protocol: commands by id; events are ignored.
pub struct Tab {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    /// The session of the attached page (`None` while talking to the browser itself).
    session: Option<String>,
    next_id: u64,
}

impl Tab {
    /// Sends one command and waits for its answer: the result, or the protocol's error.
    pub async fn call(&mut self, method: &str, params: Value) -> Result<Value, String> {
        self.next_id += 1;
        let id = self.next_id;
        let mut command = json!({"id": id, "method": method, "params": params});
        if let Some(session) = &self.session {
            command["sessionId"] = json!(session);
        }
        self.ws
            .send(Message::text(command.to_string()))
            .await
            .map_err(|e| e.to_string())?;
        let answer = tokio::time::timeout(CALL, async {
            while let Some(frame) = self.ws.next().await {
                let Ok(Message::Text(text)) = frame else {
                    continue;
                };
                let value: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
                if value["id"] == id {
                    return Ok(value);
                }
            }
            Err("DevTools closed the connection".to_owned())
        })
        .await
        .map_err(|_| format!("{method}: no answer within {CALL:?}"))??;
        match answer.get("error") {
            Some(error) => Err(format!("{method}: {error}")),
            None => Ok(answer["result"].clone()),
        }
    }

    /// Opens `url` in the tab.
    pub async fn navigate(&mut self, url: &str) {
        self.call("Page.navigate", json!({"url": url}))
            .await
            .unwrap();
    }

    /// Runs `body` in the page as a function's body, with `q` for `document.getElementById`:
    /// what it returns, or the exception it threw.
    pub async fn eval(&mut self, body: &str) -> Result<Value, String> {
        let expression =
            format!("(() => {{ const q = (id) => document.getElementById(id); {body} }})()");
        let params = json!({"expression": expression, "returnByValue": true, "awaitPromise": true});
        let result = self.call("Runtime.evaluate", params).await?;
        if let Some(exception) = result.get("exceptionDetails") {
            return Err(format!("{body}: {exception}"));
        }
        Ok(result["result"]["value"].clone())
    }

    /// Runs `body` (as [`eval`](Self::eval) does) until it returns something truthy (errors
    /// while a page loads count as not yet): that value. Panics after `within`, with the last
    /// value seen.
    pub async fn wait_for(&mut self, body: &str, within: Duration) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let value = self.eval(body).await;
            let truthy = match &value {
                Ok(Value::Bool(b)) => *b,
                Ok(Value::Null) => false,
                Ok(Value::Number(n)) => n.as_f64() != Some(0.0),
                Ok(Value::String(s)) => !s.is_empty(),
                Ok(_) => true,
                Err(_) => false,
            };
            if truthy {
                return value.unwrap();
            }
            assert!(
                Instant::now() < deadline,
                "waited {within:?} for `{body}`; last: {value:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Saves a screenshot of the page to `path` (for a person to look at).
    pub async fn screenshot(&mut self, path: &Path) {
        let shot = self
            .call("Page.captureScreenshot", json!({"format": "png"}))
            .await
            .unwrap();
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().unwrap())
            .unwrap();
        std::fs::write(path, png).unwrap();
    }
}
