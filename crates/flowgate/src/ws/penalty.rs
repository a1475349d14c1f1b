//! The penalty box: clients closed for violations too often are refused at the upgrade for a
//! while that grows with each repeat (Binance: 2 minutes up to 3 days), in bounded memory.

use std::collections::HashMap;
use std::time::Duration;

use parking_lot::Mutex;

use crate::clock::{Nanos, nanos};

/// How the penalty box punishes repeat offenders. A client is the user of the connection,
/// else its IP key (the same key as `concurrent_per_ip`: an IPv6 address by its prefix); a
/// *violation close* is a close with the policy's violation code (`close_after`,
/// `close_at_multiple`), not 1009 nor the errors layer's close.
///
/// In a configuration file (feature `serde`): `{after_closes: 3, first: 2m, max: 3d,
/// forget_after: 3d, max_entries: 100000}`, each optional; `forget_after` defaults to `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PenaltyConfig {
    /// Violation closes within `forget_after` of each other before the first ban (default 3):
    /// the `after_closes`-th close bans.
    pub after_closes: u32,
    /// The first ban (default 2 minutes); each further close doubles it.
    pub first: Duration,
    /// The longest ban (default 3 days).
    pub max: Duration,
    /// A client with no close for this long starts afresh (default: the longest ban).
    pub forget_after: Duration,
    /// Most clients remembered (default 100,000); beyond, the ones whose bans end first are
    /// forgotten first.
    pub max_entries: usize,
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for PenaltyConfig {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        /// The fields as written; absent ones take the defaults.
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Fields {
            #[serde(default)]
            after_closes: Option<u32>,
            #[serde(default, deserialize_with = "crate::settings::optional_duration")]
            first: Option<Duration>,
            #[serde(default, deserialize_with = "crate::settings::optional_duration")]
            max: Option<Duration>,
            #[serde(default, deserialize_with = "crate::settings::optional_duration")]
            forget_after: Option<Duration>,
            #[serde(default)]
            max_entries: Option<usize>,
        }
        let f = Fields::deserialize(deserializer)?;
        let default = PenaltyConfig::default();
        let max = f.max.unwrap_or(default.max);
        Ok(PenaltyConfig {
            after_closes: f.after_closes.unwrap_or(default.after_closes),
            first: f.first.unwrap_or(default.first),
            max,
            forget_after: f.forget_after.unwrap_or(max),
            max_entries: f.max_entries.unwrap_or(default.max_entries),
        })
    }
}

impl Default for PenaltyConfig {
    fn default() -> Self {
        let max = Duration::from_secs(3 * 86_400);
        PenaltyConfig {
            after_closes: 3,
            first: Duration::from_secs(120),
            max,
            forget_after: max,
            max_entries: 100_000,
        }
    }
}

/// One client's record.
#[derive(Debug, Clone, Copy)]
struct Record {
    /// Violation closes so far.
    closes: u32,
    /// The last one.
    last: Nanos,
    /// Refused until then (0: not banned).
    banned_until: Nanos,
}

impl Record {
    /// When the record can be forgotten.
    fn expires(&self, forget_after: Nanos) -> Nanos {
        self.banned_until
            .max(self.last.saturating_add(forget_after))
    }
}

/// Clients (a user, else an IP) and their bans.
#[derive(Debug)]
pub(crate) struct PenaltyBox {
    config: PenaltyConfig,
    records: Mutex<HashMap<String, Record>>,
}

impl PenaltyBox {
    pub(crate) fn new(config: PenaltyConfig) -> Self {
        PenaltyBox {
            config,
            records: Mutex::new(HashMap::new()),
        }
    }

    /// How long `client` is still refused at `now`, if it is.
    pub(crate) fn banned_for(&self, client: &str, now: Nanos) -> Option<Duration> {
        let records = self.records.lock();
        let until = records.get(client)?.banned_until;
        (until > now).then(|| Duration::from_nanos(until - now))
    }

    /// Records a violation close of `client` at `now`; returns the ban it earned, if any.
    pub(crate) fn strike(&self, client: &str, now: Nanos) -> Option<Duration> {
        let forget = nanos(self.config.forget_after);
        let mut records = self.records.lock();
        if !records.contains_key(client) && records.len() >= self.config.max_entries.max(1) {
            records.retain(|_, r| r.expires(forget) > now);
            if records.len() >= self.config.max_entries.max(1) {
                // Still full: forget the record that would go first.
                let first = records
                    .iter()
                    .min_by_key(|(_, r)| r.expires(forget))
                    .map(|(k, _)| k.clone());
                if let Some(key) = first {
                    records.remove(&key);
                }
            }
        }
        let record = records.entry(client.to_owned()).or_insert(Record {
            closes: 0,
            last: now,
            banned_until: 0,
        });
        if record.expires(forget) <= now {
            *record = Record {
                closes: 0,
                last: now,
                banned_until: 0,
            };
        }
        record.closes += 1;
        record.last = now;
        let over = record.closes.checked_sub(self.config.after_closes)?;
        let ban = nanos(self.config.first)
            .saturating_mul(1u64 << over.min(62))
            .min(nanos(self.config.max));
        record.banned_until = now.saturating_add(ban);
        Some(Duration::from_nanos(ban))
    }

    /// Clients remembered now (for metrics and tests).
    pub(crate) fn len(&self) -> usize {
        self.records.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = 1_000_000_000;

    #[test]
    fn bans_start_after_the_threshold_double_and_cap() {
        let pb = PenaltyBox::new(PenaltyConfig {
            after_closes: 2,
            first: Duration::from_secs(10),
            max: Duration::from_secs(35),
            forget_after: Duration::from_secs(1000),
            max_entries: 10,
        });
        let t = 1_000 * S;
        assert_eq!(pb.strike("u", t), None);
        assert_eq!(pb.banned_for("u", t), None);
        assert_eq!(pb.strike("u", t), Some(Duration::from_secs(10)));
        assert_eq!(pb.banned_for("u", t + S), Some(Duration::from_secs(9)));
        assert_eq!(pb.strike("u", t + 20 * S), Some(Duration::from_secs(20)));
        assert_eq!(pb.strike("u", t + 50 * S), Some(Duration::from_secs(35)));
        assert_eq!(pb.banned_for("other", t), None);
        // Forgotten after a quiet spell.
        assert_eq!(pb.strike("u", t + 5_000 * S), None);
    }

    #[test]
    fn memory_is_bounded() {
        let pb = PenaltyBox::new(PenaltyConfig {
            max_entries: 100,
            ..PenaltyConfig::default()
        });
        for i in 0..10_000 {
            pb.strike(&format!("client-{i}"), S);
        }
        assert!(pb.len() <= 100, "{}", pb.len());
    }
}
