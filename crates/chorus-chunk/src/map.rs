//! The chunk's block map file, `chunk.map`: which block of the chunk lives in which slot
//! of the data file — for the chunk's current contents and for each of its snapshots
//! (PolarFS section 7.2) — as of the last checkpoint, and which data file that is.
//! Written crash-atomically (a temporary file, synced, renamed over the old one, the
//! directory synced), so a chunk always opens to its last checkpoint whole. Byte by byte
//! in docs/formats.md, "Chunk block map". Version 2, written always:
//!
//! ```text
//! offset  size  field
//!      0     4  magic "CHKM"
//!      4     4  version (2)
//!      8     8  chunk_bytes
//!     16     4  block_bytes
//!     20     4  count: blocks the current map holds
//!     24     8  data generation: the data file is `chunk.{generation:016x}.data`
//!     32     4  slot_count: slots of the data file in use or free (below it)
//!     36     4  snapshots: how many snapshot maps follow the current one
//!     40     4  deleted: how many deleted snapshot ids follow the snapshot maps
//!     44  8×count  current map: (u32 block, u32 slot), ascending by block
//!      …     …  per snapshot, ascending by id: u64 id, u32 n, n × (u32 block, u32 slot)
//!      …  8×deleted  u64 ids of deleted snapshots, ascending
//!      …     4  CRC32C of every byte before it
//! ```
//! All integers little-endian. Every block is below the chunk's block count and ascending
//! within its map; every slot is below `slot_count`; a slot holds one block (maps that
//! name a slot name it for the same block: a snapshot shares its slots with the current
//! map and other snapshots, never lends them to another block); snapshot ids are at
//! least 1 and ascending; deleted ids too, and none is a snapshot's. Slots below
//! `slot_count` that no map names are free: the store derives its free list at open.
//!
//! Version 1 (the first 32 bytes as above with version 1, then `count` entries, then the
//! CRC) is still read: no snapshots, no deleted ids, and slots exactly `0..count`
//! (`slot_count` = `count`).

use std::collections::hash_map::Entry;
use std::collections::HashMap;

use crate::{le_u32, le_u64, seal, unseal, ChunkError, Geometry, Reader};

/// "CHKM".
pub const MAP_MAGIC: [u8; 4] = *b"CHKM";
/// The version this code writes (it reads 1 too).
pub const MAP_VERSION: u32 = 2;
/// Bytes before the current map's entries (version 2).
pub const MAP_HEADER: usize = 44;
/// Bytes before the entries in version 1.
const MAP_HEADER_V1: usize = 32;

/// One snapshot's block map (PolarFS section 7.2: a snapshot is a copy of the block
/// map). In a block map file the slots are the data file's; in an image
/// ([`crate::image::Image`]) they index the image's blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotMap {
    /// The snapshot's id: at least 1.
    pub id: u64,
    /// `(block, slot)`, ascending by block: the blocks the snapshot holds data for.
    pub entries: Vec<(u32, u32)>,
}

/// A decoded block map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapFile {
    /// The chunk's geometry.
    pub geometry: Geometry,
    /// The data file's generation.
    pub generation: u64,
    /// Slots of the data file in use or free: every slot a map names is below it, and
    /// those below it that no map names are free.
    pub slot_count: u32,
    /// The current map: `(block, slot)`, ascending by block; every block below the
    /// chunk's block count.
    pub entries: Vec<(u32, u32)>,
    /// The snapshots' maps, ascending by id; a slot any two maps name holds the same
    /// block in both.
    pub snapshots: Vec<SnapshotMap>,
    /// Ids of deleted snapshots, ascending, none a snapshot's: such an id is never taken
    /// again ([`crate::ChunkStore::snapshot`] says why).
    pub deleted: Vec<u64>,
}

/// Bytes of a version 2 map file with `current` entries in the current map, snapshots
/// of the given entry counts, and `deleted` deleted ids.
pub fn encoded_len(
    current: usize,
    snapshots: impl IntoIterator<Item = usize>,
    deleted: usize,
) -> u64 {
    let snaps: u64 = snapshots.into_iter().map(|n| 12 + 8 * n as u64).sum();
    MAP_HEADER as u64 + 8 * current as u64 + snaps + 8 * deleted as u64 + 4
}

