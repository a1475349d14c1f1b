//! Counter keys: where a descriptor's counter lives in the store.

use super::descriptor::Entry;
use super::rules::{Rule, parse_quota_suffix, quota_suffix};
use crate::quota::Quota;
use crate::store::key::{KeyWriter, decode};

/// The store key of a descriptor's counter: the domain, every entry, and the quota (algorithm,
/// limit, period, burst), in the [one key grammar](crate::store::key) of every front end, so
/// different descriptors never share a key; a rule keeps its counters across reloads as long
/// as its quota is unchanged.
///
/// ```
/// use flowgate::envoy::{counter_key, Entry};
/// use flowgate::Quota;
/// let quota = Quota::per_second(10);
/// assert_eq!(
///     counter_key("edge", &[Entry::new("ip", "10.0.0.1")], &quota),
///     "edge|ip=10.0.0.1#gcra:10:1000000000:10",
/// );
/// ```
pub fn counter_key(domain: &str, entries: &[Entry], quota: &Quota) -> String {
    let mut key = String::new();
    write_key(&mut key, domain, entries, &quota_suffix(quota));
    key
}

/// An Envoy domain's counter key read back ([`decode_counter_key`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CounterKey {
    /// The domain.
    pub domain: String,
    /// The descriptor's entries (for a level with `share_threshold`, the value is the
    /// wildcard pattern every matching value counts under).
    pub entries: Vec<Entry>,
    /// The quota the counter is kept under; `None` when this build cannot rebuild it (a
    /// calendar quota without the `calendar` feature).
    pub quota: Option<Quota>,
}

/// Reads a counter key that [`counter_key`] (or the service) built back into its domain,
/// entries and quota; `None` for a key that is not an Envoy domain's counter (another front
/// end's, or text outside the key grammar). Every limit of a rule with several limits, every
/// calendar quota and every charged limit has its own key, which reads back on its own.
///
/// ```
/// use flowgate::envoy::{counter_key, decode_counter_key, Entry};
/// use flowgate::Quota;
/// let quota = Quota::per_second(10).with_burst(20)?;
/// let entries = [Entry::new("ip", "10.0.0.1")];
/// let key = decode_counter_key(&counter_key("edge", &entries, &quota)).unwrap();
/// assert_eq!((key.domain.as_str(), key.entries.as_slice()), ("edge", &entries[..]));
/// assert_eq!(key.quota, Some(quota));
/// # Ok::<(), flowgate::QuotaError>(())
/// ```
pub fn decode_counter_key(key: &str) -> Option<CounterKey> {
    let decoded = decode(key)?;
    if decoded.tagged {
        return None;
    }
    let suffix = decoded.suffix?;
    Some(CounterKey {
        domain: decoded.origin,
        entries: decoded
            .fields
            .into_iter()
            .map(|(key, value)| Entry::new(key, value))
            .collect(),
        quota: parse_quota_suffix(suffix),
    })
}

/// Appends the counter key of `entries` to `key`; `suffix` is the quota's ([`quota_suffix`]).
pub(super) fn write_key(key: &mut String, domain: &str, entries: &[Entry], suffix: &str) {
    let mut writer = KeyWriter::domain(key, domain);
    for entry in entries {
        writer = writer.field(&entry.key, &entry.value);
    }
    writer.suffix(suffix);
}

/// Appends the counter key of `entries` under `rule` to `key`: as [`write_key`] with the rule's
/// quota, but a level with `share_threshold` writes its wildcard pattern instead of the
/// request's value, so every matching value counts in one counter.
pub(super) fn write_rule_key(key: &mut String, domain: &str, entries: &[Entry], rule: &Rule) {
    if !rule.shares_counter() {
        return write_key(key, domain, entries, rule.counter_suffix());
    }
    let mut writer = KeyWriter::domain(key, domain);
    for (i, entry) in entries.iter().enumerate() {
        let value = rule
            .levels
            .get(i)
            .and_then(|l| l.shared_pattern())
            .unwrap_or(&entry.value);
        writer = writer.field(&entry.key, value);
    }
    writer.suffix(rule.counter_suffix());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_keys_read_back_with_every_algorithm_and_burst() {
        use crate::quota::Algorithm;
        use std::time::Duration;
        let entries = [Entry::new("a|b", "c=d#"), Entry::new("k", "")];
        for algorithm in Algorithm::ALL {
            let quota = Quota::new(7, Duration::from_millis(1500))
                .unwrap()
                .with_algorithm(algorithm)
                .unwrap();
            let quota = if algorithm.has_burst() {
                quota.with_burst(9).unwrap()
            } else {
                quota
            };
            let key = counter_key("d:x", &entries, &quota);
            let back = decode_counter_key(&key).unwrap();
            assert_eq!(back.domain, "d:x");
            assert_eq!(back.entries, entries);
            assert_eq!(back.quota, Some(quota), "{key}");
        }
        // Not a domain's counter: another front end's key, no quota, not the grammar.
        assert_eq!(decode_counter_key("http:per-ip|key=1"), None);
        assert_eq!(decode_counter_key("d|k=v"), None);
        assert_eq!(decode_counter_key("d|k"), None);
        // A suffix that is not a quota (or not the one it writes back to) has none.
        assert_eq!(decode_counter_key("d|k=v#gcra:x").unwrap().quota, None);
        assert_eq!(
            decode_counter_key("d|k=v#gcra:1:1000:01").unwrap().quota,
            None
        );
    }

    #[cfg(feature = "calendar")]
    #[test]
    fn calendar_counter_keys_read_back() {
        use crate::calendar::{Calendar, CalendarUnit};
        let quota = Quota::per_calendar(
            10_000,
            Calendar::new(CalendarUnit::Month, "Europe/Berlin").unwrap(),
        )
        .unwrap();
        let key = counter_key("api", &[Entry::new("api_key", "k1")], &quota);
        assert!(key.ends_with(":month@Europe/Berlin"), "{key}");
        assert_eq!(decode_counter_key(&key).unwrap().quota, Some(quota));
    }

    #[test]
    fn counter_keys_are_unambiguous_and_include_the_quota() {
        let q = Quota::per_second(1);
        let a = counter_key("d", &[Entry::new("a|b", "c")], &q);
        let b = counter_key("d", &[Entry::new("a", "b=c")], &q);
        let c = counter_key("d", &[Entry::new("a", "b"), Entry::new("", "c")], &q);
        assert!(a != b && b != c && a != c, "{a} {b} {c}");
        assert_ne!(
            counter_key("d", &[Entry::new("a", "b")], &q),
            counter_key("d", &[Entry::new("a", "b")], &Quota::per_second(2))
        );
        // Unchanged by the one grammar, but for domains holding `:`.
        assert_eq!(
            counter_key("d:x", &[Entry::new("ip", "2001:db8::1")], &q),
            r"d\:x|ip=2001:db8::1#gcra:1:1000000000:1"
        );
    }
}
