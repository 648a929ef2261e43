//! The commit point and explicit results. The leader commits the prefix a majority has
//! flushed (of the new and, until it is accepted, the previous voters), but only once that
//! reaches a group of its own proposal id (Raft's rule, here StartWorking); it learns
//! there when its config is accepted. A follower commits what the leader's commit point
//! and its own matched prefix both cover. Every pending append is then decided against
//! the committed log alone (PALF section 4.1): committed if the committed log holds its
//! very group, failed otherwise.

use std::collections::BTreeSet;

use crate::format::meta::{AccessMode, NodeId};
use crate::quorum::Quorum;
use crate::Lsn;

use super::{Action, CommitMode, MembershipChange, Outcome, Replica, Role};

impl Replica {
    pub(super) fn try_commit(&mut self) {
        let me = self.cfg.id;
        let flushed = self.log.flushed;
        let Some(l) = &self.leading else { return };
        let matched_of = |n: &NodeId| {
            if *n == me {
                flushed
            } else {
                l.progress.get(n).map_or(0, |p| p.matched)
            }
        };
        let cur = &self.meta_want.membership;
        // A majority of the new voters and, until the change is accepted, of the previous
        // ones too (PALF section 5.3, Fig. 8a: a prefix committed by the old voters alone
        // could be missing from a majority of the new).
        let quorum = match (&l.prev_config, l.config_committed) {
            (Some(prev), false) => Quorum::joint(cur.voters.clone(), prev.voters.clone()),
            _ => Quorum::majority(cur.voters.clone()),
        };
        let point = quorum.commit_point(|n| matched_of(&n)).unwrap_or(0);
        // Only a quorum on a group of our own proposal id commits (Raft's rule; here the
        // StartWorking group), so older groups commit with it, never by counting alone.
        let sw_end = l.start_working_end;
        let config_acked = Quorum::majority(cur.voters.clone()).is_reached(|n| {
            if n == me {
                self.meta.membership.version >= cur.version && flushed >= cur.barrier_lsn
            } else {
                l.progress
                    .get(&n)
                    .is_some_and(|p| p.config_version >= cur.version)
            }
        });
        let version = cur.version;
        if point >= sw_end && point > self.log.committed {
            self.advance_committed(point);
        }
        let l = self.leading.as_mut().expect("leading");
        if !l.config_committed && config_acked {
            l.config_committed = true;
            l.prev_config = None;
            l.committed_mode = Some(self.meta_want.membership.access_mode);
            let members: BTreeSet<NodeId> = self.members();
            let l = self.leading.as_mut().expect("leading");
            l.progress.retain(|n, _| members.contains(n));
            let then_remove = l.replace_then_remove.take();
            self.actions.push(Action::ConfigCommitted { version });
            if let Some(old) = then_remove {
                let _ = self.change_membership(self.now, MembershipChange::Remove(old));
            }
        }
        let l = self.leading.as_mut().expect("leading");
        if !l.serving && self.log.committed >= l.start_working_end {
            l.serving = true;
            l.became_leader = self.now;
            self.campaign = None;
            self.set_role(Role::Leader);
        }
        if let Some(l) = &self.leading {
            if self.cfg.commit_mode == CommitMode::Sync
                && l.serving
                && self.log.committed > l.last_commit_record_end
                && self.meta_want.membership.access_mode != AccessMode::RawWrite
            {
                self.write_commit_record();
            }
        }
    }

    pub(super) fn follower_commit(&mut self) {
        let c = self.leader_committed.min(self.matched_end);
        if c > self.log.committed {
            self.advance_committed(c);
        }
    }

    fn advance_committed(&mut self, end: Lsn) {
        debug_assert!(end > self.log.committed);
        self.log.committed = end;
        // The index reaches back to the committed point (it is pruned only below it), so
        // the CSN there is exact: the readable CSN (PALF section 4.2, follower reads).
        let csn = self.log.csn_at(end);
        self.actions.push(Action::Commit { end, csn });
        self.resolve_pending();
        let keep_from = self.pending.front().map_or(end, |g| g.lsn.min(end));
        self.log.prune(keep_from, self.cfg.max_index_groups);
    }

    /// Decides pending appends against the committed log (PALF section 4.1): once the
    /// committed end passes a pending group's LSN, the committed log either holds that very
    /// group (same LSN, proposal id and checksum chain) or holds something else there.
    pub(super) fn resolve_pending(&mut self) {
        let committed = self.log.committed;
        while let Some(g) = self.pending.front() {
            if committed <= g.lsn {
                break;
            }
            let held = self.log.group_at(g.lsn).is_some_and(|m| {
                m.pid == g.pid && m.after.acc_crc == g.acc && m.end() <= committed
            });
            let outcome = if held {
                Outcome::Committed
            } else {
                Outcome::Failed
            };
            let g = self.pending.pop_front().expect("non-empty");
            for (id, lsn, csn) in g.records {
                self.actions.push(Action::Result {
                    id,
                    lsn,
                    csn,
                    outcome,
                });
            }
        }
        // Proposal ids never decrease along a log (log matching), so once the committed log
        // ends with a group of a later proposal id than a pending group, everything committed
        // after it is of that later id too: the pending group can never be committed, even
        // at an LSN the log has not reached yet.
        let last_pid = self.log.pid_ending_at(committed);
        let mut i = 0;
        while i < self.pending.len() {
            if self.pending[i].pid < last_pid {
                let g = self.pending.remove(i).expect("in range");
                for (id, lsn, csn) in g.records {
                    self.actions.push(Action::Result {
                        id,
                        lsn,
                        csn,
                        outcome: Outcome::Failed,
                    });
                }
            } else {
                i += 1;
            }
        }
        if self.role == Role::PendingFollower && self.pending.is_empty() {
            self.set_role(Role::Follower);
        }
    }
}
