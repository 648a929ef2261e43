//! The bounded thread pools shared by every group of an environment.
//!
//! **IO workers** ([`Pool`]). Groups are scheduled, not threads: a task with work (an
//! ordered group's driver, an out-of-order group's driver or its store's IO) is queued
//! once, whatever number of appends, messages or ticks arrived; a worker runs it until it
//! has nothing left to do, and it goes back to idle. The hand-off between threads is
//! therefore per task and per batch, never per record (on this machine a cross-core
//! wake-up costs about 100 µs). A task is on at most one worker at a time. The workers
//! also run the fsyncs. No task waits on another task: a driver hands its writes to its
//! IO task and goes on; the IO task reports back as an event.
//!
//! **Apply workers** ([`ApplyPool`]). Out-of-order groups' state-machine work — applying
//! released entries (DP-Raft section 4.3: followers apply independent entries in
//! parallel), checkpoints, taking and installing images — runs as jobs on one set of
//! threads per environment, so that a slow state machine never holds an IO worker.
//!
//! The per-task scheduling state machine is [`crate::sched::SchedState`].

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use crate::applyq::WorkQueue;
use crate::sched::SchedState;

/// Work the IO workers run: scheduled at most once at a time ([`Task::sched`]).
pub(crate) trait Task: Send + Sync + 'static {
    /// The task's scheduling state.
    fn sched(&self) -> &SchedState;
    /// Whether the task is gone (a removed group): it is not run any more.
    fn removed(&self) -> bool;
    /// Runs the task until it has nothing left to do (or yields by scheduling itself).
    fn run(self: Arc<Self>);
}

pub(crate) struct Pool {
    queue: Mutex<VecDeque<Arc<dyn Task>>>,
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

    /// Announces work for `t`: queues it unless it is queued or running already (a
    /// running task runs again before it lets go).
    pub fn schedule<T: Task>(&self, t: &Arc<T>) {
        if t.sched().schedule() {
            let t: Arc<dyn Task> = t.clone();
            let mut q = self.queue.lock().expect("queue");
            let was_empty = q.is_empty();
            q.push_back(t);
            drop(q);
            // Into an empty queue: wake a worker. Behind other work: a worker is already
            // awake for the queue, and each worker that takes a task while more wait
            // wakes the next (below), so a burst of N tasks (the groups at rest ticking
            // together) costs at most one wake-up per worker, not N.
            if was_empty {
                self.ready.notify_one();
            }
        }
    }

    fn work(&self) {
        loop {
            let t = {
                let mut q = self.queue.lock().expect("queue");
                loop {
                    if self.stop.load(Ordering::SeqCst) {
                        return;
                    }
                    if let Some(t) = q.pop_front() {
                        if !q.is_empty() {
                            self.ready.notify_one();
                        }
                        break t;
                    }
                    q = self.ready.wait(q).expect("queue");
                }
            };
            loop {
                t.sched().begin();
                if !t.removed() {
                    // A panic (a bug, or a state machine's own) ends the task's run, not
                    // the worker every other group shares.
                    let run = std::panic::AssertUnwindSafe(|| t.clone().run());
                    if std::panic::catch_unwind(run).is_err() {
                        tracing::error!("a task panicked on an IO worker; the worker goes on");
                    }
                }
                if t.sched().finish() {
                    break;
                }
                // More work arrived while running: run again.
            }
        }
    }

    /// Whether the pool is shut down: nothing scheduled runs any more.
    pub fn is_stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
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

/// A job for the apply workers.
pub(crate) type Job = Box<dyn FnOnce() + Send>;

/// The apply workers: jobs from every out-of-order group, in submission order. The
/// queue is bounded by what its groups submit: each group's replica releases at most
/// its window of entries, plus at most one checkpoint and its images in flight.
pub(crate) struct ApplyPool {
    queue: Arc<WorkQueue<Job>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl ApplyPool {
    /// Starts `n` apply workers.
    pub fn start(n: usize) -> std::io::Result<Self> {
        let queue: Arc<WorkQueue<Job>> = Arc::default();
        let mut threads = Vec::new();
        for i in 0..n {
            let q = queue.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("chorus-apply-{i}"))
                .spawn(move || {
                    while let Some(job) = q.pop() {
                        let job = std::panic::AssertUnwindSafe(job);
                        if std::panic::catch_unwind(job).is_err() {
                            tracing::error!(
                                "a job panicked on an apply worker; the worker goes on"
                            );
                        }
                    }
                });
            match spawned {
                Ok(h) => threads.push(h),
                Err(e) => {
                    queue.close();
                    for t in threads {
                        let _ = t.join();
                    }
                    return Err(e);
                }
            }
        }
        Ok(Self {
            queue,
            threads: Mutex::new(threads),
        })
    }

    /// Queues a job behind every job queued.
    pub fn submit(&self, job: Job) {
        self.queue.push(job);
    }

    /// Stops the workers once each has finished the job it runs; queued jobs are dropped
    /// (their groups are stopping).
    pub fn shutdown(&self) {
        self.queue.close();
        let threads: Vec<_> = self.threads.lock().expect("threads").drain(..).collect();
        for t in threads {
            let _ = t.join();
        }
    }
}
