//! RFC 9457 problem details (`application/problem+json`) for malformed requests to the HTTP
//! API: the library's [`flowgate::answer::problem::Problem`] (the same body the tower layer and
//! the gateway send) with the service's `bad-request` type. Store failures are rendered by
//! the one renderer ([`flowgate::answer`]).

use axum::response::{IntoResponse, Response};
use flowgate::answer::problem::Problem as Body;
use http::StatusCode;

/// A problem the HTTP API answers with.
#[derive(Debug, Clone)]
pub struct Problem(Body);

impl Problem {
    /// 400: the body could not be parsed or is not a valid request.
    pub(crate) fn bad_request(detail: impl Into<String>) -> Self {
        Problem(Body {
            type_uri: "https://flowgate.dev/problems/bad-request",
            title: "Malformed request".into(),
            ..Body::status(StatusCode::BAD_REQUEST, detail)
        })
    }

    /// A problem of the service's own `type` (`https://flowgate.dev/problems/{kind}`).
    pub(crate) fn new(
        status: StatusCode,
        type_uri: &'static str,
        title: &str,
        detail: impl Into<String>,
    ) -> Self {
        Problem(Body {
            type_uri,
            title: title.into(),
            ..Body::status(status, detail)
        })
    }
}

impl Problem {
    /// A problem with `status` for a request the HTTP layer refused before parsing (`413` for a
    /// body over the limit).
    pub(crate) fn status(status: StatusCode, detail: impl Into<String>) -> Self {
        Problem(Body::status(status, detail))
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        self.0.into_response().map(axum::body::Body::from)
    }
}
