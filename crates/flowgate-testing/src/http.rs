//! Raw HTTP/1.1 exchanges over fresh loopback connections: what a client sees on the wire,
//! with no client library in between.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::server::HttpResponse;

/// `GET path` over a fresh HTTP/1.1 connection; the whole response, or `None` if none came.
pub fn http_get(addr: SocketAddr, path: &str) -> Option<String> {
    exchange(
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
    )
}

/// `POST path` with a JSON `body` over a fresh HTTP/1.1 connection; the whole response.
pub fn http_post(addr: SocketAddr, path: &str, body: &str) -> String {
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    exchange(addr, &request).expect("an answer")
}

/// Writes a raw `request` on a new connection; the whole response.
pub fn exchange_raw(addr: SocketAddr, request: &str) -> Option<String> {
    exchange(addr, request)
}

/// Writes `request` on a new connection and reads until the server closes it (or 5 s pass);
/// `None` when nothing came back.
///
/// The server may answer, and close, before it has read the whole request (a body over a
/// limit, an unknown route): then writing fails, or a reset cuts the read short. Neither ends
/// the exchange early — what the server sent before is its answer.
fn exchange(addr: SocketAddr, request: &str) -> Option<String> {
    let mut conn = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let _ = conn.write_all(request.as_bytes());
    let mut response = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match conn.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => response.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    if response.is_empty() {
        return None;
    }
    Some(String::from_utf8_lossy(&response).into_owned())
}

/// `raw`, an HTTP/1.1 response as [`http_get`] or [`http_post`] return it, parsed: status,
/// header fields and body (de-chunked).
pub fn parse(raw: &str) -> HttpResponse {
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no end of head in {raw:?}"));
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {raw:?}"));
    let mut headers = hyper::HeaderMap::new();
    for line in lines {
        let (name, value) = line
            .split_once(':')
            .unwrap_or_else(|| panic!("bad header line {line:?}"));
        headers.append(
            hyper::header::HeaderName::from_bytes(name.trim().as_bytes()).unwrap(),
            value.trim().parse().unwrap(),
        );
    }
    let chunked = headers
        .get("transfer-encoding")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"chunked"));
    let body = if chunked {
        let mut rest = body;
        let mut out = String::new();
        loop {
            let (size, after) = rest.split_once("\r\n").expect("a chunk size");
            let size = usize::from_str_radix(size.trim(), 16).expect("a hexadecimal chunk size");
            if size == 0 {
                break;
            }
            out.push_str(&after[..size]);
            rest = &after[size + 2..];
        }
        out
    } else {
        body.to_owned()
    };
    HttpResponse {
        status,
        headers,
        body,
    }
}

/// Reads until the peer closes (`Ok(bytes)`), within [`crate::STEP`].
pub async fn until_closed(stream: &mut tokio::net::TcpStream) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let step = crate::STEP;
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(step, stream.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => return out,
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Err(_) => panic!("still open after {step:?}"),
        }
    }
}
