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
//!
//! # Code layout
//!
//! This module holds the configuration and result types, the replica's state, its
//! constructors and accessors, and the entry points [`Replica::tick`] and
//! [`Replica::receive`]; each part of the protocol is a private child module adding its
//! methods to [`Replica`]: `action` (what the driver is asked to do), `storage` (meta
//! saves, flushes, reads and writes of the local log), `election` (priorities, leases,
//! promises), `reconfirm` (a candidate's reconfirmation of the log), `leader`
//! (replication, heartbeats, resends), `follower` (taking groups from a leader),
//! `commit` (the commit point and explicit results), `append` (appends and lanes),
//! `mirror` (access modes and mirrored groups), `membership`, `transfer` (leader transfer
//! and fail-back) and `repair` (protocol-aware recovery of a damaged range). The log
//! index (`log`) and the messages ([`message`]) are modules of their own; quorum
//! arithmetic (majorities, the joint commit point of a change) is [`crate::quorum`],
//! shared with the out-of-order replica.
//!
//! [`AccessMode::RawWrite`]: crate::format::meta::AccessMode::RawWrite

mod action;
mod append;
mod commit;
mod election;
mod follower;
mod leader;
mod log;
mod membership;
pub mod message;
mod mirror;
mod reconfirm;
mod repair;
mod storage;
mod transfer;

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::format::group::ChainPoint;
use crate::format::meta::{Membership, MetaRecord, NodeId};
use crate::quorum::Quorum;
use crate::rng::Rng;
use crate::{Csn, Lsn};

use append::PendingGroup;
use election::{Campaign, CampaignPhase};
use leader::Leading;
use log::LogView;
use repair::RepairState;
use storage::Deferred;

pub use action::{Action, ReadPurpose};
pub use append::{AppendError, Lane};
pub use log::{GroupMeta, RecoveredLog};
pub use membership::{ChangeError, MembershipChange};
pub use message::{LogPos, Message, Priority};
pub use mirror::MirrorError;

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

/// What a replica heard of another node.
#[derive(Clone, Debug, Default)]
struct PeerInfo {
    /// When it was last heard from.
    last_heard: Option<Nanos>,
    /// Advertised priority, if the peer is a voter of its own membership.
    prio: Option<Priority>,
}

