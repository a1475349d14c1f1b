//! The live dashboard: `GET /dashboard`, one self-contained page (HTML, CSS, JavaScript and a
//! hand-drawn canvas chart, embedded in the binary), fed over server-sent events.
//!
//! | route | what |
//! |---|---|
//! | `GET /dashboard` | the page |
//! | `GET /dashboard/events` | `text/event-stream`: one `snapshot` event per second ([`Snapshot`] as JSON) |
//! | `GET /dashboard/snapshot` | the latest [`Snapshot`] as JSON (taken now if the last is over 2 s old) |
//!
//! One sampler task reads the service's counters once a second (a probe of the store
//! included) while at least one event stream is open — nothing at all while none is — and hands the snapshot to every subscriber through a bounded channel of its own
//! ([`SUBSCRIBER_BUFFER`] snapshots; a subscriber that falls behind misses snapshots rather
//! than holding memory); at most [`MAX_SUBSCRIBERS`] streams are open at once, beyond which
//! `/dashboard/events` answers 503 with a problem body. The page finds its stream from its
//! own address, so it works under any path prefix of a reverse proxy. Everything is
//! read-only; `flowgate serve --no-dashboard` (or `FLOWGATE_DASHBOARD=off`) removes the
//! routes.

mod snapshot;

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures_util::Stream;
use parking_lot::Mutex;
use tokio::sync::mpsc;

pub use snapshot::{
    CloseCount, ConfigView, FallbackView, ReloadView, RuleRate, Sampler, Snapshot, StoreView,
    TOP_KEYS_SHOWN, TopKeyView, WebSocketView,
};

use crate::api::Service;

/// The page: markup, style and script in one file.
const PAGE: &str = include_str!("page.html");

/// Event streams open at once, at most.
pub const MAX_SUBSCRIBERS: usize = 64;

/// Snapshots waiting for one subscriber, at most.
pub const SUBSCRIBER_BUFFER: usize = 4;

/// How often a snapshot is taken.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// The sending side of one subscriber's channel of snapshots (JSON).
type Feed = mpsc::Sender<Arc<str>>;

/// The dashboard's state: the latest snapshot and the subscribers' channels.
pub struct Dashboard {
    /// What is sampled.
    service: Arc<Service>,
    /// The latest snapshot as JSON and when it was taken (`None` before the first).
    latest: Mutex<Option<(Instant, Arc<str>)>>,
    /// Turns counters into rates; shared by the loop and on-demand snapshots.
    sampler: tokio::sync::Mutex<Sampler>,
    /// One bounded channel per open event stream.
    subscribers: Mutex<Vec<Feed>>,
}

impl std::fmt::Debug for Dashboard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dashboard")
            .field("subscribers", &self.subscribers.lock().len())
            .finish_non_exhaustive()
    }
}

impl Dashboard {
    /// A dashboard of `service`; [`run`](Self::run) feeds it.
    pub fn new(service: Arc<Service>) -> Arc<Self> {
        Arc::new(Dashboard {
            service,
            latest: Mutex::new(None),
            sampler: tokio::sync::Mutex::new(Sampler::default()),
            subscribers: Mutex::new(Vec::new()),
        })
    }

    /// Samples every [`INTERVAL`] while someone watches (nothing, not even a store probe,
    /// while no event stream is open) until `shutdown` completes, then ends every event
    /// stream (so that a graceful shutdown does not wait on them).
    pub async fn run(self: Arc<Self>, shutdown: impl Future<Output = ()>) -> std::io::Result<()> {
        let mut ticks = tokio::time::interval(INTERVAL);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                _ = ticks.tick() => {}
            }
            let watched = {
                let mut subscribers = self.subscribers.lock();
                subscribers.retain(|tx| !tx.is_closed());
                !subscribers.is_empty()
            };
            if !watched {
                continue;
            }
            let json = self.sample().await;
            self.broadcast(&json);
        }
        self.subscribers.lock().clear();
        Ok(())
    }

    /// Hands `json` to every subscriber: a full channel skips it for that subscriber, a
    /// closed one is dropped.
    fn broadcast(&self, json: &Arc<str>) {
        self.subscribers
            .lock()
            .retain(|tx| match tx.try_send(json.clone()) {
                Ok(()) | Err(mpsc::error::TrySendError::Full(_)) => true,
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            });
    }

    /// Takes a snapshot now and keeps it as the latest: its JSON.
    async fn sample(&self) -> Arc<str> {
        let snapshot = self.sampler.lock().await.sample(&self.service).await;
        let json: Arc<str> = serde_json::to_string(&snapshot).unwrap_or_default().into();
        *self.latest.lock() = Some((Instant::now(), json.clone()));
        json
    }

    /// The latest snapshot if it is younger than two intervals, else a new one.
    async fn fresh(&self) -> Arc<str> {
        let latest = self.latest.lock().clone();
        match latest {
            Some((at, json)) if at.elapsed() < 2 * INTERVAL => json,
            _ => self.sample().await,
        }
    }

    /// A new subscriber's channel, or `None` at [`MAX_SUBSCRIBERS`].
    fn subscribe(&self) -> Option<(Feed, mpsc::Receiver<Arc<str>>)> {
        let mut subscribers = self.subscribers.lock();
        subscribers.retain(|tx| !tx.is_closed());
        if subscribers.len() >= MAX_SUBSCRIBERS {
            return None;
        }
        let (tx, rx) = mpsc::channel(SUBSCRIBER_BUFFER);
        subscribers.push(tx.clone());
        Some((tx, rx))
    }
}

