//! Chunk replicas for the PolarFS storage layer (PolarFS sections 3.2 and 4).
//!
//! A volume is split into chunks; each chunk is one parallel-mode group replicated on
//! three chunk servers, and each replica keeps the chunk's blocks here:
//! [`ChunkStore`] allocates blocks on first write (thin provisioning, 64 KiB by default
//! as in the paper), reads blocks never written as zeros, and keeps a durable block map
//! that a checkpoint writes and a restart reads back. [`image`] is the chunk's image
//! format, for a replica that must be rebuilt from another's, and
//! [`ChunkStateMachine`] applies a chunk's group log to its store. A volume's I/O is
//! cut at chunk and block boundaries by `chorus_client::split`.
//!
//! Units: writes arrive in whole *sectors* of [`SECTOR`] bytes (the unit a parallel
//! group's records declare their block ranges in, `chorus_core::ooo::parallel`);
//! space is allocated in *blocks* of [`Geometry::block_bytes`].
//!
//! **Snapshots** (PolarFS section 7.2, "disk outage consistent" snapshots): an
//! operation record in the chunk's log ([`op`]) takes snapshot `id` of the chunk at one
//! point of the log, on every replica alike. The store "makes a snapshot by copying
//! block mapping meta information, which is fast, and handles the future requests which
//! will modify those blocks in a Copy-on-Write way": a snapshot is a copy of the block
//! map, and a block a snapshot shares is copied to a new slot before it is written
//! ([`ChunkStore::snapshot`], [`store`]'s module docs for the crash argument).

pub mod image;
pub mod map;
pub mod op;
mod slots;
pub mod sm;
pub mod store;

use std::path::PathBuf;

pub use op::ChunkOp;
pub use sm::{ChunkStateMachine, ScrubResult};
pub use store::ChunkStore;

/// Bytes per sector: the unit of a write, and of a parallel group's declared blocks.
pub const SECTOR: u64 = 4096;

/// Default chunk size: 10 GiB, as in PolarFS section 3.2.
pub const DEFAULT_CHUNK_BYTES: u64 = 10 << 30;

/// Default allocation unit: 64 KiB, as in PolarFS section 4.
pub const DEFAULT_BLOCK_BYTES: u32 = 64 << 10;

/// A chunk's size and allocation unit. Invariants ([`Geometry::check`]): `block_bytes`
/// is a power of two from [`SECTOR`] to 16 MiB; `chunk_bytes` is a positive multiple of
/// it, of at most 2^32 − 1 blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Bytes in the chunk.
    pub chunk_bytes: u64,
    /// Bytes per allocated block.
    pub block_bytes: u32,
}

impl Default for Geometry {
    fn default() -> Self {
        Self {
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            block_bytes: DEFAULT_BLOCK_BYTES,
        }
    }
}

impl Geometry {
    /// Checks the invariants.
    pub fn check(&self) -> Result<(), ChunkError> {
        let bad = |detail: String| Err(ChunkError::BadGeometry { detail });
        let bb = self.block_bytes as u64;
        if !self.block_bytes.is_power_of_two() || !(SECTOR..=16 << 20).contains(&bb) {
            return bad(format!(
                "block_bytes {} is not a power of two from {SECTOR} to 16 MiB",
                self.block_bytes
            ));
        }
        if self.chunk_bytes == 0 || !self.chunk_bytes.is_multiple_of(bb) {
            return bad(format!(
                "chunk_bytes {} is not a positive multiple of block_bytes {}",
                self.chunk_bytes, self.block_bytes
            ));
        }
        if self.chunk_bytes / bb >= u32::MAX as u64 {
            return bad(format!(
                "chunk_bytes {} holds {} blocks, more than 2^32 - 1",
                self.chunk_bytes,
                self.chunk_bytes / bb
            ));
        }
        Ok(())
    }

    /// Blocks in the chunk.
    pub fn blocks(&self) -> u32 {
        (self.chunk_bytes / self.block_bytes as u64) as u32
    }

    /// Sectors in the chunk: a write's sector ranges must end at or before this.
    pub fn sectors(&self) -> u64 {
        self.chunk_bytes / SECTOR
    }

    /// The geometry as a chunk group's state machine parameters
    /// (`chorus_runtime::env::OooGroupSpec::params`), 12 bytes:
    /// `u64 chunk_bytes | u32 block_bytes`, little-endian.
    pub fn to_params(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(12);
        b.extend_from_slice(&self.chunk_bytes.to_le_bytes());
        b.extend_from_slice(&self.block_bytes.to_le_bytes());
        b
    }

    /// Reads [`Geometry::to_params`]'s bytes, checked; no bytes at all is the default
    /// geometry (a group created before chunks had parameters).
    pub fn from_params(b: &[u8]) -> Result<Self, ChunkError> {
        if b.is_empty() {
            return Ok(Self::default());
        }
        if b.len() != 12 {
            return Err(ChunkError::BadGeometry {
                detail: format!("{} bytes of parameters, expected 12", b.len()),
            });
        }
        let g = Self {
            chunk_bytes: le_u64(b, 0),
            block_bytes: le_u32(b, 8),
        };
        g.check()?;
        Ok(g)
    }
}

