//! Keep-alive HTTP/1.1 connections to the upstream, shared by every client connection and
//! driven by the task that is using them.
//!
//! A pooled connection is the pair hyper's `client::conn::http1` hands out: the
//! [`SendRequest`] half and the [`Connection`] future that does the reading and writing.
//! Usually that future runs as a task of its own, so each request crosses tasks three times
//! (request in, response head out, body out). Here the task forwarding a request polls its
//! upstream connection itself — while it waits for the response head, then from the
//! response body ([`UpstreamBody`]) until the body ends — so the upstream socket wakes the
//! task that needs the bytes. When the body has ended and the connection can take another
//! request, it goes back to the pool (last in, first out); a connection that cannot is closed.
//!
//! An idle connection is nobody's task: a sweeper looks at the idle ones every
//! [`SWEEP_EVERY`], closing those the upstream has closed and those idle longer than
//! [`IDLE_TIMEOUT`]; at most [`MAX_IDLE`] are kept.
//!
//! At most [`PoolLimits::max_connections`] connections (busy and idle) are open at once. A
//! request that finds none idle and no room waits up to [`PoolLimits::queue_timeout`] for a
//! connection to come back or to close, then fails with [`SendError::Busy`] (the gateway
//! answers 503) — a burst no longer opens one connection per request.

use std::collections::VecDeque;
use std::future::{Future, poll_fn};
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::HOST;
use http::{HeaderValue, Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, Connection, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use super::Upstream;
use super::idle::IdleBody;
use crate::metrics::UpstreamMetrics;
use crate::tls::MaybeTls;

/// How long an idle connection is kept.
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// How many idle connections are kept; beyond that the oldest are closed.
pub(crate) const MAX_IDLE: usize = 1024;
/// How often idle connections are looked at.
pub(crate) const SWEEP_EVERY: Duration = Duration::from_secs(5);
/// How many pooled connections one request tries (each found closed before the request was
/// written) before it opens a new one.
const MAX_STALE: usize = 3;

/// What a request sends: the client's body, given up when it stalls.
pub(crate) type RequestBody = IdleBody<Incoming>;

/// The bounds of a pool.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PoolLimits {
    /// How long connecting (TCP and TLS) may take.
    pub(crate) connect_timeout: Duration,
    /// Connections open at once, busy and idle.
    pub(crate) max_connections: usize,
    /// How long a request waits for a connection when all are busy.
    pub(crate) queue_timeout: Duration,
}

/// Why a request could not be forwarded.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SendError {
    /// Every connection was busy for the whole queue timeout.
    #[error("all {0} upstream connections stayed busy")]
    Busy(usize),
    /// No connection to the upstream could be opened within the connect timeout.
    #[error("cannot connect: {0}")]
    Connect(io::Error),
    /// The connection failed, or the upstream's answer was not HTTP.
    #[error("{0}")]
    Http(#[from] hyper::Error),
}

/// Connections to one upstream.
#[derive(Debug)]
pub(crate) struct Pool {
    /// What the pool's handles share.
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    /// `host:port` to connect to (port 80, or 443 for https, when the URL has none).
    address: String,
    /// TLS to the upstream: the connector and the name its certificate must hold.
    tls: Option<TlsTo>,
    /// The `Host` sent when a request has none (an HTTP/1.0 client's).
    host: HeaderValue,
    /// Connect timeout, connection cap, queue timeout.
    limits: PoolLimits,
    /// One permit per connection that may be open; each [`Conn`] holds one.
    slots: Arc<Semaphore>,
    /// Woken when a connection goes idle, for a request waiting for one.
    returned: Notify,
    /// Idle connections, oldest first.
    idle: Mutex<VecDeque<Conn>>,
    /// Connects and the idle count, for `/metrics`.
    metrics: UpstreamMetrics,
}

/// TLS to an `https://` upstream: the connector and the name its certificate must hold.
struct TlsTo {
    /// rustls, with the upstream's roots.
    connector: tokio_rustls::TlsConnector,
    /// The upstream's host.
    name: rustls::pki_types::ServerName<'static>,
}

impl std::fmt::Debug for TlsTo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsTo").field("name", &self.name).finish()
    }
}

/// What reads and writes one connection.
type Driver = Connection<TokioIo<UpstreamStream>, RequestBody>;

