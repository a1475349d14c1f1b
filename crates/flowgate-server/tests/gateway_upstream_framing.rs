//! How the gateway reads its upstream's HTTP/1.1 messages and frames the requests it sends
//! them — RFC 9112 §6.3 (message body length) and its neighbours, between the gateway and its
//! upstream.
//!
//! Each test puts a raw, scripted upstream behind the gateway: a `TcpListener` on 127.0.0.1:0
//! that reads each request as bytes (head, then the body its framing gives), records it, and
//! writes exact response bytes. A client — hyper's HTTP/1.1 client on one connection, or raw
//! TCP where the bytes matter — asks through the gateway. What is proven:
//!
//! * every way a response body can be delimited (chunked with extensions and trailers,
//!   `Content-Length`, the connection closing, none at all for `HEAD`, 1xx, 204 and 304) is
//!   read to exactly its end: the client gets the exact body, and the upstream connection is
//!   reused when, and only when, the upstream allows it (`Connection: close`, HTTP/1.0 and
//!   close-delimited bodies are not reused);
//! * the same when the response trickles in a byte at a time;
//! * a response whose framing is invalid (conflicting or malformed `Content-Length`,
//!   `Transfer-Encoding` in HTTP/1.0 or with a coding besides `chunked`, an unsolicited `101`,
//!   a malformed head or one over 64 KiB) is a 502 problem and its connection is never
//!   reused — where RFC 9112 also allows a lenient reading (whitespace before a colon,
//!   obs-fold, bare LF), that reading and nothing else; agreeing lengths (`5, 5`) are passed on
//!   as one; one with both `Transfer-Encoding` and `Content-Length` is read as chunked,
//!   forwarded coherently, and its connection closed after it;
//! * bytes after a complete response never answer the next request (no response splitting);
//! * a body cut short, or chunked framing gone wrong mid-body, reaches the client as an error
//!   (no response, a 502, or a body whose framing never completes), never as a whole body;
//! * an early answer to an upload is forwarded without waiting for the upload;
//! * what the upstream receives: origin-form request line, one `Host`, a body framed once and
//!   exactly (none on a body-less GET);
//! * an idle pooled connection the upstream closed is replaced, not a 502.
//!
//! Every wait is bounded by [`WAIT`]; nothing sleeps to synchronise. Which upstream connection
//! a request came on is read from the upstream's own record (connections are numbered in
//! accept order), never assumed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flowgate_testing::server::TestServer;
use flowgate_testing::upstream::{Answer, PASS_ALL, client, gateway, send};
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinSet;

/// The bound on every wait of a test: a step that has not happened by then is a failure.
const WAIT: Duration = flowgate_testing::STEP;

/// How long the upstream waits for the next request on a kept-alive connection before it
/// gives the connection up (longer than any test, so it never closes one a test relies on).
const UPSTREAM_PATIENCE: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------
// HTTP/1.1 off the wire, parsed by hand (just enough, and strictly).
// ---------------------------------------------------------------------------------------------

/// A message head as it came off the wire.
#[derive(Debug, Clone)]
struct Head {
    /// The request line or status line.
    line: String,
    /// The field lines in order, names as sent.
    fields: Vec<(String, String)>,
}

/// How a message's body is delimited (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// No body.
    Empty,
    /// `Content-Length`.
    Length(usize),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Until the connection closes (a response with neither).
    Close,
}

impl Head {
    fn parse(raw: &[u8]) -> io::Result<Head> {
        let text = std::str::from_utf8(raw).map_err(|e| invalid(e.to_string()))?;
        let mut lines = text.split("\r\n");
        let line = lines.next().unwrap_or_default().to_owned();
        let mut fields = Vec::new();
        for field in lines {
            let (name, value) = field
                .split_once(':')
                .ok_or_else(|| invalid(format!("field line {field:?}")))?;
            fields.push((name.to_owned(), value.trim().to_owned()));
        }
        Ok(Head { line, fields })
    }

    /// Every value of the field `name` (any case), in order.
    fn all(&self, name: &str) -> Vec<&str> {
        self.fields
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// The value of `name`, which the message has at most once.
    fn one(&self, name: &str) -> Option<&str> {
        let all = self.all(name);
        assert!(all.len() <= 1, "{name} more than once in {self:?}");
        all.first().copied()
    }

    /// A response's status code.
    fn status(&self) -> u16 {
        self.line
            .split(' ')
            .nth(1)
            .and_then(|code| code.parse().ok())
            .unwrap_or_else(|| panic!("no status in {:?}", self.line))
    }

    /// A request's target.
    fn target(&self) -> &str {
        self.line.split(' ').nth(1).unwrap_or_default()
    }

    /// How this request's body is delimited (a request has none unless it says so).
    fn request_framing(&self) -> Framing {
        self.framing(Framing::Empty)
    }

    /// How this response's body is delimited; `to_head`: it answers a HEAD request.
    fn response_framing(&self, to_head: bool) -> Framing {
        let status = self.status();
        if to_head || (100..200).contains(&status) || status == 204 || status == 304 {
            return Framing::Empty;
        }
        self.framing(Framing::Close)
    }

    fn framing(&self, otherwise: Framing) -> Framing {
        let codings = self.all("transfer-encoding");
        if let Some(last) = codings.last() {
            assert!(
                last.rsplit(',')
                    .next()
                    .unwrap()
                    .trim()
                    .eq_ignore_ascii_case("chunked"),
                "a coding other than chunked last: {self:?}"
            );
            return Framing::Chunked;
        }
        let lengths: Vec<usize> = self
            .all("content-length")
            .iter()
            .flat_map(|value| value.split(','))
            .map(|n| n.trim().parse().unwrap_or_else(|_| panic!("{self:?}")))
            .collect();
        match lengths.first() {
            Some(&n) => {
                assert!(lengths.iter().all(|&l| l == n), "{self:?}");
                Framing::Length(n)
            }
            None => otherwise,
        }
    }
}

/// A body as read off the wire: its bytes, its trailer fields, and whether its framing said
/// it was whole (a body cut short by the peer closing is not).
#[derive(Debug, Default)]
struct Read {
    body: Vec<u8>,
    trailers: Vec<(String, String)>,
    whole: bool,
}

/// One end of a TCP connection, read as HTTP/1.1 messages; every read and write bounded.
struct Wire {
    stream: TcpStream,
    /// What has been read and not yet taken.
    buf: Vec<u8>,
    /// The bound on each read and write.
    patience: Duration,
}

impl Wire {
    fn new(stream: TcpStream, patience: Duration) -> Wire {
        let _ = stream.set_nodelay(true);
        Wire {
            stream,
            buf: Vec::new(),
            patience,
        }
    }

