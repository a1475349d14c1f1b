//! Usage the upstream reports in its response (LLM tokens), charged to the request's
//! descriptors whose rule has `charge: true`: from a header (`usage_header`, read with the
//! response head) or from a JSON field of the body (`usage_json`, a JSON pointer), read by
//! [`UsageBody`] as the body streams past.
//!
//! The body is never held back: each frame goes on to the client as it came, and the scanner
//! keeps what it needs, bounded:
//!
//! * `application/json` (and `application/*+json`): the body, up to [`MAX_JSON_BODY`],
//!   parsed once it has ended;
//! * `text/event-stream` (server-sent events): the current line and the current event's data,
//!   each up to [`MAX_SSE_EVENT`]; every event whose data is a JSON object is parsed and the
//!   **last** number found at the pointer is the usage — OpenAI-compatible streams with
//!   `stream_options.include_usage` send it in the last event before `data: [DONE]` (the
//!   others carry `"usage": null`), and streams that report a running total in every event are
//!   charged the final one.
//!
//! The usage is charged when the body ends: a chunked body's end (the last chunk) goes on to
//! the client once the charge is taken, so the client's next request already meets it (one
//! store call; no data waits for it); a body of known length is complete for the client at
//! its last byte, which is passed on at once while the charge runs in a task of its own (a
//! request sent at that instant may pass before it lands). A body that breaks off — the upstream fails, or the client goes away — is
//! charged the usage a stream had reported so far (it happened), else nothing; the charge then
//! runs in its own task. A usage that cannot be read (see [`UsageUnread`]) charges nothing and
//! is counted and logged at `warn` with the field's name (never the body).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use flowgate::envoy::Descriptor;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use http_body::{Body, Frame, SizeHint};
use serde_json::Value;

use crate::api::Service;
use crate::metrics::{Api, UsageUnread};

/// The most of a JSON response body kept for reading its usage (256 KiB): a larger body's
/// usage is not read (`too_large`).
pub const MAX_JSON_BODY: usize = 256 * 1024;

/// The most of one server-sent event's data (and of one of its lines) kept for reading its
/// usage (64 KiB): a larger event is skipped (`too_large` if no other event reports usage).
pub const MAX_SSE_EVENT: usize = 64 * 1024;

/// The largest usage charged: 32 bits, as Envoy's `hits_addend`.
const MAX_UNITS: u64 = u32::MAX as u64;

/// What a request with a usage source charges, and where the usage comes from.
#[derive(Debug)]
pub(crate) struct Usage {
    /// `usage_header`: the response header that reports the units used.
    pub(crate) header: Option<HeaderName>,
    /// `usage_json`: the JSON pointer to the units used in the response body.
    pub(crate) json: Option<Arc<str>>,
    /// The descriptors to charge.
    pub(crate) charge: Charge,
}

impl Usage {
    /// Reads the usage when the response head arrives: the header's, charged now (it wins when
    /// the response has it), or a scanner for the body. Reports that cannot be read are
    /// counted; a response that is not a success (`2xx`) and reports nothing is not.
    pub(crate) async fn on_head(self, status: StatusCode, headers: &HeaderMap) -> Option<Scan> {
        let success = status.is_success();
        if let Some(name) = &self.header
            && let Some(value) = headers.get(name)
        {
            match header_units(value) {
                Ok(units) => self.charge.take(units).await,
                Err(reason) => self.charge.unread(reason, name.as_str()),
            }
            return None;
        }
        let Some(pointer) = self.json else {
            if success && let Some(name) = &self.header {
                self.charge.unread(UsageUnread::Missing, name.as_str());
            }
            return None;
        };
        match Scanner::for_response(headers, pointer.clone()) {
            Ok(scanner) => Some(Scan {
                scanner,
                charge: Some(self.charge),
                charging: None,
                success,
            }),
            Err(reason) => {
                if success {
                    self.charge.unread(reason, &pointer);
                }
                None
            }
        }
    }
}

