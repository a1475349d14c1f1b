//! The `rlqs` section (see [`crate::config::rlqs`]).

use std::path::Path;
use std::time::Duration;

use flowgate::Quota;
use flowgate::rlqs::Fairness;
use serde::Deserialize;

use super::{SectionErrors, Spanned};
use crate::config::error::ConfigError;
use crate::config::rlqs::{RlqsConfig, Unmatched};

/// The `rlqs` section.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RlqsYaml {
    /// The Envoys' reporting interval.
    #[serde(default)]
    report_interval: Option<Spanned<String>>,
    /// Assignments' time to live.
    #[serde(default)]
    assignment_ttl: Option<Spanned<String>>,
    /// Idle time before abandoning a bucket.
    #[serde(default)]
    abandon_after: Option<Spanned<String>>,
    /// allow | deny | divide.
    #[serde(default)]
    unmatched: Option<Spanned<String>>,
    /// The limit of `divide`.
    #[serde(default)]
    unmatched_limit: Option<Spanned<LimitYaml>>,
    /// The division's settings.
    #[serde(default)]
    fairness: Option<FairnessYaml>,
}

/// `{limit: N, per: DURATION}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitYaml {
    /// Requests per period.
    limit: Spanned<u64>,
    /// The period.
    per: Spanned<String>,
}

/// `fairness`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FairnessYaml {
    #[serde(default)]
    floor: Option<Spanned<f64>>,
    #[serde(default)]
    headroom: Option<Spanned<f64>>,
    #[serde(default)]
    burst: Option<Spanned<f64>>,
    #[serde(default)]
    overshoot: Option<Spanned<f64>>,
    #[serde(default)]
    join_budget: Option<Spanned<f64>>,
}

/// A `fairness` field and where its value goes.
type FairnessField<'a> = (&'a Option<Spanned<f64>>, fn(&mut Fairness) -> &mut f64);

