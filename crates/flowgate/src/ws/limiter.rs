//! [`WsLimiter`]: admits connections ([`WsLimiter::admit`]) and judges each message of a
//! [`Session`] ([`Session::check`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use parking_lot::Mutex;

use super::action::{Action, Close, Rejection, Scope, close_code};
use super::message::MessageInfo;
use super::penalty::PenaltyBox;
use super::policy::{Rules, WsLimiterBuilder, WsPolicy};
use super::stats::{LayerDecision, WsStats, WsStatsSnapshot};
use crate::clock::{Clock, MonotonicClock};
use crate::decision::Decision;
use crate::local::{KeyedRateLimiter, RateLimiter};
use crate::pipeline;
use crate::quota::Quota;
use crate::store::key::KeyWriter;
use crate::store::{Ask, Store};

/// Who is connecting: the client's address (a key: an IP, an IPv6 /64), and — once
/// authenticated — the user and their role. Room is where the session's messages go unless a
/// message names its own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Client {
    /// The client's address as a key (e.g. what the HTTP layer's `ClientIp` extracts: the
    /// address, IPv6 by /64).
    pub ip: String,
    /// The user, if known.
    pub user: Option<String>,
    /// The user's role (`moderator`, `bot`), if any.
    pub role: Option<String>,
    /// The session's room, if it is in one.
    pub room: Option<String>,
}

impl Client {
    /// A client at `ip`, no user.
    pub fn new(ip: impl Into<String>) -> Self {
        Client {
            ip: ip.into(),
            ..Client::default()
        }
    }

    /// The same, as `user`.
    pub fn user(mut self, user: impl Into<String>) -> Self {
        self.user = Some(user.into());
        self
    }

    /// The same, with `role`.
    pub fn role(mut self, role: impl Into<String>) -> Self {
        self.role = Some(role.into());
        self
    }

    /// The same, in `room`.
    pub fn room(mut self, room: impl Into<String>) -> Self {
        self.room = Some(room.into());
        self
    }

    /// Who the penalty box and slowmode count: the user, else the address.
    fn who(&self) -> &str {
        self.user.as_deref().unwrap_or(&self.ip)
    }
}

/// A connection refused before the upgrade: answer it 429 with `Retry-After` (whole seconds,
/// rounded up) — and, for the rate of new connections, the `RateLimit` fields of `decision`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Which cap refused it.
    pub scope: Scope,
    /// When to try again.
    pub retry_after: Duration,
    /// The new-connection rate's decision, when that is what refused.
    pub decision: Option<Decision>,
}

impl Refusal {
    /// `Retry-After` in whole seconds, rounded up, at least 1.
    pub fn retry_after_secs(&self) -> u64 {
        crate::decision::ceil_secs(self.retry_after).max(1)
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "connection refused by the {} limit; retry in {} s",
            self.scope.name(),
            self.retry_after_secs()
        )
    }
}

/// A refusal is an error, so `admit(…)?` works in functions returning `Box<dyn Error>`.
impl std::error::Error for Refusal {}

/// Connections open now, per IP and per user: bounded by the connections themselves (an entry
/// exists only while its count is above zero).
#[derive(Debug, Default)]
struct Live {
    per_ip: HashMap<String, u32>,
    per_user: HashMap<String, u32>,
    total: usize,
}

/// The shared part of a limiter.
struct Inner<C: Clock> {
    /// The policy, as given.
    policy: WsPolicy,
    /// The policy, compiled for lookups.
    rules: Rules,
    clock: C,
    /// New connections per IP.
    connect: Option<KeyedRateLimiter<String, C>>,
    live: Mutex<Live>,
    penalty: Option<PenaltyBox>,
    stats: WsStats,
}

