//! Disk Paxos (Gafni and Lamport, "Disk Paxos", Distributed Computing 16(1), 2003; the
//! PolarFS paper's reference 10, section 6.2) over 4 KiB pages of the volume: it decides
//! which host may append to the metadata journal, and every move of the journal's anchor.
//!
//! The pages: one leader record (the last decided instance and its value, which
//! read-only hosts poll) and one block per host. The volume is one "disk" that is itself
//! replicated (a write returns once a majority of its chunk's replicas hold it), so the
//! algorithm runs in its single-disk form: a host writes only its own block and reads
//! everyone's.
//!
//! Each decision is an **instance**, numbered from 1; instance `n + 1` is proposed only
//! by a host that knows instance `n`'s value. A proposer with ballot `b` (unique to it:
//! `round << 16 | host`) for instance `n`:
//! 1. writes its block `(n, mbal = b, bal, value)` (keeping `bal` and `value` if its
//!    block was already of instance `n`), then reads every block: if another block of
//!    instance `n` has `mbal > b`, or any block is of a later instance, it is preempted.
//!    Otherwise it takes the value of the block of instance `n` with the highest
//!    nonzero `bal`, or, if none has one, its own proposal;
//! 2. writes its block `(n, mbal = b, bal = b, value)` and reads every block again:
//!    preempted as before, or the value is **chosen**.
//!
//! A chosen value is final: any later ballot of the same instance reads, in its phase 1,
//! the block of some host that wrote `bal = b` in phase 2 before the chooser's second
//! read (the chooser saw no higher `mbal` then), and takes the value of the highest
//! `bal`. The winner then writes the leader record, which only ever moves to a later
//! instance. [`Proposer`] runs the two phases one I/O at a time, so that a harness can
//! interleave several proposers step by step (`tests/paxos.rs`).

use crate::device::Device;
use crate::journal::{Anchor, At};
use crate::layout::{FsError, SECTOR, VERSION};

/// A Disk Paxos page's magic, "CHDP" little-endian.
pub const PAGE_MAGIC: u32 = u32::from_le_bytes(*b"CHDP");

/// What an instance decides: who writes the journal, and where its valid records end.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Value {
    /// The host that may append to the journal from this instance on.
    pub owner: u32,
    /// The journal's anchor.
    pub anchor: Anchor,
}

/// A host's block (also the shape of the leader record: `mbal` and `bal` unused there).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Block {
    /// The instance it is about (0: never written).
    pub instance: u64,
    /// The highest ballot this host began.
    pub mbal: u64,
    /// The ballot of `value` (0: none accepted).
    pub bal: u64,
    /// The value accepted at `bal`.
    pub value: Value,
    /// The last decided instance this host knew when it wrote the block (0: none), and
    /// its value: a host proposes for instance `n + 1` only knowing instance `n`'s
    /// value, so the blocks always tell the latest decision anyone built on, even when
    /// its winner died before writing the leader record.
    pub known: (u64, Value),
}

/// Where the pages are and whose they are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pages {
    /// Volume offset of the leader record; host `h`'s block (hosts from 1) follows at
    /// `start + h * SECTOR`.
    pub start: u64,
    /// Hosts (blocks).
    pub hosts: u32,
    /// The file system's identity.
    pub uuid: u64,
}

/// Page kinds in a page's byte 6.
const LEADER: u8 = 1;
const HOST: u8 = 2;

impl Pages {
    fn offset(&self, host: u32) -> u64 {
        self.start + host as u64 * SECTOR
    }

    /// Encodes a page: the leader record (`host` 0) or host `host`'s block.
    pub fn encode(&self, host: u32, b: &Block) -> Vec<u8> {
        let mut p = vec![0u8; SECTOR as usize];
        p[0..4].copy_from_slice(&PAGE_MAGIC.to_le_bytes());
        p[4..6].copy_from_slice(&VERSION.to_le_bytes());
        p[6] = if host == 0 { LEADER } else { HOST };
        p[8..12].copy_from_slice(&host.to_le_bytes());
        let words = [
            self.uuid,
            b.instance,
            b.mbal,
            b.bal,
            b.value.owner as u64,
            b.value.anchor.generation,
            b.value.anchor.seq,
            b.value.anchor.last.host as u64,
            b.value.anchor.last.offset,
            b.value.anchor.base_seq,
            b.value.anchor.base_last.host as u64,
            b.value.anchor.base_last.offset,
            b.known.0,
            b.known.1.owner as u64,
            b.known.1.anchor.generation,
            b.known.1.anchor.seq,
            b.known.1.anchor.last.host as u64,
            b.known.1.anchor.last.offset,
            b.known.1.anchor.base_seq,
            b.known.1.anchor.base_last.host as u64,
            b.known.1.anchor.base_last.offset,
        ];
        for (i, w) in words.iter().enumerate() {
            p[16 + i * 8..24 + i * 8].copy_from_slice(&w.to_le_bytes());
        }
        let crc = crc32c::crc32c(&p[..4092]);
        p[4092..].copy_from_slice(&crc.to_le_bytes());
        p
    }

