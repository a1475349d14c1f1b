//! The request path as the gateways key and forward it: normalised as RFC 3986 §6.2.2
//! describes (and nginx does before it matches a `location`), so that `/%75pload`, `//upload`,
//! `/./upload` and `/x/../upload` are all `/upload` — to the limits and to the upstream alike.
//!
//! In order:
//! 1. percent-escapes of unreserved characters (`A–Z a–z 0–9 - . _ ~`) are decoded, and the hex
//!    digits of the other escapes upper-cased (`%2f` → `%2F`; an escape of a reserved
//!    character such as `/` stays an escape: decoding it would change what the path means);
//! 2. runs of `/` are merged into one;
//! 3. the dot segments `.` and `..` are removed (RFC 3986 §5.2.4; a `..` at the root is
//!    dropped).
//!
//! The query is left as it is. A path that needs none of this (nearly every one) is not
//! copied.

use std::borrow::Cow;

use http::Uri;
use http::uri::PathAndQuery;

/// Replaces `uri` by its origin form (`/path?query`) with the path normalised, when
/// normalising changes it. Returns whether it did.
pub fn normalise_uri(uri: &mut Uri) -> bool {
    let Cow::Owned(path) = normalise(uri.path()) else {
        return false;
    };
    let mut target = path;
    if let Some(query) = uri.query() {
        target.push('?');
        target.push_str(query);
    }
    // Only unreserved characters were decoded and only `/` and dot segments removed, so the
    // result is a valid path whenever the original was.
    match PathAndQuery::from_maybe_shared(bytes::Bytes::from(target)) {
        Ok(path) => {
            *uri = Uri::from(path);
            true
        }
        Err(_) => false,
    }
}

/// `path` normalised (see the module's documentation); borrowed when already normal. A path
/// that does not start with `/` (`*`, an authority) is returned as it is.
pub fn normalise(path: &str) -> Cow<'_, str> {
    if !path.starts_with('/') || is_normal(path.as_bytes()) {
        return Cow::Borrowed(path);
    }
    let decoded = decode_unreserved(path);
    let mut out = String::with_capacity(decoded.len());
    // `out` always starts with `/` and holds the segments kept so far, each after a `/`.
    let mut segments = decoded[1..].split('/').peekable();
    let mut trailing_slash = false;
    while let Some(segment) = segments.next() {
        let last = segments.peek().is_none();
        match segment {
            // `//`: merged (an empty last segment is the trailing slash).
            "" => trailing_slash = last,
            "." => trailing_slash = last,
            ".." => {
                let parent = out.rfind('/').unwrap_or(0);
                out.truncate(parent);
                trailing_slash = last;
            }
            segment => {
                out.push('/');
                out.push_str(segment);
                trailing_slash = false;
            }
        }
    }
    if out.is_empty() || trailing_slash {
        out.push('/');
    }
    Cow::Owned(out)
}

/// Whether `path` (starting with `/`) has no escape, no empty segment and no dot segment: one
/// pass over its bytes.
fn is_normal(path: &[u8]) -> bool {
    let mut i = 0;
    while i < path.len() {
        match path[i] {
            b'%' => return false,
            b'/' => match &path[i + 1..] {
                // `//`, a `.` or `..` segment (last, or followed by `/`).
                [b'/', ..] | [b'.'] | [b'.', b'/', ..] | [b'.', b'.'] | [b'.', b'.', b'/', ..] => {
                    return false;
                }
                _ => {}
            },
            _ => {}
        }
        i += 1;
    }
    true
}

