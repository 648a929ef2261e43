//! `chorus-bench`: storage benchmarks, each run side by side with its baseline.
//!
//! - `storage`: single-replica append throughput of 512-byte records with group commit
//!   through [`LogStorage`] (validate + write + one `fdatasync` per batch), against a raw
//!   `pwrite` + `fdatasync` loop writing the *same bytes* in the same batches to a file in
//!   the same directory. Rounds alternate A B A B so drift on a shared machine hits both;
//!   medians and the ratio are printed.
//! - `recovery`: time to reopen a log of a given size (small vs large), to show restart
//!   time does not grow with log length.
//! - `ooo`: the out-of-order modes against the ordered runtime, three replica processes
//!   per system (see [`chorus_bench::ooo`]); `replica` is its hidden child-process mode.

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
    /// Out-of-order modes vs the ordered runtime, 3 replica processes per system, fsync
    /// on: 4 KiB block writes over an IO depth sweep with jitter on one replication link
    /// (PolarFS Fig. 7), and YCSB-like 1-read-1-write transactions over a clients sweep
    /// and a Zipf θ sweep with the follower apply gap (DP-Raft section 5).
    Ooo(Box<OooArgs>),
    /// Many groups on one node: three nodes (Envs in this process) each host N groups, a
    /// third of each mode; CPU at rest, and the time a node takes to reopen with them all
    /// and to hear a leader in every one.
    Groups {
        /// Groups per node.
        #[arg(long, default_value_t = 1000)]
        groups: u64,
        /// Seconds of measured rest.
        #[arg(long, default_value_t = 10)]
        idle_secs: u64,
        /// Seconds allowed for every group to elect a leader (at the start, after the
        /// restart).
        #[arg(long, default_value_t = 300)]
        settle_secs: u64,
        /// Scratch directory.
        #[arg(long, default_value = "/tmp/chorus-bench-groups")]
        dir: PathBuf,
        /// Also write the result as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// The same closed-loop load spread over more and more ordered groups: three nodes
    /// (Envs in this process) host N groups each; appends/s per point, and its ratio to
    /// the first point's.
    Spread {
        /// Group counts, comma-separated, one point each (the first is the baseline).
        #[arg(long, default_value = "1,10,100,1000", value_delimiter = ',')]
        groups: Vec<u64>,
        /// Closed-loop clients.
        #[arg(long, default_value_t = 1000)]
        clients: u64,
        /// Bytes per record.
        #[arg(long, default_value_t = 512)]
        size: usize,
        /// Seconds measured per point.
        #[arg(long, default_value_t = 5)]
        secs: u64,
        /// Seconds of load before each measurement.
        #[arg(long, default_value_t = 2)]
        warmup: u64,
        /// Seconds allowed for every group to elect a leader.
        #[arg(long, default_value_t = 120)]
        settle_secs: u64,
        /// Scratch directory.
        #[arg(long, default_value = "/tmp/chorus-bench-spread")]
        dir: PathBuf,
        /// IO workers per node (default: the environment's).
        #[arg(long)]
        io_workers: Option<usize>,
        /// Ordered groups one IO worker steps together (default: the environment's;
        /// 1 steps each group on its own).
        #[arg(long)]
        pass_groups: Option<usize>,
        /// Also write the points as JSON lines here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Internal: one replica process of `chorus-bench ooo` (line protocol on stdin/stdout).
    #[command(hide = true)]
    Replica {
        /// ordered, parallel, parallel-txn, dependent, in-order or ordered-no-repair.
        #[arg(long)]
        system: String,
        /// Node id.
        #[arg(long)]
        id: u64,
        /// Data directory.
        #[arg(long)]
        dir: PathBuf,
        /// Out-of-order apply threads.
        #[arg(long, default_value_t = 0)]
        apply_threads: usize,
        /// Microseconds each record's apply takes.
        #[arg(long, default_value_t = 0)]
        apply_us: u64,
        /// Out-of-order election timeout, ms.
        #[arg(long, default_value_t = 1000)]
        election_ms: u64,
        /// Out-of-order leader: hole resend after this many later acknowledgements.
        #[arg(long, default_value_t = chorus_core::ooo::replica::HOLE_RESEND)]
        hole_resend: u64,
        /// Leader: resend a copy unacknowledged for this many median round trips (0: off).
        #[arg(long, default_value_t = chorus_core::ooo::replica::TIMED_RESEND)]
        timed_resend: u32,
        /// Out-of-order leader: longest wait, µs, to pack appends while its log write is in flight.
        #[arg(long, default_value_t = 0)]
        freeze_us: u64,
        /// Bytes of zeros the log keeps written past its end.
        #[arg(long, default_value_t = chorus_storage::log::DEFAULT_PREALLOCATE)]
        preallocate: u64,
        /// Out-of-order entries file: direct IO (1) or the page cache (0).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=1))]
        ooo_direct_io: u8,
        /// Out-of-order entries file: compact past this many bytes (0: never).
        #[arg(long, default_value_t = 0)]
        ooo_compact_bytes: u64,
        /// Note every apply for the apply gap.
        #[arg(long)]
        record_applies: bool,
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
        /// Bytes of zeros the Chorus legs keep written past the log's end
        /// (`LogOptions::preallocate`); when not 0, a third Chorus leg runs without.
        #[arg(long, default_value_t = chorus_storage::log::DEFAULT_PREALLOCATE)]
        preallocate: u64,
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

/// Flags of `chorus-bench ooo`.
#[derive(clap::Args, Debug)]
struct OooArgs {
    /// Scratch directory for the nodes' data: each run works in a fresh subdirectory of its
    /// own (a fresh one per point inside it) and removes only that, so runs may share it.
    #[arg(long, default_value = "/tmp/chorus-bench-ooo")]
    dir: PathBuf,
    /// Write results.json here (created); plot with bench/ooo_plot.py.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Also write the results JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Parts to run, comma-separated: block, ycsb-clients, ycsb-theta.
    #[arg(
        long,
        default_value = "block,ycsb-clients,ycsb-theta",
        value_delimiter = ','
    )]
    parts: Vec<String>,
    /// Seconds measured per point.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Warm-up seconds per point (after the leader committed a probe).
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// Sweeps (every point of every repeat is kept; medians are reported).
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Block part: IO depths (closed-loop clients), comma-separated.
    #[arg(long, default_value = "1,2,4,8,16,32", value_delimiter = ',')]
    depths: Vec<usize>,
    /// Block part: systems, comma-separated (ordered-no-repair: the ordered replica with
    /// its gap and timed resends off, the Raft PolarFS measured).
    #[arg(
        long,
        default_value = "ordered,parallel,in-order",
        value_delimiter = ','
    )]
    block_systems: Vec<String>,
    /// Block part: bytes per write.
    #[arg(long, default_value_t = 4096)]
    block_bytes: usize,
    /// Block part: bound of the random delay on the leader → node 3 link, ms (0: none).
    #[arg(long, default_value_t = 2.0)]
    jitter_ms: f64,
    /// YCSB parts: systems, comma-separated.
    #[arg(
        long,
        default_value = "dependent,ordered,parallel-txn,parallel",
        value_delimiter = ','
    )]
    ycsb_systems: Vec<String>,
    /// YCSB clients sweep: client counts, comma-separated.
    #[arg(long, default_value = "1,4,16,64,256", value_delimiter = ',')]
    clients: Vec<usize>,
    /// YCSB clients sweep: Zipf θ.
    #[arg(long, default_value_t = 0.99)]
    theta: f64,
    /// YCSB θ sweep: the θs, comma-separated.
    #[arg(long, default_value = "0.5,0.7,0.9,0.99", value_delimiter = ',')]
    thetas: Vec<f64>,
    /// YCSB θ sweep: clients.
    #[arg(long, default_value_t = 256)]
    theta_clients: usize,
    /// YCSB: keys.
    #[arg(long, default_value_t = 10_000_000)]
    keys: u64,
    /// YCSB: bytes per transaction record (id, read key, write key, filler).
    #[arg(long, default_value_t = 100)]
    value_bytes: usize,
    /// YCSB: jitter bound on the leader → node 3 link, ms (0: none).
    #[arg(long, default_value_t = 0.0)]
    ycsb_jitter_ms: f64,
    /// The jitter delays each replication frame by its own draw, so frames overtake one
    /// another (one link standing for several connections, one slow: PolarFS 5.1),
    /// instead of delaying the byte stream in order.
    #[arg(long)]
    reorder: bool,
    /// Leader → follower links given the jitter: 1 (node 3) or 2 (nodes 2 and 3).
    #[arg(long, default_value_t = 1)]
    jitter_links: usize,
    /// With --reorder: each jittered link stands for this many connections, frames spread
    /// over them at random, and only one of them jitters (0: every frame jitters).
    #[arg(long, default_value_t = 0)]
    connections: u32,
    /// Out-of-order leaders resend a recent entry at once to a follower that acknowledged
    /// this many later ones but not it; ordered followers ask for a gap to be resent once
    /// they hold this many later messages (0: neither, only the periodic resends; the
    /// default is the server's).
    #[arg(long, default_value_t = chorus_core::ooo::replica::HOLE_RESEND)]
    hole_resend: u64,
    /// Leaders of every system resend an uncommitted copy a follower has not acknowledged
    /// within this many of its median round trips (TCP's tail loss probe; 0: off; the
    /// default is the server's).
    #[arg(long, default_value_t = chorus_core::ooo::replica::TIMED_RESEND)]
    timed_resend: u32,
    /// Out-of-order leaders: longest wait, µs, to pack appends into a group entry while
    /// the leader's own log write is in flight (adaptive group replication, PALF section
    /// 6; 0: pack what each driver round took, the server's default)
    #[arg(long, default_value_t = 0)]
    ooo_freeze_us: u64,
    /// Bytes of zeros every node's log (ordered block file, out-of-order entries file)
    /// keeps written past its end, so most syncs do not grow the file (0: none; the
    /// default is the server's).
    #[arg(long, default_value_t = chorus_storage::log::DEFAULT_PREALLOCATE)]
    preallocate: u64,
    /// Out-of-order nodes append to their entries files with direct IO (1, the server's
    /// default) or through the page cache (0)
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=1))]
    ooo_direct_io: u8,
    /// Out-of-order nodes checkpoint and compact their entries file past this many bytes,
    /// as a server does (`[out_of_order] compact_bytes`, 64 MiB there; 0, the default
    /// here as in every earlier run: never, every entry stays in memory for the run)
    #[arg(long, default_value_t = 0)]
    ooo_compact_bytes: u64,
    /// Out-of-order nodes: apply threads (0: the driver thread applies).
    #[arg(long, default_value_t = 0)]
    apply_threads: usize,
    /// Microseconds each record's apply takes, on every node of every system (a sleep: a
    /// state machine waiting on its own IO; the ordered system's replay thread applies
    /// one record after another, out-of-order nodes on --apply-threads threads). Reports
    /// follower staleness (commit to follower apply) and the fraction applied by the end.
    #[arg(long, default_value_t = 0)]
    apply_us: u64,
    /// Out-of-order nodes: node 1's election timeout, ms (nodes 2 and 3: 5 times it). The
    /// driver heartbeats and resends unacknowledged entries every sixth of it (1000: every
    /// 167 ms, near the ordered replica's 200 ms heartbeat and 400 ms resend).
    #[arg(long, default_value_t = 1000)]
    ooo_election_ms: u64,
    /// One short point per system per workload (block at depth 8, YCSB at 16 clients,
    /// θ 0.99, 1 repeat, 1 s each; the block part adds ordered-no-repair); exits non-zero
    /// if any system fails to run or report. Overrides the sweep flags.
    #[arg(long)]
    smoke: bool,
}

