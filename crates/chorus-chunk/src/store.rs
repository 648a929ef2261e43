//! [`ChunkStore`]: one replica's copy of a chunk on disk.
//!
//! PolarFS section 4: a chunk server stores each chunk replica's blocks on its devices,
//! allocating them on demand (thin provisioning: a volume of 10 GiB chunks takes the
//! space its writes used, 64 KiB at a time). Here a chunk replica is a directory:
//!
//! - `chunk.{generation:016x}.data`: the allocated blocks, one per *slot*, slot `s` at
//!   byte `s × block_bytes`. Slots are handed out in order as blocks are first written,
//!   so the file is as long as the blocks written need.
//! - `chunk.map` ([`crate::map`]): block → slot as of the last checkpoint, and the data
//!   file's generation.
//!
//! A block never written has no slot and reads as zeros. Writes go in place
//! (`pwrite` at the block's slot), not synced: the chunk's group log (its WAL, PolarFS
//! section 4) holds them until a checkpoint ([`ChunkStore::checkpoint`]: sync the data,
//! then write the map crash-atomically) lets the log go. After a crash the store opens
//! to its last checkpoint's map; the replica replays the log above its base, whose
//! writes are blind (whole sectors), so anything written in place since (whole, torn or
//! lost) is written again. A block first allocated after the checkpoint is allocated
//! again by that replay, to a slot at or past the map's count, and its first write
//! writes the whole block (zeros around the sectors written), so no stale bytes of a
//! slot used before the crash are ever read.
//!
//! The store works through `chorus_storage`'s [`FileSystem`] seam, so its tests run it
//! on the simulator's file system, whose power loss keeps only what was synced (and of
//! the rest, any subset of writes, whole or torn): `tests/store.rs` checks against a
//! model that a crash and the replay of the writes since the last checkpoint always
//! give back exactly what was written (and fails when the checkpoint skips its data
//! sync).

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use chorus_storage::fs::{FileSystem, FsFile, OpenOptions};

use crate::map::MapFile;
use crate::{ChunkError, Geometry, SECTOR};

/// The block map file's name.
pub const MAP_FILE: &str = "chunk.map";

/// No slot: the block was never written.
const NONE: u32 = u32::MAX;

/// One chunk replica's blocks and block map. Thread-safe: writes to different sectors
/// run side by side (the apply rules never run two writes of one sector at once).
#[derive(Debug)]
pub struct ChunkStore {
    dir: PathBuf,
    geometry: Geometry,
    /// Where the files are: the real file system, or the simulator's (which loses what
    /// was not synced when it crashes).
    fs: Arc<dyn FileSystem>,
    inner: RwLock<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// The data file of generation `generation`.
    data: Arc<dyn FsFile>,
    /// Invariant: the generation `chunk.map` names, or the one a restore is writing.
    generation: u64,
    /// Block → slot, [`NONE`] for a block never written. Invariant: the slots in use are
    /// exactly `0..allocated`, each used by one block; `slots.len()` is the chunk's block
    /// count.
    slots: Vec<u32>,
    /// Blocks with a slot.
    allocated: u32,
}

fn io_err(what: impl Into<String>, path: &Path) -> impl FnOnce(std::io::Error) -> ChunkError {
    let what = what.into();
    let path = path.to_path_buf();
    move |source| ChunkError::Io { what, path, source }
}

fn data_name(generation: u64) -> String {
    format!("chunk.{generation:016x}.data")
}

/// Writes `bytes` to `dir/name` crash-atomically: a temporary file, synced, renamed
/// over `name`, the directory synced.
fn write_atomically(
    fs: &dyn FileSystem,
    dir: &Path,
    name: &str,
    bytes: &[u8],
) -> Result<(), ChunkError> {
    let tmp = dir.join(format!("{name}.tmp"));
    let path = dir.join(name);
    let f = fs
        .open(&tmp, OpenOptions::create())
        .map_err(io_err("create", &tmp))?;
    f.set_len(0)
        .and_then(|_| f.write_all_at(bytes, 0))
        .map_err(io_err("write", &tmp))?;
    f.sync_data().map_err(io_err("fdatasync", &tmp))?;
    fs.rename(&tmp, &path)
        .map_err(io_err("rename into place", &path))?;
    fs.sync_dir(dir).map_err(io_err("fsync the directory", dir))
}

