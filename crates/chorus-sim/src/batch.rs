//! Running many seeds on a few threads, for every kind of simulation.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// What every seed's report has.
pub trait Seeded: Send {
    /// The seed the report is of.
    fn seed(&self) -> u64;
}

impl Seeded for crate::run::SeedReport {
    fn seed(&self) -> u64 {
        self.seed
    }
}

impl Seeded for crate::ooo::OooReport {
    fn seed(&self) -> u64 {
        self.seed
    }
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
