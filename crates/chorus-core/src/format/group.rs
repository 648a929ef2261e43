//! The group entry: the unit the protocol replicates and storage writes (PALF section 3.4,
//! Fig. 5). Appenders' entries are batched into a group; the leader seals it with a header
//! that also carries the **committed end LSN** — the commit point piggybacked in the log
//! itself instead of being written separately (piggyback paper, section 4.1).
//!
//! ```text
//! group = header (64 bytes) | body (body_len bytes: log entries back to back, or zeros
//!                                   for a padding group)
//!
//! offset size field
//!  0     2    magic             u16 = 0x4743 ("CG" on disk)
//!  2     1    version           u8  = 2 (1 chained bodies only; refused)
//!  3     1    flags             u8: bit 0 PADDING, bit 1 MIRRORED; other bits must be 0
//!  4     4    body_len          u32, 0 ..= MAX_GROUP_BODY_BYTES
//!  8     8    lsn               u64, LSN of header byte 0 (guards misplaced groups)
//! 16     8    proposal_id       u64, proposal id of the leader that sealed the group
//! 24     8    committed_end_lsn u64, the sealing leader's committed end LSN (piggybacked)
//! 32     8    max_csn           u64, CSN of the last entry (padding: the previous max)
//! 40     8    group_seq         u64, 0 for the first group of the log, +1 per group
//! 48     4    data_crc          u32, CRC32C of the body
//! 52     4    acc_crc           u32, CRC32C(prev acc_crc as u32 LE ‖ proposal_id as u64 LE
//!                                   ‖ data_crc as u32 LE)
//! 56     4    entry_count       u32, entries in the body (0 for padding)
//! 60     4    header_crc        u32, CRC32C of header bytes 0..60
//! ```
//!
//! The accumulated checksum chains every group (its proposal id and body) to all groups
//! before it, so two replicas whose last groups have the same `(lsn, acc_crc)` hold the
//! same log — the same bodies sealed by the same leaders; the chain starts
//! from `0` before group 0 and, for a block whose predecessors were trimmed, from the
//! block header's `start_acc_crc` (see [`super::block`]).
//!
//! **Placement.** A group never straddles two blocks, and after every group the space
//! left in its block is either zero or at least [`GROUP_HEADER_SIZE`], so the rest of a
//! block can always be filled with a padding group ([`fits_in_block`]).

use super::entry::{EntryIter, ENTRY_HEADER_SIZE};
use super::le::{put_u16, put_u32, put_u64, u16_at, u32_at, u64_at};
use super::{crc32c, FormatError};
use crate::{Csn, Lsn};

/// Size of the group header in bytes.
pub const GROUP_HEADER_SIZE: usize = 64;
/// The magic number of a group header.
pub const GROUP_MAGIC: u16 = 0x4743;
/// The group format version this build writes and reads.
pub const GROUP_VERSION: u8 = 2;
/// Flag: the group is padding that fills the tail of a block; its body is zeros.
pub const FLAG_PADDING: u8 = 1;
/// Flag: the group was copied from another log group by a mirror (PALF section 5.4).
pub const FLAG_MIRRORED: u8 = 2;
const KNOWN_FLAGS: u8 = FLAG_PADDING | FLAG_MIRRORED;
/// The largest group body (64 MiB). Storage further bounds groups by its block size.
pub const MAX_GROUP_BODY_BYTES: u32 = 64 << 20;

const WHAT: &str = "group header";

/// A decoded group header. See the module docs for the layout and meaning of each field.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupHeader {
    /// `FLAG_PADDING` and/or `FLAG_MIRRORED`.
    pub flags: u8,
    /// Length of the body in bytes.
    pub body_len: u32,
    /// LSN of the group's first byte.
    pub lsn: Lsn,
    /// Proposal id of the leader that sealed the group.
    pub proposal_id: u64,
    /// Committed end LSN known to the sealing leader; everything below it is committed.
    /// Invariant: `committed_end_lsn <= lsn` (a group cannot declare itself committed).
    pub committed_end_lsn: Lsn,
    /// CSN of the last entry in the group.
    pub max_csn: Csn,
    /// Sequence number of the group in the log, from 0.
    pub group_seq: u64,
    /// CRC32C of the body.
    pub data_crc: u32,
    /// Accumulated checksum of the log up to and including this group.
    pub acc_crc: u32,
    /// Number of entries in the body.
    pub entry_count: u32,
}

