//! The metadata journal (PolarFS section 6.2): every metadata transaction is recorded as
//! a journal record holding each operation's old and new value. A record becomes part of
//! the file system only once a Disk Paxos instance ([`crate::paxos`]) chooses an anchor
//! naming it (the valid tail); a record no anchor names is a transaction that did not
//! commit, and is never replayed.
//!
//! The journal is split into one area per host, and a host writes records only into its
//! own area, one after another from the area's start in each generation. So a host that
//! still believes itself the writer after another took over (a partition, a pause) can
//! only overwrite its own uncommitted records, never a committed record of anyone's: its
//! own committed records lie before its area's tail, which only it moves. Each record
//! names the record before it in the journal's order (host and offset), so a reader walks
//! back from the anchor to the last record it replayed and replays forward from there.
//!
//! Records are whole sectors and carry the journal's generation (bumped each time a
//! checkpoint wrote every metaobject home and the areas start over) and their
//! transaction's sequence number (consecutive from 1), so a record of an earlier
//! generation is never taken for a later one. Layout in `docs/formats.md`.

use crate::layout::{FsError, SECTOR, VERSION};
use crate::meta::{Kind, MetaId, OBJ};

/// The journal record's magic, "CHJR" little-endian.
pub const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"CHJR");
/// Bytes of a record's header.
pub const RECORD_HEADER: usize = 64;
/// Bytes of one operation in a record.
pub const OP_BYTES: usize = 16 + 2 * OBJ;

/// One operation of a transaction: a metaobject's value before and after.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Op {
    /// The metaobject's kind.
    pub kind: Kind,
    /// Its identifier.
    pub id: MetaId,
    /// Its record before the transaction.
    pub old: [u8; OBJ],
    /// Its record after.
    pub new: [u8; OBJ],
}

/// Where a record lies: the host whose area holds it, and its offset in that area.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct At {
    /// The host (from 1; 0 with offset 0: no record).
    pub host: u32,
    /// Bytes from the start of the host's area.
    pub offset: u64,
}

/// A journal record: one committed (or being committed) transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The journal generation it was written in.
    pub generation: u64,
    /// The transaction's sequence number.
    pub seq: u64,
    /// The record of sequence number `seq - 1` in this generation (none for the first).
    pub prev: At,
    /// Its operations, in the order they were made.
    pub ops: Vec<Op>,
}

/// The journal's valid end, as a Disk Paxos instance chose it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Anchor {
    /// The journal generation.
    pub generation: u64,
    /// The last valid record's sequence number (0: none in this generation).
    pub seq: u64,
    /// Where that record lies.
    pub last: At,
    /// The previous generation's last record (sequence number, place; 0 in generation
    /// 0): the metaobjects' home copy holds the state at that generation's start or
    /// later, and redoing its records gives this generation's start (see
    /// [`crate::coord`], checkpoints).
    pub base_seq: u64,
    /// Where the previous generation's last record lies.
    pub base_last: At,
}

impl Anchor {
    /// The previous generation's end, as an anchor of that generation.
    pub fn base(&self) -> Anchor {
        Anchor {
            generation: self.generation.wrapping_sub(1),
            seq: self.base_seq,
            last: self.base_last,
            base_seq: 0,
            base_last: At::default(),
        }
    }
}

impl Record {
    /// Sectors the record takes.
    pub fn sectors(&self) -> u64 {
        ((RECORD_HEADER + self.ops.len() * OP_BYTES + 4) as u64).div_ceil(SECTOR)
    }

