//! The chunk's block map file, `chunk.map`: which block of the chunk lives in which slot
//! of the data file, as of the last checkpoint, and which data file that is. Written
//! crash-atomically (a temporary file, synced, renamed over the old one, the directory
//! synced), so a chunk always opens to its last checkpoint whole. Byte by byte in
//! docs/formats.md, "Chunk block map".
//!
//! ```text
//! offset  size  field
//!      0     4  magic "CHKM"
//!      4     4  version (1)
//!      8     8  chunk_bytes
//!     16     4  block_bytes
//!     20     4  count: blocks allocated
//!     24     8  data generation: the data file is `chunk.{generation:016x}.data`
//!     32  8×count  (u32 block, u32 slot), ascending by block, no slot twice
//!      …     4  CRC32C of every byte before it
//! ```
//! All integers little-endian.

use crate::{le_u32, le_u64, seal, unseal, ChunkError, Geometry};

/// "CHKM".
pub const MAP_MAGIC: [u8; 4] = *b"CHKM";
/// The version this code writes and reads.
pub const MAP_VERSION: u32 = 1;
/// Bytes before the entries.
pub const MAP_HEADER: usize = 32;

/// A decoded block map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapFile {
    /// The chunk's geometry.
    pub geometry: Geometry,
    /// The data file's generation.
    pub generation: u64,
    /// `(block, slot)`, ascending by block; no block or slot twice; every block below
    /// the chunk's block count.
    pub entries: Vec<(u32, u32)>,
}

impl MapFile {
    /// The file's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(MAP_HEADER + 8 * self.entries.len() + 4);
        out.extend_from_slice(&MAP_MAGIC);
        out.extend_from_slice(&MAP_VERSION.to_le_bytes());
        out.extend_from_slice(&self.geometry.chunk_bytes.to_le_bytes());
        out.extend_from_slice(&self.geometry.block_bytes.to_le_bytes());
        out.extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.generation.to_le_bytes());
        for (b, s) in &self.entries {
            out.extend_from_slice(&b.to_le_bytes());
            out.extend_from_slice(&s.to_le_bytes());
        }
        seal(&mut out);
        out
    }

    /// Decodes and checks a map file; `what` names it in errors.
    pub fn decode(what: &str, b: &[u8]) -> Result<Self, ChunkError> {
        let corrupt = |detail: String| ChunkError::Corrupt {
            what: what.to_string(),
            detail,
        };
        let body = unseal(what, MAP_MAGIC, MAP_VERSION, MAP_HEADER, b)?;
        let u32_at = |o: usize| le_u32(body, o);
        let u64_at = |o: usize| le_u64(body, o);
        let geometry = Geometry {
            chunk_bytes: u64_at(8),
            block_bytes: u32_at(16),
        };
        geometry.check().map_err(|e| corrupt(e.to_string()))?;
        let count = u32_at(20) as usize;
        let generation = u64_at(24);
        if body.len() != MAP_HEADER + 8 * count {
            return Err(corrupt(format!(
                "{count} entries need {} bytes, the file has {}",
                MAP_HEADER + 8 * count + 4,
                b.len()
            )));
        }
        let blocks = geometry.blocks();
        let mut entries = Vec::with_capacity(count);
        let mut slots = vec![false; count];
        for i in 0..count {
            let o = MAP_HEADER + 8 * i;
            let (block, slot) = (u32_at(o), u32_at(o + 4));
            if block >= blocks {
                return Err(corrupt(format!(
                    "entry {i}: block {block} past the chunk's {blocks} blocks"
                )));
            }
            if let Some(&(prev, _)) = entries.last() {
                if block <= prev {
                    return Err(corrupt(format!(
                        "entry {i}: block {block} not above the previous {prev}"
                    )));
                }
            }
            // Slots are dense below the count: each slot of the data file holds one block.
            match slots.get_mut(slot as usize) {
                Some(seen @ false) => *seen = true,
                Some(true) => {
                    return Err(corrupt(format!("entry {i}: slot {slot} used twice")));
                }
                None => {
                    return Err(corrupt(format!(
                        "entry {i}: slot {slot} past the {count} slots a map of {count} blocks has"
                    )));
                }
            }
            entries.push((block, slot));
        }
        Ok(Self {
            geometry,
            generation,
            entries,
        })
    }
}
