//! Crash-atomic meta storage: one [`MetaRecord`] in the file `<dir>/meta`, a slot file
//! ([`crate::slots`]: two 4096-byte slots, each written and synced in turn) whose slots
//! have the magic `b"CHORUSMT"` and hold the record's encoding
//! (`chorus_core::format::meta`). Meta writes are rare (votes, membership, trims), so
//! the second fsync costs little.

use std::path::Path;
use std::sync::Arc;

use chorus_core::format::meta::MetaRecord;
use chorus_core::format::FormatError;

use crate::error::{IoContext, Result, StorageError};
use crate::fs::FileSystem;
use crate::slots::{Magic, SlotFile, SlotRecovery};

pub use crate::slots::SLOT_SIZE;

/// The meta file's slot magic.
const MAGIC: Magic = *b"CHORUSMT";
const WHAT: &str = "meta slot";

/// What opening found.
pub type MetaRecovery = SlotRecovery;

/// Encodes a slot holding `record` with sequence `seq`.
pub fn encode_slot(seq: u64, record: &MetaRecord) -> Result<Vec<u8>> {
    crate::slots::encode_slot(MAGIC, seq, &record.encode())
}

/// Decodes one slot: its sequence number and record.
pub fn decode_slot(b: &[u8]) -> std::result::Result<(u64, MetaRecord), FormatError> {
    let (seq, payload) = crate::slots::decode_slot(MAGIC, WHAT, b)?;
    Ok((seq, MetaRecord::decode(payload)?))
}

/// Meta storage of one replica. See the module docs.
#[derive(Debug)]
pub struct MetaStorage {
    slots: SlotFile,
    /// The record both slots hold as of the last successful save.
    current: MetaRecord,
}

impl MetaStorage {
    /// Creates `<dir>/meta` holding `record`; fails if it exists.
    pub fn create(fs: Arc<dyn FileSystem>, dir: &Path, record: &MetaRecord) -> Result<Self> {
        let path = dir.join("meta");
        if fs.exists(&path).ctx(&path, "stat")? {
            return Err(StorageError::AlreadyExists { dir: path });
        }
        let slots = SlotFile::create(fs, &path, MAGIC, WHAT, &record.encode())?;
        Ok(Self {
            slots,
            current: record.clone(),
        })
    }

    /// Opens `<dir>/meta`, choosing the newest valid slot and repairing the other.
    pub fn open(fs: Arc<dyn FileSystem>, dir: &Path) -> Result<(Self, MetaRecovery)> {
        let path = dir.join("meta");
        let (slots, current, rec) = SlotFile::open(fs, &path, MAGIC, WHAT, MetaRecord::decode)?;
        Ok((Self { slots, current }, rec))
    }

    /// The record as of the last successful save.
    pub fn current(&self) -> &MetaRecord {
        &self.current
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        self.slots.path()
    }

    /// Saves `record` durably (see [`crate::slots`]). After any failure, every later save
    /// fails with [`StorageError::Failed`] until reopened.
    pub fn save(&mut self, record: &MetaRecord) -> Result<()> {
        self.slots.save(&record.encode())?;
        self.current = record.clone();
        Ok(())
    }
}
