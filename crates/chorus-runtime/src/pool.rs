//! The bounded worker pool shared by every group of an environment.
//!
//! Groups are scheduled, not threads: a group with work is queued once (whatever number
//! of appends, messages or ticks arrived), a worker runs its driver until the replica has
//! nothing left to do, and the group goes back to idle. The hand-off between threads is
//! therefore per group and per batch, never per record (on this machine a cross-core
//! wake-up costs about 100 µs). A group is on at most one worker at a time.
//!
//! The per-group state machine is [`crate::sched::SchedState`].

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use crate::group::Group;

pub(crate) struct Pool {
    queue: Mutex<VecDeque<Arc<Group>>>,
    ready: Condvar,
    stop: AtomicBool,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Pool {
    pub fn new() -> Self {
        Self {
            queue: Mutex::new(VecDeque::new()),
            ready: Condvar::new(),
            stop: AtomicBool::new(false),
            threads: Mutex::new(Vec::new()),
        }
    }

    /// Starts `n` workers. `me` is the pool itself, shared with the workers.
    pub fn start(me: &Arc<crate::group::EnvShared>, n: usize) -> std::io::Result<()> {
        for i in 0..n {
            let env = me.clone();
            let h = std::thread::Builder::new()
                .name(format!("chorus-io-{i}"))
                .spawn(move || env.pool.work())?;
            me.pool.threads.lock().expect("threads").push(h);
        }
        Ok(())
    }

    pub fn schedule(&self, g: &Arc<Group>) {
        if g.sched.schedule() {
            self.queue.lock().expect("queue").push_back(g.clone());
            self.ready.notify_one();
        }
    }

    fn work(&self) {
        loop {
            let g = {
                let mut q = self.queue.lock().expect("queue");
                loop {
                    if self.stop.load(Ordering::SeqCst) {
                        return;
                    }
                    if let Some(g) = q.pop_front() {
                        break g;
                    }
                    q = self.ready.wait(q).expect("queue");
                }
            };
            loop {
                g.sched.begin();
                if !g.removed.load(Ordering::Relaxed) {
                    g.run();
                }
                if g.sched.finish() {
                    break;
                }
                // More work arrived while running: run again.
            }
        }
    }

    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.ready.notify_all();
        let threads: Vec<_> = self.threads.lock().expect("threads").drain(..).collect();
        for t in threads {
            let _ = t.join();
        }
        self.queue.lock().expect("queue").clear();
    }
}
