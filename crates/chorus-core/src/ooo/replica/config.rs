//! The settings of an out-of-order replica ([`OooConfig`]) and their defaults: the mode,
//! the window, the timers of elections (Raft's randomised timeouts), heartbeats and
//! resends (TCP's fast retransmit and tail loss probe), the bounds of catch-up (PolarFS
//! section 5.4: bounded pieces, a rate limit, partial images) and conflict order.

use super::Mode;
use crate::format::meta::NodeId;
use crate::replica::Nanos;

/// Settings of an out-of-order replica.
#[derive(Clone, Debug)]
pub struct OooConfig {
    /// This replica.
    pub id: NodeId,
    /// The voters the group was created with (this replica included, unless it joins an
    /// existing group: then empty, and it learns the membership from the leader). A
    /// saved [`Membership`] handed to [`OooReplica::recover`] takes precedence.
    ///
    /// [`Membership`]: super::Membership
    /// [`OooReplica::recover`]: super::OooReplica::recover
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
    ///
    /// [`OooReplica::image_scope`]: super::OooReplica::image_scope
    pub partial_image_items: u64,
    /// Parallel mode only: commit in conflict order — the leader commits an entry only
    /// once every earlier entry whose blocks overlap it has committed (the DP-Raft paper's
    /// adaptation of ParallelRaft to transactions, section 5, with a transaction's read
    /// and write keys as blocks). Off by default: block writes need no commit order
    /// (PolarFS section 5.1). Each entry lists the uncommitted overlapping slots it waits
    /// for ([`Body::Parallel`]'s `after`), so that across a leader change a merge that
    /// drops one of them drops the entry too, as dependent mode does along RAW
    /// predecessors.
    ///
    /// [`Body::Parallel`]: super::Body::Parallel
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
    /// Bytes of entries one vote message carries, roughly (record bytes plus a fixed
    /// allowance per entry; at least one entry). A granted vote carrying more goes in
    /// pieces ([`Msg::VotePart`]), each asked for by the candidate: a voter whose log
    /// past the candidate's head is large (holes it has not been sent again) would
    /// otherwise answer with a message above the transport's frame limit, and no
    /// candidate could win with its vote.
    ///
    /// [`Msg::VotePart`]: super::Msg::VotePart
    pub vote_bytes: usize,
    /// Seed of the election back-off.
    pub seed: u64,
    /// Whether an election timeout starts a pre-vote ([`Msg::PreVote`]) rather than a
    /// campaign. On by default; off replays the protocol without it (tests).
    ///
    /// [`Msg::PreVote`]: super::Msg::PreVote
    pub pre_vote: bool,
    /// Whether the ghost guard is on (NULL entries stamped with the new term and
    /// [`merge::drop_superseded`]). Only the test-only `broken` build can turn it off.
    ///
    /// [`merge::drop_superseded`]: crate::ooo::merge::drop_superseded
    #[cfg(feature = "broken")]
    pub ghost_guard: bool,
    /// Whether the merge cascades NULLs along the predecessors entries list
    /// ([`merge::MergeOptions`]). Only the test-only `broken` build can turn it off.
    ///
    /// [`merge::MergeOptions`]: crate::ooo::merge::MergeOptions
    #[cfg(feature = "broken")]
    pub cascade: bool,
    /// Whether a dependent leader lists committed WAW writers from its trailing window
    /// base ([`DepLeader::set_floor`]). Only the test-only `broken` build can turn it off.
    ///
    /// [`DepLeader::set_floor`]: crate::ooo::dependent::DepLeader::set_floor
    #[cfg(feature = "broken")]
    pub trail_lists_committed: bool,
    /// Whether a replica recovering lost entries ([`Hard::lost_below`]) abstains from
    /// votes and campaigns. Only the test-only `broken` build can turn it off.
    ///
    /// [`Hard::lost_below`]: super::Hard::lost_below
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
            vote_bytes: VOTE_BYTES,
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

    pub(super) fn lost_guard(&self) -> bool {
        #[cfg(feature = "broken")]
        {
            self.lost_guard
        }
        #[cfg(not(feature = "broken"))]
        {
            true
        }
    }

    pub(super) fn ghost_guard(&self) -> bool {
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

/// The default [`OooConfig::vote_bytes`]: 32 MiB, an eighth of the transport's frame
/// limit, and room for the largest entry body (64 MiB) in a piece of its own.
pub const VOTE_BYTES: usize = 32 << 20;

/// The default [`OooConfig::hole_resend`]: TCP's three duplicate acknowledgements.
pub const HOLE_RESEND: u64 = 3;

/// The default [`OooConfig::timed_resend`]: two median round trips, TCP's tail loss
/// probe timeout (RFC 8985 section 7.2, twice the smoothed round trip).
pub const TIMED_RESEND: u32 = 2;