    /// The record's bytes (whole sectors) for the file system `uuid`.
    pub fn encode(&self, uuid: u64) -> Vec<u8> {
        let len = (self.sectors() * SECTOR) as usize;
        let mut b = vec![0u8; len];
        b[0..4].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        b[8..16].copy_from_slice(&uuid.to_le_bytes());
        b[16..24].copy_from_slice(&self.generation.to_le_bytes());
        b[24..32].copy_from_slice(&self.seq.to_le_bytes());
        b[32..36].copy_from_slice(&(self.ops.len() as u32).to_le_bytes());
        b[36..40].copy_from_slice(&(self.sectors() as u32).to_le_bytes());
        b[40..44].copy_from_slice(&self.prev.host.to_le_bytes());
        b[48..56].copy_from_slice(&self.prev.offset.to_le_bytes());
        for (i, op) in self.ops.iter().enumerate() {
            let at = RECORD_HEADER + i * OP_BYTES;
            b[at] = op.kind as u8;
            b[at + 8..at + 16].copy_from_slice(&op.id.0.to_le_bytes());
            b[at + 16..at + 16 + OBJ].copy_from_slice(&op.old);
            b[at + 16 + OBJ..at + OP_BYTES].copy_from_slice(&op.new);
        }
        let crc = crc32c::crc32c(&b[..len - 4]);
        b[len - 4..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// How many sectors the record starting with `first` (its first sector) takes, for
    /// the file system `uuid`: read that many, then [`Record::decode`] them. `offset` is
    /// where it lies on the volume (for errors).
    pub fn sectors_of(first: &[u8], offset: u64, uuid: u64) -> Result<u64, FsError> {
        let bad = |detail: String| FsError::Corrupt {
            what: "journal record",
            offset,
            detail,
        };
        if first.len() < RECORD_HEADER {
            return Err(bad(format!("{} bytes", first.len())));
        }
        let magic = u32::from_le_bytes(first[0..4].try_into().expect("4"));
        if magic != RECORD_MAGIC {
            return Err(bad(format!(
                "magic {magic:#010x}, not {RECORD_MAGIC:#010x}"
            )));
        }
        let got = u64::from_le_bytes(first[8..16].try_into().expect("8"));
        if got != uuid {
            return Err(bad(format!("of file system {got:#x}, not {uuid:#x}")));
        }
        let n = u32::from_le_bytes(first[36..40].try_into().expect("4")) as u64;
        if n == 0 {
            return Err(bad("a record of 0 sectors".into()));
        }
        Ok(n)
    }

    /// Decodes a record found at volume `offset` (its whole sectors).
    pub fn decode(b: &[u8], offset: u64, uuid: u64) -> Result<Self, FsError> {
        let bad = |detail: String| FsError::Corrupt {
            what: "journal record",
            offset,
            detail,
        };
        let sectors = Self::sectors_of(b, offset, uuid)?;
        if b.len() as u64 != sectors * SECTOR {
            return Err(bad(format!(
                "{} bytes for a record of {sectors} sectors",
                b.len()
            )));
        }
        let len = b.len();
        let crc = crc32c::crc32c(&b[..len - 4]);
        let stored = u32::from_le_bytes(b[len - 4..].try_into().expect("4"));
        if crc != stored {
            return Err(bad(format!("checksum {crc:#010x}, stored {stored:#010x}")));
        }
        let version = u16::from_le_bytes([b[4], b[5]]);
        if version != VERSION {
            return Err(bad(format!("format version {version}")));
        }
        let n = u32::from_le_bytes(b[32..36].try_into().expect("4")) as usize;
        if RECORD_HEADER + n * OP_BYTES + 4 > len {
            return Err(bad(format!("{n} operations do not fit {sectors} sectors")));
        }
        let mut ops = Vec::with_capacity(n);
        for i in 0..n {
            let at = RECORD_HEADER + i * OP_BYTES;
            let kind = Kind::from_byte(b[at])
                .ok_or_else(|| bad(format!("operation {i}: kind {}", b[at])))?;
            let mut old = [0u8; OBJ];
            let mut new = [0u8; OBJ];
            old.copy_from_slice(&b[at + 16..at + 16 + OBJ]);
            new.copy_from_slice(&b[at + 16 + OBJ..at + OP_BYTES]);
            ops.push(Op {
                kind,
                id: MetaId(u64::from_le_bytes(
                    b[at + 8..at + 16].try_into().expect("8"),
                )),
                old,
                new,
            });
        }
        Ok(Self {
            generation: u64::from_le_bytes(b[16..24].try_into().expect("8")),
            seq: u64::from_le_bytes(b[24..32].try_into().expect("8")),
            prev: At {
                host: u32::from_le_bytes(b[40..44].try_into().expect("4")),
                offset: u64::from_le_bytes(b[48..56].try_into().expect("8")),
            },
            ops,
        })
    }
}

/// Where record `at` lies on the volume.
pub fn record_offset(g: &crate::layout::Geometry, at: At) -> u64 {
    g.journal_area(at.host).0 + at.offset
}

/// The part of a host's area that generation `generation` writes: (start, end) as
/// offsets in the area. Generations alternate between its two halves, so the records of
/// the previous generation stay readable while a checkpoint's home writes are redone
/// from them.
pub fn half(g: &crate::layout::Geometry, host: u32, generation: u64) -> (u64, u64) {
    let (_, len) = g.journal_area(host);
    let h = len / SECTOR / 2 * SECTOR;
    let start = (generation % 2) * h;
    (start, start + h)
}

/// Whether record `r` fits at `at` in generation `r.generation`'s half of the area.
pub fn fits(g: &crate::layout::Geometry, at: At, r: &Record) -> bool {
    let (start, end) = half(g, at.host, r.generation);
    at.offset >= start && at.offset + r.sectors() * SECTOR <= end
}

/// Writes `r` at `at` (which must lie in the writer's own area, in its generation's
/// half, with room for it).
pub fn write_record(
    dev: &dyn crate::device::Device,
    g: &crate::layout::Geometry,
    uuid: u64,
    at: At,
    r: &Record,
) -> Result<(), FsError> {
    if !fits(g, at, r) {
        return Err(FsError::Layout(format!(
            "journal area of host {} full: a record of {} sectors at {} does not fit \
             generation {}'s half",
            at.host,
            r.sectors(),
            at.offset,
            r.generation
        )));
    }
    Ok(dev.write(record_offset(g, at), &r.encode(uuid))?)
}

/// Reads the record at `at`.
pub fn read_record(
    dev: &dyn crate::device::Device,
    g: &crate::layout::Geometry,
    uuid: u64,
    at: At,
) -> Result<Record, FsError> {
    let offset = record_offset(g, at);
    let first = dev.read(offset, SECTOR as usize)?;
    let n = Record::sectors_of(&first, offset, uuid)?;
    let (_, len) = g.journal_area(at.host);
    if at.offset + n * SECTOR > len {
        return Err(FsError::Corrupt {
            what: "journal record",
            offset,
            detail: format!("{n} sectors run past host {}'s area", at.host),
        });
    }
    let b = if n == 1 {
        first
    } else {
        dev.read(offset, (n * SECTOR) as usize)?
    };
    Record::decode(&b, offset, uuid)
}

/// The records after sequence number `after` up to `anchor`, in order, each with where
/// it lies: walked back from the anchor's record along each record's `prev`. Every
/// record must be of the anchor's generation and carry the sequence number the chain
/// gives it; anything else is damage.
pub fn records_after(
    dev: &dyn crate::device::Device,
    g: &crate::layout::Geometry,
    uuid: u64,
    after: u64,
    anchor: Anchor,
) -> Result<Vec<(At, Record)>, FsError> {
    let mut out = Vec::new();
    let mut at = anchor.last;
    let mut seq = anchor.seq;
    while seq > after {
        let r = read_record(dev, g, uuid, at)?;
        if r.generation != anchor.generation || r.seq != seq {
            return Err(FsError::Corrupt {
                what: "journal record",
                offset: record_offset(g, at),
                detail: format!(
                    "generation {} sequence {}, where the chain from the anchor (generation \
                     {}, sequence {}) needs generation {} sequence {seq}",
                    r.generation, r.seq, anchor.generation, anchor.seq, anchor.generation
                ),
            });
        }
        let prev = r.prev;
        out.push((at, r));
        at = prev;
        seq -= 1;
    }
    out.reverse();
    Ok(out)
}
