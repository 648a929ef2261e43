//! Commits and applies: a cluster commits and applies out of order, reads the committed
//! prefix in slot order, follows its mode's commit rule (RAW predecessors in dependent
//! mode and under conflict order, DP-Raft section 4.3) and applies past a committed slot
//! a follower lacks when nothing it wrote is needed (WAW predecessors).

use super::*;
use crate::ooo::OooError;

#[test]
fn a_cluster_elects_commits_and_applies_in_parallel_mode() {
    let mut net = Net::new(3, Mode::Parallel { span: 2 });
    net.elect(1);
    let t1 = net.append(1, blocks(0, 4), b"a".to_vec()).unwrap();
    let t2 = net.append(1, blocks(8, 2), b"b".to_vec()).unwrap();
    net.run();
    assert_eq!(t2.seq, t1.seq + 1);
    assert_eq!(net.results.len(), 2);
    assert!(net.results.iter().all(|r| r.2 == Outcome::Committed));
    // A heartbeat brings the commit window to the followers.
    net.tick(1, 60_000_000);
    for id in 1..=3 {
        assert_eq!(net.nodes[&id].applied_head(), t2.seq + 1, "node {id}");
    }
    let wrong = net.append(1, txn(&[], &[1]), vec![]);
    assert!(matches!(wrong, Err(OooAppendError::WrongMode { .. })));
    let empty = net.append(
        1,
        Declared::Blocks(vec![BlockRange { start: 5, end: 5 }]),
        vec![],
    );
    assert!(matches!(
        empty,
        Err(OooAppendError::Refused(OooError::Malformed { .. }))
    ));
    // Every replica reads the committed prefix in slot order, the same entries.
    let leader = net.nodes[&1].read_committed(0, 100).unwrap();
    let data: Vec<&[u8]> = leader
        .iter()
        .filter(|e| !e.is_null())
        .map(|e| e.data())
        .collect();
    assert_eq!(data, vec![&b"a"[..], &b"b"[..]]);
    assert_eq!(leader.last().map(|e| e.seq), Some(t2.seq));
    for id in 2..=3 {
        assert_eq!(
            net.nodes[&id].read_committed(0, 100).unwrap(),
            leader,
            "node {id}"
        );
    }
    assert_eq!(
        net.nodes[&1].read_committed(t2.seq, 1).unwrap(),
        leader[leader.len() - 1..]
    );
    assert!(net.nodes[&1]
        .read_committed(t2.seq + 1, 10)
        .unwrap()
        .is_empty());
    assert_eq!(net.nodes[&1].read_committed(0, 1).unwrap().len(), 1);
}

/// `would_wait` follows the group's commit rule: a read of an uncommitted write in
/// dependent mode, an overlap under conflict order, never in plain parallel mode or
/// on a replica that is not serving.
#[test]
fn would_wait_follows_the_commit_rule_of_the_mode() {
    let tx = |r: u64, w: u64| txn(&[r], &[w]);
    let mut net = Net::new(3, Mode::Dependent);
    net.elect(1);
    net.append(1, tx(1, 5), vec![1]).unwrap();
    let n1 = &net.nodes[&1];
    assert!(n1.would_wait(&tx(5, 6)), "reads an uncommitted write");
    assert!(!n1.would_wait(&tx(6, 5)), "only writes it");
    assert!(!net.nodes[&2].would_wait(&tx(5, 6)), "not serving");
    net.run();
    assert!(!net.nodes[&1].would_wait(&tx(5, 6)), "its writer committed");
    for conflict_order in [false, true] {
        let mut net = Net::with(3, Mode::Parallel { span: 2 }, |c| {
            c.conflict_order = conflict_order
        });
        net.elect(1);
        net.append_block(3);
        let n1 = &net.nodes[&1];
        assert_eq!(n1.would_wait(&blocks(3, 1)), conflict_order);
        assert!(!n1.would_wait(&blocks(4, 1)));
    }
}

