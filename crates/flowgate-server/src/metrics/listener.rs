//! Every client-facing listener (see [`crate::listen`]), labelled `listener` = http, grpc,
//! gateway, websocket: `flowgate_listener_connections`,
//! `flowgate_listener_refused_connections_total`, `flowgate_listener_timeouts_total`,
//! `flowgate_listener_oversized_heads_total` and `flowgate_listener_tls_handshake_failures_total`;
//! and `flowgate_http_oversized_bodies_total` (HTTP API requests refused with 413).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Label of the listener metrics.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerLabel {
    /// `http`, `grpc`, `gateway` or `websocket`.
    pub listener: &'static str,
}

/// What a listener reports.
#[derive(Debug, Clone, Default)]
pub struct ListenerMetrics {
    /// Connections open now.
    pub open: Gauge,
    /// Connections closed at once because the listener was full.
    pub refused: Counter,
    /// Connections closed because the request head was late.
    pub timeouts: Counter,
    /// Request heads over the size limit.
    pub oversized: Counter,
    /// TLS handshakes that failed or timed out.
    pub tls_failures: Counter,
}

/// The listeners' families and the HTTP API's body bound.
#[derive(Debug)]
pub(super) struct ListenerFamilies {
    /// Open connections per listener.
    open: Family<ListenerLabel, Gauge>,
    /// Connections refused per listener.
    refused: Family<ListenerLabel, Counter>,
    /// Request heads that came too late, per listener.
    timeouts: Family<ListenerLabel, Counter>,
    /// Request heads that were too large, per listener.
    oversized: Family<ListenerLabel, Counter>,
    /// TLS handshakes that failed or timed out, per listener.
    tls_failures: Family<ListenerLabel, Counter>,
    /// HTTP API request bodies over the limit.
    http_oversized_bodies: Counter,
}

impl ListenerFamilies {
    /// Registers the listener metrics in `registry`.
    pub(super) fn register(registry: &mut Registry) -> Self {
        let open = Family::<ListenerLabel, Gauge>::default();
        registry.register(
            "listener_connections",
            "Client connections open now, per listener",
            open.clone(),
        );
        let refused = Family::<ListenerLabel, Counter>::default();
        registry.register(
            "listener_refused_connections",
            "Client connections closed as soon as accepted because the listener was full",
            refused.clone(),
        );
        let timeouts = Family::<ListenerLabel, Counter>::default();
        registry.register(
            "listener_timeouts",
            "Client connections closed because a request head did not arrive in time",
            timeouts.clone(),
        );
        let oversized = Family::<ListenerLabel, Counter>::default();
        registry.register(
            "listener_oversized_heads",
            "Request heads over the size limit (answered 431), per listener",
            oversized.clone(),
        );
        let tls_failures = Family::<ListenerLabel, Counter>::default();
        registry.register(
            "listener_tls_handshake_failures",
            "TLS handshakes that failed or did not finish within the header read timeout, per listener",
            tls_failures.clone(),
        );
        let http_oversized_bodies = Counter::default();
        registry.register(
            "http_oversized_bodies",
            "HTTP API requests refused (413) because their body was over --max-body-bytes",
            http_oversized_bodies.clone(),
        );
        ListenerFamilies {
            open,
            refused,
            timeouts,
            oversized,
            tls_failures,
            http_oversized_bodies,
        }
    }

    /// The metrics of the listener named `listener`.
    pub(super) fn listener(&self, listener: &'static str) -> ListenerMetrics {
        let label = ListenerLabel { listener };
        ListenerMetrics {
            open: self.open.get_or_create_owned(&label),
            refused: self.refused.get_or_create_owned(&label),
            timeouts: self.timeouts.get_or_create_owned(&label),
            oversized: self.oversized.get_or_create_owned(&label),
            tls_failures: self.tls_failures.get_or_create_owned(&label),
        }
    }

    /// Counts an HTTP API request refused for its body's size.
    pub(super) fn oversized_body(&self) {
        self.http_oversized_bodies.inc();
    }
}

#[cfg(test)]
mod tests {
    use super::super::Metrics;
    use super::super::tests::sample;

    #[test]
    fn each_listener_gets_its_own_series() {
        let metrics = Metrics::new();
        let http = metrics.listener("http");
        let gateway = metrics.listener("gateway");
        http.open.inc();
        http.open.inc();
        http.refused.inc();
        gateway.timeouts.inc();
        gateway.tls_failures.inc();
        gateway.oversized.inc();
        metrics.oversized_body();
        let text = metrics.encode();
        let series = |name: &str, listener: &str| {
            sample(
                &text,
                &format!(r#"flowgate_{name}{{listener="{listener}"}}"#),
            )
        };
        assert_eq!(series("listener_connections", "http"), Some(2.0));
        assert_eq!(
            series("listener_refused_connections_total", "http"),
            Some(1.0)
        );
        assert_eq!(series("listener_timeouts_total", "http"), Some(0.0));
        assert_eq!(series("listener_timeouts_total", "gateway"), Some(1.0));
        assert_eq!(
            series("listener_tls_handshake_failures_total", "gateway"),
            Some(1.0)
        );
        assert_eq!(
            series("listener_oversized_heads_total", "gateway"),
            Some(1.0)
        );
        assert_eq!(
            series("listener_connections", "grpc"),
            None,
            "not asked for"
        );
        assert_eq!(
            sample(&text, "flowgate_http_oversized_bodies_total"),
            Some(1.0)
        );
        // The same listener asked for twice shares its series.
        metrics.listener("http").open.dec();
        assert_eq!(
            sample(
                &metrics.encode(),
                r#"flowgate_listener_connections{listener="http"}"#
            ),
            Some(1.0)
        );
    }
}
