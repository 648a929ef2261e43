//! The calls by inode number and name, as a FUSE mount is asked them (the kernel
//! resolves paths itself, one lookup per component), and the namespace changes the
//! path calls of Fig. 3 share with them. An inode number is the inode's [`MetaId`]; the
//! root's is 1, as FUSE wants.

use super::{DirEntry, FsOpError};
use super::{OpenFile, OpenFlags, Pfs, Stat};
use crate::meta::{valid_name, Dirent, FileKind, Inode, Kind, Meta, MetaId, NAME_MAX};

/// What `statfs` tells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    /// Bytes per data block.
    pub block_bytes: u64,
    /// Data blocks.
    pub blocks: u64,
    /// Free data blocks.
    pub free_blocks: u64,
    /// Inode slots.
    pub inodes: u64,
    /// Free inode slots.
    pub free_inodes: u64,
}

fn label(name: &[u8]) -> String {
    String::from_utf8_lossy(name).into_owned()
}

impl Pfs {
    /// The directory `dir`, or why it is not one.
    fn dir(&self, dir: MetaId) -> Result<(), FsOpError> {
        match self.inode(dir) {
            Some(i) if i.kind == FileKind::Dir => Ok(()),
            Some(_) => Err(FsOpError::NotDir(format!("inode {}", dir.0))),
            None => Err(FsOpError::NotFound(format!("inode {}", dir.0))),
        }
    }

    /// `name` as an entry of directory `dir` may be called, or why not.
    fn entry_name(&self, dir: MetaId, name: &[u8]) -> Result<(), FsOpError> {
        self.dir(dir)?;
        if name.len() > NAME_MAX {
            return Err(FsOpError::NameTooLong(label(name)));
        }
        if !valid_name(name) {
            return Err(FsOpError::Invalid(format!(
                "{}: not a name an entry can have",
                label(name)
            )));
        }
        Ok(())
    }

    /// The entry `name` of directory `dir`: (directory entry, inode).
    fn entry(&self, dir: MetaId, name: &[u8], path: &str) -> Result<(MetaId, MetaId), FsOpError> {
        self.index
            .children
            .get(&dir)
            .and_then(|m| m.get(name))
            .copied()
            .ok_or_else(|| FsOpError::NotFound(path.into()))
    }

    /// `lookup`: what `name` in directory `dir` names.
    pub fn lookup_in(&self, dir: u64, name: &[u8]) -> Result<Stat, FsOpError> {
        let dir = MetaId(dir);
        self.dir(dir)?;
        let id = self.step(dir, name, &label(name))?;
        Ok(self.stat_of(id))
    }

    /// `stat` of inode `ino`.
    pub fn stat_ino(&self, ino: u64) -> Result<Stat, FsOpError> {
        match self.inode(MetaId(ino)) {
            Some(_) if ino != 0 => Ok(self.stat_of(MetaId(ino))),
            _ => Err(FsOpError::NotFound(format!("inode {ino}"))),
        }
    }

    /// The parent directory of directory `ino` (the root's is itself).
    pub fn parent_ino(&self, ino: u64) -> Result<u64, FsOpError> {
        self.dir(MetaId(ino))?;
        Ok(self.inode(MetaId(ino)).map_or(ino, |i| i.parent.0))
    }

    /// `readdir` of directory `ino`: every entry in name order, without `.` and `..`.
    pub fn readdir_ino(&self, ino: u64) -> Result<Vec<DirEntry>, FsOpError> {
        let id = MetaId(ino);
        self.dir(id)?;
        Ok(self.entries(id))
    }

    /// Creates `name` in directory `dir` (a file or a directory) in one transaction.
    pub fn create_in(
        &mut self,
        dir: u64,
        name: &[u8],
        kind: FileKind,
        mode: u32,
    ) -> Result<Stat, FsOpError> {
        let dir = MetaId(dir);
        self.entry_name(dir, name)?;
        let id = self.create_at(dir, name.to_vec(), kind, mode, &label(name))?;
        Ok(self.stat_of(id))
    }

    /// `unlink` of `name` in directory `dir`.
    pub fn unlink_in(&mut self, dir: u64, name: &[u8]) -> Result<(), FsOpError> {
        let dir = MetaId(dir);
        self.entry_name(dir, name)?;
        self.unlink_at(dir, name, &label(name))
    }

    /// `rmdir` of `name` in directory `dir`.
    pub fn rmdir_in(&mut self, dir: u64, name: &[u8]) -> Result<(), FsOpError> {
        let dir = MetaId(dir);
        self.entry_name(dir, name)?;
        self.rmdir_at(dir, name, &label(name))
    }

