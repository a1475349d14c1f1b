//! The YAML file format: envoyproxy/ratelimit's, plus Flowgate's extensions inside
//! `rate_limit` (`algorithm`, `burst`, `period`, `fail`) and the top-level `gateway` and
//! `websocket` sections. Every problem of a file is reported at once, each with its line,
//! column and field.
//!
//! * this module: a file's top level, syntax errors, the field names errors use;
//! * [`node`]: the document as a tree of positioned nodes; [`de`]: typed sections read from
//!   it with serde, every problem found;
//! * [`rules`]: `descriptors` and `rate_limit`;
//! * [`gateway`]: the `gateway` section; [`websocket`]: the `websocket` section.
//!
//! A field's kind is checked where it is read, once for every section: durations by
//! `flowgate::settings` (`90s`, `1h30m`, never zero), addresses and trusted proxies by
//! [`crate::config::address`], quotas and the WebSocket policy by the library's `Deserialize`;
//! what depends on several fields is checked by the section's module, with the fields'
//! positions.

mod concurrency;
mod de;
mod gateway;
mod node;
mod rlqs;
mod rules;
mod websocket;

use std::path::Path;

use flowgate::envoy::DomainSpec;
use serde::Deserialize;

use super::Reference;
use super::concurrency::ConcurrencyLimit;
use super::error::ConfigError;
use super::gateway::GatewayConfig;
use super::rlqs::RlqsConfig;
use super::websocket::WebSocketConfig;
use concurrency::{ConcurrencyYaml, convert_concurrency};
pub(crate) use de::Spanned;
use de::{Problem, from_node};
pub(crate) use gateway::PendingInFlight;
use gateway::{GatewayYaml, convert_gateway};
use node::Node;
use rlqs::{RlqsYaml, convert_rlqs};
use rules::{DescriptorYaml, convert_all};
use websocket::{WebSocketYaml, convert_websocket};

/// One configuration file: one domain.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileYaml {
    /// The domain requests name.
    domain: Spanned<String>,
    /// Top-level rules.
    #[serde(default)]
    descriptors: Option<Vec<DescriptorYaml>>,
    /// Extension: how the reverse proxy builds descriptors from HTTP requests.
    #[serde(default)]
    gateway: Option<Spanned<GatewayYaml>>,
    /// Extension: the WebSocket gateway's upgrade and message limits.
    #[serde(default)]
    websocket: Option<Spanned<WebSocketYaml>>,
    /// Extension: how Envoy's Rate Limit Quota Service divides this domain's limits.
    #[serde(default)]
    rlqs: Option<Spanned<RlqsYaml>>,
    /// Extension: named in-flight limits, held by leases (`/v1/leases`).
    #[serde(default)]
    concurrency: Option<Vec<ConcurrencyYaml>>,
}

/// Collects the errors of one section (`websocket`, `rlqs`), each named `section.field`.
struct SectionErrors<'a> {
    file: &'a Path,
    section: &'static str,
    errors: &'a mut Vec<ConfigError>,
}

impl<'a> SectionErrors<'a> {
    fn new(file: &'a Path, section: &'static str, errors: &'a mut Vec<ConfigError>) -> Self {
        SectionErrors {
            file,
            section,
            errors,
        }
    }

    /// Adds `message` about `field` (relative to the section) at `at`.
    fn push(&mut self, at: (u64, u64), field: &str, message: impl Into<String>) {
        self.errors.push(ConfigError::at(
            self.file,
            at,
            Some(&format!("{}.{field}", self.section)),
            message,
        ));
    }

    /// The duration `d` (`flowgate::settings`' syntax), or its error pushed under `field`.
    fn duration(&mut self, d: &Spanned<String>, field: &str) -> Option<std::time::Duration> {
        match flowgate::settings::parse_duration(&d.value) {
            Ok(v) => Some(v),
            Err(e) => {
                self.push(d.at, field, e.to_string());
                None
            }
        }
    }
}

