//! The rate-limit response headers: IETF `RateLimit-Policy` and `RateLimit`
//! (draft-ietf-httpapi-ratelimit-headers, as of -12), legacy `X-RateLimit-*`, and `Retry-After`.
//!
//! ```text
//! RateLimit-Policy: "per-ip";q=100;w=60, "per-route";q=10;w=1
//! RateLimit: "per-ip";r=99;t=1, "per-route";r=0;t=1
//! X-RateLimit-Limit: 10            (optional, the binding limit)
//! X-RateLimit-Remaining: 0
//! X-RateLimit-Reset: 1
//! Retry-After: 1                   (429 only; whole seconds rounded up, never 0)
//! ```
//!
//! Both IETF fields are Structured Field lists of one item per limit: the item is the limit's
//! name as an sf-string, `q` its quota and `w` its window in seconds; `r` the units remaining
//! and `t` the seconds until the limit resets — or, on a denied limit, until the request would
//! be allowed, so that `t` and `Retry-After` agree. Several layers may each append their items.
//!
//! **Bursts.** A token bucket may hold more than one window's quota (100 per second, bursts of
//! 200). The draft has no parameter for that; it says service-specific parameters carry a
//! vendor prefix (its example is `acme-burst`). So a quota whose burst differs from its limit
//! is advertised as its rate, `q` per `w`, plus `flowgate-burst=<burst>`, and `r` never says
//! more than `q`: a client that reads only the draft's parameters is told a true, if cautious,
//! budget (the draft asks servers not to convey more than they mean clients to use), and one
//! that reads `flowgate-burst` knows the bucket's capacity.
//!
//! ```text
//! RateLimit-Policy: "per_address";q=100;w=1;flowgate-burst=200
//! RateLimit: "per_address";r=100;t=2        (199 tokens left: at most q is advertised)
//! ```

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};

use crate::decision::Decision;
use crate::quota::Quota;

/// `RateLimit-Policy`: the quota policies that apply (stable across responses).
pub static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit`: the current service limits (changes with every response).
pub static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// Legacy `X-RateLimit-Limit`.
pub static X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// Legacy `X-RateLimit-Remaining`.
pub static X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// Legacy `X-RateLimit-Reset` (seconds from now).
pub static X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
/// `Flowgate-Fallback: open|local`: the store could not be asked and a fail mode decided.
pub static FLOWGATE_FALLBACK: HeaderName = HeaderName::from_static("flowgate-fallback");

/// `q` and `w` for a quota: `limit` per `period` in whole seconds. A period that is not a
/// whole number of seconds is rounded up to one that is and `q` scaled down to match
/// (10 per 100 ms → `q=100;w=1`), so the advertised rate never exceeds the real one.
pub fn quota_window(quota: &Quota) -> (u64, u64) {
    const SEC: u128 = 1_000_000_000;
    let period = u128::from(quota.period_nanos());
    let window = period.div_ceil(SEC);
    if period % SEC == 0 {
        return (quota.limit(), window as u64);
    }
    let q = u128::from(quota.limit()) * window * SEC / period;
    (u64::try_from(q).unwrap_or(u64::MAX), window as u64)
}

/// The `t` parameter (and legacy reset): seconds until the limit resets, or, when it denied,
/// until the request would be allowed.
pub fn reset_secs(decision: &Decision) -> u64 {
    if decision.allowed {
        decision.reset_after_secs()
    } else {
        decision.retry_after_secs()
    }
}

/// `name` as a Structured Field string (RFC 8941 §3.3.3), as the headers write it.
///
/// ```
/// assert_eq!(flowgate::answer::headers::sf_string("a\"b"), r#""a\"b""#);
/// ```
pub fn sf_string(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 2);
    push_sf_string(&mut out, name);
    out
}

/// Appends `name` as an sf-string: quoted, `"` and `\` escaped, anything outside printable
/// ASCII replaced by `?` (sf-strings cannot carry it).
pub(crate) fn push_sf_string(out: &mut String, name: &str) {
    out.push('"');
    // Rule names are almost always plain: copy them whole.
    if name
        .bytes()
        .all(|b| matches!(b, b' '..=b'~') && b != b'"' && b != b'\\')
    {
        out.push_str(name);
        out.push('"');
        return;
    }
    for c in name.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out.push('"');
}

/// One `RateLimit-Policy` item: `"name";q=100;w=60`.
pub fn policy_item(name: &str, quota: &Quota) -> String {
    let mut out = String::with_capacity(name.len() + 24);
    push_policy_item(&mut out, name, quota);
    out
}