/// Reads the whole file `path`.
fn read_file(fs: &dyn FileSystem, path: &Path) -> std::io::Result<Vec<u8>> {
    let f = fs.open(path, OpenOptions::read_only())?;
    let mut buf = vec![0u8; f.len()? as usize];
    f.read_exact_at(&mut buf, 0)?;
    Ok(buf)
}

impl ChunkStore {
    /// Opens the chunk replica in `dir`, or creates it (empty: every block reads as
    /// zeros) when `dir` holds no block map. An existing chunk must have `geometry`
    /// ([`ChunkError::GeometryMismatch`] otherwise).
    pub fn open(
        fs: Arc<dyn FileSystem>,
        dir: &Path,
        geometry: Geometry,
    ) -> Result<Self, ChunkError> {
        geometry.check()?;
        fs.create_dir_all(dir)
            .map_err(io_err("create the directory", dir))?;
        let map_path = dir.join(MAP_FILE);
        let map = match read_file(&*fs, &map_path) {
            Ok(bytes) => MapFile::decode(&map_path.display().to_string(), &bytes)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let fresh = MapFile {
                    geometry,
                    generation: 0,
                    entries: Vec::new(),
                };
                let data = dir.join(data_name(0));
                fs.open(&data, OpenOptions::create())
                    .and_then(|f| f.set_len(0).and_then(|_| f.sync_data()))
                    .map_err(io_err("create", &data))?;
                write_atomically(&*fs, dir, MAP_FILE, &fresh.encode())?;
                fresh
            }
            Err(e) => return Err(io_err("read", &map_path)(e)),
        };
        if map.geometry != geometry {
            return Err(ChunkError::GeometryMismatch {
                dir: dir.to_path_buf(),
                stored: map.geometry,
                asked: geometry,
            });
        }
        let data_path = dir.join(data_name(map.generation));
        let data: Arc<dyn FsFile> = fs
            .open(&data_path, OpenOptions::read_write())
            .map_err(io_err("open", &data_path))?
            .into();
        let mut slots = vec![NONE; geometry.blocks() as usize];
        for &(b, s) in &map.entries {
            slots[b as usize] = s;
        }
        // Leftovers of an interrupted restore or of older generations.
        remove_other_data_files(&*fs, dir, map.generation);
        Ok(Self {
            dir: dir.to_path_buf(),
            geometry,
            fs,
            inner: RwLock::new(Inner {
                data,
                generation: map.generation,
                slots,
                allocated: map.entries.len() as u32,
            }),
        })
    }

    /// The chunk's geometry.
    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// Blocks that hold data (allocated on first write).
    pub fn allocated_blocks(&self) -> u32 {
        self.inner.read().expect("chunk").allocated
    }

    /// Whether `block` has a slot (was ever written, or is in an installed image).
    pub fn is_allocated(&self, block: u32) -> bool {
        self.inner
            .read()
            .expect("chunk")
            .slots
            .get(block as usize)
            .is_some_and(|s| *s != NONE)
    }

    /// The path of the data file in use: its length and the disk it takes show what
    /// thin provisioning saves.
    pub fn data_path(&self) -> PathBuf {
        let g = self.inner.read().expect("chunk").generation;
        self.dir.join(data_name(g))
    }

    /// Checks that `len` bytes at `offset` lie in the chunk.
    fn check_range(&self, offset: u64, len: u64) -> Result<(), ChunkError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.geometry.chunk_bytes => Ok(()),
            _ => Err(ChunkError::OutOfRange {
                offset,
                len,
                chunk_bytes: self.geometry.chunk_bytes,
            }),
        }
    }

    /// Writes whole sectors: `data` at `offset`, both multiples of [`SECTOR`]. Not
    /// durable until [`ChunkStore::checkpoint`] (the chunk's log holds the write until
    /// then). A block written for the first time gets the next slot, and the whole
    /// block is written (zeros around `data`).
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<(), ChunkError> {
        let len = data.len() as u64;
        if !offset.is_multiple_of(SECTOR) || !len.is_multiple_of(SECTOR) {
            return Err(ChunkError::Unaligned {
                offset,
                len,
                sector: SECTOR,
            });
        }
        self.check_range(offset, len)?;
        let bb = self.geometry.block_bytes as u64;
        let mut at = 0u64;
        while at < len {
            let pos = offset + at;
            let block = (pos / bb) as u32;
            let inside = pos % bb;
            let n = (bb - inside).min(len - at);
            let piece = &data[at as usize..(at + n) as usize];
            self.write_in_block(block, inside, piece)?;
            at += n;
        }
        Ok(())
    }

    fn write_in_block(&self, block: u32, inside: u64, piece: &[u8]) -> Result<(), ChunkError> {
        let bb = self.geometry.block_bytes as u64;
        {
            let inner = self.inner.read().expect("chunk");
            let slot = inner.slots[block as usize];
            if slot != NONE {
                let path = self.dir.join(data_name(inner.generation));
                return inner
                    .data
                    .write_all_at(piece, slot as u64 * bb + inside)
                    .map_err(io_err(format!("write block {block}"), &path));
            }
        }
        let mut inner = self.inner.write().expect("chunk");
        let path = self.dir.join(data_name(inner.generation));
        let mut slot = inner.slots[block as usize];
        if slot == NONE {
            // First write of the block: the whole block, so that the slot holds nothing
            // from before (a slot allocated before a crash and lost with it).
            slot = inner.allocated;
            let mut whole = vec![0u8; bb as usize];
            whole[inside as usize..inside as usize + piece.len()].copy_from_slice(piece);
            inner
                .data
                .write_all_at(&whole, slot as u64 * bb)
                .map_err(io_err(format!("write block {block}"), &path))?;
            inner.slots[block as usize] = slot;
            inner.allocated += 1;
            return Ok(());
        }
        inner
            .data
            .write_all_at(piece, slot as u64 * bb + inside)
            .map_err(io_err(format!("write block {block}"), &path))
    }

    /// Reads `len` bytes at any `offset` in the chunk; blocks never written read as
    /// zeros.
    pub fn read(&self, offset: u64, len: usize) -> Result<Vec<u8>, ChunkError> {
        self.check_range(offset, len as u64)?;
        let bb = self.geometry.block_bytes as u64;
        let mut out = vec![0u8; len];
        let inner = self.inner.read().expect("chunk");
        let path = self.dir.join(data_name(inner.generation));
        let mut at = 0u64;
        while at < len as u64 {
            let pos = offset + at;
            let block = pos / bb;
            let inside = pos % bb;
            let n = (bb - inside).min(len as u64 - at);
            let slot = inner.slots[block as usize];
            if slot != NONE {
                inner
                    .data
                    .read_exact_at(
                        &mut out[at as usize..(at + n) as usize],
                        slot as u64 * bb + inside,
                    )
                    .map_err(io_err(format!("read block {block}"), &path))?;
            }
            at += n;
        }
        Ok(out)
    }

    /// The block map as it is now, ascending by block.
    fn entries(inner: &Inner) -> Vec<(u32, u32)> {
        inner
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| **s != NONE)
            .map(|(b, s)| (b as u32, *s))
            .collect()
    }

    /// Makes every write that returned before the call durable: syncs the data file,
    /// then writes the block map crash-atomically. Writes running meanwhile may or may
    /// not be in it (the caller's log still holds them).
    pub fn checkpoint(&self) -> Result<(), ChunkError> {
        let (data, map) = {
            let inner = self.inner.read().expect("chunk");
            let map = MapFile {
                geometry: self.geometry,
                generation: inner.generation,
                entries: Self::entries(&inner),
            };
            (inner.data.clone(), map)
        };
        // Data first: the map must never name a slot whose bytes are not durable.
        let path = self.dir.join(data_name(map.generation));
        data.sync_data().map_err(io_err("fdatasync", &path))?;
        write_atomically(&*self.fs, &self.dir, MAP_FILE, &map.encode())
    }

    /// Bytes a checkpoint writes beyond the data's sync: the block map.
    pub fn checkpoint_bytes(&self) -> u64 {
        (crate::map::MAP_HEADER + 4) as u64 + 8 * self.allocated_blocks() as u64
    }

    /// Every allocated block and its bytes, ascending by block (for an image).
    pub fn blocks(&self) -> Result<Vec<(u32, Vec<u8>)>, ChunkError> {
        let bb = self.geometry.block_bytes as u64;
        let inner = self.inner.read().expect("chunk");
        let path = self.dir.join(data_name(inner.generation));
        let mut out = Vec::with_capacity(inner.allocated as usize);
        for (b, s) in Self::entries(&inner) {
            let mut buf = vec![0u8; bb as usize];
            inner
                .data
                .read_exact_at(&mut buf, s as u64 * bb)
                .map_err(io_err(format!("read block {b}"), &path))?;
            out.push((b, buf));
        }
        Ok(out)
    }

    /// Replaces the whole chunk with `blocks` (each a block index and its full bytes),
    /// durably: a new data file is written and synced, then a block map naming it
    /// replaces the old one in one rename; the old data file goes after. A crash at any
    /// point opens either the old chunk or the new one, whole.
    pub fn replace(&self, blocks: &[(u32, Vec<u8>)]) -> Result<(), ChunkError> {
        let bb = self.geometry.block_bytes as usize;
        let nblocks = self.geometry.blocks();
        let mut seen = std::collections::HashSet::with_capacity(blocks.len());
        for (b, bytes) in blocks {
            if *b >= nblocks || bytes.len() != bb || !seen.insert(*b) {
                return Err(ChunkError::Corrupt {
                    what: "chunk contents to install".into(),
                    detail: format!(
                        "block {b} of {} bytes (the chunk has {nblocks} blocks of {bb} bytes; each once)",
                        bytes.len()
                    ),
                });
            }
        }
        let mut inner = self.inner.write().expect("chunk");
        let generation = inner.generation + 1;
        let path = self.dir.join(data_name(generation));
        let data: Arc<dyn FsFile> = self
            .fs
            .open(&path, OpenOptions::create())
            .and_then(|f| f.set_len(0).map(|_| f))
            .map_err(io_err("create", &path))?
            .into();
        let mut sorted: Vec<&(u32, Vec<u8>)> = blocks.iter().collect();
        sorted.sort_by_key(|(b, _)| *b);
        let mut slots = vec![NONE; nblocks as usize];
        for (slot, (b, bytes)) in sorted.iter().enumerate() {
            data.write_all_at(bytes, slot as u64 * bb as u64)
                .map_err(io_err(format!("write block {b}"), &path))?;
            slots[*b as usize] = slot as u32;
        }
        data.sync_data().map_err(io_err("fdatasync", &path))?;
        let map = MapFile {
            geometry: self.geometry,
            generation,
            entries: sorted
                .iter()
                .enumerate()
                .map(|(s, (b, _))| (*b, s as u32))
                .collect(),
        };
        write_atomically(&*self.fs, &self.dir, MAP_FILE, &map.encode())?;
        *inner = Inner {
            data,
            generation,
            slots,
            allocated: sorted.len() as u32,
        };
        drop(inner);
        remove_other_data_files(&*self.fs, &self.dir, generation);
        Ok(())
    }
}

/// Removes data files of other generations than `keep` (best effort: a leftover costs
/// space, not correctness, and is removed at the next open).
fn remove_other_data_files(fs: &dyn FileSystem, dir: &Path, keep: u64) {
    let Ok(names) = fs.list_dir(dir) else {
        return;
    };
    let keep = data_name(keep);
    let mut removed = false;
    for name in names {
        if name.starts_with("chunk.") && name.ends_with(".data") && name != keep {
            removed |= fs.remove_file(&dir.join(&name)).is_ok();
        }
    }
    if removed {
        let _ = fs.sync_dir(dir);
    }
}
