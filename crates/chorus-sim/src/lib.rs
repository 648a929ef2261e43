//! Deterministic cluster simulator for Chorus.
//!
//! A [`Cluster`] runs the real [`Replica`] and the real [`LogStorage`] and [`MetaStorage`]
//! of every node over a fault-injecting [`SimFs`], a seeded network and per-node clocks,
//! all in one thread from one seed: a failing run replays exactly from its seed. After every
//! step the [`checker::Checker`] verifies the invariants; [`run::run_seed`] adds a fault
//! schedule, a healing phase and the liveness check.

pub mod batch;
pub mod checker;
pub mod mirror;
pub mod ooo;
pub mod run;
pub mod script;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::path::PathBuf;
use std::sync::Arc;

use chorus_core::format::group::ChainPoint;
use chorus_core::format::meta::{AccessMode, ConfigVersion, Membership, MetaRecord, NodeId};
use chorus_core::replica::{
    AppendError, ChangeError, CommitMode, MembershipChange, Message, MirrorError, Nanos, Outcome,
    Replica, ReplicaConfig, Role, Ticket,
};
use chorus_core::rng::Rng;
use chorus_runtime::ordered;
use chorus_storage::fs::FileSystem;
use chorus_storage::fs::{CrashMode, SimFs};
use chorus_storage::{LogOptions, LogStorage, MetaStorage, StorageError, SyncPoint};

use checker::{Accepted, Checker};

/// One millisecond in nanoseconds.
pub const MS: Nanos = 1_000_000;
const LOG_ID: u64 = 0xC0DE;
const BLOCK_SIZE: u64 = 64 << 10;

/// Network fault settings.
#[derive(Clone, Copy, Debug, Default)]
pub struct NetFaults {
    /// Chance a message is lost, per million.
    pub loss_ppm: u32,
    /// Chance a message is delivered twice, per million.
    pub dup_ppm: u32,
    /// Extra random delay bound (reordering comes from it).
    pub jitter: Nanos,
    /// Chance of a long delay (50 ms), per million.
    pub long_delay_ppm: u32,
}

/// Settings of a simulated cluster.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    /// Initial voters (ids 1..=voters).
    pub voters: usize,
    /// Extra nodes that start outside the membership (for membership changes).
    pub spares: usize,
    /// Commit-point mode.
    pub commit_mode: CommitMode,
    /// Priorities by node id (default 0).
    pub priorities: BTreeMap<NodeId, u32>,
    /// [`ReplicaConfig::gap_resend_after`] on every node; `None` picks it by seed
    /// (`(seed / 2) % 4` early messages, 0 being off), so batches run every setting.
    pub gap_resend_after: Option<usize>,
    /// [`ReplicaConfig::timed_resend`] on every node; `None` picks it by seed (`(seed /
    /// 32) % 3`: off, 2 or 4 median round trips), so batches run every setting.
    pub timed_resend: Option<u32>,
    /// [`LogOptions::preallocate`] on every node; `None` picks it by seed
    /// ([`preallocate_by_seed`]), so batches run the log with and without zeros ahead.
    pub preallocate: Option<u64>,
    /// The access mode the group starts in: [`AccessMode::RawWrite`] makes it a mirror.
    pub access_mode: AccessMode,
    /// Deliberately broken variant (test builds only).
    #[cfg(feature = "broken")]
    pub broken: chorus_core::replica::Broken,
    /// Settings of the driver step (its deliberately broken variants, in test builds).
    pub step: ordered::StepSettings,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        Self {
            voters: 3,
            spares: 0,
            commit_mode: CommitMode::Piggyback,
            priorities: BTreeMap::new(),
            gap_resend_after: None,
            timed_resend: None,
            preallocate: None,
            access_mode: AccessMode::Append,
            #[cfg(feature = "broken")]
            broken: Default::default(),
            step: Default::default(),
        }
    }
}

/// The bytes of zeros a simulated store keeps written ahead of its end when no setting is
/// given: by `(seed / 8) % 4`, off, one page, four pages or 64 KiB (a whole simulated
/// block), so a batch runs the log and the out-of-order store with and without zeros
/// ahead, extended often and seldom, under crashes.
pub fn preallocate_by_seed(seed: u64) -> u64 {
    [0, 4096, 16384, 64 << 10][((seed / 8) % 4) as usize]
}

/// The replica settings used in simulation: short timings so that a run covers many
/// elections, small blocks so that block rotation, padding and catch-up from storage happen.
pub fn sim_replica_config(id: NodeId, opts: &ClusterOptions, seed: u64) -> ReplicaConfig {
    ReplicaConfig {
        id,
        priority: opts.priorities.get(&id).copied().unwrap_or(0),
        block_size: BLOCK_SIZE,
        lease: 400 * MS,
        heartbeat_interval: 40 * MS,
        ping_interval: 40 * MS,
        resend_interval: 80 * MS,
        window_bytes: 256 << 10,
        max_group_bytes: 16 << 10,
        max_message_bytes: 48 << 10,
        freeze_interval: MS,
        max_index_groups: 256,
        cache_bytes: 96 << 10,
        commit_mode: opts.commit_mode,
        gap_resend_after: opts
            .gap_resend_after
            .unwrap_or(chorus_core::replica::GAP_RESEND_AFTER),
        timed_resend: opts
            .timed_resend
            .unwrap_or(chorus_core::ooo::replica::TIMED_RESEND),
        seed,
        #[cfg(feature = "broken")]
        broken: opts.broken,
        ..ReplicaConfig::default()
    }
}

#[derive(Debug)]
enum Event {
    Deliver {
        from: NodeId,
        to: NodeId,
        msg: Message,
    },
    SyncDone {
        node: NodeId,
        inc: u32,
    },
    MetaDone {
        node: NodeId,
        inc: u32,
        seq: u64,
    },
    Tick {
        node: NodeId,
        inc: u32,
    },
    /// A tick at the time the leader's next timed resend falls due (its local clock), as
    /// the runtime's timer gives one (`Replica::resend_due`).
    ResendTick {
        node: NodeId,
        inc: u32,
        due: Nanos,
    },
    Restart {
        node: NodeId,
    },
}