impl GroupHeader {
    /// Whether this is a padding group.
    pub fn is_padding(&self) -> bool {
        self.flags & FLAG_PADDING != 0
    }

    /// Total size of the group (header and body) in bytes.
    pub fn total_len(&self) -> u64 {
        GROUP_HEADER_SIZE as u64 + self.body_len as u64
    }

    /// LSN just past the group.
    pub fn end_lsn(&self) -> Lsn {
        self.lsn + self.total_len()
    }

    /// Encodes the header, computing its checksum.
    pub fn encode(&self) -> [u8; GROUP_HEADER_SIZE] {
        let mut b = [0u8; GROUP_HEADER_SIZE];
        put_u16(&mut b, 0, GROUP_MAGIC);
        b[2] = GROUP_VERSION;
        b[3] = self.flags;
        put_u32(&mut b, 4, self.body_len);
        put_u64(&mut b, 8, self.lsn);
        put_u64(&mut b, 16, self.proposal_id);
        put_u64(&mut b, 24, self.committed_end_lsn);
        put_u64(&mut b, 32, self.max_csn);
        put_u64(&mut b, 40, self.group_seq);
        put_u32(&mut b, 48, self.data_crc);
        put_u32(&mut b, 52, self.acc_crc);
        put_u32(&mut b, 56, self.entry_count);
        let crc = crc32c(&b[..60]);
        put_u32(&mut b, 60, crc);
        b
    }

    /// Decodes and checks a header from the start of `buf` (which may be longer): magic,
    /// header checksum, version, flags, body length, and the rule that a group never
    /// declares itself committed.
    pub fn decode(buf: &[u8]) -> Result<Self, FormatError> {
        if buf.len() < GROUP_HEADER_SIZE {
            return Err(FormatError::Truncated {
                what: WHAT,
                need: GROUP_HEADER_SIZE as u64,
                have: buf.len() as u64,
            });
        }
        let magic = u16_at(buf, 0);
        if magic != GROUP_MAGIC {
            return Err(FormatError::BadMagic {
                what: WHAT,
                expected: GROUP_MAGIC as u64,
                found: magic as u64,
            });
        }
        let stored = u32_at(buf, 60);
        let computed = crc32c(&buf[..60]);
        if stored != computed {
            return Err(FormatError::HeaderChecksum {
                what: WHAT,
                expected: stored,
                found: computed,
            });
        }
        if buf[2] != GROUP_VERSION {
            return Err(FormatError::UnknownVersion {
                what: WHAT,
                found: buf[2] as u16,
                supported: GROUP_VERSION as u16,
            });
        }
        let flags = buf[3];
        if flags & !KNOWN_FLAGS != 0 {
            return Err(FormatError::UnknownFlags {
                what: WHAT,
                found: (flags & !KNOWN_FLAGS) as u32,
            });
        }
        let body_len = u32_at(buf, 4);
        if body_len > MAX_GROUP_BODY_BYTES {
            return Err(FormatError::LengthOutOfRange {
                what: WHAT,
                field: "body_len",
                value: body_len as u64,
                min: 0,
                max: MAX_GROUP_BODY_BYTES as u64,
            });
        }
        let h = Self {
            flags,
            body_len,
            lsn: u64_at(buf, 8),
            proposal_id: u64_at(buf, 16),
            committed_end_lsn: u64_at(buf, 24),
            max_csn: u64_at(buf, 32),
            group_seq: u64_at(buf, 40),
            data_crc: u32_at(buf, 48),
            acc_crc: u32_at(buf, 52),
            entry_count: u32_at(buf, 56),
        };
        if h.committed_end_lsn > h.lsn {
            return Err(FormatError::Malformed {
                what: WHAT,
                detail: format!(
                    "committed_end_lsn {} is beyond the group's own lsn {}",
                    h.committed_end_lsn, h.lsn
                ),
            });
        }
        if h.is_padding() && h.entry_count != 0 {
            return Err(FormatError::Malformed {
                what: WHAT,
                detail: format!("padding group claims {} entries", h.entry_count),
            });
        }
        Ok(h)
    }

