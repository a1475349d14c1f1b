//! The HTTP API (axum):
//!
//! | route | what |
//! |---|---|
//! | `POST /json` | the RLS request/response in proto-JSON, as envoyproxy/ratelimit: 200 or 429 (the `RateLimit` fields also as response headers) |
//! | `POST /v1/check` | Flowgate's JSON: per descriptor `allowed, limit, burst, remaining, reset_after_ms, retry_after_ms, algorithm, name, shadow`; 200, 429 or 503 |
//! | `GET /healthz` | the process is up |
//! | `GET /readyz` | a configuration is loaded and the server is not draining (503 otherwise); the store's health is a field (with Redis, Redis itself is asked), and counts only with `--ready-requires-store` |
//! | `GET /metrics` | Prometheus / OpenMetrics text |
//! | `GET /v1/config` | the active rules and configuration version |
//! | `GET`/`DELETE /v1/keys/{domain}/{descriptor}` | one counter, shown or reset (admin token) |
//! | `GET /v1/keys/{domain}?prefix=…` | the domain's counters with their usage, paginated (admin token) |
//!
//! Malformed bodies, and bodies beyond the service's [`InputLimits`] (descriptors, entries,
//! key and value lengths), get 400 with an RFC 9457 `application/problem+json` body; a body
//! larger than `max_body_bytes` gets 413 with one, unread; a `POST` that is not
//! `Content-Type: application/json` gets 415 (`media_type.rs`, a guard against cross-site
//! requests); every decision is rendered by the one renderer ([`super::answer`]), as on gRPC
//! and the gateway. Handlers may read the client's address (`Peer`).

pub(crate) mod admin;
// Public (hidden) for the fuzz targets, `flowgate_testing::fuzzing`.
#[doc(hidden)]
pub mod check;
pub(crate) mod config;
pub(crate) mod leases;
pub(crate) mod media_type;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{ConnectInfo, DefaultBodyLimit, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use serde::Serialize;

use super::Service;
use super::limits::InputLimits;
use super::problem::Problem;
use super::rls::{self, RlsRequest, json::JsonRequest, json::JsonResponse};
use crate::metrics::Api;

/// How long `/readyz` waits for the store.
const READY_TIMEOUT: Duration = Duration::from_secs(1);

/// The client's address, as a handler extracts it ([`serve`] adds it to every request; absent
/// when the router is served some other way).
pub(crate) type Peer = Option<Extension<ConnectInfo<SocketAddr>>>;

/// The address in `peer`, if any.
pub(crate) fn peer_address(peer: &Peer) -> Option<SocketAddr> {
    peer.as_ref().map(|Extension(ConnectInfo(addr))| *addr)
}

/// Serves `router` (the API, with the dashboard when on) over HTTP/1.1 on `acceptor` until
/// `shutdown` completes, then waits up to `grace` for requests in flight. A request head must
/// arrive within the acceptor's header read timeout (also the idle time of a kept-alive
/// connection) and fit its header size limit (`431` beyond), as on the gateway. Every request
/// carries its client's address (`Peer`).
pub async fn serve(
    acceptor: crate::listen::Acceptor,
    router: Router,
    shutdown: impl std::future::Future<Output = ()> + Send,
    grace: Duration,
) -> std::io::Result<()> {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new());
    crate::listen::configure(&mut http, acceptor.limits());
    crate::listen::serve_connections(acceptor, "http", shutdown, grace, |stream, peer| {
        use tower_layer::Layer as _;
        let router = Extension(ConnectInfo(peer)).layer(router.clone());
        http.serve_connection(
            hyper_util::rt::TokioIo::new(stream),
            hyper_util::service::TowerToHyperService::new(router),
        )
    })
    .await
}

/// The HTTP routes over `service`.
pub fn router(service: Arc<Service>) -> Router {
    let limit = DefaultBodyLimit::max(service.input_limits().max_body_bytes);
    Router::new()
        .route("/json", post(json))
        .route("/v1/check", post(check::check))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/v1/config", get(config::config))
        // `GET /v1/keys/{domain}` (a domain alone) lists its counters: `inspect` hands it to
        // `admin::usage::list` (one catch-all route: the router cannot hold both).
        .route(
            "/v1/keys/{*descriptor}",
            get(admin::inspect).delete(admin::reset),
        )
        .route(
            "/v1/leases/{name}/{key}",
            post(leases::acquire).get(leases::held),
        )
        .route(
            "/v1/leases/{name}/{key}/{lease}",
            axum::routing::put(leases::renew).delete(leases::release),
        )
        .route("/openapi.json", get(super::openapi::serve))
        .layer(limit)
        .with_state(service)
}

/// The request body, or the problem answering why it could not be read (`413` over
/// `--max-body-bytes`, counted).
pub(crate) fn body_or_problem(
    service: &Service,
    body: Result<Bytes, BytesRejection>,
) -> Result<Bytes, Problem> {
    body.map_err(|rejection| {
        let status = rejection.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            service.metrics().oversized_body();
            Problem::status(
                status,
                format!(
                    "the request body is over {} bytes",
                    service.max_body_bytes()
                ),
            )
        } else {
            Problem::status(status, rejection.body_text())
        }
    })
}

