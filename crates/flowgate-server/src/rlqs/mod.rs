//! Envoy's Rate Limit Quota Service:
//! `envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas` on the
//! gRPC listener, beside `ShouldRateLimit` (same TLS, connection cap and drain). See
//! `docs/rlqs.md`.
//!
//! Each Envoy opens a stream, names its domain in the first report, and reports per bucket
//! (a `BucketId`, a string map) the requests it allowed and denied. A bucket is matched
//! against the domain's rules like a descriptor ([`bucket::resolve`]); a rule with a limit is
//! **divided** among the buckets under it, over every Flowgate instance sharing the store
//! (`flowgate::rlqs`), and each bucket is assigned a token bucket with its share — refreshed
//! every report interval, abandoned once idle. Rules without a limit, blocked rules and
//! unmatched buckets get blanket assignments.
//!
//! * `engine`: the streams, their buckets, reports, ticks, drain;
//! * [`bucket`]: bucket ids, targets, assignments in protobuf form;
//! * `crate::metrics::RlqsMetrics`: `flowgate_rlqs_*`;
//! * [`client`]: an RLQS client that behaves as Envoy's filter (tests, `loadgen --rlqs`);
//! * [`GrpcRoutes`]: the gRPC listener's two services on one connection.

pub mod bucket;
pub mod client;
mod engine;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::{
    RateLimitQuotaService, RateLimitQuotaServiceServer,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use flowgate::FailMode;
use flowgate::clock::{Clock, PreciseClock};
use flowgate::rlqs::{Ledger, MemoryLedger};
use futures_util::future::Either;
use tokio::sync::{mpsc, oneshot};
use tonic::{Request, Response, Status, Streaming};

use crate::api::Service;
pub use crate::metrics::{RlqsMetrics, RlqsRuleShares as RuleShares, RlqsSnapshot as Snapshot};
use engine::{Engine, StreamError};
pub use engine::{MAX_MISSED_TICKS, MAX_REPORTED_COUNT, OUTBOUND_CAPACITY};

/// The default cap on open RLQS streams per instance.
pub const DEFAULT_MAX_STREAMS: usize = 10_000;

/// The default cap on buckets per stream.
pub const DEFAULT_MAX_BUCKETS_PER_STREAM: usize = 1_000;

/// How the RLQS service runs (`flowgate serve`'s `--rlqs-*` flags; tests set the clock and
/// tick by hand).
#[derive(Clone)]
pub struct RlqsOptions {
    /// Most streams open at once; more are refused with `RESOURCE_EXHAUSTED`.
    pub max_streams: usize,
    /// Most buckets one stream may report; a stream reporting more is ended with
    /// `RESOURCE_EXHAUSTED`.
    pub max_buckets_per_stream: usize,
    /// The `fail` mode of rules that set none, while the shared ledger cannot be reached
    /// (the server's `--fail`).
    pub fail: FailMode,
    /// Instances sharing the store: `fail: local` divides `limit / instances` locally.
    pub instances: u64,
    /// Where local time comes from (demand estimates, tick timing); default a precise clock.
    pub clock: Option<Arc<dyn Clock>>,
    /// Tick when told instead of on a timer.
    pub ticks: Option<ManualTicks>,
}

impl Default for RlqsOptions {
    fn default() -> Self {
        RlqsOptions {
            max_streams: DEFAULT_MAX_STREAMS,
            max_buckets_per_stream: DEFAULT_MAX_BUCKETS_PER_STREAM,
            fail: FailMode::default(),
            instances: 1,
            clock: None,
            ticks: None,
        }
    }
}

impl std::fmt::Debug for RlqsOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RlqsOptions")
            .field("max_streams", &self.max_streams)
            .field("max_buckets_per_stream", &self.max_buckets_per_stream)
            .field("fail", &self.fail)
            .field("instances", &self.instances)
            .field("manual_ticks", &self.ticks.is_some())
            .finish_non_exhaustive()
    }
}

/// Ticks on demand, for tests that drive time by hand: [`ManualTicks::tick`] runs one pass
/// over every rule instance and returns when its messages are queued.
#[derive(Clone)]
pub struct ManualTicks {
    tx: mpsc::Sender<oneshot::Sender<()>>,
    rx: Arc<parking_lot::Mutex<Option<mpsc::Receiver<oneshot::Sender<()>>>>>,
}

