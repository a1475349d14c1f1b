//! [`Answer`]: the one place where limits' decisions become what a client is told — the
//! `RateLimit-Policy` / `RateLimit` fields ([`headers`]), `Retry-After`, the fallback marker,
//! the binding limit, the status and the problem body ([`problem`]). The tower layer, the
//! gateway, the WebSocket upgrade and the service's gRPC (`ShouldRateLimit`), `/json` and
//! `/v1/check` answers all render through it, so they cannot disagree. (Feature `answer`,
//! which `tower` includes: it needs only the `http` types, so a gRPC service can use it alone.)
//!
//! The rules, decided once:
//!
//! * Only **enforced** limits are reported; shadow limits count but appear nowhere.
//! * A limit is in the `RateLimit` fields when its counts are real: a store's decision, or a
//!   local fallback's (`fail: local`). Decisions a fail mode made without counting (`open`,
//!   `closed`) are left out — their numbers would be invented.
//! * A **blocklist** limit (0 per unit, [`LimitReport::blocked`]) is reported like any other:
//!   `q=0` over its period in `RateLimit-Policy` and `r=0;t=<period>` in `RateLimit` — a true
//!   description (this client may make no requests), which clients can act on.
//! * `r` never exceeds `q`: a bucket with a burst above its limit shows at most its limit (see
//!   [`headers`] on bursts).
//! * The answer is, in this order of precedence: **limited** (a limit denied on its own counts,
//!   or the cost can never fit: 429 / `OVER_LIMIT`), **failed** (the store broke in a way
//!   retrying will not fix: 500), **closed** (the store is away and the limit fails closed:
//!   503, `OVER_LIMIT` for Envoy), **unavailable** (a store error no fallback handled: 503, a
//!   gRPC error for Envoy so that its `failure_mode_deny` applies), else **allowed**.
//! * `Retry-After` is the longest wait among the enforced denials, in whole seconds rounded up,
//!   at least 1; for a store that is away, the time until it is tried again (at least 1). A
//!   cost above a limit's capacity can never be granted: that refusal has no `Retry-After`
//!   (waiting does not help), and its problem says so.
//! * `Flowgate-Fallback` names the fail mode that decided part of the answer: `closed` over
//!   `open` over `local`.
//! * The legacy `X-RateLimit-*` fields (optional) show the binding limit: the first enforced
//!   denial, else the limit with the fewest units remaining.
//! * Every answer but an allowing one carries `Cache-Control: no-store`.

use bytes::Bytes;
use http::header::{CACHE_CONTROL, HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use http::{Response, StatusCode};

pub mod headers;
pub mod problem;

use std::time::Duration;

use headers::{
    FLOWGATE_FALLBACK, RATELIMIT, RATELIMIT_POLICY, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING,
    X_RATELIMIT_RESET, push_sf_string, push_u64, remaining, reset_secs,
};
use problem::Problem;

use crate::decision::{Decision, FailMode};
use crate::store::StoreError;

/// One limit's part in an [`Answer`]: its name, its `RateLimit-Policy` item (formatted once,
/// e.g. with [`policy_item_value`](headers::policy_item_value)), whether it may deny, and what
/// it said.
#[derive(Debug, Clone, Copy)]
pub struct LimitReport<'a> {
    /// The limit's name as clients see it.
    name: &'a str,
    /// Its `RateLimit-Policy` item: `"name";q=100;w=60`.
    policy_item: &'a HeaderValue,
    /// Whether the limit may deny (false for shadow limits, which are not reported).
    enforced: bool,
    /// What the limit said.
    said: Said<'a>,
}

/// What a limit said.
#[derive(Debug, Clone, Copy)]
enum Said<'a> {
    /// The store's answer (or why it had none).
    Result(&'a Result<Decision, StoreError>),
    /// A blocklist: nothing is allowed in `period`.
    Blocked(Duration),
}

