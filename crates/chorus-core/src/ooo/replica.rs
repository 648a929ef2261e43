//! The replica of an out-of-order group (parallel or dependent mode) as a pure state
//! machine, driven like [`crate::replica::Replica`]: inputs are method calls carrying the
//! time, outputs are [`Action`]s the driver drains with [`OooReplica::take_actions`] and
//! executes **in order**. A [`Action::SaveHard`] or [`Action::Write`] must be durable
//! before the driver executes the next action, so a message that follows a write in the
//! list (an acknowledgement, a vote) never reaches anyone before what it promises is on
//! disk (durability first; a driver may batch writes into one sync as long as it syncs
//! before the next action that depends on them).
//!
//! One exception lets the leader's fsync overlap its followers': a [`Msg::Append`] (sent
//! only by a leader) may go out before the writes ahead of it are synced. It promises
//! nothing about the leader's disk — it carries entries and the commit window — and the
//! leader counts its own copy of a slot in a majority only when a follower's
//! acknowledgement of that slot is processed, which happens in a later input, after the
//! driver synced the writes of the input that sent it (a driver must finish an input's
//! sync before handling the next input's actions). A window it carries only names slots
//! decided that way. The simulator runs its drivers with this exception, crashing between
//! the send and the sync.
//!
//! A second exception: an [`Action::Result`] or [`Action::Unknown`] may be executed
//! before the writes ahead of it are synced. An outcome depends on no write of this
//! replica that is not yet durable: a slot is committed only from durable copies (a
//! follower acknowledges after its sync, the leader counts its own copy from
//! [`OooReplica::persisted`], a follower learns commits from such a leader's window), and
//! whether the committed entry is this append's is read off that committed version. So a
//! leader tells its writer as soon as a majority has the entry, not one local fsync of
//! unrelated appends later. The simulator runs its drivers with this exception too.
//!
//! # Protocol
//!
//! * **Entries** occupy slots numbered by [`Seq`]. Each carries the term of the leader
//!   that last wrote it, `start` (the first slot after that leader's merge, see below),
//!   an identity `eid` that survives re-stamping, and the mode's metadata: block ranges and
//!   the look-behind buffer (ParallelRaft, PolarFS section 5.2) or the window base, RAW and
//!   WAW predecessors and write set (DP-Raft section 4.2). A NULL entry fills a slot a
//!   merge decided holds nothing.
//! * **Election** is Raft's: randomised timeouts, one vote per term saved before it is
//!   sent, and DP-Raft's vote rule (section 4.4: newer last entry, then a first
//!   uncommitted entry not behind the voter's). A granted vote carries the voter's
//!   versions of every slot from the candidate's first uncommitted slot on: the merge
//!   needs nothing else. A campaign is preceded by a **pre-vote** (Raft thesis section
//!   9.6; [`OooConfig::pre_vote`]): the replica asks whether it could win at the next
//!   term without raising its own, and a voter says yes only if its vote rule would
//!   grant and it has not heard a leader within an election timeout. A replica that
//!   cannot win (its log behind, or cut off and back) so never raises the term, and
//!   neither deposes a serving leader nor splits the votes of those that can win.
//! * **Merge** (ParallelRaft's merge stage, DP-Raft's pre-leader merge, Fig. 4) with a
//!   majority of answers, after [`merge::drop_superseded`]: every decided slot is
//!   re-stamped at the new term (same identity and contents, a fresh look-behind buffer
//!   of nothing), NULL slots are written as NULL entries at the new term (the ghost
//!   guard), and the leader serves only once every merged slot has a majority — all
//!   commit together, so dependencies among them hold trivially.
//! * **Replication**: the leader writes an entry, then sends it; followers write what they
//!   receive (holes and all), then acknowledge each slot. Slots a follower lacks from its
//!   first uncommitted slot on are resent every `resend_interval`.
//! * **Commit**: the leader commits a slot when a majority has it and (dependent mode)
//!   its RAW predecessors are committed ([`DepLeader`], Algorithm 1; parallel mode has no
//!   RAW predecessors, so the rule is a majority). Its [`CommitWindow`] travels on every
//!   append and heartbeat. A follower takes a slot as committed only if it holds the
//!   version it received from the leader of that same term: an older version of the slot
//!   it still holds from a deposed leader is never taken for the committed one.
//! * **Apply**: only committed slots enter the apply rules ([`ParallelApplier`],
//!   [`DepApplier`]); their look-behind buffers and dependencies describe the final
//!   versions of their predecessors, which `drop_superseded` guarantees. The replica
//!   emits [`Action::Apply`] for entries whose predecessors allow it — mutually
//!   independent, so a driver may run them on several threads — and the driver reports
//!   each with [`OooReplica::applied`].
//! * **Explicit results**: an append ends in [`Outcome::Committed`] when its slot commits
//!   with its identity, [`Outcome::Failed`] when the slot commits with anything else. A
//!   leader that steps down keeps its pending appends and decides them as it learns the
//!   commits (a pending follower, PALF section 4.1); a commit is final, so no append is
//!   ever Failed and then Committed.
//! * **Leader transfer** ([`OooReplica::transfer_leader`]): the leader stops taking
//!   appends, waits until everything it has is committed and the target reports a first
//!   uncommitted slot at its end (so the target's vote log is as new as any voter's and
//!   it wins), then sends [`Msg::TimeoutNow`]; the target campaigns at once and merges
//!   as any new leader. Given up after an election timeout. It only moves a campaign
//!   earlier, so the safety argument is unchanged.
//! * **Membership changes** ([`OooReplica::change_membership`], [`Membership`]): kept
//!   outside the log and saved on their own ([`Action::SaveMembership`]); a joint stage
//!   (majorities of the old and the new voters for every decision) then a final one,
//!   each accepted by a majority before the next; appends go on throughout. Votes
//!   compare membership epochs, a leader re-stamps its membership at election, and a
//!   follower takes entries only under the leader's membership epoch, so log order and
//!   membership order never disagree.
//! * **Restart**: the driver hands back the saved [`Hard`] state and the entries on disk.
//!   The saved committed head is a lower bound (it is saved after the writes it covers);
//!   the replica re-applies its committed prefix, so a state machine rebuilt from nothing
//!   replays the log. A replica whose synced entries went bad on disk restarts from
//!   [`Hard::after_loss`] and stays out of elections until it holds again what it may
//!   have acknowledged (it asks its leader where the slots end, [`Msg::AskEnd`]).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use super::dependent::{grants_vote, DepApplier, DepLeader, Deps, VoteLog, WAW_TRAIL};
use super::merge::{self, MergeOptions, Version};
use super::parallel::{BlockRange, LookBehind, ParallelApplier, Stamped};
use super::{CommitWindow, OooError, Quorum, Seq};
use crate::format::meta::NodeId;
use crate::replica::{Nanos, Outcome, Role};
use crate::rng::Rng;
use crate::rtt::RttWindow;

/// The out-of-order mode of a group, chosen at creation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// ParallelRaft: block ranges, a look-behind buffer of `span` entries.
    Parallel {
        /// The look-behind span N (the paper's default is 2).
        span: usize,
    },
    /// DP-Raft: read and write sets.
    Dependent,
}

/// An entry's contents besides its slot, term and identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Body {
    /// A merge decided the slot holds nothing.
    Null,
    /// A parallel-mode record.
    Parallel {
        /// Blocks it writes.
        ranges: Vec<BlockRange>,
        /// `look_behind[i]`: the ranges of slot `seq - 1 - i`, as its leader had it.
        look_behind: Vec<Vec<BlockRange>>,
        /// Conflict order ([`OooConfig::conflict_order`]): the uncommitted earlier slots
        /// whose blocks overlap this entry's (or every one in flight, for an entry with
        /// too many blocks to list) that its leader made it wait for, ascending; empty
        /// otherwise. A merge that makes one of them NULL makes this entry NULL too, as
        /// dependent mode does along RAW predecessors: it cannot have committed first.
        after: Vec<Seq>,
        /// The record, shared: the replica hands one entry to its write, its sends, its
        /// commit and its apply, and a clone must not copy a 128 KiB group.
        data: Arc<[u8]>,
    },
    /// A dependent-mode record.
    Dependent {
        /// The leader's window head when it admitted the entry.
        base: Seq,
        /// RAW and WAW predecessors.
        deps: Deps,
        /// Keys it writes.
        write_set: Vec<u64>,
        /// The record, shared: the replica hands one entry to its write, its sends, its
        /// commit and its apply, and a clone must not copy a 128 KiB group.
        data: Arc<[u8]>,
    },
}

/// One slot's entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The slot.
    pub seq: Seq,
    /// Term of the leader that wrote this version.
    pub term: u64,
    /// First slot after the merge of that leader ([`merge::drop_superseded`]).
    pub start: Seq,
    /// Identity of the record, kept when a merge re-stamps it; 0 for NULL.
    pub eid: u64,
    /// Contents.
    pub body: Body,
}

impl Entry {
    fn null(seq: Seq, term: u64, start: Seq) -> Self {
        Self {
            seq,
            term,
            start,
            eid: 0,
            body: Body::Null,
        }
    }

    /// Whether this is a NULL entry.
    pub fn is_null(&self) -> bool {
        matches!(self.body, Body::Null)
    }

    /// The record's bytes (empty for NULL).
    pub fn data(&self) -> &[u8] {
        match &self.body {
            Body::Null => &[],
            Body::Parallel { data, .. } | Body::Dependent { data, .. } => data,
        }
    }

    fn version(&self, committed: bool) -> Version {
        Version {
            term: self.term,
            id: self.eid,
            null: self.is_null(),
            committed,
            after: match &self.body {
                Body::Dependent { deps, .. } => deps.raw.clone(),
                Body::Parallel { after, .. } => after.clone(),
                Body::Null => Vec::new(),
            },
        }
    }

    /// The same record under a new leader: new term and start, no look-behind buffer
    /// (the predecessors it described may have been decided differently).
    fn restamp(&self, term: u64, start: Seq) -> Self {
        let mut e = self.clone();
        e.term = term;
        e.start = start;
        if let Body::Parallel { look_behind, .. } = &mut e.body {
            look_behind.clear();
        }
        e
    }
}

/// What an appender declares about a record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Declared {
    /// Parallel mode: the blocks it writes.
    Blocks(Vec<BlockRange>),
    /// Dependent mode: the keys it read and writes.
    Txn {
        /// Keys read.
        read_set: Vec<u64>,
        /// Keys written.
        write_set: Vec<u64>,
    },
}

/// What a run of entries wrote: the blocks (parallel mode) and keys (dependent mode). A
/// partial image carries the state of a footprint only (PolarFS section 5.3, fast
/// catch-up: holes "already checkpointed" are filled from the leader's data, and only the
/// data they wrote need travel).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Footprint {
    /// Blocks written: ascending, disjoint, none adjacent to the next.
    pub blocks: Vec<BlockRange>,
    /// Keys written: ascending, distinct.
    pub keys: Vec<u64>,
}

impl Footprint {
    /// What `e` writes (nothing for NULL).
    pub fn of(e: &Entry) -> Self {
        let mut f = Self::default();
        f.add_entry(e);
        f
    }

    fn add_entry(&mut self, e: &Entry) {
        match &e.body {
            Body::Null => {}
            Body::Parallel { ranges, .. } => self.add_blocks(ranges),
            Body::Dependent { write_set, .. } => self.add_keys(write_set),
        }
    }

    /// Adds `other`'s blocks and keys.
    pub fn add(&mut self, other: &Footprint) {
        self.add_blocks(&other.blocks);
        self.add_keys(&other.keys);
    }

    fn add_blocks(&mut self, ranges: &[BlockRange]) {
        if ranges.is_empty() {
            return;
        }
        let mut all: Vec<BlockRange> = self.blocks.iter().chain(ranges).copied().collect();
        all.sort_by_key(|r| r.start);
        let mut out: Vec<BlockRange> = Vec::with_capacity(all.len());
        for r in all {
            match out.last_mut() {
                Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
                _ => out.push(r),
            }
        }
        self.blocks = out;
    }

    fn add_keys(&mut self, keys: &[u64]) {
        if keys.is_empty() {
            return;
        }
        self.keys.extend_from_slice(keys);
        self.keys.sort_unstable();
        self.keys.dedup();
    }

    /// Blocks plus keys named.
    pub fn items(&self) -> u64 {
        self.blocks
            .iter()
            .map(|r| r.end - r.start)
            .sum::<u64>()
            .saturating_add(self.keys.len() as u64)
    }

    /// Whether it names nothing.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty() && self.keys.is_empty()
    }
}

/// State that must survive a restart.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Hard {
    /// Current term.
    pub term: u64,
    /// Whom this replica voted for in `term`.
    pub voted_for: Option<NodeId>,
    /// Every slot below is committed with the version on disk (a lower bound).
    pub committed_head: Seq,
    /// The newest leader this replica accepted entries from, as (term, first slot after
    /// its merge): versions of older terms from that slot on are dead
    /// ([`merge::drop_superseded`]).
    pub leader_start: (u64, Seq),
    /// Every slot below is compacted: applied, and covered by the state machine's durable
    /// image (a checkpoint the driver took, or a snapshot it installed), so the entries
    /// are no longer kept. Saved only after that image is durable.
    pub base: Seq,
    /// Not 0 while the replica is recovering entries it lost on disk ([`Hard::after_loss`]):
    /// it may have acknowledged, in terms below this one, slots it no longer holds, so
    /// it neither votes nor campaigns until every slot below a bound a leader gave it is
    /// committed on it (protocol-aware recovery, Alagappan et al., FAST 2018). 0
    /// otherwise.
    pub lost_below: u64,
}

impl Hard {
    /// The hard state of a replica that found synced entries damaged on disk, to be saved
    /// before the damaged records are dropped and the replica recovers from it.
    ///
    /// `lost_below` becomes the term after the saved one (term and vote are kept: the
    /// vote is a promise the replica still holds). A replica that lost entries cannot
    /// tell which of its acknowledgements it can no longer back, so it must not take part
    /// in elections (a vote carries its versions into the winner's merge,
    /// [`Msg::VoteReply`]) until it holds again everything that might have been
    /// committed with them. Every such slot is below a bound it learns from a leader:
    ///
    /// - the end of the leader of its term or a later one ([`Msg::AskEnd`], asked at
    ///   once): that leader assigned, or merged from a quorum, every slot the replica was
    ///   ever sent; asking also makes it forget the replica's acknowledgements of slots
    ///   not yet committed, so no commit counts a lost copy from then on;
    /// - or the merge start of any leader of a later term ([`Hard::leader_start`]): that
    ///   election's quorum meets each commit quorum in a replica that acknowledged before
    ///   voting, so the merge kept the slot.
    ///
    /// The committed head falls to the base: a damaged record may have been a newer
    /// version of a slot whose older version survives, so no surviving version is taken
    /// as committed until a leader confirms it.
    pub fn after_loss(&self) -> Hard {
        Hard {
            committed_head: self.base,
            lost_below: self.term + 1,
            ..*self
        }
    }
}

/// The voters of an out-of-order group, kept beside the hard state rather than in the log
/// (PALF section 4.3 keeps its membership in meta storage too): entries do not have to be
/// decided before a change, and a change does not wait on a hole.
///
/// A change goes through two stages, each accepted before the next (Raft's joint
/// consensus): the **joint** membership (`prev` set: every decision — a vote won, a slot
/// committed, a merge done — needs a majority of the old voters *and* of the new), then
/// the **final** one (`prev` empty). A replica accepts the joint membership only once it
/// holds every slot below the leader's end when the change began (its first uncommitted
/// slot is past it), so the new voters hold what the old ones decided alone.
/// Versions order memberships; a replica never votes for a candidate whose membership is
/// of an earlier change (see `epoch`), and a leader re-stamps its membership with its
/// term once the group's voters have ever changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Membership {
    /// (term of the leader that set it, its count in that term); (0, 0) for the voters
    /// the group was created with.
    pub version: (u64, u64),
    /// The voters (after the change, in its joint stage).
    pub voters: Vec<NodeId>,
    /// During a change's joint stage: the voters before it.
    pub prev: Option<Vec<NodeId>>,
}

impl Membership {
    /// The voters a group was created with.
    pub fn initial(mut voters: Vec<NodeId>) -> Self {
        voters.sort_unstable();
        voters.dedup();
        Self {
            version: (0, 0),
            voters,
            prev: None,
        }
    }

