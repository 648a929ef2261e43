//! The superblock and where everything lives on the volume (see `docs/formats.md`, "File
//! system").
//!
//! A volume is a sequence of chunks (PolarFS section 3.2). Chunk 0 starts with the
//! superblock, the Disk Paxos pages (one leader record and one page per host, section
//! 6.2) and the journal. Every chunk then holds its own metaobjects — its inodes, its
//! directory entries and one block tag per data block of the chunk — in 4 KiB sectors
//! (section 6.1), and after them, aligned to the file-system block, its data blocks. A
//! block tag's identifier names its data block: tag `i` of chunk `c` maps the chunk's
//! `i`-th data block.

use crate::device::Device;

/// Bytes per sector: the unit metaobjects, Disk Paxos pages and journal records are
/// written in.
pub const SECTOR: u64 = 4096;
/// The superblock's magic, "CHFS" little-endian.
pub const SUPER_MAGIC: u32 = u32::from_le_bytes(*b"CHFS");
/// The on-volume format version this build writes and reads.
pub const VERSION: u16 = 1;

/// Why the file system refused or failed an operation.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    /// Bytes on the volume are not what the format says: named by what and where.
    #[error("{what} at volume offset {offset}: {detail}")]
    Corrupt {
        /// The structure.
        what: &'static str,
        /// Where it starts on the volume.
        offset: u64,
        /// What is wrong.
        detail: String,
    },
    /// The volume does not hold this file system's layout, or the parameters asked
    /// cannot be laid out.
    #[error("layout: {0}")]
    Layout(String),
    /// The volume's I/O failed.
    #[error("volume I/O: {0}")]
    Io(#[from] std::io::Error),
}

/// The parameters a file system is made with (`mkfs`), and what follows from them.
/// Invariants (checked by [`Geometry::new`]): the chunk size is a multiple of the block
/// size, the block size a multiple of [`SECTOR`]; every chunk has room for its
/// metaobjects and at least one data block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Bytes of the volume the file system covers (a multiple of `chunk_bytes`).
    pub volume_bytes: u64,
    /// Bytes per chunk (the volume's).
    pub chunk_bytes: u64,
    /// Bytes per data block (4 MiB in the paper).
    pub block_bytes: u64,
    /// Inode slots per chunk.
    pub inodes_per_chunk: u32,
    /// Directory-entry slots per chunk.
    pub dirents_per_chunk: u32,
    /// Hosts that may mount the file system (Disk Paxos pages).
    pub max_hosts: u32,
    /// Bytes of the journal (a multiple of [`SECTOR`]).
    pub journal_bytes: u64,
}

/// Metaobjects per sector (see [`crate::meta`]).
pub const PER_SECTOR: u64 = crate::meta::PER_SECTOR as u64;

fn sectors_for(objects: u64) -> u64 {
    objects.div_ceil(PER_SECTOR)
}

impl Geometry {
    /// Checks the invariants (see the type's docs).
    pub fn new(g: Geometry) -> Result<Self, FsError> {
        let bad = |m: String| Err(FsError::Layout(m));
        if g.block_bytes == 0 || !g.block_bytes.is_multiple_of(SECTOR) {
            return bad(format!(
                "block size {} is not a positive multiple of {SECTOR}",
                g.block_bytes
            ));
        }
        if g.chunk_bytes == 0 || !g.chunk_bytes.is_multiple_of(g.block_bytes) {
            return bad(format!(
                "chunk size {} is not a positive multiple of the block size {}",
                g.chunk_bytes, g.block_bytes
            ));
        }
        if g.volume_bytes == 0 || !g.volume_bytes.is_multiple_of(g.chunk_bytes) {
            return bad(format!(
                "volume size {} is not a positive multiple of the chunk size {}",
                g.volume_bytes, g.chunk_bytes
            ));
        }
        if g.volume_bytes / g.chunk_bytes > u32::MAX as u64 {
            return bad(format!(
                "{} chunks: at most {}",
                g.volume_bytes / g.chunk_bytes,
                u32::MAX
            ));
        }
        if g.max_hosts == 0 || g.max_hosts > 1024 {
            return bad(format!("max_hosts {}: 1 to 1024", g.max_hosts));
        }
        if g.inodes_per_chunk < 2 || g.dirents_per_chunk < 1 {
            return bad(format!(
                "{} inodes and {} directory entries per chunk: at least 2 and 1",
                g.inodes_per_chunk, g.dirents_per_chunk
            ));
        }
        if !g.journal_bytes.is_multiple_of(SECTOR)
            || g.journal_bytes / SECTOR / (g.max_hosts as u64) < 4
        {
            return bad(format!(
                "journal of {} bytes: a multiple of {SECTOR}, at least four sectors for each \
                 of the {} hosts",
                g.journal_bytes, g.max_hosts
            ));
        }
        for c in 0..g.chunks() {
            if g.data_blocks(c) == 0 {
                return bad(format!(
                    "chunk {c} has no room for a data block after its metaobjects ({} bytes)",
                    g.data_start(c) - g.chunk_start(c)
                ));
            }
        }
        Ok(g)
    }

    /// Chunks in the volume.
    pub fn chunks(&self) -> u32 {
        (self.volume_bytes / self.chunk_bytes) as u32
    }

    /// Where chunk `c` starts on the volume.
    pub fn chunk_start(&self, c: u32) -> u64 {
        c as u64 * self.chunk_bytes
    }

    /// Where the Disk Paxos pages start: the leader record, then one page per host.
    pub fn paxos_start(&self) -> u64 {
        SECTOR
    }

