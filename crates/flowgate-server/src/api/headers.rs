//! The IETF rate-limit headers (draft-ietf-httpapi-ratelimit-headers-10): `RateLimit-Policy`
//! and `RateLimit`, as Structured Field lists of `"name";q=…;w=…` and `"name";r=…;t=…`.

use std::fmt::Write as _;
use std::time::Duration;

/// One limit's part in the headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Item<'a> {
    /// The policy's name (any text; made a valid sf-string).
    pub name: &'a str,
    /// Units per window (`q`).
    pub quota: u64,
    /// The window (`w`, whole seconds, rounded up).
    pub window: Duration,
    /// Units left (`r`).
    pub remaining: u64,
    /// Seconds until the quota is available again (`t`, rounded up).
    pub reset: Duration,
}

/// `(RateLimit-Policy, RateLimit)` header values for `items`; `None` when there are none.
///
/// ```
/// use std::time::Duration;
/// use flowgate_server::api::headers::{ratelimit_headers, Item};
/// let item = Item { name: "per_ip", quota: 100, window: Duration::from_secs(60),
///                   remaining: 0, reset: Duration::from_millis(11_200) };
/// assert_eq!(
///     ratelimit_headers(&[item]),
///     Some(("\"per_ip\";q=100;w=60".to_owned(), "\"per_ip\";r=0;t=12".to_owned())),
/// );
/// ```
pub fn ratelimit_headers(items: &[Item<'_>]) -> Option<(String, String)> {
    if items.is_empty() {
        return None;
    }
    let mut policy = String::new();
    let mut state = String::new();
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            policy.push_str(", ");
            state.push_str(", ");
        }
        push_sf_string(&mut policy, item.name);
        push_sf_string(&mut state, item.name);
        // Writing to a String cannot fail.
        let _ = write!(
            policy,
            ";q={};w={}",
            item.quota,
            ceil_secs(item.window).max(1)
        );
        let _ = write!(state, ";r={};t={}", item.remaining, ceil_secs(item.reset));
    }
    Some((policy, state))
}

/// Whole seconds, rounded up.
pub fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// Appends `s` as a Structured Field string (RFC 8941 §3.3.3): quoted, `"` and `\` escaped,
/// characters outside printable ASCII replaced by `_`.
fn push_sf_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('_'),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_escaped_and_windows_round_up() {
        let item = Item {
            name: "a\"b\\c\u{e9}",
            quota: 5,
            window: Duration::from_millis(1500),
            remaining: 3,
            reset: Duration::ZERO,
        };
        let (policy, state) = ratelimit_headers(&[item, item]).unwrap();
        assert_eq!(policy, r#""a\"b\\c_";q=5;w=2, "a\"b\\c_";q=5;w=2"#);
        assert_eq!(state, r#""a\"b\\c_";r=3;t=0, "a\"b\\c_";r=3;t=0"#);
        assert_eq!(ratelimit_headers(&[]), None);
    }
}