fn push_policy_item(out: &mut String, name: &str, quota: &Quota) {
    let (q, w) = quota_window(quota);
    push_sf_string(out, name);
    out.push_str(";q=");
    push_u64(out, q);
    out.push_str(";w=");
    push_u64(out, w);
    if quota.burst() != quota.limit() {
        out.push_str(";flowgate-burst=");
        push_u64(out, quota.burst());
    }
}

/// The `r` parameter (and legacy remaining): the units left, at most the limit, so that `r`
/// never exceeds the policy's `q` (see the module docs on bursts).
pub fn remaining(decision: &Decision) -> u64 {
    decision.remaining.min(decision.limit)
}

/// One `RateLimit` item: `"name";r=0;t=12`.
pub fn limit_item(name: &str, decision: &Decision) -> String {
    let mut out = String::with_capacity(name.len() + 24);
    push_limit_item(&mut out, name, decision);
    out
}

pub(crate) fn push_limit_item(out: &mut String, name: &str, decision: &Decision) {
    push_sf_string(out, name);
    out.push_str(";r=");
    push_u64(out, remaining(decision));
    out.push_str(";t=");
    push_u64(out, reset_secs(decision));
}

/// Appends `n` in decimal (with `itoa`: `write!` costs several times more, and this runs on
/// every response).
pub(crate) fn push_u64(out: &mut String, n: u64) {
    out.push_str(itoa::Buffer::new().format(n));
}

/// A limit's `RateLimit-Policy` item as a header value, formatted once (when the limit is
/// built) and shared by every answer of that limit.
pub fn policy_item_value(name: &str, quota: &Quota) -> HeaderValue {
    value_of(policy_item(name, quota))
}

/// The `RateLimit-Policy` item of a blocklist limit (0 units per `period`): `"name";q=0;w=60`.
pub fn blocked_policy_item_value(name: &str, period: std::time::Duration) -> HeaderValue {
    let mut out = String::with_capacity(name.len() + 16);
    push_sf_string(&mut out, name);
    out.push_str(";q=0;w=");
    push_u64(&mut out, period.as_secs().max(1));
    value_of(out)
}

/// A header value of printable ASCII (all the formatters write), taking the string's buffer.
fn value_of(text: String) -> HeaderValue {
    HeaderValue::from_maybe_shared(Bytes::from(text)).unwrap_or(HeaderValue::from_static(""))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn decision(allowed: bool, remaining: u64, reset_ms: u64, retry_ms: u64) -> Decision {
        Decision {
            allowed,
            limit: 10,
            burst: 10,
            remaining,
            reset_after: Duration::from_millis(reset_ms),
            retry_after: Duration::from_millis(retry_ms),
            fallback: None,
        }
    }

    #[test]
    fn items_follow_the_draft_syntax() {
        let q = Quota::per_minute(100);
        assert_eq!(policy_item("per-ip", &q), r#""per-ip";q=100;w=60"#);
        let d = decision(false, 0, 12_000, 11_001);
        assert_eq!(limit_item("per-ip", &d), r#""per-ip";r=0;t=12"#);
        let d = decision(true, 7, 2_500, 0);
        assert_eq!(limit_item("a\"b\\c\u{e9}", &d), r#""a\"b\\c?";r=7;t=3"#);
    }

    #[test]
    fn integers_are_written_in_decimal() {
        for n in [0, 7, 10, 99, 1_000_000, u64::MAX] {
            let mut out = String::new();
            push_u64(&mut out, n);
            assert_eq!(out, n.to_string());
        }
    }

    #[test]
    fn sub_second_periods_scale_to_whole_seconds_without_overstating() {
        let q = Quota::new(10, Duration::from_millis(100)).unwrap();
        assert_eq!(quota_window(&q), (100, 1));
        let q = Quota::new(3, Duration::from_millis(1500)).unwrap();
        assert_eq!(quota_window(&q), (4, 2));
        let q = Quota::per_hour(5);
        assert_eq!(quota_window(&q), (5, 3600));
    }

    #[test]
    fn a_burst_above_the_limit_is_a_vendor_parameter_and_r_never_exceeds_q() {
        let q = Quota::per_second(100).with_burst(200).unwrap();
        assert_eq!(
            policy_item("per_address", &q),
            r#""per_address";q=100;w=1;flowgate-burst=200"#
        );
        let d = Decision {
            burst: 200,
            limit: 100,
            ..decision(true, 199, 2_000, 0)
        };
        assert_eq!(limit_item("per_address", &d), r#""per_address";r=100;t=2"#);
        let small = Quota::per_second(100).with_burst(10).unwrap();
        assert_eq!(
            policy_item("a", &small),
            r#""a";q=100;w=1;flowgate-burst=10"#
        );
    }
}
