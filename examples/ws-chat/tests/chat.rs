//! The chat server over real WebSocket connections on loopback: what a flood, a moderator, a
//! name's tabs, a busy room, an oversized or malformed message and too many connections get.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::Server;
use example_ws_chat::Config;
use flowgate::Quota;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream, connect_async};

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// How long a test waits for a frame it expects.
const PATIENCE: Duration = Duration::from_secs(5);
/// How long without frames before a test decides there are no more.
const QUIET: Duration = Duration::from_millis(300);

/// Opens `/ws?{query}` and reads the welcome frame.
async fn join(server: &Server, query: &str) -> Ws {
    let (mut ws, response) = connect_async(format!("ws://{}/ws?{query}", server.addr))
        .await
        .unwrap_or_else(|e| panic!("joining with {query}: {e}"));
    assert_eq!(response.status(), 101);
    let welcome = next(&mut ws, PATIENCE).await.expect("a welcome frame");
    assert_eq!(welcome.json()["type"], "welcome", "{welcome:?}");
    ws
}

/// Tries `/ws?{query}` with extra request headers: the socket, or the HTTP response of a
/// refusal.
async fn attempt(
    server: &Server,
    query: &str,
    headers: &[(&'static str, &str)],
) -> Result<Ws, http::Response<Option<Vec<u8>>>> {
    let mut request = format!("ws://{}/ws?{query}", server.addr)
        .into_client_request()
        .unwrap();
    for (name, value) in headers {
        request.headers_mut().insert(*name, value.parse().unwrap());
    }
    match connect_async(request).await {
        Ok((ws, _)) => Ok(ws),
        Err(tungstenite::Error::Http(response)) => Err(*response),
        Err(e) => panic!("{query}: neither an upgrade nor an HTTP refusal: {e}"),
    }
}

/// The HTTP response refusing `/ws?{query}`.
async fn refused(server: &Server, query: &str) -> http::Response<Option<Vec<u8>>> {
    match attempt(server, query, &[]).await {
        Err(response) => response,
        Ok(_) => panic!("{query}: expected an HTTP refusal, but the upgrade succeeded"),
    }
}

/// A frame from the server.
#[derive(Debug)]
enum Got {
    /// A text frame, parsed.
    Json(Value),
    /// The close frame: code and reason.
    Close(u16, String),
}

impl Got {
    fn json(&self) -> &Value {
        match self {
            Got::Json(value) => value,
            Got::Close(code, reason) => panic!("expected a frame, got the close {code} {reason}"),
        }
    }
}

/// The next text or close frame within `within`; `None` if there is none or the stream ended.
async fn next(ws: &mut Ws, within: Duration) -> Option<Got> {
    loop {
        let frame = tokio::time::timeout(within, ws.next()).await.ok()??;
        match frame.ok()? {
            Message::Text(text) => return Some(Got::Json(serde_json::from_str(&text).unwrap())),
            Message::Close(Some(frame)) => {
                return Some(Got::Close(frame.code.into(), frame.reason.to_string()));
            }
            Message::Close(None) => return Some(Got::Close(1005, String::new())),
            _ => {}
        }
    }
}

/// Every frame until none arrives for [`QUIET`] (or the close, which ends the list).
async fn frames(ws: &mut Ws) -> Vec<Got> {
    let mut out = Vec::new();
    while let Some(got) = next(ws, QUIET).await {
        let closed = matches!(got, Got::Close(..));
        out.push(got);
        if closed {
            break;
        }
    }
    out
}

async fn say(ws: &mut Ws, text: &str) {
    let frame = json!({"type": "chat", "text": text}).to_string();
    ws.send(Message::text(frame)).await.unwrap();
}

/// [`say`] in a flood the server ends with a close code: once it has closed, sending fails
/// (whether the rest of the flood got out first is not the test's to decide; the frames read
/// are). Whether it was sent.
async fn flood(ws: &mut Ws, text: &str) -> bool {
    let frame = json!({"type": "chat", "text": text}).to_string();
    ws.send(Message::text(frame)).await.is_ok()
}

/// The chat lines among `got`, as `(user, text)`.
fn lines(got: &[Got]) -> Vec<(String, String)> {
    got.iter()
        .filter_map(|g| match g {
            Got::Json(v) if v["type"] == "chat" => Some((
                v["user"].as_str().unwrap().to_owned(),
                v["text"].as_str().unwrap().to_owned(),
            )),
            _ => None,
        })
        .collect()
}

/// The error frames among `got`.
fn limited(got: &[Got]) -> Vec<&Value> {
    got.iter()
        .filter_map(|g| match g {
            Got::Json(v) if v["type"] == "rate_limited" => Some(v),
            _ => None,
        })
        .collect()
}

fn close_of(got: &[Got]) -> Option<(u16, &str)> {
    got.iter().find_map(|g| match g {
        Got::Close(code, reason) => Some((*code, reason.as_str())),
        _ => None,
    })
}

#[tokio::test]
async fn a_flood_gets_error_frames_then_the_close() {
    let config = Config::default();
    let server = Server::start(config.clone()).await;
    let mut bob = join(&server, "room=flood&user=bob").await;
    let mut ann = join(&server, "room=flood&user=ann").await;
    for i in 1..=10 {
        if !flood(&mut ann, &format!("m{i}")).await {
            break;
        }
    }
    let got = frames(&mut ann).await;
    // Slowmode lets the first through; the next three get error frames (the three violations
    // tolerated within 10 s); the fourth closes the connection with 4008.
    assert_eq!(
        lines(&got),
        [("ann".to_owned(), "m1".to_owned())],
        "{got:?}"
    );
    let errors = limited(&got);
    assert_eq!(errors.len(), 3, "{got:?}");
    for frame in &errors {
        assert_eq!(frame["scope"], "slowmode");
        assert_eq!(
            (frame["limit"].as_u64(), frame["remaining"].as_u64()),
            (Some(1), Some(0))
        );
        let wait = frame["retry_after_ms"].as_u64().unwrap();
        assert!((1..=2000).contains(&wait), "{frame}");
    }
    assert_eq!(
        close_of(&got),
        Some((4008, config.close_reason.as_str())),
        "{got:?}"
    );
    assert!(matches!(got.last(), Some(Got::Close(..))), "{got:?}");
    assert!(
        next(&mut ann, PATIENCE).await.is_none(),
        "the connection is closed"
    );
    // The room heard the one message that passed, and that ann left.
    let heard = frames(&mut bob).await;
    assert_eq!(
        lines(&heard),
        [("ann".to_owned(), "m1".to_owned())],
        "{heard:?}"
    );
    assert!(
        heard
            .iter()
            .any(|g| matches!(g, Got::Json(v) if v["event"] == "left" && v["user"] == "ann")),
        "{heard:?}"
    );
}

#[tokio::test]
async fn a_moderator_is_not_slowed_but_still_has_a_message_budget() {
    // The demo's burst of 8, refilling slowly enough that the test's pace does not matter.
    let config = Config {
        messages: Quota::per_hour(8),
        ..Config::default()
    };
    let server = Server::start(config).await;
    let mut mo = join(&server, "room=mods&user=mo&role=moderator").await;
    let mut ann = join(&server, "room=mods&user=ann").await;
    for i in 1..=5 {
        say(&mut mo, &format!("mo{i}")).await;
    }
    let got = frames(&mut mo).await;
    assert_eq!(lines(&got).len(), 5, "{got:?}");
    assert!(limited(&got).is_empty(), "{got:?}");
    // A user in the same room, sending twice at once, is slowed.
    say(&mut ann, "a1").await;
    say(&mut ann, "a2").await;
    let got = frames(&mut ann).await;
    let mine: Vec<_> = lines(&got)
        .into_iter()
        .filter(|(u, _)| u == "ann")
        .collect();
    assert_eq!(mine, [("ann".to_owned(), "a1".to_owned())], "{got:?}");
    assert_eq!(limited(&got).len(), 1);
    assert_eq!(limited(&got)[0]["scope"], "slowmode");
    // The moderator's per-connection budget (a burst of 8) still holds: 5 more at once get
    // three through and two error frames from the connection layer, never from slowmode.
    for i in 6..=10 {
        say(&mut mo, &format!("mo{i}")).await;
    }
    let got = frames(&mut mo).await;
    let passed = lines(&got).into_iter().filter(|(u, _)| u == "mo").count();
    let errors = limited(&got);
    assert_eq!((passed, errors.len()), (3, 2), "{got:?}");
    assert!(errors.iter().all(|f| f["scope"] == "connection"), "{got:?}");
    assert_eq!(close_of(&got), None);
}

#[tokio::test]
async fn a_names_tabs_share_one_budget() {
    // The demo's 15 per name, refilling slowly enough that the test's pace does not matter.
    let config = Config {
        user_messages: Quota::per_hour(15),
        ..Config::default()
    };
    let server = Server::start(config).await;
    // A moderator, so slowmode stays out of it, in two rooms so the room budgets do too.
    let mut tab1 = join(&server, "room=one&user=mo&role=moderator").await;
    let mut tab2 = join(&server, "room=two&user=mo&role=moderator").await;
    for i in 1..=8 {
        say(&mut tab1, &format!("t1-{i}")).await;
    }
    assert_eq!(lines(&frames(&mut tab1).await).len(), 8);
    // Each tab is within its own 8, but the name's 15 per 30 s is shared.
    for i in 1..=8 {
        say(&mut tab2, &format!("t2-{i}")).await;
    }
    let got = frames(&mut tab2).await;
    assert_eq!(lines(&got).len(), 7, "{got:?}");
    let errors = limited(&got);
    assert_eq!(errors.len(), 1, "{got:?}");
    assert_eq!(errors[0]["scope"], "user");
    assert_eq!(errors[0]["limit"], 15);
}

#[tokio::test]
async fn members_together_share_the_rooms_budget() {
    let config = Config {
        room_messages: Quota::per_hour(6),
        slowmode: None,
        ..Config::default()
    };
    let server = Server::start(config).await;
    let mut members = Vec::new();
    for user in ["a", "b", "c"] {
        members.push(join(&server, &format!("room=busy&user={user}")).await);
    }
    let mut passed = 0;
    for (n, ws) in members.iter_mut().enumerate() {
        for i in 0..3 {
            say(ws, &format!("{n}-{i}")).await;
        }
        let got = frames(ws).await;
        passed += lines(&got)
            .iter()
            .filter(|(_, text)| text.starts_with(&n.to_string()))
            .count();
        if n == 2 {
            assert_eq!(limited(&got).len(), 3, "{got:?}");
            assert!(limited(&got).iter().all(|f| f["scope"] == "room"));
        }
    }
    assert_eq!(passed, 6);
    // Another room has its own budget.
    let mut elsewhere = join(&server, "room=quiet&user=d").await;
    say(&mut elsewhere, "hello").await;
    assert_eq!(lines(&frames(&mut elsewhere).await).len(), 1);
}

#[tokio::test]
async fn typing_notices_cost_nothing() {
    let server = Server::start(Config::default()).await;
    let mut bob = join(&server, "room=t&user=bob").await;
    let mut ann = join(&server, "room=t&user=ann").await;
    say(&mut ann, "hi").await;
    for _ in 0..20 {
        let typing = json!({"type": "typing"}).to_string();
        ann.send(Message::text(typing)).await.unwrap();
    }
    // Slowmode would reject any second message that cost something within 2 s.
    let got = frames(&mut ann).await;
    assert!(limited(&got).is_empty(), "{got:?}");
    let heard = frames(&mut bob).await;
    let typing = heard
        .iter()
        .filter(|g| matches!(g, Got::Json(v) if v["type"] == "typing"))
        .count();
    assert_eq!(typing, 20, "{heard:?}");
}

#[tokio::test]
async fn an_oversized_message_closes_with_1009() {
    let server = Server::start(Config::default()).await;
    let mut ann = join(&server, "room=big&user=ann").await;
    say(&mut ann, &"x".repeat(4096)).await;
    let got = frames(&mut ann).await;
    assert_eq!(close_of(&got), Some((1009, "message too big")), "{got:?}");
}

#[tokio::test]
async fn too_many_malformed_frames_close_with_1008() {
    let config = Config {
        errors: Quota::per_minute(3),
        slowmode: None,
        ..Config::default()
    };
    let server = Server::start(config).await;
    let mut ann = join(&server, "room=junk&user=ann").await;
    for _ in 0..5 {
        // Closed at the fourth: sending the fifth may fail.
        if ann.send(Message::text("not json")).await.is_err() {
            break;
        }
    }
    let got = frames(&mut ann).await;
    let errors = got
        .iter()
        .filter(|g| matches!(g, Got::Json(v) if v["type"] == "error"))
        .count();
    assert_eq!(errors, 3, "{got:?}");
    assert_eq!(close_of(&got), Some((1008, "too many errors")), "{got:?}");
}

#[tokio::test]
async fn connections_over_the_caps_are_refused_with_429_before_the_upgrade() {
    let server = Server::start(Config::default()).await;
    // New connections per IP: a burst of 10.
    let mut open = Vec::new();
    for i in 0..10 {
        open.push(join(&server, &format!("user=u{i}")).await);
    }
    let response = refused(&server, "user=u10").await;
    assert_eq!(response.status(), 429);
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let retry: u64 = header("retry-after").parse().unwrap();
    assert!((1..=2).contains(&retry), "{retry}");
    assert_eq!(header("ratelimit-policy"), r#""connect";q=10;w=20"#);
    assert!(header("ratelimit").starts_with(r#""connect";r=0;t="#));
    assert_eq!(header("content-type"), "application/problem+json");
    // The address is the client's: from a trusted proxy (loopback), `X-Forwarded-For` counts.
    let other = attempt(
        &server,
        "user=elsewhere",
        &[("x-forwarded-for", "203.0.113.7")],
    )
    .await
    .expect("another client address has its own budget");
    drop((open, other));

    // Concurrent connections per name: 4 tabs.
    let server = Server::start(Config::default()).await;
    let mut tabs = Vec::new();
    for _ in 0..4 {
        tabs.push(join(&server, "user=ann").await);
    }
    let response = refused(&server, "user=ann").await;
    assert_eq!(response.status(), 429);
    let body = String::from_utf8(response.body().clone().unwrap_or_default()).unwrap();
    assert!(
        body.contains(r#""violated-policies":["concurrent_user"]"#),
        "{body}"
    );
    // Closing a tab frees its place.
    tabs.pop().unwrap().close(None).await.unwrap();
    let mut admitted = false;
    for _ in 0..50 {
        if let Ok(ws) = attempt(&server, "user=ann", &[]).await {
            tabs.push(ws);
            admitted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(admitted, "a closed tab gives its place back");
}

#[tokio::test]
async fn a_name_closed_for_flooding_three_times_is_refused_for_a_while() {
    let server = Server::start(Config::default()).await;
    for round in 0..3 {
        let mut eve = join(&server, "room=r&user=eve").await;
        for i in 0..10 {
            if !flood(&mut eve, &format!("{round}-{i}")).await {
                break;
            }
        }
        let got = frames(&mut eve).await;
        assert_eq!(close_of(&got).map(|c| c.0), Some(4008), "{got:?}");
    }
    let response = refused(&server, "room=r&user=eve").await;
    assert_eq!(response.status(), 429);
    let retry = response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(retry, "30");
    let body = String::from_utf8(response.body().clone().unwrap_or_default()).unwrap();
    assert!(
        body.contains(r#""violated-policies":["penalty"]"#),
        "{body}"
    );
    // Others from the same address are still welcome.
    join(&server, "room=r&user=someone").await;
}

#[tokio::test]
async fn bad_names_and_plain_requests_are_answered_without_an_upgrade() {
    let server = Server::start(Config::default()).await;
    let response = refused(&server, "user=a%20b").await;
    assert_eq!(response.status(), 400);
    let response = refused(&server, "user=ann&role=admin").await;
    assert_eq!(response.status(), 400);
    let response = refused(&server, "room=lobby").await;
    assert_eq!(response.status(), 400);
}
