//! [`ChunkStateMachine`]: a chunk replica as the state machine of its parallel-mode
//! group (PolarFS section 4: a chunk's writes go through its WAL — the group's log —
//! and are applied to its blocks).
//!
//! - **Apply**: each record's declared sector ranges (`Declared::Blocks`, in 4 KiB
//!   sectors) are written with the record's bytes, in order, into the [`ChunkStore`].
//!   Writes are blind, whole sectors, as the replica's replay from its base requires. A
//!   record whose data is an operation ([`crate::op`]) and that declares the whole chunk
//!   takes or deletes a snapshot instead (PolarFS section 7.2); an operation declaring
//!   anything else is refused (it would not be ordered against every write).
//! - **Checkpoint**: [`ChunkStore::checkpoint`] (the data synced, then the block maps);
//!   the group compacts its log below it, so the log stays bounded.
//! - **Images**: the whole chunk, snapshots included ([`crate::image::Image`]); a
//!   follower that lacks only a few compacted slots gets the sectors they wrote
//!   ([`crate::image::Part`]).
//!
//! **Partial images and snapshots.** A partial image carries current sectors only, never
//! a snapshot, so it must not stand in for an operation record:
//! - An operation among the slots the follower lacks declares the whole chunk, so the
//!   scope then covers every sector: [`OooStateMachine::image_part`] returns `None`
//!   then, and the leader sends a whole image, which carries the snapshots.
//! - An operation the leader applied *after* the image's base (between reading its
//!   applied head and reading the sectors, which happen at different times) would be
//!   applied by the follower after installing sectors that already hold later writes:
//!   its snapshot would hold them too. So the partial image carries how many snapshot
//!   ids the leader had seen ([`ChunkStore::snapshot_ids_seen`], read after the
//!   sectors), and the follower refuses it when that is more than its own: at the base
//!   the two agree (no operation lies between what the follower applied and the base,
//!   by the first point), and only an operation taking a new id changes what the
//!   follower would copy. Refused, the image is sent again, and the new scope, reaching
//!   past that operation, gets a whole image.
//!
//! A write past the chunk's end cannot be applied, and an apply error stops the group's
//! replica on this node: whoever appends to a chunk's group must split I/O at chunk
//! boundaries first (the volume layer does).

use std::collections::VecDeque;
use std::io;
use std::path::Path;
use std::sync::{Arc, Mutex};

use chorus_core::ooo::group::Record;
use chorus_core::ooo::parallel::BlockRange;
use chorus_core::ooo::replica::{Declared, Footprint};
use chorus_runtime::ooo::OooStateMachine;
use chorus_storage::fs::FileSystem;

use crate::image::{self, Part};
use crate::op::{decode_op, scrub_range, whole_chunk, ChunkOp, SCRUB_PIECE};
use crate::{ChunkError, ChunkStore, Geometry, SECTOR};

/// A chunk replica applied from its group's log. See the module docs.
#[derive(Debug)]
pub struct ChunkStateMachine {
    store: ChunkStore,
    /// The last [`SCRUBS_KEPT`] scrub points applied here, oldest first (memory only: a
    /// restarted replica replays the ones above its checkpoint, and the control plane
    /// asks again for any it cannot find).
    scrubs: Mutex<VecDeque<ScrubResult>>,
    /// Scrub points at slots below this are replays after a restart
    /// ([`OooStateMachine::replaying_below`]): the store may hold in-place writes of later
    /// slots then (the module docs of [`crate::store`]), so their checksums would not be
    /// of the point's state, and they are not kept (the control plane, finding no result,
    /// does not judge this replica on them). 0 until told.
    replay_end: std::sync::atomic::AtomicU64,
}

/// Scrub results kept per replica.
const SCRUBS_KEPT: usize = 64;

/// What a replica found at a scrub point: the CRC32C of each piece checked, in the
/// order of its pieces, computed when the scrub record was applied (PolarFS section 7.3).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScrubResult {
    /// The scrub record's id.
    pub id: u64,
    /// The first piece checked ([`crate::op::SCRUB_PIECE`] bytes each).
    pub first: u64,
    /// One checksum per piece, from `first` on.
    pub crcs: Vec<u32>,
}

fn invalid(detail: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, detail)
}

