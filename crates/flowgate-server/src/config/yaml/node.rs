//! A YAML document as a tree of nodes that know where they are ([`Node`]), read once by
//! serde-saphyr (syntax, anchors and aliases, merge keys, duplicate keys, its size budget), so
//! that the typed sections can be read from it field by field ([`super::de`]) and every
//! problem be reported at its line and column.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Unexpected, Visitor};

/// One YAML node: where it is used, and its value.
#[derive(Debug)]
pub(crate) struct Node {
    /// 1-based line and column where the node is used (for an alias: the alias).
    pub(crate) at: (u64, u64),
    /// Its value.
    pub(crate) value: Value,
    /// Byte offset and length of the text that defines it (for an alias: the anchored node),
    /// to recover a plain scalar's text as written.
    defined: Option<(usize, usize)>,
}

/// A node's value.
#[derive(Debug)]
pub(crate) enum Value {
    /// A scalar.
    Scalar(Scalar),
    /// A sequence.
    Seq(Vec<Node>),
    /// A mapping, in document order.
    Map(Vec<(Node, Node)>),
}

/// A scalar: its text and what YAML's core schema makes of it.
#[derive(Debug)]
pub(crate) struct Scalar {
    /// The text: a plain scalar as written (`010`, `yes`, `1.10`), a quoted or block one as
    /// its string. Fields that expect text read this, as the YAML was written.
    pub(crate) text: String,
    /// The typed value: fields that expect a number, a boolean or nothing read this.
    pub(crate) typed: Typed,
}

/// What a scalar is, read as YAML 1.2's core schema reads it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Typed {
    /// `null`, `~` or nothing.
    Null,
    /// A boolean.
    Bool(bool),
    /// A non-negative integer.
    U64(u64),
    /// A negative integer.
    I64(i64),
    /// A float.
    F64(f64),
    /// Text.
    Str,
}

impl Node {
    /// Reads a document. A syntax error (or a duplicate key, or an alias bomb) is the only
    /// error: whatever parses becomes a tree.
    pub(crate) fn parse(text: &str) -> Result<Node, serde_saphyr::Error> {
        let mut root: Node = serde_saphyr::from_str(text)?;
        root.recover_text(text);
        Ok(root)
    }

    /// The node at `path` of mapping keys below this one.
    pub(crate) fn find(&self, path: &[&str]) -> Option<&Node> {
        let Some((first, rest)) = path.split_first() else {
            return Some(self);
        };
        match &self.value {
            Value::Map(entries) => entries
                .iter()
                .find(|(k, _)| k.text() == Some(first))
                .and_then(|(_, v)| v.find(rest)),
            _ => None,
        }
    }

    /// What the node is, for an error saying it is not what was expected.
    pub(crate) fn unexpected(&self) -> Unexpected<'_> {
        match &self.value {
            Value::Scalar(s) => match s.typed {
                Typed::Null => Unexpected::Unit,
                Typed::Bool(b) => Unexpected::Bool(b),
                Typed::U64(n) => Unexpected::Unsigned(n),
                Typed::I64(n) => Unexpected::Signed(n),
                Typed::F64(x) => Unexpected::Float(x),
                Typed::Str => Unexpected::Str(&s.text),
            },
            Value::Seq(_) => Unexpected::Seq,
            Value::Map(_) => Unexpected::Map,
        }
    }

    /// Whether the document is empty (or only `null`).
    pub(crate) fn is_null(&self) -> bool {
        matches!(&self.value, Value::Scalar(s) if s.typed == Typed::Null)
    }

    /// A scalar's text.
    pub(crate) fn text(&self) -> Option<&str> {
        match &self.value {
            Value::Scalar(s) => Some(&s.text),
            _ => None,
        }
    }

    /// Fills the text of typed plain scalars from `source`.
    fn recover_text(&mut self, source: &str) {
        match &mut self.value {
            Value::Scalar(scalar) if scalar.typed != Typed::Str => {
                let written = self
                    .defined
                    .and_then(|(start, len)| source.get(start..start.checked_add(len)?));
                scalar.text = match (written, scalar.typed) {
                    (Some(text), _) => text.trim().to_owned(),
                    (None, Typed::Null) => String::new(),
                    (None, Typed::Bool(b)) => b.to_string(),
                    (None, Typed::U64(n)) => n.to_string(),
                    (None, Typed::I64(n)) => n.to_string(),
                    (None, Typed::F64(x)) => x.to_string(),
                    (None, Typed::Str) => return,
                };
            }
            Value::Scalar(_) => {}
            Value::Seq(items) => items.iter_mut().for_each(|n| n.recover_text(source)),
            Value::Map(entries) => entries.iter_mut().for_each(|(k, v)| {
                k.recover_text(source);
                v.recover_text(source);
            }),
        }
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let spanned = serde_saphyr::Spanned::<Value>::deserialize(deserializer)?;
        let used = spanned.referenced;
        let span = spanned.defined.span();
        let defined = span
            .byte_offset()
            .zip(span.byte_len())
            .and_then(|(start, len)| {
                Some((usize::try_from(start).ok()?, usize::try_from(len).ok()?))
            });
        Ok(Node {
            at: (used.line(), used.column()),
            value: spanned.value,
            defined,
        })
    }
}

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ValueVisitor)
    }
}

/// Builds a [`Value`] from whatever the document holds.
struct ValueVisitor;

/// A typed scalar, its text recovered later.
fn typed(typed: Typed) -> Value {
    Value::Scalar(Scalar {
        text: String::new(),
        typed,
    })
}

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a YAML value")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(typed(Typed::Null))
    }

    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        Ok(typed(Typed::Null))
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(typed(Typed::Bool(v)))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        Ok(typed(Typed::U64(v)))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(typed(Typed::I64(v)))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Ok(typed(Typed::F64(v)))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::Scalar(Scalar {
            text: v.to_owned(),
            typed: Typed::Str,
        }))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Node>()? {
            items.push(item);
        }
        Ok(Value::Seq(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut entries = Vec::new();
        while let Some(entry) = map.next_entry::<Node, Node>()? {
            entries.push(entry);
        }
        Ok(Value::Map(entries))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_know_where_they_are_and_how_plain_scalars_were_written() {
        let root = Node::parse(
            "a: &x {p: 1.10, q: yes, r: 'q', s: 010}\ny: *x\nz:\n  <<: *x\n  p: 2\nn:\n",
        )
        .unwrap();
        let text = |path: &[&str]| root.find(path).and_then(Node::text).map(str::to_owned);
        assert_eq!(text(&["a", "p"]).as_deref(), Some("1.10"));
        assert_eq!(text(&["a", "q"]).as_deref(), Some("yes"));
        assert_eq!(text(&["a", "r"]).as_deref(), Some("q"));
        assert_eq!(text(&["a", "s"]).as_deref(), Some("010"));
        // `y` is a key (not YAML 1.1's `yes`); an alias's scalars read as written where
        // they are defined, positioned where they are used.
        assert_eq!(text(&["y", "p"]).as_deref(), Some("1.10"));
        assert_eq!(root.find(&["y", "p"]).unwrap().at, (2, 4));
        assert_eq!(text(&["z", "p"]).as_deref(), Some("2"));
        assert_eq!(text(&["z", "q"]).as_deref(), Some("yes"));
        assert_eq!(root.find(&["a", "q"]).unwrap().at, (1, 20));
        assert_eq!(text(&["n"]).as_deref(), Some(""));
        assert!(Node::parse("a: 1\na: 2\n").is_err());
    }
}
