//! `fsck`: checks the metaobjects, as loaded and replayed to the latest anchor, against
//! each other (`chorus fs fsck`). Replaying the journal already checks every record
//! against the metaobjects it changes (each operation's old value must be what the
//! record holds); this checks what the records built:
//! - every directory entry lies in a directory and names an inode in use, and its name
//!   is unique in that directory;
//! - every inode in use but the root is named by exactly one entry, and a directory's
//!   parent is the directory whose entry names it; the tree has no cycle;
//! - every block tag in use is owned by a file inode, and no two tags map one file
//!   block (a block past the file's size is allowed: `fallocate` with
//!   `FALLOC_FL_KEEP_SIZE` gives such blocks, and growth into them zeroes first).

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::meta::{FileKind, Inode, Kind, Meta, MetaId};
use crate::store::MetaStore;

/// What `fsck` counted, and every problem it found (empty: clean).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Files.
    pub files: u64,
    /// Directories (the root counted).
    pub dirs: u64,
    /// Data blocks owned by files.
    pub blocks: u64,
    /// Problems, each naming the metaobjects involved.
    pub problems: Vec<String>,
}

/// Checks `s` (see the module docs).
pub fn fsck(s: &MetaStore) -> Report {
    let g = s.superblock().geometry;
    let mut r = Report::default();
    let mut inodes: HashMap<MetaId, Inode> = HashMap::new();
    for c in 0..g.chunks() {
        for (id, m) in s.iter(c, Kind::Inode) {
            if let Meta::Inode(i) = m {
                if id == MetaId::NONE {
                    r.problems
                        .push("inode 0 of chunk 0 (\"none\") is in use".into());
                }
                match i.kind {
                    FileKind::File => r.files += 1,
                    FileKind::Dir => r.dirs += 1,
                }
                inodes.insert(id, i.clone());
            }
        }
    }
    match inodes.get(&MetaId::ROOT) {
        Some(i) if i.kind == FileKind::Dir && i.parent == MetaId::ROOT => {}
        other => r.problems.push(format!("the root inode is {other:?}")),
    }
    let mut named: HashMap<MetaId, Vec<(MetaId, MetaId)>> = HashMap::new();
    let mut names: HashSet<(MetaId, Vec<u8>)> = HashSet::new();
    for c in 0..g.chunks() {
        for (id, m) in s.iter(c, Kind::Dirent) {
            let Meta::Dirent(d) = m else { continue };
            match inodes.get(&d.parent) {
                Some(p) if p.kind == FileKind::Dir => {}
                _ => r.problems.push(format!(
                    "entry {:#x} ({}) lies in {:#x}, not a directory in use",
                    id.0,
                    String::from_utf8_lossy(&d.name),
                    d.parent.0
                )),
            }
            if !inodes.contains_key(&d.inode) {
                r.problems.push(format!(
                    "entry {:#x} ({}) names inode {:#x}, which is free",
                    id.0,
                    String::from_utf8_lossy(&d.name),
                    d.inode.0
                ));
            }
            if !names.insert((d.parent, d.name.clone())) {
                r.problems.push(format!(
                    "directory {:#x} holds the name {} twice",
                    d.parent.0,
                    String::from_utf8_lossy(&d.name)
                ));
            }
            named.entry(d.inode).or_default().push((id, d.parent));
        }
    }
    for (&id, i) in &inodes {
        if id == MetaId::ROOT {
            continue;
        }
        match named.get(&id).map(Vec::as_slice) {
            None | Some([]) => r
                .problems
                .push(format!("inode {:#x} is in use but no entry names it", id.0)),
            Some([(_, parent)]) => {
                if i.kind == FileKind::Dir && i.parent != *parent {
                    r.problems.push(format!(
                        "directory {:#x} says its parent is {:#x}; its entry lies in {:#x}",
                        id.0, i.parent.0, parent.0
                    ));
                }
            }
            Some(many) => r.problems.push(format!(
                "inode {:#x} is named by {} entries (no hard links)",
                id.0,
                many.len()
            )),
        }
        if i.kind == FileKind::Dir {
            // Walk to the root: a cycle never gets there.
            let mut at = id;
            let mut steps = 0;
            while at != MetaId::ROOT && steps <= inodes.len() {
                at = inodes.get(&at).map_or(MetaId::ROOT, |x| x.parent);
                steps += 1;
            }
            if steps > inodes.len() {
                r.problems
                    .push(format!("directory {:#x} is in a cycle", id.0));
            }
        }
    }
    let mut mapped: BTreeMap<(MetaId, u64), MetaId> = BTreeMap::new();
    for c in 0..g.chunks() {
        for (id, m) in s.iter(c, Kind::Tag) {
            let Meta::Tag(t) = m else { continue };
            if t.owner == MetaId::NONE {
                continue;
            }
            r.blocks += 1;
            match inodes.get(&t.owner) {
                Some(i) if i.kind == FileKind::File => {}
                _ => r.problems.push(format!(
                    "tag {:#x} is owned by {:#x}, not a file in use",
                    id.0, t.owner.0
                )),
            }
            if let Some(other) = mapped.insert((t.owner, t.file_block), id) {
                r.problems.push(format!(
                    "tags {:#x} and {:#x} both map block {} of inode {:#x}",
                    other.0, id.0, t.file_block, t.owner.0
                ));
            }
        }
    }
    r.problems.sort();
    r
}