/// Whether `ranges` cover every sector of a chunk of `sectors` sectors.
fn covers(ranges: &[BlockRange], sectors: u64) -> bool {
    let mut sorted = ranges.to_vec();
    sorted.sort_by_key(|r| r.start);
    let mut reach = 0u64;
    for r in sorted {
        if r.start > reach {
            break;
        }
        reach = reach.max(r.end);
    }
    reach >= sectors
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
            scrubs: Mutex::new(VecDeque::new()),
            replay_end: 0.into(),
        })
    }

    /// The chunk's store, for reads.
    pub fn store(&self) -> &ChunkStore {
        &self.store
    }

    /// What this replica found at scrub point `id`, if it applied it (and it is among
    /// the last ones kept).
    pub fn scrub_result(&self, id: u64) -> Option<ScrubResult> {
        let scrubs = self.scrubs.lock().unwrap_or_else(|p| p.into_inner());
        scrubs.iter().rev().find(|r| r.id == id).cloned()
    }

    /// Checksums pieces `first..first + count` as they are now, and keeps the result.
    fn scrub(&self, id: u64, first: u64, count: u64) -> Result<(), ChunkError> {
        let chunk_bytes = self.store.geometry().chunk_bytes;
        let mut crcs = Vec::with_capacity(count as usize);
        for p in first..first + count {
            let at = p * SCRUB_PIECE;
            let len = SCRUB_PIECE.min(chunk_bytes - at);
            crcs.push(crc32c::crc32c(&self.store.read(at, len as usize)?));
        }
        let mut scrubs = self.scrubs.lock().unwrap_or_else(|p| p.into_inner());
        if scrubs.len() == SCRUBS_KEPT {
            scrubs.pop_front();
        }
        scrubs.push_back(ScrubResult { id, first, crcs });
        Ok(())
    }
}

impl OooStateMachine for ChunkStateMachine {
    fn apply(&self, slot: u64, records: &[(u32, Record)]) -> io::Result<()> {
        for (i, rec) in records {
            let Declared::Blocks(ranges) = &rec.declared else {
                return Err(invalid(format!(
                    "chunk: slot {slot} record {i} declares keys, not sectors"
                )));
            };
            if let Some(op) = decode_op(&rec.data) {
                let op = op.map_err(to_io)?;
                if let ChunkOp::Scrub(id) = op {
                    if slot < self.replay_end.load(std::sync::atomic::Ordering::Relaxed) {
                        // A replay: the pieces may hold later slots' writes already.
                        continue;
                    }
                    let Some((first, count)) = scrub_range(self.store.geometry(), ranges) else {
                        return Err(invalid(format!(
                            "chunk: slot {slot} record {i}: scrub {id} declares {ranges:?}, not \
                             one range of whole {SCRUB_PIECE}-byte pieces"
                        )));
                    };
                    self.scrub(id, first, count).map_err(to_io)?;
                    continue;
                }
                let whole = whole_chunk(self.store.geometry());
                if ranges.as_slice() != [whole] {
                    return Err(invalid(format!(
                        "chunk: slot {slot} record {i}: {op:?} declares {ranges:?}, not the \
                         whole chunk {whole:?} (it would not be ordered against every write)"
                    )));
                }
                match op {
                    ChunkOp::Snapshot(id) => self.store.snapshot(id),
                    ChunkOp::DeleteSnapshot(id) => self.store.delete_snapshot(id),
                    // Applied above; nothing reaches here.
                    ChunkOp::Scrub(_) => Ok(false),
                }
                .map_err(to_io)?;
                continue;
            }
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

    fn replaying_below(&self, end: u64) {
        self.replay_end
            .store(end, std::sync::atomic::Ordering::Relaxed);
    }

    fn checkpoint_cost(&self) -> u64 {
        self.store.checkpoint_bytes()
    }

    fn image(&self) -> io::Result<Vec<u8>> {
        let image = self.store.image().map_err(to_io)?;
        Ok(image::encode(self.store.geometry(), &image))
    }

    fn restore(&self, bytes: &[u8]) -> io::Result<()> {
        let image = image::decode(self.store.geometry(), bytes).map_err(to_io)?;
        self.store.replace(&image).map_err(to_io)
    }

    /// `None` (a whole image) when `scope` covers every sector of the chunk: an operation
    /// record among the slots it stands for declares the whole chunk, and a partial image
    /// would not carry its snapshot (see the module docs).
    fn image_part(&self, scope: &Footprint) -> io::Result<Option<Vec<u8>>> {
        if !scope.keys.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "partial chunk image: asked for keys",
            ));
        }
        let sectors = self.store.geometry().sectors();
        if covers(&scope.blocks, sectors) {
            return Ok(None);
        }
        let mut part = Part {
            ids_seen: 0,
            ranges: Vec::with_capacity(scope.blocks.len()),
            data: Vec::new(),
        };
        for r in &scope.blocks {
            if r.start >= r.end || r.end > sectors {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("partial chunk image: sectors {r:?} outside the chunk's {sectors}"),
                ));
            }
            let (offset, len) = (r.start * SECTOR, (r.end - r.start) * SECTOR);
            part.data
                .extend(self.store.read(offset, len as usize).map_err(to_io)?);
            part.ranges.push((r.start, r.end));
        }
        // Read after the sectors: an operation applied before any of them was read (and
        // so before any later write they hold) is counted.
        part.ids_seen = self.store.snapshot_ids_seen();
        Ok(Some(image::encode_part(self.store.geometry(), &part)))
    }

    fn restore_part(&self, bytes: &[u8]) -> io::Result<()> {
        let part = image::decode_part(self.store.geometry(), bytes).map_err(to_io)?;
        let seen = self.store.snapshot_ids_seen();
        if part.ids_seen > seen {
            return Err(invalid(format!(
                "partial chunk image: the leader had seen {} snapshot ids, this replica {seen}: \
                 it took a snapshot past the image's base, and its sectors may hold writes \
                 made after it; a whole image is needed",
                part.ids_seen
            )));
        }
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
