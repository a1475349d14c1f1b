//! Keep-alive HTTP/1.1 connections to the upstream, shared by every client connection and
//! driven by the task that is using them.
//!
//! A connection is a socket with a read buffer and a write buffer, both kept for the
//! connection's life; the exchange is HTTP/1.1 as [`h1`] writes and reads it. The task
//! forwarding a request writes the request head and body and reads the response head itself,
//! and the response body ([`UpstreamBody`]) reads its bytes from the socket as the client's
//! side asks for them, so the upstream socket wakes the task that needs the bytes and nothing
//! crosses tasks. When the body has ended and the connection can take another request (the
//! response was framed by a length or chunks, neither side asked to close, no stray bytes
//! followed it, the whole request was sent), it goes back to the pool (last in, first out);
//! a connection that cannot is closed.
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

use bytes::{Bytes, BytesMut};
use http::request::Parts;
use http::{HeaderValue, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::io::AsyncWrite;
use tokio::net::TcpStream;

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use super::Upstream;
use super::forward::Hop;
use super::h1::{self, Decoder, RequestFraming, RequestHead};
use super::idle::{IdleBody, IdleError};
use crate::metrics::UpstreamMetrics;
use crate::tls::MaybeTls;

/// How long an idle connection is kept.
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// How many idle connections are kept; beyond that the oldest are closed.
pub(crate) const MAX_IDLE: usize = 1024;
/// How often idle connections are looked at.
pub(crate) const SWEEP_EVERY: Duration = Duration::from_secs(5);
/// How many pooled connections one request tries (each found closed before the request was
/// written, or — for a request that may be replayed — before a byte of the answer) before it
/// opens a new one.
const MAX_STALE: usize = 3;

/// What a request sends: the client's body, given up when it stalls.
pub(crate) type RequestBody = IdleBody<Incoming>;

/// The read buffer's usual size: room for a response head and a small body in one read.
const READ_BUFFER: usize = 8 * 1024;
/// Below this much free room, the read buffer is grown (or reclaimed) before reading.
const MIN_READ_ROOM: usize = 1024;
/// The most room an idle connection's buffers keep; beyond it they are let go. (The write
/// buffer grows with the largest body frame written; the read buffer's allocation is bounded
/// anyway — heads by 64 KiB, body bytes are handed on as they arrive.)
const KEPT_BUFFER: usize = 16 * 1024;

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
    /// The client's request body failed (stalled, malformed or cut short) while it was sent.
    #[error("the request body failed: {0}")]
    Body(IdleError<hyper::Error>),
    /// The connection failed, or the upstream's answer was not HTTP/1.1 as RFC 9112 frames it.
    #[error("{0}")]
    Upstream(io::Error),
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

/// A connection to the upstream, TLS for an `https://` one.
type UpstreamStream = MaybeTls<TcpStream, tokio_rustls::client::TlsStream<TcpStream>>;

/// One connection to the upstream.
struct Conn {
    /// The socket.
    stream: UpstreamStream,
    /// What has been read and not yet taken (response bodies are slices of it).
    read: BytesMut,
    /// The request body's bytes being written, framed (kept for the next request's; the head
    /// goes from its own buffer, `RequestHead`).
    write: Vec<u8>,
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
            .field("buffered", &self.read.len())
            .field("idle_since", &self.idle_since)
            .finish()
    }
}