struct Up {
    replica: Replica,
    log: LogStorage,
    meta: MetaStorage,
    /// The log sync in flight, if any (one at a time, as the runtime's): the point it
    /// covers, taken when it began, and its `fdatasync`'s result if that already ran
    /// (`None`: it runs when the sync ends). Writes go on meanwhile; what they add waits
    /// for the next sync, started as this one ends ([`ordered::sync_finished`]).
    sync: Option<(SyncPoint, Option<Result<(), StorageError>>)>,
    /// IO reports for the replica's next round ([`ordered::take_round`]).
    feedback: Vec<ordered::Feedback>,
    /// A tick is due: the next round ticks the replica after the IO reports, as the
    /// runtime's does.
    tick_due: bool,
    /// The timed resend a [`Event::ResendTick`] is scheduled for (local clock).
    resend_tick: Option<Nanos>,
}

/// One simulated machine.
pub struct Node {
    /// Its id.
    pub id: NodeId,
    /// Its file system.
    pub fs: Arc<SimFs>,
    dir: PathBuf,
    up: Option<Up>,
    /// Restarts so far (results of earlier incarnations are void).
    pub inc: u32,
    clock_offset: Nanos,
    clock_ppm: i64,
    /// Disk sync latency bounds.
    pub disk: (Nanos, Nanos),
    /// Results delivered to this node's appenders: (incarnation, ticket id, lsn, outcome).
    pub results: Vec<(u32, u64, u64, Outcome)>,
    /// Appends whose outcome became unknown ([`chorus_core::replica::Action::Unknown`]):
    /// (incarnation, ticket id, lsn).
    pub unknown: Vec<(u32, u64, u64)>,
    /// Tags of this node's appends by (incarnation, ticket id).
    tags: BTreeMap<(u32, u64), u64>,
}

impl Node {
    /// The replica, if the node is up.
    pub fn replica(&self) -> Option<&Replica> {
        self.up.as_ref().map(|u| &u.replica)
    }

    /// The log storage, if the node is up.
    pub fn log(&self) -> Option<&LogStorage> {
        self.up.as_ref().map(|u| &u.log)
    }

    /// Whether the node is up.
    pub fn is_up(&self) -> bool {
        self.up.is_some()
    }
}

/// A simulated cluster. See the crate docs.
pub struct Cluster {
    /// True simulated time.
    pub now: Nanos,
    /// Nodes by id.
    pub nodes: BTreeMap<NodeId, Node>,
    events: BinaryHeap<Reverse<(Nanos, u64, usize)>>,
    payloads: BTreeMap<usize, Event>,
    next_event: usize,
    seq: u64,
    rng: Rng,
    opts: ClusterOptions,
    seed: u64,
    /// Network faults in force.
    pub net: NetFaults,
    /// Blocked directed links (from, to).
    pub blocked: BTreeSet<(NodeId, NodeId)>,
    /// One-shot extra delays (from, to, by): the next append carrying log from `from` to
    /// `to` arrives `by` later than it would — one message overtaken by the ones after it.
    holds: Vec<(NodeId, NodeId, Nanos)>,
    /// The invariant checker.
    pub checker: Checker,
    /// Counters.
    pub stats: BTreeMap<&'static str, u64>,
    next_tag: u64,
    tick: Nanos,
    /// Log of notable events (for scripts), when enabled.
    pub trace: Option<Vec<String>>,
    /// Nodes whose storage holds injected damage not yet repaired or discarded, with the
    /// LSN ranges of the groups damaged. Random damage on a second node is injected only in
    /// a range disjoint from every other damaged node's (the fault model: every committed
    /// range keeps an intact copy on some voter).
    damaged: BTreeMap<NodeId, Vec<(chorus_core::Lsn, chorus_core::Lsn)>>,
    /// The log mirror writes copy ([`Cluster::mirror`]): from the start when the group
    /// starts as a mirror, from the barrier of each switch to raw-write.
    pub primary: Option<mirror::Primary>,
}

impl Cluster {
    /// A fresh cluster from `seed`: every node's storage is created empty with the
    /// initial voters as membership.
    pub fn new(seed: u64, mut opts: ClusterOptions) -> Self {
        opts.gap_resend_after = Some(opts.gap_resend_after.unwrap_or(((seed / 2) % 4) as usize));
        opts.timed_resend = Some(
            opts.timed_resend
                .unwrap_or([0, 2, 4][((seed / 32) % 3) as usize]),
        );
        opts.preallocate = Some(opts.preallocate.unwrap_or(preallocate_by_seed(seed)));
        let mut rng = Rng::new(seed);
        let voters: Vec<NodeId> = (1..=opts.voters as NodeId).collect();
        let mut nodes = BTreeMap::new();
        for id in 1..=(opts.voters + opts.spares) as NodeId {
            let fs = Arc::new(SimFs::new(rng.next_u64()));
            let dir = PathBuf::from(format!("/node{id}"));
            let membership = if voters.contains(&id) {
                Membership {
                    version: ConfigVersion::default(),
                    voters: voters.clone(),
                    learners: vec![],
                    barrier_lsn: 0,
                    access_mode: opts.access_mode,
                }
            } else {
                Membership::default()
            };
            let record = MetaRecord {
                log_id: LOG_ID,
                block_size: BLOCK_SIZE,
                // A group created as a mirror counts as switched once.
                access_mode_version: (membership.access_mode != AccessMode::Append) as u64,
                membership,
                ..MetaRecord::default()
            };
            let dynfs: Arc<dyn FileSystem> = fs.clone();
            MetaStorage::create(dynfs.clone(), &dir, &record).expect("create meta");
            LogStorage::create(
                dynfs,
                &dir,
                LogOptions {
                    block_size: BLOCK_SIZE,
                    // Odd seeds append with direct IO, even ones buffered: both paths run
                    // under crashes.
                    direct_io: seed % 2 == 1,
                    preallocate: opts.preallocate.unwrap_or_default(),
                },
                LOG_ID,
            )
            .expect("create log");
            let node = Node {
                id,
                fs,
                dir,
                up: None,
                inc: 0,
                clock_offset: rng.below(1_000 * MS),
                clock_ppm: 0,
                disk: (50_000, 300_000),
                results: Vec::new(),
                unknown: Vec::new(),
                tags: BTreeMap::new(),
            };
            nodes.insert(id, node);
        }
        let mut c = Self {
            now: 0,
            nodes,
            events: BinaryHeap::new(),
            payloads: BTreeMap::new(),
            next_event: 0,
            seq: 0,
            rng,
            opts,
            seed,
            net: NetFaults::default(),
            blocked: BTreeSet::new(),
            holds: Vec::new(),
            checker: Checker::default(),
            stats: BTreeMap::new(),
            next_tag: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
            tick: 5 * MS,
            trace: None,
            damaged: BTreeMap::new(),
            primary: None,
        };
        if c.opts.access_mode == AccessMode::RawWrite {
            let max_group = sim_replica_config(1, &c.opts, seed).max_group_bytes;
            c.primary = Some(mirror::Primary::new(
                seed,
                0,
                ChainPoint::default(),
                BLOCK_SIZE,
                max_group,
            ));
        }
        let ids: Vec<NodeId> = c.nodes.keys().copied().collect();
        for id in ids {
            c.start_node(id);
        }
        c
    }

