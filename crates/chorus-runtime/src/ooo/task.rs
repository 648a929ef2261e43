//! An out-of-order group as work for the environment's shared IO workers: no thread,
//! port or unbounded queue of its own.
//!
//! - [`OooTask`] steps the group's [`Driver`] one round at a time, scheduled on the IO
//!   workers whenever an event arrives (a message from the transport, an append, a
//!   control request, an IO or apply report) and by the environment's timer when its
//!   next tick, freeze deadline or timed resend falls due ([`OooTask::wake_at`]).
//! - [`IoTask`] owns the group's store: it executes the batches the driver hands it in
//!   order, and every batch queued when it runs shares one fdatasync (a hard-state save
//!   first syncs the writes before it). It reports back as an event. Running on a worker
//!   of its own while the driver goes on, it lets rounds overlap syncs.
//! - State-machine work (applies, checkpoints, images) runs as jobs on the shared apply
//!   workers ([`crate::pool::ApplyPool`]) and reports back as events ([`Mailbox`]).
//!
//! Bounds: a group's inbox holds at most [`MAX_INBOX`] messages and appends; past it,
//! messages are dropped and counted (the protocol resends) and appends refused
//! ([`super::OooNodeError::Busy`], nothing appended). Reports of the group's own IO and
//! jobs and control requests are never dropped (a lost report would stall it for good). The IO queue and the apply jobs are
//! bounded by the replica's window (entries in flight) and by one checkpoint and the
//! images of the followers being caught up.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use chorus_core::format::meta::NodeId;
use chorus_core::ooo::replica::Msg;
use chorus_storage::ooo::OooStore;

use super::driver::{Driver, Host, Jobs, ROUND_EVENTS};
use super::io::{run_io, IoOp};
use super::{Ev, OooLatency, OooNodeError};
use crate::group::EnvShared;
use crate::pool::Task;
use crate::sched::SchedState;
use crate::transport::Transport;

/// Events a group's inbox holds at most.
pub(super) const MAX_INBOX: usize = 65_536;

/// Whether a full inbox may shed `ev`: a peer's message (the protocol resends what is
/// lost) or an append (refused, so its writer knows nothing was appended). Never a report
/// of the group's own IO or state-machine jobs: the driver waits for each (a slot applied,
/// a batch synced, an image taken or installed), so one lost would stall the group for
/// good, and they are bounded by what it has in flight. Nor a control request: each has
/// a caller waiting for its answer, so they are bounded by the callers.
fn sheddable(ev: &Ev) -> bool {
    matches!(ev, Ev::Msg(..) | Ev::Append(..))
}

/// Rounds a task runs before it lets other tasks have its worker (it is queued again).
const MAX_ROUNDS: u32 = 64;

/// Posts events to a group's driver, from its IO task, its apply jobs and the
/// environment; a group gone since drops them.
#[derive(Clone)]
pub(super) struct Mailbox {
    task: Weak<OooTask>,
    env: Arc<EnvShared>,
    /// Jobs of this group submitted to the apply workers and not finished (or dropped).
    inflight: Arc<AtomicUsize>,
}

impl Jobs for Mailbox {
    /// Queues `ev` for the driver and schedules it.
    fn post(&self, ev: Ev) {
        if let Some(t) = self.task.upgrade() {
            t.push(ev);
        }
    }

    /// Runs `f` on the apply workers, counted in flight until it ends or is dropped
    /// unrun (the workers stopping).
    fn submit(&self, f: Box<dyn FnOnce() + Send>) {
        struct InFlight(Arc<AtomicUsize>);
        impl Drop for InFlight {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::AcqRel);
            }
        }
        self.inflight.fetch_add(1, Ordering::AcqRel);
        let guard = InFlight(self.inflight.clone());
        let task = self.task.clone();
        self.env.apply.submit(Box::new(move || {
            let _guard = guard;
            // A group stopped since: its state machine is not touched any more.
            if task
                .upgrade()
                .is_some_and(|t| !t.removed.load(Ordering::Acquire))
            {
                f();
            }
        }));
    }
}

impl Mailbox {
    /// Jobs of this group on the apply workers now.
    pub fn inflight(&self) -> usize {
        self.inflight.load(Ordering::Acquire)
    }
}

/// What a hosted driver runs on: the environment's clock, the node's transport, the
/// group's IO task and the environment's apply workers.
pub(super) struct EnvHost {
    pub env: Arc<EnvShared>,
    pub transport: Arc<dyn Transport>,
    pub group: u64,
    pub mail: Mailbox,
    /// The group's IO task (set once it is built, right after the driver).
    pub io: Arc<OnceLock<Arc<IoTask>>>,
}

