//! Bounded listeners: every client-facing socket of the service (the HTTP and gRPC APIs, the
//! gateway and the WebSocket gateway) accepts through an [`Acceptor`], which holds at most
//! [`ListenLimits::max_connections`] connections open at once. A connection beyond that is
//! accepted and closed at once (the client sees the connection end before any byte, instead
//! of waiting in the kernel's backlog), and counted. Each accepted connection carries its slot
//! ([`Limited`]) and gives it back when it is dropped, whatever path ends it.
//!
//! Metrics, per listener (`http`, `grpc`, `gateway`, `websocket`):
//! `flowgate_listener_connections{listener}` (open now),
//! `flowgate_listener_refused_connections_total{listener}` (closed at once, over the cap) and
//! `flowgate_listener_timeouts_total{listener}` (connections closed because the request head
//! did not arrive within [`ListenLimits::header_read_timeout`]) and
//! `flowgate_listener_oversized_heads_total{listener}` (request heads over
//! [`ListenLimits::max_header_bytes`], answered `431`) and
//! `flowgate_listener_tls_handshake_failures_total{listener}` (with TLS: handshakes that failed
//! or did not finish within [`ListenLimits::header_read_timeout`]).
//!
//! With TLS ([`Acceptor::with_tls`]) the handshake runs in the connection's own task, on its
//! first read, so a slow client never holds up the accept loop.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;

pub use crate::metrics::ListenerMetrics;
use crate::tls::MaybeTls;

mod serve;
pub use serve::serve_connections;

/// The default [`ListenLimits::max_connections`]: far above what one instance serves well,
/// far below the file descriptors a flood could otherwise take.
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;

/// The default [`ListenLimits::header_read_timeout`].
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The default [`ListenLimits::max_header_bytes`] (nginx's `large_client_header_buffers` is
/// 4 × 8 KiB).
pub const DEFAULT_MAX_HEADER_BYTES: usize = 32 * 1024;

/// Limits shared by every client-facing listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenLimits {
    /// Connections each listener holds open at once; more are closed as soon as accepted.
    pub max_connections: usize,
    /// How long a client may take to send a request head (hyper's header read timeout), on a
    /// new connection and between requests on a keep-alive one — so it also bounds how long an
    /// idle keep-alive connection is kept. Applies to the gateway and the WebSocket gateway.
    pub header_read_timeout: Duration,
    /// The largest request head (request line and header fields) the gateway and WebSocket
    /// gateway read; a larger one is answered `431` and its connection closed.
    pub max_header_bytes: usize,
}

impl Default for ListenLimits {
    fn default() -> Self {
        ListenLimits {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            max_header_bytes: DEFAULT_MAX_HEADER_BYTES,
        }
    }
}

/// A listener that holds at most `max_connections` connections.
pub struct Acceptor {
    /// The socket.
    listener: TcpListener,
    /// One permit per connection that may be open.
    slots: Arc<Semaphore>,
    /// The limits it was built with.
    limits: ListenLimits,
    /// Open and refused connections.
    metrics: ListenerMetrics,
    /// TLS for every connection, when set.
    tls: Option<TlsAcceptor>,
    /// How many bytes a client must send within the header read timeout.
    opening_bytes: usize,
}

impl std::fmt::Debug for Acceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acceptor")
            .field("listener", &self.listener)
            .field("limits", &self.limits)
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

impl Acceptor {
    /// Accepts on `listener`, holding at most `limits.max_connections` (at least 1) open.
    pub fn new(listener: TcpListener, limits: ListenLimits, metrics: ListenerMetrics) -> Self {
        Acceptor {
            listener,
            slots: Arc::new(Semaphore::new(limits.max_connections.max(1))),
            limits,
            metrics,
            tls: None,
            opening_bytes: 1,
        }
    }

    /// Requires the first `bytes` bytes of every connection (HTTP/2's 24-byte preface, say)
    /// within [`ListenLimits::header_read_timeout`], instead of the first byte only: a client
    /// that trickles its opening is closed like one that sends nothing.
    pub fn with_opening_bytes(mut self, bytes: usize) -> Self {
        self.opening_bytes = bytes.max(1);
        self
    }

    /// Serves every connection over TLS with `tls` (the handshake within
    /// [`ListenLimits::header_read_timeout`]).
    pub fn with_tls(mut self, tls: Option<TlsAcceptor>) -> Self {
        self.tls = tls;
        self
    }