    fn bump(&mut self, what: &'static str) {
        *self.stats.entry(what).or_default() += 1;
    }

    fn note(&mut self, line: String) {
        if let Some(t) = &mut self.trace {
            t.push(format!("{:>7.3}s {line}", self.now as f64 / 1e9));
        }
    }

    fn schedule(&mut self, at: Nanos, ev: Event) {
        self.seq += 1;
        let k = self.next_event;
        self.next_event += 1;
        self.payloads.insert(k, ev);
        self.events.push(Reverse((at, self.seq, k)));
    }

    /// The node's local clock: offset plus skewed true time (monotonic).
    pub fn local_now(&self, id: NodeId) -> Nanos {
        let n = &self.nodes[&id];
        let skew = (self.now as i128 * n.clock_ppm as i128 / 1_000_000) as i64;
        (self.now as i64 + skew) as Nanos + n.clock_offset
    }

    /// Sets a node's clock rate error in parts per million.
    pub fn set_clock_skew(&mut self, id: NodeId, ppm: i64) {
        // Keep the local clock continuous across the rate change.
        let before = self.local_now(id);
        let n = self.nodes.get_mut(&id).expect("node");
        n.clock_ppm = ppm;
        let after = {
            let skew = (self.now as i128 * ppm as i128 / 1_000_000) as i64;
            (self.now as i64 + skew) as Nanos
        };
        n.clock_offset = before.saturating_sub(after);
    }

    /// Moves a node's clock forward by `by`.
    pub fn jump_clock(&mut self, id: NodeId, by: Nanos) {
        self.nodes.get_mut(&id).expect("node").clock_offset += by;
    }

    fn start_node(&mut self, id: NodeId) {
        let seed = self.seed;
        let preallocate = self.opts.preallocate.unwrap_or_default();
        let node = self.nodes.get_mut(&id).expect("node");
        let fs: Arc<dyn FileSystem> = node.fs.clone();
        let opened = (|| {
            // Opened tolerating a damaged range, which the replica then repairs from peers.
            let (log, report) = LogStorage::open_damaged(
                fs.clone(),
                &node.dir,
                LogOptions {
                    block_size: BLOCK_SIZE,
                    direct_io: seed % 2 == 1,
                    preallocate,
                },
                LOG_ID,
            )?;
            let (meta, _) = MetaStorage::open(fs, &node.dir)?;
            let recovered = match report.damaged.first() {
                Some(d) => Err((d.lsn, d.next_valid, log.end_lsn())),
                None => Ok(log.recovered()?),
            };
            Ok::<_, chorus_storage::StorageError>((log, meta, recovered))
        })();
        let (log, meta, recovered) = match opened {
            Ok(x) => x,
            Err(chorus_storage::StorageError::Io { .. }) => {
                // An injected IO error (say, an armed fsync failure) hit recovery: the
                // operator's restart loop tries again.
                self.bump("restart_retries");
                let at = self.now + 50 * MS;
                self.schedule(at, Event::Restart { node: id });
                return;
            }
            Err(e) => {
                let now = self.now;
                self.checker
                    .report(now, format!("node {id}: storage failed to open: {e}"));
                return;
            }
        };
        let cfg = sim_replica_config(id, &self.opts, self.seed ^ (id << 32) ^ node.inc as u64);
        let record = meta.current().clone();
        let local = self.local_now(id);
        let replica = match recovered {
            Ok(recovered) => Replica::new(cfg, record, recovered, local),
            Err((from, to, end)) => {
                self.bump("damaged_opens");
                self.note(format!("node {id} opened with damaged range {from}..{to}"));
                Replica::repairing(cfg, record, from, to, end, local)
            }
        };
        let node = self.nodes.get_mut(&id).expect("node");
        node.up = Some(Up {
            replica,
            log,
            meta,
            sync: None,
            feedback: Vec::new(),
            tick_due: false,
            resend_tick: None,
        });
        let inc = node.inc;
        let first = self.now + self.rng.below(self.tick);
        self.schedule(first, Event::Tick { node: id, inc });
        self.pump(id);
    }

    /// Trims node `id`'s log below `lsn` (capped at its committed end), as the database
    /// does after a checkpoint: storage deletes whole blocks below it and the replica
    /// learns its new start. Returns whether anything was trimmed.
    pub fn trim(&mut self, id: NodeId, lsn: chorus_core::Lsn) -> bool {
        let local = self.local_now(id);
        let node = self.nodes.get_mut(&id).expect("node");
        let Some(up) = &mut node.up else {
            return false;
        };
        if up.replica.repairing_range().is_some() || up.replica.halted().is_some() {
            return false;
        }
        let before = up.log.start_lsn();
        let lsn = lsn.min(up.replica.committed_end());
        if up.log.trim(lsn).is_err() {
            self.storage_failure(id);
            return false;
        }
        let start = up.log.start_lsn();
        up.replica.log_trimmed(local, start);
        let trimmed = start > before;
        if trimmed {
            self.bump("trims");
            self.note(format!("node {id} trimmed its log below {start}"));
        }
        self.pump(id);
        trimmed
    }

