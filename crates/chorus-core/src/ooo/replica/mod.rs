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
//!
//! # Code layout
//!
//! This module holds the types a driver sees, the replica's state and its entry points
//! ([`OooReplica::tick`], [`OooReplica::receive`], [`OooReplica::take_actions`]). The
//! settings are in `config`; each part of the protocol is a child module adding its
//! methods to [`OooReplica`]: `entry` and `message` (what slots hold and what replicas
//! exchange), `election` (pre-vote, votes, campaigns), `merging` (a new leader's merge),
//! `leader` (appends, acknowledgements, commits, the leader's timer), `resend` (what
//! followers lack), `follower` (taking entries and commits from a leader), `apply`
//! (committed slots and the apply rules), `images` (compaction, snapshots, install),
//! `membership` and `transfer`.
//!
//! [`merge::drop_superseded`]: super::merge::drop_superseded
//! [`DepLeader`]: super::dependent::DepLeader
//! [`ParallelApplier`]: super::parallel::ParallelApplier
//! [`DepApplier`]: super::dependent::DepApplier
//! [`Outcome::Committed`]: crate::replica::Outcome::Committed
//! [`Outcome::Failed`]: crate::replica::Outcome::Failed

mod apply;
mod config;
mod election;
mod entry;
mod follower;
mod images;
mod leader;
mod membership;
mod merging;
mod message;
mod reads;
mod resend;
mod transfer;

use std::collections::{BTreeMap, BTreeSet};

use super::{CommitWindow, Seq};
use crate::format::meta::NodeId;
use crate::quorum::Quorum;
use crate::replica::{Nanos, Role};
use crate::rng::Rng;

use apply::Applier;
use images::Incoming;
use leader::Lead;

pub use config::{OooConfig, HOLE_RESEND, TIMED_RESEND, VOTE_BYTES};
pub use entry::{Body, Declared, Entry};
pub use images::Footprint;
pub use leader::{OooAppendError, Ticket};
pub use membership::{Membership, OooChangeError, OooMembershipChange};
pub use message::{Action, Msg};
pub use reads::{OooReadIndexError, ReadTicket};
pub use transfer::OooTransferError;

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
    ///
    /// [`merge::drop_superseded`]: super::merge::drop_superseded
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

/// A granted vote's versions (with whether the voter knows each committed) and its
/// [`Hard::leader_start`].
type Answer = (Vec<(Entry, bool)>, (u64, Seq));

/// A slot this replica holds.
#[derive(Clone, Debug)]
struct Slot {
    /// The version held (the latest written).
    entry: Entry,
    /// Term of the leader this version was last received from (0: from disk).
    confirmed: u64,
    /// Committed here: set once, by [`OooReplica::mark_committed`] (or at a restart, for
    /// the committed prefix), together with the slot's bit in `commits`.
    committed: bool,
}

