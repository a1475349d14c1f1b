//! The rate-limit response headers: IETF `RateLimit-Policy` and `RateLimit`
//! (draft-ietf-httpapi-ratelimit-headers-10), legacy `X-RateLimit-*`, and `Retry-After`.
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

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};

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

/// One limit's part in a response: its name, its quota and what it decided.
#[derive(Debug, Clone, Copy)]
pub struct Report<'a> {
    /// The limit's name, shown as the policy identifier.
    pub name: &'a str,
    /// The quota that was enforced.
    pub quota: &'a Quota,
    /// What the limit decided for this request.
    pub decision: &'a Decision,
}

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
/// assert_eq!(flowgate::http::headers::sf_string("a\"b"), r#""a\"b""#);
/// ```
pub fn sf_string(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 2);
    push_sf_string(&mut out, name);
    out
}

/// Appends `name` as an sf-string: quoted, `"` and `\` escaped, anything outside printable
/// ASCII replaced by `?` (sf-strings cannot carry it).
fn push_sf_string(out: &mut String, name: &str) {
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
    push_u64(out, decision.remaining);
    out.push_str(";t=");
    push_u64(out, reset_secs(decision));
}

/// Appends `n` in decimal (with `itoa`: `write!` costs several times more, and this runs on
/// every response).
pub(crate) fn push_u64(out: &mut String, n: u64) {
    out.push_str(itoa::Buffer::new().format(n));
}

/// Appends `RateLimit-Policy` and `RateLimit` for `reports` (nothing if empty). With `legacy`,
/// also sets `X-RateLimit-Limit/Remaining/Reset` from the binding report: the first denial, else
/// the one with the fewest units remaining.
pub fn append_ratelimit_headers(headers: &mut HeaderMap, reports: &[Report<'_>], legacy: bool) {
    if reports.is_empty() {
        return;
    }
    let join = |item: fn(&mut String, &Report<'_>)| {
        let mut out = String::with_capacity(reports.len() * 32);
        for (i, report) in reports.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            item(&mut out, report);
        }
        out
    };
    let policy = join(|out, r| push_policy_item(out, r.name, r.quota));
    let limit = join(|out, r| push_limit_item(out, r.name, r.decision));
    // Only printable ASCII goes in, so these conversions cannot fail; they take the strings'
    // buffers rather than copying them.
    if let Ok(v) = HeaderValue::from_maybe_shared(Bytes::from(policy)) {
        headers.append(RATELIMIT_POLICY.clone(), v);
    }
    if let Ok(v) = HeaderValue::from_maybe_shared(Bytes::from(limit)) {
        headers.append(RATELIMIT.clone(), v);
    }
    if legacy {
        let binding = reports
            .iter()
            .find(|r| !r.decision.allowed)
            .or_else(|| reports.iter().min_by_key(|r| r.decision.remaining));
        if let Some(r) = binding {
            headers.insert(
                X_RATELIMIT_LIMIT.clone(),
                HeaderValue::from(r.decision.limit),
            );
            headers.insert(
                X_RATELIMIT_REMAINING.clone(),
                HeaderValue::from(r.decision.remaining),
            );
            headers.insert(
                X_RATELIMIT_RESET.clone(),
                HeaderValue::from(reset_secs(r.decision)),
            );
        }
    }
}

/// The rate-limit fields of one response, collected by [`FieldsBuilder`] and added to the
/// response when it is ready.
#[derive(Debug, Default)]
pub(crate) struct Fields {
    /// `RateLimit-Policy`.
    policy: Option<HeaderValue>,
    /// `RateLimit`.
    limit: Option<HeaderValue>,
    /// `X-RateLimit-Limit`, `-Remaining`, `-Reset`.
    legacy: Option<[u64; 3]>,
    /// `Flowgate-Fallback`: the fail mode's name.
    pub(crate) fallback: Option<&'static str>,
}

impl Fields {
    /// Adds the fields to `headers` (`RateLimit` items after any already there).
    pub(crate) fn apply(self, headers: &mut HeaderMap) {
        if let Some(v) = self.policy {
            headers.append(RATELIMIT_POLICY.clone(), v);
        }
        if let Some(v) = self.limit {
            headers.append(RATELIMIT.clone(), v);
        }
        if let Some([limit, remaining, reset]) = self.legacy {
            headers.insert(X_RATELIMIT_LIMIT.clone(), HeaderValue::from(limit));
            headers.insert(X_RATELIMIT_REMAINING.clone(), HeaderValue::from(remaining));
            headers.insert(X_RATELIMIT_RESET.clone(), HeaderValue::from(reset));
        }
        if let Some(mode) = self.fallback {
            headers.insert(FLOWGATE_FALLBACK.clone(), HeaderValue::from_static(mode));
        }
    }
}