/// One replica of a log group. See the module docs.
#[derive(Debug)]
pub struct Replica {
    /// Settings (only the priority changes, by [`Replica::set_priority`]).
    cfg: ReplicaConfig,
    /// The latest time any input carried: never goes back.
    now: Nanos,
    /// The election back-off's randomness.
    rng: Rng,
    /// The current role: [`Role::Candidate`] exactly while campaigning, [`Role::Leader`]
    /// exactly while serving, [`Role::PendingFollower`] only while groups of its own
    /// wait for a result.
    role: Role,
    /// Durable meta: never ahead of `meta_want` (its promise and membership version only
    /// grow).
    meta: MetaRecord,
    /// Meta as it should be (`meta` once saved).
    meta_want: MetaRecord,
    /// The number of the last meta save handed out.
    meta_seq: u64,
    /// The meta save in flight, at most one: `meta_seq` when there is one.
    meta_inflight: Option<u64>,
    /// The record of the meta save in flight: `Some` exactly while `meta_inflight` is.
    saved_snapshot: Option<MetaRecord>,
    /// Steps waiting for a promise to be durable (an acknowledgement of a prepare, our
    /// own campaign's prepare).
    deferred: Vec<Deferred>,
    /// The log as the replica sees it: its committed and flushed ends are within its end.
    log: LogView,
    /// The leader this replica follows (itself while leading).
    leader: Option<NodeId>,
    /// The proposal id of the leader followed (its own while leading, 0 when none): never
    /// above the promise.
    leader_pid: u64,
    /// The end of the prefix of our log known to match the leader's: within our log.
    matched_end: Lsn,
    /// The commit point the followed leader published, as far as it has reached us (0
    /// when a new leader is followed).
    leader_committed: Lsn,
    /// Until then this replica neither campaigns nor promises any candidate but
    /// `lease_holder` (a transfer aside): a lease it granted, or heard a leader hold.
    lease_until: Nanos,
    /// Whom `lease_until` protects: the leader heard, or the candidate granted.
    lease_holder: Option<NodeId>,
    /// The newest timestamp of the followed leader's messages, echoed in acknowledgements
    /// (the leader's lease).
    last_leader_ts: Nanos,
    /// What this replica heard of each other node; never itself.
    peers: BTreeMap<NodeId, PeerInfo>,
    /// The highest proposal id seen (in promises, pings, prepares and appends).
    max_seen_pid: u64,
    /// No campaign before this (after one was abandoned).
    backoff_until: Nanos,
    /// When pings last went out.
    last_ping: Nanos,
    /// The campaign under way: `Some` from its start until the new leader serves (or it is
    /// given up).
    campaign: Option<Campaign>,
    /// Leader state, from StartWorking on: this replica follows itself under the
    /// leader's proposal id, and serves exactly once its campaign is over.
    leading: Option<Leading>,
    /// Sealed groups of this replica waiting for their result, by LSN: none below the
    /// committed end (a committed end past a group decides it).
    pending: VecDeque<PendingGroup>,
    /// The id of the next append's ticket.
    next_ticket: u64,
    /// The highest CSN handed out or seen: at least that of the log's last group.
    last_csn: Csn,
    /// Appends that arrived past our log end, by the LSN they continue from, at most
    /// [`ReplicaConfig::max_buffered_appends`]: taken once the log reaches them.
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
    /// Why the replica halted, if it did: from then on it takes no tick, message or
    /// append.
    halted: Option<String>,
    /// Storage failed: no acknowledgement or vote until the driver reopens the replica.
    storage_failed: bool,
    /// The damaged range being repaired: meanwhile the replica neither leads nor
    /// campaigns.
    repairing: Option<RepairState>,
    /// The tail reserved for lock-free appends, if any (see [`Lane`]): only on the
    /// serving leader, at its log end, with no group open.
    lane: Option<Lane>,
    /// Inputs dropped, by reason.
    drops: BTreeMap<&'static str, u64>,
    /// Outputs not yet taken by the driver.
    actions: Vec<Action>,
}

