//! The gateway: a streaming, rate-limiting HTTP reverse proxy (`flowgate serve --upstream
//! URL`).
//!
//! Each request is turned into descriptors by the running configuration's `gateway` section
//! ([`GatewayConfig`]) and checked with [`envoy::check`](flowgate::envoy::check) against the
//! live policy and store — the same matching, counters and metrics as the gRPC and HTTP APIs,
//! so reloads apply at once — and answered by the same renderer
//! ([`Active::answer`](crate::api::Active::answer)). Then:
//!
//! * with `in_flight`: a lease of each named `concurrency` limit is taken first, held until
//!   the response body ends and renewed while it streams; a full limit answers `429` with
//!   `Retry-After` before the rate limit is asked ([`in_flight`]);
//! * over a limit: `429` with `RateLimit-Policy`, `RateLimit`, `Retry-After` (whole seconds,
//!   rounded up, never 0), `Cache-Control: no-store` and an `application/problem+json` body;
//!   the request body is not read and nothing reaches the upstream;
//! * the shared store away (`--redis`): each rule's `fail` mode, applied by the store's
//!   fallback — `open` forwards (`Flowgate-Fallback: open`), `local` decides with this
//!   instance's share (`Flowgate-Fallback: local`), `closed` answers `503` with `Retry-After`
//!   (`Flowgate-Fallback: closed`); a store error no mode handled is `503` too;
//! * allowed: the request is forwarded with its method, path (normalised as it was keyed: dot
//!   segments removed, slashes merged, unreserved escapes decoded), query, headers and body,
//!   minus the hop-by-hop fields and plus `X-Forwarded-For`, `Forwarded` and `Via` (a client's
//!   own `X-Forwarded-For`/`Forwarded` replaced unless it is a trusted proxy or the section says
//!   `forwarded: append`); bodies stream both ways without buffering; the upstream's response
//!   gets the `RateLimit` headers;
//! * with `usage_header` (e.g. `x-usage-tokens`) or `usage_json` (a JSON pointer, e.g.
//!   `/usage/total_tokens`): descriptors whose rule has `charge: true` are checked with 0
//!   units (refused while the limit is in debt), and charged the units the upstream reports —
//!   the header's when the response head arrives, before the head is passed on; else the
//!   body's field, read as the body streams past (JSON or server-sent events) and charged when
//!   it ends ([`usage`]; usage that happened: always taken, into debt past the limit; see
//!   docs/service.md and docs/llm-token-budgets.md);
//! * upstream unreachable or broken: `502`; no response head within `upstream_timeout` of the
//!   upstream's silence: `504` (generic problem bodies: the upstream's address and the error
//!   are logged, never sent); the client's body stalled: `408`, malformed or cut short: `400`.
//!
//! The gateway speaks HTTP/1.1 to clients (hyper's server) and to the upstream (pooled
//! keep-alive connections, HTTP/1.1 written and read by `h1.rs` on `httparse`).
//! Upgrades are not proxied here (`Upgrade` is hop-by-hop and removed): WebSocket connections
//! go to the WebSocket gateway ([`ws`]), on its own listener.

// Public (hidden) for the fuzz targets, `flowgate_testing::fuzzing`.
#[doc(hidden)]
pub mod descriptors;
#[doc(hidden)]
pub mod forward;
#[doc(hidden)]
pub mod h1;
mod idle;
pub mod in_flight;
#[doc(hidden)]
pub mod path;
mod pool;
mod upstream;
pub mod usage;
pub mod ws;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use flowgate::answer::problem::Problem;
use flowgate::answer::{Answer, AnswerKind, Rendered};
use flowgate::http::key::PeerAddr;
use http::{Request, Response, StatusCode};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};

pub use upstream::{Upstream, UpstreamError};

use crate::api::Service;
use crate::config::gateway::{Forwarded, GatewayConfig};
use crate::config::{DEFAULT_POLICY_NAME, Policy};
use crate::listen::Acceptor;
use crate::metrics::{Api, GatewayOutcome};

