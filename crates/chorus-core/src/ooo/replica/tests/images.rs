//! Compaction and images: a follower behind the leader's base installs an image, a
//! partial one when the leader remembers what the slots it lacks wrote (PolarFS section
//! 5.4, fast catch-up), and a partial image built for more than it applied is refused.

use super::*;
use crate::ooo::dependent::grants_vote;

/// Appends one single-block write at `block` through node 1 and runs the net with
/// node 3 cut off.
fn write_without_3(net: &mut Net, block: u64, byte: u8) {
    net.append(1, blocks(block, 1), vec![byte; 40]).unwrap();
    net.run_with(without(3));
}

#[test]
fn a_follower_behind_the_base_installs_the_leaders_image_and_continues() {
    // Pieces of 64 bytes: the image goes in several.
    let mut net = Net::with(3, Mode::Parallel { span: 2 }, |c| c.max_batch_bytes = 64);
    net.elect(1);
    for i in 0..10u64 {
        net.append(1, blocks(i % 4, 1), vec![i as u8; 40]).unwrap();
        net.run_with(without(3));
    }
    // The leader heard node 3 lately (at its election): compacting now would send it an
    // image, so `compactable` holds back at its head; a follower has no one to wait for.
    assert_eq!(net.nodes[&1].compactable(), 0);
    assert_eq!(net.nodes[&2].compactable(), 10);
    for id in [1, 2] {
        let r = net.node(id);
        assert_eq!(r.applied_head(), 10);
        r.compact(0, 10);
        assert_eq!(r.base(), 10);
        assert_eq!(
            r.read_committed(9, 10),
            Err(OooReadError::Compacted { from: 9, base: 10 })
        );
        let acts = r.take_actions();
        let save = acts
            .iter()
            .position(|a| matches!(a, Action::SaveHard(h) if h.base == 10));
        let compact = acts
            .iter()
            .position(|a| matches!(a, Action::Compact { base: 10, live } if live.is_empty()));
        assert!(
            save.is_some() && compact.is_some() && save < compact,
            "{acts:?}"
        );
    }
    assert!(net.nodes[&3].applied_head() == 0);
    // Node 3 is back: it is below the leader's base, so it gets the image, then the
    // log from 10 on.
    net.tick(1, 60_000_000);
    net.append(1, blocks(7, 1), vec![99; 8]).unwrap();
    net.run();
    let n3 = &net.nodes[&3];
    assert_eq!(n3.stats().snapshots_installed, 1);
    assert_eq!(n3.base(), 10);
    assert_eq!(n3.applied_head(), 11);
    assert_eq!(net.nodes[&1].stats().snapshots_sent, 1);
    assert_eq!(net.state[&3], net.state[&1]);
    assert_eq!(net.state[&1].len(), 5);
    // Node 3 never applied the slots below the base: the image holds them.
    assert_eq!(net.applied[&3], vec![10]);
    // A candidate below a voter's base is refused: node 3 restarted from nothing
    // cannot lead.
    let fresh = OooReplica::new(
        OooConfig::new(3, vec![1, 2, 3], Mode::Parallel { span: 2 }),
        0,
    );
    assert!(!grants_vote(&net.nodes[&2].vote_log(), &fresh.vote_log()));
}

