//! `GET /v1/keys/{domain}?prefix=…&cursor=…&limit=…`: the domain's counters with their usage,
//! a page at a time — what `flowgate export` turns into CSV or JSON lines for billing.
//!
//! The store lists counter names ([`ListKeys`]: the memory store's names directory, Redis's
//! `SCAN` on every master); each name reads back into its descriptor and quota
//! ([`decode_counter_key`]), and the counter is peeked in the store with that quota — the
//! same [`Store::peek`] the single-counter endpoint uses, so a listed counter shows what
//! `GET /v1/keys/{domain}/{descriptor}` shows. Every limit of a rule with several limits, a
//! calendar quota and a charged limit keep their own counter, each listed on its own line.
//!
//! `prefix` selects counters by their first descriptor entries, written as the admin path
//! writes them (`key=value/key2=val`, each part percent-encoded), the last value possibly cut
//! short: `api_key=cust` lists `api_key=customer-1` and `api_key=cust-9`. `limit` is the page
//! size (default [`DEFAULT_PAGE`], at most [`MAX_PAGE`]); `cursor` is the previous page's
//! `next_cursor`. Work per call is bounded by the page size (see [`ListKeys`]).

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use flowgate::envoy::decode_counter_key;
use flowgate::store::key::KeyWriter;
use flowgate::store::list::{DEFAULT_PAGE, ListError, MAX_PAGE};
use flowgate::store::{Ask, Store};
use percent_encoding::percent_decode_str;
use serde::Serialize;
use std::sync::Arc;
use utoipa::ToSchema;

use super::super::super::Service;
use super::super::super::problem::Problem;
use super::super::check::millis;
use super::super::{Peer, json_response, peer_address};
use super::{EntryView, PREFIX, refusal, write_path};

/// One page of a domain's counters.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct UsagePage {
    /// The domain.
    domain: String,
    /// The counters of this page (in no particular order across pages on Redis; by counter
    /// key on the memory store).
    counters: Vec<UsageView>,
    /// The cursor of the next page (pass it as `cursor`); absent on the last page. A page may
    /// hold fewer counters than `limit`, even none, and still have a next one.
    #[serde(skip_serializing_if = "Option::is_none")]
    next_cursor: Option<String>,
    /// `false` when the store may not name every counter it holds (the memory store's names
    /// directory was full and had to leave names out).
    complete: bool,
}

/// One counter and its usage.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct UsageView {
    /// The descriptor's entries, decoded from the counter key (a level with
    /// `share_threshold` shows its wildcard pattern, which every matching value counts under).
    descriptor: Vec<EntryView>,
    /// The descriptor as the single-counter admin path writes it (`key=value/…`,
    /// percent-encoded): `GET /v1/keys/{domain}/{path}` shows this counter.
    path: String,
    /// The counter's key in the store.
    key: String,
    /// The quota's algorithm; absent when this build cannot read the quota back (the other
    /// usage fields are then absent too).
    #[serde(skip_serializing_if = "Option::is_none")]
    algorithm: Option<&'static str>,
    /// Units per period.
    #[serde(skip_serializing_if = "Option::is_none")]
    limit: Option<u64>,
    /// The capacity `remaining` counts down from.
    #[serde(skip_serializing_if = "Option::is_none")]
    burst: Option<u64>,
    /// The period in milliseconds (for a calendar quota, the calendar unit's nominal length).
    #[serde(skip_serializing_if = "Option::is_none")]
    period_ms: Option<u64>,
    /// A calendar quota's calendar (`month@Europe/Berlin`).
    #[serde(skip_serializing_if = "Option::is_none")]
    calendar: Option<String>,
    /// Units taken: `burst - remaining` (a charged counter in debt shows `burst`; its
    /// `reset_after_ms` covers the debt).
    #[serde(skip_serializing_if = "Option::is_none")]
    used: Option<u64>,
    /// Units a request could take now.
    #[serde(skip_serializing_if = "Option::is_none")]
    remaining: Option<u64>,
    /// Until the counter is full again, in milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    reset_after_ms: Option<u64>,
    /// Set when the store could not be asked and the fail mode answered.
    #[serde(skip_serializing_if = "Option::is_none")]
    fallback: Option<&'static str>,
}

/// What the query string asks for.
#[derive(Debug, Default)]
struct Query {
    prefix: Option<String>,
    cursor: Option<String>,
    limit: Option<usize>,
}

