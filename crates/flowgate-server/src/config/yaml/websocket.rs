//! The `websocket` section: listener, upstream, where user, role and room come from, the
//! message classifier, the limits of both directions (the library's [`WsPolicy`], read as it
//! is), buffers and timeouts.

use std::num::NonZeroUsize;
use std::path::Path;
use std::time::Duration;

use flowgate::http::key::Header;
use flowgate::ws::{Classifier, WsPolicy};
use http::HeaderName;
use serde::Deserialize;

use super::gateway::{JwtYaml, convert_jwt};
use super::node::Node;
use super::{SectionErrors, Spanned};
use crate::config::Reference;
use crate::config::address::{Ipv6Prefix, ListenAddr, TrustedProxy, client_ip};
use crate::config::error::ConfigError;
use crate::config::websocket::{
    DEFAULT_BUFFER_BYTES, DEFAULT_BUFFER_MESSAGES, DEFAULT_HANDSHAKE_TIMEOUT, DEFAULT_IDLE_TIMEOUT,
    KeySource, SlowReader, WebSocketConfig, WsUpstream,
};

/// The `websocket` section (see [`crate::config::websocket`]).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct WebSocketYaml {
    /// Address to listen on.
    #[serde(default)]
    listen: Option<ListenAddr>,
    /// `ws://host:port`.
    #[serde(default)]
    upstream: Option<Spanned<String>>,
    /// Networks whose `X-Forwarded-For` is believed.
    #[serde(default)]
    trusted_proxies: Vec<TrustedProxy>,
    /// Prefix length IPv6 clients are keyed by.
    #[serde(default)]
    ipv6_prefix: Option<Ipv6Prefix>,
    /// How bearer tokens are verified for `jwt_claim` sources.
    #[serde(default)]
    jwt: Option<Spanned<JwtYaml>>,
    /// Where the user comes from.
    #[serde(default)]
    user: Option<Spanned<SourceYaml>>,
    /// Where the role comes from.
    #[serde(default)]
    role: Option<Spanned<SourceYaml>>,
    /// Where the room comes from.
    #[serde(default)]
    room: Option<Spanned<SourceYaml>>,
    /// JSON pointers into client messages.
    #[serde(default)]
    classify: Option<ClassifyYaml>,
    /// Client → upstream limits (and the upgrade's).
    #[serde(default)]
    limits: Option<Spanned<WsPolicy>>,
    /// Upstream → client limits.
    #[serde(default)]
    outbound: Option<Spanned<WsPolicy>>,
    /// Per-direction buffer bounds.
    #[serde(default)]
    buffer: Option<BufferYaml>,
    /// pause | drop | close.
    #[serde(default)]
    slow_reader: Option<SlowReader>,
    /// The upstream upgrade's timeout.
    #[serde(default, deserialize_with = "flowgate::settings::optional_duration")]
    handshake_timeout: Option<Duration>,
    /// The idle timeout.
    #[serde(default, deserialize_with = "flowgate::settings::optional_duration")]
    idle_timeout: Option<Duration>,
}

/// `{source: header|jwt_claim|query|path, name: …}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SourceYaml {
    /// header, jwt_claim, query or path.
    source: Spanned<String>,
    /// The header, claim or parameter.
    #[serde(default)]
    name: Option<Spanned<String>>,
}

/// `classify`: JSON pointers.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClassifyYaml {
    /// The message type.
    #[serde(default, rename = "type")]
    kind: Option<Spanned<String>>,
    /// The cost (a number, or an array's length).
    #[serde(default)]
    cost: Option<Spanned<String>>,
    /// The room.
    #[serde(default)]
    room: Option<Spanned<String>>,
}

/// `{messages: N, bytes: N}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BufferYaml {
    #[serde(default)]
    messages: Option<NonZeroUsize>,
    #[serde(default)]
    bytes: Option<NonZeroUsize>,
}

