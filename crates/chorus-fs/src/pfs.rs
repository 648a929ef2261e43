//! The file-system API of PolarFS Fig. 3 (libpfs), in Rust: a mounted file system
//! ([`Pfs`]) with paths, file descriptors, and data I/O to the volume.
//!
//! Every metadata change is one transaction ([`crate::coord`]): resolved against the
//! metadata in memory, made, and committed to the journal; if another host took the
//! journal over meanwhile, it is rolled back, the other host's transactions are
//! replayed, and it is tried again (Fig. 8, step 5). Data I/O goes straight to the
//! volume: a write into blocks the file already owns (preallocated by `fallocate`, or
//! written before) and within its size needs no transaction at all (section 4: database
//! files are preallocated so that their writes touch no metadata). A write that extends
//! the file or lands in a hole allocates blocks and sets the size in a transaction; a
//! block that held another file's data is zeroed before it is given out, and bytes
//! between the old end and a write past it are zeroed before the size moves, so a file
//! never shows bytes it was not given.
//!
//! Known limits (each a clear error, never a wrong answer): no hard or symbolic links,
//! no extended attributes, no `mmap` (the FUSE mount answers those); an open file that is unlinked or renamed over is gone at once (its
//! descriptors answer `ESTALE`), and writes within a file's size leave its mtime as it
//! was.

use std::collections::HashMap;
use std::sync::Arc;

use crate::coord::{CommitError, Node};
use crate::device::Device;
use crate::index::Index;
use crate::layout::{FsError, Geometry};
use crate::meta::{valid_name, Dirent, FileKind, Inode, Kind, Meta, MetaId, Tag, NAME_MAX};

mod ino;
pub use ino::Usage;

/// How a host mounts the file system.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// The one writing host: it takes the journal at mount.
    ReadWrite,
    /// A reading host: it never writes the volume, and [`Pfs::refresh`] replays what the
    /// writer committed.
    ReadOnly,
}

/// Why a file-system call failed; [`FsOpError::errno`] gives the POSIX error.
#[derive(Debug, thiserror::Error)]
pub enum FsOpError {
    /// No such file or directory.
    #[error("{0}: no such file or directory")]
    NotFound(String),
    /// The name exists already.
    #[error("{0}: exists")]
    Exists(String),
    /// A path component is not a directory.
    #[error("{0}: not a directory")]
    NotDir(String),
    /// A directory where a file was needed.
    #[error("{0}: is a directory")]
    IsDir(String),
    /// The directory is not empty.
    #[error("{0}: directory not empty")]
    NotEmpty(String),
    /// A name longer than the file system holds.
    #[error("{0}: name longer than {NAME_MAX} bytes")]
    NameTooLong(String),
    /// An argument that cannot be right (a bad name, a negative seek, a move into
    /// oneself).
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// No free inode, directory entry or block.
    #[error("no space left: {0}")]
    NoSpace(String),
    /// The mount is read-only.
    #[error("read-only mount")]
    ReadOnly,
    /// No such open file.
    #[error("bad file descriptor {0}")]
    BadFd(u64),
    /// The descriptor was not opened for this.
    #[error("file descriptor {0} is not open for {1}")]
    NotOpenFor(u64, &'static str),
    /// The open file was unlinked or replaced.
    #[error("file descriptor {0}: the file is gone")]
    Stale(u64),
    /// Permission bits refuse the access asked.
    #[error("{0}: permission denied")]
    Denied(String),
    /// Another host holds the journal and keeps it.
    #[error("another host holds the journal: {0}")]
    Busy(String),
    /// Not offered by this file system (see the module docs).
    #[error("not supported: {0}")]
    Unsupported(&'static str),
    /// The volume failed or holds damage.
    #[error(transparent)]
    Fs(#[from] FsError),
}

impl From<std::io::Error> for FsOpError {
    fn from(e: std::io::Error) -> Self {
        Self::Fs(FsError::Io(e))
    }
}

impl FsOpError {
    /// The POSIX errno for this error.
    pub fn errno(&self) -> i32 {
        match self {
            Self::NotFound(_) => 2,     // ENOENT
            Self::Exists(_) => 17,      // EEXIST
            Self::NotDir(_) => 20,      // ENOTDIR
            Self::IsDir(_) => 21,       // EISDIR
            Self::NotEmpty(_) => 39,    // ENOTEMPTY
            Self::NameTooLong(_) => 36, // ENAMETOOLONG
            Self::Invalid(_) => 22,     // EINVAL
            Self::NoSpace(_) => 28,     // ENOSPC
            Self::ReadOnly => 30,       // EROFS
            Self::BadFd(_) => 9,        // EBADF
            Self::NotOpenFor(..) => 9,  // EBADF
            Self::Stale(_) => 116,      // ESTALE
            Self::Denied(_) => 13,      // EACCES
            Self::Busy(_) => 16,        // EBUSY
            Self::Unsupported(_) => 95, // EOPNOTSUPP
            Self::Fs(_) => 5,           // EIO
        }
    }
}

/// What `stat` tells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat {
    /// The inode's identifier.
    pub ino: u64,
    /// File or directory.
    pub kind: FileKind,
    /// Permission bits.
    pub mode: u32,
    /// Bytes.
    pub size: u64,
    /// Links: 1 for a file, 2 plus its subdirectories for a directory.
    pub nlink: u32,
    /// Data blocks the file owns.
    pub blocks: u64,
    /// Last data change (ns since the epoch).
    pub mtime_ns: i64,
    /// Last metadata change (ns since the epoch).
    pub ctime_ns: i64,
}

/// One directory entry, as `readdir` gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    /// The name.
    pub name: Vec<u8>,
    /// The inode's identifier.
    pub ino: u64,
    /// File or directory.
    pub kind: FileKind,
}

/// How `open` opens a file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpenFlags {
    /// Reads allowed.
    pub read: bool,
    /// Writes allowed.
    pub write: bool,
    /// Create it if missing.
    pub create: bool,
    /// With `create`: fail if it exists.
    pub exclusive: bool,
    /// Cut it to 0 bytes.
    pub truncate: bool,
    /// Writes go to the end.
    pub append: bool,
}

