//! The WebSocket limits, as configured: [`WsPolicy`] (every layer and how violations are
//! answered — the one model, built in code with [`WsLimiterBuilder`] or read from a file with
//! the `serde` feature), its validation ([`WsPolicy::problems`]), and the rules a limiter
//! compiles it into.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::Duration;

use super::action::{ErrorFrame, MAX_CLOSE_REASON, Scope, close_code, is_valid_close_code};
use super::limiter::WsLimiter;
use super::message::Costs;
use super::penalty::PenaltyConfig;
use crate::clock::{Clock, MonotonicClock};
use crate::quota::{Algorithm, Quota};

/// `close_after`: how many rejected messages a connection is allowed within a window before
/// the next one closes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(deny_unknown_fields)
)]
pub struct CloseAfter {
    /// Rejections tolerated within `within`, each answered with an error frame; the next
    /// violation closes the connection instead (`3`: three error frames, the fourth violation
    /// closes). At least 1.
    pub violations: u64,
    /// The window (a bucket of `violations` that refills over this long).
    #[cfg_attr(
        feature = "serde",
        serde(deserialize_with = "crate::settings::duration")
    )]
    pub within: Duration,
}

/// The WebSocket limits of one limiter: every layer (each off until set) and how violations
/// are answered. Build it in code ([`WsLimiter::builder`] sets these fields) or read it from a
/// configuration file (feature `serde`: the field names below, durations as `3s`, quotas as
/// `{limit, per, burst}`); [`build`](Self::build) checks it and makes the limiter. Two equal
/// policies build limiters that decide alike.
///
/// ```
/// # #[cfg(feature = "serde")] {
/// use flowgate::ws::WsPolicy;
/// let policy: WsPolicy = serde_json::from_value(serde_json::json!({
///     "connections_per_ip": {"limit": 10, "per": "1s", "burst": 20},
///     "messages": {"limit": 120, "per": "60s"},
///     "slowmode": "3s",
///     "slowmode_exempt": ["moderator"],
///     "costs": {"subscribe": 5, "ping": 0},
///     "close_after": {"violations": 3, "within": "10s"},
///     "dry_run": ["connect"],
/// })).unwrap();
/// let limiter = policy.build().unwrap();
/// assert_eq!(limiter.policy(), &policy);
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(default, deny_unknown_fields)
)]
#[non_exhaustive]
pub struct WsPolicy {
    /// New connections per client IP (e.g. 10 per second, bursts of 20); more are refused
    /// before the upgrade with 429.
    pub connections_per_ip: Option<Quota>,
    /// Connections open at once per client IP (at least 1).
    pub concurrent_per_ip: Option<u32>,
    /// Connections open at once per user (at least 1).
    pub concurrent_per_user: Option<u32>,
    /// Connections open at once on this node (at least 1); beyond, upgrades are refused.
    pub max_connections: Option<usize>,
    /// Messages per connection (their cost), e.g. 120 per 60 s.
    pub messages: Option<Quota>,
    /// Messages per connection for sessions of a role, instead of `messages`.
    pub messages_for_role: BTreeMap<String, Quota>,
    /// Bytes per connection (every message costs its size).
    pub bytes: Option<Quota>,
    /// Messages per user across all of the user's connections — and instances, when the
    /// store is shared: opening more sockets does not multiply the budget.
    pub user_messages: Option<Quota>,
    /// Messages per user for users of a role, instead of `user_messages`.
    pub user_messages_for_role: BTreeMap<String, Quota>,
    /// Messages per room, from all its members together.
    pub room_messages: Option<Quota>,
    /// One message per interval per user and room, in every room.
    #[cfg_attr(
        feature = "serde",
        serde(deserialize_with = "crate::settings::optional_duration")
    )]
    pub slowmode: Option<Duration>,
    /// Slowmode in these rooms only, or with their own interval there.
    #[cfg_attr(
        feature = "serde",
        serde(deserialize_with = "crate::settings::duration_map")
    )]
    pub slowmode_for_room: BTreeMap<String, Duration>,
    /// Roles slowmode does not apply to (moderators, bots).
    pub slowmode_exempt: BTreeSet<String>,
    /// Protocol or application errors per connection
    /// ([`Session::error`](super::Session::error)); beyond, the connection is closed.
    pub errors: Option<Quota>,
    /// The largest message accepted, in bytes (at least 1); a bigger one closes the
    /// connection with 1009.
    pub max_message_size: Option<usize>,
    /// Cost per message type (`subscribe` 5, `ping` 0). A cost the message itself carries
    /// ([`MessageInfo::cost`](super::MessageInfo::cost)) wins over its type's.
    pub costs: BTreeMap<String, u64>,
    /// The cost of messages of no listed type (default 1).
    pub default_cost: u64,
    /// Message types that release resources (`unsubscribe`, `leave`): counted, never
    /// rejected.
    pub release: BTreeSet<String>,
    /// Close the connection when violations add up.
    pub close_after: Option<CloseAfter>,
    /// Close the connection when a client sends at this multiple (at least 1) of its
    /// per-connection quota (Ably: ~20×).
    pub close_at_multiple: Option<u64>,
    /// The close code for violations (default 1008; Discord's 4008): 1000–1003, 1007–1014 or
    /// 3000–4999.
    pub close_code: u16,
    /// The close reason for violations (default `rate limit exceeded`; at most 123 bytes).
    pub close_reason: String,
    /// The error frame rejected messages get.
    pub error_frame: ErrorFrame,
    /// After violation closes, refuse the client's upgrades for a while.
    pub penalty_box: Option<PenaltyConfig>,
    /// Layers that count exactly as enforcement would, and record `dry_run`, but never reject,
    /// refuse or close.
    pub dry_run: BTreeSet<Scope>,
    /// Namespace of the user, room and slowmode layers' store keys (default empty): they are
    /// `ws:<prefix>|user=…`, `ws:<prefix>|room=…`, in [the one key grammar](crate::store::key)
    /// of every front end. Limiters that share a store but must not share counters take
    /// different prefixes.
    pub key_prefix: String,
}

