//! Tests of the parent module.

use super::*;
use crate::ooo::dependent::grants_vote;
use crate::ooo::parallel::BlockRange;
use crate::ooo::OooError;
use crate::replica::Outcome;

/// Delivers every message at once, in order, with no faults; applies at once to a
/// block map per node (the first block of each range gets the record).
struct Net {
    nodes: BTreeMap<NodeId, OooReplica>,
    results: Vec<(NodeId, u64, Outcome)>,
    applied: BTreeMap<NodeId, Vec<Seq>>,
    state: BTreeMap<NodeId, BTreeMap<u64, Vec<u8>>>,
    /// Images installed: (node, partial, bytes).
    installs: Vec<(NodeId, bool, usize)>,
    now: Nanos,
}

fn image(m: &BTreeMap<u64, Vec<u8>>) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in m {
        out.extend_from_slice(&k.to_le_bytes());
        out.extend_from_slice(&(v.len() as u64).to_le_bytes());
        out.extend_from_slice(v);
    }
    out
}

/// The blocks of `f` (this harness keys its state by a range's first block): the
/// scope's ranges, then the entries within them.
fn image_part(m: &BTreeMap<u64, Vec<u8>>, f: &Footprint) -> Vec<u8> {
    let mut out = (f.blocks.len() as u64).to_le_bytes().to_vec();
    for r in &f.blocks {
        out.extend_from_slice(&r.start.to_le_bytes());
        out.extend_from_slice(&r.end.to_le_bytes());
    }
    let inside: BTreeMap<u64, Vec<u8>> = m
        .iter()
        .filter(|(k, _)| f.blocks.iter().any(|r| (r.start..r.end).contains(*k)))
        .map(|(k, v)| (*k, v.clone()))
        .collect();
    out.extend(image(&inside));
    out
}

fn restore_part(m: &mut BTreeMap<u64, Vec<u8>>, b: &[u8]) {
    let u = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    let n = u(0) as usize;
    for i in 0..n {
        let (start, end) = (u(8 + 16 * i), u(16 + 16 * i));
        m.retain(|k, _| !(start..end).contains(k));
    }
    m.extend(restore(&b[8 + 16 * n..]));
}

fn restore(mut b: &[u8]) -> BTreeMap<u64, Vec<u8>> {
    let mut m = BTreeMap::new();
    while !b.is_empty() {
        let k = u64::from_le_bytes(b[..8].try_into().unwrap());
        let n = u64::from_le_bytes(b[8..16].try_into().unwrap()) as usize;
        m.insert(k, b[16..16 + n].to_vec());
        b = &b[16 + n..];
    }
    m
}

impl Net {
    fn new(n: u64, mode: Mode) -> Self {
        Self::with(n, mode, |_| {})
    }

    fn with(n: u64, mode: Mode, f: impl Fn(&mut OooConfig)) -> Self {
        let voters: Vec<NodeId> = (1..=n).collect();
        let nodes = voters
            .iter()
            .map(|&id| {
                let mut cfg = OooConfig::new(id, voters.clone(), mode);
                f(&mut cfg);
                (id, OooReplica::new(cfg, 0))
            })
            .collect();
        Self {
            nodes,
            results: Vec::new(),
            applied: BTreeMap::new(),
            state: BTreeMap::new(),
            installs: Vec::new(),
            now: 0,
        }
    }

    fn run(&mut self) {
        self.run_with(|_, _, _| true)
    }

    /// Runs until quiet, delivering only the messages `keep` allows.
    fn run_with(&mut self, keep: impl Fn(NodeId, NodeId, &Msg) -> bool) {
        loop {
            let mut msgs = Vec::new();
            let mut progress = false;
            for (&id, r) in &mut self.nodes {
                let mut written = Vec::new();
                for a in r.take_actions() {
                    match a {
                        Action::Write(e) => written.push((e.seq, e.eid, e.term)),
                        Action::Send { to, msg } => msgs.push((id, to, msg)),
                        Action::Result { eid, outcome, .. } => {
                            self.results.push((id, eid, outcome))
                        }
                        Action::Apply(e) => {
                            self.applied.entry(id).or_default().push(e.seq);
                            if let Body::Parallel { ranges, data, .. } = &e.body {
                                let st = self.state.entry(id).or_default();
                                for rg in ranges {
                                    st.insert(rg.start, data.to_vec());
                                }
                            }
                            r.applied(e.seq).expect("apply");
                        }
                        Action::Snapshot { to } => {
                            let st = self.state.entry(id).or_default();
                            let (base, scope) = (r.applied_head(), r.image_scope(to));
                            let (part, img) = match scope {
                                Some((from, f)) => (Some(from), image_part(st, &f)),
                                None => (None, image(st)),
                            };
                            r.snapshot_ready(self.now, to, base, part, img);
                            progress = true;
                        }
                        Action::Install { base, image, part } => {
                            let st = self.state.entry(id).or_default();
                            if part {
                                restore_part(st, &image);
                            } else {
                                *st = restore(&image);
                            }
                            self.installs.push((id, part, image.len()));
                            r.installed(self.now, base).expect("install");
                            progress = true;
                        }
                        _ => {}
                    }
                }
                if !written.is_empty() {
                    r.persisted(self.now, &written);
                    progress = true;
                }
            }
            if msgs.is_empty() && !progress {
                break;
            }
            for (from, to, m) in msgs.into_iter().filter(|(f, t, m)| keep(*f, *t, m)) {
                self.nodes.get_mut(&to).unwrap().receive(self.now, from, m);
            }
        }
    }

