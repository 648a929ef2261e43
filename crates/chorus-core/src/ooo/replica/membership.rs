//! Membership changes: the voters are kept beside the hard state rather than in the log
//! (PALF section 5.3 keeps its membership in meta storage too) and changed by joint
//! consensus (Raft's): a joint stage needing majorities of the old and the new voters for
//! every decision, accepted by replicas that hold every slot below the leader's end when
//! the change began, then a final stage. Appends go on throughout. A leader re-stamps its
//! membership with its term, and a follower takes entries only under the leader's
//! membership epoch, so log order and membership order never disagree.

use std::collections::BTreeSet;

use super::leader::Peer;
use super::{Action, Msg, OooReplica};
use crate::format::meta::NodeId;
use crate::ooo::Seq;
use crate::quorum::Quorum;
use crate::replica::{Nanos, Role};

/// The voters of an out-of-order group, kept beside the hard state rather than in the log
/// (PALF section 5.3 keeps its membership in meta storage too): entries do not have to be
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
        match &self.prev {
            Some(prev) => Quorum::joint(self.voters.clone(), prev.clone()),
            None => Quorum::majority(self.voters.clone()),
        }
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
pub(super) fn epoch(v: (u64, u64)) -> (u64, u64) {
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
    #[error("not the serving leader ({})", crate::LeaderHint(*.leader))]
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
    /// Refused by the strict check ([`OooReplica::strict_check`]): the change would cost
    /// the group its availability. Forcing the change skips the check.
    #[error("change refused: strict check: {0} (forcing the change skips this check)")]
    Unsafe(String),
}

/// A membership change under way on the leader: its joint stage is accepted by a
/// majority of both sets that hold every slot below `barrier`, then its final stage by a
/// majority of the new voters.
#[derive(Clone, Debug)]
pub(super) struct Change {
    /// The leader's end when the change began.
    pub(super) barrier: Seq,
    /// In the final stage.
    pub(super) last: bool,
}

impl OooReplica {
    /// The strict check a change passes first unless forced (etcd's
    /// `--strict-reconfig-check`, as the ordered replica's): a removal (or replacement)
    /// after which the voters left that this leader has heard within an election timeout
    /// are fewer than a majority of the voters left is refused — the group would stop
    /// until a voter returns. A voter joining counts as heard only once it has answered.
    /// Everything else is checked by [`Self::change_membership`] itself.
    pub fn strict_check(&self, change: &OooMembershipChange) -> Result<(), OooChangeError> {
        let leader = self.leader;
        let Some(lead) = self.lead.as_ref().filter(|l| l.commit.is_some()) else {
            return Err(OooChangeError::NotLeader { leader });
        };
        let (remove, add) = match *change {
            OooMembershipChange::AddVoter(_) => return Ok(()),
            OooMembershipChange::Remove(n) => (n, None),
            OooMembershipChange::Replace { remove, add } => (remove, Some(add)),
        };
        if !self.members.voters.contains(&remove) {
            return Ok(()); // refused by name by `change_membership`
        }
        let (me, now, timeout) = (self.cfg.id, self.now, self.cfg.election_timeout);
        let live = |n: NodeId| {
            n == me
                || lead
                    .peers
                    .get(&n)
                    .is_some_and(|p| now.saturating_sub(p.heard) < timeout)
        };
        let mut rest: Vec<NodeId> = self
            .members
            .voters
            .iter()
            .copied()
            .filter(|&v| v != remove)
            .collect();
        rest.extend(add.filter(|a| !rest.contains(a)));
        rest.sort_unstable();
        let up: Vec<NodeId> = rest.iter().copied().filter(|&v| live(v)).collect();
        if !rest.is_empty() && up.len() < rest.len() / 2 + 1 {
            return Err(OooChangeError::Unsafe(format!(
                "without node {remove} the voters would be {rest:?}, of which only {up:?} have been heard from within an election timeout: fewer than a majority, so the group would stop"
            )));
        }
        Ok(())
    }

    /// [`Self::change_membership`] after [`Self::strict_check`], unless `force`.
    pub fn change_membership_checked(
        &mut self,
        now: Nanos,
        change: OooMembershipChange,
        force: bool,
    ) -> Result<(), OooChangeError> {
        self.now = self.now.max(now);
        if !force {
            self.strict_check(&change)?;
        }
        self.change_membership(now, change)
    }

    /// Changes the group's voters (PALF section 5.3's membership change, here by joint
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
    pub(super) fn restamp(&mut self) {
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
    pub(super) fn send_config(&mut self, to: Option<NodeId>) {
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
    pub(super) fn check_change(&mut self) {
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
    pub(super) fn on_config(&mut self, from: NodeId, term: u64, membership: Membership) {
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
    pub(super) fn adopt(&mut self, membership: Membership) {
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

    pub(super) fn on_config_ack(
        &mut self,
        from: NodeId,
        term: u64,
        version: (u64, u64),
        head: Seq,
    ) {
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

    pub(super) fn send_config_ack(&mut self, to: NodeId) {
        self.actions.push(Action::Send {
            to,
            msg: Msg::ConfigAck {
                term: self.hard.term,
                version: self.members.version,
                head: self.commits.head(),
            },
        });
    }
}
