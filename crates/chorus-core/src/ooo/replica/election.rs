//! Elections: randomised timeouts, a pre-vote before each campaign (Raft thesis section
//! 9.6; [`OooConfig::pre_vote`]), one vote per term saved before it is sent, and DP-Raft's
//! vote rule (section 4.4: a newer last entry, then a first uncommitted slot not behind
//! the voter's). Memberships rule candidates out too (their epochs, see [`Membership`]),
//! and a replica recovering lost entries ([`Hard::lost_below`]) neither votes nor
//! campaigns. A granted vote carries the voter's versions of every slot from the
//! candidate's first uncommitted one on: all the new leader's merge needs. One too large
//! for a message ([`OooConfig::vote_bytes`]) comes in pieces the candidate asks for one
//! at a time ([`Msg::VotePart`], [`Msg::VoteMore`]).
//!
//! [`OooConfig::pre_vote`]: super::OooConfig::pre_vote
//! [`OooConfig::vote_bytes`]: super::OooConfig::vote_bytes
//! [`Membership`]: super::Membership
//! [`Hard::lost_below`]: super::Hard::lost_below

use std::collections::BTreeSet;

use super::entry::entry_bytes;
use super::membership::epoch;
use super::{Action, Entry, Msg, OooReplica};
use crate::format::meta::NodeId;
use crate::ooo::dependent::{grants_vote, VoteLog};
use crate::ooo::Seq;
use crate::replica::Role;

impl OooReplica {
    pub(super) fn vote_log(&self) -> VoteLog {
        let (last_term, last_seq) = self
            .log
            .values()
            .map(|s| (s.entry.term, s.entry.seq))
            .max()
            .unwrap_or((0, 0));
        VoteLog {
            last_term,
            last_seq,
            first_uncommitted: self.commits.head(),
            base: self.hard.base,
        }
    }

    /// Asks the voters whether this replica could win an election at the next term,
    /// changing nothing durable: the term is raised only once a quorum says yes.
    pub(super) fn pre_campaign(&mut self) {
        self.stats.pre_votes += 1;
        let term = self.hard.term + 1;
        self.pre = Some((term, BTreeSet::new()));
        self.leader = None;
        self.heard = None;
        self.reset_deadline();
        let log = self.vote_log();
        let config = self.members.version;
        for p in self.peers() {
            self.actions.push(Action::Send {
                to: p,
                msg: Msg::PreVote { term, log, config },
            });
        }
        if self.quorum_with_me([]) {
            self.campaign();
        }
    }

    pub(super) fn campaign(&mut self) {
        self.pre = None;
        self.stats.campaigns += 1;
        self.hard.term += 1;
        self.hard.voted_for = Some(self.me());
        self.leader = None;
        self.votes.clear();
        self.vote_parts.clear();
        self.set_role(Role::Candidate);
        self.reset_deadline();
        self.save_hard();
        let head = self.commits.head();
        let log = self.vote_log();
        let config = self.members.version;
        for p in self.peers() {
            self.actions.push(Action::Send {
                to: p,
                msg: Msg::Vote {
                    term: self.hard.term,
                    head,
                    log,
                    config,
                },
            });
        }
        if self.quorum_with_me([]) {
            self.become_leader();
        }
    }

    pub(super) fn step_down(&mut self, term: u64, leader: Option<NodeId>) {
        if term > self.hard.term {
            self.hard.term = term;
            self.hard.voted_for = None;
        }
        self.lead = None;
        // Entries appended but not sent yet: this term's leader will not send them.
        self.outbox.clear();
        self.votes.clear();
        self.vote_parts.clear();
        self.pre = None;
        self.leader = leader;
        self.set_role(if self.mine.is_empty() {
            Role::Follower
        } else {
            Role::PendingFollower
        });
        self.reset_deadline();
    }

