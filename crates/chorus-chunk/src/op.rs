//! Chunk operation records: what a chunk's group log carries besides writes: the
//! snapshot operations of PolarFS section 7.2 ("disk outage consistent" snapshots: take
//! snapshot `id` of the chunk, or delete it), and scrub points (section 7.3: replicas
//! compared piece by piece).
//!
//! An operation record's data is 16 bytes (byte by byte in docs/formats.md, "Chunk
//! operation record"):
//!
//! ```text
//! offset  size  field
//!      0     4  magic "CHOP"
//!      4     4  kind: 1 take snapshot, 2 delete snapshot, 3 scrub
//!      8     8  snapshot or scrub id, at least 1
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
//! A **scrub** record declares only the [`SCRUB_PIECE`] pieces it checks
//! ([`scrub_declared`]): ordered against every write to them, so every replica computes
//! the pieces' checksums at the same point of their history, and replicas that agree
//! on the log but disagree on a checksum hold damaged or divergent bytes.
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
/// Kind of [`ChunkOp::Scrub`].
const KIND_SCRUB: u32 = 3;

/// The unit replicas are compared in (PolarFS section 7.3: 128 KB pieces).
pub const SCRUB_PIECE: u64 = 128 << 10;
/// Sectors per scrub piece.
const PIECE_SECTORS: u64 = SCRUB_PIECE / crate::SECTOR;

/// An operation on a chunk, logged in its group like a write and applied in log order
/// ([`crate::ChunkStateMachine`]). Ids are at least 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChunkOp {
    /// Take snapshot `id` ([`crate::ChunkStore::snapshot`]).
    Snapshot(u64),
    /// Delete snapshot `id` ([`crate::ChunkStore::delete_snapshot`]).
    DeleteSnapshot(u64),
    /// Scrub point `id`: checksum the pieces the record declares
    /// ([`crate::ChunkStateMachine::scrub_result`]).
    Scrub(u64),
}

/// The record data of `op`: [`OP_BYTES`] bytes, laid out as the module docs show.
pub fn encode_op(op: ChunkOp) -> Vec<u8> {
    let (kind, id) = match op {
        ChunkOp::Snapshot(id) => (KIND_SNAPSHOT, id),
        ChunkOp::DeleteSnapshot(id) => (KIND_DELETE, id),
        ChunkOp::Scrub(id) => (KIND_SCRUB, id),
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
        return Some(Err(corrupt("id 0 (ids start at 1)".into())));
    }
    Some(match kind {
        KIND_SNAPSHOT => Ok(ChunkOp::Snapshot(id)),
        KIND_DELETE => Ok(ChunkOp::DeleteSnapshot(id)),
        KIND_SCRUB => Ok(ChunkOp::Scrub(id)),
        other => Err(corrupt(format!(
            "kind {other}; this build knows 1 (snapshot), 2 (delete snapshot) and 3 (scrub)"
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

/// Pieces of [`SCRUB_PIECE`] bytes a chunk of `geometry` has (the last may be shorter).
pub fn scrub_pieces(geometry: Geometry) -> u64 {
    geometry.chunk_bytes.div_ceil(SCRUB_PIECE)
}

/// What a scrub record of `count` pieces from piece `first` declares: their sectors, one
/// range (the last piece ends at the chunk's end). Refused when the pieces are not all
/// in the chunk or `count` is 0.
pub fn scrub_declared(geometry: Geometry, first: u64, count: u64) -> Result<Declared, ChunkError> {
    let pieces = scrub_pieces(geometry);
    if count == 0 || first.checked_add(count).is_none_or(|end| end > pieces) {
        return Err(ChunkError::OutOfRange {
            offset: first.saturating_mul(SCRUB_PIECE),
            len: count.saturating_mul(SCRUB_PIECE),
            chunk_bytes: geometry.chunk_bytes,
        });
    }
    Ok(Declared::Blocks(vec![BlockRange {
        start: first * PIECE_SECTORS,
        end: ((first + count) * PIECE_SECTORS).min(geometry.sectors()),
    }]))
}

/// The pieces a scrub record's declared range names, `(first, count)`, if it is one
/// [`scrub_declared`] makes.
pub(crate) fn scrub_range(geometry: Geometry, ranges: &[BlockRange]) -> Option<(u64, u64)> {
    let [r] = ranges else { return None };
    let sectors = geometry.sectors();
    let aligned_end = r.end.is_multiple_of(PIECE_SECTORS) || r.end == sectors;
    (r.start.is_multiple_of(PIECE_SECTORS) && r.start < r.end && r.end <= sectors && aligned_end)
        .then(|| {
            (
                r.start / PIECE_SECTORS,
                r.end.div_ceil(PIECE_SECTORS) - r.start / PIECE_SECTORS,
            )
        })
}
