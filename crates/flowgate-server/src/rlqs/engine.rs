//! The RLQS engine: every open stream and its buckets, the rule instances they share, what
//! each report changes, and the tick that hands out each rule instance's division.
//!
//! Locking: one mutex over the state, never held across an `await`. A report or a tick
//! takes what it needs under the lock, asks the ledger without it, and applies the answer
//! under the lock again — to whatever still exists by then (a stream may have closed).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{BucketId, RateLimitQuotaResponse};
use flowgate::FailMode;
use flowgate::clock::{Clock, Nanos, nanos};
use flowgate::rlqs::client::Strategy;
use flowgate::rlqs::ledger::{self, Holding, Joined, Ledger, Terms, Tick};
use flowgate::rlqs::{DemandEstimate, MemoryLedger, Share};
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};
use tonic::Status;

use super::RlqsOptions;
use super::bucket::{self, BucketKey, Divided, Target};
use crate::api::Service;
use crate::metrics::RlqsMetrics;
use crate::metrics::RuleLabels;

/// Most reported requests (allowed + denied) in one bucket's report: more than any Envoy
/// handles between two reports (10¹² is a million requests per second for eleven days).
pub const MAX_REPORTED_COUNT: u64 = 1_000_000_000_000;

/// Response messages waiting for a stream's client; a client that leaves this many unread
/// has the next ones skipped (each tick's message repeats every assignment).
pub const OUTBOUND_CAPACITY: usize = 4;

/// Ledger calls (one per rule instance, or per joining bucket) in flight at once.
const LEDGER_CONCURRENCY: usize = 64;

/// Ticks in a row whose message could not be queued before a stream is ended as not reading.
pub const MAX_MISSED_TICKS: u32 = 3;

/// What a stream's response side is sent.
pub(super) type Outbound = mpsc::Sender<Result<RateLimitQuotaResponse, Status>>;

/// One bucket of one stream.
#[derive(Debug)]
struct Bucket {
    /// The id as the Envoy sent it, echoed in actions.
    id: BucketId,
    /// Its member id in the ledger (unique per stream and bucket).
    member: String,
    /// What it gets.
    target: Target,
    /// Its reported demand.
    demand: DemandEstimate,
    /// What it holds of its rule instance's divisions (divided targets).
    holding: Holding,
    /// The strategy last sent.
    sent: Option<Strategy>,
}

/// One open stream.
#[derive(Debug)]
struct StreamState {
    /// The prefix of its buckets' member ids: `{instance}:{stream}`.
    prefix: String,
    /// Its domain (from the first report).
    domain: Option<String>,
    /// Where its response messages go.
    out: Outbound,
    /// Ends its response stream with a status (after the messages queued before).
    stop: Option<oneshot::Sender<Status>>,
    /// Its buckets.
    buckets: HashMap<BucketKey, Bucket>,
    /// Buckets created so far (for member ids).
    created: u64,
    /// Ticks in a row whose message could not be queued.
    missed: u32,
    /// Tells the stream's reader to stop.
    ended: Arc<tokio::sync::Notify>,
}

/// A rule instance some of this instance's buckets fall under.
#[derive(Debug)]
struct RuleInstance {
    /// Its terms, period, fail mode and labels (from its first member).
    divided: Divided,
    /// (stream, bucket) of each member here.
    members: BTreeSet<(u64, BucketKey)>,
    /// The last tick handed out.
    last_tick: Option<u64>,
}

#[derive(Debug, Default)]
struct State {
    streams: HashMap<u64, StreamState>,
    rules: HashMap<String, RuleInstance>,
    /// The policy version the buckets' targets were resolved under.
    version: u64,
    /// Rules whose share metrics were set, to zero those that go away.
    labelled: BTreeSet<(String, String)>,
}

/// Why a stream is ended by the engine.
#[derive(Debug)]
pub(super) struct StreamError {
    /// The status the client gets.
    pub(super) status: Status,
    /// The metric reason.
    pub(super) reason: &'static str,
}

impl StreamError {
    fn new(reason: &'static str, status: Status) -> Self {
        StreamError { status, reason }
    }
}

