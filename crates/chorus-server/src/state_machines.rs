//! The state machines a node applies its out-of-order groups' records to, with their
//! checkpoints and images: a chunk replica for parallel groups and a key-value store for
//! dependent groups.
//!
//! - **Chunk replica** (parallel groups, PolarFS section 4): [`chorus_chunk`]'s
//!   thin-provisioned blocks and durable block map, of the geometry in the group's spec
//!   (`docs/formats.md`, "Chunk replicas"). A parallel group is a chunk: the volume
//!   layer makes a volume of many.
//! - **Key-value store** (dependent groups, the WAL model): a map in memory. A checkpoint
//!   writes its image to `kv.image` crash-atomically (`kv.image.tmp`, fsync, rename,
//!   fsync the directory); at start the map is read back from there (`docs/formats.md`,
//!   "Out-of-order state machine images").
//!
//! A follower that lacks only a few compacted slots gets a *partial* image (PolarFS
//! section 5.4's fast catch-up): the sectors or keys those slots wrote, installed over its
//! own state, which is then made durable as a checkpoint makes it.
//!
//! Both only ever make blind writes, which the replica's replay from its base requires
//! (`OooStateMachine`).

use std::collections::HashMap;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use chorus_chunk::{ChunkStateMachine, Geometry};
use chorus_core::ooo::group::Record;
use chorus_core::ooo::replica::{Declared, Footprint};
use chorus_runtime::ooo::OooStateMachine;
use chorus_storage::fs::RealFs;

/// Bytes per block of a parallel group's records (a chunk's sector).
pub const BLOCK: u64 = chorus_chunk::SECTOR;
/// Largest chunk a parallel group may be created with: 2^28 sectors (1 TiB).
pub const MAX_BLOCKS: u64 = 1 << 28;
/// Most blocks one `ReadBlocks` call returns.
pub const MAX_READ_BLOCKS: u64 = 4096;

/// Magic of a key-value image ("COKV").
const KV_MAGIC: u32 = 0x564B_4F43;
/// Magic of a partial key-value image ("COKP").
const KV_PART_MAGIC: u32 = 0x504B_4F43;

fn bad(what: &str, detail: impl Into<String>) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{what}: {}", detail.into()),
    )
}

/// Header `u32 magic | u32 version (1) | u64 count`, then the body, then a CRC32C of
/// everything before it.
fn seal(magic: u32, count: u64, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + body.len() + 4);
    out.extend_from_slice(&magic.to_le_bytes());
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&count.to_le_bytes());
    out.extend_from_slice(body);
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Checks a sealed image and returns its count and body.
fn open_seal<'a>(what: &str, magic: u32, b: &'a [u8]) -> io::Result<(u64, &'a [u8])> {
    if b.len() < 20 {
        return Err(bad(
            what,
            format!("{} bytes, shorter than a header", b.len()),
        ));
    }
    let (head, crc) = b.split_at(b.len() - 4);
    let want = u32::from_le_bytes(crc.try_into().expect("4"));
    let have = crc32c::crc32c(head);
    if want != have {
        return Err(bad(
            what,
            format!("checksum {have:#010x}, expected {want:#010x}"),
        ));
    }
    let m = u32::from_le_bytes(head[..4].try_into().expect("4"));
    if m != magic {
        return Err(bad(
            what,
            format!("magic {m:#010x}, expected {magic:#010x}"),
        ));
    }
    let v = u32::from_le_bytes(head[4..8].try_into().expect("4"));
    if v != 1 {
        return Err(bad(what, format!("version {v}, only 1 is known")));
    }
    let count = u64::from_le_bytes(head[8..16].try_into().expect("8"));
    Ok((count, &head[16..]))
}

/// Writes `bytes` to `dir/name` crash-atomically.
fn replace_file(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    let f = std::fs::File::create(&tmp)?;
    f.write_all_at(bytes, 0)?;
    f.sync_all()?;
    std::fs::rename(&tmp, dir.join(name))?;
    std::fs::File::open(dir)?.sync_all()
}

