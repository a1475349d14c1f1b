//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` over tonic — what Envoy,
//! Istio, Contour and Gloo call — and [`serve`], the HTTP/2 server it runs on.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::listen::Acceptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use flowgate::answer::AnswerKind;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
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
        let request = rls::parse_request(request.into_inner(), self.service.input_limits())
            .map_err(|e| Status::invalid_argument(e.0))?;
        let active = self.service.active();
        let verdict = self
            .service
            .decide(
                &active,
                Api::Grpc,
                &request.domain,
                &request.descriptors,
                request.hits_addend,
            )
            .await;
        let answer = active.answer(&verdict);
        match answer.kind() {
            kind @ (AnswerKind::Unavailable | AnswerKind::Failed) => Err(store_status(kind)),
            _ => {
                let mut response = rls::response(&verdict, answer);
                if self.service.rls_settings().dynamic_metadata {
                    response.dynamic_metadata = Some(rls::dynamic_metadata(&request, &verdict));
                }
                Ok(Response::new(response))
            }
        }
    }
}

/// Streams (calls) one client connection may have open at once; more are refused by HTTP/2
/// (`REFUSED_STREAM`). Envoy opens far fewer per connection.
pub const MAX_CONCURRENT_STREAMS: u32 = 1024;

/// Serves `service` (a tonic-generated gRPC server: [`Rls::server`], or the no-op's) over
/// HTTP/2 with prior knowledge on `listener` (which bounds the open connections) until
/// `shutdown` completes, then waits up to `grace` (the server's `--grace-period`) for calls
/// in flight (each connection is sent a `GOAWAY`).
///
/// The service runs straight on hyper's HTTP/2 connection, without tonic's transport server
/// around it (its path router, per-request boxing, connection-info extension and
/// `grpc-timeout` layer): the generated server routes by path itself and answers
/// `UNIMPLEMENTED` to any other method. HTTP/2 settings are hyper's windows, no keep-alive
/// pings, and at most [`MAX_CONCURRENT_STREAMS`] calls per connection.
pub async fn serve<S>(
    listener: Acceptor,
    service: S,
    shutdown: impl Future<Output = ()> + Send,
    grace: Duration,
) -> std::io::Result<()>
where
    S: tower_service::Service<
            http::Request<hyper::body::Incoming>,
            Response = http::Response<tonic::body::Body>,
            Error = Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let mut http = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    http.timer(TokioTimer::new())
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS);
    crate::listen::serve_connections(listener, "grpc", shutdown, grace, |stream, _| {
        // Responses of streams that finish together leave in one write (crate::coalesce).
        http.serve_connection(
            TokioIo::new(crate::coalesce::Coalesced::new(stream)),
            TowerToHyperService::new(service.clone()),
        )
    })
    .await
}
