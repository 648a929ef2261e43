//! A small record kept durably in two 4096-byte slots of one file: the ordered replica's
//! meta ([`crate::meta`]), and an out-of-order replica's hard state and membership
//! ([`crate::ooo`]).
//!
//! ```text
//! slot (4096 bytes, slot i at file offset i * 4096):
//! offset size field
//!  0     8    magic         which record the file holds (b"CHORUSMT": ordered meta,
//!                           b"CHORUSHD": out-of-order hard state, b"CHORUSMB": its
//!                           membership)
//!  8     2    version       u16 = 1
//! 10     2    flags         u16 = 0
//! 12     4    payload_len   u32, <= 4096 - 32
//! 16     8    seq           u64, raised by one at every save
//! 24     4    payload_crc   u32, CRC32C of the payload
//! 28     4    header_crc    u32, CRC32C of bytes 0..28
//! 32     ..   payload       (the record's own encoding), then zeros
//! ```
//!
//! Every save writes the new record into slot 0, `fdatasync`s, then into slot 1, and
//! `fdatasync`s again. A crash tears at most one slot, and the other still holds either the
//! new or the previous record; bit rot of one slot later is survived the same way. Open
//! takes the valid slot with the highest `seq` and rewrites a stale or bad slot. A file is
//! created whole, crash-atomically (both slots written to `<name>.tmp`, synced, renamed
//! over, the directory synced), so it never exists without a valid slot.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use chorus_core::format::le::{u32_at, u64_at};
use chorus_core::format::{crc32c, FormatError};

use crate::error::{IoContext, Result, StorageError};
use crate::fs::{FileSystem, FsFile, OpenOptions};

/// Bytes per slot.
pub const SLOT_SIZE: usize = 4096;
const SLOT_HEADER: usize = 32;
/// The largest payload a slot holds.
pub const MAX_PAYLOAD: usize = SLOT_SIZE - SLOT_HEADER;
const VERSION: u16 = 1;

/// The first eight bytes of each slot: which record a slot file holds.
pub type Magic = [u8; 8];

/// What opening found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SlotRecovery {
    /// Why each slot was unusable, if it was.
    pub slot_errors: [Option<String>; 2],
    /// The slot rewritten from the other one.
    pub repaired_slot: Option<usize>,
}

/// Encodes a slot holding `payload` with sequence `seq`; a payload over [`MAX_PAYLOAD`]
/// bytes is refused.
pub fn encode_slot(magic: Magic, seq: u64, payload: &[u8]) -> Result<Vec<u8>> {
    if payload.len() > MAX_PAYLOAD {
        return Err(StorageError::InvalidConfig {
            setting: "slot record",
            value: format!("{} bytes", payload.len()),
            accepted: "at most 4064 bytes",
        });
    }
    let mut b = vec![0u8; SLOT_SIZE];
    b[..8].copy_from_slice(&magic);
    b[8..10].copy_from_slice(&VERSION.to_le_bytes());
    b[12..16].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    b[16..24].copy_from_slice(&seq.to_le_bytes());
    b[24..28].copy_from_slice(&crc32c(payload).to_le_bytes());
    let crc = crc32c(&b[..28]);
    b[28..32].copy_from_slice(&crc.to_le_bytes());
    b[SLOT_HEADER..SLOT_HEADER + payload.len()].copy_from_slice(payload);
    Ok(b)
}

/// Decodes one slot (`what` names the record in errors): its sequence number and
/// payload.
pub fn decode_slot<'a>(
    magic: Magic,
    what: &'static str,
    b: &'a [u8],
) -> std::result::Result<(u64, &'a [u8]), FormatError> {
    if b.len() < SLOT_HEADER {
        return Err(FormatError::Truncated {
            what,
            need: SLOT_HEADER as u64,
            have: b.len() as u64,
        });
    }
    if b[..8] != magic {
        return Err(FormatError::BadMagic {
            what,
            expected: u64::from_le_bytes(magic),
            found: u64_at(b, 0),
        });
    }
    let stored = u32_at(b, 28);
    let found = crc32c(&b[..28]);
    if stored != found {
        return Err(FormatError::HeaderChecksum {
            what,
            expected: stored,
            found,
        });
    }
    let version = u16::from_le_bytes([b[8], b[9]]);
    if version != VERSION {
        return Err(FormatError::UnknownVersion {
            what,
            found: version,
            supported: VERSION,
        });
    }
    let len = u32_at(b, 12) as usize;
    if len > MAX_PAYLOAD || b.len() < SLOT_HEADER + len {
        return Err(FormatError::LengthOutOfRange {
            what,
            field: "payload_len",
            value: len as u64,
            min: 0,
            max: MAX_PAYLOAD.min(b.len() - SLOT_HEADER) as u64,
        });
    }
    let payload = &b[SLOT_HEADER..SLOT_HEADER + len];
    let crc = crc32c(payload);
    if crc != u32_at(b, 24) {
        return Err(FormatError::DataChecksum {
            what,
            expected: u32_at(b, 24),
            found: crc,
        });
    }
    Ok((u64_at(b, 16), payload))
}

/// Whether `b` (a file's first bytes) starts with a slot of `magic`: tells a slot file
/// from an older single-record layout of the same file.
pub fn is_slot_file(magic: Magic, b: &[u8]) -> bool {
    b.len() >= 8 && b[..8] == magic
}

