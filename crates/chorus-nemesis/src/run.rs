//! One run: a cluster in namespaces, the workload, the nemesis for the run's duration,
//! every fault healed, a barrier append, every node's log read, the history checked, and
//! the history, the verdict and the nodes' logs kept in the run's directory.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chorus_client::Client;
use serde::Serialize;

use crate::cluster::{Cluster, NodeOptions};
use crate::history::History;
use crate::nemesis::{self, Kind};
use crate::net::Net;
use crate::ordered::{self, Final, Verdict};
use crate::{Error, Rng};

/// Which workload a run drives, and so which mode its group is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// Appends to an ordered (PALF) group, with tail reads ([`ordered`]).
    Ordered,
    /// Block writes to a parallel (ParallelRaft) group, with reads at the leader
    /// ([`crate::blocks`]).
    Parallel,
    /// Transactions on a dependent (DP-Raft) group, with key reads at any replica
    /// ([`crate::txn`]).
    Dependent,
    /// Block writes to a volume of several chunk groups through the routing client, with
    /// the control plane on every node ([`crate::volume`]).
    Volume,
    /// Block writes into files and files created and unlinked through the file system's
    /// library on such a volume, read by other hosts ([`crate::fs`]).
    Fs,
}

impl Workload {
    /// Parses `ordered`, `parallel`, `dependent`, `volume` or `fs`.
    pub fn parse(s: &str) -> Result<Workload, String> {
        match s {
            "ordered" => Ok(Workload::Ordered),
            "parallel" => Ok(Workload::Parallel),
            "dependent" => Ok(Workload::Dependent),
            "volume" => Ok(Workload::Volume),
            "fs" => Ok(Workload::Fs),
            _ => Err(format!(
                "{s:?} is not a workload (ordered, parallel, dependent, volume or fs)"
            )),
        }
    }

    /// The workload's part of every node's configuration (`apis`: each node's client
    /// API address, `HOST:PORT`).
    fn node_toml(self, apis: &[String]) -> String {
        let nodes = apis.len();
        match self {
            Workload::Ordered => ordered::groups_toml(nodes),
            Workload::Parallel => crate::blocks::groups_toml(nodes),
            Workload::Dependent => crate::txn::groups_toml(nodes),
            Workload::Volume | Workload::Fs => crate::volume::node_toml(apis),
        }
    }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// The workload (and the group's mode).
    pub workload: Workload,
    /// The `chorus` binary.
    pub chorus: PathBuf,
    /// Where the nodes' data, their logs, the history and the verdict go.
    pub dir: PathBuf,
    /// Nodes in the cluster.
    pub nodes: usize,
    /// The seed of the fault schedule and the workload's choices.
    pub seed: u64,
    /// How long the nemesis runs.
    pub duration: Duration,
    /// The faults it may choose.
    pub kinds: Vec<Kind>,
    /// Writer tasks.
    pub writers: usize,
    /// Reader tasks.
    pub readers: usize,
    /// How the nodes are set up (replica timings, disks, clocks).
    pub node: NodeOptions,
}

/// How a run went.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The seed.
    pub seed: u64,
    /// The history file.
    pub history: PathBuf,
    /// The checker's verdict.
    pub verdict: Verdict,
    /// Every fault injected, in order.
    pub faults: Vec<String>,
    /// Whether the kernel could delay and reorder packets (`sch_netem`).
    pub netem: bool,
    /// Seconds the whole run took.
    pub secs: f64,
}

/// Group 1's status at `ep`, or `None` if the node did not answer within `wait`.
async fn group_status(ep: &str, wait: Duration) -> Option<chorus_client::pb::StatusResponse> {
    let mut c = Client::new(vec![ep.to_string()]);
    c.call_timeout = wait;
    let v = tokio::time::timeout(wait, c.status_all(ordered::GROUP))
        .await
        .ok()?;
    match v.into_iter().next() {
        Some((_, Ok(s))) => Some(s),
        _ => None,
    }
}

/// Node `i` (1-based) that says it leads group 1, asking each node for at most `wait`
/// (a partitioned old leader may still say so until its lease ends).
pub async fn leader(eps: &[String], wait: Duration) -> Option<usize> {
    for (i, ep) in eps.iter().enumerate() {
        if let Some(s) = group_status(ep, wait).await {
            if s.groups.iter().any(|g| g.role == "leader") {
                return Some(i + 1);
            }
        }
    }
    None
}

