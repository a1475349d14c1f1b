//! The WebSocket gateway: relays WebSocket connections to a `ws://` upstream and enforces the
//! library's [`WsLimiter`] between the two (`flowgate serve` with a `websocket` section).
//!
//! * **The upgrade** gets the HTTP gateway's treatment — the client's address behind trusted
//!   proxies, headers and JWT claims through the library's key extractors — and
//!   [`WsLimiter::admit`]: a refusal is a `429` with `Retry-After` (and the `RateLimit` fields
//!   when the rate of new connections refused), rendered by the library's one renderer,
//!   before any upgrade work. Then the gateway upgrades to the upstream (within
//!   `handshake_timeout`; `502`/`504` when it cannot) and only then answers the client `101`.
//! * **Every client message** goes through [`Session::check`](flowgate::ws::Session::check)
//!   against the service's store (so with `--redis` a user's and a room's limits hold across
//!   instances): forwarded, rejected (not forwarded; the client gets the error frame), or
//!   closed (a close frame with the configured code to both sides). Upstream messages go
//!   through a second limiter when `outbound` is configured (rejected ones are dropped).
//!   Ping, pong and close frames pass through.
//! * **Bounded**: messages are at most `max_message_size` (a larger one is closed with 1009),
//!   each direction buffers at most `buffer.messages` / `buffer.bytes`, and a peer that reads
//!   too slowly meets `slow_reader` (pause reading the other side, drop, or close with 1013).
//!   Each phase has a timeout; every disconnect path drops the sessions, which frees their
//!   state.
//!
//! See `docs/service.md` ("WebSocket gateway").

// Public (hidden) for the fuzz targets, `flowgate_testing::fuzzing`.
#[doc(hidden)]
pub mod frames;
mod relay;
mod upgrade;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use flowgate::answer::headers::policy_item_value;
use flowgate::ws::{WsLimiter, WsStatsSnapshot};
use http::{HeaderValue, Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use parking_lot::Mutex;
use tokio::sync::{mpsc, watch};

use crate::api::{Active, Service};
use crate::config::websocket::WebSocketConfig;
use crate::listen::Acceptor;
use crate::metrics::WsTotals;

/// The name the rate of new connections is reported under in `RateLimit-Policy`.
pub const CONNECT_LIMIT_NAME: &str = flowgate::ws::Scope::Connect.name();

/// The running `websocket` section and the limiters built from it.
pub(crate) struct Runtime {
    /// The configuration version it was built for.
    version: u64,
    /// The section.
    pub(crate) config: WebSocketConfig,
    /// Client → upstream messages and the upgrade.
    pub(crate) limiter: WsLimiter,
    /// Upstream → client messages, if limited.
    pub(crate) outbound: Option<WsLimiter>,
    /// The `RateLimit-Policy` item of `connections_per_ip` (an empty value when unset).
    pub(crate) connect_item: HeaderValue,
}

/// What happened to messages a slow reader could not take, by direction.
#[derive(Debug, Default)]
pub(crate) struct SlowCounts {
    /// Times reading paused because the other side's buffer was full.
    pub(crate) paused: [AtomicU64; 2],
    /// Messages dropped because the other side's buffer was full.
    pub(crate) dropped: [AtomicU64; 2],
    /// Connections closed with 1013 because a buffer was full.
    pub(crate) closed: [AtomicU64; 2],
}

/// Upgrades that did not reach the upstream, by reason.
#[derive(Debug, Default)]
pub(crate) struct UpstreamFailures {
    /// The upstream could not be connected to.
    pub(crate) connect: AtomicU64,
    /// It answered the upgrade with something other than a valid `101`.
    pub(crate) refused: AtomicU64,
    /// It did not finish the upgrade within `handshake_timeout`.
    pub(crate) timeout: AtomicU64,
}

/// The WebSocket gateway's state, shared by every connection.
pub struct WsGateway {
    /// The policy, store and metrics, shared with the APIs.
    service: Arc<Service>,
    /// The runtime of the newest configuration seen.
    current: Mutex<Option<Arc<Runtime>>>,
    /// Limiters a reload replaced, while sessions may still count in them.
    retired: Mutex<Retired>,
    /// Slow-reader events.
    pub(crate) slow: SlowCounts,
    /// Upstream upgrade failures.
    pub(crate) failures: UpstreamFailures,
    /// Connections being relayed now.
    pub(crate) relays: AtomicU64,
    /// Tells relays to close (server shutdown).
    stop: watch::Sender<bool>,
    /// Held by each relay; the gateway waits for every clone to drop before it returns.
    drain: Mutex<Option<mpsc::Sender<()>>>,
    /// Completes once every relay has ended.
    drained: tokio::sync::Mutex<mpsc::Receiver<()>>,
}

/// Replaced limiters and what the dropped ones had counted.
#[derive(Default)]
struct Retired {
    /// `(limiter, outbound)` pairs still referenced by sessions.
    limiters: Vec<(WsLimiter, bool)>,
    /// The final counts of limiters no session uses any more, by direction.
    base: [WsStatsSnapshot; 2],
}

impl std::fmt::Debug for WsGateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WsGateway")
            .field("relays", &self.relays)
            .finish_non_exhaustive()
    }
}

