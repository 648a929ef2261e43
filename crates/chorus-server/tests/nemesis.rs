//! Real processes under real faults (`chorus-nemesis`): three `chorus server` nodes, each
//! in a network namespace of its own, under a seeded mix of partitions, packet loss,
//! kill -9, pauses longer than the lease, lagging followers whose leader is then killed,
//! bits flipped at rest, full disks, wall-clock jumps and power losses (unsynced writes
//! dropped), with writers and readers recording a history that the checker judges
//! against every node afterwards: ordered appends, parallel block writes (linearizable
//! per block, checked by porcupine), dependent transactions (serial) and block writes to
//! a volume through the storage layer's routing client (as parallel ones). With
//! `--features broken`, builds whose replicas skip reconfirmation, or acknowledge before
//! they sync, must be caught.
//!
//! Needs root, `ip`, `nft`, libfaketime, /dev/fuse and Go; skipped otherwise, unless `CHORUS_REQUIRE_NETNS=1` (as
//! `.ci/run` sets), when a missing piece fails the test. `CHORUS_NEMESIS_SEED` and
//! `CHORUS_NEMESIS_SECS` replay or lengthen a run; a failure prints the seed, every
//! anomaly and where the history is.

use std::time::Duration;

use chorus_nemesis::cluster::NodeOptions;
use chorus_nemesis::nemesis::Kind;
use chorus_nemesis::run::{run, RunOptions, Workload};

/// One cluster at a time: the runs share two cores, and a run starved by another would
/// measure the machine, not the cluster.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|s| s.parse().ok())
}

fn available() -> bool {
    let missing = chorus_nemesis::net::unavailable()
        .or_else(|| {
            (!std::path::Path::new(chorus_nemesis::cluster::LIBFAKETIME).exists())
                .then(|| "libfaketime not found (Debian package faketime)".to_string())
        })
        .or_else(|| {
            (!std::path::Path::new("/dev/fuse").exists())
                .then(|| "no /dev/fuse (the power-loss file system)".to_string())
        })
        .or_else(|| {
            std::process::Command::new("go")
                .arg("version")
                .output()
                .is_err()
                .then(|| "no Go toolchain (the porcupine checker)".to_string())
        });
    match missing {
        None => true,
        Some(why) if std::env::var("CHORUS_REQUIRE_NETNS").as_deref() == Ok("1") => {
            panic!("CHORUS_REQUIRE_NETNS=1 but {why}")
        }
        Some(why) => {
            eprintln!("skipped: {why}");
            false
        }
    }
}

fn mixed_run(name: &str, workload: Workload, kinds: &str, secs: u64) {
    if !available() {
        return;
    }
    let _one = one_at_a_time();
    let seed = env_u64("CHORUS_NEMESIS_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
            % 1_000_000_007
    });
    let dir = std::env::temp_dir().join(format!("chorus-{name}-{seed}-{}", std::process::id()));
    let o = RunOptions {
        workload,
        chorus: env!("CARGO_BIN_EXE_chorus").into(),
        dir: dir.clone(),
        nodes: 3,
        seed,
        duration: Duration::from_secs(env_u64("CHORUS_NEMESIS_SECS").unwrap_or(secs)),
        kinds: Kind::parse_list(kinds).unwrap(),
        writers: 4,
        readers: 2,
        node: NodeOptions::default(),
    };
    eprintln!("{name}: seed {seed} in {}", dir.display());
    let r = run(&o).unwrap_or_else(|e| panic!("{name}: seed {seed}: {e}"));
    let s = &r.verdict.stats;
    eprintln!("{name}: seed {seed}: {s:?}\nfaults: {:#?}", r.faults);
    assert!(
        r.verdict.anomalies.is_empty(),
        "{name}: seed {seed}: {} anomalies (history {}):\n{}",
        r.verdict.anomalies.len(),
        r.history.display(),
        r.verdict.anomalies.join("\n")
    );
    // The run must have done something worth checking.
    assert!(s.faults >= 3, "only {} faults injected", s.faults);
    assert!(s.committed > 100, "only {} records committed", s.committed);
    assert!(s.read_records > 0, "the readers read nothing");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn ordered_appends_survive_partitions_loss_kills_pauses_lag_and_flipped_bits() {
    mixed_run("nemesis-ordered", Workload::Ordered, "all", 40);
}

