//! A reader whose bytes arrive a few at a time: for parsers that must give the same answer
//! however their input is cut.

use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, ReadBuf};

/// A peer whose bytes arrive at most `chunk` at a time, then end. Never pending: a parser
/// polled with it sees every cut without a runtime (poll it with `Waker::noop()`).
///
/// ```
/// use std::task::{Context, Poll, Waker};
/// use tokio::io::{AsyncRead, ReadBuf};
///
/// let mut peer = flowgate_testing::trickle::Trickle::new(b"hello", 2);
/// let mut room = [0u8; 8];
/// let mut buf = ReadBuf::new(&mut room);
/// let mut cx = Context::from_waker(Waker::noop());
/// assert!(std::pin::Pin::new(&mut peer).poll_read(&mut cx, &mut buf).is_ready());
/// assert_eq!(buf.filled(), b"he");
/// ```
#[derive(Debug)]
pub struct Trickle<'a> {
    /// What is left to arrive.
    input: &'a [u8],
    /// The most one read returns.
    chunk: usize,
}

impl<'a> Trickle<'a> {
    /// `input`, at most `chunk` bytes per read (at least one).
    pub fn new(input: &'a [u8], chunk: usize) -> Self {
        Trickle {
            input,
            chunk: chunk.max(1),
        }
    }
}

impl AsyncRead for Trickle<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let n = self.chunk.min(self.input.len()).min(buf.remaining());
        buf.put_slice(&self.input[..n]);
        self.input = &self.input[n..];
        Poll::Ready(Ok(()))
    }
}