    /// Checks the body's checksum.
    pub fn verify_body(&self, body: &[u8]) -> Result<(), FormatError> {
        if body.len() != self.body_len as usize {
            return Err(FormatError::FieldMismatch {
                what: "group body",
                field: "body_len",
                expected: self.body_len as u64,
                found: body.len() as u64,
            });
        }
        let crc = crc32c(body);
        if crc != self.data_crc {
            return Err(FormatError::DataChecksum {
                what: "group body",
                expected: self.data_crc,
                found: crc,
            });
        }
        Ok(())
    }

    /// Checks that this header continues the chain ending at `prev`: LSN, sequence number
    /// and accumulated checksum.
    pub fn verify_chain(&self, prev: &ChainPoint) -> Result<(), FormatError> {
        if self.lsn != prev.end_lsn {
            return Err(FormatError::FieldMismatch {
                what: WHAT,
                field: "lsn",
                expected: prev.end_lsn,
                found: self.lsn,
            });
        }
        if self.group_seq != prev.next_group_seq {
            return Err(FormatError::FieldMismatch {
                what: WHAT,
                field: "group_seq",
                expected: prev.next_group_seq,
                found: self.group_seq,
            });
        }
        let acc = chain_acc(prev.acc_crc, self.proposal_id, self.data_crc);
        if acc != self.acc_crc {
            return Err(FormatError::AccumulatedChecksum {
                what: WHAT,
                expected: acc,
                found: self.acc_crc,
            });
        }
        Ok(())
    }

    /// The chain point just after this group.
    pub fn chain_after(&self) -> ChainPoint {
        ChainPoint {
            end_lsn: self.end_lsn(),
            acc_crc: self.acc_crc,
            next_group_seq: self.group_seq + 1,
            max_csn: self.max_csn,
        }
    }
}

/// Where the log's checksum chain stands after some group: what the next group must
/// continue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChainPoint {
    /// LSN where the next group starts.
    pub end_lsn: Lsn,
    /// Accumulated checksum of everything before `end_lsn`.
    pub acc_crc: u32,
    /// Sequence number of the next group.
    pub next_group_seq: u64,
    /// Largest CSN in the log so far.
    pub max_csn: Csn,
}

/// The accumulated checksum after a group sealed under `proposal_id` whose body checksum
/// is `data_crc`.
///
/// The proposal id is chained as well as the body because log matching compares
/// `(lsn, acc_crc)`: two leaders can seal groups with identical bodies at the same LSN (an
/// empty StartWorking group is the usual case), and if the chain covered bodies only, a
/// follower holding the older leader's copy would "match" the newer leader and keep a
/// header that differs from the committed one (found by the simulator, seeds 2960 and
/// 4573). With the proposal id chained, equal `(lsn, acc_crc)` means equal headers'
/// proposal ids and bodies all the way back, as Raft's `(index, term)` does.
pub fn chain_acc(prev_acc: u32, proposal_id: u64, data_crc: u32) -> u32 {
    let mut b = [0u8; 16];
    b[..4].copy_from_slice(&prev_acc.to_le_bytes());
    b[4..12].copy_from_slice(&proposal_id.to_le_bytes());
    b[12..].copy_from_slice(&data_crc.to_le_bytes());
    crc32c(&b)
}

/// Whether a group of `len` bytes may start at `lsn` in blocks of `block_size` bytes: it
/// must not straddle the block end and must leave either nothing or room for a padding
/// header behind it.
pub fn fits_in_block(lsn: Lsn, len: u64, block_size: u64) -> bool {
    let rem = block_size - lsn % block_size;
    len == rem || len + GROUP_HEADER_SIZE as u64 <= rem
}