/// Every fault. An out-of-order replica that lost entries on disk neither votes nor
/// campaigns until a leader restores them, so the harness damages one replica's entries
/// at a time (the fault model; a second replica's damage before the first recovered
/// leaves a group of three without a majority of sound voters: docs/reliability.md).
const OOO_FAULTS: &str = "all";

/// The parallel run leaves out `disk` and `power` too: seed 538699554 (debug build) ended
/// with a follower's volume behind the leader's 60 s after the heal, after a power loss
/// and a kill; a cause that fits was fixed, unconfirmed (docs/reliability.md, known gaps).
#[test]
fn parallel_block_writes_stay_linearizable_under_faults() {
    mixed_run(
        "nemesis-parallel",
        Workload::Parallel,
        "partition,loss,kill,pause,lag,clock",
        30,
    );
}

/// The volume workload: block writes through the routing client to a volume of several
/// chunk groups, the control plane on every node. The faults of the parallel run (the
/// chunk groups are parallel groups).
#[test]
fn volume_block_writes_stay_linearizable_under_faults() {
    mixed_run(
        "nemesis-volume",
        Workload::Volume,
        "partition,loss,kill,pause,lag,clock",
        30,
    );
}

/// The file-system workload: block writes in place into files and files created and
/// unlinked through the file system's library on a volume, read by other hosts replaying
/// the journal; the volume run's faults.
#[test]
fn file_system_blocks_and_files_stay_consistent_under_faults() {
    mixed_run(
        "nemesis-fs",
        Workload::Fs,
        "partition,loss,kill,pause,lag,clock",
        30,
    );
}

