//! A diagnosis for `callgrind.sh` (`PROXIES=hyper-floor`), not a result: hyper's HTTP/1 server
//! alone, configured as the gateway's listener configures it (a `TokioTimer`, the default
//! header read timeout and head size limit, `TCP_NODELAY`), answering `ok` from memory on a
//! current-thread runtime — the floor under the gateway's own request path, to set beside
//! nginx answering `return 200 "ok"` (`PROXIES=nginx-floor`).
//!
//! `hyper_floor ADDR` serves until it is interrupted (SIGINT or SIGTERM).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark tool

use std::convert::Infallible;

use bytes::Bytes;
use flowgate_server::listen::{ListenLimits, configure};
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::signal::unix::{SignalKind, signal};

fn main() {
    let addr = std::env::args().nth(1).expect("usage: hyper_floor ADDR");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(&addr).await.unwrap();
        let mut interrupt = signal(SignalKind::interrupt()).unwrap();
        let mut terminate = signal(SignalKind::terminate()).unwrap();
        loop {
            let (stream, _) = tokio::select! {
                _ = interrupt.recv() => break,
                _ = terminate.recv() => break,
                accepted = listener.accept() => accepted.unwrap(),
            };
            let _ = stream.set_nodelay(true);
            let mut http = http1::Builder::new();
            http.timer(TokioTimer::new());
            configure(&mut http, ListenLimits::default());
            let ok = service_fn(|_request| async {
                Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from_static(b"ok"))))
            });
            tokio::spawn(http.serve_connection(TokioIo::new(stream), ok));
        }
    });
}
