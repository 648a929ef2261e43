//! Protocol-aware recovery of a damaged range (Alagappan et al., FAST 2018): a replica
//! whose storage found checksum failures before valid groups neither truncates nor votes
//! nor acknowledges; it asks its peers for a copy of the range and hands the first to the
//! driver ([`Action::Repair`]). A majority of voters cleanly lacking the range proves it
//! was never committed (it is discarded); with every other voter lacking it or damaged
//! and no such majority, it halts rather than invent or drop log.

use std::collections::BTreeSet;

use crate::format::meta::NodeId;
use crate::quorum::Quorum;
use crate::Lsn;

use super::{
    Action, Message, MetaRecord, Nanos, ReadPurpose, RecoveredLog, Replica, ReplicaConfig,
};

/// A damaged range being repaired from peers (protocol-aware recovery).
#[derive(Clone, Debug)]
pub(super) struct RepairState {
    /// Where the damaged range starts.
    pub(super) from: Lsn,
    /// Where it ends.
    pub(super) to: Lsn,
    /// Where the damaged log ends: a rebase at or above it keeps every group this
    /// replica holds below the base, which is committed, and nothing it holds above.
    end: Lsn,
    /// Voters that answered they hold no copy (and are not damaged themselves).
    no_copy: BTreeSet<NodeId>,
    /// Voters whose own copy is damaged.
    damaged: BTreeSet<NodeId>,
    /// When the peers were last asked for a copy.
    pub(super) last_request: Option<Nanos>,
    /// Discarded or halted: later answers change nothing.
    decided: bool,
}

impl Replica {
    /// A replica whose log has the damaged range `from..to` before its tail (storage
    /// reported checksum failures there with valid groups after them). Protocol-aware
    /// recovery (Alagappan et al., FAST 2018): it does not truncate and it does not vote
    /// or acknowledge; it asks its peers for a copy of the range, hands the first one to
    /// the driver ([`Action::Repair`]), and the driver restarts it from the repaired
    /// storage. If every other voter reports that it has no copy, it halts.
    ///
    /// `end` is where the damaged log ends. A peer that trimmed the whole range (it is
    /// committed, and the database checkpointed it there) answers with a
    /// [`Message::Rebase`] at its log start instead of a copy; once that start is at or
    /// above `end`, the replica takes it: its log starts again, empty, at the base, as a
    /// follower's behind its leader's start does. Its log is then at least as up to date
    /// as before (a later end, a proposal id no lower), so its votes stay safe.
    pub fn repairing(
        cfg: ReplicaConfig,
        meta: MetaRecord,
        from: Lsn,
        to: Lsn,
        end: Lsn,
        now: Nanos,
    ) -> Self {
        let mut r = Self::new(cfg, meta, RecoveredLog::default(), now);
        r.actions.clear();
        r.repairing = Some(RepairState {
            from,
            to,
            end,
            no_copy: BTreeSet::new(),
            damaged: BTreeSet::new(),
            last_request: None,
            decided: false,
        });
        r
    }