/// `would_order` asks whether some live replica may still have to apply a writer of
/// the keys first: true until every replica said it applied the writer, false for
/// keys only read, in parallel mode and off the leader; a follower not heard within
/// an election timeout does not count. `packs_last` is either rule.
#[test]
fn would_order_follows_what_the_live_replicas_applied() {
    let tx = |r: u64, w: u64| txn(&[r], &[w]);
    // No resends: a follower that makes no progress between two is counted as being
    // caught up, and left out too.
    let mut net = Net::with(3, Mode::Dependent, |c| c.resend_interval = 60_000_000_000);
    net.elect(1);
    let now = net.now;
    net.append(1, tx(1, 5), vec![1]).unwrap();
    let n1 = &net.nodes[&1];
    assert!(
        n1.would_order(&tx(6, 5)),
        "writes what an unapplied entry writes"
    );
    assert!(!n1.would_order(&tx(5, 6)), "only reads it");
    {
        let packs_last = n1.packs_last();
        assert!(packs_last(&tx(6, 5)) && packs_last(&tx(5, 6)));
        assert!(!packs_last(&tx(7, 8)));
    }
    assert!(!net.nodes[&2].would_order(&tx(6, 5)), "not serving");
    // Node 3 hears nothing: it never applies the entry.
    net.run_with(without(3));
    net.tick_with(1, 50_000_000, without(3));
    assert_eq!(net.nodes[&2].applied_head(), 1);
    assert!(
        net.nodes[&1].would_order(&tx(6, 5)),
        "node 3 was heard lately and has not applied it"
    );
    while net.now < now + 2 * net.nodes[&1].cfg.election_timeout {
        net.tick_with(1, 50_000_000, without(3));
    }
    assert!(net.nodes[&1].is_serving());
    assert!(
        !net.nodes[&1].would_order(&tx(6, 5)),
        "the replicas heard lately applied it"
    );
    let mut net = Net::new(3, Mode::Parallel { span: 2 });
    net.elect(1);
    assert!(!net.nodes[&1].would_order(&tx(6, 5)), "parallel mode");
}

/// Dependent mode: a follower that missed an entry committed without it (the leader
/// and the other follower hold it) still applies every later entry that writes none
/// of its keys, because those list their WAW predecessors from its missing slot on;
/// a later writer of the same key waits for it. Without the trailing base, every
/// entry admitted after the missing one committed would wait (its base above the
/// hole, so the follower could not know what the hole wrote).
#[test]
fn a_dependent_follower_applies_past_a_committed_entry_it_is_missing() {
    let mut net = Net::with(3, Mode::Dependent, |c| c.hole_resend = 0);
    net.elect(1);
    let append = |net: &mut Net, w: u64| net.append(1, txn(&[], &[w]), vec![1]).unwrap();
    let a = append(&mut net, 1);
    // Node 3 never gets `a` (the clock does not move, so nothing is resent).
    let keep = |_: NodeId, to: NodeId, m: &Msg| !(to == 3 && carries(m, &a));
    net.run_with(keep);
    assert!(net.committed_on(1, a.eid));
    let later: Vec<Ticket> = (2..=6)
        .map(|k| {
            let t = append(&mut net, k);
            net.run_with(keep);
            t
        })
        .collect();
    let same_key = append(&mut net, 1);
    net.run_with(keep);
    let applied = |n: NodeId| net.applied.get(&n).cloned().unwrap_or_default();
    for t in &later {
        assert!(
            applied(3).contains(&t.seq),
            "node 3 applied {} past the hole",
            t.seq
        );
        let Body::Dependent { base, .. } = &net.nodes[&3].log[&t.seq].entry.body else {
            panic!("a dependent entry");
        };
        assert_eq!(*base, a.seq, "listed from node 3's first missing slot");
    }
    assert!(!applied(3).contains(&a.seq));
    assert!(
        !applied(3).contains(&same_key.seq),
        "a later writer of a's key waits for a"
    );
    assert!(
        applied(2).contains(&same_key.seq),
        "node 2 holds everything"
    );
}

#[test]
fn conflict_order_holds_an_overlapping_entry_until_its_predecessor_commits() {
    for ordered in [true, false] {
        // `b` and `c` have a majority; `a` has only the leader.
        let (mut net, [a, b, c]) =
            withheld_a_then_b_and_c(if ordered { |_| true } else { |_| false });
        let committed = |net: &Net| -> Vec<u64> {
            net.results
                .iter()
                .filter(|r| r.0 == 1 && r.2 == Outcome::Committed)
                .map(|r| r.1)
                .collect()
        };
        let st = net.nodes[&1].stats();
        if ordered {
            assert_eq!(committed(&net), vec![c.eid], "b waits for a, c does not");
            assert_eq!((st.admitted_after, st.held_at_quorum), (1, 1), "b, counted");
        } else {
            assert_eq!(committed(&net), vec![b.eid, c.eid]);
            assert_eq!((st.admitted_after, st.held_at_quorum), (0, 0));
        }
        // A resend brings `a`: it commits, then (in conflict order) `b`.
        net.tick(1, 60_000_000);
        let got = committed(&net);
        if ordered {
            assert_eq!(got, vec![c.eid, a.eid, b.eid]);
        } else {
            assert_eq!(got, vec![b.eid, c.eid, a.eid]);
        }
    }
}
