//! [`ChunkStateMachine`]: a chunk replica as the state machine of its parallel-mode
//! group (PolarFS section 4: a chunk's writes go through its WAL — the group's log —
//! and are applied to its blocks).
//!
//! - **Apply**: each record's declared sector ranges (`Declared::Blocks`, in 4 KiB
//!   sectors) are written with the record's bytes, in order, into the [`ChunkStore`].
//!   Writes are blind, whole sectors, as the replica's replay from its base requires.
//! - **Checkpoint**: [`ChunkStore::checkpoint`] (the data synced, then the block map);
//!   the group compacts its log below it, so the log stays bounded.
//! - **Images**: every allocated block ([`crate::image`]); a follower that lacks only a
//!   few compacted slots gets the sectors they wrote ([`crate::image::Part`]).
//!
//! A write past the chunk's end cannot be applied, and an apply error stops the group's
//! replica on this node: whoever appends to a chunk's group must split I/O at chunk
//! boundaries first (the volume layer does).

use std::io;
use std::path::Path;
use std::sync::Arc;

use chorus_core::ooo::group::Record;
use chorus_core::ooo::replica::{Declared, Footprint};
use chorus_runtime::ooo::OooStateMachine;
use chorus_storage::fs::FileSystem;

use crate::image::{self, Part};
use crate::{ChunkError, ChunkStore, Geometry, SECTOR};

/// A chunk replica applied from its group's log. See the module docs.
#[derive(Debug)]
pub struct ChunkStateMachine {
    store: ChunkStore,
}

fn to_io(e: ChunkError) -> io::Error {
    let kind = match &e {
        ChunkError::Io { source, .. } => source.kind(),
        _ => io::ErrorKind::InvalidData,
    };
    io::Error::new(kind, e.to_string())
}

impl ChunkStateMachine {
    /// Opens (or creates) the chunk replica in `dir`.
    pub fn open(
        fs: Arc<dyn FileSystem>,
        dir: &Path,
        geometry: Geometry,
    ) -> Result<Self, ChunkError> {
        Ok(Self {
            store: ChunkStore::open(fs, dir, geometry)?,
        })
    }

    /// The chunk's store, for reads.
    pub fn store(&self) -> &ChunkStore {
        &self.store
    }
}

impl OooStateMachine for ChunkStateMachine {
    fn apply(&self, slot: u64, records: &[(u32, Record)]) -> io::Result<()> {
        for (i, rec) in records {
            let Declared::Blocks(ranges) = &rec.declared else {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("chunk: slot {slot} record {i} declares keys, not sectors"),
                ));
            };
            let mut at = 0usize;
            for r in ranges {
                let n = r
                    .end
                    .checked_sub(r.start)
                    .and_then(|s| s.checked_mul(SECTOR))
                    .and_then(|b| usize::try_from(b).ok());
                let piece = n.and_then(|n| rec.data.get(at..at.checked_add(n)?));
                let Some(piece) = piece else {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("chunk: slot {slot} record {i}: data shorter than its sectors"),
                    ));
                };
                let offset = r.start.checked_mul(SECTOR).ok_or_else(|| {
                    to_io(ChunkError::OutOfRange {
                        offset: u64::MAX,
                        len: piece.len() as u64,
                        chunk_bytes: self.store.geometry().chunk_bytes,
                    })
                })?;
                self.store.write(offset, piece).map_err(to_io)?;
                at += piece.len();
            }
        }
        Ok(())
    }

    fn checkpoint(&self) -> io::Result<()> {
        self.store.checkpoint().map_err(to_io)
    }

    fn checkpoint_cost(&self) -> u64 {
        self.store.checkpoint_bytes()
    }

    fn image(&self) -> io::Result<Vec<u8>> {
        let blocks = self.store.blocks().map_err(to_io)?;
        Ok(image::encode(self.store.geometry(), &blocks))
    }

    fn restore(&self, bytes: &[u8]) -> io::Result<()> {
        let blocks = image::decode(self.store.geometry(), bytes).map_err(to_io)?;
        self.store.replace(&blocks).map_err(to_io)
    }

    fn image_part(&self, scope: &Footprint) -> io::Result<Option<Vec<u8>>> {
        if !scope.keys.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "partial chunk image: asked for keys",
            ));
        }
        let mut part = Part {
            ranges: Vec::with_capacity(scope.blocks.len()),
            data: Vec::new(),
        };
        for r in &scope.blocks {
            let (offset, len) = (r.start * SECTOR, (r.end - r.start) * SECTOR);
            part.data
                .extend(self.store.read(offset, len as usize).map_err(to_io)?);
            part.ranges.push((r.start, r.end));
        }
        Ok(Some(image::encode_part(self.store.geometry(), &part)))
    }

    fn restore_part(&self, bytes: &[u8]) -> io::Result<()> {
        let part = image::decode_part(self.store.geometry(), bytes).map_err(to_io)?;
        let bb = self.store.geometry().block_bytes as u64;
        let mut at = 0usize;
        for (s, e) in &part.ranges {
            for sector in *s..*e {
                let bytes = &part.data[at..at + SECTOR as usize];
                at += SECTOR as usize;
                // A sector of zeros in a block this replica never wrote reads as zeros
                // already: writing it would only take space.
                let block = (sector * SECTOR / bb) as u32;
                if bytes.iter().all(|b| *b == 0) && !self.store.is_allocated(block) {
                    continue;
                }
                self.store.write(sector * SECTOR, bytes).map_err(to_io)?;
            }
        }
        self.store.checkpoint().map_err(to_io)
    }
}