/// What went wrong with a chunk replica.
#[derive(Debug, thiserror::Error)]
pub enum ChunkError {
    /// A file operation failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// The operation.
        what: String,
        /// The file or directory.
        path: PathBuf,
        /// The system's error.
        source: std::io::Error,
    },
    /// A file or image is damaged or not of this format.
    #[error("{what} is damaged: {detail}")]
    Corrupt {
        /// Which file or image.
        what: String,
        /// What is wrong with it.
        detail: String,
    },
    /// A geometry breaks its invariants.
    #[error("bad chunk geometry: {detail}")]
    BadGeometry {
        /// Which invariant.
        detail: String,
    },
    /// The chunk on disk was made with another geometry.
    #[error("the chunk in {dir} has {stored:?}, not the {asked:?} asked for")]
    GeometryMismatch {
        /// The chunk's directory.
        dir: PathBuf,
        /// What its block map says.
        stored: Geometry,
        /// What the caller asked for.
        asked: Geometry,
    },
    /// A range past the chunk's end.
    #[error("{len} bytes at offset {offset} run past the chunk's {chunk_bytes} bytes")]
    OutOfRange {
        /// Start.
        offset: u64,
        /// Length.
        len: u64,
        /// The chunk's size.
        chunk_bytes: u64,
    },
    /// A write not in whole sectors.
    #[error("a write of {len} bytes at offset {offset} is not in whole {sector}-byte sectors")]
    Unaligned {
        /// Start.
        offset: u64,
        /// Length.
        len: u64,
        /// The sector size.
        sector: u64,
    },
    /// The chunk holds no snapshot of this id (never taken, or deleted).
    #[error("the chunk holds no snapshot {id} (never taken here, or deleted)")]
    NoSnapshot {
        /// The id asked for.
        id: u64,
    },
    /// A snapshot id that cannot be taken: 0 (ids start at 1).
    #[error("snapshot id {id} cannot be taken: ids start at 1")]
    BadSnapshotId {
        /// The id.
        id: u64,
    },
}

/// Appends the CRC32C of every byte of `out` to it (the chunk's formats end so).
pub(crate) fn seal(out: &mut Vec<u8>) {
    let crc = crc32c::crc32c(out);
    out.extend_from_slice(&crc.to_le_bytes());
}

/// Checks a structure of the chunk's formats — at least `header` bytes before its
/// CRC32C, the checksum over every byte before it, then `magic` at 0 and one of
/// `versions` at 4 — and returns the bytes before the checksum and the version. `what`
/// names it in errors.
pub(crate) fn unseal<'a>(
    what: &str,
    magic: [u8; 4],
    versions: &[u32],
    header: usize,
    b: &'a [u8],
) -> Result<(&'a [u8], u32), ChunkError> {
    let corrupt = |detail: String| ChunkError::Corrupt {
        what: what.to_string(),
        detail,
    };
    if b.len() < header.max(8) + 4 {
        return Err(corrupt(format!("{} bytes, shorter than a header", b.len())));
    }
    let (body, crc) = b.split_at(b.len() - 4);
    let want = le_u32(crc, 0);
    let have = crc32c::crc32c(body);
    if want != have {
        return Err(corrupt(format!(
            "checksum {have:#010x} does not match the stored {want:#010x}"
        )));
    }
    if body[0..4] != magic {
        return Err(corrupt(format!(
            "magic {:02x?} is not {}",
            &body[0..4],
            String::from_utf8_lossy(&magic)
        )));
    }
    let found = le_u32(body, 4);
    if !versions.contains(&found) {
        return Err(corrupt(format!(
            "version {found}; this build reads {versions:?}"
        )));
    }
    Ok((body, found))
}

/// Reads a format's fields in order, checking every length: running out of bytes is
/// `None`, never a panic (the decoders turn it into [`ChunkError::Corrupt`]).
pub(crate) struct Reader<'a> {
    /// The bytes.
    b: &'a [u8],
    /// The next field's offset. Invariant: at most `b.len()`.
    at: usize,
}

impl<'a> Reader<'a> {
    /// Reads `b` from `at` (clamped to its length).
    pub(crate) fn new(b: &'a [u8], at: usize) -> Self {
        Self {
            b,
            at: at.min(b.len()),
        }
    }

    /// The next `n` bytes.
    pub(crate) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|e| *e <= self.b.len())?;
        let out = &self.b[self.at..end];
        self.at = end;
        Some(out)
    }

    /// The next little-endian `u32`.
    pub(crate) fn u32(&mut self) -> Option<u32> {
        self.take(4).map(|b| le_u32(b, 0))
    }

    /// The next little-endian `u64`.
    pub(crate) fn u64(&mut self) -> Option<u64> {
        self.take(8).map(|b| le_u64(b, 0))
    }

    /// Bytes not read yet.
    pub(crate) fn remaining(&self) -> usize {
        self.b.len() - self.at
    }
}

/// The little-endian `u32` at `at` (the caller checked the length).
pub(crate) fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// The little-endian `u64` at `at` (the caller checked the length).
pub(crate) fn le_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
