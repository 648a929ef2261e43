//! The replica of one log group as a pure state machine (DESIGN.md principle 1).
//!
//! Inputs are method calls carrying the current time ([`Replica::tick`],
//! [`Replica::receive`], [`Replica::append`], [`Replica::log_flushed`],
//! [`Replica::meta_saved`], [`Replica::log_read`], ...). Outputs are [`Action`]s the driver
//! drains with [`Replica::take_actions`] and executes in order: messages to send, bytes to
//! append at the log tail, truncations, meta records to save, storage reads, results for
//! appenders, role changes. The replica never touches a clock, thread, socket or file, so
//! the simulator (`chorus-sim`) runs clusters of it deterministically from a seed.
//!
//! # Protocol (ordered mode)
//!
//! * **Election** (PALF section 3.4) is decoupled from replication. Every replica pings its
//!   priority. A voter whose leader lease has expired campaigns when it is the highest
//!   priority alive in a majority it can hear; voters refuse a candidate while they know a
//!   higher-priority voter is alive or while a leader's lease they granted is live, and
//!   refuse any candidate with an older config version (section 5.3, rules out Fig. 8b).
//! * **Reconfirmation** (PALF Alg. 1): the candidate promises proposal id `pid + 1`
//!   durably, collects durable promises from a majority with their flushed end and last
//!   proposal id, adopts the log of the highest (last pid, end) among them (fetching it),
//!   appends an empty StartWorking group under its own pid and re-stamps its membership
//!   under the new pid (which rolls back a previous leader's uncommitted membership), and
//!   serves once the StartWorking group is committed.
//! * **Replication** is pipelined with a bounded window; followers accept groups that
//!   continue their log (matched by LSN and accumulated checksum), truncate a conflicting
//!   uncommitted suffix, buffer a bounded number of early messages, and acknowledge the
//!   end of the prefix that is both flushed and matched with the leader.
//! * **Commit point** (piggyback paper section 4): the leader's committed end LSN is in
//!   every group header and heartbeat ([`CommitMode::Piggyback`]); [`CommitMode::Sync`]
//!   and [`CommitMode::Async`] instead write commit-only groups when it changes or
//!   periodically, the two baselines of the paper.
//! * **Explicit results** (PALF section 4.1): every accepted append ends exactly once in
//!   [`Outcome::Committed`] or [`Outcome::Failed`], decided only against the committed log:
//!   once the committed end passes the group's LSN, the group is committed if the committed
//!   log holds it, failed otherwise. A leader that loses leadership becomes a pending
//!   follower until its pending groups are decided.
//! * **Reconfiguration** lives in meta storage (PALF section 5.3): single-member changes
//!   carry a log barrier; a replica adopts a config only when its log matches the leader's
//!   up to the barrier (rules out Fig. 8a). Commit counting needs a majority of the new and,
//!   until it is accepted by a majority, of the previous voters.
//! * **Access modes and mirrors** (PALF section 5.2): the access mode is part of the
//!   config, switched like a membership change ([`Replica::change_access_mode`]). In
//!   [`AccessMode::RawWrite`] the group is a mirror: appends are refused and the leader
//!   takes whole groups another log committed ([`Replica::mirror`]), at the same LSN with
//!   the same entries and CSNs, re-sealed under its own proposal id. A mirror's leader
//!   writes no group of its own (the LSN space is the primary's): it has no StartWorking
//!   group, serves as soon as its log is reconfirmed, and the log it inherited commits
//!   with the first group it mirrors — Raft's rule, a quorum on a group of its own
//!   proposal id. (Re-sealing the inherited last group instead would rewrite it where a
//!   majority may already hold it committed; the simulator found that.) It publishes its
//!   commit point the piggyback way in every commit mode.

mod log;
pub mod message;
pub mod policy;

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::format::entry;
use crate::format::group::FLAG_MIRRORED;
use crate::format::group::{
    block_remaining, decode_group, encode_padding, fits_in_block, seal_group, ChainPoint,
    GroupHeader, SealParams, GROUP_HEADER_SIZE,
};
use crate::format::meta::{AccessMode, ConfigVersion, Membership, MetaRecord, NodeId, Vote};
use crate::rng::Rng;
use crate::rtt::RttWindow;
use crate::{Csn, Lsn};

use log::LogView;
pub use log::{GroupMeta, RecoveredLog};
pub use message::{LogPos, Message, Priority};
pub use policy::{MergeCandidate, Ordered, Policy};

/// Time in nanoseconds on the replica's monotonic clock, supplied by the driver.
pub type Nanos = u64;

const MS: Nanos = 1_000_000;

/// Default of [`ReplicaConfig::gap_resend_after`]: the out-of-order replica's
/// [`crate::ooo::replica::HOLE_RESEND`], so the two modes recover from an overtaken
/// message alike.
pub const GAP_RESEND_AFTER: usize = 3;

/// How the committed end LSN reaches followers (piggyback paper sections 4 and 6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CommitMode {
    /// In the header of the next group and in heartbeats: no extra write (PIGGY).
    #[default]
    Piggyback,
    /// A commit-only group is written and replicated whenever the commit point changes
    /// (the paper's SYNC baseline).
    Sync,
    /// A commit-only group is written every `interval` if the commit point changed (the
    /// paper's ASYNC baseline).
    Async {
        /// The flush interval.
        interval: Nanos,
    },
}

/// Deliberately broken variants, for showing that the simulator finds violations. Only
/// compiled with the `broken` feature, which production builds never enable.
#[cfg(feature = "broken")]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Broken {
    /// Correct protocol.
    #[default]
    None,
    /// The candidate skips reconfirmation: it serves its own log without learning the
    /// longest log of a majority.
    SkipReconfirmation,
    /// Followers acknowledge what they have written, not what they have synced.
    AckBeforeFsync,
    /// A replica rebased past its pending appends reports them Failed (a guess: some
    /// committed) instead of unknown.
    GuessOnRebase,
    /// A mirror's new leader writes an empty StartWorking group, as a primary's does,
    /// into the primary's LSN space.
    MirrorStartWorking,
}

/// Settings of one replica. Times are in nanoseconds.
#[derive(Clone, Debug)]
pub struct ReplicaConfig {
    /// This replica's id.
    pub id: NodeId,
    /// User-set election priority (higher wins, after config version).
    pub priority: u32,
    /// Bytes per log block (groups never straddle blocks).
    pub block_size: u64,
    /// Leader lease. A follower does not help elect anyone else for this long after it
    /// last heard the leader; the leader stops leading when it cannot renew it.
    pub lease: Nanos,
    /// Bound on clock rate difference between replicas, in parts per million; the leader
    /// shortens its own view of the lease by twice this.
    pub max_clock_drift_ppm: u32,
    /// Leader heartbeat period.
    pub heartbeat_interval: Nanos,
    /// Period of priority pings.
    pub ping_interval: Nanos,
    /// Resend unacknowledged log after this long without progress.
    pub resend_interval: Nanos,
    /// Bytes the leader may have appended beyond the committed end (back-pressure).
    pub window_bytes: u64,
    /// Largest group (header and body).
    pub max_group_bytes: usize,
    /// Largest batch of log bytes in one message.
    pub max_message_bytes: usize,
    /// Freeze the open group at least this often under high concurrency (PALF section 6).
    pub freeze_interval: Nanos,
    /// Open groups with fewer entries than this are frozen as soon as the log IO is idle;
    /// larger ones wait for `freeze_interval` (adaptive group replication, PALF section 6).
    pub group_factor_threshold: u32,
    /// How the commit point reaches followers.
    pub commit_mode: CommitMode,
    /// Index entries kept for committed groups.
    pub max_index_groups: usize,
    /// Bytes of recent groups kept in memory for replication.
    pub cache_bytes: usize,
    /// Early (out-of-order) append messages a follower buffers.
    pub max_buffered_appends: usize,
    /// A follower holding this many early append messages past a gap asks the leader to
    /// resend from its end at once, and again for the same gap each time it holds this
    /// many more (the resent copy overtaken too) (0: only on a heartbeat past its end or
    /// the leader's `resend_interval`). The ordered counterpart of the out-of-order
    /// replica's hole resends: the message filling the gap was overtaken by this many
    /// later ones (lost, or stuck behind a slow connection), so a copy sent now takes
    /// another path — TCP's fast retransmit after three duplicate acknowledgements
    /// (RFC 5681), asked by the receiver because only it sees the gap.
    pub gap_resend_after: usize,
    /// Leader: when the oldest message past a follower's match went unacknowledged for
    /// this many times its median acknowledgement round trip, send that message again at
    /// once, and again after twice that, doubling while it goes unanswered (0: off). Covers what [`Self::gap_resend_after`]
    /// cannot — the last message sent, which nothing later overtakes (a lone writer, a
    /// burst's tail) — as TCP's tail loss probe does (RFC 8985), and shortens the time a
    /// follower lags behind a gap (while it lags, each commit rests on the other
    /// followers alone); see [`crate::rtt`]. The out-of-order counterpart is
    /// `OooConfig::timed_resend`.
    pub timed_resend: u32,
    /// Seed for the replica's own randomness (election back-off).
    pub seed: u64,
    /// Broken variant (test-only).
    #[cfg(feature = "broken")]
    pub broken: Broken,
}

impl Default for ReplicaConfig {
    fn default() -> Self {
        Self {
            id: 1,
            priority: 0,
            block_size: 64 << 20,
            lease: 2_000 * MS,
            max_clock_drift_ppm: 10_000,
            heartbeat_interval: 200 * MS,
            ping_interval: 200 * MS,
            resend_interval: 400 * MS,
            window_bytes: 64 << 20,
            max_group_bytes: 2 << 20,
            max_message_bytes: 4 << 20,
            freeze_interval: MS,
            group_factor_threshold: 2,
            commit_mode: CommitMode::Piggyback,
            max_index_groups: 4096,
            cache_bytes: 64 << 20,
            max_buffered_appends: 64,
            gap_resend_after: GAP_RESEND_AFTER,
            timed_resend: crate::ooo::replica::TIMED_RESEND,
            seed: 0,
            #[cfg(feature = "broken")]
            broken: Broken::None,
        }
    }
}

/// A replica's role (PALF Fig. 4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// Follows a leader (or waits for one).
    Follower,
    /// Campaigning and reconfirming the log.
    Candidate,
    /// Serving appends.
    Leader,
    /// A former leader waiting to learn the results of its pending appends.
    PendingFollower,
}

/// The final result of an append.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The record is in the committed log at its LSN.
    Committed,
    /// The record will never be committed.
    Failed,
}

/// Why an append was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AppendError {
    /// Not the serving leader; `leader` is a hint.
    #[error("not the leader (leader hint: {leader:?})")]
    NotLeader {
        /// The leader this replica follows, if any.
        leader: Option<NodeId>,
    },
    /// The window of uncommitted log is full; retry after results arrive.
    #[error("replication window full")]
    WindowFull,
    /// Leadership is being transferred.
    #[error("leader transfer in progress")]
    Transferring,
    /// The record exceeds the largest record or group size.
    #[error("record of {len} bytes exceeds the limit of {max}")]
    TooLarge {
        /// Record length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The replica has halted.
    #[error("replica halted: {0}")]
    Halted(&'static str),
    /// The group's access mode is not [`AccessMode::Append`] (it is a mirror, or a switch
    /// is under way): appends are refused.
    #[error("{}", access_mode_refusal("appends", *.mode, *.switching))]
    AccessMode {
        /// The mode of the group's config.
        mode: AccessMode,
        /// A switch to `mode` is not yet accepted by a majority.
        switching: bool,
    },
}

/// The text of a refusal by access mode; the runtime's error already says what was
/// refused ("append refused: ...", "mirror write refused: ...").
fn access_mode_refusal(what: &str, mode: AccessMode, switching: bool) -> String {
    if switching {
        format!(
            "the group's access mode is being switched to {}: no {what} until a majority holds it",
            mode.name()
        )
    } else {
        let takes = match mode {
            AccessMode::Append => "a primary takes no mirror writes",
            AccessMode::RawWrite => "a mirror takes no appends",
        };
        format!("the group's access mode is {}: {takes}", mode.name())
    }
}

/// Why a [`Replica::mirror`] was refused. Nothing was written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MirrorError {
    /// Not the serving leader; `leader` is a hint.
    #[error("not the leader (leader hint: {leader:?})")]
    NotLeader {
        /// The leader this replica follows, if any.
        leader: Option<NodeId>,
    },
    /// Leadership is being transferred.
    #[error("leader transfer in progress")]
    Transferring,
    /// The window of uncommitted log is full; retry after results arrive.
    #[error("replication window full")]
    WindowFull,
    /// The replica has halted.
    #[error("replica halted: {0}")]
    Halted(&'static str),
    /// The group's access mode is not [`AccessMode::RawWrite`] (or a switch is under way).
    #[error("{}", access_mode_refusal("mirror writes", *.mode, *.switching))]
    AccessMode {
        /// The mode of the group's config.
        mode: AccessMode,
        /// A switch to `mode` is not yet accepted by a majority.
        switching: bool,
    },
    /// The group does not start where this log ends: mirror from `expected`.
    #[error("the mirrored group is at LSN {found}, but this log ends at {expected}")]
    Lsn {
        /// This log's end: where the next mirrored group must start.
        expected: Lsn,
        /// The group's LSN.
        found: Lsn,
    },
    /// The bytes are not one whole, valid group that can continue this log.
    #[error("mirrored group refused: {0}")]
    Invalid(String),
}

impl From<AppendError> for MirrorError {
    fn from(e: AppendError) -> Self {
        match e {
            AppendError::NotLeader { leader } => MirrorError::NotLeader { leader },
            AppendError::Transferring => MirrorError::Transferring,
            AppendError::WindowFull => MirrorError::WindowFull,
            AppendError::Halted(w) => MirrorError::Halted(w),
            AppendError::AccessMode { mode, switching } => {
                MirrorError::AccessMode { mode, switching }
            }
            AppendError::TooLarge { len, max } => {
                MirrorError::Invalid(format!("group of {len} bytes exceeds the limit of {max}"))
            }
        }
    }
}

/// An accepted append.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket {
    /// Identifies the append in the later [`Action::Result`].
    pub id: u64,
    /// LSN of the record.
    pub lsn: Lsn,
    /// CSN of the record.
    pub csn: Csn,
}

