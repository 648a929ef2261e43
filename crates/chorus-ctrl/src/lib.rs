//! The control plane's state (PolarFS section 3.2.3, PolarCtrl), as pure code.
//!
//! PolarCtrl tracks chunk servers' membership and liveness, keeps every volume and where
//! its chunks' replicas live, creates volumes and assigns chunks to servers, migrates
//! replicas off overloaded or failed servers, and serves the chunk map to routing
//! clients (section 3.2.3, duties 1–4). As in PolarFS it stays off the I/O path: chunk
//! groups elect leaders and recover by themselves (section 7.1), and clients route
//! with a cached map (section 3.2.1).
//!
//! PolarCtrl keeps its metadata in a MySQL instance; Chorus keeps it in an ordered
//! Chorus group instead. The state is a [`Meta`]; every change is a [`Command`] the
//! control leader checks ([`Meta::check`]) and appends to that group's log; every
//! control node applies the log in order with [`Meta::apply`], which is deterministic
//! (state and command in, state out: no clock, no randomness, ordered maps only), so all
//! reach the same state, and a command made invalid by an earlier entry is refused on
//! all alike. The log is trimmed behind an image of the state
//! ([`Meta::encode_image`]), which also starts a new control node.
//!
//! The state also names each volume's disk-outage-consistent snapshots and the clones
//! being copied from them (PolarFS section 7.2): [`Command::CreateSnapshot`] and its
//! kin, [`Command::CloneVolume`], [`Meta::snapshot_tag`].
//!
//! - [`meta`]: the state, its commands and their rules.
//! - [`codec`]: the byte formats of a command (a log entry) and of an image.
//! - [`place`]: placement rules — where new chunks go, where a replica moves, which
//!   moves even out load and preferred leaders (duties 1 and 3).
//! - [`live`]: liveness from heartbeats, which the control leader keeps in memory (not
//!   in the log) to decide when a server's fault lasts (section 3.2.2).

mod apply;
pub mod codec;
pub mod live;
pub mod meta;
pub mod place;

pub use codec::DecodeError;
pub use live::Liveness;
pub use meta::{
    Chunk, Command, GroupId, Meta, MetaError, Move, Node, NodeId, NodeState, Snapshot,
    SnapshotState, Volume, VolumeState,
};
pub use place::{drain_moves, leader_moves, place_chunks, rebalance, replacement, PlaceError};
