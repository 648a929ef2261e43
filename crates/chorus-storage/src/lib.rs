//! Chorus local storage: the durable log of one replica in constant-size block files, the
//! crash-atomic meta storage beside it, and the [`fs::FileSystem`] seam through which both
//! reach the disk.
//!
//! See `docs/formats.md` for every on-disk byte and `docs/architecture.md` for how recovery
//! tells a torn tail from corruption.

pub mod align;
pub mod error;
pub mod fs;

pub use error::{Result, StorageError};
pub mod log;

pub use log::{Damage, LogOptions, LogStorage, RecoveryReport, SyncPoint};
pub mod meta;
pub mod ooo;
pub mod slots;

pub use meta::{MetaRecovery, MetaStorage};