/// The log tail reserved for lock-free appends (PALF section 6).
///
/// The driver opens a lane with [`Replica::open_lane`]; appenders then take their LSN and
/// CSN with an atomic compare-and-swap on the driver's side and copy their entries into
/// the group body at that offset with no lock and no call into the replica; the driver
/// hands the filled body back with [`Replica::close_lane`], and the replica seals and
/// replicates it as one group. While a lane is open the replica writes nothing else, so
/// the driver must close it before any other input: an input that finds a lane open
/// abandons it (counted as a drop), and its entries then fail — they were never written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lane {
    /// LSN of the group the entries form; the first entry is at `lsn + GROUP_HEADER_SIZE`.
    pub lsn: Lsn,
    /// Proposal id of the leader that opened it.
    pub pid: u64,
    /// Most bytes of entries (headers included) the group body may hold.
    pub capacity: usize,
    /// Largest record one entry may carry.
    pub max_record: usize,
    /// CSN of the last record before the lane: the entries' CSNs must exceed it and grow.
    pub last_csn: Csn,
    /// When it was opened (the group's age for the freeze interval).
    pub opened: Nanos,
}

/// A single-member membership change (PALF section 5.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MembershipChange {
    /// Add a non-voting learner.
    AddLearner(NodeId),
    /// Add a voter directly.
    AddVoter(NodeId),
    /// Make a caught-up learner a voter.
    Promote(NodeId),
    /// Remove a voter or learner (not the leader itself: transfer leadership first).
    Remove(NodeId),
    /// Replace voter `old` by `new`: add `new`, then remove `old`, one step at a time.
    Replace {
        /// The voter leaving.
        old: NodeId,
        /// The replica joining.
        new: NodeId,
    },
}

/// Why a membership change or transfer was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ChangeError {
    /// Not the serving leader.
    #[error("not the leader")]
    NotLeader,
    /// A previous change is not yet accepted by a majority.
    #[error("a membership change is in progress")]
    InProgress,
    /// The change does not apply to the current membership.
    #[error("invalid change: {0}")]
    Invalid(String),
    /// A switch to raw-write needs the whole log committed, and it is not yet: stop the
    /// appends and retry.
    #[error(
        "the log is committed up to {committed} of its end {end}: a switch to raw-write waits until all of it is (stop appends, then retry)"
    )]
    Uncommitted {
        /// The committed end.
        committed: Lsn,
        /// The log end.
        end: Lsn,
    },
}

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
    SaveMeta {
        /// Sequence of the save.
        seq: u64,
        /// The record.
        record: MetaRecord,
    },
    /// Read whole groups from storage from `from` (at most about `max_bytes`, with the
    /// chain at `from`) and hand them back with [`Replica::log_read`].
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

#[derive(Clone, Debug)]
struct PendingGroup {
    lsn: Lsn,
    pid: u64,
    acc: u32,
    records: Vec<(u64, Lsn, Csn)>,
}

#[derive(Clone, Debug, Default)]
struct PeerInfo {
    last_heard: Option<Nanos>,
    /// Advertised priority, if the peer is a voter of its own membership.
    prio: Option<Priority>,
}

#[derive(Clone, Debug)]
struct Progress {
    matched: Lsn,
    next: Lsn,
    last_progress: Nanos,
    read_pending: bool,
    config_version: ConfigVersion,
    /// What was sent past `matched`, in order: each message's end, when it left, and
    /// whether it was the first copy of those bytes (only those give round trips, Karn's
    /// rule). A rewind leaves one entry, not first, for everything resent
    /// ([`ReplicaConfig::timed_resend`]).
    sent: VecDeque<(Lsn, Nanos, bool)>,
    /// The furthest end ever sent to it.
    sent_max: Lsn,
    /// Its recent acknowledgement round trips.
    rtt: RttWindow,
    /// Timed resends since it last acknowledged anything new: each doubles the wait for
    /// the next (a follower that is down or cut off is not sent its log over and over).
    timed: u32,
}

impl Progress {
    fn new(end: Lsn, now: Nanos) -> Self {
        Self {
            matched: 0,
            next: end,
            last_progress: now,
            read_pending: false,
            config_version: ConfigVersion::default(),
            sent: VecDeque::new(),
            sent_max: end,
            rtt: RttWindow::default(),
            timed: 0,
        }
    }

    /// A message ending at `next` left now.
    fn sent_upto(&mut self, next: Lsn, now: Nanos) {
        self.next = next;
        if next > self.sent_max {
            self.sent_max = next;
            self.sent.push_back((next, now, true));
        }
    }

    /// Sending starts again from `from` (a resend): what was in flight is resent now.
    fn rewind(&mut self, from: Lsn, now: Nanos) {
        self.next = from;
        self.sent.clear();
        if self.sent_max > from {
            self.sent.push_back((self.sent_max, now, false));
        }
    }

    /// When its oldest unacknowledged message is due to be sent again on time
    /// ([`ReplicaConfig::timed_resend`]): `factor` times its median round trip after a
    /// first copy left; after a resent one twice that, doubled again for each timed
    /// resend it went without acknowledging anything (up to 1024 times). `None` while
    /// nothing is due: no timeout measured yet, a read of the log pending, or nothing
    /// past its match.
    fn timed_due(&self, factor: u32, end: Lsn) -> Option<Nanos> {
        let after = self.rtt.timeout(factor)?;
        if self.read_pending || self.matched >= end {
            return None;
        }
        self.sent.front().map(|&(_, at, first)| {
            let wait = if first {
                after
            } else {
                after.saturating_mul(1 << (self.timed + 1).min(10))
            };
            at.saturating_add(wait)
        })
    }

    /// Its oldest unacknowledged message goes again now: it counts as resent (no round
    /// trip from it, Karn's rule). Returns its end.
    fn resend_front(&mut self, now: Nanos) -> Option<Lsn> {
        let f = self.sent.front_mut()?;
        f.1 = now;
        f.2 = false;
        self.timed = self.timed.saturating_add(1);
        Some(f.0)
    }

    /// It acknowledged everything below `matched`: a round trip from the latest first
    /// copy that answer covers.
    fn acked_upto(&mut self, matched: Lsn, now: Nanos) {
        let mut latest = None;
        self.timed = 0;
        while let Some(&(end, at, first)) = self.sent.front() {
            if end > matched {
                break;
            }
            self.sent.pop_front();
            latest = first.then_some(at);
        }
        if let Some(at) = latest {
            self.rtt.sample(now.saturating_sub(at));
        }
    }
}

#[derive(Debug)]
struct OpenGroup {
    lsn: Lsn,
    buf: Vec<u8>,
    entries: u32,
    max_csn: Csn,
    records: Vec<(u64, Lsn, Csn)>,
    opened: Nanos,
}

#[derive(Debug)]
struct Leading {
    pid: u64,
    progress: BTreeMap<NodeId, Progress>,
    start_working_end: Lsn,
    serving: bool,
    lease_acks: BTreeMap<NodeId, Nanos>,
    open: Option<OpenGroup>,
    last_heartbeat: Nanos,
    transfer: Option<(NodeId, Nanos)>,
    prev_config: Option<Membership>,
    config_committed: bool,
    /// The access mode of the last config this leader saw accepted by a majority (none
    /// until its re-stamped config is).
    committed_mode: Option<AccessMode>,
    replace_then_remove: Option<NodeId>,
    published_commit: Lsn,
    last_commit_record_end: Lsn,
    last_async: Nanos,
    became_leader: Nanos,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CampaignPhase {
    /// Waiting for our own promise to be durable.
    Promising,
    /// Prepare sent, collecting acks.
    Preparing,
    /// Fetching the chosen log from `source` up to `target`.
    Fetching { source: NodeId, target: Lsn },
    /// StartWorking written; acting as leader until it commits.
    Confirming,
}

#[derive(Debug)]
struct Campaign {
    pid: u64,
    transfer: bool,
    started: Nanos,
    phase: CampaignPhase,
    acks: BTreeMap<NodeId, MergeCandidate>,
    rejected: BTreeSet<NodeId>,
    lease_ts: BTreeMap<NodeId, Nanos>,
}

/// A damaged range being repaired from peers (protocol-aware recovery).
#[derive(Clone, Debug)]
struct RepairState {
    from: Lsn,
    to: Lsn,
    /// Voters that answered they hold no copy (and are not damaged themselves).
    no_copy: BTreeSet<NodeId>,
    /// Voters whose own copy is damaged.
    damaged: BTreeSet<NodeId>,
    last_request: Option<Nanos>,
    decided: bool,
}

#[derive(Clone, Debug)]
enum Deferred {
    PrepareAck { to: NodeId, pid: u64, ts: Nanos },
    Campaign { pid: u64 },
}

/// One replica of a log group. See the module docs.
#[derive(Debug)]
pub struct Replica {
    cfg: ReplicaConfig,
    policy: Box<dyn Policy>,
    now: Nanos,
    rng: Rng,
    role: Role,
    /// Durable meta.
    meta: MetaRecord,
    /// Meta as it should be (`meta` once saved).
    meta_want: MetaRecord,
    meta_seq: u64,
    meta_inflight: Option<u64>,
    saved_snapshot: Option<MetaRecord>,
    deferred: Vec<Deferred>,
    log: LogView,
    leader: Option<NodeId>,
    leader_pid: u64,
    matched_end: Lsn,
    leader_committed: Lsn,
    lease_until: Nanos,
    /// Whom `lease_until` protects: the leader heard, or the candidate granted.
    lease_holder: Option<NodeId>,
    last_leader_ts: Nanos,
    peers: BTreeMap<NodeId, PeerInfo>,
    max_seen_pid: u64,
    backoff_until: Nanos,
    last_ping: Nanos,
    campaign: Option<Campaign>,
    leading: Option<Leading>,
    pending: VecDeque<PendingGroup>,
    next_ticket: u64,
    last_csn: Csn,
    early: BTreeMap<Lsn, (NodeId, Message)>,
    /// The log end at which this follower last asked for a gap to be resent
    /// ([`ReplicaConfig::gap_resend_after`]), and how many early appends it held then:
    /// it asks again for the same gap only after as many more (the resent copy was
    /// overtaken too).
    gap_asked_at: Option<(Lsn, usize)>,
    /// A config from the leader followed whose barrier our log had not reached durably
    /// when it came: taken once the flush reaches it, so that a new leader's config is
    /// accepted one meta sync after its StartWorking group, not a heartbeat later.
    pending_config: Option<Membership>,
    /// Gap resends asked for since this replica started.
    gap_asks: u64,
    /// Rebases sent to followers and candidates behind our log start.
    rebases_sent: u64,
    /// Times our own log was started again at a peer's log start.
    rebased: u64,
    /// Timed resends ([`ReplicaConfig::timed_resend`]) since this replica started.
    timed_resends: u64,
    halted: Option<String>,
    storage_failed: bool,
    repairing: Option<RepairState>,
    /// The tail reserved for lock-free appends, if any (see [`Lane`]).
    lane: Option<Lane>,
    drops: BTreeMap<&'static str, u64>,
    actions: Vec<Action>,
}

fn majority(n: usize) -> usize {
    n / 2 + 1
}

impl Replica {
    /// Builds a replica from its durable meta and its recovered log at time `now`.
    ///
    /// Follower recovery (piggyback paper section 5.2): the log below `log.committed` is
    /// known committed; the rest is undecided until a leader confirms or overrides it.
    pub fn new(cfg: ReplicaConfig, meta: MetaRecord, log: RecoveredLog, now: Nanos) -> Self {
        Self::with_policy(cfg, Box::new(Ordered), meta, log, now)
    }

    /// As [`Replica::new`] with an explicit commit/merge policy.
    pub fn with_policy(
        cfg: ReplicaConfig,
        policy: Box<dyn Policy>,
        meta: MetaRecord,
        log: RecoveredLog,
        now: Nanos,
    ) -> Self {
        let log = LogView::new(log, cfg.cache_bytes);
        let last_csn = log.chain.max_csn;
        let max_seen_pid = meta.vote.promised_proposal_id;
        let rng = Rng::new(cfg.seed ^ cfg.id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ now);
        let committed = log.committed;
        let mut r = Self {
            policy,
            now,
            rng,
            role: Role::Follower,
            meta_want: meta.clone(),
            meta,
            meta_seq: 0,
            meta_inflight: None,
            saved_snapshot: None,
            deferred: Vec::new(),
            log,
            leader: None,
            leader_pid: 0,
            matched_end: committed,
            leader_committed: committed,
            // A restarted replica may have granted a lease before it crashed; honour it.
            lease_until: now + cfg.lease,
            lease_holder: None,
            last_leader_ts: 0,
            peers: BTreeMap::new(),
            max_seen_pid,
            backoff_until: 0,
            last_ping: 0,
            campaign: None,
            leading: None,
            pending: VecDeque::new(),
            next_ticket: 1,
            last_csn,
            early: BTreeMap::new(),
            gap_asked_at: None,
            pending_config: None,
            gap_asks: 0,
            rebases_sent: 0,
            rebased: 0,
            timed_resends: 0,
            halted: None,
            storage_failed: false,
            repairing: None,
            lane: None,
            drops: BTreeMap::new(),
            actions: Vec::new(),
            cfg,
        };
        r.actions.push(Action::Commit { end: committed });
        r
    }

    /// A replica whose log has the damaged range `from..to` before its tail (storage
    /// reported checksum failures there with valid groups after them). Protocol-aware
    /// recovery (Alagappan et al., FAST 2018): it does not truncate and it does not vote
    /// or acknowledge; it asks its peers for a copy of the range, hands the first one to
    /// the driver ([`Action::Repair`]), and the driver restarts it from the repaired
    /// storage. If every other voter reports that it has no copy, it halts.
    pub fn repairing(cfg: ReplicaConfig, meta: MetaRecord, from: Lsn, to: Lsn, now: Nanos) -> Self {
        let mut r = Self::new(cfg, meta, RecoveredLog::default(), now);
        r.actions.clear();
        r.repairing = Some(RepairState {
            from,
            to,
            no_copy: BTreeSet::new(),
            damaged: BTreeSet::new(),
            last_request: None,
            decided: false,
        });
        r
    }

    /// The damaged range being repaired, if any.
    pub fn repairing_range(&self) -> Option<(Lsn, Lsn)> {
        self.repairing.as_ref().map(|r| (r.from, r.to))
    }

    // ---------------------------------------------------------------- accessors

    /// This replica's id.
    pub fn id(&self) -> NodeId {
        self.cfg.id
    }

