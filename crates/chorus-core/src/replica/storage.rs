//! The replica's storage: durable meta saves (a promise or a membership is acted on only
//! once its save is durable), the driver's reports on the log (flushed, trimmed, read),
//! and the local log itself: taking whole groups that continue it (matched by LSN and
//! accumulated checksum, a conflicting uncommitted suffix truncated, as Raft and PALF
//! section 3.4 do), writing and truncating. A follower acknowledges only what is flushed
//! (the piggyback paper's durability rule, section 4.2), and a storage failure stops it
//! acknowledging and voting until the driver reopens it.

use crate::format::group::{decode_group, fits_in_block, ChainPoint, GroupHeader};
use crate::format::meta::NodeId;
use crate::Lsn;

use super::log::GroupMeta;
use super::{Action, LogPos, Message, Nanos, ReadPurpose, Replica};

/// A step that waits for a promise to be durable.
#[derive(Clone, Debug)]
pub(super) enum Deferred {
    /// Acknowledge candidate `to`'s prepare under `pid` (echoing `ts`) once the promise
    /// to it is saved.
    PrepareAck { to: NodeId, pid: u64, ts: Nanos },
    /// Send our own prepare under `pid` once our promise to ourselves is saved.
    Campaign { pid: u64 },
}

impl Replica {
    pub(super) fn save_meta(&mut self) {
        if self.meta_inflight.is_none() && self.meta_want != self.meta {
            self.meta_seq += 1;
            self.meta_inflight = Some(self.meta_seq);
            self.saved_snapshot = Some(self.meta_want.clone());
            self.actions.push(Action::SaveMeta {
                seq: self.meta_seq,
                record: self.meta_want.clone(),
            });
        }
    }

    /// The meta record of save `seq` is durable.
    pub fn meta_saved(&mut self, now: Nanos, seq: u64) {
        self.check_invariants();
        self.abandon_lane();
        self.now = self.now.max(now);
        if self.meta_inflight != Some(seq) {
            self.drop_input(None, "meta_saved for an unknown save");
            return;
        }
        self.meta_inflight = None;
        // What was saved is the record as of the save action; meta_want may have moved on,
        // but every field only moves forward, so the older record is a safe lower bound.
        let saved = self
            .saved_snapshot
            .take()
            .unwrap_or_else(|| self.meta_want.clone());
        self.meta = saved;
        let deferred = std::mem::take(&mut self.deferred);
        for d in deferred {
            match d {
                Deferred::PrepareAck { to, pid, ts } => {
                    if self.meta.vote.promised_proposal_id >= pid {
                        if self.meta.vote.promised_proposal_id == pid {
                            self.send_prepare_ack(to, pid, true, ts);
                        }
                    } else {
                        self.deferred.push(Deferred::PrepareAck { to, pid, ts });
                    }
                }
                Deferred::Campaign { pid } => {
                    if self.meta.vote.promised_proposal_id >= pid {
                        self.begin_prepare(pid);
                    } else {
                        self.deferred.push(Deferred::Campaign { pid });
                    }
                }
            }
        }
        // A follower whose promise just became durable may now acknowledge.
        if self.leading.is_none() && self.leader.is_some() {
            self.send_ack(true, 0);
        }
        self.try_commit();
        self.save_meta();
    }

    /// Storage failed (for example a failed `fdatasync`): stop acknowledging and voting.
    /// The driver must reopen the replica from what is on disk (DESIGN.md principle 4).
    pub fn storage_failed(&mut self, now: Nanos) {
        self.abandon_lane();
        self.now = self.now.max(now);
        self.storage_failed = true;
        self.step_down();
    }

    /// Storage reports everything below `lsn` durable.
    pub fn log_flushed(&mut self, now: Nanos, lsn: Lsn) {
        self.check_invariants();
        self.abandon_lane();
        self.now = self.now.max(now);
        if !self.live() {
            return;
        }
        self.log.flushed = lsn.min(self.log.end());
        if self.leading.is_some() {
            self.try_commit();
            // Adaptive group replication (PALF section 6): the IO worker is idle, so a
            // small open group goes out now instead of waiting for the freeze interval.
            if self.log.flushed == self.log.end() {
                self.freeze();
            }
        } else {
            if let Some(m) = self.pending_config.take() {
                self.consider_config(m);
            }
            self.send_ack(true, 0);
        }
    }

