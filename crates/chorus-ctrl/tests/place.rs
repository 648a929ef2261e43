//! Placement rules over random clusters: replicas distinct, eligible and rack-distinct;
//! loads and preferred leaders even; moves valid, accepted by `apply`, and converging.

use std::collections::{BTreeMap, BTreeSet};

use chorus_ctrl::{
    drain_moves, leader_moves, place_chunks, rebalance, replacement, Chunk, Command, Meta, NodeId,
    NodeState, PlaceError,
};
use proptest::prelude::*;

const MIB: u64 = 1 << 20;

/// One node of a random cluster: rack index (`None`: empty rack), state, live.
type NodeSpec = (Option<usize>, NodeState, bool);

fn node_spec(racks: usize) -> impl Strategy<Value = NodeSpec> {
    (
        prop::option::weighted(0.9, 0..racks),
        prop_oneof![
            6 => Just(NodeState::Up),
            1 => Just(NodeState::Draining),
            1 => Just(NodeState::Removed),
        ],
        prop::bool::weighted(0.85),
    )
}

/// 3–12 nodes in 1–5 racks, some draining, removed or not live.
fn cluster() -> impl Strategy<Value = Vec<NodeSpec>> {
    (1..=5usize).prop_flat_map(|racks| prop::collection::vec(node_spec(racks), 3..=12))
}

struct World {
    meta: Meta,
    live: BTreeSet<NodeId>,
}

impl World {
    fn apply(&mut self, cmd: Command) {
        let pos = self.meta.applied() + 1;
        self.meta
            .apply(pos, &cmd)
            .unwrap_or_else(|e| panic!("{cmd:?} refused: {e}"));
    }

    fn eligible(&self) -> Vec<NodeId> {
        self.meta
            .nodes()
            .values()
            .filter(|n| n.state == NodeState::Up && self.live.contains(&n.id))
            .map(|n| n.id)
            .collect()
    }

    fn rack(&self, n: NodeId) -> String {
        match self.meta.node(n).map(|n| n.rack.as_str()) {
            Some("") | None => format!("alone-{n}"),
            Some(r) => r.to_string(),
        }
    }

    fn racks(&self, nodes: &[NodeId]) -> BTreeSet<String> {
        nodes.iter().map(|&n| self.rack(n)).collect()
    }

    /// Creates a volume (and makes it ready) with these replica lists.
    fn create(&mut self, name: &str, lists: Vec<Vec<NodeId>>) {
        let first = self.meta.next_group();
        let chunks = lists
            .into_iter()
            .enumerate()
            .map(|(i, replicas)| Chunk {
                group: first + i as u64,
                replicas,
                moving: None,
            })
            .collect::<Vec<_>>();
        self.apply(Command::CreateVolume {
            name: name.into(),
            size_bytes: chunks.len() as u64 * MIB,
            chunk_bytes: MIB,
            block_bytes: 4096,
            chunks,
        });
        self.apply(Command::VolumeReady { name: name.into() });
    }

    /// Applies a move start to finish.
    fn do_move(&mut self, (group, from, to): (u64, NodeId, NodeId)) {
        self.apply(Command::StartMove { group, from, to });
        self.apply(Command::FinishMove { group, from, to });
    }

    fn spread(&self, counts: &BTreeMap<NodeId, usize>) -> usize {
        let e = self.eligible();
        let vals: Vec<usize> = e
            .iter()
            .map(|n| counts.get(n).copied().unwrap_or(0))
            .collect();
        vals.iter().max().unwrap_or(&0) - vals.iter().min().unwrap_or(&0)
    }
}

/// Registers the nodes (ids 1..) with their racks and states; the live set as specified.
fn world(spec: &[NodeSpec]) -> World {
    let mut w = World {
        meta: Meta::new(),
        live: BTreeSet::new(),
    };
    for (i, (rack, state, live)) in spec.iter().enumerate() {
        let id = i as u64 + 1;
        w.apply(Command::RegisterNode {
            id,
            repl_addr: format!("n{id}:1"),
            client_addr: format!("n{id}:2"),
            rack: rack.map_or(String::new(), |r| format!("rack{r}")),
        });
        if *state != NodeState::Up {
            w.apply(Command::SetNodeState { id, state: *state });
        }
        if *live {
            w.live.insert(id);
        }
    }
    w
}