/// Collects a response's [`Fields`] one limit at a time, without a list of the limits: the
/// `RateLimit` items are written into a caller's (reused) buffer, and a single limit's
/// `RateLimit-Policy` item is shared, not copied.
pub(crate) struct FieldsBuilder<'b> {
    /// `RateLimit-Policy` so far.
    policy: PolicyItems,
    /// `RateLimit` so far.
    limit: &'b mut String,
    /// Whether to keep the binding limit for the legacy fields.
    legacy: bool,
    /// The binding limit so far (the first denial, else the fewest remaining): whether it
    /// allowed, and its `[limit, remaining, reset]`.
    binding: Option<(bool, [u64; 3])>,
}

/// The `RateLimit-Policy` items of the limits seen so far.
enum PolicyItems {
    None,
    /// One limit's pre-formatted item.
    One(HeaderValue),
    /// Several, joined with `, `.
    Joined(Vec<u8>),
}

impl<'b> FieldsBuilder<'b> {
    /// An empty builder writing `RateLimit` into `buffer` (cleared first); `legacy` also
    /// collects `X-RateLimit-*`.
    pub(crate) fn new(buffer: &'b mut String, legacy: bool) -> Self {
        buffer.clear();
        FieldsBuilder {
            policy: PolicyItems::None,
            limit: buffer,
            legacy,
            binding: None,
        }
    }

    /// Adds one limit: its formatted `RateLimit-Policy` item, its name (a valid policy name,
    /// which needs no escaping) and its decision.
    pub(crate) fn push(&mut self, policy_item: &HeaderValue, name: &str, decision: &Decision) {
        match &mut self.policy {
            PolicyItems::None => self.policy = PolicyItems::One(policy_item.clone()),
            PolicyItems::One(first) => {
                let mut joined = first.as_bytes().to_vec();
                joined.extend_from_slice(b", ");
                joined.extend_from_slice(policy_item.as_bytes());
                self.policy = PolicyItems::Joined(joined);
            }
            PolicyItems::Joined(joined) => {
                joined.extend_from_slice(b", ");
                joined.extend_from_slice(policy_item.as_bytes());
            }
        }
        if !self.limit.is_empty() {
            self.limit.push_str(", ");
        }
        self.limit.push('"');
        self.limit.push_str(name);
        self.limit.push_str("\";r=");
        push_u64(self.limit, decision.remaining);
        self.limit.push_str(";t=");
        let reset = reset_secs(decision);
        push_u64(self.limit, reset);
        if self.legacy {
            let binds = match self.binding {
                None => true,
                Some((allowed, [_, remaining, _])) => {
                    allowed && (!decision.allowed || decision.remaining < remaining)
                }
            };
            if binds {
                let fields = [decision.limit, decision.remaining, reset];
                self.binding = Some((decision.allowed, fields));
            }
        }
    }

    /// The fields (none when no limit was added).
    pub(crate) fn build(self) -> Fields {
        let policy = match self.policy {
            PolicyItems::None => return Fields::default(),
            PolicyItems::One(item) => item,
            PolicyItems::Joined(joined) => shared_value(joined),
        };
        Fields {
            policy: Some(policy),
            // Only printable ASCII was written.
            limit: HeaderValue::from_str(self.limit).ok(),
            legacy: self.binding.map(|(_, fields)| fields),
            fallback: None,
        }
    }
}

/// A header value from bytes that are printable ASCII by construction, without copying them.
fn shared_value(bytes: Vec<u8>) -> HeaderValue {
    HeaderValue::from_maybe_shared(bytes::Bytes::from(bytes))
        .unwrap_or(HeaderValue::from_static(""))
}

/// Sets `Retry-After` to `secs`, raised to at least 1: a limited client is never told to retry
/// at once.
pub fn set_retry_after(headers: &mut HeaderMap, secs: u64) {
    headers.insert(RETRY_AFTER, HeaderValue::from(secs.max(1)));
}

/// The `Retry-After` for a denied request: the longest wait among the limits that denied it
/// (all must allow before it can pass), in whole seconds rounded up, at least 1.
pub fn retry_after_secs<'a>(denials: impl IntoIterator<Item = &'a Decision>) -> u64 {
    denials
        .into_iter()
        .map(Decision::retry_after_secs)
        .max()
        .unwrap_or(1)
        .max(1)
}

