//! Protocol-aware recovery of lost entries (Alagappan et al., FAST 2018): a replica that
//! lost synced entries on disk stays out of elections until it holds again everything it
//! may have acknowledged, and its leader forgets its earlier acknowledgements.

use super::*;

/// Protocol-aware recovery (Alagappan et al., FAST 2018): slot 0 is committed on
/// nodes 1 and 2 only, then node 2 loses it on disk. Had node 2 voted, node 3 (which
/// never had slot 0) could win with it and its merge would find slot 0 nowhere — a
/// committed entry lost. Node 2 instead stays out of elections, so without node 1
/// nobody is elected; with node 1 back, node 1 wins again with node 3, and once node
/// 2 holds every slot below a bound that leader gave it is whole and votes again.
#[test]
fn a_replica_that_lost_entries_stays_out_of_elections_until_it_holds_them_again() {
    let mut net = Net::new(3, Mode::Parallel { span: 2 });
    net.elect(1);
    let a = net.append_block(7);
    net.run_with(without(3));
    assert_eq!(net.outcomes(a.eid), vec![Outcome::Committed]);
    assert!(!net.nodes[&3].log.contains_key(&a.seq));

    // Node 2 restarts having lost slot 0's record.
    let before = net.nodes[&2].hard;
    let lost = before.after_loss();
    assert_eq!(
        (
            lost.term,
            lost.voted_for,
            lost.lost_below,
            lost.committed_head
        ),
        (before.term, before.voted_for, before.term + 1, before.base)
    );
    net.restart_after_loss(2, a.seq);

    // Node 1 is down: node 3 cannot be elected, and node 2 does not campaign.
    for _ in 0..5 {
        net.now += 10_000_000_000;
        let now = net.now;
        for id in [2, 3] {
            net.node(id).tick(now);
        }
        net.run_with(without(1));
    }
    assert!(!net.nodes[&2].is_serving() && !net.nodes[&3].is_serving());
    assert_eq!(net.nodes[&2].stats().campaigns, 0);
    assert!(net.nodes[&2].stats().votes_refused_lost >= 5);

    // Node 1 is back (it stepped down, not having heard a majority for so long). Only
    // it can be elected — node 3's log lacks slot 0 and node 2 abstains — and it is,
    // with node 3's vote, once its pre-vote has asked about a term nobody passed.
    for _ in 0..4 {
        net.tick(1, 10_000_000_000);
        if net.nodes[&1].is_serving() {
            break;
        }
    }
    assert!(net.nodes[&1].is_serving());
    assert!(net.nodes[&2].is_recovering_lost());
    // The periodic resend brings node 2 what it lacks; it is whole again.
    for _ in 0..3 {
        net.tick(1, 60_000_000);
    }
    let r2 = &net.nodes[&2];
    assert!(!r2.is_recovering_lost());
    assert_eq!(r2.stats().lost_restored, 1);
    assert_eq!(r2.hard.lost_below, 0);
    assert!(r2.committed_head() > a.seq);
    assert_eq!(r2.log[&a.seq].entry.eid, a.eid);
    assert_eq!(net.outcomes(a.eid), vec![Outcome::Committed]);
    assert_eq!(net.state[&2], net.state[&1]);

    // And it votes again: with node 1 down, node 2 is elected with node 3's vote.
    net.tick_with(2, 10_000_000_000, without(1));
    assert!(net.nodes[&2].is_serving());
    assert_eq!(net.nodes[&2].log[&a.seq].entry.eid, a.eid);
}

/// A replica that lost entries under a serving leader asks it where its slots end
/// ([`Msg::AskEnd`]); the leader forgets its acknowledgements, resends what it lacks,
/// and answers; once everything below that end is committed on it, it is whole —
/// no election, no new term. In a group of two too, where an election would need the
/// recovering replica's vote (a replica that waited for a later leader would wait
/// forever there).
#[test]
fn a_replica_that_lost_entries_recovers_under_the_same_leader() {
    for n in [3u64, 2] {
        let mut net = Net::new(n, Mode::Dependent);
        net.elect(1);
        let t = net.append(1, txn(&[], &[4]), vec![1]).unwrap();
        net.run();
        let term = net.nodes[&1].hard.term;
        net.restart_after_loss(2, t.seq);
        for _ in 0..3 {
            net.tick(1, 60_000_000);
        }
        let (r1, r2) = (&net.nodes[&1], &net.nodes[&2]);
        assert!(r1.is_serving(), "{n} voters: still leading");
        assert_eq!((r1.hard.term, r2.hard.term), (term, term), "{n} voters");
        assert!(!r2.is_recovering_lost(), "{n} voters");
        assert_eq!(r2.stats().lost_restored, 1);
        assert_eq!(r2.log[&t.seq].entry.eid, t.eid);
        assert!(r2.committed_head() > t.seq);
        assert_eq!(r1.stats().campaigns, 1, "{n} voters: no election");
    }
}

/// Acknowledgements a recovering follower gave before its loss no longer count once
/// it asked where the leader's slots end: an entry it had acknowledged waits for a
/// copy it really holds.
#[test]
fn a_leader_forgets_what_a_recovering_follower_acknowledged() {
    let mut net = Net::new(3, Mode::Parallel { span: 2 });
    net.elect(1);
    // Node 2 acknowledges slot 0; node 3 hears nothing, and node 1's own copy is not
    // counted yet (its persisted report is held back below).
    let a = net.append_block(5);
    let now = net.now;
    let term = net.nodes[&1].hard.term;
    let acts = net.node(1).take_actions();
    let msg = sent(&acts, 2)
        .find(|m| matches!(m, Msg::Append { .. }))
        .cloned()
        .expect("append to 2");
    net.node(2).receive(now, 1, msg);
    let acts = net.node(2).take_actions();
    let ack = sent(&acts, 1)
        .find(|m| matches!(m, Msg::Ack { .. }))
        .cloned()
        .expect("ack");
    // Node 2 loses the slot and asks for the end right after its ack.
    let r1 = net.node(1);
    r1.receive(now, 2, ack);
    r1.receive(now, 2, Msg::AskEnd { term, nonce: 9 });
    let acts = r1.take_actions();
    assert!(
        sent(&acts, 2).any(|m| matches!(m, Msg::End { end: 1, .. })),
        "{acts:?}"
    );
    // Its own copy durable now: with node 2's acknowledgement forgotten, one copy.
    r1.persisted(now, &[(a.seq, a.eid, term)]);
    let acts = r1.take_actions();
    assert!(
        !acts.iter().any(|x| matches!(x, Action::Result { .. })),
        "committed on a forgotten copy: {acts:?}"
    );
    assert!(!r1.commits.is_committed(a.seq));
}