/// Nodes that may be repairing damage from their peers (out-of-order entries lost on disk,
/// or an ordered log's damaged range): each that says so for group 1 (`recovering_lost`),
/// and each that did not answer within `wait` (a node just restarted may not answer yet,
/// and may be repairing).
pub async fn maybe_recovering(eps: &[String], wait: Duration) -> Vec<usize> {
    let mut out = Vec::new();
    for (i, ep) in eps.iter().enumerate() {
        let sound = group_status(ep, wait)
            .await
            .is_some_and(|s| !s.groups.iter().any(|g| g.recovering_lost));
        if !sound {
            out.push(i + 1);
        }
    }
    out
}

/// Set by [`interrupt`]; read by the nemesis loop.
static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Asks a [`run`] in progress to stop early (a signal, an operator's Ctrl-C): it heals
/// every fault at once, stops its workload and returns [`Error::Interrupted`], removing
/// its processes, mounts and namespaces on the way out as on any return. Without this a
/// signal would kill the harness mid-fault, leaving its `chorus server` processes and
/// namespaces behind.
pub fn interrupt() {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Sleeps `d`, or less once [`interrupt`] was called.
async fn nap(d: Duration) {
    let end = Instant::now() + d;
    while !interrupted() {
        let now = Instant::now();
        if now >= end {
            return;
        }
        tokio::time::sleep((end - now).min(Duration::from_millis(100))).await;
    }
}

/// Runs the ordered workload under the nemesis and checks it.
pub fn run(o: &RunOptions) -> Result<Report, Error> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Error::io("tokio runtime", e))?;
    rt.block_on(run_async(o))
}

