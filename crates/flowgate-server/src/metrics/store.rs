//! The store and its failure modes: `flowgate_store_errors_total{kind}` and
//! `flowgate_fallback_decisions_total{mode}` as decisions are recorded; and, with a shared
//! store (Redis), its fallback's counts read at each scrape: `flowgate_store_failed_calls_total`,
//! `flowgate_store_short_circuited_total`, `flowgate_store_breaker_opened_total` and
//! `flowgate_store_breaker_open`.

use flowgate::FailMode;
use flowgate::store::{FallbackStats, StoreError};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

/// Labels naming one value of a small fixed set.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    /// The value.
    pub kind: &'static str,
}

/// Label of the fallback counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModeLabel {
    /// `open`, `closed` or `local`.
    pub mode: &'static str,
}

/// Store errors and fallback decisions, counted as decisions are recorded.
#[derive(Debug)]
pub(super) struct StoreMetrics {
    /// Failed store calls, by kind.
    errors: Family<KindLabel, Counter>,
    /// Decisions taken by a failure mode, by mode.
    fallbacks: Family<ModeLabel, Counter>,
    /// The same decisions by mode (`[open, closed, local]`), for the dashboard to read
    /// without creating series.
    fallback_totals: [Counter; 3],
}

impl StoreMetrics {
    /// Registers the store metrics in `registry`.
    pub(super) fn register(registry: &mut Registry) -> Self {
        let errors = Family::<KindLabel, Counter>::default();
        registry.register(
            "store_errors",
            "Store calls that failed, by kind (timeout, unavailable, backend)",
            errors.clone(),
        );
        let fallbacks = Family::<ModeLabel, Counter>::default();
        registry.register(
            "fallback_decisions",
            "Decisions taken by a failure mode because the store could not be asked",
            fallbacks.clone(),
        );
        StoreMetrics {
            errors,
            fallbacks,
            fallback_totals: Default::default(),
        }
    }

    /// Counts a store call that failed with `error` (not a cost that can never fit).
    pub(super) fn error(&self, error: &StoreError) {
        let kind = match error {
            StoreError::Timeout(_) => "timeout",
            StoreError::Unavailable(_) => "unavailable",
            _ => "backend",
        };
        self.errors.get_or_create(&KindLabel { kind }).inc();
    }

    /// Counts a decision that a failure mode took because the store could not be asked.
    pub(super) fn fallback_decision(&self, mode: FailMode) {
        self.fallbacks
            .get_or_create(&ModeLabel { mode: mode.name() })
            .inc();
        let i = match mode {
            FailMode::Open => 0,
            FailMode::Closed => 1,
            FailMode::Local => 2,
            // A mode this build does not know of has no total of its own.
            _ => return,
        };
        self.fallback_totals[i].inc();
    }

    /// Decisions taken by a failure mode so far, as `(mode, count)` for open, closed, local.
    pub(super) fn fallback_totals(&self) -> [(&'static str, u64); 3] {
        let [open, closed, local] = &self.fallback_totals;
        [
            ("open", open.get()),
            ("closed", closed.get()),
            ("local", local.get()),
        ]
    }
}

/// Reads a shared store's [`FallbackStats`] at each scrape.
pub(super) struct FallbackCollector(pub(super) Box<dyn Fn() -> FallbackStats + Send + Sync>);

impl std::fmt::Debug for FallbackCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FallbackCollector")
    }
}

impl Collector for FallbackCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let stats = (self.0)();
        let counters = [
            (
                "store_failed_calls",
                "Calls to the shared store that failed transiently (their requests fell back)",
                stats.store_errors,
            ),
            (
                "store_short_circuited",
                "Requests decided by their fail mode without asking the store (breaker open)",
                stats.short_circuited,
            ),
            (
                "store_breaker_opened",
                "Times the shared store's circuit breaker opened",
                stats.breaker_opened,
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
        let open = ConstGauge::new(i64::from(stats.breaker_open));
        open.encode(encoder.encode_descriptor(
            "store_breaker_open",
            "1 while the shared store's circuit breaker is open",
            None,
            open.metric_type(),
        )?)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use flowgate::envoy::{DescriptorVerdict, Status};

    use super::super::Metrics;
    use super::super::tests::sample;
    use super::*;

    fn failed(error: StoreError) -> DescriptorVerdict<'static> {
        DescriptorVerdict {
            applied: None,
            status: Status::Counted(Err(error)),
            hits: 1,
            charge: false,
            enforced: true,
            others: Vec::new(),
        }
    }

    #[test]
    fn store_errors_are_counted_by_kind_and_capacity_is_not_an_error() {
        let metrics = Metrics::new();
        let errors = [
            StoreError::Timeout(Duration::from_millis(50)),
            StoreError::Timeout(Duration::from_millis(50)),
            StoreError::Unavailable("refused".into()),
            StoreError::Backend("NOSCRIPT".into()),
        ];
        for error in errors {
            metrics.record("api", &failed(error), &[], |_| String::new());
        }
        let capacity = flowgate::Quota::per_second(1).check_cost(2).unwrap_err();
        metrics.record("api", &failed(capacity.into()), &[], |_| String::new());
        let text = metrics.encode();
        let kind = |kind: &str| {
            sample(
                &text,
                &format!(r#"flowgate_store_errors_total{{kind="{kind}"}}"#),
            )
        };
        assert_eq!(kind("timeout"), Some(2.0));
        assert_eq!(kind("unavailable"), Some(1.0));
        assert_eq!(kind("backend"), Some(1.0), "{text}");
    }

    #[test]
    fn fallback_decisions_are_counted_by_mode_and_totalled_for_the_dashboard() {
        let metrics = Metrics::new();
        for mode in [FailMode::Open, FailMode::Local, FailMode::Local] {
            metrics.store.fallback_decision(mode);
        }
        let text = metrics.encode();
        assert_eq!(
            sample(&text, r#"flowgate_fallback_decisions_total{mode="local"}"#),
            Some(2.0)
        );
        assert_eq!(
            sample(&text, r#"flowgate_fallback_decisions_total{mode="open"}"#),
            Some(1.0)
        );
        assert_eq!(
            metrics.fallback_totals(),
            [("open", 1), ("closed", 0), ("local", 2)]
        );
    }

    #[test]
    fn a_shared_stores_fallback_is_read_at_each_scrape() {
        let mut metrics = Metrics::new();
        assert!(!metrics.encode().contains("flowgate_store_breaker_open"));
        let open = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let reading = open.clone();
        metrics.watch_fallback(move || FallbackStats {
            store_errors: 7,
            short_circuited: 40,
            breaker_opened: 2,
            breaker_open: reading.load(std::sync::atomic::Ordering::Relaxed),
            ..FallbackStats::default()
        });
        let text = metrics.encode();
        assert_eq!(
            sample(&text, "flowgate_store_failed_calls_total"),
            Some(7.0)
        );
        assert_eq!(
            sample(&text, "flowgate_store_short_circuited_total"),
            Some(40.0)
        );
        assert_eq!(
            sample(&text, "flowgate_store_breaker_opened_total"),
            Some(2.0)
        );
        assert_eq!(sample(&text, "flowgate_store_breaker_open"), Some(1.0));
        open.store(false, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(
            sample(&metrics.encode(), "flowgate_store_breaker_open"),
            Some(0.0)
        );
    }
}
