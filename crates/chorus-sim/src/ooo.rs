//! Seeded simulation of out-of-order groups (parallel and dependent mode).
//!
//! Every node runs the real [`OooReplica`] and the real [`OooStore`] on its own
//! fault-injecting [`SimFs`], over a seeded network (delay, jitter, loss, duplication,
//! partitions), with crashes that may cut a batch of actions anywhere — what was synced
//! before the cut survives, unsynced writes are lost and the last one may be torn — and
//! restarts from what the store recovers. Each node drives a demo state machine:
//!
//! * **parallel mode**: a block volume; each record writes a token to the blocks of its
//!   ranges (1–4 blocks of a small volume, so that writes conflict often);
//! * **dependent mode**: a key-value store in the WAL model — the leader executes each
//!   transaction (read one key, write another with a value derived from what it read)
//!   against its current state plus its admitted, not yet applied writes, then logs it;
//!   followers replay.
//!
//! Half the entries are **groups** of 2–3 records, as the runtime packs concurrent
//! appends (`chorus_core::ooo::group`): the entry declares the union of its records'
//! declarations and its records apply in their order inside it; a dependent group's
//! transactions are executed in that order too (a later one reads what an earlier one of
//! the same group wrote).
//!
//! An operator **transfers leadership** every 200–700 ms of the fault time: the serving
//! leader is asked to hand over to another voter at random, whatever the faults are doing
//! to it (`OooOptions::transfers`).
//!
//! An operator **changes the voters** every 300–800 ms of the fault time
//! (`OooOptions::changes`): the serving leader is asked to add the spare node, remove a
//! voter (itself included) or replace one with the spare, keeping three or four voters;
//! the spare starts knowing no voters and catches up from the leader. Nodes outside the
//! final membership are left out of the final checks of caught-up state.
//!
//! Applies are run in a random order within each batch the replica releases, as a driver
//! with several apply threads would.
//!
//! Two seeds in three also **compact**: from time to time a node checkpoints its state
//! machine (an image kept on its disk, surviving crashes) and compacts the slots below its
//! applied head, so a follower that falls behind a leader's base installs the leader's
//! image, streamed in pieces over the same lossy network. A restarted node starts from its
//! image and replays its log from the base. The checks, after every step and at the end:
//!
//! 1. every replica that commits a slot commits the same record there;
//! 2. every append ends at most once, Committed only if the slot committed with it, Failed
//!    only if it did not — and, after healing, every append of a live leader has ended;
//! 3. no replica applies a record after a later record that writes the same block or key
//!    (no two conflicting entries applied out of order);
//! 4. a leader announces serving only when every slot below its first new one is
//!    committed on it (it never serves before its merge completes);
//! 5. after healing, every replica's state equals the serial application of the
//!    committed log in slot order (records in group order), and (dependent mode) every
//!    committed transaction read exactly the value the serial order gives it — no dirty
//!    read of a failed write;
//! 6. (parallel seeds in conflict order) after healing, no committed entry has an earlier
//!    overlapping append of its own term whose slot committed something else — conflict
//!    order holds across leader changes, not only in what one leader reports.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap};

use chorus_core::format::meta::NodeId;
use chorus_core::format::ooo::{decode_entry, encode_group, entry_len};
use chorus_core::ooo::group::{self, Record};
use chorus_core::ooo::parallel::BlockRange;
use chorus_core::ooo::replica::{
    Action, Body, Declared, Entry, Membership, Mode, Msg, OooConfig, OooMembershipChange,
    OooReplica, OooStats,
};
use chorus_core::ooo::Seq;
use chorus_core::replica::{Nanos, Outcome};
use chorus_core::rng::Rng;

use std::path::Path;
use std::sync::Arc;

use chorus_storage::fs::{CrashMode, FileSystem, SimFs};
use chorus_storage::ooo::OooStore;

use crate::MS;

/// The group directory on every node's simulated disk.
const DIR: &str = "/ooo";

/// Settings of an out-of-order simulation.
#[derive(Clone, Debug)]
pub struct OooOptions {
    /// The mode under test.
    pub mode: Mode,
    /// Voters.
    pub voters: usize,
    /// Simulated time with faults.
    pub fault_time: Nanos,
    /// Simulated time to heal and settle afterwards.
    pub settle_time: Nanos,
    /// Inject faults at all.
    pub faults: bool,
    /// Blocks of the volume (parallel) or keys of the store (dependent).
    pub space: u64,
    /// Appends kept in flight by the clients.
    pub inflight: usize,
    /// Ghost guard on. Turning it off takes effect only in the test-only `broken` build.
    pub ghost_guard: bool,
    /// Checkpoint and compact (on the seeds not divisible by 3).
    pub compact: bool,
    /// Entries carry groups of records (half of them 2–3 records), as the runtime packs
    /// them; off, every entry is one record with its bytes as the entry's data — the
    /// trajectories of the seeds found before groups existed.
    pub groups: bool,
    /// An operator asks the serving leader to hand leadership to another voter every
    /// 200–700 ms of the fault time ([`OooReplica::transfer_leader`]), drawn from a
    /// random stream of its own; off, the trajectories of the seeds found before
    /// transfers existed replay exactly.
    pub transfers: bool,
    /// An operator changes the voters every 300–800 ms of the fault time
    /// ([`OooReplica::change_membership`]) among the voters and one spare node, drawn
    /// from a random stream of its own; off, there is no spare node and the trajectories
    /// of the seeds found before membership changes existed replay exactly.
    pub changes: bool,
    /// Replicas pre-vote before campaigning ([`OooConfig::pre_vote`]); off, the
    /// trajectories of the seeds found before pre-vote existed replay exactly.
    pub pre_vote: bool,
    /// A follower behind the leader's base may be sent a partial image (what it lacks,
    /// [`OooReplica::image_scope`]) on three seeds of four, a quarter of those under a
    /// bound of 8 items; off, only whole images, and the trajectories of the seeds found
    /// before partial images existed replay exactly.
    pub partial_images: bool,
    /// Parallel mode: replicas commit in conflict order ([`OooConfig::conflict_order`])
    /// on the seeds ≡ 2 mod 3, and every result a serving leader reports is checked
    /// against it; off, the trajectories of the seeds found before it replay exactly.
    pub conflict_order: bool,
    /// The replicas commit without conflict order while the checker expects it (takes
    /// effect only in the test-only `broken` build: the check must bite).
    pub broken_conflict_order: bool,
    /// The merge keeps entries whose listed predecessors it made NULL (takes effect only
    /// in the test-only `broken` build: the end-of-seed conflict-order check must bite).
    pub broken_cascade: bool,
    /// Dependent leaders list only uncommitted WAW writers below a trailing base (takes
    /// effect only in the test-only `broken` build: the apply-order checks must bite).
    pub broken_trail: bool,
    /// Storage faults at rest: an eighth of the restarts during the fault time first flip
    /// a bit in a synced entry record that valid records follow (one node at a time
    /// recovering what it lost), drawn from a random stream of their own; the node
    /// recovers from its peers
    /// ([`chorus_core::ooo::replica::Hard::after_loss`]). Off, the trajectories of the seeds
    /// found before it replay exactly.
    pub corrupt: bool,
    /// A replica recovering lost entries votes as if it had lost nothing (takes effect
    /// only in the test-only `broken` build: the committed-log checks must bite).
    pub broken_lost_guard: bool,
    /// Bytes of zeros every store keeps written past its end
    /// ([`OooStore::set_preallocate`]); `None` picks them by seed
    /// ([`crate::preallocate_by_seed`]); `Some(0)` gives the trajectories of the seeds
    /// found before stores wrote zeros ahead.
    pub preallocate: Option<u64>,
    /// [`OooConfig::timed_resend`] on every replica; `None` picks it by seed (`(seed / 32)
    /// % 3`: off, 2 or 4 median round trips); `Some(0)` gives the trajectories of the
    /// seeds found before timed resends existed.
    pub timed_resend: Option<u32>,
}

