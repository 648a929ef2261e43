//! The file system as a kernel mount (FUSE, through the `fuser` crate): what lets real
//! programs — shells, `fio`, SQLite, PostgreSQL — use it (PolarFS section 3.1 links
//! libpfs into the database; a FUSE mount is the same library behind the kernel's VFS).
//!
//! Each kernel request is answered from a [`Pfs`]:
//! - inode numbers are metaobject identifiers (the root's is 1, as FUSE wants);
//! - file handles are the [`Pfs`]'s file descriptors;
//! - files are opened `FOPEN_DIRECT_IO`: the kernel keeps no page cache of their data,
//!   so every read reaches the volume (a reading host sees the writer's in-place
//!   writes at once) and every write is on the volume before it is answered (the
//!   volume acknowledges a write once a majority of a chunk's replicas hold it); what
//!   `fsync` has left to do is journal the size writes grew a file to (see
//!   [`Pfs::fsync`]), which `close` does too;
//! - attributes and names are cached by the kernel for [`MountOptions::ttl`], and a
//!   poller replays the journal every [`MountOptions::poll`]: a reading host sees the
//!   writer's metadata changes within about the sum of the two.
//!
//! Concurrency: data reads and writes into blocks a file owns (within its size) are
//! planned under the file system's lock and done outside it, so requests of several
//! kernel threads reach the volume together. Everything that changes metadata — and
//! the poller's replay — waits for data I/O in flight first (`gate`), so a block a
//! truncate frees is never written after it was handed to another file.
//!
//! Not offered, each with a clear errno: hard and symbolic links and device nodes
//! (`EPERM`), extended attributes (`ENOSYS` to the kernel, which then answers
//! `EOPNOTSUPP`), shared writable `mmap` (the kernel refuses it on direct-I/O files
//! with `ENODEV`), `RENAME_EXCHANGE` and `fallocate` modes other than 0 and
//! `FALLOC_FL_KEEP_SIZE` (`EOPNOTSUPP`); ownership is the mount point's (changing it is
//! `EPERM`), access times are not kept.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, BackgroundSession, Config, Errno, FileAttr, FileHandle, FileType, Filesystem,
    FopenFlags, Generation, INodeNo, KernelConfig, LockOwner, MountOption, OpenAccMode,
    OpenFlags as FuseOpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};

use crate::meta::{FileKind, NAME_MAX};
use crate::pfs::{read_pieces, write_pieces, Access, FsOpError, OpenFlags, Pfs, Stat};

/// How a mount behaves.
#[derive(Clone, Debug)]
pub struct MountOptions {
    /// How long the kernel may cache names and attributes.
    pub ttl: Duration,
    /// How often the journal's anchor is polled (and new records replayed).
    pub poll: Duration,
    /// Kernel request threads.
    pub threads: usize,
    /// The owner every file shows (the mount point's by default).
    pub uid: u32,
    /// The group every file shows.
    pub gid: u32,
    /// The name shown in the mount table.
    pub fs_name: String,
    /// Let users other than the mounting one in (FUSE's `allow_other`: root may always;
    /// others need `user_allow_other` in /etc/fuse.conf). The kernel then checks the
    /// permission bits against [`MountOptions::uid`] and [`MountOptions::gid`].
    pub allow_other: bool,
}

impl MountOptions {
    /// Defaults for a mount at `dir`: owner and group of `dir`, 1 s of kernel caching, a
    /// poll every 100 ms, 8 request threads.
    pub fn for_dir(dir: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(dir)?;
        Ok(Self {
            ttl: Duration::from_secs(1),
            poll: Duration::from_millis(100),
            threads: 8,
            uid: m.uid(),
            gid: m.gid(),
            fs_name: "chorus".into(),
            allow_other: false,
        })
    }
}

/// The FUSE side of a mounted [`Pfs`] (see the module docs). Invariant: `gate` is taken
/// before `fs` whenever both are held (data I/O: shared; metadata changes: exclusive).
struct Fuse {
    fs: Arc<Mutex<Pfs>>,
    gate: Arc<RwLock<()>>,
    opts: MountOptions,
    read_only: bool,
}