/// The engine. See the [module docs](self).
pub(super) struct Engine {
    service: Arc<Service>,
    /// Shared divisions: Redis when the counters are, else in memory.
    ledger: Arc<dyn Ledger>,
    /// Divisions of `limit / instances` for rules that `fail: local` while the ledger is away.
    fallback: MemoryLedger<Arc<dyn Clock>>,
    clock: Arc<dyn Clock>,
    options: RlqsOptions,
    /// This process's prefix of member ids.
    instance: String,
    metrics: RlqsMetrics,
    state: Mutex<State>,
    draining: AtomicBool,
    next_stream: AtomicU64,
    /// Ledger time minus local time, as last seen (ns).
    offset: AtomicI64,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

/// One stream's actions gathered for one message.
type Batch = BTreeMap<u64, Vec<BucketAction>>;

impl Engine {
    pub(super) fn new(
        service: Arc<Service>,
        ledger: Arc<dyn Ledger>,
        clock: Arc<dyn Clock>,
        options: RlqsOptions,
    ) -> Engine {
        let metrics = service.metrics().rlqs().clone();
        Engine {
            fallback: MemoryLedger::with_clock(clock.clone()),
            ledger,
            clock,
            options,
            // Random per process (std's randomly keyed hasher): no `rand` in the slim build.
            instance: format!(
                "{:08x}",
                std::hash::BuildHasher::hash_one(&std::hash::RandomState::new(), std::process::id())
                    as u32
            ),
            metrics,
            service,
            state: Mutex::default(),
            draining: AtomicBool::new(false),
            next_stream: AtomicU64::new(1),
            offset: AtomicI64::new(0),
        }
    }

    /// Local time.
    pub(super) fn now(&self) -> Nanos {
        self.clock.now()
    }

    /// The largest report message accepted (the service's `max_body_bytes`).
    pub(super) fn max_message_bytes(&self) -> usize {
        self.service.input_limits().max_body_bytes
    }

    /// Registers a new stream; `Err` when the server is draining or full.
    pub(super) fn open(
        &self,
        out: Outbound,
        stop: oneshot::Sender<Status>,
    ) -> Result<(u64, Arc<tokio::sync::Notify>), Status> {
        if self.draining.load(Ordering::Relaxed) {
            self.metrics.refused("draining");
            return Err(Status::unavailable(
                "this Flowgate instance is shutting down; connect to another",
            ));
        }
        let mut state = self.state.lock();
        if state.streams.len() >= self.options.max_streams {
            drop(state);
            self.metrics.refused("capacity");
            return Err(Status::resource_exhausted(format!(
                "this Flowgate instance serves at most {} RLQS streams",
                self.options.max_streams
            )));
        }
        let id = self.next_stream.fetch_add(1, Ordering::Relaxed);
        let ended = Arc::new(tokio::sync::Notify::new());
        state.streams.insert(
            id,
            StreamState {
                prefix: format!("{}:{id}", self.instance),
                domain: None,
                out,
                stop: Some(stop),
                buckets: HashMap::new(),
                created: 0,
                missed: 0,
                ended: ended.clone(),
            },
        );
        drop(state);
        self.metrics.streams_opened.inc();
        self.metrics.streams.inc();
        Ok((id, ended))
    }

    /// Forgets stream `id` (its client went away or it was ended). Its members stay in the
    /// ledger until they go stale: the Envoy may still enforce its last assignments.
    pub(super) fn close(&self, id: u64) {
        let mut state = self.state.lock();
        let Some(stream) = state.streams.remove(&id) else {
            return;
        };
        self.metrics.streams.dec();
        self.metrics.buckets.dec_by(stream.buckets.len() as i64);
        for (key, bucket) in stream.buckets {
            if let Target::Divided(d) = &bucket.target {
                leave(&mut state.rules, &d.rule, id, &key);
            }
        }
    }

    /// Ends stream `id` with `error` (counted), after the messages already queued.
    pub(super) fn fail(&self, id: u64, error: StreamError) {
        self.metrics.stream_error(error.reason);
        let mut state = self.state.lock();
        let Some(stream) = state.streams.get_mut(&id) else {
            return;
        };
        if let Some(stop) = stream.stop.take() {
            let _ = stop.send(error.status);
        }
        stream.ended.notify_one();
    }

