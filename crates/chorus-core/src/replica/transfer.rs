//! Leader transfer and fail-back (PALF section 3.4): the leader stops taking appends,
//! brings the target up to date and tells it to campaign at once ([`Message::TimeoutNow`]);
//! a serving leader hands leadership on by itself to a caught-up voter of higher priority
//! (fail-back), a lease after it took over.

use crate::format::meta::NodeId;

use super::{ChangeError, Message, Nanos, Replica};

impl Replica {
    /// Starts handing leadership to `to` (PALF leader transfer): appends are refused, the
    /// target is brought up to date and told to campaign at once.
    pub fn transfer_leader(&mut self, now: Nanos, to: NodeId) -> Result<(), ChangeError> {
        self.abandon_lane();
        self.now = self.now.max(now);
        let is_voter = self.is_voter(to);
        let lease = self.cfg.lease;
        let Some(l) = &mut self.leading else {
            return Err(ChangeError::NotLeader);
        };
        if !l.serving {
            return Err(ChangeError::NotLeader);
        }
        if to == self.cfg.id || !is_voter {
            return Err(ChangeError::Invalid(format!("{to} is not another voter")));
        }
        l.transfer = Some((to, self.now + lease));
        self.freeze();
        self.check_transfer();
        Ok(())
    }

    /// Fail-back (PALF section 3.4): a caught-up voter of higher priority gets leadership.
    pub(super) fn maybe_fail_back(&mut self) {
        let mine = self.prio();
        let end = self.log.end();
        let Some(l) = &self.leading else { return };
        if !l.serving || l.transfer.is_some() || self.now < l.became_leader + self.cfg.lease {
            return;
        }
        let target = self
            .meta_want
            .membership
            .voters
            .iter()
            .copied()
            .filter(|v| *v != self.cfg.id && self.alive(*v))
            .filter(|v| {
                self.peers[v].prio.is_some_and(|p| p > mine)
                    && l.progress.get(v).is_some_and(|p| p.matched == end)
            })
            .max_by_key(|v| self.peers[v].prio);
        if let Some(t) = target {
            let _ = self.transfer_leader(self.now, t);
        }
    }

    pub(super) fn check_transfer(&mut self) {
        let end = self.log.end();
        let Some(l) = &self.leading else { return };
        let Some((to, _)) = l.transfer else { return };
        if l.open.is_some() || l.progress.get(&to).is_none_or(|p| p.matched < end) {
            return;
        }
        let pid = l.pid;
        self.send(to, Message::TimeoutNow { pid });
        self.step_down();
        self.leader = Some(to);
        // The target is granted the lease, as a vote grants it to a candidate: without
        // it, a deposed leader whose priority is above the target's may campaign at its
        // next tick, before the target's campaign is heard, and win back the group the
        // operator moved.
        self.lease_until = self.now + self.cfg.lease;
        self.lease_holder = Some(to);
    }
}
