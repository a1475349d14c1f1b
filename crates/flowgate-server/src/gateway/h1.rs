//! HTTP/1.1 towards the upstream (RFC 9112), on `httparse`: the request head written from the
//! parts the gateway forwards, the response head parsed into `http` types, and the response
//! body's framing (§6.3) decoded from the connection's read buffer without copying.
//!
//! Strict where a lenient reading could let one response bleed into the next on a kept-alive
//! connection: differing or malformed `Content-Length` values are an error, a message with
//! both `Transfer-Encoding` and `Content-Length` is read by its chunks and its connection
//! closed afterwards, a body framed by the connection's end is never followed by another
//! response, and a chunk's size line, its closing CRLF and the trailer section are checked.

use std::mem::MaybeUninit;
use std::ops::Range;

use bytes::{Buf, Bytes, BytesMut};
use http::header::TRANSFER_ENCODING;
use http::header::{CONNECTION, CONTENT_LENGTH, HOST, HeaderMap, HeaderName, HeaderValue};
use http::request::Parts;
use http::response;
use http::{Method, StatusCode, Version};
use smallvec::SmallVec;

use super::forward::{Earlier, Hop};

/// The most bytes a response head may take (interim responses included).
pub(crate) const MAX_HEAD: usize = 64 * 1024;
/// The most fields a response head may have.
const MAX_FIELDS: usize = 128;
/// The most bytes a chunk-size line may take (extensions included).
const MAX_CHUNK_LINE: usize = 4 * 1024;
/// The most bytes the trailer section after the last chunk may take.
const MAX_TRAILERS: usize = 16 * 1024;
/// The most trailer fields.
const MAX_TRAILER_FIELDS: usize = 32;

/// How a request's body is framed on the way up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RequestFraming {
    /// No body.
    Empty,
    /// Its `Content-Length` (which the server side already holds the client's body to).
    Length,
    /// Chunked: the client's body has no length the gateway knows.
    Chunked,
}

/// A request head as it goes upstream: written once, and sent again as it is when the
/// pooled connection it went out on turns out closed (see `pool`).
#[derive(Debug)]
pub struct RequestHead {
    /// The request line and fields.
    pub bytes: Vec<u8>,
    /// The method (a response to `HEAD` has no body; only some requests may be replayed).
    pub(crate) method: Method,
    /// How the body that follows is framed.
    pub(crate) framing: RequestFraming,
}

impl RequestHead {
    /// The head of `parts` as the upstream gets it: the target in origin form (`/path?query`:
    /// the upstream is a server, not a proxy), HTTP/1.1, the fields as they are (the
    /// hop-by-hop ones already removed) but for those `hop` writes anew, `host` when the
    /// request has no `Host` (an HTTP/1.0 client's), and the framing of the body that follows:
    /// its `Content-Length` when it has one, chunked when there is a body without one
    /// (`Transfer-Encoding` is hop-by-hop and was removed), else none.
    pub fn write(parts: &Parts, hop: &Hop, host: &HeaderValue, has_body: bool) -> Self {
        let mut out = Vec::with_capacity(HEAD_CAPACITY);
        out.extend_from_slice(parts.method.as_str().as_bytes());
        out.push(b' ');
        match parts.uri.path_and_query().map(|p| p.as_str()) {
            // An absolute-form target with an empty path: the path is `/` (RFC 9112 §3.2.1).
            Some(target) if target.starts_with('?') => {
                out.push(b'/');
                out.extend_from_slice(target.as_bytes());
            }
            Some(target) if !target.is_empty() => out.extend_from_slice(target.as_bytes()),
            _ => out.push(b'/'),
        }
        out.extend_from_slice(b" HTTP/1.1\r\n");
        // One pass over the fields: what the hop's fields and the framing need is noted on
        // the way, not looked up by name afterwards.
        let mut earlier = Earlier::default();
        let mut has_length = false;
        for (name, value) in &parts.headers {
            if earlier.note(name, value) {
                continue;
            }
            has_length |= name == CONTENT_LENGTH;
            write_field(name, &mut out, |out| {
                out.extend_from_slice(value.as_bytes())
            });
        }
        if !earlier.has_host() {
            write_field(&HOST, &mut out, |out| {
                out.extend_from_slice(host.as_bytes())
            });
        }
        for name in Hop::fields() {
            write_field(name, &mut out, |out| {
                hop.write_value(name, &earlier, out);
            });
        }
        let framing = if has_length {
            RequestFraming::Length
        } else if has_body {
            out.extend_from_slice(b"transfer-encoding: chunked\r\n");
            RequestFraming::Chunked
        } else {
            RequestFraming::Empty
        };
        out.extend_from_slice(b"\r\n");
        RequestHead {
            bytes: out,
            method: parts.method.clone(),
            framing,
        }
    }
}