    /// Where the journal starts.
    pub fn journal_start(&self) -> u64 {
        self.paxos_start() + (1 + self.max_hosts as u64) * SECTOR
    }

    /// Host `host`'s journal area (hosts from 1): its start and length in bytes, a whole
    /// number of sectors. Only that host writes there ([`crate::journal`]).
    pub fn journal_area(&self, host: u32) -> (u64, u64) {
        let len = self.journal_bytes / SECTOR / self.max_hosts as u64 * SECTOR;
        (self.journal_start() + (host as u64 - 1) * len, len)
    }

    /// Where chunk `c`'s inode sectors start (its directory-entry sectors follow, then
    /// its block-tag sectors).
    pub fn meta_start(&self, c: u32) -> u64 {
        if c == 0 {
            self.journal_start() + self.journal_bytes
        } else {
            self.chunk_start(c)
        }
    }

    /// Sectors of inodes, directory entries and block tags in each chunk.
    pub fn meta_sectors(&self) -> [u64; 3] {
        let tags = self.chunk_bytes / self.block_bytes;
        [
            sectors_for(self.inodes_per_chunk as u64),
            sectors_for(self.dirents_per_chunk as u64),
            sectors_for(tags),
        ]
    }

    /// Where chunk `c`'s data blocks start (block-aligned after its metaobjects).
    pub fn data_start(&self, c: u32) -> u64 {
        let end = self.meta_start(c) + self.meta_sectors().iter().sum::<u64>() * SECTOR;
        end.div_ceil(self.block_bytes) * self.block_bytes
    }

    /// Data blocks in chunk `c` (each has the block tag of the same index).
    pub fn data_blocks(&self, c: u32) -> u64 {
        let end = self.chunk_start(c) + self.chunk_bytes;
        end.saturating_sub(self.data_start(c)) / self.block_bytes
    }

    /// Where data block `i` of chunk `c` starts.
    pub fn block_offset(&self, c: u32, i: u64) -> u64 {
        self.data_start(c) + i * self.block_bytes
    }
}

/// The superblock: the geometry and the file system's identity, in sector 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Superblock {
    /// The layout.
    pub geometry: Geometry,
    /// Drawn at `mkfs`: every metaobject sector, journal record and Disk Paxos page
    /// carries it, so that a stale structure of an earlier file system on the same
    /// volume is never taken for one of this one.
    pub uuid: u64,
}

impl Superblock {
    /// The superblock's sector (layout in `docs/formats.md`).
    pub fn encode(&self) -> Vec<u8> {
        let g = &self.geometry;
        let mut b = vec![0u8; SECTOR as usize];
        b[0..4].copy_from_slice(&SUPER_MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        let fields: [(usize, u64); 7] = [
            (8, g.volume_bytes),
            (16, g.chunk_bytes),
            (24, g.block_bytes),
            (32, g.journal_bytes),
            (40, self.uuid),
            (48, g.inodes_per_chunk as u64),
            (56, g.dirents_per_chunk as u64),
        ];
        for (at, v) in fields {
            b[at..at + 8].copy_from_slice(&v.to_le_bytes());
        }
        b[64..68].copy_from_slice(&g.max_hosts.to_le_bytes());
        let crc = crc32c::crc32c(&b[..4092]);
        b[4092..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes and checks a superblock sector.
    pub fn decode(b: &[u8]) -> Result<Self, FsError> {
        let bad = |detail: String| FsError::Corrupt {
            what: "superblock",
            offset: 0,
            detail,
        };
        if b.len() != SECTOR as usize {
            return Err(bad(format!("{} bytes, not {SECTOR}", b.len())));
        }
        let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4"));
        let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8"));
        if u32_at(0) != SUPER_MAGIC {
            return Err(bad(format!(
                "magic {:#010x}, not {SUPER_MAGIC:#010x}: no Chorus file system here (run `chorus fs mkfs`)",
                u32_at(0)
            )));
        }
        let crc = crc32c::crc32c(&b[..4092]);
        if crc != u32_at(4092) {
            return Err(bad(format!(
                "checksum {:#010x}, stored {:#010x}",
                crc,
                u32_at(4092)
            )));
        }
        let version = u16::from_le_bytes([b[4], b[5]]);
        if version != VERSION {
            return Err(bad(format!(
                "format version {version}; this build reads {VERSION}"
            )));
        }
        let small = |at: usize, what: &str| {
            u32::try_from(u64_at(at)).map_err(|_| bad(format!("{what} {} too large", u64_at(at))))
        };
        let geometry = Geometry {
            volume_bytes: u64_at(8),
            chunk_bytes: u64_at(16),
            block_bytes: u64_at(24),
            journal_bytes: u64_at(32),
            inodes_per_chunk: small(48, "inodes per chunk")?,
            dirents_per_chunk: small(56, "directory entries per chunk")?,
            max_hosts: u32_at(64),
        };
        let geometry = Geometry::new(geometry).map_err(|e| bad(e.to_string()))?;
        Ok(Self {
            geometry,
            uuid: u64_at(40),
        })
    }

    /// Reads and checks the superblock of the file system on `dev`.
    pub fn read(dev: &dyn Device) -> Result<Self, FsError> {
        let s = Self::decode(&dev.read(0, SECTOR as usize)?)?;
        if s.geometry.volume_bytes > dev.size() {
            return Err(FsError::Corrupt {
                what: "superblock",
                offset: 0,
                detail: format!(
                    "the file system covers {} bytes; the volume has {}",
                    s.geometry.volume_bytes,
                    dev.size()
                ),
            });
        }
        Ok(s)
    }
}
