//! Metrics in the Prometheus text exposition format.
//!
//! The counters live where they are counted (atomics in each group and in the
//! transport); [`crate::Env::render_metrics`] writes them out. The histograms (the log's
//! fsync latency; an out-of-order node's, [`crate::ooo::OooLatency`]) use fixed
//! power-of-two buckets so recording is three relaxed atomic adds.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// Upper bounds of the buckets, in microseconds: 16 µs .. ~1 s.
const BOUNDS_US: [u64; 17] = [
    16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288,
    1048576,
];

/// A latency histogram with fixed buckets (cumulative when rendered).
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; 18],
    sum_ns: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    /// Records one observation in nanoseconds.
    pub fn record(&self, ns: u64) {
        let us = ns / 1000;
        let i = BOUNDS_US.partition_point(|b| *b < us);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// Number of observations.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Writes the histogram as `name` in seconds: its `# HELP` and `# TYPE` lines, then
    /// its samples.
    pub fn render(&self, out: &mut String, name: &str, help: &str, labels: &str) {
        render_header(out, name, help);
        self.render_samples(out, name, labels);
    }

    /// Writes the histogram's samples only (`_bucket`, `_sum`, `_count` with `labels`),
    /// for a family whose header [`render_header`] wrote once above several series.
    pub fn render_samples(&self, out: &mut String, name: &str, labels: &str) {
        let mut cum = 0;
        let sep = if labels.is_empty() { "" } else { "," };
        for (i, b) in BOUNDS_US.iter().enumerate() {
            cum += self.buckets[i].load(Ordering::Relaxed);
            let le = *b as f64 / 1e6;
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{le}\"}} {cum}");
        }
        cum += self.buckets[17].load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {cum}");
        let sum = self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum{{{labels}}} {sum}");
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", self.count());
    }

    /// The sum of the observations, in nanoseconds.
    pub fn sum_ns(&self) -> u64 {
        self.sum_ns.load(Ordering::Relaxed)
    }

    /// The mean observation in nanoseconds (0 with none).
    pub fn mean_ns(&self) -> u64 {
        self.sum_ns() / self.count().max(1)
    }
}

/// Writes the `# HELP` and `# TYPE` lines of histogram family `name`.
pub fn render_header(out: &mut String, name: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} histogram");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::default();
        h.record(10_000); // 10 µs
        h.record(3_000_000); // 3 ms
        h.record(5_000_000_000); // 5 s: beyond the last bound
        let mut s = String::new();
        h.render(&mut s, "x", "test", "");
        assert!(s.contains("x_bucket{le=\"0.000016\"} 1"), "{s}");
        assert!(s.contains("x_bucket{le=\"0.004096\"} 2"), "{s}");
        assert!(s.contains("x_bucket{le=\"1.048576\"} 2"), "{s}");
        assert!(s.contains("x_bucket{le=\"+Inf\"} 3"), "{s}");
        assert!(s.contains("x_count{} 3"), "{s}");
    }
}
