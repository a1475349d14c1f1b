//! A fleet of 20 simulated Envoys with skewed (Zipf) demand against one rule of 1,000/s,
//! over real RLQS streams, on a manual clock: one Flowgate instance (memory ledger), two on
//! one `redis-server`, two on a 3-master Redis Cluster. One Envoy leaves, one joins; with two
//! instances, one of them drains mid-run and its Envoys move to the other.
//!
//! In every window of one second it checks the documented bound (`docs/rlqs.md`): what the
//! fleet admits under Flowgate's assignments stays within `limit × (1 + overshoot)`, plus the
//! new buckets of assignments that changed in the window (Envoy starts a changed token bucket
//! full); what Envoys admit outside an assignment (their configured no-assignment and
//! expired-assignment behaviours) comes on top and is counted apart. In steady windows the
//! whole fleet stays within `limit × (1 + overshoot)`, admits at least 90 % of what the limit
//! allows, and every Envoy holds at least the floor.
//!
//! Determinism: time is a manual clock shared by the servers, their ledger and the Envoys;
//! each step waits (bounded, on real time) until the servers have taken every report sent
//! and the Envoys every message sent, and ticks are run by hand at whole seconds.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use flowgate::clock::{Clock, ManualClock, Nanos};
use flowgate::rlqs::client::{BucketSettings, Expired, Phase, Strategy, TokenBucket};
use flowgate::store::RedisStore;
use flowgate_server::backend::{Backend, SharedOptions};
use flowgate_server::rlqs::client::{Envoy, bucket};
use flowgate_server::rlqs::{ManualTicks, RlqsOptions};
use flowgate_server::server::ServerConfig;
use flowgate_testing::redis::{RedisCluster, RedisServer};
use flowgate_testing::server::TestServer;

const S: Nanos = 1_000_000_000;
const START: Nanos = 1_800_000_000 * S;
const LIMIT: u64 = 1000;
/// `limit × (1 + overshoot)` with the default overshoot of 5 %.
const CAP: u64 = 1050;
const STEP: Nanos = 100_000_000;
const SECONDS: u64 = 30;
/// Envoys at the start; one more joins.
const ENVOYS: usize = 20;
/// Total demand: twice the limit, Zipf over the Envoys.
const DEMAND: f64 = 2000.0;
const LEAVES: (usize, u64) = (3, 12);
const JOINS: u64 = 15;
/// With two instances, the second drains at this second.
const DRAIN: u64 = 22;
/// The floor of a division of 990 among 20 or 21 Envoys: ⌊990 × 0.2 / 21⌋.
const FLOOR: u64 = 9;

const POLICY: &str = "domain: fleet
descriptors:
  - key: api
    rate_limit: {unit: second, requests_per_unit: 1000}
rlqs:
  report_interval: 1s
  assignment_ttl: 3s
  abandon_after: 30s
";

/// The settings docs/rlqs.md recommends: Envoy's default without an assignment; when an
/// assignment expires (its server drained or died), a conservative token bucket of about
/// limit / fleet until a new one arrives.
fn settings() -> BucketSettings {
    BucketSettings {
        no_assignment: Strategy::AllowAll,
        expired: Some(Expired::Fallback {
            strategy: Strategy::TokenBucket(TokenBucket {
                max_tokens: 1,
                tokens_per_fill: 50,
                fill_interval: Duration::from_secs(1),
            }),
            timeout: Duration::from_secs(30),
        }),
    }
}

/// One simulated Envoy and its demand.
struct Member {
    envoy: Envoy,
    /// Requests per second.
    rate: f64,
    /// The next request's time.
    next: Nanos,
    /// When it reports, within each second.
    offset: Nanos,
    active: bool,
    /// Admitted per window, under an assignment.
    admitted: Vec<u64>,
    /// Requests offered per window.
    offered: Vec<u64>,
    /// Its assignment's tokens per second after each tick, from its first.
    shares: Vec<(u64, u64)>,
    /// Token bucket replacements seen so far.
    replaced: u64,
}

/// What a run measured, per window.
#[derive(Debug, Default)]
struct Windows {
    /// Admitted under Flowgate's assignments.
    assigned: Vec<u64>,
    /// Admitted without an assignment or under an expired one (the Envoys' own behaviours).
    own: Vec<u64>,
    /// Buckets of assignments that replaced a token bucket in the window.
    refills: Vec<u64>,
    /// Requests offered.
    offered: Vec<u64>,
}

struct Fleet {
    clock: ManualClock,
    servers: Vec<Option<TestServer>>,
    ticks: Vec<ManualTicks>,
    members: Vec<Member>,
    windows: Windows,
    /// Usages sent so far (each report carries one bucket).
    sent: u64,
    /// Responses received by Envoys that have since gone.
    received_gone: u64,
    /// Reports and responses counted by servers that have stopped.
    gone_reports: u64,
    gone_responses: u64,
}

