//! The simulated cluster: nodes running the production driver, the seeded network, the
//! event queue, crashes and restarts, the clients and the operators.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use chorus_core::format::meta::NodeId;
use chorus_core::format::ooo::{decode_entry, encode_group, entry_len};
use chorus_core::ooo::group::{self, Record};
use chorus_core::ooo::parallel::BlockRange;
use chorus_core::ooo::replica::{
    Declared, Entry, Hard, Membership, Mode, Msg, OooConfig, OooMembershipChange, OooReplica,
    Ticket,
};
use chorus_core::ooo::Seq;
use chorus_core::replica::{Nanos, Outcome};
use chorus_core::rng::Rng;
use chorus_runtime::ooo::driver::{self, Driver, DriverOutputs, DriverSettings};
use chorus_runtime::ooo::io::{run_io, IoOp};
use chorus_runtime::ooo::{Ev as DriverEv, OooCounters, OooLatency};
use chorus_storage::fs::{CrashMode, FileSystem, SimFs};
use chorus_storage::ooo::OooStore;

use super::host::{Seen, SimHost};
use super::sm::{decode_txn, encode_txn, mix, writes, Image, SimSm};
use super::OooOptions;
use crate::MS;

/// The group directory on every node's simulated disk.
const DIR: &str = "/ooo";

/// Simulator events.
#[derive(Debug)]
pub(super) enum Ev {
    Deliver {
        from: NodeId,
        to: NodeId,
        msg: Msg,
    },
    /// The node's driver is due (its tick, a freeze deadline or a timed resend), as the
    /// environment's timer wakes it; for the incarnation given.
    Wake(NodeId, u64),
    /// The node's IO side runs the batches handed to it.
    Io(NodeId, u64),
    /// The node's state-machine workers run the queued jobs.
    Jobs(NodeId, u64),
    Client,
    Crash(NodeId),
    Restart(NodeId),
    Partition(NodeId),
    Heal,
    /// An operator's leader transfer.
    Transfer,
    /// An operator's membership change.
    Change,
    /// An operator's trim: one node checkpoints and compacts below a slot
    /// ([`chorus_runtime::ooo::OooNode::compact`], the Trim RPC of an out-of-order group).
    Compact,
}

/// One simulated node.
pub(super) struct Node {
    // Durable.
    /// The node's disk, and the real store on it (None while down).
    pub fs: Arc<SimFs>,
    pub store: Option<OooStore>,
    /// The state machine's durable image (a checkpoint or an installed snapshot).
    pub image: Arc<Mutex<Image>>,
    // Volatile.
    /// The production driver around the replica (None while down).
    pub driver: Option<Driver<SimHost>>,
    /// The state machine the driver calls (None while down).
    pub sm: Option<Arc<SimSm>>,
    /// IO batches handed to the IO side and not run yet, in order.
    pub io: Vec<(u64, Vec<IoOp>)>,
    /// An [`Ev::Io`] is scheduled.
    pub io_due: bool,
    /// An [`Ev::Jobs`] is scheduled.
    pub jobs_due: bool,
    /// When the scheduled [`Ev::Wake`] falls due.
    pub wake: Option<Nanos>,
    /// Why the driver stopped, once a failure stopped it.
    pub why: Arc<OnceLock<String>>,
    /// Bumped at each crash: events of an earlier incarnation are dropped.
    pub incarnation: u64,
    pub cut: bool,
}

impl Node {
    /// The replica, while the node is up.
    pub fn replica(&self) -> Option<&OooReplica> {
        self.driver.as_ref().map(|d| d.replica())
    }
}

/// The simulated cluster and what the checkers have observed. Invariants: a node's
/// `driver`, `sm` and `store` are all Some or all None; every event queued is in
/// `events` at the index the heap names.
pub(super) struct Sim {
    pub o: OooOptions,
    pub seed: u64,
    pub rng: Rng,
    pub now: Nanos,
    /// The simulated time as the drivers read it (`now`, published before each round).
    clock: Arc<AtomicU64>,
    queue: BinaryHeap<Reverse<(Nanos, u64, usize)>>,
    events: Vec<Option<Ev>>,
    counter: u64,
    pub nodes: BTreeMap<NodeId, Node>,
    pub faults_on: bool,
    /// The committed log as first observed: slot -> entry.
    pub committed: BTreeMap<Seq, Entry>,
    /// Appends: eid -> (node, incarnation, slot, result, ended Unknown).
    pub appends: HashMap<u64, (NodeId, u64, Seq, Option<Outcome>, bool)>,
    /// The keys (blocks or keys) each entry written by some node writes, by slot and
    /// entry id, until its result is checked (`check_applied_before_told`).
    pub written: HashMap<(Seq, u64), Vec<u64>>,
    /// Conflict order: appends without a result yet, by (term, slot): (eid, blocks).
    pub open: BTreeMap<(u64, Seq), (u64, Vec<BlockRange>)>,
    /// Conflict order: every append admitted, by (term, slot): (eid, blocks), for the
    /// end-of-seed check across leader changes.
    pub admitted: BTreeMap<(u64, Seq), (u64, Vec<BlockRange>)>,
    pub violations: Vec<String>,
    pub stats: BTreeMap<&'static str, u64>,
    /// Draws of the leader transfers, apart from `rng` (so that turning transfers off
    /// leaves every other draw where it was).
    trng: Rng,
    /// The last transfer asked: (from, to, the leader's term then).
    pub last_transfer: Option<(NodeId, NodeId, u64)>,
    /// Draws of the membership changes, apart from `rng`.
    crng: Rng,
    /// Draws of the storage faults at rest, apart from `rng`.
    drng: Rng,
    /// Draws of the operators' trims, apart from `rng`.
    krng: Rng,
    /// Draws of the late messages ([`OooOptions::late_messages`]), apart from `rng`.
    lrng: Rng,
    /// Trims asked and not answered yet: the node, the slot asked, the answer's channel.
    trims: Vec<(NodeId, Seq, std::sync::mpsc::Receiver<u64>)>,
    /// Nodes given damage not yet seen recovered (at most one at a time: a second
    /// damaged copy could be the majority of some committed slot's copies, and then
    /// halting is the right answer, not a finding).
    lost: BTreeSet<NodeId>,
    /// Print roles, memberships and crashes to stderr (`CHORUS_SIM_TRACE` set).
    pub trace: bool,
}

