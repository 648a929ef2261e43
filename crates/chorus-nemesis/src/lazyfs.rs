//! Power loss for real processes: a FUSE file system, in the manner of LazyFS (which
//! etcd's robustness suite mounts under its members), that passes every call through to a
//! backing directory except data writes. Those it keeps in memory, per file, until the
//! file is `fsync`ed or `fdatasync`ed; [`LazyFs::lose_unsynced`] then drops whatever was
//! not, as a machine that loses power drops its page cache. A node whose data directory
//! is such a mount, killed with SIGKILL and its unsynced writes dropped, restarts from
//! exactly what it made durable.
//!
//! What is modelled and what is not:
//! - data written and not synced is lost, whole (each unsynced `write` call is dropped;
//!   torn sectors within one are not modelled);
//! - a file's length follows its writes; a truncation, like every metadata call (create,
//!   rename, unlink, mkdir, fallocate), reaches the backing directory at once and survives
//!   (LazyFS's default too): a lost rename or file creation is not modelled;
//! - a sync takes 2 ms before it makes the file's writes durable, as a disk's
//!   flush does, so a cut can land while a node waits on its sync; the backing file's
//!   own sync then runs beside other calls (the mount serves several at once), as a
//!   disk's flush does not stop writes to the page cache;
//! - the kernel caches nothing: every open is answered with `FOPEN_DIRECT_IO`, and
//!   attributes and names with a time-to-live of zero, so what the node reads after a
//!   loss is what this file system holds.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    BackgroundSession, Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request,
    TimeOrNow, WriteFlags,
};

use crate::Error;

/// Nothing is cached by the kernel.
const TTL: Duration = Duration::ZERO;
/// How long a sync takes before it makes anything durable (a disk's flush latency):
/// writes a node has issued but whose sync has not returned are exposed to a power cut
/// for at least this long.
const SYNC_LATENCY: Duration = Duration::from_millis(2);

/// How long an unmount waits for the mount's last users to let go before it fails.
const UNMOUNT_WAIT: Duration = Duration::from_secs(10);
/// The root's inode number (FUSE's).
const ROOT: u64 = 1;

/// Writes to one file not yet synced.
///
/// Invariant: `size` is the file's length as its users see it: the backing file's
/// length, raised by pending writes past it.
#[derive(Debug, Default)]
struct Pending {
    /// (offset, bytes), in the order written; later ones win where they overlap.
    writes: Vec<(u64, Vec<u8>)>,
    /// The file's length with the pending writes.
    size: u64,
}

/// The file system's state.
///
/// Invariants: `paths` and `inos` are inverse maps (every inode handed to the kernel and
/// not forgotten has one path, relative to `backing`, the root `""`); `handles` name
/// inodes in `paths`.
#[derive(Debug)]
struct State {
    backing: PathBuf,
    paths: HashMap<u64, PathBuf>,
    inos: HashMap<PathBuf, u64>,
    next_ino: u64,
    /// Files with writes not yet synced, by inode.
    pending: HashMap<u64, Pending>,
    /// Open files: (inode, the backing file).
    handles: HashMap<u64, (u64, Arc<File>)>,
    next_fh: u64,
    /// Bytes of unsynced writes dropped by power losses so far.
    lost_bytes: u64,
    /// The power is off: every call fails with EIO (the machine is dead) until it is
    /// restored. Set at the instant of the loss, before the node's processes are killed,
    /// so that nothing they still had in flight (an fsync already queued) reaches the
    /// disk after it.
    off: bool,
}

fn errno(e: &std::io::Error) -> Errno {
    Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
}

fn kind_of(m: &std::fs::Metadata) -> FileType {
    if m.is_dir() {
        FileType::Directory
    } else if m.file_type().is_symlink() {
        FileType::Symlink
    } else {
        FileType::RegularFile
    }
}

fn time(secs: i64, nsec: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nsec as u32)
    } else {
        UNIX_EPOCH
    }
}

