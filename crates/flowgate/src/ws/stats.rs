//! [`WsStats`]: what the WebSocket limiter decided, counted with bounded labels (a fixed set of
//! scopes and outcomes, close codes, size buckets) for metrics.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use super::action::Scope;

/// What a layer did with a message, or with an upgrade (the connection layers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LayerDecision {
    /// Allowed (units taken).
    Allowed,
    /// Rejected (a message not forwarded, an error frame sent; an upgrade refused with 429).
    Rejected,
    /// Would have been rejected, but the layer is a dry run: forwarded (or admitted).
    DryRun,
    /// Over the limit but releasing resources (`unsubscribe`): counted, forwarded.
    Released,
}

impl LayerDecision {
    /// Every outcome, in a fixed order.
    pub const ALL: [LayerDecision; 4] = [
        LayerDecision::Allowed,
        LayerDecision::Rejected,
        LayerDecision::DryRun,
        LayerDecision::Released,
    ];

    /// The outcome's name in metrics.
    pub const fn name(self) -> &'static str {
        match self {
            LayerDecision::Allowed => "allowed",
            LayerDecision::Rejected => "rejected",
            LayerDecision::DryRun => "dry_run",
            LayerDecision::Released => "released",
        }
    }
}

/// Upper bounds of the message size histogram's buckets, in bytes (the last is `+Inf`).
pub const SIZE_BUCKETS: [u64; 8] = [64, 256, 1024, 4096, 16_384, 65_536, 262_144, 1_048_576];

/// The limiter's counters, shared by its sessions.
#[derive(Debug, Default)]
pub struct WsStats {
    /// Live sessions.
    pub(crate) live: AtomicU64,
    /// Connections admitted.
    pub(crate) opened: AtomicU64,
    /// Connections refused before the upgrade, by scope.
    refused: [AtomicU64; Scope::ALL.len()],
    /// Decisions (messages, and upgrades for the connection layers), by scope and outcome.
    decisions: [[AtomicU64; LayerDecision::ALL.len()]; Scope::ALL.len()],
    /// Messages, by size bucket (`SIZE_BUCKETS`, then `+Inf`).
    sizes: [AtomicU64; SIZE_BUCKETS.len() + 1],
    /// Sum of message sizes.
    size_sum: AtomicU64,
    /// Closes sent, by code.
    closes: Mutex<BTreeMap<u16, u64>>,
    /// Bans the penalty box handed out.
    pub(crate) banned: AtomicU64,
}

impl WsStats {
    pub(crate) fn refused(&self, scope: Scope) {
        self.refused[scope.index()].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn decided(&self, scope: Scope, outcome: LayerDecision) {
        self.decisions[scope.index()][outcome as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn message(&self, size: usize) {
        let size = size as u64;
        let bucket = SIZE_BUCKETS
            .iter()
            .position(|&b| size <= b)
            .unwrap_or(SIZE_BUCKETS.len());
        self.sizes[bucket].fetch_add(1, Ordering::Relaxed);
        self.size_sum.fetch_add(size, Ordering::Relaxed);
    }

    pub(crate) fn closed(&self, code: u16) {
        *self.closes.lock().entry(code).or_default() += 1;
    }

    /// The counters now.
    pub fn snapshot(&self) -> WsStatsSnapshot {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        WsStatsSnapshot {
            live: get(&self.live),
            opened: get(&self.opened),
            refused: Scope::ALL
                .iter()
                .map(|s| (*s, get(&self.refused[s.index()])))
                .collect(),
            decisions: Scope::ALL
                .iter()
                .flat_map(|s| {
                    LayerDecision::ALL
                        .iter()
                        .map(move |o| (*s, *o, get(&self.decisions[s.index()][*o as usize])))
                })
                .collect(),
            size_buckets: self.sizes.iter().map(get).collect(),
            size_sum: get(&self.size_sum),
            closes: self.closes.lock().iter().map(|(c, n)| (*c, *n)).collect(),
            banned: get(&self.banned),
        }
    }
}

/// [`WsStats`] at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct WsStatsSnapshot {
    /// Live sessions (connections admitted and not yet dropped).
    pub live: u64,
    /// Connections admitted since start.
    pub opened: u64,
    /// Connections refused before the upgrade, per scope.
    pub refused: Vec<(Scope, u64)>,
    /// Decisions per scope and outcome: messages, and upgrades for the connection layers
    /// (`connect`, `concurrent_ip`, `concurrent_user`, `node`, `penalty`).
    pub decisions: Vec<(Scope, LayerDecision, u64)>,
    /// Messages per size bucket: `SIZE_BUCKETS[i]` bytes or less, then larger (not
    /// cumulative).
    pub size_buckets: Vec<u64>,
    /// Sum of message sizes, in bytes.
    pub size_sum: u64,
    /// Closes sent per code.
    pub closes: Vec<(u16, u64)>,
    /// Bans the penalty box handed out.
    pub banned: u64,
}

impl WsStatsSnapshot {
    /// The count of `scope`'s decisions with `outcome`.
    pub fn decisions(&self, scope: Scope, outcome: LayerDecision) -> u64 {
        self.decisions
            .iter()
            .find(|(s, o, _)| *s == scope && *o == outcome)
            .map_or(0, |(_, _, n)| *n)
    }

    /// Connections refused by `scope`.
    pub fn refused(&self, scope: Scope) -> u64 {
        self.refused
            .iter()
            .find(|(s, _)| *s == scope)
            .map_or(0, |(_, n)| *n)
    }

    /// Closes sent with `code`.
    pub fn closes(&self, code: u16) -> u64 {
        self.closes
            .iter()
            .find(|(c, _)| *c == code)
            .map_or(0, |(_, n)| *n)
    }
}
