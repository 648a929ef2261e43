//! `chorus-bench ooo`: the out-of-order modes against the ordered runtime, three replica
//! **processes** per system, fsync on, loopback TCP (issue 6's benchmarks).
//!
//! # Setup (every system alike)
//!
//! Node 1, the leader, runs in the benchmark process with the closed-loop clients
//! co-located (as PALF measured and as `chorus bench --local --path embedded` does);
//! nodes 2 and 3 are child processes of the same binary (`chorus-bench replica`, hidden),
//! each with its own data directory, fdatasync-durable. Node 1 is made to lead: the
//! ordered replica gets the highest election priority, an out-of-order node a tenth of
//! the others' election timeout. Every point is a fresh cluster in fresh directories;
//! the children are killed and reaped on every exit path (also when this process dies:
//! `PR_SET_PDEATHSIG`) and the directories removed.
//!
//! Jitter: a TCP proxy in this process in front of node 3's replication port, through
//! which the leader dials node 3 ([`proxy`]): each chunk the leader sends is delayed by a
//! random time in `[0, --jitter-ms)` but never overtakes an earlier one. With
//! `--reorder` each *frame* is delayed by its own draw and may overtake earlier ones (a
//! link of several connections, one of them slow: PolarFS section 5.1); with
//! `--jitter-links 2` node 2's link is proxied the same way, so no majority avoids the
//! jitter. `--reorder --connections K` makes each proxied link K connections of which only
//! one jitters (frames spread over them at random), PolarFS's "one connection blocks or
//! becomes slow" taken literally. The same proxy
//! for every system (the out-of-order driver's own `link_jitter` is not used).
//!
//! # Systems
//!
//! - `ordered`: the main runtime ([`chorus_runtime::Env`], the PALF replica): records are
//!   opaque bytes, committed and applied in log order.
//! - `parallel`: [`OooNode`] in `Mode::Parallel { span: 2 }` (ParallelRaft): each record
//!   declares block ranges; an entry commits once a majority has it.
//! - `parallel-txn`: the same, committing in conflict order (`conflict_order`): an entry
//!   commits only after every earlier entry overlapping its blocks — the DP-Raft paper's
//!   adaptation of ParallelRaft to transactions (section 5: "when an entry enters the
//!   commit phase, it will check to see if the read and write set are overlapping with
//!   other entries"). Plain `parallel` gives a transaction no commit order: one that read
//!   a key an uncommitted transaction wrote may be reported committed first.
//! - `dependent`: [`OooNode`] in `Mode::Dependent` (DP-Raft): each record declares a read
//!   set and a write set.
//! - `in-order`: a same-driver control — dependent mode with every record reading and
//!   writing key 0, so each entry waits for its predecessor to commit and apply.
//!
//! # Workloads
//!
//! - **block** (PolarFS Fig. 7): 4 KiB writes at a uniformly random 4 KiB block of a
//!   1 GiB volume (2^18 blocks), IO depth = closed-loop clients. `parallel` declares the
//!   block; `dependent` (if asked for) writes key = block and reads nothing; `in-order`
//!   key 0; `ordered` carries the same 4 KiB opaquely.
//! - **ycsb** (DP-Raft section 5): each transaction reads one key and writes one key,
//!   both drawn from `--keys` (10 million) keys by Zipf(θ) ([`zipf`]); the record is
//!   `--value-bytes` (100, the paper's record size) holding its id and the two keys.
//!   `dependent` declares `read_set = [r]`, `write_set = [w]`; `parallel` and `parallel-txn` are adapted as
//!   the DP-Raft paper adapted ParallelRaft: key k is block range `[k, k+1)`, and the
//!   record declares the ranges of both its read key and its write key (one range if they
//!   are equal), so parallel mode treats a shared read key as a conflict too; `ordered`
//!   carries the same bytes opaquely.
//!
//! # Follower apply gap (ycsb)
//!
//! Every record's first 8 bytes are a unique id. Each node notes `(id, CLOCK_MONOTONIC)`
//! when it applies the record ([`node`] says what applying is for each system); the
//! children write theirs to a file at the end of the point. The gap of a record is
//! follower apply − leader apply, over the records the leader applied in the measured
//! interval, pooled over both followers (also reported per follower).

pub mod gap;
pub mod node;
pub mod proxy;
pub use chorus_workload::zipf;

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child as Proc, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use chorus_core::ooo::parallel::BlockRange;
use chorus_core::ooo::replica::Declared;
use chorus_core::replica::{Outcome, Role};
use chorus_core::rng::Rng;
use chorus_runtime::ooo::OooNode;
use chorus_runtime::LogHandle;

use gap::{mono_ns, GapStats};
use node::{NodeOpts, Recorder, Running};
use proxy::{JitterProxy, Shape};
use zipf::Zipf;

/// A benchmarked system.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum System {
    /// The main runtime's ordered (PALF) replica.
    Ordered,
    /// Out-of-order parallel mode (ParallelRaft, span 2).
    Parallel,
    /// Parallel mode committing in conflict order: the DP-Raft paper's adaptation of
    /// ParallelRaft to transactions (section 5; [`OooConfig::conflict_order`]).
    ///
    /// [`OooConfig::conflict_order`]: chorus_core::ooo::replica::OooConfig::conflict_order
    ParallelTxn,
    /// Out-of-order dependent mode (DP-Raft).
    Dependent,
    /// Dependent mode with every record conflicting with its predecessor.
    InOrder,
    /// The ordered replica with both of its repairs off — gap resends
    /// ([`chorus_core::replica::ReplicaConfig::gap_resend_after`]) and timed resends
    /// ([`chorus_core::replica::ReplicaConfig::timed_resend`]) — whatever `--hole-resend`
    /// and `--timed-resend` say: a follower holding frames that overtook a late one
    /// acknowledges nothing past it until it arrives. The Raft PolarFS measured (section
    /// 5.1: a follower "cannot send an acknowledge ... until those preceding missing log
    /// entries arrived"); named explicitly, never in a default sweep, and never what
    /// `ordered` means in a ratio.
    OrderedNoRepair,
}

impl System {
    /// Every system.
    pub const ALL: [System; 6] = [
        System::Ordered,
        System::Parallel,
        System::ParallelTxn,
        System::Dependent,
        System::InOrder,
        System::OrderedNoRepair,
    ];

