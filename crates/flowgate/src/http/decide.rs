//! The check itself: a request's limits asked of the store through the
//! [`pipeline`](crate::pipeline), and the answer turned into either headers for the passing
//! response or a response of its own (429, 503, 500), by the one renderer ([`Answer`]). A store
//! that answers at once decides the request here ([`Shared::decide`]); anything else waits on
//! the store ([`Shared::check`]).

use std::sync::Arc;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderValue, WWW_AUTHENTICATE};
use http::request::Parts;
use http::{Response, StatusCode};

use super::key::KeyRejection;
use super::limits::{Limits, Selected};
use super::stats::{RateLimitStats, bump};
use crate::answer::problem::Problem;
use crate::answer::{Answer, AnswerKind, LimitReport, Rendered};
use crate::decision::FailMode;
use crate::pipeline::{self, Outcome, Unfinished};
use crate::scratch::with_buffer;
use crate::store::{Ask, Store};

/// How the layer behaves; fixed when it is built.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Options {
    /// Whether to add `X-RateLimit-Limit/Remaining/Reset`.
    pub(crate) legacy_headers: bool,
}

/// Everything a layer's services share.
pub(crate) struct Shared<St> {
    /// Where the counters live.
    pub(crate) store: St,
    /// The limits.
    pub(crate) limits: Limits,
    /// Behaviour.
    pub(crate) options: Options,
    /// Outcome counters.
    pub(crate) stats: Arc<RateLimitStats>,
}

/// Where a request stands after [`Shared::decide`].
pub(crate) enum Step {
    /// Decided: pass it (with the answer's fields) or refuse it.
    Decided(Rendered),
    /// The store must be waited for ([`Shared::check`]).
    Wait(Vec<Selected>, Unfinished),
}

/// Whether a request speaks gRPC, so that refusals are sent as gRPC statuses.
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

