//! Chunk snapshots (PolarFS section 7.2): a snapshot copies the block map, and a block
//! it shares is copied before it is written (copy-on-write). Checked here: a snapshot
//! reads what the chunk held when it was taken while the chunk reads what was written
//! since, partial writes keep a copied block's other sectors, deleting a snapshot frees
//! its space for reuse only after a checkpoint, snapshots survive a restart and travel in
//! images; a randomized test against a model, one with crashes on the simulator's file
//! system (the log's replay above the checkpoint re-applying writes and operations), and
//! the slot-reuse hazard a freed slot reused before a checkpoint would cause.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use chorus_chunk::map::MapFile;
use chorus_chunk::{image, ChunkError, ChunkStore, Geometry, SECTOR};
use chorus_storage::fs::{CrashMode, FileSystem, RealFs, SimFs};
use proptest::prelude::*;

fn real() -> Arc<dyn FileSystem> {
    Arc::new(RealFs)
}

fn geo(chunk_bytes: u64, block_bytes: u32) -> Geometry {
    Geometry {
        chunk_bytes,
        block_bytes,
    }
}

fn sectors(n: u64, byte: u8) -> Vec<u8> {
    vec![byte; (n * SECTOR) as usize]
}

const BLOCK: u64 = 64 << 10;

#[test]
fn a_snapshot_reads_the_old_bytes_and_the_chunk_the_new() {
    let dir = tempfile::tempdir().unwrap();
    let s = ChunkStore::open(real(), dir.path(), geo(4 << 20, 64 << 10)).unwrap();
    s.write(0, &sectors(16, 1)).unwrap();
    s.write(3 * BLOCK, &sectors(16, 3)).unwrap();
    assert!(s.snapshot(7).unwrap());
    assert_eq!(s.snapshots(), vec![7]);
    // Only the map was copied: no new slot.
    assert_eq!(s.slots_in_use(), 2);
    s.write(0, &sectors(16, 2)).unwrap();
    assert_eq!(s.read(0, BLOCK as usize).unwrap(), sectors(16, 2));
    assert_eq!(
        s.read_snapshot(7, 0, BLOCK as usize).unwrap(),
        sectors(16, 1)
    );
    // The overwritten block took a new slot; block 3 is still shared.
    assert_eq!(s.slots_in_use(), 3);
    assert_eq!(s.allocated_blocks(), 2);
    // A block first written after the snapshot reads as zeros in it.
    s.write(5 * BLOCK, &sectors(1, 5)).unwrap();
    assert_eq!(s.read_snapshot(7, 5 * BLOCK, 4096).unwrap(), vec![0; 4096]);
    assert_eq!(s.snapshot_blocks(7).unwrap(), vec![0, 3]);
    // A read across blocks, at an odd offset.
    let got = s.read_snapshot(7, BLOCK - 10, 20).unwrap();
    assert_eq!(got, [vec![1; 10], vec![0; 10]].concat());
    // Taking it again does nothing: the replay of the log applies it again.
    assert!(!s.snapshot(7).unwrap());
    assert_eq!(s.read_snapshot(7, 0, 4096).unwrap(), sectors(1, 1));
    assert!(matches!(
        s.snapshot(0),
        Err(ChunkError::BadSnapshotId { id: 0 })
    ));
    assert!(matches!(
        s.read_snapshot(8, 0, 1),
        Err(ChunkError::NoSnapshot { id: 8 })
    ));
    assert!(matches!(
        s.read_snapshot(7, 4 << 20, 1),
        Err(ChunkError::OutOfRange { .. })
    ));
}

