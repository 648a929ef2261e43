//! The ghost log entry anomaly (Gu et al., "Raft with out-of-order executions") appears
//! when the merge leaves NULL slots empty instead of writing them at the new term. Runs
//! only in the test-only `broken` build:
//! `cargo test -p chorus-core --features broken --test ghost`.
#![cfg(feature = "broken")]

#[path = "ooo_scenarios.rs"]
#[allow(dead_code)]
mod scenarios;

use chorus_core::ooo::merge::{MergeOptions, Outcome};

#[test]
fn without_the_guard_a_dropped_entry_comes_back() {
    let d = scenarios::ghost_scenario(|t| MergeOptions::new(t).without_ghost_guard());
    // Term 3 decided slot 6 holds nothing (entry A's appender is told Failed) ...
    assert!(
        matches!(d[0].1, Outcome::Null { written: None }),
        "{:?}",
        d[0]
    );
    // ... and term 4, meeting S3's old copy, brings A back: a ghost.
    match &d[1].1 {
        Outcome::Entry { from: 3, version } => assert_eq!(version.term, 2),
        o => panic!("expected the ghost of entry A, got {o:?}"),
    }
}
