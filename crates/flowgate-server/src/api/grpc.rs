//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` over tonic — what Envoy,
//! Istio, Contour and Gloo call.

use std::sync::Arc;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use flowgate::http::answer::AnswerKind;
use tonic::{Request, Response, Status};

use super::{Service, rls};
use crate::metrics::Api;

/// The gRPC rate-limit service.
#[derive(Debug, Clone)]
pub struct Rls {
    /// The shared service.
    service: Arc<Service>,
}

impl Rls {
    /// The tonic service, ready for `Server::add_service`.
    /// Messages larger than the service's
    /// [`max_body_bytes`](super::limits::InputLimits::max_body_bytes) are refused with
    /// `OUT_OF_RANGE` before they are decoded.
    pub fn server(service: Arc<Service>) -> RateLimitServiceServer<Rls> {
        let max = service.input_limits().max_body_bytes;
        RateLimitServiceServer::new(Rls { service }).max_decoding_message_size(max)
    }
}

/// The gRPC status for a store that could not answer (Envoy then applies `failure_mode_deny`).
pub(crate) fn store_status(kind: AnswerKind) -> Status {
    match kind {
        AnswerKind::Failed => Status::internal("the rate-limit store failed"),
        _ => Status::unavailable("the rate-limit store is unavailable"),
    }
}

#[tonic::async_trait]
impl RateLimitService for Rls {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let (domain, descriptors, hits) =
            rls::parse_request(request.into_inner(), self.service.input_limits())
                .map_err(|e| Status::invalid_argument(e.0))?;
        let active = self.service.active();
        let verdict = self
            .service
            .decide(&active, Api::Grpc, &domain, &descriptors, hits)
            .await;
        rls::response(&verdict, active.answer(&verdict))
            .map(Response::new)
            .map_err(store_status)
    }
}
