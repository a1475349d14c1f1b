//! The `websocket` section: listener, upstream, where user, role and room come from, the
//! message classifier, the limits of both directions, buffers and timeouts.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use flowgate::Quota;
use flowgate::http::key::{ClientIp, Header, PeerIp};
use flowgate::ws::{Classifier, PenaltyConfig, Scope, is_valid_close_code};
use http::HeaderName;
use ipnet::IpNet;
use serde::Deserialize;
use serde_saphyr::Spanned;

use super::gateway::{JwtYaml, convert_jwt};
use super::pos;
use crate::config::Reference;
use crate::config::error::ConfigError;
use crate::config::websocket::{
    CloseAfter, DEFAULT_BUFFER_BYTES, DEFAULT_BUFFER_MESSAGES, DEFAULT_HANDSHAKE_TIMEOUT,
    DEFAULT_IDLE_TIMEOUT, KeySource, SlowReader, WebSocketConfig, WsLimits, WsUpstream,
};

/// The `websocket` section (see [`crate::config::websocket`]).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct WebSocketYaml {
    /// Address to listen on.
    #[serde(default)]
    listen: Option<Spanned<String>>,
    /// `ws://host:port`.
    #[serde(default)]
    upstream: Option<Spanned<String>>,
    /// Networks whose `X-Forwarded-For` is believed.
    #[serde(default)]
    trusted_proxies: Option<Vec<Spanned<String>>>,
    /// Prefix length IPv6 clients are keyed by.
    #[serde(default)]
    ipv6_prefix: Option<Spanned<u64>>,
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
    limits: Option<Spanned<LimitsYaml>>,
    /// Upstream → client limits.
    #[serde(default)]
    outbound: Option<Spanned<LimitsYaml>>,
    /// Per-direction buffer bounds.
    #[serde(default)]
    buffer: Option<BufferYaml>,
    /// pause | drop | close.
    #[serde(default)]
    slow_reader: Option<Spanned<String>>,
    /// The upstream upgrade's timeout.
    #[serde(default)]
    handshake_timeout: Option<Spanned<String>>,
    /// The idle timeout.
    #[serde(default)]
    idle_timeout: Option<Spanned<String>>,
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

/// `{limit: N, per: DURATION, burst: M}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct QuotaYaml {
    /// Units per period.
    limit: Spanned<u64>,
    /// The period.
    per: Spanned<String>,
    /// The bucket (default: `limit`).
    #[serde(default)]
    burst: Option<Spanned<u64>>,
}

/// `{violations: K, within: DURATION}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CloseAfterYaml {
    /// Rejections.
    violations: Spanned<u64>,
    /// Within.
    within: Spanned<String>,
}

/// The penalty box.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PenaltyYaml {
    /// Violation closes before the first ban.
    #[serde(default)]
    after_closes: Option<Spanned<u32>>,
    /// The first ban.
    #[serde(default)]
    first: Option<Spanned<String>>,
    /// The longest ban.
    #[serde(default)]
    max: Option<Spanned<String>>,
    /// Forget a client after this long without a close.
    #[serde(default)]
    forget_after: Option<Spanned<String>>,
    /// Clients remembered at most.
    #[serde(default)]
    max_entries: Option<Spanned<usize>>,
}

