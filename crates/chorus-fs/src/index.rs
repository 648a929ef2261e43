//! The lookups a mounted host builds over its metaobjects (PolarFS section 6.1: "the
//! directory tree, the file mapping table and the free lists" are built in memory at
//! mount). They are kept in step with the store one record at a time: every change a
//! transaction makes, rolls back or replays names the record, and [`Index::update`]
//! moves that record's entries; only a reload of the whole store rebuilds them.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::meta::{FileKind, Kind, Meta, MetaId};
use crate::store::MetaStore;

/// The indexes (see the module docs). Invariant, after every [`Index::update`] of each
/// record the store changed: `children` and `entry_of` hold exactly the store's
/// directory entries (and an empty map for every directory without any), `blocks` and
/// `tag_of` exactly its owned block tags, and the free sets exactly its free slots
/// (inode 0 never, it means "none").
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Index {
    /// Directory inode → name → (directory entry, inode named).
    pub children: HashMap<MetaId, BTreeMap<Vec<u8>, (MetaId, MetaId)>>,
    /// Directory entry → (directory, name), to find its place when it changes.
    entry_of: HashMap<MetaId, (MetaId, Vec<u8>)>,
    /// File inode → file block → block tag.
    pub blocks: HashMap<MetaId, BTreeMap<u64, MetaId>>,
    /// Owned block tag → (file, file block).
    tag_of: HashMap<MetaId, (MetaId, u64)>,
    /// Free inode slots.
    pub free_inodes: BTreeSet<MetaId>,
    /// Free directory-entry slots.
    pub free_dirents: BTreeSet<MetaId>,
    /// Free blocks never written since zeroed (given out first: no zeroing needed).
    pub free_clean: BTreeSet<MetaId>,
    /// Free blocks that held data (zeroed before they are given out).
    pub free_dirty: BTreeSet<MetaId>,
}

impl Index {
    /// The indexes of every record of `s`.
    pub fn build(s: &MetaStore) -> Self {
        let mut ix = Self::default();
        let chunks = s.superblock().geometry.chunks();
        for c in 0..chunks {
            for kind in Kind::ALL {
                for (id, m) in s.iter(c, kind) {
                    ix.update(kind, id, m);
                }
            }
        }
        ix
    }

    /// Moves record (`kind`, `id`)'s entries to what it holds now, `m`. Idempotent.
    pub fn update(&mut self, kind: Kind, id: MetaId, m: &Meta) {
        match kind {
            Kind::Inode => {
                self.free_inodes.remove(&id);
                match m {
                    Meta::Free if id != MetaId::NONE => {
                        self.free_inodes.insert(id);
                    }
                    Meta::Inode(i) if i.kind == FileKind::Dir => {
                        self.children.entry(id).or_default();
                    }
                    _ => {}
                }
                let dir = matches!(m, Meta::Inode(i) if i.kind == FileKind::Dir);
                if !dir && self.children.get(&id).is_some_and(|c| c.is_empty()) {
                    self.children.remove(&id);
                }
            }
            Kind::Dirent => {
                if let Some((parent, name)) = self.entry_of.remove(&id) {
                    if let Some(c) = self.children.get_mut(&parent) {
                        if c.get(&name).is_some_and(|&(e, _)| e == id) {
                            c.remove(&name);
                        }
                    }
                }
                self.free_dirents.remove(&id);
                match m {
                    Meta::Dirent(d) => {
                        self.children
                            .entry(d.parent)
                            .or_default()
                            .insert(d.name.clone(), (id, d.inode));
                        self.entry_of.insert(id, (d.parent, d.name.clone()));
                    }
                    _ => {
                        self.free_dirents.insert(id);
                    }
                }
            }
            Kind::Tag => {
                if let Some((owner, fb)) = self.tag_of.remove(&id) {
                    if let Some(b) = self.blocks.get_mut(&owner) {
                        if b.get(&fb) == Some(&id) {
                            b.remove(&fb);
                        }
                        if b.is_empty() {
                            self.blocks.remove(&owner);
                        }
                    }
                }
                self.free_clean.remove(&id);
                self.free_dirty.remove(&id);
                if let Meta::Tag(t) = m {
                    if t.owner == MetaId::NONE {
                        if t.dirty {
                            self.free_dirty.insert(id);
                        } else {
                            self.free_clean.insert(id);
                        }
                    } else {
                        self.blocks
                            .entry(t.owner)
                            .or_default()
                            .insert(t.file_block, id);
                        self.tag_of.insert(id, (t.owner, t.file_block));
                    }
                }
            }
        }
    }

    /// The next free block to give out: a clean one first (lowest identifier first).
    pub fn free_tag(&self) -> Option<MetaId> {
        self.free_clean
            .first()
            .or_else(|| self.free_dirty.first())
            .copied()
    }

    /// Free data blocks.
    pub fn free_blocks(&self) -> u64 {
        (self.free_clean.len() + self.free_dirty.len()) as u64
    }
}
