//! The log entry: one record appended by a user, with its CSN (PALF section 3.2).
//!
//! ```text
//! log entry = header (24 bytes) | data (data_len bytes)
//!
//! offset size field
//!  0     2    magic        u16 = 0x454C ("LE" on disk)
//!  2     1    version      u8  = 1
//!  3     1    flags        u8  = 0 (no flag defined yet; unknown bits are an error)
//!  4     4    data_len     u32, 0 ..= MAX_RECORD_BYTES
//!  8     8    csn          u64, the record's commit sequence number
//! 16     4    data_crc     u32, CRC32C of the data bytes
//! 20     4    header_crc   u32, CRC32C of header bytes 0..20
//! ```
//!
//! Entries are packed back to back, without alignment, in the body of a group
//! ([`super::group`]). The entry's LSN is the LSN of its header byte 0.

use super::le::{put_u16, put_u32, put_u64, u16_at, u32_at, u64_at};
use super::{crc32c, FormatError};
use crate::Csn;

/// Size of the log entry header in bytes.
pub const ENTRY_HEADER_SIZE: usize = 24;
/// The magic number of a log entry header.
pub const ENTRY_MAGIC: u16 = 0x454C;
/// The entry format version this build writes and reads.
pub const ENTRY_VERSION: u8 = 1;
/// The largest record a log entry may carry (16 MiB); a group, and so a block, must be
/// able to hold one entry.
pub const MAX_RECORD_BYTES: u32 = 16 << 20;

const WHAT: &str = "log entry header";

/// A decoded log entry header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryHeader {
    /// Length of the record in bytes.
    pub data_len: u32,
    /// The record's CSN.
    pub csn: Csn,
    /// CRC32C of the record.
    pub data_crc: u32,
}

impl EntryHeader {
    /// The header for `data` with `csn`.
    pub fn for_data(csn: Csn, data: &[u8]) -> Self {
        Self {
            data_len: data.len() as u32,
            csn,
            data_crc: crc32c(data),
        }
    }

    /// Encodes the header, computing its checksum.
    pub fn encode(&self) -> [u8; ENTRY_HEADER_SIZE] {
        let mut b = [0u8; ENTRY_HEADER_SIZE];
        put_u16(&mut b, 0, ENTRY_MAGIC);
        b[2] = ENTRY_VERSION;
        b[3] = 0;
        put_u32(&mut b, 4, self.data_len);
        put_u64(&mut b, 8, self.csn);
        put_u32(&mut b, 16, self.data_crc);
        let crc = crc32c(&b[..20]);
        put_u32(&mut b, 20, crc);
        b
    }

    /// Decodes and checks a header from the start of `buf` (which may be longer).
    pub fn decode(buf: &[u8]) -> Result<Self, FormatError> {
        if buf.len() < ENTRY_HEADER_SIZE {
            return Err(FormatError::Truncated {
                what: WHAT,
                need: ENTRY_HEADER_SIZE as u64,
                have: buf.len() as u64,
            });
        }
        let magic = u16_at(buf, 0);
        if magic != ENTRY_MAGIC {
            return Err(FormatError::BadMagic {
                what: WHAT,
                expected: ENTRY_MAGIC as u64,
                found: magic as u64,
            });
        }
        let stored = u32_at(buf, 20);
        let computed = crc32c(&buf[..20]);
        if stored != computed {
            return Err(FormatError::HeaderChecksum {
                what: WHAT,
                expected: stored,
                found: computed,
            });
        }
        if buf[2] != ENTRY_VERSION {
            return Err(FormatError::UnknownVersion {
                what: WHAT,
                found: buf[2] as u16,
                supported: ENTRY_VERSION as u16,
            });
        }
        if buf[3] != 0 {
            return Err(FormatError::UnknownFlags {
                what: WHAT,
                found: buf[3] as u32,
            });
        }
        let data_len = u32_at(buf, 4);
        if data_len > MAX_RECORD_BYTES {
            return Err(FormatError::LengthOutOfRange {
                what: WHAT,
                field: "data_len",
                value: data_len as u64,
                min: 0,
                max: MAX_RECORD_BYTES as u64,
            });
        }
        Ok(Self {
            data_len,
            csn: u64_at(buf, 8),
            data_crc: u32_at(buf, 16),
        })
    }

    /// Total size of the entry (header and data) in bytes.
    pub fn total_len(&self) -> usize {
        ENTRY_HEADER_SIZE + self.data_len as usize
    }
}

/// Size in bytes of the entry that carries `data_len` bytes of record.
pub fn entry_size(data_len: usize) -> usize {
    ENTRY_HEADER_SIZE + data_len
}

/// Appends the encoded entry for `(csn, data)` to `out`.
pub fn encode_entry(out: &mut Vec<u8>, csn: Csn, data: &[u8]) {
    out.extend_from_slice(&EntryHeader::for_data(csn, data).encode());
    out.extend_from_slice(data);
}