    /// Storage deleted the log below `start` (the database trimmed it after its own
    /// checkpoint; `start` is the first LSN storage still holds, a group boundary at or
    /// below the committed end). A follower that needs anything below it is rebased there
    /// ([`Message::Rebase`]).
    pub fn log_trimmed(&mut self, now: Nanos, start: Lsn) {
        self.abandon_lane();
        self.now = self.now.max(now);
        self.log.start = self.log.start.max(start.min(self.log.committed));
    }

    /// A storage read requested by [`Action::ReadLog`] finished: `Ok((chain at from,
    /// whole groups))` or an error message.
    pub fn log_read(
        &mut self,
        now: Nanos,
        purpose: ReadPurpose,
        from: Lsn,
        result: Result<(ChainPoint, Vec<u8>), String>,
    ) {
        self.abandon_lane();
        self.now = self.now.max(now);
        if !self.live() {
            return;
        }
        if let ReadPurpose::Repair { peer, to } = purpose {
            // Only an exact copy of the range is of use; storage verifies it again. A
            // read that failed is "ask again" (`have` with no bytes), never a clean lack:
            // the range was found in this log when the request came.
            let bytes = match result {
                Ok((_, b)) if b.len() as u64 == to - from => b,
                _ => Vec::new(),
            };
            let have = true;
            self.send(
                peer,
                Message::RepairResp {
                    from,
                    to,
                    bytes,
                    have,
                    damaged: false,
                },
            );
            return;
        }
        let (chain, bytes) = match result {
            Ok(r) => r,
            Err(_) => {
                if let (ReadPurpose::CatchUp { peer }, Some(l)) = (purpose, &mut self.leading) {
                    if let Some(p) = l.progress.get_mut(&peer) {
                        p.read_pending = false;
                    }
                }
                self.drop_input(None, "storage read failed");
                return;
            }
        };
        let prev = LogPos {
            lsn: from,
            acc: chain.acc_crc,
        };
        match purpose {
            ReadPurpose::CatchUp { peer } => {
                let Some(l) = &mut self.leading else { return };
                let Some(p) = l.progress.get_mut(&peer) else {
                    return;
                };
                p.read_pending = false;
                let rebase = p.next < from && from == self.log.start;
                if p.next != from && !rebase {
                    return;
                }
                let bytes = cut_groups(&bytes, self.log.end(), self.cfg.max_message_bytes);
                p.sent_upto(from + bytes.len() as u64, self.now);
                // The follower needs groups below our start, which storage no longer
                // holds: it starts again at our start, then takes the groups after it.
                let (pid, ts) = (l.pid, self.now);
                if rebase && !self.send_rebase(peer, pid, ts, chain, from) {
                    return;
                }
                let msg = self.append_msg(peer, prev, bytes);
                self.send(peer, msg);
            }
            ReadPurpose::Repair { .. } => {}
            ReadPurpose::RepairRebase { peer } => {
                // Not as a leader (pid 0, no lease timestamp): a repairing replica takes
                // only the base from it.
                self.send_rebase(peer, 0, 0, chain, from);
            }
            ReadPurpose::Fetch {
                peer,
                pid,
                max_bytes,
                rebase,
            } => {
                if self.meta.vote.promised_proposal_id != pid {
                    return;
                }
                if rebase && !self.send_rebase(peer, pid, 0, chain, from) {
                    return;
                }
                let groups = cut_groups(&bytes, self.log.flushed, max_bytes as usize);
                let end = self.log.flushed;
                self.send(
                    peer,
                    Message::FetchResp {
                        pid,
                        prev,
                        groups,
                        end,
                    },
                );
            }
        }
    }

