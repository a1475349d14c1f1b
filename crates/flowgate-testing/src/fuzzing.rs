//! Entry points for the fuzz targets under `fuzz/` (feature `fuzzing`). They live here, not in
//! the service's crate, so that the service ships no fuzzing code.
//!
//! Each function takes arbitrary bytes and runs them through the code the service runs on
//! untrusted input — the same functions, not copies — and panics only when an invariant
//! breaks (a panic is what the fuzzer reports). `crates/flowgate-server/tests/fuzz_corpus.rs`
//! runs every committed corpus file through them on stable, so `cargo test` keeps the findings.
//!
//! | function | input | what runs |
//! |---|---|---|
//! | [`config`] | a YAML file | parsing, validation and error rendering of a configuration |
//! | [`rls_proto`] | a protobuf `RateLimitRequest` | prost decoding, request validation, descriptor matching, a decision in memory and the response |
//! | [`json`] | a JSON body | `/json` and `/v1/check` decoding, then as [`rls_proto`] |
//! | [`client_ip`] | header lines | `X-Forwarded-For` / `Forwarded` parsing behind trusted proxies, IP keys |
//! | [`jwt`] | a token, or claims to sign | bearer-token parsing, verification and claim extraction |
//! | [`ws_message`] | a WebSocket message | classification (JSON pointers), costs and a per-message decision |
//! | [`ws_frames`] | a WebSocket peer's bytes | the WebSocket gateway's frame reader: whole messages within the maximum, then an error or the end |
//! | [`gateway_head`] | an HTTP/1.1 request head | the gateway's head handling: `Host` rules, descriptors, hop-by-hop removal, forwarding fields |

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::pin::pin;
use std::sync::OnceLock;
use std::task::{Context, Poll, Waker};

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use flowgate::envoy::{Descriptor, Verdict};
use flowgate::http::key::X_FORWARDED_FOR;
use flowgate::http::key::{ClientIp, ForwardedHeader, Header, Jwt, KeyExtractor, PeerAddr, PeerIp};
use flowgate::store::MemoryStore;
use flowgate::ws::{Classifier, Client};
use http::header::{
    CONNECTION, CONTENT_LENGTH, HOST, HeaderName, HeaderValue, TE, TRAILER, TRANSFER_ENCODING,
    UPGRADE,
};
use prost::Message as _;

use flowgate_server::api::answer;
use flowgate_server::api::limits::InputLimits;
use flowgate_server::api::rls;
use flowgate_server::config::gateway::{EntryConfig, GatewayConfig, Source as EntrySource};
use flowgate_server::config::{Policy, Source};
use flowgate_server::gateway::{descriptors, forward, h1, path};

/// The rules decisions are made against: every matching shape (key+value, key only, nested,
/// unlimited, replaces, shadow) and every algorithm.
const RULES: &str = r#"
domain: fuzz
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: sliding_log, name: per-key}
    descriptors:
      - key: path
        value: /upload
        rate_limit: {period: 5m, requests_per_unit: 2, algorithm: fixed_window}
  - key: method
    value: POST
    descriptors:
      - key: plan
        value: free
        shadow_mode: true
        rate_limit: {unit: hour, requests_per_unit: 10, algorithm: sliding_window}
      - key: plan
        rate_limit: {unit: day, requests_per_unit: 100, algorithm: leaky_bucket, burst: 7}
  - key: vip
    value: "yes"
    rate_limit: {unlimited: true}
  - key: generic_key
    value: blocked
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1, name: user, replaces: [{name: per-key}]}
"#;

/// The HS256 secret tokens are verified with.
const JWT_SECRET: &[u8] = b"fuzz-secret";

