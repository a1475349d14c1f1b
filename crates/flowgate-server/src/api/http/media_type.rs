//! The decision endpoints take JSON only ([`JsonBody`]): a `POST` to `/json` or `/v1/check` whose
//! `Content-Type` is not `application/json` (parameters such as `charset` allowed; the type in
//! any case) — or that has none — is answered `415` with a problem body, before its body is
//! read.
//!
//! This is a guard against cross-site request forgery: a web page can make a browser `POST`
//! `text/plain`, `application/x-www-form-urlencoded` or `multipart/form-data` to any address
//! without asking (no CORS preflight), so without it any page an operator opens could spend a
//! key's quota through a service on their network. A `Content-Type: application/json` request
//! needs a preflight, which this API never grants (it sends no CORS headers).

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::api::problem::Problem;

/// An extractor that lets a request through only if it declares a JSON body; otherwise the
/// handler answers `415` (see the [module docs](self)). First among a handler's extractors, it
/// refuses before the body is read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct JsonBody;

impl<S: Send + Sync> FromRequestParts<S> for JsonBody {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Response> {
        if is_json(&parts.headers) {
            Ok(JsonBody)
        } else {
            Err(refusal(&parts.headers))
        }
    }
}

/// Whether `headers` declare a JSON body: `application/json`, with or without parameters.
fn is_json(headers: &HeaderMap) -> bool {
    headers.get(header::CONTENT_TYPE).is_some_and(|v| {
        let v = v.as_bytes();
        let essence = v.iter().position(|&b| b == b';').map_or(v, |end| &v[..end]);
        essence
            .trim_ascii()
            .eq_ignore_ascii_case(b"application/json")
    })
}

/// The 415 for a request that declared `headers`' content type (or none).
fn refusal(headers: &HeaderMap) -> Response {
    let got = match headers.get(header::CONTENT_TYPE) {
        None => "none".to_owned(),
        // Bounded: the header is part of a head of bounded size; shown as far as it is text.
        Some(v) => format!("`{}`", v.to_str().unwrap_or("(not text)")),
    };
    Problem::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "https://flowgate.dev/problems/unsupported-media-type",
        "Unsupported media type",
        format!(
            "the body must be sent with `Content-Type: application/json` (got {got}); other types are refused so that a web page cannot send this request from another origin"
        ),
    )
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(value: Option<&str>) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(value) = value {
            headers.insert(
                header::CONTENT_TYPE,
                value.parse().unwrap_or_else(|e| panic!("{e}")),
            );
        }
        headers
    }

    #[test]
    fn only_application_json_is_json() {
        for json in [
            "application/json",
            "Application/JSON",
            "application/json; charset=utf-8",
            " application/json ;charset=UTF-8",
        ] {
            assert!(is_json(&with(Some(json))), "{json}");
        }
        for other in [
            None,
            Some("text/plain"),
            Some("text/plain; a=application/json"),
            Some("application/x-www-form-urlencoded"),
            Some("multipart/form-data; boundary=x"),
            Some("application/jsonp"),
            Some("application/problem+json"),
            Some(""),
        ] {
            assert!(!is_json(&with(other)), "{other:?}");
        }
    }
}
