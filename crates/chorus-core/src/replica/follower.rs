//! The follower: it takes groups from the leader it follows when they continue its log
//! (PALF section 3.4, Raft's log matching), buffers a bounded number of messages that
//! arrive early and asks for a gap once overtaken often enough, drops groups of older
//! leaders past the leader's end, acknowledges the end of the prefix that is both flushed
//! and matched with the leader, and learns the commit point from the leader (the
//! piggyback paper, section 4). A follower behind the leader's log start is rebased
//! there ([`Message::Rebase`]); a new config is adopted only once its log holds the
//! config's barrier (PALF section 5.3, which rules out Fig. 8a).

use crate::format::group::ChainPoint;
use crate::format::meta::{Membership, NodeId, Vote};
use crate::Lsn;

use super::election::CampaignPhase;
use super::{Action, LogPos, Message, Nanos, Replica};
#[cfg(feature = "broken")]
use super::{Broken, Outcome};

impl Replica {
    pub(super) fn on_append(&mut self, from: NodeId, msg: Message) {
        let Message::Append {
            pid,
            ts,
            prev,
            ref groups,
            leader_end,
            committed,
            ref config,
        } = msg
        else {
            unreachable!("on_append takes appends")
        };
        if !self.follow(from, pid, ts, config.as_ref()) {
            return;
        }
        if prev.lsn > self.log.end() {
            // A gap: either an earlier message is still in flight (reordering; buffer this
            // one within bounds) or it was lost. A heartbeat past our end means the latter,
            // so tell the leader where we are.
            if !groups.is_empty() && self.early.len() < self.cfg.max_buffered_appends {
                self.early.insert(prev.lsn, (from, msg));
                let end = self.log.end();
                let after = self.cfg.gap_resend_after;
                let held = self.early.len();
                let due = match self.gap_asked_at {
                    Some((at, n)) if at == end => held >= n + after,
                    _ => held >= after,
                };
                if after > 0 && due {
                    // Overtaken `after` times: ask for the gap now rather than wait for
                    // the slow copy or a heartbeat (the leader resends from `end`).
                    self.gap_asked_at = Some((end, held));
                    self.gap_asks += 1;
                    self.send_ack(false, end);
                }
            } else {
                let end = self.log.end();
                self.send_ack(false, end);
            }
            return;
        }
        let matches = self.log.continues_at(prev);
        if !matches {
            let hint = self.log.committed;
            self.send_ack(false, hint);
            return;
        }
        self.matched_end = self.matched_end.max(prev.lsn);
        match self.accept_groups(prev.lsn, groups, pid) {
            Ok(last) => self.matched_end = self.matched_end.max(last),
            Err(reason) => {
                self.drop_input(Some(from), reason);
                let hint = self.log.committed;
                self.send_ack(false, hint);
                return;
            }
        }
        if self.halted.is_some() {
            return;
        }
        // Groups past the leader's end from older leaders can never commit: the leader's
        // log holds everything committed. Remove them so pending appends get decided.
        if self.matched_end == leader_end && self.log.end() > leader_end {
            if let Some(g) = self.log.group_at(leader_end) {
                if g.pid < pid {
                    self.truncate_log(leader_end);
                }
            }
        }
        self.leader_committed = self.leader_committed.max(committed);
        self.follower_commit();
        if let Some(m) = config {
            self.consider_config(m.clone());
        }
        self.send_ack(true, 0);
        self.drain_early();
    }

    /// The checks and bookkeeping every message from a leader goes through
    /// ([`Message::Append`], [`Message::Rebase`]): the sender is a member (or brings a
    /// membership naming it), its proposal id is not stale (answered with ours if it is),
    /// and we follow it from now on. Returns whether to go on with the message.
    fn follow(&mut self, from: NodeId, pid: u64, ts: Nanos, config: Option<&Membership>) -> bool {
        // A sender outside our membership is a leader only if it brings a newer membership
        // naming it a voter (a leader attaches its membership until we acknowledge it).
        let m = &self.meta_want.membership;
        let known = m.voters.is_empty()
            || m.voters.contains(&from)
            || m.learners.contains(&from)
            || config
                .as_ref()
                .is_some_and(|c| c.version > m.version && c.voters.contains(&from));
        if !known {
            self.drop_input(Some(from), "append from a non-member");
            return false;
        }
        self.max_seen_pid = self.max_seen_pid.max(pid);
        let promised = self.promised();
        if pid < promised {
            self.drop_input(Some(from), "append with a stale proposal id");
            let msg = Message::AppendAck {
                pid: promised,
                ts,
                success: false,
                matched: 0,
                hint: 0,
                committed: 0,
                config_version: self.meta.membership.version,
            };
            self.send(from, msg);
            return false;
        }
        let own_pid = self
            .leading
            .as_ref()
            .map(|l| l.pid)
            .or(self.campaign.as_ref().map(|c| c.pid));
        if own_pid == Some(pid) {
            self.drop_input(
                Some(from),
                "append from another replica under our proposal id",
            );
            return false;
        }
        if pid > promised {
            self.meta_want.vote = Vote {
                promised_proposal_id: pid,
                voted_for: None,
            };
            self.save_meta();
        }
        self.step_down();
        if self.leader_pid != pid || self.leader != Some(from) {
            self.leader = Some(from);
            self.leader_pid = pid;
            self.matched_end = self.log.committed;
            self.leader_committed = 0;
            self.early.clear();
            // Its barrier was on another leader's log.
            self.pending_config = None;
            self.gap_asked_at = None;
            let role = self.role;
            self.actions.push(Action::Role {
                role,
                pid,
                leader: Some(from),
            });
        }
        self.lease_until = self.now + self.cfg.lease;
        self.lease_holder = Some(from);
        self.last_leader_ts = self.last_leader_ts.max(ts);
        true
    }