    /// Decodes page `host` (0: the leader record). A page never written (all zeros)
    /// is an empty block.
    pub fn decode(&self, host: u32, p: &[u8]) -> Result<Block, FsError> {
        let offset = self.offset(host);
        let bad = |detail: String| FsError::Corrupt {
            what: if host == 0 {
                "Disk Paxos leader record"
            } else {
                "Disk Paxos host block"
            },
            offset,
            detail,
        };
        if p.len() != SECTOR as usize {
            return Err(bad(format!("{} bytes", p.len())));
        }
        if p.iter().all(|&x| x == 0) {
            return Ok(Block::default());
        }
        let u32_at = |at: usize| u32::from_le_bytes(p[at..at + 4].try_into().expect("4"));
        let u64_at = |at: usize| u64::from_le_bytes(p[at..at + 8].try_into().expect("8"));
        if u32_at(0) != PAGE_MAGIC {
            return Err(bad(format!(
                "magic {:#010x}, not {PAGE_MAGIC:#010x}",
                u32_at(0)
            )));
        }
        let crc = crc32c::crc32c(&p[..4092]);
        if crc != u32_at(4092) {
            return Err(bad(format!(
                "checksum {crc:#010x}, stored {:#010x}",
                u32_at(4092)
            )));
        }
        let version = u16::from_le_bytes([p[4], p[5]]);
        if version != VERSION {
            return Err(bad(format!("format version {version}")));
        }
        let kind = if host == 0 { LEADER } else { HOST };
        if p[6] != kind || u32_at(8) != host || u64_at(16) != self.uuid {
            return Err(bad(format!(
                "holds page kind {} of host {} of file system {:#x}",
                p[6],
                u32_at(8),
                u64_at(16)
            )));
        }
        let small = |at: usize, what: &str| {
            u32::try_from(u64_at(at)).map_err(|_| bad(format!("{what} {} past u32", u64_at(at))))
        };
        if p[184..4092].iter().any(|&x| x != 0) {
            return Err(bad("bytes past the fields not zero".into()));
        }
        Ok(Block {
            instance: u64_at(24),
            mbal: u64_at(32),
            bal: u64_at(40),
            value: Value {
                owner: small(48, "owner")?,
                anchor: Anchor {
                    generation: u64_at(56),
                    seq: u64_at(64),
                    last: At {
                        host: small(72, "record host")?,
                        offset: u64_at(80),
                    },
                    base_seq: u64_at(88),
                    base_last: At {
                        host: small(96, "base record host")?,
                        offset: u64_at(104),
                    },
                },
            },
            known: (
                u64_at(112),
                Value {
                    owner: small(120, "known owner")?,
                    anchor: Anchor {
                        generation: u64_at(128),
                        seq: u64_at(136),
                        last: At {
                            host: small(144, "known record host")?,
                            offset: u64_at(152),
                        },
                        base_seq: u64_at(160),
                        base_last: At {
                            host: small(168, "known base record host")?,
                            offset: u64_at(176),
                        },
                    },
                },
            ),
        })
    }

    /// Reads every host block (index `h - 1` is host `h`'s), in one read.
    pub fn read_blocks(&self, dev: &dyn Device) -> Result<Vec<Block>, FsError> {
        let bytes = dev.read(self.offset(1), (self.hosts as u64 * SECTOR) as usize)?;
        bytes
            .chunks(SECTOR as usize)
            .enumerate()
            .map(|(i, p)| self.decode(i as u32 + 1, p))
            .collect()
    }

    /// Writes host `host`'s block.
    pub fn write_block(&self, dev: &dyn Device, host: u32, b: &Block) -> Result<(), FsError> {
        Ok(dev.write(self.offset(host), &self.encode(host, b))?)
    }

    /// The leader record.
    pub fn read_leader(&self, dev: &dyn Device) -> Result<Block, FsError> {
        self.decode(0, &dev.read(self.offset(0), SECTOR as usize)?)
    }

    /// Writes the leader record: instance `instance` chose `value`.
    pub fn write_leader(
        &self,
        dev: &dyn Device,
        instance: u64,
        value: Value,
    ) -> Result<(), FsError> {
        let b = Block {
            instance,
            mbal: 0,
            bal: 0,
            value,
            known: (0, Value::default()),
        };
        Ok(dev.write(self.offset(0), &self.encode(0, &b))?)
    }
}

/// The latest decision the pages tell: the leader record's, or a later one some host
/// built a proposal on ([`Block::known`]).
pub fn latest(leader: &Block, blocks: &[Block]) -> (u64, Value) {
    blocks
        .iter()
        .map(|b| b.known)
        .chain(std::iter::once((leader.instance, leader.value)))
        .max_by_key(|k| k.0)
        .unwrap_or_default()
}

/// The ballot of `round` for `host`: unique to the host, ordered by round first.
pub fn ballot(round: u64, host: u32) -> u64 {
    (round << 16) | (host as u64 & 0xffff)
}