/// The descriptors a request charges, and the service that charges them.
pub(crate) struct Charge {
    /// The store, rules and metrics.
    pub(crate) service: Arc<Service>,
    /// The domain the descriptors are checked against.
    pub(crate) domain: String,
    /// The request's descriptors whose rules charge.
    pub(crate) descriptors: Vec<Descriptor>,
}

impl std::fmt::Debug for Charge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Charge")
            .field("domain", &self.domain)
            .field("descriptors", &self.descriptors)
            .finish_non_exhaustive()
    }
}

impl Charge {
    /// Charges `units` to every descriptor (one store call; nothing for 0). A store error is
    /// counted in the metrics; a charge is always taken, so the answer is not needed.
    pub(crate) async fn take(mut self, units: u64) {
        if units == 0 {
            return;
        }
        for d in &mut self.descriptors {
            d.hits_addend = Some(units);
        }
        let active = self.service.active();
        let _ = self
            .service
            .decide(&active, Api::Gateway, &self.domain, &self.descriptors, 0)
            .await;
    }

    /// Counts and logs a usage report that could not be read from `field`.
    fn unread(&self, reason: UsageUnread, field: &str) {
        self.service.metrics().usage_unread(reason);
        tracing::warn!(
            domain = %self.domain,
            field,
            reason = reason.label(),
            "the upstream's usage could not be read; nothing charged"
        );
    }
}

/// The units a usage header reports: a whole number of at most 32 bits.
fn header_units(value: &HeaderValue) -> Result<u64, UsageUnread> {
    value
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|&n| n <= MAX_UNITS)
        .ok_or(UsageUnread::Invalid)
}

/// The units a JSON value reports: a whole number of at most 32 bits (`12`, not `12.0`,
/// `"12"` or `-1`).
fn json_units(value: &Value) -> Result<u64, UsageUnread> {
    value
        .as_u64()
        .filter(|&n| n <= MAX_UNITS)
        .ok_or(UsageUnread::Invalid)
}

/// Reads the usage from a body as it passes.
#[derive(Debug)]
pub(crate) enum Scanner {
    /// A JSON document.
    Json(JsonScan),
    /// Server-sent events.
    Sse(SseScan),
}

impl Scanner {
    /// The scanner for a response with `headers`, looking for `pointer`; a compressed body,
    /// or one neither JSON nor server-sent events, cannot be read.
    fn for_response(headers: &HeaderMap, pointer: Arc<str>) -> Result<Scanner, UsageUnread> {
        let encoded = headers
            .get_all(http::header::CONTENT_ENCODING)
            .iter()
            .any(|e| !e.as_bytes().eq_ignore_ascii_case(b"identity"));
        if encoded {
            return Err(UsageUnread::Unsupported);
        }
        let mime = headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|t| t.to_str().ok())
            .and_then(|t| t.split(';').next())
            .map(|t| t.trim().to_ascii_lowercase())
            .unwrap_or_default();
        if mime == "text/event-stream" {
            Ok(Scanner::Sse(SseScan::new(pointer)))
        } else if mime == "application/json"
            || (mime.starts_with("application/") && mime.ends_with("+json"))
        {
            let over = headers
                .get(http::header::CONTENT_LENGTH)
                .and_then(|l| l.to_str().ok()?.parse::<usize>().ok())
                .is_some_and(|len| len > MAX_JSON_BODY);
            Ok(Scanner::Json(JsonScan {
                pointer,
                body: Vec::new(),
                over,
            }))
        } else {
            Err(UsageUnread::Unsupported)
        }
    }

    /// Takes in the next piece of the body.
    pub(crate) fn feed(&mut self, data: &[u8]) {
        match self {
            Scanner::Json(json) => json.feed(data),
            Scanner::Sse(sse) => sse.feed(data),
        }
    }

    /// The usage, once the body has ended (`complete`) or broken off.
    pub(crate) fn usage(&self, complete: bool) -> Result<u64, UsageUnread> {
        match self {
            Scanner::Json(_) if !complete => Err(UsageUnread::CutShort),
            Scanner::Json(json) => json.usage(),
            Scanner::Sse(sse) => match sse.found {
                Some(found) => found,
                None if !complete => Err(UsageUnread::CutShort),
                None if sse.skipped => Err(UsageUnread::TooLarge),
                None => Err(UsageUnread::Missing),
            },
        }
    }

    /// The pointer the scanner looks for.
    fn pointer(&self) -> &str {
        match self {
            Scanner::Json(json) => &json.pointer,
            Scanner::Sse(sse) => &sse.pointer,
        }
    }
}

