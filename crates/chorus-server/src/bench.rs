//! `chorus bench`: closed-loop append benchmark.
//!
//! Two ways to run it:
//! - against a running cluster (`--endpoints`, gRPC clients in this process), or
//! - `--local DIR`: start a 3-replica cluster of **separate processes** on loopback, each
//!   with its own data directory, fsync on, node 1 given the highest election priority so
//!   it leads, and drive it with closed-loop clients **co-located with the leader**, as the
//!   PALF paper measured (section 8.1): `--path embedded` runs node 1 inside this process
//!   and the clients call its embedded API; `--path grpc` runs all three nodes as
//!   `chorus server` children and the clients use the gRPC service from this process.
//!
//! The group may be ordered or out of order; the records follow its mode (against a running
//! cluster the mode is read from the group's status; with `--local`, `--mode` chooses it):
//! opaque records of `--size` bytes for an ordered group; for a parallel group, writes of
//! `--size` rounded up to whole 4 KiB blocks at a uniformly random block of a
//! `--volume-blocks` volume (PolarFS's random-write workload, section 7); for a dependent
//! group, YCSB-like transactions that read one key and wrote one, drawn from `--keys` keys
//! with Zipf skew `--theta` (the DP-Raft paper's workload, section 5).
//!
//! Every client appends its next record only after the previous one committed. After the
//! warm-up, a fixed interval is measured: commit latency into an HDR histogram, and OS
//! accounting of all processes of the system under test (`chorus_workload::procstat`: disk
//! bytes written per replica, CPU time, the data disk's write requests and flushes) plus
//! the replicas' own counters from their metrics (fdatasyncs and meta saves, frames a
//! follower received). The result is one JSON line in the schema shared with the baseline
//! peers (docs/benchmarks/result-fields.md).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chorus_client::{pb, Client, ClientError};
use chorus_core::rng::Rng;
use chorus_runtime::{Env, LogHandle};
use chorus_workload::procstat::{usage, Sampler, Usage};
use chorus_workload::zipf::Zipf;
use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use serde_json::{json, Value};

use crate::config::{GroupSpec, ServerConfig};
use crate::dev::DevMode;
use crate::ooo::BLOCK;

/// Sectors in a chunk of the default geometry (the groups the bench creates).
const CHUNK_SECTORS: u64 = chorus_chunk::DEFAULT_CHUNK_BYTES / BLOCK;
use crate::{AnyResult, Endpoints, Output, EXIT_UNREACHABLE};

/// Where the benchmark clients run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ClientPath {
    /// In the leader's process, through the embedded API (`--local` only).
    Embedded,
    /// In this process, through the gRPC service: one unary `Append` per record.
    Grpc,
    /// In this process, through the gRPC service's `AppendStream`: the clients' records
    /// share a few streams, batched with a short linger (`chorus_client::stream`; ordered
    /// groups only).
    GrpcStream,
}

impl ClientPath {
    fn name(self) -> &'static str {
        match self {
            ClientPath::Embedded => "embedded",
            ClientPath::Grpc => "grpc",
            ClientPath::GrpcStream => "grpc-stream",
        }
    }
}

/// Flags of `chorus bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    ep: Endpoints,
    /// Concurrent closed-loop clients (each appends its next record after the previous
    /// committed).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    clients: u64,
    /// Record size in bytes.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..=(16 << 20)))]
    size: u64,
    /// Warm-up seconds (not measured).
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// Measured seconds.
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// Start a local 3-process cluster with its data under DIR (wiped first) and benchmark
    /// it instead of `--endpoints`.
    #[arg(long, value_name = "DIR")]
    local: Option<PathBuf>,
    /// With `--local`: clients in the leader's process (embedded API) or in this process
    /// over gRPC (default: embedded for an ordered group; out-of-order groups are served by
    /// `chorus server` only, so gRPC).
    #[arg(long, value_enum)]
    path: Option<ClientPath>,
    /// With `--local`: the group's mode. Against a running cluster the group's own mode is
    /// used (from its status), and a different `--mode` is refused.
    #[arg(long, value_enum)]
    mode: Option<DevMode>,
    /// Parallel groups: the volume's length in 4 KiB blocks, at most a default chunk's
    /// (10 GiB); each record writes `--size` rounded up to whole blocks at a uniformly
    /// random block of it.
    #[arg(long, default_value_t = 1 << 18, value_parser = clap::value_parser!(u64).range(1..=CHUNK_SECTORS))]
    volume_blocks: u64,
    /// Dependent groups: each record is a transaction that read one key and wrote one,
    /// drawn from this many keys (at most 100 million: the Zipf constants take a pass
    /// over every key). The demo key-value store holds every key it was sent in memory on
    /// every node: up to keys × size bytes each.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(2..=100_000_000))]
    keys: u64,
    /// Dependent groups: the keys' Zipf skew θ (0: uniform; below 1).
    #[arg(long, default_value_t = 0.99)]
    theta: f64,
    /// With `--local`: commit-point mode of the cluster (`piggyback`, `sync`, `async`).
    #[arg(long, default_value = "piggyback")]
    commit_mode: String,
    /// With `--local`: bytes of zeros each node's log keeps written past its end (the
    /// `[log] preallocate` setting; 0: none).
    #[arg(long, default_value_t = chorus_storage::log::DEFAULT_PREALLOCATE)]
    preallocate: u64,
    /// With `--local`: pipelined group commit on every node (the `[log] pipelined_sync`
    /// setting): a batch is written while the one before it syncs.
    #[arg(long)]
    pipelined_sync: bool,
    /// With `--local`: first port; node i uses API base+i, replication base+10+i, metrics
    /// base+20+i. 0 (the default) lets the OS choose free ports, and a start that loses a
    /// port to another process between choosing and binding is retried with fresh ones.
    #[arg(long, default_value_t = 0, value_parser = parse_base_port)]
    base_port: u16,
    /// gRPC connections the clients share (default: one per client up to 32; with
    /// `--path grpc-stream`, streams, default 2).
    #[arg(long)]
    connections: Option<usize>,
    /// Also write the result JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

