//! openraft-peer: one replica of a 3-process openraft 0.10 cluster with a durable,
//! group-committing log, plus (on node 1) closed-loop clients. See README.md.

mod net;
mod procstat;
mod store;

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use futures_util::StreamExt;
use hdrhistogram::Histogram;
use openraft::async_runtime::watch::WatchReceiver;
use openraft::{BasicNode, Config, SnapshotPolicy};
use rand::{RngCore, SeedableRng};
use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

pub type NodeId = u64;

/// The application data of one raft entry: one client record of `--size` opaque bytes, or
/// (with `--batch N`) up to N records from different clients. Behind an `Arc`, so the copies
/// openraft makes (log readers, replication, apply) do not copy or allocate.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Record(pub Arc<Vec<ByteBuf>>);

impl Record {
    fn one(bytes: Vec<u8>) -> Self {
        Record(Arc::new(vec![ByteBuf::from(bytes)]))
    }
}

impl fmt::Display for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Record({} records)", self.0.len())
    }
}

openraft::declare_raft_types!(
    pub TypeConfig:
        D = Record,
        R = (),
);

pub type Raft = openraft::Raft<TypeConfig, store::StateMachine>;

const OPENRAFT_VERSION: &str = "0.10.0-alpha.37";

/// How the clients hand their writes to openraft (`--writes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Writes {
    /// Every client calls `Raft::client_write` itself; RaftCore merges the ClientWrite
    /// messages queued at once into one batch (`api_batch_capacity`).
    Merged,
    /// The clients queue their writes to a collector task that submits everything queued
    /// with one `Raft::client_write_many` call and hands each client its own result.
    Many,
}

#[derive(Parser, Debug)]
#[command(name = "openraft-peer", about = "3-replica openraft benchmark peer")]
struct Args {
    /// This node's id (1..=N); node 1 initializes the cluster and runs the clients.
    #[arg(long)]
    id: NodeId,
    /// Comma-separated addresses of all nodes, in id order (node i = i-th address).
    #[arg(long, value_delimiter = ',')]
    peers: Vec<String>,
    /// Data directory of this node.
    #[arg(long)]
    data: PathBuf,
    /// Closed-loop clients (node 1 only; 0 = just serve).
    #[arg(long, default_value_t = 0)]
    clients: usize,
    /// Record size in bytes.
    #[arg(long, default_value_t = 512)]
    size: usize,
    /// Warm-up, not measured ("2s", "500ms", or plain seconds).
    #[arg(long, default_value = "2s", value_parser = parse_dur)]
    warmup: Duration,
    /// Measured interval.
    #[arg(long, default_value = "10s", value_parser = parse_dur)]
    duration: Duration,
    /// Where to write the result JSON (also printed to stdout).
    #[arg(long)]
    out: Option<PathBuf>,
    /// How clients submit their writes (one record per raft entry either way).
    #[arg(long, value_enum, default_value = "many")]
    writes: Writes,
    /// Optional application-level batching (not the default): if > 0, clients hand their
    /// records to a batcher task that puts up to this many records into one raft entry
    /// (one `client_write`). 0 = every record is its own raft entry.
    #[arg(long, default_value_t = 0)]
    batch: usize,
    /// With --batch: how many batched `client_write`s may be in flight at once.
    #[arg(long, default_value_t = 4)]
    batch_inflight: usize,
    /// Pids of the other replicas, for OS accounting over the measured interval (node 1).
    #[arg(long, value_delimiter = ',')]
    sample_pids: Vec<u32>,
    /// Node 1, after the run: check that every acknowledged write is in at least 2 of these
    /// log directories' files (normally all three nodes' --data).
    #[arg(long, value_delimiter = ',')]
    verify_logs: Vec<PathBuf>,
    /// openraft `Config::broadcast_submitted_on_append` (off by default, as in openraft).
    #[arg(long, default_value_t = false)]
    broadcast_submitted: bool,
}

fn parse_dur(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, mul) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = s.strip_suffix("us") {
        (n, 1e-6)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else {
        (s, 1.0)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|e| format!("bad duration {s:?}: {e}"))?;
    if !v.is_finite() || v < 0.0 {
        return Err(format!("bad duration {s:?}"));
    }
    Ok(Duration::from_secs_f64(v * mul))
}