/// Real-time limits for WebSocket: before the upgrade (new connections per IP, concurrent
/// connections per IP and per user, a node cap, the penalty box) and for every message of a
/// [`Session`] (per connection, bytes, per user across connections and instances, per room,
/// slowmode, roles, costs, a size limit, an error-rate layer), with a verdict ladder (reject
/// with an error frame, then close) and a dry run per layer. Transport-agnostic: any WebSocket
/// library hands it [`MessageInfo`]s and carries out the [`Action`]s. Cheap to clone.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use flowgate::{store::MemoryStore, ws::{Client, MessageInfo, Action, WsLimiter}, Quota};
///
/// let limiter = WsLimiter::builder().messages(Quota::per_second(2)).build()?;
/// let store = MemoryStore::new();
/// let mut session = limiter.admit(Client::new("192.0.2.1").user("ann"))?;
/// assert_eq!(session.check(&store, &MessageInfo::new(5)).await, Action::Forward);
/// assert_eq!(session.check(&store, &MessageInfo::new(5)).await, Action::Forward);
/// let Action::Reject(rejection) = session.check(&store, &MessageInfo::new(5)).await else {
///     panic!("the third message in a second is over the limit");
/// };
/// let frame = limiter.error_frame(&rejection); // send this to the client
/// assert!(frame.contains(r#""scope":"connection""#));
/// # Ok(()) }
/// ```
pub struct WsLimiter<C: Clock = MonotonicClock> {
    inner: Arc<Inner<C>>,
}

impl<C: Clock> Clone for WsLimiter<C> {
    fn clone(&self) -> Self {
        WsLimiter {
            inner: self.inner.clone(),
        }
    }
}

impl<C: Clock> std::fmt::Debug for WsLimiter<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WsLimiter")
            .field("policy", &self.inner.policy)
            .finish_non_exhaustive()
    }
}

impl WsLimiter<MonotonicClock> {
    /// A builder; every layer is off until set.
    pub fn builder() -> WsLimiterBuilder<MonotonicClock> {
        WsLimiterBuilder::default()
    }
}

impl<C: Clock + Clone> WsLimiter<C> {
    pub(crate) fn new(policy: WsPolicy, rules: Rules, clock: C) -> Self {
        let connect = rules.connect_rate.map(|quota| {
            KeyedRateLimiter::builder(quota)
                .clock(clock.clone())
                .max_keys(1 << 16)
                .build()
        });
        WsLimiter {
            inner: Arc::new(Inner {
                penalty: rules.penalty.map(PenaltyBox::new),
                connect,
                live: Mutex::new(Live::default()),
                stats: WsStats::default(),
                clock,
                policy,
                rules,
            }),
        }
    }

    /// Admits a new connection, before the upgrade: the penalty box, the node cap, the
    /// concurrent caps and the rate of new connections, in that order. `Ok` is the session
    /// that judges the connection's messages and holds its place in the caps until dropped;
    /// `Err` is answered with 429 and `Retry-After` instead of upgrading.
    ///
    /// Each layer that applies records its decision in [`stats`](Self::stats) as the message
    /// layers do: `allowed`, `rejected` (also counted as a refusal), or — for a layer in dry
    /// run that would have refused — `dry_run`, and the connection goes on to the next layer.
    pub fn admit(&self, client: Client) -> Result<Session<C>, Refusal> {
        let inner = &*self.inner;
        let rules = &inner.rules;
        // Records a layer's decision; true when it refuses the connection.
        let refuses = |scope: Scope, over: bool| {
            let outcome = match (over, rules.is_dry_run(scope)) {
                (false, _) => LayerDecision::Allowed,
                (true, true) => LayerDecision::DryRun,
                (true, false) => LayerDecision::Rejected,
            };
            inner.stats.decided(scope, outcome);
            outcome == LayerDecision::Rejected
        };
        let refuse = |scope: Scope, retry_after: Duration, decision: Option<Decision>| {
            inner.stats.refused(scope);
            Refusal {
                scope,
                retry_after,
                decision,
            }
        };
        if let Some(penalty) = &inner.penalty {
            let banned = penalty.banned_for(client.who(), inner.clock.now());
            if refuses(Scope::Penalty, banned.is_some())
                && let Some(left) = banned
            {
                return Err(refuse(Scope::Penalty, left, None));
            }
        }
        {
            let mut live = inner.live.lock();
            let ip_count = live.per_ip.get(&client.ip).copied().unwrap_or(0) as usize;
            let user_count = client
                .user
                .as_ref()
                .map(|u| live.per_user.get(u).copied().unwrap_or(0) as usize);
            let caps = [
                (Scope::Node, Some(live.total), rules.max_connections),
                (
                    Scope::ConcurrentIp,
                    Some(ip_count),
                    rules.concurrent_per_ip.map(|n| n as usize),
                ),
                (
                    Scope::ConcurrentUser,
                    user_count,
                    rules.concurrent_per_user.map(|n| n as usize),
                ),
            ];
            for (scope, count, cap) in caps {
                if let (Some(count), Some(cap)) = (count, cap)
                    && refuses(scope, count >= cap)
                {
                    drop(live);
                    return Err(refuse(scope, Duration::from_secs(1), None));
                }
            }
            if let Some(connect) = &inner.connect {
                let decision = connect.check_key(client.ip.as_str());
                if refuses(Scope::Connect, !decision.allowed) {
                    drop(live);
                    return Err(refuse(Scope::Connect, decision.retry_after, Some(decision)));
                }
            }
            *live.per_ip.entry(client.ip.clone()).or_default() += 1;
            if let Some(user) = &client.user {
                *live.per_user.entry(user.clone()).or_default() += 1;
            }
            live.total += 1;
        }
        inner.stats.opened.fetch_add(1, Ordering::Relaxed);
        inner.stats.live.fetch_add(1, Ordering::Relaxed);
        Ok(Session::new(self.clone(), client))
    }

