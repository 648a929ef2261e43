//! Byte formats of out-of-order groups: the entry record (on disk and inside messages),
//! the hard state, and the replication messages of [`crate::ooo::replica`].
//!
//! Little-endian throughout. Lists are a `u32` count followed by the items; a count is
//! checked against the bytes left before anything is allocated, so a hostile count cannot
//! make the decoder allocate more than the input's size.
//!
//! # Entry record (`ENTRY_HEADER_SIZE` = 48 bytes + body)
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | magic `0x4545_4F43` ("COEE") |
//! | 4 | 1 | version, 1 |
//! | 5 | 1 | kind: 0 NULL, 2 dependent, 4 parallel, 5 parallel with conflict-order predecessors (1 and 3: the same with fixed-width fields, read, no longer written) |
//! | 6 | 2 | reserved, 0 |
//! | 8 | 4 | body length `n` (at most [`MAX_BODY`]) |
//! | 12 | 4 | CRC32C of bytes 4..12 followed by bytes 16..48+n (everything but the magic and the checksum) |
//! | 16 | 8 | slot (`seq`) |
//! | 24 | 8 | term |
//! | 32 | 8 | start (first slot after the term's merge) |
//! | 40 | 8 | eid (0 for NULL) |
//! | 48 | n | body |
//!
//! A *varint* is LEB128 (seven bits a byte, least significant first, the high bit on every
//! byte but the last; at most 10 bytes, no zero last byte after the first). A *compact
//! range list* is a varint count, then per range varint `start` and varint length (≥ 1).
//!
//! Body of a NULL entry: empty. Parallel (kind 4): ranges (compact range list), the
//! look-behind buffer (varint count of compact range lists, nearest predecessor first),
//! data (`u32` length, bytes). Parallel with conflict-order predecessors (kind 5, written
//! only when the list is not empty): ranges, look-behind buffer, the predecessors (varint
//! count, at least one, of varint slots), data. Kinds 1 and 3, still read, are kinds 4
//! and 5 with `u32` counts, ranges as `u64 start, u64 end` and slots as `u64`.
//! Dependent: `u64` base, RAW list of `u64`, WAW list of `u64`, write-set list of `u64`,
//! data (`u32` length, bytes). An empty range or one past 2^64 is refused, and so is a
//! kind-3 or kind-5 entry with an empty list.
//!
//! # Group payload
//!
//! The data of an entry written by the runtime is a group of records
//! ([`crate::ooo::group`]): `u32` magic `0x5247_4F43` ("COGR"), `u32` record count (at
//! least 1), then per record a kind byte (3: block ranges, 2: read and write sets; 1:
//! block ranges with fixed-width fields, read, no longer written), its declaration (kind
//! 3: a compact range list; kind 2: read-set list of `u64`, write-set list of `u64`;
//! kind 1: list of `u64 start, u64 end` ranges) and its data (`u32` length, bytes). The entry's own
//! declaration is the union of its records'. The entry record's checksum covers it.
//!
//! # Hard state (`HARD_SIZE` = 60 bytes)
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | magic `0x4848_4F43` ("COHH") |
//! | 4 | 2 | version, 2 |
//! | 6 | 2 | reserved, 0 (refused otherwise) |
//! | 8 | 8 | term |
//! | 16 | 8 | voted for (0: nobody; node ids are never 0) |
//! | 24 | 8 | committed head |
//! | 32 | 8 | leader start: term |
//! | 40 | 8 | leader start: slot |
//! | 48 | 8 | base: every slot below is compacted (in the state machine's durable image) |
//! | 56 | 4 | CRC32C of bytes 0..56 |
//!
//! Version 3 (`HARD_SIZE_V3` = 68 bytes) is written only while the replica is recovering
//! entries it lost on disk (`Hard::lost_below` not 0): version 3 at offset 4, the
//! fields above up to offset 56, then
//!
//! | offset | size | field |
//! |---|---|---|
//! | 56 | 8 | lost below: the replica may have lost entries it acknowledged in terms below this one (never 0 in version 3) |
//! | 64 | 4 | CRC32C of bytes 0..64 |
//!
//! A version-3 record whose `lost below` is 0 is refused (that state is written as
//! version 2, so every hard state has one encoding). Version 1 (52 bytes: no base, the
//! CRC at 48) is still read, as base 0.
//!
//! # Messages
//!
//! A message is one tag byte (1 Vote, 2 VoteReply, 3 Append, 4 Ack, 5 Snapshot, 6
//! TimeoutNow, 7 Config, 8 ConfigAck, 9 Newer, 10 PreVote, 11 PreVoteReply, 12 AskEnd, 13
//! End, 14 ReadProbe, 15 ReadProbeAck, 16 VotePart, 17 VoteMore) and its
//! fields in declaration order: integers as `u64`, `bool` as one byte 0/1, an
//! `Option<u64>` as a byte 0/1 and a `u64` (0 when absent; anything else is refused), a [`VoteLog`]
//! as its four `u64` fields, a snapshot piece's data as `u32` length and bytes, a [`CommitWindow`] as
//! `u64` head and a list of `u64` words, entries as a list of entry records (each a `u32`
//! length and the record), a vote's versions as a list of (`u32` length, entry record,
//! committed byte). The transport adds the framing and the checksum of the whole message.

