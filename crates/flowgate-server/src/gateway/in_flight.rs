//! The gateway's in-flight limits (`gateway.in_flight`): at most N requests in flight per key,
//! each holding a [lease](flowgate::lease) of a `concurrency` limit from the request's
//! arrival to the end of its response body.
//!
//! * **Order.** Leases are taken after the request is keyed (a malformed request costs no
//!   store call) and **before** the rate limit is checked. A request refused for concurrency
//!   never reaches the rate limit, so it consumes no rate-limit units (no refund needed); a
//!   request the rate limit refuses gives its leases back before its `429` is sent (awaited,
//!   within [`RELEASE_TIMEOUT`]), so it holds none once the client sees the refusal. The
//!   other order would need refunds to rate counters, which are best effort and impossible
//!   for charges (`charge: true`); a release is exact.
//! * **Holding.** An admitted request's leases are held by a task of their own (`keep`),
//!   which renews them every half lease time (so a response that streams longer than
//!   `lease_time` stays counted) and releases them when the request's [`Lease`] is dropped:
//!   when the response body ends or fails, when the client goes away (hyper drops the body),
//!   or when the exchange with the upstream fails. The release runs there, bounded by
//!   [`RELEASE_TIMEOUT`], and never delays a response; a release that fails leaves the lease
//!   to expire (`lease_time`). A process that dies holding leases loses them the same way.
//! * **Refusals.** Every slot held: `429` with `Retry-After` (when the earliest lease expires;
//!   sooner if one is released) and a problem (`quota-exceeded`, the limit's name in
//!   `violated-policies`). The store away: the limit's `fail` — `closed` answers `503`
//!   (`Flowgate-Fallback: closed`), `open` lets the request through without that lease.
//! * **Keys.** An item's key is its entries' values (the sources of `descriptors`, read by the
//!   same code), joined by `|` (when there are several, each escaped as a counter key's
//!   value is: `\`, `|`, `=`, `#`); the leases are stored under [`flowgate::lease::key`],
//!   so `/v1/leases/{name}/{key}` counts the gateway's leases too. A request lacking an
//!   entry's value (no such header) holds no lease of that item, as a descriptor lacking one
//!   is skipped.

use std::sync::Arc;
use std::time::Duration;

use flowgate::FailMode;
use flowgate::answer::problem::Problem;
use flowgate::http::key::KeyRejection;
use flowgate::lease::{Acquired, LeaseId, Terms};
use http::request::Parts;
use http::{HeaderValue, StatusCode};
use tokio::sync::oneshot;

use super::descriptors;
use crate::api::Service;
use crate::config::gateway::{EntryConfig, GatewayConfig};

/// The longest a lease's release (or renewal) may take before it is given up; the lease then
/// expires at the end of its lease time.
pub const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

/// One lease a request holds.
#[derive(Debug)]
struct HeldLease {
    /// Its store key.
    key: String,
    /// Its id.
    id: LeaseId,
    /// Its limit's terms (for renewals).
    terms: Terms,
}

/// The leases a request took: given back by [`Held::give_back`], held by [`Held::keep`], or
/// — dropped, when the request is abandoned before either — released on a task of their own.
pub(crate) struct Held {
    /// Where they are released.
    service: Arc<Service>,
    /// The leases.
    leases: Vec<HeldLease>,
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Held")
            .field("leases", &self.leases)
            .finish()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.leases.is_empty() {
            return;
        }
        let leases = std::mem::take(&mut self.leases);
        let service = self.service.clone();
        // Without a runtime (the process is ending), the leases simply expire.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move { release_all(&service, leases).await });
        }
    }
}

/// Why a request is not admitted.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// A key entry is present but unusable (400/401).
    Rejected(KeyRejection),
    /// Every slot of limit `name` is held.
    Full {
        /// The limit.
        name: String,
        /// Leases held on the key.
        held: u64,
        /// `Retry-After`, whole seconds.
        retry_after: u64,
    },
    /// The store could not answer and the limit fails closed.
    Unavailable,
}

impl Refusal {
    /// The problem response the refusal stands for.
    pub(crate) fn into_response(self) -> http::Response<bytes::Bytes> {
        match self {
            Refusal::Rejected(rejection) => {
                Problem::status(rejection.status, rejection.detail).into_response()
            }
            Refusal::Full {
                name,
                held,
                retry_after,
            } => {
                let mut problem = Problem::quota_exceeded(vec![name.clone()], Some(retry_after));
                problem.detail = format!(
                    "{held} requests of `{name}` are in flight for this key, the most allowed at once; retry in {retry_after} s"
                );
                let mut response = problem.into_response();
                response
                    .headers_mut()
                    .insert(http::header::RETRY_AFTER, HeaderValue::from(retry_after));
                response
            }
            Refusal::Unavailable => {
                let mut response = Problem::status(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the store of the in-flight limits could not answer; retry later",
                )
                .into_response();
                let headers = response.headers_mut();
                headers.insert(http::header::RETRY_AFTER, HeaderValue::from(1u64));
                headers.insert(
                    http::HeaderName::from_static("flowgate-fallback"),
                    HeaderValue::from_static("closed"),
                );
                response
            }
        }
    }
}

