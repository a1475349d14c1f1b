//! Reads typed sections from a [`Node`] tree with serde, reporting every problem at once,
//! each with its line, column and field ([`from_node`]).
//!
//! A deserializer stops at its first error; a configuration check must not. Unknown fields
//! are noted and skipped, so they never stop anything. Any other problem (a wrong type, a
//! value a field's type refuses, a missing field) is recorded with the position and field of
//! the node it arose at; that node is then left out — as if it were not in the file — and the
//! document is read again, until it reads or nothing is left to leave out. A field left out
//! for its own problem is not reported again as missing.

use std::cell::RefCell;
use std::collections::HashSet;
use std::fmt;

use serde::de::value::{StrDeserializer, U64Deserializer};
use serde::de::{
    self, DeserializeOwned, DeserializeSeed, Deserializer, IntoDeserializer, MapAccess, SeqAccess,
    Visitor,
};

use super::node::{Node, Typed, Value};

/// At most this many problems are looked for: each costs a reading of the whole document.
const MAX_PROBLEMS: usize = 100;

/// The name [`Spanned`] asks a deserializer for, so that [`NodeDe`] hands it the position.
const SPANNED: &str = "$flowgate::Spanned";

/// A value and the position of its node (`(0, 0)` when read by another deserializer).
#[derive(Debug, Clone)]
pub(crate) struct Spanned<T> {
    /// The value.
    pub(crate) value: T,
    /// 1-based line and column.
    pub(crate) at: (u64, u64),
}

impl<'de, T: de::Deserialize<'de>> de::Deserialize<'de> for Spanned<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SpannedVisitor<T>(std::marker::PhantomData<T>);
        impl<'de, T: de::Deserialize<'de>> Visitor<'de> for SpannedVisitor<T> {
            type Value = Spanned<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a value")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Spanned<T>, A::Error> {
                let missing = || de::Error::custom("a span without its value");
                let line = seq.next_element()?.ok_or_else(missing)?;
                let column = seq.next_element()?.ok_or_else(missing)?;
                let value = seq.next_element()?.ok_or_else(missing)?;
                Ok(Spanned {
                    value,
                    at: (line, column),
                })
            }
            fn visit_newtype_struct<D: Deserializer<'de>>(
                self,
                deserializer: D,
            ) -> Result<Spanned<T>, D::Error> {
                T::deserialize(deserializer).map(|value| Spanned { value, at: (0, 0) })
            }
        }
        deserializer.deserialize_newtype_struct(SPANNED, SpannedVisitor(std::marker::PhantomData))
    }
}

/// One problem: where, which field (dotted path of keys from the document's top, `[]` after
/// a sequence's elements: `gateway.descriptors[][].key`; `None` at the top), what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Problem {
    /// 1-based line and column.
    pub(crate) at: (u64, u64),
    /// The field's path, e.g. `websocket.limits.close_code`.
    pub(crate) field: Option<String>,
    /// What is wrong.
    pub(crate) message: String,
    /// For a value that was left out: the position of the mapping (or sequence) it was in,
    /// where checks that find it missing report it.
    pub(crate) left_out_of: Option<(u64, u64)>,
}

/// Reads a `T` from `root`; returns it (unless the problems left nothing to read) and every
/// problem found, in document order.
pub(crate) fn from_node<T: DeserializeOwned>(root: &Node) -> (Option<T>, Vec<Problem>) {
    let mut removed: HashSet<*const Node> = HashSet::new();
    let mut removed_paths: Vec<String> = Vec::new();
    let mut problems: Vec<Problem> = Vec::new();
    let note = |problems: &mut Vec<Problem>, p: Problem| {
        if !problems.contains(&p) {
            problems.push(p);
        }
    };
    let value = loop {
        let ctx = Ctx {
            removed: &removed,
            notes: RefCell::default(),
        };
        let read = T::deserialize(NodeDe {
            node: root,
            path: String::new(),
            parent_at: None,
            ctx: &ctx,
        });
        for p in ctx.notes.into_inner() {
            note(&mut problems, p);
        }
        let error = match read {
            Ok(value) => break Some(value),
            Err(DeError(error)) => *error,
        };
        let node = error.node.unwrap_or(root as *const Node);
        let path = error.path.clone().unwrap_or_default();
        let at = error.at.unwrap_or(root.at);
        match error.missing {
            Some(field) => {
                let field = join(&path, field);
                if !removed_paths.contains(&field) {
                    note(
                        &mut problems,
                        Problem {
                            at,
                            field: Some(field),
                            message: "is required".to_owned(),
                            left_out_of: None,
                        },
                    );
                }
            }
            None => note(
                &mut problems,
                Problem {
                    at,
                    field: (!path.is_empty()).then(|| path.clone()),
                    message: error.message,
                    left_out_of: error.parent_at,
                },
            ),
        }
        if std::ptr::eq(node, root) || !removed.insert(node) || problems.len() >= MAX_PROBLEMS {
            break None;
        }
        removed_paths.push(path);
    };
    problems.sort_by_key(|p| p.at);
    (value, problems)
}

