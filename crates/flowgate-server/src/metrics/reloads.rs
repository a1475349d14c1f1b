//! The configuration: `flowgate_config_reloads_total{result,source}` and
//! `flowgate_config_version`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Labels of the reload counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// `ok` or `failed`.
    pub result: &'static str,
    /// What changed: `files` (a reload of the configuration files) or `xds` (a version from
    /// the xDS management server).
    pub source: &'static str,
}

/// Reloads and the running version.
#[derive(Debug)]
pub(super) struct ReloadMetrics {
    /// Reloads by result.
    reloads: Family<ResultLabel, Counter>,
    /// The running configuration's version.
    version: Gauge,
}

impl ReloadMetrics {
    /// Registers the reload metrics in `registry`.
    pub(super) fn register(registry: &mut Registry) -> Self {
        let reloads = Family::<ResultLabel, Counter>::default();
        registry.register(
            "config_reloads",
            "Configuration reloads, by result (ok, failed) and source (files, xds)",
            reloads.clone(),
        );
        let version = Gauge::default();
        registry.register(
            "config_version",
            "Version of the running configuration (1 at start, +1 per reload)",
            version.clone(),
        );
        ReloadMetrics { reloads, version }
    }

    /// Counts a reload of `source` and, when it succeeded, the new version.
    pub(super) fn reloaded(&self, source: &'static str, ok: bool, version: u64) {
        let result = if ok { "ok" } else { "failed" };
        self.reloads
            .get_or_create(&ResultLabel { result, source })
            .inc();
        if ok {
            self.set_version(version);
        }
    }

    /// Sets the configuration version.
    pub(super) fn set_version(&self, version: u64) {
        self.version.set(i64::try_from(version).unwrap_or(i64::MAX));
    }
}

#[cfg(test)]
mod tests {
    use super::super::Metrics;
    use super::super::tests::sample;

    #[test]
    fn reloads_are_counted_by_result_and_only_a_good_one_moves_the_version() {
        let metrics = Metrics::new();
        metrics.set_version(1);
        metrics.reloaded("files", true, 2);
        metrics.reloaded("files", false, 0);
        metrics.reloaded("xds", false, 0);
        metrics.reloaded("xds", false, 0);
        let text = metrics.encode();
        assert_eq!(
            sample(
                &text,
                r#"flowgate_config_reloads_total{result="ok",source="files"}"#
            ),
            Some(1.0)
        );
        assert_eq!(
            sample(
                &text,
                r#"flowgate_config_reloads_total{result="failed",source="xds"}"#
            ),
            Some(2.0)
        );
        assert_eq!(sample(&text, "flowgate_config_version"), Some(2.0));
        metrics.set_version(u64::MAX);
        assert_eq!(
            sample(&metrics.encode(), "flowgate_config_version"),
            Some(i64::MAX as f64)
        );
    }
}