/// Validates the `websocket` section (whose node is `node`); pushes its errors and returns
/// `None` when it has any.
pub(super) fn convert_websocket(
    file: &Path,
    w: WebSocketYaml,
    at_section: (u64, u64),
    node: Option<&Node>,
    errors: &mut Vec<ConfigError>,
    references: &mut Vec<Reference>,
) -> Option<WebSocketConfig> {
    let before = errors.len();
    let mut e = SectionErrors::new(file, "websocket", errors);

    let upstream = match &w.upstream {
        None => {
            e.push(
                at_section,
                "upstream",
                "is required: where connections are relayed, e.g. `ws://127.0.0.1:9000`",
            );
            None
        }
        Some(u) => match WsUpstream::parse(u.value.trim()) {
            Ok(upstream) => Some(upstream),
            Err(why) => {
                e.push(u.at, "upstream", format!("`{}`: {why}", u.value));
                None
            }
        },
    };
    let jwt = w.jwt.as_ref().and_then(|j| {
        convert_jwt(file, j, references, &mut |at, field, message| {
            e.push(at, field, message);
        })
    });
    let mut source = |s: &Option<Spanned<SourceYaml>>, field: &str, allowed: &[&str]| {
        let s = s.as_ref()?;
        let kind = s.value.source.value.as_str();
        let at = s.value.source.at;
        if !allowed.contains(&kind) {
            e.push(
                at,
                &format!("{field}.source"),
                format!(
                    "unknown source `{kind}`; expected one of {}",
                    allowed.join(", ")
                ),
            );
            return None;
        }
        let name = s.value.name.as_ref();
        match (kind, name) {
            ("path", None) => return Some(KeySource::Path),
            ("path", Some(n)) => {
                e.push(
                    n.at,
                    &format!("{field}.name"),
                    "does not apply to `source: path`",
                );
                return None;
            }
            (_, None) => {
                e.push(
                    s.at,
                    &format!("{field}.name"),
                    format!("is required with `source: {kind}`"),
                );
                return None;
            }
            (_, Some(n)) if n.value.trim().is_empty() => {
                e.push(n.at, &format!("{field}.name"), "must not be empty");
                return None;
            }
            _ => {}
        }
        let name = name?;
        match kind {
            "header" => match HeaderName::from_bytes(name.value.trim().as_bytes()) {
                Ok(h) => Some(KeySource::Header(Header::new(h))),
                Err(_) => {
                    e.push(
                        name.at,
                        &format!("{field}.name"),
                        format!("`{}` is not a header name", name.value),
                    );
                    None
                }
            },
            "jwt_claim" => match &jwt {
                Some(jwt) => Some(KeySource::JwtClaim(jwt.claim(name.value.clone()))),
                None => {
                    if w.jwt.is_none() {
                        e.push(
                            at,
                            &format!("{field}.source"),
                            "`jwt_claim` needs a `websocket.jwt` block saying how tokens are verified",
                        );
                    }
                    None
                }
            },
            "query" => Some(KeySource::Query(name.value.clone())),
            _ => None,
        }
    };
    let user = source(&w.user, "user", &["header", "jwt_claim"]);
    let role = source(&w.role, "role", &["header", "jwt_claim"]);
    let room = source(&w.room, "room", &["path", "query", "header"]);

    let mut classifier = Classifier::new();
    if let Some(c) = &w.classify {
        for (pointer, field) in [(&c.kind, "type"), (&c.cost, "cost"), (&c.room, "room")] {
            let Some(p) = pointer else { continue };
            if !(p.value.is_empty() || p.value.starts_with('/')) {
                e.push(
                    p.at,
                    &format!("classify.{field}"),
                    format!(
                        "`{}` is not a JSON pointer (RFC 6901); write e.g. `/type`",
                        p.value
                    ),
                );
                continue;
            }
            classifier = match field {
                "type" => classifier.kind_at(p.value.clone()),
                "cost" => classifier.cost_at(p.value.clone()),
                _ => classifier.room_at(p.value.clone()),
            };
        }
    }

    let limits = w.limits.map(|l| check_policy(&mut e, l, node, "limits"));
    let outbound = w
        .outbound
        .map(|l| check_policy(&mut e, l, node, "outbound"));

    if e.errors.len() > before {
        return None;
    }
    let buffer = w.buffer.as_ref();
    Some(WebSocketConfig {
        listen: w.listen,
        upstream: upstream?,
        client_ip: client_ip(&w.trusted_proxies, w.ipv6_prefix),
        user,
        role,
        room,
        classifier,
        limits: limits.unwrap_or_default(),
        outbound,
        buffer_messages: buffer
            .and_then(|b| b.messages)
            .map_or(DEFAULT_BUFFER_MESSAGES, NonZeroUsize::get),
        buffer_bytes: buffer
            .and_then(|b| b.bytes)
            .map_or(DEFAULT_BUFFER_BYTES, NonZeroUsize::get),
        slow_reader: w.slow_reader.unwrap_or(SlowReader::Pause),
        handshake_timeout: w.handshake_timeout.unwrap_or(DEFAULT_HANDSHAKE_TIMEOUT),
        idle_timeout: w.idle_timeout.unwrap_or(DEFAULT_IDLE_TIMEOUT),
    })
}

/// The upgrade layers: `outbound` never sees an upgrade.
const UPGRADE_FIELDS: [&str; 5] = [
    "connections_per_ip",
    "concurrent_per_ip",
    "concurrent_per_user",
    "max_connections",
    "penalty_box",
];

/// Reports what the library finds wrong with a `limits` (or `outbound`) policy, each problem
/// at its field's node, and the upgrade layers an `outbound` policy sets.
fn check_policy(
    e: &mut SectionErrors<'_>,
    policy: Spanned<WsPolicy>,
    section: Option<&Node>,
    block: &str,
) -> WsPolicy {
    let at = |field: &str| {
        let mut path = vec![block];
        path.extend(field.split('.'));
        section
            .and_then(|n| n.find(&path))
            .map_or(policy.at, |n| n.at)
    };
    for problem in policy.value.problems() {
        let field = problem.field();
        e.push(at(field), &format!("{block}.{field}"), problem.to_string());
    }
    if policy.value.errors.is_some() {
        e.push(
            at("errors"),
            &format!("{block}.errors"),
            "the gateway closes a connection at its first protocol error (1002, 1007), so it has no errors to count; this layer counts errors an application reports to the library (`Session::error`)",
        );
    }
    if block == "outbound" {
        let p = &policy.value;
        let set = [
            p.connections_per_ip.is_some(),
            p.concurrent_per_ip.is_some(),
            p.concurrent_per_user.is_some(),
            p.max_connections.is_some(),
            p.penalty_box.is_some(),
        ];
        for (field, set) in UPGRADE_FIELDS.into_iter().zip(set) {
            if set {
                e.push(
                    at(field),
                    &format!("outbound.{field}"),
                    "limits the upgrade, which `outbound` does not see; set it under `limits`",
                );
            }
        }
    }
    policy.value
}