/// Reads a `Retry-After` value: delay-seconds (`120`) or an HTTP-date (a date in the past is
/// zero). `None` for anything else.
pub fn parse_retry_after(value: &HeaderValue) -> Option<std::time::Duration> {
    let text = value.to_str().ok()?.trim();
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        // More digits than a u64 holds is still "a very long time".
        return Some(std::time::Duration::from_secs(
            text.parse().unwrap_or(u64::MAX),
        ));
    }
    let date = httpdate::parse_http_date(text).ok()?;
    Some(
        date.duration_since(std::time::SystemTime::now())
            .unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::any;
    use std::time::Duration;

    fn decision(allowed: bool, remaining: u64, reset_ms: u64, retry_ms: u64) -> Decision {
        Decision {
            allowed,
            limit: 10,
            remaining,
            reset_after: Duration::from_millis(reset_ms),
            retry_after: Duration::from_millis(retry_ms),
            fallback: None,
        }
    }

    #[test]
    fn items_follow_the_draft_syntax() {
        let q = Quota::per_minute(100).unwrap();
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
        let q = Quota::per_hour(5).unwrap();
        assert_eq!(quota_window(&q), (5, 3600));
    }

    #[test]
    fn retry_after_values_parse_as_seconds_or_dates() {
        let v = |s: &str| parse_retry_after(&HeaderValue::from_str(s).unwrap());
        assert_eq!(v(" 120 "), Some(Duration::from_secs(120)));
        assert_eq!(
            v("99999999999999999999999"),
            Some(Duration::from_secs(u64::MAX))
        );
        assert_eq!(v("Wed, 21 Oct 2015 07:28:00 GMT"), Some(Duration::ZERO));
        let later = std::time::SystemTime::now() + Duration::from_secs(30);
        let d = v(&httpdate::fmt_http_date(later)).unwrap();
        assert!(
            d > Duration::from_secs(27) && d <= Duration::from_secs(30),
            "{d:?}"
        );
        assert_eq!(v("-1"), None);
        assert_eq!(v("soon"), None);
    }

    #[test]
    fn retry_after_is_never_zero() {
        let mut h = HeaderMap::new();
        set_retry_after(&mut h, 0);
        assert_eq!(h[RETRY_AFTER], "1");
        let d = [decision(false, 0, 0, 1), decision(false, 0, 0, 2_100)];
        assert_eq!(retry_after_secs(&d), 3);
        assert_eq!(retry_after_secs(&[]), 1);
    }

    #[test]
    fn legacy_headers_show_the_binding_limit() {
        let (qa, qb) = (
            Quota::per_second(10).unwrap(),
            Quota::per_minute(5).unwrap(),
        );
        let (da, db) = (decision(true, 3, 500, 0), decision(true, 1, 40_000, 0));
        let reports = [
            Report {
                name: "a",
                quota: &qa,
                decision: &da,
            },
            Report {
                name: "b",
                quota: &qb,
                decision: &db,
            },
        ];
        let mut h = HeaderMap::new();
        append_ratelimit_headers(&mut h, &reports, true);
        assert_eq!(h[&RATELIMIT_POLICY], r#""a";q=10;w=1, "b";q=5;w=60"#);
        assert_eq!(h[&RATELIMIT], r#""a";r=3;t=1, "b";r=1;t=40"#);
        assert_eq!(h[&X_RATELIMIT_REMAINING], "1");
        assert_eq!(h[&X_RATELIMIT_RESET], "40");
    }

    proptest::proptest! {
        /// The layer's builder writes exactly the fields that the public formatter writes for
        /// the same limits: the same items, separators, binding limit and legacy values.
        #[test]
        fn the_layers_fields_are_the_formatters_fields(
            limits in proptest::collection::vec(
                (any_name(), 1u64..1_000, 1u64..100_000, any::<bool>(), 0u64..1_000,
                 0u64..10_000_000, 0u64..10_000_000),
                0..5,
            ),
            legacy in any::<bool>(),
        ) {
            let quotas: Vec<Quota> = limits
                .iter()
                .map(|l| Quota::new(l.1, Duration::from_millis(l.2)).unwrap())
                .collect();
            let decisions: Vec<Decision> = limits
                .iter()
                .map(|l| Decision {
                    allowed: l.3,
                    limit: l.1,
                    remaining: l.4,
                    reset_after: Duration::from_micros(l.5),
                    retry_after: Duration::from_micros(l.6),
                    fallback: None,
                })
                .collect();
            let reports: Vec<Report<'_>> = limits
                .iter()
                .zip(&quotas)
                .zip(&decisions)
                .map(|((l, quota), decision)| Report { name: &l.0, quota, decision })
                .collect();
            let mut expected = HeaderMap::new();
            append_ratelimit_headers(&mut expected, &reports, legacy);

            let items: Vec<HeaderValue> = reports
                .iter()
                .map(|r| HeaderValue::from_str(&policy_item(r.name, r.quota)).unwrap())
                .collect();
            let mut buffer = String::from("left over");
            let mut builder = FieldsBuilder::new(&mut buffer, legacy);
            for (report, item) in reports.iter().zip(&items) {
                builder.push(item, report.name, report.decision);
            }
            let mut built = HeaderMap::new();
            builder.build().apply(&mut built);
            proptest::prop_assert_eq!(built, expected);
        }
    }

    /// Valid policy names (the layer only ever formats those).
    fn any_name() -> impl proptest::strategy::Strategy<Value = String> {
        proptest::string::string_regex("[A-Za-z0-9._/-]{1,12}").unwrap()
    }
}