/// Slots the committed head may move before it is saved again.
const HEAD_SAVE_EVERY: u64 = 1024;

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
    ///
    /// [`merge::drop_superseded`]: super::merge::drop_superseded
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
    ///
    /// [`DepLeader::held`]: super::dependent::DepLeader::held
    pub held_at_quorum: u64,
    /// Entries resent to a follower that acknowledged later ones
    /// ([`OooConfig::hole_resend`]).
    pub hole_resends: u64,
    /// Entries resent to a follower that had not acknowledged them within the timeout of
    /// [`OooConfig::timed_resend`].
    pub timed_resends: u64,
    /// Vote pieces sent after the first ([`Msg::VotePart`] answering a
    /// [`Msg::VoteMore`]): granted votes too large for one message.
    pub vote_parts_sent: u64,
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
    /// Settings, fixed for the replica's life.
    cfg: OooConfig,
    /// The group's membership as this replica holds it (saved with
    /// [`Action::SaveMembership`] whenever it changes).
    members: Membership,
    /// Who must agree to a decision: always `members.quorum()`.
    quorum: Quorum,
    /// The election timer's randomness.
    rng: Rng,
    /// The latest time any input carried: never goes back.
    now: Nanos,
    /// The hard state as it should be: `base <= committed_head <= commits.head()`, and
    /// while leading, `leader_start` is `(term, lead.start)`.
    hard: Hard,
    /// The hard state last handed out to be saved ([`Self::save_hard`]).
    saved: Hard,
    /// The current role: [`Role::Leader`] exactly while serving ([`Self::is_serving`]),
    /// [`Role::PendingFollower`] only while appends of its own still wait for a result.
    role: Role,
    /// The leader this replica follows (itself while leading).
    leader: Option<NodeId>,
    /// The slots held, from the base on (none below `hard.base`; while leading, none at
    /// or past `lead.end`). Every slot from the base to the committed head is held and
    /// committed.
    log: BTreeMap<Seq, Slot>,
    /// Which slots are committed here; its head (the first slot not known committed) only
    /// moves forward, and every slot below it is held committed.
    commits: CommitWindow,
    /// When the election timer fires next.
    deadline: Nanos,
    /// Granted votes of the current term with what each voter sent; empty unless
    /// campaigning or leading (a grant that arrives during the merge stays until the next
    /// campaign or step-down).
    votes: BTreeMap<NodeId, Answer>,
    /// Granted votes of the current term still arriving in pieces ([`Msg::VotePart`]):
    /// what each voter sent so far and the slot its next piece starts at. Empty unless
    /// campaigning; a voter is here or in `votes`, never both.
    vote_parts: BTreeMap<NodeId, (Answer, Seq)>,
    /// During a pre-vote: the term it asks about and the voters that said yes. `None`
    /// while leading.
    pre: Option<(u64, BTreeSet<NodeId>)>,
    /// When a leader of the current term was last heard (its appends, heartbeats,
    /// membership): while that is within an election timeout, pre-votes are refused.
    heard: Option<Nanos>,
    /// Leader state, from the merge on: `Some` exactly while this replica leads (it
    /// follows itself, and its peers never include itself).
    lead: Option<Lead>,
    /// The apply rules, fed committed slots only: its head (the first slot not applied)
    /// is at least the base and at most the committed head.
    applier: Applier,
    /// Slots handed to the driver with [`Action::Apply`] and not yet reported applied:
    /// all at or above the applied head, and none while an image is installed.
    applying: BTreeSet<Seq>,
    /// Appends of this replica still waiting for their result, by slot (identity): all at
    /// or above the committed head, since a slot's commit decides its append.
    mine: BTreeMap<Seq, u64>,
    /// Outputs not yet taken by the driver.
    actions: Vec<Action>,
    /// Inputs arrived since the apply rules were last consulted.
    apply_dirty: bool,
    /// New entries of this leader's term not sent yet: they go out together, in one
    /// message per follower, when the driver drains the actions. Empty unless serving.
    outbox: Vec<Entry>,
    /// The image being received from the leader.
    incoming: Option<Incoming>,
    /// A received image (base, partial image's first slot, bytes) waiting for the applies
    /// in flight to finish. Never set while another image is installed (`installing`).
    install: Option<(Seq, Option<Seq>, Vec<u8>)>,
    /// What the compacted slots from `written_from` up to the base wrote, slot by slot:
    /// the footprint of a partial image for a follower whose first unapplied slot is
    /// among them. Kept in memory only (after a restart, whole images until compactions
    /// refill it), bounded by [`OooConfig::partial_image_items`]. Unless that is 0, it
    /// holds every slot of `written_from..hard.base`.
    written: BTreeMap<Seq, Footprint>,
    /// The first slot `written` describes.
    written_from: Seq,
    /// Blocks plus keys named in `written`.
    written_items: u64,
    /// The base of the image handed to the driver by [`Action::Install`], until
    /// [`OooReplica::installed`].
    installing: Option<Seq>,
    /// Recovering lost entries: the end a leader answered ([`Msg::End`]), and when it was
    /// last asked.
    lost_end: Option<Seq>,
    /// When the leader was last asked where its slots end ([`Msg::AskEnd`]).
    asked_end: Option<Nanos>,
    /// Drawn at each start: names this restart's [`Msg::AskEnd`], so that the leader
    /// forgets this replica's acknowledgements once per restart.
    lost_nonce: u64,
    /// Counters.
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
            vote_parts: BTreeMap::new(),
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
    ///
    /// [`ParallelApplier::take_ready`]: super::parallel::ParallelApplier::take_ready
    /// [`DepApplier::take_ready`]: super::dependent::DepApplier::take_ready
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

    /// Leader only (empty otherwise): each follower's first slot not known committed and
    /// first slot not applied, as it last acknowledged them.
    pub fn follower_heads(&self) -> Vec<(NodeId, Seq, Seq)> {
        self.lead.as_ref().map_or_else(Vec::new, |l| {
            l.peers
                .iter()
                .map(|(&id, p)| (id, p.head, p.applied))
                .collect()
        })
    }

    /// The slot after the last one this replica holds (its base when it holds none): a
    /// state machine restarted from a checkpoint may already hold writes of any slot
    /// below it, applied before the restart ([`Self::recover`] then replays them).
    pub fn log_end(&self) -> Seq {
        self.log
            .keys()
            .next_back()
            .map_or(self.hard.base, |&s| s + 1)
            .max(self.hard.base)
    }

    /// Whether this replica holds entry `eid` at `seq`, or holds the slot's effect in
    /// its state (the slot is below its base). A checker's view of who is up to date.
    pub fn holds(&self, seq: Seq, eid: u64) -> bool {
        seq < self.hard.base || self.log.get(&seq).is_some_and(|s| s.entry.eid == eid)
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

    /// This replica's node.
    pub fn id(&self) -> NodeId {
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

    /// Keeps the deadline at least an election timeout away, drawing nothing: progress
    /// that is not a leader's (a vote arriving in pieces) defers a campaign without
    /// moving the draws every later timeout takes.
    fn extend_deadline(&mut self) {
        self.deadline = self
            .deadline
            .max(self.now + self.cfg.election_timeout.max(1));
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

    /// Advances the clock: elections, heartbeats, resends, the leader's quorum check.
    pub fn tick(&mut self, now: Nanos) {
        self.check_invariants();
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

    /// A message from `from`.
    pub fn receive(&mut self, now: Nanos, from: NodeId, msg: Msg) {
        self.check_invariants();
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
            Msg::VotePart {
                term,
                from: start,
                next,
                entries,
                leader_start,
            } => self.on_vote_part(from, term, start, next, entries, leader_start),
            Msg::VoteMore { term, from: start } => self.on_vote_more(from, term, start),
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
            Msg::ReadProbe { term, probe } => self.on_read_probe(from, term, probe),
            Msg::ReadProbeAck { term, probe } => self.on_read_probe_ack(from, term, probe),
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

    /// Asserts the cheap invariants stated on the fields (those that take no walk over
    /// the log). Compiled in debug builds only; called at the top of the main inputs.
    #[cfg(debug_assertions)]
    fn check_invariants(&self) {
        let (base, head) = (self.hard.base, self.commits.head());
        let applied = self.applier.head();
        assert!(
            base <= applied && applied <= head,
            "base {base} <= applied head {applied} <= committed head {head}"
        );
        assert!(
            base <= self.hard.committed_head && self.hard.committed_head <= head,
            "base {base} <= saved committed head {} <= committed head {head}",
            self.hard.committed_head
        );
        assert!(
            self.log.keys().next().is_none_or(|&s| s >= base),
            "a slot below the base {base} is still held"
        );
        assert!(
            head == base || self.log.get(&(head - 1)).is_some_and(|s| s.committed),
            "the slot below the committed head {head} is not held committed"
        );
        assert!(
            self.applying.first().is_none_or(|&s| s >= applied),
            "an apply in flight below the applied head {applied}"
        );
        assert!(
            self.installing.is_none() || self.applying.is_empty(),
            "an apply in flight while an image is installed"
        );
        assert!(
            self.install.is_none() || self.installing.is_none(),
            "an image waiting while another is installed"
        );
        assert!(
            self.mine.keys().next().is_none_or(|&s| s >= head),
            "a pending append below the committed head {head}"
        );
        assert!(
            self.role != Role::PendingFollower || !self.mine.is_empty(),
            "a pending follower with no pending append"
        );
        assert!(
            self.votes.is_empty() || self.role == Role::Candidate || self.lead.is_some(),
            "votes held outside a campaign"
        );
        assert!(
            self.vote_parts.is_empty() || self.role == Role::Candidate,
            "vote pieces held outside a campaign (role {:?}, lead {})",
            self.role,
            self.lead.is_some()
        );
        assert!(
            self.vote_parts.keys().all(|n| !self.votes.contains_key(n)),
            "a vote both complete and arriving in pieces"
        );
        assert!(
            self.outbox.is_empty() || self.is_serving(),
            "entries waiting to be sent by a replica that does not serve"
        );
        assert!(
            self.quorum == self.members.quorum(),
            "the quorum is not the membership's"
        );
        assert!(
            self.cfg.partial_image_items == 0
                || self.written_from + self.written.len() as u64 == base,
            "what compacted slots wrote is not remembered up to the base {base}"
        );
        assert_eq!(
            self.role == Role::Leader,
            self.is_serving(),
            "the role is Leader exactly while serving"
        );
        if let Some(lead) = &self.lead {
            assert_eq!(self.leader, Some(self.cfg.id), "a leader follows itself");
            assert!(self.pre.is_none(), "a leader asking for pre-votes");
            assert_eq!(
                self.hard.leader_start,
                (self.hard.term, lead.start),
                "a leader's saved merge start is its own"
            );
            assert!(
                lead.start <= lead.end,
                "a leader's end before its merge start"
            );
            assert!(
                self.log.keys().next_back().is_none_or(|&s| s < lead.end),
                "a slot held at or past the leader's end {}",
                lead.end
            );
            assert!(
                lead.commit.is_none() || lead.merging.is_empty(),
                "a serving leader still merging"
            );
            assert!(
                lead.commit.is_some() || (lead.transfer.is_none() && lead.change.is_none()),
                "a transfer or membership change before the merge is done"
            );
            assert!(
                !lead.peers.contains_key(&self.cfg.id),
                "a leader among its own followers"
            );
        }
    }

    #[cfg(not(debug_assertions))]
    fn check_invariants(&self) {}

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
