//! Metrics in the Prometheus text exposition format.
//!
//! The counters live where they are counted (atomics in each group and in the
//! transport); [`crate::Env::metrics`] gathers them, for groups of every mode, into one
//! [`Exposition`], to which its host (the server) adds what it alone knows. The histograms (the log's
//! fsync latency; an out-of-order node's, [`crate::ooo::OooLatency`]) use fixed
//! power-of-two buckets so recording is three relaxed atomic adds.

use std::collections::HashMap;
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

/// The type of a metric family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (restarts from 0 when its process or group restarts).
    Counter,
    /// Goes up and down.
    Gauge,
    /// A [`Histogram`].
    Histogram,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// One family: its header and its samples, in the order they were added.
struct Family {
    help: String,
    kind: Kind,
    body: String,
}

/// A Prometheus text exposition built family by family: every sample of a family is
/// written under the family's one `# HELP` and `# TYPE` header, whichever part of the node
/// added it (groups of every mode, the node itself, the server), and the families come
/// out in the order they were first named. A family named twice keeps its first help and
/// type.
///
/// Invariant: `order` holds each key of `families` exactly once.
#[derive(Default)]
pub struct Exposition {
    order: Vec<String>,
    families: HashMap<String, Family>,
}

impl Exposition {
    fn family(&mut self, name: &str, kind: Kind, help: &str) -> &mut String {
        if !self.families.contains_key(name) {
            self.order.push(name.to_string());
        }
        &mut self
            .families
            .entry(name.to_string())
            .or_insert_with(|| Family {
                help: help.to_string(),
                kind,
                body: String::new(),
            })
            .body
    }

    /// Declares family `name` without a sample (so that its header is written even when
    /// nothing reports it yet).
    pub fn declare(&mut self, name: &str, kind: Kind, help: &str) {
        self.family(name, kind, help);
    }

    /// Adds a sample `name{labels} value` to the counter or gauge family `name`.
    pub fn sample(&mut self, name: &str, kind: Kind, help: &str, labels: &str, value: u64) {
        let body = self.family(name, kind, help);
        let _ = writeln!(body, "{name}{{{labels}}} {value}");
    }

    /// Adds the series of histogram `h` with `labels` to the histogram family `name`.
    pub fn histogram(&mut self, name: &str, help: &str, labels: &str, h: &Histogram) {
        let body = self.family(name, Kind::Histogram, help);
        h.render_samples(body, name, labels);
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for name in &self.order {
            let f = &self.families[name];
            let _ = writeln!(out, "# HELP {name} {}", f.help);
            let _ = writeln!(out, "# TYPE {name} {}", f.kind.name());
            out.push_str(&f.body);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Samples added apart land under one header per family, families in first-named
    /// order; the first help and type stay.
    #[test]
    fn an_exposition_groups_samples_under_one_header() {
        let mut e = Exposition::default();
        e.sample("a_total", Kind::Counter, "A.", "mode=\"ordered\"", 1);
        e.sample("b", Kind::Gauge, "B.", "", 7);
        e.sample("a_total", Kind::Gauge, "other", "mode=\"parallel\"", 2);
        e.declare("c", Kind::Gauge, "C.");
        let h = Histogram::default();
        h.record(1_000);
        e.histogram("d_seconds", "D.", "g=\"1\"", &h);
        let s = e.render();
        let want = "# HELP a_total A.\n# TYPE a_total counter\na_total{mode=\"ordered\"} 1\na_total{mode=\"parallel\"} 2\n# HELP b B.\n# TYPE b gauge\nb{} 7\n# HELP c C.\n# TYPE c gauge\n# HELP d_seconds D.\n# TYPE d_seconds histogram\n";
        assert!(s.starts_with(want), "{s}");
        assert!(s.contains("d_seconds_count{g=\"1\"} 1"), "{s}");
        assert_eq!(s.matches("# TYPE a_total").count(), 1);
    }

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