#[test]
fn a_partial_write_after_a_snapshot_keeps_the_other_sectors() {
    let dir = tempfile::tempdir().unwrap();
    let s = ChunkStore::open(real(), dir.path(), geo(1 << 20, 64 << 10)).unwrap();
    let pattern: Vec<u8> = (0..BLOCK).map(|i| (i / 4096) as u8 + 1).collect();
    s.write(BLOCK, &pattern).unwrap();
    s.snapshot(1).unwrap();
    s.write(BLOCK + 5 * 4096, &sectors(2, 0xEE)).unwrap();
    let mut want = pattern.clone();
    want[5 * 4096..7 * 4096].fill(0xEE);
    assert_eq!(s.read(BLOCK, BLOCK as usize).unwrap(), want);
    assert_eq!(s.read_snapshot(1, BLOCK, BLOCK as usize).unwrap(), pattern);
    // The copy is the current block's own now: the next write goes in place.
    let used = s.slots_in_use();
    s.write(BLOCK, &sectors(1, 0xDD)).unwrap();
    want[..4096].fill(0xDD);
    assert_eq!(s.slots_in_use(), used);
    assert_eq!(s.read(BLOCK, BLOCK as usize).unwrap(), want);
    // A second snapshot freezes the copy; a third write copies again, and each of the
    // three versions reads back.
    s.snapshot(2).unwrap();
    s.write(BLOCK + 15 * 4096, &sectors(1, 0xCC)).unwrap();
    assert_eq!(s.read_snapshot(2, BLOCK, BLOCK as usize).unwrap(), want);
    assert_eq!(s.read_snapshot(1, BLOCK, BLOCK as usize).unwrap(), pattern);
    want[15 * 4096..].fill(0xCC);
    assert_eq!(s.read(BLOCK, BLOCK as usize).unwrap(), want);
    assert_eq!(s.slots_in_use(), 3);
    // A write spanning blocks copies each frozen one.
    s.snapshot(3).unwrap();
    s.write(BLOCK - 4096, &sectors(3, 0xAB)).unwrap();
    assert_eq!(
        s.read_snapshot(3, BLOCK - 4096, 3 * 4096).unwrap(),
        [vec![0; 4096], want[..2 * 4096].to_vec()].concat()
    );
    assert_eq!(s.read(BLOCK - 4096, 3 * 4096).unwrap(), sectors(3, 0xAB));
}

#[test]
fn deleting_a_snapshot_frees_its_slots_for_reuse_after_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let s = ChunkStore::open(real(), dir.path(), geo(4 << 20, 64 << 10)).unwrap();
    for b in 0..4 {
        s.write(b * BLOCK, &sectors(16, b as u8)).unwrap();
    }
    s.snapshot(1).unwrap();
    for b in 0..4 {
        s.write(b * BLOCK, &sectors(1, 0xF0)).unwrap();
    }
    assert_eq!((s.slots_in_use(), s.data_slots()), (8, 8));
    assert!(s.delete_snapshot(1).unwrap());
    assert_eq!((s.slots_in_use(), s.data_slots()), (4, 8));
    assert!(matches!(
        s.read_snapshot(1, 0, 1),
        Err(ChunkError::NoSnapshot { id: 1 })
    ));
    assert!(matches!(
        s.snapshot_blocks(1),
        Err(ChunkError::NoSnapshot { id: 1 })
    ));
    assert!(s.snapshots().is_empty());
    // Not reused before a checkpoint: the durable map still names them.
    s.write(10 * BLOCK, &sectors(1, 10)).unwrap();
    assert_eq!((s.slots_in_use(), s.data_slots()), (5, 9));
    s.checkpoint().unwrap();
    // Reused after it: the file does not grow.
    for b in 11..15 {
        s.write(b * BLOCK, &sectors(1, b as u8)).unwrap();
    }
    assert_eq!((s.slots_in_use(), s.data_slots()), (9, 9));
    for b in 0..4 {
        assert_eq!(
            s.read(b * BLOCK, 8192).unwrap(),
            [sectors(1, 0xF0), sectors(1, b as u8)].concat()
        );
    }
    for b in 10..15 {
        // The reused slots' old bytes do not show: the first write wrote whole blocks.
        assert_eq!(
            s.read(b * BLOCK, 8192).unwrap(),
            [sectors(1, b as u8), vec![0; 4096]].concat()
        );
    }
    // A deleted id is never taken again, and deleting twice does nothing.
    assert!(!s.snapshot(1).unwrap());
    assert!(s.snapshots().is_empty());
    assert!(!s.delete_snapshot(1).unwrap());
    assert!(!s.delete_snapshot(99).unwrap());
    assert!(
        !s.snapshot(99).unwrap(),
        "a delete seen first keeps the id from being taken"
    );
    assert_eq!(s.deleted_snapshots(), vec![1, 99]);
    assert_eq!(s.snapshot_ids_seen(), 2);
}