impl Default for WsPolicy {
    /// Every layer off; violations closed with 1008 `rate limit exceeded`; cost 1.
    fn default() -> Self {
        WsPolicy {
            connections_per_ip: None,
            concurrent_per_ip: None,
            concurrent_per_user: None,
            max_connections: None,
            messages: None,
            messages_for_role: BTreeMap::new(),
            bytes: None,
            user_messages: None,
            user_messages_for_role: BTreeMap::new(),
            room_messages: None,
            slowmode: None,
            slowmode_for_room: BTreeMap::new(),
            slowmode_exempt: BTreeSet::new(),
            errors: None,
            max_message_size: None,
            costs: BTreeMap::new(),
            default_cost: 1,
            release: BTreeSet::new(),
            close_after: None,
            close_at_multiple: None,
            close_code: close_code::POLICY_VIOLATION,
            close_reason: "rate limit exceeded".to_owned(),
            error_frame: ErrorFrame::default(),
            penalty_box: None,
            dry_run: BTreeSet::new(),
            key_prefix: String::new(),
        }
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
    /// A count that must be at least 1 was 0 (the field is named).
    #[error("{0} must be at least 1")]
    Zero(&'static str),
    /// A duration that must be longer than zero was zero (the field is named).
    #[error("{0} must be longer than zero")]
    ZeroDuration(&'static str),
}

impl WsPolicyError {
    /// The [`WsPolicy`] field at fault, as a configuration file names it (`close_code`,
    /// `penalty_box.first`, …).
    pub fn field(&self) -> &'static str {
        match self {
            WsPolicyError::InvalidCloseCode(_) => "close_code",
            WsPolicyError::ReasonTooLong(_) => "close_reason",
            WsPolicyError::CostExceedsBurst { .. } => "costs",
            WsPolicyError::Zero(field) | WsPolicyError::ZeroDuration(field) => field,
        }
    }
}

impl WsPolicy {
    /// Every problem of the policy, in field order (empty when it is valid):
    /// [`build`](Self::build) refuses the first; a configuration loader reports them all.
    pub fn problems(&self) -> Vec<WsPolicyError> {
        let mut problems = Vec::new();
        let counts = [
            ("concurrent_per_ip", self.concurrent_per_ip.map(u64::from)),
            (
                "concurrent_per_user",
                self.concurrent_per_user.map(u64::from),
            ),
            ("max_connections", self.max_connections.map(|n| n as u64)),
            ("max_message_size", self.max_message_size.map(|n| n as u64)),
            (
                "close_after.violations",
                self.close_after.map(|c| c.violations),
            ),
            ("close_at_multiple", self.close_at_multiple),
            (
                "penalty_box.after_closes",
                self.penalty_box.map(|p| u64::from(p.after_closes)),
            ),
            (
                "penalty_box.max_entries",
                self.penalty_box.map(|p| p.max_entries as u64),
            ),
        ];
        for (field, count) in counts {
            if count == Some(0) {
                problems.push(WsPolicyError::Zero(field));
            }
        }
        let slowmode_rooms = self.slowmode_for_room.values().copied().min();
        let penalty = self.penalty_box.as_ref();
        let durations = [
            ("slowmode", self.slowmode),
            ("slowmode_for_room", slowmode_rooms),
            ("close_after.within", self.close_after.map(|c| c.within)),
            ("penalty_box.first", penalty.map(|p| p.first)),
            ("penalty_box.max", penalty.map(|p| p.max)),
            ("penalty_box.forget_after", penalty.map(|p| p.forget_after)),
        ];
        for (field, duration) in durations {
            if duration.is_some_and(|d| d.is_zero()) {
                problems.push(WsPolicyError::ZeroDuration(field));
            }
        }
        if !is_valid_close_code(self.close_code) {
            problems.push(WsPolicyError::InvalidCloseCode(self.close_code));
        }
        if self.close_reason.len() > MAX_CLOSE_REASON {
            problems.push(WsPolicyError::ReasonTooLong(self.close_reason.len()));
        }
        let layers = [
            (
                "connection",
                self.messages
                    .iter()
                    .chain(self.messages_for_role.values())
                    .collect::<Vec<_>>(),
            ),
            (
                "user",
                self.user_messages
                    .iter()
                    .chain(self.user_messages_for_role.values())
                    .collect(),
            ),
            ("room", self.room_messages.iter().collect()),
        ];
        let costs = self.costs.values().copied().chain([self.default_cost]);
        let costs: BTreeSet<u64> = costs.collect();
        for (scope, quotas) in layers {
            for quota in quotas {
                if let Some(&cost) = costs.iter().rev().find(|c| quota.check_cost(**c).is_err()) {
                    problems.push(WsPolicyError::CostExceedsBurst {
                        cost,
                        scope,
                        burst: quota.burst(),
                    });
                }
            }
        }
        problems
    }

    /// Checks the policy and builds its limiter (on the monotonic clock).
    pub fn build(&self) -> Result<WsLimiter, WsPolicyError> {
        WsLimiterBuilder::from(self.clone()).build()
    }
}

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
    fn new(default: Option<Quota>, roles: &BTreeMap<String, Quota>) -> Self {
        PerRole {
            default,
            roles: roles.iter().map(|(r, q)| (r.clone(), *q)).collect(),
        }
    }

    /// The quota for `role`.
    pub(crate) fn quota(&self, role: Option<&str>) -> Option<Quota> {
        role.and_then(|r| self.roles.get(r).copied())
            .or(self.default)
    }
}

/// When violations close the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ladder {
    /// `close_after` as a bucket of its violations, refilled over its window.
    pub(crate) after: Option<Quota>,
    /// Close when a client sends at this multiple of its connection rate (Ably: ~20×).
    pub(crate) multiple: Option<u64>,
    /// The close code for violations (default 1008).
    pub(crate) code: u16,
}

