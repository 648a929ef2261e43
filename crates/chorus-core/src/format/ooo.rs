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
//! | 5 | 1 | kind: 0 NULL, 1 parallel, 2 dependent, 3 parallel with conflict-order predecessors |
//! | 6 | 2 | reserved, 0 |
//! | 8 | 4 | body length `n` (at most [`MAX_BODY`]) |
//! | 12 | 4 | CRC32C of bytes 4..12 followed by bytes 16..48+n (everything but the magic and the checksum) |
//! | 16 | 8 | slot (`seq`) |
//! | 24 | 8 | term |
//! | 32 | 8 | start (first slot after the term's merge) |
//! | 40 | 8 | eid (0 for NULL) |
//! | 48 | n | body |
//!
//! Body of a NULL entry: empty. Parallel (kind 1): ranges (list of `u64 start, u64 end`),
//! the look-behind buffer (list of lists of ranges, nearest predecessor first), data
//! (`u32` length, bytes). Parallel with conflict-order predecessors (kind 3, written only
//! when the list is not empty): ranges, look-behind buffer, the predecessors (list of
//! `u64` slots, at least one), data. Dependent: `u64` base, RAW list of `u64`, WAW list
//! of `u64`, write-set list of `u64`, data (`u32` length, bytes). A range with
//! `start >= end` is refused, and so is a kind-3 entry with an empty list.
//!
//! # Group payload
//!
//! The data of an entry written by the runtime is a group of records
//! ([`crate::ooo::group`]): `u32` magic `0x5247_4F43` ("COGR"), `u32` record count (at
//! least 1), then per record a kind byte (1: block ranges, 2: read and write sets), its
//! declaration (kind 1: list of `u64 start, u64 end` ranges; kind 2: read-set list of
//! `u64`, write-set list of `u64`) and its data (`u32` length, bytes). The entry's own
//! declaration is the union of its records'. The entry record's checksum covers it.
//!
//! # Hard state (`HARD_SIZE` = 60 bytes)
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | magic `0x4848_4F43` ("COHH") |
//! | 4 | 2 | version, 2 |
//! | 6 | 2 | reserved, 0 |
//! | 8 | 8 | term |
//! | 16 | 8 | voted for (0: nobody; node ids are never 0) |
//! | 24 | 8 | committed head |
//! | 32 | 8 | leader start: term |
//! | 40 | 8 | leader start: slot |
//! | 48 | 8 | base: every slot below is compacted (in the state machine's durable image) |
//! | 56 | 4 | CRC32C of bytes 0..56 |
//!
//! Version 1 (52 bytes: no base, the CRC at 48) is still read, as base 0.
//!
//! # Messages
//!
//! A message is one tag byte (1 Vote, 2 VoteReply, 3 Append, 4 Ack, 5 Snapshot, 6
//! TimeoutNow) and its
//! fields in declaration order: integers as `u64`, `bool` as one byte 0/1, a [`VoteLog`]
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
        let n = self.u32()? as usize;
        let left = self.buf.len() - self.pos;
        if n.saturating_mul(min_item.max(1)) > left {
            return Err(FormatError::LengthOutOfRange {
                what: self.what,
                field,
                value: n as u64,
                min: 0,
                max: (left / min_item.max(1)) as u64,
            });
        }
        Ok(n)
    }

    fn u64s(&mut self, field: &'static str) -> Result<Vec<u64>, FormatError> {
        let n = self.count(field, 8)?;
        (0..n).map(|_| self.u64()).collect()
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

fn put_ranges(out: &mut Vec<u8>, rs: &[BlockRange]) {
    put_u32(out, rs.len() as u32);
    for r in rs {
        put_u64(out, r.start);
        put_u64(out, r.end);
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
    let mut body = Vec::new();
    let kind = match &e.body {
        Body::Null => 0u8,
        Body::Parallel {
            ranges,
            look_behind,
            after,
            data,
        } => {
            put_ranges(&mut body, ranges);
            put_u32(&mut body, look_behind.len() as u32);
            for lb in look_behind {
                put_ranges(&mut body, lb);
            }
            // Kind 1 stays the encoding of an entry without predecessors, so that groups
            // without conflict order write what they always wrote.
            if !after.is_empty() {
                put_u64s(&mut body, after);
            }
            put_bytes(&mut body, data);
            if after.is_empty() {
                1
            } else {
                3
            }
        }
        Body::Dependent {
            base,
            deps,
            write_set,
            data,
        } => {
            put_u64(&mut body, *base);
            put_u64s(&mut body, &deps.raw);
            put_u64s(&mut body, &deps.waw);
            put_u64s(&mut body, write_set);
            put_bytes(&mut body, data);
            2
        }
    };
    let mut out = Vec::with_capacity(ENTRY_HEADER_SIZE + body.len());
    put_u32(&mut out, ENTRY_MAGIC);
    out.extend_from_slice(&[1, kind, 0, 0]);
    put_u32(&mut out, body.len() as u32);
    put_u32(&mut out, 0); // checksum, below
    put_u64(&mut out, e.seq);
    put_u64(&mut out, e.term);
    put_u64(&mut out, e.start);
    put_u64(&mut out, e.eid);
    out.extend_from_slice(&body);
    let crc = entry_crc(&out);
    out[12..16].copy_from_slice(&crc.to_le_bytes());
    out
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
        1 | 3 => {
            let ranges = r.ranges()?;
            let n = r.count("look-behind buffer", 4)?;
            let look_behind = (0..n).map(|_| r.ranges()).collect::<Result<_, _>>()?;
            let after = if kind == 3 {
                let after = r.u64s("conflict-order predecessors")?;
                if after.is_empty() {
                    return Err(FormatError::Malformed {
                        what: WHAT_ENTRY,
                        detail: "kind 3 (parallel with conflict-order predecessors) lists none"
                            .into(),
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
                out.push(1);
                put_ranges(&mut out, rs);
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
    // The smallest record is a kind byte, an empty list or two and an empty data length.
    let n = r.count("records", 9)?;
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
pub fn encode_hard(h: &Hard) -> [u8; HARD_SIZE] {
    let mut out = Vec::with_capacity(HARD_SIZE);
    put_u32(&mut out, HARD_MAGIC);
    out.extend_from_slice(&[2, 0, 0, 0]);
    put_u64(&mut out, h.term);
    put_u64(&mut out, h.voted_for.unwrap_or(0));
    put_u64(&mut out, h.committed_head);
    put_u64(&mut out, h.leader_start.0);
    put_u64(&mut out, h.leader_start.1);
    put_u64(&mut out, h.base);
    let crc = crc32c::crc32c(&out);
    put_u32(&mut out, crc);
    out.try_into().expect("fixed size")
}

/// Decodes the hard state (version 2, or version 1 as base 0).
pub fn decode_hard(buf: &[u8]) -> Result<Hard, FormatError> {
    if buf.len() != HARD_SIZE && buf.len() != HARD_SIZE_V1 {
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
        (2, HARD_SIZE) => 56,
        (1, HARD_SIZE_V1) => 48,
        (1 | 2, n) => {
            return Err(FormatError::FieldMismatch {
                what: WHAT_HARD,
                field: "record length for its version",
                expected: if version == 2 {
                    HARD_SIZE
                } else {
                    HARD_SIZE_V1
                } as u64,
                found: n as u64,
            })
        }
        _ => {
            return Err(FormatError::UnknownVersion {
                what: WHAT_HARD,
                found: version,
                supported: 2,
            })
        }
    };
    r.take(2)?;
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
    let base = if version == 2 { r.u64()? } else { 0 };
    Ok(Hard {
        term,
        voted_for: (voted != 0).then_some(voted),
        committed_head,
        leader_start,
        base,
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

fn put_window(out: &mut Vec<u8>, w: &CommitWindow) {
    put_u64(out, w.head());
    put_u64s(out, w.bits());
}

fn put_entries(out: &mut Vec<u8>, es: &[Entry]) {
    put_u32(out, es.len() as u32);
    for e in es {
        put_bytes(out, &encode_entry(e));
    }
}

/// Encodes a message.
pub fn encode_msg(m: &Msg) -> Vec<u8> {
    let mut out = Vec::new();
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
                put_u64(&mut out, x);
            }
        }
        Msg::VoteReply {
            term,
            granted,
            entries,
            leader_start,
        } => {
            out.push(2);
            put_u64(&mut out, *term);
            out.push(u8::from(*granted));
            put_u32(&mut out, entries.len() as u32);
            for (e, c) in entries {
                put_bytes(&mut out, &encode_entry(e));
                out.push(u8::from(*c));
            }
            put_u64(&mut out, leader_start.0);
            put_u64(&mut out, leader_start.1);
        }
        Msg::Append {
            term,
            start,
            entries,
            commits,
            config,
        } => {
            out.push(3);
            put_u64(&mut out, *term);
            put_u64(&mut out, *start);
            put_entries(&mut out, entries);
            put_window(&mut out, commits);
            put_u64(&mut out, config.0);
            put_u64(&mut out, config.1);
        }
        Msg::Ack {
            term,
            seqs,
            head,
            applied,
        } => {
            out.push(4);
            put_u64(&mut out, *term);
            put_u32(&mut out, seqs.len() as u32);
            for (s, e) in seqs {
                put_u64(&mut out, *s);
                put_u64(&mut out, *e);
            }
            put_u64(&mut out, *head);
            put_u64(&mut out, *applied);
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
                put_u64(&mut out, x);
            }
            match part {
                Some(from) => {
                    out.push(1);
                    put_u64(&mut out, *from);
                }
                None => {
                    out.push(0);
                    put_u64(&mut out, 0);
                }
            }
            put_bytes(&mut out, data);
        }
        Msg::TimeoutNow { term } => {
            out.push(6);
            put_u64(&mut out, *term);
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
                put_u64(&mut out, x);
            }
        }
        Msg::PreVoteReply { term, granted } => {
            out.push(11);
            put_u64(&mut out, *term);
            out.push(u8::from(*granted));
        }
        Msg::Config { term, membership } => {
            out.push(7);
            put_u64(&mut out, *term);
            put_membership(&mut out, membership);
        }
        Msg::Newer { membership } => {
            out.push(9);
            put_membership(&mut out, membership);
        }
        Msg::ConfigAck {
            term,
            version,
            head,
        } => {
            out.push(8);
            for x in [*term, version.0, version.1, *head] {
                put_u64(&mut out, x);
            }
        }
    }
    out
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
            let n = r.count("versions", ENTRY_HEADER_SIZE + 5)?;
            let mut entries = Vec::with_capacity(n);
            for _ in 0..n {
                let e = read_entry(&mut r)?;
                entries.push((e, r.flag("committed")?));
            }
            Msg::VoteReply {
                term,
                granted,
                entries,
                leader_start: (r.u64()?, r.u64()?),
            }
        }
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
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn range() -> impl Strategy<Value = BlockRange> {
        (0u64..1000, 1u64..10).prop_map(|(s, l)| BlockRange::new(s, l).expect("non-empty"))
    }

    fn entry() -> impl Strategy<Value = Entry> {
        let body = prop_oneof![
            Just(Body::Null),
            (
                proptest::collection::vec(range(), 0..4),
                proptest::collection::vec(proptest::collection::vec(range(), 0..3), 0..3),
                proptest::collection::vec(any::<u64>(), 0..4),
                proptest::collection::vec(any::<u8>(), 0..40)
            )
                .prop_map(|(ranges, look_behind, after, data)| Body::Parallel {
                    ranges,
                    look_behind,
                    after,
                    data: data.into()
                }),
            (
                any::<u64>(),
                proptest::collection::vec(any::<u64>(), 0..4),
                proptest::collection::vec(any::<u64>(), 0..4),
                proptest::collection::vec(any::<u64>(), 0..4),
                proptest::collection::vec(any::<u8>(), 0..40)
            )
                .prop_map(|(base, raw, waw, write_set, data)| Body::Dependent {
                    base,
                    deps: Deps { raw, waw },
                    write_set,
                    data: data.into()
                }),
        ];
        (any::<u64>(), any::<u64>(), any::<u64>(), 1u64.., body).prop_map(
            |(seq, term, start, eid, body)| {
                let eid = if matches!(body, Body::Null) { 0 } else { eid };
                Entry {
                    seq,
                    term,
                    start,
                    eid,
                    body,
                }
            },
        )
    }

    fn record() -> impl Strategy<Value = Record> {
        let declared = prop_oneof![
            proptest::collection::vec(range(), 0..4).prop_map(Declared::Blocks),
            (
                proptest::collection::vec(any::<u64>(), 0..4),
                proptest::collection::vec(any::<u64>(), 0..4)
            )
                .prop_map(|(read_set, write_set)| Declared::Txn {
                    read_set,
                    write_set
                }),
        ];
        (declared, proptest::collection::vec(any::<u8>(), 0..40))
            .prop_map(|(declared, data)| Record { declared, data })
    }

    #[test]
    fn a_group_of_no_records_or_of_an_unknown_kind_is_refused() {
        let mut empty = GROUP_MAGIC.to_le_bytes().to_vec();
        empty.extend_from_slice(&0u32.to_le_bytes());
        assert!(matches!(
            decode_group(&empty),
            Err(FormatError::Malformed { .. })
        ));
        let mut b = encode_group(&[Record {
            declared: Declared::Txn {
                read_set: vec![],
                write_set: vec![3],
            },
            data: vec![7],
        }]);
        b[8] = 9;
        assert!(matches!(
            decode_group(&b),
            Err(FormatError::Malformed { .. })
        ));
        assert!(matches!(
            decode_group(b"not a group at all"),
            Err(FormatError::BadMagic { .. })
        ));
    }

    proptest! {
        #[test]
        fn groups_round_trip(rs in proptest::collection::vec(record(), 1..6)) {
            prop_assert_eq!(decode_group(&encode_group(&rs)).unwrap(), rs);
        }

        /// A damaged or cut group payload is an error or (a flipped data byte) other
        /// records, never a panic; a cut one is always an error.
        #[test]
        fn damaged_groups_never_panic(rs in proptest::collection::vec(record(), 1..6), at in any::<usize>(), bit in 0u8..8, cut in any::<usize>()) {
            let b = encode_group(&rs);
            let mut d = b.clone();
            let i = at % d.len();
            d[i] ^= 1 << bit;
            let _ = decode_group(&d);
            prop_assert!(decode_group(&b[..cut % b.len()]).is_err());
        }

        #[test]
        fn entries_round_trip(e in entry()) {
            let b = encode_entry(&e);
            prop_assert_eq!(entry_len(&b).unwrap(), b.len());
            prop_assert_eq!(decode_entry(&b).unwrap(), e);
        }

        #[test]
        fn messages_round_trip(es in proptest::collection::vec(entry(), 0..4), term in any::<u64>(), c in proptest::collection::vec(0u64..200, 0..20)) {
            let mut w = CommitWindow::new(7);
            for s in c { w.commit(s); }
            let msgs = vec![
                Msg::Vote { term, head: 3, log: VoteLog { last_term: 1, last_seq: 2, first_uncommitted: 3, base: 2 }, config: (term, 2) },
                Msg::Config { term, membership: Membership { version: (term, 1), voters: vec![1, 2, 4], prev: Some(vec![1, 2, 3]) } },
                Msg::Config { term, membership: Membership { version: (0, 0), voters: vec![7], prev: None } },
                Msg::ConfigAck { term, version: (term, 3), head: 11 },
                Msg::Newer { membership: Membership { version: (term, 2), voters: vec![2, 3], prev: None } },
                Msg::VoteReply { term, granted: true, entries: es.iter().cloned().map(|e| (e, true)).collect(), leader_start: (4, 5) },
                Msg::Append { term, start: 9, entries: es.clone(), commits: w, config: (term, 4) },
                Msg::Ack { term, seqs: vec![(1, 2), (3, 4)], head: 5, applied: 3 },
                Msg::Snapshot { term, base: 40, offset: 3, total: 9, part: None, data: vec![1, 2, 3] },
                Msg::Snapshot { term, base: 40, offset: 0, total: 3, part: Some(31), data: vec![1, 2, 3] },
                Msg::Snapshot { term, base: 0, offset: 0, total: 0, part: None, data: vec![] },
                Msg::TimeoutNow { term },
                Msg::PreVote { term, log: VoteLog { last_term: 5, last_seq: 8, first_uncommitted: 6, base: 1 }, config: (3, term) },
                Msg::PreVoteReply { term, granted: true },
                Msg::PreVoteReply { term, granted: false },
            ];
            for m in msgs {
                prop_assert_eq!(decode_msg(&encode_msg(&m)).unwrap(), m);
            }
        }

        /// Any corruption or truncation is an error, never a panic or a different value.
        #[test]
        fn damage_is_refused(e in entry(), at in any::<usize>(), bit in 0u8..8, cut in any::<usize>()) {
            let b = encode_entry(&e);
            let mut d = b.clone();
            let i = at % d.len();
            d[i] ^= 1 << bit;
            prop_assert!(decode_entry(&d).is_err());
            let c = cut % b.len();
            prop_assert!(decode_entry(&b[..c]).is_err());
            let m = encode_msg(&Msg::Append { term: 1, start: 0, entries: vec![e], commits: CommitWindow::new(0), config: (0, 0) });
            let _ = decode_msg(&m[..cut % m.len()]);
            let piece = encode_msg(&Msg::Snapshot { term: 1, base: 5, offset: 0, total: 4, part: None, data: vec![1, 2, 3, 4] });
            prop_assert!(decode_msg(&piece[..cut % piece.len()]).is_err());
        }

        #[test]
        fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode_msg(&b);
            let _ = decode_entry(&b);
            let _ = decode_hard(&b);
        }
    }

    #[test]
    fn parallel_entries_with_predecessors_are_kind_3_and_without_kind_1() {
        let entry = |after: Vec<u64>| Entry {
            seq: 9,
            term: 2,
            start: 4,
            eid: 2 << 32 | 5,
            body: Body::Parallel {
                ranges: vec![BlockRange::new(3, 1).expect("non-empty")],
                look_behind: vec![vec![]],
                after,
                data: b"x"[..].into(),
            },
        };
        let plain = encode_entry(&entry(Vec::new()));
        assert_eq!(plain[5], 1);
        let listed = encode_entry(&entry(vec![6, 8]));
        assert_eq!(listed[5], 3);
        assert_eq!(listed.len(), plain.len() + 4 + 16);
        assert_eq!(decode_entry(&listed).unwrap(), entry(vec![6, 8]));
        // A kind-3 record with an empty list (kind 1 bytes with the kind changed and an
        // empty list inserted before the data) is refused by name, checksum and all.
        let mut b = plain.clone();
        b[5] = 3;
        let at = ENTRY_HEADER_SIZE + 4 + 16 + 4 + 4;
        b.splice(at..at, 0u32.to_le_bytes());
        let n = (b.len() - ENTRY_HEADER_SIZE) as u32;
        b[8..12].copy_from_slice(&n.to_le_bytes());
        let crc = entry_crc(&b);
        b[12..16].copy_from_slice(&crc.to_le_bytes());
        match decode_entry(&b) {
            Err(FormatError::Malformed { detail, .. }) => {
                assert!(detail.contains("lists none"), "{detail}")
            }
            r => panic!("expected a refusal, got {r:?}"),
        }
    }

    #[test]
    fn memberships_round_trip_and_damage_is_named() {
        for m in [
            Membership::initial(vec![1, 2, 3]),
            Membership {
                version: (9, 2),
                voters: vec![1, 2, 4],
                prev: Some(vec![1, 2, 3]),
            },
        ] {
            let b = encode_membership(&m);
            assert_eq!(decode_membership(&b).unwrap(), m);
            for i in 0..b.len() {
                let mut d = b.clone();
                d[i] ^= 0x10;
                assert!(decode_membership(&d).is_err(), "flip at {i}");
                assert!(decode_membership(&b[..i]).is_err(), "cut at {i}");
            }
        }
        // Voters out of order, repeated or 0 are refused even under a valid checksum.
        for voters in [vec![2, 1], vec![1, 1], vec![0, 1]] {
            let m = Membership {
                version: (1, 1),
                voters,
                prev: None,
            };
            assert!(matches!(
                decode_membership(&encode_membership(&m)),
                Err(FormatError::Malformed { .. })
            ));
        }
    }

    #[test]
    fn hard_state_round_trips_and_damage_is_named() {
        let h = Hard {
            term: 7,
            voted_for: Some(3),
            committed_head: 99,
            leader_start: (6, 40),
            base: 77,
        };
        let b = encode_hard(&h);
        assert_eq!(decode_hard(&b).unwrap(), h);
        // A version-1 record (no base) still reads, as base 0.
        let mut v1 = b[..48].to_vec();
        v1[4] = 1;
        let crc = crc32c::crc32c(&v1);
        v1.extend_from_slice(&crc.to_le_bytes());
        assert_eq!(decode_hard(&v1).unwrap(), Hard { base: 0, ..h });
        let mut v2 = b.to_vec();
        v2[4] = 1;
        assert!(matches!(
            decode_hard(&v2),
            Err(FormatError::FieldMismatch { .. })
        ));
        let mut d = b;
        d[20] ^= 1;
        assert!(matches!(
            decode_hard(&d),
            Err(FormatError::HeaderChecksum { .. })
        ));
        assert!(matches!(
            decode_hard(&b[..10]),
            Err(FormatError::FieldMismatch { .. })
        ));
    }
}