#[test]
fn a_delete_keeps_the_slots_another_map_still_names() {
    let dir = tempfile::tempdir().unwrap();
    let s = ChunkStore::open(real(), dir.path(), geo(1 << 20, 64 << 10)).unwrap();
    s.write(0, &sectors(16, 1)).unwrap();
    s.snapshot(1).unwrap();
    s.snapshot(2).unwrap();
    s.write(0, &sectors(1, 2)).unwrap();
    assert_eq!(s.slots_in_use(), 2);
    // Snapshot 2 still names the old slot; the current map the new one.
    s.delete_snapshot(1).unwrap();
    assert_eq!(s.slots_in_use(), 2);
    assert_eq!(s.read_snapshot(2, 0, 4096).unwrap(), sectors(1, 1));
    // A snapshot sharing the current slot: deleting it leaves the slot to the current
    // map, which writes in place again.
    s.snapshot(3).unwrap();
    s.delete_snapshot(3).unwrap();
    s.write(4096, &sectors(1, 3)).unwrap();
    assert_eq!(s.slots_in_use(), 2);
    s.delete_snapshot(2).unwrap();
    assert_eq!(s.slots_in_use(), 1);
    assert_eq!(
        s.read(0, 8192).unwrap(),
        [sectors(1, 2), sectors(1, 3)].concat()
    );
}

#[test]
fn snapshots_survive_a_restart_and_a_version_1_chunk_still_opens() {
    let g = geo(1 << 20, 64 << 10);
    let dir = tempfile::tempdir().unwrap();
    {
        let s = ChunkStore::open(real(), dir.path(), g).unwrap();
        s.write(0, &sectors(16, 1)).unwrap();
        s.snapshot(4).unwrap();
        s.write(0, &sectors(1, 2)).unwrap();
        s.snapshot(6).unwrap();
        s.delete_snapshot(5).unwrap();
        s.checkpoint().unwrap();
    }
    let s = ChunkStore::open(real(), dir.path(), g).unwrap();
    assert_eq!(s.snapshots(), vec![4, 6]);
    assert_eq!(s.read_snapshot(4, 0, 8192).unwrap(), sectors(2, 1));
    assert_eq!(
        s.read_snapshot(6, 0, 8192).unwrap(),
        [sectors(1, 2), sectors(1, 1)].concat()
    );
    assert!(!s.snapshot(5).unwrap(), "deleted ids are remembered");
    assert_eq!(s.slots_in_use(), 2);
    // Frozen still: a write copies.
    s.write(0, &sectors(1, 3)).unwrap();
    assert_eq!(s.slots_in_use(), 3);
    drop(s);

    // A chunk whose map is of version 1 (written before snapshots): its blocks read, and
    // it takes snapshots from there.
    let old = tempfile::tempdir().unwrap();
    let mut map = Vec::new();
    map.extend_from_slice(b"CHKM");
    map.extend_from_slice(&1u32.to_le_bytes());
    map.extend_from_slice(&g.chunk_bytes.to_le_bytes());
    map.extend_from_slice(&g.block_bytes.to_le_bytes());
    map.extend_from_slice(&2u32.to_le_bytes());
    map.extend_from_slice(&0u64.to_le_bytes());
    for (b, slot) in [(2u32, 1u32), (5, 0)] {
        map.extend_from_slice(&b.to_le_bytes());
        map.extend_from_slice(&slot.to_le_bytes());
    }
    let crc = crc32c::crc32c(&map);
    map.extend_from_slice(&crc.to_le_bytes());
    std::fs::write(old.path().join("chunk.map"), &map).unwrap();
    let data = [vec![5u8; BLOCK as usize], vec![2u8; BLOCK as usize]].concat();
    std::fs::write(old.path().join("chunk.0000000000000000.data"), &data).unwrap();
    let s = ChunkStore::open(real(), old.path(), g).unwrap();
    assert_eq!(s.read(2 * BLOCK, 4096).unwrap(), sectors(1, 2));
    assert_eq!(s.read(5 * BLOCK, 4096).unwrap(), sectors(1, 5));
    s.snapshot(1).unwrap();
    s.write(2 * BLOCK, &sectors(1, 9)).unwrap();
    s.checkpoint().unwrap();
    drop(s);
    let bytes = std::fs::read(old.path().join("chunk.map")).unwrap();
    assert_eq!(&bytes[4..8], &2u32.to_le_bytes(), "rewritten as version 2");
    let m = MapFile::decode("map", &bytes).unwrap();
    assert_eq!(m.slot_count, 3);
    let s = ChunkStore::open(real(), old.path(), g).unwrap();
    assert_eq!(s.read_snapshot(1, 2 * BLOCK, 4096).unwrap(), sectors(1, 2));
    assert_eq!(s.read(2 * BLOCK, 4096).unwrap(), sectors(1, 9));
}

