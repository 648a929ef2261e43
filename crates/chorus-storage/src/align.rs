//! Heap buffers aligned for direct IO, and the append both logs make with them.

use std::alloc::{self, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use crate::fs::{FsFile, DIRECT_IO_ALIGN};

/// A zero-initialised, fixed-capacity byte buffer whose address is a multiple of
/// [`DIRECT_IO_ALIGN`], as `O_DIRECT` reads and writes require.
///
/// Invariant: `len <= capacity`, `capacity` is a non-zero multiple of `DIRECT_IO_ALIGN`,
/// and all `capacity` bytes are initialised.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    capacity: usize,
}

// SAFETY: `AlignedBuf` owns its allocation exclusively, like a `Vec<u8>`.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out `&[u8]`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A buffer able to hold `capacity` bytes, rounded up to the alignment; length 0.
    pub fn with_capacity(capacity: usize) -> Self {
        let capacity = round_up(capacity.max(1), DIRECT_IO_ALIGN);
        let layout = Self::layout(capacity);
        // SAFETY: `layout` has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        Self {
            ptr,
            len: 0,
            capacity,
        }
    }

    fn layout(capacity: usize) -> Layout {
        // Cannot fail: the alignment is a power of two and `capacity` is bounded by the
        // allocator's own limits, which `alloc_zeroed` reports.
        Layout::from_size_align(capacity, DIRECT_IO_ALIGN).expect("valid aligned layout")
    }

    /// How many bytes the buffer can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// How many bytes are in use.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no bytes are in use.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Sets the length, zeroing bytes beyond the old length that become part of it.
    ///
    /// # Panics
    /// If `len > capacity` (a caller bug: capacities are fixed at creation).
    pub fn resize(&mut self, len: usize) {
        assert!(len <= self.capacity, "AlignedBuf::resize beyond capacity");
        let old = self.len;
        if len > old {
            self.full_mut()[old..len].fill(0);
        }
        self.len = len;
    }

    /// Appends `bytes`.
    ///
    /// # Panics
    /// If the bytes do not fit (a caller bug).
    pub fn extend_from_slice(&mut self, bytes: &[u8]) {
        let start = self.len;
        let end = start + bytes.len();
        assert!(end <= self.capacity, "AlignedBuf overflow");
        self.full_mut()[start..end].copy_from_slice(bytes);
        self.len = end;
    }

    /// Clears the buffer (length 0).
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// The whole capacity, in use or not, as a slice.
    pub fn full(&self) -> &[u8] {
        // SAFETY: all `capacity` bytes are initialised (zeroed at allocation).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.capacity) }
    }

    /// The whole capacity, in use or not, as a mutable slice.
    pub fn full_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `full`, and `&mut self` gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.capacity) }
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.full()[..self.len]
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        let len = self.len;
        &mut self.full_mut()[..len]
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `with_capacity` with this very layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.capacity)) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("len", &self.len)
            .field("capacity", &self.capacity)
            .finish()
    }
}

/// The partial last page of a file appended with direct IO, kept in memory, and the
/// aligned buffer appends are written from. Shared by the ordered log's tail block and
/// the out-of-order entries file.
#[derive(Debug)]
pub struct DirectAppend {
    /// The file's bytes from the page boundary at or below its end to the end.
    page: Vec<u8>,
    buf: AlignedBuf,
}

impl DirectAppend {
    /// Appends to a file whose bytes from the page boundary at or below its end are
    /// `page` (read by the caller through a buffered handle).
    pub fn new(page: Vec<u8>) -> Self {
        Self {
            page,
            // Grown to the largest write seen (one page for a small record): a node with
            // a thousand logs does not hold a megabyte for each.
            buf: AlignedBuf::with_capacity(2 * DIRECT_IO_ALIGN),
        }
    }