/// A `limits` / `outbound` block.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsYaml {
    #[serde(default)]
    connections_per_ip: Option<Spanned<QuotaYaml>>,
    #[serde(default)]
    concurrent_per_ip: Option<Spanned<u32>>,
    #[serde(default)]
    concurrent_per_user: Option<Spanned<u32>>,
    #[serde(default)]
    max_connections: Option<Spanned<usize>>,
    #[serde(default)]
    messages: Option<Spanned<QuotaYaml>>,
    #[serde(default)]
    messages_for_role: Option<BTreeMap<String, Spanned<QuotaYaml>>>,
    #[serde(default)]
    bytes: Option<Spanned<QuotaYaml>>,
    #[serde(default)]
    user_messages: Option<Spanned<QuotaYaml>>,
    #[serde(default)]
    user_messages_for_role: Option<BTreeMap<String, Spanned<QuotaYaml>>>,
    #[serde(default)]
    room_messages: Option<Spanned<QuotaYaml>>,
    #[serde(default)]
    slowmode: Option<Spanned<String>>,
    #[serde(default)]
    slowmode_exempt: Option<Vec<String>>,
    #[serde(default)]
    errors: Option<Spanned<QuotaYaml>>,
    #[serde(default)]
    max_message_size: Option<Spanned<usize>>,
    #[serde(default)]
    costs: Option<BTreeMap<String, u64>>,
    #[serde(default)]
    default_cost: Option<u64>,
    #[serde(default)]
    release: Option<Vec<String>>,
    #[serde(default)]
    close_after: Option<Spanned<CloseAfterYaml>>,
    #[serde(default)]
    close_at_multiple: Option<Spanned<u64>>,
    #[serde(default)]
    close_code: Option<Spanned<u16>>,
    #[serde(default)]
    close_reason: Option<Spanned<String>>,
    #[serde(default)]
    error_frame: Option<Spanned<String>>,
    #[serde(default)]
    penalty_box: Option<Spanned<PenaltyYaml>>,
    #[serde(default)]
    dry_run: Option<Vec<Spanned<String>>>,
    #[serde(default)]
    key_prefix: Option<String>,
}

/// `{messages: N, bytes: N}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BufferYaml {
    #[serde(default)]
    messages: Option<Spanned<usize>>,
    #[serde(default)]
    bytes: Option<Spanned<usize>>,
}

/// Collects errors under `websocket.`.
struct Errors<'a> {
    file: &'a Path,
    errors: &'a mut Vec<ConfigError>,
}

impl Errors<'_> {
    fn push(&mut self, at: (u64, u64), field: &str, message: impl Into<String>) {
        self.errors.push(ConfigError::at(
            self.file,
            at,
            Some(&format!("websocket.{field}")),
            message,
        ));
    }

    fn duration(&mut self, d: &Spanned<String>, field: &str) -> Option<Duration> {
        match humantime::parse_duration(d.value.trim()) {
            Ok(v) if v > Duration::ZERO => Some(v),
            Ok(_) => {
                self.push(pos(&d.referenced), field, "must be longer than zero");
                None
            }
            Err(e) => {
                self.push(
                    pos(&d.referenced),
                    field,
                    format!(
                        "`{}` is not a duration ({e}); write e.g. `30s`, `500ms`",
                        d.value
                    ),
                );
                None
            }
        }
    }

    fn quota(&mut self, q: &Spanned<QuotaYaml>, field: &str) -> Option<Quota> {
        let period = self.duration(&q.value.per, &format!("{field}.per"))?;
        let built =
            Quota::new(q.value.limit.value, period).and_then(|quota| match &q.value.burst {
                Some(b) => quota.with_burst(b.value),
                None => Ok(quota),
            });
        match built {
            Ok(quota) => Some(quota),
            Err(e) => {
                let at = match (&q.value.burst, q.value.limit.value) {
                    (_, 0) => pos(&q.value.limit.referenced),
                    (Some(b), _) => pos(&b.referenced),
                    (None, _) => pos(&q.referenced),
                };
                self.push(at, field, e.to_string());
                None
            }
        }
    }

    fn at_least_one<T: Copy + PartialEq + Default>(
        &mut self,
        v: &Spanned<T>,
        field: &str,
    ) -> Option<T> {
        if v.value == T::default() {
            self.push(pos(&v.referenced), field, "must be at least 1");
            return None;
        }
        Some(v.value)
    }
}

