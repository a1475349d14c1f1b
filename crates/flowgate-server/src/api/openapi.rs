//! `GET /openapi.json`: the HTTP API described as OpenAPI 3.1, generated from the handlers'
//! annotations and the response types themselves (utoipa), so it cannot drift from the code.

use utoipa::ToSchema;

/// An RFC 9457 problem (`application/problem+json`), as every refusal of the HTTP API is
/// written.
#[derive(Debug, ToSchema)]
#[allow(dead_code)]
pub(crate) struct ProblemBody {
    /// A URI naming the kind of problem (`about:blank` when the status says it all).
    #[schema(rename = "type")]
    type_uri: String,
    /// A short summary of the kind of problem.
    title: String,
    /// The HTTP status.
    status: u16,
    /// What happened this time.
    detail: String,
    /// The limits a 429 exceeded.
    #[schema(rename = "violated-policies")]
    violated_policies: Option<Vec<String>>,
}

/// `POST /json`'s body: `envoy.service.ratelimit.v3.RateLimitRequest` in proto-JSON (names in
/// lowerCamelCase; the .proto's snake_case names are accepted too). The byte limits on
/// domains, keys and values (`InputLimits`) are in docs/service.md, not in this schema.
#[derive(Debug, serde::Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub(crate) struct RlsJsonRequest {
    /// The domain of the rules to check against.
    #[schema(min_length = 1)]
    domain: String,
    /// The descriptors; all must allow the request.
    #[schema(min_items = 1, max_items = 64)]
    descriptors: Vec<RlsJsonDescriptor>,
    /// Units every descriptor asks for (0 or absent: 1).
    #[serde(default, rename = "hitsAddend")]
    #[schema(maximum = 4294967295_u64)]
    hits_addend: Option<u32>,
}

/// A descriptor of [`RlsJsonRequest`].
#[derive(Debug, serde::Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub(crate) struct RlsJsonDescriptor {
    /// Its entries, matched against the rule tree.
    #[schema(max_items = 16)]
    entries: Vec<RlsJsonEntry>,
    /// A limit to apply instead of the configured one.
    #[serde(default)]
    limit: Option<RlsJsonOverride>,
    /// Units this descriptor asks for, instead of the request's.
    #[serde(default, rename = "hitsAddend")]
    #[schema(maximum = 4294967295_u64)]
    hits_addend: Option<u64>,
}

/// An entry of a descriptor.
#[derive(Debug, serde::Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub(crate) struct RlsJsonEntry {
    /// The entry's key.
    key: String,
    /// Its value.
    value: String,
}

/// A per-request limit override (`RateLimitOverride`).
#[derive(Debug, serde::Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub(crate) struct RlsJsonOverride {
    /// Requests allowed per unit.
    #[serde(rename = "requestsPerUnit")]
    #[schema(maximum = 4294967295_u64)]
    requests_per_unit: u32,
    /// The unit.
    unit: OverrideUnit,
}

/// The unit of a limit override: proto enum names (any case is accepted).
#[derive(Debug, serde::Deserialize, ToSchema)]
#[allow(dead_code, clippy::upper_case_acronyms)]
pub(crate) enum OverrideUnit {
    /// Per second.
    SECOND,
    /// Per minute.
    MINUTE,
    /// Per hour.
    HOUR,
    /// Per day.
    DAY,
    /// Per week.
    WEEK,
    /// Per (30-day) month.
    MONTH,
    /// Per year.
    YEAR,
}

/// The `text/event-stream` events of `GET /dashboard/events`, one per second.
#[derive(Debug, ToSchema)]
#[allow(dead_code)]
pub(crate) struct SnapshotEvent {
    /// Always `snapshot`.
    event: String,
    /// The snapshot, as JSON (see `GET /dashboard/latest`).
    data: String,
}

use std::sync::OnceLock;

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

/// The document: every route of the HTTP API.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Flowgate",
        description = "The Flowgate rate-limit service's HTTP API (the Envoy RLS gRPC API is described by its .proto). See docs/service.md.",
        license(name = "Apache-2.0"),
    ),
    paths(
        super::http::json,
        super::http::check::check,
        super::http::healthz,
        super::http::readyz,
        super::http::metrics,
        super::http::config::config,
        super::http::admin::inspect,
        super::http::admin::reset,
        super::http::admin::usage::list,
        super::http::leases::acquire,
        super::http::leases::held,
        super::http::leases::renew,
        super::http::leases::release,
        serve,
        crate::dashboard::page,
        crate::dashboard::script,
        crate::dashboard::style,
        crate::dashboard::events,
        crate::dashboard::latest,
    ),
    components(schemas(ProblemBody, RlsJsonRequest, SnapshotEvent)),
    modifiers(&AdminSecurity),
    tags(
        (name = "decisions", description = "Rate-limit decisions"),
        (name = "operations", description = "Health, readiness, metrics, configuration"),
        (name = "leases", description = "In-flight (concurrency) limits: leases taken, renewed and released"),
        (name = "admin", description = "Counters, behind `Authorization: Bearer <FLOWGATE_ADMIN_TOKEN>`; disabled (404) without the variable"),
        (name = "dashboard", description = "The live dashboard (off with --no-dashboard)"),
    )
)]
pub(crate) struct ApiDoc;

/// Declares the admin endpoints' bearer token.
struct AdminSecurity;

impl Modify for AdminSecurity {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "admin_token",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some("The value of FLOWGATE_ADMIN_TOKEN"))
                    .build(),
            ),
        );
    }
}

/// The document as JSON (built once).
pub fn document() -> &'static str {
    static JSON: OnceLock<String> = OnceLock::new();
    JSON.get_or_init(|| ApiDoc::openapi().to_json().unwrap_or_default())
}

/// `GET /openapi.json`.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "operations",
    responses((status = 200, description = "This document (OpenAPI 3.1)", content_type = "application/json", body = Object))
)]
pub(crate) async fn serve() -> Response {
    let mut response = document().into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
