//! Leader transfer (PALF section 3.4's leadership transfer, as the ordered mode does it;
//! Raft's TimeoutNow): the leader stops taking appends, waits until everything it has is
//! committed and the target reports a first uncommitted slot at its end (so the target's
//! vote log is as new as any voter's and it wins), then tells it to campaign at once. A
//! transfer not done within an election timeout is given up. It only moves a campaign
//! earlier, so the safety argument is unchanged.

use super::{Action, Msg, OooReplica};
use crate::format::meta::NodeId;
use crate::replica::Nanos;

/// A leader transfer: appends are refused until `until`; once `to` holds and knows
/// committed every slot below `end`, it is told to campaign ([`Msg::TimeoutNow`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct Transfer {
    /// The target.
    pub(super) to: NodeId,
    /// When the transfer is given up.
    pub(super) until: Nanos,
    /// [`Msg::TimeoutNow`] went to the target.
    sent: bool,
}

/// Why a leader transfer was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OooTransferError {
    /// Only a serving leader (its merge done) hands leadership over.
    #[error("not the serving leader ({})", crate::LeaderHint(*.leader))]
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
    /// Refused by the strict check ([`OooReplica::transfer_leader_checked`]): the target
    /// has not been heard from within an election timeout.
    #[error("transfer refused: strict check: node {to} has not been heard from within an election timeout: it may be down or cut off, and a transfer would refuse appends for an election timeout (forcing the transfer skips this check)")]
    NotHeard {
        /// The target.
        to: NodeId,
    },
    /// Refused by the strict check: the target is more than a window of slots behind the
    /// committed head.
    #[error("transfer refused: strict check: node {to} is behind: its first uncommitted slot is {head}, more than a window ({window} slots) short of the committed head {committed}; a transfer would refuse appends while it catches up (forcing the transfer skips this check)")]
    Behind {
        /// The target.
        to: NodeId,
        /// Its first uncommitted slot, as it last reported.
        head: u64,
        /// This leader's committed head.
        committed: u64,
        /// [`OooConfig::window`].
        ///
        /// [`OooConfig::window`]: super::OooConfig::window
        window: u64,
    },
}

impl OooReplica {
    /// Hands leadership to `to` (PALF section 4's leader transfer, as the ordered mode
    /// does it): new appends are refused with [`OooAppendError::Transferring`]; once
    /// every slot this leader has is committed and `to` reports knowing so (its first
    /// uncommitted slot is our end — so it holds them all, and its vote log is as new as
    /// any voter's), `to` is sent [`Msg::TimeoutNow`] and campaigns at once. Its merge
    /// then runs as after any election. If that has not happened within an election
    /// timeout, the transfer is given up and appends resume here. Nothing about safety
    /// changes: a TimeoutNow only makes a replica campaign earlier than its timer would.
    ///
    /// [`OooAppendError::Transferring`]: super::OooAppendError::Transferring
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

    /// [`Self::transfer_leader`] after the strict check unless `force` (as the ordered
    /// replica's): the target must have been heard from within an election timeout and
    /// be at most a window ([`OooConfig::window`]) of slots behind the committed head.
    /// A transfer refuses appends until the target has caught up, for at most an
    /// election timeout: to a node down or far behind, that is an election timeout of
    /// refused appends and then no transfer.
    ///
    /// [`OooConfig::window`]: super::OooConfig::window
    pub fn transfer_leader_checked(
        &mut self,
        now: Nanos,
        to: NodeId,
        force: bool,
    ) -> Result<(), OooTransferError> {
        self.now = self.now.max(now);
        if !force && to != self.cfg.id && self.members.voters.contains(&to) {
            if let Some(lead) = self.lead.as_ref().filter(|l| l.commit.is_some()) {
                let (now, timeout) = (self.now, self.cfg.election_timeout);
                let Some(p) = lead
                    .peers
                    .get(&to)
                    .filter(|p| now.saturating_sub(p.heard) < timeout)
                else {
                    return Err(OooTransferError::NotHeard { to });
                };
                let committed = self.commits.head();
                if committed.saturating_sub(p.head) > self.cfg.window {
                    return Err(OooTransferError::Behind {
                        to,
                        head: p.head,
                        committed,
                        window: self.cfg.window,
                    });
                }
            }
        }
        self.transfer_leader(now, to)
    }

    /// The leader transfer under way, if any: the target.
    pub fn transferring_to(&self) -> Option<NodeId> {
        self.lead.as_ref()?.transfer.map(|t| t.to)
    }

    /// Sends the transfer's TimeoutNow once its target has caught up.
    pub(super) fn check_transfer(&mut self) {
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

    pub(super) fn on_timeout_now(&mut self, from: NodeId, term: u64) {
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
}
