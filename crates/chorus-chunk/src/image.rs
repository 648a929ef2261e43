//! A chunk replica's images, for a replica rebuilt from another's (PolarFS section 5.4,
//! catch-up). Byte by byte in docs/formats.md, "Chunk image".
//!
//! **Whole image** ([`Image`], version 2): the current block map and every snapshot's
//! (PolarFS section 7.2: a replica rebuilt from an image must hold the snapshots too),
//! the ids of deleted snapshots, and the bytes of each distinct slot once — a block a
//! snapshot shares with the current map, or with another snapshot, travels once:
//!
//! ```text
//! offset  size  field
//!      0     4  magic "CHKI"
//!      4     4  version (2)
//!      8     8  chunk_bytes
//!     16     4  block_bytes
//!     20     4  slots: blocks of bytes the image carries
//!     24     4  count: entries of the current map
//!     28     4  snapshots: snapshot maps
//!     32     4  deleted: deleted snapshot ids
//!     36  8×count  current map: (u32 block, u32 image slot), ascending by block
//!      …     …  per snapshot, ascending by id: u64 id, u32 n, n × (u32 block, u32 image slot)
//!      …  8×deleted  u64 deleted ids, ascending
//!      …  slots × block_bytes  image slot 0's bytes, slot 1's, …
//!      …     4  CRC32C of every byte before it
//! ```
//! All integers little-endian. The maps follow the block map file's rules
//! ([`crate::map`]) with `slots` as the slot count, and every image slot is named by some
//! map. Installing one ([`crate::ChunkStore::replace`]) puts image slot `i` in data slot
//! `i`. Version 1 (`count` × (u32 block, the block's bytes) after a 24-byte header: the
//! current blocks only) is still read.
//!
//! **Partial image** ([`Part`]): the contents of some sector ranges of the current map.

use crate::map::{check_maps, put_entries, put_snapshots, read_entries, SnapshotMap};
use crate::{le_u32, le_u64, seal, unseal, ChunkError, Geometry, Reader, SECTOR};

/// "CHKI".
pub const IMAGE_MAGIC: [u8; 4] = *b"CHKI";
/// The version of whole images this code writes (it reads 1 too).
pub const IMAGE_VERSION: u32 = 2;
/// Bytes before a version 2 image's current map.
const HEADER: usize = 36;
/// Bytes before a version 1 image's blocks.
const HEADER_V1: usize = 24;

/// A whole image of a chunk replica: its current map, its snapshots' maps, its deleted
/// snapshot ids, and the bytes of each distinct slot those maps name, once.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Image {
    /// The current map: `(block, index into data)`, ascending by block.
    pub current: Vec<(u32, u32)>,
    /// The snapshots' maps, ascending by id; their slots index `data` too.
    pub snapshots: Vec<SnapshotMap>,
    /// Ids of deleted snapshots, ascending, none a snapshot's.
    pub deleted: Vec<u64>,
    /// Each image slot's bytes, `block_bytes` long. Every one is named by some map, and
    /// every map that names it names it for the same block.
    pub data: Vec<Vec<u8>>,
}

impl Image {
    /// An image of current blocks only (each a block index and its full bytes, the
    /// blocks ascending and distinct): no snapshots.
    pub fn from_blocks(blocks: Vec<(u32, Vec<u8>)>) -> Self {
        let mut image = Image::default();
        for (i, (b, bytes)) in blocks.into_iter().enumerate() {
            image.current.push((b, i as u32));
            image.data.push(bytes);
        }
        image
    }

    /// Checks the invariants the fields state against a chunk of `geometry`.
    pub fn check(&self, geometry: Geometry) -> Result<(), ChunkError> {
        let corrupt = |detail: String| ChunkError::Corrupt {
            what: "chunk image".into(),
            detail,
        };
        let slots = u32::try_from(self.data.len())
            .ok()
            .filter(|n| *n < u32::MAX)
            .ok_or_else(|| corrupt(format!("{} slots, too many", self.data.len())))?;
        let bb = geometry.block_bytes as usize;
        if let Some(i) = self.data.iter().position(|d| d.len() != bb) {
            return Err(corrupt(format!(
                "slot {i} has {} bytes, not a block's {bb}",
                self.data[i].len()
            )));
        }
        check_maps(
            geometry.blocks(),
            slots,
            &self.current,
            &self.snapshots,
            &self.deleted,
        )
        .map_err(corrupt)?;
        let mut named = vec![false; self.data.len()];
        for (_, s) in self
            .current
            .iter()
            .chain(self.snapshots.iter().flat_map(|m| m.entries.iter()))
        {
            named[*s as usize] = true;
        }
        if let Some(i) = named.iter().position(|n| !n) {
            return Err(corrupt(format!("slot {i} is named by no map")));
        }
        Ok(())
    }
}