    /// The policy this limiter enforces.
    pub fn policy(&self) -> &WsPolicy {
        &self.inner.policy
    }

    /// The rate of new connections per IP, if limited.
    pub fn connect_quota(&self) -> Option<Quota> {
        self.inner.rules.connect_rate
    }

    /// The error frame for `rejection`, from the configured template.
    pub fn error_frame(&self, rejection: &Rejection) -> String {
        self.inner.rules.frame.render(rejection)
    }

    /// The limiter's counters.
    pub fn stats(&self) -> WsStatsSnapshot {
        self.inner.stats.snapshot()
    }

    /// Sessions alive now, and the IPs and users with open connections (all zero once every
    /// session is dropped).
    pub fn live(&self) -> (usize, usize, usize) {
        let live = self.inner.live.lock();
        (live.total, live.per_ip.len(), live.per_user.len())
    }

    /// Clients the penalty box remembers now.
    pub fn penalized(&self) -> usize {
        self.inner.penalty.as_ref().map_or(0, PenaltyBox::len)
    }
}

impl<C: Clock> WsLimiter<C> {
    /// Gives a session's place in the caps back.
    fn release(&self, client: &Client) {
        let mut live = self.inner.live.lock();
        let drop_one = |map: &mut HashMap<String, u32>, key: &str| {
            if let Some(n) = map.get_mut(key) {
                *n -= 1;
                if *n == 0 {
                    map.remove(key);
                }
            }
        };
        drop_one(&mut live.per_ip, &client.ip);
        if let Some(user) = &client.user {
            drop_one(&mut live.per_user, user);
        }
        live.total = live.total.saturating_sub(1);
        drop(live);
        self.inner.stats.live.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One connection's limits, from [`WsLimiter::admit`]. Dropping it — on close, error,
/// timeout or shutdown alike — releases its place in the caps and all its state.
pub struct Session<C: Clock = MonotonicClock> {
    /// The limiter (rules, caps, penalty box, counters).
    limiter: WsLimiter<C>,
    /// Who is connected.
    client: Client,
    /// Messages per connection (the role's quota).
    messages: Option<RateLimiter<C>>,
    /// Bytes per connection.
    bytes: Option<RateLimiter<C>>,
    /// Errors per connection.
    errors: Option<RateLimiter<C>>,
    /// Violations before a close.
    violations: Option<RateLimiter<C>>,
    /// Close when sending at a multiple of the connection rate.
    flood: Option<RateLimiter<C>>,
    /// The user layer's quota for this session's role, and its store key.
    user: Option<(Quota, String)>,
    /// Scratch space for the room and slowmode keys.
    keys: [String; 2],
    /// Set once the session has closed the connection.
    closed: Option<Close>,
}

impl<C: Clock> std::fmt::Debug for Session<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("client", &self.client)
            .field("closed", &self.closed)
            .finish_non_exhaustive()
    }
}

