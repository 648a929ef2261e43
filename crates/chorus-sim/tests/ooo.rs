//! Out-of-order groups under the simulator: both modes, full fault mix, every check of
//! `chorus_sim::ooo` (agreement, explicit results, conflicting applies in order, no
//! serving before the merge completes, serial equivalence, liveness after healing).

use chorus_core::ooo::replica::Mode;
use chorus_sim::ooo::{run_seed, OooOptions, OooReport};

/// Runs one seed with the default mix (groups, leader transfers, membership changes),
/// which must be clean
/// and commit something; returns its report.
fn clean_seed(mode: Mode, seed: u64) -> OooReport {
    check(
        seed,
        &OooOptions {
            mode,
            ..OooOptions::default()
        },
    )
}

/// [`clean_seed`] without leader transfers, membership changes, pre-votes, partial
/// images, conflict order, damage at rest, zeros written ahead, timed resends or late
/// messages: the mix
/// the seeds found before those existed ran (their exact trajectories changed when the
/// simulator began to run the production driver; they stay as seeds of that mix).
fn clean_seed_with(mode: Mode, seed: u64) -> OooReport {
    check(
        seed,
        &OooOptions {
            mode,
            transfers: false,
            changes: false,
            trims: false,
            pre_vote: false,
            partial_images: false,
            conflict_order: false,
            corrupt: false,
            preallocate: Some(0),
            timed_resend: Some(0),
            late_messages: false,
            ..OooOptions::default()
        },
    )
}

fn check(seed: u64, o: &OooOptions) -> OooReport {
    let r = run_seed(seed, o);
    assert!(
        r.violations.is_empty(),
        "{:?} seed {seed} (transfers {}): {:#?}",
        o.mode,
        o.transfers,
        r.violations
    );
    assert!(
        r.stats.get("committed").copied().unwrap_or(0) > 0,
        "seed {seed} committed nothing"
    );
    r
}

fn clean(mode: Mode, seeds: std::ops::Range<u64>) {
    for seed in seeds {
        clean_seed(mode, seed);
    }
}

#[test]
fn parallel_mode_seeds_are_clean() {
    clean(Mode::Parallel { span: 2 }, 0..25);
}

#[test]
fn dependent_mode_seeds_are_clean() {
    clean(Mode::Dependent, 0..25);
}

/// A third of the seeds send votes in pieces of at most 2 KiB (`Msg::VotePart`): under
/// faults, some vote is too large for one piece and the candidate asks for the rest,
/// through loss, crashes and competing campaigns, with every check clean.
#[test]
fn votes_too_large_for_one_message_go_in_pieces_under_faults() {
    for mode in [Mode::Parallel { span: 2 }, Mode::Dependent] {
        let parts: u64 = (0..12)
            .map(|k| {
                let r = clean_seed(mode, 3 * k + 2);
                r.stats.get("vote_parts_sent_live").copied().unwrap_or(0)
            })
            .sum();
        assert!(parts > 0, "{mode:?}: no vote went in pieces");
    }
}

/// Seeds that failed during development, kept: 219 and 237 (parallel) left a restarted
/// follower below the leader's committed head forever (acknowledged slots were never
/// resent; a restarted follower's head goes down); 144 (dependent) never finished a merge
/// whose entries were lost (merged slots were resent only from the follower's head);
/// 277 and 287 (dependent) applied and committed against predecessors a later leader had
/// replaced (`merge::drop_superseded`, the second half of the ghost guard). They were found
/// with one record per entry, before the simulator ran the production driver.
#[test]
fn regression_seeds() {
    for (mode, seed) in [
        (Mode::Parallel { span: 2 }, 219),
        (Mode::Parallel { span: 2 }, 237),
        (Mode::Parallel { span: 2 }, 161),
        (Mode::Dependent, 144),
        (Mode::Dependent, 277),
        (Mode::Dependent, 287),
        (Mode::Dependent, 103),
    ] {
        clean_seed_with(mode, seed);
    }
}

/// Groups are in the workload: half the entries carry 2-3 records.
#[test]
fn entries_carry_groups_of_records() {
    let r = clean_seed(Mode::Dependent, 3);
    assert!(r.stats["records"] > r.stats["appends"], "{:?}", r.stats);
}

