//! A simulated Envoy: the library's [`QuotaClient`] (what the `rate_limit_quota` filter does
//! with each bucket) over a real `StreamRateLimitQuotas` stream. The service's tests and
//! `flowgate loadgen --rlqs` run fleets of them.
//!
//! As Envoy does, it opens its stream at its first request, reports a new bucket at once
//! ([`Envoy::flush`]) and every bucket each interval ([`Envoy::report`], which also reopens a
//! stream that the server ended — to the next target, as a load balancer would), and applies
//! the server's actions as they arrive ([`Envoy::receive`]). Time is the caller's: every call
//! takes `now`, so a test can run a fleet on a manual clock.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf::Duration as DurationPb;
use flowgate::clock::Nanos;
use flowgate::envoy::Entry;
use flowgate::rlqs::client::{BucketSettings, QuotaClient, Strategy, Usage};
use tokio::sync::mpsc;
use tonic::Status;
use tonic::transport::{Channel, Endpoint};

use super::bucket::{BucketKey, read_action};

/// What the server told a stream.
#[derive(Debug)]
enum Incoming {
    /// A response message.
    Message(RateLimitQuotaResponse),
    /// The stream ended (with `OK` or an error).
    Closed(Status),
}

/// An open stream.
struct Stream {
    /// Report messages to send.
    out: mpsc::Sender<RateLimitQuotaUsageReports>,
    /// What came back.
    incoming: mpsc::Receiver<Incoming>,
}

/// What happened to an Envoy's assignments, for measurements.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvoyStats {
    /// Response messages received.
    pub messages: u64,
    /// Assignments applied.
    pub assignments: u64,
    /// Assignments that replaced a token bucket with a new (full) one.
    pub replaced: u64,
    /// Abandon actions received.
    pub abandoned: u64,
    /// Streams opened.
    pub connects: u64,
    /// Streams that ended, and the last status they ended with.
    pub closed: u64,
    /// The last status a stream ended with.
    pub last_status: Option<(tonic::Code, String)>,
}

/// One simulated Envoy. See the [module docs](self).
pub struct Envoy {
    domain: String,
    /// gRPC endpoints tried in turn.
    targets: Vec<Endpoint>,
    /// The next target to try.
    next: usize,
    buckets: QuotaClient<BucketKey>,
    /// Each bucket's id as sent.
    ids: BTreeMap<BucketKey, BucketId>,
    stream: Option<Stream>,
    stats: EnvoyStats,
    /// Messages received, shared with observers.
    received: Arc<AtomicU64>,
}

impl std::fmt::Debug for Envoy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Envoy")
            .field("domain", &self.domain)
            .field("buckets", &self.buckets.len())
            .field("connected", &self.stream.is_some())
            .finish_non_exhaustive()
    }
}

/// A bucket id from `(key, value)` pairs.
pub fn bucket(pairs: &[(&str, &str)]) -> BucketKey {
    let mut key: BucketKey = pairs.iter().map(|(k, v)| Entry::new(*k, *v)).collect();
    key.sort_by(|a, b| a.key.cmp(&b.key));
    key
}

