//! The follower: it follows the leader of the newest term it hears, writes what that
//! leader sends (holes and all) and acknowledges each slot once durable (PolarFS section
//! 5.2, out-of-order acknowledge), and takes a slot as committed when the leader's commit
//! window names it and it holds the version that leader sent (DP-Raft section 4.3): an
//! older version it still holds from a deposed leader is never taken for the committed
//! one. Entries that do not fit the group's mode are refused. While recovering lost
//! entries ([`Hard::lost_below`]) it asks the leader where its slots end.
//!
//! [`Hard::lost_below`]: super::Hard::lost_below

use super::membership::epoch;
use super::{Action, Body, Entry, Mode, Msg, OooReplica};
use crate::format::meta::NodeId;
use crate::ooo::{CommitWindow, OooError, Seq};

impl OooReplica {
    /// A message from a leader of `term`: a stale one is answered with our term (so it
    /// steps down) and refused; otherwise we follow it.
    pub(super) fn follow(&mut self, from: NodeId, term: u64) -> bool {
        if term < self.hard.term {
            self.send_head(from);
            return false;
        }
        if term > self.hard.term || self.lead.is_some() || self.leader != Some(from) {
            self.step_down(term, Some(from));
        }
        self.heard = Some(self.now);
        self.reset_deadline();
        true
    }

    /// An acknowledgement of nothing, carrying our term and first uncommitted slot.
    pub(super) fn send_head(&mut self, to: NodeId) {
        self.actions.push(Action::Send {
            to,
            msg: Msg::Ack {
                term: self.hard.term,
                seqs: Vec::new(),
                head: self.commits.head(),
                applied: self.applier.head(),
            },
        });
    }

    pub(super) fn on_append(
        &mut self,
        from: NodeId,
        term: u64,
        start: Seq,
        entries: Vec<Entry>,
        window: CommitWindow,
        config: (u64, u64),
    ) {
        if !self.follow(from, term) {
            return;
        }
        if self.hard.lost_below != 0
            && self.lost_end.is_none()
            && self
                .asked_end
                .is_none_or(|t| self.now >= t + self.cfg.heartbeat_interval)
        {
            self.asked_end = Some(self.now);
            self.actions.push(Action::Send {
                to: from,
                msg: Msg::AskEnd {
                    term,
                    nonce: self.lost_nonce,
                },
            });
        }
        let other = config != self.members.version;
        if other && epoch(self.members.version) < epoch(config) {
            // The leader's membership has not arrived yet: no entries before it. Saying
            // which one we hold gets it sent.
            self.save_hard();
            self.send_config_ack(from);
            return;
        }
        if self.hard.leader_start.0 < term {
            // Saved before the acknowledgement below: from now on this replica reports
            // older versions from `start` on as superseded.
            self.hard.leader_start = (term, start);
        }
        self.save_hard();
        let mut seqs = Vec::with_capacity(entries.len());
        for e in entries {
            // Below the base: committed, and held here in the state machine's durable
            // image. A merging leader re-sends such slots (this replica may have granted
            // its vote before compacting them); the merge decides a committed slot as
            // its committed version, so the acknowledgement is true — and without it the
            // merge could wait forever for a majority.
            if e.seq < self.hard.base {
                seqs.push((e.seq, e.eid));
                continue;
            }
            // A malformed entry is neither written nor acknowledged.
            if self.check_entry(&e).is_err() {
                self.stats.refused += 1;
                continue;
            }
            if self
                .log
                .get(&e.seq)
                .is_some_and(|s| s.committed && s.entry.eid != e.eid)
            {
                self.stats.refused += 1;
                continue;
            }
            seqs.push((e.seq, e.eid));
            self.write_local(e, term);
        }
        let ready: Vec<Seq> = self
            .log
            .range(self.commits.head()..)
            .filter(|(&s, slot)| {
                !slot.committed && slot.confirmed == term && window.is_committed(s)
            })
            .map(|(&s, _)| s)
            .collect();
        for s in ready {
            self.mark_committed(s);
        }
        self.actions.push(Action::Send {
            to: from,
            msg: Msg::Ack {
                term,
                seqs,
                head: self.commits.head(),
                applied: self.applier.head(),
            },
        });
        if other {
            // We hold a membership the leader does not (a newer one it abandoned, or it
            // has never set one since the group's voters changed): it sends its own.
            self.send_config_ack(from);
        }
    }

    /// Refuses entries that do not fit this group: the wrong mode, a look-behind buffer
    /// longer than the span or reaching before slot 0, empty ranges, dependencies outside
    /// `base..seq` or not ascending.
    fn check_entry(&self, e: &Entry) -> Result<(), OooError> {
        let bad = |detail: &str| OooError::Malformed {
            seq: e.seq,
            detail: detail.to_string(),
        };
        match (&e.body, self.cfg.mode) {
            (Body::Null, _) => Ok(()),
            (
                Body::Parallel {
                    ranges,
                    look_behind,
                    after,
                    ..
                },
                Mode::Parallel { span },
            ) => {
                if look_behind.len() > span || look_behind.len() as u64 > e.seq {
                    return Err(bad("look-behind buffer too long"));
                }
                if after.windows(2).any(|w| w[0] >= w[1]) || after.iter().any(|&p| p >= e.seq) {
                    return Err(bad(
                        "conflict-order predecessors not before the entry or not ascending",
                    ));
                }
                if ranges
                    .iter()
                    .chain(look_behind.iter().flatten())
                    .any(|r| r.start >= r.end)
                {
                    return Err(bad("empty block range"));
                }
                Ok(())
            }
            (Body::Dependent { base, deps, .. }, Mode::Dependent) => {
                if *base > e.seq {
                    return Err(bad("window base after the entry"));
                }
                for d in [&deps.raw, &deps.waw] {
                    if d.windows(2).any(|w| w[0] >= w[1])
                        || d.iter().any(|&p| p >= e.seq || p < *base)
                    {
                        return Err(bad("dependencies outside base..seq or not ascending"));
                    }
                }
                Ok(())
            }
            _ => Err(bad("entry of the other mode")),
        }
    }
}