    /// Writes `bytes` at `end`, the file's end: the partial last page and `bytes`,
    /// zero-padded to whole pages, in one aligned write at the page boundary; keeps the
    /// new partial last page for the next append. On an error the file's state is
    /// unknown, and so is this one's: the caller fails its log.
    pub fn append(&mut self, file: &dyn FsFile, end: u64, bytes: &[u8]) -> std::io::Result<()> {
        let align = DIRECT_IO_ALIGN as u64;
        let page_start = round_down(end, align);
        debug_assert_eq!(page_start + self.page.len() as u64, end);
        let len = self.page.len() + bytes.len();
        let padded = round_up(len, DIRECT_IO_ALIGN);
        if self.buf.capacity() < padded {
            self.buf = AlignedBuf::with_capacity(padded);
        }
        self.buf.clear();
        self.buf.extend_from_slice(&self.page);
        self.buf.extend_from_slice(bytes);
        self.buf.resize(padded);
        file.write_all_at(&self.buf, page_start)?;
        let new_end = end + bytes.len() as u64;
        let keep = (new_end - round_down(new_end, align)) as usize;
        self.page.clear();
        self.page.extend_from_slice(&self.buf[len - keep..len]);
        Ok(())
    }
}

/// Bytes of the process's one buffer of zeros ([`write_zeros`]).
pub const ZEROS_LEN: usize = 1 << 20;

/// Writes zeros over `from..from + len` of `file`, in pieces of at most [`ZEROS_LEN`]
/// from one aligned, read-only buffer of zeros that every log of the process shares
/// (allocated on first use): a node hosting a thousand groups keeps one such buffer,
/// not one per log, and clears its pages once. `from` and `len` are multiples of
/// [`DIRECT_IO_ALIGN`] when `file` is open for direct IO.
pub fn write_zeros(file: &dyn FsFile, from: u64, len: usize) -> std::io::Result<()> {
    static ZEROS: std::sync::OnceLock<AlignedBuf> = std::sync::OnceLock::new();
    let zeros = ZEROS.get_or_init(|| {
        let mut b = AlignedBuf::with_capacity(ZEROS_LEN);
        b.resize(ZEROS_LEN);
        b
    });
    let mut done = 0usize;
    while done < len {
        let n = (len - done).min(ZEROS_LEN);
        file.write_all_at(&zeros[..n], from + done as u64)?;
        done += n;
    }
    Ok(())
}

/// `n` rounded up to a multiple of `align` (a power of two).
pub fn round_up(n: usize, align: usize) -> usize {
    debug_assert!(align.is_power_of_two());
    (n + align - 1) & !(align - 1)
}

/// `n` rounded down to a multiple of `align` (a power of two).
pub fn round_down(n: u64, align: u64) -> u64 {
    debug_assert!(align.is_power_of_two());
    n & !(align - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Zeros longer than the shared buffer go out in pieces and cover exactly the range
    /// asked for, over whatever the file held.
    #[test]
    fn zeros_of_any_length_cover_exactly_their_range() {
        use crate::fs::{FileSystem, OpenOptions, SimFs};
        let fs = SimFs::new(1);
        let dir = std::path::Path::new("/z");
        fs.create_dir_all(dir).expect("dir");
        let f = fs
            .open(&dir.join("f"), OpenOptions::create())
            .expect("open");
        let len = 2 * ZEROS_LEN + 3 * DIRECT_IO_ALIGN;
        let from = DIRECT_IO_ALIGN as u64;
        f.write_all_at(&vec![0xee; len + 2 * DIRECT_IO_ALIGN], 0)
            .expect("fill");
        write_zeros(f.as_ref(), from, len).expect("zeros");
        let mut back = vec![0u8; len + 2 * DIRECT_IO_ALIGN];
        f.read_exact_at(&mut back, 0).expect("read");
        let from = from as usize;
        assert!(back[..from].iter().all(|&b| b == 0xee), "before the range");
        assert!(back[from..from + len].iter().all(|&b| b == 0), "the range");
        assert!(
            back[from + len..].iter().all(|&b| b == 0xee),
            "after the range"
        );
    }

    #[test]
    fn aligned_and_zeroed() {
        let mut b = AlignedBuf::with_capacity(5000);
        assert_eq!(b.capacity(), 8192);
        assert_eq!(b.full().as_ptr() as usize % DIRECT_IO_ALIGN, 0);
        b.extend_from_slice(b"abc");
        b.resize(10);
        assert_eq!(&b[..], b"abc\0\0\0\0\0\0\0");
        b.resize(1);
        b.resize(3);
        assert_eq!(&b[..], b"a\0\0");
    }
}
