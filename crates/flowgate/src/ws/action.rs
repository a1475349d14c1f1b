//! What becomes of a WebSocket message or connection: [`Action`], the [`Scope`] that decided,
//! the error frame a rejected message gets, and the close frames.

use std::fmt::Write as _;
use std::time::Duration;

/// Which layer decided. Its [`name`](Scope::name) is how error frames, configuration
/// (`dry_run`), metrics and the HTTP answer to a refused upgrade (`RateLimit-Policy:
/// "connect";…`) call it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Scope {
    /// New connections per client (IP) per time, before the upgrade.
    Connect,
    /// Concurrent connections per client IP, before the upgrade.
    ConcurrentIp,
    /// Concurrent connections per user, before the upgrade.
    ConcurrentUser,
    /// The node's connection cap, before the upgrade.
    Node,
    /// The penalty box: a client closed for violations too often, refused for a while.
    Penalty,
    /// Messages per connection.
    Connection,
    /// Bytes per connection.
    Bytes,
    /// Messages per user, across all of the user's connections (and instances, with a shared
    /// store).
    User,
    /// Messages per room, from all its members.
    Room,
    /// Slowmode: one message per interval per user and room.
    Slowmode,
    /// Protocol or application errors per connection.
    Errors,
    /// The maximum message size.
    Size,
}

impl Scope {
    /// Every scope, in a fixed order (for metrics).
    pub const ALL: [Scope; 12] = [
        Scope::Connect,
        Scope::ConcurrentIp,
        Scope::ConcurrentUser,
        Scope::Node,
        Scope::Penalty,
        Scope::Connection,
        Scope::Bytes,
        Scope::User,
        Scope::Room,
        Scope::Slowmode,
        Scope::Errors,
        Scope::Size,
    ];

    /// The scope's name in error frames, configuration and metrics: `connection`, `user`, …
    pub const fn name(self) -> &'static str {
        match self {
            Scope::Connect => "connect",
            Scope::ConcurrentIp => "concurrent_ip",
            Scope::ConcurrentUser => "concurrent_user",
            Scope::Node => "node",
            Scope::Penalty => "penalty",
            Scope::Connection => "connection",
            Scope::Bytes => "bytes",
            Scope::User => "user",
            Scope::Room => "room",
            Scope::Slowmode => "slowmode",
            Scope::Errors => "errors",
            Scope::Size => "size",
        }
    }

    /// Its position in [`Scope::ALL`].
    pub(crate) const fn index(self) -> usize {
        self as usize
    }
}

/// A name that is not a [`Scope`]'s.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown layer `{0}`; expected one of connect, concurrent_ip, concurrent_user, node, penalty, connection, bytes, user, room, slowmode, errors, size"
)]
pub struct UnknownScope(pub String);

impl std::str::FromStr for Scope {
    type Err = UnknownScope;

    /// The scope [`named`](Scope::name) `name`.
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Scope::ALL
            .into_iter()
            .find(|s| s.name() == name)
            .ok_or_else(|| UnknownScope(name.to_owned()))
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for Scope {
    /// Its [`name`](Scope::name).
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

/// A message over a limit: not forwarded; the client gets an error frame it can act on and the
/// connection stays open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// The layer that refused.
    pub scope: Scope,
    /// When the same message would be allowed (zero when it can never fit).
    pub retry_after: Duration,
    /// The layer's limit (units per period).
    pub limit: u64,
    /// Units left in the layer.
    pub remaining: u64,
}

/// WebSocket close codes Flowgate sends (RFC 6455 §7.4.1).
pub mod close_code {
    /// 1008: the client violated the policy (the default for repeated rate-limit violations;
    /// Discord uses 4008, configurable).
    pub const POLICY_VIOLATION: u16 = 1008;
    /// 1009: a message was too big to process.
    pub const MESSAGE_TOO_BIG: u16 = 1009;
    /// 1011: the server failed.
    pub const INTERNAL_ERROR: u16 = 1011;
    /// 1013: try again later (the node sheds load, or the client cannot keep up).
    pub const TRY_AGAIN_LATER: u16 = 1013;
}

/// Longest close reason a close frame can carry (125 bytes of payload minus the 2-byte code).
pub const MAX_CLOSE_REASON: usize = 123;

/// A close frame to send before closing the connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Close {
    /// The layer that closed the connection.
    pub scope: Scope,
    /// The close code.
    pub code: u16,
    /// The reason (at most [`MAX_CLOSE_REASON`] bytes of UTF-8).
    pub reason: String,
}

impl Close {
    /// A close frame, its reason cut to [`MAX_CLOSE_REASON`] bytes at a character boundary.
    pub fn new(scope: Scope, code: u16, reason: &str) -> Self {
        let mut end = reason.len().min(MAX_CLOSE_REASON);
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        Close {
            scope,
            code,
            reason: reason[..end].to_owned(),
        }
    }
}

/// What to do with one message.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a verdict says whether to forward, reject or close"]
#[non_exhaustive]
pub enum Action {
    /// Forward it (every enforced layer allows it, or it releases resources, or a dry run
    /// would have rejected it).
    Forward,
    /// Do not forward it; send the client the error frame ([`ErrorFrame::render`]).
    Reject(Rejection),
    /// Close the connection with this frame (the message is not forwarded).
    Close(Close),
}

/// Whether `code` may be sent in a close frame: 1000–1003, 1007–1011, 1012–1014 and the
/// application range 3000–4999 (RFC 6455 §7.4; 1004–1006 and 1015 are reserved).
pub fn is_valid_close_code(code: u16) -> bool {
    matches!(code, 1000..=1003 | 1007..=1014 | 3000..=4999)
}