#[test]
fn a_map_naming_a_slot_past_the_data_file_is_refused() {
    let g = geo(1 << 20, 64 << 10);
    let dir = tempfile::tempdir().unwrap();
    {
        let s = ChunkStore::open(real(), dir.path(), g).unwrap();
        s.write(0, &sectors(1, 1)).unwrap();
        s.write(BLOCK, &sectors(1, 1)).unwrap();
        s.checkpoint().unwrap();
    }
    let data = dir.path().join("chunk.0000000000000000.data");
    std::fs::File::options()
        .write(true)
        .open(&data)
        .unwrap()
        .set_len(BLOCK)
        .unwrap();
    match ChunkStore::open(real(), dir.path(), g) {
        Err(ChunkError::Corrupt { detail, .. }) => {
            assert!(detail.contains("names slot 1"), "{detail}")
        }
        other => panic!("opened: {other:?}"),
    }
}

#[test]
fn an_image_carries_the_snapshots_and_each_shared_block_once() {
    let g = geo(2 << 20, 64 << 10);
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let src = ChunkStore::open(real(), a.path(), g).unwrap();
    for blk in 0..6 {
        src.write(blk * BLOCK, &sectors(16, blk as u8 + 1)).unwrap();
    }
    src.snapshot(2).unwrap();
    src.write(BLOCK, &sectors(1, 0x22)).unwrap();
    src.snapshot(3).unwrap();
    src.write(2 * BLOCK, &sectors(1, 0x33)).unwrap();
    src.write(20 * BLOCK, &sectors(1, 0x44)).unwrap();
    src.delete_snapshot(1).unwrap();
    let img = src.image().unwrap();
    assert_eq!(img.data.len() as u32, src.slots_in_use(), "each slot once");
    assert_eq!(img.data.len(), 6 + 2 + 1);
    let bytes = image::encode(g, &img);
    let dst = ChunkStore::open(real(), b.path(), g).unwrap();
    dst.write(30 * BLOCK, &sectors(1, 9)).unwrap();
    dst.snapshot(9).unwrap();
    dst.replace(&image::decode(g, &bytes).unwrap()).unwrap();
    let same = |dst: &ChunkStore| {
        assert_eq!(dst.snapshots(), vec![2, 3]);
        let all = g.chunk_bytes as usize;
        assert_eq!(dst.read(0, all).unwrap(), src.read(0, all).unwrap());
        for id in [2, 3] {
            assert_eq!(
                dst.read_snapshot(id, 0, all).unwrap(),
                src.read_snapshot(id, 0, all).unwrap()
            );
            assert_eq!(
                dst.snapshot_blocks(id).unwrap(),
                src.snapshot_blocks(id).unwrap()
            );
        }
        assert_eq!(dst.slots_in_use(), src.slots_in_use());
        assert!(!dst.snapshot(1).unwrap(), "the deleted id came along");
        assert_eq!(dst.snapshot_ids_seen(), src.snapshot_ids_seen());
    };
    same(&dst);
    drop(dst);
    let dst = ChunkStore::open(real(), b.path(), g).unwrap();
    same(&dst);
    // Still copy-on-write after the install: the shared slots are frozen.
    dst.write(0, &sectors(1, 0x55)).unwrap();
    assert_eq!(dst.read_snapshot(2, 0, 4096).unwrap(), sectors(1, 1));
    // An image breaking its rules is refused, and the chunk kept.
    let mut bad = img.clone();
    bad.data.pop();
    assert!(matches!(dst.replace(&bad), Err(ChunkError::Corrupt { .. })));
    assert_eq!(dst.snapshots(), vec![2, 3]);
}

/// An in-memory chunk with snapshots: what the store must read as.
#[derive(Clone, Debug)]
struct Model {
    current: Vec<u8>,
    snaps: BTreeMap<u64, Vec<u8>>,
    deleted: BTreeSet<u64>,
}

impl Model {
    fn new(g: Geometry) -> Self {
        Self {
            current: vec![0; g.chunk_bytes as usize],
            snaps: BTreeMap::new(),
            deleted: BTreeSet::new(),
        }
    }