impl Host for EnvHost {
    type Jobs = Mailbox;

    fn now(&self) -> u64 {
        self.env.now()
    }

    /// On the node's transport, which every group of every mode shares.
    fn send(&mut self, to: NodeId, msg: &Msg) {
        self.transport.send_ooo(to, self.group, msg);
    }

    fn io(&mut self, id: u64, ops: Vec<IoOp>) {
        if let Some(io) = self.io.get() {
            io.push(id, ops)
        }
    }

    fn jobs(&self) -> &Mailbox {
        &self.mail
    }
}

/// The driver task of one group. See the module docs.
pub(crate) struct OooTask {
    sched: SchedState,
    /// Events not yet taken by a round (at most [`MAX_INBOX`]).
    inbox: Mutex<VecDeque<Ev>>,
    driver: Mutex<Driver<EnvHost>>,
    /// Set once the group is stopped: its task is not run any more.
    pub(super) removed: AtomicBool,
    env: Arc<EnvShared>,
    /// When (on the environment's clock) the driver must run without new events.
    wake_at: AtomicU64,
    /// Messages dropped and appends refused because the inbox was full.
    pub(super) overflowed: AtomicU64,
}

impl OooTask {
    /// A task for the driver `make` builds, given this task's mailbox.
    pub(super) fn new(
        env: Arc<EnvShared>,
        inflight: Arc<AtomicUsize>,
        make: impl FnOnce(Mailbox) -> Driver<EnvHost>,
    ) -> Arc<Self> {
        Arc::new_cyclic(|me| {
            let mail = Mailbox {
                task: me.clone(),
                env: env.clone(),
                inflight,
            };
            OooTask {
                sched: SchedState::default(),
                inbox: Mutex::new(VecDeque::new()),
                driver: Mutex::new(make(mail)),
                removed: AtomicBool::new(false),
                wake_at: AtomicU64::new(0),
                env,
                overflowed: AtomicU64::new(0),
            }
        })
    }

    /// Queues an event and schedules the driver. Past [`MAX_INBOX`] a message is
    /// dropped and an append refused, nothing appended; every other event is queued
    /// whatever the length ([`sheddable`]).
    pub(super) fn push(self: &Arc<Self>, ev: Ev) {
        {
            let mut q = self.inbox.lock().expect("inbox");
            if q.len() >= MAX_INBOX && sheddable(&ev) {
                drop(q);
                self.overflowed.fetch_add(1, Ordering::Relaxed);
                if let Ev::Append(_, _, reply) = ev {
                    reply.send(Err(OooNodeError::Busy));
                }
                return;
            }
            q.push_back(ev);
        }
        self.env.pool.schedule(self);
    }

    /// Schedules the driver if its wake-up time has come; returns that time.
    pub(crate) fn poke(self: &Arc<Self>, now: u64) -> u64 {
        let at = self.wake_at.load(Ordering::Acquire);
        if at <= now {
            self.env.pool.schedule(self);
        }
        at
    }

    /// Runs `f` on the driver (between rounds).
    pub(super) fn with_driver<T>(&self, f: impl FnOnce(&mut Driver<EnvHost>) -> T) -> Option<T> {
        self.driver.lock().ok().map(|mut d| f(&mut d))
    }

    /// Answers what is queued for a stopped driver: appends are told the node stopped
    /// before taking them; control requests see their reply channel close.
    pub(super) fn refuse_queued(&self) {
        let queued: Vec<Ev> = self.inbox.lock().expect("inbox").drain(..).collect();
        for ev in queued {
            if let Ev::Append(_, _, reply) = ev {
                reply.send(Err(OooNodeError::NotRunning));
            }
        }
    }
}

impl Task for OooTask {
    fn sched(&self) -> &SchedState {
        &self.sched
    }

    fn removed(&self) -> bool {
        self.removed.load(Ordering::Acquire)
    }

