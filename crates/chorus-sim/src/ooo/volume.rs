//! Seeded simulation of a volume over several chunk groups (PolarFS sections 3.2, 4 and
//! 7.2), with the checks the storage layer promises.
//!
//! A volume of `chunks` chunks of `blocks` blocks each lives on `nodes` simulated nodes.
//! Each chunk is a parallel-mode group simulated as the out-of-order simulation does it
//! (`ooo::sim`: the production driver around the real replica and store, on a
//! fault-injecting disk, over a seeded network), on four of the nodes (three voters and a
//! spare), four consecutive nodes (round the ring) from a seeded start. Each chunk's own operators move leadership, **re-replicate**
//! (add the spare, remove or replace a voter: the membership change the control plane's
//! moves make) and trim; its own network loses, delays and duplicates messages.
//!
//! Faults are shared the way machines share them: a node crash takes down every chunk
//! replica on that node at once, and they restart together; a partition cuts all of a
//! node's chunk replicas off together.
//!
//! A client drives the volume as the routing client does:
//! - **writes** of 1–4 blocks anywhere in the volume, split at chunk boundaries by the
//!   routing client's own splitter ([`chorus_client::split::split`]); each piece goes
//!   to its chunk's serving leader as one record declaring its blocks, and the write is
//!   acknowledged only when every piece is committed (a piece refused, failed or of
//!   unknown outcome leaves the write failed or unknown, as the client reports);
//! - **reads** of 1–4 blocks, each piece at its chunk's serving leader behind the
//!   leader-read barrier of the chunk servers (`chorus_server::chunk_io`): the read
//!   notes the leader's committed head when it arrives and is served once the leader
//!   has applied up to it, from the leader's applied state; a leader that steps down
//!   first fails it;
//! - **snapshots**: a snapshot record declaring the whole chunk (the barrier record a
//!   chunk leader logs, `chorus_chunk::op`) appended to every chunk; it begins when the
//!   client starts it and completes when every chunk's record is committed;
//! - at the end, after healing, a read of every block.
//!
//! The checks (on top of every check of the out-of-order simulation, per chunk):
//! 1. **Reads are linearizable per block.** Each block's writes are ordered by their
//!    slots in its chunk's committed log (parallel mode applies overlapping writes in
//!    slot order). A read returns nothing written after it ended, nothing that never
//!    committed, nothing older than a write acknowledged before it began, and nothing
//!    older than what a read that ended before it began returned.
//! 2. **No acknowledged write is lost**: the final reads are reads like any other, after
//!    every acknowledgement, so check 1 holds them to every acknowledged write.
//! 3. **The snapshot guarantee**: in every chunk, a committed snapshot record's slot is
//!    past every piece of a write acknowledged before the snapshot began, and before
//!    every piece of a write issued after it completed; and each replica applies it
//!    after every earlier write to the chunk and before every later one (the chunk's
//!    state machine checks the order as it applies), so what it captures is exactly the
//!    writes below its slot.
//! 4. **Re-replication keeps a majority up to date**: sampled every 10 ms, whenever all
//!    voters of a chunk's final membership are up and none is recovering damaged
//!    entries, every slot committed below the leader's committed head (the last 256
//!    checked) is held by a majority of the voters (in its log, or below its base).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};

use chorus_core::format::meta::NodeId;
use chorus_core::format::ooo::encode_group;
use chorus_core::ooo::group::{self, Record};
use chorus_core::ooo::parallel::BlockRange;
use chorus_core::ooo::replica::{Declared, Mode, OooReadIndexError};
use chorus_core::ooo::Seq;
use chorus_core::replica::{Nanos, Outcome, Role};
use chorus_core::rng::Rng;
use chorus_runtime::ooo::Ev as DriverEv;

use super::sim::{Ev, Sim};
use super::sm::snapshot_record;
use super::OooOptions;
use crate::MS;

/// Settings of a volume simulation.
#[derive(Clone, Debug)]
pub struct VolumeOptions {
    /// Chunks in the volume (each its own group).
    pub chunks: u64,
    /// Blocks per chunk.
    pub blocks: u64,
    /// Nodes (at least 4: each chunk is on four of them).
    pub nodes: u64,
    /// Simulated time with faults.
    pub fault_time: Nanos,
    /// Simulated time to heal and settle afterwards.
    pub settle_time: Nanos,
    /// Inject faults at all (shared crashes and partitions, and each chunk's own).
    pub faults: bool,
    /// How leaders hold reads back.
    pub read_barrier: ReadBarrier,
    /// The chunks' [`OooOptions::late_messages`].
    pub late_messages: bool,
}

