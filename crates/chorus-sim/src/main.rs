//! `chorus-sim`: runs seeded simulations of whole Chorus clusters and reports violations.
//!
//! ```text
//! chorus-sim --seeds 2000 --start 0 --mode piggyback
//! chorus-sim --seed 1234 -v          # replay one seed
//! chorus-sim --ooo parallel --seeds 500   # an out-of-order group mode
//! chorus-sim --volume --seeds 500         # a volume over several chunk groups
//! ```

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;

use chorus_sim::run::{parse_commit_mode, run_batch, RunOptions};
use chorus_sim::MS;

/// Deterministic cluster simulator for Chorus.
#[derive(Parser, Debug)]
#[command(name = "chorus-sim", version)]
struct Args {
    /// Number of seeds to run.
    #[arg(long, default_value_t = 200)]
    seeds: u64,
    /// First seed.
    #[arg(long, default_value_t = 0)]
    start: u64,
    /// Run exactly this seed (replay), printing its counters.
    #[arg(long)]
    seed: Option<u64>,
    /// Ordered groups: commit-point mode, piggyback (the default), sync or async.
    #[arg(long)]
    mode: Option<String>,
    /// Stop starting new seeds after this many seconds (0: no limit).
    #[arg(long, default_value_t = 0)]
    time_budget: u64,
    /// Worker threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Simulated seconds of faults per seed.
    #[arg(long, default_value_t = 3)]
    fault_secs: u64,
    /// Run without faults (workload only).
    #[arg(long)]
    no_faults: bool,
    /// Out-of-order groups: no operator leader transfers (the trajectories of seeds found
    /// before transfers existed).
    #[arg(long)]
    no_transfers: bool,
    /// Out-of-order groups: no operator membership changes and no spare node (the
    /// trajectories of seeds found before membership changes existed).
    #[arg(long)]
    no_changes: bool,
    /// Out-of-order groups: replicas campaign without a pre-vote (the trajectories of
    /// seeds found before pre-vote existed).
    #[arg(long)]
    no_pre_vote: bool,
    /// Out-of-order groups: leaders send whole images only, never a partial one (the
    /// trajectories of seeds found before partial images existed).
    #[arg(long)]
    full_images: bool,
    /// Out-of-order parallel groups: no seed commits in conflict order (the trajectories
    /// of seeds found before conflict order existed).
    #[arg(long)]
    no_conflict_order: bool,
    /// Out-of-order groups: no damage at rest (the trajectories of seeds found before
    /// storage faults were injected in out-of-order runs).
    #[arg(long)]
    no_corrupt: bool,
    /// Out-of-order groups: operators trim any node, followers too, up to its applied head
    /// (by default only the serving leader, up to what every live follower holds): the
    /// election gap of compaction that docs/reliability.md lists.
    #[arg(long)]
    trim_followers: bool,
    /// Ordered groups: followers ask for a gap to be resent after this many early
    /// messages, 0 never (default: by seed, 0 to 3; `--gap-resend 0` gives the trajectories
    /// of seeds found before gap resends existed).
    #[arg(long)]
    gap_resend: Option<usize>,
    /// Leaders resend a copy unacknowledged for this many median round trips, 0 never
    /// (default: by seed, 0, 2 or 4; `--timed-resend 0` gives the trajectories of seeds
    /// found before timed resends existed). Ordered and out-of-order groups.
    #[arg(long)]
    timed_resend: Option<u32>,
    /// Bytes of zeros each node's log (or out-of-order store) keeps written past its end
    /// (default: by seed, 0 to 64 KiB; `--preallocate 0` gives the trajectories of seeds
    /// found before zeros were written ahead).
    #[arg(long)]
    preallocate: Option<u64>,
    /// No operator trims during the faulty phase (the trajectories of seeds found before
    /// them). Ordered groups: by default replicas trim their committed log at a rate drawn
    /// per seed, so followers fall behind the leader's log start and are rebased.
    /// Out-of-order groups: by default an operator asks a node at random to checkpoint and
    /// compact below a slot every 300–900 ms.
    #[arg(long)]
    no_trims: bool,
    /// Ordered groups: the group is a mirror of a simulated primary (raw-write access
    /// mode, PALF section 5.2), with access-mode switches in two seeds of three.
    #[arg(long)]
    mirror: bool,
    /// Ordered groups: each injected corruption damages two replicas at once, in
    /// disjoint ranges (each repairs from the other).
    #[arg(long)]
    double_damage: bool,
    /// Deliberately broken variant: skip-reconfirmation, ack-before-fsync, guess-on-rebase,
    /// flushed-before-sync or ack-past-sync-point (the production driver step)
    /// or mirror-start-working (with --mirror); with --ooo: no-ghost-guard, no-lost-guard
    /// ack-before-sync or ack-before-apply (the production driver) (needs the `broken`
    /// feature).
    #[arg(long)]
    broken: Option<String>,
    /// Simulate an out-of-order group instead: parallel or dependent.
    #[arg(long)]
    ooo: Option<String>,
    /// Simulate a volume over several parallel-mode chunk groups instead, with shared
    /// node crashes and partitions and the storage layer's checks (linearizable block
    /// reads, no acknowledged write lost, the snapshot guarantee, a majority up to date).
    /// `--broken no-read-barrier` serves reads without the leader-read barrier,
    /// `--broken unconfirmed-reads` without a quorum confirming the leader.
    #[arg(long, conflicts_with = "ooo")]
    volume: bool,
    /// With --volume: chunks in the volume.
    #[arg(long, default_value_t = 3, requires = "volume")]
    chunks: u64,
    /// Print counters per seed.
    #[arg(short, long)]
    verbose: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(m) = &args.ooo {
        return run_ooo(&args, m);
    }
    if args.volume {
        return run_volume(&args);
    }
    if let Some(flag) = ooo_only_flag(&args) {
        eprintln!("chorus-sim: {flag} applies to out-of-order groups only (with --ooo)");
        return ExitCode::from(2);
    }
    let mode_name = args.mode.as_deref().unwrap_or("piggyback");
    let Some(mode) = parse_commit_mode(mode_name) else {
        eprintln!("chorus-sim: --mode {mode_name:?} is not one of piggyback, sync, async");
        return ExitCode::from(2);
    };
    let mut opts = RunOptions::default();
    opts.cluster.commit_mode = mode;
    opts.faults = !args.no_faults;
    opts.fault_time = args.fault_secs * 1_000 * MS;
    opts.cluster.gap_resend_after = args.gap_resend;
    opts.cluster.timed_resend = args.timed_resend;
    opts.cluster.preallocate = args.preallocate;
    opts.trims = !args.no_trims;
    opts.mirror = args.mirror;
    opts.double_damage = args.double_damage;
    if let Some(b) = &args.broken {
        #[cfg(feature = "broken")]
        {
            use chorus_core::replica::Broken;
            opts.cluster.broken = match b.as_str() {
                "skip-reconfirmation" => Broken::SkipReconfirmation,
                "ack-before-fsync" => Broken::AckBeforeFsync,
                "guess-on-rebase" => Broken::GuessOnRebase,
                "mirror-start-working" => Broken::MirrorStartWorking,
                // The driver step's own bug, not the replica's.
                "flushed-before-sync" => {
                    opts.cluster.step.broken_flushed_before_sync = true;
                    Broken::None
                }
                "ack-past-sync-point" => {
                    opts.cluster.step.broken_ack_past_sync_point = true;
                    Broken::None
                }
                _ => {
                    eprintln!(
                        "chorus-sim: --broken {b:?} is not skip-reconfirmation, ack-before-fsync, guess-on-rebase, mirror-start-working, flushed-before-sync or ack-past-sync-point"
                    );
                    return ExitCode::from(2);
                }
            };
        }
        #[cfg(not(feature = "broken"))]
        {
            eprintln!("chorus-sim: --broken {b:?} needs a build with --features broken");
            return ExitCode::from(2);
        }
    }
    let (start, count) = match args.seed {
        Some(s) => (s, 1),
        None => (args.start, args.seeds),
    };
    let deadline =
        (args.time_budget > 0).then(|| Instant::now() + Duration::from_secs(args.time_budget));
    let t0 = Instant::now();
    let reports = run_batch(start, count, &opts, args.threads, deadline);
    let broken = args.broken.as_ref().map_or(String::new(), |b| {
        format!(" --features broken -- --broken {b}")
    });
    let sep = if broken.is_empty() { " --" } else { "" };
    let mut gap = args
        .gap_resend
        .map_or(String::new(), |g| format!(" --gap-resend {g}"));
    if let Some(p) = args.preallocate {
        gap.push_str(&format!(" --preallocate {p}"));
    }
    if let Some(t) = args.timed_resend {
        gap.push_str(&format!(" --timed-resend {t}"));
    }
    if args.no_trims {
        gap.push_str(" --no-trims");
    }
    if args.mirror {
        gap.push_str(" --mirror");
    }
    if args.double_damage {
        gap.push_str(" --double-damage");
    }
    let sum = chorus_sim::batch::report(
        &reports,
        args.verbose || args.seed.is_some(),
        |r| {
            format!(
                "seed {}: committed_end={} {:?}",
                r.seed, r.committed_end, r.stats
            )
        },
        |seed| {
            format!(
                "cargo run --release -p chorus-sim{broken}{sep} --seed {seed} --mode {mode_name}{gap}"
            )
        },
    );
    let (bad, totals) = (sum.failed, &sum.totals);
    println!(
        "chorus-sim: mode={} seeds={} (from {}) violations={} elapsed={:.1}s elections={} crashes={} appends={} committed={} failed={} messages={} gap_resend_requests={} timed_resends={} trims={} rebases={} outcomes_unknown={} corruptions={} corrupted_beside_other_damage={} repairs={} damage_discarded={} damage_rebased={}",
        mode_name,
        reports.len(),
        start,
        bad,
        t0.elapsed().as_secs_f64(),
        totals.get("leader_elections").unwrap_or(&0),
        totals.get("crashes").unwrap_or(&0),
        totals.get("appends_accepted").unwrap_or(&0),
        totals.get("committed").unwrap_or(&0),
        totals.get("failed").unwrap_or(&0),
        totals.get("messages_delivered").unwrap_or(&0),
        totals.get("gap_resend_requests").unwrap_or(&0),
        totals.get("timed_resends").unwrap_or(&0),
        totals.get("trims").unwrap_or(&0),
        totals.get("rebases").unwrap_or(&0),
        totals.get("outcomes_unknown").unwrap_or(&0),
        totals.get("corruptions").unwrap_or(&0),
        totals.get("corrupted_beside_other_damage").unwrap_or(&0),
        totals.get("repairs").unwrap_or(&0),
        totals.get("damage_discarded").unwrap_or(&0),
        totals.get("damage_rebased").unwrap_or(&0),
    );
    if args.mirror {
        let t = |k: &str| totals.get(k).copied().unwrap_or(0);
        println!(
            "chorus-sim: mirror: writes={} committed={} failed={} mirrored_groups_committed={} access_mode_switches={} misaligned={}",
            t("mirrors_accepted"),
            t("mirror_committed"),
            t("mirror_failed"),
            t("mirrored_groups_committed"),
            t("access_mode_switches"),
            t("mirror_misaligned"),
        );
    }
    if bad > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// The first flag given that only out-of-order runs read, if any.
fn ooo_only_flag(a: &Args) -> Option<&'static str> {
    [
        (a.no_transfers, "--no-transfers"),
        (a.no_changes, "--no-changes"),
        (a.no_pre_vote, "--no-pre-vote"),
        (a.full_images, "--full-images"),
        (a.no_conflict_order, "--no-conflict-order"),
        (a.no_corrupt, "--no-corrupt"),
        (a.trim_followers, "--trim-followers"),
    ]
    .into_iter()
    .find_map(|(set, name)| set.then_some(name))
}