/// Bytes of block left at `lsn` (what a padding group at `lsn` must fill).
pub fn block_remaining(lsn: Lsn, block_size: u64) -> u64 {
    block_size - lsn % block_size
}

/// Fields the sealing leader supplies for a group.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SealParams {
    /// The leader's proposal id.
    pub proposal_id: u64,
    /// The leader's committed end LSN (must be `<=` the group's LSN).
    pub committed_end_lsn: Lsn,
    /// Extra flags (`FLAG_MIRRORED`); `FLAG_PADDING` is set by [`encode_padding`] only.
    pub flags: u8,
}

/// Seals a group in place: `buf[..GROUP_HEADER_SIZE]` is overwritten with the header and
/// `buf[GROUP_HEADER_SIZE..]` is the body of `entry_count` entries already written there
/// (the lock-free write path copies records straight into this buffer; PALF section 6).
///
/// `max_csn` is the CSN of the last entry (or the chain's for an empty group).
pub fn seal_group(
    buf: &mut [u8],
    prev: &ChainPoint,
    params: SealParams,
    entry_count: u32,
    max_csn: Csn,
) -> GroupHeader {
    debug_assert!(buf.len() >= GROUP_HEADER_SIZE);
    debug_assert!(params.committed_end_lsn <= prev.end_lsn);
    let body = &buf[GROUP_HEADER_SIZE..];
    let data_crc = crc32c(body);
    let h = GroupHeader {
        flags: params.flags & !FLAG_PADDING,
        body_len: body.len() as u32,
        lsn: prev.end_lsn,
        proposal_id: params.proposal_id,
        committed_end_lsn: params.committed_end_lsn,
        max_csn,
        group_seq: prev.next_group_seq,
        data_crc,
        acc_crc: chain_acc(prev.acc_crc, params.proposal_id, data_crc),
        entry_count,
    };
    buf[..GROUP_HEADER_SIZE].copy_from_slice(&h.encode());
    h
}

/// Encodes a group of `records` (CSNs and data) after `prev` into `out`; returns its
/// header. A convenience over [`seal_group`] for tests and tools.
pub fn encode_group(
    out: &mut Vec<u8>,
    prev: &ChainPoint,
    params: SealParams,
    records: &[(Csn, &[u8])],
) -> GroupHeader {
    let start = out.len();
    out.resize(start + GROUP_HEADER_SIZE, 0);
    for (csn, data) in records {
        super::entry::encode_entry(out, *csn, data);
    }
    let max_csn = records.last().map_or(prev.max_csn, |r| r.0);
    seal_group(
        &mut out[start..],
        prev,
        params,
        records.len() as u32,
        max_csn,
    )
}

/// Encodes a padding group of exactly `len` bytes (`len >= GROUP_HEADER_SIZE`) after
/// `prev` into `out`: it fills the tail of a block so that no group straddles blocks.
pub fn encode_padding(
    out: &mut Vec<u8>,
    prev: &ChainPoint,
    proposal_id: u64,
    committed_end_lsn: Lsn,
    len: u64,
) -> GroupHeader {
    debug_assert!(len >= GROUP_HEADER_SIZE as u64);
    let start = out.len();
    out.resize(start + len as usize, 0);
    let body = &out[start + GROUP_HEADER_SIZE..];
    let data_crc = crc32c(body);
    let h = GroupHeader {
        flags: FLAG_PADDING,
        body_len: body.len() as u32,
        lsn: prev.end_lsn,
        proposal_id,
        committed_end_lsn,
        max_csn: prev.max_csn,
        group_seq: prev.next_group_seq,
        data_crc,
        acc_crc: chain_acc(prev.acc_crc, proposal_id, data_crc),
        entry_count: 0,
    };
    out[start..start + GROUP_HEADER_SIZE].copy_from_slice(&h.encode());
    h
}