    /// Restarts a node's replica from its storage without a crash (after a repair): a new
    /// incarnation, so results of the old one are void.
    fn restart_replica(&mut self, id: NodeId) {
        let node = self.nodes.get_mut(&id).expect("node");
        node.up = None;
        let inc = node.inc;
        node.inc += 1;
        self.checker.on_crash(id, inc);
        self.start_node(id);
    }

    /// Crashes a node: unsynced data is lost per `mode`; its pending results are void.
    pub fn crash(&mut self, id: NodeId, mode: CrashMode) {
        let node = self.nodes.get_mut(&id).expect("node");
        let Some(up) = node.up.take() else {
            return;
        };
        let asked = up.replica.gap_resend_requests();
        let timed = up.replica.timed_resends();
        node.fs.crash(mode);
        let inc = node.inc;
        node.inc += 1;
        self.checker.on_crash(id, inc);
        self.bump("crashes");
        *self.stats.entry("gap_resend_requests").or_default() += asked;
        *self.stats.entry("timed_resends").or_default() += timed;
        self.note(format!("node {id} crashed"));
    }

    /// Gap resends followers asked for ([`ReplicaConfig::gap_resend_after`]), crashed
    /// incarnations included.
    pub fn gap_resend_requests(&self) -> u64 {
        self.counted("gap_resend_requests", Replica::gap_resend_requests)
    }

    /// Timed resends leaders made ([`ReplicaConfig::timed_resend`]), crashed incarnations
    /// included.
    pub fn timed_resends(&self) -> u64 {
        self.counted("timed_resends", Replica::timed_resends)
    }

    /// A replica counter summed over the live replicas and, under `key`, the crashed
    /// incarnations.
    fn counted(&self, key: &str, get: fn(&Replica) -> u64) -> u64 {
        self.stats.get(key).copied().unwrap_or(0)
            + self
                .nodes
                .values()
                .filter_map(|n| n.replica())
                .map(get)
                .sum::<u64>()
    }

    /// Delays the next append carrying log from `from` to `to` by `by` beyond its usual
    /// delay, so the appends sent after it overtake it (a slow connection).
    pub fn hold_next_append(&mut self, from: NodeId, to: NodeId, by: Nanos) {
        self.holds.push((from, to, by));
    }

    /// Damages one synced group of a crashed node's last block that has valid groups
    /// after it (so recovery can tell it from a torn tail: a damaged last group is
    /// indistinguishable from a torn write and is not injected). Returns whether it did.
    pub fn corrupt_synced_group(&mut self, id: NodeId) -> bool {
        // Never a range another node's unrepaired damage overlaps: two damaged copies of
        // one range could be the majority of a committed group's copies, and then halting
        // is the right answer, not a finding (seeds 604 and 986 did exactly that). Damage
        // in disjoint ranges on two nodes at once is in the model: each replica under
        // repair serves the other a copy of its range. Scripts that want every copy bad
        // call `corrupt_group` directly.
        self.corrupt_groups_where(id, &[], true)
    }

    /// As [`Cluster::corrupt_synced_group`], choosing the `index`-th group of the last block
    /// (random if `None`).
    pub fn corrupt_group(&mut self, id: NodeId, index: Option<usize>) -> bool {
        match index {
            Some(i) => self.corrupt_groups(id, &[i]),
            None => self.corrupt_groups(id, &[]),
        }
    }

    /// As [`Cluster::corrupt_group`], damaging each of the `indices`-th groups of the last
    /// block (one random group if `indices` is empty): several damaged stretches in one
    /// replica's log, each followed by valid groups.
    pub fn corrupt_groups(&mut self, id: NodeId, indices: &[usize]) -> bool {
        self.corrupt_groups_where(id, indices, false)
    }

    /// [`Cluster::corrupt_groups`]; with `disjoint`, only when no picked group's LSN range
    /// overlaps another node's unrepaired damage.
    fn corrupt_groups_where(&mut self, id: NodeId, indices: &[usize], disjoint: bool) -> bool {
        let node = &self.nodes[&id];
        if node.up.is_some() {
            return false;
        }
        let log_dir = node.dir.join("log");
        let Ok(names) = node.fs.list_dir(&log_dir) else {
            return false;
        };
        let Some(last) = names.iter().filter(|n| n.ends_with(".blk")).max() else {
            return false;
        };
        let path = log_dir.join(last);
        let Ok(data) = node.fs.durable_content(&path) else {
            return false;
        };
        let header = chorus_core::format::block::BLOCK_HEADER_SIZE;
        let mut groups = Vec::new();
        let mut off = header;
        while off < data.len() {
            match chorus_core::format::group::decode_group(&data[off..]) {
                Ok((h, _)) => {
                    groups.push((off, h.total_len() as usize));
                    off += h.total_len() as usize;
                }
                _ => break,
            }
        }
        // One damaged range per replica at a time (a second one is a double fault this
        // simulation does not model), and never the last group.
        if groups.len() < 2 || data[off.min(data.len())..].iter().any(|b| *b != 0) {
            return false;
        }
        let picked: Vec<usize> = if indices.is_empty() {
            vec![self.rng.below(groups.len() as u64 - 1) as usize]
        } else {
            indices.to_vec()
        };
        if picked.iter().any(|&i| i + 1 >= groups.len()) {
            return false;
        }
        let Some(block) = last
            .strip_suffix(".blk")
            .and_then(|n| n.parse::<u64>().ok())
        else {
            return false;
        };
        let lsn_of = |goff: usize| block * BLOCK_SIZE + (goff - header) as u64;
        let overlaps = |from: chorus_core::Lsn, to: chorus_core::Lsn| {
            self.damaged
                .iter()
                .filter(|(n, _)| **n != id)
                .flat_map(|(_, r)| r)
                .any(|&(f, t)| from < t && f < to)
        };
        if disjoint
            && picked.iter().any(|&i| {
                let (goff, glen) = groups[i];
                overlaps(lsn_of(goff), lsn_of(goff) + glen as u64)
            })
        {
            return false;
        }
        let fs = node.fs.clone();
        if self.damaged.keys().any(|n| *n != id) {
            self.bump("corrupted_beside_other_damage");
        }
        for i in picked {
            let (goff, glen) = groups[i];
            if fs.flip_bits(&path, goff as u64, glen as u64, 1).is_err() {
                return false;
            }
            let from = lsn_of(goff);
            self.damaged
                .entry(id)
                .or_default()
                .push((from, from + glen as u64));
            self.bump("corruptions");
            self.note(format!(
                "node {id}: corrupted a synced group at file offset {goff}"
            ));
        }
        true
    }