/// A world with some chunks already placed (on every up node, live or not).
fn loaded(spec: &[NodeSpec], chunks: usize) -> World {
    let mut w = world(spec);
    let all: BTreeSet<NodeId> = w.meta.nodes().keys().copied().collect();
    if let Ok(lists) = place_chunks(&w.meta, &all, chunks, 2) {
        if !lists.is_empty() {
            w.create("old", lists);
        }
    }
    w
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn placed_replicas_are_distinct_eligible_and_rack_distinct(
        spec in cluster(),
        pre in 0..10usize,
        chunks in 1..20usize,
        copies in 1..=3usize,
    ) {
        let mut w = loaded(&spec, pre);
        let elig = w.eligible();
        let elig_racks = w.racks(&elig).len();
        match place_chunks(&w.meta, &w.live, chunks, copies) {
            Err(e) => {
                prop_assert!(elig.len() < copies);
                prop_assert_eq!(e, PlaceError::NotEnoughNodes { need: copies, have: elig.len() });
            }
            Ok(lists) => {
                prop_assert_eq!(lists.len(), chunks);
                for l in &lists {
                    prop_assert_eq!(l.len(), copies);
                    prop_assert_eq!(l.iter().collect::<BTreeSet<_>>().len(), copies);
                    prop_assert!(l.iter().all(|n| elig.contains(n)));
                    prop_assert_eq!(w.racks(l).len(), copies.min(elig_racks));
                }
                // The placement is what CreateVolume accepts.
                w.create("new", lists);
            }
        }
    }

    #[test]
    fn placement_on_equal_racks_evens_load_and_leaders(
        nodes in 3..=12usize,
        unnamed in any::<bool>(),
        copies in 1..=3usize,
        batches in prop::collection::vec(1..25usize, 1..4),
    ) {
        let rack = if unnamed { None } else { Some(0) };
        let mut w = world(&vec![(rack, NodeState::Up, true); nodes]);
        for (i, chunks) in batches.iter().enumerate() {
            let lists = place_chunks(&w.meta, &w.live, *chunks, copies).unwrap();
            w.create(&format!("v{i}"), lists);
            prop_assert!(w.spread(&w.meta.loads()) <= 1, "loads {:?}", w.meta.loads());
            prop_assert!(
                w.spread(&w.meta.leader_loads()) <= 1,
                "leaders {:?}",
                w.meta.leader_loads()
            );
        }
    }

    #[test]
    fn replacement_is_eligible_and_new_to_the_chunk(
        spec in cluster(),
        chunks in 1..10usize,
        pick in any::<prop::sample::Index>(),
        leave in 0..3usize,
    ) {
        let w = loaded(&spec, chunks);
        let all: Vec<Chunk> = w.meta.chunks().map(|(_, c)| c.clone()).collect();
        prop_assume!(!all.is_empty());
        let c = pick.get(&all);
        let leaving = c.replicas[leave % c.replicas.len()];
        let elig = w.eligible();
        let outside: Vec<NodeId> = elig.iter().copied().filter(|n| !c.replicas.contains(n)).collect();
        match replacement(&w.meta, &w.live, c.group, leaving) {
            Ok(n) => {
                prop_assert!(outside.contains(&n));
                // A rack the remaining replicas do not use, whenever one is eligible.
                let remaining: Vec<NodeId> =
                    c.replicas.iter().copied().filter(|&r| r != leaving).collect();
                let used = w.racks(&remaining);
                if outside.iter().any(|&o| !used.contains(&w.rack(o))) {
                    prop_assert!(!used.contains(&w.rack(n)));
                }
            }
            Err(e) => {
                prop_assert!(outside.is_empty());
                prop_assert_eq!(e, PlaceError::NoReplacement { group: c.group, leaving });
            }
        }
        prop_assert_eq!(
            replacement(&w.meta, &w.live, c.group, 999),
            Err(PlaceError::NotAReplica { group: c.group, node: 999 })
        );
    }

    /// One rack per node: rebalancing converges to loads within one of each other.
    #[test]
    fn rebalance_converges_on_rack_free_clusters(
        nodes in 3..=12usize,
        first in 1..=3usize,
        chunks in 1..30usize,
        copies in 1..=3usize,
        max_moves in 1..6usize,
    ) {
        let mut w = world(&vec![(None, NodeState::Up, true); nodes]);
        // Place everything while only the first nodes are live, then bring all back.
        let early: BTreeSet<NodeId> = (1..=first.max(copies) as u64).collect();
        let lists = place_chunks(&w.meta, &early, chunks, copies).unwrap();
        w.create("v", lists);
        for _ in 0..200 {
            let moves = rebalance(&w.meta, &w.live, max_moves);
            if moves.is_empty() {
                break;
            }
            prop_assert!(moves.len() <= max_moves);
            check_moves(&w, &moves)?;
            for m in moves {
                w.do_move(m);
            }
        }
        prop_assert!(rebalance(&w.meta, &w.live, max_moves).is_empty());
        prop_assert!(w.spread(&w.meta.loads()) <= 1, "loads {:?}", w.meta.loads());
    }

    /// With racks and ineligible nodes: moves stay valid, keep racks, and stop.
    #[test]
    fn rebalance_moves_are_valid_everywhere(
        spec in cluster(),
        chunks in 1..20usize,
    ) {
        let mut w = loaded(&spec, chunks);
        for _ in 0..100 {
            let moves = rebalance(&w.meta, &w.live, 4);
            if moves.is_empty() {
                break;
            }
            check_moves(&w, &moves)?;
            let elig = w.eligible();
            prop_assert!(moves.iter().all(|(_, f, t)| elig.contains(f) && elig.contains(t)));
            for m in moves {
                w.do_move(m);
            }
        }
        prop_assert!(rebalance(&w.meta, &w.live, 4).is_empty());
    }

    #[test]
    fn drain_moves_empty_the_node(
        spec in cluster(),
        chunks in 1..20usize,
        node in any::<prop::sample::Index>(),
    ) {
        let mut w = loaded(&spec, chunks);
        let ids: Vec<NodeId> = w.meta.nodes().keys().copied().collect();
        let node = *node.get(&ids);
        let up_live = w.eligible().contains(&node);
        let moves = drain_moves(&w.meta, &w.live, node);
        if up_live {
            prop_assert!(moves.is_empty());
            return Ok(());
        }
        check_moves(&w, &moves)?;
        prop_assert!(moves.iter().all(|&(_, f, _)| f == node));
        let elig = w.eligible();
        prop_assert!(moves.iter().all(|(_, _, t)| elig.contains(t)));
        for m in moves {
            w.do_move(m);
        }
        // Whatever still sits on the node had no possible replacement.
        for (_, c) in w.meta.chunks() {
            if c.replicas.contains(&node) {
                prop_assert!(elig.iter().all(|n| c.replicas.contains(n)));
            }
        }
    }

    #[test]
    fn leader_moves_are_valid_and_never_widen_the_spread(
        spec in cluster(),
        chunks in 1..25usize,
    ) {
        let mut w = loaded(&spec, chunks);
        let elig = w.eligible();
        let orphans = w.meta.chunks().any(|(_, c)| !elig.contains(&c.replicas[0]));
        let before = w.spread(&w.meta.leader_loads());
        let mut rounds = 0;
        loop {
            let moves = leader_moves(&w.meta, &w.live);
            if moves.is_empty() {
                break;
            }
            rounds += 1;
            prop_assert!(rounds <= 50, "leader_moves does not settle");
            let groups: BTreeSet<u64> = moves.iter().map(|m| m.0).collect();
            prop_assert_eq!(groups.len(), moves.len());
            for &(group, node) in &moves {
                prop_assert!(elig.contains(&node));
                prop_assert!(w.meta.chunk(group).unwrap().2.replicas.contains(&node));
                w.apply(Command::SetPreferredLeader { group, node });
            }
            // No chunk with an eligible replica is left led by an ineligible node.
            for (_, c) in w.meta.chunks() {
                if c.replicas.iter().any(|n| elig.contains(n)) {
                    prop_assert!(elig.contains(&c.replicas[0]));
                }
            }
        }
        let after = w.spread(&w.meta.leader_loads());
        if !orphans {
            prop_assert!(after <= before, "spread {} -> {}", before, after);
        }
    }

    /// Leadership piled on one node spreads back out to within one.
    #[test]
    fn leader_moves_undo_a_pile_up(
        nodes in 3..=12usize,
        copies in 2..=3usize,
        chunks in 1..40usize,
    ) {
        let mut w = world(&vec![(None, NodeState::Up, true); nodes]);
        let lists = place_chunks(&w.meta, &w.live, chunks, copies).unwrap();
        w.create("v", lists.clone());
        for (i, l) in lists.iter().enumerate() {
            if l.contains(&1) {
                w.apply(Command::SetPreferredLeader { group: i as u64 + 1, node: 1 });
            }
        }
        for _ in 0..50 {
            let moves = leader_moves(&w.meta, &w.live);
            if moves.is_empty() {
                break;
            }
            for (group, node) in moves {
                w.apply(Command::SetPreferredLeader { group, node });
            }
        }
        prop_assert!(leader_moves(&w.meta, &w.live).is_empty());
        prop_assert!(
            w.spread(&w.meta.leader_loads()) <= 1,
            "leaders {:?}",
            w.meta.leader_loads()
        );
    }
}

