//! Snapshots and clones, the control leader's side (PolarFS section 7.2).
//!
//! A snapshot of a volume is taken without pausing its I/O:
//! 1. `CreateSnapshot` in the control log: the snapshot is `creating`, and the volume's
//!    map (its version bumped) carries the snapshot's id as its tag, which routing
//!    clients put on the writes they issue from then on (the paper's snapshot tag);
//! 2. every chunk of the volume takes it at its leader (`ChunkSnapshot` TAKE: a barrier
//!    in the chunk's log, see `crate::chunk_io`); a tagged write that reaches a chunk
//!    first makes its leader take it before the write;
//! 3. `SnapshotReady` in the control log: the tag is gone from the map.
//!
//! The guarantee (the paper's *disk outage consistency*): every write acknowledged
//! before step 1 is in the snapshot (it was committed in its chunk's log before that
//! chunk's barrier was appended), and no write issued after step 3 is (every barrier
//! was committed by then, so the write lands above it). Writes in between are in it or
//! not, chunk by chunk, as after a power loss.
//!
//! Deleting drops the snapshot from every chunk (`ChunkSnapshot` DROP) before
//! `SnapshotGone`. A clone is a new volume whose chunks are created as any volume's and
//! then filled, chunk by chunk, with the blocks the source chunk's snapshot holds data
//! in (read at the source chunk's leader, written through the clone chunk's log); it
//! becomes ready once every chunk is copied. Every step is idempotent, so a new control
//! leader finishes what an old one began from the state alone.

use std::sync::Arc;
use std::time::Duration;

use chorus_client::pb;
use chorus_client::pb::chorus_client::ChorusClient;
use chorus_ctrl::{Command, SnapshotState, VolumeState};
use tonic::{Code, Status};

use super::Controller;

/// How long one chunk call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Rounds over a chunk's replicas looking for its leader before giving up this turn.
const ROUNDS: usize = 20;
/// Sectors per ReadBlocks call when copying (1 MiB).
const COPY_SECTORS: u64 = 256;

/// Connects to a chunk server's client API.
pub(super) async fn connect(addr: &str) -> Result<ChorusClient<chorus_client::Conn>, Status> {
    let ch = chorus_client::security::endpoint(addr)
        .map_err(|e| Status::invalid_argument(format!("address `{addr}`: {e}")))?
        .connect_timeout(Duration::from_secs(2))
        .timeout(CALL_TIMEOUT)
        .connect()
        .await
        .map_err(|e| Status::unavailable(format!("{addr}: unreachable: {e}")))?;
    Ok(ChorusClient::new(chorus_client::security::authed(ch)).max_decoding_message_size(64 << 20))
}

/// A chunk's replicas' client addresses, the first (preferred leader) first.
pub(super) fn chunk_addrs(c: &Controller, replicas: &[u64]) -> Vec<String> {
    c.with_meta(|m| {
        replicas
            .iter()
            .filter_map(|n| m.node(*n).map(|x| x.client_addr.clone()))
            .collect()
    })
}

