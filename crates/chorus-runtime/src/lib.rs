//! The Chorus runtime: replicated log groups running for real — on disk, over TCP — with
//! an embeddable, file-like API (PALF, VLDB 2024, Fig. 3 and sections 3.2, 3.3, 6).
//!
//! An [`Env`] is one process's environment: it owns a data directory, a bounded pool of
//! IO workers shared by every group, the replication transport and a timer, and hosts
//! any number of log groups of every mode — ordered (PALF) groups and out-of-order
//! (parallel or dependent) ones ([`Env::create_ooo_group`], [`env::OooHandle`]) — whose
//! lifecycle it owns: it creates them, opens them all at start, deletes and restarts them.
//! A [`LogHandle`] is one ordered group: append records (each gets its
//! LSN — a byte offset — and CSN at once, and a future that resolves exactly once to
//! Committed or Failed), read them back, follow the committed tail, locate by CSN,
//! subscribe to the tail and the role, trim, change membership and move leadership.
//!
//! The protocol itself lives in [`chorus_core::replica`], a pure state machine; this
//! crate only executes its actions (write, sync, send, save meta) in order and feeds the
//! outcomes back. Nothing is acknowledged, voted or reported committed by the replica
//! before the runtime has synced what it depends on.
//!
//! # Example
//!
//! A one-replica group (a majority of one), appended to and read back:
//!
//! ```
//! use chorus_runtime::{Env, EnvConfig, Outcome};
//! use std::time::Duration;
//!
//! let dir = tempfile::tempdir()?;
//! let env = Env::open(EnvConfig::new(1, dir.path(), "127.0.0.1:0".parse()?))?;
//! let log = env.create_group(7, &[1], &[])?;
//! // The single voter elects itself once its lease logic allows.
//! while log.append(b"warm-up", 0).is_err() {
//!     std::thread::sleep(Duration::from_millis(20));
//! }
//! let a = log.append(b"hello, chorus", 0)?;
//! let r = a.result.wait()?;
//! assert_eq!(r.outcome, Outcome::Committed);
//! assert_eq!(log.read(a.lsn)?.data, b"hello, chorus");
//! let all: Vec<_> = log.reader(0).collect::<Result<_, _>>()?;
//! assert_eq!(all.last().unwrap().lsn, a.lsn);
//! env.shutdown();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod applyq;
pub mod disk;
pub mod env;
pub mod error;
pub mod group;
pub mod lane;
pub mod metrics;
pub mod ooo;
pub mod ordered;
mod pass;
mod pool;
pub mod sched;
pub mod scrub;
pub mod transport;

pub use chorus_core::format::meta::{AccessMode, Membership, NodeId};
pub use chorus_core::replica::{MembershipChange, MirrorError, Outcome, Role};
pub use chorus_core::{Csn, Lsn};
pub use disk::DiskSpace;
pub use env::{Env, EnvConfig, LogHandle, LogReader, Replayer, DEFAULT_MIN_FREE_BYTES};
pub use error::Error;
pub use group::{AppendFuture, AppendResult, Appended, GroupId, GroupStatus, Record, RoleInfo};
pub use scrub::ScrubOptions;