    fn write(&mut self, at: u64, data: &[u8]) {
        self.current[at as usize..at as usize + data.len()].copy_from_slice(data);
    }

    fn snapshot(&mut self, id: u64) -> bool {
        if self.snaps.contains_key(&id) || self.deleted.contains(&id) {
            return false;
        }
        self.snaps.insert(id, self.current.clone());
        true
    }

    fn delete(&mut self, id: u64) -> bool {
        self.deleted.insert(id);
        self.snaps.remove(&id).is_some()
    }
}

/// One record of the chunk's log.
#[derive(Clone, Debug)]
enum Logged {
    Write(u64, Vec<u8>),
    Snapshot(u64),
    Delete(u64),
}

fn apply(s: &ChunkStore, m: Option<&mut Model>, r: &Logged) {
    match r {
        Logged::Write(at, data) => {
            s.write(*at, data).unwrap();
            if let Some(m) = m {
                m.write(*at, data);
            }
        }
        Logged::Snapshot(id) => {
            let took = s.snapshot(*id).unwrap();
            if let Some(m) = m {
                assert_eq!(took, m.snapshot(*id), "snapshot {id}");
            }
        }
        Logged::Delete(id) => {
            let had = s.delete_snapshot(*id).unwrap();
            if let Some(m) = m {
                assert_eq!(had, m.delete(*id), "delete {id}");
            }
        }
    }
}

/// The store reads as the model: the whole chunk, and every snapshot.
fn same_as(s: &ChunkStore, m: &Model) -> Result<(), TestCaseError> {
    let all = m.current.len();
    prop_assert_eq!(s.snapshots(), m.snaps.keys().copied().collect::<Vec<_>>());
    prop_assert!(s.read(0, all).unwrap() == m.current, "the chunk differs");
    for (id, bytes) in &m.snaps {
        prop_assert!(
            s.read_snapshot(*id, 0, all).unwrap() == *bytes,
            "snapshot {} differs",
            id
        );
    }
    Ok(())
}

#[derive(Clone, Debug)]
enum Op {
    Write {
        sector: u64,
        n: u64,
        byte: u8,
    },
    Snapshot(u64),
    Delete(u64),
    Read {
        offset: u64,
        len: usize,
        snap: Option<u64>,
    },
    /// A checkpoint, after which the log keeps its last `keep` records: the replica's
    /// base may lag its checkpoint (the checkpoint holds records past it), and those are
    /// replayed too after a crash.
    Checkpoint {
        keep: usize,
    },
    /// A power loss (the simulated file system keeps what was synced, and of the rest
    /// what `arbitrary` or in-order write-back kept, torn or whole), or a restart that
    /// loses nothing (`none`); then the store reopens and the log above the base is
    /// replayed.
    Crash {
        arbitrary: bool,
        none: bool,
    },
}

fn op(chunk_bytes: u64) -> impl Strategy<Value = Op> {
    let sectors = chunk_bytes / SECTOR;
    prop_oneof![
        6 => (0..sectors, 1u64..24, any::<u8>()).prop_map(move |(s, n, byte)| Op::Write {
            sector: s,
            n: n.min(sectors - s),
            byte,
        }),
        2 => (1u64..6).prop_map(Op::Snapshot),
        1 => (1u64..7).prop_map(Op::Delete),
        2 => (0..chunk_bytes, 0usize..100_000, proptest::option::of(1u64..6)).prop_map(
            move |(offset, len, snap)| Op::Read {
                offset,
                len: len.min((chunk_bytes - offset) as usize),
                snap,
            }
        ),
        1 => (0usize..4).prop_map(|keep| Op::Checkpoint { keep }),
        1 => (any::<bool>(), any::<bool>()).prop_map(|(arbitrary, none)| Op::Crash { arbitrary, none }),
    ]
}

fn logged(op: &Op) -> Option<Logged> {
    match op {
        Op::Write { sector, n, byte } => Some(Logged::Write(sector * SECTOR, sectors(*n, *byte))),
        Op::Snapshot(id) => Some(Logged::Snapshot(*id)),
        Op::Delete(id) => Some(Logged::Delete(*id)),
        _ => None,
    }
}

