//! Error responses as RFC 9457 problem details (`application/problem+json`), and their gRPC
//! equivalent for gRPC requests.
//!
//! ```text
//! HTTP/1.1 429 Too Many Requests
//! Content-Type: application/problem+json
//! Cache-Control: no-store
//! Retry-After: 2
//!
//! {"type":"https://iana.org/assignments/http-problem-types#quota-exceeded",
//!  "title":"Too Many Requests","status":429,
//!  "detail":"quota exceeded for per-ip; retry in 2 s","violated-policies":["per-ip"]}
//! ```

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderValue};
use http::{Response, StatusCode};

/// The problem type for a request over quota, defined by draft-ietf-httpapi-ratelimit-headers
/// with the extension member `violated-policies`.
pub const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// `application/problem+json`.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// An RFC 9457 problem: what went wrong, as a response a client can parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The HTTP status.
    pub status: StatusCode,
    /// The problem type URI; `about:blank` when the status says it all.
    pub type_uri: &'static str,
    /// A short, human-readable summary of the problem type.
    pub title: String,
    /// What happened to this request.
    pub detail: String,
    /// For [`QUOTA_EXCEEDED`]: the names of the limits the request exceeded.
    pub violated_policies: Vec<String>,
}

impl Problem {
    /// 429: the request exceeds the named limits; it may be retried in `retry_after_secs`
    /// (at least 1), or never (`None`: its cost exceeds a limit's capacity).
    pub fn quota_exceeded(violated_policies: Vec<String>, retry_after_secs: Option<u64>) -> Self {
        Problem {
            status: StatusCode::TOO_MANY_REQUESTS,
            type_uri: QUOTA_EXCEEDED,
            title: "Too Many Requests".into(),
            detail: quota_exceeded_detail(&violated_policies, retry_after_secs.map(|s| s.max(1))),
            violated_policies,
        }
    }

    /// A problem that the status code describes (`about:blank`), with a detail.
    pub fn status(status: StatusCode, detail: impl Into<String>) -> Self {
        Problem {
            status,
            type_uri: "about:blank",
            title: status.canonical_reason().unwrap_or("Error").into(),
            detail: detail.into(),
            violated_policies: Vec::new(),
        }
    }

    /// The body: a JSON object with `type`, `title`, `status`, `detail` and, when set,
    /// `violated-policies` (members in that sorted order; strings escaped by `serde_json`).
    /// Written directly rather than through a `serde_json::Value`, which costs several times
    /// more: a flood of refused requests is when this runs most.
    pub fn to_json(&self) -> Bytes {
        let mut out = Vec::with_capacity(192 + self.detail.len());
        out.extend_from_slice(b"{\"detail\":");
        push_json_string(&mut out, &self.detail);
        out.extend_from_slice(b",\"status\":");
        out.extend_from_slice(itoa::Buffer::new().format(self.status.as_u16()).as_bytes());
        out.extend_from_slice(b",\"title\":");
        push_json_string(&mut out, &self.title);
        out.extend_from_slice(b",\"type\":");
        push_json_string(&mut out, self.type_uri);
        if !self.violated_policies.is_empty() {
            out.extend_from_slice(b",\"violated-policies\":[");
            for (i, name) in self.violated_policies.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                push_json_string(&mut out, name);
            }
            out.push(b']');
        }
        out.push(b'}');
        Bytes::from(out)
    }

    /// The problem as an HTTP response: its status, `Content-Type: application/problem+json`,
    /// `Cache-Control: no-store` (a 429 or 503 must not be served from a cache) and the JSON
    /// body.
    pub fn into_response(self) -> Response<Bytes> {
        let mut response = Response::new(self.to_json());
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        response
    }

    /// The problem as a gRPC "trailers-only" response: HTTP 200 with `grpc-status` and
    /// `grpc-message` in the headers and no body, which gRPC clients read as a call status
    /// (429 → `RESOURCE_EXHAUSTED`, 503 → `UNAVAILABLE`, 401 → `UNAUTHENTICATED`, …).
    pub fn into_grpc_response(self) -> Response<Bytes> {
        let code: u16 = match self.status {
            StatusCode::TOO_MANY_REQUESTS => 8,
            StatusCode::SERVICE_UNAVAILABLE => 14,
            StatusCode::UNAUTHORIZED => 16,
            StatusCode::FORBIDDEN => 7,
            s if s.is_client_error() => 3,
            _ => 13,
        };
        let mut response = Response::new(Bytes::new());
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        headers.insert("grpc-status", HeaderValue::from(code));
        let message = percent_encode_grpc(&self.detail);
        if let Ok(v) = HeaderValue::from_str(&message) {
            headers.insert("grpc-message", v);
        }
        response
    }
}

