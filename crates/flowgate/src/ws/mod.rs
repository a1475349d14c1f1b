//! Real-time limits for WebSocket (feature `ws`): per connection, per IP, per user across
//! connections and instances, per room, slowmode, roles, message costs — transport-agnostic.
//!
//! After the upgrade every proxy people use is blind: Envoy does not frame WebSocket, nginx
//! and Cloudflare limit only the upgrade request, tower layers never see a message. This module
//! is the missing piece, in the shape of a message-in, verdict-out core that any WebSocket
//! library plugs into (axum's, tokio-tungstenite, fastwebsockets…):
//!
//! 1. **Before the upgrade**, [`WsLimiter::admit`] checks the penalty box, the node's
//!    connection cap, concurrent connections per IP and per user, and new connections per IP;
//!    a [`Refusal`] is answered with HTTP 429 and `Retry-After` instead of upgrading.
//! 2. **Each message** goes through [`Session::check`]: the maximum size (a close with 1009),
//!    messages per connection (a token bucket, e.g. Discord's 120 / 60 s; quotas per role),
//!    bytes per connection, then — in a [`Store`](crate::store::Store), so they hold across a
//!    user's connections and, with Redis, across instances — messages per user (per role:
//!    Twitch's 20 / 30 s for users, 100 for moderators), per room, and slowmode per user and
//!    room (roles can be exempt). A message's cost comes from its type (`subscribe` 5, `ping`
//!    0, default 1) or from the message itself ([`Classifier`]: JSON pointers).
//! 3. **The verdict ladder**: a message over a limit is not forwarded and the client gets an
//!    error frame it can act on ([`ErrorFrame`], e.g.
//!    `{"type":"rate_limited","scope":"user","retry_after_ms":1500,"limit":20,"remaining":0}`);
//!    once K rejections within a window have been answered with error frames, the next
//!    violation — or a rate at a multiple of the connection's quota — closes the connection
//!    with 1008 (code and reason configurable, e.g. 4008); the penalty box then refuses
//!    the client's upgrades for a time that doubles with each repeat. Messages that release
//!    resources (`unsubscribe`, `leave`) are counted and never rejected; every layer can be a
//!    dry run that counts exactly as enforcement would.
//! 4. **Errors**: [`Session::error`] counts protocol and application errors; too many close
//!    the connection.
//!
//! A message passes only if every layer allows it, and units taken from the layers that
//! allowed are given back when another rejects — so a rejected message consumes nothing.
//! Dropping a [`Session`] (on any disconnect path) releases everything it held.
//!
//! **Across instances.** With the Redis store, the user, room and slowmode layers are one
//! counter per user / room / (room, user) in Redis, checked atomically by every instance: ten
//! servers enforce one per-user limit of 100 messages per minute exactly, because each asks
//! Redis for each message. The per-connection layers are checked in memory first: a message
//! they reject never costs a Redis call, which keeps Redis load down without loosening any
//! bound (they only ever reject more).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use flowgate::{store::MemoryStore, ws::{Client, MessageInfo, Action, WsLimiter}, Quota};
//!
//! let limiter = WsLimiter::builder()
//!     .messages(Quota::new(120, Duration::from_secs(60))?)
//!     .slowmode(Duration::from_secs(3))
//!     .slowmode_exempt("moderator")
//!     .build()?;
//! let store = MemoryStore::new();
//! let mut ann = limiter.admit(Client::new("192.0.2.1").user("ann").room("lobby"))?;
//! let hello = MessageInfo::new(5).kind("chat");
//! assert_eq!(ann.check(&store, &hello).await, Action::Forward);
//! // Slowmode: a second message within 3 s is rejected with an error frame.
//! let Action::Reject(rejection) = ann.check(&store, &hello).await else { unreachable!() };
//! assert_eq!(rejection.scope.name(), "slowmode");
//! # Ok(()) }
//! ```

mod action;
mod limiter;
mod message;
mod penalty;
mod policy;
#[cfg(feature = "tower")]
mod refusal;
mod stats;

pub use action::{
    Action, Close, ErrorFrame, MAX_CLOSE_REASON, Rejection, Scope, UnknownPlaceholder, close_code,
    is_valid_close_code,
};
pub use limiter::{Checked, Client, Pending, Refusal, Session, WsLimiter};
pub use message::{Classified, Classifier, Costs, MessageInfo};
pub use penalty::PenaltyConfig;
pub use policy::{CloseAfter, WsLimiterBuilder, WsPolicy, WsPolicyError};
pub use stats::{LayerDecision, SIZE_BUCKETS, WsStats, WsStatsSnapshot};