/// Validates the `rlqs` section; pushes its errors and returns `None` when it has any.
pub(super) fn convert_rlqs(
    file: &Path,
    r: RlqsYaml,
    at_section: (u64, u64),
    errors: &mut Vec<ConfigError>,
) -> Option<RlqsConfig> {
    let before = errors.len();
    let mut e = SectionErrors::new(file, "rlqs", errors);
    let mut config = RlqsConfig::default();
    if let Some(d) = &r.report_interval
        && let Some(v) = e.duration(d, "report_interval")
    {
        if v <= Duration::from_millis(100) || v > Duration::from_secs(3600) {
            e.push(
                d.at,
                "report_interval",
                "must be longer than 100ms (Envoy's minimum) and at most 1h",
            );
        }
        config.report_interval = v;
    }
    if let Some(d) = &r.assignment_ttl
        && let Some(v) = e.duration(d, "assignment_ttl")
    {
        if v.subsec_nanos() != 0 || v.is_zero() {
            e.push(
                d.at,
                "assignment_ttl",
                "must be a whole number of seconds (Envoy ignores fractions), at least 1s",
            );
        }
        config.assignment_ttl = v;
    }
    if config.assignment_ttl <= config.report_interval {
        let at = r
            .assignment_ttl
            .as_ref()
            .or(r.report_interval.as_ref())
            .map_or(at_section, |d| d.at);
        e.push(
            at,
            "assignment_ttl",
            format!(
                "must be longer than report_interval ({}), or assignments expire between two ticks",
                humantime::format_duration(config.report_interval)
            ),
        );
    }
    if let Some(d) = &r.abandon_after
        && let Some(v) = e.duration(d, "abandon_after")
    {
        if v < config.report_interval * 2 {
            e.push(
                d.at,
                "abandon_after",
                "must be at least two report intervals",
            );
        }
        config.abandon_after = v;
    }
    let limit = r.unmatched_limit.as_ref().and_then(|l| {
        let period = e.duration(&l.value.per, "unmatched_limit.per")?;
        match Quota::new(l.value.limit.value, period) {
            Ok(q) if l.value.limit.value > 0 => Some(q),
            Ok(_) => {
                e.push(
                    l.value.limit.at,
                    "unmatched_limit.limit",
                    "must be at least 1 (use `unmatched: deny` to deny)",
                );
                None
            }
            Err(err) => {
                e.push(l.at, "unmatched_limit", err.to_string());
                None
            }
        }
    });
    match r.unmatched.as_ref().map(|u| (u, u.value.trim())) {
        None | Some((_, "allow")) => config.unmatched = Unmatched::Allow,
        Some((_, "deny")) => config.unmatched = Unmatched::Deny,
        Some((u, "divide")) => match limit {
            Some(q) => config.unmatched = Unmatched::Divide(q),
            None if r.unmatched_limit.is_none() => e.push(
                u.at,
                "unmatched",
                "`divide` needs `unmatched_limit: {limit: N, per: DURATION}`",
            ),
            None => {}
        },
        Some((u, other)) => e.push(
            u.at,
            "unmatched",
            format!("unknown value `{other}`; expected allow, deny or divide"),
        ),
    }
    let divides = matches!(config.unmatched, Unmatched::Divide(_))
        || r.unmatched
            .as_ref()
            .is_some_and(|u| u.value.trim() == "divide");
    if let Some(l) = &r.unmatched_limit
        && !divides
    {
        e.push(
            l.at,
            "unmatched_limit",
            "applies only with `unmatched: divide`",
        );
    }
    if let Some(f) = &r.fairness {
        let fields: [FairnessField<'_>; 5] = [
            (&f.floor, |x| &mut x.floor),
            (&f.headroom, |x| &mut x.headroom),
            (&f.burst, |x| &mut x.burst),
            (&f.overshoot, |x| &mut x.overshoot),
            (&f.join_budget, |x| &mut x.join_budget),
        ];
        // Each field checked on its own, so that every wrong one is reported.
        for (value, field) in fields {
            let Some(value) = value else { continue };
            let mut alone = Fairness::default();
            *field(&mut alone) = value.value;
            match alone.validate() {
                Ok(()) => *field(&mut config.fairness) = value.value,
                Err((name, message)) => {
                    e.push(value.at, &format!("fairness.{name}"), message);
                }
            }
        }
    }
    (errors.len() == before).then_some(config)
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use crate::config::rlqs::{RlqsConfig, Unmatched};

    fn parse(text: &str) -> Result<Option<RlqsConfig>, Vec<String>> {
        super::super::parse(Path::new("f.yaml"), text, &mut Vec::new())
            .map(|p| p.rlqs)
            .map_err(|e| e.iter().map(ToString::to_string).collect())
    }

    #[test]
    fn the_section_is_read_with_its_defaults() {
        let section = parse(
            "domain: d\nrlqs:\n  report_interval: 2s\n  assignment_ttl: 5s\n  unmatched: divide\n  unmatched_limit: {limit: 10, per: 1m}\n  fairness: {floor: 0.5, overshoot: 0}\n",
        )
        .unwrap()
        .unwrap();
        assert_eq!(section.report_interval, Duration::from_secs(2));
        assert_eq!(section.assignment_ttl, Duration::from_secs(5));
        assert_eq!(section.abandon_after, Duration::from_secs(30));
        assert!(matches!(section.unmatched, Unmatched::Divide(q) if q.limit() == 10));
        assert_eq!(
            (section.fairness.floor, section.fairness.overshoot),
            (0.5, 0.0)
        );
        assert_eq!(section.fairness.headroom, 1.1);
        assert_eq!(section.timing().stale_after, Duration::from_secs(9));
        assert_eq!(parse("domain: d\n").unwrap(), None);
    }

    #[test]
    fn every_wrong_field_is_reported_with_its_place() {
        let errors = parse(
            "domain: d\nrlqs:\n  report_interval: 50ms\n  assignment_ttl: 2.5s\n  abandon_after: soon\n  unmatched: maybe\n  fairness: {floor: 2, headroom: 0.5, join_budget: 0.9}\n",
        )
        .unwrap_err();
        let expected = [
            "f.yaml:3:20: `rlqs.report_interval`: must be longer than 100ms",
            "f.yaml:4:19: `rlqs.assignment_ttl`: must be a whole number of seconds",
            "f.yaml:5:18: `rlqs.abandon_after`: `soon` is not a duration",
            "f.yaml:6:14: `rlqs.unmatched`: unknown value `maybe`",
            "f.yaml:7:21: `rlqs.fairness.floor`: must be between 0 and 1",
            "f.yaml:7:34: `rlqs.fairness.headroom`: must be between 1 and 100",
            "f.yaml:7:52: `rlqs.fairness.join_budget`: must be between 0 and 0.5",
        ];
        for want in expected {
            assert!(
                errors.iter().any(|e| e.starts_with(want)),
                "{want}\n{errors:#?}"
            );
        }
        assert_eq!(errors.len(), expected.len(), "{errors:#?}");
        let ttl = parse("domain: d\nrlqs:\n  report_interval: 5s\n").unwrap_err();
        assert!(
            ttl[0].contains("must be longer than report_interval"),
            "{ttl:?}"
        );
        let divide = parse("domain: d\nrlqs:\n  unmatched: divide\n").unwrap_err();
        assert!(divide[0].contains("needs `unmatched_limit"), "{divide:?}");
        let stray =
            parse("domain: d\nrlqs:\n  unmatched_limit: {limit: 1, per: 1s}\n").unwrap_err();
        assert!(
            stray[0].contains("applies only with `unmatched: divide`"),
            "{stray:?}"
        );
    }
}