impl Default for ManualTicks {
    fn default() -> Self {
        let (tx, rx) = mpsc::channel(1);
        ManualTicks {
            tx,
            rx: Arc::new(parking_lot::Mutex::new(Some(rx))),
        }
    }
}

impl ManualTicks {
    /// A handle; give a clone to [`RlqsOptions::ticks`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs one tick and waits for it; `false` if the server is not running.
    pub async fn tick(&self) -> bool {
        let (done, finished) = oneshot::channel();
        self.tx.send(done).await.is_ok() && finished.await.is_ok()
    }
}

/// The RLQS service of one server: its engine, the gRPC service, the tick task.
#[derive(Clone)]
pub struct Rlqs {
    engine: Arc<Engine>,
    ticks: Option<ManualTicks>,
}

impl std::fmt::Debug for Rlqs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rlqs").finish_non_exhaustive()
    }
}

impl Rlqs {
    /// The service of `service`'s policy, dividing through `ledger` (a memory ledger when
    /// `None`: one instance).
    pub fn new(
        service: Arc<Service>,
        ledger: Option<Arc<dyn Ledger>>,
        options: RlqsOptions,
    ) -> Rlqs {
        let clock: Arc<dyn Clock> = options
            .clock
            .clone()
            .unwrap_or_else(|| Arc::new(PreciseClock::new()));
        let ledger = ledger.unwrap_or_else(|| Arc::new(MemoryLedger::with_clock(clock.clone())));
        let ticks = options.ticks.clone();
        let engine = Arc::new(Engine::new(service.clone(), ledger, clock, options));
        let view = engine.clone();
        service.metrics().rlqs().watch(move || view.snapshot());
        Rlqs { engine, ticks }
    }

    /// The tonic service, ready for the gRPC listener. Report messages larger than the
    /// service's `max_body_bytes` are refused with `OUT_OF_RANGE`.
    pub fn server(&self) -> RateLimitQuotaServiceServer<RlqsService> {
        let max = self.engine.max_message_bytes();
        RateLimitQuotaServiceServer::new(RlqsService {
            engine: self.engine.clone(),
        })
        .max_decoding_message_size(max)
    }

    /// Expires every assignment (time to live 0) and ends every stream; refuses new ones.
    pub fn drain(&self) {
        self.engine.drain();
    }

    /// Ticks until `shutdown` completes: on a timer aligned with the ledger's ticks, or when
    /// [`ManualTicks::tick`] asks.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> std::io::Result<()> {
        tokio::pin!(shutdown);
        let manual = self.ticks.as_ref().and_then(|t| t.rx.lock().take());
        if let Some(mut asks) = manual {
            loop {
                tokio::select! {
                    () = &mut shutdown => break,
                    ask = asks.recv() => match ask {
                        Some(done) => {
                            self.engine.tick(true).await;
                            let _ = done.send(());
                        }
                        None => break,
                    },
                }
            }
            return Ok(());
        }
        loop {
            let base = self.engine.base_interval();
            let wait = match self.engine.next_due() {
                Some(due) => {
                    Duration::from_nanos(due.saturating_sub(self.engine.now())) + TICK_GUARD
                }
                None => base,
            }
            .min(base);
            tokio::select! {
                () = &mut shutdown => break,
                () = tokio::time::sleep(wait) => self.engine.tick(false).await,
            }
        }
        Ok(())
    }
}

/// How long after a tick's boundary (by the ledger's clock, as estimated) the tick runs:
/// room for the estimate's error.
const TICK_GUARD: Duration = Duration::from_millis(2);

/// The gRPC service (see [`Rlqs::server`]).
#[derive(Clone)]
pub struct RlqsService {
    engine: Arc<Engine>,
}

impl std::fmt::Debug for RlqsService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RlqsService").finish_non_exhaustive()
    }
}