/// How a chunk leader holds a read back before serving it from its applied state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadBarrier {
    /// The chunk servers' barrier: the production driver's leader read
    /// ([`chorus_runtime::ooo::Ev::ReadIndex`]): a quorum confirms the leader, which
    /// applies what was committed when the read arrived.
    Confirmed,
    /// Broken: the leader only applies what was committed when the read arrived, with
    /// no quorum confirming it still leads (a deposed leader serves an old state; the
    /// check must bite on it).
    AppliedOnly,
    /// Broken: served as soon as it reaches a leader (the check must bite on it).
    None,
}

impl Default for VolumeOptions {
    fn default() -> Self {
        Self {
            chunks: 3,
            blocks: 16,
            nodes: 5,
            fault_time: 3_000 * MS,
            settle_time: 3_000 * MS,
            faults: true,
            read_barrier: ReadBarrier::Confirmed,
            late_messages: true,
        }
    }
}

/// What one seed did and found.
#[derive(Clone, Debug, Default)]
pub struct VolumeReport {
    /// The seed.
    pub seed: u64,
    /// Invariant violations (empty when the run is clean).
    pub violations: Vec<String>,
    /// Counters.
    pub stats: BTreeMap<&'static str, u64>,
}

/// One piece of a volume write: the append of its blocks to one chunk.
#[derive(Clone, Debug)]
struct WPiece {
    chunk: usize,
    /// Volume blocks written.
    first: u64,
    len: u64,
    /// The append (None: the piece was never appended — no leader, or refused).
    eid: Option<u64>,
    seq: Seq,
    outcome: Option<Outcome>,
    unknown: bool,
}

/// A volume write. Invariant: `acked` is set only when every piece committed.
#[derive(Clone, Debug)]
struct Write {
    invoked: Nanos,
    pieces: Vec<WPiece>,
    acked: Option<Nanos>,
    /// Every piece has an end (an outcome, unknown, or never appended).
    ended: bool,
}

/// A read of one block, done.
#[derive(Clone, Debug)]
struct BlockRead {
    block: u64,
    invoked: Nanos,
    done: Nanos,
    token: u64,
    final_read: bool,
    /// Who served it: chunk, node, its term, and whether a later term's leader served
    /// then.
    by: (usize, NodeId, u64, bool),
}

/// A read piece waiting at a leader for the barrier.
#[derive(Debug)]
struct Waiting {
    chunk: usize,
    node: NodeId,
    incarnation: u64,
    /// The barrier: the driver's answer ([`ReadBarrier::Confirmed`]), or the committed
    /// head when the read arrived, to wait for (the broken variants).
    gate: Gate,
    first: u64,
    len: u64,
    invoked: Nanos,
    final_read: bool,
}

/// A volume snapshot: one record per chunk.
#[derive(Clone, Debug)]
struct Snap {
    id: u64,
    invoked: Nanos,
    /// Per chunk: the append (eid, slot), if it was appended.
    records: Vec<Option<(u64, Seq)>>,
    completed: Option<Nanos>,
}

/// What a waiting read waits for.
#[derive(Debug)]
enum Gate {
    /// The production driver's answer to its leader read.
    Driver(tokio::sync::oneshot::Receiver<Result<(), OooReadIndexError>>),
    /// The leader's applied head reaching this slot (the broken variants).
    Applied(Seq),
}

/// Volume-level events.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum VEv {
    Client,
    Crash(u64),
    Restart(u64),
    Partition(u64),
    Heal,
    Sample,
    FinalReads,
}

struct Vol {
    o: VolumeOptions,
    rng: Rng,
    now: Nanos,
    chunks: Vec<Sim>,
    /// `place[k][i]`: the node hosting chunk k's simulated node i + 1.
    place: Vec<Vec<u64>>,
    queue: BinaryHeap<Reverse<(Nanos, u64, VEv)>>,
    counter: u64,
    writes: Vec<Write>,
    /// Token -> index in `writes`.
    by_token: HashMap<u64, usize>,
    waiting: Vec<Waiting>,
    reads: Vec<BlockRead>,
    snaps: Vec<Snap>,
    violations: Vec<String>,
    stats: BTreeMap<&'static str, u64>,
}