    /// A [`Message::Rebase`]: from our leader (we are behind its log start), or from the
    /// replica a candidate of ours fetches from (our log ends below its start).
    #[allow(clippy::too_many_arguments)] // the message's fields, as `on_append_ack` takes
    pub(super) fn on_rebase(
        &mut self,
        from: NodeId,
        pid: u64,
        ts: Nanos,
        base: ChainPoint,
        base_pid: u64,
        committed: Lsn,
        config: Option<Membership>,
    ) {
        if base.end_lsn > committed || !base.end_lsn.is_multiple_of(self.cfg.block_size) {
            self.drop_input(
                Some(from),
                "rebase to a base that is not a committed block start",
            );
            return;
        }
        if let Some(c) = &self.campaign {
            if let CampaignPhase::Fetching { source, .. } = c.phase {
                if c.pid == pid && source == from {
                    // Reconfirmation takes the source's log as it is (it is the longest of
                    // a majority), so ours below its start may go.
                    if !self.holds_base(base) {
                        self.rebase_log(base, base_pid);
                    }
                    return;
                }
            }
            self.drop_input(Some(from), "rebase not asked for");
            return;
        }
        if !self.follow(from, pid, ts, config.as_ref()) {
            return;
        }
        if !self.holds_base(base) {
            self.rebase_log(base, base_pid);
        }
        // Either way our log matches the leader's up to `base` now.
        self.matched_end = self.matched_end.max(base.end_lsn);
        self.leader_committed = self.leader_committed.max(committed);
        self.follower_commit();
        self.send_ack(true, 0);
        self.drain_early();
    }

    /// Whether our log already holds `base`: our committed prefix reaches it (committed
    /// prefixes are the same everywhere) or it is a boundary of our log with the same
    /// checksum chain.
    fn holds_base(&self, base: ChainPoint) -> bool {
        self.log.committed >= base.end_lsn
            || self.log.continues_at(LogPos {
                lsn: base.end_lsn,
                acc: base.acc_crc,
            })
    }

    /// Starts our log again, empty, at `base`: everything below it is committed.
    pub(super) fn rebase_log(&mut self, base: ChainPoint, base_pid: u64) {
        let at = base.end_lsn;
        self.log.rebase(base, base_pid);
        self.matched_end = at;
        self.early.retain(|&lsn, _| lsn >= at);
        self.gap_asked_at = None;
        self.last_csn = self.last_csn.max(base.max_csn);
        self.rebased += 1;
        self.actions.push(Action::Rebase { base });
        // Everything below the base is committed (and gone here): the base's CSN is
        // readable in the sense that no record at or below it is still to come.
        self.actions.push(Action::Commit {
            end: at,
            csn: base.max_csn,
        });
        // Our pending groups below `base` were committed or not on the leader, whose log
        // there is gone: their results cannot be known any more.
        while self.pending.front().is_some_and(|g| g.lsn < at) {
            let g = self.pending.pop_front().expect("non-empty");
            for (id, lsn, _csn) in g.records {
                #[cfg(feature = "broken")]
                if self.cfg.broken == Broken::GuessOnRebase {
                    self.actions.push(Action::Result {
                        id,
                        lsn,
                        csn: _csn,
                        outcome: Outcome::Failed,
                    });
                    continue;
                }
                self.actions.push(Action::Unknown { id, lsn });
            }
        }
        self.resolve_pending();
    }

    fn drain_early(&mut self) {
        while let Some((&lsn, _)) = self.early.first_key_value() {
            if lsn > self.log.end() {
                break;
            }
            let (_, (from, msg)) = self.early.pop_first().expect("non-empty");
            if let Message::Append { pid, .. } = &msg {
                if *pid == self.leader_pid && Some(from) == self.leader {
                    self.on_append(from, msg);
                }
            }
        }
    }

    pub(super) fn consider_config(&mut self, m: Membership) {
        if m.version <= self.meta_want.membership.version {
            return;
        }
        // The barrier (PALF section 5.3, Fig. 8a): adopt a membership only once our log
        // holds, durably and matching the leader, everything the leader had when it issued
        // it.
        if self.matched_end < m.barrier_lsn || self.log.flushed < m.barrier_lsn {
            self.pending_config = Some(m);
            return;
        }
        self.pending_config = None;
        self.set_membership(m);
        self.save_meta();
    }

    pub(super) fn send_ack(&mut self, success: bool, hint: Lsn) {
        let Some(leader) = self.leader else { return };
        if self.leading.is_some() || self.campaign.is_some() || !self.live() {
            return;
        }
        if self.meta.vote.promised_proposal_id != self.leader_pid
            || self.promised() != self.leader_pid
        {
            return;
        }
        #[allow(unused_mut)]
        let mut durable = self.log.flushed;
        #[cfg(feature = "broken")]
        if self.cfg.broken == Broken::AckBeforeFsync {
            durable = self.log.end();
        }
        let msg = Message::AppendAck {
            pid: self.leader_pid,
            ts: self.last_leader_ts,
            success,
            matched: durable.min(self.matched_end),
            hint,
            committed: self.log.committed,
            config_version: self.meta.membership.version,
        };
        self.send(leader, msg);
    }
}
