//! The driver of one out-of-order group: the replica, the writers waiting for answers and
//! the batches waiting for their writes, stepped one round at a time by the group's task
//! on the environment's IO workers (`super::task`).
//!
//! A round takes the events queued since the last (messages, appends, apply and IO
//! reports, control requests), lets the replica react, and hands the writes and
//! hard-state saves of that batch to the group's IO task in order; the acknowledgements
//! and votes of the batch wait until the IO task reports it — and every batch before it —
//! durable, so nothing is acknowledged or voted before what it depends on is on disk.
//! Meanwhile later rounds go on: they overlap the syncs, and the IO task puts every
//! batch queued while it synced into one `fdatasync` (group commit). A leader's appends to
//! followers leave at once (the replica's first documented exception), and the replica
//! counts the leader's own copy of a slot only when the driver reports it durable
//! ([`OooReplica::persisted`]). Results leave at once too (the second exception: an
//! outcome rests on durable copies only), and an apply waits for its own entry's write
//! only, not for the other writes of its batch.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use chorus_core::format::meta::NodeId;
use chorus_core::format::ooo::encode_group;
use chorus_core::ooo::group::{self, Record};
use chorus_core::ooo::replica::{Action, Mode, Msg, OooReadIndexError, OooReplica, ReadTicket};
use chorus_core::replica::{Outcome, Role};

use super::apply::{apply_entry, guarded, ApplyCtx};
use super::io::IoOp;
use super::{
    AckClock, Ev, OooCounters, OooLatency, OooNodeError, OooRead, OooResult, OooRole,
    OooStateMachine, OooStatus, Reply,
};

/// Events a round takes at most before it lets the replica act (the rest wait for the
/// next round, which follows at once).
pub const ROUND_EVENTS: usize = 4096;

/// How long an idle driver waits for its next tick: a quarter of its heartbeat interval,
/// between these bounds. Its timers (heartbeats, resends, election and snapshot
/// timeouts) are deadlines the replica checks on each tick, so a tick this much later
/// delays them by at most this much, and a node at rest runs each of its groups a few
/// dozen times a second rather than hundreds.
pub fn idle_tick(heartbeat: Duration) -> Duration {
    (heartbeat / 4).clamp(Duration::from_millis(5), Duration::from_millis(50))
}

/// Where a driver's state-machine work runs and how its reports come back: the
/// environment's shared apply workers and the group's inbox (`super::task::Mailbox`), or
/// the simulator's seeded job queue.
pub trait Jobs: Clone + Send + Sync + 'static {
    /// Queues `ev` for the driver's next round.
    fn post(&self, ev: Ev);
    /// Runs `f` on the state-machine workers, some time later, in no promised order with
    /// the other jobs.
    fn submit(&self, f: Box<dyn FnOnce() + Send>);
    /// Runs `f` on the state-machine workers and posts what it returns.
    fn job(&self, f: impl FnOnce() -> Ev + Send + 'static) {
        let me = self.clone();
        self.submit(Box::new(move || me.post(f())));
    }
}

/// What a driver runs on: its clock, its network sink, its IO hand-off and its
/// state-machine workers. The environment's implementation (`super::task::EnvHost`)
/// uses the node's transport, IO workers and apply workers; the simulator's uses a seeded
/// network, a simulated disk and a seeded job queue — so the seeds run the very code that
/// decides what is synced before it is sent, acknowledged or applied (TigerBeetle's
/// replica is generic over its bus, storage and time in the same way).
pub trait Host: Send + 'static {
    /// The state-machine workers.
    type Jobs: Jobs;
    /// Nanoseconds on the group's clock (monotonic).
    fn now(&self) -> u64;
    /// Queues a message for a peer (a lost one is the protocol's to resend).
    fn send(&mut self, to: NodeId, msg: &Msg);
    /// Hands batch `id` to the group's IO side, which executes the batches in order
    /// ([`super::io::run_io`]) and reports [`Ev::Synced`] (or [`Ev::IoFailed`]).
    fn io(&mut self, id: u64, ops: Vec<IoOp>);
    /// The state-machine workers.
    fn jobs(&self) -> &Self::Jobs;
    /// Sees every action the driver runs once what it depends on is durable (results,
    /// commits, roles, applies, images), before it runs: the simulator's checkers. The
    /// environment's host does nothing.
    fn observe(&mut self, _replica: &OooReplica, _action: &Action) {}
}

