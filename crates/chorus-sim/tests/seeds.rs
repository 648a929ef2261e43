//! Seeded simulation runs: a batch of the correct protocol must be clean, and each
//! deliberately broken variant must be caught (the simulator has teeth).

use chorus_core::replica::CommitMode;
use chorus_sim::run::{run_batch, run_seed, RunOptions};
use chorus_sim::MS;

fn opts() -> RunOptions {
    RunOptions {
        fault_time: 2_000 * MS,
        settle_time: 3_000 * MS,
        ..RunOptions::default()
    }
}

/// Counter `k` summed over the runs.
fn total(r: &[chorus_sim::run::SeedReport], k: &str) -> u64 {
    r.iter().map(|x| x.stats.get(k).copied().unwrap_or(0)).sum()
}

fn assert_clean(reports: &[chorus_sim::run::SeedReport]) {
    for r in reports {
        assert!(
            r.violations.is_empty(),
            "seed {} violated: {:#?}",
            r.seed,
            r.violations
        );
    }
}

#[test]
fn piggyback_seeds_are_clean() {
    let r = run_batch(10_000, 24, &opts(), 2, None);
    assert_eq!(r.len(), 24);
    assert_clean(&r);
    // The runs did real work: elections, crashes, commits and some failed appends.
    let sum = |k: &str| total(&r, k);
    assert!(
        sum("leader_elections") >= 24,
        "elections: {}",
        sum("leader_elections")
    );
    assert!(sum("committed") > 1000);
    assert!(sum("crashes") > 0);
    // Followers overtaken on an append asked for it again (the seeds that turn it on).
    assert!(sum("gap_resend_requests") > 0);
}

#[test]
fn sync_and_async_commit_modes_are_clean() {
    for mode in [CommitMode::Sync, CommitMode::Async { interval: 10 * MS }] {
        let mut o = opts();
        o.cluster.commit_mode = mode;
        assert_clean(&run_batch(20_000, 8, &o, 2, None));
    }
}

#[test]
fn replay_is_deterministic() {
    let a = run_seed(42, &opts());
    let b = run_seed(42, &opts());
    assert_eq!(a.stats, b.stats);
    assert_eq!(a.committed_end, b.committed_end);
    assert_eq!(a.violations, b.violations);
}

/// Seeds that once found bugs, kept so the bugs stay fixed: 136 (a follower past a lost
/// message waited for buffered appends instead of asking for catch-up), 263 (pending appends
/// past a shorter new log were never decided), 5 (a removed voter's priority blocked every
/// election), 200174 in async mode (a granted lease protected nobody, so voters refused the
/// candidate they had just granted), 1256 (voters added while away never pinged the
/// members that counted on them, so no majority looked alive and nobody campaigned), 604
/// and 986 (the fault injector corrupted the same group on two of three replicas — a
/// majority, beyond the fault model — and the group rightly halted), 2960 and 4573 (two
/// leaders sealed groups with the same body at one LSN; the accumulated checksum chained
/// bodies only, so a follower holding the older copy "matched" and kept a header whose
/// proposal id differed from the committed one — the chain now covers proposal ids),
/// 101006 in sync mode (a restarted replica whose log held more than a block of groups that
/// all piggybacked committed 0 recovered an index that did not reach its committed point,
/// and its next campaign panicked naming that point). All were found before followers
/// asked for gaps to be resent, before logs wrote zeros ahead and before leaders resent
/// on time and before logs were trimmed under faults, so they run without any
/// (`--gap-resend 0 --preallocate 0 --timed-resend 0 --no-trims`), on the trajectories
/// that found them.
#[test]
fn regression_seeds() {
    let old = || {
        let mut o = RunOptions::default();
        o.cluster.gap_resend_after = Some(0);
        o.cluster.preallocate = Some(0);
        o.cluster.timed_resend = Some(0);
        o.trims = false;
        o
    };
    for seed in [136, 263, 5, 1256, 604, 986, 2960, 4573] {
        let r = run_seed(seed, &old());
        assert!(r.violations.is_empty(), "seed {seed}: {:#?}", r.violations);
    }
    let mut o = old();
    o.cluster.commit_mode = CommitMode::Async { interval: 10 * MS };
    let r = run_seed(200_174, &o);
    assert!(r.violations.is_empty(), "seed 200174: {:#?}", r.violations);
    let mut o = old();
    o.cluster.commit_mode = CommitMode::Sync;
    let r = run_seed(101_006, &o);
    assert!(r.violations.is_empty(), "seed 101006: {:#?}", r.violations);
}

