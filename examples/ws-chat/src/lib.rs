//! A chat server on Flowgate's WebSocket limiter, with a browser page embedded in the binary.
//!
//! ```text
//! cargo run -p example-ws-chat            # listens on 127.0.0.1:3001 (ADDR=… to change)
//! open http://127.0.0.1:3001/?room=lobby  # pick a name; tick "moderator" to skip slowmode
//! ```
//!
//! There is no authentication: the page sends the name and role you pick, and the server
//! believes them. That is enough to show the limits; a real chat would take both from a
//! verified session.
//!
//! Where the limiter sits:
//!
//! * `GET /ws?room=…&user=…&role=moderator`, **before the upgrade**: [`WsLimiter::admit`]
//!   checks the penalty box, concurrent connections per IP and per name, and new connections
//!   per IP; a refusal is an HTTP 429 with `Retry-After` (and the `RateLimit` fields for the
//!   connection rate) instead of a `101 Switching Protocols`.
//! * **Every frame** the client sends goes through [`Session::check`] before the chat acts on
//!   it: the size limit, messages and bytes per connection, then — in the store — messages per
//!   name across tabs, per room, and slowmode per (name, room), from which moderators are
//!   exempt. `typing` costs nothing. A rejected message is not broadcast; the client gets the
//!   limiter's error frame, e.g.
//!   `{"type":"rate_limited","scope":"slowmode","retry_after_ms":1834,"limit":1,"remaining":0}`,
//!   and after too many of those the connection is closed with 4008.
//! * Malformed frames are counted by [`Session::error`]; too many close the connection (1008).
//!
//! The store is in memory. With `flowgate::store::RedisStore` instead, the per-name, per-room
//! and slowmode limits would hold across every instance of the server.

mod config;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Body;
use axum::extract::ws::{CloseFrame, Message as Frame, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::extract::{FromRequestParts, Query, Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use flowgate::answer::problem::Problem;
use flowgate::http::key::{ClientIp, KeyExtractor};
use flowgate::store::MemoryStore;
use flowgate::ws::{Action, Client, Close, MessageInfo, Refusal, Session, WsLimiter};
use http::header::{CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE};
use http::{HeaderValue, StatusCode};
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::broadcast;

pub use config::{Config, MODERATOR};

/// The page, its script and its style sheet, compiled into the binary.
const INDEX_HTML: &str = include_str!("assets/index.html");
const CHAT_JS: &str = include_str!("assets/chat.js");
const CHAT_CSS: &str = include_str!("assets/chat.css");

/// Frames the transport accepts before the limiter sees them; the limiter's own maximum is
/// smaller, so an oversized message gets its 1009 close with a reason.
const TRANSPORT_MAX_MESSAGE: usize = 64 * 1024;

/// Room events a slow member may fall behind by before it misses some.
const ROOM_BACKLOG: usize = 256;

/// How long to wait for the client's reply to our close frame.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// Names and rooms: 1–32 letters, digits, `-`, `_` or `.`.
const MAX_NAME: usize = 32;

/// What every connection shares.
struct Chat {
    /// The limits, before the upgrade and per message.
    limiter: WsLimiter,
    /// Where the per-name, per-room and slowmode counts live.
    store: MemoryStore,
    /// The client's address as a key (IPv6 by /64), believing trusted proxies.
    client_ip: ClientIp,
    /// The limits in words, sent in the welcome frame.
    limits: Vec<String>,
    /// Each room's broadcast channel; a room exists while someone is in it.
    rooms: Mutex<HashMap<String, broadcast::Sender<Utf8Bytes>>>,
}

/// The chat's routes: the page (`/`, `/chat.js`, `/chat.css`) and the socket (`/ws`). Serve it
/// with connect info (`into_make_service_with_connect_info::<SocketAddr>()`), which is where
/// the client's address comes from.
pub fn app(config: &Config) -> Result<Router, flowgate::ws::WsPolicyError> {
    let chat = Arc::new(Chat {
        limiter: config.limiter()?,
        store: MemoryStore::new(),
        client_ip: ClientIp::new(config.trusted_proxies.clone()),
        limits: config.describe(),
        rooms: Mutex::new(HashMap::new()),
    });
    Ok(Router::new()
        .route(
            "/",
            get(|| async { asset(INDEX_HTML, "text/html; charset=utf-8") }),
        )
        .route(
            "/chat.js",
            get(|| async { asset(CHAT_JS, "text/javascript; charset=utf-8") }),
        )
        .route(
            "/chat.css",
            get(|| async { asset(CHAT_CSS, "text/css; charset=utf-8") }),
        )
        .route("/ws", get(upgrade))
        .with_state(chat))
}

/// Serves the chat on `listener` until the task is dropped.
pub async fn run(listener: TcpListener, config: &Config) -> Result<(), Box<dyn std::error::Error>> {
    let app = app(config)?;
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}

/// An embedded file. Scripts and styles only from this origin, sockets only to it.
fn asset(body: &'static str, content_type: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(
        CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'self'; img-src 'self' data:"),
    );
    response
}

/// `/ws?room=lobby&user=ann&role=moderator`.
#[derive(serde::Deserialize)]
struct Join {
    /// The room (default `lobby`).
    room: Option<String>,
    /// The name, as the user typed it (no authentication).
    user: String,
    /// `moderator`, or nothing.
    role: Option<String>,
}

/// Who a connection is, once its query is checked.
#[derive(Debug, Clone)]
struct Member {
    /// The name, which the per-name limits, slowmode and the penalty box count.
    user: String,
    /// `moderator` (exempt from slowmode), or none.
    role: Option<String>,
    /// The room the connection speaks in and hears.
    room: String,
}

impl Join {
    fn member(self) -> Result<Member, &'static str> {
        let room = self
            .room
            .filter(|r| !r.is_empty())
            .unwrap_or_else(|| "lobby".into());
        if !valid_name(&self.user) {
            return Err("the name must be 1-32 letters, digits, '-', '_' or '.'");
        }
        if !valid_name(&room) {
            return Err("the room must be 1-32 letters, digits, '-', '_' or '.'");
        }
        let role = match self.role.as_deref() {
            None | Some("") => None,
            Some(MODERATOR) => Some(MODERATOR.to_owned()),
            Some(_) => return Err("the only role is 'moderator'"),
        };
        Ok(Member {
            user: self.user,
            role,
            room,
        })
    }
}

