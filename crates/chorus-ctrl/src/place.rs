//! Placement rules: where new chunks go, where a replica moves, and which moves even out
//! load (PolarFS section 3.2.3, duties 1 and 3: "creating volumes and assigning chunks to
//! ChunkServers", "starting migration of chunk replicas ... if the ChunkServer is
//! overloaded or unavailable").
//!
//! Every function is pure and deterministic — the same state and live set give the same
//! answer on every control node, ties always going to the smallest node id — and only
//! proposes: the caller turns answers into [`crate::Command`]s, which the log orders and
//! [`Meta::apply`] validates.
//!
//! A node is *eligible* to receive replicas when it is [`NodeState::Up`] and in `live`
//! (the caller's [`crate::Liveness::live_set`]). Replicas of one chunk go to distinct
//! racks whenever enough eligible racks exist (section 3.2: replicas "always located in
//! different racks"); a node with an empty rack counts as alone in its own rack
//! ([`crate::Node::rack`]).

use std::collections::{BTreeMap, BTreeSet};

use crate::meta::{Chunk, GroupId, Meta, NodeId, NodeState, VolumeState, MAX_REPLICAS};

/// Why no placement could be found.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlaceError {
    /// Fewer eligible nodes than copies per chunk.
    #[error("{need} copies need {need} up, live nodes; only {have} are")]
    NotEnoughNodes {
        /// Copies per chunk.
        need: usize,
        /// Eligible nodes.
        have: usize,
    },
    /// A copy count outside 1..=[`MAX_REPLICAS`].
    #[error("{copies} copies per chunk is outside 1..={MAX_REPLICAS}")]
    BadCopies {
        /// The count asked for.
        copies: usize,
    },
    /// No chunk has this group.
    #[error("chunk group {group} does not exist")]
    NoSuchChunk {
        /// The group.
        group: GroupId,
    },
    /// The node holds no replica of the chunk.
    #[error("node {node} is not a replica of chunk group {group}")]
    NotAReplica {
        /// The group.
        group: GroupId,
        /// The node.
        node: NodeId,
    },
    /// The chunk already has a move in progress (one at a time).
    #[error("chunk group {group} is already moving")]
    Moving {
        /// The group.
        group: GroupId,
    },
    /// Every eligible node already holds the chunk.
    #[error("no up, live node without a replica of chunk group {group} can take node {leaving}'s")]
    NoReplacement {
        /// The group.
        group: GroupId,
        /// The replica being replaced.
        leaving: NodeId,
    },
}

/// A node's failure domain for placement: a named rack, or (empty rack name) a rack of
/// its own that no other node shares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Rack<'a> {
    Named(&'a str),
    Alone(NodeId),
}

/// The rack of `node` (an unregistered node is alone).
fn rack_of(meta: &Meta, node: NodeId) -> Rack<'_> {
    match meta.node(node) {
        Some(n) if !n.rack.is_empty() => Rack::Named(&n.rack),
        _ => Rack::Alone(node),
    }
}

/// Distinct racks among `nodes`.
fn racks<'a>(meta: &'a Meta, nodes: impl IntoIterator<Item = NodeId>) -> BTreeSet<Rack<'a>> {
    nodes.into_iter().map(|n| rack_of(meta, n)).collect()
}

/// Eligible nodes, ascending by id.
fn eligible(meta: &Meta, live: &BTreeSet<NodeId>) -> Vec<NodeId> {
    meta.nodes()
        .values()
        .filter(|n| n.state == NodeState::Up && live.contains(&n.id))
        .map(|n| n.id)
        .collect()
}

fn get(map: &BTreeMap<NodeId, usize>, n: NodeId) -> usize {
    map.get(&n).copied().unwrap_or(0)
}

fn bump(map: &mut BTreeMap<NodeId, usize>, n: NodeId) {
    *map.entry(n).or_insert(0) += 1;
}

fn drop_one(map: &mut BTreeMap<NodeId, usize>, n: NodeId) {
    if let Some(v) = map.get_mut(&n) {
        *v = v.saturating_sub(1);
    }
}

