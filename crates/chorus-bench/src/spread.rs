//! `chorus-bench spread`: does throughput hold when the same closed-loop load is spread
//! over many groups?
//!
//! Three nodes, each an [`Env`] in this process with its own data directory on the same
//! disk and a loopback listener, host `N` ordered groups replicated on all three (fsync
//! on: an append commits once a majority has synced it). `--clients` closed-loop clients
//! (tokio tasks in this process) append `--size`-byte records through the embedded API
//! of their group's leader, client `c` to group `c mod N`, each waiting for its result
//! before the next. Leaders fall where the elections put them, so the load spreads over
//! the three nodes as groups do in a deployment. Every point (a value of `N`) starts
//! from fresh directories; the points run in the order given, and the report gives each
//! point's appends/s as a ratio to the first point's (the one-group baseline when `1`
//! comes first).
//!
//! What it shows is whether a node's groups share their `fdatasync`s: with one client
//! per group, a group has one append per round, so unless the node syncs many groups'
//! writes together the disk's flush rate caps the whole node.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chorus_runtime::{Env, EnvConfig, LogHandle, Role};

/// Settings of a run.
#[derive(Clone, Debug)]
pub struct SpreadOpts {
    /// Group counts, one point each, in this order.
    pub groups: Vec<u64>,
    /// Closed-loop clients (the same at every point).
    pub clients: u64,
    /// Bytes per record.
    pub size: usize,
    /// Seconds measured per point.
    pub secs: u64,
    /// Seconds of load before the measurement starts.
    pub warmup: u64,
    /// Seconds allowed for every group to elect a leader.
    pub settle_secs: u64,
    /// Scratch directory (each point works in a fresh subdirectory and removes it).
    pub dir: PathBuf,
    /// IO workers per node (`None`: [`EnvConfig`]'s default).
    pub io_workers: Option<usize>,
    /// Ordered groups one IO worker steps together (`None`: [`EnvConfig`]'s default).
    pub pass_groups: Option<usize>,
}

/// One point.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SpreadPoint {
    /// Groups (on every node).
    pub groups: u64,
    /// Closed-loop clients.
    pub clients: u64,
    /// Bytes per record.
    pub size: usize,
    /// Committed appends per second over the measured window.
    pub appends_per_sec: f64,
    /// Median append latency, µs (from the call to the committed result).
    pub p50_us: u64,
    /// 99th percentile append latency, µs.
    pub p99_us: u64,
    /// Log `fdatasync`s per second, all three nodes together.
    pub fsyncs_per_sec: f64,
    /// Appends/s of this point ÷ the first point's.
    pub ratio_to_first: f64,
    /// Appends refused or failed during the window (a leader change; retried).
    pub errors: u64,
    /// The process's peak resident memory so far, MiB (`VmHWM`: it never goes down, so
    /// run one point per process to read one point's).
    pub peak_rss_mib: u64,
}

/// The process's peak resident set, MiB (0 if `/proc` does not say).
fn peak_rss_mib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb / 1024)
}

/// One node: its environment.
fn open_node(id: u64, dir: &Path, o: &SpreadOpts) -> Result<Env, String> {
    let mut cfg = EnvConfig::new(id, dir, "127.0.0.1:0".parse().expect("address"));
    if let Some(n) = o.io_workers {
        cfg.io_workers = n;
    }
    if let Some(n) = o.pass_groups {
        cfg.pass_groups = n;
    }
    Env::open(cfg).map_err(|e| format!("node {id}: open: {e}"))
}

/// The leader's handle of group `g`, if some node leads it.
fn leader_of(envs: &[Env], g: u64) -> Option<LogHandle> {
    envs.iter()
        .filter_map(|e| e.group(g).ok())
        .find(|h| h.role().role == Role::Leader)
}

/// Log fdatasyncs of every node so far.
fn fsyncs(envs: &[Env]) -> u64 {
    envs.iter().map(|e| e.log_fsyncs()).sum()
}

