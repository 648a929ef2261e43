//! `chorus-bench groups`: what many groups cost a node at rest, and how long a node takes
//! to come back with them.
//!
//! Three nodes, each an [`Env`] in this process with its own data directory and
//! listener (loopback), host `--groups` groups replicated on all three: a third ordered,
//! a third parallel, a third dependent (group id modulo 3). Once every group has a
//! leader that committed an append, the process's CPU time (`utime + stime` of
//! `/proc/self/stat`) is measured over `--idle-secs` with no client load: what the groups
//! cost at rest, divided by three for one node. Then node 3 is shut down and opened
//! again from its directory, and two times are reported: until every group of it is
//! open (its environment opened, which opens the ordered groups, and every out-of-order
//! group started), and until every group of it has heard a leader again.
//!
//! Everything runs in one process on this 2-core machine, so the three nodes' costs are
//! summed; the per-node figure is that sum over three.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chorus_core::ooo::group::Record;
use chorus_core::ooo::replica::{Declared, Mode};
use chorus_runtime::ooo::{OooNode, OooNodeConfig, OooStateMachine};
use chorus_runtime::{Env, EnvConfig, Role};

/// Settings of a run.
#[derive(Clone, Debug)]
pub struct GroupsOpts {
    /// Groups hosted by every node.
    pub groups: u64,
    /// Seconds of measured rest.
    pub idle_secs: u64,
    /// Scratch directory (removed at the end).
    pub dir: PathBuf,
    /// Seconds allowed for every group to elect a leader, at the start and after the
    /// restart.
    pub settle_secs: u64,
}

/// What a run measured.
#[derive(Clone, Debug, serde::Serialize)]
pub struct GroupsResult {
    /// Groups per node.
    pub groups: u64,
    /// Seconds until every group had a leader that committed an append.
    pub settle_secs: f64,
    /// CPU seconds per second of the whole process at rest (three nodes).
    pub idle_cores_total: f64,
    /// The same for one node (a third).
    pub idle_cores_per_node: f64,
    /// Seconds to reopen node 3 with every group open.
    pub reopen_secs: f64,
    /// Seconds from the start of the reopen until every group of node 3 knew a leader.
    pub rejoin_secs: f64,
}

/// A state machine that keeps nothing: the groups only replicate.
struct Nothing;