/// Checks a batch of planned moves against the state they were planned on: one per
/// chunk, from a replica, to a node not holding the chunk, not lowering its racks, and
/// on a chunk not already moving.
fn check_moves(w: &World, moves: &[(u64, NodeId, NodeId)]) -> Result<(), TestCaseError> {
    let groups: BTreeSet<u64> = moves.iter().map(|m| m.0).collect();
    prop_assert_eq!(groups.len(), moves.len());
    for &(group, from, to) in moves {
        let c = w.meta.chunk(group).unwrap().2;
        prop_assert!(c.moving.is_none());
        prop_assert!(c.replicas.contains(&from));
        prop_assert!(!c.replicas.contains(&to));
        let after: Vec<NodeId> = c
            .replicas
            .iter()
            .map(|&r| if r == from { to } else { r })
            .collect();
        if w.meta.node(from).is_some_and(|n| n.state == NodeState::Up) && w.live.contains(&from) {
            // A rebalancing move never lowers the chunk's rack spread.
            prop_assert!(w.racks(&after).len() >= w.racks(&c.replicas).len());
        }
    }
    Ok(())
}

#[test]
fn place_refuses_bad_copy_counts() {
    let w = world(&[(None, NodeState::Up, true); 3]);
    assert_eq!(
        place_chunks(&w.meta, &w.live, 1, 0),
        Err(PlaceError::BadCopies { copies: 0 })
    );
    assert_eq!(
        place_chunks(&w.meta, &w.live, 1, 4)
            .unwrap_err()
            .to_string(),
        "4 copies need 4 up, live nodes; only 3 are"
    );
    assert_eq!(place_chunks(&w.meta, &w.live, 0, 3), Ok(vec![]));
}

#[test]
fn placement_example() {
    // Racks: a = {1, 2}, b = {3}, c = {4}; node 5 draining, node 6 not live.
    let mut w = world(&[
        (Some(0), NodeState::Up, true),
        (Some(0), NodeState::Up, true),
        (Some(1), NodeState::Up, true),
        (Some(2), NodeState::Up, true),
        (Some(2), NodeState::Draining, true),
        (Some(1), NodeState::Up, false),
    ]);
    let lists = place_chunks(&w.meta, &w.live, 4, 3).unwrap();
    // Each chunk: one node of each rack; rack a alternates 1, 2; leaders rotate.
    assert_eq!(
        lists,
        vec![vec![1, 3, 4], vec![2, 3, 4], vec![3, 1, 4], vec![4, 2, 3]]
    );
    w.create("v", lists);
    // Node 4 leaves: no other node in rack c is eligible, so a used rack's least loaded.
    assert_eq!(replacement(&w.meta, &w.live, 1, 4), Ok(2));
    assert_eq!(
        drain_moves(&w.meta, &w.live, 5),
        vec![],
        "node 5 holds nothing"
    );
}