/// Operators transfer leadership during the fault time (the default mix): transfers are
/// asked and some complete — the target campaigns on the leader's TimeoutNow and wins —
/// with every check clean; without faults most complete.
#[test]
fn leader_transfers_hand_over_and_stay_safe() {
    for mode in [Mode::Parallel { span: 2 }, Mode::Dependent] {
        let (mut asked, mut done) = (0, 0);
        for seed in 0..12 {
            let r = clean_seed(mode, seed);
            asked += r.stats.get("transfers_asked").copied().unwrap_or(0);
            done += r.stats.get("transfers_completed").copied().unwrap_or(0);
        }
        assert!(
            asked > 0 && done > 0,
            "{mode:?}: {asked} asked, {done} completed"
        );
        // Without faults nearly every transfer completes (the last one of a seed may be
        // cut short by the end of the fault time).
        let (mut asked, mut done) = (0, 0);
        for seed in 0..5 {
            let r = check(
                seed,
                &OooOptions {
                    mode,
                    faults: false,
                    ..OooOptions::default()
                },
            );
            asked += r.stats["transfers_asked"] - 1;
            done += r.stats.get("transfers_completed").copied().unwrap_or(0);
        }
        assert!(
            asked >= 15 && done * 10 >= asked * 9,
            "{mode:?} without faults: {asked} looked at, {done} completed"
        );
    }
}

/// Operators change the voters during the fault time (the default mix): changes are
/// asked and complete — the spare joins and catches up, voters leaders included are
/// removed — with every check clean; without faults nearly every change completes, and
/// with changes off no spare node exists and nothing is asked.
#[test]
fn membership_changes_complete_and_stay_safe() {
    for mode in [Mode::Parallel { span: 2 }, Mode::Dependent] {
        let (mut asked, mut done) = (0, 0);
        // Under faults fewer than a third of the changes asked complete (30–31% over
        // 1,000 dependent seeds), so a dozen seeds, not a handful: six asked seven
        // changes and completed none once packing moved their trajectories.
        for seed in 0..12 {
            let r = clean_seed(mode, seed);
            asked += r.stats.get("changes_asked").copied().unwrap_or(0);
            done += r.stats.get("membership_changes").copied().unwrap_or(0);
        }
        assert!(
            asked > 0 && done > 0,
            "{mode:?}: {asked} asked, {done} completed"
        );
        let (mut asked, mut done, mut handoffs) = (0, 0, 0);
        for seed in 0..5 {
            let r = check(
                seed,
                &OooOptions {
                    mode,
                    faults: false,
                    ..OooOptions::default()
                },
            );
            asked += r.stats["changes_asked"];
            done += r.stats.get("membership_changes").copied().unwrap_or(0);
            handoffs += r.stats.get("handoffs_live").copied().unwrap_or(0);
        }
        assert!(
            asked >= 15 && done * 10 >= asked * 9,
            "{mode:?} without faults: {asked} asked, {done} completed"
        );
        // A leader removing itself hands over to a caught-up voter.
        assert!(handoffs > 0, "{mode:?} without faults: no handoff");
        let r = clean_seed_with(mode, 1);
        assert_eq!(r.stats.get("changes_asked"), None, "{:?}", r.stats);
    }
}

#[test]
fn a_seed_replays_exactly() {
    let o = OooOptions {
        mode: Mode::Dependent,
        ..OooOptions::default()
    };
    let a = run_seed(7, &o);
    let b = run_seed(7, &o);
    assert_eq!(a.stats, b.stats);
}

/// Odd seeds bound catch-up pieces in bytes and rate-limit streaming catch-up: the limit
/// holds pieces back (it bites) and lagging followers still catch up after healing (the
/// liveness check of `clean`). The seeds are ones on which the limit bites with the
/// production driver in the simulator (seed 1089, found before, no longer needs it).
#[test]
fn rate_limited_catch_up_bites_and_still_finishes() {
    for (mode, seed) in [
        (Mode::Parallel { span: 2 }, 1005),
        (Mode::Dependent, 1005),
        (Mode::Parallel { span: 2 }, 1023),
        (Mode::Dependent, 1029),
    ] {
        let r = clean_seed_with(mode, seed);
        assert!(
            r.stats["catchup_deferred"] > 0,
            "{mode:?} seed {seed}: {:?}",
            r.stats
        );
        assert!(r.stats["catchup_limited_bytes"] > 0);
    }
}

