//! WebSocket frames as the gateway relays them: each side's bytes are cut into messages at
//! frame boundaries (RFC 6455 §5), checked, and passed on as they came — a client's frames
//! stay masked towards the upstream (which needs them masked), the upstream's stay unmasked
//! towards the client. Nothing is decoded into a message and encoded again: the limits need a
//! message's kind and size, and its payload only when the classifier reads it. Frame headers
//! are parsed by tungstenite ([`FrameHeader::parse`]).
//!
//! Text is not checked for UTF-8 on the way (nginx does not either): the endpoint that reads
//! it must (RFC 6455 §8.1), and a close frame's reason, which the gateway reads, is.

use std::io::{self, Cursor};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, BytesMut};
use tokio::io::AsyncRead;
use tokio_tungstenite::tungstenite::protocol::frame::FrameHeader;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{CloseCode, Control, Data, OpCode};

/// How much a read asks for at least. An idle connection keeps this much per side.
const READ_CHUNK: usize = 1024;

/// Frame headers a fragmented message may carry beside its payload (a 14-byte header each):
/// its frames are held until the last one, so empty fragments without end must not grow them
/// without bound. About 1,000 fragments; a message in more is refused as too big.
const FRAGMENT_HEADERS: usize = 16 * 1024;

/// The most buffer memory a side keeps between messages: a buffer grown past it by a large
/// message is let go once that message is done with (idle connections stay small).
const KEPT: usize = 16 * 1024;

/// What a message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A text message.
    Text,
    /// A binary message.
    Binary,
    /// A ping.
    Ping,
    /// A pong.
    Pong,
    /// A close frame.
    Close,
}

/// A whole message read from a side. Its frames' bytes ([`Inbound::frames`]) and, when kept,
/// its payload ([`Inbound::payload`]) stay readable until the next read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message {
    /// What it is.
    pub kind: Kind,
    /// Its payload's size, over all its frames.
    pub size: usize,
}

/// Why a side's messages cannot be read.
#[derive(Debug)]
pub enum ReadError {
    /// A frame breaks RFC 6455 (the reason, for logs and tests).
    Protocol(&'static str),
    /// A close frame's reason is not UTF-8.
    Utf8,
    /// A message is larger than the side's maximum.
    TooBig,
    /// The connection failed.
    Io(io::Error),
}

/// A fragmented data message, until its last frame.
#[derive(Debug)]
struct Fragments {
    /// Text or binary.
    kind: Kind,
    /// The frames' bytes so far, as they came.
    frames: Vec<u8>,
    /// Their payloads' size.
    size: usize,
}

/// Where the bytes of the message last returned are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    /// Nothing returned, or already released.
    Nothing,
    /// The first `n` bytes of the read buffer: one frame.
    Buffer(usize),
    /// The fragments, complete.
    Fragments,
}

/// One side's incoming bytes, cut into messages.
#[derive(Debug)]
pub struct Inbound {
    /// Bytes read and not yet returned.
    buffer: BytesMut,
    /// Whether this side's frames are masked (a client's must be; an upstream's must not).
    masked: bool,
    /// The largest message payload this side may send.
    max_message: usize,
    /// Whether data messages' payloads are unmasked into `payload` (the classifier reads them).
    keep_payload: bool,
    /// A fragmented message in progress.
    fragments: Option<Fragments>,
    /// The message last returned.
    held: Held,
    /// The current data message's payload, unmasked, when kept.
    payload: Vec<u8>,
    /// Whether the message last returned is a data message (`payload` is its payload).
    data_returned: bool,
    /// The last close frame's payload, unmasked.
    close: Vec<u8>,
    /// How many bytes the frame being read needs in the buffer.
    need: usize,
    /// Whether the buffer was grown past [`KEPT`] for a large frame.
    grown: bool,
}

impl Inbound {
    /// A side's reader: `masked` for the client's side; messages up to `max_message` bytes;
    /// `keep_payload` when data payloads must be readable.
    pub fn new(masked: bool, max_message: usize, keep_payload: bool) -> Self {
        Inbound {
            buffer: BytesMut::new(),
            masked,
            max_message,
            keep_payload,
            fragments: None,
            held: Held::Nothing,
            payload: Vec::new(),
            data_returned: false,
            close: Vec::new(),
            need: 0,
            grown: false,
        }
    }