/// The dashboard's routes.
pub fn router(dashboard: Arc<Dashboard>) -> Router {
    Router::new()
        .route("/dashboard", get(page))
        .route("/dashboard/events", get(events))
        .route("/dashboard/snapshot", get(latest))
        .with_state(dashboard)
}

/// `GET /dashboard`.
#[utoipa::path(
    get,
    path = "/dashboard",
    tag = "dashboard",
    responses((status = 200, description = "The dashboard page", content_type = "text/html", body = String))
)]
pub(crate) async fn page() -> Response {
    let mut response = PAGE.into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    // Everything the page needs is in it; it may talk to its own origin only.
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:",
        ),
    );
    response
}

/// `GET /dashboard/events`.
#[utoipa::path(
    get,
    path = "/dashboard/events",
    tag = "dashboard",
    responses(
        (status = 200, description = "Server-sent events: one `snapshot` event per second, its data a Snapshot as JSON", content_type = "text/event-stream", body = crate::api::openapi::SnapshotEvent),
        (status = 503, description = "Too many event streams are open", body = crate::api::openapi::ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn events(State(dashboard): State<Arc<Dashboard>>) -> Response {
    match dashboard.subscribe() {
        Some((tx, rx)) => {
            // A snapshot at once, so a new page has something to show before the next tick.
            let _ = tx.try_send(dashboard.fresh().await);
            drop(tx);
            Sse::new(stream(rx))
                .keep_alive(KeepAlive::default())
                .into_response()
        }
        None => crate::api::problem::Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "https://flowgate.dev/problems/too-many-subscribers",
            "Too many dashboard streams",
            format!("at most {MAX_SUBSCRIBERS} dashboard event streams may be open at once"),
        )
        .into_response(),
    }
}

/// The events of one subscriber.
fn stream(rx: mpsc::Receiver<Arc<str>>) -> impl Stream<Item = Result<Event, Infallible>> {
    futures_util::stream::unfold(rx, |mut rx| async move {
        let json = rx.recv().await?;
        Some((Ok(Event::default().event("snapshot").data(&*json)), rx))
    })
}

/// `GET /dashboard/snapshot`.
#[utoipa::path(
    get,
    path = "/dashboard/snapshot",
    tag = "dashboard",
    responses(
        (status = 200, description = "The latest snapshot", body = Snapshot),
    )
)]
pub(crate) async fn latest(State(dashboard): State<Arc<Dashboard>>) -> Response {
    let mut response = dashboard.fresh().await.to_string().into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Backend;

    fn dashboard() -> Arc<Dashboard> {
        let policy = crate::config::load(&[]).unwrap_or_else(|e| panic!("{e}"));
        Dashboard::new(Arc::new(Service::new(policy, Backend::default())))
    }

    #[test]
    fn subscribers_are_capped_and_a_closed_stream_frees_its_place() {
        let dashboard = dashboard();
        let mut open: Vec<_> = (0..MAX_SUBSCRIBERS)
            .map(|_| dashboard.subscribe().map(|(_, rx)| rx))
            .collect();
        assert!(open.iter().all(Option::is_some));
        assert!(dashboard.subscribe().is_none(), "one over the cap");
        open.pop();
        assert!(
            dashboard.subscribe().is_some(),
            "a closed stream's place is free"
        );
    }

    #[tokio::test]
    async fn each_subscriber_holds_a_bounded_number_of_snapshots() {
        let dashboard = dashboard();
        let Some((tx, mut rx)) = dashboard.subscribe() else {
            panic!("room for one");
        };
        drop(tx);
        // What the sampler does at each tick, more often than the reader reads.
        for _ in 0..SUBSCRIBER_BUFFER * 3 {
            let json = dashboard.sample().await;
            dashboard.broadcast(&json);
        }
        let mut held = 0;
        while rx.try_recv().is_ok() {
            held += 1;
        }
        assert_eq!(held, SUBSCRIBER_BUFFER);
    }
}