/// `path` with the escapes of unreserved characters decoded and the others' hex digits
/// upper-cased; an incomplete or invalid escape is left as it is.
fn decode_unreserved(path: &str) -> String {
    let bytes = path.as_bytes();
    let mut out = String::with_capacity(path.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let (Some(hi), Some(lo)) = (
                bytes.get(i + 1).and_then(|&b| hex(b)),
                bytes.get(i + 2).and_then(|&b| hex(b)),
            )
        {
            let decoded = hi << 4 | lo;
            if decoded.is_ascii_alphanumeric() || matches!(decoded, b'-' | b'.' | b'_' | b'~') {
                out.push(char::from(decoded));
            } else {
                out.push('%');
                out.push(char::from(bytes[i + 1].to_ascii_uppercase()));
                out.push(char::from(bytes[i + 2].to_ascii_uppercase()));
            }
            i += 3;
            continue;
        }
        // Copy up to the next `%` at once (the path is ASCII: `Uri` allows nothing else).
        let next = bytes[i + 1..]
            .iter()
            .position(|&b| b == b'%')
            .map_or(bytes.len(), |p| i + 1 + p);
        out.push_str(&path[i..next]);
        i = next;
    }
    out
}

/// The value of a hex digit.
fn hex(b: u8) -> Option<u8> {
    char::from(b).to_digit(16).map(|d| d as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spellings_of_a_path_key_the_same() {
        for raw in [
            "/upload",
            "/%75pload",
            "/%75%70%6C%6F%61%64",
            "/%75%70%6c%6f%61%64",
            "//upload",
            "///upload",
            "/./upload",
            "/x/../upload",
            "/x/y/../../upload",
            "/../upload",
            "/%2E%2E/upload",
            "/x/%2e%2e/upload",
            "/.%2E/upload",
            "/x//..//upload",
        ] {
            assert_eq!(normalise(raw), "/upload", "{raw}");
        }
    }

    #[test]
    fn normalising_follows_rfc_3986() {
        for (raw, normal) in [
            // RFC 3986 §5.2.4's examples, and its §5.4 ones that apply to a path alone.
            ("/a/b/c/./../../g", "/a/g"),
            ("/b/c/d;p/../../../g", "/g"),
            ("/b/c/./g", "/b/c/g"),
            ("/b/c/.", "/b/c/"),
            ("/b/c/..", "/b/"),
            ("/b/c/../", "/b/"),
            ("/b/c/g/..", "/b/c/"),
            ("/.", "/"),
            ("/..", "/"),
            ("/", "/"),
            ("//", "/"),
            ("/upload/", "/upload/"),
            ("/upload//", "/upload/"),
            // Not dot segments.
            ("/.well-known/x", "/.well-known/x"),
            ("/a/..b/c.", "/a/..b/c."),
            ("/a/.../b", "/a/.../b"),
            // Escapes of reserved characters stay escapes (upper-cased); bad ones stay.
            ("/a%2fb", "/a%2Fb"),
            ("/a%2Fb", "/a%2Fb"),
            ("/a%2F..%2Fb", "/a%2F..%2Fb"),
            ("/%zz/%4", "/%zz/%4"),
            ("/%7e%41%5F%2d", "/~A_-"),
            ("/%20x", "/%20x"),
            ("*", "*"),
        ] {
            assert_eq!(normalise(raw), normal, "{raw}");
            // Idempotent.
            assert_eq!(normalise(normal), normal, "{normal}");
        }
        assert!(matches!(
            normalise("/already/normal.html"),
            Cow::Borrowed(_)
        ));
        assert!(matches!(normalise("/.well-known/a.b"), Cow::Borrowed(_)));
    }

    #[test]
    fn the_query_is_kept_and_normal_uris_are_untouched() {
        let mut uri: Uri = "/x/../%75pload?a=%2e%2e&b=//".parse().unwrap();
        assert!(normalise_uri(&mut uri));
        assert_eq!(uri, "/upload?a=%2e%2e&b=//");
        let mut uri: Uri = "/upload?x=1".parse().unwrap();
        assert!(!normalise_uri(&mut uri));
        assert_eq!(uri, "/upload?x=1");
        // Absolute form: the origin form is what is forwarded anyway.
        let mut uri: Uri = "http://a.example//upload".parse().unwrap();
        assert!(normalise_uri(&mut uri));
        assert_eq!(uri, "/upload");
    }
}