/// A valid [`WsPolicy`] compiled for the limiter's lookups. Immutable once built; shared by
/// the limiter's sessions.
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
    /// Compiles `policy`, refusing it with its first problem.
    fn compile(policy: &WsPolicy) -> Result<Rules, WsPolicyError> {
        if let Some(problem) = policy.problems().into_iter().next() {
            return Err(problem);
        }
        // One message per interval, as a bucket of one (the intervals are not zero: checked).
        let interval = |d: Duration| Quota::new(1, d).map_err(|_| WsPolicyError::Zero("slowmode"));
        let mut costs = Costs::default();
        for (kind, cost) in &policy.costs {
            costs.set(kind.clone(), *cost);
        }
        costs.set_default(policy.default_cost);
        for kind in &policy.release {
            costs.release(kind.clone());
        }
        let after = policy
            .close_after
            .map(|c| {
                Quota::new(c.violations, c.within)
                    .and_then(|q| q.with_algorithm(Algorithm::Gcra))
                    .map_err(|_| WsPolicyError::Zero("close_after.violations"))
            })
            .transpose()?;
        Ok(Rules {
            connect_rate: policy.connections_per_ip,
            concurrent_per_ip: policy.concurrent_per_ip,
            concurrent_per_user: policy.concurrent_per_user,
            max_connections: policy.max_connections,
            connection: PerRole::new(policy.messages, &policy.messages_for_role),
            bytes: policy.bytes,
            user: PerRole::new(policy.user_messages, &policy.user_messages_for_role),
            room: policy.room_messages,
            slowmode: policy.slowmode.map(interval).transpose()?,
            slowmode_rooms: policy
                .slowmode_for_room
                .iter()
                .map(|(room, d)| Ok((room.clone(), interval(*d)?)))
                .collect::<Result<_, WsPolicyError>>()?,
            slowmode_exempt: policy.slowmode_exempt.iter().cloned().collect(),
            errors: policy.errors,
            max_message_size: policy.max_message_size,
            costs,
            ladder: Ladder {
                after,
                multiple: policy.close_at_multiple,
                code: policy.close_code,
            },
            close_reason: policy.close_reason.clone(),
            frame: policy.error_frame.clone(),
            penalty: policy.penalty_box,
            dry_run: policy.dry_run.iter().copied().collect(),
            key_prefix: policy.key_prefix.clone(),
        })
    }

    pub(crate) fn is_dry_run(&self, scope: Scope) -> bool {
        self.dry_run.contains(&scope)
    }

    /// The slowmode interval in `room`, if there is one.
    pub(crate) fn slowmode_in(&self, room: &str) -> Option<Quota> {
        self.slowmode_rooms.get(room).copied().or(self.slowmode)
    }
}

