//! What the production driver ([`chorus_runtime::ooo::driver::Driver`]) runs on in the
//! simulator: the simulated clock, an outbox of messages and IO batches the simulator
//! delivers and executes at seeded times, a seeded job queue in place of the apply
//! workers, and an observer that hands the checkers every action the driver runs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use chorus_core::format::meta::NodeId;
use chorus_core::ooo::replica::{Action, Entry, Msg, OooReplica};
use chorus_core::ooo::Seq;
use chorus_core::replica::Outcome;
use chorus_runtime::ooo::driver::{Host, Jobs};
use chorus_runtime::ooo::io::IoOp;
use chorus_runtime::ooo::Ev;

/// A job for the state-machine workers.
type Job = Box<dyn FnOnce() + Send>;

/// The jobs a driver submitted and the events they (and the driver) posted back, until
/// the simulator runs them (in a seeded order) and feeds the events to the next round.
#[derive(Default)]
pub(super) struct JobQueue {
    pub queued: Vec<Job>,
    pub posted: Vec<Ev>,
}

/// The simulator's [`Jobs`]: a queue shared by the driver and the jobs themselves (an
/// apply job may submit the other pieces of its entry).
#[derive(Clone, Default)]
pub(super) struct SimJobs(Arc<Mutex<JobQueue>>);

impl SimJobs {
    /// The queue.
    pub fn lock(&self) -> MutexGuard<'_, JobQueue> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Jobs for SimJobs {
    fn post(&self, ev: Ev) {
        self.lock().posted.push(ev);
    }

    fn submit(&self, f: Job) {
        self.lock().queued.push(f);
    }
}

/// An action the checkers look at, as the driver ran it.
pub(super) enum Seen {
    Committed(Entry),
    Result {
        eid: u64,
        seq: Seq,
        outcome: Outcome,
        /// The replica's term when it reported the result.
        term: u64,
    },
    Unknown {
        eid: u64,
        seq: Seq,
    },
    /// A new role (its description, for the trace).
    Role(String),
    Serving {
        term: u64,
        start: Seq,
        /// The replica's committed head when it announced serving.
        head: Seq,
    },
    SnapshotAsked,
}

/// The simulator's [`Host`]: see the module docs.
pub(super) struct SimHost {
    /// The simulated time, shared by every node.
    pub clock: Arc<AtomicU64>,
    /// Messages sent in the last round, in order.
    pub sent: Vec<(NodeId, Msg)>,
    /// IO batches handed over in the last round, in order.
    pub io: Vec<(u64, Vec<IoOp>)>,
    /// Actions the driver ran in the last round.
    pub seen: Vec<Seen>,
    pub jobs: SimJobs,
}

impl SimHost {
    pub fn new(clock: Arc<AtomicU64>) -> Self {
        Self {
            clock,
            sent: Vec::new(),
            io: Vec::new(),
            seen: Vec::new(),
            jobs: SimJobs::default(),
        }
    }
}

impl Host for SimHost {
    type Jobs = SimJobs;

    fn now(&self) -> u64 {
        self.clock.load(Ordering::Relaxed)
    }

    fn send(&mut self, to: NodeId, msg: &Msg) {
        self.sent.push((to, msg.clone()));
    }

    fn io(&mut self, id: u64, ops: Vec<IoOp>) {
        self.io.push((id, ops));
    }

    fn jobs(&self) -> &SimJobs {
        &self.jobs
    }

    fn observe(&mut self, r: &OooReplica, a: &Action) {
        self.seen.push(match a {
            Action::Committed(e) => Seen::Committed(e.clone()),
            &Action::Result { eid, seq, outcome } => Seen::Result {
                eid,
                seq,
                outcome,
                term: r.term(),
            },
            &Action::Unknown { eid, seq } => Seen::Unknown { eid, seq },
            a @ Action::Role { .. } => Seen::Role(format!(
                "{a:?} heads {}/{} voters {:?}",
                r.committed_head(),
                r.applied_head(),
                r.membership()
            )),
            &Action::Serving { term, start } => Seen::Serving {
                term,
                start,
                head: r.committed_head(),
            },
            Action::Snapshot { .. } => Seen::SnapshotAsked,
            _ => return,
        });
    }
}