    /// The next whole message: `None` when the connection ended (EOF).
    pub fn poll_message<R: AsyncRead + Unpin>(
        &mut self,
        io: &mut R,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Message, ReadError>>> {
        self.release();
        loop {
            match self.next() {
                Ok(Some(message)) => return Poll::Ready(Some(Ok(message))),
                Err(e) => return Poll::Ready(Some(Err(e))),
                Ok(None) => {}
            }
            let room = self.need.saturating_sub(self.buffer.len()).max(READ_CHUNK);
            self.grown |= room > KEPT;
            self.buffer.reserve(room);
            match ready!(tokio_util::io::poll_read_buf(
                Pin::new(&mut *io),
                cx,
                &mut self.buffer
            )) {
                Ok(0) => return Poll::Ready(None),
                Ok(_) => {}
                Err(e) => return Poll::Ready(Some(Err(ReadError::Io(e)))),
            }
        }
    }

    /// The bytes of the message last returned, as they came: one frame, or all of a
    /// fragmented message's frames (control frames sent between them are returned apart).
    pub fn frames(&self) -> &[u8] {
        match self.held {
            Held::Nothing => &[],
            Held::Buffer(n) => &self.buffer[..n],
            Held::Fragments => self.fragments.as_ref().map_or(&[], |f| &f.frames),
        }
    }

    /// The payload of the data message last returned, unmasked; empty unless payloads are
    /// kept, or when the message last returned is a control frame.
    pub fn payload(&self) -> &[u8] {
        if self.data_returned {
            &self.payload
        } else {
            &[]
        }
    }

    /// The code and reason of the close frame last returned (`None`: it had no payload).
    pub fn close(&self) -> Option<(u16, &str)> {
        let (code, reason) = self.close.split_first_chunk::<2>()?;
        // Checked when the frame was read.
        Some((
            u16::from_be_bytes(*code),
            std::str::from_utf8(reason).unwrap_or(""),
        ))
    }

    /// Lets the buffer go of the message last returned.
    fn release(&mut self) {
        self.data_returned = false;
        match std::mem::replace(&mut self.held, Held::Nothing) {
            Held::Nothing => {}
            Held::Buffer(n) => self.buffer.advance(n),
            Held::Fragments => self.fragments = None,
        }
        if self.grown && self.buffer.is_empty() {
            // `capacity` would not tell: it counts from where the last message ended.
            self.buffer = BytesMut::new();
            self.grown = false;
        }
        if self.fragments.is_none() && self.payload.capacity() > KEPT {
            self.payload = Vec::new();
        }
    }

    /// The next message in the buffer, if it is all there.
    fn next(&mut self) -> Result<Option<Message>, ReadError> {
        loop {
            let mut cursor = Cursor::new(&self.buffer[..]);
            let Some((header, length)) = FrameHeader::parse(&mut cursor)
                .map_err(|_| ReadError::Protocol("unreadable frame header"))?
            else {
                self.need = 0;
                return Ok(None);
            };
            let head = cursor.position() as usize;
            if header.rsv1 || header.rsv2 || header.rsv3 {
                return Err(ReadError::Protocol(
                    "reserved bits set (no extension agreed)",
                ));
            }
            if header.mask.is_some() != self.masked {
                return Err(ReadError::Protocol(if self.masked {
                    "unmasked frame from a client"
                } else {
                    "masked frame from a server"
                }));
            }
            let size = usize::try_from(length).map_err(|_| ReadError::TooBig)?;
            let kind = match header.opcode {
                OpCode::Control(control) => {
                    if !header.is_final || size > 125 {
                        return Err(ReadError::Protocol(
                            "control frame fragmented or over 125 bytes",
                        ));
                    }
                    match control {
                        Control::Close => Kind::Close,
                        Control::Ping => Kind::Ping,
                        Control::Pong => Kind::Pong,
                        Control::Reserved(_) => {
                            return Err(ReadError::Protocol("reserved control opcode"));
                        }
                    }
                }
                OpCode::Data(data) => {
                    let kind = match data {
                        Data::Text => Kind::Text,
                        Data::Binary => Kind::Binary,
                        Data::Continue => match &self.fragments {
                            Some(fragments) => fragments.kind,
                            None => {
                                return Err(ReadError::Protocol(
                                    "continuation frame outside a message",
                                ));
                            }
                        },
                        Data::Reserved(_) => {
                            return Err(ReadError::Protocol("reserved data opcode"));
                        }
                    };
                    if data != Data::Continue && self.fragments.is_some() {
                        return Err(ReadError::Protocol("new message inside a fragmented one"));
                    }
                    let (before, held) = self
                        .fragments
                        .as_ref()
                        .map_or((0, 0), |f| (f.size, f.frames.len()));
                    if before.saturating_add(size) > self.max_message
                        || held.saturating_add(head + size)
                            > self.max_message.saturating_add(FRAGMENT_HEADERS)
                    {
                        return Err(ReadError::TooBig);
                    }
                    kind
                }
            };
            let end = head + size;
            if self.buffer.len() < end {
                self.need = end;
                return Ok(None);
            }
            self.need = 0;
            let mask = header.mask;
            let data = !matches!(kind, Kind::Close | Kind::Ping | Kind::Pong);
            if kind == Kind::Close {
                self.close.clear();
                self.close.extend_from_slice(&self.buffer[head..end]);
                unmask(&mut self.close, mask);
                check_close(&self.close)?;
            } else if data && self.keep_payload {
                if self.fragments.is_none() {
                    self.payload.clear();
                }
                let from = self.payload.len();
                self.payload.extend_from_slice(&self.buffer[head..end]);
                unmask(&mut self.payload[from..], mask);
            }
            if !data || (header.is_final && self.fragments.is_none()) {
                self.data_returned = data;
                self.held = Held::Buffer(end);
                return Ok(Some(Message { kind, size }));
            }
            let fragments = self.fragments.get_or_insert_with(|| Fragments {
                kind,
                frames: Vec::new(),
                size: 0,
            });
            fragments.frames.extend_from_slice(&self.buffer[..end]);
            fragments.size += size;
            self.buffer.advance(end);
            if header.is_final {
                self.data_returned = true;
                self.held = Held::Fragments;
                return Ok(Some(Message {
                    kind,
                    size: fragments.size,
                }));
            }
        }
    }
}

/// Checks a close frame's payload (unmasked): empty, or a code a peer may send and a UTF-8
/// reason (RFC 6455 §5.5.1, §7.4).
fn check_close(payload: &[u8]) -> Result<(), ReadError> {
    if payload.is_empty() {
        return Ok(());
    }
    let Some((code, reason)) = payload.split_first_chunk::<2>() else {
        return Err(ReadError::Protocol("one-byte close frame"));
    };
    if !CloseCode::from(u16::from_be_bytes(*code)).is_allowed() {
        return Err(ReadError::Protocol("close code a peer may not send"));
    }
    std::str::from_utf8(reason).map_err(|_| ReadError::Utf8)?;
    Ok(())
}

/// XORs `bytes` with `mask` (RFC 6455 §5.3): masks and unmasks alike.
fn unmask(bytes: &mut [u8], mask: Option<[u8; 4]>) {
    if let Some(mask) = mask {
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte ^= mask[i & 3];
        }
    }
}

