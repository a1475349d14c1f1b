//! A real WebSocket echo upstream (tokio-tungstenite) and real WebSocket clients for the
//! WebSocket gateway's tests.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures_util::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

pub use crate::STEP;

/// A WebSocket echo server on 127.0.0.1:0. It echoes text and binary messages, except
/// `flood:N:SIZE`, which it answers with N binary messages of SIZE bytes. It counts the
/// messages it received.
pub struct EchoUpstream {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Text and binary messages received so far.
    pub received: Arc<AtomicUsize>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl EchoUpstream {
    /// Starts it on 127.0.0.1:0.
    pub async fn start() -> EchoUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let received = Arc::new(AtomicUsize::new(0));
        let counted = received.clone();
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            loop {
                let (stream, _) = tokio::select! {
                    _ = &mut stopped => return,
                    accepted = listener.accept() => accepted.unwrap(),
                };
                let counted = counted.clone();
                tokio::spawn(async move {
                    let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else {
                        return;
                    };
                    while let Some(Ok(message)) = ws.next().await {
                        match message {
                            Message::Text(text) => {
                                counted.fetch_add(1, Ordering::SeqCst);
                                if let Some(rest) = text.strip_prefix("flood:") {
                                    let (n, size) = rest.split_once(':').unwrap();
                                    let (n, size): (usize, usize) =
                                        (n.parse().unwrap(), size.parse().unwrap());
                                    let payload = bytes::Bytes::from(vec![7u8; size]);
                                    for _ in 0..n {
                                        if ws.feed(Message::Binary(payload.clone())).await.is_err()
                                        {
                                            return;
                                        }
                                    }
                                    let _ = ws.flush().await;
                                } else if ws.send(Message::Text(text)).await.is_err() {
                                    return;
                                }
                            }
                            Message::Binary(b) => {
                                counted.fetch_add(1, Ordering::SeqCst);
                                if ws.send(Message::Binary(b)).await.is_err() {
                                    return;
                                }
                            }
                            Message::Close(_) => return,
                            _ => {}
                        }
                    }
                });
            }
        });
        EchoUpstream {
            addr,
            received,
            _stop: stop,
        }
    }

    /// `ws://ADDR`.
    pub fn url(&self) -> String {
        format!("ws://{}", self.addr)
    }
}

/// A client's WebSocket connection.
pub type Ws = WebSocketStream<TcpStream>;

/// Connects to the gateway at `addr` with `path` and extra `headers`; the HTTP status and
/// headers of a refusal otherwise.
pub async fn connect(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<Ws, (u16, http::HeaderMap)> {
    let mut request = format!("ws://{addr}{path}").into_client_request().unwrap();
    for (k, v) in headers {
        request.headers_mut().insert(
            http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    let tcp = TcpStream::connect(addr).await.unwrap();
    let connected = tokio::time::timeout(STEP, tokio_tungstenite::client_async(request, tcp))
        .await
        .expect("the handshake ends within the step");
    match connected {
        Ok((ws, _)) => Ok(ws),
        Err(WsError::Http(response)) => {
            Err((response.status().as_u16(), response.headers().clone()))
        }
        Err(e) => panic!("handshake failed: {e}"),
    }
}

/// [`connect`], which must succeed.
pub async fn open(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Ws {
    match connect(addr, path, headers).await {
        Ok(ws) => ws,
        Err((status, _)) => panic!("the upgrade was refused with {status}"),
    }
}

/// What a client read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Got {
    /// A text message.
    Text(String),
    /// A binary message of this many bytes.
    Binary(usize),
    /// A close frame: code and reason.
    Close(u16, String),
    /// The connection ended without a close frame.
    End,
}

/// The next data or close message (pings and pongs skipped).
pub async fn next(ws: &mut Ws) -> Got {
    loop {
        let read = tokio::time::timeout(STEP, ws.next())
            .await
            .expect("a message within the step");
        return match read {
            Some(Ok(Message::Text(t))) => Got::Text(t.to_string()),
            Some(Ok(Message::Binary(b))) => Got::Binary(b.len()),
            Some(Ok(Message::Close(Some(f)))) => {
                Got::Close(u16::from(f.code), f.reason.to_string())
            }
            Some(Ok(Message::Close(None))) => {
                Got::Close(u16::from(CloseCode::Status), String::new())
            }
            Some(Ok(_)) => continue,
            Some(Err(_)) | None => Got::End,
        };
    }
}

/// Sends a text message.
pub async fn send(ws: &mut Ws, text: &str) {
    ws.send(Message::text(text.to_owned())).await.unwrap();
}

/// Sends a text message to a server that may have closed the connection meanwhile (a client
/// that keeps sending after its close code): whether it could be sent.
pub async fn try_send(ws: &mut Ws, text: &str) -> bool {
    ws.send(Message::text(text.to_owned())).await.is_ok()
}

/// Whether `got` is an error frame of `scope`.
pub fn is_error_frame(got: &Got, scope: &str) -> bool {
    match got {
        Got::Text(t) => {
            let v: serde_json::Value = match serde_json::from_str(t) {
                Ok(v) => v,
                Err(_) => return false,
            };
            v["type"] == "rate_limited" && v["scope"] == scope
        }
        _ => false,
    }
}
