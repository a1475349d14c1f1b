//! The YAML file format: envoyproxy/ratelimit's, plus Flowgate's extensions inside
//! `rate_limit` (`algorithm`, `burst`, `period`, `fail`) and the top-level `gateway` section.
//! Parsed with positions so every error names its line, column and field.
//!
//! * this module: a file's top level, positions, syntax errors;
//! * [`rules`]: `descriptors` and `rate_limit`;
//! * [`gateway`]: the `gateway` section.

mod gateway;
mod rlqs;
mod rules;
mod websocket;

use std::path::Path;

use flowgate::envoy::DomainSpec;
use serde::Deserialize;
use serde_saphyr::{Location, Spanned};

use super::Reference;
use super::error::ConfigError;
use super::gateway::GatewayConfig;
use super::rlqs::RlqsConfig;
use super::websocket::WebSocketConfig;
use gateway::{GatewayYaml, convert_gateway};
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

pub(super) fn pos(location: &Location) -> (u64, u64) {
    (location.line(), location.column())
}

/// One parsed file.
#[derive(Debug)]
pub(crate) struct Parsed {
    /// The domain's rules.
    pub(crate) domain: DomainSpec,
    /// Where its rules are, for later errors.
    pub(crate) positions: Positions,
    /// The `gateway` section, if any, with its position.
    pub(crate) gateway: Option<(GatewayConfig, (u64, u64))>,
    /// The `websocket` section, if any, with its position.
    pub(crate) websocket: Option<(WebSocketConfig, (u64, u64))>,
    /// The `rlqs` section, if any.
    pub(crate) rlqs: Option<RlqsConfig>,
}

/// Parses one file into its domain (and gateway section), collecting every semantic error.
/// Files it refers to are noted in `references`.
pub(crate) fn parse(
    file: &Path,
    text: &str,
    references: &mut Vec<Reference>,
) -> Result<Parsed, Vec<ConfigError>> {
    let yaml: FileYaml = serde_saphyr::from_str(text).map_err(|e| vec![syntax_error(file, &e)])?;
    let mut positions = Positions {
        domain: pos(&yaml.domain.referenced),
        rules: Vec::new(),
    };
    let mut errors = Vec::new();
    if yaml.domain.value.is_empty() {
        errors.push(ConfigError::at(
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
        &mut errors,
    );
    let gateway = yaml.gateway.and_then(|g| {
        let at = pos(&g.referenced);
        convert_gateway(
            file,
            &yaml.domain.value,
            g.value,
            at,
            &mut errors,
            references,
        )
        .map(|g| (g, at))
    });
    let websocket = yaml.websocket.and_then(|w| {
        let at = pos(&w.referenced);
        convert_websocket(file, w.value, at, &mut errors, references).map(|w| (w, at))
    });
    let rlqs = yaml
        .rlqs
        .and_then(|r| convert_rlqs(file, r.value, pos(&r.referenced), &mut errors));
    if errors.is_empty() {
        Ok(Parsed {
            domain: DomainSpec::new(yaml.domain.value, descriptors),
            positions,
            gateway,
            websocket,
            rlqs,
        })
    } else {
        Err(errors)
    }
}

fn syntax_error(file: &Path, e: &serde_saphyr::Error) -> ConfigError {
    let message = e.without_snippet().to_string();
    match e.location() {
        Some(location) if location.line() > 0 => {
            let (line, column) = pos(&location);
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
        let limit = vip.limit.as_ref().unwrap();
        let Rate::Limited(q) = limit.rate else {
            panic!()
        };
        assert_eq!(
            (q.limit(), q.burst(), q.period()),
            (3, 6, Duration::from_secs(90))
        );
        assert_eq!(limit.fail, Some(FailMode::Local));
        assert_eq!(limit.replaces, vec!["other".to_owned()]);
        let Rate::Limited(q) = domain.descriptors[0].limit.as_ref().unwrap().rate else {
            panic!()
        };
        assert_eq!(q.algorithm(), Algorithm::default());
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
        assert!(
            dup_key[0].starts_with("f.yaml:2:1: duplicate mapping key"),
            "{dup_key:?}"
        );
    }
}