pub use idle::{IdleBody, IdleError};
pub use in_flight::{Lease, LeasedBody};
pub use pool::UpstreamBody;
pub use usage::UsageBody;

/// The response body: the upstream's, streamed (given up when it stalls for
/// `body_idle_timeout`; its usage read on the way, with `usage_json`; holding the request's
/// in-flight leases until it ends, with `in_flight`), or one the gateway wrote.
///
/// The upstream's is boxed: it holds the upstream connection (a few hundred bytes), and the
/// response is moved a dozen times on its way out through hyper's dispatcher — copies every
/// response paid, a refused one too, when the body was inline (callgrind, BENCHMARKS.md).
pub type Body = Either<Pin<Box<LeasedBody<UsageBody<IdleBody<UpstreamBody>>>>>, Full<Bytes>>;

/// The gateway's state, shared by every connection.
pub struct Gateway {
    /// The policy, store and metrics, shared with the APIs.
    service: Arc<Service>,
    /// Where allowed requests go.
    upstream: Upstream,
    /// Keep-alive connections to the upstream.
    pool: pool::Pool,
    /// The pool's and the bodies' metrics (held, not fetched per request: each is shared).
    upstream_metrics: crate::metrics::UpstreamMetrics,
    /// The section used while the running configuration has none.
    fallback: GatewayConfig,
    /// Whether each request is logged (`--access-log`).
    access_log: bool,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("upstream", &self.upstream)
            .finish_non_exhaustive()
    }
}

