//! What the replica asks of its driver ([`Action`], executed in order) and what a storage
//! read it asks for is for ([`ReadPurpose`]).

use crate::format::group::ChainPoint;
use crate::format::meta::{ConfigVersion, MetaRecord, NodeId};
use crate::{Csn, Lsn};

use super::{Message, Outcome, Role};

/// What a storage read is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadPurpose {
    /// Catching up follower `peer`.
    CatchUp {
        /// The follower.
        peer: NodeId,
    },
    /// Answering `peer`'s repair request for `from..to` (`from` is the read's start).
    Repair {
        /// The damaged replica.
        peer: NodeId,
        /// End of the range asked for.
        to: Lsn,
    },
    /// Answering `peer`'s repair request for a range wholly below our log start (we
    /// trimmed it: it is committed): the read is from our start, for the chain point
    /// there, and the answer is a [`Message::Rebase`] at our start.
    RepairRebase {
        /// The damaged replica.
        peer: NodeId,
    },
    /// Answering candidate `peer`'s fetch under `pid`.
    Fetch {
        /// The candidate.
        peer: NodeId,
        /// Its proposal id.
        pid: u64,
        /// Bytes of groups it asked for.
        max_bytes: u32,
        /// It asked from below our log start: the read is from our start, and the answer
        /// begins with a [`Message::Rebase`] there.
        rebase: bool,
    },
}

/// Something the driver must do, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Send a message.
    Send {
        /// Recipient.
        to: NodeId,
        /// The message.
        msg: Message,
    },
    /// Append whole groups at the log tail (`lsn` is the current end). The driver syncs
    /// after writes and reports with [`Replica::log_flushed`].
    ///
    /// [`Replica::log_flushed`]: super::Replica::log_flushed
    Write {
        /// Where the bytes go.
        lsn: Lsn,
        /// Whole groups.
        bytes: Vec<u8>,
    },
    /// Durably remove the log from `lsn` (a group boundary).
    Truncate {
        /// First LSN removed.
        lsn: Lsn,
    },
    /// Save and sync this meta record, then call [`Replica::meta_saved`] with `seq`.
    ///
    /// [`Replica::meta_saved`]: super::Replica::meta_saved
    SaveMeta {
        /// Sequence of the save.
        seq: u64,
        /// The record.
        record: MetaRecord,
    },
    /// Read whole groups from storage from `from` (at most about `max_bytes`, with the
    /// chain at `from`) and hand them back with [`Replica::log_read`].
    ///
    /// [`Replica::log_read`]: super::Replica::log_read
    ReadLog {
        /// What for.
        purpose: ReadPurpose,
        /// First LSN.
        from: Lsn,
        /// Byte budget.
        max_bytes: usize,
    },
    /// The final result of an append accepted by this replica.
    Result {
        /// The ticket id.
        id: u64,
        /// The record's LSN.
        lsn: Lsn,
        /// The record's CSN.
        csn: Csn,
        /// Committed or failed.
        outcome: Outcome,
    },
    /// The role changed.
    Role {
        /// New role.
        role: Role,
        /// Proposal id it is under.
        pid: u64,
        /// The leader followed, if known.
        leader: Option<NodeId>,
    },
    /// The committed end advanced: everything below `end` may be applied.
    Commit {
        /// New committed end.
        end: Lsn,
        /// The largest CSN below `end`: every record with a CSN at most this one is
        /// committed once the log holds `end`, and every later record gets a larger CSN
        /// (PALF section 4.2), so a replica that has `end` in its log can serve reads at
        /// this CSN (its readable CSN). Never more than the truth; see
        /// [`Replica::committed_csn`](super::Replica::committed_csn).
        csn: Csn,
    },
    /// A membership became accepted by a majority (leader only).
    ConfigCommitted {
        /// Its version.
        version: ConfigVersion,
    },
    /// Rewrite the damaged range starting at `lsn` with `bytes` (a peer's copy; storage
    /// verifies it against the checksum chain), then restart the replica from storage.
    Repair {
        /// Start of the damaged range.
        lsn: Lsn,
        /// The copy.
        bytes: Vec<u8>,
        /// Who sent it (report a refused copy with [`Replica::repair_refused`]).
        ///
        /// [`Replica::repair_refused`]: super::Replica::repair_refused
        peer: NodeId,
    },
    /// The damaged range was never committed (a majority of voters cleanly lacks it), so
    /// it and everything after it may go: truncate the log from `lsn`, then restart the
    /// replica from storage.
    DiscardDamaged {
        /// Start of the damaged range.
        lsn: Lsn,
    },
    /// An input was dropped (counted in [`Replica::drops`]).
    ///
    /// [`Replica::drops`]: super::Replica::drops
    Dropped {
        /// Sender, for messages.
        from: Option<NodeId>,
        /// Why.
        reason: &'static str,
    },
    /// The replica stopped: continuing could lose or invent data.
    Halt {
        /// Why.
        reason: String,
    },
    /// Discard the whole log and start it again, empty, at `base` (storage's
    /// `LogStorage::rebase`), durably, before the actions after it: the replica fell behind
    /// its leader's log start ([`Message::Rebase`]). Readers of this replica find nothing
    /// below `base` any more.
    Rebase {
        /// Where the log starts again, with the checksum chain there.
        base: ChainPoint,
    },
    /// The result of an append accepted by this replica can no longer be known: the log
    /// it was written at was trimmed on the leader before this replica learned whether it
    /// committed (it fell behind the leader's log start while holding it). As after a
    /// crash, the appender must find out from the log itself.
    Unknown {
        /// The ticket id.
        id: u64,
        /// The record's LSN.
        lsn: Lsn,
    },
}
