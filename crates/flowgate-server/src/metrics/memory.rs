//! The memory store, read at each scrape: `flowgate_memory_store_keys`,
//! `flowgate_memory_store_bytes` and `flowgate_memory_store_evicted_active_total` (counters
//! evicted while still active: more than `max_keys` per algorithm were active at once — each
//! is a limit silently reset; alert on any increase).

use flowgate::local::TableStats;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// Reads the memory store's [`TableStats`] at each scrape.
pub(super) struct MemoryCollector(pub(super) Box<dyn Fn() -> TableStats + Send + Sync>);

impl std::fmt::Debug for MemoryCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MemoryCollector")
    }
}

impl Collector for MemoryCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let stats = (self.0)();
        let gauges = [
            (
                "memory_store_keys",
                "Counters the in-memory store holds now",
                stats.keys,
            ),
            (
                "memory_store_bytes",
                "Bytes the in-memory store's tables have allocated",
                stats.bytes,
            ),
        ];
        for (name, help, value) in gauges {
            let gauge = ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
            let metric = encoder.encode_descriptor(name, help, None, gauge.metric_type())?;
            gauge.encode(metric)?;
        }
        let evicted = ConstCounter::new(stats.evicted_active);
        let metric = encoder.encode_descriptor(
            "memory_store_evicted_active",
            "Active counters dropped because more than max_keys were active at once (each a silent limit reset)",
            None,
            evicted.metric_type(),
        )?;
        evicted.encode(metric)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use flowgate::Quota;
    use flowgate::store::{Ask, MemoryStore, Store};

    use super::super::Metrics;
    use super::super::tests::sample;

    #[tokio::test]
    async fn the_memory_stores_size_is_read_at_each_scrape() {
        let store = Arc::new(MemoryStore::new());
        let mut metrics = Metrics::new();
        assert!(!metrics.encode().contains("memory_store"));
        let stats = store.clone();
        metrics.watch_memory(move || stats.stats());
        let text = metrics.encode();
        assert_eq!(sample(&text, "flowgate_memory_store_keys"), Some(0.0));
        assert_eq!(
            sample(&text, "flowgate_memory_store_evicted_active_total"),
            Some(0.0)
        );
        let quota = Quota::per_minute(10);
        for key in ["a", "b", "c"] {
            assert!(store.check(Ask::new(key, &quota)).await.unwrap().allowed);
        }
        let text = metrics.encode();
        assert_eq!(sample(&text, "flowgate_memory_store_keys"), Some(3.0));
        let bytes = sample(&text, "flowgate_memory_store_bytes").unwrap();
        assert!(bytes > 0.0, "{text}");
    }
}