impl Sim {
    /// See [`OooOptions::preallocate`].
    fn preallocate(&self) -> u64 {
        self.o
            .preallocate
            .unwrap_or_else(|| crate::preallocate_by_seed(self.seed))
    }

    pub fn new(seed: u64, o: OooOptions) -> Self {
        let mut s = Self {
            seed,
            rng: Rng::new(seed),
            now: 0,
            clock: Arc::new(AtomicU64::new(0)),
            queue: BinaryHeap::new(),
            events: Vec::new(),
            counter: 0,
            nodes: BTreeMap::new(),
            faults_on: o.faults,
            committed: BTreeMap::new(),
            appends: HashMap::new(),
            written: HashMap::new(),
            open: BTreeMap::new(),
            admitted: BTreeMap::new(),
            violations: Vec::new(),
            stats: BTreeMap::new(),
            trng: Rng::new(seed ^ 0x5452_414e_5346_4552),
            last_transfer: None,
            crng: Rng::new(seed ^ 0x4348_414e_4745_5321),
            drng: Rng::new(seed ^ 0x4441_4d41_4745_4421),
            krng: Rng::new(seed ^ 0x5452_494d_5452_494d),
            lrng: Rng::new(seed ^ 0x4c41_5445_4d53_4753),
            trims: Vec::new(),
            lost: BTreeSet::new(),
            trace: std::env::var_os("CHORUS_SIM_TRACE").is_some(),
            o,
        };
        for id in 1..=s.node_count() as NodeId {
            let fs = Arc::new(SimFs::new(mix(seed, id)));
            s.nodes.insert(
                id,
                Node {
                    fs,
                    store: None,
                    image: Arc::new(Mutex::new(Image::new())),
                    driver: None,
                    sm: None,
                    io: Vec::new(),
                    io_due: false,
                    jobs_due: false,
                    wake: None,
                    why: Arc::new(OnceLock::new()),
                    incarnation: 0,
                    cut: false,
                },
            );
        }
        for id in 1..=s.node_count() as NodeId {
            s.restart(id);
        }
        if s.o.client {
            s.at(MS, Ev::Client);
        }
        if s.o.transfers {
            let mut t = 300 * MS;
            while t < s.o.fault_time {
                s.at(t, Ev::Transfer);
                t += 200 * MS + s.trng.below(500 * MS);
            }
        }
        if s.o.trims {
            let mut t = 250 * MS;
            while t < s.o.fault_time {
                s.at(t, Ev::Compact);
                t += 300 * MS + s.krng.below(600 * MS);
            }
        }
        if s.o.changes {
            let mut t = 400 * MS;
            while t < s.o.fault_time {
                s.at(t, Ev::Change);
                t += 300 * MS + s.crng.below(500 * MS);
            }
        }
        s
    }

    /// Voters plus the spare node when membership changes are on.
    pub fn node_count(&self) -> usize {
        self.o.voters + usize::from(self.o.changes)
    }

    /// The serving leader, if any, with its term.
    fn serving(&self) -> Option<(NodeId, u64)> {
        self.nodes.iter().find_map(|(&id, n)| {
            n.replica()
                .filter(|r| r.is_serving())
                .map(|r| (id, r.term()))
        })
    }

    fn replica_mut(&mut self, id: NodeId) -> Option<&mut OooReplica> {
        self.nodes
            .get_mut(&id)
            .and_then(|n| n.driver.as_mut())
            .map(|d| d.replica_mut())
    }

    /// An operator asks the serving leader, if there is one, to change the voters: add
    /// the node that is not a voter, remove one, or replace one with it (three or four
    /// voters kept).
    fn change(&mut self) {
        let Some((id, _)) = self.serving() else {
            return;
        };
        let voters = self.nodes[&id]
            .replica()
            .expect("serving")
            .membership()
            .voters
            .clone();
        let outside: Vec<NodeId> = (1..=self.node_count() as NodeId)
            .filter(|n| !voters.contains(n))
            .collect();
        let pick = |rng: &mut Rng, v: &[NodeId]| v[rng.below(v.len() as u64) as usize];
        let change = match (voters.len(), outside.is_empty()) {
            (n, false) if n < 3 || (n == 3 && self.crng.chance(1, 2)) => {
                OooMembershipChange::AddVoter(pick(&mut self.crng, &outside))
            }
            (3, false) => OooMembershipChange::Replace {
                remove: pick(&mut self.crng, &voters),
                add: pick(&mut self.crng, &outside),
            },
            _ => OooMembershipChange::Remove(pick(&mut self.crng, &voters)),
        };
        let now = self.now;
        if self.trace {
            eprintln!("{:>6}us node {id} asked {change:?}", self.now / 1000);
        }
        let r = self.replica_mut(id).expect("serving");
        match r.change_membership(now, change) {
            Ok(()) => self.bump("changes_asked", 1),
            Err(chorus_core::ooo::replica::OooChangeError::InProgress { .. }) => {
                self.bump("changes_busy", 1)
            }
            Err(e) => self.violation(format!(
                "node {id}, serving, refused the change {change:?} of voters {voters:?}: {e}"
            )),
        }
        self.round(id, Vec::new());
    }