use super::{FormatError, Reader};
use crate::ooo::dependent::{Deps, VoteLog};
use crate::ooo::group::Record;
use crate::ooo::parallel::BlockRange;
use crate::ooo::replica::{Body, Declared, Entry, Hard, Membership, Msg};
use crate::ooo::{CommitWindow, Seq};

/// Magic of an entry record ("COEE").
pub const ENTRY_MAGIC: u32 = 0x4545_4F43;
/// Magic of a group payload ("COGR").
pub const GROUP_MAGIC: u32 = 0x5247_4F43;
/// Magic of the hard state ("COHH").
pub const HARD_MAGIC: u32 = 0x4848_4F43;
/// Header bytes of an entry record.
pub const ENTRY_HEADER_SIZE: usize = 48;
/// Largest body of an entry record.
pub const MAX_BODY: u32 = 64 << 20;
/// Bytes of the hard state record (version 2).
pub const HARD_SIZE: usize = 60;
/// Bytes of a version-3 hard state record (a replica recovering lost entries).
pub const HARD_SIZE_V3: usize = 68;
/// Bytes of a version-1 hard state record (no base), still read.
pub const HARD_SIZE_V1: usize = 52;

const WHAT_ENTRY: &str = "out-of-order entry";
const WHAT_HARD: &str = "out-of-order hard state";
const WHAT_MSG: &str = "out-of-order message";
const WHAT_GROUP: &str = "out-of-order group payload";
const WHAT_MEMBERS: &str = "out-of-order membership";
/// Magic of the membership record, "COMM".
pub const MEMBERS_MAGIC: u32 = 0x4D4D_4F43;
/// Voters a membership may name in each set (a bound for decoding, far above any group).
pub const MAX_VOTERS: usize = 64;

/// Field readers of the out-of-order formats, on the shared [`Reader`].
impl Reader<'_> {
    /// A list count, refused if even `min_item` bytes per item cannot fit.
    fn count(&mut self, field: &'static str, min_item: usize) -> Result<usize, FormatError> {
        let n = self.u32()?;
        self.fits(field, n.into(), min_item)
    }

    /// `n` items of at least `min_item` bytes each, refused unless they fit in the bytes
    /// left.
    fn fits(&self, field: &'static str, n: u64, min_item: usize) -> Result<usize, FormatError> {
        let left = (self.buf.len() - self.pos) as u64;
        let min_item = min_item.max(1) as u64;
        if n.saturating_mul(min_item) > left {
            return Err(FormatError::LengthOutOfRange {
                what: self.what,
                field,
                value: n,
                min: 0,
                max: left / min_item,
            });
        }
        Ok(n as usize)
    }

    fn u64s(&mut self, field: &'static str) -> Result<Vec<u64>, FormatError> {
        let n = self.count(field, 8)?;
        (0..n).map(|_| self.u64()).collect()
    }

    /// An LEB128 integer ([`put_var`]): at most 10 bytes, the last without its high bit,
    /// and no byte of zeros after the first (one encoding per value, so a damaged record
    /// cannot read as a different value with the same bytes elsewhere).
    fn var(&mut self, field: &'static str) -> Result<u64, FormatError> {
        let mut x = 0u64;
        for i in 0..10 {
            let b = self.u8()?;
            if i == 9 && b > 1 {
                return Err(self.malformed(format!("{field}: a varint past 64 bits")));
            }
            if i > 0 && b == 0 {
                return Err(self.malformed(format!("{field}: a varint with a zero last byte")));
            }
            x |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(x);
            }
        }
        Err(self.malformed(format!("{field}: a varint longer than 10 bytes")))
    }

    /// A list count as a varint, refused if even `min_item` bytes per item cannot fit.
    fn var_count(&mut self, field: &'static str, min_item: usize) -> Result<usize, FormatError> {
        let n = self.var(field)?;
        self.fits(field, n, min_item)
    }

    /// A compact range list ([`put_compact_ranges`]).
    fn compact_ranges(&mut self) -> Result<Vec<BlockRange>, FormatError> {
        let n = self.var_count("ranges", 2)?;
        (0..n)
            .map(|_| {
                let (start, len) = (self.var("range start")?, self.var("range length")?);
                BlockRange::new(start, len).ok_or_else(|| {
                    self.malformed(format!(
                        "block range of {len} blocks at {start}: empty or past 2^64"
                    ))
                })
            })
            .collect()
    }

    fn vars(&mut self, field: &'static str) -> Result<Vec<u64>, FormatError> {
        let n = self.var_count(field, 1)?;
        (0..n).map(|_| self.var(field)).collect()
    }

    fn ranges(&mut self) -> Result<Vec<BlockRange>, FormatError> {
        let n = self.count("ranges", 16)?;
        (0..n)
            .map(|_| {
                let (start, end) = (self.u64()?, self.u64()?);
                if start >= end {
                    return Err(FormatError::Malformed {
                        what: self.what,
                        detail: format!("empty block range {start}..{end}"),
                    });
                }
                Ok(BlockRange { start, end })
            })
            .collect()
    }
}

fn put_u32(out: &mut Vec<u8>, x: u32) {
    out.extend_from_slice(&x.to_le_bytes());
}

fn put_u64(out: &mut Vec<u8>, x: u64) {
    out.extend_from_slice(&x.to_le_bytes());
}

fn put_u64s(out: &mut Vec<u8>, xs: &[u64]) {
    put_u32(out, xs.len() as u32);
    for &x in xs {
        put_u64(out, x);
    }
}

