//! The Chorus file system (PolarFS section 6, libpfs): a file system laid out on a
//! replicated volume, shared by one writing node and many reading ones.
//!
//! This crate holds the on-volume formats and the pure logic over a [`Device`] (a
//! volume, or memory in tests):
//! - [`layout`]: the superblock and where everything lives on the volume;
//! - [`meta`]: metaobjects (inodes, directory entries, block tags) in 4 KiB sectors,
//!   partitioned by chunk and type and addressed by (identifier, type) (section 6.1);
//! - [`journal`]: metadata transactions recorded with their old and new values, valid up
//!   to the log anchor (section 6.2);
//! - [`paxos`]: Disk Paxos over pages of the volume, deciding the journal's writer and
//!   every move of its anchor (section 6.2);
//! - [`store`]: every metaobject in memory, changed by transactions' operations and
//!   rolled back from their old values;
//! - [`coord`]: a mounted host: readers replay the journal to the latest anchor, the
//!   writer wins the journal and commits each transaction by a Disk Paxos instance, and
//!   rolls back and replays when another host took over (Fig. 8);
//! - [`pfs`]: the file-system API of Fig. 3 (mount, paths, descriptors, data I/O);
//! - [`fsck`]: the metaobjects checked against each other;
//! - [`fuse`]: the file system as a kernel mount, for real programs.
//!
//! Formats are documented byte by byte in `docs/formats.md` ("File system").

pub mod coord;
pub mod device;
pub mod fsck;
pub mod fuse;
mod index;
pub mod journal;
pub mod layout;
pub mod meta;
pub mod mkfs;
pub mod paxos;
pub mod pfs;
pub mod store;

pub use device::{Device, MemDevice};
pub use layout::{FsError, Geometry, Superblock};