    /// An operator asks the serving leader (or, with `trim_followers`, a node drawn at
    /// random, up to its applied head) to checkpoint and compact below a slot drawn
    /// between its base and just past what every live follower holds; the answers of
    /// earlier asks are checked first. An answer is the node's base after the
    /// compaction: never past what it applied or was asked. The checkers then see the
    /// node go on from its checkpoint (its later restarts, the images it sends).
    fn trim(&mut self) {
        let asked = std::mem::take(&mut self.trims);
        for (id, upto, rx) in asked {
            match rx.try_recv() {
                Ok(base) => {
                    self.bump("trims_done", 1);
                    let applied = self.nodes[&id]
                        .replica()
                        .map_or(u64::MAX, |r| r.applied_head());
                    if base > applied.max(upto) {
                        self.violation(format!(
                            "node {id}: a trim below {upto} answered base {base}, past its applied head {applied}"
                        ));
                    }
                }
                // Not answered yet (the checkpoint runs).
                Err(std::sync::mpsc::TryRecvError::Empty) => self.trims.push((id, upto, rx)),
                // The node went down first.
                Err(std::sync::mpsc::TryRecvError::Disconnected) => self.bump("trims_lost", 1),
            }
        }
        let up: Vec<NodeId> = self
            .nodes
            .iter()
            .filter(|(_, n)| n.driver.is_some())
            .map(|(&id, _)| id)
            .collect();
        if up.is_empty() {
            return;
        }
        let id = if self.o.trim_followers {
            up[self.krng.below(up.len() as u64) as usize]
        } else {
            match self.serving() {
                Some((id, _)) => id,
                None => return,
            }
        };
        let Some((base, applied)) = self.nodes[&id].replica().map(|r| {
            let top = if self.o.trim_followers {
                r.applied_head()
            } else {
                r.compactable()
            };
            (r.base(), top)
        }) else {
            return;
        };
        let upto = base + self.krng.below(applied.saturating_sub(base) + 2);
        let (tx, rx) = std::sync::mpsc::channel();
        self.trims.push((id, upto, rx));
        self.bump("trims_asked", 1);
        self.round(id, vec![DriverEv::Compact(upto, tx)]);
    }

    /// An operator asks the serving leader, if there is one, to hand over to another
    /// voter; notes whether the previous transfer was left undone.
    fn transfer(&mut self) {
        let serving = self.serving();
        // The previous transfer, if no new term was served since: given up or still
        // under way with the old leader serving (a completion is counted at `Serving`).
        if let Some((from, _, term)) = self.last_transfer.take() {
            if serving == Some((from, term)) {
                self.bump("transfers_not_completed", 1);
            }
        }
        let Some((id, term)) = serving else {
            self.bump("transfers_no_leader", 1);
            return;
        };
        let voters = self.nodes[&id]
            .replica()
            .map(|r| r.membership().voters.clone())
            .unwrap_or_default();
        let others: Vec<NodeId> = voters.into_iter().filter(|&v| v != id).collect();
        if others.is_empty() {
            return;
        }
        let to = others[self.trng.below(others.len() as u64) as usize];
        let now = self.now;
        let r = self.replica_mut(id).expect("serving");
        match r.transfer_leader(now, to) {
            Ok(()) => {
                self.bump("transfers_asked", 1);
                self.last_transfer = Some((id, to, term));
            }
            Err(e) => self.violation(format!(
                "node {id}, serving, refused a transfer to voter {to}: {e}"
            )),
        }
        self.round(id, Vec::new());
    }

    fn config(&self, id: NodeId) -> OooConfig {
        // The spare node starts knowing no voters: it joins when a change adds it.
        let voters = if id as usize <= self.o.voters {
            (1..=self.o.voters as NodeId).collect()
        } else {
            Vec::new()
        };
        let mut c = OooConfig::new(id, voters, self.o.mode);
        c.election_timeout = 150 * MS;
        c.heartbeat_interval = 30 * MS;
        c.resend_interval = 30 * MS;
        c.window = 256;
        c.max_batch = 64;
        c.snapshot_retry = 400 * MS;
        // Half the seeds bound catch-up pieces in bytes and rate-limit streaming
        // catch-up (PolarFS section 5.4), so lagging followers catch up under the limit.
        if self.seed % 2 == 1 {
            c.max_batch_bytes = 4 << (10 + self.seed / 2 % 3);
            c.catchup_rate = 1 << (20 + self.seed / 8 % 4);
        }
        // A third of the seeds send votes in pieces of 256 B to 2 KiB, so that a voter's
        // versions past a candidate's head often take several (`Msg::VotePart`).
        if self.seed % 3 == 2 {
            c.vote_bytes = 256 << (self.seed / 3 % 4);
        }
        c.seed = mix(self.seed, id ^ self.counter << 8);
        // Hole resends after 1, 2 or 3 later acknowledgements, and off on a fifth of the
        // seeds (holes then fill on the resend interval only).
        c.hole_resend = match self.seed % 5 {
            4 => 0,
            r => 1 + r % 3,
        };
        // Timed resends after 2 or 4 median round trips, and off on a third of the seeds.
        c.timed_resend = self
            .o
            .timed_resend
            .unwrap_or([0, 2, 4][((self.seed / 32) % 3) as usize]);
        c.pre_vote = self.o.pre_vote;
        c.conflict_order =
            self.conflict_order() && !(cfg!(feature = "broken") && self.o.broken_conflict_order);
        c.partial_image_items = match self.seed % 4 {
            _ if !self.o.partial_images => 0,
            0 => 0,
            1 => 8,
            _ => 4096,
        };
        #[cfg(feature = "broken")]
        {
            c.ghost_guard = self.o.ghost_guard;
            c.cascade = !self.o.broken_cascade;
            c.trail_lists_committed = !self.o.broken_trail;
            c.lost_guard = !self.o.broken_lost_guard;
        }
        c
    }