    /// Takes one report message of stream `id`: checks it, updates demands, and answers new
    /// buckets (a blanket rule, or a first share from the ledger).
    pub(super) async fn report(
        self: &Arc<Self>,
        id: u64,
        domain: &str,
        usages: Vec<BucketQuotaUsage>,
    ) -> Result<(), StreamError> {
        let now = self.clock.now();
        let active = self.service.active();
        let ttl = active.policy.rlqs(domain).assignment_ttl;
        let mut actions = Vec::new();
        let mut joins: Vec<(BucketKey, Divided, String)> = Vec::new();
        // Counted once the message is answered, so that whoever sees the count sees the answer.
        let mut reports = 0;
        {
            let mut guard = self.state.lock();
            let state = &mut *guard;
            let Some(stream) = state.streams.get_mut(&id) else {
                return Err(StreamError::new(
                    "gone",
                    Status::cancelled("the stream was ended"),
                ));
            };
            match &stream.domain {
                None => {
                    if !active.policy.rules.has_domain(domain) {
                        return Err(StreamError::new(
                            "unknown_domain",
                            Status::not_found(format!("no rules for domain `{domain}`")),
                        ));
                    }
                    stream.domain = Some(domain.to_owned());
                }
                Some(d) if d != domain => {
                    return Err(StreamError::new(
                        "domain_changed",
                        Status::invalid_argument(
                            "the domain of a stream cannot change; open a new stream",
                        ),
                    ));
                }
                Some(_) => {}
            }
            for usage in usages {
                let key = bucket::normalize(usage.bucket_id.as_ref()).map_err(|e| {
                    StreamError::new("malformed_bucket", Status::invalid_argument(e.0))
                })?;
                let count = usage
                    .num_requests_allowed
                    .checked_add(usage.num_requests_denied)
                    .filter(|&c| c <= MAX_REPORTED_COUNT)
                    .ok_or_else(|| {
                        StreamError::new(
                            "absurd_count",
                            Status::invalid_argument(format!(
                                "a report counts more than {MAX_REPORTED_COUNT} requests"
                            )),
                        )
                    })?;
                reports += 1;
                self.metrics
                    .reported_requests
                    .get_or_create(&crate::metrics::RlqsDecisionLabel {
                        decision: "allowed",
                    })
                    .inc_by(usage.num_requests_allowed);
                self.metrics
                    .reported_requests
                    .get_or_create(&crate::metrics::RlqsDecisionLabel { decision: "denied" })
                    .inc_by(usage.num_requests_denied);
                if let Some(bucket) = stream.buckets.get_mut(&key) {
                    bucket.demand.report_with_denials(
                        count,
                        usage.num_requests_denied,
                        now,
                        period_of(&bucket.target),
                    );
                    continue;
                }
                if stream.buckets.len() >= self.options.max_buckets_per_stream {
                    return Err(StreamError::new(
                        "too_many_buckets",
                        Status::resource_exhausted(format!(
                            "a stream may report at most {} buckets",
                            self.options.max_buckets_per_stream
                        )),
                    ));
                }
                let target = bucket::resolve(&active, domain, &key);
                let member = format!("{}.{}", stream.prefix, stream.created);
                stream.created += 1;
                let mut demand = DemandEstimate::default();
                demand.report(count, now, period_of(&target));
                let mut new = Bucket {
                    id: usage.bucket_id.clone().unwrap_or_default(),
                    member: member.clone(),
                    target: target.clone(),
                    demand,
                    holding: Holding::default(),
                    sent: None,
                };
                match target {
                    Target::Blanket(strategy) => {
                        actions.push(bucket::assignment(&new.id, &strategy, ttl));
                        self.metrics.assignment(bucket::action_name(&strategy));
                        new.sent = Some(strategy);
                    }
                    Target::Divided(d) => {
                        state
                            .rules
                            .entry(d.rule.clone())
                            .or_insert_with(|| RuleInstance {
                                divided: d.clone(),
                                members: BTreeSet::new(),
                                last_tick: None,
                            })
                            .members
                            .insert((id, key.clone()));
                        joins.push((key.clone(), d, member));
                    }
                }
                stream.buckets.insert(key, new);
                self.metrics.buckets.inc();
            }
        }
        let mut answers = Vec::with_capacity(joins.len());
        let mut joins = joins.into_iter();
        let mut tasks = tokio::task::JoinSet::new();
        loop {
            while tasks.len() < LEDGER_CONCURRENCY
                && let Some((key, divided, member)) = joins.next()
            {
                let engine = self.clone();
                tasks.spawn(async move {
                    let joined = engine.join(&divided, &member).await;
                    (key, joined)
                });
            }
            match tasks.join_next().await {
                Some(Ok(answer)) => answers.push(answer),
                Some(Err(_)) => {}
                None => break,
            }
        }
        for (key, joined) in answers {
            let mut state = self.state.lock();
            let Some(bucket) = state
                .streams
                .get_mut(&id)
                .and_then(|s| s.buckets.get_mut(&key))
            else {
                continue;
            };
            if let Some(answer) = joined {
                actions.push(bucket::assignment(&bucket.id, &answer.strategy, ttl));
                self.metrics
                    .assignment(bucket::action_name(&answer.strategy));
                if let Some((tick, share)) = answer.claim {
                    bucket.holding.claimed(tick, share);
                }
                bucket.sent = Some(answer.strategy);
            }
        }
        if !actions.is_empty() {
            self.send(id, actions);
        }
        self.metrics.reports.inc_by(reports);
        Ok(())
    }