/// Whether an `in_flight` key of `config` reads the client's address.
pub(crate) fn need_peer(config: &GatewayConfig) -> bool {
    config
        .in_flight
        .iter()
        .flat_map(|item| &item.key)
        .any(|entry| matches!(entry.source, crate::config::gateway::Source::RemoteAddress))
}

/// The value keying each `in_flight` item of `config` for the request `parts`, by the item's
/// index (an item whose value the request lacks takes no lease): read while the request's head
/// is at hand, before any lease is taken ([`acquire`]). No allocation when there are none.
pub(crate) fn keys(
    config: &GatewayConfig,
    parts: &Parts,
) -> Result<Vec<(usize, String)>, KeyRejection> {
    let mut keys = Vec::new();
    for (i, item) in config.in_flight.iter().enumerate() {
        if let Some(value) = key_of(config, &item.key, parts)? {
            keys.push((i, value));
        }
    }
    Ok(keys)
}

/// Takes a lease of every `in_flight` item of `config` that [`keys`] (of the same `config`)
/// found a value for; on a refusal, the leases already taken are given back first.
pub(crate) async fn acquire(
    service: &Arc<Service>,
    config: &GatewayConfig,
    keys: Vec<(usize, String)>,
) -> Result<Held, Refusal> {
    let mut held = Held {
        service: service.clone(),
        leases: Vec::with_capacity(keys.len()),
    };
    for (i, value) in keys {
        let item = &config.in_flight[i];
        let key = flowgate::lease::key(&item.name, &value);
        let terms = item.limit.terms;
        match service.backend().leases().acquire(&key, &terms).await {
            Ok(Acquired::Granted { id, .. }) => {
                service.metrics().gateway_lease_taken();
                held.leases.push(HeldLease { key, id, terms });
            }
            Ok(full @ Acquired::Full { held: count, .. }) => {
                held.give_back().await;
                return Err(Refusal::Full {
                    name: item.name.clone(),
                    held: count,
                    retry_after: full.retry_after_secs().unwrap_or(1),
                });
            }
            Err(error) if error.is_transient() && item.limit.fail == FailMode::Open => {
                tracing::warn!(limit = %item.name, error = %error, "the lease store is away; admitting without the lease (fail: open)");
            }
            Err(error) => {
                tracing::warn!(limit = %item.name, error = %error, "the lease store could not answer; refusing (fail: closed)");
                held.give_back().await;
                return Err(Refusal::Unavailable);
            }
        }
    }
    Ok(held)
}

/// The value keying an item's leases: its entries' values joined by `|` (each escaped as the
/// counter-key grammar escapes a value when there are several); `None` when the request lacks
/// one.
fn key_of(
    config: &GatewayConfig,
    entries: &[EntryConfig],
    parts: &Parts,
) -> Result<Option<String>, KeyRejection> {
    if let [only] = entries {
        return descriptors::value_of(config, &only.source, parts);
    }
    let mut out = String::new();
    for (i, entry) in entries.iter().enumerate() {
        let Some(value) = descriptors::value_of(config, &entry.source, parts)? else {
            return Ok(None);
        };
        if i > 0 {
            out.push('|');
        }
        let start = out.len();
        out.push_str(&value);
        flowgate::store::key::escape_from(&mut out, start);
    }
    Ok(Some(out))
}

impl Held {
    /// Releases every lease now, each within [`RELEASE_TIMEOUT`].
    pub(crate) async fn give_back(mut self) {
        let leases = std::mem::take(&mut self.leases);
        release_all(&self.service, leases).await;
    }

    /// Holds the leases in a task of their own ([`keep`]) until the returned [`Lease`] is
    /// dropped; `None` when there is none to hold.
    pub(crate) fn keep(mut self) -> Option<Lease> {
        if self.leases.is_empty() {
            return None;
        }
        let leases = std::mem::take(&mut self.leases);
        let (stop, stopped) = oneshot::channel();
        tokio::spawn(keep(self.service.clone(), leases, stopped));
        Some(Lease { _stop: stop })
    }
}

/// Releases `leases`, each within [`RELEASE_TIMEOUT`] (one that cannot be released expires).
async fn release_all(service: &Service, leases: Vec<HeldLease>) {
    let store = service.backend().leases();
    for lease in leases {
        match tokio::time::timeout(RELEASE_TIMEOUT, store.release(&lease.key, lease.id)).await {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => {
                tracing::debug!(error = %error, "a lease could not be released; it expires");
            }
            Err(_) => tracing::debug!("a lease release timed out; it expires"),
        }
        service.metrics().gateway_lease_ended();
    }
}

