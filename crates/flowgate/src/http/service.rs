//! [`RateLimitService`]: the service that checks each request before its inner service sees it.

use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use super::body::ResponseBody;
use super::decide::{Shared, Step, is_grpc};
use super::future::ResponseFuture;
use crate::answer::Rendered;
use crate::store::Store;

/// Checks every request against its [`Limits`](super::Limits) before calling the inner
/// service; made by [`RateLimitLayer`](super::RateLimitLayer).
///
/// Denied requests get 429 with `Retry-After`, the `RateLimit` headers and a problem body (a
/// store that is away: 503); requests whose key cannot be read get 400/401; passing requests
/// reach the inner service and their responses get the `RateLimit` headers. gRPC requests (`content-type: application/grpc`)
/// get their refusals as gRPC statuses (`RESOURCE_EXHAUSTED`, …) instead.
pub struct RateLimitService<S, St> {
    /// The service behind the limit.
    inner: S,
    /// Store, policy, options and counters.
    shared: Arc<Shared<St>>,
}

impl<S: Clone, St> Clone for RateLimitService<S, St> {
    fn clone(&self) -> Self {
        RateLimitService {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: std::fmt::Debug, St> std::fmt::Debug for RateLimitService<S, St> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitService")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, St> RateLimitService<S, St> {
    pub(crate) fn from_shared(inner: S, shared: Arc<Shared<St>>) -> Self {
        RateLimitService { inner, shared }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S, St, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimitService<S, St>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    St: Store + 'static,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let (parts, body) = request.into_parts();
        let (selected, unfinished) = match self.shared.decide(&parts) {
            Step::Decided(Rendered::Pass(answer)) => {
                let request = Request::from_parts(parts, body);
                return ResponseFuture::call(self.inner.call(request), answer);
            }
            Step::Decided(Rendered::Refuse(response)) => return ResponseFuture::refuse(response),
            Step::Wait(selected, unfinished) => (selected, unfinished),
        };
        let grpc = is_grpc(&parts.headers);
        let request = Request::from_parts(parts, body);
        let waiting = Box::pin(self.shared.clone().wait(selected, unfinished, grpc));
        // The instance that was polled ready goes with the request; this one is a fresh clone.
        let clone = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::waiting(waiting, ready, request)
    }
}