impl<C: Clock> Drop for Session<C> {
    fn drop(&mut self) {
        self.limiter.release(&self.client);
    }
}

/// What [`Session::check_local`] decided: the message's action, or that the layers kept in the
/// store must be asked ([`Session::check_store`]).
#[derive(Debug)]
#[must_use = "a message the store must judge is not decided yet"]
pub enum Checked {
    /// Decided without the store.
    Decided(Action),
    /// The store's layers are still to be asked.
    AskStore(Pending),
}

/// A message the per-connection layers passed, waiting for the store's layers: what it
/// costs there, and the units to give back to the connection's layers if they reject.
#[derive(Debug)]
pub struct Pending {
    cost: u64,
    release: bool,
    taken: [u64; 2],
}

/// What one store-backed layer asks.
struct Layer {
    scope: Scope,
    quota: Quota,
    cost: u64,
    enforced: bool,
}

impl<C: Clock + Clone> Session<C> {
    fn new(limiter: WsLimiter<C>, client: Client) -> Self {
        let rules = &limiter.inner.rules;
        let clock = &limiter.inner.clock;
        let local = |quota: Option<Quota>| quota.map(|q| RateLimiter::with_clock(q, clock.clone()));
        let role = client.role.as_deref();
        let connection = rules.connection.quota(role);
        let flood = rules.ladder.multiple.zip(connection).and_then(|(m, q)| {
            let limit = q.limit().checked_mul(m)?;
            Quota::new(limit, q.period())
                .and_then(|f| f.with_burst(q.burst().saturating_mul(m)))
                .ok()
        });
        let user = client.user.as_deref().and_then(|user| {
            let quota = rules.user.quota(role)?;
            let mut key = String::with_capacity(rules.key_prefix.len() + user.len() + 24);
            KeyWriter::tagged(&mut key, "ws", &rules.key_prefix)
                .field("user", user)
                .field("role", role.unwrap_or(""));
            Some((quota, key))
        });
        Session {
            messages: local(connection),
            bytes: local(rules.bytes),
            errors: local(rules.errors),
            violations: local(rules.ladder.after),
            flood: local(flood),
            user,
            keys: [String::new(), String::new()],
            closed: None,
            client,
            limiter,
        }
    }

    /// Who is connected.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Moves the session to `room` (its messages go there unless they name their own).
    pub fn join(&mut self, room: impl Into<String>) {
        self.client.room = Some(room.into());
    }

    /// Judges one message from the client. `store` keeps the user, room and slowmode layers
    /// (a [`MemoryStore`](crate::store::MemoryStore) for one instance, Redis for a fleet); the
    /// per-connection layers are in the session. A message passes only if every enforced layer
    /// allows it; units taken from layers that allowed are given back when another rejects.
    ///
    /// The same as [`check_local`](Self::check_local), then
    /// [`check_store`](Self::check_store) when it asks for the store.
    pub async fn check<S: Store + ?Sized>(
        &mut self,
        store: &S,
        message: &MessageInfo<'_>,
    ) -> Action {
        match self.check_local(message) {
            Checked::Decided(action) => action,
            Checked::AskStore(pending) => self.check_store(store, message, pending).await,
        }
    }