#[derive(Serialize)]
struct Output {
    system: &'static str,
    clients: usize,
    size: usize,
    appends: u64,
    seconds: f64,
    appends_per_sec: f64,
    mb_per_sec: f64,
    p50_us: u64,
    p99_us: u64,
    p999_us: u64,
    max_us: u64,
    errors: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    batch: Option<usize>,
    openraft_version: &'static str,
    writes: &'static str,
    // The shared benchmark result schema; null when unknown.
    path: &'static str,
    commit_mode: Option<&'static str>,
    replicas: u32,
    #[serde(flatten)]
    os: procstat::OsFields,
    fsyncs_per_sec: Option<f64>,
    follower_msgs_per_sec: Option<f64>,
}

fn main() {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let code = rt.block_on(run(args));
    std::process::exit(code);
}

async fn run(args: Args) -> i32 {
    let n = args.peers.len() as u64;
    if args.id < 1 || args.id > n {
        eprintln!("--id must be in 1..={n}");
        return 2;
    }
    let my_addr = args.peers[(args.id - 1) as usize].clone();

    let config = Config {
        cluster_name: "openraft-bench".into(),
        heartbeat_interval: 100,
        election_timeout_min: 1000,
        election_timeout_max: 2000,
        // No heartbeat to a follower that acknowledged replication within the last 100 ms:
        // under load the replication stream already proves liveness.
        heartbeat_min_interval: Some(100),
        // Up to 4096 entries per AppendEntries and per storage append (openraft's default
        // for the latter), and up to 4096 queued ClientWrites merged into one batch
        // (openraft's default).
        max_payload_entries: 4096,
        max_append_entries: Some(4096),
        api_batch_capacity: 4096,
        broadcast_submitted_on_append: Some(args.broadcast_submitted),
        snapshot_policy: SnapshotPolicy::Never,
        ..Default::default()
    };
    let config = Arc::new(config.validate().expect("config"));

    let log = store::LogStore::open(&args.data).expect("open log store");
    let sm = store::StateMachine::default();
    let network = net::Network::new(args.id);
    let raft = Raft::new(args.id, config, network.clone(), log.clone(), sm)
        .await
        .expect("raft");

    let listener = TcpListener::bind(&my_addr)
        .await
        .unwrap_or_else(|e| panic!("bind {my_addr}: {e}"));
    let exit_from = if args.id != 1 { Some(1) } else { None };
    tokio::spawn(net::serve(listener, raft.clone(), exit_from));

    // Exit on SIGTERM / SIGINT.
    tokio::spawn(async {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).unwrap();
        tokio::select! {
            _ = term.recv() => {},
            _ = tokio::signal::ctrl_c() => {},
        }
        std::process::exit(0);
    });

    if args.id != 1 {
        std::future::pending::<()>().await;
        return 0;
    }

    // Node 1: wait until every peer listens, then initialize and wait for leadership.
    for (i, a) in args.peers.iter().enumerate() {
        if i as u64 + 1 == args.id {
            continue;
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while tokio::net::TcpStream::connect(a).await.is_err() {
            if Instant::now() > deadline {
                eprintln!("peer {a} not reachable");
                return 1;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let members: BTreeMap<NodeId, BasicNode> = args
        .peers
        .iter()
        .enumerate()
        .map(|(i, a)| (i as u64 + 1, BasicNode { addr: a.clone() }))
        .collect();
    if let Err(e) = raft.initialize(members).await {
        eprintln!("initialize: {e} (continuing)");
    }
    if let Err(e) = raft
        .wait(Some(Duration::from_secs(60)))
        .current_leader(1, "node 1 leader")
        .await
    {
        eprintln!("node 1 did not become leader: {e}");
        return 1;
    }
    // The metrics can name node 1 leader a moment before it accepts writes; wait until a
    // (blank) write commits, so the clients start against a working leader.
    let deadline = Instant::now() + Duration::from_secs(60);
    while let Err(e) = raft.write_blank().await {
        if Instant::now() > deadline {
            eprintln!("node 1 does not accept writes: {e}");
            return 1;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!("node 1 is leader (openraft {OPENRAFT_VERSION})");

    if args.clients == 0 {
        std::future::pending::<()>().await;
        return 0;
    }

    let (out, acked) = load(&raft, &network, &args).await;
    if let Err(e) = check_acked(&raft, &log, &acked) {
        eprintln!("CHECK FAILED: {e}");
        return 1;
    }
    if !args.verify_logs.is_empty() {
        if let Err(e) = verify_logs(&args.verify_logs, acked) {
            eprintln!("VERIFY FAILED: {e}");
            return 1;
        }
    }
    let json = serde_json::to_string(&out).unwrap();
    if let Some(p) = &args.out {
        let tmp = p.with_extension("json.tmp");
        std::fs::write(&tmp, format!("{json}\n")).expect("write --out");
        std::fs::rename(&tmp, p).expect("rename --out");
    }
    println!("{json}");
    0
}

/// A client's answer: the log index its write was committed at.
type WriteRes = Result<u64, String>;
type Waiter = oneshot::Sender<WriteRes>;

/// `--writes many`: takes everything the clients queued and submits it with one
/// `client_write_many`; a task per call hands each client its own result as it arrives.
async fn collector(raft: Raft, mut rx: mpsc::UnboundedReceiver<(Vec<u8>, Waiter)>) {
    const MAX: usize = 4096;
    let mut recs = Vec::new();
    let mut waiters = Vec::new();
    while let Some((r, w)) = rx.recv().await {
        recs.push(Record::one(r));
        waiters.push(w);
        while recs.len() < MAX {
            match rx.try_recv() {
                Ok((r, w)) => {
                    recs.push(Record::one(r));
                    waiters.push(w);
                }
                Err(_) => break,
            }
        }
        let waiters = std::mem::take(&mut waiters);
        match raft.client_write_many(recs.drain(..)).await {
            Ok(mut results) => {
                tokio::spawn(async move {
                    let mut waiters = waiters.into_iter();
                    while let Some(r) = results.next().await {
                        let res = match r {
                            Ok(Ok(resp)) => Ok(resp.log_id.index),
                            Ok(Err(e)) => Err(e.to_string()),
                            Err(fatal) => Err(fatal.to_string()),
                        };
                        match waiters.next() {
                            Some(w) => {
                                let _ = w.send(res);
                            }
                            None => break,
                        }
                    }
                    for w in waiters {
                        let _ = w.send(Err("no result from client_write_many".into()));
                    }
                });
            }
            Err(fatal) => {
                for w in waiters {
                    let _ = w.send(Err(fatal.to_string()));
                }
            }
        }
    }
}

/// `--batch`: collects records from the clients and writes up to `max` of them per raft entry,
/// with at most `inflight` `client_write`s outstanding. While those are in flight, new records
/// queue up and go into the next entry.
async fn batcher(
    raft: Raft,
    mut rx: mpsc::UnboundedReceiver<(Vec<u8>, Waiter)>,
    max: usize,
    inflight: usize,
) {
    let sem = Arc::new(tokio::sync::Semaphore::new(inflight.max(1)));
    loop {
        let permit = sem.clone().acquire_owned().await.unwrap();
        let Some(first) = rx.recv().await else { return };
        let mut recs = vec![ByteBuf::from(first.0)];
        let mut waiters = vec![first.1];
        while recs.len() < max {
            match rx.try_recv() {
                Ok((r, w)) => {
                    recs.push(ByteBuf::from(r));
                    waiters.push(w);
                }
                Err(_) => break,
            }
        }
        let raft = raft.clone();
        tokio::spawn(async move {
            let res = raft
                .client_write(Record(Arc::new(recs)))
                .await
                .map(|r| r.log_id.index)
                .map_err(|e| e.to_string());
            drop(permit);
            for w in waiters {
                let _ = w.send(res.clone());
            }
        });
    }
}

/// (log index, crc32 of the record) of one acknowledged write.
type Acked = (u64, u32);

/// The benchmark's own counters of every node: fdatasync calls summed over the nodes, and
/// the request frames node 2 received.
async fn counters(network: &net::Network, peers: &[String]) -> Option<(u64, u64)> {
    let mut fsyncs = store::FSYNCS.load(std::sync::atomic::Ordering::Relaxed);
    let mut frames = None;
    for (i, addr) in peers.iter().enumerate().skip(1) {
        match network.stats(i as u64 + 1, addr).await {
            Ok((f, r)) => {
                fsyncs += f;
                if i == 1 {
                    frames = Some(r);
                }
            }
            Err(e) => {
                eprintln!("warning: counters of node {}: {e}", i + 1);
                return None;
            }
        }
    }
    Some((fsyncs, frames?))
}

async fn load(raft: &Raft, network: &net::Network, args: &Args) -> (Output, Vec<Acked>) {
    let queue = if args.batch > 0 {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(batcher(raft.clone(), rx, args.batch, args.batch_inflight));
        Some(tx)
    } else if args.writes == Writes::Many {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(collector(raft.clone(), rx));
        Some(tx)
    } else {
        None
    };
    let start = Instant::now();
    let measure_start = start + args.warmup;
    let measure_end = measure_start + args.duration;
    // OS accounting: this process and the followers (--sample-pids), and the nodes' own
    // counters, sampled at both ends of the measured interval.
    let mut pids = vec![std::process::id()];
    pids.extend(args.sample_pids.iter().copied());
    let sampler = procstat::Sampler::new(pids, &args.data);
    let sampling = {
        let network = network.clone();
        let peers = args.peers.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(measure_start).await;
            let a = sampler.sample();
            let ca = counters(&network, &peers).await;
            tokio::time::sleep_until(measure_end).await;
            let b = sampler.sample();
            let cb = counters(&network, &peers).await;
            (a, b, ca.zip(cb))
        })
    };
    let mut tasks = Vec::new();
    for _ in 0..args.clients {
        let raft = raft.clone();
        let size = args.size;
        let queue = queue.clone();
        tasks.push(tokio::spawn(async move {
            let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
            let mut rng = rand::rngs::StdRng::from_entropy();
            let mut errors = 0u64;
            let mut acked: Vec<Acked> = Vec::new();
            loop {
                let t0 = Instant::now();
                if t0 >= measure_end {
                    break;
                }
                let mut buf = vec![0u8; size];
                rng.fill_bytes(&mut buf);
                let crc = crc32fast::hash(&buf);
                let res: WriteRes = match &queue {
                    None => raft
                        .client_write(Record::one(buf))
                        .await
                        .map(|r| r.log_id.index)
                        .map_err(|e| e.to_string()),
                    Some(tx) => {
                        let (wtx, wrx) = oneshot::channel();
                        let _ = tx.send((buf, wtx));
                        wrx.await.unwrap_or_else(|_| Err("writer task gone".into()))
                    }
                };
                match res {
                    Ok(index) => {
                        let t1 = Instant::now();
                        if t0 >= measure_start && t1 <= measure_end {
                            hist.saturating_record((t1 - t0).as_micros() as u64);
                        }
                        acked.push((index, crc));
                    }
                    Err(e) => {
                        errors += 1;
                        if errors <= 3 {
                            eprintln!("client write: {e}");
                        }
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
            (hist, errors, acked)
        }));
    }
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
    let mut errors = 0;
    let mut acked = Vec::new();
    for t in tasks {
        let (h, e, a) = t.await.expect("client task");
        hist.add(&h).unwrap();
        errors += e;
        acked.extend(a);
    }
    let secs = args.duration.as_secs_f64();
    let appends = hist.len();
    let (os, counted) = match sampling.await {
        Ok((a, b, c)) => (procstat::OsFields::from(&a, &b, appends, args.size), c),
        Err(e) => {
            eprintln!("warning: OS accounting: sampler task: {e}");
            (procstat::OsFields::default(), None)
        }
    };
    let (fsyncs_per_sec, follower_msgs_per_sec) = match counted {
        Some(((f0, r0), (f1, r1))) => (
            Some(f1.saturating_sub(f0) as f64 / secs),
            Some(r1.saturating_sub(r0) as f64 / secs),
        ),
        None => (None, None),
    };
    let out = Output {
        system: "openraft",
        clients: args.clients,
        size: args.size,
        appends,
        seconds: secs,
        appends_per_sec: appends as f64 / secs,
        mb_per_sec: appends as f64 * args.size as f64 / secs / 1e6,
        p50_us: hist.value_at_quantile(0.50),
        p99_us: hist.value_at_quantile(0.99),
        p999_us: hist.value_at_quantile(0.999),
        max_us: hist.max(),
        errors,
        batch: (args.batch > 0).then_some(args.batch),
        openraft_version: OPENRAFT_VERSION,
        writes: if args.batch > 0 {
            "batch"
        } else {
            match args.writes {
                Writes::Merged => "merged",
                Writes::Many => "many",
            }
        },
        path: "embedded",
        commit_mode: None,
        replicas: 3,
        os,
        fsyncs_per_sec,
        follower_msgs_per_sec,
    };
    (out, acked)
}

/// The crc32 of every record of `entry` (none for a blank or membership entry).
fn record_crcs(entry: &openraft::alias::EntryOf<TypeConfig>) -> Vec<u32> {
    match &entry.payload {
        openraft::EntryPayload::Normal(r) => r.0.iter().map(|b| crc32fast::hash(b)).collect(),
        _ => Vec::new(),
    }
}

/// Every acknowledged write is in the leader's log at the index it was acknowledged with,
/// with the same bytes, and at or below the last applied index.
fn check_acked(raft: &Raft, log: &store::LogStore, acked: &[Acked]) -> Result<(), String> {
    let applied = raft
        .metrics()
        .borrow_watched()
        .last_applied
        .map(|l| l.index);
    let mut sorted = acked.to_vec();
    sorted.sort_unstable();
    let mut cur: Option<(u64, Vec<u32>)> = None;
    for &(idx, crc) in &sorted {
        if applied.is_none_or(|a| idx > a) {
            return Err(format!(
                "write acknowledged at {idx}, last applied {applied:?}"
            ));
        }
        if cur.as_ref().is_none_or(|(i, _)| *i != idx) {
            let ent = log
                .entry(idx)
                .ok_or_else(|| format!("write acknowledged at {idx}: no such entry"))?;
            if ent.log_id.index != idx {
                return Err(format!("entry at {idx} has log id {}", ent.log_id));
            }
            cur = Some((idx, record_crcs(&ent)));
        }
        if !cur.as_ref().unwrap().1.contains(&crc) {
            return Err(format!("write acknowledged at {idx}: not in that entry"));
        }
    }
    eprintln!(
        "check: {} acknowledged writes are in the leader's log, applied (last applied {:?})",
        acked.len(),
        applied
    );
    Ok(())
}

/// Every acknowledged write is in at least 2 of the given log files (a majority of 3).
fn verify_logs(dirs: &[PathBuf], mut acked: Vec<Acked>) -> Result<(), String> {
    acked.sort_unstable();
    let mut count = vec![0u8; acked.len()];
    for d in dirs {
        let path = d.join("log");
        let data = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let (records, _) = store::parse_log(&data);
        // Both sorted by index: one merge pass.
        let mut i = 0;
        for p in records {
            let idx = p.entry.log_id.index;
            while i < acked.len() && acked[i].0 < idx {
                i += 1;
            }
            if i >= acked.len() {
                break;
            }
            if acked[i].0 != idx {
                continue;
            }
            let crcs = record_crcs(&p.entry);
            let mut j = i;
            while j < acked.len() && acked[j].0 == idx {
                if crcs.contains(&acked[j].1) {
                    count[j] += 1;
                }
                j += 1;
            }
        }
    }
    let mut hist = [0usize; 4];
    for &c in &count {
        hist[(c as usize).min(3)] += 1;
    }
    eprintln!(
        "verify: {} acknowledged writes; in 3 logs: {}, in 2: {}, in 1: {}, in 0: {}",
        acked.len(),
        hist[3],
        hist[2],
        hist[1],
        hist[0]
    );
    if hist[0] + hist[1] > 0 {
        return Err(format!(
            "{} acknowledged writes are in fewer than 2 logs",
            hist[0] + hist[1]
        ));
    }
    Ok(())
}