/// Kinds 1 and 3 and group record kind 1 (read, no longer written): tests build them.
#[cfg(test)]
fn put_ranges(out: &mut Vec<u8>, rs: &[BlockRange]) {
    put_u32(out, rs.len() as u32);
    for r in rs {
        put_u64(out, r.start);
        put_u64(out, r.end);
    }
}

/// LEB128: seven bits a byte, least significant first, the high bit set on every byte
/// but the last (1 byte below 128, 10 for the largest `u64`).
fn put_var(out: &mut Vec<u8>, mut x: u64) {
    while x >= 0x80 {
        out.push(x as u8 | 0x80);
        x >>= 7;
    }
    out.push(x as u8);
}

fn put_vars(out: &mut Vec<u8>, xs: &[u64]) {
    put_var(out, xs.len() as u64);
    for &x in xs {
        put_var(out, x);
    }
}

/// A range list as varints: count, then each range's start and length (2 bytes a
/// range for small block numbers against 16 as `u64 start, u64 end`; a transaction's
/// key declared as a block is a 1-block range).
fn put_compact_ranges(out: &mut Vec<u8>, rs: &[BlockRange]) {
    put_var(out, rs.len() as u64);
    for r in rs {
        put_var(out, r.start);
        put_var(out, r.end - r.start);
    }
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_u32(out, b.len() as u32);
    out.extend_from_slice(b);
}

/// CRC32C of bytes 4..12 and 16.. of a record (all but the magic and the checksum).
fn entry_crc(rec: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&rec[4..12]), &rec[16..])
}

/// Encodes an entry record.
pub fn encode_entry(e: &Entry) -> Vec<u8> {
    let mut out = Vec::new();
    encode_entry_into(e, &mut out);
    out
}

/// About the bytes of an entry's record: its header and data and room for a short
/// declaration, so that one reservation usually covers the encoding.
fn record_len_hint(e: &Entry) -> usize {
    let data = match &e.body {
        Body::Null => 0,
        Body::Parallel { data, .. } | Body::Dependent { data, .. } => data.len(),
    };
    ENTRY_HEADER_SIZE + 64 + data
}

/// Appends the entry record of `e` to `out` — the bytes [`encode_entry`] returns — with
/// the body written in place and its length and checksum filled in after, so a group's
/// data is copied once (into `out`) on the way to a frame or the entries file, not
/// through a body buffer and a record buffer first.
pub fn encode_entry_into(e: &Entry, out: &mut Vec<u8>) {
    let at = out.len();
    out.reserve(record_len_hint(e));
    put_u32(out, ENTRY_MAGIC);
    out.extend_from_slice(&[1, 0, 0, 0]); // kind, below
    put_u32(out, 0); // body length, below
    put_u32(out, 0); // checksum, below
    put_u64(out, e.seq);
    put_u64(out, e.term);
    put_u64(out, e.start);
    put_u64(out, e.eid);
    let body = out.len();
    let kind = match &e.body {
        Body::Null => 0u8,
        Body::Parallel {
            ranges,
            look_behind,
            after,
            data,
        } => {
            // Kinds 4 and 5 (compact: varint ranges and lists). Kinds 1 and 3 (the same
            // with `u64` fields) are still read: the look-behind buffer repeats the
            // ranges of the previous entries, and at 16 bytes a range a group of small
            // transactions carried more ranges than data (bench/results/2026-11-26-ooo-n/NOTES.md).
            put_compact_ranges(out, ranges);
            put_var(out, look_behind.len() as u64);
            for lb in look_behind {
                put_compact_ranges(out, lb);
            }
            // An entry without predecessors is kind 4, so that groups without conflict
            // order carry no list.
            if !after.is_empty() {
                put_vars(out, after);
            }
            put_bytes(out, data);
            if after.is_empty() {
                4
            } else {
                5
            }
        }
        Body::Dependent {
            base,
            deps,
            write_set,
            data,
        } => {
            put_u64(out, *base);
            put_u64s(out, &deps.raw);
            put_u64s(out, &deps.waw);
            put_u64s(out, write_set);
            put_bytes(out, data);
            2
        }
    };
    let n = (out.len() - body) as u32;
    out[at + 5] = kind;
    out[at + 8..at + 12].copy_from_slice(&n.to_le_bytes());
    let crc = entry_crc(&out[at..]);
    out[at + 12..at + 16].copy_from_slice(&crc.to_le_bytes());
}

/// The total length of the entry record at the front of `buf`, from its header, or an
/// error if the header is not one. Lets a reader find record boundaries in a file.
pub fn entry_len(buf: &[u8]) -> Result<usize, FormatError> {
    let mut r = Reader::new(buf, WHAT_ENTRY, "");
    let magic = r.u32()?;
    if magic != ENTRY_MAGIC {
        return Err(FormatError::BadMagic {
            what: WHAT_ENTRY,
            expected: ENTRY_MAGIC.into(),
            found: magic.into(),
        });
    }
    let version = r.u8()?;
    if version != 1 {
        return Err(FormatError::UnknownVersion {
            what: WHAT_ENTRY,
            found: version.into(),
            supported: 1,
        });
    }
    r.take(3)?;
    let n = r.u32()?;
    if n > MAX_BODY {
        return Err(FormatError::LengthOutOfRange {
            what: WHAT_ENTRY,
            field: "body length",
            value: n.into(),
            min: 0,
            max: MAX_BODY.into(),
        });
    }
    Ok(ENTRY_HEADER_SIZE + n as usize)
}

