//! One relayed connection: client ⇄ gateway ⇄ upstream, in one task. Each direction has a
//! bounded queue of messages waiting to be written; reading from a side pauses while the other
//! side's queue is full (or, by `slow_reader`, the message is dropped or the connection closed
//! with 1013). Every client message is judged by the session before it is queued.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use flowgate::ws::{Action, Checked, MessageInfo, Session, close_code};
use futures_util::task::AtomicWaker;
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio::io::AsyncWrite;
use tokio::time::{Instant, Sleep};
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Control, Data, OpCode};

use super::frames::{self, Inbound, Kind, ReadError};
use super::{Runtime, WsGateway};
use crate::config::websocket::SlowReader;

/// An upgraded HTTP connection.
type Io = TokioIo<Upgraded>;

/// How long the closing handshake may take before the connection is dropped.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);

/// Bytes gathered for one write to a socket: queued messages are copied into one buffer up to
/// this much, so that a burst goes out in few system calls.
const WRITE_BUFFER: usize = 8192;

/// The sides of a relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    /// The client.
    Client = 0,
    /// The upstream.
    Upstream = 1,
}

impl Side {
    /// The side a message from this one goes to.
    fn other(self) -> Side {
        match self {
            Side::Client => Side::Upstream,
            Side::Upstream => Side::Client,
        }
    }
}

/// One side's socket's wake-ups: they wake the relay's task and say that this side may have
/// news, so a wake-up reads only the sides that may (a read that finds nothing costs a look
/// at the socket: with both sides read on every wake-up, four reads per relayed round trip
/// instead of two).
#[derive(Debug)]
struct SideWake {
    /// Set by a wake-up from this side's socket; cleared just before the side is read.
    news: AtomicBool,
    /// The relay's task.
    task: AtomicWaker,
}

impl Wake for SideWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.news.store(true, Ordering::Release);
        self.task.wake();
    }
}

/// What one side's socket is polled with: [`SideWake`] and the waker made of it.
#[derive(Debug)]
struct SideWaker {
    /// Whether the side has news, and the task to wake.
    wake: Arc<SideWake>,
    /// `wake` as a waker, made once.
    waker: Waker,
}

impl SideWaker {
    /// A side's waker; the side counts as having news until it is first read.
    fn new() -> Self {
        let wake = Arc::new(SideWake {
            news: AtomicBool::new(true),
            task: AtomicWaker::new(),
        });
        SideWaker {
            waker: Waker::from(wake.clone()),
            wake,
        }
    }

    /// Takes the news: whether the side may have something to read (reading it is due now).
    fn take_news(&self) -> bool {
        self.wake.news.swap(false, Ordering::AcqRel)
    }

    /// The side has more to read without a wake-up (a read returned a message: the next one may
    /// already be in the library's buffer).
    fn keep_news(&self) {
        self.wake.news.store(true, Ordering::Release);
    }
}

/// Messages waiting to be written to one side, as frames' bytes.
#[derive(Debug, Default)]
struct Queue {
    /// The messages not yet in `out`.
    items: VecDeque<Vec<u8>>,
    /// Their bytes.
    bytes: usize,
    /// What the next writes send: messages copied in up to [`WRITE_BUFFER`] bytes.
    out: Vec<u8>,
    /// How much of `out` is written.
    written: usize,
    /// Written but not yet flushed.
    dirty: bool,
}

impl Queue {
    /// Whether `limit` is reached.
    fn full(&self, messages: usize, bytes: usize) -> bool {
        self.items.len() >= messages || self.bytes >= bytes
    }

    /// Queues one message's frames. While nothing waits and the write buffer has room they go
    /// straight into it (no allocation: the common case).
    fn push(&mut self, frames: &[u8]) {
        if self.items.is_empty() && self.out.len() < WRITE_BUFFER {
            self.out.extend_from_slice(frames);
        } else {
            self.bytes += frames.len();
            self.items.push_back(frames.to_vec());
        }
    }