/// The error frame a rejected message gets: a text frame from a template with the placeholders
/// `{scope}`, `{retry_after_ms}`, `{limit}` and `{remaining}`. The default:
///
/// ```text
/// {"type":"rate_limited","scope":"user","retry_after_ms":1500,"limit":20,"remaining":0}
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorFrame {
    /// The template, split at its placeholders.
    parts: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Scope,
    RetryAfterMs,
    Limit,
    Remaining,
}

/// Why an error frame template was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown placeholder `{{{0}}}` in the error frame; use scope, retry_after_ms, limit or remaining"
)]
pub struct UnknownPlaceholder(pub String);

impl Default for ErrorFrame {
    fn default() -> Self {
        // The default template uses only known placeholders.
        ErrorFrame::template(
            r#"{"type":"rate_limited","scope":"{scope}","retry_after_ms":{retry_after_ms},"limit":{limit},"remaining":{remaining}}"#,
        )
        .unwrap_or(ErrorFrame { parts: Vec::new() })
    }
}

impl ErrorFrame {
    /// A frame from `template`; `{name}` is a placeholder when `name` is one of the four, and
    /// text otherwise only if it does not look like one (`{"` starts JSON, not a placeholder).
    ///
    /// ```
    /// use flowgate::ws::{ErrorFrame, Rejection, Scope};
    /// let frame = ErrorFrame::template(r#"{"op":429,"d":{"retry_after":{retry_after_ms}}}"#)?;
    /// let rejection = Rejection { scope: Scope::User, retry_after: std::time::Duration::from_millis(1500), limit: 20, remaining: 0 };
    /// assert_eq!(frame.render(&rejection), r#"{"op":429,"d":{"retry_after":1500}}"#);
    /// # Ok::<(), flowgate::ws::UnknownPlaceholder>(())
    /// ```
    pub fn template(template: &str) -> Result<Self, UnknownPlaceholder> {
        let mut parts = Vec::new();
        let mut text = String::new();
        let mut rest = template;
        while let Some(start) = rest.find('{') {
            let after = &rest[start + 1..];
            let name_len = after
                .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
                .unwrap_or(after.len());
            let is_placeholder = name_len > 0 && after[name_len..].starts_with('}');
            if !is_placeholder {
                text.push_str(&rest[..=start]);
                rest = after;
                continue;
            }
            text.push_str(&rest[..start]);
            let part = match &after[..name_len] {
                "scope" => Part::Scope,
                "retry_after_ms" => Part::RetryAfterMs,
                "limit" => Part::Limit,
                "remaining" => Part::Remaining,
                other => return Err(UnknownPlaceholder(other.to_owned())),
            };
            if !text.is_empty() {
                parts.push(Part::Text(std::mem::take(&mut text)));
            }
            parts.push(part);
            rest = &after[name_len + 1..];
        }
        text.push_str(rest);
        if !text.is_empty() {
            parts.push(Part::Text(text));
        }
        Ok(ErrorFrame { parts })
    }

    /// The frame's text for `rejection`.
    pub fn render(&self, rejection: &Rejection) -> String {
        let mut out = String::with_capacity(96);
        for part in &self.parts {
            // Writing to a String cannot fail.
            let _ = match part {
                Part::Text(text) => {
                    out.push_str(text);
                    Ok(())
                }
                Part::Scope => {
                    out.push_str(rejection.scope.name());
                    Ok(())
                }
                Part::RetryAfterMs => write!(out, "{}", ceil_millis(rejection.retry_after)),
                Part::Limit => write!(out, "{}", rejection.limit),
                Part::Remaining => write!(out, "{}", rejection.remaining),
            };
        }
        out
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for ErrorFrame {
    /// Its template ([`ErrorFrame::template`]).
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let template = String::deserialize(deserializer)?;
        ErrorFrame::template(&template).map_err(serde::de::Error::custom)
    }
}

/// `d` in whole milliseconds, rounded up (a client told 0 would retry at once).
fn ceil_millis(d: Duration) -> u128 {
    d.as_nanos().div_ceil(1_000_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_frame_is_json_with_every_field() {
        let rejection = Rejection {
            scope: Scope::Slowmode,
            retry_after: Duration::from_micros(1_500_001),
            limit: 1,
            remaining: 0,
        };
        let text = ErrorFrame::default().render(&rejection);
        assert_eq!(
            text,
            r#"{"type":"rate_limited","scope":"slowmode","retry_after_ms":1501,"limit":1,"remaining":0}"#
        );
        let parsed: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(parsed["retry_after_ms"], 1501);
        assert_eq!(
            ErrorFrame::template("{nope}"),
            Err(UnknownPlaceholder("nope".into()))
        );
        assert_eq!(ErrorFrame::template("x{").unwrap().render(&rejection), "x{");
    }

    #[test]
    fn scopes_parse_from_their_names() {
        for scope in Scope::ALL {
            assert_eq!(scope.name().parse::<Scope>(), Ok(scope));
            assert!(
                UnknownScope(String::new())
                    .to_string()
                    .contains(scope.name())
            );
        }
        assert!("ws_connect".parse::<Scope>().is_err());
    }

    #[test]
    fn close_reasons_are_cut_at_a_character_boundary() {
        let close = Close::new(Scope::Connection, 4008, &"é".repeat(100));
        assert!(close.reason.len() <= MAX_CLOSE_REASON);
        assert_eq!(close.reason.len(), 122);
        assert!(is_valid_close_code(4008) && is_valid_close_code(1008));
        assert!(
            !is_valid_close_code(1005) && !is_valid_close_code(999) && !is_valid_close_code(5000)
        );
    }
}
