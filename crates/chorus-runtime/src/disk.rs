//! Free space on a node's data directory, and the guard that refuses new appends before
//! the file system fills up.
//!
//! A write or sync that fails on a full disk stops the group on that node
//! ([`crate::Error::Stopped`]): after a failed write the log's state past its last good
//! sync is unknown, and only a restart recovers it. So a leader stops taking appends
//! while the file system holding its data directory has less than
//! [`crate::EnvConfig::min_free_bytes`] available: they are refused by name
//! ([`crate::Error::DiskLow`], nothing appended), the group keeps running (followers
//! catch up, reads and tails are served), and appends are taken again as soon as space is
//! freed — by trimming the log (`Trim`) or otherwise — with no restart. A follower on
//! such a disk takes no new log meanwhile ([`DiskSpace::decline`]): the replication
//! messages carrying groups are dropped unanswered, as if lost, so it falls behind rather
//! than filling the disk and stopping; its leader sends them again, and it catches up (or
//! is rebased, if its leader trimmed past it) once space is freed. The free space is
//! measured (`statvfs`) by the environment's timer thread every
//! [`DiskSpace::REFRESH`], so an append pays one relaxed load for the check.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// How long after a try a group a full disk stopped is tried again (by the environment
/// for ordered groups, by the server for out-of-order ones) while the disk has room.
pub const FULL_DISK_RESTART_BACKOFF: Duration = Duration::from_secs(10);

/// Free space on one file system, measured now and then, against a floor.
#[derive(Debug)]
pub struct DiskSpace {
    dir: PathBuf,
    min_free: AtomicU64,
    /// Bytes available to this process at the last measurement (`u64::MAX` before one
    /// succeeded).
    free: AtomicU64,
    low: AtomicBool,
    refused: AtomicU64,
    declined: AtomicU64,
}

impl DiskSpace {
    /// How often the environment measures the free space.
    pub const REFRESH: Duration = Duration::from_millis(100);

    /// The guard of `dir`'s file system with floor `min_free` bytes (0: never low),
    /// measured once now.
    pub fn new(dir: impl Into<PathBuf>, min_free: u64) -> Self {
        let d = Self {
            dir: dir.into(),
            min_free: AtomicU64::new(min_free),
            free: AtomicU64::new(u64::MAX),
            low: AtomicBool::new(false),
            refused: AtomicU64::new(0),
            declined: AtomicU64::new(0),
        };
        let _ = d.refresh();
        d
    }

    /// Measures the free space again and updates whether it is below the floor. On an
    /// error the last measurement stands.
    pub fn refresh(&self) -> std::io::Result<u64> {
        let free = available_bytes(&self.dir)?;
        self.free.store(free, Ordering::Relaxed);
        self.update();
        Ok(free)
    }

    fn update(&self) {
        let min = self.min_free.load(Ordering::Relaxed);
        let free = self.free.load(Ordering::Relaxed);
        self.low.store(min > 0 && free < min, Ordering::Relaxed);
    }

    /// `Err((free, min_free))` while the free space is below the floor (counted as a
    /// refusal), `Ok` otherwise.
    pub fn check(&self) -> Result<(), (u64, u64)> {
        if !self.low.load(Ordering::Relaxed) {
            return Ok(());
        }
        self.refused.fetch_add(1, Ordering::Relaxed);
        Err((
            self.free.load(Ordering::Relaxed),
            self.min_free.load(Ordering::Relaxed),
        ))
    }

    /// Whether a follower should leave a replication message carrying log untaken because
    /// the free space is below the floor (counted when so): dropping it is safe, as the
    /// loss of any message is, and the leader sends the log again.
    pub fn decline(&self) -> bool {
        if !self.low.load(Ordering::Relaxed) {
            return false;
        }
        self.declined.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Replication messages carrying log that followers left untaken because the free
    /// space was low ([`DiskSpace::decline`]), since this guard was made.
    pub fn declined(&self) -> u64 {
        self.declined.load(Ordering::Relaxed)
    }

    /// Whether the free space was below the floor at the last measurement.
    pub fn is_low(&self) -> bool {
        self.low.load(Ordering::Relaxed)
    }

    /// Whether the last measurement found `bytes` free and the disk not low: room to
    /// start again a group a full disk stopped ([`FULL_DISK_RESTART_BACKOFF`]).
    pub fn has_room(&self, bytes: u64) -> bool {
        !self.is_low() && self.free_bytes().is_some_and(|f| f >= bytes)
    }

    /// Bytes available at the last measurement, if one succeeded.
    pub fn free_bytes(&self) -> Option<u64> {
        Some(self.free.load(Ordering::Relaxed)).filter(|f| *f != u64::MAX)
    }

    /// The floor.
    pub fn min_free(&self) -> u64 {
        self.min_free.load(Ordering::Relaxed)
    }

    /// Changes the floor (0: never low); takes effect at once, against the last
    /// measurement.
    pub fn set_min_free(&self, min_free: u64) {
        self.min_free.store(min_free, Ordering::Relaxed);
        self.update();
    }

    /// Appends refused because the free space was low, since this guard was made.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// The directory measured.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// Bytes of the file system holding `dir` that an unprivileged process may still use
/// (`f_bavail × f_frsize`).
pub fn available_bytes(dir: &Path) -> std::io::Result<u64> {
    let c = CString::new(dir.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `st` a writable statvfs.
    let r = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The guard follows its floor against a real measurement: never low at 0, low
    /// above the free space (each check then counted), and not low again once the floor
    /// drops — no new measurement needed.
    #[test]
    fn the_guard_follows_its_floor() {
        let dir = tempfile::tempdir().unwrap();
        let d = DiskSpace::new(dir.path(), 0);
        let free = d.free_bytes().expect("measured");
        assert!(free > 0);
        assert!(!d.is_low() && d.check().is_ok());
        d.set_min_free(u64::MAX - 1);
        assert!(d.is_low());
        assert_eq!(d.check(), Err((free, u64::MAX - 1)));
        assert_eq!(d.refused(), 1);
        d.set_min_free(1);
        assert!(d.check().is_ok());
        assert_eq!(d.refused(), 1);
        assert!(d.refresh().is_ok());
        assert!(available_bytes(&dir.path().join("missing")).is_err());
    }
}