fn valid_name(name: &str) -> bool {
    (1..=MAX_NAME).contains(&name.chars().count())
        && name
            .chars()
            .all(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// The WebSocket endpoint: check the request, admit it (or answer 429), then upgrade.
async fn upgrade(State(chat): State<Arc<Chat>>, request: Request) -> Response {
    let (mut parts, _body) = request.into_parts();
    // A request that is not a WebSocket handshake is answered before it costs any limit.
    let upgrade = match WebSocketUpgrade::from_request_parts(&mut parts, &chat).await {
        Ok(upgrade) => upgrade,
        Err(rejection) => return rejection.into_response(),
    };
    let member = match Query::<Join>::try_from_uri(&parts.uri) {
        Ok(Query(join)) => join.member(),
        Err(_) => Err("expected ?user=NAME[&room=ROOM][&role=moderator]"),
    };
    let member = match member {
        Ok(member) => member,
        Err(detail) => return problem(Problem::status(StatusCode::BAD_REQUEST, detail)),
    };
    let ip = match chat.client_ip.extract(&parts) {
        Ok(ip) => ip,
        Err(rejection) => return problem(Problem::status(rejection.status, rejection.detail)),
    };
    let mut client = Client::new(ip).user(&member.user).room(&member.room);
    if let Some(role) = &member.role {
        client = client.role(role);
    }
    let session = match chat.limiter.admit(client) {
        Ok(session) => session,
        Err(refusal) => return chat.refused(&refusal),
    };
    upgrade
        .max_message_size(TRANSPORT_MAX_MESSAGE)
        .on_upgrade(move |socket| converse(chat, socket, session, member))
}

fn problem(problem: Problem) -> Response {
    problem.into_response().map(Body::from)
}

impl Chat {
    /// The 429 for a connection refused before the upgrade: `Retry-After`, a problem body
    /// naming the cap, and for the connection rate the `RateLimit` fields.
    fn refused(&self, refusal: &Refusal) -> Response {
        self.limiter.refusal_response(refusal).map(Body::from)
    }

    /// Joins `room`: its sender (to speak) and a receiver (to hear).
    fn join(&self, room: &str) -> (broadcast::Sender<Utf8Bytes>, broadcast::Receiver<Utf8Bytes>) {
        let mut rooms = self.rooms.lock().unwrap_or_else(PoisonError::into_inner);
        let sender = rooms
            .entry(room.to_owned())
            .or_insert_with(|| broadcast::channel(ROOM_BACKLOG).0)
            .clone();
        let receiver = sender.subscribe();
        (sender, receiver)
    }

    /// Forgets `room` when its last member has left.
    fn leave(&self, room: &str, receiver: broadcast::Receiver<Utf8Bytes>) {
        let mut rooms = self.rooms.lock().unwrap_or_else(PoisonError::into_inner);
        drop(receiver);
        if rooms.get(room).is_some_and(|s| s.receiver_count() == 0) {
            rooms.remove(room);
        }
    }
}

/// A message from the page: `{"type":"chat","text":"hi"}` or `{"type":"typing"}`.
#[derive(serde::Deserialize)]
struct Incoming {
    /// What it is: its cost comes from this (`typing` is free).
    #[serde(rename = "type")]
    kind: String,
    /// A chat line's text.
    #[serde(default)]
    text: Option<String>,
}

/// What to do after one frame from the client.
enum Reply {
    /// Nothing for this client (what it said went to the room, if anything).
    Nothing,
    /// Send it this frame.
    Send(Utf8Bytes),
    /// Close the connection with this frame.
    Close(Close),
}

/// One connection, from the upgrade until it closes. Dropping `session` at the end — on every
/// path — gives its place in the connection caps back.
async fn converse(chat: Arc<Chat>, mut socket: WebSocket, mut session: Session, member: Member) {
    let (room, mut hear) = chat.join(&member.room);
    let welcome = json!({
        "type": "welcome",
        "user": member.user,
        "role": member.role,
        "room": member.room,
        "limits": chat.limits,
    });
    if socket.send(Frame::text(welcome.to_string())).await.is_err() {
        chat.leave(&member.room, hear);
        return;
    }
    let _ = room.send(presence(&member, "joined", room.receiver_count()));
    loop {
        // `biased`: deliver what the room said before reading more from this client, so its
        // own accepted messages reach it before the verdicts on the ones after them.
        let reply = tokio::select! {
            biased;
            heard = hear.recv() => match heard {
                Ok(event) => Reply::Send(event),
                Err(broadcast::error::RecvError::Lagged(missed)) => Reply::Send(
                    json!({"type": "missed", "count": missed}).to_string().into(),
                ),
                Err(broadcast::error::RecvError::Closed) => break,
            },
            frame = socket.recv() => match frame {
                Some(Ok(Frame::Text(text))) => {
                    said(&chat, &mut session, &member, &room, &text).await
                }
                Some(Ok(Frame::Binary(bytes))) => {
                    judge(&chat, &mut session, MessageInfo::new(bytes.len()), |session| {
                        malformed(session, "binary frames are not understood")
                    })
                    .await
                }
                Some(Ok(Frame::Ping(_) | Frame::Pong(_))) => Reply::Nothing,
                Some(Ok(Frame::Close(_)) | Err(_)) | None => break,
            },
        };
        match reply {
            Reply::Nothing => {}
            Reply::Send(frame) => {
                if socket.send(Frame::Text(frame)).await.is_err() {
                    break;
                }
            }
            Reply::Close(close) => {
                close_with(&mut socket, close).await;
                break;
            }
        }
    }
    drop(session);
    chat.leave(&member.room, hear);
    let _ = room.send(presence(&member, "left", room.receiver_count()));
}

/// Judges a text frame, then acts on it: a chat line or a typing notice goes to the room.
async fn said(
    chat: &Chat,
    session: &mut Session,
    member: &Member,
    room: &broadcast::Sender<Utf8Bytes>,
    text: &str,
) -> Reply {
    let incoming: Option<Incoming> = serde_json::from_str(text).ok();
    let mut message = MessageInfo::new(text.len());
    message.kind = incoming.as_ref().map(|i| i.kind.as_str());
    judge(chat, session, message, |session| {
        let said = incoming
            .as_ref()
            .map(|i| (i.kind.as_str(), i.text.as_deref()));
        let event = match said {
            Some(("chat", Some(line))) if !line.trim().is_empty() => json!({
                "type": "chat",
                "user": member.user,
                "role": member.role,
                "text": line.trim(),
                "at": unix_ms(),
            }),
            Some(("chat", _)) => return malformed(session, "a chat message needs some text"),
            Some(("typing", _)) => json!({"type": "typing", "user": member.user}),
            _ => {
                return malformed(
                    session,
                    r#"expected {"type":"chat","text":"…"} or {"type":"typing"}"#,
                );
            }
        };
        // Nobody listening is not an error: the room is just this connection, leaving.
        let _ = room.send(event.to_string().into());
        Reply::Nothing
    })
    .await
}

/// Asks the limiter about `message`; only if it may go on does `act` run.
async fn judge(
    chat: &Chat,
    session: &mut Session,
    message: MessageInfo<'_>,
    act: impl FnOnce(&mut Session) -> Reply,
) -> Reply {
    match session.check(&chat.store, &message).await {
        Action::Forward => act(session),
        Action::Reject(rejection) => Reply::Send(chat.limiter.error_frame(&rejection).into()),
        Action::Close(close) => Reply::Close(close),
        // A verdict this chat does not know: the message is not delivered.
        _ => Reply::Nothing,
    }
}

/// A frame the chat does not understand: an error frame, or the close when there were too many.
fn malformed(session: &mut Session, why: &str) -> Reply {
    match session.error() {
        Some(close) => Reply::Close(close),
        None => Reply::Send(json!({"type": "error", "message": why}).to_string().into()),
    }
}

/// Sends the close frame and waits (briefly) for the client's, as the closing handshake asks.
async fn close_with(socket: &mut WebSocket, close: Close) {
    let frame = CloseFrame {
        code: close.code,
        reason: close.reason.into(),
    };
    if socket.send(Frame::Close(Some(frame))).await.is_err() {
        return;
    }
    let _ = tokio::time::timeout(CLOSE_GRACE, async {
        while let Some(Ok(frame)) = socket.recv().await {
            if matches!(frame, Frame::Close(_)) {
                break;
            }
        }
    })
    .await;
}

fn presence(member: &Member, event: &str, online: usize) -> Utf8Bytes {
    json!({
        "type": "presence",
        "event": event,
        "user": member.user,
        "role": member.role,
        "online": online,
    })
    .to_string()
    .into()
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