    /// Restarts a crashed node (recovery from its storage).
    pub fn restart(&mut self, id: NodeId) {
        if self.nodes[&id].up.is_none() {
            self.note(format!("node {id} restarted"));
            self.start_node(id);
        }
    }

    /// Crashes a node now and restarts it after `down`.
    pub fn crash_for(&mut self, id: NodeId, mode: CrashMode, down: Nanos) {
        self.crash(id, mode);
        let at = self.now + down;
        self.schedule(at, Event::Restart { node: id });
    }

    /// Blocks messages from `a` to `b`.
    pub fn block(&mut self, a: NodeId, b: NodeId) {
        self.blocked.insert((a, b));
    }

    /// Splits the nodes into groups that cannot talk to each other.
    pub fn partition(&mut self, groups: &[Vec<NodeId>]) {
        self.blocked.clear();
        for (i, g) in groups.iter().enumerate() {
            for (j, h) in groups.iter().enumerate() {
                if i != j {
                    for a in g {
                        for b in h {
                            self.blocked.insert((*a, *b));
                        }
                    }
                }
            }
        }
    }

    /// Removes every partition and network fault.
    pub fn heal(&mut self) {
        self.blocked.clear();
        self.net = NetFaults::default();
    }

    /// The node currently in the leader role with the highest proposal id, if any.
    pub fn leader(&self) -> Option<NodeId> {
        self.nodes
            .values()
            .filter_map(|n| n.replica().filter(|r| r.role() == Role::Leader))
            .max_by_key(|r| r.proposal_id())
            .map(|r| r.id())
    }

    /// Appends a record carrying a fresh unique tag through `id`. Returns the ticket and
    /// the tag.
    pub fn append(
        &mut self,
        id: NodeId,
        extra: &[u8],
        ref_csn: u64,
    ) -> Result<(Ticket, u64), AppendError> {
        let local = self.local_now(id);
        let now = self.now;
        let tag = self.next_tag;
        let node = self.nodes.get_mut(&id).expect("node");
        let Some(up) = &mut node.up else {
            return Err(AppendError::NotLeader { leader: None });
        };
        let mut data = tag.to_le_bytes().to_vec();
        data.extend_from_slice(extra);
        // Every other append takes the runtime's lock-free path: open a lane, build the
        // entry outside the replica, close the lane (PALF section 6). Both paths run
        // under every fault the simulator injects.
        let t = if tag % 2 == 1 {
            append_via_lane(&mut up.replica, local, &data, ref_csn)?
        } else {
            up.replica.append(local, &data, ref_csn)?
        };
        if up.replica.access_mode() != AccessMode::Append {
            self.checker.report(
                now,
                format!("node {id}: append accepted in access mode raw-write"),
            );
        }
        self.next_tag = self.next_tag.wrapping_add(0x9E37_79B9);
        node.tags.insert((node.inc, t.id), tag);
        let inc = node.inc;
        self.checker.on_accepted(
            now,
            id,
            inc,
            Accepted {
                tag,
                ticket: t,
                ref_csn,
                mirror: false,
            },
        );
        self.bump("appends_accepted");
        self.pump(id);
        Ok((t, tag))
    }

    /// Mirrors, through `id`, the primary's group at the end of `id`'s log
    /// ([`Replica::mirror`]). Refused (`Lsn`) when that end is no group boundary of the
    /// primary: a leader whose log ends elsewhere (before a switch's barrier committed).
    pub fn mirror(&mut self, id: NodeId) -> Result<Ticket, MirrorError> {
        let local = self.local_now(id);
        let now = self.now;
        let node = self.nodes.get_mut(&id).expect("node");
        let Some(up) = &mut node.up else {
            return Err(MirrorError::NotLeader { leader: None });
        };
        let end = up.replica.end_lsn();
        let Some(p) = &mut self.primary else {
            return Err(MirrorError::Invalid("no primary to mirror".into()));
        };
        let checker = &mut self.checker;
        let Some(bytes) = p.group_at(end, |h| checker.on_generated(h)) else {
            if up.replica.access_mode() == AccessMode::RawWrite {
                *self.stats.entry("mirror_misaligned").or_default() += 1;
            }
            return Err(MirrorError::Lsn {
                expected: end,
                found: end,
            });
        };
        let t = match up.replica.mirror(local, &bytes) {
            Ok(t) => t,
            Err(e) => {
                self.note(format!("node {id}: mirror write at {end} refused: {e}"));
                return Err(e);
            }
        };
        let node = self.nodes.get_mut(&id).expect("node");
        let up = node.up.as_mut().expect("up");
        if up.replica.access_mode() != AccessMode::RawWrite {
            self.checker.report(
                now,
                format!("node {id}: mirror write accepted in access mode append"),
            );
        }
        let inc = node.inc;
        self.checker.on_accepted(
            now,
            id,
            inc,
            Accepted {
                tag: mirror::PRIMARY_MARK,
                ticket: t,
                ref_csn: 0,
                mirror: true,
            },
        );
        self.bump("mirrors_accepted");
        self.pump(id);
        Ok(t)
    }