/// Decodes exactly one entry record.
pub fn decode_entry(buf: &[u8]) -> Result<Entry, FormatError> {
    let len = entry_len(buf)?;
    if buf.len() != len {
        return Err(FormatError::FieldMismatch {
            what: WHAT_ENTRY,
            field: "record length",
            expected: len as u64,
            found: buf.len() as u64,
        });
    }
    let stored = u32::from_le_bytes(buf[12..16].try_into().expect("4"));
    let crc = entry_crc(buf);
    if stored != crc {
        return Err(FormatError::DataChecksum {
            what: WHAT_ENTRY,
            expected: stored,
            found: crc,
        });
    }
    let mut r = Reader::new(buf, WHAT_ENTRY, "");
    r.take(5)?;
    let kind = r.u8()?;
    if r.take(2)? != [0, 0] {
        return Err(FormatError::Malformed {
            what: WHAT_ENTRY,
            detail: "reserved bytes are not zero".into(),
        });
    }
    r.take(8)?;
    let (seq, term, start, eid) = (r.u64()?, r.u64()?, r.u64()?, r.u64()?);
    let body = match kind {
        0 => Body::Null,
        1 | 3 | 4 | 5 => {
            let compact = kind >= 4;
            let list = |r: &mut Reader| {
                if compact {
                    r.compact_ranges()
                } else {
                    r.ranges()
                }
            };
            let ranges = list(&mut r)?;
            let n = if compact {
                r.var_count("look-behind buffer", 1)?
            } else {
                r.count("look-behind buffer", 4)?
            };
            let look_behind = (0..n).map(|_| list(&mut r)).collect::<Result<_, _>>()?;
            let after = if kind == 3 || kind == 5 {
                let field = "conflict-order predecessors";
                let after = if compact {
                    r.vars(field)?
                } else {
                    r.u64s(field)?
                };
                if after.is_empty() {
                    return Err(FormatError::Malformed {
                        what: WHAT_ENTRY,
                        detail: format!(
                            "kind {kind} (parallel with conflict-order predecessors) lists none"
                        ),
                    });
                }
                after
            } else {
                Vec::new()
            };
            let data = r.shared_bytes()?;
            Body::Parallel {
                ranges,
                look_behind,
                after,
                data,
            }
        }
        2 => {
            let base = r.u64()?;
            let raw = r.u64s("RAW list")?;
            let waw = r.u64s("WAW list")?;
            let write_set = r.u64s("write set")?;
            let data = r.shared_bytes()?;
            Body::Dependent {
                base,
                deps: Deps { raw, waw },
                write_set,
                data,
            }
        }
        k => {
            return Err(FormatError::Malformed {
                what: WHAT_ENTRY,
                detail: format!("unknown kind {k}"),
            })
        }
    };
    r.done()?;
    if matches!(body, Body::Null) != (eid == 0) {
        return Err(FormatError::Malformed {
            what: WHAT_ENTRY,
            detail: "eid 0 is for NULL entries only".into(),
        });
    }
    Ok(Entry {
        seq,
        term,
        start,
        eid,
        body,
    })
}

/// Encodes records as a group entry's data (see the module documentation, "Group
/// payload").
pub fn encode_group(records: &[Record]) -> Vec<u8> {
    let size: usize = records.iter().map(|r| r.data.len() + 32).sum();
    let mut out = Vec::with_capacity(8 + size);
    put_u32(&mut out, GROUP_MAGIC);
    put_u32(&mut out, records.len() as u32);
    for r in records {
        match &r.declared {
            Declared::Blocks(rs) => {
                // Kind 3: compact ranges (kind 1, `u64` pairs, is still read).
                out.push(3);
                put_compact_ranges(&mut out, rs);
            }
            Declared::Txn {
                read_set,
                write_set,
            } => {
                out.push(2);
                put_u64s(&mut out, read_set);
                put_u64s(&mut out, write_set);
            }
        }
        put_bytes(&mut out, &r.data);
    }
    out
}

/// Decodes a group entry's data into its records (at least one).
pub fn decode_group(buf: &[u8]) -> Result<Vec<Record>, FormatError> {
    let mut r = Reader::new(buf, WHAT_GROUP, "");
    let magic = r.u32()?;
    if magic != GROUP_MAGIC {
        return Err(FormatError::BadMagic {
            what: WHAT_GROUP,
            expected: GROUP_MAGIC.into(),
            found: magic.into(),
        });
    }
    // The smallest record is a kind byte, an empty compact list and an empty data length.
    let n = r.count("records", 6)?;
    if n == 0 {
        return Err(FormatError::Malformed {
            what: WHAT_GROUP,
            detail: "a group of no records".into(),
        });
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let declared = match r.u8()? {
            1 => Declared::Blocks(r.ranges()?),
            3 => Declared::Blocks(r.compact_ranges()?),
            2 => Declared::Txn {
                read_set: r.u64s("read set")?,
                write_set: r.u64s("write set")?,
            },
            k => {
                return Err(FormatError::Malformed {
                    what: WHAT_GROUP,
                    detail: format!("unknown record kind {k}"),
                })
            }
        };
        out.push(Record {
            declared,
            data: r.bytes()?,
        });
    }
    r.done()?;
    Ok(out)
}

