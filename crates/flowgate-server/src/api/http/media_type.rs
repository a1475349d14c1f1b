//! The decision endpoints take JSON only: a `POST` to `/json` or `/v1/check` whose
//! `Content-Type` is not `application/json` (parameters such as `charset` allowed; the type in
//! any case) — or that has none — is answered `415` with a problem body, before its body is
//! read.
//!
//! This is a guard against cross-site request forgery: a web page can make a browser `POST`
//! `text/plain`, `application/x-www-form-urlencoded` or `multipart/form-data` to any address
//! without asking (no CORS preflight), so without it any page an operator opens could spend a
//! key's quota through a service on their network. A `Content-Type: application/json` request
//! needs a preflight, which this API never grants (it sends no CORS headers).

use std::convert::Infallible;
use std::task::{Context, Poll};

use axum::extract::Request;
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::future::{Either, Ready, ready};
use tower_layer::Layer;
use tower_service::Service;

use crate::api::problem::Problem;

/// Wraps a route so that its `POST`s must be `application/json` (see the [module docs](self)).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RequireJson;

impl<S> Layer<S> for RequireJson {
    type Service = RequireJsonService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RequireJsonService(inner)
    }
}

/// The service of [`RequireJson`].
#[derive(Debug, Clone)]
pub(crate) struct RequireJsonService<S>(S);

impl<S> Service<Request> for RequireJsonService<S>
where
    S: Service<Request, Response = Response, Error = Infallible>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Either<Ready<Result<Response, Infallible>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        if request.method() == Method::POST && !is_json(request.headers()) {
            return Either::Left(ready(Ok(refusal(request.headers()))));
        }
        Either::Right(self.0.call(request))
    }
}

/// Whether `headers` declare a JSON body: `application/json`, with or without parameters.
fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            let essence = v.split(';').next().unwrap_or_default().trim();
            essence.eq_ignore_ascii_case("application/json")
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
