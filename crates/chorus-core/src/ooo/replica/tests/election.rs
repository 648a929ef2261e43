//! Elections and leader transfer: pre-vote keeps a cut-off or lagging replica from
//! raising the term (Raft thesis section 9.6), and a leader hands leadership to a
//! caught-up follower or gives the transfer up.

use super::*;

#[test]
fn a_leader_hands_leadership_to_a_caught_up_follower_and_gives_up_on_a_cut_one() {
    let mut net = Net::new(3, Mode::Dependent);
    net.elect(1);
    let hb = net.nodes[&1].cfg.heartbeat_interval;
    for k in 0..4 {
        net.append(1, txn(&[k], &[k + 1]), vec![k as u8]).unwrap();
    }
    net.run();
    // Refusals: a follower cannot hand over, nor can anyone to a stranger.
    let now = net.now;
    assert_eq!(
        net.node(2).transfer_leader(now, 3),
        Err(OooTransferError::NotLeader { leader: Some(1) })
    );
    assert_eq!(
        net.node(1).transfer_leader(now, 9),
        Err(OooTransferError::NotVoter { to: 9 })
    );
    // To node 3 while node 3 is cut off: appends are refused meanwhile, and after an
    // election timeout the transfer is given up and appends resume.
    net.append(1, txn(&[5], &[6]), vec![5]).unwrap();
    net.run_with(without(3));
    net.node(1).transfer_leader(now, 3).unwrap();
    assert_eq!(net.nodes[&1].transferring_to(), Some(3));
    assert_eq!(
        net.append(1, txn(&[9], &[10]), vec![]),
        Err(OooAppendError::Transferring { to: 3 })
    );
    let timeout = net.nodes[&1].cfg.election_timeout;
    let mut waited = 0;
    while net.nodes[&1].transferring_to().is_some() {
        assert!(waited <= timeout + hb, "the transfer never gave up");
        waited += hb;
        net.tick_with(1, hb, without(3));
    }
    let r1 = &net.nodes[&1];
    assert!(r1.is_serving(), "node 1 kept leading");
    assert_eq!((r1.stats().transfers, r1.stats().transfers_expired), (0, 1));
    net.append(1, txn(&[20], &[21]), vec![20]).unwrap();
    net.run();
    // To node 2, connected: it catches up on the next heartbeat, is told to campaign,
    // wins and merges; node 1 follows it.
    let now = net.now;
    net.node(1).transfer_leader(now, 2).unwrap();
    for _ in 0..3 {
        net.tick(1, hb);
    }
    assert_eq!(net.nodes[&1].stats().transfers, 1);
    assert_eq!(net.nodes[&2].stats().transfer_campaigns, 1);
    assert!(
        net.nodes[&2].is_serving(),
        "node 2 leads after the transfer"
    );
    assert_eq!(net.nodes[&1].leader(), Some(2));
    assert_eq!(net.nodes[&3].leader(), Some(2));
    net.append(2, txn(&[30], &[31]), vec![30]).unwrap();
    net.run();
    // Every append ended once, committed: five, the one after the given-up transfer,
    // and the new leader's.
    assert_eq!(net.results.len(), 7, "{:?}", net.results);
    assert!(net.results.iter().all(|r| r.2 == Outcome::Committed));
    net.tick(2, hb);
    let head = net.nodes[&2].applied_head();
    let log = net.nodes[&2].read_committed(0, 100).unwrap();
    assert_eq!(log.iter().filter(|e| !e.is_null()).count(), 7);
    for id in 1..=3 {
        assert_eq!(net.nodes[&id].applied_head(), head, "node {id}");
        assert_eq!(
            net.nodes[&id].read_committed(0, 100).unwrap(),
            log,
            "node {id}"
        );
    }
}

