//! Rules from an xDS management server: one version of envoyproxy/ratelimit's
//! `RateLimitConfig` resources ([`proto`]), each turned into the YAML a file would hold and
//! read by the same parser and validation as the files — one implementation of what a valid
//! configuration is. Errors name the resource and the field (`descriptors[1].rate_limit.unit`),
//! not a line of the generated text.

pub mod proto;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use envoy_types::pb::google::protobuf::{Any, Struct, Value, value::Kind};
use prost::Message as _;

use super::{ConfigError, ConfigErrors, Source};
use proto::{RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit, TYPE_URL};

/// One version of the rules an xDS management server sent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct XdsRules {
    /// The `version_info` of the `DiscoveryResponse`.
    pub version: String,
    /// Its resources, in the order sent.
    pub resources: Vec<XdsResource>,
}

/// One `RateLimitConfig`, as the YAML the file parser reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XdsResource {
    /// The resource's `name`.
    pub name: String,
    /// Its domain.
    pub domain: String,
    /// The generated YAML, named after the resource ([`XdsResource::source_name`]).
    pub source: Source,
    /// For each line of the YAML, the descriptor it belongs to (`descriptors[0].descriptors[2]`;
    /// empty at the top level): how an error's position becomes a field path.
    lines: Vec<String>,
}

impl XdsResource {
    /// The name a resource's errors are reported under: "xDS resource `NAME`".
    pub fn source_name(name: &str) -> PathBuf {
        PathBuf::from(format!("xDS resource `{name}`"))
    }

    /// `e` (about this resource's generated YAML) with the field named by its path from the
    /// resource and no line or column.
    fn explain(&self, e: &ConfigError) -> ConfigError {
        let rule = usize::try_from(e.line)
            .ok()
            .and_then(|line| line.checked_sub(1))
            .and_then(|i| self.lines.get(i))
            .map_or("", String::as_str);
        let field = match (&e.field, rule.is_empty()) {
            (Some(field), true) => Some(field.clone()),
            (Some(field), false) => Some(format!("{rule}.{field}")),
            (None, false) => Some(rule.to_owned()),
            (None, true) => None,
        };
        ConfigError {
            file: e.file.clone(),
            line: 0,
            column: 0,
            field,
            message: e.message.clone(),
        }
    }
}

impl XdsRules {
    /// Decodes the resources of a `DiscoveryResponse` (version `version`): every problem at
    /// once, each naming the resource (by name, or by position when it cannot be decoded).
    pub fn decode(version: &str, resources: &[Any]) -> Result<XdsRules, ConfigErrors> {
        let mut errors = Vec::new();
        let mut decoded: Vec<XdsResource> = Vec::with_capacity(resources.len());
        for (index, any) in resources.iter().enumerate() {
            let at = XdsResource::source_name(&format!("#{index}"));
            if any.type_url != TYPE_URL {
                errors.push(ConfigError::file(
                    &at,
                    format!("type `{}` is not {TYPE_URL}", any.type_url),
                ));
                continue;
            }
            let config = match RateLimitConfig::decode(any.value.as_slice()) {
                Ok(config) => config,
                Err(e) => {
                    errors.push(ConfigError::file(
                        &at,
                        format!("not a RateLimitConfig: {e}"),
                    ));
                    continue;
                }
            };
            if config.name.is_empty() {
                errors.push(ConfigError::at(
                    &at,
                    (0, 0),
                    Some("name"),
                    "must not be empty",
                ));
                continue;
            }
            if decoded.iter().any(|r| r.name == config.name) {
                errors.push(ConfigError::at(
                    &XdsResource::source_name(&config.name),
                    (0, 0),
                    Some("name"),
                    "another resource of this version has the same name",
                ));
                continue;
            }
            decoded.push(render(&config));
        }
        if errors.is_empty() {
            Ok(XdsRules {
                version: version.to_owned(),
                resources: decoded,
            })
        } else {
            Err(ConfigErrors(errors))
        }
    }

    /// The resources as configuration sources.
    pub fn sources(&self) -> impl Iterator<Item = &Source> {
        self.resources.iter().map(|r| &r.source)
    }

    /// Whether `path` names one of these resources.
    pub fn has_source(&self, path: &Path) -> bool {
        self.resources.iter().any(|r| r.source.path == path)
    }

    /// `errors` with those about a resource's generated YAML told by field path instead of
    /// line and column.
    pub fn explain(&self, errors: ConfigErrors) -> ConfigErrors {
        ConfigErrors(
            errors
                .0
                .into_iter()
                .map(
                    |e| match self.resources.iter().find(|r| r.source.path == e.file) {
                        Some(resource) => resource.explain(&e),
                        None => e,
                    },
                )
                .collect(),
        )
    }
}

/// `config` as the YAML of a file, one field a line, and which descriptor each line is in.
fn render(config: &RateLimitConfig) -> XdsResource {
    let mut out = Yaml::default();
    out.line("", format!("domain: {}", quoted(&config.domain)));
    if !config.descriptors.is_empty() {
        out.line("", "descriptors:".to_owned());
        descriptors(&mut out, &config.descriptors, "", 1);
    }
    XdsResource {
        name: config.name.clone(),
        domain: config.domain.clone(),
        source: Source {
            path: XdsResource::source_name(&config.name),
            text: out.text,
        },
        lines: out.lines,
    }
}