fn ooo(a: OooArgs) -> AnyResult<()> {
    use chorus_bench::ooo::{self as o, Part, System};
    let systems = |v: &[String]| -> Result<Vec<System>, String> {
        v.iter().map(|s| System::parse(s.trim())).collect()
    };
    let mut s = o::Settings {
        dir: a.dir.clone(),
        seconds: a.seconds,
        warmup: a.warmup,
        repeats: a.repeats,
        parts: a
            .parts
            .iter()
            .map(|p| Part::parse(p.trim()))
            .collect::<Result<_, _>>()?,
        depths: a.depths.clone(),
        block_systems: systems(&a.block_systems)?,
        block_bytes: a.block_bytes,
        jitter_ms: a.jitter_ms,
        ycsb_systems: systems(&a.ycsb_systems)?,
        clients: a.clients.clone(),
        theta: a.theta,
        thetas: a.thetas.clone(),
        theta_clients: a.theta_clients,
        keys: a.keys,
        value_bytes: a.value_bytes,
        ycsb_jitter_ms: a.ycsb_jitter_ms,
        reorder: a.reorder,
        jitter_links: a.jitter_links,
        connections: a.connections,
        hole_resend: a.hole_resend,
        timed_resend: a.timed_resend,
        ooo_freeze_us: a.ooo_freeze_us,
        preallocate: a.preallocate,
        ooo_direct_io: a.ooo_direct_io == 1,
        ooo_compact_bytes: a.ooo_compact_bytes,
        apply_threads: a.apply_threads,
        apply_us: a.apply_us,
        ooo_election_ms: a.ooo_election_ms,
    };
    if a.smoke {
        s.parts = vec![Part::Block, Part::YcsbClients];
        s.depths = vec![8];
        s.clients = vec![16];
        s.repeats = 1;
        s.seconds = 1.0;
        s.warmup = 0.3;
        // The baseline run only by name in sweeps gets its smoke point too.
        if !s.block_systems.contains(&System::OrderedNoRepair) {
            s.block_systems.push(System::OrderedNoRepair);
        }
    }
    s.check()?;
    let t0 = std::time::Instant::now();
    let points = o::run(&s, |p| {
        let x = match p.theta {
            Some(t) => format!("clients {:>3} θ {t:.2}", p.clients),
            None => format!("depth {:>2}", p.clients),
        };
        match &p.error {
            None => eprintln!(
                "[{:>5.0}s] r{} {:<12} {:<9} {x}: {:>8.0} ops/s  p50 {:>6.0} µs  cpu {}{}{}",
                t0.elapsed().as_secs_f64(),
                p.repeat,
                p.part.name(),
                p.system.name(),
                p.ops_per_sec,
                p.lat_p50_us,
                p.cpu
                    .iter()
                    .map(|c| format!("{c:.2}"))
                    .collect::<Vec<_>>()
                    .join("/"),
                p.gap.as_ref().map_or(String::new(), |g| format!(
                    "  gap p50 {:.0} µs p99 {:.0} µs",
                    g.median_us, g.p99_us
                )) + &match (&p.staleness, p.applied_by_end.is_empty()) {
                    (_, true) => String::new(),
                    (s, false) => format!(
                        "  stale p50 {} applied {}",
                        s.as_ref()
                            .map_or("-".into(), |g| format!("{:.0} µs", g.median_us)),
                        p.applied_by_end
                            .iter()
                            .map(|f| format!("{:.1}%", f * 100.0))
                            .collect::<Vec<_>>()
                            .join("/")
                    ),
                },
                match (p.records_per_entry, p.terms) {
                    (Some(r), Some((a, b))) if a != b =>
                        format!("  {r:.1} rec/entry  TERM {a}->{b}"),
                    (Some(r), _) => format!("  {r:.1} rec/entry"),
                    _ => String::new(),
                } + &match (p.queue_mean_us, p.fsync_mean_us) {
                    (Some(q), Some(f)) => format!(
                        "  queue {q:.0} fsync {f:.0} ack {} µs",
                        p.peer_ack_mean_us
                            .iter()
                            .map(|a| format!("{a:.0}"))
                            .collect::<Vec<_>>()
                            .join("/")
                    ),
                    _ => String::new(),
                },
            ),
            Some(e) => eprintln!(
                "[{:>5.0}s] r{} {:<12} {:<9} {x}: FAILED: {e}",
                t0.elapsed().as_secs_f64(),
                p.repeat,
                p.part.name(),
                p.system.name()
            ),
        }
    })?;
    let summary = o::summarize(&points);
    let failed: Vec<String> = points
        .iter()
        .filter_map(|p| {
            p.error
                .as_ref()
                .map(|e| format!("{} {} {}: {e}", p.part.name(), p.system.name(), p.clients))
        })
        .collect();
    let v = serde_json::json!({
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "settings": s,
        "machine": {
            "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
            "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
        },
        "points": points,
        "medians": summary["medians"],
        "ratios": summary["ratios"],
        "failed": failed,
    });
    for r in summary["ratios"].as_array().into_iter().flatten() {
        println!(
            "{:<12} clients {:>3} θ {:<5} {:>9} / {:<9} throughput ×{:.2}{}",
            r["part"].as_str().unwrap_or("?"),
            r["clients"],
            r["theta"].as_f64().map_or("-".into(), |t| format!("{t}")),
            r["system"].as_str().unwrap_or("?"),
            r["vs"].as_str().unwrap_or("?"),
            r["throughput_ratio"].as_f64().unwrap_or(f64::NAN),
            r["gap_lower_by"]
                .as_f64()
                .map_or(String::new(), |g| format!("  gap lower ×{g:.2}")),
        );
    }
    if let Some(d) = &a.out {
        std::fs::create_dir_all(d).map_err(|e| format!("create {}: {e}", d.display()))?;
        let f = d.join("results.json");
        std::fs::write(&f, serde_json::to_string_pretty(&v)?)
            .map_err(|e| format!("write {}: {e}", f.display()))?;
        eprintln!("wrote {}", f.display());
    }
    if let Some(f) = &a.json {
        std::fs::write(f, format!("{v}\n")).map_err(|e| format!("write {}: {e}", f.display()))?;
    }
    if !failed.is_empty() {
        return Err(format!("{} point(s) failed:\n{}", failed.len(), failed.join("\n")).into());
    }
    Ok(())
}

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
            preallocate,
        } => storage(
            &dir,
            record_bytes,
            group_records,
            batch_bytes,
            round_bytes,
            rounds,
            preallocate,
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
        Cmd::Groups {
            groups,
            idle_secs,
            settle_secs,
            dir,
            json,
        } => {
            let o = chorus_bench::groups::GroupsOpts {
                groups,
                idle_secs,
                dir,
                settle_secs,
            };
            match chorus_bench::groups::run(&o) {
                Ok(r) => {
                    let line = serde_json::to_string(&r).expect("a result serializes");
                    println!("{line}");
                    if let Some(p) = json {
                        std::fs::write(&p, format!("{line}\n"))
                            .map_err(|e| format!("write {}: {e}", p.display()))?;
                    }
                    Ok(())
                }
                Err(e) => {
                    eprintln!("chorus-bench groups: {e}");
                    std::process::exit(1);
                }
            }
        }
        Cmd::Spread {
            groups,
            clients,
            size,
            secs,
            warmup,
            settle_secs,
            dir,
            io_workers,
            pass_groups,
            json,
        } => {
            let o = chorus_bench::spread::SpreadOpts {
                groups,
                clients,
                size,
                secs,
                warmup,
                settle_secs,
                dir,
                io_workers,
                pass_groups,
            };
            match chorus_bench::spread::run(&o) {
                Ok(points) => {
                    let mut text = String::new();
                    for p in &points {
                        text.push_str(&serde_json::to_string(p).expect("a point serializes"));
                        text.push('\n');
                    }
                    print!("{text}");
                    if let Some(p) = json {
                        std::fs::write(&p, text)
                            .map_err(|e| format!("write {}: {e}", p.display()))?;
                    }
                    Ok(())
                }
                Err(e) => {
                    eprintln!("chorus-bench spread: {e}");
                    std::process::exit(1);
                }
            }
        }
        Cmd::Ooo(a) => {
            let a = *a;
            if let Err(e) = ooo(a) {
                eprintln!("chorus-bench ooo: {e}");
                std::process::exit(1);
            }
            Ok(())
        }
        Cmd::Replica {
            system,
            id,
            dir,
            apply_threads,
            apply_us,
            election_ms,
            hole_resend,
            timed_resend,
            freeze_us,
            preallocate,
            ooo_direct_io,
            ooo_compact_bytes,
            record_applies,
        } => {
            let r = chorus_bench::ooo::System::parse(&system).and_then(|system| {
                let o = chorus_bench::ooo::node::NodeOpts {
                    system,
                    id,
                    dir,
                    apply_threads,
                    apply_us,
                    election: std::time::Duration::from_millis(election_ms),
                    hole_resend,
                    timed_resend,
                    freeze: std::time::Duration::from_micros(freeze_us),
                    preallocate,
                    direct_io: ooo_direct_io == 1,
                    compact_bytes: ooo_compact_bytes,
                };
                chorus_bench::ooo::replica_main(o, record_applies)
            });
            if let Err(e) = r {
                eprintln!("chorus-bench replica {id}: {e}");
                std::process::exit(1);
            }
            Ok(())
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
    preallocate: u64,
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
    let (mut chorus_direct_mbs, mut chorus_grow_mbs) = (Vec::new(), Vec::new());
    // One Chorus leg: a fresh log, so each round writes the same LSN range; `None` when
    // direct IO was asked for and the file system refuses it.
    let chorus_leg = |opts: LogOptions| -> AnyResult<Option<f64>> {
        let cdir = dir.join("chorus");
        let _ = std::fs::remove_dir_all(&cdir);
        let fs: Arc<dyn FileSystem> = Arc::new(RealFs::new());
        let mut log = LogStorage::create(fs, &cdir, opts, 1)?;
        if opts.direct_io && !log.is_direct() {
            return Ok(None);
        }
        let t = Instant::now();
        for b in &batches {
            log.append(b)?;
            log.sync()?;
        }
        Ok(Some(bytes as f64 / t.elapsed().as_secs_f64() / 1e6))
    };
    for round in 0..rounds {
        // Chorus buffered, then with direct IO (LogOptions::direct_io), then direct
        // without zeros ahead (LogOptions::preallocate), the same batches.
        let opts = LogOptions {
            direct_io: false,
            preallocate,
            ..LogOptions::default()
        };
        let c = chorus_leg(opts)?.unwrap_or_default();
        let cd = chorus_leg(LogOptions {
            direct_io: true,
            ..opts
        })?;
        let grow = if preallocate > 0 {
            chorus_leg(LogOptions {
                direct_io: true,
                preallocate: 0,
                ..opts
            })?
        } else {
            None
        };

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
            "round {round}: chorus {c:.1} MB/s  chorus-direct {} MB/s  chorus-direct-no-zeros-ahead {} MB/s  raw {r:.1} MB/s  raw-direct {} MB/s  chorus/raw {:.3}",
            cd.map_or("n/a".into(), |d| format!("{d:.1}")),
            grow.map_or("n/a".into(), |d| format!("{d:.1}")),
            d.map_or("n/a".into(), |d| format!("{d:.1}")),
            c / r
        );
        if let Some(cd) = cd {
            chorus_direct_mbs.push(cd);
            if let Some(g) = grow {
                chorus_grow_mbs.push(cd / g);
            }
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
    if !chorus_grow_mbs.is_empty() {
        println!(
            "median per-round chorus-direct / chorus-direct-no-zeros-ahead {:.3}",
            median(&mut chorus_grow_mbs)
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