    /// Who must agree to a decision under this membership.
    pub fn quorum(&self) -> Quorum {
        let mut sets = vec![self.voters.clone()];
        sets.extend(self.prev.clone());
        Quorum::Majorities(sets)
    }

    /// Whether `id` votes under this membership (in either stage's set).
    pub fn is_member(&self, id: NodeId) -> bool {
        self.voters.contains(&id) || self.prev.as_ref().is_some_and(|p| p.contains(&id))
    }

    /// Every voter of either set, ascending, each once.
    pub fn members(&self) -> Vec<NodeId> {
        let mut all: BTreeSet<NodeId> = self.voters.iter().copied().collect();
        all.extend(self.prev.iter().flatten().copied());
        all.into_iter().collect()
    }
}

/// The change a membership version belongs to: a leader numbers the joint stage of each
/// change it makes odd and the final stage the next even number, so both stages of one
/// change share an epoch. Votes compare epochs, not versions: once a change's joint stage
/// is accepted, a replica holding it may still win against one holding the final stage
/// (its joint quorum includes a majority of the new voters, so it sees whatever they
/// decided), and refusing it could leave no replica able to win — the final stage's
/// holders may lag in the log behind the joint stage's.
fn epoch(v: (u64, u64)) -> (u64, u64) {
    (v.0, v.1.div_ceil(2))
}

/// A change of an out-of-order group's voters ([`OooReplica::change_membership`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OooMembershipChange {
    /// Adds a voter (it catches up from the leader, by image if the log was compacted).
    AddVoter(NodeId),
    /// Removes a voter (the leader too: it steps down once the change is accepted).
    Remove(NodeId),
    /// Removes one voter and adds another in one change.
    Replace {
        /// The voter leaving.
        remove: NodeId,
        /// The voter joining.
        add: NodeId,
    },
}

/// Why a membership change was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OooChangeError {
    /// Only a serving leader changes the membership.
    #[error("not the serving leader (leader hint: {leader:?})")]
    NotLeader {
        /// The leader this replica follows, if any.
        leader: Option<NodeId>,
    },
    /// A change is still under way; one at a time.
    #[error("a membership change is under way (to voters {to:?})")]
    InProgress {
        /// The voters it moves to.
        to: Vec<NodeId>,
    },
    /// The change does not fit the voters (adding a voter, removing a non-voter, leaving
    /// none, node id 0).
    #[error("{detail} (voters {voters:?})")]
    Invalid {
        /// What was wrong.
        detail: String,
        /// The current voters.
        voters: Vec<NodeId>,
    },
}

/// Messages between replicas of an out-of-order group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Msg {
    /// A candidate asks for a vote.
    Vote {
        /// The candidate's term.
        term: u64,
        /// Its first uncommitted slot: answers start there.
        head: Seq,
        /// Its log, for the vote rule.
        log: VoteLog,
        /// Its [`Membership::version`]: a voter with a newer one refuses.
        config: (u64, u64),
    },
    /// The answer; a grant carries the voter's versions from the candidate's head on.
    VoteReply {
        /// The voter's term.
        term: u64,
        /// Whether the vote is granted.
        granted: bool,
        /// The voter's entries at or above the candidate's head, with whether it knows
        /// each committed.
        entries: Vec<(Entry, bool)>,
        /// The voter's [`Hard::leader_start`].
        leader_start: (u64, Seq),
    },
    /// Entries (none for a heartbeat) and the leader's commit window.
    Append {
        /// The leader's term.
        term: u64,
        /// The first slot after the leader's merge.
        start: Seq,
        /// Entries to write.
        entries: Vec<Entry>,
        /// What is committed.
        commits: CommitWindow,
        /// The leader's [`Membership::version`]: a follower holding a membership of an
        /// earlier change takes no entries until it has the leader's (so a replica whose
        /// log is newer never holds an older membership, and votes cannot deadlock
        /// between the two orders).
        config: (u64, u64),
    },
    /// A follower holds these slots (as the leader of `term` sent them) durably.
    Ack {
        /// The follower's term.
        term: u64,
        /// Slots and identities held.
        seqs: Vec<(Seq, u64)>,
        /// The follower's first uncommitted slot (resends start there).
        head: Seq,
        /// The follower's first unapplied slot: a partial image built for it covers what
        /// was written from there on ([`OooReplica::image_scope`]).
        applied: Seq,
    },
    /// A piece of the leader's state-machine image, for a follower whose first
    /// uncommitted slot the leader has compacted (PolarFS section 5.3, streaming catch-up:
    /// the data, in bounded pieces, then the log from the image's base on).
    Snapshot {
        /// The leader's term.
        term: u64,
        /// The image covers every slot below this one.
        base: Seq,
        /// Where this piece starts in the image.
        offset: u64,
        /// The image's length.
        total: u64,
        /// `Some(from)`: a partial image, holding only what the slots from `from` up to
        /// `base` wrote (PolarFS section 5.3's fast catch-up from the leader's data), for a
        /// follower that has applied every slot below `from`. `None`: the whole state.
        part: Option<Seq>,
        /// The piece.
        data: Vec<u8>,
    },
    /// Asks whether the sender could win an election at `term` (the next after its own;
    /// Raft thesis section 9.6): answered with [`Msg::PreVoteReply`], changing nothing.
    PreVote {
        /// The term the sender would campaign at.
        term: u64,
        /// Its log, for the vote rule.
        log: VoteLog,
        /// Its [`Membership::version`].
        config: (u64, u64),
    },
    /// The answer to a pre-vote.
    PreVoteReply {
        /// The term asked about if granted, else the voter's term.
        term: u64,
        /// Whether the voter would grant its vote.
        granted: bool,
    },
    /// Leader transfer: the leader of `term` has seen this follower hold and know
    /// committed every slot it has, and asks it to campaign now rather than after an
    /// election timeout (the ordered mode's transfer, PALF section 4; Raft's TimeoutNow).
    TimeoutNow {
        /// The leader's term.
        term: u64,
    },
    /// The leader's membership: the follower saves it and answers with
    /// [`Msg::ConfigAck`].
    Config {
        /// The leader's term.
        term: u64,
        /// The membership.
        membership: Membership,
    },
    /// The answer to a candidate whose membership is older than the voter's (it missed
    /// the leader's [`Msg::Config`]): the voter's membership, which the candidate takes.
    /// Memberships are only set by leaders, and taking a newer one is what the lost
    /// message would have done; a candidate that a change removed learns so and stops
    /// campaigning, and one that lagged stops splitting the votes of those that can win.
    Newer {
        /// The voter's membership.
        membership: Membership,
    },
    /// A follower recovering entries it lost on disk ([`Hard::after_loss`]) asks its
    /// leader where the leader's slots end, and tells it that acknowledgements it gave
    /// before may be gone: the leader forgets them (for commits and resends) — once per
    /// `nonce`, drawn at each restart, so that asking again (a lost answer) does not
    /// forget the acknowledgements given since.
    AskEnd {
        /// The follower's term.
        term: u64,
        /// Names the restart that lost the entries.
        nonce: u64,
    },
    /// The answer to [`Msg::AskEnd`]: the first slot the leader of `term` has not
    /// assigned. Every slot the asking replica may have acknowledged before its loss is
    /// below it.
    End {
        /// The leader's term.
        term: u64,
        /// Its next slot.
        end: Seq,
    },
    /// A follower holds this membership durably; `head` is its first uncommitted slot.
    ConfigAck {
        /// The follower's term.
        term: u64,
        /// The [`Membership::version`] it holds.
        version: (u64, u64),
        /// Its first uncommitted slot.
        head: Seq,
    },
}

/// Outputs of the replica, executed by the driver in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Save the hard state durably before the next action.
    SaveHard(Hard),
    /// Save the membership durably before the next action (it is handed back to
    /// [`OooReplica::recover`]).
    SaveMembership(Membership),
    /// Write this entry at its slot (replacing what is there) durably before the next
    /// action.
    Write(Entry),
    /// Send a message.
    Send {
        /// Destination.
        to: NodeId,
        /// The message.
        msg: Msg,
    },
    /// The slot is committed here with this entry (for observers; nothing to do).
    Committed(Entry),
    /// Apply this committed entry to the state machine, then call
    /// [`OooReplica::applied`]. Entries in flight together are independent.
    Apply(Entry),
    /// The final result of an append.
    Result {
        /// The append's identity (from its [`Ticket`]).
        eid: u64,
        /// Its slot.
        seq: Seq,
        /// Committed or Failed.
        outcome: Outcome,
    },
    /// The role changed.
    Role {
        /// The new role.
        role: Role,
        /// The term.
        term: u64,
    },
    /// The leader finished its merge: every slot below `start` is committed here, and it
    /// accepts appends from `start` on.
    Serving {
        /// The term.
        term: u64,
        /// First slot of new entries.
        start: Seq,
    },
    /// Slots below `base` are compacted (the [`Action::SaveHard`] naming it is ahead in
    /// the list): the driver may rewrite its entries file to hold only `live`, the
    /// entries of the slots from `base` on, latest version of each.
    Compact {
        /// First slot kept.
        base: Seq,
        /// What the rewritten file holds.
        live: Vec<Entry>,
    },
    /// Leader: follower `to` needs slots this replica compacted. The driver takes an
    /// image of its state machine covering at least every slot below
    /// [`OooReplica::applied_head`] as of now and hands it to
    /// [`OooReplica::snapshot_ready`] with that head as its base. When
    /// [`OooReplica::image_scope`] names a [`Footprint`] (read at the same time as the
    /// head), the image may hold only that part of the state: the follower has the rest.
    Snapshot {
        /// The follower.
        to: NodeId,
    },
    /// Follower: replace the state machine with this image (it covers every slot below
    /// `base`), durably, then call [`OooReplica::installed`]. No apply is in flight, and
    /// none is released until then.
    Install {
        /// The image covers every slot below.
        base: Seq,
        /// The leader's image.
        image: Vec<u8>,
        /// A partial image ([`Msg::Snapshot::part`]): overwrite only the part of the
        /// state it carries, keep the rest, and make the whole state durable (as a
        /// checkpoint does) before reporting.
        part: bool,
    },
    /// A pending append whose result cannot be known here: its slot was compacted by the
    /// group before this replica learned which entry committed there (it installed a
    /// snapshot over it), or a membership change removed this replica before it learned.
    /// It may have committed or failed; it is never reported again.
    Unknown {
        /// The append's identity.
        eid: u64,
        /// Its slot.
        seq: Seq,
    },
}

/// An accepted append.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket {
    /// Its slot.
    pub seq: Seq,
    /// Its identity, named again in [`Action::Result`].
    pub eid: u64,
}

/// Why a read of committed entries was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OooReadError {
    /// The slot is below the replica's base: its entry was compacted into the state
    /// machine's image (read the state instead).
    #[error("slot {from} is compacted (every slot below {base} is held only by the state machine's image)")]
    Compacted {
        /// The slot asked for.
        from: Seq,
        /// First slot still in the log.
        base: Seq,
    },
}

/// Why an append was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OooAppendError {
    /// Not a serving leader.
    #[error("not the serving leader (leader hint: {leader:?})")]
    NotLeader {
        /// The leader this replica follows, if any.
        leader: Option<NodeId>,
    },
    /// The declaration does not fit the group's mode.
    #[error("a {declared} declaration in a {mode:?} group")]
    WrongMode {
        /// What was declared.
        declared: &'static str,
        /// The group's mode.
        mode: Mode,
    },
    /// The window is full or the declaration is malformed.
    #[error(transparent)]
    Refused(#[from] OooError),
    /// The leader is handing leadership to another replica
    /// ([`OooReplica::transfer_leader`]); append there once it leads.
    #[error("leadership is being transferred to node {to}")]
    Transferring {
        /// The replica leadership goes to.
        to: NodeId,
    },
    /// A membership change under way removes this leader: append at the next one.
    #[error("this leader is being removed from the group (new voters {voters:?})")]
    Leaving {
        /// The voters after the change.
        voters: Vec<NodeId>,
    },
}

/// Why a leader transfer was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OooTransferError {
    /// Only a serving leader (its merge done) hands leadership over.
    #[error("not the serving leader (leader hint: {leader:?})")]
    NotLeader {
        /// The leader this replica follows, if any.
        leader: Option<NodeId>,
    },
    /// The target is not a voter of this group.
    #[error("node {to} is not a voter of this group")]
    NotVoter {
        /// The node named.
        to: NodeId,
    },
}

/// Settings of an out-of-order replica.
#[derive(Clone, Debug)]
pub struct OooConfig {
    /// This replica.
    pub id: NodeId,
    /// The voters the group was created with (this replica included, unless it joins an
    /// existing group: then empty, and it learns the membership from the leader). A
    /// saved [`Membership`] handed to [`OooReplica::recover`] takes precedence.
    pub voters: Vec<NodeId>,
    /// The group's mode.
    pub mode: Mode,
    /// Entries the leader may have in flight past its first uncommitted one.
    pub window: u64,
    /// Election timeout (randomised up to twice this); a leader that has not heard a
    /// majority for this long steps down.
    pub election_timeout: Nanos,
    /// Leader heartbeat period.
    pub heartbeat_interval: Nanos,
    /// Period of resending what followers lack.
    pub resend_interval: Nanos,
    /// Entries per resent message.
    pub max_batch: usize,
    /// Bytes per resent message, roughly (record bytes plus a fixed allowance per entry;
    /// at least one entry): catch-up moves in bounded pieces, 128 KiB as in PolarFS
    /// section 5.3.
    pub max_batch_bytes: usize,
    /// Bytes per second of streaming catch-up to one follower (0: no limit), so a
    /// follower coming back does not take the link from new appends (PolarFS section
    /// 5.3's rate limit). Pieces the budget does not cover wait for a later ack or tick.
    pub catchup_rate: u64,
    /// How long a leader waits for a follower to install a snapshot it streamed before it
    /// takes a new image and starts over (a piece may have been lost).
    pub snapshot_retry: Nanos,
    /// Most blocks plus keys a partial image may name ([`OooReplica::image_scope`]); a
    /// follower that lacks more gets the whole state. 0: whole images only. The replica
    /// remembers what compacted slots wrote up to four times this many items.
    pub partial_image_items: u64,
    /// Parallel mode only: commit in conflict order — the leader commits an entry only
    /// once every earlier entry whose blocks overlap it has committed (the DP-Raft paper's
    /// adaptation of ParallelRaft to transactions, section 5, with a transaction's read
    /// and write keys as blocks). Off by default: block writes need no commit order
    /// (PolarFS section 5.1). Each entry lists the uncommitted overlapping slots it waits
    /// for ([`Body::Parallel`]'s `after`), so that across a leader change a merge that
    /// drops one of them drops the entry too, as dependent mode does along RAW
    /// predecessors.
    pub conflict_order: bool,
    /// Leader: a follower that acknowledges a slot at least this many slots after one it
    /// has not acknowledged gets that slot again at once — and again each time it
    /// acknowledges this many more past the last resend, the copy overtaken too (0: never; only
    /// the periodic resend fills its holes). Entries go out in slot order, so a follower
    /// holding three later ones was overtaken on this one: the copy is lost or stuck
    /// behind a slow connection, and a second copy takes another (PolarFS section 5.1's
    /// several connections per link; TCP's fast retransmit after three duplicate
    /// acknowledgements, RFC 5681). Only out-of-order acknowledgements show which slot is
    /// missing — a follower acknowledging its contiguous prefix says nothing past the
    /// hole. Committed slots too: a follower lacking one cannot apply what depends on it
    /// (look-behind buffer, WAW). Only slots first sent since the last periodic resend:
    /// older holes are that resend's, and a follower far behind is caught up by the
    /// rate-limited streaming resend, not by this.
    pub hole_resend: u64,
    /// Leader: an uncommitted slot a follower has not acknowledged this many times its
    /// median acknowledgement round trip after it was sent is sent to it again, and again
    /// after twice that if still unacknowledged (0: off). Covers what
    /// [`Self::hole_resend`] cannot — the last slots sent, which nothing later overtakes
    /// (a lone writer, a burst's tail) — as TCP's tail loss probe does (RFC 8985); see
    /// [`crate::rtt`]. Uncommitted only: a slot a majority already holds needs no second
    /// copy to commit, and its holes are the other rules'.
    pub timed_resend: u32,
    /// Seed of the election back-off.
    pub seed: u64,
    /// Whether an election timeout starts a pre-vote ([`Msg::PreVote`]) rather than a
    /// campaign. On by default; off replays the protocol without it (tests).
    pub pre_vote: bool,
    /// Whether the ghost guard is on (NULL entries stamped with the new term and
    /// [`merge::drop_superseded`]). Only the test-only `broken` build can turn it off.
    #[cfg(feature = "broken")]
    pub ghost_guard: bool,
    /// Whether the merge cascades NULLs along the predecessors entries list
    /// ([`merge::MergeOptions`]). Only the test-only `broken` build can turn it off.
    #[cfg(feature = "broken")]
    pub cascade: bool,
    /// Whether a dependent leader lists committed WAW writers from its trailing window
    /// base ([`DepLeader::set_floor`]). Only the test-only `broken` build can turn it off.
    #[cfg(feature = "broken")]
    pub trail_lists_committed: bool,
    /// Whether a replica recovering lost entries ([`Hard::lost_below`]) abstains from
    /// votes and campaigns. Only the test-only `broken` build can turn it off.
    #[cfg(feature = "broken")]
    pub lost_guard: bool,
}

