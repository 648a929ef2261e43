//! The block file header. A replica's log is a sequence of block files, each holding
//! `block_size` bytes of the logical log after a fixed 4 KiB header (PALF section 3.4:
//! "LSN = byte offset in constant-size blocks"):
//!
//! ```text
//! block file n = header (BLOCK_HEADER_SIZE = 4096 bytes) | log bytes of LSN
//!                [n * block_size, (n + 1) * block_size)
//! file offset of LSN l in block n = BLOCK_HEADER_SIZE + (l - n * block_size)
//!
//! header:
//! offset size field
//!  0     8    magic            b"CHORUSLB"
//!  8     2    version          u16 = 1
//! 10     2    flags            u16 = 0 (unknown bits are an error)
//! 12     4    header_size      u32 = 4096
//! 16     8    log_id           u64, random identity of the log, also in meta storage
//! 24     8    block_id         u64, n; the file is named after it
//! 32     8    block_size       u64, bytes of log per block, a multiple of 4096
//! 40     8    start_lsn        u64 = block_id * block_size
//! 48     4    start_acc_crc    u32, accumulated checksum before the block's first group
//! 52     8    start_group_seq  u64, sequence number of the block's first group
//! 60     8    start_max_csn    u64, largest CSN of the log before the block
//! 68     4    header_crc       u32, CRC32C of bytes 0..68
//! 72  4024    zero
//! ```
//!
//! The header repeats what the chain needs at the block start, so one block can be
//! verified on its own after older blocks were trimmed, and a block copied from another
//! log, placed under the wrong name, or written with another block size is recognised.
//! The 4 KiB size keeps log bytes aligned for direct IO.

use super::group::ChainPoint;
use super::le::{put_u16, put_u32, put_u64, u16_at, u32_at, u64_at};
use super::{crc32c, FormatError};

/// Bytes the header occupies at the start of every block file.
pub const BLOCK_HEADER_SIZE: usize = 4096;
/// Bytes of the header that carry fields (the rest is zero).
pub const BLOCK_HEADER_USED: usize = 72;
/// The magic of a block file.
pub const BLOCK_MAGIC: [u8; 8] = *b"CHORUSLB";
/// The block format version this build writes and reads.
pub const BLOCK_VERSION: u16 = 1;
/// Smallest block size: room for the largest group is not required (groups are bounded
/// separately), but a block must hold a useful number of groups.
pub const MIN_BLOCK_SIZE: u64 = 64 << 10;
/// Largest block size (4 GiB).
pub const MAX_BLOCK_SIZE: u64 = 4 << 30;

const WHAT: &str = "block header";

/// A decoded block header. See the module docs for the layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockHeader {
    /// Identity of the log the block belongs to.
    pub log_id: u64,
    /// Index of the block.
    pub block_id: u64,
    /// Bytes of log per block.
    pub block_size: u64,
    /// Accumulated checksum before the first group of the block.
    pub start_acc_crc: u32,
    /// Sequence number of the first group of the block.
    pub start_group_seq: u64,
    /// Largest CSN of the log before the block.
    pub start_max_csn: u64,
}

impl BlockHeader {
    /// First LSN of the block.
    pub fn start_lsn(&self) -> u64 {
        self.block_id * self.block_size
    }

    /// LSN just past the block.
    pub fn end_lsn(&self) -> u64 {
        self.start_lsn() + self.block_size
    }

    /// The chain point at the block start.
    pub fn start_chain(&self) -> ChainPoint {
        ChainPoint {
            end_lsn: self.start_lsn(),
            acc_crc: self.start_acc_crc,
            next_group_seq: self.start_group_seq,
            max_csn: self.start_max_csn,
        }
    }