    /// Asks `id` (the leader) to switch the access mode ([`Replica::change_access_mode`]).
    /// A switch to raw-write starts a new primary at the switch's barrier (the leader's
    /// log end): the log a switched-over primary goes on mirroring.
    pub fn switch_mode(
        &mut self,
        id: NodeId,
        mode: AccessMode,
    ) -> Result<ConfigVersion, ChangeError> {
        let local = self.local_now(id);
        let r = match &mut self.nodes.get_mut(&id).expect("node").up {
            Some(up) => {
                let before = up.replica.access_mode();
                let r = up.replica.change_access_mode(local, mode);
                if r.is_ok() && before != mode && mode == AccessMode::RawWrite {
                    let at = up.replica.log_chain();
                    let epoch = self.primary.as_ref().map_or(0, |p| p.epoch() + 1);
                    let max_group = sim_replica_config(id, &self.opts, self.seed).max_group_bytes;
                    self.primary = Some(mirror::Primary::new(
                        self.seed, epoch, at, BLOCK_SIZE, max_group,
                    ));
                }
                if r.is_ok() && before != mode {
                    self.bump("access_mode_switches");
                    let end = self.nodes[&id].replica().map_or(0, |r| r.end_lsn());
                    self.note(format!(
                        "node {id} switches the access mode to {} at {end}",
                        mode.name()
                    ));
                }
                r
            }
            None => Err(ChangeError::NotLeader),
        };
        self.pump(id);
        r
    }

    /// Asks `id` (the leader) to hand leadership to `to`.
    pub fn transfer(&mut self, id: NodeId, to: NodeId) -> Result<(), ChangeError> {
        let local = self.local_now(id);
        let r = match &mut self.nodes.get_mut(&id).expect("node").up {
            Some(up) => up.replica.transfer_leader(local, to),
            None => Err(ChangeError::NotLeader),
        };
        self.pump(id);
        r
    }

    /// Asks `id` (the leader) to change the membership.
    pub fn change(
        &mut self,
        id: NodeId,
        change: MembershipChange,
    ) -> Result<ConfigVersion, ChangeError> {
        let local = self.local_now(id);
        let r = match &mut self.nodes.get_mut(&id).expect("node").up {
            Some(up) => up.replica.change_membership(local, change),
            None => Err(ChangeError::NotLeader),
        };
        self.pump(id);
        r
    }

    /// Sets a node's election priority.
    pub fn set_priority(&mut self, id: NodeId, p: u32) {
        self.opts.priorities.insert(id, p);
        if let Some(up) = &mut self.nodes.get_mut(&id).expect("node").up {
            up.replica.set_priority(p);
        }
    }

    /// Runs until `until` (true time).
    pub fn run_until(&mut self, until: Nanos) {
        while let Some(Reverse((at, _, _))) = self.events.peek() {
            if *at > until {
                break;
            }
            self.step();
        }
        self.now = self.now.max(until);
    }

    /// Processes the next event.
    pub fn step(&mut self) {
        let Some(Reverse((at, _, k))) = self.events.pop() else {
            return;
        };
        self.now = self.now.max(at);
        let ev = self.payloads.remove(&k).expect("payload");
        match ev {
            Event::Deliver { from, to, msg } => {
                if self.blocked.contains(&(from, to)) {
                    self.bump("messages_blocked");
                    return;
                }
                let local = self.local_now(to);
                self.bump("messages_delivered");
                let Some(up) = &mut self.nodes.get_mut(&to).expect("node").up else {
                    return;
                };
                up.replica.receive(local, from, msg);
                self.pump(to);
            }
            Event::Tick { node, inc } => {
                let n = self.nodes.get_mut(&node).expect("node");
                if n.inc != inc {
                    return;
                }
                let Some(up) = &mut n.up else { return };
                up.tick_due = true;
                let next = self.now + self.tick;
                self.schedule(next, Event::Tick { node, inc });
                self.pump(node);
            }
            Event::ResendTick { node, inc, due } => {
                let n = self.nodes.get_mut(&node).expect("node");
                if n.inc != inc {
                    return;
                }
                let Some(up) = &mut n.up else { return };
                if up.resend_tick != Some(due) {
                    return; // superseded by a later due time
                }
                up.resend_tick = None;
                up.tick_due = true;
                self.bump("resend_ticks");
                self.pump(node);
            }
            Event::SyncDone { node, inc } => {
                let n = self.nodes.get_mut(&node).expect("node");
                if n.inc != inc {
                    return;
                }
                let Some(up) = &mut n.up else { return };
                let Some((point, r)) = up.sync.take() else {
                    return;
                };
                let r = r.unwrap_or_else(|| point.sync());
                match ordered::sync_finished(&mut up.log, &point, r, &self.opts.step) {
                    Ok(flushed) => {
                        up.feedback.push(flushed);
                        // Written while it ran: the next sync starts now.
                        if up.log.end_lsn() > up.log.flushed_end() {
                            let disk = n.disk;
                            self.start_sync(node, inc, disk);
                        }
                        self.pump(node);
                    }
                    Err(_) => self.storage_failure(node),
                }
            }
            Event::MetaDone { node, inc, seq } => {
                let n = self.nodes.get_mut(&node).expect("node");
                if n.inc != inc {
                    return;
                }
                let Some(up) = &mut n.up else { return };
                up.feedback.push(ordered::Feedback::MetaSaved(seq));
                self.pump(node);
            }
            Event::Restart { node } => self.restart(node),
        }
    }

