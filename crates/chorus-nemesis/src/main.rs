//! `chorus-nemesis`: a cluster of real `chorus server` processes, each in a network
//! namespace of its own, under a seeded mix of faults (partitions, packet loss, kill -9,
//! pauses, lagging followers whose leader is then killed, bits flipped at rest, full
//! disks, wall-clock jumps, power losses), with a workload (ordered appends, parallel
//! block writes, dependent transactions or block writes to a volume through the storage
//! layer) whose history is checked afterwards.
//!
//! ```text
//! cargo build --release -p chorus-server -p chorus-nemesis
//! sudo target/release/chorus-nemesis --duration 3600 --nemesis all --out /tmp/nemesis
//! ```
//!
//! Exit status: 0 the history is valid; 1 the checker found anomalies (listed, with the
//! seed and the history file); 2 bad arguments or the harness could not run.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use chorus_nemesis::cluster::NodeOptions;
use chorus_nemesis::nemesis::Kind;
use chorus_nemesis::run::{run, RunOptions, Workload};

/// Real-process fault testing of a Chorus cluster.
#[derive(Parser, Debug)]
#[command(name = "chorus-nemesis", version)]
struct Args {
    /// The `chorus` binary (default: the one beside this binary).
    #[arg(long)]
    chorus: Option<PathBuf>,
    /// Directory for the nodes' data, their logs, the history and the verdict (default:
    /// a new directory under the system's temporary directory).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Workload: `ordered` (appends to an ordered group, tail reads), `parallel` (block
    /// writes to a parallel group, reads at the leader, checked by porcupine: needs Go),
    /// `dependent` (transactions on a dependent group, key reads at any replica) or
    /// `volume` (block writes and reads through the routing client to a volume of
    /// several chunk groups, the control plane on every node; checked as `parallel`).
    #[arg(long, default_value = "ordered")]
    workload: String,
    /// Nodes in the cluster (1 to 15).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u8).range(1..=15))]
    nodes: u8,
    /// Seconds of faults.
    #[arg(long, default_value_t = 60)]
    duration: u64,
    /// The seed of the fault schedule (default: from the clock; printed either way).
    #[arg(long)]
    seed: Option<u64>,
    /// Faults to mix: partition, loss, kill, pause, flip, lag, disk, clock, power, all or
    /// none (comma-separated; rot by hand only; clock needs Debian's faketime, power
    /// needs /dev/fuse).
    #[arg(long, default_value = "all")]
    nemesis: String,
    /// Writer tasks.
    #[arg(long, default_value_t = 8)]
    writers: usize,
    /// Reader tasks.
    #[arg(long, default_value_t = 2)]
    readers: usize,
    /// With the disk nemesis: each node's data directory on a tmpfs of this many MiB
    /// (0: 1024).
    #[arg(long, default_value_t = 0)]
    disk_mib: u64,
    /// Instead of a fault run: measure how long a follower cut off until it is this many
    /// MiB behind takes to catch up once the cut heals (a group of `--workload`'s mode:
    /// ordered, parallel or dependent; prints JSON).
    #[arg(long, default_value_t = 0)]
    catch_up_mib: u64,
    /// With `--catch-up-mib`: bytes per record the writers append.
    #[arg(long, default_value_t = 65536, value_parser = clap::value_parser!(u64).range(1..=(16 << 20)))]
    record_bytes: u64,
    /// The replicas' lease in milliseconds.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(100..=60_000))]
    lease_ms: u64,
}

/// SIGINT and SIGTERM go to one thread (blocked in every other, which inherit the mask):
/// the first asks the run to heal and clean up ([`chorus_nemesis::run::interrupt`]), a
/// second ends the process at once (a later run removes what it left: `net`'s owner
/// files).
fn catch_signals() {
    // SAFETY: plain libc calls on a local signal set, before any other thread exists.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        std::thread::spawn(move || {
            let mut n = 0;
            loop {
                let mut sig = 0;
                if libc::sigwait(&set, &mut sig) != 0 {
                    return;
                }
                n += 1;
                if n == 1 {
                    eprintln!("chorus-nemesis: signal {sig}: healing and cleaning up (again to quit at once)");
                    chorus_nemesis::run::interrupt();
                } else {
                    std::process::exit(130);
                }
            }
        });
    }
}