/// Where `lseek` counts from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Whence {
    /// From the start.
    Set,
    /// From the current offset.
    Cur,
    /// From the end.
    End,
}

#[derive(Clone, Copy, Debug)]
struct OpenFile {
    inode: MetaId,
    offset: u64,
    flags: OpenFlags,
}

/// One piece of a data transfer: `len` bytes at volume offset `volume`, or a hole
/// (`None`: reads as zeros).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    /// Where the bytes lie on the volume; `None` for a hole.
    pub volume: Option<u64>,
    /// How many bytes.
    pub len: usize,
}

/// Writes `data` to the volume at `extents` (which together hold exactly its bytes).
pub fn write_pieces(dev: &dyn Device, extents: &[Extent], data: &[u8]) -> Result<(), FsOpError> {
    let mut at = 0;
    for e in extents {
        let piece = &data[at..at + e.len];
        match e.volume {
            Some(v) => dev.write(v, piece)?,
            None => return Err(FsOpError::Invalid("a write into a hole".into())),
        }
        at += e.len;
    }
    Ok(())
}

/// Reads `extents` into the start of `buf`: the bytes read.
pub fn read_pieces(
    dev: &dyn Device,
    extents: &[Extent],
    buf: &mut [u8],
) -> Result<usize, FsOpError> {
    let mut at = 0;
    for e in extents {
        let out = &mut buf[at..at + e.len];
        match e.volume {
            Some(v) => out.copy_from_slice(&dev.read(v, e.len)?),
            None => out.fill(0),
        }
        at += e.len;
    }
    Ok(at)
}

/// A mounted file system (see the module docs).
pub struct Pfs {
    node: Node,
    dev: Arc<dyn Device>,
    g: Geometry,
    access: Access,
    index: Index,
    cwd: MetaId,
    files: HashMap<u64, OpenFile>,
    next_fd: u64,
    /// Files grown by writes into blocks they own whose new size is not journaled yet:
    /// inode → (size, mtime). A write's bytes are on the volume when it returns; the
    /// size that shows them is journaled at the file's next `fsync` or close, or with
    /// the next transaction of any kind (as a local file system makes a size durable at
    /// `fsync`). Invariant: each size is larger than the inode's in the store; the map
    /// is emptied whenever another host may have written the journal since.
    unsynced: HashMap<MetaId, (u64, i64)>,
    clock: Box<dyn Fn() -> i64 + Send>,
}

fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

impl Pfs {
    /// Mounts the file system on `dev` as host `host` (`pfs_mount`): loads the
    /// metadata, replays the journal, and for a read-write mount takes the journal.
    pub fn mount(dev: Arc<dyn Device>, host: u32, access: Access) -> Result<Self, FsOpError> {
        let node = Node::mount(dev.clone(), host)?;
        let g = node.store().superblock().geometry;
        let mut p = Self {
            node,
            dev,
            g,
            access,
            index: Index::default(),
            cwd: MetaId::ROOT,
            files: HashMap::new(),
            next_fd: 3,
            unsynced: HashMap::new(),
            clock: Box::new(now_ns),
        };
        if access == Access::ReadWrite && !p.node.acquire()? {
            return Err(FsOpError::Busy(format!(
                "host {} won it while host {host} mounted",
                p.node.decision().1.owner
            )));
        }
        p.sync_index();
        Ok(p)
    }

    /// Sets the clock that stamps mtime and ctime (tests make it deterministic).
    pub fn set_clock(&mut self, clock: Box<dyn Fn() -> i64 + Send>) {
        self.clock = clock;
    }

    /// How this host mounted the file system.
    pub fn mode(&self) -> Access {
        self.access
    }

    /// The host's coordination state (counters, the decision known).
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// Checks the metadata as this host holds it ([`crate::fsck`]).
    pub fn fsck(&self) -> crate::fsck::Report {
        crate::fsck::fsck(self.node.store())
    }

