//! Elections (PALF section 3.4), decoupled from replication: every replica pings its
//! priority, and a voter whose leader lease has expired campaigns when it is the highest
//! priority alive in a majority it can hear. A campaign promises a proposal id above any
//! seen, durably, before it asks for votes; a voter grants (promises) only a proposal id
//! above its promise, and refuses while it knows a higher-priority voter is alive, while
//! a lease it granted is live, or a candidate with an older config version (PALF section
//! 5.3, which rules out Fig. 8b). What a candidate does with the promises is
//! reconfirmation (`reconfirm`).

use std::collections::{BTreeMap, BTreeSet};

use crate::format::meta::{NodeId, Vote};
use crate::Lsn;

use super::reconfirm::MergeCandidate;
use super::{Action, Deferred, Message, Nanos, Outcome, Priority, Replica, Role};

/// The steps of a campaign.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum CampaignPhase {
    /// Waiting for our own promise to be durable.
    Promising,
    /// Prepare sent, collecting acks.
    Preparing,
    /// Fetching the chosen log from `source` up to `target`.
    Fetching { source: NodeId, target: Lsn },
    /// StartWorking written; acting as leader until it commits.
    Confirming,
}

/// A campaign under way, until the new leader serves.
#[derive(Debug)]
pub(super) struct Campaign {
    /// The proposal id it promised itself.
    pub(super) pid: u64,
    /// Started by the leader's [`Message::TimeoutNow`]: voters ignore leases and
    /// priorities.
    pub(super) transfer: bool,
    /// When it started: it is given up after a limit.
    pub(super) started: Nanos,
    /// How far it got.
    pub(super) phase: CampaignPhase,
    /// The durable promises, with each voter's log end and last proposal id (its own
    /// included).
    pub(super) acks: BTreeMap<NodeId, MergeCandidate>,
    /// Voters that refused.
    pub(super) rejected: BTreeSet<NodeId>,
    /// The timestamp each promising voter echoed: the new leader's first lease.
    pub(super) lease_ts: BTreeMap<NodeId, Nanos>,
}

impl Replica {
    pub(super) fn alive(&self, id: NodeId) -> bool {
        self.peers
            .get(&id)
            .and_then(|p| p.last_heard)
            .is_some_and(|t| self.now < t + self.cfg.lease)
    }

    pub(super) fn maybe_campaign(&mut self, transfer: bool) {
        let me = self.cfg.id;
        if !self.is_voter(me) || !self.live() {
            return;
        }
        if !transfer {
            if self.now < self.lease_until || self.now < self.backoff_until {
                return;
            }
            let mine = self.prio();
            let voters = self.meta_want.membership.voters.clone();
            for v in voters.iter().filter(|v| **v != me) {
                if self.alive(*v) && self.peers[v].prio.is_some_and(|p| p > mine) {
                    return;
                }
            }
            // Only the highest priority alive in a majority it can hear (itself included)
            // campaigns: with fewer, no election could succeed.
            if !self
                .voters_quorum()
                .is_reached(|v| v == me || self.alive(v))
            {
                return;
            }
        }
        self.start_campaign(transfer);
    }

    pub(super) fn start_campaign(&mut self, transfer: bool) {
        let me = self.cfg.id;
        self.step_down();
        let pid = self.max_seen_pid.max(self.promised()) + 1;
        self.max_seen_pid = pid;
        self.meta_want.vote = Vote {
            promised_proposal_id: pid,
            voted_for: Some(me),
        };
        self.campaign = Some(Campaign {
            pid,
            transfer,
            started: self.now,
            phase: CampaignPhase::Promising,
            acks: BTreeMap::new(),
            rejected: BTreeSet::new(),
            lease_ts: BTreeMap::new(),
        });
        self.leader = None;
        self.set_role(Role::Candidate);
        self.deferred.push(Deferred::Campaign { pid });
        self.save_meta();
    }

    pub(super) fn on_prepare(
        &mut self,
        from: NodeId,
        pid: u64,
        prio: Priority,
        transfer: bool,
        ts: Nanos,
    ) {
        self.max_seen_pid = self.max_seen_pid.max(pid);
        if prio.id != from {
            self.drop_input(Some(from), "prepare with a forged id");
            return;
        }
        let mine = &self.meta_want.membership;
        if !mine.voters.contains(&from) && prio.config_version <= mine.version {
            self.drop_input(Some(from), "prepare from a non-voter");
            return;
        }
        let refusal = if pid <= self.promised() {
            Some("prepare refused: proposal id not above the promise")
        } else if prio.config_version < mine.version {
            Some("prepare refused: older config version")
        } else if transfer {
            None
        } else if self.leading.as_ref().is_some_and(|l| l.serving) {
            Some("prepare refused: leading")
        } else if self.now < self.lease_until && self.lease_holder != Some(from) {
            Some("prepare refused: another lease is live")
        } else {
            let me = self.cfg.id;
            let better_alive = (self.is_voter(me) && self.prio() > prio)
                || self.meta_want.membership.voters.iter().any(|v| {
                    *v != from
                        && *v != me
                        && self.alive(*v)
                        && self.peers[v].prio.is_some_and(|p| p > prio)
                });
            better_alive.then_some("prepare refused: a higher priority voter is alive")
        };
        if let Some(reason) = refusal {
            self.drop_input(Some(from), reason);
            self.send_prepare_ack(from, pid, false, ts);
            return;
        }
        self.step_down();
        self.leader = None;
        self.leader_pid = 0;
        self.matched_end = self.log.committed;
        self.lease_until = self.now + self.cfg.lease;
        self.lease_holder = Some(from);
        self.meta_want.vote = Vote {
            promised_proposal_id: pid,
            voted_for: Some(from),
        };
        self.deferred
            .push(Deferred::PrepareAck { to: from, pid, ts });
        self.save_meta();
    }

    pub(super) fn send_prepare_ack(&mut self, to: NodeId, pid: u64, granted: bool, ts: Nanos) {
        let end = self.log.flushed;
        let msg = Message::PrepareAck {
            pid,
            granted,
            promised: self.promised(),
            end,
            last_pid: self.log.pid_ending_at(end),
            committed: self.log.committed,
            ts,
        };
        self.send(to, msg);
    }

    pub(super) fn abandon_campaign(&mut self) {
        self.step_down();
        let spread = (self.cfg.lease / 2).max(1);
        self.backoff_until = self.now + self.rng.below(spread);
    }

    /// Leaves any leading or campaigning state.
    pub(super) fn step_down(&mut self) {
        let was_leading = self.leading.is_some() || self.campaign.is_some();
        if let Some(l) = self.leading.take() {
            if let Some(o) = l.open {
                // Never sealed, so never in any log: failed for certain.
                for (id, lsn, csn) in o.records {
                    self.actions.push(Action::Result {
                        id,
                        lsn,
                        csn,
                        outcome: Outcome::Failed,
                    });
                }
            }
            self.leader = None;
            self.leader_pid = 0;
            self.matched_end = self.log.committed;
        }
        self.campaign = None;
        if was_leading {
            let role = if self.pending.is_empty() {
                Role::Follower
            } else {
                Role::PendingFollower
            };
            self.set_role(role);
        }
    }
}
