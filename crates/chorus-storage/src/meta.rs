//! Crash-atomic meta storage: one [`MetaRecord`] in the file `<dir>/meta`, made of two
//! 4096-byte slots.
//!
//! ```text
//! slot (4096 bytes, slot i at file offset i * 4096):
//! offset size field
//!  0     8    magic         b"CHORUSMT"
//!  8     2    version       u16 = 1
//! 10     2    flags         u16 = 0
//! 12     4    payload_len   u32, <= 4096 - 32
//! 16     8    seq           u64, raised by one at every save
//! 24     4    payload_crc   u32, CRC32C of the payload
//! 28     4    header_crc    u32, CRC32C of bytes 0..28
//! 32     ..   payload       (see chorus_core::format::meta), then zeros
//! ```
//!
//! Every save writes the new record into slot 0, `fdatasync`s, then into slot 1, and
//! `fdatasync`s again. A crash tears at most one slot, and the other still holds either the
//! new or the previous record; bit rot of one slot later is survived the same way. Open
//! takes the valid slot with the highest `seq` and rewrites a stale or bad slot. Meta
//! writes are rare (votes, membership, trims), so the second fsync costs little.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use chorus_core::format::le::{u32_at, u64_at};
use chorus_core::format::meta::MetaRecord;
use chorus_core::format::{crc32c, FormatError};

use crate::error::{IoContext, Result, StorageError};
use crate::fs::{FileSystem, FsFile, OpenOptions};

/// Bytes per slot.
pub const SLOT_SIZE: usize = 4096;
const SLOT_HEADER: usize = 32;
const MAGIC: [u8; 8] = *b"CHORUSMT";
const VERSION: u16 = 1;

/// What opening found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MetaRecovery {
    /// Why each slot was unusable, if it was.
    pub slot_errors: [Option<String>; 2],
    /// The slot rewritten from the other one.
    pub repaired_slot: Option<usize>,
}

/// Encodes a slot holding `record` with sequence `seq`.
pub fn encode_slot(seq: u64, record: &MetaRecord) -> Result<Vec<u8>> {
    let payload = record.encode();
    if payload.len() > SLOT_SIZE - SLOT_HEADER {
        return Err(StorageError::InvalidConfig {
            setting: "meta record",
            value: format!("{} bytes", payload.len()),
            accepted: "at most 4064 bytes (fewer members)",
        });
    }
    let mut b = vec![0u8; SLOT_SIZE];
    b[..8].copy_from_slice(&MAGIC);
    b[8..10].copy_from_slice(&VERSION.to_le_bytes());
    b[12..16].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    b[16..24].copy_from_slice(&seq.to_le_bytes());
    b[24..28].copy_from_slice(&crc32c(&payload).to_le_bytes());
    let crc = crc32c(&b[..28]);
    b[28..32].copy_from_slice(&crc.to_le_bytes());
    b[SLOT_HEADER..SLOT_HEADER + payload.len()].copy_from_slice(&payload);
    Ok(b)
}

/// Decodes one slot: its sequence number and record.
pub fn decode_slot(b: &[u8]) -> Result<(u64, MetaRecord), FormatError> {
    const WHAT: &str = "meta slot";
    if b.len() < SLOT_HEADER {
        return Err(FormatError::Truncated {
            what: WHAT,
            need: SLOT_HEADER as u64,
            have: b.len() as u64,
        });
    }
    if b[..8] != MAGIC {
        return Err(FormatError::BadMagic {
            what: WHAT,
            expected: u64::from_le_bytes(MAGIC),
            found: u64_at(b, 0),
        });
    }
    let stored = u32_at(b, 28);
    let found = crc32c(&b[..28]);
    if stored != found {
        return Err(FormatError::HeaderChecksum {
            what: WHAT,
            expected: stored,
            found,
        });
    }
    let version = u16::from_le_bytes([b[8], b[9]]);
    if version != VERSION {
        return Err(FormatError::UnknownVersion {
            what: WHAT,
            found: version,
            supported: VERSION,
        });
    }
    let len = u32_at(b, 12) as usize;
    if len > SLOT_SIZE - SLOT_HEADER || b.len() < SLOT_HEADER + len {
        return Err(FormatError::LengthOutOfRange {
            what: WHAT,
            field: "payload_len",
            value: len as u64,
            min: 0,
            max: (SLOT_SIZE - SLOT_HEADER).min(b.len() - SLOT_HEADER) as u64,
        });
    }
    let payload = &b[SLOT_HEADER..SLOT_HEADER + len];
    let crc = crc32c(payload);
    if crc != u32_at(b, 24) {
        return Err(FormatError::DataChecksum {
            what: WHAT,
            expected: u32_at(b, 24),
            found: crc,
        });
    }
    Ok((u64_at(b, 16), MetaRecord::decode(payload)?))
}