/// What waits for an IO batch: the actions that may run only once the writes before
/// them are durable, and the writes to report to the replica.
struct Pending {
    id: u64,
    io: bool,
    written: Vec<(u64, u64, u64)>,
    actions: Vec<Action>,
}

/// Settings the driver reads every round.
pub struct DriverSettings {
    /// The group's mode.
    pub mode: Mode,
    /// Checkpoint and compact once the entries file passes this many bytes (0: never).
    pub compact_bytes: u64,
    /// How long staged appends may wait for the log write in flight before they are
    /// packed anyway (PALF section 6's freeze interval).
    pub freeze: Duration,
    /// The disk's free-space guard, if any (`crate::disk`).
    pub disk: Option<Arc<crate::DiskSpace>>,
    /// [`idle_tick`] of the group's heartbeat interval.
    pub idle_tick: Duration,
    /// Broken on purpose (test-only `broken` build): every action runs at once, before
    /// the writes of its batch are durable — acknowledgements, votes and the leader's
    /// count of its own copies included. The simulator must catch it.
    #[cfg(feature = "broken")]
    pub broken_ack_before_sync: bool,
    /// Broken on purpose (test-only `broken` build): a committed outcome is told at once,
    /// before its slot is applied here, as the driver once did. The simulator must catch
    /// it.
    #[cfg(feature = "broken")]
    pub broken_ack_before_apply: bool,
}

/// The driver's state between rounds.
///
/// Invariants: every key of `waiters` is the id of an entry the replica took and has not
/// answered; `pending` is in batch order, each `id` greater than the one before, and
/// `synced_upto <= io_sent <= next_id`; a slot in `unsynced` maps to the batch of its
/// latest write, which is in `pending` or was reported durable (then it is removed);
/// `staged` is empty exactly when `staged_since` is `None`.
pub struct Driver<H: Host> {
    replica: OooReplica,
    set: DriverSettings,
    /// The clock, network, IO and workers this driver runs on.
    host: H,
    /// The group's replicas other than this node (voters and `others`): the only peers
    /// sent to and heard.
    peers: HashSet<NodeId>,
    sm: Arc<dyn OooStateMachine>,
    /// The apply workers and what their jobs need (None: applies run inline).
    apply: Option<Arc<ApplyCtx<H::Jobs>>>,
    lat: Arc<OooLatency>,
    /// Why the driver stopped, once a failure stopped it.
    why: Arc<OnceLock<String>>,
    /// The committed head, published at the end of every round.
    committed: tokio::sync::watch::Sender<u64>,
    /// The role, term, leader and whether serving, published at the end of every round
    /// that changed them.
    role: tokio::sync::watch::Sender<OooRole>,
    /// The writers of each group entry in flight, by entry id, in record order.
    waiters: HashMap<u64, Vec<Reply>>,
    /// Records taken and not packed yet into group entries.
    staged: Vec<(Record, Reply)>,
    /// When (on the host's clock) the oldest staged record was taken.
    staged_since: Option<u64>,
    /// The staged records' bytes.
    staged_bytes: usize,
    /// The last batch handed to the IO side: the log IO is idle once every batch up to
    /// it is reported durable.
    io_sent: u64,
    /// A failure stopped the driver (`why` says which): it takes no more work.
    failed: bool,
    c: OooCounters,
    /// A checkpoint is under way (at most one at a time).
    checkpointing: bool,
    /// Operators waiting for a compaction ([`Ev::Compact`]), answered with the base once
    /// the checkpoints cover `compact_asked`; empty unless `checkpointing`.
    compact_waiters: Vec<std::sync::mpsc::Sender<u64>>,
    /// The highest slot operators asked to compact below and no checkpoint has covered
    /// yet (0: none).
    compact_asked: u64,
    /// Batches whose actions wait for their writes (and every earlier batch's).
    pending: VecDeque<Pending>,
    next_id: u64,
    synced_upto: u64,
    /// Slots whose latest write is not known durable yet, with its batch: an Apply of
    /// any other slot runs at once (its entry is on disk already).
    unsynced: HashMap<u64, u64>,
    clock: AckClock,
    /// Bytes of the entries file (as last reported by the IO side).
    log_bytes: u64,
    /// Committed outcomes not told yet because their slot is not applied on this node,
    /// by slot: the entry ids whose writers wait. A writer told "committed" finds its
    /// write in this node's state machine, so a read served here after that sees it
    /// (PolarFS section 4's IoScheduler guarantee). Invariant, at the end of a round:
    /// no slot here is applied (below the replica's apply head or in `applied_above`),
    /// and every id here is a key of `waiters`.
    parked: BTreeMap<u64, Vec<u64>>,
    /// Slots applied at or above the replica's apply head (the apply rules release
    /// entries out of order); pruned as the head passes them.
    applied_above: BTreeSet<u64>,
    /// Leader reads waiting for their quorum and their slots to be applied
    /// ([`OooReplica::read_ready`]), each answered once, at the end of the round that
    /// settles it.
    reads: Vec<(ReadTicket, ReadReply)>,
}