    pub(super) fn receive_while_repairing(&mut self, from: NodeId, msg: Message) {
        match msg {
            Message::RepairResp {
                from: f,
                to,
                bytes,
                have,
                damaged,
            } => {
                let Some(rep) = &mut self.repairing else {
                    return;
                };
                if (f, to) != (rep.from, rep.to) || rep.decided {
                    self.drop_input(Some(from), "repair response for another range");
                    return;
                }
                if have && !bytes.is_empty() {
                    self.actions.push(Action::Repair {
                        lsn: f,
                        bytes,
                        peer: from,
                    });
                    return;
                }
                if have {
                    // It holds some of the range but cannot send it whole: not a clean
                    // lack (the range may be committed). Asked again at the next request.
                    self.drop_input(Some(from), "repair: peer holds the range but sent no copy");
                    return;
                }
                if damaged {
                    rep.damaged.insert(from);
                } else {
                    rep.no_copy.insert(from);
                }
                self.decide_repair();
            }
            Message::Prepare { pid, ts, .. } => {
                // Not voting: our log cannot be vouched for until repaired.
                self.drop_input(Some(from), "prepare refused: log under repair");
                self.send_prepare_ack(from, pid, false, ts);
            }
            Message::Rebase {
                base,
                base_pid,
                committed,
                ..
            } => {
                let Some(rep) = &self.repairing else { return };
                if rep.decided {
                    self.drop_input(Some(from), "rebase after the repair was decided");
                    return;
                }
                if base.end_lsn > committed || !base.end_lsn.is_multiple_of(self.cfg.block_size) {
                    self.drop_input(
                        Some(from),
                        "rebase to a base that is not a committed block start",
                    );
                    return;
                }
                if base.end_lsn < rep.end.max(rep.to) {
                    // We hold groups above the base that may be committed with too few
                    // other copies: dropping them could let a less up-to-date candidate
                    // win our vote. Asked again until the peer's start passes our end.
                    self.drop_input(Some(from), "rebase below the damaged log's end");
                    return;
                }
                self.repairing = None;
                self.rebase_log(base, base_pid);
            }
            Message::RepairRequest { from: f, to } => {
                self.repair_request_while_repairing(from, f, to)
            }
            Message::Ping { prio, voter, .. } if prio.id == from => {
                self.peers.entry(from).or_default().prio = voter.then_some(prio);
            }
            _ => self.drop_input(Some(from), "log under repair"),
        }
    }

    /// A peer asks for `from..to` while this replica repairs its own range. Only a copy
    /// or "damaged" or "ask again" may go back, never a clean lack within our log: this
    /// replica does not know its own groups' boundaries (it starts on an empty view), so
    /// it cannot prove it lacks a range it might hold.
    ///
    /// A range wholly outside our damage and below our log's end may be intact here, so
    /// storage is asked for an exact copy of it: storage reads whole groups from `from`
    /// and fails on another boundary or on damage, and the answer is then "ask again"
    /// ([`Replica::log_read`]); the requester's storage checks any copy against its
    /// checksum chain. Without this, two replicas damaged in disjoint ranges at once
    /// each told the other "damaged", and with the third voter lacking a range the
    /// requester halted although an intact copy existed (a two-hour real-process run,
    /// seed 20261207). A range that overlaps our damage is answered "damaged"; one at or
    /// past our log's end is cleanly lacked, as by any replica whose log ends before it;
    /// one that straddles our end or exceeds a message gets "ask again".
    fn repair_request_while_repairing(&mut self, peer: NodeId, from: Lsn, to: Lsn) {
        let Some(rep) = &self.repairing else { return };
        let (dfrom, dto, end) = (rep.from, rep.to, rep.end);
        if from >= end.max(dto) && from < to {
            self.send(peer, repair_answer(from, to, false, false));
        } else if from < to && from < dto && dfrom < to {
            self.send_damaged(peer, from, to);
        } else if from >= to || to > end || to - from > self.cfg.max_message_bytes as u64 {
            // Part of it may be here but not as one copy: "ask again", as a healthy
            // replica answers (see `on_repair_request`).
            self.send(peer, repair_answer(from, to, true, false));
        } else {
            self.read_repair_copy(peer, from, to);
        }
    }

    /// Asks storage for an exact copy of `from..to` for `peer` ([`Replica::log_read`]
    /// sends it, or "ask again" if the read fails).
    fn read_repair_copy(&mut self, peer: NodeId, from: Lsn, to: Lsn) {
        self.actions.push(Action::ReadLog {
            purpose: ReadPurpose::Repair { peer, to },
            from,
            max_bytes: (to - from) as usize,
        });
    }

    /// Tells `to` that our own copy of `from..end` is damaged.
    pub(super) fn send_damaged(&mut self, to: NodeId, from: Lsn, end: Lsn) {
        self.send(to, repair_answer(from, end, false, true));
    }