fn parse_base_port(s: &str) -> Result<u16, String> {
    match s.parse::<u16>() {
        Ok(p) if p == 0 || (1024..=65000).contains(&p) => Ok(p),
        _ => Err(format!(
            "{s:?}: expected 0 (free ports chosen by the OS) or a port in 1024..=65000"
        )),
    }
}

/// The ports of a local cluster: `[api, replication, metrics, out-of-order replication]`
/// per node.
/// Each node's API, replication and metrics ports.
type Ports = Vec<[u16; 3]>;

/// Ports for `--local`: fixed from `--base-port`, or free ones the OS hands out (all nine
/// listeners are held at once so they are distinct, then released for the nodes to bind).
fn local_ports(base: u16) -> std::io::Result<Ports> {
    if base != 0 {
        return Ok((1..=NODES as u16)
            .map(|j| [base + j, base + 10 + j, base + 20 + j])
            .collect());
    }
    let held: Vec<std::net::TcpListener> = (0..NODES * 3)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<_, _>>()?;
    let ports: Vec<u16> = held
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<Result<_, _>>()?;
    Ok(ports.chunks(3).map(|c| [c[0], c[1], c[2]]).collect())
}

/// Where the clients run: `--path`, or embedded for an ordered group and gRPC for an
/// out-of-order one (`run` refuses embedded with an out-of-order mode).
fn client_path(a: &BenchArgs, mode: DevMode) -> ClientPath {
    a.path.unwrap_or(if mode == DevMode::Ordered {
        ClientPath::Embedded
    } else {
        ClientPath::Grpc
    })
}

/// Start attempts with OS-chosen ports: another process may take a port between the
/// choice and the node's bind; that attempt fails with "Address already in use".
const PORT_ATTEMPTS: usize = 4;