/// What every decision needs, built once.
struct Fixture {
    /// [`RULES`], validated.
    policy: Policy,
    /// The `RateLimit-Policy` items of its rules.
    items: Vec<HeaderValue>,
    /// Counters (bounded, so a long fuzzing run cannot grow it without end).
    store: MemoryStore,
    /// The gateway section with every source.
    gateway: GatewayConfig,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let policy = Policy::from_sources(vec![Source {
            path: PathBuf::from("fuzz.yaml"),
            text: RULES.to_owned(),
        }])
        .unwrap_or_else(|e| panic!("the fuzzing rules are invalid: {e}"));
        let items = answer::policy_items(policy.rules.rules());
        let jwt = Jwt::hs256(JWT_SECRET);
        let entry = |key: &str, source: EntrySource| EntryConfig {
            key: key.to_owned(),
            source,
        };
        let gateway = GatewayConfig {
            descriptors: vec![
                vec![entry("remote_address", EntrySource::RemoteAddress)],
                vec![
                    entry(
                        "api_key",
                        EntrySource::Header(Header::new(HeaderName::from_static("x-api-key"))),
                    ),
                    entry("path", EntrySource::Path),
                ],
                vec![
                    entry("method", EntrySource::Method),
                    entry("plan", EntrySource::JwtClaim(jwt.claim("plan"))),
                ],
                vec![entry("host", EntrySource::Host)],
                vec![entry("generic_key", EntrySource::Generic("blocked".into()))],
            ],
            client_ip: trusting_client_ip(),
            ..GatewayConfig::default_for("fuzz")
        };
        Fixture {
            policy,
            items,
            store: MemoryStore::builder().max_keys(4096).build(),
            gateway,
        }
    })
}

/// Believes forwarding headers from loopback, 10/8 and 2001:db8::/32.
fn trusting_client_ip() -> ClientIp {
    let nets = ["127.0.0.0/8", "10.0.0.0/8", "2001:db8::/32"];
    ClientIp::new(nets.iter().filter_map(|n| n.parse().ok()))
}

/// Runs a future that never waits (the memory store answers at once) to completion.
fn now<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    match future.as_mut().poll(&mut cx) {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("an in-memory decision waited"),
    }
}

/// A configuration file: parsed and validated; its errors rendered (they quote positions in
/// the text, so rendering is part of what is tested).
pub fn config(data: &[u8]) {
    let text = String::from_utf8_lossy(data).into_owned();
    match Policy::from_sources(vec![Source {
        path: PathBuf::from("fuzz.yaml"),
        text,
    }]) {
        Ok(policy) => {
            let _ = flowgate_server::gateway::effective_config(&policy);
            if let Some(ws) = &policy.websocket {
                let _ = ws.limits.build();
            }
            let _ = answer::policy_items(policy.rules.rules());
        }
        Err(errors) => {
            let rendered = errors.to_string();
            assert!(!rendered.is_empty(), "a rejected configuration says why");
        }
    }
}

/// Decides `descriptors` against [`RULES`] in memory and renders the gRPC and JSON answers.
fn decide(domain: &str, descriptors: &[Descriptor], hits: u64) {
    let f = fixture();
    let verdict: Verdict<'_> = now(flowgate::envoy::check(
        &f.policy.rules,
        &f.store,
        domain,
        descriptors,
        hits,
    ));
    assert_eq!(
        verdict.descriptors.len(),
        descriptors.len(),
        "one status per descriptor"
    );
    let answer = answer::answer(&verdict, &f.items);
    let _ = answer.clone().render(false);
    if let Ok(answer) = answer.decided() {
        let response = rls::response(&verdict, answer);
        assert_eq!(response.statuses.len(), descriptors.len());
        let _ = serde_json::to_vec(&rls::json::JsonResponse::from(&response));
    }
}

/// A protobuf `RateLimitRequest` (what Envoy sends over gRPC).
pub fn rls_proto(data: &[u8]) {
    let Ok(request) = RateLimitRequest::decode(data) else {
        return;
    };
    if let Ok(request) = rls::parse_request(request, &InputLimits::default()) {
        decide(&request.domain, &request.descriptors, request.hits_addend);
        // The same descriptors under the fuzzing domain, so matching is reached whatever the
        // domain was.
        decide("fuzz", &request.descriptors, request.hits_addend);
    }
}

/// A JSON body for `POST /json` and for `POST /v1/check`.
pub fn json(data: &[u8]) {
    for request in [
        flowgate_server::api::http::parse_json(data, &InputLimits::default()),
        flowgate_server::api::http::check::parse_check(data, &InputLimits::default()),
    ]
    .into_iter()
    .flatten()
    {
        decide(&request.domain, &request.descriptors, request.hits_addend);
        decide("fuzz", &request.descriptors, request.hits_addend);
    }
}