    /// Current role.
    pub fn role(&self) -> Role {
        self.role
    }

    /// The leader this replica follows (itself when leading).
    pub fn leader(&self) -> Option<NodeId> {
        match self.role {
            Role::Leader | Role::Candidate => Some(self.cfg.id),
            _ => self.leader,
        }
    }

    /// The proposal id this replica acts under (leading) or follows.
    pub fn proposal_id(&self) -> u64 {
        if let Some(l) = &self.leading {
            return l.pid;
        }
        self.leader_pid
    }

    /// The highest proposal id promised (durable or about to be).
    pub fn promised(&self) -> u64 {
        self.meta_want.vote.promised_proposal_id
    }

    /// The committed end LSN known here.
    pub fn committed_end(&self) -> Lsn {
        self.log.committed
    }

    /// The log end (written, maybe not flushed).
    pub fn end_lsn(&self) -> Lsn {
        self.log.end()
    }

    /// The checksum chain at the end of the log (written, not necessarily flushed).
    pub fn log_chain(&self) -> ChainPoint {
        self.log.chain
    }

    /// The first LSN still in storage (everything below was trimmed).
    pub fn log_start(&self) -> Lsn {
        self.log.start
    }

    /// The flushed end reported by storage.
    pub fn flushed_end(&self) -> Lsn {
        self.log.flushed
    }

    /// The membership this replica acts on (latest received).
    pub fn membership(&self) -> &Membership {
        &self.meta_want.membership
    }

    /// The durable meta record.
    pub fn durable_meta(&self) -> &MetaRecord {
        &self.meta
    }

    /// The halt reason, if halted.
    pub fn halted(&self) -> Option<&str> {
        self.halted.as_deref()
    }

    /// Appends still waiting for a result.
    pub fn pending_appends(&self) -> usize {
        self.pending.iter().map(|g| g.records.len()).sum::<usize>()
            + self
                .leading
                .as_ref()
                .and_then(|l| l.open.as_ref())
                .map_or(0, |o| o.records.len())
    }

    /// [`Message::Rebase`]s this replica sent to followers or candidates whose logs ended
    /// below its log start, since it started.
    pub fn rebases_sent(&self) -> u64 {
        self.rebases_sent
    }

    /// Times this replica's log was started again, empty, at a peer's log start because it
    /// had fallen behind it ([`Message::Rebase`]).
    pub fn rebased(&self) -> u64 {
        self.rebased
    }

    /// Times this follower asked its leader to resend past a gap at once
    /// ([`ReplicaConfig::gap_resend_after`]) since it started.
    pub fn gap_resend_requests(&self) -> u64 {
        self.gap_asks
    }

    /// Times this leader sent a follower its unacknowledged bytes again because they
    /// were late ([`ReplicaConfig::timed_resend`]) since it started.
    pub fn timed_resends(&self) -> u64 {
        self.timed_resends
    }

    /// Leader: the earliest time a timed resend ([`ReplicaConfig::timed_resend`]) is due,
    /// if one is; a driver that ticks coarsely should also tick then (a tick resends what
    /// is due). `None` when off, not leading, or nothing is in flight.
    pub fn resend_due(&self) -> Option<Nanos> {
        let l = self.leading.as_ref()?;
        if !self.live() {
            return None;
        }
        let end = self.log.end();
        l.progress
            .values()
            .filter_map(|p| p.timed_due(self.cfg.timed_resend, end))
            .min()
    }

    /// Counts of dropped inputs by reason.
    pub fn drops(&self) -> &BTreeMap<&'static str, u64> {
        &self.drops
    }

    /// The commit/merge policy.
    pub fn policy(&self) -> &dyn Policy {
        self.policy.as_ref()
    }

    /// Each follower's matched end as the leader sees it (empty when not leading).
    pub fn follower_progress(&self) -> Vec<(NodeId, Lsn)> {
        self.leading.as_ref().map_or_else(Vec::new, |l| {
            l.progress.iter().map(|(n, p)| (*n, p.matched)).collect()
        })
    }

    /// Whether actions are waiting to be taken (a driver wakes its worker only then).
    pub fn has_actions(&self) -> bool {
        !self.actions.is_empty()
    }

    /// Takes the actions produced so far, in order.
    pub fn take_actions(&mut self) -> Vec<Action> {
        std::mem::take(&mut self.actions)
    }

    fn prio(&self) -> Priority {
        Priority {
            config_version: self.meta_want.membership.version,
            priority: self.cfg.priority,
            id: self.cfg.id,
        }
    }

    fn is_voter(&self, id: NodeId) -> bool {
        self.meta_want.membership.voters.contains(&id)
    }

    fn members(&self) -> BTreeSet<NodeId> {
        let m = &self.meta_want.membership;
        let mut s: BTreeSet<NodeId> = m.voters.iter().chain(m.learners.iter()).copied().collect();
        if let Some(l) = &self.leading {
            if let Some(p) = &l.prev_config {
                s.extend(p.voters.iter().chain(p.learners.iter()));
            }
        }
        s.remove(&self.cfg.id);
        s
    }

    fn drop_input(&mut self, from: Option<NodeId>, reason: &'static str) {
        *self.drops.entry(reason).or_default() += 1;
        self.actions.push(Action::Dropped { from, reason });
    }

    fn send(&mut self, to: NodeId, msg: Message) {
        self.actions.push(Action::Send { to, msg });
    }

    fn set_role(&mut self, role: Role) {
        if self.role != role {
            self.role = role;
            let pid = self
                .proposal_id()
                .max(self.campaign.as_ref().map_or(0, |c| c.pid));
            let leader = self.leader();
            self.actions.push(Action::Role { role, pid, leader });
        }
    }

    fn halt(&mut self, reason: String) {
        if self.halted.is_none() {
            self.halted = Some(reason.clone());
            self.actions.push(Action::Halt { reason });
        }
    }

    fn live(&self) -> bool {
        self.halted.is_none() && !self.storage_failed
    }

    // ---------------------------------------------------------------- meta

    fn save_meta(&mut self) {
        if self.meta_inflight.is_none() && self.meta_want != self.meta {
            self.meta_seq += 1;
            self.meta_inflight = Some(self.meta_seq);
            self.saved_snapshot = Some(self.meta_want.clone());
            self.actions.push(Action::SaveMeta {
                seq: self.meta_seq,
                record: self.meta_want.clone(),
            });
        }
    }

    /// The meta record of save `seq` is durable.
    pub fn meta_saved(&mut self, now: Nanos, seq: u64) {
        self.abandon_lane();
        self.now = self.now.max(now);
        if self.meta_inflight != Some(seq) {
            self.drop_input(None, "meta_saved for an unknown save");
            return;
        }
        self.meta_inflight = None;
        // What was saved is the record as of the save action; meta_want may have moved on,
        // but every field only moves forward, so the older record is a safe lower bound.
        let saved = self
            .saved_snapshot
            .take()
            .unwrap_or_else(|| self.meta_want.clone());
        self.meta = saved;
        let deferred = std::mem::take(&mut self.deferred);
        for d in deferred {
            match d {
                Deferred::PrepareAck { to, pid, ts } => {
                    if self.meta.vote.promised_proposal_id >= pid {
                        if self.meta.vote.promised_proposal_id == pid {
                            self.send_prepare_ack(to, pid, true, ts);
                        }
                    } else {
                        self.deferred.push(Deferred::PrepareAck { to, pid, ts });
                    }
                }
                Deferred::Campaign { pid } => {
                    if self.meta.vote.promised_proposal_id >= pid {
                        self.begin_prepare(pid);
                    } else {
                        self.deferred.push(Deferred::Campaign { pid });
                    }
                }
            }
        }
        // A follower whose promise just became durable may now acknowledge.
        if self.leading.is_none() && self.leader.is_some() {
            self.send_ack(true, 0);
        }
        self.try_commit();
        self.save_meta();
    }

    // ---------------------------------------------------------------- inputs

    /// The user-set priority changed (takes effect in the next ping).
    pub fn set_priority(&mut self, priority: u32) {
        self.abandon_lane();
        self.cfg.priority = priority;
    }

    /// Storage failed (for example a failed `fdatasync`): stop acknowledging and voting.
    /// The driver must reopen the replica from what is on disk (DESIGN.md principle 4).
    pub fn storage_failed(&mut self, now: Nanos) {
        self.abandon_lane();
        self.now = self.now.max(now);
        self.storage_failed = true;
        self.step_down();
    }

    /// Advances time: pings, elections, leases, heartbeats, freezing, resends.
    pub fn tick(&mut self, now: Nanos) {
        self.abandon_lane();
        self.now = self.now.max(now);
        if !self.live() {
            return;
        }
        let now = self.now;
        if let Some(rep) = &mut self.repairing {
            if rep
                .last_request
                .is_none_or(|t| now >= t + self.cfg.resend_interval)
            {
                rep.last_request = Some(now);
                let msg = Message::RepairRequest {
                    from: rep.from,
                    to: rep.to,
                };
                for m in self.members() {
                    self.send(m, msg.clone());
                }
            }
            return;
        }
        if now >= self.last_ping + self.cfg.ping_interval {
            self.last_ping = now;
            let msg = Message::Ping {
                prio: self.prio(),
                max_pid: self.max_seen_pid.max(self.promised()),
                leader: self.leader(),
                voter: self.is_voter(self.cfg.id),
            };
            for m in self.members() {
                self.send(m, msg.clone());
            }
        }
        if let Some(c) = &self.campaign {
            // Collecting promises should take a few round trips; learning and confirming the
            // log may take longer (catch-up).
            let limit = match c.phase {
                CampaignPhase::Promising | CampaignPhase::Preparing => self.cfg.lease / 2,
                _ => 2 * self.cfg.lease,
            };
            if now > c.started + limit {
                self.abandon_campaign();
                return;
            }
        }
        if self.leading.is_some() {
            self.leader_tick();
        } else if self.campaign.is_none() {
            self.maybe_campaign(false);
        }
    }

    /// Handles a message from `from`.
    pub fn receive(&mut self, now: Nanos, from: NodeId, msg: Message) {
        self.abandon_lane();
        self.now = self.now.max(now);
        if !self.live() {
            // A halted replica under repair still tells others its copy is damaged, so
            // they can decide too.
            if let (Message::RepairRequest { from: f, to }, Some(_)) = (&msg, &self.repairing) {
                let (f, to) = (*f, *to);
                self.send_damaged(from, f, to);
                return;
            }
            self.drop_input(Some(from), "replica not live");
            return;
        }
        if from == self.cfg.id {
            self.drop_input(Some(from), "message from self");
            return;
        }
        let member = self.members().contains(&from);
        let info = self.peers.entry(from).or_default();
        info.last_heard = Some(self.now);
        if self.repairing.is_some() {
            self.receive_while_repairing(from, msg);
            return;
        }
        match msg {
            Message::RepairRequest { from: f, to } => self.on_repair_request(from, f, to),
            Message::RepairResp { .. } => {
                self.drop_input(Some(from), "repair response while not repairing");
            }
            Message::Ping {
                prio,
                max_pid,
                voter,
                ..
            } => {
                if !member {
                    // A sender with a newer membership may count on us (we may have been
                    // added while away): answer so it knows we are alive and can campaign
                    // and replicate to us.
                    if prio.config_version > self.meta_want.membership.version && prio.id == from {
                        let msg = Message::Ping {
                            prio: self.prio(),
                            max_pid: self.max_seen_pid.max(self.promised()),
                            leader: self.leader(),
                            voter: self.is_voter(self.cfg.id),
                        };
                        self.send(from, msg);
                        return;
                    }
                    self.drop_input(Some(from), "ping from a non-member");
                    return;
                }
                if prio.id != from {
                    self.drop_input(Some(from), "ping with a forged id");
                    return;
                }
                self.peers.entry(from).or_default().prio = voter.then_some(prio);
                self.max_seen_pid = self.max_seen_pid.max(max_pid);
            }
            Message::Prepare {
                pid,
                prio,
                transfer,
                ts,
            } => self.on_prepare(from, pid, prio, transfer, ts),
            Message::PrepareAck {
                pid,
                granted,
                promised,
                end,
                last_pid,
                committed: _,
                ts,
            } => self.on_prepare_ack(from, pid, granted, promised, end, last_pid, ts),
            Message::Fetch {
                pid,
                from: pos,
                max_bytes,
            } => self.on_fetch(from, pid, pos, max_bytes),
            Message::FetchResp {
                pid,
                prev,
                groups,
                end: _,
            } => self.on_fetch_resp(from, pid, prev, groups),
            m @ Message::Append { .. } => self.on_append(from, m),
            Message::AppendAck {
                pid,
                ts,
                success,
                matched,
                hint,
                committed,
                config_version,
            } => self.on_append_ack(
                from,
                pid,
                ts,
                success,
                matched,
                hint,
                committed,
                config_version,
            ),
            Message::Rebase {
                pid,
                ts,
                base,
                base_pid,
                committed,
            } => self.on_rebase(from, pid, ts, base, base_pid, committed),
            Message::TimeoutNow { pid } => {
                if self.leader == Some(from)
                    && pid == self.leader_pid
                    && self.leading.is_none()
                    && self.is_voter(self.cfg.id)
                {
                    self.start_campaign(true);
                } else {
                    self.drop_input(Some(from), "timeout_now from a non-leader");
                }
            }
        }
    }

    /// Storage reports everything below `lsn` durable.
    pub fn log_flushed(&mut self, now: Nanos, lsn: Lsn) {
        self.abandon_lane();
        self.now = self.now.max(now);
        if !self.live() {
            return;
        }
        self.log.flushed = lsn.min(self.log.end());
        if self.leading.is_some() {
            self.try_commit();
            // Adaptive group replication (PALF section 6): the IO worker is idle, so a
            // small open group goes out now instead of waiting for the freeze interval.
            if self.log.flushed == self.log.end() {
                self.freeze();
            }
        } else {
            if let Some(m) = self.pending_config.take() {
                self.consider_config(m);
            }
            self.send_ack(true, 0);
        }
    }

    /// Storage deleted the log below `start` (the database trimmed it after its own
    /// checkpoint; `start` is the first LSN storage still holds, a group boundary at or
    /// below the committed end). A follower that needs anything below it is rebased there
    /// ([`Message::Rebase`]).
    pub fn log_trimmed(&mut self, now: Nanos, start: Lsn) {
        self.abandon_lane();
        self.now = self.now.max(now);
        self.log.start = self.log.start.max(start.min(self.log.committed));
    }

