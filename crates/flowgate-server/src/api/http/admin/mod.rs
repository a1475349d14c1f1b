//! Admin endpoints: `GET /v1/keys/{domain}/{key}={value}/…` shows one counter,
//! `DELETE` on the same path resets it, and `GET /v1/keys/{domain}?prefix=…` lists the
//! domain's counters with their usage, a page at a time ([`usage`]). A rule with several limits (`rate_limits`) has one
//! counter per limit: the first is shown at the top level, as for any rule, and every one in
//! `limits`; `DELETE` resets them all.
//!
//! The path names a request descriptor as Envoy would send it: the domain, then one
//! `key=value` segment per entry, each part percent-encoded (`/` in a value is `%2F`). The
//! counter is the one [`flowgate::envoy::check`] counts that descriptor in, under the
//! running configuration's matching rule.
//!
//! Every call needs `Authorization: Bearer <token>` with the token of `FLOWGATE_ADMIN_TOKEN`
//! ([`AdminToken`]), compared in constant time. Without the variable the endpoints are disabled
//! (404), never open; no token is 401 (with `WWW-Authenticate: Bearer`), a wrong one 403. Every
//! refusal is an RFC 9457 problem, and is logged at WARN with the client's address (within a
//! budget of lines, see [`token`]).

mod token;
pub(crate) mod usage;

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use flowgate::envoy::{self, CounterState, Entry, Lookup, Rate};
use percent_encoding::{AsciiSet, CONTROLS, percent_decode_str, utf8_percent_encode};
use serde::Serialize;
use utoipa::ToSchema;

pub(crate) use token::Presented;
pub use token::{AdminToken, AdminTokenError, MIN_ADMIN_TOKEN_BYTES, REFUSALS_LOGGED_PER_MINUTE};

use super::super::Service;
use super::super::problem::Problem;
use super::check::millis;
use super::{Peer, json_response, peer_address};

/// Where the admin paths start.
pub(crate) const PREFIX: &str = "/v1/keys/";

/// What is percent-encoded in a path part: what a path segment cannot hold as is, and the
/// separators `/` and `=`.
const PART: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'/')
    .add(b'=')
    .add(b'?')
    .add(b'<')
    .add(b'>')
    .add(b'`')
    .add(b'{')
    .add(b'}')
    .add(b'|')
    .add(b'\\')
    .add(b'^')
    .add(b'[')
    .add(b']');

/// Appends the admin path of `entries` in `domain` (without [`PREFIX`]):
/// `domain/key=value/...`, each part percent-encoded.
pub(crate) fn write_path(out: &mut String, domain: &str, entries: &[Entry]) {
    // The encoder yields the text in pieces (runs kept as they are, escapes), appended as they
    // come: every denial writes one of these, and `write!` would cost twice as much.
    out.extend(utf8_percent_encode(domain, PART));
    for entry in entries {
        out.push('/');
        out.extend(utf8_percent_encode(&entry.key, PART));
        out.push('=');
        out.extend(utf8_percent_encode(&entry.value, PART));
    }
}

/// The domain and entries an admin path names, or the 400 for it.
fn parse_path(path: &str) -> Result<(String, Vec<Entry>), Problem> {
    let bad = |detail: String| {
        Problem::bad_request(format!(
            "{detail}; expected {PREFIX}{{domain}}/{{key}}={{value}}/... (percent-encoded)"
        ))
    };
    let decode = |part: &str| {
        percent_decode_str(part)
            .decode_utf8()
            .map(|s| s.into_owned())
            .map_err(|_| bad(format!("`{part}` is not percent-encoded UTF-8")))
    };
    let rest = path.strip_prefix(PREFIX).unwrap_or(path);
    let mut segments = rest.split('/');
    let domain = decode(segments.next().unwrap_or_default())?;
    if domain.is_empty() {
        return Err(bad("no domain".into()));
    }
    let mut entries = Vec::new();
    for segment in segments {
        let Some((key, value)) = segment.split_once('=') else {
            return Err(bad(format!("segment `{segment}` is not key=value")));
        };
        let key = decode(key)?;
        if key.is_empty() {
            return Err(bad(format!("segment `{segment}` has an empty key")));
        }
        entries.push(Entry::new(key, decode(value)?));
    }
    if entries.is_empty() {
        return Err(bad("no descriptor entry".into()));
    }
    Ok((domain, entries))
}

/// One descriptor entry of [`KeyView`].
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct EntryView {
    /// The entry's key.
    key: String,
    /// The entry's value.
    value: String,
}

/// A counter, as the admin endpoints show it.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct KeyView {
    /// The domain.
    domain: String,
    /// The descriptor's entries, decoded from the path.
    descriptor: Vec<EntryView>,
    /// The matching rule's path in its tree (`key_value.key2`).
    rule: String,
    /// Whether the rule keeps a counter (`false` for `unlimited` and blocked rules: the other
    /// fields are then absent).
    counted: bool,
    /// The (first) limit's counter.
    #[serde(flatten)]
    counter: CounterView,
    /// Every limit's counter, when the rule has several (`rate_limits`); absent otherwise.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    limits: Vec<CounterView>,
}