impl WsGateway {
    /// A gateway deciding with `service`'s store and running `websocket` section.
    pub fn new(service: Arc<Service>) -> Arc<Self> {
        let (drain, drained) = mpsc::channel(1);
        let gateway = Arc::new(WsGateway {
            service,
            current: Mutex::new(None),
            retired: Mutex::new(Retired::default()),
            slow: SlowCounts::default(),
            failures: UpstreamFailures::default(),
            relays: AtomicU64::new(0),
            stop: watch::channel(false).0,
            drain: Mutex::new(Some(drain)),
            drained: tokio::sync::Mutex::new(drained),
        });
        let weak = Arc::downgrade(&gateway);
        gateway
            .service
            .metrics()
            .watch_websocket(move || weak.upgrade().map(|g| g.totals()).unwrap_or_default());
        gateway
    }

    /// The runtime for the running configuration, rebuilt when it changed; `None` when the
    /// running configuration has no `websocket` section. A limiter whose limits did not change
    /// is kept, with its open connections, caps and penalty box.
    pub(crate) fn runtime(&self, active: &Active) -> Option<Arc<Runtime>> {
        let mut current = self.current.lock();
        if let Some(runtime) = current.as_ref()
            && runtime.version == active.version
        {
            return Some(runtime.clone());
        }
        let old = current.take();
        let Some(config) = active.policy.websocket.clone() else {
            if let Some(old) = old {
                self.retire(&old);
            }
            return None;
        };
        let same_in = old
            .as_ref()
            .is_some_and(|o| o.config.limits == config.limits);
        let same_out = old
            .as_ref()
            .is_some_and(|o| o.config.outbound == config.outbound);
        let limiter = match &old {
            Some(o) if same_in => Some(o.limiter.clone()),
            _ => config.limits.build().ok(),
        };
        let outbound = match (&config.outbound, &old) {
            (None, _) => None,
            (Some(_), Some(o)) if same_out => o.outbound.clone(),
            (Some(limits), _) => limits.build().ok(),
        };
        if let Some(old) = &old {
            let mut retired = self.retired.lock();
            if !same_in {
                retired.limiters.push((old.limiter.clone(), false));
            }
            if !same_out && let Some(out) = &old.outbound {
                retired.limiters.push((out.clone(), true));
            }
        }
        // The limits were built once when the file was validated; building them again cannot
        // fail.
        let limiter = limiter?;
        let connect_item = config
            .limits
            .connections_per_ip
            .map_or(HeaderValue::from_static(""), |q| {
                policy_item_value(CONNECT_LIMIT_NAME, &q)
            });
        let runtime = Arc::new(Runtime {
            version: active.version,
            config,
            limiter,
            outbound,
            connect_item,
        });
        *current = Some(runtime.clone());
        Some(runtime)
    }

    /// Moves a runtime's limiters to the retired list (the section was removed).
    fn retire(&self, old: &Runtime) {
        let mut retired = self.retired.lock();
        retired.limiters.push((old.limiter.clone(), false));
        if let Some(out) = &old.outbound {
            retired.limiters.push((out.clone(), true));
        }
    }

    /// Every WebSocket counter now.
    pub fn totals(&self) -> WsTotals {
        let current = self.current.lock().clone();
        let mut totals = WsTotals::default();
        {
            let mut retired = self.retired.lock();
            // A retired limiter no session holds any more is folded into the base.
            let mut i = 0;
            while i < retired.limiters.len() {
                let (limiter, outbound) = &retired.limiters[i];
                if limiter.live().0 == 0 && limiter.stats().live == 0 {
                    let snapshot = limiter.stats();
                    let side = usize::from(*outbound);
                    add(&mut retired.base[side], &snapshot);
                    retired.limiters.swap_remove(i);
                } else {
                    i += 1;
                }
            }
            totals.inbound = retired.base[0].clone();
            totals.outbound = retired.base[1].clone();
            for (limiter, outbound) in &retired.limiters {
                let side = if *outbound {
                    &mut totals.outbound
                } else {
                    &mut totals.inbound
                };
                add(side, &limiter.stats());
                totals.penalized += limiter.penalized() as u64;
            }
        }
        if let Some(runtime) = current {
            add(&mut totals.inbound, &runtime.limiter.stats());
            totals.penalized += runtime.limiter.penalized() as u64;
            if let Some(out) = &runtime.outbound {
                add(&mut totals.outbound, &out.stats());
            }
        }
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        for side in 0..2 {
            totals.slow[side] = [
                get(&self.slow.paused[side]),
                get(&self.slow.dropped[side]),
                get(&self.slow.closed[side]),
            ];
        }
        totals.upstream_failures = [
            get(&self.failures.connect),
            get(&self.failures.refused),
            get(&self.failures.timeout),
        ];
        totals.relays = get(&self.relays);
        totals.tracked = self.live();
        totals
    }