/// Pre-vote (Raft thesis section 9.6): a follower cut off from the others keeps
/// timing out, but no pre-vote of its succeeds, so its term stays; when it returns
/// the leader keeps serving at its term. Without pre-vote the same run raises its
/// term and the returning follower deposes the leader. A replica whose log is behind
/// cannot win a pre-vote even once no leader is heard, so it never raises the term.
#[test]
fn a_cut_off_follower_returns_without_deposing_the_leader() {
    for pre_vote in [true, false] {
        let mut net = Net::with(3, Mode::Dependent, |c| c.pre_vote = pre_vote);
        net.elect(1);
        let term = net.nodes[&1].term();
        let hb = net.nodes[&1].cfg.heartbeat_interval;
        let timeout = net.nodes[&1].cfg.election_timeout;
        // Ten election timeouts of node 3 alone, heartbeats flowing between 1 and 2,
        // with an append now and then.
        let mut k = 0;
        while net.now < 10_000_000_000 + 10 * 2 * timeout {
            net.tick_all(hb);
            if k % 4 == 0 {
                net.append(1, txn(&[], &[k]), vec![]).unwrap();
            }
            k += 1;
            net.run_with(without(3));
        }
        let r3 = &net.nodes[&3];
        if pre_vote {
            assert!(r3.stats().pre_votes >= 5, "{:?}", r3.stats());
            assert_eq!((r3.term(), r3.stats().campaigns), (term, 0));
        } else {
            assert!(r3.term() > term + 3, "term {}", r3.term());
        }
        // Node 3 returns.
        for _ in 0..10 {
            net.tick_all(hb);
            net.run();
        }
        let (r1, r3) = (&net.nodes[&1], &net.nodes[&3]);
        if pre_vote {
            assert!(r1.is_serving() && r1.term() == term, "node 1 deposed");
            assert_eq!(r3.leader(), Some(1));
            assert_eq!(r3.applied_head(), r1.applied_head());
        } else {
            assert!(r1.term() > term, "node 1 kept its term without pre-vote");
        }
    }
    // A replica with a shorter log: with no leader heard for an election timeout,
    // node 2 (behind) asks and is refused by node 1 (newer log), so it never raises
    // the term; node 1's own pre-vote then wins.
    let mut net = Net::new(3, Mode::Dependent);
    net.elect(1);
    let term = net.nodes[&1].term();
    net.append(1, txn(&[], &[1]), vec![]).unwrap();
    // Only node 3 gets the entry; then node 1 crashes.
    net.run_with(|f, t, _| f == 1 && t == 3);
    assert_eq!(net.nodes[&3].log.len(), 1);
    net.nodes.remove(&1);
    let down = |_: NodeId, t: NodeId, _: &Msg| t != 1;
    net.tick_with(2, 10_000_000_000, down);
    let (r2, r3) = (&net.nodes[&2], &net.nodes[&3]);
    assert_eq!(r2.stats().pre_votes, 1);
    assert_eq!(
        (r2.term(), r3.term()),
        (term, term),
        "a hopeless pre-vote raised a term"
    );
    assert!(!r2.is_serving());
    net.tick_with(3, 0, down);
    assert!(net.nodes[&3].is_serving());
    assert_eq!(net.nodes[&3].term(), term + 1);
}

#[test]
fn a_vote_too_large_for_one_message_comes_in_pieces_and_counts_once_whole() {
    // One entry per piece: every vote past the candidate's head is paged.
    let mut net = Net::with(3, Mode::Parallel { span: 2 }, |c| c.vote_bytes = 1);
    net.elect(1);
    // Ten writes reach both followers, but no acknowledgement reaches the leader: nothing
    // commits, and every follower holds all ten past its head.
    let tickets: Vec<Ticket> = (0..10).map(|b| net.append_block(b)).collect();
    net.run_with(|_, _, m| !matches!(m, Msg::Ack { .. }));
    assert!(tickets.iter().all(|t| !net.committed_on(1, t.eid)));
    // Node 1 goes away; node 2 campaigns, and node 3's vote arrives piece by piece. The
    // first piece alone is not a vote: dropping every request for the next one leaves
    // node 2 a candidate.
    net.now += 10_000_000_000;
    let now = net.now;
    net.node(2).tick(now);
    net.run_with(|f, t, m| f != 1 && t != 1 && !matches!(m, Msg::VoteMore { .. }));
    assert!(!net.nodes[&2].is_serving(), "a partial vote counted");
    assert_eq!(net.nodes[&3].stats().vote_parts_sent, 0);
    // The next campaign asks for every piece and wins; the merge keeps all ten writes,
    // and they commit.
    net.now += 10_000_000_000;
    let now = net.now;
    net.node(2).tick(now);
    net.run_with(without(1));
    assert!(net.nodes[&2].is_serving(), "node 2 won with the whole vote");
    assert!(net.nodes[&3].stats().vote_parts_sent >= 9);
    let head = net.nodes[&2].committed_head();
    assert!(head > tickets.last().unwrap().seq, "head {head}");
    for t in &tickets {
        let held = &net.nodes[&2].log[&t.seq];
        assert!(held.committed, "slot {} not committed", t.seq);
        assert_eq!(held.entry.eid, t.eid, "slot {} lost its write", t.seq);
    }
}

