//! The chat page in a real browser: headless Chromium, driven over the DevTools protocol (a
//! WebSocket; the client is the tests' own tokio-tungstenite), joins a room through the login
//! form, floods, and must show the rate-limited notice counting `retry_after_ms` down with the
//! send button disabled, re-enable it at zero, and show the server's close code and reason.
//!
//! Chromium is looked for as `$FLOWGATE_CHROMIUM`, else `chromium`, `chromium-browser`,
//! `google-chrome-stable` or `google-chrome` on `PATH` (Debian: `apt-get install chromium`).
//! When it is missing or does not start, the test prints a loud message and passes — unless
//! `FLOWGATE_REQUIRE_CHROMIUM=1`, which makes that a failure (CI sets it).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use common::Server;
use example_ws_chat::Config;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream, connect_async};

/// The flags that keep Chromium from reaching for the network (there is none: without them it
/// hangs on lookups) or for a GPU and a sandbox (containers have neither).
const FLAGS: &[&str] = &[
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

/// How long Chromium may take to start, and one DevTools call to answer.
const START: Duration = Duration::from_secs(30);
const CALL: Duration = Duration::from_secs(15);

/// Says loudly why the browser test does not run — or fails, when it is required.
fn unavailable<T>(why: &str) -> Option<T> {
    if std::env::var("FLOWGATE_REQUIRE_CHROMIUM").as_deref() == Ok("1") {
        panic!("the browser test needs Chromium but FLOWGATE_REQUIRE_CHROMIUM=1: {why}");
    }
    eprintln!(
        "\n!!!!!!!! SKIPPED the ws-chat browser test: {why} (apt-get install chromium; set FLOWGATE_REQUIRE_CHROMIUM=1 to make this an error) !!!!!!!!\n"
    );
    None
}

/// The Chromium to run, if there is one.
fn find_chromium() -> Option<PathBuf> {
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
struct Chromium {
    child: Child,
    /// The browser's DevTools endpoint, `ws://127.0.0.1:PORT/devtools/browser/ID`.
    endpoint: String,
    /// The profile; holds Chromium's log (`stderr.log`) too.
    profile: tempfile::TempDir,
}

impl Chromium {
    /// Starts Chromium and waits for its DevTools endpoint; `None` (after a loud message) when
    /// it cannot.
    fn start() -> Option<Chromium> {
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
    fn log(&self) -> String {
        let log =
            std::fs::read_to_string(self.profile.path().join("stderr.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// A new tab, attached.
    async fn tab(&self) -> Tab {
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
    async fn quit(mut self, mut tab: Tab) {
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
struct Tab {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    /// The session of the attached page (`None` while talking to the browser itself).
    session: Option<String>,
    next_id: u64,
}

impl Tab {
    /// Sends one command and waits for its answer: the result, or the protocol's error.
    async fn call(&mut self, method: &str, params: Value) -> Result<Value, String> {
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

    async fn navigate(&mut self, url: &str) {
        self.call("Page.navigate", json!({"url": url}))
            .await
            .unwrap();
    }

    /// Runs `body` in the page as a function's body, with `q` for `document.getElementById`:
    /// what it returns, or the exception it threw.
    async fn eval(&mut self, body: &str) -> Result<Value, String> {
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
    async fn wait_for(&mut self, body: &str, within: Duration) -> Value {
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
    async fn screenshot(&mut self, path: &Path) {
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

#[tokio::test]
async fn the_page_counts_the_wait_down_and_shows_the_close() {
    let Some(chromium) = Chromium::start() else {
        return;
    };
    let server = Server::start(Config::default()).await;
    let mut tab = chromium.tab().await;
    let secs = Duration::from_secs;

    // Without a name, the page asks for one; the form joins the room in the URL.
    tab.navigate(&format!("http://{}/?room=browser", server.addr))
        .await;
    tab.wait_for(
        "return document.readyState === 'complete' && !q('login').hidden;",
        secs(10),
    )
    .await;
    tab.eval("q('name').value = 'tester'; q('login-form').requestSubmit(); return true;")
        .await
        .unwrap();
    tab.wait_for(
        "return location.search.includes('user=tester') && q('status').dataset.state === 'open';",
        secs(10),
    )
    .await;
    let limits = tab
        .wait_for("return q('limit-list').textContent;", secs(5))
        .await;
    assert!(
        limits.as_str().unwrap().contains("Slowmode"),
        "the welcome frame's limits are listed: {limits}"
    );

    // Two messages at once through the form: the first is posted, slowmode rejects the second.
    tab.eval(
        "q('text').value = 'first'; q('send-form').requestSubmit();
         q('text').value = 'second'; q('send-form').requestSubmit(); return true;",
    )
    .await
    .unwrap();
    let notice = "const ms = Number(q('countdown').dataset.ms);
        return !q('notice').hidden && q('send').disabled && ms > 0
            && { ms, text: q('notice').textContent, countdown: q('countdown').textContent };";
    let first = tab.wait_for(notice, secs(5)).await;
    let shot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ws-chat-notice.png");
    tab.screenshot(&shot).await;
    eprintln!("the page with the notice: {}", shot.display());
    let text = first["text"].as_str().unwrap();
    assert!(
        text.contains("Slowmode") && text.contains("\"slowmode\""),
        "{first}"
    );
    let shown: f64 = first["countdown"]
        .as_str()
        .unwrap()
        .trim_end_matches(" s")
        .parse()
        .unwrap_or_else(|_| panic!("the countdown reads like \"1.8 s\": {first}"));
    let first_ms = first["ms"].as_f64().unwrap();
    assert!(
        first_ms <= 2000.0 && (shown * 1000.0 - first_ms).abs() <= 100.0,
        "{first}"
    );
    // Live: half a second later the countdown is lower, and still running.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let later = tab.eval(notice).await.unwrap();
    let later_ms = later["ms"].as_f64().unwrap_or(0.0);
    assert!(
        later_ms > 0.0 && first_ms - later_ms >= 300.0,
        "the countdown runs: {first} then {later}"
    );
    let posted = tab
        .eval("return [...document.querySelectorAll('#log li.msg')].map(li => li.textContent);")
        .await
        .unwrap();
    assert_eq!(
        posted,
        json!(["tester: first"]),
        "only the first was posted"
    );
    // At zero the notice goes and the button comes back.
    tab.wait_for("return q('notice').hidden && !q('send').disabled;", secs(5))
        .await;

    // A flood: error frames, then the server closes with 4008, and the page says so.
    tab.eval("q('flood').click(); return true;").await.unwrap();
    let status = tab
        .wait_for(
            "return q('status').dataset.closeCode === '4008' && q('status').textContent;",
            secs(10),
        )
        .await;
    let status = status.as_str().unwrap();
    let shot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ws-chat-closed.png");
    tab.screenshot(&shot).await;
    eprintln!("the page after the close: {}", shot.display());
    assert!(
        status.contains("4008") && status.contains("rate limited: too many rejected messages"),
        "{status}"
    );
    let state = tab
        .eval(
            "return {
                rejected: [...document.querySelectorAll('#log li.sys')]
                    .filter(li => li.textContent.startsWith('not sent')).length,
                disabled: q('send').disabled,
                reconnect: !q('reconnect').hidden,
            };",
        )
        .await
        .unwrap();
    assert!(state["rejected"].as_u64().unwrap() >= 3, "{state}");
    assert_eq!(
        (&state["disabled"], &state["reconnect"]),
        (&json!(true), &json!(true)),
        "{state}"
    );
    chromium.quit(tab).await;
}