/// Encodes the hard state: magic u32, version u16 (2), reserved u16, term u64, voted-for
/// u64 (0 = none), committed head u64, leader-start term u64, leader-start slot u64, base
/// u64, CRC32C u32 of the 56 bytes before it.
pub fn encode_hard(h: &Hard) -> Vec<u8> {
    let lost = h.lost_below != 0;
    let mut out = Vec::with_capacity(HARD_SIZE_V3);
    put_u32(&mut out, HARD_MAGIC);
    out.extend_from_slice(&[if lost { 3 } else { 2 }, 0, 0, 0]);
    put_u64(&mut out, h.term);
    put_u64(&mut out, h.voted_for.unwrap_or(0));
    put_u64(&mut out, h.committed_head);
    put_u64(&mut out, h.leader_start.0);
    put_u64(&mut out, h.leader_start.1);
    put_u64(&mut out, h.base);
    if lost {
        put_u64(&mut out, h.lost_below);
    }
    let crc = crc32c::crc32c(&out);
    put_u32(&mut out, crc);
    out
}

/// Decodes the hard state (version 2 or 3, or version 1 as base 0).
pub fn decode_hard(buf: &[u8]) -> Result<Hard, FormatError> {
    if buf.len() != HARD_SIZE && buf.len() != HARD_SIZE_V1 && buf.len() != HARD_SIZE_V3 {
        return Err(FormatError::FieldMismatch {
            what: WHAT_HARD,
            field: "record length",
            expected: HARD_SIZE as u64,
            found: buf.len() as u64,
        });
    }
    let mut r = Reader::new(buf, WHAT_HARD, "");
    let magic = r.u32()?;
    if magic != HARD_MAGIC {
        return Err(FormatError::BadMagic {
            what: WHAT_HARD,
            expected: HARD_MAGIC.into(),
            found: magic.into(),
        });
    }
    let version = u16::from_le_bytes(r.take(2)?.try_into().expect("2"));
    let body = match (version, buf.len()) {
        (3, HARD_SIZE_V3) => 64,
        (2, HARD_SIZE) => 56,
        (1, HARD_SIZE_V1) => 48,
        (1..=3, n) => {
            return Err(FormatError::FieldMismatch {
                what: WHAT_HARD,
                field: "record length for its version",
                expected: match version {
                    3 => HARD_SIZE_V3,
                    2 => HARD_SIZE,
                    _ => HARD_SIZE_V1,
                } as u64,
                found: n as u64,
            })
        }
        _ => {
            return Err(FormatError::UnknownVersion {
                what: WHAT_HARD,
                found: version,
                supported: 3,
            })
        }
    };
    if r.take(2)? != [0, 0] {
        return Err(FormatError::Malformed {
            what: WHAT_HARD,
            detail: "reserved bytes are not zero".into(),
        });
    }
    let stored = u32::from_le_bytes(buf[body..body + 4].try_into().expect("4"));
    let crc = crc32c::crc32c(&buf[..body]);
    if stored != crc {
        return Err(FormatError::HeaderChecksum {
            what: WHAT_HARD,
            expected: stored,
            found: crc,
        });
    }
    let term = r.u64()?;
    let voted = r.u64()?;
    let committed_head = r.u64()?;
    let leader_start = (r.u64()?, r.u64()?);
    let base = if version >= 2 { r.u64()? } else { 0 };
    let lost_below = if version == 3 { r.u64()? } else { 0 };
    if version == 3 && lost_below == 0 {
        return Err(FormatError::Malformed {
            what: WHAT_HARD,
            detail: "version 3 with lost-below 0 (that state is written as version 2)".into(),
        });
    }
    Ok(Hard {
        term,
        voted_for: (voted != 0).then_some(voted),
        committed_head,
        leader_start,
        base,
        lost_below,
    })
}

/// The membership's fields: version term u64, version count u64, voters (list of u64),
/// a byte 1 and the previous voters (list of u64) during a joint stage or a byte 0.
fn put_membership(out: &mut Vec<u8>, m: &Membership) {
    put_u64(out, m.version.0);
    put_u64(out, m.version.1);
    put_u64s(out, &m.voters);
    match &m.prev {
        Some(p) => {
            out.push(1);
            put_u64s(out, p);
        }
        None => out.push(0),
    }
}

fn read_voters(r: &mut Reader<'_>, field: &'static str) -> Result<Vec<u64>, FormatError> {
    let v = r.u64s(field)?;
    if v.len() > MAX_VOTERS || v.contains(&0) || v.windows(2).any(|w| w[0] >= w[1]) {
        return Err(FormatError::Malformed {
            what: WHAT_MEMBERS,
            detail: format!("{field} {v:?}: at most {MAX_VOTERS} node ids, ascending, none 0"),
        });
    }
    Ok(v)
}

fn read_membership(r: &mut Reader<'_>) -> Result<Membership, FormatError> {
    let version = (r.u64()?, r.u64()?);
    let voters = read_voters(r, "voters")?;
    let prev = if r.flag("joint stage")? {
        Some(read_voters(r, "previous voters")?)
    } else {
        None
    };
    Ok(Membership {
        version,
        voters,
        prev,
    })
}