/// Compaction and images: on two seeds in three the nodes checkpoint and compact, so
/// followers fall behind a leader's base and install its image. Kept from development:
/// dependent seed 133 never finished a merge (a voter compacted the merged slots after
/// granting its vote and never acknowledged them), 1049 left both followers waiting
/// `snapshot_retry` for every image while the leader compacted past each one (both found
/// without groups; 1049 is kept as a clean seed, its followers no longer fall behind a
/// base since the simulator runs the production driver, and dependent 1001 stands for it).
#[test]
fn compaction_and_images_seeds() {
    clean_seed_with(Mode::Dependent, 1049);
    for (mode, seed) in [
        (Mode::Dependent, 133),
        (Mode::Dependent, 1001),
        (Mode::Parallel { span: 2 }, 1000),
        (Mode::Parallel { span: 2 }, 1001),
    ] {
        let r = clean_seed_with(mode, seed);
        assert!(
            r.stats.get("checkpoints").copied().unwrap_or(0) > 0,
            "{:?}",
            r.stats
        );
        assert!(
            r.stats.get("compactions").copied().unwrap_or(0) > 0,
            "{:?}",
            r.stats
        );
        assert!(
            r.stats.get("images_installed").copied().unwrap_or(0) > 0,
            "{mode:?} seed {seed}: {:?}",
            r.stats
        );
    }
    // Seeds divisible by 3 do not compact by size, and without operators' trims nothing
    // compacts: the paths without a base stay covered.
    let r = run_seed(
        999,
        &OooOptions {
            trims: false,
            ..OooOptions::default()
        },
    );
    assert_eq!(r.stats.get("checkpoints"), None, "{:?}", r.stats);
}

/// Pre-vote under the full fault mix: replicas pre-vote, some pre-votes are refused
/// because a leader was heard, and the same seeds start fewer campaigns than without
/// it (each seed replays exactly, so the comparison is of the same fault schedules).
#[test]
fn pre_votes_cut_campaigns_under_faults() {
    for mode in [Mode::Parallel { span: 2 }, Mode::Dependent] {
        let count = |pre_vote: bool, k: &str| -> u64 {
            (0..8)
                .map(|seed| {
                    let r = check(
                        seed,
                        &OooOptions {
                            mode,
                            pre_vote,
                            ..OooOptions::default()
                        },
                    );
                    r.stats.get(k).copied().unwrap_or(0)
                })
                .sum()
        };
        let (with, without) = (
            count(true, "campaigns_live"),
            count(false, "campaigns_live"),
        );
        assert!(count(true, "pre_votes_live") > 0, "{mode:?}: no pre-votes");
        assert!(
            with < without,
            "{mode:?}: {with} campaigns with pre-vote, {without} without"
        );
        assert_eq!(count(false, "pre_votes_live"), 0);
    }
}

/// Fast catch-up from the leader's data (PolarFS 5.3): followers behind the base are sent
/// partial images (what the slots from their first unapplied slot on wrote), and every
/// install is checked on the spot against the serial order below its base, under the full
/// fault mix; with partial images off, every image is whole.
#[test]
fn partial_images_carry_what_a_follower_lacks() {
    for mode in [Mode::Parallel { span: 2 }, Mode::Dependent] {
        let count = |partial_images: bool, k: &str| -> u64 {
            [1u64, 2, 5, 7, 10, 11]
                .into_iter()
                .map(|seed| {
                    let r = check(
                        seed,
                        &OooOptions {
                            mode,
                            partial_images,
                            ..OooOptions::default()
                        },
                    );
                    r.stats.get(k).copied().unwrap_or(0)
                })
                .sum()
        };
        assert!(
            count(true, "partial_installs") > 0,
            "{mode:?}: no partial image"
        );
        assert!(count(false, "images_installed") > 0, "{mode:?}: no image");
        assert_eq!(count(false, "partial_installs"), 0, "{mode:?}");
    }
}

/// Parallel seeds ≡ 2 mod 3 commit in conflict order: every committed result a serving
/// leader reports is checked against the earlier overlapping appends of its term, and at
/// the end every committed entry against those appends' slots (both checks bite:
/// `teeth.rs`), and the seeds stay clean; other seeds and the dependent mode are not
/// checked.
#[test]
fn conflict_order_holds_on_its_seeds() {
    let par = Mode::Parallel { span: 2 };
    let mut checked = 0;
    for seed in [2, 5, 8] {
        checked += clean_seed(par, seed)
            .stats
            .get("conflict_order_checks")
            .copied()
            .unwrap_or(0);
    }
    assert!(checked > 1000, "only {checked} results checked");
    // Seeds on which a new leader's merge dropped an entry and kept a later overlapping
    // one that had waited for it, before conflict-ordered entries listed what they wait
    // for (the end-of-seed check, module docs 6, found them); on their trajectories,
    // without zeros written ahead or timed resends, which came later.
    for seed in [50003, 50045, 50591] {
        let o = OooOptions {
            mode: par,
            preallocate: Some(0),
            timed_resend: Some(0),
            ..OooOptions::default()
        };
        check(seed, &o);
    }
    for (mode, seed) in [(par, 3), (Mode::Dependent, 2)] {
        let r = clean_seed(mode, seed);
        assert_eq!(
            r.stats.get("conflict_order_checks"),
            None,
            "{mode:?} {seed}"
        );
    }
}