/// A connection to the upstream, TLS for an `https://` one.
type UpstreamStream = MaybeTls<TcpStream, tokio_rustls::client::TlsStream<TcpStream>>;

/// One connection to the upstream.
struct Conn {
    /// Where requests are handed in.
    sender: SendRequest<RequestBody>,
    /// The reading and writing; `None` once it has ended.
    driver: Option<Pin<Box<Driver>>>,
    /// When it last went idle.
    idle_since: Instant,
    /// Its place under the cap, given back when it closes.
    _slot: OwnedSemaphorePermit,
    /// Decremented when it closes.
    open: Gauge,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.open.dec();
    }
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("open", &self.driver.is_some())
            .field("idle_since", &self.idle_since)
            .finish()
    }
}

impl Conn {
    /// Lets the connection read and write what it can; `false` once it has ended.
    fn drive(&mut self, cx: &mut Context<'_>) -> bool {
        if let Some(driver) = &mut self.driver
            && let Poll::Ready(ended) = driver.as_mut().poll(cx)
        {
            if let Err(e) = ended {
                tracing::debug!("upstream connection ended: {e}");
            }
            self.driver = None;
        }
        self.driver.is_some()
    }

    /// Polls `step`, something only this connection's driver advances (the answer to a
    /// request, the response body), driving the connection first.
    ///
    /// The driver is polled with the task's waker only when `step` is still pending: hyper's
    /// channels wake whoever last registered, and a waker left in them while the answer is
    /// already here would only poll the task again for nothing — once or twice per request.
    /// Every `Pending` returned comes after a drive with `cx`, so the task is woken when the
    /// connection can go on.
    fn poll_with<T>(
        &mut self,
        cx: &mut Context<'_>,
        mut step: impl FnMut(&mut Context<'_>) -> Poll<T>,
    ) -> Poll<T> {
        if !self.drive(&mut quiet()) {
            // Ended: whatever it owed has been settled (as an error if need be).
            return step(cx);
        }
        if let Poll::Ready(done) = step(&mut quiet()) {
            return Poll::Ready(done);
        }
        if !self.drive(cx) {
            return step(cx);
        }
        step(&mut quiet())
    }

    /// Whether it can take a request now, after driving it once without a waker to register.
    fn reusable(&mut self) -> bool {
        self.drive(&mut quiet()) && self.sender.is_ready()
    }
}

/// A context whose wake-ups go nowhere: for polling what only the caller's own next poll can
/// advance.
fn quiet() -> Context<'static> {
    Context::from_waker(Waker::noop())
}

