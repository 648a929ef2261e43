//! Metaobjects (PolarFS section 6.1): the three kinds of file-system metadata — inodes,
//! directory entries and block tags — share one fixed-size record, stored 15 to a 4 KiB
//! sector in the chunk they describe, and are addressed by (identifier, kind): the
//! identifier's upper 32 bits name the chunk, the lower 32 the index in that chunk's
//! group of the kind.
//!
//! - An **inode** describes a regular file or a directory (its size, mode, times, and a
//!   directory's parent).
//! - A **directory entry** holds one name component and the inode it names, under a
//!   parent directory's inode.
//! - A **block tag** maps one data block of its chunk (the block with the tag's index)
//!   to a file block number of the inode that owns it; `dirty` says the block held a
//!   file's data since it was last zeroed, so it is zeroed before a file is given it.
//!
//! Byte layouts are in `docs/formats.md` ("File system", metaobject sectors).

use crate::layout::{FsError, SECTOR};

/// Bytes per metaobject record.
pub const OBJ: usize = 256;
/// Records per sector.
pub const PER_SECTOR: usize = 15;
/// Bytes of a sector's header, before its records.
pub const HEADER: usize = 32;
/// Longest name a directory entry holds.
pub const NAME_MAX: usize = 200;
/// The metaobject sector's magic, "CHMO" little-endian.
pub const SECTOR_MAGIC: u32 = u32::from_le_bytes(*b"CHMO");

/// The kind of a metaobject (its group in a chunk).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// An inode.
    Inode = 1,
    /// A directory entry.
    Dirent = 2,
    /// A block tag.
    Tag = 3,
}

impl Kind {
    /// The kind of byte `b`, if it names one.
    pub fn from_byte(b: u8) -> Option<Self> {
        match b {
            1 => Some(Self::Inode),
            2 => Some(Self::Dirent),
            3 => Some(Self::Tag),
            _ => None,
        }
    }

    /// All kinds, in their order in a chunk.
    pub const ALL: [Kind; 3] = [Kind::Inode, Kind::Dirent, Kind::Tag];
}

/// A metaobject's identifier: chunk in the upper 32 bits, index in the lower. The
/// identifier 0 (chunk 0's first inode) is never given out: it stands for "none".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MetaId(pub u64);

impl MetaId {
    /// "None".
    pub const NONE: MetaId = MetaId(0);
    /// The root directory's inode: chunk 0, index 1.
    pub const ROOT: MetaId = MetaId(1);

    /// The identifier of index `index` in chunk `chunk`.
    pub fn new(chunk: u32, index: u32) -> Self {
        Self(((chunk as u64) << 32) | index as u64)
    }

    /// The chunk.
    pub fn chunk(self) -> u32 {
        (self.0 >> 32) as u32
    }

    /// The index in the chunk's group.
    pub fn index(self) -> u32 {
        self.0 as u32
    }
}

/// A regular file or a directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    /// A regular file.
    File = 1,
    /// A directory.
    Dir = 2,
}

/// An inode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inode {
    /// File or directory.
    pub kind: FileKind,
    /// Permission bits (the low 12 bits of `st_mode`).
    pub mode: u32,
    /// Bytes (files; 0 for directories).
    pub size: u64,
    /// Last data change, nanoseconds since the Unix epoch.
    pub mtime_ns: i64,
    /// Last metadata change, nanoseconds since the Unix epoch.
    pub ctime_ns: i64,
    /// Directories: the parent directory's inode (the root's is itself). Files: none.
    pub parent: MetaId,
}

/// A directory entry. Invariant: `name` is 1 to [`NAME_MAX`] bytes, neither `.` nor
/// `..`, without `/` or NUL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dirent {
    /// The directory it is in.
    pub parent: MetaId,
    /// The inode it names.
    pub inode: MetaId,
    /// The name component.
    pub name: Vec<u8>,
}

/// A block tag.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tag {
    /// The inode owning the block, or [`MetaId::NONE`] when the block is free.
    pub owner: MetaId,
    /// The file block number the block holds (0 when free).
    pub file_block: u64,
    /// The block held file data since it was last zeroed.
    pub dirty: bool,
}