    /// The name used on the command line and in the results.
    pub fn name(self) -> &'static str {
        match self {
            System::Ordered => "ordered",
            System::Parallel => "parallel",
            System::ParallelTxn => "parallel-txn",
            System::Dependent => "dependent",
            System::InOrder => "in-order",
            System::OrderedNoRepair => "ordered-no-repair",
        }
    }

    /// Whether it is the ordered (PALF) replica, with or without its repairs.
    pub fn is_ordered(self) -> bool {
        matches!(self, System::Ordered | System::OrderedNoRepair)
    }

    /// Parses a name from [`System::name`].
    pub fn parse(s: &str) -> Result<Self, String> {
        System::ALL
            .into_iter()
            .find(|x| x.name() == s)
            .ok_or_else(|| {
                format!("unknown system {s:?}: expected ordered, parallel, parallel-txn, dependent, in-order or ordered-no-repair")
            })
    }
}

/// A part of the benchmark.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Part {
    /// 4 KiB block writes, IO depth swept.
    Block,
    /// YCSB-like transactions, clients swept at one θ.
    YcsbClients,
    /// YCSB-like transactions, θ swept at one client count.
    YcsbTheta,
}

impl Part {
    /// The name used on the command line and in the results.
    pub fn name(self) -> &'static str {
        match self {
            Part::Block => "block",
            Part::YcsbClients => "ycsb-clients",
            Part::YcsbTheta => "ycsb-theta",
        }
    }

    /// Parses a name from [`Part::name`].
    pub fn parse(s: &str) -> Result<Self, String> {
        [Part::Block, Part::YcsbClients, Part::YcsbTheta]
            .into_iter()
            .find(|x| x.name() == s)
            .ok_or_else(|| {
                format!("unknown part {s:?}: expected block, ycsb-clients or ycsb-theta")
            })
    }
}

/// Everything a sweep needs.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Settings {
    /// Scratch directory for the nodes' data. Each run works in a subdirectory of its own
    /// ([`Scratch`]), a fresh one per point inside it, and removes only that: runs may
    /// share this directory.
    pub dir: PathBuf,
    /// Seconds measured per point.
    pub seconds: f64,
    /// Seconds of warm-up per point (after the leader committed a probe).
    pub warmup: f64,
    /// Sweeps (every point of every repeat is kept; medians are reported).
    pub repeats: usize,
    /// Which parts to run.
    pub parts: Vec<Part>,
    /// Block part: IO depths.
    pub depths: Vec<usize>,
    /// Block part: systems.
    pub block_systems: Vec<System>,
    /// Block part: bytes per write.
    pub block_bytes: usize,
    /// Block part: jitter bound on the leader → node 3 link, ms (0: no proxy).
    pub jitter_ms: f64,
    /// YCSB parts: systems.
    pub ycsb_systems: Vec<System>,
    /// YCSB clients sweep: client counts.
    pub clients: Vec<usize>,
    /// YCSB clients sweep: θ.
    pub theta: f64,
    /// YCSB θ sweep: the θs.
    pub thetas: Vec<f64>,
    /// YCSB θ sweep: clients.
    pub theta_clients: usize,
    /// YCSB: keys.
    pub keys: u64,
    /// YCSB: record bytes.
    pub value_bytes: usize,
    /// YCSB: jitter bound on the leader → node 3 link, ms (0: no proxy).
    pub ycsb_jitter_ms: f64,
    /// The jitter reorders whole frames (each delayed by its own draw, PolarFS 5.1's
    /// slow connection among several) instead of keeping byte order ([`proxy::Shape`]).
    pub reorder: bool,
    /// How many leader → follower links get the jitter: 1 (node 3) or 2 (nodes 2 and 3).
    pub jitter_links: usize,
    /// With `reorder`: 0 — every frame jitters; K ≥ 2 — each jittered link stands for K
    /// connections, frames spread over them at random, one of them jitters
    /// ([`proxy::Shape::SlowConnection`]).
    pub connections: u32,
    /// Out-of-order leaders: [`chorus_core::ooo::replica::OooConfig::hole_resend`];
    /// ordered followers: [`chorus_core::replica::ReplicaConfig::gap_resend_after`].
    pub hole_resend: u64,
    /// Leaders of every system: [`chorus_core::ooo::replica::OooConfig::timed_resend`],
    /// [`chorus_core::replica::ReplicaConfig::timed_resend`] (0: off).
    pub timed_resend: u32,
    /// Out-of-order leaders: [`chorus_runtime::ooo::OooNodeConfig::freeze_interval`],
    /// µs (0: pack appends every driver round).
    pub ooo_freeze_us: u64,
    /// Bytes of zeros every node's log keeps written past its end, in every system.
    pub preallocate: u64,
    /// Out-of-order nodes append with direct IO
    /// ([`chorus_runtime::ooo::OooNodeConfig::direct_io`]).
    pub ooo_direct_io: bool,
    /// Out-of-order nodes compact their entries past this many bytes
    /// ([`chorus_runtime::ooo::OooNodeConfig::compact_bytes`]; 0: never).
    pub ooo_compact_bytes: u64,
    /// Out-of-order nodes: apply threads (0: the driver thread applies).
    pub apply_threads: usize,
    /// Microseconds each record's apply takes on every node of every system (asleep:
    /// [`node::Recorder`]); 0: applying costs nothing but noting it.
    pub apply_us: u64,
    /// Out-of-order nodes: node 1's election timeout, ms; nodes 2 and 3 get
    /// [`FOLLOWER_ELECTION_FACTOR`] times it, so node 1 campaigns first. The driver's
    /// heartbeat and resend intervals are a sixth of a node's election timeout.
    pub ooo_election_ms: u64,
}

/// How much longer the election timeout of nodes 2 and 3 is than node 1's.
pub const FOLLOWER_ELECTION_FACTOR: u64 = 5;

/// The election timeout of out-of-order node `id`.
pub fn election_of(s: &Settings, id: u64) -> Duration {
    let ms = if id == 1 {
        s.ooo_election_ms
    } else {
        s.ooo_election_ms * FOLLOWER_ELECTION_FACTOR
    };
    Duration::from_millis(ms)
}