    /// Whether this seed's replicas commit in conflict order.
    pub fn conflict_order(&self) -> bool {
        self.o.conflict_order && matches!(self.o.mode, Mode::Parallel { .. }) && self.seed % 3 == 2
    }

    /// The driver's settings on this seed: checkpoints once the entries file passes 8 to
    /// 32 KiB on the compacting seeds (two in three).
    fn settings(&self) -> DriverSettings {
        let compact = self.o.compact && !self.seed.is_multiple_of(3);
        DriverSettings {
            mode: self.o.mode,
            compact_bytes: if compact {
                8192 << (self.seed / 3 % 3)
            } else {
                0
            },
            freeze: Duration::from_millis(1),
            disk: None,
            idle_tick: driver::idle_tick(Duration::from_millis(30)),
            #[cfg(feature = "broken")]
            broken_ack_before_sync: self.o.broken_ack_before_sync,
            #[cfg(feature = "broken")]
            broken_ack_before_apply: self.o.broken_ack_before_apply,
        }
    }

    /// Queues `ev` at time `t` from outside (the volume simulation's shared faults).
    pub(super) fn inject(&mut self, t: Nanos, ev: Ev) {
        self.at(t, ev);
    }

    /// When the next queued event falls due.
    pub(super) fn next_time(&self) -> Option<Nanos> {
        self.queue.peek().map(|Reverse((t, _, _))| *t)
    }

    fn at(&mut self, t: Nanos, ev: Ev) {
        self.counter += 1;
        self.events.push(Some(ev));
        self.queue
            .push(Reverse((t, self.counter, self.events.len() - 1)));
    }

    pub fn bump(&mut self, k: &'static str, n: u64) {
        *self.stats.entry(k).or_insert(0) += n;
    }

    pub fn violation(&mut self, v: String) {
        if self.violations.len() < 20 {
            self.violations.push(format!("t={}ms: {v}", self.now / MS));
        }
    }

    fn send(&mut self, from: NodeId, to: NodeId, msg: Msg) {
        if !self.nodes.contains_key(&to) {
            return;
        }
        if self.trace {
            if let Msg::Vote { .. }
            | Msg::VoteReply { .. }
            | Msg::PreVote { .. }
            | Msg::PreVoteReply { .. } = &msg
            {
                let short = match &msg {
                    Msg::VoteReply { term, granted, .. } => {
                        format!("VoteReply {{ term: {term}, granted: {granted} }}")
                    }
                    m => format!("{m:?}"),
                };
                eprintln!("{:>6}us {from} -> {to}: {short}", self.now / 1000);
            }
        }
        let cut = self.nodes[&from].cut || self.nodes[&to].cut;
        if self.faults_on && (cut || self.rng.chance(2, 100)) {
            self.bump("messages_lost", 1);
            return;
        }
        let mut delay = 200_000
            + self
                .rng
                .below(if self.faults_on { 3 * MS } else { 300_000 });
        if self.faults_on && self.rng.chance(1, 200) {
            delay += 50 * MS;
        }
        // Held up for one to three election timeouts ([`OooOptions::late_messages`]).
        let late = match &msg {
            Msg::VoteReply { .. } | Msg::VotePart { .. } | Msg::PreVoteReply { .. } => 10,
            _ => 1000,
        };
        if self.faults_on && self.o.late_messages && self.lrng.chance(1, late) {
            delay += 150 * MS + self.lrng.below(300 * MS);
        }
        if self.faults_on && self.rng.chance(1, 100) {
            let d2 = delay + self.rng.below(5 * MS);
            self.at(
                self.now + d2,
                Ev::Deliver {
                    from,
                    to,
                    msg: msg.clone(),
                },
            );
        }
        self.at(self.now + delay, Ev::Deliver { from, to, msg });
    }

