//! A chunk replica's image: every allocated block with its bytes, for a replica rebuilt
//! from another's (PolarFS section 5.4, catch-up). Byte by byte in docs/formats.md,
//! "Chunk image":
//!
//! ```text
//! offset  size  field
//!      0     4  magic "CHKI"
//!      4     4  version (1)
//!      8     8  chunk_bytes
//!     16     4  block_bytes
//!     20     4  count: blocks in the image
//!     24     …  count × (u32 block, block_bytes bytes), ascending by block
//!      …     4  CRC32C of every byte before it
//! ```
//! All integers little-endian. A partial image (the blocks a few lost slots wrote) has
//! the same layout: installing it replaces only the blocks it carries.

use crate::{le_u32, le_u64, seal, unseal, ChunkError, Geometry, SECTOR};

/// "CHKI".
pub const IMAGE_MAGIC: [u8; 4] = *b"CHKI";
/// The version this code writes and reads.
pub const IMAGE_VERSION: u32 = 1;
const HEADER: usize = 24;

/// Encodes `blocks` (ascending, each `geometry.block_bytes` long) of a chunk.
pub fn encode(geometry: Geometry, blocks: &[(u32, Vec<u8>)]) -> Vec<u8> {
    let bb = geometry.block_bytes as usize;
    let mut out = Vec::with_capacity(HEADER + blocks.len() * (4 + bb) + 4);
    out.extend_from_slice(&IMAGE_MAGIC);
    out.extend_from_slice(&IMAGE_VERSION.to_le_bytes());
    out.extend_from_slice(&geometry.chunk_bytes.to_le_bytes());
    out.extend_from_slice(&geometry.block_bytes.to_le_bytes());
    out.extend_from_slice(&(blocks.len() as u32).to_le_bytes());
    for (b, bytes) in blocks {
        out.extend_from_slice(&b.to_le_bytes());
        out.extend_from_slice(bytes);
    }
    seal(&mut out);
    out
}

/// Decodes an image of a chunk of `geometry` (an image of another geometry is refused).
pub fn decode(geometry: Geometry, b: &[u8]) -> Result<Vec<(u32, Vec<u8>)>, ChunkError> {
    let corrupt = |detail: String| ChunkError::Corrupt {
        what: "chunk image".into(),
        detail,
    };
    let body = unseal("chunk image", IMAGE_MAGIC, IMAGE_VERSION, HEADER, b)?;
    let u32_at = |o: usize| le_u32(body, o);
    let theirs = Geometry {
        chunk_bytes: le_u64(body, 8),
        block_bytes: u32_at(16),
    };
    if theirs != geometry {
        return Err(corrupt(format!(
            "an image of {theirs:?}, not of this chunk's {geometry:?}"
        )));
    }
    let count = u32_at(20) as usize;
    let bb = geometry.block_bytes as usize;
    let need = count
        .checked_mul(4 + bb)
        .and_then(|n| n.checked_add(HEADER));
    if need != Some(body.len()) {
        return Err(corrupt(format!(
            "{count} blocks of {bb} bytes do not fill the image's {} bytes",
            b.len()
        )));
    }
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        let o = HEADER + i * (4 + bb);
        let block = u32_at(o);
        if block >= geometry.blocks() {
            return Err(corrupt(format!(
                "entry {i}: block {block} past the chunk's {} blocks",
                geometry.blocks()
            )));
        }
        if out.last().is_some_and(|(prev, _)| *prev >= block) {
            return Err(corrupt(format!("entry {i}: block {block} out of order")));
        }
        out.push((block, body[o + 4..o + 4 + bb].to_vec()));
    }
    Ok(out)
}

/// "CHKP".
pub const PART_MAGIC: [u8; 4] = *b"CHKP";

/// A partial image: the contents of some sector ranges of a chunk (PolarFS section
/// 5.4's fast catch-up: what the few slots a follower lacks wrote). Byte by byte in
/// docs/formats.md, "Chunk image":
///
/// ```text
/// offset  size  field
///      0     4  magic "CHKP"
///      4     4  version (1)
///      8     8  chunk_bytes
///     16     4  block_bytes
///     20     4  count: sector ranges
///     24  16×count  (u64 first sector, u64 end sector), ascending, disjoint
///      …     …  the ranges' bytes, in order, 4,096 per sector
///      …     4  CRC32C of every byte before it
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    /// Sector ranges `(start, end)`, ascending, disjoint, inside the chunk.
    pub ranges: Vec<(u64, u64)>,
    /// Their bytes, in order.
    pub data: Vec<u8>,
}

/// Encodes a partial image of a chunk of `geometry`.
pub fn encode_part(geometry: Geometry, part: &Part) -> Vec<u8> {
    let mut out = Vec::with_capacity(24 + 16 * part.ranges.len() + part.data.len() + 4);
    out.extend_from_slice(&PART_MAGIC);
    out.extend_from_slice(&IMAGE_VERSION.to_le_bytes());
    out.extend_from_slice(&geometry.chunk_bytes.to_le_bytes());
    out.extend_from_slice(&geometry.block_bytes.to_le_bytes());
    out.extend_from_slice(&(part.ranges.len() as u32).to_le_bytes());
    for (s, e) in &part.ranges {
        out.extend_from_slice(&s.to_le_bytes());
        out.extend_from_slice(&e.to_le_bytes());
    }
    out.extend_from_slice(&part.data);
    seal(&mut out);
    out
}

/// Decodes a partial image of a chunk of `geometry`.
pub fn decode_part(geometry: Geometry, b: &[u8]) -> Result<Part, ChunkError> {
    let corrupt = |detail: String| ChunkError::Corrupt {
        what: "partial chunk image".into(),
        detail,
    };
    let body = unseal("partial chunk image", PART_MAGIC, IMAGE_VERSION, HEADER, b)?;
    let u32_at = |o: usize| le_u32(body, o);
    let u64_at = |o: usize| le_u64(body, o);
    let theirs = Geometry {
        chunk_bytes: u64_at(8),
        block_bytes: u32_at(16),
    };
    if theirs != geometry {
        return Err(corrupt(format!(
            "an image of {theirs:?}, not of this chunk's {geometry:?}"
        )));
    }
    let count = u32_at(20) as usize;
    let head = count.checked_mul(16).and_then(|n| n.checked_add(HEADER));
    let Some(head) = head.filter(|h| *h <= body.len()) else {
        return Err(corrupt(format!(
            "{count} ranges do not fit in {} bytes",
            b.len()
        )));
    };
    let sectors = geometry.chunk_bytes / SECTOR;
    let mut ranges = Vec::with_capacity(count);
    let mut total = 0u64;
    for i in 0..count {
        let (s, e) = (u64_at(HEADER + 16 * i), u64_at(HEADER + 16 * i + 8));
        if s >= e || e > sectors || ranges.last().is_some_and(|&(_, pe)| pe > s) {
            return Err(corrupt(format!(
                "range {i}: sectors {s}..{e} empty, past the chunk's {sectors} or out of order"
            )));
        }
        total += e - s;
        ranges.push((s, e));
    }
    if (body.len() - head) as u64 != total * SECTOR {
        return Err(corrupt(format!(
            "{total} sectors need {} bytes of data, the image has {}",
            total * SECTOR,
            body.len() - head
        )));
    }
    Ok(Part {
        ranges,
        data: body[head..].to_vec(),
    })
}
