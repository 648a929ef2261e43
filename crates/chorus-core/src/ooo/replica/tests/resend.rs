//! Resends: a slot a follower was overtaken on goes again at once (and again if that
//! copy is overtaken too), a lone last slot after a timeout of a few round trips, and a
//! committed slot a follower lacks too, so it can apply what comes after.

use super::*;

/// A resent copy overtaken in turn (lost here) is sent again once the follower
/// acknowledges `hole_resend` more slots past the one that triggered the first
/// resend — not before — so a slot lost twice does not wait for the resend interval.
#[test]
fn a_slot_whose_resend_is_overtaken_too_is_sent_again() {
    let mut net = Net::with(3, Mode::Parallel { span: 2 }, |c| c.hole_resend = 3);
    net.elect(1);
    let a = net.append_block(0);
    // Every copy of `a` to node 3 is lost until two are (the first copy and the first
    // resend).
    let loss = Loss::new(2, Some(3), |m: &Msg| carries(m, &a));
    let run = |net: &mut Net| net.run_with(|f, t, m| loss.keep(f, t, m));
    run(&mut net);
    let holds_a = |net: &Net| net.nodes[&3].log.contains_key(&a.seq);
    for b in 1..=3 {
        net.append_block(b);
        run(&mut net);
    }
    // The third later acknowledgement sent `a` again; that copy was lost too.
    assert_eq!(loss.lost(), 2);
    assert_eq!(net.nodes[&1].stats().hole_resends, 1);
    assert!(!holds_a(&net));
    // Two more acknowledged past it: not yet.
    for b in 4..=5 {
        net.append_block(b);
        run(&mut net);
    }
    assert_eq!(net.nodes[&1].stats().hole_resends, 1);
    assert!(!holds_a(&net));
    // The third more: sent again, and this copy arrives.
    net.append_block(6);
    run(&mut net);
    assert_eq!(net.nodes[&1].stats().hole_resends, 2);
    assert!(holds_a(&net), "node 3 holds a after the second resend");
}

/// The last slot sent, whose first copies both followers miss, has nothing after it
/// to overtake it: the hole rule never fires. It is resent to each follower once it
/// went unacknowledged for `timed_resend` median round trips (here the floor,
/// [`crate::rtt::MIN_TIMEOUT`]: every round trip in this network takes no time), not
/// before, and then commits; with `timed_resend = 0` it waits for the resend interval.
#[test]
fn a_lone_slot_both_followers_miss_is_resent_on_time() {
    for factor in [TIMED_RESEND, 0] {
        let mut net = Net::with(3, Mode::Parallel { span: 2 }, |c| c.timed_resend = factor);
        net.elect(1);
        // Round trips to learn from.
        for b in 0..8 {
            net.append_block(b);
            net.run();
        }
        let a = net.append_block(9);
        let loss = Loss::new(2, None, |m: &Msg| carries(m, &a));
        net.run_with(|f, t, m| loss.keep(f, t, m));
        assert_eq!(loss.lost(), 2, "both first copies dropped");
        let due = net.nodes[&1].resend_due();
        net.tick(1, crate::rtt::MIN_TIMEOUT - 1);
        assert!(!net.committed_on(1, a.eid), "resent before its timeout");
        assert_eq!(net.nodes[&1].stats().timed_resends, 0);
        net.tick(1, 1);
        let st = net.nodes[&1].stats();
        if factor > 0 {
            assert_eq!(due, Some(net.now), "the driver is told when to wake");
            assert!(net.committed_on(1, a.eid), "resent on time and committed");
            assert_eq!(st.timed_resends, 2, "once to each follower");
            assert_eq!(net.nodes[&1].resend_due(), None, "nothing in flight");
        } else {
            assert_eq!(due, None);
            assert!(!net.committed_on(1, a.eid));
            assert_eq!(st.timed_resends, 0);
            net.tick(1, 50_000_000);
            assert!(net.committed_on(1, a.eid), "the periodic resend");
        }
    }
}

/// A slot whose first copy both followers miss is resent as soon as each
/// acknowledges a slot `hole_resend` later, without waiting for the resend interval
/// (the clock never moves here); not again on the next acknowledgement; never with
/// `hole_resend = 0`.
#[test]
fn a_follower_overtaken_on_a_slot_gets_it_again_at_once() {
    for k in [3u64, 0] {
        let mut net = Net::with(3, Mode::Parallel { span: 2 }, |c| c.hole_resend = k);
        net.elect(1);
        let a = net.append_block(0);
        // Only the first copy of `a` is lost: a copy sent alone.
        let first_copy_of_a = |m: &Msg| {
            matches!(m, Msg::Append { entries, .. } if entries.len() == 1) && carries(m, &a)
        };
        let loss = Loss::new(2, None, first_copy_of_a);
        let run = |net: &mut Net| net.run_with(|f, t, m| loss.keep(f, t, m));
        run(&mut net);
        assert_eq!(loss.lost(), 2, "both followers' first copy of a dropped");
        // Two later slots acknowledged: not yet.
        for b in 1..=2 {
            let t = net.append_block(b);
            run(&mut net);
            assert!(net.committed_on(1, t.eid));
        }
        assert!(!net.committed_on(1, a.eid));
        assert_eq!(net.nodes[&1].stats().hole_resends, 0);
        // The third: `a` goes again to both followers and commits.
        let t = net.append_block(3);
        run(&mut net);
        assert!(net.committed_on(1, t.eid));
        let st = net.nodes[&1].stats();
        if k == 3 {
            assert!(net.committed_on(1, a.eid), "a resent and committed");
            assert_eq!(st.hole_resends, 2, "once to each follower");
        } else {
            assert!(!net.committed_on(1, a.eid), "no resend before the interval");
            assert_eq!(st.hole_resends, 0);
        }
        // More slots: nothing resent again.
        for b in 4..=8 {
            net.append_block(b);
            run(&mut net);
        }
        assert_eq!(net.nodes[&1].stats().hole_resends, st.hole_resends);
    }
}

/// A slot committed without one follower (the other and the leader hold it) is
/// resent to it too, so it can apply what comes after; never with `hole_resend = 0`.
#[test]
fn a_follower_missing_a_committed_slot_gets_it_again_at_once() {
    for k in [3u64, 0] {
        let mut net = Net::with(3, Mode::Parallel { span: 2 }, |c| c.hole_resend = k);
        net.elect(1);
        let a = net.append_block(0);
        let loss = Loss::new(1, Some(3), |m: &Msg| carries(m, &a));
        let run = |net: &mut Net| net.run_with(|f, t, m| loss.keep(f, t, m));
        run(&mut net);
        assert_eq!(loss.lost(), 1);
        assert!(
            net.results.iter().any(|r| r.0 == 1 && r.1 == a.eid),
            "a committed with node 2"
        );
        for b in 1..=5 {
            net.append_block(b);
            run(&mut net);
        }
        let node3_applied_a = net.applied.get(&3).is_some_and(|v| v.contains(&a.seq));
        let st = net.nodes[&1].stats();
        if k == 3 {
            assert!(node3_applied_a, "node 3 got a again and applied it");
            assert_eq!(st.hole_resends, 1, "once, to node 3 only");
        } else {
            assert!(!node3_applied_a, "no resend before the interval");
            assert_eq!(st.hole_resends, 0);
        }
    }
}