    /// Writes all of `bytes`.
    async fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        match tokio::time::timeout(self.patience, self.stream.write_all(bytes)).await {
            Ok(written) => written,
            Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "not taken")),
        }
    }

    /// Reads more; `false` once the peer has closed (or reset) the connection.
    async fn more(&mut self) -> io::Result<bool> {
        let mut chunk = [0u8; 16 * 1024];
        match tokio::time::timeout(self.patience, self.stream.read(&mut chunk)).await {
            Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "nothing came")),
            Ok(Ok(0) | Err(_)) => Ok(false),
            Ok(Ok(n)) => {
                self.buf.extend_from_slice(&chunk[..n]);
                Ok(true)
            }
        }
    }

    /// The next head; `None` when the peer closes before sending a byte of it.
    async fn head(&mut self) -> io::Result<Option<Head>> {
        loop {
            if let Some(end) = find(&self.buf, b"\r\n\r\n") {
                let raw: Vec<u8> = self.buf.drain(..end + 4).collect();
                return Head::parse(&raw[..end]).map(Some);
            }
            if !self.more().await? {
                return match self.buf.is_empty() {
                    true => Ok(None),
                    false => Err(io::ErrorKind::UnexpectedEof.into()),
                };
            }
        }
    }

    /// `n` bytes, or fewer when the peer closes first.
    async fn take(&mut self, n: usize) -> io::Result<Vec<u8>> {
        while self.buf.len() < n && self.more().await? {}
        let n = n.min(self.buf.len());
        Ok(self.buf.drain(..n).collect())
    }

    /// A line without its CRLF; `None` when the peer closes first.
    async fn line(&mut self) -> io::Result<Option<String>> {
        loop {
            if let Some(end) = find(&self.buf, b"\r\n") {
                let line: Vec<u8> = self.buf.drain(..end + 2).collect();
                return String::from_utf8(line[..end].to_vec())
                    .map(Some)
                    .map_err(|e| invalid(e.to_string()));
            }
            if !self.more().await? {
                return Ok(None);
            }
        }
    }

    /// The body `framing` delimits.
    async fn body(&mut self, framing: Framing) -> io::Result<Read> {
        let mut read = Read::default();
        match framing {
            Framing::Empty => read.whole = true,
            Framing::Length(n) => {
                read.body = self.take(n).await?;
                read.whole = read.body.len() == n;
            }
            Framing::Close => {
                while self.more().await? {}
                read.body = std::mem::take(&mut self.buf);
                read.whole = true;
            }
            Framing::Chunked => loop {
                let Some(size) = self.line().await? else {
                    return Ok(read);
                };
                let size = size.split(';').next().unwrap().trim();
                let size = usize::from_str_radix(size, 16)
                    .map_err(|_| invalid(format!("chunk size {size:?}")))?;
                if size == 0 {
                    while let Some(line) = self.line().await? {
                        if line.is_empty() {
                            read.whole = true;
                            break;
                        }
                        let (name, value) = line.split_once(':').unwrap_or((&line, ""));
                        read.trailers
                            .push((name.to_owned(), value.trim().to_owned()));
                    }
                    return Ok(read);
                }
                let data = self.take(size).await?;
                read.body.extend_from_slice(&data);
                if data.len() < size || self.take(2).await? != b"\r\n" {
                    return Ok(read);
                }
            },
        }
        Ok(read)
    }

    /// Writes `request` and reads the response (`to_head`: it is a HEAD request).
    async fn exchange(&mut self, request: &[u8], to_head: bool) -> (Head, Read) {
        self.try_exchange(request, to_head)
            .await
            .expect("a response, not a closed connection")
    }

    /// [`Wire::exchange`], or `None` when the peer closes the connection without a response.
    async fn try_exchange(&mut self, request: &[u8], to_head: bool) -> Option<(Head, Read)> {
        self.send(request).await.unwrap();
        let head = self.head().await.unwrap()?;
        let read = self.body(head.response_framing(to_head)).await.unwrap();
        Some((head, read))
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn invalid(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

// ---------------------------------------------------------------------------------------------
// The scripted upstream.
// ---------------------------------------------------------------------------------------------

/// A request as the raw upstream read it.
#[derive(Debug, Clone)]
struct Got {
    /// Which of the upstream's connections it came on: 0, 1, … in accept order.
    conn: usize,
    head: Head,
    /// The body, decoded from the framing it came with.
    body: Vec<u8>,
}

/// One accepted connection of the [`RawUpstream`], handed to its script.
struct UpstreamConn {
    /// Its number, in accept order.
    n: usize,
    wire: Wire,
    got: Arc<Mutex<Vec<Got>>>,
}

impl UpstreamConn {
    /// The next request's head; `None` when the gateway closed the connection (or sent nothing
    /// within [`UPSTREAM_PATIENCE`]).
    async fn head(&mut self) -> Option<Head> {
        self.wire.head().await.ok().flatten()
    }

    /// Reads the body of the request `head` began, and records the request.
    async fn rest(&mut self, head: Head) -> Option<Got> {
        let read = self.wire.body(head.request_framing()).await.ok()?;
        assert!(read.whole, "the gateway cut a request short: {head:?}");
        let got = Got {
            conn: self.n,
            head,
            body: read.body,
        };
        self.got.lock().unwrap().push(got.clone());
        Some(got)
    }

    /// The next whole request, recorded.
    async fn request(&mut self) -> Option<Got> {
        let head = self.head().await?;
        self.rest(head).await
    }

    /// Writes `bytes` (an error — the gateway went away — is returned, not a panic).
    async fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.wire.send(bytes).await
    }
}

/// What the upstream answers to one request, and whether it then closes the connection.
struct Reply {
    bytes: Vec<u8>,
    close: bool,
}

/// Answers `bytes` and keeps the connection open for the next request.
fn keep(bytes: impl AsRef<[u8]>) -> Reply {
    Reply {
        bytes: bytes.as_ref().to_vec(),
        close: false,
    }
}

/// Answers `bytes`, then closes the connection.
fn close(bytes: impl AsRef<[u8]>) -> Reply {
    Reply {
        bytes: bytes.as_ref().to_vec(),
        close: true,
    }
}

/// `200 OK` with a `Content-Length` body.
fn ok(body: &str) -> Reply {
    keep(format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    ))
}

/// A raw HTTP/1.1 upstream on 127.0.0.1:0, each connection run by a script.
struct RawUpstream {
    url: String,
    accepted: Arc<AtomicUsize>,
    got: Arc<Mutex<Vec<Got>>>,
    /// The number of each connection whose script has ended (its socket closed), in order.
    closed: mpsc::UnboundedReceiver<usize>,
    /// Accepts; aborting it (on drop) ends every connection too.
    task: tokio::task::JoinHandle<()>,
}