    /// The limits connections from it are served under.
    pub fn limits(&self) -> ListenLimits {
        self.limits
    }

    /// What a connection's task needs to report how it ended (it must not hold the acceptor,
    /// whose socket closes when the server stops accepting).
    pub fn ended(&self) -> Ended {
        Ended {
            timeouts: self.metrics.timeouts.clone(),
            oversized: self.metrics.oversized.clone(),
        }
    }

    /// The next connection there is room for (`TCP_NODELAY` set); connections beyond the cap
    /// are closed and counted meanwhile. Errors are the socket's (out of file descriptors).
    pub async fn accept(&self) -> io::Result<(Limited, SocketAddr)> {
        loop {
            let (stream, peer) = self.listener.accept().await?;
            let Ok(slot) = self.slots.clone().try_acquire_owned() else {
                self.metrics.refused.inc();
                tracing::debug!(%peer, "connection refused: the listener is full");
                drop(stream);
                continue;
            };
            let _ = stream.set_nodelay(true);
            self.metrics.open.inc();
            let io = match &self.tls {
                None => Io::Ready(MaybeTls::Plain(stream)),
                Some(tls) => Io::Handshaking {
                    accept: Box::new(tls.accept(stream)),
                    deadline: Box::pin(tokio::time::sleep(self.limits.header_read_timeout)),
                    failures: self.metrics.tls_failures.clone(),
                },
            };
            let first_byte = FirstByte {
                deadline: Box::pin(tokio::time::sleep(self.limits.header_read_timeout)),
                timeouts: self.metrics.timeouts.clone(),
                missing: self.opening_bytes,
            };
            return Ok((
                Limited {
                    io,
                    first_byte: Some(first_byte),
                    _slot: Slot {
                        _permit: slot,
                        open: self.metrics.open.clone(),
                    },
                },
                peer,
            ));
        }
    }

    /// The metrics this listener updates.
    pub fn metrics(&self) -> &ListenerMetrics {
        &self.metrics
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

/// Reports how a connection ended.
#[derive(Debug, Clone)]
pub struct Ended {
    /// Heads that came too late.
    timeouts: Counter,
    /// Heads that were too large.
    oversized: Counter,
}

impl Ended {
    /// Counts a connection closed because its request head was late or too large, when
    /// `error` says so.
    pub fn with_error(&self, error: &hyper::Error) {
        if error.is_timeout() {
            self.timeouts.inc();
        } else if error.is_parse_too_large() {
            self.oversized.inc();
        }
    }
}

/// Applies the limits of `limits` that hyper enforces to an HTTP/1 server `builder` (which has
/// a timer).
pub fn configure(builder: &mut hyper::server::conn::http1::Builder, limits: ListenLimits) {
    builder.header_read_timeout(limits.header_read_timeout);
    builder.max_header_size(limits.max_header_bytes);
}

/// A connection's place under the cap; given back on drop.
#[derive(Debug)]
struct Slot {
    /// The semaphore permit.
    _permit: OwnedSemaphorePermit,
    /// Decremented on drop.
    open: Gauge,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.open.dec();
    }
}

/// An accepted connection holding its slot.
#[derive(Debug)]
pub struct Limited {
    /// The connection.
    io: Io,
    /// Until the client's opening bytes have arrived: when the connection is given up (a
    /// client that connects and sends nothing, or trickles its opening — slowloris — on every
    /// listener, HTTP/2 included).
    first_byte: Option<FirstByte>,
    /// Released when the connection is dropped.
    _slot: Slot,
}

/// The deadline for a connection's first byte, and what counts its expiry.
#[derive(Debug)]
struct FirstByte {
    /// When the connection is given up.
    deadline: Pin<Box<tokio::time::Sleep>>,
    /// `flowgate_listener_timeouts_total{listener}`.
    timeouts: Counter,
    /// Opening bytes still to come.
    missing: usize,
}

/// A connection's stream, before and after its TLS handshake.
enum Io {
    /// Plain, or TLS after the handshake.
    Ready(MaybeTls<TcpStream, tokio_rustls::server::TlsStream<TcpStream>>),
    /// The TLS handshake is under way.
    Handshaking {
        /// The handshake (boxed: rustls's connection state is large, and plain connections
        /// should not carry its size).
        accept: Box<tokio_rustls::Accept<TcpStream>>,
        /// When it is given up (checked on writes too: an HTTP/2 server writes its settings
        /// first, before it reads).
        deadline: Pin<Box<tokio::time::Sleep>>,
        /// Counts a failure.
        failures: Counter,
    },
    /// The handshake failed; the connection is of no more use.
    Failed,
}

impl std::fmt::Debug for Io {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Io::Ready(MaybeTls::Plain(_)) => "Io::Plain",
            Io::Ready(MaybeTls::Tls(_)) => "Io::Tls",
            Io::Handshaking { .. } => "Io::Handshaking",
            Io::Failed => "Io::Failed",
        })
    }
}

