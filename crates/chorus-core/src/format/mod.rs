//! Byte-exact, versioned, little-endian, checksummed formats.
//!
//! Every format here is documented byte by byte on its type and in `docs/formats.md`.
//! Decoding is total: any input, however malformed, yields either a value or a
//! [`FormatError`] naming what was wrong; no decoder panics (the `fuzz/` targets and the
//! proptests hold them to that).
//!
//! All checksums are CRC32C (Castagnoli), computed with the `crc32c` crate, which uses the
//! SSE4.2 / ARMv8 CRC instructions when the CPU has them.

pub mod block;
pub mod entry;
pub mod group;
pub mod meta;
pub mod ooo;
pub mod wire;

use thiserror::Error;

/// What a decoder found wrong. Every variant names the structure (`what`) it was decoding.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum FormatError {
    /// Fewer bytes than the structure needs.
    #[error("{what}: truncated: need {need} bytes, have {have}")]
    Truncated {
        /// The structure being decoded.
        what: &'static str,
        /// Bytes needed.
        need: u64,
        /// Bytes available.
        have: u64,
    },
    /// The magic number is not the structure's.
    #[error("{what}: bad magic: expected {expected:#x}, found {found:#x}")]
    BadMagic {
        /// The structure being decoded.
        what: &'static str,
        /// The magic this structure must start with.
        expected: u64,
        /// What was there.
        found: u64,
    },
    /// A format version this build does not know.
    #[error("{what}: unknown version {found} (this build reads version {supported})")]
    UnknownVersion {
        /// The structure being decoded.
        what: &'static str,
        /// The version found.
        found: u16,
        /// The version this build reads.
        supported: u16,
    },
    /// Flag bits this build does not know are set.
    #[error("{what}: unknown flag bits {found:#x}")]
    UnknownFlags {
        /// The structure being decoded.
        what: &'static str,
        /// The unknown bits.
        found: u32,
    },
    /// A length field outside its allowed range.
    #[error("{what}: {field} {value} out of range (allowed {min}..={max})")]
    LengthOutOfRange {
        /// The structure being decoded.
        what: &'static str,
        /// The field.
        field: &'static str,
        /// The value found.
        value: u64,
        /// Smallest allowed.
        min: u64,
        /// Largest allowed.
        max: u64,
    },
    /// The checksum over a header does not match.
    #[error("{what}: header checksum mismatch: expected {expected:#010x}, found {found:#010x}")]
    HeaderChecksum {
        /// The structure being decoded.
        what: &'static str,
        /// The checksum stored in the header.
        expected: u32,
        /// The checksum computed over the bytes.
        found: u32,
    },
    /// The checksum over a payload does not match.
    #[error("{what}: data checksum mismatch: expected {expected:#010x}, found {found:#010x}")]
    DataChecksum {
        /// The structure being decoded.
        what: &'static str,
        /// The checksum stored in the header.
        expected: u32,
        /// The checksum computed over the payload.
        found: u32,
    },
    /// The accumulated checksum chain is broken.
    #[error(
        "{what}: accumulated checksum mismatch: expected {expected:#010x}, found {found:#010x}"
    )]
    AccumulatedChecksum {
        /// The structure being decoded.
        what: &'static str,
        /// The accumulated checksum the chain predicts.
        expected: u32,
        /// The accumulated checksum stored.
        found: u32,
    },
    /// A field disagrees with where the structure was found or with its neighbours
    /// (an LSN, a sequence number, a count).
    #[error("{what}: {field} mismatch: expected {expected}, found {found}")]
    FieldMismatch {
        /// The structure being decoded.
        what: &'static str,
        /// The field.
        field: &'static str,
        /// The value implied by position or neighbours.
        expected: u64,
        /// The value stored.
        found: u64,
    },
    /// A structural rule is broken (explained in `detail`).
    #[error("{what}: malformed: {detail}")]
    Malformed {
        /// The structure being decoded.
        what: &'static str,
        /// Which rule was broken.
        detail: String,
    },
}

/// CRC32C of `bytes`.
#[inline]
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

/// CRC32C of `bytes` continued from `crc`.
#[inline]
pub fn crc32c_append(crc: u32, bytes: &[u8]) -> u32 {
    crc32c::crc32c_append(crc, bytes)
}

/// A bounds-checked little-endian cursor over a body whose checksum has been checked,
/// shared by the message codecs ([`wire`], [`ooo`]); each adds its own field readers in an
/// `impl` beside its format. `what` names the structure in errors, `ctx` (may be empty)
/// the message being decoded.
pub(crate) struct Reader<'a> {
    pub(crate) buf: &'a [u8],
    pub(crate) pos: usize,
    pub(crate) what: &'static str,
    pub(crate) ctx: &'static str,
}

