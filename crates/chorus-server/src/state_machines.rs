//! The state machines a node applies its out-of-order groups' records to, with their
//! checkpoints and images (`docs/formats.md`, "Out-of-order state machine images"): a
//! block volume for parallel groups and a key-value store for dependent groups.
//!
//! - **Block volume** (parallel groups): 4 KiB blocks in the sparse file `volume`, written
//!   in place with `pwrite`. A checkpoint is an `fdatasync` of the file. Its image lists
//!   the blocks that hold data (found with `SEEK_DATA`/`SEEK_HOLE`, all-zero blocks
//!   skipped); installing one writes `volume.tmp`, syncs it and renames it over `volume`.
//! - **Key-value store** (dependent groups, the WAL model): a map in memory. A checkpoint
//!   writes its image to `kv.image` crash-atomically (`kv.image.tmp`, fsync, rename,
//!   fsync the directory); at start the map is read back from there.
//!
//! A follower that lacks only a few compacted slots gets a *partial* image (PolarFS
//! section 5.4's fast catch-up): the blocks or keys those slots wrote, installed over its
//! own state, which is then made durable as a checkpoint makes it.
//!
//! Both only ever make blind writes, which the replica's replay from its base requires
//! (`OooStateMachine`). Images are built in memory: they are sized for tests, benchmarks
//! and the service's `ReadBlocks`/`GetKeys`, not for a volume of terabytes (the PolarFS
//! storage layer's chunks are the state machine for that).

use std::collections::HashMap;
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, RwLock};

use chorus_core::ooo::group::Record;
use chorus_core::ooo::parallel::BlockRange;
use chorus_core::ooo::replica::{Declared, Footprint};
use chorus_runtime::ooo::OooStateMachine;

/// Bytes per block of a parallel group's volume.
pub const BLOCK: u64 = 4096;
/// Largest volume: 2^28 blocks (1 TiB, a sparse file).
pub const MAX_BLOCKS: u64 = 1 << 28;
/// Most blocks one `ReadBlocks` call returns.
pub const MAX_READ_BLOCKS: u64 = 4096;

/// Magic of a volume image ("COVI").
const VOLUME_MAGIC: u32 = 0x4956_4F43;
/// Magic of a key-value image ("COKV").
const KV_MAGIC: u32 = 0x564B_4F43;
/// Magic of a partial volume image ("COVP").
const VOLUME_PART_MAGIC: u32 = 0x5056_4F43;
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

/// An out-of-order group's state machine: a block volume or a key-value store (see the
/// module documentation).
#[derive(Debug)]
pub struct GroupStateMachine {
    dir: PathBuf,
    kind: Kind,
    /// Bytes of the key-value image last written (0 for the volume): what the next
    /// checkpoint is expected to write ([`OooStateMachine::checkpoint_cost`]).
    image_bytes: std::sync::atomic::AtomicU64,
}

#[derive(Debug)]
enum Kind {
    Volume(RwLock<std::fs::File>),
    Kv(Mutex<HashMap<u64, Vec<u8>>>),
}