    /// Sends `peer` a [`Message::Rebase`] at `from`, this replica's log start, whose
    /// chain point storage read as `chain`. Refused (false, the input dropped) when the
    /// start is above the committed end: a replica is only ever rebased onto a committed
    /// prefix, so the receiver may take everything below it as decided.
    fn send_rebase(
        &mut self,
        peer: NodeId,
        pid: u64,
        ts: Nanos,
        chain: ChainPoint,
        from: Lsn,
    ) -> bool {
        if from > self.log.committed {
            self.drop_input(Some(peer), "log start above the committed end");
            return false;
        }
        let msg = Message::Rebase {
            pid,
            ts,
            base: chain,
            base_pid: self.log.pid_ending_at(from),
            committed: self.log.committed,
            config: self.config_offer(peer, pid),
        };
        self.rebases_sent += 1;
        self.send(peer, msg);
        true
    }

    /// Accepts whole groups continuing the log at `prev` under the authority of proposal
    /// id `authority`. Returns the end of the last group (matched with the sender).
    pub(super) fn accept_groups(
        &mut self,
        prev: Lsn,
        bytes: &[u8],
        authority: u64,
    ) -> Result<Lsn, &'static str> {
        let mut parsed = Vec::new();
        let mut off = 0usize;
        let mut pos = prev;
        while off < bytes.len() {
            let (h, _) = decode_group(&bytes[off..]).map_err(|_| "malformed group")?;
            if h.lsn != pos {
                return Err("group out of sequence");
            }
            if h.proposal_id > authority {
                return Err("group from a later proposal id");
            }
            if !fits_in_block(h.lsn, h.total_len(), self.cfg.block_size) {
                return Err("group straddles a block");
            }
            let len = h.total_len() as usize;
            parsed.push((h, off, len));
            off += len;
            pos = h.end_lsn();
        }
        let mut last = prev;
        for (h, off, len) in parsed {
            if h.end_lsn() <= self.log.floor.end_lsn {
                last = h.end_lsn();
                continue;
            }
            if h.lsn < self.log.end() {
                if let Some(m) = self.log.group_at(h.lsn) {
                    if m.pid == h.proposal_id && m.after.acc_crc == h.acc_crc {
                        last = h.end_lsn();
                        continue;
                    }
                }
                if h.lsn < self.log.committed {
                    self.halt(format!(
                        "a group at LSN {} conflicts with the committed log (committed end {})",
                        h.lsn, self.log.committed
                    ));
                    return Err("conflict with the committed log");
                }
                if self.log.chain_at(h.lsn).is_none() {
                    return Err("group does not start at a boundary of the log");
                }
                self.truncate_log(h.lsn);
            }
            if h.verify_chain(&self.log.chain).is_err() {
                return Err("group does not continue the checksum chain");
            }
            self.leader_committed = self.leader_committed.max(h.committed_end_lsn);
            self.write_group(&h, bytes[off..off + len].to_vec());
            last = h.end_lsn();
        }
        Ok(last)
    }

    pub(super) fn write_group(&mut self, h: &GroupHeader, bytes: Vec<u8>) {
        self.last_csn = self.last_csn.max(h.max_csn);
        let meta = GroupMeta {
            lsn: h.lsn,
            pid: h.proposal_id,
            after: h.chain_after(),
        };
        self.log.push(meta, bytes.clone());
        self.actions.push(Action::Write { lsn: h.lsn, bytes });
    }

    pub(super) fn truncate_log(&mut self, lsn: Lsn) {
        debug_assert!(lsn >= self.log.committed);
        self.log.truncate(lsn);
        self.matched_end = self.matched_end.min(lsn);
        self.actions.push(Action::Truncate { lsn });
    }
}

/// The prefix of `bytes` (whole groups) ending at or before `limit` (an LSN bound) and at
/// most `max` bytes (but at least one group if it fits the LSN bound).
pub(super) fn cut_groups(bytes: &[u8], limit: Lsn, max: usize) -> Vec<u8> {
    let mut off = 0usize;
    while off < bytes.len() {
        let Ok(h) = GroupHeader::decode(&bytes[off..]) else {
            break;
        };
        let len = h.total_len() as usize;
        if h.end_lsn() > limit || off + len > bytes.len() || (off > 0 && off + len > max) {
            break;
        }
        off += len;
    }
    bytes[..off].to_vec()
}