/// Zipf(1) demand of Envoy `i` among `n`.
fn zipf(i: usize, n: usize) -> f64 {
    let h: f64 = (1..=n).map(|k| 1.0 / k as f64).sum();
    DEMAND / (i as f64 + 1.0) / h
}

impl Fleet {
    async fn start(servers: Vec<ServerConfig>, clock: ManualClock) -> Fleet {
        let mut started = Vec::new();
        let mut ticks = Vec::new();
        for mut config in servers {
            let t = ManualTicks::new();
            config.rlqs = RlqsOptions {
                clock: Some(Arc::new(clock.clone())),
                ticks: Some(t.clone()),
                ..RlqsOptions::default()
            };
            let dir = tempfile::tempdir().unwrap();
            let files = config.files.clone();
            started.push(Some(TestServer::start_with(config, dir, files).await));
            ticks.push(t);
        }
        let targets: Vec<String> = started
            .iter()
            .map(|s| format!("http://{}", s.as_ref().unwrap().grpc))
            .collect();
        let members = (0..ENVOYS)
            .map(|i| Fleet::member(&targets, i, zipf(i, ENVOYS), true))
            .collect();
        Fleet {
            clock,
            servers: started,
            ticks,
            members,
            windows: Windows::default(),
            sent: 0,
            received_gone: 0,
            gone_reports: 0,
            gone_responses: 0,
        }
    }

    fn member(targets: &[String], i: usize, rate: f64, active: bool) -> Member {
        let windows = SECONDS as usize;
        Member {
            envoy: Envoy::new("fleet", targets, settings())
                .unwrap()
                .starting_at(i),
            rate,
            next: START + (i as u64 * 7_919_000) % STEP,
            offset: (i as u64 % 10) * STEP,
            active,
            admitted: vec![0; windows],
            offered: vec![0; windows],
            shares: Vec::new(),
            replaced: 0,
        }
    }

    fn window(&self, t: Nanos) -> usize {
        ((t - START) / S) as usize
    }

