//! The policy configuration: envoyproxy/ratelimit YAML files (one domain each) turned into a
//! [`RuleSet`], with errors that name file, line, column and field; the built-in default policy;
//! and reloading ([`reload`]).
//!
//! The file format is envoyproxy/ratelimit's, so existing files work unchanged:
//!
//! ```yaml
//! domain: edge
//! descriptors:
//!   - key: remote_address          # one counter per address
//!     rate_limit: {unit: minute, requests_per_unit: 100}
//!   - key: path
//!     value: "/login"              # this value only
//!     rate_limit:
//!       requests_per_unit: 5
//!       period: 90s                # extension: any period instead of `unit`
//!       algorithm: gcra            # extension: default sliding_window
//!       burst: 10                  # extension: gcra / leaky_bucket only
//!       fail: closed               # extension: open | closed | local
//!   - key: tokens
//!     rate_limit:
//!       requests_per_unit: 100000
//!       unit: hour
//!       charge: true               # extension: hits > 0 are charges (docs/envoy.md)
//! ```

pub mod address;
pub mod concurrency;
mod error;
pub mod gateway;
pub mod reload;
pub mod rlqs;
pub mod websocket;
pub mod xds;
mod yaml;

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use flowgate::envoy::{RuleErrorKind, RuleSet};

pub use address::ListenAddr;
pub use concurrency::ConcurrencyLimit;
pub use error::{ConfigError, ConfigErrors};
pub use gateway::GatewayConfig;
pub use rlqs::RlqsConfig;
pub use websocket::WebSocketConfig;
pub use xds::XdsRules;

/// The policy used when `flowgate serve` is given no `--config`: domain `default`, documented
/// in `docs/service.md`.
pub const DEFAULT_POLICY: &str = include_str!("default.yaml");

/// The name the built-in policy is reported under.
pub const DEFAULT_POLICY_NAME: &str = "<built-in default policy>";

/// A loaded, validated policy: every domain's rules and where they came from.
#[derive(Debug)]
pub struct Policy {
    /// The rule trees.
    pub rules: RuleSet,
    /// The files it was loaded from, in command-line order.
    pub files: Vec<PathBuf>,
    /// The files' texts as loaded (the built-in policy's too): what an xDS update is combined
    /// with.
    pub sources: Vec<Source>,
    /// The rules from the xDS management server, when `--config-source` names one.
    pub xds: Option<XdsRules>,
    /// A hash of the files' contents and of the files they refer to: equal digests mean
    /// identical configuration.
    pub digest: u64,
    /// The files the configuration files refer to (JWT key files), as read for this policy:
    /// part of the digest, and watched like the configuration files.
    pub references: Vec<Reference>,
    /// When it was loaded.
    pub loaded_at: SystemTime,
    /// The `gateway` section (at most one file has one).
    pub gateway: Option<GatewayConfig>,
    /// The `websocket` section (at most one file has one).
    pub websocket: Option<WebSocketConfig>,
    /// Each domain's `rlqs` section (domains without one use [`RlqsConfig::default`]).
    pub rlqs: std::collections::BTreeMap<String, RlqsConfig>,
    /// The `concurrency` limits of every file, by name (unique across files).
    pub concurrency: std::collections::BTreeMap<String, ConcurrencyLimit>,
}

impl Policy {
    /// The RLQS settings of `domain`.
    pub fn rlqs(&self, domain: &str) -> RlqsConfig {
        self.rlqs.get(domain).copied().unwrap_or_default()
    }
}

/// A configuration file's name and text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// The file's name as given (used in errors).
    pub path: PathBuf,
    /// Its contents.
    pub text: String,
}

impl Source {
    /// Reads `path`.
    pub fn read(path: &Path) -> Result<Source, ConfigError> {
        std::fs::read_to_string(path)
            .map(|text| Source {
                path: path.to_owned(),
                text,
            })
            .map_err(|e| ConfigError::file(path, format!("cannot read: {e}")))
    }