/// One limit's counter in a [`KeyView`].
#[derive(Debug, Clone, Default, Serialize, ToSchema)]
pub(crate) struct CounterView {
    /// The limit's name, if it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    /// The counter's key in the store.
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<String>,
    /// The rule's algorithm.
    #[serde(skip_serializing_if = "Option::is_none")]
    algorithm: Option<&'static str>,
    /// Requests per period.
    #[serde(skip_serializing_if = "Option::is_none")]
    limit: Option<u64>,
    /// The capacity `remaining` counts down from.
    #[serde(skip_serializing_if = "Option::is_none")]
    burst: Option<u64>,
    /// Units a request could take now.
    #[serde(skip_serializing_if = "Option::is_none")]
    remaining: Option<u64>,
    /// Until the counter is full again, in milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    reset_after_ms: Option<u64>,
    /// Set when the store could not be asked and the rule's fail mode answered
    /// (`open`, `closed`, `local`).
    #[serde(skip_serializing_if = "Option::is_none")]
    fallback: Option<&'static str>,
}

/// `GET /v1/keys/{domain}/{descriptor}`: one counter, peeked (nothing is taken).
#[utoipa::path(
    get,
    path = "/v1/keys/{domain}/{descriptor}",
    tag = "admin",
    params(
        ("domain" = String, Path, description = "The domain (percent-encoded)"),
        ("descriptor" = String, Path, description = "One `key=value` segment per entry, separated by `/`, each part percent-encoded"),
    ),
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "The counter", body = KeyView),
        (status = 400, description = "The path names no descriptor", body = super::super::openapi::ProblemBody, content_type = "application/problem+json"),
        (status = 401, description = "No bearer token", body = super::super::openapi::ProblemBody, content_type = "application/problem+json"),
        (status = 403, description = "A wrong token", body = super::super::openapi::ProblemBody, content_type = "application/problem+json"),
        (status = 404, description = "Admin endpoints disabled (no FLOWGATE_ADMIN_TOKEN), or no rule matches", body = super::super::openapi::ProblemBody, content_type = "application/problem+json"),
        (status = 503, description = "The store could not be asked", body = super::super::openapi::ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn inspect(
    State(service): State<Arc<Service>>,
    peer: Peer,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    // A domain alone (`/v1/keys/{domain}`): the listing of its counters.
    if uri
        .path()
        .strip_prefix(PREFIX)
        .is_some_and(|rest| !rest.contains('/'))
    {
        return usage::list(State(service), peer, method, uri, headers).await;
    }
    keys(&service, peer, method, &uri, &headers).await
}

/// `DELETE /v1/keys/{domain}/{descriptor}`: resets one counter; answers with its state after.
#[utoipa::path(
    delete,
    path = "/v1/keys/{domain}/{descriptor}",
    tag = "admin",
    params(
        ("domain" = String, Path, description = "The domain (percent-encoded)"),
        ("descriptor" = String, Path, description = "One `key=value` segment per entry, separated by `/`, each part percent-encoded"),
    ),
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "The counter after the reset", body = KeyView),
        (status = 400, description = "The path names no descriptor", body = super::super::openapi::ProblemBody, content_type = "application/problem+json"),
        (status = 401, description = "No bearer token", body = super::super::openapi::ProblemBody, content_type = "application/problem+json"),
        (status = 403, description = "A wrong token", body = super::super::openapi::ProblemBody, content_type = "application/problem+json"),
        (status = 404, description = "Admin endpoints disabled (no FLOWGATE_ADMIN_TOKEN), or no rule matches", body = super::super::openapi::ProblemBody, content_type = "application/problem+json"),
        (status = 503, description = "The store could not be asked", body = super::super::openapi::ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn reset(
    State(service): State<Arc<Service>>,
    peer: Peer,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    keys(&service, peer, method, &uri, &headers).await
}

/// Both verbs: the token, the path, then the store.
async fn keys(
    service: &Service,
    peer: Peer,
    method: Method,
    uri: &Uri,
    headers: &HeaderMap,
) -> Response {
    if let Some(refusal) = refusal(service, headers, &method, peer_address(&peer)) {
        return refusal;
    }
    let (domain, entries) = match parse_path(uri.path()) {
        Ok(parsed) => parsed,
        Err(problem) => return problem.into_response(),
    };
    let active = service.active();
    let rules = &active.policy.rules;
    let store = service.backend().store();
    let looked = if method == Method::DELETE {
        tracing::info!(%domain, entries = entries.len(), "admin: counter reset");
        envoy::reset(rules, store, &domain, &entries).await
    } else {
        envoy::inspect(rules, store, &domain, &entries).await
    };
    let descriptor = entries
        .iter()
        .map(|e| EntryView {
            key: e.key.clone(),
            value: e.value.clone(),
        })
        .collect();
    let (rule, counters) = match looked {
        Err(e) => {
            return Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "https://flowgate.dev/problems/store-unavailable",
                "Store unavailable",
                format!("the store could not be asked: {e}"),
            )
            .into_response();
        }
        Ok(Lookup::NoRule) => {
            return Problem::new(
                StatusCode::NOT_FOUND,
                "https://flowgate.dev/problems/no-rule",
                "No matching rule",
                format!("no rule of domain `{domain}` matches this descriptor"),
            )
            .into_response();
        }
        Ok(Lookup::NotCounted(rule)) => (rule, Vec::new()),
        Ok(Lookup::Counters(counters)) => (counters[0].rule, counters),
    };
    let mut limits: Vec<CounterView> = counters.into_iter().map(counter_view).collect();
    let counter = match limits.first() {
        Some(_) if rule.limit_count == 1 => limits.remove(0),
        Some(first) => first.clone(),
        None => CounterView {
            name: rule.name.clone(),
            ..CounterView::default()
        },
    };
    let view = KeyView {
        domain,
        descriptor,
        rule: rule.path.clone(),
        counted: counter.key.is_some(),
        counter,
        limits,
    };
    let mut response = json_response(StatusCode::OK, &view);
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// What the admin endpoints show of one counter.
fn counter_view(counter: CounterState<'_>) -> CounterView {
    let decision = &counter.decision;
    CounterView {
        name: counter.rule.name.clone(),
        algorithm: match counter.rule.rate {
            Rate::Limited(quota) => Some(quota.algorithm().name()),
            _ => None,
        },
        limit: Some(decision.limit),
        burst: Some(decision.burst),
        remaining: Some(decision.remaining),
        reset_after_ms: Some(millis(decision.reset_after)),
        fallback: decision.fallback.map(|m| m.name()),
        key: Some(counter.key),
    }
}

/// The refusal of a request that does not carry the admin token (logged, with the address of
/// `client`); `None` when it does.
pub(super) fn refusal(
    service: &Service,
    headers: &HeaderMap,
    method: &Method,
    client: Option<std::net::SocketAddr>,
) -> Option<Response> {
    let Some(token) = service.admin_token() else {
        return Some(
            Problem::new(
                StatusCode::NOT_FOUND,
                "https://flowgate.dev/problems/admin-disabled",
                "Admin endpoints disabled",
                "the admin endpoints are disabled: start the server with FLOWGATE_ADMIN_TOKEN set",
            )
            .into_response(),
        );
    };
    // Never the descriptor: its values may be client addresses or API keys.
    let what = format!("{method} {PREFIX}…");
    match token.presented(headers) {
        Presented::Token => None,
        Presented::Nothing => {
            token.refused(client, &what, "no bearer token");
            let mut response = Problem::new(
                StatusCode::UNAUTHORIZED,
                "https://flowgate.dev/problems/unauthorized",
                "Unauthorized",
                "the admin endpoints need `Authorization: Bearer <FLOWGATE_ADMIN_TOKEN>`",
            )
            .into_response();
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"flowgate-admin\""),
            );
            Some(response)
        }
        Presented::Wrong => {
            token.refused(client, &what, "wrong bearer token");
            Some(
                Problem::new(
                    StatusCode::FORBIDDEN,
                    "https://flowgate.dev/problems/forbidden",
                    "Forbidden",
                    "the bearer token is not the admin token",
                )
                .into_response(),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_round_trip_through_percent_encoding() {
        let entries = [
            Entry::new("remote_address", "10.0.0.1"),
            Entry::new("path", "/api/a=b c%"),
        ];
        let mut path = String::from(PREFIX);
        write_path(&mut path, "edge/x", &entries);
        assert_eq!(
            path,
            "/v1/keys/edge%2Fx/remote_address=10.0.0.1/path=%2Fapi%2Fa%3Db%20c%25"
        );
        let (domain, parsed) = parse_path(&path).unwrap();
        assert_eq!(
            (domain.as_str(), parsed.as_slice()),
            ("edge/x", &entries[..])
        );
    }

    #[test]
    fn malformed_paths_are_refused() {
        for path in [
            "/v1/keys/",
            "/v1/keys/edge",
            "/v1/keys/edge/",
            "/v1/keys/edge/novalue",
            "/v1/keys/edge/=x",
            "/v1/keys/edge/k=%FF",
        ] {
            assert!(parse_path(path).is_err(), "{path}");
        }
        // An empty value is a value.
        assert_eq!(
            parse_path("/v1/keys/d/k=").unwrap().1,
            [Entry::new("k", "")]
        );
    }
}