/// The query string's parameters (`application/x-www-form-urlencoded`), or the 400.
fn parse_query(query: Option<&str>) -> Result<Query, Problem> {
    let mut parsed = Query::default();
    for pair in query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = percent_decode_str(&value.replace('+', " "))
            .decode_utf8()
            .map(|v| v.into_owned())
            .map_err(|_| Problem::bad_request(format!("`{name}` is not percent-encoded UTF-8")))?;
        match name {
            "prefix" => parsed.prefix = Some(value),
            "cursor" => parsed.cursor = Some(value),
            "limit" => {
                let limit: usize = value.parse().ok().filter(|&l| l > 0).ok_or_else(|| {
                    Problem::bad_request(format!(
                        "`limit` must be a whole number from 1 to {MAX_PAGE}"
                    ))
                })?;
                parsed.limit = Some(limit.min(MAX_PAGE));
            }
            _ => {
                return Err(Problem::bad_request(format!(
                    "unknown parameter `{name}`; expected prefix, cursor or limit"
                )));
            }
        }
    }
    Ok(parsed)
}

/// The store prefix of the counters of `domain` whose descriptor starts as `prefix` says
/// (`key=value/…`, percent-encoded parts; the last value may be cut short), or the 400.
fn store_prefix(domain: &str, prefix: &str) -> Result<String, Problem> {
    let decode = |part: &str| {
        percent_decode_str(part)
            .decode_utf8()
            .map(|s| s.into_owned())
            .map_err(|_| Problem::bad_request(format!("`{part}` is not percent-encoded UTF-8")))
    };
    let mut fields = Vec::new();
    for segment in prefix.split('/').filter(|s| !s.is_empty()) {
        let Some((name, value)) = segment.split_once('=') else {
            return Err(Problem::bad_request(format!(
                "prefix segment `{segment}` is not key=value; expected key=value/key2=val… (the last value may be cut short)"
            )));
        };
        fields.push((decode(name)?, decode(value)?));
    }
    let mut key = String::new();
    let mut writer = KeyWriter::domain(&mut key, domain);
    for (name, value) in &fields {
        writer = writer.field(name, value);
    }
    if fields.is_empty() {
        key.push('|');
    }
    Ok(key)
}