/// Runs one seed: faults for `fault_time`, then everything heals and restarts, then
/// `settle_time` without faults, the final reads, then the checks.
pub fn run_volume_seed(seed: u64, o: &VolumeOptions) -> VolumeReport {
    let mut v = Vol::new(seed, o.clone());
    v.run_until(o.fault_time);
    for (k, sim) in v.chunks.iter_mut().enumerate() {
        sim.faults_on = false;
        for n in sim.nodes.values_mut() {
            n.cut = false;
        }
        let ids: Vec<NodeId> = sim.nodes.keys().copied().collect();
        for id in ids {
            sim.restart(id);
        }
        let _ = k;
    }
    let end = o.fault_time + o.settle_time;
    v.at(end - 800 * MS, VEv::FinalReads);
    v.run_until(end);
    v.final_checks();
    let mut stats = v.stats;
    let mut violations = v.violations;
    for (k, mut sim) in v.chunks.into_iter().enumerate() {
        if sim.violations.is_empty() {
            sim.final_checks();
        }
        violations.extend(sim.violations.iter().map(|x| format!("chunk {k}: {x}")));
        for (name, n) in &sim.stats {
            *stats.entry(name).or_default() += n;
        }
    }
    VolumeReport {
        seed,
        violations,
        stats,
    }
}

/// Runs seeds `start..start + count` on `threads` threads (see
/// [`super::run_batch`]).
pub fn run_volume_batch(
    start: u64,
    count: u64,
    o: &VolumeOptions,
    threads: usize,
    deadline: Option<std::time::Instant>,
) -> Vec<VolumeReport> {
    crate::batch::run_seeds(
        start..start + count,
        threads,
        deadline,
        |seed| run_volume_seed(seed, o),
        |seed, msg| VolumeReport {
            seed,
            violations: vec![format!("panicked: {msg}")],
            stats: BTreeMap::new(),
        },
    )
}

impl Vol {
    fn new(seed: u64, o: VolumeOptions) -> Self {
        assert!(
            o.nodes >= 4 && o.chunks >= 1 && o.blocks >= 2,
            "volume geometry"
        );
        let mut rng = Rng::new(seed ^ 0x564f_4c55_4d45_5321);
        let mut chunks = Vec::new();
        let mut place = Vec::new();
        for k in 0..o.chunks {
            let co = OooOptions {
                mode: Mode::Parallel { span: 2 },
                fault_time: o.fault_time,
                settle_time: o.settle_time,
                faults: o.faults,
                space: o.blocks,
                client: false,
                late_messages: o.late_messages,
                ..OooOptions::default()
            };
            // Each chunk's own seed; its own faults (message loss, crashes inside rounds
            // and IO) stay on, its node-wide crashes and partitions come from here.
            let mut sim = Sim::new(seed.wrapping_mul(31).wrapping_add(k), co);
            // `CHORUS_SIM_TRACE_CHUNK=k` traces chunk k alone (`CHORUS_SIM_TRACE` traces
            // every chunk, interleaved).
            if let Some(c) = std::env::var_os("CHORUS_SIM_TRACE_CHUNK") {
                sim.trace = c.to_str() == Some(&k.to_string());
            }
            chunks.push(sim);
            let start = rng.below(o.nodes);
            place.push((0..4).map(|i| 1 + (start + i) % o.nodes).collect());
        }
        let mut v = Self {
            o,
            rng,
            now: 0,
            chunks,
            place,
            queue: BinaryHeap::new(),
            counter: 0,
            writes: Vec::new(),
            by_token: HashMap::new(),
            waiting: Vec::new(),
            reads: Vec::new(),
            snaps: Vec::new(),
            violations: Vec::new(),
            stats: BTreeMap::new(),
        };
        v.at(2 * MS, VEv::Client);
        v.at(10 * MS, VEv::Sample);
        if v.o.faults {
            let mut t = 100 * MS;
            while t < v.o.fault_time {
                t += 80 * MS + v.rng.below(300 * MS);
                let node = 1 + v.rng.below(v.o.nodes);
                if v.rng.chance(1, 2) {
                    v.at(t, VEv::Crash(node));
                } else {
                    v.at(t, VEv::Partition(node));
                }
            }
        }
        v
    }