impl OooConfig {
    /// Defaults for `id` among `voters` in `mode`.
    pub fn new(id: NodeId, voters: Vec<NodeId>, mode: Mode) -> Self {
        Self {
            id,
            voters,
            mode,
            window: 1024,
            election_timeout: 300_000_000,
            heartbeat_interval: 50_000_000,
            resend_interval: 50_000_000,
            max_batch: 256,
            max_batch_bytes: 128 << 10,
            catchup_rate: 0,
            snapshot_retry: 2_000_000_000,
            partial_image_items: 4096,
            conflict_order: false,
            hole_resend: HOLE_RESEND,
            timed_resend: TIMED_RESEND,
            seed: id,
            pre_vote: true,
            #[cfg(feature = "broken")]
            ghost_guard: true,
            #[cfg(feature = "broken")]
            cascade: true,
            #[cfg(feature = "broken")]
            trail_lists_committed: true,
            #[cfg(feature = "broken")]
            lost_guard: true,
        }
    }

    fn lost_guard(&self) -> bool {
        #[cfg(feature = "broken")]
        {
            self.lost_guard
        }
        #[cfg(not(feature = "broken"))]
        {
            true
        }
    }

    fn ghost_guard(&self) -> bool {
        #[cfg(feature = "broken")]
        {
            self.ghost_guard
        }
        #[cfg(not(feature = "broken"))]
        {
            true
        }
    }
}

/// A granted vote's versions (with whether the voter knows each committed) and its
/// [`Hard::leader_start`].
type Answer = (Vec<(Entry, bool)>, (u64, Seq));

#[derive(Clone, Debug)]
struct Slot {
    entry: Entry,
    /// Term of the leader this version was last received from (0: from disk).
    confirmed: u64,
    committed: bool,
}

#[derive(Debug)]
enum Applier {
    Parallel(ParallelApplier),
    Dependent(DepApplier<u64>),
}

/// The default [`OooConfig::hole_resend`]: TCP's three duplicate acknowledgements.
pub const HOLE_RESEND: u64 = 3;

/// The default [`OooConfig::timed_resend`]: two median round trips, TCP's tail loss
/// probe timeout (RFC 8985 section 7.2, twice the smoothed round trip).
pub const TIMED_RESEND: u32 = 2;

/// Slots the committed head may move before it is saved again.
const HEAD_SAVE_EVERY: u64 = 1024;

/// Most blocks a parallel entry lists for [`OooConfig::conflict_order`]; an entry
/// writing more conflicts with every entry in flight.
const CONFLICT_KEYS: u64 = 4096;

/// The blocks of `ranges` as keys for conflict order, or `None` past [`CONFLICT_KEYS`].
fn conflict_keys(ranges: &[BlockRange]) -> Option<Vec<u64>> {
    let mut n = 0u64;
    for r in ranges {
        n = n.saturating_add(r.end.saturating_sub(r.start));
        if n > CONFLICT_KEYS {
            return None;
        }
    }
    Some(ranges.iter().flat_map(|r| r.start..r.end).collect())
}

/// Slots tracked past the apply head. Committed slots only enter the appliers, and the
/// leader's window bounds how far commits run ahead of a hole.
const APPLY_LIMIT: u64 = 1 << 24;

impl Applier {
    /// Everything below `head` applied.
    fn new(mode: Mode, head: Seq) -> Self {
        match mode {
            Mode::Parallel { span } => {
                Self::Parallel(ParallelApplier::new(span, head, APPLY_LIMIT))
            }
            Mode::Dependent => Self::Dependent(DepApplier::new(head, APPLY_LIMIT)),
        }
    }

    fn feed(&mut self, e: &Entry) -> Result<(), OooError> {
        match (self, &e.body) {
            (Self::Parallel(a), Body::Null) => a.skip(e.seq),
            (Self::Dependent(a), Body::Null) => {
                a.skip(e.seq);
                Ok(())
            }
            (
                Self::Parallel(a),
                Body::Parallel {
                    ranges,
                    look_behind,
                    ..
                },
            ) => {
                a.insert(&Stamped {
                    seq: e.seq,
                    ranges: ranges.clone(),
                    look_behind: look_behind.clone(),
                })?;
                a.commit(e.seq);
                Ok(())
            }
            (
                Self::Dependent(a),
                Body::Dependent {
                    base,
                    deps,
                    write_set,
                    ..
                },
            ) => {
                a.insert(super::dependent::DepEntry {
                    seq: e.seq,
                    base: *base,
                    deps: deps.clone(),
                    write_set: write_set.clone(),
                })?;
                a.commit(e.seq);
                Ok(())
            }
            _ => Err(OooError::Malformed {
                seq: e.seq,
                detail: "entry of the other mode".into(),
            }),
        }
    }

    /// Entries released since the last call (each once).
    fn take_ready(&mut self) -> Vec<Seq> {
        match self {
            Self::Parallel(a) => a.take_ready(),
            Self::Dependent(a) => a.take_ready(),
        }
    }

    fn applied(&mut self, seq: Seq) -> Result<(), OooError> {
        match self {
            Self::Parallel(a) => a.applied(seq),
            Self::Dependent(a) => a.applied(seq),
        }
    }

    fn head(&self) -> Seq {
        match self {
            Self::Parallel(a) => a.head(),
            Self::Dependent(a) => a.head(),
        }
    }
}

#[derive(Debug)]
struct Peer {
    /// Its first uncommitted slot, as it last said.
    head: Seq,
    /// Its first unapplied slot, as it last said.
    applied: Seq,
    /// Slots at or above `head` it acknowledged in this term.
    acked: BTreeSet<Seq>,
    /// The nonce of the last [`Msg::AskEnd`] that made us forget its acknowledgements.
    forgot: Option<u64>,
    /// Slots resent to it because it acknowledged later ones ([`OooConfig::hole_resend`]),
    /// at or above its head and [`Lead::fresh`], each with the newest slot it had
    /// acknowledged when it was resent: sent again only once it acknowledged
    /// [`OooConfig::hole_resend`] more past that (the resent copy was overtaken too), so
    /// one late acknowledgement does not resend a slot on every later one.
    /// Each also with when it was resent ([`OooConfig::timed_resend`] waits twice its
    /// timeout after that).
    resent: BTreeMap<Seq, (Seq, Nanos)>,
    /// Its recent acknowledgement round trips ([`OooConfig::timed_resend`]).
    rtt: RttWindow,
    /// When it last answered.
    heard: Nanos,
    /// Its head at the last resend tick.
    tick_head: Seq,
    /// Its head stayed below our committed head for a whole resend interval: stream the
    /// slots from its head, acknowledged or not, one piece per acknowledgement.
    catching_up: bool,
    /// Catch-up bytes it may be sent now (with `catchup_rate`), and when that was
    /// computed.
    budget: u64,
    refilled: Nanos,
    /// When the driver was last asked for an image for it (its head is below our base).
    snap_asked: Option<Nanos>,
    /// The image being streamed to it.
    snap: Option<Outgoing>,
    /// The [`Membership::version`] it last said it holds.
    config: Option<(u64, u64)>,
}

impl Peer {
    /// Heard within `timeout` of `now` and not being caught up by streaming or an image:
    /// a follower whose progress the dependent window follows (the window base, and
    /// which records are packed last). One that is not does not hold either back.
    fn keeps_pace(&self, now: Nanos, timeout: Nanos) -> bool {
        now.saturating_sub(self.heard) < timeout
            && !self.catching_up
            && self.snap.is_none()
            && self.snap_asked.is_none()
    }

    fn new(now: Nanos) -> Self {
        Self {
            head: 0,
            applied: 0,
            acked: BTreeSet::new(),
            forgot: None,
            resent: BTreeMap::new(),
            rtt: RttWindow::default(),
            heard: now,
            tick_head: 0,
            catching_up: false,
            budget: 0,
            refilled: now,
            snap_asked: None,
            snap: None,
            config: None,
        }
    }
}

/// A state-machine image a leader streams to one follower.
#[derive(Debug)]
struct Outgoing {
    base: Seq,
    /// A partial image's first slot ([`Msg::Snapshot::part`]).
    part: Option<Seq>,
    image: Vec<u8>,
    /// Bytes sent.
    sent: usize,
    /// Every piece sent (an empty image is one empty piece).
    finished: bool,
    started: Nanos,
}

/// A state-machine image a follower is receiving.
#[derive(Debug)]
struct Incoming {
    term: u64,
    base: Seq,
    part: Option<Seq>,
    total: u64,
    buf: Vec<u8>,
}

/// Roughly the bytes an entry takes in a message (record bytes, sets and a fixed
/// allowance for the header), for the piece and rate bounds.
fn entry_bytes(e: &Entry) -> u64 {
    let meta = match &e.body {
        Body::Null => 0,
        Body::Parallel {
            ranges,
            look_behind,
            after,
            ..
        } => {
            16 * (ranges.len() + look_behind.iter().map(Vec::len).sum::<usize>()) + 8 * after.len()
        }
        Body::Dependent {
            deps, write_set, ..
        } => 8 * (deps.raw.len() + deps.waw.len() + write_set.len()),
    };
    (64 + meta + e.data().len()) as u64
}

#[derive(Debug)]
struct Lead {
    /// First slot of new entries (the end of the merge).
    start: Seq,
    /// Merged slots and who holds the re-stamped version; empty once serving.
    merging: BTreeMap<Seq, BTreeSet<NodeId>>,
    /// Commit tracking once serving.
    commit: Option<DepLeader<u64>>,
    look: LookBehind,
    next_eid: u64,
    /// Next slot.
    end: Seq,
    peers: BTreeMap<NodeId, Peer>,
    last_send: Nanos,
    last_resend: Nanos,
    /// The first slot broadcast since the last periodic resend: hole resends
    /// ([`OooConfig::hole_resend`]) cover slots from here on, older holes the periodic
    /// resend.
    fresh: Seq,
    /// When each slot not known committed was first sent, in slot order: the round trips
    /// and timeouts of [`OooConfig::timed_resend`].
    sent: VecDeque<(Seq, Nanos)>,
    /// The commit window last sent.
    sent_commits: CommitWindow,
    /// A leader transfer under way.
    transfer: Option<Transfer>,
    /// A membership change under way.
    change: Option<Change>,
    /// Memberships set in this term so far (the second half of their versions).
    versions: u64,
}

impl Lead {
    /// The least of `at` over the followers that keep pace ([`Peer::keeps_pace`]);
    /// `Seq::MAX` when none does.
    fn slowest(&self, now: Nanos, timeout: Nanos, at: impl Fn(&Peer) -> Seq) -> Seq {
        self.peers
            .values()
            .filter(|p| p.keeps_pace(now, timeout))
            .map(at)
            .min()
            .unwrap_or(Seq::MAX)
    }
}

/// A membership change under way on the leader: its joint stage is accepted by a
/// majority of both sets that hold every slot below `barrier`, then its final stage by a
/// majority of the new voters.
#[derive(Clone, Debug)]
struct Change {
    /// The leader's end when the change began.
    barrier: Seq,
    /// In the final stage.
    last: bool,
}

/// A leader transfer: appends are refused until `until`; once `to` holds and knows
/// committed every slot below `end`, it is told to campaign ([`Msg::TimeoutNow`]).
#[derive(Clone, Copy, Debug)]
struct Transfer {
    to: NodeId,
    until: Nanos,
    sent: bool,
}

/// Counters for tests and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OooStats {
    /// Elections started.
    pub campaigns: u64,
    /// Merges completed (terms served).
    pub merges: u64,
    /// Slots decided NULL by merges.
    pub nulls: u64,
    /// Versions dropped by [`merge::drop_superseded`].
    pub superseded: u64,
    /// Entries refused on receipt (malformed, or contradicting a committed slot).
    pub refused: u64,
    /// Bytes sent in streaming catch-up under a rate limit.
    pub catchup_bytes: u64,
    /// Catch-up pieces held back by the rate limit.
    pub catchup_deferred: u64,
    /// Compactions done ([`OooReplica::compact`]).
    pub compactions: u64,
    /// Images asked of the driver for followers behind the base.
    pub snapshots_sent: u64,
    /// Images installed from a leader.
    pub snapshots_installed: u64,
    /// Of the images asked of the driver, partial ones ([`OooReplica::image_scope`]).
    pub partial_images: u64,
    /// Partial images refused on arrival: built for a first unapplied slot this replica
    /// had not reached (it restarted meanwhile); the leader sends another.
    pub partial_images_refused: u64,
    /// Leader transfers whose target was told to campaign ([`Msg::TimeoutNow`] sent).
    pub transfers: u64,
    /// Leader transfers given up: the target did not catch up within an election timeout
    /// (appends resumed).
    pub transfers_expired: u64,
    /// Campaigns started on a leader's [`Msg::TimeoutNow`].
    pub transfer_campaigns: u64,
    /// Leaders that removed themselves and told a caught-up remaining voter to campaign
    /// at once ([`Msg::TimeoutNow`]).
    pub handoffs: u64,
    /// Pre-votes started (each an election timeout that did not raise the term).
    pub pre_votes: u64,
    /// Pre-votes this replica refused because it heard a leader within an election
    /// timeout.
    pub pre_votes_refused_by_lease: u64,
    /// Membership changes completed (final stage accepted) by this replica as leader.
    pub membership_changes: u64,
    /// Memberships adopted from a leader.
    pub memberships_adopted: u64,
    /// Entries this replica admitted as leader with an uncommitted predecessor they
    /// commit after: a RAW predecessor in dependent mode, an earlier overlapping entry
    /// under conflict order (none in plain parallel mode).
    pub admitted_after: u64,
    /// Of the entries this replica led, those held back by the commit rule: they reached
    /// a majority while such a predecessor was still uncommitted ([`DepLeader::held`]).
    pub held_at_quorum: u64,
    /// Entries resent to a follower that acknowledged later ones
    /// ([`OooConfig::hole_resend`]).
    pub hole_resends: u64,
    /// Entries resent to a follower that had not acknowledged them within the timeout of
    /// [`OooConfig::timed_resend`].
    pub timed_resends: u64,
    /// Votes and pre-votes refused because this replica is recovering entries it lost on
    /// disk ([`Hard::lost_below`]).
    pub votes_refused_lost: u64,
    /// Recoveries from lost entries completed: the replica holds again every slot below
    /// a later leader's merge start and votes again.
    pub lost_restored: u64,
}