    /// `rename` of `name` in `dir` to `to_name` in `to_dir`; with `no_replace`, an
    /// existing target is refused (`RENAME_NOREPLACE`).
    pub fn rename_in(
        &mut self,
        dir: u64,
        name: &[u8],
        to_dir: u64,
        to_name: &[u8],
        no_replace: bool,
    ) -> Result<(), FsOpError> {
        let (dir, to_dir) = (MetaId(dir), MetaId(to_dir));
        self.entry_name(dir, name)?;
        self.entry_name(to_dir, to_name)?;
        if no_replace && self.entry(to_dir, to_name, "").is_ok() {
            return Err(FsOpError::Exists(label(to_name)));
        }
        self.rename_at(
            (dir, name, &label(name)),
            (to_dir, to_name, &label(to_name)),
        )
    }

    /// `open` of inode `ino`: a file descriptor.
    pub fn open_ino(&mut self, ino: u64, flags: OpenFlags) -> Result<u64, FsOpError> {
        if (flags.write || flags.truncate) && self.access == crate::pfs::Access::ReadOnly {
            return Err(FsOpError::ReadOnly);
        }
        let id = MetaId(ino);
        match self.inode(id) {
            Some(i) if i.kind == FileKind::Dir => {
                return Err(FsOpError::IsDir(format!("inode {ino}")))
            }
            Some(_) if ino != 0 => {}
            _ => return Err(FsOpError::NotFound(format!("inode {ino}"))),
        }
        if flags.truncate {
            self.resize(id, 0)?;
        }
        Ok(self.open_file(id, flags))
    }

    /// Adds an open file for inode `id`: its descriptor.
    pub(super) fn open_file(&mut self, id: MetaId, flags: OpenFlags) -> u64 {
        let fd = self.next_fd;
        self.next_fd += 1;
        self.files.insert(
            fd,
            OpenFile {
                inode: id,
                offset: 0,
                flags,
            },
        );
        fd
    }

    /// `truncate` of inode `ino`.
    pub fn truncate_ino(&mut self, ino: u64, len: u64) -> Result<(), FsOpError> {
        let s = self.stat_ino(ino)?;
        if s.kind == FileKind::Dir {
            return Err(FsOpError::IsDir(format!("inode {ino}")));
        }
        self.resize(MetaId(ino), len)
    }

    /// `chmod` of inode `ino` (the permission bits).
    pub fn chmod_ino(&mut self, ino: u64, mode: u32) -> Result<(), FsOpError> {
        self.stat_ino(ino)?;
        let now = (self.clock)();
        self.txn(|p| {
            p.touch(MetaId(ino), |i| {
                (i.mode, i.ctime_ns) = (mode & 0o7777, now);
            })
        })
    }

    /// Sets inode `ino`'s modification time (`utimensat`; access times are not kept).
    pub fn set_mtime_ino(&mut self, ino: u64, mtime_ns: i64) -> Result<(), FsOpError> {
        self.stat_ino(ino)?;
        let now = (self.clock)();
        self.txn(|p| {
            p.touch(MetaId(ino), |i| {
                (i.mtime_ns, i.ctime_ns) = (mtime_ns, now);
            })
        })
    }

    /// Blocks and inodes, used and free (`statfs`).
    pub fn usage(&self) -> Usage {
        let g = self.g;
        Usage {
            block_bytes: g.block_bytes,
            blocks: (0..g.chunks()).map(|c| g.data_blocks(c)).sum(),
            free_blocks: self.index.free_blocks(),
            // Inode 0 of chunk 0 is never given out.
            inodes: g.inodes_per_chunk as u64 * g.chunks() as u64 - 1,
            free_inodes: self.index.free_inodes.len() as u64,
        }
    }

