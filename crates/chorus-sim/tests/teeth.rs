//! The simulator has teeth: deliberately broken protocol variants (compiled only with the
//! `broken` feature) must be caught within the CI budget. Run with
//! `cargo test -p chorus-sim --features broken --test teeth`.

use chorus_core::replica::Broken;
use chorus_sim::run::{run_seed, RunOptions};
use chorus_sim::MS;

/// Whether seed `seed` of the broken variant in `o` is caught: a violation the checkers
/// report, or a replica's own invariant check (debug builds) failing on what the variant
/// did — for example a follower told to truncate below the committed point that a lost
/// acknowledged group left behind. Either way the run did not pass as correct.
fn caught(seed: u64, o: &RunOptions) -> bool {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_seed(seed, o))) {
        Ok(r) => !r.violations.is_empty(),
        Err(_) => true,
    }
}

fn opts() -> RunOptions {
    RunOptions {
        fault_time: 3_000 * MS,
        settle_time: 3_000 * MS,
        ..RunOptions::default()
    }
}

/// Skipping reconfirmation lets a candidate serve a log that lacks committed groups; the
/// simulator must find that within its budget.
#[test]
fn skipping_reconfirmation_is_caught() {
    let mut o = opts();
    o.fault_time = 3_000 * MS;
    o.cluster.broken = Broken::SkipReconfirmation;
    let found = (0..400u64).find(|s| caught(*s, &o));
    assert!(
        found.is_some(),
        "no violation found with reconfirmation skipped"
    );
}

/// Acknowledging written-but-unsynced log lets a power outage lose committed records; the
/// simulator must find that within its budget.
#[test]
fn acknowledging_before_fsync_is_caught() {
    let mut o = opts();
    o.cluster.broken = Broken::AckBeforeFsync;
    // Slower syncs widen the window in which an acknowledged group is not yet durable.
    o.disk = (2 * MS, 20 * MS);
    let found = (0..400u64).find(|s| caught(*s, &o));
    assert!(found.is_some(), "no violation found with acks before fsync");
}

/// The production driver step ([`chorus_runtime::ordered::execute`]), broken to report a
/// write durable as soon as it is written: the leader counts its own copy and followers
/// acknowledge before any sync, so a crash that loses unsynced writes loses committed
/// records. The simulator runs that very step, so it must catch it.
#[test]
fn a_driver_step_that_reports_writes_durable_before_their_sync_is_caught() {
    let mut o = opts();
    o.cluster.step.broken_flushed_before_sync = true;
    o.disk = (2 * MS, 20 * MS);
    let found = (0..400u64).find(|s| caught(*s, &o));
    assert!(
        found.is_some(),
        "no violation found with writes reported durable before their sync"
    );
}

/// The production sync report ([`chorus_runtime::ordered::sync_finished`]), broken to
/// report the log durable up to everything written when the sync ends rather than to the
/// point it covered: with syncs pipelined, a batch written while the previous batch
/// synced is acknowledged before its own sync, and a crash that keeps the earlier write
/// and loses the later one loses committed records.
#[test]
fn a_sync_reported_past_its_point_is_caught() {
    let mut o = opts();
    o.cluster.step.broken_ack_past_sync_point = true;
    o.disk = (2 * MS, 20 * MS);
    let found = (0..400u64).find(|s| caught(*s, &o));
    assert!(
        found.is_some(),
        "no violation found with syncs reported past their point"
    );
}

/// Without the ghost guard (NULL slots left unstamped, superseded versions kept), the
/// out-of-order merge resurrects entries: the simulator must see it in both modes.
#[test]
fn the_ghost_entry_is_caught_without_the_guard() {
    use chorus_core::ooo::replica::Mode;
    use chorus_sim::ooo::{run_seed, OooOptions};
    for mode in [Mode::Parallel { span: 2 }, Mode::Dependent] {
        let o = OooOptions {
            mode,
            ghost_guard: false,
            ..OooOptions::default()
        };
        let found = (0..100u64).find(|s| !run_seed(*s, &o).violations.is_empty());
        assert!(
            found.is_some(),
            "{mode:?}: no ghost found without the guard"
        );
    }
}

/// Whether some conflict-ordered parallel seed (≡ 2 mod 3) below `below` fails with the
/// broken variant `o` sets.
fn caught_on_conflict_order_seeds(o: chorus_sim::ooo::OooOptions, below: u64) -> bool {
    (0..below)
        .filter(|s| s % 3 == 2)
        .any(|s| !chorus_sim::ooo::run_seed(s, &o).violations.is_empty())
}

/// Replicas that commit without conflict order while the seed expects it: the result
/// check must see an entry reported committed before an overlapping earlier one.
#[test]
fn commits_out_of_conflict_order_are_caught() {
    let o = chorus_sim::ooo::OooOptions {
        mode: chorus_core::ooo::replica::Mode::Parallel { span: 2 },
        broken_conflict_order: true,
        ..Default::default()
    };
    assert!(
        caught_on_conflict_order_seeds(o, 60),
        "no commit out of conflict order found"
    );
}

/// A merge that does not cascade NULLs along the predecessors a conflict-ordered entry
/// lists keeps an entry whose overlapping predecessor it dropped: the end-of-seed check
/// must see a committed entry whose earlier overlapping append of its term did not.
#[test]
fn a_merge_that_drops_a_predecessor_but_keeps_its_waiter_is_caught() {
    let o = chorus_sim::ooo::OooOptions {
        mode: chorus_core::ooo::replica::Mode::Parallel { span: 2 },
        broken_cascade: true,
        ..Default::default()
    };
    assert!(
        caught_on_conflict_order_seeds(o, 120),
        "no entry committed past a dropped predecessor"
    );
}

