//! The chat page in a real browser: headless Chromium, driven over the DevTools protocol (a
//! WebSocket; the client is the tests' own tokio-tungstenite), joins a room through the login
//! form, floods, and must show the rate-limited notice counting `retry_after_ms` down with the
//! send button disabled, re-enable it at zero, and show the server's close code and reason.
//!
//! The browser comes from the workspace's one helper, `flowgate_testing::chromium`: without Chromium
//! the test prints a loud message and passes — unless `FLOWGATE_REQUIRE_CHROMIUM=1`, which
//! makes that a failure (CI sets it).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::Server;
use example_ws_chat::Config;
use flowgate_testing::chromium::Chromium;
use serde_json::json;

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
