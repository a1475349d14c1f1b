//! [`RedisStore`]: limits shared by every instance that talks to the same Redis (≥ 6, or
//! Valkey) or Redis Cluster. Feature `redis`.
//!
//! * **Atomic and exact.** One Lua script per algorithm (`store/redis/*.lua`), loaded once and
//!   run by `EVALSHA` (with a fallback to `EVAL` when the server lost its script cache). Keys go
//!   only in `KEYS`, parameters only in `ARGV`. Lua numbers are doubles, so the scripts keep
//!   every time stamp as an exact (microseconds, nanoseconds) pair and compare the sliding
//!   window's products in exact multi-limb arithmetic; the client then replays the library's
//!   own transition on the state the script read, so decisions match [`MemoryStore`] to the
//!   nanosecond (the conformance table checks it). See [`check_quota`] for the two quotas the
//!   scripts cannot hold exactly.
//! * **Time** comes from the Redis server's `TIME`, so application hosts' clocks never matter.
//!   [`RedisStoreBuilder::clock`] passes an injected clock's time instead (tests, replays).
//! * **Keys** are `{prefix}{{{key}}}:{algorithm}`, e.g. `flowgate:{user:42}:gcra`: the
//!   algorithm keeps limits with different algorithms apart, the braces are a hash tag so a
//!   limit's state lands in one cluster slot. Every key written gets an expiry no earlier than
//!   the time its state becomes indistinguishable from a fresh key's, and at most about four
//!   spans (period or burst time) later: setting an expiry costs Redis more than the write
//!   itself, so the scripts refresh it only when the idle time crosses into a new
//!   power-of-two bucket and keep it otherwise (`SET … KEEPTTL`).
//! * **Commands per decision.** The fixed window (and calendar quotas) keeps a hash holding
//!   only its newest window's count, so a request alone for its key in a batch is decided by
//!   one `HINCRBY` of that window's field (undone when it goes past the limit; a new window
//!   adds an `HLEN` and the expiry); the other algorithms read and write a key once per run of
//!   requests for it. Values earlier builds wrote (text `"window count"`) are rewritten in
//!   place on first use, their expiry kept; an earlier build that meets the new format reports
//!   a value it did not write, so instances sharing a Redis are upgraded together.
//! * **Throughput.** Concurrent requests are batched: many decisions share one script call,
//!   grouped by algorithm and (on a cluster) by slot, pipelined on one multiplexed connection
//!   per server; within a call, the requests for one key are adjacent, and the fixed window
//!   and GCRA scripts read and write such a key once for all of them. See `BENCHMARKS.md` for
//!   what that buys over a per-call script.
//! * **Failures** are [`StoreError`]s: [`Timeout`](StoreError::Timeout) after the per-call
//!   timeout (a request that timed out may still be counted when its batch reaches Redis:
//!   a timeout can make the store admit less, never more), [`Unavailable`](StoreError::Unavailable) when Redis cannot be reached (both
//!   transient; wrap the store in a [`FallbackStore`](crate::store::FallbackStore) for fail
//!   open/closed/local and a circuit breaker). The connection is re-established in the
//!   background once Redis is back.
//!
//! ```no_run
//! # async fn run() -> Result<(), flowgate::store::StoreError> {
//! use flowgate::{store::{Ask, RedisStore, Store}, Quota};
//! let store = RedisStore::builder("redis://127.0.0.1:6379")
//!     .prefix("myapp:")
//!     .connect()
//!     .await?;
//! let quota = Quota::per_minute(100);
//! let decision = store.check(Ask::new("tenant:42", &quota)).await?;
//! # Ok(()) }
//! ```
//!
//! [`MemoryStore`]: crate::store::MemoryStore

mod batch;
mod conn;
mod lease;
mod ledger;
mod list;
mod script;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

pub use lease::RedisLeases;
pub use ledger::RedisLedger;
pub use list::MAX_SCANS;
pub use script::{UnsupportedQuota, check_quota};

use self::batch::Job;
use self::conn::{Connection, Target};
use self::script::Mode;
use super::{Ask, Store, StoreError};
use crate::clock::Clock;
use crate::decision::Decision;
use crate::quota::Algorithm;

/// The key `{prefix}{kind}:{<name>}` (and `:{part}`), `name` inside a hash tag (one cluster
/// slot for all of a name's parts), its braces escaped so that the tag ends where it should:
/// the keys of the RLQS ledger and of leases.
fn tagged_key(prefix: &str, kind: &str, name: &str, part: Option<&str>) -> String {
    let mut key = String::with_capacity(prefix.len() + kind.len() + name.len() + 8);
    key.push_str(prefix);
    key.push_str(kind);
    key.push_str(":{");
    for c in name.chars() {
        match c {
            '%' => key.push_str("%25"),
            '{' => key.push_str("%7B"),
            '}' => key.push_str("%7D"),
            c => key.push(c),
        }
    }
    key.push('}');
    if let Some(part) = part {
        key.push(':');
        key.push_str(part);
    }
    key
}

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "flowgate:";