    /// Runs one round of the node's driver with `events`, then carries out what it
    /// handed its host: messages go on the network, IO batches and jobs are scheduled,
    /// the checkers see the actions it ran, and its next wake-up is scheduled. With
    /// faults on, the node may crash right after the round (its sends gone out, its
    /// writes not on disk).
    pub fn round(&mut self, id: NodeId, events: Vec<DriverEv>) {
        self.clock.store(self.now, Ordering::Relaxed);
        let Some(d) = self.nodes.get_mut(&id).and_then(|n| n.driver.as_mut()) else {
            return;
        };
        d.round(events);
        let wake = d.wake_at();
        let failed = d.failed();
        let host = d.host_mut();
        let sent = std::mem::take(&mut host.sent);
        let io = std::mem::take(&mut host.io);
        let seen = std::mem::take(&mut host.seen);
        let jobs = {
            let q = host.jobs.lock();
            !q.queued.is_empty() || !q.posted.is_empty()
        };
        for s in seen {
            self.observe(id, s);
        }
        for (to, msg) in sent {
            self.send(id, to, msg);
        }
        for (_, ops) in &io {
            for op in ops {
                match op {
                    IoOp::Write(e) => {
                        self.bump("writes", 1);
                        if !e.is_null() {
                            self.written
                                .entry((e.seq, e.eid))
                                .or_insert_with(|| writes(e).into_iter().map(|(k, _)| k).collect());
                        }
                    }
                    IoOp::Hard(_) => self.bump("hard_saves", 1),
                    IoOp::Members(_) => self.bump("memberships_saved", 1),
                    IoOp::Compact(_) => self.bump("compactions", 1),
                }
            }
        }
        let now = self.now;
        let n = self.nodes.get_mut(&id).expect("node");
        let inc = n.incarnation;
        let io_at = (!io.is_empty() && !n.io_due).then(|| n.io_due = true);
        n.io.extend(io);
        let jobs_at = (jobs && !n.jobs_due).then(|| n.jobs_due = true);
        let wake_at = n.wake.is_none_or(|w| wake < w).then(|| {
            n.wake = Some(wake);
        });
        if io_at.is_some() {
            let t = now + 50_000 + self.rng.below(MS);
            self.at(t, Ev::Io(id, inc));
        }
        if jobs_at.is_some() {
            let t = now + 20_000 + self.rng.below(500_000);
            self.at(t, Ev::Jobs(id, inc));
        }
        if wake_at.is_some() {
            self.at(wake.max(now), Ev::Wake(id, inc));
        }
        if failed {
            let why = self.nodes[&id].why.get().cloned().unwrap_or_default();
            self.violation(format!("node {id}: the driver stopped: {why}"));
            self.crash(id);
        } else if self.faults_on && self.rng.chance(1, 400) {
            self.bump("crashes_after_round", 1);
            self.crash(id);
        }
    }

    /// The IO side runs every batch handed to it, in order, and reports them durable;
    /// with faults on it may crash in the middle (the batches before the cut written,
    /// none reported).
    fn run_io(&mut self, id: NodeId) {
        let cut = self.faults_on && self.rng.chance(1, 200);
        let n = self.nodes.get_mut(&id).expect("node");
        n.io_due = false;
        let mut batches = std::mem::take(&mut n.io);
        if cut {
            let keep = self.rng.below(batches.len() as u64 + 1) as usize;
            batches.truncate(keep);
        }
        let n = self.nodes.get_mut(&id).expect("node");
        let Some(store) = n.store.as_mut() else {
            return;
        };
        let done = run_io(store, batches, None);
        if cut {
            self.bump("crashes_in_io", 1);
            self.crash(id);
            return;
        }
        match done {
            None => {}
            Some(Ok(d)) => {
                self.bump("syncs", d.syncs);
                self.round(
                    id,
                    vec![DriverEv::Synced {
                        upto: d.upto,
                        syncs: d.syncs,
                        len: d.len,
                    }],
                );
            }
            Some(Err(e)) => {
                self.violation(format!("node {id}: the store failed: {e}"));
                self.crash(id);
            }
        }
    }

    /// The state-machine workers run every queued job (and the pieces they submit) in a
    /// random order; the checkers look at what they report, and the driver takes it in
    /// one round.
    fn run_jobs(&mut self, id: NodeId) {
        let n = self.nodes.get_mut(&id).expect("node");
        n.jobs_due = false;
        let Some(jobs) = n.driver.as_ref().map(|d| d.host().jobs.clone()) else {
            return;
        };
        let mut posted = Vec::new();
        // Bounded: a job submits at most the other pieces of its entry.
        for _ in 0..100_000 {
            let job = {
                let mut q = jobs.lock();
                posted.append(&mut q.posted);
                if q.queued.is_empty() {
                    break;
                }
                let i = self.rng.below(q.queued.len() as u64) as usize;
                q.queued.swap_remove(i)
            };
            job();
        }
        let mut events = Vec::with_capacity(posted.len());
        for ev in posted {
            self.job_done(id, &ev);
            events.push(ev);
        }
        self.round(id, events);
    }

    /// What the checkers make of a job's report.
    fn job_done(&mut self, id: NodeId, ev: &DriverEv) {
        let sm = self.nodes[&id].sm.clone().expect("live");
        let found: Vec<String> = std::mem::take(&mut sm.vol().violations);
        for v in found {
            self.violation(v);
        }
        match *ev {
            DriverEv::Applied(_) => self.bump("applied", 1),
            DriverEv::Checkpointed(_) => self.bump("checkpoints", 1),
            DriverEv::Image { part, .. } => {
                self.bump("images_taken", 1);
                if part.is_some() {
                    self.bump("images_partial", 1);
                }
            }
            DriverEv::Installed(base, part) => {
                self.bump("images_installed", 1);
                if part {
                    self.bump("partial_installs", 1);
                }
                sm.installed(base);
                self.check_installed(id, base, part);
            }
            DriverEv::InstallFailed(base, ref e) => self.violation(format!(
                "node {id}: the image with base {base} was refused: {e}"
            )),
            DriverEv::SmFailed(ref e) => {
                self.violation(format!("node {id}: the state machine failed: {e}"))
            }
            _ => {}
        }
    }