/// `quota exceeded for a, b; retry in 2 s` (what `format!` would write, at a fraction of its
/// cost: this runs on every refusal), or `…; the cost exceeds what the limit can ever grant`.
fn quota_exceeded_detail(violated_policies: &[String], retry_after_secs: Option<u64>) -> String {
    let names: usize = violated_policies.iter().map(|n| n.len() + 2).sum();
    let mut detail = String::with_capacity(48 + names);
    detail.push_str("quota exceeded for ");
    for (i, name) in violated_policies.iter().enumerate() {
        if i > 0 {
            detail.push_str(", ");
        }
        detail.push_str(name);
    }
    match retry_after_secs {
        Some(secs) => {
            detail.push_str("; retry in ");
            detail.push_str(itoa::Buffer::new().format(secs));
            detail.push_str(" s");
        }
        None => detail.push_str("; the cost exceeds what the limit can ever grant"),
    }
    detail
}

/// Appends `text` as a JSON string (quoted and escaped).
fn push_json_string(out: &mut Vec<u8>, text: &str) {
    // Every byte is looked at (no early exit), which lets the compiler compare many at once:
    // the strings are short and nearly always plain, and this runs on every refusal.
    let needs_escaping = text.bytes().fold(false, |found, b| {
        found | (b < 0x20) | (b == b'"') | (b == b'\\')
    });
    if needs_escaping {
        // Serializing a `str` into a `Vec` cannot fail.
        let _ = serde_json::to_writer(&mut *out, text);
    } else {
        // Nothing to escape (the usual case: policy names, our own messages).
        out.push(b'"');
        out.extend_from_slice(text.as_bytes());
        out.push(b'"');
    }
}

/// Percent-encodes a `grpc-message` as the gRPC HTTP/2 spec asks: bytes outside printable
/// ASCII, and `%`, become `%XX`.
fn percent_encode_grpc(message: &str) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(message.len());
    for b in message.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::any;

    #[test]
    fn quota_exceeded_is_a_parsable_problem() {
        let response = Problem::quota_exceeded(vec!["per-ip".into(), "per-key".into()], Some(0))
            .into_response();
        assert_eq!(response.status(), 429);
        assert_eq!(response.headers()[CONTENT_TYPE], PROBLEM_JSON);
        assert_eq!(response.headers()[CACHE_CONTROL], "no-store");
        let body: serde_json::Value = serde_json::from_slice(response.body()).unwrap();
        assert_eq!(body["type"], QUOTA_EXCEEDED);
        assert_eq!(body["status"], 429);
        assert_eq!(body["violated-policies"][1], "per-key");
        assert_eq!(
            body["detail"],
            "quota exceeded for per-ip, per-key; retry in 1 s"
        );
    }

    proptest::proptest! {
        /// The hand-written body is exactly what serializing a JSON object gives.
        #[test]
        fn bodies_are_the_json_objects_they_describe(
            detail in any::<String>(),
            title in "\\PC{0,20}",
            status in 400u16..600,
            policies in proptest::collection::vec("[a-z\"\\\\/-]{1,8}", 0..3),
            type_uri in proptest::sample::select(vec![
                QUOTA_EXCEEDED,
                "about:blank",
                "https://example.com/\"odd\"\\type",
            ]),
        ) {
            let problem = Problem {
                status: StatusCode::from_u16(status).unwrap(),
                type_uri,
                title: title.clone(),
                detail: detail.clone(),
                violated_policies: policies.clone(),
            };
            let mut expected = serde_json::json!({
                "type": type_uri,
                "title": title,
                "status": status,
                "detail": detail,
            });
            if !policies.is_empty() {
                expected["violated-policies"] = serde_json::json!(policies);
            }
            proptest::prop_assert_eq!(problem.to_json(), Bytes::from(expected.to_string()));
        }
    }

    #[test]
    fn grpc_responses_carry_the_status_in_headers() {
        let response = Problem::status(StatusCode::SERVICE_UNAVAILABLE, "store down 100%")
            .into_grpc_response();
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["grpc-status"], "14");
        assert_eq!(response.headers()["grpc-message"], "store down 100%25");
    }
}
