//! [`OutboundLimit`]: the client-side service that waits for each request's turn.

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{HeaderValue, Request, Response, StatusCode};
use tower_service::Service;

use super::layer::Pacer;
use crate::clock::Clock;

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

/// Reads a `Retry-After` value: delay-seconds (`120`) or an HTTP-date (a date in the past is
/// zero). `None` for anything else.
pub(crate) fn parse_retry_after(value: &HeaderValue) -> Option<std::time::Duration> {
    let text = value.to_str().ok()?.trim();
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        // More digits than a u64 holds is still "a very long time".
        return Some(std::time::Duration::from_secs(
            text.parse().unwrap_or(u64::MAX),
        ));
    }
    let date = httpdate::parse_http_date(text).ok()?;
    Some(
        date.duration_since(std::time::SystemTime::now())
            .unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn retry_after_values_parse_as_seconds_or_dates() {
        let v = |s: &str| parse_retry_after(&HeaderValue::from_str(s).unwrap());
        assert_eq!(v(" 120 "), Some(Duration::from_secs(120)));
        assert_eq!(
            v("99999999999999999999999"),
            Some(Duration::from_secs(u64::MAX))
        );
        assert_eq!(v("Wed, 21 Oct 2015 07:28:00 GMT"), Some(Duration::ZERO));
        let later = std::time::SystemTime::now() + Duration::from_secs(30);
        let d = v(&httpdate::fmt_http_date(later)).unwrap();
        assert!(
            d > Duration::from_secs(27) && d <= Duration::from_secs(30),
            "{d:?}"
        );
        assert_eq!(v("-1"), None);
        assert_eq!(v("soon"), None);
    }
}