impl Replica {
    /// Builds a replica from its durable meta and its recovered log at time `now`.
    ///
    /// Follower recovery (piggyback paper section 5.2): the log below `log.committed` is
    /// known committed; the rest is undecided until a leader confirms or overrides it.
    pub fn new(cfg: ReplicaConfig, meta: MetaRecord, log: RecoveredLog, now: Nanos) -> Self {
        let log = LogView::new(log, cfg.cache_bytes);
        let last_csn = log.chain.max_csn;
        let max_seen_pid = meta.vote.promised_proposal_id;
        let rng = Rng::new(cfg.seed ^ cfg.id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ now);
        let committed = log.committed;
        let mut r = Self {
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
        let csn = r.log.csn_at(committed);
        r.actions.push(Action::Commit {
            end: committed,
            csn,
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

    /// The largest CSN below the committed end: this replica's readable CSN once its
    /// log holds the committed end (PALF section 4.2, follower reads), as the last
    /// [`Action::Commit`] carried it. Never more than the truth.
    pub fn committed_csn(&self) -> Csn {
        self.log.csn_at(self.log.committed)
    }

    /// The role as [`Action::Role`] reports it: the role, the proposal id it is held
    /// under (a candidate's, the one it campaigns with) and the leader followed (itself
    /// when leading). The leader can change while the role does not (a follower hearing
    /// a new leader): a watcher of roles compares this after each step.
    pub fn role_info(&self) -> (Role, u64, Option<NodeId>) {
        let pid = self
            .proposal_id()
            .max(self.campaign.as_ref().map_or(0, |c| c.pid));
        (self.role, pid, self.leader())
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

    /// A majority of the voters of the membership as it should be (`meta_want`): who must
    /// agree for a vote, a prepare, a lease or a config to count. Only the commit point
    /// also counts the previous voters during a change (`commit`).
    fn voters_quorum(&self) -> Quorum {
        Quorum::majority(self.meta_want.membership.voters.clone())
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
            let (role, pid, leader) = self.role_info();
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

    /// Asserts the cheap invariants stated on the fields (those that take no walk over
    /// the log or the pending appends). Compiled in debug builds only; called at the top
    /// of the main inputs.
    #[cfg(debug_assertions)]
    fn check_invariants(&self) {
        let (committed, end) = (self.log.committed, self.log.end());
        assert!(
            committed <= end && self.log.flushed <= end,
            "committed end {committed} and flushed end {} within the log end {end}",
            self.log.flushed
        );
        assert!(
            self.matched_end <= end,
            "matched end {} past the log end {end}",
            self.matched_end
        );
        assert!(
            self.last_csn >= self.log.chain.max_csn,
            "the last CSN handed out is behind the log's"
        );
        let (durable, wanted) = (&self.meta, &self.meta_want);
        assert!(
            durable.vote.promised_proposal_id <= wanted.vote.promised_proposal_id
                && durable.membership.version <= wanted.membership.version,
            "the durable meta is ahead of the wanted one"
        );
        assert!(
            self.leader_pid <= wanted.vote.promised_proposal_id,
            "following a proposal id above the promise"
        );
        assert_eq!(
            self.meta_inflight.is_some(),
            self.saved_snapshot.is_some(),
            "a meta save in flight exactly while its record is kept"
        );
        assert!(self.meta_inflight.is_none_or(|s| s == self.meta_seq));
        assert!(
            self.pending.front().is_none_or(|g| g.lsn >= committed),
            "a pending group below the committed end {committed} is undecided"
        );
        assert!(
            self.role != Role::PendingFollower || !self.pending.is_empty(),
            "a pending follower with no pending group"
        );
        assert_eq!(
            self.role == Role::Candidate,
            self.campaign.is_some(),
            "the role is Candidate exactly while campaigning"
        );
        assert_eq!(
            self.role == Role::Leader,
            self.leading.as_ref().is_some_and(|l| l.serving),
            "the role is Leader exactly while serving"
        );
        assert!(
            !self.peers.contains_key(&self.cfg.id),
            "a replica among its own peers"
        );
        assert!(
            self.repairing.is_none() || (self.leading.is_none() && self.campaign.is_none()),
            "a replica under repair leads or campaigns"
        );
        if let Some(l) = &self.leading {
            assert_eq!(self.leader, Some(self.cfg.id), "a leader follows itself");
            assert_eq!(
                self.leader_pid, l.pid,
                "a leader follows its own proposal id"
            );
            assert_eq!(
                l.serving,
                self.campaign.is_none(),
                "a leader serves once its campaign is over"
            );
            assert!(
                l.published_commit <= committed,
                "a published commit point past the committed end"
            );
            assert!(
                l.progress.values().all(|p| p.matched <= end),
                "a follower matched past the leader's end {end}"
            );
        }
        if let Some(lane) = &self.lane {
            assert!(
                self.leading
                    .as_ref()
                    .is_some_and(|l| l.serving && l.pid == lane.pid && l.open.is_none())
                    && lane.lsn == end,
                "an open lane not at the serving leader's log end"
            );
        }
    }

    #[cfg(not(debug_assertions))]
    fn check_invariants(&self) {}

    // ---------------------------------------------------------------- inputs

    /// The user-set priority changed (takes effect in the next ping).
    pub fn set_priority(&mut self, priority: u32) {
        self.abandon_lane();
        self.cfg.priority = priority;
    }

    /// Advances time: pings, elections, leases, heartbeats, freezing, resends.
    pub fn tick(&mut self, now: Nanos) {
        self.check_invariants();
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
        self.check_invariants();
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
                config,
            } => self.on_rebase(from, pid, ts, base, base_pid, committed, config),
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
}
