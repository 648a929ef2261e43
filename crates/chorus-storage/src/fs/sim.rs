//! [`SimFs`]: a deterministic in-memory file system that injects the faults real disks
//! have — lost unsynced writes and torn writes at a crash, bit rot of synced data,
//! misdirected writes, and failing fsyncs with Linux's "fsyncgate" semantics.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use chorus_core::rng::Rng;

use super::{is_direct_aligned, FileSystem, FsFile, OpenOptions, DIRECT_IO_ALIGN};

/// What survives a simulated power loss.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashMode {
    /// Per file, a random prefix of the unsynced operations survives, and the last
    /// surviving write may be torn at a random byte (in-order write-back).
    Prefix,
    /// Each unsynced write independently survives, vanishes or is torn (out-of-order
    /// page write-back).
    Arbitrary,
}

/// Counters of what the file system was asked to do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimFsStats {
    /// `write_all_at` calls that succeeded.
    pub writes: u64,
    /// Bytes those calls wrote.
    pub bytes_written: u64,
    /// `sync_data` calls that succeeded.
    pub syncs: u64,
    /// `sync_data` calls that failed (injected).
    pub failed_syncs: u64,
    /// `sync_dir` calls.
    pub dir_syncs: u64,
    /// Simulated crashes.
    pub crashes: u64,
    /// `read_at` calls (each a `pread` on a real file system).
    pub reads: u64,
}

#[derive(Clone, Debug)]
enum Op {
    Write { offset: u64, data: Vec<u8> },
    SetLen(u64),
}

#[derive(Clone, Debug, Default)]
struct Inode {
    /// What a crash keeps.
    durable: Vec<u8>,
    /// What reads see: `durable` with `pending` applied.
    visible: Vec<u8>,
    /// Operations since the last successful sync, in order.
    pending: Vec<Op>,
    /// Operations a failed sync doomed: visible, never durable (fsyncgate).
    doomed: usize,
}

fn apply(buf: &mut Vec<u8>, op: &Op) {
    match op {
        Op::Write { offset, data } => {
            let end = *offset as usize + data.len();
            if buf.len() < end {
                buf.resize(end, 0);
            }
            buf[*offset as usize..end].copy_from_slice(data);
        }
        Op::SetLen(len) => buf.resize(*len as usize, 0),
    }
}

#[derive(Debug, Default)]
struct State {
    rng: Option<Rng>,
    epoch: u64,
    /// Inodes by id; directory entries map names to them.
    inodes: BTreeMap<u64, Inode>,
    next_inode: u64,
    /// Visible directory entries: path → inode.
    entries: BTreeMap<PathBuf, u64>,
    /// Durable directory entries (what a crash restores).
    durable_entries: BTreeMap<PathBuf, u64>,
    dirs: BTreeSet<PathBuf>,
    fail_next_sync: Option<Option<PathBuf>>,
    fail_next_write: Option<Option<PathBuf>>,
    misdirect_next_write: Option<(Option<PathBuf>, i64)>,
    sync_fail_per_million: u32,
    write_fail_per_million: u32,
    direct_unsupported: bool,
    stats: SimFsStats,
}

impl State {
    fn rng(&mut self) -> &mut Rng {
        self.rng.get_or_insert_with(|| Rng::new(0))
    }
}

fn matches(filter: &Option<PathBuf>, path: &Path) -> bool {
    filter.as_ref().is_none_or(|p| path.starts_with(p))
}

fn eio() -> io::Error {
    io::Error::from_raw_os_error(libc::EIO)
}

/// A deterministic, fault-injecting in-memory file system. Clones share the same state.
#[derive(Clone, Debug)]
pub struct SimFs {
    state: Arc<Mutex<State>>,
}

