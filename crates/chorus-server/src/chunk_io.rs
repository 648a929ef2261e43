//! Chunk I/O at a chunk server beyond plain appends: leader reads, and chunk snapshots
//! (PolarFS section 7.2).
//!
//! **Snapshots.** A chunk takes snapshot `id` when a barrier record
//! (`chorus_chunk::op`) is committed in its group's log. The barrier declares the whole
//! chunk, so ParallelRaft orders it after every earlier write and before every later
//! one on every replica: each replica's snapshot holds exactly the writes of the slots
//! below the barrier's. A write acknowledged before the barrier was appended is below
//! it (a leader hands out slots in increasing order and a new leader's are above every
//! committed one); a write appended after the barrier committed is above it. Barriers
//! are appended here for two callers:
//! - the control leader, for every chunk of a volume being snapshotted (`ChunkSnapshot`
//!   TAKE), so chunks that see no writes take it too;
//! - a tagged write (`AppendOutOfOrderRequest.snapshot`, the paper's snapshot tag): the
//!   routing client tags writes it issues once it knows a snapshot is being taken, and
//!   the leader appends the barrier before such a write if the chunk does not have the
//!   snapshot yet, so no write issued after the snapshot began is in it.
//!
//! Taking a snapshot twice (two tagged writes racing, a retry after a leader change) logs
//! two barriers; the chunk applies the first and ignores the rest.

use std::sync::Arc;
use std::time::Duration;

use chorus_client::pb;

use chorus_chunk::op::{encode_op, op_declared, ChunkOp};
use chorus_core::ooo::replica::OooReadIndexError;
use chorus_core::replica::Role;
use chorus_runtime::env::OooHandle;
use chorus_runtime::Outcome;
use tonic::Status;

use crate::service::ooo_status;
use crate::state_machines::GroupStateMachine;

/// How long a leader read waits for its replica to apply what was committed when it
/// arrived.
const LEADER_READ_WAIT: Duration = Duration::from_secs(5);

/// Waits until this replica, the serving leader of out-of-order group `group`, may serve
/// a read that sees every write acknowledged before it began: a quorum of the voters has
/// confirmed it still leads (a deposed leader that has not yet heard of its successor is
/// refused instead of serving an old state) and it has applied every slot committed when
/// the read arrived ([`chorus_runtime::ooo::OooNode::read_index`]). Elsewhere:
/// FAILED_PRECONDITION with the leader hint.
pub(crate) async fn leader_read_barrier(g: &OooHandle, group: u64) -> Result<(), Status> {
    serving_leader(g, group, "a leader read goes to it")?;
    let wait = tokio::time::timeout(LEADER_READ_WAIT, g.node().read_index()).await;
    match wait {
        Ok(Ok(())) => Ok(()),
        Ok(Err(Some(OooReadIndexError::NotLeader { leader }))) => {
            let mut s = Status::failed_precondition(format!(
                "group {group}: no longer the serving leader (a leader read goes to it)"
            ));
            if let Some(v) = leader.and_then(|l| l.to_string().parse().ok()) {
                s.metadata_mut().insert("chorus-leader", v);
            }
            Err(s)
        }
        Ok(Err(None)) => Err(Status::unavailable(format!("group {group} stopped"))),
        Err(_) => Err(Status::unavailable(format!(
            "group {group}: no quorum confirmed this leader, or it did not apply what was \
             committed when the read arrived, within {LEADER_READ_WAIT:?}"
        ))),
    }
}

/// This replica's status if it is the group's serving leader; FAILED_PRECONDITION
/// naming the leader it knows (the `chorus-leader` trailer) otherwise. `why` says what
/// needs the leader.
fn serving_leader(
    g: &OooHandle,
    group: u64,
    why: &str,
) -> Result<chorus_runtime::ooo::OooStatus, Status> {
    let st = g
        .node()
        .status()
        .ok_or_else(|| Status::unavailable(format!("group {group} stopped")))?;
    if st.role != Role::Leader || !st.serving {
        let mut s =
            Status::failed_precondition(format!("group {group}: not the serving leader ({why})"));
        if let Some(v) = st.leader.and_then(|l| l.to_string().parse().ok()) {
            s.metadata_mut().insert("chorus-leader", v);
        }
        return Err(s);
    }
    Ok(st)
}

