//! The out-of-order apply pool's two shared pieces, kept apart so that `loom` can check
//! them in every interleaving (`tests/loom.rs`, feature `loom`): the work queue the
//! driver and the workers share, and the countdown that lets exactly one worker — the one
//! that applies an entry's last piece — report the entry applied.
//!
//! Guarantees: every pushed item is popped once unless the queue is closed first; a
//! closed queue wakes every waiting worker and hands out nothing more; of the `n` calls
//! to [`Countdown::done`] exactly the last returns `true`, and that caller sees every
//! write the other `n - 1` made before their calls (release on each decrement, acquire
//! on the last), so "applied" is reported only after every piece's apply happened.

use std::collections::VecDeque;

#[cfg(feature = "loom")]
use loom::sync::atomic::{AtomicUsize, Ordering};
#[cfg(feature = "loom")]
use loom::sync::{Condvar, Mutex};
#[cfg(not(feature = "loom"))]
use std::sync::atomic::{AtomicUsize, Ordering};
#[cfg(not(feature = "loom"))]
use std::sync::{Condvar, Mutex};

/// A FIFO queue of work that workers wait on until it is closed.
#[derive(Debug)]
pub struct WorkQueue<T> {
    q: Mutex<(VecDeque<T>, bool)>,
    ready: Condvar,
}

impl<T> Default for WorkQueue<T> {
    fn default() -> Self {
        Self {
            q: Mutex::new((VecDeque::new(), false)),
            ready: Condvar::new(),
        }
    }
}

impl<T> WorkQueue<T> {
    /// Queues `w` behind everything queued and wakes one waiting worker.
    pub fn push(&self, w: T) {
        self.q.lock().expect("work queue").0.push_back(w);
        self.ready.notify_one();
    }

    /// The next item, waiting for one; `None` once the queue is closed (items still
    /// queued then are dropped: the owner is stopping).
    pub fn pop(&self) -> Option<T> {
        let mut q = self.q.lock().expect("work queue");
        loop {
            if q.1 {
                return None;
            }
            if let Some(w) = q.0.pop_front() {
                return Some(w);
            }
            q = self.ready.wait(q).expect("work queue");
        }
    }

    /// The next item if one is queued, without waiting (`None` when closed too).
    pub fn try_pop(&self) -> Option<T> {
        let mut q = self.q.lock().expect("work queue");
        if q.1 {
            return None;
        }
        q.0.pop_front()
    }

    /// Closes the queue and wakes every waiting worker.
    pub fn close(&self) {
        self.q.lock().expect("work queue").1 = true;
        self.ready.notify_all();
    }
}

/// Counts the pieces of one entry down to the last.
#[derive(Debug)]
pub struct Countdown(AtomicUsize);

impl Countdown {
    /// A countdown over `n` pieces (`n` ≥ 1).
    pub fn new(n: usize) -> Self {
        Self(AtomicUsize::new(n))
    }

    /// One piece is done; `true` for the last, whose caller then sees every other
    /// piece's writes.
    pub fn done(&self) -> bool {
        self.0.fetch_sub(1, Ordering::AcqRel) == 1
    }
}
