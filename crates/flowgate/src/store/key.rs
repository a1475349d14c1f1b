//! Counter keys: one grammar for every front end, so that the counters of different limits —
//! an Envoy rule's, the tower layer's, a WebSocket room's — never share a key, even when they
//! share one store (one Redis for a whole fleet).
//!
//! ```text
//! key    = origin *( "|" field ) [ "#" suffix ]
//! origin = part                    ; an Envoy domain
//!        / tag ":" part            ; another front end: tag is "http", "ws" or "lease"
//! field  = part "=" part
//! part   = text with "\" written before every "\", "|", "=", "#" (and, in the origin, ":")
//! suffix = the quota ("gcra:100:60000000000:100"): algorithm, limit, period in ns, burst
//! ```
//!
//! Every separator inside user text is escaped, so two keys are equal only if they were built
//! from equal parts; and an origin holds an unescaped `:` only when it carries a front end's
//! tag, so an Envoy domain can never pass for another front end.
//!
//! | front end | key |
//! |---|---|
//! | Envoy rules (`envoy::check`, the service) | `edge\|remote_address=10.0.0.1#gcra:5:1000000000:5` |
//! | tower layer (`http::Limit`) | `http:per-ip\|key=10.0.0.1`, tiered: `http:plan\|tier=free\|key=ann` |
//! | leases ([`lease::key`](crate::lease::key)) | `lease:checkout\|key=customer-42` |
//! | WebSocket (`ws::WsLimiter`) | `ws:\|user=ann\|role=`, `ws:\|room=lobby`, `ws:\|room=lobby\|who=ann` (the part after `ws:` is the limiter's `key_prefix`) |
//!
//! A store may wrap the key further (Redis: `flowgate:{<key>}:<algorithm>`).
//!
//! ```
//! use flowgate::store::key::KeyWriter;
//! let mut key = String::new();
//! KeyWriter::domain(&mut key, "edge").field("path", "/a|b=c");
//! assert_eq!(key, r"edge|path=/a\|b\=c");
//! key.clear();
//! KeyWriter::tagged(&mut key, "http", "per-ip").field("key", "10.0.0.1");
//! assert_eq!(key, "http:per-ip|key=10.0.0.1");
//! ```

/// Appends a key in the one grammar to a buffer (see the [module docs](self)).
#[derive(Debug)]
pub struct KeyWriter<'a> {
    /// The key so far.
    key: &'a mut String,
}

impl<'a> KeyWriter<'a> {
    /// Starts the key of an Envoy domain's counter, appended to `key`.
    pub fn domain(key: &'a mut String, domain: &str) -> Self {
        push_part(key, domain, true);
        KeyWriter { key }
    }

    /// Starts the key of another front end's counter: its `tag` (`http`, `ws`: plain ASCII,
    /// written as is) and its `name` (the limit's name, a namespace), appended to `key`.
    pub fn tagged(key: &'a mut String, tag: &str, name: &str) -> Self {
        debug_assert!(tag.bytes().all(|b| b.is_ascii_alphanumeric()));
        key.push_str(tag);
        key.push(':');
        push_part(key, name, true);
        KeyWriter { key }
    }

    /// Appends the field `name=value`.
    pub fn field(self, name: &str, value: &str) -> Self {
        self.key.push('|');
        push_part(self.key, name, false);
        self.key.push('=');
        push_part(self.key, value, false);
        self
    }

    /// Appends `|name=` and hands back the buffer for the value, which the caller appends raw
    /// and then escapes with [`escape_from`] (a key extractor writes straight into it).
    pub fn open_field(self, name: &str) -> &'a mut String {
        self.key.push('|');
        push_part(self.key, name, false);
        self.key.push('=');
        self.key
    }

    /// Ends the key with `#` and `suffix` (plain text the caller made, e.g. a quota).
    pub fn suffix(self, suffix: &str) {
        self.key.push('#');
        self.key.push_str(suffix);
    }
}

/// A key read back into its parts ([`decode`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Decoded<'a> {
    /// The origin, unescaped: an Envoy domain, or `tag:name` for another front end.
    pub origin: String,
    /// Whether the origin carries a front end's tag (it held an unescaped `:`).
    pub tagged: bool,
    /// The fields, unescaped, in order.
    pub fields: Vec<(String, String)>,
    /// What follows `#`, as written (a quota), if anything.
    pub suffix: Option<&'a str>,
}