/// Room for a usual request head, so writing one does not grow its buffer.
const HEAD_CAPACITY: usize = 512;

/// Appends the field line `name: value`, the value written by `value`.
fn write_field(name: &HeaderName, out: &mut Vec<u8>, value: impl FnOnce(&mut Vec<u8>)) {
    out.extend_from_slice(name.as_str().as_bytes());
    out.extend_from_slice(b": ");
    value(out);
    out.extend_from_slice(b"\r\n");
}

/// Appends `data` as one chunk (RFC 9112 §7.1); empty data writes nothing (an empty chunk
/// would end the body).
pub(crate) fn write_chunk(data: &[u8], out: &mut Vec<u8>) {
    if data.is_empty() {
        return;
    }
    let mut size = [0u8; 16];
    let mut at = size.len();
    let mut n = data.len();
    while {
        at -= 1;
        size[at] = b"0123456789abcdef"[n & 0xf];
        n >>= 4;
        n != 0
    } {}
    out.extend_from_slice(&size[at..]);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// The last chunk and an empty trailer section.
pub(crate) const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// Why the upstream's message could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum MessageError {
    /// The response head is not HTTP/1.x as RFC 9112 frames it.
    #[error("malformed response head: {0}")]
    Head(httparse::Error),
    /// The response head is larger than [`MAX_HEAD`].
    #[error("response head over {MAX_HEAD} bytes")]
    HeadTooLarge,
    /// A field name or value `http` does not take.
    #[error("malformed response header field")]
    Field,
    /// `Content-Length` is not one decimal length (differing values, or not a number).
    #[error("invalid or conflicting Content-Length")]
    ContentLength,
    /// `101 Switching Protocols`: the gateway forwards no upgrades.
    #[error("unexpected 101 Switching Protocols")]
    Upgrade,
    /// A transfer coding other than `chunked` alone, or one in an HTTP/1.0 response.
    #[error("a transfer coding other than chunked")]
    TransferCoding,
    /// A chunk's size line, its closing CRLF or the trailer section is malformed or too long.
    #[error("malformed chunked body")]
    Chunk,
    /// The connection ended before the body did.
    #[error("the connection closed before the body ended")]
    Truncated,
}

/// A response head, read.
#[derive(Debug)]
pub(crate) struct ResponseHead {
    /// Status, version and fields (values share the bytes read).
    pub(crate) parts: response::Parts,
    /// How its body is framed.
    pub(crate) framing: Framing,
    /// Whether the connection may carry another request once this response has ended.
    pub(crate) keep_alive: bool,
}

/// How a response body is delimited (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// None (a response to `HEAD`, `1xx`, `204`, `304`).
    Empty,
    /// This many bytes.
    Length(u64),
    /// Chunked transfer coding.
    Chunked,
    /// Until the connection closes.
    Close,
}

