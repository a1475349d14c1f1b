//! The live dashboard: `GET /dashboard`, one page (HTML, its style sheet and script, and a
//! hand-drawn canvas chart, all embedded in the binary), fed over server-sent events.
//!
//! | route | what |
//! |---|---|
//! | `GET /dashboard` | the page |
//! | `GET /dashboard/page.js`, `GET /dashboard/page.css` | its script and style sheet |
//! | `GET /dashboard/events` | `text/event-stream`: one `snapshot` event per second ([`Snapshot`] as JSON) |
//! | `GET /dashboard/snapshot` | the latest [`Snapshot`] as JSON (taken now if the last is over 2 s old) |
//!
//! The page runs no inline script or style: its `Content-Security-Policy` allows scripts,
//! styles and connections from its own origin only, and framing by its own origin only
//! ([`CONTENT_SECURITY_POLICY`]).
//!
//! One sampler task reads the service's counters once a second (a probe of the store
//! included) while at least one event stream is open — nothing at all while none is — and
//! hands the snapshot to every subscriber through a bounded channel of its own
//! ([`SUBSCRIBER_BUFFER`] snapshots; a subscriber that falls behind misses snapshots rather
//! than holding memory).
//!
//! **Bounded streams that clients cannot take from operators.** At most [`MAX_SUBSCRIBERS`]
//! streams are open at once. A request without the admin token may hold at most
//! [`MAX_PER_CLIENT`] of them per client address (an IPv6 client per /64), and — when an admin
//! token is set — none of the last [`RESERVED_FOR_ADMIN`], kept for requests bearing it
//! (`Authorization: Bearer`; a wrong token is refused, 403, and logged). A refused stream is a
//! 503 problem; the page then polls `/dashboard/snapshot` once a second instead, so an
//! operator's page stays live however many streams others hold. The page finds its
//! stream from its own address, so it works under any path prefix of a reverse proxy.
//! Everything is read-only; `flowgate serve --no-dashboard` (or `FLOWGATE_DASHBOARD=off`)
//! removes the routes.

mod snapshot;

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
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
use crate::api::http::admin::Presented;
use crate::api::http::{Peer, peer_address};

/// The page's markup.
const PAGE: &str = include_str!("page.html");

/// The page's script.
const SCRIPT: &str = include_str!("page.js");

/// The page's style sheet.
const STYLE: &str = include_str!("page.css");

/// The page's `Content-Security-Policy`: nothing inline, everything from its own origin, and
/// framed by its own origin only.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'self'";

/// Event streams open at once, at most.
pub const MAX_SUBSCRIBERS: usize = 64;

/// Event streams one client address (an IPv6 /64) may hold without the admin token.
pub const MAX_PER_CLIENT: usize = 4;

/// Event streams only requests bearing the admin token may open (when one is set).
pub const RESERVED_FOR_ADMIN: usize = 8;

/// Snapshots waiting for one subscriber, at most.
pub const SUBSCRIBER_BUFFER: usize = 4;

/// How often a snapshot is taken.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// The sending side of one subscriber's channel of snapshots (JSON).
type Feed = mpsc::Sender<Arc<str>>;

/// Who opened an event stream.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Viewer {
    /// A request bearing the admin token.
    Admin,
    /// Any other request, by its client's address key (IPv4 address, IPv6 /64; `None` when
    /// the address is unknown).
    Client(Option<String>),
}

/// One open event stream.
#[derive(Debug)]
struct Subscriber {
    /// Its channel.
    feed: Feed,
    /// Who opened it.
    viewer: Viewer,
}

