//! [`RateLimit`]: the service that checks each request before its inner service sees it.

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use http::{Request, Response};
use tower_service::Service;

use super::body::ResponseBody;
use super::check::{Decided, Shared, Verdict, is_grpc};
use super::future::ResponseFuture;
use crate::store::Store;

/// Checks every request against a [`Policy`](super::Policy) before calling the inner service;
/// made by [`RateLimitLayer`](super::RateLimitLayer).
///
/// Denied requests get 429 with `Retry-After`, the `RateLimit` headers and a problem body;
/// requests whose key cannot be read get 400/401; passing requests reach the inner service and
/// their responses get the `RateLimit` headers. gRPC requests (`content-type: application/grpc`)
/// get their refusals as gRPC statuses (`RESOURCE_EXHAUSTED`, …) instead.
pub struct RateLimit<S, St> {
    /// The service behind the limit.
    inner: S,
    /// Store, policy, options and counters.
    shared: Arc<Shared<St>>,
}

impl<S: Clone, St> Clone for RateLimit<S, St> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: std::fmt::Debug, St> std::fmt::Debug for RateLimit<S, St> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, St> RateLimit<S, St> {
    pub(crate) fn from_shared(inner: S, shared: Arc<Shared<St>>) -> Self {
        RateLimit { inner, shared }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S, St, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S, St>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    St: Store,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let (parts, body) = request.into_parts();
        let applied = match self.shared.decide(&parts) {
            Decided::Now(Verdict::Pass(fields)) => {
                let request = Request::from_parts(parts, body);
                return ResponseFuture::call(self.inner.call(request), fields);
            }
            Decided::Now(Verdict::Answer(response)) => return ResponseFuture::answer(response),
            Decided::Later(applied) => applied,
        };
        let grpc = is_grpc(&parts.headers);
        let request = Request::from_parts(parts, body);
        let mut check = Box::pin(self.shared.clone().check(applied, grpc));
        // Stores often answer at once even so (several limits in memory): then the request goes
        // straight to the inner service, which was polled ready for it. (Polling with a no-op
        // waker is fine: a pending future is polled again, with the real waker, by
        // `ResponseFuture`.)
        match check.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(Verdict::Pass(fields)) => {
                ResponseFuture::call(self.inner.call(request), fields)
            }
            Poll::Ready(Verdict::Answer(response)) => ResponseFuture::answer(response),
            Poll::Pending => {
                // The instance that was polled ready goes with the request; this one is a
                // fresh clone.
                let clone = self.inner.clone();
                let ready = std::mem::replace(&mut self.inner, clone);
                ResponseFuture::check(check, ready, request)
            }
        }
    }
}