/// An out-of-order group's state machine: a chunk replica or a key-value store (see the
/// module documentation).
#[derive(Debug)]
pub struct GroupStateMachine {
    dir: PathBuf,
    kind: Kind,
    /// Bytes of the key-value image last written (unused for a chunk): what the next
    /// checkpoint is expected to write ([`OooStateMachine::checkpoint_cost`]).
    image_bytes: std::sync::atomic::AtomicU64,
}

#[derive(Debug)]
enum Kind {
    Chunk(Box<ChunkStateMachine>),
    Kv(Mutex<HashMap<u64, Vec<u8>>>),
}

impl GroupStateMachine {
    /// Opens (creating if needed) the chunk replica of `geometry` in `dir` (its files
    /// under `dir/chunk/`).
    pub fn chunk(dir: &Path, geometry: Geometry) -> io::Result<Self> {
        let c = ChunkStateMachine::open(Arc::new(RealFs), &dir.join("chunk"), geometry).map_err(
            |e| {
                let kind = match &e {
                    chorus_chunk::ChunkError::Io { source, .. } => source.kind(),
                    _ => io::ErrorKind::InvalidData,
                };
                io::Error::new(kind, e.to_string())
            },
        )?;
        Ok(Self {
            dir: dir.to_path_buf(),
            kind: Kind::Chunk(Box::new(c)),
            image_bytes: 0.into(),
        })
    }

    /// The chunk replica's state machine (parallel groups).
    pub fn chunk_sm(&self) -> Option<&ChunkStateMachine> {
        match &self.kind {
            Kind::Chunk(c) => Some(c),
            Kind::Kv(_) => None,
        }
    }

    /// The chunk replica's store (parallel groups).
    pub fn chunk_store(&self) -> Option<&chorus_chunk::ChunkStore> {
        match &self.kind {
            Kind::Chunk(c) => Some(c.store()),
            Kind::Kv(_) => None,
        }
    }

    /// The chunk's geometry (parallel groups).
    pub fn geometry(&self) -> Option<Geometry> {
        match &self.kind {
            Kind::Chunk(c) => Some(c.store().geometry()),
            Kind::Kv(_) => None,
        }
    }

    /// Opens the key-value store in `dir` from its last checkpoint (empty if none).
    pub fn key_value(dir: &Path) -> io::Result<Self> {
        let path = dir.join("kv.image");
        let (map, len) = match std::fs::read(&path) {
            Ok(b) => (
                decode_kv(&b).map_err(|e| bad(&path.display().to_string(), e.to_string()))?,
                b.len() as u64,
            ),
            Err(e) if e.kind() == io::ErrorKind::NotFound => (HashMap::new(), 0),
            Err(e) => return Err(e),
        };
        Ok(Self {
            dir: dir.to_path_buf(),
            kind: Kind::Kv(Mutex::new(map)),
            image_bytes: len.into(),
        })
    }