/// Calls `f` at the replica of the chunk that accepts it (its serving leader): tries
/// each replica in turn, a few rounds, skipping those that say they do not lead or
/// cannot be reached. Returns the answer and the address that gave it.
pub(super) async fn at_leader<T, F, Fut>(
    addrs: &[String],
    group: u64,
    mut f: F,
) -> Result<(T, String), Status>
where
    F: FnMut(ChorusClient<chorus_client::Conn>) -> Fut,
    Fut: std::future::Future<Output = Result<T, Status>>,
{
    let mut last = Status::unavailable(format!("chunk group {group}: no replica tried"));
    for _ in 0..ROUNDS {
        for a in addrs {
            let cl = match connect(a).await {
                Ok(cl) => cl,
                Err(e) => {
                    last = e;
                    continue;
                }
            };
            match f(cl).await {
                Ok(t) => return Ok((t, a.clone())),
                Err(e)
                    if matches!(
                        e.code(),
                        Code::FailedPrecondition | Code::Unavailable | Code::Aborted
                    ) =>
                {
                    last = e;
                }
                Err(e) => return Err(e),
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(last)
}

/// TAKE or DROP snapshot `id` on chunk group `group`.
async fn chunk_op(
    c: &Controller,
    replicas: &[u64],
    group: u64,
    id: u64,
    action: pb::chunk_snapshot_request::Action,
) -> Result<(), Status> {
    let addrs = chunk_addrs(c, replicas);
    at_leader(&addrs, group, |mut cl| async move {
        cl.chunk_snapshot(pb::ChunkSnapshotRequest {
            group,
            snapshot: id,
            action: action as i32,
        })
        .await
        .map(|_| ())
    })
    .await
    .map(|_| ())
}

/// Volume `volume`'s chunks: (group, replicas).
fn chunks_of(c: &Controller, volume: &str) -> Vec<(u64, Vec<u64>)> {
    c.with_meta(|m| {
        m.volume(volume)
            .map(|v| {
                v.chunks
                    .iter()
                    .map(|ch| (ch.group, ch.replicas.clone()))
                    .collect()
            })
            .unwrap_or_default()
    })
}

/// Step 2 and 3 of taking snapshot `id` of `volume` (see the module docs).
pub async fn finish_snapshot(c: &Arc<Controller>, volume: &str, id: u64) -> Result<(), Status> {
    for (group, replicas) in chunks_of(c, volume) {
        chunk_op(
            c,
            &replicas,
            group,
            id,
            pb::chunk_snapshot_request::Action::Take,
        )
        .await?;
    }
    c.propose(Command::SnapshotReady {
        volume: volume.to_string(),
        id,
    })
    .await
}

/// Drops snapshot `id` from every chunk of `volume`, then from the state.
pub async fn finish_snapshot_delete(
    c: &Arc<Controller>,
    volume: &str,
    id: u64,
) -> Result<(), Status> {
    for (group, replicas) in chunks_of(c, volume) {
        chunk_op(
            c,
            &replicas,
            group,
            id,
            pb::chunk_snapshot_request::Action::Drop,
        )
        .await?;
    }
    c.propose(Command::SnapshotGone {
        volume: volume.to_string(),
        id,
    })
    .await
}

/// Copies chunk `i` of snapshot `id` of the source into the clone's chunk `i`.
async fn copy_chunk(
    c: &Controller,
    (src_group, src_replicas): &(u64, Vec<u64>),
    (dst_group, dst_replicas): &(u64, Vec<u64>),
    id: u64,
) -> Result<u64, Status> {
    let (src_group, dst_group) = (*src_group, *dst_group);
    let src = chunk_addrs(c, src_replicas);
    let listed = at_leader(&src, src_group, |mut cl| async move {
        cl.chunk_snapshot(pb::ChunkSnapshotRequest {
            group: src_group,
            snapshot: id,
            action: pb::chunk_snapshot_request::Action::Blocks as i32,
        })
        .await
        .map(|r| r.into_inner())
    })
    .await;
    let (listing, src_addr) = match listed {
        Ok(x) => x,
        // A chunk the source grew by after the snapshot: it never took it, and the clone's
        // chunk stays zeros, as the snapshot had no such chunk.
        Err(e) if e.code() == Code::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let per_block = u64::from(listing.block_bytes) / chorus_chunk::SECTOR;
    let dst = chunk_addrs(c, dst_replicas);
    let mut src_cl = connect(&src_addr).await?;
    let mut copied = 0u64;
    for b in listing.blocks {
        let mut start = u64::from(b) * per_block;
        let end = start + per_block;
        while start < end {
            let count = (end - start).min(COPY_SECTORS);
            let data = src_cl
                .read_blocks(pb::ReadBlocksRequest {
                    group: src_group,
                    start,
                    count,
                    snapshot: id,
                    ..Default::default()
                })
                .await?
                .into_inner()
                .data;
            let record = pb::OutOfOrderRecord {
                data,
                blocks: vec![pb::BlockRange { start, count }],
                read_set: vec![],
                write_set: vec![],
            };
            let (r, _) = at_leader(&dst, dst_group, |mut cl| {
                let record = record.clone();
                async move {
                    cl.append_out_of_order(pb::AppendOutOfOrderRequest {
                        group: dst_group,
                        records: vec![record],
                        snapshot: 0,
                    })
                    .await
                    .map(|r| r.into_inner())
                }
            })
            .await?;
            let res = r.results.first().ok_or_else(|| {
                Status::internal(format!("chunk group {dst_group}: an append with no result"))
            })?;
            if res.outcome != pb::Outcome::Committed as i32 {
                // Failed, refused or unknown: the copy is redone (blind writes) next round.
                return Err(Status::aborted(format!(
                    "chunk group {dst_group}: a copied write did not commit ({}{})",
                    res.refused, res.unknown
                )));
            }
            copied += count * chorus_chunk::SECTOR;
            start += count;
        }
    }
    Ok(copied)
}

/// Fills clone `name` from its source snapshot, then marks it ready. Its chunk groups
/// must exist (`super::duties::create_chunk_groups`).
pub async fn finish_clone(c: &Arc<Controller>, name: &str) -> Result<(), Status> {
    let source = c.with_meta(|m| {
        m.volume(name)
            .filter(|v| v.state == VolumeState::Creating)
            .and_then(|v| v.source.clone())
    });
    let Some((src_volume, id)) = source else {
        return Ok(());
    };
    let src_chunks = chunks_of(c, &src_volume);
    let dst_chunks = chunks_of(c, name);
    let mut bytes = 0;
    for (s, d) in src_chunks.iter().zip(&dst_chunks) {
        bytes += copy_chunk(c, s, d, id).await?;
    }
    tracing::info!(volume = %name, source = %src_volume, snapshot = id, bytes, "clone copied");
    match c
        .propose(Command::VolumeReady {
            name: name.to_string(),
        })
        .await
    {
        Err(s) if s.code() == Code::FailedPrecondition && c.is_leader() => Ok(()),
        r => r,
    }
}

/// The duties' turn: snapshots being taken or deleted are driven on.
pub async fn drive(c: &Arc<Controller>) {
    let pending: Vec<(String, u64, SnapshotState)> = c.with_meta(|m| {
        m.volumes()
            .values()
            // A deleting volume's snapshots go with it (a creating one has none).
            .filter(|v| v.state == VolumeState::Ready)
            .flat_map(|v| {
                v.snapshots
                    .iter()
                    .filter(|s| s.state != SnapshotState::Ready)
                    .map(|s| (v.name.clone(), s.id, s.state))
            })
            .collect()
    });
    for (volume, id, state) in pending {
        let r = match state {
            SnapshotState::Creating => finish_snapshot(c, &volume, id).await,
            SnapshotState::Deleting => finish_snapshot_delete(c, &volume, id).await,
            SnapshotState::Ready => Ok(()),
        };
        if let Err(e) = r {
            tracing::debug!(volume = %volume, snapshot = id, error = %e, "snapshot duty not done yet");
        }
    }
}
