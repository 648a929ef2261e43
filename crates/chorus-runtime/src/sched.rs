//! The scheduling state of one group on the worker pool: the lock-free part of the
//! runtime, checked exhaustively with `loom` (`tests/loom.rs`, feature `loom`).
//!
//! States: `IDLE` → (schedule) `QUEUED` → (a worker takes it) `RUNNING` → `IDLE`.
//! Scheduling a `RUNNING` group marks it `DIRTY`; the worker then runs it again before
//! letting go. Guarantees: work announced before `schedule` is seen by a run that starts
//! after it (no lost wake-up), a group is queued at most once, and it never runs on two
//! workers at once. A worker may also hand a running group back to the queue
//! ([`SchedState::requeue`]) rather than run it again.

#[cfg(feature = "loom")]
use loom::sync::atomic::{AtomicU8, Ordering};
#[cfg(not(feature = "loom"))]
use std::sync::atomic::{AtomicU8, Ordering};

/// Idle ticks fall on multiples of this many nanoseconds of the environment's clock, so
/// that the groups at rest on a node are run together, a few wake-ups for all of them,
/// rather than each at its own instant with a thread wake-up of its own.
pub const TICK_QUANTUM: u64 = 5_000_000;

/// The first tick instant at or after `t` (a multiple of [`TICK_QUANTUM`]).
pub fn tick_instant(t: u64) -> u64 {
    t.div_ceil(TICK_QUANTUM).saturating_mul(TICK_QUANTUM)
}

const IDLE: u8 = 0;
const QUEUED: u8 = 1;
const RUNNING: u8 = 2;
const DIRTY: u8 = 3;

/// See the module docs.
#[derive(Debug)]
pub struct SchedState(AtomicU8);

impl Default for SchedState {
    fn default() -> Self {
        Self(AtomicU8::new(IDLE))
    }
}

impl SchedState {
    /// Announces work. Returns true when the caller must put the group on the run queue
    /// (it was idle); false when a queued or running instance will see the work.
    pub fn schedule(&self) -> bool {
        let mut s = self.0.load(Ordering::Acquire);
        loop {
            let next = match s {
                IDLE => QUEUED,
                RUNNING => DIRTY,
                _ => return false, // QUEUED or DIRTY: it will run.
            };
            match self
                .0
                .compare_exchange(s, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return next == QUEUED,
                Err(now) => s = now,
            }
        }
    }

    /// A worker took the group from the queue (or runs it again): it is running.
    pub fn begin(&self) {
        self.0.store(RUNNING, Ordering::Release);
    }

    /// A run ended. Returns true when the group is idle again; false when work arrived
    /// during the run and it must run again.
    pub fn finish(&self) -> bool {
        self.0
            .compare_exchange(RUNNING, IDLE, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// The worker running the group puts it back on the run queue instead of running it
    /// again or letting it go (a pass ended with the group still busy,
    /// `chorus_runtime::pass`). The caller pushes it on the queue after this call: a
    /// `schedule` from now on sees it queued, and one before it (which found it running
    /// and marked it dirty) is covered by the queued run. A swap, not a plain store:
    /// the loom model of a plain store here found an interleaving that left a group
    /// marked running with no worker (`tests/loom.rs`,
    /// `a_requeued_group_loses_no_work_and_is_queued_once`).
    pub fn requeue(&self) {
        self.0.swap(QUEUED, Ordering::AcqRel);
    }

    /// Whether a worker is running the group now.
    pub fn is_running(&self) -> bool {
        matches!(self.0.load(Ordering::Acquire), RUNNING | DIRTY)
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;

    #[test]
    fn tick_instants_are_the_next_multiple_of_the_quantum() {
        assert_eq!(tick_instant(0), 0);
        assert_eq!(tick_instant(1), TICK_QUANTUM);
        assert_eq!(tick_instant(TICK_QUANTUM), TICK_QUANTUM);
        assert_eq!(tick_instant(TICK_QUANTUM + 1), 2 * TICK_QUANTUM);
        // Saturates: never an instant before `t`.
        assert_eq!(tick_instant(u64::MAX), u64::MAX);
    }
}