/// A JSON body, kept up to [`MAX_JSON_BODY`].
#[derive(Debug)]
pub(crate) struct JsonScan {
    /// Where the usage is.
    pointer: Arc<str>,
    /// The body so far.
    body: Vec<u8>,
    /// Whether it went past the bound (and was let go).
    over: bool,
}

impl JsonScan {
    /// Keeps `data`, unless the body is past the bound.
    fn feed(&mut self, data: &[u8]) {
        if self.over {
            return;
        }
        if self.body.len() + data.len() > MAX_JSON_BODY {
            self.over = true;
            self.body = Vec::new();
            return;
        }
        self.body.extend_from_slice(data);
    }

    /// The usage of the whole body.
    fn usage(&self) -> Result<u64, UsageUnread> {
        if self.over {
            return Err(UsageUnread::TooLarge);
        }
        let doc: Value = serde_json::from_slice(&self.body).map_err(|_| UsageUnread::Invalid)?;
        match doc.pointer(&self.pointer) {
            None | Some(Value::Null) => Err(UsageUnread::Missing),
            Some(found) => json_units(found),
        }
    }
}

/// Server-sent events (the WHATWG event-stream format: lines ended by LF, CRLF or CR; `data:`
/// lines make an event's data; a blank line ends the event), read one event at a time.
#[derive(Debug)]
pub(crate) struct SseScan {
    /// Where the usage is, in each event's JSON.
    pointer: Arc<str>,
    /// The current line so far.
    line: Vec<u8>,
    /// Whether the current line went past the bound.
    line_over: bool,
    /// The current event's data so far.
    data: Vec<u8>,
    /// Whether the current event went past the bound (it is skipped).
    event_over: bool,
    /// Whether the last piece ended with CR (an LF starting the next one ends no line).
    after_cr: bool,
    /// The last usage an event reported.
    found: Option<Result<u64, UsageUnread>>,
    /// Whether an event was skipped for its size.
    skipped: bool,
}

impl SseScan {
    /// A scanner at the start of a stream.
    fn new(pointer: Arc<str>) -> Self {
        SseScan {
            pointer,
            line: Vec::new(),
            line_over: false,
            data: Vec::new(),
            event_over: false,
            after_cr: false,
            found: None,
            skipped: false,
        }
    }

    /// Reads the next piece of the stream.
    fn feed(&mut self, mut data: &[u8]) {
        if std::mem::take(&mut self.after_cr) && data.first() == Some(&b'\n') {
            data = &data[1..];
        }
        while !data.is_empty() {
            let Some(end) = data.iter().position(|&b| b == b'\n' || b == b'\r') else {
                self.push(data);
                return;
            };
            self.push(&data[..end]);
            let cr = data[end] == b'\r';
            data = &data[end + 1..];
            if cr {
                match data.first() {
                    Some(b'\n') => data = &data[1..],
                    None => self.after_cr = true,
                    Some(_) => {}
                }
            }
            self.end_line();
        }
    }

    /// Adds `part` to the current line, within the bound.
    fn push(&mut self, part: &[u8]) {
        if self.line_over {
            return;
        }
        if self.line.len() + part.len() > MAX_SSE_EVENT {
            self.line_over = true;
            self.line.clear();
            return;
        }
        self.line.extend_from_slice(part);
    }