    /// Writes what the socket takes now and flushes; `Err` when the socket failed.
    fn drive(&mut self, io: &mut Io, cx: &mut Context<'_>) -> io::Result<()> {
        loop {
            while self.out.len() < WRITE_BUFFER {
                let Some(message) = self.items.pop_front() else {
                    break;
                };
                self.bytes -= message.len();
                self.out.extend_from_slice(&message);
            }
            if self.written == self.out.len() {
                break;
            }
            match Pin::new(&mut *io).poll_write(cx, &self.out[self.written..]) {
                Poll::Ready(Ok(0)) => return Err(io::ErrorKind::WriteZero.into()),
                Poll::Ready(Ok(n)) => {
                    self.dirty = true;
                    self.written += n;
                    if self.written == self.out.len() {
                        self.out.clear();
                        self.written = 0;
                    }
                }
                Poll::Ready(Err(e)) => return Err(e),
                Poll::Pending => break,
            }
        }
        if self.items.is_empty() && self.items.capacity() > 16 {
            // A burst is over: give its memory back (idle connections stay small).
            self.items = VecDeque::new();
        }
        if self.out.is_empty() && self.out.capacity() > 2 * WRITE_BUFFER {
            self.out = Vec::new();
        }
        if self.dirty {
            match Pin::new(&mut *io).poll_flush(cx) {
                Poll::Ready(Ok(())) => self.dirty = false,
                Poll::Ready(Err(e)) => return Err(e),
                Poll::Pending => {}
            }
        }
        Ok(())
    }

    /// Whether everything queued has been written and flushed.
    fn done(&self) -> bool {
        self.items.is_empty() && self.out.is_empty() && !self.dirty
    }
}

/// A relayed connection.
pub(super) struct Relay {
    /// The sockets, by [`Side`].
    io: [Io; 2],
    /// What each side sent, cut into messages, by [`Side`].
    inbound: [Inbound; 2],
    /// Client → upstream limits. Boxed, as `outbound`: a session is about a kilobyte, and the
    /// futures that hand it on (the connection's task, this relay's) would each keep room
    /// for it inline for the connection's whole life.
    session: Box<Session>,
    /// Upstream → client limits, if any.
    outbound: Option<Box<Session>>,
    /// What waits to be written to each side, by [`Side`]: `[to client, to upstream]`.
    queues: [Queue; 2],
    /// What each socket is polled with, by [`Side`].
    wakers: [SideWaker; 2],
}

impl Relay {
    /// Relays between both upgraded connections.
    pub(super) fn new(
        runtime: &Runtime,
        client: Upgraded,
        upstream: Upgraded,
        session: Box<Session>,
        outbound: Option<Box<Session>>,
    ) -> Relay {
        let config = &runtime.config;
        let inbound_max = transport_max(&config.limits);
        let outbound_max = config
            .outbound
            .as_ref()
            .map_or(crate::config::websocket::DEFAULT_MAX_MESSAGE, transport_max);
        // Only the classifier reads a client message's payload; nothing reads the upstream's.
        let classify = !config.classifier.is_empty();
        Relay {
            io: [TokioIo::new(client), TokioIo::new(upstream)],
            inbound: [
                Inbound::new(true, inbound_max, classify),
                Inbound::new(false, outbound_max, false),
            ],
            session,
            outbound,
            queues: [Queue::default(), Queue::default()],
            wakers: [SideWaker::new(), SideWaker::new()],
        }
    }
}

/// The relay's bound on a message: one byte over the limiter's maximum, so that
/// the limiter sees (and counts) the first oversized size; without a maximum, the default.
fn transport_max(limits: &flowgate::ws::WsPolicy) -> usize {
    match limits.max_message_size {
        Some(max) if !limits.dry_run.contains(&flowgate::ws::Scope::Size) => max.saturating_add(1),
        Some(max) => max
            .saturating_add(1)
            .max(crate::config::websocket::DEFAULT_MAX_MESSAGE),
        None => crate::config::websocket::DEFAULT_MAX_MESSAGE,
    }
}

/// What woke the relay.
enum Event {
    /// A message (or the end, or an error) from a side; its bytes are in the side's
    /// [`Inbound`].
    Read(Side, Option<Result<frames::Message, ReadError>>),
    /// Writing to a side failed.
    WriteFailed(Side),
    /// The gateway is stopping.
    Shutdown,
    /// No message for `idle_timeout`.
    Idle,
}

/// How the relay ends for one side.
enum End {
    /// Send it this close frame (its bytes), then wait for its own.
    Send(Vec<u8>),
    /// It sent a close frame: send it this answer, and that is the end.
    Answer(Vec<u8>),
    /// It is gone (the connection broke).
    Gone,
}

/// How the relay ends: `[client, upstream]`.
struct Ending {
    to_client: End,
    to_upstream: End,
}

impl Ending {
    /// How it ends for `side`, and for the other side.
    fn new(side: Side, to_side: End, to_other: End) -> Self {
        let (to_client, to_upstream) = match side {
            Side::Client => (to_side, to_other),
            Side::Upstream => (to_other, to_side),
        };
        Ending {
            to_client,
            to_upstream,
        }
    }

