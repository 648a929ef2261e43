//! raftrs-peer: one replica of a 3-process raft-rs cluster whose log is raft-engine, driven
//! with asynchronous ready as TiKV drives it; on node 1, closed-loop clients. See README.md.

mod net;
mod node;
mod procstat;
mod storage;

use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use hdrhistogram::Histogram;
use raft_engine::{Engine, ReadableSize};
use rand::{RngCore, SeedableRng};
use serde::Serialize;
use tokio::time::Instant;

use node::{Event, Node, Shared};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const RAFT_VERSION: &str = "0.7.0";
const RAFT_ENGINE_VERSION: &str = "0.4.2";

const USAGE: &str = "\
raftrs-peer: one replica of a 3-process raft-rs + raft-engine benchmark cluster

  raftrs-peer --id N --peers A1,A2,A3 --data DIR [--clients C --size B --warmup D
              --duration D --out FILE --sample-pids P2,P3 --acked-out FILE]
  raftrs-peer --verify-acked FILE --verify-dirs D1,D2,D3

  --id N             this node (1..=3); node 1 campaigns and runs the clients (default 1)
  --peers A,B,C      every node's address, in id order
  --data DIR         this node's data directory (raft-engine's files in DIR/raft-engine)
  --clients C        closed-loop clients on node 1 (default 0: just serve)
  --size B           record size in bytes, an entry's data (default 512)
  --warmup D         not measured: \"2s\", \"500ms\" or seconds (default 2s)
  --duration D       measured interval (default 10s)
  --out FILE         where to write the result JSON (also printed to stdout)
  --sample-pids P,Q  the other replicas' pids, for the OS accounting
  --acked-out FILE   node 1: \"INDEX KEY\" of every acknowledged append, warm-up included
  --verify-acked F   check mode, once the cluster has stopped: every append listed in F
                     must be at its index in a majority of the --verify-dirs logs
";

#[derive(Debug)]
struct Args {
    id: u64,
    peers: Vec<String>,
    data: Option<PathBuf>,
    clients: usize,
    size: usize,
    warmup: Duration,
    duration: Duration,
    out: Option<PathBuf>,
    sample_pids: Vec<u32>,
    acked_out: Option<PathBuf>,
    verify_acked: Option<PathBuf>,
    verify_dirs: Vec<PathBuf>,
}

impl Args {
    /// `--flag value` or `--flag=value`; every flag takes a value.
    fn parse(argv: impl Iterator<Item = String>) -> Result<Args, String> {
        let mut a = Args {
            id: 1,
            peers: Vec::new(),
            data: None,
            clients: 0,
            size: 512,
            warmup: Duration::from_secs(2),
            duration: Duration::from_secs(10),
            out: None,
            sample_pids: Vec::new(),
            acked_out: None,
            verify_acked: None,
            verify_dirs: Vec::new(),
        };
        fn num<T: std::str::FromStr>(flag: &str, v: &str) -> Result<T, String> {
            v.parse()
                .map_err(|_| format!("{flag}: not a number: {v:?}"))
        }
        fn list(v: &str) -> impl Iterator<Item = &str> {
            v.split(',').map(str::trim).filter(|x| !x.is_empty())
        }
        let mut argv = argv.skip(1);
        while let Some(arg) = argv.next() {
            if arg == "-h" || arg == "--help" {
                return Err(String::new());
            }
            let (flag, value) = match arg.split_once('=') {
                Some((f, v)) => (f.to_string(), v.to_string()),
                None => {
                    let v = argv.next().ok_or(format!("{arg}: needs a value"))?;
                    (arg, v)
                }
            };
            let v = value.as_str();
            match flag.as_str() {
                "--id" => a.id = num(&flag, v)?,
                "--peers" => a.peers = list(v).map(String::from).collect(),
                "--data" => a.data = Some(v.into()),
                "--clients" => a.clients = num(&flag, v)?,
                "--size" => a.size = num(&flag, v)?,
                "--warmup" => a.warmup = parse_dur(v)?,
                "--duration" => a.duration = parse_dur(v)?,
                "--out" => a.out = Some(v.into()),
                "--sample-pids" => {
                    a.sample_pids = list(v).map(|p| num(&flag, p)).collect::<Result<_, _>>()?
                }
                "--acked-out" => a.acked_out = Some(v.into()),
                "--verify-acked" => a.verify_acked = Some(v.into()),
                "--verify-dirs" => a.verify_dirs = list(v).map(PathBuf::from).collect(),
                _ => return Err(format!("unknown flag {flag}")),
            }
        }
        Ok(a)
    }
}