impl<'a> LimitReport<'a> {
    /// A limit counted in a store, with the store's answer (`result`, as the
    /// [`pipeline`](crate::pipeline) returns it); `enforced` is false for shadow limits.
    pub fn new(
        name: &'a str,
        policy_item: &'a HeaderValue,
        enforced: bool,
        result: &'a Result<Decision, StoreError>,
    ) -> Self {
        LimitReport {
            name,
            policy_item,
            enforced,
            said: Said::Result(result),
        }
    }

    /// A blocklist limit (zero units per `period`, e.g. envoyproxy/ratelimit's
    /// `requests_per_unit: 0`): it denies, and the request may be tried again after `period`.
    /// `policy_item` is usually [`blocked_policy_item_value`](headers::blocked_policy_item_value).
    pub fn blocked(
        name: &'a str,
        policy_item: &'a HeaderValue,
        enforced: bool,
        period: Duration,
    ) -> Self {
        LimitReport {
            name,
            policy_item,
            enforced,
            said: Said::Blocked(period),
        }
    }
}

/// An answer rendered for the protocol at hand ([`Answer::render`]).
#[derive(Debug)]
pub enum Rendered {
    /// The request goes through; add the answer's fields ([`Answer::apply`]) to its response.
    Pass(Answer),
    /// The request is refused with this response: problem+json, or a gRPC status for gRPC.
    Refuse(Response<Bytes>),
}

/// What an [`Answer`] says about the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AnswerKind {
    /// Every enforced limit allows it.
    Allowed,
    /// A limit denied it (or its cost can never fit): HTTP 429, RLS `OVER_LIMIT`.
    Limited,
    /// The store failed in a way retrying cannot fix: HTTP 500, RLS error.
    Failed,
    /// The store is away and a limit fails closed: HTTP 503, RLS `OVER_LIMIT`.
    Closed,
    /// The store could not be asked and no fallback decided: HTTP 503, RLS error.
    Unavailable,
}

