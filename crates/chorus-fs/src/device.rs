//! What the file system is laid out on: byte-addressed reads and writes of a volume.
//! A write returns once it is durable (the volume client acknowledges a write only once
//! a majority of every chunk's replicas holds it).

use std::io;
use std::sync::Mutex;

/// A volume as the file system sees it.
pub trait Device: Send + Sync {
    /// The volume's size in bytes.
    fn size(&self) -> u64;
    /// `len` bytes at `offset`.
    fn read(&self, offset: u64, len: usize) -> io::Result<Vec<u8>>;
    /// Writes `data` at `offset`, durably, before returning.
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()>;
}

/// A volume in memory (tests and the deterministic harnesses). Never-written bytes read
/// as zeros, as on a thin-provisioned volume.
#[derive(Debug)]
pub struct MemDevice {
    bytes: Mutex<Vec<u8>>,
}

impl MemDevice {
    /// A zeroed device of `size` bytes.
    pub fn new(size: u64) -> Self {
        Self {
            bytes: Mutex::new(vec![0; size as usize]),
        }
    }

    /// A copy of every byte (tests compare or damage them).
    pub fn snapshot(&self) -> Vec<u8> {
        self.bytes.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Flips the bits of `mask` in the byte at `offset` (damage at rest, for tests).
    pub fn flip(&self, offset: u64, mask: u8) {
        let mut b = self.bytes.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(x) = b.get_mut(offset as usize) {
            *x ^= mask;
        }
    }
}

fn out_of_range(offset: u64, len: usize, size: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{len} bytes at offset {offset} run past the device's {size} bytes"),
    )
}

impl Device for MemDevice {
    fn size(&self) -> u64 {
        self.bytes.lock().unwrap_or_else(|p| p.into_inner()).len() as u64
    }

    fn read(&self, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let b = self.bytes.lock().unwrap_or_else(|p| p.into_inner());
        let size = b.len() as u64;
        let end = offset
            .checked_add(len as u64)
            .filter(|&e| e <= size)
            .ok_or_else(|| out_of_range(offset, len, size))?;
        Ok(b[offset as usize..end as usize].to_vec())
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut b = self.bytes.lock().unwrap_or_else(|p| p.into_inner());
        let size = b.len() as u64;
        let end = offset
            .checked_add(data.len() as u64)
            .filter(|&e| e <= size)
            .ok_or_else(|| out_of_range(offset, data.len(), size))?;
        b[offset as usize..end as usize].copy_from_slice(data);
        Ok(())
    }
}
