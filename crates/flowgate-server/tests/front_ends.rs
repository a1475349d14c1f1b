//! One renderer for every front end: the same decisions, fed to the tower layer (an axum app),
//! the gateway, `POST /v1/check`, `POST /json` and `ShouldRateLimit`, give the same
//! `RateLimit-Policy`, `RateLimit`, `Retry-After`, `Flowgate-Fallback` and `Cache-Control`, and
//! the statuses each protocol has for them. A blocklist rule is reported the same way by the
//! four front ends of the service.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use flowgate::clock::ManualClock;
use flowgate::http::key::Global;
use flowgate::http::{Limit, Limits, RateLimitLayer};
use flowgate::store::{Ask, FallbackStore, Store, StoreError};
use flowgate::{Decision, FailMode, Quota, RateLimiter};
use flowgate_server::backend::Backend;
use flowgate_server::server::ServerConfig;
use flowgate_testing::grpc::{OK, OVER_LIMIT, descriptor, request, should};
use flowgate_testing::server::TestServer;
use flowgate_testing::upstream::{Upstream, client};
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper::body::Bytes;

/// A store that answers each check with the next result of a script.
struct Scripted(Mutex<VecDeque<Result<Decision, StoreError>>>);

impl Scripted {
    fn new(script: impl IntoIterator<Item = Result<Decision, StoreError>>) -> Self {
        Scripted(Mutex::new(script.into_iter().collect()))
    }
}

impl Store for Scripted {
    async fn check(&self, _: Ask<'_>) -> Result<Decision, StoreError> {
        self.0
            .lock()
            .unwrap()
            .pop_front()
            .expect("the script has an answer for every request")
    }
    async fn refund(&self, _: Ask<'_>) -> Result<(), StoreError> {
        Ok(())
    }
    async fn reset(&self, _: Ask<'_>) -> Result<(), StoreError> {
        Ok(())
    }
}

/// A store that is down, for fallback decisions.
struct Down;

impl Store for Down {
    async fn check(&self, _: Ask<'_>) -> Result<Decision, StoreError> {
        Err(StoreError::Unavailable("down".into()))
    }
    async fn refund(&self, _: Ask<'_>) -> Result<(), StoreError> {
        Ok(())
    }
    async fn reset(&self, _: Ask<'_>) -> Result<(), StoreError> {
        Ok(())
    }
}

const QUOTA: Quota = Quota::per_second(10);

/// Real decisions, one per case: allowed, denied, and each fail mode's, then two errors.
async fn cases() -> Vec<(&'static str, Result<Decision, StoreError>)> {
    let limiter = RateLimiter::with_clock(QUOTA, ManualClock::new(1 << 60));
    let allowed = limiter.check_n(3).unwrap();
    let _ = limiter.check_n(7).unwrap();
    let denied = limiter.check_n(2).unwrap();
    assert!(allowed.allowed && !denied.allowed);
    let fallback = FallbackStore::builder(Down).build();
    let mode = |mode| {
        let fallback = &fallback;
        async move {
            fallback
                .check(Ask::new("k", &QUOTA).fail(mode))
                .await
                .unwrap()
        }
    };
    vec![
        ("allowed", Ok(allowed)),
        ("denied", Ok(denied)),
        ("open", Ok(mode(FailMode::Open).await)),
        ("local", Ok(mode(FailMode::Local).await)),
        ("closed", Ok(mode(FailMode::Closed).await)),
        ("unavailable", Err(StoreError::Unavailable("down".into()))),
        ("broken", Err(StoreError::Backend("WRONGTYPE".into()))),
    ]
}

