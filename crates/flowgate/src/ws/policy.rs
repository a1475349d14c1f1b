//! The WebSocket limits, as configured: every layer and how violations are answered
//! ([`WsLimiterBuilder`]).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use super::limiter::WsLimiter;
use super::message::Costs;
use super::penalty::PenaltyConfig;
use super::verdict::{ErrorFrame, MAX_CLOSE_REASON, Scope, close_code, is_valid_close_code};
use crate::clock::{Clock, MonotonicClock};
use crate::quota::{Algorithm, Quota};

/// A quota that may depend on the user's role (Twitch: users 20 messages / 30 s, moderators
/// 100; verified bots 7,500).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PerRole {
    /// For a role not listed (and sessions without a role); `None`: the layer does not apply.
    pub(crate) default: Option<Quota>,
    /// By role.
    pub(crate) roles: HashMap<String, Quota>,
}

impl PerRole {
    /// The quota for `role`.
    pub(crate) fn quota(&self, role: Option<&str>) -> Option<Quota> {
        role.and_then(|r| self.roles.get(r).copied())
            .or(self.default)
    }

    fn all(&self) -> impl Iterator<Item = &Quota> {
        self.default.iter().chain(self.roles.values())
    }
}

/// When violations close the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ladder {
    /// Close after this many rejections within `within`.
    pub(crate) after: Option<Quota>,
    /// Close when a client sends at this multiple of its connection rate (Ably: ~20×).
    pub(crate) multiple: Option<u64>,
    /// The close code for violations (default 1008).
    pub(crate) code: u16,
}

/// Every layer's settings. Immutable once built; shared by the limiter's sessions.
#[derive(Debug, Clone)]
pub(crate) struct Rules {
    pub(crate) connect_rate: Option<Quota>,
    pub(crate) concurrent_per_ip: Option<u32>,
    pub(crate) concurrent_per_user: Option<u32>,
    pub(crate) max_connections: Option<usize>,
    pub(crate) connection: PerRole,
    pub(crate) bytes: Option<Quota>,
    pub(crate) user: PerRole,
    pub(crate) room: Option<Quota>,
    /// One message per interval per user and room (a bucket of one), in every room…
    pub(crate) slowmode: Option<Quota>,
    /// … unless the room has its own interval (Discord sets slowmode per channel).
    pub(crate) slowmode_rooms: HashMap<String, Quota>,
    /// Roles slowmode does not apply to (moderators, bots).
    pub(crate) slowmode_exempt: HashSet<String>,
    pub(crate) errors: Option<Quota>,
    pub(crate) max_message_size: Option<usize>,
    pub(crate) costs: Costs,
    pub(crate) ladder: Ladder,
    pub(crate) close_reason: String,
    pub(crate) frame: ErrorFrame,
    pub(crate) penalty: Option<PenaltyConfig>,
    /// Layers that count but never reject or close.
    pub(crate) dry_run: HashSet<Scope>,
    /// Prepended to the store keys of the user, room and slowmode layers.
    pub(crate) key_prefix: String,
}

impl Rules {
    pub(crate) fn is_dry_run(&self, scope: Scope) -> bool {
        self.dry_run.contains(&scope)
    }

    /// The slowmode interval in `room`, if there is one.
    pub(crate) fn slowmode_in(&self, room: &str) -> Option<Quota> {
        self.slowmode_rooms.get(room).copied().or(self.slowmode)
    }
}

/// Why a WebSocket policy was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WsPolicyError {
    /// The close code cannot be sent in a close frame.
    #[error(
        "close code {0} cannot be sent: use 1008, 1000-1003, 1007-1014 or 3000-4999 (e.g. 4008)"
    )]
    InvalidCloseCode(u16),
    /// The close reason is longer than a close frame can carry.
    #[error("the close reason is {0} bytes; a close frame carries at most 123")]
    ReasonTooLong(usize),
    /// A listed message cost exceeds a message layer's burst: such messages could never pass.
    #[error("a message cost of {cost} can never be granted: the {scope} layer's burst is {burst}")]
    CostExceedsBurst {
        /// The cost.
        cost: u64,
        /// The layer.
        scope: &'static str,
        /// Its burst.
        burst: u64,
    },
    /// A count that must be at least 1 was 0.
    #[error("{0} must be at least 1")]
    Zero(&'static str),
}

/// Builds a [`WsLimiter`]: every layer is optional and off until set.
///
/// ```
/// use std::time::Duration;
/// use flowgate::{ws::WsLimiter, Quota};
///
/// let limiter = WsLimiter::builder()
///     .connections_per_ip(Quota::per_second(10).with_burst(20)?)
///     .concurrent_per_ip(50)
///     .messages(Quota::new(120, Duration::from_secs(60))?)          // Discord: 120 / 60 s
///     .user_messages(Quota::new(20, Duration::from_secs(30))?)      // Twitch: 20 / 30 s …
///     .user_messages_for_role("moderator", Quota::new(100, Duration::from_secs(30))?)
///     .slowmode(Duration::from_secs(3))
///     .slowmode_exempt("moderator")
///     .cost("subscribe", 5)
///     .cost("ping", 0)
///     .release("unsubscribe")
///     .max_message_size(64 * 1024)
///     .close_after(3, Duration::from_secs(10))
///     .close_code(4008, "rate limited")
///     .build()?;
/// # let _ = limiter;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct WsLimiterBuilder<C = MonotonicClock> {
    rules: Rules,
    clock: C,
    error: Option<WsPolicyError>,
}

