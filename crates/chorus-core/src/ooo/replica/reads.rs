//! Leader reads confirmed by a quorum (Raft's read index, Ongaro's thesis section 6.4),
//! so that a read served by a chunk's leader sees every write acknowledged before it
//! began (PolarFS section 4, the IoScheduler's guarantee) even when that leader has been
//! deposed without hearing of it yet.
//!
//! A leader that takes a read notes its committed head (`want`) and sends every other
//! voter a [`Msg::ReadProbe`] numbered after every earlier one. A voter answers with its
//! term ([`Msg::ReadProbeAck`]), taking the prober as its leader as an append would. The
//! read may be served once a quorum of the membership (this leader counted) has answered
//! a probe at least as new at the leader's term, and the leader has applied every slot
//! below `want` ([`OooReplica::read_ready`]).
//!
//! Why it is enough: a write acknowledged before the read arrived was committed either by
//! this leader (then it is below `want`: a serving leader acknowledges only what it
//! committed and applied) or by a leader of an earlier term (below this leader's start,
//! all committed before it served) or of a later term. A later leader needed a quorum at
//! its later term before the read arrived; every voter of that quorum had taken the later
//! term by then and answers a probe sent after the arrival with it, so no quorum can
//! answer at this leader's term — the answers depose it and the read fails instead. A
//! lease from heartbeats would not do: a follower that restarts forgets when it last
//! heard the leader, and votes at once (the volume simulation's seed 2638).

use std::collections::BTreeMap;

use super::{Action, Msg, OooReplica};
use crate::format::meta::NodeId;
use crate::ooo::Seq;
use crate::replica::Nanos;

/// A leader's read probes. Invariant: every value of `answered` is at most `issued`;
/// both are reset with the leadership (a new [`super::leader::Lead`]).
#[derive(Debug, Default)]
pub(super) struct Probes {
    /// The last probe issued (probes are numbered from 1).
    pub(super) issued: u64,
    /// `issued` has not gone out yet: reads taken until it does share it (one probe per
    /// round of the driver however many reads arrived in it).
    pub(super) unsent: bool,
    /// When probes last went out: unanswered ones go again every heartbeat interval.
    pub(super) sent: Nanos,
    /// Per voter: the newest probe it answered at this leader's term.
    pub(super) answered: BTreeMap<NodeId, u64>,
}

/// A read taken by a leader ([`OooReplica::read_index`]): served once
/// [`OooReplica::read_ready`] says so.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadTicket {
    /// The probe a quorum must answer.
    pub probe: u64,
    /// The leader's committed head when the read arrived: every slot below must be
    /// applied here.
    pub want: Seq,
    /// The leader's term.
    pub term: u64,
}

/// Why a leader read cannot be served here.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OooReadIndexError {
    /// Only the serving leader serves leader reads; it may have been deposed since.
    #[error("not the serving leader ({})", crate::LeaderHint(*.leader))]
    NotLeader {
        /// The leader this replica follows, if any.
        leader: Option<NodeId>,
    },
}

impl OooReplica {
    /// Takes a leader read (see the module docs): the ticket to wait on with
    /// [`Self::read_ready`]. Its probe goes out at the next [`Self::send_read_probes`].
    /// Refused unless this replica is the serving leader.
    pub fn read_index(&mut self, now: Nanos) -> Result<ReadTicket, OooReadIndexError> {
        self.now = self.now.max(now);
        if !self.is_serving() {
            return Err(OooReadIndexError::NotLeader {
                leader: self.leader,
            });
        }
        let want = self.commits.head();
        let term = self.hard.term;
        let lead = self.lead.as_mut().expect("serving");
        if !lead.probes.unsent {
            lead.probes.issued += 1;
            lead.probes.unsent = true;
        }
        let probe = lead.probes.issued;
        Ok(ReadTicket { probe, want, term })
    }

    /// Sends the probe the reads taken since the last call share, if any: the driver
    /// calls it once its round's events are handled, so that reads arriving together
    /// cost one probe to each voter.
    pub fn send_read_probes(&mut self) {
        if self.lead.as_ref().is_some_and(|l| l.probes.unsent) {
            self.send_probes();
        }
    }

    /// Whether the read of `t` may be served now: `Ok(true)` once a quorum answered its
    /// probe at its term and every slot below its `want` is applied here; an error once
    /// this replica no longer leads that term (the read must go to the new leader).
    pub fn read_ready(&self, t: &ReadTicket) -> Result<bool, OooReadIndexError> {
        let not_leader = OooReadIndexError::NotLeader {
            leader: self.leader,
        };
        let Some(lead) = self.lead.as_ref() else {
            return Err(not_leader);
        };
        if self.hard.term != t.term || lead.commit.is_none() {
            return Err(not_leader);
        }
        if self.probe_confirmed() < t.probe {
            return Ok(false);
        }
        Ok(self.applier.head() >= t.want)
    }

    /// The newest probe a quorum (this leader counted) answered at this term; 0 if none
    /// or not leading.
    fn probe_confirmed(&self) -> u64 {
        let Some(lead) = self.lead.as_ref() else {
            return 0;
        };
        let mut ids: Vec<u64> = lead.probes.answered.values().copied().collect();
        ids.push(lead.probes.issued);
        ids.sort_unstable_by(|a, b| b.cmp(a));
        ids.dedup();
        ids.into_iter()
            .find(|&c| {
                self.quorum_with_me(
                    lead.probes
                        .answered
                        .iter()
                        .filter(|(_, &a)| a >= c)
                        .map(|(&n, _)| n),
                )
            })
            .unwrap_or(0)
    }

    /// Sends the newest probe to every other voter.
    fn send_probes(&mut self) {
        let term = self.hard.term;
        let peers = self.peers();
        let Some(lead) = self.lead.as_mut() else {
            return;
        };
        lead.probes.sent = self.now;
        lead.probes.unsent = false;
        let probe = lead.probes.issued;
        for to in peers {
            self.actions.push(Action::Send {
                to,
                msg: Msg::ReadProbe { term, probe },
            });
        }
    }

    /// On the leader's tick: probes not yet answered by a quorum go again every
    /// heartbeat interval (a probe or its answer may be lost).
    pub(super) fn resend_probes(&mut self) {
        let Some(lead) = self.lead.as_ref() else {
            return;
        };
        let due = self.now.saturating_sub(lead.probes.sent) >= self.cfg.heartbeat_interval;
        if lead.probes.issued > 0 && due && self.probe_confirmed() < lead.probes.issued {
            self.send_probes();
        }
    }

    /// A voter's side: answer with our term, following the prober as an append from it
    /// would (a stale prober gets our term and steps down).
    pub(super) fn on_read_probe(&mut self, from: NodeId, term: u64, probe: u64) {
        self.follow(from, term);
        self.actions.push(Action::Send {
            to: from,
            msg: Msg::ReadProbeAck {
                term: self.hard.term,
                probe,
            },
        });
    }

    /// The leader's side: an answer at our term counts; a later term deposes us.
    pub(super) fn on_read_probe_ack(&mut self, from: NodeId, term: u64, probe: u64) {
        if term > self.hard.term {
            self.step_down(term, None);
            return;
        }
        if term < self.hard.term {
            return;
        }
        if let Some(lead) = self.lead.as_mut() {
            let a = lead.probes.answered.entry(from).or_default();
            *a = (*a).max(probe.min(lead.probes.issued));
        }
    }
}
