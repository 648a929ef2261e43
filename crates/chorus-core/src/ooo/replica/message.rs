//! What replicas of an out-of-order group send each other ([`Msg`]) and what the replica
//! asks of its driver ([`Action`]), executed in order under the durability rules of the
//! parent module's documentation.

use super::{Entry, Hard, Membership};
use crate::format::meta::NodeId;
use crate::ooo::dependent::VoteLog;
use crate::ooo::CommitWindow;
use crate::ooo::Seq;
use crate::replica::{Outcome, Role};

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
    /// A piece of a granted vote too large for one message ([`OooConfig::vote_bytes`]):
    /// the voter's versions from slot `from` up to `next` (or to its end). The first
    /// piece answers a [`Msg::Vote`] and starts at the candidate's head; each later one
    /// answers a [`Msg::VoteMore`]. The vote counts once the last piece has arrived.
    ///
    /// [`OooConfig::vote_bytes`]: super::OooConfig::vote_bytes
    VotePart {
        /// The voter's term (the candidate's: only a granted vote comes in pieces).
        term: u64,
        /// The first slot this piece covers.
        from: Seq,
        /// The first slot of the next piece, or `None` if this is the last.
        next: Option<Seq>,
        /// The voter's entries in `from..next`, with whether it knows each committed.
        entries: Vec<(Entry, bool)>,
        /// The voter's [`Hard::leader_start`].
        leader_start: (u64, Seq),
    },
    /// A candidate asks a voter that granted its vote in pieces for the next one.
    VoteMore {
        /// The candidate's term.
        term: u64,
        /// The slot the piece starts at (the last piece's `next`).
        from: Seq,
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
        ///
        /// [`OooReplica::image_scope`]: super::OooReplica::image_scope
        applied: Seq,
    },
    /// A piece of the leader's state-machine image, for a follower whose first
    /// uncommitted slot the leader has compacted (PolarFS section 5.4, streaming catch-up:
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
        /// `base` wrote (PolarFS section 5.4's fast catch-up from the leader's data), for a
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
    /// election timeout (the ordered mode's transfer, PALF section 3.4; Raft's TimeoutNow).
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
    /// A leader asks whether the voter still takes it as the leader of `term`, for the
    /// leader reads taken before it (see the `reads` module).
    ReadProbe {
        /// The leader's term.
        term: u64,
        /// The probe's number: an answer to it answers every earlier one too.
        probe: u64,
    },
    /// The answer to [`Msg::ReadProbe`]: the voter's term after taking it (a later term
    /// than the prober's deposes it).
    ReadProbeAck {
        /// The voter's term.
        term: u64,
        /// The probe answered.
        probe: u64,
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
    ///
    /// [`OooReplica::recover`]: super::OooReplica::recover
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
    ///
    /// [`OooReplica::applied`]: super::OooReplica::applied
    Apply(Entry),
    /// The final result of an append.
    Result {
        /// The append's identity (from its [`Ticket`]).
        ///
        /// [`Ticket`]: super::Ticket
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
    ///
    /// [`OooReplica::applied_head`]: super::OooReplica::applied_head
    /// [`OooReplica::snapshot_ready`]: super::OooReplica::snapshot_ready
    /// [`OooReplica::image_scope`]: super::OooReplica::image_scope
    /// [`Footprint`]: super::Footprint
    Snapshot {
        /// The follower.
        to: NodeId,
    },
    /// Follower: replace the state machine with this image (it covers every slot below
    /// `base`), durably, then call [`OooReplica::installed`]. No apply is in flight, and
    /// none is released until then.
    ///
    /// [`OooReplica::installed`]: super::OooReplica::installed
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