impl<St: Store> Shared<St> {
    /// The response for a request whose key could not be extracted.
    pub(crate) fn reject(&self, rejection: KeyRejection, grpc: bool) -> Response<Bytes> {
        bump(&self.stats.rejected);
        let unauthorized = rejection.status == StatusCode::UNAUTHORIZED;
        let problem = Problem::status(rejection.status, rejection.detail);
        let mut response = if grpc {
            problem.into_grpc_response()
        } else {
            problem.into_response()
        };
        if unauthorized {
            response
                .headers_mut()
                .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }

    /// Decides a request without waiting when the store answers at once (the memory store).
    /// One limit is decided with no allocation but the response's `RateLimit` value (its key
    /// in a reused buffer); otherwise the store is left to [`check`](Self::check).
    pub(crate) fn decide(&self, parts: &Parts) -> Step {
        let grpc = || is_grpc(&parts.headers);
        let Some(limit) = self.limits.single() else {
            let selected = match self.limits.select(parts) {
                Ok(selected) => selected,
                Err(rejection) => {
                    return Step::Decided(Rendered::Refuse(self.reject(rejection, grpc())));
                }
            };
            let asks: Vec<Ask<'_>> = selected.iter().map(Selected::ask).collect();
            return match pipeline::decide_now(&self.store, &asks) {
                Ok(outcome) => Step::Decided(self.finish(&selected, outcome, grpc)),
                Err(unfinished) => Step::Wait(selected, unfinished),
            };
        };
        with_buffer(|buffer| {
            let tier = match limit.select(parts, buffer) {
                Ok(Some(tier)) => tier,
                Ok(None) => return Step::Decided(Rendered::Pass(Answer::empty())),
                Err(rejection) => {
                    return Step::Decided(Rendered::Refuse(self.reject(rejection, grpc())));
                }
            };
            let ask = limit.ask(buffer, tier);
            let outcome = match pipeline::decide_now(&self.store, &[ask]) {
                Ok(outcome) => outcome,
                Err(unfinished) => {
                    return Step::Wait(vec![limit.selected(buffer.clone(), tier)], unfinished);
                }
            };
            let report = LimitReport::new(
                limit.name(),
                &tier.item,
                limit.enforced(),
                &outcome.results[0],
            );
            // The store key is spent: the buffer now takes the `RateLimit` value.
            let answer = Answer::with_buffer([report], self.options.legacy_headers, buffer);
            Step::Decided(self.render(answer, grpc))
        })
    }

    /// Waits for the store's answers about `selected` and decides.
    pub(crate) async fn wait(
        self: Arc<Self>,
        selected: Vec<Selected>,
        unfinished: Unfinished,
        grpc: bool,
    ) -> Rendered {
        let asks: Vec<Ask<'_>> = selected.iter().map(Selected::ask).collect();
        let outcome = unfinished.finish(&self.store, &asks).await;
        self.finish(&selected, outcome, || grpc)
    }

    /// The answer to `outcome`, the store's answers for `selected`.
    fn finish(
        &self,
        selected: &[Selected],
        outcome: Outcome,
        grpc: impl FnOnce() -> bool,
    ) -> Rendered {
        let reports = selected
            .iter()
            .zip(&outcome.results)
            .map(|(s, result)| LimitReport::new(&s.name, &s.policy_item, s.enforced, result));
        let answer = Answer::new(reports, self.options.legacy_headers);
        self.render(answer, grpc)
    }

    /// Counts the answer and renders it.
    fn render(&self, answer: Answer, grpc: impl FnOnce() -> bool) -> Rendered {
        let stats = &self.stats;
        match answer.kind() {
            AnswerKind::Allowed => {
                bump(&stats.allowed);
                match answer.fallback() {
                    Some(FailMode::Open) => bump(&stats.fail_open),
                    Some(FailMode::Local) => bump(&stats.fail_local),
                    _ => {}
                }
            }
            AnswerKind::Limited => bump(&stats.limited),
            AnswerKind::Closed | AnswerKind::Unavailable => bump(&stats.unavailable),
            _ => bump(&stats.store_errors),
        }
        answer.render(grpc())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::key::Global;
    use crate::http::{Limit, RateLimitLayer};
    use crate::store::{FallbackStore, StoreError};
    use crate::{Decision, Quota};
    use std::time::Duration;
    use tower::{Layer, ServiceExt, service_fn};

    /// Test double for the layer's error paths only: answers every call with a fixed result.
    struct ScriptedStoreDouble(Result<Decision, StoreError>);

    impl Store for ScriptedStoreDouble {
        async fn check(&self, _: Ask<'_>) -> Result<Decision, StoreError> {
            self.0.clone()
        }
        async fn refund(&self, _: Ask<'_>) -> Result<(), StoreError> {
            Ok(())
        }
        async fn reset(&self, _: Ask<'_>) -> Result<(), StoreError> {
            Ok(())
        }
    }

    async fn respond<St: Store + 'static>(
        store: St,
        limit: Limit,
    ) -> (StatusCode, HeaderMap, crate::http::StatsSnapshot) {
        let layer = RateLimitLayer::new(store, Limits::new().limit(limit)).unwrap();
        let service = layer.layer(service_fn(|_: http::Request<()>| async {
            Ok::<_, std::convert::Infallible>(Response::new(http_body_util::Empty::<Bytes>::new()))
        }));
        let response = service.oneshot(http::Request::new(())).await.unwrap();
        let stats = layer.stats().snapshot();
        (response.status(), response.headers().clone(), stats)
    }

    async fn scripted(
        result: Result<Decision, StoreError>,
    ) -> (StatusCode, HeaderMap, crate::http::StatsSnapshot) {
        let limit = Limit::new("all", Global::default(), Quota::per_second(5));
        respond(ScriptedStoreDouble(result), limit).await
    }

    fn decision(allowed: bool, fallback: Option<FailMode>) -> Decision {
        let quota = Quota::per_second(5);
        let d = if allowed {
            Decision::allow(&quota, 2, 600_000_000)
        } else {
            Decision::deny(&quota, 0, 600_000_000, 200_000_000)
        };
        match fallback {
            Some(mode) => d.with_fallback(mode),
            None => d,
        }
    }

    #[tokio::test]
    async fn store_errors_and_fallback_decisions_become_the_right_responses() {
        let (status, headers, stats) =
            scripted(Err(StoreError::Unavailable("refused".into()))).await;
        assert_eq!(status, 503);
        assert_eq!(headers["retry-after"], "1");
        assert_eq!(headers["cache-control"], "no-store");
        assert_eq!(stats.unavailable, 1);
        let (status, _, stats) = scripted(Err(StoreError::Backend("WRONGTYPE".into()))).await;
        assert_eq!(status, 500);
        assert_eq!(stats.store_errors, 1);
        // Decisions a fallback store made: local ones are real limits and are shown.
        let (status, headers, stats) = scripted(Ok(decision(true, Some(FailMode::Local)))).await;
        assert_eq!(status, 200);
        assert_eq!(headers["flowgate-fallback"], "local");
        assert_eq!(headers["ratelimit"], r#""all";r=2;t=1"#);
        assert_eq!(stats.fail_local, 1);
        let (status, _, _) = scripted(Ok(decision(false, Some(FailMode::Local)))).await;
        assert_eq!(status, 429);
        let (status, headers, _) = scripted(Ok(decision(false, Some(FailMode::Closed)))).await;
        assert_eq!(status, 503);
        assert_eq!(headers["flowgate-fallback"], "closed");
        let (status, headers, stats) = scripted(Ok(decision(true, Some(FailMode::Open)))).await;
        assert_eq!(status, 200);
        assert_eq!(headers["flowgate-fallback"], "open");
        assert!(headers.get("ratelimit").is_none());
        assert_eq!(stats.fail_open, 1);
    }

    #[tokio::test]
    async fn a_limits_fail_mode_reaches_the_fallback_store() {
        let down = || {
            FallbackStore::builder(ScriptedStoreDouble(Err(StoreError::Timeout(
                Duration::from_millis(50),
            ))))
            .fail(FailMode::Closed)
            .build()
        };
        let limit = || Limit::new("all", Global::default(), Quota::per_second(5));
        let (status, headers, _) = respond(down(), limit()).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(headers["flowgate-fallback"], "closed");
        let (status, headers, _) = respond(down(), limit().fail(FailMode::Open)).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(headers["flowgate-fallback"], "open");
        let (status, headers, _) = respond(down(), limit().fail(FailMode::Local)).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(headers["flowgate-fallback"], "local");
        assert_eq!(headers["ratelimit"], r#""all";r=4;t=1"#);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// Whatever the algorithm, quota and timing, a 429 says to retry after at least a
        /// second, and `RateLimit` agrees (`r=0`, `t` = `Retry-After`).
        #[test]
        fn limited_responses_never_say_retry_after_0(
            algorithm in proptest::sample::select(crate::Algorithm::ALL.to_vec()),
            limit in 1u64..20,
            period_ms in 1u64..5_000,
            steps in proptest::collection::vec(0u64..700, 1..40),
        ) {
            let quota = Quota::new(limit, Duration::from_millis(period_ms))
                .unwrap()
                .with_algorithm(algorithm)
                .unwrap();
            let clock = crate::clock::ManualClock::new(1_700_000_000_000_000_000);
            let store = crate::store::MemoryStore::builder().clock(clock.clone()).build();
            let limits = Limits::new().limit(Limit::new("q", Global::default(), quota));
            let layer = RateLimitLayer::new(store, limits).unwrap();
            let service = layer.layer(service_fn(|_: http::Request<()>| async {
                Ok::<_, std::convert::Infallible>(Response::new(http_body_util::Empty::<Bytes>::new()))
            }));
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            for step in steps {
                clock.advance(Duration::from_millis(step));
                for _ in 0..3 {
                    let response = rt
                        .block_on(service.clone().oneshot(http::Request::new(())))
                        .unwrap();
                    if response.status() == StatusCode::TOO_MANY_REQUESTS {
                        let secs: u64 = response.headers()["retry-after"]
                            .to_str().unwrap().parse().unwrap();
                        proptest::prop_assert!(secs >= 1);
                        let limit = response.headers()["ratelimit"].to_str().unwrap();
                        proptest::prop_assert_eq!(limit, format!("\"q\";r=0;t={secs}"));
                    }
                }
            }
        }
    }
}
