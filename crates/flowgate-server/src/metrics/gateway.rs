//! The HTTP gateway: `flowgate_gateway_responses_total{outcome}` and its pool of upstream
//! connections (`flowgate_gateway_upstream_connects_total`, which with keep-alive working stays
//! far below the forwarded responses, `flowgate_gateway_upstream_idle_connections`, …), and
//! the usage reports it could not read (`flowgate_gateway_usage_unread_total{reason}`; the
//! units it charged are counted per rule, `flowgate_charged_units_total`), and its in-flight
//! leases (`flowgate_gateway_in_flight_leases`, held now by this instance;
//! `flowgate_gateway_leases_lost_total`, expired while their request was still in flight).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// What the gateway answered a request with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GatewayOutcome {
    /// Passed to the upstream; its response went back.
    Forwarded = 0,
    /// 429: over a limit.
    Limited = 1,
    /// 400 (or 401): the request could not be keyed or was malformed.
    Rejected = 2,
    /// 503: the store failed and the limit fails closed.
    Unavailable = 3,
    /// 502: the upstream could not be reached or answered badly.
    BadGateway = 4,
    /// 504: the upstream did not answer in time.
    GatewayTimeout = 5,
    /// 429: an in-flight limit (`in_flight`) had every slot held.
    InFlightLimited = 6,
}

impl GatewayOutcome {
    /// Every outcome's label value, by discriminant.
    const LABELS: [&'static str; 7] = [
        "forwarded",
        "limited",
        "rejected",
        "unavailable",
        "bad_gateway",
        "gateway_timeout",
        "in_flight_limited",
    ];
}

/// Why the gateway could not read the usage a response reports (`usage_header`,
/// `usage_json`); nothing is charged for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsageUnread {
    /// A successful response that did not report it (no such header or field).
    Missing = 0,
    /// Reported, but not a whole number of at most 32 bits (or the JSON did not parse).
    Invalid = 1,
    /// The JSON body, or the event that would have held it, went past the scanner's bound.
    TooLarge = 2,
    /// The body broke off (the upstream failed or the client went away) before it was read.
    CutShort = 3,
    /// A body the scanner cannot read: compressed, or neither JSON nor server-sent events.
    Unsupported = 4,
}

impl UsageUnread {
    /// Every reason's label value, by discriminant.
    const LABELS: [&'static str; 5] = [
        "missing",
        "invalid",
        "too_large",
        "cut_short",
        "unsupported",
    ];

    /// The reason's label value.
    pub fn label(self) -> &'static str {
        Self::LABELS[self as usize]
    }
}

/// Label of the unread-usage counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// Why the usage was not read.
    pub reason: &'static str,
}

/// Label of the gateway's response counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// What the gateway answered.
    pub outcome: &'static str,
}

/// What the gateway's pool of upstream connections reports.
#[derive(Debug, Clone, Default)]
pub struct UpstreamMetrics {
    /// Connections opened (attempts that got a TCP connection).
    pub connects: Counter,
    /// Connections idle in the pool now.
    pub idle: Gauge,
    /// Connections open now, busy and idle.
    pub open: Gauge,
    /// Requests that found every connection busy and had to wait.
    pub queued: Counter,
    /// Requests refused (503) because every connection stayed busy for the queue timeout.
    pub busy: Counter,
    /// Request bodies (client uploads) given up after the body idle timeout.
    pub request_body_timeouts: Counter,
    /// Response bodies (from the upstream) given up after the body idle timeout.
    pub response_body_timeouts: Counter,
}

/// The gateway's responses and pool.
#[derive(Debug)]
pub(super) struct GatewayMetrics {
    /// Responses by outcome, resolved once (by [`GatewayOutcome`]).
    responses: [Counter; 7],
    /// In-flight leases held now for requests in flight.
    leases_held: Gauge,
    /// Leases that expired while their request was in flight (a renewal found them gone).
    leases_lost: Counter,
    /// Usage reports not read, by reason (by [`UsageUnread`]).
    usage_unread: [Counter; 5],
    /// The pool of upstream connections.
    upstream: UpstreamMetrics,
}