/// Encodes the membership record of the `members` file: magic u32, version u16 (1),
/// reserved u16, body length u32, CRC32C u32 of the body, then the body
/// (the membership fields described in `docs/formats.md`).
pub fn encode_membership(m: &Membership) -> Vec<u8> {
    let mut body = Vec::new();
    put_membership(&mut body, m);
    let mut out = Vec::with_capacity(16 + body.len());
    put_u32(&mut out, MEMBERS_MAGIC);
    out.extend_from_slice(&[1, 0, 0, 0]);
    put_u32(&mut out, body.len() as u32);
    put_u32(&mut out, crc32c::crc32c(&body));
    out.extend_from_slice(&body);
    out
}

/// Decodes the membership record.
pub fn decode_membership(buf: &[u8]) -> Result<Membership, FormatError> {
    let mut r = Reader::new(buf, WHAT_MEMBERS, "");
    let magic = r.u32()?;
    if magic != MEMBERS_MAGIC {
        return Err(FormatError::BadMagic {
            what: WHAT_MEMBERS,
            expected: MEMBERS_MAGIC.into(),
            found: magic.into(),
        });
    }
    let version = u16::from_le_bytes(r.take(2)?.try_into().expect("2"));
    if version != 1 {
        return Err(FormatError::UnknownVersion {
            what: WHAT_MEMBERS,
            found: version,
            supported: 1,
        });
    }
    if r.take(2)? != [0, 0] {
        return Err(FormatError::Malformed {
            what: WHAT_MEMBERS,
            detail: "reserved bytes are not zero".into(),
        });
    }
    let n = r.u32()? as usize;
    let stored = r.u32()?;
    let body = r.take(n)?;
    r.done()?;
    let crc = crc32c::crc32c(body);
    if stored != crc {
        return Err(FormatError::HeaderChecksum {
            what: WHAT_MEMBERS,
            expected: stored,
            found: crc,
        });
    }
    let mut b = Reader::new(body, WHAT_MEMBERS, "");
    let m = read_membership(&mut b)?;
    b.done()?;
    Ok(m)
}

/// The body of the `ooo` cargo-fuzz target. The first byte picks a decoder (entry record,
/// group payload, message, hard state, membership record) and the rest is its input.
/// Whatever decodes must re-encode to bytes that decode to the same value, and to the
/// input's own bytes unless it was read from a still-read older layout (entry kinds 1
/// and 3, group record kind 1, hard state version 1). Checksums would stop a fuzzer at
/// the header, so the entry, hard-state and membership inputs get theirs (and their
/// magic, version and length) filled in first, and the fuzzer reaches the field decoders.
pub fn fuzz_decode(data: &[u8]) {
    let Some((&which, input)) = data.split_first() else {
        return;
    };
    let mut b = input.to_vec();
    match which % 5 {
        0 => {
            if b.len() >= ENTRY_HEADER_SIZE {
                let Ok(n) = u32::try_from(b.len() - ENTRY_HEADER_SIZE) else {
                    return;
                };
                b[0..4].copy_from_slice(&ENTRY_MAGIC.to_le_bytes());
                b[4] = 1;
                b[8..12].copy_from_slice(&n.to_le_bytes());
                let crc = entry_crc(&b);
                b[12..16].copy_from_slice(&crc.to_le_bytes());
            }
            if let Ok(e) = decode_entry(&b) {
                let again = encode_entry(&e);
                assert_eq!(decode_entry(&again).as_ref(), Ok(&e), "entry re-decode");
                if b[5] != 1 && b[5] != 3 {
                    assert_eq!(again, b, "entry re-encode differs");
                }
            }
        }
        1 => {
            if let Ok(rs) = decode_group(&b) {
                let again = encode_group(&rs);
                assert_eq!(decode_group(&again).as_ref(), Ok(&rs), "group re-decode");
                assert!(again.len() <= b.len(), "group re-encode grew");
            }
        }
        2 => {
            if let Ok(m) = decode_msg(&b) {
                let again = encode_msg(&m);
                assert_eq!(decode_msg(&again).as_ref(), Ok(&m), "message re-decode");
            }
        }
        3 => {
            let body = match b.len() {
                HARD_SIZE_V3 => 64,
                HARD_SIZE => 56,
                HARD_SIZE_V1 => 48,
                _ => return,
            };
            b[0..4].copy_from_slice(&HARD_MAGIC.to_le_bytes());
            let crc = crc32c::crc32c(&b[..body]);
            b[body..body + 4].copy_from_slice(&crc.to_le_bytes());
            if let Ok(h) = decode_hard(&b) {
                let again = encode_hard(&h);
                assert_eq!(decode_hard(&again).as_ref(), Ok(&h), "hard state re-decode");
                if b.len() != HARD_SIZE_V1 {
                    assert_eq!(&again[..], &b[..], "hard state re-encode differs");
                }
            }
        }
        _ => {
            if b.len() >= 16 {
                let Ok(n) = u32::try_from(b.len() - 16) else {
                    return;
                };
                b[0..4].copy_from_slice(&MEMBERS_MAGIC.to_le_bytes());
                b[4..8].copy_from_slice(&[1, 0, 0, 0]);
                b[8..12].copy_from_slice(&n.to_le_bytes());
                let crc = crc32c::crc32c(&b[16..]);
                b[12..16].copy_from_slice(&crc.to_le_bytes());
            }
            if let Ok(m) = decode_membership(&b) {
                assert_eq!(encode_membership(&m), b, "membership re-encode differs");
            }
        }
    }
}

fn put_window(out: &mut Vec<u8>, w: &CommitWindow) {
    put_u64(out, w.head());
    put_u64s(out, w.bits());
}

