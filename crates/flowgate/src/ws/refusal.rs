//! A [`Refusal`] as the HTTP answer to the upgrade request (feature `tower`): 429 with
//! `Retry-After`, a problem+json body, and — for the rate of new connections — the IETF
//! `RateLimit` fields, rendered by the one renderer ([`Answer`]).

use bytes::Bytes;
use http::HeaderValue;
use http::Response;

use super::action::Scope;
use super::limiter::{Refusal, WsLimiter};
use crate::answer::headers::policy_item_value;
use crate::answer::problem::Problem;
use crate::answer::{Answer, LimitReport, Rendered};
use crate::clock::Clock;

impl Refusal {
    /// The client-visible answer: for the rate of new connections, the `RateLimit-Policy` /
    /// `RateLimit` fields of its decision under `name` and `policy_item` (e.g.
    /// [`policy_item_value`] of the connect quota); for the caps and the penalty box, which have
    /// no counts to show, `Retry-After` alone. Either way a refusal
    /// ([`Answer::render`] gives the 429).
    pub fn answer(&self, name: &str, policy_item: &HeaderValue) -> Answer {
        match &self.decision {
            Some(decision) => {
                let result = Ok(*decision);
                Answer::new([LimitReport::new(name, policy_item, true, &result)], false)
            }
            None => Answer::limited_without_counts(self.scope.name(), self.retry_after_secs()),
        }
    }
}

impl<C: Clock + Clone> WsLimiter<C> {
    /// The response to an upgrade request that [`admit`](WsLimiter::admit) refused: `429`,
    /// `Retry-After` (whole seconds, rounded up), `Cache-Control: no-store`, an RFC 9457 body
    /// naming the scope, and for the new-connection rate `RateLimit-Policy: "connect";q=…;w=…`
    /// and `RateLimit` — [`Refusal::answer`] under the name `connect`.
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
        let name = Scope::Connect.name();
        let item = match self.connect_quota() {
            Some(quota) => policy_item_value(name, &quota),
            None => HeaderValue::from_static(""),
        };
        match refusal.answer(name, &item).render(false) {
            Rendered::Refuse(response) => response,
            // A refusal's decision is a denial, so its answer refuses; should one ever allow,
            // the refusal stands as its problem alone.
            Rendered::Pass(_) => Problem::quota_exceeded(
                vec![refusal.scope.name().to_owned()],
                Some(refusal.retry_after_secs()),
            )
            .into_response(),
        }
    }
}
