//! The dashboard in a real browser (headless Chromium over the DevTools protocol, through the
//! workspace's one helper, `flowgate_testing::chromium`): while load with denials runs, `/dashboard`
//! must connect to its event stream, draw the chart, show a non-zero denied count and name
//! the most limited key — under its Content-Security-Policy, which the browser enforces (an
//! inline script does not run). With every event stream its address may open taken, the page
//! polls the snapshot instead and still shows the denials.
//!
//! A screenshot goes to the test's temporary directory, and to `docs/img/dashboard.png` with
//! `FLOWGATE_UPDATE_SCREENSHOT=1`. Without Chromium the test says so loudly and passes,
//! unless `FLOWGATE_REQUIRE_CHROMIUM=1`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use flowgate_testing::chromium::Chromium;
use flowgate_testing::server::TestServer;

const EDGE: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 20, name: per_address}
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 30, algorithm: sliding_window, name: per_api_key}
"#;

fn check(key: &str, value: &str) -> String {
    format!(
        r#"{{"domain":"edge","descriptors":[{{"entries":[{{"key":"{key}","value":"{value}"}}]}}]}}"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_the_chart_denials_and_the_top_limited_key() {
    let Some(chromium) = Chromium::start() else {
        return;
    };
    let server = Arc::new(TestServer::start(&[("edge.yaml", EDGE)]).await);

    // Load: one abusive address far over its limit, a noisy API key, and polite clients.
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let (server, stop) = (server.clone(), stop.clone());
        tokio::spawn(async move {
            // Bounded: at most 60 s of load (the test is over long before).
            for round in 0..3000u32 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                for _ in 0..4 {
                    server
                        .post("/v1/check", &check("remote_address", "203.0.113.66"))
                        .await;
                }
                server
                    .post("/v1/check", &check("api_key", "key-noisy"))
                    .await;
                let polite = format!("198.51.100.{}", round % 50);
                server
                    .post("/v1/check", &check("remote_address", &polite))
                    .await;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };

    let mut tab = chromium.tab().await;
    let secs = Duration::from_secs;
    tab.navigate(&format!("http://{}/dashboard", server.http))
        .await;
    tab.wait_for(
        "return document.readyState === 'complete' && q('conn').dataset.state === 'open';",
        secs(10),
    )
    .await;
    // The policy is in force: a script put inline into the page does not run.
    let inline_ran = tab
        .eval(
            "const s = document.createElement('script');
             s.textContent = 'window.inlineRan = true;';
             document.body.append(s);
             return window.inlineRan === true;",
        )
        .await
        .unwrap();
    assert_eq!(inline_ran, serde_json::json!(false), "an inline script ran");
    let denied = tab
        .wait_for(
            "return Number(q('denied-total').dataset.value || 0);",
            secs(10),
        )
        .await;
    assert!(denied.as_f64().unwrap() > 0.0, "{denied}");
    let top = tab
        .wait_for(
            "const row = q('top-keys').tBodies[0].rows[0];
             return row && row.cells[0].textContent;",
            secs(10),
        )
        .await;
    assert_eq!(
        top, "edge/remote_address=203.0.113.66",
        "the heaviest denied key comes first"
    );
    // The chart: a series per rule, drawn over several samples, with a non-zero denied rate.
    let chart = tab
        .wait_for(
            "const c = q('chart');
             return Number(c.dataset.series) === 2 && c.width > 0 && Number(q('denied-rate').textContent) > 0
                 && { series: Number(c.dataset.series), width: c.width, legend: q('legend').textContent };",
            secs(10),
        )
        .await;
    assert!(
        chart["legend"]
            .as_str()
            .unwrap()
            .contains("edge/remote_address"),
        "{chart}"
    );
    // A few seconds of history, so the screenshot shows lines.
    tokio::time::sleep(secs(4)).await;
    let rules = tab
        .eval("return [...q('rules').tBodies[0].rows].map(r => r.cells[1].textContent);")
        .await
        .unwrap();
    assert_eq!(
        rules,
        serde_json::json!(["remote_address (per_address)", "api_key (per_api_key)"]),
        "{rules}"
    );
    let shot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard.png");
    tab.screenshot(&shot).await;
    eprintln!("the dashboard: {}", shot.display());
    if std::env::var("FLOWGATE_UPDATE_SCREENSHOT").as_deref() == Ok("1") {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/img/dashboard.png");
        std::fs::create_dir_all(docs.parent().unwrap()).unwrap();
        std::fs::copy(&shot, &docs).unwrap();
        eprintln!("updated {}", docs.display());
    }
    stop.store(true, Ordering::Relaxed);
    load.await.unwrap();
    chromium.quit(tab).await;
    Arc::try_unwrap(server).ok().unwrap().stop().await;
}

/// Every stream this address may hold is taken (by this test, from the browser's own address):
/// the page's stream is refused, so it polls `/dashboard/snapshot` and still shows the denials.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_every_stream_of_its_address_taken_the_page_polls_and_stays_live() {
    let Some(chromium) = Chromium::start() else {
        return;
    };
    let server = TestServer::start(&[("edge.yaml", EDGE)]).await;
    let mut held = Vec::new();
    for _ in 0..flowgate_server::dashboard::MAX_PER_CLIENT {
        let mut conn = std::net::TcpStream::connect(server.http).unwrap();
        std::io::Write::write_all(
            &mut conn,
            b"GET /dashboard/events HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n",
        )
        .unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut head = [0u8; 12];
        std::io::Read::read_exact(&mut conn, &mut head).unwrap();
        assert_eq!(&head, b"HTTP/1.1 200", "the test's own stream");
        held.push(conn);
    }
    // 30 a minute are allowed: the last 5 are denied.
    for _ in 0..35 {
        server
            .post("/v1/check", &check("api_key", "key-noisy"))
            .await;
    }
    let mut tab = chromium.tab().await;
    tab.navigate(&format!("http://{}/dashboard", server.http))
        .await;
    tab.wait_for(
        "return q('conn').dataset.state === 'polling';",
        Duration::from_secs(10),
    )
    .await;
    let denied = tab
        .wait_for(
            "return Number(q('denied-total').dataset.value || 0);",
            Duration::from_secs(10),
        )
        .await;
    assert!(denied.as_f64().unwrap() > 0.0, "{denied}");
    // Still polling (the streams are still held), and the table is filled.
    let rules = tab
        .eval("return q('conn').dataset.state + ' ' + q('rules').tBodies[0].rows.length;")
        .await
        .unwrap();
    assert_eq!(rules, serde_json::json!("polling 2"));
    drop(held);
    chromium.quit(tab).await;
    server.stop().await;
}