    /// The current line has ended: a field of the event, or (blank) the event's end.
    fn end_line(&mut self) {
        if std::mem::take(&mut self.line_over) {
            self.event_over = true;
            return;
        }
        if self.line.is_empty() {
            self.dispatch();
            return;
        }
        let line = &self.line;
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(colon) => {
                let value = &line[colon + 1..];
                (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (&line[..], &[][..]),
        };
        // Comments (`: …`, an empty field name) and other fields (`event`, `id`, `retry`)
        // carry no usage.
        if field == b"data" && !self.event_over {
            let joined = self.data.len() + usize::from(!self.data.is_empty()) + value.len();
            if joined > MAX_SSE_EVENT {
                self.event_over = true;
                self.data.clear();
            } else {
                if !self.data.is_empty() {
                    self.data.push(b'\n');
                }
                self.data.extend_from_slice(value);
            }
        }
        self.line.clear();
    }

    /// The event has ended: its usage, if its data is a JSON object that has one.
    fn dispatch(&mut self) {
        if std::mem::take(&mut self.event_over) {
            self.skipped = true;
        } else if self.data.first() == Some(&b'{')
            && let Ok(event) = serde_json::from_slice::<Value>(&self.data)
        {
            match event.pointer(&self.pointer) {
                None | Some(Value::Null) => {}
                Some(found) => self.found = Some(json_units(found)),
            }
        }
        self.data.clear();
    }
}

/// Reading the usage of one response body.
pub(crate) struct Scan {
    /// What reads it.
    scanner: Scanner,
    /// What to charge, until it is charged (or found unreadable).
    charge: Option<Charge>,
    /// The charge under way when the body ended; the end waits for it.
    charging: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    /// Whether the response is a success (`2xx`): only then is a missing usage counted.
    success: bool,
}

impl std::fmt::Debug for Scan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scan")
            .field("scanner", &self.scanner)
            .field("charge", &self.charge)
            .field("charging", &self.charging.is_some())
            .finish()
    }
}

impl Scan {
    /// The charge for the usage read, once the body has ended (`complete`) or broken off;
    /// `None` when there is nothing (more) to charge. An unreadable usage is counted here.
    fn finish(&mut self, complete: bool) -> Option<Pin<Box<dyn Future<Output = ()> + Send>>> {
        let charge = self.charge.take()?;
        match self.scanner.usage(complete) {
            Ok(0) => None,
            Ok(units) => Some(Box::pin(charge.take(units))),
            Err(UsageUnread::Missing) if !self.success => None,
            Err(reason) => {
                charge.unread(reason, self.scanner.pointer());
                None
            }
        }
    }
}

/// A response body that reads the usage it reports as it passes (see the module's docs),
/// every frame passed on unchanged and at once. Without a scan, just `B`.
#[derive(Debug)]
pub struct UsageBody<B> {
    /// The body.
    inner: B,
    /// The usage being read, if any (boxed: most responses have none).
    scan: Option<Box<Scan>>,
}

