//! The check itself: a request's limits asked of the store, and the answer turned into either
//! headers for the passing response or a response of its own (429, 503, 500). A single limit
//! in a store that answers at once is decided without waiting ([`Shared::decide`]); anything
//! else goes through the store's futures ([`Shared::check`]).

use std::sync::Arc;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderValue, WWW_AUTHENTICATE};
use http::request::Parts;
use http::{Response, StatusCode};

use super::headers::{Fields, FieldsBuilder, set_retry_after};
use super::key::KeyRejection;
use super::policy::{Applied, Policy};
use super::problem::Problem;
use super::scratch::with_buffer;
use super::stats::{RateLimitStats, bump};
use crate::decision::{Decision, FailMode};
use crate::policy::acquire_all;
use crate::store::{Acquire, Store, StoreError};

/// How the layer behaves; fixed when it is built.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Options {
    /// What a transient store error does: `Open` lets the request through (marked with
    /// `Flowgate-Fallback: open`), anything else answers 503.
    pub(crate) on_store_error: FailMode,
    /// Whether to add `X-RateLimit-Limit/Remaining/Reset`.
    pub(crate) legacy_headers: bool,
}

/// Everything a layer's services share.
pub(crate) struct Shared<St> {
    /// Where the counters live.
    pub(crate) store: St,
    /// The limits.
    pub(crate) policy: Policy,
    /// Behaviour.
    pub(crate) options: Options,
    /// Outcome counters.
    pub(crate) stats: Arc<RateLimitStats>,
}

/// What becomes of a request.
pub(crate) enum Verdict {
    /// Call the inner service and add these fields to its response.
    Pass(Fields),
    /// Answer with this response instead.
    Answer(Response<Bytes>),
}

/// What the layer knows about a request before any waiting.
pub(crate) enum Decided {
    /// The verdict is in: the store answered at once (or nothing needed asking).
    Now(Verdict),
    /// These limits must be asked of the store asynchronously ([`Shared::check`]).
    Later(Vec<Applied>),
}

/// One limit's part in a verdict: what the store said, and what is needed to report it.
struct Ruling<'a> {
    /// The limit's name.
    name: &'a str,
    /// Its `RateLimit-Policy` item.
    policy_item: &'a HeaderValue,
    /// Whether it may deny.
    enforced: bool,
    /// The store's answer.
    result: &'a Result<Decision, StoreError>,
}

/// Whether a request speaks gRPC, so that refusals are sent as gRPC statuses.
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// The response for `problem`, as problem+json or as a gRPC status.
fn answer(problem: Problem, grpc: bool) -> Response<Bytes> {
    if grpc {
        problem.into_grpc_response()
    } else {
        problem.into_response()
    }
}

