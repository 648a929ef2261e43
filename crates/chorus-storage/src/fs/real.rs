//! [`FileSystem`] over the operating system's files.

use std::fs;
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use super::{is_direct_aligned, FileSystem, FsFile, OpenOptions, DIRECT_IO_ALIGN};
use crate::align::AlignedBuf;

/// The real file system (`std::fs`, `pread`/`pwrite`, `fdatasync`, `O_DIRECT`).
#[derive(Clone, Copy, Debug, Default)]
pub struct RealFs;

impl RealFs {
    /// The real file system.
    pub fn new() -> Self {
        Self
    }
}

#[derive(Debug)]
struct RealFile {
    file: fs::File,
    direct: bool,
}

fn check_direct(direct: bool, ptr: *const u8, len: usize, offset: u64) -> io::Result<()> {
    if direct && !is_direct_aligned(ptr, len, offset) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "direct IO needs {DIRECT_IO_ALIGN}-byte alignment: offset {offset}, len {len}, \
                 address {:#x}",
                ptr as usize
            ),
        ));
    }
    Ok(())
}

impl FsFile for RealFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        check_direct(self.direct, buf.as_ptr(), buf.len(), offset)?;
        self.file.read_at(buf, offset)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        check_direct(self.direct, buf.as_ptr(), buf.len(), offset)?;
        self.file.write_all_at(buf, offset)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }

    fn is_direct(&self) -> bool {
        self.direct
    }
}

impl FileSystem for RealFs {
    fn open(&self, path: &Path, opts: OpenOptions) -> io::Result<Box<dyn FsFile>> {
        let mut o = fs::OpenOptions::new();
        o.read(true)
            .write(opts.write || opts.create)
            .create(opts.create);
        if opts.direct {
            o.custom_flags(libc::O_DIRECT);
        }
        Ok(Box::new(RealFile {
            file: o.open(path)?,
            direct: opts.direct,
        }))
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        fs::create_dir_all(path)
    }

    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for e in fs::read_dir(path)? {
            let e = e?;
            let name = e.file_name().into_string().map_err(|n| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("non-UTF-8 file name {n:?} in {}", path.display()),
                )
            })?;
            names.push(name);
        }
        names.sort();
        Ok(names)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        fs::File::open(path)?.sync_all()
    }

    fn exists(&self, path: &Path) -> io::Result<bool> {
        path.try_exists()
    }

    fn supports_direct_io(&self, dir: &Path) -> bool {
        let probe = dir.join(format!(".direct-io-probe-{}", std::process::id()));
        let ok = (|| -> io::Result<()> {
            let f = self.open(&probe, OpenOptions::create().with_direct(true))?;
            let mut page = AlignedBuf::with_capacity(DIRECT_IO_ALIGN);
            page.resize(DIRECT_IO_ALIGN);
            f.write_all_at(&page, 0)?;
            f.read_at(&mut page, 0)?;
            Ok(())
        })()
        .is_ok();
        let _ = fs::remove_file(&probe);
        ok
    }
}