    fn at(&mut self, t: Nanos, ev: VEv) {
        self.counter += 1;
        self.queue.push(Reverse((t, self.counter, ev)));
    }

    fn bump(&mut self, k: &'static str, n: u64) {
        *self.stats.entry(k).or_default() += n;
    }

    fn violation(&mut self, v: String) {
        if self.violations.len() < 20 {
            self.violations.push(v);
        }
    }

    /// Chunk k's simulated node hosted on `node`, if it hosts one.
    fn local(&self, k: usize, node: u64) -> Option<NodeId> {
        self.place[k]
            .iter()
            .position(|&n| n == node)
            .map(|i| i as NodeId + 1)
    }

    fn run_until(&mut self, end: Nanos) {
        loop {
            let mine = self.queue.peek().map(|Reverse((t, _, _))| *t);
            let theirs = self
                .chunks
                .iter()
                .enumerate()
                .filter_map(|(k, s)| s.next_time().map(|t| (t, k)))
                .min();
            match (mine, theirs) {
                (Some(t), th) if t <= end && th.is_none_or(|(u, _)| t <= u) => {
                    let Reverse((t, _, ev)) = self.queue.pop().expect("peeked");
                    self.now = t;
                    self.event(ev);
                }
                (_, Some((t, k))) if t <= end => {
                    self.now = t;
                    self.chunks[k].step();
                    self.after_step(k);
                }
                _ => break,
            }
            if self.violations.len() >= 20 || self.chunks.iter().any(|s| s.violations.len() >= 20) {
                return;
            }
        }
        self.now = end;
        for s in &mut self.chunks {
            s.now = end;
        }
    }

    fn event(&mut self, ev: VEv) {
        let t = self.now;
        match ev {
            VEv::Client => {
                if t + 1_000 * MS <= self.o.fault_time + self.o.settle_time {
                    self.client();
                    let next = t + MS + self.rng.below(2 * MS);
                    self.at(next, VEv::Client);
                }
            }
            VEv::Crash(node) => {
                if !self.chunks[0].faults_on {
                    return;
                }
                let mut any = false;
                for k in 0..self.chunks.len() {
                    if let Some(id) = self.local(k, node) {
                        self.chunks[k].now = t;
                        any |= self.chunks[k].crash_only(id);
                    }
                }
                if any {
                    self.bump("node_crashes", 1);
                    let back = t + 20 * MS + self.rng.below(300 * MS);
                    self.at(back, VEv::Restart(node));
                }
            }
            VEv::Restart(node) => {
                for k in 0..self.chunks.len() {
                    if let Some(id) = self.local(k, node) {
                        self.chunks[k].inject(t, Ev::Restart(id));
                    }
                }
            }
            VEv::Partition(node) => {
                if !self.chunks[0].faults_on {
                    return;
                }
                self.bump("node_partitions", 1);
                for k in 0..self.chunks.len() {
                    if let Some(id) = self.local(k, node) {
                        self.chunks[k].nodes.get_mut(&id).expect("node").cut = true;
                    }
                }
                let d = 50 * MS + self.rng.below(400 * MS);
                self.at(t + d, VEv::Heal);
            }
            VEv::Heal => {
                for s in &mut self.chunks {
                    for n in s.nodes.values_mut() {
                        n.cut = false;
                    }
                }
            }
            VEv::Sample => {
                self.sample();
                self.at(t + 10 * MS, VEv::Sample);
            }
            VEv::FinalReads => {
                let total = self.o.chunks * self.o.blocks;
                for k in 0..self.o.chunks {
                    let (first, len) = (k * self.o.blocks, self.o.blocks);
                    self.read_piece(k as usize, first, len, t, true);
                }
                self.bump("final_read_blocks", total);
            }
        }
    }

