//! The upgrade: checks a WebSocket upgrade request, admits it ([`WsLimiter::admit`]), upgrades
//! to the upstream, then answers the client `101` and starts the relay.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use flowgate::answer::Rendered;
use flowgate::answer::problem::Problem;
use flowgate::http::key::{KeyExtractor, KeyRejection, PeerAddr};
use flowgate::ws::Client;
use http::header::{
    CONNECTION, HOST, SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_EXTENSIONS, SEC_WEBSOCKET_KEY,
    SEC_WEBSOCKET_PROTOCOL, SEC_WEBSOCKET_VERSION, UPGRADE,
};
use http::request::Parts;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{Empty, Full};
use hyper::body::Incoming;
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::handshake::client::generate_key;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;

use super::relay::{self, Relay};
use super::{Runtime, WsGateway};
use crate::config::websocket::KeySource;
use crate::gateway::descriptors::present;
use crate::gateway::forward;

/// The response body the WebSocket listener writes.
type Body = Full<Bytes>;

/// A problem response.
fn problem(status: StatusCode, detail: impl Into<String>) -> Response<Body> {
    Problem::status(status, detail)
        .into_response()
        .map(Full::new)
}

/// Whether the comma-separated header `name` has `token` (case-insensitive).
fn has_token(headers: &HeaderMap, name: &http::HeaderName, token: &str) -> bool {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

/// Answers one request on the WebSocket listener.
pub(super) async fn handle(
    gateway: &Arc<WsGateway>,
    peer: SocketAddr,
    mut request: Request<Incoming>,
) -> Response<Body> {
    let active = gateway.service().active();
    let Some(runtime) = gateway.runtime(&active) else {
        return problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "the running configuration has no `websocket` section",
        );
    };
    drop(active);
    let headers = request.headers();
    let is_upgrade =
        has_token(headers, &UPGRADE, "websocket") && has_token(headers, &CONNECTION, "upgrade");
    if !is_upgrade {
        let mut response = problem(
            StatusCode::UPGRADE_REQUIRED,
            "this is a WebSocket gateway: send a WebSocket upgrade (RFC 6455)",
        );
        response
            .headers_mut()
            .insert(UPGRADE, HeaderValue::from_static("websocket"));
        response
            .headers_mut()
            .insert(SEC_WEBSOCKET_VERSION, HeaderValue::from_static("13"));
        return response;
    }
    if request.method() != Method::GET || request.version() != http::Version::HTTP_11 {
        return problem(
            StatusCode::BAD_REQUEST,
            "a WebSocket upgrade is a GET over HTTP/1.1",
        );
    }
    if headers.get(SEC_WEBSOCKET_VERSION).is_none_or(|v| v != "13") {
        let mut response = problem(StatusCode::BAD_REQUEST, "Sec-WebSocket-Version must be 13");
        response
            .headers_mut()
            .insert(SEC_WEBSOCKET_VERSION, HeaderValue::from_static("13"));
        return response;
    }
    let Some(key) = headers.get(SEC_WEBSOCKET_KEY).cloned() else {
        return problem(StatusCode::BAD_REQUEST, "no Sec-WebSocket-Key");
    };
    let upgrade = hyper::upgrade::on(&mut request);
    let (mut parts, _body) = request.into_parts();
    if let Err((status, detail)) = forward::check_host(&mut parts) {
        return problem(status, detail);
    }
    // Keyed and forwarded alike, as on the HTTP gateway.
    crate::gateway::path::normalise_uri(&mut parts.uri);
    parts.extensions.insert(PeerAddr(peer));

    // Who is connecting: the treatment of the HTTP gateway, before any upgrade work.
    let config = &runtime.config;
    let client = match who(&runtime, &parts) {
        Ok(client) => client,
        Err(rejection) => return problem(rejection.status, rejection.detail),
    };
    let session = match runtime.limiter.admit(client.clone()) {
        Ok(session) => Box::new(session),
        Err(refusal) => {
            let answer = refusal.answer(super::CONNECT_LIMIT_NAME, &runtime.connect_item);
            return match answer.render(false) {
                Rendered::Refuse(response) => response.map(Full::new),
                // A refusal's answer refuses; should one ever allow, the refusal stands alone.
                Rendered::Pass(_) => problem(StatusCode::TOO_MANY_REQUESTS, "refused"),
            };
        }
    };
    let outbound = match &runtime.outbound {
        None => None,
        // The outbound limits have no upgrade layers (validated), so this admits.
        Some(limiter) => match limiter.admit(client) {
            Ok(session) => Some(Box::new(session)),
            Err(_) => {
                return problem(
                    StatusCode::TOO_MANY_REQUESTS,
                    "the outbound limits refused the connection",
                );
            }
        },
    };

    // The upstream first: the client is answered `101` only once the upstream has upgraded.
    let timeout = config.handshake_timeout;
    let upstream = match tokio::time::timeout(timeout, connect_upstream(&runtime, &parts, peer))
        .await
    {
        Ok(Ok(upstream)) => upstream,
        Ok(Err(failure)) => {
            let (counter, status) = match failure {
                Failure::Connect(_) => (&gateway.failures.connect, StatusCode::BAD_GATEWAY),
                Failure::Refused(_) => (&gateway.failures.refused, StatusCode::BAD_GATEWAY),
            };
            counter.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(upstream = %config.upstream, "websocket upgrade to the upstream failed: {failure}");
            return problem(
                status,
                format!("the upstream {}: {failure}", config.upstream),
            );
        }
        Err(_) => {
            gateway.failures.timeout.fetch_add(1, Ordering::Relaxed);
            return problem(
                StatusCode::GATEWAY_TIMEOUT,
                format!(
                    "the upstream {} did not accept the WebSocket within {}",
                    config.upstream,
                    humantime::format_duration(timeout)
                ),
            );
        }
    };
    let Some(guard) = gateway.guard() else {
        return problem(StatusCode::SERVICE_UNAVAILABLE, "the gateway is stopping");
    };

    let mut response = Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(CONNECTION, "upgrade")
        .header(UPGRADE, "websocket")
        .header(SEC_WEBSOCKET_ACCEPT, derive_accept_key(key.as_bytes()))
        .body(Full::new(Bytes::new()))
        .unwrap_or_default();
    if let Some(protocol) = upstream.protocol {
        response
            .headers_mut()
            .insert(SEC_WEBSOCKET_PROTOCOL, protocol);
    }
    let gateway = gateway.clone();
    tokio::spawn(async move {
        let _guard = guard;
        let client_io = match tokio::time::timeout(timeout, upgrade).await {
            Ok(Ok(io)) => io,
            Ok(Err(e)) => {
                tracing::debug!(%peer, "the client's upgrade failed: {e}");
                return;
            }
            Err(_) => return,
        };
        let relay = Relay::new(&runtime, client_io, upstream.io, session, outbound);
        let _counted = Counted::new(&gateway.relays);
        Box::pin(relay::run(relay, &gateway, &runtime)).await;
    });
    response
}

