//! The WebSocket gateway, read from its limiters at each scrape (summed over the running one
//! and those a reload replaced while their connections live on):
//! `flowgate_ws_decisions_total{direction,scope,outcome}` (per layer: allowed, rejected,
//! dry_run, released), `flowgate_ws_refused_upgrades_total{scope}`,
//! `flowgate_ws_closes_total{code}` (close frames the gateway sent, by code),
//! `flowgate_ws_message_size_bytes{direction}` (a histogram), `flowgate_ws_connections`
//! (open now), `flowgate_ws_connections_opened_total`, `flowgate_ws_penalty_bans_total`,
//! `flowgate_ws_penalized_clients`, `flowgate_ws_tracked{what}`, `flowgate_ws_relays`,
//! `flowgate_ws_slow_reader_total{direction,action}` (paused, dropped, closed) and
//! `flowgate_ws_upstream_failures_total{reason}` (connect, refused, timeout). Every label has
//! a fixed set of values (close codes: those the gateway sends).

use std::sync::Arc;

use flowgate::ws::WsStatsSnapshot;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// The WebSocket counters, summed over the running limiters and the ones a reload replaced
/// (which live on while their connections do).
#[derive(Debug, Clone, Default)]
pub struct WsTotals {
    /// Client → upstream (and the upgrade).
    pub inbound: WsStatsSnapshot,
    /// Upstream → client.
    pub outbound: WsStatsSnapshot,
    /// Clients the penalty box remembers now.
    pub penalized: u64,
    /// `[paused, dropped, closed]` by direction (`0` client → upstream, `1` upstream → client).
    pub slow: [[u64; 3]; 2],
    /// `[connect, refused, timeout]` failures of upgrades to the upstream.
    pub upstream_failures: [u64; 3],
    /// Connections relayed now.
    pub relays: u64,
    /// `(sessions, IPs, users)` the limiters hold now.
    pub tracked: (usize, usize, usize),
}

/// A function returning the WebSocket gateway's counters.
type TotalsFn = Box<dyn Fn() -> WsTotals + Send + Sync>;

/// Where the WebSocket gateway's counters are read from, once it runs.
#[derive(Clone, Default)]
pub(super) struct WsSource(Arc<parking_lot::Mutex<Option<TotalsFn>>>);

impl std::fmt::Debug for WsSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WsSource")
    }
}

impl WsSource {
    /// Reads `totals` from now on.
    pub(super) fn set(&self, totals: impl Fn() -> WsTotals + Send + Sync + 'static) {
        *self.0.lock() = Some(Box::new(totals));
    }

    /// The counters now, once a gateway runs.
    pub(super) fn read(&self) -> Option<WsTotals> {
        self.0.lock().as_ref().map(|read| read())
    }
}

/// Reads the WebSocket gateway's [`WsTotals`] at each scrape.
#[derive(Debug)]
pub(super) struct WsCollector(pub(super) WsSource);

/// The direction label's values, by index.
const DIRECTIONS: [&str; 2] = ["inbound", "outbound"];