/// What a driver publishes to the node that hosts it.
pub struct DriverOutputs {
    /// Why the driver stopped, set once a failure stopped it.
    pub why: Arc<OnceLock<String>>,
    /// The committed head, published at the end of every round.
    pub committed: tokio::sync::watch::Sender<u64>,
    /// The replica's role ([`OooRole`]), published at the end of every round that
    /// changed it (PALF's monitor_role); its receivers are woken, unchanged, when a
    /// failure stops the driver.
    pub role: tokio::sync::watch::Sender<OooRole>,
    /// Latency histograms, recorded as the driver runs.
    pub lat: Arc<OooLatency>,
}

/// Where a leader read's answer goes (taken when it is sent).
type ReadReply = Option<tokio::sync::oneshot::Sender<Result<(), OooReadIndexError>>>;

impl<H: Host> Driver<H> {
    /// A driver for `replica` on `host`, nothing in flight: `peers` are the group's
    /// other replicas (the only ones sent to and heard), `apply_pieces` the pieces an
    /// entry may be cut into on the state-machine workers (0: applies run inline, one
    /// released batch after another), `log_bytes` the entries file's size.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        replica: OooReplica,
        set: DriverSettings,
        host: H,
        peers: HashSet<NodeId>,
        sm: Arc<dyn OooStateMachine>,
        apply_pieces: usize,
        out: DriverOutputs,
        c: OooCounters,
        log_bytes: u64,
    ) -> Self {
        // Before any apply: what the driver applies below the log's end is a replay.
        sm.replaying_below(replica.log_end());
        let apply = (apply_pieces > 0).then(|| {
            Arc::new(ApplyCtx {
                sm: sm.clone(),
                jobs: host.jobs().clone(),
                pieces: apply_pieces,
            })
        });
        let mut d = Self {
            replica,
            set,
            host,
            peers,
            sm,
            apply,
            lat: out.lat,
            why: out.why,
            committed: out.committed,
            role: out.role,
            waiters: HashMap::new(),
            staged: Vec::new(),
            staged_since: None,
            staged_bytes: 0,
            io_sent: 0,
            failed: false,
            c,
            checkpointing: false,
            compact_waiters: Vec::new(),
            compact_asked: 0,
            pending: VecDeque::new(),
            next_id: 0,
            synced_upto: 0,
            unsynced: HashMap::new(),
            clock: AckClock::default(),
            log_bytes,
            parked: BTreeMap::new(),
            applied_above: BTreeSet::new(),
            reads: Vec::new(),
        };
        // A replica restarted after a change that added a node not named at creation.
        d.widen_peers();
        d
    }

    /// Whether `seq` is applied on this node.
    fn applied_here(&self, seq: u64) -> bool {
        seq < self.replica.applied_head() || self.applied_above.contains(&seq)
    }

    /// The replica took the report that `seq` is applied.
    fn note_applied(&mut self, seq: u64) {
        self.applied_above.insert(seq);
        let head = self.replica.applied_head();
        self.applied_above = self.applied_above.split_off(&head);
    }

    /// Tells the writers of every parked slot that is applied now.
    fn release_parked(&mut self) {
        if self.parked.is_empty() {
            return;
        }
        let head = self.replica.applied_head();
        self.applied_above = self.applied_above.split_off(&head);
        let mut ready: Vec<u64> = self.parked.range(..head).map(|(s, _)| *s).collect();
        ready.extend(
            self.applied_above
                .iter()
                .filter(|s| self.parked.contains_key(s)),
        );
        for seq in ready {
            for eid in self.parked.remove(&seq).unwrap_or_default() {
                let outcome = Outcome::Committed;
                self.host
                    .observe(&self.replica, &Action::Result { eid, seq, outcome });
                self.answer(eid, seq, outcome);
            }
        }
    }

    /// Every record of entry `eid` gets the entry's outcome, in its order.
    fn answer(&mut self, eid: u64, seq: u64, outcome: Outcome) {
        let answered = Instant::now();
        for (index, w) in self
            .waiters
            .remove(&eid)
            .unwrap_or_default()
            .into_iter()
            .enumerate()
        {
            match outcome {
                Outcome::Committed => self.c.committed += 1,
                Outcome::Failed => self.c.failed += 1,
            }
            let index = index as u32;
            self.lat
                .append
                .record(answered.duration_since(w.since).as_nanos() as u64);
            w.send(Ok(OooResult {
                seq,
                index,
                outcome,
            }));
        }
    }

    /// Answers the leader reads that are settled: served, or refused once this replica
    /// no longer leads their term.
    fn serve_reads(&mut self) {
        let replica = &self.replica;
        self.reads
            .retain_mut(|(t, reply)| match replica.read_ready(t) {
                Ok(false) => true,
                Ok(true) => {
                    if let Some(tx) = reply.take() {
                        let _ = tx.send(Ok(()));
                    }
                    false
                }
                Err(e) => {
                    if let Some(tx) = reply.take() {
                        let _ = tx.send(Err(e));
                    }
                    false
                }
            });
    }

    /// Stops the driver: it takes no more work, and `why` is what the node reports.
    pub(crate) fn stop(&mut self, why: String) {
        let _ = self.why.set(why);
        self.failed = true;
        // Whoever follows the role learns of the stop (they look at `why` when woken).
        self.role.send_modify(|_| {});
    }

    /// The replica (the simulator reads it for its checks).
    pub fn replica(&self) -> &OooReplica {
        &self.replica
    }

    /// The replica, for a harness that appends or asks it directly between rounds (the
    /// simulator's clients and operators); the next round runs what it asked.
    pub fn replica_mut(&mut self) -> &mut OooReplica {
        &mut self.replica
    }

    /// The host.
    pub fn host(&self) -> &H {
        &self.host
    }

    /// The host, mutably.
    pub fn host_mut(&mut self) -> &mut H {
        &mut self.host
    }

    /// Whether a failure stopped the driver.
    pub fn failed(&self) -> bool {
        self.failed
    }

    /// Adds every voter of the membership this replica knows to the peers: a membership
    /// change may add a node the group was not created naming (a chunk re-replicated onto
    /// a new chunk server), and the replica must then send to it and hear it. A leader
    /// takes the joint membership (with the new voter) when the change starts, a follower
    /// when the leader tells it; both before any message to or from the new voter
    /// matters. Peers are never dropped: a removed voter is no longer sent to by the
    /// replica itself.
    fn widen_peers(&mut self) {
        let m = self.replica.membership();
        let me = self.replica.id();
        let new: Vec<NodeId> = m
            .voters
            .iter()
            .chain(m.prev.iter().flatten())
            .copied()
            .filter(|n| *n != me && !self.peers.contains(n))
            .collect();
        self.peers.extend(new);
    }

    /// Queues a message for a peer on the host, counted; only the group's replicas are
    /// sent to.
    fn send(&mut self, to: NodeId, msg: &Msg) {
        if self.peers.contains(&to) {
            self.c.msgs_out += 1;
            self.host.send(to, msg);
        }
    }

    /// When the driver must run again without new events: its next tick, the freeze
    /// deadline of staged records, or a timed resend falling due (nanoseconds on its
    /// clock).
    pub fn wake_at(&self) -> u64 {
        let now = self.host.now();
        let mut at = crate::sched::tick_instant(now + self.set.idle_tick.as_nanos() as u64);
        if let Some(t) = self.staged_since {
            at = at.min((t + self.set.freeze.as_nanos() as u64).max(now));
        }
        if let Some(due) = self.replica.resend_due() {
            // Once a millisecond while one is already past due, waiting out its
            // back-off or its commit.
            at = at.min(due.max(now + 1_000_000));
        }
        at
    }

    /// One round: takes `events`, packs staged appends when due, ticks the replica, runs
    /// what its writes allow, and publishes the committed head.
    pub fn round(&mut self, events: Vec<Ev>) {
        for ev in events {
            self.event(ev);
        }
        if self.failed {
            return;
        }
        // One probe for every leader read this round took.
        self.replica.send_read_probes();
        if !self.staged.is_empty() {
            // Adaptive group replication (PALF section 6): pack at once while this
            // node's log IO is idle; while a write is in flight, let appends gather until
            // it is durable (its Synced event starts a round), a full group is staged, or
            // the freeze interval passed.
            let now = self.host.now();
            let since = *self.staged_since.get_or_insert(now);
            let due = self.io_sent <= self.synced_upto
                || now.saturating_sub(since) >= self.set.freeze.as_nanos() as u64
                || self.staged.len() >= group::MAX_GROUP_RECORDS
                || self.staged_bytes >= group::MAX_GROUP_BYTES
                || !self.replica.is_serving();
            if due {
                append_groups(
                    &mut self.replica,
                    self.set.mode,
                    now,
                    &mut self.staged,
                    &mut self.waiters,
                    &mut self.c,
                    &self.lat,
                );
                (self.staged_since, self.staged_bytes) = (None, 0);
            }
        }
        self.replica.tick(self.host.now());
        self.maybe_checkpoint();
        self.widen_peers();
        self.drain();
        self.release_parked();
        self.serve_reads();
        // Readers following the log (tail) wake only when the head moves.
        let head = self.replica.committed_head();
        self.committed
            .send_if_modified(|h| std::mem::replace(h, head) != head);
        let role = OooRole::of(&self.replica);
        self.role
            .send_if_modified(|r| std::mem::replace(r, role) != role);
    }

    fn event(&mut self, ev: Ev) {
        let now = self.host.now();
        match ev {
            // Only the configured replicas (voters and `others`) are heard.
            Ev::Msg(from, m) if self.peers.contains(&from) => {
                self.c.msgs_in += 1;
                // On a low disk a follower takes no new entries (`crate::disk`): the
                // message goes as if lost.
                let declined = matches!(&m, Msg::Append { entries, .. }
                    if !entries.is_empty()
                        && self.replica.role() != Role::Leader
                        && self.set.disk.as_ref().is_some_and(|d| d.decline()));
                if let Msg::Ack { seqs, .. } = &m {
                    self.clock.acked(from, seqs.iter().map(|s| s.0), &self.lat);
                }
                if !declined {
                    self.replica.receive(now, from, m)
                }
            }
            Ev::Msg(..) => {}
            Ev::Append(declared, data, reply) => match group::check(self.set.mode, &declared) {
                Ok(()) => {
                    // Refused before the disk fills, by a leader only (a follower refuses
                    // as NotLeader when the group is packed).
                    let low = self
                        .set
                        .disk
                        .as_ref()
                        .filter(|d| d.is_low() && self.replica.role() == Role::Leader);
                    if let Some(Err((free, min_free))) = low.map(|d| d.check()) {
                        reply.send(Err(OooNodeError::DiskLow { free, min_free }));
                    } else {
                        self.staged_bytes += data.len();
                        self.staged.push((Record { declared, data }, reply))
                    }
                }
                Err(e) => reply.send(Err(e.into())),
            },
            Ev::Applied(seq) => {
                self.c.applied += 1;
                match self.replica.applied(seq) {
                    Ok(()) => self.note_applied(seq),
                    Err(e) => {
                        tracing::error!(error = %e, "apply report refused; stopping");
                        self.stop(format!("apply report refused: {e}"));
                    }
                }
            }
            Ev::Status(reply) => {
                let _ = reply.send(self.status());
            }
            Ev::Compact(upto, reply) => {
                let upto = upto.min(self.replica.applied_head());
                if self.checkpointing {
                    // The checkpoint under way may not cover it: another follows it.
                    self.compact_asked = self.compact_asked.max(upto);
                    self.compact_waiters.push(reply);
                } else if upto <= self.replica.base() {
                    let _ = reply.send(self.replica.base());
                } else {
                    self.compact_waiters.push(reply);
                    self.checkpoint(upto);
                }
            }
            Ev::Transfer(to, force, reply) => {
                let _ = reply.send(self.replica.transfer_leader_checked(now, to, force));
            }
            Ev::Change(change, force, reply) => {
                let _ = reply.send(self.replica.change_membership_checked(now, change, force));
            }
            Ev::Membership(reply) => {
                let _ = reply.send(self.replica.membership().clone());
            }
            Ev::ReadIndex(tx) => match self.replica.read_index(now) {
                Ok(t) => self.reads.push((t, Some(tx))),
                Err(e) => {
                    let _ = tx.send(Err(e));
                }
            },
            Ev::Read(from, max, reply) => {
                let _ = reply.send(
                    self.replica
                        .read_committed(from, max)
                        .map(|entries| OooRead {
                            entries,
                            committed_head: self.replica.committed_head(),
                        }),
                );
            }
            Ev::Synced { upto, syncs, len } => {
                self.c.syncs += syncs;
                self.synced_upto = upto;
                self.log_bytes = len;
            }
            Ev::IoFailed(e) => {
                tracing::error!(error = %e, "out-of-order store failed; stopping");
                self.stop(format!("storage: {e}"));
            }
            Ev::Checkpointed(upto) => {
                self.checkpointing = false;
                self.c.checkpoints += 1;
                let before = self.replica.base();
                self.replica.compact(now, upto);
                if self.replica.base() > before {
                    // The file is rewritten next; its size is known again when the IO task
                    // reports. Until then, no second checkpoint on the old size.
                    self.log_bytes = 0;
                }
                // Operators who asked for more while it ran get a checkpoint of their
                // own; the others (all, once no more is asked) get the base.
                let asked =
                    std::mem::take(&mut self.compact_asked).min(self.replica.applied_head());
                if asked > upto && asked > self.replica.base() {
                    self.checkpoint(asked);
                } else {
                    let base = self.replica.base();
                    for w in self.compact_waiters.drain(..) {
                        let _ = w.send(base);
                    }
                }
            }
            Ev::Image {
                to,
                base,
                part,
                image,
            } => {
                self.c.images += 1;
                self.c.partial_images += u64::from(part.is_some());
                self.c.image_bytes += image.len() as u64;
                self.replica.snapshot_ready(now, to, base, part, image);
            }
            Ev::Installed(base, part) => {
                self.c.installs += 1;
                self.c.partial_installs += u64::from(part);
                if let Err(e) = self.replica.installed(now, base) {
                    tracing::error!(error = %e, "install report refused; stopping");
                    self.stop(format!("install report refused: {e}"));
                }
            }
            Ev::InstallFailed(base, e) => {
                tracing::warn!(base, error = %e, "the leader's image was refused; it will be sent again");
                if let Err(e) = self.replica.install_failed(now, base) {
                    tracing::error!(error = %e, "install report refused; stopping");
                    self.stop(format!("install report refused: {e}"));
                }
            }
            Ev::SmFailed(e) => {
                tracing::error!(error = %e, "out-of-order state machine failed; stopping");
                self.stop(format!("state machine: {e}"));
            }
        }
    }

    /// The replica's status as the driver reports it.
    pub fn status(&mut self) -> OooStatus {
        self.c.log_bytes = self.log_bytes;
        self.c.base = self.replica.base();
        OooStatus {
            mode: self.set.mode,
            role: self.replica.role(),
            term: self.replica.term(),
            leader: self.replica.leader(),
            serving: self.replica.is_serving(),
            committed_head: self.replica.committed_head(),
            applied_head: self.replica.applied_head(),
            base: self.replica.base(),
            recovering_lost: self.replica.is_recovering_lost(),
            stats: self.replica.stats(),
            counters: self.c,
            followers: self.replica.follower_heads(),
        }
    }

    /// Checkpoint, then compact, once the entries file passed its bound (and the
    /// checkpoint's own cost: a state machine that rewrites its whole state waits for as
    /// many bytes of entries) and something applied is not compacted yet: up to what
    /// every live follower has, unless the file grew to four times its bound. The
    /// checkpoint runs on the apply workers and reports back as an event.
    fn maybe_checkpoint(&mut self) {
        let compact_bytes = self.set.compact_bytes;
        let log_bytes = self.log_bytes;
        let bound = if compact_bytes > 0 && log_bytes >= compact_bytes {
            compact_bytes.max(self.sm.checkpoint_cost())
        } else {
            compact_bytes
        };
        let upto = if log_bytes >= bound.saturating_mul(4) {
            self.replica.applied_head()
        } else {
            self.replica.compactable()
        };
        if compact_bytes > 0
            && !self.checkpointing
            && log_bytes >= bound
            && upto > self.replica.base()
        {
            self.checkpoint(upto);
        }
    }

    /// Starts a checkpoint on the apply workers; once the state machine reports its
    /// state durable, the entries below `upto` are compacted ([`Ev::Checkpointed`]).
    fn checkpoint(&mut self, upto: u64) {
        self.checkpointing = true;
        let sm = self.sm.clone();
        self.host
            .jobs()
            .job(move || match guarded(|| sm.checkpoint()) {
                Ok(()) => Ev::Checkpointed(upto),
                Err(e) => Ev::SmFailed(format!("checkpoint: {e}")),
            });
    }

    /// Runs the replica's actions until it has none: batches now durable release their
    /// waiting actions, writes go to the IO task.
    fn drain(&mut self) {
        loop {
            // Batches now durable, in order: the replica learns which of its writes are,
            // and their waiting actions run.
            let mut ran = false;
            while self
                .pending
                .front()
                .is_some_and(|p| !p.io || p.id <= self.synced_upto)
            {
                let p = self.pending.pop_front().expect("front");
                for w in &p.written {
                    if self.unsynced.get(&w.0) == Some(&p.id) {
                        self.unsynced.remove(&w.0);
                    }
                }
                if !p.written.is_empty() {
                    self.replica.persisted(self.host.now(), &p.written);
                }
                self.run_actions(p.actions);
                ran = true;
            }
            let actions = self.replica.take_actions();
            if actions.is_empty() && !ran {
                break;
            }
            // Writes and hard-state saves go to the IO task in order; a leader's Append
            // goes out at once, so followers write while this node syncs (the replica's
            // first exception: it promises nothing about this disk); results run at once
            // too (the second exception), and so does an apply whose own entry is on
            // disk; everything else waits for the batch's writes and all before them.
            let mut ops = Vec::new();
            let mut written = Vec::new();
            let mut waiting = Vec::new();
            let mut now_actions = Vec::new();
            let id = self.next_id + 1;
            for a in actions {
                match a {
                    Action::Write(e) => {
                        self.c.writes += 1;
                        self.unsynced.insert(e.seq, id);
                        written.push((e.seq, e.eid, e.term));
                        ops.push(IoOp::Write(e));
                    }
                    Action::SaveHard(h) => {
                        self.c.hard_saves += 1;
                        ops.push(IoOp::Hard(h));
                    }
                    Action::SaveMembership(m) => ops.push(IoOp::Members(m)),
                    Action::Compact { live, .. } => ops.push(IoOp::Compact(live)),
                    Action::Send {
                        to,
                        msg: msg @ Msg::Append { .. },
                    } => {
                        if let Msg::Append { entries, .. } = &msg {
                            self.clock
                                .sent(to, entries.iter().map(|e| e.seq), Instant::now());
                        }
                        self.send(to, &msg)
                    }
                    // Outcomes rest on durable copies only: the writer hears at once, not
                    // after this batch's fsync of other appends. An Apply waits for its
                    // own entry's write only (the state machine must never hold what this
                    // disk could lose).
                    a @ (Action::Result { .. } | Action::Unknown { .. }) => now_actions.push(a),
                    Action::Apply(e) if !self.unsynced.contains_key(&e.seq) => {
                        now_actions.push(Action::Apply(e))
                    }
                    other => {
                        // A new role or term: what was sent before is acknowledged to a
                        // leader that no longer asks.
                        if matches!(other, Action::Role { .. }) {
                            self.clock = AckClock::default();
                        }
                        waiting.push(other)
                    }
                }
            }
            if !now_actions.is_empty() {
                self.run_actions(now_actions);
            }
            if ops.is_empty() && waiting.is_empty() {
                continue;
            }
            // A batch without writes behind an empty queue runs at the top of the next
            // round.
            self.next_id = id;
            let io = !ops.is_empty();
            if io {
                self.host.io(id, ops);
                self.io_sent = id;
            }
            #[cfg(feature = "broken")]
            let io = io && !self.set.broken_ack_before_sync;
            self.pending.push_back(Pending {
                id,
                io,
                written,
                actions: waiting,
            });
        }
    }

    /// Runs actions whose writes are durable: sends, results and applies (inline when
    /// there is no apply pool, reporting each applied slot to the replica); images are
    /// taken and installed on the apply workers, which report back as events.
    fn run_actions(&mut self, actions: Vec<Action>) {
        let mut applied = Vec::new();
        for a in actions {
            if let Action::Result {
                eid,
                seq,
                outcome: Outcome::Committed,
            } = a
            {
                #[cfg(feature = "broken")]
                let wait = !self.set.broken_ack_before_apply;
                #[cfg(not(feature = "broken"))]
                let wait = true;
                if wait && !self.applied_here(seq) {
                    // Told once the slot is applied here (`parked`).
                    self.parked.entry(seq).or_default().push(eid);
                    continue;
                }
            }
            self.host.observe(&self.replica, &a);
            match a {
                Action::Send { to, msg } => self.send(to, &msg),
                Action::Apply(e) => match &self.apply {
                    Some(ctx) => ctx.submit(e),
                    None => match apply_entry(&*self.sm, &e) {
                        Ok(()) => {
                            self.c.applied += 1;
                            applied.push(e.seq);
                        }
                        Err(err) => self.host.jobs().post(Ev::SmFailed(err)),
                    },
                },
                Action::Snapshot { to } => {
                    // Read before the image is taken, so the image covers it; the scope is
                    // what the follower lacks below that head.
                    let base = self.replica.applied_head();
                    let scope = self.replica.image_scope(to);
                    let sm = self.sm.clone();
                    self.host.jobs().job(move || {
                        let part = match &scope {
                            Some((from, f)) => {
                                guarded(|| sm.image_part(f)).map(|i| i.map(|i| (*from, i)))
                            }
                            None => Ok(None),
                        };
                        match part {
                            Ok(Some((from, image))) => Ev::Image {
                                to,
                                base,
                                part: Some(from),
                                image,
                            },
                            Ok(None) => match guarded(|| sm.image()) {
                                Ok(image) => Ev::Image {
                                    to,
                                    base,
                                    part: None,
                                    image,
                                },
                                Err(e) => Ev::SmFailed(format!("taking an image: {e}")),
                            },
                            Err(e) => Ev::SmFailed(format!("taking a partial image: {e}")),
                        }
                    });
                }
                Action::Install { base, image, part } => {
                    let sm = self.sm.clone();
                    self.host.jobs().job(move || {
                        let done = guarded(|| {
                            if part {
                                sm.restore_part(&image)
                            } else {
                                sm.restore(&image)
                            }
                        });
                        match done {
                            Ok(()) => Ev::Installed(base, part),
                            Err(e) => Ev::InstallFailed(base, e.to_string()),
                        }
                    });
                }
                Action::Unknown { eid, seq } => {
                    for w in self.waiters.remove(&eid).unwrap_or_default() {
                        w.send(Err(OooNodeError::Unknown { seq }));
                    }
                }
                Action::Result { eid, seq, outcome } => self.answer(eid, seq, outcome),
                Action::Write(_)
                | Action::SaveHard(_)
                | Action::SaveMembership(_)
                | Action::Compact { .. }
                | Action::Committed(_)
                | Action::Role { .. }
                | Action::Serving { .. } => {}
            }
        }
        for s in applied {
            if self.replica.applied(s).is_ok() {
                self.note_applied(s);
            }
        }
    }

    /// The driver stops: whatever is still waiting learns that its result is unknown.
    pub fn fail_waiters(&mut self) {
        let waiters = std::mem::take(&mut self.waiters);
        let staged = std::mem::take(&mut self.staged);
        for w in waiters
            .into_values()
            .flatten()
            .chain(staged.into_iter().map(|s| s.1))
        {
            w.send(Err(OooNodeError::Stopped));
        }
        self.staged_since = None;
    }
}