/// Runs one point.
fn point(o: &SpreadOpts, groups: u64) -> Result<SpreadPoint, String> {
    let root = o
        .dir
        .join(format!("spread-{}-{groups}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let result = (|| {
        let mut envs = Vec::new();
        for i in 1..=3u64 {
            envs.push(open_node(i, &root.join(format!("n{i}")), o)?);
        }
        for (i, a) in envs.iter().enumerate() {
            for (j, b) in envs.iter().enumerate() {
                if i != j {
                    a.set_peer_addr(j as u64 + 1, b.replication_addr().to_string());
                }
            }
        }
        for e in &envs {
            for g in 1..=groups {
                e.create_group(g, &[1, 2, 3], &[])
                    .map_err(|err| format!("node {}: create group {g}: {err}", e.node()))?;
            }
        }
        // Every group has a leader that committed an append.
        let t0 = Instant::now();
        for g in 1..=groups {
            loop {
                if t0.elapsed() > Duration::from_secs(o.settle_secs) {
                    return Err(format!("group {g} had no leader within {}s", o.settle_secs));
                }
                if leader_of(&envs, g).is_some_and(|h| {
                    h.append(b"settle", 0)
                        .is_ok_and(|a| a.result.wait().is_ok())
                }) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        let envs = Arc::new(envs);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| format!("tokio: {e}"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let measuring = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicU64::new(0));
        let errors = Arc::new(AtomicU64::new(0));
        let hist = Arc::new(Mutex::new(
            hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)
                .map_err(|e| e.to_string())?,
        ));
        let record = vec![0x5a_u8; o.size];
        let mut tasks = Vec::new();
        for c in 0..o.clients {
            let g = c % groups + 1;
            let (envs, stop, measuring, done, errors, hist, record) = (
                envs.clone(),
                stop.clone(),
                measuring.clone(),
                done.clone(),
                errors.clone(),
                hist.clone(),
                record.clone(),
            );
            tasks.push(rt.spawn(async move {
                let mut local = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)
                    .expect("histogram bounds");
                let mut leader: Option<LogHandle> = None;
                while !stop.load(Ordering::Relaxed) {
                    let Some(h) = leader.clone().or_else(|| leader_of(&envs, g)) else {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        continue;
                    };
                    leader = Some(h.clone());
                    let t = Instant::now();
                    let r = match h.append(&record, 0) {
                        Ok(a) => a.result.await,
                        Err(e) => Err(e),
                    };
                    let counted = measuring.load(Ordering::Relaxed);
                    match r {
                        Ok(r) if r.outcome == chorus_runtime::Outcome::Committed => {
                            if counted {
                                done.fetch_add(1, Ordering::Relaxed);
                                let _ = local.record(t.elapsed().as_micros() as u64);
                            }
                        }
                        Ok(_) | Err(_) => {
                            if counted {
                                errors.fetch_add(1, Ordering::Relaxed);
                            }
                            leader = None;
                        }
                    }
                }
                hist.lock()
                    .expect("histogram")
                    .add(&local)
                    .expect("same bounds");
            }));
        }
        std::thread::sleep(Duration::from_secs(o.warmup));
        let (f0, t0) = (fsyncs(&envs), Instant::now());
        measuring.store(true, Ordering::Relaxed);
        std::thread::sleep(Duration::from_secs(o.secs));
        measuring.store(false, Ordering::Relaxed);
        let took = t0.elapsed().as_secs_f64();
        let f1 = fsyncs(&envs);
        stop.store(true, Ordering::Relaxed);
        rt.block_on(async {
            for t in tasks {
                let _ = t.await;
            }
        });
        drop(rt);
        for e in envs.iter() {
            e.shutdown();
        }
        let h = hist.lock().expect("histogram");
        Ok(SpreadPoint {
            groups,
            clients: o.clients,
            size: o.size,
            appends_per_sec: done.load(Ordering::Relaxed) as f64 / took,
            p50_us: h.value_at_quantile(0.5),
            p99_us: h.value_at_quantile(0.99),
            fsyncs_per_sec: (f1 - f0) as f64 / took,
            ratio_to_first: 0.0,
            errors: errors.load(Ordering::Relaxed),
            peak_rss_mib: peak_rss_mib(),
        })
    })();
    let _ = std::fs::remove_dir_all(&root);
    result
}

/// Runs every point (see the module docs).
pub fn run(o: &SpreadOpts) -> Result<Vec<SpreadPoint>, String> {
    let mut out: Vec<SpreadPoint> = Vec::new();
    for &g in &o.groups {
        if g == 0 {
            return Err("--groups: a point of 0 groups".into());
        }
        let mut p = point(o, g)?;
        if p.appends_per_sec <= 0.0 {
            return Err(format!(
                "{g} groups: no append committed in the measured {}s",
                o.secs
            ));
        }
        p.ratio_to_first = out
            .first()
            .map_or(1.0, |f| p.appends_per_sec / f.appends_per_sec.max(1e-9));
        eprintln!(
            "{} groups, {} clients: {:.0} appends/s (×{:.2}), p50 {} µs, p99 {} µs, {:.0} fsyncs/s, peak RSS {} MiB",
            p.groups,
            p.clients,
            p.appends_per_sec,
            p.ratio_to_first,
            p.p50_us,
            p.p99_us,
            p.fsyncs_per_sec,
            p.peak_rss_mib
        );
        out.push(p);
    }
    Ok(out)
}