impl<B: Body> UsageBody<B> {
    /// `inner`, with its usage read by `scan`. A body that has already ended (empty: nobody
    /// will poll it) is read, and charged, now.
    pub(crate) fn new(inner: B, mut scan: Option<Scan>) -> Self {
        if let Some(scan) = &mut scan
            && inner.is_end_stream()
            && let Some(charging) = scan.finish(true)
        {
            spawn(charging);
        }
        UsageBody {
            inner,
            scan: scan.map(Box::new),
        }
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for UsageBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        let Some(scan) = this.scan.as_deref_mut() else {
            return Pin::new(&mut this.inner).poll_frame(cx);
        };
        if let Some(charging) = &mut scan.charging {
            ready!(charging.as_mut().poll(cx));
            scan.charging = None;
            return Poll::Ready(None);
        }
        match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
            Some(Ok(frame)) => {
                if scan.charge.is_some()
                    && let Some(data) = frame.data_ref()
                {
                    scan.scanner.feed(data);
                    // The last frame of a body of known length: hyper stops at its last byte
                    // and never asks for the end, so the charge starts here, in its own task
                    // (the frame does not wait for it).
                    if this.inner.is_end_stream()
                        && let Some(charging) = scan.finish(true)
                    {
                        spawn(charging);
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Some(Err(e)) => {
                if let Some(charging) = scan.finish(false) {
                    spawn(charging);
                }
                Poll::Ready(Some(Err(e)))
            }
            None => {
                let Some(mut charging) = scan.finish(true) else {
                    return Poll::Ready(None);
                };
                if charging.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(None);
                }
                scan.charging = Some(charging);
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        // Not ended while the usage is still to be read or charged: the end is where it is.
        match &self.scan {
            Some(scan) if scan.charge.is_some() || scan.charging.is_some() => false,
            _ => self.inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B> Drop for UsageBody<B> {
    fn drop(&mut self) {
        // Dropped before its end: the client went away (or the connection closed). The usage
        // a stream reported so far happened; it is charged in a task of its own.
        let Some(scan) = self.scan.as_deref_mut() else {
            return;
        };
        if let Some(charging) = scan.charging.take().or_else(|| scan.finish(false)) {
            spawn(charging);
        }
    }
}

/// Runs `charging` in a task of its own (dropped when there is no runtime: the process is
/// ending).
fn spawn(charging: Pin<Box<dyn Future<Output = ()> + Send>>) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(charging);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sse(pieces: &[&[u8]]) -> SseScan {
        let mut scan = SseScan::new("/usage/total_tokens".into());
        for piece in pieces {
            scan.feed(piece);
        }
        scan
    }

    #[test]
    fn server_sent_events_give_the_last_usage_whatever_the_line_ends_and_splits() {
        let stream: &[u8] = b": keep-alive\n\nevent: chunk\ndata: {\"usage\":null,\"x\":1}\n\n\
            data: {\"usage\":{\"total_tokens\":\n data: 7}}\n\n\
            id: 3\r\ndata: {\"usage\":{\"total_tokens\":1234}}\r\n\r\ndata: [DONE]\r\r";
        // Whole, and split at every byte (CR LF across pieces included).
        assert_eq!(sse(&[stream]).found, Some(Ok(1234)));
        for at in 0..stream.len() {
            let (a, b) = stream.split_at(at);
            assert_eq!(sse(&[a, b]).found, Some(Ok(1234)), "split at {at}");
        }
        let each: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(sse(&each).found, Some(Ok(1234)));
        // An event spread over two data lines is joined with a newline (valid JSON here).
        assert_eq!(
            sse(&[b"data: {\"usage\":\ndata: {\"total_tokens\": 5}}\n\n"]).found,
            Some(Ok(5))
        );
        // An event not ended by a blank line is not dispatched.
        assert_eq!(
            sse(&[b"data: {\"usage\":{\"total_tokens\":5}}\n"]).found,
            None
        );
        // A running total: the last one counts.
        assert_eq!(
            sse(&[
                b"data: {\"usage\":{\"total_tokens\":5}}\n\n",
                b"data: {\"usage\":{\"total_tokens\":9}}\n\n"
            ])
            .found,
            Some(Ok(9))
        );
        for bad in [&b"\"12\""[..], b"-1", b"1.5", b"4294967296", b"{}"] {
            let mut event = b"data: {\"usage\":{\"total_tokens\":".to_vec();
            event.extend_from_slice(bad);
            event.extend_from_slice(b"}}\n\n");
            assert_eq!(
                sse(&[&event]).found,
                Some(Err(UsageUnread::Invalid)),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn oversized_events_and_lines_are_skipped_and_memory_stays_bounded() {
        let big = vec![b'x'; MAX_SSE_EVENT + 1];
        let mut scan = SseScan::new("/usage/total_tokens".into());
        scan.feed(b"data: ");
        for piece in big.chunks(1000) {
            scan.feed(piece);
        }
        assert!(scan.line.capacity() <= 2 * MAX_SSE_EVENT);
        scan.feed(b"\n\n");
        assert!(scan.skipped && scan.found.is_none());
        let scanner = Scanner::Sse(scan);
        assert_eq!(scanner.usage(true), Err(UsageUnread::TooLarge));
        // Many data lines, each small, past the bound together.
        let mut scan = SseScan::new("/u".into());
        for _ in 0..(MAX_SSE_EVENT / 100 + 2) {
            scan.feed(&[b"data: ".as_slice(), &[b'y'; 100], b"\n"].concat());
        }
        assert!(scan.data.len() <= MAX_SSE_EVENT);
        scan.feed(b"\ndata: {\"u\": 3}\n\n");
        assert_eq!(scan.found, Some(Ok(3)), "the next event is read");
    }

    #[test]
    fn json_bodies_are_read_whole_within_the_bound() {
        let scan = |pieces: &[&[u8]]| {
            let mut s = JsonScan {
                pointer: "/usage/total_tokens".into(),
                body: Vec::new(),
                over: false,
            };
            for p in pieces {
                s.feed(p);
            }
            s
        };
        assert_eq!(
            scan(&[b"{\"id\":1,\"usage\":{\"total", b"_tokens\": 42}}"]).usage(),
            Ok(42)
        );
        assert_eq!(
            scan(&[b"{\"usage\":{}}"]).usage(),
            Err(UsageUnread::Missing)
        );
        assert_eq!(
            scan(&[b"{\"usage\":null}"]).usage(),
            Err(UsageUnread::Missing)
        );
        assert_eq!(
            scan(&[b"{\"usage\":{\"total_tokens\":\"many\"}}"]).usage(),
            Err(UsageUnread::Invalid)
        );
        assert_eq!(scan(&[b"{\"usage\":"]).usage(), Err(UsageUnread::Invalid));
        let big = vec![b' '; MAX_JSON_BODY];
        let over = scan(&[&big, b"{}"]);
        assert!(over.body.capacity() == 0);
        assert_eq!(over.usage(), Err(UsageUnread::TooLarge));
    }

    #[test]
    fn the_response_type_chooses_the_scanner() {
        let headers = |pairs: &[(&str, &str)]| {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.append(
                    HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    HeaderValue::from_str(v).unwrap(),
                );
            }
            h
        };
        let kind = |pairs: &[(&str, &str)]| {
            Scanner::for_response(&headers(pairs), "/u".into()).map(|s| match s {
                Scanner::Json(j) => {
                    if j.over {
                        "json, too large"
                    } else {
                        "json"
                    }
                }
                Scanner::Sse(_) => "sse",
            })
        };
        assert_eq!(kind(&[("content-type", "application/json")]), Ok("json"));
        assert_eq!(
            kind(&[("content-type", "Application/Problem+JSON; charset=utf-8")]),
            Ok("json")
        );
        assert_eq!(
            kind(&[("content-type", "text/event-stream; charset=utf-8")]),
            Ok("sse")
        );
        assert_eq!(
            kind(&[
                ("content-type", "application/json"),
                ("content-length", "999999999")
            ]),
            Ok("json, too large")
        );
        assert_eq!(
            kind(&[
                ("content-type", "application/json"),
                ("content-encoding", "gzip")
            ]),
            Err(UsageUnread::Unsupported)
        );
        assert_eq!(
            kind(&[("content-type", "text/html")]),
            Err(UsageUnread::Unsupported)
        );
        assert_eq!(kind(&[]), Err(UsageUnread::Unsupported));
        assert_eq!(header_units(&HeaderValue::from_static(" 12 ")), Ok(12));
        assert_eq!(
            header_units(&HeaderValue::from_static("4294967296")),
            Err(UsageUnread::Invalid)
        );
    }
}