    /// One client turn: a write, a read or a snapshot.
    fn client(&mut self) {
        let pick = self.rng.below(100);
        if pick < 2 && self.snaps.iter().all(|s| s.completed.is_some()) {
            self.snapshot();
        } else if pick < 55 {
            self.write();
        } else {
            let total = self.o.chunks * self.o.blocks;
            let len = 1 + self.rng.below(4);
            let start = self.rng.below(total - len + 1);
            for p in chorus_client::split::split(start, len, total, self.o.blocks, self.o.blocks)
                .expect("inside the volume")
            {
                let first = p.chunk * self.o.blocks + p.offset;
                self.read_piece(p.chunk as usize, first, p.len, self.now, false);
            }
        }
    }

    /// The serving leader of chunk k the client would reach: the first node that serves.
    fn leader(&self, k: usize) -> Option<NodeId> {
        self.chunks[k]
            .nodes
            .iter()
            .find(|(_, n)| n.replica().is_some_and(|r| r.is_serving()))
            .map(|(&id, _)| id)
    }

    fn write(&mut self) {
        let total = self.o.chunks * self.o.blocks;
        let len = 1 + self.rng.below(4);
        let start = self.rng.below(total - len + 1);
        let token = self.rng.next_u64() | 1;
        let mut pieces = Vec::new();
        for p in chorus_client::split::split(start, len, total, self.o.blocks, self.o.blocks)
            .expect("inside the volume")
        {
            let k = p.chunk as usize;
            let record = Record {
                declared: Declared::Blocks(vec![
                    BlockRange::new(p.offset, p.len).expect("non-empty")
                ]),
                data: token.to_le_bytes().to_vec(),
            };
            let recs = [record];
            let mut piece = WPiece {
                chunk: k,
                first: p.chunk * self.o.blocks + p.offset,
                len: p.len,
                eid: None,
                seq: 0,
                outcome: None,
                unknown: false,
            };
            if let Some((eid, seq)) = self.append_at_leader(k, &recs) {
                piece.eid = Some(eid);
                piece.seq = seq;
            }
            pieces.push(piece);
        }
        self.bump("volume_writes", 1);
        if pieces.len() > 1 {
            self.bump("volume_writes_across_chunks", 1);
        }
        self.by_token.insert(token, self.writes.len());
        self.writes.push(Write {
            invoked: self.now,
            pieces,
            acked: None,
            ended: false,
        });
        self.settle_writes();
    }

    /// Appends `recs` as one entry at chunk k's serving leader and runs its round: the
    /// entry's (eid, slot), or None with no leader or when it refused.
    fn append_at_leader(&mut self, k: usize, recs: &[Record]) -> Option<(u64, Seq)> {
        let node = self.leader(k)?;
        let (declared, data) = (
            group::union(Mode::Parallel { span: 2 }, recs),
            encode_group(recs),
        );
        let sim = &mut self.chunks[k];
        sim.now = self.now;
        let t = sim.append_entry(node, declared, data)?;
        sim.round(node, Vec::new());
        self.after_step(k);
        Some((t.eid, t.seq))
    }

    fn snapshot(&mut self) {
        let id = self.snaps.len() as u64 + 1;
        let mut records = Vec::new();
        for k in 0..self.chunks.len() {
            let recs = [snapshot_record(id, self.o.blocks)];
            let got = self.append_at_leader(k, &recs);
            records.push(got);
        }
        self.bump("snapshots_started", 1);
        self.snaps.push(Snap {
            id,
            invoked: self.now,
            records,
            completed: None,
        });
    }

    /// A read of volume blocks `first..first + len`, all in chunk k, arriving at its
    /// serving leader now.
    fn read_piece(&mut self, k: usize, first: u64, len: u64, invoked: Nanos, final_read: bool) {
        let Some(node) = self.leader(k) else {
            if final_read {
                self.violation(format!("chunk {k}: no serving leader for the final reads"));
            }
            self.bump("reads_no_leader", 1);
            return;
        };
        let incarnation = self.chunks[k].nodes[&node].incarnation;
        let gate = match self.o.read_barrier {
            ReadBarrier::Confirmed => {
                let (tx, rx) = tokio::sync::oneshot::channel();
                let sim = &mut self.chunks[k];
                sim.now = self.now;
                sim.round(node, vec![DriverEv::ReadIndex(tx)]);
                Gate::Driver(rx)
            }
            ReadBarrier::AppliedOnly => Gate::Applied(
                self.chunks[k].nodes[&node]
                    .replica()
                    .map_or(0, |r| r.committed_head()),
            ),
            ReadBarrier::None => Gate::Applied(0),
        };
        self.waiting.push(Waiting {
            chunk: k,
            node,
            incarnation,
            gate,
            first,
            len,
            invoked,
            final_read,
        });
        self.serve_reads(k);
    }