    /// Waits until the servers took every report and the Envoys every message.
    async fn settle(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (mut reports, mut responses) = (self.gone_reports, self.gone_responses);
            for server in self.servers.iter().flatten() {
                reports += server.metric("flowgate_rlqs_reports_total").await as u64;
                responses += server.metric("flowgate_rlqs_responses_total").await as u64;
            }
            let now = self.clock.now();
            let mut received = self.received_gone;
            for m in &mut self.members {
                m.envoy.receive(now);
                received += m.envoy.stats().messages;
            }
            if reports == self.sent && received == responses {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "not settled: {reports}/{} reports, {received}/{responses} messages",
                self.sent
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Offers each active Envoy's requests up to `until`.
    async fn offer(&mut self, until: Nanos) {
        for i in 0..self.members.len() {
            if !self.members[i].active {
                continue;
            }
            let key = bucket(&[("api", "search")]);
            loop {
                let m = &mut self.members[i];
                if m.next >= until {
                    break;
                }
                let at = m.next;
                m.next += (S as f64 / m.rate) as Nanos;
                let w = ((at - START) / S) as usize;
                let assigned = matches!(m.envoy.phase(&key, at), Some(Phase::Active(_)));
                let new = m.envoy.phase(&key, at).is_none();
                let allowed = m.envoy.request(&key, at);
                m.offered[w] += 1;
                self.windows.offered[w] += 1;
                if allowed {
                    if assigned {
                        m.admitted[w] += 1;
                        self.windows.assigned[w] += 1;
                    } else {
                        self.windows.own[w] += 1;
                    }
                }
                if new {
                    // Envoy reports a new bucket at once, and waits for nothing: the
                    // assignment arrives a round trip later.
                    self.sent += m.envoy.flush().await;
                    self.settle().await;
                    self.note_refills(at);
                }
            }
        }
    }

    fn note_refills(&mut self, now: Nanos) {
        let w = self.window(now).min(SECONDS as usize - 1);
        let key = bucket(&[("api", "search")]);
        for m in &mut self.members {
            let replaced = m.envoy.stats().replaced;
            if replaced > m.replaced {
                if let Some(Phase::Active(Strategy::TokenBucket(tb))) = m.envoy.phase(&key, now) {
                    self.windows.refills[w] += tb.max_tokens * (replaced - m.replaced);
                }
                m.replaced = replaced;
            }
        }
    }

    async fn run(&mut self, drain_at: Option<u64>) {
        let n = SECONDS as usize;
        self.windows = Windows {
            assigned: vec![0; n],
            own: vec![0; n],
            refills: vec![0; n],
            offered: vec![0; n],
        };
        let targets: Vec<String> = self
            .servers
            .iter()
            .map(|s| format!("http://{}", s.as_ref().unwrap().grpc))
            .collect();
        let mut t = START;
        while t < START + SECONDS * S {
            let next = t + STEP;
            self.offer(next).await;
            self.clock.set(next);
            t = next;
            let second = (t - START) / S;
            let within = (t - START) % S;
            // Periodic reports.
            for m in &mut self.members {
                if m.active && within == m.offset {
                    self.sent += m.envoy.report(t).await;
                }
            }
            self.settle().await;
            if within == 0 {
                // Ticks, in turn starting with a different instance each second.
                let k = self.ticks.len();
                for j in 0..k {
                    let i = (j + second as usize) % k;
                    if self.servers[i].is_some() {
                        assert!(self.ticks[i].tick().await);
                    }
                }
                self.settle().await;
                self.note_refills(t - 1);
                let key = bucket(&[("api", "search")]);
                for m in &mut self.members {
                    if let Some(Phase::Active(Strategy::TokenBucket(tb))) = m.envoy.phase(&key, t) {
                        m.shares.push((second, tb.tokens_per_fill));
                    }
                }
            }
            if within == 0 && second == LEAVES.1 {
                let m = &mut self.members[LEAVES.0];
                m.active = false;
                m.envoy.disconnect();
            }
            if within == 0 && second == JOINS {
                let i = self.members.len();
                let rate = zipf(5, ENVOYS);
                self.members.push(Fleet::member(&targets, i, rate, true));
                self.members[i].next = t;
            }
            if within == 0 && Some(second) == drain_at {
                // The last instance drains (as on SIGTERM): its Envoys get TTL-0 assignments
                // and an UNAVAILABLE end, and reconnect to the other at their next report.
                let server = self.servers.last_mut().unwrap().take().unwrap();
                self.gone_reports += server.metric("flowgate_rlqs_reports_total").await as u64;
                let streams = server.metric("flowgate_rlqs_streams").await as u64;
                let closed_before: u64 = self.members.iter().map(|m| m.envoy.stats().closed).sum();
                server.stop().await;
                // Every stream it had ends after its last message.
                let deadline = Instant::now() + Duration::from_secs(20);
                loop {
                    let now = self.clock.now();
                    let mut closed = 0;
                    for m in &mut self.members {
                        m.envoy.receive(now);
                        closed += m.envoy.stats().closed;
                    }
                    if closed - closed_before >= streams {
                        break;
                    }
                    assert!(Instant::now() < deadline, "the drained streams did not end");
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                let mut live = 0;
                for server in self.servers.iter().flatten() {
                    live += server.metric("flowgate_rlqs_responses_total").await as u64;
                }
                let received: u64 = self
                    .members
                    .iter()
                    .map(|m| m.envoy.stats().messages)
                    .sum::<u64>()
                    + self.received_gone;
                self.gone_responses = received - live;
                self.settle().await;
            }
        }
    }

    /// Checks the bounds and prints the table.
    fn check(&mut self, label: &str, transients: &[std::ops::Range<u64>]) {
        let w = &self.windows;
        eprintln!(
            "{label}: window, offered, admitted under assignments, refills, admitted by the Envoys' own behaviours"
        );
        let mut steady_max = 0;
        for k in 0..SECONDS as usize {
            eprintln!(
                "{label}: {k:2}s {:5} {:5} {:3} {:4}",
                w.offered[k], w.assigned[k], w.refills[k], w.own[k]
            );
        }
        for k in 0..SECONDS as usize {
            // In every window: Flowgate's assignments within the bound.
            assert!(
                w.assigned[k] <= CAP + w.refills[k],
                "{label}: window {k}: {} admitted under assignments > {CAP} + {} refills",
                w.assigned[k],
                w.refills[k]
            );
            let steady = k >= 3 && !transients.iter().any(|t| t.contains(&(k as u64)));
            if steady {
                let total = w.assigned[k] + w.own[k];
                steady_max = steady_max.max(total);
                assert!(
                    total <= CAP,
                    "{label}: steady window {k} admitted {total} > {CAP}"
                );
                assert!(
                    total * 10 >= LIMIT * 9,
                    "{label}: steady window {k} admitted {total}, under 90 % of the limit"
                );
                for (i, m) in self.members.iter().enumerate() {
                    if m.active && m.offered[k] > 0 {
                        let floor = FLOOR.min(m.offered[k]);
                        assert!(
                            m.admitted[k] + 2 >= floor,
                            "{label}: envoy {i} admitted {} in steady window {k}, under its floor {floor}",
                            m.admitted[k]
                        );
                    }
                }
            }
        }
        eprintln!(
            "{label}: steady windows admitted at most {steady_max} (limit {LIMIT}, bound {CAP})"
        );
        // Every active Envoy holds at least the floor once it has had two ticks, outside the
        // transients (a member that rejoins starts over with a claim).
        for (i, m) in self.members.iter().enumerate() {
            if m.active {
                for &(second, tokens) in m.shares.iter().skip(2) {
                    if transients.iter().any(|t| t.contains(&second)) {
                        continue;
                    }
                    assert!(
                        tokens >= FLOOR,
                        "{label}: envoy {i} holds {tokens}/s at {second}s"
                    );
                }
            }
        }
        // The joining Envoy gets a share at its first report and its fair share within 3 ticks.
        let joined = self.members.last().unwrap();
        let first = joined.shares.first().expect("the joiner got a share");
        assert!(first.0 <= JOINS + 1, "{label}: first share at {}s", first.0);
        // Its fair share: what it holds five seconds after joining, once the leave is done.
        let fair = joined
            .shares
            .iter()
            .find(|(second, _)| *second == JOINS + 5)
            .unwrap()
            .1;
        let reached = joined
            .shares
            .iter()
            .find(|(_, tokens)| *tokens * 10 >= fair * 9)
            .unwrap()
            .0;
        eprintln!(
            "{label}: the joining Envoy's shares {:?}; 90 % of its fair share ({fair}/s) {}s after joining",
            joined.shares,
            reached - JOINS
        );
        assert!(
            reached - JOINS <= 3,
            "{label}: fair share after {}s",
            reached - JOINS
        );
    }
}

/// The windows that are not steady, as docs/rlqs.md states them: an Envoy that leaves keeps
/// its share reserved until its entry goes stale (`assignment_ttl` + 2 report intervals),
/// then a tick divides it; a joining Envoy gets its fair share within two ticks; the Envoys
/// of a drained instance rejoin through the other within a report interval and two ticks.
fn transients(drain: Option<u64>) -> Vec<std::ops::Range<u64>> {
    let mut t = vec![LEAVES.1..LEAVES.1 + 7, JOINS..JOINS + 4];
    if let Some(at) = drain {
        t.push(at..at + 4);
    }
    t
}

fn config(dir: &tempfile::TempDir) -> ServerConfig {
    let path = dir.path().join("fleet.yaml");
    std::fs::write(&path, POLICY).unwrap();
    ServerConfig::load(vec![path]).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_envoys_on_one_instance_stay_within_the_bound() {
    let clock = ManualClock::new(START);
    let dir = tempfile::tempdir().unwrap();
    let mut fleet = Fleet::start(vec![config(&dir)], clock).await;
    fleet.run(None).await;
    fleet.check("one instance", &transients(None));
}

async fn on_redis(label: &str, store: impl Fn() -> RedisStore, clock: ManualClock) {
    let dir = tempfile::tempdir().unwrap();
    let servers = (0..2)
        .map(|_| {
            let store = store();
            let mut c = config(&dir);
            c.backend = Backend::shared(Arc::new(store.clone()), SharedOptions::default())
                .with_quota_ledger(Arc::new(store.quota_ledger()));
            c
        })
        .collect();
    let mut fleet = Fleet::start(servers, clock).await;
    fleet.run(Some(DRAIN)).await;
    fleet.check(label, &transients(Some(DRAIN)));
}

async fn connect(builder: flowgate::store::RedisStoreBuilder, clock: &ManualClock) -> RedisStore {
    builder
        .clock(clock.clone())
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_envoys_on_two_instances_sharing_a_redis_server_stay_within_the_bound() {
    let Some(redis) = RedisServer::start("rlqs_fleet_redis") else {
        return;
    };
    let clock = ManualClock::new(START);
    let stores = vec![
        connect(RedisStore::builder(redis.url()), &clock).await,
        connect(RedisStore::builder(redis.url()), &clock).await,
    ];
    let next = std::sync::Mutex::new(stores.into_iter());
    on_redis(
        "two instances, redis-server",
        || next.lock().unwrap().next().unwrap(),
        clock,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_envoys_on_two_instances_sharing_a_redis_cluster_stay_within_the_bound() {
    let Some(cluster) = RedisCluster::start("rlqs_fleet_cluster", 3, 0) else {
        return;
    };
    let clock = ManualClock::new(START);
    let stores = vec![
        connect(RedisStore::cluster_builder(cluster.urls()), &clock).await,
        connect(RedisStore::cluster_builder(cluster.urls()), &clock).await,
    ];
    let next = std::sync::Mutex::new(stores.into_iter());
    on_redis(
        "two instances, 3-master cluster",
        || next.lock().unwrap().next().unwrap(),
        clock,
    )
    .await;
}
