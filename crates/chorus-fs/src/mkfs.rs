//! Making a file system on a volume (`chorus fs mkfs`): the Disk Paxos pages cleared,
//! every metaobject sector written (all free but the root directory), and the
//! superblock last, so that a volume whose `mkfs` was interrupted holds no file system
//! that mounts.

use crate::device::Device;
use crate::layout::{FsError, Geometry, Superblock, SECTOR};
use crate::store::MetaStore;

/// Makes a file system of geometry `g` on `dev`, identified by `uuid` (drawn by the
/// caller, nonzero), its root created at `now_ns`.
pub fn mkfs(dev: &dyn Device, g: Geometry, uuid: u64, now_ns: i64) -> Result<Superblock, FsError> {
    let g = Geometry::new(g)?;
    if g.volume_bytes > dev.size() {
        return Err(FsError::Layout(format!(
            "the file system would cover {} bytes; the volume has {}",
            g.volume_bytes,
            dev.size()
        )));
    }
    if uuid == 0 {
        return Err(FsError::Layout("uuid 0 is reserved".into()));
    }
    let sb = Superblock { geometry: g, uuid };
    // No file system while this runs: the old superblock goes first.
    dev.write(0, &vec![0u8; SECTOR as usize])?;
    dev.write(
        g.paxos_start(),
        &vec![0u8; ((1 + g.max_hosts as u64) * SECTOR) as usize],
    )?;
    MetaStore::fresh(sb, now_ns).write_all(dev)?;
    dev.write(0, &sb.encode())?;
    Ok(sb)
}
