//! `chorus-bench`: storage benchmarks, each run side by side with its baseline.
//!
//! - `storage`: single-replica append throughput of 512-byte records with group commit
//!   through [`LogStorage`] (validate + write + one `fdatasync` per batch), against a raw
//!   `pwrite` + `fdatasync` loop writing the *same bytes* in the same batches to a file in
//!   the same directory. Rounds alternate A B A B so drift on a shared machine hits both;
//!   medians and the ratio are printed.
//! - `recovery`: time to reopen a log of a given size (small vs large), to show restart
//!   time does not grow with log length.

use std::fs::OpenOptions as StdOpen;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use chorus_core::format::group::{
    block_remaining, encode_group, encode_padding, fits_in_block, ChainPoint, SealParams,
};
use chorus_storage::fs::{FileSystem, RealFs};
use chorus_storage::{LogOptions, LogStorage};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "chorus-bench",
    about = "Chorus benchmarks, side by side with baselines"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Out-of-order parallel mode vs an in-order baseline in the same driver: 4 KiB block
    /// writes, IO depth sweep, jitter on one replication link (three nodes in this
    /// process, fdatasync on).
    Ooo {
        /// Directory for the nodes' data (removed afterwards).
        #[arg(long, default_value = "/tmp/chorus-bench-ooo")]
        dir: PathBuf,
        /// IO depths (closed-loop clients), comma-separated.
        #[arg(long, default_value = "1,2,4,8,16,32", value_delimiter = ',')]
        depths: Vec<usize>,
        /// Seconds measured per point.
        #[arg(long, default_value_t = 3.0)]
        seconds: f64,
        /// Bound of the random wait before each write on the leader's link to one follower.
        #[arg(long, default_value_t = 2.0)]
        jitter_ms: f64,
        /// Sweeps (medians are reported).
        #[arg(long, default_value_t = 3)]
        repeats: usize,
        /// Also write the points here as JSON.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Storage append throughput vs a raw pwrite+fdatasync loop.
    Storage {
        /// Directory on the disk to measure (files are removed afterwards).
        #[arg(long, default_value = "/tmp/chorus-bench")]
        dir: PathBuf,
        /// Payload bytes per record.
        #[arg(long, default_value_t = 512)]
        record_bytes: usize,
        /// Records per group.
        #[arg(long, default_value_t = 64)]
        group_records: usize,
        /// Bytes written between two fdatasyncs (group commit batch).
        #[arg(long, default_value_t = 1 << 20)]
        batch_bytes: usize,
        /// Bytes per round and system.
        #[arg(long, default_value_t = 256 << 20)]
        round_bytes: u64,
        /// Rounds per system (alternating).
        #[arg(long, default_value_t = 5)]
        rounds: usize,
    },
    /// Replication transport vs the same messages in a tonic bidirectional stream.
    Transport {
        /// Append messages per run.
        #[arg(long, default_value_t = 20_000)]
        appends: usize,
        /// Group bytes per append message.
        #[arg(long, default_value_t = 16 << 10)]
        payload: usize,
        /// Ack messages per run.
        #[arg(long, default_value_t = 200_000)]
        acks: usize,
        /// Messages in flight at most.
        #[arg(long, default_value_t = 256)]
        window: u64,
        /// Rounds per system (alternating).
        #[arg(long, default_value_t = 3)]
        rounds: usize,
    },
    /// The disk's ceiling for durable appends: one file, O_DIRECT, one fdatasync per batch,
    /// no replication. Prints one JSON line in the benchmark matrix's result schema.
    Ceiling {
        /// Directory on the disk to measure (the file is removed afterwards).
        #[arg(long, default_value = "/tmp/chorus-bench-ceiling")]
        dir: PathBuf,
        /// Payload bytes per record.
        #[arg(long, default_value_t = 512)]
        size: usize,
        /// Bytes per batch (one pwrite + fdatasync each).
        #[arg(long, default_value_t = 1 << 20)]
        batch_bytes: usize,
        /// Warm-up seconds.
        #[arg(long, default_value_t = 1.0)]
        warmup: f64,
        /// Measured seconds.
        #[arg(long, default_value_t = 5.0)]
        duration: f64,
        /// Also write the JSON to this file.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// The latency floor of one replicated append here: a 4 KiB write + fdatasync and a
    /// loopback TCP round trip (JSON).
    Floor {
        /// Directory on the disk to measure.
        #[arg(long, default_value = "/tmp/chorus-bench-floor")]
        dir: PathBuf,
        /// fdatasyncs to time.
        #[arg(long, default_value_t = 300)]
        syncs: usize,
        /// Round trips to time.
        #[arg(long, default_value_t = 5000)]
        trips: usize,
        /// Also write the JSON to this file.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Reopen time of a small and a large log.
    Recovery {
        /// Directory on the disk to measure.
        #[arg(long, default_value = "/tmp/chorus-bench-recovery")]
        dir: PathBuf,
        /// Size of the small log in MiB.
        #[arg(long, default_value_t = 100)]
        small_mib: u64,
        /// Size of the large log in MiB (10 GiB plus the same 36 MiB tail as the small log,
        /// so both last blocks hold the same number of bytes to scan).
        #[arg(long, default_value_t = 10 * 1024 + 36)]
        large_mib: u64,
        /// Reopens per log.
        #[arg(long, default_value_t = 5)]
        reopens: usize,
    },
}

mod transport;

type AnyResult<T> = Result<T, Box<dyn std::error::Error>>;

fn main() -> AnyResult<()> {
    match Cli::parse().cmd {
        Cmd::Storage {
            dir,
            record_bytes,
            group_records,
            batch_bytes,
            round_bytes,
            rounds,
        } => storage(
            &dir,
            record_bytes,
            group_records,
            batch_bytes,
            round_bytes,
            rounds,
        ),
        Cmd::Recovery {
            dir,
            small_mib,
            large_mib,
            reopens,
        } => recovery(&dir, small_mib, large_mib, reopens),
        Cmd::Transport {
            appends,
            payload,
            acks,
            window,
            rounds,
        } => transport::run(appends, payload, acks, window, rounds),
        Cmd::Ceiling {
            dir,
            size,
            batch_bytes,
            warmup,
            duration,
            json,
        } => ceiling(&dir, size, batch_bytes, warmup, duration, json.as_deref()),
        Cmd::Ooo {
            dir,
            depths,
            seconds,
            jitter_ms,
            repeats,
            json,
        } => {
            if depths.is_empty() || depths.contains(&0) || repeats == 0 || seconds <= 0.0 {
                return Err("--depths must be positive, --repeats and --seconds above 0".into());
            }
            let pts = chorus_bench::ooo::run(&dir, &depths, seconds, jitter_ms, repeats)?;
            let mut summary = Vec::new();
            for &d in &depths {
                let med = |sys: &str| {
                    let mut v: Vec<f64> = pts
                        .iter()
                        .filter(|p| p.system == sys && p.depth == d)
                        .map(|p| p.iops)
                        .collect();
                    v.sort_by(|a, b| a.total_cmp(b));
                    v[v.len() / 2]
                };
                let (p, o) = (med("parallel"), med("in-order"));
                println!(
                    "depth {d:>2}: parallel {p:>8.0}/s  in-order {o:>8.0}/s  ratio {:.2}",
                    p / o
                );
                summary.push(
                    serde_json::json!({"depth": d, "parallel": p, "in_order": o, "ratio": p / o}),
                );
            }
            emit(
                &serde_json::json!({"points": pts, "medians": summary}),
                json.as_deref(),
            )
        }
        Cmd::Floor {
            dir,
            syncs,
            trips,
            json,
        } => {
            let f = chorus_bench::floor::measure(&dir, syncs, trips)?;
            let _ = std::fs::remove_dir(&dir);
            emit(&serde_json::to_value(&f)?, json.as_deref())
        }
    }
}

/// Prints `v` as one JSON line and writes it to `file` if given.
fn emit(v: &serde_json::Value, file: Option<&Path>) -> AnyResult<()> {
    if let Some(p) = file {
        std::fs::write(p, format!("{v}\n")).map_err(|e| format!("write {}: {e}", p.display()))?;
    }
    println!("{v}");
    Ok(())
}

/// The `ceiling` subcommand: arguments are checked by [`chorus_bench::ceiling`], which
/// names the one that is out of range.
fn ceiling(
    dir: &Path,
    size: usize,
    batch_bytes: usize,
    warmup: f64,
    duration: f64,
    json: Option<&Path>,
) -> AnyResult<()> {
    use chorus_bench::ceiling;
    // As text: `main` reports a boxed error with `{:?}`, which would print the enum's
    // fields instead of its message.
    let msg = |e: ceiling::CeilingError| e.to_string();
    let warmup = ceiling::seconds("--warmup", warmup, false).map_err(msg)?;
    let duration = ceiling::seconds("--duration", duration, true).map_err(msg)?;
    let r = ceiling::run(dir, size, batch_bytes, warmup, duration).map_err(msg)?;
    // The struct's own line, not `emit`'s `Value`, which would sort the keys: this keeps
    // the schema's field order for a reader.
    let line = r.result().to_json_line();
    if let Some(p) = json {
        std::fs::write(p, format!("{line}\n"))
            .map_err(|e| format!("write {}: {e}", p.display()))?;
    }
    println!("{line}");
    Ok(())
}

const BLOCK: u64 = 64 << 20;

/// Encodes groups of `group_records` records after `chain` until `bytes` are produced,
/// split into batches of about `batch_bytes` (each batch ends on a group boundary).
fn encode_batches(
    chain: &mut ChainPoint,
    record_bytes: usize,
    group_records: usize,
    batch_bytes: usize,
    bytes: u64,
) -> Vec<Vec<u8>> {
    let record = vec![0xA5u8; record_bytes];
    let mut batches = Vec::new();
    let mut cur = Vec::with_capacity(batch_bytes + (1 << 16));
    let mut total = 0u64;
    while total < bytes {
        let size = 64 + group_records as u64 * (24 + record_bytes as u64);
        if !fits_in_block(chain.end_lsn, size, BLOCK) {
            let pad = block_remaining(chain.end_lsn, BLOCK);
            *chain = encode_padding(&mut cur, chain, 1, 0, pad).chain_after();
        }
        let recs: Vec<(u64, &[u8])> = (0..group_records as u64)
            .map(|i| (chain.max_csn + 1 + i, &record[..]))
            .collect();
        let p = SealParams {
            proposal_id: 1,
            committed_end_lsn: chain.end_lsn,
            flags: 0,
        };
        *chain = encode_group(&mut cur, chain, p, &recs).chain_after();
        if cur.len() >= batch_bytes {
            total += cur.len() as u64;
            batches.push(std::mem::take(&mut cur));
        }
    }
    if !cur.is_empty() {
        batches.push(cur);
    }
    batches
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn storage(
    dir: &Path,
    record_bytes: usize,
    group_records: usize,
    batch_bytes: usize,
    round_bytes: u64,
    rounds: usize,
) -> AnyResult<()> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)?;
    let mut chain = ChainPoint::default();
    let batches = encode_batches(
        &mut chain,
        record_bytes,
        group_records,
        batch_bytes,
        round_bytes,
    );
    let bytes: u64 = batches.iter().map(|b| b.len() as u64).sum();
    let records = bytes / (24 + record_bytes as u64 + 64 / group_records as u64);
    println!(
        "storage bench: {} B records, {} per group, {} KiB per fdatasync, {} MiB per round, {} rounds",
        record_bytes,
        group_records,
        batch_bytes >> 10,
        bytes >> 20,
        rounds
    );
    let (mut chorus_mbs, mut raw_mbs, mut direct_mbs) = (Vec::new(), Vec::new(), Vec::new());
    let mut chorus_direct_mbs = Vec::new();
    for round in 0..rounds {
        // Chorus: a fresh log per round, so each round writes the same LSN range.
        let cdir = dir.join("chorus");
        let _ = std::fs::remove_dir_all(&cdir);
        let fs: Arc<dyn FileSystem> = Arc::new(RealFs::new());
        let mut log = LogStorage::create(fs, &cdir, LogOptions::default(), 1)?;
        let t = Instant::now();
        for b in &batches {
            log.append(b)?;
            log.sync()?;
        }
        let c = bytes as f64 / t.elapsed().as_secs_f64() / 1e6;
        drop(log);

        // Chorus with direct IO (LogOptions::direct_io), the same batches.
        let _ = std::fs::remove_dir_all(&cdir);
        let fs: Arc<dyn FileSystem> = Arc::new(RealFs::new());
        let dopts = LogOptions {
            direct_io: true,
            ..LogOptions::default()
        };
        let mut log = LogStorage::create(fs, &cdir, dopts, 1)?;
        let cd = if log.is_direct() {
            let t = Instant::now();
            for b in &batches {
                log.append(b)?;
                log.sync()?;
            }
            Some(bytes as f64 / t.elapsed().as_secs_f64() / 1e6)
        } else {
            None
        };
        drop(log);

        let path = dir.join("raw.log");
        let _ = std::fs::remove_file(&path);
        let f = StdOpen::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(&path)?;
        let t = Instant::now();
        let mut off = 0u64;
        for b in &batches {
            f.write_all_at(b, off)?;
            f.sync_data()?;
            off += b.len() as u64;
        }
        let r = bytes as f64 / t.elapsed().as_secs_f64() / 1e6;
        // Raw O_DIRECT: the same batches copied into aligned buffers, padded to 4 KiB, the
        // last partial page rewritten by the next batch (what a direct-IO log must do).
        let dpath = dir.join("raw-direct.log");
        let _ = std::fs::remove_file(&dpath);
        let d = direct_loop(&dpath, &batches)?;
        println!(
            "round {round}: chorus {c:.1} MB/s  chorus-direct {} MB/s  raw {r:.1} MB/s  raw-direct {} MB/s  chorus/raw {:.3}",
            cd.map_or("n/a".into(), |d| format!("{d:.1}")),
            d.map_or("n/a".into(), |d| format!("{d:.1}")),
            c / r
        );
        if let Some(cd) = cd {
            chorus_direct_mbs.push(cd);
        }
        chorus_mbs.push(c);
        raw_mbs.push(r);
        if let Some(d) = d {
            direct_mbs.push(d);
        }
    }
    let (c, r) = (median(&mut chorus_mbs), median(&mut raw_mbs));
    let rec_per_s = c * 1e6 / bytes as f64 * records as f64;
    println!(
        "median: chorus {c:.1} MB/s ({rec_per_s:.0} records/s)  raw {r:.1} MB/s  chorus/raw {:.3}",
        c / r
    );
    if !chorus_direct_mbs.is_empty() {
        let cd = median(&mut chorus_direct_mbs);
        println!(
            "median chorus-direct {cd:.1} MB/s  chorus-direct/chorus-buffered {:.3}  chorus-direct/raw {:.3}",
            cd / c,
            cd / r
        );
    }
    if !direct_mbs.is_empty() {
        let d = median(&mut direct_mbs);
        println!(
            "median raw-direct {d:.1} MB/s  raw-direct/raw-buffered {:.3}",
            d / r
        );
    }
    std::fs::remove_dir_all(dir)?;
    Ok(())
}

/// Writes `batches` with O_DIRECT + fdatasync per batch; `None` if the file system refuses
/// O_DIRECT.
fn direct_loop(path: &Path, batches: &[Vec<u8>]) -> AnyResult<Option<f64>> {
    use chorus_storage::align::AlignedBuf;
    use chorus_storage::fs::OpenOptions;
    let fs = RealFs::new();
    let Some(parent) = path.parent() else {
        return Ok(None);
    };
    if !fs.supports_direct_io(parent) {
        return Ok(None);
    }
    let f = fs.open(path, OpenOptions::create().with_direct(true))?;
    let max = batches.iter().map(|b| b.len()).max().unwrap_or(0);
    let mut buf = AlignedBuf::with_capacity(max + 2 * 4096);
    let mut file_off = 0u64; // aligned file offset of buf[0]
    let total: u64 = batches.iter().map(|b| b.len() as u64).sum();
    let t = Instant::now();
    for b in batches {
        buf.extend_from_slice(b);
        let len = buf.len();
        buf.resize(len.div_ceil(4096) * 4096);
        f.write_all_at(&buf, file_off)?;
        f.sync_data()?;
        // Keep the last partial page: the next write rewrites it with more bytes.
        let full = len / 4096 * 4096;
        let tail: Vec<u8> = buf[full..len].to_vec();
        buf.clear();
        buf.extend_from_slice(&tail);
        file_off += full as u64;
    }
    Ok(Some(total as f64 / t.elapsed().as_secs_f64() / 1e6))
}

fn recovery(dir: &Path, small_mib: u64, large_mib: u64, reopens: usize) -> AnyResult<()> {
    let _ = std::fs::remove_dir_all(dir);
    let mut results = Vec::new();
    for (name, mib) in [("small", small_mib), ("large", large_mib)] {
        let d = dir.join(name);
        let fs: Arc<dyn FileSystem> = Arc::new(RealFs::new());
        let mut log = LogStorage::create(fs.clone(), &d, LogOptions::default(), 7)?;
        let mut chain = ChainPoint::default();
        let target = mib << 20;
        // Write in 64 MiB slices so memory stays bounded for a 10 GiB log.
        while log.end_lsn() < target {
            let slice = (target - log.end_lsn()).min(64 << 20);
            for b in encode_batches(&mut chain, 512, 64, 4 << 20, slice) {
                log.append(&b)?;
            }
            log.sync()?;
        }
        let end = log.end_lsn();
        drop(log);
        let mut ms = Vec::new();
        for _ in 0..reopens {
            let t = Instant::now();
            let (log, report) = LogStorage::open(fs.clone(), &d, LogOptions::default(), 7)?;
            ms.push(t.elapsed().as_secs_f64() * 1e3);
            assert_eq!(log.end_lsn(), end);
            let _ = report;
        }
        let m = median(&mut ms);
        println!(
            "{name}: {} MiB log, {} blocks, reopen median {m:.1} ms",
            end >> 20,
            end.div_ceil(BLOCK)
        );
        results.push(m);
        std::fs::remove_dir_all(&d)?;
    }
    println!(
        "large/small reopen time ratio {:.2}",
        results[1] / results[0]
    );
    Ok(())
}