/// A request's hold on its leases: they are released when it is dropped.
#[derive(Debug)]
pub struct Lease {
    /// Dropped: the keeper releases.
    _stop: oneshot::Sender<()>,
}

/// Renews `leases` every half of their shortest lease time until `stopped` ends, then
/// releases them.
async fn keep(
    service: Arc<Service>,
    mut leases: Vec<HeldLease>,
    mut stopped: oneshot::Receiver<()>,
) {
    let shortest = leases
        .iter()
        .map(|l| l.terms.ttl())
        .min()
        .unwrap_or(Duration::MAX);
    let every = (shortest / 2).max(Duration::from_millis(1));
    loop {
        tokio::select! {
            biased;
            _ = &mut stopped => break,
            () = tokio::time::sleep(every) => {}
        }
        renew(&service, &mut leases, every.min(RELEASE_TIMEOUT)).await;
        if leases.is_empty() {
            // Every lease was lost: nothing more to renew or release.
            return;
        }
    }
    release_all(&service, leases).await;
}

/// Renews every lease (each within `timeout`); a lease found expired is dropped and counted
/// (`flowgate_gateway_leases_lost_total`); a store error leaves it for the next round.
async fn renew(service: &Service, leases: &mut Vec<HeldLease>, timeout: Duration) {
    let store = service.backend().leases();
    let mut i = 0;
    while i < leases.len() {
        let lease = &leases[i];
        let renewed =
            tokio::time::timeout(timeout, store.renew(&lease.key, lease.id, &lease.terms)).await;
        match renewed {
            Ok(Ok(false)) => {
                tracing::warn!(
                    "an in-flight lease expired before its request ended; it no longer counts"
                );
                service.metrics().gateway_lease_lost();
                service.metrics().gateway_lease_ended();
                leases.swap_remove(i);
                continue;
            }
            Ok(Ok(true)) => {}
            Ok(Err(error)) => tracing::debug!(error = %error, "a lease renewal failed"),
            Err(_) => tracing::debug!("a lease renewal timed out"),
        }
        i += 1;
    }
}

/// A response body holding its request's [`Lease`] until it ends, fails or is dropped (the
/// client went away). Without a lease (no `in_flight`), just `B`.
#[derive(Debug)]
pub struct LeasedBody<B> {
    /// The body.
    inner: B,
    /// The request's leases, if it holds any.
    lease: Option<Lease>,
}

impl<B: http_body::Body> LeasedBody<B> {
    /// `inner`, holding `lease` until it ends. A body that has already ended (nobody will poll
    /// it) lets the lease go now.
    pub(crate) fn new(inner: B, lease: Option<Lease>) -> Self {
        let lease = lease.filter(|_| !inner.is_end_stream());
        LeasedBody { inner, lease }
    }
}

impl<B> http_body::Body for LeasedBody<B>
where
    B: http_body::Body<Data = bytes::Bytes> + Unpin,
{
    type Data = bytes::Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, B::Error>>> {
        let this = self.get_mut();
        let frame = std::pin::Pin::new(&mut this.inner).poll_frame(cx);
        if this.lease.is_some() {
            // Ended, failed, or at its last byte (hyper stops there for a body of known
            // length and never asks for the end): the request is no longer in flight.
            let ended = match &frame {
                std::task::Poll::Ready(None | Some(Err(_))) => true,
                std::task::Poll::Ready(Some(Ok(_))) => this.inner.is_end_stream(),
                std::task::Poll::Pending => false,
            };
            if ended {
                this.lease = None;
            }
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::gateway::Source;
    use flowgate::http::key::Header;

    fn parts(api_key: Option<&str>) -> Parts {
        let mut request = http::Request::builder().uri("/a|b");
        if let Some(key) = api_key {
            request = request.header("x-api-key", key);
        }
        request.body(()).unwrap().into_parts().0
    }

    #[test]
    fn keys_join_their_values_unambiguously_and_skip_a_missing_one() {
        let config = GatewayConfig::default_for("d");
        let header = EntryConfig {
            key: "x-api-key".into(),
            source: Source::Header(Header::new(http::HeaderName::from_static("x-api-key"))),
        };
        let path = EntryConfig {
            key: "path".into(),
            source: Source::Path,
        };
        let one = std::slice::from_ref(&header);
        assert_eq!(
            key_of(&config, one, &parts(Some("k|1")))
                .unwrap()
                .as_deref(),
            Some("k|1"),
            "one value: as it is (the lease key escapes it)"
        );
        let two = [header, path];
        assert_eq!(
            key_of(&config, &two, &parts(Some(r"k\|1")))
                .unwrap()
                .as_deref(),
            Some(r"k\\\|1|/a\|b")
        );
        assert_eq!(key_of(&config, &two, &parts(None)).unwrap(), None);
        assert_eq!(key_of(&config, &two[..1], &parts(None)).unwrap(), None);
    }
}