impl State {
    fn full(&self, rel: &Path) -> PathBuf {
        if rel.as_os_str().is_empty() {
            self.backing.clone()
        } else {
            self.backing.join(rel)
        }
    }

    fn path(&self, ino: u64) -> Result<PathBuf, Errno> {
        self.paths.get(&ino).cloned().ok_or(Errno::ENOENT)
    }

    fn ino_for(&mut self, rel: PathBuf) -> u64 {
        if let Some(i) = self.inos.get(&rel) {
            return *i;
        }
        let i = self.next_ino;
        self.next_ino += 1;
        self.inos.insert(rel.clone(), i);
        self.paths.insert(i, rel);
        i
    }

    fn forget_path(&mut self, rel: &Path) {
        if let Some(i) = self.inos.remove(rel) {
            self.paths.remove(&i);
            self.pending.remove(&i);
        }
    }

    fn attr(&self, ino: u64) -> Result<FileAttr, Errno> {
        let full = self.full(&self.path(ino)?);
        let m = std::fs::symlink_metadata(&full).map_err(|e| errno(&e))?;
        let size = self.pending.get(&ino).map_or(m.len(), |p| p.size);
        Ok(FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: time(m.atime(), m.atime_nsec()),
            mtime: time(m.mtime(), m.mtime_nsec()),
            ctime: time(m.ctime(), m.ctime_nsec()),
            crtime: time(m.ctime(), m.ctime_nsec()),
            kind: kind_of(&m),
            perm: (m.mode() & 0o7777) as u16,
            nlink: m.nlink() as u32,
            uid: m.uid(),
            gid: m.gid(),
            rdev: 0,
            blksize: 4096,
            flags: 0,
        })
    }

    fn child(&mut self, parent: u64, name: &OsStr) -> Result<PathBuf, Errno> {
        Ok(self.path(parent)?.join(name))
    }

    fn open_handle(&mut self, ino: u64, f: File) -> u64 {
        let fh = self.next_fh;
        self.next_fh += 1;
        self.handles.insert(fh, (ino, Arc::new(f)));
        fh
    }

    /// Writes `ino`'s pending writes to the backing file (its page cache: a power loss
    /// no longer drops them, as a flush under way may or may not finish); the caller
    /// syncs the file after letting go of the state.
    fn write_pending(&mut self, ino: u64, f: &File) -> std::io::Result<()> {
        if let Some(p) = self.pending.remove(&ino) {
            for (off, b) in &p.writes {
                f.write_all_at(b, *off)?;
            }
        }
        Ok(())
    }

    /// Cuts `ino`'s pending writes at `len` (a truncation).
    fn truncate_pending(&mut self, ino: u64, len: u64) {
        if let Some(p) = self.pending.get_mut(&ino) {
            p.writes.retain_mut(|(off, b)| {
                if *off >= len {
                    return false;
                }
                b.truncate((len - *off) as usize);
                true
            });
            p.size = len;
        }
    }
}

/// The FUSE side.
struct Lazy {
    state: Arc<Mutex<State>>,
    /// How long each sync waits before it makes anything durable ([`SYNC_LATENCY`]).
    sync_latency: Duration,
}

impl Lazy {
    /// The state, or `None` while the power is off.
    fn lock(&self) -> Option<MutexGuard<'_, State>> {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        (!s.off).then_some(s)
    }
}

/// Answers EIO while the power is off.
macro_rules! on {
    ($self:ident, $reply:ident) => {
        match $self.lock() {
            Some(s) => s,
            None => return $reply.error(Errno::EIO),
        }
    };
}

fn entry(r: Result<FileAttr, Errno>, reply: ReplyEntry) {
    match r {
        Ok(a) => reply.entry(&TTL, &a, Generation(0)),
        Err(e) => reply.error(e),
    }
}

fn empty(r: Result<(), Errno>, reply: ReplyEmpty) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

