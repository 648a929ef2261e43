//! A new leader's merge: ParallelRaft's merge stage (PolarFS section 5.3), DP-Raft's
//! pre-leader merge (section 4.4, Fig. 4). From the versions a majority of voters sent
//! with their votes, after [`merge::drop_superseded`], every slot from the leader's first
//! uncommitted one to the last any of them holds is decided: an entry is re-stamped at the
//! new term (same identity and contents, no look-behind buffer), a slot that holds nothing
//! becomes a NULL entry at the new term (the ghost guard). The leader writes and sends
//! them, and serves only once every merged slot has a majority: they commit together, so
//! dependencies among them hold trivially.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::leader::{Lead, Peer};
use super::membership::Change;
use super::{Action, Entry, Mode, OooReplica};
use crate::format::meta::NodeId;
use crate::ooo::dependent::{DepLeader, WAW_TRAIL};
use crate::ooo::merge::{self, MergeOptions};
use crate::ooo::parallel::LookBehind;
use crate::ooo::Seq;
use crate::replica::Role;

impl OooReplica {
    /// The merge (module docs): decide every slot from our first uncommitted one to the
    /// last any voter holds, write the decisions re-stamped at our term, send them.
    pub(super) fn become_leader(&mut self) {
        // A candidate whose election timed out asks for pre-votes at the same term
        // (`pre_campaign` raises nothing), so a late vote of its campaign can still win
        // that term here: the pre-vote it had begun is over.
        self.pre = None;
        let me = self.me();
        let term = self.hard.term;
        let h = self.commits.head();
        let mut held: BTreeMap<NodeId, BTreeMap<Seq, (Entry, bool)>> = BTreeMap::new();
        held.insert(
            me,
            self.log
                .range(h..)
                .map(|(&s, slot)| (s, (slot.entry.clone(), slot.committed)))
                .collect(),
        );
        let mut starts = BTreeMap::new();
        let (t0, s0) = self.hard.leader_start;
        starts.insert(t0, s0);
        for (&n, (es, (t, st))) in &self.votes {
            starts.insert(*t, *st);
            held.insert(
                n,
                es.iter()
                    .filter(|(e, _)| e.seq >= h)
                    .map(|(e, c)| (e.seq, (e.clone(), *c)))
                    .collect(),
            );
        }
        let top = held
            .values()
            .filter_map(|m| m.keys().next_back())
            .max()
            .copied();
        let end = top.map_or(h, |t| t + 1);
        let mut answers = merge::Answers::new();
        for s in h..end {
            let row = held
                .iter()
                .map(|(&n, m)| {
                    (
                        n,
                        m.get(&s).map(|(e, c)| {
                            starts.insert(e.term, e.start);
                            e.version(*c)
                        }),
                    )
                })
                .collect();
            answers.insert(s, row);
        }
        let guard = self.cfg.ghost_guard();
        let opts = MergeOptions::new(term);
        #[cfg(feature = "broken")]
        let opts = if guard {
            opts
        } else {
            opts.without_ghost_guard()
        };
        #[cfg(feature = "broken")]
        let opts = if self.cfg.cascade {
            opts
        } else {
            opts.without_cascade()
        };
        if guard {
            self.stats.superseded += merge::drop_superseded(&mut answers, &starts) as u64;
        }
        let decisions = merge::merge(me, &answers, &opts);
        let mut merged = Vec::with_capacity(decisions.len());
        for d in decisions {
            let e = match &d.outcome {
                merge::Outcome::Entry { from, version } => {
                    let (src, _) = &held[from][&d.seq];
                    debug_assert_eq!(src.eid, version.id);
                    src.restamp(term, end)
                }
                merge::Outcome::Null { written } => {
                    self.stats.nulls += 1;
                    // Without the guard (broken builds) the slot is recorded as empty
                    // without the new term: the published protocols' gap.
                    Entry::null(d.seq, written.as_ref().map_or(0, |v| v.term), end)
                }
            };
            merged.push(e);
        }
        let peers = self.peers();
        let mut merging = BTreeMap::new();
        for e in &merged {
            self.write_local(e.clone(), term);
            // This replica's own copy counts once it is durable ([`Self::persisted`]).
            merging.insert(e.seq, BTreeSet::new());
        }
        self.votes.clear();
        self.vote_parts.clear();
        self.leader = Some(me);
        self.hard.leader_start = (term, end);
        self.save_hard();
        self.lead = Some(Lead {
            start: end,
            merging,
            commit: None,
            look: LookBehind::new(self.span(), end),
            next_eid: 1,
            end,
            peers: peers.iter().map(|&p| (p, Peer::new(self.now))).collect(),
            last_send: self.now,
            last_resend: self.now,
            fresh: end,
            sent: VecDeque::new(),
            sent_commits: self.commits.clone(),
            transfer: None,
            change: None,
            versions: 0,
            probes: Default::default(),
        });
        if self.members.version != (0, 0) {
            self.restamp();
        }
        for chunk in merged.chunks(self.cfg.max_batch.max(1)) {
            self.broadcast(chunk.to_vec());
        }
        if merged.is_empty() {
            self.broadcast(Vec::new());
        }
        self.check_merged();
    }

    fn span(&self) -> usize {
        match self.cfg.mode {
            Mode::Parallel { span } => span,
            Mode::Dependent => 0,
        }
    }

    /// Serves once every merged slot has a majority: all commit together.
    pub(super) fn check_merged(&mut self) {
        let quorum = self.quorum.clone();
        let Some(lead) = self.lead.as_mut() else {
            return;
        };
        if lead.commit.is_some() || lead.merging.values().any(|a| !quorum.reached_by(a)) {
            return;
        }
        let merged: Vec<Seq> = std::mem::take(&mut lead.merging).into_keys().collect();
        // Dependent mode lists committed WAW predecessors a follower may still miss
        // (`set_waw_floor`); conflict order uses only the RAW lists.
        let trail = match self.cfg.mode {
            Mode::Dependent => WAW_TRAIL,
            Mode::Parallel { .. } => 0,
        };
        #[allow(unused_mut)]
        let mut commit = DepLeader::with_trail(quorum, self.cfg.window, lead.end, trail);
        #[cfg(feature = "broken")]
        if !self.cfg.trail_lists_committed {
            commit.break_trail();
        }
        lead.commit = Some(commit);
        if self.members.prev.is_some() {
            // A change's joint stage, from an earlier leader: finish it (a fresh version,
            // accepted anew) before starting any other.
            lead.change = Some(Change {
                barrier: lead.end,
                last: false,
            });
        }
        let start = lead.start;
        for s in merged {
            self.mark_committed(s);
        }
        self.stats.merges += 1;
        self.set_role(Role::Leader);
        self.actions.push(Action::Serving {
            term: self.hard.term,
            start,
        });
        self.broadcast(Vec::new());
    }
}