    /// Encodes the full 4 KiB header.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; BLOCK_HEADER_SIZE];
        b[..8].copy_from_slice(&BLOCK_MAGIC);
        put_u16(&mut b, 8, BLOCK_VERSION);
        put_u16(&mut b, 10, 0);
        put_u32(&mut b, 12, BLOCK_HEADER_SIZE as u32);
        put_u64(&mut b, 16, self.log_id);
        put_u64(&mut b, 24, self.block_id);
        put_u64(&mut b, 32, self.block_size);
        put_u64(&mut b, 40, self.start_lsn());
        put_u32(&mut b, 48, self.start_acc_crc);
        put_u64(&mut b, 52, self.start_group_seq);
        put_u64(&mut b, 60, self.start_max_csn);
        let crc = crc32c(&b[..68]);
        put_u32(&mut b, 68, crc);
        b
    }

    /// Decodes and checks a header from the start of `buf`.
    pub fn decode(buf: &[u8]) -> Result<Self, FormatError> {
        if buf.len() < BLOCK_HEADER_USED {
            return Err(FormatError::Truncated {
                what: WHAT,
                need: BLOCK_HEADER_USED as u64,
                have: buf.len() as u64,
            });
        }
        if buf[..8] != BLOCK_MAGIC {
            return Err(FormatError::BadMagic {
                what: WHAT,
                expected: u64::from_le_bytes(BLOCK_MAGIC),
                found: u64_at(buf, 0),
            });
        }
        let stored = u32_at(buf, 68);
        let computed = crc32c(&buf[..68]);
        if stored != computed {
            return Err(FormatError::HeaderChecksum {
                what: WHAT,
                expected: stored,
                found: computed,
            });
        }
        let version = u16_at(buf, 8);
        if version != BLOCK_VERSION {
            return Err(FormatError::UnknownVersion {
                what: WHAT,
                found: version,
                supported: BLOCK_VERSION,
            });
        }
        let flags = u16_at(buf, 10);
        if flags != 0 {
            return Err(FormatError::UnknownFlags {
                what: WHAT,
                found: flags as u32,
            });
        }
        let header_size = u32_at(buf, 12);
        if header_size as usize != BLOCK_HEADER_SIZE {
            return Err(FormatError::FieldMismatch {
                what: WHAT,
                field: "header_size",
                expected: BLOCK_HEADER_SIZE as u64,
                found: header_size as u64,
            });
        }
        let block_size = u64_at(buf, 32);
        if !(MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&block_size)
            || !block_size.is_multiple_of(4096)
        {
            return Err(FormatError::LengthOutOfRange {
                what: WHAT,
                field: "block_size",
                value: block_size,
                min: MIN_BLOCK_SIZE,
                max: MAX_BLOCK_SIZE,
            });
        }
        let h = Self {
            log_id: u64_at(buf, 16),
            block_id: u64_at(buf, 24),
            block_size,
            start_acc_crc: u32_at(buf, 48),
            start_group_seq: u64_at(buf, 52),
            start_max_csn: u64_at(buf, 60),
        };
        let start_lsn = u64_at(buf, 40);
        let expected = h
            .block_id
            .checked_mul(block_size)
            .ok_or(FormatError::Malformed {
                what: WHAT,
                detail: format!(
                    "block_id {} * block_size {block_size} overflows",
                    h.block_id
                ),
            })?;
        if start_lsn != expected {
            return Err(FormatError::FieldMismatch {
                what: WHAT,
                field: "start_lsn",
                expected,
                found: start_lsn,
            });
        }
        Ok(h)
    }
}

/// Whether `block_size` is acceptable: a multiple of 4096 within
/// [`MIN_BLOCK_SIZE`]`..=`[`MAX_BLOCK_SIZE`].
pub fn valid_block_size(block_size: u64) -> bool {
    (MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&block_size) && block_size.is_multiple_of(4096)
}

/// Decodes `data` as a block header and, if it decodes, checks re-encoding. The body of
/// the `block` cargo-fuzz target.
pub fn fuzz_decode(data: &[u8]) {
    if let Ok(h) = BlockHeader::decode(data) {
        assert_eq!(&h.encode()[..BLOCK_HEADER_USED], &data[..BLOCK_HEADER_USED]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> BlockHeader {
        BlockHeader {
            log_id: 0xABCD,
            block_id: 3,
            block_size: 1 << 20,
            start_acc_crc: 77,
            start_group_seq: 12,
            start_max_csn: 5,
        }
    }

    #[test]
    fn round_trip() {
        let b = sample().encode();
        assert_eq!(b.len(), BLOCK_HEADER_SIZE);
        assert_eq!(BlockHeader::decode(&b).unwrap(), sample());
        assert_eq!(sample().start_lsn(), 3 << 20);
    }

    #[test]
    fn rejects() {
        let mut b = sample().encode();
        b[0] = b'X';
        assert!(matches!(
            BlockHeader::decode(&b),
            Err(FormatError::BadMagic { .. })
        ));
        let mut b = sample().encode();
        b[20] ^= 1;
        assert!(matches!(
            BlockHeader::decode(&b),
            Err(FormatError::HeaderChecksum { .. })
        ));
        assert!(matches!(
            BlockHeader::decode(&[0u8; 10]),
            Err(FormatError::Truncated { .. })
        ));
        assert!(matches!(
            BlockHeader::decode(&[0u8; 4096]),
            Err(FormatError::BadMagic { .. })
        ));
    }

    proptest! {
        #[test]
        fn prop_round_trip(log_id in any::<u64>(), block_id in 0u64..1 << 20, shift in 16u32..30,
                           acc in any::<u32>(), seq in any::<u64>()) {
            let h = BlockHeader { log_id, block_id, block_size: 1 << shift, start_acc_crc: acc,
                                  start_group_seq: seq, start_max_csn: seq / 2 };
            prop_assert_eq!(BlockHeader::decode(&h.encode()).unwrap(), h);
        }

        #[test]
        fn prop_decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
            fuzz_decode(&bytes);
        }
    }
}