impl Filesystem for Lazy {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let mut s = on!(self, reply);
        let r = s.child(parent.0, name).and_then(|rel| {
            std::fs::symlink_metadata(s.full(&rel)).map_err(|e| errno(&e))?;
            let ino = s.ino_for(rel);
            s.attr(ino)
        });
        entry(r, reply)
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match on!(self, reply).attr(ino.0) {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut s = on!(self, reply);
        let r = (|| {
            let full = s.full(&s.path(ino.0)?);
            if let Some(len) = size {
                let f = OpenOptions::new()
                    .write(true)
                    .open(&full)
                    .map_err(|e| errno(&e))?;
                f.set_len(len).map_err(|e| errno(&e))?;
                s.truncate_pending(ino.0, len);
            }
            if let Some(m) = mode {
                std::fs::set_permissions(&full, std::fs::Permissions::from_mode(m & 0o7777))
                    .map_err(|e| errno(&e))?;
            }
            s.attr(ino.0)
        })();
        match r {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let mut s = on!(self, reply);
        let r = s.child(parent.0, name).and_then(|rel| {
            let full = s.full(&rel);
            std::fs::create_dir(&full).map_err(|e| errno(&e))?;
            let _ = std::fs::set_permissions(
                &full,
                std::fs::Permissions::from_mode(mode & !umask & 0o7777),
            );
            let ino = s.ino_for(rel);
            s.attr(ino)
        });
        entry(r, reply)
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut s = on!(self, reply);
        let r = s.child(parent.0, name).and_then(|rel| {
            std::fs::remove_file(s.full(&rel)).map_err(|e| errno(&e))?;
            s.forget_path(&rel);
            Ok(())
        });
        empty(r, reply)
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut s = on!(self, reply);
        let r = s.child(parent.0, name).and_then(|rel| {
            std::fs::remove_dir(s.full(&rel)).map_err(|e| errno(&e))?;
            s.forget_path(&rel);
            Ok(())
        });
        empty(r, reply)
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if !flags.is_empty() {
            return reply.error(Errno::EINVAL);
        }
        let mut s = on!(self, reply);
        let r = (|| {
            let from = s.child(parent.0, name)?;
            let to = s.child(newparent.0, newname)?;
            std::fs::rename(s.full(&from), s.full(&to)).map_err(|e| errno(&e))?;
            // What was at the target is gone; what was under the source moves.
            s.forget_path(&to);
            let moved: Vec<(PathBuf, u64)> = s
                .inos
                .iter()
                .filter(|(p, _)| p.starts_with(&from))
                .map(|(p, i)| (p.clone(), *i))
                .collect();
            for (p, i) in moved {
                let rest = p
                    .strip_prefix(&from)
                    .expect("under the source")
                    .to_path_buf();
                let np = if rest.as_os_str().is_empty() {
                    to.clone()
                } else {
                    to.join(rest)
                };
                s.inos.remove(&p);
                s.inos.insert(np.clone(), i);
                s.paths.insert(i, np);
            }
            Ok(())
        })();
        empty(r, reply)
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let mut s = on!(self, reply);
        let r = (|| {
            let full = s.full(&s.path(ino.0)?);
            let acc = flags.0 & libc::O_ACCMODE;
            let f = OpenOptions::new()
                .read(true)
                .write(acc != libc::O_RDONLY)
                .open(&full)
                .map_err(|e| errno(&e))?;
            if flags.0 & libc::O_TRUNC != 0 {
                f.set_len(0).map_err(|e| errno(&e))?;
                s.truncate_pending(ino.0, 0);
            }
            Ok(s.open_handle(ino.0, f))
        })();
        match r {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::FOPEN_DIRECT_IO),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let mut s = on!(self, reply);
        let r = (|| {
            let rel = s.child(parent.0, name)?;
            let full = s.full(&rel);
            let mut o = OpenOptions::new();
            o.read(true).write(true).mode(mode & !umask & 0o7777);
            if flags & libc::O_EXCL != 0 {
                o.create_new(true);
            } else {
                o.create(true);
            }
            let f = o.open(&full).map_err(|e| errno(&e))?;
            let ino = s.ino_for(rel);
            if flags & libc::O_TRUNC != 0 {
                f.set_len(0).map_err(|e| errno(&e))?;
                s.truncate_pending(ino, 0);
            }
            let fh = s.open_handle(ino, f);
            Ok((s.attr(ino)?, fh))
        })();
        match r {
            Ok((a, fh)) => reply.created(
                &TTL,
                &a,
                Generation(0),
                FileHandle(fh),
                FopenFlags::FOPEN_DIRECT_IO,
            ),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let s = on!(self, reply);
        let Some((_, f)) = s.handles.get(&fh.0) else {
            return reply.error(Errno::EBADF);
        };
        let len = match s.pending.get(&ino.0) {
            Some(p) => p.size,
            None => match f.metadata() {
                Ok(m) => m.len(),
                Err(e) => return reply.error(errno(&e)),
            },
        };
        let n = (size as u64).min(len.saturating_sub(offset)) as usize;
        let mut buf = vec![0u8; n];
        let mut got = 0;
        while got < n {
            match f.read_at(&mut buf[got..], offset + got as u64) {
                Ok(0) => break, // past the backing file's end: zeros, or pending bytes
                Ok(k) => got += k,
                Err(e) => return reply.error(errno(&e)),
            }
        }
        if let Some(p) = s.pending.get(&ino.0) {
            let end = offset + n as u64;
            for (off, b) in &p.writes {
                let (ws, we) = (*off, *off + b.len() as u64);
                if we <= offset || ws >= end {
                    continue;
                }
                let from = ws.max(offset);
                let to = we.min(end);
                buf[(from - offset) as usize..(to - offset) as usize]
                    .copy_from_slice(&b[(from - ws) as usize..(to - ws) as usize]);
            }
        }
        reply.data(&buf);
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut s = on!(self, reply);
        let Some((_, f)) = s.handles.get(&fh.0).cloned() else {
            return reply.error(Errno::EBADF);
        };
        let base = match f.metadata() {
            Ok(m) => m.len(),
            Err(e) => return reply.error(errno(&e)),
        };
        let p = s.pending.entry(ino.0).or_insert_with(|| Pending {
            writes: Vec::new(),
            size: base,
        });
        let offset = if flags.0 & libc::O_APPEND != 0 {
            p.size
        } else {
            offset
        };
        p.writes.push((offset, data.to_vec()));
        p.size = p.size.max(offset + data.len() as u64);
        reply.written(data.len() as u32);
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close() does not make data durable.
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        if let Some(mut s) = self.lock() {
            s.handles.remove(&fh.0);
        }
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // A sync takes time, as a disk's does; a power cut meanwhile loses what it was
        // making durable.
        std::thread::sleep(self.sync_latency);
        let f = {
            let mut s = on!(self, reply);
            let Some((_, f)) = s.handles.get(&fh.0).cloned() else {
                return reply.error(Errno::EBADF);
            };
            if let Err(e) = s.write_pending(ino.0, &f) {
                return reply.error(errno(&e));
            }
            f
        };
        // The backing file's own sync runs with the state let go and, the mount serving
        // several requests at once, without holding up other calls: a disk's flush does
        // not stop writes to the page cache, and a node's next batch (written while its
        // last one syncs) must not wait here for the whole of a slow sync of the backing
        // disk. With one thread and the sync under the lock, a log write of the ordered
        // driver's round waited for the sync before it, for seconds on a loaded machine,
        // and the round sent no heartbeat meanwhile.
        let r = f.sync_data().map_err(|e| errno(&e));
        // Power cut meanwhile: the node is gone, and what the sync made durable is
        // durable; answer as a powered-off disk does.
        let r = r.and_then(|()| match self.lock() {
            Some(_) => Ok(()),
            None => Err(Errno::EIO),
        });
        empty(r, reply)
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match on!(self, reply).path(ino.0) {
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let mut s = on!(self, reply);
        let rel = match s.path(ino.0) {
            Ok(r) => r,
            Err(e) => return reply.error(e),
        };
        let rd = match std::fs::read_dir(s.full(&rel)) {
            Ok(rd) => rd,
            Err(e) => return reply.error(errno(&e)),
        };
        let mut all = vec![
            (ino.0, FileType::Directory, OsStr::new(".").to_os_string()),
            (ino.0, FileType::Directory, OsStr::new("..").to_os_string()),
        ];
        let mut names: Vec<_> = rd.flatten().collect();
        names.sort_by_key(|e| e.file_name());
        for e in names {
            let kind = match e.file_type() {
                Ok(t) if t.is_dir() => FileType::Directory,
                Ok(t) if t.is_symlink() => FileType::Symlink,
                _ => FileType::RegularFile,
            };
            let i = s.ino_for(rel.join(e.file_name()));
            all.push((i, kind, e.file_name()));
        }
        for (n, (i, k, name)) in all.into_iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(i), n as u64 + 1, k, &name) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let s = on!(self, reply);
        let r = s.path(ino.0).and_then(|rel| {
            File::open(s.full(&rel))
                .and_then(|d| d.sync_all())
                .map_err(|e| errno(&e))
        });
        empty(r, reply)
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let backing = on!(self, reply).backing.clone();
        let c = std::ffi::CString::new(backing.as_os_str().as_bytes()).expect("no NUL in a path");
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: `c` is a valid C string and `st` a valid statvfs to fill.
        if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
            return reply.error(errno(&std::io::Error::last_os_error()));
        }
        reply.statfs(
            st.f_blocks,
            st.f_bfree,
            st.f_bavail,
            st.f_files,
            st.f_ffree,
            st.f_bsize as u32,
            st.f_namemax as u32,
            st.f_frsize as u32,
        );
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        use std::os::fd::AsRawFd;
        let mut s = on!(self, reply);
        let Some((_, f)) = s.handles.get(&fh.0).cloned() else {
            return reply.error(Errno::EBADF);
        };
        // SAFETY: a valid descriptor; the kernel checks the arguments.
        let r = unsafe {
            libc::fallocate(
                f.as_raw_fd(),
                mode,
                offset as libc::off_t,
                length as libc::off_t,
            )
        };
        if r != 0 {
            return reply.error(errno(&std::io::Error::last_os_error()));
        }
        if mode & libc::FALLOC_FL_KEEP_SIZE == 0 {
            if let Some(p) = s.pending.get_mut(&ino.0) {
                p.size = p.size.max(offset + length);
            }
        }
        reply.ok();
    }
}

/// A mounted power-loss file system. Dropping it unmounts.
pub struct LazyFs {
    state: Arc<Mutex<State>>,
    session: Option<BackgroundSession>,
    mount: PathBuf,
}

impl std::fmt::Debug for LazyFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LazyFs")
            .field("mount", &self.mount)
            .finish()
    }
}