async fn run_async(o: &RunOptions) -> Result<Report, Error> {
    let t0 = Instant::now();
    std::fs::create_dir_all(&o.dir).map_err(|e| Error::io(o.dir.display(), e))?;
    let net = Net::create(o.nodes)?;
    let netem = net.has_netem();
    let mut node = o.node.clone();
    if o.kinds.contains(&Kind::Disk) && node.disk_mib == 0 {
        node.disk_mib = 1024;
    }
    node.faketime |= o.kinds.contains(&Kind::Clock);
    node.power_loss |= o.kinds.contains(&Kind::Power) || o.kinds.contains(&Kind::PowerAll);
    if o.workload == Workload::Dependent {
        node.ooo_compact_bytes = Some(0);
    }
    if o.kinds.contains(&Kind::Disk) && node.min_free_bytes.is_none() && o.seed % 2 == 1 {
        // Odd seeds turn the free-space guard off: a full disk then fails writes with
        // ENOSPC, stopping groups that restart themselves once there is room.
        node.min_free_bytes = Some(0);
    }
    let apis: Vec<String> = (1..=o.nodes)
        .map(|i| format!("{}:{}", net.ip(i), crate::cluster::API_PORT))
        .collect();
    let mut c = Cluster::start(net, &o.chorus, &o.dir, &o.workload.node_toml(&apis), &node)?;
    let eps = c.apis();
    let hist = History::default();
    let mut rng = Rng::new(o.seed);
    let mut led = false;
    for _ in 0..300 {
        if leader(&eps, Duration::from_millis(500)).await.is_some() {
            led = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if !led {
        return Err(Error::Cluster(format!(
            "no leader within 30 s; node 1 logged:\n{}",
            c.log_tail(1, 20)
        )));
    }
    let created = match o.workload {
        Workload::Volume => crate::volume::create(&eps, Duration::from_secs(60)).await,
        Workload::Fs => crate::fs::create(&eps, Duration::from_secs(60)).await,
        _ => Ok(()),
    };
    created.map_err(|e| Error::Cluster(format!("{e}; node 1 logged:\n{}", c.log_tail(1, 20))))?;
    let fs_writer = match o.workload {
        Workload::Fs => Some(
            crate::fs::Writer::open(&eps)
                .await
                .ok_or_else(|| Error::Cluster("the file system's volume did not open".into()))?,
        ),
        _ => None,
    };
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for p in 1..=o.writers as u64 {
        let (id, eps, hist, stop) = (
            o.seed.wrapping_mul(1000) + p,
            eps.clone(),
            hist.clone(),
            stop.clone(),
        );
        tasks.push(match o.workload {
            Workload::Ordered => tokio::spawn(ordered::writer(id, eps, hist, stop)),
            Workload::Parallel => tokio::spawn(crate::blocks::writer(id, eps, hist, stop)),
            Workload::Dependent => tokio::spawn(crate::txn::writer(id, eps, hist, stop)),
            Workload::Volume => tokio::spawn(crate::volume::writer(id, eps, hist, stop)),
            Workload::Fs => {
                let w = fs_writer.clone().expect("opened above");
                tokio::spawn(crate::fs::writer(id, w, hist, stop))
            }
        });
    }
    if let Some(w) = &fs_writer {
        tasks.push(tokio::spawn(crate::fs::meta_writer(
            w.clone(),
            hist.clone(),
            stop.clone(),
        )));
    }
    for p in 1..=o.readers as u64 {
        let (id, eps, hist, stop) = (
            o.seed.wrapping_mul(1000) + 500 + p,
            eps.clone(),
            hist.clone(),
            stop.clone(),
        );
        tasks.push(match o.workload {
            Workload::Ordered => tokio::spawn(ordered::reader(id, eps, hist, stop)),
            Workload::Parallel => tokio::spawn(crate::blocks::reader(id, eps, hist, stop)),
            Workload::Dependent => tokio::spawn(crate::txn::reader(id, eps, hist, stop)),
            Workload::Volume => tokio::spawn(crate::volume::reader(id, eps, hist, stop)),
            // Reading hosts 2 to 15 (16 is the final read's).
            Workload::Fs => tokio::spawn(crate::fs::reader(
                id,
                1 + (p as u32 - 1) % 14 + 1,
                eps,
                hist,
                stop,
            )),
        });
    }
    let mut faults = Vec::new();
    let mut exits = Vec::new();
    let end = Instant::now() + o.duration;
    let lease = Duration::from_millis(o.node.lease_ms);
    while Instant::now() < end && !interrupted() {
        nap(Duration::from_millis(rng.range(500, 1500))).await;
        if interrupted() {
            break;
        }
        let l = leader(&eps, Duration::from_millis(300)).await;
        let Some(f) = nemesis::choose(&mut rng, &o.kinds, o.nodes, l) else {
            continue;
        };
        // The fault model: at most one replica at a time holds damage it has not yet
        // repaired from its peers, as this nemesis cannot aim flips at disjoint ranges.
        // Until repaired a replica cannot vote (an out-of-order replica's vote could carry
        // a merge past a committed slot it lost; an ordered replica's log cannot be
        // vouched for), so damage to a second replica in an overlapping range could leave
        // a group of three without a majority of sound voters: the ordered replicas then
        // halt and the out-of-order ones wait, safely, for good (docs/reliability.md,
        // known gaps). Such a flip is skipped.
        if let nemesis::Fault::Flip(n, _) = &f {
            let busy = maybe_recovering(&eps, Duration::from_millis(500)).await;
            if busy.iter().any(|m| m != n) {
                continue;
            }
        }
        let what = nemesis::inject(&mut c, &f, &mut rng)?;
        hist.nemesis(what.clone(), false);
        faults.push(what);
        let hold = match f {
            nemesis::Fault::Pause(_) => lease * 3 / 2 + Duration::from_millis(rng.range(0, 2000)),
            _ => Duration::from_millis(rng.range(1000, 4000)),
        };
        nap(hold).await;
        nemesis::heal(&mut c, &f)?;
        if let nemesis::Fault::Lag { leader, .. } = f {
            // The election among the others runs without the old leader.
            nap(lease * 2).await;
            c.start_node(leader)?;
        }
        hist.nemesis(f.to_string(), true);
        for i in 1..=o.nodes {
            if let Some(st) = c.exited(i) {
                exits.push(format!(
                    "node {i} exited on its own ({st}); its log ends:\n{}",
                    c.log_tail(i, 15)
                ));
                c.kill(i);
                c.start_node(i)?;
            }
        }
    }
    nemesis::heal_all(&mut c)?;
    hist.nemesis("everything", true);
    if interrupted() {
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            let _ = t.await;
        }
        return Err(Error::Interrupted(t0.elapsed().as_secs_f64()));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    let mut extra = exits;
    let history = o.dir.join("history.jsonl");
    let mut verdict = match o.workload {
        Workload::Ordered => {
            let (finals, mut found) = settle_ordered(&eps, &hist).await;
            extra.append(&mut found);
            for f in &finals {
                write_log(&o.dir.join(format!("n{}.records", f.node)), f)?;
            }
            if finals.is_empty() {
                Verdict::default()
            } else {
                ordered::check(&hist.entries(), &finals)
            }
        }
        Workload::Parallel => {
            let mut found = crate::blocks::settle(&eps, &hist, Duration::from_secs(60)).await;
            extra.append(&mut found);
            crate::blocks::check(&hist.entries(), &o.dir)
        }
        Workload::Volume => {
            let mut found = crate::volume::settle(&eps, &hist, Duration::from_secs(60)).await;
            extra.append(&mut found);
            crate::blocks::check(&hist.entries(), &o.dir)
        }
        Workload::Fs => {
            let w = fs_writer.as_ref().expect("opened above");
            let mut found = crate::fs::settle(&eps, w, &hist, Duration::from_secs(60)).await;
            extra.append(&mut found);
            crate::blocks::check(&hist.entries(), &o.dir)
        }
        Workload::Dependent => {
            let (finals, mut found) =
                crate::txn::settle(&eps, &hist, Duration::from_secs(60)).await;
            extra.append(&mut found);
            crate::txn::check(&hist.entries(), &finals)
        }
    };
    verdict.stats.inbox_overflows = c.metric_sum("chorus_inbox_overflows_total").await;
    crate::history::write_entries(&hist.entries(), &history)?;
    // The run's own findings first: they explain the checker's (a node that could not be
    // read "loses" every record).
    extra.append(&mut verdict.anomalies);
    verdict.anomalies = extra;
    let report = Report {
        seed: o.seed,
        history,
        verdict,
        faults,
        netem,
        secs: t0.elapsed().as_secs_f64(),
    };
    // The first thousand anomalies in the file (a lost stretch repeats one cause).
    let mut kept = report.clone();
    let total = kept.verdict.anomalies.len();
    kept.verdict.anomalies.truncate(1000);
    if total > 1000 {
        kept.verdict.anomalies.push(format!(
            "… and {} more (the run's output counts them all)",
            total - 1000
        ));
    }
    let v = serde_json::to_string_pretty(&kept).map_err(|e| Error::io("verdict", e.into()))?;
    std::fs::write(o.dir.join("verdict.json"), v).map_err(|e| Error::io("verdict.json", e))?;
    Ok(report)
}

/// After every fault healed, for the ordered workload: a barrier append that must
/// commit, then every node's whole log once it holds the barrier. Returns the logs and
/// the run's own findings.
async fn settle_ordered(eps: &[String], hist: &History) -> (Vec<Final>, Vec<String>) {
    let mut extra = Vec::new();
    let eps = eps.to_vec();
    let hist = hist.clone();
    let barrier = ordered::barrier(eps.clone(), "barrier", &hist, Duration::from_secs(60)).await;
    let mut finals = Vec::new();
    match barrier {
        Err(e) => {
            extra.push(format!(
                "no append committed within 60 s after every fault healed (last: {e})"
            ));
            // Judge what the nodes hold anyway (lost or doubled records show there too).
            for (i, ep) in eps.iter().enumerate() {
                match ordered::read_log(ep).await {
                    Ok(records) => finals.push(Final {
                        node: i + 1,
                        records,
                    }),
                    Err(e) => extra.push(format!("node {} could not be read: {e}", i + 1)),
                }
            }
        }
        Ok(_) => {
            let last = hist
                .entries()
                .iter()
                .rev()
                .find_map(|e| match &e.op {
                    crate::history::Op::Append { values, .. } if e.process == u64::MAX => {
                        values.first().cloned()
                    }
                    _ => None,
                })
                .unwrap_or_default();
            for (i, ep) in eps.iter().enumerate() {
                // Long runs leave logs of millions of records: reading one whole takes a
                // while, so the node has two minutes to hold the barrier.
                let until = Instant::now() + Duration::from_secs(120);
                let mut log = Vec::new();
                let mut why = String::from("the barrier is not in its log");
                let caught_up = loop {
                    match ordered::read_log(ep).await {
                        Ok(l) => {
                            log = l;
                            if log.iter().any(|r| r.value == last) {
                                break true;
                            }
                            why = format!(
                                "its log holds {} records, the barrier not among them",
                                log.len()
                            );
                        }
                        Err(e) => why = format!("reading its log failed: {e}"),
                    }
                    if Instant::now() >= until {
                        break false;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                };
                if !caught_up {
                    extra.push(format!(
                        "node {} did not catch up to the barrier within 120 s: {why}",
                        i + 1
                    ));
                }
                finals.push(Final {
                    node: i + 1,
                    records: log,
                });
            }
        }
    }
    (finals, extra)
}

fn write_log(path: &Path, f: &Final) -> Result<(), Error> {
    let mut s = String::new();
    for r in &f.records {
        s.push_str(&format!("{} {} {}\n", r.lsn, r.csn, r.value));
    }
    std::fs::write(path, s).map_err(|e| Error::io(path.display(), e))
}