/// YAML text being written, and the descriptor path of each line.
#[derive(Default)]
struct Yaml {
    text: String,
    lines: Vec<String>,
}

impl Yaml {
    fn line(&mut self, rule: &str, line: String) {
        self.text.push_str(&line);
        self.text.push('\n');
        self.lines.push(rule.to_owned());
    }
}

fn descriptors(out: &mut Yaml, list: &[RateLimitDescriptor], parent: &str, depth: usize) {
    let indent = "  ".repeat(depth);
    for (i, d) in list.iter().enumerate() {
        let rule = if parent.is_empty() {
            format!("descriptors[{i}]")
        } else {
            format!("{parent}.descriptors[{i}]")
        };
        out.line(&rule, format!("{indent}- key: {}", quoted(&d.key)));
        let field = |name: &str, value: String| format!("{indent}  {name}: {value}");
        if !d.value.is_empty() {
            out.line(&rule, field("value", quoted(&d.value)));
        }
        for (name, on) in [
            ("shadow_mode", d.shadow_mode),
            ("detailed_metric", d.detailed_metric),
            ("quota_mode", d.quota_mode),
        ] {
            if on {
                out.line(&rule, field(name, "true".to_owned()));
            }
        }
        if let Some(metadata) = &d.metadata {
            out.line(&rule, field("metadata", struct_json(metadata).to_string()));
        }
        if let Some(limit) = &d.rate_limit {
            out.line(&rule, format!("{indent}  rate_limit:"));
            rate_limit(out, limit, &rule, &format!("{indent}    "));
        }
        if !d.descriptors.is_empty() {
            out.line(&rule, format!("{indent}  descriptors:"));
            descriptors(out, &d.descriptors, &rule, depth + 2);
        }
    }
}

fn rate_limit(out: &mut Yaml, limit: &RateLimitPolicy, rule: &str, indent: &str) {
    // An empty block is `{}`: the checks then say what is missing.
    let before = out.lines.len();
    match RateLimitUnit::try_from(limit.unit) {
        Ok(RateLimitUnit::Unknown) => {}
        Ok(unit) => out.line(rule, format!("{indent}unit: {}", unit_name(unit))),
        Err(_) => out.line(rule, format!("{indent}unit: \"{}\"", limit.unit)),
    }
    // proto3 cannot tell 0 from absent: with `unlimited`, 0 is absent.
    if !(limit.unlimited && limit.requests_per_unit == 0) {
        out.line(
            rule,
            format!("{indent}requests_per_unit: {}", limit.requests_per_unit),
        );
    }
    if limit.unlimited {
        out.line(rule, format!("{indent}unlimited: true"));
    }
    if !limit.name.is_empty() {
        out.line(rule, format!("{indent}name: {}", quoted(&limit.name)));
    }
    if !limit.replaces.is_empty() {
        let mut list = String::new();
        for (i, r) in limit.replaces.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            let _ = write!(list, "{sep}{{name: {}}}", quoted(&r.name));
        }
        out.line(rule, format!("{indent}replaces: [{list}]"));
    }
    if out.lines.len() == before {
        out.line(rule, format!("{indent}{{}}"));
    }
}

fn unit_name(unit: RateLimitUnit) -> &'static str {
    match unit {
        RateLimitUnit::Unknown => "unknown",
        RateLimitUnit::Second => "second",
        RateLimitUnit::Minute => "minute",
        RateLimitUnit::Hour => "hour",
        RateLimitUnit::Day => "day",
        RateLimitUnit::Week => "week",
        RateLimitUnit::Month => "month",
        RateLimitUnit::Year => "year",
    }
}

/// `text` as a double-quoted YAML scalar (JSON's escapes are YAML's).
fn quoted(text: &str) -> String {
    serde_json::Value::from(text).to_string()
}

/// A protobuf `Struct` as JSON (a YAML flow mapping).
fn struct_json(s: &Struct) -> serde_json::Value {
    let mut fields: Vec<_> = s.fields.iter().collect();
    fields.sort_by(|a, b| a.0.cmp(b.0));
    serde_json::Value::Object(
        fields
            .into_iter()
            .map(|(k, v)| (k.clone(), value_json(v)))
            .collect(),
    )
}