/// `path.field`.
fn join(path: &str, field: &str) -> String {
    if path.is_empty() {
        field.to_owned()
    } else {
        format!("{path}.{field}")
    }
}

/// What one reading shares: the nodes left out, and the problems noted without stopping.
struct Ctx<'a> {
    removed: &'a HashSet<*const Node>,
    notes: RefCell<Vec<Problem>>,
}

impl Ctx<'_> {
    fn is_removed(&self, node: &Node) -> bool {
        self.removed.contains(&(node as *const Node))
    }
}

/// An error on the way, and the node it arose at (set by the innermost node that saw it).
#[derive(Debug)]
pub(crate) struct DeError(Box<ErrorAt>);

/// What [`DeError`] holds.
#[derive(Debug)]
struct ErrorAt {
    message: String,
    /// The node (its address in the tree), to leave it out on the next reading.
    node: Option<*const Node>,
    at: Option<(u64, u64)>,
    path: Option<String>,
    /// The position of the node's parent.
    parent_at: Option<(u64, u64)>,
    /// `Some(field)` when a required field is missing.
    missing: Option<&'static str>,
}

impl DeError {
    /// Attributes the error to `node` at `path` (in its parent at `parent_at`), unless a
    /// deeper node already has it.
    fn at(mut self, node: &Node, path: &str, parent_at: Option<(u64, u64)>) -> Self {
        let e = &mut self.0;
        if e.node.is_none() {
            e.node = Some(node as *const Node);
            e.at = Some(node.at);
            e.path = Some(path.to_owned());
            e.parent_at = parent_at;
        }
        self
    }
}

impl fmt::Display for DeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.message)
    }
}

impl std::error::Error for DeError {}

impl de::Error for DeError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        DeError(Box::new(ErrorAt {
            message: msg.to_string(),
            node: None,
            at: None,
            path: None,
            parent_at: None,
            missing: None,
        }))
    }

    fn missing_field(field: &'static str) -> Self {
        let mut error = DeError::custom(format_args!("missing field `{field}`"));
        error.0.missing = Some(field);
        error
    }
}

/// Deserializes from one node.
struct NodeDe<'a> {
    node: &'a Node,
    /// The node's field path.
    path: String,
    /// Its parent's position (`None` at the top).
    parent_at: Option<(u64, u64)>,
    ctx: &'a Ctx<'a>,
}

impl<'a> NodeDe<'a> {
    /// The node of `key` in this mapping, or (`None`) an element of this sequence: its path is
    /// this one's with `[]` appended.
    fn child(&self, node: &'a Node, key: Option<&str>) -> NodeDe<'a> {
        NodeDe {
            node,
            path: match key {
                Some(key) => join(&self.path, key),
                None => format!("{}[]", self.path),
            },
            parent_at: Some(self.node.at),
            ctx: self.ctx,
        }
    }

    /// Attributes `e` to this node.
    fn locate(&self, e: DeError) -> DeError {
        e.at(self.node, &self.path, self.parent_at)
    }

    fn any<'de, V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match &self.node.value {
            Value::Scalar(s) => match s.typed {
                Typed::Null => visitor.visit_unit(),
                Typed::Bool(b) => visitor.visit_bool(b),
                Typed::U64(n) => visitor.visit_u64(n),
                Typed::I64(n) => visitor.visit_i64(n),
                Typed::F64(x) => visitor.visit_f64(x),
                Typed::Str => visitor.visit_str(&s.text),
            },
            Value::Seq(items) => visitor.visit_seq(Items {
                items: items.iter(),
                parent: &self,
            }),
            Value::Map(entries) => visitor.visit_map(Entries {
                entries: entries.iter(),
                parent: &self,
                fields: None,
                value: None,
            }),
        }
        .map_err(|e| self.locate(e))
    }
}