impl Conn {
    /// Reads what the socket has into the read buffer (growing it, or reclaiming it once
    /// every earlier slice has been dropped, when little room is left): the bytes read, `0`
    /// at the connection's end.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.read.capacity() - self.read.len() < MIN_READ_ROOM {
            self.read.reserve(READ_BUFFER);
        }
        tokio_util::io::poll_read_buf(Pin::new(&mut self.stream), cx, &mut self.read)
    }

    /// Whether an idle connection can take a request: nothing has arrived on it, not even its
    /// end (looked at without a waker to register).
    fn reusable(&mut self) -> bool {
        self.read.is_empty() && self.poll_fill(&mut quiet()).is_pending()
    }

    /// Writes the request (its head now, then its body as it comes, framed) while watching
    /// for the response head, which it returns — the connection marked as not to be reused
    /// when the upstream answered before the whole request was sent.
    fn poll_exchange(
        &mut self,
        cx: &mut Context<'_>,
        sending: &mut Sending<'_>,
    ) -> Poll<Result<h1::ResponseHead, Failure>> {
        if let Err(failure) = self.poll_send(cx, sending) {
            return Poll::Ready(Err(failure));
        }
        loop {
            match h1::parse_response(&mut self.read, &sending.head.method) {
                Err(e) => {
                    let e = io::Error::new(io::ErrorKind::InvalidData, e);
                    return Poll::Ready(Err(Failure::Upstream(e)));
                }
                Ok(Some(mut head)) => {
                    if !sending.whole(self.write.is_empty()) {
                        head.keep_alive = false;
                    }
                    return Poll::Ready(Ok(head));
                }
                Ok(None) => {}
            }
            match self.poll_fill(cx) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(sending.failed(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the upstream closed the connection without answering",
                    ))));
                }
                Poll::Ready(Ok(_)) => sending.heard = true,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(sending.failed(e))),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    /// Writes what can be written now: the head, the buffered body bytes, then the body's
    /// frames as they come.
    fn poll_send(
        &mut self,
        cx: &mut Context<'_>,
        sending: &mut Sending<'_>,
    ) -> Result<(), Failure> {
        loop {
            loop {
                // The head first (from its own buffer: it stays whole, to go again with a
                // replayed request), then what the write buffer holds.
                let (bytes, written) = if sending.head_written < sending.head.bytes.len() {
                    (&sending.head.bytes[..], &mut sending.head_written)
                } else {
                    (&self.write[..], &mut sending.written)
                };
                if *written == bytes.len() {
                    break;
                }
                match Pin::new(&mut self.stream).poll_write(cx, &bytes[*written..]) {
                    Poll::Ready(Ok(0)) => {
                        return Err(sending.failed(io::ErrorKind::WriteZero.into()));
                    }
                    Poll::Ready(Ok(n)) => {
                        *written += n;
                        sending.started = true;
                    }
                    Poll::Ready(Err(e)) => return Err(sending.failed(e)),
                    Poll::Pending => return Ok(()),
                }
            }
            self.write.clear();
            sending.written = 0;
            // An empty body is not polled: it stays whole, to go again with a replayed request.
            let Some(body) = sending
                .body
                .as_mut()
                .filter(|_| sending.head.framing != RequestFraming::Empty)
            else {
                return self.poll_flush(cx, sending);
            };
            match Pin::new(body).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    // Trailers are not forwarded (`Trailer` is hop-by-hop and was removed).
                    if let Ok(data) = frame.into_data() {
                        match sending.head.framing {
                            RequestFraming::Chunked => h1::write_chunk(&data, &mut self.write),
                            _ => self.write.extend_from_slice(&data),
                        }
                    }
                }
                Poll::Ready(Some(Err(e))) => return Err(Failure::Body(e)),
                Poll::Ready(None) => {
                    if sending.head.framing == RequestFraming::Chunked {
                        self.write.extend_from_slice(h1::LAST_CHUNK);
                    }
                    sending.body = None;
                }
                Poll::Pending => return self.poll_flush(cx, sending),
            }
        }
    }

    /// Flushes what the stream holds (TLS records; nothing for TCP).
    fn poll_flush(
        &mut self,
        cx: &mut Context<'_>,
        sending: &mut Sending<'_>,
    ) -> Result<(), Failure> {
        match Pin::new(&mut self.stream).poll_flush(cx) {
            Poll::Ready(Err(e)) => Err(sending.failed(e)),
            _ => Ok(()),
        }
    }
}

/// A request on its way up.
struct Sending<'a> {
    /// Its head: method, bytes, and how the body is framed.
    head: &'a RequestHead,
    /// How much of the head is written.
    head_written: usize,
    /// Its body, until it has ended.
    body: Option<RequestBody>,
    /// How much of the write buffer (the body's bytes) is written.
    written: usize,
    /// Whether any byte has been written.
    started: bool,
    /// Whether it may be sent again on another connection when this one ends before a byte
    /// of the answer: a pooled connection (the upstream may have closed it as it was taken —
    /// a keep-alive timeout's race), an idempotent method, no body (RFC 9110 §9.2.2).
    replayable: bool,
    /// Whether any byte of the answer has been read.
    heard: bool,
}