    /// The same close code and reason to both sides.
    fn both(code: u16, reason: &str) -> Self {
        Ending {
            to_client: End::Send(close_frame(Side::Client, code, reason)),
            to_upstream: End::Send(close_frame(Side::Upstream, code, reason)),
        }
    }
}

/// A frame the gateway sends `to` a side: masked towards the upstream (the gateway is its
/// client), not towards the client.
fn own_frame(to: Side, opcode: OpCode, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 14);
    frames::encode(&mut out, opcode, payload, to == Side::Upstream);
    out
}

/// A close frame the gateway sends `to` a side.
fn close_frame(to: Side, code: u16, reason: &str) -> Vec<u8> {
    own_frame(
        to,
        OpCode::Control(Control::Close),
        &frames::close_payload(code, reason),
    )
}

/// Relays until one side closes, a verdict closes, a timeout or shutdown; then closes both
/// sides. The sessions are dropped on return, whatever the path.
pub(super) async fn run(mut relay: Relay, gateway: &WsGateway, runtime: &Runtime) {
    let config = &runtime.config;
    let store = gateway.service().backend().store();
    let mut stopping = gateway.stopping();
    // Seen by a look at its version, between polls of `shutdown` (below).
    let stop_signal = gateway.stopping();
    let mut shutdown = Box::pin(async move {
        let _ = stopping.wait_for(|stop| *stop).await;
    });
    // The waker `shutdown` and `idle_timer` were last polled with. Both keep it while pending,
    // so while the task's waker stays the same (it does: one task relays the connection) they
    // are polled again only when they may be ready — a poll costs a lock (the watch channel's
    // waiter list) or a timer-entry registration, on every message otherwise (~1,000
    // instructions per relayed round trip, callgrind).
    let mut registered: Option<std::task::Waker> = None;
    let idle = config.idle_timeout;
    // The timer is re-armed only when it fires (a message only records the time): resetting
    // a timer on every message would cost more than the limiter's whole decision.
    let mut idle_timer: Pin<Box<Sleep>> = Box::pin(tokio::time::sleep(idle));
    let mut last_message = Instant::now();
    let (cap_messages, cap_bytes) = (config.buffer_messages, config.buffer_bytes);
    let policy = config.slow_reader;
    let mut turn = false;
    let mut paused = [false; 2];
    let ending = loop {
        let event = poll_fn(|cx| {
            let Relay {
                io,
                inbound,
                queues,
                wakers,
                ..
            } = &mut relay;
            let [client, upstream] = io;
            let [to_client, to_upstream] = queues;
            // Each socket is polled with its side's waker (reads and writes), which wakes this
            // task and marks the side.
            for waker in wakers.iter() {
                waker.wake.task.register(cx.waker());
            }
            let mut contexts = [
                Context::from_waker(&wakers[Side::Client as usize].waker),
                Context::from_waker(&wakers[Side::Upstream as usize].waker),
            ];
            if to_client.drive(client, &mut contexts[0]).is_err() {
                return Poll::Ready(Event::WriteFailed(Side::Client));
            }
            if to_upstream.drive(upstream, &mut contexts[1]).is_err() {
                return Poll::Ready(Event::WriteFailed(Side::Upstream));
            }
            let fresh = registered
                .as_ref()
                .is_none_or(|waker| !waker.will_wake(cx.waker()));
            if (fresh || stop_signal.has_changed().unwrap_or(true))
                && shutdown.as_mut().poll(cx).is_ready()
            {
                return Poll::Ready(Event::Shutdown);
            }
            if fresh || idle_timer.is_elapsed() {
                while idle_timer.as_mut().poll(cx).is_ready() {
                    let deadline = last_message + idle;
                    if deadline <= Instant::now() {
                        return Poll::Ready(Event::Idle);
                    }
                    idle_timer.as_mut().reset(deadline);
                }
            }
            if fresh {
                registered = Some(cx.waker().clone());
            }
            turn = !turn;
            let order = if turn {
                [Side::Client, Side::Upstream]
            } else {
                [Side::Upstream, Side::Client]
            };
            for side in order {
                // Reading from a side fills the other side's queue.
                let (socket, target) = match side {
                    Side::Client => (&mut *client, &*to_upstream),
                    Side::Upstream => (&mut *upstream, &*to_client),
                };
                let reader = &mut inbound[side as usize];
                let full = target.full(cap_messages, cap_bytes);
                if full && policy == SlowReader::Pause {
                    if !paused[side as usize] {
                        paused[side as usize] = true;
                        gateway.slow.paused[side as usize].fetch_add(1, Ordering::Relaxed);
                    }
                    continue;
                }
                paused[side as usize] = false;
                // A side without news since its last read found nothing has nothing yet: its
                // socket's waker is registered and will mark it.
                let waker = &wakers[side as usize];
                if !waker.take_news() {
                    continue;
                }
                if let Poll::Ready(read) = reader.poll_message(socket, &mut contexts[side as usize])
                {
                    waker.keep_news();
                    return Poll::Ready(Event::Read(side, read));
                }
            }
            Poll::Pending
        })
        .await;
        let (side, read) = match event {
            Event::Read(side, read) => (side, read),
            Event::WriteFailed(Side::Client) => {
                relay.session.closed_by_transport(1001);
                break Ending {
                    to_client: End::Gone,
                    to_upstream: End::Send(close_frame(Side::Upstream, 1001, "client went away")),
                };
            }
            Event::WriteFailed(Side::Upstream) => {
                relay
                    .session
                    .closed_by_transport(close_code::INTERNAL_ERROR);
                break Ending {
                    to_client: End::Send(close_frame(
                        Side::Client,
                        close_code::INTERNAL_ERROR,
                        "upstream failed",
                    )),
                    to_upstream: End::Gone,
                };
            }
            Event::Shutdown => {
                relay.session.closed_by_transport(1001);
                break Ending::both(1001, "server shutting down");
            }
            Event::Idle => {
                relay.session.closed_by_transport(1001);
                break Ending::both(1001, "idle timeout");
            }
        };
        let message = match read {
            Some(Ok(message)) => message,
            None => {
                relay.session.closed_by_transport(1001);
                break gone(side, 1001, "peer went away");
            }
            Some(Err(error)) => {
                let (code, reason) = match error {
                    ReadError::TooBig => (close_code::MESSAGE_TOO_BIG, "message too big"),
                    ReadError::Utf8 => (1007, "invalid UTF-8"),
                    ReadError::Protocol(why) => {
                        tracing::debug!(?side, "protocol error: {why}");
                        (1002, "protocol error")
                    }
                    ReadError::Io(e) => {
                        tracing::debug!(?side, "reading failed: {e}");
                        relay.session.closed_by_transport(1001);
                        break gone(side, 1001, "peer went away");
                    }
                };
                let session = match side {
                    Side::Client => &relay.session,
                    Side::Upstream => relay.outbound.as_deref().unwrap_or(&relay.session),
                };
                session.closed_by_transport(code);
                break Ending::new(
                    side,
                    End::Send(close_frame(side, code, reason)),
                    End::Send(close_frame(side.other(), 1001, "peer closed")),
                );
            }
        };
        last_message = Instant::now();
        let reader = &relay.inbound[side as usize];
        let payload = match message.kind {
            Kind::Text | Kind::Binary => Some(reader.payload()),
            Kind::Close => {
                // Passed on as it came; answered with its own code and reason (RFC 6455
                // §5.5.1), or with none when it had none.
                let answer = reader
                    .close()
                    .map(|(code, reason)| frames::close_payload(code, reason))
                    .unwrap_or_default();
                break Ending::new(
                    side,
                    End::Answer(own_frame(side, OpCode::Control(Control::Close), &answer)),
                    End::Send(reader.frames().to_vec()),
                );
            }
            // Ping and pong pass through unjudged; the other side answers pings.
            Kind::Ping | Kind::Pong => None,
        };
        let verdict = match (payload, side) {
            (None, _) => Action::Forward,
            (Some(payload), Side::Client) => {
                let classified = runtime.config.classifier.classify(payload);
                let judged: MessageInfo<'_> = classified.message(message.size);
                match relay.session.check_local(&judged) {
                    Checked::Decided(action) => action,
                    // Boxed: the store's future lives only while a message is judged, and an
                    // idle connection should not carry its space (see `docs/service.md`,
                    // memory).
                    Checked::AskStore(pending) => {
                        Box::pin(relay.session.check_store(store, &judged, pending)).await
                    }
                }
            }
            (Some(_), Side::Upstream) => match relay.outbound.as_deref_mut() {
                None => Action::Forward,
                Some(outbound) => {
                    Box::pin(outbound.check(store, &MessageInfo::new(message.size))).await
                }
            },
        };
        match verdict {
            Action::Forward => {
                let frames = relay.inbound[side as usize].frames();
                let target = &mut relay.queues[side.other() as usize];
                if target.full(cap_messages, cap_bytes) {
                    match policy {
                        // Pause: reading stopped before the queue could overflow, except for
                        // the one message read as it filled.
                        SlowReader::Pause => target.push(frames),
                        SlowReader::Drop => {
                            gateway.slow.dropped[side as usize].fetch_add(1, Ordering::Relaxed);
                        }
                        SlowReader::Close => {
                            gateway.slow.closed[side as usize].fetch_add(1, Ordering::Relaxed);
                            relay
                                .session
                                .closed_by_transport(close_code::TRY_AGAIN_LATER);
                            break Ending::both(close_code::TRY_AGAIN_LATER, "cannot keep up");
                        }
                    }
                } else {
                    target.push(frames);
                }
            }
            Action::Reject(rejection) if side == Side::Client => {
                let text = runtime.limiter.error_frame(&rejection);
                let to_client = &mut relay.queues[Side::Client as usize];
                // An error frame that does not fit is dropped: the buffer stays bounded.
                if !to_client.full(cap_messages, cap_bytes) {
                    to_client.push(&own_frame(
                        Side::Client,
                        OpCode::Data(Data::Text),
                        text.as_bytes(),
                    ));
                }
            }
            Action::Close(close) => break Ending::both(close.code, &close.reason),
            // An upstream message over the outbound limits is dropped (counted); a verdict
            // this gateway does not know is not forwarded either.
            _ => {}
        }
    };
    Box::pin(finish(relay, ending)).await;
}