/// `GET /v1/keys/{domain}`: the domain's counters with their usage, a page at a time.
#[utoipa::path(
    get,
    path = "/v1/keys/{domain}",
    tag = "admin",
    params(
        ("domain" = String, Path, description = "The domain (percent-encoded)"),
        ("prefix" = Option<String>, Query, description = "Only counters whose descriptor starts with these entries: `key=value/key2=val…`, each part percent-encoded, the last value possibly cut short"),
        ("cursor" = Option<String>, Query, description = "The previous page's `next_cursor`"),
        ("limit" = Option<u32>, Query, description = "Counters per page: default 100, at most 1000 (larger values are taken as 1000)", minimum = 1),
    ),
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "A page of counters", body = UsagePage),
        (status = 400, description = "A malformed domain, prefix, cursor or limit", body = super::super::super::openapi::ProblemBody, content_type = "application/problem+json"),
        (status = 401, description = "No bearer token", body = super::super::super::openapi::ProblemBody, content_type = "application/problem+json"),
        (status = 403, description = "A wrong token", body = super::super::super::openapi::ProblemBody, content_type = "application/problem+json"),
        (status = 404, description = "Admin endpoints disabled (no FLOWGATE_ADMIN_TOKEN)", body = super::super::super::openapi::ProblemBody, content_type = "application/problem+json"),
        (status = 501, description = "The store cannot list its counters", body = super::super::super::openapi::ProblemBody, content_type = "application/problem+json"),
        (status = 503, description = "The store could not be asked", body = super::super::super::openapi::ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn list(
    State(service): State<Arc<Service>>,
    peer: Peer,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    if let Some(refusal) = refusal(&service, &headers, &method, peer_address(&peer)) {
        return refusal;
    }
    match page(&service, &uri).await {
        Ok(page) => {
            let mut response = json_response(StatusCode::OK, &page);
            response
                .headers_mut()
                .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            response
        }
        Err(problem) => problem.into_response(),
    }
}

/// The page `uri` asks for.
async fn page(service: &Service, uri: &Uri) -> Result<UsagePage, Problem> {
    let raw = uri.path().strip_prefix(PREFIX).unwrap_or_default();
    let domain = percent_decode_str(raw)
        .decode_utf8()
        .map(|s| s.into_owned())
        .ok()
        .filter(|d| !d.is_empty() && !raw.contains('/'))
        .ok_or_else(|| {
            Problem::bad_request(format!(
                "`{raw}` is not a domain; expected {PREFIX}{{domain}} (percent-encoded)"
            ))
        })?;
    let query = parse_query(uri.query())?;
    let prefix = store_prefix(&domain, query.prefix.as_deref().unwrap_or_default())?;
    let backend = service.backend();
    let unsupported = |detail: String| {
        Problem::new(
            StatusCode::NOT_IMPLEMENTED,
            "https://flowgate.dev/problems/listing-unsupported",
            "Listing unsupported",
            detail,
        )
    };
    let Some(lister) = backend.lister() else {
        return Err(unsupported("this store cannot list its counters".into()));
    };
    let listed = lister
        .list_keys(
            &prefix,
            query.cursor.as_deref(),
            query.limit.unwrap_or(DEFAULT_PAGE),
        )
        .await
        .map_err(|e| match e {
            ListError::Cursor => Problem::bad_request(
                "the cursor is not one this listing handed out (pass next_cursor as it came)",
            ),
            ListError::Unsupported(why) => unsupported(why.to_owned()),
            e => store_unavailable(&e.to_string()),
        })?;
    // Every listed key read back into its descriptor and quota, then peeked together.
    let decoded: Vec<_> = listed
        .keys
        .into_iter()
        .filter_map(|key| decode_counter_key(&key).map(|parsed| (key, parsed)))
        .filter(|(_, parsed)| parsed.domain == domain)
        .collect();
    let asks: Vec<Ask<'_>> = decoded
        .iter()
        .filter_map(|(key, parsed)| parsed.quota.as_ref().map(|q| Ask::new(key, q).cost(0)))
        .collect();
    let mut decisions = backend.store().check_many(&asks).await.into_iter();
    let mut counters = Vec::with_capacity(decoded.len());
    for (key, parsed) in decoded {
        let mut path = String::new();
        write_path(&mut path, "", &parsed.entries);
        let mut view = UsageView {
            descriptor: parsed
                .entries
                .iter()
                .map(|e| EntryView {
                    key: e.key.clone(),
                    value: e.value.clone(),
                })
                .collect(),
            path: path.trim_start_matches('/').to_owned(),
            key,
            algorithm: None,
            limit: None,
            burst: None,
            period_ms: None,
            calendar: None,
            used: None,
            remaining: None,
            reset_after_ms: None,
            fallback: None,
        };
        if let Some(quota) = parsed.quota {
            let decision = decisions
                .next()
                .unwrap_or_else(|| Err(flowgate::store::StoreError::Backend("no answer".into())))
                .map_err(|e| store_unavailable(&e.to_string()))?;
            view.algorithm = Some(quota.algorithm().name());
            view.limit = Some(decision.limit);
            view.burst = Some(decision.burst);
            view.calendar = quota.calendar().map(|c| c.to_string());
            view.period_ms = Some(millis(quota.period()));
            view.used = Some(decision.burst.saturating_sub(decision.remaining));
            view.remaining = Some(decision.remaining);
            view.reset_after_ms = Some(millis(decision.reset_after));
            view.fallback = decision.fallback.map(|m| m.name());
        }
        counters.push(view);
    }
    Ok(UsagePage {
        domain,
        counters,
        next_cursor: listed.next,
        complete: listed.complete,
    })
}

/// The 503 of a store that could not be asked.
fn store_unavailable(error: &str) -> Problem {
    Problem::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "https://flowgate.dev/problems/store-unavailable",
        "Store unavailable",
        format!("the store could not be asked: {error}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_become_store_prefixes() {
        assert_eq!(store_prefix("edge", "").unwrap(), "edge|");
        assert_eq!(store_prefix("a:b", "/").unwrap(), r"a\:b|");
        assert_eq!(
            store_prefix("edge", "api_key=cu%7Cst").unwrap(),
            r"edge|api_key=cu\|st"
        );
        assert_eq!(
            store_prefix("edge", "k=v/path=%2Fa").unwrap(),
            "edge|k=v|path=/a"
        );
        assert!(store_prefix("edge", "novalue").is_err());
        assert!(store_prefix("edge", "k=%FF").is_err());
    }

    #[test]
    fn queries_are_read_and_checked() {
        let q = parse_query(Some("prefix=k%3Dv&cursor=ab&limit=5000")).unwrap();
        assert_eq!(
            (q.prefix.as_deref(), q.cursor.as_deref(), q.limit),
            (Some("k=v"), Some("ab"), Some(MAX_PAGE))
        );
        assert_eq!(parse_query(None).unwrap().limit, None);
        for bad in ["limit=0", "limit=x", "limit=-1", "other=1", "prefix=%FF"] {
            assert!(parse_query(Some(bad)).is_err(), "{bad}");
        }
    }
}