fn put_entries(out: &mut Vec<u8>, es: &[Entry]) {
    // One reservation for the whole list rather than doublings that copy the groups.
    out.reserve(es.iter().map(|e| 4 + record_len_hint(e)).sum());
    put_u32(out, es.len() as u32);
    for e in es {
        put_entry(out, e);
    }
}

/// An entry record as a `u32` length and the record, encoded in place.
fn put_entry(out: &mut Vec<u8>, e: &Entry) {
    let at = out.len();
    put_u32(out, 0); // length, below
    encode_entry_into(e, out);
    let n = (out.len() - at - 4) as u32;
    out[at..at + 4].copy_from_slice(&n.to_le_bytes());
}

/// Encodes a message.
pub fn encode_msg(m: &Msg) -> Vec<u8> {
    let mut out = Vec::new();
    encode_msg_into(m, &mut out);
    out
}

/// Appends a message's encoding to `out` (what [`encode_msg`] returns), so a transport
/// encodes it straight into its output buffer.
pub fn encode_msg_into(m: &Msg, out: &mut Vec<u8>) {
    match m {
        Msg::Vote {
            term,
            head,
            log,
            config,
        } => {
            out.push(1);
            for x in [
                *term,
                *head,
                log.last_term,
                log.last_seq,
                log.first_uncommitted,
                log.base,
                config.0,
                config.1,
            ] {
                put_u64(out, x);
            }
        }
        Msg::VoteReply {
            term,
            granted,
            entries,
            leader_start,
        } => {
            out.push(2);
            put_u64(out, *term);
            out.push(u8::from(*granted));
            put_versions(out, entries);
            put_u64(out, leader_start.0);
            put_u64(out, leader_start.1);
        }
        Msg::VotePart {
            term,
            from,
            next,
            entries,
            leader_start,
        } => {
            out.push(16);
            put_u64(out, *term);
            put_u64(out, *from);
            out.push(u8::from(next.is_some()));
            put_u64(out, next.unwrap_or(0));
            put_versions(out, entries);
            put_u64(out, leader_start.0);
            put_u64(out, leader_start.1);
        }
        Msg::VoteMore { term, from } => {
            out.push(17);
            put_u64(out, *term);
            put_u64(out, *from);
        }
        Msg::Append {
            term,
            start,
            entries,
            commits,
            config,
        } => {
            out.push(3);
            put_u64(out, *term);
            put_u64(out, *start);
            put_entries(out, entries);
            put_window(out, commits);
            put_u64(out, config.0);
            put_u64(out, config.1);
        }
        Msg::Ack {
            term,
            seqs,
            head,
            applied,
        } => {
            out.push(4);
            put_u64(out, *term);
            put_u32(out, seqs.len() as u32);
            for (s, e) in seqs {
                put_u64(out, *s);
                put_u64(out, *e);
            }
            put_u64(out, *head);
            put_u64(out, *applied);
        }
        Msg::Snapshot {
            term,
            base,
            offset,
            total,
            part,
            data,
        } => {
            out.push(5);
            for x in [*term, *base, *offset, *total] {
                put_u64(out, x);
            }
            match part {
                Some(from) => {
                    out.push(1);
                    put_u64(out, *from);
                }
                None => {
                    out.push(0);
                    put_u64(out, 0);
                }
            }
            put_bytes(out, data);
        }
        Msg::TimeoutNow { term } => {
            out.push(6);
            put_u64(out, *term);
        }
        Msg::PreVote { term, log, config } => {
            out.push(10);
            for x in [
                *term,
                log.last_term,
                log.last_seq,
                log.first_uncommitted,
                log.base,
                config.0,
                config.1,
            ] {
                put_u64(out, x);
            }
        }
        Msg::PreVoteReply { term, granted } => {
            out.push(11);
            put_u64(out, *term);
            out.push(u8::from(*granted));
        }
        Msg::Config { term, membership } => {
            out.push(7);
            put_u64(out, *term);
            put_membership(out, membership);
        }
        Msg::Newer { membership } => {
            out.push(9);
            put_membership(out, membership);
        }
        Msg::AskEnd { term, nonce } => {
            out.push(12);
            put_u64(out, *term);
            put_u64(out, *nonce);
        }
        Msg::End { term, end } => {
            out.push(13);
            put_u64(out, *term);
            put_u64(out, *end);
        }
        Msg::ReadProbe { term, probe } => {
            out.push(14);
            put_u64(out, *term);
            put_u64(out, *probe);
        }
        Msg::ReadProbeAck { term, probe } => {
            out.push(15);
            put_u64(out, *term);
            put_u64(out, *probe);
        }
        Msg::ConfigAck {
            term,
            version,
            head,
        } => {
            out.push(8);
            for x in [*term, version.0, version.1, *head] {
                put_u64(out, x);
            }
        }
    }
}

/// A vote's versions: a `u32` count, then each as its entry record and a committed byte.
fn put_versions(out: &mut Vec<u8>, entries: &[(Entry, bool)]) {
    put_u32(out, entries.len() as u32);
    for (e, c) in entries {
        put_entry(out, e);
        out.push(u8::from(*c));
    }
}

fn read_versions(r: &mut Reader<'_>) -> Result<Vec<(Entry, bool)>, FormatError> {
    let n = r.count("versions", ENTRY_HEADER_SIZE + 5)?;
    let mut entries = Vec::with_capacity(n);
    for _ in 0..n {
        let e = read_entry(r)?;
        entries.push((e, r.flag("committed")?));
    }
    Ok(entries)
}