    /// The entries of directory `id`, in name order.
    pub(super) fn entries(&self, id: MetaId) -> Vec<DirEntry> {
        self.index
            .children
            .get(&id)
            .map(|m| {
                m.iter()
                    .map(|(name, &(_, ino))| DirEntry {
                        name: name.clone(),
                        ino: ino.0,
                        kind: self.inode(ino).map_or(FileKind::File, |i| i.kind),
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Creates entry `name` of directory `dir` for a new inode of `kind`, in one
    /// transaction; `path` names it in errors.
    pub(super) fn create_at(
        &mut self,
        dir: MetaId,
        name: Vec<u8>,
        kind: FileKind,
        mode: u32,
        path: &str,
    ) -> Result<MetaId, FsOpError> {
        let now = (self.clock)();
        self.txn(|p| {
            if p.entry(dir, &name, path).is_ok() {
                return Err(FsOpError::Exists(path.into()));
            }
            let id = p.alloc_inode(Inode {
                kind,
                mode: mode & 0o7777,
                size: 0,
                mtime_ns: now,
                ctime_ns: now,
                parent: if kind == FileKind::Dir {
                    dir
                } else {
                    MetaId::NONE
                },
            })?;
            p.link(dir, name.clone(), id)?;
            p.touch(dir, |d| (d.mtime_ns, d.ctime_ns) = (now, now))?;
            Ok(id)
        })
    }

    /// Removes the empty directory `name` of `dir`.
    pub(super) fn rmdir_at(
        &mut self,
        dir: MetaId,
        name: &[u8],
        path: &str,
    ) -> Result<(), FsOpError> {
        let now = (self.clock)();
        self.txn(|p| {
            let (entry, id) = p.entry(dir, name, path)?;
            if p.inode(id).is_some_and(|i| i.kind != FileKind::Dir) {
                return Err(FsOpError::NotDir(path.into()));
            }
            if p.index.children.get(&id).is_some_and(|m| !m.is_empty()) {
                return Err(FsOpError::NotEmpty(path.into()));
            }
            if id == p.cwd {
                return Err(FsOpError::Invalid(format!("{path}: the working directory")));
            }
            p.set(Kind::Dirent, entry, Meta::Free)?;
            p.set(Kind::Inode, id, Meta::Free)?;
            p.touch(dir, |d| (d.mtime_ns, d.ctime_ns) = (now, now))
        })
    }

    /// Removes the file `name` of `dir`, and frees its blocks.
    pub(super) fn unlink_at(
        &mut self,
        dir: MetaId,
        name: &[u8],
        path: &str,
    ) -> Result<(), FsOpError> {
        let now = (self.clock)();
        self.txn(|p| {
            let (entry, id) = p.entry(dir, name, path)?;
            if p.inode(id).is_some_and(|i| i.kind == FileKind::Dir) {
                return Err(FsOpError::IsDir(path.into()));
            }
            p.set(Kind::Dirent, entry, Meta::Free)?;
            p.free_file(id)?;
            p.touch(dir, |d| (d.mtime_ns, d.ctime_ns) = (now, now))
        })
    }

    /// Moves entry (`fdir`, `fname`) to (`tdir`, `tname`), replacing a file there (or an
    /// empty directory, when a directory moves); the third members name them in errors.
    pub(super) fn rename_at(
        &mut self,
        (fdir, fname, from): (MetaId, &[u8], &str),
        (tdir, tname, to): (MetaId, &[u8], &str),
    ) -> Result<(), FsOpError> {
        let now = (self.clock)();
        self.txn(|p| {
            let (entry, id) = p.entry(fdir, fname, from)?;
            let moving_dir = p.inode(id).is_some_and(|i| i.kind == FileKind::Dir);
            if moving_dir {
                // Not into itself or below it.
                let mut at = tdir;
                loop {
                    if at == id {
                        return Err(FsOpError::Invalid(format!("{from} into itself ({to})")));
                    }
                    if at == MetaId::ROOT {
                        break;
                    }
                    at = p.inode(at).map_or(MetaId::ROOT, |i| i.parent);
                }
            }
            if let Ok((tentry, tid)) = p.entry(tdir, tname, to) {
                if tid == id {
                    return Ok(());
                }
                let target = p.inode(tid).map(|i| i.kind);
                match (moving_dir, target) {
                    (false, Some(FileKind::Dir)) => return Err(FsOpError::IsDir(to.into())),
                    (true, Some(FileKind::File)) => return Err(FsOpError::NotDir(to.into())),
                    (true, Some(FileKind::Dir))
                        if p.index.children.get(&tid).is_some_and(|m| !m.is_empty()) =>
                    {
                        return Err(FsOpError::NotEmpty(to.into()))
                    }
                    _ => {}
                }
                p.set(Kind::Dirent, tentry, Meta::Free)?;
                match target {
                    Some(FileKind::File) => p.free_file(tid)?,
                    _ => p.set(Kind::Inode, tid, Meta::Free)?,
                }
            }
            p.set(
                Kind::Dirent,
                entry,
                Meta::Dirent(Dirent {
                    parent: tdir,
                    inode: id,
                    name: tname.to_vec(),
                }),
            )?;
            if moving_dir {
                p.touch(id, |d| (d.parent, d.ctime_ns) = (tdir, now))?;
            }
            p.touch(fdir, |d| (d.mtime_ns, d.ctime_ns) = (now, now))?;
            if tdir != fdir {
                p.touch(tdir, |d| (d.mtime_ns, d.ctime_ns) = (now, now))?;
            }
            Ok(())
        })
    }
}