    /// A storage read requested by [`Action::ReadLog`] finished: `Ok((chain at from,
    /// whole groups))` or an error message.
    pub fn log_read(
        &mut self,
        now: Nanos,
        purpose: ReadPurpose,
        from: Lsn,
        result: Result<(ChainPoint, Vec<u8>), String>,
    ) {
        self.abandon_lane();
        self.now = self.now.max(now);
        if !self.live() {
            return;
        }
        if let ReadPurpose::Repair { peer, to } = purpose {
            // Only an exact copy of the range is of use; storage verifies it again.
            let (bytes, have) = match result {
                Ok((_, b)) if b.len() as u64 == to - from => (b, true),
                _ => (Vec::new(), false),
            };
            self.send(
                peer,
                Message::RepairResp {
                    from,
                    to,
                    bytes,
                    have,
                    damaged: false,
                },
            );
            return;
        }
        let (chain, bytes) = match result {
            Ok(r) => r,
            Err(_) => {
                if let (ReadPurpose::CatchUp { peer }, Some(l)) = (purpose, &mut self.leading) {
                    if let Some(p) = l.progress.get_mut(&peer) {
                        p.read_pending = false;
                    }
                }
                self.drop_input(None, "storage read failed");
                return;
            }
        };
        let prev = LogPos {
            lsn: from,
            acc: chain.acc_crc,
        };
        match purpose {
            ReadPurpose::CatchUp { peer } => {
                let Some(l) = &mut self.leading else { return };
                let Some(p) = l.progress.get_mut(&peer) else {
                    return;
                };
                p.read_pending = false;
                let rebase = p.next < from && from == self.log.start;
                if p.next != from && !rebase {
                    return;
                }
                let bytes = cut_groups(&bytes, self.log.end(), self.cfg.max_message_bytes);
                p.sent_upto(from + bytes.len() as u64, self.now);
                // The follower needs groups below our start, which storage no longer
                // holds: it starts again at our start, then takes the groups after it.
                let (pid, ts) = (l.pid, self.now);
                if rebase && !self.send_rebase(peer, pid, ts, chain, from) {
                    return;
                }
                let msg = self.append_msg(peer, prev, bytes);
                self.send(peer, msg);
            }
            ReadPurpose::Repair { .. } => {}
            ReadPurpose::Fetch {
                peer,
                pid,
                max_bytes,
                rebase,
            } => {
                if self.meta.vote.promised_proposal_id != pid {
                    return;
                }
                if rebase && !self.send_rebase(peer, pid, 0, chain, from) {
                    return;
                }
                let groups = cut_groups(&bytes, self.log.flushed, max_bytes as usize);
                let end = self.log.flushed;
                self.send(
                    peer,
                    Message::FetchResp {
                        pid,
                        prev,
                        groups,
                        end,
                    },
                );
            }
        }
    }

    /// Sends `peer` a [`Message::Rebase`] at `from`, this replica's log start, whose
    /// chain point storage read as `chain`. Refused (false, the input dropped) when the
    /// start is above the committed end: a replica is only ever rebased onto a committed
    /// prefix, so the receiver may take everything below it as decided.
    fn send_rebase(
        &mut self,
        peer: NodeId,
        pid: u64,
        ts: Nanos,
        chain: ChainPoint,
        from: Lsn,
    ) -> bool {
        if from > self.log.committed {
            self.drop_input(Some(peer), "log start above the committed end");
            return false;
        }
        let msg = Message::Rebase {
            pid,
            ts,
            base: chain,
            base_pid: self.log.pid_ending_at(from),
            committed: self.log.committed,
        };
        self.rebases_sent += 1;
        self.send(peer, msg);
        true
    }

    /// Appends a record with reference CSN `ref_csn` (PALF section 4.2: the record's CSN is
    /// at least `ref_csn` and grows with the LSN). Only the serving leader accepts.
    pub fn append(&mut self, now: Nanos, data: &[u8], ref_csn: Csn) -> Result<Ticket, AppendError> {
        self.abandon_lane();
        self.now = self.now.max(now);
        if self.halted.is_some() {
            return Err(AppendError::Halted("halted"));
        }
        let max_record = (self.cfg.max_group_bytes - GROUP_HEADER_SIZE - entry::ENTRY_HEADER_SIZE)
            .min(entry::MAX_RECORD_BYTES as usize)
            .min(self.cfg.block_size as usize - GROUP_HEADER_SIZE - entry::ENTRY_HEADER_SIZE);
        self.check_serving()?;
        self.check_mode(AccessMode::Append)?;
        let l = self.leading.as_ref().expect("a serving leader");
        if data.len() > max_record {
            return Err(AppendError::TooLarge {
                len: data.len(),
                max: max_record,
            });
        }
        let open_len = l.open.as_ref().map_or(0, |o| o.buf.len() as u64);
        if self.log.end() + open_len - self.log.committed > self.cfg.window_bytes {
            return Err(AppendError::WindowFull);
        }
        let esz = entry::entry_size(data.len());
        let bs = self.cfg.block_size;
        let max_group = self.cfg.max_group_bytes;
        if let Some(o) = &l.open {
            let len = o.buf.len() + esz;
            if len > max_group || !fits_in_block(o.lsn, len as u64, bs) {
                self.freeze();
            }
        }
        if self.leading.as_ref().is_some_and(|l| l.open.is_none()) {
            if !fits_in_block(self.log.end(), (GROUP_HEADER_SIZE + esz) as u64, bs) {
                self.write_padding();
            }
            let lsn = self.log.end();
            let now = self.now;
            self.leading.as_mut().expect("leading").open = Some(OpenGroup {
                lsn,
                buf: vec![0u8; GROUP_HEADER_SIZE],
                entries: 0,
                max_csn: 0,
                records: Vec::new(),
                opened: now,
            });
        }
        let csn = (self.last_csn + 1).max(ref_csn);
        self.last_csn = csn;
        let id = self.next_ticket;
        self.next_ticket += 1;
        let io_idle = self.log.flushed == self.log.end();
        let threshold = self.cfg.group_factor_threshold;
        let o = self
            .leading
            .as_mut()
            .and_then(|l| l.open.as_mut())
            .expect("open group");
        let lsn = o.lsn + o.buf.len() as u64;
        entry::encode_entry(&mut o.buf, csn, data);
        o.entries += 1;
        o.max_csn = csn;
        o.records.push((id, lsn, csn));
        if io_idle && o.entries < threshold {
            self.freeze();
        }
        Ok(Ticket { id, lsn, csn })
    }

    /// Opens a [`Lane`]: reserves the log tail for one group of lock-free appends. Refused
    /// like [`Replica::append`] (not the serving leader, transferring, window full,
    /// halted). Any open group of slow-path appends is frozen first; a block tail too
    /// small for a useful group is padded.
    pub fn open_lane(&mut self, now: Nanos) -> Result<Lane, AppendError> {
        self.now = self.now.max(now);
        if let Some(l) = self.lane {
            return Ok(l);
        }
        if self.halted.is_some() {
            return Err(AppendError::Halted("halted"));
        }
        self.check_serving()?;
        self.check_mode(AccessMode::Append)?;
        self.freeze();
        if let Some(l) = &mut self.leading {
            if l.open.as_ref().is_some_and(|o| o.entries == 0) {
                l.open = None;
            }
        }
        let bs = self.cfg.block_size;
        let want = self.cfg.max_group_bytes.min(64 << 10) as u64;
        if block_remaining(self.log.end(), bs) < 2 * GROUP_HEADER_SIZE as u64 + want {
            self.write_padding();
        }
        let end = self.log.end();
        let inflight = end - self.log.committed;
        let window_left = self.cfg.window_bytes.saturating_sub(inflight) as usize;
        // A group never straddles a block: its length plus a header's worth must fit
        // (fits_in_block), so the body gets what is left after two headers.
        let rem = block_remaining(end, bs) as usize;
        let group = self
            .cfg
            .max_group_bytes
            .min(rem - GROUP_HEADER_SIZE)
            .min(window_left);
        if group < GROUP_HEADER_SIZE + entry::entry_size(1) {
            return Err(AppendError::WindowFull);
        }
        let capacity = group - GROUP_HEADER_SIZE;
        let max_record =
            (capacity - entry::ENTRY_HEADER_SIZE).min(entry::MAX_RECORD_BYTES as usize);
        let lane = Lane {
            lsn: end,
            pid: self.leading.as_ref().expect("leading").pid,
            capacity,
            max_record,
            last_csn: self.last_csn,
            opened: self.now,
        };
        self.lane = Some(lane);
        Ok(lane)
    }

    /// Closes the open lane with the entries appended into it: `body` holds `records`
    /// entries back to back (`(lsn, csn)` of each, in order). On success they become one
    /// group, sealed and replicated like any other, and the result is the ticket id of the
    /// first record (the others follow consecutively); their results arrive as
    /// [`Action::Result`]. If the lane was abandoned, or leadership changed since it
    /// opened, nothing is written and the records have failed.
    pub fn close_lane(
        &mut self,
        now: Nanos,
        lane: &Lane,
        body: Vec<u8>,
        records: &[(Lsn, Csn)],
    ) -> Result<u64, AppendError> {
        self.now = self.now.max(now);
        let open = self.lane.take();
        if open != Some(*lane) {
            return Err(AppendError::NotLeader { leader: None });
        }
        let valid = self.halted.is_none()
            && !self.storage_failed
            && self.log.end() == lane.lsn
            && self
                .leading
                .as_ref()
                .is_some_and(|l| l.pid == lane.pid && l.serving && l.open.is_none());
        if !valid {
            return Err(AppendError::NotLeader {
                leader: self.leader,
            });
        }
        let first = self.next_ticket;
        if records.is_empty() {
            return Ok(first);
        }
        // The runtime built the body; check it is exactly what it says before it becomes
        // part of the log (a bug here must not become a bad group).
        let mut prev_csn = lane.last_csn;
        let mut n = 0usize;
        let mut ok = body.len() <= lane.capacity;
        for e in entry::EntryIter::new(&body) {
            let Ok(e) = e else {
                ok = false;
                break;
            };
            let lsn = lane.lsn + GROUP_HEADER_SIZE as u64 + e.offset as u64;
            if records.get(n) != Some(&(lsn, e.csn)) || e.csn <= prev_csn {
                ok = false;
                break;
            }
            prev_csn = e.csn;
            n += 1;
        }
        if !ok || n != records.len() {
            self.drop_input(None, "lane body does not match its records");
            return Err(AppendError::Halted("lane body does not match its records"));
        }
        let mut buf = Vec::with_capacity(GROUP_HEADER_SIZE + body.len());
        buf.resize(GROUP_HEADER_SIZE, 0);
        buf.extend_from_slice(&body);
        let ids: Vec<(u64, Lsn, Csn)> = records
            .iter()
            .enumerate()
            .map(|(i, (lsn, csn))| (first + i as u64, *lsn, *csn))
            .collect();
        self.next_ticket += records.len() as u64;
        self.last_csn = self.last_csn.max(prev_csn);
        self.leading.as_mut().expect("leading").open = Some(OpenGroup {
            lsn: lane.lsn,
            buf,
            entries: records.len() as u32,
            max_csn: prev_csn,
            records: ids,
            opened: lane.opened,
        });
        self.freeze();
        Ok(first)
    }

    /// Appends are accepted only by the serving leader, outside a leader transfer.
    fn check_serving(&self) -> Result<(), AppendError> {
        let Some(l) = &self.leading else {
            return Err(AppendError::NotLeader {
                leader: self.leader,
            });
        };
        if !l.serving || self.storage_failed {
            return Err(AppendError::NotLeader { leader: None });
        }
        if l.transfer.is_some() {
            return Err(AppendError::Transferring);
        }
        Ok(())
    }

    /// Writes of the `want` access mode are taken only while it is the mode in force: the
    /// mode of the leader's config, accepted by a majority. A new leader takes none until
    /// its re-stamped config is accepted (PALF's StartWorking is a config entry for the
    /// same reason): a minority may hold a switch no majority accepted, and had the leader
    /// written under its own mode meanwhile, such a replica could later lead with the
    /// other mode over a log it wrote. Until then it answers like a leader not yet
    /// serving.
    fn check_mode(&self, want: AccessMode) -> Result<(), AppendError> {
        let mode = self.meta_want.membership.access_mode;
        let l = self.leading.as_ref().expect("a serving leader");
        let Some(committed) = l.committed_mode else {
            return Err(AppendError::NotLeader {
                leader: Some(self.cfg.id),
            });
        };
        if mode == want && committed == mode {
            return Ok(());
        }
        Err(AppendError::AccessMode {
            mode,
            switching: committed != mode,
        })
    }

    /// Whether this replica is the serving leader and takes the writes of its config's
    /// access mode (its config is accepted by a majority).
    pub fn takes_writes(&self) -> bool {
        self.leading.as_ref().is_some_and(|l| {
            l.serving
                && !self.storage_failed
                && l.committed_mode == Some(self.meta_want.membership.access_mode)
        })
    }

    /// The access mode of this replica's config (the mode in force once the config is
    /// accepted by a majority).
    pub fn access_mode(&self) -> AccessMode {
        self.meta_want.membership.access_mode
    }