impl Settings {
    /// Checks the ranges; the error names the flag.
    pub fn check(&self) -> Result<(), String> {
        let pos = |name: &str, v: f64| {
            if v.is_finite() && v > 0.0 && v <= 3600.0 {
                Ok(())
            } else {
                Err(format!("--{name} {v}: expected 0 < seconds ≤ 3600"))
            }
        };
        pos("seconds", self.seconds)?;
        if !(0.0..=3600.0).contains(&self.warmup) {
            return Err(format!(
                "--warmup {}: expected 0 to 3600 seconds",
                self.warmup
            ));
        }
        if self.repeats == 0 || self.repeats > 100 {
            return Err(format!("--repeats {}: expected 1 to 100", self.repeats));
        }
        if self.parts.is_empty() {
            return Err("--parts: name at least one of block, ycsb-clients, ycsb-theta".into());
        }
        let counts = |name: &str, v: &[usize]| {
            if v.is_empty() || v.iter().any(|&c| c == 0 || c > 4096) {
                Err(format!("--{name} {v:?}: expected a list of 1 to 4096"))
            } else {
                Ok(())
            }
        };
        let has = |p| self.parts.contains(&p);
        if has(Part::Block) {
            counts("depths", &self.depths)?;
            if self.block_systems.is_empty() {
                return Err("--block-systems: name at least one system".into());
            }
            if !(16..=(1 << 20)).contains(&self.block_bytes) {
                return Err(format!(
                    "--block-bytes {}: expected 16 to 1048576",
                    self.block_bytes
                ));
            }
        }
        for (name, j) in [
            ("jitter-ms", self.jitter_ms),
            ("ycsb-jitter-ms", self.ycsb_jitter_ms),
        ] {
            if !(0.0..=1000.0).contains(&j) {
                return Err(format!("--{name} {j}: expected 0 to 1000 ms"));
            }
        }
        if !(1..=2).contains(&self.jitter_links) {
            return Err(format!(
                "--jitter-links {}: expected 1 (node 3) or 2 (nodes 2 and 3)",
                self.jitter_links
            ));
        }
        if self.connections != 0 && !(2..=64).contains(&self.connections) {
            return Err(format!(
                "--connections {}: expected 2 to 64 (or 0: every frame jitters)",
                self.connections
            ));
        }
        if self.connections != 0 && !self.reorder {
            return Err(format!(
                "--connections {} needs --reorder: frames are what the connections carry",
                self.connections
            ));
        }
        if has(Part::YcsbClients) || has(Part::YcsbTheta) {
            if self.ycsb_systems.is_empty() {
                return Err("--ycsb-systems: name at least one system".into());
            }
            if self.keys < 2 {
                return Err(format!("--keys {}: expected at least 2", self.keys));
            }
            if !(24..=(1 << 20)).contains(&self.value_bytes) {
                return Err(format!(
                    "--value-bytes {}: expected 24 (id and two keys) to 1048576",
                    self.value_bytes
                ));
            }
        }
        if has(Part::YcsbClients) {
            counts("clients", &self.clients)?;
            Zipf::new(2, self.theta).map_err(|e| format!("--theta: {e}"))?;
        }
        if has(Part::YcsbTheta) {
            counts("theta-clients", &[self.theta_clients])?;
            if self.thetas.is_empty() {
                return Err("--thetas: name at least one θ".into());
            }
            for &t in &self.thetas {
                Zipf::new(2, t).map_err(|e| format!("--thetas: {e}"))?;
            }
        }
        if !(60..=60_000).contains(&self.ooo_election_ms) {
            return Err(format!(
                "--ooo-election-ms {}: expected 60 to 60000",
                self.ooo_election_ms
            ));
        }
        if self.apply_threads > 64 {
            return Err(format!(
                "--apply-threads {}: expected 0 to 64",
                self.apply_threads
            ));
        }
        if self.apply_us > 1_000_000 {
            return Err(format!(
                "--apply-us {}: expected 0 to 1000000",
                self.apply_us
            ));
        }
        Ok(())
    }
}

/// One measured point (one system, one x value, one repeat).
#[derive(Clone, Debug, serde::Serialize)]
pub struct Point {
    /// The part.
    pub part: Part,
    /// The system.
    pub system: System,
    /// Repeat number (0-based).
    pub repeat: usize,
    /// Closed-loop clients (the IO depth of the block part).
    pub clients: usize,
    /// Zipf θ (YCSB parts).
    pub theta: Option<f64>,
    /// Committed appends (transactions) per second.
    pub ops_per_sec: f64,
    /// Appends that started and committed inside the measured interval.
    pub committed: u64,
    /// Appends that failed or were refused (whole run, warm-up included).
    pub errors: u64,
    /// Length of the measured interval.
    pub seconds: f64,
    /// Commit latency, mean, µs.
    pub lat_mean_us: f64,
    /// Commit latency, median, µs.
    pub lat_p50_us: f64,
    /// Commit latency, 99th percentile, µs.
    pub lat_p99_us: f64,
    /// CPU seconds per second of nodes 1 (with the clients and the proxy), 2 and 3.
    pub cpu: Vec<f64>,
    /// Follower apply gap over both followers (YCSB parts).
    pub gap: Option<GapStats>,
    /// The same per follower (node 2, node 3).
    pub gap_per_follower: Vec<Option<GapStats>>,
    /// Staleness over both followers (YCSB parts): a follower's apply of a record minus
    /// the moment its client was told it committed, over the records committed inside the
    /// measured interval. Unlike the gap it does not depend on how late the leader
    /// applies (with `--apply-us` an ordered leader applies late too).
    pub staleness: Option<GapStats>,
    /// Of the records committed inside the measured interval, the fraction each follower
    /// (node 2, node 3) had applied when the point ended (the clients stopped and the
    /// followers were asked for their applies).
    pub applied_by_end: Vec<f64>,
    /// Why the point failed, if it did (its figures are then zero).
    pub error: Option<String>,
    /// Out-of-order systems: node 1's terms during the measured interval (from, to): a
    /// change means it lost leadership (a stall of an election timeout or more).
    pub terms: Option<(u64, u64)>,
    /// Out-of-order systems: records per group entry node 1 appended in the measured
    /// interval.
    pub records_per_entry: Option<f64>,
    /// Out-of-order systems: of node 1's group entries in the measured interval, the
    /// fraction admitted with an uncommitted predecessor to commit after (RAW in dependent
    /// mode, an overlap under conflict order; `OooStats::admitted_after`).
    pub after_per_entry: Option<f64>,
    /// The same, for entries the commit rule held back: a majority had them before that
    /// predecessor committed (`OooStats::held_at_quorum`).
    pub held_per_entry: Option<f64>,
    /// Out-of-order systems, node 1 in the measured interval (`OooLatency`): mean µs from
    /// an append's submission to its packing into a group entry.
    pub queue_mean_us: Option<f64>,
    /// The same: mean µs of node 1's write-and-fdatasync of its entries file.
    pub fsync_mean_us: Option<f64>,
    /// The same: mean µs from an entry's first send to node 2, then node 3, to that
    /// node's acknowledgement (a slow connection's delays and their repair show here).
    pub peer_ack_mean_us: Vec<f64>,
}

/// What one point runs.
#[derive(Clone, Debug)]
struct Cell {
    part: Part,
    clients: usize,
    theta: Option<f64>,
    systems: Vec<System>,
}

