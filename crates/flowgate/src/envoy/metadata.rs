//! A rule's `metadata`: arbitrary structured data returned to Envoy in the response's
//! `dynamic_metadata` for the descriptors that pass, as envoyproxy/ratelimit returns it.

use std::collections::BTreeMap;

/// One metadata value, with the shapes of `google.protobuf.Value`. Numbers compare by their
/// bits (so a NaN equals itself and the type is [`Eq`]).
#[derive(Debug, Clone)]
pub enum MetaValue {
    /// `null`.
    Null,
    /// A boolean.
    Bool(bool),
    /// A number (protobuf's `Value` holds every number as a double).
    Number(f64),
    /// A string.
    String(String),
    /// A list.
    List(Vec<MetaValue>),
    /// A nested structure.
    Struct(Metadata),
}

impl PartialEq for MetaValue {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (MetaValue::Null, MetaValue::Null) => true,
            (MetaValue::Bool(a), MetaValue::Bool(b)) => a == b,
            (MetaValue::Number(a), MetaValue::Number(b)) => a.to_bits() == b.to_bits(),
            (MetaValue::String(a), MetaValue::String(b)) => a == b,
            (MetaValue::List(a), MetaValue::List(b)) => a == b,
            (MetaValue::Struct(a), MetaValue::Struct(b)) => a == b,
            _ => false,
        }
    }
}

impl Eq for MetaValue {}

/// A structure of named [`MetaValue`]s (`google.protobuf.Struct`), by name.
pub type Metadata = BTreeMap<String, MetaValue>;

/// Merges `src` into `dest` as envoyproxy/ratelimit does: a name `dest` lacks is added; when
/// both hold a structure under a name, they are merged recursively; otherwise `dest` keeps its
/// own value (the first descriptor's wins).
///
/// ```
/// use flowgate::envoy::{merge_metadata, MetaValue, Metadata};
/// let mut dest = Metadata::from([("a".to_owned(), MetaValue::Number(1.0))]);
/// let src = Metadata::from([
///     ("a".to_owned(), MetaValue::Number(2.0)),
///     ("b".to_owned(), MetaValue::Bool(true)),
/// ]);
/// merge_metadata(&mut dest, &src);
/// assert_eq!(dest["a"], MetaValue::Number(1.0));
/// assert_eq!(dest["b"], MetaValue::Bool(true));
/// ```
pub fn merge_metadata(dest: &mut Metadata, src: &Metadata) {
    for (name, value) in src {
        match (dest.get_mut(name), value) {
            (None, _) => {
                dest.insert(name.clone(), value.clone());
            }
            (Some(MetaValue::Struct(inner)), MetaValue::Struct(from)) => {
                merge_metadata(inner, from)
            }
            (Some(_), _) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(pairs: &[(&str, MetaValue)]) -> Metadata {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect()
    }

    #[test]
    fn structures_merge_recursively_and_the_first_value_wins() {
        let mut dest = s(&[
            ("x", MetaValue::Struct(s(&[("a", MetaValue::Number(1.0))]))),
            ("l", MetaValue::List(vec![MetaValue::Null])),
        ]);
        let src = s(&[
            (
                "x",
                MetaValue::Struct(s(&[
                    ("a", MetaValue::Number(9.0)),
                    ("b", MetaValue::String("two".into())),
                ])),
            ),
            ("l", MetaValue::List(vec![MetaValue::Bool(true)])),
        ]);
        merge_metadata(&mut dest, &src);
        assert_eq!(
            dest,
            s(&[
                (
                    "x",
                    MetaValue::Struct(s(&[
                        ("a", MetaValue::Number(1.0)),
                        ("b", MetaValue::String("two".into())),
                    ]))
                ),
                ("l", MetaValue::List(vec![MetaValue::Null])),
            ])
        );
    }
}