impl LazyFs {
    /// Mounts a power-loss file system over `backing` at `mount` (both directories,
    /// created if missing). Needs `/dev/fuse` and root.
    pub fn mount(backing: &Path, mount: &Path) -> Result<LazyFs, Error> {
        Self::mount_with(backing, mount, SYNC_LATENCY)
    }

    /// [`Self::mount`] with each sync taking `sync_latency` before it makes anything
    /// durable.
    fn mount_with(backing: &Path, mount: &Path, sync_latency: Duration) -> Result<LazyFs, Error> {
        for d in [backing, mount] {
            std::fs::create_dir_all(d).map_err(|e| Error::io(d.display(), e))?;
        }
        if !Path::new("/dev/fuse").exists() {
            return Err(Error::Unavailable(
                "no /dev/fuse (power loss needs FUSE)".into(),
            ));
        }
        let mut paths = HashMap::new();
        let mut inos = HashMap::new();
        paths.insert(ROOT, PathBuf::new());
        inos.insert(PathBuf::new(), ROOT);
        let state = Arc::new(Mutex::new(State {
            backing: backing.to_path_buf(),
            paths,
            inos,
            next_ino: ROOT + 1,
            pending: HashMap::new(),
            handles: HashMap::new(),
            next_fh: 1,
            lost_bytes: 0,
            off: false,
        }));
        let mut config = Config::default();
        config.mount_options = vec![
            MountOption::FSName("chorus-lazyfs".into()),
            MountOption::RW,
            MountOption::NoDev,
            MountOption::NoSuid,
        ];
        config.acl = fuser::SessionACL::All;
        // Several requests at once: a sync of the backing disk (see `fsync`) must not
        // hold up a write.
        config.n_threads = Some(4);
        let session = fuser::spawn_mount(
            Lazy {
                state: state.clone(),
                sync_latency,
            },
            mount,
            &config,
        )
        .map_err(|e| Error::io(format!("mount lazyfs at {}", mount.display()), e))?;
        Ok(LazyFs {
            state,
            session: Some(session),
            mount: mount.to_path_buf(),
        })
    }

