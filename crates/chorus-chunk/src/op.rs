//! Chunk operation records: what a chunk's group log carries besides writes. Today the
//! snapshot operations of PolarFS section 7.2 ("disk outage consistent" snapshots): take
//! snapshot `id` of the chunk, or delete it.
//!
//! An operation record's data is 16 bytes (byte by byte in docs/formats.md, "Chunk
//! operation record"):
//!
//! ```text
//! offset  size  field
//!      0     4  magic "CHOP"
//!      4     4  kind: 1 take snapshot, 2 delete snapshot
//!      8     8  snapshot id, at least 1
//! ```
//! All integers little-endian. No checksum: the group log's entry has its own. 16 bytes
//! is never a multiple of [`SECTOR`], and a write's data always is (the server refuses
//! client writes that are not whole sectors), so an operation is never taken for a write.
//!
//! **Ordering.** An operation record declares the whole chunk ([`op_declared`]), so in
//! ParallelRaft it conflicts with every write: every slot before it is applied before it
//! and every slot after it after it, on every replica. That is what makes each replica's
//! snapshot hold exactly the writes of the slots before the record (PolarFS section 7.2:
//! the snapshot is taken at one point of the chunk's log, on every replica alike).
//!
//! [`SECTOR`]: crate::SECTOR

use chorus_core::ooo::parallel::BlockRange;
use chorus_core::ooo::replica::Declared;

use crate::{le_u32, le_u64, ChunkError, Geometry};

/// "CHOP".
pub const OP_MAGIC: [u8; 4] = *b"CHOP";
/// Bytes of an encoded operation.
pub const OP_BYTES: usize = 16;
/// Kind of [`ChunkOp::Snapshot`].
const KIND_SNAPSHOT: u32 = 1;
/// Kind of [`ChunkOp::DeleteSnapshot`].
const KIND_DELETE: u32 = 2;

/// An operation on a chunk, logged in its group like a write and applied in log order
/// ([`crate::ChunkStateMachine`]). Ids are at least 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChunkOp {
    /// Take snapshot `id` ([`crate::ChunkStore::snapshot`]).
    Snapshot(u64),
    /// Delete snapshot `id` ([`crate::ChunkStore::delete_snapshot`]).
    DeleteSnapshot(u64),
}

/// The record data of `op`: [`OP_BYTES`] bytes, laid out as the module docs show.
pub fn encode_op(op: ChunkOp) -> Vec<u8> {
    let (kind, id) = match op {
        ChunkOp::Snapshot(id) => (KIND_SNAPSHOT, id),
        ChunkOp::DeleteSnapshot(id) => (KIND_DELETE, id),
    };
    let mut out = Vec::with_capacity(OP_BYTES);
    out.extend_from_slice(&OP_MAGIC);
    out.extend_from_slice(&kind.to_le_bytes());
    out.extend_from_slice(&id.to_le_bytes());
    out
}

/// Reads a record's data as an operation: `None` when it is not one (not
/// [`OP_BYTES`] long, or not starting with the magic: a write's data), `Some(Err)`
/// ([`ChunkError::Corrupt`]) for an unknown kind or id 0.
pub fn decode_op(data: &[u8]) -> Option<Result<ChunkOp, ChunkError>> {
    if data.len() != OP_BYTES || data[0..4] != OP_MAGIC {
        return None;
    }
    let corrupt = |detail: String| ChunkError::Corrupt {
        what: "chunk operation record".into(),
        detail,
    };
    let (kind, id) = (le_u32(data, 4), le_u64(data, 8));
    if id == 0 {
        return Some(Err(corrupt("snapshot id 0 (ids start at 1)".into())));
    }
    Some(match kind {
        KIND_SNAPSHOT => Ok(ChunkOp::Snapshot(id)),
        KIND_DELETE => Ok(ChunkOp::DeleteSnapshot(id)),
        other => Err(corrupt(format!(
            "kind {other}; this build knows 1 (snapshot) and 2 (delete snapshot)"
        ))),
    })
}

/// What an operation record declares: every sector of the chunk, one range
/// `0..geometry.sectors()`, so that it conflicts with every write (see the module docs).
pub fn op_declared(geometry: Geometry) -> Declared {
    Declared::Blocks(vec![whole_chunk(geometry)])
}

/// The range of every sector of a chunk of `geometry`.
pub(crate) fn whole_chunk(geometry: Geometry) -> BlockRange {
    BlockRange {
        start: 0,
        end: geometry.sectors(),
    }
}