/// One metaobject record's value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Meta {
    /// An unused inode or directory-entry slot.
    Free,
    /// An inode in use.
    Inode(Inode),
    /// A directory entry in use.
    Dirent(Dirent),
    /// A block tag (always present: a free block's tag has no owner).
    Tag(Tag),
}

/// Whether `name` may be a directory entry's name (see [`Dirent`]).
pub fn valid_name(name: &[u8]) -> bool {
    !name.is_empty()
        && name.len() <= NAME_MAX
        && name != b"."
        && name != b".."
        && !name.iter().any(|&c| c == b'/' || c == 0)
}

fn put(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn get(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// The record of `m`, a metaobject of kind `kind`.
pub fn encode_obj(kind: Kind, m: &Meta) -> [u8; OBJ] {
    let mut b = [0u8; OBJ];
    match (kind, m) {
        (Kind::Inode | Kind::Dirent, Meta::Free) => {}
        (Kind::Inode, Meta::Inode(i)) => {
            b[0] = 1;
            b[8] = i.kind as u8;
            b[12..16].copy_from_slice(&i.mode.to_le_bytes());
            put(&mut b, 16, i.size);
            put(&mut b, 24, i.mtime_ns as u64);
            put(&mut b, 32, i.ctime_ns as u64);
            put(&mut b, 40, i.parent.0);
        }
        (Kind::Dirent, Meta::Dirent(d)) => {
            b[0] = 1;
            put(&mut b, 8, d.parent.0);
            put(&mut b, 16, d.inode.0);
            let n = d.name.len().min(NAME_MAX);
            b[24..26].copy_from_slice(&(n as u16).to_le_bytes());
            b[26..26 + n].copy_from_slice(&d.name[..n]);
        }
        (Kind::Tag, Meta::Tag(t)) => {
            b[0] = u8::from(t.owner != MetaId::NONE);
            put(&mut b, 8, t.owner.0);
            put(&mut b, 16, t.file_block);
            b[24] = u8::from(t.dirty);
        }
        (k, m) => unreachable!("a {m:?} is not a {k:?} record"),
    }
    b
}

/// Decodes a record of kind `kind`; `detail` of the error says what is wrong.
pub fn decode_obj(kind: Kind, b: &[u8]) -> Result<Meta, String> {
    if b.len() != OBJ {
        return Err(format!("{} bytes, not {OBJ}", b.len()));
    }
    let used = match b[0] {
        0 => false,
        1 => true,
        x => return Err(format!("in-use byte {x}")),
    };
    let zero_from = |at: usize| -> Result<(), String> {
        match b[at..].iter().position(|&x| x != 0) {
            Some(p) => Err(format!("nonzero byte at {} of the record", at + p)),
            None => Ok(()),
        }
    };
    if b[1..8].iter().any(|&x| x != 0) {
        return Err("reserved bytes 1..8 not zero".into());
    }
    match kind {
        Kind::Inode | Kind::Dirent if !used => {
            zero_from(8)?;
            Ok(Meta::Free)
        }
        Kind::Inode => {
            let fk = match b[8] {
                1 => FileKind::File,
                2 => FileKind::Dir,
                x => return Err(format!("file type {x}")),
            };
            if b[9..12].iter().any(|&x| x != 0) {
                return Err("reserved bytes 9..12 not zero".into());
            }
            zero_from(48)?;
            Ok(Meta::Inode(Inode {
                kind: fk,
                mode: u32::from_le_bytes(b[12..16].try_into().expect("4")),
                size: get(b, 16),
                mtime_ns: get(b, 24) as i64,
                ctime_ns: get(b, 32) as i64,
                parent: MetaId(get(b, 40)),
            }))
        }
        Kind::Dirent => {
            let n = u16::from_le_bytes([b[24], b[25]]) as usize;
            if n > NAME_MAX {
                return Err(format!("name of {n} bytes, at most {NAME_MAX}"));
            }
            let name = b[26..26 + n].to_vec();
            if !valid_name(&name) {
                return Err(format!("invalid name {:?}", String::from_utf8_lossy(&name)));
            }
            zero_from(26 + n)?;
            Ok(Meta::Dirent(Dirent {
                parent: MetaId(get(b, 8)),
                inode: MetaId(get(b, 16)),
                name,
            }))
        }
        Kind::Tag => {
            let owner = MetaId(get(b, 8));
            if used != (owner != MetaId::NONE) {
                return Err(format!("in-use byte {} with owner {:#x}", b[0], owner.0));
            }
            let dirty = match b[24] {
                0 => false,
                1 => true,
                x => return Err(format!("dirty byte {x}")),
            };
            zero_from(25)?;
            let file_block = get(b, 16);
            if !used && file_block != 0 {
                return Err(format!("a free tag with file block {file_block}"));
            }
            Ok(Meta::Tag(Tag {
                owner,
                file_block,
                dirty,
            }))
        }
    }
}

/// A metaobject sector: `kind`'s records `first..first + records.len()` of `chunk`.
pub fn encode_sector(uuid: u64, kind: Kind, chunk: u32, first: u32, records: &[Meta]) -> Vec<u8> {
    assert!(
        records.len() <= PER_SECTOR,
        "at most {PER_SECTOR} records a sector"
    );
    let mut b = vec![0u8; SECTOR as usize];
    b[0..4].copy_from_slice(&SECTOR_MAGIC.to_le_bytes());
    b[4..6].copy_from_slice(&crate::layout::VERSION.to_le_bytes());
    b[6] = kind as u8;
    b[8..12].copy_from_slice(&chunk.to_le_bytes());
    b[12..16].copy_from_slice(&first.to_le_bytes());
    put(&mut b, 16, uuid);
    for (i, m) in records.iter().enumerate() {
        let at = HEADER + i * OBJ;
        b[at..at + OBJ].copy_from_slice(&encode_obj(kind, m));
    }
    let crc = crc32c::crc32c(&b[..4092]);
    b[4092..].copy_from_slice(&crc.to_le_bytes());
    b
}

/// Decodes a metaobject sector found at volume `offset`, which must hold `kind`'s
/// records `first..first + count` of `chunk` for the file system `uuid`.
pub fn decode_sector(
    b: &[u8],
    offset: u64,
    uuid: u64,
    kind: Kind,
    chunk: u32,
    first: u32,
    count: usize,
) -> Result<Vec<Meta>, FsError> {
    let bad = |detail: String| FsError::Corrupt {
        what: "metaobject sector",
        offset,
        detail,
    };
    if b.len() != SECTOR as usize {
        return Err(bad(format!("{} bytes", b.len())));
    }
    let magic = u32::from_le_bytes(b[0..4].try_into().expect("4"));
    if magic != SECTOR_MAGIC {
        return Err(bad(format!(
            "magic {magic:#010x}, not {SECTOR_MAGIC:#010x}"
        )));
    }
    let crc = crc32c::crc32c(&b[..4092]);
    let stored = u32::from_le_bytes(b[4092..].try_into().expect("4"));
    if crc != stored {
        return Err(bad(format!("checksum {crc:#010x}, stored {stored:#010x}")));
    }
    let version = u16::from_le_bytes([b[4], b[5]]);
    if version != crate::layout::VERSION {
        return Err(bad(format!("format version {version}")));
    }
    let got = (
        Kind::from_byte(b[6]),
        u32::from_le_bytes(b[8..12].try_into().expect("4")),
        u32::from_le_bytes(b[12..16].try_into().expect("4")),
        get(b, 16),
    );
    if got != (Some(kind), chunk, first, uuid) {
        let held = got.0.map_or(format!("kind {}", b[6]), |k| format!("{k:?}"));
        return Err(bad(format!(
            "holds {held} records from {} of chunk {} of file system {:#x}, not {kind:?} \
             from {first} of chunk {chunk} of {uuid:#x}",
            got.2, got.1, got.3
        )));
    }
    if count > PER_SECTOR {
        return Err(bad(format!("{count} records asked of one sector")));
    }
    (0..count)
        .map(|i| {
            let at = HEADER + i * OBJ;
            decode_obj(kind, &b[at..at + OBJ]).map_err(|d| {
                bad(format!(
                    "record {} ({kind:?} {}): {d}",
                    i,
                    first as usize + i
                ))
            })
        })
        .collect()
}