    /// A first assignment for a new member, or `None` if it waits for a later division.
    async fn join(&self, divided: &Divided, member: &str) -> Option<JoinAnswer> {
        match ledger::join(&*self.ledger, &divided.rule, &divided.terms, member).await {
            Ok(Joined::Claimed { share, tick }) => {
                self.metrics.join("claimed");
                Some(JoinAnswer {
                    strategy: Strategy::for_share(share, divided.period),
                    claim: Some((tick, share)),
                })
            }
            Ok(Joined::Waiting) => {
                self.metrics.join("waiting");
                None
            }
            Err(e) => {
                self.metrics.ledger_failures.inc();
                self.metrics.join("fallback");
                tracing::warn!(rule = %divided.rule, "RLQS ledger unavailable at a join: {e}");
                Some(JoinAnswer {
                    strategy: self.fallback_strategy(divided, member).await,
                    claim: None,
                })
            }
        }
    }

    /// What a member gets while the ledger is away, by the rule's `fail` mode: open allows
    /// all, closed denies all, local divides `limit / instances` among this instance's
    /// members.
    async fn fallback_strategy(&self, divided: &Divided, member: &str) -> Strategy {
        match divided.fail.unwrap_or(self.options.fail) {
            FailMode::Open => Strategy::AllowAll,
            FailMode::Local => {
                let terms = self.local_terms(&divided.terms);
                match ledger::join(&self.fallback, &divided.rule, &terms, member).await {
                    Ok(joined) => joined.share().map_or(Strategy::DenyAll, |s| {
                        Strategy::for_share(s, divided.period)
                    }),
                    Err(_) => Strategy::DenyAll,
                }
            }
            // Closed, and any mode this build does not know of: deny.
            _ => Strategy::DenyAll,
        }
    }

    fn local_terms(&self, terms: &Terms) -> Terms {
        Terms {
            limit: terms.limit / self.options.instances.max(1),
            ..*terms
        }
    }

    /// Notes the ledger's time `ledger_now`, read just now.
    fn observe(&self, ledger_now: Nanos) {
        let offset = i128::from(ledger_now) - i128::from(self.clock.now());
        self.offset.store(
            i64::try_from(offset).unwrap_or(if offset < 0 { i64::MIN } else { i64::MAX }),
            Ordering::Relaxed,
        );
    }

    /// The ledger's time, estimated from the local clock.
    fn ledger_now(&self) -> Nanos {
        let offset = self.offset.load(Ordering::Relaxed);
        self.clock.now().saturating_add_signed(offset)
    }

    /// When the next tick of any rule instance is due, in local time; `None` without any.
    pub(super) fn next_due(&self) -> Option<Nanos> {
        let now = self.ledger_now();
        let state = self.state.lock();
        let next = state
            .rules
            .values()
            .map(|r| {
                let tick = nanos(r.divided.terms.timing.tick).max(1);
                (now / tick + 1) * tick
            })
            .min()?;
        let offset = self.offset.load(Ordering::Relaxed);
        Some(next.saturating_add_signed(offset.saturating_neg()))
    }

    /// The smallest report interval of the running configuration (how often blanket
    /// assignments are refreshed and idle buckets looked for when no rule is divided).
    pub(super) fn base_interval(&self) -> Duration {
        let active = self.service.active();
        active
            .policy
            .rules
            .domains()
            .map(|d| active.policy.rlqs(d).report_interval)
            .min()
            .unwrap_or(crate::config::rlqs::DEFAULT_REPORT_INTERVAL)
    }

    /// One rule instance's tick: its division applied to this instance's members (or its
    /// fail mode, if the ledger is away); the actions to send.
    async fn tick_rule(
        &self,
        rule: &str,
        divided: &Divided,
        demands: &[(String, Option<u64>)],
    ) -> Batch {
        let mut batch: Batch = BTreeMap::new();
        let refs: Vec<(&str, Option<u64>)> =
            demands.iter().map(|(m, d)| (m.as_str(), *d)).collect();
        match ledger::tick(&*self.ledger, rule, &divided.terms, &refs).await {
            Ok(tick) => {
                self.observe(tick.now);
                let claims = self.apply(rule, &tick, &mut batch);
                for member in claims {
                    self.claim(rule, divided, &tick, &member, &mut batch).await;
                }
            }
            Err(e) => {
                self.metrics.ledger_failures.inc();
                tracing::warn!(%rule, "RLQS ledger unavailable at a tick: {e}");
                self.apply_fallback(rule, divided, &refs, &mut batch).await;
            }
        }
        batch
    }