/// Seed 52626 (the default options): a voter that led under the first membership, then
/// stood apart while two changes replaced a voter by a new node (rebased onto the
/// leader's trimmed log) that won the next term, was left with its own membership, in
/// which that leader is no member. Its log ended below the leader's start, so the leader
/// sent it only rebases, which carried no membership: it dropped each one as from a
/// non-member, for good, and the appends it had accepted as leader never got a result.
/// A leader now attaches its membership to a rebase as to an append, until the follower
/// acknowledges it.
#[test]
fn a_voter_behind_a_new_leaders_start_hears_its_rebases() {
    let r = run_seed(52_626, &RunOptions::default());
    assert!(r.violations.is_empty(), "seed 52626: {:#?}", r.violations);
    assert!(
        r.stats.get("rebases").copied().unwrap_or(0) >= 4,
        "the voter was rebased: {:?}",
        r.stats
    );
}

/// Pipelined syncs (a batch written while the one before it syncs, each reported only up
/// to the point its sync began at). Seeds 290 and 100095 caught writes made after an
/// `fdatasync` failed and before the failure was reported: the next block's creation
/// synced them beside the write the failure lost, leaving a hole inside a complete block,
/// which recovery refuses to open. A failed sync now stops the log's writes as it returns.
#[test]
fn pipelined_sync_seeds() {
    let r = run_seed(290, &RunOptions::default());
    assert!(r.violations.is_empty(), "seed 290: {:#?}", r.violations);
    let mut o = RunOptions::default();
    o.cluster.commit_mode = CommitMode::Sync;
    let r = run_seed(100_095, &o);
    assert!(r.violations.is_empty(), "seed 100095: {:#?}", r.violations);
}

/// Mirror groups (PALF section 5.2): a simulated primary's groups mirrored under the full
/// fault mix, with failovers and switchovers. Seeds 7, 21, 26, 31, 35, 36 and 37 caught a
/// design in which a mirror's new leader re-sealed the last group of its log under its own
/// proposal id instead of writing a StartWorking group: that group could already be
/// committed, and its header changed under the replicas that held it so. Seeds 34 and 40
/// caught a new leader whose inherited uncommitted log filled the window, so that it
/// refused the very mirror write that would commit it.
#[test]
fn mirror_seeds_are_clean() {
    let o = RunOptions {
        mirror: true,
        ..RunOptions::default()
    };
    let mut seeds = vec![7, 21, 26, 31, 34, 35, 36, 37, 40];
    seeds.extend(30_000..30_012);
    let r: Vec<_> = seeds.iter().map(|s| run_seed(*s, &o)).collect();
    assert_clean(&r);
    let sum = |k: &str| total(&r, k);
    // Real work: mirrored groups committed, switches made, and writes refused or failed.
    assert!(sum("mirrored_groups_committed") > 1000);
    assert!(sum("access_mode_switches") > 0);
    assert!(sum("leader_elections") >= seeds.len() as u64);
}

/// Two replicas damaged at once in disjoint ranges (`--double-damage`), each repairing
/// from the other. Seeds 1, 260 and others halted while a replica under repair answered
/// "damaged" to every request, whatever the range; seeds 5084, 5252, 6121, 6535 and 6790
/// (adjacent ranges in one block) waited for good while a read of the copy went on into
/// the reader's own damage past the range's end. The batch must have damaged a second
/// replica beside another's damage, and repaired.
#[test]
fn double_damage_seeds_are_clean() {
    let o = RunOptions {
        double_damage: true,
        ..RunOptions::default()
    };
    let mut seeds = vec![5084, 5252, 6121, 6535, 6790];
    seeds.extend(40_000..40_016);
    let r: Vec<_> = seeds.iter().map(|s| run_seed(*s, &o)).collect();
    assert_clean(&r);
    let sum = |k: &str| total(&r, k);
    assert!(sum("corrupted_beside_other_damage") >= 5);
    assert!(sum("repairs") >= 10, "repairs: {}", sum("repairs"));
}