/// Decodes a whole group at the start of `buf` and checks everything that can be checked
/// without its neighbours: header, body checksum, and the entries (count, each entry's
/// checksums, CSNs strictly increasing and ending at `max_csn`, no trailing bytes).
pub fn decode_group(buf: &[u8]) -> Result<(GroupHeader, &[u8]), FormatError> {
    let h = GroupHeader::decode(buf)?;
    let end = h.total_len() as usize;
    if buf.len() < end {
        return Err(FormatError::Truncated {
            what: "group body",
            need: end as u64,
            have: buf.len() as u64,
        });
    }
    let body = &buf[GROUP_HEADER_SIZE..end];
    h.verify_body(body)?;
    verify_entries(&h, body)?;
    Ok((h, body))
}

/// Checks the entries of a body whose checksum already matched: see [`decode_group`].
pub fn verify_entries(h: &GroupHeader, body: &[u8]) -> Result<(), FormatError> {
    if h.is_padding() {
        return Ok(());
    }
    let mut count = 0u32;
    let mut last_csn: Option<Csn> = None;
    for e in EntryIter::new(body) {
        let e = e?;
        if let Some(prev) = last_csn {
            if e.csn <= prev {
                return Err(FormatError::Malformed {
                    what: "group body",
                    detail: format!(
                        "entry at body offset {} has csn {} not above the previous {}",
                        e.offset, e.csn, prev
                    ),
                });
            }
        }
        last_csn = Some(e.csn);
        count += 1;
    }
    if count != h.entry_count {
        return Err(FormatError::FieldMismatch {
            what: "group body",
            field: "entry_count",
            expected: h.entry_count as u64,
            found: count as u64,
        });
    }
    if let Some(csn) = last_csn {
        if csn != h.max_csn {
            return Err(FormatError::FieldMismatch {
                what: "group body",
                field: "max_csn",
                expected: h.max_csn,
                found: csn,
            });
        }
    }
    Ok(())
}

/// LSN of each entry of a group: the group's LSN plus the header plus the entry's offset.
pub fn entry_lsn(group_lsn: Lsn, body_offset: usize) -> Lsn {
    group_lsn + GROUP_HEADER_SIZE as u64 + body_offset as u64
}

/// The smallest group that can carry one record of `data_len` bytes.
pub fn min_group_size(data_len: usize) -> usize {
    GROUP_HEADER_SIZE + ENTRY_HEADER_SIZE + data_len
}