/// Writes the entry for `(csn, data)` into `out`, which must be exactly
/// `entry_size(data.len())` bytes long. Used by the write path that copies records into a
/// pre-sized group buffer without reallocation.
pub fn write_entry(out: &mut [u8], csn: Csn, data: &[u8]) {
    debug_assert_eq!(out.len(), entry_size(data.len()));
    out[..ENTRY_HEADER_SIZE].copy_from_slice(&EntryHeader::for_data(csn, data).encode());
    out[ENTRY_HEADER_SIZE..].copy_from_slice(data);
}

/// A decoded entry borrowing its data from the group body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry<'a> {
    /// Offset of the entry's header within the group body.
    pub offset: usize,
    /// The entry's CSN.
    pub csn: Csn,
    /// The record.
    pub data: &'a [u8],
}

/// Decodes one whole entry (header and data) at the start of `buf`, checking both
/// checksums.
pub fn decode_entry(buf: &[u8]) -> Result<(EntryHeader, &[u8]), FormatError> {
    let h = EntryHeader::decode(buf)?;
    let end = h.total_len();
    if buf.len() < end {
        return Err(FormatError::Truncated {
            what: "log entry data",
            need: end as u64,
            have: buf.len() as u64,
        });
    }
    let data = &buf[ENTRY_HEADER_SIZE..end];
    let crc = crc32c(data);
    if crc != h.data_crc {
        return Err(FormatError::DataChecksum {
            what: "log entry data",
            expected: h.data_crc,
            found: crc,
        });
    }
    Ok((h, data))
}

/// Iterates over the entries packed in a group body. Yields an error (once, then stops)
/// at the first malformed entry.
#[derive(Clone, Debug)]
pub struct EntryIter<'a> {
    body: &'a [u8],
    pos: usize,
    failed: bool,
}

impl<'a> EntryIter<'a> {
    /// Entries of `body`.
    pub fn new(body: &'a [u8]) -> Self {
        Self {
            body,
            pos: 0,
            failed: false,
        }
    }
}

impl<'a> Iterator for EntryIter<'a> {
    type Item = Result<Entry<'a>, FormatError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.pos >= self.body.len() {
            return None;
        }
        match decode_entry(&self.body[self.pos..]) {
            Ok((h, data)) => {
                let e = Entry {
                    offset: self.pos,
                    csn: h.csn,
                    data,
                };
                self.pos += h.total_len();
                Some(Ok(e))
            }
            Err(e) => {
                self.failed = true;
                Some(Err(e))
            }
        }
    }
}

/// Decodes `data` as one entry and, if it decodes, checks that re-encoding gives the same
/// bytes. The body of the `entry` cargo-fuzz target; panics only on a real bug.
pub fn fuzz_decode(data: &[u8]) {
    if let Ok((h, payload)) = decode_entry(data) {
        let mut out = Vec::new();
        encode_entry(&mut out, h.csn, payload);
        assert_eq!(&out[..], &data[..h.total_len()], "entry re-encode differs");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trip() {
        let mut out = Vec::new();
        encode_entry(&mut out, 42, b"hello");
        let (h, d) = decode_entry(&out).unwrap();
        assert_eq!(h.csn, 42);
        assert_eq!(d, b"hello");
        assert_eq!(out.len(), entry_size(5));
    }

    #[test]
    fn every_error_is_named() {
        let mut out = Vec::new();
        encode_entry(&mut out, 1, b"abc");
        assert!(matches!(
            decode_entry(&out[..10]),
            Err(FormatError::Truncated { need: 24, .. })
        ));
        assert!(matches!(
            decode_entry(&out[..25]),
            Err(FormatError::Truncated { need: 27, .. })
        ));
        let mut bad = out.clone();
        bad[0] ^= 1;
        assert!(matches!(
            decode_entry(&bad),
            Err(FormatError::BadMagic { .. })
        ));
        let mut bad = out.clone();
        bad[9] ^= 1;
        assert!(matches!(
            decode_entry(&bad),
            Err(FormatError::HeaderChecksum { .. })
        ));
        let mut bad = out.clone();
        bad[25] ^= 1;
        assert!(matches!(
            decode_entry(&bad),
            Err(FormatError::DataChecksum { .. })
        ));
        // A valid checksum over a bad version must still be refused.
        let mut bad = out.clone();
        bad[2] = 9;
        let crc = crc32c(&bad[..20]);
        bad[20..24].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(
            decode_entry(&bad),
            Err(FormatError::UnknownVersion { found: 9, .. })
        ));
        let mut bad = out;
        put_u32(&mut bad, 4, MAX_RECORD_BYTES + 1);
        let crc = crc32c(&bad[..20]);
        bad[20..24].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(
            decode_entry(&bad),
            Err(FormatError::LengthOutOfRange { .. })
        ));
    }

    proptest! {
        #[test]
        fn prop_round_trip(csn in any::<u64>(), data in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let mut out = Vec::new();
            encode_entry(&mut out, csn, &data);
            let (h, d) = decode_entry(&out).unwrap();
            prop_assert_eq!(h.csn, csn);
            prop_assert_eq!(d, &data[..]);
        }

        #[test]
        fn prop_decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            fuzz_decode(&bytes);
        }
    }
}