/// Where a [`Proposer`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Write the phase-1 block next.
    Write1,
    /// Read every block (phase 1).
    Read1,
    /// Write the phase-2 block.
    Write2,
    /// Read every block (phase 2).
    Read2,
    /// Ended.
    Done,
}

/// How a proposal ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The value chosen for the instance (perhaps another host's: a value found
    /// accepted in phase 1 is proposed instead of one's own).
    Chosen(Value),
    /// A higher ballot of the instance, or a later instance, was seen: the highest ballot
    /// round seen, to go past it when trying again.
    Preempted {
        /// The highest ballot seen.
        mbal: u64,
        /// A block of a later instance was seen.
        later: bool,
    },
}

/// One host's proposal for one instance, one I/O per [`Proposer::step`].
/// Invariant: `block` is what this host last wrote (or found) in its own page.
#[derive(Clone, Debug)]
pub struct Proposer {
    host: u32,
    instance: u64,
    ballot: u64,
    proposal: Value,
    /// The decision this proposal builds on: instance `instance - 1` and its value.
    known: (u64, Value),
    block: Block,
    phase: Phase,
    /// Broken variant (the `broken` feature only): phase 1 ignores values accepted by
    /// other hosts (the harness must catch two different values chosen).
    #[cfg(feature = "broken")]
    pub broken_ignore_accepted: bool,
}

impl Proposer {
    /// A proposal of `proposal` by `host` for `instance` at ballot `ballot`, knowing
    /// instance `instance - 1` decided `known`; `own` is the host's block as it is on the
    /// volume. `ballot` must be above `own.mbal`: a host's ballots only grow.
    pub fn new(
        host: u32,
        instance: u64,
        ballot: u64,
        proposal: Value,
        own: Block,
        known: Value,
    ) -> Self {
        Self {
            host,
            instance,
            ballot,
            proposal,
            known: (instance - 1, known),
            block: own,
            phase: Phase::Write1,
            #[cfg(feature = "broken")]
            broken_ignore_accepted: false,
        }
    }

    /// Whether the proposal has ended.
    pub fn done(&self) -> bool {
        self.phase == Phase::Done
    }

    /// The host's block as last written.
    pub fn block(&self) -> Block {
        self.block
    }

    /// Preempted if another block of this instance began a higher ballot, or any block is
    /// of a later instance.
    fn preempted(&self, blocks: &[Block]) -> Option<Outcome> {
        let mut top = self.ballot;
        let mut later = false;
        for (i, b) in blocks.iter().enumerate() {
            if i as u32 + 1 == self.host {
                continue;
            }
            if b.instance > self.instance {
                later = true;
                top = top.max(b.mbal);
            } else if b.instance == self.instance && b.mbal > self.ballot {
                top = top.max(b.mbal);
            }
        }
        (later || top > self.ballot).then_some(Outcome::Preempted { mbal: top, later })
    }

    /// Runs the next I/O; `Some` once the proposal has ended.
    pub fn step(&mut self, dev: &dyn Device, pages: &Pages) -> Result<Option<Outcome>, FsError> {
        match self.phase {
            Phase::Write1 => {
                let keep = self.block.instance == self.instance;
                self.block = Block {
                    instance: self.instance,
                    mbal: self.ballot,
                    bal: if keep { self.block.bal } else { 0 },
                    value: if keep {
                        self.block.value
                    } else {
                        Value::default()
                    },
                    known: self.known,
                };
                pages.write_block(dev, self.host, &self.block)?;
                self.phase = Phase::Read1;
                Ok(None)
            }
            Phase::Read1 => {
                let blocks = pages.read_blocks(dev)?;
                if let Some(o) = self.preempted(&blocks) {
                    self.phase = Phase::Done;
                    return Ok(Some(o));
                }
                #[cfg(feature = "broken")]
                let ignore = self.broken_ignore_accepted;
                #[cfg(not(feature = "broken"))]
                let ignore = false;
                let accepted = blocks
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| !ignore || *i as u32 + 1 == self.host)
                    .map(|(_, b)| b)
                    .filter(|b| b.instance == self.instance && b.bal > 0)
                    .max_by_key(|b| b.bal);
                let value = accepted.map_or(self.proposal, |b| b.value);
                self.block = Block {
                    instance: self.instance,
                    mbal: self.ballot,
                    bal: self.ballot,
                    value,
                    known: self.known,
                };
                self.phase = Phase::Write2;
                Ok(None)
            }
            Phase::Write2 => {
                pages.write_block(dev, self.host, &self.block)?;
                self.phase = Phase::Read2;
                Ok(None)
            }
            Phase::Read2 => {
                let blocks = pages.read_blocks(dev)?;
                self.phase = Phase::Done;
                Ok(Some(
                    self.preempted(&blocks)
                        .unwrap_or(Outcome::Chosen(self.block.value)),
                ))
            }
            Phase::Done => Ok(None),
        }
    }

    /// Runs the proposal to its end.
    pub fn run(&mut self, dev: &dyn Device, pages: &Pages) -> Result<Outcome, FsError> {
        loop {
            if let Some(o) = self.step(dev, pages)? {
                return Ok(o);
            }
        }
    }
}