impl AnswerKind {
    /// The HTTP status of a response that answers the request itself (`200` when allowed).
    pub fn status(self) -> StatusCode {
        match self {
            AnswerKind::Allowed => StatusCode::OK,
            AnswerKind::Limited => StatusCode::TOO_MANY_REQUESTS,
            AnswerKind::Failed => StatusCode::INTERNAL_SERVER_ERROR,
            AnswerKind::Closed | AnswerKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// Whether an Envoy RLS answer says `OVER_LIMIT` (rather than `OK` or an error).
    pub fn over_limit(self) -> bool {
        matches!(self, AnswerKind::Limited | AnswerKind::Closed)
    }
}

/// The client-visible answer to a request checked against several limits. See the
/// [module docs](self) for the rules.
///
/// ```
/// use flowgate::answer::{Answer, AnswerKind, LimitReport, headers::policy_item_value};
/// use flowgate::{clock::ManualClock, Quota, RateLimiter};
///
/// let quota = Quota::per_minute(2);
/// let limiter = RateLimiter::with_clock(quota, ManualClock::new(0));
/// let item = policy_item_value("per-ip", &quota);
/// let (first, _, third) = (Ok(limiter.check()), limiter.check(), Ok(limiter.check()));
/// let report = |result| LimitReport::new("per-ip", &item, true, result);
///
/// let allowed = Answer::new([report(&first)], false);
/// assert_eq!(allowed.kind(), AnswerKind::Allowed);
/// assert_eq!(allowed.header("ratelimit").unwrap(), r#""per-ip";r=1;t=30"#);
/// let limited = Answer::new([report(&third)], false);
/// assert_eq!(limited.kind(), AnswerKind::Limited);
/// assert_eq!(limited.retry_after_secs(), Some(30));
/// assert_eq!(limited.header("ratelimit-policy").unwrap(), r#""per-ip";q=2;w=60"#);
/// ```
#[derive(Debug, Clone)]
pub struct Answer {
    /// What the answer says.
    kind: AnswerKind,
    /// `RateLimit-Policy`.
    policy: Option<HeaderValue>,
    /// `RateLimit`.
    limit: Option<HeaderValue>,
    /// `X-RateLimit-Limit`, `-Remaining`, `-Reset` of the binding limit, when asked for.
    legacy: Option<[u64; 3]>,
    /// The fail mode that decided part of the answer.
    fallback: Option<FailMode>,
    /// `Retry-After` in seconds, when denied.
    retry_after: Option<u64>,
    /// The names of the limits that denied (for the problem body).
    violated: Vec<String>,
}

/// The `RateLimit-Policy` items so far: one limit's shared value, or several joined.
enum PolicyItems {
    None,
    One(HeaderValue),
    Joined(Vec<u8>),
}

impl PolicyItems {
    fn push(&mut self, item: &HeaderValue) {
        match self {
            PolicyItems::None => *self = PolicyItems::One(item.clone()),
            PolicyItems::One(first) => {
                let mut joined = Vec::with_capacity(first.len() + 2 + item.len());
                joined.extend_from_slice(first.as_bytes());
                joined.extend_from_slice(b", ");
                joined.extend_from_slice(item.as_bytes());
                *self = PolicyItems::Joined(joined);
            }
            PolicyItems::Joined(joined) => {
                joined.extend_from_slice(b", ");
                joined.extend_from_slice(item.as_bytes());
            }
        }
    }

    fn build(self) -> Option<HeaderValue> {
        match self {
            PolicyItems::None => None,
            PolicyItems::One(item) => Some(item),
            PolicyItems::Joined(joined) => Some(printable(joined)),
        }
    }
}

/// A header value from bytes that are printable ASCII by construction, without copying them.
fn printable(bytes: Vec<u8>) -> HeaderValue {
    HeaderValue::from_maybe_shared(Bytes::from(bytes)).unwrap_or(HeaderValue::from_static(""))
}

/// Combines fail modes: `closed` over `open` over `local`.
fn more_severe(current: Option<FailMode>, mode: FailMode) -> Option<FailMode> {
    let rank = |m: FailMode| match m {
        FailMode::Closed => 2,
        FailMode::Open => 1,
        FailMode::Local => 0,
    };
    match current {
        Some(c) if rank(c) >= rank(mode) => Some(c),
        _ => Some(mode),
    }
}

impl Answer {
    /// The answer when no limit applies: allowed, no fields.
    pub(crate) fn empty() -> Self {
        Answer {
            kind: AnswerKind::Allowed,
            policy: None,
            limit: None,
            legacy: None,
            fallback: None,
            retry_after: None,
            violated: Vec::new(),
        }
    }

    /// A refusal by a cap that has no counts to report (concurrent connections, a node cap, a
    /// ban): limited, `Retry-After` of `retry_after_secs` (at least 1), `violated` named in the
    /// problem body, and no `RateLimit` fields — there is no quota to describe.
    pub fn limited_without_counts(violated: impl Into<String>, retry_after_secs: u64) -> Self {
        Answer {
            kind: AnswerKind::Limited,
            retry_after: Some(retry_after_secs.max(1)),
            violated: vec![violated.into()],
            ..Answer::empty()
        }
    }

    /// The answer for `reports`; with `legacy`, also the `X-RateLimit-*` fields.
    pub fn new<'a>(reports: impl IntoIterator<Item = LimitReport<'a>>, legacy: bool) -> Self {
        crate::scratch::with_buffer(|buffer| Self::with_buffer(reports, legacy, buffer))
    }

    /// [`new`](Self::new), writing the `RateLimit` value in `buffer` (cleared first), so a hot
    /// path that reuses a buffer allocates only the value the answer keeps.
    pub(crate) fn with_buffer<'a>(
        reports: impl IntoIterator<Item = LimitReport<'a>>,
        legacy: bool,
        buffer: &mut String,
    ) -> Self {
        buffer.clear();
        let mut policy = PolicyItems::None;
        // The binding limit so far: whether it allowed, and its `[limit, remaining, reset]`.
        let mut binding: Option<(bool, [u64; 3])> = None;
        let mut violated = Vec::new();
        let mut retry_after = 0;
        let mut fallback = None;
        let (mut closed, mut unavailable, mut failed) = (false, false, false);
        // A cost above a limit's capacity: waiting never helps, so no `Retry-After`.
        let mut never = false;
        for report in reports {
            if !report.enforced {
                continue;
            }
            let blocked;
            let decision = match report.said {
                Said::Blocked(period) => {
                    blocked = Decision::blocked(period);
                    &blocked
                }
                Said::Result(Ok(d)) => d,
                Said::Result(Err(StoreError::Capacity(_))) => {
                    never = true;
                    violated.push(report.name.to_owned());
                    continue;
                }
                Said::Result(Err(e)) if e.is_transient() => {
                    unavailable = true;
                    continue;
                }
                Said::Result(Err(_)) => {
                    failed = true;
                    continue;
                }
            };
            match decision.fallback {
                Some(mode @ FailMode::Open) => {
                    fallback = more_severe(fallback, mode);
                    continue;
                }
                Some(mode @ FailMode::Closed) => {
                    fallback = more_severe(fallback, mode);
                    if !decision.allowed {
                        closed = true;
                        retry_after = retry_after.max(decision.retry_after_secs());
                    }
                    continue;
                }
                Some(mode @ FailMode::Local) => fallback = more_severe(fallback, mode),
                None => {}
            }
            policy.push(report.policy_item);
            if !buffer.is_empty() {
                buffer.push_str(", ");
            }
            let reset = reset_secs(decision);
            push_sf_string(buffer, report.name);
            buffer.push_str(";r=");
            let left = remaining(decision);
            push_u64(buffer, left);
            buffer.push_str(";t=");
            push_u64(buffer, reset);
            if legacy {
                let binds = match binding {
                    None => true,
                    Some((allowed, [_, remaining, _])) => {
                        allowed && (!decision.allowed || left < remaining)
                    }
                };
                if binds {
                    binding = Some((decision.allowed, [decision.limit, left, reset]));
                }
            }
            if !decision.allowed {
                violated.push(report.name.to_owned());
                retry_after = retry_after.max(decision.retry_after_secs());
            }
        }
        let kind = if !violated.is_empty() {
            AnswerKind::Limited
        } else if failed {
            AnswerKind::Failed
        } else if closed {
            AnswerKind::Closed
        } else if unavailable {
            AnswerKind::Unavailable
        } else {
            AnswerKind::Allowed
        };
        let retry_after = match kind {
            AnswerKind::Limited if never => None,
            AnswerKind::Limited | AnswerKind::Closed | AnswerKind::Unavailable => {
                Some(retry_after.max(1))
            }
            AnswerKind::Allowed | AnswerKind::Failed => None,
        };
        let policy = policy.build();
        Answer {
            kind,
            // Only printable ASCII was written.
            limit: policy
                .is_some()
                .then(|| HeaderValue::from_str(buffer).ok())
                .flatten(),
            policy,
            legacy: binding.map(|(_, fields)| fields),
            fallback,
            retry_after,
            violated,
        }
    }