/// Where each rule of a parsed file is, by index path below the domain, for errors found
/// after parsing (duplicates).
#[derive(Debug, Default)]
pub(crate) struct Positions {
    /// The `domain` value.
    pub(crate) domain: (u64, u64),
    /// `(index path, position of the rule's key)`.
    pub(crate) rules: Vec<(Vec<usize>, (u64, u64))>,
}

impl Positions {
    /// The position of the rule at `path` (the domain's when `path` is empty).
    pub(crate) fn of(&self, path: &[usize]) -> (u64, u64) {
        self.rules
            .iter()
            .find(|(p, _)| p == path)
            .map_or(self.domain, |(_, at)| *at)
    }
}

/// One parsed file.
#[derive(Debug)]
pub(crate) struct Parsed {
    /// The domain's rules.
    pub(crate) domain: DomainSpec,
    /// Where its rules are, for later errors.
    pub(crate) positions: Positions,
    /// The `gateway` section, if any, with its position and its `in_flight` items (their
    /// `concurrency` limits still to be found).
    pub(crate) gateway: Option<(GatewayConfig, (u64, u64), Vec<PendingInFlight>)>,
    /// The `websocket` section, if any, with its position.
    pub(crate) websocket: Option<(WebSocketConfig, (u64, u64))>,
    /// The `rlqs` section, if any.
    pub(crate) rlqs: Option<RlqsConfig>,
    /// The `concurrency` limits, each with its name's position.
    pub(crate) concurrency: Vec<(String, (u64, u64), ConcurrencyLimit)>,
}

/// Parses one file into its domain (and its sections), collecting every problem. Files it
/// refers to are noted in `references`.
pub(crate) fn parse(
    file: &Path,
    text: &str,
    references: &mut Vec<Reference>,
) -> Result<Parsed, Vec<ConfigError>> {
    let root = Node::parse(text).map_err(|e| vec![syntax_error(file, &e)])?;
    if root.is_null() {
        return Err(vec![ConfigError::file(
            file,
            "is empty: a configuration file needs at least `domain: NAME`",
        )]);
    }
    let (yaml, problems) = from_node::<FileYaml>(&root);
    let mut errors: Vec<ConfigError> = problems.iter().map(|p| problem(file, p)).collect();
    // A value refused while reading is absent below: what the checks then say about its field
    // (at the value, or missing from its mapping) was already said.
    let left_out: Vec<&Problem> = problems
        .iter()
        .filter(|p| p.left_out_of.is_some())
        .collect();
    let Some(yaml) = yaml else {
        return Err(errors);
    };
    let mut checked = Vec::new();
    let mut positions = Positions {
        domain: yaml.domain.at,
        rules: Vec::new(),
    };
    if yaml.domain.value.is_empty() {
        checked.push(ConfigError::at(
            file,
            positions.domain,
            Some("domain"),
            "must not be empty",
        ));
    }
    let mut path = Vec::new();
    let descriptors = convert_all(
        file,
        yaml.descriptors.unwrap_or_default(),
        &mut path,
        &mut positions,
        &mut checked,
    );
    let gateway = yaml.gateway.and_then(|g| {
        let at = g.at;
        convert_gateway(
            file,
            &yaml.domain.value,
            g.value,
            at,
            &mut checked,
            references,
        )
        .map(|(g, in_flight)| (g, at, in_flight))
    });
    let websocket = yaml.websocket.and_then(|w| {
        let at = w.at;
        let node = root.find(&["websocket"]);
        convert_websocket(file, w.value, at, node, &mut checked, references).map(|w| (w, at))
    });
    let rlqs = yaml
        .rlqs
        .and_then(|r| convert_rlqs(file, r.value, r.at, &mut checked));
    let concurrency = convert_concurrency(file, yaml.concurrency.unwrap_or_default(), &mut checked);
    errors.extend(checked.into_iter().filter(|e| {
        !left_out.iter().any(|p| {
            p.field.as_deref().and_then(field_name) == e.field
                && [Some(p.at), p.left_out_of].contains(&Some((e.line, e.column)))
        })
    }));
    errors.sort_by_key(|e| (e.line, e.column));
    if errors.is_empty() {
        Ok(Parsed {
            domain: DomainSpec::new(yaml.domain.value, descriptors),
            positions,
            gateway,
            websocket,
            rlqs,
            concurrency,
        })
    } else {
        Err(errors)
    }
}