/// Packs the records taken this round into group entries ([`group::split`] bounds them)
/// and appends each with the union of its records' declarations; a refused group's
/// writers hear why. Records that would wait to commit for an uncommitted entry, or in
/// dependent mode on some replica to apply after a writer of their keys it has not
/// applied ([`OooReplica::packs_last`]), go into entries after the others
/// ([`group::waiting_last`]), so that one of them does not hold back the commit or the
/// followers' apply of a whole group of writers that need not wait.
fn append_groups(
    replica: &mut OooReplica,
    mode: Mode,
    now: u64,
    staged: &mut Vec<(Record, Reply)>,
    waiters: &mut HashMap<u64, Vec<Reply>>,
    c: &mut OooCounters,
    lat: &OooLatency,
) {
    let (_, waiting) =
        group::waiting_last(staged.iter().map(|s| &s.0.declared), replica.packs_last());
    let mut wait = vec![false; staged.len()];
    for i in waiting {
        wait[i] = true;
    }
    let (free, waiting): (Vec<_>, Vec<_>) = std::mem::take(staged)
        .into_iter()
        .zip(wait)
        .partition(|(_, w)| !w);
    for part in [free, waiting] {
        let lens = group::split(part.iter().map(|s| s.0 .0.data.len()));
        let mut rest = part.into_iter().map(|(s, _)| s);
        for n in lens {
            let (records, replies): (Vec<Record>, Vec<Reply>) = rest.by_ref().take(n).unzip();
            let declared = group::union(mode, &records);
            match replica.append(now, declared, encode_group(&records)) {
                Ok(t) => {
                    c.appends += n as u64;
                    c.groups += 1;
                    let packed = Instant::now();
                    for r in &replies {
                        lat.queue
                            .record(packed.duration_since(r.since).as_nanos() as u64);
                    }
                    waiters.insert(t.eid, replies);
                }
                // The group is refused whole (not the leader, or the window is full): each
                // of its writers hears why.
                Err(e) => {
                    for r in replies {
                        r.send(Err(e.clone().into()));
                    }
                }
            }
        }
    }
}