/// The default per-call timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);

/// A [`Store`] on Redis or Redis Cluster, shared by every process that uses the same server
/// and prefix. Cheap to clone: clones share the connection and the batching queue.
///
/// Needs a tokio runtime (it runs a background task that batches requests).
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// The shared, multiplexed connection.
    conn: Connection,
    /// Requests waiting to be batched into script calls.
    queue: mpsc::UnboundedSender<Job>,
    /// Prepended to every key.
    prefix: String,
    /// Longest a call may take, queueing included.
    timeout: Duration,
    /// Where time comes from when not from the server's `TIME`.
    clock: Option<Arc<dyn Clock>>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("conn", &self.inner.conn)
            .field("prefix", &self.inner.prefix)
            .field("timeout", &self.inner.timeout)
            .field("injected_clock", &self.inner.clock.is_some())
            .finish()
    }
}

/// Configures and connects a [`RedisStore`].
#[derive(Clone)]
pub struct RedisStoreBuilder {
    target: Target,
    prefix: String,
    clock: Option<Arc<dyn Clock>>,
    max_batch: usize,
    max_in_flight: usize,
}

impl std::fmt::Debug for RedisStoreBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStoreBuilder")
            .field("target", &self.target)
            .field("prefix", &self.prefix)
            .field("max_batch", &self.max_batch)
            .field("max_in_flight", &self.max_in_flight)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Connects to one Redis server with the default settings.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::builder(url).connect().await
    }

    /// A builder for a store on one Redis server, e.g. `redis://127.0.0.1:6379/0`.
    pub fn builder(url: impl Into<String>) -> RedisStoreBuilder {
        RedisStoreBuilder::new(vec![url.into()], false)
    }

    /// A builder for a store on a Redis Cluster, given one or more of its nodes.
    pub fn cluster_builder<I, U>(nodes: I) -> RedisStoreBuilder
    where
        I: IntoIterator<Item = U>,
        U: Into<String>,
    {
        RedisStoreBuilder::new(nodes.into_iter().map(Into::into).collect(), true)
    }

    /// The Redis key holding `key`'s state under `algorithm`.
    pub fn redis_key(&self, key: &str, algorithm: Algorithm) -> String {
        format!("{}{{{key}}}:{}", self.inner.prefix, algorithm.name())
    }

    fn job(
        &self,
        ask: &Ask<'_>,
    ) -> Result<(Job, oneshot::Receiver<Result<Decision, StoreError>>), StoreError> {
        let (quota, cost) = (ask.quota, ask.cost);
        ask.check_cost()?;
        check_quota(quota).map_err(|e| StoreError::Backend(e.to_string()))?;
        let key = self.redis_key(ask.key, quota.algorithm());
        let slot = if self.inner.conn.is_cluster() {
            conn::slot(key.as_bytes())
        } else {
            0
        };
        let (reply, answer) = oneshot::channel();
        let job = Job {
            key,
            slot,
            quota: *quota,
            cost,
            charge: ask.charge,
            reply,
        };
        Ok((job, answer))
    }

    fn enqueue(&self, job: Job) -> Result<(), StoreError> {
        self.inner
            .queue
            .send(job)
            .map_err(|_| StoreError::Unavailable("the Redis store's batching task stopped".into()))
    }

    async fn wait(
        &self,
        answer: oneshot::Receiver<Result<Decision, StoreError>>,
        deadline: tokio::time::Instant,
    ) -> Result<Decision, StoreError> {
        match tokio::time::timeout_at(deadline, answer).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(StoreError::Unavailable(
                "the Redis store's batching task stopped".into(),
            )),
            Err(_) => Err(StoreError::Timeout(self.inner.timeout)),
        }
    }
}

impl RedisStoreBuilder {
    fn new(urls: Vec<String>, cluster: bool) -> Self {
        RedisStoreBuilder {
            target: Target {
                urls,
                cluster,
                timeout: DEFAULT_TIMEOUT,
                #[cfg(feature = "redis-tls")]
                tls: None,
            },
            prefix: DEFAULT_PREFIX.to_owned(),
            clock: None,
            max_batch: 256,
            max_in_flight: 1,
        }
    }