/// `side` is gone without a close frame: close the other one with `code`.
fn gone(side: Side, code: u16, reason: &str) -> Ending {
    Ending::new(
        side,
        End::Gone,
        End::Send(close_frame(side.other(), code, reason)),
    )
}

/// Sends each side its close frame after what was queued for it, and waits (at most
/// [`CLOSE_TIMEOUT`]) for the frames to be written and for each peer to close; then drops
/// everything.
async fn finish(relay: Relay, ending: Ending) {
    let Relay {
        mut io,
        mut inbound,
        mut queues,
        session,
        outbound,
        wakers: _,
    } = relay;
    // The limiters' state is released now; the close handshake needs none of it.
    drop((session, outbound));
    // Per side: still open, and waiting for its close frame.
    let mut open = [true; 2];
    let mut awaiting = [true; 2];
    for (i, end) in [ending.to_client, ending.to_upstream]
        .into_iter()
        .enumerate()
    {
        match end {
            End::Send(close) => queues[i].push(&close),
            End::Answer(close) => {
                // Nothing else is sent to a side that closed; its close is answered.
                queues[i] = Queue::default();
                queues[i].push(&close);
                awaiting[i] = false;
            }
            End::Gone => open[i] = false,
        }
    }
    let closing = poll_fn(|cx| {
        for i in 0..2 {
            if !open[i] {
                continue;
            }
            if queues[i].drive(&mut io[i], cx).is_err() {
                open[i] = false;
                continue;
            }
            if !queues[i].done() {
                continue;
            }
            if !awaiting[i] {
                open[i] = false;
                continue;
            }
            // Read (and discard) until the peer answers the close: closing a socket with
            // unread data would reset it and could lose the close frame.
            loop {
                match inbound[i].poll_message(&mut io[i], cx) {
                    Poll::Ready(Some(Ok(message))) if message.kind != Kind::Close => continue,
                    Poll::Ready(_) => {
                        open[i] = false;
                        break;
                    }
                    Poll::Pending => break,
                }
            }
        }
        if open.iter().any(|o| *o) {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    });
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, closing).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts the wake-ups of the task it stands for.
    #[derive(Default)]
    struct Task(std::sync::atomic::AtomicUsize);

    impl Wake for Task {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_side_is_read_first_then_only_after_its_socket_woke_it() {
        let task = Arc::new(Task::default());
        let task_waker = Waker::from(task.clone());
        let side = SideWaker::new();
        side.wake.task.register(&task_waker);
        // Read once at the start.
        assert!(side.take_news());
        assert!(!side.take_news());
        // A read that returned a message: read again without a wake-up.
        side.keep_news();
        assert!(side.take_news());
        assert!(!side.take_news());
        // The socket wakes the side's waker: the task is woken and the side has news.
        side.waker.wake_by_ref();
        assert_eq!(task.0.load(Ordering::SeqCst), 1);
        assert!(side.take_news());
        // Woken again before the task registered again (the waker was taken by the first
        // wake-up): the news is kept, and the next registration is woken by the next one.
        side.waker.wake_by_ref();
        assert!(side.take_news());
        side.wake.task.register(&task_waker);
        // Waking by value (a waker given away) does the same.
        Waker::from(side.wake.clone()).wake();
        assert_eq!(task.0.load(Ordering::SeqCst), 2);
        assert!(side.take_news());
        assert!(!side.take_news());
    }
}