/// Takes a complete response head out of `buf` (skipping interim `1xx` responses), or `None`
/// while more bytes are needed. `request` is the request's method (a `HEAD` has no body).
pub(crate) fn parse_response(
    buf: &mut BytesMut,
    request: &Method,
) -> Result<Option<ResponseHead>, MessageError> {
    loop {
        if buf.is_empty() {
            return Ok(None);
        }
        // Uninitialised room for the fields: most heads have a handful, and initialising all
        // of them would cost more than the parse.
        let mut room = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_FIELDS];
        let mut head = httparse::Response::new(&mut []);
        let length = match httparse::ParserConfig::default()
            .parse_response_with_uninit_headers(&mut head, buf, &mut room)
            .map_err(MessageError::Head)?
        {
            httparse::Status::Partial if buf.len() > MAX_HEAD => {
                return Err(MessageError::HeadTooLarge);
            }
            httparse::Status::Partial => return Ok(None),
            httparse::Status::Complete(length) if length > MAX_HEAD => {
                return Err(MessageError::HeadTooLarge);
            }
            httparse::Status::Complete(length) => length,
        };
        let code = head.code.unwrap_or_default();
        match code {
            101 => return Err(MessageError::Upgrade),
            100..=199 => {
                buf.advance(length);
                continue;
            }
            _ => {}
        }
        let status =
            StatusCode::from_u16(code).map_err(|_| MessageError::Head(httparse::Error::Status))?;
        let version = match head.version {
            Some(0) => Version::HTTP_10,
            _ => Version::HTTP_11,
        };
        // Names now; values once the head's bytes are frozen, as slices of them. On the
        // stack: a head with more fields than a typical one spills to the heap.
        let start = buf.as_ptr() as usize;
        let mut fields = SmallVec::<[(HeaderName, Range<usize>); 16]>::new();
        // `Content-Length` given as a list or in several fields (passed on as one, below).
        let mut lengths = 0;
        for field in head.headers.iter() {
            let name =
                HeaderName::from_bytes(field.name.as_bytes()).map_err(|_| MessageError::Field)?;
            if name == CONTENT_LENGTH {
                lengths += 1 + usize::from(field.value.contains(&b','));
            }
            // A value is a slice of `buf` (an empty one may point anywhere: it takes none).
            let at = match field.value.is_empty() {
                true => 0,
                false => field.value.as_ptr() as usize - start,
            };
            fields.push((name, at..at + field.value.len()));
        }
        let bytes = buf.split_to(length).freeze();
        let mut headers = HeaderMap::with_capacity(fields.len());
        let mut persistence = Persistence::default();
        for (name, value) in fields.drain(..) {
            if name == CONNECTION && persistence.read(&bytes[value.clone()]) {
                // Only about this connection: not kept (it would be removed as hop-by-hop).
                continue;
            }
            let value = HeaderValue::from_maybe_shared(bytes.slice(value))
                .map_err(|_| MessageError::Field)?;
            headers.append(name, value);
        }
        let (framing, keep_alive) = framing(request, status, version, persistence, &headers)?;
        if let Framing::Length(length) = framing
            && lengths > 1
        {
            // `5, 5` or two fields of `5`: passed on as the one length they agree on.
            headers.insert(CONTENT_LENGTH, HeaderValue::from(length));
        }
        let mut parts = http::Response::new(()).into_parts().0;
        parts.status = status;
        parts.version = version;
        parts.headers = headers;
        return Ok(Some(ResponseHead {
            parts,
            framing,
            keep_alive,
        }));
    }
}