impl GroupStateMachine {
    /// Opens (creating if needed) the block volume in `dir`.
    pub fn block_volume(dir: &Path) -> io::Result<Self> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.join("volume"))?;
        Ok(Self {
            dir: dir.to_path_buf(),
            kind: Kind::Volume(RwLock::new(f)),
            image_bytes: 0.into(),
        })
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

    fn file(&self) -> Option<std::sync::RwLockReadGuard<'_, std::fs::File>> {
        match &self.kind {
            Kind::Volume(f) => Some(f.read().unwrap_or_else(|p| p.into_inner())),
            Kind::Kv(_) => None,
        }
    }

    fn map(&self) -> Option<std::sync::MutexGuard<'_, HashMap<u64, Vec<u8>>>> {
        match &self.kind {
            Kind::Kv(m) => Some(m.lock().unwrap_or_else(|p| p.into_inner())),
            Kind::Volume(_) => None,
        }
    }

    /// Reads `count` blocks from `start` (parallel groups).
    pub fn read_blocks(&self, start: u64, count: u64) -> Result<Vec<u8>, String> {
        let Some(f) = self.file() else {
            return Err("not a parallel-mode group".into());
        };
        if count == 0 || count > MAX_READ_BLOCKS {
            return Err(format!(
                "count {count}: read 1 to {MAX_READ_BLOCKS} blocks per call"
            ));
        }
        if start.checked_add(count).is_none_or(|e| e > MAX_BLOCKS) {
            return Err(format!(
                "blocks {start}+{count} are past the volume's {MAX_BLOCKS} blocks"
            ));
        }
        let mut buf = vec![0u8; (count * BLOCK) as usize];
        let len = f.metadata().map_err(|e| e.to_string())?.len();
        let off = start * BLOCK;
        if off < len {
            let n = ((len - off) as usize).min(buf.len());
            f.read_exact_at(&mut buf[..n], off)
                .map_err(|e| e.to_string())?;
        }
        Ok(buf)
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
        for (i, rec) in records {
            match (&self.kind, &rec.declared) {
                (Kind::Volume(_), Declared::Blocks(ranges)) => {
                    let f = self.file().expect("volume");
                    let mut at = 0usize;
                    for r in ranges {
                        let n = ((r.end - r.start) * BLOCK) as usize;
                        let chunk = rec.data.get(at..at + n).ok_or_else(|| {
                            bad(
                                "volume",
                                format!("slot {slot} record {i}: data shorter than its blocks"),
                            )
                        })?;
                        f.write_all_at(chunk, r.start * BLOCK)?;
                        at += n;
                    }
                }
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
            Kind::Volume(_) => self.file().expect("volume").sync_data(),
            Kind::Kv(_) => {
                let image = self.image()?;
                self.write_kv_image(&image)
            }
        }
    }

    /// The key-value store rewrites its whole image at each checkpoint: about as many
    /// bytes as the last one. The volume's checkpoint only syncs what its applies wrote.
    fn checkpoint_cost(&self) -> u64 {
        self.image_bytes.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn image(&self) -> io::Result<Vec<u8>> {
        match &self.kind {
            Kind::Volume(_) => {
                let f = self.file().expect("volume");
                let (count, body) = volume_blocks(&f)?;
                Ok(seal(VOLUME_MAGIC, count, &body))
            }
            Kind::Kv(_) => Ok(encode_kv(&self.map().expect("kv"))),
        }
    }

    fn image_part(&self, scope: &Footprint) -> io::Result<Option<Vec<u8>>> {
        match &self.kind {
            Kind::Volume(_) => {
                if !scope.keys.is_empty() {
                    return Err(bad("partial volume image", "asked for keys"));
                }
                let f = self.file().expect("volume");
                let mut body = Vec::new();
                for r in &scope.blocks {
                    body.extend_from_slice(&r.start.to_le_bytes());
                    body.extend_from_slice(&r.end.to_le_bytes());
                }
                let mut block = vec![0u8; BLOCK as usize];
                for r in &scope.blocks {
                    for lba in r.start..r.end {
                        let n = f.read_at(&mut block, lba * BLOCK)?;
                        block[n..].fill(0);
                        body.extend_from_slice(&block);
                    }
                }
                Ok(Some(seal(
                    VOLUME_PART_MAGIC,
                    scope.blocks.len() as u64,
                    &body,
                )))
            }
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
            Kind::Volume(lock) => {
                let (ranges, blocks) = decode_volume_part(image)?;
                // Under the write lock: no apply runs during an install, and a read sees
                // each block old or new. A crash midway leaves some blocks of the image
                // written and the replica's base unchanged: it replays from that base and,
                // still behind the leader's, is sent an image again, whose scope holds
                // every block this one did (what the slots from its applied head on wrote).
                let f = lock.write().unwrap_or_else(|p| p.into_inner());
                let mut at = 0;
                for r in &ranges {
                    let n = ((r.end - r.start) * BLOCK) as usize;
                    f.write_all_at(&blocks[at..at + n], r.start * BLOCK)?;
                    at += n;
                }
                f.sync_data()
            }
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
            Kind::Volume(lock) => {
                let (count, body) = open_seal("volume image", VOLUME_MAGIC, image)?;
                let rec = 8 + BLOCK as usize;
                if body.len() as u64 != count.saturating_mul(rec as u64) {
                    return Err(bad(
                        "volume image",
                        format!("{} body bytes for {count} blocks", body.len()),
                    ));
                }
                let tmp = self.dir.join("volume.tmp");
                let f = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(&tmp)?;
                for r in body.chunks(rec) {
                    let lba = u64::from_le_bytes(r[..8].try_into().expect("8"));
                    if lba >= MAX_BLOCKS {
                        return Err(bad(
                            "volume image",
                            format!("block {lba} is past the volume's {MAX_BLOCKS} blocks"),
                        ));
                    }
                    f.write_all_at(&r[8..], lba * BLOCK)?;
                }
                f.sync_all()?;
                // Swapped under the write lock: no apply runs during an install, and a
                // read sees the old volume or the new one.
                let mut cur = lock.write().unwrap_or_else(|p| p.into_inner());
                std::fs::rename(&tmp, self.dir.join("volume"))?;
                std::fs::File::open(&self.dir)?.sync_all()?;
                *cur = f;
                Ok(())
            }
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

/// A partial volume image: its ranges (ascending, disjoint, inside the volume) and the
/// bytes of their blocks, in order.
fn decode_volume_part(b: &[u8]) -> io::Result<(Vec<BlockRange>, &[u8])> {
    let what = "partial volume image";
    let (count, body) = open_seal(what, VOLUME_PART_MAGIC, b)?;
    if count > body.len() as u64 / 16 {
        return Err(bad(what, format!("{count} ranges in {} bytes", body.len())));
    }
    let (heads, blocks) = body.split_at(count as usize * 16);
    let mut ranges = Vec::with_capacity(count as usize);
    let mut total = 0u64;
    for (i, h) in heads.chunks(16).enumerate() {
        let start = u64::from_le_bytes(h[..8].try_into().expect("8"));
        let end = u64::from_le_bytes(h[8..].try_into().expect("8"));
        if start >= end || end > MAX_BLOCKS {
            return Err(bad(
                what,
                format!("range {i}, blocks {start}..{end}, is empty or past the volume's {MAX_BLOCKS} blocks"),
            ));
        }
        if ranges.last().is_some_and(|p: &BlockRange| p.end > start) {
            return Err(bad(
                what,
                format!(
                    "range {i} starts at block {start}, inside or before range {}",
                    i - 1
                ),
            ));
        }
        ranges.push(BlockRange { start, end });
        total += end - start;
    }
    if blocks.len() as u64 != total * BLOCK {
        return Err(bad(
            what,
            format!("{} block bytes for {total} blocks", blocks.len()),
        ));
    }
    Ok((ranges, blocks))
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

/// The blocks of the volume that hold data, as `u64 lba | 4096 bytes` records, with
/// their count. Holes are skipped with `SEEK_DATA`/`SEEK_HOLE`, all-zero blocks too.
fn volume_blocks(f: &std::fs::File) -> io::Result<(u64, Vec<u8>)> {
    let len = f.metadata()?.len();
    let fd = f.as_raw_fd();
    let mut out = Vec::new();
    let mut count = 0u64;
    let mut pos: u64 = 0;
    let mut block = vec![0u8; BLOCK as usize];
    while pos < len {
        // SAFETY: lseek on a descriptor this File owns; it only moves an offset the reads
        // below do not use (they are positioned).
        let mut data = unsafe { libc::lseek(fd, pos as libc::off_t, libc::SEEK_DATA) };
        let mut hole = len as libc::off_t;
        if data < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::ENXIO) => break, // no data after pos
                // A file system without SEEK_DATA: read everything from here.
                Some(libc::EINVAL) => data = pos as libc::off_t,
                _ => return Err(e),
            }
        } else {
            // SAFETY: as above.
            hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
            if hole < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        let (first, end) = (data as u64 / BLOCK, (hole as u64).min(len).div_ceil(BLOCK));
        for lba in first..end {
            let n = f.read_at(&mut block, lba * BLOCK)?;
            block[n..].fill(0);
            if block.iter().any(|&x| x != 0) {
                out.extend_from_slice(&lba.to_le_bytes());
                out.extend_from_slice(&block);
                count += 1;
            }
        }
        pos = end * BLOCK;
    }
    Ok((count, out))
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

    #[test]
    fn the_volume_reads_back_what_was_applied_and_zeros_elsewhere() {
        let dir = tempfile::tempdir().unwrap();
        let v = GroupStateMachine::block_volume(dir.path()).unwrap();
        v.apply(0, &blocks(&[(3, 1), (1, 2)])).unwrap();
        let b = v.read_blocks(0, 5).unwrap();
        assert!(b[..4096].iter().all(|&x| x == 0));
        assert!(b[4096..8192].iter().all(|&x| x == 2));
        assert!(b[3 * 4096..4 * 4096].iter().all(|&x| x == 1));
        assert!(b[4 * 4096..].iter().all(|&x| x == 0));
        assert!(v.read_blocks(0, 0).is_err());
        assert!(v.get_keys(&[1]).is_err());
    }

    #[test]
    fn a_volume_image_carries_the_written_blocks_and_installs_elsewhere() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let va = GroupStateMachine::block_volume(a.path()).unwrap();
        // Far apart: the scan must skip the hole between them.
        va.apply(0, &blocks(&[(2, 7), (1 << 20, 9)])).unwrap();
        va.apply(1, &blocks(&[(5, 0)])).unwrap(); // an all-zero block is not carried
        let img = va.image().unwrap();
        assert_eq!(img.len(), 16 + 2 * (8 + 4096) + 4);
        let vb = GroupStateMachine::block_volume(b.path()).unwrap();
        vb.apply(0, &blocks(&[(9, 3)])).unwrap(); // replaced by the image
        vb.restore(&img).unwrap();
        assert_eq!(vb.read_blocks(2, 1).unwrap(), vec![7; 4096]);
        assert_eq!(vb.read_blocks(1 << 20, 1).unwrap(), vec![9; 4096]);
        assert_eq!(vb.read_blocks(9, 1).unwrap(), vec![0; 4096]);
        // It survives a reopen (it was renamed into place and synced).
        drop(vb);
        let vb = GroupStateMachine::block_volume(b.path()).unwrap();
        assert_eq!(vb.read_blocks(2, 1).unwrap(), vec![7; 4096]);
        // A damaged image is refused by name and the state kept.
        let mut d = img.clone();
        d[30] ^= 1;
        let e = vb.restore(&d).unwrap_err().to_string();
        assert!(e.contains("volume image: checksum"), "{e}");
        assert_eq!(vb.read_blocks(1 << 20, 1).unwrap(), vec![9; 4096]);
    }

    #[test]
    fn a_partial_volume_image_overwrites_its_blocks_only() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (va, vb) = (
            GroupStateMachine::block_volume(a.path()).unwrap(),
            GroupStateMachine::block_volume(b.path()).unwrap(),
        );
        va.apply(0, &blocks(&[(2, 7), (3, 8), (9, 1)])).unwrap();
        vb.apply(0, &blocks(&[(2, 5), (4, 6), (9, 2), (20, 3)]))
            .unwrap();
        let scope = Footprint {
            blocks: vec![
                BlockRange::new(2, 3).unwrap(),
                BlockRange::new(9, 1).unwrap(),
            ],
            keys: vec![],
        };
        let img = va.image_part(&scope).unwrap().expect("partial");
        assert_eq!(img.len(), 16 + 2 * 16 + 4 * 4096 + 4);
        vb.restore_part(&img).unwrap();
        // Blocks 2..5 and 9 are a's (4 was zero there); 20 is b's own.
        for (lba, x) in [(2, 7), (3, 8), (4, 0), (9, 1), (20, 3)] {
            assert_eq!(
                vb.read_blocks(lba, 1).unwrap(),
                vec![x; 4096],
                "block {lba}"
            );
        }
        // Damage and nonsense are refused by name, the state kept.
        let mut d = img.clone();
        d[40] ^= 1;
        let e = vb.restore_part(&d).unwrap_err().to_string();
        assert!(e.contains("partial volume image: checksum"), "{e}");
        let e = vb
            .restore_part(&va.image().unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("partial volume image: magic"), "{e}");
        let overlap = seal(
            VOLUME_PART_MAGIC,
            2,
            &[2u64, 4, 3, 5]
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect::<Vec<u8>>(),
        );
        let e = vb.restore_part(&overlap).unwrap_err().to_string();
        assert!(e.contains("range 1 starts at block 3"), "{e}");
        let short = seal(
            VOLUME_PART_MAGIC,
            1,
            &[2u64, 4]
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect::<Vec<u8>>(),
        );
        let e = vb.restore_part(&short).unwrap_err().to_string();
        assert!(e.contains("0 block bytes for 2 blocks"), "{e}");
        assert_eq!(vb.read_blocks(20, 1).unwrap(), vec![3; 4096]);
        assert!(vb
            .image_part(&Footprint {
                blocks: vec![],
                keys: vec![1]
            })
            .is_err());
    }

    #[test]
    fn the_kv_store_reports_its_image_as_the_checkpoint_cost_and_the_volume_none() {
        let d = tempfile::tempdir().unwrap();
        let v = GroupStateMachine::block_volume(d.path()).unwrap();
        assert_eq!(v.checkpoint_cost(), 0);
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