impl<St: Store> Shared<St> {
    /// The response for a request whose key could not be extracted.
    pub(crate) fn reject(&self, rejection: KeyRejection, grpc: bool) -> Response<Bytes> {
        bump(&self.stats.rejected);
        let unauthorized = rejection.status == StatusCode::UNAUTHORIZED;
        let mut response = answer(Problem::status(rejection.status, rejection.detail), grpc);
        if unauthorized {
            response
                .headers_mut()
                .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }

    /// Decides a request without waiting when it can: a policy of one limit, in a store that
    /// answers at once (the memory store), is decided here with no allocation but the
    /// response's `RateLimit` value. Everything else is left to [`check`](Self::check).
    pub(crate) fn decide(&self, parts: &Parts) -> Decided {
        let Some(limit) = self.policy.single() else {
            return match self.policy.apply(parts) {
                Ok(applied) if applied.is_empty() => Decided::Now(Verdict::Pass(Fields::default())),
                Ok(applied) => Decided::Later(applied),
                Err(rejection) => Decided::Now(Verdict::Answer(
                    self.reject(rejection, is_grpc(&parts.headers)),
                )),
            };
        };
        with_buffer(|buffer| {
            let priced = match limit.select(parts, buffer) {
                Ok(Some(priced)) => priced,
                Ok(None) => return Decided::Now(Verdict::Pass(Fields::default())),
                Err(rejection) => {
                    let response = self.reject(rejection, is_grpc(&parts.headers));
                    return Decided::Now(Verdict::Answer(response));
                }
            };
            let Some(result) = self
                .store
                .try_acquire_now(buffer, &priced.quota, limit.units())
            else {
                return Decided::Later(vec![limit.applied(buffer.clone(), priced)]);
            };
            let ruling = Ruling {
                name: limit.name(),
                policy_item: &priced.item,
                enforced: limit.enforced(),
                result: &result,
            };
            // The store key is spent: the buffer now takes the `RateLimit` value.
            let verdict = self.judge([ruling], || is_grpc(&parts.headers), buffer);
            Decided::Now(verdict)
        })
    }

    /// Asks the store for every applied limit at once and decides.
    pub(crate) async fn check(self: Arc<Self>, applied: Vec<Applied>, grpc: bool) -> Verdict {
        let one;
        let outcome;
        let results = if let [limit] = applied.as_slice() {
            // One limit: nothing to refund, no batch to build.
            one = self
                .store
                .acquire(&limit.store_key, &limit.quota, limit.cost)
                .await;
            std::slice::from_ref(&one)
        } else {
            let requests: Vec<Acquire<'_>> = applied
                .iter()
                .map(|a| Acquire {
                    key: &a.store_key,
                    quota: &a.quota,
                    cost: a.cost,
                })
                .collect();
            outcome = acquire_all(&self.store, &requests, |i| applied[i].enforced).await;
            &outcome.results[..]
        };
        let rulings = applied.iter().zip(results).map(|(limit, result)| Ruling {
            name: &limit.name,
            policy_item: &limit.policy_item,
            enforced: limit.enforced,
            result,
        });
        with_buffer(|buffer| self.judge(rulings, || grpc, buffer))
    }

    /// The verdict on the store's answers; `buffer` is scratch space for the `RateLimit` value.
    fn judge<'a>(
        &self,
        rulings: impl IntoIterator<Item = Ruling<'a>>,
        grpc: impl FnOnce() -> bool,
        buffer: &mut String,
    ) -> Verdict {
        let mut fields = FieldsBuilder::new(buffer, self.options.legacy_headers);
        let mut violated = Vec::new();
        let mut retry_after = 0;
        let mut fallback: Option<FailMode> = None;
        let mut unavailable = false;
        let mut broken = false;
        for ruling in rulings {
            if !ruling.enforced {
                continue;
            }
            match ruling.result {
                // A fallback store that failed closed: the store, not the client, is at fault.
                Ok(d) if d.fallback == Some(FailMode::Closed) && !d.allowed => unavailable = true,
                Ok(d) => {
                    if let Some(mode) = d.fallback {
                        fallback = fallback.max_by_severity(mode);
                    }
                    // Fail-open decisions carry no real counts: leave them out of the headers.
                    if d.fallback != Some(FailMode::Open) {
                        fields.push(ruling.policy_item, ruling.name, d);
                    }
                    if !d.allowed {
                        violated.push(ruling.name.to_owned());
                        retry_after = retry_after.max(d.retry_after_secs());
                    }
                }
                Err(e) if e.is_transient() => match self.options.on_store_error {
                    FailMode::Open => fallback = fallback.max_by_severity(FailMode::Open),
                    _ => unavailable = true,
                },
                Err(_) => broken = true,
            }
        }
        if !violated.is_empty() {
            bump(&self.stats.limited);
            let retry_after = retry_after.max(1);
            let mut response = answer(Problem::quota_exceeded(violated, retry_after), grpc());
            fields.build().apply(response.headers_mut());
            set_retry_after(response.headers_mut(), retry_after);
            return Verdict::Answer(response);
        }
        if broken {
            bump(&self.stats.store_errors);
            let problem = Problem::status(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the rate-limit store failed",
            );
            return Verdict::Answer(answer(problem, grpc()));
        }
        if unavailable {
            bump(&self.stats.unavailable);
            let problem = Problem::status(
                StatusCode::SERVICE_UNAVAILABLE,
                "the rate-limit store is unavailable",
            );
            let mut response = answer(problem, grpc());
            set_retry_after(response.headers_mut(), 1);
            return Verdict::Answer(response);
        }
        bump(&self.stats.allowed);
        let mut fields = fields.build();
        if let Some(mode) = fallback {
            bump(match mode {
                FailMode::Local => &self.stats.fail_local,
                _ => &self.stats.fail_open,
            });
            fields.fallback = Some(mode.name());
        }
        Verdict::Pass(fields)
    }
}

/// Combines the fail modes of several limits: `open` (nothing checked) outranks `local`.
trait Severity {
    fn max_by_severity(self, mode: FailMode) -> Option<FailMode>;
}