fn main() -> ExitCode {
    catch_signals();
    let a = Args::parse();
    let workload = match Workload::parse(&a.workload) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("chorus-nemesis: --workload: {e}");
            return ExitCode::from(2);
        }
    };
    let kinds = match Kind::parse_list(&a.nemesis) {
        Ok(k) => k,
        Err(e) => {
            eprintln!("chorus-nemesis: --nemesis: {e}");
            return ExitCode::from(2);
        }
    };
    let chorus = a.chorus.unwrap_or_else(|| {
        std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(|d| d.join("chorus")))
            .unwrap_or_else(|| PathBuf::from("chorus"))
    });
    let seed = a.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64 % 1_000_000_007)
    });
    let dir = a.out.unwrap_or_else(|| {
        std::env::temp_dir().join(format!("chorus-nemesis-{seed}-{}", std::process::id()))
    });
    let node = NodeOptions {
        lease_ms: a.lease_ms,
        heartbeat_ms: (a.lease_ms / 10).max(10),
        disk_mib: a.disk_mib,
        ..NodeOptions::default()
    };
    if a.catch_up_mib > 0 {
        let o = chorus_nemesis::catchup::CatchUpOptions {
            workload,
            chorus,
            dir,
            behind_bytes: a.catch_up_mib << 20,
            record_bytes: a.record_bytes as usize,
            writers: a.writers,
            node,
            timeout: Duration::from_secs(600),
        };
        eprintln!(
            "chorus-nemesis: a follower cut off until {} MiB behind, in {}",
            a.catch_up_mib,
            o.dir.display()
        );
        return match chorus_nemesis::catchup::catch_up(&o) {
            Err(e) => {
                eprintln!("chorus-nemesis: {e}");
                ExitCode::from(2)
            }
            Ok(r) => {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&r).unwrap_or_else(|e| e.to_string())
                );
                ExitCode::SUCCESS
            }
        };
    }
    let o = RunOptions {
        workload,
        chorus,
        dir,
        nodes: a.nodes as usize,
        seed,
        duration: Duration::from_secs(a.duration),
        kinds,
        writers: a.writers,
        readers: a.readers,
        node,
    };
    eprintln!(
        "chorus-nemesis: seed {seed}, {} workload, {} nodes, {} s of {}, in {}",
        a.workload,
        o.nodes,
        a.duration,
        a.nemesis,
        o.dir.display()
    );
    match run(&o) {
        Err(e @ chorus_nemesis::Error::Interrupted(_)) => {
            eprintln!("chorus-nemesis: {e}");
            ExitCode::from(130)
        }
        Err(e) => {
            eprintln!("chorus-nemesis: {e}");
            ExitCode::from(2)
        }
        Ok(r) => {
            let s = &r.verdict.stats;
            println!(
                "chorus-nemesis: seed {} faults={} appends={} records={} committed={} failed={} unknown={} (found {}) reads={} read_records={} log_records={} longest_unavailable_ms={} inbox_overflows={} anomalies={} secs={:.1}",
                r.seed,
                s.faults,
                s.appends,
                s.records,
                s.committed,
                s.failed,
                s.unknown,
                s.unknown_found,
                s.reads,
                s.read_records,
                s.log_records,
                s.longest_unavailable_ms,
                s.inbox_overflows,
                r.verdict.anomalies.len(),
                r.secs
            );
            if !s.longest_unavailable_after.is_empty() {
                println!(
                    "chorus-nemesis: longest unavailability {} ms, {}; after a heal no other fault followed: {} ms",
                    s.longest_unavailable_ms,
                    s.longest_unavailable_after,
                    s.longest_unavailable_alone_ms
                );
            }
            if r.verdict.anomalies.is_empty() {
                ExitCode::SUCCESS
            } else {
                for a in r.verdict.anomalies.iter().take(50) {
                    println!("ANOMALY: {a}");
                }
                println!(
                    "history: {} (replay the schedule: --seed {})",
                    r.history.display(),
                    r.seed
                );
                ExitCode::from(1)
            }
        }
    }
}