fn parse_dur(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = if let Some(n) = s.strip_suffix("ms") {
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
    match num.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(Duration::from_secs_f64(v * unit)),
        _ => Err(format!("bad duration {s:?}")),
    }
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
    /// Proposals refused (not leader, dropped); should be 0.
    errors: u64,
    /// Appends with no answer within 5 s, proposed again; should be 0.
    retries: u64,
    raft_version: &'static str,
    raft_engine_version: &'static str,
    // The shared result schema; null when unknown.
    path: &'static str,
    commit_mode: Option<&'static str>,
    replicas: u32,
    #[serde(flatten)]
    os: procstat::OsFields,
    fsyncs_per_sec: Option<f64>,
    follower_msgs_per_sec: Option<f64>,
}

fn engine_config(data: &Path) -> raft_engine::Config {
    raft_engine::Config {
        dir: data.join("raft-engine").to_string_lossy().into_owned(),
        // The payload is random bytes: LZ4 on write batches over 8 KiB (the default) would
        // spend CPU for nothing.
        batch_compression_threshold: ReadableSize(0),
        ..Default::default()
    }
}

fn main() {
    let args = match Args::parse(std::env::args()) {
        Ok(a) => a,
        Err(e) if e.is_empty() => {
            print!("{USAGE}");
            return;
        }
        Err(e) => {
            eprint!("raftrs-peer: {e}\n\n{USAGE}");
            std::process::exit(2);
        }
    };
    if let Some(acked) = &args.verify_acked {
        std::process::exit(verify(acked, &args.verify_dirs));
    }
    std::process::exit(run(args));
}

