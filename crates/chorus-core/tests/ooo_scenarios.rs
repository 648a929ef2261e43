//! Scenario tests of the out-of-order merge with golden output. Regenerate the expected
//! files with `UPDATE_GOLDEN=1 cargo test -p chorus-core --test ooo_scenarios` and review
//! the diff.

use chorus_core::format::meta::NodeId;
use chorus_core::ooo::merge::{merge, render, Answers, MergeOptions, Outcome, Version};

fn golden(name: &str, got: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/testdata")
        .join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, got).expect("write golden file");
        return;
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (UPDATE_GOLDEN=1 creates it)", path.display()));
    assert_eq!(
        got,
        want,
        "{} differs (UPDATE_GOLDEN=1 rewrites it)",
        path.display()
    );
}

fn ver(term: u64, committed: bool) -> Option<Version> {
    Some(Version {
        term,
        id: term,
        null: false,
        committed,
        after: Vec::new(),
    })
}

/// DP-Raft Fig. 5: S3 led in term 2 and failed; S4 led in term 3 (voted by S1 and S5),
/// replicated entries 8 and 9, and failed; S1 is pre-leader in term 4 with the answers of
/// S2 and S5 for entries 4..9. Committed versions are marked; every case the text walks
/// through appears once.
#[test]
fn dp_raft_fig5_merge() {
    let mut a = Answers::new();
    let row = |s1, s2, s5| -> Vec<(NodeId, Option<Version>)> { vec![(1, s1), (2, s2), (5, s5)] };
    a.insert(4, row(None, None, ver(2, true))); // missing here, committed on S5
    a.insert(5, row(ver(2, true), ver(2, false), ver(2, true))); // committed here
    a.insert(6, row(None, None, None)); // nobody has it
    a.insert(7, row(ver(2, false), None, None)); // only S1 has it
    a.insert(8, row(None, ver(2, false), ver(3, false))); // missing here, terms 2 and 3
    a.insert(9, row(ver(2, false), None, ver(3, false))); // ours is term 2, S5 has term 3
    let d = merge(1, &a, &MergeOptions::new(4));
    golden("dp_raft_fig5.txt", &render(&d));
}

/// The ghost guard: a slot decided NULL is written as a NULL entry at the new term, so a
/// later merge in a different quorum, meeting an old uncommitted version of the slot,
/// still decides NULL. (`tests/ghost.rs`, in the `broken` build, shows the anomaly when
/// the guard is off.)
#[test]
fn a_null_slot_stays_null_across_later_merges() {
    let decisions = ghost_scenario(MergeOptions::new);
    assert_eq!(decisions.len(), 2);
    for (term, o) in &decisions {
        assert!(
            matches!(
                o,
                Outcome::Null { .. }
                    | Outcome::Entry {
                        version: Version { null: true, .. },
                        ..
                    }
            ),
            "term {term}: slot 6 must stay NULL, got {o:?}"
        );
    }
}

/// Slot 6 of five replicas through two leader changes; returns each merge's decision for
/// the slot. Only S3 ever held entry A (term 2, uncommitted) at slot 6. Term 3: S1 merges
/// with S2 and S5 (S3, S4 down). Term 4: S4 merges with S3 and S2 (S1, S5 down).
pub fn ghost_scenario(opts: fn(u64) -> MergeOptions) -> Vec<(u64, Outcome)> {
    use std::collections::BTreeMap;
    let mut logs: BTreeMap<NodeId, Option<Version>> = (1..=5).map(|n| (n, None)).collect();
    logs.insert(3, ver(2, false));
    let mut out = Vec::new();
    for (term, leader, quorum) in [(3u64, 1u64, [1u64, 2, 5]), (4, 4, [4, 3, 2])] {
        let mut a = Answers::new();
        a.insert(6, quorum.iter().map(|n| (*n, logs[n].clone())).collect());
        let d = merge(leader, &a, &opts(term));
        let o = d[0].outcome.clone();
        // The new leader writes its decision to the quorum and commits it before serving.
        let written = match &o {
            Outcome::Entry { version, .. } => Some(version.clone()),
            Outcome::Null { written } => written.clone(),
        };
        if let Some(mut w) = written {
            w.committed = true;
            for n in quorum {
                logs.insert(n, Some(w.clone()));
            }
        }
        out.push((term, o));
    }
    out
}
