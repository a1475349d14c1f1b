//! A TCP proxy on loopback for fault tests: passes bytes through, adds latency, or stalls
//! them (a black hole that holds bytes instead of dropping them, like a partition TCP rides
//! out, so the stream stays intact when traffic flows again).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the proxy does to traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Forward at once.
    None,
    /// Hold every chunk this long before forwarding it.
    Latency(Duration),
    /// Hold everything until the fault changes.
    BlackHole,
}

const BLACK_HOLE: u64 = u64::MAX;

/// A running proxy; stops accepting when dropped.
#[derive(Debug)]
pub struct Proxy {
    /// The port clients connect to.
    pub port: u16,
    /// The fault, encoded: 0 none, `BLACK_HOLE`, else latency in µs.
    fault: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Starts a proxy to `127.0.0.1:upstream` on a free port.
    pub async fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let fault = Arc::new(AtomicU64::new(0));
        let shared = fault.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(pump(cr, sw, shared.clone()));
                tokio::spawn(pump(sr, cw, shared.clone()));
            }
        });
        Proxy { port, fault, task }
    }

    /// `redis://127.0.0.1:{port}`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Changes what happens to traffic from now on (bytes already held stay held until the
    /// new fault lets them go).
    pub fn set(&self, fault: Fault) {
        let code = match fault {
            Fault::None => 0,
            Fault::Latency(d) => (d.as_micros() as u64).clamp(1, BLACK_HOLE - 1),
            Fault::BlackHole => BLACK_HOLE,
        };
        self.fault.store(code, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    fault: Arc<AtomicU64>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        loop {
            match fault.load(Ordering::SeqCst) {
                0 => break,
                BLACK_HOLE => tokio::time::sleep(Duration::from_millis(2)).await,
                micros => {
                    tokio::time::sleep(Duration::from_micros(micros)).await;
                    break;
                }
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