    /// Sessions alive now in every limiter (running and retired): `(connections, IPs, users)`
    /// with open connections. All zero once every connection is gone.
    pub fn live(&self) -> (usize, usize, usize) {
        let mut sum = (0, 0, 0);
        let mut count = |l: &WsLimiter| {
            let (a, b, c) = l.live();
            sum = (sum.0 + a, sum.1 + b, sum.2 + c);
        };
        if let Some(runtime) = self.current.lock().as_ref() {
            count(&runtime.limiter);
            if let Some(out) = &runtime.outbound {
                count(out);
            }
        }
        for (limiter, _) in &self.retired.lock().limiters {
            count(limiter);
        }
        sum
    }

    /// Answers one HTTP request on the WebSocket listener.
    async fn handle(
        self: &Arc<Self>,
        peer: SocketAddr,
        request: Request<Incoming>,
    ) -> Response<Full<Bytes>> {
        upgrade::handle(self, peer, request).await
    }

    /// The service.
    pub(crate) fn service(&self) -> &Service {
        &self.service
    }

    /// A receiver that turns true when the gateway stops.
    pub(crate) fn stopping(&self) -> watch::Receiver<bool> {
        self.stop.subscribe()
    }

    /// A guard a relay holds while it runs (the gateway waits for all of them at shutdown);
    /// `None` once the gateway is stopping.
    pub(crate) fn guard(&self) -> Option<mpsc::Sender<()>> {
        self.drain.lock().clone()
    }
}

/// Adds `b`'s counts to `a`.
fn add(a: &mut WsStatsSnapshot, b: &WsStatsSnapshot) {
    a.live += b.live;
    a.opened += b.opened;
    a.size_sum += b.size_sum;
    a.banned += b.banned;
    if a.size_buckets.len() < b.size_buckets.len() {
        a.size_buckets.resize(b.size_buckets.len(), 0);
    }
    for (x, y) in a.size_buckets.iter_mut().zip(&b.size_buckets) {
        *x += y;
    }
    for (scope, n) in &b.refused {
        match a.refused.iter_mut().find(|(s, _)| s == scope) {
            Some((_, m)) => *m += n,
            None => a.refused.push((*scope, *n)),
        }
    }
    for (scope, outcome, n) in &b.decisions {
        match a
            .decisions
            .iter_mut()
            .find(|(s, o, _)| s == scope && o == outcome)
        {
            Some((_, _, m)) => *m += n,
            None => a.decisions.push((*scope, *outcome, *n)),
        }
    }
    for (code, n) in &b.closes {
        match a.closes.iter_mut().find(|(c, _)| c == code) {
            Some((_, m)) => *m += n,
            None => a.closes.push((*code, *n)),
        }
    }
}

/// Serves the WebSocket gateway on `acceptor` until `shutdown` completes; then stops
/// accepting, closes every relayed connection with 1001 on both sides and waits up to `grace`
/// for them (and for upgrades in flight) to finish.
pub async fn serve(
    acceptor: Acceptor,
    gateway: Arc<WsGateway>,
    shutdown: impl Future<Output = ()> + Send,
    grace: Duration,
) -> std::io::Result<()> {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new());
    // The upgrade request must arrive promptly (slowloris).
    crate::listen::configure(&mut http, acceptor.limits());
    let stopped_at = std::sync::OnceLock::new();
    let stopping = async {
        shutdown.await;
        let _ = stopped_at.set(tokio::time::Instant::now());
        // Relays close at once, while upgrades in flight finish.
        let _ = gateway.stop.send(true);
        gateway.drain.lock().take();
    };
    let handler = gateway.clone();
    crate::listen::serve_connections(
        acceptor,
        "websocket gateway",
        stopping,
        grace,
        |stream, peer| {
            let gateway = handler.clone();
            let service = service_fn(move |request| {
                let gateway = gateway.clone();
                async move { Ok::<_, Infallible>(gateway.handle(peer, request).await) }
            });
            http.serve_connection(TokioIo::new(stream), service)
                .with_upgrades()
        },
    )
    .await?;
    let left = stopped_at
        .get()
        .map_or(grace, |at| grace.saturating_sub(at.elapsed()));
    let drained = async {
        let _ = gateway.drained.lock().await.recv().await;
    };
    if tokio::time::timeout(left, drained).await.is_err() {
        tracing::warn!(
            "websocket gateway: connections still closing after {}; dropping them",
            humantime::format_duration(grace)
        );
    }
    Ok(())
}
