//! The WebSocket gateway: real WebSocket clients over loopback, through `flowgate serve`'s
//! WebSocket listener, to a real echo upstream. Upgrades are admitted or refused with 429,
//! messages are judged per connection, user, room and slowmode, violations close with the
//! configured code, sizes close with 1009, slow readers meet their policy, and every
//! disconnect path releases the connection's state.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use flowgate_server::api::Service;
use flowgate_server::backend::Backend;
use flowgate_server::config;
use flowgate_server::gateway::ws::{WsGateway, serve};
use flowgate_testing::server::TestServer;
use flowgate_testing::ws::{
    EchoUpstream, Got, connect, is_error_frame, next, open, send, try_send,
};

/// A configuration with a `websocket` section relaying to `upstream`; `body` is indented
/// under it.
fn yaml(upstream: &str, body: &str) -> String {
    let mut out = format!("domain: chat\nwebsocket:\n  upstream: {upstream}\n");
    for line in body.lines() {
        out.push_str("  ");
        out.push_str(line);
        out.push('\n');
    }
    out
}

async fn start(upstream: &EchoUpstream, body: &str) -> (TestServer, std::net::SocketAddr) {
    let server = TestServer::start(&[("chat.yaml", &yaml(&upstream.url(), body))]).await;
    let addr = server.websocket.expect("a websocket listener");
    (server, addr)
}