impl GatewayMetrics {
    /// Registers the gateway's metrics in `registry`.
    pub(super) fn register(registry: &mut Registry) -> Self {
        let outcomes = Family::<OutcomeLabel, Counter>::default();
        registry.register(
            "gateway_responses",
            "Responses of the reverse proxy, by outcome",
            outcomes.clone(),
        );
        let responses = GatewayOutcome::LABELS
            .map(|outcome| outcomes.get_or_create_owned(&OutcomeLabel { outcome }));
        let unread = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "gateway_usage_unread",
            "Responses whose reported usage (usage_header, usage_json) could not be read and was not charged, by reason",
            unread.clone(),
        );
        let usage_unread =
            UsageUnread::LABELS.map(|reason| unread.get_or_create_owned(&ReasonLabel { reason }));
        let upstream = UpstreamMetrics::default();
        registry.register(
            "gateway_upstream_connects",
            "Connections the gateway opened to its upstream",
            upstream.connects.clone(),
        );
        registry.register(
            "gateway_upstream_idle_connections",
            "Keep-alive connections to the upstream idle in the gateway's pool",
            upstream.idle.clone(),
        );
        registry.register(
            "gateway_upstream_connections",
            "Connections to the upstream open now, busy and idle (at most upstream_max_connections)",
            upstream.open.clone(),
        );
        registry.register(
            "gateway_upstream_queued",
            "Requests that found every upstream connection busy and waited for one",
            upstream.queued.clone(),
        );
        registry.register(
            "gateway_upstream_busy",
            "Requests answered 503 because every upstream connection stayed busy for upstream_queue_timeout",
            upstream.busy.clone(),
        );
        registry.register(
            "gateway_request_body_timeouts",
            "Client request bodies given up after body_idle_timeout without data",
            upstream.request_body_timeouts.clone(),
        );
        registry.register(
            "gateway_response_body_timeouts",
            "Upstream response bodies given up after body_idle_timeout without data",
            upstream.response_body_timeouts.clone(),
        );
        let leases_held = Gauge::default();
        registry.register(
            "gateway_in_flight_leases",
            "In-flight leases (gateway.in_flight) this instance holds now for requests in flight",
            leases_held.clone(),
        );
        let leases_lost = Counter::default();
        registry.register(
            "gateway_leases_lost",
            "In-flight leases that expired before their request ended (a renewal found them gone)",
            leases_lost.clone(),
        );
        GatewayMetrics {
            responses,
            usage_unread,
            upstream,
            leases_held,
            leases_lost,
        }
    }

    /// Counts a lease taken (held until [`lease_ended`](Self::lease_ended)).
    pub(super) fn lease_taken(&self) {
        self.leases_held.inc();
    }

    /// Counts a lease no longer held.
    pub(super) fn lease_ended(&self) {
        self.leases_held.dec();
    }

    /// Counts a lease that expired while its request was in flight.
    pub(super) fn lease_lost(&self) {
        self.leases_lost.inc();
    }

    /// Counts a usage report that could not be read.
    pub(super) fn usage_unread(&self, reason: UsageUnread) {
        self.usage_unread[reason as usize].inc();
    }

    /// Counts one response.
    pub(super) fn response(&self, outcome: GatewayOutcome) {
        self.responses[outcome as usize].inc();
    }

    /// The pool's metrics, for it to update.
    pub(super) fn upstream(&self) -> UpstreamMetrics {
        self.upstream.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::super::Metrics;
    use super::super::tests::sample;
    use super::*;

    #[test]
    fn every_outcome_has_its_series_and_the_pool_updates_its_own() {
        let metrics = Metrics::new();
        metrics.gateway_response(GatewayOutcome::Forwarded);
        metrics.gateway_response(GatewayOutcome::Forwarded);
        metrics.gateway_response(GatewayOutcome::GatewayTimeout);
        let pool = metrics.upstream();
        pool.connects.inc();
        pool.idle.set(3);
        pool.busy.inc();
        metrics.usage_unread(UsageUnread::Invalid);
        let text = metrics.encode();
        let outcome = |o: &str| {
            sample(
                &text,
                &format!(r#"flowgate_gateway_responses_total{{outcome="{o}"}}"#),
            )
        };
        assert_eq!(outcome("forwarded"), Some(2.0));
        assert_eq!(outcome("gateway_timeout"), Some(1.0));
        for zero in ["limited", "rejected", "unavailable", "bad_gateway"] {
            assert_eq!(outcome(zero), Some(0.0), "{zero}");
        }
        assert_eq!(
            sample(&text, "flowgate_gateway_upstream_connects_total"),
            Some(1.0)
        );
        assert_eq!(
            sample(&text, "flowgate_gateway_upstream_idle_connections"),
            Some(3.0)
        );
        assert_eq!(
            sample(&text, "flowgate_gateway_upstream_busy_total"),
            Some(1.0)
        );
        assert_eq!(
            sample(&text, "flowgate_gateway_request_body_timeouts_total"),
            Some(0.0)
        );
        let unread = |r: &str| {
            sample(
                &text,
                &format!(r#"flowgate_gateway_usage_unread_total{{reason="{r}"}}"#),
            )
        };
        assert_eq!(unread("invalid"), Some(1.0));
        for zero in ["missing", "too_large", "cut_short", "unsupported"] {
            assert_eq!(unread(zero), Some(0.0), "{zero}");
        }
    }
}