/// Encodes a whole image of a chunk of `geometry` (version 2). The image must satisfy
/// [`Image::check`] (the store's [`crate::ChunkStore::image`] does).
pub fn encode(geometry: Geometry, image: &Image) -> Vec<u8> {
    let bb = geometry.block_bytes as usize;
    let maps: usize = image
        .snapshots
        .iter()
        .map(|s| 12 + 8 * s.entries.len())
        .sum();
    let mut out = Vec::with_capacity(
        HEADER
            + 8 * image.current.len()
            + maps
            + 8 * image.deleted.len()
            + image.data.len() * bb
            + 4,
    );
    out.extend_from_slice(&IMAGE_MAGIC);
    out.extend_from_slice(&IMAGE_VERSION.to_le_bytes());
    out.extend_from_slice(&geometry.chunk_bytes.to_le_bytes());
    out.extend_from_slice(&geometry.block_bytes.to_le_bytes());
    out.extend_from_slice(&(image.data.len() as u32).to_le_bytes());
    out.extend_from_slice(&(image.current.len() as u32).to_le_bytes());
    out.extend_from_slice(&(image.snapshots.len() as u32).to_le_bytes());
    out.extend_from_slice(&(image.deleted.len() as u32).to_le_bytes());
    put_entries(&mut out, &image.current);
    put_snapshots(&mut out, &image.snapshots, &image.deleted);
    for d in &image.data {
        out.extend_from_slice(d);
    }
    seal(&mut out);
    out
}

/// Decodes a whole image (version 1 or 2) of a chunk of `geometry`: an image of another
/// geometry, of bad lengths or checksum, or breaking [`Image`]'s invariants is refused
/// ([`ChunkError::Corrupt`]).
pub fn decode(geometry: Geometry, b: &[u8]) -> Result<Image, ChunkError> {
    let corrupt = |detail: String| ChunkError::Corrupt {
        what: "chunk image".into(),
        detail,
    };
    let (body, version) = unseal(
        "chunk image",
        IMAGE_MAGIC,
        &[1, IMAGE_VERSION],
        HEADER_V1,
        b,
    )?;
    let theirs = Geometry {
        chunk_bytes: le_u64(body, 8),
        block_bytes: le_u32(body, 16),
    };
    if theirs != geometry {
        return Err(corrupt(format!(
            "an image of {theirs:?}, not of this chunk's {geometry:?}"
        )));
    }
    let bb = geometry.block_bytes as usize;
    if version == 1 {
        return decode_v1(geometry, body).map_err(corrupt);
    }
    if body.len() < HEADER {
        return Err(corrupt(format!(
            "{} bytes, shorter than a version 2 header",
            b.len()
        )));
    }
    let (slots, count, nsnaps, ndeleted) = (
        le_u32(body, 20),
        le_u32(body, 24),
        le_u32(body, 28),
        le_u32(body, 32),
    );
    // The slots' bytes come last: check they fit before anything is allocated.
    let data_bytes = (slots as usize)
        .checked_mul(bb)
        .filter(|n| *n <= body.len() - HEADER)
        .ok_or_else(|| {
            corrupt(format!(
                "{slots} slots of {bb} bytes do not fit in the image's {} bytes",
                b.len()
            ))
        })?;
    let maps = &body[..body.len() - data_bytes];
    let mut r = Reader::new(maps, HEADER);
    let current = read_entries(&mut r, count).ok_or_else(|| {
        corrupt(format!(
            "{count} current entries and {slots} slots do not fit in the image's {} bytes",
            b.len()
        ))
    })?;
    let mut snapshots = Vec::with_capacity((nsnaps as usize).min(r.remaining() / 12));
    for k in 0..nsnaps {
        let short = || {
            corrupt(format!(
                "the maps end inside snapshot map {k} of {nsnaps} ({slots} slots of data after them)"
            ))
        };
        let id = r.u64().ok_or_else(short)?;
        let n = r.u32().ok_or_else(short)?;
        let entries = read_entries(&mut r, n).ok_or_else(short)?;
        snapshots.push(SnapshotMap { id, entries });
    }
    let ids = r
        .take((ndeleted as usize).saturating_mul(8))
        .ok_or_else(|| corrupt(format!("the maps end inside the {ndeleted} deleted ids")))?;
    let deleted = ids.chunks_exact(8).map(|c| le_u64(c, 0)).collect();
    if r.remaining() != 0 {
        return Err(corrupt(format!(
            "{} bytes between the maps and the {slots} slots of data",
            r.remaining()
        )));
    }
    let image = Image {
        current,
        snapshots,
        deleted,
        data: body[body.len() - data_bytes..]
            .chunks_exact(bb)
            .map(<[u8]>::to_vec)
            .collect(),
    };
    image.check(geometry)?;
    Ok(image)
}

