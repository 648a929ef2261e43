//! Reconfiguration (PALF section 5.3): the membership lives in meta storage, and a
//! single-member change carries a log barrier at the leader's end: a replica adopts a
//! config only once its log matches the leader's up to the barrier (ruling out Fig. 8a).
//! Commits count a majority of the new voters and, until the change is accepted, of the
//! previous ones. A replacement adds the new voter first and removes the old one once
//! that is accepted.

use crate::format::meta::{ConfigVersion, Membership, NodeId};
use crate::Lsn;

use super::leader::Progress;
use super::{Nanos, Replica};

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
    /// The strict check ([`Replica::check_change`], [`Replica::check_transfer_to`]) refused
    /// a change that would cost the group availability; forcing it skips the check.
    #[error("strict check: {0} (forcing the change skips this check)")]
    Unsafe(String),
}

impl Replica {
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

    /// The strict reconfiguration check an operator's change passes first unless forced
    /// (etcd's `--strict-reconfig-check`; PALF adds replicas as learners and promotes
    /// them once caught up, section 5.3). Refused, naming why:
    /// - a voter added directly (`AddVoter`, or `Replace` by a node not yet a learner): it
    ///   holds none of the log, or does not exist, yet every majority needs it at once;
    ///   add it as a learner, let it catch up, then promote it;
    /// - a promotion of a learner not heard from within the lease;
    /// - a removal (or replacement) after which the live voters left are fewer than a
    ///   majority of the voters left: the group would stop.
    ///
    /// Everything else is checked by [`Replica::change_membership`] itself.
    pub fn check_change(&self, change: &MembershipChange) -> Result<(), ChangeError> {
        if !self.leading.as_ref().is_some_and(|l| l.serving) {
            return Err(ChangeError::NotLeader);
        }
        let me = self.cfg.id;
        let cur = &self.meta_want.membership;
        let member = |n: NodeId| cur.voters.contains(&n) || cur.learners.contains(&n);
        let live = |n: NodeId| n == me || self.alive(n);
        let unsafe_ = |s: String| Err(ChangeError::Unsafe(s));
        match *change {
            MembershipChange::AddVoter(n) | MembershipChange::Replace { new: n, .. }
                if !member(n) =>
            {
                unsafe_(format!(
                    "node {n} would be a voter holding none of the log (or a node that does not exist), and every majority of the new membership would need it: add it as a learner, let it catch up, then promote it (`chorus member add` does all three)"
                ))
            }
            MembershipChange::Promote(n) if cur.learners.contains(&n) && !live(n) => unsafe_(
                format!("learner {n} has not been heard from within the lease: it may be down"),
            ),
            MembershipChange::Remove(n) if cur.voters.contains(&n) => {
                let rest: Vec<NodeId> = cur.voters.iter().copied().filter(|v| *v != n).collect();
                let up: Vec<NodeId> = rest.iter().copied().filter(|v| live(*v)).collect();
                if !rest.is_empty() && up.len() < rest.len() / 2 + 1 {
                    return unsafe_(format!(
                        "without node {n} the voters would be {rest:?}, of which only {up:?} have been heard from within the lease: fewer than a majority, so the group would stop"
                    ));
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// The strict check a leader transfer passes first unless forced: the target must
    /// have been heard from within the lease and be within one window (`window_bytes`)
    /// of the committed end. A transfer freezes appends until the target holds the whole
    /// log, for at most a lease: to a node down or far behind, that is a lease of
    /// unavailability and then no transfer.
    pub fn check_transfer_to(&self, to: NodeId) -> Result<(), ChangeError> {
        let Some(l) = self.leading.as_ref().filter(|l| l.serving) else {
            return Err(ChangeError::NotLeader);
        };
        if to == self.cfg.id || !self.is_voter(to) {
            return Ok(()); // refused by transfer_leader, by name
        }
        if !self.alive(to) {
            return Err(ChangeError::Unsafe(format!(
                "node {to} has not been heard from within the lease: it may be down or cut off, and a transfer would freeze appends for a lease"
            )));
        }
        let matched = l.progress.get(&to).map_or(0, |p| p.matched);
        let committed = self.log.committed;
        if committed.saturating_sub(matched) > self.cfg.window_bytes {
            return Err(ChangeError::Unsafe(format!(
                "node {to} is behind: it holds the log up to LSN {matched}, {} bytes short of the committed end {committed} (more than a window, {} bytes); a transfer would freeze appends while it catches up",
                committed - matched,
                self.cfg.window_bytes
            )));
        }
        Ok(())
    }

    /// The serving leader proposes `new` (the current config changed): the next version
    /// under its pid, a barrier at the log end, and then `then_remove` once accepted.
    pub(super) fn propose_config(
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
    pub(super) fn set_membership(&mut self, m: Membership) {
        if m.access_mode != self.meta_want.membership.access_mode {
            self.meta_want.access_mode_version += 1;
        }
        self.meta_want.membership = m;
    }
}