fn cells(s: &Settings) -> Vec<Cell> {
    let mut v = Vec::new();
    for &p in &s.parts {
        match p {
            Part::Block => v.extend(s.depths.iter().map(|&d| Cell {
                part: p,
                clients: d,
                theta: None,
                systems: s.block_systems.clone(),
            })),
            Part::YcsbClients => v.extend(s.clients.iter().map(|&c| Cell {
                part: p,
                clients: c,
                theta: Some(s.theta),
                systems: s.ycsb_systems.clone(),
            })),
            Part::YcsbTheta => v.extend(s.thetas.iter().map(|&t| Cell {
                part: p,
                clients: s.theta_clients,
                theta: Some(t),
                systems: s.ycsb_systems.clone(),
            })),
        }
    }
    v
}

/// Runs every part `repeats` times, the systems alternating point by point (their order
/// rotates each point and repeat); `progress` sees each point as it is measured. A point
/// that fails is kept with its error and the sweep goes on.
pub fn run(s: &Settings, mut progress: impl FnMut(&Point)) -> Result<Vec<Point>, String> {
    s.check()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let scratch = Scratch::create(&s.dir)?;
    let root = scratch.path();
    let mut zipfs: HashMap<u64, Arc<Zipf>> = HashMap::new();
    let mut out = Vec::new();
    let all = cells(s);
    for r in 0..s.repeats {
        for (i, c) in all.iter().enumerate() {
            let zipf = match c.theta {
                Some(t) => Some(match zipfs.get(&t.to_bits()) {
                    Some(z) => z.clone(),
                    None => {
                        let z = Arc::new(Zipf::new(s.keys, t)?);
                        zipfs.insert(t.to_bits(), z.clone());
                        z
                    }
                }),
                None => None,
            };
            let n = c.systems.len();
            for k in 0..n {
                let sys = c.systems[(k + r + i) % n];
                let p = point(&rt, &exe, root, s, c, sys, r, zipf.clone());
                progress(&p);
                out.push(p);
            }
        }
    }
    Ok(out)
}

/// One run's own scratch directory: `run-<pid>-<n>` inside `--dir`, created exclusively
/// (never one that exists, so never another run's) and removed, with everything in it,
/// when dropped.
///
/// Why not `--dir` itself: point directories are named by part, system, clients and
/// repeat only, so two runs on one machine (CI's smoke next to a developer's sweep or
/// smoke loop, both with the default `/tmp/chorus-bench-ooo`) used the same paths, and a
/// run removed the whole `--dir` at its end. Whichever run moved on first deleted the
/// other's node directories under its running nodes. The ordered node 1 opens its log
/// block file at its first write, right after its election (~2 s into a point), so a
/// deletion before then failed that write: the group stopped on the storage error and the
/// point ended with "node 1 did not lead within 30s" — the failure CI used to retry.
pub struct Scratch(PathBuf);

