//! [`ChunkStore`]: one replica's copy of a chunk on disk.
//!
//! PolarFS section 4: a chunk server stores each chunk replica's blocks on its devices,
//! allocating them on demand (thin provisioning: a volume of 10 GiB chunks takes the
//! space its writes used, 64 KiB at a time). Here a chunk replica is a directory:
//!
//! - `chunk.{generation:016x}.data`: the blocks, one per *slot*, slot `s` at byte
//!   `s × block_bytes`. A block gets a slot on its first write.
//! - `chunk.map` ([`crate::map`]): as of the last checkpoint, block → slot for the
//!   chunk's current contents and for each of its snapshots, the slot count, and the
//!   data file's generation.
//!
//! A block never written has no slot and reads as zeros. Writes go in place
//! (`pwrite` at the block's slot), not synced: the chunk's group log (its WAL, PolarFS
//! section 4) holds them until a checkpoint ([`ChunkStore::checkpoint`]: sync the data,
//! then write the map crash-atomically) lets the log go.
//!
//! **Snapshots** (PolarFS section 7.2: "ChunkServer makes a snapshot by copying block
//! mapping meta information, which is fast, and handles the future requests which will
//! modify those blocks in a Copy-on-Write way"). [`ChunkStore::snapshot`] copies the
//! current map; from then on the slots it names are *frozen*: a write to a block whose
//! slot is frozen takes a new slot, writes the whole block there (the old bytes with the
//! new sectors over them) and points the current map at it. Writes to slots no snapshot
//! names still go in place. Slots are no longer handed out in order: deleting a snapshot
//! frees the slots no other map names, and new blocks take free slots first (lowest
//! first), else the next one past the end.
//!
//! **Crash argument.** After a crash the store opens to its last checkpoint's maps
//! (current and snapshots), and the replica replays the log above its base — every
//! record above the checkpoint's point, some of them possibly in the maps already —
//! re-applying writes (blind, whole sectors) and operations ([`crate::op`]) in order.
//! That gives back exactly the state before the crash because:
//!
//! 1. *The slots the durable map names hold what it says, and stay so.* The data is
//!    synced before the map is written. After that, a slot the durable map names is
//!    changed only by in-place writes of records above the checkpoint (which the replay
//!    writes again): frozen slots are never written in place, and a slot freed since is
//!    not reused until a checkpoint has durably written a map that no longer names it
//!    (freed slots wait in a pending list; a checkpoint takes that list when it copies
//!    the maps, and frees those slots once its map is durable). Were one reused at once,
//!    the older durable map would name a slot holding another block's bytes, and the
//!    replay's copy-on-write would copy them (`tests/snapshots.rs` checks this).
//! 2. *No slot's stale bytes are read.* A slot a block newly takes — a first write, a
//!    copy-on-write, or during the replay — is written whole.
//! 3. *Snapshots come back as they were taken.* One the durable map holds has its frozen
//!    slots, unchanged by 1, and the replay's operation taking it again does nothing.
//!    One taken after the maps were copied is taken again by the replay, from the
//!    current map at that point of the log: there every sector a record above the base
//!    wrote before it has been written again, and every other sector holds what the
//!    durable map holds — unless a write after the checkpoint changed it in place. That
//!    write comes later in the log, and could be in place only because no snapshot named
//!    the slot any more; the slot was the block's current one all along (the current map
//!    only ever moves off a slot), so the snapshot named it, and was deleted before the
//!    write: the replay deletes it too. (Nothing copies from a snapshot, so a snapshot's
//!    bytes never reach another map.)
//! 4. *An id is taken at most once* ([`ChunkStore::snapshot`]): the maps remember deleted
//!    ids. Otherwise a log running "delete X, take X, write" above the checkpoint, with
//!    all three in the durable map, would replay "take X" after "delete X" onto a current
//!    map that already holds the write.
//! 5. The current map ends as written: each sector's last write in the log is replayed
//!    last, and copies-on-write carry every sector along.
//!
//! Slots free after the restart are derived from the durable map: those below its slot
//! count that it does not name (the pending ones whose delete it already holds among
//! them).
//!
//! The store works through `chorus_storage`'s [`FileSystem`] seam, so its tests run it
//! on the simulator's file system, whose power loss keeps only what was synced (and of
//! the rest, any subset of writes, whole or torn): `tests/store.rs` and
//! `tests/snapshots.rs` check against a model that a crash and the replay of the writes
//! and operations since the last checkpoint always give back exactly what was written,
//! current and snapshots (and fail when the checkpoint skips its data sync, or when a
//! freed slot is reused before a checkpoint).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use chorus_storage::fs::{FileSystem, FsFile, OpenOptions};

