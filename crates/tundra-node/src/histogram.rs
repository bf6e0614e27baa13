//! Latency histograms: lock-free counters in exponential buckets, read for `tundra stats` and
//! encoded for Prometheus by prometheus-client.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use serde::Serialize;

/// Upper bounds of the buckets in microseconds: 1 µs to about 16 s, doubling; one more bucket
/// above.
const BOUNDS_US: [u64; 25] = {
    let mut bounds = [0u64; 25];
    let mut i = 0;
    while i < 25 {
        bounds[i] = 1 << i;
        i += 1;
    }
    bounds
};

#[derive(Debug, Default)]
struct Inner {
    buckets: [AtomicU64; BOUNDS_US.len() + 1],
    count: AtomicU64,
    sum_ns: AtomicU64,
}

/// A latency histogram; clones share their counts.
#[derive(Clone, Debug, Default)]
pub struct Histogram(Arc<Inner>);

/// What [`Histogram::summary`] reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct LatencySummary {
    pub count: u64,
    pub mean_us: f64,
    /// Upper bounds of the buckets holding the 50th and 99th percentile (µs).
    pub p50_us: f64,
    pub p99_us: f64,
}

impl Histogram {
    pub fn observe(&self, elapsed: Duration) {
        let us = elapsed.as_micros().min(u128::from(u64::MAX)) as u64;
        let bucket = BOUNDS_US.iter().position(|&b| us <= b).unwrap_or(BOUNDS_US.len());
        self.0.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        self.0.count.fetch_add(1, Ordering::Relaxed);
        self.0.sum_ns.fetch_add(elapsed.as_nanos().min(u128::from(u64::MAX)) as u64, Ordering::Relaxed);
    }

    fn counts(&self) -> Vec<u64> {
        self.0.buckets.iter().map(|b| b.load(Ordering::Relaxed)).collect()
    }

    pub fn summary(&self) -> LatencySummary {
        let counts = self.counts();
        let count: u64 = counts.iter().sum();
        if count == 0 {
            return LatencySummary::default();
        }
        let quantile = |q: f64| {
            let rank = ((count as f64) * q).ceil().max(1.0) as u64;
            let mut seen = 0;
            for (i, c) in counts.iter().enumerate() {
                seen += c;
                if seen >= rank {
                    return BOUNDS_US.get(i).map_or(f64::INFINITY, |&b| b as f64);
                }
            }
            f64::INFINITY
        };
        LatencySummary {
            count,
            mean_us: self.0.sum_ns.load(Ordering::Relaxed) as f64 / 1000.0 / count as f64,
            p50_us: quantile(0.50),
            p99_us: quantile(0.99),
        }
    }
}

impl EncodeMetric for Histogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let counts = self.counts();
        let buckets: Vec<(f64, u64)> = counts
            .iter()
            .enumerate()
            .map(|(i, &c)| (BOUNDS_US.get(i).map_or(f64::INFINITY, |&b| b as f64 / 1e6), c))
            .collect();
        let sum = self.0.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        encoder.encode_histogram::<NoLabelSet>(sum, counts.iter().sum(), &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_come_from_bucket_bounds() {
        let h = Histogram::default();
        assert_eq!(h.summary(), LatencySummary::default());
        for _ in 0..98 {
            h.observe(Duration::from_micros(10));
        }
        h.observe(Duration::from_micros(1000));
        h.observe(Duration::from_secs(100));
        let s = h.summary();
        assert_eq!((s.count, s.p50_us, s.p99_us), (100, 16.0, 1024.0));
        assert!((s.mean_us - (98.0 * 10.0 + 1000.0 + 100e6) / 100.0).abs() < 1e-6);
        let mut text = String::new();
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register("page_read_seconds", "page reads", h.clone());
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains("page_read_seconds_count 100"), "{text}");
        assert!(text.contains("page_read_seconds_bucket{le=\"+Inf\"} 100"), "{text}");
    }
}