    /// After chunk k's simulation ran a step: reads whose barrier is passed are served,
    /// write and snapshot outcomes noted.
    fn after_step(&mut self, k: usize) {
        self.serve_reads(k);
        self.settle_writes();
    }

    fn serve_reads(&mut self, k: usize) {
        let mut i = 0;
        while i < self.waiting.len() {
            if self.waiting[i].chunk != k {
                i += 1;
                continue;
            }
            let (node, incarnation) = (self.waiting[i].node, self.waiting[i].incarnation);
            let n = &self.chunks[k].nodes[&node];
            let up = n
                .replica()
                .filter(|r| n.incarnation == incarnation && r.role() == Role::Leader)
                .map(|r| (r.applied_head(), r.term()));
            let ready = match (up, &mut self.waiting[i].gate) {
                (None, _) => None,
                (Some((applied, _)), Gate::Applied(want)) => Some(applied >= *want),
                (Some(_), Gate::Driver(rx)) => match rx.try_recv() {
                    Ok(Ok(())) => Some(true),
                    Err(tokio::sync::oneshot::error::TryRecvError::Empty) => Some(false),
                    // Refused (deposed) or the driver gone: the read fails.
                    Ok(Err(_)) | Err(_) => None,
                },
            };
            let Some(ready) = ready else {
                let w = self.waiting.swap_remove(i);
                if w.final_read {
                    // The final reads go again to whoever leads now.
                    self.read_piece(k, w.first, w.len, w.invoked, true);
                    return;
                }
                self.bump("reads_failed", 1);
                continue;
            };
            if !ready {
                i += 1;
                continue;
            }
            let term = up.map_or(0, |u| u.1);
            let deposed = self.chunks[k]
                .nodes
                .values()
                .filter_map(|n| n.replica())
                .any(|o| o.term() > term && o.is_serving());
            if deposed {
                // A leader that has not yet heard of its successor: what it serves must
                // still pass the checks.
                *self.stats.entry("reads_at_deposed_leader").or_default() += 1;
            }
            let w = &self.waiting[i];
            let n = &self.chunks[k].nodes[&w.node];
            let sm = n.sm.as_ref().expect("up");
            let state = sm.vol();
            let base = k as u64 * self.o.blocks;
            let got: Vec<(u64, u64)> = (w.first..w.first + w.len)
                .map(|b| (b, state.state.get(&(b - base)).copied().unwrap_or(0)))
                .collect();
            drop(state);
            let w = self.waiting.swap_remove(i);
            for (block, token) in got {
                self.reads.push(BlockRead {
                    block,
                    invoked: w.invoked,
                    done: self.now,
                    token,
                    final_read: w.final_read,
                    by: (k, w.node, term, deposed),
                });
            }
            self.bump("read_pieces_served", 1);
        }
    }

    /// Notes the outcomes of writes and snapshots that ended.
    fn settle_writes(&mut self) {
        let now = self.now;
        for w in self.writes.iter_mut().filter(|w| !w.ended) {
            let mut all_ended = true;
            for p in &mut w.pieces {
                let Some(eid) = p.eid else { continue };
                if p.outcome.is_none() && !p.unknown {
                    if let Some(a) = self.chunks[p.chunk].appends.get(&eid) {
                        p.outcome = a.3;
                        p.unknown = a.4;
                    }
                }
                if p.outcome.is_none() && !p.unknown {
                    all_ended = false;
                }
            }
            if all_ended {
                w.ended = true;
                let acked = w
                    .pieces
                    .iter()
                    .all(|p| p.outcome == Some(Outcome::Committed));
                if acked {
                    w.acked = Some(now);
                }
                *self
                    .stats
                    .entry(if acked {
                        "volume_writes_acked"
                    } else {
                        "volume_writes_not_acked"
                    })
                    .or_default() += 1;
            }
        }
        for s in self.snaps.iter_mut().filter(|s| s.completed.is_none()) {
            let mut done = true;
            for (k, r) in s.records.iter().enumerate() {
                match r {
                    Some((eid, _)) => {
                        let a = self.chunks[k].appends.get(eid);
                        if a.and_then(|a| a.3) != Some(Outcome::Committed) {
                            done = false;
                        }
                        if a.is_some_and(|a| a.4 || a.3 == Some(Outcome::Failed)) {
                            // It will never complete: count it as ended, not completed.
                            s.completed = Some(Nanos::MAX);
                        }
                    }
                    None => s.completed = Some(Nanos::MAX),
                }
            }
            if done && s.completed.is_none() {
                s.completed = Some(now);
                *self.stats.entry("snapshots_completed").or_default() += 1;
            }
        }
    }