impl Drop for RawUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl RawUpstream {
    /// Listens on 127.0.0.1:0 and runs `script` on each connection it accepts.
    async fn start<F, Fut>(script: F) -> RawUpstream
    where
        F: Fn(UpstreamConn) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let accepted = Arc::new(AtomicUsize::new(0));
        let got = Arc::new(Mutex::new(Vec::new()));
        let (closed_tx, closed) = mpsc::unbounded_channel();
        let (counter, record) = (accepted.clone(), got.clone());
        let task = tokio::spawn(async move {
            let mut conns = JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                let n = counter.fetch_add(1, Ordering::SeqCst);
                let conn = UpstreamConn {
                    n,
                    wire: Wire::new(stream, UPSTREAM_PATIENCE),
                    got: record.clone(),
                };
                let (run, closed) = (script(conn), closed_tx.clone());
                conns.spawn(async move {
                    run.await; // the connection is dropped — closed — with the script
                    let _ = closed.send(n);
                });
                while conns.try_join_next().is_some() {}
            }
        });
        RawUpstream {
            url,
            accepted,
            got,
            closed,
            task,
        }
    }

    /// An upstream answering each request with `reply(request)`.
    async fn replying(reply: impl Fn(&Got) -> Reply + Send + Sync + 'static) -> RawUpstream {
        let reply = Arc::new(reply);
        RawUpstream::start(move |mut conn| {
            let reply = reply.clone();
            async move {
                while let Some(got) = conn.request().await {
                    let Reply { bytes, close } = reply(&got);
                    if conn.write(&bytes).await.is_err() || close {
                        return;
                    }
                }
            }
        })
        .await
    }

    /// Connections accepted so far.
    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Every request read whole so far.
    fn got(&self) -> Vec<Got> {
        self.got.lock().unwrap().clone()
    }

    /// The requests for `target`.
    fn got_for(&self, target: &str) -> Vec<Got> {
        let got = self.got();
        got.into_iter()
            .filter(|g| g.head.target() == target)
            .collect()
    }

    /// The connection `target`'s only request came on.
    fn conn_of(&self, target: &str) -> usize {
        let got = self.got_for(target);
        assert_eq!(got.len(), 1, "one request for {target}: {got:?}");
        got[0].conn
    }

    /// How many requests came on connection `conn`.
    fn requests_on(&self, conn: usize) -> usize {
        self.got().iter().filter(|g| g.conn == conn).count()
    }

    /// The requests that came after `target`'s on the same connection (none when the gateway
    /// did not reuse it).
    fn later_on_its_conn(&self, target: &str) -> Vec<String> {
        let got = self.got();
        let at = got
            .iter()
            .position(|g| g.head.target() == target)
            .unwrap_or_else(|| panic!("{target} not received: {got:?}"));
        got[at + 1..]
            .iter()
            .filter(|g| g.conn == got[at].conn)
            .map(|g| g.head.line.clone())
            .collect()
    }

    /// Waits for the next connection to end on the upstream's side; its number.
    async fn next_closed(&mut self) -> usize {
        tokio::time::timeout(WAIT, self.closed.recv())
            .await
            .expect("an upstream connection ends in time")
            .unwrap()
    }
}

// ---------------------------------------------------------------------------------------------
// Clients of the gateway.
// ---------------------------------------------------------------------------------------------

/// One HTTP/1.1 client connection to the gateway (hyper's, without a pool): every request
/// goes over this one TCP connection, or fails.
struct OneConn {
    sender: SendRequest<Full<Bytes>>,
}

impl OneConn {
    async fn open(server: &TestServer) -> OneConn {
        let stream = tokio::time::timeout(WAIT, TcpStream::connect(server.gateway.unwrap()))
            .await
            .unwrap()
            .unwrap();
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        OneConn { sender }
    }

    /// Sends `method path` (with `body`) and reads the whole answer.
    async fn send(&mut self, method: &str, path: &str, body: &'static [u8]) -> Answer {
        tokio::time::timeout(WAIT, self.sender.ready())
            .await
            .expect("the client connection is ready in time")
            .expect("the gateway kept the client connection open");
        let request = Request::builder()
            .method(method)
            .uri(path)
            .header("host", "gateway.test")
            .body(Full::new(Bytes::from_static(body)))
            .unwrap();
        let response = tokio::time::timeout(WAIT, self.sender.send_request(request))
            .await
            .expect("an answer in time")
            .expect("an answer");
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = tokio::time::timeout(WAIT, response.into_body().collect())
            .await
            .expect("the body in time")
            .expect("the whole body")
            .to_bytes();
        Answer {
            status,
            headers,
            body,
        }
    }

    async fn get(&mut self, path: &str) -> Answer {
        self.send("GET", path, b"").await
    }
}

/// A raw TCP connection to the gateway.
async fn raw_conn(server: &TestServer) -> Wire {
    let stream = tokio::time::timeout(WAIT, TcpStream::connect(server.gateway.unwrap()))
        .await
        .unwrap()
        .unwrap();
    Wire::new(stream, WAIT)
}

/// `GET path` as raw bytes.
fn raw_get(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: gateway.test\r\n\r\n").into_bytes()
}

/// A gateway that lets everything through to `upstream`.
async fn pass_all(upstream: &RawUpstream) -> TestServer {
    gateway(PASS_ALL, &upstream.url).await
}

/// `answer` is the gateway's own 502 problem.
fn assert_bad_gateway(answer: &Answer, case: &str) {
    assert_eq!(answer.status, 502, "{case}: {:?}", answer.body);
    assert_eq!(
        answer.header("content-type"),
        "application/problem+json",
        "{case}"
    );
    assert_eq!(answer.json()["status"], 502, "{case}");
}

// ---------------------------------------------------------------------------------------------
// Response framing: every delimiter read to exactly its end.
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunked_response_with_extensions_and_trailers_is_decoded_and_its_connection_reused() {
    let upstream = RawUpstream::replying(|got| match got.head.target() {
        "/chunked" => keep(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
             5;ext=1\r\nhello\r\n\
             6;name=\"quoted;value\";flag\r\n world\r\n\
             A\r\n, chunked!\r\n\
             0;last=yes\r\n\r\n",
        ),
        "/trailers" => keep(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Checksum\r\n\r\n\
             5;ext=1\r\nhello\r\n\
             6\r\n world\r\n\
             0\r\nX-Checksum: abc\r\nX-Other: 1\r\n\r\n",
        ),
        target => ok(&format!("after {target}")),
    })
    .await;
    let server = pass_all(&upstream).await;
    let mut conn = OneConn::open(&server).await;
    let answer = conn.get("/chunked").await;
    assert_eq!(answer.status, 200);
    assert_eq!(&answer.body[..], b"hello world, chunked!");
    // The same client connection, and the same upstream connection: the decoder stopped
    // exactly at the end of the last chunk.
    let next = conn.get("/next").await;
    assert_eq!((next.status, &next.body[..]), (200, &b"after /next"[..]));
    assert_eq!(upstream.accepted(), 1, "the upstream connection is reused");
    assert_eq!(upstream.conn_of("/next"), 0);

    // Trailer fields are not body (nor forwarded: `Trailer` is hop-by-hop), the next response
    // after them is intact, and the connection is still the one: the decoder read the
    // trailer section to its end.
    let answer = conn.get("/trailers").await;
    assert_eq!(
        (answer.status, &answer.body[..]),
        (200, &b"hello world"[..])
    );
    let next = conn.get("/after-trailers").await;
    assert_eq!(
        (next.status, &next.body[..]),
        (200, &b"after /after-trailers"[..])
    );
    assert_eq!(upstream.accepted(), 1, "reused after the trailers");
    server.stop().await;
}