    /// The first step of [`check`](Self::check), without waiting: the per-connection layers,
    /// and the decision itself when they reject or when no layer kept in the store (user,
    /// room, slowmode) applies to the message. Otherwise the caller finishes with
    /// [`check_store`](Self::check_store) — so a relay needs no future (nor its allocation)
    /// for a message the store has no part in.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use flowgate::store::MemoryStore;
    /// use flowgate::ws::{Action, Checked, Client, MessageInfo, WsLimiter};
    /// use flowgate::Quota;
    ///
    /// let limiter = WsLimiter::builder()
    ///     .messages(Quota::per_second(10))
    ///     .room_messages(Quota::per_second(100))
    ///     .build()?;
    /// let mut session = limiter.admit(Client::new("10.0.0.1"))?;
    /// // To no room: only the connection's layer applies, decided at once.
    /// let Checked::Decided(action) = session.check_local(&MessageInfo::new(10)) else {
    ///     unreachable!()
    /// };
    /// assert_eq!(action, Action::Forward);
    /// // To a room: its layer is in the store.
    /// let store = MemoryStore::new();
    /// let to_room = MessageInfo::new(10).room("lobby");
    /// let Checked::AskStore(pending) = session.check_local(&to_room) else { unreachable!() };
    /// assert_eq!(session.check_store(&store, &to_room, pending).await, Action::Forward);
    /// # Ok(()) }
    /// ```
    pub fn check_local(&mut self, message: &MessageInfo<'_>) -> Checked {
        if let Some(close) = &self.closed {
            return Checked::Decided(Action::Close(close.clone()));
        }
        let inner = &*self.limiter.inner;
        let rules = &inner.rules;
        inner.stats.message(message.size);
        if let Some(max) = rules.max_message_size
            && message.size > max
        {
            if rules.is_dry_run(Scope::Size) {
                inner.stats.decided(Scope::Size, LayerDecision::DryRun);
            } else {
                inner.stats.decided(Scope::Size, LayerDecision::Rejected);
                return Checked::Decided(self.close(
                    Scope::Size,
                    close_code::MESSAGE_TOO_BIG,
                    "message too big",
                ));
            }
        }
        let cost = rules.costs.cost_of(message);
        let release = rules.costs.releases(message);
        if let Some(flood) = &self.flood
            && !release
            && !flood.check_n(cost).is_ok_and(|d| d.allowed)
            && !rules.is_dry_run(Scope::Connection)
        {
            let reason = rules.close_reason.clone();
            return Checked::Decided(self.close(Scope::Connection, rules.ladder.code, &reason));
        }
        // The layers in the session, then those in the store; `taken` remembers what to give
        // back if a later layer rejects.
        let mut taken = [0u64; 2];
        let mut rejected = None;
        let local = [
            (Scope::Connection, self.messages.as_ref(), cost),
            (Scope::Bytes, self.bytes.as_ref(), message.size as u64),
        ];
        for (slot, (scope, limiter, units)) in local.into_iter().enumerate() {
            let Some(limiter) = limiter else {
                continue;
            };
            let judged = match limiter.check_n(units) {
                Ok(decision) => judge(rules, scope, release, &decision),
                Err(_) => never_fits(rules, scope, release, limiter.quota()),
            };
            match judged {
                Effect::Taken => {
                    inner.stats.decided(scope, LayerDecision::Allowed);
                    taken[slot] = units;
                }
                Effect::Pass(outcome) => inner.stats.decided(scope, outcome),
                Effect::Reject(rejection) => {
                    inner.stats.decided(scope, LayerDecision::Rejected);
                    rejected = Some(rejection);
                    break;
                }
            }
        }
        if let Some(rejection) = rejected {
            self.give_back(taken);
            return Checked::Decided(self.violation(rejection));
        }
        if !self.meets_store(message.room.or(self.client.room.as_deref())) {
            return Checked::Decided(Action::Forward);
        }
        Checked::AskStore(Pending {
            cost,
            release,
            taken,
        })
    }

    /// The second step of [`check`](Self::check): the layers kept in `store` (user, room,
    /// slowmode), for a message [`check_local`](Self::check_local) passed on as `pending`.
    pub async fn check_store<S: Store + ?Sized>(
        &mut self,
        store: &S,
        message: &MessageInfo<'_>,
        pending: Pending,
    ) -> Action {
        let Pending {
            cost,
            release,
            taken,
        } = pending;
        match self.store_layers(store, message, cost, release).await {
            None => Action::Forward,
            Some(rejection) => {
                self.give_back(taken);
                self.violation(rejection)
            }
        }
    }