    /// What the answer says.
    pub fn kind(&self) -> AnswerKind {
        self.kind
    }

    /// Whether the request may go through.
    pub fn allowed(&self) -> bool {
        self.kind == AnswerKind::Allowed
    }

    /// `Retry-After` in whole seconds (at least 1), when the request is refused for a reason
    /// that passes: a limit or a store that is away.
    pub fn retry_after_secs(&self) -> Option<u64> {
        self.retry_after
    }

    /// The fail mode that decided part of the answer (`Flowgate-Fallback`), if any.
    pub fn fallback(&self) -> Option<FailMode> {
        self.fallback
    }

    /// The names of the enforced limits that denied.
    pub fn violated(&self) -> &[String] {
        &self.violated
    }

    /// Every header the answer sets, in a fixed order: `RateLimit-Policy`, `RateLimit`, the
    /// legacy fields, `Flowgate-Fallback`, and for a refusal `Retry-After` and
    /// `Cache-Control: no-store`. What the gateway and the layer add to responses, and what the
    /// service sends Envoy in `response_headers_to_add`.
    pub fn headers(&self) -> impl Iterator<Item = (&'static HeaderName, HeaderValue)> + use<> {
        self.clone().into_headers()
    }

    /// [`headers`](Self::headers), moving the values out rather than sharing them (sharing a
    /// header value's bytes the first time allocates).
    pub fn into_headers(self) -> impl Iterator<Item = (&'static HeaderName, HeaderValue)> {
        let mut all = Vec::with_capacity(8);
        self.each_header(|name, value, _| all.push((name, value)));
        all.into_iter()
    }