/// Splits `data` into lines for header values (lines that are not valid values are dropped).
fn header_values(data: &[u8]) -> impl Iterator<Item = HeaderValue> + '_ {
    data.split(|&b| b == b'\n')
        .filter_map(|line| HeaderValue::from_bytes(line).ok())
}

/// `X-Forwarded-For` and `Forwarded` lines behind a trusted proxy: the first byte picks the
/// peer (trusted v4, trusted v6, untrusted) and the IPv6 key prefix; each further line is one
/// header line of both kinds.
pub fn client_ip(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let peer: IpAddr = match selector % 3 {
        0 => IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3)),
        1 => IpAddr::V6(
            "2001:db8::7"
                .parse()
                .unwrap_or(std::net::Ipv6Addr::LOCALHOST),
        ),
        _ => IpAddr::V4(Ipv4Addr::new(198, 51, 100, 1)),
    };
    let mut request = http::Request::new(());
    for value in header_values(rest) {
        let headers = request.headers_mut();
        headers.append(X_FORWARDED_FOR.clone(), value.clone());
        headers.append(http::header::FORWARDED, value);
    }
    request
        .extensions_mut()
        .insert(PeerAddr(SocketAddr::new(peer, 4000)));
    let (parts, ()) = request.into_parts();
    let prefix = selector / 3 % 129;
    for header in [ForwardedHeader::XForwardedFor, ForwardedHeader::Forwarded] {
        let extractor = trusting_client_ip().header(header).peer_ip(
            PeerIp::new()
                .ipv6_prefix(prefix)
                .ipv4_prefix(prefix.min(32)),
        );
        let Ok(ip) = extractor.client_ip(&parts) else {
            panic!("a request with a peer address always has a client address");
        };
        if !extractor.is_trusted(peer) {
            assert_eq!(ip, peer, "an untrusted peer's headers are ignored");
        }
        let key = extractor
            .extract(&parts)
            .unwrap_or_else(|e| panic!("keying {ip} failed: {}", e.detail));
        assert!(!key.is_empty());
    }
}

/// A bearer token. The first byte picks the form: a raw `Authorization` value (parsing and
/// verification of arbitrary tokens), or JSON claims that are signed with the right key first
/// (claim extraction behind a valid signature).
pub fn jwt(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let jwt = Jwt::hs256(JWT_SECRET);
    let value = if selector % 2 == 0 {
        let Ok(value) = HeaderValue::from_bytes(rest) else {
            return;
        };
        value
    } else {
        let Ok(claims) = serde_json::from_slice::<serde_json::Value>(rest) else {
            return;
        };
        let Ok(token) = jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
            &claims,
            &jsonwebtoken::EncodingKey::from_secret(JWT_SECRET),
        ) else {
            return;
        };
        let Ok(value) = HeaderValue::from_str(&format!("Bearer {token}")) else {
            panic!("a signed token is a valid header value");
        };
        value
    };
    let mut request = http::Request::new(());
    request
        .headers_mut()
        .insert(http::header::AUTHORIZATION, value);
    let (parts, ()) = request.into_parts();
    let claims = jwt.claims(&parts);
    for name in ["sub", "plan", "exp", ""] {
        let extracted = jwt.claim(name).extract(&parts);
        if let Err(rejection) = &extracted {
            assert_eq!(rejection.status, http::StatusCode::UNAUTHORIZED);
        }
        if claims.is_err() {
            assert!(extracted.is_err(), "no claim without a verified token");
        }
    }
}

/// The limits a WebSocket connection is judged by in [`ws_message`].
const WS_CONFIG: &str = r#"
domain: fuzz-ws
descriptors: []
websocket:
  upstream: ws://127.0.0.1:9
  classify: {type: /type, cost: /symbols, room: /room}
  limits:
    messages: {limit: 50, per: 1s}
    bytes: {limit: 65536, per: 1s}
    room_messages: {limit: 20, per: 1s}
    costs: {subscribe: 5, ping: 0}
    release: [unsubscribe, leave]
    max_message_size: 4096
    close_after: {violations: 3, within: 10s}
"#;