impl Collector for WsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let Some(totals) = self.0.read() else {
            return Ok(());
        };
        let sides = [&totals.inbound, &totals.outbound];
        let mut family = encoder.encode_descriptor(
            "ws_decisions",
            "WebSocket message decisions, by direction, layer and outcome",
            None,
            MetricType::Counter,
        )?;
        for (direction, stats) in DIRECTIONS.iter().zip(sides) {
            for (scope, outcome, n) in &stats.decisions {
                let labels = [
                    ("direction", *direction),
                    ("scope", scope.name()),
                    ("outcome", outcome.name()),
                ];
                ConstCounter::new(*n).encode(family.encode_family(&labels)?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "ws_refused_upgrades",
            "WebSocket upgrades refused with 429, by the cap or rate that refused",
            None,
            MetricType::Counter,
        )?;
        for (scope, n) in &totals.inbound.refused {
            ConstCounter::new(*n).encode(family.encode_family(&[("scope", scope.name())])?)?;
        }
        let mut family = encoder.encode_descriptor(
            "ws_closes",
            "Close frames the WebSocket gateway sent, by code",
            None,
            MetricType::Counter,
        )?;
        let mut closes: Vec<(u16, u64)> = totals.inbound.closes.clone();
        for (code, n) in &totals.outbound.closes {
            match closes.iter_mut().find(|(c, _)| c == code) {
                Some((_, m)) => *m += n,
                None => closes.push((*code, *n)),
            }
        }
        closes.sort_unstable();
        for (code, n) in closes {
            let code = code.to_string();
            ConstCounter::new(n).encode(family.encode_family(&[("code", code.as_str())])?)?;
        }
        let mut family = encoder.encode_descriptor(
            "ws_message_size_bytes",
            "Sizes of the WebSocket messages judged, by direction",
            None,
            MetricType::Histogram,
        )?;
        for (direction, stats) in DIRECTIONS.iter().zip(sides) {
            if stats.size_buckets.is_empty() {
                continue;
            }
            let buckets: Vec<(f64, u64)> = flowgate::ws::SIZE_BUCKETS
                .iter()
                .map(|b| *b as f64)
                .chain([f64::INFINITY])
                .zip(stats.size_buckets.iter().copied())
                .collect();
            let count = stats.size_buckets.iter().sum();
            family
                .encode_family(&[("direction", *direction)])?
                .encode_histogram::<Vec<(String, String)>>(
                    stats.size_sum as f64,
                    count,
                    &buckets,
                    None,
                )?;
        }
        let gauges = [
            (
                "ws_connections",
                "WebSocket connections open now (admitted, not yet closed)",
                totals.inbound.live,
            ),
            (
                "ws_penalized_clients",
                "Clients the WebSocket penalty box remembers now",
                totals.penalized,
            ),
        ];
        for (name, help, value) in gauges {
            let gauge = ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        let mut family = encoder.encode_descriptor(
            "ws_tracked",
            "What the WebSocket limiters hold now: sessions, and IPs and users with open connections (all 0 when no connection is open)",
            None,
            MetricType::Gauge,
        )?;
        let (sessions, ips, users) = totals.tracked;
        for (what, n) in [("sessions", sessions), ("ips", ips), ("users", users)] {
            ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX))
                .encode(family.encode_family(&[("what", what)])?)?;
        }
        let relays = ConstGauge::new(i64::try_from(totals.relays).unwrap_or(i64::MAX));
        relays.encode(encoder.encode_descriptor(
            "ws_relays",
            "WebSocket connections being relayed now",
            None,
            relays.metric_type(),
        )?)?;
        let counters = [
            (
                "ws_connections_opened",
                "WebSocket connections admitted",
                totals.inbound.opened,
            ),
            (
                "ws_penalty_bans",
                "Bans the WebSocket penalty box handed out",
                totals.inbound.banned,
            ),
        ];
        for (name, help, value) in counters {
            let counter = ConstCounter::new(value);
            counter.encode(encoder.encode_descriptor(
                name,
                help,
                None,
                counter.metric_type(),
            )?)?;
        }
        let mut family = encoder.encode_descriptor(
            "ws_slow_reader",
            "Messages a slow reader's full buffer paused, dropped or closed, by the direction of the messages",
            None,
            MetricType::Counter,
        )?;
        for (direction, counts) in DIRECTIONS.iter().zip(totals.slow) {
            for (action, n) in ["paused", "dropped", "closed"].iter().zip(counts) {
                let labels = [("direction", *direction), ("action", *action)];
                ConstCounter::new(n).encode(family.encode_family(&labels)?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "ws_upstream_failures",
            "WebSocket upgrades that did not reach the upstream, by reason",
            None,
            MetricType::Counter,
        )?;
        for (reason, n) in ["connect", "refused", "timeout"]
            .iter()
            .zip(totals.upstream_failures)
        {
            ConstCounter::new(n).encode(family.encode_family(&[("reason", *reason)])?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use flowgate::ws::{LayerDecision, Scope};

    use super::super::Metrics;
    use super::super::tests::sample;
    use super::*;

    fn totals() -> WsTotals {
        let mut inbound = WsStatsSnapshot::default();
        inbound.live = 2;
        inbound.opened = 5;
        inbound.banned = 1;
        inbound.decisions = vec![
            (Scope::Connection, LayerDecision::Allowed, 40),
            (Scope::Connect, LayerDecision::DryRun, 3),
        ];
        inbound.refused = vec![(Scope::ConcurrentIp, 4)];
        inbound.closes = vec![(1008, 2), (1009, 1)];
        // 64 B or less: 3; 256 B or less: 1; nothing larger.
        inbound.size_buckets = vec![3, 1, 0, 0, 0, 0, 0, 0, 0];
        inbound.size_sum = 300;
        let mut outbound = WsStatsSnapshot::default();
        outbound.decisions = vec![(Scope::Bytes, LayerDecision::Rejected, 6)];
        outbound.closes = vec![(1008, 1), (1013, 1)];
        WsTotals {
            inbound,
            outbound,
            penalized: 1,
            slow: [[1, 0, 0], [0, 2, 1]],
            upstream_failures: [0, 1, 2],
            relays: 2,
            tracked: (2, 1, 1),
        }
    }

    #[test]
    fn nothing_is_exported_until_a_gateway_runs_then_every_family_is() {
        let metrics = Metrics::new();
        assert!(!metrics.encode().contains("flowgate_ws_"));
        assert!(metrics.websocket_totals().is_none());
        metrics.watch_websocket(totals);
        assert_eq!(metrics.websocket_totals().map(|t| t.relays), Some(2));
        let text = metrics.encode();
        let value = |series: &str| sample(&text, series);
        assert_eq!(
            value(
                r#"flowgate_ws_decisions_total{direction="inbound",scope="connection",outcome="allowed"}"#
            ),
            Some(40.0)
        );
        assert_eq!(
            value(
                r#"flowgate_ws_decisions_total{direction="inbound",scope="connect",outcome="dry_run"}"#
            ),
            Some(3.0)
        );
        assert_eq!(
            value(
                r#"flowgate_ws_decisions_total{direction="outbound",scope="bytes",outcome="rejected"}"#
            ),
            Some(6.0)
        );
        assert_eq!(
            value(r#"flowgate_ws_refused_upgrades_total{scope="concurrent_ip"}"#),
            Some(4.0)
        );
        // Close codes of both directions are summed.
        assert_eq!(value(r#"flowgate_ws_closes_total{code="1008"}"#), Some(3.0));
        assert_eq!(value(r#"flowgate_ws_closes_total{code="1013"}"#), Some(1.0));
        assert_eq!(
            value(r#"flowgate_ws_message_size_bytes_bucket{le="256.0",direction="inbound"}"#),
            Some(4.0),
            "cumulative: {text}"
        );
        assert_eq!(
            value(r#"flowgate_ws_message_size_bytes_count{direction="inbound"}"#),
            Some(4.0)
        );
        assert!(
            !text.contains(r#"flowgate_ws_message_size_bytes_count{direction="outbound"}"#),
            "no sizes, no histogram"
        );
        assert_eq!(value("flowgate_ws_connections"), Some(2.0));
        assert_eq!(value("flowgate_ws_connections_opened_total"), Some(5.0));
        assert_eq!(value("flowgate_ws_penalty_bans_total"), Some(1.0));
        assert_eq!(value("flowgate_ws_penalized_clients"), Some(1.0));
        assert_eq!(value("flowgate_ws_relays"), Some(2.0));
        assert_eq!(value(r#"flowgate_ws_tracked{what="ips"}"#), Some(1.0));
        assert_eq!(
            value(r#"flowgate_ws_slow_reader_total{direction="outbound",action="dropped"}"#),
            Some(2.0)
        );
        assert_eq!(
            value(r#"flowgate_ws_upstream_failures_total{reason="timeout"}"#),
            Some(2.0)
        );
    }
}
