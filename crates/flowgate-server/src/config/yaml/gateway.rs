//! The `gateway` section: listener, trusted proxies, JWT keys and the descriptors the reverse
//! proxy builds from each request.

use std::path::Path;
use std::time::Duration;

use flowgate::http::key::{Header, Jwt};
use http::HeaderName;
use serde::Deserialize;

use super::Spanned;
use crate::config::Reference;
use crate::config::address::{Ipv6Prefix, ListenAddr, TrustedProxy, client_ip};
use crate::config::error::ConfigError;
use crate::config::gateway::{
    DEFAULT_BODY_IDLE_TIMEOUT, DEFAULT_UPSTREAM_MAX_CONNECTIONS, DEFAULT_UPSTREAM_QUEUE_TIMEOUT,
    DEFAULT_UPSTREAM_TIMEOUT, EntryConfig, Forwarded, GatewayConfig, Source,
};

/// The `gateway` section (see [`super::gateway`]).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct GatewayYaml {
    /// Address to listen on.
    #[serde(default)]
    listen: Option<ListenAddr>,
    /// Networks whose `X-Forwarded-For` is believed.
    #[serde(default)]
    trusted_proxies: Vec<TrustedProxy>,
    /// Prefix length IPv6 clients are keyed by.
    #[serde(default)]
    ipv6_prefix: Option<Ipv6Prefix>,
    /// The request descriptors: lists of entries.
    #[serde(default)]
    descriptors: Option<Spanned<Vec<Vec<Spanned<EntryYaml>>>>>,
    /// How bearer tokens are verified for `jwt_claim` entries.
    #[serde(default)]
    jwt: Option<Spanned<JwtYaml>>,
    /// How long to wait for the upstream's response head.
    #[serde(default, deserialize_with = "flowgate::settings::optional_duration")]
    upstream_timeout: Option<Duration>,
    /// Connections to the upstream open at once.
    #[serde(default)]
    upstream_max_connections: Option<Spanned<u64>>,
    /// A request's wait for a busy pool.
    #[serde(default, deserialize_with = "flowgate::settings::optional_duration")]
    upstream_queue_timeout: Option<Duration>,
    /// Silence allowed in a body.
    #[serde(default, deserialize_with = "flowgate::settings::optional_duration")]
    body_idle_timeout: Option<Duration>,
    /// `overwrite` or `append`: untrusted clients' forwarding fields.
    #[serde(default)]
    forwarded: Option<Spanned<String>>,
    /// The upstream response header reporting the units used, charged to `charge: true` rules.
    #[serde(default)]
    usage_header: Option<Spanned<String>>,
    /// A JSON pointer to the units used in the upstream's response body.
    #[serde(default)]
    usage_json: Option<Spanned<String>>,
    /// Concurrency limits each request holds a lease of while in flight.
    #[serde(default)]
    in_flight: Option<Spanned<Vec<Spanned<InFlightYaml>>>>,
}

/// One item of `in_flight`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct InFlightYaml {
    /// The `concurrency` limit's name.
    limit: Spanned<String>,
    /// The entries keying the leases (the sources of `descriptors`).
    key: Spanned<Vec<Spanned<EntryYaml>>>,
}

/// An `in_flight` item whose `concurrency` limit is still to be found (in any file): its
/// name, the name's position, and its key.
#[derive(Debug)]
pub(crate) struct PendingInFlight {
    /// The `concurrency` limit's name.
    pub(crate) name: String,
    /// Where the name is.
    pub(crate) at: (u64, u64),
    /// The key's entries.
    pub(crate) key: Vec<EntryConfig>,
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

/// The `jwt` block (of `gateway` and `websocket`): exactly one key.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct JwtYaml {
    /// The environment variable holding the HS256 secret.
    #[serde(default)]
    hs256_secret_env: Option<Spanned<String>>,
    /// A PEM file with the RS256 public key (relative to the configuration file).
    #[serde(default)]
    rs256_public_key_file: Option<Spanned<String>>,
}