    /// The checkers' view of an action the driver ran.
    fn observe(&mut self, id: NodeId, s: Seen) {
        match s {
            Seen::Committed(e) => self.observe_commit(id, e),
            Seen::Result {
                eid,
                seq,
                outcome,
                term,
            } => {
                if outcome == Outcome::Committed {
                    self.check_applied_before_told(id, eid, seq);
                }
                self.observe_result(id, eid, seq, outcome, term)
            }
            Seen::Unknown { eid, seq } => {
                self.open.remove(&(eid >> 32, seq));
                self.bump("unknown_results", 1);
                match self.appends.get_mut(&eid) {
                    Some(a) if a.3.is_none() && a.2 == seq => a.4 = true,
                    _ => self.violation(format!(
                        "node {id}: append {eid:#x} at slot {seq} ended Unknown after a result, or is not known"
                    )),
                }
            }
            Seen::Role(what) => {
                if self.trace {
                    eprintln!("{:>6}us node {id} {what}", self.now / 1000);
                }
            }
            Seen::Serving { term, start, head } => {
                self.bump("terms_served", 1);
                if self.trace {
                    eprintln!("{:>6}us node {id} serves term {term}", self.now / 1000);
                }
                // The first term served after a transfer was asked: its target's, or not.
                if let Some((_, to, t)) = self.last_transfer {
                    if term > t {
                        if id == to {
                            self.bump("transfers_completed", 1);
                        }
                        self.last_transfer = None;
                    }
                }
                if head < start {
                    self.violation(format!(
                        "node {id} serves term {term} from slot {start} with slots from {head} uncommitted"
                    ));
                }
            }
            Seen::SnapshotAsked => self.bump("images_asked", 1),
        }
    }

    pub fn crash(&mut self, id: NodeId) {
        if self.crash_only(id) {
            let t = self.now + 20 * MS + self.rng.below(300 * MS);
            self.at(t, Ev::Restart(id));
        }
    }

    /// Crashes the node as [`Sim::crash`] does, without scheduling its restart (whoever
    /// crashed it does, [`Sim::inject`]); false if it was down already.
    pub(super) fn crash_only(&mut self, id: NodeId) -> bool {
        let n = self.nodes.get_mut(&id).expect("node");
        if self.trace {
            eprintln!("{:>6}us node {id} crashes", self.now / 1000);
        }
        if n.driver.take().is_some() {
            // Unsynced writes are lost, the last one possibly torn; the queued IO and
            // jobs go with the process.
            n.store = None;
            n.sm = None;
            n.io.clear();
            n.io_due = false;
            n.jobs_due = false;
            n.wake = None;
            n.fs.crash(CrashMode::Prefix);
            n.incarnation += 1;
            self.bump("crashes", 1);
            return true;
        }
        false
    }

    /// Starts the node's driver from what its disk recovers (as `OooNode::start` does).
    pub fn restart(&mut self, id: NodeId) {
        if self.nodes[&id].driver.is_some() {
            return;
        }
        let cfg = self.config(id);
        let first = self.now == 0;
        if !first {
            self.maybe_corrupt(id);
        }
        let preallocate = self.preallocate();
        let n = self.nodes.get_mut(&id).expect("node");
        let fs: Arc<dyn FileSystem> = n.fs.clone();
        let (mut store, mut hard, entries, rec) =
            match OooStore::open_tolerating_damage(fs, Path::new(DIR)) {
                Ok(x) => x,
                Err(e) => {
                    self.violation(format!("node {id}: the store does not reopen: {e}"));
                    return;
                }
            };
        store.set_preallocate(preallocate);
        // Direct IO on odd seeds, the page cache on even ones (as the ordered log).
        store.set_direct_io(self.seed % 2 == 1);
        let members: Option<Membership> = match store.load_membership() {
            Ok(m) => m,
            Err(e) => {
                self.violation(format!("node {id}: the membership does not load: {e}"));
                return;
            }
        };
        if !rec.damaged.is_empty() {
            // What the runtime does: the loss saved, then the damage dropped.
            hard = hard.after_loss();
            let saved = store
                .save_hard(&hard)
                .and_then(|()| store.compact(&entries));
            if let Err(e) = saved {
                self.violation(format!("node {id}: recovering from damage: {e}"));
                return;
            }
            self.bump("damaged_opens", 1);
            if self.trace {
                eprintln!("{:>6}us node {id} lost entries", self.now / 1000);
            }
        }
        self.bump("torn_bytes", rec.torn_bytes);
        let replica = if first {
            OooReplica::new(cfg, self.now)
        } else {
            OooReplica::recover(cfg, hard, members, entries, self.now)
        };
        if replica.is_recovering_lost() {
            self.lost.insert(id);
        }
        self.start_driver(id, replica, store, &hard);
        self.round(id, Vec::new());
    }

    fn start_driver(&mut self, id: NodeId, replica: OooReplica, store: OooStore, hard: &Hard) {
        let settings = self.settings();
        // One seed in four applies inline, the others on the job queue in one to three
        // pieces.
        let pieces = (self.seed / 4 % 4) as usize;
        let peers: HashSet<NodeId> = (1..=self.node_count() as NodeId)
            .filter(|&p| p != id)
            .collect();
        let n = self.nodes.get_mut(&id).expect("node");
        let sm = Arc::new(SimSm::open(id, n.image.clone(), hard.base));
        let committed = tokio::sync::watch::Sender::new(replica.committed_head());
        let role = tokio::sync::watch::Sender::new(chorus_runtime::ooo::OooRole::of(&replica));
        let log_bytes = store.len();
        n.why = Arc::new(OnceLock::new());
        let d = Driver::new(
            replica,
            settings,
            SimHost::new(self.clock.clone()),
            peers.clone(),
            sm.clone(),
            pieces,
            DriverOutputs {
                why: n.why.clone(),
                committed,
                role,
                lat: Arc::new(OooLatency::new(peers)),
            },
            OooCounters::default(),
            log_bytes,
        );
        n.driver = Some(d);
        n.sm = Some(sm);
        n.store = Some(store);
    }

