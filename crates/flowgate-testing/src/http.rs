//! Raw HTTP/1.1 exchanges over fresh loopback connections: what a client sees on the wire,
//! with no client library in between.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

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

/// Writes `request` on a new connection and reads until the server closes it.
fn exchange(addr: SocketAddr, request: &str) -> Option<String> {
    let mut conn = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    conn.write_all(request.as_bytes()).ok()?;
    let mut response = String::new();
    conn.read_to_string(&mut response).ok()?;
    Some(response)
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