/// Runs `chorus bench`.
pub fn run(a: BenchArgs) -> AnyResult<ExitCode> {
    if !((0.0..=3600.0).contains(&a.warmup) && a.duration > 0.0 && a.duration <= 3600.0) {
        return Err(format!(
            "--warmup {} / --duration {}: expected 0 ≤ warm-up ≤ 3600 and 0 < duration ≤ 3600 seconds",
            a.warmup, a.duration
        )
        .into());
    }
    if !(0.0..1.0).contains(&a.theta) {
        return Err(format!(
            "--theta {}: expected 0 (uniform) ≤ θ < 1 (Zipf skew)",
            a.theta
        )
        .into());
    }
    if a.local.is_some()
        && a.mode.is_some_and(|m| m != DevMode::Ordered)
        && a.path == Some(ClientPath::Embedded)
    {
        return Err(format!(
            "--path embedded with --mode {}: out-of-order groups are served by `chorus server`, \
             not the embedded API; use --path grpc",
            a.mode.map_or("?", DevMode::name)
        )
        .into());
    }
    if !["piggyback", "sync", "async"].contains(&a.commit_mode.as_str()) {
        return Err(format!(
            "--commit-mode {:?}: expected piggyback, sync or async",
            a.commit_mode
        )
        .into());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let v = match &a.local {
        Some(dir) => {
            let w = Workload::new(a.mode.unwrap_or(DevMode::Ordered), &a)?;
            let mut attempt = 1;
            loop {
                let ports = local_ports(a.base_port)?;
                let r = match LocalCluster::start(&a, w.mode(), dir, &ports) {
                    Ok(mut cluster) => {
                        let r = rt.block_on(cluster.bench(&a, &w));
                        cluster.stop();
                        r
                    }
                    Err(e) => Err(format!("start the local cluster: {e}")),
                };
                match r {
                    Ok(v) => break v,
                    Err(e)
                        if a.base_port == 0
                            && attempt < PORT_ATTEMPTS
                            && e.contains("Address already in use") =>
                    {
                        eprintln!(
                            "chorus bench: attempt {attempt} lost a port ({}); retrying with fresh ports",
                            e.lines().last().unwrap_or("")
                        );
                        attempt += 1;
                    }
                    Err(e) => {
                        eprintln!("chorus bench: {e}; node logs are in {}", dir.display());
                        return Ok(ExitCode::from(EXIT_UNREACHABLE));
                    }
                }
            }
        }
        // Against a remote cluster only the gRPC path exists; `--path` is for `--local`.
        None => match rt.block_on(remote(&a)) {
            Ok(v) => v,
            Err((code, e)) => {
                eprintln!("chorus bench: {e}");
                return Ok(ExitCode::from(code));
            }
        },
    };
    if let Some(p) = &a.json {
        std::fs::write(p, format!("{v}\n")).map_err(|e| format!("write {}: {e}", p.display()))?;
    }
    match a.ep.output {
        Output::Json => println!("{v}"),
        Output::Table => print_table(&v),
    }
    Ok(ExitCode::SUCCESS)
}

fn print_table(v: &Value) {
    let f = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    println!(
        "{} ({} group, {}): {} clients, {} B records: {:.0} appends/s, {:.2} MB/s, p50 {} µs, p99 {} µs, p99.9 {} µs, {} errors",
        v["system"].as_str().unwrap_or("?"),
        v["group_mode"].as_str().unwrap_or("?"),
        v["path"].as_str().unwrap_or("?"),
        v["clients"],
        v["size"],
        f("appends_per_sec"),
        f("mb_per_sec"),
        v["p50_us"],
        v["p99_us"],
        v["p999_us"],
        v["errors"],
    );
    if !v["write_amp"].is_null() {
        println!(
            "  write amplification {:.3} per replica (device: {:.3}), {:.0} fsyncs/s, {:.0} device flushes/s, {:.1} CPU s per million appends, follower {:.0} msgs/s",
            f("write_amp"),
            f("dev_write_amp"),
            f("fsyncs_per_sec"),
            f("dev_flushes_per_sec"),
            f("cpu_sec_per_million"),
            f("follower_msgs_per_sec"),
        );
    }
}

/// What a finished closed-loop run measured.
struct Measured {
    appends: u64,
    errors: u64,
    seconds: f64,
    hist: Histogram<u64>,
}

/// What the clients append, from the group's mode (see the module documentation).
#[derive(Clone, Debug)]
enum Workload {
    /// Opaque records.
    Ordered,
    /// Each record writes `blocks` consecutive blocks at a uniformly random start in a
    /// volume of `span` blocks.
    Parallel { span: u64, blocks: u64 },
    /// Each record read one key and wrote one, uniformly from `keys` or Zipf-skewed.
    Dependent { keys: u64, zipf: Option<Arc<Zipf>> },
}

impl Workload {
    fn new(mode: DevMode, a: &BenchArgs) -> Result<Self, String> {
        Ok(match mode {
            DevMode::Ordered => Workload::Ordered,
            DevMode::Parallel => {
                let blocks = a.size.div_ceil(BLOCK);
                if blocks > a.volume_blocks {
                    return Err(format!(
                        "--size {} is {blocks} blocks of {BLOCK} bytes, more than the \
                         --volume-blocks {} a record may write into",
                        a.size, a.volume_blocks
                    ));
                }
                Workload::Parallel {
                    span: a.volume_blocks,
                    blocks,
                }
            }
            DevMode::Dependent => Workload::Dependent {
                keys: a.keys,
                zipf: if a.theta > 0.0 {
                    Some(Arc::new(
                        Zipf::new(a.keys, a.theta).map_err(|e| format!("--theta: {e}"))?,
                    ))
                } else {
                    None
                },
            },
        })
    }

    fn mode(&self) -> DevMode {
        match self {
            Workload::Ordered => DevMode::Ordered,
            Workload::Parallel { .. } => DevMode::Parallel,
            Workload::Dependent { .. } => DevMode::Dependent,
        }
    }

    /// The bytes of each record: `--size`, or whole blocks for a parallel group.
    fn record_size(&self, size: u64) -> u64 {
        match self {
            Workload::Parallel { blocks, .. } => blocks * BLOCK,
            _ => size,
        }
    }

    /// An out-of-order record of `data` declaring what this workload's next record
    /// writes (and reads).
    fn record(&self, data: &[u8], rng: &mut Rng) -> pb::OutOfOrderRecord {
        let mut r = pb::OutOfOrderRecord {
            data: data.to_vec(),
            ..Default::default()
        };
        match self {
            Workload::Ordered => {}
            Workload::Parallel { span, blocks } => {
                let start = rng.below(span - blocks + 1);
                r.blocks = vec![pb::BlockRange {
                    start,
                    count: *blocks,
                }];
            }
            Workload::Dependent { keys, zipf } => {
                let mut key = || match zipf {
                    Some(z) => z.sample(rng),
                    None => rng.below(*keys),
                };
                r.read_set = vec![key()];
                r.write_set = vec![key()];
            }
        }
        r
    }
}

/// One client's way to append.
#[derive(Clone)]
enum Conn {
    Embedded(LogHandle),
    Grpc(Client, u64),
    /// An ordered group through a shared `AppendStream`.
    GrpcStream(chorus_client::stream::AppendStream),
    /// An out-of-order group over gRPC.
    GrpcOutOfOrder(Client, u64),
}

impl Conn {
    /// Appends one record and waits for its result: Ok(true) committed, Ok(false) failed.
    /// An out-of-order record declares what `w` draws with `rng`.
    async fn append(&mut self, rec: &[u8], w: &Workload, rng: &mut Rng) -> Result<bool, String> {
        match self {
            Conn::Embedded(h) => {
                let a = h.append(rec, 0).map_err(|e| e.to_string())?;
                let r = a.result.await.map_err(|e| e.to_string())?;
                Ok(r.outcome == chorus_core::replica::Outcome::Committed)
            }
            Conn::Grpc(c, group) => {
                let r = c
                    .append(*group, vec![rec.to_vec()], 0)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(r.first()
                    .is_some_and(|r| r.outcome == pb::Outcome::Committed as i32))
            }
            Conn::GrpcStream(s) => {
                let r = s.append(rec.to_vec()).await.map_err(|e| e.to_string())?;
                Ok(r.unknown.is_empty() && r.outcome == pb::Outcome::Committed as i32)
            }
            Conn::GrpcOutOfOrder(c, group) => {
                let r = c
                    .append_out_of_order(*group, vec![w.record(rec, rng)])
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(r.first()
                    .is_some_and(|r| r.outcome == pb::Outcome::Committed as i32))
            }
        }
    }
}

/// Hooks called at the start and at the end of the measured interval.
type Hook<'a> = &'a mut dyn FnMut();

/// Runs `clients` closed-loop clients over `conns` (client i uses `conns[i % len]`):
/// warm-up, then the measured interval, bracketed by `at_start` and `at_end`.
async fn closed_loop(
    a: &BenchArgs,
    w: &Workload,
    conns: Vec<Conn>,
    quiet: bool,
    at_start: Hook<'_>,
    at_end: Hook<'_>,
) -> Measured {
    let stop = Arc::new(AtomicBool::new(false));
    let measuring = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    // A few shared histograms rather than one per client: a 3-digit histogram of this
    // range is ~190 KB, and a thousand of them made recording a cache miss that showed up
    // at 5% of the leader's CPU in `perf` — harness cost charged to the system measured.
    let hist: Arc<Vec<Mutex<Histogram<u64>>>> =
        Arc::new((0..HIST_SHARDS).map(|_| Mutex::new(new_hist())).collect());
    let mut tasks = Vec::new();
    for i in 0..a.clients {
        let mut c = conns[i as usize % conns.len()].clone();
        let (stop, measuring, count, errors, hist) = (
            stop.clone(),
            measuring.clone(),
            count.clone(),
            errors.clone(),
            hist.clone(),
        );
        let size = w.record_size(a.size) as usize;
        let w = w.clone();
        tasks.push(tokio::spawn(async move {
            let shard = &hist[i as usize % HIST_SHARDS];
            let mut rec = vec![0u8; size];
            // Each client its own stream of blocks or keys, the same on every run.
            let mut rng = Rng::new(0x6368_6f72_7573 ^ i);
            let mut seq = 0u64;
            while !stop.load(Ordering::Relaxed) {
                seq += 1;
                // A distinct record per append, so nothing downstream can deduplicate.
                let tag = (i << 40) | seq;
                let n = rec.len().min(8);
                rec[..n].copy_from_slice(&tag.to_le_bytes()[..n]);
                let t0 = Instant::now();
                let started_measuring = measuring.load(Ordering::Relaxed);
                match c.append(&rec, &w, &mut rng).await {
                    Ok(true) => {
                        // Only appends that started and ended inside the interval count.
                        if started_measuring && measuring.load(Ordering::Relaxed) {
                            let us = t0.elapsed().as_micros() as u64;
                            if let Ok(mut h) = shard.lock() {
                                let _ = h.record(us);
                            }
                            count.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    _ => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
        }));
    }
    let pb = indicatif::ProgressBar::new((a.warmup + a.duration).ceil() as u64);
    pb.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {msg} [{bar:30}] {pos}/{len}s")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    if quiet {
        pb.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    pb.set_message("warming up");
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs_f64(a.warmup) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        pb.set_position(t0.elapsed().as_secs());
    }
    at_start();
    measuring.store(true, Ordering::Relaxed);
    pb.set_message("measuring");
    let m0 = Instant::now();
    while m0.elapsed() < Duration::from_secs_f64(a.duration) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        pb.set_position(t0.elapsed().as_secs());
    }
    measuring.store(false, Ordering::Relaxed);
    let seconds = m0.elapsed().as_secs_f64();
    at_end();
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    pb.finish_and_clear();
    let mut all = new_hist();
    for h in hist.iter() {
        if let Ok(h) = h.lock() {
            let _ = all.add(&*h);
        }
    }
    let hist = all;
    Measured {
        appends: count.load(Ordering::Relaxed),
        errors: errors.load(Ordering::Relaxed),
        seconds,
        hist,
    }
}

/// Latency histograms shared by the clients of one run (client i records into i mod this).
const HIST_SHARDS: usize = 8;

fn new_hist() -> Histogram<u64> {
    Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds")
}

/// The schema fields every run has.
fn base_result(
    a: &BenchArgs,
    w: &Workload,
    m: &Measured,
    path: &str,
    commit_mode: Option<&str>,
) -> Value {
    let rate = m.appends as f64 / m.seconds;
    let size = w.record_size(a.size);
    let mut v = json!({
        "system": "chorus",
        "path": path,
        "commit_mode": commit_mode,
        "group_mode": w.mode().name(),
        "clients": a.clients,
        "size": size,
        "replicas": 3,
        "appends": m.appends,
        "seconds": m.seconds,
        "appends_per_sec": rate,
        "mb_per_sec": rate * size as f64 / 1e6,
        "p50_us": m.hist.value_at_quantile(0.5),
        "p99_us": m.hist.value_at_quantile(0.99),
        "p999_us": m.hist.value_at_quantile(0.999),
        "max_us": m.hist.max(),
        "errors": m.errors,
        "proc_write_bytes": null,
        "write_amp": null,
        "cpu_seconds": null,
        "cpu_sec_per_million": null,
        "dev_write_bytes": null,
        "dev_write_amp": null,
        "dev_write_reqs_per_sec": null,
        "dev_flushes_per_sec": null,
        "dev_write_mb_per_sec": null,
        "fsyncs_per_sec": null,
        "follower_msgs_per_sec": null,
    });
    match w {
        Workload::Ordered => {}
        Workload::Parallel { span, .. } => v["volume_blocks"] = json!(span),
        Workload::Dependent { keys, .. } => {
            v["keys"] = json!(keys);
            v["theta"] = json!(a.theta);
        }
    }
    v
}

/// Fills the OS accounting fields from a [`Usage`] over the measured interval.
fn add_usage(v: &mut Value, u: &Usage, appends: u64, size: u64) {
    let payload = (appends * size) as f64;
    let mean_written =
        u.proc_write_bytes.iter().sum::<u64>() as f64 / u.proc_write_bytes.len().max(1) as f64;
    v["proc_write_bytes"] = json!(u.proc_write_bytes);
    v["write_amp"] = if appends > 0 {
        json!(mean_written / payload)
    } else {
        Value::Null
    };
    v["cpu_seconds"] = json!(u.cpu_seconds);
    v["cpu_sec_per_million"] = if appends > 0 {
        json!(u.cpu_seconds / appends as f64 * 1e6)
    } else {
        Value::Null
    };
    v["dev_write_bytes"] = json!(u.dev_write_bytes);
    // What the device wrote per payload byte, per replica (all replicas share the disk):
    // `write_amp` reads the processes' `write_bytes`, which counts a buffered write into a
    // large clean page-cache folio as the whole folio (docs/benchmarks/storage.md).
    let replicas = u.proc_write_bytes.len().max(1) as f64;
    v["dev_write_amp"] = if appends > 0 {
        json!(u.dev_write_bytes as f64 / replicas / payload)
    } else {
        Value::Null
    };
    v["dev_write_reqs_per_sec"] = json!(u.dev_write_reqs as f64 / u.seconds);
    v["dev_flushes_per_sec"] = json!(u.dev_flushes.map(|f| f as f64 / u.seconds));
    v["dev_write_mb_per_sec"] = json!(u.dev_write_bytes as f64 / u.seconds / 1e6);
}

/// Against a running cluster: gRPC clients, no OS accounting (the processes may be
/// anywhere). Fails with the exit code and the message.
async fn remote(a: &BenchArgs) -> Result<Value, (u8, String)> {
    let usage = |e: String| (crate::EXIT_USAGE, e);
    let mut c = Client::new(a.ep.endpoints.clone());
    let found = group_mode(&mut c, a.ep.group).await?;
    // `Status` names the mode as `--mode` spells it.
    let mode = DevMode::from_str(&found, false).map_err(|_| {
        usage(format!(
            "group {} is in mode {found:?}, which this benchmark does not know",
            a.ep.group
        ))
    })?;
    if let Some(m) = a.mode.filter(|&m| m != mode) {
        return Err(usage(format!(
            "--mode {}: group {} is in {} mode",
            m.name(),
            a.ep.group,
            mode.name()
        )));
    }
    let w = Workload::new(mode, a).map_err(usage)?;
    let conns = grpc_conns(a, &w, a.ep.endpoints.clone(), a.ep.group)
        .await
        .map_err(|e| (crate::remote::exit_code(&e), e.to_string()))?;
    let m = closed_loop(
        a,
        &w,
        conns,
        a.ep.output == Output::Json,
        &mut || {},
        &mut || {},
    )
    .await;
    let path = a
        .path
        .filter(|p| *p == ClientPath::GrpcStream)
        .unwrap_or(ClientPath::Grpc);
    Ok(base_result(a, &w, &m, path.name(), None))
}

/// The mode of `group` (`ordered`, `parallel`, `dependent`) from the first endpoint whose
/// status lists it; failing, every endpoint's answer, and "unreachable" as the exit code
/// only if no endpoint answered at all.
async fn group_mode(c: &mut Client, group: u64) -> Result<String, (u8, String)> {
    let mut errors = Vec::new();
    let mut code = EXIT_UNREACHABLE;
    for (ep, r) in c.status_all(group).await {
        match r {
            Ok(s) => match s.groups.iter().find(|g| g.group == group) {
                Some(g) => return Ok(g.mode.clone()),
                None => {
                    code = crate::EXIT_REFUSED;
                    errors.push(format!("{ep}: no group {group}"));
                }
            },
            Err(e) => {
                let c = crate::remote::exit_code(&e);
                if c != EXIT_UNREACHABLE {
                    code = c;
                }
                errors.push(e.to_string());
            }
        }
    }
    Err((
        code,
        format!(
            "the mode of group {group}: no endpoint reported it ({})",
            errors.join("; ")
        ),
    ))
}

/// Opens the shared gRPC connections; one probe append on each finds the leader and
/// connects it before the clock starts.
async fn grpc_conns(
    a: &BenchArgs,
    w: &Workload,
    endpoints: Vec<String>,
    group: u64,
) -> Result<Vec<Conn>, ClientError> {
    let n = a
        .connections
        .unwrap_or((a.clients as usize).min(32))
        .clamp(1, a.clients as usize);
    let mut conns = Vec::with_capacity(n);
    let probe = vec![0u8; w.record_size(a.size) as usize];
    let mut rng = Rng::new(0x0070_726f_6265);
    if a.path == Some(ClientPath::GrpcStream) {
        if !matches!(w, Workload::Ordered) {
            return Err(ClientError::BadEndpoint {
                endpoint: endpoints.join(","),
                detail: "--path grpc-stream is for ordered groups".into(),
            });
        }
        // Few streams: the fewer, the larger their batches. One probe each opens it at
        // the leader before the clock starts.
        let streams = a.connections.unwrap_or(2).clamp(1, a.clients as usize);
        for _ in 0..streams {
            let s = chorus_client::stream::AppendStream::new(
                Client::new(endpoints.clone()),
                group,
                Default::default(),
            );
            s.append(probe.clone()).await?;
            conns.push(Conn::GrpcStream(s));
        }
        return Ok(conns);
    }
    for _ in 0..n {
        let mut c = Client::new(endpoints.clone());
        if let Workload::Ordered = w {
            c.append(group, vec![probe.clone()], 0).await?;
            conns.push(Conn::Grpc(c, group));
        } else {
            c.append_out_of_order(group, vec![w.record(&probe, &mut rng)])
                .await?;
            conns.push(Conn::GrpcOutOfOrder(c, group));
        }
    }
    Ok(conns)
}

/// A local 3-process cluster for `--local`.
struct LocalCluster {
    dir: PathBuf,
    configs: Vec<ServerConfig>,
    /// Children by node id (node 1 is absent on the embedded path: it is this process).
    children: Vec<(u64, Child)>,
    /// Node 1 when it runs in this process.
    env: Option<Env>,
}

const NODES: u64 = 3;

fn node_config(a: &BenchArgs, mode: DevMode, dir: &Path, i: u64, ports: &Ports) -> ServerConfig {
    let p = |kind: usize, j: u64| format!("127.0.0.1:{}", ports[j as usize - 1][kind]);
    let mut c = ServerConfig {
        node: i,
        data_dir: dir.join(format!("n{i}")),
        listen: p(1, i),
        api_listen: p(0, i),
        metrics_listen: p(2, i),
        peers: (1..=NODES)
            .filter(|j| *j != i)
            .map(|j| (j.to_string(), p(1, j)))
            .collect(),
        groups: vec![{
            let mut g = GroupSpec::ordered(1, (1..=NODES).collect(), vec![]);
            if mode != DevMode::Ordered {
                g.mode = mode.name().into();
            }
            g
        }],
        log_filter: "warn".into(),
        ..ServerConfig::default()
    };
    c.replica.commit_mode = a.commit_mode.clone();
    c.log.preallocate = a.preallocate;
    c.log.pipelined_sync = a.pipelined_sync;
    // Node 1 leads: the clients are co-located with it (PALF section 8.1).
    if i == 1 {
        c.replica.priority = 100;
    }
    c
}

impl LocalCluster {
    fn start(a: &BenchArgs, mode: DevMode, dir: &Path, ports: &Ports) -> AnyResult<Self> {
        if dir.exists() {
            std::fs::remove_dir_all(dir).map_err(|e| format!("wipe {}: {e}", dir.display()))?;
        }
        std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        let dir = std::fs::canonicalize(dir)?;
        let exe = std::env::current_exe()?;
        let configs: Vec<ServerConfig> = (1..=NODES)
            .map(|i| node_config(a, mode, &dir, i, ports))
            .collect();
        let mut me = LocalCluster {
            dir: dir.clone(),
            configs,
            children: Vec::new(),
            env: None,
        };
        for cfg in me.configs.clone() {
            let i = cfg.node;
            if i == 1 && client_path(a, mode) == ClientPath::Embedded {
                let (env_cfg, _, _) = cfg.to_env_config()?;
                let env = Env::open(env_cfg)?;
                env.create_group(1, &[1, 2, 3], &[])?;
                me.env = Some(env);
                continue;
            }
            let cfg_path = dir.join(format!("n{i}.toml"));
            std::fs::write(&cfg_path, toml::to_string(&cfg)?)?;
            let log = std::fs::File::create(dir.join(format!("n{i}.log")))?;
            let child = Command::new(&exe)
                .arg("server")
                .arg("--config")
                .arg(&cfg_path)
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .map_err(|e| format!("start node {i}: {e}"))?;
            me.children.push((i, child));
        }
        Ok(me)
    }

    fn pid(&self, node: u64) -> u32 {
        self.children
            .iter()
            .find(|(i, _)| *i == node)
            .map_or(std::process::id(), |(_, c)| c.id())
    }

    fn check_children(&mut self) -> Result<(), String> {
        for (i, c) in self.children.iter_mut() {
            if let Ok(Some(st)) = c.try_wait() {
                let log = self.dir.join(format!("n{i}.log"));
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(10).collect();
                return Err(format!(
                    "node {i} exited ({st}); last lines of {}:\n{}",
                    log.display(),
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                ));
            }
        }
        Ok(())
    }

    /// Waits until the leader serves and has committed an append; returns the clients'
    /// connections and the leader's node id. An ordered group waits for node 1 (it has the
    /// highest priority); out-of-order groups elect without priorities, so whichever node
    /// leads is used (the clients are in this process on that path either way).
    async fn wait_leader(
        &mut self,
        a: &BenchArgs,
        w: &Workload,
    ) -> Result<(Vec<Conn>, u64), String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let candidates: Vec<&ServerConfig> = match w {
            Workload::Ordered => vec![&self.configs[0]],
            _ => self.configs.iter().collect(),
        };
        let eps: Vec<String> = candidates
            .iter()
            .map(|c| format!("http://{}", c.api_listen))
            .collect();
        // Why the last leader found could not be used (it lost the leadership).
        let mut moved: Option<String> = None;
        loop {
            self.check_children()?;
            if Instant::now() > deadline {
                return Err(match (w, moved) {
                    (Workload::Ordered, _) => "node 1 did not become leader within 30 s".into(),
                    (_, None) => "no node led and served group 1 within 30 s".into(),
                    (_, Some(e)) => {
                        format!("no node led and served group 1 within 30 s (last: {e})")
                    }
                });
            }
            match &self.env {
                Some(env) => {
                    let h = env.group(1).map_err(|e| e.to_string())?;
                    if h.role().role == chorus_core::replica::Role::Leader {
                        let mut c = Conn::Embedded(h.clone());
                        let probe = vec![0u8; a.size as usize];
                        if c.append(&probe, w, &mut Rng::new(1)).await == Ok(true) {
                            return Ok((vec![c], 1));
                        }
                    }
                }
                None => {
                    let mut c = Client::new(eps.clone());
                    // An out-of-order leader serves once its merge is done.
                    let leader = c.status_all(1).await.into_iter().find_map(|(ep, r)| {
                        let s = r.ok()?;
                        s.groups
                            .iter()
                            .any(|g| g.role == "leader" && (g.mode == "ordered" || g.serving))
                            .then_some((ep, s.node))
                    });
                    if let Some((ep, node)) = leader {
                        // Only the leader's endpoint: the clients talk to it. Leadership
                        // may move before their probes commit (a loaded machine can miss
                        // a heartbeat); then the leader is looked for again.
                        match grpc_conns(a, w, vec![ep], 1).await {
                            Ok(conns) => return Ok((conns, node)),
                            Err(
                                e @ (ClientError::NoLeader { .. }
                                | ClientError::Indeterminate { .. }),
                            ) => {
                                moved = Some(e.to_string());
                            }
                            Err(e) => return Err(e.to_string()),
                        }
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The sum of the named counters of every node, from its metrics.
    fn counters(&self, names: &[&str]) -> Result<Vec<u64>, String> {
        let mut total = vec![0u64; names.len()];
        for cfg in &self.configs {
            let text = match (&self.env, cfg.node) {
                (Some(env), 1) => env.render_metrics(),
                _ => scrape(&cfg.metrics_listen)?,
            };
            for (t, n) in total.iter_mut().zip(names) {
                *t += metric_sum(&text, n);
            }
        }
        Ok(total)
    }

    async fn bench(&mut self, a: &BenchArgs, w: &Workload) -> Result<Value, String> {
        let (conns, leader) = self.wait_leader(a, w).await?;
        let replicas: Vec<u32> = (1..=NODES).map(|i| self.pid(i)).collect();
        let path = client_path(a, w.mode());
        // On the gRPC path the clients' process (this one) is part of what runs; its CPU
        // counts too.
        let extra: Vec<u32> = match path {
            ClientPath::Grpc | ClientPath::GrpcStream => vec![std::process::id()],
            ClientPath::Embedded => vec![],
        };
        let sampler = Sampler::new(&replicas, &extra, &self.dir).map_err(|e| e.to_string())?;
        let follower = if leader == 2 { 3 } else { 2 };
        let follower_metrics = self.configs[follower - 1].metrics_listen.clone();
        // fdatasyncs of the log and of the other durable record (the ordered meta, which
        // SYNC mode also saves the commit point in; an out-of-order group's hard state),
        // and what a follower received.
        let names = ["chorus_log_fsyncs_total", "chorus_meta_saves_total"];
        let received = match w {
            Workload::Ordered => "chorus_frames_received_total",
            _ => "chorus_messages_received_total",
        };
        let mut start = None;
        let mut end = None;
        let m = closed_loop(
            a,
            w,
            conns,
            a.ep.output == Output::Json,
            &mut || {
                start = Some((
                    sampler.sample(),
                    self.counters(&names),
                    scrape(&follower_metrics).map(|t| metric_sum(&t, received)),
                ))
            },
            &mut || {
                end = Some((
                    sampler.sample(),
                    self.counters(&names),
                    scrape(&follower_metrics).map(|t| metric_sum(&t, received)),
                ))
            },
        )
        .await;
        self.check_children()?;
        // The commit-point mode is the ordered replica's; out-of-order groups have none.
        let commit_mode = matches!(w, Workload::Ordered).then_some(a.commit_mode.as_str());
        let mut v = base_result(a, w, &m, path.name(), commit_mode);
        let (Some((s0, c0, f0)), Some((s1, c1, f1))) = (start, end) else {
            return Err("the measured interval did not run".into());
        };
        match (s0, s1) {
            (Ok(s0), Ok(s1)) => {
                add_usage(&mut v, &usage(&s0, &s1), m.appends, w.record_size(a.size))
            }
            (Err(e), _) | (_, Err(e)) => eprintln!("chorus bench: OS accounting failed: {e}"),
        }
        if let (Ok(c0), Ok(c1)) = (c0, c1) {
            let syncs = (c1[0] - c0[0]) + (c1[1] - c0[1]);
            v["fsyncs_per_sec"] = json!(syncs as f64 / m.seconds);
        }
        if let (Ok(f0), Ok(f1)) = (f0, f1) {
            v["follower_msgs_per_sec"] = json!(f1.saturating_sub(f0) as f64 / m.seconds);
        }
        Ok(v)
    }

    fn stop(&mut self) {
        if let Some(env) = self.env.take() {
            env.shutdown();
        }
        for (_, c) in self.children.iter() {
            // SIGTERM: the server shuts down cleanly.
            // SAFETY: kill(2) with a pid we spawned and a valid signal number.
            unsafe {
                libc::kill(c.id() as i32, libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        for (_, c) in self.children.iter_mut() {
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        self.children.clear();
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `GET /metrics` from a node's metrics address (plain HTTP/1.0, bounded by timeouts).
fn scrape(addr: &str) -> Result<String, String> {
    let sa: std::net::SocketAddr = addr
        .parse()
        .map_err(|e| format!("metrics address {addr:?}: {e}"))?;
    let mut s = TcpStream::connect_timeout(&sa, Duration::from_secs(2))
        .map_err(|e| format!("metrics {addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))
        .and_then(|_| s.set_write_timeout(Some(Duration::from_secs(2))))
        .and_then(|_| s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n"))
        .map_err(|e| format!("metrics {addr}: {e}"))?;
    let mut out = String::new();
    s.read_to_string(&mut out)
        .map_err(|e| format!("metrics {addr}: {e}"))?;
    match out.split_once("\r\n\r\n") {
        Some((head, body))
            if head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200") =>
        {
            Ok(body.to_string())
        }
        _ => Err(format!(
            "metrics {addr}: unexpected answer {:?}",
            out.lines().next().unwrap_or("")
        )),
    }
}

/// The sum of every sample of metric `name` (all label sets) in Prometheus text.
fn metric_sum(text: &str, name: &str) -> u64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (key, val) = l.rsplit_once(' ')?;
            let metric = key.split('{').next()?;
            (metric == name).then(|| val.parse::<f64>().ok())?
        })
        .sum::<f64>() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_sum_adds_label_sets_and_ignores_others() {
        let t = "# HELP chorus_log_fsyncs_total x\n# TYPE chorus_log_fsyncs_total counter\n\
                 chorus_log_fsyncs_total{group=\"1\"} 10\nchorus_log_fsyncs_total{group=\"2\"} 5\n\
                 chorus_log_fsyncs_total_other 99\nchorus_frames_received_total 7\n";
        assert_eq!(metric_sum(t, "chorus_log_fsyncs_total"), 15);
        assert_eq!(metric_sum(t, "chorus_frames_received_total"), 7);
        assert_eq!(metric_sum(t, "missing"), 0);
    }
}

#[cfg(test)]
mod port_tests {
    use super::*;

    #[test]
    fn fixed_ports_follow_the_documented_layout() {
        assert_eq!(
            local_ports(7300).unwrap(),
            vec![[7301, 7311, 7321], [7302, 7312, 7322], [7303, 7313, 7323]]
        );
    }

    #[test]
    fn os_chosen_ports_are_nine_distinct_ports() {
        let p: Vec<u16> = local_ports(0).unwrap().into_iter().flatten().collect();
        let mut d = p.clone();
        d.sort_unstable();
        d.dedup();
        assert_eq!(d.len(), 9, "{p:?}");
        assert!(!p.contains(&0));
    }

    #[test]
    fn base_port_parser_names_what_is_accepted() {
        assert_eq!(parse_base_port("0"), Ok(0));
        assert_eq!(parse_base_port("7300"), Ok(7300));
        for bad in ["80", "65001", "-1", "x"] {
            assert!(parse_base_port(bad).unwrap_err().contains("1024..=65000"));
        }
    }
}
