//! Bodies that may not stall: [`IdleBody`] ends a body with an error when no frame has come
//! for its idle timeout — a client that stops sending its upload midway, or an upstream that
//! stops sending its response, frees the connections they hold.
//!
//! The timer is armed only when the body first has to wait, and not reset on every frame: a
//! frame marks progress, and when the timer fires after progress it is re-armed. A body is
//! thus given up after between one and two idle timeouts of silence, and a body that arrives
//! at once (most do) never touches the timer.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use http_body::{Body, Frame, SizeHint};
use prometheus_client::metrics::counter::Counter;
use tokio::time::{Instant, Sleep};

/// A body stalled for longer than its idle timeout, or its own error.
#[derive(Debug, thiserror::Error)]
pub enum IdleError<E> {
    /// No frame came for the idle timeout.
    #[error("no body data for {}", humantime::format_duration(*.0))]
    Idle(Duration),
    /// The body's own error.
    #[error(transparent)]
    Body(E),
}

/// `B` with an idle timeout.
#[derive(Debug)]
pub struct IdleBody<B> {
    /// The body.
    inner: B,
    /// The silence allowed.
    timeout: Duration,
    /// Armed at the first wait.
    timer: Option<Pin<Box<Sleep>>>,
    /// Whether a frame came since the timer was (re-)armed.
    progressed: bool,
    /// Counts the bodies given up.
    timeouts: Counter,
    /// Where the body reports its progress, for whoever waits on what it feeds (the response
    /// head's timeout, for a request body).
    progress: Option<Arc<Progress>>,
}

/// How a body is getting on, seen from another task or future: the frames it has yielded and
/// whether it is waiting for its source now. The gateway reads it to tell a slow client from a
/// slow upstream.
#[derive(Debug, Default)]
pub(crate) struct Progress {
    /// Frames yielded so far (and the end, counted as one).
    frames: AtomicU64,
    /// Whether the last poll found nothing (the body waits on its source).
    waiting: AtomicBool,
}

impl Progress {
    /// Frames yielded so far.
    pub(crate) fn frames(&self) -> u64 {
        self.frames.load(Ordering::Relaxed)
    }

    /// Whether the body is waiting on its source now.
    pub(crate) fn waiting(&self) -> bool {
        self.waiting.load(Ordering::Relaxed)
    }
}

impl<B> IdleBody<B> {
    /// `inner`, given up (with [`IdleError::Idle`], counted in `timeouts`) after `timeout` to
    /// `2 × timeout` without a frame.
    pub fn new(inner: B, timeout: Duration, timeouts: Counter) -> Self {
        IdleBody {
            inner,
            timeout,
            timer: None,
            progressed: false,
            timeouts,
            progress: None,
        }
    }

    /// Reports the body's progress to `progress` as well.
    pub(crate) fn with_progress(mut self, progress: Option<Arc<Progress>>) -> Self {
        self.progress = progress;
        self
    }
}

impl<B: Body + Unpin> Body for IdleBody<B> {
    type Data = B::Data;
    type Error = IdleError<B::Error>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            this.progressed = true;
            if let Some(progress) = &this.progress {
                progress.frames.fetch_add(1, Ordering::Relaxed);
                progress.waiting.store(false, Ordering::Relaxed);
            }
            return Poll::Ready(frame.map(|r| r.map_err(IdleError::Body)));
        }
        if let Some(progress) = &this.progress {
            progress.waiting.store(true, Ordering::Relaxed);
        }
        let timer = match &mut this.timer {
            Some(timer) => timer,
            None => {
                this.progressed = false;
                this.timer
                    .insert(Box::pin(tokio::time::sleep(this.timeout)))
            }
        };
        loop {
            if timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            if !std::mem::take(&mut this.progressed) {
                this.timeouts.inc();
                return Poll::Ready(Some(Err(IdleError::Idle(this.timeout))));
            }
            timer.as_mut().reset(Instant::now() + this.timeout);
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::BodyExt;

    #[tokio::test(start_paused = true)]
    async fn a_stalled_body_ends_with_an_error_and_a_flowing_one_does_not() {
        let (mut tx, body) = http_body_util::channel::Channel::<Bytes, std::io::Error>::new(4);
        let timeouts = Counter::default();
        let mut body = IdleBody::new(body, Duration::from_secs(10), timeouts.clone());
        // Frames 8 s apart keep it alive, far past one timeout in all.
        let feeder = tokio::spawn(async move {
            for _ in 0..5 {
                tokio::time::sleep(Duration::from_secs(8)).await;
                tx.send_data(Bytes::from_static(b"x")).await.unwrap();
            }
            // Then silence, with the sender kept open.
            tokio::time::sleep(Duration::from_secs(3600)).await;
            drop(tx);
        });
        let started = Instant::now();
        for _ in 0..5 {
            let frame = body.frame().await.unwrap().unwrap();
            assert_eq!(frame.into_data().unwrap(), "x");
        }
        assert_eq!(started.elapsed(), Duration::from_secs(40));
        let silent_from = Instant::now();
        let end = body.frame().await.unwrap();
        assert!(matches!(end, Err(IdleError::Idle(_))), "{end:?}");
        let silence = silent_from.elapsed();
        assert!(
            silence >= Duration::from_secs(10) && silence <= Duration::from_secs(20),
            "{silence:?}"
        );
        assert_eq!(timeouts.get(), 1);
        feeder.abort();
    }
}
