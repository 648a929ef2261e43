//! openraft-peer: one replica of a 3-process openraft cluster with a durable (fdatasync-ing)
//! log, plus (on node 1) closed-loop clients. See README.md.

mod net;
mod procstat;
mod store;

use std::collections::BTreeMap;
use std::io::Cursor;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use hdrhistogram::Histogram;
use openraft::{BasicNode, Config, Raft, SnapshotPolicy};
use rand::{RngCore, SeedableRng};
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::time::Instant;

pub type NodeId = u64;

/// The application data of one raft entry: one client record of `--size` opaque bytes, or
/// (with `--batch N`) up to N records from different clients.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Record(pub Vec<serde_bytes::ByteBuf>);

openraft::declare_raft_types!(
    pub TypeConfig:
        D = Record,
        R = (),
        NodeId = NodeId,
        Node = BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

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
    /// Optional application-level batching (not the default): if > 0, clients hand their
    /// records to a batcher task that puts up to this many records into one raft entry
    /// (one `client_write`). 0 = every record is its own `client_write`.
    #[arg(long, default_value_t = 0)]
    batch: usize,
    /// With --batch: how many batched `client_write`s may be in flight at once.
    #[arg(long, default_value_t = 4)]
    batch_inflight: usize,
    /// Pids of the other replicas, for OS accounting over the measured interval (node 1).
    #[arg(long, value_delimiter = ',')]
    sample_pids: Vec<u32>,
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
        max_payload_entries: 1024,
        snapshot_policy: SnapshotPolicy::Never,
        ..Default::default()
    };
    let config = Arc::new(config.validate().expect("config"));

    let log = store::LogStore::open(&args.data).expect("open log store");
    let sm = store::StateMachine::default();
    let network = net::Network::new(args.id);
    let raft = Raft::new(args.id, config, network, log, sm)
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
    eprintln!("node 1 is leader");

    if args.clients == 0 {
        std::future::pending::<()>().await;
        return 0;
    }

    let out = load(&raft, &args).await;
    let json = serde_json::to_string(&out).unwrap();
    if let Some(p) = &args.out {
        let tmp = p.with_extension("json.tmp");
        std::fs::write(&tmp, format!("{json}\n")).expect("write --out");
        std::fs::rename(&tmp, p).expect("rename --out");
    }
    println!("{json}");
    0
}

type Waiter = tokio::sync::oneshot::Sender<Result<(), String>>;

/// `--batch`: collects records from the clients and writes up to `max` of them per raft entry,
/// with at most `inflight` `client_write`s outstanding. While those are in flight, new records
/// queue up and go into the next entry.
async fn batcher(
    raft: Raft<TypeConfig>,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<(Vec<u8>, Waiter)>,
    max: usize,
    inflight: usize,
) {
    let sem = Arc::new(tokio::sync::Semaphore::new(inflight.max(1)));
    loop {
        let permit = sem.clone().acquire_owned().await.unwrap();
        let Some(first) = rx.recv().await else { return };
        let mut recs = vec![serde_bytes::ByteBuf::from(first.0)];
        let mut waiters = vec![first.1];
        while recs.len() < max {
            match rx.try_recv() {
                Ok((r, w)) => {
                    recs.push(serde_bytes::ByteBuf::from(r));
                    waiters.push(w);
                }
                Err(_) => break,
            }
        }
        let raft = raft.clone();
        tokio::spawn(async move {
            let res = raft
                .client_write(Record(recs))
                .await
                .map(|_| ())
                .map_err(|e| e.to_string());
            drop(permit);
            for w in waiters {
                let _ = w.send(res.clone());
            }
        });
    }
}

async fn load(raft: &Raft<TypeConfig>, args: &Args) -> Output {
    let batch_tx = if args.batch > 0 {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(batcher(raft.clone(), rx, args.batch, args.batch_inflight));
        Some(tx)
    } else {
        None
    };
    let start = Instant::now();
    let measure_start = start + args.warmup;
    let measure_end = measure_start + args.duration;
    // OS accounting: this process and the followers (--sample-pids), sampled at both ends
    // of the measured interval.
    let mut pids = vec![std::process::id()];
    pids.extend(args.sample_pids.iter().copied());
    let sampler = procstat::Sampler::new(pids, &args.data);
    let sampling = tokio::spawn(async move {
        tokio::time::sleep_until(measure_start).await;
        let a = sampler.sample();
        tokio::time::sleep_until(measure_end).await;
        let b = sampler.sample();
        (a, b)
    });
    let mut tasks = Vec::new();
    for _ in 0..args.clients {
        let raft = raft.clone();
        let size = args.size;
        let batch_tx = batch_tx.clone();
        tasks.push(tokio::spawn(async move {
            let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
            let mut rng = rand::rngs::StdRng::from_entropy();
            let mut errors = 0u64;
            loop {
                let t0 = Instant::now();
                if t0 >= measure_end {
                    break;
                }
                let mut buf = vec![0u8; size];
                rng.fill_bytes(&mut buf);
                let res = match &batch_tx {
                    None => raft
                        .client_write(Record(vec![serde_bytes::ByteBuf::from(buf)]))
                        .await
                        .map(|_| ())
                        .map_err(|e| e.to_string()),
                    Some(tx) => {
                        let (wtx, wrx) = tokio::sync::oneshot::channel();
                        let _ = tx.send((buf, wtx));
                        wrx.await.unwrap_or_else(|_| Err("batcher gone".into()))
                    }
                };
                match res {
                    Ok(()) => {
                        let t1 = Instant::now();
                        if t0 >= measure_start && t1 <= measure_end {
                            hist.saturating_record((t1 - t0).as_micros() as u64);
                        }
                    }
                    Err(e) => {
                        errors += 1;
                        if errors <= 3 {
                            eprintln!("client_write: {e}");
                        }
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
            (hist, errors)
        }));
    }
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
    let mut errors = 0;
    for t in tasks {
        let (h, e) = t.await.expect("client task");
        hist.add(&h).unwrap();
        errors += e;
    }
    let secs = args.duration.as_secs_f64();
    let appends = hist.len();
    let os = match sampling.await {
        Ok((a, b)) => procstat::OsFields::from(&a, &b, appends, args.size),
        Err(e) => {
            eprintln!("warning: OS accounting: sampler task: {e}");
            procstat::OsFields::default()
        }
    };
    Output {
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
        openraft_version: "0.9.25",
        path: "embedded",
        commit_mode: None,
        replicas: 3,
        os,
        fsyncs_per_sec: None,
        follower_msgs_per_sec: None,
    }
}