    /// Mirrors one group another log committed (PALF section 5.2, `mirror`): `group` is
    /// the whole group as that log stores it, header included, and must start at this
    /// log's end. Taken only by the serving leader of a group in [`AccessMode::RawWrite`].
    ///
    /// The group keeps its LSN, length, entries, CSNs and sequence number; the leader
    /// re-seals it under its own proposal id and committed end with [`FLAG_MIRRORED`]
    /// and replicates it like any group. The ticket's id gets one [`Action::Result`] (its
    /// `lsn` the group's, its `csn` the group's last); [`Outcome::Failed`] means this
    /// copy did not commit — a later leader may hold the same group re-sealed, so a
    /// mirroring process resumes from the group's committed end, not from the result.
    pub fn mirror(&mut self, now: Nanos, group: &[u8]) -> Result<Ticket, MirrorError> {
        self.abandon_lane();
        self.now = self.now.max(now);
        if self.halted.is_some() {
            return Err(MirrorError::Halted("halted"));
        }
        self.check_serving()?;
        self.check_mode(AccessMode::RawWrite)?;
        let invalid = |s: String| Err(MirrorError::Invalid(s));
        let (h, body) = match decode_group(group) {
            Ok(g) => g,
            Err(e) => return invalid(e.to_string()),
        };
        if group.len() as u64 != h.total_len() {
            return invalid(format!(
                "{} bytes after the group at LSN {}: mirror one group at a time",
                group.len() as u64 - h.total_len(),
                h.lsn
            ));
        }
        let chain = self.log.chain;
        if h.lsn != chain.end_lsn {
            return Err(MirrorError::Lsn {
                expected: chain.end_lsn,
                found: h.lsn,
            });
        }
        if h.group_seq != chain.next_group_seq {
            return invalid(format!(
                "group {} at LSN {}, but this log's next group is {}: the logs differ",
                h.group_seq, h.lsn, chain.next_group_seq
            ));
        }
        let bs = self.cfg.block_size;
        let total = h.total_len();
        if h.is_padding() {
            if total != block_remaining(h.lsn, bs) {
                return invalid(format!(
                    "padding of {total} bytes at LSN {}, where this log's block has {} \
                     left: the logs' block sizes differ",
                    h.lsn,
                    block_remaining(h.lsn, bs)
                ));
            }
        } else if !fits_in_block(h.lsn, total, bs) {
            return invalid(format!(
                "a group of {total} bytes at LSN {} does not fit this log's block of {bs} \
                 bytes: the logs' block sizes differ",
                h.lsn
            ));
        }
        if !h.is_padding() && total as usize > self.cfg.max_group_bytes {
            return invalid(format!(
                "a group of {total} bytes exceeds this group's limit of {}",
                self.cfg.max_group_bytes
            ));
        }
        let first_csn = entry::EntryIter::new(body)
            .next()
            .and_then(|e| e.ok())
            .map(|e| e.csn);
        let csn_ok = match first_csn {
            Some(csn) => csn > chain.max_csn,
            None => h.max_csn == chain.max_csn,
        };
        if !csn_ok {
            return invalid(format!(
                "the group at LSN {} does not continue this log's CSNs (last {})",
                h.lsn, chain.max_csn
            ));
        }
        // The log a new leader inherited commits only with the first group it mirrors, so
        // that group is taken even when the inherited log fills the window.
        let first = self
            .leading
            .as_ref()
            .is_some_and(|l| l.start_working_end > self.log.end());
        if !first && self.log.end() + total - self.log.committed > self.cfg.window_bytes {
            return Err(MirrorError::WindowFull);
        }
        self.freeze();
        let pid = self.leading.as_ref().expect("a serving leader").pid;
        let committed = self.published().min(chain.end_lsn);
        let (nh, buf) = if h.is_padding() {
            let mut buf = Vec::new();
            let nh = encode_padding(&mut buf, &chain, pid, committed, total);
            (nh, buf)
        } else {
            let mut buf = group.to_vec();
            let nh = seal_group(
                &mut buf,
                &chain,
                SealParams {
                    proposal_id: pid,
                    committed_end_lsn: committed,
                    flags: h.flags | FLAG_MIRRORED,
                },
                h.entry_count,
                h.max_csn,
            );
            (nh, buf)
        };
        let id = self.next_ticket;
        self.next_ticket += 1;
        let pg = PendingGroup {
            lsn: nh.lsn,
            pid,
            acc: nh.acc_crc,
            records: vec![(id, nh.lsn, nh.max_csn)],
        };
        let at = self.pending.partition_point(|g| g.lsn <= pg.lsn);
        self.pending.insert(at, pg);
        self.write_group(&nh, buf);
        self.broadcast(false);
        Ok(Ticket {
            id,
            lsn: nh.lsn,
            csn: nh.max_csn,
        })
    }

    /// Switches the group's access mode (PALF section 5.2: failover makes a mirror a
    /// primary, switchover a primary a mirror). The mode is part of the config, so the
    /// switch is a config change: refused like [`Replica::change_membership`] while
    /// another is under way, guarded by a log barrier at the current end, and in force
    /// once a majority accepts it ([`Action::ConfigCommitted`]); until then neither
    /// appends nor mirror writes are taken. Asking for the mode in force changes nothing
    /// and returns the current version.
    pub fn change_access_mode(
        &mut self,
        now: Nanos,
        mode: AccessMode,
    ) -> Result<ConfigVersion, ChangeError> {
        self.abandon_lane();
        self.now = self.now.max(now);
        let cur = self.meta_want.membership.clone();
        let Some(l) = &self.leading else {
            return Err(ChangeError::NotLeader);
        };
        if !l.serving || self.storage_failed {
            return Err(ChangeError::NotLeader);
        }
        if !l.config_committed || l.replace_then_remove.is_some() {
            return Err(ChangeError::InProgress);
        }
        if cur.access_mode == mode {
            return Ok(cur.version);
        }
        if mode == AccessMode::RawWrite {
            // A mirror's log continues another log from its barrier, so the barrier must
            // be committed: a log a crash could still cut short would leave the mirror
            // holding its own uncommitted groups past it, which no primary has.
            self.freeze();
            let (committed, end) = (self.log.committed, self.log.end());
            if committed < end {
                return Err(ChangeError::Uncommitted { committed, end });
            }
        }
        let mut new = cur;
        new.access_mode = mode;
        Ok(self.propose_config(new, None))
    }

    /// The open lane, if any.
    pub fn lane(&self) -> Option<&Lane> {
        self.lane.as_ref()
    }

    /// Any input other than the lane calls finds the lane closed; if the driver forgot,
    /// the lane is abandoned (its appends fail, never written).
    fn abandon_lane(&mut self) {
        if self.lane.take().is_some() {
            self.drop_input(None, "lane abandoned: input while a lane was open");
        }
    }

    /// Starts handing leadership to `to` (PALF leader transfer): appends are refused, the
    /// target is brought up to date and told to campaign at once.
    pub fn transfer_leader(&mut self, now: Nanos, to: NodeId) -> Result<(), ChangeError> {
        self.abandon_lane();
        self.now = self.now.max(now);
        let is_voter = self.is_voter(to);
        let lease = self.cfg.lease;
        let Some(l) = &mut self.leading else {
            return Err(ChangeError::NotLeader);
        };
        if !l.serving {
            return Err(ChangeError::NotLeader);
        }
        if to == self.cfg.id || !is_voter {
            return Err(ChangeError::Invalid(format!("{to} is not another voter")));
        }
        l.transfer = Some((to, self.now + lease));
        self.freeze();
        self.check_transfer();
        Ok(())
    }

    /// Proposes a single-member membership change (PALF section 5.3). The new membership
    /// carries the current log end as its barrier.
    pub fn change_membership(
        &mut self,
        now: Nanos,
        change: MembershipChange,
    ) -> Result<ConfigVersion, ChangeError> {
        self.abandon_lane();
        self.now = self.now.max(now);
        let me = self.cfg.id;
        let cur = self.meta_want.membership.clone();
        let committed = self.log.committed;
        let Some(l) = &mut self.leading else {
            return Err(ChangeError::NotLeader);
        };
        if !l.serving {
            return Err(ChangeError::NotLeader);
        }
        if !l.config_committed || l.replace_then_remove.is_some() {
            return Err(ChangeError::InProgress);
        }
        let mut new = cur.clone();
        let invalid = |s: String| Err(ChangeError::Invalid(s));
        let mut then_remove = None;
        match change {
            MembershipChange::AddLearner(n) | MembershipChange::AddVoter(n)
                if cur.voters.contains(&n) || cur.learners.contains(&n) =>
            {
                return invalid(format!("{n} is already a member"));
            }
            MembershipChange::AddLearner(n) => new.learners.push(n),
            MembershipChange::AddVoter(n) => new.voters.push(n),
            MembershipChange::Promote(n) => {
                if !cur.learners.contains(&n) {
                    return invalid(format!("{n} is not a learner"));
                }
                let caught_up = l.progress.get(&n).is_some_and(|p| p.matched >= committed);
                if !caught_up {
                    return invalid(format!("learner {n} has not caught up"));
                }
                new.learners.retain(|x| *x != n);
                new.voters.push(n);
            }
            MembershipChange::Remove(n) => {
                if n == me {
                    return invalid("the leader cannot remove itself; transfer first".into());
                }
                if !cur.voters.contains(&n) && !cur.learners.contains(&n) {
                    return invalid(format!("{n} is not a member"));
                }
                new.voters.retain(|x| *x != n);
                new.learners.retain(|x| *x != n);
                if new.voters.is_empty() {
                    return invalid("a membership needs a voter".into());
                }
            }
            MembershipChange::Replace { old, new: n } => {
                if old == me {
                    return invalid("the leader cannot replace itself; transfer first".into());
                }
                if !cur.voters.contains(&old) {
                    return invalid(format!("{old} is not a voter"));
                }
                if cur.voters.contains(&n) || cur.learners.contains(&n) {
                    return invalid(format!("{n} is already a member"));
                }
                new.voters.push(n);
                then_remove = Some(old);
            }
        }
        new.voters.sort_unstable();
        new.learners.sort_unstable();
        Ok(self.propose_config(new, then_remove))
    }

    /// The serving leader proposes `new` (the current config changed): the next version
    /// under its pid, a barrier at the log end, and then `then_remove` once accepted.
    fn propose_config(
        &mut self,
        mut new: Membership,
        then_remove: Option<NodeId>,
    ) -> ConfigVersion {
        let me = self.cfg.id;
        let cur = self.meta_want.membership.clone();
        let pid = self.leading.as_ref().expect("leading").pid;
        new.version = ConfigVersion {
            proposal_id: pid,
            seq: if cur.version.proposal_id == pid {
                cur.version.seq + 1
            } else {
                1
            },
        };
        self.freeze();
        let end = self.log.end();
        new.barrier_lsn = end;
        let now = self.now;
        let l = self.leading.as_mut().expect("leading");
        l.prev_config = Some(cur);
        l.config_committed = false;
        l.replace_then_remove = then_remove;
        for n in new.voters.iter().chain(new.learners.iter()) {
            if *n != me {
                l.progress.entry(*n).or_insert(Progress::new(end, now));
            }
        }
        let version = new.version;
        self.set_membership(new);
        self.save_meta();
        self.broadcast(true);
        version
    }

    /// Takes `m` as the wanted membership, counting an access-mode switch.
    fn set_membership(&mut self, m: Membership) {
        if m.access_mode != self.meta_want.membership.access_mode {
            self.meta_want.access_mode_version += 1;
        }
        self.meta_want.membership = m;
    }

    // ---------------------------------------------------------------- repair

    fn receive_while_repairing(&mut self, from: NodeId, msg: Message) {
        match msg {
            Message::RepairResp {
                from: f,
                to,
                bytes,
                have,
                damaged,
            } => {
                let Some(rep) = &mut self.repairing else {
                    return;
                };
                if (f, to) != (rep.from, rep.to) || rep.decided {
                    self.drop_input(Some(from), "repair response for another range");
                    return;
                }
                if have && !bytes.is_empty() {
                    self.actions.push(Action::Repair {
                        lsn: f,
                        bytes,
                        peer: from,
                    });
                    return;
                }
                if damaged {
                    rep.damaged.insert(from);
                } else {
                    rep.no_copy.insert(from);
                }
                self.decide_repair();
            }
            Message::Prepare { pid, ts, .. } => {
                // Not voting: our log cannot be vouched for until repaired.
                self.drop_input(Some(from), "prepare refused: log under repair");
                self.send_prepare_ack(from, pid, false, ts);
            }
            Message::RepairRequest { from: f, to } => self.send_damaged(from, f, to),
            Message::Ping { prio, voter, .. } if prio.id == from => {
                self.peers.entry(from).or_default().prio = voter.then_some(prio);
            }
            _ => self.drop_input(Some(from), "log under repair"),
        }
    }

    /// Tells `to` that our own copy of `from..end` is damaged.
    fn send_damaged(&mut self, to: NodeId, from: Lsn, end: Lsn) {
        let msg = Message::RepairResp {
            from,
            to: end,
            bytes: Vec::new(),
            have: false,
            damaged: true,
        };
        self.send(to, msg);
    }

    /// A copy handed out with [`Action::Repair`] was refused by storage (it is not the
    /// original): `peer` holds no copy of the range.
    pub fn repair_refused(&mut self, now: Nanos, peer: NodeId) {
        self.abandon_lane();
        self.now = self.now.max(now);
        if let Some(rep) = &mut self.repairing {
            rep.no_copy.insert(peer);
            self.decide_repair();
        }
    }

    /// A majority of voters cleanly lacking the range proves it was never committed (a
    /// commit needs a majority holding it); every other voter lacking it or damaged, with
    /// no such majority, means a committed range has no good copy left: halt.
    fn decide_repair(&mut self) {
        let me = self.cfg.id;
        let voters = self.meta_want.membership.voters.clone();
        let Some(rep) = &mut self.repairing else {
            return;
        };
        let clean = voters.iter().filter(|v| rep.no_copy.contains(v)).count();
        if clean >= majority(voters.len()) {
            rep.decided = true;
            let lsn = rep.from;
            self.actions.push(Action::DiscardDamaged { lsn });
            return;
        }
        let others: Vec<NodeId> = voters.into_iter().filter(|v| *v != me).collect();
        if !others.is_empty()
            && others
                .iter()
                .all(|v| rep.no_copy.contains(v) || rep.damaged.contains(v))
        {
            rep.decided = true;
            let (f, t) = (rep.from, rep.to);
            self.halt(format!(
                "every copy of LSN {f}..{t} is damaged or missing and it may be committed: \
                 refusing to invent or drop log"
            ));
        }
    }

    fn on_repair_request(&mut self, peer: NodeId, from: Lsn, to: Lsn) {
        let none = Message::RepairResp {
            from,
            to,
            bytes: Vec::new(),
            have: false,
            damaged: false,
        };
        if from >= to || to > self.log.flushed || to - from > self.cfg.max_message_bytes as u64 {
            self.send(peer, none);
            return;
        }
        self.actions.push(Action::ReadLog {
            purpose: ReadPurpose::Repair { peer, to },
            from,
            max_bytes: (to - from) as usize,
        });
    }

    // ---------------------------------------------------------------- election

    fn alive(&self, id: NodeId) -> bool {
        self.peers
            .get(&id)
            .and_then(|p| p.last_heard)
            .is_some_and(|t| self.now < t + self.cfg.lease)
    }