    /// Starts a sync of node `id`'s log up to its end now, ending after a seeded disk
    /// delay. Its `fdatasync` runs now or as it ends (seeded): run now, what is written
    /// during the delay stays unsynced, so a crash may lose that later batch and keep
    /// this one — and a step that reports the later batch durable with this sync is
    /// caught.
    fn start_sync(&mut self, id: NodeId, inc: u32, (lo, hi): (Nanos, Nanos)) {
        let early = self.rng.chance(1, 2);
        let up = self
            .nodes
            .get_mut(&id)
            .expect("node")
            .up
            .as_mut()
            .expect("up");
        let point = match up.log.sync_point() {
            Ok(p) => p,
            Err(_) => return self.storage_failure(id),
        };
        let r = early.then(|| point.sync());
        up.sync = Some((point, r));
        let at = self.now + self.rng.range(lo, hi.max(lo + 1));
        self.schedule(at, Event::SyncDone { node: id, inc });
    }

    fn storage_failure(&mut self, id: NodeId) {
        // A failed write or fsync is never retried and trusted (DESIGN.md principle 4):
        // the process restarts and recovers from what is durable.
        self.bump("storage_failures");
        self.note(format!("node {id} storage failed"));
        self.crash(id, CrashMode::Prefix);
        let down = self.rng.range(10 * MS, 200 * MS);
        let at = self.now + down;
        self.schedule(at, Event::Restart { node: id });
    }

    fn send(&mut self, from: NodeId, to: NodeId, msg: Message) {
        self.bump("messages_sent");
        if !self.nodes.contains_key(&to) {
            return;
        }
        if self.blocked.contains(&(from, to)) {
            self.bump("messages_blocked");
            return;
        }
        let net = self.net;
        if net.loss_ppm > 0 && self.rng.below(1_000_000) < net.loss_ppm as u64 {
            self.bump("messages_lost");
            return;
        }
        let mut held = 0;
        if let Message::Append { groups, .. } = &msg {
            if !groups.is_empty() {
                if let Some(i) = self.holds.iter().position(|h| (h.0, h.1) == (from, to)) {
                    held = self.holds.remove(i).2;
                    self.bump("messages_held");
                }
            }
        }
        let copies = if net.dup_ppm > 0 && self.rng.below(1_000_000) < net.dup_ppm as u64 {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let mut delay = 60_000 + self.rng.below(net.jitter.max(1));
            if net.long_delay_ppm > 0 && self.rng.below(1_000_000) < net.long_delay_ppm as u64 {
                delay += 50 * MS;
            }
            let at = self.now + delay + held;
            self.schedule(
                at,
                Event::Deliver {
                    from,
                    to,
                    msg: msg.clone(),
                },
            );
        }
    }

    /// Steps a node's replica with the runtime's driver step ([`ordered::take_round`],
    /// [`ordered::execute`]) until it has nothing to do. The step's storage is the
    /// node's simulated disk; what it sends, commits and notes is played here, in order,
    /// once the step returns; a sync is scheduled after a seeded disk delay (one in
    /// flight at a time) and a hard-state save is reported after one.
    fn pump(&mut self, id: NodeId) {
        let mut rounds = 0u32;
        loop {
            rounds += 1;
            if rounds > 100_000 {
                // A replica that keeps producing work without time passing is a livelock.
                let now = self.now;
                self.checker
                    .report(now, format!("node {id}: livelock, actions keep coming"));
                let node = self.nodes.get_mut(&id).expect("node");
                if let Some(up) = &mut node.up {
                    up.replica.take_actions();
                }
                return;
            }
            let now = self.now;
            let local = self.local_now(id);
            let node = self.nodes.get_mut(&id).expect("node");
            let inc = node.inc;
            let Some(up) = &mut node.up else { return };
            let tick = std::mem::take(&mut up.tick_due);
            let round = ordered::take_round(&mut up.replica, local, &mut up.feedback, tick);
            if round.is_empty() {
                // Tick the leader when its next timed resend falls due, not on its next
                // periodic tick (5 ms here, far above a simulated round trip).
                let due = up.replica.resend_due();
                if up.resend_tick != due {
                    up.resend_tick = due;
                    if let Some(due) = due {
                        // One already past (the tick did not resend: nothing should be
                        // so) is looked at again a millisecond on, as the runtime does.
                        let at = if due > local {
                            now + (due - local)
                        } else {
                            now + MS
                        };
                        self.schedule(at, Event::ResendTick { node: id, inc, due });
                    }
                }
                return;
            }
            let mut host = StepHost {
                log: &mut up.log,
                meta: &mut up.meta,
                out: Vec::new(),
            };
            let done = ordered::execute(round.actions, &mut host, &self.opts.step);
            let out = host.out;
            for o in out {
                if !self.play(id, inc, o) {
                    return;
                }
            }
            let done = match done {
                Ok(done) => done,
                Err(ordered::StepError::Storage(_)) => {
                    self.storage_failure(id);
                    return;
                }
                Err(ordered::StepError::Broken(why)) => {
                    self.checker.report(now, format!("node {id}: {why}"));
                    return;
                }
            };
            let node = self.nodes.get_mut(&id).expect("node");
            for answer in round.answers {
                match answer {
                    ordered::Answer::Result {
                        id: tid,
                        lsn,
                        outcome,
                        ..
                    } => {
                        node.results.push((inc, tid, lsn, outcome));
                        self.checker.on_result(now, id, inc, tid, lsn, outcome);
                    }
                    ordered::Answer::Unknown { id: tid, lsn } => {
                        node.unknown.push((inc, tid, lsn));
                        *self.stats.entry("outcomes_unknown").or_default() += 1;
                        self.checker.on_unknown(id, inc, tid);
                    }
                }
            }
            if done.restart {
                self.restart_replica(id);
                return;
            }
            let (lo, hi) = node.disk;
            let Some(up) = &node.up else { return };
            if done.wrote && up.sync.is_none() {
                self.start_sync(id, inc, (lo, hi));
            }
            let up = self
                .nodes
                .get_mut(&id)
                .expect("node")
                .up
                .as_mut()
                .expect("up");
            let mut saved = Vec::new();
            for f in done.feedback {
                match f {
                    ordered::Feedback::MetaSaved(seq) => saved.push(seq),
                    f => up.feedback.push(f),
                }
            }
            for seq in saved {
                let at = now + self.rng.range(lo, hi.max(lo + 1));
                self.schedule(at, Event::MetaDone { node: id, inc, seq });
            }
        }
    }