    /// The built-in default policy.
    pub fn builtin() -> Source {
        Source {
            path: PathBuf::from(DEFAULT_POLICY_NAME),
            text: DEFAULT_POLICY.to_owned(),
        }
    }
}

/// A file a configuration file refers to (a JWT key file), as it was when the configuration
/// was read. Secrets named by environment variables are not references: a process's
/// environment cannot change while it runs, so rotating one means restarting.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Reference {
    /// The file, as the configuration names it (relative to the configuration file's
    /// directory).
    pub path: PathBuf,
    /// A hash of its contents when read; `None` when it could not be read.
    pub contents: Option<u64>,
}

impl Reference {
    /// The reference to `path` whose contents were `read`.
    pub fn new(path: &Path, read: Option<&[u8]>) -> Reference {
        Reference {
            path: path.to_owned(),
            contents: read.map(|bytes| {
                let mut hasher = DefaultHasher::new();
                bytes.hash(&mut hasher);
                hasher.finish()
            }),
        }
    }

    /// `path` as it is now.
    pub fn read_now(path: &Path) -> Reference {
        Reference::new(path, std::fs::read(path).ok().as_deref())
    }
}

/// Reads and validates `paths`; every file is one domain. With no paths, the built-in policy.
pub fn load(paths: &[PathBuf]) -> Result<Policy, ConfigErrors> {
    Policy::from_sources(read_all(paths)?)
}

/// Reads and validates `paths` for a server whose rules also come from an xDS management
/// server: with no paths, no rules at all (until the first xDS version) instead of the built-in
/// policy.
pub fn load_beside_xds(paths: &[PathBuf]) -> Result<Policy, ConfigErrors> {
    if paths.is_empty() {
        return Policy::from_sources(Vec::new());
    }
    load(paths)
}

/// Reads every file of `paths` (the built-in policy when there are none).
pub fn read_all(paths: &[PathBuf]) -> Result<Vec<Source>, ConfigErrors> {
    if paths.is_empty() {
        return Ok(vec![Source::builtin()]);
    }
    let mut sources = Vec::with_capacity(paths.len());
    let mut errors = Vec::new();
    for path in paths {
        match Source::read(path) {
            Ok(source) => sources.push(source),
            Err(e) => errors.push(e),
        }
    }
    if errors.is_empty() {
        Ok(sources)
    } else {
        Err(ConfigErrors(errors))
    }
}

/// A hash of the sources' names and contents and of the files they refer to: the identity of
/// a configuration.
pub fn digest(sources: &[Source], references: &[Reference]) -> u64 {
    let mut hasher = DefaultHasher::new();
    for source in sources {
        source.path.hash(&mut hasher);
        source.text.hash(&mut hasher);
    }
    references.hash(&mut hasher);
    hasher.finish()
}

impl Policy {
    /// The policy of the file texts `files` and the xDS rules `xds` together: every domain
    /// once (a domain defined by a file and by a resource is an error naming both). Errors
    /// about a resource name it and the field. Files referred to are noted in `references`.
    pub fn compose(
        files: Vec<Source>,
        xds: Option<XdsRules>,
        references: &mut Vec<Reference>,
    ) -> Result<Policy, ConfigErrors> {
        let Some(xds) = xds else {
            return Policy::from_sources_noting(files, references);
        };
        let count = files.len();
        let mut sources = files;
        sources.extend(xds.sources().cloned());
        let mut policy =
            Policy::from_sources_noting(sources, references).map_err(|e| xds.explain(e))?;
        policy.files.truncate(count);
        policy.sources.truncate(count);
        policy.xds = Some(xds);
        Ok(policy)
    }

    /// Parses and validates configuration texts; every source is one domain.
    pub fn from_sources(sources: Vec<Source>) -> Result<Policy, ConfigErrors> {
        Policy::from_sources_noting(sources, &mut Vec::new())
    }