    fn maybe_campaign(&mut self, transfer: bool) {
        let me = self.cfg.id;
        if !self.is_voter(me) || !self.live() {
            return;
        }
        if !transfer {
            if self.now < self.lease_until || self.now < self.backoff_until {
                return;
            }
            let mine = self.prio();
            let voters = self.meta_want.membership.voters.clone();
            let mut alive = 1;
            for v in voters.iter().filter(|v| **v != me) {
                if self.alive(*v) {
                    alive += 1;
                    if self.peers[v].prio.is_some_and(|p| p > mine) {
                        return;
                    }
                }
            }
            if alive < majority(voters.len()) {
                return;
            }
        }
        self.start_campaign(transfer);
    }

    fn start_campaign(&mut self, transfer: bool) {
        let me = self.cfg.id;
        self.step_down();
        let pid = self.max_seen_pid.max(self.promised()) + 1;
        self.max_seen_pid = pid;
        self.meta_want.vote = Vote {
            promised_proposal_id: pid,
            voted_for: Some(me),
        };
        self.campaign = Some(Campaign {
            pid,
            transfer,
            started: self.now,
            phase: CampaignPhase::Promising,
            acks: BTreeMap::new(),
            rejected: BTreeSet::new(),
            lease_ts: BTreeMap::new(),
        });
        self.leader = None;
        self.set_role(Role::Candidate);
        self.deferred.push(Deferred::Campaign { pid });
        self.save_meta();
    }

    fn begin_prepare(&mut self, pid: u64) {
        let me = self.cfg.id;
        let flushed = self.log.flushed;
        let last_pid = self.log.pid_ending_at(flushed);
        let prio = self.prio();
        let now = self.now;
        let Some(c) = &mut self.campaign else { return };
        if c.pid != pid || c.phase != CampaignPhase::Promising {
            return;
        }
        c.phase = CampaignPhase::Preparing;
        c.acks.insert(
            me,
            MergeCandidate {
                node: me,
                end: flushed,
                last_pid,
            },
        );
        c.lease_ts.insert(me, now);
        let msg = Message::Prepare {
            pid,
            prio,
            transfer: c.transfer,
            ts: now,
        };
        for v in self.meta_want.membership.voters.clone() {
            if v != me {
                self.send(v, msg.clone());
            }
        }
        self.check_prepare_quorum();
    }

    fn on_prepare(&mut self, from: NodeId, pid: u64, prio: Priority, transfer: bool, ts: Nanos) {
        self.max_seen_pid = self.max_seen_pid.max(pid);
        if prio.id != from {
            self.drop_input(Some(from), "prepare with a forged id");
            return;
        }
        let mine = &self.meta_want.membership;
        if !mine.voters.contains(&from) && prio.config_version <= mine.version {
            self.drop_input(Some(from), "prepare from a non-voter");
            return;
        }
        let refusal = if pid <= self.promised() {
            Some("prepare refused: proposal id not above the promise")
        } else if prio.config_version < mine.version {
            Some("prepare refused: older config version")
        } else if transfer {
            None
        } else if self.leading.as_ref().is_some_and(|l| l.serving) {
            Some("prepare refused: leading")
        } else if self.now < self.lease_until && self.lease_holder != Some(from) {
            Some("prepare refused: another lease is live")
        } else {
            let me = self.cfg.id;
            let better_alive = (self.is_voter(me) && self.prio() > prio)
                || self.meta_want.membership.voters.iter().any(|v| {
                    *v != from
                        && *v != me
                        && self.alive(*v)
                        && self.peers[v].prio.is_some_and(|p| p > prio)
                });
            better_alive.then_some("prepare refused: a higher priority voter is alive")
        };
        if let Some(reason) = refusal {
            self.drop_input(Some(from), reason);
            self.send_prepare_ack(from, pid, false, ts);
            return;
        }
        self.step_down();
        self.leader = None;
        self.leader_pid = 0;
        self.matched_end = self.log.committed;
        self.lease_until = self.now + self.cfg.lease;
        self.lease_holder = Some(from);
        self.meta_want.vote = Vote {
            promised_proposal_id: pid,
            voted_for: Some(from),
        };
        self.deferred
            .push(Deferred::PrepareAck { to: from, pid, ts });
        self.save_meta();
    }

    fn send_prepare_ack(&mut self, to: NodeId, pid: u64, granted: bool, ts: Nanos) {
        let end = self.log.flushed;
        let msg = Message::PrepareAck {
            pid,
            granted,
            promised: self.promised(),
            end,
            last_pid: self.log.pid_ending_at(end),
            committed: self.log.committed,
            ts,
        };
        self.send(to, msg);
    }

    #[allow(clippy::too_many_arguments)]
    fn on_prepare_ack(
        &mut self,
        from: NodeId,
        pid: u64,
        granted: bool,
        promised: u64,
        end: Lsn,
        last_pid: u64,
        ts: Nanos,
    ) {
        self.max_seen_pid = self.max_seen_pid.max(promised);
        let Some(c) = &mut self.campaign else { return };
        if c.pid != pid || c.phase != CampaignPhase::Preparing {
            return;
        }
        if !granted {
            c.rejected.insert(from);
            let voters = &self.meta_want.membership.voters;
            let refusing = voters.iter().filter(|v| c.rejected.contains(v)).count();
            // Outbid, or refused by enough voters that no majority is left: back off
            // rather than wait out the campaign timeout.
            if promised >= pid || voters.len() - refusing < majority(voters.len()) {
                self.abandon_campaign();
            }
            return;
        }
        c.acks.insert(
            from,
            MergeCandidate {
                node: from,
                end,
                last_pid,
            },
        );
        c.lease_ts.insert(from, ts);
        self.check_prepare_quorum();
    }

    fn check_prepare_quorum(&mut self) {
        let me = self.cfg.id;
        let voters = self.meta_want.membership.voters.clone();
        let Some(c) = &mut self.campaign else { return };
        let answers: Vec<MergeCandidate> = voters
            .iter()
            .filter_map(|v| c.acks.get(v).copied())
            .collect();
        if answers.len() < majority(voters.len()) {
            return;
        }
        #[allow(unused_mut)]
        let mut best = self.policy.merge_source(&answers, me);
        #[cfg(feature = "broken")]
        if self.cfg.broken == Broken::SkipReconfirmation {
            best = c.acks[&me];
        }
        let mine = c.acks[&me];
        if best.node == me || (best.last_pid, best.end) == (mine.last_pid, mine.end) {
            self.start_working();
            return;
        }
        c.phase = CampaignPhase::Fetching {
            source: best.node,
            target: best.end,
        };
        let pid = c.pid;
        let from = self
            .log
            .pos_at(self.log.committed)
            .expect("committed is a boundary");
        self.send(
            best.node,
            Message::Fetch {
                pid,
                from,
                max_bytes: self.cfg.max_message_bytes as u32,
            },
        );
    }

    fn on_fetch(&mut self, from: NodeId, pid: u64, pos: LogPos, max_bytes: u32) {
        if self.meta.vote.promised_proposal_id != pid || self.meta.vote.voted_for != Some(from) {
            self.drop_input(Some(from), "fetch from a candidate not promised");
            return;
        }
        if pos.lsn > self.log.flushed {
            self.drop_input(Some(from), "fetch beyond the flushed end");
            return;
        }
        if pos.lsn >= self.log.floor.end_lsn && self.log.pos_at(pos.lsn) != Some(pos) {
            self.drop_input(Some(from), "fetch from a position not in the log");
            return;
        }
        let max = (max_bytes as usize).clamp(1, self.cfg.max_message_bytes);
        if pos.lsn < self.log.start {
            // The candidate's log ends below our start: it is rebased at our start first.
            self.actions.push(Action::ReadLog {
                purpose: ReadPurpose::Fetch {
                    peer: from,
                    pid,
                    max_bytes: max as u32,
                    rebase: true,
                },
                from: self.log.start,
                max_bytes: max,
            });
            return;
        }
        match self.log.cached_from(pos.lsn, max) {
            Some(bytes) if pos.lsn >= self.log.floor.end_lsn => {
                let groups = cut_groups(&bytes, self.log.flushed, max);
                let end = self.log.flushed;
                self.send(
                    from,
                    Message::FetchResp {
                        pid,
                        prev: pos,
                        groups,
                        end,
                    },
                );
            }
            _ => self.actions.push(Action::ReadLog {
                purpose: ReadPurpose::Fetch {
                    peer: from,
                    pid,
                    max_bytes: max as u32,
                    rebase: false,
                },
                from: pos.lsn,
                max_bytes: max,
            }),
        }
    }

    fn on_fetch_resp(&mut self, from: NodeId, pid: u64, prev: LogPos, groups: Vec<u8>) {
        let Some(c) = &self.campaign else { return };
        let CampaignPhase::Fetching { source, target } = c.phase else {
            return;
        };
        if c.pid != pid || source != from {
            self.drop_input(Some(from), "fetch response not asked for");
            return;
        }
        let matches = self.log.continues_at(prev);
        if !matches {
            self.drop_input(Some(from), "fetch response does not continue the log");
            self.abandon_campaign();
            return;
        }
        let got = match self.accept_groups(prev.lsn, &groups, pid) {
            Ok(end) => end,
            Err(reason) => {
                self.drop_input(Some(from), reason);
                self.abandon_campaign();
                return;
            }
        };
        if got >= target {
            if self.log.end() > target {
                self.truncate_log(target);
            }
            self.start_working();
        } else if groups.is_empty() {
            self.abandon_campaign();
        } else {
            let pos = self.log.pos_at(got).expect("just appended");
            self.send(
                from,
                Message::Fetch {
                    pid,
                    from: pos,
                    max_bytes: self.cfg.max_message_bytes as u32,
                },
            );
        }
    }

    /// Reconfirmation done: write StartWorking and act as leader until it commits (PALF
    /// Alg. 1 line 8; the piggyback paper's leader recovery, section 5.1).
    fn start_working(&mut self) {
        let me = self.cfg.id;
        let mirror = self.meta_want.membership.access_mode == AccessMode::RawWrite;
        let Some(c) = &mut self.campaign else { return };
        c.phase = CampaignPhase::Confirming;
        let pid = c.pid;
        let lease_acks = c.lease_ts.clone();
        let end = self.log.end();
        let mut progress = BTreeMap::new();
        for n in self.members() {
            progress.insert(n, Progress::new(end, self.now));
        }
        self.leader = Some(me);
        self.leader_pid = pid;
        self.leading = Some(Leading {
            pid,
            progress,
            start_working_end: u64::MAX,
            serving: false,
            lease_acks,
            open: None,
            last_heartbeat: 0,
            transfer: None,
            prev_config: None,
            config_committed: false,
            committed_mode: None,
            replace_then_remove: None,
            published_commit: self.log.committed,
            last_commit_record_end: 0,
            last_async: self.now,
            became_leader: self.now,
        });
        // A mirror writes no group of its own (the LSN space is the primary's): what it
        // inherited above the commit point commits only with a quorum on a group past it,
        // the first it mirrors under our proposal id.
        #[cfg(feature = "broken")]
        let mirror = mirror && self.cfg.broken != Broken::MirrorStartWorking;
        let sw_end = if mirror {
            let end = self.log.end();
            if end > self.log.committed {
                end + 1
            } else {
                end
            }
        } else {
            self.write_empty_group();
            self.log.end()
        };
        let l = self.leading.as_mut().expect("leading");
        l.start_working_end = sw_end;
        if mirror {
            // Reconfirmed: it serves at once (its mirror writes wait for its config).
            l.serving = true;
            l.became_leader = self.now;
            self.campaign = None;
            self.set_role(Role::Leader);
        }
        let sw_end = self.log.end();
        let l = self.leading.as_mut().expect("leading");
        l.last_commit_record_end = sw_end;
        // Re-stamp the membership under the new proposal id: it outranks any membership a
        // previous leader proposed but did not finish (PALF section 3.4, StartWorking).
        let mut m = self.meta_want.membership.clone();
        m.version = ConfigVersion {
            proposal_id: pid,
            seq: 0,
        };
        m.barrier_lsn = sw_end;
        self.meta_want.membership = m;
        self.save_meta();
        self.broadcast(true);
        self.try_commit();
    }

    fn abandon_campaign(&mut self) {
        self.step_down();
        let spread = (self.cfg.lease / 2).max(1);
        self.backoff_until = self.now + self.rng.below(spread);
    }

    /// Leaves any leading or campaigning state.
    fn step_down(&mut self) {
        let was_leading = self.leading.is_some() || self.campaign.is_some();
        if let Some(l) = self.leading.take() {
            if let Some(o) = l.open {
                // Never sealed, so never in any log: failed for certain.
                for (id, lsn, csn) in o.records {
                    self.actions.push(Action::Result {
                        id,
                        lsn,
                        csn,
                        outcome: Outcome::Failed,
                    });
                }
            }
            self.leader = None;
            self.leader_pid = 0;
            self.matched_end = self.log.committed;
        }
        self.campaign = None;
        if was_leading {
            let role = if self.pending.is_empty() {
                Role::Follower
            } else {
                Role::PendingFollower
            };
            self.set_role(role);
        }
    }

    // ---------------------------------------------------------------- leader

    fn leader_tick(&mut self) {
        let now = self.now;
        if !self.lease_valid() {
            self.abandon_campaign();
            return;
        }
        let (hb_due, freeze_due) = {
            let l = self.leading.as_ref().expect("leading");
            (
                now >= l.last_heartbeat + self.cfg.heartbeat_interval,
                l.open
                    .as_ref()
                    .is_some_and(|o| now >= o.opened + self.cfg.freeze_interval),
            )
        };
        if freeze_due || self.log.flushed == self.log.end() {
            self.freeze();
        }
        if let CommitMode::Async { interval } = self.cfg.commit_mode {
            let l = self.leading.as_mut().expect("leading");
            if now >= l.last_async + interval {
                l.last_async = now;
                if self.log.committed > l.last_commit_record_end
                    && self.meta_want.membership.access_mode != AccessMode::RawWrite
                {
                    self.write_commit_record();
                }
            }
        }
        // Resend after silence: messages may have been lost. And on time: a follower's
        // oldest unacknowledged message, sent a few of its round trips ago, goes again
        // (only that message: later ones wait in its buffer for the gap to fill).
        let (resend, pieces) = {
            let factor = self.cfg.timed_resend;
            let l = self.leading.as_mut().expect("leading");
            let end = self.log.end();
            let mut v = Vec::new();
            let mut pieces = Vec::new();
            for (n, p) in l.progress.iter_mut() {
                if p.matched < end && now > p.last_progress + self.cfg.resend_interval {
                    p.rewind(p.matched, now);
                    p.read_pending = false;
                    p.last_progress = now;
                    v.push(*n);
                    continue;
                }
                if p.timed_due(factor, end).is_some_and(|t| now >= t) {
                    if let Some(upto) = p.resend_front(now) {
                        pieces.push((*n, p.matched, upto));
                    }
                }
            }
            (v, pieces)
        };
        for n in resend {
            self.replicate_to(n, false);
        }
        for (n, from, upto) in pieces {
            self.timed_resends += 1;
            self.resend_piece(n, from, upto);
        }
        if hb_due {
            self.leading.as_mut().expect("leading").last_heartbeat = now;
            self.broadcast(true);
        }
        let transfer = self.leading.as_ref().and_then(|l| l.transfer);
        if let Some((_, deadline)) = transfer {
            if now > deadline {
                self.leading.as_mut().expect("leading").transfer = None;
            } else {
                self.check_transfer();
            }
        }
        self.maybe_fail_back();
    }