    /// Whether a candidate (or pre-candidate) holding membership `config` cannot win
    /// with our vote: `Some(true)` if it missed a membership we hold and was sent ours
    /// ([`Msg::Newer`]), `Some(false)` if it is to be refused otherwise, `None` if its
    /// membership does not rule it out. Either way its term is not taken.
    fn hopeless(&mut self, from: NodeId, config: (u64, u64)) -> Option<bool> {
        let outsider = !self.members.is_member(from);
        if config < self.members.version
            && (epoch(config) < epoch(self.members.version) || self.members.prev.is_none())
        {
            // It missed a membership we hold: one of a later change, or the final stage
            // of the change whose joint stage it holds (the final stage exists only once
            // the joint one was accepted, so taking it is what the lost message would
            // have done). It takes ours; with the final stage it needs only the new
            // voters, so a group whose old majority is out of reach — an old voter down
            // or recovering lost entries while the removed leader holds the newest log
            // and, removed, never campaigns — still elects.
            self.actions.push(Action::Send {
                to: from,
                msg: Msg::Newer {
                    membership: self.members.clone(),
                },
            });
            return Some(true);
        }
        // Its membership is of an earlier change than ours, or it is not a voter of ours
        // while we are: it cannot win with our vote. A node a change removed, or one added
        // by a joint stage that a later leader abandoned, would otherwise depose every
        // leader with its terms.
        (epoch(config) < epoch(self.members.version)
            || (outsider && self.members.is_member(self.me())))
        .then_some(false)
    }

    /// A pre-vote: would we vote for `from` at `term`? Nothing here changes or is saved;
    /// the answer is yes only if the vote rule would grant, `term` is past ours, and no
    /// leader has been heard within an election timeout (so a replica that was cut off
    /// cannot unseat a leader the others still hear).
    pub(super) fn on_pre_vote(
        &mut self,
        from: NodeId,
        term: u64,
        log: VoteLog,
        config: (u64, u64),
    ) {
        let granted = match self.hopeless(from, config) {
            Some(true) => return,
            Some(false) => false,
            None => {
                let lease = self.lead.is_some()
                    || (self.leader.is_some()
                        && self
                            .heard
                            .is_some_and(|h| self.now < h + self.cfg.election_timeout));
                if lease && term > self.hard.term {
                    self.stats.pre_votes_refused_by_lease += 1;
                }
                let abstain = self.abstains();
                if abstain {
                    self.stats.votes_refused_lost += 1;
                }
                term > self.hard.term && !lease && !abstain && grants_vote(&self.vote_log(), &log)
            }
        };
        self.actions.push(Action::Send {
            to: from,
            msg: Msg::PreVoteReply {
                term: if granted { term } else { self.hard.term },
                granted,
            },
        });
    }

    pub(super) fn on_pre_vote_reply(&mut self, from: NodeId, term: u64, granted: bool) {
        if !granted {
            // A voter at a later term: take it (no vote is given or spent), so the next
            // pre-vote asks about a term the voters have not passed.
            if term > self.hard.term {
                self.step_down(term, None);
            }
            return;
        }
        let Some((asked, yes)) = self.pre.as_mut() else {
            return;
        };
        if term != *asked || self.lead.is_some() {
            return;
        }
        yes.insert(from);
        let yes = yes.clone();
        if self.quorum_with_me(yes) {
            self.campaign();
        }
    }

    pub(super) fn on_vote(
        &mut self,
        from: NodeId,
        term: u64,
        head: Seq,
        log: VoteLog,
        config: (u64, u64),
    ) {
        match self.hopeless(from, config) {
            Some(true) => return,
            Some(false) => {
                self.actions.push(Action::Send {
                    to: from,
                    msg: Msg::VoteReply {
                        term: self.hard.term,
                        granted: false,
                        entries: Vec::new(),
                        leader_start: self.hard.leader_start,
                    },
                });
                return;
            }
            None => {}
        }
        if term > self.hard.term {
            self.step_down(term, None);
        }
        let abstain = self.abstains();
        if abstain {
            self.stats.votes_refused_lost += 1;
        }
        let grant = term == self.hard.term
            && self.hard.voted_for.is_none_or(|v| v == from)
            && self.lead.is_none()
            && !abstain
            && grants_vote(&self.vote_log(), &log);
        let (mut entries, mut next) = (Vec::new(), None);
        if grant {
            self.hard.voted_for = Some(from);
            self.reset_deadline();
            (entries, next) = self.vote_piece(head);
        }
        self.save_hard();
        let (term, leader_start) = (self.hard.term, self.hard.leader_start);
        let msg = match next {
            // Too large for one message: the first piece, the candidate asks for the rest.
            Some(_) => Msg::VotePart {
                term,
                from: head,
                next,
                entries,
                leader_start,
            },
            None => Msg::VoteReply {
                term,
                granted: grant,
                entries,
                leader_start,
            },
        };
        self.actions.push(Action::Send { to: from, msg });
    }