    /// Whether a layer kept in the store applies to a message to `room`: the user's, the
    /// room's, or the room's slowmode (unless the role is exempt).
    fn meets_store(&self, room: Option<&str>) -> bool {
        let rules = &self.limiter.inner.rules;
        self.user.is_some()
            || room.is_some_and(|room| {
                rules.room.is_some() || (rules.slowmode_in(room).is_some() && !self.exempt())
            })
    }

    /// Whether the session's role is exempt from slowmode.
    fn exempt(&self) -> bool {
        let rules = &self.limiter.inner.rules;
        self.client
            .role
            .as_ref()
            .is_some_and(|r| rules.slowmode_exempt.contains(r))
    }

    /// Gives back the units the connection and bytes layers took for a rejected message.
    fn give_back(&self, [messages, bytes]: [u64; 2]) {
        if let (Some(limiter), true) = (&self.messages, messages > 0) {
            limiter.refund(messages);
        }
        if let (Some(limiter), true) = (&self.bytes, bytes > 0) {
            limiter.refund(bytes);
        }
    }

    /// The store-backed layers: user, room, slowmode. The first enforced rejection, if any.
    async fn store_layers<S: Store + ?Sized>(
        &mut self,
        store: &S,
        message: &MessageInfo<'_>,
        cost: u64,
        release: bool,
    ) -> Option<Rejection> {
        let inner = &*self.limiter.inner;
        let rules = &inner.rules;
        let room = message.room.or(self.client.room.as_deref());
        let exempt = self.exempt();
        let [room_key, slow_key] = &mut self.keys;
        let mut layers: [Option<(Layer, &str)>; 3] = [None, None, None];
        let enforced = |scope: Scope| !release && !rules.is_dry_run(scope);
        if let Some((quota, key)) = &self.user {
            let layer = Layer {
                scope: Scope::User,
                quota: *quota,
                cost,
                enforced: enforced(Scope::User),
            };
            layers[0] = Some((layer, key.as_str()));
        }
        if let (Some(quota), Some(room)) = (rules.room, room) {
            room_key.clear();
            KeyWriter::tagged(room_key, "ws", &rules.key_prefix).field("room", room);
            let layer = Layer {
                scope: Scope::Room,
                quota,
                cost,
                enforced: enforced(Scope::Room),
            };
            layers[1] = Some((layer, room_key.as_str()));
        }
        let slowmode = room.and_then(|room| rules.slowmode_in(room));
        if let (Some(quota), Some(room), false) = (slowmode, room, exempt) {
            slow_key.clear();
            KeyWriter::tagged(slow_key, "ws", &rules.key_prefix)
                .field("room", room)
                .field("who", self.client.who());
            // One message per interval, whatever it costs.
            let layer = Layer {
                scope: Scope::Slowmode,
                quota,
                cost: u64::from(cost > 0),
                enforced: enforced(Scope::Slowmode),
            };
            layers[2] = Some((layer, slow_key.as_str()));
        }
        let layers: Vec<(Layer, &str)> = layers.into_iter().flatten().collect();
        if layers.is_empty() {
            return None;
        }
        let asks: Vec<Ask<'_>> = layers
            .iter()
            .map(|(layer, key)| {
                Ask::new(key, &layer.quota)
                    .cost(layer.cost)
                    .shadow(!layer.enforced)
            })
            .collect();
        let outcome = pipeline::decide(store, &asks).await;
        let mut first = None;
        for ((layer, _), result) in layers.iter().zip(&outcome.results) {
            let rejection = match result {
                Ok(decision) => match judge(rules, layer.scope, release, decision) {
                    Effect::Taken => {
                        inner.stats.decided(layer.scope, LayerDecision::Allowed);
                        continue;
                    }
                    Effect::Pass(outcome) => {
                        inner.stats.decided(layer.scope, outcome);
                        continue;
                    }
                    Effect::Reject(rejection) => rejection,
                },
                // A store that could not answer (and no fallback decided): not forwarded,
                // try again shortly; a cost that can never fit: not forwarded, ever.
                Err(error) => {
                    if !layer.enforced {
                        continue;
                    }
                    Rejection {
                        scope: layer.scope,
                        retry_after: if error.is_transient() {
                            Duration::from_secs(1)
                        } else {
                            Duration::ZERO
                        },
                        limit: layer.quota.limit(),
                        remaining: 0,
                    }
                }
            };
            inner.stats.decided(layer.scope, LayerDecision::Rejected);
            first.get_or_insert(rejection);
        }
        first
    }