/// The chunk store of a parallel group's state machine.
fn store_of(sm: &GroupStateMachine, group: u64) -> Result<&chorus_chunk::ChunkStore, Status> {
    sm.chunk_store().ok_or_else(|| {
        Status::invalid_argument(format!(
            "group {group} is not a parallel-mode group: it holds no chunk"
        ))
    })
}

/// Takes (`take`) or drops snapshot `id` of the chunk group `group`, of which this node
/// must be the serving leader: logs the barrier and waits until it is committed and
/// applied here. Nothing is logged when the chunk already has it (take) or does not
/// (drop).
pub(crate) async fn snapshot_op(
    g: &OooHandle,
    sm: &GroupStateMachine,
    group: u64,
    id: u64,
    take: bool,
) -> Result<(), Status> {
    if id == 0 {
        return Err(Status::invalid_argument("snapshot id 0: ids start at 1"));
    }
    let store = store_of(sm, group)?;
    // A deleted snapshot is never taken again (a late tagged write for it logs nothing).
    let has = store.snapshots().contains(&id) || (take && store.deleted_snapshots().contains(&id));
    if has == take {
        return Ok(());
    }
    serving_leader(g, group, "snapshots are taken at the leader")?;
    let op = if take {
        ChunkOp::Snapshot(id)
    } else {
        ChunkOp::DeleteSnapshot(id)
    };
    let geometry = store.geometry();
    let r = g
        .node()
        .submit(op_declared(geometry), encode_op(op))
        .await
        .map_err(|e| ooo_status(group, e))?;
    if r.outcome != Outcome::Committed {
        return Err(Status::aborted(format!(
            "group {group}: the barrier of snapshot {id} failed (a leader change); retry"
        )));
    }
    leader_read_barrier(g, group).await
}

/// The blocks snapshot `id` of the chunk holds data in, ascending.
pub(crate) fn snapshot_blocks(
    sm: &GroupStateMachine,
    group: u64,
    id: u64,
) -> Result<Vec<u32>, Status> {
    store_of(sm, group)?
        .snapshot_blocks(id)
        .map_err(|e| Status::not_found(format!("group {group}: {e}")))
}

/// Reads `count` 4 KiB blocks from `start` of snapshot `id` of the chunk.
pub(crate) fn read_snapshot(
    sm: &GroupStateMachine,
    group: u64,
    id: u64,
    start: u64,
    count: u64,
) -> Result<Vec<u8>, Status> {
    use crate::state_machines::{BLOCK, MAX_READ_BLOCKS};
    let store = store_of(sm, group)?;
    let sectors = store.geometry().sectors();
    if count == 0 || count > MAX_READ_BLOCKS {
        return Err(Status::invalid_argument(format!(
            "count {count}: read 1 to {MAX_READ_BLOCKS} blocks per call"
        )));
    }
    if start.checked_add(count).is_none_or(|e| e > sectors) {
        return Err(Status::invalid_argument(format!(
            "blocks {start}+{count} are past the chunk's {sectors} blocks"
        )));
    }
    store
        .read_snapshot(id, start * BLOCK, (count * BLOCK) as usize)
        .map_err(|e| match e {
            chorus_chunk::ChunkError::NoSnapshot { .. } => {
                Status::not_found(format!("group {group}: {e}"))
            }
            e => Status::internal(format!("group {group}: {e}")),
        })
}

/// Holds a tagged write until its chunk has taken snapshot `tag` (see the module docs).
pub(crate) async fn before_tagged_write(
    g: &OooHandle,
    sm: &GroupStateMachine,
    group: u64,
    tag: u64,
) -> Result<(), Status> {
    if tag == 0 {
        return Ok(());
    }
    snapshot_op(g, sm, group, tag, true).await
}

/// Logs scrub point `id` over pieces `first..first + count` of chunk group `group`, of
/// which this node must be the serving leader; answers once it is committed.
pub(crate) async fn scrub_start(
    g: &OooHandle,
    sm: &GroupStateMachine,
    group: u64,
    id: u64,
    first: u64,
    count: u64,
) -> Result<(), Status> {
    if id == 0 {
        return Err(Status::invalid_argument("scrub id 0: ids start at 1"));
    }
    let geometry = store_of(sm, group)?.geometry();
    let declared = chorus_chunk::op::scrub_declared(geometry, first, count)
        .map_err(|e| Status::invalid_argument(format!("group {group}: scrub: {e}")))?;
    serving_leader(g, group, "scrub points are logged at the leader")?;
    let r = g
        .node()
        .submit(declared, encode_op(ChunkOp::Scrub(id)))
        .await
        .map_err(|e| ooo_status(group, e))?;
    if r.outcome != Outcome::Committed {
        return Err(Status::aborted(format!(
            "group {group}: scrub point {id} failed (a leader change); retry"
        )));
    }
    Ok(())
}

