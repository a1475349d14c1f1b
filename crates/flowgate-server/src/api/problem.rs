//! RFC 9457 problem details (`application/problem+json`) for errors of the HTTP API.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// A problem detail: what went wrong, as a machine-readable JSON body.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Problem {
    /// A URI naming the kind of problem.
    #[serde(rename = "type")]
    kind: &'static str,
    /// A short summary of the kind.
    title: &'static str,
    /// The HTTP status.
    status: u16,
    /// What happened this time.
    detail: String,
}

impl Problem {
    /// 400: the body could not be parsed or is not a valid request.
    pub(crate) fn bad_request(detail: impl Into<String>) -> Self {
        Problem {
            kind: "https://flowgate.dev/problems/bad-request",
            title: "Malformed request",
            status: 400,
            detail: detail.into(),
        }
    }

    /// 503: the store could not be asked.
    pub(crate) fn unavailable(detail: impl Into<String>) -> Self {
        Problem {
            kind: "https://flowgate.dev/problems/store-unavailable",
            title: "The rate-limit store is unavailable",
            status: 503,
            detail: detail.into(),
        }
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::BAD_REQUEST);
        let body = serde_json::to_vec(&self).unwrap_or_default();
        let mut response = (status, body).into_response();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        response
            .headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        response
    }
}