    /// Writes the key-value image crash-atomically and notes its size.
    fn write_kv_image(&self, image: &[u8]) -> io::Result<()> {
        replace_file(&self.dir, "kv.image", image)?;
        self.image_bytes
            .store(image.len() as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    fn map(&self) -> Option<std::sync::MutexGuard<'_, HashMap<u64, Vec<u8>>>> {
        match &self.kind {
            Kind::Kv(m) => Some(m.lock().unwrap_or_else(|p| p.into_inner())),
            Kind::Chunk(_) => None,
        }
    }

    /// Reads `count` blocks from `start` (parallel groups).
    pub fn read_blocks(&self, start: u64, count: u64) -> Result<Vec<u8>, String> {
        let Kind::Chunk(c) = &self.kind else {
            return Err("not a parallel-mode group".into());
        };
        if count == 0 || count > MAX_READ_BLOCKS {
            return Err(format!(
                "count {count}: read 1 to {MAX_READ_BLOCKS} blocks per call"
            ));
        }
        let sectors = c.store().geometry().sectors();
        if start.checked_add(count).is_none_or(|e| e > sectors) {
            return Err(format!(
                "blocks {start}+{count} are past the chunk's {sectors} blocks"
            ));
        }
        c.store()
            .read(start * BLOCK, (count * BLOCK) as usize)
            .map_err(|e| e.to_string())
    }

    /// Looks keys up (dependent groups).
    pub fn get_keys(&self, keys: &[u64]) -> Result<Vec<Option<Vec<u8>>>, String> {
        let Some(m) = self.map() else {
            return Err("not a dependent-mode group".into());
        };
        Ok(keys.iter().map(|k| m.get(k).cloned()).collect())
    }
}

impl OooStateMachine for GroupStateMachine {
    fn apply(&self, slot: u64, records: &[(u32, Record)]) -> io::Result<()> {
        if let Kind::Chunk(c) = &self.kind {
            return c.apply(slot, records);
        }
        for (i, rec) in records {
            match (&self.kind, &rec.declared) {
                (Kind::Kv(_), Declared::Txn { write_set, .. }) => {
                    let mut m = self.map().expect("kv");
                    for k in write_set {
                        m.insert(*k, rec.data.clone());
                    }
                }
                // The driver hands over only records of the group's own mode.
                _ => {
                    return Err(bad(
                        "state",
                        format!("slot {slot} record {i}: a record of the other mode"),
                    ))
                }
            }
        }
        Ok(())
    }

    fn checkpoint(&self) -> io::Result<()> {
        match &self.kind {
            Kind::Chunk(c) => c.checkpoint(),
            Kind::Kv(_) => {
                let image = self.image()?;
                self.write_kv_image(&image)
            }
        }
    }

    /// The key-value store rewrites its whole image at each checkpoint: about as many
    /// bytes as the last one. A chunk's checkpoint syncs what its applies wrote and
    /// rewrites its block map.
    fn checkpoint_cost(&self) -> u64 {
        match &self.kind {
            Kind::Chunk(c) => c.checkpoint_cost(),
            Kind::Kv(_) => self.image_bytes.load(std::sync::atomic::Ordering::Relaxed),
        }
    }

    fn replaying_below(&self, end: u64) {
        if let Kind::Chunk(c) = &self.kind {
            c.replaying_below(end);
        }
    }

    fn image(&self) -> io::Result<Vec<u8>> {
        match &self.kind {
            Kind::Chunk(c) => c.image(),
            Kind::Kv(_) => Ok(encode_kv(&self.map().expect("kv"))),
        }
    }

    fn image_part(&self, scope: &Footprint) -> io::Result<Option<Vec<u8>>> {
        match &self.kind {
            Kind::Chunk(c) => c.image_part(scope),
            Kind::Kv(_) => {
                if !scope.blocks.is_empty() {
                    return Err(bad("partial key-value image", "asked for blocks"));
                }
                let m = self.map().expect("kv");
                let mut body = Vec::new();
                for k in &scope.keys {
                    body.extend_from_slice(&k.to_le_bytes());
                    match m.get(k) {
                        Some(v) => {
                            body.push(1);
                            body.extend_from_slice(&(v.len() as u32).to_le_bytes());
                            body.extend_from_slice(v);
                        }
                        None => {
                            body.push(0);
                            body.extend_from_slice(&0u32.to_le_bytes());
                        }
                    }
                }
                Ok(Some(seal(KV_PART_MAGIC, scope.keys.len() as u64, &body)))
            }
        }
    }

    fn restore_part(&self, image: &[u8]) -> io::Result<()> {
        match &self.kind {
            Kind::Chunk(c) => c.restore_part(image),
            Kind::Kv(m) => {
                let part = decode_kv_part(image)?;
                let mut map = m.lock().unwrap_or_else(|p| p.into_inner());
                let mut next = map.clone();
                for (k, v) in part {
                    match v {
                        Some(v) => next.insert(k, v),
                        None => next.remove(&k),
                    };
                }
                self.write_kv_image(&encode_kv(&next))?;
                *map = next;
                Ok(())
            }
        }
    }

