//! A volume over several chunk groups under the simulator: shared node crashes and
//! partitions, each chunk's own faults, leader transfers and re-replication, with the
//! checks of `chorus_sim::ooo::volume` (per-block linearizable reads, no acknowledged
//! write lost, the snapshot guarantee, a majority of voters up to date).

use chorus_sim::ooo::volume::{run_volume_batch, run_volume_seed, ReadBarrier, VolumeOptions};

#[test]
fn volume_seeds_are_clean() {
    let reports = run_volume_batch(1, 12, &VolumeOptions::default(), 2, None);
    let mut totals = std::collections::BTreeMap::new();
    for r in &reports {
        assert!(
            r.violations.is_empty(),
            "seed {}: {:#?}",
            r.seed,
            r.violations
        );
        for (k, v) in &r.stats {
            *totals.entry(*k).or_insert(0u64) += v;
        }
    }
    eprintln!("{totals:#?}");
    // The runs did what the checks need: writes acknowledged across chunks, reads
    // served, snapshots completed, crashes and re-replication.
    for k in [
        "volume_writes_acked",
        "volume_writes_across_chunks",
        "read_pieces_served",
        "snapshots_completed",
        "node_crashes",
        "changes_asked",
        "majority_samples",
    ] {
        assert!(totals.get(k).copied().unwrap_or(0) > 0, "{k}: {totals:?}");
    }
}

#[test]
fn a_seed_replays_exactly() {
    let o = VolumeOptions::default();
    let (a, b) = (run_volume_seed(7, &o), run_volume_seed(7, &o));
    assert_eq!(a.stats, b.stats);
    assert_eq!(a.violations, b.violations);
}

/// Teeth: reads served without the leader-read barrier are caught returning a block
/// older than an acknowledged write.
#[test]
fn reads_without_the_barrier_are_caught() {
    let o = VolumeOptions {
        read_barrier: ReadBarrier::None,
        ..VolumeOptions::default()
    };
    let reports = run_volume_batch(1, 24, &o, 2, None);
    let caught: Vec<_> = reports
        .iter()
        .filter(|r| r.violations.iter().any(|v| v.contains("older than")))
        .map(|r| r.seed)
        .collect();
    eprintln!("caught on seeds {caught:?}");
    assert!(!caught.is_empty(), "{reports:#?}");
}

/// Seed 2638 found it: a leader cut off from the others keeps serving reads from its
/// applied state after a successor, elected by followers that had restarted (and so
/// forgot when they last heard it), acknowledged writes. Waiting only for what was
/// committed when the read arrived serves the old state there; the quorum-confirmed
/// leader read does not. Without late messages, the mix it was found with.
#[test]
fn seed_2638_a_deposed_leader_serves_no_stale_read() {
    let found = VolumeOptions {
        late_messages: false,
        ..VolumeOptions::default()
    };
    let broken = VolumeOptions {
        read_barrier: ReadBarrier::AppliedOnly,
        ..found.clone()
    };
    let r = run_volume_seed(2638, &broken);
    assert!(
        r.violations.iter().any(|v| v.contains("older than")),
        "{:#?}",
        r.violations
    );
    let r = run_volume_seed(2638, &found);
    assert!(r.violations.is_empty(), "{:#?}", r.violations);
}

/// Seed 1852 found it: chunk 0 ended with no leader. Node 4 abstained, recovering entries
/// it lost on disk; node 2, a voter being added that had not yet taken the joint
/// membership, had compacted past every candidate's first uncommitted slot and refused
/// them all; nodes 1 and 3 needed its vote (docs/reliability.md, known gaps). It elects
/// since a vote arriving in pieces keeps the candidate's deadline; the vote rule itself
/// is unchanged, so this guards the seed, not the gap.
#[test]
fn seed_1852_a_chunk_elects_a_leader() {
    let r = run_volume_seed(1852, &VolumeOptions::default());
    assert!(r.violations.is_empty(), "{:#?}", r.violations);
}