/// Builds a [`WsLimiter`]: sets the fields of a [`WsPolicy`] (every layer off until set) and
/// the clock. Invalid settings are refused by [`build`](Self::build).
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
    policy: WsPolicy,
    clock: C,
}

impl Default for WsLimiterBuilder<MonotonicClock> {
    fn default() -> Self {
        WsPolicy::default().into()
    }
}

impl From<WsPolicy> for WsLimiterBuilder<MonotonicClock> {
    /// A builder starting from `policy` (e.g. read from a file), to change it or set the
    /// clock.
    fn from(policy: WsPolicy) -> Self {
        WsLimiterBuilder {
            policy,
            clock: MonotonicClock::new(),
        }
    }
}

impl WsLimiterBuilder<MonotonicClock> {
    /// Uses `clock` (a `ManualClock` in tests) for every per-connection layer and the penalty
    /// box.
    pub fn clock<C: Clock + Clone>(self, clock: C) -> WsLimiterBuilder<C> {
        WsLimiterBuilder {
            policy: self.policy,
            clock,
        }
    }
}

impl<C: Clock + Clone> WsLimiterBuilder<C> {
    /// The policy so far.
    pub fn policy(&self) -> &WsPolicy {
        &self.policy
    }

    /// [`WsPolicy::connections_per_ip`].
    pub fn connections_per_ip(mut self, quota: Quota) -> Self {
        self.policy.connections_per_ip = Some(quota);
        self
    }

    /// [`WsPolicy::concurrent_per_ip`].
    pub fn concurrent_per_ip(mut self, n: u32) -> Self {
        self.policy.concurrent_per_ip = Some(n);
        self
    }

    /// [`WsPolicy::concurrent_per_user`].
    pub fn concurrent_per_user(mut self, n: u32) -> Self {
        self.policy.concurrent_per_user = Some(n);
        self
    }

    /// [`WsPolicy::max_connections`].
    pub fn max_connections(mut self, n: usize) -> Self {
        self.policy.max_connections = Some(n);
        self
    }

    /// [`WsPolicy::messages`].
    pub fn messages(mut self, quota: Quota) -> Self {
        self.policy.messages = Some(quota);
        self
    }

    /// [`WsPolicy::messages_for_role`]: the quota of sessions of `role`.
    pub fn messages_for_role(mut self, role: impl Into<String>, quota: Quota) -> Self {
        self.policy.messages_for_role.insert(role.into(), quota);
        self
    }

    /// [`WsPolicy::bytes`].
    pub fn bytes(mut self, quota: Quota) -> Self {
        self.policy.bytes = Some(quota);
        self
    }

    /// [`WsPolicy::user_messages`].
    pub fn user_messages(mut self, quota: Quota) -> Self {
        self.policy.user_messages = Some(quota);
        self
    }

    /// [`WsPolicy::user_messages_for_role`]: the quota of users of `role`.
    pub fn user_messages_for_role(mut self, role: impl Into<String>, quota: Quota) -> Self {
        self.policy
            .user_messages_for_role
            .insert(role.into(), quota);
        self
    }

    /// [`WsPolicy::room_messages`].
    pub fn room_messages(mut self, quota: Quota) -> Self {
        self.policy.room_messages = Some(quota);
        self
    }

    /// [`WsPolicy::slowmode`]: one message per `interval` per user and room (Discord:
    /// 0–21,600 s; Twitch: 3–120 s).
    pub fn slowmode(mut self, interval: Duration) -> Self {
        self.policy.slowmode = Some(interval);
        self
    }