/// The size of `/large` responses: several reads' worth.
const LARGE: usize = 300_000;

/// `LARGE` deterministic bytes.
fn large() -> Vec<u8> {
    (0..LARGE).map(|i| (i * 31 % 251) as u8).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_content_length_response_is_exact_and_its_connection_reused() {
    let upstream = RawUpstream::replying(|got| match got.head.target() {
        "/first" => keep("HTTP/1.1 200 OK\r\nContent-Length: 12\r\nX-A: 1\r\n\r\nfirst body!!"),
        "/empty" => keep("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"),
        // Longer than any one read: the length is counted across reads.
        "/large" => keep(
            [
                format!("HTTP/1.1 200 OK\r\nContent-Length: {LARGE}\r\n\r\n").as_bytes(),
                &large(),
            ]
            .concat(),
        ),
        target => ok(&format!("after {target}")),
    })
    .await;
    let server = pass_all(&upstream).await;
    let mut conn = OneConn::open(&server).await;
    let first = conn.get("/first").await;
    assert_eq!((first.status, &first.body[..]), (200, &b"first body!!"[..]));
    assert_eq!(first.header("content-length"), "12");
    assert_eq!(first.header("x-a"), "1");
    let second = conn.get("/second").await;
    assert_eq!(
        (second.status, &second.body[..]),
        (200, &b"after /second"[..])
    );
    let empty = conn.get("/empty").await;
    assert_eq!((empty.status, empty.body.len()), (200, 0));
    let third = conn.get("/third").await;
    assert_eq!((third.status, &third.body[..]), (200, &b"after /third"[..]));
    let big = conn.get("/large").await;
    assert_eq!(big.body.len(), LARGE);
    assert!(big.body == large(), "the large body differs");
    let last = conn.get("/last").await;
    assert_eq!((last.status, &last.body[..]), (200, &b"after /last"[..]));
    assert_eq!(upstream.accepted(), 1);
    assert_eq!(
        upstream.requests_on(0),
        6,
        "every request on one connection"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_delimited_response_is_delivered_whole_and_its_connection_not_reused() {
    let body = "no length, no chunks: the body ends when the connection does";
    let upstream = RawUpstream::replying(move |got| match got.head.target() {
        "/close-delimited" => close(format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n{body}"
        )),
        _ => ok("after"),
    })
    .await;
    let server = pass_all(&upstream).await;
    let mut conn = OneConn::open(&server).await;
    let answer = conn.get("/close-delimited").await;
    assert_eq!(answer.status, 200);
    assert_eq!(&answer.body[..], body.as_bytes());
    // The same client connection goes on; the upstream one cannot.
    let after = conn.get("/after").await;
    assert_eq!((after.status, &after.body[..]), (200, &b"after"[..]));
    assert_eq!(upstream.accepted(), 2, "a new upstream connection");
    assert_eq!(upstream.conn_of("/after"), 1);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_close_and_http_1_0_responses_are_not_reused() {
    // The upstream keeps every connection open after answering: only the gateway honouring
    // what the response said keeps the next request off it.
    let upstream = RawUpstream::replying(|got| match got.head.target() {
        "/close" => keep("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 3\r\n\r\nbye"),
        "/close-mixed" => keep(
            "HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nConnection: Close\r\n\
             Content-Length: 3\r\n\r\nbye",
        ),
        "/http10" => keep("HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\nold"),
        _ => ok("fresh"),
    })
    .await;
    let server = pass_all(&upstream).await;
    let mut conn = OneConn::open(&server).await;
    let mut conns = 0;
    for (path, body) in [
        ("/close", "bye"),
        ("/close-mixed", "bye"),
        ("/http10", "old"),
    ] {
        let answer = conn.get(path).await;
        assert_eq!(
            (answer.status, &answer.body[..]),
            (200, body.as_bytes()),
            "{path}"
        );
        assert!(
            answer.headers.get("connection").is_none(),
            "{path}: the upstream's Connection is hop-by-hop"
        );
        let next = conn.get(&format!("{path}/next")).await;
        assert_eq!(
            (next.status, &next.body[..]),
            (200, &b"fresh"[..]),
            "{path}"
        );
        conns += 1;
        assert_eq!(
            upstream.later_on_its_conn(path),
            Vec::<String>::new(),
            "{path}: the connection was reused"
        );
    }
    assert_eq!(upstream.accepted(), conns + 1);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_response_has_no_body_whatever_its_framing_says_and_the_connection_stays_in_step() {
    let upstream = RawUpstream::replying(|got| match (got.head.line.as_str(), got.head.target()) {
        (line, "/length") if line.starts_with("HEAD ") => {
            keep("HTTP/1.1 200 OK\r\nContent-Length: 100\r\nX-Head: 1\r\n\r\n")
        }
        (line, "/chunked") if line.starts_with("HEAD ") => {
            keep("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        }
        (_, target) => ok(&format!("GET {target}")),
    })
    .await;
    let server = pass_all(&upstream).await;
    let mut conn = OneConn::open(&server).await;
    for path in ["/length", "/chunked"] {
        let head = conn.send("HEAD", path, b"").await;
        assert_eq!((head.status, head.body.len()), (200, 0), "{path}");
        // The next response is read from where the HEAD response ended: intact.
        let next = conn.get(&format!("{path}/next")).await;
        assert_eq!(
            (next.status, &next.body[..]),
            (200, format!("GET {path}/next").as_bytes()),
            "{path}"
        );
    }
    let mut raw = raw_conn(&server).await;
    let (head, _) = raw
        .exchange(b"HEAD /length HTTP/1.1\r\nHost: x\r\n\r\n", true)
        .await;
    assert_eq!(head.status(), 200);
    assert_eq!(head.all("x-head"), ["1"]);
    assert_eq!(upstream.accepted(), 1, "one upstream connection throughout");
    assert_eq!(upstream.requests_on(0), 5);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_content_and_not_modified_responses_have_no_body_and_the_connection_stays_in_step() {
    let upstream = RawUpstream::replying(|got| match got.head.target() {
        "/no-content" => keep("HTTP/1.1 204 No Content\r\nX-Status: 204\r\n\r\n"),
        // A 304 may carry the length of the representation it stands for (RFC 9110 §8.6):
        // still no body.
        "/not-modified" => {
            keep("HTTP/1.1 304 Not Modified\r\nETag: \"v1\"\r\nContent-Length: 11\r\n\r\n")
        }
        target => ok(&format!("after {target}")),
    })
    .await;
    let server = pass_all(&upstream).await;
    let mut conn = OneConn::open(&server).await;
    let none = conn.get("/no-content").await;
    assert_eq!((none.status, none.body.len()), (204, 0));
    assert_eq!(none.header("x-status"), "204");
    let after = conn.get("/a").await;
    assert_eq!((after.status, &after.body[..]), (200, &b"after /a"[..]));
    let same = conn.get("/not-modified").await;
    assert_eq!((same.status, same.body.len()), (304, 0));
    assert_eq!(same.header("etag"), "\"v1\"");
    let after = conn.get("/b").await;
    assert_eq!((after.status, &after.body[..]), (200, &b"after /b"[..]));
    assert_eq!(upstream.accepted(), 1);
    assert_eq!(upstream.requests_on(0), 4);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interim_responses_are_skipped_and_the_final_one_forwarded() {
    let upstream = RawUpstream::start(|mut conn| async move {
        while let Some(got) = conn.request().await {
            let reply = match got.head.target() {
                // 1xx heads in writes of their own, then the final response.
                "/interim" => vec![
                    &b"HTTP/1.1 100 Continue\r\n\r\n"[..],
                    b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n",
                    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfinal",
                ],
                _ => vec![&b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nnext"[..]],
            };
            for bytes in reply {
                if conn.write(bytes).await.is_err() {
                    return;
                }
            }
        }
    })
    .await;
    let server = pass_all(&upstream).await;
    let mut conn = OneConn::open(&server).await;
    let answer = conn.send("POST", "/interim", b"upload").await;
    assert_eq!((answer.status, &answer.body[..]), (200, &b"final"[..]));
    let next = conn.get("/next").await;
    assert_eq!((next.status, &next.body[..]), (200, &b"next"[..]));
    assert_eq!(upstream.accepted(), 1);
    assert_eq!(&upstream.got_for("/interim")[0].body[..], b"upload");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_trickled_a_byte_at_a_time_are_read_the_same() {
    let responses: [&[u8]; 3] = [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n10\r\n0123456789abcdef\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\nX-Long-Field: some value here\r\n\r\nlengthy",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 1\r\n\r\n!",
    ];
    let upstream = RawUpstream::start(move |mut conn| async move {
        while let Some(got) = conn.request().await {
            let i: usize = got.head.target()[1..].parse().unwrap();
            for byte in responses[i] {
                if conn.write(&[*byte]).await.is_err() {
                    return;
                }
            }
        }
    })
    .await;
    let server = pass_all(&upstream).await;
    let mut conn = OneConn::open(&server).await;
    for (i, (status, body)) in [
        (200, &b"abc0123456789abcdef"[..]),
        (200, b"lengthy"),
        (201, b"!"),
    ]
    .into_iter()
    .enumerate()
    {
        let answer = conn.get(&format!("/{i}")).await;
        assert_eq!(
            (answer.status, &answer.body[..]),
            (status, body),
            "response {i}"
        );
    }
    assert_eq!(upstream.accepted(), 1);
    server.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Invalid framing: a 502, and the connection never reused.
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicting_or_invalid_content_lengths_are_a_502_and_the_connection_is_dropped() {
    // RFC 9112 §6.3 (5): an invalid Content-Length in a response a proxy receives: close the
    // connection to the server, discard the response, answer 502.
    const BAD: [(&str, &str); 10] = [
        (
            "two lengths",
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
        ),
        (
            "a list of two",
            "HTTP/1.1 200 OK\r\nContent-Length: 5, 6\r\n\r\nhello!",
        ),
        (
            "letters",
            "HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\nhello!",
        ),
        (
            "a plus sign",
            "HTTP/1.1 200 OK\r\nContent-Length: +6\r\n\r\nhello!",
        ),
        (
            "a minus sign",
            "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\nhello!",
        ),
        (
            "two numbers",
            "HTTP/1.1 200 OK\r\nContent-Length: 6 6\r\n\r\nhello!",
        ),
        (
            "hexadecimal",
            "HTTP/1.1 200 OK\r\nContent-Length: 0x6\r\n\r\nhello!",
        ),
        ("empty", "HTTP/1.1 200 OK\r\nContent-Length: \r\n\r\nhello!"),
        (
            "past u64",
            "HTTP/1.1 200 OK\r\nContent-Length: 18446744073709551622\r\n\r\nhello!",
        ),
        // RFC 9112 §6.1: Transfer-Encoding in an HTTP/1.0 message is faulty framing.
        (
            "chunks in HTTP/1.0",
            "HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nhello!\r\n0\r\n\r\n",
        ),
    ];
    // The upstream keeps each connection open after answering.
    let upstream = RawUpstream::replying(|got| match got.head.target().strip_prefix("/bad/") {
        Some(i) => keep(BAD[i.parse::<usize>().unwrap()].1),
        None => ok("fine"),
    })
    .await;
    let server = pass_all(&upstream).await;
    let mut conn = OneConn::open(&server).await;
    for (i, (case, _)) in BAD.iter().enumerate() {
        let answer = conn.get(&format!("/bad/{i}")).await;
        assert_bad_gateway(&answer, case);
        // The gateway goes on, on this client connection, and not on that upstream one.
        let next = conn.get(&format!("/ok/{i}")).await;
        assert_eq!((next.status, &next.body[..]), (200, &b"fine"[..]), "{case}");
        assert_eq!(
            upstream.later_on_its_conn(&format!("/bad/{i}")),
            Vec::<String>::new(),
            "{case}: the connection was reused"
        );
    }
    server.stop().await;
}

/// Agreeing lengths — a list (`5, 5`) or the same value twice — are one length (RFC 9110
/// §8.6): read as such and passed on as one field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agreeing_content_lengths_are_passed_on_as_one() {
    let upstream = RawUpstream::replying(|got| match got.head.target() {
        "/list" => keep("HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\nhello"),
        "/twice" => keep("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello"),
        _ => ok("next"),
    })
    .await;
    let server = pass_all(&upstream).await;
    let mut client_conn = raw_conn(&server).await;
    for path in ["/list", "/twice"] {
        let (head, read) = client_conn.exchange(&raw_get(path), false).await;
        assert_eq!(
            (head.status(), &read.body[..]),
            (200, &b"hello"[..]),
            "{path}"
        );
        assert_eq!(head.all("content-length"), ["5"], "{path}: {head:?}");
    }
    let (head, read) = client_conn.exchange(&raw_get("/next"), false).await;
    assert_eq!((head.status(), &read.body[..]), (200, &b"next"[..]));
    assert_eq!(upstream.accepted(), 1, "the upstream connection is reused");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_with_a_content_length_is_read_as_chunked_and_forwarded_coherently() {
    let upstream = RawUpstream::replying(|got| match got.head.target() {
        "/both" => keep(
            "HTTP/1.1 200 OK\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n\
             5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
        ),
        _ => ok("next"),
    })
    .await;
    let server = pass_all(&upstream).await;
    // Raw, to see the framing the client is given.
    let mut client_conn = raw_conn(&server).await;
    let (head, read) = client_conn.exchange(&raw_get("/both"), false).await;
    assert_eq!(head.status(), 200);
    assert!(read.whole);
    assert_eq!(
        read.body, b"hello world",
        "Transfer-Encoding overrides Content-Length"
    );
    let lengths = head.all("content-length");
    if head.one("transfer-encoding").is_some() {
        assert!(
            lengths.is_empty(),
            "chunked and a length to the client: {head:?}"
        );
    } else {
        assert_eq!(lengths, ["11"], "{head:?}");
    }
    // The client connection is in step for the next response.
    let (head, read) = client_conn.exchange(&raw_get("/next"), false).await;
    assert_eq!((head.status(), &read.body[..]), (200, &b"next"[..]));
    // RFC 9112 §6.3 (3): the connection such a message came on is closed after it.
    assert_eq!(
        upstream.later_on_its_conn("/both"),
        Vec::<String>::new(),
        "the connection was reused"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_or_oversized_response_heads_are_a_502_and_the_gateway_goes_on() {
    let huge = format!(
        "HTTP/1.1 200 OK\r\nX-Huge: {}\r\nContent-Length: 2\r\n\r\nok",
        "a".repeat(1 << 20)
    );
    let big = format!(
        "HTTP/1.1 200 OK\r\nX-Big: {}\r\nContent-Length: 2\r\n\r\nok",
        "a".repeat(100 << 10)
    );
    // Each case: the response, and whether RFC 9112 also lets a proxy read it leniently (then
    // it must be read as the body "ok", framed by its Content-Length, instead of a 502).
    let bad: Vec<(&str, String, bool)> = vec![
        (
            "letters for a status",
            "HTTP/1.1 abc OK\r\nContent-Length: 2\r\n\r\nok".into(),
            false,
        ),
        (
            "a two-digit status",
            "HTTP/1.1 099 Low\r\nContent-Length: 2\r\n\r\nok".into(),
            false,
        ),
        ("not HTTP", "hello\r\n\r\n".into(), false),
        (
            "HTTP/2",
            "HTTP/2 200\r\ncontent-length: 2\r\n\r\nok".into(),
            false,
        ),
        (
            "HTTP/1.2",
            "HTTP/1.2 200 OK\r\nContent-Length: 2\r\n\r\nok".into(),
            false,
        ),
        (
            "a field without a colon",
            "HTTP/1.1 200 OK\r\nContent-Length 2\r\n\r\nok".into(),
            false,
        ),
        (
            "a space in a field name",
            "HTTP/1.1 200 OK\r\nX Y: z\r\nContent-Length: 2\r\n\r\nok".into(),
            false,
        ),
        ("a 1 MiB head", huge, false),
        (
            "a 100 KiB head (over the 64 KiB a response head may take)",
            big,
            false,
        ),
        (
            "an unsolicited 101",
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n".into(),
            false,
        ),
        (
            "a transfer coding the gateway cannot pass on (gzip, chunked)",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"
                .into(),
            false,
        ),
        // §5.1: a proxy MUST remove whitespace before the colon, or reject the response.
        (
            "a space before the colon",
            "HTTP/1.1 200 OK\r\nContent-Length : 2\r\n\r\nok".into(),
            true,
        ),
        // §5.2: a proxy replaces obs-fold with spaces, or answers 502.
        (
            "a folded field",
            "HTTP/1.1 200 OK\r\nX-F: a\r\n b\r\nContent-Length: 2\r\n\r\nok".into(),
            true,
        ),
        // §2.2: a recipient MAY take a bare LF as a line end.
        (
            "bare LFs",
            "HTTP/1.1 200 OK\nContent-Length: 2\n\nok".into(),
            true,
        ),
    ];
    let scripts: Vec<String> = bad.iter().map(|(_, bytes, _)| bytes.clone()).collect();
    let upstream =
        RawUpstream::replying(move |got| match got.head.target().strip_prefix("/bad/") {
            Some(i) => keep(&scripts[i.parse::<usize>().unwrap()]),
            None => ok("fine"),
        })
        .await;
    let server = pass_all(&upstream).await;
    let mut conn = OneConn::open(&server).await;
    for (i, (case, _, lenient)) in bad.iter().enumerate() {
        let answer = conn.get(&format!("/bad/{i}")).await;
        let next = conn.get(&format!("/ok/{i}")).await;
        assert_eq!((next.status, &next.body[..]), (200, &b"fine"[..]), "{case}");
        if *lenient && answer.status == 200 {
            assert_eq!(&answer.body[..], b"ok", "{case}");
            continue;
        }
        assert_bad_gateway(&answer, case);
        assert_eq!(
            upstream.later_on_its_conn(&format!("/bad/{i}")),
            Vec::<String>::new(),
            "{case}: the connection was reused"
        );
    }
    // Another client, after all that: served.
    assert_eq!(
        send(&client(), get_request(&server, "/last")).await.status,
        200
    );
    server.stop().await;
}

fn get_request(server: &TestServer, path: &str) -> Request<Full<Bytes>> {
    Request::get(format!("http://{}{path}", server.gateway.unwrap()))
        .body(Full::default())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_after_a_complete_response_are_not_taken_for_the_next_one() {
    // A response with more bytes after its end, in the same write: a response the gateway did
    // not ask for (response splitting). They must never answer the next request.
    let upstream = RawUpstream::replying(|got| match got.head.target() {
        "/split" => keep(
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok\
             HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nsmuggled",
        ),
        _ => ok("genuine"),
    })
    .await;
    let server = pass_all(&upstream).await;
    let mut conn = OneConn::open(&server).await;
    let first = conn.get("/split").await;
    assert_eq!((first.status, &first.body[..]), (200, &b"ok"[..]));
    for i in 0..3 {
        let next = conn.get(&format!("/next/{i}")).await;
        assert_eq!((next.status, &next.body[..]), (200, &b"genuine"[..]));
    }
    assert_eq!(upstream.later_on_its_conn("/split"), Vec::<String>::new());
    server.stop().await;
}

// ---------------------------------------------------------------------------------------------
// A body cut short; an early answer.
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_cut_short_reaches_the_client_cut_short() {
    let cuts: [(&str, &str); 3] = [
        (
            "a length",
            "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789",
        ),
        (
            "chunks without the last",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\na\r\n0123456789\r\n",
        ),
        (
            "inside a chunk",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n64\r\n0123456789",
        ),
    ];
    let upstream =
        RawUpstream::replying(move |got| match got.head.target().strip_prefix("/cut/") {
            Some(i) => close(cuts[i.parse::<usize>().unwrap()].1),
            None => ok("fine"),
        })
        .await;
    let server = pass_all(&upstream).await;
    for (i, (case, _)) in cuts.iter().enumerate() {
        // On the wire: a 200 whose framing never completes, then the connection closed — or,
        // if the gateway learnt of the cut first, a 502. Never a body that looks whole.
        let mut client_conn = raw_conn(&server).await;
        let exchanged = client_conn
            .try_exchange(&raw_get(&format!("/cut/{i}")), false)
            .await;
        let Some((head, read)) = exchanged else {
            // Closed without a response: an error to any client, fine.
            continue;
        };
        match head.status() {
            502 => assert!(read.whole, "{case}: a whole 502 problem"),
            200 => {
                assert!(
                    !read.whole,
                    "{case}: the cut body was framed as whole: {head:?}"
                );
                assert!(
                    head.response_framing(false) != Framing::Close,
                    "{case}: a close-delimited body cannot be told from a whole one"
                );
                assert!(b"0123456789".starts_with(&read.body), "{case}: {read:?}");
            }
            other => panic!("{case}: {other}"),
        }
        // With a client library: an error, not a short body taken as the whole.
        assert_cut(&server, &format!("/cut/{i}"), case).await;
    }
    // The gateway goes on.
    assert_eq!(
        send(&client(), get_request(&server, "/fine")).await.status,
        200
    );
    server.stop().await;
}

/// `GET path` with a client library fails — no response, a 502, or a body that errors —
/// rather than giving a body that looks whole.
async fn assert_cut(server: &TestServer, path: &str, case: &str) {
    let response = tokio::time::timeout(WAIT, client().request(get_request(server, path)))
        .await
        .expect("an answer in time");
    let Ok(response) = response else {
        return; // closed without a response
    };
    if response.status() == 502 {
        return;
    }
    assert_eq!(response.status(), 200, "{case}");
    let body = tokio::time::timeout(WAIT, response.into_body().collect())
        .await
        .expect("the body ends in time");
    assert!(body.is_err(), "{case}: a cut body read as complete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_chunked_framing_never_reaches_the_client_as_a_whole_body() {
    // Each case: the response, and what a lenient reader may deliver instead of failing
    // (RFC 9112 §2.2 lets a recipient take a bare LF as a line end).
    const BAD: [(&str, &str, Option<&[u8]>); 6] = [
        (
            "a chunk size past u64",
            "fffffffffffffffff\r\nhello\r\n0\r\n\r\n",
            None,
        ),
        (
            "a chunk size not hexadecimal",
            "5x\r\nhello\r\n0\r\n\r\n",
            None,
        ),
        ("a negative chunk size", "-5\r\nhello\r\n0\r\n\r\n", None),
        ("data longer than its size", "3\r\nhello\r\n0\r\n\r\n", None),
        ("no CRLF after the data", "5\r\nhelloXX0\r\n\r\n", None),
        ("bare LFs", "5\nhello\n0\n\n", Some(b"hello")),
    ];
    // The upstream keeps each connection open after answering.
    let upstream = RawUpstream::replying(|got| match got.head.target().strip_prefix("/bad/") {
        Some(i) => keep(format!(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{}",
            BAD[i.parse::<usize>().unwrap()].1
        )),
        None => ok("fine"),
    })
    .await;
    let server = pass_all(&upstream).await;
    for (i, (case, _, lenient)) in BAD.iter().enumerate() {
        let path = format!("/bad/{i}");
        let mut client_conn = raw_conn(&server).await;
        match client_conn.try_exchange(&raw_get(&path), false).await {
            None => {}
            Some((head, read)) if head.status() == 502 => assert!(read.whole, "{case}"),
            Some((head, read)) => {
                assert_eq!(head.status(), 200, "{case}");
                match lenient {
                    Some(body) if read.whole => assert_eq!(&read.body[..], *body, "{case}"),
                    _ => assert!(!read.whole, "{case}: framed as whole: {read:?}"),
                }
            }
        }
        if lenient.is_none() {
            assert_eq!(
                upstream.later_on_its_conn(&path),
                Vec::<String>::new(),
                "{case}: the connection was reused"
            );
            assert_cut(&server, &path, case).await;
        }
        let next = send(&client(), get_request(&server, &format!("/ok/{i}"))).await;
        assert_eq!((next.status, &next.body[..]), (200, &b"fine"[..]), "{case}");
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_early_answer_to_an_upload_is_forwarded_without_waiting_for_the_body() {
    // The upstream answers `/upload` after its head, reads none of the body, and holds the
    // connection until the test lets it go.
    let release = Arc::new(Notify::new());
    let held = release.clone();
    let upstream = RawUpstream::start(move |mut conn| {
        let held = held.clone();
        async move {
            while let Some(head) = conn.head().await {
                if head.target() == "/upload" {
                    let _ = conn
                        .write(
                            b"HTTP/1.1 413 Content Too Large\r\nContent-Length: 8\r\n\
                              Connection: close\r\n\r\ntoo big!",
                        )
                        .await;
                    let _ = tokio::time::timeout(WAIT, held.notified()).await;
                    return;
                }
                if conn.rest(head).await.is_none() {
                    return;
                }
                let _ = conn
                    .write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    .await;
            }
        }
    })
    .await;
    let server = pass_all(&upstream).await;

    // A raw client declares 1 MiB, sends 64 KiB, and waits: the 413 comes anyway.
    let mut uploader = raw_conn(&server).await;
    uploader
        .send(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n")
        .await
        .unwrap();
    uploader.send(&[b'u'; 65_536]).await.unwrap();
    let head = uploader.head().await.unwrap().expect("an answer");
    assert_eq!(head.status(), 413);
    let read = uploader.body(head.response_framing(false)).await.unwrap();
    assert_eq!((read.whole, &read.body[..]), (true, &b"too big!"[..]));
    release.notify_one();

    // A client library sending the whole mebibyte gets it too.
    let upload = Request::post(format!("http://{}/upload", server.gateway.unwrap()))
        .body(Full::new(Bytes::from(vec![b'u'; 1 << 20])))
        .unwrap();
    let answer = send(&client(), upload).await;
    assert_eq!((answer.status, &answer.body[..]), (413, &b"too big!"[..]));
    release.notify_one();

    // Neither connection is reused: the next request opens a third.
    let after = send(&client(), get_request(&server, "/after")).await;
    assert_eq!((after.status, &after.body[..]), (200, &b"ok"[..]));
    assert_eq!(upstream.accepted(), 3);
    assert_eq!(upstream.conn_of("/after"), 2);
    server.stop().await;
}

// ---------------------------------------------------------------------------------------------
// What the upstream receives.
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstream_gets_origin_form_one_host_and_each_body_framed_once() {
    let upstream = RawUpstream::replying(|_| ok("ok")).await;
    let server = pass_all(&upstream).await;
    let authority = upstream.url.trim_start_matches("http://").to_owned();
    let requests: [(&str, &[u8]); 8] = [
        (
            "get",
            b"GET /plain?x=1&y=two%20words HTTP/1.1\r\nHost: api.example\r\n\r\n",
        ),
        (
            "delete",
            b"DELETE /thing HTTP/1.1\r\nHost: api.example\r\n\r\n",
        ),
        (
            "post with a length",
            b"POST /length HTTP/1.1\r\nHost: api.example\r\nContent-Length: 11\r\n\r\nhello world",
        ),
        (
            "post chunked",
            b"POST /chunked HTTP/1.1\r\nHost: api.example\r\nTransfer-Encoding: chunked\r\n\r\n\
              5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n",
        ),
        (
            "post empty",
            b"POST /empty HTTP/1.1\r\nHost: api.example\r\nContent-Length: 0\r\n\r\n",
        ),
        (
            "absolute form",
            b"GET http://other.example:8080/abs?q=1 HTTP/1.1\r\nHost: wrong.example\r\n\r\n",
        ),
        (
            "absolute form with an empty path",
            b"GET http://other.example:8080?q=2 HTTP/1.1\r\nHost: wrong.example\r\n\r\n",
        ),
        ("http/1.0 without host", b"GET /old HTTP/1.0\r\n\r\n"),
    ];
    for (case, request) in requests {
        let (head, read) = raw_conn(&server).await.exchange(request, false).await;
        assert_eq!((head.status(), &read.body[..]), (200, &b"ok"[..]), "{case}");
    }
    let got = upstream.got();
    assert_eq!(got.len(), requests.len());
    let find = |target: &str| {
        got.iter()
            .find(|g| g.head.target() == target)
            .unwrap_or_else(|| panic!("{target} not received: {got:?}"))
    };
    for g in &got {
        let mut line = g.head.line.split(' ');
        let (method, target, version) = (line.next(), line.next(), line.next());
        assert!(method.is_some_and(|m| !m.is_empty()), "{g:?}");
        assert!(
            target.is_some_and(|t| t.starts_with('/')),
            "origin form: {g:?}"
        );
        assert_eq!((version, line.next()), (Some("HTTP/1.1"), None), "{g:?}");
        assert_eq!(g.head.all("host").len(), 1, "one Host: {g:?}");
        let (te, cl) = (
            g.head.all("transfer-encoding"),
            g.head.all("content-length"),
        );
        assert!(te.is_empty() || cl.is_empty(), "framed twice: {g:?}");
        assert!(cl.len() <= 1, "{g:?}");
    }
    let plain = find("/plain?x=1&y=two%20words");
    assert_eq!(plain.head.line, "GET /plain?x=1&y=two%20words HTTP/1.1");
    assert_eq!(plain.head.one("host"), Some("api.example"));
    for body_less in [plain, find("/thing")] {
        assert_eq!(
            body_less.head.request_framing(),
            Framing::Empty,
            "{body_less:?}"
        );
        assert!(body_less.body.is_empty());
    }
    let length = find("/length");
    assert_eq!(length.head.all("content-length"), ["11"]);
    assert_eq!(length.body, b"hello world");
    let chunked = find("/chunked");
    assert_eq!(chunked.body, b"hello world", "{chunked:?}");
    match chunked.head.request_framing() {
        Framing::Chunked => assert_eq!(chunked.head.all("transfer-encoding"), ["chunked"]),
        Framing::Length(n) => assert_eq!(n, 11),
        other => panic!("the chunked upload arrived as {other:?}"),
    }
    let empty = find("/empty");
    assert!(empty.body.is_empty());
    assert!(
        matches!(
            empty.head.request_framing(),
            Framing::Empty | Framing::Length(0)
        ),
        "{empty:?}"
    );
    let absolute = find("/abs?q=1");
    assert_eq!(absolute.head.line, "GET /abs?q=1 HTTP/1.1");
    assert_eq!(absolute.head.one("host"), Some("other.example:8080"));
    // RFC 9112 §3.2.1: an empty path is sent as `/`.
    let no_path = find("/?q=2");
    assert_eq!(no_path.head.line, "GET /?q=2 HTTP/1.1");
    assert_eq!(no_path.head.one("host"), Some("other.example:8080"));
    let old = find("/old");
    assert_eq!(old.head.line, "GET /old HTTP/1.1");
    assert_eq!(old.head.one("host"), Some(authority.as_str()));
    server.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Idle connections.
// ---------------------------------------------------------------------------------------------

/// The race a keep-alive timeout makes, made certain: the upstream reads a request on a pooled
/// connection and closes it without a byte of answer. An idempotent request without a body is
/// sent again on a new connection (RFC 9110 §9.2.2, as nginx's `proxy_next_upstream error`
/// does); one with a body, or not idempotent, is not: a 502.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_a_pooled_connection_dropped_is_replayed_only_when_idempotent_and_empty() {
    // Requests seen per upstream connection: a `/drop…` request is dropped unless it is the
    // first on its connection (so it is only ever dropped on a reused one).
    let seen = Arc::new(Mutex::new(Vec::<usize>::new()));
    let counts = seen.clone();
    let upstream = RawUpstream::replying(move |got| {
        let mut counts = counts.lock().unwrap();
        if counts.len() <= got.conn {
            counts.resize(got.conn + 1, 0);
        }
        counts[got.conn] += 1;
        match got.head.target() {
            target if target.starts_with("/drop") && counts[got.conn] > 1 => close(""),
            target => ok(target),
        }
    })
    .await;
    let server = pass_all(&upstream).await;
    let mut conn = OneConn::open(&server).await;
    assert_eq!(conn.get("/first").await.status, 200);
    // Reuses connection 0, which drops it; sent again on connection 1.
    let replayed = conn.get("/drop-get").await;
    assert_eq!(
        (replayed.status, &replayed.body[..]),
        (200, &b"/drop-get"[..])
    );
    assert_eq!((upstream.requests_on(0), upstream.requests_on(1)), (2, 1));
    // A body: not replayed.
    let posted = conn.send("POST", "/drop-post", b"payload").await;
    assert_bad_gateway(&posted, "a POST with a body");
    assert_eq!(upstream.requests_on(1), 2);
    // DELETE is idempotent: on a fresh connection (2) first, then dropped on it and replayed (3).
    let mut conn = OneConn::open(&server).await;
    assert_eq!(conn.send("DELETE", "/drop-delete", b"").await.status, 200);
    let replayed = conn.send("DELETE", "/drop-delete", b"").await;
    assert_eq!(
        (replayed.status, &replayed.body[..]),
        (200, &b"/drop-delete"[..])
    );
    assert_eq!((upstream.requests_on(2), upstream.requests_on(3)), (2, 1));
    assert_eq!(upstream.accepted(), 4);
    drop(seen);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_the_upstream_closed_is_replaced_not_a_502() {
    // The upstream closes each connection right after its response, without saying so (as a
    // keep-alive timeout expiring would): the gateway pools it, finds it closed, and must open
    // another rather than fail the next request.
    let mut upstream = RawUpstream::replying(|got| {
        close(format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{}",
            got.body.len() + 3,
            format_args!("ok {}", String::from_utf8_lossy(&got.body))
        ))
    })
    .await;
    let server = pass_all(&upstream).await;
    let mut conn = OneConn::open(&server).await;
    let first = conn.get("/first").await;
    assert_eq!((first.status, &first.body[..]), (200, &b"ok "[..]));
    assert_eq!(upstream.next_closed().await, 0);
    let second = conn.get("/second").await;
    assert_eq!((second.status, &second.body[..]), (200, &b"ok "[..]));
    assert_eq!(upstream.conn_of("/second"), 1);
    assert_eq!(upstream.next_closed().await, 1);
    // A request with a body (not safely retried) too.
    let third = conn.send("POST", "/third", b"payload").await;
    assert_eq!((third.status, &third.body[..]), (200, &b"ok payload"[..]));
    assert_eq!(upstream.conn_of("/third"), 2);
    assert_eq!(upstream.accepted(), 3);
    server.stop().await;
}