impl Severity for Option<FailMode> {
    fn max_by_severity(self, mode: FailMode) -> Option<FailMode> {
        match (self, mode) {
            (Some(FailMode::Open), _) | (_, FailMode::Open) => Some(FailMode::Open),
            _ => Some(mode),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::key::Global;
    use crate::http::{Limit, RateLimitLayer};
    use crate::store::{Acquire, StoreError};
    use crate::{Decision, Quota};
    use std::time::Duration;
    use tower::{Layer, ServiceExt, service_fn};

    /// Test double for the layer's error paths only: answers every call with a fixed result.
    struct ScriptedStoreDouble(Result<Decision, StoreError>);

    impl Store for ScriptedStoreDouble {
        async fn acquire(&self, _: &str, _: &Quota, _: u64) -> Result<Decision, StoreError> {
            self.0.clone()
        }
        async fn acquire_many(&self, r: &[Acquire<'_>]) -> Vec<Result<Decision, StoreError>> {
            r.iter().map(|_| self.0.clone()).collect()
        }
        async fn refund(&self, _: &str, _: &Quota, _: u64) -> Result<(), StoreError> {
            Ok(())
        }
        async fn reset(&self, _: &str, _: &Quota) -> Result<(), StoreError> {
            Ok(())
        }
    }

    async fn status_and_headers(
        result: Result<Decision, StoreError>,
        mode: FailMode,
    ) -> (StatusCode, HeaderMap, crate::http::StatsSnapshot) {
        let policy = Policy::new().limit(Limit::new(
            "all",
            Global::default(),
            Quota::per_second(5).unwrap(),
        ));
        let layer = RateLimitLayer::builder(ScriptedStoreDouble(result), policy)
            .on_store_error(mode)
            .build()
            .unwrap();
        let service = layer.layer(service_fn(|_: http::Request<()>| async {
            Ok::<_, std::convert::Infallible>(Response::new(http_body_util::Empty::<Bytes>::new()))
        }));
        let response = service.oneshot(http::Request::new(())).await.unwrap();
        let stats = layer.stats().snapshot();
        (response.status(), response.headers().clone(), stats)
    }

    fn decision(allowed: bool, fallback: Option<FailMode>) -> Decision {
        Decision {
            allowed,
            limit: 5,
            remaining: 2,
            reset_after: Duration::from_millis(600),
            retry_after: if allowed {
                Duration::ZERO
            } else {
                Duration::from_millis(200)
            },
            fallback,
        }
    }

    #[tokio::test]
    async fn store_errors_and_fallback_decisions_become_the_right_responses() {
        let unavailable = Err(StoreError::Unavailable("refused".into()));
        let (status, headers, stats) =
            status_and_headers(unavailable.clone(), FailMode::Closed).await;
        assert_eq!(status, 503);
        assert_eq!(headers["retry-after"], "1");
        assert_eq!(stats.unavailable, 1);
        // `local` at the layer cannot decide by itself: like closed.
        let (status, _, _) = status_and_headers(unavailable.clone(), FailMode::Local).await;
        assert_eq!(status, 503);
        let (status, headers, stats) = status_and_headers(unavailable, FailMode::Open).await;
        assert_eq!(status, 200);
        assert_eq!(headers["flowgate-fallback"], "open");
        assert_eq!((stats.allowed, stats.fail_open), (1, 1));
        // Not transient: fail modes do not apply.
        let broken = Err(StoreError::Backend("WRONGTYPE".into()));
        let (status, _, stats) = status_and_headers(broken, FailMode::Open).await;
        assert_eq!(status, 500);
        assert_eq!(stats.store_errors, 1);
        // Decisions a fallback store made: local ones are real limits and are shown.
        let local = Ok(decision(true, Some(FailMode::Local)));
        let (status, headers, stats) = status_and_headers(local, FailMode::Closed).await;
        assert_eq!(status, 200);
        assert_eq!(headers["flowgate-fallback"], "local");
        assert_eq!(headers["ratelimit"], r#""all";r=2;t=1"#);
        assert_eq!(stats.fail_local, 1);
        let local_denial = Ok(decision(false, Some(FailMode::Local)));
        let (status, _, _) = status_and_headers(local_denial, FailMode::Closed).await;
        assert_eq!(status, 429);
        let closed = Ok(decision(false, Some(FailMode::Closed)));
        let (status, _, _) = status_and_headers(closed, FailMode::Open).await;
        assert_eq!(status, 503);
        let open = Ok(decision(true, Some(FailMode::Open)));
        let (status, headers, _) = status_and_headers(open, FailMode::Closed).await;
        assert_eq!(status, 200);
        assert_eq!(headers["flowgate-fallback"], "open");
        assert!(headers.get("ratelimit").is_none());
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
            let policy = Policy::new().limit(Limit::new("q", Global::default(), quota));
            let layer = RateLimitLayer::new(store, policy).unwrap();
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
