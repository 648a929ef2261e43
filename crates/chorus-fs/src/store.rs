//! Every metaobject of the file system in memory (PolarFS section 6.1: loaded at mount,
//! partitioned by chunk and kind, addressed by identifier and kind), with the sectors
//! they live in on the volume.
//!
//! Metaobjects change only through transactions ([`crate::journal::Op`]: the old and the
//! new record), applied here in order and rolled back in reverse from their old values.

use crate::device::Device;
use crate::journal::Op;
use crate::layout::{FsError, Superblock, PER_SECTOR, SECTOR};
use crate::meta::{
    decode_obj, decode_sector, encode_obj, encode_sector, FileKind, Inode, Kind, Meta, MetaId, Tag,
};

/// The metaobjects. Invariant: `groups[c][k]` holds chunk `c`'s records of kind
/// `Kind::ALL[k]`, as many as the geometry gives (inodes and directory entries per
/// chunk, one tag per data block of the chunk); a tag slot always holds a `Meta::Tag`,
/// an inode slot `Free` or an `Inode`, a directory-entry slot `Free` or a `Dirent`.
///
/// `touched` lists the records changed since [`MetaStore::take_touched`] last drained it
/// (in order, with repeats); it is bookkeeping for the indexes built over the store and
/// takes no part in comparing two stores.
#[derive(Clone, Debug)]
pub struct MetaStore {
    sb: Superblock,
    groups: Vec<[Vec<Meta>; 3]>,
    touched: Vec<(Kind, MetaId)>,
}

impl PartialEq for MetaStore {
    fn eq(&self, other: &Self) -> bool {
        self.sb == other.sb && self.groups == other.groups
    }
}

impl Eq for MetaStore {}

fn slot(kind: Kind) -> usize {
    kind as usize - 1
}

impl MetaStore {
    /// A fresh file system's metaobjects: everything free but the root directory
    /// (chunk 0's inode 1; inode 0 of chunk 0 is never used, its identifier meaning
    /// "none").
    pub fn fresh(sb: Superblock, now_ns: i64) -> Self {
        let g = sb.geometry;
        let mut groups: Vec<[Vec<Meta>; 3]> = (0..g.chunks())
            .map(|c| {
                let tag = Meta::Tag(Tag {
                    owner: MetaId::NONE,
                    file_block: 0,
                    dirty: false,
                });
                [
                    vec![Meta::Free; g.inodes_per_chunk as usize],
                    vec![Meta::Free; g.dirents_per_chunk as usize],
                    vec![tag; g.data_blocks(c) as usize],
                ]
            })
            .collect();
        groups[0][slot(Kind::Inode)][MetaId::ROOT.index() as usize] = Meta::Inode(Inode {
            kind: FileKind::Dir,
            mode: 0o755,
            size: 0,
            mtime_ns: now_ns,
            ctime_ns: now_ns,
            parent: MetaId::ROOT,
        });
        Self {
            sb,
            groups,
            touched: Vec::new(),
        }
    }

    /// The records changed since the last call (by apply, redo or roll back).
    pub fn take_touched(&mut self) -> Vec<(Kind, MetaId)> {
        std::mem::take(&mut self.touched)
    }

    /// The superblock.
    pub fn superblock(&self) -> &Superblock {
        &self.sb
    }

    /// Records of `kind` in chunk `c`.
    pub fn count(&self, c: u32, kind: Kind) -> usize {
        self.groups
            .get(c as usize)
            .map_or(0, |g| g[slot(kind)].len())
    }

    /// The metaobject (`id`, `kind`), if the identifier names a slot.
    pub fn get(&self, kind: Kind, id: MetaId) -> Option<&Meta> {
        self.groups
            .get(id.chunk() as usize)?
            .get(slot(kind))?
            .get(id.index() as usize)
    }