    /// Cuts the power: from now on every call fails with EIO, and every write not yet
    /// synced is dropped; returns the bytes dropped. Kill the node's processes next, then
    /// [`LazyFs::restore_power`].
    pub fn cut_power(&self) -> u64 {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let n: u64 = s
            .pending
            .values()
            .flat_map(|p| p.writes.iter())
            .map(|w| w.1.len() as u64)
            .sum();
        s.off = true;
        s.pending.clear();
        s.lost_bytes += n;
        n
    }

    /// Restores the power (the node's processes are gone: their open files with them).
    pub fn restore_power(&self) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.handles.clear();
        s.off = false;
    }

    /// Drops every write not yet synced, as a power loss does; returns the bytes dropped.
    /// Call it only while no process uses the mount.
    pub fn lose_unsynced(&self) -> u64 {
        let n = self.cut_power();
        self.restore_power();
        n
    }

    /// Bytes written and not yet synced, now.
    pub fn unsynced_bytes(&self) -> u64 {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.pending
            .values()
            .flat_map(|p| p.writes.iter())
            .map(|w| w.1.len() as u64)
            .sum()
    }

    /// Unmounts; writes not yet synced are dropped, as at a power loss.
    pub fn unmount(mut self) -> Result<(), Error> {
        self.shut()
    }

    fn shut(&mut self) -> Result<(), Error> {
        match self.session.take() {
            Some(s) => chorus_fs::fuse::unmount_session(&self.mount, s, UNMOUNT_WAIT)
                .map_err(|e| Error::io(self.mount.display(), e)),
            None => Ok(()),
        }
    }
}