/// The body's framing and whether the connection outlives the response (RFC 9112 §6.3, §9.3).
fn framing(
    request: &Method,
    status: StatusCode,
    version: Version,
    persistence: Persistence,
    headers: &HeaderMap,
) -> Result<(Framing, bool), MessageError> {
    let keep_alive = !persistence.close && (version == Version::HTTP_11 || persistence.keep_alive);
    if request == Method::HEAD
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        return Ok((Framing::Empty, keep_alive));
    }
    let mut codings = headers.get_all(TRANSFER_ENCODING).iter().peekable();
    if codings.peek().is_some() {
        // Only `chunked`, once: `Transfer-Encoding` is hop-by-hop, so another coding (gzip…)
        // could not be passed on labelled, and none is undone here (nginx answers 502 too).
        // From HTTP/1.0 the framing is faulty (RFC 9112 §6.1); with `Content-Length` beside it
        // (a smuggling shape) the connection closes after the response.
        let mut items = codings.flat_map(|value| value.as_bytes().split(|b| *b == b','));
        let chunked = items
            .next()
            .is_some_and(|item| item.trim_ascii().eq_ignore_ascii_case(b"chunked"))
            && items.next().is_none();
        if !chunked || version == Version::HTTP_10 {
            return Err(MessageError::TransferCoding);
        }
        let alone = !headers.contains_key(CONTENT_LENGTH);
        return Ok((Framing::Chunked, keep_alive && alone));
    }
    match content_length(headers)? {
        Some(length) => Ok((Framing::Length(length), keep_alive)),
        None => Ok((Framing::Close, false)),
    }
}

/// The `Content-Length`: every value (comma-separated lists too) one and the same run of
/// digits; `None` when there is none.
fn content_length(headers: &HeaderMap) -> Result<Option<u64>, MessageError> {
    let mut length = None;
    for value in headers.get_all(CONTENT_LENGTH) {
        for item in value.as_bytes().split(|b| *b == b',') {
            let item = item.trim_ascii();
            if item.is_empty() || item.len() > 19 || !item.iter().all(u8::is_ascii_digit) {
                return Err(MessageError::ContentLength);
            }
            let n = item.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
            if length.replace(n).is_some_and(|earlier| earlier != n) {
                return Err(MessageError::ContentLength);
            }
        }
    }
    Ok(length)
}

/// What the response's `Connection` fields say about the connection itself (RFC 9112 §9.3).
#[derive(Debug, Default, Clone, Copy)]
struct Persistence {
    /// `close`: the upstream closes it after this response.
    close: bool,
    /// `keep-alive`: an HTTP/1.0 upstream keeps it.
    keep_alive: bool,
}

impl Persistence {
    /// Reads one `Connection` value; whether it names nothing but `close` and `keep-alive`.
    fn read(&mut self, value: &[u8]) -> bool {
        let mut only_persistence = true;
        for token in value.split(|b| *b == b',') {
            let token = token.trim_ascii();
            if token.eq_ignore_ascii_case(b"close") {
                self.close = true;
            } else if token.eq_ignore_ascii_case(b"keep-alive") {
                self.keep_alive = true;
            } else if !token.is_empty() {
                only_persistence = false;
            }
        }
        only_persistence
    }
}

/// Where a response body's decoding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// This many bytes still to come.
    Length(u64),
    /// A chunk-size line next.
    ChunkSize,
    /// This many bytes of the current chunk still to come.
    ChunkData(u64),
    /// The CRLF closing a chunk next.
    ChunkEnd,
    /// The trailer section after the last chunk next.
    Trailers,
    /// Everything until the connection closes.
    Close,
    /// Ended.
    Done,
}

/// Takes a response body's bytes out of the connection's read buffer as its framing says,
/// without copying them (each piece is a slice of the buffer, frozen).
#[derive(Debug)]
pub(crate) struct Decoder {
    /// Where it is.
    state: State,
}

impl Decoder {
    /// A decoder for a body framed as `framing`.
    pub(crate) fn new(framing: Framing) -> Self {
        let state = match framing {
            Framing::Empty | Framing::Length(0) => State::Done,
            Framing::Length(n) => State::Length(n),
            Framing::Chunked => State::ChunkSize,
            Framing::Close => State::Close,
        };
        Decoder { state }
    }

    /// Whether the body has ended.
    pub(crate) fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// The bytes still to come, when the framing says.
    pub(crate) fn remaining(&self) -> Option<u64> {
        match self.state {
            State::Length(n) => Some(n),
            State::Done => Some(0),
            _ => None,
        }
    }