    /// [`WsPolicy::slowmode_for_room`]: slowmode in `room` only (or with its own interval
    /// there).
    pub fn slowmode_for_room(mut self, room: impl Into<String>, interval: Duration) -> Self {
        self.policy.slowmode_for_room.insert(room.into(), interval);
        self
    }

    /// [`WsPolicy::slowmode_exempt`]: sessions of `role` are not slowed.
    pub fn slowmode_exempt(mut self, role: impl Into<String>) -> Self {
        self.policy.slowmode_exempt.insert(role.into());
        self
    }

    /// [`WsPolicy::errors`].
    pub fn errors(mut self, quota: Quota) -> Self {
        self.policy.errors = Some(quota);
        self
    }

    /// [`WsPolicy::max_message_size`].
    pub fn max_message_size(mut self, bytes: usize) -> Self {
        self.policy.max_message_size = Some(bytes);
        self
    }

    /// [`WsPolicy::costs`]: messages of type `kind` cost `cost` units (Binance's request
    /// weights).
    pub fn cost(mut self, kind: impl Into<String>, cost: u64) -> Self {
        self.policy.costs.insert(kind.into(), cost);
        self
    }

    /// [`WsPolicy::default_cost`].
    pub fn default_cost(mut self, cost: u64) -> Self {
        self.policy.default_cost = cost;
        self
    }

    /// [`WsPolicy::release`]: messages of type `kind` are counted, never rejected.
    pub fn release(mut self, kind: impl Into<String>) -> Self {
        self.policy.release.insert(kind.into());
        self
    }

    /// [`WsPolicy::close_after`]: `violations` rejections within `within` are answered with
    /// error frames; the next violation closes the connection.
    pub fn close_after(mut self, violations: u64, within: Duration) -> Self {
        self.policy.close_after = Some(CloseAfter { violations, within });
        self
    }

    /// [`WsPolicy::close_at_multiple`].
    pub fn close_at_multiple(mut self, multiple: u64) -> Self {
        self.policy.close_at_multiple = Some(multiple);
        self
    }

    /// [`WsPolicy::close_code`] and [`WsPolicy::close_reason`] (default 1008, "rate limit
    /// exceeded"); e.g. Discord's 4008. The reason must fit a close frame (123 bytes).
    pub fn close_code(mut self, code: u16, reason: &str) -> Self {
        self.policy.close_code = code;
        self.policy.close_reason = reason.to_owned();
        self
    }

    /// [`WsPolicy::error_frame`].
    pub fn error_frame(mut self, frame: ErrorFrame) -> Self {
        self.policy.error_frame = frame;
        self
    }

    /// [`WsPolicy::penalty_box`] (see [`PenaltyConfig`]).
    pub fn penalty_box(mut self, config: PenaltyConfig) -> Self {
        self.policy.penalty_box = Some(config);
        self
    }

    /// [`WsPolicy::dry_run`]: `scope`'s layer counts exactly as enforcement would, and its
    /// decisions are recorded as `dry_run`, but it never rejects, refuses or closes.
    pub fn dry_run(mut self, scope: Scope) -> Self {
        self.policy.dry_run.insert(scope);
        self
    }

    /// [`WsPolicy::key_prefix`].
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.policy.key_prefix = prefix.into();
        self
    }

    /// Checks the policy ([`WsPolicy::problems`]) and builds the limiter.
    pub fn build(self) -> Result<WsLimiter<C>, WsPolicyError> {
        let rules = Rules::compile(&self.policy)?;
        Ok(WsLimiter::new(self.policy, rules, self.clock))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_problem_is_listed_with_its_field() {
        let mut policy = WsPolicy {
            concurrent_per_ip: Some(0),
            close_code: 1005,
            close_reason: "x".repeat(124),
            messages: Some(Quota::per_second(10)),
            costs: BTreeMap::from([("snapshot".to_owned(), 40)]),
            ..WsPolicy::default()
        };
        policy.penalty_box = Some(PenaltyConfig {
            first: Duration::ZERO,
            ..PenaltyConfig::default()
        });
        let fields: Vec<_> = policy.problems().iter().map(WsPolicyError::field).collect();
        assert_eq!(
            fields,
            [
                "concurrent_per_ip",
                "penalty_box.first",
                "close_code",
                "close_reason",
                "costs"
            ]
        );
        assert_eq!(
            policy.build().unwrap_err(),
            WsPolicyError::Zero("concurrent_per_ip")
        );
        assert!(WsPolicy::default().problems().is_empty());
    }
}
