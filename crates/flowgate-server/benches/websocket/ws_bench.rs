//! The WebSocket gateway benchmark's programs (run by `run.sh` beside this file):
//!
//! * `ws_bench echo ADDR` — a WebSocket echo server (tokio-tungstenite; `THREADS` workers,
//!   default 1);
//! * `ws_bench load URL CONNS SECONDS SIZE [RATE]` — CONNS connections each send a SIZE-byte
//!   text message and wait for its echo; without RATE as fast as they can (closed loop), with
//!   RATE messages per second in all, paced per connection (below saturation). Prints
//!   `messages=… rate=…/s p50_us=… p99_us=…`;
//! * `ws_bench idle URL N SECONDS` — opens N connections, prints `ready`, holds them for
//!   SECONDS, then closes them.
//!
//! Every loop is bounded by its count or its duration; only loopback addresses are used.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // a benchmark tool

use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::Message;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let threads = std::env::var("THREADS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(1);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .unwrap();
    let arg = |i: usize| args.get(i).cloned().unwrap_or_default();
    match arg(0).as_str() {
        "echo" => runtime.block_on(echo(arg(1))),
        "load" => runtime.block_on(load(
            arg(1),
            arg(2).parse().unwrap(),
            arg(3).parse().unwrap(),
            arg(4).parse().unwrap(),
            args.get(5).map(|r| r.parse().unwrap()),
        )),
        "idle" => runtime.block_on(idle(
            arg(1),
            arg(2).parse().unwrap(),
            arg(3).parse().unwrap(),
        )),
        _ => {
            eprintln!(
                "usage: ws_bench echo ADDR | load URL CONNS SECONDS SIZE [RATE] | idle URL N SECONDS"
            );
            std::process::exit(2);
        }
    }
}

async fn echo(addr: String) {
    let listener = TcpListener::bind(&addr).await.unwrap();
    // Exit normally on SIGTERM, so that a profiler running it writes its data.
    let mut term =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).unwrap();
    loop {
        let accepted = tokio::select! {
            _ = term.recv() => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((stream, _)) = accepted else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            // A 4 KiB read buffer: the library's default (128 KiB) is zero-filled on every
            // read and would make this upstream, not the gateway, the bottleneck.
            let config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
                .read_buffer_size(4096);
            let Ok(mut ws) =
                tokio_tungstenite::accept_async_with_config(stream, Some(config)).await
            else {
                return;
            };
            while let Some(Ok(message)) = ws.next().await {
                if message.is_close() {
                    return;
                }
                if (message.is_text() || message.is_binary()) && ws.send(message).await.is_err() {
                    return;
                }
            }
        });
    }
}

async fn dial(url: &str) -> tokio_tungstenite::WebSocketStream<TcpStream> {
    let host = url
        .trim_start_matches("ws://")
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    for attempt in 0..50 {
        match TcpStream::connect(&host).await {
            Ok(tcp) => {
                let _ = tcp.set_nodelay(true);
                let config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
                    .read_buffer_size(4096);
                match tokio_tungstenite::client_async_with_config(url, tcp, Some(config)).await {
                    Ok((ws, _)) => return ws,
                    Err(e) if attempt == 49 => panic!("cannot open {url}: {e}"),
                    Err(_) => {}
                }
            }
            Err(e) if attempt == 49 => panic!("cannot connect to {host}: {e}"),
            Err(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    unreachable!()
}

async fn load(url: String, conns: usize, seconds: u64, size: usize, rate: Option<f64>) {
    let mut sockets = Vec::with_capacity(conns);
    for _ in 0..conns {
        sockets.push(dial(&url).await);
    }
    let payload = "x".repeat(size);
    let started = Instant::now();
    let until = started + Duration::from_secs(seconds);
    let interval = rate.map(|r| Duration::from_secs_f64(conns as f64 / r));
    let mut tasks = Vec::new();
    for (i, mut ws) in sockets.into_iter().enumerate() {
        let payload = payload.clone();
        tasks.push(tokio::spawn(async move {
            let mut histogram = hdrhistogram::Histogram::<u64>::new(3).unwrap();
            let mut ticks = interval.map(|every| {
                // Spread the connections' sends over one interval.
                let offset = every.mul_f64(i as f64 / conns as f64);
                tokio::time::interval_at(tokio::time::Instant::now() + offset, every)
            });
            while Instant::now() < until {
                if let Some(ticks) = ticks.as_mut() {
                    ticks.tick().await;
                }
                let sent = Instant::now();
                if ws.send(Message::text(payload.clone())).await.is_err() {
                    break;
                }
                loop {
                    match ws.next().await {
                        Some(Ok(Message::Text(_) | Message::Binary(_))) => break,
                        Some(Ok(_)) => continue,
                        _ => return histogram,
                    }
                }
                let _ = histogram.record(sent.elapsed().as_micros() as u64);
            }
            let _ = ws.close(None).await;
            histogram
        }));
    }
    let mut all = hdrhistogram::Histogram::<u64>::new(3).unwrap();
    for task in tasks {
        all.add(task.await.unwrap()).unwrap();
    }
    let elapsed = started.elapsed().as_secs_f64();
    println!(
        "messages={} rate={:.0}/s p50_us={} p99_us={}",
        all.len(),
        all.len() as f64 / elapsed,
        all.value_at_quantile(0.5),
        all.value_at_quantile(0.99)
    );
}

async fn idle(url: String, n: usize, seconds: u64) {
    let mut sockets = Vec::with_capacity(n);
    for _ in 0..n {
        sockets.push(dial(&url).await);
    }
    println!("ready");
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    drop(sockets);
}
