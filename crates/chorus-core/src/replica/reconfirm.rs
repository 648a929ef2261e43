//! Log reconfirmation (PALF section 3.4, Alg. 1; the piggyback paper's leader recovery,
//! section 5.1): once its promise is durable the candidate sends Prepare, collects
//! durable promises from a majority with their flushed end and last proposal id, adopts
//! the log of the highest (last proposal id, end) among them by fetching it, then writes
//! an empty StartWorking group under its own proposal id and re-stamps its membership
//! (rolling back a previous leader's unfinished change). It serves once StartWorking is
//! committed; a mirror, which writes no group of its own, serves at once.

use std::collections::BTreeMap;

use crate::format::meta::{AccessMode, ConfigVersion, NodeId};
use crate::Lsn;

use super::election::CampaignPhase;
use super::leader::{Leading, Progress};
use super::storage::cut_groups;
#[cfg(feature = "broken")]
use super::Broken;
use super::{Action, LogPos, Message, Nanos, ReadPurpose, Replica, Role};

/// One replica's answer to a reconfirmation prepare, as the merge sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct MergeCandidate {
    /// The replica.
    pub(super) node: NodeId,
    /// Its flushed end LSN.
    pub(super) end: Lsn,
    /// Proposal id of its last flushed group: the one ending at `end` (0 for none).
    pub(super) last_pid: u64,
}

/// Whose log a new leader adopts, given the answers of a majority: the highest (last
/// proposal id, end) (PALF Alg. 1 line 4, "the replica with the longest logs"; comparing
/// the last proposal id first is Raft's up-to-date rule, since a log may be longer only
/// with groups of a deposed leader). Ties prefer `me`, which saves a fetch. `None` only
/// when nobody answered.
fn merge_source(answers: &[MergeCandidate], me: NodeId) -> Option<MergeCandidate> {
    answers
        .iter()
        .max_by(|a, b| (a.last_pid, a.end, a.node == me).cmp(&(b.last_pid, b.end, b.node == me)))
        .copied()
}

