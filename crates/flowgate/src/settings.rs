//! Settings from configuration files (feature `serde`): the library's settings types read
//! with serde, so that a YAML or JSON file holds the same model as the code that builds it.
//!
//! * [`Quota`]: `{limit: 10, per: 1s, burst: 20, algorithm: gcra}` (`burst` defaults to
//!   `limit`, `algorithm` to [`Algorithm::default`]); invalid quotas are refused with
//!   [`QuotaError`](crate::QuotaError)'s message.
//! * [`Algorithm`]: its configuration name (`gcra`, `token_bucket`, `leaky_bucket`, …).
//! * Durations: [`parse_duration`], the one syntax every duration of a configuration is
//!   written in (`90s`, `500ms`, `5m`, `1h30m`, `3d`; zero is refused), and [`duration`] /
//!   [`optional_duration`] for `#[serde(deserialize_with = …)]`.
//! * With `ws`, the WebSocket policy (`ws::WsPolicy`) and its parts.
//!
//! ```
//! use std::time::Duration;
//! use flowgate::Quota;
//!
//! let quota: Quota = serde_json::from_str(r#"{"limit": 10, "per": "1s", "burst": 20}"#)?;
//! assert_eq!((quota.limit(), quota.period(), quota.burst()), (10, Duration::from_secs(1), 20));
//! let zero = serde_json::from_str::<Quota>(r#"{"limit": 0, "per": "1s"}"#).unwrap_err();
//! assert!(zero.to_string().starts_with("limit must be at least 1"), "{zero}");
//! # Ok::<(), serde_json::Error>(())
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use serde::de::{Deserialize, Deserializer, Error as _};

use crate::quota::{Algorithm, Quota};

/// Why a duration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DurationError {
    /// The duration was zero.
    #[error("must be longer than zero")]
    Zero,
    /// The text is not a duration.
    #[error("`{text}` is not a duration ({reason}); write e.g. `30s`, `500ms`, `1h30m`")]
    Invalid {
        /// The text as written.
        text: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// Parses a duration as configuration files write it: a number and a unit, repeated
/// (`90s`, `500ms`, `5m`, `1h30m`, `3d`; humantime's syntax). Zero is refused: no setting
/// of the library means anything with a zero duration.
///
/// ```
/// use std::time::Duration;
/// use flowgate::settings::parse_duration;
/// assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
/// assert!(parse_duration("0s").is_err() && parse_duration("5 parsecs").is_err());
/// ```
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    match humantime::parse_duration(text.trim()) {
        Ok(d) if d.is_zero() => Err(DurationError::Zero),
        Ok(d) => Ok(d),
        Err(e) => Err(DurationError::Invalid {
            text: text.to_owned(),
            reason: e.to_string(),
        }),
    }
}

/// A duration written as text ([`parse_duration`]).
struct DurationText(Duration);

impl<'de> Deserialize<'de> for DurationText {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        parse_duration(&text)
            .map(DurationText)
            .map_err(D::Error::custom)
    }
}

/// Reads a duration field (`#[serde(deserialize_with = "flowgate::settings::duration")]`).
pub fn duration<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    DurationText::deserialize(deserializer).map(|d| d.0)
}

/// Reads an optional duration field (with `#[serde(default)]`).
pub fn optional_duration<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Duration>, D::Error> {
    Option::<DurationText>::deserialize(deserializer).map(|d| d.map(|d| d.0))
}

/// Reads a map of durations (`{lobby: 3s, news: 1m}`).
#[cfg_attr(not(feature = "ws"), allow(dead_code))]
pub(crate) fn duration_map<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<BTreeMap<String, Duration>, D::Error> {
    BTreeMap::<String, DurationText>::deserialize(deserializer)
        .map(|map| map.into_iter().map(|(k, d)| (k, d.0)).collect())
}

impl<'de> Deserialize<'de> for Algorithm {
    /// Its configuration name ([`Algorithm`]'s `FromStr`).
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        name.parse().map_err(D::Error::custom)
    }
}

/// A quota as written: `{limit, per, burst, algorithm}`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct QuotaFields {
    /// Units per period.
    limit: u64,
    /// The period.
    #[serde(deserialize_with = "duration")]
    per: Duration,
    /// The bucket (default: `limit`).
    #[serde(default)]
    burst: Option<u64>,
    /// The algorithm (default: [`Algorithm::default`]).
    #[serde(default)]
    algorithm: Option<Algorithm>,
}

impl<'de> Deserialize<'de> for Quota {
    /// `{limit: 10, per: 1s, burst: 20, algorithm: gcra}`, validated as [`Quota::new`],
    /// [`Quota::with_algorithm`] and [`Quota::with_burst`] validate.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let fields = QuotaFields::deserialize(deserializer)?;
        let quota = Quota::new(fields.limit, fields.per)
            .and_then(|q| match fields.algorithm {
                Some(algorithm) => q.with_algorithm(algorithm),
                None => Ok(q),
            })
            .and_then(|q| match fields.burst {
                Some(burst) => q.with_burst(burst),
                None => Ok(q),
            });
        quota.map_err(D::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_humantime_and_never_zero() {
        assert_eq!(parse_duration(" 500ms "), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("0ms"), Err(DurationError::Zero));
        assert!(
            parse_duration("soon")
                .unwrap_err()
                .to_string()
                .starts_with("`soon` is not a duration (")
        );
    }

    #[test]
    fn quotas_read_every_field_and_refuse_what_quota_refuses() {
        let q: Quota = serde_json::from_str(
            r#"{"limit": 3, "per": "90s", "burst": 6, "algorithm": "leaky_bucket"}"#,
        )
        .unwrap();
        assert_eq!(
            (q.limit(), q.period(), q.burst(), q.algorithm()),
            (3, Duration::from_secs(90), 6, Algorithm::LeakyBucket)
        );
        let window = serde_json::from_str::<Quota>(
            r#"{"limit": 3, "per": "1s", "burst": 6, "algorithm": "fixed_window"}"#,
        );
        assert!(window.unwrap_err().to_string().contains("burst applies to"));
        let unknown = serde_json::from_str::<Quota>(r#"{"limit": 3, "per": "1s", "brust": 6}"#);
        assert!(
            unknown
                .unwrap_err()
                .to_string()
                .contains("unknown field `brust`")
        );
    }
}