/// Slot identities in the model: a block's slot is shared with the snapshots taken since
/// its last copy; a write to a shared one makes a new identity. `slots_in_use` must count
/// the distinct identities.
#[derive(Default)]
struct Tokens {
    next: u64,
    current: HashMap<u32, u64>,
    snaps: BTreeMap<u64, HashMap<u32, u64>>,
}

impl Tokens {
    fn write(&mut self, g: Geometry, at: u64, len: u64) {
        let bb = g.block_bytes as u64;
        for b in at / bb..(at + len).div_ceil(bb) {
            let b = b as u32;
            let shared = self
                .current
                .get(&b)
                .is_none_or(|t| self.snaps.values().any(|m| m.get(&b) == Some(t)));
            if shared {
                self.next += 1;
                self.current.insert(b, self.next);
            }
        }
    }

    fn in_use(&self) -> u32 {
        let mut all: HashSet<u64> = self.current.values().copied().collect();
        for m in self.snaps.values() {
            all.extend(m.values());
        }
        all.len() as u32
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random writes, snapshots, deletes, checkpoints and reads against the model, with
    /// no crash: every read matches, and the space taken is exactly the distinct slots
    /// the maps name.
    #[test]
    fn the_store_and_its_snapshots_read_as_the_model(
        small in any::<bool>(),
        ops in proptest::collection::vec(op(2 << 20), 1..80),
    ) {
        let g = geo(2 << 20, if small { 4096 } else { 64 << 10 });
        let dir = tempfile::tempdir().unwrap();
        let s = ChunkStore::open(real(), dir.path(), g).unwrap();
        let mut m = Model::new(g);
        let mut t = Tokens::default();
        for op in &ops {
            if let Some(r) = logged(op) {
                match &r {
                    Logged::Write(at, data) => t.write(g, *at, data.len() as u64),
                    Logged::Snapshot(id) => {
                        if !m.snaps.contains_key(id) && !m.deleted.contains(id) {
                            t.snaps.insert(*id, t.current.clone());
                        }
                    }
                    Logged::Delete(id) => {
                        t.snaps.remove(id);
                    }
                }
                apply(&s, Some(&mut m), &r);
                prop_assert_eq!(s.slots_in_use(), t.in_use());
                continue;
            }
            match op {
                Op::Read { offset, len, snap } => {
                    let o = *offset as usize;
                    match snap.and_then(|id| m.snaps.get(&id).map(|b| (id, b))) {
                        Some((id, bytes)) => prop_assert!(
                            s.read_snapshot(id, *offset, *len).unwrap() == bytes[o..o + len]
                        ),
                        None => prop_assert!(s.read(*offset, *len).unwrap() == m.current[o..o + len]),
                    }
                }
                Op::Checkpoint { .. } | Op::Crash { .. } => s.checkpoint().unwrap(),
                _ => unreachable!(),
            }
        }
        prop_assert_eq!(s.allocated_blocks() as usize, t.current.len());
        same_as(&s, &m)?;
    }

    /// The same operations with crashes on the simulator's file system: after each, the
    /// store reopens to its last checkpoint and the log above the base (which may reach
    /// below the checkpoint) is replayed, and the chunk and every snapshot read as the
    /// model.
    #[test]
    fn snapshots_come_back_exactly_through_crashes_and_replay(
        small in any::<bool>(),
        seed in any::<u64>(),
        ops in proptest::collection::vec(op(1 << 20), 1..70),
    ) {
        let g = geo(1 << 20, if small { 4096 } else { 64 << 10 });
        let sim = Arc::new(SimFs::new(seed));
        let fs: Arc<dyn FileSystem> = sim.clone();
        let dir = Path::new("/chunk");
        let mut s = ChunkStore::open(fs.clone(), dir, g).unwrap();
        let mut m = Model::new(g);
        let mut log: Vec<Logged> = Vec::new();
        let mut base = 0usize;
        for op in &ops {
            if let Some(r) = logged(op) {
                apply(&s, Some(&mut m), &r);
                log.push(r);
                continue;
            }
            match op {
                Op::Read { offset, len, snap } => {
                    let o = *offset as usize;
                    match snap.and_then(|id| m.snaps.get(&id).map(|b| (id, b))) {
                        Some((id, bytes)) => prop_assert!(
                            s.read_snapshot(id, *offset, *len).unwrap() == bytes[o..o + len]
                        ),
                        None => prop_assert!(s.read(*offset, *len).unwrap() == m.current[o..o + len]),
                    }
                }
                Op::Checkpoint { keep } => {
                    s.checkpoint().unwrap();
                    base = base.max(log.len().saturating_sub(*keep));
                }
                Op::Crash { arbitrary, none } => {
                    drop(s);
                    if !none {
                        sim.crash(if *arbitrary { CrashMode::Arbitrary } else { CrashMode::Prefix });
                    }
                    s = ChunkStore::open(fs.clone(), dir, g).unwrap();
                    for r in &log[base..] {
                        apply(&s, None, r);
                    }
                    same_as(&s, &m)?;
                }
                _ => unreachable!(),
            }
        }
        same_as(&s, &m)?;
    }
}

/// The hazard the pending list guards against: a slot freed by a deleted snapshot and
/// reused before a checkpoint. The durable map still names it (for the snapshot, and the
/// current map as of then), so after a crash the replay's copy-on-write would copy the
/// reused slot's bytes — another block's — into the chunk.
#[test]
fn a_slot_freed_by_a_delete_is_not_reused_before_a_checkpoint() {
    let g = geo(1 << 20, 64 << 10);
    for crash in [None, Some(CrashMode::Prefix), Some(CrashMode::Arbitrary)] {
        for seed in 0..8 {
            let sim = Arc::new(SimFs::new(seed));
            let fs: Arc<dyn FileSystem> = sim.clone();
            let dir = Path::new("/chunk");
            let s = ChunkStore::open(fs.clone(), dir, g).unwrap();
            s.write(0, &sectors(16, 0x11)).unwrap(); // block 0 in slot 0
            s.snapshot(1).unwrap();
            s.checkpoint().unwrap(); // durable: current and snapshot 1 name slot 0
            let log = vec![
                // Copies block 0 to slot 1: only snapshot 1 names slot 0 now.
                Logged::Write(0, sectors(1, 0x22)),
                // Slot 0 is named by no map, but the durable one names it.
                Logged::Delete(1),
                // A new block: were slot 0 reused, its 0x55s would overwrite the 0x11s.
                Logged::Write(5 * BLOCK, sectors(16, 0x55)),
            ];
            for r in &log {
                apply(&s, None, r);
            }
            drop(s);
            if let Some(mode) = crash {
                sim.crash(mode);
            }
            let s = ChunkStore::open(fs.clone(), dir, g).unwrap();
            for r in &log {
                apply(&s, None, r);
            }
            let want = [sectors(1, 0x22), sectors(15, 0x11)].concat();
            let got = s.read(0, BLOCK as usize).unwrap();
            assert!(
                got == want,
                "block 0 after the replay ({crash:?}, seed {seed}): byte {:?} differs, {:#x}",
                got.iter().zip(&want).position(|(a, b)| a != b),
                got[got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0)],
            );
            assert!(s.read(5 * BLOCK, BLOCK as usize).unwrap() == sectors(16, 0x55));
            assert!(s.snapshots().is_empty());
        }
    }
}