/// One replica of an out-of-order group. See the module documentation.
#[derive(Debug)]
pub struct OooReplica {
    cfg: OooConfig,
    members: Membership,
    quorum: Quorum,
    rng: Rng,
    now: Nanos,
    hard: Hard,
    saved: Hard,
    role: Role,
    leader: Option<NodeId>,
    log: BTreeMap<Seq, Slot>,
    commits: CommitWindow,
    deadline: Nanos,
    votes: BTreeMap<NodeId, Answer>,
    /// During a pre-vote: the term it asks about and the voters that said yes.
    pre: Option<(u64, BTreeSet<NodeId>)>,
    /// When a leader of the current term was last heard (its appends, heartbeats,
    /// membership): while that is within an election timeout, pre-votes are refused.
    heard: Option<Nanos>,
    lead: Option<Lead>,
    applier: Applier,
    applying: BTreeSet<Seq>,
    mine: BTreeMap<Seq, u64>,
    actions: Vec<Action>,
    /// Inputs arrived since the apply rules were last consulted.
    apply_dirty: bool,
    /// New entries of this leader's term not sent yet: they go out together, in one
    /// message per follower, when the driver drains the actions.
    outbox: Vec<Entry>,
    /// The image being received from the leader.
    incoming: Option<Incoming>,
    /// A received image (base, partial image's first slot, bytes) waiting for the applies
    /// in flight to finish.
    install: Option<(Seq, Option<Seq>, Vec<u8>)>,
    /// What the compacted slots from `written_from` up to the base wrote, slot by slot:
    /// the footprint of a partial image for a follower whose first unapplied slot is
    /// among them. Kept in memory only (after a restart, whole images until compactions
    /// refill it), bounded by [`OooConfig::partial_image_items`].
    written: BTreeMap<Seq, Footprint>,
    written_from: Seq,
    written_items: u64,
    /// The base of the image handed to the driver by [`Action::Install`], until
    /// [`OooReplica::installed`].
    installing: Option<Seq>,
    /// Recovering lost entries: the end a leader answered ([`Msg::End`]), and when it was
    /// last asked.
    lost_end: Option<Seq>,
    asked_end: Option<Nanos>,
    lost_nonce: u64,
    stats: OooStats,
}

impl OooReplica {
    /// A replica with nothing on disk.
    pub fn new(cfg: OooConfig, now: Nanos) -> Self {
        Self::recover(cfg, Hard::default(), None, Vec::new(), now)
    }

    /// A replica restarted from its saved hard state, membership (`None` if none was
    /// saved: the configured voters) and the entries on disk.
    pub fn recover(
        cfg: OooConfig,
        hard: Hard,
        membership: Option<Membership>,
        entries: Vec<Entry>,
        now: Nanos,
    ) -> Self {
        let mut log: BTreeMap<Seq, Slot> = entries
            .into_iter()
            .map(|entry| {
                (
                    entry.seq,
                    Slot {
                        entry,
                        confirmed: 0,
                        committed: false,
                    },
                )
            })
            .collect();
        // Slots below the base are in the state machine's image; a compaction that
        // crashed before rewriting the file leaves their entries behind.
        let base = hard.base;
        let mut log = log.split_off(&base);
        // The committed head is a lower bound; a slot missing below it (lost on disk)
        // lowers it to the hole.
        let mut head = base;
        while head < hard.committed_head && log.contains_key(&head) {
            head += 1;
        }
        for (_, s) in log.range_mut(..head) {
            s.committed = true;
        }
        let members = membership.unwrap_or_else(|| Membership::initial(cfg.voters.clone()));
        let quorum = members.quorum();
        let mut r = Self {
            members,
            rng: Rng::new(cfg.seed ^ 0x00_0C0C),
            applier: Applier::new(cfg.mode, base),
            cfg,
            quorum,
            now,
            hard: Hard {
                committed_head: head,
                ..hard
            },
            saved: hard,
            role: Role::Follower,
            leader: None,
            log,
            commits: CommitWindow::new(head),
            deadline: 0,
            votes: BTreeMap::new(),
            pre: None,
            heard: None,
            lead: None,
            applying: BTreeSet::new(),
            mine: BTreeMap::new(),
            actions: Vec::new(),
            apply_dirty: false,
            outbox: Vec::new(),
            incoming: None,
            install: None,
            installing: None,
            lost_end: None,
            asked_end: None,
            lost_nonce: 0,
            written: BTreeMap::new(),
            written_from: base,
            written_items: 0,
            stats: OooStats::default(),
        };
        r.reset_deadline();
        // Differs between restarts (drivers seed each start apart) without a draw from the
        // election timer's stream.
        r.lost_nonce = r.cfg.seed.rotate_left(17) ^ now ^ r.hard.term.rotate_left(40);
        let prefix: Vec<Entry> = r.log.range(..head).map(|(_, s)| s.entry.clone()).collect();
        for e in &prefix {
            let fed = r.applier.feed(e);
            debug_assert!(fed.is_ok(), "{fed:?}");
        }
        r.pump_apply();
        r
    }

    /// Drains the actions produced so far. The apply rules are consulted here, once per
    /// drain rather than once per input, and incrementally: a drain checks the entries
    /// committed or released since the last one, not everything held
    /// ([`ParallelApplier::take_ready`], [`DepApplier::take_ready`]).
    ///
    /// New appends are sent here too: every entry appended since the last drain goes to
    /// each follower in one message (after the writes of those entries in the list), so a
    /// driver that takes many appends before draining sends and acknowledges them once.
    pub fn take_actions(&mut self) -> Vec<Action> {
        if !self.outbox.is_empty() {
            let out = std::mem::take(&mut self.outbox);
            for chunk in out.chunks(self.cfg.max_batch.max(1)) {
                self.broadcast(chunk.to_vec());
            }
        }
        if std::mem::take(&mut self.apply_dirty) {
            self.pump_apply();
        }
        std::mem::take(&mut self.actions)
    }

    /// The current role.
    pub fn role(&self) -> Role {
        self.role
    }

    /// The current term.
    pub fn term(&self) -> u64 {
        self.hard.term
    }

    /// The leader this replica follows (itself when leading).
    pub fn leader(&self) -> Option<NodeId> {
        self.leader
    }

    /// Whether this replica is a leader that accepts appends.
    pub fn is_serving(&self) -> bool {
        self.lead.as_ref().is_some_and(|l| l.commit.is_some())
    }

    /// First slot not known committed.
    pub fn committed_head(&self) -> Seq {
        self.commits.head()
    }

    /// First slot not applied.
    pub fn applied_head(&self) -> Seq {
        self.applier.head()
    }

    /// Committed entries from slot `from` on, in slot order, at most `max`: the committed
    /// prefix below [`Self::committed_head`], as a reader following the log in slot order
    /// (a standby, an auditor) takes it. Slots committed out of order past the head are
    /// not returned until every slot before them is committed, so successive reads from
    /// the last slot returned + 1 see each committed slot once and never a slot that is
    /// still open. NULL entries (slots a merge decided hold nothing) are returned as such.
    pub fn read_committed(&self, from: Seq, max: usize) -> Result<Vec<Entry>, OooReadError> {
        let base = self.hard.base;
        if from < base {
            return Err(OooReadError::Compacted { from, base });
        }
        let head = self.commits.head();
        if from >= head {
            return Ok(Vec::new());
        }
        // Every slot from the base to the committed head is held and committed here
        // (commits are marked only on held slots); stop at a gap all the same rather
        // than skip one.
        let mut out = Vec::new();
        for (next, (&seq, slot)) in (from..).zip(self.log.range(from..head)) {
            if seq != next || !slot.committed || out.len() >= max {
                break;
            }
            out.push(slot.entry.clone());
        }
        Ok(out)
    }

    /// Slots the apply rules wait for (neither held nor skipped), ascending: what
    /// catch-up still has to bring. For diagnostics.
    pub fn apply_holes(&self) -> Vec<Seq> {
        match &self.applier {
            Applier::Parallel(a) => a.holes(),
            Applier::Dependent(a) => a.holes(),
        }
    }

    /// Appends still waiting for their result.
    pub fn pending(&self) -> usize {
        self.mine.len()
    }

    /// Counters.
    pub fn stats(&self) -> OooStats {
        self.stats
    }

    /// The group's mode.
    pub fn mode(&self) -> Mode {
        self.cfg.mode
    }

    /// Whether this replica stays out of elections: it is recovering entries it lost on
    /// disk ([`Hard::lost_below`]).
    fn abstains(&self) -> bool {
        self.hard.lost_below != 0 && self.cfg.lost_guard()
    }

    /// Whether this replica is recovering entries it lost on disk ([`Hard::after_loss`]):
    /// it follows and acknowledges but neither votes nor campaigns.
    pub fn is_recovering_lost(&self) -> bool {
        self.hard.lost_below != 0
    }

    fn me(&self) -> NodeId {
        self.cfg.id
    }

    /// Every other voter of the membership (both sets during a change's joint stage).
    fn peers(&self) -> Vec<NodeId> {
        self.members
            .members()
            .into_iter()
            .filter(|&v| v != self.cfg.id)
            .collect()
    }

    /// The group's membership as this replica holds it.
    pub fn membership(&self) -> &Membership {
        &self.members
    }

    /// Whether `nodes` and this replica form a quorum of the membership.
    fn quorum_with_me(&self, nodes: impl IntoIterator<Item = NodeId>) -> bool {
        let mut set: BTreeSet<NodeId> = nodes.into_iter().collect();
        set.insert(self.me());
        self.quorum.reached_by(&set)
    }

    fn reset_deadline(&mut self) {
        let t = self.cfg.election_timeout.max(1);
        self.deadline = self.now + t + self.rng.below(t);
    }

    fn set_role(&mut self, role: Role) {
        if self.role != role {
            self.role = role;
            self.actions.push(Action::Role {
                role,
                term: self.hard.term,
            });
        }
    }

    /// Emits the hard state if it changed since it was last saved.
    fn save_hard(&mut self) {
        if self.hard != self.saved {
            self.saved = self.hard;
            self.actions.push(Action::SaveHard(self.hard));
        }
    }

    fn vote_log(&self) -> VoteLog {
        let (last_term, last_seq) = self
            .log
            .values()
            .map(|s| (s.entry.term, s.entry.seq))
            .max()
            .unwrap_or((0, 0));
        VoteLog {
            last_term,
            last_seq,
            first_uncommitted: self.commits.head(),
            base: self.hard.base,
        }
    }

    /// Advances the clock: elections, heartbeats, resends, the leader's quorum check.
    pub fn tick(&mut self, now: Nanos) {
        self.now = self.now.max(now);
        if self.lead.is_some() {
            self.lead_tick();
        } else if self.now >= self.deadline {
            if self.members.is_member(self.me()) && !self.abstains() {
                if self.cfg.pre_vote {
                    self.pre_campaign();
                } else {
                    self.campaign();
                }
            } else {
                // Not a voter (joining and not told the membership yet, or removed), or
                // recovering lost entries: it only follows.
                self.reset_deadline();
            }
        }
        self.finish();
    }

    /// Asks the voters whether this replica could win an election at the next term,
    /// changing nothing durable: the term is raised only once a quorum says yes.
    fn pre_campaign(&mut self) {
        self.stats.pre_votes += 1;
        let term = self.hard.term + 1;
        self.pre = Some((term, BTreeSet::new()));
        self.leader = None;
        self.heard = None;
        self.reset_deadline();
        let log = self.vote_log();
        let config = self.members.version;
        for p in self.peers() {
            self.actions.push(Action::Send {
                to: p,
                msg: Msg::PreVote { term, log, config },
            });
        }
        if self.quorum_with_me([]) {
            self.campaign();
        }
    }

    fn campaign(&mut self) {
        self.pre = None;
        self.stats.campaigns += 1;
        self.hard.term += 1;
        self.hard.voted_for = Some(self.me());
        self.leader = None;
        self.votes.clear();
        self.set_role(Role::Candidate);
        self.reset_deadline();
        self.save_hard();
        let head = self.commits.head();
        let log = self.vote_log();
        let config = self.members.version;
        for p in self.peers() {
            self.actions.push(Action::Send {
                to: p,
                msg: Msg::Vote {
                    term: self.hard.term,
                    head,
                    log,
                    config,
                },
            });
        }
        if self.quorum_with_me([]) {
            self.become_leader();
        }
    }

    fn step_down(&mut self, term: u64, leader: Option<NodeId>) {
        if term > self.hard.term {
            self.hard.term = term;
            self.hard.voted_for = None;
        }
        self.lead = None;
        // Entries appended but not sent yet: this term's leader will not send them.
        self.outbox.clear();
        self.votes.clear();
        self.pre = None;
        self.leader = leader;
        self.set_role(if self.mine.is_empty() {
            Role::Follower
        } else {
            Role::PendingFollower
        });
        self.reset_deadline();
    }

    /// A message from `from`.
    pub fn receive(&mut self, now: Nanos, from: NodeId, msg: Msg) {
        self.now = self.now.max(now);
        // Messages from nodes outside the membership are taken too: a leader of a newer
        // membership, a candidate this replica has not heard of yet. Each rule counts only
        // the voters of its membership.
        if from == self.me() || from == 0 {
            return;
        }
        match msg {
            Msg::Vote {
                term,
                head,
                log,
                config,
            } => self.on_vote(from, term, head, log, config),
            Msg::VoteReply {
                term,
                granted,
                entries,
                leader_start,
            } => self.on_vote_reply(from, term, granted, entries, leader_start),
            Msg::Append {
                term,
                start,
                entries,
                commits,
                config,
            } => self.on_append(from, term, start, entries, commits, config),
            Msg::Ack {
                term,
                seqs,
                head,
                applied,
            } => self.on_ack(from, term, seqs, head, applied),
            Msg::Snapshot {
                term,
                base,
                offset,
                total,
                part,
                data,
            } => self.on_snapshot(from, term, (base, part), offset, total, data),
            Msg::TimeoutNow { term } => self.on_timeout_now(from, term),
            Msg::PreVote { term, log, config } => self.on_pre_vote(from, term, log, config),
            Msg::PreVoteReply { term, granted } => self.on_pre_vote_reply(from, term, granted),
            Msg::Config { term, membership } => self.on_config(from, term, membership),
            Msg::Newer { membership } => {
                if membership.version > self.members.version && self.lead.is_none() {
                    self.adopt(membership);
                }
            }
            Msg::ConfigAck {
                term,
                version,
                head,
            } => self.on_config_ack(from, term, version, head),
            Msg::AskEnd { term, nonce } => self.on_ask_end(from, term, nonce),
            Msg::End { term, end } => {
                if term == self.hard.term
                    && self.leader == Some(from)
                    && self.hard.lost_below != 0
                    && self.lost_end.is_none()
                {
                    self.lost_end = Some(end);
                }
            }
        }
        self.finish();
    }

    /// Hands leadership to `to` (PALF section 4's leader transfer, as the ordered mode
    /// does it): new appends are refused with [`OooAppendError::Transferring`]; once
    /// every slot this leader has is committed and `to` reports knowing so (its first
    /// uncommitted slot is our end — so it holds them all, and its vote log is as new as
    /// any voter's), `to` is sent [`Msg::TimeoutNow`] and campaigns at once. Its merge
    /// then runs as after any election. If that has not happened within an election
    /// timeout, the transfer is given up and appends resume here. Nothing about safety
    /// changes: a TimeoutNow only makes a replica campaign earlier than its timer would.
    pub fn transfer_leader(&mut self, now: Nanos, to: NodeId) -> Result<(), OooTransferError> {
        self.now = self.now.max(now);
        if !self.members.voters.contains(&to) {
            return Err(OooTransferError::NotVoter { to });
        }
        let until = self.now + self.cfg.election_timeout;
        let leader = self.leader;
        let Some(lead) = self.lead.as_mut().filter(|l| l.commit.is_some()) else {
            return Err(OooTransferError::NotLeader { leader });
        };
        if to == self.cfg.id {
            // Already the leader: a transfer to ourselves is done (and cancels one under
            // way).
            lead.transfer = None;
            return Ok(());
        }
        lead.transfer = Some(Transfer {
            to,
            until,
            sent: false,
        });
        self.check_transfer();
        self.finish();
        Ok(())
    }

    /// The leader transfer under way, if any: the target.
    pub fn transferring_to(&self) -> Option<NodeId> {
        self.lead.as_ref()?.transfer.map(|t| t.to)
    }

    /// Sends the transfer's TimeoutNow once its target has caught up.
    fn check_transfer(&mut self) {
        let head = self.commits.head();
        let term = self.hard.term;
        let Some(lead) = self.lead.as_mut() else {
            return;
        };
        let Some(t) = lead.transfer.as_mut().filter(|t| !t.sent) else {
            return;
        };
        let caught_up =
            head >= lead.end && lead.peers.get(&t.to).is_some_and(|p| p.head >= lead.end);
        if caught_up {
            t.sent = true;
            let to = t.to;
            self.stats.transfers += 1;
            self.actions.push(Action::Send {
                to,
                msg: Msg::TimeoutNow { term },
            });
        }
    }