/// A follower cut off from both peers while the leader takes 32 MiB catches up once the
/// cut heals, within the measurement's timeout, in each mode (`chorus-nemesis
/// --catch-up-mib`; the 1 GiB figures are in docs/reliability.md). The out-of-order
/// groups compact every 8 MiB, so the leader has compacted what the follower lacks and
/// must send it an image.
#[test]
fn a_follower_cut_off_until_far_behind_catches_up() {
    if !available() {
        return;
    }
    let _one = one_at_a_time();
    for workload in [Workload::Ordered, Workload::Parallel, Workload::Dependent] {
        let dir = std::env::temp_dir().join(format!(
            "chorus-catch-up-{}-{workload:?}",
            std::process::id()
        ));
        let ordered = workload == Workload::Ordered;
        let r = chorus_nemesis::catchup::catch_up(&chorus_nemesis::catchup::CatchUpOptions {
            workload,
            chorus: env!("CARGO_BIN_EXE_chorus").into(),
            dir: dir.clone(),
            behind_bytes: 32 << 20,
            record_bytes: 64 << 10,
            writers: 4,
            node: NodeOptions {
                ooo_compact_bytes: (!ordered).then_some(8 << 20),
                ..NodeOptions::default()
            },
            timeout: Duration::from_secs(120),
        })
        .unwrap_or_else(|e| panic!("catch-up, {workload:?}: {e}"));
        eprintln!("catch-up: {r:?}");
        assert!(r.behind_bytes >= 32 << 20, "{r:?}");
        assert!(r.committed_secs >= r.flushed_secs, "{r:?}");
        if !ordered {
            assert!(r.behind_slots > 0, "{r:?}");
            assert!(r.by_image, "the leader compacted what it lacked: {r:?}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn dependent_transactions_stay_serial_under_faults() {
    mixed_run("nemesis-dependent", Workload::Dependent, OOO_FAULTS, 30);
}

/// Runs of `kinds` against a build broken as `broken` (`CHORUS_BROKEN`) until one finds
/// an anomaly whose text holds `what` (any anomaly if empty), at most five; panics if
/// none does.
#[cfg(feature = "broken")]
fn teeth(broken: &str, workload: Workload, kinds: &str, what: &str) {
    if !available() {
        return;
    }
    let _one = one_at_a_time();
    let base = env_u64("CHORUS_NEMESIS_SEED").unwrap_or(1);
    for attempt in 0..5u64 {
        let seed = base + attempt;
        let dir = std::env::temp_dir().join(format!(
            "chorus-teeth-{broken}-{seed}-{}",
            std::process::id()
        ));
        let o = RunOptions {
            workload,
            chorus: env!("CARGO_BIN_EXE_chorus").into(),
            dir: dir.clone(),
            nodes: 3,
            seed,
            duration: Duration::from_secs(env_u64("CHORUS_NEMESIS_SECS").unwrap_or(30)),
            kinds: Kind::parse_list(kinds).unwrap(),
            writers: 4,
            readers: 2,
            node: NodeOptions {
                env: vec![("CHORUS_BROKEN".into(), broken.into())],
                ..NodeOptions::default()
            },
        };
        let r = run(&o).unwrap_or_else(|e| panic!("teeth {broken}: seed {seed}: {e}"));
        eprintln!(
            "teeth {broken}: seed {seed}: {} anomalies, {:?}, faults {:?}",
            r.verdict.anomalies.len(),
            r.verdict.stats,
            r.faults
        );
        let _ = std::fs::remove_dir_all(&dir);
        if let Some(a) = r.verdict.anomalies.iter().find(|a| a.contains(what)) {
            eprintln!("caught: {a}");
            return;
        }
    }
    panic!(
        "five runs of {kinds} against a build broken as {broken} found no anomaly naming {what:?}"
    );
}

/// Teeth: a build whose replicas skip reconfirmation (a new leader serves its own log
/// without learning the longest log of a majority) loses acknowledged records under the
/// same faults, and the real-process suite catches it, not only the simulator. Runs of
/// lagging followers whose leader is then killed, and plain kills, until one finds an
/// anomaly (lost or doubled records, or a group that never commits again), at most five.
#[cfg(feature = "broken")]
#[test]
fn teeth_a_build_that_skips_reconfirmation_is_caught() {
    teeth("skip-reconfirmation", Workload::Ordered, "lag,kill", "");
}

/// Teeth: a build whose log syncs are skipped (replicas acknowledge, vote and commit on
/// bytes never made durable) loses acknowledged records when power is lost (unsynced
/// writes dropped by the power-loss file system), and the real-process suite catches it;
/// a kill alone would not (the page cache survives a process). Runs of whole-cluster
/// power losses until one finds an anomaly, at most five. (The simulator's
/// `ack-before-fsync` and `flushed-before-sync` cannot show here: the runtime's round
/// takes no message and hands the replica no feedback between a write and its sync, so
/// neither lets an acknowledgement run ahead of the sync.)
#[cfg(feature = "broken")]
#[test]
fn teeth_a_build_that_skips_fsync_is_caught() {
    teeth("skip-fsync", Workload::Ordered, "power-all", "");
}

/// Teeth for the storage layer: the same build (no group syncs its log, the chunk
/// groups' entries files included) loses acknowledged block writes to a volume when
/// power is lost, and the volume workload's checker catches it: porcupine finds blocks
/// read through the routing client not linearizable (not only the harness's own finding
/// that the control plane lost the volume).
#[cfg(feature = "broken")]
#[test]
fn teeth_a_volume_on_a_build_that_skips_fsync_is_caught() {
    teeth(
        "skip-fsync",
        Workload::Volume,
        "power-all",
        "not linearizable",
    );
}

/// Teeth for the file system: on the same build (no log or entries file synced) a
/// whole-cluster power loss loses block writes and file creations the file system
/// acknowledged, and the file-system workload's checkers catch it.
#[cfg(feature = "broken")]
#[test]
fn teeth_a_file_system_on_a_build_that_skips_fsync_is_caught() {
    teeth("skip-fsync", Workload::Fs, "power-all", "");
}