    /// One pass: re-resolves targets after a reload, hands out every due rule instance's
    /// division (all of them when `all`), refreshes blanket assignments, abandons idle
    /// buckets and ends streams that do not read.
    pub(super) async fn tick(self: &Arc<Self>, all: bool) {
        let active = self.service.active();
        self.reresolve(&active).await;
        let now_ledger = self.ledger_now();
        // Per rule due: its key, its division, its members with their demand.
        #[allow(clippy::type_complexity)]
        let due: Vec<(String, Divided, Vec<(String, Option<u64>)>)> = {
            let state = self.state.lock();
            state
                .rules
                .iter()
                .filter(|(_, r)| {
                    all || r.last_tick != Some(r.divided.terms.timing.tick_of(now_ledger))
                })
                .map(|(key, r)| {
                    let demands = r
                        .members
                        .iter()
                        .filter_map(|(s, k)| {
                            let b = state.streams.get(s)?.buckets.get(k)?;
                            Some((b.member.clone(), b.demand.per_period()))
                        })
                        .collect();
                    (key.clone(), r.divided.clone(), demands)
                })
                .collect()
        };
        // The rule instances' ledger calls run concurrently (pipelined on the store's
        // connection), a bounded number at a time.
        let mut batch: Batch = BTreeMap::new();
        let mut due = due.into_iter();
        let mut tasks = tokio::task::JoinSet::new();
        loop {
            while tasks.len() < LEDGER_CONCURRENCY
                && let Some((rule, divided, demands)) = due.next()
            {
                let engine = self.clone();
                tasks.spawn(async move { engine.tick_rule(&rule, &divided, &demands).await });
            }
            match tasks.join_next().await {
                Some(Ok(part)) => {
                    for (stream, actions) in part {
                        batch.entry(stream).or_default().extend(actions);
                    }
                }
                Some(Err(_)) => {}
                None => break,
            }
        }
        self.refresh_and_abandon(&active, &mut batch).await;
        self.update_share_metrics();
        for (stream, actions) in batch {
            if !actions.is_empty() {
                self.send(stream, actions);
            }
        }
    }

    /// Applies `tick`'s division of `rule` to this instance's members; returns the members
    /// that have no share yet and may claim one.
    fn apply(&self, rule: &str, tick: &Tick, batch: &mut Batch) -> Vec<String> {
        let mut guard = self.state.lock();
        let state = &mut *guard;
        let Some(instance) = state.rules.get_mut(rule) else {
            return Vec::new();
        };
        instance.last_tick = Some(tick.number);
        let period = instance.divided.period;
        let mut claims = Vec::new();
        for (stream_id, key) in &instance.members {
            let Some(stream) = state.streams.get_mut(stream_id) else {
                continue;
            };
            let Some(domain) = stream.domain.clone() else {
                continue;
            };
            let Some(bucket) = stream.buckets.get_mut(key) else {
                continue;
            };
            let ttl = self.service.active().policy.rlqs(&domain).assignment_ttl;
            match bucket
                .holding
                .apply(tick.number, tick.current.get(&bucket.member))
            {
                Some(share) => {
                    let strategy = Strategy::for_share(share, period);
                    batch
                        .entry(*stream_id)
                        .or_default()
                        .push(bucket::assignment(&bucket.id, &strategy, ttl));
                    self.metrics.assignment(bucket::action_name(&strategy));
                    bucket.sent = Some(strategy);
                }
                None => claims.push(bucket.member.clone()),
            }
        }
        claims
    }

    /// A member without a share claims a first one in this tick.
    async fn claim(
        &self,
        rule: &str,
        divided: &Divided,
        tick: &Tick,
        member: &str,
        batch: &mut Batch,
    ) {
        let joined =
            match ledger::claim_first_share(&*self.ledger, rule, &divided.terms, tick).await {
                Ok(joined) => joined,
                Err(_) => {
                    self.metrics.ledger_failures.inc();
                    return;
                }
            };
        let Joined::Claimed { share, tick } = joined else {
            return;
        };
        let mut state = self.state.lock();
        let Some((stream_id, bucket, ttl)) = find_member(&mut state, rule, member, &self.service)
        else {
            return;
        };
        let strategy = Strategy::for_share(share, divided.period);
        bucket.holding.claimed(tick, share);
        bucket.sent = Some(strategy);
        batch
            .entry(stream_id)
            .or_default()
            .push(bucket::assignment(&bucket.id, &strategy, ttl));
        self.metrics.assignment(bucket::action_name(&strategy));
    }