/// Chooses replicas for `chunks` new chunks of `copies` each (for
/// [`crate::Command::CreateVolume`] and [`crate::Command::GrowVolume`]).
///
/// Each replica is the eligible node, not yet chosen for this chunk, that is first in a
/// rack no chosen replica uses (while such a rack exists), then least loaded
/// ([`Meta::load`] plus what this call already placed), then of smallest id. Choosing
/// the least loaded `copies` nodes for each chunk keeps every node's load within one of
/// the others' when racks do not constrain. The chosen replica with the fewest preferred
/// leaderships (same accounting) goes first, spreading leaders (and with them the I/O
/// the leaders serve, section 4) over nodes.
pub fn place_chunks(
    meta: &Meta,
    live: &BTreeSet<NodeId>,
    chunks: usize,
    copies: usize,
) -> Result<Vec<Vec<NodeId>>, PlaceError> {
    if copies == 0 || copies > MAX_REPLICAS {
        return Err(PlaceError::BadCopies { copies });
    }
    let elig = eligible(meta, live);
    if elig.len() < copies {
        return Err(PlaceError::NotEnoughNodes {
            need: copies,
            have: elig.len(),
        });
    }
    let mut load = meta.loads();
    let mut leaders = meta.leader_loads();
    // Not preallocated: `chunks` is the caller's number, and the loop is bounded by it.
    let mut out = Vec::new();
    for _ in 0..chunks {
        let mut chosen: Vec<NodeId> = Vec::with_capacity(copies);
        let mut used = BTreeSet::new();
        for _ in 0..copies {
            let Some(pick) = elig
                .iter()
                .copied()
                .filter(|n| !chosen.contains(n))
                .min_by_key(|&n| (used.contains(&rack_of(meta, n)), get(&load, n), n))
            else {
                break; // Cannot happen: elig.len() >= copies.
            };
            used.insert(rack_of(meta, pick));
            chosen.push(pick);
        }
        // Among equal leader counts, the replica that was least loaded before this
        // chunk: it is the one least often chosen lately, so the one least likely to
        // be offered leadership again soon.
        if let Some(lead) = (0..chosen.len())
            .min_by_key(|&i| (get(&leaders, chosen[i]), get(&load, chosen[i]), chosen[i]))
        {
            chosen[..=lead].rotate_right(1);
        }
        for &n in &chosen {
            bump(&mut load, n);
        }
        if let Some(&first) = chosen.first() {
            bump(&mut leaders, first);
        }
        out.push(chosen);
    }
    Ok(out)
}

/// The node to take over `leaving`'s replica of chunk `group` (for
/// [`crate::Command::StartMove`]): eligible, not already holding the chunk, first in a
/// rack none of the remaining replicas use, then least loaded ([`Meta::load`]), then of
/// smallest id.
pub fn replacement(
    meta: &Meta,
    live: &BTreeSet<NodeId>,
    group: GroupId,
    leaving: NodeId,
) -> Result<NodeId, PlaceError> {
    let (_, _, chunk) = meta.chunk(group).ok_or(PlaceError::NoSuchChunk { group })?;
    if chunk.moving.is_some() {
        return Err(PlaceError::Moving { group });
    }
    if !chunk.replicas.contains(&leaving) {
        return Err(PlaceError::NotAReplica {
            group,
            node: leaving,
        });
    }
    replacement_with(meta, &eligible(meta, live), &meta.loads(), chunk, leaving)
        .ok_or(PlaceError::NoReplacement { group, leaving })
}

/// [`replacement`] for a chunk known to hold `leaving` and not to be moving, with the
/// eligible nodes and loads given (so that a caller planning several moves can count
/// the earlier ones).
fn replacement_with(
    meta: &Meta,
    elig: &[NodeId],
    load: &BTreeMap<NodeId, usize>,
    chunk: &Chunk,
    leaving: NodeId,
) -> Option<NodeId> {
    let remaining = racks(
        meta,
        chunk.replicas.iter().copied().filter(|&r| r != leaving),
    );
    elig.iter()
        .copied()
        .filter(|n| !chunk.replicas.contains(n))
        .min_by_key(|&n| (remaining.contains(&rack_of(meta, n)), get(load, n), n))
}

/// Chunks a move may touch: of volumes not being deleted, with no move in progress.
fn movable(meta: &Meta) -> impl Iterator<Item = &Chunk> {
    meta.chunks()
        .filter(|(v, c)| v.state != VolumeState::Deleting && c.moving.is_none())
        .map(|(_, c)| c)
}

