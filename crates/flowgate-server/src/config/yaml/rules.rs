//! `descriptors` and their `rate_limit` blocks: envoyproxy/ratelimit's fields and Flowgate's
//! extensions (`algorithm`, `burst`, `period`, `fail`, `charge`, `calendar`, `time_zone`), and
//! `rate_limits`: a list of such blocks that must all allow ("10 per second and 10,000 per
//! day"), instead of `rate_limit`.

use std::path::Path;

use flowgate::calendar::{Calendar, CalendarUnit};
use flowgate::envoy::{LimitSpec, MetaValue, Metadata, Rate, RuleSpec, Unit};
use flowgate::settings::parse_duration;
use flowgate::{Algorithm, FailMode, Quota, QuotaError};
use serde::Deserialize;

use super::{Positions, Spanned};
use crate::config::error::ConfigError;

/// One descriptor rule.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DescriptorYaml {
    /// The entry key.
    key: Spanned<String>,
    /// The entry value; absent matches any value.
    #[serde(default)]
    value: Option<Spanned<String>>,
    /// The limit, if any.
    #[serde(default)]
    rate_limit: Option<Spanned<RateLimitYaml>>,
    /// Extension: several limits that must all allow, instead of `rate_limit`.
    #[serde(default)]
    rate_limits: Option<Spanned<Vec<Spanned<RateLimitYaml>>>>,
    /// Nested rules.
    #[serde(default)]
    descriptors: Option<Vec<DescriptorYaml>>,
    /// Count but never deny.
    #[serde(default)]
    shadow_mode: bool,
    /// Metrics per descriptor value.
    #[serde(default)]
    detailed_metric: bool,
    /// A denial denies only when every quota-mode limit of the request denies.
    #[serde(default)]
    quota_mode: bool,
    /// Metric names with the request's value at this level.
    #[serde(default)]
    value_to_metric: bool,
    /// Every value matching this rule's wildcard shares one counter.
    #[serde(default)]
    share_threshold: Option<Spanned<bool>>,
    /// Returned in the response's dynamic metadata for passing descriptors ending here.
    #[serde(default)]
    metadata: Option<MetadataYaml>,
}

/// A rule's `metadata`: any YAML mapping, as a protobuf `Struct` holds it (numbers as
/// doubles, keys as text).
#[derive(Debug)]
pub(super) struct MetadataYaml(Metadata);

impl<'de> Deserialize<'de> for MetadataYaml {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match MetaYaml::deserialize(deserializer)?.0 {
            MetaValue::Struct(map) => Ok(MetadataYaml(map)),
            MetaValue::Null => Ok(MetadataYaml(Metadata::new())),
            _ => Err(serde::de::Error::custom("expected a mapping")),
        }
    }
}

/// Any YAML value as a [`MetaValue`].
struct MetaYaml(MetaValue);