impl Sending<'_> {
    /// Whether the whole request has been written (`buffered`: the write buffer is empty).
    fn whole(&self, buffered: bool) -> bool {
        self.head_written == self.head.bytes.len()
            && buffered
            && (self.body.is_none() || self.head.framing == RequestFraming::Empty)
    }

    /// The failure a broken connection is: the request comes back when none of it was
    /// written, or when it may be replayed and nothing was answered.
    fn failed(&mut self, error: io::Error) -> Failure {
        if !self.started || (self.replayable && !self.heard) {
            Failure::Unsent(error)
        } else {
            Failure::Upstream(error)
        }
    }
}

/// How an exchange failed.
enum Failure {
    /// Before a byte of the request was written (the connection had closed), or before a
    /// byte of the answer to a request that may be replayed.
    Unsent(io::Error),
    /// The client's body failed.
    Body(IdleError<hyper::Error>),
    /// The connection failed, or the upstream's answer was not HTTP/1.1.
    Upstream(io::Error),
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

    /// The head `parts` are sent upstream with (see [`RequestHead::write`]; the upstream's
    /// authority as `Host` when the request has none).
    pub(crate) fn head(&self, parts: &Parts, hop: &Hop, has_body: bool) -> RequestHead {
        RequestHead::write(parts, hop, &self.shared.host, has_body)
    }