/// Appends one whole frame the gateway sends itself: `masked` towards the upstream (a client's
/// frames must be, with a fresh key each), unmasked towards the client.
pub fn encode(out: &mut Vec<u8>, opcode: OpCode, payload: &[u8], masked: bool) {
    let header = FrameHeader {
        is_final: true,
        opcode,
        mask: masked.then(rand::random::<[u8; 4]>),
        ..FrameHeader::default()
    };
    // Writing to a `Vec` cannot fail.
    let _ = header.format(payload.len() as u64, out);
    let from = out.len();
    out.extend_from_slice(payload);
    unmask(&mut out[from..], header.mask);
}

/// A close frame's payload: the code, then the reason (cut to fit the 125 bytes of a control
/// frame, at a character boundary).
pub fn close_payload(code: u16, reason: &str) -> Vec<u8> {
    let mut end = reason.len().min(123);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    let mut payload = Vec::with_capacity(2 + end);
    payload.extend_from_slice(&code.to_be_bytes());
    payload.extend_from_slice(&reason.as_bytes()[..end]);
    payload
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowgate_testing::trickle::Trickle;

    /// A frame as a peer would send it.
    fn frame(fin: bool, opcode: u8, payload: &[u8], mask: Option<[u8; 4]>) -> Vec<u8> {
        let mut out = vec![opcode | if fin { 0x80 } else { 0 }];
        let m = if mask.is_some() { 0x80 } else { 0 };
        match payload.len() {
            n @ 0..=125 => out.push(m | n as u8),
            n @ 126..=65535 => {
                out.push(m | 126);
                out.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                out.push(m | 127);
                out.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        let from = out.len() + mask.map_or(0, |_| 4);
        if let Some(mask) = mask {
            out.extend_from_slice(&mask);
        }
        out.extend_from_slice(payload);
        unmask(&mut out[from..], mask);
        out
    }

    const KEY: Option<[u8; 4]> = Some([0x37, 0xfa, 0x21, 0x3d]);

    /// A message read: what it is, its frames' bytes, its payload.
    type Read = (Message, Vec<u8>, Vec<u8>);

    /// Reads every message `input` holds, arriving `chunk` bytes at a time: each with its
    /// frames' bytes and payload, then the error (or `None` at the end).
    fn read_all(
        mut inbound: Inbound,
        input: &[u8],
        chunk: usize,
    ) -> (Vec<Read>, Option<ReadError>) {
        let mut peer = Trickle::new(input, chunk);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut seen = Vec::new();
        loop {
            match inbound.poll_message(&mut peer, &mut cx) {
                Poll::Ready(Some(Ok(message))) => seen.push((
                    message,
                    inbound.frames().to_vec(),
                    inbound.payload().to_vec(),
                )),
                Poll::Ready(Some(Err(e))) => return (seen, Some(e)),
                Poll::Ready(None) => return (seen, None),
                Poll::Pending => unreachable!("a trickle is always ready"),
            }
        }
    }

    #[test]
    fn a_clients_masked_frames_come_out_as_they_came_with_the_payload_unmasked() {
        let mut input = frame(true, 0x1, b"hello", KEY);
        input.extend(frame(true, 0x2, &[0u8, 1, 2, 3, 4, 5, 6], KEY));
        input.extend(frame(true, 0x9, b"ping", KEY));
        for chunk in [1, 3, 1000] {
            let (seen, end) = read_all(Inbound::new(true, 1 << 20, true), &input, chunk);
            assert!(end.is_none(), "chunk {chunk}: {end:?}");
            assert_eq!(seen.len(), 3);
            assert_eq!(
                seen[0].0,
                Message {
                    kind: Kind::Text,
                    size: 5
                }
            );
            assert_eq!(seen[0].1, frame(true, 0x1, b"hello", KEY));
            assert_eq!(seen[0].2, b"hello");
            assert_eq!(seen[1].0.kind, Kind::Binary);
            assert_eq!(seen[1].2, [0u8, 1, 2, 3, 4, 5, 6]);
            assert_eq!(seen[2].0.kind, Kind::Ping);
            assert_eq!(seen[2].1, frame(true, 0x9, b"ping", KEY));
        }
    }

    #[test]
    fn a_fragmented_message_is_returned_whole_and_a_ping_between_its_frames_comes_first() {
        let first = frame(false, 0x1, b"hel", KEY);
        let ping = frame(true, 0x9, b"", KEY);
        let middle = frame(false, 0x0, b"lo ", KEY);
        let last = frame(true, 0x0, b"world", KEY);
        let input = [&first[..], &ping, &middle, &last].concat();
        for chunk in [1, 5, 1000] {
            let (seen, end) = read_all(Inbound::new(true, 1 << 20, true), &input, chunk);
            assert!(end.is_none(), "{end:?}");
            assert_eq!(seen.len(), 2, "chunk {chunk}");
            assert_eq!(seen[0].0.kind, Kind::Ping);
            assert_eq!(seen[0].1, ping);
            assert_eq!(
                seen[1].0,
                Message {
                    kind: Kind::Text,
                    size: 11
                }
            );
            assert_eq!(seen[1].1, [&first[..], &middle, &last].concat());
            assert_eq!(seen[1].2, b"hello world");
        }
    }

    #[test]
    fn payloads_are_not_unmasked_unless_kept_and_an_upstreams_frames_are_unmasked() {
        let input = frame(true, 0x2, &[9; 300], None);
        let (seen, end) = read_all(Inbound::new(false, 1 << 20, false), &input, 7);
        assert!(end.is_none());
        assert_eq!(
            seen[0].0,
            Message {
                kind: Kind::Binary,
                size: 300
            }
        );
        assert_eq!(seen[0].1, input);
        assert!(seen[0].2.is_empty());
    }

    #[test]
    fn a_close_frame_gives_its_code_and_reason() {
        let mut inbound = Inbound::new(true, 1 << 20, false);
        inbound
            .buffer
            .extend_from_slice(&frame(true, 0x8, &close_payload(4000, "bye"), KEY));
        assert_eq!(
            inbound.next().unwrap(),
            Some(Message {
                kind: Kind::Close,
                size: 5
            })
        );
        assert_eq!(inbound.close(), Some((4000, "bye")));
    }

    /// Each breach of RFC 6455 that a peer can commit, and what the reader says of it.
    #[test]
    fn every_broken_frame_is_refused() {
        let too_big = frame(true, 0x2, &[0; 101], KEY);
        let fragments_too_big = [
            frame(false, 0x2, &[0; 60], KEY),
            frame(true, 0x0, &[0; 41], KEY),
        ];
        let cases: Vec<(&str, Vec<u8>, bool)> = vec![
            ("unmasked from a client", frame(true, 0x1, b"x", None), true),
            ("masked from a server", frame(true, 0x1, b"x", KEY), false),
            (
                "reserved bit",
                {
                    let mut f = frame(true, 0x1, b"x", KEY);
                    f[0] |= 0x40;
                    f
                },
                true,
            ),
            ("reserved data opcode", frame(true, 0x3, b"x", KEY), true),
            ("reserved control opcode", frame(true, 0xb, b"", KEY), true),
            ("fragmented ping", frame(false, 0x9, b"", KEY), true),
            ("long ping", frame(true, 0x9, &[0; 126], KEY), true),
            ("continuation first", frame(true, 0x0, b"x", KEY), true),
            (
                "text inside text",
                [frame(false, 0x1, b"a", KEY), frame(true, 0x1, b"b", KEY)].concat(),
                true,
            ),
            ("one-byte close", frame(true, 0x8, &[3], KEY), true),
            (
                "close code 1005",
                frame(true, 0x8, &close_payload(1005, ""), KEY),
                true,
            ),
        ];
        for (name, input, masked) in cases {
            let (seen, end) = read_all(Inbound::new(masked, 100, false), &input, 1000);
            assert!(
                matches!(end, Some(ReadError::Protocol(_))),
                "{name}: {seen:?} {end:?}"
            );
        }
        let mut bad_reason = close_payload(1000, "");
        bad_reason.extend_from_slice(&[0xff, 0xfe]);
        let (_, end) = read_all(
            Inbound::new(true, 100, false),
            &frame(true, 0x8, &bad_reason, KEY),
            1000,
        );
        assert!(matches!(end, Some(ReadError::Utf8)), "{end:?}");
        for input in [too_big, fragments_too_big.concat()] {
            let (seen, end) = read_all(Inbound::new(true, 100, false), &input, 1000);
            assert!(matches!(end, Some(ReadError::TooBig)), "{seen:?} {end:?}");
        }
        // Exactly the maximum passes.
        let (seen, end) = read_all(
            Inbound::new(true, 100, false),
            &frame(true, 0x2, &[0; 100], KEY),
            1000,
        );
        assert!(end.is_none() && seen.len() == 1);
    }

    #[test]
    fn endless_empty_fragments_are_refused_before_their_headers_fill_memory() {
        let mut input = frame(false, 0x2, b"", KEY);
        for _ in 0..4000 {
            input.extend(frame(false, 0x0, b"", KEY));
        }
        let (seen, end) = read_all(Inbound::new(true, 1000, false), &input, 4096);
        assert!(seen.is_empty());
        assert!(matches!(end, Some(ReadError::TooBig)), "{end:?}");
        // A message in a few hundred fragments is fine.
        let mut input = frame(false, 0x2, b"a", KEY);
        for _ in 0..300 {
            input.extend(frame(false, 0x0, b"b", KEY));
        }
        input.extend(frame(true, 0x0, b"c", KEY));
        let (seen, end) = read_all(Inbound::new(true, 1000, false), &input, 4096);
        assert!(end.is_none(), "{end:?}");
        assert_eq!(seen[0].0.size, 302);
    }

    #[test]
    fn an_oversized_frame_is_refused_from_its_header_before_its_payload_is_read() {
        // Only the header arrives: the reader must not wait for 1 MiB it will refuse.
        let mut header = frame(true, 0x2, &[], KEY);
        header[1] = 0x80 | 127;
        header.splice(2..2, (1u64 << 20).to_be_bytes());
        let mut inbound = Inbound::new(true, 1000, false);
        inbound.buffer.extend_from_slice(&header);
        assert!(matches!(inbound.next(), Err(ReadError::TooBig)));
    }

    #[test]
    fn a_large_messages_memory_is_let_go_once_it_is_done_with() {
        let input = frame(true, 0x2, &[7; 100_000], KEY);
        let mut peer = Trickle::new(&input, 1 << 20);
        let mut inbound = Inbound::new(true, 1 << 20, true);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let Poll::Ready(Some(Ok(message))) = inbound.poll_message(&mut peer, &mut cx) else {
            panic!("the message");
        };
        assert_eq!(message.size, 100_000);
        assert!(inbound.buffer.capacity() >= 100_000 && inbound.payload.capacity() >= 100_000);
        // The next read (the end, here) lets the message go, and its memory with it.
        assert!(matches!(
            inbound.poll_message(&mut peer, &mut cx),
            Poll::Ready(None)
        ));
        assert!(inbound.buffer.capacity() <= KEPT + READ_CHUNK);
        assert!(inbound.payload.capacity() <= KEPT);
    }

    #[test]
    fn frames_the_gateway_sends_are_read_back_as_sent() {
        let mut out = Vec::new();
        encode(
            &mut out,
            OpCode::Control(Control::Close),
            &close_payload(1001, "idle timeout"),
            true,
        );
        encode(&mut out, OpCode::Data(Data::Text), b"{\"error\":1}", true);
        let (seen, end) = read_all(Inbound::new(true, 1 << 20, true), &out, 1000);
        assert!(end.is_none());
        assert_eq!(seen[0].0.kind, Kind::Close);
        assert_eq!(seen[1].2, b"{\"error\":1}");
        let mut plain = Vec::new();
        encode(&mut plain, OpCode::Data(Data::Text), b"abc", false);
        assert_eq!(plain, frame(true, 0x1, b"abc", None));
        // A reason that does not fit a control frame is cut at a character boundary.
        let long = "é".repeat(100);
        let payload = close_payload(1000, &long);
        assert!(payload.len() <= 125);
        assert!(std::str::from_utf8(&payload[2..]).is_ok());
    }

    proptest::proptest! {
        /// Any run of valid messages — data messages in up to four fragments with pings
        /// between them, as a client (masked) or an upstream (unmasked) sends them — arriving
        /// in any chunking comes out as the same messages: each whole, its frames' bytes as
        /// they came, its payload as sent.
        #[test]
        fn valid_frames_come_out_as_they_went_in(
            masked: bool,
            messages in proptest::collection::vec(
                (proptest::bool::ANY, proptest::collection::vec(
                    proptest::collection::vec(proptest::num::u8::ANY, 0..300), 1..4), proptest::bool::ANY),
                0..6),
            chunk in 1usize..700,
            key: [u8; 4],
        ) {
            let mask = masked.then_some(key);
            let mut input = Vec::new();
            let mut expected = Vec::new();
            for (text, parts, ping_between) in &messages {
                let mut frames = Vec::new();
                for (i, part) in parts.iter().enumerate() {
                    let opcode = if i > 0 { 0x0 } else if *text { 0x1 } else { 0x2 };
                    let f = frame(i + 1 == parts.len(), opcode, part, mask);
                    input.extend_from_slice(&f);
                    frames.extend_from_slice(&f);
                    if *ping_between && i + 1 < parts.len() {
                        let ping = frame(true, 0x9, b"between", mask);
                        input.extend_from_slice(&ping);
                        expected.push((Message { kind: Kind::Ping, size: 7 }, ping, Vec::new()));
                    }
                }
                let payload = parts.concat();
                let kind = if *text { Kind::Text } else { Kind::Binary };
                expected.push((Message { kind, size: payload.len() }, frames, payload));
            }
            let (seen, end) = read_all(Inbound::new(masked, 1 << 20, true), &input, chunk);
            proptest::prop_assert!(end.is_none(), "{:?}", end);
            proptest::prop_assert_eq!(seen, expected);
        }

        /// Whatever bytes a peer sends, the reader returns messages no larger than its maximum,
        /// then an error or the end — it never panics.
        #[test]
        fn any_bytes_end_in_messages_an_error_or_the_end(
            input in proptest::collection::vec(proptest::num::u8::ANY, 0..2000),
            masked: bool,
            chunk in 1usize..300,
        ) {
            let (seen, _) = read_all(Inbound::new(masked, 200, true), &input, chunk);
            for (message, frames, _) in seen {
                proptest::prop_assert!(message.size <= 200);
                proptest::prop_assert!(frames.len() <= input.len());
            }
        }
    }
}