/// The `gateway` section `policy` implies: its own, or — when no file has one — one
/// descriptor `[remote_address]` against the only domain. With several domains and no section
/// there is no telling which domain is meant, which is an error.
pub fn effective_config(policy: &Policy) -> Result<GatewayConfig, String> {
    if let Some(config) = &policy.gateway {
        return Ok(config.clone());
    }
    let mut domains = policy.rules.domains();
    match (domains.next(), domains.next()) {
        (Some(domain), None) => Ok(GatewayConfig::default_for(domain)),
        (None, _) => Ok(GatewayConfig::default_for("default")),
        (Some(_), Some(_)) => Err(format!(
            "--upstream needs a `gateway` section in one of the configuration files ({}) to know which domain to check requests against",
            if policy.files.is_empty() {
                DEFAULT_POLICY_NAME.to_owned()
            } else {
                policy
                    .files
                    .iter()
                    .map(|f| f.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        )),
    }
}

impl Gateway {
    /// A gateway forwarding to `upstream`, deciding with `service`. `fallback` is the section
    /// used while the running configuration has none (see [`effective_config`]).
    pub fn new(service: Arc<Service>, upstream: Upstream, fallback: GatewayConfig) -> Self {
        let limits = pool::PoolLimits {
            connect_timeout: fallback.upstream_timeout,
            max_connections: fallback.upstream_max_connections,
            queue_timeout: fallback.upstream_queue_timeout,
        };
        let upstream_metrics = service.metrics().upstream();
        let pool = pool::Pool::new(&upstream, limits, upstream_metrics.clone());
        Gateway {
            service,
            pool,
            upstream_metrics,
            upstream,
            fallback,
            access_log: false,
        }
    }

    /// Logs every request (target `flowgate::access`, at `info`): peer, method, path without
    /// the query (which may hold tokens), status and the time to the response head.
    pub fn with_access_log(mut self, on: bool) -> Self {
        self.access_log = on;
        self
    }

    /// The first half of answering a request from `peer` (the second is
    /// [`finish`](Self::finish)): everything that needs the request's head, done at once —
    /// called where hyper hands the request over, before its future is first polled. The
    /// head's fields are slices of hyper's read buffer, and hyper, as soon as it has handed a
    /// request over, reads ahead on the connection (to notice a client that goes away): while
    /// the head is alive, that read needs a new 8 KiB buffer; once it is let go, the buffer is
    /// reused. So here the request is checked and keyed, decided when the store answers at
    /// once (a refusal is answered without more), and written as the upstream gets it; its
    /// head is dropped, and what is left is owned.
    pub fn prepare(&self, peer: SocketAddr, request: Request<Incoming>) -> Prepared {
        let log = self.access_log.then(|| AccessLog {
            started: std::time::Instant::now(),
            method: request.method().clone(),
            path: request.uri().path().to_owned(),
            peer,
        });
        Prepared {
            step: self.take_apart(peer, request),
            log,
        }
    }

    /// Decides a [`prepare`](Self::prepare)d request and forwards it, or answers for it.
    pub async fn finish(&self, prepared: Prepared) -> Response<Body> {
        let response = match prepared.step {
            Step::Answered(response) => response,
            // Boxed: the less common path (in-flight leases, a store that must be waited for),
            // whose future would otherwise make every request's larger — hyper copies it.
            Step::Decide(undecided) => Box::pin(self.decide(undecided)).await,
            // Boxed: the exchange with the upstream is most of this future's size, and the
            // future is moved several times on its way into the connection's task (memcpy,
            // measured with callgrind); an allocation costs less (see `forward` for its size),
            // and a refused request does not make it.
            Step::Forward(allowed) => Box::pin(self.forward(allowed)).await,
        };
        if let Some(log) = prepared.log {
            tracing::info!(
                target: "flowgate::access",
                peer = %log.peer,
                method = %log.method,
                path = log.path,
                status = response.status().as_u16(),
                head_ms = log.started.elapsed().as_secs_f64() * 1000.0,
                "request"
            );
        }
        response
    }

    /// The request checked, keyed, decided when the store answers at once, and its upstream
    /// head written; or the answer to a request that is malformed, cannot be keyed or is
    /// refused.
    fn take_apart(&self, peer: SocketAddr, request: Request<Incoming>) -> Step {
        let (mut parts, body) = request.into_parts();
        if parts.method == http::Method::CONNECT {
            return Step::Answered(self.problem(
                GatewayOutcome::Rejected,
                Problem::status(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "the gateway is a reverse proxy; CONNECT tunnels are not supported",
                ),
            ));
        }
        if let Err((status, detail)) = forward::check_host(&mut parts) {
            return Step::Answered(
                self.problem(GatewayOutcome::Rejected, Problem::status(status, detail)),
            );
        }
        // Keyed and forwarded alike: the upstream sees the path the limits saw.
        path::normalise_uri(&mut parts.uri);

        let active = self.service.active();
        let config = active.policy.gateway.as_ref().unwrap_or(&self.fallback);
        if descriptors::need_peer(config) || in_flight::need_peer(config) {
            // For the client-address source (an allocation the other sources do without).
            parts.extensions.insert(PeerAddr(peer));
        }
        let mut descriptors = match descriptors::of_request(config, &parts) {
            Ok(descriptors) => descriptors,
            Err(rejection) => {
                return Step::Answered(self.problem(
                    GatewayOutcome::Rejected,
                    Problem::status(rejection.status, rejection.detail),
                ));
            }
        };
        let in_flight = match in_flight::keys(config, &parts) {
            Ok(keys) => keys,
            Err(rejection) => {
                return Step::Answered(
                    self.refuse_in_flight(in_flight::Refusal::Rejected(rejection)),
                );
            }
        };
        let usage = self.usage(&active, config, &mut descriptors).map(Box::new);
        // Decided here when it can be — no in-flight lease to take first, and a store that
        // answers at once: a refused request is answered without its upstream head written.
        // With a store that must be waited for (Redis), the request's limits are resolved and
        // its key written here and again in `decide`: the price of not knowing in advance
        // (a fallback store answers at once while its shared store is away).
        let mut answer = None;
        if in_flight.is_empty() && !descriptors.is_empty() {
            let now =
                self.service
                    .decide_now(&active, Api::Gateway, &config.domain, &descriptors, 1);
            if let Some(verdict) = now {
                let decided = active.answer(&verdict);
                if !decided.allowed() {
                    return Step::Answered(self.refuse(decided));
                }
                answer = Some(decided);
            }
        }
        // Nothing left to decide: no lease to take, and the rate limits answered (or are none).
        let decided = in_flight.is_empty() && (descriptors.is_empty() || answer.is_some());
        let keep_earlier =
            config.forwarded == Forwarded::Append || config.client_ip.is_trusted(peer.ip());
        let timeouts = Timeouts {
            response_head: config.upstream_timeout,
            body_idle: config.body_idle_timeout,
        };
        forward::remove_hop_by_hop(&mut parts.headers);
        let head = self.pool.head(
            &parts,
            &forward::Hop::new(peer.ip(), keep_earlier),
            !http_body::Body::is_end_stream(&body),
        );
        let allowed = Allowed {
            on_head: OnHead {
                answer,
                usage,
                lease: None,
            },
            timeouts,
            head,
            body,
        };
        if decided {
            return Step::Forward(allowed);
        }
        Step::Decide(Box::new(Undecided {
            active,
            descriptors,
            in_flight,
            allowed,
        }))
    }

    /// Takes the in-flight leases and asks the rate limits; forwards what they allow.
    async fn decide(&self, undecided: Box<Undecided>) -> Response<Body> {
        let Undecided {
            active,
            descriptors,
            in_flight,
            mut allowed,
        } = *undecided;
        let config = active.policy.gateway.as_ref().unwrap_or(&self.fallback);
        // In-flight leases first (see `in_flight`: no rate-limit unit is spent on a request
        // refused for concurrency).
        let held = if in_flight.is_empty() {
            None
        } else {
            match in_flight::acquire(&self.service, config, in_flight).await {
                Ok(held) => Some(held),
                Err(refusal) => return self.refuse_in_flight(refusal),
            }
        };
        if !descriptors.is_empty() {
            let verdict = self
                .service
                .decide(&active, Api::Gateway, &config.domain, &descriptors, 1)
                .await;
            let decided = active.answer(&verdict);
            if !decided.allowed() {
                if let Some(held) = held {
                    // Refused by the rate limit: it holds no lease once the client sees it.
                    held.give_back().await;
                }
                return self.refuse(decided);
            }
            allowed.on_head.answer = Some(decided);
        }
        allowed.on_head.lease = held.and_then(in_flight::Held::keep);
        drop(active);
        // Boxed: see `finish`.
        Box::pin(self.forward(allowed)).await
    }

    /// With a `usage_header` or `usage_json`, the descriptors whose rule charges
    /// (`charge: true`): they are checked with 0 units now (refused while in debt) and charged
    /// the units the upstream reports.
    fn usage(
        &self,
        active: &crate::api::Active,
        config: &GatewayConfig,
        descriptors: &mut [flowgate::envoy::Descriptor],
    ) -> Option<usage::Usage> {
        if config.usage_header.is_none() && config.usage_json.is_none() {
            return None;
        }
        let rules = active.policy.rules.domain(&config.domain)?;
        let mut charged = Vec::new();
        for d in descriptors.iter_mut() {
            if rules.find_limits(&d.entries).iter().any(|rule| rule.charge) {
                d.hits_addend = Some(0);
                charged.push(d.clone());
            }
        }
        (!charged.is_empty()).then(|| usage::Usage {
            header: config.usage_header.clone(),
            json: config.usage_json.as_deref().map(Arc::from),
            charge: usage::Charge {
                service: self.service.clone(),
                domain: config.domain.clone(),
                descriptors: charged,
            },
        })
    }

    /// The 429 (or 503, 500) an answer that does not allow stands for.
    fn refuse(&self, answer: Answer) -> Response<Body> {
        let outcome = match answer.kind() {
            AnswerKind::Limited => GatewayOutcome::Limited,
            _ => GatewayOutcome::Unavailable,
        };
        self.service.metrics().gateway_response(outcome);
        match answer.render(false) {
            Rendered::Refuse(response) => response.map(|b| Either::Right(Full::new(b))),
            // Only answers that do not allow are refused here.
            Rendered::Pass(_) => self.problem(
                GatewayOutcome::Unavailable,
                Problem::status(StatusCode::INTERNAL_SERVER_ERROR, "no refusal"),
            ),
        }
    }

    /// A problem response, counted under `outcome`. A malformed request (`Rejected`) also
    /// closes its connection: whatever the client pipelined after it is not trusted to be
    /// framed as it meant (nginx does the same after a 400).
    fn problem(&self, outcome: GatewayOutcome, problem: Problem) -> Response<Body> {
        self.service.metrics().gateway_response(outcome);
        let mut response = problem.into_response().map(|b| Either::Right(Full::new(b)));
        if outcome == GatewayOutcome::Rejected {
            response.headers_mut().insert(
                http::header::CONNECTION,
                http::HeaderValue::from_static("close"),
            );
        }
        response
    }

    /// Sends an allowed request (its head written by [`take_apart`](Self::take_apart)) upstream
    /// and streams the response back with the answer's fields added.
    ///
    /// Not an `async fn`: one would keep `allowed` twice (as given and as moved into its
    /// body). This future is boxed for every forwarded request, and it is kept below 1,032
    /// bytes (968 in a release build, `RUSTFLAGS=-Zprint-type-sizes`): up to that size glibc
    /// serves an allocation from its per-thread cache, ≈ 50 instructions, and past it ≈ 440
    /// for `malloc` and 200 for `free` (callgrind).
    fn forward(&self, allowed: Allowed) -> impl Future<Output = Response<Body>> + Send + '_ {
        // Taken apart before the future is made, so that it holds each part once.
        let Allowed {
            on_head,
            timeouts,
            head,
            body,
        } = allowed;
        let metrics = &self.upstream_metrics;
        // A body still to come reports its progress: while the gateway waits on the client,
        // the upstream is not late.
        let progress =
            (!http_body::Body::is_end_stream(&body)).then(|| Arc::new(idle::Progress::default()));
        let body = IdleBody::new(
            body,
            timeouts.body_idle,
            metrics.request_body_timeouts.clone(),
        )
        .with_progress(progress.clone());
        async move {
            let timeout = timeouts.response_head;
            let response = {
                // Boxed apart from this future: together they would pass 1,032 bytes (see
                // above), and two boxes below it cost less than one above. In a block of its
                // own, so that it is not kept beside what follows.
                let mut sent = Box::pin(self.pool.send(&head, body));
                upstream_within(timeout, progress.as_deref(), sent.as_mut()).await
            };
            let response = match response {
                Some(Ok(response)) => response,
                Some(Err(e)) => return self.failed(e),
                None => {
                    tracing::warn!(
                        upstream = %self.upstream,
                        "upstream did not answer within {}",
                        humantime::format_duration(timeout)
                    );
                    return self.problem(
                        GatewayOutcome::GatewayTimeout,
                        Problem::status(
                            StatusCode::GATEWAY_TIMEOUT,
                            "the upstream did not answer in time",
                        ),
                    );
                }
            };
            let (mut parts, body) = response.into_parts();
            // The gateway's own version towards the client (hyper downgrades for HTTP/1.0
            // clients); an HTTP/1.0 upstream must not turn off keep-alive to the client.
            parts.version = http::Version::HTTP_11;
            forward::remove_hop_by_hop(&mut parts.headers);
            let scan = match on_head.usage {
                // Boxed: charging is most of this future's size, and only some gateways charge.
                Some(usage) => Box::pin((*usage).on_head(parts.status, &parts.headers)).await,
                None => None,
            };
            if let Some(answer) = on_head.answer {
                answer.apply(&mut parts.headers);
            }
            self.service
                .metrics()
                .gateway_response(GatewayOutcome::Forwarded);
            let body = IdleBody::new(
                body,
                timeouts.body_idle,
                metrics.response_body_timeouts.clone(),
            );
            let body = LeasedBody::new(UsageBody::new(body, scan), on_head.lease);
            Response::from_parts(parts, Either::Left(Box::pin(body)))
        }
    }

    /// The answer to a request the in-flight limits do not admit.
    fn refuse_in_flight(&self, refusal: in_flight::Refusal) -> Response<Body> {
        let outcome = match &refusal {
            in_flight::Refusal::Rejected(_) => GatewayOutcome::Rejected,
            in_flight::Refusal::Full { .. } => GatewayOutcome::InFlightLimited,
            in_flight::Refusal::Unavailable => GatewayOutcome::Unavailable,
        };
        self.service.metrics().gateway_response(outcome);
        let mut response = refusal.into_response().map(|b| Either::Right(Full::new(b)));
        if outcome == GatewayOutcome::Rejected {
            response.headers_mut().insert(
                http::header::CONNECTION,
                http::HeaderValue::from_static("close"),
            );
        }
        response
    }
}

impl Gateway {
    /// The answer to an exchange with the upstream that failed: the client's fault (its body
    /// stalled: 408; it was malformed or cut short: 400) or the upstream's (busy: 503;
    /// unreachable or broken: 502). Only the upstream's failures are logged as such and
    /// counted against it.
    fn failed(&self, error: pool::SendError) -> Response<Body> {
        let (outcome, status, detail) = match &error {
            pool::SendError::Body(IdleError::Idle(_)) => (
                GatewayOutcome::Rejected,
                StatusCode::REQUEST_TIMEOUT,
                "the request body stalled",
            ),
            pool::SendError::Body(IdleError::Body(_)) => (
                GatewayOutcome::Rejected,
                StatusCode::BAD_REQUEST,
                "the request body is malformed or was cut short",
            ),
            pool::SendError::Upstream(_) => (
                GatewayOutcome::BadGateway,
                StatusCode::BAD_GATEWAY,
                "the upstream failed to answer",
            ),
            pool::SendError::Busy(_) => (
                GatewayOutcome::Unavailable,
                StatusCode::SERVICE_UNAVAILABLE,
                "the upstream is busy; retry later",
            ),
            pool::SendError::Connect(_) => (
                GatewayOutcome::BadGateway,
                StatusCode::BAD_GATEWAY,
                "the upstream could not be reached",
            ),
        };
        // Clients get a generic problem; what failed, and where, goes to the log only.
        if outcome == GatewayOutcome::Rejected {
            tracing::debug!(upstream = %self.upstream, "request body failed: {error}");
        } else {
            tracing::warn!(upstream = %self.upstream, "upstream request failed: {error}");
        }
        self.problem(outcome, Problem::status(status, detail))
    }
}

/// `exchange` (the upstream's response head), or `None` when the upstream stays silent for
/// `timeout`. Time spent waiting for the client does not count: when the timeout expires while
/// the request body (`progress`) waits on the client, or after it moved on, it is re-armed —
/// a stalled upload is `body_idle_timeout`'s to answer (408), not a late upstream's (504).
///
/// Not an `async fn`, which would keep its arguments twice (as given and as moved into its
/// body) in the forward future — whose size is kept below 1,032 bytes (see `Gateway::forward`).
#[allow(clippy::manual_async_fn)]
fn upstream_within<'a, F: Future>(
    timeout: Duration,
    progress: Option<&'a idle::Progress>,
    mut exchange: std::pin::Pin<&'a mut F>,
) -> impl Future<Output = Option<F::Output>> + 'a {
    async move {
        let mut seen = progress.map(idle::Progress::frames);
        let mut deadline = std::pin::pin!(tokio::time::sleep(timeout));
        loop {
            tokio::select! {
                biased;
                output = exchange.as_mut() => return Some(output),
                () = deadline.as_mut() => {}
            }
            let progress = progress?;
            let frames = progress.frames();
            if !progress.waiting() && seen == Some(frames) {
                return None;
            }
            seen = Some(frames);
            deadline
                .as_mut()
                .reset(tokio::time::Instant::now() + timeout);
        }
    }
}