/// "Delete X, take X, write" above the base, all in the checkpoint: the replay must not
/// take X again from a current map that already holds the write (ids are taken once).
#[test]
fn a_deleted_id_taken_again_stays_deleted_through_a_replay() {
    let g = geo(1 << 20, 64 << 10);
    let sim = Arc::new(SimFs::new(1));
    let fs: Arc<dyn FileSystem> = sim.clone();
    let dir = Path::new("/chunk");
    let s = ChunkStore::open(fs.clone(), dir, g).unwrap();
    s.write(0, &sectors(1, 1)).unwrap();
    s.snapshot(3).unwrap();
    s.checkpoint().unwrap();
    let log = vec![
        Logged::Delete(3),
        Logged::Snapshot(3),
        Logged::Write(0, sectors(1, 2)),
    ];
    let mut m = Model::new(g);
    m.write(0, &sectors(1, 1));
    m.snapshot(3);
    for r in &log {
        apply(&s, Some(&mut m), r);
    }
    s.checkpoint().unwrap(); // holds all three; the base stays before them
    drop(s);
    sim.crash(CrashMode::Arbitrary);
    let s = ChunkStore::open(fs, dir, g).unwrap();
    for r in &log {
        apply(&s, None, r);
    }
    same_as(&s, &m).unwrap();
    assert!(s.snapshots().is_empty());
}
