//! In-flight limits over HTTP: `/v1/leases/{name}/{key}` takes (`POST`) and counts (`GET`)
//! leases of the configuration's `concurrency` limit `name` for `key`;
//! `/v1/leases/{name}/{key}/{lease}` renews (`PUT`) and releases (`DELETE`) one.
//!
//! A caller takes a lease before its work starts and releases it when the work ends; a caller
//! that dies without releasing loses the slot when the lease expires (`lease_time`), so a
//! crash never leaks capacity. With `--redis`, every instance shares the limit.
//!
//! Answers: `201` with the lease, `429` (problem, `Retry-After`) when every slot is held,
//! `404` for an unknown limit or a lease not held any more, `400` for a malformed lease id,
//! `503` (problem) when the shared store is away and the limit says `fail: closed`. With
//! `fail: open` the store away grants a lease counted nowhere (`"fallback": "open"`); renewing
//! or releasing it answers `404`.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use flowgate::FailMode;
use flowgate::lease::{Acquired, LeaseId};
use flowgate::store::StoreError;
use serde::Serialize;
use utoipa::ToSchema;

use super::super::Service;
use super::super::problem::Problem;
use super::check::millis;
use super::json_response;
use crate::config::ConcurrencyLimit;

/// A lease granted or renewed.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct LeaseView {
    /// The lease's id (32 hex digits): renew or release it with this.
    lease: String,
    /// Until the lease expires unless renewed, in milliseconds.
    expires_in_ms: u64,
    /// Leases held on the key now, this one included.
    #[serde(skip_serializing_if = "Option::is_none")]
    held: Option<u64>,
    /// The most leases the key may hold at once.
    limit: u64,
    /// `open` when the store was away and the limit's `fail: open` granted it (counted nowhere).
    #[serde(skip_serializing_if = "Option::is_none")]
    fallback: Option<&'static str>,
}

/// How many leases a key holds.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct HeldView {
    /// Leases held on the key now.
    held: u64,
    /// The most leases the key may hold at once.
    limit: u64,
}

/// The running configuration's limit `name` and the store key of its leases for `key`, or
/// the 404.
fn target(service: &Service, name: &str, key: &str) -> Result<(ConcurrencyLimit, String), Problem> {
    Ok((limit(service, name)?, flowgate::lease::key(name, key)))
}

/// The running configuration's limit `name`, or the 404.
fn limit(service: &Service, name: &str) -> Result<ConcurrencyLimit, Problem> {
    service
        .active()
        .policy
        .concurrency
        .get(name)
        .copied()
        .ok_or_else(|| {
            Problem::new(
                StatusCode::NOT_FOUND,
                "https://flowgate.dev/problems/no-such-limit",
                "No such concurrency limit",
                format!("the configuration has no concurrency limit named `{name}`"),
            )
        })
}

/// The 503 for a store that could not answer.
fn store_problem(error: &StoreError) -> Problem {
    tracing::warn!(error = %error, "the lease store could not answer");
    Problem::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "https://flowgate.dev/problems/store-unavailable",
        "The store is unavailable",
        "the store that holds leases could not answer; try again",
    )
}

/// The 404 for a lease not held.
fn not_held() -> Problem {
    Problem::new(
        StatusCode::NOT_FOUND,
        "https://flowgate.dev/problems/lease-not-held",
        "Lease not held",
        "the lease is not held: released, expired, or never granted",
    )
}

/// The path's parameters, or the 400 for a path that does not decode (bad percent-encoding).
fn params<T>(path: Result<Path<T>, PathRejection>) -> Result<T, Problem> {
    path.map(|Path(params)| params)
        .map_err(|rejection| Problem::bad_request(rejection.body_text()))
}

fn lease_id(text: &str) -> Result<LeaseId, Problem> {
    text.parse()
        .map_err(|e: flowgate::lease::BadLeaseId| Problem::bad_request(e.to_string()))
}