    /// Check 4 (see the module docs).
    fn sample(&mut self) {
        for k in 0..self.chunks.len() {
            let Some(l) = self.leader(k) else { continue };
            let sim = &self.chunks[k];
            let r = sim.nodes[&l].replica().expect("serving");
            let m = r.membership();
            if m.prev.is_some() {
                continue;
            }
            let voters = m.voters.clone();
            let up: Vec<_> = voters
                .iter()
                .filter_map(|v| sim.nodes.get(v).and_then(|n| n.replica()))
                .collect();
            if up.len() != voters.len() || up.iter().any(|r| r.is_recovering_lost()) {
                continue;
            }
            let head = r.committed_head();
            let mut bad = None;
            for (&seq, e) in sim.committed.range(head.saturating_sub(256)..head) {
                let holders = up.iter().filter(|r| r.holds(seq, e.eid)).count();
                if holders * 2 <= voters.len() {
                    bad = Some((seq, holders));
                    break;
                }
            }
            self.bump("majority_samples", 1);
            if let Some((seq, holders)) = bad {
                self.violation(format!(
                    "chunk {k}: committed slot {seq} is held by {holders} of the voters \
                     {voters:?} (all up)"
                ));
            }
        }
    }

    /// The slot of the piece of write `token` on `block`, and whether that piece is the
    /// committed entry at its slot.
    fn slot_of(&self, token: u64, block: u64) -> Option<(Seq, bool)> {
        let w = &self.writes[*self.by_token.get(&token)?];
        let p = w
            .pieces
            .iter()
            .find(|p| (p.first..p.first + p.len).contains(&block))?;
        let eid = p.eid?;
        let committed = self.chunks[p.chunk]
            .committed
            .get(&p.seq)
            .is_some_and(|e| e.eid == eid);
        Some((p.seq, committed))
    }

    fn final_checks(&mut self) {
        if !self.waiting.iter().all(|w| !w.final_read) {
            self.violation("final reads not served by the end".into());
        }
        let finals = self.reads.iter().filter(|r| r.final_read).count() as u64;
        if finals < self.o.chunks * self.o.blocks {
            self.violation(format!(
                "{finals} final block reads served of {}",
                self.o.chunks * self.o.blocks
            ));
        }
        self.check_reads();
        self.check_snapshots();
    }