    /// The next piece of the body out of `buf`; `None` when `buf` holds no more of it (the body
    /// may have ended: see [`Decoder::is_done`]).
    pub(crate) fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Bytes>, MessageError> {
        loop {
            match self.state {
                State::Done => return Ok(None),
                State::Length(n) => return Ok(take(buf, n, &mut self.state, State::Done)),
                State::ChunkData(n) => return Ok(take(buf, n, &mut self.state, State::ChunkEnd)),
                State::Close => return Ok((!buf.is_empty()).then(|| buf.split().freeze())),
                State::ChunkSize => match httparse::parse_chunk_size(buf) {
                    Ok(httparse::Status::Complete((used, size))) => {
                        buf.advance(used);
                        self.state = match size {
                            0 => State::Trailers,
                            size => State::ChunkData(size),
                        };
                    }
                    Ok(httparse::Status::Partial) if buf.len() > MAX_CHUNK_LINE => {
                        return Err(MessageError::Chunk);
                    }
                    Ok(httparse::Status::Partial) => return Ok(None),
                    Err(_) => return Err(MessageError::Chunk),
                },
                State::ChunkEnd => match buf.get(..2) {
                    None if buf.first().is_none_or(|b| *b == b'\r') => return Ok(None),
                    Some(b"\r\n") => {
                        buf.advance(2);
                        self.state = State::ChunkSize;
                    }
                    _ => return Err(MessageError::Chunk),
                },
                State::Trailers => {
                    let mut fields = [httparse::EMPTY_HEADER; MAX_TRAILER_FIELDS];
                    match httparse::parse_headers(buf, &mut fields) {
                        Ok(httparse::Status::Complete((used, _))) => {
                            buf.advance(used);
                            self.state = State::Done;
                        }
                        Ok(httparse::Status::Partial) if buf.len() > MAX_TRAILERS => {
                            return Err(MessageError::Chunk);
                        }
                        Ok(httparse::Status::Partial) => return Ok(None),
                        Err(_) => return Err(MessageError::Chunk),
                    }
                }
            }
        }
    }

    /// The connection has closed: the end of a body framed by it, else a truncated body.
    pub(crate) fn closed(&mut self) -> Result<(), MessageError> {
        match self.state {
            State::Close | State::Done => {
                self.state = State::Done;
                Ok(())
            }
            _ => Err(MessageError::Truncated),
        }
    }
}