/// `POST /v1/leases/{name}/{key}`: takes a lease.
#[utoipa::path(
    post,
    path = "/v1/leases/{name}/{key}",
    tag = "leases",
    params(
        ("name" = String, Path, description = "The `concurrency` limit's name"),
        ("key" = String, Path, description = "Whose in-flight requests are counted (percent-encoded)"),
    ),
    responses(
        (status = 201, description = "The lease", body = LeaseView),
        (status = 400, description = "The path does not decode (percent-encoding)", body = super::super::openapi::ProblemBody, content_type = "application/problem+json"),
        (status = 404, description = "No such limit", body = super::super::openapi::ProblemBody, content_type = "application/problem+json"),
        (status = 429, description = "Every slot is held; `Retry-After` says when the earliest lease expires", body = super::super::openapi::ProblemBody, content_type = "application/problem+json"),
        (status = 503, description = "The store could not answer (`fail: closed`)", body = super::super::openapi::ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn acquire(
    State(service): State<Arc<Service>>,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<Response, Problem> {
    let (name, key) = params(path)?;
    let (limit, key) = target(&service, &name, &key)?;
    let view = |id: LeaseId, expires_in: Duration, held, fallback| LeaseView {
        lease: id.to_string(),
        expires_in_ms: millis(expires_in),
        held,
        limit: limit.terms.limit(),
        fallback,
    };
    let acquired = match service.backend().leases().acquire(&key, &limit.terms).await {
        Err(error) if error.is_transient() && limit.fail == FailMode::Open => {
            tracing::warn!(error = %error, limit = %name, "the lease store is away; granting (fail: open)");
            let view = view(LeaseId::random(), limit.terms.ttl(), None, Some("open"));
            return Ok(json_response(StatusCode::CREATED, &view));
        }
        other => other.map_err(|e| store_problem(&e))?,
    };
    Ok(match acquired {
        Acquired::Granted {
            id,
            expires_in,
            held,
        } => json_response(StatusCode::CREATED, &view(id, expires_in, Some(held), None)),
        Acquired::Full { held, retry_after } => {
            let mut response = Problem::new(
                StatusCode::TOO_MANY_REQUESTS,
                "https://flowgate.dev/problems/concurrency-limit",
                "Too many requests in flight",
                format!(
                    "{held} of {} leases are held; the earliest expires in {} ms",
                    limit.terms.limit(),
                    millis(retry_after)
                ),
            )
            .into_response();
            if let Some(seconds) = acquired.retry_after_secs() {
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
            }
            response
        }
    })
}

/// `GET /v1/leases/{name}/{key}`: how many leases `key` holds.
#[utoipa::path(
    get,
    path = "/v1/leases/{name}/{key}",
    tag = "leases",
    params(
        ("name" = String, Path, description = "The `concurrency` limit's name"),
        ("key" = String, Path, description = "Whose in-flight requests are counted (percent-encoded)"),
    ),
    responses(
        (status = 200, description = "Leases held", body = HeldView),
        (status = 400, description = "The path does not decode (percent-encoding)", body = super::super::openapi::ProblemBody, content_type = "application/problem+json"),
        (status = 404, description = "No such limit", body = super::super::openapi::ProblemBody, content_type = "application/problem+json"),
        (status = 503, description = "The store could not answer", body = super::super::openapi::ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn held(
    State(service): State<Arc<Service>>,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<Response, Problem> {
    let (name, key) = params(path)?;
    let (limit, key) = target(&service, &name, &key)?;
    let held = service
        .backend()
        .leases()
        .held(&key)
        .await
        .map_err(|e| store_problem(&e))?;
    let view = HeldView {
        held,
        limit: limit.terms.limit(),
    };
    Ok(json_response(StatusCode::OK, &view))
}

/// `PUT /v1/leases/{name}/{key}/{lease}`: renews a lease for another `lease_time`.
#[utoipa::path(
    put,
    path = "/v1/leases/{name}/{key}/{lease}",
    tag = "leases",
    params(
        ("name" = String, Path, description = "The `concurrency` limit's name"),
        ("key" = String, Path, description = "The key the lease was taken for (percent-encoded)"),
        ("lease" = String, Path, description = "The lease's id"),
    ),
    responses(
        (status = 200, description = "The lease, renewed", body = LeaseView),
        (status = 400, description = "Not a lease id, or the path does not decode", body = super::super::openapi::ProblemBody, content_type = "application/problem+json"),
        (status = 404, description = "No such limit, or the lease is not held (released or expired)", body = super::super::openapi::ProblemBody, content_type = "application/problem+json"),
        (status = 503, description = "The store could not answer", body = super::super::openapi::ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn renew(
    State(service): State<Arc<Service>>,
    path: Result<Path<(String, String, String)>, PathRejection>,
) -> Result<Response, Problem> {
    let (name, key, lease) = params(path)?;
    let (limit, key) = target(&service, &name, &key)?;
    let id = lease_id(&lease)?;
    let renewed = service
        .backend()
        .leases()
        .renew(&key, id, &limit.terms)
        .await
        .map_err(|e| store_problem(&e))?;
    if !renewed {
        return Err(not_held());
    }
    let view = LeaseView {
        lease: id.to_string(),
        expires_in_ms: millis(limit.terms.ttl()),
        held: None,
        limit: limit.terms.limit(),
        fallback: None,
    };
    Ok(json_response(StatusCode::OK, &view))
}

/// `DELETE /v1/leases/{name}/{key}/{lease}`: releases a lease.
#[utoipa::path(
    delete,
    path = "/v1/leases/{name}/{key}/{lease}",
    tag = "leases",
    params(
        ("name" = String, Path, description = "The `concurrency` limit's name"),
        ("key" = String, Path, description = "The key the lease was taken for (percent-encoded)"),
        ("lease" = String, Path, description = "The lease's id"),
    ),
    responses(
        (status = 204, description = "Released"),
        (status = 400, description = "Not a lease id, or the path does not decode", body = super::super::openapi::ProblemBody, content_type = "application/problem+json"),
        (status = 404, description = "No such limit, or the lease is not held (released already or expired)", body = super::super::openapi::ProblemBody, content_type = "application/problem+json"),
        (status = 503, description = "The store could not answer", body = super::super::openapi::ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn release(
    State(service): State<Arc<Service>>,
    path: Result<Path<(String, String, String)>, PathRejection>,
) -> Result<Response, Problem> {
    let (name, key, lease) = params(path)?;
    let (_, key) = target(&service, &name, &key)?;
    let id = lease_id(&lease)?;
    let released = service
        .backend()
        .leases()
        .release(&key, id)
        .await
        .map_err(|e| store_problem(&e))?;
    if !released {
        return Err(not_held());
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}