/// Moves `(group, from, to)` taking `node`'s replicas elsewhere, when `node` is draining,
/// removed, or not in `live` (the caller decides how long down is too long, section
/// 3.2.2); nothing for an up, live node (evening out load is [`rebalance`]'s job).
///
/// One move per chunk holding `node`, to its [`replacement`] counting the moves planned
/// before it; a chunk already moving, of a deleting volume, or with no possible
/// replacement is skipped (the caller retries later).
pub fn drain_moves(
    meta: &Meta,
    live: &BTreeSet<NodeId>,
    node: NodeId,
) -> Vec<(GroupId, NodeId, NodeId)> {
    let up = meta.node(node).is_some_and(|n| n.state == NodeState::Up);
    if up && live.contains(&node) {
        return Vec::new();
    }
    let elig = eligible(meta, live);
    let mut load = meta.loads();
    let mut out = Vec::new();
    for c in movable(meta).filter(|c| c.replicas.contains(&node)) {
        if let Some(to) = replacement_with(meta, &elig, &load, c, node) {
            bump(&mut load, to);
            drop_one(&mut load, node);
            out.push((c.group, node, to));
        }
    }
    out
}

/// At most `max_moves` moves `(group, from, to)` from the most to the least loaded
/// eligible nodes (section 3.2.3, duty 1: migrating off overloaded servers), while
/// their loads differ by more than one.
///
/// Each step takes the most loaded eligible node `from` (smallest id on ties) and the
/// least loaded `to` that a chunk on `from` can move to; if none, the next pair, in
/// order of load difference. A chunk qualifies if `to` holds none of it, the move keeps
/// at least as many distinct racks among its replicas as it had, it is not moving, its
/// volume is not being deleted, and this call has not already moved it (one move per
/// chunk at a time); among those, one whose preferred leader is not `from` (moving a
/// leader also moves leadership), then the smallest group. The loads count each planned
/// move as done. Chunks on ineligible nodes stay for [`drain_moves`].
pub fn rebalance(
    meta: &Meta,
    live: &BTreeSet<NodeId>,
    max_moves: usize,
) -> Vec<(GroupId, NodeId, NodeId)> {
    let elig = eligible(meta, live);
    let mut load = meta.loads();
    let mut on: BTreeMap<NodeId, Vec<&Chunk>> = BTreeMap::new();
    for c in movable(meta) {
        for &r in &c.replicas {
            on.entry(r).or_default().push(c);
        }
    }
    let mut planned = BTreeSet::new();
    let mut out = Vec::new();
    while out.len() < max_moves {
        let mut by_load = elig.clone();
        by_load.sort_by_key(|&n| (get(&load, n), n));
        let mut his = by_load.clone();
        his.sort_by_key(|&n| (std::cmp::Reverse(get(&load, n)), n));
        let mut found = None;
        'pairs: for &hi in &his {
            for &lo in &by_load {
                if get(&load, hi) < get(&load, lo) + 2 {
                    break;
                }
                let pick = on
                    .get(&hi)
                    .into_iter()
                    .flatten()
                    .filter(|c| !planned.contains(&c.group) && !c.replicas.contains(&lo))
                    .filter(|c| keeps_racks(meta, c, hi, lo))
                    .min_by_key(|c| (c.replicas.first() == Some(&hi), c.group));
                if let Some(c) = pick {
                    found = Some((c.group, hi, lo));
                    break 'pairs;
                }
            }
        }
        let Some((group, from, to)) = found else {
            break;
        };
        planned.insert(group);
        drop_one(&mut load, from);
        bump(&mut load, to);
        out.push((group, from, to));
    }
    out
}

/// Whether replacing `from` by `to` in `c` keeps at least as many distinct racks.
fn keeps_racks(meta: &Meta, c: &Chunk, from: NodeId, to: NodeId) -> bool {
    let before = racks(meta, c.replicas.iter().copied()).len();
    let after = racks(
        meta,
        c.replicas.iter().map(|&r| if r == from { to } else { r }),
    )
    .len();
    after >= before
}