impl SimFs {
    /// An empty file system whose random choices follow `seed`.
    pub fn new(seed: u64) -> Self {
        let state = State {
            rng: Some(Rng::new(seed)),
            ..State::default()
        };
        Self {
            state: Arc::new(Mutex::new(state)),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock is a bug in a test; keep going with its state.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Simulates a power loss: unsynced data and directory entries are lost per `mode`,
    /// and every handle opened before it fails from now on.
    pub fn crash(&self, mode: CrashMode) {
        let mut s = self.lock();
        s.epoch += 1;
        s.stats.crashes += 1;
        s.entries = s.durable_entries.clone();
        let ids: Vec<u64> = s.inodes.keys().copied().collect();
        for id in ids {
            let mut inode = std::mem::take(s.inodes.get_mut(&id).expect("inode"));
            let doomed = inode.doomed.min(inode.pending.len());
            let ops: Vec<Op> = inode.pending.drain(..).skip(doomed).collect();
            let rng = s.rng();
            let mut survivors = Vec::new();
            match mode {
                CrashMode::Prefix => {
                    let keep = rng.below(ops.len() as u64 + 1) as usize;
                    survivors.extend(ops.into_iter().take(keep));
                    if let Some(Op::Write { data, .. }) = survivors.last_mut() {
                        if rng.chance(1, 2) {
                            let cut = rng.below(data.len() as u64 + 1) as usize;
                            data.truncate(cut);
                        }
                    }
                }
                CrashMode::Arbitrary => {
                    for mut op in ops {
                        match rng.below(3) {
                            0 => {}
                            1 => survivors.push(op),
                            _ => {
                                if let Op::Write { data, .. } = &mut op {
                                    let cut = rng.below(data.len() as u64 + 1) as usize;
                                    data.truncate(cut);
                                }
                                survivors.push(op);
                            }
                        }
                    }
                }
            }
            for op in &survivors {
                apply(&mut inode.durable, op);
            }
            inode.visible = inode.durable.clone();
            inode.doomed = 0;
            s.inodes.insert(id, inode);
        }
    }

    /// The next `sync_data` on a file under `path` (any file if `None`) fails with EIO.
    pub fn fail_next_sync(&self, path: Option<&Path>) {
        self.lock().fail_next_sync = Some(path.map(Path::to_path_buf));
    }

    /// The next `write_all_at` on a file under `path` fails with EIO, writing nothing.
    pub fn fail_next_write(&self, path: Option<&Path>) {
        self.lock().fail_next_write = Some(path.map(Path::to_path_buf));
    }

    /// The next write on a file under `path` lands `delta` bytes away from where it was
    /// aimed (a misdirected write), and reports success.
    pub fn misdirect_next_write(&self, path: Option<&Path>, delta: i64) {
        self.lock().misdirect_next_write = Some((path.map(Path::to_path_buf), delta));
    }

    /// Random fault rates, in failures per million calls.
    pub fn set_fault_rates(&self, sync_fail_per_million: u32, write_fail_per_million: u32) {
        let mut s = self.lock();
        s.sync_fail_per_million = sync_fail_per_million;
        s.write_fail_per_million = write_fail_per_million;
    }

    /// Whether `supports_direct_io` answers yes (default true).
    pub fn set_direct_io_supported(&self, yes: bool) {
        self.lock().direct_unsupported = !yes;
    }

    fn with_inode<T>(
        &self,
        path: &Path,
        f: impl FnOnce(&mut Inode, &mut Rng) -> T,
    ) -> io::Result<T> {
        let mut s = self.lock();
        let id = *s.entries.get(path).ok_or_else(|| not_found(path))?;
        let mut rng = s.rng().clone();
        let out = f(s.inodes.get_mut(&id).expect("inode of entry"), &mut rng);
        s.rng = Some(rng);
        Ok(out)
    }

    /// Flips `count` random bits within `[offset, offset + len)` of the file's durable and
    /// visible content: bit rot of data that was already synced.
    pub fn flip_bits(&self, path: &Path, offset: u64, len: u64, count: u32) -> io::Result<()> {
        self.with_inode(path, |inode, rng| {
            let end = (offset + len).min(inode.durable.len() as u64);
            if end <= offset {
                return;
            }
            for _ in 0..count {
                let bit = rng.below((end - offset) * 8);
                let at = (offset + bit / 8) as usize;
                let mask = 1u8 << (bit % 8);
                inode.durable[at] ^= mask;
                if at < inode.visible.len() {
                    inode.visible[at] ^= mask;
                }
            }
        })
    }

    /// Overwrites durable and visible content at `offset` with `bytes`.
    pub fn corrupt(&self, path: &Path, offset: u64, bytes: &[u8]) -> io::Result<()> {
        self.with_inode(path, |inode, _| {
            let op = Op::Write {
                offset,
                data: bytes.to_vec(),
            };
            apply(&mut inode.durable, &op);
            apply(&mut inode.visible, &op);
        })
    }

    /// The durable content of a file (what a crash now would keep).
    pub fn durable_content(&self, path: &Path) -> io::Result<Vec<u8>> {
        self.with_inode(path, |inode, _| inode.durable.clone())
    }

    /// The durable length of a file.
    pub fn durable_len(&self, path: &Path) -> io::Result<u64> {
        self.with_inode(path, |inode, _| inode.durable.len() as u64)
    }

    /// What the file system was asked to do so far.
    pub fn stats(&self) -> SimFsStats {
        self.lock().stats
    }
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{}: no such file", path.display()),
    )
}

#[derive(Debug)]
struct SimFile {
    fs: SimFs,
    path: PathBuf,
    inode: u64,
    epoch: u64,
    direct: bool,
    writable: bool,
}

impl SimFile {
    fn state(&self) -> io::Result<MutexGuard<'_, State>> {
        let s = self.fs.lock();
        if s.epoch != self.epoch {
            return Err(io::Error::other("stale handle: file system crashed"));
        }
        Ok(s)
    }

