//! The benchmark baseline (`flowgate serve --noop`, hidden): the same binary, protocols,
//! request parsing and response shapes as the real APIs, deciding nothing — every descriptor
//! `OK`, no rule matching, counting or metrics. A separate service, so the production handlers
//! carry no branch for it. A diagnosis (what the stack costs), never a result to quote.

use axum::Router;
use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

use super::http::check::{CheckResponse, parse_check};
use super::http::{json_response, parse_json};
use super::limits::InputLimits;
use super::rls::{self, json::JsonResponse};

/// `OK` for every descriptor, nothing decided.
fn response(descriptors: usize) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: Code::Ok as i32,
        statuses: vec![
            DescriptorStatus {
                code: Code::Ok as i32,
                ..Default::default()
            };
            descriptors
        ],
        ..Default::default()
    }
}

/// The no-op gRPC service.
#[derive(Debug, Clone, Copy)]
pub struct NoopRls;

impl NoopRls {
    /// The tonic service, ready for `Server::add_service`.
    pub fn server() -> RateLimitServiceServer<NoopRls> {
        RateLimitServiceServer::new(NoopRls)
    }
}

#[tonic::async_trait]
impl RateLimitService for NoopRls {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        let request = rls::parse_request(request.into_inner(), &InputLimits::default())
            .map_err(|e| tonic::Status::invalid_argument(e.0))?;
        Ok(tonic::Response::new(response(request.descriptors.len())))
    }
}

/// The no-op HTTP routes: `/json` and `/v1/check` parse and answer in the real shape.
pub fn router() -> Router {
    Router::new()
        .route("/json", post(json))
        .route("/v1/check", post(check))
        .route("/healthz", get(|| async { "ok\n" }))
}

async fn json(body: Bytes) -> Response {
    match parse_json(&body, &InputLimits::default()) {
        Ok(request) => json_response(
            StatusCode::OK,
            &JsonResponse::from(&response(request.descriptors.len())),
        ),
        Err(problem) => problem.into_response(),
    }
}

async fn check(body: Bytes) -> Response {
    match parse_check(&body, &InputLimits::default()) {
        Ok(request) => json_response(
            StatusCode::OK,
            &CheckResponse::unmatched(request.descriptors.len()),
        ),
        Err(problem) => problem.into_response(),
    }
}