impl<'de> Deserializer<'de> for NodeDe<'_> {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.any(visitor)
    }

    /// Text as written, whatever YAML's schema makes of a plain scalar (`value: 010` is the
    /// string `010`).
    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match &self.node.value {
            Value::Scalar(s) if s.typed != Typed::Null => {
                visitor.visit_str(&s.text).map_err(|e| self.locate(e))
            }
            _ => self.any(visitor),
        }
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match &self.node.value {
            Value::Scalar(s) if s.typed == Typed::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        if name == SPANNED {
            let (line, column) = self.node.at;
            visitor.visit_seq(SpanParts {
                position: [line, column].into_iter(),
                value: Some(self),
            })
        } else {
            visitor.visit_newtype_struct(self)
        }
    }

    /// A mapping whose keys must be among `fields`: the others are noted and skipped.
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        match &self.node.value {
            Value::Map(entries) => visitor
                .visit_map(Entries {
                    entries: entries.iter(),
                    parent: &self,
                    fields: Some(fields),
                    value: None,
                })
                .map_err(|e| self.locate(e)),
            _ => Err(self.locate(de::Error::invalid_type(
                self.node.unexpected(),
                &"a mapping",
            ))),
        }
    }

    /// A unit variant, by name.
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        match &self.node.value {
            Value::Scalar(s) if s.typed != Typed::Null => {
                let name: StrDeserializer<'_, DeError> = s.text.as_str().into_deserializer();
                visitor.visit_enum(name).map_err(|e| self.locate(e))
            }
            _ => self.any(visitor),
        }
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char bytes byte_buf unit
        unit_struct seq tuple tuple_struct map ignored_any
    }
}

/// The elements of a sequence that are not left out.
struct Items<'a, 'p> {
    items: std::slice::Iter<'a, Node>,
    parent: &'p NodeDe<'a>,
}

impl<'de> SeqAccess<'de> for Items<'_, '_> {
    type Error = DeError;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, DeError> {
        let Some(item) = self.items.by_ref().find(|n| !self.parent.ctx.is_removed(n)) else {
            return Ok(None);
        };
        let de = self.parent.child(item, None);
        let path = de.path.clone();
        let parent_at = Some(self.parent.node.at);
        seed.deserialize(de)
            .map(Some)
            .map_err(|e| e.at(item, &path, parent_at))
    }
}

/// The entries of a mapping that are not left out; for a struct, only its fields.
struct Entries<'a, 'p> {
    entries: std::slice::Iter<'a, (Node, Node)>,
    parent: &'p NodeDe<'a>,
    /// A struct's fields: other keys are noted as unknown and skipped.
    fields: Option<&'static [&'static str]>,
    /// The value of the key just read, and its field path.
    value: Option<(&'a Node, String)>,
}