    /// A copy handed out with [`Action::Repair`] was refused by storage (it is not the
    /// original): `peer` holds no copy of the range.
    pub fn repair_refused(&mut self, now: Nanos, peer: NodeId) {
        self.abandon_lane();
        self.now = self.now.max(now);
        if let Some(rep) = &mut self.repairing {
            rep.no_copy.insert(peer);
            self.decide_repair();
        }
    }

    /// A majority of voters cleanly lacking the range proves it was never committed (a
    /// commit needs a majority holding it); every other voter lacking it or damaged, with
    /// no such majority, means a committed range has no good copy left: halt.
    fn decide_repair(&mut self) {
        let me = self.cfg.id;
        let voters = self.meta_want.membership.voters.clone();
        let Some(rep) = &mut self.repairing else {
            return;
        };
        if Quorum::majority(voters.clone()).is_reached(|v| rep.no_copy.contains(&v)) {
            rep.decided = true;
            let lsn = rep.from;
            self.actions.push(Action::DiscardDamaged { lsn });
            return;
        }
        let others: Vec<NodeId> = voters.into_iter().filter(|v| *v != me).collect();
        if !others.is_empty()
            && others
                .iter()
                .all(|v| rep.no_copy.contains(v) || rep.damaged.contains(v))
        {
            rep.decided = true;
            let (f, t) = (rep.from, rep.to);
            self.halt(format!(
                "every copy of LSN {f}..{t} is damaged or missing and it may be committed: \
                 refusing to invent or drop log"
            ));
        }
    }

    /// Answers a peer's request for a copy of its damaged range `from..to`. A clean "no
    /// copy" (`have` and `damaged` unset) is an answer the requester may count towards
    /// discarding the range as never committed, so it is given only when this log does
    /// not hold the range: it ends at or before `from` (and does not start after it), or
    /// its groups have other boundaries there (it diverged before). A copy that storage
    /// refuses (other bytes with the same boundaries) counts as a lack too. A log that holds part of the range, has not flushed all of it, trimmed it,
    /// or holds more than one message can carry answers `have` with no bytes: "ask
    /// again", never counted as a lack; a log that trimmed all of it answers with a
    /// rebase at its start (see [`Replica::repairing`]) (a committed range told "no copy" by a majority
    /// would be discarded: found by the real-process nemesis, with bits flipped at rest
    /// in two places making a range larger than a message).
    pub(super) fn on_repair_request(&mut self, peer: NodeId, from: Lsn, to: Lsn) {
        let answer = |have| repair_answer(from, to, have, false);
        if from >= to {
            self.send(peer, answer(false));
            return;
        }
        if self.log.end() <= from && self.log.start <= from {
            self.send(peer, answer(false));
            return;
        }
        if to <= self.log.start {
            // Trimmed here: committed. The damaged replica may start again at our start.
            self.actions.push(Action::ReadLog {
                purpose: ReadPurpose::RepairRebase { peer },
                from: self.log.start,
                max_bytes: 4096,
            });
            return;
        }
        if from < self.log.start || to > self.log.flushed {
            self.send(peer, answer(true));
            return;
        }
        if from >= self.log.floor.end_lsn
            && (self.log.pos_at(from).is_none() || self.log.pos_at(to).is_none())
        {
            // Our groups have other boundaries there: our log diverged from the damaged
            // one at or before `from`, so we do not hold its range.
            self.send(peer, answer(false));
            return;
        }
        if to - from > self.cfg.max_message_bytes as u64 {
            self.send(peer, answer(true));
            return;
        }
        self.read_repair_copy(peer, from, to);
    }
}

/// An answer to a request for a copy of `from..to` that carries no bytes: a clean lack
/// (neither flag), "ask again" (`have`), or "our copy is damaged" (`damaged`).
fn repair_answer(from: Lsn, to: Lsn, have: bool, damaged: bool) -> Message {
    Message::RepairResp {
        from,
        to,
        bytes: Vec::new(),
        have,
        damaged,
    }
}