    fn check_direct(&self, ptr: *const u8, len: usize, offset: u64) -> io::Result<()> {
        if self.direct && !is_direct_aligned(ptr, len, offset) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "direct IO needs {DIRECT_IO_ALIGN}-byte alignment: offset {offset}, len {len}"
                ),
            ));
        }
        Ok(())
    }
}

impl FsFile for SimFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.check_direct(buf.as_ptr(), buf.len(), offset)?;
        let mut s = self.state()?;
        s.stats.reads += 1;
        let data = &s.inodes[&self.inode].visible;
        if offset >= data.len() as u64 {
            return Ok(0);
        }
        let n = buf.len().min(data.len() - offset as usize);
        buf[..n].copy_from_slice(&data[offset as usize..offset as usize + n]);
        Ok(n)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.check_direct(buf.as_ptr(), buf.len(), offset)?;
        if !self.writable {
            return Err(io::Error::from_raw_os_error(libc::EBADF));
        }
        let mut s = self.state()?;
        let rate = s.write_fail_per_million as u64;
        if matches!(&s.fail_next_write, Some(f) if matches(f, &self.path)) {
            s.fail_next_write = None;
            return Err(eio());
        }
        if rate > 0 && s.rng().chance(rate, 1_000_000) {
            return Err(eio());
        }
        let mut offset = offset;
        if let Some((f, delta)) = s.misdirect_next_write.clone() {
            if matches(&f, &self.path) {
                s.misdirect_next_write = None;
                offset = offset.saturating_add_signed(delta);
            }
        }
        s.stats.writes += 1;
        s.stats.bytes_written += buf.len() as u64;
        let op = Op::Write {
            offset,
            data: buf.to_vec(),
        };
        let inode = s.inodes.get_mut(&self.inode).expect("inode");
        apply(&mut inode.visible, &op);
        inode.pending.push(op);
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        let mut s = self.state()?;
        let rate = s.sync_fail_per_million as u64;
        let injected = matches!(&s.fail_next_sync, Some(f) if matches(f, &self.path));
        if injected || (rate > 0 && s.rng().chance(rate, 1_000_000)) {
            if injected {
                s.fail_next_sync = None;
            }
            s.stats.failed_syncs += 1;
            // fsyncgate: the kernel marks the pages clean; the writes stay visible but are
            // never written back.
            let inode = s.inodes.get_mut(&self.inode).expect("inode");
            inode.doomed = inode.pending.len();
            return Err(eio());
        }
        s.stats.syncs += 1;
        let inode = s.inodes.get_mut(&self.inode).expect("inode");
        let doomed = inode.doomed.min(inode.pending.len());
        let ops: Vec<Op> = inode.pending.drain(..).collect();
        for op in &ops[doomed..] {
            apply(&mut inode.durable, op);
        }
        // Doomed writes stay lost: keep them pending-but-doomed only until the next crash.
        inode.pending = ops[..doomed].to_vec();
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        let s = self.state()?;
        Ok(s.inodes[&self.inode].visible.len() as u64)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut s = self.state()?;
        let inode = s.inodes.get_mut(&self.inode).expect("inode");
        let op = Op::SetLen(len);
        apply(&mut inode.visible, &op);
        inode.pending.push(op);
        Ok(())
    }

    fn is_direct(&self) -> bool {
        self.direct
    }
}