/// Up to `n` bytes of `buf`, leaving `state` at the bytes still to come (`then` when none).
fn take(buf: &mut BytesMut, n: u64, state: &mut State, then: State) -> Option<Bytes> {
    if buf.is_empty() {
        return None;
    }
    let k = usize::try_from(n).map_or(buf.len(), |n| n.min(buf.len()));
    let left = n - k as u64;
    *state = match (left, *state) {
        (0, _) => then,
        (left, State::Length(_)) => State::Length(left),
        (left, _) => State::ChunkData(left),
    };
    Some(buf.split_to(k).freeze())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(raw: &str, method: &Method) -> Result<Option<ResponseHead>, MessageError> {
        parse_response(&mut BytesMut::from(raw), method)
    }

    /// Decodes `raw` fed in two pieces split at `at`, then the connection's end when `close`.
    fn decode_split(
        framing: Framing,
        raw: &[u8],
        at: usize,
        close: bool,
    ) -> Result<(Vec<u8>, usize), MessageError> {
        let mut decoder = Decoder::new(framing);
        let mut buf = BytesMut::new();
        let mut body = Vec::new();
        for piece in [&raw[..at], &raw[at..]] {
            buf.extend_from_slice(piece);
            while let Some(data) = decoder.decode(&mut buf)? {
                assert!(!data.is_empty());
                body.extend_from_slice(&data);
            }
        }
        if close && !decoder.is_done() {
            decoder.closed()?;
        }
        assert!(decoder.is_done(), "not done after {raw:?}");
        Ok((body, buf.len()))
    }

    #[test]
    fn a_request_head_is_written_in_origin_form_with_its_framing() {
        let mut request = http::Request::new(());
        *request.method_mut() = Method::POST;
        *request.uri_mut() = "/a/b?c=d".parse().unwrap();
        request
            .headers_mut()
            .insert("host", HeaderValue::from_static("up"));
        request
            .headers_mut()
            .insert("x-forwarded-for", HeaderValue::from_static("6.6.6.6"));
        let (parts, ()) = request.into_parts();
        let hop = Hop::new("192.0.2.1".parse().unwrap(), false);
        let fallback = HeaderValue::from_static("fallback");
        let hop_lines = "x-forwarded-for: 192.0.2.1\r\n\
                         forwarded: for=192.0.2.1;host=\"up\";proto=http\r\n\
                         via: 1.1 flowgate\r\n";
        let head = RequestHead::write(&parts, &hop, &fallback, true);
        assert_eq!(head.framing, RequestFraming::Chunked);
        assert_eq!(head.method, Method::POST);
        assert_eq!(
            String::from_utf8(head.bytes).unwrap(),
            format!(
                "POST /a/b?c=d HTTP/1.1\r\nhost: up\r\n{hop_lines}transfer-encoding: chunked\r\n\r\n"
            )
        );
        let head = RequestHead::write(&parts, &hop, &fallback, false);
        assert_eq!(head.framing, RequestFraming::Empty);
        assert_eq!(
            String::from_utf8(head.bytes).unwrap(),
            format!("POST /a/b?c=d HTTP/1.1\r\nhost: up\r\n{hop_lines}\r\n")
        );
        let mut parts = parts;
        parts
            .headers
            .insert(CONTENT_LENGTH, HeaderValue::from_static("3"));
        let head = RequestHead::write(&parts, &hop, &fallback, true);
        assert_eq!(head.framing, RequestFraming::Length);
        assert!(head.bytes.ends_with(b"content-length: 3\r\nx-forwarded-for: 192.0.2.1\r\nforwarded: for=192.0.2.1;host=\"up\";proto=http\r\nvia: 1.1 flowgate\r\n\r\n"));
        // No `Host` (an HTTP/1.0 client): the upstream's; `Forwarded` names none.
        parts.headers.remove(HOST);
        parts.uri = "http://x".parse().unwrap();
        let head = RequestHead::write(&parts, &hop, &fallback, true);
        let text = String::from_utf8(head.bytes).unwrap();
        assert!(
            text.starts_with(
                "POST / HTTP/1.1\r\ncontent-length: 3\r\nhost: fallback\r\n\
                 x-forwarded-for: 192.0.2.1\r\nforwarded: for=192.0.2.1;proto=http\r\n"
            ),
            "{text}"
        );
        parts.uri = "http://x?y=1".parse().unwrap();
        let head = RequestHead::write(&parts, &hop, &fallback, false);
        assert!(head.bytes.starts_with(b"POST /?y=1 HTTP/1.1\r\n"));
    }

    #[test]
    fn chunks_are_sized_in_hex() {
        let mut out = Vec::new();
        write_chunk(b"", &mut out);
        assert!(out.is_empty());
        write_chunk(&[b'x'; 26], &mut out);
        assert!(out.starts_with(b"1a\r\nxxx"));
        assert!(out.ends_with(b"x\r\n"));
        out.clear();
        write_chunk(&[b'y'; 4096], &mut out);
        assert!(out.starts_with(b"1000\r\n"));
    }

    #[test]
    fn response_heads_give_their_framing_and_keep_alive() {
        let get = Method::GET;
        let h = head(
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-E:\r\nX-A: b\r\n\r\nhello",
            &get,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (h.parts.status, h.framing, h.keep_alive),
            (StatusCode::OK, Framing::Length(5), true)
        );
        assert_eq!(h.parts.headers["x-a"], "b");
        assert_eq!(h.parts.headers["x-e"], "");
        let h = head(
            "HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nConnection: close, X-A\r\nX-A: 1\r\n\r\n",
            &get,
        )
        .unwrap()
        .unwrap();
        // Read and dropped when it is only about the connection; kept when it names a field
        // (the gateway's hop-by-hop removal then removes both).
        assert_eq!(
            h.parts
                .headers
                .get_all(CONNECTION)
                .iter()
                .collect::<Vec<_>>(),
            ["close, X-A"]
        );
        assert!(!h.keep_alive);
        let h = head(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\n",
            &get,
        )
        .unwrap()
        .unwrap();
        assert_eq!((h.framing, h.keep_alive), (Framing::Chunked, true));
        let h = head(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
            &get,
        )
        .unwrap()
        .unwrap();
        assert_eq!((h.framing, h.keep_alive), (Framing::Chunked, false));
        let h = head("HTTP/1.1 200 OK\r\n\r\n", &get).unwrap().unwrap();
        assert_eq!((h.framing, h.keep_alive), (Framing::Close, false));
        let h = head(
            "HTTP/1.1 200 OK\r\nConnection: Close\r\nContent-Length: 0\r\n\r\n",
            &get,
        )
        .unwrap()
        .unwrap();
        assert_eq!((h.framing, h.keep_alive), (Framing::Length(0), false));
        let h = head("HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\n", &get)
            .unwrap()
            .unwrap();
        assert!(!h.keep_alive);
        let h = head(
            "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\n",
            &get,
        )
        .unwrap()
        .unwrap();
        assert!(h.keep_alive);
        let h = head(
            "HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\n",
            &Method::HEAD,
        )
        .unwrap()
        .unwrap();
        assert_eq!((h.framing, h.keep_alive), (Framing::Empty, true));
        for status in ["204 No Content", "304 Not Modified"] {
            let h = head(
                &format!("HTTP/1.1 {status}\r\nContent-Length: 7\r\n\r\n"),
                &get,
            )
            .unwrap()
            .unwrap();
            assert_eq!(h.framing, Framing::Empty);
        }
        let h = head(
            "HTTP/1.1 200 OK\r\nContent-Length: 4, 4\r\nContent-Length: 4\r\n\r\n",
            &get,
        )
        .unwrap()
        .unwrap();
        assert_eq!(h.framing, Framing::Length(4));
        assert_eq!(
            h.parts
                .headers
                .get_all(CONTENT_LENGTH)
                .iter()
                .collect::<Vec<_>>(),
            ["4"]
        );
    }

    #[test]
    fn interim_responses_are_skipped_and_partial_heads_wait() {
        let mut buf = BytesMut::from(
            "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n",
        );
        let h = parse_response(&mut buf, &Method::POST).unwrap().unwrap();
        assert_eq!(h.parts.status, StatusCode::CREATED);
        assert!(buf.is_empty());
        let mut buf = BytesMut::from("HTTP/1.1 200 OK\r\nContent-Le");
        assert!(parse_response(&mut buf, &Method::GET).unwrap().is_none());
        assert_eq!(buf.len(), 27);
    }

    #[test]
    fn malformed_or_ambiguous_heads_are_errors() {
        let get = Method::GET;
        for raw in [
            "HTTP/1.1 abc OK\r\n\r\n",
            "hello\r\n\r\n",
            "HTTP/1.1 200 OK\r\nBad Name: x\r\n\r\n",
            "HTTP/1.1 200 OK\r\nX: a\rb\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 5,\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n",
            "HTTP/1.1 101 Switching Protocols\r\n\r\n",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: identity\r\n\r\n",
            "HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
        ] {
            assert!(head(raw, &get).is_err(), "{raw:?} was accepted");
        }
        let mut big = String::from("HTTP/1.1 200 OK\r\nX: ");
        big.push_str(&"a".repeat(MAX_HEAD));
        assert_eq!(head(&big, &get).unwrap_err(), MessageError::HeadTooLarge);
        big.push_str("\r\nContent-Length: 0\r\n\r\n");
        assert_eq!(head(&big, &get).unwrap_err(), MessageError::HeadTooLarge);
    }

    #[test]
    fn bodies_decode_the_same_however_the_bytes_arrive() {
        let chunked = b"5;ext=1\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\nTrailer: x\r\n\r\n";
        for at in 0..=chunked.len() {
            let (body, left) = decode_split(Framing::Chunked, chunked, at, false).unwrap();
            assert_eq!(
                (body.as_slice(), left),
                (&b"hello world"[..], 0),
                "split at {at}"
            );
        }
        let length = b"hello world";
        for at in 0..=length.len() {
            let (body, left) = decode_split(Framing::Length(11), length, at, false).unwrap();
            assert_eq!((body.as_slice(), left), (&length[..], 0));
        }
        for at in 0..=length.len() {
            let (body, _) = decode_split(Framing::Close, length, at, true).unwrap();
            assert_eq!(body, length);
        }
        // Bytes after the body stay in the buffer (the connection is then not reused).
        let (body, left) = decode_split(Framing::Length(5), b"helloEXTRA", 3, false).unwrap();
        assert_eq!((body.as_slice(), left), (&b"hello"[..], 5));
    }

    /// Mutated messages (bytes flipped, dropped, repeated) never panic the parser or the
    /// decoder, and never make the decoder hand out more bytes than it was given.
    #[test]
    fn mutated_messages_are_read_or_refused_never_panicked_on() {
        let seeds: [&[u8]; 3] = [
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;a=b\r\nhello\r\n0\r\nT: x\r\n\r\n",
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\nhello",
            b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\n\r\nto the end",
        ];
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for round in 0..20_000 {
            let mut message = seeds[round % seeds.len()].to_vec();
            for _ in 0..1 + next() % 4 {
                let at = (next() as usize) % message.len();
                match next() % 3 {
                    0 => message[at] = next() as u8,
                    1 => {
                        message.remove(at);
                    }
                    _ => message.insert(at, message[at]),
                }
                if message.is_empty() {
                    break;
                }
            }
            let given = message.len();
            let mut buf = BytesMut::from(&message[..]);
            let Ok(Some(head)) = parse_response(&mut buf, &Method::GET) else {
                continue;
            };
            let mut decoder = Decoder::new(head.framing);
            let mut body = 0;
            while let Ok(Some(data)) = decoder.decode(&mut buf) {
                body += data.len();
            }
            assert!(body + buf.len() <= given);
            let _ = decoder.closed();
        }
    }

    #[test]
    fn malformed_or_cut_bodies_are_errors() {
        for raw in [
            &b"5\r\nhelloXX0\r\n\r\n"[..],
            b"zz\r\nhello\r\n0\r\n\r\n",
            b"-5\r\nhello\r\n0\r\n\r\n",
            b"ffffffffffffffffff\r\n",
        ] {
            let mut decoder = Decoder::new(Framing::Chunked);
            let mut buf = BytesMut::from(raw);
            let result = (|| {
                while decoder.decode(&mut buf)?.is_some() {}
                Ok::<_, MessageError>(())
            })();
            assert_eq!(result, Err(MessageError::Chunk), "{raw:?}");
        }
        let mut decoder = Decoder::new(Framing::Length(100));
        let mut buf = BytesMut::from(&b"0123456789"[..]);
        assert_eq!(decoder.decode(&mut buf).unwrap().unwrap().len(), 10);
        assert_eq!(decoder.remaining(), Some(90));
        assert_eq!(decoder.closed(), Err(MessageError::Truncated));
        let mut decoder = Decoder::new(Framing::Chunked);
        let mut buf = BytesMut::from(&b"5\r\nhel"[..]);
        decoder.decode(&mut buf).unwrap();
        assert_eq!(decoder.closed(), Err(MessageError::Truncated));
        let mut decoder = Decoder::new(Framing::Chunked);
        let mut buf = BytesMut::from(&[b'1'; MAX_CHUNK_LINE + 1][..]);
        assert_eq!(decoder.decode(&mut buf), Err(MessageError::Chunk));
    }
}