    /// Checks that the lookups kept in step with every change equal lookups built
    /// afresh from the metaobjects (tests run it after every operation).
    pub fn check_index(&self) -> Result<(), String> {
        let fresh = Index::build(self.node.store());
        if fresh == self.index {
            Ok(())
        } else {
            Err(format!(
                "the indexes kept in step differ from rebuilt ones:\nkept {:?}\nrebuilt {:?}",
                self.index, fresh
            ))
        }
    }

    /// Unmounts (`pfs_umount`): open files are closed, sizes not journaled yet are.
    pub fn umount(mut self) -> Result<(), FsOpError> {
        self.sync()
    }

    /// `pfs_mount_growfs`: after the volume grew (`chorus volume grow`), the file
    /// system grows over all of it — new chunks with their metaobjects and data blocks
    /// (see [`Node::grow`]); the chunks added (0 if the volume did not grow). Takes the
    /// journal first, like any change.
    pub fn growfs(&mut self) -> Result<u32, FsOpError> {
        if self.access == Access::ReadOnly {
            return Err(FsOpError::ReadOnly);
        }
        if !self.node.is_writer() {
            self.take_journal()?;
        }
        let added = self.node.grow()?;
        self.sync_index();
        Ok(added)
    }

    /// Replays what other hosts committed since (a reading host calls it as it polls the
    /// anchor); true if anything changed.
    pub fn refresh(&mut self) -> Result<bool, FsOpError> {
        let moved = self.node.poll()?;
        if moved {
            // Another host wrote the journal: what this host had not journaled is gone.
            self.unsynced.clear();
            self.sync_index();
        }
        Ok(moved)
    }

    /// Brings the indexes in step with the store: the records it changed since the
    /// last call, or all of them after a reload.
    fn sync_index(&mut self) {
        match self.node.take_changes() {
            None => {
                // A reload, or a growth: the geometry may be larger too.
                self.g = self.node.store().superblock().geometry;
                self.index = Index::build(self.node.store());
            }
            Some(touched) => {
                for (kind, id) in touched {
                    if let Some(m) = self.node.store().get(kind, id) {
                        self.index.update(kind, id, m);
                    }
                }
            }
        }
    }

    fn inode(&self, id: MetaId) -> Option<&Inode> {
        match self.node.store().get(Kind::Inode, id) {
            Some(Meta::Inode(i)) => Some(i),
            _ => None,
        }
    }

    /// A file's size as this host shows it: with a growth not journaled yet.
    fn size_of(&self, id: MetaId) -> u64 {
        match self.unsynced.get(&id) {
            Some(&(size, _)) => size,
            None => self.inode(id).map_or(0, |i| i.size),
        }
    }

