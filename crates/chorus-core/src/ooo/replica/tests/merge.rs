//! A new leader's merge (PolarFS section 5.3, DP-Raft section 4.4): entries re-stamped
//! and committed before it serves, a deposed leader learning its appends' outcomes, and
//! an entry dropped with the predecessor it waited for.

use super::*;

#[test]
fn a_merge_that_drops_a_predecessor_drops_the_entry_that_waited_for_it() {
    // Only node 1 commits in conflict order: the entries it writes list what they
    // wait for, and node 2's merge follows the lists whatever its own setting.
    let (mut net, [a, b, c]) = withheld_a_then_b_and_c(|id| id == 1);
    let b_entry = net.nodes[&2].log[&b.seq].entry.clone();
    assert!(matches!(&b_entry.body, Body::Parallel { after, .. } if after == &[a.seq]));
    // Node 1 is cut off; node 2 wins with node 3, neither of which ever held `a`.
    net.tick_with(2, 10_000_000_000, without(1));
    assert!(net.nodes[&2].is_serving());
    let log = net.nodes[&2].read_committed(a.seq, 10).unwrap();
    let got: Vec<(Seq, bool, u64)> = log.iter().map(|e| (e.seq, e.is_null(), e.eid)).collect();
    assert_eq!(
        got,
        vec![(a.seq, true, 0), (b.seq, true, 0), (c.seq, false, c.eid)],
        "a dropped, b (which waited for it) dropped with it, c kept"
    );
}

#[test]
fn a_follower_cannot_append_and_a_new_leader_merges_first() {
    let mut net = Net::new(3, Mode::Dependent);
    net.elect(2);
    assert!(matches!(
        net.append(1, txn(&[], &[1]), vec![]),
        Err(OooAppendError::NotLeader { leader: Some(2) })
    ));
    let a = net.append(2, txn(&[], &[1]), vec![]).unwrap();
    let b = net.append(2, txn(&[1], &[2]), vec![]).unwrap();
    // Only node 3 receives the entries, and its acknowledgements are lost: nothing
    // commits, and node 2 keeps both appends pending.
    net.run_with(|f, t, _| f == 2 && t == 3);
    assert!(net.results.is_empty());
    net.elect(3);
    let t = net.nodes[&3].term();
    // Node 3 re-stamped both entries at its term and committed them before serving.
    for s in [a.seq, b.seq] {
        assert_eq!(net.nodes[&3].log[&s].entry.term, t);
        assert!(net.nodes[&3].log[&s].committed);
    }
    // The deposed leader learns both committed, with its own identities.
    let mut got: Vec<_> = net.results.clone();
    got.sort_by_key(|r| r.1);
    assert_eq!(
        got,
        vec![
            (2, a.eid, Outcome::Committed),
            (2, b.eid, Outcome::Committed)
        ]
    );
    let c = net.append(3, txn(&[2], &[1]), vec![]).unwrap();
    assert_eq!(c.seq, b.seq + 1);
    net.run();
    assert!(net
        .results
        .iter()
        .any(|r| r.1 == c.eid && r.2 == Outcome::Committed));
}