impl Default for OooOptions {
    fn default() -> Self {
        Self {
            mode: Mode::Parallel { span: 2 },
            voters: 3,
            fault_time: 3_000 * MS,
            settle_time: 3_000 * MS,
            faults: true,
            space: 64,
            inflight: 32,
            ghost_guard: true,
            compact: true,
            groups: true,
            transfers: true,
            changes: true,
            pre_vote: true,
            partial_images: true,
            conflict_order: true,
            broken_conflict_order: false,
            broken_cascade: false,
            broken_trail: false,
            corrupt: true,
            broken_lost_guard: false,
            preallocate: None,
            timed_resend: None,
        }
    }
}

/// Parses `parallel` or `dependent`.
pub fn parse_mode(s: &str) -> Option<Mode> {
    match s {
        "parallel" => Some(Mode::Parallel { span: 2 }),
        "dependent" => Some(Mode::Dependent),
        _ => None,
    }
}

/// What one seed did and found.
#[derive(Clone, Debug, Default)]
pub struct OooReport {
    /// The seed.
    pub seed: u64,
    /// Invariant violations (empty when the run is clean).
    pub violations: Vec<String>,
    /// Counters.
    pub stats: BTreeMap<&'static str, u64>,
}

#[derive(Debug)]
enum Ev {
    Deliver {
        from: NodeId,
        to: NodeId,
        msg: Msg,
    },
    Tick(NodeId),
    /// A tick when the leader's next timed resend falls due (`OooReplica::resend_due`), as
    /// the runtime's driver wakes for it.
    ResendTick(NodeId, Nanos),
    Client,
    Crash(NodeId),
    Restart(NodeId),
    Partition(NodeId),
    Heal,
    /// An operator's leader transfer.
    Transfer,
    /// An operator's membership change.
    Change,
}

/// A transaction's record in dependent mode: read `rk` (seeing `rv`), write `wk := wv`.
fn encode_txn(rk: u64, rv: u64, wk: u64, wv: u64) -> Vec<u8> {
    [rk, rv, wk, wv]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect()
}