impl Replica {
    pub(super) fn begin_prepare(&mut self, pid: u64) {
        let me = self.cfg.id;
        let flushed = self.log.flushed;
        let last_pid = self.log.pid_ending_at(flushed);
        let prio = self.prio();
        let now = self.now;
        let Some(c) = &mut self.campaign else { return };
        if c.pid != pid || c.phase != CampaignPhase::Promising {
            return;
        }
        c.phase = CampaignPhase::Preparing;
        c.acks.insert(
            me,
            MergeCandidate {
                node: me,
                end: flushed,
                last_pid,
            },
        );
        c.lease_ts.insert(me, now);
        let msg = Message::Prepare {
            pid,
            prio,
            transfer: c.transfer,
            ts: now,
        };
        for v in self.meta_want.membership.voters.clone() {
            if v != me {
                self.send(v, msg.clone());
            }
        }
        self.check_prepare_quorum();
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn on_prepare_ack(
        &mut self,
        from: NodeId,
        pid: u64,
        granted: bool,
        promised: u64,
        end: Lsn,
        last_pid: u64,
        ts: Nanos,
    ) {
        self.max_seen_pid = self.max_seen_pid.max(promised);
        let quorum = self.voters_quorum();
        let Some(c) = &mut self.campaign else { return };
        if c.pid != pid || c.phase != CampaignPhase::Preparing {
            return;
        }
        if !granted {
            c.rejected.insert(from);
            // Outbid, or refused by enough voters that no majority is left: back off
            // rather than wait out the campaign timeout.
            if promised >= pid || !quorum.is_reached(|v| !c.rejected.contains(&v)) {
                self.abandon_campaign();
            }
            return;
        }
        c.acks.insert(
            from,
            MergeCandidate {
                node: from,
                end,
                last_pid,
            },
        );
        c.lease_ts.insert(from, ts);
        self.check_prepare_quorum();
    }

    fn check_prepare_quorum(&mut self) {
        let me = self.cfg.id;
        let quorum = self.voters_quorum();
        let Some(c) = &mut self.campaign else { return };
        if !quorum.is_reached(|v| c.acks.contains_key(&v)) {
            return;
        }
        // The merge weighs the answers the quorum counted: the voters'.
        let answers: Vec<MergeCandidate> = quorum
            .voters()
            .iter()
            .filter_map(|v| c.acks.get(v).copied())
            .collect();
        #[allow(unused_mut)]
        let Some(mut best) = merge_source(&answers, me) else {
            return;
        };
        #[cfg(feature = "broken")]
        if self.cfg.broken == Broken::SkipReconfirmation {
            best = c.acks[&me];
        }
        let mine = c.acks[&me];
        if best.node == me || (best.last_pid, best.end) == (mine.last_pid, mine.end) {
            self.start_working();
            return;
        }
        c.phase = CampaignPhase::Fetching {
            source: best.node,
            target: best.end,
        };
        let pid = c.pid;
        let from = self
            .log
            .pos_at(self.log.committed)
            .expect("committed is a boundary");
        self.send(
            best.node,
            Message::Fetch {
                pid,
                from,
                max_bytes: self.cfg.max_message_bytes as u32,
            },
        );
    }

    pub(super) fn on_fetch(&mut self, from: NodeId, pid: u64, pos: LogPos, max_bytes: u32) {
        if self.meta.vote.promised_proposal_id != pid || self.meta.vote.voted_for != Some(from) {
            self.drop_input(Some(from), "fetch from a candidate not promised");
            return;
        }
        if pos.lsn > self.log.flushed {
            self.drop_input(Some(from), "fetch beyond the flushed end");
            return;
        }
        if pos.lsn >= self.log.floor.end_lsn && self.log.pos_at(pos.lsn) != Some(pos) {
            self.drop_input(Some(from), "fetch from a position not in the log");
            return;
        }
        let max = (max_bytes as usize).clamp(1, self.cfg.max_message_bytes);
        if pos.lsn < self.log.start {
            // The candidate's log ends below our start: it is rebased at our start first.
            self.actions.push(Action::ReadLog {
                purpose: ReadPurpose::Fetch {
                    peer: from,
                    pid,
                    max_bytes: max as u32,
                    rebase: true,
                },
                from: self.log.start,
                max_bytes: max,
            });
            return;
        }
        match self.log.cached_from(pos.lsn, max) {
            Some(bytes) if pos.lsn >= self.log.floor.end_lsn => {
                let groups = cut_groups(&bytes, self.log.flushed, max);
                let end = self.log.flushed;
                self.send(
                    from,
                    Message::FetchResp {
                        pid,
                        prev: pos,
                        groups,
                        end,
                    },
                );
            }
            _ => self.actions.push(Action::ReadLog {
                purpose: ReadPurpose::Fetch {
                    peer: from,
                    pid,
                    max_bytes: max as u32,
                    rebase: false,
                },
                from: pos.lsn,
                max_bytes: max,
            }),
        }
    }

    pub(super) fn on_fetch_resp(&mut self, from: NodeId, pid: u64, prev: LogPos, groups: Vec<u8>) {
        let Some(c) = &self.campaign else { return };
        let CampaignPhase::Fetching { source, target } = c.phase else {
            return;
        };
        if c.pid != pid || source != from {
            self.drop_input(Some(from), "fetch response not asked for");
            return;
        }
        let matches = self.log.continues_at(prev);
        if !matches {
            self.drop_input(Some(from), "fetch response does not continue the log");
            self.abandon_campaign();
            return;
        }
        let got = match self.accept_groups(prev.lsn, &groups, pid) {
            Ok(end) => end,
            Err(reason) => {
                self.drop_input(Some(from), reason);
                self.abandon_campaign();
                return;
            }
        };
        if got >= target {
            if self.log.end() > target {
                self.truncate_log(target);
            }
            self.start_working();
        } else if groups.is_empty() {
            self.abandon_campaign();
        } else {
            let pos = self.log.pos_at(got).expect("just appended");
            self.send(
                from,
                Message::Fetch {
                    pid,
                    from: pos,
                    max_bytes: self.cfg.max_message_bytes as u32,
                },
            );
        }
    }

    /// Reconfirmation done: write StartWorking and act as leader until it commits (PALF
    /// Alg. 1 line 8; the piggyback paper's leader recovery, section 5.1).
    fn start_working(&mut self) {
        let me = self.cfg.id;
        let mirror = self.meta_want.membership.access_mode == AccessMode::RawWrite;
        let Some(c) = &mut self.campaign else { return };
        c.phase = CampaignPhase::Confirming;
        let pid = c.pid;
        let lease_acks = c.lease_ts.clone();
        let end = self.log.end();
        let mut progress = BTreeMap::new();
        for n in self.members() {
            progress.insert(n, Progress::new(end, self.now));
        }
        self.leader = Some(me);
        self.leader_pid = pid;
        self.leading = Some(Leading {
            pid,
            progress,
            start_working_end: u64::MAX,
            serving: false,
            lease_acks,
            open: None,
            last_heartbeat: 0,
            transfer: None,
            prev_config: None,
            config_committed: false,
            committed_mode: None,
            replace_then_remove: None,
            published_commit: self.log.committed,
            last_commit_record_end: 0,
            last_async: self.now,
            became_leader: self.now,
        });
        // A mirror writes no group of its own (the LSN space is the primary's): what it
        // inherited above the commit point commits only with a quorum on a group past it,
        // the first it mirrors under our proposal id.
        #[cfg(feature = "broken")]
        let mirror = mirror && self.cfg.broken != Broken::MirrorStartWorking;
        let sw_end = if mirror {
            let end = self.log.end();
            if end > self.log.committed {
                end + 1
            } else {
                end
            }
        } else {
            self.write_empty_group();
            self.log.end()
        };
        let l = self.leading.as_mut().expect("leading");
        l.start_working_end = sw_end;
        if mirror {
            // Reconfirmed: it serves at once (its mirror writes wait for its config).
            l.serving = true;
            l.became_leader = self.now;
            self.campaign = None;
            self.set_role(Role::Leader);
        }
        let sw_end = self.log.end();
        let l = self.leading.as_mut().expect("leading");
        l.last_commit_record_end = sw_end;
        // Re-stamp the membership under the new proposal id: it outranks any membership a
        // previous leader proposed but did not finish (PALF section 3.4, StartWorking).
        let mut m = self.meta_want.membership.clone();
        m.version = ConfigVersion {
            proposal_id: pid,
            seq: 0,
        };
        m.barrier_lsn = sw_end;
        self.meta_want.membership = m;
        self.save_meta();
        self.broadcast(true);
        self.try_commit();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(node: NodeId, end: Lsn, last_pid: u64) -> MergeCandidate {
        MergeCandidate {
            node,
            end,
            last_pid,
        }
    }

    #[test]
    fn the_merge_prefers_the_last_proposal_id_over_length() {
        // A longer log ending in a deposed leader's groups loses to a shorter one that
        // holds the later leader's.
        let (a, b) = (answer(1, 500, 3), answer(2, 100, 4));
        assert_eq!(merge_source(&[a, b], 1), Some(b));
        // Same last proposal id: the longer log.
        let c = answer(3, 200, 4);
        assert_eq!(merge_source(&[a, b, c], 1), Some(c));
    }

    #[test]
    fn the_merge_prefers_itself_on_a_tie() {
        let (b, c) = (answer(2, 100, 4), answer(3, 100, 4));
        assert_eq!(merge_source(&[b, c], 3), Some(c));
        assert_eq!(merge_source(&[c, b], 2), Some(b));
        assert_eq!(merge_source(&[], 2), None);
    }
}
