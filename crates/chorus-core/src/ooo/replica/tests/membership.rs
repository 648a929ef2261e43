//! Membership changes by joint consensus: a change waits in its joint stage until the
//! new voters can form a majority, and a leader that removes itself hands over.

use super::*;

/// Voters join and leave by joint consensus: a change waits in its joint stage while
/// the new voters cannot form a majority (appends meanwhile need both majorities),
/// completes once they can, and a leader that removes itself decides its appends,
/// steps down and never campaigns again.
#[test]
fn voters_are_added_and_removed_by_joint_consensus() {
    let mode = Mode::Parallel { span: 2 };
    let mut net = Net::new(3, mode);
    // Node 4 joins: it knows no voters yet, so it does not campaign.
    net.nodes
        .insert(4, OooReplica::new(OooConfig::new(4, Vec::new(), mode), 0));
    net.elect(1);
    let hb = net.nodes[&1].cfg.heartbeat_interval;
    let append = |net: &mut Net, id: NodeId, b: u64| net.append(id, blocks(b, 1), vec![b as u8]);
    for b in 0..5 {
        append(&mut net, 1, b).unwrap();
    }
    net.run();
    assert_eq!(net.nodes[&4].stats().campaigns, 0);
    // Refusals.
    let now = net.now;
    assert_eq!(
        net.node(2)
            .change_membership(now, OooMembershipChange::AddVoter(4)),
        Err(OooChangeError::NotLeader { leader: Some(1) })
    );
    for bad in [
        OooMembershipChange::AddVoter(2),
        OooMembershipChange::Remove(9),
        OooMembershipChange::AddVoter(0),
    ] {
        assert!(matches!(
            net.node(1).change_membership(now, bad),
            Err(OooChangeError::Invalid { .. })
        ));
    }
    // Add node 4 while nodes 2 and 4 are cut off: {1, 3} is a majority of the old
    // voters but not of the new, so the joint stage is not accepted and an append
    // does not commit.
    let cut = |f: NodeId, t: NodeId, _: &Msg| ![f, t].iter().any(|n| *n == 2 || *n == 4);
    net.node(1)
        .change_membership(now, OooMembershipChange::AddVoter(4))
        .unwrap();
    assert_eq!(net.nodes[&1].changing_to(), Some(&[1, 2, 3, 4][..]));
    assert!(matches!(
        net.node(1)
            .change_membership(now, OooMembershipChange::Remove(3)),
        Err(OooChangeError::InProgress { .. })
    ));
    let before = net.results.len();
    let t = append(&mut net, 1, 100).unwrap();
    for _ in 0..4 {
        net.tick_with(1, hb, cut);
    }
    assert_eq!(
        net.results.len(),
        before,
        "committed without the new majority"
    );
    assert_eq!(
        net.nodes[&1].membership().prev.as_deref(),
        Some(&[1, 2, 3][..])
    );
    assert_eq!(net.nodes[&3].membership(), net.nodes[&1].membership());
    // Healed: node 4 catches up from nothing, both stages are accepted, the append
    // commits, and every replica holds the final membership.
    for _ in 0..6 {
        net.tick(1, hb);
    }
    assert!(net
        .results
        .iter()
        .any(|r| r.1 == t.eid && r.2 == Outcome::Committed));
    assert_eq!(net.nodes[&1].changing_to(), None);
    assert_eq!(net.nodes[&1].stats().membership_changes, 1);
    for id in 1..=4 {
        let m = net.nodes[&id].membership();
        assert_eq!(
            (m.voters.as_slice(), m.prev.as_ref()),
            (&[1, 2, 3, 4][..], None),
            "node {id}"
        );
    }
    let want = net.nodes[&1].read_committed(0, 100).unwrap();
    assert_eq!(net.nodes[&4].read_committed(0, 100).unwrap(), want);
    assert_eq!(want.len(), 6);
    // Remove the leader: it refuses appends, finishes the change, steps down, tells a
    // caught-up voter to campaign at once (no election timeout passes) and stays
    // quiet; the other three elect a leader and go on.
    let now = net.now;
    net.node(1)
        .change_membership(now, OooMembershipChange::Remove(1))
        .unwrap();
    assert!(matches!(
        append(&mut net, 1, 7),
        Err(OooAppendError::Leaving { .. })
    ));
    for _ in 0..4 {
        net.tick(1, hb);
    }
    assert!(!net.nodes[&1].is_serving());
    assert_eq!(net.nodes[&1].membership().voters, vec![2, 3, 4]);
    assert_eq!(net.nodes[&1].stats().handoffs, 1);
    let s = (2..=4)
        .find(|n| net.nodes[n].is_serving())
        .expect("no voter took over at once");
    assert_eq!(net.nodes[&s].stats().transfer_campaigns, 1);
    let campaigns = net.nodes[&1].stats().campaigns;
    append(&mut net, s, 200).unwrap();
    net.run();
    for _ in 0..3 {
        net.now += hb;
        let now = net.now;
        net.node(1).tick(now);
        net.node(s).tick(now);
        net.run();
    }
    assert_eq!(net.nodes[&1].stats().campaigns, campaigns);
    let other = if s == 4 { 2 } else { 4 };
    assert!(net.nodes[&other].committed_head() > net.nodes[&1].committed_head());
    assert_eq!(
        net.nodes[&other].committed_head(),
        net.nodes[&s].committed_head()
    );
}

/// The strict check: with node 3 silent for an election timeout, removing node 2 would
/// leave voters {1, 3} of which only the leader answers, and is refused by name, changing
/// nothing; removing the silent node itself, or forcing, goes through.
#[test]
fn the_strict_check_refuses_a_removal_that_would_stop_the_group() {
    let mut net = Net::new(3, Mode::Parallel { span: 2 });
    net.elect(1);
    let timeout = net.nodes[&1].cfg.election_timeout;
    let hb = net.nodes[&1].cfg.heartbeat_interval;
    let mut waited = 0;
    while waited <= timeout {
        net.tick_with(1, hb, without(3));
        waited += hb;
    }
    assert!(net.nodes[&1].is_serving());
    let now = net.now;
    let err = net
        .node(1)
        .change_membership_checked(now, OooMembershipChange::Remove(2), false)
        .unwrap_err();
    assert!(matches!(err, OooChangeError::Unsafe(_)), "{err:?}");
    assert!(
        err.to_string().contains("only [1] have been heard"),
        "{err}"
    );
    assert!(
        net.nodes[&1].changing_to().is_none(),
        "a refused change started"
    );
    // A replacement that brings in a node not yet heard from counts it down too.
    let err = net
        .node(1)
        .strict_check(&OooMembershipChange::Replace { remove: 2, add: 4 })
        .unwrap_err();
    assert!(err.to_string().contains("[1, 3, 4]"), "{err}");
    // Removing the silent node leaves {1, 2}, both heard: allowed.
    net.node(1)
        .strict_check(&OooMembershipChange::Remove(3))
        .unwrap();
    // Forced, the unsafe removal starts.
    net.node(1)
        .change_membership_checked(now, OooMembershipChange::Remove(2), true)
        .unwrap();
    assert_eq!(net.nodes[&1].changing_to(), Some(&[1, 3][..]));
    // A follower refuses: only the serving leader checks.
    assert!(matches!(
        net.node(2).strict_check(&OooMembershipChange::Remove(3)),
        Err(OooChangeError::NotLeader { .. })
    ));
}
