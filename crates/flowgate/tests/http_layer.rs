//! The rate-limit layer over real HTTP on loopback: an axum (or plain hyper) server on port 0,
//! hyper-util's client, headers parsed with a structured-field parser and checked against the
//! store's decisions, time from a manual clock.
#![cfg(all(feature = "tower", feature = "axum", feature = "jwt"))]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::{Router, routing::get};
use bytes::Bytes;
use flowgate::answer::problem::QUOTA_EXCEEDED;
use flowgate::clock::ManualClock;
use flowgate::http::key::{ClientIp, Header, Jwt, PeerAddr, PeerIp, Route};
use flowgate::http::{Limit, Limits, RateLimitLayer};
use flowgate::store::{Ask, DynStore, FallbackStore, MemoryStore, Store, StoreError};
use flowgate::{Decision, FailMode, Quota};
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{Client, connect::HttpConnector};
use hyper_util::rt::TokioExecutor;
use sfv::{BareItem, List, ListEntry, Parser};
use tokio::net::TcpListener;

/// Starts `app` on 127.0.0.1, port 0, recording each connection's peer address.
async fn serve(app: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
    });
    addr
}

fn app<St: Store + 'static>(layer: RateLimitLayer<St>) -> Router {
    Router::new()
        .route("/", get(|| async { "hello" }))
        .route("/login", get(|| async { "login" }))
        .route("/search", get(|| async { "search" }))
        .layer(layer)
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// A client whose connections leave from `local` (any address in 127.0.0.0/8).
fn client_from(local: &str) -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_local_address(Some(local.parse::<IpAddr>().unwrap()));
    Client::builder(TokioExecutor::new()).build(connector)
}

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