/// The client as the limiter sees it: address, user, role, room.
fn who(runtime: &Runtime, parts: &Parts) -> Result<Client, KeyRejection> {
    let config = &runtime.config;
    let mut client = Client::new(config.client_ip.extract(parts)?);
    client.user = value_of(config.user.as_ref(), parts)?;
    client.role = value_of(config.role.as_ref(), parts)?;
    client.room = value_of(config.room.as_ref(), parts)?;
    Ok(client)
}

/// The value of `source` in the request: `None` when the request lacks it (no such header,
/// no valid token or claim, no such parameter); a value that is present but unusable as a
/// key (not visible ASCII, too long, repeated) is an error (400).
fn value_of(source: Option<&KeySource>, parts: &Parts) -> Result<Option<String>, KeyRejection> {
    let Some(source) = source else {
        return Ok(None);
    };
    Ok(match source {
        KeySource::Header(header) => present(header.extract(parts))?,
        KeySource::JwtClaim(claim) => present(claim.extract(parts))?,
        KeySource::Query(name) => parts.uri.query().and_then(|q| {
            q.split('&').find_map(|pair| {
                let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                (k == name && !v.is_empty()).then(|| v.to_owned())
            })
        }),
        KeySource::Path => Some(parts.uri.path().to_owned()),
    })
}