/// The dashboard's state: the latest snapshot and the subscribers' channels.
pub struct Dashboard {
    /// What is sampled.
    service: Arc<Service>,
    /// The latest snapshot as JSON and when it was taken (`None` before the first).
    latest: Mutex<Option<(Instant, Arc<str>)>>,
    /// Turns counters into rates; shared by the loop and on-demand snapshots.
    sampler: tokio::sync::Mutex<Sampler>,
    /// One bounded channel per open event stream.
    subscribers: Mutex<Vec<Subscriber>>,
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
                subscribers.retain(|s| !s.feed.is_closed());
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
            .retain(|s| match s.feed.try_send(json.clone()) {
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

    /// A new subscriber's channel, or the reason there is no room for `viewer`: at
    /// [`MAX_SUBSCRIBERS`], and for a viewer without the admin token at [`MAX_PER_CLIENT`]
    /// for its address or when only the [`RESERVED_FOR_ADMIN`] places are left (`reserve`:
    /// whether an admin token is set).
    fn subscribe(
        &self,
        viewer: Viewer,
        reserve: bool,
    ) -> Result<(Feed, mpsc::Receiver<Arc<str>>), &'static str> {
        let mut subscribers = self.subscribers.lock();
        subscribers.retain(|s| !s.feed.is_closed());
        if subscribers.len() >= MAX_SUBSCRIBERS {
            return Err("every dashboard event stream is taken");
        }
        if let Viewer::Client(client) = &viewer {
            let reserved = if reserve { RESERVED_FOR_ADMIN } else { 0 };
            let others = subscribers
                .iter()
                .filter(|s| s.viewer != Viewer::Admin)
                .count();
            if others >= MAX_SUBSCRIBERS - reserved {
                return Err(
                    "the dashboard event streams left are kept for requests bearing the admin token",
                );
            }
            let mine = subscribers
                .iter()
                .filter(|s| matches!(&s.viewer, Viewer::Client(c) if c == client))
                .count();
            if mine >= MAX_PER_CLIENT {
                return Err("this client holds as many dashboard event streams as it may");
            }
        }
        let (tx, rx) = mpsc::channel(SUBSCRIBER_BUFFER);
        subscribers.push(Subscriber {
            feed: tx.clone(),
            viewer,
        });
        Ok((tx, rx))
    }
}

/// The dashboard's routes.
pub fn router(dashboard: Arc<Dashboard>) -> Router {
    Router::new()
        .route("/dashboard", get(page))
        .route("/dashboard/page.js", get(script))
        .route("/dashboard/page.css", get(style))
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
    let mut response = asset(PAGE, "text/html; charset=utf-8");
    let headers = response.headers_mut();
    // The page may run, style and talk to its own origin only, and be framed by it only.
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    // What `frame-ancestors` says, for browsers that predate it.
    headers.insert(
        header::X_FRAME_OPTIONS,
        HeaderValue::from_static("SAMEORIGIN"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

/// `GET /dashboard/page.js`.
#[utoipa::path(
    get,
    path = "/dashboard/page.js",
    tag = "dashboard",
    responses((status = 200, description = "The dashboard's script", content_type = "text/javascript", body = String))
)]
pub(crate) async fn script() -> Response {
    asset(SCRIPT, "text/javascript; charset=utf-8")
}

/// `GET /dashboard/page.css`.
#[utoipa::path(
    get,
    path = "/dashboard/page.css",
    tag = "dashboard",
    responses((status = 200, description = "The dashboard's style sheet", content_type = "text/css", body = String))
)]
pub(crate) async fn style() -> Response {
    asset(STYLE, "text/css; charset=utf-8")
}