/// Validates the `gateway` section; pushes its errors and returns `None` when it has any.
/// Its `in_flight` items come back apart (the configuration's `in_flight` is left empty):
/// their `concurrency` limits may be defined by another file.
pub(super) fn convert_gateway(
    file: &Path,
    domain: &str,
    g: GatewayYaml,
    at_section: (u64, u64),
    errors: &mut Vec<ConfigError>,
    references: &mut Vec<Reference>,
) -> Option<(GatewayConfig, Vec<PendingInFlight>)> {
    let before = errors.len();
    let mut error = |at: (u64, u64), field: &str, message: String| {
        errors.push(ConfigError::at(
            file,
            at,
            Some(&format!("gateway.{field}")),
            message,
        ));
    };

    let upstream_timeout = g.upstream_timeout.unwrap_or(DEFAULT_UPSTREAM_TIMEOUT);
    let upstream_queue_timeout = g
        .upstream_queue_timeout
        .unwrap_or(DEFAULT_UPSTREAM_QUEUE_TIMEOUT);
    let body_idle_timeout = g.body_idle_timeout.unwrap_or(DEFAULT_BODY_IDLE_TIMEOUT);
    let upstream_max_connections = match &g.upstream_max_connections {
        None => Some(DEFAULT_UPSTREAM_MAX_CONNECTIONS),
        Some(n) => match usize::try_from(n.value) {
            Ok(n) if (1..=1_000_000).contains(&n) => Some(n),
            _ => {
                error(
                    n.at,
                    "upstream_max_connections",
                    "must be between 1 and 1000000".into(),
                );
                None
            }
        },
    };
    let jwt = g
        .jwt
        .as_ref()
        .and_then(|j| convert_jwt(file, j, references, &mut error));

    let mut descriptors = Vec::new();
    match &g.descriptors {
        Some(list) if !list.value.is_empty() => {
            for entries in &list.value {
                if entries.is_empty() {
                    error(
                        list.at,
                        "descriptors",
                        "a descriptor needs at least one entry".into(),
                    );
                    continue;
                }
                let built = convert_entries(
                    entries,
                    "descriptors",
                    jwt.as_ref(),
                    g.jwt.is_some(),
                    &mut error,
                );
                descriptors.push(built);
            }
        }
        Some(list) => error(
            list.at,
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

    let forwarded = match g.forwarded.as_ref().map(|f| (f.value.as_str(), f)) {
        None | Some(("overwrite", _)) => Forwarded::Overwrite,
        Some(("append", _)) => Forwarded::Append,
        Some((other, f)) => {
            error(
                f.at,
                "forwarded",
                format!("`{other}` is not `overwrite` or `append`"),
            );
            Forwarded::Overwrite
        }
    };

    let usage_header = g.usage_header.as_ref().and_then(|h| {
        match http::HeaderName::from_bytes(h.value.as_bytes()) {
            Ok(name) => Some(name),
            Err(_) => {
                error(
                    h.at,
                    "usage_header",
                    format!("`{}` is not a header name", h.value),
                );
                None
            }
        }
    });

    let usage_json = g.usage_json.as_ref().and_then(|p| {
        if p.value.starts_with('/') {
            Some(p.value.clone())
        } else {
            error(
                p.at,
                "usage_json",
                format!(
                    "`{}` is not a JSON pointer (RFC 6901) to a field; write e.g. `/usage/total_tokens`",
                    p.value
                ),
            );
            None
        }
    });

    let mut in_flight = Vec::new();
    for item in g.in_flight.iter().flat_map(|list| &list.value) {
        let InFlightYaml { limit, key } = &item.value;
        if key.value.is_empty() {
            error(
                key.at,
                "in_flight.key",
                "needs at least one entry, e.g. `[{key: remote_address}]`".into(),
            );
            continue;
        }
        for entry in &key.value {
            if let Some(k) = &entry.value.as_key {
                error(
                    k.at,
                    "in_flight.key.as",
                    "does not apply to an `in_flight` key (it names descriptor entries)".into(),
                );
            }
        }
        let key = convert_entries(
            &key.value,
            "in_flight.key",
            jwt.as_ref(),
            g.jwt.is_some(),
            &mut error,
        );
        in_flight.push(PendingInFlight {
            name: limit.value.trim().to_owned(),
            at: limit.at,
            key,
        });
    }

    if errors.len() > before {
        return None;
    }
    let config = GatewayConfig {
        forwarded,
        usage_header,
        usage_json,
        domain: domain.to_owned(),
        listen: g.listen,
        client_ip: client_ip(&g.trusted_proxies, g.ipv6_prefix),
        descriptors,
        upstream_timeout,
        upstream_max_connections: upstream_max_connections?,
        upstream_queue_timeout,
        body_idle_timeout,
        in_flight: Vec::new(),
    };
    Some((config, in_flight))
}

/// The entries of a descriptor or of an `in_flight` key (`field`: where they are, for
/// errors); those in error are reported and left out.
fn convert_entries(
    entries: &[Spanned<EntryYaml>],
    field: &str,
    jwt: Option<&Jwt>,
    jwt_configured: bool,
    error: &mut impl FnMut((u64, u64), &str, String),
) -> Vec<EntryConfig> {
    let mut built = Vec::with_capacity(entries.len());
    for entry in entries {
        let e = &entry.value;
        let source = convert_source(e, field, jwt, jwt_configured, entry.at, error);
        let key = match &e.as_key {
            Some(k) if k.value.is_empty() => {
                error(k.at, &format!("{field}.as"), "must not be empty".into());
                None
            }
            Some(k) => Some(k.value.clone()),
            None => source.as_ref().map(|(_, name)| name.clone()),
        };
        if let (Some((source, _)), Some(key)) = (source, key) {
            built.push(EntryConfig { key, source });
        }
    }
    built
}

/// Builds the verifier of a `jwt` block; reports what is wrong with it through `error` (field
/// names relative to the section) and notes its key file in `references`.
pub(super) fn convert_jwt(
    file: &Path,
    j: &Spanned<JwtYaml>,
    references: &mut Vec<Reference>,
    error: &mut impl FnMut((u64, u64), &str, String),
) -> Option<Jwt> {
    let at = j.at;
    match (&j.value.hs256_secret_env, &j.value.rs256_public_key_file) {
        (Some(env), None) => match std::env::var(&env.value) {
            Ok(secret) if !secret.is_empty() => Some(Jwt::hs256(secret.as_bytes())),
            _ => {
                error(
                    env.at,
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
            let read = std::fs::read(&path);
            references.push(Reference::new(&path, read.as_deref().ok()));
            let built = read
                .map_err(|e| format!("cannot read {}: {e}", path.display()))
                .and_then(|pem| {
                    Jwt::rs256_pem(&pem).map_err(|e| {
                        format!("{} is not an RSA public key in PEM: {e}", path.display())
                    })
                });
            match built {
                Ok(jwt) => Some(jwt),
                Err(message) => {
                    error(key_file.at, "jwt.rs256_public_key_file", message);
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
}

/// One entry's source and its default descriptor key; reports what is wrong with it (under
/// `field`, the entry's list: `descriptors` or `in_flight.key`).
fn convert_source(
    e: &EntryYaml,
    field: &str,
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
                e.key.at,
                &format!("{field}.key"),
                format!(
                    "unknown source `{other}`; expected one of {}",
                    Source::NAMES
                ),
            );
            return None;
        }
    };
    let mut ok = true;
    for (name, given, wanted) in [
        ("header", &e.header, wants_header),
        ("claim", &e.claim, wants_claim),
        ("value", &e.value, wants_value),
    ] {
        match given {
            Some(v) if !wanted => {
                error(
                    v.at,
                    &format!("{field}.{name}"),
                    format!("does not apply to `key: {source}`"),
                );
                ok = false;
            }
            None if wanted => {
                error(
                    at,
                    &format!("{field}.{name}"),
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
                        h.at,
                        &format!("{field}.header"),
                        format!("`{}` is not a header name", h.value),
                    );
                    None
                }
            }
        }
        "jwt_claim" => {
            let c = e.claim.as_ref()?;
            if c.value.is_empty() {
                error(c.at, &format!("{field}.claim"), "must not be empty".into());
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
                            e.key.at,
                            &format!("{field}.key"),
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