/// This replica's checksums at scrub point `id`: `(first piece, crcs, pieces in the
/// chunk)`.
pub(crate) fn scrub_result(
    sm: &GroupStateMachine,
    group: u64,
    id: u64,
) -> Result<(u64, Vec<u32>, u64), Status> {
    let pieces = chorus_chunk::op::scrub_pieces(store_of(sm, group)?.geometry());
    let r = sm
        .chunk_sm()
        .and_then(|c| c.scrub_result(id))
        .ok_or_else(|| {
            Status::not_found(format!(
                "group {group}: scrub point {id} not applied on this replica (yet)"
            ))
        })?;
    Ok((r.first, r.crcs, pieces))
}

/// `ReadBlocks`: a chunk's current blocks or a snapshot's, at the serving leader once it
/// has applied what was committed (`at_leader`), or at any replica from what it applied.
pub(crate) async fn read_blocks(
    g: OooHandle,
    sm: Arc<GroupStateMachine>,
    r: pb::ReadBlocksRequest,
) -> Result<pb::ReadBlocksResponse, Status> {
    if r.at_leader {
        leader_read_barrier(&g, r.group).await?;
    }
    tokio::task::spawn_blocking(move || {
        let applied = g.node().status().map(|s| s.applied_head).unwrap_or(0);
        let data = if r.snapshot != 0 {
            read_snapshot(&sm, r.group, r.snapshot, r.start, r.count)?
        } else {
            sm.read_blocks(r.start, r.count)
                .map_err(|e| Status::invalid_argument(format!("group {}: {e}", r.group)))?
        };
        Ok(pb::ReadBlocksResponse {
            data,
            applied_seq: applied,
        })
    })
    .await
    .map_err(|e| Status::internal(e.to_string()))?
}

/// `ChunkSnapshot`: take, drop or list a chunk snapshot.
pub(crate) async fn chunk_snapshot(
    g: OooHandle,
    sm: Arc<GroupStateMachine>,
    r: pb::ChunkSnapshotRequest,
) -> Result<pb::ChunkSnapshotResponse, Status> {
    use pb::chunk_snapshot_request::Action;
    let store = store_of(&sm, r.group)?;
    let mut blocks = Vec::new();
    match Action::try_from(r.action) {
        Ok(Action::Take) => snapshot_op(&g, &sm, r.group, r.snapshot, true).await?,
        Ok(Action::Drop) => snapshot_op(&g, &sm, r.group, r.snapshot, false).await?,
        Ok(Action::Blocks) => {
            // At the serving leader, once it applied all that was committed: a snapshot
            // it lacks then is one the chunk never took.
            leader_read_barrier(&g, r.group).await?;
            blocks = snapshot_blocks(&sm, r.group, r.snapshot)?
        }
        _ => {
            return Err(Status::invalid_argument(format!(
                "action {}: TAKE, DROP or BLOCKS",
                r.action
            )))
        }
    }
    Ok(pb::ChunkSnapshotResponse {
        blocks,
        block_bytes: store.geometry().block_bytes,
        snapshots: store.snapshots(),
    })
}

/// `ChunkScrub`: log a scrub point at the leader, or answer this replica's checksums.
pub(crate) async fn chunk_scrub(
    g: OooHandle,
    sm: Arc<GroupStateMachine>,
    r: pb::ChunkScrubRequest,
) -> Result<pb::ChunkScrubResponse, Status> {
    use pb::chunk_scrub_request::Action;
    match Action::try_from(r.action) {
        Ok(Action::Start) => {
            scrub_start(&g, &sm, r.group, r.id, r.first, r.count).await?;
            Ok(pb::ChunkScrubResponse::default())
        }
        Ok(Action::Result) => {
            let (first, crcs, pieces) = scrub_result(&sm, r.group, r.id)?;
            Ok(pb::ChunkScrubResponse {
                first,
                crcs,
                pieces,
            })
        }
        _ => Err(Status::invalid_argument(format!(
            "action {}: START or RESULT",
            r.action
        ))),
    }
}