/// One of the page's files, as `content_type`; never sniffed, and revalidated on each load
/// (so a new binary's page never runs an old script).
fn asset(body: &'static str, content_type: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// `GET /dashboard/events`.
#[utoipa::path(
    get,
    path = "/dashboard/events",
    tag = "dashboard",
    responses(
        (status = 200, description = "Server-sent events: one `snapshot` event per second, its data a Snapshot as JSON", content_type = "text/event-stream", body = crate::api::openapi::SnapshotEvent),
        (status = 403, description = "A bearer token that is not the admin token", body = crate::api::openapi::ProblemBody, content_type = "application/problem+json"),
        (status = 503, description = "No event stream is free for this client (the page then polls /dashboard/snapshot)", body = crate::api::openapi::ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn events(
    State(dashboard): State<Arc<Dashboard>>,
    peer: Peer,
    headers: HeaderMap,
) -> Response {
    let client = peer_address(&peer);
    let token = dashboard.service.admin_token();
    let viewer = match token.map(|t| t.presented(&headers)) {
        Some(Presented::Token) => Viewer::Admin,
        Some(Presented::Wrong) => {
            if let Some(token) = token {
                token.refused(client, "GET /dashboard/events", "wrong bearer token");
            }
            return crate::api::problem::Problem::new(
                StatusCode::FORBIDDEN,
                "https://flowgate.dev/problems/forbidden",
                "Forbidden",
                "the bearer token is not the admin token",
            )
            .into_response();
        }
        Some(Presented::Nothing) | None => Viewer::Client(
            client.map(|c| flowgate::http::key::PeerIp::new().key_of(c.ip().to_canonical())),
        ),
    };
    match dashboard.subscribe(viewer, token.is_some()) {
        Ok((tx, rx)) => {
            // A snapshot at once, so a new page has something to show before the next tick.
            let _ = tx.try_send(dashboard.fresh().await);
            drop(tx);
            Sse::new(stream(rx))
                .keep_alive(KeepAlive::default())
                .into_response()
        }
        Err(why) => crate::api::problem::Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "https://flowgate.dev/problems/too-many-subscribers",
            "Too many dashboard streams",
            format!("{why}; /dashboard/snapshot has the same data"),
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

    fn client(i: usize) -> Viewer {
        Viewer::Client(Some(format!("192.0.2.{i}")))
    }

    #[test]
    fn streams_are_capped_per_client_and_in_all_and_a_closed_one_frees_its_place() {
        let dashboard = dashboard();
        let mut open = Vec::new();
        // Without an admin token there is no reserve: 64 streams from 16 addresses.
        for i in 0..MAX_SUBSCRIBERS {
            let stream = dashboard.subscribe(client(i / MAX_PER_CLIENT), false);
            open.push(stream.map(|(_, rx)| rx).unwrap());
        }
        assert!(
            dashboard.subscribe(client(99), false).is_err(),
            "one over the cap"
        );
        open.pop();
        assert!(
            dashboard.subscribe(client(99), false).is_ok(),
            "a closed stream's place is free"
        );
    }

    #[test]
    fn one_client_cannot_take_more_than_its_share_nor_clients_the_admin_reserve() {
        let dashboard = dashboard();
        let mut open = Vec::new();
        for _ in 0..MAX_PER_CLIENT {
            open.push(dashboard.subscribe(client(1), true).unwrap());
        }
        assert!(
            dashboard.subscribe(client(1), true).is_err(),
            "its share is taken"
        );
        // Unknown addresses share one share.
        for _ in 0..MAX_PER_CLIENT {
            open.push(dashboard.subscribe(Viewer::Client(None), true).unwrap());
        }
        assert!(dashboard.subscribe(Viewer::Client(None), true).is_err());
        // Many addresses fill everything but the reserve...
        let mut i = 2;
        while open.len() < MAX_SUBSCRIBERS - RESERVED_FOR_ADMIN {
            open.push(
                dashboard
                    .subscribe(client(i / MAX_PER_CLIENT + 2), true)
                    .unwrap(),
            );
            i += 1;
        }
        assert!(
            dashboard.subscribe(client(200), true).is_err(),
            "the reserve is not for clients without the token"
        );
        // ...which requests bearing the token may use, to the end.
        for _ in 0..RESERVED_FOR_ADMIN {
            open.push(dashboard.subscribe(Viewer::Admin, true).unwrap());
        }
        assert!(
            dashboard.subscribe(Viewer::Admin, true).is_err(),
            "64 in all"
        );
        assert_eq!(open.len(), MAX_SUBSCRIBERS);
    }

    #[tokio::test]
    async fn each_subscriber_holds_a_bounded_number_of_snapshots() {
        let dashboard = dashboard();
        let Ok((tx, mut rx)) = dashboard.subscribe(client(1), false) else {
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