/// A version 1 image's body (checked and of `geometry`): current blocks only.
fn decode_v1(geometry: Geometry, body: &[u8]) -> Result<Image, String> {
    let count = le_u32(body, 20) as usize;
    let bb = geometry.block_bytes as usize;
    let need = count
        .checked_mul(4 + bb)
        .and_then(|n| n.checked_add(HEADER_V1));
    if need != Some(body.len()) {
        return Err(format!(
            "{count} blocks of {bb} bytes do not fill the image's {} bytes",
            body.len() + 4
        ));
    }
    let mut image = Image::default();
    for i in 0..count {
        let o = HEADER_V1 + i * (4 + bb);
        let block = le_u32(body, o);
        if block >= geometry.blocks() {
            return Err(format!(
                "entry {i}: block {block} past the chunk's {} blocks",
                geometry.blocks()
            ));
        }
        if image.current.last().is_some_and(|(prev, _)| *prev >= block) {
            return Err(format!("entry {i}: block {block} out of order"));
        }
        image.current.push((block, i as u32));
        image.data.push(body[o + 4..o + 4 + bb].to_vec());
    }
    Ok(image)
}

/// "CHKP".
pub const PART_MAGIC: [u8; 4] = *b"CHKP";

/// The version of partial images this code writes (it reads 1 too).
pub const PART_VERSION: u32 = 2;
/// Bytes before a version 2 partial image's ranges.
const PART_HEADER: usize = 32;

/// A partial image: the contents of some sector ranges of a chunk's current map
/// (PolarFS section 5.4's fast catch-up: what the few slots a follower lacks wrote).
/// Byte by byte in docs/formats.md, "Chunk image":
///
/// ```text
/// offset  size  field
///      0     4  magic "CHKP"
///      4     4  version (2)
///      8     8  chunk_bytes
///     16     4  block_bytes
///     20     4  count: sector ranges
///     24     8  ids seen: snapshot ids the leader's replica held or had deleted
///     32  16×count  (u64 first sector, u64 end sector), ascending, disjoint
///      …     …  the ranges' bytes, in order, 4,096 per sector
///      …     4  CRC32C of every byte before it
/// ```
/// Version 1 (no `ids seen`, ranges at 24) is still read, as 0 ids seen.
///
/// `ids seen` guards against a snapshot the leader took after the image's base: see
/// [`crate::sm`]'s module docs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    /// Snapshot ids the replica that made the image held or had deleted
    /// ([`crate::ChunkStore::snapshot_ids_seen`]) when it read the ranges.
    pub ids_seen: u64,
    /// Sector ranges `(start, end)`, ascending, disjoint, inside the chunk.
    pub ranges: Vec<(u64, u64)>,
    /// Their bytes, in order.
    pub data: Vec<u8>,
}

/// Encodes a partial image of a chunk of `geometry` (version 2).
pub fn encode_part(geometry: Geometry, part: &Part) -> Vec<u8> {
    let mut out = Vec::with_capacity(PART_HEADER + 16 * part.ranges.len() + part.data.len() + 4);
    out.extend_from_slice(&PART_MAGIC);
    out.extend_from_slice(&PART_VERSION.to_le_bytes());
    out.extend_from_slice(&geometry.chunk_bytes.to_le_bytes());
    out.extend_from_slice(&geometry.block_bytes.to_le_bytes());
    out.extend_from_slice(&(part.ranges.len() as u32).to_le_bytes());
    out.extend_from_slice(&part.ids_seen.to_le_bytes());
    for (s, e) in &part.ranges {
        out.extend_from_slice(&s.to_le_bytes());
        out.extend_from_slice(&e.to_le_bytes());
    }
    out.extend_from_slice(&part.data);
    seal(&mut out);
    out
}

/// Decodes a partial image (version 1 or 2) of a chunk of `geometry`.
pub fn decode_part(geometry: Geometry, b: &[u8]) -> Result<Part, ChunkError> {
    let corrupt = |detail: String| ChunkError::Corrupt {
        what: "partial chunk image".into(),
        detail,
    };
    let (body, version) = unseal(
        "partial chunk image",
        PART_MAGIC,
        &[1, PART_VERSION],
        HEADER_V1,
        b,
    )?;
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
    let (header, ids_seen) = if version == 1 {
        (HEADER_V1, 0)
    } else if body.len() < PART_HEADER {
        return Err(corrupt(format!(
            "{} bytes, shorter than a version 2 header",
            b.len()
        )));
    } else {
        (PART_HEADER, u64_at(24))
    };
    let count = u32_at(20) as usize;
    let head = count.checked_mul(16).and_then(|n| n.checked_add(header));
    let Some(head) = head.filter(|h| *h <= body.len()) else {
        return Err(corrupt(format!(
            "{count} ranges do not fit in {} bytes",
            b.len()
        )));
    };
    let sectors = geometry.sectors();
    let mut ranges = Vec::with_capacity(count);
    let mut total = 0u64;
    for i in 0..count {
        let (s, e) = (u64_at(header + 16 * i), u64_at(header + 16 * i + 8));
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
        ids_seen,
        ranges,
        data: body[head..].to_vec(),
    })
}