    /// Sends the request (`head`, then `body`) on a pooled connection — or a new one when none
    /// is idle or those tried were found closed before the request was written — and returns
    /// the response head; the body streams from the connection as it is read.
    pub(crate) async fn send(
        &self,
        head: &RequestHead,
        mut body: RequestBody,
    ) -> Result<Response<UpstreamBody>, SendError> {
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
                match self.exchange(conn, true, head, body).await {
                    Exchanged::Answered(response) => return Ok(response),
                    Exchanged::Failed(e) => return Err(e),
                    Exchanged::Unsent(back) => {
                        body = back;
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
        // Boxed: connecting (a TLS handshake's state above all) is most of this future's
        // size, which every request's future would otherwise carry — and copy, when it is
        // boxed on its way into the connection's task — for the few that open a connection.
        let conn = Box::pin(self.connect(slot)).await?;
        match self.exchange(conn, false, head, body).await {
            Exchanged::Answered(response) => Ok(response),
            Exchanged::Failed(e) => Err(e),
            Exchanged::Unsent(_) => Err(SendError::Connect(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the new connection closed before the request could be sent",
            ))),
        }
    }

    /// Sends the request on `conn` and reads the response head.
    ///
    /// Not an `async fn`: one would keep its arguments twice (as given and as moved into its
    /// body), and this future is part of every forwarded request's [`send`](Self::send) future,
    /// which is boxed and costs least below 1,032 bytes (glibc's per-thread cache; see
    /// `Gateway::forward`). Built here, the request's state is the block's only copy.
    fn exchange<'a>(
        &'a self,
        mut conn: Conn,
        pooled: bool,
        head: &'a RequestHead,
        body: RequestBody,
    ) -> impl Future<Output = Exchanged> + Send + 'a {
        conn.write.clear();
        let mut sending = Sending {
            head,
            head_written: 0,
            // Kept when empty too (polling it ends at once): an unsent request is given back.
            body: Some(body),
            written: 0,
            started: false,
            replayable: pooled
                && head.method.is_idempotent()
                && head.framing == RequestFraming::Empty,
            heard: false,
        };
        async move {
            match poll_fn(|cx| conn.poll_exchange(cx, &mut sending)).await {
                Ok(head) => Exchanged::Answered(Response::from_parts(
                    head.parts,
                    UpstreamBody {
                        decoder: Decoder::new(head.framing),
                        keep_alive: head.keep_alive,
                        conn: Some(conn),
                        pool: self.shared.clone(),
                    },
                )),
                // Nothing was written, or the body was empty and never polled: it is whole.
                Err(Failure::Unsent(e)) => match sending.body {
                    Some(body) => {
                        tracing::debug!("pooled upstream connection closed under the request: {e}");
                        Exchanged::Unsent(body)
                    }
                    None => Exchanged::Failed(SendError::Upstream(e)),
                },
                Err(Failure::Body(e)) => Exchanged::Failed(SendError::Body(e)),
                Err(Failure::Upstream(e)) => Exchanged::Failed(SendError::Upstream(e)),
            }
        }
    }

    /// Opens a connection in `slot`: TCP with `TCP_NODELAY`, TLS for an `https://` upstream.
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
        self.shared.metrics.open.inc();
        Ok(Conn {
            stream,
            read: BytesMut::new(),
            write: Vec::new(),
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
    /// The connection closed before the request was written (or, for a request that may be
    /// replayed, before a byte of the answer); here is its body back.
    Unsent(RequestBody),
    /// The exchange failed after the request was (perhaps partly) written.
    Failed(SendError),
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

    /// Returns a connection whose response has ended and which may take another request
    /// ([`Shared::checkout`] looks again whether the upstream has closed it meanwhile).
    fn checkin(&self, mut conn: Conn) {
        conn.idle_since = Instant::now();
        // Buffers grown by a large head or body frame are not kept while idle.
        if conn.write.capacity() > KEPT_BUFFER {
            conn.write = Vec::new();
        }
        if conn.read.capacity() > KEPT_BUFFER {
            conn.read = BytesMut::new();
        }
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

/// A response body from the upstream, read from its connection as it is polled; once it has
/// ended the connection returns to the pool, if it may take another request.
pub struct UpstreamBody {
    /// Where the body's framing is.
    decoder: Decoder,
    /// Whether the connection may be reused once the body has ended.
    keep_alive: bool,
    /// The connection, until the body ends.
    conn: Option<Conn>,
    /// Where it returns to.
    pool: Arc<Shared>,
}

impl std::fmt::Debug for UpstreamBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamBody")
            .field("decoder", &self.decoder)
            .finish_non_exhaustive()
    }
}

impl UpstreamBody {
    /// Lets the connection go once the body has ended: back to the pool when it may take
    /// another request and nothing followed the response on it, else closed.
    fn release(&mut self) {
        if let Some(conn) = self.conn.take()
            && self.keep_alive
            && conn.read.is_empty()
        {
            self.pool.checkin(conn);
        }
    }

    /// Closes the connection after a failed body: it is somewhere in a response.
    fn fail(&mut self, error: io::Error) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        self.conn = None;
        Poll::Ready(Some(Err(error)))
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = &mut *self;
        loop {
            let Some(conn) = &mut this.conn else {
                return Poll::Ready(None);
            };
            match this.decoder.decode(&mut conn.read) {
                Ok(Some(data)) => {
                    if this.decoder.is_done() {
                        this.release();
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Ok(None) if this.decoder.is_done() => {
                    this.release();
                    return Poll::Ready(None);
                }
                Ok(None) => {}
                Err(e) => return this.fail(io::Error::new(io::ErrorKind::InvalidData, e)),
            }
            match conn.poll_fill(cx) {
                Poll::Ready(Ok(0)) => {
                    // Read to the connection's end (or cut short): not reusable either way.
                    this.conn = None;
                    return match this.decoder.closed() {
                        Ok(()) => Poll::Ready(None),
                        Err(e) => this.fail(io::Error::new(io::ErrorKind::UnexpectedEof, e)),
                    };
                }
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) => return this.fail(e),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.decoder.is_done()
    }

    fn size_hint(&self) -> SizeHint {
        match self.decoder.remaining() {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}

impl Drop for UpstreamBody {
    /// A body dropped after its end (or one that never had any bytes, which nobody polls)
    /// returns its connection; one dropped part-way closes it (it is in the middle of a
    /// response).
    fn drop(&mut self) {
        if self.decoder.is_done() {
            self.release();
        }
    }
}