impl<'a> Reader<'a> {
    /// A cursor at the start of `buf`.
    pub(crate) fn new(buf: &'a [u8], what: &'static str, ctx: &'static str) -> Self {
        Self {
            buf,
            pos: 0,
            what,
            ctx,
        }
    }

    /// The next `n` bytes, or `Truncated` (before anything is allocated).
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], FormatError> {
        if self.buf.len() - self.pos < n {
            return Err(FormatError::Truncated {
                what: self.what,
                need: self.pos as u64 + n as u64,
                have: self.buf.len() as u64,
            });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, FormatError> {
        Ok(self.take(1)?[0])
    }

    pub(crate) fn u32(&mut self) -> Result<u32, FormatError> {
        Ok(le::u32_at(self.take(4)?, 0))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, FormatError> {
        Ok(le::u64_at(self.take(8)?, 0))
    }

    /// `u32 n | n bytes`. A length past the end is `Truncated`, found before anything is
    /// allocated (the body is already bounded by the receiver's limit).
    pub(crate) fn bytes(&mut self) -> Result<Vec<u8>, FormatError> {
        let n = self.u32()?;
        Ok(self.take(n as usize)?.to_vec())
    }

    /// [`Reader::bytes`], copied straight into a shared buffer (an entry's record, which
    /// the replica clones for writing, committing and applying without copying it).
    pub(crate) fn shared_bytes(&mut self) -> Result<std::sync::Arc<[u8]>, FormatError> {
        let n = self.u32()?;
        Ok(self.take(n as usize)?.into())
    }

    /// A `u32` count (at most [`meta::MAX_MEMBERS`]) of node ids, then the ids.
    pub(crate) fn ids(&mut self, field: &'static str) -> Result<Vec<meta::NodeId>, FormatError> {
        let n = self.u32()?;
        if n > meta::MAX_MEMBERS {
            return Err(FormatError::LengthOutOfRange {
                what: self.what,
                field,
                value: n as u64,
                min: 0,
                max: meta::MAX_MEMBERS as u64,
            });
        }
        (0..n).map(|_| self.u64()).collect()
    }

    /// A bool byte: 0 or 1, anything else is an error naming `field`.
    pub(crate) fn flag(&mut self, field: &str) -> Result<bool, FormatError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(self.malformed(format!("{field} is {other}, not 0 or 1"))),
        }
    }

    /// A `Malformed` error with the message context in front of `detail`.
    pub(crate) fn malformed(&self, detail: String) -> FormatError {
        FormatError::Malformed {
            what: self.what,
            detail: if self.ctx.is_empty() {
                detail
            } else {
                format!("{}: {detail}", self.ctx)
            },
        }
    }

    /// `Malformed` unless every byte was read.
    pub(crate) fn done(&self) -> Result<(), FormatError> {
        if self.pos != self.buf.len() {
            return Err(self.malformed(format!(
                "{} trailing bytes after the message",
                self.buf.len() - self.pos
            )));
        }
        Ok(())
    }
}

/// Little-endian field readers and writers over a slice whose length the caller has
/// checked (they panic on a short slice, which is a caller bug).
pub mod le {
    /// Reads a u16 at `at`.
    #[inline]
    pub fn u16_at(b: &[u8], at: usize) -> u16 {
        u16::from_le_bytes([b[at], b[at + 1]])
    }
    /// Reads a u32 at `at`.
    #[inline]
    pub fn u32_at(b: &[u8], at: usize) -> u32 {
        let mut a = [0u8; 4];
        a.copy_from_slice(&b[at..at + 4]);
        u32::from_le_bytes(a)
    }
    /// Reads a u64 at `at`.
    #[inline]
    pub fn u64_at(b: &[u8], at: usize) -> u64 {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[at..at + 8]);
        u64::from_le_bytes(a)
    }
    /// Writes a u16 at `at`.
    #[inline]
    pub fn put_u16(b: &mut [u8], at: usize, v: u16) {
        b[at..at + 2].copy_from_slice(&v.to_le_bytes());
    }
    /// Writes a u32 at `at`.
    #[inline]
    pub fn put_u32(b: &mut [u8], at: usize, v: u32) {
        b[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }
    /// Writes a u64 at `at`.
    #[inline]
    pub fn put_u64(b: &mut [u8], at: usize, v: u64) {
        b[at..at + 8].copy_from_slice(&v.to_le_bytes());
    }
}