    fn elect(&mut self, id: NodeId) {
        self.now += 10_000_000_000;
        self.nodes.get_mut(&id).unwrap().tick(self.now);
        self.run();
        assert!(self.nodes[&id].is_serving());
    }
}

#[test]
fn a_follower_behind_the_base_installs_the_leaders_image_and_continues() {
    // Pieces of 64 bytes: the image goes in several.
    let mut net = Net::with(3, Mode::Parallel { span: 2 }, |c| c.max_batch_bytes = 64);
    net.elect(1);
    let cut = |f: NodeId, t: NodeId, _: &Msg| f != 3 && t != 3;
    for i in 0..10u64 {
        let d = Declared::Blocks(vec![BlockRange::new(i % 4, 1).unwrap()]);
        net.nodes
            .get_mut(&1)
            .unwrap()
            .append(net.now, d, vec![i as u8; 40])
            .unwrap();
        net.run_with(cut);
    }
    // The leader heard node 3 lately (at its election): compacting now would send it an
    // image, so `compactable` holds back at its head; a follower has no one to wait for.
    assert_eq!(net.nodes[&1].compactable(), 0);
    assert_eq!(net.nodes[&2].compactable(), 10);
    for id in [1, 2] {
        let r = net.nodes.get_mut(&id).unwrap();
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
    net.now += 60_000_000;
    net.nodes.get_mut(&1).unwrap().tick(net.now);
    net.run();
    let d = Declared::Blocks(vec![BlockRange::new(7, 1).unwrap()]);
    net.nodes
        .get_mut(&1)
        .unwrap()
        .append(net.now, d, vec![99; 8])
        .unwrap();
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

/// Appends one single-block write at `block` through node 1 and runs the net with
/// node 3 cut off.
fn write_without_3(net: &mut Net, block: u64, byte: u8) {
    let d = Declared::Blocks(vec![BlockRange::new(block, 1).unwrap()]);
    net.nodes
        .get_mut(&1)
        .unwrap()
        .append(net.now, d, vec![byte; 40])
        .unwrap();
    net.run_with(|f, t, _| f != 3 && t != 3);
}

#[test]
fn a_follower_that_applied_most_of_the_log_gets_only_what_it_lacks() {
    // PolarFS 5.3 fast catch-up: node 3 applied slots 0..8 (blocks 0..8), then missed
    // four writes to blocks 20 and 21 that were compacted. Its image is partial: those
    // two blocks, not the volume.
    let mut net = Net::new(3, Mode::Parallel { span: 2 });
    net.elect(1);
    for i in 0..8u64 {
        let d = Declared::Blocks(vec![BlockRange::new(i, 1).unwrap()]);
        net.nodes
            .get_mut(&1)
            .unwrap()
            .append(net.now, d, vec![i as u8; 40])
            .unwrap();
        net.run();
    }
    // A heartbeat carries the last commits to node 3.
    net.now += 60_000_000;
    net.nodes.get_mut(&1).unwrap().tick(net.now);
    net.run();
    assert_eq!(net.nodes[&3].applied_head(), 8);
    for (i, b) in [20u64, 21, 20, 21].into_iter().enumerate() {
        write_without_3(&mut net, b, 100 + i as u8);
    }
    for id in [1, 2] {
        let r = net.nodes.get_mut(&id).unwrap();
        r.compact(net.now, 12);
        assert_eq!(r.base(), 12);
    }
    net.now += 60_000_000;
    net.nodes.get_mut(&1).unwrap().tick(net.now);
    net.run();
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
    let d = Declared::Blocks(vec![BlockRange::new(3, 1).unwrap()]);
    net.nodes
        .get_mut(&1)
        .unwrap()
        .append(net.now, d, vec![7; 8])
        .unwrap();
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
        net.nodes.get_mut(&id).unwrap().compact(net.now, 4);
    }
    net.now += 60_000_000;
    net.nodes.get_mut(&1).unwrap().tick(net.now);
    net.run();
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
        net.nodes.get_mut(&id).unwrap().compact(net.now, 2);
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
    let r3 = net.nodes.get_mut(&3).unwrap();
    r3.receive(
        net.now,
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
        acts.iter().any(|a| matches!(
            a,
            Action::Send {
                to: 1,
                msg: Msg::Ack { applied: 0, .. }
            }
        )),
        "{acts:?}"
    );
    assert_eq!(r3.base(), 0);
}

#[test]
fn a_leader_hands_leadership_to_a_caught_up_follower_and_gives_up_on_a_cut_one() {
    let mut net = Net::new(3, Mode::Dependent);
    net.elect(1);
    let hb = net.nodes[&1].cfg.heartbeat_interval;
    let txn = |k: u64| Declared::Txn {
        read_set: vec![k],
        write_set: vec![k + 1],
    };
    for k in 0..4 {
        let now = net.now;
        net.nodes
            .get_mut(&1)
            .unwrap()
            .append(now, txn(k), vec![k as u8])
            .unwrap();
    }
    net.run();
    // Refusals: a follower cannot hand over, nor can anyone to a stranger.
    let now = net.now;
    assert_eq!(
        net.nodes.get_mut(&2).unwrap().transfer_leader(now, 3),
        Err(OooTransferError::NotLeader { leader: Some(1) })
    );
    assert_eq!(
        net.nodes.get_mut(&1).unwrap().transfer_leader(now, 9),
        Err(OooTransferError::NotVoter { to: 9 })
    );
    // To node 3 while node 3 is cut off: appends are refused meanwhile, and after an
    // election timeout the transfer is given up and appends resume.
    let cut = |f: NodeId, t: NodeId, _: &Msg| f != 3 && t != 3;
    net.nodes
        .get_mut(&1)
        .unwrap()
        .append(now, txn(5), vec![5])
        .unwrap();
    net.run_with(cut);
    net.nodes
        .get_mut(&1)
        .unwrap()
        .transfer_leader(now, 3)
        .unwrap();
    assert_eq!(net.nodes[&1].transferring_to(), Some(3));
    assert_eq!(
        net.nodes.get_mut(&1).unwrap().append(now, txn(9), vec![]),
        Err(OooAppendError::Transferring { to: 3 })
    );
    let timeout = net.nodes[&1].cfg.election_timeout;
    let mut waited = 0;
    while net.nodes[&1].transferring_to().is_some() {
        assert!(waited <= timeout + hb, "the transfer never gave up");
        net.now += hb;
        waited += hb;
        let now = net.now;
        net.nodes.get_mut(&1).unwrap().tick(now);
        net.run_with(cut);
    }
    let r1 = &net.nodes[&1];
    assert!(r1.is_serving(), "node 1 kept leading");
    assert_eq!((r1.stats().transfers, r1.stats().transfers_expired), (0, 1));
    let now = net.now;
    net.nodes
        .get_mut(&1)
        .unwrap()
        .append(now, txn(20), vec![20])
        .unwrap();
    net.run();
    // To node 2, connected: it catches up on the next heartbeat, is told to campaign,
    // wins and merges; node 1 follows it.
    let now = net.now;
    net.nodes
        .get_mut(&1)
        .unwrap()
        .transfer_leader(now, 2)
        .unwrap();
    for _ in 0..3 {
        net.now += hb;
        let now = net.now;
        net.nodes.get_mut(&1).unwrap().tick(now);
        net.run();
    }
    assert_eq!(net.nodes[&1].stats().transfers, 1);
    assert_eq!(net.nodes[&2].stats().transfer_campaigns, 1);
    assert!(
        net.nodes[&2].is_serving(),
        "node 2 leads after the transfer"
    );
    assert_eq!(net.nodes[&1].leader(), Some(2));
    assert_eq!(net.nodes[&3].leader(), Some(2));
    let now = net.now;
    net.nodes
        .get_mut(&2)
        .unwrap()
        .append(now, txn(30), vec![30])
        .unwrap();
    net.run();
    // Every append ended once, committed: five, the one after the given-up transfer,
    // and the new leader's.
    assert_eq!(net.results.len(), 7, "{:?}", net.results);
    assert!(net.results.iter().all(|r| r.2 == Outcome::Committed));
    net.now += hb;
    let now = net.now;
    net.nodes.get_mut(&2).unwrap().tick(now);
    net.run();
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
        let txn = |k: u64| Declared::Txn {
            read_set: vec![],
            write_set: vec![k],
        };
        let cut = |f: NodeId, t: NodeId, _: &Msg| f != 3 && t != 3;
        // Ten election timeouts of node 3 alone, heartbeats flowing between 1 and 2,
        // with an append now and then.
        let mut k = 0;
        while net.now < 10_000_000_000 + 10 * 2 * timeout {
            net.now += hb;
            let now = net.now;
            for r in net.nodes.values_mut() {
                r.tick(now);
            }
            if k % 4 == 0 {
                net.nodes
                    .get_mut(&1)
                    .unwrap()
                    .append(now, txn(k), vec![])
                    .unwrap();
            }
            k += 1;
            net.run_with(cut);
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
            net.now += hb;
            let now = net.now;
            for r in net.nodes.values_mut() {
                r.tick(now);
            }
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
    let now = net.now;
    net.nodes
        .get_mut(&1)
        .unwrap()
        .append(
            now,
            Declared::Txn {
                read_set: vec![],
                write_set: vec![1],
            },
            vec![],
        )
        .unwrap();
    // Only node 3 gets the entry; then node 1 crashes.
    net.run_with(|f, t, _| f == 1 && t == 3);
    let log3: Vec<Entry> = net.nodes[&3]
        .log
        .values()
        .map(|s| s.entry.clone())
        .collect();
    assert_eq!(log3.len(), 1);
    net.nodes.remove(&1);
    net.now += 10_000_000_000;
    let now = net.now;
    let down = |_: NodeId, t: NodeId, _: &Msg| t != 1;
    net.nodes.get_mut(&2).unwrap().tick(now);
    net.run_with(down);
    let (r2, r3) = (&net.nodes[&2], &net.nodes[&3]);
    assert_eq!(r2.stats().pre_votes, 1);
    assert_eq!(
        (r2.term(), r3.term()),
        (term, term),
        "a hopeless pre-vote raised a term"
    );
    assert!(!r2.is_serving());
    net.nodes.get_mut(&3).unwrap().tick(now);
    net.run_with(down);
    assert!(net.nodes[&3].is_serving());
    assert_eq!(net.nodes[&3].term(), term + 1);
}

#[test]
fn a_cluster_elects_commits_and_applies_in_parallel_mode() {
    let mut net = Net::new(3, Mode::Parallel { span: 2 });
    net.elect(1);
    let r = |a, b| Declared::Blocks(vec![BlockRange::new(a, b).unwrap()]);
    let t1 = net
        .nodes
        .get_mut(&1)
        .unwrap()
        .append(0, r(0, 4), b"a".to_vec())
        .unwrap();
    let t2 = net
        .nodes
        .get_mut(&1)
        .unwrap()
        .append(0, r(8, 2), b"b".to_vec())
        .unwrap();
    net.run();
    assert_eq!(t2.seq, t1.seq + 1);
    assert_eq!(net.results.len(), 2);
    assert!(net.results.iter().all(|r| r.2 == Outcome::Committed));
    // A heartbeat brings the commit window to the followers.
    net.now += 60_000_000;
    net.nodes.get_mut(&1).unwrap().tick(net.now);
    net.run();
    for id in 1..=3 {
        assert_eq!(net.nodes[&id].applied_head(), t2.seq + 1, "node {id}");
    }
    let wrong = net.nodes.get_mut(&1).unwrap().append(
        0,
        Declared::Txn {
            read_set: vec![],
            write_set: vec![1],
        },
        vec![],
    );
    assert!(matches!(wrong, Err(OooAppendError::WrongMode { .. })));
    let empty = net.nodes.get_mut(&1).unwrap().append(
        0,
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

/// Parallel mode, node 1 leading: it appends `a` (block 0), which the followers do
/// not get (until a resend the caller allows), then `b` (blocks 0..2, overlapping
/// `a`) and `c` (block 10), which they do. `conflict_order` says which nodes commit
/// in conflict order. Returns the net and the tickets of `a`, `b`, `c`.
fn withheld_a_then_b_and_c(conflict_order: fn(NodeId) -> bool) -> (Net, [Ticket; 3]) {
    let mut net = Net::with(3, Mode::Parallel { span: 2 }, |c| {
        c.conflict_order = conflict_order(c.id)
    });
    net.elect(1);
    let r = |a, b| Declared::Blocks(vec![BlockRange::new(a, b).unwrap()]);
    let append = |net: &mut Net, d| {
        let now = net.now;
        net.nodes
            .get_mut(&1)
            .unwrap()
            .append(now, d, vec![1])
            .unwrap()
    };
    let a = append(&mut net, r(0, 1));
    let carries_a = |m: &Msg| match m {
        Msg::Append { entries, .. } => entries.iter().any(|e| e.seq == a.seq),
        _ => false,
    };
    net.run_with(|_, _, m| !carries_a(m));
    let b = append(&mut net, r(0, 2));
    let c = append(&mut net, r(10, 1));
    net.run_with(|_, _, m| !carries_a(m));
    (net, [a, b, c])
}

/// Node 1 appends one record writing block `block`, at the net's time.
fn append_block(net: &mut Net, block: u64) -> Ticket {
    let d = Declared::Blocks(vec![BlockRange::new(block, 1).unwrap()]);
    let now = net.now;
    net.nodes
        .get_mut(&1)
        .unwrap()
        .append(now, d, vec![1])
        .unwrap()
}

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
    let a = append_block(&mut net, 7);
    net.run_with(|f, t, _| f != 3 && t != 3);
    let committed = |net: &Net, eid: u64| {
        net.results
            .iter()
            .filter(|r| r.1 == eid)
            .map(|r| r.2)
            .collect::<Vec<_>>()
    };
    assert_eq!(committed(&net, a.eid), vec![Outcome::Committed]);
    assert!(!net.nodes[&3].log.contains_key(&a.seq));

    // Node 2 restarts having lost slot 0's record.
    let r2 = &net.nodes[&2];
    let before = r2.hard;
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
    let survived: Vec<Entry> = r2
        .log
        .values()
        .map(|s| s.entry.clone())
        .filter(|e| e.seq != a.seq)
        .collect();
    let cfg = OooConfig::new(2, vec![1, 2, 3], Mode::Parallel { span: 2 });
    let r2 = OooReplica::recover(cfg, lost, None, survived, net.now);
    assert!(r2.is_recovering_lost());
    net.nodes.insert(2, r2);

    // Node 1 is down: node 3 cannot be elected, and node 2 does not campaign.
    for _ in 0..5 {
        net.now += 10_000_000_000;
        for id in [2, 3] {
            net.nodes.get_mut(&id).unwrap().tick(net.now);
        }
        net.run_with(|f, t, _| f != 1 && t != 1);
    }
    assert!(!net.nodes[&2].is_serving() && !net.nodes[&3].is_serving());
    assert_eq!(net.nodes[&2].stats().campaigns, 0);
    assert!(net.nodes[&2].stats().votes_refused_lost >= 5);

    // Node 1 is back (it stepped down, not having heard a majority for so long). Only
    // it can be elected — node 3's log lacks slot 0 and node 2 abstains — and it is,
    // with node 3's vote, once its pre-vote has asked about a term nobody passed.
    for _ in 0..4 {
        net.now += 10_000_000_000;
        net.nodes.get_mut(&1).unwrap().tick(net.now);
        net.run();
        if net.nodes[&1].is_serving() {
            break;
        }
    }
    assert!(net.nodes[&1].is_serving());
    assert!(net.nodes[&2].is_recovering_lost());
    // The periodic resend brings node 2 what it lacks; it is whole again.
    for _ in 0..3 {
        net.now += 60_000_000;
        net.nodes.get_mut(&1).unwrap().tick(net.now);
        net.run();
    }
    let r2 = &net.nodes[&2];
    assert!(!r2.is_recovering_lost());
    assert_eq!(r2.stats().lost_restored, 1);
    assert_eq!(r2.hard.lost_below, 0);
    assert!(r2.committed_head() > a.seq);
    assert_eq!(r2.log[&a.seq].entry.eid, a.eid);
    assert_eq!(committed(&net, a.eid), vec![Outcome::Committed]);
    assert_eq!(net.state[&2], net.state[&1]);

    // And it votes again: with node 1 down, node 2 is elected with node 3's vote.
    net.now += 10_000_000_000;
    net.nodes.get_mut(&2).unwrap().tick(net.now);
    net.run_with(|f, t, _| f != 1 && t != 1);
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
        let txn = |w: u64| Declared::Txn {
            read_set: vec![],
            write_set: vec![w],
        };
        let now = net.now;
        let t = net
            .nodes
            .get_mut(&1)
            .unwrap()
            .append(now, txn(4), vec![1])
            .unwrap();
        net.run();
        let term = net.nodes[&1].hard.term;
        let r2 = &net.nodes[&2];
        let survived: Vec<Entry> = r2
            .log
            .values()
            .map(|s| s.entry.clone())
            .filter(|e| e.seq != t.seq)
            .collect();
        let cfg = OooConfig::new(2, (1..=n).collect(), Mode::Dependent);
        let r2 = OooReplica::recover(cfg, r2.hard.after_loss(), None, survived, net.now);
        assert!(r2.is_recovering_lost());
        net.nodes.insert(2, r2);
        for _ in 0..3 {
            net.now += 60_000_000;
            net.nodes.get_mut(&1).unwrap().tick(net.now);
            net.run();
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
    let a = append_block(&mut net, 5);
    let now = net.now;
    let term = net.nodes[&1].hard.term;
    let acts = net.nodes.get_mut(&1).unwrap().take_actions();
    let msg = acts
        .into_iter()
        .find_map(|x| match x {
            Action::Send {
                to: 2,
                msg: m @ Msg::Append { .. },
            } => Some(m),
            _ => None,
        })
        .expect("append to 2");
    net.nodes.get_mut(&2).unwrap().receive(now, 1, msg);
    let ack = net
        .nodes
        .get_mut(&2)
        .unwrap()
        .take_actions()
        .into_iter()
        .find_map(|x| match x {
            Action::Send {
                to: 1,
                msg: m @ Msg::Ack { .. },
            } => Some(m),
            _ => None,
        })
        .expect("ack");
    // Node 2 loses the slot and asks for the end right after its ack.
    let r1 = net.nodes.get_mut(&1).unwrap();
    r1.receive(now, 2, ack);
    r1.receive(now, 2, Msg::AskEnd { term, nonce: 9 });
    let acts = r1.take_actions();
    assert!(
        acts.iter().any(|x| matches!(
            x,
            Action::Send {
                to: 2,
                msg: Msg::End { end: 1, .. }
            }
        )),
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

/// A resent copy overtaken in turn (lost here) is sent again once the follower
/// acknowledges `hole_resend` more slots past the one that triggered the first
/// resend — not before — so a slot lost twice does not wait for the resend interval.
#[test]
fn a_slot_whose_resend_is_overtaken_too_is_sent_again() {
    let mut net = Net::with(3, Mode::Parallel { span: 2 }, |c| c.hole_resend = 3);
    net.elect(1);
    let a = append_block(&mut net, 0);
    // Every copy of `a` to node 3 is lost until `lost` reaches 2 (the first copy and
    // the first resend).
    let lost = std::cell::Cell::new(0);
    let run = |net: &mut Net| {
        net.run_with(|_, to, m| {
            let has_a = matches!(m, Msg::Append { entries, .. }
                    if entries.iter().any(|e| e.seq == a.seq && e.eid == a.eid));
            if to == 3 && has_a && lost.get() < 2 {
                lost.set(lost.get() + 1);
                return false;
            }
            true
        })
    };
    run(&mut net);
    let holds_a = |net: &Net| net.nodes[&3].log.contains_key(&a.seq);
    for b in 1..=3 {
        append_block(&mut net, b);
        run(&mut net);
    }
    // The third later acknowledgement sent `a` again; that copy was lost too.
    assert_eq!(lost.get(), 2);
    assert_eq!(net.nodes[&1].stats().hole_resends, 1);
    assert!(!holds_a(&net));
    // Two more acknowledged past it: not yet.
    for b in 4..=5 {
        append_block(&mut net, b);
        run(&mut net);
    }
    assert_eq!(net.nodes[&1].stats().hole_resends, 1);
    assert!(!holds_a(&net));
    // The third more: sent again, and this copy arrives.
    append_block(&mut net, 6);
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
            append_block(&mut net, b);
            net.run();
        }
        let a = append_block(&mut net, 9);
        let lost = std::cell::Cell::new(0);
        net.run_with(|_, _, m| {
            let has_a = matches!(m, Msg::Append { entries, .. }
                    if entries.iter().any(|e| e.seq == a.seq));
            if has_a && lost.get() < 2 {
                lost.set(lost.get() + 1);
                return false;
            }
            true
        });
        assert_eq!(lost.get(), 2, "both first copies dropped");
        let committed = |net: &Net| {
            net.results
                .iter()
                .any(|r| r.0 == 1 && r.1 == a.eid && r.2 == Outcome::Committed)
        };
        let tick = |net: &mut Net, dt: Nanos| {
            net.now += dt;
            let now = net.now;
            net.nodes.get_mut(&1).unwrap().tick(now);
            net.run();
        };
        let due = net.nodes[&1].resend_due();
        tick(&mut net, crate::rtt::MIN_TIMEOUT - 1);
        assert!(!committed(&net), "resent before its timeout");
        assert_eq!(net.nodes[&1].stats().timed_resends, 0);
        tick(&mut net, 1);
        let st = net.nodes[&1].stats();
        if factor > 0 {
            assert_eq!(due, Some(net.now), "the driver is told when to wake");
            assert!(committed(&net), "resent on time and committed");
            assert_eq!(st.timed_resends, 2, "once to each follower");
            assert_eq!(net.nodes[&1].resend_due(), None, "nothing in flight");
        } else {
            assert_eq!(due, None);
            assert!(!committed(&net));
            assert_eq!(st.timed_resends, 0);
            tick(&mut net, 50_000_000);
            assert!(committed(&net), "the periodic resend");
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
        let append = append_block;
        let a = append(&mut net, 0);
        // Only the first copy of `a` is lost: a copy sent alone.
        let first_copy_of_a = |m: &Msg| {
            matches!(m, Msg::Append { entries, .. }
                    if entries.len() == 1 && entries[0].seq == a.seq && entries[0].eid == a.eid)
        };
        let lost = std::cell::Cell::new(0);
        let run = |net: &mut Net| {
            net.run_with(|_, _, m| {
                if first_copy_of_a(m) && lost.get() < 2 {
                    lost.set(lost.get() + 1);
                    return false;
                }
                true
            })
        };
        run(&mut net);
        assert_eq!(lost.get(), 2, "both followers' first copy of a dropped");
        let committed = |net: &Net, eid: u64| {
            net.results
                .iter()
                .any(|r| r.0 == 1 && r.1 == eid && r.2 == Outcome::Committed)
        };
        // Two later slots acknowledged: not yet.
        for b in 1..=2 {
            let t = append(&mut net, b);
            run(&mut net);
            assert!(committed(&net, t.eid));
        }
        assert!(!committed(&net, a.eid));
        assert_eq!(net.nodes[&1].stats().hole_resends, 0);
        // The third: `a` goes again to both followers and commits.
        let t = append(&mut net, 3);
        run(&mut net);
        assert!(committed(&net, t.eid));
        let st = net.nodes[&1].stats();
        if k == 3 {
            assert!(committed(&net, a.eid), "a resent and committed");
            assert_eq!(st.hole_resends, 2, "once to each follower");
        } else {
            assert!(!committed(&net, a.eid), "no resend before the interval");
            assert_eq!(st.hole_resends, 0);
        }
        // More slots: nothing resent again.
        for b in 4..=8 {
            append(&mut net, b);
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
        let append = append_block;
        let a = append(&mut net, 0);
        let lost = std::cell::Cell::new(false);
        let run = |net: &mut Net| {
            net.run_with(|_, to, m| {
                let first = matches!(m, Msg::Append { entries, .. }
                        if entries.iter().any(|e| e.seq == a.seq));
                if to == 3 && first && !lost.get() {
                    lost.set(true);
                    return false;
                }
                true
            })
        };
        run(&mut net);
        assert!(lost.get());
        assert!(
            net.results.iter().any(|r| r.0 == 1 && r.1 == a.eid),
            "a committed with node 2"
        );
        for b in 1..=5 {
            append(&mut net, b);
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

/// `would_wait` follows the group's commit rule: a read of an uncommitted write in
/// dependent mode, an overlap under conflict order, never in plain parallel mode or
/// on a replica that is not serving.
#[test]
fn would_wait_follows_the_commit_rule_of_the_mode() {
    let tx = |r: u64, w: u64| Declared::Txn {
        read_set: vec![r],
        write_set: vec![w],
    };
    let blk = |b: u64| Declared::Blocks(vec![BlockRange::new(b, 1).unwrap()]);
    let mut net = Net::new(3, Mode::Dependent);
    net.elect(1);
    let now = net.now;
    let n1 = net.nodes.get_mut(&1).unwrap();
    n1.append(now, tx(1, 5), vec![1]).unwrap();
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
        append_block(&mut net, 3);
        let n1 = &net.nodes[&1];
        assert_eq!(n1.would_wait(&blk(3)), conflict_order);
        assert!(!n1.would_wait(&blk(4)));
    }
}

/// `would_order` asks whether some live replica may still have to apply a writer of
/// the keys first: true until every replica said it applied the writer, false for
/// keys only read, in parallel mode and off the leader; a follower not heard within
/// an election timeout does not count. `packs_last` is either rule.
#[test]
fn would_order_follows_what_the_live_replicas_applied() {
    let tx = |r: u64, w: u64| Declared::Txn {
        read_set: vec![r],
        write_set: vec![w],
    };
    // No resends: a follower that makes no progress between two is counted as being
    // caught up, and left out too.
    let mut net = Net::with(3, Mode::Dependent, |c| c.resend_interval = 60_000_000_000);
    net.elect(1);
    let now = net.now;
    let n1 = net.nodes.get_mut(&1).unwrap();
    n1.append(now, tx(1, 5), vec![1]).unwrap();
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
    let cut = |f: NodeId, t: NodeId, _: &Msg| f != 3 && t != 3;
    net.run_with(cut);
    let beat = |net: &mut Net| {
        net.now += 50_000_000;
        let now = net.now;
        net.nodes.get_mut(&1).unwrap().tick(now);
        net.run_with(cut);
    };
    beat(&mut net);
    assert_eq!(net.nodes[&2].applied_head(), 1);
    assert!(
        net.nodes[&1].would_order(&tx(6, 5)),
        "node 3 was heard lately and has not applied it"
    );
    while net.now < now + 2 * net.nodes[&1].cfg.election_timeout {
        beat(&mut net);
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
    let tx = |w: u64| Declared::Txn {
        read_set: vec![],
        write_set: vec![w],
    };
    let append = |net: &mut Net, w: u64| {
        let now = net.now;
        net.nodes
            .get_mut(&1)
            .unwrap()
            .append(now, tx(w), vec![1])
            .unwrap()
    };
    let a = append(&mut net, 1);
    // Node 3 never gets `a` (the clock does not move, so nothing is resent).
    let keep = |_: NodeId, to: NodeId, m: &Msg| {
        !(to == 3
            && matches!(m, Msg::Append { entries, .. } if entries.iter().any(|e| e.seq == a.seq)))
    };
    net.run_with(keep);
    assert!(net
        .results
        .iter()
        .any(|r| r.0 == 1 && r.1 == a.eid && r.2 == Outcome::Committed));
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
        net.now += 60_000_000;
        net.nodes.get_mut(&1).unwrap().tick(net.now);
        net.run();
        let got = committed(&net);
        if ordered {
            assert_eq!(got, vec![c.eid, a.eid, b.eid]);
        } else {
            assert_eq!(got, vec![b.eid, c.eid, a.eid]);
        }
    }
}

#[test]
fn a_merge_that_drops_a_predecessor_drops_the_entry_that_waited_for_it() {
    // Only node 1 commits in conflict order: the entries it writes list what they
    // wait for, and node 2's merge follows the lists whatever its own setting.
    let (mut net, [a, b, c]) = withheld_a_then_b_and_c(|id| id == 1);
    let b_entry = net.nodes[&2].log[&b.seq].entry.clone();
    assert!(matches!(&b_entry.body, Body::Parallel { after, .. } if after == &[a.seq]));
    // Node 1 is cut off; node 2 wins with node 3, neither of which ever held `a`.
    net.now += 10_000_000_000;
    net.nodes.get_mut(&2).unwrap().tick(net.now);
    net.run_with(|f, t, _| f != 1 && t != 1);
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
    let tx = |r: Vec<u64>, w: Vec<u64>| Declared::Txn {
        read_set: r,
        write_set: w,
    };
    assert!(matches!(
        net.nodes
            .get_mut(&1)
            .unwrap()
            .append(0, tx(vec![], vec![1]), vec![]),
        Err(OooAppendError::NotLeader { leader: Some(2) })
    ));
    let a = net
        .nodes
        .get_mut(&2)
        .unwrap()
        .append(0, tx(vec![], vec![1]), vec![])
        .unwrap();
    let b = net
        .nodes
        .get_mut(&2)
        .unwrap()
        .append(0, tx(vec![1], vec![2]), vec![])
        .unwrap();
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
    let c = net
        .nodes
        .get_mut(&3)
        .unwrap()
        .append(0, tx(vec![2], vec![1]), vec![])
        .unwrap();
    assert_eq!(c.seq, b.seq + 1);
    net.run();
    assert!(net
        .results
        .iter()
        .any(|r| r.1 == c.eid && r.2 == Outcome::Committed));
}

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
    let w = |b: u64| Declared::Blocks(vec![BlockRange::new(b, 1).unwrap()]);
    let append = |net: &mut Net, id: NodeId, b: u64| {
        let now = net.now;
        net.nodes
            .get_mut(&id)
            .unwrap()
            .append(now, w(b), vec![b as u8])
    };
    for b in 0..5 {
        append(&mut net, 1, b).unwrap();
    }
    net.run();
    assert_eq!(net.nodes[&4].stats().campaigns, 0);
    // Refusals.
    let now = net.now;
    assert_eq!(
        net.nodes
            .get_mut(&2)
            .unwrap()
            .change_membership(now, OooMembershipChange::AddVoter(4)),
        Err(OooChangeError::NotLeader { leader: Some(1) })
    );
    for bad in [
        OooMembershipChange::AddVoter(2),
        OooMembershipChange::Remove(9),
        OooMembershipChange::AddVoter(0),
    ] {
        assert!(matches!(
            net.nodes.get_mut(&1).unwrap().change_membership(now, bad),
            Err(OooChangeError::Invalid { .. })
        ));
    }
    // Add node 4 while nodes 2 and 4 are cut off: {1, 3} is a majority of the old
    // voters but not of the new, so the joint stage is not accepted and an append
    // does not commit.
    let cut = |f: NodeId, t: NodeId, _: &Msg| ![f, t].iter().any(|n| *n == 2 || *n == 4);
    net.nodes
        .get_mut(&1)
        .unwrap()
        .change_membership(now, OooMembershipChange::AddVoter(4))
        .unwrap();
    assert_eq!(net.nodes[&1].changing_to(), Some(&[1, 2, 3, 4][..]));
    assert!(matches!(
        net.nodes
            .get_mut(&1)
            .unwrap()
            .change_membership(now, OooMembershipChange::Remove(3)),
        Err(OooChangeError::InProgress { .. })
    ));
    let before = net.results.len();
    let t = append(&mut net, 1, 100).unwrap();
    for _ in 0..4 {
        net.now += hb;
        let now = net.now;
        net.nodes.get_mut(&1).unwrap().tick(now);
        net.run_with(cut);
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
        net.now += hb;
        let now = net.now;
        net.nodes.get_mut(&1).unwrap().tick(now);
        net.run();
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
    net.nodes
        .get_mut(&1)
        .unwrap()
        .change_membership(now, OooMembershipChange::Remove(1))
        .unwrap();
    assert!(matches!(
        append(&mut net, 1, 7),
        Err(OooAppendError::Leaving { .. })
    ));
    for _ in 0..4 {
        net.now += hb;
        let now = net.now;
        net.nodes.get_mut(&1).unwrap().tick(now);
        net.run();
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
        net.nodes.get_mut(&1).unwrap().tick(now);
        net.nodes.get_mut(&s).unwrap().tick(now);
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