impl Default for WsLimiterBuilder<MonotonicClock> {
    fn default() -> Self {
        WsLimiterBuilder {
            rules: Rules {
                connect_rate: None,
                concurrent_per_ip: None,
                concurrent_per_user: None,
                max_connections: None,
                connection: PerRole::default(),
                bytes: None,
                user: PerRole::default(),
                room: None,
                slowmode: None,
                slowmode_rooms: HashMap::new(),
                slowmode_exempt: HashSet::new(),
                errors: None,
                max_message_size: None,
                costs: Costs::default(),
                ladder: Ladder {
                    after: None,
                    multiple: None,
                    code: close_code::POLICY_VIOLATION,
                },
                close_reason: "rate limit exceeded".to_owned(),
                frame: ErrorFrame::default(),
                penalty: None,
                dry_run: HashSet::new(),
                key_prefix: String::new(),
            },
            clock: MonotonicClock::new(),
            error: None,
        }
    }
}

impl WsLimiterBuilder<MonotonicClock> {
    /// Uses `clock` (a `ManualClock` in tests) for every per-connection layer and the penalty
    /// box.
    pub fn clock<C: Clock + Clone>(self, clock: C) -> WsLimiterBuilder<C> {
        WsLimiterBuilder {
            rules: self.rules,
            clock,
            error: self.error,
        }
    }
}

impl<C: Clock + Clone> WsLimiterBuilder<C> {
    fn fail(mut self, error: WsPolicyError) -> Self {
        self.error.get_or_insert(error);
        self
    }

    /// New connections per client IP (e.g. 10 per second, bursts of 20); more are refused
    /// before the upgrade with 429.
    pub fn connections_per_ip(mut self, quota: Quota) -> Self {
        self.rules.connect_rate = Some(quota);
        self
    }

    /// Connections open at once per client IP.
    pub fn concurrent_per_ip(mut self, n: u32) -> Self {
        if n == 0 {
            return self.fail(WsPolicyError::Zero("concurrent_per_ip"));
        }
        self.rules.concurrent_per_ip = Some(n);
        self
    }

    /// Connections open at once per user.
    pub fn concurrent_per_user(mut self, n: u32) -> Self {
        if n == 0 {
            return self.fail(WsPolicyError::Zero("concurrent_per_user"));
        }
        self.rules.concurrent_per_user = Some(n);
        self
    }

    /// Connections open at once on this node; beyond, upgrades are refused with 429.
    pub fn max_connections(mut self, n: usize) -> Self {
        if n == 0 {
            return self.fail(WsPolicyError::Zero("max_connections"));
        }
        self.rules.max_connections = Some(n);
        self
    }

    /// Messages per connection (their cost, per type), e.g. 120 per 60 s.
    pub fn messages(mut self, quota: Quota) -> Self {
        self.rules.connection.default = Some(quota);
        self
    }

    /// Messages per connection for sessions of `role`.
    pub fn messages_for_role(mut self, role: impl Into<String>, quota: Quota) -> Self {
        self.rules.connection.roles.insert(role.into(), quota);
        self
    }

    /// Bytes per connection (every message costs its size).
    pub fn bytes(mut self, quota: Quota) -> Self {
        self.rules.bytes = Some(quota);
        self
    }

    /// Messages per user, across all of the user's connections — and across instances when
    /// the store is shared (Redis): opening more sockets does not multiply the budget.
    pub fn user_messages(mut self, quota: Quota) -> Self {
        self.rules.user.default = Some(quota);
        self
    }

    /// Messages per user for users of `role`.
    pub fn user_messages_for_role(mut self, role: impl Into<String>, quota: Quota) -> Self {
        self.rules.user.roles.insert(role.into(), quota);
        self
    }

    /// Messages per room, from all its members together.
    pub fn room_messages(mut self, quota: Quota) -> Self {
        self.rules.room = Some(quota);
        self
    }

    /// Slowmode: one message per `interval` per user and room (Discord: 0–21,600 s; Twitch:
    /// 3–120 s).
    pub fn slowmode(mut self, interval: Duration) -> Self {
        match Quota::new(1, interval) {
            Ok(quota) => {
                self.rules.slowmode = Some(quota);
                self
            }
            Err(_) => self.fail(WsPolicyError::Zero("slowmode")),
        }
    }