impl Scratch {
    /// Creates a fresh scratch directory inside `dir` (created if missing).
    pub fn create(dir: &Path) -> Result<Self, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        let dir = std::fs::canonicalize(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let pid = std::process::id();
        for n in 0u32.. {
            let p = dir.join(format!("run-{pid}-{n}"));
            match std::fs::create_dir(&p) {
                Ok(()) => return Ok(Self(p)),
                // Another run of this process, or a stale one with a reused pid: not ours.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(format!("create {}: {e}", p.display())),
            }
        }
        unreachable!("a free name below 2^32")
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs one point; a failure becomes a point with `error` set.
#[allow(clippy::too_many_arguments)]
fn point(
    rt: &tokio::runtime::Runtime,
    exe: &Path,
    root: &Path,
    s: &Settings,
    c: &Cell,
    sys: System,
    repeat: usize,
    zipf: Option<Arc<Zipf>>,
) -> Point {
    let mut p = Point {
        part: c.part,
        system: sys,
        repeat,
        clients: c.clients,
        theta: c.theta,
        ops_per_sec: 0.0,
        committed: 0,
        errors: 0,
        seconds: 0.0,
        lat_mean_us: 0.0,
        lat_p50_us: 0.0,
        lat_p99_us: 0.0,
        cpu: vec![],
        gap: None,
        gap_per_follower: vec![],
        staleness: None,
        applied_by_end: vec![],
        error: None,
        terms: None,
        records_per_entry: None,
        after_per_entry: None,
        held_per_entry: None,
        queue_mean_us: None,
        fsync_mean_us: None,
        peer_ack_mean_us: vec![],
    };
    let dir = root.join(format!(
        "{}-{}-{}-r{repeat}",
        c.part.name(),
        sys.name(),
        c.clients
    ));
    let r = measure(rt, exe, &dir, s, c, sys, zipf, &mut p);
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = r {
        p.error = Some(e);
    }
    p
}

/// How a client appends.
#[derive(Clone)]
enum Appender {
    Ooo(Arc<OooNode>),
    Ordered(LogHandle),
}

impl Appender {
    /// Appends and waits: Ok(true) committed, Ok(false) failed, Err refused.
    async fn append(&self, d: Option<Declared>, data: Vec<u8>) -> Result<bool, String> {
        match self {
            Appender::Ooo(n) => {
                let d = d.ok_or("an out-of-order append needs a declaration")?;
                match n.append_async(d, data).await {
                    Ok(o) => Ok(o == Outcome::Committed),
                    Err(e) => Err(e.to_string()),
                }
            }
            Appender::Ordered(h) => {
                let a = h.append(&data, 0).map_err(|e| e.to_string())?;
                let r = a.result.await.map_err(|e| e.to_string())?;
                Ok(r.outcome == Outcome::Committed)
            }
        }
    }
}

/// Makes one client's records.
struct Gen {
    part: Part,
    sys: System,
    rng: Rng,
    zipf: Option<Arc<Zipf>>,
    id_base: u64,
    seq: u64,
    bytes: usize,
}

/// Blocks of the block workload's volume (1 GiB of 4 KiB blocks).
pub const VOLUME_BLOCKS: u64 = 1 << 18;

impl Gen {
    fn next(&mut self) -> (Option<Declared>, Vec<u8>) {
        self.seq += 1;
        let id = self.id_base | self.seq;
        let mut data = vec![0xA5u8; self.bytes];
        data[..8].copy_from_slice(&id.to_le_bytes());
        let (r, w) = match self.part {
            Part::Block => (None, self.rng.below(VOLUME_BLOCKS)),
            _ => {
                let z = self.zipf.as_ref().expect("ycsb has a zipf");
                (Some(z.sample(&mut self.rng)), z.sample(&mut self.rng))
            }
        };
        data[8..16].copy_from_slice(&w.to_le_bytes());
        if let (Some(r), true) = (r, data.len() >= 24) {
            data[16..24].copy_from_slice(&r.to_le_bytes());
        }
        (declare(self.sys, r, w), data)
    }
}

/// What a record declares: `r` the key read (none for a block write), `w` the key or
/// block written.
pub fn declare(sys: System, r: Option<u64>, w: u64) -> Option<Declared> {
    let block = |k: u64| BlockRange::new(k, 1).expect("one block");
    match sys {
        System::Ordered | System::OrderedNoRepair => None,
        System::InOrder => Some(Declared::Txn {
            read_set: vec![0],
            write_set: vec![0],
        }),
        System::Dependent => Some(Declared::Txn {
            read_set: r.into_iter().collect(),
            write_set: vec![w],
        }),
        System::Parallel | System::ParallelTxn => {
            let mut ranges = vec![block(w)];
            if let Some(r) = r.filter(|&r| r != w) {
                ranges.push(block(r));
            }
            Some(Declared::Blocks(ranges))
        }
    }
}

/// A child replica process and its line protocol (`chorus-bench replica`).
struct Child {
    id: u64,
    proc: Proc,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    log: PathBuf,
}

impl Child {
    fn spawn(
        exe: &Path,
        sys: System,
        id: u64,
        dir: &Path,
        s: &Settings,
        record: bool,
    ) -> Result<Self, String> {
        use std::os::unix::process::CommandExt;
        let log = dir.join(format!("n{id}.log"));
        let f = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let mut cmd = Command::new(exe);
        cmd.arg("replica")
            .arg("--system")
            .arg(sys.name())
            .arg("--id")
            .arg(id.to_string())
            .arg("--dir")
            .arg(dir.join(format!("n{id}")))
            .arg("--apply-threads")
            .arg(s.apply_threads.to_string())
            .arg("--apply-us")
            .arg(s.apply_us.to_string())
            .arg("--election-ms")
            .arg(election_of(s, id).as_millis().to_string())
            .arg("--hole-resend")
            .arg(s.hole_resend.to_string())
            .arg("--timed-resend")
            .arg(s.timed_resend.to_string())
            .arg("--freeze-us")
            .arg(s.ooo_freeze_us.to_string())
            .arg("--preallocate")
            .arg(s.preallocate.to_string())
            .arg("--ooo-direct-io")
            .arg(u8::from(s.ooo_direct_io).to_string())
            .arg("--ooo-compact-bytes")
            .arg(s.ooo_compact_bytes.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(f);
        if record {
            cmd.arg("--record-applies");
        }
        // SAFETY: prctl(2) is async-signal-safe; the closure only calls it.
        unsafe {
            cmd.pre_exec(|| {
                // Die with the benchmark, however it ends.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut proc = cmd.spawn().map_err(|e| format!("start node {id}: {e}"))?;
        let stdin = proc.stdin.take();
        let out = proc.stdout.take().ok_or("child stdout")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(out).lines() {
                let Ok(l) = l else { return };
                if tx.send(l).is_err() {
                    return;
                }
            }
        });
        Ok(Self {
            id,
            proc,
            stdin,
            lines,
            log,
        })
    }

    fn failure(&mut self, what: &str) -> String {
        let st = match self.proc.try_wait() {
            Ok(Some(st)) => format!("exited ({st})"),
            _ => "still running".into(),
        };
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(8).collect();
        format!(
            "node {} {what}; it {st}; last lines of its stderr:\n{}",
            self.id,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        )
    }

    fn send(&mut self, line: &str) -> Result<(), String> {
        let r = match self.stdin.as_mut() {
            Some(i) => writeln!(i, "{line}").and_then(|()| i.flush()),
            None => return Err(format!("node {}: stdin closed", self.id)),
        };
        r.map_err(|e| self.failure(&format!("did not take {line:?} ({e})")))
    }

    /// Waits for a line `word rest…`; returns `rest`.
    fn expect(&mut self, word: &str, timeout: Duration) -> Result<String, String> {
        match self.lines.recv_timeout(timeout) {
            Ok(l) => match l.strip_prefix(word) {
                Some(rest) => Ok(rest.trim().to_string()),
                None => Err(self.failure(&format!("said {l:?}, expected {word:?}"))),
            },
            Err(_) => Err(self.failure(&format!("did not say {word:?} within {timeout:?}"))),
        }
    }

    /// Closes its stdin (it stops cleanly) and reaps it, killing it after `timeout`.
    fn finish(&mut self, timeout: Duration) {
        self.stdin.take();
        let until = Instant::now() + timeout;
        while Instant::now() < until {
            if let Ok(Some(_)) = self.proc.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.proc.kill();
        let _ = self.proc.wait();
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.stdin.take();
        if let Ok(None) = self.proc.try_wait() {
            let _ = self.proc.kill();
        }
        let _ = self.proc.wait();
    }
}

/// Parses `1=127.0.0.1:5000,2=…`.
pub fn parse_peers(s: &str) -> Result<Vec<(u64, SocketAddr)>, String> {
    s.split(',')
        .map(|kv| {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| format!("peer {kv:?}: expected ID=HOST:PORT"))?;
            let id: u64 = k
                .trim()
                .parse()
                .ok()
                .filter(|&i| i > 0)
                .ok_or_else(|| format!("peer id {k:?}: expected 1 or more"))?;
            let a: SocketAddr = v
                .trim()
                .parse()
                .map_err(|e| format!("peer address {v:?}: {e}"))?;
            Ok((id, a))
        })
        .collect()
}

fn format_peers(p: &[(u64, SocketAddr)]) -> String {
    p.iter()
        .map(|(i, a)| format!("{i}={a}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// A 3-node cluster: node 1 here, 2 and 3 as children. Dropping it stops everything.
struct Cluster {
    leader: Option<Running>,
    children: Vec<Child>,
    proxies: Vec<JitterProxy>,
    rec: Arc<Recorder>,
}

const STEP: Duration = Duration::from_secs(30);

impl Cluster {
    fn start(
        exe: &Path,
        dir: &Path,
        s: &Settings,
        sys: System,
        jitter_ms: f64,
        record: bool,
    ) -> Result<Self, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        let o1 = NodeOpts {
            system: sys,
            id: 1,
            dir: dir.join("n1"),
            apply_threads: s.apply_threads,
            apply_us: s.apply_us,
            election: election_of(s, 1),
            hole_resend: s.hole_resend,
            timed_resend: s.timed_resend,
            freeze: Duration::from_micros(s.ooo_freeze_us),
            preallocate: s.preallocate,
            direct_io: s.ooo_direct_io,
            compact_bytes: s.ooo_compact_bytes,
        };
        let (b1, a1) = node::bind(&o1)?;
        let mut children = Vec::new();
        for id in 2..=3 {
            children.push(Child::spawn(exe, sys, id, dir, s, record)?);
        }
        let mut addrs = vec![(1, a1)];
        for c in children.iter_mut() {
            let a = c.expect("addr", STEP)?;
            let a: SocketAddr = a
                .parse()
                .map_err(|e| format!("node {}: address {a:?}: {e}", c.id))?;
            addrs.push((c.id, a));
        }
        // The proxies: in front of node 3, and node 2 too with two jittered links.
        let shape = if s.reorder && s.connections >= 2 {
            Shape::SlowConnection { of: s.connections }
        } else if s.reorder {
            Shape::Reorder
        } else {
            Shape::KeepOrder
        };
        let mut proxies = Vec::new();
        let mut lead_peers = addrs.clone();
        if jitter_ms > 0.0 {
            for i in (3 - s.jitter_links..3).rev() {
                let p = JitterProxy::start_shaped(
                    addrs[i].1,
                    Duration::from_secs_f64(jitter_ms / 1e3),
                    mono_ns() ^ i as u64,
                    shape,
                )
                .map_err(|e| format!("jitter proxy: {e}"))?;
                // The leader dials a jittered node through its proxy; everyone else
                // directly.
                lead_peers[i].1 = p.addr();
                proxies.push(p);
            }
        }
        let rec = Arc::new(Recorder::new(record, Duration::from_micros(s.apply_us)));
        // The leader first, with the proxies' addresses set before any peer can
        // announce its own address to it.
        let leader = node::start(b1, &o1, &lead_peers, rec.clone())?;
        let mut me = Cluster {
            leader: Some(leader),
            children,
            proxies,
            rec,
        };
        let line = format!("peers {}", format_peers(&addrs));
        for c in me.children.iter_mut() {
            c.send(&line)?;
        }
        for c in me.children.iter_mut() {
            c.expect("started", STEP)?;
        }
        Ok(me)
    }

    fn check_children(&mut self) -> Result<(), String> {
        for c in self.children.iter_mut() {
            if let Ok(Some(_)) = c.proc.try_wait() {
                return Err(c.failure("exited during the run"));
            }
        }
        Ok(())
    }

    /// Waits until node 1 serves and has committed a probe; returns how to append.
    fn wait_leader(
        &mut self,
        rt: &tokio::runtime::Runtime,
        sys: System,
    ) -> Result<Appender, String> {
        let deadline = Instant::now() + STEP;
        loop {
            self.check_children()?;
            if Instant::now() > deadline {
                return Err(format!("node 1 did not lead within {STEP:?}"));
            }
            let a = match self.leader.as_ref().ok_or("no leader node")? {
                Running::Ooo(_, n) => n
                    .status()
                    .is_some_and(|s| s.serving)
                    .then(|| Appender::Ooo(n.clone())),
                Running::Ordered { log, .. } => {
                    (log.role().role == Role::Leader).then(|| Appender::Ordered(log.clone()))
                }
            };
            if let Some(a) = a {
                let probe = declare(sys, Some(0), 0);
                // Id 0: the probe (never matched by the gap statistics' window).
                if rt.block_on(a.append(probe, vec![0u8; 16])) == Ok(true) {
                    return Ok(a);
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The pids of nodes 1, 2, 3.
    fn pids(&self) -> Vec<u32> {
        let mut v = vec![std::process::id()];
        v.extend(self.children.iter().map(|c| c.proc.id()));
        v
    }

    /// Stops the cluster; with recording on, returns the applies of the leader and of
    /// each follower.
    fn finish(mut self, dir: &Path) -> Result<(Applies, Vec<Applies>), String> {
        let mut followers = Vec::new();
        if self.rec_on() {
            for c in self.children.iter_mut() {
                let f = dir.join(format!("applies-{}.bin", c.id));
                c.send(&format!("dump {}", f.display()))?;
                c.expect("dumped", STEP)?;
                let b = std::fs::read(&f).map_err(|e| format!("{}: {e}", f.display()))?;
                followers.push(gap::decode(&b)?);
            }
        }
        let leader = self.rec.take();
        if let Some(l) = self.leader.take() {
            l.shutdown();
        }
        for c in self.children.iter_mut() {
            c.finish(Duration::from_secs(10));
        }
        self.proxies.clear();
        Ok((leader, followers))
    }

    fn rec_on(&self) -> bool {
        // The recorder is on exactly when the children were asked to record.
        self.rec.is_on()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(l) = self.leader.take() {
            l.shutdown();
        }
        // Children: killed and reaped by their own Drop.
        self.children.clear();
        self.proxies.clear();
    }
}

/// `(record id, CLOCK_MONOTONIC ns)` of every apply on one node.
type Applies = Vec<(u64, u64)>;

/// CPU ticks of a process (user + system).
fn cpu_ticks(pid: u32) -> Result<u64, String> {
    let path = PathBuf::from(format!("/proc/{pid}/stat"));
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    crate::procstat::parse_stat_cpu_ticks(&text, &path).map_err(|e| e.to_string())
}

fn ticks_per_sec() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// The nearest-rank quantile of sorted values.
fn nearest_rank(sorted: &[u32], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1] as f64
}

#[allow(clippy::too_many_arguments)]
fn measure(
    rt: &tokio::runtime::Runtime,
    exe: &Path,
    dir: &Path,
    s: &Settings,
    c: &Cell,
    sys: System,
    zipf: Option<Arc<Zipf>>,
    p: &mut Point,
) -> Result<(), String> {
    let _ = std::fs::remove_dir_all(dir);
    let ycsb = c.part != Part::Block;
    let jitter = if ycsb { s.ycsb_jitter_ms } else { s.jitter_ms };
    let mut cluster = Cluster::start(exe, dir, s, sys, jitter, ycsb)?;
    let appender = cluster.wait_leader(rt, sys)?;
    let pids = cluster.pids();

    let stop = Arc::new(AtomicBool::new(false));
    let measuring = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let bytes = if ycsb { s.value_bytes } else { s.block_bytes };
    let tasks: Vec<_> = (0..c.clients)
        .map(|i| {
            let (stop, measuring, count, errors, a) = (
                stop.clone(),
                measuring.clone(),
                count.clone(),
                errors.clone(),
                appender.clone(),
            );
            let mut g = Gen {
                part: c.part,
                sys,
                rng: Rng::new(mono_ns() ^ ((i as u64 + 1) << 32)),
                zipf: zipf.clone(),
                id_base: (i as u64 + 1) << 40,
                seq: 0,
                bytes,
            };
            rt.spawn(async move {
                let mut lat: Vec<u32> = Vec::new();
                // (record id, when its client was told Committed), for staleness.
                let mut told: Vec<(u64, u64)> = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let (d, data) = g.next();
                    let id = u64::from_le_bytes(data[..8].try_into().expect("an id"));
                    let t0 = Instant::now();
                    let inside = measuring.load(Ordering::Relaxed);
                    match a.append(d, data).await {
                        Ok(true) => {
                            // Only appends that started and ended inside the interval.
                            if inside && measuring.load(Ordering::Relaxed) {
                                lat.push(t0.elapsed().as_micros().min(u32::MAX as u128) as u32);
                                count.fetch_add(1, Ordering::Relaxed);
                                if ycsb {
                                    told.push((id, mono_ns()));
                                }
                            }
                        }
                        _ => {
                            errors.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                }
                (lat, told)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(s.warmup));
    let cpu0: Vec<u64> = pids
        .iter()
        .map(|&p| cpu_ticks(p))
        .collect::<Result<_, _>>()?;
    let ooo_status = || match &cluster.leader {
        Some(Running::Ooo(_, n)) => n.status(),
        _ => None,
    };
    // Node 1's latency histograms as (count, sum ns): queue, fsync, then each peer's
    // acknowledgements by node id.
    let ooo_lat = || match &cluster.leader {
        Some(Running::Ooo(_, n)) => {
            let l = n.latency();
            let mut peers: Vec<_> = l.peer_ack.iter().collect();
            peers.sort_by_key(|(p, _)| *p);
            let at = |h: &chorus_runtime::metrics::Histogram| (h.count(), h.sum_ns());
            Some(
                [at(&l.queue), at(&l.fsync)]
                    .into_iter()
                    .chain(peers.into_iter().map(|(_, h)| at(h)))
                    .collect::<Vec<_>>(),
            )
        }
        _ => None,
    };
    let st0 = ooo_status();
    let lat0 = ooo_lat();
    let (t0, m0) = (Instant::now(), mono_ns());
    measuring.store(true, Ordering::Relaxed);
    std::thread::sleep(Duration::from_secs_f64(s.seconds));
    measuring.store(false, Ordering::Relaxed);
    let (el, m1) = (t0.elapsed().as_secs_f64(), mono_ns());
    if let (Some(a), Some(b)) = (st0, ooo_status()) {
        p.terms = Some((a.term, b.term));
        let groups = b.counters.groups.saturating_sub(a.counters.groups);
        let appends = b.counters.appends.saturating_sub(a.counters.appends);
        p.records_per_entry = Some(appends as f64 / groups.max(1) as f64);
        let per_entry = |f: fn(&chorus_core::ooo::replica::OooStats) -> u64| {
            Some(f(&b.stats).saturating_sub(f(&a.stats)) as f64 / groups.max(1) as f64)
        };
        p.after_per_entry = per_entry(|s| s.admitted_after);
        p.held_per_entry = per_entry(|s| s.held_at_quorum);
    }
    if let (Some(a), Some(b)) = (lat0, ooo_lat()) {
        let means: Vec<f64> = a
            .iter()
            .zip(&b)
            .map(|(a, b)| (b.1 - a.1) as f64 / 1e3 / (b.0 - a.0).max(1) as f64)
            .collect();
        p.queue_mean_us = means.first().copied();
        p.fsync_mean_us = means.get(1).copied();
        p.peer_ack_mean_us = means.iter().skip(2).copied().collect();
    }
    let cpu1: Vec<u64> = pids
        .iter()
        .map(|&p| cpu_ticks(p))
        .collect::<Result<_, _>>()?;
    stop.store(true, Ordering::Relaxed);
    let mut lat = Vec::new();
    let mut told = HashMap::new();
    // A client stuck on an append the leader never answers would hang here; one deadline
    // for all of them.
    let deadline = tokio::time::Instant::now() + STEP;
    for t in tasks {
        match rt.block_on(async { tokio::time::timeout_at(deadline, t).await }) {
            Ok(Ok((l, t))) => {
                lat.extend(l);
                told.extend(t);
            }
            Ok(Err(e)) => return Err(format!("client task: {e}")),
            Err(_) => return Err(format!("a client's append got no answer within {STEP:?}")),
        }
    }
    cluster.check_children()?;
    let tps = ticks_per_sec();
    p.cpu = cpu0
        .iter()
        .zip(&cpu1)
        .map(|(a, b)| (b - a) as f64 / tps / el)
        .collect();
    lat.sort_unstable();
    p.committed = count.load(Ordering::Relaxed);
    p.errors = errors.load(Ordering::Relaxed);
    p.seconds = el;
    p.ops_per_sec = p.committed as f64 / el;
    p.lat_mean_us = lat.iter().map(|&l| l as f64).sum::<f64>() / lat.len().max(1) as f64;
    p.lat_p50_us = nearest_rank(&lat, 0.5);
    p.lat_p99_us = nearest_rank(&lat, 0.99);
    let (leader, followers) = cluster.finish(dir)?;
    if ycsb {
        let lmap: HashMap<u64, u64> = leader.into_iter().collect();
        let mut all = Vec::new();
        for f in &followers {
            let mut g = gap::gaps(&lmap, f, m0, m1);
            all.extend_from_slice(&g);
            p.gap_per_follower.push(gap::stats(&mut g));
        }
        p.gap = gap::stats(&mut all);
        let mut stale = Vec::new();
        for f in &followers {
            let s = gap::gaps(&told, f, m0, m1);
            p.applied_by_end
                .push(s.len() as f64 / told.len().max(1) as f64);
            stale.extend(s);
        }
        p.staleness = gap::stats(&mut stale);
        if p.gap.is_none() {
            return Err(
                "no record applied on both the leader and a follower in the interval".into(),
            );
        }
    }
    if p.committed == 0 {
        return Err("nothing committed in the measured interval".into());
    }
    Ok(())
}

/// The hidden `chorus-bench replica` subcommand: runs node `id` of `system` in this
/// process, speaking a line protocol with the benchmark on stdin/stdout:
/// prints `addr HOST:PORT` once bound, reads `peers 1=A,2=B,3=C`, starts and prints
/// `started`; then `dump PATH` writes the applies noted so far to PATH (pairs of
/// little-endian u64: record id, `CLOCK_MONOTONIC` ns) and prints `dumped`; end of input
/// or `exit` stops the node.
pub fn replica_main(o: NodeOpts, record: bool) -> Result<(), String> {
    let (b, a) = node::bind(&o)?;
    let say = |l: &str| {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{l}");
        let _ = out.flush();
    };
    say(&format!("addr {a}"));
    let stdin = std::io::stdin();
    let mut line = String::new();
    if stdin
        .read_line(&mut line)
        .map_err(|e| format!("stdin: {e}"))?
        == 0
    {
        return Ok(());
    }
    let peers = match line.trim().strip_prefix("peers ") {
        Some(p) => parse_peers(p)?,
        None => return Err(format!("expected `peers …`, got {line:?}")),
    };
    let rec = Arc::new(Recorder::new(record, Duration::from_micros(o.apply_us)));
    let running = node::start(b, &o, &peers, rec.clone())?;
    say("started");
    loop {
        line.clear();
        match stdin.read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let l = line.trim();
        if let Some(path) = l.strip_prefix("dump ") {
            let v = rec.take();
            std::fs::write(path, gap::encode(&v)).map_err(|e| format!("write {path}: {e}"))?;
            say("dumped");
        } else if l == "exit" {
            break;
        } else {
            eprintln!("replica {}: unknown command {l:?}", o.id);
        }
    }
    running.shutdown();
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Medians over repeats of every (part, clients, θ, system), and the ratios the issue
/// asks about, as JSON.
pub fn summarize(points: &[Point]) -> serde_json::Value {
    use serde_json::json;
    type Key = (Part, usize, Option<u64>, System);
    let mut groups: Vec<(Key, Vec<&Point>)> = Vec::new();
    for p in points.iter().filter(|p| p.error.is_none()) {
        let k = (p.part, p.clients, p.theta.map(f64::to_bits), p.system);
        match groups.iter_mut().find(|g| g.0 == k) {
            Some(g) => g.1.push(p),
            None => groups.push((k, vec![p])),
        }
    }
    let med = |ps: &[&Point], f: &dyn Fn(&Point) -> Option<f64>| {
        median(ps.iter().filter_map(|p| f(p)).collect())
    };
    let finite = |x: f64| x.is_finite().then_some(x);
    let mut medians = Vec::new();
    let mut lookup: HashMap<Key, f64> = HashMap::new();
    let mut gap_lookup: HashMap<Key, f64> = HashMap::new();
    for (k, ps) in &groups {
        let ops = med(ps, &|p| Some(p.ops_per_sec));
        lookup.insert(*k, ops);
        let gm = med(ps, &|p| p.gap.as_ref().map(|g| g.median_us));
        if gm.is_finite() {
            gap_lookup.insert(*k, gm);
        }
        let cpu: Vec<f64> = (0..3)
            .map(|i| med(ps, &|p| p.cpu.get(i).copied()))
            .collect();
        let gp99 = med(ps, &|p| p.gap.as_ref().map(|g| g.p99_us));
        let sm = med(ps, &|p| p.staleness.as_ref().map(|g| g.median_us));
        let sp99 = med(ps, &|p| p.staleness.as_ref().map(|g| g.p99_us));
        // The slower follower's fraction.
        let applied = med(ps, &|p| p.applied_by_end.iter().copied().reduce(f64::min));
        medians.push(json!({
            "part": k.0, "clients": k.1, "theta": k.2.map(f64::from_bits), "system": k.3,
            "repeats": ps.len(),
            "ops_per_sec": ops,
            "lat_mean_us": med(ps, &|p| Some(p.lat_mean_us)),
            "lat_p50_us": med(ps, &|p| Some(p.lat_p50_us)),
            "lat_p99_us": med(ps, &|p| Some(p.lat_p99_us)),
            "cpu": cpu,
            "gap_median_us": finite(gm),
            "gap_p99_us": finite(gp99),
            "staleness_median_us": finite(sm),
            "staleness_p99_us": finite(sp99),
            "applied_by_end_min": finite(applied),
            "records_per_entry": finite(med(ps, &|p| p.records_per_entry)),
            "after_per_entry": finite(med(ps, &|p| p.after_per_entry)),
            "held_per_entry": finite(med(ps, &|p| p.held_per_entry)),
            "queue_mean_us": finite(med(ps, &|p| p.queue_mean_us)),
            "fsync_mean_us": finite(med(ps, &|p| p.fsync_mean_us)),
            "peer_ack_mean_us": (0..2)
                .map(|i| finite(med(ps, &|p| p.peer_ack_mean_us.get(i).copied())))
                .collect::<Vec<_>>(),
        }));
    }
    let mut ratios = Vec::new();
    let pairs: &[(Part, System, System)] = &[
        (Part::Block, System::Parallel, System::Ordered),
        (Part::Block, System::Parallel, System::InOrder),
        (Part::Block, System::InOrder, System::Ordered),
        (Part::Block, System::Parallel, System::OrderedNoRepair),
        (Part::Block, System::Ordered, System::OrderedNoRepair),
        (Part::YcsbClients, System::Dependent, System::Ordered),
        (Part::YcsbClients, System::Dependent, System::Parallel),
        (Part::YcsbClients, System::Parallel, System::Ordered),
        (Part::YcsbClients, System::Dependent, System::ParallelTxn),
        (Part::YcsbClients, System::ParallelTxn, System::Ordered),
        (Part::YcsbTheta, System::Dependent, System::Ordered),
        (Part::YcsbTheta, System::Dependent, System::Parallel),
        (Part::YcsbTheta, System::Parallel, System::Ordered),
        (Part::YcsbTheta, System::Dependent, System::ParallelTxn),
        (Part::YcsbTheta, System::ParallelTxn, System::Ordered),
        (
            Part::YcsbClients,
            System::Dependent,
            System::OrderedNoRepair,
        ),
        (Part::YcsbClients, System::Ordered, System::OrderedNoRepair),
        (Part::YcsbTheta, System::Dependent, System::OrderedNoRepair),
        (Part::YcsbTheta, System::Ordered, System::OrderedNoRepair),
    ];
    for (k, _) in &groups {
        for &(part, a, b) in pairs {
            if k.0 != part || k.3 != a {
                continue;
            }
            let kb = (k.0, k.1, k.2, b);
            let (Some(x), Some(y)) = (lookup.get(k), lookup.get(&kb)) else {
                continue;
            };
            let gap_ratio = match (gap_lookup.get(&kb), gap_lookup.get(k)) {
                // How many times lower `a`'s median gap is than `b`'s. Only for two
                // positive medians: a follower can apply before the leader (an entry
                // commits once both followers hold it durably, and the leader applies
                // only once its own copy is), and a ratio of a median at or below zero
                // means nothing.
                (Some(gb), Some(ga)) if *ga > 0.0 && *gb > 0.0 => Some(gb / ga),
                _ => None,
            };
            ratios.push(json!({
                "part": part, "clients": k.1, "theta": k.2.map(f64::from_bits),
                "system": a, "vs": b, "throughput_ratio": x / y,
                "gap_lower_by": gap_ratio,
            }));
        }
    }
    json!({"medians": medians, "ratios": ratios})
}

#[cfg(test)]
mod tests;