impl<'de> MapAccess<'de> for Entries<'_, '_> {
    type Error = DeError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, DeError> {
        let ctx = self.parent.ctx;
        for (key, value) in self.entries.by_ref() {
            if ctx.is_removed(key) || ctx.is_removed(value) {
                continue;
            }
            let name = key.text().unwrap_or_default();
            if let Some(fields) = self.fields
                && !fields.contains(&name)
            {
                let expected = fields
                    .iter()
                    .map(|f| format!("`{f}`"))
                    .collect::<Vec<_>>()
                    .join(", ");
                let path = &self.parent.path;
                ctx.notes.borrow_mut().push(Problem {
                    at: key.at,
                    field: (!path.is_empty()).then(|| path.clone()),
                    message: format!("unknown field `{name}`; expected one of {expected}"),
                    left_out_of: None,
                });
                continue;
            }
            let path = join(&self.parent.path, name);
            let read = match self.fields {
                Some(_) => {
                    let name: StrDeserializer<'_, DeError> = name.into_deserializer();
                    seed.deserialize(name)
                }
                None => seed.deserialize(self.parent.child(key, None)),
            };
            self.value = Some((value, path));
            return read.map(Some).map_err(|e| self.parent.locate(e));
        }
        Ok(None)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, DeError> {
        let Some((value, path)) = self.value.take() else {
            return Err(de::Error::custom("a value without its key"));
        };
        let de = NodeDe {
            node: value,
            path: path.clone(),
            parent_at: Some(self.parent.node.at),
            ctx: self.parent.ctx,
        };
        let parent_at = de.parent_at;
        seed.deserialize(de)
            .map_err(|e| e.at(value, &path, parent_at))
    }
}

/// What [`Spanned`] reads: line, column, then the value.
struct SpanParts<'a> {
    position: std::array::IntoIter<u64, 2>,
    value: Option<NodeDe<'a>>,
}

impl<'de> SeqAccess<'de> for SpanParts<'_> {
    type Error = DeError;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, DeError> {
        if let Some(n) = self.position.next() {
            let n: U64Deserializer<DeError> = n.into_deserializer();
            return seed.deserialize(n).map(Some);
        }
        match self.value.take() {
            Some(de) => seed.deserialize(de).map(Some),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Outer {
        name: Spanned<String>,
        #[serde(default)]
        inner: Option<Inner>,
        #[serde(default)]
        list: Vec<u32>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)] // Read for its problems only.
    struct Inner {
        count: u32,
        #[serde(default)]
        flag: bool,
    }

    fn read(text: &str) -> (Option<Outer>, Vec<String>) {
        let root = Node::parse(text).unwrap();
        let (value, problems) = from_node::<Outer>(&root);
        let problems = problems
            .into_iter()
            .map(|p| {
                format!(
                    "{}:{}: {}{}",
                    p.at.0,
                    p.at.1,
                    p.field.map(|f| format!("`{f}`: ")).unwrap_or_default(),
                    p.message
                )
            })
            .collect();
        (value, problems)
    }

    #[test]
    fn every_problem_is_found_with_its_position_and_field() {
        let (value, problems) = read(
            "name: 010\nnmae: x\ninner: {count: many, flag: 1, extra: 2}\nlist: [1, -2, 3, x]\n",
        );
        assert_eq!(
            problems,
            [
                "2:1: unknown field `nmae`; expected one of `name`, `inner`, `list`",
                "3:16: `inner.count`: invalid type: string \"many\", expected u32",
                "3:28: `inner.flag`: invalid type: integer `1`, expected a boolean",
                "3:31: `inner`: unknown field `extra`; expected one of `count`, `flag`",
                "4:11: `list[]`: invalid value: integer `-2`, expected u32",
                "4:18: `list[]`: invalid type: string \"x\", expected u32",
            ]
        );
        // What was left out is absent; the rest reads (`inner` lost its required count).
        let value = value.unwrap();
        assert_eq!((value.name.value.as_str(), value.name.at), ("010", (1, 7)));
        assert!(value.inner.is_none());
        assert_eq!(value.list, [1, 3]);
    }

    #[test]
    fn a_struct_is_a_mapping_only() {
        let (value, problems) = read("[a, b]\n");
        assert!(value.is_none());
        assert_eq!(
            problems,
            ["1:1: invalid type: sequence, expected a mapping"]
        );
        let (_, problems) = read("name: n\ninner: 5\n");
        assert_eq!(
            problems,
            ["2:8: `inner`: invalid type: integer `5`, expected a mapping"]
        );
    }

    #[test]
    fn missing_fields_are_required_once() {
        let (value, problems) = read("inner: {flag: true}\n");
        assert!(value.is_none());
        assert_eq!(
            problems,
            [
                "1:1: `name`: is required",
                "1:8: `inner.count`: is required"
            ]
        );
    }
}