impl<'de> Deserialize<'de> for MetaYaml {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = MetaYaml;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("any YAML value")
            }
            fn visit_unit<E>(self) -> Result<MetaYaml, E> {
                Ok(MetaYaml(MetaValue::Null))
            }
            fn visit_none<E>(self) -> Result<MetaYaml, E> {
                Ok(MetaYaml(MetaValue::Null))
            }
            fn visit_bool<E>(self, v: bool) -> Result<MetaYaml, E> {
                Ok(MetaYaml(MetaValue::Bool(v)))
            }
            #[allow(clippy::cast_precision_loss)]
            fn visit_u64<E>(self, v: u64) -> Result<MetaYaml, E> {
                Ok(MetaYaml(MetaValue::Number(v as f64)))
            }
            #[allow(clippy::cast_precision_loss)]
            fn visit_i64<E>(self, v: i64) -> Result<MetaYaml, E> {
                Ok(MetaYaml(MetaValue::Number(v as f64)))
            }
            fn visit_f64<E>(self, v: f64) -> Result<MetaYaml, E> {
                Ok(MetaYaml(MetaValue::Number(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<MetaYaml, E> {
                Ok(MetaYaml(MetaValue::String(v.to_owned())))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<MetaYaml, A::Error> {
                let mut list = Vec::new();
                while let Some(MetaYaml(v)) = seq.next_element()? {
                    list.push(v);
                }
                Ok(MetaYaml(MetaValue::List(list)))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<MetaYaml, A::Error> {
                let mut out = Metadata::new();
                while let Some((MetaYaml(k), MetaYaml(v))) = map.next_entry()? {
                    out.insert(key_text(k), v);
                }
                Ok(MetaYaml(MetaValue::Struct(out)))
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// A mapping key as text, as envoyproxy/ratelimit formats non-text keys (`%v`).
fn key_text(key: MetaValue) -> String {
    match key {
        MetaValue::String(s) => s,
        MetaValue::Null => "<nil>".to_owned(),
        MetaValue::Bool(b) => b.to_string(),
        MetaValue::Number(n) => n.to_string(),
        other => format!("{other:?}"),
    }
}

/// The `rate_limit` block.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RateLimitYaml {
    /// second | minute | hour | day | week | month | year.
    #[serde(default)]
    unit: Option<Spanned<String>>,
    /// Requests per unit (or per period); 0 blocks.
    #[serde(default)]
    requests_per_unit: Option<Spanned<u64>>,
    /// Always allow.
    #[serde(default)]
    unlimited: Option<Spanned<bool>>,
    /// The limit's name.
    #[serde(default)]
    name: Option<Spanned<String>>,
    /// Limits this one replaces.
    #[serde(default)]
    replaces: Option<Vec<ReplacesYaml>>,
    /// Extension: the algorithm (default sliding_window).
    #[serde(default)]
    algorithm: Option<Spanned<String>>,
    /// Extension: the bucket size (gcra, leaky_bucket).
    #[serde(default)]
    burst: Option<Spanned<u64>>,
    /// Extension: any period, e.g. `90s`, `5m`, instead of `unit`.
    #[serde(default)]
    period: Option<Spanned<String>>,
    /// Extension: open | closed | local when the store is unreachable.
    #[serde(default)]
    fail: Option<Spanned<String>>,
    /// Extension: hits above zero are charges (usage reported after the response, Envoy's
    /// `apply_on_stream_done`): always taken, into debt past the limit.
    #[serde(default)]
    charge: Option<Spanned<bool>>,
    /// Extension: `unit` is a calendar period (day, week, month, year) renewed at local
    /// midnight, not a duration since the epoch: a calendar quota (a fixed window).
    #[serde(default)]
    calendar: Option<Spanned<bool>>,
    /// Extension: the IANA zone of a calendar quota's midnights (default `UTC`).
    #[serde(default)]
    time_zone: Option<Spanned<String>>,
}

/// One entry of `replaces`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplacesYaml {
    /// The replaced limit's name.
    name: Spanned<String>,
}

pub(super) fn convert_all(
    file: &Path,
    descriptors: Vec<DescriptorYaml>,
    path: &mut Vec<usize>,
    positions: &mut Positions,
    errors: &mut Vec<ConfigError>,
) -> Vec<RuleSpec> {
    let mut rules = Vec::with_capacity(descriptors.len());
    for (index, descriptor) in descriptors.into_iter().enumerate() {
        path.push(index);
        positions.rules.push((path.clone(), descriptor.key.at));
        if descriptor.key.value.is_empty() {
            errors.push(ConfigError::at(
                file,
                descriptor.key.at,
                Some("key"),
                "must not be empty",
            ));
        }
        let limits = match (descriptor.rate_limit, descriptor.rate_limits) {
            (Some(_), Some(list)) => {
                errors.push(ConfigError::at(
                    file,
                    list.at,
                    Some("rate_limits"),
                    "give either `rate_limit` or `rate_limits`, not both",
                ));
                Vec::new()
            }
            (Some(one), None) => convert_limit(file, "rate_limit", one, errors)
                .into_iter()
                .collect(),
            (None, Some(list)) => convert_limits(file, list, errors),
            (None, None) => Vec::new(),
        };
        let children = convert_all(
            file,
            descriptor.descriptors.unwrap_or_default(),
            path,
            positions,
            errors,
        );
        let share_threshold = match descriptor.share_threshold {
            Some(share) if share.value => {
                if descriptor
                    .value
                    .as_ref()
                    .is_none_or(|v| !v.value.contains('*'))
                {
                    errors.push(ConfigError::at(
                        file,
                        share.at,
                        Some("share_threshold"),
                        "only for a wildcard value (one with `*`)",
                    ));
                }
                true
            }
            _ => false,
        };
        let mut rule = RuleSpec::new(descriptor.key.value);
        rule.value = descriptor.value.map(|v| v.value);
        rule.limits = limits;
        rule.shadow_mode = descriptor.shadow_mode;
        rule.quota_mode = descriptor.quota_mode;
        rule.detailed_metric = descriptor.detailed_metric;
        rule.value_to_metric = descriptor.value_to_metric;
        rule.share_threshold = share_threshold;
        rule.metadata = descriptor.metadata.map(|m| m.0).filter(|m| !m.is_empty());
        rule.descriptors = children;
        rules.push(rule);
        path.pop();
    }
    rules
}

/// The calendar of a block with `calendar: true`: its `unit` in its `time_zone` (default UTC).
/// Reports `calendar` without a calendar unit (second, minute, hour, or a `period`), an unknown
/// zone, and `time_zone` without `calendar: true`.
fn calendar(
    r: &RateLimitYaml,
    unit: Option<Unit>,
    error: &mut impl FnMut((u64, u64), &str, String),
) -> Option<&'static Calendar> {
    let on = r.calendar.as_ref().filter(|c| c.value);
    let Some(on) = on else {
        if let Some(zone) = &r.time_zone {
            error(
                zone.at,
                "time_zone",
                "applies to calendar quotas only; add `calendar: true`".into(),
            );
        }
        return None;
    };
    let unit = match (unit, &r.unit, &r.period) {
        (Some(unit), _, _) => match unit.name().parse::<CalendarUnit>() {
            Ok(unit) => unit,
            Err(e) => {
                error(on.at, "calendar", e.to_string());
                return None;
            }
        },
        (None, None, Some(_)) => {
            error(
                on.at,
                "calendar",
                "needs `unit: day|week|month|year`, not a `period`".into(),
            );
            return None;
        }
        _ => return None, // `unit` missing or unknown: reported with the unit
    };
    let zone = r.time_zone.as_ref().map_or("UTC", |z| z.value.as_str());
    match Calendar::new(unit, zone) {
        Ok(calendar) => Some(calendar),
        Err(e) => {
            let at = r.time_zone.as_ref().map_or(on.at, |z| z.at);
            error(at, "time_zone", e.to_string());
            None
        }
    }
}

/// Validates a `rate_limits` list: each block as a `rate_limit`, none `unlimited` or of 0
/// requests, and at least one (what else the limits of one rule must satisfy, the rule set
/// checks: distinct quotas and names, none replacing another).
fn convert_limits(
    file: &Path,
    list: Spanned<Vec<Spanned<RateLimitYaml>>>,
    errors: &mut Vec<ConfigError>,
) -> Vec<LimitSpec> {
    if list.value.is_empty() {
        errors.push(ConfigError::at(
            file,
            list.at,
            Some("rate_limits"),
            "needs at least one limit",
        ));
    }
    let mut limits = Vec::with_capacity(list.value.len());
    for (index, block) in list.value.into_iter().enumerate() {
        let field = format!("rate_limits[{index}]");
        let at = block.at;
        let Some(limit) = convert_limit(file, &field, block, errors) else {
            continue;
        };
        if !matches!(limit.rate, Rate::Limited(_)) {
            errors.push(ConfigError::at(
                file,
                at,
                Some(&field),
                "every limit of `rate_limits` must count: not `unlimited`, not 0 requests (use `rate_limit` for those)",
            ));
        }
        limits.push(limit);
    }
    limits
}

/// Validates a `rate_limit` block (or an item of `rate_limits`, named `block_field` in
/// errors); pushes its errors and returns `None` when it has any.
fn convert_limit(
    file: &Path,
    block_field: &str,
    block: Spanned<RateLimitYaml>,
    errors: &mut Vec<ConfigError>,
) -> Option<LimitSpec> {
    let at_block = block.at;
    let r = block.value;
    let before = errors.len();
    let mut error = |at: (u64, u64), field: &str, message: String| {
        errors.push(ConfigError::at(
            file,
            at,
            Some(&format!("{block_field}.{field}")),
            message,
        ));
    };

    let unlimited = r.unlimited.as_ref().is_some_and(|u| u.value);
    if unlimited {
        // Everything that sizes a limit contradicts `unlimited: true`.
        let sized = [
            ("unit", r.unit.as_ref().map(|s| s.at)),
            ("period", r.period.as_ref().map(|s| s.at)),
            (
                "requests_per_unit",
                r.requests_per_unit.as_ref().map(|s| s.at),
            ),
            ("algorithm", r.algorithm.as_ref().map(|s| s.at)),
            ("burst", r.burst.as_ref().map(|s| s.at)),
            (
                "calendar",
                r.calendar.as_ref().filter(|c| c.value).map(|s| s.at),
            ),
            ("time_zone", r.time_zone.as_ref().map(|s| s.at)),
        ];
        for (field, at) in sized {
            if let Some(at) = at {
                error(at, field, "must not be set when `unlimited` is true".into());
            }
        }
    }

    let unit = r.unit.as_ref().and_then(|u| match u.value.parse::<Unit>() {
        Ok(unit) => Some(unit),
        Err(e) => {
            error(u.at, "unit", e.to_string());
            None
        }
    });
    let period = r
        .period
        .as_ref()
        .and_then(|p| match parse_duration(&p.value) {
            Ok(d) => Some(d),
            Err(e) => {
                error(p.at, "period", e.to_string());
                None
            }
        });
    if let (Some(_), Some(p)) = (&r.unit, &r.period) {
        error(
            p.at,
            "period",
            "give either `unit` or `period`, not both".into(),
        );
    }
    let calendar = calendar(&r, unit, &mut error);
    let algorithm = r
        .algorithm
        .as_ref()
        .and_then(|a| match a.value.parse::<Algorithm>() {
            Ok(algorithm) => Some(algorithm),
            Err(e) => {
                error(a.at, "algorithm", e.to_string());
                None
            }
        });
    let fail = r
        .fail
        .as_ref()
        .and_then(|f| match f.value.parse::<FailMode>() {
            Ok(mode) => Some(mode),
            Err(_) => {
                error(
                    f.at,
                    "fail",
                    format!(
                        "unknown failure mode `{}`; expected open, closed or local",
                        f.value
                    ),
                );
                None
            }
        });
    let mut replaces = Vec::new();
    for entry in r.replaces.into_iter().flatten() {
        if entry.name.value.is_empty() {
            error(entry.name.at, "replaces.name", "must not be empty".into());
        } else if r.name.as_ref().is_some_and(|n| n.value == entry.name.value) {
            error(
                entry.name.at,
                "replaces.name",
                format!("limit `{}` must not replace itself", entry.name.value),
            );
        }
        replaces.push(entry.name.value);
    }

    let rate = if unlimited {
        Some(Rate::Unlimited)
    } else {
        let length = match (unit, period, &r.unit, &r.period) {
            (Some(unit), None, _, None) => Some(unit.duration()),
            (None, Some(period), None, _) => Some(period),
            (None, None, None, None) => {
                error(
                    at_block,
                    "unit",
                    "a limit needs `unit` (second … year) or `period` (e.g. `90s`), or `unlimited: true`"
                        .into(),
                );
                None
            }
            _ => None, // already reported
        };
        let requests = match &r.requests_per_unit {
            Some(n) => Some(n),
            None => {
                error(
                    at_block,
                    "requests_per_unit",
                    "is required (0 blocks every request)".into(),
                );
                None
            }
        };
        match (length, requests) {
            (Some(period), Some(n)) if n.value == 0 => {
                if let Some(b) = &r.burst {
                    error(
                        b.at,
                        "burst",
                        "has no effect when `requests_per_unit` is 0".into(),
                    );
                }
                Some(Rate::Blocked { period })
            }
            (Some(period), Some(n)) => {
                let built = match calendar {
                    // A calendar quota is a fixed window unless told otherwise (and then
                    // refused with the reason).
                    Some(calendar) => Quota::per_calendar(n.value, calendar).and_then(|q| {
                        q.with_algorithm(algorithm.unwrap_or(Algorithm::FixedWindow))
                    }),
                    None => Quota::new(n.value, period)
                        .and_then(|q| q.with_algorithm(algorithm.unwrap_or_default())),
                };
                let built = built
                    .map_err(|e| match (e, &r.algorithm) {
                        (e @ QuotaError::CalendarNeedsFixedWindow { .. }, Some(a)) => {
                            ("algorithm", a.at, e)
                        }
                        (e, _) => ("requests_per_unit", n.at, e),
                    })
                    .and_then(|q| match &r.burst {
                        Some(b) => q.with_burst(b.value).map_err(|e| ("burst", b.at, e)),
                        None => Ok(q),
                    });
                match built {
                    Ok(quota) => Some(Rate::Limited(quota)),
                    Err((field, at, e)) => {
                        let message = match e {
                            QuotaError::BurstNotApplicable { algorithm } => format!(
                                "applies to gcra and leaky_bucket only; {algorithm} allows `requests_per_unit` per window"
                            ),
                            other => other.to_string(),
                        };
                        error(at, field, message);
                        None
                    }
                }
            }
            _ => None,
        }
    };
    let charge = r.charge.as_ref().is_some_and(|c| c.value);
    if let Some(c) = &r.charge
        && c.value
        && !matches!(rate, Some(Rate::Limited(_)))
        && rate.is_some()
    {
        error(
            c.at,
            "charge",
            "has no effect on an unlimited limit or one with `requests_per_unit: 0`".into(),
        );
    }
    if errors.len() > before {
        return None;
    }
    Some(LimitSpec {
        rate: rate?,
        name: r.name.map(|n| n.value),
        replaces,
        fail,
        charge,
    })
}