    /// Check 1 (and 2, through the final reads).
    fn check_reads(&mut self) {
        // Per block: every acknowledged write's slot, with its ack time and invocation.
        let mut acked: HashMap<u64, Vec<(Nanos, Seq)>> = HashMap::new();
        let mut issued: HashMap<u64, Vec<(Nanos, Seq)>> = HashMap::new();
        for w in &self.writes {
            for p in &w.pieces {
                let Some(eid) = p.eid else { continue };
                let committed = self.chunks[p.chunk]
                    .committed
                    .get(&p.seq)
                    .is_some_and(|e| e.eid == eid);
                for b in p.first..p.first + p.len {
                    if let Some(t) = w.acked {
                        acked.entry(b).or_default().push((t, p.seq));
                    }
                    if committed {
                        issued.entry(b).or_default().push((w.invoked, p.seq));
                    }
                }
            }
        }
        let mut found = Vec::new();
        // Per block: each read's (invoked, done, slot returned).
        let mut by_block: HashMap<u64, Vec<(Nanos, Nanos, Option<Seq>)>> = HashMap::new();
        for r in &self.reads {
            let slot = if r.token == 0 {
                None
            } else {
                match self.slot_of(r.token, r.block) {
                    Some((seq, true)) => Some(seq),
                    Some((seq, false)) => {
                        found.push(format!(
                            "block {}: a read returned the write at slot {seq}, which never \
                             committed there",
                            r.block
                        ));
                        continue;
                    }
                    None => {
                        found.push(format!(
                            "block {}: a read returned {:#x}, which no write put there",
                            r.block, r.token
                        ));
                        continue;
                    }
                }
            };
            let issued_at = self.by_token.get(&r.token).map(|&i| self.writes[i].invoked);
            if let Some(t) = issued_at.filter(|&t| t > r.done) {
                found.push(format!(
                    "block {}: a read ended at {}us with a write issued at {}us",
                    r.block,
                    r.done / 1000,
                    t / 1000
                ));
            }
            let at = slot.map_or(0, |s| s + 1);
            for &(t, s) in acked.get(&r.block).into_iter().flatten() {
                if t < r.invoked && s + 1 > at {
                    found.push(format!(
                        "block {}: a {}read begun at {}us returned slot {slot:?}, older than \
                         slot {s} acknowledged at {}us (served at {}us by {:?})",
                        r.block,
                        if r.final_read { "final " } else { "" },
                        r.invoked / 1000,
                        t / 1000,
                        r.done / 1000,
                        r.by
                    ));
                }
            }
            for &(t, s) in issued.get(&r.block).into_iter().flatten() {
                if t > r.done && s < at {
                    found.push(format!(
                        "block {}: a read ended at {}us returned slot {slot:?}, past slot {s} \
                         of a write issued at {}us",
                        r.block,
                        r.done / 1000,
                        t / 1000
                    ));
                }
            }
            by_block
                .entry(r.block)
                .or_default()
                .push((r.invoked, r.done, slot));
        }
        for (b, mut rs) in by_block {
            rs.sort_by_key(|x| x.1);
            // Reads in real-time order never go back: the latest slot of the reads that
            // ended before each one began bounds it from below.
            for (i, &(inv, _, slot)) in rs.iter().enumerate() {
                let before = rs[..i]
                    .iter()
                    .filter(|x| x.1 < inv)
                    .map(|x| x.2.map_or(0, |s| s + 1))
                    .max()
                    .unwrap_or(0);
                if slot.map_or(0, |s| s + 1) < before {
                    found.push(format!(
                        "block {b}: a read begun at {}us returned slot {slot:?}, older than an \
                         earlier read's",
                        inv / 1000
                    ));
                }
            }
        }
        self.bump("block_reads_checked", self.reads.len() as u64);
        for f in found.into_iter().take(10) {
            self.violation(f);
        }
    }

    /// Check 3's slot relations (the apply order is checked by each chunk's state
    /// machine).
    fn check_snapshots(&mut self) {
        let mut found = Vec::new();
        for s in &self.snaps {
            for (k, r) in s.records.iter().enumerate() {
                let Some((eid, seq)) = *r else { continue };
                let committed = self.chunks[k]
                    .committed
                    .get(&seq)
                    .is_some_and(|e| e.eid == eid);
                if !committed {
                    continue;
                }
                for w in &self.writes {
                    for p in w.pieces.iter().filter(|p| p.chunk == k) {
                        let Some(peid) = p.eid else { continue };
                        let in_log = self.chunks[k]
                            .committed
                            .get(&p.seq)
                            .is_some_and(|e| e.eid == peid);
                        if !in_log {
                            continue;
                        }
                        if w.acked.is_some_and(|t| t < s.invoked) && p.seq > seq {
                            found.push(format!(
                                "chunk {k}: snapshot {} at slot {seq} misses the write at slot \
                                 {} acknowledged before it began",
                                s.id, p.seq
                            ));
                        }
                        if s.completed.is_some_and(|t| t < w.invoked) && p.seq < seq {
                            found.push(format!(
                                "chunk {k}: snapshot {} at slot {seq} holds the write at slot \
                                 {} issued after it completed",
                                s.id, p.seq
                            ));
                        }
                    }
                }
            }
        }
        for f in found.into_iter().take(10) {
            self.violation(f);
        }
    }
}