    /// The ledger failed at a tick: every member of `rule` gets its fail mode's share.
    async fn apply_fallback(
        &self,
        rule: &str,
        divided: &Divided,
        demands: &[(&str, Option<u64>)],
        batch: &mut Batch,
    ) {
        let mode = divided.fail.unwrap_or(self.options.fail);
        let local = if mode == FailMode::Local {
            let terms = self.local_terms(&divided.terms);
            ledger::tick(&self.fallback, rule, &terms, demands)
                .await
                .ok()
        } else {
            None
        };
        let mut guard = self.state.lock();
        let state = &mut *guard;
        let Some(instance) = state.rules.get(rule) else {
            return;
        };
        for (stream_id, key) in &instance.members {
            let Some(stream) = state.streams.get_mut(stream_id) else {
                continue;
            };
            let Some(domain) = stream.domain.clone() else {
                continue;
            };
            let Some(bucket) = stream.buckets.get_mut(key) else {
                continue;
            };
            let ttl = self.service.active().policy.rlqs(&domain).assignment_ttl;
            let strategy = match mode {
                FailMode::Open => Strategy::AllowAll,
                FailMode::Local => match local.as_ref().and_then(|t| t.current.get(&bucket.member))
                {
                    Some(share) => Strategy::for_share(share, divided.period),
                    None => Strategy::DenyAll,
                },
                // Closed, and any mode this build does not know of: deny.
                _ => Strategy::DenyAll,
            };
            // The shared share is unknown now: start over once the ledger is back.
            bucket.holding.reset();
            bucket.sent = Some(strategy);
            batch
                .entry(*stream_id)
                .or_default()
                .push(bucket::assignment(&bucket.id, &strategy, ttl));
            self.metrics.assignment(bucket::action_name(&strategy));
        }
    }

    /// Refreshes blanket assignments, abandons buckets idle for `abandon_after`, and ends
    /// streams whose messages could not be queued for [`MAX_MISSED_TICKS`] ticks.
    async fn refresh_and_abandon(&self, active: &crate::api::Active, batch: &mut Batch) {
        let now = self.clock.now();
        let mut removed: Vec<(String, String)> = Vec::new();
        {
            let mut guard = self.state.lock();
            let state = &mut *guard;
            for (stream_id, stream) in &mut state.streams {
                let Some(domain) = stream.domain.clone() else {
                    continue;
                };
                let config = active.policy.rlqs(&domain);
                let idle_limit = nanos(config.abandon_after);
                let mut gone = Vec::new();
                for (key, bucket) in &stream.buckets {
                    if bucket
                        .demand
                        .idle_since()
                        .is_some_and(|since| now.saturating_sub(since) >= idle_limit)
                    {
                        gone.push(key.clone());
                    } else if let (Target::Blanket(strategy), Some(_)) =
                        (&bucket.target, bucket.sent)
                    {
                        batch
                            .entry(*stream_id)
                            .or_default()
                            .push(bucket::assignment(
                                &bucket.id,
                                strategy,
                                config.assignment_ttl,
                            ));
                        self.metrics.assignment(bucket::action_name(strategy));
                    }
                }
                for key in gone {
                    let Some(bucket) = stream.buckets.remove(&key) else {
                        continue;
                    };
                    self.metrics.buckets.dec();
                    batch
                        .entry(*stream_id)
                        .or_default()
                        .push(bucket::abandon(&bucket.id));
                    self.metrics.assignment("abandon");
                    if let Target::Divided(d) = &bucket.target {
                        leave(&mut state.rules, &d.rule, *stream_id, &key);
                        removed.push((d.rule.clone(), bucket.member));
                    }
                }
            }
        }
        // An abandoned bucket is erased by its Envoy: its share is free at once.
        for (rule, member) in removed {
            if self.ledger.remove(&rule, &[member.as_str()]).await.is_err() {
                self.metrics.ledger_failures.inc();
            }
        }
    }