    fn run(self: Arc<Self>) {
        // Poisoned: the replica panicked in an earlier run (a bug, logged then); the group
        // takes no more work.
        let Ok(mut d) = self.driver.lock() else {
            self.refuse_queued();
            return;
        };
        for _ in 0..MAX_ROUNDS {
            if d.failed() {
                d.fail_waiters();
                drop(d);
                self.refuse_queued();
                return;
            }
            let events: Vec<Ev> = {
                let mut q = self.inbox.lock().expect("inbox");
                let n = q.len().min(ROUND_EVENTS);
                q.drain(..n).collect()
            };
            let due = self.wake_at.load(Ordering::Acquire) <= self.env.now();
            if events.is_empty() && !due {
                return;
            }
            // A panic in the replica or the driver (a bug) stops this group, by name,
            // rather than leaving it silent: its status then says why, and waiters and
            // queued requests are refused.
            let round = std::panic::AssertUnwindSafe(|| d.round(events));
            if let Err(p) = std::panic::catch_unwind(round) {
                let what = p
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic without a message".into());
                tracing::error!(panic = %what, "an out-of-order replica panicked (a bug); its group stops");
                d.stop(format!("panicked (a bug): {what}"));
                continue;
            }
            let at = d.wake_at();
            self.wake_at.store(at, Ordering::Release);
            self.env.wake_timer_by(at);
            if d.failed() {
                continue;
            }
            if self.inbox.lock().expect("inbox").is_empty() {
                return;
            }
        }
        // Busy: let other tasks have this worker, and come back.
        drop(d);
        self.env.pool.schedule(&self);
    }
}

/// The IO task of one group: its store and the batches queued for it. See the module
/// docs.
pub(crate) struct IoTask {
    sched: SchedState,
    queue: Mutex<VecDeque<(u64, Vec<IoOp>)>>,
    /// The store; None once a write or sync failed (it refuses everything after).
    store: Mutex<Option<OooStore>>,
    mail: Mailbox,
    lat: Arc<OooLatency>,
    /// Set when a write failed for want of space.
    disk_full: Arc<AtomicBool>,
    pub(super) removed: AtomicBool,
    env: Arc<EnvShared>,
}

impl IoTask {
    pub(super) fn new(
        store: OooStore,
        mail: Mailbox,
        lat: Arc<OooLatency>,
        disk_full: Arc<AtomicBool>,
        env: Arc<EnvShared>,
    ) -> Arc<Self> {
        Arc::new(Self {
            sched: SchedState::default(),
            queue: Mutex::new(VecDeque::new()),
            store: Mutex::new(Some(store)),
            mail,
            lat,
            disk_full,
            removed: AtomicBool::new(false),
            env,
        })
    }

    /// Queues batch `id` and schedules the task.
    pub(super) fn push(self: &Arc<Self>, id: u64, ops: Vec<IoOp>) {
        self.queue.lock().expect("io queue").push_back((id, ops));
        self.env.pool.schedule(self);
    }
}

impl Task for IoTask {
    fn sched(&self) -> &SchedState {
        &self.sched
    }

    fn removed(&self) -> bool {
        self.removed.load(Ordering::Acquire)
    }

    fn run(self: Arc<Self>) {
        let mut guard = self.store.lock().expect("store");
        let Some(store) = guard.as_mut() else {
            // Failed before: nothing is written any more.
            self.queue.lock().expect("io queue").clear();
            return;
        };
        let batches: Vec<(u64, Vec<IoOp>)> =
            self.queue.lock().expect("io queue").drain(..).collect();
        let Some(r) = run_io(store, batches, Some(&self.lat.fsync)) else {
            return;
        };
        match r {
            Ok(done) => {
                drop(guard);
                self.mail.post(Ev::Synced {
                    upto: done.upto,
                    syncs: done.syncs,
                    len: done.len,
                });
            }
            Err(e) => {
                // Before the driver hears: once it reports the node stopped, whether a
                // full disk did it is known.
                self.disk_full.store(e.is_disk_full(), Ordering::SeqCst);
                *guard = None;
                drop(guard);
                self.queue.lock().expect("io queue").clear();
                self.mail.post(Ev::IoFailed(e.to_string()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A full inbox sheds peers' messages and appends only: a dropped report of an apply,
    /// a sync or an image would leave the driver waiting for it for ever.
    #[test]
    fn a_full_inbox_sheds_messages_and_appends_never_reports() {
        let (reply, _rx) = super::super::Reply::channel();
        assert!(sheddable(&Ev::Msg(2, Msg::TimeoutNow { term: 1 })));
        assert!(sheddable(&Ev::Append(
            chorus_core::ooo::replica::Declared::Blocks(Vec::new()),
            Vec::new(),
            reply
        )));
        let (tx, _r) = std::sync::mpsc::channel();
        for ev in [
            Ev::Applied(7),
            Ev::Synced {
                upto: 1,
                syncs: 1,
                len: 0,
            },
            Ev::IoFailed("x".into()),
            Ev::Checkpointed(3),
            Ev::Image {
                to: 2,
                base: 3,
                part: None,
                image: Vec::new(),
            },
            Ev::Installed(3, false),
            Ev::InstallFailed(3, "x".into()),
            Ev::SmFailed("x".into()),
            Ev::Status(tx),
        ] {
            assert!(!sheddable(&ev));
        }
    }
}
