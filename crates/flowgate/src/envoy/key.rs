//! Counter keys: where a descriptor's counter lives in the store.

use super::descriptor::Entry;
use super::rules::{Rule, quota_suffix};
use crate::quota::Quota;
use crate::store::key::KeyWriter;

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
