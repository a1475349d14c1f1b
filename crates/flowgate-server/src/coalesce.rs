//! Write coalescing for HTTP/2 connections: [`Coalesced`] yields to the runtime once before
//! each burst of writes, so that the other streams' tasks that are ready meanwhile add their
//! frames first and everything leaves in one system call and TCP segment.
//!
//! Without it, hyper's and h2's connection task writes as soon as one stream wakes it (tokio
//! runs the woken task next), so each response — or, in a client, each request — is a write
//! and a segment of its own, and wakes the peer once each: in issue 14's measurement, 256,386
//! segments for 200,000 gRPC calls instead of 25,104, and 40 % more server CPU per decision.
//! The bytes are the same, only grouped; a lone write pays one extra scheduling round.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// `T` whose first write after each flush yields once (waking its task) before it goes
/// through; reads, and the rest of a burst, pass straight through.
#[derive(Debug)]
pub struct Coalesced<T> {
    /// The connection.
    inner: T,
    /// Whether this burst has yielded already.
    yielded: bool,
}

impl<T> Coalesced<T> {
    /// Wraps `inner`.
    pub fn new(inner: T) -> Self {
        Coalesced {
            inner,
            yielded: false,
        }
    }

    /// `Pending` (after waking the task) at the first write of a burst, `Ready` after.
    fn poll_turn(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.yielded {
            return Poll::Ready(());
        }
        self.yielded = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Coalesced<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Coalesced<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        std::task::ready!(this.poll_turn(cx));
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        std::task::ready!(this.poll_turn(cx));
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.yielded = false;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Waker;
    use tokio::io::AsyncReadExt;
    use tokio::net::{TcpListener, TcpStream};

    #[tokio::test]
    async fn the_first_write_of_each_burst_yields_once() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (conn, _) = listener.accept().await.unwrap();
        let mut conn = Coalesced::new(conn);
        let mut cx = Context::from_waker(Waker::noop());
        let mut conn = Pin::new(&mut conn);
        assert!(conn.as_mut().poll_write(&mut cx, b"ab").is_pending());
        assert!(matches!(
            conn.as_mut().poll_write(&mut cx, b"ab"),
            Poll::Ready(Ok(2))
        ));
        assert!(matches!(
            conn.as_mut().poll_write(&mut cx, b"cd"),
            Poll::Ready(Ok(2))
        ));
        assert!(matches!(
            conn.as_mut().poll_flush(&mut cx),
            Poll::Ready(Ok(()))
        ));
        // After a flush, the next burst yields again.
        assert!(conn.as_mut().poll_write(&mut cx, b"ef").is_pending());
        assert!(matches!(
            conn.as_mut().poll_write(&mut cx, b"ef"),
            Poll::Ready(Ok(2))
        ));
        let mut got = [0u8; 6];
        client.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"abcdef");
    }
}