/// Reads `key` back into the parts it was built from; `None` if it is not in the grammar (a
/// dangling `\`, a field without `=`).
///
/// ```
/// use flowgate::store::key::{decode, KeyWriter};
/// let mut key = String::new();
/// KeyWriter::domain(&mut key, "a:b").field("path", "/a|b=c").suffix("gcra:1:2:3");
/// let decoded = decode(&key).unwrap();
/// assert_eq!((decoded.origin.as_str(), decoded.tagged), ("a:b", false));
/// assert_eq!(decoded.fields, [("path".to_owned(), "/a|b=c".to_owned())]);
/// assert_eq!(decoded.suffix, Some("gcra:1:2:3"));
/// ```
pub fn decode(key: &str) -> Option<Decoded<'_>> {
    let mut decoded = Decoded {
        origin: String::new(),
        tagged: false,
        fields: Vec::new(),
        suffix: None,
    };
    // 0: the origin, 1: a field's name, 2: a field's value.
    let mut part = 0;
    let mut name = String::new();
    let mut text = String::new();
    let mut chars = key.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => text.push(chars.next()?.1),
            '|' | '#' => {
                match part {
                    0 => decoded.origin = std::mem::take(&mut text),
                    2 => decoded
                        .fields
                        .push((std::mem::take(&mut name), std::mem::take(&mut text))),
                    _ => return None,
                }
                if c == '#' {
                    decoded.suffix = Some(&key[i + 1..]);
                    return Some(decoded);
                }
                part = 1;
            }
            '=' if part == 1 => {
                name = std::mem::take(&mut text);
                part = 2;
            }
            ':' if part == 0 => {
                decoded.tagged = true;
                text.push(c);
            }
            c => text.push(c),
        }
    }
    match part {
        0 => decoded.origin = text,
        2 => decoded.fields.push((name, text)),
        _ => return None,
    }
    Some(decoded)
}

/// Escapes, in place, what was appended to `key` from byte `start` on, as a field's value.
pub fn escape_from(key: &mut String, start: usize) {
    if needs_escape(&key[start..], false) {
        let raw = key.split_off(start);
        push_part(key, &raw, false);
    }
}

/// Whether `text` holds a character that must be escaped in a part.
fn needs_escape(text: &str, origin: bool) -> bool {
    text.bytes()
        .any(|b| matches!(b, b'\\' | b'|' | b'=' | b'#') || (origin && b == b':'))
}

/// Appends `text` with the grammar's separators escaped (`:` too in an origin).
fn push_part(key: &mut String, text: &str, origin: bool) {
    if !needs_escape(text, origin) {
        key.push_str(text);
        return;
    }
    for c in text.chars() {
        if matches!(c, '\\' | '|' | '=' | '#') || (origin && c == ':') {
            key.push('\\');
        }
        key.push(c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A key as the list of its parts, the way it was built.
    #[derive(Debug, Clone, PartialEq, Eq)]
    enum Built {
        Domain(String, Vec<(String, String)>, Option<String>),
        Tagged(&'static str, String, Vec<(String, String)>),
    }

    fn write(built: &Built) -> String {
        let mut key = String::new();
        match built {
            Built::Domain(domain, fields, suffix) => {
                let mut w = KeyWriter::domain(&mut key, domain);
                for (k, v) in fields {
                    w = w.field(k, v);
                }
                if let Some(s) = suffix {
                    w.suffix(s);
                }
            }
            Built::Tagged(tag, name, fields) => {
                let mut w = KeyWriter::tagged(&mut key, tag, name);
                for (k, v) in fields {
                    w = w.field(k, v);
                }
            }
        }
        key
    }

    fn text() -> impl Strategy<Value = String> {
        "[a-c:|=#\\\\]{0,4}"
    }

    fn fields() -> impl Strategy<Value = Vec<(String, String)>> {
        proptest::collection::vec((text(), text()), 0..3)
    }

    fn built() -> impl Strategy<Value = Built> {
        prop_oneof![
            (text(), fields(), proptest::option::of("[a-z0-9:]{1,6}"))
                .prop_map(|(d, f, s)| Built::Domain(d, f, s)),
            (prop_oneof![Just("http"), Just("ws")], text(), fields())
                .prop_map(|(t, n, f)| Built::Tagged(t, n, f)),
        ]
    }

    proptest! {
        /// Different parts never make the same key, whichever front end built them.
        #[test]
        fn keys_are_equal_only_when_built_alike(a in built(), b in built()) {
            if a != b {
                prop_assert_ne!(write(&a), write(&b));
            }
        }
    }

    proptest! {
        /// Every key reads back into the parts it was built from.
        #[test]
        fn keys_decode_into_their_parts(b in built()) {
            let key = write(&b);
            let decoded = decode(&key).expect("in the grammar");
            match b {
                Built::Domain(domain, fields, suffix) => {
                    prop_assert_eq!(decoded.origin, domain);
                    prop_assert!(!decoded.tagged);
                    prop_assert_eq!(decoded.fields, fields);
                    prop_assert_eq!(decoded.suffix, suffix.as_deref());
                }
                Built::Tagged(tag, name, fields) => {
                    prop_assert_eq!(decoded.origin, format!("{tag}:{name}"));
                    prop_assert!(decoded.tagged);
                    prop_assert_eq!(decoded.fields, fields);
                    prop_assert_eq!(decoded.suffix, None);
                }
            }
        }
    }

    #[test]
    fn text_outside_the_grammar_does_not_decode() {
        for bad in ["a\\", "a|b", "a|b|c=d", "a|b=c|d#x"] {
            assert_eq!(decode(bad), None, "{bad}");
        }
    }

    #[test]
    fn values_written_raw_are_escaped_in_place() {
        let mut key = String::new();
        let buffer = KeyWriter::tagged(&mut key, "http", "n").open_field("key");
        let start = buffer.len();
        buffer.push_str("a|b");
        escape_from(buffer, start);
        assert_eq!(key, r"http:n|key=a\|b");
    }
}