    /// [`Policy::from_sources`], noting in `references` every file the sources refer to (also
    /// when they are rejected: a missing key file may appear later).
    pub fn from_sources_noting(
        sources: Vec<Source>,
        references: &mut Vec<Reference>,
    ) -> Result<Policy, ConfigErrors> {
        let mut errors = Vec::new();
        let mut domains = Vec::with_capacity(sources.len());
        let mut positions = Vec::with_capacity(sources.len());
        let mut gateway: Option<(GatewayConfig, PathBuf, Vec<yaml::PendingInFlight>)> = None;
        let mut websocket: Option<(WebSocketConfig, PathBuf)> = None;
        let mut rlqs = std::collections::BTreeMap::new();
        let mut concurrency = std::collections::BTreeMap::new();
        let mut concurrency_files: std::collections::BTreeMap<String, PathBuf> =
            std::collections::BTreeMap::new();
        for source in &sources {
            match yaml::parse(&source.path, &source.text, references) {
                Ok(parsed) => {
                    if let Some(section) = parsed.rlqs {
                        rlqs.insert(parsed.domain.domain.clone(), section);
                    }
                    for (name, at, limit) in parsed.concurrency {
                        if let Some(first) = concurrency_files.get(&name) {
                            errors.push(ConfigError::at(
                                &source.path,
                                at,
                                Some("concurrency.name"),
                                format!("`{name}` is already defined by {}", Path::display(first)),
                            ));
                        } else {
                            concurrency_files.insert(name.clone(), source.path.clone());
                            concurrency.insert(name, limit);
                        }
                    }
                    domains.push(parsed.domain);
                    positions.push(parsed.positions);
                    match (parsed.gateway, &gateway) {
                        (Some((_, at, _)), Some((_, first, _))) => errors.push(ConfigError::at(
                            &source.path,
                            at,
                            Some("gateway"),
                            format!(
                                "only one configuration file may have a `gateway` section; {} has one too",
                                first.display()
                            ),
                        )),
                        (Some((section, _, in_flight)), None) => {
                            gateway = Some((section, source.path.clone(), in_flight));
                        }
                        (None, _) => {}
                    }
                    match (parsed.websocket, &websocket) {
                        (Some((_, at)), Some((_, first))) => errors.push(ConfigError::at(
                            &source.path,
                            at,
                            Some("websocket"),
                            format!(
                                "only one configuration file may have a `websocket` section; {} has one too",
                                first.display()
                            ),
                        )),
                        (Some((section, _)), None) => {
                            websocket = Some((section, source.path.clone()));
                        }
                        (None, _) => {}
                    }
                }
                Err(mut e) => errors.append(&mut e),
            }
        }
        let gateway = gateway.map(|(mut section, file, pending)| {
            section.in_flight = resolve_in_flight(&file, pending, &concurrency, &mut errors);
            section
        });
        if !errors.is_empty() {
            return Err(ConfigErrors(errors));
        }
        let names: Vec<String> = domains.iter().map(|d| d.domain.clone()).collect();
        let rules = RuleSet::build(domains).map_err(|e| {
            let file = &sources[e.path.domain].path;
            let at = positions[e.path.domain].of(&e.path.rules);
            let field = match e.kind {
                RuleErrorKind::EmptyDomain | RuleErrorKind::DuplicateDomain(_) => "domain",
                RuleErrorKind::EmptyKey | RuleErrorKind::DuplicateRule { .. } => "key",
                RuleErrorKind::EmptyReplaces | RuleErrorKind::ReplacesItself(_) => {
                    "rate_limit.replaces"
                }
                RuleErrorKind::ShareWithoutWildcard => "share_threshold",
                RuleErrorKind::UncountedAmongLimits | RuleErrorKind::DuplicateLimit { .. } => {
                    "rate_limits"
                }
            };
            let message = match &e.kind {
                RuleErrorKind::DuplicateDomain(d) => {
                    let first = sources[..e.path.domain]
                        .iter()
                        .zip(&names)
                        .find(|(_, name)| *name == d)
                        .map_or_else(
                            || "another file".to_owned(),
                            |(source, _)| source.path.display().to_string(),
                        );
                    format!("domain `{d}` is already defined by {first}")
                }
                other => other.to_string(),
            };
            ConfigErrors::from(ConfigError::at(file, at, Some(field), message))
        })?;
        Ok(Policy {
            rules,
            digest: digest(&sources, references),
            references: references.clone(),
            files: sources.iter().map(|s| s.path.clone()).collect(),
            sources,
            xds: None,
            loaded_at: SystemTime::now(),
            gateway,
            websocket: websocket.map(|(section, _)| section),
            rlqs,
            concurrency,
        })
    }
}