#[test]
fn the_strict_check_refuses_a_transfer_to_a_node_down_or_behind() {
    let mut net = Net::with(3, Mode::Parallel { span: 2 }, |c| c.window = 4);
    net.elect(1);
    let timeout = net.nodes[&1].cfg.election_timeout;
    let hb = net.nodes[&1].cfg.heartbeat_interval;
    // Node 3 cut off for more than an election timeout while node 1 commits ten writes
    // with node 2.
    for b in 0..10 {
        net.append_block(b);
        net.run_with(without(3));
    }
    let mut waited = 0;
    while waited <= timeout {
        net.tick_with(1, hb, without(3));
        waited += hb;
    }
    let now = net.now;
    assert_eq!(
        net.node(1).transfer_leader_checked(now, 3, false),
        Err(OooTransferError::NotHeard { to: 3 })
    );
    assert_eq!(
        net.nodes[&1].transferring_to(),
        None,
        "a refused transfer started"
    );
    // Node 3 answers again, but holds nothing of the ten: more than a window behind.
    // (Only its acknowledgement of a heartbeat reaches the leader: nothing is resent.)
    net.tick_with(
        1,
        hb,
        |_, _, m| !matches!(m, Msg::Append { entries, .. } if !entries.is_empty()),
    );
    let err = net
        .node(1)
        .transfer_leader_checked(now, 3, false)
        .unwrap_err();
    assert!(
        matches!(err, OooTransferError::Behind { to: 3, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("is behind"), "{err}");
    // To node 2, heard and caught up: allowed. Forced, node 3 is allowed too.
    net.node(1).transfer_leader_checked(now, 2, false).unwrap();
    assert_eq!(net.nodes[&1].transferring_to(), Some(2));
    net.node(1).transfer_leader_checked(now, 3, true).unwrap();
    assert_eq!(net.nodes[&1].transferring_to(), Some(3));
}

/// A candidate whose election timed out asks for pre-votes at the same term (the term
/// is raised only once a quorum says yes), so a vote of its campaign that arrives late
/// still counts: the votes are promises for that term, and it wins it. Winning must
/// end the pre-vote it had begun (once a real cluster's group panicked here, in its
/// invariant check, and stopped answering).
#[test]
fn a_vote_that_arrives_after_the_next_pre_vote_began_still_wins_the_term() {
    use std::cell::RefCell;
    let mut net = Net::new(3, Mode::Parallel { span: 2 });
    // Node 1 campaigns; the votes it is granted are held back.
    let held = RefCell::new(Vec::new());
    net.now += 10_000_000_000;
    let now = net.now;
    net.node(1).tick(now);
    net.run_with(|f, t, m| {
        if matches!(m, Msg::VoteReply { granted: true, .. }) {
            held.borrow_mut().push((f, t, m.clone()));
            return false;
        }
        true
    });
    let held = held.into_inner();
    assert_eq!(net.nodes[&1].role(), Role::Candidate);
    assert_eq!(net.nodes[&1].term(), 1);
    assert_eq!(held.len(), 2, "both followers granted");
    // Its election times out: it asks for pre-votes for term 2, still a candidate at 1.
    net.now += 10_000_000_000;
    let now = net.now;
    net.node(1).tick(now);
    assert_eq!(net.nodes[&1].stats().pre_votes, 2);
    assert_eq!(net.nodes[&1].term(), 1);
    // A vote of term 1 arrives: a majority with its own, so it wins term 1.
    let (from, to, msg) = held[0].clone();
    net.node(to).receive(now, from, msg);
    net.run();
    assert!(net.nodes[&1].is_serving());
    assert_eq!(net.nodes[&1].term(), 1);
    let t = net.append_block(7);
    net.run();
    net.tick_all(1_000_000);
    assert!(net.committed_on(1, t.eid));
}