/// Decodes `data` as one group and, if it decodes, checks that re-encoding gives the same
/// bytes. The body of the `group` cargo-fuzz target; panics only on a real bug.
pub fn fuzz_decode(data: &[u8]) {
    if let Ok((h, body)) = decode_group(data) {
        let again = GroupHeader::decode(&h.encode()).expect("re-decode of an encoded header");
        assert_eq!(again, h);
        assert_eq!(&h.encode()[..], &data[..GROUP_HEADER_SIZE]);
        assert_eq!(body.len(), h.body_len as usize);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn params() -> SealParams {
        SealParams {
            proposal_id: 3,
            committed_end_lsn: 0,
            flags: 0,
        }
    }

    #[test]
    fn round_trip_and_chain() {
        let start = ChainPoint::default();
        let mut out = Vec::new();
        let h1 = encode_group(&mut out, &start, params(), &[(1, b"a"), (2, b"bc")]);
        let p1 = h1.chain_after();
        let h2 = encode_group(&mut out, &p1, params(), &[(5, b"xyz")]);
        let (d1, _) = decode_group(&out).unwrap();
        assert_eq!(d1, h1);
        d1.verify_chain(&start).unwrap();
        let (d2, body) = decode_group(&out[h1.total_len() as usize..]).unwrap();
        assert_eq!(d2, h2);
        d2.verify_chain(&p1).unwrap();
        assert_eq!(d2.lsn, h1.end_lsn());
        let entries: Vec<_> = EntryIter::new(body).map(|e| e.unwrap()).collect();
        assert_eq!(entries[0].data, b"xyz");
        // Breaking the chain is detected with the expected value named.
        let wrong = ChainPoint { acc_crc: 1, ..p1 };
        assert!(matches!(
            d2.verify_chain(&wrong),
            Err(FormatError::AccumulatedChecksum { .. })
        ));
    }

    #[test]
    fn padding_fills_exactly() {
        let prev = ChainPoint {
            end_lsn: 100,
            acc_crc: 7,
            next_group_seq: 4,
            max_csn: 9,
        };
        let mut out = Vec::new();
        let h = encode_padding(&mut out, &prev, 2, 50, 156);
        assert_eq!(out.len(), 156);
        assert!(h.is_padding());
        assert_eq!(h.end_lsn(), 256);
        let (d, _) = decode_group(&out).unwrap();
        d.verify_chain(&prev).unwrap();
        assert_eq!(d.max_csn, 9);
    }

    #[test]
    fn placement_rule() {
        assert!(fits_in_block(0, 1024, 1024));
        assert!(fits_in_block(0, 960, 1024));
        assert!(!fits_in_block(0, 961, 1024));
        assert!(!fits_in_block(0, 1025, 1024));
        assert!(fits_in_block(1024 + 64, 960, 1024));
        assert_eq!(block_remaining(1024 + 64, 1024), 960);
    }

    #[test]
    fn entry_level_errors() {
        let mut out = Vec::new();
        let h = encode_group(
            &mut out,
            &ChainPoint::default(),
            params(),
            &[(1, b"a"), (2, b"b")],
        );
        // Entry count lie, with valid checksums: reseal the header.
        let mut lie = h;
        lie.entry_count = 3;
        out[..64].copy_from_slice(&lie.encode());
        assert!(matches!(
            decode_group(&out),
            Err(FormatError::FieldMismatch {
                field: "entry_count",
                ..
            })
        ));
        // CSNs must increase.
        let mut out = Vec::new();
        encode_group(
            &mut out,
            &ChainPoint::default(),
            params(),
            &[(2, b"a"), (2, b"b")],
        );
        assert!(matches!(
            decode_group(&out),
            Err(FormatError::Malformed { .. })
        ));
        // A group claiming to be committed itself is refused.
        let mut out = Vec::new();
        let mut h = encode_group(&mut out, &ChainPoint::default(), params(), &[(1, b"a")]);
        h.committed_end_lsn = 10;
        out[..64].copy_from_slice(&h.encode());
        assert!(matches!(
            decode_group(&out),
            Err(FormatError::Malformed { .. })
        ));
    }

    proptest! {
        #[test]
        fn prop_round_trip(
            recs in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..20),
            start_lsn in 0u64..1 << 40,
            acc in any::<u32>(),
            seq in 0u64..1 << 40,
            proposal in any::<u64>(),
        ) {
            let prev = ChainPoint { end_lsn: start_lsn, acc_crc: acc, next_group_seq: seq, max_csn: 0 };
            let records: Vec<(Csn, &[u8])> =
                recs.iter().enumerate().map(|(i, r)| (i as u64 + 1, &r[..])).collect();
            let mut out = Vec::new();
            let sp = SealParams { proposal_id: proposal, committed_end_lsn: start_lsn / 2, flags: FLAG_MIRRORED };
            let h = encode_group(&mut out, &prev, sp, &records);
            let (d, body) = decode_group(&out).unwrap();
            prop_assert_eq!(d, h);
            d.verify_chain(&prev).unwrap();
            let got: Vec<&[u8]> = EntryIter::new(body).map(|e| e.unwrap().data).collect();
            let want: Vec<&[u8]> = recs.iter().map(|r| &r[..]).collect();
            prop_assert_eq!(got, want);
        }

        #[test]
        fn prop_decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            fuzz_decode(&bytes);
        }

        #[test]
        fn prop_single_bit_flip_detected(bit in 0usize..(64 + 2 * 25) * 8) {
            let mut out = Vec::new();
            encode_group(&mut out, &ChainPoint::default(), params(), &[(1, b"a"), (2, b"b")]);
            out[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(decode_group(&out).is_err());
        }
    }
}
