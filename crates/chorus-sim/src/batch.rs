//! Running many seeds on a few threads, for every kind of simulation.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// What every seed's report has.
pub trait Seeded: Send {
    /// The seed the report is of.
    fn seed(&self) -> u64;
    /// Invariant violations (empty when the seed ran clean).
    fn violations(&self) -> &[String];
    /// Counters.
    fn stats(&self) -> &BTreeMap<&'static str, u64>;
}

impl Seeded for crate::run::SeedReport {
    fn seed(&self) -> u64 {
        self.seed
    }
    fn violations(&self) -> &[String] {
        &self.violations
    }
    fn stats(&self) -> &BTreeMap<&'static str, u64> {
        &self.stats
    }
}

impl Seeded for crate::ooo::volume::VolumeReport {
    fn seed(&self) -> u64 {
        self.seed
    }
    fn violations(&self) -> &[String] {
        &self.violations
    }
    fn stats(&self) -> &BTreeMap<&'static str, u64> {
        &self.stats
    }
}

impl Seeded for crate::ooo::OooReport {
    fn seed(&self) -> u64 {
        self.seed
    }
    fn violations(&self) -> &[String] {
        &self.violations
    }
    fn stats(&self) -> &BTreeMap<&'static str, u64> {
        &self.stats
    }
}

/// What a batch found, for the command line: how many seeds failed and every counter
/// summed over the seeds.
pub struct Summary {
    /// Seeds with at least one violation.
    pub failed: usize,
    /// Every counter, summed.
    pub totals: BTreeMap<&'static str, u64>,
}

impl Summary {
    /// A counter's total (0 if no seed counted it).
    pub fn total(&self, k: &str) -> u64 {
        self.totals.get(k).copied().unwrap_or(0)
    }
}

/// Prints each seed's counters (when `verbose`: `line` says how) and each failed seed
/// with its violations and the command that replays it (`replay`), then returns the
/// summary.
pub fn report<R: Seeded>(
    reports: &[R],
    verbose: bool,
    line: impl Fn(&R) -> String,
    replay: impl Fn(u64) -> String,
) -> Summary {
    let mut s = Summary {
        failed: 0,
        totals: BTreeMap::new(),
    };
    for r in reports {
        for (k, v) in r.stats() {
            *s.totals.entry(*k).or_insert(0) += v;
        }
        if verbose {
            println!("{}", line(r));
        }
        if !r.violations().is_empty() {
            s.failed += 1;
            println!("seed {} FAILED:", r.seed());
            for v in r.violations() {
                println!("  {v}");
            }
            println!("  replay: {}", replay(r.seed()));
        }
    }
    s
}

/// Runs the seeds of `seeds` with `run` on `threads` threads and returns the reports in
/// seed order. A panic under some seed is a finding like any violation: `panicked` turns
/// its message into that seed's report instead of losing the batch. With a `deadline`, no
/// seed starts after it (those running finish), so the reports may cover fewer seeds.
pub fn run_seeds<R: Seeded>(
    seeds: Range<u64>,
    threads: usize,
    deadline: Option<Instant>,
    run: impl Fn(u64) -> R + Sync,
    panicked: impl Fn(u64, String) -> R + Sync,
) -> Vec<R> {
    let next = AtomicU64::new(seeds.start);
    let out = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| loop {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return;
                }
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed >= seeds.end {
                    return;
                }
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(seed)))
                    .unwrap_or_else(|p| {
                        let msg = p
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| p.downcast_ref::<String>().cloned())
                            .unwrap_or_else(|| "non-string panic payload".into());
                        panicked(seed, msg)
                    });
                out.lock().unwrap_or_else(|e| e.into_inner()).push(r);
            });
        }
    });
    let mut v = out.into_inner().unwrap_or_else(|e| e.into_inner());
    v.sort_by_key(|r| r.seed());
    v
}