/// The gateway's `in_flight` items (of `file`) with their `concurrency` limits, found in any
/// file; a name no file defines is an error at the item's `limit`.
fn resolve_in_flight(
    file: &Path,
    pending: Vec<yaml::PendingInFlight>,
    concurrency: &std::collections::BTreeMap<String, ConcurrencyLimit>,
    errors: &mut Vec<ConfigError>,
) -> Vec<gateway::InFlightConfig> {
    let mut resolved = Vec::with_capacity(pending.len());
    for item in pending {
        match concurrency.get(&item.name) {
            Some(limit) => resolved.push(gateway::InFlightConfig {
                name: item.name,
                limit: *limit,
                key: item.key,
            }),
            None => {
                let known = if concurrency.is_empty() {
                    "no file has a `concurrency` section".to_owned()
                } else {
                    let names: Vec<&str> = concurrency.keys().map(String::as_str).collect();
                    format!("the configuration defines {}", names.join(", "))
                };
                errors.push(ConfigError::at(
                    file,
                    item.at,
                    Some("gateway.in_flight.limit"),
                    format!("no concurrency limit named `{}`; {known}", item.name),
                ));
            }
        }
    }
    resolved
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(name: &str, text: &str) -> Source {
        Source {
            path: PathBuf::from(name),
            text: text.to_owned(),
        }
    }

    #[test]
    fn the_builtin_policy_is_valid() {
        let policy = load(&[]).unwrap();
        assert!(policy.rules.has_domain("default"));
        assert!(!policy.rules.rules().is_empty());
    }

    #[test]
    fn limits_of_one_rule_must_differ_in_quota_and_name() {
        let error = |text: &str| {
            Policy::from_sources(vec![source("a.yaml", text)])
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            error(
                "domain: a\ndescriptors:\n  - key: k\n    rate_limits:\n      - {unit: second, requests_per_unit: 1}\n      - {unit: second, requests_per_unit: 1, name: n}\n"
            ),
            "a.yaml:3:10: `rate_limits`: limit 1 of this rule repeats the quota of another of its limits"
        );
        assert_eq!(
            error(
                "domain: a\ndescriptors:\n  - key: k\n    rate_limits:\n      - {unit: second, requests_per_unit: 1, name: n}\n      - {unit: day, requests_per_unit: 9, replaces: [{name: n}]}\n"
            ),
            "a.yaml:3:10: `rate_limit.replaces`: limit `n` must not replace itself or another limit of its rule"
        );
    }

    #[test]
    fn duplicates_across_and_within_files_point_at_the_rule() {
        let dup_rule = Policy::from_sources(vec![source(
            "a.yaml",
            "domain: a\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n",
        )])
        .unwrap_err();
        assert_eq!(
            dup_rule.to_string(),
            "a.yaml:5:10: `key`: duplicate rule: another rule at this level has key `k` and value `v`"
        );
        let dup_domain = Policy::from_sources(vec![
            source("a.yaml", "domain: a\n"),
            source("b.yaml", "\ndomain: a\n"),
        ])
        .unwrap_err();
        assert_eq!(
            dup_domain.to_string(),
            "b.yaml:2:9: `domain`: domain `a` is already defined by a.yaml"
        );
    }
}