    /// Slowmode in `room` only (or with its own interval there): one message per `interval`
    /// per user.
    pub fn slowmode_for_room(mut self, room: impl Into<String>, interval: Duration) -> Self {
        match Quota::new(1, interval) {
            Ok(quota) => {
                self.rules.slowmode_rooms.insert(room.into(), quota);
                self
            }
            Err(_) => self.fail(WsPolicyError::Zero("slowmode")),
        }
    }

    /// Sessions of `role` are not slowed (moderators, bots).
    pub fn slowmode_exempt(mut self, role: impl Into<String>) -> Self {
        self.rules.slowmode_exempt.insert(role.into());
        self
    }

    /// Protocol or application errors per connection ([`Session::error`](super::Session::error));
    /// beyond, the connection is closed.
    pub fn errors(mut self, quota: Quota) -> Self {
        self.rules.errors = Some(quota);
        self
    }

    /// The largest message accepted; a bigger one closes the connection with 1009.
    pub fn max_message_size(mut self, bytes: usize) -> Self {
        self.rules.max_message_size = Some(bytes);
        self
    }

    /// Messages of type `kind` cost `cost` units (`subscribe` 5, `ping` 0; Binance's request
    /// weights).
    pub fn cost(mut self, kind: impl Into<String>, cost: u64) -> Self {
        self.rules.costs.set(kind, cost);
        self
    }

    /// The cost of messages of no listed type (default 1).
    pub fn default_cost(mut self, cost: u64) -> Self {
        self.rules.costs.set_default(cost);
        self
    }

    /// Messages of type `kind` release resources (`unsubscribe`, `leave`): counted, never
    /// rejected.
    pub fn release(mut self, kind: impl Into<String>) -> Self {
        self.rules.costs.release(kind);
        self
    }

    /// Close the connection after `violations` rejections within `within` (checked as a bucket
    /// of `violations` that refills over `within`).
    pub fn close_after(mut self, violations: u64, within: Duration) -> Self {
        let quota = Quota::new(violations, within).and_then(|q| q.with_algorithm(Algorithm::Gcra));
        match quota {
            Ok(quota) => {
                self.rules.ladder.after = Some(quota);
                self
            }
            Err(_) => self.fail(WsPolicyError::Zero("close_after")),
        }
    }

    /// Close the connection when a client sends at `multiple` times its connection rate (the
    /// per-connection quota with `multiple` times its limit and burst).
    pub fn close_at_multiple(mut self, multiple: u64) -> Self {
        if multiple == 0 {
            return self.fail(WsPolicyError::Zero("close_at_multiple"));
        }
        self.rules.ladder.multiple = Some(multiple);
        self
    }

    /// The close frame for violations (default 1008, "rate limit exceeded"); e.g. Discord's
    /// 4008. The reason must fit a close frame (123 bytes).
    pub fn close_code(mut self, code: u16, reason: &str) -> Self {
        if !is_valid_close_code(code) {
            return self.fail(WsPolicyError::InvalidCloseCode(code));
        }
        if reason.len() > MAX_CLOSE_REASON {
            return self.fail(WsPolicyError::ReasonTooLong(reason.len()));
        }
        self.rules.ladder.code = code;
        self.rules.close_reason = reason.to_owned();
        self
    }

    /// The error frame rejected messages get (see [`ErrorFrame`]).
    pub fn error_frame(mut self, frame: ErrorFrame) -> Self {
        self.rules.frame = frame;
        self
    }

    /// After violation closes, refuse the client's upgrades for a while (see
    /// [`PenaltyConfig`]).
    pub fn penalty_box(mut self, config: PenaltyConfig) -> Self {
        self.rules.penalty = Some(config);
        self
    }

    /// Makes `scope`'s layer a dry run: it counts exactly as enforcement would, and its
    /// decisions are recorded as `dry_run`, but it never rejects, refuses or closes.
    pub fn dry_run(mut self, scope: Scope) -> Self {
        self.rules.dry_run.insert(scope);
        self
    }

    /// Namespace of the user, room and slowmode layers' store keys (default empty): they are
    /// `ws:<prefix>|user=…`, `ws:<prefix>|room=…`, in [the one key grammar](crate::store::key)
    /// of every front end. Limiters that share a store but must not share counters take
    /// different prefixes.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.rules.key_prefix = prefix.into();
        self
    }

    /// Checks the settings and builds the limiter.
    pub fn build(self) -> Result<WsLimiter<C>, WsPolicyError> {
        if let Some(error) = self.error {
            return Err(error);
        }
        let rules = self.rules;
        let layers = [
            ("connection", rules.connection.all().collect::<Vec<_>>()),
            ("user", rules.user.all().collect()),
            ("room", rules.room.iter().collect()),
        ];
        for (scope, quotas) in layers {
            for quota in quotas {
                for cost in rules.costs.all() {
                    if quota.check_cost(cost).is_err() {
                        return Err(WsPolicyError::CostExceedsBurst {
                            cost,
                            scope,
                            burst: quota.burst(),
                        });
                    }
                }
            }
        }
        Ok(WsLimiter::new(rules, self.clock))
    }
}