impl Pool {
    /// A pool for `upstream` within `limits`. Starts the sweeper when called inside a Tokio
    /// runtime.
    pub(crate) fn new(upstream: &Upstream, limits: PoolLimits, metrics: UpstreamMetrics) -> Self {
        let authority = upstream.authority();
        let address = format!("{}:{}", authority.host(), upstream.port());
        let tls = upstream.tls().and_then(|tls| {
            let host = authority
                .host()
                .trim_start_matches('[')
                .trim_end_matches(']');
            match rustls::pki_types::ServerName::try_from(host.to_owned()) {
                Ok(name) => Some(TlsTo {
                    connector: tokio_rustls::TlsConnector::from(tls.0.clone()),
                    name,
                }),
                Err(e) => {
                    tracing::error!("upstream {upstream}: not a TLS server name: {e}");
                    None
                }
            }
        });
        let host = HeaderValue::from_str(authority.as_str())
            .unwrap_or_else(|_| HeaderValue::from_static("localhost"));
        let shared = Arc::new(Shared {
            address,
            tls,
            host,
            limits,
            slots: Arc::new(Semaphore::new(limits.max_connections.max(1))),
            returned: Notify::new(),
            idle: Mutex::new(VecDeque::new()),
            metrics,
        });
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(sweep(Arc::downgrade(&shared)));
        }
        Pool { shared }
    }

    /// Sends `request` (origin-form URI) on a pooled connection — or a new one when none is
    /// idle or those tried were found closed before the request was written — and returns
    /// the response head; the body streams from the connection as it is read.
    pub(crate) async fn send(
        &self,
        mut request: Request<RequestBody>,
    ) -> Result<Response<UpstreamBody>, SendError> {
        if !request.headers().contains_key(HOST) {
            request.headers_mut().insert(HOST, self.shared.host.clone());
        }
        let mut stale = 0;
        let mut deadline = None;
        let slot = loop {
            // Register for a returned connection before looking, so none is missed — but only
            // once there is reason to wait: the first look (nearly always successful) goes
            // without.
            let returned = self.shared.returned.notified();
            tokio::pin!(returned);
            if deadline.is_some() {
                returned.as_mut().enable();
            }
            if stale < MAX_STALE
                && let Some(conn) = self.shared.checkout()
            {
                match self.exchange(conn, request).await {
                    Exchanged::Answered(response) => return Ok(response),
                    Exchanged::Failed(e) => return Err(e.into()),
                    Exchanged::Unsent(back) => {
                        request = back;
                        stale += 1;
                        continue;
                    }
                }
            }
            if let Ok(slot) = self.shared.slots.clone().try_acquire_owned() {
                break slot;
            }
            // Every connection is busy: wait for one to come back or to close — after one more
            // look, registered this time, when this is the first.
            let Some(deadline) = deadline else {
                self.shared.metrics.queued.inc();
                deadline = Some(tokio::time::Instant::now() + self.shared.limits.queue_timeout);
                continue;
            };
            tokio::select! {
                () = returned => {}
                slot = self.shared.slots.clone().acquire_owned() => match slot {
                    Ok(slot) => break slot,
                    Err(_) => return Err(SendError::Busy(self.shared.limits.max_connections)),
                },
                () = tokio::time::sleep_until(deadline) => {
                    self.shared.metrics.busy.inc();
                    return Err(SendError::Busy(self.shared.limits.max_connections));
                }
            }
        };
        let conn = self.connect(slot).await?;
        match self.exchange(conn, request).await {
            Exchanged::Answered(response) => Ok(response),
            Exchanged::Failed(e) => Err(e.into()),
            Exchanged::Unsent(_) => Err(SendError::Connect(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the new connection closed before the request could be sent",
            ))),
        }
    }

    /// Sends `request` on `conn`, driving it until the response head is in.
    async fn exchange(&self, mut conn: Conn, request: Request<RequestBody>) -> Exchanged {
        let answer = conn.sender.try_send_request(request);
        let mut answer = std::pin::pin!(answer);
        let mut sent = false;
        let answered = poll_fn(|cx| {
            if !std::mem::replace(&mut sent, true) {
                // The request has just been handed in: nothing can be answered before the
                // driver has written it, so drive with the task's waker at once (one drive
                // instead of `poll_with`'s two).
                return match conn.drive(cx) {
                    true => answer.as_mut().poll(&mut quiet()),
                    false => answer.as_mut().poll(cx),
                };
            }
            conn.poll_with(cx, |cx| answer.as_mut().poll(cx))
        })
        .await;
        match answered {
            Ok(response) => Exchanged::Answered(response.map(|body| UpstreamBody {
                body,
                conn: Some(conn),
                pool: self.shared.clone(),
            })),
            Err(mut e) => match e.take_message() {
                Some(request) => Exchanged::Unsent(request),
                None => Exchanged::Failed(e.into_error()),
            },
        }
    }

    /// Opens a connection in `slot`: TCP with `TCP_NODELAY`, TLS for an `https://` upstream,
    /// then the HTTP/1.1 handshake.
    async fn connect(&self, slot: OwnedSemaphorePermit) -> Result<Conn, SendError> {
        let connect_timeout = self.shared.limits.connect_timeout;
        let connecting = TcpStream::connect(self.shared.address.as_str());
        let stream = match tokio::time::timeout(connect_timeout, connecting).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => return Err(SendError::Connect(e)),
            Err(_) => {
                return Err(SendError::Connect(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "connecting timed out",
                )));
            }
        };
        let _ = stream.set_nodelay(true);
        let stream = match &self.shared.tls {
            None => MaybeTls::Plain(stream),
            Some(tls) => {
                let handshake = tls.connector.connect(tls.name.clone(), stream);
                match tokio::time::timeout(connect_timeout, handshake).await {
                    Ok(Ok(tls)) => MaybeTls::Tls(Box::new(tls)),
                    Ok(Err(e)) => return Err(SendError::Connect(e)),
                    Err(_) => {
                        return Err(SendError::Connect(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "the TLS handshake timed out",
                        )));
                    }
                }
            }
        };
        self.shared.metrics.connects.inc();
        let (sender, driver) = http1::Builder::new()
            .handshake(TokioIo::new(stream))
            .await?;
        self.shared.metrics.open.inc();
        Ok(Conn {
            sender,
            driver: Some(Box::pin(driver)),
            idle_since: Instant::now(),
            _slot: slot,
            open: self.shared.metrics.open.clone(),
        })
    }
}