use crate::image::Image;
use crate::map::{MapFile, SnapshotMap};
use crate::slots::Slots;
use crate::{ChunkError, Geometry, SECTOR};

/// The block map file's name.
pub const MAP_FILE: &str = "chunk.map";

/// One chunk replica's blocks, block maps and snapshots. Thread-safe: writes to
/// different sectors run side by side (the apply rules never run two writes of one
/// sector at once, nor a snapshot operation beside any write).
#[derive(Debug)]
pub struct ChunkStore {
    /// The chunk's directory.
    dir: PathBuf,
    /// Invariant: checked ([`Geometry::check`]), and the one `chunk.map` holds.
    geometry: Geometry,
    /// Where the files are: the real file system, or the simulator's (which loses what
    /// was not synced when it crashes).
    fs: Arc<dyn FileSystem>,
    /// One checkpoint or install at a time: each writes `chunk.map` through the same
    /// temporary file, and a checkpoint's map must never replace a newer one. Taken
    /// before `inner`.
    map_writer: Mutex<()>,
    /// Block locks, by block number modulo their count: a write into a block holds its
    /// stripe exclusively, a read holds the stripes of the blocks it covers shared, so a
    /// read never sees a block half written (an in-place write runs under `inner`'s
    /// shared lock, beside reads). Taken before `inner`; a write holds one at a time, a
    /// read takes its stripes in ascending order.
    stripes: Box<[RwLock<()>]>,
    inner: RwLock<Inner>,
}

/// Block lock stripes per chunk.
const STRIPES: usize = 64;

