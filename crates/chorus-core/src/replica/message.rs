//! Messages between replicas of one log group.
//!
//! These are the protocol's vocabulary; their wire encoding is
//! [`crate::format::wire`]. Every field a receiver acts on is checked by the receiver (drops are
//! counted in [`super::Replica::drops`]): a message is a claim, not a fact.

use crate::format::group::ChainPoint;
use crate::format::meta::{ConfigVersion, Membership, NodeId};
use crate::Lsn;

use super::Nanos;

/// A replica's election priority. Ordered: config version first (PALF section 5.3: a
/// replica with an older membership must never win, which rules out Fig. 8b), then the
/// user-set priority, then the lower node id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Priority {
    /// Version of the membership the replica holds.
    pub config_version: ConfigVersion,
    /// User-set priority; higher wins.
    pub priority: u32,
    /// The replica's id (tie-break: the lower id wins).
    pub id: NodeId,
}

impl Ord for Priority {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.config_version
            .cmp(&other.config_version)
            .then(self.priority.cmp(&other.priority))
            .then(other.id.cmp(&self.id))
    }
}

impl PartialOrd for Priority {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// A position in the log: an LSN at a group boundary and the accumulated checksum of the
/// log up to it. Two logs with equal positions hold the same bytes below it (the
/// accumulated checksum chains every group's data checksum), which is how a follower checks
/// that the groups it receives continue its own log (Raft's log matching).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LogPos {
    /// The LSN (a group boundary).
    pub lsn: Lsn,
    /// The accumulated checksum at `lsn`.
    pub acc: u32,
}

