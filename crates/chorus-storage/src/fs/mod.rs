//! The only door from Chorus storage to a disk.
//!
//! Log and meta storage reach files exclusively through [`FileSystem`] and [`FsFile`], so
//! that the same storage code runs on a real disk ([`RealFs`]) and on the deterministic,
//! fault-injecting in-memory twin ([`SimFs`]) that the simulator and the crash tests use
//! (DESIGN.md principle 2; STYLE.md 2 and 12).
//!
//! # Contract for implementors
//!
//! To ensure correctness, an implementation must behave like a POSIX file system with the
//! weakest guarantees a real one gives:
//!
//! - [`FsFile::write_all_at`] returns once the bytes are visible to later reads through any
//!   handle of the same file. It promises *nothing* about durability.
//! - [`FsFile::sync_data`] returns `Ok` only when every byte written to the file before the
//!   call, and its length, would survive a power loss. A failed `sync_data` leaves the
//!   durability of those writes **unknown**: callers must not retry it and trust the result
//!   (the "fsyncgate" lesson); Chorus storage moves into a failed state instead.
//! - A created, removed or renamed directory entry is durable only after
//!   [`FileSystem::sync_dir`] of its parent directory returned `Ok`.
//! - A file opened with [`OpenOptions::direct`] bypasses the page cache: every read and write
//!   on it must use an offset, a length and a buffer address that are multiples of
//!   [`DIRECT_IO_ALIGN`], or the call fails with `EINVAL` (`io::ErrorKind::InvalidInput`).

use std::fmt;
use std::io;
use std::path::Path;

mod fillable;
mod real;
mod sim;

pub use fillable::Fillable;
pub use real::RealFs;
pub use sim::{CrashMode, SimFs, SimFsStats};

/// Alignment, in bytes, of offsets, lengths and buffer addresses for direct IO.
///
/// 4 KiB is the logical block size of every device Chorus targets; it is also what the
/// block file header occupies so that log data starts aligned (see `docs/formats.md`).
pub const DIRECT_IO_ALIGN: usize = 4096;

/// How to open a file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpenOptions {
    /// Open for writing as well as reading.
    pub write: bool,
    /// Create the file if it does not exist (implies `write`).
    pub create: bool,
    /// Bypass the page cache (`O_DIRECT`); see the module docs for alignment rules.
    pub direct: bool,
}

impl OpenOptions {
    /// Read-only, buffered.
    pub fn read_only() -> Self {
        Self::default()
    }

    /// Read-write, buffered, the file must exist.
    pub fn read_write() -> Self {
        Self {
            write: true,
            ..Self::default()
        }
    }

    /// Read-write, buffered, created if missing.
    pub fn create() -> Self {
        Self {
            write: true,
            create: true,
            direct: false,
        }
    }

    /// The same options with direct IO switched to `direct`.
    pub fn with_direct(mut self, direct: bool) -> Self {
        self.direct = direct;
        self
    }
}

/// A file system: the directory operations storage needs.
///
/// Paths are absolute or relative as the caller gives them; implementations do not
/// interpret them beyond what `std::path` does.
pub trait FileSystem: Send + Sync + fmt::Debug {
    /// Opens `path` with `opts`. Fails with `NotFound` when the file is missing and
    /// `opts.create` is false.
    fn open(&self, path: &Path, opts: OpenOptions) -> io::Result<Box<dyn FsFile>>;

    /// Creates `path` and every missing parent directory. Durable only after
    /// [`FileSystem::sync_dir`] of each parent.
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;

    /// The names (not paths) of the entries of directory `path`, sorted bytewise.
    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>>;

    /// Removes the file `path`. Durable only after `sync_dir` of its parent.
    fn remove_file(&self, path: &Path) -> io::Result<()>;

    /// Atomically renames `from` to `to`, replacing `to`. Durable only after `sync_dir`.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;

    /// Makes the entries of directory `path` (creations, removals, renames) durable.
    fn sync_dir(&self, path: &Path) -> io::Result<()>;

    /// Whether `path` exists (file or directory).
    fn exists(&self, path: &Path) -> io::Result<bool>;

    /// Whether files under directory `dir` can be opened with [`OpenOptions::direct`].
    /// Real file systems answer by trying (tmpfs, for one, refuses `O_DIRECT`).
    fn supports_direct_io(&self, dir: &Path) -> bool;
}

/// An open file.
///
/// All methods take `&self`: positional reads and writes need no cursor, so one handle can
/// be shared by a writer and readers.
#[allow(clippy::len_without_is_empty)] // a file length, not a collection
pub trait FsFile: Send + Sync + fmt::Debug {
    /// Reads up to `buf.len()` bytes at `offset`; returns how many were read, which is
    /// smaller than `buf.len()` only at the end of the file.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;

    /// Writes all of `buf` at `offset`, extending the file if needed. Not durable until
    /// [`FsFile::sync_data`].
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;

    /// Makes every earlier write to this file, and its length, durable (`fdatasync`).
    /// After an error the durability of earlier writes is unknown; see the module docs.
    fn sync_data(&self) -> io::Result<()>;

    /// The current (visible, not necessarily durable) length of the file in bytes.
    fn len(&self) -> io::Result<u64>;

    /// Truncates or extends the file to `len` bytes (extension reads as zeros). Durable
    /// after `sync_data`.
    fn set_len(&self, len: u64) -> io::Result<()>;

    /// Whether this handle was opened with direct IO.
    fn is_direct(&self) -> bool;
}

impl dyn FsFile {
    /// Reads exactly `buf.len()` bytes at `offset`, or fails with `UnexpectedEof`.
    pub fn read_exact_at(&self, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
        while !buf.is_empty() {
            let n = self.read_at(buf, offset)?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "file ended before the requested range",
                ));
            }
            buf = &mut buf[n..];
            offset += n as u64;
        }
        Ok(())
    }
}

/// Whether `offset`, `len` and the address of `ptr` are all multiples of
/// [`DIRECT_IO_ALIGN`], as direct IO requires.
pub fn is_direct_aligned(ptr: *const u8, len: usize, offset: u64) -> bool {
    (ptr as usize).is_multiple_of(DIRECT_IO_ALIGN)
        && len.is_multiple_of(DIRECT_IO_ALIGN)
        && offset.is_multiple_of(DIRECT_IO_ALIGN as u64)
}