    /// Changes the group's voters (PALF section 4.3's membership change, here by joint
    /// consensus outside the log; see [`Membership`]). Appends go on meanwhile: while the
    /// joint membership stands they commit with a majority of both sets. The leader
    /// stays until the final membership is accepted, then steps down if it is not a
    /// voter of it. One change at a time.
    pub fn change_membership(
        &mut self,
        now: Nanos,
        change: OooMembershipChange,
    ) -> Result<(), OooChangeError> {
        self.now = self.now.max(now);
        let leader = self.leader;
        let Some(lead) = self.lead.as_ref().filter(|l| l.commit.is_some()) else {
            return Err(OooChangeError::NotLeader { leader });
        };
        if lead.change.is_some() {
            return Err(OooChangeError::InProgress {
                to: self.members.voters.clone(),
            });
        }
        let old = self.members.voters.clone();
        let invalid = |detail: String| OooChangeError::Invalid {
            detail,
            voters: old.clone(),
        };
        let (remove, add) = match change {
            OooMembershipChange::AddVoter(n) => (None, Some(n)),
            OooMembershipChange::Remove(n) => (Some(n), None),
            OooMembershipChange::Replace { remove, add } => (Some(remove), Some(add)),
        };
        let mut new = old.clone();
        if let Some(n) = remove {
            if !new.contains(&n) {
                return Err(invalid(format!("node {n} is not a voter")));
            }
            new.retain(|&v| v != n);
        }
        if let Some(n) = add {
            if n == 0 {
                return Err(invalid("node id 0 is reserved".into()));
            }
            if old.contains(&n) {
                return Err(invalid(format!("node {n} is a voter already")));
            }
            new.push(n);
            new.sort_unstable();
        }
        if new.is_empty() {
            return Err(invalid("the change would leave no voter".into()));
        }
        let now = self.now;
        let lead = self.lead.as_mut().expect("serving");
        for &n in &new {
            if n != self.cfg.id {
                lead.peers.entry(n).or_insert_with(|| Peer::new(now));
            }
        }
        lead.change = Some(Change {
            barrier: lead.end,
            last: false,
        });
        self.set_membership(Membership {
            version: (0, 0),
            voters: new,
            prev: Some(old),
        });
        self.finish();
        Ok(())
    }

    /// The membership change under way, if any: the voters it moves to.
    pub fn changing_to(&self) -> Option<&[NodeId]> {
        self.lead.as_ref()?.change.as_ref()?;
        Some(&self.members.voters)
    }

    /// Leader: takes `m` under a fresh version of this term, saves it, and tells every
    /// follower (the voters of both sets, and any voter being removed).
    fn set_membership(&mut self, mut m: Membership) {
        let term = self.hard.term;
        let Some(lead) = self.lead.as_mut() else {
            return;
        };
        lead.versions += 1;
        m.version = (term, lead.versions);
        self.quorum = m.quorum();
        self.members = m.clone();
        self.actions.push(Action::SaveMembership(m));
        let quorum = self.quorum.clone();
        let committed = self
            .lead
            .as_mut()
            .and_then(|l| l.commit.as_mut())
            .map(|c| c.set_quorum(quorum))
            .unwrap_or_default();
        for s in committed {
            self.mark_committed(s);
        }
        self.send_config(None);
    }

    /// Leader of a group whose voters ever changed: our membership takes our term, so
    /// that a replica holding entries of this term holds this membership or a newer one
    /// (see `Msg::Append::config`), and every follower is sent it. A joint stage keeps an
    /// odd number, so that its final stage shares its epoch; a final membership takes 0.
    fn restamp(&mut self) {
        let term = self.hard.term;
        let mut m = self.members.clone();
        let Some(lead) = self.lead.as_mut() else {
            return;
        };
        lead.versions = u64::from(m.prev.is_some());
        m.version = (term, lead.versions);
        self.quorum = m.quorum();
        self.members = m.clone();
        self.actions.push(Action::SaveMembership(m));
        self.send_config(None);
    }

    /// Leader: sends the membership to `to`, or to every follower.
    fn send_config(&mut self, to: Option<NodeId>) {
        let Some(lead) = self.lead.as_ref() else {
            return;
        };
        let targets: Vec<NodeId> = match to {
            Some(p) => vec![p],
            None => lead.peers.keys().copied().collect(),
        };
        for p in targets {
            self.actions.push(Action::Send {
                to: p,
                msg: Msg::Config {
                    term: self.hard.term,
                    membership: self.members.clone(),
                },
            });
        }
    }

    /// Leader: moves the change under way to its next stage once the current one is
    /// accepted.
    fn check_change(&mut self) {
        let Some(lead) = self.lead.as_ref() else {
            return;
        };
        let Some(change) = lead.change.clone() else {
            return;
        };
        if lead.commit.is_none() {
            return;
        }
        let version = self.members.version;
        let acceptors: Vec<NodeId> = lead
            .peers
            .iter()
            .filter(|(_, p)| p.config == Some(version) && (change.last || p.head >= change.barrier))
            .map(|(&id, _)| id)
            .collect();
        // Our own copy of the membership was saved before it was sent, and the slots
        // below the barrier were written before that.
        if !self.quorum_with_me(acceptors) {
            return;
        }
        if change.last
            && !self.members.voters.contains(&self.cfg.id)
            && self.commits.head() < lead.end
        {
            // A leader removing itself decides its own appends before it goes: once it
            // steps down, no leader sends it commits any more.
            return;
        }
        if !change.last {
            let voters = self.members.voters.clone();
            if let Some(c) = self.lead.as_mut().and_then(|l| l.change.as_mut()) {
                c.last = true;
            }
            self.set_membership(Membership {
                version: (0, 0),
                voters,
                prev: None,
            });
            return;
        }
        self.stats.membership_changes += 1;
        let voters = self.members.voters.clone();
        let lead = self.lead.as_mut().expect("leading");
        lead.change = None;
        lead.peers.retain(|p, _| voters.contains(p));
        if !voters.contains(&self.cfg.id) {
            // Removed: the remaining voters elect a leader among themselves. Every slot
            // this leader has is committed (above), so a voter that holds the final
            // membership and reports its first uncommitted slot at our end is caught up
            // as a transfer's target is: told to campaign now (as by `transfer_leader`),
            // it spares the group an election timeout without a leader. Its campaign
            // still needs the votes of a majority of the new voters.
            let end = lead.end;
            let to = lead
                .peers
                .iter()
                .filter(|(_, p)| p.config == Some(version) && p.head >= end)
                .map(|(&id, p)| (p.heard, id))
                .max()
                .map(|(_, id)| id);
            let term = self.hard.term;
            self.step_down(term, None);
            if let Some(to) = to {
                self.stats.handoffs += 1;
                self.actions.push(Action::Send {
                    to,
                    msg: Msg::TimeoutNow { term },
                });
            }
        }
    }

    /// Follower: the leader's membership.
    fn on_config(&mut self, from: NodeId, term: u64, membership: Membership) {
        if !self.follow(from, term) {
            return;
        }
        self.save_hard();
        if membership != self.members {
            self.adopt(membership);
        }
        self.send_config_ack(from);
    }

    /// Follower: takes a membership from a leader (or a removal notice), durably.
    fn adopt(&mut self, membership: Membership) {
        self.stats.memberships_adopted += 1;
        self.quorum = membership.quorum();
        self.members = membership.clone();
        self.actions.push(Action::SaveMembership(membership));
        if !self.members.is_member(self.me()) {
            // Removed: no leader will send this replica commits again, so the results of
            // appends it took as a leader can no longer be learnt here.
            for (seq, eid) in std::mem::take(&mut self.mine) {
                self.actions.push(Action::Unknown { eid, seq });
            }
            if self.role == Role::PendingFollower {
                self.set_role(Role::Follower);
            }
        }
    }

    fn on_config_ack(&mut self, from: NodeId, term: u64, version: (u64, u64), head: Seq) {
        if term > self.hard.term {
            self.step_down(term, None);
            return;
        }
        if term < self.hard.term {
            return;
        }
        let now = self.now;
        let Some(peer) = self.lead.as_mut().and_then(|l| l.peers.get_mut(&from)) else {
            return;
        };
        peer.heard = now;
        peer.head = head;
        peer.config = Some(version);
        if version != self.members.version {
            if self.members.version == (0, 0) {
                // The voters changed once, and we still hold the group's first
                // membership: it takes our term (and goes to every follower).
                self.restamp();
            } else {
                self.send_config(Some(from));
            }
        }
        self.check_change();
    }

    fn on_timeout_now(&mut self, from: NodeId, term: u64) {
        // Only from the leader we follow in its term, and not while an image is being
        // installed (our log would not be what the leader saw).
        if term != self.hard.term
            || self.leader != Some(from)
            || self.lead.is_some()
            || self.abstains()
            || self.incoming.is_some()
            || self.install.is_some()
            || self.installing.is_some()
        {
            return;
        }
        self.stats.transfer_campaigns += 1;
        self.campaign();
    }

    /// Whether a candidate (or pre-candidate) holding membership `config` cannot win
    /// with our vote: `Some(true)` if it missed a membership we hold and was sent ours
    /// ([`Msg::Newer`]), `Some(false)` if it is to be refused otherwise, `None` if its
    /// membership does not rule it out. Either way its term is not taken.
    fn hopeless(&mut self, from: NodeId, config: (u64, u64)) -> Option<bool> {
        let outsider = !self.members.is_member(from);
        if config < self.members.version
            && (epoch(config) < epoch(self.members.version) || self.members.prev.is_none())
        {
            // It missed a membership we hold: one of a later change, or the final stage
            // of the change whose joint stage it holds (the final stage exists only once
            // the joint one was accepted, so taking it is what the lost message would
            // have done). It takes ours; with the final stage it needs only the new
            // voters, so a group whose old majority is out of reach — an old voter down
            // or recovering lost entries while the removed leader holds the newest log
            // and, removed, never campaigns — still elects.
            self.actions.push(Action::Send {
                to: from,
                msg: Msg::Newer {
                    membership: self.members.clone(),
                },
            });
            return Some(true);
        }
        // Its membership is of an earlier change than ours, or it is not a voter of ours
        // while we are: it cannot win with our vote. A node a change removed, or one added
        // by a joint stage that a later leader abandoned, would otherwise depose every
        // leader with its terms.
        (epoch(config) < epoch(self.members.version)
            || (outsider && self.members.is_member(self.me())))
        .then_some(false)
    }

    /// A pre-vote: would we vote for `from` at `term`? Nothing here changes or is saved;
    /// the answer is yes only if the vote rule would grant, `term` is past ours, and no
    /// leader has been heard within an election timeout (so a replica that was cut off
    /// cannot unseat a leader the others still hear).
    fn on_pre_vote(&mut self, from: NodeId, term: u64, log: VoteLog, config: (u64, u64)) {
        let granted = match self.hopeless(from, config) {
            Some(true) => return,
            Some(false) => false,
            None => {
                let lease = self.lead.is_some()
                    || (self.leader.is_some()
                        && self
                            .heard
                            .is_some_and(|h| self.now < h + self.cfg.election_timeout));
                if lease && term > self.hard.term {
                    self.stats.pre_votes_refused_by_lease += 1;
                }
                let abstain = self.abstains();
                if abstain {
                    self.stats.votes_refused_lost += 1;
                }
                term > self.hard.term && !lease && !abstain && grants_vote(&self.vote_log(), &log)
            }
        };
        self.actions.push(Action::Send {
            to: from,
            msg: Msg::PreVoteReply {
                term: if granted { term } else { self.hard.term },
                granted,
            },
        });
    }

    fn on_pre_vote_reply(&mut self, from: NodeId, term: u64, granted: bool) {
        if !granted {
            // A voter at a later term: take it (no vote is given or spent), so the next
            // pre-vote asks about a term the voters have not passed.
            if term > self.hard.term {
                self.step_down(term, None);
            }
            return;
        }
        let Some((asked, yes)) = self.pre.as_mut() else {
            return;
        };
        if term != *asked || self.lead.is_some() {
            return;
        }
        yes.insert(from);
        let yes = yes.clone();
        if self.quorum_with_me(yes) {
            self.campaign();
        }
    }

    fn on_vote(&mut self, from: NodeId, term: u64, head: Seq, log: VoteLog, config: (u64, u64)) {
        match self.hopeless(from, config) {
            Some(true) => return,
            Some(false) => {
                self.actions.push(Action::Send {
                    to: from,
                    msg: Msg::VoteReply {
                        term: self.hard.term,
                        granted: false,
                        entries: Vec::new(),
                        leader_start: self.hard.leader_start,
                    },
                });
                return;
            }
            None => {}
        }
        if term > self.hard.term {
            self.step_down(term, None);
        }
        let abstain = self.abstains();
        if abstain {
            self.stats.votes_refused_lost += 1;
        }
        let grant = term == self.hard.term
            && self.hard.voted_for.is_none_or(|v| v == from)
            && self.lead.is_none()
            && !abstain
            && grants_vote(&self.vote_log(), &log);
        let mut entries = Vec::new();
        if grant {
            self.hard.voted_for = Some(from);
            self.reset_deadline();
            entries = self
                .log
                .range(head..)
                .map(|(_, s)| (s.entry.clone(), s.committed))
                .collect();
        }
        self.save_hard();
        self.actions.push(Action::Send {
            to: from,
            msg: Msg::VoteReply {
                term: self.hard.term,
                granted: grant,
                entries,
                leader_start: self.hard.leader_start,
            },
        });
    }

    fn on_vote_reply(
        &mut self,
        from: NodeId,
        term: u64,
        granted: bool,
        entries: Vec<(Entry, bool)>,
        leader_start: (u64, Seq),
    ) {
        if term > self.hard.term {
            self.step_down(term, None);
            return;
        }
        if term < self.hard.term || !granted || self.role != Role::Candidate {
            return;
        }
        self.votes.insert(from, (entries, leader_start));
        if self.quorum_with_me(self.votes.keys().copied()) {
            self.become_leader();
        }
    }

    /// The merge (module docs): decide every slot from our first uncommitted one to the
    /// last any voter holds, write the decisions re-stamped at our term, send them.
    fn become_leader(&mut self) {
        let me = self.me();
        let term = self.hard.term;
        let h = self.commits.head();
        let mut held: BTreeMap<NodeId, BTreeMap<Seq, (Entry, bool)>> = BTreeMap::new();
        held.insert(
            me,
            self.log
                .range(h..)
                .map(|(&s, slot)| (s, (slot.entry.clone(), slot.committed)))
                .collect(),
        );
        let mut starts = BTreeMap::new();
        let (t0, s0) = self.hard.leader_start;
        starts.insert(t0, s0);
        for (&n, (es, (t, st))) in &self.votes {
            starts.insert(*t, *st);
            held.insert(
                n,
                es.iter()
                    .filter(|(e, _)| e.seq >= h)
                    .map(|(e, c)| (e.seq, (e.clone(), *c)))
                    .collect(),
            );
        }
        let top = held
            .values()
            .filter_map(|m| m.keys().next_back())
            .max()
            .copied();
        let end = top.map_or(h, |t| t + 1);
        let mut answers = merge::Answers::new();
        for s in h..end {
            let row = held
                .iter()
                .map(|(&n, m)| {
                    (
                        n,
                        m.get(&s).map(|(e, c)| {
                            starts.insert(e.term, e.start);
                            e.version(*c)
                        }),
                    )
                })
                .collect();
            answers.insert(s, row);
        }
        let guard = self.cfg.ghost_guard();
        let opts = MergeOptions::new(term);
        #[cfg(feature = "broken")]
        let opts = if guard {
            opts
        } else {
            opts.without_ghost_guard()
        };
        #[cfg(feature = "broken")]
        let opts = if self.cfg.cascade {
            opts
        } else {
            opts.without_cascade()
        };
        if guard {
            self.stats.superseded += merge::drop_superseded(&mut answers, &starts) as u64;
        }
        let decisions = merge::merge(me, &answers, &opts);
        let mut merged = Vec::with_capacity(decisions.len());
        for d in decisions {
            let e = match &d.outcome {
                merge::Outcome::Entry { from, version } => {
                    let (src, _) = &held[from][&d.seq];
                    debug_assert_eq!(src.eid, version.id);
                    src.restamp(term, end)
                }
                merge::Outcome::Null { written } => {
                    self.stats.nulls += 1;
                    // Without the guard (broken builds) the slot is recorded as empty
                    // without the new term: the published protocols' gap.
                    Entry::null(d.seq, written.as_ref().map_or(0, |v| v.term), end)
                }
            };
            merged.push(e);
        }
        let peers = self.peers();
        let mut merging = BTreeMap::new();
        for e in &merged {
            self.write_local(e.clone(), term);
            // This replica's own copy counts once it is durable ([`Self::persisted`]).
            merging.insert(e.seq, BTreeSet::new());
        }
        self.votes.clear();
        self.leader = Some(me);
        self.hard.leader_start = (term, end);
        self.save_hard();
        self.lead = Some(Lead {
            start: end,
            merging,
            commit: None,
            look: LookBehind::new(self.span(), end),
            next_eid: 1,
            end,
            peers: peers.iter().map(|&p| (p, Peer::new(self.now))).collect(),
            last_send: self.now,
            last_resend: self.now,
            fresh: end,
            sent: VecDeque::new(),
            sent_commits: self.commits.clone(),
            transfer: None,
            change: None,
            versions: 0,
        });
        if self.members.version != (0, 0) {
            self.restamp();
        }
        for chunk in merged.chunks(self.cfg.max_batch.max(1)) {
            self.broadcast(chunk.to_vec());
        }
        if merged.is_empty() {
            self.broadcast(Vec::new());
        }
        self.check_merged();
    }

