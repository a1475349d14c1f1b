//! The YAML file format: envoyproxy/ratelimit's, plus Flowgate's extensions inside
//! `rate_limit` (`algorithm`, `burst`, `period`, `fail`) and the top-level `gateway` section.
//! Parsed with positions so every error names its line, column and field.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use flowgate::http::key::{ClientIp, Header, Jwt, PeerIp};
use http::HeaderName;
use ipnet::IpNet;

use flowgate::policy::rules::{DomainSpec, LimitSpec, Rate, RuleSpec, Unit};
use flowgate::{Algorithm, FailMode, Quota, QuotaError};
use serde::Deserialize;
use serde_saphyr::{Location, Spanned};

use super::error::ConfigError;
use super::gateway::{DEFAULT_UPSTREAM_TIMEOUT, EntryConfig, GatewayConfig, Source};
use flowgate::policy::descriptor::DEFAULT_ALGORITHM;

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
}

/// The `gateway` section (see [`super::gateway`]).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GatewayYaml {
    /// Address to listen on.
    #[serde(default)]
    listen: Option<Spanned<String>>,
    /// Networks whose `X-Forwarded-For` is believed.
    #[serde(default)]
    trusted_proxies: Option<Vec<Spanned<String>>>,
    /// Prefix length IPv6 clients are keyed by.
    #[serde(default)]
    ipv6_prefix: Option<Spanned<u64>>,
    /// The request descriptors: lists of entries.
    #[serde(default)]
    descriptors: Option<Spanned<Vec<Vec<Spanned<EntryYaml>>>>>,
    /// How bearer tokens are verified for `jwt_claim` entries.
    #[serde(default)]
    jwt: Option<Spanned<JwtYaml>>,
    /// How long to wait for the upstream's response head.
    #[serde(default)]
    upstream_timeout: Option<Spanned<String>>,
}

/// One entry of a gateway descriptor.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EntryYaml {
    /// The source: remote_address, header, path, method, host, jwt_claim, generic_key.
    key: Spanned<String>,
    /// For `header`: which header.
    #[serde(default)]
    header: Option<Spanned<String>>,
    /// For `jwt_claim`: which claim.
    #[serde(default)]
    claim: Option<Spanned<String>>,
    /// For `generic_key`: the fixed value.
    #[serde(default)]
    value: Option<Spanned<String>>,
    /// The descriptor key to send the entry as (default: the source's name).
    #[serde(default, rename = "as")]
    as_key: Option<Spanned<String>>,
}

/// The `gateway.jwt` block: exactly one key.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JwtYaml {
    /// The environment variable holding the HS256 secret.
    #[serde(default)]
    hs256_secret_env: Option<Spanned<String>>,
    /// A PEM file with the RS256 public key (relative to the configuration file).
    #[serde(default)]
    rs256_public_key_file: Option<Spanned<String>>,
}

/// One descriptor rule.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DescriptorYaml {
    /// The entry key.
    key: Spanned<String>,
    /// The entry value; absent matches any value.
    #[serde(default)]
    value: Option<Spanned<String>>,
    /// The limit, if any.
    #[serde(default)]
    rate_limit: Option<Spanned<RateLimitYaml>>,
    /// Nested rules.
    #[serde(default)]
    descriptors: Option<Vec<DescriptorYaml>>,
    /// Count but never deny.
    #[serde(default)]
    shadow_mode: bool,
    /// Metrics per descriptor value.
    #[serde(default)]
    detailed_metric: bool,
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
}

/// One entry of `replaces`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplacesYaml {
    /// The replaced limit's name.
    name: Spanned<String>,
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

fn pos(location: &Location) -> (u64, u64) {
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
}

/// Parses one file into its domain (and gateway section), collecting every semantic error.
pub(crate) fn parse(file: &Path, text: &str) -> Result<Parsed, Vec<ConfigError>> {
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
        convert_gateway(file, &yaml.domain.value, g.value, at, &mut errors).map(|g| (g, at))
    });
    if errors.is_empty() {
        Ok(Parsed {
            domain: DomainSpec::new(yaml.domain.value, descriptors),
            positions,
            gateway,
        })
    } else {
        Err(errors)
    }
}