/// A request [`Gateway::prepare`] took apart: no longer holding hyper's read buffer.
#[derive(Debug)]
pub struct Prepared {
    /// What is left to do.
    step: Step,
    /// What the access log records, when it is on.
    log: Option<AccessLog>,
}

/// What is left of a request once its head is let go.
// `Forward`, the large variant, is the common one: boxing it would cost every forwarded request
// an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum Step {
    /// Answered already: malformed, not to be keyed, or refused.
    Answered(Response<Body>),
    /// To decide (in-flight leases to take first, or a store that must be waited for), then
    /// to forward if allowed (boxed: not the common case, and large).
    Decide(Box<Undecided>),
    /// Allowed: to forward.
    Forward(Allowed),
}

/// A request still to decide: all it needs, owned.
#[derive(Debug)]
struct Undecided {
    /// The configuration it was keyed under (the same one decides it).
    active: Arc<crate::api::Active>,
    /// Its descriptors.
    descriptors: Vec<flowgate::envoy::Descriptor>,
    /// Its in-flight keys ([`in_flight::keys`]).
    in_flight: Vec<(usize, String)>,
    /// The request, to forward if it is allowed (the answer and leases still to add).
    allowed: Allowed,
}

/// A request to forward.
#[derive(Debug)]
struct Allowed {
    /// What its response head gets.
    on_head: OnHead,
    /// Its time limits.
    timeouts: Timeouts,
    /// Its head as the upstream gets it.
    head: h1::RequestHead,
    /// Its body, still to come from the client.
    body: Incoming,
}

