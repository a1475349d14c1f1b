//! Batching: concurrent requests share script calls.
//!
//! Callers put their request on a queue and wait for its answer. One task takes requests off
//! the queue: it waits for the first, then takes everything else already queued (up to
//! `max_batch`), groups the batch by algorithm and — on a cluster — by hash slot, and runs one
//! script call per group, all pipelined on the shared connection. At most `max_in_flight`
//! batches are out at once; while they are, new requests queue up and form the next batch.
//!
//! So a lone request goes out at once (no timer, no added latency), and under load many
//! decisions share one `EVALSHA`: the per-call cost of running a script (the bulk of a
//! redis_rate-style call's ~10 µs of server time) is paid once per batch instead of once per
//! decision.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc, oneshot};

use super::conn::Connection;
use super::script::{self, Mode};
use crate::clock::{Clock, Nanos};
use crate::decision::Decision;
use crate::quota::Quota;
use crate::store::StoreError;

/// One request waiting in the queue.
#[derive(Debug)]
pub(super) struct Job {
    /// The full Redis key.
    pub(super) key: String,
    /// Its hash slot (0 when not on a cluster).
    pub(super) slot: u16,
    /// The quota to enforce.
    pub(super) quota: Quota,
    /// Units asked for.
    pub(super) cost: u64,
    /// A charge (always taken) rather than a check; charges and checks go in separate calls.
    pub(super) charge: bool,
    /// Where the answer goes.
    pub(super) reply: oneshot::Sender<Result<Decision, StoreError>>,
}

/// Bounds on batching.
#[derive(Debug, Clone, Copy)]
pub(super) struct BatchLimits {
    /// Most requests in one batch.
    pub(super) max_batch: usize,
    /// Most batches waiting for Redis at once.
    pub(super) max_in_flight: usize,
    /// How long a batch may wait for Redis.
    pub(super) timeout: Duration,
}

/// Starts the batching task on the current tokio runtime; it ends when every sender is gone.
pub(super) fn spawn(
    conn: Connection,
    clock: Option<Arc<dyn Clock>>,
    limits: BatchLimits,
) -> mpsc::UnboundedSender<Job> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(run(rx, conn, clock, limits));
    tx
}

async fn run(
    mut rx: mpsc::UnboundedReceiver<Job>,
    conn: Connection,
    clock: Option<Arc<dyn Clock>>,
    limits: BatchLimits,
) {
    let permits = Arc::new(Semaphore::new(limits.max_in_flight.max(1)));
    loop {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = rx.recv().await else {
            return;
        };
        let mut jobs = Vec::with_capacity(limits.max_batch.min(64));
        jobs.push(first);
        while jobs.len() < limits.max_batch {
            match rx.try_recv() {
                Ok(job) => jobs.push(job),
                Err(_) => break,
            }
        }
        let conn = conn.clone();
        let clock = clock.clone();
        tokio::spawn(async move {
            dispatch(&conn, clock.as_deref(), jobs, limits.timeout).await;
            drop(permit);
        });
    }
}

/// Runs one batch: one script call per (algorithm, check or charge, slot) group, all at once.
async fn dispatch(
    conn: &Connection,
    clock: Option<&dyn Clock>,
    mut jobs: Vec<Job>,
    timeout: Duration,
) {
    // Within a group, requests for one key become adjacent (the sort is stable, so they keep
    // their order): a script reads such a run's state once and writes it once.
    let group = |j: &Job| (j.quota.algorithm() as u8, j.charge, j.slot);
    jobs.sort_by(|a, b| (group(a), &a.key).cmp(&(group(b), &b.key)));
    let mut calls = Vec::new();
    while !jobs.is_empty() {
        let first = group(&jobs[0]);
        let split = jobs
            .iter()
            .position(|j| group(j) != first)
            .unwrap_or(jobs.len());
        let rest = jobs.split_off(split);
        calls.push(call(
            conn,
            clock,
            std::mem::replace(&mut jobs, rest),
            timeout,
        ));
    }
    // Every call is sent before any reply is awaited, so they share one round trip.
    let mut set = tokio::task::JoinSet::new();
    for c in calls {
        set.spawn(c);
    }
    while set.join_next().await.is_some() {}
}

/// One script call for a group of requests with the same algorithm (and slot); answers each.
fn call(
    conn: &Connection,
    clock: Option<&dyn Clock>,
    group: Vec<Job>,
    timeout: Duration,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let conn = conn.clone();
    let now = clock.map(Clock::now);
    async move {
        let algorithm = group[0].quota.algorithm();
        let keys: Vec<String> = group.iter().map(|j| j.key.clone()).collect();
        let mode = if group[0].charge {
            Mode::Charge
        } else {
            Mode::Check
        };
        let args = script::args(now, mode, group.iter().map(|j| (&j.quota, j.cost)));
        let reply = tokio::time::timeout(
            timeout,
            conn.eval(
                script::script(algorithm),
                &keys,
                &args.header,
                &args.numbers,
            ),
        )
        .await
        .unwrap_or(Err(StoreError::Timeout(timeout)));
        answer(group, reply);
    }
}

/// Hands each request its decision from the script's reply (or the call's error).
fn answer(group: Vec<Job>, reply: Result<Vec<i64>, StoreError>) {
    let width = script::reply_width(group[0].quota.algorithm());
    let reply = reply.and_then(|r| {
        let now: Nanos = script::reply_now(&r)?;
        if r.len() == 2 + width * group.len() {
            Ok((now, r))
        } else {
            Err(script::malformed())
        }
    });
    for (i, job) in group.into_iter().enumerate() {
        let decision = match &reply {
            Ok((now, r)) => {
                let at = 2 + i * width;
                let ask = (&job.quota, job.cost, job.charge);
                script::decide(&job.key, ask, *now, &r[at..at + width])
            }
            Err(e) => Err(e.clone()),
        };
        // The caller may have given up (timeout, cancellation): nothing to do then.
        let _ = job.reply.send(decision);
    }
}