/// A dependent leader whose window base trails its head for a follower missing a
/// committed entry, but which lists only uncommitted WAW writers: that follower applies a
/// later writer of the missing entry's keys before it. The apply-order checks must bite.
#[test]
fn a_trailing_base_without_the_committed_writers_is_caught() {
    let o = chorus_sim::ooo::OooOptions {
        mode: chorus_core::ooo::replica::Mode::Dependent,
        broken_trail: true,
        ..Default::default()
    };
    let found = (0..200u64).find(|s| !chorus_sim::ooo::run_seed(*s, &o).violations.is_empty());
    assert!(found.is_some(), "no apply out of WAW order found");
}

/// A replica that lost synced entries on disk but votes as if it had not: its vote lets a
/// candidate lacking a slot it had acknowledged win, and that merge finds the slot
/// nowhere. The committed-log checks must bite.
#[test]
fn a_replica_that_lost_entries_and_still_votes_is_caught() {
    for mode in [
        chorus_core::ooo::replica::Mode::Dependent,
        chorus_core::ooo::replica::Mode::Parallel { span: 2 },
    ] {
        let o = chorus_sim::ooo::OooOptions {
            mode,
            broken_lost_guard: true,
            ..Default::default()
        };
        let found = (0..300u64).find(|s| !chorus_sim::ooo::run_seed(*s, &o).violations.is_empty());
        eprintln!("{mode:?}: first caught on seed {found:?}");
        assert!(found.is_some(), "{mode:?}: no committed entry lost found");
    }
}

/// The production out-of-order driver, broken to run every action before its batch's
/// writes are durable (acknowledgements, votes and the leader's count of its own copies):
/// a node that crashes with acknowledged entries unsynced loses them, and a committed slot
/// is later committed with something else. The simulator runs that driver, so the
/// agreement checks must bite — in both modes.
#[test]
fn a_driver_that_acknowledges_before_its_sync_is_caught() {
    for mode in [
        chorus_core::ooo::replica::Mode::Parallel { span: 2 },
        chorus_core::ooo::replica::Mode::Dependent,
    ] {
        let o = chorus_sim::ooo::OooOptions {
            mode,
            broken_ack_before_sync: true,
            ..Default::default()
        };
        let found = (0..60u64).find(|s| !chorus_sim::ooo::run_seed(*s, &o).violations.is_empty());
        eprintln!("{mode:?}: first caught on seed {found:?}");
        assert!(
            found.is_some(),
            "{mode:?}: no acknowledgement before a sync caught"
        );
    }
}

/// Guessing the outcome of appends a rebase leaves undecided — reporting them Failed
/// instead of unknown — is caught: on the seed below a deposed leader holds appends that
/// its successor committed and then trimmed below, and is rebased past them. (Found by
/// `cargo run --release -p chorus-sim --features broken -- --broken guess-on-rebase
/// --seeds 1500`, which finds seeds 398, 656, 1100, 1103 and 1361 since syncs are
/// pipelined; a change that moves the trajectories again moves them: search again with
/// that command and put a seed it finds here.)
#[test]
fn guessing_outcomes_on_a_rebase_is_caught() {
    let mut o = RunOptions::default();
    o.cluster.broken = Broken::GuessOnRebase;
    let r = run_seed(398, &o);
    assert!(
        r.violations
            .iter()
            .any(|v| v.contains("reported Failed but committed")),
        "{:#?}",
        r.violations
    );
    let clean = run_seed(398, &RunOptions::default());
    assert!(clean.violations.is_empty(), "{:#?}", clean.violations);
    assert!(clean.stats.get("outcomes_unknown").copied().unwrap_or(0) > 0);
}

/// A mirror's leader that writes a StartWorking group of its own puts a group the primary
/// never wrote into the primary's LSN space: the mirror checks must see it.
#[test]
fn a_mirror_leader_writing_its_own_group_is_caught() {
    let mut o = opts();
    o.mirror = true;
    o.cluster.broken = Broken::MirrorStartWorking;
    let found = (0..50u64).find(|s| !run_seed(*s, &o).violations.is_empty());
    assert!(
        found.is_some(),
        "no violation found with a mirror's own StartWorking"
    );
}

/// The production out-of-order driver, broken to tell a writer its append committed as
/// soon as the slot commits, before it is applied on the node that tells it (as the
/// driver once did): a read served there right after could miss the write. The
/// applied-before-told check must bite, in both modes.
#[test]
fn a_driver_that_tells_a_commit_before_applying_it_is_caught() {
    for mode in [
        chorus_core::ooo::replica::Mode::Parallel { span: 2 },
        chorus_core::ooo::replica::Mode::Dependent,
    ] {
        let o = chorus_sim::ooo::OooOptions {
            mode,
            broken_ack_before_apply: true,
            ..Default::default()
        };
        let found = (0..60u64).find(|s| !chorus_sim::ooo::run_seed(*s, &o).violations.is_empty());
        eprintln!("{mode:?}: first caught on seed {found:?}");
        assert!(
            found.is_some(),
            "{mode:?}: no commit told before its apply caught"
        );
    }
}