/// A client's WebSocket message (text or binary: the payload's bytes): classified with the
/// configured pointers and with pointers taken from the message's first line, costed and
/// decided by a connection's limits; a rejection renders its error frame.
pub fn ws_message(data: &[u8]) {
    static WS: OnceLock<flowgate_server::config::websocket::WebSocketConfig> = OnceLock::new();
    let ws = WS.get_or_init(|| {
        let policy = Policy::from_sources(vec![Source {
            path: PathBuf::from("fuzz-ws.yaml"),
            text: WS_CONFIG.to_owned(),
        }])
        .unwrap_or_else(|e| panic!("the fuzzing websocket section is invalid: {e}"));
        policy
            .websocket
            .unwrap_or_else(|| panic!("the fuzzing websocket section is missing"))
    });
    // Pointers from the input: `kind cost room` on the first line.
    if let Some(newline) = data.iter().position(|&b| b == b'\n') {
        let (line, payload) = (&data[..newline], &data[newline + 1..]);
        let line = String::from_utf8_lossy(line);
        let mut pointers = line.split(' ');
        let classifier = Classifier::new()
            .kind_at(pointers.next().unwrap_or_default())
            .cost_at(pointers.next().unwrap_or_default())
            .room_at(pointers.next().unwrap_or_default());
        let _ = classifier.classify(payload).message(payload.len());
    }
    let Ok(limiter) = ws.limits.build() else {
        panic!("the fuzzing websocket limits do not build");
    };
    let Ok(mut session) = limiter.admit(Client::new("192.0.2.1").user("u").room("lobby")) else {
        panic!("the first connection is admitted");
    };
    let store = &fixture().store;
    // The message, then its halves: a few decisions on one connection.
    let mid = data.len() / 2;
    for payload in [data, &data[..mid], &data[mid..]] {
        let classified = ws.classifier.classify(payload);
        let message = classified.message(payload.len());
        match now(session.check(store, &message)) {
            flowgate::ws::Action::Reject(rejection) => {
                let frame = limiter.error_frame(&rejection);
                assert!(serde_json::from_str::<serde_json::Value>(&frame).is_ok());
            }
            flowgate::ws::Action::Close(close) => {
                assert!((1000..5000).contains(&close.code));
                break;
            }
            _ => {}
        }
    }
}

/// An HTTP/1.1 request head (`GET / HTTP/1.1\r\nHost: …\r\n\r\n`), parsed as hyper parses it
/// (httparse) and handled as the gateway handles it before forwarding: `CONNECT` refused, the
/// `Host` rules, descriptors from every source and their decision; then the head written for
/// the upstream (hop-by-hop fields removed, `X-Forwarded-For`, `Forwarded` and `Via` written
/// anew, the target in origin form) must parse back, whole, with none of what it must lose.
pub fn gateway_head(data: &[u8]) {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut head = httparse::Request::new(&mut headers);
    let Ok(httparse::Status::Complete(_)) = head.parse(data) else {
        return;
    };
    let (Some(method), Some(path), Some(version)) = (head.method, head.path, head.version) else {
        return;
    };
    let mut builder = http::Request::builder()
        .method(method)
        .uri(path)
        .version(if version == 0 {
            http::Version::HTTP_10
        } else {
            http::Version::HTTP_11
        });
    for h in head.headers.iter() {
        builder = builder.header(h.name, h.value);
    }
    // Heads hyper would not turn into a request (bad method, target or field) never reach
    // the gateway.
    let Ok(request) = builder.body(()) else {
        return;
    };
    let (mut parts, ()) = request.into_parts();
    if parts.method == http::Method::CONNECT {
        return;
    }
    if forward::check_host(&mut parts).is_err() {
        return;
    }
    path::normalise_uri(&mut parts.uri);
    // Normal: no dot segment, no `//`, no escape of an unreserved character, and stays so.
    let normal = parts.uri.path();
    if normal.starts_with('/') {
        assert!(!normal.contains("//") && !normal.contains("/./") && !normal.contains("/../"));
        assert!(
            !normal.ends_with("/.") && !normal.ends_with("/.."),
            "{normal}"
        );
        assert_eq!(path::normalise(normal), normal);
    }
    let peer = SocketAddr::from(([10, 0, 0, 9], 5000));
    parts.extensions.insert(PeerAddr(peer));
    let f = fixture();
    match descriptors::of_request(&f.gateway, &parts) {
        Ok(descriptors) => {
            for d in &descriptors {
                assert!(d.entries.iter().all(|e| !e.key.is_empty()));
            }
            if !descriptors.is_empty() {
                decide(&f.gateway.domain, &descriptors, 1);
            }
        }
        Err(rejection) => {
            assert!(rejection.status.is_client_error(), "{}", rejection.status);
            return;
        }
    }
    let had_te = parts.headers.contains_key(TRANSFER_ENCODING);
    // The head the upstream gets, for an untrusted peer (its own forwarding fields replaced),
    // read back as the upstream reads it.
    forward::remove_hop_by_hop(&mut parts.headers);
    let hop = forward::Hop::new(peer.ip(), false);
    let upstream = HeaderValue::from_static("upstream.example");
    let written = h1::RequestHead::write(&parts, &hop, &upstream, false);
    let mut fields = [httparse::EMPTY_HEADER; 80];
    let mut sent = httparse::Request::new(&mut fields);
    assert!(
        matches!(sent.parse(&written.bytes), Ok(httparse::Status::Complete(n)) if n == written.bytes.len()),
        "the upstream head does not parse: {:?}",
        String::from_utf8_lossy(&written.bytes)
    );
    assert_eq!(sent.version, Some(1));
    assert!(
        sent.path.is_some_and(|p| p.starts_with('/') || p == "*"),
        "{:?}",
        sent.path
    );
    let count = |name: &str| {
        sent.headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case(name))
            .count()
    };
    for name in [CONNECTION, TRANSFER_ENCODING, TE, TRAILER, UPGRADE] {
        assert_eq!(count(name.as_str()), 0, "{name} was forwarded");
    }
    assert_eq!(count("keep-alive"), 0);
    assert!(
        sent.headers
            .iter()
            .all(|h| !h.name.to_ascii_lowercase().starts_with("proxy-"))
    );
    if had_te {
        assert_eq!(
            count(CONTENT_LENGTH.as_str()),
            0,
            "TE and CL were forwarded"
        );
    }
    assert_eq!(count(HOST.as_str()), 1);
    assert_eq!(count("via"), 1);
    let xff: Vec<&[u8]> = sent
        .headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("x-forwarded-for"))
        .map(|h| h.value)
        .collect();
    assert_eq!(
        xff,
        [b"10.0.0.9".as_slice()],
        "the client's own X-Forwarded-For was kept"
    );
}