    fn span(&self) -> usize {
        match self.cfg.mode {
            Mode::Parallel { span } => span,
            Mode::Dependent => 0,
        }
    }

    /// Writes `e` at its slot unless the same version is there; the slot is confirmed in
    /// `term`.
    fn write_local(&mut self, e: Entry, term: u64) {
        match self.log.get_mut(&e.seq) {
            Some(s) if s.entry == e => s.confirmed = term,
            Some(s) => {
                debug_assert!(
                    !s.committed || s.entry.eid == e.eid,
                    "committed slot replaced"
                );
                s.entry = e.clone();
                s.confirmed = term;
                self.actions.push(Action::Write(e));
            }
            None => {
                self.log.insert(
                    e.seq,
                    Slot {
                        entry: e.clone(),
                        confirmed: term,
                        committed: false,
                    },
                );
                self.actions.push(Action::Write(e));
            }
        }
    }

    fn broadcast(&mut self, entries: Vec<Entry>) {
        let Some(lead) = self.lead.as_mut() else {
            return;
        };
        lead.last_send = self.now;
        lead.sent_commits = self.commits.clone();
        for e in &entries {
            if lead.sent.back().is_none_or(|&(s, _)| s < e.seq) {
                lead.sent.push_back((e.seq, self.now));
            }
        }
        for p in self.peers() {
            self.send_entries(p, entries.clone());
        }
    }

    /// Serves once every merged slot has a majority: all commit together.
    fn check_merged(&mut self) {
        let quorum = self.quorum.clone();
        let Some(lead) = self.lead.as_mut() else {
            return;
        };
        if lead.commit.is_some() || lead.merging.values().any(|a| !quorum.reached_by(a)) {
            return;
        }
        let merged: Vec<Seq> = std::mem::take(&mut lead.merging).into_keys().collect();
        // Dependent mode lists committed WAW predecessors a follower may still miss
        // (`set_waw_floor`); conflict order uses only the RAW lists.
        let trail = match self.cfg.mode {
            Mode::Dependent => WAW_TRAIL,
            Mode::Parallel { .. } => 0,
        };
        #[allow(unused_mut)]
        let mut commit = DepLeader::with_trail(quorum, self.cfg.window, lead.end, trail);
        #[cfg(feature = "broken")]
        if !self.cfg.trail_lists_committed {
            commit.break_trail();
        }
        lead.commit = Some(commit);
        if self.members.prev.is_some() {
            // A change's joint stage, from an earlier leader: finish it (a fresh version,
            // accepted anew) before starting any other.
            lead.change = Some(Change {
                barrier: lead.end,
                last: false,
            });
        }
        let start = lead.start;
        for s in merged {
            self.mark_committed(s);
        }
        self.stats.merges += 1;
        self.set_role(Role::Leader);
        self.actions.push(Action::Serving {
            term: self.hard.term,
            start,
        });
        self.broadcast(Vec::new());
    }

    /// Appends a record declaring what it touches. Returns its ticket; the result follows
    /// as an [`Action::Result`].
    pub fn append(
        &mut self,
        now: Nanos,
        declared: Declared,
        data: Vec<u8>,
    ) -> Result<Ticket, OooAppendError> {
        self.now = self.now.max(now);
        let mode = self.cfg.mode;
        let term = self.hard.term;
        let leader = self.leader;
        let Some(lead) = self.lead.as_mut().filter(|l| l.commit.is_some()) else {
            return Err(OooAppendError::NotLeader { leader });
        };
        if let Some(t) = &lead.transfer {
            return Err(OooAppendError::Transferring { to: t.to });
        }
        if !self.members.voters.contains(&self.cfg.id) {
            return Err(OooAppendError::Leaving {
                voters: self.members.voters.clone(),
            });
        }
        let commit = lead.commit.as_mut().expect("serving");
        let body_of = |seq| -> Result<(), OooError> {
            if let Declared::Blocks(r) = &declared {
                if let Some(r) = r.iter().find(|r| r.start >= r.end) {
                    return Err(OooError::Malformed {
                        seq,
                        detail: format!("empty block range {}..{}", r.start, r.end),
                    });
                }
            }
            Ok(())
        };
        body_of(lead.end)?;
        let body = match (mode, declared) {
            (Mode::Parallel { .. }, Declared::Blocks(ranges)) => {
                let after = if self.cfg.conflict_order {
                    let raw = commit
                        .admit_conflicting(conflict_keys(&ranges).as_deref())?
                        .deps
                        .raw;
                    self.stats.admitted_after += u64::from(!raw.is_empty());
                    raw
                } else {
                    commit.admit(&[], &[])?;
                    Vec::new()
                };
                let st = lead.look.stamp(ranges)?;
                Body::Parallel {
                    ranges: st.ranges,
                    look_behind: st.look_behind,
                    after,
                    data: data.into(),
                }
            }
            (
                Mode::Dependent,
                Declared::Txn {
                    read_set,
                    write_set,
                },
            ) => {
                let de = commit.admit(&read_set, &write_set)?;
                self.stats.admitted_after += u64::from(!de.deps.raw.is_empty());
                Body::Dependent {
                    base: de.base,
                    deps: de.deps,
                    write_set: de.write_set,
                    data: data.into(),
                }
            }
            (mode, d) => {
                return Err(OooAppendError::WrongMode {
                    declared: match d {
                        Declared::Blocks(_) => "block-range",
                        Declared::Txn { .. } => "read/write-set",
                    },
                    mode,
                })
            }
        };
        let seq = lead.end;
        lead.end += 1;
        let eid = term << 32 | lead.next_eid;
        lead.next_eid += 1;
        let e = Entry {
            seq,
            term,
            start: lead.start,
            eid,
            body,
        };
        self.write_local(e.clone(), term);
        self.outbox.push(e);
        self.mine.insert(seq, eid);
        // The leader's own copy counts toward a majority once it is durable
        // ([`Self::persisted`]), so a driver may keep appending and replicating while
        // its disk syncs.
        self.finish();
        Ok(Ticket { seq, eid })
    }

    /// Leader: whether an entry declaring `declared`, appended now, would wait to commit
    /// for an entry not yet committed — in dependent mode a RAW predecessor, under
    /// conflict order an earlier entry overlapping its blocks ([`DepLeader::would_wait`]).
    /// False where nothing orders commits (plain parallel mode) and when not serving.
    pub fn would_wait(&self, declared: &Declared) -> bool {
        let Some(commit) = self.lead.as_ref().and_then(|l| l.commit.as_ref()) else {
            return false;
        };
        match (self.cfg.mode, declared) {
            (Mode::Dependent, Declared::Txn { read_set, .. }) => commit.would_wait(read_set),
            (Mode::Parallel { .. }, Declared::Blocks(ranges)) if self.cfg.conflict_order => {
                conflict_keys(ranges).is_none_or(|keys| commit.would_wait(&keys))
            }
            _ => false,
        }
    }

    /// Leader, dependent mode: whether an entry writing what `declared` writes, appended
    /// now, would be ordered after a writer some live replica (this one included) has not
    /// applied yet, as its last acknowledgement said ([`DepLeader::would_order`]). Such an
    /// entry waits on that replica for the writer — for as long as its copy takes to
    /// arrive when it is the one that is late. False in parallel mode and when not
    /// serving. Followers not heard within an election timeout, or being caught up, are
    /// left out, as they are when the leader sets the window base.
    pub fn would_order(&self, declared: &Declared) -> bool {
        self.orders_after(declared, self.apply_floor())
    }