    /// Fail-back (PALF section 3.4): a caught-up voter of higher priority gets leadership.
    fn maybe_fail_back(&mut self) {
        let mine = self.prio();
        let end = self.log.end();
        let Some(l) = &self.leading else { return };
        if !l.serving || l.transfer.is_some() || self.now < l.became_leader + self.cfg.lease {
            return;
        }
        let target = self
            .meta_want
            .membership
            .voters
            .iter()
            .copied()
            .filter(|v| *v != self.cfg.id && self.alive(*v))
            .filter(|v| {
                self.peers[v].prio.is_some_and(|p| p > mine)
                    && l.progress.get(v).is_some_and(|p| p.matched == end)
            })
            .max_by_key(|v| self.peers[v].prio);
        if let Some(t) = target {
            let _ = self.transfer_leader(self.now, t);
        }
    }

    fn check_transfer(&mut self) {
        let end = self.log.end();
        let Some(l) = &self.leading else { return };
        let Some((to, _)) = l.transfer else { return };
        if l.open.is_some() || l.progress.get(&to).is_none_or(|p| p.matched < end) {
            return;
        }
        let pid = l.pid;
        self.send(to, Message::TimeoutNow { pid });
        self.step_down();
        self.leader = Some(to);
        self.lease_holder = Some(to);
    }

    fn lease_valid(&self) -> bool {
        let Some(l) = &self.leading else { return false };
        let me = self.cfg.id;
        let voters = &self.meta_want.membership.voters;
        let mut ts: Vec<Nanos> = voters
            .iter()
            .map(|v| {
                if *v == me {
                    self.now
                } else {
                    l.lease_acks.get(v).copied().unwrap_or(0)
                }
            })
            .collect();
        let k = majority(ts.len());
        if ts.len() < k {
            return false;
        }
        ts.sort_unstable_by(|a, b| b.cmp(a));
        let t = ts[k - 1];
        let margin = self.cfg.lease / 1_000_000 * 2 * self.cfg.max_clock_drift_ppm as u64;
        t + self.cfg.lease.saturating_sub(margin) > self.now
    }

    fn published(&self) -> Lsn {
        let l = self.leading.as_ref().expect("leading");
        match self.cfg.commit_mode {
            CommitMode::Piggyback => self.log.committed,
            // A mirror writes no commit-only groups (the LSN space is the primary's).
            _ if self.meta_want.membership.access_mode == AccessMode::RawWrite => {
                self.log.committed
            }
            _ => l.published_commit,
        }
    }

    /// Seals the open group and sends it.
    fn freeze(&mut self) {
        let published = match &self.leading {
            Some(l) if l.open.as_ref().is_some_and(|o| o.entries > 0) => self.published(),
            _ => return,
        };
        let l = self.leading.as_mut().expect("leading");
        let mut o = l.open.take().expect("open");
        let pid = l.pid;
        let prev = self.log.chain;
        debug_assert_eq!(o.lsn, prev.end_lsn);
        let h = seal_group(
            &mut o.buf,
            &prev,
            SealParams {
                proposal_id: pid,
                committed_end_lsn: published.min(prev.end_lsn),
                flags: 0,
            },
            o.entries,
            o.max_csn,
        );
        let pg = PendingGroup {
            lsn: h.lsn,
            pid,
            acc: h.acc_crc,
            records: o.records,
        };
        let at = self.pending.partition_point(|g| g.lsn <= pg.lsn);
        self.pending.insert(at, pg);
        self.write_group(&h, o.buf);
        self.broadcast(false);
        self.check_transfer();
    }

    fn write_padding(&mut self) {
        let l = self.leading.as_ref().expect("leading");
        let pid = l.pid;
        let published = self.published().min(self.log.end());
        let rem = block_remaining(self.log.end(), self.cfg.block_size);
        let mut buf = Vec::new();
        let h = encode_padding(&mut buf, &self.log.chain, pid, published, rem);
        self.write_group(&h, buf);
    }

    /// An empty group under the leader's pid: StartWorking, or a commit record.
    fn write_empty_group(&mut self) {
        self.freeze();
        if !fits_in_block(
            self.log.end(),
            GROUP_HEADER_SIZE as u64,
            self.cfg.block_size,
        ) {
            self.write_padding();
        }
        let pid = self.leading.as_ref().expect("leading").pid;
        let published = self.published().min(self.log.end());
        let mut buf = vec![0u8; GROUP_HEADER_SIZE];
        let prev = self.log.chain;
        let h = seal_group(
            &mut buf,
            &prev,
            SealParams {
                proposal_id: pid,
                committed_end_lsn: published,
                flags: 0,
            },
            0,
            prev.max_csn,
        );
        self.write_group(&h, buf);
        self.broadcast(false);
    }

    /// SYNC and ASYNC modes: persist and send the commit point as a commit-only group.
    fn write_commit_record(&mut self) {
        let committed = self.log.committed;
        let l = self.leading.as_mut().expect("leading");
        l.published_commit = committed;
        self.write_empty_group();
        let end = self.log.end();
        self.leading
            .as_mut()
            .expect("leading")
            .last_commit_record_end = end;
    }

    fn append_msg(&self, peer: NodeId, prev: LogPos, groups: Vec<u8>) -> Message {
        let l = self.leading.as_ref().expect("leading");
        let m = &self.meta_want.membership;
        let offer = l
            .progress
            .get(&peer)
            .is_some_and(|p| p.config_version < m.version);
        Message::Append {
            pid: l.pid,
            ts: self.now,
            prev,
            groups,
            leader_end: self.log.end(),
            committed: self.published(),
            config: offer.then(|| m.clone()),
        }
    }

    fn broadcast(&mut self, heartbeat: bool) {
        let peers: Vec<NodeId> = match &self.leading {
            Some(l) => l.progress.keys().copied().collect(),
            None => return,
        };
        for p in peers {
            self.replicate_to(p, heartbeat);
        }
    }

    /// Sends `peer` the log in `[from, upto)` again (a timed resend) without moving
    /// where its replication continues: a follower that buffered what came after
    /// (reordering) fills its gap and acknowledges all of it. A first copy of a lone
    /// append lost on both links is the same message sent again (TCP's tail loss probe);
    /// a follower that lags behind the commit point gets the piece it lacks, so it can
    /// acknowledge what it holds past it, and the next commit has two followers to count
    /// on, not one. Bytes no longer cached are read from the log by the catch-up path.
    fn resend_piece(&mut self, peer: NodeId, from: Lsn, upto: Lsn) {
        let max = (upto.saturating_sub(from) as usize).min(self.cfg.max_message_bytes);
        let groups = self.log.cached_from(from, max);
        match (self.log.pos_at(from), groups) {
            (Some(prev), Some(groups)) if !groups.is_empty() => {
                let msg = self.append_msg(peer, prev, groups);
                self.send(peer, msg);
            }
            _ => {
                let now = self.now;
                let l = self.leading.as_mut().expect("leading");
                if let Some(p) = l.progress.get_mut(&peer) {
                    p.rewind(p.matched, now);
                }
                self.replicate_to(peer, false);
            }
        }
    }