    /// Records a rejection; closes the connection if the violations add up.
    fn violation(&mut self, rejection: Rejection) -> Action {
        let closes = self.violations.as_ref().is_some_and(|v| !v.check().allowed);
        let rules = &self.limiter.inner.rules;
        if closes && !rules.is_dry_run(rejection.scope) {
            let (code, reason) = (rules.ladder.code, rules.close_reason.clone());
            return self.close(rejection.scope, code, &reason);
        }
        Action::Reject(rejection)
    }

    /// Counts a protocol or application error of this connection (a malformed message, a
    /// request the backend refused); returns the close when the error-rate layer is exceeded.
    pub fn error(&mut self) -> Option<Close> {
        let errors = self.errors.as_ref()?;
        let inner = &*self.limiter.inner;
        if errors.check().allowed {
            inner.stats.decided(Scope::Errors, LayerDecision::Allowed);
            return None;
        }
        if inner.rules.is_dry_run(Scope::Errors) {
            inner.stats.decided(Scope::Errors, LayerDecision::DryRun);
            return None;
        }
        inner.stats.decided(Scope::Errors, LayerDecision::Rejected);
        match self.close(
            Scope::Errors,
            close_code::POLICY_VIOLATION,
            "too many errors",
        ) {
            Action::Close(close) => Some(close),
            _ => None,
        }
    }

    /// Counts a close the transport sent for its own reasons (1013 when the client cannot keep
    /// up, 1011 on a failure).
    pub fn closed_by_transport(&self, code: u16) {
        self.limiter.inner.stats.closed(code);
    }

    /// Closes the session: counted, remembered (later messages get the same close), and —
    /// for a violation — a strike in the penalty box.
    fn close(&mut self, scope: Scope, code: u16, reason: &str) -> Action {
        let inner = &*self.limiter.inner;
        inner.stats.closed(code);
        if let Some(penalty) = &inner.penalty
            && code == inner.rules.ladder.code
            && penalty
                .strike(self.client.who(), inner.clock.now())
                .is_some()
        {
            inner.stats.banned.fetch_add(1, Ordering::Relaxed);
        }
        let close = Close::new(scope, code, reason);
        self.closed = Some(close.clone());
        Action::Close(close)
    }
}

/// What a layer's decision means for the message.
enum Effect {
    /// Allowed: units taken.
    Taken,
    /// Forwarded without taking units: a dry run's or a release message's denial.
    Pass(LayerDecision),
    /// Rejected.
    Reject(Rejection),
}

/// A message whose cost exceeds the layer's burst: it can never pass (no retry helps).
fn never_fits(rules: &Rules, scope: Scope, release: bool, quota: &Quota) -> Effect {
    if release {
        return Effect::Pass(LayerDecision::Released);
    }
    if rules.is_dry_run(scope) {
        return Effect::Pass(LayerDecision::DryRun);
    }
    Effect::Reject(Rejection {
        scope,
        retry_after: Duration::ZERO,
        limit: quota.limit(),
        remaining: 0,
    })
}

fn judge(rules: &Rules, scope: Scope, release: bool, decision: &Decision) -> Effect {
    if decision.allowed {
        return Effect::Taken;
    }
    if release {
        return Effect::Pass(LayerDecision::Released);
    }
    if rules.is_dry_run(scope) {
        return Effect::Pass(LayerDecision::DryRun);
    }
    Effect::Reject(Rejection {
        scope,
        retry_after: decision.retry_after,
        limit: decision.limit,
        remaining: decision.remaining,
    })
}