/// How one attempt at sending a request ended.
enum Exchanged {
    /// The upstream answered.
    Answered(Response<UpstreamBody>),
    /// The connection was closed before the request was written; here it is back.
    Unsent(Request<RequestBody>),
    /// The exchange failed after the request was (perhaps partly) written.
    Failed(hyper::Error),
}

impl Shared {
    /// The idle list (a panic elsewhere while holding it cannot leave it inconsistent).
    fn idle(&self) -> MutexGuard<'_, VecDeque<Conn>> {
        self.idle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The most recently idled connection that can take a request; closed and expired ones
    /// met on the way are dropped.
    fn checkout(&self) -> Option<Conn> {
        loop {
            let mut conn = {
                let mut idle = self.idle();
                let conn = idle.pop_back();
                self.count(&idle);
                conn?
            };
            if conn.idle_since.elapsed() < IDLE_TIMEOUT && conn.reusable() {
                return Some(conn);
            }
        }
    }

    /// Returns a connection whose response has ended, unless it has ended too. It is not
    /// driven here: [`Shared::checkout`] does that (and closes it if it turns out unable to
    /// take a request, say because its request body was still being sent).
    fn checkin(&self, mut conn: Conn) {
        if conn.driver.is_none() || conn.sender.is_closed() {
            return;
        }
        conn.idle_since = Instant::now();
        let mut idle = self.idle();
        if idle.len() >= MAX_IDLE {
            idle.pop_front();
        }
        idle.push_back(conn);
        self.count(&idle);
        drop(idle);
        self.returned.notify_one();
    }

    /// Publishes the idle count (called with the list locked, so the gauge follows it).
    fn count(&self, idle: &VecDeque<Conn>) {
        self.metrics
            .idle
            .set(i64::try_from(idle.len()).unwrap_or(i64::MAX));
    }
}

/// Every [`SWEEP_EVERY`], closes the idle connections that have ended or expired; stops when
/// the pool is gone.
async fn sweep(shared: Weak<Shared>) {
    let mut tick = tokio::time::interval(SWEEP_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let closed: Vec<Conn> = {
            let mut idle = shared.idle();
            let mut closed = Vec::new();
            let mut kept = VecDeque::with_capacity(idle.len());
            for mut conn in idle.drain(..) {
                if conn.idle_since.elapsed() < IDLE_TIMEOUT && conn.reusable() {
                    kept.push_back(conn);
                } else {
                    closed.push(conn);
                }
            }
            *idle = kept;
            shared.count(&idle);
            closed
        };
        drop(closed); // outside the lock
    }
}

/// A response body from the upstream. Polling it also drives the connection it comes on;
/// once it has ended the connection returns to the pool.
pub struct UpstreamBody {
    /// The body as hyper reads it.
    body: Incoming,
    /// The connection, until it is returned.
    conn: Option<Conn>,
    /// Where it returns to.
    pool: Arc<Shared>,
}

impl std::fmt::Debug for UpstreamBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamBody")
            .field("body", &self.body)
            .finish_non_exhaustive()
    }
}

impl UpstreamBody {
    /// Hands the connection back once the body has ended.
    fn release(&mut self) {
        if let Some(conn) = self.conn.take() {
            self.pool.checkin(conn);
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        let body = &mut this.body;
        let frame = match &mut this.conn {
            Some(conn) => conn.poll_with(cx, |cx| Pin::new(&mut *body).poll_frame(cx)),
            None => Pin::new(body).poll_frame(cx),
        };
        match &frame {
            Poll::Ready(None) => this.release(),
            Poll::Ready(Some(Ok(_))) if this.body.is_end_stream() => this.release(),
            // A failed body leaves the connection unusable: close it now.
            Poll::Ready(Some(Err(_))) => this.conn = None,
            _ => {}
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

impl Drop for UpstreamBody {
    /// A body dropped after its end (or one that never had any bytes, which nobody polls)
    /// returns its connection; one dropped part-way closes it (it is in the middle of a
    /// response).
    fn drop(&mut self) {
        if self.body.is_end_stream() {
            self.release();
        }
    }
}