    /// Re-resolves every bucket's target after a configuration reload; buckets whose rule
    /// instance changed leave the old one and join the new one at the next tick.
    async fn reresolve(&self, active: &crate::api::Active) {
        let mut rejoin: Vec<(u64, BucketKey, Divided, String)> = Vec::new();
        {
            let mut guard = self.state.lock();
            let state = &mut *guard;
            if state.version == active.version {
                return;
            }
            if state.version == 0 {
                state.version = active.version;
                return;
            }
            state.version = active.version;
            for (stream_id, stream) in &mut state.streams {
                let Some(domain) = stream.domain.clone() else {
                    continue;
                };
                for (key, bucket) in &mut stream.buckets {
                    let target = bucket::resolve(active, &domain, key);
                    if target == bucket.target {
                        continue;
                    }
                    if let Target::Divided(old) = &bucket.target {
                        leave(&mut state.rules, &old.rule, *stream_id, key);
                    }
                    bucket.holding.reset();
                    if let Target::Divided(new) = &target {
                        state
                            .rules
                            .entry(new.rule.clone())
                            .or_insert_with(|| RuleInstance {
                                divided: new.clone(),
                                members: BTreeSet::new(),
                                last_tick: None,
                            })
                            .members
                            .insert((*stream_id, key.clone()));
                        rejoin.push((*stream_id, key.clone(), new.clone(), bucket.member.clone()));
                    }
                    bucket.target = target;
                }
            }
        }
        for (stream_id, key, divided, member) in rejoin {
            let joined = self.join(&divided, &member).await;
            let mut state = self.state.lock();
            if let Some(bucket) = state
                .streams
                .get_mut(&stream_id)
                .and_then(|s| s.buckets.get_mut(&key))
                && let Some((tick, share)) = joined.and_then(|a| a.claim)
            {
                bucket.holding.claimed(tick, share);
            }
        }
    }

    /// Sets the per-rule share metrics from the members' current shares.
    fn update_share_metrics(&self) {
        let mut guard = self.state.lock();
        let state = &mut *guard;
        let mut sums: BTreeMap<(String, String), (u64, u64)> = BTreeMap::new();
        for instance in state.rules.values() {
            let entry = sums.entry(instance.divided.labels.clone()).or_default();
            for (s, k) in &instance.members {
                if let Some(b) = state.streams.get(s).and_then(|s| s.buckets.get(k)) {
                    entry.0 = entry
                        .0
                        .saturating_add(b.holding.current().map_or(0, |share| share.tokens));
                    entry.1 += 1;
                }
            }
        }
        for labels in state.labelled.iter() {
            if !sums.contains_key(labels) {
                let l = rule_labels(labels);
                self.metrics.share_tokens.get_or_create(&l).set(0);
                self.metrics.members.get_or_create(&l).set(0);
            }
        }
        for (labels, (tokens, members)) in &sums {
            let l = rule_labels(labels);
            self.metrics
                .share_tokens
                .get_or_create(&l)
                .set(i64::try_from(*tokens).unwrap_or(i64::MAX));
            self.metrics
                .members
                .get_or_create(&l)
                .set(i64::try_from(*members).unwrap_or(i64::MAX));
        }
        state.labelled = sums.into_keys().collect();
    }

