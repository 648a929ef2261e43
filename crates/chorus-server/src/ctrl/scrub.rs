//! Scrubbing (PolarFS section 7.3: validation routines that check coherency between
//! replicas, split into small 128 KB tasks with idle time between them so that they
//! cost a bounded share of the disks).
//!
//! The control leader walks every chunk of every ready volume, a few pieces at a time
//! (as many as `[control] scrub_bytes_per_sec` allows per round of the duties): it logs a
//! scrub point over the pieces at the chunk's leader (`ChunkScrub` START, a record that
//! ParallelRaft orders against every write to those pieces), then asks every replica
//! for the checksums it computed when it applied the point (RESULT). Replicas that
//! applied the same log at the same point hold the same bytes, so a replica whose
//! checksum differs from the majority's holds damaged or divergent bytes. It is repaired
//! from the majority: if it leads the chunk, leadership goes to a replica that agrees;
//! then the chunk's replica on it is moved to another node (`StartMove`, the
//! re-replication path: the new replica is built from the leader's state). Replicas that
//! do not answer are not judged. Counters: `chorus_control_scrub_*` (docs/operations.md).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use chorus_client::pb;
use chorus_client::Client;
use chorus_ctrl::{replacement, Command, VolumeState};

use super::snap::{at_leader, chunk_addrs, connect};
use super::{now_ms, Controller};

/// Bytes per scrub piece.
const PIECE: u64 = chorus_chunk::op::SCRUB_PIECE;
/// How long replicas get to apply a scrub point before they are asked no more.
const RESULT_WAIT: Duration = Duration::from_secs(3);
/// The duties' period, whose share of `scrub_bytes_per_sec` one turn checks.
const PERIOD_MS: u64 = 500;

/// Where the scrubber is: the next chunk group to check and its next piece.
#[derive(Debug, Default)]
pub struct Cursor {
    /// The chunk group being scrubbed (0: start from the first).
    pub group: u64,
    /// Its next piece.
    pub piece: u64,
}

/// One turn of scrubbing (see the module docs).
pub async fn turn(c: &Arc<Controller>) {
    let rate = c.cfg.scrub_bytes_per_sec;
    if rate == 0 {
        return;
    }
    let budget = (rate * PERIOD_MS / 1000).div_ceil(PIECE).max(1);
    // The chunk at or after the cursor, in group order (ready volumes, no move under
    // way: a moving chunk's replicas are changing).
    let (group, replicas, chunk_bytes, piece) = {
        let cur = c.scrub_cursor.lock().unwrap_or_else(|p| p.into_inner());
        let chunks: Vec<(u64, Vec<u64>, u64)> = c.with_meta(|m| {
            m.chunks()
                .filter(|(v, ch)| v.state == VolumeState::Ready && ch.moving.is_none())
                .map(|(v, ch)| (ch.group, ch.replicas.clone(), v.chunk_bytes))
                .collect()
        });
        let mut sorted = chunks;
        sorted.sort_by_key(|x| x.0);
        let next = sorted
            .iter()
            .find(|x| x.0 == cur.group)
            .or_else(|| sorted.iter().find(|x| x.0 > cur.group))
            .or(sorted.first());
        let Some((g, r, cb)) = next.cloned() else {
            return;
        };
        let piece = if g == cur.group { cur.piece } else { 0 };
        (g, r, cb, piece)
    };
    let pieces = chunk_bytes.div_ceil(PIECE);
    let count = budget.min(pieces.saturating_sub(piece));
    let advance = |c: &Controller, next_piece: u64| {
        let mut cur = c.scrub_cursor.lock().unwrap_or_else(|p| p.into_inner());
        if next_piece >= pieces {
            // Next chunk: the one after this group.
            *cur = Cursor {
                group: group + 1,
                piece: 0,
            };
            c.scrub_chunks.fetch_add(1, Ordering::Relaxed);
        } else {
            *cur = Cursor {
                group,
                piece: next_piece,
            };
        }
    };
    if count == 0 {
        advance(c, pieces);
        return;
    }
    match confirmed(c, group, &replicas, piece, count).await {
        Ok(bad) => {
            c.scrub_bytes
                .fetch_add(count * PIECE * replicas.len() as u64, Ordering::Relaxed);
            advance(c, piece + count);
            for (node, pieces) in bad {
                c.scrub_mismatches.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    group,
                    node,
                    ?pieces,
                    "scrub: a chunk replica disagrees with the majority; moving it"
                );
                repair(c, group, &replicas, node).await;
            }
        }
        Err(e) => tracing::debug!(group, piece, error = %e, "scrub turn not done"),
    }
}