/// Validates the `websocket` section; pushes its errors and returns `None` when it has any.
pub(super) fn convert_websocket(
    file: &Path,
    w: WebSocketYaml,
    at_section: (u64, u64),
    errors: &mut Vec<ConfigError>,
    references: &mut Vec<Reference>,
) -> Option<WebSocketConfig> {
    let before = errors.len();
    let mut e = Errors { file, errors };

    let listen = w
        .listen
        .as_ref()
        .and_then(|l| match l.value.parse::<SocketAddr>() {
            Ok(addr) => Some(addr),
            Err(_) => {
                e.push(
                    pos(&l.referenced),
                    "listen",
                    format!(
                        "`{}` is not an address; write e.g. `127.0.0.1:8001`",
                        l.value
                    ),
                );
                None
            }
        });
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
                e.push(
                    pos(&u.referenced),
                    "upstream",
                    format!("`{}`: {why}", u.value),
                );
                None
            }
        },
    };
    let mut trusted = Vec::new();
    for net in w.trusted_proxies.iter().flatten() {
        let text = net.value.trim();
        match (text.parse::<IpNet>(), text.parse::<IpAddr>()) {
            (Ok(net), _) => trusted.push(net),
            (_, Ok(ip)) => trusted.push(IpNet::from(ip)),
            _ => e.push(
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
    if let Some(prefix) = &w.ipv6_prefix {
        match u8::try_from(prefix.value) {
            Ok(bits) if bits <= 128 => peer = peer.ipv6_prefix(bits),
            _ => e.push(
                pos(&prefix.referenced),
                "ipv6_prefix",
                "must be between 0 and 128",
            ),
        }
    }
    let jwt = w.jwt.as_ref().and_then(|j| {
        convert_jwt(file, j, references, &mut |at, field, message| {
            e.push(at, field, message);
        })
    });
    let mut source = |s: &Option<Spanned<SourceYaml>>, field: &str, allowed: &[&str]| {
        let s = s.as_ref()?;
        let kind = s.value.source.value.as_str();
        let at = pos(&s.value.source.referenced);
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
                    pos(&n.referenced),
                    &format!("{field}.name"),
                    "does not apply to `source: path`",
                );
                return None;
            }
            (_, None) => {
                e.push(
                    pos(&s.referenced),
                    &format!("{field}.name"),
                    format!("is required with `source: {kind}`"),
                );
                return None;
            }
            (_, Some(n)) if n.value.trim().is_empty() => {
                e.push(
                    pos(&n.referenced),
                    &format!("{field}.name"),
                    "must not be empty",
                );
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
                        pos(&name.referenced),
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
                    pos(&p.referenced),
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

    let limits = match &w.limits {
        Some(l) => convert_limits(&mut e, l, "limits"),
        None => Some(WsLimits::default()),
    };
    let outbound = match &w.outbound {
        Some(l) => convert_limits(&mut e, l, "outbound").map(Some),
        None => Some(None),
    };

    let mut buffer_messages = DEFAULT_BUFFER_MESSAGES;
    let mut buffer_bytes = DEFAULT_BUFFER_BYTES;
    if let Some(b) = &w.buffer {
        if let Some(m) = &b.messages {
            buffer_messages = e.at_least_one(m, "buffer.messages").unwrap_or(1);
        }
        if let Some(n) = &b.bytes {
            buffer_bytes = e.at_least_one(n, "buffer.bytes").unwrap_or(1);
        }
    }
    let slow_reader = match &w.slow_reader {
        None => Some(SlowReader::Pause),
        Some(s) => match s.value.as_str() {
            "pause" => Some(SlowReader::Pause),
            "drop" => Some(SlowReader::Drop),
            "close" => Some(SlowReader::Close),
            other => {
                e.push(
                    pos(&s.referenced),
                    "slow_reader",
                    format!("unknown policy `{other}`; expected one of pause, drop, close"),
                );
                None
            }
        },
    };
    let handshake_timeout = match &w.handshake_timeout {
        None => Some(DEFAULT_HANDSHAKE_TIMEOUT),
        Some(d) => e.duration(d, "handshake_timeout"),
    };
    let idle_timeout = match &w.idle_timeout {
        None => Some(DEFAULT_IDLE_TIMEOUT),
        Some(d) => e.duration(d, "idle_timeout"),
    };

    if e.errors.len() > before {
        return None;
    }
    Some(WebSocketConfig {
        listen,
        upstream: upstream?,
        client_ip: ClientIp::new(trusted).peer_ip(peer),
        user,
        role,
        room,
        classifier,
        limits: limits?,
        outbound: outbound?,
        buffer_messages,
        buffer_bytes,
        slow_reader: slow_reader?,
        handshake_timeout: handshake_timeout?,
        idle_timeout: idle_timeout?,
    })
}

/// Validates one `limits` block, and builds it once so that what the library refuses is
/// reported at the block.
fn convert_limits(e: &mut Errors<'_>, l: &Spanned<LimitsYaml>, field: &str) -> Option<WsLimits> {
    let before = e.errors.len();
    let y = &l.value;
    let f = |name: &str| format!("{field}.{name}");
    let mut limits = WsLimits::default();
    let quota = |e: &mut Errors<'_>, q: &Option<Spanned<QuotaYaml>>, name: &str| {
        q.as_ref().and_then(|q| e.quota(q, &f(name)))
    };
    limits.connections_per_ip = quota(e, &y.connections_per_ip, "connections_per_ip");
    limits.messages = quota(e, &y.messages, "messages");
    limits.bytes = quota(e, &y.bytes, "bytes");
    limits.user_messages = quota(e, &y.user_messages, "user_messages");
    limits.room_messages = quota(e, &y.room_messages, "room_messages");
    limits.errors = quota(e, &y.errors, "errors");
    for (map, out, name) in [
        (
            &y.messages_for_role,
            &mut limits.messages_for_role,
            "messages_for_role",
        ),
        (
            &y.user_messages_for_role,
            &mut limits.user_messages_for_role,
            "user_messages_for_role",
        ),
    ] {
        for (role, q) in map.iter().flatten() {
            if let Some(q) = e.quota(q, &format!("{}.{role}", f(name))) {
                out.insert(role.clone(), q);
            }
        }
    }
    limits.concurrent_per_ip = y
        .concurrent_per_ip
        .as_ref()
        .and_then(|v| e.at_least_one(v, &f("concurrent_per_ip")));
    limits.concurrent_per_user = y
        .concurrent_per_user
        .as_ref()
        .and_then(|v| e.at_least_one(v, &f("concurrent_per_user")));
    limits.max_connections = y.max_connections.as_ref().and_then(|v| {
        if v.value == 0 {
            e.push(
                pos(&v.referenced),
                &f("max_connections"),
                "must be at least 1",
            );
            return None;
        }
        Some(v.value)
    });
    limits.slowmode = y
        .slowmode
        .as_ref()
        .and_then(|d| e.duration(d, &f("slowmode")));
    limits.slowmode_exempt = y.slowmode_exempt.clone().unwrap_or_default();
    limits.max_message_size = y.max_message_size.as_ref().and_then(|v| {
        if v.value == 0 {
            e.push(
                pos(&v.referenced),
                &f("max_message_size"),
                "must be at least 1",
            );
            return None;
        }
        Some(v.value)
    });
    limits.costs = y.costs.clone().unwrap_or_default();
    limits.default_cost = y.default_cost;
    limits.release = y.release.clone().unwrap_or_default();
    limits.close_after = y.close_after.as_ref().and_then(|c| {
        let within = e.duration(&c.value.within, &f("close_after.within"))?;
        let violations = e.at_least_one(&c.value.violations, &f("close_after.violations"))?;
        Some(CloseAfter { violations, within })
    });
    limits.close_at_multiple = y
        .close_at_multiple
        .as_ref()
        .and_then(|v| e.at_least_one(v, &f("close_at_multiple")));
    limits.close_code = y.close_code.as_ref().and_then(|c| {
        if is_valid_close_code(c.value) {
            Some(c.value)
        } else {
            e.push(
                pos(&c.referenced),
                &f("close_code"),
                format!(
                    "{} cannot be sent in a close frame: use 1008, 1000-1003, 1007-1014 or 3000-4999 (e.g. 4008)",
                    c.value
                ),
            );
            None
        }
    });
    limits.close_reason = y.close_reason.as_ref().and_then(|r| {
        if r.value.len() > flowgate::ws::MAX_CLOSE_REASON {
            e.push(
                pos(&r.referenced),
                &f("close_reason"),
                format!(
                    "is {} bytes; a close frame carries at most {}",
                    r.value.len(),
                    flowgate::ws::MAX_CLOSE_REASON
                ),
            );
            return None;
        }
        Some(r.value.clone())
    });
    limits.error_frame =
        y.error_frame
            .as_ref()
            .and_then(|t| match flowgate::ws::ErrorFrame::template(&t.value) {
                Ok(_) => Some(t.value.clone()),
                Err(err) => {
                    e.push(pos(&t.referenced), &f("error_frame"), err.to_string());
                    None
                }
            });
    limits.penalty_box = y.penalty_box.as_ref().and_then(|p| {
        let mut config = PenaltyConfig::default();
        let y = &p.value;
        if let Some(n) = &y.after_closes {
            config.after_closes = e.at_least_one(n, &f("penalty_box.after_closes"))?;
        }
        for (d, out, name) in [
            (&y.first, &mut config.first, "first"),
            (&y.max, &mut config.max, "max"),
            (&y.forget_after, &mut config.forget_after, "forget_after"),
        ] {
            if let Some(d) = d {
                *out = e.duration(d, &f(&format!("penalty_box.{name}")))?;
            }
        }
        if y.forget_after.is_none() {
            config.forget_after = config.max;
        }
        if let Some(n) = &y.max_entries {
            if n.value == 0 {
                e.push(
                    pos(&n.referenced),
                    &f("penalty_box.max_entries"),
                    "must be at least 1",
                );
                return None;
            }
            config.max_entries = n.value;
        }
        Some(config)
    });
    for name in y.dry_run.iter().flatten() {
        match Scope::ALL.iter().find(|s| s.name() == name.value) {
            Some(scope) => limits.dry_run.push(*scope),
            None => e.push(
                pos(&name.referenced),
                &f("dry_run"),
                format!(
                    "unknown layer `{}`; expected one of {}",
                    name.value,
                    Scope::ALL.map(|s| s.name()).join(", ")
                ),
            ),
        }
    }
    limits.key_prefix = y.key_prefix.clone();
    if field == "outbound" {
        let upgrade_layers = [
            (
                "connections_per_ip",
                y.connections_per_ip.as_ref().map(|v| pos(&v.referenced)),
            ),
            (
                "concurrent_per_ip",
                y.concurrent_per_ip.as_ref().map(|v| pos(&v.referenced)),
            ),
            (
                "concurrent_per_user",
                y.concurrent_per_user.as_ref().map(|v| pos(&v.referenced)),
            ),
            (
                "max_connections",
                y.max_connections.as_ref().map(|v| pos(&v.referenced)),
            ),
            (
                "penalty_box",
                y.penalty_box.as_ref().map(|v| pos(&v.referenced)),
            ),
        ];
        for (name, at) in upgrade_layers {
            if let Some(at) = at {
                e.push(
                    at,
                    &f(name),
                    "limits the upgrade, which `outbound` does not see; set it under `limits`",
                );
            }
        }
    }
    if e.errors.len() > before {
        return None;
    }
    match limits.build() {
        Ok(_) => Some(limits),
        Err(err) => {
            e.push(pos(&l.referenced), field, err.to_string());
            None
        }
    }
}