    /// Leader: the rule a driver packing the records of one round into group entries
    /// asks per record ([`super::group::waiting_last`]): whether to put it into an entry
    /// after the others taken with it, because it would wait to commit
    /// ([`Self::would_wait`]) or, on some replica, to apply ([`Self::would_order`]).
    /// Either way a group whose other records need not wait would wait with it, as a
    /// group commits and applies whole. The replicas' apply heads are read once, here.
    pub fn packs_last(&self) -> impl Fn(&Declared) -> bool + '_ {
        let floor = self.apply_floor();
        move |d| self.would_wait(d) || self.orders_after(d, floor)
    }

    /// Leader, dependent mode: the lowest apply head among the live replicas, this one
    /// included; `None` in parallel mode and when not serving.
    fn apply_floor(&self) -> Option<Seq> {
        let lead = self.lead.as_ref().filter(|l| l.commit.is_some())?;
        if !matches!(self.cfg.mode, Mode::Dependent) {
            return None;
        }
        let live = lead.slowest(self.now, self.cfg.election_timeout, |p| p.applied);
        Some(live.min(self.applier.head()))
    }

    /// Whether `declared` writes a key whose last writer a replica that applied every
    /// slot below `floor` may still have to apply ([`Self::apply_floor`]).
    fn orders_after(&self, declared: &Declared, floor: Option<Seq>) -> bool {
        let commit = self.lead.as_ref().and_then(|l| l.commit.as_ref());
        match (floor, commit, declared) {
            (Some(since), Some(c), Declared::Txn { write_set, .. }) => {
                c.would_order(write_set, since)
            }
            _ => false,
        }
    }

    /// The driver made these writes durable: the `(seq, eid, term)` of entries from
    /// [`Action::Write`]s, reported in any later call once synced. A leader counts its own
    /// copy of a slot toward a majority only from here — not when it asked for the write —
    /// so a driver may overlap the leader's sync with replication and with the next
    /// appends (Raft's leader writes its log in parallel with replicating it, for the same
    /// reason). Reports of another term's versions, or of versions replaced since, are
    /// ignored.
    pub fn persisted(&mut self, now: Nanos, written: &[(Seq, u64, u64)]) {
        self.now = self.now.max(now);
        let (me, term) = (self.me(), self.hard.term);
        for &(seq, eid, t) in written {
            if t != term
                || !self
                    .log
                    .get(&seq)
                    .is_some_and(|s| s.entry.eid == eid && s.entry.term == t)
            {
                continue;
            }
            let Some(lead) = self.lead.as_mut() else {
                break;
            };
            if lead.commit.is_none() {
                if let Some(holders) = lead.merging.get_mut(&seq) {
                    holders.insert(me);
                }
            } else {
                self.leader_ack(seq, me);
            }
        }
        self.check_merged();
        self.finish();
    }

    fn leader_ack(&mut self, seq: Seq, node: NodeId) {
        let Some(commit) = self.lead.as_mut().and_then(|l| l.commit.as_mut()) else {
            return;
        };
        let held = commit.held();
        let committed = commit.ack(seq, node);
        self.stats.held_at_quorum += commit.held() - held;
        for s in committed {
            self.mark_committed(s);
        }
    }

    /// A message from a leader of `term`: a stale one is answered with our term (so it
    /// steps down) and refused; otherwise we follow it.
    fn follow(&mut self, from: NodeId, term: u64) -> bool {
        if term < self.hard.term {
            self.send_head(from);
            return false;
        }
        if term > self.hard.term || self.lead.is_some() || self.leader != Some(from) {
            self.step_down(term, Some(from));
        }
        self.heard = Some(self.now);
        self.reset_deadline();
        true
    }

    /// An acknowledgement of nothing, carrying our term and first uncommitted slot.
    fn send_head(&mut self, to: NodeId) {
        self.actions.push(Action::Send {
            to,
            msg: Msg::Ack {
                term: self.hard.term,
                seqs: Vec::new(),
                head: self.commits.head(),
                applied: self.applier.head(),
            },
        });
    }

    fn on_append(
        &mut self,
        from: NodeId,
        term: u64,
        start: Seq,
        entries: Vec<Entry>,
        window: CommitWindow,
        config: (u64, u64),
    ) {
        if !self.follow(from, term) {
            return;
        }
        if self.hard.lost_below != 0
            && self.lost_end.is_none()
            && self
                .asked_end
                .is_none_or(|t| self.now >= t + self.cfg.heartbeat_interval)
        {
            self.asked_end = Some(self.now);
            self.actions.push(Action::Send {
                to: from,
                msg: Msg::AskEnd {
                    term,
                    nonce: self.lost_nonce,
                },
            });
        }
        let other = config != self.members.version;
        if other && epoch(self.members.version) < epoch(config) {
            // The leader's membership has not arrived yet: no entries before it. Saying
            // which one we hold gets it sent.
            self.save_hard();
            self.send_config_ack(from);
            return;
        }
        if self.hard.leader_start.0 < term {
            // Saved before the acknowledgement below: from now on this replica reports
            // older versions from `start` on as superseded.
            self.hard.leader_start = (term, start);
        }
        self.save_hard();
        let mut seqs = Vec::with_capacity(entries.len());
        for e in entries {
            // Below the base: committed, and held here in the state machine's durable
            // image. A merging leader re-sends such slots (this replica may have granted
            // its vote before compacting them); the merge decides a committed slot as
            // its committed version, so the acknowledgement is true — and without it the
            // merge could wait forever for a majority.
            if e.seq < self.hard.base {
                seqs.push((e.seq, e.eid));
                continue;
            }
            // A malformed entry is neither written nor acknowledged.
            if self.check_entry(&e).is_err() {
                self.stats.refused += 1;
                continue;
            }
            if self
                .log
                .get(&e.seq)
                .is_some_and(|s| s.committed && s.entry.eid != e.eid)
            {
                self.stats.refused += 1;
                continue;
            }
            seqs.push((e.seq, e.eid));
            self.write_local(e, term);
        }
        let ready: Vec<Seq> = self
            .log
            .range(self.commits.head()..)
            .filter(|(&s, slot)| {
                !slot.committed && slot.confirmed == term && window.is_committed(s)
            })
            .map(|(&s, _)| s)
            .collect();
        for s in ready {
            self.mark_committed(s);
        }
        self.actions.push(Action::Send {
            to: from,
            msg: Msg::Ack {
                term,
                seqs,
                head: self.commits.head(),
                applied: self.applier.head(),
            },
        });
        if other {
            // We hold a membership the leader does not (a newer one it abandoned, or it
            // has never set one since the group's voters changed): it sends its own.
            self.send_config_ack(from);
        }
    }

    /// A follower recovering lost entries asks where our slots end. The first time for
    /// a restart (`nonce`), its acknowledgements of slots not yet committed are forgotten
    /// — it may have lost those copies — so it is resent what it lacks from its first
    /// uncommitted slot on, acknowledged or not, and no commit or merge counts a lost
    /// copy. The answer is our end: every slot it was ever sent by us is below, and every
    /// slot an earlier term may have committed is below our merge start.
    fn on_ask_end(&mut self, from: NodeId, term: u64, nonce: u64) {
        if term != self.hard.term {
            return;
        }
        let Some(lead) = self.lead.as_mut() else {
            return;
        };
        let Some(peer) = lead.peers.get_mut(&from) else {
            return;
        };
        if peer.forgot != Some(nonce) {
            peer.forgot = Some(nonce);
            peer.acked.clear();
            for acks in lead.merging.values_mut() {
                acks.remove(&from);
            }
            if let Some(c) = lead.commit.as_mut() {
                c.forget(from);
            }
        }
        let end = lead.end;
        self.actions.push(Action::Send {
            to: from,
            msg: Msg::End { term, end },
        });
    }

    fn send_config_ack(&mut self, to: NodeId) {
        self.actions.push(Action::Send {
            to,
            msg: Msg::ConfigAck {
                term: self.hard.term,
                version: self.members.version,
                head: self.commits.head(),
            },
        });
    }

    /// Refuses entries that do not fit this group: the wrong mode, a look-behind buffer
    /// longer than the span or reaching before slot 0, empty ranges, dependencies outside
    /// `base..seq` or not ascending.
    fn check_entry(&self, e: &Entry) -> Result<(), OooError> {
        let bad = |detail: &str| OooError::Malformed {
            seq: e.seq,
            detail: detail.to_string(),
        };
        match (&e.body, self.cfg.mode) {
            (Body::Null, _) => Ok(()),
            (
                Body::Parallel {
                    ranges,
                    look_behind,
                    after,
                    ..
                },
                Mode::Parallel { span },
            ) => {
                if look_behind.len() > span || look_behind.len() as u64 > e.seq {
                    return Err(bad("look-behind buffer too long"));
                }
                if after.windows(2).any(|w| w[0] >= w[1]) || after.iter().any(|&p| p >= e.seq) {
                    return Err(bad(
                        "conflict-order predecessors not before the entry or not ascending",
                    ));
                }
                if ranges
                    .iter()
                    .chain(look_behind.iter().flatten())
                    .any(|r| r.start >= r.end)
                {
                    return Err(bad("empty block range"));
                }
                Ok(())
            }
            (Body::Dependent { base, deps, .. }, Mode::Dependent) => {
                if *base > e.seq {
                    return Err(bad("window base after the entry"));
                }
                for d in [&deps.raw, &deps.waw] {
                    if d.windows(2).any(|w| w[0] >= w[1])
                        || d.iter().any(|&p| p >= e.seq || p < *base)
                    {
                        return Err(bad("dependencies outside base..seq or not ascending"));
                    }
                }
                Ok(())
            }
            _ => Err(bad("entry of the other mode")),
        }
    }

    fn on_ack(&mut self, from: NodeId, term: u64, seqs: Vec<(Seq, u64)>, head: Seq, applied: Seq) {
        if term > self.hard.term {
            self.step_down(term, None);
            return;
        }
        if term < self.hard.term {
            return;
        }
        let now = self.now;
        let Some(lead) = self.lead.as_mut() else {
            return;
        };
        let Some(peer) = lead.peers.get_mut(&from) else {
            return;
        };
        peer.heard = now;
        // Its latest word, even if lower: a restarted follower may know less committed
        // than it said before (its saved head is a lower bound), and resends start here.
        peer.head = head;
        peer.applied = applied;
        if peer.head >= self.commits.head() {
            peer.catching_up = false;
        }
        if peer.head >= self.hard.base
            || peer
                .snap
                .as_ref()
                .is_some_and(|o| head >= o.base || o.part.is_some_and(|f| applied < f))
        {
            // Caught up with the log, or installed the image it was sent and still behind
            // (this replica compacted again meanwhile), or the partial image it is being
            // sent was built for more than it has applied (it restarted, and refuses
            // that image): a fresh image, at once.
            peer.snap = None;
            peer.snap_asked = None;
        }
        // Streaming catch-up: a follower still below our committed head gets the next
        // piece with every acknowledgement — one batch per round trip, within the rate
        // limit — instead of one per resend interval.
        let catch_up = peer.catching_up;
        let h = peer.head;
        peer.acked = peer.acked.split_off(&h);
        let mut acked = Vec::new();
        let sent = &lead.sent;
        let mut rtt = None;
        for (s, eid) in seqs {
            if self.log.get(&s).is_some_and(|slot| slot.entry.eid == eid) {
                // A round trip from a copy sent once (Karn's rule: an answer to a resent
                // copy does not say which copy it answers); of those one message answers,
                // the latest sent gives the tightest.
                if peer.acked.insert(s) && !peer.resent.contains_key(&s) {
                    if let Ok(i) = sent.binary_search_by_key(&s, |&(q, _)| q) {
                        let r = now.saturating_sub(sent[i].1);
                        rtt = Some(rtt.map_or(r, |x: Nanos| x.min(r)));
                    }
                }
                acked.push(s);
            }
        }
        if let Some(r) = rtt {
            peer.rtt.sample(r);
        }
        if catch_up {
            let missing = self.missing_for(from);
            if !missing.is_empty()
                && self.spend_catchup(from, missing.iter().map(entry_bytes).sum())
            {
                self.send_entries(from, missing);
            }
        }
        let lead = self.lead.as_mut().expect("leading");
        if lead.commit.is_none() {
            for s in acked {
                if let Some(a) = lead.merging.get_mut(&s) {
                    a.insert(from);
                }
            }
            self.check_merged();
        } else {
            self.set_waw_floor();
            for s in acked {
                self.leader_ack(s, from);
            }
            self.resend_holes(from);
            self.check_transfer();
            self.check_change();
        }
    }

    /// Dependent mode: entries admitted from now on list WAW predecessors from the first
    /// slot a live follower may be missing ([`DepLeader::set_floor`]). Followers not
    /// heard within an election timeout, or being caught up by streaming or an image,
    /// do not hold the base down.
    fn set_waw_floor(&mut self) {
        let (now, timeout) = (self.now, self.cfg.election_timeout);
        let Some(lead) = self.lead.as_mut() else {
            return;
        };
        let first_missing = lead.slowest(now, timeout, |p| p.head);
        if let Some(c) = lead.commit.as_mut() {
            c.set_floor(first_missing);
        }
    }

    /// Resends to `p` the recent slots it has been overtaken on
    /// ([`OooConfig::hole_resend`]), each again only once overtaken `hole_resend` more
    /// times, at most a batch at a time.
    fn resend_holes(&mut self, p: NodeId) {
        let (k, now) = (self.cfg.hole_resend, self.now);
        let Some(lead) = self.lead.as_mut() else {
            return;
        };
        let from = lead.fresh;
        let Some(peer) = lead.peers.get_mut(&p) else {
            return;
        };
        if k == 0 || peer.catching_up || peer.snap.is_some() {
            return;
        }
        // Slots below `lo` are not resent again this term (`fresh` only grows).
        let lo = from.max(peer.head);
        peer.resent = peer.resent.split_off(&lo);
        // The newest slot it acknowledged: slots `k` or more below it were overtaken.
        let Some(&newest) = peer.acked.last() else {
            return;
        };
        let Some(upto) = newest.checked_sub(k) else {
            return;
        };
        if lo > upto {
            return;
        }
        let batch = self.cfg.max_batch.max(1);
        let mut entries = Vec::new();
        for (&s, slot) in self.log.range(lo..=upto) {
            if entries.len() >= batch {
                break;
            }
            if peer.acked.contains(&s) {
                continue;
            }
            if peer.resent.get(&s).is_some_and(|&(at, _)| newest < at + k) {
                continue;
            }
            peer.resent.insert(s, (newest, now));
            entries.push(slot.entry.clone());
        }
        if entries.is_empty() {
            return;
        }
        self.stats.hole_resends += entries.len() as u64;
        self.send_entries(p, entries);
    }

    /// Resends to each follower the uncommitted slots it has not acknowledged within its
    /// timeout ([`OooConfig::timed_resend`]), at most a batch at a time: only slots first
    /// sent since the last periodic resend (older ones are its), each again only twice the
    /// timeout after its last resend.
    fn resend_timed(&mut self) {
        let factor = self.cfg.timed_resend;
        let (now, timeout, head) = (self.now, self.cfg.election_timeout, self.commits.head());
        let batch = self.cfg.max_batch.max(1);
        let Some(lead) = self.lead.as_mut() else {
            return;
        };
        if factor == 0 || lead.commit.is_none() {
            return;
        }
        // What is committed needs no timer, but a follower's acknowledgements of slots it
        // does not know committed yet are still round trips: keep those until its head
        // passes them (followers that do not keep pace do not hold this back).
        let keep = head.min(lead.slowest(now, timeout, |p| p.head));
        while lead.sent.front().is_some_and(|&(s, _)| s < keep) {
            lead.sent.pop_front();
        }
        let mut sends = Vec::new();
        for (&id, peer) in lead.peers.iter_mut() {
            let Some(after) = peer.rtt.timeout(factor) else {
                continue;
            };
            if !peer.keeps_pace(now, timeout) {
                continue;
            }
            let lo = lead.fresh.max(peer.head);
            let first = lead.sent.partition_point(|&(s, _)| s < lo);
            let mut entries = Vec::new();
            for &(s, at) in lead.sent.range(first..) {
                if at.saturating_add(after) > now || entries.len() >= batch {
                    break;
                }
                let Some(slot) = self.log.get(&s) else {
                    continue;
                };
                if slot.committed || peer.acked.contains(&s) {
                    continue;
                }
                if peer
                    .resent
                    .get(&s)
                    .is_some_and(|&(_, t)| t.saturating_add(2 * after) > now)
                {
                    continue;
                }
                let newest = peer.acked.last().copied().unwrap_or(0);
                peer.resent.insert(s, (newest, now));
                entries.push(slot.entry.clone());
            }
            if !entries.is_empty() {
                sends.push((id, entries));
            }
        }
        for (to, entries) in sends {
            self.stats.timed_resends += entries.len() as u64;
            self.send_entries(to, entries);
        }
    }

    /// Leader: when [`OooConfig::timed_resend`] may next resend something (the oldest
    /// uncommitted slot's timeout at the quickest follower), so that a driver waiting for
    /// input wakes for it; `None` when nothing is in flight or the rule is off. A time
    /// already past means "on the next tick".
    pub fn resend_due(&self) -> Option<Nanos> {
        let lead = self.lead.as_ref()?;
        if self.cfg.timed_resend == 0 || lead.commit.is_none() {
            return None;
        }
        let head = self.commits.head();
        let &(_, at) = lead
            .sent
            .get(lead.sent.partition_point(|&(s, _)| s < head))?;
        let after = lead
            .peers
            .values()
            .filter_map(|p| p.rtt.timeout(self.cfg.timed_resend))
            .min()?;
        Some(at.saturating_add(after))
    }

    /// Leader: sends `entries` to one follower, with the commit window and membership
    /// version every [`Msg::Append`] carries.
    fn send_entries(&mut self, to: NodeId, entries: Vec<Entry>) {
        self.actions.push(Action::Send {
            to,
            msg: Msg::Append {
                term: self.hard.term,
                start: self.hard.leader_start.1,
                entries,
                commits: self.commits.clone(),
                config: self.members.version,
            },
        });
    }

    fn lead_tick(&mut self) {
        let now = self.now;
        let timeout = self.cfg.election_timeout;
        let lead = self.lead.as_ref().expect("leading");
        let heard: Vec<NodeId> = lead
            .peers
            .iter()
            .filter(|(_, p)| now.saturating_sub(p.heard) < timeout)
            .map(|(&id, _)| id)
            .collect();
        if !self.quorum_with_me(heard) {
            // Cannot reach a majority: stop taking appends that cannot commit.
            self.step_down(self.hard.term, None);
            return;
        }
        let lead = self.lead.as_mut().expect("leading");
        if lead.transfer.is_some_and(|t| now >= t.until) {
            lead.transfer = None;
            self.stats.transfers_expired += 1;
        }
        self.check_transfer();
        self.resend_timed();
        let lead = self.lead.as_mut().expect("leading");
        if now.saturating_sub(lead.last_resend) >= self.cfg.resend_interval {
            lead.last_resend = now;
            lead.fresh = lead.end;
            let committed = self.commits.head();
            for peer in lead.peers.values_mut() {
                peer.catching_up = peer.head < committed && peer.head == peer.tick_head;
                peer.tick_head = peer.head;
            }
            let mut sends = Vec::new();
            for p in self.peers() {
                if self.snapshot_tick(p) {
                    continue;
                }
                let missing = self.missing_for(p);
                if !missing.is_empty()
                    && self.spend_catchup(p, missing.iter().map(entry_bytes).sum())
                {
                    sends.push((p, missing));
                }
            }
            for (to, entries) in sends {
                self.send_entries(to, entries);
            }
            // Followers that have not said they hold our membership get it again.
            let version = self.members.version;
            let stale: Vec<NodeId> = self
                .lead
                .as_ref()
                .expect("leading")
                .peers
                .iter()
                .filter(|(_, p)| p.config.unwrap_or((0, 0)) != version)
                .map(|(&id, _)| id)
                .collect();
            for p in stale {
                self.send_config(Some(p));
            }
        }
        let lead = self.lead.as_ref().expect("leading");
        if now.saturating_sub(lead.last_send) >= self.cfg.heartbeat_interval {
            self.broadcast(Vec::new());
        }
    }

    /// Whether a piece for `p` fits its catch-up budget (charging it if so). Only a
    /// follower in streaming catch-up is limited: new appends and the merge are not.
    fn spend_catchup(&mut self, p: NodeId, need: u64) -> bool {
        // The bucket holds at most 100 ms of the rate (or two pieces, if more).
        let rate = self.cfg.catchup_rate;
        let (cap, now) = (
            (2 * self.cfg.max_batch_bytes.max(1) as u64).max(rate / 10),
            self.now,
        );
        let Some(peer) = self.lead.as_mut().and_then(|l| l.peers.get_mut(&p)) else {
            return false;
        };
        if rate == 0 || !(peer.catching_up || peer.snap.is_some()) {
            return true;
        }
        let earned = (now.saturating_sub(peer.refilled) as u128 * rate as u128 / 1_000_000_000)
            .min(cap as u128) as u64;
        if earned > 0 {
            peer.budget = (peer.budget + earned).min(cap);
            peer.refilled = now;
        }
        // A piece larger than the cap (one huge entry) goes once the budget is full.
        if peer.budget >= need.min(cap) {
            peer.budget = peer.budget.saturating_sub(need);
            self.stats.catchup_bytes += need;
            true
        } else {
            self.stats.catchup_deferred += 1;
            false
        }
    }

    /// The next piece a follower lacks: the slots from its first uncommitted one that it
    /// has not acknowledged in this term. A follower catching up gets every slot from its
    /// head, acknowledged or not: it may have restarted since, and a slot read back from
    /// disk is not confirmed until this leader sends it again.
    ///
    /// While the merge is under way, the merged slots it has not acknowledged come first,
    /// whatever its head: they must reach a majority before the leader serves.
    fn missing_for(&self, p: NodeId) -> Vec<Entry> {
        let Some(lead) = self.lead.as_ref() else {
            return Vec::new();
        };
        let Some(peer) = lead.peers.get(&p) else {
            return Vec::new();
        };
        if peer.head < self.hard.base && lead.merging.is_empty() {
            // What it lacks first is compacted here: it gets an image ([`Self::snapshot_tick`]).
            return Vec::new();
        }
        let batch = self.cfg.max_batch.max(1);
        let merging = lead
            .merging
            .iter()
            .filter(|(_, acks)| !acks.contains(&p))
            .map(|(s, _)| *s);
        let normal = self
            .log
            .range(peer.head..lead.end)
            .filter(|(s, _)| peer.catching_up || !peer.acked.contains(s))
            .map(|(s, _)| *s);
        let mut seqs: Vec<Seq> = merging.take(batch).collect();
        if seqs.len() < batch {
            let more: Vec<Seq> = normal
                .filter(|s| !seqs.contains(s))
                .take(batch - seqs.len())
                .collect();
            seqs.extend(more);
        }
        let max_bytes = self.cfg.max_batch_bytes.max(1) as u64;
        let mut bytes = 0;
        let mut out = Vec::new();
        for slot in seqs.iter().filter_map(|s| self.log.get(s)) {
            let b = entry_bytes(&slot.entry);
            if !out.is_empty() && bytes + b > max_bytes {
                break;
            }
            bytes += b;
            out.push(slot.entry.clone());
        }
        out
    }

    /// The driver made its state machine durable after every slot below `upto` had been
    /// applied (a checkpoint; PolarFS section 5.3: "all log entries before the checkpoint
    /// are applied to data blocks and the checkpoint is allowed to contain some log
    /// entries committed after the checkpoint"). Those slots are compacted: dropped here,
    /// the new base saved, then an [`Action::Compact`] lets the driver drop them from its
    /// file. `upto` is capped at the applied head; nothing happens while an image is being
    /// installed.
    ///
    /// The image may hold effects of entries past `upto` (applied out of order); replaying
    /// them after a restart writes the same values again in an order the apply rules
    /// allow, so the state machine's writes must be blind (a block write, a put), as both
    /// demo state machines' are.
    pub fn compact(&mut self, now: Nanos, upto: Seq) {
        self.now = self.now.max(now);
        let upto = upto.min(self.applier.head());
        // Not while an image is coming in either: its base could fall below ours, and
        // installing it would then take the state back.
        if upto <= self.hard.base
            || self.incoming.is_some()
            || self.install.is_some()
            || self.installing.is_some()
        {
            return;
        }
        let kept = self.log.split_off(&upto);
        let gone = std::mem::replace(&mut self.log, kept);
        self.remember_written(self.hard.base, upto, gone);
        self.hard.base = upto;
        self.hard.committed_head = self.hard.committed_head.max(self.commits.head());
        self.stats.compactions += 1;
        self.save_hard();
        let live = self.log.values().map(|s| s.entry.clone()).collect();
        self.actions.push(Action::Compact { base: upto, live });
        self.finish();
    }

    /// Every slot below this one is compacted ([`Hard::base`]).
    pub fn base(&self) -> Seq {
        self.hard.base
    }

    /// How far a checkpoint taken now may let [`Self::compact`] go without sending anyone
    /// an image: the applied head, and on a leader no further than the first uncommitted
    /// slot of any follower heard from within the election timeout (followers learn
    /// commits a message later than the leader, so compacting to the leader's own head
    /// would send every follower an image at every compaction). A follower that is not
    /// heard from does not hold compaction back; it gets an image when it returns. A
    /// driver short of space may compact to the applied head regardless (PolarFS section
    /// 5.3 keeps entries "until short of resource or some threshold reached").
    pub fn compactable(&self) -> Seq {
        let applied = self.applier.head();
        let Some(lead) = self.lead.as_ref() else {
            return applied;
        };
        let timeout = self.cfg.election_timeout;
        lead.peers
            .values()
            .filter(|p| self.now.saturating_sub(p.heard) < timeout)
            .map(|p| p.head)
            .fold(applied, Seq::min)
    }

    /// What the compacted slots `from..upto` (dropped from the log: `gone`) wrote, kept
    /// for partial images while the total stays within bounds (the oldest forgotten
    /// first).
    fn remember_written(&mut self, from: Seq, upto: Seq, gone: BTreeMap<Seq, Slot>) {
        if self.cfg.partial_image_items == 0 {
            return;
        }
        // The map covers `written_from..from` slot by slot (each compaction adds its
        // slots; eviction takes from the front).
        debug_assert_eq!(self.written_from + self.written.len() as u64, from);
        for s in from..upto {
            let f = gone
                .get(&s)
                .map(|x| Footprint::of(&x.entry))
                .unwrap_or_default();
            self.written_items += f.items();
            self.written.insert(s, f);
        }
        let cap = self.cfg.partial_image_items.saturating_mul(4);
        while self.written_items > cap || self.written.len() as u64 > cap {
            let Some((s, f)) = self.written.pop_first() else {
                break;
            };
            self.written_items -= f.items();
            self.written_from = s + 1;
        }
    }

    /// Leader, for the driver serving an [`Action::Snapshot`] for `to`: `Some((from,
    /// footprint))` when `to` may be sent a partial image — what the slots from its first
    /// unapplied slot `from` up to [`Self::applied_head`] wrote — instead of the whole
    /// state. Read it together with the applied head, and pass `from` to
    /// [`Self::snapshot_ready`] as the image's part.
    ///
    /// Why that suffices (PolarFS section 5.3's fast catch-up): the follower has applied
    /// every slot below `from`, so every block or key no slot from `from` on writes is
    /// already as the image would have it; the rest is in the footprint, whose state the
    /// image carries at least as new as the base (later effects are written again by
    /// replay, the writes being blind). `None` (a whole image): this replica does not
    /// remember what some of those slots wrote (it restarted or installed an image since
    /// they were compacted), the footprint is larger than
    /// [`OooConfig::partial_image_items`], or `to` is not a follower it leads.
    pub fn image_scope(&self, to: NodeId) -> Option<(Seq, Footprint)> {
        let peer = self.lead.as_ref()?.peers.get(&to)?;
        let (from, upto) = (peer.applied, self.applier.head());
        let cap = self.cfg.partial_image_items;
        if cap == 0 || from < self.written_from || from >= upto {
            return None;
        }
        let mut f = Footprint::default();
        for (_, w) in self.written.range(from..) {
            f.add(w);
            if f.items() > cap {
                return None;
            }
        }
        for (_, slot) in self.log.range(from.max(self.hard.base)..upto) {
            f.add_entry(&slot.entry);
            if f.items() > cap {
                return None;
            }
        }
        Some((from, f))
    }

    /// Leader: the image the driver took for follower `to` after an [`Action::Snapshot`].
    /// It covers every slot below `base`, the applied head when the driver took it;
    /// `part` is `Some(from)` for a partial image built from [`Self::image_scope`]. It is
    /// streamed in pieces of `max_batch_bytes` under the catch-up rate limit; the follower
    /// installs it and continues from `base` with the log, which this replica still holds
    /// from there on (an image whose base fell below a later compaction is dropped, and a
    /// new one asked for at the next resend).
    pub fn snapshot_ready(
        &mut self,
        now: Nanos,
        to: NodeId,
        base: Seq,
        part: Option<Seq>,
        image: Vec<u8>,
    ) {
        self.now = self.now.max(now);
        let (hard_base, applied, started) = (self.hard.base, self.applier.head(), self.now);
        if let Some(peer) = self.lead.as_mut().and_then(|l| l.peers.get_mut(&to)) {
            if base >= hard_base
                && base <= applied
                && peer.head < base
                && peer.snap.is_none()
                && part.is_none_or(|f| f <= base)
            {
                if part.is_some() {
                    self.stats.partial_images += 1;
                }
                peer.snap = Some(Outgoing {
                    base,
                    part,
                    image,
                    sent: 0,
                    finished: false,
                    started,
                });
                self.send_pieces(to);
            } else {
                peer.snap_asked = None;
            }
        }
        self.finish();
    }

    /// Leader, at each resend: a follower whose first uncommitted slot is below our base
    /// gets an image instead of entries. Asks the driver for one, streams the pieces the
    /// budget allows, and starts over if the follower has not installed it `snapshot_retry`
    /// after it began. Returns whether `p` is below the base.
    fn snapshot_tick(&mut self, p: NodeId) -> bool {
        let (now, base, retry) = (self.now, self.hard.base, self.cfg.snapshot_retry);
        let Some(peer) = self.lead.as_mut().and_then(|l| l.peers.get_mut(&p)) else {
            return false;
        };
        if peer.head >= base {
            return false;
        }
        if peer
            .snap
            .as_ref()
            .is_some_and(|o| o.finished && now.saturating_sub(o.started) >= retry)
        {
            // Streamed and still not installed: a piece was lost, or the follower
            // restarted. Take a fresh image.
            peer.snap = None;
            peer.snap_asked = None;
        }
        if peer.snap.is_none() {
            if peer
                .snap_asked
                .is_none_or(|t| now.saturating_sub(t) >= retry)
            {
                peer.snap_asked = Some(now);
                self.stats.snapshots_sent += 1;
                self.actions.push(Action::Snapshot { to: p });
            }
            return true;
        }
        self.send_pieces(p);
        true
    }

    /// Sends the pieces of `p`'s image that its catch-up budget covers.
    fn send_pieces(&mut self, p: NodeId) {
        let piece = self.cfg.max_batch_bytes.max(1);
        let term = self.hard.term;
        loop {
            let Some(out) = self
                .lead
                .as_ref()
                .and_then(|l| l.peers.get(&p))
                .and_then(|x| x.snap.as_ref())
            else {
                return;
            };
            if out.finished {
                return;
            }
            let end = (out.sent + piece).min(out.image.len());
            if !self.spend_catchup(p, (end - out.sent) as u64 + 64) {
                return;
            }
            let out = self
                .lead
                .as_mut()
                .and_then(|l| l.peers.get_mut(&p))
                .and_then(|x| x.snap.as_mut())
                .expect("checked above");
            let msg = Msg::Snapshot {
                term,
                base: out.base,
                offset: out.sent as u64,
                total: out.image.len() as u64,
                part: out.part,
                data: out.image[out.sent..end].to_vec(),
            };
            out.sent = end;
            out.finished = end == out.image.len();
            self.actions.push(Action::Send { to: p, msg });
        }
    }

    /// Follower: a piece of the leader's image. Pieces must arrive in order from offset
    /// 0; a gap drops what was gathered (the leader starts over after `snapshot_retry`).
    fn on_snapshot(
        &mut self,
        from: NodeId,
        term: u64,
        (base, part): (Seq, Option<Seq>),
        offset: u64,
        total: u64,
        data: Vec<u8>,
    ) {
        if !self.follow(from, term) {
            return;
        }
        self.save_hard();
        if base <= self.commits.head() || self.install.is_some() || self.installing.is_some() {
            // The log from our head on does (or an image being installed will): say where
            // we are, so the leader stops streaming.
            self.incoming = None;
            if self.install.is_none() && self.installing.is_none() {
                self.send_head(from);
            }
            return;
        }
        if offset
            .checked_add(data.len() as u64)
            .is_none_or(|e| e > total)
        {
            self.stats.refused += 1;
            self.incoming = None;
            return;
        }
        match &mut self.incoming {
            _ if offset == 0 => {
                self.incoming = Some(Incoming {
                    term,
                    base,
                    part,
                    total,
                    buf: data,
                })
            }
            Some(inc)
                if inc.term == term
                    && inc.base == base
                    && inc.part == part
                    && inc.total == total
                    && inc.buf.len() as u64 == offset =>
            {
                inc.buf.extend_from_slice(&data)
            }
            _ => {
                self.incoming = None;
                return;
            }
        }
        if self
            .incoming
            .as_ref()
            .is_some_and(|i| i.buf.len() as u64 == i.total)
        {
            let inc = self.incoming.take().expect("checked");
            self.install = Some((inc.base, inc.part, inc.buf));
            self.try_install();
        }
    }

    /// Hands a received image to the driver once no apply is in flight. A partial image
    /// built for a first unapplied slot past ours is refused: what we lack below it is
    /// not in the image (we restarted since we told the leader, and replay from our base
    /// has not reached it); the leader learns our applied slot and sends another.
    fn try_install(&mut self) {
        if !self.applying.is_empty() {
            return;
        }
        let Some((base, part, image)) = self.install.take() else {
            return;
        };
        if part.is_some_and(|f| self.applier.head() < f) {
            self.stats.partial_images_refused += 1;
            if let Some(l) = self.leader.filter(|_| self.lead.is_none()) {
                self.send_head(l);
            }
            return;
        }
        self.installing = Some(base);
        self.actions.push(Action::Install {
            base,
            image,
            part: part.is_some(),
        });
    }

    /// Follower: the driver installed the image of an [`Action::Install`] durably. Slots
    /// below its base are dropped, the apply rules restart there (the slots from there on
    /// that this replica holds committed are applied again: blind writes, see
    /// [`Self::compact`]), the new base is saved and the leader learns our head.
    ///
    /// A pending append (a deposed leader's) at a slot below the base cannot learn which
    /// entry committed there: it ends in [`Action::Unknown`].
    pub fn installed(&mut self, now: Nanos, base: Seq) -> Result<(), OooError> {
        self.install_reported(now, base)?;
        self.stats.snapshots_installed += 1;
        self.log = self.log.split_off(&base);
        // What the slots below the image's base wrote is not known here.
        self.written.clear();
        self.written_items = 0;
        self.written_from = base;
        let kept = self.mine.split_off(&base);
        for (seq, eid) in std::mem::replace(&mut self.mine, kept) {
            self.actions.push(Action::Unknown { eid, seq });
        }
        let committed: Vec<Seq> = self
            .log
            .iter()
            .filter(|(_, s)| s.committed)
            .map(|(&s, _)| s)
            .collect();
        let mut w = CommitWindow::new(base);
        for &s in &committed {
            w.commit(s);
        }
        self.commits = w;
        self.applier = Applier::new(self.cfg.mode, base);
        for s in committed {
            let e = self.log[&s].entry.clone();
            if let Err(why) = self.applier.feed(&e) {
                debug_assert!(false, "committed entry refused by the applier: {why}");
            }
        }
        self.hard.base = base;
        self.hard.committed_head = self.commits.head();
        self.save_hard();
        let live = self.log.values().map(|s| s.entry.clone()).collect();
        self.actions.push(Action::Compact { base, live });
        if let Some(l) = self.leader.filter(|_| self.lead.is_none()) {
            self.send_head(l);
        }
        self.finish();
        Ok(())
    }

    /// Follower: the driver could not install the image of an [`Action::Install`] (its
    /// state machine refused it and kept its state). Applies resume; the leader sends a
    /// new image after `snapshot_retry`.
    pub fn install_failed(&mut self, now: Nanos, base: Seq) -> Result<(), OooError> {
        self.install_reported(now, base)?;
        self.finish();
        Ok(())
    }

    /// The driver reports on the [`Action::Install`] of `base`: refused if there is none.
    fn install_reported(&mut self, now: Nanos, base: Seq) -> Result<(), OooError> {
        self.now = self.now.max(now);
        if self.installing != Some(base) {
            return Err(OooError::Malformed {
                seq: base,
                detail: "an install reported without an Install action".into(),
            });
        }
        self.installing = None;
        Ok(())
    }

    /// Marks a slot this replica holds committed: observers, the applier, results.
    fn mark_committed(&mut self, s: Seq) {
        let Some(slot) = self.log.get_mut(&s) else {
            return;
        };
        if slot.committed {
            return;
        }
        slot.committed = true;
        let e = slot.entry.clone();
        self.commits.commit(s);
        if let Err(why) = self.applier.feed(&e) {
            debug_assert!(false, "committed entry refused by the applier: {why}");
        }
        if let Some(eid) = self.mine.remove(&s) {
            let outcome = if eid == e.eid {
                Outcome::Committed
            } else {
                Outcome::Failed
            };
            self.actions.push(Action::Result {
                eid,
                seq: s,
                outcome,
            });
        }
        self.actions.push(Action::Committed(e));
    }

    fn pump_apply(&mut self) {
        if self.install.is_some() || self.installing.is_some() {
            // The state machine is about to be replaced.
            return;
        }
        for s in self.applier.take_ready() {
            if self.applying.insert(s) {
                let e = self.log[&s].entry.clone();
                self.actions.push(Action::Apply(e));
            }
        }
    }

    /// The driver applied `seq` (from an [`Action::Apply`]).
    pub fn applied(&mut self, seq: Seq) -> Result<(), OooError> {
        if !self.applying.remove(&seq) {
            return Err(OooError::Malformed {
                seq,
                detail: "applied without an Apply action".into(),
            });
        }
        self.applier.applied(seq)?;
        self.try_install();
        self.finish();
        Ok(())
    }

    /// Common tail of every input: results of a pending follower, applies, the commit
    /// window to followers, the committed head to disk.
    fn finish(&mut self) {
        if self.role == Role::PendingFollower && self.mine.is_empty() {
            self.set_role(Role::Follower);
        }
        self.apply_dirty = true;
        if let Some(lead) = self.lead.as_ref() {
            // New entries waiting in the outbox will carry the window.
            if lead.sent_commits != self.commits && self.outbox.is_empty() {
                self.broadcast(Vec::new());
            }
        }
        // Recovering lost entries: done once every slot below a bound a leader gave has
        // committed here (see [`Hard::after_loss`]).
        let head = self.commits.head();
        if self.hard.lost_below != 0
            && ((self.hard.leader_start.0 >= self.hard.lost_below
                && head >= self.hard.leader_start.1)
                || self.lost_end.is_some_and(|end| head >= end))
        {
            self.hard.lost_below = 0;
            self.hard.committed_head = self.commits.head();
            self.stats.lost_restored += 1;
            self.save_hard();
        }
        // The saved committed head is a hint (a lower bound that shortens recovery and
        // the merge range), so it is saved after it moved by `HEAD_SAVE_EVERY` slots — not on every commit, which would cost a
        // crash-atomic replace (three syncs) per commit.
        if self.commits.head() >= self.saved.committed_head + HEAD_SAVE_EVERY {
            self.hard.committed_head = self.commits.head();
            self.save_hard();
        }
    }
}

#[cfg(test)]
mod tests;