    /// Hands every header to `f` in order, with whether it adds to a field of that name already
    /// there (the `RateLimit` fields: another layer may have set its own) or replaces it.
    #[inline(always)]
    fn each_header(self, mut f: impl FnMut(&'static HeaderName, HeaderValue, bool)) {
        if let Some(v) = self.policy {
            f(&RATELIMIT_POLICY, v, true);
        }
        if let Some(v) = self.limit {
            f(&RATELIMIT, v, true);
        }
        if let Some([limit, remaining, reset]) = self.legacy {
            f(&X_RATELIMIT_LIMIT, HeaderValue::from(limit), false);
            f(&X_RATELIMIT_REMAINING, HeaderValue::from(remaining), false);
            f(&X_RATELIMIT_RESET, HeaderValue::from(reset), false);
        }
        if let Some(mode) = self.fallback {
            f(
                &FLOWGATE_FALLBACK,
                HeaderValue::from_static(mode.name()),
                false,
            );
        }
        if let Some(secs) = self.retry_after {
            f(&RETRY_AFTER, HeaderValue::from(secs), false);
        }
        if self.kind != AnswerKind::Allowed {
            f(&CACHE_CONTROL, HeaderValue::from_static("no-store"), false);
        }
    }

    /// The value of one of [`headers`](Self::headers) by (lower-case) name, as text.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers()
            .find(|(n, _)| n.as_str() == name)
            .and_then(|(_, v)| v.to_str().ok().map(str::to_owned))
    }

    /// Adds [`headers`](Self::headers) to `headers`: the `RateLimit` items after any already
    /// there (another layer's), the rest replacing what was there.
    pub fn apply(self, headers: &mut HeaderMap) {
        self.each_header(|name, value, append| {
            if append {
                headers.append(name.clone(), value);
            } else {
                headers.insert(name.clone(), value);
            }
        });
    }

    /// The problem that refuses the request; `None` when it is allowed.
    pub fn problem(&self) -> Option<Problem> {
        problem_for(self.kind, self.violated.clone(), self.retry_after)
    }

    /// For decision APIs that answer limited requests with their own body (the service's
    /// `/json` and `/v1/check`): `Ok(self)` when the limits decided — allowed, limited or
    /// closed — and `Err` with the 503/500 problem response when a store could not answer and
    /// no fail mode decided.
    pub fn decided(self) -> Result<Answer, Box<Response<Bytes>>> {
        match self.kind {
            AnswerKind::Unavailable | AnswerKind::Failed => match self.render(false) {
                Rendered::Refuse(response) => Err(Box::new(response)),
                Rendered::Pass(answer) => Ok(answer),
            },
            _ => Ok(self),
        }
    }