#[tonic::async_trait]
impl RateLimitQuotaService for RlqsService {
    type StreamRateLimitQuotasStream = Outgoing;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Outgoing>, Status> {
        let (tx, rx) = mpsc::channel(OUTBOUND_CAPACITY);
        let (stop, stopped) = oneshot::channel();
        let (id, ended) = self.engine.open(tx.clone(), stop)?;
        let mut inbound = request.into_inner();
        let engine = self.engine.clone();
        tokio::spawn(async move {
            let mut domain: Option<String> = None;
            loop {
                let message = tokio::select! {
                    message = inbound.message() => message,
                    () = tx.closed() => break,
                    () = ended.notified() => break,
                };
                match message {
                    Ok(Some(report)) => {
                        let name = match (report.domain.is_empty(), &domain) {
                            (false, _) => report.domain,
                            (true, Some(d)) => d.clone(),
                            (true, None) => {
                                engine.fail(
                                    id,
                                    StreamError {
                                        reason: "no_domain",
                                        status: Status::invalid_argument(
                                            "the first report of a stream must name its domain",
                                        ),
                                    },
                                );
                                break;
                            }
                        };
                        if let Err(e) = engine.report(id, &name, report.bucket_quota_usages).await {
                            if e.reason != "gone" {
                                engine.fail(id, e);
                            }
                            break;
                        }
                        domain = Some(name);
                    }
                    // The client closed its side: it reports no more; end ours.
                    Ok(None) => break,
                    Err(status) => {
                        // A message that could not be decoded (or was too large).
                        if status.code() != tonic::Code::Cancelled {
                            engine.fail(
                                id,
                                StreamError {
                                    reason: "malformed_message",
                                    status,
                                },
                            );
                        }
                        break;
                    }
                }
            }
            engine.close(id);
        });
        Ok(Response::new(Outgoing {
            rx,
            stopped: Some(stopped),
            done: false,
        }))
    }
}

/// A stream's responses: the queued messages, then — if the engine ended the stream — its
/// status.
pub struct Outgoing {
    rx: mpsc::Receiver<Result<RateLimitQuotaResponse, Status>>,
    stopped: Option<oneshot::Receiver<Status>>,
    done: bool,
}

impl std::fmt::Debug for Outgoing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outgoing").finish_non_exhaustive()
    }
}

impl futures_util::Stream for Outgoing {
    type Item = Result<RateLimitQuotaResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        let queue_ended = match self.rx.poll_recv(cx) {
            Poll::Ready(Some(item)) => return Poll::Ready(Some(item)),
            Poll::Ready(None) => true,
            Poll::Pending => false,
        };
        // The engine sends the status before it lets go of the queue, so once the queue has
        // ended, a status is there if there is one.
        if let Some(stopped) = self.stopped.as_mut() {
            match Pin::new(stopped).poll(cx) {
                Poll::Ready(Ok(status)) => {
                    self.done = true;
                    return Poll::Ready(Some(Err(status)));
                }
                Poll::Ready(Err(_)) => self.stopped = None,
                Poll::Pending => {}
            }
        }
        if queue_ended {
            self.done = true;
            return Poll::Ready(None);
        }
        Poll::Pending
    }
}

/// The gRPC listener's services: RLQS calls to the RLQS service, everything else to the rate
/// limit service (which answers `UNIMPLEMENTED` to methods it does not have).
#[derive(Debug, Clone)]
pub struct GrpcRoutes<A, B> {
    rls: A,
    rlqs: B,
}

/// The path prefix of the RLQS service's methods.
const RLQS_PATH: &str = "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/";

impl<A, B> GrpcRoutes<A, B> {
    /// `rls` for `ShouldRateLimit` (and unknown methods), `rlqs` for RLQS.
    pub fn new(rls: A, rlqs: B) -> Self {
        GrpcRoutes { rls, rlqs }
    }
}

impl<A, B, Req> tower_service::Service<http::Request<Req>> for GrpcRoutes<A, B>
where
    A: tower_service::Service<
            http::Request<Req>,
            Response = http::Response<tonic::body::Body>,
            Error = Infallible,
        >,
    B: tower_service::Service<
            http::Request<Req>,
            Response = http::Response<tonic::body::Body>,
            Error = Infallible,
        >,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Either<A::Future, B::Future>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // Both are tonic-generated servers, always ready.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Req>) -> Self::Future {
        if request.uri().path().starts_with(RLQS_PATH) {
            Either::Right(self.rlqs.call(request))
        } else {
            Either::Left(self.rls.call(request))
        }
    }
}
