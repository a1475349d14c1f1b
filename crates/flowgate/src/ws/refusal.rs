//! A [`Refusal`] as the HTTP answer to the upgrade request (feature `tower`): 429 with
//! `Retry-After`, a problem+json body, and — for the rate of new connections — the IETF
//! `RateLimit` fields, rendered by the one renderer ([`Answer`]).

use bytes::Bytes;
use http::Response;
use http::header::{HeaderValue, RETRY_AFTER};

use super::limiter::{Refusal, WsLimiter};
use super::verdict::Scope;
use crate::clock::Clock;
use crate::http::answer::{Answer, LimitReport};
use crate::http::headers::policy_item_value;
use crate::http::problem::Problem;

impl<C: Clock + Clone> WsLimiter<C> {
    /// The response to an upgrade request that [`admit`](WsLimiter::admit) refused: `429`,
    /// `Retry-After` (whole seconds, rounded up), `Cache-Control: no-store`, an RFC 9457 body
    /// naming the scope, and for the new-connection rate `RateLimit-Policy: "connect";q=…;w=…`
    /// and `RateLimit`.
    ///
    /// ```
    /// use flowgate::{ws::{Client, WsLimiter}, Quota};
    /// let limiter = WsLimiter::builder().connections_per_ip(Quota::per_minute(1)).build()?;
    /// let _first = limiter.admit(Client::new("192.0.2.1"))?;
    /// let refusal = limiter.admit(Client::new("192.0.2.1")).unwrap_err();
    /// let response = limiter.refusal_response(&refusal);
    /// assert_eq!(response.status(), 429);
    /// assert_eq!(response.headers()["ratelimit-policy"], r#""connect";q=1;w=60"#);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn refusal_response(&self, refusal: &Refusal) -> Response<Bytes> {
        if let (Some(decision), Some(quota)) = (refusal.decision, self.connect_quota()) {
            let item = policy_item_value(Scope::Connect.name(), &quota);
            let result = Ok(decision);
            let report = LimitReport {
                name: Scope::Connect.name(),
                policy_item: &item,
                enforced: true,
                result: &result,
            };
            if let Some(response) = Answer::new([report], false).refusal(false) {
                return response;
            }
        }
        let secs = refusal.retry_after_secs();
        let mut response =
            Problem::quota_exceeded(vec![refusal.scope.name().to_owned()], secs).into_response();
        response
            .headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(secs));
        response
    }
}