/// The most a message may be in [`ws_frames`].
const WS_FRAMES_MAX: usize = 1000;

/// A WebSocket peer's bytes as the WebSocket gateway reads them. The first byte says how: bit 0
/// a client's (masked) frames, bit 1 payloads kept for the classifier, the other six bits the
/// most one read returns (0: all at once). Every message read must be whole and within the
/// maximum — its frames' bytes at least its payload and a header, its kept payload exactly its
/// size, a close frame's code one a peer may send — and reading must end in an error or at
/// the end of the bytes.
pub fn ws_frames(data: &[u8]) {
    use flowgate_server::gateway::ws::frames::{Inbound, Kind};
    let Some((&how, input)) = data.split_first() else {
        return;
    };
    let (masked, keep) = (how & 1 != 0, how & 2 != 0);
    let chunk = match usize::from(how >> 2) {
        0 => usize::MAX,
        n => n,
    };
    let mut inbound = Inbound::new(masked, WS_FRAMES_MAX, keep);
    let mut peer = crate::trickle::Trickle::new(input, chunk);
    let mut cx = Context::from_waker(Waker::noop());
    // A message takes at least its two-byte header: no more messages than half the bytes.
    for _ in 0..=input.len() / 2 {
        match inbound.poll_message(&mut peer, &mut cx) {
            Poll::Ready(Some(Ok(message))) => {
                assert!(
                    message.size <= WS_FRAMES_MAX,
                    "{message:?} over the maximum"
                );
                assert!(inbound.frames().len() >= message.size + 2, "{message:?}");
                match message.kind {
                    Kind::Text | Kind::Binary if keep => {
                        assert_eq!(inbound.payload().len(), message.size);
                    }
                    Kind::Close => {
                        if let Some((code, reason)) = inbound.close() {
                            assert!((1000..5000).contains(&code), "close code {code}");
                            assert!(reason.len() <= 123);
                        }
                    }
                    _ => assert!(inbound.payload().is_empty()),
                }
            }
            Poll::Ready(_) => return,
            Poll::Pending => panic!("a trickle never waits"),
        }
    }
    panic!("more messages than the bytes can hold");
}