    /// Prepended to every key (default [`DEFAULT_PREFIX`]), so that several applications can
    /// share a Redis without sharing limits.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Longest a call may take, waiting for a batch included (default [`DEFAULT_TIMEOUT`]).
    /// Also each connection attempt's bound, but never less than 1 s (a TLS handshake to a
    /// distant Redis needs round trips of its own; reconnecting does not hold up calls).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.target.timeout = timeout;
        self
    }

    /// Takes time from `clock` (sent with each script call) instead of the Redis server's
    /// `TIME`. For tests and replays; in production, the server's clock keeps every instance
    /// on one time line. The scripts count whole microseconds in Lua's doubles: instants, and
    /// an instant plus a quota's period, must stay below 2^53 µs since the epoch (the year
    /// 2255) for decisions to match the memory store's to the nanosecond.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Trusts the PEM certificates in `pem` (a CA bundle) for `rediss://` URLs instead of the
    /// system's roots — for a private CA or a self-signed server certificate.
    #[cfg(feature = "redis-tls")]
    pub fn tls_roots(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.target.tls.get_or_insert_with(Default::default).roots = Some(pem.into());
        self
    }

    /// Presents a client certificate (PEM chain and PEM private key) to Redis servers that
    /// require one (`tls-auth-clients yes`), with `rediss://` URLs.
    #[cfg(feature = "redis-tls")]
    pub fn tls_client_certificate(
        mut self,
        chain_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.target.tls.get_or_insert_with(Default::default).client =
            Some((chain_pem.into(), key_pem.into()));
        self
    }

    /// Most requests sharing one batch (default 256).
    pub fn max_batch(mut self, max_batch: usize) -> Self {
        self.max_batch = max_batch.max(1);
        self
    }

    /// Most batches waiting for Redis at once (default 1): while they are out, new requests
    /// gather into the next batch. 1 batches most, and so costs Redis least per decision (with
    /// 2, the service's decisions took 1.1–1.8× the Redis CPU: BENCHMARKS.md); more lowers
    /// latency on a fast network.
    pub fn max_in_flight(mut self, max_in_flight: usize) -> Self {
        self.max_in_flight = max_in_flight.max(1);
        self
    }

    /// Connects. Fails if Redis cannot be reached within the timeout (a single server is
    /// retried a few times first); once connected, the store reconnects by itself.
    pub async fn connect(self) -> Result<RedisStore, StoreError> {
        let conn = Connection::connect(&self.target).await?;
        let queue = batch::spawn(
            conn.clone(),
            self.clock.clone(),
            batch::BatchLimits {
                max_batch: self.max_batch,
                max_in_flight: self.max_in_flight,
                timeout: self.target.timeout,
            },
        );
        Ok(RedisStore {
            inner: Arc::new(Inner {
                conn,
                queue,
                prefix: self.prefix,
                timeout: self.target.timeout,
                clock: self.clock,
            }),
        })
    }
}

impl Store for RedisStore {
    fn check(&self, ask: Ask<'_>) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        let job = self.job(&ask);
        async move {
            let deadline = tokio::time::Instant::now() + self.inner.timeout;
            let (job, answer) = job?;
            self.enqueue(job)?;
            self.wait(answer, deadline).await
        }
    }

    fn check_many(
        &self,
        asks: &[Ask<'_>],
    ) -> impl Future<Output = Vec<Result<Decision, StoreError>>> + Send {
        let jobs: Vec<_> = asks.iter().map(|a| self.job(a)).collect();
        async move {
            let deadline = tokio::time::Instant::now() + self.inner.timeout;
            // Queue every request before waiting for any, so they can share a batch.
            let answers: Vec<_> = jobs
                .into_iter()
                .map(|job| {
                    let (job, answer) = job?;
                    self.enqueue(job)?;
                    Ok(answer)
                })
                .collect();
            let mut decisions = Vec::with_capacity(answers.len());
            for answer in answers {
                decisions.push(match answer {
                    Ok(answer) => self.wait(answer, deadline).await,
                    Err(e) => Err(e),
                });
            }
            decisions
        }
    }

    fn refund(&self, ask: Ask<'_>) -> impl Future<Output = Result<(), StoreError>> + Send {
        let key = self.redis_key(ask.key, ask.quota.algorithm());
        let (quota, units) = (*ask.quota, ask.cost);
        async move {
            check_quota(&quota).map_err(|e| StoreError::Backend(e.to_string()))?;
            let now = self.inner.clock.as_ref().map(|c| c.now());
            let args = script::args(now, Mode::Refund, std::iter::once((&quota, units)));
            let call = self.inner.conn.eval(
                script::script(quota.algorithm()),
                std::slice::from_ref(&key),
                &args.header,
                &args.numbers,
            );
            let reply = tokio::time::timeout(self.inner.timeout, call)
                .await
                .map_err(|_| StoreError::Timeout(self.inner.timeout))??;
            match reply.get(2) {
                Some(1) => Ok(()),
                Some(-1) => Err(script::foreign(&key)),
                Some(-2) => Err(script::calendar_skew(&key, script::reply_now(&reply)?)),
                _ => Err(script::malformed()),
            }
        }
    }

    fn reset(&self, ask: Ask<'_>) -> impl Future<Output = Result<(), StoreError>> + Send {
        let key = self.redis_key(ask.key, ask.quota.algorithm());
        async move {
            tokio::time::timeout(
                self.inner.timeout,
                self.inner.conn.del(std::slice::from_ref(&key)),
            )
            .await
            .map_err(|_| StoreError::Timeout(self.inner.timeout))?
        }
    }
}