fn run(args: Args) -> i32 {
    let n = args.peers.len() as u64;
    if n == 0 || args.id < 1 || args.id > n {
        eprintln!("--id must be in 1..={n} (--peers lists every node)");
        return 2;
    }
    let Some(data) = args.data.clone() else {
        eprintln!("--data is required");
        return 2;
    };
    std::fs::create_dir_all(&data).expect("create --data");
    let engine = Arc::new(Engine::open(engine_config(&data)).expect("open raft-engine"));

    let my_addr = &args.peers[(args.id - 1) as usize];
    let listener = TcpListener::bind(my_addr).unwrap_or_else(|e| panic!("bind {my_addr}: {e}"));
    let (events_tx, events_rx) = crossbeam_channel::unbounded();
    let transport = net::Transport::start(args.id, &args.peers, events_tx.clone());
    net::serve(listener, events_tx.clone(), (args.id != 1).then_some(1));
    let shared = Arc::new(Shared::default());
    let node = Node::new(
        args.id,
        n,
        engine,
        transport.clone(),
        events_tx.clone(),
        shared.clone(),
    )
    .expect("raft node");
    let raft_thread = std::thread::Builder::new()
        .name("raft".into())
        .spawn(move || node.run(events_rx))
        .expect("spawn raft thread");

    if args.id != 1 || args.clients == 0 {
        // Serve until killed (or, on a follower, until node 1's connection closes).
        let _ = raft_thread.join();
        return 0;
    }

    // Node 1: wait until it leads with every peer connected.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !(shared.leader.load(Ordering::Acquire) == 1 && transport.all_connected()) {
        if std::time::Instant::now() > deadline {
            eprintln!("node 1 did not become leader within 60 s");
            return 1;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    eprintln!(
        "node 1 leads; {} clients, {}-byte records",
        args.clients, args.size
    );

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("tokio runtime");
    let (out, acked) = rt.block_on(load(&args, events_tx, &data));
    let json = serde_json::to_string(&out).unwrap();
    if let Some(p) = &args.acked_out {
        let mut s = String::with_capacity(acked.len() * 16);
        for (idx, key) in &acked {
            s.push_str(&format!("{idx} {key}\n"));
        }
        std::fs::write(p, s).expect("write --acked-out");
    }
    if let Some(p) = &args.out {
        let tmp = p.with_extension("json.tmp");
        std::fs::write(&tmp, format!("{json}\n")).expect("write --out");
        std::fs::rename(&tmp, p).expect("rename --out");
    }
    println!("{json}");
    let _ = std::io::stdout().flush();
    0
}

struct ClientResult {
    hist: Histogram<u64>,
    errors: u64,
    retries: u64,
    acked: Vec<(u64, u64)>,
}

async fn load(
    args: &Args,
    events: crossbeam_channel::Sender<Event>,
    data: &Path,
) -> (Output, Vec<(u64, u64)>) {
    let start = Instant::now();
    let measure_start = start + args.warmup;
    let measure_end = measure_start + args.duration;
    let mut pids = vec![std::process::id()];
    pids.extend(args.sample_pids.iter().copied());
    let acct = procstat::Accounting::new(pids, data);
    let sampling = tokio::spawn(async move {
        tokio::time::sleep_until(measure_start).await;
        let a = acct.snapshot();
        tokio::time::sleep_until(measure_end).await;
        let b = acct.snapshot();
        (acct, a, b)
    });
    let record_acked = args.acked_out.is_some();
    let mut tasks = Vec::with_capacity(args.clients);
    for c in 0..args.clients as u64 {
        let events = events.clone();
        let size = args.size;
        tasks.push(tokio::spawn(async move {
            let mut r = ClientResult {
                hist: Histogram::new_with_bounds(1, 60_000_000, 3).unwrap(),
                errors: 0,
                retries: 0,
                acked: Vec::new(),
            };
            let mut rng = rand::rngs::SmallRng::from_entropy();
            let mut seq = 0u64;
            loop {
                let mut data = vec![0u8; size];
                rng.fill_bytes(&mut data);
                let key = (c << 40) | seq;
                seq += 1;
                let t0 = Instant::now();
                if t0 >= measure_end {
                    break;
                }
                let (tx, rx) = tokio::sync::oneshot::channel();
                if events
                    .send(Event::Propose {
                        key,
                        data,
                        reply: tx,
                    })
                    .is_err()
                {
                    r.errors += 1;
                    break;
                }
                match tokio::time::timeout(Duration::from_secs(5), rx).await {
                    Ok(Ok(Ok(index))) => {
                        let t1 = Instant::now();
                        if t0 >= measure_start && t1 <= measure_end {
                            r.hist.saturating_record((t1 - t0).as_micros() as u64);
                        }
                        if record_acked {
                            r.acked.push((index, key));
                        }
                    }
                    Ok(Ok(Err(e))) => {
                        r.errors += 1;
                        if r.errors <= 3 {
                            eprintln!("client {c}: {e}");
                        }
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    Ok(Err(_)) => {
                        r.errors += 1;
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    Err(_) => {
                        r.retries += 1;
                        if r.retries <= 3 {
                            eprintln!("client {c}: no answer within 5 s; proposing again");
                        }
                    }
                }
            }
            r
        }));
    }
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
    let (mut errors, mut retries) = (0, 0);
    let mut acked = Vec::new();
    for t in tasks {
        let r = t.await.expect("client task");
        hist.add(&r.hist).unwrap();
        errors += r.errors;
        retries += r.retries;
        acked.extend(r.acked);
    }
    let appends = hist.len();
    let secs = args.duration.as_secs_f64();
    let os = match sampling.await {
        Ok((acct, a, b)) => acct.fields(&a, &b, appends, args.size),
        Err(e) => {
            eprintln!("warning: OS accounting: sampler task: {e}");
            procstat::OsFields::default()
        }
    };
    let out = Output {
        system: "raft-rs",
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
        retries,
        raft_version: RAFT_VERSION,
        raft_engine_version: RAFT_ENGINE_VERSION,
        path: "embedded",
        commit_mode: None,
        replicas: 3,
        os,
        fsyncs_per_sec: None,
        follower_msgs_per_sec: None,
    };
    (out, acked)
}

/// `--verify-acked FILE --verify-dirs D1,D2,D3`: opens each node's raft-engine (the cluster
/// must be stopped) and checks that every acknowledged append is at its index, with its key,
/// in a majority of the logs, and that the logs agree (same term and key) at every index
/// they share. Prints one JSON line; exit 0 if all holds.
fn verify(acked_path: &Path, dirs: &[PathBuf]) -> i32 {
    use raft::eraftpb::{Entry, HardState};
    use storage::{MsgExt, HARD_STATE_KEY, REGION};

    let text = std::fs::read_to_string(acked_path).expect("read --verify-acked");
    let acked: Vec<(u64, u64)> = text
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some((f.next()?.parse().ok()?, f.next()?.parse().ok()?))
        })
        .collect();
    let mut logs: Vec<Vec<Entry>> = Vec::new();
    let mut nodes = Vec::new();
    for d in dirs {
        let engine = Engine::open(engine_config(d)).expect("open raft-engine");
        let hs: HardState = engine
            .get_message(REGION, HARD_STATE_KEY)
            .expect("read hard state")
            .unwrap_or_default();
        let first = engine.first_index(REGION).unwrap_or(1);
        let last = engine.last_index(REGION).unwrap_or(0);
        let mut ents = Vec::new();
        if last >= first {
            engine
                .fetch_entries_to::<MsgExt>(REGION, first, last + 1, None, &mut ents)
                .expect("read entries");
        }
        assert_eq!(first, 1, "{}: log starts at {first}", d.display());
        nodes.push(serde_json::json!({
            "dir": d.display().to_string(), "last_index": last, "term": hs.term,
            "commit": hs.commit,
        }));
        logs.push(ents);
    }
    let key_at = |log: &Vec<Entry>, idx: u64| -> Option<(u64, u64)> {
        let e = log.get(idx.checked_sub(1)? as usize)?;
        let key = if e.context.len() == 8 {
            u64::from_be_bytes(e.context[..].try_into().unwrap())
        } else {
            u64::MAX
        };
        Some((e.term, key))
    };
    let majority = dirs.len() / 2 + 1;
    let mut missing = 0u64;
    for &(idx, key) in &acked {
        let have = logs
            .iter()
            .filter(|l| key_at(l, idx).map(|(_, k)| k) == Some(key))
            .count();
        if have < majority {
            missing += 1;
            if missing <= 5 {
                eprintln!("acknowledged append index {idx} key {key:#x} is in {have} logs");
            }
        }
    }
    let shared = logs.iter().map(|l| l.len()).min().unwrap_or(0) as u64;
    let mut disagree = 0u64;
    for idx in 1..=shared {
        let first = key_at(&logs[0], idx);
        if logs.iter().any(|l| key_at(l, idx) != first) {
            disagree += 1;
        }
    }
    let max_acked = acked.iter().map(|a| a.0).max().unwrap_or(0);
    let ok = missing == 0 && disagree == 0 && !acked.is_empty();
    println!(
        "{}",
        serde_json::json!({
            "ok": ok, "acked": acked.len(), "max_acked_index": max_acked,
            "acked_missing_from_majority": missing, "indexes_checked_across_all": shared,
            "indexes_disagreeing": disagree, "nodes": nodes,
        })
    );
    if ok {
        0
    } else {
        1
    }
}