fn errno(e: &FsOpError) -> Errno {
    Errno::from_i32(e.errno())
}

fn time(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH
    }
}

fn ns(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

fn kind(k: FileKind) -> FileType {
    match k {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
    }
}

/// How files are opened: direct I/O (no page cache), and writes within the file's
/// size to one file in parallel (the kernel otherwise takes the file's lock for each
/// direct write; writes past the end stay one at a time).
const OPEN_FLAGS: FopenFlags =
    FopenFlags::FOPEN_DIRECT_IO.union(FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES);

/// `FALLOC_FL_KEEP_SIZE`.
const KEEP_SIZE: i32 = 1;
/// `RENAME_NOREPLACE`.
const NO_REPLACE: u32 = 1;

/// Answers a call that returns nothing.
fn done(r: Result<(), FsOpError>, reply: ReplyEmpty) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(&e)),
    }
}

impl Fuse {
    /// Answers a call that gives attributes.
    fn attr_reply(&self, r: Result<Stat, FsOpError>, reply: ReplyAttr) {
        match r {
            Ok(s) => reply.attr(&self.opts.ttl, &self.attr(&s)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// Answers a call that names an inode.
    fn entry(&self, r: Result<Stat, FsOpError>, reply: ReplyEntry) {
        match r {
            Ok(s) => reply.entry(&self.opts.ttl, &self.attr(&s), Generation(0)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Pfs> {
        self.fs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs a call that may change metadata: after data I/O in flight, alone.
    fn change<T>(&self, f: impl FnOnce(&mut Pfs) -> Result<T, FsOpError>) -> Result<T, FsOpError> {
        let _gate = self.gate.write().unwrap_or_else(|p| p.into_inner());
        f(&mut self.lock())
    }

    fn attr(&self, s: &Stat) -> FileAttr {
        FileAttr {
            ino: INodeNo(s.ino),
            size: s.size,
            blocks: s.size.div_ceil(512),
            atime: time(s.mtime_ns),
            mtime: time(s.mtime_ns),
            ctime: time(s.ctime_ns),
            crtime: time(s.ctime_ns),
            kind: kind(s.kind),
            perm: (s.mode & 0o7777) as u16,
            nlink: s.nlink,
            uid: self.opts.uid,
            gid: self.opts.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    fn flags(&self, f: FuseOpenFlags) -> OpenFlags {
        let (read, write) = match f.acc_mode() {
            OpenAccMode::O_RDONLY => (true, false),
            OpenAccMode::O_WRONLY => (false, true),
            OpenAccMode::O_RDWR => (true, true),
        };
        OpenFlags {
            read,
            write,
            truncate: f.0 & libc::O_TRUNC != 0,
            append: f.0 & libc::O_APPEND != 0,
            ..OpenFlags::default()
        }
    }
}

impl Filesystem for Fuse {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Larger requests where the kernel allows them (it answers with what it takes).
        let _ = config.set_max_write(1 << 20);
        Ok(())
    }

    fn destroy(&mut self) {
        if let Err(e) = self.change(|p| p.sync()) {
            tracing::warn!("journaling file sizes at unmount: {e}");
        }
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.entry(self.lock().lookup_in(parent.0, name.as_bytes()), reply)
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.attr_reply(self.lock().stat_ino(ino.0), reply)
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        if uid.is_some_and(|u| u != self.opts.uid) || gid.is_some_and(|g| g != self.opts.gid) {
            return reply.error(Errno::EPERM);
        }
        let r = self.change(|p| {
            if let Some(len) = size {
                p.truncate_ino(ino.0, len)?;
            }
            if let Some(m) = mode {
                p.chmod_ino(ino.0, m)?;
            }
            if let Some(t) = mtime {
                let t = match t {
                    TimeOrNow::Now => SystemTime::now(),
                    TimeOrNow::SpecificTime(t) => t,
                };
                p.set_mtime_ino(ino.0, ns(t))?;
            }
            p.stat_ino(ino.0)
        });
        self.attr_reply(r, reply)
    }

    fn mknod(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        if mode & libc::S_IFMT != libc::S_IFREG {
            // Only regular files and directories exist here.
            return reply.error(Errno::EPERM);
        }
        let r =
            self.change(|p| p.create_in(parent.0, name.as_bytes(), FileKind::File, mode & !umask));
        self.entry(r, reply)
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
        let r =
            self.change(|p| p.create_in(parent.0, name.as_bytes(), FileKind::Dir, mode & !umask));
        self.entry(r, reply)
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        done(
            self.change(|p| p.unlink_in(parent.0, name.as_bytes())),
            reply,
        )
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        done(
            self.change(|p| p.rmdir_in(parent.0, name.as_bytes())),
            reply,
        )
    }

    fn symlink(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _link_name: &OsStr,
        _target: &Path,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EPERM);
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
        let bits = flags.bits();
        if bits & !NO_REPLACE != 0 {
            return reply.error(Errno::from_i32(libc::EOPNOTSUPP));
        }
        let r = self.change(|p| {
            p.rename_in(
                parent.0,
                name.as_bytes(),
                newparent.0,
                newname.as_bytes(),
                bits & NO_REPLACE != 0,
            )
        });
        done(r, reply)
    }

    fn link(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _newparent: INodeNo,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EPERM);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: FuseOpenFlags, reply: ReplyOpen) {
        let f = self.flags(flags);
        // Only a truncating open changes metadata (and waits for data I/O in flight).
        let r = if f.truncate {
            self.change(|p| p.open_ino(ino.0, f))
        } else {
            self.lock().open_ino(ino.0, f)
        };
        match r {
            Ok(fd) => reply.opened(FileHandle(fd), OPEN_FLAGS),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: FuseOpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let _gate = self.gate.read().unwrap_or_else(|p| p.into_inner());
        let (extents, dev) = {
            let p = self.lock();
            (p.read_extents(fh.0, offset, size as usize), p.device())
        };
        let r = extents.and_then(|e| {
            let mut buf = vec![0u8; e.iter().map(|x| x.len).sum()];
            read_pieces(dev.as_ref(), &e, &mut buf).map(|_| buf)
        });
        match r {
            Ok(b) => reply.data(&b),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: FuseOpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let fast = {
            let gate = self.gate.read().unwrap_or_else(|p| p.into_inner());
            let (extents, dev) = {
                let p = self.lock();
                (p.write_extents(fh.0, offset, data.len()), p.device())
            };
            match extents {
                Ok(Some(e)) => Some(write_pieces(dev.as_ref(), &e, data)),
                Ok(None) => None,
                Err(e) => Some(Err(e)),
            }
            .map(|r| (r, gate))
        };
        // A write that extends the file or fills a hole changes metadata.
        let r = match fast {
            Some((r, _gate)) => r.map(|()| data.len()),
            None => self.change(|p| p.pwrite(fh.0, data, offset)),
        };
        match r {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: FuseOpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        // Journals the size if writes grew the file (readers then see it): a
        // transaction, after data I/O in flight; otherwise only the descriptor goes.
        let r = {
            let mut p = self.lock();
            (p.pending_sizes() == 0).then(|| p.close(fh.0))
        };
        done(r.unwrap_or_else(|| self.change(|p| p.close(fh.0))), reply)
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Every write was durable on a majority of the replicas before it was answered;
        // what is left is the size writes grew files to, journaled here (a transaction,
        // after data I/O in flight, only if there is one).
        let r = {
            let p = self.lock();
            (p.pending_sizes() == 0).then(|| p.fstat(fh.0).map(|_| ()))
        };
        done(r.unwrap_or_else(|| self.change(|p| p.fsync(fh.0))), reply)
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: FuseOpenFlags, reply: ReplyOpen) {
        match self.lock().parent_ino(ino.0) {
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(errno(&e)),
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
        let p = self.lock();
        let entries = match p.readdir_ino(ino.0) {
            Ok(e) => e,
            Err(e) => return reply.error(errno(&e)),
        };
        let parent = p.parent_ino(ino.0).unwrap_or(ino.0);
        drop(p);
        let mut all = vec![
            (ino.0, FileType::Directory, b".".to_vec()),
            (parent, FileType::Directory, b"..".to_vec()),
        ];
        all.extend(entries.into_iter().map(|e| (e.ino, kind(e.kind), e.name)));
        for (i, (ino, k, name)) in all.into_iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(ino), i as u64 + 1, k, OsStr::from_bytes(&name)) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Metadata transactions are committed to the journal before they are answered;
        // sizes grown by writes are journaled here.
        done(self.change(|p| p.sync()), reply)
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let u = self.lock().usage();
        let per = u.block_bytes / 4096;
        reply.statfs(
            u.blocks * per,
            u.free_blocks * per,
            u.free_blocks * per,
            u.inodes,
            u.free_inodes,
            4096,
            NAME_MAX as u32,
            4096,
        );
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let s = match self.lock().stat_ino(ino.0) {
            Ok(s) => s,
            Err(e) => return reply.error(errno(&e)),
        };
        let m = mask.bits() as u32 & 7;
        if m & 2 != 0 && self.read_only {
            return reply.error(Errno::from_i32(libc::EROFS));
        }
        if (s.mode >> 6) & m != m {
            return reply.error(Errno::EACCES);
        }
        reply.ok();
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
        let f = OpenFlags {
            truncate: false,
            ..self.flags(FuseOpenFlags(flags))
        };
        let exclusive = flags & libc::O_EXCL != 0;
        let truncate = flags & libc::O_TRUNC != 0;
        let r = self.change(|p| {
            let s = match p.create_in(parent.0, name.as_bytes(), FileKind::File, mode & !umask) {
                Err(FsOpError::Exists(_)) if !exclusive => {
                    let s = p.lookup_in(parent.0, name.as_bytes())?;
                    if truncate {
                        p.truncate_ino(s.ino, 0)?;
                    }
                    p.stat_ino(s.ino)?
                }
                r => r?,
            };
            let fd = p.open_ino(s.ino, f)?;
            Ok((s, fd))
        });
        match r {
            Ok((s, fd)) => reply.created(
                &self.opts.ttl,
                &self.attr(&s),
                Generation(0),
                FileHandle(fd),
                OPEN_FLAGS,
            ),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        if mode & !KEEP_SIZE != 0 {
            return reply.error(Errno::from_i32(libc::EOPNOTSUPP));
        }
        let r = self.change(|p| {
            if mode & KEEP_SIZE != 0 {
                p.fallocate_keep_size(fh.0, offset, length)
            } else {
                p.fallocate(fh.0, offset, length)
            }
        });
        done(r, reply)
    }
}

/// How long [`Mount::unmount`] waits for the mount's last users to let go.
const UNMOUNT_WAIT: Duration = Duration::from_secs(10);

/// Unmounts `dir`, where `session` is mounted, and joins the session's thread.
///
/// `umount(2)` answers `EBUSY` while anything still holds the mount: a file a process
/// has open on it, or the copy of every descriptor that a child forked by another
/// thread keeps until it execs (test binaries and servers spawn commands from other
/// threads). Those go by themselves, so this waits up to `wait` for the mount to be
/// unused (`MNT_EXPIRE` tells without unmounting) before unmounting; fuser's own
/// unmount fails at the first `EBUSY` and gives the session up. Not being root, it
/// unmounts at once through `fusermount3`, which cannot tell.
pub fn unmount_session(
    dir: &Path,
    session: BackgroundSession,
    wait: Duration,
) -> std::io::Result<()> {
    let named = |e: std::io::Error, busy: bool| {
        let why = if busy {
            format!(" (still in use after {wait:?})")
        } else {
            String::new()
        };
        std::io::Error::new(e.kind(), format!("unmount {}: {e}{why}", dir.display()))
    };
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|e| named(std::io::Error::other(e), false))?;
    let deadline = std::time::Instant::now() + wait;
    loop {
        // SAFETY: `path` is a NUL-terminated string that outlives the call.
        let r = unsafe { libc::umount2(path.as_ptr(), libc::MNT_EXPIRE) };
        let e = std::io::Error::last_os_error();
        match (r, e.raw_os_error()) {
            // Unused (and now marked expired), or unmounted by this very call (a mount
            // marked expired and unused since, by an earlier call here).
            (0, _) => return session.join().map_err(|e| named(e, false)),
            (_, Some(libc::EAGAIN)) | (_, Some(libc::EPERM)) => {
                return session.umount_and_join().map_err(|e| named(e, false))
            }
            (_, Some(libc::EBUSY)) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            // Not a mount point any more: unmounted from outside; the session ends.
            (_, Some(libc::EINVAL)) => return session.join().map_err(|e| named(e, false)),
            (_, Some(libc::EBUSY)) => return Err(named(e, true)),
            _ => return Err(named(e, false)),
        }
    }
}

/// A mounted file system: the kernel session and the poller. Dropping it unmounts.
pub struct Mount {
    /// Where it is mounted.
    dir: PathBuf,
    session: Option<BackgroundSession>,
    stop: Arc<AtomicBool>,
    poller: Option<JoinHandle<()>>,
    fs: Arc<Mutex<Pfs>>,
}

impl Mount {
    /// The mounted file system (its counters, the decision it knows).
    pub fn fs(&self) -> Arc<Mutex<Pfs>> {
        self.fs.clone()
    }

    /// Whether the kernel session is still running (it ends when the mount point is
    /// unmounted from outside, e.g. `chorus fs umount` or `umount`).
    pub fn is_mounted(&self) -> bool {
        self.session
            .as_ref()
            .is_some_and(|s| !s.guard.is_finished())
    }

    /// Unmounts and waits for the session and the poller to end.
    pub fn unmount(mut self) -> std::io::Result<()> {
        self.shut()
    }

    fn shut(&mut self) -> std::io::Result<()> {
        self.stop.store(true, Ordering::SeqCst);
        // The mount first: the poller may be waiting on the volume.
        let r = match self.session.take() {
            Some(s) if !s.guard.is_finished() => unmount_session(&self.dir, s, UNMOUNT_WAIT),
            Some(s) => s.join(),
            None => Ok(()),
        };
        if let Some(p) = self.poller.take() {
            let _ = p.join();
        }
        r
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = self.shut();
    }
}

/// Mounts `fs` at `dir` through FUSE and starts polling the journal (see the module
/// docs). Needs `/dev/fuse` and the right to mount (root, or `fusermount3`).
pub fn mount(fs: Pfs, dir: &Path, opts: MountOptions) -> std::io::Result<Mount> {
    let read_only = fs.mode() == Access::ReadOnly;
    let fs = Arc::new(Mutex::new(fs));
    let gate = Arc::new(RwLock::new(()));
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName(opts.fs_name.clone()),
        MountOption::Subtype("chorus".into()),
        MountOption::DefaultPermissions,
        MountOption::NoDev,
        MountOption::NoSuid,
        if read_only {
            MountOption::RO
        } else {
            MountOption::RW
        },
    ];
    if opts.allow_other {
        config.acl = fuser::SessionACL::All;
    }
    config.n_threads = Some(opts.threads.max(1));
    let stop = Arc::new(AtomicBool::new(false));
    let poller = {
        let (fs, gate, stop, every) = (fs.clone(), gate.clone(), stop.clone(), opts.poll);
        std::thread::Builder::new()
            .name("chorus-fs-poll".into())
            .spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    std::thread::sleep(every);
                    let _gate = gate.write().unwrap_or_else(|p| p.into_inner());
                    let mut p = fs.lock().unwrap_or_else(|p| p.into_inner());
                    if let Err(e) = p.refresh() {
                        tracing::warn!("polling the journal: {e}");
                    }
                }
            })?
    };
    let f = Fuse {
        fs: fs.clone(),
        gate,
        opts,
        read_only,
    };
    let session = match fuser::spawn_mount(f, dir, &config) {
        Ok(s) => s,
        Err(e) => {
            stop.store(true, Ordering::SeqCst);
            let _ = poller.join();
            return Err(e);
        }
    };
    Ok(Mount {
        dir: dir.to_path_buf(),
        session: Some(session),
        stop,
        poller: Some(poller),
        fs,
    })
}