    fn replicate_to(&mut self, peer: NodeId, heartbeat: bool) {
        let end = self.log.end();
        let Some(l) = &self.leading else { return };
        let Some(p) = l.progress.get(&peer) else {
            return;
        };
        if p.read_pending {
            return;
        }
        let from = p.next.min(end);
        let in_flight = from.saturating_sub(p.matched);
        if !heartbeat && (from == end || in_flight > self.cfg.window_bytes) {
            return;
        }
        let groups = if from == end || in_flight > self.cfg.window_bytes {
            Some(Vec::new())
        } else {
            self.log.cached_from(from, self.cfg.max_message_bytes)
        };
        match (self.log.pos_at(from), groups) {
            (Some(prev), Some(groups)) => {
                let next = from + groups.len() as u64;
                let msg = self.append_msg(peer, prev, groups);
                let l = self.leading.as_mut().expect("leading");
                let now = self.now;
                l.progress
                    .get_mut(&peer)
                    .expect("peer")
                    .sent_upto(next, now);
                self.send(peer, msg);
            }
            _ => {
                let l = self.leading.as_mut().expect("leading");
                l.progress.get_mut(&peer).expect("peer").read_pending = true;
                // Below our log start storage holds nothing: read from the start, and
                // the follower is rebased there (see `log_read`).
                let from = from.max(self.log.start);
                self.actions.push(Action::ReadLog {
                    purpose: ReadPurpose::CatchUp { peer },
                    from,
                    max_bytes: self.cfg.max_message_bytes,
                });
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn on_append_ack(
        &mut self,
        from: NodeId,
        pid: u64,
        ts: Nanos,
        success: bool,
        matched: Lsn,
        hint: Lsn,
        committed: Lsn,
        config_version: ConfigVersion,
    ) {
        self.max_seen_pid = self.max_seen_pid.max(pid);
        let end = self.log.end();
        let Some(l) = &mut self.leading else { return };
        if pid > l.pid {
            self.abandon_campaign();
            return;
        }
        if pid < l.pid {
            self.drop_input(Some(from), "ack for an old proposal id");
            return;
        }
        let Some(p) = l.progress.get_mut(&from) else {
            self.drop_input(Some(from), "ack from a non-member");
            return;
        };
        let e = l.lease_acks.entry(from).or_default();
        *e = (*e).max(ts);
        p.config_version = p.config_version.max(config_version);
        if success {
            let matched = matched.min(end);
            if matched > p.matched {
                p.matched = matched;
                p.last_progress = self.now;
                p.acked_upto(matched, self.now);
            }
            if p.next < p.matched {
                p.next = p.matched;
            }
        } else {
            let retry = if hint <= end && self.log.pos_at(hint).is_some() {
                hint
            } else {
                committed.min(end)
            };
            // A follower that reports less than it acknowledged lost durable data (a
            // replaced disk, a broken fsync); believe the report, or we would resend from
            // past its end forever.
            p.matched = p.matched.min(retry);
            p.rewind(retry, self.now);
            p.read_pending = false;
        }
        self.try_commit();
        self.replicate_to(from, false);
        self.check_transfer();
    }

    fn try_commit(&mut self) {
        let me = self.cfg.id;
        let flushed = self.log.flushed;
        let Some(l) = &self.leading else { return };
        let matched_of = |n: &NodeId| {
            if *n == me {
                flushed
            } else {
                l.progress.get(n).map_or(0, |p| p.matched)
            }
        };
        let cur = &self.meta_want.membership;
        let mut point = {
            let mut m: Vec<Lsn> = cur.voters.iter().map(matched_of).collect();
            self.policy.commit_point(&mut m, majority(cur.voters.len()))
        };
        if !l.config_committed {
            if let Some(prev) = &l.prev_config {
                let mut m: Vec<Lsn> = prev.voters.iter().map(matched_of).collect();
                point = point.min(
                    self.policy
                        .commit_point(&mut m, majority(prev.voters.len())),
                );
            }
        }
        // Only a quorum on a group of our own proposal id commits (Raft's rule; here the
        // StartWorking group), so older groups commit with it, never by counting alone.
        let sw_end = l.start_working_end;
        let config_acked = cur
            .voters
            .iter()
            .filter(|n| {
                if **n == me {
                    self.meta.membership.version >= cur.version && flushed >= cur.barrier_lsn
                } else {
                    l.progress
                        .get(n)
                        .is_some_and(|p| p.config_version >= cur.version)
                }
            })
            .count()
            >= majority(cur.voters.len());
        let version = cur.version;
        if point >= sw_end && point > self.log.committed {
            self.advance_committed(point);
        }
        let l = self.leading.as_mut().expect("leading");
        if !l.config_committed && config_acked {
            l.config_committed = true;
            l.prev_config = None;
            l.committed_mode = Some(self.meta_want.membership.access_mode);
            let members: BTreeSet<NodeId> = self.members();
            let l = self.leading.as_mut().expect("leading");
            l.progress.retain(|n, _| members.contains(n));
            let then_remove = l.replace_then_remove.take();
            self.actions.push(Action::ConfigCommitted { version });
            if let Some(old) = then_remove {
                let _ = self.change_membership(self.now, MembershipChange::Remove(old));
            }
        }
        let l = self.leading.as_mut().expect("leading");
        if !l.serving && self.log.committed >= l.start_working_end {
            l.serving = true;
            l.became_leader = self.now;
            self.campaign = None;
            self.set_role(Role::Leader);
        }
        if let Some(l) = &self.leading {
            if self.cfg.commit_mode == CommitMode::Sync
                && l.serving
                && self.log.committed > l.last_commit_record_end
                && self.meta_want.membership.access_mode != AccessMode::RawWrite
            {
                self.write_commit_record();
            }
        }
    }

    // ---------------------------------------------------------------- follower

    fn on_append(&mut self, from: NodeId, msg: Message) {
        let Message::Append {
            pid,
            ts,
            prev,
            ref groups,
            leader_end,
            committed,
            ref config,
        } = msg
        else {
            unreachable!("on_append takes appends")
        };
        if !self.follow(from, pid, ts, config.as_ref()) {
            return;
        }
        if prev.lsn > self.log.end() {
            // A gap: either an earlier message is still in flight (reordering; buffer this
            // one within bounds) or it was lost. A heartbeat past our end means the latter,
            // so tell the leader where we are.
            if !groups.is_empty() && self.early.len() < self.cfg.max_buffered_appends {
                self.early.insert(prev.lsn, (from, msg));
                let end = self.log.end();
                let after = self.cfg.gap_resend_after;
                let held = self.early.len();
                let due = match self.gap_asked_at {
                    Some((at, n)) if at == end => held >= n + after,
                    _ => held >= after,
                };
                if after > 0 && due {
                    // Overtaken `after` times: ask for the gap now rather than wait for
                    // the slow copy or a heartbeat (the leader resends from `end`).
                    self.gap_asked_at = Some((end, held));
                    self.gap_asks += 1;
                    self.send_ack(false, end);
                }
            } else {
                let end = self.log.end();
                self.send_ack(false, end);
            }
            return;
        }
        let matches = self.log.continues_at(prev);
        if !matches {
            let hint = self.log.committed;
            self.send_ack(false, hint);
            return;
        }
        self.matched_end = self.matched_end.max(prev.lsn);
        match self.accept_groups(prev.lsn, groups, pid) {
            Ok(last) => self.matched_end = self.matched_end.max(last),
            Err(reason) => {
                self.drop_input(Some(from), reason);
                let hint = self.log.committed;
                self.send_ack(false, hint);
                return;
            }
        }
        if self.halted.is_some() {
            return;
        }
        // Groups past the leader's end from older leaders can never commit: the leader's
        // log holds everything committed. Remove them so pending appends get decided.
        if self.matched_end == leader_end && self.log.end() > leader_end {
            if let Some(g) = self.log.group_at(leader_end) {
                if g.pid < pid {
                    self.truncate_log(leader_end);
                }
            }
        }
        self.leader_committed = self.leader_committed.max(committed);
        self.follower_commit();
        if let Some(m) = config {
            self.consider_config(m.clone());
        }
        self.send_ack(true, 0);
        self.drain_early();
    }

    /// The checks and bookkeeping every message from a leader goes through
    /// ([`Message::Append`], [`Message::Rebase`]): the sender is a member (or brings a
    /// membership naming it), its proposal id is not stale (answered with ours if it is),
    /// and we follow it from now on. Returns whether to go on with the message.
    fn follow(&mut self, from: NodeId, pid: u64, ts: Nanos, config: Option<&Membership>) -> bool {
        // A sender outside our membership is a leader only if it brings a newer membership
        // naming it a voter (a leader attaches its membership until we acknowledge it).
        let m = &self.meta_want.membership;
        let known = m.voters.is_empty()
            || m.voters.contains(&from)
            || m.learners.contains(&from)
            || config
                .as_ref()
                .is_some_and(|c| c.version > m.version && c.voters.contains(&from));
        if !known {
            self.drop_input(Some(from), "append from a non-member");
            return false;
        }
        self.max_seen_pid = self.max_seen_pid.max(pid);
        let promised = self.promised();
        if pid < promised {
            self.drop_input(Some(from), "append with a stale proposal id");
            let msg = Message::AppendAck {
                pid: promised,
                ts,
                success: false,
                matched: 0,
                hint: 0,
                committed: 0,
                config_version: self.meta.membership.version,
            };
            self.send(from, msg);
            return false;
        }
        let own_pid = self
            .leading
            .as_ref()
            .map(|l| l.pid)
            .or(self.campaign.as_ref().map(|c| c.pid));
        if own_pid == Some(pid) {
            self.drop_input(
                Some(from),
                "append from another replica under our proposal id",
            );
            return false;
        }
        if pid > promised {
            self.meta_want.vote = Vote {
                promised_proposal_id: pid,
                voted_for: None,
            };
            self.save_meta();
        }
        self.step_down();
        if self.leader_pid != pid || self.leader != Some(from) {
            self.leader = Some(from);
            self.leader_pid = pid;
            self.matched_end = self.log.committed;
            self.leader_committed = 0;
            self.early.clear();
            // Its barrier was on another leader's log.
            self.pending_config = None;
            self.gap_asked_at = None;
            let role = self.role;
            self.actions.push(Action::Role {
                role,
                pid,
                leader: Some(from),
            });
        }
        self.lease_until = self.now + self.cfg.lease;
        self.lease_holder = Some(from);
        self.last_leader_ts = self.last_leader_ts.max(ts);
        true
    }

    /// A [`Message::Rebase`]: from our leader (we are behind its log start), or from the
    /// replica a candidate of ours fetches from (our log ends below its start).
    fn on_rebase(
        &mut self,
        from: NodeId,
        pid: u64,
        ts: Nanos,
        base: ChainPoint,
        base_pid: u64,
        committed: Lsn,
    ) {
        if base.end_lsn > committed || !base.end_lsn.is_multiple_of(self.cfg.block_size) {
            self.drop_input(
                Some(from),
                "rebase to a base that is not a committed block start",
            );
            return;
        }
        if let Some(c) = &self.campaign {
            if let CampaignPhase::Fetching { source, .. } = c.phase {
                if c.pid == pid && source == from {
                    // Reconfirmation takes the source's log as it is (it is the longest of
                    // a majority), so ours below its start may go.
                    if !self.holds_base(base) {
                        self.rebase_log(base, base_pid);
                    }
                    return;
                }
            }
            self.drop_input(Some(from), "rebase not asked for");
            return;
        }
        if !self.follow(from, pid, ts, None) {
            return;
        }
        if !self.holds_base(base) {
            self.rebase_log(base, base_pid);
        }
        // Either way our log matches the leader's up to `base` now.
        self.matched_end = self.matched_end.max(base.end_lsn);
        self.leader_committed = self.leader_committed.max(committed);
        self.follower_commit();
        self.send_ack(true, 0);
        self.drain_early();
    }

    /// Whether our log already holds `base`: our committed prefix reaches it (committed
    /// prefixes are the same everywhere) or it is a boundary of our log with the same
    /// checksum chain.
    fn holds_base(&self, base: ChainPoint) -> bool {
        self.log.committed >= base.end_lsn
            || self.log.continues_at(LogPos {
                lsn: base.end_lsn,
                acc: base.acc_crc,
            })
    }

    /// Starts our log again, empty, at `base`: everything below it is committed.
    fn rebase_log(&mut self, base: ChainPoint, base_pid: u64) {
        let at = base.end_lsn;
        self.log.rebase(base, base_pid);
        self.matched_end = at;
        self.early.retain(|&lsn, _| lsn >= at);
        self.gap_asked_at = None;
        self.last_csn = self.last_csn.max(base.max_csn);
        self.rebased += 1;
        self.actions.push(Action::Rebase { base });
        self.actions.push(Action::Commit { end: at });
        // Our pending groups below `base` were committed or not on the leader, whose log
        // there is gone: their results cannot be known any more.
        while self.pending.front().is_some_and(|g| g.lsn < at) {
            let g = self.pending.pop_front().expect("non-empty");
            for (id, lsn, _csn) in g.records {
                #[cfg(feature = "broken")]
                if self.cfg.broken == Broken::GuessOnRebase {
                    self.actions.push(Action::Result {
                        id,
                        lsn,
                        csn: _csn,
                        outcome: Outcome::Failed,
                    });
                    continue;
                }
                self.actions.push(Action::Unknown { id, lsn });
            }
        }
        self.resolve_pending();
    }

    fn drain_early(&mut self) {
        while let Some((&lsn, _)) = self.early.first_key_value() {
            if lsn > self.log.end() {
                break;
            }
            let (_, (from, msg)) = self.early.pop_first().expect("non-empty");
            if let Message::Append { pid, .. } = &msg {
                if *pid == self.leader_pid && Some(from) == self.leader {
                    self.on_append(from, msg);
                }
            }
        }
    }

    fn follower_commit(&mut self) {
        let c = self.leader_committed.min(self.matched_end);
        if c > self.log.committed {
            self.advance_committed(c);
        }
    }

    fn consider_config(&mut self, m: Membership) {
        if m.version <= self.meta_want.membership.version {
            return;
        }
        // The barrier (PALF section 5.3, Fig. 8a): adopt a membership only once our log
        // holds, durably and matching the leader, everything the leader had when it issued
        // it.
        if self.matched_end < m.barrier_lsn || self.log.flushed < m.barrier_lsn {
            self.pending_config = Some(m);
            return;
        }
        self.pending_config = None;
        self.set_membership(m);
        self.save_meta();
    }

    fn send_ack(&mut self, success: bool, hint: Lsn) {
        let Some(leader) = self.leader else { return };
        if self.leading.is_some() || self.campaign.is_some() || !self.live() {
            return;
        }
        if self.meta.vote.promised_proposal_id != self.leader_pid
            || self.promised() != self.leader_pid
        {
            return;
        }
        #[allow(unused_mut)]
        let mut durable = self.log.flushed;
        #[cfg(feature = "broken")]
        if self.cfg.broken == Broken::AckBeforeFsync {
            durable = self.log.end();
        }
        let msg = Message::AppendAck {
            pid: self.leader_pid,
            ts: self.last_leader_ts,
            success,
            matched: durable.min(self.matched_end),
            hint,
            committed: self.log.committed,
            config_version: self.meta.membership.version,
        };
        self.send(leader, msg);
    }

    // ---------------------------------------------------------------- log

    /// Accepts whole groups continuing the log at `prev` under the authority of proposal
    /// id `authority`. Returns the end of the last group (matched with the sender).
    fn accept_groups(
        &mut self,
        prev: Lsn,
        bytes: &[u8],
        authority: u64,
    ) -> Result<Lsn, &'static str> {
        let mut parsed = Vec::new();
        let mut off = 0usize;
        let mut pos = prev;
        while off < bytes.len() {
            let (h, _) = decode_group(&bytes[off..]).map_err(|_| "malformed group")?;
            if h.lsn != pos {
                return Err("group out of sequence");
            }
            if h.proposal_id > authority {
                return Err("group from a later proposal id");
            }
            if !fits_in_block(h.lsn, h.total_len(), self.cfg.block_size) {
                return Err("group straddles a block");
            }
            let len = h.total_len() as usize;
            parsed.push((h, off, len));
            off += len;
            pos = h.end_lsn();
        }
        let mut last = prev;
        for (h, off, len) in parsed {
            if h.end_lsn() <= self.log.floor.end_lsn {
                last = h.end_lsn();
                continue;
            }
            if h.lsn < self.log.end() {
                if let Some(m) = self.log.group_at(h.lsn) {
                    if m.pid == h.proposal_id && m.after.acc_crc == h.acc_crc {
                        last = h.end_lsn();
                        continue;
                    }
                }
                if h.lsn < self.log.committed {
                    self.halt(format!(
                        "a group at LSN {} conflicts with the committed log (committed end {})",
                        h.lsn, self.log.committed
                    ));
                    return Err("conflict with the committed log");
                }
                if self.log.chain_at(h.lsn).is_none() {
                    return Err("group does not start at a boundary of the log");
                }
                self.truncate_log(h.lsn);
            }
            if h.verify_chain(&self.log.chain).is_err() {
                return Err("group does not continue the checksum chain");
            }
            self.leader_committed = self.leader_committed.max(h.committed_end_lsn);
            self.write_group(&h, bytes[off..off + len].to_vec());
            last = h.end_lsn();
        }
        Ok(last)
    }

    fn write_group(&mut self, h: &GroupHeader, bytes: Vec<u8>) {
        self.last_csn = self.last_csn.max(h.max_csn);
        let meta = GroupMeta {
            lsn: h.lsn,
            pid: h.proposal_id,
            after: h.chain_after(),
        };
        self.log.push(meta, bytes.clone());
        self.actions.push(Action::Write { lsn: h.lsn, bytes });
    }

    fn truncate_log(&mut self, lsn: Lsn) {
        debug_assert!(lsn >= self.log.committed);
        self.log.truncate(lsn);
        self.matched_end = self.matched_end.min(lsn);
        self.actions.push(Action::Truncate { lsn });
    }

    fn advance_committed(&mut self, end: Lsn) {
        debug_assert!(end > self.log.committed);
        self.log.committed = end;
        self.actions.push(Action::Commit { end });
        self.resolve_pending();
        let keep_from = self.pending.front().map_or(end, |g| g.lsn.min(end));
        self.log.prune(keep_from, self.cfg.max_index_groups);
    }

    /// Decides pending appends against the committed log (PALF section 4.1): once the
    /// committed end passes a pending group's LSN, the committed log either holds that very
    /// group (same LSN, proposal id and checksum chain) or holds something else there.
    fn resolve_pending(&mut self) {
        let committed = self.log.committed;
        while let Some(g) = self.pending.front() {
            if committed <= g.lsn {
                break;
            }
            let held = self.log.group_at(g.lsn).is_some_and(|m| {
                m.pid == g.pid && m.after.acc_crc == g.acc && m.end() <= committed
            });
            let outcome = if held {
                Outcome::Committed
            } else {
                Outcome::Failed
            };
            let g = self.pending.pop_front().expect("non-empty");
            for (id, lsn, csn) in g.records {
                self.actions.push(Action::Result {
                    id,
                    lsn,
                    csn,
                    outcome,
                });
            }
        }
        // Proposal ids never decrease along a log (log matching), so once the committed log
        // ends with a group of a later proposal id than a pending group, everything committed
        // after it is of that later id too: the pending group can never be committed, even
        // at an LSN the log has not reached yet.
        let last_pid = self.log.pid_ending_at(committed);
        let mut i = 0;
        while i < self.pending.len() {
            if self.pending[i].pid < last_pid {
                let g = self.pending.remove(i).expect("in range");
                for (id, lsn, csn) in g.records {
                    self.actions.push(Action::Result {
                        id,
                        lsn,
                        csn,
                        outcome: Outcome::Failed,
                    });
                }
            } else {
                i += 1;
            }
        }
        if self.role == Role::PendingFollower && self.pending.is_empty() {
            self.set_role(Role::Follower);
        }
    }
}

/// The prefix of `bytes` (whole groups) ending at or before `limit` (an LSN bound) and at
/// most `max` bytes (but at least one group if it fits the LSN bound).
fn cut_groups(bytes: &[u8], limit: Lsn, max: usize) -> Vec<u8> {
    let mut off = 0usize;
    while off < bytes.len() {
        let Ok(h) = GroupHeader::decode(&bytes[off..]) else {
            break;
        };
        let len = h.total_len() as usize;
        if h.end_lsn() > limit || off + len > bytes.len() || (off > 0 && off + len > max) {
            break;
        }
        off += len;
    }
    bytes[..off].to_vec()
}