/// `GET /healthz`: the process is up.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "operations",
    responses((status = 200, description = "The process is alive", content_type = "text/plain", body = String))
)]
pub(crate) async fn healthz() -> &'static str {
    "ok\n"
}

/// `body` as JSON with `status`.
pub(crate) fn json_response(status: StatusCode, body: &impl Serialize) -> Response {
    let mut response = (status, serde_json::to_vec(body).unwrap_or_default()).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// The `/json` request, through the same validation as gRPC and `/v1/check`
/// ([`rls::parse_request`]), or the 400 for it.
#[doc(hidden)]
pub fn parse_json(body: &[u8], limits: &InputLimits) -> Result<RlsRequest, Problem> {
    let request = serde_json::from_slice::<JsonRequest>(body)
        .map_err(|e| Problem::bad_request(format!("invalid RateLimitRequest JSON: {e}")))?;
    request
        .into_proto()
        .and_then(|request| rls::parse_request(request, limits))
        .map_err(|e| Problem::bad_request(e.0))
}

/// `POST /json`: envoyproxy/ratelimit's HTTP endpoint.
#[utoipa::path(
    post,
    path = "/json",
    tag = "decisions",
    request_body(content = crate::api::openapi::RlsJsonRequest, description = "envoy.service.ratelimit.v3.RateLimitRequest in proto-JSON"),
    responses(
        (status = 200, description = "OK", body = JsonResponse),
        (status = 429, description = "OVER_LIMIT", body = JsonResponse),
        (status = 400, description = "Malformed request", body = crate::api::openapi::ProblemBody, content_type = "application/problem+json"),
        (status = 413, description = "The body is over --max-body-bytes", body = crate::api::openapi::ProblemBody, content_type = "application/problem+json"),
        (status = 415, description = "The request is not `Content-Type: application/json` (a guard against cross-site requests)", body = crate::api::openapi::ProblemBody, content_type = "application/problem+json"),
        (status = 503, description = "The store could not be asked and a limit fails closed", body = crate::api::openapi::ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn json(
    State(service): State<Arc<Service>>,
    _: media_type::JsonBody,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body = match body_or_problem(&service, body) {
        Ok(body) => body,
        Err(problem) => return problem.into_response(),
    };
    let request = match parse_json(&body, service.input_limits()) {
        Ok(request) => request,
        Err(problem) => return problem.into_response(),
    };
    let active = service.active();
    let verdict = service
        .decide(
            &active,
            Api::Json,
            &request.domain,
            &request.descriptors,
            request.hits_addend,
        )
        .await;
    let answer = match active.answer(&verdict).decided() {
        Ok(answer) => answer,
        Err(failure) => return (*failure).map(axum::body::Body::from),
    };
    let status = if answer.kind().over_limit() {
        StatusCode::TOO_MANY_REQUESTS
    } else {
        StatusCode::OK
    };
    // The answer's fields go in the body (`responseHeadersToAdd`, as envoyproxy/ratelimit
    // sends them) and on the response itself, as on `/v1/check`.
    let fields = answer.clone();
    let mut response = rls::response(&verdict, answer);
    if service.rls_settings().dynamic_metadata {
        response.dynamic_metadata = Some(rls::dynamic_metadata(&request, &verdict));
    }
    let mut response = json_response(status, &JsonResponse::from(&response));
    fields.apply(response.headers_mut());
    response
}

/// `GET /readyz`: ready while a configuration is loaded and the server is not draining. The
/// store's health is reported beside it, and counts only in strict mode
/// (`--ready-requires-store`): a store outage is what each rule's `fail` mode is for, and must
/// not take every instance out of a load balancer at once.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "operations",
    responses(
        (status = 200, description = "Ready", body = ReadyResponse),
        (status = 503, description = "Draining, or (strict mode) the store does not answer", body = ReadyResponse),
    )
)]
pub(crate) async fn readyz(State(service): State<Arc<Service>>) -> Response {
    let version = service.active().version;
    let store = service.store_reachable(READY_TIMEOUT).await;
    let backend = service.backend();
    let draining = service.is_draining();
    let strict = service.readiness_requires_store();
    let ready = !draining && (store || !strict);
    let body = ReadyResponse {
        ready,
        draining,
        config_version: version,
        store: if store { "ok" } else { "unreachable" },
        store_kind: backend.kind(),
        store_required: strict,
        breaker_open: backend.fallback_stats().is_some_and(|s| s.breaker_open),
    };
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    json_response(status, &body)
}

/// `GET /readyz` response body.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct ReadyResponse {
    /// Whether the server takes traffic.
    ready: bool,
    /// Whether it is stopping.
    draining: bool,
    /// The running configuration's version.
    config_version: u64,
    /// `ok` or `unreachable`.
    store: &'static str,
    /// `local` or `shared`.
    store_kind: &'static str,
    /// Whether readiness requires the store (`--ready-requires-store`).
    store_required: bool,
    /// Whether the shared store's circuit breaker is open.
    breaker_open: bool,
}

/// `GET /metrics`.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "operations",
    responses((status = 200, description = "Every metric in the OpenMetrics text format", content_type = "application/openmetrics-text", body = String))
)]
pub(crate) async fn metrics(State(service): State<Arc<Service>>) -> Response {
    let mut response = service.metrics().encode().into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    response
}