fn value_json(v: &Value) -> serde_json::Value {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => serde_json::Value::Null,
        Some(Kind::NumberValue(n)) => {
            serde_json::Number::from_f64(*n).map_or(serde_json::Value::Null, Into::into)
        }
        Some(Kind::StringValue(s)) => serde_json::Value::from(s.as_str()),
        Some(Kind::BoolValue(b)) => serde_json::Value::Bool(*b),
        Some(Kind::StructValue(s)) => struct_json(s),
        Some(Kind::ListValue(l)) => {
            serde_json::Value::Array(l.values.iter().map(value_json).collect())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Policy;
    use flowgate::envoy::Rate;

    fn any(config: &RateLimitConfig) -> Any {
        Any {
            type_url: TYPE_URL.to_owned(),
            value: config.encode_to_vec(),
        }
    }

    fn descriptor(key: &str, value: &str, limit: Option<RateLimitPolicy>) -> RateLimitDescriptor {
        RateLimitDescriptor {
            key: key.to_owned(),
            value: value.to_owned(),
            rate_limit: limit,
            ..Default::default()
        }
    }

    fn per(unit: RateLimitUnit, n: u32) -> Option<RateLimitPolicy> {
        Some(RateLimitPolicy {
            unit: unit as i32,
            requests_per_unit: n,
            ..Default::default()
        })
    }

    fn policy(rules: &XdsRules) -> Result<Policy, ConfigErrors> {
        Policy::from_sources(rules.sources().cloned().collect()).map_err(|e| rules.explain(e))
    }

    #[test]
    fn a_resource_becomes_the_rules_a_file_would_give() {
        let mut nested = descriptor("path", "/login", per(RateLimitUnit::Week, 5));
        nested.shadow_mode = true;
        let mut top = descriptor("user", "", None);
        top.descriptors = vec![nested];
        top.metadata = Some(Struct {
            fields: [(
                "team".to_owned(),
                Value {
                    kind: Some(Kind::StringValue("edge \"a\"".to_owned())),
                },
            )]
            .into(),
        });
        let unlimited = descriptor(
            "vip",
            "gold",
            Some(RateLimitPolicy {
                unlimited: true,
                name: "vip".to_owned(),
                replaces: vec![proto::RateLimitReplace {
                    name: "other".to_owned(),
                }],
                ..Default::default()
            }),
        );
        let config = RateLimitConfig {
            name: "edge-config".to_owned(),
            domain: "edge".to_owned(),
            descriptors: vec![top, unlimited],
        };
        let rules = XdsRules::decode("v1", &[any(&config)]).unwrap();
        let policy = policy(&rules).unwrap_or_else(|e| panic!("{e}"));
        let domain_rules = policy.rules.rules();
        assert_eq!(domain_rules.len(), 2, "{}", rules.resources[0].source.text);
        let login = domain_rules.iter().find(|r| r.shadow_mode).unwrap();
        assert_eq!(login.rate.limit(), Some(5));
        let vip = domain_rules.iter().find(|r| r.name.is_some()).unwrap();
        assert_eq!(vip.rate, Rate::Unlimited);
        assert_eq!(vip.replaces, ["other".to_owned()]);
    }

    #[test]
    fn errors_name_the_resource_and_the_field() {
        let mut bad = descriptor("b", "", per(RateLimitUnit::Unknown, 5));
        bad.descriptors = vec![descriptor(
            "c",
            "",
            Some(RateLimitPolicy {
                unit: 42,
                requests_per_unit: 1,
                ..Default::default()
            }),
        )];
        let config = RateLimitConfig {
            name: "r1".to_owned(),
            domain: "d".to_owned(),
            descriptors: vec![descriptor("a", "", per(RateLimitUnit::Second, 1)), bad],
        };
        let rules = XdsRules::decode("v1", &[any(&config)]).unwrap();
        let errors: Vec<String> = policy(&rules)
            .unwrap_err()
            .0
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            errors,
            [
                "xDS resource `r1`: `descriptors[1].rate_limit.unit`: a limit needs `unit` (second … year) or `period` (e.g. `90s`), or `unlimited: true`",
                "xDS resource `r1`: `descriptors[1].descriptors[0].rate_limit.unit`: unknown unit `42`; expected one of second, minute, hour, day, week, month, year",
            ]
        );
    }

    #[test]
    fn undecodable_unnamed_and_repeated_resources_are_refused() {
        let named = |name: &str| RateLimitConfig {
            name: name.to_owned(),
            domain: "d".to_owned(),
            descriptors: Vec::new(),
        };
        let wrong_type = Any {
            type_url: "type.googleapis.com/envoy.config.cluster.v3.Cluster".to_owned(),
            value: Vec::new(),
        };
        let garbage = Any {
            type_url: TYPE_URL.to_owned(),
            value: vec![0xff, 0xff],
        };
        let errors = XdsRules::decode(
            "v",
            &[
                wrong_type,
                garbage,
                any(&named("")),
                any(&named("a")),
                any(&named("a")),
            ],
        )
        .unwrap_err()
        .to_string();
        let lines: Vec<&str> = errors.lines().collect();
        assert_eq!(lines.len(), 4, "{errors}");
        assert!(lines[0].starts_with("xDS resource `#0`: type `type.googleapis.com/envoy.config.cluster.v3.Cluster` is not"), "{errors}");
        assert!(
            lines[1].starts_with("xDS resource `#1`: not a RateLimitConfig"),
            "{errors}"
        );
        assert_eq!(lines[2], "xDS resource `#2`: `name`: must not be empty");
        assert_eq!(
            lines[3],
            "xDS resource `a`: `name`: another resource of this version has the same name"
        );
    }
}