/// Appends `(block, slot)` entries.
/// Appends the snapshot maps (`u64 id | u32 count | count entries` each) and then the
/// deleted ids (`u64` each): the same layout in the block map and the image.
pub(crate) fn put_snapshots(out: &mut Vec<u8>, snapshots: &[SnapshotMap], deleted: &[u64]) {
    for s in snapshots {
        out.extend_from_slice(&s.id.to_le_bytes());
        out.extend_from_slice(&(s.entries.len() as u32).to_le_bytes());
        put_entries(out, &s.entries);
    }
    for id in deleted {
        out.extend_from_slice(&id.to_le_bytes());
    }
}

pub(crate) fn put_entries(out: &mut Vec<u8>, entries: &[(u32, u32)]) {
    for (b, s) in entries {
        out.extend_from_slice(&b.to_le_bytes());
        out.extend_from_slice(&s.to_le_bytes());
    }
}

/// Reads `n` `(block, slot)` entries; `None` when the bytes run out first (checked before
/// anything is allocated, so a huge count cannot exhaust memory).
pub(crate) fn read_entries(r: &mut Reader<'_>, n: u32) -> Option<Vec<(u32, u32)>> {
    let bytes = r.take((n as usize).checked_mul(8)?)?;
    Some(
        bytes
            .chunks_exact(8)
            .map(|e| (le_u32(e, 0), le_u32(e, 4)))
            .collect(),
    )
}

/// Checks a set of maps (the current one, the snapshots', the deleted ids) against the
/// rules the module docs state: blocks below `nblocks` and ascending, slots below
/// `slot_limit`, a slot holding one block across all maps, snapshot ids at least 1 and
/// ascending, deleted ids too and none a snapshot's. The error names what is wrong.
pub(crate) fn check_maps(
    nblocks: u32,
    slot_limit: u32,
    current: &[(u32, u32)],
    snapshots: &[SnapshotMap],
    deleted: &[u64],
) -> Result<(), String> {
    // Slot → the block it holds, across every map.
    let mut owner: HashMap<u32, u32> = HashMap::with_capacity(current.len());
    let mut check = |which: &str, entries: &[(u32, u32)]| -> Result<(), String> {
        let mut prev: Option<u32> = None;
        for (i, &(block, slot)) in entries.iter().enumerate() {
            if block >= nblocks {
                return Err(format!(
                    "{which} entry {i}: block {block} past the chunk's {nblocks} blocks"
                ));
            }
            if let Some(p) = prev.filter(|p| *p >= block) {
                return Err(format!(
                    "{which} entry {i}: block {block} not above the previous {p}"
                ));
            }
            prev = Some(block);
            if slot >= slot_limit {
                return Err(format!(
                    "{which} entry {i}: slot {slot} past the {slot_limit} slots"
                ));
            }
            match owner.entry(slot) {
                Entry::Vacant(v) => {
                    v.insert(block);
                }
                Entry::Occupied(o) if *o.get() != block => {
                    return Err(format!(
                        "{which} entry {i}: slot {slot} holds block {block} here and block {} \
                         elsewhere (a slot holds one block)",
                        o.get()
                    ));
                }
                Entry::Occupied(_) => {}
            }
        }
        Ok(())
    };
    check("current map", current)?;
    let mut prev_id = 0u64;
    for s in snapshots {
        if s.id <= prev_id {
            return Err(format!(
                "snapshot id {} not above the previous {prev_id} (ids start at 1)",
                s.id
            ));
        }
        prev_id = s.id;
        check(&format!("snapshot {}", s.id), &s.entries)?;
    }
    let mut prev_id = 0u64;
    for &id in deleted {
        if id <= prev_id {
            return Err(format!(
                "deleted snapshot id {id} not above the previous {prev_id} (ids start at 1)"
            ));
        }
        prev_id = id;
        if snapshots.binary_search_by_key(&id, |s| s.id).is_ok() {
            return Err(format!("snapshot {id} both held and deleted"));
        }
    }
    Ok(())
}