fn read_entry(r: &mut Reader<'_>) -> Result<Entry, FormatError> {
    let n = r.count("entry record", 1)?;
    decode_entry(r.take(n)?)
}

/// Decodes a message.
pub fn decode_msg(buf: &[u8]) -> Result<Msg, FormatError> {
    let mut r = Reader::new(buf, WHAT_MSG, "");
    let m = match r.u8()? {
        1 => Msg::Vote {
            term: r.u64()?,
            head: r.u64()?,
            log: VoteLog {
                last_term: r.u64()?,
                last_seq: r.u64()?,
                first_uncommitted: r.u64()?,
                base: r.u64()?,
            },
            config: (r.u64()?, r.u64()?),
        },
        2 => {
            let term = r.u64()?;
            let granted = r.flag("granted")?;
            let entries = read_versions(&mut r)?;
            Msg::VoteReply {
                term,
                granted,
                entries,
                leader_start: (r.u64()?, r.u64()?),
            }
        }
        16 => {
            let term = r.u64()?;
            let from = r.u64()?;
            let more = r.flag("has next")?;
            let next = r.u64()?;
            if !more && next != 0 {
                return Err(FormatError::Malformed {
                    what: WHAT_MSG,
                    detail: format!(
                        "vote piece: next slot {next} given on the last piece (must be 0)"
                    ),
                });
            }
            let entries = read_versions(&mut r)?;
            Msg::VotePart {
                term,
                from,
                next: more.then_some(next),
                entries,
                leader_start: (r.u64()?, r.u64()?),
            }
        }
        17 => Msg::VoteMore {
            term: r.u64()?,
            from: r.u64()?,
        },
        3 => {
            let term = r.u64()?;
            let start = r.u64()?;
            let n = r.count("entries", ENTRY_HEADER_SIZE + 4)?;
            let entries = (0..n)
                .map(|_| read_entry(&mut r))
                .collect::<Result<_, _>>()?;
            let head: Seq = r.u64()?;
            let bits = r.u64s("commit bitmap")?;
            let commits =
                CommitWindow::from_parts(head, bits).map_err(|e| FormatError::Malformed {
                    what: WHAT_MSG,
                    detail: e.to_string(),
                })?;
            Msg::Append {
                term,
                start,
                entries,
                commits,
                config: (r.u64()?, r.u64()?),
            }
        }
        4 => {
            let term = r.u64()?;
            let n = r.count("acknowledged slots", 16)?;
            let seqs = (0..n)
                .map(|_| Ok((r.u64()?, r.u64()?)))
                .collect::<Result<_, FormatError>>()?;
            Msg::Ack {
                term,
                seqs,
                head: r.u64()?,
                applied: r.u64()?,
            }
        }
        5 => {
            let (term, base, offset, total) = (r.u64()?, r.u64()?, r.u64()?, r.u64()?);
            let (partial, from) = (r.flag("partial image")?, r.u64()?);
            let part = partial.then_some(from);
            if !partial && from != 0 {
                return Err(FormatError::Malformed {
                    what: WHAT_MSG,
                    detail: format!("whole image naming a first slot {from}"),
                });
            }
            if part.is_some_and(|from| from > base) {
                return Err(FormatError::Malformed {
                    what: WHAT_MSG,
                    detail: format!(
                        "partial image from slot {} past its base {base}",
                        part.unwrap_or(0)
                    ),
                });
            }
            let n = r.count("snapshot piece", 1)?;
            let data = r.take(n)?.to_vec();
            if offset.checked_add(n as u64).is_none_or(|end| end > total) {
                return Err(FormatError::Malformed {
                    what: WHAT_MSG,
                    detail: format!(
                        "snapshot piece {offset}+{n} runs past the image's {total} bytes"
                    ),
                });
            }
            Msg::Snapshot {
                term,
                base,
                offset,
                total,
                part,
                data,
            }
        }
        6 => Msg::TimeoutNow { term: r.u64()? },
        10 => Msg::PreVote {
            term: r.u64()?,
            log: VoteLog {
                last_term: r.u64()?,
                last_seq: r.u64()?,
                first_uncommitted: r.u64()?,
                base: r.u64()?,
            },
            config: (r.u64()?, r.u64()?),
        },
        11 => Msg::PreVoteReply {
            term: r.u64()?,
            granted: r.flag("granted")?,
        },
        7 => Msg::Config {
            term: r.u64()?,
            membership: read_membership(&mut r)?,
        },
        9 => Msg::Newer {
            membership: read_membership(&mut r)?,
        },
        12 => Msg::AskEnd {
            term: r.u64()?,
            nonce: r.u64()?,
        },
        13 => Msg::End {
            term: r.u64()?,
            end: r.u64()?,
        },
        14 => Msg::ReadProbe {
            term: r.u64()?,
            probe: r.u64()?,
        },
        15 => Msg::ReadProbeAck {
            term: r.u64()?,
            probe: r.u64()?,
        },
        8 => Msg::ConfigAck {
            term: r.u64()?,
            version: (r.u64()?, r.u64()?),
            head: r.u64()?,
        },
        t => {
            return Err(FormatError::Malformed {
                what: WHAT_MSG,
                detail: format!("unknown message tag {t}"),
            })
        }
    };
    r.done()?;
    Ok(m)
}

#[cfg(test)]
mod tests;
