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
    /// Queues `w` behind everything queued and wakes one waiting worker. A closed queue
    /// takes nothing: `w` is dropped at once (its owner is stopping), so nothing queued
    /// waits for ever on a queue no worker pops.
    pub fn push(&self, w: T) {
        let mut q = self.q.lock().expect("work queue");
        if q.1 {
            drop(q);
            drop(w);
            return;
        }
        q.0.push_back(w);
        drop(q);
        self.ready.notify_one();
    }

    /// The next item, waiting for one; `None` once the queue is closed (items still
    /// queued then were dropped by [`WorkQueue::close`]: the owner is stopping).
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

    /// Closes the queue and wakes every waiting worker; what was still queued is dropped
    /// (outside the lock: an item's drop may do work of its own).
    pub fn close(&self) {
        let left = {
            let mut q = self.q.lock().expect("work queue");
            q.1 = true;
            std::mem::take(&mut q.0)
        };
        self.ready.notify_all();
        drop(left);
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

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Counts its drops.
    struct Item(Arc<AtomicUsize>);

    impl Drop for Item {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Closing drops what was queued, and a push after the close drops its item at once:
    /// nothing is left holding what its owner waits for (a group waiting for its apply
    /// jobs to end).
    #[test]
    fn a_closed_queue_keeps_nothing() {
        let dropped = Arc::new(AtomicUsize::new(0));
        let q = WorkQueue::default();
        q.push(Item(dropped.clone()));
        q.push(Item(dropped.clone()));
        assert_eq!(dropped.load(Ordering::SeqCst), 0);
        q.close();
        assert_eq!(
            dropped.load(Ordering::SeqCst),
            2,
            "queued items dropped at close"
        );
        q.push(Item(dropped.clone()));
        assert_eq!(dropped.load(Ordering::SeqCst), 3, "a late push is dropped");
        assert!(q.try_pop().is_none() && q.pop().is_none());
    }
}
