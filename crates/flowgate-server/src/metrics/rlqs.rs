//! The RLQS service's metrics, registered with the service's others by
//! [`RlqsMetrics::register`]:
//!
//! * `flowgate_rlqs_streams` (open now), `flowgate_rlqs_streams_opened_total`,
//!   `flowgate_rlqs_streams_refused_total{reason}` (`capacity`, `draining`),
//!   `flowgate_rlqs_stream_errors_total{reason}` (streams ended with an error status:
//!   `no_domain`, `domain_changed`, `unknown_domain`, `malformed_bucket`,
//!   `malformed_message` (undecodable or larger than `--max-body-bytes`), `absurd_count`,
//!   `too_many_buckets`, `not_reading`);
//! * `flowgate_rlqs_buckets` (buckets tracked now, over all streams),
//!   `flowgate_rlqs_reports_total` (bucket usage reports received),
//!   `flowgate_rlqs_reported_requests_total{decision}` (`allowed`, `denied`: what the Envoys
//!   report they decided);
//! * `flowgate_rlqs_responses_total` (messages sent), `flowgate_rlqs_assignments_total{action}`
//!   (`token_bucket`, `allow_all`, `deny_all`, `abandon`, `expire`: bucket actions in them);
//! * `flowgate_rlqs_joins_total{result}` (`divided`, `claimed`, `waiting`, `fallback`),
//!   `flowgate_rlqs_ledger_failures_total` (calls to the shared ledger that failed; the rule's
//!   `fail` mode applied);
//! * per rule (`domain`, `rule` labels, bounded by the configuration):
//!   `flowgate_rlqs_share_tokens` (tokens per period this instance's Envoys hold) and
//!   `flowgate_rlqs_members` (buckets of this instance's Envoys under the rule).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use serde::Serialize;

use super::RuleLabels;

/// A label naming one value of a small fixed set.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// Why.
    pub reason: &'static str,
}

/// The label of the reported-requests counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabel {
    /// `allowed` or `denied`.
    pub decision: &'static str,
}

/// The label of the assignments counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActionLabel {
    /// The bucket action.
    pub action: &'static str,
}

/// The label of the joins counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// How the first report was answered.
    pub result: &'static str,
}

/// The RLQS metrics. Cheap to clone (every handle shares the series).
#[derive(Debug, Clone, Default)]
pub struct RlqsMetrics {
    /// Streams open now.
    pub streams: Gauge,
    /// Streams accepted.
    pub streams_opened: Counter,
    /// Streams refused at once, by reason.
    pub streams_refused: Family<ReasonLabel, Counter>,
    /// Streams ended with an error status, by reason.
    pub stream_errors: Family<ReasonLabel, Counter>,
    /// Buckets tracked now.
    pub buckets: Gauge,
    /// Bucket usage reports received.
    pub reports: Counter,
    /// Requests the Envoys reported, by their decision.
    pub reported_requests: Family<DecisionLabel, Counter>,
    /// Response messages sent.
    pub responses: Counter,
    /// Bucket actions sent, by action.
    pub assignments: Family<ActionLabel, Counter>,
    /// First reports, by how they were answered.
    pub joins: Family<ResultLabel, Counter>,
    /// Ledger calls that failed.
    pub ledger_failures: Counter,
    /// Tokens per period held by this instance's Envoys, per rule.
    pub share_tokens: Family<RuleLabels, Gauge>,
    /// This instance's buckets under each rule.
    pub members: Family<RuleLabels, Gauge>,
    /// Where the dashboard's view comes from, once the service runs.
    source: Source,
}

/// A function answering the RLQS service's [`Snapshot`](Snapshot).
type SnapshotFn = Box<dyn Fn() -> Snapshot + Send + Sync>;

/// What the dashboard shows of the RLQS service.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Snapshot {
    /// Streams open now.
    pub streams: usize,
    /// Buckets tracked now.
    pub buckets: usize,
    /// Per rule with buckets here.
    pub rules: Vec<RuleShares>,
}

/// One rule's buckets on this instance and the shares they hold.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct RuleShares {
    /// The rule's domain.
    pub domain: String,
    /// The rule's path.
    pub rule: String,
    /// Its limit per period.
    pub limit: u64,
    /// Its period in ms.
    pub period_ms: u64,
    /// Rule instances (one per descriptor value) with buckets here.
    pub instances: usize,
    /// Buckets here.
    pub members: usize,
    /// Tokens per period they hold.
    pub tokens: u64,
}

/// Reads the running RLQS service's state.
#[derive(Clone, Default)]
struct Source(std::sync::Arc<parking_lot::Mutex<Option<SnapshotFn>>>);

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Source")
    }
}

impl RlqsMetrics {
    /// Creates the metrics and registers them in `registry` (prefixed `rlqs_`).
    pub fn register(registry: &mut Registry) -> Self {
        let m = RlqsMetrics::default();
        let r = registry.sub_registry_with_prefix("rlqs");
        r.register("streams", "RLQS streams open now", m.streams.clone());
        r.register(
            "streams_opened",
            "RLQS streams accepted",
            m.streams_opened.clone(),
        );
        r.register(
            "streams_refused",
            "RLQS streams refused at once (capacity: --rlqs-max-streams open; draining)",
            m.streams_refused.clone(),
        );
        r.register(
            "stream_errors",
            "RLQS streams ended with an error status, by reason",
            m.stream_errors.clone(),
        );
        r.register(
            "buckets",
            "RLQS buckets tracked now, over all streams",
            m.buckets.clone(),
        );
        r.register(
            "reports",
            "RLQS bucket usage reports received",
            m.reports.clone(),
        );
        r.register(
            "reported_requests",
            "Requests the Envoys reported having allowed or denied",
            m.reported_requests.clone(),
        );
        r.register(
            "responses",
            "RLQS response messages sent",
            m.responses.clone(),
        );
        r.register(
            "assignments",
            "RLQS bucket actions sent, by action",
            m.assignments.clone(),
        );
        r.register(
            "joins",
            "First reports of a bucket, by how they were answered",
            m.joins.clone(),
        );
        r.register(
            "ledger_failures",
            "Calls to the shared ledger that failed (the rule's fail mode applied)",
            m.ledger_failures.clone(),
        );
        r.register(
            "share_tokens",
            "Tokens per period that this instance's Envoys hold, per rule",
            m.share_tokens.clone(),
        );
        r.register(
            "members",
            "This instance's RLQS buckets under each rule",
            m.members.clone(),
        );
        m
    }

    /// Makes [`RlqsMetrics::snapshot`] answer what `view` answers.
    pub fn watch(&self, view: impl Fn() -> Snapshot + Send + Sync + 'static) {
        *self.source.0.lock() = Some(Box::new(view));
    }

    /// The RLQS service's streams, buckets and shares now (empty when it does not run).
    pub fn snapshot(&self) -> Snapshot {
        self.source
            .0
            .lock()
            .as_ref()
            .map(|f| f())
            .unwrap_or_default()
    }

    /// Counts a bucket action.
    pub fn assignment(&self, action: &'static str) {
        self.assignments
            .get_or_create(&ActionLabel { action })
            .inc();
    }

    /// Counts a stream ended with an error.
    pub fn stream_error(&self, reason: &'static str) {
        self.stream_errors
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    /// Counts a refused stream.
    pub fn refused(&self, reason: &'static str) {
        self.streams_refused
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    /// Counts a first report's answer.
    pub fn join(&self, result: &'static str) {
        self.joins.get_or_create(&ResultLabel { result }).inc();
    }
}
