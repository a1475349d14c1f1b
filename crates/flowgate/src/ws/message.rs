//! What the limiter needs to know about a message ([`MessageInfo`]), and reading it from a JSON
//! message with JSON pointers ([`Classifier`]).

use std::collections::{HashMap, HashSet};

/// One message as the limiter sees it. Build it yourself (any protocol), or read it from JSON
/// with a [`Classifier`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MessageInfo<'a> {
    /// The message's type (`subscribe`, `ping`, `chat`), which picks its cost and whether it
    /// releases resources.
    pub kind: Option<&'a str>,
    /// Its size in bytes (the payload), for the bytes layer and the size limit.
    pub size: usize,
    /// Its cost, when the message itself says (e.g. a count of symbols); otherwise the cost of
    /// its type.
    pub cost: Option<u64>,
    /// The room it goes to, when the message names one; otherwise the session's.
    pub room: Option<&'a str>,
}

impl<'a> MessageInfo<'a> {
    /// A message of `size` bytes and no type.
    pub fn new(size: usize) -> Self {
        MessageInfo {
            size,
            ..MessageInfo::default()
        }
    }

    /// The same, of type `kind`.
    pub fn kind(mut self, kind: &'a str) -> Self {
        self.kind = Some(kind);
        self
    }

    /// The same, to `room`.
    pub fn room(mut self, room: &'a str) -> Self {
        self.room = Some(room);
        self
    }

    /// The same, costing `cost`.
    pub fn cost(mut self, cost: u64) -> Self {
        self.cost = Some(cost);
        self
    }
}

/// Costs by message type, and the types that release resources (counted, never rejected).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Costs {
    /// Cost of each listed type.
    by_kind: HashMap<String, u64>,
    /// Cost of every other message.
    default: u64,
    /// Types that release resources (`unsubscribe`, `leave`).
    release: HashSet<String>,
}

impl Default for Costs {
    fn default() -> Self {
        Costs {
            by_kind: HashMap::new(),
            default: 1,
            release: HashSet::new(),
        }
    }
}

impl Costs {
    /// Sets the cost of messages of type `kind` (0: free, like a ping).
    pub(crate) fn set(&mut self, kind: impl Into<String>, cost: u64) {
        self.by_kind.insert(kind.into(), cost);
    }

    /// Sets the cost of messages of no listed type.
    pub(crate) fn set_default(&mut self, cost: u64) {
        self.default = cost;
    }

    /// Marks `kind` as releasing resources.
    pub(crate) fn release(&mut self, kind: impl Into<String>) {
        self.release.insert(kind.into());
    }

    /// The cost of `message`: its own (a cost the message carries, e.g. read by a
    /// [`Classifier`] at `classify.cost`, wins over its type's), else its type's, else the
    /// default.
    pub fn cost_of(&self, message: &MessageInfo<'_>) -> u64 {
        message.cost.unwrap_or_else(|| {
            message
                .kind
                .and_then(|k| self.by_kind.get(k).copied())
                .unwrap_or(self.default)
        })
    }

    /// Whether `message` releases resources (counted, never rejected).
    pub fn releases(&self, message: &MessageInfo<'_>) -> bool {
        message.kind.is_some_and(|k| self.release.contains(k))
    }
}

/// Reads a JSON message's type, cost and room with JSON pointers (RFC 6901), e.g. type at
/// `/type`, room at `/room`, cost at `/symbols` — a number is the cost, an array costs its
/// length. A message that is not JSON, or lacks a field, simply has no type, cost or room.
///
/// ```
/// use flowgate::ws::Classifier;
/// let classifier = Classifier::new().kind_at("/op").cost_at("/args").room_at("/channel");
/// let read = classifier.classify(br#"{"op":"subscribe","args":["a","b","c"],"channel":"btc"}"#);
/// let message = read.message(64);
/// assert_eq!((message.kind, message.cost, message.room), (Some("subscribe"), Some(3), Some("btc")));
/// assert_eq!(classifier.classify(b"not json").message(8).kind, None);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Classifier {
    kind: Option<String>,
    cost: Option<String>,
    room: Option<String>,
}