/// Waits (bounded) until the gateway's limiters hold no session, IP or user.
async fn wait_released(server: &TestServer) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = server.get("/metrics").await.body;
        let tracked: f64 = ["sessions", "ips", "users"]
            .iter()
            .map(|w| metric_in(&text, &format!("flowgate_ws_tracked{{what=\"{w}\"}}")))
            .sum();
        if tracked == 0.0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "state still held: {tracked} entries\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn metric_in(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_client_gets_error_frames_then_the_close_code_and_its_room_mate_is_unaffected() {
    let upstream = EchoUpstream::start().await;
    let (server, addr) = start(
        &upstream,
        "user: {source: header, name: x-user}\nroom: {source: query, name: room}\nlimits:\n  messages: {limit: 5, per: 1h}\n  close_after: {violations: 10, within: 1h}\n  close_code: 4008\n  close_reason: slow down",
    )
    .await;
    let mut flooder = open(addr, "/chat?room=lobby", &[("x-user", "flood")]).await;
    let mut calm = open(addr, "/chat?room=lobby", &[("x-user", "calm")]).await;
    // 50 messages in one second.
    let started = Instant::now();
    for i in 0..50 {
        // Closed by the gateway midway: it waits a while for the close to be answered, then
        // drops the connection, and sending fails; what was read before is what counts.
        if !try_send(&mut flooder, &format!("m{i}")).await {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(started.elapsed() < Duration::from_secs(5));
    let (mut echoes, mut errors) = (0, 0);
    let close = loop {
        match next(&mut flooder).await {
            Got::Text(t) if t.starts_with('m') => echoes += 1,
            got if is_error_frame(&got, "connection") => errors += 1,
            Got::Close(code, reason) => break (code, reason),
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(echoes, 5, "the burst is forwarded");
    assert_eq!(errors, 10, "K rejections get error frames, the next closes");
    assert_eq!(close, (4008, "slow down".to_owned()));
    // The room mate is unaffected.
    for i in 0..5 {
        send(&mut calm, &format!("c{i}")).await;
        assert_eq!(next(&mut calm).await, Got::Text(format!("c{i}")));
    }
    assert_eq!(
        upstream.received.load(std::sync::atomic::Ordering::SeqCst),
        10
    );
    drop(calm);
    wait_released(&server).await;
    let text = server.get("/metrics").await.body;
    assert_eq!(
        metric_in(&text, "flowgate_ws_closes_total{code=\"4008\"}"),
        1.0
    );
    assert_eq!(
        metric_in(
            &text,
            "flowgate_ws_decisions_total{direction=\"inbound\",scope=\"connection\",outcome=\"rejected\"}"
        ),
        11.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_clients_within_their_own_limits_trip_the_room_limit() {
    let upstream = EchoUpstream::start().await;
    let (server, addr) = start(
        &upstream,
        "room: {source: path}\nlimits:\n  messages: {limit: 5, per: 1s}\n  room_messages: {limit: 100, per: 1h}",
    )
    .await;
    let mut clients = Vec::new();
    for _ in 0..200 {
        clients.push(open(addr, "/rooms/busy", &[]).await);
    }
    for ws in &mut clients {
        send(ws, "hi").await;
    }
    let (mut forwarded, mut room_errors) = (0, 0);
    for ws in &mut clients {
        match next(ws).await {
            Got::Text(t) if t == "hi" => forwarded += 1,
            got if is_error_frame(&got, "room") => room_errors += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!((forwarded, room_errors), (100, 100));
    // Another room is not affected.
    let mut other = open(addr, "/rooms/quiet", &[]).await;
    send(&mut other, "hello").await;
    assert_eq!(next(&mut other).await, Got::Text("hello".into()));
    drop((clients, other));
    wait_released(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowmode_spaces_one_users_messages_and_a_moderator_is_exempt() {
    let upstream = EchoUpstream::start().await;
    let (_server, addr) = start(
        &upstream,
        "user: {source: header, name: x-user}\nrole: {source: header, name: x-role}\nroom: {source: query, name: room}\nlimits:\n  slowmode: 10s\n  slowmode_exempt: [moderator]",
    )
    .await;
    let mut ann = open(addr, "/?room=r1", &[("x-user", "ann")]).await;
    send(&mut ann, "one").await;
    assert_eq!(next(&mut ann).await, Got::Text("one".into()));
    send(&mut ann, "two").await;
    let got = next(&mut ann).await;
    assert!(is_error_frame(&got, "slowmode"), "{got:?}");
    let Got::Text(frame) = got else {
        unreachable!()
    };
    let retry: u64 = serde_json::from_str::<serde_json::Value>(&frame).unwrap()["retry_after_ms"]
        .as_u64()
        .unwrap();
    assert!((9_000..=10_000).contains(&retry), "{retry}");
    // Slowmode is per room: ann may speak in another room at once.
    let mut ann2 = open(addr, "/?room=r2", &[("x-user", "ann")]).await;
    send(&mut ann2, "elsewhere").await;
    assert_eq!(next(&mut ann2).await, Got::Text("elsewhere".into()));
    let mut moderator = open(
        addr,
        "/?room=r1",
        &[("x-user", "mo"), ("x-role", "moderator")],
    )
    .await;
    for i in 0..3 {
        send(&mut moderator, &format!("mod{i}")).await;
        assert_eq!(next(&mut moderator).await, Got::Text(format!("mod{i}")));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn excess_upgrades_from_one_ip_get_429_with_retry_after_and_the_concurrent_cap_holds() {
    let upstream = EchoUpstream::start().await;
    let (server, addr) = start(
        &upstream,
        "limits:\n  connections_per_ip: {limit: 10, per: 1h}\n  concurrent_per_ip: 5",
    )
    .await;
    // Five held open; the sixth is over the concurrent cap.
    let mut held = Vec::new();
    for _ in 0..5 {
        held.push(open(addr, "/", &[]).await);
    }
    let Err((status, headers)) = connect(addr, "/", &[]).await else {
        panic!("the sixth connection was admitted");
    };
    assert_eq!(status, 429);
    assert_eq!(headers["retry-after"], "1");
    assert!(
        headers.get("ratelimit").is_none(),
        "a cap has no counts to show"
    );
    assert_eq!(
        upstream.received.load(std::sync::atomic::Ordering::SeqCst),
        0
    );
    drop(held);
    wait_released(&server).await;
    // 30 attempts in a burst: the rate allows 10 in all (5 were used).
    let (mut admitted, mut refused) = (5, 0);
    for _ in 0..25 {
        match connect(addr, "/", &[]).await {
            Ok(ws) => {
                admitted += 1;
                drop(ws);
            }
            Err((status, headers)) => {
                assert_eq!(status, 429);
                let retry: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
                assert!((1..=360).contains(&retry), "{retry}");
                assert_eq!(headers["ratelimit-policy"], r#""connect";q=10;w=3600"#);
                assert!(headers["ratelimit"].to_str().unwrap().contains("r=0"));
                refused += 1;
            }
        }
    }
    assert_eq!(admitted, 10);
    assert_eq!(refused, 20);
    let text = server.get("/metrics").await.body;
    assert_eq!(
        metric_in(
            &text,
            "flowgate_ws_refused_upgrades_total{scope=\"connect\"}"
        ),
        20.0
    );
    assert_eq!(
        metric_in(
            &text,
            "flowgate_ws_refused_upgrades_total{scope=\"concurrent_ip\"}"
        ),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_users_three_connections_share_one_budget() {
    let upstream = EchoUpstream::start().await;
    let (server, addr) = start(
        &upstream,
        "user: {source: header, name: x-user}\nlimits:\n  user_messages: {limit: 10, per: 1h}",
    )
    .await;
    let mut sockets = Vec::new();
    for _ in 0..3 {
        sockets.push(open(addr, "/", &[("x-user", "ann")]).await);
    }
    let (mut forwarded, mut rejected) = (0, 0);
    for round in 0..5 {
        for ws in &mut sockets {
            send(ws, &format!("r{round}")).await;
            match next(ws).await {
                Got::Text(t) if t.starts_with('r') => forwarded += 1,
                got if is_error_frame(&got, "user") => rejected += 1,
                other => panic!("unexpected {other:?}"),
            }
        }
    }
    assert_eq!((forwarded, rejected), (10, 5));
    // Another user has a budget of their own.
    let mut bob = open(addr, "/", &[("x-user", "bob")]).await;
    send(&mut bob, "hi").await;
    assert_eq!(next(&mut bob).await, Got::Text("hi".into()));
    drop((sockets, bob));
    wait_released(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_message_gets_a_1009_close_frame() {
    let upstream = EchoUpstream::start().await;
    let (server, addr) = start(&upstream, "limits:\n  max_message_size: 100").await;
    let mut ws = open(addr, "/", &[]).await;
    send(&mut ws, &"x".repeat(100)).await;
    assert_eq!(next(&mut ws).await, Got::Text("x".repeat(100)));
    send(&mut ws, &"x".repeat(101)).await;
    assert_eq!(
        next(&mut ws).await,
        Got::Close(1009, "message too big".into())
    );
    // Much larger: the WebSocket library's bound, the same close.
    let mut ws = open(addr, "/", &[]).await;
    send(&mut ws, &"y".repeat(100_000)).await;
    assert!(matches!(next(&mut ws).await, Got::Close(1009, _)));
    wait_released(&server).await;
    assert_eq!(
        server
            .metric("flowgate_ws_closes_total{code=\"1009\"}")
            .await,
        2.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_types_cost_is_charged_and_unsubscribe_is_never_rejected() {
    let upstream = EchoUpstream::start().await;
    let (_server, addr) = start(
        &upstream,
        "classify: {type: /type}\nlimits:\n  messages: {limit: 10, per: 1h}\n  costs: {subscribe: 5}\n  release: [unsubscribe]",
    )
    .await;
    let mut ws = open(addr, "/", &[]).await;
    let subscribe = r#"{"type":"subscribe","channel":"btc"}"#;
    for _ in 0..2 {
        send(&mut ws, subscribe).await;
        assert_eq!(next(&mut ws).await, Got::Text(subscribe.into()));
    }
    // 10 units used by two subscribes: a chat message (cost 1) is over.
    send(&mut ws, r#"{"type":"chat"}"#).await;
    assert!(is_error_frame(&next(&mut ws).await, "connection"));
    let unsubscribe = r#"{"type":"unsubscribe"}"#;
    for _ in 0..3 {
        send(&mut ws, unsubscribe).await;
        assert_eq!(next(&mut ws).await, Got::Text(unsubscribe.into()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_counts_but_forwards() {
    let upstream = EchoUpstream::start().await;
    let (server, addr) = start(
        &upstream,
        "limits:\n  messages: {limit: 2, per: 60s}\n  dry_run: [connection]",
    )
    .await;
    let mut ws = open(addr, "/", &[]).await;
    for i in 0..5 {
        send(&mut ws, &format!("d{i}")).await;
        assert_eq!(next(&mut ws).await, Got::Text(format!("d{i}")));
    }
    let text = server.get("/metrics").await.body;
    let series = |outcome: &str| {
        metric_in(
            &text,
            &format!(
                "flowgate_ws_decisions_total{{direction=\"inbound\",scope=\"connection\",outcome=\"{outcome}\"}}"
            ),
        )
    };
    assert_eq!((series("allowed"), series("dry_run")), (2.0, 3.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reloaded_websocket_section_applies_without_restart_and_a_broken_one_is_rejected() {
    let upstream = EchoUpstream::start().await;
    let (server, addr) = start(&upstream, "limits:\n  messages: {limit: 100, per: 60s}").await;
    let mut before = open(addr, "/", &[]).await;
    for _ in 0..3 {
        send(&mut before, "a").await;
        assert_eq!(next(&mut before).await, Got::Text("a".into()));
    }
    let path = server.files[0].clone();
    std::fs::write(
        &path,
        yaml(&upstream.url(), "limits:\n  messages: {limit: 1, per: 60s}"),
    )
    .unwrap();
    wait_version(&server, 2).await;
    let mut after = open(addr, "/", &[]).await;
    send(&mut after, "b").await;
    assert_eq!(next(&mut after).await, Got::Text("b".into()));
    send(&mut after, "b").await;
    assert!(is_error_frame(&next(&mut after).await, "connection"));
    // A broken section: rejected with its position, the running one stays.
    std::fs::write(
        &path,
        yaml(
            &upstream.url(),
            "limits:\n  messages: {limit: 1, per: 60 parsecs}",
        ),
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while server
        .metric("flowgate_config_reloads_total{result=\"failed\",source=\"files\"}")
        .await
        < 1.0
    {
        assert!(
            Instant::now() < deadline,
            "the broken file was never rejected"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut still = open(addr, "/", &[]).await;
    send(&mut still, "c").await;
    assert_eq!(next(&mut still).await, Got::Text("c".into()));
    send(&mut still, "c").await;
    assert!(is_error_frame(&next(&mut still).await, "connection"));
}

async fn wait_version(server: &TestServer, version: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let current = server.get("/v1/config").await.json()["version"].as_u64();
        if current == Some(version) {
            return;
        }
        assert!(Instant::now() < deadline, "version {version} never came");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[test]
fn config_errors_name_file_line_column_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ws.yaml");
    let cases = [
        (
            "domain: d\nwebsocket:\n  upstream: http://x:1\n",
            ":3:13: `websocket.upstream`: `http://x:1`: only ws:// upstreams are supported",
        ),
        (
            "domain: d\nwebsocket:\n  upstream: ws://x:1\n  limits:\n    messages: {limit: 5, per: soon}\n",
            ":5:31: `websocket.limits.messages.per`: `soon` is not a duration",
        ),
        (
            "domain: d\nwebsocket:\n  upstream: ws://x:1\n  limits:\n    close_code: 1005\n",
            ":5:17: `websocket.limits.close_code`: close code 1005 cannot be sent",
        ),
        (
            "domain: d\nwebsocket:\n  upstream: ws://x:1\n  slow_reader: sometimes\n",
            ":4:16: `websocket.slow_reader`: unknown policy `sometimes`",
        ),
        (
            "domain: d\nwebsocket:\n  upstream: ws://x:1\n  user: {source: jwt_claim, name: sub}\n",
            ":4:18: `websocket.user.source`: `jwt_claim` needs a `websocket.jwt` block",
        ),
        (
            "domain: d\nwebsocket:\n  upstream: ws://x:1\n  limits:\n    messages: {limit: 2, per: 1s}\n    costs: {subscribe: 5}\n",
            ":6:12: `websocket.limits.costs`: a message cost of 5 can never be granted",
        ),
        (
            "domain: d\nwebsocket:\n  upstream: ws://x:1\n  outbound:\n    concurrent_per_ip: 3\n",
            ":5:24: `websocket.outbound.concurrent_per_ip`: limits the upgrade",
        ),
        (
            "domain: d\nwebsocket:\n  upstream: ws://x:1\n  limits:\n    dry_run: [everything]\n",
            ":5:15: `websocket.limits.dry_run`: unknown layer `everything`",
        ),
        (
            "domain: d\nwebsocket:\n  listen: 127.0.0.1:1\n",
            ":3:3: `websocket.upstream`: is required",
        ),
        (
            "domain: d\nwebsocket:\n  upstream: ws://x:1\n  limits:\n    errors: {limit: 3, per: 1m}\n",
            ":5:13: `websocket.limits.errors`: the gateway closes a connection at its first protocol error",
        ),
    ];
    for (text, expected) in cases {
        std::fs::write(&path, text).unwrap();
        let error = config::load(std::slice::from_ref(&path))
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with(&path.display().to_string()) && error.contains(expected),
            "for\n{text}\nexpected …{expected}…\ngot {error}"
        );
    }
}

/// A gateway served directly, so that the test holds the [`WsGateway`] and can count the
/// limiters' state after each way a connection ends.
struct Direct {
    gateway: Arc<WsGateway>,
    addr: std::net::SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    served: tokio::task::JoinHandle<std::io::Result<()>>,
}

async fn direct(upstream: &EchoUpstream, body: &str) -> Direct {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ws.yaml");
    std::fs::write(&path, yaml(&upstream.url(), body)).unwrap();
    let policy = config::load(&[path]).unwrap();
    let service = Arc::new(Service::new(policy, Backend::default()));
    let gateway = WsGateway::new(service);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let acceptor = flowgate_server::listen::Acceptor::new(
        listener,
        flowgate_server::listen::ListenLimits::default(),
        flowgate_server::listen::ListenerMetrics::default(),
    );
    let served = tokio::spawn(serve(
        acceptor,
        gateway.clone(),
        async {
            let _ = stopped.await;
        },
        Duration::from_secs(5),
    ));
    Direct {
        gateway,
        addr,
        stop: Some(stop),
        served,
    }
}

impl Direct {
    async fn released(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.gateway.live() != (0, 0, 0) || self.gateway.totals().relays != 0 {
            assert!(
                Instant::now() < deadline,
                "state still held: {:?}",
                self.gateway.live()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_disconnect_path_releases_the_connections_state() {
    let upstream = EchoUpstream::start().await;
    let mut d = direct(
        &upstream,
        "user: {source: header, name: x-user}\nidle_timeout: 300ms\nlimits:\n  messages: {limit: 100, per: 1s}\n  concurrent_per_user: 10\n  max_message_size: 64",
    )
    .await;
    let user = [("x-user", "ann")];
    // A close from the client.
    let mut ws = open(d.addr, "/", &user).await;
    send(&mut ws, "x").await;
    assert_eq!(next(&mut ws).await, Got::Text("x".into()));
    assert_eq!(d.gateway.live(), (1, 1, 1));
    ws.close(None).await.unwrap();
    d.released().await;
    // The client's connection breaks (no close frame).
    let ws = open(d.addr, "/", &user).await;
    drop(ws);
    d.released().await;
    // A protocol violation: a message too big.
    let mut ws = open(d.addr, "/", &user).await;
    send(&mut ws, &"z".repeat(65)).await;
    assert_eq!(
        next(&mut ws).await,
        Got::Close(1009, "message too big".into())
    );
    d.released().await;
    // The idle timeout.
    let mut ws = open(d.addr, "/", &user).await;
    assert_eq!(next(&mut ws).await, Got::Close(1001, "idle timeout".into()));
    d.released().await;
    // Counted by code: the broken connection (1001 to the upstream), the 1009, the idle
    // timeout; a close the client sent itself is passed on, not counted.
    let closes = d.gateway.totals().inbound;
    assert_eq!((closes.closes(1001), closes.closes(1009)), (2, 1));
    // Server shutdown: both sides get 1001, the gateway returns, nothing is held.
    let mut ws = open(d.addr, "/", &user).await;
    send(&mut ws, "y").await;
    assert_eq!(next(&mut ws).await, Got::Text("y".into()));
    let _ = d.stop.take().unwrap().send(());
    assert_eq!(
        next(&mut ws).await,
        Got::Close(1001, "server shutting down".into())
    );
    tokio::time::timeout(Duration::from_secs(10), &mut d.served)
        .await
        .expect("the gateway stops")
        .unwrap()
        .unwrap();
    assert_eq!(d.gateway.live(), (0, 0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reader_is_closed_with_1013_or_has_messages_dropped_and_memory_stays_bounded() {
    let upstream = EchoUpstream::start().await;
    // The client reads nothing while the upstream sends 64 MiB: far more than the kernel's
    // socket buffers and the gateway's 8 messages.
    let d = direct(
        &upstream,
        "buffer: {messages: 8, bytes: 1048576}\nslow_reader: close",
    )
    .await;
    let mut ws = open(d.addr, "/", &[]).await;
    send(&mut ws, "flood:1024:65536").await;
    let mut binaries = 0;
    let close = loop {
        match next(&mut ws).await {
            Got::Binary(_) => {
                if binaries == 0 {
                    // Stall: let the buffers fill.
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                binaries += 1;
            }
            Got::Close(code, _) => break code,
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(close, 1013);
    assert!(binaries < 1024, "{binaries}");
    assert_eq!(d.gateway.totals().slow[1][2], 1);
    d.released().await;

    let d = direct(
        &upstream,
        "buffer: {messages: 8, bytes: 1048576}\nslow_reader: drop",
    )
    .await;
    let mut ws = open(d.addr, "/", &[]).await;
    send(&mut ws, "flood:1024:65536").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Read what was not dropped, until the flood is over.
    let mut binaries = 0;
    while let Ok(got) = tokio::time::timeout(Duration::from_millis(500), next(&mut ws)).await {
        assert_eq!(got, Got::Binary(65536));
        binaries += 1;
    }
    let dropped = d.gateway.totals().slow[1][1];
    assert!(
        dropped > 0 && binaries + dropped as usize == 1024,
        "{binaries} + {dropped}"
    );
    // The connection stays usable.
    send(&mut ws, "still here").await;
    assert_eq!(next(&mut ws).await, Got::Text("still here".into()));
}

/// `dry_run: [connect, concurrent_ip]`: what those layers would refuse is admitted, and
/// counted where message-layer dry runs are (`flowgate_ws_decisions_total{outcome="dry_run"}`),
/// never as a refused upgrade.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_of_the_upgrade_layers_admits_and_is_counted() {
    let upstream = EchoUpstream::start().await;
    let (server, addr) = start(
        &upstream,
        "limits:\n  connections_per_ip: {limit: 2, per: 1h}\n  concurrent_per_ip: 3\n  dry_run: [connect, concurrent_ip]",
    )
    .await;
    let mut held = Vec::new();
    for _ in 0..5 {
        held.push(open(addr, "/", &[]).await);
    }
    let text = server.get("/metrics").await.body;
    let decisions = |scope: &str, outcome: &str| {
        metric_in(
            &text,
            &format!(
                "flowgate_ws_decisions_total{{direction=\"inbound\",scope=\"{scope}\",outcome=\"{outcome}\"}}"
            ),
        )
    };
    assert_eq!(decisions("connect", "allowed"), 2.0, "{text}");
    assert_eq!(decisions("connect", "dry_run"), 3.0, "{text}");
    assert_eq!(decisions("concurrent_ip", "allowed"), 3.0);
    assert_eq!(decisions("concurrent_ip", "dry_run"), 2.0);
    assert_eq!(
        metric_in(
            &text,
            "flowgate_ws_refused_upgrades_total{scope=\"connect\"}"
        ),
        0.0
    );
    drop(held);
    wait_released(&server).await;
}

#[test]
fn the_documented_websocket_section_is_valid() {
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/service.md"
    ))
    .unwrap();
    let section = doc.split("## WebSocket gateway").nth(1).unwrap();
    let yaml = section
        .split("```yaml\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .unwrap();
    // The example names its secret's variable; any variable that is set will do here.
    let yaml = yaml.replace("JWT_SECRET", "PATH");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("chat.yaml");
    std::fs::write(&path, yaml).unwrap();
    let policy = config::load(&[path]).unwrap_or_else(|e| panic!("{e}"));
    let ws = policy.websocket.unwrap();
    assert_eq!(ws.limits.close_code, 4008);
    assert!(ws.outbound.is_some());
    ws.limits.build().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reader_with_pause_gets_everything_through_backpressure() {
    let upstream = EchoUpstream::start().await;
    let d = direct(
        &upstream,
        "buffer: {messages: 8, bytes: 1048576}\nslow_reader: pause",
    )
    .await;
    let mut ws = open(d.addr, "/", &[]).await;
    send(&mut ws, "flood:1024:65536").await;
    // Read nothing for a while: the gateway stops reading the upstream instead of buffering.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for _ in 0..1024 {
        assert_eq!(next(&mut ws).await, Got::Binary(65536));
    }
    let totals = d.gateway.totals();
    assert!(totals.slow[1][0] >= 1, "reading paused: {:?}", totals.slow);
    assert_eq!((totals.slow[1][1], totals.slow[1][2]), (0, 0));
    send(&mut ws, "after").await;
    assert_eq!(next(&mut ws).await, Got::Text("after".into()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbound_limits_drop_what_the_upstream_sends_beyond_them() {
    let upstream = EchoUpstream::start().await;
    let (server, addr) = start(&upstream, "outbound:\n  messages: {limit: 3, per: 1h}").await;
    let mut ws = open(addr, "/", &[]).await;
    send(&mut ws, "flood:10:16").await;
    for _ in 0..3 {
        assert_eq!(next(&mut ws).await, Got::Binary(16));
    }
    // The other 7 were dropped (counted), and nothing else arrives.
    let quiet = tokio::time::timeout(Duration::from_millis(300), next(&mut ws)).await;
    assert!(quiet.is_err(), "{quiet:?}");
    assert_eq!(
        server
            .metric(
                "flowgate_ws_decisions_total{direction=\"outbound\",scope=\"connection\",outcome=\"rejected\"}"
            )
            .await,
        7.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_closed_for_violations_is_refused_by_the_penalty_box() {
    let upstream = EchoUpstream::start().await;
    let (server, addr) = start(
        &upstream,
        "user: {source: header, name: x-user}\nlimits:\n  messages: {limit: 1, per: 1h}\n  close_after: {violations: 1, within: 1h}\n  penalty_box: {after_closes: 1, first: 1m}",
    )
    .await;
    let user = [("x-user", "ann")];
    let mut ws = open(addr, "/", &user).await;
    for _ in 0..3 {
        send(&mut ws, "x").await;
    }
    assert_eq!(next(&mut ws).await, Got::Text("x".into()));
    assert!(is_error_frame(&next(&mut ws).await, "connection"));
    assert!(matches!(next(&mut ws).await, Got::Close(1008, _)));
    let Err((status, headers)) = connect(addr, "/", &user).await else {
        panic!("a banned client was admitted");
    };
    assert_eq!(status, 429);
    let retry: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((50..=60).contains(&retry), "{retry}");
    // Another user is not banned.
    drop(open(addr, "/", &[("x-user", "bob")]).await);
    let text = server.get("/metrics").await.body;
    assert_eq!(metric_in(&text, "flowgate_ws_penalty_bans_total"), 1.0);
    assert_eq!(
        metric_in(
            &text,
            "flowgate_ws_refused_upgrades_total{scope=\"penalty\"}"
        ),
        1.0
    );
}

/// Frames pass through as the client sent them: a fragmented message reaches the upstream
/// whole (it echoes it), a ping is answered once — by the upstream: the gateway relays it and
/// does not answer it itself — a close is answered with its own code and reason, and a frame
/// that breaks RFC 6455 (unmasked, from a client: §5.1) is closed with 1002.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_pass_through_as_sent_and_a_broken_one_closes_with_1002() {
    use futures_util::{SinkExt, StreamExt};
    use tokio::io::AsyncWriteExt;
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::{CloseCode, Data, OpCode};
    use tokio_tungstenite::tungstenite::protocol::frame::{CloseFrame, Frame};

    let upstream = EchoUpstream::start().await;
    let (server, addr) = start(&upstream, "limits:\n  max_message_size: 100").await;
    let mut ws = open(addr, "/", &[]).await;
    for (part, data, last) in [
        ("hel", Data::Text, false),
        ("lo ", Data::Continue, false),
        ("world", Data::Continue, true),
    ] {
        let frame = Frame::message(part.as_bytes().to_vec(), OpCode::Data(data), last);
        ws.send(Message::Frame(frame)).await.unwrap();
    }
    assert_eq!(next(&mut ws).await, Got::Text("hello world".into()));

    ws.send(Message::Ping("p".into())).await.unwrap();
    send(&mut ws, "after").await;
    let mut pongs = 0;
    loop {
        let read = tokio::time::timeout(Duration::from_secs(5), ws.next())
            .await
            .expect("a message within 5 s");
        match read {
            Some(Ok(Message::Pong(payload))) => {
                assert_eq!(&payload[..], b"p");
                pongs += 1;
            }
            Some(Ok(Message::Text(text))) => {
                assert_eq!(text.as_str(), "after");
                break;
            }
            other => panic!("expected a pong or the echo, got {other:?}"),
        }
    }
    assert_eq!(pongs, 1, "one pong: the upstream's");

    let bye = CloseFrame {
        code: CloseCode::from(4000),
        reason: "bye".into(),
    };
    ws.send(Message::Close(Some(bye))).await.unwrap();
    assert_eq!(next(&mut ws).await, Got::Close(4000, "bye".into()));

    let mut ws = open(addr, "/", &[]).await;
    // An unmasked text frame "x", written past the client library (which would mask it).
    ws.get_mut().write_all(&[0x81, 0x01, b'x']).await.unwrap();
    assert_eq!(
        next(&mut ws).await,
        Got::Close(1002, "protocol error".into())
    );
    wait_released(&server).await;
    assert_eq!(
        server
            .metric("flowgate_ws_closes_total{code=\"1002\"}")
            .await,
        1.0
    );
}