/// The name errors give a field: its path of keys (`gateway.descriptors.key`), except that a
/// rule's fields are named relative to the rule (`rate_limit.unit`, however deep the rule is
/// nested; `None` for the rule itself).
fn field_name(path: &str) -> Option<String> {
    let relative = match path.rsplit_once("descriptors[]") {
        Some((_, rest)) if path.starts_with("descriptors[]") => rest.trim_start_matches('.'),
        _ => path,
    };
    let name = relative.replace("[]", "");
    (!name.is_empty()).then_some(name)
}

/// A problem found while reading `file`.
fn problem(file: &Path, p: &Problem) -> ConfigError {
    let field = p.field.as_deref().and_then(field_name);
    ConfigError::at(file, p.at, field.as_deref(), p.message.clone())
}

fn syntax_error(file: &Path, e: &serde_saphyr::Error) -> ConfigError {
    let message = e.without_snippet().to_string();
    match e.location() {
        Some(location) if location.line() > 0 => {
            let (line, column) = (location.line(), location.column());
            let suffix = format!(" at line {line}, column {column}");
            let message = message.strip_suffix(&suffix).unwrap_or(&message);
            ConfigError::at(file, (line, column), None, message)
        }
        _ => ConfigError::file(file, message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowgate::envoy::Rate;
    use flowgate::{Algorithm, FailMode};
    use std::time::Duration;

    fn errors(text: &str) -> Vec<String> {
        parse(Path::new("f.yaml"), text, &mut Vec::new())
            .unwrap_err()
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn rate_limits_gives_a_rule_several_limits_each_with_its_options() {
        let domain = parse(
            Path::new("f.yaml"),
            "domain: api\ndescriptors:\n  - key: api_key\n    rate_limits:\n      - {unit: second, requests_per_unit: 10, name: burst}\n      - {unit: day, requests_per_unit: 10000, name: daily, fail: open, replaces: [{name: old}]}\n",
            &mut Vec::new(),
        )
        .unwrap()
        .domain;
        let limits = &domain.descriptors[0].limits;
        assert_eq!(limits.len(), 2);
        assert_eq!(limits[0].rate.limit(), Some(10));
        assert_eq!(limits[1].name.as_deref(), Some("daily"));
        assert_eq!(limits[1].replaces, ["old"]);
        assert_eq!(limits[1].fail, Some(flowgate::FailMode::Open));
        let errors = errors(
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n    rate_limits: [{unit: day, requests_per_unit: 5}]\n  - key: b\n    rate_limits: []\n  - key: c\n    rate_limits:\n      - {unit: second, requests_per_unit: 1}\n      - {unlimited: true}\n      - {unit: hour, requests_per_unit: 0}\n      - {unit: fortnight, requests_per_unit: 3}\n",
        );
        assert_eq!(
            errors,
            [
                "f.yaml:5:18: `rate_limits`: give either `rate_limit` or `rate_limits`, not both",
                "f.yaml:7:18: `rate_limits`: needs at least one limit",
                "f.yaml:11:9: `rate_limits[1]`: every limit of `rate_limits` must count: not `unlimited`, not 0 requests (use `rate_limit` for those)",
                "f.yaml:12:9: `rate_limits[2]`: every limit of `rate_limits` must count: not `unlimited`, not 0 requests (use `rate_limit` for those)",
                "f.yaml:13:16: `rate_limits[3].unit`: unknown unit `fortnight`; expected one of second, minute, hour, day, week, month, year",
            ],
        );
    }

    #[test]
    fn charge_marks_a_counted_limit_and_nothing_else() {
        let domain = parse(
            Path::new("f.yaml"),
            "domain: llm\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1000, charge: true}\n  - key: t\n    rate_limit: {unit: minute, requests_per_unit: 5}\n",
            &mut Vec::new(),
        )
        .unwrap()
        .domain;
        assert!(domain.descriptors[0].limits[0].charge);
        assert!(!domain.descriptors[1].limits[0].charge);
        let errors = errors(
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, charge: true}\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 0, charge: true}\n",
        );
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(
            errors
                .iter()
                .all(|e| e.contains("`rate_limit.charge`: has no effect")),
            "{errors:?}"
        );
    }

    #[test]
    fn reads_the_fields_envoyproxy_ratelimit_added() {
        let text = "domain: d
descriptors:
  - key: route
    value: 'api/*/v*'
    share_threshold: true
    value_to_metric: true
    quota_mode: true
    metadata:
      owner: {team: edge, on_call: [ann, 7]}
      weight: 1.5
      1: one
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: plain
    metadata:
";
        let domain = parse(Path::new("f.yaml"), text, &mut Vec::new())
            .unwrap()
            .domain;
        let route = &domain.descriptors[0];
        assert!(route.share_threshold && route.value_to_metric && route.quota_mode);
        let meta = route.metadata.as_ref().unwrap();
        use flowgate::envoy::MetaValue;
        assert_eq!(meta["weight"], MetaValue::Number(1.5));
        assert_eq!(meta["1"], MetaValue::String("one".into()));
        let MetaValue::Struct(owner) = &meta["owner"] else {
            panic!("{meta:?}")
        };
        assert_eq!(
            owner["on_call"],
            MetaValue::List(vec![
                MetaValue::String("ann".into()),
                MetaValue::Number(7.0)
            ])
        );
        // An empty `metadata:` is no metadata.
        assert_eq!(domain.descriptors[1].metadata, None);
    }

    #[test]
    fn share_threshold_without_a_wildcard_and_bad_metadata_are_placed() {
        let text = "domain: d
descriptors:
  - key: a
    value: exact
    share_threshold: true
  - key: b
    share_threshold: true
    metadata: [not, a, mapping]
  - key: c
    value: 'x*'
    share_threshold: true
";
        assert_eq!(
            errors(text),
            [
                "f.yaml:5:22: `share_threshold`: only for a wildcard value (one with `*`)",
                "f.yaml:7:22: `share_threshold`: only for a wildcard value (one with `*`)",
                "f.yaml:8:15: `metadata`: expected a mapping",
            ]
        );
    }

    #[test]
    fn parses_the_envoy_format_and_the_extensions() {
        let domain = parse(
            Path::new("f.yaml"),
            "domain: edge\ndescriptors:\n  - key: ip\n    rate_limit: {unit: MINUTE, requests_per_unit: 10}\n  - key: user\n    value: 'vip*'\n    shadow_mode: true\n    rate_limit:\n      period: 90s\n      requests_per_unit: 3\n      algorithm: gcra\n      burst: 6\n      fail: local\n      name: vip\n      replaces: [{name: other}]\n",
            &mut Vec::new(),
        )
        .unwrap()
        .domain;
        assert_eq!(domain.domain, "edge");
        let vip = &domain.descriptors[1];
        assert!(vip.shadow_mode);
        let limit = &vip.limits[0];
        let Rate::Limited(q) = limit.rate else {
            panic!()
        };
        assert_eq!(
            (q.limit(), q.burst(), q.period()),
            (3, 6, Duration::from_secs(90))
        );
        assert_eq!(limit.fail, Some(FailMode::Local));
        assert_eq!(limit.replaces, vec!["other".to_owned()]);
        let Rate::Limited(q) = domain.descriptors[0].limits[0].rate else {
            panic!()
        };
        assert_eq!(q.algorithm(), Algorithm::default());
    }

    /// Every problem of a file at once — unknown fields do not stop the reading, a wrong type
    /// names its field — across the rules and both sections, in the file's order.
    #[test]
    fn calendar_quotas_and_their_errors() {
        let domain = parse(
            Path::new("f.yaml"),
            "domain: api\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: month, requests_per_unit: 10000, calendar: true, time_zone: Europe/Berlin}\n  - key: ip\n    rate_limit: {unit: DAY, requests_per_unit: 5, calendar: true}\n",
            &mut Vec::new(),
        )
        .unwrap()
        .domain;
        let quota = |i: usize| match domain.descriptors[i].limits[0].rate {
            Rate::Limited(q) => q,
            ref other => panic!("{other:?}"),
        };
        assert_eq!(quota(0).algorithm(), Algorithm::FixedWindow);
        assert_eq!(
            quota(0).calendar().unwrap().to_string(),
            "month@Europe/Berlin"
        );
        assert_eq!(quota(1).calendar().unwrap().to_string(), "day@UTC");
        let text = "\
domain: d
descriptors:
  - key: a
    rate_limit: {unit: month, requests_per_unit: 5, calendar: true, time_zone: Europe/Berlim}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 5, calendar: true}
  - key: c
    rate_limit: {period: 90s, requests_per_unit: 5, calendar: true}
  - key: d
    rate_limit: {unit: day, requests_per_unit: 5, time_zone: UTC}
  - key: e
    rate_limit: {unit: day, requests_per_unit: 5, calendar: true, algorithm: gcra}
";
        assert_eq!(
            errors(text),
            [
                "f.yaml:4:80: `rate_limit.time_zone`: unknown time zone `Europe/Berlim`; expected an IANA name such as `UTC` or `Europe/Berlin`",
                "f.yaml:6:64: `rate_limit.calendar`: `minute` has no calendar period; calendar quotas are per day, week, month or year",
                "f.yaml:8:63: `rate_limit.calendar`: needs `unit: day|week|month|year`, not a `period`",
                "f.yaml:10:62: `rate_limit.time_zone`: applies to calendar quotas only; add `calendar: true`",
                "f.yaml:12:78: `rate_limit.algorithm`: a calendar quota is a fixed window; gcra cannot enforce calendar periods",
            ]
        );
    }

    #[test]
    fn every_problem_of_a_file_is_listed_at_once() {
        let text = "\
domain: d
descriptors:
  - key: k
    valeu: v
    rate_limit: {unit: second, requests_per_unit: -5}
  - key: j
    rate_limit: {unit: fortnight, requests_per_unit: 1}
gateway:
  listen: 127.0.0.1
  upstream_timeout: 0s
  descriptors: [[{key: remote_address}]]
  trusted_proxies: [10.0.0.0/33]
websocket:
  upstream: ws://127.0.0.1:9000
  limits:
    messages: {limit: 10, per: 1s}
    concurrent_per_ip: 0
    close_code: 1005
    costs: {subscribe: 50}
    slowmode: soon
    dry_run: [connect, ws_connect]
    typo: 1
  outbound:
    concurrent_per_ip: 5
  buffer: {messages: 0}
  slow_reader: stall
";
        let found = errors(text);
        let expected = [
            "f.yaml:4:5: unknown field `valeu`; expected one of `key`, `value`, `rate_limit`, `rate_limits`, `descriptors`, `shadow_mode`, `detailed_metric`, `quota_mode`, `value_to_metric`, `share_threshold`, `metadata`",
            "f.yaml:5:51: `rate_limit.requests_per_unit`: invalid value: integer `-5`, expected u64",
            "f.yaml:7:24: `rate_limit.unit`: unknown unit `fortnight`; expected one of second, minute, hour, day, week, month, year",
            "f.yaml:9:11: `gateway.listen`: `127.0.0.1` is not an address; write HOST:PORT, e.g. `127.0.0.1:8080` or `localhost:8080`",
            "f.yaml:10:21: `gateway.upstream_timeout`: must be longer than zero",
            "f.yaml:12:21: `gateway.trusted_proxies`: `10.0.0.0/33` is not a network or address; write e.g. `10.0.0.0/8` or `192.0.2.1`",
            "f.yaml:17:24: `websocket.limits.concurrent_per_ip`: concurrent_per_ip must be at least 1",
            "f.yaml:18:17: `websocket.limits.close_code`: close code 1005 cannot be sent: use 1008, 1000-1003, 1007-1014 or 3000-4999 (e.g. 4008)",
            "f.yaml:19:12: `websocket.limits.costs`: a message cost of 50 can never be granted: the connection layer's burst is 10",
            "f.yaml:20:15: `websocket.limits.slowmode`: `soon` is not a duration (expected number at 0); write e.g. `30s`, `500ms`, `1h30m`",
            "f.yaml:21:24: `websocket.limits.dry_run`: unknown layer `ws_connect`; expected one of connect, concurrent_ip, concurrent_user, node, penalty, connection, bytes, user, room, slowmode, errors, size",
            "f.yaml:22:5: `websocket.limits`: unknown field `typo`; expected one of `connections_per_ip`, `concurrent_per_ip`, `concurrent_per_user`, `max_connections`, `messages`, `messages_for_role`, `bytes`, `user_messages`, `user_messages_for_role`, `room_messages`, `slowmode`, `slowmode_for_room`, `slowmode_exempt`, `errors`, `max_message_size`, `costs`, `default_cost`, `release`, `close_after`, `close_at_multiple`, `close_code`, `close_reason`, `error_frame`, `penalty_box`, `dry_run`, `key_prefix`",
            "f.yaml:24:24: `websocket.outbound.concurrent_per_ip`: limits the upgrade, which `outbound` does not see; set it under `limits`",
            "f.yaml:25:22: `websocket.buffer.messages`: invalid value: integer `0`, expected a nonzero usize",
            "f.yaml:26:16: `websocket.slow_reader`: unknown policy `stall`; expected one of pause, drop, close",
        ];
        assert_eq!(found, expected, "{found:#?}");
    }

    #[test]
    fn fields_are_named_from_the_top_and_a_rules_from_the_rule() {
        assert_eq!(
            field_name("descriptors[].descriptors[].rate_limit.unit").as_deref(),
            Some("rate_limit.unit")
        );
        assert_eq!(
            field_name("descriptors[].descriptors").as_deref(),
            Some("descriptors")
        );
        assert_eq!(field_name("descriptors").as_deref(), Some("descriptors"));
        assert_eq!(field_name("descriptors[]"), None);
        assert_eq!(
            field_name("gateway.descriptors[][].key").as_deref(),
            Some("gateway.descriptors.key")
        );
        assert_eq!(
            errors("")[0],
            "f.yaml: is empty: a configuration file needs at least `domain: NAME`"
        );
        assert_eq!(
            errors("domain: d\ndescriptors: {key: k}\nwebsocket: [ws://x:1]\n"),
            [
                "f.yaml:2:14: `descriptors`: invalid type: map, expected a sequence",
                "f.yaml:3:12: `websocket`: invalid type: sequence, expected a mapping",
            ]
        );
    }

    #[test]
    fn errors_name_line_column_and_field() {
        assert_eq!(
            errors(
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unlimited: true\n      unit: second\n"
            ),
            ["f.yaml:6:13: `rate_limit.unit`: must not be set when `unlimited` is true"]
        );
        let unknown = errors("domain: d\ndescriptors:\n  - key: k\n    valeu: v\n");
        assert!(
            unknown[0].starts_with("f.yaml:4:5: unknown field `valeu`"),
            "{unknown:?}"
        );
        assert_eq!(
            errors("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {period: 5 parsecs, requests_per_unit: 1}\n").len(),
            1
        );
        assert_eq!(
            errors(
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5, algorithm: fixed_window, burst: 9}\n"
            ),
            [
                "f.yaml:4:86: `rate_limit.burst`: applies to gcra and leaky_bucket only; fixed_window allows `requests_per_unit` per window"
            ]
        );
        assert_eq!(
            errors(
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 5}\n"
            )[0],
            "f.yaml:4:24: `rate_limit.unit`: unknown unit `fortnight`; expected one of second, minute, hour, day, week, month, year"
        );
        assert_eq!(
            errors("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second}\n")[0],
            "f.yaml:4:17: `rate_limit.requests_per_unit`: is required (0 blocks every request)"
        );
        let dup_key = errors("domain: d\ndomain: e\n");
        assert_eq!(
            errors(
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: many}\n"
            ),
            [
                "f.yaml:4:51: `rate_limit.requests_per_unit`: invalid type: string \"many\", expected u64"
            ],
            "the type error is named once: not again as a missing count"
        );
        assert!(
            dup_key[0].starts_with("f.yaml:2:1: duplicate mapping key"),
            "{dup_key:?}"
        );
    }
}