/// A message as a [`Classifier`] read it; [`message`](Self::message) lends it as a
/// [`MessageInfo`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Classified {
    /// The type, if found (a string; numbers are written in decimal).
    pub kind: Option<String>,
    /// The cost, if found.
    pub cost: Option<u64>,
    /// The room, if found.
    pub room: Option<String>,
}

impl Classified {
    /// The message of `size` bytes these fields describe.
    pub fn message(&self, size: usize) -> MessageInfo<'_> {
        MessageInfo {
            kind: self.kind.as_deref(),
            size,
            cost: self.cost,
            room: self.room.as_deref(),
        }
    }
}

impl Classifier {
    /// A classifier that reads nothing (every message has the default cost).
    pub fn new() -> Self {
        Classifier::default()
    }

    /// Reads the type at `pointer` (e.g. `/type`).
    pub fn kind_at(mut self, pointer: impl Into<String>) -> Self {
        self.kind = Some(pointer.into());
        self
    }

    /// Reads the cost at `pointer`: a non-negative integer, or an array (its length).
    pub fn cost_at(mut self, pointer: impl Into<String>) -> Self {
        self.cost = Some(pointer.into());
        self
    }

    /// Reads the room at `pointer`.
    pub fn room_at(mut self, pointer: impl Into<String>) -> Self {
        self.room = Some(pointer.into());
        self
    }

    /// Whether it reads anything at all (if not, messages need not be parsed).
    pub fn is_empty(&self) -> bool {
        self.kind.is_none() && self.cost.is_none() && self.room.is_none()
    }

    /// Reads `payload` (parsed only if some pointer is set and it looks like a JSON object).
    pub fn classify(&self, payload: &[u8]) -> Classified {
        if self.is_empty() {
            return Classified::default();
        }
        let starts_like_json = payload
            .iter()
            .find(|b| !b.is_ascii_whitespace())
            .is_some_and(|b| matches!(b, b'{' | b'['));
        if !starts_like_json {
            return Classified::default();
        }
        let Ok(value) = serde_json::from_slice::<serde_json::Value>(payload) else {
            return Classified::default();
        };
        let text = |pointer: &Option<String>| {
            let found = value.pointer(pointer.as_deref()?)?;
            match found {
                serde_json::Value::String(s) => Some(s.clone()),
                serde_json::Value::Number(n) => Some(n.to_string()),
                _ => None,
            }
        };
        let cost = self
            .cost
            .as_deref()
            .and_then(|p| value.pointer(p))
            .and_then(|found| match found {
                serde_json::Value::Number(n) => n.as_u64(),
                serde_json::Value::Array(items) => Some(items.len() as u64),
                _ => None,
            });
        Classified {
            kind: text(&self.kind),
            cost,
            room: text(&self.room),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn costs_come_from_the_message_then_its_type_then_the_default() {
        let mut costs = Costs::default();
        costs.set("subscribe", 5);
        costs.set("ping", 0);
        costs.release("unsubscribe");
        assert_eq!(costs.cost_of(&MessageInfo::new(1).kind("subscribe")), 5);
        assert_eq!(costs.cost_of(&MessageInfo::new(1).kind("ping")), 0);
        assert_eq!(costs.cost_of(&MessageInfo::new(1).kind("chat")), 1);
        assert_eq!(
            costs.cost_of(&MessageInfo::new(1).kind("subscribe").cost(80)),
            80
        );
        assert!(costs.releases(&MessageInfo::new(1).kind("unsubscribe")));
        assert!(!costs.releases(&MessageInfo::new(1)));
    }

    #[test]
    fn pointers_read_strings_numbers_and_array_lengths() {
        let c = Classifier::new()
            .kind_at("/t")
            .cost_at("/n")
            .room_at("/r/0");
        let read = c.classify(br#" {"t":7,"n":40,"r":["lobby"]}"#);
        assert_eq!(read.kind.as_deref(), Some("7"));
        assert_eq!(read.cost, Some(40));
        assert_eq!(read.room.as_deref(), Some("lobby"));
        assert_eq!(c.classify(br#"{"n":-1}"#).cost, None);
        assert_eq!(c.classify(b"{broken").kind, None);
        assert_eq!(
            Classifier::new().classify(br#"{"t":1}"#),
            Classified::default()
        );
    }
}