impl Limited {
    /// The stream once the TLS handshake (if any) is done; the handshake's error, or a timeout,
    /// otherwise.
    fn poll_ready(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<&mut MaybeTls<TcpStream, tokio_rustls::server::TlsStream<TcpStream>>>>
    {
        if let Io::Handshaking {
            accept, deadline, ..
        } = &mut self.io
        {
            let failed = match Pin::new(accept.as_mut()).poll(cx) {
                Poll::Ready(Ok(stream)) => {
                    self.io = Io::Ready(MaybeTls::Tls(Box::new(stream)));
                    None
                }
                Poll::Ready(Err(e)) => Some(e),
                Poll::Pending => match deadline.as_mut().poll(cx) {
                    Poll::Ready(()) => Some(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the TLS handshake did not finish in time",
                    )),
                    Poll::Pending => return Poll::Pending,
                },
            };
            if let Some(e) = failed {
                if let Io::Handshaking { failures, .. } = &self.io {
                    failures.inc();
                }
                tracing::debug!("TLS handshake failed: {e}");
                self.io = Io::Failed;
                return Poll::Ready(Err(e));
            }
        }
        match &mut self.io {
            Io::Ready(stream) => Poll::Ready(Ok(stream)),
            _ => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "the TLS handshake failed",
            ))),
        }
    }
}

impl AsyncRead for Limited {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let filled = buf.filled().len();
        let this = &mut *self;
        let read = match this.poll_ready(cx) {
            Poll::Ready(Ok(stream)) => Pin::new(stream).poll_read(cx, buf),
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        };
        let Some(first) = &mut this.first_byte else {
            return read;
        };
        match read {
            Poll::Ready(Ok(())) if buf.filled().len() > filled => {
                first.missing = first.missing.saturating_sub(buf.filled().len() - filled);
                if first.missing == 0 {
                    this.first_byte = None;
                }
            }
            Poll::Pending if first.deadline.as_mut().poll(cx).is_ready() => {
                first.timeouts.inc();
                this.first_byte = None;
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the client's opening did not arrive within the header read timeout",
                )));
            }
            _ => {}
        }
        read
    }
}

impl AsyncWrite for Limited {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let stream = ready!(self.poll_ready(cx))?;
        Pin::new(stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.io {
            Io::Ready(stream) => Pin::new(stream).poll_flush(cx),
            // Nothing was written before the handshake.
            _ => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.io {
            Io::Ready(stream) => Pin::new(stream).poll_shutdown(cx),
            // Dropping the connection closes it.
            _ => Poll::Ready(Ok(())),
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let stream = ready!(self.poll_ready(cx))?;
        Pin::new(stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        match &self.io {
            Io::Ready(stream) => stream.is_write_vectored(),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_full_listener_closes_new_connections_and_a_dropped_one_frees_its_slot() {
        use tokio::io::AsyncReadExt;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = ListenLimits {
            max_connections: 1,
            ..ListenLimits::default()
        };
        let acceptor = Acceptor::new(listener, limits, ListenerMetrics::default());
        let _first_client = TcpStream::connect(addr).await.unwrap();
        let (first, _) = acceptor.accept().await.unwrap();
        assert_eq!(acceptor.metrics().open.get(), 1);

        // Over the cap: closed before any byte, counted.
        let mut second = TcpStream::connect(addr).await.unwrap();
        let accepting = tokio::spawn(async move {
            let accepted = acceptor.accept().await.unwrap();
            (acceptor, accepted)
        });
        let mut byte = [0u8; 1];
        assert_eq!(second.read(&mut byte).await.unwrap_or(0), 0);
        // Freeing the slot lets the next one in.
        drop(first);
        let third = TcpStream::connect(addr).await.unwrap();
        let (acceptor, (_third_conn, peer)) = accepting.await.unwrap();
        assert_eq!(peer, third.local_addr().unwrap());
        assert_eq!(acceptor.metrics().refused.get(), 1);
        assert_eq!(acceptor.metrics().open.get(), 1);
    }
}