#[derive(Debug)]
struct Inner {
    /// The data file of generation `generation`.
    data: Arc<dyn FsFile>,
    /// Invariant: the generation `chunk.map` names, or the one a restore is writing.
    generation: u64,
    /// The maps and the slots' states. Invariant: every slot a map names lies in the
    /// data file and holds that block's bytes (whole: a new slot is written whole).
    slots: Slots,
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
    /// ([`ChunkError::GeometryMismatch`] otherwise); its map may be of version 1 or 2.
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
                    slot_count: 0,
                    entries: Vec::new(),
                    snapshots: Vec::new(),
                    deleted: Vec::new(),
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
        let file_slots =
            data.len().map_err(io_err("stat", &data_path))? / geometry.block_bytes as u64;
        // Every slot a map names was synced before the map was written, so it lies in
        // the file; slots counted past the file's end (none, unless it was cut) are as
        // good as past the end, and counting them would only take memory.
        let named = map
            .entries
            .iter()
            .chain(map.snapshots.iter().flat_map(|s| s.entries.iter()))
            .map(|(_, s)| *s)
            .max();
        if let Some(s) = named.filter(|s| *s as u64 >= file_slots) {
            return Err(ChunkError::Corrupt {
                what: data_path.display().to_string(),
                detail: format!(
                    "the block map names slot {s}, the data file holds {file_slots} slots"
                ),
            });
        }
        let slot_count = map
            .slot_count
            .min(u32::try_from(file_slots).unwrap_or(u32::MAX));
        let slots = Slots::from_maps(
            geometry,
            slot_count,
            &map.entries,
            &map.snapshots,
            &map.deleted,
        );
        // Leftovers of an interrupted restore or of older generations.
        remove_other_data_files(&*fs, dir, map.generation);
        Ok(Self {
            dir: dir.to_path_buf(),
            geometry,
            fs,
            map_writer: Mutex::new(()),
            stripes: (0..STRIPES).map(|_| RwLock::new(())).collect(),
            inner: RwLock::new(Inner {
                data,
                generation: map.generation,
                slots,
            }),
        })
    }

    /// The chunk's geometry.
    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// Blocks the current map holds data for (allocated on first write).
    pub fn allocated_blocks(&self) -> u32 {
        self.inner.read().expect("chunk").slots.allocated()
    }

    /// Slots of the data file some map (current or snapshot) names: the space the chunk
    /// takes, a slot the current map shares with snapshots counted once.
    pub fn slots_in_use(&self) -> u32 {
        self.inner.read().expect("chunk").slots.in_use()
    }

    /// Slots of the data file: in use, or free to be reused (now, or after the next
    /// checkpoint). The data file is at least this many blocks long.
    pub fn data_slots(&self) -> u32 {
        self.inner.read().expect("chunk").slots.slot_count()
    }

    /// Whether `block` has a slot in the current map (was ever written, or is in an
    /// installed image).
    pub fn is_allocated(&self, block: u32) -> bool {
        self.inner
            .read()
            .expect("chunk")
            .slots
            .current(block)
            .is_some()
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
    /// then). A block without a slot, or whose slot a snapshot shares (copy-on-write,
    /// PolarFS section 7.2), gets a new slot, and the whole block is written there (zeros,
    /// or the block's old bytes, around `data`); otherwise the sectors go in place.
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
        let _stripe = self.stripes[block as usize % STRIPES]
            .write()
            .expect("chunk block lock");
        let bb = self.geometry.block_bytes as u64;
        let in_place = |inner: &Inner, slot: u32| {
            let path = self.dir.join(data_name(inner.generation));
            inner
                .data
                .write_all_at(piece, slot as u64 * bb + inside)
                .map_err(io_err(format!("write block {block}"), &path))
        };
        {
            let inner = self.inner.read().expect("chunk");
            if let Some(slot) = inner.slots.current(block) {
                if !inner.slots.is_frozen(slot) {
                    return in_place(&inner, slot);
                }
            }
        }
        let mut inner = self.inner.write().expect("chunk");
        // Looked at again: another write to the block may have given it a slot, or
        // copied it, meanwhile.
        let old = inner.slots.current(block);
        if let Some(slot) = old.filter(|s| !inner.slots.is_frozen(*s)) {
            return in_place(&inner, slot);
        }
        let path = self.dir.join(data_name(inner.generation));
        // A new slot, written whole so that it holds nothing from before: a slot lost in
        // a crash, or freed by a deleted snapshot, may hold another block's bytes.
        let mut whole = vec![0u8; bb as usize];
        if let Some(frozen) = old.filter(|_| piece.len() as u64 != bb) {
            // Copy-on-write (PolarFS section 7.2): the snapshots keep the frozen slot.
            inner
                .data
                .read_exact_at(&mut whole, frozen as u64 * bb)
                .map_err(io_err(format!("read block {block} to copy it"), &path))?;
        }
        whole[inside as usize..inside as usize + piece.len()].copy_from_slice(piece);
        let slot = inner.slots.next_slot().ok_or_else(|| ChunkError::Io {
            what: format!("find a slot for block {block}"),
            path: path.clone(),
            source: std::io::Error::other("every slot number of the data file is taken"),
        })?;
        inner
            .data
            .write_all_at(&whole, slot as u64 * bb)
            .map_err(io_err(format!("write block {block}"), &path))?;
        inner.slots.place(block, slot);
        Ok(())
    }

    /// Reads `len` bytes at `offset` through `lookup` (block → slot).
    fn read_through(
        &self,
        inner: &Inner,
        lookup: impl Fn(u32) -> Option<u32>,
        offset: u64,
        len: usize,
    ) -> Result<Vec<u8>, ChunkError> {
        self.check_range(offset, len as u64)?;
        let bb = self.geometry.block_bytes as u64;
        let mut out = vec![0u8; len];
        let path = self.dir.join(data_name(inner.generation));
        let mut at = 0u64;
        while at < len as u64 {
            let pos = offset + at;
            let block = (pos / bb) as u32;
            let inside = pos % bb;
            let n = (bb - inside).min(len as u64 - at);
            if let Some(slot) = lookup(block) {
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

    /// The shared locks of the stripes of the blocks `offset..offset + len` covers, in
    /// ascending order.
    fn read_stripes(&self, offset: u64, len: u64) -> Vec<std::sync::RwLockReadGuard<'_, ()>> {
        let bb = self.geometry.block_bytes as u64;
        let (first, last) = (offset / bb, offset.saturating_add(len.max(1) - 1) / bb);
        let mut held: Vec<usize> = (first..=last.min(first + STRIPES as u64 - 1))
            .map(|b| b as usize % STRIPES)
            .collect();
        if last - first + 1 >= STRIPES as u64 {
            held = (0..STRIPES).collect();
        }
        held.sort_unstable();
        held.dedup();
        held.into_iter()
            .map(|i| self.stripes[i].read().expect("chunk block lock"))
            .collect()
    }

    /// Every stripe's shared lock, in order: no block is half written while they are
    /// held.
    fn all_stripes(&self) -> Vec<std::sync::RwLockReadGuard<'_, ()>> {
        self.stripes
            .iter()
            .map(|l| l.read().expect("chunk block lock"))
            .collect()
    }

    /// Reads `len` bytes at any `offset` in the chunk; blocks never written read as
    /// zeros.
    pub fn read(&self, offset: u64, len: usize) -> Result<Vec<u8>, ChunkError> {
        let _stripes = self.read_stripes(offset, len as u64);
        let inner = self.inner.read().expect("chunk");
        self.read_through(&inner, |b| inner.slots.current(b), offset, len)
    }

    /// Reads `len` bytes at any `offset` of snapshot `id` (as the chunk was when the
    /// snapshot was taken); blocks it holds nothing for read as zeros.
    /// [`ChunkError::NoSnapshot`] when the chunk holds no such snapshot.
    pub fn read_snapshot(&self, id: u64, offset: u64, len: usize) -> Result<Vec<u8>, ChunkError> {
        let _stripes = self.read_stripes(offset, len as u64);
        let inner = self.inner.read().expect("chunk");
        if inner.slots.snapshot_map(id).is_none() {
            return Err(ChunkError::NoSnapshot { id });
        }
        self.read_through(
            &inner,
            |b| inner.slots.in_snapshot(id, b).flatten(),
            offset,
            len,
        )
    }

    /// Takes snapshot `id` of the chunk as it is now (PolarFS section 7.2): a copy of the
    /// current block map only — no data is copied; from now on a write to a block it
    /// shares copies the block first. Not durable until the next checkpoint (its
    /// operation record in the log is replayed until then).
    ///
    /// `Ok(false)`, nothing done, when the chunk holds snapshot `id` already (a replay of
    /// the log applies the operation again) or deleted it: an id is taken at most once,
    /// which keeps the replay after a crash exact (the module docs' point 4) and keeps a
    /// straggling take of a deleted snapshot from bringing it back.
    /// [`ChunkError::BadSnapshotId`] for id 0.
    pub fn snapshot(&self, id: u64) -> Result<bool, ChunkError> {
        if id == 0 {
            return Err(ChunkError::BadSnapshotId { id });
        }
        Ok(self.inner.write().expect("chunk").slots.snapshot(id))
    }

    /// Deletes snapshot `id`; `Ok(false)` when the chunk does not hold it. Either way the
    /// id is remembered as deleted and never taken again ([`ChunkStore::snapshot`]).
    /// The slots only it named are free for reuse once the next checkpoint has written a
    /// map that no longer names them (until then the last durable map may).
    pub fn delete_snapshot(&self, id: u64) -> Result<bool, ChunkError> {
        if id == 0 {
            return Ok(false);
        }
        Ok(self.inner.write().expect("chunk").slots.delete(id))
    }

    /// The snapshots the chunk holds, ascending by id.
    pub fn snapshots(&self) -> Vec<u64> {
        self.inner.read().expect("chunk").slots.snapshot_ids()
    }

    /// The ids of snapshots the chunk has deleted, ascending: taking one again does
    /// nothing ([`ChunkStore::snapshot`]), so a caller need not log the operation.
    pub fn deleted_snapshots(&self) -> Vec<u64> {
        self.inner.read().expect("chunk").slots.deleted_ids()
    }

    /// How many snapshot ids the chunk holds or has deleted. It only grows, one per
    /// operation that changed which ids are known (a partial image carries it:
    /// [`crate::sm`]).
    pub fn snapshot_ids_seen(&self) -> u64 {
        self.inner.read().expect("chunk").slots.ids_seen()
    }

    /// The blocks snapshot `id` holds data for, ascending (what a copy of it must copy).
    /// [`ChunkError::NoSnapshot`] when the chunk holds no such snapshot.
    pub fn snapshot_blocks(&self, id: u64) -> Result<Vec<u32>, ChunkError> {
        let inner = self.inner.read().expect("chunk");
        let map = inner
            .slots
            .snapshot_map(id)
            .ok_or(ChunkError::NoSnapshot { id })?;
        Ok(map.iter().map(|(b, _)| *b).collect())
    }

    /// Makes every write and snapshot operation that returned before the call durable:
    /// syncs the data file, then writes the block maps crash-atomically. Writes running
    /// meanwhile may or may not be in it (the caller's log still holds them). Slots freed
    /// before the call (by deleted snapshots) may be reused once it returns `Ok`.
    pub fn checkpoint(&self) -> Result<(), ChunkError> {
        let _one = self.map_writer.lock().expect("chunk map writer");
        let (data, map) = {
            let mut inner = self.inner.write().expect("chunk");
            let generation = inner.generation;
            let map = inner.slots.begin_checkpoint(self.geometry, generation);
            (inner.data.clone(), map)
        };
        // Data first: the map must never name a slot whose bytes are not durable.
        let path = self.dir.join(data_name(map.generation));
        let done = data
            .sync_data()
            .map_err(io_err("fdatasync", &path))
            .and_then(|_| write_atomically(&*self.fs, &self.dir, MAP_FILE, &map.encode()));
        // Only now may the slots the map no longer names be reused.
        self.inner
            .write()
            .expect("chunk")
            .slots
            .end_checkpoint(done.is_ok());
        done
    }

    /// Bytes a checkpoint writes beyond the data's sync: the block map file.
    pub fn checkpoint_bytes(&self) -> u64 {
        self.inner.read().expect("chunk").slots.map_bytes()
    }

    /// Every block the current map holds and its bytes, ascending by block.
    pub fn blocks(&self) -> Result<Vec<(u32, Vec<u8>)>, ChunkError> {
        let bb = self.geometry.block_bytes as u64;
        let _stripes = self.all_stripes();
        let inner = self.inner.read().expect("chunk");
        let path = self.dir.join(data_name(inner.generation));
        let entries = inner.slots.current_entries();
        let mut out = Vec::with_capacity(entries.len());
        for (b, s) in entries {
            let mut buf = vec![0u8; bb as usize];
            inner
                .data
                .read_exact_at(&mut buf, s as u64 * bb)
                .map_err(io_err(format!("read block {b}"), &path))?;
            out.push((b, buf));
        }
        Ok(out)
    }

    /// A whole image of the chunk ([`crate::image`]): the current map, every snapshot's
    /// map and the deleted ids, with the bytes of each slot they name once (a slot the
    /// current map shares with snapshots travels once).
    pub fn image(&self) -> Result<Image, ChunkError> {
        let bb = self.geometry.block_bytes as u64;
        let _stripes = self.all_stripes();
        let inner = self.inner.read().expect("chunk");
        let path = self.dir.join(data_name(inner.generation));
        // Data slot → image slot, in the order the maps first name them.
        let mut index: HashMap<u32, u32> = HashMap::new();
        let mut order: Vec<u32> = Vec::new();
        let mut renumber = |entries: &[(u32, u32)]| -> Vec<(u32, u32)> {
            entries
                .iter()
                .map(|&(b, s)| {
                    let i = *index.entry(s).or_insert_with(|| {
                        order.push(s);
                        order.len() as u32 - 1
                    });
                    (b, i)
                })
                .collect()
        };
        let current = renumber(&inner.slots.current_entries());
        let mut snapshots = Vec::new();
        for id in inner.slots.snapshot_ids() {
            let map = inner.slots.snapshot_map(id).unwrap_or_default();
            snapshots.push(SnapshotMap {
                id,
                entries: renumber(map),
            });
        }
        let mut data = Vec::with_capacity(order.len());
        for s in order {
            let mut buf = vec![0u8; bb as usize];
            inner
                .data
                .read_exact_at(&mut buf, s as u64 * bb)
                .map_err(io_err(format!("read slot {s}"), &path))?;
            data.push(buf);
        }
        Ok(Image {
            current,
            snapshots,
            deleted: inner.slots.deleted_ids(),
            data,
        })
    }

    /// Replaces the whole chunk — current blocks, snapshots, deleted ids — with `image`
    /// (checked: [`Image::check`]), durably: a new data file is written (image slot `i`
    /// in slot `i`) and synced, then a block map naming it replaces the old one in one
    /// rename; the old data file goes after. A crash at any point opens either the old
    /// chunk or the new one, whole.
    pub fn replace(&self, image: &Image) -> Result<(), ChunkError> {
        image.check(self.geometry)?;
        let bb = self.geometry.block_bytes as u64;
        let _one = self.map_writer.lock().expect("chunk map writer");
        let mut inner = self.inner.write().expect("chunk");
        let generation = inner.generation + 1;
        let path = self.dir.join(data_name(generation));
        let data: Arc<dyn FsFile> = self
            .fs
            .open(&path, OpenOptions::create())
            .and_then(|f| f.set_len(0).map(|_| f))
            .map_err(io_err("create", &path))?
            .into();
        for (slot, bytes) in image.data.iter().enumerate() {
            data.write_all_at(bytes, slot as u64 * bb)
                .map_err(io_err(format!("write slot {slot}"), &path))?;
        }
        data.sync_data().map_err(io_err("fdatasync", &path))?;
        let slot_count = image.data.len() as u32;
        let map = MapFile {
            geometry: self.geometry,
            generation,
            slot_count,
            entries: image.current.clone(),
            snapshots: image.snapshots.clone(),
            deleted: image.deleted.clone(),
        };
        write_atomically(&*self.fs, &self.dir, MAP_FILE, &map.encode())?;
        *inner = Inner {
            data,
            generation,
            slots: Slots::from_maps(
                self.geometry,
                slot_count,
                &image.current,
                &image.snapshots,
                &image.deleted,
            ),
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