    /// Splits `path` into the directory to start from and its components.
    fn components<'a>(&self, path: &'a str) -> Result<(MetaId, Vec<&'a [u8]>), FsOpError> {
        if path.is_empty() {
            return Err(FsOpError::NotFound(String::new()));
        }
        let start = if path.starts_with('/') {
            MetaId::ROOT
        } else {
            self.cwd
        };
        let parts = path
            .split('/')
            .filter(|c| !c.is_empty() && *c != ".")
            .map(str::as_bytes)
            .collect();
        Ok((start, parts))
    }

    /// The inode `path` names.
    fn lookup(&self, path: &str) -> Result<MetaId, FsOpError> {
        let (mut at, parts) = self.components(path)?;
        for c in parts {
            at = self.step(at, c, path)?;
        }
        Ok(at)
    }

    fn step(&self, dir: MetaId, c: &[u8], path: &str) -> Result<MetaId, FsOpError> {
        let d = self
            .inode(dir)
            .ok_or_else(|| FsOpError::NotFound(path.into()))?;
        if d.kind != FileKind::Dir {
            return Err(FsOpError::NotDir(path.into()));
        }
        if c == b".." {
            return Ok(d.parent);
        }
        if c.len() > NAME_MAX {
            return Err(FsOpError::NameTooLong(path.into()));
        }
        self.index
            .children
            .get(&dir)
            .and_then(|m| m.get(c))
            .map(|&(_, i)| i)
            .ok_or_else(|| FsOpError::NotFound(path.into()))
    }

    /// The directory holding `path`'s last component, and that component.
    fn parent_of(&self, path: &str) -> Result<(MetaId, Vec<u8>), FsOpError> {
        let (mut at, mut parts) = self.components(path)?;
        let Some(last) = parts.pop() else {
            return Err(FsOpError::Invalid(format!("{path}: names no entry")));
        };
        for c in parts {
            at = self.step(at, c, path)?;
        }
        match self.inode(at) {
            Some(i) if i.kind == FileKind::Dir => {}
            Some(_) => return Err(FsOpError::NotDir(path.into())),
            None => return Err(FsOpError::NotFound(path.into())),
        }
        if last.len() > NAME_MAX {
            return Err(FsOpError::NameTooLong(path.into()));
        }
        if !valid_name(last) {
            return Err(FsOpError::Invalid(format!(
                "{path}: not a name an entry can have"
            )));
        }
        Ok((at, last.to_vec()))
    }

    /// Runs `f` as one metadata transaction (see the module docs).
    fn txn<T>(&mut self, f: impl Fn(&mut Self) -> Result<T, FsOpError>) -> Result<T, FsOpError> {
        if self.access == Access::ReadOnly {
            return Err(FsOpError::ReadOnly);
        }
        // Sizes grown since the last transaction go with this one.
        let mut sizes = std::mem::take(&mut self.unsynced);
        for _ in 0..4 {
            if !self.node.is_writer() {
                // Another host wrote the journal: what was not journaled is gone.
                sizes.clear();
                self.take_journal()?;
            }
            let r = self.fold_sizes(&sizes).and_then(|()| f(self));
            let v = match r {
                Ok(v) => v,
                Err(e) => {
                    self.node.roll_back();
                    self.sync_index();
                    self.unsynced = sizes;
                    return Err(e);
                }
            };
            let c = self.node.commit();
            self.sync_index();
            match c {
                Ok(_) => return Ok(v),
                Err(CommitError::Lost { .. } | CommitError::NotWriter { .. }) => {
                    sizes.clear();
                    continue;
                }
                Err(CommitError::Undecided) => {
                    sizes.clear();
                    continue;
                }
                Err(CommitError::Fs(e)) => return Err(e.into()),
            }
        }
        Err(FsOpError::Busy(
            "the journal changed hands under every retry".into(),
        ))
    }

    /// Wins the journal by Disk Paxos (Fig. 8, steps 1 and 4), replaying what other
    /// hosts committed; `Busy` if another host won it meanwhile.
    fn take_journal(&mut self) -> Result<(), FsOpError> {
        let won = self.node.acquire()?;
        self.sync_index();
        if won {
            Ok(())
        } else {
            Err(FsOpError::Busy(format!(
                "host {} holds it",
                self.node.decision().1.owner
            )))
        }
    }

    /// Puts the sizes grown since the last transaction into the one under way.
    fn fold_sizes(&mut self, sizes: &HashMap<MetaId, (u64, i64)>) -> Result<(), FsOpError> {
        for (&id, &(size, mtime)) in sizes {
            if self
                .inode(id)
                .is_some_and(|i| i.kind == FileKind::File && i.size < size)
            {
                self.touch(id, |i| {
                    (i.size, i.mtime_ns, i.ctime_ns) = (size, mtime, mtime)
                })?;
            }
        }
        Ok(())
    }

    /// `fsync` (and `fdatasync`): journals the sizes files grew to by writes since the
    /// last transaction (every write's bytes are durable when it returns).
    pub fn fsync(&mut self, fd: u64) -> Result<(), FsOpError> {
        self.file(fd)?;
        self.sync()
    }

    /// Files whose size grew by writes and is not journaled yet ([`Pfs::sync`] would run
    /// a transaction if any).
    pub fn pending_sizes(&self) -> usize {
        self.unsynced.len()
    }

    /// `sync`: journals every size not journaled yet; nothing else is left to write.
    pub fn sync(&mut self) -> Result<(), FsOpError> {
        if self.unsynced.is_empty() {
            return Ok(());
        }
        self.txn(|_| Ok(()))
    }

    /// Changes a record in the transaction under way, and the indexes with it.
    fn set(&mut self, kind: Kind, id: MetaId, m: Meta) -> Result<(), FsOpError> {
        self.node
            .change(kind, id, &m)
            .map_err(|e| FsOpError::Fs(FsError::Layout(e)))?;
        self.index.update(kind, id, &m);
        Ok(())
    }

    fn alloc_inode(&mut self, i: Inode) -> Result<MetaId, FsOpError> {
        let id = *self
            .index
            .free_inodes
            .first()
            .ok_or_else(|| FsOpError::NoSpace("no free inode".into()))?;
        self.set(Kind::Inode, id, Meta::Inode(i))?;
        Ok(id)
    }

    fn link(&mut self, dir: MetaId, name: Vec<u8>, inode: MetaId) -> Result<MetaId, FsOpError> {
        let id = *self
            .index
            .free_dirents
            .first()
            .ok_or_else(|| FsOpError::NoSpace("no free directory entry".into()))?;
        self.set(
            Kind::Dirent,
            id,
            Meta::Dirent(Dirent {
                parent: dir,
                inode,
                name,
            }),
        )?;
        Ok(id)
    }

    fn touch(&mut self, id: MetaId, f: impl FnOnce(&mut Inode)) -> Result<(), FsOpError> {
        let mut i = self
            .inode(id)
            .cloned()
            .ok_or_else(|| FsOpError::NotFound(format!("inode {:#x}", id.0)))?;
        f(&mut i);
        self.set(Kind::Inode, id, Meta::Inode(i))
    }

    /// Frees a file's inode and every block it owns.
    fn free_file(&mut self, id: MetaId) -> Result<(), FsOpError> {
        let blocks: Vec<MetaId> = self
            .index
            .blocks
            .get(&id)
            .map(|m| m.values().copied().collect())
            .unwrap_or_default();
        for t in blocks {
            self.free_tag(t)?;
        }
        self.set(Kind::Inode, id, Meta::Free)
    }

    fn free_tag(&mut self, t: MetaId) -> Result<(), FsOpError> {
        self.set(
            Kind::Tag,
            t,
            Meta::Tag(Tag {
                owner: MetaId::NONE,
                file_block: 0,
                dirty: true,
            }),
        )
    }

    /// `stat`.
    pub fn stat(&self, path: &str) -> Result<Stat, FsOpError> {
        let id = self.lookup(path)?;
        Ok(self.stat_of(id))
    }

    fn stat_of(&self, id: MetaId) -> Stat {
        let i = self.inode(id).expect("a looked-up inode");
        let subdirs = self.index.children.get(&id).map_or(0, |m| {
            m.values()
                .filter(|(_, c)| self.inode(*c).is_some_and(|x| x.kind == FileKind::Dir))
                .count()
        });
        Stat {
            ino: id.0,
            kind: i.kind,
            mode: i.mode,
            size: self.size_of(id),
            nlink: match i.kind {
                FileKind::File => 1,
                FileKind::Dir => 2 + subdirs as u32,
            },
            blocks: self.index.blocks.get(&id).map_or(0, |b| b.len() as u64),
            mtime_ns: i.mtime_ns,
            ctime_ns: i.ctime_ns,
        }
    }

    /// `fstat`.
    pub fn fstat(&self, fd: u64) -> Result<Stat, FsOpError> {
        let f = self.file(fd)?;
        Ok(self.stat_of(f.inode))
    }

    /// `access`: `mode` is an `R_OK | W_OK | X_OK` mask (4, 2, 1), checked against the
    /// owner's permission bits; 0 checks existence.
    pub fn access(&self, path: &str, mode: u32) -> Result<(), FsOpError> {
        let s = self.stat(path)?;
        if (s.mode >> 6) & mode & 7 != mode & 7 {
            return Err(FsOpError::Denied(path.into()));
        }
        if mode & 2 != 0 && self.access == Access::ReadOnly {
            return Err(FsOpError::ReadOnly);
        }
        Ok(())
    }

    /// `mkdir`.
    pub fn mkdir(&mut self, path: &str, mode: u32) -> Result<(), FsOpError> {
        self.create(path, FileKind::Dir, mode).map(|_| ())
    }

    /// Creates `path` as a new file or directory in one transaction: its inode.
    fn create(&mut self, path: &str, kind: FileKind, mode: u32) -> Result<MetaId, FsOpError> {
        let (dir, name) = self.parent_of(path)?;
        self.create_at(dir, name, kind, mode, path)
    }

    /// `rmdir`.
    pub fn rmdir(&mut self, path: &str) -> Result<(), FsOpError> {
        let (dir, name) = self.parent_of(path)?;
        self.rmdir_at(dir, &name, path)
    }

    /// `readdir` of `path` (`opendir`, `readdir` until the end, `closedir`): every entry,
    /// in name order, without `.` and `..`.
    pub fn readdir(&self, path: &str) -> Result<Vec<DirEntry>, FsOpError> {
        let id = self.lookup(path)?;
        if self.inode(id).is_some_and(|i| i.kind != FileKind::Dir) {
            return Err(FsOpError::NotDir(path.into()));
        }
        Ok(self.entries(id))
    }

    /// `chdir`.
    pub fn chdir(&mut self, path: &str) -> Result<(), FsOpError> {
        let id = self.lookup(path)?;
        if self.inode(id).is_some_and(|i| i.kind != FileKind::Dir) {
            return Err(FsOpError::NotDir(path.into()));
        }
        self.cwd = id;
        Ok(())
    }

    /// `getcwd`.
    pub fn getcwd(&self) -> Result<String, FsOpError> {
        let mut parts = Vec::new();
        let mut at = self.cwd;
        while at != MetaId::ROOT {
            let parent = self
                .inode(at)
                .map(|i| i.parent)
                .ok_or_else(|| FsOpError::NotFound("the working directory".into()))?;
            let name = self
                .index
                .children
                .get(&parent)
                .and_then(|m| {
                    m.iter()
                        .find(|(_, &(_, i))| i == at)
                        .map(|(n, _)| n.clone())
                })
                .ok_or_else(|| FsOpError::NotFound("the working directory".into()))?;
            parts.push(String::from_utf8_lossy(&name).into_owned());
            at = parent;
        }
        parts.reverse();
        Ok(format!("/{}", parts.join("/")))
    }

    /// `creat`: creates (or truncates) a file and opens it for writing.
    pub fn creat(&mut self, path: &str, mode: u32) -> Result<u64, FsOpError> {
        let flags = OpenFlags {
            write: true,
            create: true,
            truncate: true,
            ..OpenFlags::default()
        };
        self.open(path, flags, mode)
    }

    /// `open`: a file descriptor.
    pub fn open(&mut self, path: &str, flags: OpenFlags, mode: u32) -> Result<u64, FsOpError> {
        if (flags.write || flags.create || flags.truncate) && self.access == Access::ReadOnly {
            return Err(FsOpError::ReadOnly);
        }
        let id = match self.lookup(path) {
            Ok(id) if flags.create && flags.exclusive => {
                let _ = id;
                return Err(FsOpError::Exists(path.into()));
            }
            Ok(id) => {
                if self.inode(id).is_some_and(|i| i.kind == FileKind::Dir) {
                    return Err(FsOpError::IsDir(path.into()));
                }
                if flags.truncate {
                    self.resize(id, 0)?;
                }
                id
            }
            Err(FsOpError::NotFound(_)) if flags.create => {
                self.create(path, FileKind::File, mode)?
            }
            Err(e) => return Err(e),
        };
        Ok(self.open_file(id, flags))
    }

    /// `close`: journals the file's size if writes grew it since the last transaction
    /// (so reading hosts see it); the descriptor is closed either way.
    pub fn close(&mut self, fd: u64) -> Result<(), FsOpError> {
        let f = self.files.remove(&fd).ok_or(FsOpError::BadFd(fd))?;
        if self.unsynced.contains_key(&f.inode) {
            self.sync()?;
        }
        Ok(())
    }

    fn file(&self, fd: u64) -> Result<OpenFile, FsOpError> {
        let f = *self.files.get(&fd).ok_or(FsOpError::BadFd(fd))?;
        match self.inode(f.inode) {
            Some(i) if i.kind == FileKind::File => Ok(f),
            _ => Err(FsOpError::Stale(fd)),
        }
    }

    /// `unlink`.
    pub fn unlink(&mut self, path: &str) -> Result<(), FsOpError> {
        let (dir, name) = self.parent_of(path)?;
        self.unlink_at(dir, &name, path)
    }

    /// `rename`: moves `from` to `to`, replacing a file there (or an empty directory,
    /// when `from` is a directory).
    pub fn rename(&mut self, from: &str, to: &str) -> Result<(), FsOpError> {
        let (fdir, fname) = self.parent_of(from)?;
        let (tdir, tname) = self.parent_of(to)?;
        self.rename_at((fdir, &fname, from), (tdir, &tname, to))
    }

    /// `truncate`.
    pub fn truncate(&mut self, path: &str, len: u64) -> Result<(), FsOpError> {
        let id = self.lookup(path)?;
        if self.inode(id).is_some_and(|i| i.kind == FileKind::Dir) {
            return Err(FsOpError::IsDir(path.into()));
        }
        self.resize(id, len)
    }

    /// `ftruncate`.
    pub fn ftruncate(&mut self, fd: u64, len: u64) -> Result<(), FsOpError> {
        let f = self.file(fd)?;
        if !f.flags.write {
            return Err(FsOpError::NotOpenFor(fd, "writing"));
        }
        self.resize(f.inode, len)
    }

    /// Where byte `at` of the file's block `tag` lies on the volume.
    fn volume_offset(&self, tag: MetaId, at: u64) -> u64 {
        self.g.block_offset(tag.chunk(), tag.index() as u64) + at
    }

    /// Zeroes bytes `from..to` of the file's owned blocks (holes read as zeros already).
    fn zero_range(&self, id: MetaId, from: u64, to: u64) -> Result<(), FsOpError> {
        let bs = self.g.block_bytes;
        let mut at = from;
        while at < to {
            let fb = at / bs;
            let end = ((fb + 1) * bs).min(to);
            if let Some(&t) = self.index.blocks.get(&id).and_then(|m| m.get(&fb)) {
                let zeros = vec![0u8; (end - at) as usize];
                self.dev
                    .write(self.volume_offset(t, at - fb * bs), &zeros)?;
            }
            at = end;
        }
        Ok(())
    }

    fn resize(&mut self, id: MetaId, len: u64) -> Result<(), FsOpError> {
        let size = self.size_of(id);
        if len > size {
            // The bytes between the old end and the new one read as zeros.
            self.zero_range(id, size, len)?;
        }
        let now = (self.clock)();
        let bs = self.g.block_bytes;
        self.txn(|p| {
            if len < size {
                let keep = len.div_ceil(bs);
                let gone: Vec<MetaId> = p
                    .index
                    .blocks
                    .get(&id)
                    .map(|m| m.range(keep..).map(|(_, &t)| t).collect())
                    .unwrap_or_default();
                for t in gone {
                    p.free_tag(t)?;
                }
            }
            p.touch(id, |i| (i.size, i.mtime_ns, i.ctime_ns) = (len, now, now))
        })
    }

    /// Gives the file blocks `first..end` it does not own yet (in a transaction already
    /// under way). A block that held other data is zeroed before the transaction can
    /// commit: all of it (`write` is `None`: `fallocate`), or, for a write of bytes
    /// `offset..end` that leaves the file `new_size` long, only the bytes below
    /// `new_size` the write does not cover (the rest lies past the end, and every
    /// growth zeroes what it uncovers in owned blocks).
    fn allocate(
        &mut self,
        id: MetaId,
        first: u64,
        end: u64,
        write: Option<(u64, u64, u64)>,
    ) -> Result<(), FsOpError> {
        let bs = self.g.block_bytes;
        for fb in first..end {
            if self
                .index
                .blocks
                .get(&id)
                .is_some_and(|m| m.contains_key(&fb))
            {
                continue;
            }
            let t = self
                .index
                .free_tag()
                .ok_or_else(|| FsOpError::NoSpace("no free data block".into()))?;
            let dirty = matches!(
                self.node.store().get(Kind::Tag, t),
                Some(Meta::Tag(Tag { dirty: true, .. }))
            );
            if dirty {
                // Not visible until the transaction commits, so zeroed before it does.
                let (b0, b1) = (fb * bs, (fb + 1) * bs);
                let spans = match write {
                    None => vec![(b0, b1)],
                    Some((offset, wend, new_size)) => vec![
                        (b0, b1.min(offset).min(new_size)),
                        (b0.max(wend), b1.min(new_size)),
                    ],
                };
                for (from, to) in spans {
                    if from < to {
                        let zeros = vec![0u8; (to - from) as usize];
                        self.dev.write(self.volume_offset(t, from - b0), &zeros)?;
                    }
                }
            }
            self.set(
                Kind::Tag,
                t,
                Meta::Tag(Tag {
                    owner: id,
                    file_block: fb,
                    dirty: true,
                }),
            )?;
        }
        Ok(())
    }

    /// `fallocate` (mode 0): the file owns every block of `offset..offset + len`
    /// afterwards, and is at least that long, so later writes there touch no metadata.
    pub fn fallocate(&mut self, fd: u64, offset: u64, len: u64) -> Result<(), FsOpError> {
        self.preallocate(fd, offset, len, false)
    }

    /// `fallocate` with `FALLOC_FL_KEEP_SIZE`: the blocks of `offset..offset + len` are
    /// the file's afterwards, its size is left as it was.
    pub fn fallocate_keep_size(&mut self, fd: u64, offset: u64, len: u64) -> Result<(), FsOpError> {
        self.preallocate(fd, offset, len, true)
    }

    fn preallocate(&mut self, fd: u64, offset: u64, len: u64, keep: bool) -> Result<(), FsOpError> {
        let f = self.file(fd)?;
        if !f.flags.write {
            return Err(FsOpError::NotOpenFor(fd, "writing"));
        }
        if len == 0 {
            return Err(FsOpError::Invalid("fallocate of 0 bytes".into()));
        }
        let end = offset
            .checked_add(len)
            .ok_or_else(|| FsOpError::Invalid("offset + len overflows".into()))?;
        let id = f.inode;
        let size = self.size_of(id);
        let grow = end > size && !keep;
        if grow {
            // The file grows to `end`: every byte past its old end reads as zeros, also
            // in blocks it already owns (a truncate keeps the block holding its new end,
            // with what was written past it).
            self.zero_range(id, size, end)?;
        }
        let bs = self.g.block_bytes;
        let now = (self.clock)();
        self.txn(|p| {
            p.allocate(id, offset / bs, end.div_ceil(bs), None)?;
            if grow {
                p.touch(id, |i| (i.size, i.ctime_ns) = (end, now))?;
            }
            Ok(())
        })
    }

    /// The volume the file system lies on.
    pub fn device(&self) -> Arc<dyn Device> {
        self.dev.clone()
    }

    /// Where bytes `offset..end` of file `id` lie, block by block.
    fn extents(&self, id: MetaId, offset: u64, end: u64) -> Vec<Extent> {
        let bs = self.g.block_bytes;
        let owned = self.index.blocks.get(&id);
        let mut out = Vec::new();
        let mut at = offset;
        while at < end {
            let fb = at / bs;
            let stop = ((fb + 1) * bs).min(end);
            let volume = owned
                .and_then(|m| m.get(&fb))
                .map(|&t| self.volume_offset(t, at - fb * bs));
            out.push(Extent {
                volume,
                len: (stop - at) as usize,
            });
            at = stop;
        }
        out
    }

    /// Where a read of up to `len` bytes at `offset` through `fd` lies on the volume
    /// (clipped at the file's end; holes read as zeros). A caller may then read the
    /// volume without holding the file system, as long as no metadata change runs
    /// meanwhile (the FUSE mount's gate).
    pub fn read_extents(&self, fd: u64, offset: u64, len: usize) -> Result<Vec<Extent>, FsOpError> {
        let f = self.file(fd)?;
        if !f.flags.read {
            return Err(FsOpError::NotOpenFor(fd, "reading"));
        }
        let size = self.size_of(f.inode);
        if offset >= size {
            return Ok(Vec::new());
        }
        let end = size.min(offset.saturating_add(len as u64));
        Ok(self.extents(f.inode, offset, end))
    }

    /// Where a write of `len` bytes at `offset` through `fd` lands on the volume, if it
    /// needs no metadata transaction (the file owns every block, and the write ends
    /// within its size: section 4's preallocated database files); `None` if it does.
    pub fn write_extents(
        &self,
        fd: u64,
        offset: u64,
        len: usize,
    ) -> Result<Option<Vec<Extent>>, FsOpError> {
        let f = self.file(fd)?;
        if !f.flags.write {
            return Err(FsOpError::NotOpenFor(fd, "writing"));
        }
        let end = offset
            .checked_add(len as u64)
            .ok_or_else(|| FsOpError::Invalid("offset + len overflows".into()))?;
        if end > self.size_of(f.inode) {
            return Ok(None);
        }
        let e = self.extents(f.inode, offset, end);
        Ok(e.iter().all(|x| x.volume.is_some()).then_some(e))
    }

    /// `pwrite`: writes `data` at `offset`; the bytes written.
    pub fn pwrite(&mut self, fd: u64, data: &[u8], offset: u64) -> Result<usize, FsOpError> {
        if data.is_empty() {
            self.file(fd)?;
            return Ok(0);
        }
        let extents = match self.write_extents(fd, offset, data.len())? {
            Some(e) => e,
            None => {
                let id = self.file(fd)?.inode;
                let (size, end) = (self.size_of(id), offset + data.len() as u64);
                let e = self.extents(id, offset, end);
                if e.iter().all(|x| x.volume.is_some()) {
                    // Past the end, into blocks the file owns: no transaction now. The
                    // bytes first (a gap before them zeroed), then the size in memory,
                    // journaled at the next fsync, close or transaction.
                    if offset > size {
                        self.zero_range(id, size, offset)?;
                    }
                    write_pieces(self.dev.as_ref(), &e, data)?;
                    let now = (self.clock)();
                    self.unsynced.insert(id, (end, now));
                    return Ok(data.len());
                }
                self.write_growing(fd, offset, data)?;
                return Ok(data.len());
            }
        };
        // The data: straight to the blocks the file owns.
        write_pieces(self.dev.as_ref(), &extents, data)?;
        Ok(data.len())
    }

    /// Writes `data` at `offset` in one transaction that gives the file the blocks and
    /// the size it needs (it extends the file or lands in a hole), zeroing the gap
    /// between the old end and the write. The bytes are written before the transaction
    /// commits, so a block given to the file never shows another file's bytes.
    fn write_growing(&mut self, fd: u64, offset: u64, data: &[u8]) -> Result<(), FsOpError> {
        let id = self.file(fd)?.inode;
        let end = offset + data.len() as u64;
        let bs = self.g.block_bytes;
        let (first, last) = (offset / bs, end.div_ceil(bs));
        let size = self.size_of(id);
        if offset > size {
            self.zero_range(id, size, offset)?;
        }
        let now = (self.clock)();
        self.txn(|p| {
            let size = p.inode(id).map_or(0, |i| i.size);
            let new_size = size.max(end);
            p.allocate(id, first, last, Some((offset, end, new_size)))?;
            p.touch(id, |i| {
                i.size = new_size;
                (i.mtime_ns, i.ctime_ns) = (now, now);
            })?;
            write_pieces(p.dev.as_ref(), &p.extents(id, offset, end), data)
        })
    }

    /// `pread`: reads into `buf` from `offset`; the bytes read (fewer at the end).
    pub fn pread(&self, fd: u64, buf: &mut [u8], offset: u64) -> Result<usize, FsOpError> {
        let extents = self.read_extents(fd, offset, buf.len())?;
        read_pieces(self.dev.as_ref(), &extents, buf)
    }

    /// `write`: at the descriptor's offset (the end with `append`), which moves past it.
    pub fn write(&mut self, fd: u64, data: &[u8]) -> Result<usize, FsOpError> {
        let f = self.file(fd)?;
        let at = if f.flags.append {
            self.size_of(f.inode)
        } else {
            f.offset
        };
        let n = self.pwrite(fd, data, at)?;
        if let Some(f) = self.files.get_mut(&fd) {
            f.offset = at + n as u64;
        }
        Ok(n)
    }

    /// `read`: at the descriptor's offset, which moves past what was read.
    pub fn read(&mut self, fd: u64, buf: &mut [u8]) -> Result<usize, FsOpError> {
        let f = self.file(fd)?;
        let n = self.pread(fd, buf, f.offset)?;
        if let Some(f) = self.files.get_mut(&fd) {
            f.offset += n as u64;
        }
        Ok(n)
    }

    /// `lseek`: the new offset.
    pub fn lseek(&mut self, fd: u64, offset: i64, whence: Whence) -> Result<u64, FsOpError> {
        let f = self.file(fd)?;
        let base = match whence {
            Whence::Set => 0,
            Whence::Cur => f.offset as i64,
            Whence::End => self.size_of(f.inode) as i64,
        };
        let at = base
            .checked_add(offset)
            .filter(|&a| a >= 0)
            .ok_or_else(|| FsOpError::Invalid(format!("seek to {base} + {offset}")))?;
        if let Some(f) = self.files.get_mut(&fd) {
            f.offset = at as u64;
        }
        Ok(at as u64)
    }
}