impl Envoy {
    /// An Envoy of `domain` whose buckets behave as `settings` say, connecting to `targets`
    /// (`http://host:port`; the first one first).
    pub fn new(
        domain: &str,
        targets: &[String],
        settings: BucketSettings,
    ) -> Result<Envoy, String> {
        let targets = targets
            .iter()
            .map(|t| Endpoint::from_shared(t.clone()).map_err(|e| format!("{t}: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        if targets.is_empty() {
            return Err("no target".into());
        }
        Ok(Envoy {
            domain: domain.to_owned(),
            targets,
            next: 0,
            buckets: QuotaClient::new(settings),
            ids: BTreeMap::new(),
            stream: None,
            stats: EnvoyStats::default(),
            received: Arc::new(AtomicU64::new(0)),
        })
    }

    /// Starts with target `index` (a fleet spreads its Envoys over the servers).
    pub fn starting_at(mut self, index: usize) -> Self {
        self.next = index % self.targets.len();
        self
    }

    /// Decides a request matched into `bucket` at `now`.
    pub fn request(&mut self, bucket: &BucketKey, now: Nanos) -> bool {
        if !self.ids.contains_key(bucket) {
            self.ids.insert(
                bucket.clone(),
                BucketId {
                    bucket: bucket
                        .iter()
                        .map(|e| (e.key.clone(), e.value.clone()))
                        .collect(),
                },
            );
        }
        self.buckets.request(bucket, now)
    }

    /// Sends the first report of every bucket created since the last call (Envoy sends each
    /// at once), opening the stream if needed. Returns the bucket reports sent.
    pub async fn flush(&mut self) -> u64 {
        let first = self.buckets.take_first_reports();
        let mut sent = 0;
        for usage in first {
            let message = self.message(vec![usage]);
            if self.send(message).await {
                sent += 1;
            }
        }
        sent
    }

    /// The periodic report at `now` (every bucket), reopening the stream if it ended.
    /// Returns the bucket reports sent.
    pub async fn report(&mut self, now: Nanos) -> u64 {
        let usages = self.buckets.take_reports(now);
        self.ids
            .retain(|k, _| usages.iter().any(|u| &u.bucket == k));
        let count = usages.len() as u64;
        let message = self.message(usages);
        if self.send(message).await { count } else { 0 }
    }

    /// Applies every message that has arrived, at `now`; returns how many.
    pub fn receive(&mut self, now: Nanos) -> usize {
        let mut applied = 0;
        while let Some(stream) = self.stream.as_mut() {
            match stream.incoming.try_recv() {
                Ok(Incoming::Message(message)) => {
                    self.apply(message, now);
                    applied += 1;
                }
                Ok(Incoming::Closed(status)) => self.closed(status),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    self.closed(Status::unavailable("the stream went away"))
                }
            }
        }
        applied
    }

    /// Waits for the next message (or the stream's end) and applies it at `now`; `false`
    /// when there is no stream.
    pub async fn receive_one(&mut self, now: Nanos) -> bool {
        let Some(stream) = self.stream.as_mut() else {
            return false;
        };
        match stream.incoming.recv().await {
            Some(Incoming::Message(message)) => self.apply(message, now),
            Some(Incoming::Closed(status)) => self.closed(status),
            None => self.closed(Status::unavailable("the stream went away")),
        }
        true
    }

    /// Whether a stream is open.
    pub fn connected(&self) -> bool {
        self.stream.is_some()
    }

    /// Closes the stream (the Envoy stops; its buckets stay as they are).
    pub fn disconnect(&mut self) {
        self.stream = None;
    }

    /// Where `bucket` stands at `now`.
    pub fn phase(
        &mut self,
        bucket: &BucketKey,
        now: Nanos,
    ) -> Option<flowgate::rlqs::client::Phase> {
        self.buckets.phase(bucket, now)
    }

    /// What happened so far.
    pub fn stats(&self) -> &EnvoyStats {
        &self.stats
    }

    /// A counter of messages received, readable from elsewhere.
    pub fn received_counter(&self) -> Arc<AtomicU64> {
        self.received.clone()
    }

    fn message(&self, usages: Vec<Usage<BucketKey>>) -> RateLimitQuotaUsageReports {
        RateLimitQuotaUsageReports {
            domain: self.domain.clone(),
            bucket_quota_usages: usages
                .into_iter()
                .map(|u| BucketQuotaUsage {
                    bucket_id: self.ids.get(&u.bucket).cloned(),
                    time_elapsed: Some(DurationPb {
                        seconds: i64::try_from(u.elapsed.as_secs()).unwrap_or(i64::MAX),
                        nanos: i32::try_from(u.elapsed.subsec_nanos()).unwrap_or(0),
                    }),
                    num_requests_allowed: u.allowed,
                    num_requests_denied: u.denied,
                })
                .collect(),
        }
    }

    /// Sends `message` (opening the stream if needed); whether it was sent.
    async fn send(&mut self, message: RateLimitQuotaUsageReports) -> bool {
        if self.stream.is_none() && !self.open().await {
            // Envoy drops the report when it cannot open the stream.
            return false;
        }
        match &self.stream {
            Some(stream) if stream.out.send(message).await.is_ok() => true,
            _ => {
                self.stream = None;
                false
            }
        }
    }

    /// Opens a stream to the next target; `false` if it cannot be opened.
    async fn open(&mut self) -> bool {
        let endpoint = self.targets[self.next].clone();
        self.next = (self.next + 1) % self.targets.len();
        let Ok(channel): Result<Channel, _> = endpoint.connect().await else {
            return false;
        };
        let mut client = RateLimitQuotaServiceClient::new(channel);
        let (out, reports) = mpsc::channel(16);
        let reports = futures_util::stream::unfold(reports, |mut rx| async move {
            rx.recv().await.map(|m| (m, rx))
        });
        let Ok(response) = client.stream_rate_limit_quotas(reports).await else {
            return false;
        };
        let mut inbound = response.into_inner();
        let (tx, incoming) = mpsc::channel(64);
        tokio::spawn(async move {
            loop {
                match inbound.message().await {
                    Ok(Some(message)) => {
                        if tx.send(Incoming::Message(message)).await.is_err() {
                            return;
                        }
                    }
                    Ok(None) => {
                        let _ = tx.send(Incoming::Closed(Status::ok(""))).await;
                        return;
                    }
                    Err(status) => {
                        let _ = tx.send(Incoming::Closed(status)).await;
                        return;
                    }
                }
            }
        });
        self.stream = Some(Stream { out, incoming });
        self.stats.connects += 1;
        true
    }

    fn closed(&mut self, status: Status) {
        self.stream = None;
        self.stats.closed += 1;
        self.stats.last_status = Some((status.code(), status.message().to_owned()));
    }

    fn apply(&mut self, message: RateLimitQuotaResponse, now: Nanos) {
        self.stats.messages += 1;
        self.received.fetch_add(1, Ordering::Relaxed);
        for action in &message.bucket_action {
            let Some((what, key)) = read_action(action) else {
                continue;
            };
            match what {
                None => {
                    self.buckets.abandon(&key);
                    self.ids.remove(&key);
                    self.stats.abandoned += 1;
                }
                Some((strategy, ttl)) => {
                    let before = self.buckets.phase(&key, now);
                    if self.buckets.assign(&key, strategy, ttl, now) {
                        self.stats.assignments += 1;
                        let kept = matches!(before, Some(flowgate::rlqs::client::Phase::Active(s)) if s == strategy);
                        if matches!(strategy, Strategy::TokenBucket(_)) && !kept {
                            self.stats.replaced += 1;
                        }
                    }
                }
            }
        }
    }
}