impl Drop for LazyFs {
    fn drop(&mut self) {
        let _ = self.shut();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// Whether FUSE mounts can be made here (root and /dev/fuse); says so when not, and
    /// fails instead with CHORUS_REQUIRE_FUSE=1.
    fn fuse_here() -> bool {
        let root = unsafe { libc::geteuid() } == 0;
        if root && Path::new("/dev/fuse").exists() {
            return true;
        }
        assert!(
            std::env::var("CHORUS_REQUIRE_FUSE").as_deref() != Ok("1"),
            "CHORUS_REQUIRE_FUSE=1 but there is no /dev/fuse or no root"
        );
        eprintln!("skipped: needs root and /dev/fuse");
        false
    }

    /// Unsynced writes vanish at a power loss; synced ones, metadata and truncations
    /// stay. Needs root and /dev/fuse (skipped otherwise, unless CHORUS_REQUIRE_FUSE=1).
    #[test]
    fn a_power_loss_drops_exactly_what_was_not_synced() {
        if !fuse_here() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let (backing, mnt) = (dir.path().join("backing"), dir.path().join("mnt"));
        let fs = LazyFs::mount(&backing, &mnt).unwrap();
        std::fs::create_dir(mnt.join("d")).unwrap();
        let mut f = std::fs::File::create(mnt.join("d/a")).unwrap();
        f.write_all(b"synced").unwrap();
        f.sync_data().unwrap();
        f.write_all(b" and not").unwrap();
        assert_eq!(std::fs::read(mnt.join("d/a")).unwrap(), b"synced and not");
        // Not on the backing disk yet.
        assert_eq!(std::fs::read(backing.join("d/a")).unwrap(), b"synced");
        let mut g = std::fs::File::create(mnt.join("d/b")).unwrap();
        g.write_all(b"never synced").unwrap();
        std::fs::rename(mnt.join("d/b"), mnt.join("d/c")).unwrap();
        assert_eq!(std::fs::read(mnt.join("d/c")).unwrap(), b"never synced");
        assert_eq!(fs.unsynced_bytes(), 8 + 12);
        drop((f, g));
        assert_eq!(fs.lose_unsynced(), 20);
        assert_eq!(std::fs::read(mnt.join("d/a")).unwrap(), b"synced");
        // The file's creation and rename survive, its bytes do not.
        assert_eq!(std::fs::read(mnt.join("d/c")).unwrap(), b"");
        // A synced overwrite in the middle, a truncation.
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(mnt.join("d/a"))
            .unwrap();
        f.write_all_at(b"S", 0).unwrap();
        f.sync_all().unwrap();
        f.set_len(3).unwrap();
        f.write_all_at(b"zzz", 10).unwrap();
        assert_eq!(fs.lose_unsynced(), 3);
        assert_eq!(std::fs::read(mnt.join("d/a")).unwrap(), b"Syn");
        drop(f);
        fs.unmount().unwrap();
        assert_eq!(std::fs::read(backing.join("d/a")).unwrap(), b"Syn");
    }

    /// A sync under way does not hold up a write to another file (a disk's flush does not
    /// stop writes to the page cache): with the mount serving one call at a time, the
    /// ordered driver's next batch waited for the sync before it, and its round sent no
    /// heartbeat meanwhile.
    #[test]
    fn a_write_does_not_wait_for_a_sync_under_way() {
        if !fuse_here() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let (backing, mnt) = (dir.path().join("backing"), dir.path().join("mnt"));
        let slow = Duration::from_millis(800);
        let fs = LazyFs::mount_with(&backing, &mnt, slow).unwrap();
        let mut a = std::fs::File::create(mnt.join("a")).unwrap();
        let mut b = std::fs::File::create(mnt.join("b")).unwrap();
        a.write_all(b"synced slowly").unwrap();
        let start = std::time::Instant::now();
        let syncer = std::thread::spawn(move || {
            a.sync_data().unwrap();
            start.elapsed()
        });
        std::thread::sleep(Duration::from_millis(100));
        let t = std::time::Instant::now();
        b.write_all(b"written meanwhile").unwrap();
        let wrote = t.elapsed();
        let synced = syncer.join().unwrap();
        assert!(synced >= slow, "the sync took {synced:?}");
        assert!(
            wrote < Duration::from_millis(400),
            "a write waited {wrote:?} for a sync of another file"
        );
        assert_eq!(std::fs::read(backing.join("a")).unwrap(), b"synced slowly");
        assert_eq!(fs.lose_unsynced(), 17);
        drop(b);
        fs.unmount().unwrap();
    }

    /// An unmount while a file is still open on the mount waits for it to close (as a
    /// forked child's copy of a descriptor closes when it execs) instead of failing.
    #[test]
    fn an_unmount_waits_for_the_mounts_last_user() {
        if !fuse_here() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let (backing, mnt) = (dir.path().join("backing"), dir.path().join("mnt"));
        let fs = LazyFs::mount(&backing, &mnt).unwrap();
        let f = std::fs::File::create(mnt.join("held")).unwrap();
        let start = std::time::Instant::now();
        let holder = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            drop(f);
        });
        fs.unmount().unwrap();
        assert!(start.elapsed() >= Duration::from_millis(300));
        holder.join().unwrap();
        assert!(backing.join("held").exists());
    }
}