async fn send(
    client: &HttpClient,
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> Reply {
    let mut request = Request::get(format!("http://{addr}{path}"));
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let response = client
        .request(request.body(Full::new(Bytes::new())).unwrap())
        .await
        .unwrap();
    let (parts, body) = response.into_parts();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

/// The store as the layer sees it, plus a handle to peek at it.
fn memory_store(clock: &ManualClock) -> Arc<dyn DynStore> {
    Arc::new(MemoryStore::builder().clock(clock.clone()).build())
}

/// Parses a `RateLimit`/`RateLimit-Policy` field into (name, params) per item.
fn items(headers: &HeaderMap, name: &str) -> Vec<(String, Vec<(String, i64)>)> {
    let mut out = Vec::new();
    for value in headers.get_all(name) {
        let list: List = Parser::new(value.as_bytes()).parse().unwrap();
        for entry in list {
            let ListEntry::Item(item) = entry else {
                panic!("{name} holds an inner list")
            };
            let BareItem::String(policy) = item.bare_item else {
                panic!("{name} item is not an sf-string")
            };
            let params = item
                .params
                .iter()
                .map(|(k, v)| (k.as_str().to_owned(), i64::from(v.as_integer().unwrap())))
                .collect();
            out.push((policy.as_str().to_owned(), params));
        }
    }
    out
}

fn param(item: &(String, Vec<(String, i64)>), key: &str) -> u64 {
    item.1.iter().find(|(k, _)| k == key).unwrap().1 as u64
}

fn retry_after(reply: &Reply) -> u64 {
    reply.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

fn problem(reply: &Reply) -> serde_json::Value {
    assert_eq!(reply.headers["content-type"], "application/problem+json");
    assert_eq!(reply.headers["cache-control"], "no-store");
    serde_json::from_slice(&reply.body).unwrap()
}

#[tokio::test]
async fn headers_match_the_decision_and_retry_after_is_never_zero() {
    let clock = ManualClock::new(1_700_000_000_000_000_000);
    let store = memory_store(&clock);
    let quota = Quota::new(3, Duration::from_secs(10)).unwrap();
    let policy = Limits::new().limit(Limit::new("per-ip", PeerIp::new(), quota));
    let layer = RateLimitLayer::builder(store.clone(), policy)
        .legacy_headers(true)
        .build()
        .unwrap();
    let addr = serve(app(layer)).await;
    let client = client_from("127.0.0.1");
    let key = "http:per-ip|key=127.0.0.1";

    for _ in 0..3 {
        let reply = send(&client, addr, "/", &[]).await;
        assert_eq!(reply.status, 200);
        let decision = store.peek(Ask::new(key, &quota)).await.unwrap();
        let policy = items(&reply.headers, "ratelimit-policy");
        assert_eq!(policy.len(), 1);
        assert_eq!(policy[0].0, "per-ip");
        assert_eq!((param(&policy[0], "q"), param(&policy[0], "w")), (3, 10));
        let limit = items(&reply.headers, "ratelimit");
        assert_eq!(limit[0].0, "per-ip");
        assert_eq!(param(&limit[0], "r"), decision.remaining);
        assert_eq!(param(&limit[0], "t"), decision.reset_after_secs());
        assert_eq!(
            reply.headers["x-ratelimit-remaining"],
            decision.remaining.to_string()
        );
        assert!(reply.headers.get("retry-after").is_none());
    }

    // Limited: walk the clock forward in 700 ms steps until the request passes again. Every
    // 429 says when to retry, rounded up, never 0, and agrees with the store's denial.
    let mut limited = 0;
    loop {
        let reply = send(&client, addr, "/", &[]).await;
        if reply.status == 200 {
            break;
        }
        limited += 1;
        assert_eq!(reply.status, 429);
        let denial: Decision = store.check(Ask::new(key, &quota)).await.unwrap();
        assert!(!denial.allowed);
        let secs = retry_after(&reply);
        assert!(secs >= 1);
        assert_eq!(secs, denial.retry_after_secs());
        assert!(Duration::from_secs(secs) >= denial.retry_after);
        assert!(Duration::from_secs(secs) < denial.retry_after + Duration::from_secs(1));
        let limit = items(&reply.headers, "ratelimit");
        assert_eq!(param(&limit[0], "r"), 0);
        assert_eq!(param(&limit[0], "t"), secs);
        let body = problem(&reply);
        assert_eq!(body["type"], QUOTA_EXCEEDED);
        assert_eq!(body["status"], 429);
        assert_eq!(body["violated-policies"], serde_json::json!(["per-ip"]));
        clock.advance(Duration::from_millis(700));
        assert!(limited < 10, "never recovered");
    }
    // GCRA at 3 per 10 s: one unit every 3.34 s, i.e. after 5 steps of 700 ms.
    assert_eq!(limited, 5);
}

#[tokio::test]
async fn spoofed_forwarded_for_is_ignored_from_untrusted_peers_and_honoured_from_trusted_proxies() {
    let clock = ManualClock::new(1_700_000_000_000_000_000);
    let store = memory_store(&clock);
    let quota = Quota::per_minute(2);
    // Only 127.0.0.2 is our proxy; 127.0.0.1 is "the internet".
    let client_ip = ClientIp::new(["127.0.0.2/32".parse().unwrap()]);
    let policy = Limits::new().limit(Limit::new("per-client", client_ip, quota));
    let addr = serve(app(RateLimitLayer::new(store.clone(), policy).unwrap())).await;
    let (direct, proxy) = (client_from("127.0.0.1"), client_from("127.0.0.2"));

    // A direct client that rotates spoofed addresses is still one client.
    for (i, spoof) in ["203.0.113.1", "203.0.113.2", "203.0.113.3"]
        .iter()
        .enumerate()
    {
        let reply = send(&direct, addr, "/", &[("x-forwarded-for", spoof)]).await;
        assert_eq!(reply.status == 200, i < 2, "request {i}");
    }
    assert_eq!(
        store
            .peek(Ask::new("http:per-client|key=127.0.0.1", &quota))
            .await
            .unwrap()
            .remaining,
        0
    );
    assert_eq!(
        store
            .peek(Ask::new("http:per-client|key=203.0.113.1", &quota))
            .await
            .unwrap()
            .remaining,
        2
    );

    // Through the trusted proxy, each forwarded client has its own allowance, and the
    // rightmost untrusted hop counts (the client's own prefix is ignored).
    for client in ["198.51.100.7", "198.51.100.8"] {
        for i in 0..3 {
            let xff = format!("6.6.6.6, {client}");
            let reply = send(&proxy, addr, "/", &[("x-forwarded-for", &xff)]).await;
            assert_eq!(reply.status == 200, i < 2, "{client} request {i}");
        }
    }
    assert_eq!(
        store
            .peek(Ask::new("http:per-client|key=6.6.6.6", &quota))
            .await
            .unwrap()
            .remaining,
        2
    );
    // The proxy's own requests without the header count as the proxy.
    assert_eq!(send(&proxy, addr, "/", &[]).await.status, 200);
    assert_eq!(
        store
            .peek(Ask::new("http:per-client|key=127.0.0.2", &quota))
            .await
            .unwrap()
            .remaining,
        1
    );
}

fn token(secret: &[u8], sub: &str, plan: &str) -> String {
    let claims = serde_json::json!({
        "sub": sub, "plan": plan, "exp": jsonwebtoken::get_current_timestamp() + 600
    });
    let key = jsonwebtoken::EncodingKey::from_secret(secret);
    jsonwebtoken::encode(&jsonwebtoken::Header::default(), &claims, &key).unwrap()
}

#[tokio::test]
async fn tiers_give_different_limits() {
    let clock = ManualClock::new(1_700_000_000_000_000_000);
    let store = memory_store(&clock);
    let secret = b"tier-secret";
    let jwt = Jwt::hs256(secret);
    let (free, enterprise) = (
        Quota::per_second(10).with_burst(20).unwrap(),
        Quota::per_second(500).with_burst(1000).unwrap(),
    );
    let policy = Limits::new().limit(
        Limit::tiered("per-user", jwt.claim("sub"), jwt.claim("plan"))
            .tier("free", free)
            .tier("enterprise", enterprise),
    );
    let layer = RateLimitLayer::new(store.clone(), policy).unwrap();
    let stats = layer.stats();
    let addr = serve(app(layer)).await;
    let client = client_from("127.0.0.1");

    for (user, plan, burst, q) in [("ann", "free", 20, 10), ("bob", "enterprise", 1000, 500)] {
        let auth = format!("Bearer {}", token(secret, user, plan));
        let mut allowed = 0;
        for _ in 0..burst + 5 {
            let reply = send(&client, addr, "/", &[("authorization", &auth)]).await;
            let policy = items(&reply.headers, "ratelimit-policy");
            assert_eq!(param(&policy[0], "q"), q);
            match reply.status {
                StatusCode::OK => allowed += 1,
                StatusCode::TOO_MANY_REQUESTS => assert_eq!(retry_after(&reply), 1),
                other => panic!("{other}"),
            }
        }
        assert_eq!(allowed, burst, "{plan}");
    }
    // A forged token is a 401 problem, not a limit.
    let forged = format!("Bearer {}", token(b"wrong", "eve", "enterprise"));
    let reply = send(&client, addr, "/", &[("authorization", &forged)]).await;
    assert_eq!(reply.status, 401);
    assert_eq!(reply.headers["www-authenticate"], "Bearer");
    assert_eq!(problem(&reply)["status"], 401);
    let stats = stats.snapshot();
    assert_eq!(
        (stats.allowed, stats.limited, stats.rejected),
        (1020, 10, 1)
    );
}

#[tokio::test]
async fn multi_limit_requests_refund_on_partial_deny() {
    let clock = ManualClock::new(1_700_000_000_000_000_000);
    let store = memory_store(&clock);
    let per_ip = Quota::per_minute(100);
    let login = Quota::per_minute(2);
    let api_key = Quota::per_minute(50);
    let policy = Limits::new()
        .limit(Limit::new("per-ip", PeerIp::new(), per_ip))
        .limit(
            Limit::tiered(
                "per-endpoint",
                Route::new(["/login", "/search"]).unwrap(),
                Route::new(["/login", "/search"]).unwrap(),
            )
            .tier("/login", login),
        )
        .limit(Limit::new(
            "per-key",
            Header::new(http::HeaderName::from_static("x-api-key")),
            api_key,
        ));
    let addr = serve(app(RateLimitLayer::new(store.clone(), policy).unwrap())).await;
    let client = client_from("127.0.0.1");
    let key = [("x-api-key", "k1")];

    for i in 0..6 {
        let reply = send(&client, addr, "/login", &key).await;
        let names: Vec<_> = items(&reply.headers, "ratelimit")
            .into_iter()
            .map(|i| i.0)
            .collect();
        assert_eq!(names, ["per-ip", "per-endpoint", "per-key"]);
        if i < 2 {
            assert_eq!(reply.status, 200);
        } else {
            assert_eq!(reply.status, 429);
            assert_eq!(
                problem(&reply)["violated-policies"],
                serde_json::json!(["per-endpoint"])
            );
        }
    }
    // The four denied logins took nothing from the per-IP and per-key limits.
    let peek = |k: &'static str, q: Quota| {
        let store = store.clone();
        async move { store.peek(Ask::new(k, &q)).await.unwrap().remaining }
    };
    assert_eq!(peek("http:per-ip|key=127.0.0.1", per_ip).await, 98);
    assert_eq!(peek("http:per-key|key=k1", api_key).await, 48);
    // /search has no endpoint tier: only the other two limits apply.
    let reply = send(&client, addr, "/search", &key).await;
    assert_eq!(reply.status, 200);
    assert_eq!(items(&reply.headers, "ratelimit").len(), 2);
    // Without an API key: 401, and nothing counted anywhere.
    let reply = send(&client, addr, "/search", &[]).await;
    assert_eq!(reply.status, 401);
    assert_eq!(peek("http:per-ip|key=127.0.0.1", per_ip).await, 97);
}

/// A store whose backend is a TCP server that is not there: every call tries to connect to a
/// closed port on loopback, and fails the way a real remote store fails when it is down.
struct UnreachableStore {
    addr: SocketAddr,
    /// Holds the port closed (bound, not listening) for as long as the store lives.
    _closed: flowgate_testing::net::ClosedPort,
}

impl UnreachableStore {
    async fn new() -> Self {
        let closed = flowgate_testing::net::ClosedPort::new();
        UnreachableStore {
            addr: closed.addr(),
            _closed: closed,
        }
    }

    async fn connect(&self) -> Result<tokio::net::TcpStream, StoreError> {
        match tokio::time::timeout(
            Duration::from_millis(500),
            tokio::net::TcpStream::connect(self.addr),
        )
        .await
        {
            Ok(Ok(stream)) => Ok(stream),
            Ok(Err(e)) => Err(StoreError::Unavailable(e.to_string())),
            Err(_) => Err(StoreError::Timeout(Duration::from_millis(500))),
        }
    }
}

impl Store for UnreachableStore {
    async fn check(&self, _: Ask<'_>) -> Result<Decision, StoreError> {
        self.connect().await?;
        Err(StoreError::Backend("this store speaks no protocol".into()))
    }
    async fn check_many(&self, requests: &[Ask<'_>]) -> Vec<Result<Decision, StoreError>> {
        let result = self.connect().await.map(|_| ());
        requests
            .iter()
            .map(|_| match &result {
                Ok(()) => Err(StoreError::Backend("no protocol".into())),
                Err(e) => Err(e.clone()),
            })
            .collect()
    }
    async fn refund(&self, _: Ask<'_>) -> Result<(), StoreError> {
        self.connect().await.map(|_| ())
    }
    async fn reset(&self, _: Ask<'_>) -> Result<(), StoreError> {
        self.connect().await.map(|_| ())
    }
}

#[tokio::test]
async fn an_unreachable_store_answers_503_or_fails_open_through_the_fallback_store() {
    let quota = Quota::per_second(5);
    let policy = || Limits::new().limit(Limit::new("per-ip", PeerIp::new(), quota));
    let client = client_from("127.0.0.1");

    let store: Arc<dyn DynStore> = Arc::new(UnreachableStore::new().await);
    let closed = RateLimitLayer::new(store.clone(), policy()).unwrap();
    let closed_stats = closed.stats();
    let addr = serve(app(closed)).await;
    let reply = send(&client, addr, "/", &[]).await;
    assert_eq!(reply.status, 503);
    assert_eq!(retry_after(&reply), 1);
    let body = problem(&reply);
    assert_eq!(body["status"], 503);
    assert_eq!(body["type"], "about:blank");
    assert_eq!(closed_stats.snapshot().unavailable, 1);

    // The limit's fail mode travels to the fallback store, which applies it.
    let fallback = FallbackStore::builder(store).fail(FailMode::Closed).build();
    let limits =
        Limits::new().limit(Limit::new("per-ip", PeerIp::new(), quota).fail(FailMode::Open));
    let open = RateLimitLayer::new(fallback, limits).unwrap();
    let open_stats = open.stats();
    let addr = serve(app(open)).await;
    for _ in 0..3 {
        let reply = send(&client, addr, "/", &[]).await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.body, "hello");
        assert_eq!(reply.headers["flowgate-fallback"], "open");
        assert!(reply.headers.get("ratelimit").is_none());
    }
    let stats = open_stats.snapshot();
    assert_eq!((stats.allowed, stats.fail_open), (3, 3));
}

#[tokio::test]
async fn works_as_plain_hyper_middleware_and_answers_grpc_with_grpc_statuses() {
    use hyper::server::conn::http1;
    use hyper_util::rt::TokioIo;
    use hyper_util::service::TowerToHyperService;
    use tower::{Layer, service_fn};

    let clock = ManualClock::new(1_700_000_000_000_000_000);
    let quota = Quota::per_minute(1);
    let policy = Limits::new().limit(Limit::new("per-ip", PeerIp::new(), quota));
    let layer = RateLimitLayer::new(memory_store(&clock), policy).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, peer)) = listener.accept().await {
            let service = layer.layer(service_fn(
                |_request: Request<hyper::body::Incoming>| async {
                    Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::from(
                        "hi",
                    ))))
                },
            ));
            let with_peer = service_fn(move |mut request: Request<hyper::body::Incoming>| {
                request.extensions_mut().insert(PeerAddr(peer));
                let mut service = service.clone();
                async move { tower::Service::call(&mut service, request).await }
            });
            tokio::spawn(
                http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), TowerToHyperService::new(with_peer)),
            );
        }
    });
    let client = client_from("127.0.0.1");
    let grpc = [("content-type", "application/grpc")];
    let reply = send(&client, addr, "/pkg.Svc/Method", &grpc).await;
    assert_eq!(
        (reply.status, &reply.body[..]),
        (StatusCode::OK, &b"hi"[..])
    );
    let reply = send(&client, addr, "/pkg.Svc/Method", &grpc).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.headers["grpc-status"], "8");
    assert!(retry_after(&reply) >= 1);
    assert_eq!(items(&reply.headers, "ratelimit")[0].0, "per-ip");
    // The same client over plain HTTP gets the problem response.
    let reply = send(&client, addr, "/", &[]).await;
    assert_eq!(reply.status, 429);
    assert_eq!(problem(&reply)["type"], QUOTA_EXCEEDED);
}