/// Meta storage of one replica. See the module docs.
#[derive(Debug)]
pub struct MetaStorage {
    fs: Arc<dyn FileSystem>,
    path: PathBuf,
    file: Box<dyn FsFile>,
    seq: u64,
    current: MetaRecord,
    failed: Option<String>,
}

impl MetaStorage {
    /// Creates `<dir>/meta` holding `record`; fails if it exists.
    pub fn create(fs: Arc<dyn FileSystem>, dir: &Path, record: &MetaRecord) -> Result<Self> {
        let path = dir.join("meta");
        if fs.exists(&path).ctx(&path, "stat")? {
            return Err(StorageError::AlreadyExists { dir: path });
        }
        fs.create_dir_all(dir).ctx(dir, "create directory")?;
        let file = fs.open(&path, OpenOptions::create()).ctx(&path, "create")?;
        let mut m = Self {
            fs,
            path,
            file,
            seq: 0,
            current: record.clone(),
            failed: None,
        };
        m.save(record)?;
        m.fs.sync_dir(dir).ctx(dir, "fsync directory")?;
        Ok(m)
    }

    /// Opens `<dir>/meta`, choosing the newest valid slot and repairing the other.
    pub fn open(fs: Arc<dyn FileSystem>, dir: &Path) -> Result<(Self, MetaRecovery)> {
        let path = dir.join("meta");
        let file = match fs.open(&path, OpenOptions::read_write()) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(StorageError::NotFound { dir: path })
            }
            Err(e) => return Err(e).ctx(&path, "open"),
        };
        let mut slots = Vec::new();
        let mut rec = MetaRecovery::default();
        for i in 0..2 {
            let mut b = vec![0u8; SLOT_SIZE];
            let n = file
                .read_at(&mut b, (i * SLOT_SIZE) as u64)
                .ctx(&path, "read")?;
            b.truncate(n);
            match decode_slot(&b) {
                Ok(s) => slots.push(Some(s)),
                Err(e) => {
                    rec.slot_errors[i] = Some(e.to_string());
                    slots.push(None);
                }
            }
        }
        let best = match (&slots[0], &slots[1]) {
            (Some(a), Some(b)) if a.0 >= b.0 => 0,
            (Some(_), Some(_)) | (None, Some(_)) => 1,
            (Some(_), None) => 0,
            (None, None) => {
                return Err(StorageError::Corrupt {
                    path,
                    file_offset: 0,
                    lsn: 0,
                    source: FormatError::Malformed {
                        what: "meta storage",
                        detail: format!(
                            "both slots are bad: slot 0: {}; slot 1: {}",
                            rec.slot_errors[0].as_deref().unwrap_or("?"),
                            rec.slot_errors[1].as_deref().unwrap_or("?")
                        ),
                    },
                })
            }
        };
        let (seq, record) = slots[best].clone().expect("chosen slot is valid");
        let other = 1 - best;
        let m = Self {
            fs,
            path,
            file,
            seq,
            current: record,
            failed: None,
        };
        if slots[other].as_ref().map(|s| s.0) != Some(seq) {
            let bytes = encode_slot(seq, &m.current)?;
            let r = m
                .file
                .write_all_at(&bytes, (other * SLOT_SIZE) as u64)
                .and_then(|_| m.file.sync_data())
                .ctx(&m.path, "repair meta slot");
            r?;
            rec.repaired_slot = Some(other);
        }
        Ok((m, rec))
    }

    /// The record as of the last successful save.
    pub fn current(&self) -> &MetaRecord {
        &self.current
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Saves `record` durably (see the module docs). After any failure, every later save
    /// fails with [`StorageError::Failed`] until reopened.
    pub fn save(&mut self, record: &MetaRecord) -> Result<()> {
        if let Some(reason) = &self.failed {
            return Err(StorageError::Failed {
                reason: reason.clone(),
            });
        }
        let bytes = encode_slot(self.seq + 1, record)?;
        let r = (|| -> Result<()> {
            for slot in 0..2 {
                self.file
                    .write_all_at(&bytes, (slot * SLOT_SIZE) as u64)
                    .ctx(&self.path, "write meta slot")?;
                self.file.sync_data().ctx(&self.path, "fdatasync")?;
            }
            Ok(())
        })();
        if let Err(e) = &r {
            self.failed = Some(e.to_string());
        }
        r?;
        self.seq += 1;
        self.current = record.clone();
        Ok(())
    }
}