impl MapFile {
    /// The file's bytes (version 2).
    pub fn encode(&self) -> Vec<u8> {
        let len = encoded_len(
            self.entries.len(),
            self.snapshots.iter().map(|s| s.entries.len()),
            self.deleted.len(),
        );
        let mut out = Vec::with_capacity(len as usize);
        out.extend_from_slice(&MAP_MAGIC);
        out.extend_from_slice(&MAP_VERSION.to_le_bytes());
        out.extend_from_slice(&self.geometry.chunk_bytes.to_le_bytes());
        out.extend_from_slice(&self.geometry.block_bytes.to_le_bytes());
        out.extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.generation.to_le_bytes());
        out.extend_from_slice(&self.slot_count.to_le_bytes());
        out.extend_from_slice(&(self.snapshots.len() as u32).to_le_bytes());
        out.extend_from_slice(&(self.deleted.len() as u32).to_le_bytes());
        put_entries(&mut out, &self.entries);
        put_snapshots(&mut out, &self.snapshots, &self.deleted);
        seal(&mut out);
        out
    }

    /// Decodes and checks a map file of version 1 or 2; `what` names it in errors. Any
    /// bytes give a map or [`ChunkError::Corrupt`] naming what is wrong.
    pub fn decode(what: &str, b: &[u8]) -> Result<Self, ChunkError> {
        let corrupt = |detail: String| ChunkError::Corrupt {
            what: what.to_string(),
            detail,
        };
        let (body, version) = unseal(what, MAP_MAGIC, &[1, MAP_VERSION], MAP_HEADER_V1, b)?;
        let geometry = Geometry {
            chunk_bytes: le_u64(body, 8),
            block_bytes: le_u32(body, 16),
        };
        geometry.check().map_err(|e| corrupt(e.to_string()))?;
        let count = le_u32(body, 20);
        let generation = le_u64(body, 24);
        let (slot_count, nsnaps, ndeleted, header) = if version == 1 {
            (count, 0, 0, MAP_HEADER_V1)
        } else {
            if body.len() < MAP_HEADER {
                return Err(corrupt(format!(
                    "{} bytes, shorter than a version 2 header",
                    b.len()
                )));
            }
            (
                le_u32(body, 32),
                le_u32(body, 36),
                le_u32(body, 40),
                MAP_HEADER,
            )
        };
        let mut r = Reader::new(body, header);
        let entries = read_entries(&mut r, count).ok_or_else(|| {
            corrupt(format!(
                "{count} current entries do not fit in the file's {} bytes",
                b.len()
            ))
        })?;
        // At least 12 bytes a snapshot: bound the allocation by what the bytes can hold.
        let mut snapshots = Vec::with_capacity((nsnaps as usize).min(r.remaining() / 12));
        for k in 0..nsnaps {
            let short = || corrupt(format!("the file ends inside snapshot map {k} of {nsnaps}"));
            let id = r.u64().ok_or_else(short)?;
            let n = r.u32().ok_or_else(short)?;
            let entries = read_entries(&mut r, n).ok_or_else(short)?;
            snapshots.push(SnapshotMap { id, entries });
        }
        let ids = r
            .take((ndeleted as usize).saturating_mul(8))
            .ok_or_else(|| corrupt(format!("the file ends inside its {ndeleted} deleted ids")))?;
        let deleted: Vec<u64> = ids.chunks_exact(8).map(|c| le_u64(c, 0)).collect();
        if r.remaining() != 0 {
            return Err(corrupt(format!(
                "{} bytes past the maps and deleted ids",
                r.remaining()
            )));
        }
        check_maps(
            geometry.blocks(),
            slot_count,
            &entries,
            &snapshots,
            &deleted,
        )
        .map_err(corrupt)?;
        Ok(Self {
            geometry,
            generation,
            slot_count,
            entries,
            snapshots,
            deleted,
        })
    }
}