/// Validates the `gateway` section; pushes its errors and returns `None` when it has any.
fn convert_gateway(
    file: &Path,
    domain: &str,
    g: GatewayYaml,
    at_section: (u64, u64),
    errors: &mut Vec<ConfigError>,
) -> Option<GatewayConfig> {
    let before = errors.len();
    let mut error = |at: (u64, u64), field: &str, message: String| {
        errors.push(ConfigError::at(
            file,
            at,
            Some(&format!("gateway.{field}")),
            message,
        ));
    };

    let listen = g
        .listen
        .as_ref()
        .and_then(|l| match l.value.parse::<SocketAddr>() {
            Ok(addr) => Some(addr),
            Err(_) => {
                error(
                    pos(&l.referenced),
                    "listen",
                    format!(
                        "`{}` is not an address; write e.g. `127.0.0.1:8000`",
                        l.value
                    ),
                );
                None
            }
        });
    let mut trusted = Vec::new();
    for net in g.trusted_proxies.iter().flatten() {
        let text = net.value.trim();
        match (text.parse::<IpNet>(), text.parse::<IpAddr>()) {
            (Ok(net), _) => trusted.push(net),
            (_, Ok(ip)) => trusted.push(IpNet::from(ip)),
            _ => error(
                pos(&net.referenced),
                "trusted_proxies",
                format!(
                    "`{}` is not a network or address; write e.g. `10.0.0.0/8` or `192.0.2.1`",
                    net.value
                ),
            ),
        }
    }
    let mut peer = PeerIp::new();
    if let Some(prefix) = &g.ipv6_prefix {
        match u8::try_from(prefix.value) {
            Ok(bits) if bits <= 128 => peer = peer.ipv6_prefix(bits),
            _ => error(
                pos(&prefix.referenced),
                "ipv6_prefix",
                "must be between 0 and 128".into(),
            ),
        }
    }
    let upstream_timeout = match &g.upstream_timeout {
        None => Some(DEFAULT_UPSTREAM_TIMEOUT),
        Some(t) => match humantime::parse_duration(&t.value) {
            Ok(d) if d > Duration::ZERO => Some(d),
            Ok(_) => {
                error(
                    pos(&t.referenced),
                    "upstream_timeout",
                    "must be longer than zero".into(),
                );
                None
            }
            Err(e) => {
                error(
                    pos(&t.referenced),
                    "upstream_timeout",
                    format!(
                        "`{}` is not a duration ({e}); write e.g. `30s`, `500ms`",
                        t.value
                    ),
                );
                None
            }
        },
    };
    let jwt = g.jwt.as_ref().and_then(|j| {
        let at = pos(&j.referenced);
        match (&j.value.hs256_secret_env, &j.value.rs256_public_key_file) {
            (Some(env), None) => match std::env::var(&env.value) {
                Ok(secret) if !secret.is_empty() => Some(Jwt::hs256(secret.as_bytes())),
                _ => {
                    error(
                        pos(&env.referenced),
                        "jwt.hs256_secret_env",
                        format!("the environment variable `{}` is not set", env.value),
                    );
                    None
                }
            },
            (None, Some(key_file)) => {
                let path = file
                    .parent()
                    .unwrap_or_else(|| Path::new(""))
                    .join(&key_file.value);
                let built = std::fs::read(&path)
                    .map_err(|e| format!("cannot read {}: {e}", path.display()))
                    .and_then(|pem| {
                        Jwt::rs256_pem(&pem).map_err(|e| {
                            format!("{} is not an RSA public key in PEM: {e}", path.display())
                        })
                    });
                match built {
                    Ok(jwt) => Some(jwt),
                    Err(message) => {
                        error(
                            pos(&key_file.referenced),
                            "jwt.rs256_public_key_file",
                            message,
                        );
                        None
                    }
                }
            }
            _ => {
                error(
                    at,
                    "jwt",
                    "give exactly one of `hs256_secret_env` and `rs256_public_key_file`".into(),
                );
                None
            }
        }
    });

    let mut descriptors = Vec::new();
    match &g.descriptors {
        Some(list) if !list.value.is_empty() => {
            for entries in &list.value {
                if entries.is_empty() {
                    error(
                        pos(&list.referenced),
                        "descriptors",
                        "a descriptor needs at least one entry".into(),
                    );
                    continue;
                }
                let mut built = Vec::with_capacity(entries.len());
                for entry in entries {
                    let at = pos(&entry.referenced);
                    let e = &entry.value;
                    let source = convert_source(e, jwt.as_ref(), g.jwt.is_some(), at, &mut error);
                    let key = match &e.as_key {
                        Some(k) if k.value.is_empty() => {
                            error(
                                pos(&k.referenced),
                                "descriptors.as",
                                "must not be empty".into(),
                            );
                            None
                        }
                        Some(k) => Some(k.value.clone()),
                        None => source.as_ref().map(|(_, name)| name.clone()),
                    };
                    if let (Some((source, _)), Some(key)) = (source, key) {
                        built.push(EntryConfig { key, source });
                    }
                }
                descriptors.push(built);
            }
        }
        Some(list) => error(
            pos(&list.referenced),
            "descriptors",
            "must list at least one descriptor".into(),
        ),
        None => error(
            at_section,
            "descriptors",
            "is required: the request descriptors to check, e.g. `[[{key: remote_address}]]`"
                .into(),
        ),
    }

    if errors.len() > before {
        return None;
    }
    Some(GatewayConfig {
        domain: domain.to_owned(),
        listen,
        client_ip: ClientIp::new(trusted).peer_ip(peer),
        descriptors,
        upstream_timeout: upstream_timeout?,
    })
}

