//! `chorus-bench ooo`: parallel mode against an in-order baseline in the same driver, with
//! 4 KiB block writes at IO depths 1..32 and jitter on one replication link (the shape of
//! PolarFS Fig. 7).
//!
//! Both systems are three [`OooNode`]s in this process (threads, not processes), each with
//! its own directory and fdatasync on, over loopback TCP; the leader's link to one
//! follower waits a random time below `--jitter-ms` before each write.
//!
//! - **parallel**: each record declares the one 4 KiB block it writes at a random LBA of a
//!   1 GiB volume; entries commit as soon as a majority has them and apply unless they
//!   overlap an unapplied predecessor.
//! - **in-order**: dependent mode with every record reading and writing one key, so every
//!   entry has its predecessor as RAW and WAW dependency: it commits only after its
//!   predecessor committed and applies only after it applied — Raft's order, in the same
//!   driver, replica code, store and transport. It is **not** the ordered (PALF) replica
//!   of the main runtime, whose write path is different; comparing against that is still
//!   to do.
//!
//! Each point is a fresh cluster; the systems alternate per point and the command repeats
//! the sweep `--repeats` times; the report gives medians.

use std::net::TcpListener;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chorus_core::ooo::parallel::BlockRange;
use chorus_core::ooo::replica::{Declared, Mode};
use chorus_core::replica::Outcome;
use chorus_runtime::ooo::{OooNode, OooNodeConfig};

/// One measured point.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Point {
    /// `parallel` or `in-order`.
    pub system: &'static str,
    /// Appends in flight (closed-loop clients).
    pub depth: usize,
    /// Committed appends per second.
    pub iops: f64,
}

fn cluster(root: &Path, mode: Mode, jitter: Duration) -> Result<Vec<OooNode>, String> {
    let listeners: Vec<TcpListener> = (0..3)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("bind: {e}"))?;
    let addrs: Vec<_> = listeners
        .iter()
        .map(|l| l.local_addr())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("local_addr: {e}"))?;
    let mut nodes = Vec::new();
    for (i, l) in listeners.into_iter().enumerate() {
        let cfg = OooNodeConfig {
            id: i as u64 + 1,
            voters: addrs
                .iter()
                .enumerate()
                .map(|(j, a)| (j as u64 + 1, *a))
                .collect(),
            mode,
            dir: root.join(format!("n{}", i + 1)),
            // Node 1 campaigns first (shorter timeout) and its link to node 3 jitters.
            election_timeout: Duration::from_millis(if i == 0 { 100 } else { 1_000 }),
            link_jitter: (i == 0).then_some((3, jitter)),
            group: 1,
            apply_threads: 0,
        };
        nodes.push(OooNode::start(cfg, l, Arc::new(|_| {})).map_err(|e| e.to_string())?);
    }
    Ok(nodes)
}

fn point(
    root: &Path,
    system: &'static str,
    depth: usize,
    secs: f64,
    jitter: Duration,
) -> Result<Point, String> {
    let dir = root.join(format!("{system}-{depth}"));
    let _ = std::fs::remove_dir_all(&dir);
    let mode = if system == "parallel" {
        Mode::Parallel { span: 2 }
    } else {
        Mode::Dependent
    };
    let nodes = Arc::new(cluster(&dir, mode, jitter)?);
    let t0 = Instant::now();
    let leader = loop {
        if let Some(i) = (0..3).find(|&i| nodes[i].status().is_some_and(|s| s.serving)) {
            break i;
        }
        if t0.elapsed() > Duration::from_secs(10) {
            return Err("no leader within 10 s".into());
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let failed = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..depth)
        .map(|c| {
            let (nodes, done, stop, failed) =
                (nodes.clone(), done.clone(), stop.clone(), failed.clone());
            std::thread::spawn(move || {
                let mut rng = chorus_core::rng::Rng::new(c as u64 + 1);
                let data = vec![0xA5u8; 4096];
                while !stop.load(Ordering::Relaxed) {
                    let d = if system == "parallel" {
                        let lba = rng.below(1 << 18);
                        Declared::Blocks(vec![BlockRange::new(lba, 1).expect("one block")])
                    } else {
                        Declared::Txn {
                            read_set: vec![0],
                            write_set: vec![0],
                        }
                    };
                    match nodes[leader].append(d, data.clone()) {
                        Ok(Outcome::Committed) => {
                            done.fetch_add(1, Ordering::Relaxed);
                        }
                        _ => {
                            failed.fetch_add(1, Ordering::Relaxed);
                            std::thread::sleep(Duration::from_millis(1));
                        }
                    }
                }
            })
        })
        .collect();
    // Warm up, then count.
    std::thread::sleep(Duration::from_millis(300));
    let (c0, t) = (done.load(Ordering::Relaxed), Instant::now());
    std::thread::sleep(Duration::from_secs_f64(secs));
    let n = done.load(Ordering::Relaxed) - c0;
    let el = t.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    drop(nodes);
    let _ = std::fs::remove_dir_all(&dir);
    if failed.load(Ordering::Relaxed) > 0 {
        return Err(format!(
            "{system} depth {depth}: {} appends did not commit (leader change during the run?)",
            failed.load(Ordering::Relaxed)
        ));
    }
    Ok(Point {
        system,
        depth,
        iops: n as f64 / el,
    })
}

/// Runs the sweep; returns every point of every repeat.
pub fn run(
    root: &Path,
    depths: &[usize],
    secs: f64,
    jitter_ms: f64,
    repeats: usize,
) -> Result<Vec<Point>, String> {
    let jitter = Duration::from_secs_f64(jitter_ms / 1e3);
    let mut out = Vec::new();
    for r in 0..repeats {
        for &d in depths {
            // Alternate which system goes first at each point.
            let order = if (r + d) % 2 == 0 {
                ["parallel", "in-order"]
            } else {
                ["in-order", "parallel"]
            };
            for sys in order {
                let p = point(root, sys, d, secs, jitter)?;
                eprintln!(
                    "repeat {r} {sys:>8} depth {d:>2}: {:>8.0} appends/s",
                    p.iops
                );
                out.push(p);
            }
        }
    }
    let _ = std::fs::remove_dir_all(root);
    Ok(out)
}
