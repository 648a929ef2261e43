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
use crate::group::Group;
use crate::sched::SchedState;

/// A task on the run queue. Ordered groups are kept apart so that a worker can take
/// several at once and step them together ([`crate::pass`]).
pub(crate) enum Queued {
    /// An ordered group's driver.
    Ordered(Arc<Group>),
    /// Any other task (an out-of-order group's driver or IO).
    Other(Arc<dyn Task>),
}

/// Work the IO workers run: scheduled at most once at a time ([`Task::sched`]).
pub(crate) trait Task: Send + Sync + 'static {
    /// How the task waits on the run queue.
    fn queued(self: Arc<Self>) -> Queued
    where
        Self: Sized,
    {
        Queued::Other(self)
    }
    /// The task's scheduling state.
    fn sched(&self) -> &SchedState;
    /// Whether the task is gone (a removed group): it is not run any more.
    fn removed(&self) -> bool;
    /// Runs the task until it has nothing left to do (or yields by scheduling itself).
    fn run(self: Arc<Self>);
}

pub(crate) struct Pool {
    /// Tasks with work, each at most once (its [`SchedState`] is `QUEUED`).
    queue: Mutex<VecDeque<Queued>>,
    /// How many ordered groups a worker takes from the front of the queue at once
    /// (at least 1; [`crate::pass`]).
    pass_groups: usize,
    /// Workers started: a pass takes at most its share of the queue, so that a few
    /// groups with work spread over the workers (and their syncs run side by side).
    workers: std::sync::atomic::AtomicUsize,
    ready: Condvar,
    stop: AtomicBool,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Pool {
    pub fn new(pass_groups: usize) -> Self {
        Self {
            queue: Mutex::new(VecDeque::new()),
            pass_groups: pass_groups.max(1),
            workers: std::sync::atomic::AtomicUsize::new(1),
            ready: Condvar::new(),
            stop: AtomicBool::new(false),
            threads: Mutex::new(Vec::new()),
        }
    }

    /// Starts `n` workers. `me` is the pool itself, shared with the workers.
    pub fn start(me: &Arc<crate::group::EnvShared>, n: usize) -> std::io::Result<()> {
        me.pool.workers.store(n.max(1), Ordering::Relaxed);
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
            self.push(t.clone().queued());
        }
    }

    /// Puts a group that a worker is running back on the queue, behind the others:
    /// a pass ran out of rounds while the group still had work ([`crate::pass`]).
    pub fn requeue(&self, g: Arc<Group>) {
        g.sched.requeue();
        self.push(Queued::Ordered(g));
    }

    /// Whether tasks wait on the run queue.
    pub fn has_waiting(&self) -> bool {
        !self.queue.lock().expect("queue").is_empty()
    }

    fn push(&self, t: Queued) {
        let mut q = self.queue.lock().expect("queue");
        let was_empty = q.is_empty();
        q.push_back(t);
        drop(q);
        // Into an empty queue: wake a worker. Behind other work: a worker is already
        // awake for the queue, and each worker that takes a task while more wait wakes
        // the next (below), so a burst of N tasks (the groups at rest ticking together)
        // costs at most one wake-up per worker, not N.
        if was_empty {
            self.ready.notify_one();
        }
    }

    fn work(&self) {
        let mut groups: Vec<Arc<Group>> = Vec::with_capacity(self.pass_groups);
        loop {
            let other = {
                let mut q = self.queue.lock().expect("queue");
                let first = loop {
                    if self.stop.load(Ordering::SeqCst) {
                        return;
                    }
                    if let Some(t) = q.pop_front() {
                        break t;
                    }
                    q = self.ready.wait(q).expect("queue");
                };
                let other = match first {
                    Queued::Other(t) => Some(t),
                    Queued::Ordered(g) => {
                        // Ordered groups waiting right behind it join the pass, up to
                        // this worker's share of the queue.
                        let workers = self.workers.load(Ordering::Relaxed);
                        let share = (q.len() + 1).div_ceil(workers).min(self.pass_groups);
                        groups.push(g);
                        while groups.len() < share {
                            match q.pop_front() {
                                Some(Queued::Ordered(g)) => groups.push(g),
                                Some(t) => {
                                    q.push_front(t);
                                    break;
                                }
                                None => break,
                            }
                        }
                        None
                    }
                };
                if !q.is_empty() {
                    self.ready.notify_one();
                }
                other
            };
            match other {
                Some(t) => run_task(&t),
                None => crate::pass::run(self, &mut groups),
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

/// Runs one task until it has nothing left to do, again if work arrived meanwhile.
fn run_task(t: &Arc<dyn Task>) {
    loop {
        t.sched().begin();
        if !t.removed() {
            // A panic (a bug, or a state machine's own) ends the task's run, not the
            // worker every other group shares.
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
    /// Starts `n` workers, named `chorus-<name>-<i>` (the apply workers, and the ordered
    /// groups' sync threads: [`crate::group::Group::start_sync`]).
    pub fn start(name: &str, n: usize) -> std::io::Result<Self> {
        let queue: Arc<WorkQueue<Job>> = Arc::default();
        let mut threads = Vec::new();
        for i in 0..n {
            let q = queue.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("chorus-{name}-{i}"))
                .spawn(move || {
                    while let Some(job) = q.pop() {
                        let job = std::panic::AssertUnwindSafe(job);
                        if std::panic::catch_unwind(job).is_err() {
                            tracing::error!("a job panicked on a worker; the worker goes on");
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
