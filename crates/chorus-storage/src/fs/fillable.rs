//! A file system that runs out of space on demand: for tests and drills of what a full
//! disk does to the layers above (the runtime stops the group, then restarts it once
//! there is room; docs/operations.md, "A full disk").

use std::fmt;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::{FileSystem, FsFile, OpenOptions};

/// Wraps a file system; while [`Fillable::set_full`] is on, every write, length change and
/// file creation fails with `ENOSPC` ("No space left on device"), as on a full disk, and
/// everything else passes through.
#[derive(Clone)]
pub struct Fillable {
    inner: Arc<dyn FileSystem>,
    full: Arc<AtomicBool>,
}

impl fmt::Debug for Fillable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fillable")
            .field("inner", &self.inner)
            .field("full", &self.is_full())
            .finish()
    }
}

impl Fillable {
    /// `inner`, with room.
    pub fn new(inner: Arc<dyn FileSystem>) -> Self {
        Self {
            inner,
            full: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Fills the disk (`true`) or frees it (`false`), for every handle opened before or
    /// after.
    pub fn set_full(&self, full: bool) {
        self.full.store(full, Ordering::SeqCst);
    }

    /// Whether writes now fail for want of space.
    pub fn is_full(&self) -> bool {
        self.full.load(Ordering::SeqCst)
    }

    fn room(full: &AtomicBool) -> io::Result<()> {
        if full.load(Ordering::SeqCst) {
            // ENOSPC, so that the error reads and classifies as the real one does.
            Err(io::Error::from_raw_os_error(28))
        } else {
            Ok(())
        }
    }
}

#[derive(Debug)]
struct FillableFile {
    inner: Box<dyn FsFile>,
    full: Arc<AtomicBool>,
}

impl FsFile for FillableFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.inner.read_at(buf, offset)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        Fillable::room(&self.full)?;
        self.inner.write_all_at(buf, offset)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.inner.sync_data()
    }

    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        Fillable::room(&self.full)?;
        self.inner.set_len(len)
    }

    fn is_direct(&self) -> bool {
        self.inner.is_direct()
    }
}

impl FileSystem for Fillable {
    fn open(&self, path: &Path, opts: OpenOptions) -> io::Result<Box<dyn FsFile>> {
        if opts.create && !self.inner.exists(path)? {
            Fillable::room(&self.full)?;
        }
        Ok(Box::new(FillableFile {
            inner: self.inner.open(path, opts)?,
            full: self.full.clone(),
        }))
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.inner.create_dir_all(path)
    }

    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        self.inner.list_dir(path)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.inner.remove_file(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.inner.rename(from, to)
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        self.inner.sync_dir(path)
    }

    fn exists(&self, path: &Path) -> io::Result<bool> {
        self.inner.exists(path)
    }

    fn supports_direct_io(&self, dir: &Path) -> bool {
        self.inner.supports_direct_io(dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::SimFs;

    #[test]
    fn a_full_disk_refuses_writes_with_enospc_and_frees_again() {
        let fs = Fillable::new(Arc::new(SimFs::new(1)));
        fs.create_dir_all(Path::new("/d")).unwrap();
        let p = Path::new("/d/f");
        let f = fs.open(p, OpenOptions::create()).unwrap();
        f.write_all_at(b"abc", 0).unwrap();
        fs.set_full(true);
        let e = f.write_all_at(b"d", 3).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::StorageFull, "{e}");
        assert_eq!(f.set_len(10).unwrap_err().raw_os_error(), Some(28));
        let e = fs
            .open(Path::new("/d/g"), OpenOptions::create())
            .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(28), "{e}");
        // Reads, syncs and opening an existing file go on.
        let mut buf = [0u8; 3];
        assert_eq!(f.read_at(&mut buf, 0).unwrap(), 3);
        assert_eq!(&buf, b"abc");
        f.sync_data().unwrap();
        fs.open(p, OpenOptions::create()).unwrap();
        fs.set_full(false);
        f.write_all_at(b"d", 3).unwrap();
        assert_eq!(f.len().unwrap(), 4);
    }
}
