//! [`OutboundLimit`]: the client-side service that waits for each request's turn.

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response, StatusCode};
use tower_service::Service;

use super::layer::Pacer;
use crate::clock::Clock;
use crate::http::headers::parse_retry_after;

/// A boxed error: the inner client's, or an [`OutboundError`](super::OutboundError).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The future of an [`OutboundLimit`] call.
pub type ResponseFuture<R> = Pin<Box<dyn Future<Output = Result<R, BoxError>> + Send>>;

/// Waits for each request's turn before sending it with the inner client; made by
/// [`OutboundLimitLayer`](super::OutboundLimitLayer).
///
/// Always ready: requests queue inside the service (bounded by `max_queue` per key), and the
/// inner client is asked for readiness only when a request's turn has come.
pub struct OutboundLimit<S, C: Clock> {
    /// The HTTP client.
    inner: S,
    /// Settings and lanes.
    pacer: Arc<Pacer<C>>,
}

impl<S: Clone, C: Clock> Clone for OutboundLimit<S, C> {
    fn clone(&self) -> Self {
        OutboundLimit {
            inner: self.inner.clone(),
            pacer: self.pacer.clone(),
        }
    }
}

impl<S: std::fmt::Debug, C: Clock> std::fmt::Debug for OutboundLimit<S, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboundLimit")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, C: Clock> OutboundLimit<S, C> {
    pub(crate) fn new(inner: S, pacer: Arc<Pacer<C>>) -> Self {
        OutboundLimit { inner, pacer }
    }
}

impl<S, C, B, R> Service<Request<B>> for OutboundLimit<S, C>
where
    S: Service<Request<B>, Response = Response<R>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    C: Clock + Clone,
    B: Send + 'static,
{
    type Response = Response<R>;
    type Error = BoxError;
    type Future = ResponseFuture<Response<R>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let (parts, body) = request.into_parts();
        // The turn is taken now, in call order: that is what makes the queue FIFO.
        let turn = self.pacer.turn(&parts, 1);
        let request = Request::from_parts(parts, body);
        let mut inner = self.inner.clone();
        Box::pin(async move {
            let lane = turn?.wait().await?;
            poll_fn(|cx| inner.poll_ready(cx))
                .await
                .map_err(Into::into)?;
            let response = inner.call(request).await.map_err(Into::into)?;
            if matches!(
                response.status(),
                StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
            ) && let Some(pause) = response
                .headers()
                .get(http::header::RETRY_AFTER)
                .and_then(parse_retry_after)
            {
                lane.clock.pause_for(pause);
            }
            Ok(response)
        })
    }
}