    /// Every (identifier, record) of `kind` in chunk `c`.
    pub fn iter(&self, c: u32, kind: Kind) -> impl Iterator<Item = (MetaId, &Meta)> + '_ {
        self.groups
            .get(c as usize)
            .map(|g| g[slot(kind)].as_slice())
            .unwrap_or_default()
            .iter()
            .enumerate()
            .map(move |(i, m)| (MetaId::new(c, i as u32), m))
    }

    /// Makes an operation changing (`kind`, `id`) to `new`, holding the value it has now.
    /// `None` if the identifier names no slot of that kind, or `new` is not of the kind.
    pub fn op(&self, kind: Kind, id: MetaId, new: &Meta) -> Option<Op> {
        let old = self.get(kind, id)?;
        let fits = matches!(
            (kind, new),
            (Kind::Inode, Meta::Free | Meta::Inode(_))
                | (Kind::Dirent, Meta::Free | Meta::Dirent(_))
                | (Kind::Tag, Meta::Tag(_))
        );
        fits.then(|| Op {
            kind,
            id,
            old: encode_obj(kind, old),
            new: encode_obj(kind, new),
        })
    }

    fn put(&mut self, kind: Kind, id: MetaId, rec: &[u8]) -> Result<(), String> {
        let m = decode_obj(kind, rec)?;
        let s = self
            .groups
            .get_mut(id.chunk() as usize)
            .and_then(|g| g[slot(kind)].get_mut(id.index() as usize))
            .ok_or_else(|| format!("{kind:?} {:#x} names no slot", id.0))?;
        *s = m;
        self.touched.push((kind, id));
        Ok(())
    }

    /// Applies `op` (its new value). Refused, nothing changed, if the record there is
    /// not the op's old value: the op was made against another state.
    pub fn apply(&mut self, op: &Op) -> Result<(), String> {
        let now = self
            .get(op.kind, op.id)
            .map(|m| encode_obj(op.kind, m))
            .ok_or_else(|| format!("{:?} {:#x} names no slot", op.kind, op.id.0))?;
        if now != op.old {
            return Err(format!(
                "{:?} {:#x} does not hold the operation's old value",
                op.kind, op.id.0
            ));
        }
        self.put(op.kind, op.id, &op.new)
    }

    /// Redoes `op` (its new value), whatever the record holds now: replaying a
    /// generation's records over a home copy that may already hold later values
    /// ([`crate::coord`], checkpoints).
    pub fn redo(&mut self, op: &Op) -> Result<(), String> {
        self.put(op.kind, op.id, &op.new)
    }

    /// Rolls `op` back (its old value), whatever the record holds now.
    pub fn roll_back(&mut self, op: &Op) -> Result<(), String> {
        self.put(op.kind, op.id, &op.old)
    }

    /// Where the sector holding (`kind`, `id`) lies, and the index of its first record.
    pub fn sector_of(&self, kind: Kind, id: MetaId) -> (u64, u32) {
        let g = self.sb.geometry;
        let [inodes, dirents, _] = g.meta_sectors();
        let before = match kind {
            Kind::Inode => 0,
            Kind::Dirent => inodes,
            Kind::Tag => inodes + dirents,
        };
        let s = id.index() as u64 / PER_SECTOR;
        (
            g.meta_start(id.chunk()) + (before + s) * SECTOR,
            (s * PER_SECTOR) as u32,
        )
    }

    /// The sector holding (`kind`, `id`), encoded as it is now.
    pub fn sector(&self, kind: Kind, id: MetaId) -> (u64, Vec<u8>) {
        let (offset, first) = self.sector_of(kind, id);
        let all = &self.groups[id.chunk() as usize][slot(kind)];
        let end = (first as usize + PER_SECTOR as usize).min(all.len());
        let b = encode_sector(
            self.sb.uuid,
            kind,
            id.chunk(),
            first,
            &all[first as usize..end],
        );
        (offset, b)
    }

    /// Writes every metaobject sector (`mkfs`, and checkpoints).
    pub fn write_all(&self, dev: &dyn Device) -> Result<(), FsError> {
        self.write_chunks(dev, 0)
    }

    /// Writes the metaobject sectors of chunks `from` and on (`growfs`: the new ones).
    pub fn write_chunks(&self, dev: &dyn Device, from: u32) -> Result<(), FsError> {
        for c in from..self.groups.len() as u32 {
            for kind in Kind::ALL {
                let n = self.count(c, kind);
                for first in (0..n).step_by(PER_SECTOR as usize) {
                    let (offset, b) = self.sector(kind, MetaId::new(c, first as u32));
                    dev.write(offset, &b)?;
                }
            }
        }
        Ok(())
    }

    /// Extends the store to `sb`, a larger geometry of the same file system (`growfs`):
    /// the new chunks' metaobjects all free, as `mkfs` makes them.
    pub fn grow_fresh(&mut self, sb: Superblock) {
        let fresh = Self::fresh(sb, 0);
        let old = self.groups.len();
        self.groups.extend(fresh.groups.into_iter().skip(old));
        self.sb = sb;
    }

    /// Extends the store to `sb`, a larger geometry another host grew the file system
    /// to: the new chunks' metaobjects loaded from `dev`.
    pub fn grow_load(&mut self, dev: &dyn Device, sb: Superblock) -> Result<(), FsError> {
        let old = self.groups.len() as u32;
        let mut grown = self.clone();
        grown.grow_fresh(sb);
        for c in old..sb.geometry.chunks() {
            grown.load_chunk(dev, c)?;
        }
        *self = grown;
        Ok(())
    }

    /// Loads every metaobject of the file system `sb` from `dev` (mount). A damaged
    /// sector is an error naming where it lies.
    pub fn load(dev: &dyn Device, sb: Superblock) -> Result<Self, FsError> {
        let mut s = Self::fresh(sb, 0);
        for c in 0..s.groups.len() as u32 {
            s.load_chunk(dev, c)?;
        }
        Ok(s)
    }

    /// Reads chunk `c`'s metaobjects from `dev` over the ones held.
    fn load_chunk(&mut self, dev: &dyn Device, c: u32) -> Result<(), FsError> {
        for kind in Kind::ALL {
            let n = self.count(c, kind);
            for first in (0..n).step_by(PER_SECTOR as usize) {
                self.load_sector(dev, kind, MetaId::new(c, first as u32))?;
            }
        }
        Ok(())
    }

    /// Reads the sector holding (`kind`, `id`) from `dev` over the records held.
    pub fn load_sector(&mut self, dev: &dyn Device, kind: Kind, id: MetaId) -> Result<(), FsError> {
        let c = id.chunk();
        let (offset, first) = self.sector_of(kind, id);
        let n = self.count(c, kind);
        let count = (n - first as usize).min(PER_SECTOR as usize);
        let b = dev.read(offset, SECTOR as usize)?;
        let recs = decode_sector(&b, offset, self.sb.uuid, kind, c, first, count)?;
        self.groups[c as usize][slot(kind)][first as usize..first as usize + count]
            .clone_from_slice(&recs);
        Ok(())
    }
}