fn decode_txn(d: &[u8]) -> Option<[u64; 4]> {
    if d.len() != 32 {
        return None;
    }
    let w = |i: usize| u64::from_le_bytes(d[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    Some([w(0), w(1), w(2), w(3)])
}

fn token_of(d: &[u8]) -> Option<u64> {
    d.try_into().ok().map(u64::from_le_bytes)
}

fn mix(a: u64, b: u64) -> u64 {
    let mut x = a ^ b.rotate_left(29) ^ 0x9E37_79B9_7F4A_7C15;
    x ^= x >> 31;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^ x >> 29
}

/// The records of an entry, in order: with `groups`, its group payload (as the runtime
/// packs records: `chorus_core::ooo::group`; none for data that is not a group); without,
/// the entry is one record with the entry's own declaration. None for NULL.
fn records(e: &Entry, groups: bool) -> Vec<Record> {
    if groups {
        return group::records(e).unwrap_or_default();
    }
    let declared = match &e.body {
        Body::Null => return Vec::new(),
        Body::Parallel { ranges, .. } => Declared::Blocks(ranges.clone()),
        Body::Dependent { write_set, .. } => Declared::Txn {
            read_set: Vec::new(),
            write_set: write_set.clone(),
        },
    };
    vec![Record {
        declared,
        data: e.data().to_vec(),
    }]
}

/// What an entry writes, record by record in the group's order: blocks (parallel) or one
/// key (dependent) per record, with the values.
fn writes(e: &Entry, groups: bool) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for r in records(e, groups) {
        match &r.declared {
            Declared::Blocks(ranges) => {
                let t = token_of(&r.data).unwrap_or(0);
                out.extend(
                    ranges
                        .iter()
                        .flat_map(|r| (r.start..r.end).map(move |b| (b, t))),
                );
            }
            Declared::Txn { .. } => {
                out.extend(decode_txn(&r.data).map(|[_, _, wk, wv]| (wk, wv)));
            }
        }
    }
    out
}

/// A state machine image: every key with its value and the slot that wrote it.
type Image = BTreeMap<u64, (u64, Seq)>;

fn encode_image(state: &HashMap<u64, u64>, writers: &HashMap<u64, Seq>) -> Vec<u8> {
    let sorted: BTreeMap<u64, u64> = state.iter().map(|(&k, &v)| (k, v)).collect();
    let mut out = Vec::with_capacity(sorted.len() * 24);
    for (k, v) in sorted {
        for x in [k, v, writers.get(&k).copied().unwrap_or(0)] {
            out.extend_from_slice(&x.to_le_bytes());
        }
    }
    out
}

/// A partial image: every key `f` names (blocks are keys in parallel mode), with its
/// value and writer, or absent: `u64 key | u64 present (0/1) | u64 value | u64 writer`.
fn encode_part(
    state: &HashMap<u64, u64>,
    writers: &HashMap<u64, Seq>,
    f: &chorus_core::ooo::replica::Footprint,
) -> Vec<u8> {
    let mut keys: Vec<u64> = f
        .blocks
        .iter()
        .flat_map(|r| r.start..r.end)
        .chain(f.keys.iter().copied())
        .collect();
    keys.sort_unstable();
    keys.dedup();
    let mut out = Vec::with_capacity(keys.len() * 32);
    for k in keys {
        let (present, v) = match state.get(&k) {
            Some(&v) => (1, v),
            None => (0, 0),
        };
        for x in [k, present, v, writers.get(&k).copied().unwrap_or(0)] {
            out.extend_from_slice(&x.to_le_bytes());
        }
    }
    out
}

type Part = Vec<(u64, Option<(u64, Seq)>)>;

fn decode_part(b: &[u8]) -> Option<Part> {
    if !b.len().is_multiple_of(32) {
        return None;
    }
    let u = |c: &[u8]| u64::from_le_bytes(c.try_into().expect("8"));
    b.chunks(32)
        .map(|c| match u(&c[8..16]) {
            0 => Some((u(&c[..8]), None)),
            1 => Some((u(&c[..8]), Some((u(&c[16..24]), u(&c[24..]))))),
            _ => None,
        })
        .collect()
}

fn decode_image(b: &[u8]) -> Option<Image> {
    if !b.len().is_multiple_of(24) {
        return None;
    }
    let u = |c: &[u8]| u64::from_le_bytes(c.try_into().expect("8"));
    Some(
        b.chunks(24)
            .map(|c| (u(&c[..8]), (u(&c[8..16]), u(&c[16..]))))
            .collect(),
    )
}

struct Node {
    // Durable.
    /// The node's disk, and the real store on it (None while down).
    fs: Arc<SimFs>,
    store: Option<OooStore>,
    /// The state machine's durable image (a checkpoint or an installed snapshot).
    image: Image,
    /// Entries written to the store and not yet synced.
    unsynced: bool,
    // Volatile.
    replica: Option<OooReplica>,
    state: HashMap<u64, u64>,
    last_writer: HashMap<u64, Seq>,
    /// Leader only: writes admitted and not yet applied here (key -> (slot, value)).
    spec: HashMap<u64, (Seq, u64)>,
    incarnation: u64,
    cut: bool,
    /// The due time an [`Ev::ResendTick`] is scheduled for.
    resend_tick: Option<Nanos>,
}

struct Sim {
    o: OooOptions,
    seed: u64,
    rng: Rng,
    now: Nanos,
    queue: BinaryHeap<Reverse<(Nanos, u64, usize)>>,
    events: Vec<Option<Ev>>,
    counter: u64,
    nodes: BTreeMap<NodeId, Node>,
    faults_on: bool,
    /// The committed log as first observed: slot -> (eid, entry).
    committed: BTreeMap<Seq, Entry>,
    /// Appends: eid -> (node, incarnation, slot, result, ended Unknown).
    appends: HashMap<u64, (NodeId, u64, Seq, Option<Outcome>, bool)>,
    /// Conflict order: appends without a result yet, by (term, slot): (eid, blocks).
    open: BTreeMap<(u64, Seq), (u64, Vec<BlockRange>)>,
    /// Conflict order: every append admitted, by (term, slot): (eid, blocks), for the
    /// end-of-seed check across leader changes.
    admitted: BTreeMap<(u64, Seq), (u64, Vec<BlockRange>)>,
    violations: Vec<String>,
    stats: BTreeMap<&'static str, u64>,
    /// Draws of the leader transfers, apart from `rng` (so that turning transfers off
    /// leaves every other draw where it was).
    trng: Rng,
    /// The last transfer asked: (from, to, the leader's term then).
    last_transfer: Option<(NodeId, NodeId, u64)>,
    /// Draws of the membership changes, apart from `rng`.
    crng: Rng,
    /// Draws of the storage faults at rest, apart from `rng`.
    drng: Rng,
    /// Nodes given damage not yet seen recovered (at most one at a time: a second
    /// damaged copy could be the majority of some committed slot's copies, and then
    /// halting is the right answer, not a finding).
    lost: BTreeSet<NodeId>,
    /// Print roles, memberships and crashes to stderr (`CHORUS_SIM_TRACE` set).
    trace: bool,
}

impl Sim {
    /// See [`OooOptions::preallocate`].
    fn preallocate(&self) -> u64 {
        self.o
            .preallocate
            .unwrap_or_else(|| crate::preallocate_by_seed(self.seed))
    }

    fn new(seed: u64, o: OooOptions) -> Self {
        let mut s = Self {
            seed,
            rng: Rng::new(seed),
            now: 0,
            queue: BinaryHeap::new(),
            events: Vec::new(),
            counter: 0,
            nodes: BTreeMap::new(),
            faults_on: o.faults,
            committed: BTreeMap::new(),
            appends: HashMap::new(),
            open: BTreeMap::new(),
            admitted: BTreeMap::new(),
            violations: Vec::new(),
            stats: BTreeMap::new(),
            trng: Rng::new(seed ^ 0x5452_414e_5346_4552),
            last_transfer: None,
            crng: Rng::new(seed ^ 0x4348_414e_4745_5321),
            drng: Rng::new(seed ^ 0x4441_4d41_4745_4421),
            lost: BTreeSet::new(),
            trace: std::env::var_os("CHORUS_SIM_TRACE").is_some(),
            o,
        };
        for id in 1..=s.node_count() as NodeId {
            let r = OooReplica::new(s.config(id), 0);
            let fs = Arc::new(SimFs::new(mix(seed, id)));
            let dyn_fs: Arc<dyn FileSystem> = fs.clone();
            let (mut store, _, _, _) =
                OooStore::open(dyn_fs, Path::new(DIR)).expect("a fresh store opens");
            store.set_preallocate(s.preallocate());
            // Direct IO on odd seeds, the page cache on even ones (as the ordered log).
            store.set_direct_io(seed % 2 == 1);
            s.nodes.insert(
                id,
                Node {
                    fs,
                    store: Some(store),
                    image: Image::new(),
                    unsynced: false,
                    replica: Some(r),
                    state: HashMap::new(),
                    last_writer: HashMap::new(),
                    spec: HashMap::new(),
                    incarnation: 0,
                    cut: false,
                    resend_tick: None,
                },
            );
            let t = s.rng.below(5 * MS);
            s.at(t, Ev::Tick(id));
        }
        s.at(MS, Ev::Client);
        if s.o.transfers {
            let mut t = 300 * MS;
            while t < s.o.fault_time {
                s.at(t, Ev::Transfer);
                t += 200 * MS + s.trng.below(500 * MS);
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
    fn node_count(&self) -> usize {
        self.o.voters + usize::from(self.o.changes)
    }

    /// The serving leader, if any, with its term.
    fn serving(&self) -> Option<(NodeId, u64)> {
        self.nodes
            .iter()
            .find(|(_, n)| n.replica.as_ref().is_some_and(|r| r.is_serving()))
            .map(|(&id, n)| (id, n.replica.as_ref().expect("serving").term()))
    }

    /// An operator asks the serving leader, if there is one, to change the voters: add
    /// the node that is not a voter, remove one, or replace one with it (three or four
    /// voters kept).
    fn change(&mut self) {
        let Some((id, _)) = self.serving() else {
            return;
        };
        let r = self.nodes[&id].replica.as_ref().expect("serving");
        let voters = r.membership().voters.clone();
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
        let r = self
            .nodes
            .get_mut(&id)
            .and_then(|n| n.replica.as_mut())
            .expect("serving");
        if self.trace {
            eprintln!("{:>6}us node {id} asked {change:?}", self.now / 1000);
        }
        match r.change_membership(now, change) {
            Ok(()) => self.bump("changes_asked", 1),
            Err(chorus_core::ooo::replica::OooChangeError::InProgress { .. }) => {
                self.bump("changes_busy", 1)
            }
            Err(e) => self.violation(format!(
                "node {id}, serving, refused the change {change:?} of voters {voters:?}: {e}"
            )),
        }
        self.drain(id);
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
            return;
        };
        let voters = self.nodes[&id]
            .replica
            .as_ref()
            .map(|r| r.membership().voters.clone())
            .unwrap_or_default();
        let others: Vec<NodeId> = voters.into_iter().filter(|&v| v != id).collect();
        if others.is_empty() {
            return;
        }
        let to = others[self.trng.below(others.len() as u64) as usize];
        let now = self.now;
        let r = self
            .nodes
            .get_mut(&id)
            .and_then(|n| n.replica.as_mut())
            .expect("serving");
        match r.transfer_leader(now, to) {
            Ok(()) => {
                self.bump("transfers_asked", 1);
                self.last_transfer = Some((id, to, term));
            }
            Err(e) => self.violation(format!(
                "node {id}, serving, refused a transfer to voter {to}: {e}"
            )),
        }
        self.drain(id);
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
        // catch-up (PolarFS section 5.3), so lagging followers catch up under the limit.
        if self.seed % 2 == 1 {
            c.max_batch_bytes = 4 << (10 + self.seed / 2 % 3);
            c.catchup_rate = 1 << (20 + self.seed / 8 % 4);
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
    fn conflict_order(&self) -> bool {
        self.o.conflict_order && matches!(self.o.mode, Mode::Parallel { .. }) && self.seed % 3 == 2
    }

    fn at(&mut self, t: Nanos, ev: Ev) {
        self.counter += 1;
        self.events.push(Some(ev));
        self.queue
            .push(Reverse((t, self.counter, self.events.len() - 1)));
    }

    fn bump(&mut self, k: &'static str, n: u64) {
        *self.stats.entry(k).or_insert(0) += n;
    }

    fn violation(&mut self, v: String) {
        if self.violations.len() < 20 {
            self.violations.push(format!("t={}ms: {v}", self.now / MS));
        }
    }

    fn send(&mut self, from: NodeId, to: NodeId, msg: Msg) {
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

    /// Executes the node's actions in order; with faults on, a crash may cut the list.
    fn drain(&mut self, id: NodeId) {
        loop {
            let Some(r) = self.nodes.get_mut(&id).and_then(|n| n.replica.as_mut()) else {
                return;
            };
            let actions = r.take_actions();
            if actions.is_empty() {
                // Tick the leader when its next timed resend falls due, not on its next
                // periodic tick (5 ms, far above a simulated round trip).
                let due = r.resend_due();
                let n = self.nodes.get_mut(&id).expect("node");
                if n.resend_tick != due {
                    n.resend_tick = due;
                    if let Some(due) = due {
                        // `resend_due` may be early (a lower bound): one already past
                        // is looked at again a millisecond on, as the runtime does.
                        let at = if due > self.now { due } else { self.now + MS };
                        self.at(at, Ev::ResendTick(id, due));
                    }
                }
                return;
            }
            let cut_at = (self.faults_on && self.rng.chance(1, 400))
                .then(|| self.rng.below(actions.len() as u64) as usize);
            let mut applies = Vec::new();
            let mut written = Vec::new();
            for (i, a) in actions.into_iter().enumerate() {
                if cut_at == Some(i) {
                    self.crash(id);
                    return;
                }
                if let Action::Write(e) = &a {
                    written.push((e.seq, e.eid, e.term));
                }
                self.execute(id, a, &mut applies);
            }
            self.sync(id);
            // Only now durable: the replica may count its own copies.
            if !written.is_empty() {
                let now = self.now;
                if let Some(r) = self.nodes.get_mut(&id).and_then(|n| n.replica.as_mut()) {
                    r.persisted(now, &written);
                }
            }
            // Apply the released batch in a random order, as parallel apply threads might.
            while !applies.is_empty() {
                let i = self.rng.below(applies.len() as u64) as usize;
                let e: Entry = applies.swap_remove(i);
                self.apply(id, &e);
                let r = self
                    .nodes
                    .get_mut(&id)
                    .and_then(|n| n.replica.as_mut())
                    .expect("live");
                if let Err(why) = r.applied(e.seq) {
                    self.violation(format!("node {id}: applied({}) refused: {why}", e.seq));
                }
            }
            self.maybe_checkpoint(id);
        }
    }

    /// Now and then: the state machine's image is made durable, then the replica compacts
    /// below the applied head it covers.
    fn maybe_checkpoint(&mut self, id: NodeId) {
        if !self.o.compact || self.seed.is_multiple_of(3) || !self.rng.chance(1, 25) {
            return;
        }
        let now = self.now;
        let n = self.nodes.get_mut(&id).expect("node");
        let Some(r) = n.replica.as_mut() else {
            return;
        };
        let upto = r.applied_head();
        if upto < r.base() + 16 {
            return;
        }
        n.image = n
            .state
            .iter()
            .map(|(&k, &v)| (k, (v, n.last_writer.get(&k).copied().unwrap_or(0))))
            .collect();
        r.compact(now, upto);
        self.bump("checkpoints", 1);
    }

    /// Right after an install of an image covering every slot below `base`: each key
    /// holds the value the serial application of the committed slots below `base` gives
    /// it, or one a committed slot from `base` on wrote (an image holds at least its base,
    /// and this node may have applied later slots out of order). A partial image that left
    /// out something the node lacked shows here, before later writes to the same blocks
    /// could hide it from the final check.
    fn check_installed(&mut self, id: NodeId, base: Seq, part: bool) {
        let mut serial: HashMap<u64, u64> = HashMap::new();
        let mut later: HashMap<u64, Vec<u64>> = HashMap::new();
        for (&s, e) in &self.committed {
            for (k, v) in writes(e, self.o.groups) {
                if s < base {
                    serial.insert(k, v);
                } else {
                    later.entry(k).or_default().push(v);
                }
            }
        }
        let n = &self.nodes[&id];
        let keys: BTreeSet<u64> = serial.keys().chain(n.state.keys()).copied().collect();
        let bad = keys.into_iter().find(|k| {
            let (have, want) = (n.state.get(k), serial.get(k));
            have != want && !have.is_some_and(|v| later.get(k).is_some_and(|l| l.contains(v)))
        });
        if let Some(k) = bad {
            let have = n.state.get(&k).copied();
            let want = serial.get(&k).copied();
            self.violation(format!(
                "node {id} installed a{} image with base {base}: key {k} holds {have:x?}, the slots below the base give {want:x?} and no later slot wrote it",
                if part { " partial" } else { " whole" }
            ));
        }
    }

    /// The state machine restarts from its image. The image may hold writes of slots at
    /// or past `base` (applied out of order before it was taken); those are applied again
    /// from the log, so they are not counted as applied for the order check.
    fn load_image(n: &mut Node, base: Seq) {
        n.state = n.image.iter().map(|(&k, &(v, _))| (k, v)).collect();
        n.last_writer = n
            .image
            .iter()
            .filter(|(_, &(_, w))| w < base)
            .map(|(&k, &(_, w))| (k, w))
            .collect();
    }

    /// Makes the entries written so far durable (the replica's rule: before the next
    /// action that is not a write).
    fn sync(&mut self, id: NodeId) {
        let n = self.nodes.get_mut(&id).expect("node");
        if !n.unsynced {
            return;
        }
        n.unsynced = false;
        self.bump("syncs", 1);
        let n = self.nodes.get_mut(&id).expect("node");
        if let Err(e) = n.store.as_mut().expect("live").sync() {
            self.violation(format!("node {id}: sync failed: {e}"));
        }
    }

    fn execute(&mut self, id: NodeId, a: Action, applies: &mut Vec<Entry>) {
        if self.trace {
            match &a {
                Action::SaveMembership(_) | Action::Role { .. } | Action::Serving { .. } => {
                    let r = self.nodes[&id].replica.as_ref();
                    eprintln!(
                        "{:>6}us node {id} {a:?} (term {:?}, heads {:?})",
                        self.now / 1000,
                        r.map(|r| r.term()),
                        r.map(|r| (r.committed_head(), r.applied_head()))
                    )
                }
                _ => {}
            }
        }
        // A leader's Append may leave before the writes ahead of it are synced (the
        // replica's first exception, so the leader's fsync overlaps its followers'); a
        // crash cut right after it loses those writes while a follower has them. Results
        // likewise (the second exception: an outcome rests on durable copies only); the
        // checker then holds every Committed result to the entry surviving such a cut.
        let overlaps = matches!(
            a,
            Action::Write(_)
                | Action::Result { .. }
                | Action::Unknown { .. }
                | Action::Send {
                    msg: Msg::Append { .. },
                    ..
                }
        );
        if !overlaps {
            self.sync(id);
        }
        match a {
            Action::SaveHard(h) => {
                let n = self.nodes.get_mut(&id).expect("node");
                if let Err(e) = n.store.as_mut().expect("live").save_hard(&h) {
                    self.violation(format!("node {id}: saving the hard state failed: {e}"));
                }
            }
            Action::SaveMembership(m) => {
                self.bump("memberships_saved", 1);
                let n = self.nodes.get_mut(&id).expect("node");
                if let Err(e) = n.store.as_mut().expect("live").save_membership(&m) {
                    self.violation(format!("node {id}: saving the membership failed: {e}"));
                }
            }
            Action::Write(e) => {
                self.bump("writes", 1);
                let n = self.nodes.get_mut(&id).expect("node");
                n.unsynced = true;
                if let Err(err) = n.store.as_mut().expect("live").write(&e) {
                    self.violation(format!("node {id}: write failed: {err}"));
                }
            }
            Action::Send { to, msg } => self.send(id, to, msg),
            Action::Committed(e) => self.observe_commit(id, e),
            Action::Apply(e) => applies.push(e),
            Action::Result { eid, seq, outcome } => self.observe_result(id, eid, seq, outcome),
            Action::Role { .. } => {
                self.nodes.get_mut(&id).expect("node").spec.clear();
            }
            Action::Compact { base, live } => {
                self.bump("compactions", 1);
                let n = self.nodes.get_mut(&id).expect("node");
                if let Err(e) = n.store.as_mut().expect("live").compact(&live) {
                    self.violation(format!("node {id}: compacting below {base} failed: {e}"));
                }
            }
            Action::Snapshot { to } => {
                self.bump("images_taken", 1);
                let n = self.nodes.get_mut(&id).expect("node");
                let r = n.replica.as_mut().expect("live");
                let base = r.applied_head();
                let (part, img) = match r.image_scope(to) {
                    Some((from, f)) => (Some(from), encode_part(&n.state, &n.last_writer, &f)),
                    None => (None, encode_image(&n.state, &n.last_writer)),
                };
                r.snapshot_ready(self.now, to, base, part, img);
                if part.is_some() {
                    self.bump("images_partial", 1);
                }
            }
            Action::Install { base, image, part } => {
                self.bump("images_installed", 1);
                let n = self.nodes.get_mut(&id).expect("node");
                let img = if part {
                    *self.stats.entry("partial_installs").or_insert(0) += 1;
                    decode_part(&image).map(|p| {
                        // Over this node's own state, which becomes durable whole (the
                        // runtime's `restore_part` contract).
                        let mut img: Image = n
                            .state
                            .iter()
                            .map(|(&k, &v)| (k, (v, n.last_writer.get(&k).copied().unwrap_or(0))))
                            .collect();
                        for (k, x) in p {
                            match x {
                                Some(x) => img.insert(k, x),
                                None => img.remove(&k),
                            };
                        }
                        img
                    })
                } else {
                    decode_image(&image)
                };
                let Some(img) = img else {
                    self.violation(format!("node {id}: an image arrived damaged"));
                    return;
                };
                let n = self.nodes.get_mut(&id).expect("node");
                n.image = img;
                Self::load_image(n, base);
                self.check_installed(id, base, part);
                let n = self.nodes.get_mut(&id).expect("node");
                let r = n.replica.as_mut().expect("live");
                if let Err(e) = r.installed(self.now, base) {
                    self.violation(format!("node {id}: installed({base}) refused: {e}"));
                }
            }
            Action::Unknown { eid, seq } => {
                self.open.remove(&(eid >> 32, seq));
                self.bump("unknown_results", 1);
                match self.appends.get_mut(&eid) {
                    Some(a) if a.3.is_none() && a.2 == seq => a.4 = true,
                    _ => self.violation(format!(
                        "node {id}: append {eid:#x} at slot {seq} ended Unknown after a result, or is not known"
                    )),
                }
            }
            Action::Serving { term, start } => {
                self.bump("terms_served", 1);
                // The first term served after a transfer was asked: its target's, or not.
                if let Some((_, to, t)) = self.last_transfer {
                    if term > t {
                        if id == to {
                            self.bump("transfers_completed", 1);
                        }
                        self.last_transfer = None;
                    }
                }
                let n = self.nodes.get_mut(&id).expect("node");
                n.spec.clear();
                let head = n.replica.as_ref().map_or(0, |r| r.committed_head());
                if head < start {
                    self.violation(format!(
                        "node {id} serves term {term} from slot {start} with slots from {head} uncommitted"
                    ));
                }
            }
        }
    }

    fn observe_commit(&mut self, id: NodeId, e: Entry) {
        match self.committed.get(&e.seq) {
            Some(c) if c.eid != e.eid || c.is_null() != e.is_null() || c.data() != e.data() => {
                let (ce, ee) = (c.eid, e.eid);
                self.violation(format!(
                    "slot {} committed as {ce:#x} elsewhere and as {ee:#x} on node {id}",
                    e.seq
                ));
            }
            Some(_) => {}
            None => {
                // A result given before this commit was observed must agree.
                if let Some(&(_, _, seq, Some(out), _)) = self.appends.get(&e.eid) {
                    if seq == e.seq && out == Outcome::Failed {
                        self.violation(format!(
                            "append {:#x} was told Failed, then slot {seq} committed with it",
                            e.eid
                        ));
                    }
                }
                self.committed.insert(e.seq, e);
            }
        }
    }

    fn observe_result(&mut self, id: NodeId, eid: u64, seq: Seq, out: Outcome) {
        self.bump(
            if out == Outcome::Committed {
                "committed"
            } else {
                "failed"
            },
            1,
        );
        let Some(a) = self.appends.get_mut(&eid) else {
            self.violation(format!("node {id}: result for unknown append {eid:#x}"));
            return;
        };
        if a.3.is_some() || a.4 {
            let unknown = a.4;
            self.violation(format!(
                "append {eid:#x} got a second result {out:?} (unknown before: {unknown})"
            ));
            return;
        }
        a.3 = Some(out);
        let at = a.2;
        self.check_conflict_order(id, eid, seq, out);
        if at != seq {
            self.violation(format!("append {eid:#x} at slot {at} resulted at {seq}"));
        }
        if let Some(c) = self.committed.get(&seq) {
            let with_it = c.eid == eid;
            if with_it != (out == Outcome::Committed) {
                self.violation(format!(
                    "append {eid:#x} at slot {seq} told {out:?} but the slot committed {:#x}",
                    c.eid
                ));
            }
        }
    }

    /// Conflict order: a leader serving the term it admitted `eid` in reports it committed
    /// only after every earlier overlapping entry it admitted in that term has a result.
    /// (Results a later term reports are the merge's; parallel entries carry no
    /// dependency lists to cascade a failure, see [`OooConfig::conflict_order`].)
    fn check_conflict_order(&mut self, id: NodeId, eid: u64, seq: Seq, out: Outcome) {
        let Some((_, mine)) = self.open.remove(&(eid >> 32, seq)) else {
            return;
        };
        let term = self.nodes[&id].replica.as_ref().map(|r| r.term());
        if !self.conflict_order() || out != Outcome::Committed || term != Some(eid >> 32) {
            return;
        }
        self.bump("conflict_order_checks", 1);
        let early = self
            .open
            .range((eid >> 32, 0)..(eid >> 32, seq))
            .find(|(_, (_, b))| overlap(b, &mine))
            .map(|(&(_, s), &(e, _))| (s, e));
        if let Some((s, e)) = early {
            self.violation(format!(
                "node {id}: append {eid:#x} at slot {seq} reported committed before the overlapping append {e:#x} at slot {s} of the same term had a result (conflict order)"
            ));
        }
    }

    /// Applies an entry to the node's state machine, checking the order of conflicting
    /// writes.
    fn apply(&mut self, id: NodeId, e: &Entry) {
        self.bump("applied", 1);
        let n = self.nodes.get_mut(&id).expect("node");
        let mut bad = None;
        for (k, v) in writes(e, self.o.groups) {
            if let Some(&w) = n.last_writer.get(&k) {
                if w > e.seq {
                    bad = Some((k, w));
                }
            }
            n.last_writer.insert(k, e.seq);
            n.state.insert(k, v);
            if n.spec.get(&k).is_some_and(|&(s, _)| s == e.seq) {
                n.spec.remove(&k);
            }
        }
        if let Some((k, w)) = bad {
            let meta = |x: Option<&Entry>| {
                x.map(|x| match &x.body {
                    Body::Dependent {
                        base,
                        deps,
                        write_set,
                        ..
                    } => format!(
                        "term {} start {} base {base} {deps:?} writes {write_set:?}",
                        x.term, x.start
                    ),
                    Body::Parallel {
                        ranges,
                        look_behind,
                        ..
                    } => format!(
                        "term {} start {} {ranges:?} behind {look_behind:?}",
                        x.term, x.start
                    ),
                    Body::Null => "NULL".into(),
                })
            };
            let later = meta(self.committed.get(&w));
            self.violation(format!(
                "node {id} applied slot {} [{:?}] after slot {w} [{later:?}], both writing {k}",
                e.seq,
                meta(Some(e)),
            ));
        }
    }

    fn crash(&mut self, id: NodeId) {
        let n = self.nodes.get_mut(&id).expect("node");
        if self.trace {
            eprintln!("{:>6}us node {id} crashes", self.now / 1000);
        }
        if n.replica.take().is_some() {
            // Unsynced writes are lost, the last one possibly torn.
            n.store = None;
            n.unsynced = false;
            n.fs.crash(CrashMode::Prefix);
            n.incarnation += 1;
            self.bump("crashes", 1);
            let t = self.now + 20 * MS + self.rng.below(300 * MS);
            self.at(t, Ev::Restart(id));
        }
    }

    fn restart(&mut self, id: NodeId) {
        let cfg = self.config(id);
        let n = self.nodes.get_mut(&id).expect("node");
        if n.replica.is_some() {
            return;
        }
        n.spec.clear();
        self.maybe_corrupt(id);
        let preallocate = self.preallocate();
        let n = self.nodes.get_mut(&id).expect("node");
        let fs: Arc<dyn FileSystem> = n.fs.clone();
        match OooStore::open_tolerating_damage(fs, Path::new(DIR)) {
            Ok((mut store, mut hard, entries, rec)) => {
                store.set_preallocate(preallocate);
                store.set_direct_io(self.seed % 2 == 1);
                let members = match store.load_membership() {
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
                }
                let damaged = !rec.damaged.is_empty();
                n.store = Some(store);
                Self::load_image(n, hard.base);
                let r = OooReplica::recover(cfg, hard, members, entries, self.now);
                if r.is_recovering_lost() {
                    self.lost.insert(id);
                }
                n.replica = Some(r);
                n.resend_tick = None;
                self.bump("torn_bytes", rec.torn_bytes);
                if damaged {
                    self.bump("damaged_opens", 1);
                    if self.trace {
                        eprintln!("{:>6}us node {id} lost entries", self.now / 1000);
                    }
                }
            }
            Err(e) => {
                self.violation(format!("node {id}: the store does not reopen: {e}"));
                return;
            }
        }
        self.drain(id);
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
        self.lost.retain(|d| {
            nodes[d]
                .replica
                .as_ref()
                .is_none_or(|r| r.is_recovering_lost())
        });
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

    fn client(&mut self) {
        // The last second is quiet, so that everything in flight can end.
        if self.now + 1_000 * MS > self.o.fault_time + self.o.settle_time {
            return;
        }
        let leader = self
            .nodes
            .iter()
            .find(|(_, n)| n.replica.as_ref().is_some_and(|r| r.is_serving()))
            .map(|(&id, _)| id);
        let Some(id) = leader else {
            return;
        };
        let inflight = self
            .nodes
            .get(&id)
            .and_then(|n| n.replica.as_ref())
            .map_or(0, |r| r.pending());
        let burst = 1 + self.rng.below(4);
        // Half the bursts reach the leader before it drains (as a driver that takes every
        // queued append first): their entries leave in one message per follower.
        let together = self.rng.chance(1, 2);
        for _ in 0..burst {
            let live = self.nodes[&id]
                .replica
                .as_ref()
                .is_some_and(|r| r.is_serving());
            if inflight >= self.o.inflight || !live {
                break;
            }
            let space = self.o.space.max(8);
            // Half the entries are groups of 2-3 records declaring the union of their
            // records' declarations, as the runtime packs concurrent appends.
            let size = if !self.o.groups || self.rng.chance(1, 2) {
                1
            } else {
                2 + self.rng.below(2)
            };
            // A transaction of the group reads what the records before it in the group
            // wrote (the leader executes them in order).
            let mut own: HashMap<u64, u64> = HashMap::new();
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
                        let n = &self.nodes[&id];
                        let rv = own
                            .get(&rk)
                            .copied()
                            .or_else(|| n.spec.get(&rk).map(|&(_, v)| v))
                            .or_else(|| n.state.get(&rk).copied())
                            .unwrap_or(0);
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
            // As the runtime does (`group::waiting_last`): records that would wait to
            // commit, or to apply on some replica (`OooReplica::packs_last`), go into an
            // entry after the others, conflicting records in order.
            let parts: Vec<Vec<Record>> = {
                let r = self.nodes[&id].replica.as_ref().expect("serving");
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
                let (declared, data) = if self.o.groups {
                    (group::union(self.o.mode, &part), encode_group(&part))
                } else {
                    (part[0].declared.clone(), part[0].data.clone())
                };
                let now = self.now;
                let checked = self.conflict_order();
                let n = self.nodes.get_mut(&id).expect("node");
                let inc = n.incarnation;
                let r = n.replica.as_mut().expect("serving");
                let blocks = match &declared {
                    Declared::Blocks(b) => b.clone(),
                    Declared::Txn { .. } => Vec::new(),
                };
                match r.append(now, declared, data) {
                    Ok(t) => {
                        if checked {
                            self.admitted
                                .insert((t.eid >> 32, t.seq), (t.eid, blocks.clone()));
                            self.open.insert((t.eid >> 32, t.seq), (t.eid, blocks));
                        }
                        if self.o.mode == Mode::Dependent {
                            for r in &part {
                                if let Some([_, _, wk, wv]) = decode_txn(&r.data) {
                                    n.spec.insert(wk, (t.seq, wv));
                                }
                            }
                        }
                        self.appends.insert(t.eid, (id, inc, t.seq, None, false));
                        self.bump("appends", 1);
                        self.bump("records", part.len() as u64);
                    }
                    Err(_) => {
                        self.bump("appends_refused", 1);
                        refused = true;
                        break;
                    }
                }
            }
            if refused {
                break;
            }
            if !together {
                self.drain(id);
            }
        }
        if together {
            self.drain(id);
        }
    }

    fn step(&mut self) -> bool {
        let Some(Reverse((t, _, i))) = self.queue.pop() else {
            return false;
        };
        self.now = t;
        let ev = self.events[i].take().expect("event once");
        match ev {
            Ev::Deliver { from, to, msg } => {
                if self.trace && self.now > 5_500 * MS {
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
                if let Some(r) = self.nodes.get_mut(&to).and_then(|n| n.replica.as_mut()) {
                    r.receive(t, from, msg);
                    self.bump("messages", 1);
                    self.drain(to);
                }
            }
            Ev::Tick(id) => {
                if let Some(r) = self.nodes.get_mut(&id).and_then(|n| n.replica.as_mut()) {
                    r.tick(t);
                    self.drain(id);
                }
                self.at(t + 5 * MS, Ev::Tick(id));
            }
            Ev::ResendTick(id, due) => {
                let n = self.nodes.get_mut(&id).expect("node");
                if n.resend_tick == Some(due) {
                    n.resend_tick = None;
                    if let Some(r) = n.replica.as_mut() {
                        r.tick(t);
                        self.bump("resend_ticks", 1);
                        self.drain(id);
                    }
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
        }
        true
    }

    fn schedule_faults(&mut self) {
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

    fn run_until(&mut self, end: Nanos) {
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

    /// The final checks after healing (module docs, 2 and 5).
    fn final_checks(&mut self) {
        // Serial application of the committed log, in slot order.
        let end = self.committed.keys().next_back().map_or(0, |s| s + 1);
        let mut serial: HashMap<u64, u64> = HashMap::new();
        let mut problems = Vec::new();
        for s in 0..end {
            let Some(e) = self.committed.get(&s) else {
                problems.push(format!(
                    "slot {s} never committed below committed slot {}",
                    end - 1
                ));
                break;
            };
            if self.o.mode == Mode::Dependent {
                // Record by record: a transaction reads what the records before it in the
                // serial order (its own group's included) wrote.
                for (i, r) in records(e, self.o.groups).iter().enumerate() {
                    let Some([rk, rv, wk, wv]) = decode_txn(&r.data) else {
                        continue;
                    };
                    let want = serial.get(&rk).copied().unwrap_or(0);
                    if rv != want {
                        problems.push(format!(
                            "committed transaction at slot {s} record {i} read key {rk} = {rv:#x}, the serial order gives {want:#x}"
                        ));
                    }
                    serial.insert(wk, wv);
                }
            } else {
                for (k, v) in writes(e, self.o.groups) {
                    serial.insert(k, v);
                }
            }
        }
        // The final membership: the serving leader's (or the newest any live replica
        // holds). Nodes outside it (the spare, a removed voter, a node added by a joint
        // stage that a later leader abandoned) are not sent the log, so they are not held
        // to it.
        let live = || self.nodes.values().filter_map(|n| n.replica.as_ref());
        let last: Option<Membership> = live()
            .find(|r| r.is_serving())
            .or_else(|| live().max_by_key(|r| r.membership().version))
            .map(|r| r.membership().clone());
        let mut heads = Vec::new();
        for (&id, n) in &self.nodes {
            let Some(r) = n.replica.as_ref() else {
                continue;
            };
            if last.as_ref().is_some_and(|m| !m.is_member(id)) {
                continue;
            }
            heads.push((id, r.applied_head()));
            if r.is_recovering_lost() {
                problems.push(format!(
                    "node {id} is still recovering entries it lost on disk after settling"
                ));
            }
            if r.applied_head() == end && n.state != serial {
                let diff = serial
                    .iter()
                    .find(|(k, v)| n.state.get(k) != Some(v))
                    .map(|(k, v)| format!("key {k}: serial {v:#x}, node {:?}", n.state.get(k)));
                problems.push(format!(
                    "node {id} applied everything but its state differs from serial application ({})",
                    diff.unwrap_or_else(|| "extra keys".into())
                ));
            }
            // The log as a reader gets it: the committed prefix from the base, every slot
            // the version observed committed, contiguous up to the committed head.
            match r.read_committed(r.base(), usize::MAX) {
                Ok(es) => {
                    let want = r.committed_head() - r.base().min(r.committed_head());
                    if es.len() as u64 != want {
                        problems.push(format!(
                            "node {id} reads {} committed slots from its base {}, its committed head is {}",
                            es.len(),
                            r.base(),
                            r.committed_head()
                        ));
                    }
                    for (e, s) in es.iter().zip(r.base()..) {
                        let same = self.committed.get(&e.seq).is_some_and(|c| {
                            c.eid == e.eid && c.is_null() == e.is_null() && c.data() == e.data()
                        });
                        if e.seq != s || !same {
                            problems.push(format!(
                                "node {id} reads slot {} ({:#x}) where slot {s} committed {:?}",
                                e.seq,
                                e.eid,
                                self.committed.get(&s).map(|c| c.eid)
                            ));
                            break;
                        }
                    }
                }
                Err(e) => problems.push(format!("node {id} cannot read from its base: {e}")),
            }
            if r.applied_head() != end {
                let holes = r.apply_holes();
                problems.push(format!(
                    "node {id} applied up to slot {} of {end} after healing (committed up to {}, waiting for {:?})",
                    r.applied_head(),
                    r.committed_head(),
                    &holes[..holes.len().min(5)],
                ));
            }
        }
        // Conflict order across leader changes (module docs, 6): the result check sees
        // only what one serving leader reports; a new leader's merge must not keep an
        // entry whose overlapping predecessor it drops. Checked along each block's chain
        // of writers within a term: every committed entry's nearest earlier writer
        // committed, so by induction every earlier one did.
        let mut last: HashMap<u64, (Seq, u64)> = HashMap::new();
        let mut this_term = None;
        for (&(term, seq), &(eid, ref blocks)) in &self.admitted {
            if this_term != Some(term) {
                this_term = Some(term);
                last.clear();
            }
            let committed = self.committed.get(&seq).is_some_and(|c| c.eid == eid);
            for b in blocks.iter().flat_map(|r| r.start..r.end) {
                if let Some((s, e)) = last.insert(b, (seq, eid)) {
                    let held = self.committed.get(&s).map(|c| c.eid);
                    if committed && held != Some(e) {
                        problems.push(format!(
                            "append {eid:#x} at slot {seq} committed, but the earlier append {e:#x} of its term at slot {s} writing block {b} did not (slot {s}: {held:x?}; conflict order)"
                        ));
                    }
                }
            }
        }
        let mut open = 0;
        for (&eid, &(node, inc, seq, out, unknown)) in &self.appends {
            let alive = self.nodes[&node].incarnation == inc && self.nodes[&node].replica.is_some();
            if out.is_none() && !unknown && alive {
                open += 1;
                if open <= 3 {
                    problems.push(format!(
                        "append {eid:#x} at slot {seq} on node {node} has no result after healing"
                    ));
                }
            }
            if let (Some(Outcome::Committed), None) = (out, self.committed.get(&seq)) {
                problems.push(format!(
                    "append {eid:#x} told Committed, slot {seq} not committed"
                ));
            }
        }
        if !problems.is_empty() {
            let roles: Vec<String> = self
                .nodes
                .iter()
                .map(|(id, n)| match &n.replica {
                    Some(r) => format!(
                        "{id}: {:?} term {} serving {} heads {}/{} {:?} {:?}",
                        r.role(),
                        r.term(),
                        r.is_serving(),
                        r.committed_head(),
                        r.applied_head(),
                        r.membership(),
                        r.stats()
                    ),
                    None => format!("{id}: down"),
                })
                .collect();
            problems.push(format!("at the end: {}", roles.join("; ")));
        }
        for p in problems {
            self.violation(p);
        }
        self.stats.insert("committed_slots", end);
    }
}

/// Whether two lists of block ranges share a block.
fn overlap(a: &[BlockRange], b: &[BlockRange]) -> bool {
    a.iter()
        .any(|x| b.iter().any(|y| x.start < y.end && y.start < x.end))
}

/// A replica counter, read from its [`OooStats`].
type Counter = fn(&OooStats) -> u64;

/// Runs one seed: faults for `fault_time`, then everything heals and restarts, then
/// `settle_time` without faults, then the final checks.
pub fn run_seed(seed: u64, o: &OooOptions) -> OooReport {
    let mut sim = Sim::new(seed, o.clone());
    if o.faults {
        sim.schedule_faults();
    }
    sim.run_until(o.fault_time);
    sim.faults_on = false;
    for n in sim.nodes.values_mut() {
        n.cut = false;
    }
    let ids: Vec<NodeId> = sim.nodes.keys().copied().collect();
    for id in ids {
        sim.restart(id);
    }
    let settle = o.fault_time + o.settle_time;
    sim.run_until(settle);
    if sim.violations.is_empty() {
        sim.final_checks();
    }
    // Counters of the replicas alive at the end, summed over the nodes (a restart
    // starts a replica's counters afresh, hence "live").
    let live: [(&'static str, Counter); 18] = [
        ("superseded_seen_live", |s| s.superseded),
        ("catchup_limited_bytes", |s| s.catchup_bytes),
        ("catchup_deferred", |s| s.catchup_deferred),
        ("transfer_timeouts_sent_live", |s| s.transfers),
        ("membership_changes", |s| s.membership_changes),
        ("transfer_campaigns_live", |s| s.transfer_campaigns),
        ("pre_votes_live", |s| s.pre_votes),
        ("pre_votes_refused_by_lease_live", |s| {
            s.pre_votes_refused_by_lease
        }),
        ("campaigns_live", |s| s.campaigns),
        ("handoffs_live", |s| s.handoffs),
        ("partial_images_refused_live", |s| s.partial_images_refused),
        ("admitted_after_live", |s| s.admitted_after),
        ("held_at_quorum_live", |s| s.held_at_quorum),
        ("hole_resends_live", |s| s.hole_resends),
        ("timed_resends_live", |s| s.timed_resends),
        ("memberships_adopted_live", |s| s.memberships_adopted),
        ("lost_restored_live", |s| s.lost_restored),
        ("votes_refused_lost_live", |s| s.votes_refused_lost),
    ];
    for (name, f) in live {
        let sum = sim
            .nodes
            .values()
            .filter_map(|n| n.replica.as_ref())
            .map(|r| f(&r.stats()))
            .sum();
        sim.stats.insert(name, sum);
    }
    OooReport {
        seed,
        violations: sim.violations,
        stats: sim.stats,
    }
}

/// Runs seeds `start..start + count` on `threads` threads; a panicking seed is reported as
/// a violation. With a `deadline`, no seed starts after it (those running finish), so the
/// reports may cover fewer than `count` seeds.
pub fn run_batch(
    start: u64,
    count: u64,
    o: &OooOptions,
    threads: usize,
    deadline: Option<std::time::Instant>,
) -> Vec<OooReport> {
    let next = std::sync::atomic::AtomicU64::new(start);
    let out = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| loop {
                // Like the ordered batch: no new seed once the budget is spent; a seed
                // already running finishes.
                if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
                    return;
                }
                let seed = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if seed >= start + count {
                    return;
                }
                let r =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_seed(seed, o)))
                        .unwrap_or_else(|p| OooReport {
                            seed,
                            violations: vec![format!(
                                "panicked: {}",
                                p.downcast_ref::<&str>()
                                    .map(|s| s.to_string())
                                    .or_else(|| p.downcast_ref::<String>().cloned())
                                    .unwrap_or_default()
                            )],
                            stats: BTreeMap::new(),
                        });
                out.lock().unwrap_or_else(|e| e.into_inner()).push(r);
            });
        }
    });
    let mut v = out.into_inner().unwrap_or_else(|e| e.into_inner());
    v.sort_by_key(|r| r.seed);
    v
}