/// The rate-limit fields of a response, by name.
type Fields = Vec<(&'static str, Option<String>)>;

const NAMES: [&str; 5] = [
    "ratelimit-policy",
    "ratelimit",
    "retry-after",
    "flowgate-fallback",
    "cache-control",
];

fn fields(get: impl Fn(&str) -> Option<String>) -> Fields {
    NAMES.iter().map(|name| (*name, get(name))).collect()
}

fn http_fields(headers: &hyper::HeaderMap) -> Fields {
    fields(|name| headers.get(name).map(|v| v.to_str().unwrap().to_owned()))
}

/// `GET /` with an empty body through `client`; the status and the fields.
async fn get(addr: SocketAddr) -> (u16, Fields) {
    let request = Request::get(format!("http://{addr}/"))
        .body(Full::<Bytes>::default())
        .unwrap();
    let response = client().request(request).await.unwrap();
    let status = response.status().as_u16();
    let fields = http_fields(response.headers());
    let _ = response.into_body().collect().await;
    (status, fields)
}

/// An axum app behind the layer, counting in `store`, on loopback.
async fn layer_app(store: Scripted) -> SocketAddr {
    let limits = Limits::new().limit(Limit::new("per-ip", Global::default(), QUOTA));
    let app = axum::Router::new()
        .route("/", axum::routing::get(|| async { "hello" }))
        .layer(RateLimitLayer::new(store, limits).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
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

const EDGE: &str = r#"
domain: edge
gateway:
  descriptors:
    - [{key: remote_address}]
descriptors:
  - key: remote_address
    rate_limit: {name: per-ip, unit: second, requests_per_unit: 10}
"#;

async fn server(yaml: &str, backend: Option<Backend>, upstream: &Upstream) -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("edge.yaml");
    std::fs::write(&path, yaml).unwrap();
    let mut config = ServerConfig::load(vec![path.clone()]).unwrap();
    if let Some(backend) = backend {
        config.backend = backend;
    }
    config.upstream = Some(upstream.url().parse().unwrap());
    TestServer::start_with(config, dir, vec![path]).await
}

/// What each front end sent for one case: the HTTP ones' statuses and fields, and gRPC's
/// overall code (or error) with its `response_headers_to_add`.
#[derive(Debug)]
struct Seen {
    layer: (u16, Fields),
    gateway: (u16, Fields),
    check: (u16, Fields),
    json: (u16, Fields),
    grpc: Result<(i32, Fields), tonic::Code>,
}

async fn through_the_service(
    server: &TestServer,
    domain: &str,
    entries: &[(&str, &str)],
) -> [(u16, Fields); 2] {
    let pairs: Vec<String> = entries
        .iter()
        .map(|(k, v)| format!(r#"{{"key":"{k}","value":"{v}"}}"#))
        .collect();
    let body = format!(
        r#"{{"domain":"{domain}","descriptors":[{{"entries":[{}]}}]}}"#,
        pairs.join(",")
    );
    let check = server.post("/v1/check", &body).await;
    let json = server.post("/json", &body).await;
    [
        (check.status, http_fields(&check.headers)),
        (json.status, http_fields(&json.headers)),
    ]
}

async fn grpc(
    server: &TestServer,
    domain: &str,
    entries: &[(&str, &str)],
) -> Result<(i32, Fields), tonic::Code> {
    let mut client = server.rls().await;
    match client
        .should_rate_limit(request(domain, vec![descriptor(entries)]))
        .await
    {
        Ok(response) => {
            let response = response.into_inner();
            let headers = &response.response_headers_to_add;
            let fields = fields(|name| {
                headers
                    .iter()
                    .find(|h| h.key == name)
                    .map(|h| h.value.clone())
            });
            Ok((response.overall_code, fields))
        }
        Err(status) => Err(status.code()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_front_end_renders_the_same_decisions_the_same_way() {
    let cases = cases().await;
    let upstream = Upstream::start().await;
    let layer = layer_app(Scripted::new(cases.iter().map(|c| c.1.clone()))).await;
    // The service asks its store once per request: the gateway, /v1/check, /json and gRPC in
    // turn, for every case.
    let script = cases
        .iter()
        .flat_map(|c| std::iter::repeat_n(c.1.clone(), 4));
    let backend = Backend::local(Arc::new(Scripted::new(script)));
    let service = server(EDGE, Some(backend), &upstream).await;
    let address = [("remote_address", "127.0.0.1")];

    for (name, _) in &cases {
        let layer = get(layer).await;
        let gateway = get(service.gateway.unwrap()).await;
        let [check, json] = through_the_service(&service, "edge", &address).await;
        let grpc = grpc(&service, "edge", &address).await;
        let seen = Seen {
            layer,
            gateway,
            check,
            json,
            grpc,
        };
        // Every HTTP front end sends the same fields.
        for other in [&seen.gateway.1, &seen.check.1, &seen.json.1] {
            assert_eq!(other, &seen.layer.1, "{name}: {seen:#?}");
        }
        // The statuses each protocol has for the case.
        let (http, json, grpc): (u16, u16, Result<i32, tonic::Code>) = match *name {
            "allowed" | "open" | "local" => (200, 200, Ok(OK)),
            "denied" => (429, 429, Ok(OVER_LIMIT)),
            "closed" => (503, 429, Ok(OVER_LIMIT)),
            "unavailable" => (503, 503, Err(tonic::Code::Unavailable)),
            _ => (500, 500, Err(tonic::Code::Internal)),
        };
        let layer_or_gateway = |status| if status == 201 { 200 } else { status };
        assert_eq!(seen.layer.0, http, "{name}: layer");
        assert_eq!(layer_or_gateway(seen.gateway.0), http, "{name}: gateway");
        assert_eq!(seen.check.0, http, "{name}: /v1/check");
        assert_eq!(seen.json.0, json, "{name}: /json");
        match (&seen.grpc, grpc) {
            (Ok((code, fields)), Ok(expected)) => {
                assert_eq!(*code, expected, "{name}: gRPC");
                assert_eq!(fields, &seen.layer.1, "{name}: gRPC headers");
            }
            (Err(code), Err(expected)) => assert_eq!(*code, expected, "{name}: gRPC"),
            (got, expected) => panic!("{name}: gRPC {got:?}, expected {expected:?}"),
        }
    }
    // The fields themselves, for two cases (the renderer's own tests cover the rest).
    let allowed = get(layer_app(Scripted::new([cases[0].1.clone()])).await).await;
    assert_eq!(
        allowed.1,
        fields(|name| match name {
            "ratelimit-policy" => Some(r#""per-ip";q=10;w=1"#.into()),
            "ratelimit" => Some(r#""per-ip";r=7;t=1"#.into()),
            _ => None,
        })
    );
    let closed = get(layer_app(Scripted::new([cases[4].1.clone()])).await).await;
    assert_eq!(
        closed.1,
        fields(|name| match name {
            "retry-after" => Some("1".into()),
            "flowgate-fallback" => Some("closed".into()),
            "cache-control" => Some("no-store".into()),
            _ => None,
        })
    );
    service.stop().await;
}

const BLOCKLIST: &str = r#"
domain: edge
gateway:
  descriptors:
    - [{key: header, header: x-group, as: group}]
descriptors:
  - key: group
    value: banned
    rate_limit: {name: banned, unit: minute, requests_per_unit: 0}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocklist_rule_is_reported_as_a_quota_of_zero_everywhere() {
    let upstream = Upstream::start().await;
    let service = server(BLOCKLIST, None, &upstream).await;
    let request = Request::get(format!("http://{}/", service.gateway.unwrap()))
        .header("x-group", "banned")
        .body(Full::<Bytes>::default())
        .unwrap();
    let response = client().request(request).await.unwrap();
    let gateway = (response.status().as_u16(), http_fields(response.headers()));
    let entries = [("group", "banned")];
    let [check, json] = through_the_service(&service, "edge", &entries).await;
    let grpc = grpc(&service, "edge", &entries).await.unwrap();
    let expected = fields(|name| match name {
        "ratelimit-policy" => Some(r#""banned";q=0;w=60"#.into()),
        "ratelimit" => Some(r#""banned";r=0;t=60"#.into()),
        "retry-after" => Some("60".into()),
        "cache-control" => Some("no-store".into()),
        _ => None,
    });
    assert_eq!(gateway, (429, expected.clone()));
    assert_eq!(check, (429, expected.clone()));
    assert_eq!(json, (429, expected.clone()));
    assert_eq!(grpc, (OVER_LIMIT, expected));
    assert!(upstream.seen().is_empty());
    service.stop().await;
}

/// The built-in policy's `per_address` is a token bucket of 100 per second with bursts of
/// 200: the IETF fields advertise its rate, name its burst as `flowgate-burst`, and never say
/// more remains than `q` (they said `r=199` under `q=100`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ietf_fields_never_say_more_remains_than_the_quota() {
    let server = TestServer::start(&[]).await;
    let body = r#"{"domain":"default","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.7"}]}]}"#;
    for path in ["/v1/check", "/json"] {
        let r = server.post(path, body).await;
        assert_eq!(r.status, 200, "{path}: {}", r.body);
        assert_eq!(
            r.header("ratelimit-policy").unwrap(),
            r#""per_address";q=100;w=1;flowgate-burst=200"#,
            "{path}"
        );
        let limit = r.header("ratelimit").unwrap();
        assert!(
            limit.starts_with(r#""per_address";r=100;t="#),
            "{path}: {limit}"
        );
    }
    let answer = should(
        &mut server.rls().await,
        request(
            "default",
            vec![descriptor(&[("remote_address", "10.0.0.7")])],
        ),
    )
    .await;
    assert!(answer.statuses[0].limit_remaining <= 100, "{answer:?}");
    server.stop().await;
}

/// A request-level `hits_addend` beyond 32 bits (the proto's `uint32`) is the same 400 on
/// `/json` and `/v1/check` (it was 400 on one and 429 on the other); a descriptor's cost that
/// can never fit its quota is refused without `Retry-After`, since waiting never helps (it
/// said `Retry-After: 1`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absurd_costs_get_the_same_answer_on_every_front_end() {
    let server = TestServer::start(&[]).await;
    let huge = 1u64 << 32;
    let entries = r#"[{"key":"api_key","value":"k"}]"#;
    let request_level = format!(
        r#"{{"domain":"default","hits_addend":{huge},"descriptors":[{{"entries":{entries}}}]}}"#
    );
    for path in ["/v1/check", "/json"] {
        let r = server.post(path, &request_level).await;
        assert_eq!(r.status, 400, "{path}: {}", r.body);
        assert_eq!(r.header("content-type"), Some("application/problem+json"));
        assert!(
            r.body.contains("hits_addend must fit in 32 bits"),
            "{path}: {}",
            r.body
        );
    }
    let never = format!(
        r#"{{"domain":"default","descriptors":[{{"entries":{entries},"hits_addend":5000}}]}}"#
    );
    for path in ["/v1/check", "/json"] {
        let r = server.post(path, &never).await;
        assert_eq!(r.status, 429, "{path}: {}", r.body);
        assert_eq!(r.header("retry-after"), None, "{path}");
        assert_eq!(r.header("cache-control"), Some("no-store"), "{path}");
    }
    // The limit was not touched: the next request sees the whole quota.
    let one = format!(r#"{{"domain":"default","descriptors":[{{"entries":{entries}}}]}}"#);
    let r = server.post("/v1/check", &one).await;
    assert_eq!(r.json()["descriptors"][0]["remaining"], 999, "{}", r.body);
    server.stop().await;
}

/// A token budget as Envoy Gateway configures it (`cost.request: {from: Number, number: 0}`,
/// `cost.response` from metadata): the request path checks with `hits_addend: 0`, and the
/// post-response call (`apply_on_stream_done`) repeats the same descriptors with the tokens
/// used. The rule is marked `charge: true`, so that call is a charge.
const LLM: &str = "domain: llm
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1000, algorithm: gcra, charge: true}
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 1000, algorithm: gcra}
";

/// No IETF field says more remains than the quota, and none is negative.
fn assert_ietf_valid(headers: impl IntoIterator<Item = (String, String)>) {
    for (name, value) in headers {
        let name = name.to_ascii_lowercase();
        if !name.starts_with("ratelimit") && name != "retry-after" {
            continue;
        }
        assert!(
            !value.contains('-') || name != "ratelimit",
            "{name}: {value}"
        );
        assert!(!value.contains("=-"), "{name}: {value}");
        if name == "ratelimit" {
            let r: u64 = field(&value, "r");
            assert!(r <= 1000, "{name}: {value}");
        }
    }
}

fn field(value: &str, name: &str) -> u64 {
    value
        .split(';')
        .find_map(|p| p.trim().strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name} in {value}"))
        .parse()
        .unwrap()
}

/// Charge 5000 tokens on a 1000/min limit: the charge is taken (OK, nothing left, reset five
/// minutes away), and the next request is refused until the debt is repaid: 240 s at one
/// token per 60 ms. Over gRPC, `/json` (a charged rule) and `/v1/check` (`"charge": true`).
/// The server's clock is real: the figures allow for the test's own running time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_runs_the_limit_into_debt_on_every_front_end() {
    let server = TestServer::start(&[("llm.yaml", LLM)]).await;
    let about = |d: std::time::Duration, secs: u64| {
        let s = d.as_secs_f64();
        assert!(
            s <= secs as f64 && s > secs as f64 - 10.0,
            "{d:?} is not about {secs} s"
        );
    };
    // gRPC, as Envoy sends it.
    let mut client = server.rls().await;
    let user = |hits: u64| {
        let mut d = descriptor(&[("user", "ann")]);
        d.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value: hits });
        request("llm", vec![d])
    };
    assert_eq!(should(&mut client, user(0)).await.overall_code, OK);
    let charged = should(&mut client, user(5000)).await;
    assert_eq!(
        charged.overall_code, OK,
        "a charge is always taken: {charged:?}"
    );
    let status = &charged.statuses[0];
    assert_eq!(status.limit_remaining, 0);
    let reset = status.duration_until_reset.unwrap();
    about(std::time::Duration::from_secs(reset.seconds as u64), 300);
    assert_ietf_valid(
        charged
            .response_headers_to_add
            .iter()
            .map(|h| (h.key.clone(), h.value.clone())),
    );
    let refused = should(&mut client, user(0)).await;
    assert_eq!(refused.overall_code, OVER_LIMIT, "{refused:?}");
    let retry = refused
        .response_headers_to_add
        .iter()
        .find(|h| h.key.eq_ignore_ascii_case("retry-after"))
        .map(|h| h.value.parse::<u64>().unwrap())
        .expect("Retry-After");
    about(std::time::Duration::from_secs(retry), 240);

    // /json: the same rule, another user; Envoy's per-descriptor hits_addend.
    let json = |hits: u64| {
        format!(
            r#"{{"domain":"llm","descriptors":[{{"entries":[{{"key":"user","value":"bob"}}],"hits_addend":{hits}}}]}}"#
        )
    };
    let r = server.post("/json", &json(5000)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["overallCode"], "OK", "{}", r.body);
    assert_eq!(
        r.json()["statuses"][0]["limitRemaining"]
            .as_u64()
            .unwrap_or(0),
        0
    );
    assert_ietf_valid(
        r.headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_owned())),
    );
    let r = server.post("/json", &json(0)).await;
    assert_eq!(r.status, 429, "{}", r.body);
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    about(std::time::Duration::from_secs(retry), 240);

    // /v1/check: a rule that does not charge, and a request that says it is a charge.
    let check = |charge: bool, hits: u64| {
        format!(
            r#"{{"domain":"llm","charge":{charge},"descriptors":[{{"entries":[{{"key":"tenant","value":"t"}}],"hits_addend":{hits}}}]}}"#
        )
    };
    let r = server.post("/v1/check", &check(true, 5000)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let d = &r.json()["descriptors"][0];
    assert_eq!(
        (d["allowed"].as_bool(), d["remaining"].as_u64()),
        (Some(true), Some(0)),
        "{}",
        r.body
    );
    about(
        std::time::Duration::from_millis(d["reset_after_ms"].as_u64().unwrap()),
        300,
    );
    about(
        std::time::Duration::from_millis(d["retry_after_ms"].as_u64().unwrap()),
        240,
    );
    assert_ietf_valid(
        r.headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_owned())),
    );
    let r = server.post("/v1/check", &check(false, 1)).await;
    assert_eq!(r.status, 429, "{}", r.body);
    // A unit fits one emission interval (60 ms) after the debt is repaid.
    let d = &r.json()["descriptors"][0];
    let retry_ms = d["retry_after_ms"].as_u64().unwrap();
    assert!(retry_ms <= 240_060 && retry_ms > 230_060, "{}", r.body);
    // Without the flag, the same cost on that rule can never fit: refused, nothing taken.
    let r = server.post("/v1/check", &check(false, 5000)).await;
    assert_eq!(r.status, 429, "{}", r.body);
    server.stop().await;
}

/// A cost beyond 32 bits, or beyond any integer, is a clear 400 (gRPC `INVALID_ARGUMENT`) on
/// every front end, charged or not: never a panic, never a wrapped number.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absurd_charges_are_refused_as_invalid_on_every_front_end() {
    let server = TestServer::start(&[("llm.yaml", LLM)]).await;
    let mut client = server.rls().await;
    let mut d = descriptor(&[("user", "ann")]);
    d.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value: 1 << 32 });
    let status = client
        .should_rate_limit(request("llm", vec![d]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("hits_addend must fit in 32 bits"),
        "{status:?}"
    );
    for hits in ["4294967296", "18446744073709551616", "1e30", "-1"] {
        for (path, extra) in [("/json", ""), ("/v1/check", r#""charge":true,"#)] {
            let body = format!(
                r#"{{"domain":"llm",{extra}"descriptors":[{{"entries":[{{"key":"user","value":"ann"}}],"hits_addend":{hits}}}]}}"#
            );
            let r = server.post(path, &body).await;
            assert_eq!(r.status, 400, "{path} {hits}: {}", r.body);
            assert_eq!(r.header("content-type"), Some("application/problem+json"));
        }
    }
    // Nothing was taken.
    let one = r#"{"domain":"llm","descriptors":[{"entries":[{"key":"user","value":"ann"}]}]}"#;
    let r = server.post("/v1/check", one).await;
    assert_eq!(r.json()["descriptors"][0]["remaining"], 999, "{}", r.body);
    server.stop().await;
}
