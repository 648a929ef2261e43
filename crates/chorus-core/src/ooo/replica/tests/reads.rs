//! Leader reads (the `reads` module): served once a quorum confirmed the leader and it
//! applied what was committed when the read arrived; refused on a leader deposed behind
//! its back.

use super::*;

#[test]
fn a_read_waits_for_a_quorum_to_confirm_the_leader() {
    let mut net = Net::new(3, Mode::Parallel { span: 2 });
    net.elect(1);
    let t = net.append_block(5);
    net.run();
    assert!(net.committed_on(1, t.eid));
    let now = net.now;
    let read = net.node(1).read_index(now).unwrap();
    assert_eq!(read.want, net.nodes[&1].committed_head());
    // A second read before the probe goes out shares it.
    assert_eq!(net.node(1).read_index(now).unwrap().probe, read.probe);
    net.node(1).send_read_probes();
    // No answer yet: the probes are still in the leader's outbox.
    assert_eq!(net.nodes[&1].read_ready(&read), Ok(false));
    // Node 2's answer alone makes a quorum with the leader.
    net.run_with(|from, _, m| !matches!(m, Msg::ReadProbeAck { .. }) || from == 2);
    assert_eq!(net.nodes[&1].read_ready(&read), Ok(true));
    // A follower refuses: only the serving leader takes leader reads.
    let now = net.now;
    assert_eq!(
        net.node(2).read_index(now),
        Err(OooReadIndexError::NotLeader { leader: Some(1) })
    );
}

#[test]
fn unanswered_probes_go_again_on_the_tick() {
    let mut net = Net::new(3, Mode::Parallel { span: 2 });
    net.elect(1);
    let now = net.now;
    let read = net.node(1).read_index(now).unwrap();
    net.node(1).send_read_probes();
    net.run_with(|_, _, m| !matches!(m, Msg::ReadProbe { .. }));
    assert_eq!(net.nodes[&1].read_ready(&read), Ok(false), "probes lost");
    let hb = net.nodes[&1].cfg.heartbeat_interval;
    net.tick(1, hb);
    assert_eq!(net.nodes[&1].read_ready(&read), Ok(true), "sent again");
}

#[test]
fn a_leader_deposed_behind_its_back_serves_no_read() {
    let mut net = Net::new(3, Mode::Parallel { span: 2 });
    net.elect(1);
    // Nodes 2 and 3 elect node 2 without node 1 hearing of it, and commit a write.
    net.now += 10_000_000_000;
    let now = net.now;
    net.node(2).tick(now);
    net.run_with(without(1));
    assert!(net.nodes[&2].is_serving());
    assert!(net.nodes[&1].is_serving(), "node 1 has not heard");
    let t = net.append(2, blocks(7, 1), vec![2]).unwrap();
    net.run_with(without(1));
    assert!(net.committed_on(2, t.eid));
    // Node 1 still takes the read, but the probes' answers carry term 2: it steps down
    // and the read is refused instead of serving a state without the write.
    let now = net.now;
    let read = net.node(1).read_index(now).unwrap();
    net.node(1).send_read_probes();
    net.run();
    assert!(!net.nodes[&1].is_serving());
    assert!(net.nodes[&1].read_ready(&read).is_err());
}