/// The first flag given that only ordered runs read, if any: an out-of-order run refuses
/// it rather than run without it.
fn ordered_only_flag(a: &Args) -> Option<&'static str> {
    [
        (a.mode.is_some(), "--mode"),
        (a.gap_resend.is_some(), "--gap-resend"),
        (a.mirror, "--mirror"),
        (a.double_damage, "--double-damage"),
    ]
    .into_iter()
    .find_map(|(set, name)| set.then_some(name))
}

fn run_ooo(args: &Args, mode: &str) -> ExitCode {
    use chorus_sim::ooo::{parse_mode, run_batch, OooOptions};
    let Some(m) = parse_mode(mode) else {
        eprintln!("chorus-sim: --ooo {mode:?} is not one of parallel, dependent");
        return ExitCode::from(2);
    };
    if let Some(flag) = ordered_only_flag(args) {
        eprintln!("chorus-sim: {flag} applies to ordered groups only, not with --ooo");
        return ExitCode::from(2);
    }
    let mut o = OooOptions {
        mode: m,
        faults: !args.no_faults,
        fault_time: args.fault_secs * 1_000 * MS,
        transfers: !args.no_transfers,
        changes: !args.no_changes,
        trims: !args.no_trims,
        pre_vote: !args.no_pre_vote,
        partial_images: !args.full_images,
        conflict_order: !args.no_conflict_order,
        corrupt: !args.no_corrupt,
        trim_followers: args.trim_followers,
        preallocate: args.preallocate,
        timed_resend: args.timed_resend,
        ..OooOptions::default()
    };
    let mut broken_flag = String::new();
    if args.no_changes {
        broken_flag.push_str(" --no-changes");
    }
    if args.no_transfers {
        broken_flag.push_str(" --no-transfers");
    }
    if args.no_pre_vote {
        broken_flag.push_str(" --no-pre-vote");
    }
    if args.full_images {
        broken_flag.push_str(" --full-images");
    }
    if args.no_conflict_order {
        broken_flag.push_str(" --no-conflict-order");
    }
    if args.no_corrupt {
        broken_flag.push_str(" --no-corrupt");
    }
    if args.trim_followers {
        broken_flag.push_str(" --trim-followers");
    }
    if let Some(p) = args.preallocate {
        broken_flag.push_str(&format!(" --preallocate {p}"));
    }
    if let Some(t) = args.timed_resend {
        broken_flag.push_str(&format!(" --timed-resend {t}"));
    }
    if let Some(b) = &args.broken {
        if ![
            "no-ghost-guard",
            "no-lost-guard",
            "ack-before-sync",
            "ack-before-apply",
        ]
        .contains(&b.as_str())
        {
            eprintln!(
                "chorus-sim: --broken {b:?} with --ooo must be no-ghost-guard, no-lost-guard, ack-before-sync or ack-before-apply"
            );
            return ExitCode::from(2);
        }
        if !cfg!(feature = "broken") {
            eprintln!("chorus-sim: --broken {b:?} needs a build with --features broken");
            return ExitCode::from(2);
        }
        match b.as_str() {
            "no-ghost-guard" => o.ghost_guard = false,
            "no-lost-guard" => o.broken_lost_guard = true,
            "ack-before-apply" => o.broken_ack_before_apply = true,
            _ => o.broken_ack_before_sync = true,
        }
        broken_flag += &format!(" --broken {b}");
    }
    let (start, count) = match args.seed {
        Some(s) => (s, 1),
        None => (args.start, args.seeds),
    };
    let deadline =
        (args.time_budget > 0).then(|| Instant::now() + Duration::from_secs(args.time_budget));
    let t0 = Instant::now();
    let reports = run_batch(start, count, &o, args.threads, deadline);
    let features = if args.broken.is_none() {
        ""
    } else {
        " --features broken"
    };
    let sum = chorus_sim::batch::report(
        &reports,
        args.verbose || args.seed.is_some(),
        |r| format!("seed {}: {:?}", r.seed, r.stats),
        |seed| {
            format!(
                "cargo run --release -p chorus-sim{features} -- --ooo {mode} --seed {seed}{broken_flag}"
            )
        },
    );
    let (bad, totals) = (sum.failed, &sum.totals);
    let t = |k: &str| totals.get(k).copied().unwrap_or(0);
    println!(
        "chorus-sim: ooo={mode} seeds={} (from {start}) violations={bad} elapsed={:.1}s appends={} records={} committed={} failed={} crashes={} terms_served={} applied={} messages={} checkpoints={} images_installed={} partial_installs={} partial_refused_live={} unknown_results={} transfers_asked={} transfers_completed={} transfers_not_completed={} changes_asked={} membership_changes={} trims_asked={} trims_done={} pre_votes_live={} pre_votes_refused_by_lease_live={} campaigns_live={} handoffs_live={} hole_resends_live={} timed_resends_live={} groups_split={} conflict_order_checks={} corruptions={} damaged_opens={} votes_refused_lost_live={} vote_parts_sent_live={} results_checked_applied={}",
        reports.len(),
        t0.elapsed().as_secs_f64(),
        t("appends"),
        t("records"),
        t("committed"),
        t("failed"),
        t("crashes"),
        t("terms_served"),
        t("applied"),
        t("messages"),
        t("checkpoints"),
        t("images_installed"),
        t("partial_installs"),
        t("partial_images_refused_live"),
        t("unknown_results"),
        t("transfers_asked"),
        t("transfers_completed"),
        t("transfers_not_completed"),
        t("changes_asked"),
        t("membership_changes"),
        t("trims_asked"),
        t("trims_done"),
        t("pre_votes_live"),
        t("pre_votes_refused_by_lease_live"),
        t("campaigns_live"),
        t("handoffs_live"),
        t("hole_resends_live"),
        t("timed_resends_live"),
        t("groups_split"),
        t("conflict_order_checks"),
        t("corruptions"),
        t("damaged_opens"),
        t("votes_refused_lost_live"),
        t("vote_parts_sent_live"),
        t("results_checked_applied"),
    );
    if bad > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

fn run_volume(args: &Args) -> ExitCode {
    use chorus_sim::ooo::volume::{run_volume_batch, ReadBarrier, VolumeOptions};
    let flag = ordered_only_flag(args)
        .or_else(|| ooo_only_flag(args))
        .or_else(|| {
            [
                (args.no_trims, "--no-trims"),
                (args.preallocate.is_some(), "--preallocate"),
                (args.timed_resend.is_some(), "--timed-resend"),
            ]
            .into_iter()
            .find_map(|(set, name)| set.then_some(name))
        });
    if let Some(flag) = flag {
        eprintln!("chorus-sim: {flag} does not apply to --volume runs");
        return ExitCode::from(2);
    }
    if args.chunks == 0 || args.chunks > 64 {
        eprintln!("chorus-sim: --chunks {} must be 1 to 64", args.chunks);
        return ExitCode::from(2);
    }
    let mut o = VolumeOptions {
        chunks: args.chunks,
        faults: !args.no_faults,
        fault_time: args.fault_secs * 1_000 * MS,
        ..VolumeOptions::default()
    };
    let mut extra = String::new();
    if args.chunks != 3 {
        extra.push_str(&format!(" --chunks {}", args.chunks));
    }
    match args.broken.as_deref() {
        None => {}
        Some("no-read-barrier") => {
            o.read_barrier = ReadBarrier::None;
            extra.push_str(" --broken no-read-barrier");
        }
        Some("unconfirmed-reads") => {
            o.read_barrier = ReadBarrier::AppliedOnly;
            extra.push_str(" --broken unconfirmed-reads");
        }
        Some(b) => {
            eprintln!(
                "chorus-sim: --broken {b:?} with --volume must be no-read-barrier or unconfirmed-reads"
            );
            return ExitCode::from(2);
        }
    }
    let (start, count) = match args.seed {
        Some(s) => (s, 1),
        None => (args.start, args.seeds),
    };
    let deadline =
        (args.time_budget > 0).then(|| Instant::now() + Duration::from_secs(args.time_budget));
    let t0 = Instant::now();
    let reports = run_volume_batch(start, count, &o, args.threads, deadline);
    let sum = chorus_sim::batch::report(
        &reports,
        args.verbose || args.seed.is_some(),
        |r| format!("seed {}: {:?}", r.seed, r.stats),
        |seed| format!("cargo run --release -p chorus-sim -- --volume --seed {seed}{extra}"),
    );
    let t = |k: &str| sum.totals.get(k).copied().unwrap_or(0);
    println!(
        "chorus-sim: volume chunks={} seeds={} (from {start}) violations={} elapsed={:.1}s volume_writes={} acked={} across_chunks={} block_reads_checked={} snapshots_completed={} node_crashes={} node_partitions={} changes_asked={} majority_samples={} images_installed={} reads_at_deposed_leader={}",
        args.chunks,
        reports.len(),
        sum.failed,
        t0.elapsed().as_secs_f64(),
        t("volume_writes"),
        t("volume_writes_acked"),
        t("volume_writes_across_chunks"),
        t("block_reads_checked"),
        t("snapshots_completed"),
        t("node_crashes"),
        t("node_partitions"),
        t("changes_asked"),
        t("majority_samples"),
        t("images_installed"),
        t("reads_at_deposed_leader"),
    );
    if sum.failed > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