    /// Our versions from slot `from` on, as many as fit [`OooConfig::vote_bytes`] (at
    /// least one), and the slot the next piece starts at if any are left.
    ///
    /// [`OooConfig::vote_bytes`]: super::OooConfig::vote_bytes
    fn vote_piece(&self, from: Seq) -> (Vec<(Entry, bool)>, Option<Seq>) {
        let max = self.cfg.vote_bytes.max(1) as u64;
        let (mut out, mut bytes) = (Vec::new(), 0);
        for (&s, slot) in self.log.range(from..) {
            let b = entry_bytes(&slot.entry);
            if !out.is_empty() && bytes + b > max {
                return (out, Some(s));
            }
            bytes += b;
            out.push((slot.entry.clone(), slot.committed));
        }
        (out, None)
    }

    /// A candidate we voted for asks for the next piece of our vote. Answered only while
    /// the vote stands as given: the same term, our vote its, and nothing taken since
    /// (no leader of the term yet, so our log past its head is what the first piece
    /// described the start of), and not recovering lost entries.
    pub(super) fn on_vote_more(&mut self, from: NodeId, term: u64, start: Seq) {
        if term != self.hard.term
            || self.hard.voted_for != Some(from)
            || self.leader.is_some()
            || self.lead.is_some()
            || self.abstains()
        {
            return;
        }
        // The candidate is making progress with our vote: no campaign of ours meanwhile.
        self.extend_deadline();
        let (entries, next) = self.vote_piece(start);
        self.stats.vote_parts_sent += 1;
        self.actions.push(Action::Send {
            to: from,
            msg: Msg::VotePart {
                term,
                from: start,
                next,
                entries,
                leader_start: self.hard.leader_start,
            },
        });
    }

    /// A piece of a granted vote. Pieces are taken strictly in order, each starting
    /// where the last ended (a duplicate or one out of order is dropped, and the vote
    /// then simply never completes this campaign); the last completes the vote.
    pub(super) fn on_vote_part(
        &mut self,
        from: NodeId,
        term: u64,
        start: Seq,
        next: Option<Seq>,
        entries: Vec<(Entry, bool)>,
        leader_start: (u64, Seq),
    ) {
        if term > self.hard.term {
            self.step_down(term, None);
            return;
        }
        // A candidate that won is merging (still `Candidate` until it serves): the rest
        // of this vote is no longer needed.
        if term < self.hard.term
            || self.role != Role::Candidate
            || self.lead.is_some()
            || self.votes.contains_key(&from)
        {
            return;
        }
        let want = self
            .vote_parts
            .get(&from)
            .map_or(self.commits.head(), |(_, at)| *at);
        if start != want || next.is_some_and(|n| n <= start) {
            return;
        }
        if entries
            .iter()
            .any(|(e, _)| e.seq < start || next.is_some_and(|n| e.seq >= n))
        {
            return; // not the range it says it covers: not a piece of this vote
        }
        // A vote arriving in pieces is progress: the campaign's timeout is for a
        // campaign that fails, not for one whose votes are still coming. Without this, a
        // vote of many pieces (a candidate that lost track of what committed, its first
        // uncommitted slot far behind the voter's last) never completes within one
        // timeout, and the candidate starts over, term after term (simulator seed 1538,
        // parallel).
        self.extend_deadline();
        let mut got = self
            .vote_parts
            .remove(&from)
            .map_or(Vec::new(), |((es, _), _)| es);
        got.extend(entries);
        match next {
            Some(n) => {
                self.vote_parts.insert(from, ((got, leader_start), n));
                self.actions.push(Action::Send {
                    to: from,
                    msg: Msg::VoteMore { term, from: n },
                });
            }
            None => self.on_vote_reply(from, term, true, got, leader_start),
        }
    }

    pub(super) fn on_vote_reply(
        &mut self,
        from: NodeId,
        term: u64,
        granted: bool,
        entries: Vec<(Entry, bool)>,
        leader_start: (u64, Seq),
    ) {
        if term > self.hard.term {
            self.step_down(term, None);
            return;
        }
        if term < self.hard.term || !granted || self.role != Role::Candidate {
            return;
        }
        self.vote_parts.remove(&from);
        self.votes.insert(from, (entries, leader_start));
        if self.quorum_with_me(self.votes.keys().copied()) {
            self.become_leader();
        }
    }
}
