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
    pub fn repairing(cfg: ReplicaConfig, meta: MetaRecord, from: Lsn, to: Lsn, now: Nanos) -> Self {
        let mut r = Self::new(cfg, meta, RecoveredLog::default(), now);
        r.actions.clear();
        r.repairing = Some(RepairState {
            from,
            to,
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
            Message::RepairRequest { from: f, to } => self.send_damaged(from, f, to),
            Message::Ping { prio, voter, .. } if prio.id == from => {
                self.peers.entry(from).or_default().prio = voter.then_some(prio);
            }
            _ => self.drop_input(Some(from), "log under repair"),
        }
    }

    /// Tells `to` that our own copy of `from..end` is damaged.
    pub(super) fn send_damaged(&mut self, to: NodeId, from: Lsn, end: Lsn) {
        let msg = Message::RepairResp {
            from,
            to: end,
            bytes: Vec::new(),
            have: false,
            damaged: true,
        };
        self.send(to, msg);
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

    pub(super) fn on_repair_request(&mut self, peer: NodeId, from: Lsn, to: Lsn) {
        let none = Message::RepairResp {
            from,
            to,
            bytes: Vec::new(),
            have: false,
            damaged: false,
        };
        if from >= to || to > self.log.flushed || to - from > self.cfg.max_message_bytes as u64 {
            self.send(peer, none);
            return;
        }
        self.actions.push(Action::ReadLog {
            purpose: ReadPurpose::Repair { peer, to },
            from,
            max_bytes: (to - from) as usize,
        });
    }
}