/// A message between two replicas of one group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    /// Periodic liveness and priority broadcast; the election reads it.
    Ping {
        /// The sender's priority.
        prio: Priority,
        /// The highest proposal id the sender has seen.
        max_pid: u64,
        /// Whom the sender follows, if anyone.
        leader: Option<NodeId>,
        /// Whether the sender is a voter of its own membership (only voters may lead, so
        /// only they can outrank a candidate).
        voter: bool,
    },
    /// Phase 1 of log reconfirmation (PALF Alg. 1 line 2): promise `pid`.
    Prepare {
        /// The candidate's new proposal id.
        pid: u64,
        /// The candidate's priority.
        prio: Priority,
        /// Sent because the leader handed over (leader transfer): ignore the lease.
        transfer: bool,
        /// The candidate's clock when sent (echoed for its lease).
        ts: Nanos,
    },
    /// Answer to [`Message::Prepare`], sent only after the promise is durable.
    PrepareAck {
        /// The proposal id answered.
        pid: u64,
        /// Whether the promise was made.
        granted: bool,
        /// The highest proposal id the sender has promised.
        promised: u64,
        /// The sender's flushed end LSN.
        end: Lsn,
        /// Proposal id of the group ending at `end` (0 for an empty log).
        last_pid: u64,
        /// The sender's committed end LSN.
        committed: Lsn,
        /// The candidate's `ts`, echoed.
        ts: Nanos,
    },
    /// Phase 2 of reconfirmation: the candidate asks the replica with the longest log for
    /// its groups from `from`.
    Fetch {
        /// The candidate's proposal id.
        pid: u64,
        /// Where to start (a group boundary the candidate holds).
        from: LogPos,
        /// Byte budget of the answer.
        max_bytes: u32,
    },
    /// Answer to [`Message::Fetch`]: flushed groups continuing `prev`.
    FetchResp {
        /// The candidate's proposal id, echoed.
        pid: u64,
        /// What the groups continue.
        prev: LogPos,
        /// Whole groups, back to back.
        groups: Vec<u8>,
        /// The sender's flushed end.
        end: Lsn,
    },
    /// Replication (and heartbeat when `groups` is empty).
    Append {
        /// The leader's proposal id.
        pid: u64,
        /// The leader's clock when sent (echoed for its lease).
        ts: Nanos,
        /// What the groups continue.
        prev: LogPos,
        /// Whole groups, back to back.
        groups: Vec<u8>,
        /// The leader's log end when sent.
        leader_end: Lsn,
        /// The leader's published committed end LSN.
        committed: Lsn,
        /// A membership the follower should adopt once its log reaches the barrier.
        config: Option<Membership>,
    },
    /// Answer to [`Message::Append`] and report of newly flushed log.
    AppendAck {
        /// The proposal id the follower follows (or has promised, when it refuses).
        pid: u64,
        /// The leader's `ts`, echoed.
        ts: Nanos,
        /// `false` when `prev` did not match (see `hint`) or the pid was stale.
        success: bool,
        /// End of the prefix that matches the leader's log and is flushed.
        matched: Lsn,
        /// On mismatch: the follower's log end, a place to retry from.
        hint: Lsn,
        /// The follower's committed end (always a safe place to retry from).
        committed: Lsn,
        /// The durable config version of the follower.
        config_version: ConfigVersion,
    },
    /// Leader transfer: the receiver should campaign at once.
    TimeoutNow {
        /// The handing-over leader's proposal id.
        pid: u64,
    },
    /// Protocol-aware repair: a replica whose log has a damaged range asks for a copy.
    RepairRequest {
        /// First LSN of the damaged range (a group boundary).
        from: Lsn,
        /// LSN where the next valid group starts.
        to: Lsn,
    },
    /// Answer to [`Message::RepairRequest`]: the exact bytes of `from..to`, or none.
    RepairResp {
        /// First LSN, echoed.
        from: Lsn,
        /// End LSN, echoed.
        to: Lsn,
        /// Whole groups covering exactly `from..to` when `have`.
        bytes: Vec<u8>,
        /// Whether the sender holds a copy. `have` with no `bytes`: it holds some or all
        /// of the range (or had it and trimmed it) but cannot send it whole now, so the
        /// range may be committed: ask again later. Only `have` and `damaged` both unset
        /// says the sender's log cleanly lacks the range (it ends at or before `from`).
        have: bool,
        /// The sender's own copy is damaged too (it is repairing).
        damaged: bool,
    },
    /// Catch-up past the sender's log start: the receiver needs groups the sender trimmed
    /// (the database's checkpoint let it delete them). Everything below `base` is
    /// committed, so a receiver whose log neither holds `base` nor reaches it restarts its
    /// log empty at `base` (Raft's snapshot install, with the state kept by the database
    /// outside the log; PALF's rebuild). Sent by a leader to a follower behind its start,
    /// and by a replica answering a candidate's [`Message::Fetch`] from below its start.
    Rebase {
        /// The leader's proposal id, or the candidate's when answering a fetch.
        pid: u64,
        /// The leader's clock when sent (echoed for its lease; 0 when answering a fetch).
        ts: Nanos,
        /// The chain point at the sender's log start, a group boundary at or below its
        /// committed end.
        base: ChainPoint,
        /// Proposal id of the group ending at `base` (0 if unknown: an understated log
        /// only loses elections).
        base_pid: u64,
        /// The sender's committed end (at least `base.end_lsn`).
        committed: Lsn,
        /// A leader's membership, attached (as on [`Message::Append`]) while the follower
        /// has not acknowledged it: a follower whose membership predates the leader's
        /// takes the sender for a leader only if a newer membership names it a voter, and
        /// one that lagged behind a new voter's start hears only rebases from it.
        config: Option<Membership>,
    },
}

impl Message {
    /// A short name for logs and counters.
    pub fn kind(&self) -> &'static str {
        match self {
            Message::Ping { .. } => "ping",
            Message::Prepare { .. } => "prepare",
            Message::PrepareAck { .. } => "prepare_ack",
            Message::Fetch { .. } => "fetch",
            Message::FetchResp { .. } => "fetch_resp",
            Message::Append { .. } => "append",
            Message::AppendAck { .. } => "append_ack",
            Message::TimeoutNow { .. } => "timeout_now",
            Message::RepairRequest { .. } => "repair_request",
            Message::RepairResp { .. } => "repair_resp",
            Message::Rebase { .. } => "rebase",
        }
    }

    /// Bytes of log data carried (for accounting).
    pub fn payload_len(&self) -> usize {
        match self {
            Message::Append { groups, .. } | Message::FetchResp { groups, .. } => groups.len(),
            Message::RepairResp { bytes, .. } => bytes.len(),
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priority_orders_config_version_first() {
        let p = |v: u64, pr: u32, id: NodeId| Priority {
            config_version: ConfigVersion {
                proposal_id: v,
                seq: 0,
            },
            priority: pr,
            id,
        };
        assert!(p(2, 0, 5) > p(1, 100, 1));
        assert!(p(1, 5, 9) > p(1, 4, 1));
        assert!(p(1, 5, 1) > p(1, 5, 2));
    }
}