/// The leader counts what its commit rule costs (`OooStats::admitted_after`,
/// `held_at_quorum`): in a simulated cluster that reorders messages, a dependent or
/// conflict-ordered entry sometimes reaches a majority before its predecessor commits
/// and is held back; plain parallel mode has no predecessors to wait for.
#[test]
fn the_commit_rule_holds_entries_back_only_where_it_applies() {
    let par = Mode::Parallel { span: 2 };
    let count = |r: &OooReport, k: &str| r.stats.get(k).copied().unwrap_or(0);
    // Seeds ≡ 2 (mod 3) run parallel mode in conflict order.
    for (mode, seed) in [(Mode::Dependent, 2), (par, 2), (par, 5)] {
        let r = clean_seed(mode, seed);
        let (after, held) = (
            count(&r, "admitted_after_live"),
            count(&r, "held_at_quorum_live"),
        );
        assert!(
            held > 0,
            "{mode:?} seed {seed}: nothing held ({after} admitted after)"
        );
        assert!(
            held <= after,
            "{mode:?} seed {seed}: {held} held of {after}"
        );
    }
    let r = clean_seed(par, 3);
    assert_eq!(
        (
            count(&r, "admitted_after_live"),
            count(&r, "held_at_quorum_live")
        ),
        (0, 0),
        "plain parallel mode"
    );
}

/// Seeds found with damage at rest (the full mix): 2100090 (dependent) never finished a
/// merge while a recovering follower asked for the leader's end every heartbeat and each
/// ask made the leader forget the acknowledgements given since (now once per restart, a
/// nonce); 1272 (parallel) elected nobody after healing — an old voter recovering lost
/// entries, the removed leader holding the newest log and, removed, never campaigning,
/// and the others holding the joint stage of its change, whose old majority was out of
/// reach (now a final-stage holder answers a joint-stage candidate with the final stage).
/// Found before stores wrote zeros ahead and leaders resent on time, they run without
/// either, on their trajectories.
#[test]
fn damage_at_rest_regression_seeds() {
    for (mode, seed) in [
        (Mode::Dependent, 2100090),
        (Mode::Parallel { span: 2 }, 1272),
    ] {
        let o = OooOptions {
            mode,
            preallocate: Some(0),
            timed_resend: Some(0),
            ..OooOptions::default()
        };
        let r = check(seed, &o);
        assert!(
            r.stats["damaged_opens"] > 0,
            "{mode:?} seed {seed}: {:?}",
            r.stats
        );
    }
}

/// With operators' trims on any node up to its applied head, parallel seed 50045 (no
/// zeros ahead, no timed resends) ended with no leader: a follower that compacted past
/// another's first uncommitted slot refused it its vote
/// (`chorus_core::ooo::dependent::grants_vote`, first rule), the three live voters'
/// refusals formed a cycle, and the fourth abstained while it recovered entries it lost.
/// The simulator's default trims go to the serving leader only, up to what every live
/// follower holds (`OooOptions::trim_followers`, `chorus-sim --trim-followers`). On the
/// current trajectories the seed elects; the rule is unchanged and docs/reliability.md
/// lists the gap, which other seeds still meet.
#[test]
fn followers_compacted_past_each_other_still_elect_a_leader() {
    check(
        50045,
        &OooOptions {
            mode: Mode::Parallel { span: 2 },
            preallocate: Some(0),
            timed_resend: Some(0),
            trim_followers: true,
            ..OooOptions::default()
        },
    );
}

/// Seeds 1041 and 1054 (parallel): a vote held up past its candidate's election timeout
/// arrived while the candidate asked for pre-votes at the same term, and won it that term
/// with its pre-vote still open ("a leader asking for pre-votes": a group of a real
/// cluster panicked there, in the replica's invariant check, under `chorus-nemesis`). The
/// simulator finds it since answers to campaigns are sometimes held up that long
/// ([`OooOptions::late_messages`]). The invariants are checked in debug builds, as tests
/// run.
#[test]
fn a_late_vote_wins_its_term_and_ends_the_pre_vote() {
    for seed in [1041, 1054] {
        clean_seed(Mode::Parallel { span: 2 }, seed);
    }
}

/// Parallel seed 1538: a candidate that had lost track of what committed (its first
/// uncommitted slot 0) needed a vote of hundreds of pieces; they kept coming, but its
/// election timeout ran out first and it started over, term after term, with no leader
/// to the end. A piece of a vote now keeps the candidate's deadline (and the voter's) an
/// election timeout away.
#[test]
fn a_vote_in_many_pieces_completes_its_campaign() {
    let r = clean_seed(Mode::Parallel { span: 2 }, 1538);
    assert!(
        r.stats.get("vote_parts_sent_live").copied().unwrap_or(0) > 0,
        "the vote came in pieces: {:?}",
        r.stats
    );
}