impl FileSystem for SimFs {
    fn open(&self, path: &Path, opts: OpenOptions) -> io::Result<Box<dyn FsFile>> {
        let mut s = self.lock();
        let id = match s.entries.get(path) {
            Some(id) => *id,
            None if opts.create => {
                let parent = path.parent().unwrap_or(Path::new(""));
                if !parent.as_os_str().is_empty() && !s.dirs.contains(parent) {
                    return Err(not_found(parent));
                }
                let id = s.next_inode;
                s.next_inode += 1;
                s.inodes.insert(id, Inode::default());
                s.entries.insert(path.to_path_buf(), id);
                id
            }
            None => return Err(not_found(path)),
        };
        Ok(Box::new(SimFile {
            fs: self.clone(),
            path: path.to_path_buf(),
            inode: id,
            epoch: s.epoch,
            direct: opts.direct,
            writable: opts.write || opts.create,
        }))
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        // Directories are modelled as always durable: Chorus creates them once, at setup,
        // and syncs their parents; the interesting losses are of files.
        let mut s = self.lock();
        for a in path.ancestors() {
            if !a.as_os_str().is_empty() {
                s.dirs.insert(a.to_path_buf());
            }
        }
        Ok(())
    }

    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        let s = self.lock();
        if !s.dirs.contains(path) {
            return Err(not_found(path));
        }
        let mut names: Vec<String> = s
            .entries
            .keys()
            .chain(s.dirs.iter())
            .filter(|p| p.parent() == Some(path))
            .filter_map(|p| p.file_name().and_then(|n| n.to_str()).map(str::to_owned))
            .collect();
        names.sort();
        names.dedup();
        Ok(names)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut s = self.lock();
        s.entries
            .remove(path)
            .map(|_| ())
            .ok_or_else(|| not_found(path))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut s = self.lock();
        let id = s.entries.remove(from).ok_or_else(|| not_found(from))?;
        s.entries.insert(to.to_path_buf(), id);
        Ok(())
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        let mut s = self.lock();
        if !s.dirs.contains(path) {
            return Err(not_found(path));
        }
        s.stats.dir_syncs += 1;
        let visible: Vec<(PathBuf, u64)> = s
            .entries
            .iter()
            .filter(|(p, _)| p.parent() == Some(path))
            .map(|(p, id)| (p.clone(), *id))
            .collect();
        s.durable_entries.retain(|p, _| p.parent() != Some(path));
        s.durable_entries.extend(visible);
        Ok(())
    }

    fn exists(&self, path: &Path) -> io::Result<bool> {
        let s = self.lock();
        Ok(s.entries.contains_key(path) || s.dirs.contains(path))
    }

    fn supports_direct_io(&self, _dir: &Path) -> bool {
        !self.lock().direct_unsupported
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (SimFs, PathBuf) {
        let fs = SimFs::new(1);
        let dir = PathBuf::from("/d");
        fs.create_dir_all(&dir).unwrap();
        (fs, dir)
    }

    #[test]
    fn unsynced_lost_synced_kept() {
        let (fs, dir) = setup();
        let p = dir.join("f");
        let f = fs.open(&p, OpenOptions::create()).unwrap();
        fs.sync_dir(&dir).unwrap();
        f.write_all_at(b"abc", 0).unwrap();
        f.sync_data().unwrap();
        f.write_all_at(b"def", 3).unwrap();
        fs.crash(CrashMode::Prefix);
        assert!(f.len().is_err(), "stale handle after crash");
        let d = fs.durable_content(&p).unwrap();
        assert!(d.starts_with(b"abc") && d.len() <= 6);
    }

    #[test]
    fn undirsynced_create_vanishes_and_failed_sync_loses_writes() {
        let (fs, dir) = setup();
        let p = dir.join("f");
        let f = fs.open(&p, OpenOptions::create()).unwrap();
        f.write_all_at(b"abc", 0).unwrap();
        f.sync_data().unwrap();
        fs.crash(CrashMode::Prefix);
        assert!(!fs.exists(&p).unwrap());

        let f = fs.open(&p, OpenOptions::create()).unwrap();
        fs.sync_dir(&dir).unwrap();
        f.write_all_at(b"xyz", 0).unwrap();
        fs.fail_next_sync(None);
        assert!(f.sync_data().is_err());
        f.sync_data().unwrap();
        let mut b = [0u8; 3];
        f.read_at(&mut b, 0).unwrap();
        assert_eq!(&b, b"xyz", "still visible after the failed sync");
        fs.crash(CrashMode::Arbitrary);
        assert_eq!(fs.durable_content(&p).unwrap(), b"");
    }

    #[test]
    fn direct_alignment_enforced() {
        let (fs, dir) = setup();
        let f = fs
            .open(&dir.join("f"), OpenOptions::create().with_direct(true))
            .unwrap();
        let e = f.write_all_at(&[0u8; 10], 0).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn flip_bits_counts() {
        let (fs, dir) = setup();
        let p = dir.join("f");
        let f = fs.open(&p, OpenOptions::create()).unwrap();
        f.write_all_at(&[0u8; 64], 0).unwrap();
        f.sync_data().unwrap();
        fs.flip_bits(&p, 16, 16, 1).unwrap();
        let d = fs.durable_content(&p).unwrap();
        let ones: u32 = d.iter().map(|b| b.count_ones()).sum();
        assert_eq!(ones, 1);
        assert!(d[..16].iter().all(|b| *b == 0) && d[32..].iter().all(|b| *b == 0));
    }
}