    /// Queues one message of `actions` for stream `id`; a stream that does not read is
    /// ended after [`MAX_MISSED_TICKS`] messages in a row could not be queued.
    fn send(&self, id: u64, actions: Vec<BucketAction>) {
        let mut state = self.state.lock();
        let Some(stream) = state.streams.get_mut(&id) else {
            return;
        };
        let message = RateLimitQuotaResponse {
            bucket_action: actions,
        };
        match stream.out.try_send(Ok(message)) {
            Ok(()) => {
                stream.missed = 0;
                self.metrics.responses.inc();
            }
            Err(mpsc::error::TrySendError::Full(_)) => {
                stream.missed += 1;
                if stream.missed >= MAX_MISSED_TICKS
                    && let Some(stop) = stream.stop.take()
                {
                    stream.ended.notify_one();
                    drop(state);
                    self.metrics.stream_error("not_reading");
                    let _ = stop.send(Status::resource_exhausted(format!(
                        "the stream is not read: {MAX_MISSED_TICKS} assignment messages in a row could not be delivered"
                    )));
                }
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {}
        }
    }

    /// Starts draining: no new streams; every stream is sent its assignments with a time to
    /// live of zero (its Envoy falls back to `expired_assignment_behavior` at once) and is
    /// ended with `UNAVAILABLE`, so that its Envoy reconnects to another instance.
    pub(super) fn drain(&self) {
        if self.draining.swap(true, Ordering::Relaxed) {
            return;
        }
        let mut state = self.state.lock();
        // Their assignments expire now: their shares are free for the next division (the
        // Envoys come back through another instance as new members).
        let mut leaving: HashMap<String, Vec<String>> = HashMap::new();
        for stream in state.streams.values() {
            for bucket in stream.buckets.values() {
                if let Target::Divided(d) = &bucket.target {
                    leaving
                        .entry(d.rule.clone())
                        .or_default()
                        .push(bucket.member.clone());
                }
            }
        }
        if !leaving.is_empty() {
            let ledger = self.ledger.clone();
            tokio::spawn(async move {
                for (rule, members) in leaving {
                    let members: Vec<&str> = members.iter().map(String::as_str).collect();
                    let _ = ledger.remove(&rule, &members).await;
                }
            });
        }
        let streams = state.streams.len();
        for stream in state.streams.values_mut() {
            let actions: Vec<BucketAction> = stream
                .buckets
                .values()
                .filter_map(|b| {
                    b.sent
                        .map(|s| bucket::assignment(&b.id, &s, Duration::ZERO))
                })
                .collect();
            if !actions.is_empty() {
                self.metrics
                    .assignments
                    .get_or_create(&crate::metrics::RlqsActionLabel { action: "expire" })
                    .inc_by(actions.len() as u64);
                if stream
                    .out
                    .try_send(Ok(RateLimitQuotaResponse {
                        bucket_action: actions,
                    }))
                    .is_ok()
                {
                    self.metrics.responses.inc();
                }
            }
            if let Some(stop) = stream.stop.take() {
                let _ = stop.send(Status::unavailable(
                    "this Flowgate instance is shutting down; reconnect to another",
                ));
            }
            stream.ended.notify_one();
        }
        if streams > 0 {
            tracing::info!(
                streams,
                "RLQS: expired every assignment and ended the streams"
            );
        }
    }

    /// Streams and buckets open now, and per rule (domain, path) this instance's members and
    /// the tokens per period they hold — for the dashboard.
    pub(super) fn snapshot(&self) -> super::Snapshot {
        let state = self.state.lock();
        let mut rules: BTreeMap<(String, String), super::RuleShares> = BTreeMap::new();
        for instance in state.rules.values() {
            let (domain, path) = instance.divided.labels.clone();
            let entry = rules
                .entry((domain.clone(), path.clone()))
                .or_insert_with(|| super::RuleShares {
                    domain,
                    rule: path,
                    limit: instance.divided.terms.limit,
                    period_ms: u64::try_from(instance.divided.period.as_millis())
                        .unwrap_or(u64::MAX),
                    members: 0,
                    tokens: 0,
                    instances: 0,
                });
            entry.instances += 1;
            for (s, k) in &instance.members {
                if let Some(b) = state.streams.get(s).and_then(|s| s.buckets.get(k)) {
                    entry.members += 1;
                    entry.tokens = entry
                        .tokens
                        .saturating_add(b.holding.current().map_or(0, |s| s.tokens));
                }
            }
        }
        super::Snapshot {
            streams: state.streams.len(),
            buckets: state.streams.values().map(|s| s.buckets.len()).sum(),
            rules: rules.into_values().collect(),
        }
    }
}

/// What a new member is first assigned.
struct JoinAnswer {
    /// What it is sent.
    strategy: Strategy,
    /// The tick and share of its claim (`None` under a fail mode).
    claim: Option<(u64, Share)>,
}

/// The period a bucket's demand is counted per (a second for blanket targets).
fn period_of(target: &Target) -> Nanos {
    match target {
        Target::Divided(d) => nanos(d.period).max(1),
        Target::Blanket(_) => 1_000_000_000,
    }
}

/// Removes (stream, key) from rule instance `rule`, and the instance once it has no members.
fn leave(rules: &mut HashMap<String, RuleInstance>, rule: &str, stream: u64, key: &BucketKey) {
    if let Some(instance) = rules.get_mut(rule) {
        instance.members.remove(&(stream, key.clone()));
        if instance.members.is_empty() {
            rules.remove(rule);
        }
    }
}

/// The bucket of `rule` whose member id is `member`, with its stream and time to live.
fn find_member<'s>(
    state: &'s mut State,
    rule: &str,
    member: &str,
    service: &Service,
) -> Option<(u64, &'s mut Bucket, Duration)> {
    let instance = state.rules.get(rule)?;
    let (stream_id, key) = instance.members.iter().find(|(s, k)| {
        state
            .streams
            .get(s)
            .and_then(|s| s.buckets.get(k))
            .is_some_and(|b| b.member == member)
    })?;
    let (stream_id, key) = (*stream_id, key.clone());
    let stream = state.streams.get_mut(&stream_id)?;
    let ttl = service
        .active()
        .policy
        .rlqs(stream.domain.as_deref().unwrap_or_default())
        .assignment_ttl;
    let bucket = stream.buckets.get_mut(&key)?;
    Some((stream_id, bucket, ttl))
}

fn rule_labels((domain, rule): &(String, String)) -> RuleLabels {
    RuleLabels {
        domain: domain.clone(),
        rule: rule.clone(),
    }
}