    /// During the fault time, on an eighth of restarts ([`OooOptions::corrupt`]) and
    /// while no other node is recovering lost entries: flips a bit in a synced entry
    /// record of the (down) node's file that valid records follow — damage at rest that
    /// recovery cannot take for a torn tail.
    fn maybe_corrupt(&mut self, id: NodeId) {
        if !(self.o.corrupt && self.faults_on && self.drng.chance(1, 8)) {
            return;
        }
        // Nodes seen recovered (or no longer members) count no more.
        let nodes = &self.nodes;
        self.lost
            .retain(|d| nodes[d].replica().is_none_or(|r| r.is_recovering_lost()));
        if self.lost.iter().any(|&d| d != id) {
            return;
        }
        let n = &self.nodes[&id];
        let path = Path::new(DIR).join("entries.log");
        let Ok(data) = n.fs.durable_content(&path) else {
            return;
        };
        let mut records = Vec::new();
        let mut at = 0;
        while at < data.len() {
            match entry_len(&data[at..]) {
                Ok(len) if at + len <= data.len() && decode_entry(&data[at..at + len]).is_ok() => {
                    records.push((at, len));
                    at += len;
                }
                _ => break,
            }
        }
        if records.len() < 2 || at != data.len() {
            return;
        }
        let (off, len) = records[self.drng.below(records.len() as u64 - 1) as usize];
        if n.fs.flip_bits(&path, off as u64, len as u64, 1).is_ok() {
            self.bump("corruptions", 1);
        }
    }

    /// Clients append to the serving leader: bursts of 1–4 entries, each a group of 1–3
    /// records (parallel: a token written to 1–4 blocks; dependent: a transaction
    /// executed against the leader's state and its admitted, unapplied writes).
    fn client(&mut self) {
        // The last second is quiet, so that everything in flight can end.
        if self.now + 1_000 * MS > self.o.fault_time + self.o.settle_time {
            return;
        }
        let Some((id, _)) = self.serving() else {
            return;
        };
        let inflight = self.nodes[&id].replica().map_or(0, |r| r.pending());
        let burst = 1 + self.rng.below(4);
        // Half the bursts reach the leader before it runs a round (as a driver that takes
        // every queued append first): their entries leave in one message per follower.
        let together = self.rng.chance(1, 2);
        for _ in 0..burst {
            let live = self.nodes[&id].replica().is_some_and(|r| r.is_serving());
            if inflight >= self.o.inflight || !live {
                break;
            }
            let recs = self.records(id);
            // As the runtime does (`group::waiting_last`): records that would wait to
            // commit, or to apply on some replica (`OooReplica::packs_last`), go into an
            // entry after the others, conflicting records in order.
            let parts: Vec<Vec<Record>> = {
                let r = self.nodes[&id].replica().expect("serving");
                let (free, waiting) =
                    group::waiting_last(recs.iter().map(|x| &x.declared), r.packs_last());
                if free.is_empty() || waiting.is_empty() {
                    vec![recs]
                } else {
                    self.bump("groups_split", 1);
                    let pick = |ix: &[usize]| ix.iter().map(|&i| recs[i].clone()).collect();
                    vec![pick(&free), pick(&waiting)]
                }
            };
            let mut refused = false;
            for part in parts {
                if !self.append(id, part) {
                    refused = true;
                    break;
                }
            }
            if refused {
                break;
            }
            if !together {
                self.round(id, Vec::new());
            }
        }
        if together {
            self.round(id, Vec::new());
        }
    }

    /// A group of 1–3 records (half of them 1) for the leader `id`.
    fn records(&mut self, id: NodeId) -> Vec<Record> {
        let space = self.o.space.max(8);
        let size = if self.rng.chance(1, 2) {
            1
        } else {
            2 + self.rng.below(2)
        };
        // A transaction of the group reads what the records before it in the group
        // wrote (the leader executes them in order).
        let mut own: HashMap<u64, u64> = HashMap::new();
        // The leader's committed, unapplied writes, read once for the group (its state
        // does not change while the group is drawn).
        let unapplied = match self.o.mode {
            Mode::Dependent => self.unapplied_writes(id),
            Mode::Parallel { .. } => HashMap::new(),
        };
        let mut recs = Vec::new();
        for _ in 0..size {
            recs.push(match self.o.mode {
                Mode::Parallel { .. } => {
                    let len = 1 + self.rng.below(4);
                    let start = self.rng.below(space - len);
                    let token = self.rng.next_u64();
                    Record {
                        declared: Declared::Blocks(vec![
                            BlockRange::new(start, len).expect("non-empty")
                        ]),
                        data: token.to_le_bytes().to_vec(),
                    }
                }
                Mode::Dependent => {
                    let rk = self.rng.below(space);
                    let wk = self.rng.below(space);
                    let rv = match own.get(&rk) {
                        Some(&v) => v,
                        None => self.leader_reads(id, rk, &unapplied),
                    };
                    let wv = mix(rv, self.rng.next_u64());
                    own.insert(wk, wv);
                    Record {
                        declared: Declared::Txn {
                            read_set: vec![rk],
                            write_set: vec![wk],
                        },
                        data: encode_txn(rk, rv, wk, wv),
                    }
                }
            });
        }
        recs
    }

    /// The writes of the entries the leader `id` holds committed from its applied head
    /// on: each key with the latest slot among them that writes it, and the value.
    fn unapplied_writes(&self, id: NodeId) -> HashMap<u64, (Seq, u64)> {
        let mut out = HashMap::new();
        let Some(r) = self.nodes[&id].replica() else {
            return out;
        };
        for e in r
            .read_committed(r.applied_head(), usize::MAX)
            .unwrap_or_default()
        {
            for (k, x) in writes(&e) {
                out.insert(k, (e.seq, x));
            }
        }
        out
    }

