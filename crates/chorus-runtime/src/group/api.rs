//! What a group hands its callers: records read back, append results and their futures,
//! the role, the status and the counters.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::AtomicU64;
use std::task::{Context, Poll};

use chorus_core::format::meta::{Membership, NodeId};
use chorus_core::replica::{Outcome, Role};
use chorus_core::{Csn, Lsn};
use tokio::sync::oneshot;

use super::GroupId;
use crate::error::Error;

/// A committed record read back from the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Its LSN (byte offset of the entry in the log).
    pub lsn: Lsn,
    /// Its CSN.
    pub csn: Csn,
    /// The bytes the appender gave.
    pub data: Vec<u8>,
}

/// The final result of an append, delivered once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppendResult {
    /// The record's LSN.
    pub lsn: Lsn,
    /// The record's CSN.
    pub csn: Csn,
    /// Committed or Failed (PALF section 4.1: explicit results).
    pub outcome: Outcome,
}

/// Role of this replica of a group, as published to subscribers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoleInfo {
    /// The role.
    pub role: Role,
    /// The proposal id it holds it under.
    pub proposal_id: u64,
    /// The leader this replica follows (itself when leading), if known.
    pub leader: Option<NodeId>,
}

/// A snapshot of a group's state for `status`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupStatus {
    /// The group.
    pub group: GroupId,
    /// This node.
    pub node: NodeId,
    /// Role, proposal id and leader.
    pub role: RoleInfo,
    /// First LSN still in the log.
    pub start_lsn: Lsn,
    /// End of the log (written).
    pub end_lsn: Lsn,
    /// End of the durable log.
    pub flushed_end: Lsn,
    /// Committed end known to this replica.
    pub committed_end: Lsn,
    /// This replica's readable CSN: every record with a CSN at most this one is
    /// committed and in its log, readable here, and every later record gets a larger
    /// CSN (PALF section 4.2, follower reads). The largest CSN below the committed end.
    pub readable_csn: Csn,
    /// The membership this replica holds.
    pub membership: Membership,
    /// Leader only: each follower's matched (durable and agreeing) end LSN.
    pub followers: Vec<(NodeId, Lsn)>,
    /// Appends waiting for a result.
    pub pending_appends: usize,
    /// Why the group stopped, if it did.
    pub stopped: Option<String>,
    /// Inputs the replica dropped, by reason.
    pub drops: Vec<(String, u64)>,
    /// Times this replica, as a follower, asked its leader to resend past a gap at once
    /// ([`chorus_core::replica::ReplicaConfig::gap_resend_after`]), since the group opened.
    pub gap_resend_requests: u64,
    /// Times this replica, as a leader, sent a follower its unacknowledged bytes again
    /// because they were late ([`chorus_core::replica::ReplicaConfig::timed_resend`]),
    /// since the group opened.
    pub timed_resends: u64,
    /// Times this replica's log was started again, empty, at its leader's log start
    /// because it had fallen behind it, since the group opened.
    pub rebased: u64,
    /// Damaged log ranges (found at open or by the scrubber) replaced with a peer's copy,
    /// since the group opened.
    pub repaired: u64,
    /// The damaged range this replica is repairing from peers, if any: until it is
    /// repaired the replica neither votes nor acknowledges.
    pub repairing: Option<(Lsn, Lsn)>,
    /// Times this replica told a follower (or a candidate) behind its log start to start
    /// its log again there ([`chorus_core::replica::Message::Rebase`]), since the group
    /// opened.
    pub rebases_sent: u64,
    /// Appends whose outcome became unknown because their replica fell behind the leader's
    /// log start before learning it ([`Error::OutcomeUnknown`]), since the group opened.
    pub outcomes_unknown: u64,
}

/// Counters of one group (monotonic).
#[derive(Debug, Default)]
pub struct GroupCounters {
    /// Appends accepted.
    pub appends: AtomicU64,
    /// Payload bytes accepted.
    pub append_bytes: AtomicU64,
    /// Appends that committed.
    pub committed: AtomicU64,
    /// Appends that failed.
    pub failed: AtomicU64,
    /// Bytes written to the log.
    pub log_bytes: AtomicU64,
    /// Log writes (one per batch of groups).
    pub log_writes: AtomicU64,
    /// Log fdatasyncs.
    pub fsyncs: AtomicU64,
    /// Total nanoseconds spent in log fdatasync.
    pub fsync_nanos: AtomicU64,
    /// Meta saves.
    pub meta_saves: AtomicU64,
    /// Inputs the replica dropped.
    pub drops: AtomicU64,
    /// Gap resends asked for by earlier incarnations of the replica (a repair restarts
    /// it); [`GroupStatus::gap_resend_requests`] adds the current one's.
    pub gap_resends_before: AtomicU64,
    /// Timed resends of earlier incarnations of the replica, as `gap_resends_before`.
    pub timed_resends_before: AtomicU64,
    /// Rebases sent by earlier incarnations of the replica, as `gap_resends_before`.
    pub rebases_sent_before: AtomicU64,
    /// Times this replica's log was started again at its leader's log start because it
    /// had fallen behind it (the leader had trimmed what it needed).
    pub rebased: AtomicU64,
    /// Damaged log ranges replaced with a peer's copy.
    pub repaired: AtomicU64,
    /// Appends whose outcome became unknown because the log they were written at was
    /// trimmed on the leader before this replica learned it ([`Error::OutcomeUnknown`]).
    pub unknown: AtomicU64,
    /// Rounds that ran longer than a heartbeat interval.
    pub slow_rounds: AtomicU64,
    /// Leader: from an append's acceptance (`append` on the group) to its result (committed
    /// or failed), per record: exported as `chorus_append_seconds`.
    pub append_latency: crate::metrics::Histogram,
}

/// An accepted append: its LSN and CSN at once, and its result later.
#[derive(Debug)]
pub struct Appended {
    /// The record's LSN.
    pub lsn: Lsn,
    /// The record's CSN.
    pub csn: Csn,
    /// Resolves once, to Committed or Failed.
    pub result: AppendFuture,
}

/// Resolves once to the append's outcome. If this replica stops before it knows (the
/// process shuts down, the group is removed or its storage fails) it resolves to
/// [`Error::Shutdown`]/[`Error::Stopped`]: the outcome is then unknown, as after a crash.
#[derive(Debug)]
pub struct AppendFuture {
    pub(super) rx: oneshot::Receiver<Result<AppendResult, Error>>,
    pub(super) group: GroupId,
}

impl AppendFuture {
    /// Blocks the calling thread until the result arrives. Do not call from inside an
    /// async runtime (await the future instead).
    pub fn wait(self) -> Result<AppendResult, Error> {
        let group = self.group;
        self.rx.blocking_recv().unwrap_or_else(|_| {
            Err(Error::Stopped {
                group,
                reason: "the replica stopped before the outcome was known".into(),
            })
        })
    }
}

impl Future for AppendFuture {
    type Output = Result<AppendResult, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let group = self.group;
        Pin::new(&mut self.rx).poll(cx).map(|r| {
            r.unwrap_or_else(|_| {
                Err(Error::Stopped {
                    group,
                    reason: "the replica stopped before the outcome was known".into(),
                })
            })
        })
    }
}
