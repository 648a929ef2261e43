//! Typed storage errors: each names the file, the offset or LSN, and what was expected.

use std::io;
use std::path::PathBuf;

use chorus_core::format::FormatError;
use chorus_core::Lsn;
use thiserror::Error;

/// An error from log storage.
#[derive(Debug, Error)]
pub enum StorageError {
    /// An IO call failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done (`"open"`, `"write"`, `"fdatasync"`, ...).
        op: &'static str,
        /// The OS error.
        source: io::Error,
    },
    /// Bytes on disk before the tail fail their checks. Never truncated silently: the
    /// replica repairs the range from a peer (protocol-aware recovery).
    #[error("corruption in {path} at file offset {file_offset} (lsn {lsn}): {source}")]
    Corrupt {
        /// The block file.
        path: PathBuf,
        /// Byte offset in the file.
        file_offset: u64,
        /// LSN of the bad place.
        lsn: Lsn,
        /// What exactly failed, with expected and found values.
        source: FormatError,
    },
    /// A record of a file that is not a block file (the out-of-order store's entries or
    /// hard state) fails its checks, and it is not a torn tail. Never cut silently.
    #[error("corruption in {path} at file offset {file_offset}: {source}")]
    CorruptRecord {
        /// The file.
        path: PathBuf,
        /// Byte offset of the bad record.
        file_offset: u64,
        /// What exactly failed.
        source: FormatError,
    },
    /// A block file belongs to another log.
    #[error("{path} belongs to log {found:#018x}, this log is {expected:#018x}")]
    ForeignBlock {
        /// The block file.
        path: PathBuf,
        /// This log's id.
        expected: u64,
        /// The id in the block header.
        found: u64,
    },
    /// The configured block size differs from the one the log was created with.
    #[error(
        "{path} was written with block_size {on_disk}, configured block_size is {configured}: \
         set block_size = {on_disk} (a log's block size cannot change)"
    )]
    BlockSizeMismatch {
        /// The block file.
        path: PathBuf,
        /// The configured size.
        configured: u64,
        /// The size recorded on disk.
        on_disk: u64,
    },
    /// A block file is missing between two others, or named wrongly.
    #[error("log directory {dir}: {detail}")]
    Layout {
        /// The log directory.
        dir: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// The directory holds no log.
    #[error("no log in {dir} (create one first)")]
    NotFound {
        /// The log directory.
        dir: PathBuf,
    },
    /// A log already exists where one was to be created.
    #[error("a log already exists in {dir}")]
    AlreadyExists {
        /// The log directory.
        dir: PathBuf,
    },
    /// The LSN is below the trim point.
    #[error("lsn {lsn} was trimmed (log starts at {start})")]
    Trimmed {
        /// The LSN asked for.
        lsn: Lsn,
        /// The first readable LSN.
        start: Lsn,
    },
    /// The LSN is at or past the end of the log.
    #[error("lsn {lsn} is beyond the end of the log ({end})")]
    BeyondEnd {
        /// The LSN asked for.
        lsn: Lsn,
        /// The end of the log.
        end: Lsn,
    },
    /// Bytes handed to `append` are not valid groups continuing the log.
    #[error("append at lsn {lsn} refused: {detail}")]
    InvalidAppend {
        /// Where the bad group starts.
        lsn: Lsn,
        /// What is wrong.
        detail: String,
    },
    /// The LSN is not where a group starts.
    #[error("lsn {lsn} is not a group boundary")]
    NotAGroupBoundary {
        /// The LSN asked for.
        lsn: Lsn,
    },
    /// The LSN is not where a block starts (a multiple of the block size), as a rebase
    /// needs: the new log's only block must start exactly there.
    #[error("lsn {lsn} is not a block boundary (a multiple of the block size {block_size})")]
    NotABlockBoundary {
        /// The LSN asked for.
        lsn: Lsn,
        /// The log's block size.
        block_size: u64,
    },
    /// A write or fdatasync failed earlier; the storage accepts nothing until reopened,
    /// because the durability of earlier writes is unknown (never retry an fsync and
    /// trust it).
    #[error("storage failed earlier ({reason}); reopen the replica to recover from disk")]
    Failed {
        /// The first failure.
        reason: String,
    },
    /// A configuration value is not acceptable.
    #[error("invalid {setting} = {value}: {accepted}")]
    InvalidConfig {
        /// The setting.
        setting: &'static str,
        /// The value given.
        value: String,
        /// What is accepted.
        accepted: &'static str,
    },
}

impl StorageError {
    /// Whether this is an IO call refused for want of space (`ENOSPC`, or `EDQUOT` over a
    /// quota): a cause that freeing space removes, so the runtime restarts a group it
    /// stopped once space is back (docs/operations.md, "A full disk").
    pub fn is_disk_full(&self) -> bool {
        matches!(
            self,
            StorageError::Io { source, .. }
                if matches!(source.kind(), io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded)
        )
    }
}

/// Result of storage operations.
pub type Result<T, E = StorageError> = std::result::Result<T, E>;

/// Attaches path and operation to an IO result.
pub(crate) trait IoContext<T> {
    fn ctx(self, path: &std::path::Path, op: &'static str) -> Result<T>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn ctx(self, path: &std::path::Path, op: &'static str) -> Result<T> {
        self.map_err(|source| StorageError::Io {
            path: path.to_path_buf(),
            op,
            source,
        })
    }
}