/// [`crate::Command::SetPreferredLeader`] changes `(group, node)` spreading preferred
/// leaders over eligible nodes, at most one per chunk.
///
/// First, every chunk whose preferred leader is not eligible (draining, removed or down:
/// clients would try it first in vain) gets its eligible replica with the fewest
/// leaderships, if it has one. Then, while some eligible node leads at least two more
/// chunks than another it can reach, leadership shifts along a chain: the most leading
/// node `hi` (smallest id on ties) hands a chunk to one of that chunk's replicas, which
/// hands another chunk on, and so on to the least leading node reachable from `hi`
/// (found breadth-first, so the chain is shortest; smallest groups and ids first). Only
/// the ends' counts change, so each chain narrows the spread without ever widening it.
/// Chunks of deleting volumes are left alone.
pub fn leader_moves(meta: &Meta, live: &BTreeSet<NodeId>) -> Vec<(GroupId, NodeId)> {
    let elig = eligible(meta, live);
    let is_elig = |n: NodeId| elig.binary_search(&n).is_ok();
    let mut count: BTreeMap<NodeId, usize> = elig.iter().map(|&n| (n, 0)).collect();
    // The chunks each eligible node leads that this call has not changed yet.
    let mut led: BTreeMap<NodeId, Vec<&Chunk>> = BTreeMap::new();
    let mut orphans = Vec::new();
    for (v, c) in meta.chunks() {
        if v.state == VolumeState::Deleting {
            continue;
        }
        match c.replicas.first() {
            Some(&l) if is_elig(l) => {
                bump(&mut count, l);
                led.entry(l).or_default().push(c);
            }
            Some(_) => orphans.push(c),
            None => {}
        }
    }
    let mut out = Vec::new();
    for c in orphans {
        let pick = c
            .replicas
            .iter()
            .copied()
            .filter(|&n| is_elig(n))
            .min_by_key(|&n| (get(&count, n), n));
        if let Some(n) = pick {
            bump(&mut count, n);
            out.push((c.group, n));
        }
    }
    // Each chain lowers the sum of squared counts and uses up its chunks, so this ends.
    while let Some(chain) = leader_chain(&elig, &count, &led) {
        if let (Some(&(_, hi, _)), Some(&(_, _, lo))) = (chain.first(), chain.last()) {
            drop_one(&mut count, hi);
            bump(&mut count, lo);
        }
        for (group, from, to) in chain {
            if let Some(list) = led.get_mut(&from) {
                list.retain(|c| c.group != group);
            }
            out.push((group, to));
        }
    }
    out
}

/// The shortest chain of leadership hand-overs `(group, from, to)` from the most leading
/// eligible node to the least leading one reachable that leads at least two fewer, if
/// any (trying the next most leading node when none is reachable).
fn leader_chain(
    elig: &[NodeId],
    count: &BTreeMap<NodeId, usize>,
    led: &BTreeMap<NodeId, Vec<&Chunk>>,
) -> Option<Vec<(GroupId, NodeId, NodeId)>> {
    let mut his = elig.to_vec();
    his.sort_by_key(|&n| (std::cmp::Reverse(get(count, n)), n));
    for &hi in &his {
        // Breadth-first from hi; `via[n]` is the hand-over that reached n.
        let mut via: BTreeMap<NodeId, (GroupId, NodeId)> = BTreeMap::new();
        let mut frontier = vec![hi];
        let mut seen = BTreeSet::from([hi]);
        while !frontier.is_empty() {
            let mut next = Vec::new();
            for &u in &frontier {
                let mut chunks: Vec<&&Chunk> = led.get(&u).into_iter().flatten().collect();
                chunks.sort_by_key(|c| c.group);
                for c in chunks {
                    for &v in &c.replicas {
                        if elig.binary_search(&v).is_ok() && seen.insert(v) {
                            via.insert(v, (c.group, u));
                            next.push(v);
                        }
                    }
                }
            }
            frontier = next;
        }
        let lo = via
            .keys()
            .copied()
            .filter(|&n| get(count, n) + 2 <= get(count, hi))
            .min_by_key(|&n| (get(count, n), n));
        if let Some(lo) = lo {
            let mut chain = Vec::new();
            let mut at = lo;
            while let Some(&(group, from)) = via.get(&at) {
                chain.push((group, from, at));
                at = from;
            }
            chain.reverse();
            return Some(chain);
        }
    }
    None
}