    /// What a transaction the serving leader `id` executes now reads at `key`: the write of
    /// the latest slot among those applied here, those committed here and not applied yet
    /// (`unapplied`, from [`Sim::unapplied_writes`]: applies run on the job queue, after
    /// their commit), and those this leader admitted in its term and not applied yet.
    /// Every slot it will append comes after all of them: slots below its first are
    /// committed before it serves.
    fn leader_reads(&self, id: NodeId, key: u64, unapplied: &HashMap<u64, (Seq, u64)>) -> u64 {
        let n = &self.nodes[&id];
        let (Some(r), Some(sm)) = (n.replica(), n.sm.as_ref()) else {
            return 0;
        };
        let v = sm.vol();
        let mut best: (Seq, u64) = (
            v.last_writer.get(&key).copied().unwrap_or(0),
            v.state.get(&key).copied().unwrap_or(0),
        );
        if let Some(&(s, x, t)) = v.spec.get(&key) {
            if t == r.term() && s >= best.0 {
                best = (s, x);
            }
        }
        if let Some(&(s, x)) = unapplied.get(&key) {
            if s >= best.0 {
                best = (s, x);
            }
        }
        best.1
    }

    /// Appends one group entry on the leader `id`, noting it for the checkers; false if
    /// the leader refused it.
    fn append(&mut self, id: NodeId, part: Vec<Record>) -> bool {
        let (declared, data) = (group::union(self.o.mode, &part), encode_group(&part));
        let checked = self.conflict_order();
        let blocks = match &declared {
            Declared::Blocks(b) => b.clone(),
            Declared::Txn { .. } => Vec::new(),
        };
        let Some(t) = self.append_entry(id, declared, data) else {
            return false;
        };
        let n = self.nodes.get_mut(&id).expect("node");
        if checked {
            self.admitted
                .insert((t.eid >> 32, t.seq), (t.eid, blocks.clone()));
            self.open.insert((t.eid >> 32, t.seq), (t.eid, blocks));
        }
        if self.o.mode == Mode::Dependent {
            let term = t.eid >> 32;
            let sm = n.sm.as_ref().expect("serving");
            let mut v = sm.vol();
            for r in &part {
                if let Some([_, _, wk, wv]) = decode_txn(&r.data) {
                    v.spec.insert(wk, (t.seq, wv, term));
                }
            }
        }
        self.bump("records", part.len() as u64);
        true
    }

    /// Appends one entry on the serving leader `id` and notes it for the checkers (its
    /// result lands in [`Sim::appends`]); None if the leader refused it.
    pub(super) fn append_entry(
        &mut self,
        id: NodeId,
        declared: Declared,
        data: Vec<u8>,
    ) -> Option<Ticket> {
        let now = self.now;
        let n = self.nodes.get_mut(&id).expect("node");
        let inc = n.incarnation;
        let r = n.driver.as_mut()?.replica_mut();
        let t = match r.append(now, declared, data) {
            Ok(t) => t,
            Err(_) => {
                self.bump("appends_refused", 1);
                return None;
            }
        };
        self.appends.insert(t.eid, (id, inc, t.seq, None, false));
        self.bump("appends", 1);
        Some(t)
    }

    fn live(&self, id: NodeId, inc: u64) -> bool {
        let n = &self.nodes[&id];
        n.incarnation == inc && n.driver.is_some()
    }

    pub(super) fn step(&mut self) -> bool {
        let Some(Reverse((t, _, i))) = self.queue.pop() else {
            return false;
        };
        self.now = t;
        let ev = self.events[i].take().expect("event once");
        match ev {
            Ev::Deliver { from, to, msg } => {
                if self.nodes[&to].driver.is_some() {
                    self.bump("messages", 1);
                    self.round(to, vec![DriverEv::Msg(from, msg)]);
                }
            }
            Ev::Wake(id, inc) => {
                if self.live(id, inc) && self.nodes[&id].wake.is_some_and(|w| w <= t) {
                    self.nodes.get_mut(&id).expect("node").wake = None;
                    self.round(id, Vec::new());
                }
            }
            Ev::Io(id, inc) => {
                if self.live(id, inc) {
                    self.run_io(id);
                }
            }
            Ev::Jobs(id, inc) => {
                if self.live(id, inc) {
                    self.run_jobs(id);
                }
            }
            Ev::Client => {
                self.client();
                let next = t + 200_000 + self.rng.below(MS);
                self.at(next, Ev::Client);
            }
            Ev::Crash(id) => self.crash(id),
            Ev::Restart(id) => self.restart(id),
            Ev::Partition(id) => {
                if self.faults_on {
                    if self.trace {
                        eprintln!("{:>6}us node {id} partitioned", self.now / 1000);
                    }
                    self.nodes.get_mut(&id).expect("node").cut = true;
                    let d = 50 * MS + self.rng.below(400 * MS);
                    self.at(t + d, Ev::Heal);
                }
            }
            Ev::Heal => {
                for n in self.nodes.values_mut() {
                    n.cut = false;
                }
            }
            Ev::Transfer => self.transfer(),
            Ev::Change => self.change(),
            Ev::Compact => self.trim(),
        }
        true
    }

    pub fn schedule_faults(&mut self) {
        let mut t = 100 * MS;
        while t < self.o.fault_time {
            t += 50 * MS + self.rng.below(300 * MS);
            let id = 1 + self.rng.below(self.node_count() as u64);
            if self.rng.chance(1, 2) {
                self.at(t, Ev::Crash(id));
            } else {
                self.at(t, Ev::Partition(id));
            }
        }
    }

    pub fn run_until(&mut self, end: Nanos) {
        while self
            .queue
            .peek()
            .is_some_and(|Reverse((t, _, _))| *t <= end)
        {
            self.step();
            if self.violations.len() >= 20 {
                return;
            }
        }
        self.now = end;
    }
}