/// [`check`], and when a replica disagrees, [`check`] again at a new point: only a
/// replica that disagrees at both is judged. A replica's state at a point may hold later
/// slots' writes when it installed an image (the leader's sectors as it read them, past
/// the image's base) shortly before the point: its checksum then differs without damage.
/// The second point is logged after every replica reported the first, so after any such
/// install, and the replica applies it over exactly the state at that point. (Points
/// replayed after a restart are not reported at all: `ChunkStateMachine`.)
async fn confirmed(
    c: &Controller,
    group: u64,
    replicas: &[u64],
    first: u64,
    count: u64,
) -> Result<BTreeMap<u64, Vec<u64>>, tonic::Status> {
    let once = check(c, group, replicas, first, count).await?;
    if once.is_empty() {
        return Ok(once);
    }
    let twice = check(c, group, replicas, first, count).await?;
    let mut out = BTreeMap::new();
    for (node, pieces) in once {
        match twice.get(&node) {
            Some(again) => {
                let both: Vec<u64> = pieces.into_iter().filter(|p| again.contains(p)).collect();
                if !both.is_empty() {
                    out.insert(node, both);
                }
            }
            None => tracing::info!(
                group,
                node,
                ?pieces,
                "scrub: a replica disagreed at one point and agreed (or did not answer) at the \
                 next; not judged"
            ),
        }
    }
    Ok(out)
}

/// Logs a scrub point over `count` pieces from `first` of chunk `group` and compares the
/// replicas' checksums: the replicas that differ from the majority, with the pieces.
async fn check(
    c: &Controller,
    group: u64,
    replicas: &[u64],
    first: u64,
    count: u64,
) -> Result<BTreeMap<u64, Vec<u64>>, tonic::Status> {
    // Unique per control leader and time: a point of an earlier turn is never mistaken
    // for this one.
    let id = (now_ms() << 16) | (c.scrub_seq.fetch_add(1, Ordering::Relaxed) & 0xffff);
    let addrs = chunk_addrs(c, replicas);
    at_leader(&addrs, group, |mut cl| async move {
        cl.chunk_scrub(pb::ChunkScrubRequest {
            group,
            id,
            action: pb::chunk_scrub_request::Action::Start as i32,
            first,
            count,
        })
        .await
        .map(|_| ())
    })
    .await?;
    let nodes: Vec<(u64, String)> = c.with_meta(|m| {
        replicas
            .iter()
            .filter_map(|n| m.node(*n).map(|x| (*n, x.client_addr.clone())))
            .collect()
    });
    let end = tokio::time::Instant::now() + RESULT_WAIT;
    let mut got: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
    while got.len() < nodes.len() && tokio::time::Instant::now() < end {
        for (n, addr) in &nodes {
            if got.contains_key(n) || !c.is_live(*n) {
                continue;
            }
            let Ok(mut cl) = connect(addr).await else {
                continue;
            };
            let r = cl
                .chunk_scrub(pb::ChunkScrubRequest {
                    group,
                    id,
                    action: pb::chunk_scrub_request::Action::Result as i32,
                    ..Default::default()
                })
                .await;
            if let Ok(r) = r {
                let r = r.into_inner();
                if r.first == first && r.crcs.len() as u64 == count {
                    got.insert(*n, r.crcs);
                }
            }
        }
        if got.len() < nodes.len() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let mut bad: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for i in 0..count as usize {
        let mut votes: BTreeMap<u32, usize> = BTreeMap::new();
        for crcs in got.values() {
            *votes.entry(crcs[i]).or_default() += 1;
        }
        // A majority of the chunk's replicas must agree for anyone to be judged.
        let Some((&majority, _)) = votes.iter().find(|(_, &v)| v > replicas.len() / 2) else {
            if votes.len() > 1 {
                tracing::warn!(
                    group,
                    piece = first + i as u64,
                    ?votes,
                    "scrub: replicas disagree with no majority"
                );
            }
            continue;
        };
        for (n, crcs) in &got {
            if crcs[i] != majority {
                bad.entry(*n).or_default().push(first + i as u64);
            }
        }
    }
    Ok(bad)
}

/// Rebuilds chunk `group`'s replica on `node` from the majority: leadership away from
/// it first if it leads, then the replica moved to another node.
async fn repair(c: &Arc<Controller>, group: u64, replicas: &[u64], node: u64) {
    let addr = c.with_meta(|m| m.node(node).map(|n| n.client_addr.clone()));
    if let (Some(addr), Some(&to)) = (addr, replicas.iter().find(|r| **r != node)) {
        // If `node` leads, hand leadership to a replica that agrees (the new replica is
        // built from the leader's state); elsewhere this is refused, which is fine.
        let mut cl = Client::new(vec![addr]);
        cl.call_timeout = Duration::from_secs(5);
        cl.leader_timeout = Duration::from_secs(1);
        let _ = cl.transfer_leader(group, to).await;
    }
    let live = c.live_set();
    let to = c.with_meta(|m| replacement(m, &live, group, node));
    match to {
        Ok(to) => match c
            .propose(Command::StartMove {
                group,
                from: node,
                to,
            })
            .await
        {
            Ok(()) => {
                c.scrub_repairs.fetch_add(1, Ordering::Relaxed);
                c.moves_started.fetch_add(1, Ordering::Relaxed);
                tracing::info!(
                    group,
                    from = node,
                    to,
                    "scrub: rebuilding a damaged chunk replica elsewhere"
                );
            }
            Err(e) => tracing::warn!(group, node, error = %e, "scrub: repair move not started"),
        },
        Err(e) => {
            tracing::warn!(group, node, error = %e, "scrub: no node to rebuild the damaged replica on")
        }
    }
}