    fn restore(&self, image: &[u8]) -> io::Result<()> {
        match &self.kind {
            Kind::Chunk(c) => c.restore(image),
            Kind::Kv(m) => {
                let map = decode_kv(image)?;
                self.write_kv_image(image)?;
                *m.lock().unwrap_or_else(|p| p.into_inner()) = map;
                Ok(())
            }
        }
    }
}

/// The key-value image of `m` (keys ascending).
fn encode_kv(m: &HashMap<u64, Vec<u8>>) -> Vec<u8> {
    let mut keys: Vec<&u64> = m.keys().collect();
    keys.sort_unstable();
    let mut body = Vec::new();
    for k in keys {
        let v = &m[k];
        body.extend_from_slice(&k.to_le_bytes());
        body.extend_from_slice(&(v.len() as u32).to_le_bytes());
        body.extend_from_slice(v);
    }
    seal(KV_MAGIC, m.len() as u64, &body)
}

/// A partial key-value image: each key named, with its value or `None` (absent).
fn decode_kv_part(b: &[u8]) -> io::Result<Vec<(u64, Option<Vec<u8>>)>> {
    let what = "partial key-value image";
    let (count, mut body) = open_seal(what, KV_PART_MAGIC, b)?;
    if count > body.len() as u64 / 13 {
        return Err(bad(what, format!("{count} keys in {} bytes", body.len())));
    }
    let mut out: Vec<(u64, Option<Vec<u8>>)> = Vec::with_capacity(count as usize);
    for i in 0..count {
        if body.len() < 13 {
            return Err(bad(what, format!("key {i} of {count} is cut short")));
        }
        let k = u64::from_le_bytes(body[..8].try_into().expect("8"));
        if out.last().is_some_and(|(p, _)| *p >= k) {
            return Err(bad(what, format!("key {k} (entry {i}) is not ascending")));
        }
        let n = u32::from_le_bytes(body[9..13].try_into().expect("4")) as usize;
        let v = match body[8] {
            1 => Some(
                body.get(13..13 + n)
                    .ok_or_else(|| bad(what, format!("the value of key {k} is cut short")))?
                    .to_vec(),
            ),
            0 if n == 0 => None,
            f => {
                return Err(bad(
                    what,
                    format!("key {k}: presence byte {f} with a {n}-byte value"),
                ))
            }
        };
        body = &body[13 + v.as_ref().map_or(0, Vec::len)..];
        out.push((k, v));
    }
    if !body.is_empty() {
        return Err(bad(
            what,
            format!("{} bytes after the last key", body.len()),
        ));
    }
    Ok(out)
}

fn decode_kv(b: &[u8]) -> io::Result<HashMap<u64, Vec<u8>>> {
    let what = "key-value image";
    let (count, mut body) = open_seal(what, KV_MAGIC, b)?;
    if count > body.len() as u64 / 12 {
        return Err(bad(what, format!("{count} keys in {} bytes", body.len())));
    }
    let mut m = HashMap::with_capacity(count as usize);
    for i in 0..count {
        if body.len() < 12 {
            return Err(bad(what, format!("key {i} of {count} is cut short")));
        }
        let k = u64::from_le_bytes(body[..8].try_into().expect("8"));
        let n = u32::from_le_bytes(body[8..12].try_into().expect("4")) as usize;
        let v = body
            .get(12..12 + n)
            .ok_or_else(|| bad(what, format!("the value of key {k} is cut short")))?;
        m.insert(k, v.to_vec());
        body = &body[12 + n..];
    }
    if !body.is_empty() {
        return Err(bad(
            what,
            format!("{} bytes after the last key", body.len()),
        ));
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chorus_core::ooo::parallel::BlockRange;

    fn blocks(at: &[(u64, u8)]) -> Vec<(u32, Record)> {
        vec![(
            0,
            Record {
                declared: Declared::Blocks(
                    at.iter()
                        .map(|&(b, _)| BlockRange::new(b, 1).unwrap())
                        .collect(),
                ),
                data: at.iter().flat_map(|&(_, x)| vec![x; 4096]).collect(),
            },
        )]
    }

    const GEO: Geometry = Geometry {
        chunk_bytes: 4 << 20,
        block_bytes: 64 << 10,
    };

    /// A parallel group's state machine is a chunk replica: it reads back what was
    /// applied and zeros elsewhere, refuses reads past the chunk, carries its blocks in an
    /// image (whole or partial) to another replica, and refuses a damaged image by name.
    #[test]
    fn a_parallel_group_is_a_chunk_replica() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let va = GroupStateMachine::chunk(a.path(), GEO).unwrap();
        assert_eq!(va.geometry(), Some(GEO));
        va.apply(0, &blocks(&[(3, 1), (1, 2), (1000, 9)])).unwrap();
        let r = va.read_blocks(0, 5).unwrap();
        assert!(r[..4096].iter().all(|&x| x == 0));
        assert!(r[4096..8192].iter().all(|&x| x == 2));
        assert!(r[3 * 4096..4 * 4096].iter().all(|&x| x == 1));
        assert!(r[4 * 4096..].iter().all(|&x| x == 0));
        assert!(va.read_blocks(0, 0).is_err());
        let e = va.read_blocks(1020, 5).unwrap_err();
        assert!(e.contains("past the chunk's 1024 blocks"), "{e}");
        assert!(va.get_keys(&[1]).is_err());
        // Past the chunk's end, an apply is refused (the append checks it first).
        assert!(va.apply(1, &blocks(&[(1024, 1)])).is_err());
        let vb = GroupStateMachine::chunk(b.path(), GEO).unwrap();
        vb.apply(0, &blocks(&[(9, 3), (3, 4)])).unwrap();
        let scope = Footprint {
            blocks: vec![BlockRange::new(1, 3).unwrap()],
            keys: vec![],
        };
        vb.restore_part(&va.image_part(&scope).unwrap().expect("partial"))
            .unwrap();
        assert_eq!(vb.read_blocks(3, 1).unwrap(), vec![1; 4096]);
        assert_eq!(vb.read_blocks(9, 1).unwrap(), vec![3; 4096]);
        vb.restore(&va.image().unwrap()).unwrap();
        assert_eq!(vb.read_blocks(9, 1).unwrap(), vec![0; 4096]);
        assert_eq!(vb.read_blocks(1000, 1).unwrap(), vec![9; 4096]);
        let mut d = va.image().unwrap();
        d[30] ^= 1;
        let e = vb.restore(&d).unwrap_err().to_string();
        assert!(e.contains("damaged"), "{e}");
        assert_eq!(vb.read_blocks(1000, 1).unwrap(), vec![9; 4096]);
        // Reopened with another geometry: refused by name.
        drop(va);
        let other = Geometry {
            chunk_bytes: 8 << 20,
            ..GEO
        };
        let e = GroupStateMachine::chunk(a.path(), other).unwrap_err();
        assert!(e.to_string().contains("not the"), "{e}");
    }

    #[test]
    fn the_kv_store_reports_its_image_as_the_checkpoint_cost() {
        let d = tempfile::tempdir().unwrap();
        let kv = GroupStateMachine::key_value(d.path()).unwrap();
        assert_eq!(kv.checkpoint_cost(), 0, "nothing written yet");
        let rec = Record {
            declared: Declared::Txn {
                read_set: vec![],
                write_set: (0..100).collect(),
            },
            data: vec![7; 1000],
        };
        kv.apply(0, &[(0, rec)]).unwrap();
        kv.checkpoint().unwrap();
        let len = std::fs::metadata(d.path().join("kv.image")).unwrap().len();
        assert!(len > 100_000, "{len}");
        assert_eq!(kv.checkpoint_cost(), len);
        // Known again after a restart, from the file.
        drop(kv);
        assert_eq!(
            GroupStateMachine::key_value(d.path())
                .unwrap()
                .checkpoint_cost(),
            len
        );
    }

    #[test]
    fn a_partial_kv_image_sets_and_clears_its_keys_and_is_checkpointed() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (ka, kb) = (
            GroupStateMachine::key_value(a.path()).unwrap(),
            GroupStateMachine::key_value(b.path()).unwrap(),
        );
        let txn = |w: Vec<u64>, v: &[u8]| Record {
            declared: Declared::Txn {
                read_set: vec![],
                write_set: w,
            },
            data: v.to_vec(),
        };
        ka.apply(0, &[(0, txn(vec![1, 2], b"a"))]).unwrap();
        kb.apply(0, &[(0, txn(vec![2, 3, 4], b"b"))]).unwrap();
        let scope = Footprint {
            blocks: vec![],
            keys: vec![1, 2, 3],
        };
        let img = ka.image_part(&scope).unwrap().expect("partial");
        kb.restore_part(&img).unwrap();
        let want = vec![
            Some(b"a".to_vec()),
            Some(b"a".to_vec()),
            None,
            Some(b"b".to_vec()),
        ];
        assert_eq!(kb.get_keys(&[1, 2, 3, 4]).unwrap(), want);
        // Durable: the whole map is in kv.image.
        drop(kb);
        let kb = GroupStateMachine::key_value(b.path()).unwrap();
        assert_eq!(kb.get_keys(&[1, 2, 3, 4]).unwrap(), want);
        let mut d = img.clone();
        d[20] ^= 4;
        assert!(kb
            .restore_part(&d)
            .unwrap_err()
            .to_string()
            .contains("partial key-value image"));
        let bad_flag = seal(
            KV_PART_MAGIC,
            1,
            &[&7u64.to_le_bytes()[..], &[2], &0u32.to_le_bytes()].concat(),
        );
        let e = kb.restore_part(&bad_flag).unwrap_err().to_string();
        assert!(e.contains("key 7: presence byte 2"), "{e}");
        let e = decode_kv_part(&seal(
            KV_PART_MAGIC,
            2,
            &[
                &5u64.to_le_bytes()[..],
                &[0],
                &0u32.to_le_bytes(),
                &5u64.to_le_bytes(),
                &[0],
                &0u32.to_le_bytes(),
            ]
            .concat(),
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("not ascending"), "{e}");
        assert_eq!(kb.get_keys(&[4]).unwrap(), vec![Some(b"b".to_vec())]);
    }

    #[test]
    fn the_kv_store_checkpoints_reopens_and_refuses_damage() {
        let dir = tempfile::tempdir().unwrap();
        let kv = GroupStateMachine::key_value(dir.path()).unwrap();
        // A group of two records: the later one wins key 8.
        let txn = |w: Vec<u64>, v: &[u8]| Record {
            declared: Declared::Txn {
                read_set: vec![],
                write_set: w,
            },
            data: v.to_vec(),
        };
        kv.apply(
            0,
            &[(0, txn(vec![4, 8], b"v0")), (1, txn(vec![8, 4], b"v1"))],
        )
        .unwrap();
        // A record of the other mode is refused by name.
        let e = kv.apply(1, &blocks(&[(1, 1)])).unwrap_err().to_string();
        assert!(e.contains("slot 1 record 0"), "{e}");
        kv.checkpoint().unwrap();
        let again = GroupStateMachine::key_value(dir.path()).unwrap();
        assert_eq!(
            again.get_keys(&[4, 8, 9]).unwrap(),
            vec![Some(b"v1".to_vec()), Some(b"v1".to_vec()), None]
        );
        let other = tempfile::tempdir().unwrap();
        let kv2 = GroupStateMachine::key_value(other.path()).unwrap();
        kv2.restore(&kv.image().unwrap()).unwrap();
        assert_eq!(kv2.get_keys(&[8]).unwrap(), vec![Some(b"v1".to_vec())]);
        let mut d = std::fs::read(dir.path().join("kv.image")).unwrap();
        let n = d.len();
        d[n - 1] ^= 0xff;
        std::fs::write(dir.path().join("kv.image"), &d).unwrap();
        let err = GroupStateMachine::key_value(dir.path())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("kv.image") && err.contains("checksum"),
            "{err}"
        );
        assert!(decode_kv(&d[..10]).is_err());
    }
}
