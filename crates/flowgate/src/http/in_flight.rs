//! [`InFlightLayer`]: at most N requests in flight per key.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use super::body::ResponseBody;
use super::key::KeyExtractor;
use crate::FailMode;
use crate::answer::problem::Problem;
use crate::lease::{Acquired, LeaseId, Leases, Terms};

/// At most N requests in flight per key — a [lease](crate::lease) taken
/// when a request arrives and given back when its response body ends (or is dropped), so a
/// streamed response holds its slot for as long as it streams.
///
/// ```
/// use std::time::Duration;
/// use axum::{routing::get, Router};
/// use flowgate::http::{key::Header, InFlightLayer};
/// use flowgate::lease::{MemoryLeases, Terms};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // At most 20 requests in flight per API key; a lease not given back lasts 60 s.
/// let terms = Terms::new(20, Duration::from_secs(60))?;
/// let per_key = Header::new(http::HeaderName::from_static("x-api-key"));
/// let app: Router = Router::new()
///     .route("/", get(|| async { "hello" }))
///     .layer(InFlightLayer::new("per-key", MemoryLeases::new(), per_key, terms));
/// # let _ = app;
/// # Ok(()) }
/// ```
///
/// A full key gets `429` with a problem body and `Retry-After` (when the earliest lease
/// expires, whole seconds); a key the extractor rejects, its 400/401. When the lease store
/// cannot answer (Redis away), [`fail`](InFlightLayer::fail) decides: `Closed` (the default)
/// answers `503`, `Open` lets the request through uncounted. The lease lasts `terms.ttl()`:
/// a response that streams longer than that stops being counted — choose a lease time above
/// your longest response. Giving a lease back runs on a spawned task (tokio), so it never
/// delays the response.
pub struct InFlightLayer<K> {
    shared: Arc<Shared<K>>,
    fail: FailMode,
}

impl<K> Clone for InFlightLayer<K> {
    fn clone(&self) -> Self {
        InFlightLayer {
            shared: self.shared.clone(),
            fail: self.fail,
        }
    }
}

impl<K> std::fmt::Debug for InFlightLayer<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InFlightLayer")
            .field("name", &self.shared.name)
            .field("terms", &self.shared.terms)
            .field("fail", &self.fail)
            .finish_non_exhaustive()
    }
}

/// What every service of one layer shares.
struct Shared<K> {
    name: String,
    leases: Arc<dyn Leases>,
    key: K,
    terms: Terms,
}

impl<K: KeyExtractor> InFlightLayer<K> {
    /// At most `terms.limit()` requests in flight per key that `key` extracts, held in
    /// `leases` under the limit's `name` (a namespace: two layers with different names never
    /// share slots).
    pub fn new(
        name: impl Into<String>,
        leases: impl Leases + 'static,
        key: K,
        terms: Terms,
    ) -> Self {
        InFlightLayer {
            shared: Arc::new(Shared {
                name: name.into(),
                leases: Arc::new(leases),
                key,
                terms,
            }),
            fail: FailMode::Closed,
        }
    }

    /// What to do when the lease store cannot answer: `Closed` (the default) answers 503,
    /// `Open` lets the request through uncounted. (`Local` acts as `Closed`: leases have no
    /// local share.)
    pub fn fail(mut self, mode: FailMode) -> Self {
        self.fail = mode;
        self
    }
}

impl<S, K> Layer<S> for InFlightLayer<K> {
    type Service = InFlight<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        InFlight {
            inner,
            shared: self.shared.clone(),
            fail: self.fail,
        }
    }
}

/// The service [`InFlightLayer`] wraps around another.
pub struct InFlight<S, K> {
    inner: S,
    shared: Arc<Shared<K>>,
    fail: FailMode,
}

impl<S: Clone, K> Clone for InFlight<S, K> {
    fn clone(&self) -> Self {
        InFlight {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
            fail: self.fail,
        }
    }
}

impl<S, K> std::fmt::Debug for InFlight<S, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InFlight")
            .field("name", &self.shared.name)
            .finish_non_exhaustive()
    }
}

/// The future of an [`InFlight`] call.
pub type InFlightFuture<B, E> =
    Pin<Box<dyn Future<Output = Result<Response<ResponseBody<LeasedBody<B>>>, E>> + Send>>;

fn problem<B>(problem: Problem) -> Response<ResponseBody<LeasedBody<B>>> {
    problem.into_response().map(ResponseBody::full)
}

impl<S, K, ReqB, ResB> Service<Request<ReqB>> for InFlight<S, K>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    K: KeyExtractor,
    ReqB: Send + 'static,
    ResB: Body<Data = Bytes> + Send + 'static,
{
    type Response = Response<ResponseBody<LeasedBody<ResB>>>;
    type Error = S::Error;
    type Future = InFlightFuture<ResB, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        // The inner service that was polled ready serves this request (tower's contract).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = self.shared.clone();
        let fail = self.fail;
        let (parts, body) = request.into_parts();
        let mut client = String::new();
        if let Err(rejection) = shared.key.extract_into(&parts, &mut client) {
            return Box::pin(std::future::ready(Ok(problem(Problem::status(
                rejection.status,
                rejection.detail,
            )))));
        }
        let key = crate::lease::key(&shared.name, &client);
        let request = Request::from_parts(parts, body);
        Box::pin(async move {
            let guard = match shared.leases.acquire(&key, &shared.terms).await {
                Ok(Acquired::Granted { id, .. }) => Some(LeaseGuard {
                    leases: shared.leases.clone(),
                    key,
                    id,
                }),
                Ok(full @ Acquired::Full { held, .. }) => {
                    let mut response = problem(Problem::status(
                        StatusCode::TOO_MANY_REQUESTS,
                        format!(
                            "{held} requests of `{}` are in flight, the most allowed at once",
                            shared.name
                        ),
                    ));
                    if let Some(seconds) = full.retry_after_secs() {
                        response
                            .headers_mut()
                            .insert(http::header::RETRY_AFTER, HeaderValue::from(seconds));
                    }
                    return Ok(response);
                }
                Err(error) if error.is_transient() && fail == FailMode::Open => None,
                Err(_) => {
                    return Ok(problem(Problem::status(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "the concurrency limit's store could not answer",
                    )));
                }
            };
            let response = inner.call(request).await?;
            Ok(response.map(|body| ResponseBody::inner(LeasedBody { body, guard })))
        })
    }
}

/// A lease, given back when dropped (on a spawned task: never blocking the caller).
struct LeaseGuard {
    leases: Arc<dyn Leases>,
    key: String,
    id: LeaseId,
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        let leases = self.leases.clone();
        let key = std::mem::take(&mut self.key);
        let id = self.id;
        // Without a runtime (a test's executor), the lease simply expires.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = leases.release(&key, id).await;
            });
        }
    }
}

pin_project! {
    /// A response body holding its request's lease until it ends or is dropped.
    pub struct LeasedBody<B> {
        #[pin]
        body: B,
        guard: Option<LeaseGuard>,
    }
}

impl<B: Body<Data = Bytes>> Body for LeasedBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        let frame = this.body.poll_frame(cx);
        if let Poll::Ready(None) = frame {
            // The body ended: the request is no longer in flight.
            this.guard.take();
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
