//! `GET /openapi.json`: the HTTP API described as OpenAPI 3.1, generated from the handlers'
//! annotations and the response types themselves (utoipa), so it cannot drift from the code.

use utoipa::ToSchema;

/// An RFC 9457 problem (`application/problem+json`), as every refusal of the HTTP API is
/// written.
#[derive(Debug, ToSchema)]
#[allow(dead_code)]
pub(crate) struct ProblemBody {
    /// A URI naming the kind of problem (`about:blank` when the status says it all).
    #[schema(rename = "type")]
    type_uri: String,
    /// A short summary of the kind of problem.
    title: String,
    /// The HTTP status.
    status: u16,
    /// What happened this time.
    detail: String,
    /// The limits a 429 exceeded.
    #[schema(rename = "violated-policies")]
    violated_policies: Option<Vec<String>>,
}