/// One request's line in the access log, begun when its head arrived.
#[derive(Debug)]
struct AccessLog {
    /// When the head was handed over.
    started: std::time::Instant,
    /// The method.
    method: http::Method,
    /// The path, without the query (which may hold tokens).
    path: String,
    /// The client.
    peer: SocketAddr,
}

/// What happens when the upstream's response head arrives.
#[derive(Debug)]
struct OnHead {
    /// The decision whose fields (`RateLimit`, …) the head gets.
    answer: Option<Answer>,
    /// The usage to charge, from the head's `usage_header` or the body's `usage_json` (boxed:
    /// only some gateways charge, and this is carried by every forwarded request's future).
    usage: Option<Box<usage::Usage>>,
    /// The request's in-flight leases, held by the response body until it ends.
    lease: Option<in_flight::Lease>,
}

/// The time limits of one forwarded request.
#[derive(Debug, Clone, Copy)]
struct Timeouts {
    /// Until the upstream's response head (`upstream_timeout`).
    response_head: Duration,
    /// Silence allowed in either body (`body_idle_timeout`).
    body_idle: Duration,
}

/// Serves `gateway` on `acceptor` until `shutdown` completes; then stops accepting and waits
/// up to `grace` for responses in flight (long streams included) before closing their
/// connections. A request head must arrive within the acceptor's header read timeout (on a
/// new connection and between requests on a kept-alive one).
pub async fn serve(
    acceptor: Acceptor,
    gateway: Arc<Gateway>,
    shutdown: impl Future<Output = ()> + Send,
    grace: Duration,
) -> std::io::Result<()> {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new());
    crate::listen::configure(&mut http, acceptor.limits());
    crate::listen::serve_connections(acceptor, "gateway", shutdown, grace, |stream, peer| {
        let gateway = gateway.clone();
        let service = service_fn(move |request| {
            let gateway = gateway.clone();
            // Here, before the future is polled: see `Gateway::prepare`.
            let prepared = gateway.prepare(peer, request);
            async move { Ok::<_, Infallible>(gateway.finish(prepared).await) }
        });
        http.serve_connection(TokioIo::new(stream), service)
    })
    .await
}