/// One slot file. See the module docs.
#[derive(Debug)]
pub struct SlotFile {
    fs: Arc<dyn FileSystem>,
    path: PathBuf,
    magic: Magic,
    what: &'static str,
    /// Open for reading and writing.
    file: Box<dyn FsFile>,
    /// The sequence number both slots hold (after a successful save or open).
    seq: u64,
    /// Set by a failed save: what reached the disk is unknown, so no later save is tried.
    failed: Option<String>,
}

impl SlotFile {
    /// Creates `path` holding `payload` in both slots, crash-atomically (see the module
    /// docs), replacing any file there.
    pub fn create(
        fs: Arc<dyn FileSystem>,
        path: &Path,
        magic: Magic,
        what: &'static str,
        payload: &[u8],
    ) -> Result<Self> {
        let slot = encode_slot(magic, 1, payload)?;
        let dir = path.parent().unwrap_or(Path::new("."));
        fs.create_dir_all(dir).ctx(dir, "create directory")?;
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        let f = fs.open(&tmp, OpenOptions::create()).ctx(&tmp, "create")?;
        f.set_len(0).ctx(&tmp, "truncate")?;
        f.write_all_at(&[slot.as_slice(), slot.as_slice()].concat(), 0)
            .ctx(&tmp, "write")?;
        f.sync_data().ctx(&tmp, "fdatasync")?;
        drop(f);
        fs.rename(&tmp, path).ctx(path, "rename")?;
        fs.sync_dir(dir).ctx(dir, "fsync directory")?;
        let file = fs.open(path, OpenOptions::read_write()).ctx(path, "open")?;
        Ok(SlotFile {
            fs,
            path: path.to_path_buf(),
            magic,
            what,
            file,
            seq: 1,
            failed: None,
        })
    }

    /// Opens `path`, taking the newest slot whose payload `decode` accepts and rewriting
    /// the other if it is stale or bad. [`StorageError::NotFound`] if there is no file;
    /// [`StorageError::Corrupt`] naming both slots' faults if neither is usable.
    pub fn open<T>(
        fs: Arc<dyn FileSystem>,
        path: &Path,
        magic: Magic,
        what: &'static str,
        decode: impl Fn(&[u8]) -> std::result::Result<T, FormatError>,
    ) -> Result<(Self, T, SlotRecovery)> {
        let file = match fs.open(path, OpenOptions::read_write()) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(StorageError::NotFound {
                    dir: path.to_path_buf(),
                })
            }
            Err(e) => return Err(e).ctx(path, "open"),
        };
        let mut slots = Vec::new();
        let mut rec = SlotRecovery::default();
        for i in 0..2 {
            let mut b = vec![0u8; SLOT_SIZE];
            let n = file
                .read_at(&mut b, (i * SLOT_SIZE) as u64)
                .ctx(path, "read")?;
            b.truncate(n);
            match decode_slot(magic, what, &b)
                .and_then(|(seq, p)| Ok((seq, decode(p)?, p.to_vec())))
            {
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
                    path: path.to_path_buf(),
                    file_offset: 0,
                    lsn: 0,
                    source: FormatError::Malformed {
                        what,
                        detail: format!(
                            "both slots are bad: slot 0: {}; slot 1: {}",
                            rec.slot_errors[0].as_deref().unwrap_or("?"),
                            rec.slot_errors[1].as_deref().unwrap_or("?")
                        ),
                    },
                })
            }
        };
        let other_seq = slots[1 - best].as_ref().map(|s| s.0);
        let (seq, value, payload) = slots.swap_remove(best).expect("the chosen slot is valid");
        let f = SlotFile {
            fs,
            path: path.to_path_buf(),
            magic,
            what,
            file,
            seq,
            failed: None,
        };
        let other = 1 - best;
        if other_seq != Some(seq) {
            let bytes = encode_slot(magic, seq, &payload)?;
            f.file
                .write_all_at(&bytes, (other * SLOT_SIZE) as u64)
                .and_then(|_| f.file.sync_data())
                .ctx(&f.path, "repair slot")?;
            rec.repaired_slot = Some(other);
        }
        Ok((f, value, rec))
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What the file holds, for errors.
    pub fn what(&self) -> &'static str {
        self.what
    }

    /// The file system it is on.
    pub fn fs(&self) -> &Arc<dyn FileSystem> {
        &self.fs
    }

    /// Saves `payload` durably (see the module docs). After any failure, every later save
    /// fails with [`StorageError::Failed`] until reopened.
    pub fn save(&mut self, payload: &[u8]) -> Result<()> {
        if let Some(reason) = &self.failed {
            return Err(StorageError::Failed {
                reason: reason.clone(),
            });
        }
        let bytes = encode_slot(self.magic, self.seq + 1, payload)?;
        let r = (|| -> Result<()> {
            for slot in 0..2 {
                self.file
                    .write_all_at(&bytes, (slot * SLOT_SIZE) as u64)
                    .ctx(&self.path, "write slot")?;
                self.file.sync_data().ctx(&self.path, "fdatasync")?;
            }
            Ok(())
        })();
        if let Err(e) = &r {
            self.failed = Some(e.to_string());
        }
        r?;
        self.seq += 1;
        Ok(())
    }
}