impl OooStateMachine for Nothing {
    fn apply(&self, _slot: u64, _records: &[(u32, Record)]) -> std::io::Result<()> {
        Ok(())
    }
    fn checkpoint(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn image(&self) -> std::io::Result<Vec<u8>> {
        Ok(Vec::new())
    }
    fn restore(&self, _image: &[u8]) -> std::io::Result<()> {
        Ok(())
    }
}

/// The mode of group `g` (`None`: ordered).
fn mode_of(g: u64) -> Option<Mode> {
    match g % 3 {
        0 => None,
        1 => Some(Mode::Parallel { span: 2 }),
        _ => Some(Mode::Dependent),
    }
}

/// One node: its environment and the out-of-order groups it runs.
struct Node {
    env: Env,
    ooo: Vec<(u64, Arc<OooNode>)>,
}

fn ooo_config(node: u64, g: u64, mode: Mode, dir: &Path) -> OooNodeConfig {
    OooNodeConfig {
        id: node,
        group: g,
        voters: vec![1, 2, 3],
        others: Vec::new(),
        mode,
        dir: dir.join("ooo").join(g.to_string()),
        election_timeout: Duration::from_millis(1000),
        apply_threads: 0,
        catchup_rate: 0,
        conflict_order: false,
        compact_bytes: 0,
        hole_resend: chorus_core::ooo::replica::HOLE_RESEND,
        timed_resend: chorus_core::ooo::replica::TIMED_RESEND,
        freeze_interval: Duration::ZERO,
        preallocate: 0,
        direct_io: true,
        disk: None,
        fs: None,
    }
}

/// Opens node `id` in `dir` and starts every group on it (ordered groups are created
/// the first time, reopened by the environment after).
fn open_node(id: u64, dir: &Path, groups: u64, fresh: bool) -> Result<Node, String> {
    let mut cfg = EnvConfig::new(id, dir, "127.0.0.1:0".parse().expect("address"));
    // Idle groups append nothing: no zeros written ahead of 3,000 logs.
    cfg.log.preallocate = 0;
    let env = Env::open(cfg).map_err(|e| format!("node {id}: open: {e}"))?;
    let mut ooo = Vec::new();
    for g in 1..=groups {
        match mode_of(g) {
            None if fresh => {
                env.create_group(g, &[1, 2, 3], &[])
                    .map_err(|e| format!("node {id}: create group {g}: {e}"))?;
            }
            None => {}
            Some(mode) => {
                let n = env
                    .start_ooo_group(ooo_config(id, g, mode, dir), Arc::new(Nothing))
                    .map_err(|e| format!("node {id}: start group {g}: {e}"))?;
                ooo.push((g, n));
            }
        }
    }
    Ok(Node { env, ooo })
}

/// Teaches every node every other node's address.
fn introduce(nodes: &[Option<Node>]) {
    for (i, a) in nodes.iter().enumerate() {
        for (j, b) in nodes.iter().enumerate() {
            if let (Some(a), Some(b), true) = (a, b, i != j) {
                a.env
                    .set_peer_addr(j as u64 + 1, b.env.replication_addr().to_string());
            }
        }
    }
}

/// Waits until every group has a leader that committed an append (ordered: a record;
/// out-of-order: a record of the group's mode).
fn settle(nodes: &[Option<Node>], groups: u64, limit: Duration) -> Result<Duration, String> {
    let t0 = Instant::now();
    let live: Vec<&Node> = nodes.iter().flatten().collect();
    for g in 1..=groups {
        loop {
            if t0.elapsed() > limit {
                return Err(format!("group {g} had no leader within {limit:?}"));
            }
            let done = match mode_of(g) {
                None => live.iter().any(|n| {
                    n.env.group(g).is_ok_and(|l| {
                        l.role().role == Role::Leader
                            && l.append(b"settle", 0)
                                .is_ok_and(|a| a.result.wait().is_ok())
                    })
                }),
                Some(mode) => live.iter().any(|n| {
                    let node = &n.ooo.iter().find(|(id, _)| *id == g).expect("started").1;
                    node.status().is_some_and(|s| s.serving) && {
                        let d =
                            match mode {
                                Mode::Parallel { .. } => Declared::Blocks(vec![
                                    chorus_core::ooo::parallel::BlockRange::new(0, 1)
                                        .expect("a range"),
                                ]),
                                Mode::Dependent => Declared::Txn {
                                    read_set: vec![],
                                    write_set: vec![1],
                                },
                            };
                        node.append(d, vec![0; 16]).is_ok()
                    }
                }),
            };
            if done {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    Ok(t0.elapsed())
}

/// CPU seconds this process has used.
fn cpu_secs() -> Result<f64, String> {
    let path = Path::new("/proc/self/stat");
    let text = std::fs::read_to_string(path).map_err(|e| format!("read {path:?}: {e}"))?;
    let ticks =
        chorus_workload::procstat::parse_stat_cpu_ticks(&text, path).map_err(|e| e.to_string())?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Ok(ticks as f64 / hz)
}

/// Runs the measurement (see the module docs).
pub fn run(o: &GroupsOpts) -> Result<GroupsResult, String> {
    let root = o.dir.join(format!("groups-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let dir = |i: u64| root.join(format!("n{i}"));
    let result = (|| {
        let mut nodes: Vec<Option<Node>> = Vec::new();
        for i in 1..=3 {
            nodes.push(Some(open_node(i, &dir(i), o.groups, true)?));
        }
        introduce(&nodes);
        let limit = Duration::from_secs(o.settle_secs);
        let settled = settle(&nodes, o.groups, limit)?;
        eprintln!(
            "{} groups per node settled in {:.1} s",
            o.groups,
            settled.as_secs_f64()
        );
        // Rest: let the settle's appends finish replicating, then measure.
        std::thread::sleep(Duration::from_secs(2));
        let (c0, t0) = (cpu_secs()?, Instant::now());
        std::thread::sleep(Duration::from_secs(o.idle_secs));
        let cores = (cpu_secs()? - c0) / t0.elapsed().as_secs_f64();
        eprintln!(
            "at rest: {cores:.3} cores for three nodes, {:.3} per node",
            cores / 3.0
        );
        // Node 3 goes away and comes back from its directory.
        if let Some(n) = nodes[2].take() {
            let Node { env, ooo } = n;
            drop(ooo);
            env.shutdown();
        }
        let t = Instant::now();
        nodes[2] = Some(open_node(3, &dir(3), o.groups, false)?);
        let reopen = t.elapsed();
        introduce(&nodes);
        let n3 = nodes[2].as_ref().expect("reopened");
        let mut pending: Vec<u64> = (1..=o.groups).collect();
        while !pending.is_empty() {
            if t.elapsed() > limit {
                return Err(format!(
                    "{} groups of node 3 knew no leader {limit:?} after its restart",
                    pending.len()
                ));
            }
            pending.retain(|&g| match mode_of(g) {
                None => !n3.env.group(g).is_ok_and(|l| l.role().leader.is_some()),
                Some(_) => n3
                    .ooo
                    .iter()
                    .find(|(id, _)| *id == g)
                    .and_then(|(_, n)| n.status())
                    .is_none_or(|s| s.leader.is_none()),
            });
            std::thread::sleep(Duration::from_millis(20));
        }
        let rejoin = t.elapsed();
        eprintln!(
            "node 3 reopened with every group in {:.2} s; every group knew a leader after {:.2} s",
            reopen.as_secs_f64(),
            rejoin.as_secs_f64()
        );
        for n in nodes.into_iter().flatten() {
            let Node { env, ooo } = n;
            drop(ooo);
            env.shutdown();
        }
        Ok(GroupsResult {
            groups: o.groups,
            settle_secs: settled.as_secs_f64(),
            idle_cores_total: cores,
            idle_cores_per_node: cores / 3.0,
            reopen_secs: reopen.as_secs_f64(),
            rejoin_secs: rejoin.as_secs_f64(),
        })
    })();
    let _ = std::fs::remove_dir_all(&root);
    result
}