#[test]
fn a_follower_that_applied_most_of_the_log_gets_only_what_it_lacks() {
    // PolarFS 5.3 fast catch-up: node 3 applied slots 0..8 (blocks 0..8), then missed
    // four writes to blocks 20 and 21 that were compacted. Its image is partial: those
    // two blocks, not the volume.
    let mut net = Net::new(3, Mode::Parallel { span: 2 });
    net.elect(1);
    for i in 0..8u64 {
        net.append(1, blocks(i, 1), vec![i as u8; 40]).unwrap();
        net.run();
    }
    // A heartbeat carries the last commits to node 3.
    net.tick(1, 60_000_000);
    assert_eq!(net.nodes[&3].applied_head(), 8);
    for (i, b) in [20u64, 21, 20, 21].into_iter().enumerate() {
        write_without_3(&mut net, b, 100 + i as u8);
    }
    for id in [1, 2] {
        let now = net.now;
        let r = net.node(id);
        r.compact(now, 12);
        assert_eq!(r.base(), 12);
    }
    net.tick(1, 60_000_000);
    assert_eq!(net.nodes[&1].stats().partial_images, 1);
    assert_eq!(net.installs.len(), 1, "{:?}", net.installs);
    let (node, part, bytes) = net.installs[0];
    assert!(node == 3 && part, "{:?}", net.installs);
    // Scope (one range) and two 40-byte blocks: far less than the nine-block state.
    assert!(bytes < image(&net.state[&1]).len() / 2, "{bytes} bytes");
    assert_eq!(net.nodes[&3].base(), 12);
    assert_eq!(net.state[&3], net.state[&1]);
    assert_eq!(net.state[&1].len(), 10);
    // It goes on with the log.
    net.append(1, blocks(3, 1), vec![7; 8]).unwrap();
    net.run();
    assert_eq!(net.nodes[&3].applied_head(), 13);
    assert_eq!(net.state[&3], net.state[&1]);
}

#[test]
fn a_partial_image_needs_what_the_leader_remembers_and_a_bound() {
    // Bound 1: the two blocks node 3 lacks are too many, so it gets the whole state.
    let mut net = Net::with(3, Mode::Parallel { span: 2 }, |c| c.partial_image_items = 1);
    net.elect(1);
    for (i, b) in [20u64, 21, 20, 21].into_iter().enumerate() {
        write_without_3(&mut net, b, i as u8);
    }
    for id in [1, 2] {
        let now = net.now;
        net.node(id).compact(now, 4);
    }
    net.tick(1, 60_000_000);
    assert_eq!(net.nodes[&1].stats().partial_images, 0);
    assert_eq!(net.installs, vec![(3, false, image(&net.state[&1]).len())]);
    assert_eq!(net.state[&3], net.state[&1]);

    // A leader elected after the compaction remembers what it compacted itself; one
    // that restarted does not, and sends the whole state.
    let mut net = Net::new(3, Mode::Parallel { span: 2 });
    net.elect(1);
    for (i, b) in [20u64, 21].into_iter().enumerate() {
        write_without_3(&mut net, b, i as u8);
    }
    for id in [1, 2] {
        let now = net.now;
        net.node(id).compact(now, 2);
    }
    assert!(net.nodes[&2].image_scope(3).is_none(), "not leading");
    let r1 = &net.nodes[&1];
    let scope = r1.image_scope(3).expect("partial");
    assert_eq!(scope.0, 0);
    assert_eq!(scope.1.blocks, vec![BlockRange::new(20, 2).unwrap()]);
    let restarted = OooReplica::recover(
        OooConfig::new(1, vec![1, 2, 3], Mode::Parallel { span: 2 }),
        r1.hard,
        None,
        Vec::new(),
        net.now,
    );
    assert_eq!(restarted.written_from, 2);
}

#[test]
fn a_partial_image_built_for_more_than_was_applied_is_refused() {
    // Node 3 has applied nothing; an image that assumes slots below 3 applied would
    // leave their writes out. It is refused, and the leader hears what node 3 has.
    let mut net = Net::new(3, Mode::Parallel { span: 2 });
    net.elect(1);
    let term = net.nodes[&1].hard.term;
    let now = net.now;
    let r3 = net.node(3);
    r3.receive(
        now,
        1,
        Msg::Snapshot {
            term,
            base: 5,
            offset: 0,
            total: 8,
            part: Some(3),
            data: 0u64.to_le_bytes().to_vec(),
        },
    );
    assert_eq!(r3.stats().partial_images_refused, 1);
    let acts = r3.take_actions();
    assert!(
        !acts.iter().any(|a| matches!(a, Action::Install { .. })),
        "{acts:?}"
    );
    assert!(
        sent(&acts, 1).any(|m| matches!(m, Msg::Ack { applied: 0, .. })),
        "{acts:?}"
    );
    assert_eq!(r3.base(), 0);
}