/// One entry's source and its default descriptor key; reports what is wrong with it.
fn convert_source(
    e: &EntryYaml,
    jwt: Option<&Jwt>,
    jwt_configured: bool,
    at: (u64, u64),
    error: &mut impl FnMut((u64, u64), &str, String),
) -> Option<(Source, String)> {
    let source = e.key.value.as_str();
    // Which of the optional fields this source takes.
    let (wants_header, wants_claim, wants_value) = match source {
        "header" => (true, false, false),
        "jwt_claim" => (false, true, false),
        "generic_key" => (false, false, true),
        "remote_address" | "path" | "method" | "host" => (false, false, false),
        other => {
            error(
                pos(&e.key.referenced),
                "descriptors.key",
                format!(
                    "unknown source `{other}`; expected one of {}",
                    Source::NAMES
                ),
            );
            return None;
        }
    };
    let mut ok = true;
    for (field, given, wanted) in [
        ("header", &e.header, wants_header),
        ("claim", &e.claim, wants_claim),
        ("value", &e.value, wants_value),
    ] {
        match given {
            Some(v) if !wanted => {
                error(
                    pos(&v.referenced),
                    &format!("descriptors.{field}"),
                    format!("does not apply to `key: {source}`"),
                );
                ok = false;
            }
            None if wanted => {
                error(
                    at,
                    &format!("descriptors.{field}"),
                    format!("is required with `key: {source}`"),
                );
                ok = false;
            }
            _ => {}
        }
    }
    if !ok {
        return None;
    }
    match source {
        "remote_address" => Some((Source::RemoteAddress, "remote_address".into())),
        "path" => Some((Source::Path, "path".into())),
        "method" => Some((Source::Method, "method".into())),
        "host" => Some((Source::Host, "host".into())),
        "header" => {
            let h = e.header.as_ref()?;
            match HeaderName::from_bytes(h.value.trim().as_bytes()) {
                Ok(name) => {
                    let key = name.as_str().to_owned();
                    Some((Source::Header(Header::new(name)), key))
                }
                Err(_) => {
                    error(
                        pos(&h.referenced),
                        "descriptors.header",
                        format!("`{}` is not a header name", h.value),
                    );
                    None
                }
            }
        }
        "jwt_claim" => {
            let c = e.claim.as_ref()?;
            if c.value.is_empty() {
                error(
                    pos(&c.referenced),
                    "descriptors.claim",
                    "must not be empty".into(),
                );
                return None;
            }
            match jwt {
                Some(jwt) => Some((
                    Source::JwtClaim(jwt.claim(c.value.clone())),
                    c.value.clone(),
                )),
                None => {
                    // A broken `jwt` block is reported on its own.
                    if !jwt_configured {
                        error(
                            pos(&e.key.referenced),
                            "descriptors.key",
                            "`jwt_claim` needs a `gateway.jwt` block saying how tokens are verified"
                                .into(),
                        );
                    }
                    None
                }
            }
        }
        "generic_key" => {
            let v = e.value.as_ref()?;
            Some((Source::Generic(v.value.clone()), "generic_key".into()))
        }
        _ => None,
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

fn convert_all(
    file: &Path,
    descriptors: Vec<DescriptorYaml>,
    path: &mut Vec<usize>,
    positions: &mut Positions,
    errors: &mut Vec<ConfigError>,
) -> Vec<RuleSpec> {
    let mut rules = Vec::with_capacity(descriptors.len());
    for (index, descriptor) in descriptors.into_iter().enumerate() {
        path.push(index);
        positions
            .rules
            .push((path.clone(), pos(&descriptor.key.referenced)));
        if descriptor.key.value.is_empty() {
            errors.push(ConfigError::at(
                file,
                pos(&descriptor.key.referenced),
                Some("key"),
                "must not be empty",
            ));
        }
        let limit = descriptor
            .rate_limit
            .and_then(|r| convert_limit(file, r, errors));
        let children = convert_all(
            file,
            descriptor.descriptors.unwrap_or_default(),
            path,
            positions,
            errors,
        );
        rules.push(RuleSpec {
            key: descriptor.key.value,
            value: descriptor.value.map(|v| v.value),
            limit,
            shadow_mode: descriptor.shadow_mode,
            detailed_metric: descriptor.detailed_metric,
            descriptors: children,
        });
        path.pop();
    }
    rules
}

/// Validates a `rate_limit` block; pushes its errors and returns `None` when it has any.
fn convert_limit(
    file: &Path,
    block: Spanned<RateLimitYaml>,
    errors: &mut Vec<ConfigError>,
) -> Option<LimitSpec> {
    let at_block = pos(&block.referenced);
    let r = block.value;
    let before = errors.len();
    let mut error = |at: (u64, u64), field: &str, message: String| {
        errors.push(ConfigError::at(
            file,
            at,
            Some(&format!("rate_limit.{field}")),
            message,
        ));
    };

    let unlimited = r.unlimited.as_ref().is_some_and(|u| u.value);
    if unlimited {
        // Everything that sizes a limit contradicts `unlimited: true`.
        let sized = [
            ("unit", r.unit.as_ref().map(|s| &s.referenced)),
            ("period", r.period.as_ref().map(|s| &s.referenced)),
            (
                "requests_per_unit",
                r.requests_per_unit.as_ref().map(|s| &s.referenced),
            ),
            ("algorithm", r.algorithm.as_ref().map(|s| &s.referenced)),
            ("burst", r.burst.as_ref().map(|s| &s.referenced)),
        ];
        for (field, at) in sized {
            if let Some(at) = at {
                error(
                    pos(at),
                    field,
                    "must not be set when `unlimited` is true".into(),
                );
            }
        }
    }

    let unit = r.unit.as_ref().and_then(|u| match u.value.parse::<Unit>() {
        Ok(unit) => Some(unit),
        Err(e) => {
            error(pos(&u.referenced), "unit", e.to_string());
            None
        }
    });
    let period = r
        .period
        .as_ref()
        .and_then(|p| match humantime::parse_duration(&p.value) {
            Ok(d) if d > Duration::ZERO => Some(d),
            Ok(_) => {
                error(
                    pos(&p.referenced),
                    "period",
                    "must be longer than zero".into(),
                );
                None
            }
            Err(e) => {
                error(
                    pos(&p.referenced),
                    "period",
                    format!(
                        "`{}` is not a duration ({e}); write e.g. `90s`, `5m`, `1h30m`",
                        p.value
                    ),
                );
                None
            }
        });
    if let (Some(_), Some(p)) = (&r.unit, &r.period) {
        error(
            pos(&p.referenced),
            "period",
            "give either `unit` or `period`, not both".into(),
        );
    }
    let algorithm = r
        .algorithm
        .as_ref()
        .and_then(|a| match a.value.parse::<Algorithm>() {
            Ok(algorithm) => Some(algorithm),
            Err(e) => {
                error(pos(&a.referenced), "algorithm", e.to_string());
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
                    pos(&f.referenced),
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
            error(
                pos(&entry.name.referenced),
                "replaces.name",
                "must not be empty".into(),
            );
        } else if r.name.as_ref().is_some_and(|n| n.value == entry.name.value) {
            error(
                pos(&entry.name.referenced),
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
                        pos(&b.referenced),
                        "burst",
                        "has no effect when `requests_per_unit` is 0".into(),
                    );
                }
                Some(Rate::Blocked { period })
            }
            (Some(period), Some(n)) => {
                let algorithm = algorithm.unwrap_or(DEFAULT_ALGORITHM);
                let built = Quota::new(n.value, period)
                    .and_then(|q| q.with_algorithm(algorithm))
                    .map_err(|e| ("requests_per_unit", &n.referenced, e))
                    .and_then(|q| match &r.burst {
                        Some(b) => q
                            .with_burst(b.value)
                            .map_err(|e| ("burst", &b.referenced, e)),
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
                        error(pos(at), field, message);
                        None
                    }
                }
            }
            _ => None,
        }
    };
    if errors.len() > before {
        return None;
    }
    Some(LimitSpec {
        rate: rate?,
        name: r.name.map(|n| n.value),
        replaces,
        fail,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors(text: &str) -> Vec<String> {
        parse(Path::new("f.yaml"), text)
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
        assert_eq!(q.algorithm(), DEFAULT_ALGORITHM);
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
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5, burst: 9}\n"
            ),
            [
                "f.yaml:4:61: `rate_limit.burst`: applies to gcra and leaky_bucket only; sliding_window allows `requests_per_unit` per window"
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