    /// Plays one thing the step did on node `id`; false if the node went down.
    fn play(&mut self, id: NodeId, inc: u32, o: Out) -> bool {
        let now = self.now;
        match o {
            Out::Send(to, msg) => self.send(id, to, msg),
            Out::Committed(end, csn) => {
                // The checker reads the node's own log: what it calls committed must
                // match the history, and its readable CSN the log.
                let Self { nodes, checker, .. } = self;
                let Some(up) = nodes[&id].up.as_ref() else {
                    return false;
                };
                checker.on_commit(now, id, inc, end, &up.log);
                checker.on_readable_csn(now, id, end, csn, &up.log);
            }
            Out::Role { role, pid, leader } => {
                self.checker.on_role(now, id, role, pid);
                if role == Role::Leader {
                    self.bump("leader_elections");
                }
                self.note(format!(
                    "node {id} is {role:?} (pid {pid}, leader {leader:?})"
                ));
            }
            Out::ConfigCommitted(version) => {
                self.bump("config_changes");
                self.note(format!("node {id}: membership {version:?} accepted"));
            }
            Out::Dropped { from, reason } => {
                self.bump("inputs_dropped");
                if std::env::var_os("CHORUS_SIM_TRACE_DROPS").is_some() {
                    self.note(format!("node {id} dropped input from {from:?}: {reason}"));
                }
            }
            Out::Halted(reason) => {
                self.checker
                    .report(now, format!("node {id} halted: {reason}"));
            }
            Out::Rebased(base) => {
                // A damaged replica rebased at a peer's start (which trimmed the damaged
                // range) is repaired too.
                if self.damaged.remove(&id).is_some() {
                    self.bump("damage_rebased");
                }
                self.bump("rebases");
                self.note(format!(
                    "node {id} rebased its log at {} (behind its peer's log start)",
                    base.end_lsn
                ));
                self.checker.on_rebase(now, id, &base);
            }
            Out::Repaired(lsn) => {
                self.damaged.remove(&id);
                self.bump("repairs");
                self.note(format!("node {id} repaired its log at {lsn}"));
            }
            Out::RepairRefused => self.bump("repair_copies_refused"),
            Out::DiscardedDamaged(lsn) => {
                self.damaged.remove(&id);
                self.bump("damage_discarded");
                self.note(format!(
                    "node {id} discarded its uncommitted damaged tail at {lsn}"
                ));
            }
        }
        true
    }
}

/// What the driver step did on a simulated node, kept in order and played by
/// [`Cluster::pump`] once the step returns (the step holds the node's storage while it
/// runs).
enum Out {
    Send(NodeId, Message),
    Committed(chorus_core::Lsn, chorus_core::Csn),
    Role {
        role: Role,
        pid: u64,
        leader: Option<NodeId>,
    },
    ConfigCommitted(chorus_core::format::meta::ConfigVersion),
    Dropped {
        from: Option<NodeId>,
        reason: &'static str,
    },
    Halted(String),
    Rebased(chorus_core::format::group::ChainPoint),
    Repaired(chorus_core::Lsn),
    RepairRefused,
    DiscardedDamaged(chorus_core::Lsn),
}

/// The simulator's [`ordered::Host`]: a node's storage on its simulated disk, and a
/// record of everything else for [`Cluster::pump`] to play.
struct StepHost<'a> {
    log: &'a mut LogStorage,
    meta: &'a mut MetaStorage,
    out: Vec<Out>,
}

impl ordered::Host for StepHost<'_> {
    fn log<R>(&mut self, f: impl FnOnce(&mut LogStorage) -> R) -> R {
        f(self.log)
    }

    fn read_log<R>(&mut self, f: impl FnOnce(&LogStorage) -> R) -> R {
        f(self.log)
    }

    fn meta<R>(&mut self, f: impl FnOnce(&mut MetaStorage) -> R) -> R {
        f(self.meta)
    }

    fn send(&mut self, to: NodeId, msg: Message) {
        self.out.push(Out::Send(to, msg));
    }

    fn committed(&mut self, end: chorus_core::Lsn, csn: chorus_core::Csn) {
        self.out.push(Out::Committed(end, csn));
    }

    fn note(&mut self, note: ordered::Note<'_>) {
        use ordered::Note;
        self.out.push(match note {
            Note::Wrote(_) | Note::Truncated(_) | Note::MetaSaved => return,
            Note::Role { role, pid, leader } => Out::Role { role, pid, leader },
            Note::ConfigCommitted(v) => Out::ConfigCommitted(v),
            Note::Dropped { from, reason } => Out::Dropped { from, reason },
            Note::Halted(why) => Out::Halted(why.to_string()),
            Note::Rebased(base) => Out::Rebased(*base),
            Note::Repaired { lsn, .. } => Out::Repaired(lsn),
            Note::RepairRefused { .. } => Out::RepairRefused,
            Note::DiscardedDamaged(lsn) => Out::DiscardedDamaged(lsn),
        });
    }
}

/// One append through a [`chorus_core::replica::Lane`], as the runtime does it (there
/// with many appenders filling the lane concurrently).
pub fn append_via_lane(
    r: &mut Replica,
    now: Nanos,
    data: &[u8],
    ref_csn: u64,
) -> Result<Ticket, AppendError> {
    let lane = r.open_lane(now)?;
    if data.len() > lane.max_record {
        // Too large for this lane: close it empty and take the ordinary path.
        r.close_lane(now, &lane, Vec::new(), &[])?;
        return r.append(now, data, ref_csn);
    }
    let csn = (lane.last_csn + 1).max(ref_csn);
    let mut body = Vec::new();
    chorus_core::format::entry::encode_entry(&mut body, csn, data);
    let lsn = lane.lsn + chorus_core::format::group::GROUP_HEADER_SIZE as u64;
    let id = r.close_lane(now, &lane, body, &[(lsn, csn)])?;
    Ok(Ticket { id, lsn, csn })
}