    /// The answer for the protocol at hand: [`Rendered::Pass`] with the fields for the
    /// passing response, or [`Rendered::Refuse`] with the response that refuses the request —
    /// problem+json, or a gRPC status when `grpc` — carrying [`headers`](Self::headers).
    pub fn render(self, grpc: bool) -> Rendered {
        let Answer {
            kind,
            policy,
            limit,
            legacy,
            fallback,
            retry_after,
            violated,
        } = self;
        let Some(problem) = problem_for(kind, violated, retry_after) else {
            return Rendered::Pass(Answer {
                kind,
                policy,
                limit,
                legacy,
                fallback,
                retry_after,
                violated: Vec::new(),
            });
        };
        let mut response = if grpc {
            problem.into_grpc_response()
        } else {
            problem.into_response()
        };
        let fields = Answer {
            kind,
            policy,
            limit,
            legacy,
            fallback,
            retry_after,
            violated: Vec::new(),
        };
        let headers = response.headers_mut();
        fields.each_header(|name, value, append| {
            if append {
                headers.append(name.clone(), value);
            } else if grpc || name != CACHE_CONTROL {
                // A problem+json response says `no-store` already.
                headers.insert(name.clone(), value);
            }
        });
        Rendered::Refuse(response)
    }
}

/// The problem for an answer of `kind`; `None` when it allows.
fn problem_for(
    kind: AnswerKind,
    violated: Vec<String>,
    retry_after: Option<u64>,
) -> Option<Problem> {
    Some(match kind {
        AnswerKind::Allowed => return None,
        AnswerKind::Limited => Problem::quota_exceeded(violated, retry_after),
        AnswerKind::Failed => Problem::status(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the rate-limit store failed",
        ),
        AnswerKind::Closed | AnswerKind::Unavailable => Problem::status(
            StatusCode::SERVICE_UNAVAILABLE,
            "the rate-limit store is unavailable",
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::answer::headers::{limit_item, policy_item, policy_item_value};
    use crate::quota::{InsufficientCapacity, Quota};
    use proptest::prelude::any;
    use std::time::Duration;

    fn decision(allowed: bool, remaining: u64, reset_ms: u64, retry_ms: u64) -> Decision {
        Decision {
            allowed,
            limit: 10,
            burst: 10,
            remaining,
            reset_after: Duration::from_millis(reset_ms),
            retry_after: Duration::from_millis(retry_ms),
            fallback: None,
        }
    }

    fn answer(items: &[(&str, bool, Result<Decision, StoreError>)], legacy: bool) -> Answer {
        let quota = Quota::per_second(10);
        let values: Vec<HeaderValue> = items
            .iter()
            .map(|(name, ..)| policy_item_value(name, &quota))
            .collect();
        Answer::new(
            items
                .iter()
                .zip(&values)
                .map(|((name, enforced, result), item)| {
                    LimitReport::new(name, item, *enforced, result)
                }),
            legacy,
        )
    }

    #[test]
    fn precedence_retry_after_and_markers() {
        let ok = Ok(decision(true, 3, 500, 0));
        let denied = Ok(decision(false, 0, 2_500, 2_100));
        let unavailable = Err(StoreError::Unavailable("down".into()));
        let broken = Err(StoreError::Backend("WRONGTYPE".into()));
        let closed = Ok(Decision::deny(&Quota::per_second(10), 0, 0, 200_000_000)
            .with_fallback(FailMode::Closed));
        let open = Ok(Decision::allow(&Quota::per_second(10), 9, 0).with_fallback(FailMode::Open));
        let local = Ok(decision(true, 1, 100, 0).with_fallback(FailMode::Local));

        let a = answer(
            &[("a", true, ok.clone()), ("b", true, denied.clone())],
            false,
        );
        assert_eq!(a.kind(), AnswerKind::Limited);
        assert_eq!(a.retry_after_secs(), Some(3));
        assert_eq!(a.violated(), ["b"]);
        assert_eq!(
            a.header("ratelimit").unwrap(),
            r#""a";r=3;t=1, "b";r=0;t=3"#
        );
        assert_eq!(a.header("cache-control").unwrap(), "no-store");
        // A denial beats a broken or absent store.
        let denied_again = denied.clone();
        let a = answer(&[("a", true, broken.clone()), ("b", true, denied)], false);
        assert_eq!(a.kind(), AnswerKind::Limited);
        let a = answer(
            &[("a", true, broken), ("b", true, unavailable.clone())],
            false,
        );
        assert_eq!((a.kind(), a.retry_after_secs()), (AnswerKind::Failed, None));
        let a = answer(&[("a", true, unavailable.clone())], false);
        assert_eq!(
            (a.kind(), a.retry_after_secs()),
            (AnswerKind::Unavailable, Some(1))
        );
        let a = answer(&[("a", true, closed), ("b", true, local.clone())], false);
        assert_eq!(a.kind(), AnswerKind::Closed);
        assert_eq!(a.header("flowgate-fallback").unwrap(), "closed");
        assert_eq!(a.header("ratelimit").unwrap(), r#""b";r=1;t=1"#);
        let a = answer(&[("a", true, open), ("b", true, local)], false);
        assert_eq!(a.kind(), AnswerKind::Allowed);
        assert_eq!(a.header("flowgate-fallback").unwrap(), "open");
        assert!(a.header("retry-after").is_none() && a.header("cache-control").is_none());
        // Shadow limits appear nowhere; a cost that can never fit is a denial.
        let a = answer(&[("s", false, unavailable), ("a", true, ok)], false);
        assert_eq!(a.kind(), AnswerKind::Allowed);
        assert_eq!(a.header("ratelimit-policy").unwrap(), r#""a";q=10;w=1"#);
        let never = Err(StoreError::Capacity(InsufficientCapacity {
            cost: 20,
            capacity: 10,
        }));
        let a = answer(&[("a", true, never.clone())], false);
        assert_eq!(
            (a.kind(), a.retry_after_secs()),
            (AnswerKind::Limited, None)
        );
        assert!(a.header("ratelimit").is_none() && a.header("retry-after").is_none());
        assert_eq!(a.header("cache-control").unwrap(), "no-store");
        // With another limit denying too, waiting still never helps.
        let a = answer(&[("a", true, never), ("b", true, denied_again)], false);
        assert_eq!(
            (a.kind(), a.retry_after_secs()),
            (AnswerKind::Limited, None)
        );
        assert_eq!(a.violated(), ["a", "b"]);
    }

    /// A calendar month that renews in 12 days: `t` and `Retry-After` in whole seconds
    /// rounded up (a million and more), `w` the month's nominal 30 days.
    #[cfg(feature = "calendar")]
    #[test]
    fn a_quota_that_renews_in_twelve_days() {
        use crate::algorithm::{FixedWindow, State};
        use crate::calendar::{Calendar, CalendarUnit};
        let quota = Quota::per_calendar(10_000, Calendar::utc(CalendarUnit::Month)).unwrap();
        // 2028-02-18T00:00:00.5Z: 12 days less half a second to 1 March.
        let now = 1_834_444_800_500_000_000;
        let mut state = FixedWindow::default();
        let taken = state.check(&quota, 10_000, now);
        assert_eq!(
            taken.reset_after,
            Duration::from_millis(12 * 86_400_000 - 500)
        );
        let denied = Ok(state.check(&quota, 1, now));
        let item = policy_item_value("monthly", &quota);
        let a = Answer::new([LimitReport::new("monthly", &item, true, &denied)], true);
        assert_eq!(a.kind(), AnswerKind::Limited);
        assert_eq!(a.retry_after_secs(), Some(1_036_800));
        assert_eq!(a.header("retry-after").unwrap(), "1036800");
        assert_eq!(a.header("ratelimit").unwrap(), r#""monthly";r=0;t=1036800"#);
        assert_eq!(
            a.header("ratelimit-policy").unwrap(),
            r#""monthly";q=10000;w=2592000"#
        );
        assert_eq!(a.header("x-ratelimit-reset").unwrap(), "1036800");
    }

    #[test]
    fn blocklists_are_reported_as_a_quota_of_zero() {
        let item = headers::blocked_policy_item_value("banned", Duration::from_secs(60));
        let a = Answer::new(
            [LimitReport::blocked(
                "banned",
                &item,
                true,
                Duration::from_secs(60),
            )],
            true,
        );
        assert_eq!(a.kind(), AnswerKind::Limited);
        assert_eq!(
            a.header("ratelimit-policy").unwrap(),
            r#""banned";q=0;w=60"#
        );
        assert_eq!(a.header("ratelimit").unwrap(), r#""banned";r=0;t=60"#);
        assert_eq!(a.header("retry-after").unwrap(), "60");
        assert_eq!(a.header("x-ratelimit-limit").unwrap(), "0");
    }

    proptest::proptest! {
        /// The answer's fields are what formatting each limit on its own and joining gives, and
        /// the legacy fields show the binding limit.
        #[test]
        fn fields_are_the_items_joined_and_legacy_shows_the_binding_limit(
            limits in proptest::collection::vec(
                // Names that need escaping too (quotes, backslashes, `;q=`, non-ASCII).
                ("[A-Za-z0-9._/ \"\\\\;=qé-]{1,12}", 1u64..1_000, 1u64..100_000, any::<bool>(), 0u64..1_000,
                 0u64..10_000_000, 0u64..10_000_000),
                1..5,
            ),
        ) {
            let quotas: Vec<Quota> = limits
                .iter()
                .map(|l| Quota::new(l.1, Duration::from_millis(l.2)).unwrap())
                .collect();
            let results: Vec<Result<Decision, StoreError>> = limits
                .iter()
                .map(|l| Ok(Decision {
                    allowed: l.3,
                    limit: l.1,
                    burst: l.1,
                    remaining: l.4,
                    reset_after: Duration::from_micros(l.5),
                    retry_after: Duration::from_micros(l.6),
                    fallback: None,
                }))
                .collect();
            let items: Vec<HeaderValue> = limits
                .iter()
                .zip(&quotas)
                .map(|(l, q)| policy_item_value(&l.0, q))
                .collect();
            let a = Answer::new(
                limits.iter().zip(&items).zip(&results).map(|((l, item), result)| {
                    LimitReport::new(&l.0, item, true, result)
                }),
                true,
            );
            let join = |parts: Vec<String>| parts.join(", ");
            proptest::prop_assert_eq!(
                a.header("ratelimit-policy").unwrap(),
                join(limits.iter().zip(&quotas).map(|(l, q)| policy_item(&l.0, q)).collect())
            );
            let decisions: Vec<&Decision> = results.iter().map(|r| r.as_ref().unwrap()).collect();
            proptest::prop_assert_eq!(
                a.header("ratelimit").unwrap(),
                join(limits.iter().zip(&decisions).map(|(l, d)| limit_item(&l.0, d)).collect())
            );
            let binding = decisions
                .iter()
                .find(|d| !d.allowed)
                .or_else(|| decisions.iter().min_by_key(|d| headers::remaining(d)))
                .unwrap();
            proptest::prop_assert_eq!(a.header("x-ratelimit-remaining").unwrap(), headers::remaining(binding).to_string());
            proptest::prop_assert_eq!(a.header("x-ratelimit-reset").unwrap(), reset_secs(binding).to_string());
            let denied: Vec<&&Decision> = decisions.iter().filter(|d| !d.allowed).collect();
            if denied.is_empty() {
                proptest::prop_assert_eq!(a.kind(), AnswerKind::Allowed);
            } else {
                let secs = denied.iter().map(|d| d.retry_after_secs()).max().unwrap().max(1);
                proptest::prop_assert_eq!(a.retry_after_secs(), Some(secs));
            }
        }
    }
}