/// An upstream that accepted the WebSocket.
struct UpstreamSocket {
    /// The upgraded connection.
    io: Upgraded,
    /// The subprotocol it chose, passed on to the client.
    protocol: Option<HeaderValue>,
}

/// Why the upgrade to the upstream failed.
#[derive(Debug, thiserror::Error)]
enum Failure {
    /// No connection, or the HTTP exchange broke.
    #[error("cannot connect: {0}")]
    Connect(String),
    /// It answered, but not with a valid `101`.
    #[error("refused the WebSocket upgrade: {0}")]
    Refused(String),
}

/// Opens a connection to the upstream and upgrades it, forwarding the client's request
/// (path, query, headers minus the hop-by-hop and WebSocket handshake fields, plus the
/// forwarding fields) with a key of the gateway's own.
async fn connect_upstream(
    runtime: &Runtime,
    parts: &Parts,
    peer: SocketAddr,
) -> Result<UpstreamSocket, Failure> {
    let upstream = &runtime.config.upstream;
    let tcp = TcpStream::connect(upstream.address())
        .await
        .map_err(|e| Failure::Connect(e.to_string()))?;
    let _ = tcp.set_nodelay(true);
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(|e| Failure::Connect(e.to_string()))?;
    tokio::spawn(async move {
        let _ = connection.with_upgrades().await;
    });
    let mut headers = parts.headers.clone();
    forward::remove_hop_by_hop(&mut headers);
    for name in [
        SEC_WEBSOCKET_KEY,
        SEC_WEBSOCKET_EXTENSIONS,
        SEC_WEBSOCKET_VERSION,
    ] {
        headers.remove(name);
    }
    // Earlier hops only from a trusted proxy: a client's own X-Forwarded-For is replaced.
    let trusted = runtime.config.client_ip.is_trusted(peer.ip());
    forward::Hop::new(peer.ip(), trusted).apply(&mut headers);
    if !headers.contains_key(HOST)
        && let Ok(host) = HeaderValue::from_str(upstream.authority.as_str())
    {
        headers.insert(HOST, host);
    }
    let key = generate_key();
    headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(UPGRADE, HeaderValue::from_static("websocket"));
    headers.insert(SEC_WEBSOCKET_VERSION, HeaderValue::from_static("13"));
    if let Ok(value) = HeaderValue::from_str(&key) {
        headers.insert(SEC_WEBSOCKET_KEY, value);
    }
    let mut request = Request::new(Empty::<Bytes>::new());
    *request.uri_mut() = upstream
        .target(parts.uri.path_and_query())
        .parse()
        .map_err(|_| Failure::Connect("the request target is not valid".into()))?;
    *request.headers_mut() = headers;
    let mut response = sender
        .send_request(request)
        .await
        .map_err(|e| Failure::Connect(e.to_string()))?;
    if response.status() != StatusCode::SWITCHING_PROTOCOLS {
        return Err(Failure::Refused(format!(
            "it answered {}",
            response.status()
        )));
    }
    let accept = response.headers().get(SEC_WEBSOCKET_ACCEPT);
    if accept.is_none_or(|a| a.as_bytes() != derive_accept_key(key.as_bytes()).as_bytes()) {
        return Err(Failure::Refused("a wrong Sec-WebSocket-Accept".into()));
    }
    let protocol = response.headers().get(SEC_WEBSOCKET_PROTOCOL).cloned();
    let io = hyper::upgrade::on(&mut response)
        .await
        .map_err(|e| Failure::Connect(e.to_string()))?;
    Ok(UpstreamSocket { io, protocol })
}

/// Counts one relay while it lives (a panic included).
struct Counted<'a>(&'a std::sync::atomic::AtomicU64);

impl<'a> Counted<'a> {
    fn new(counter: &'a std::sync::atomic::AtomicU64) -> Self {
        counter.fetch_add(1, Ordering::Relaxed);
        Counted(counter)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
