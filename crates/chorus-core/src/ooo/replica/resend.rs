//! What followers lack: resends and streaming catch-up. Out-of-order acknowledgements show
//! the leader which slots a follower is missing (PolarFS section 5.2): a slot overtaken
//! [`OooConfig::hole_resend`] times is sent again at once (TCP's fast retransmit), the
//! last slots sent after [`OooConfig::timed_resend`] round trips (TCP's tail loss probe),
//! and every resend interval a follower gets what it lacks from its first uncommitted
//! slot on. A follower left behind is caught up by streaming, one bounded piece per
//! acknowledgement under a rate limit (PolarFS section 5.4, catch up); one below the
//! leader's base gets an image instead (`images`).
//!
//! [`OooConfig::hole_resend`]: super::OooConfig::hole_resend
//! [`OooConfig::timed_resend`]: super::OooConfig::timed_resend

use super::entry::entry_bytes;
use super::{Entry, OooReplica};
use crate::format::meta::NodeId;
use crate::ooo::Seq;
use crate::replica::Nanos;

impl OooReplica {
    /// Resends to `p` the recent slots it has been overtaken on
    /// ([`OooConfig::hole_resend`]), each again only once overtaken `hole_resend` more
    /// times, at most a batch at a time.
    ///
    /// [`OooConfig::hole_resend`]: super::OooConfig::hole_resend
    pub(super) fn resend_holes(&mut self, p: NodeId) {
        let (k, now) = (self.cfg.hole_resend, self.now);
        let Some(lead) = self.lead.as_mut() else {
            return;
        };
        let from = lead.fresh;
        let Some(peer) = lead.peers.get_mut(&p) else {
            return;
        };
        if k == 0 || peer.catching_up || peer.snap.is_some() {
            return;
        }
        // Slots below `lo` are not resent again this term (`fresh` only grows).
        let lo = from.max(peer.head);
        peer.resent = peer.resent.split_off(&lo);
        // The newest slot it acknowledged: slots `k` or more below it were overtaken.
        let Some(&newest) = peer.acked.last() else {
            return;
        };
        let Some(upto) = newest.checked_sub(k) else {
            return;
        };
        if lo > upto {
            return;
        }
        let batch = self.cfg.max_batch.max(1);
        let mut entries = Vec::new();
        for (&s, slot) in self.log.range(lo..=upto) {
            if entries.len() >= batch {
                break;
            }
            if peer.acked.contains(&s) {
                continue;
            }
            if peer.resent.get(&s).is_some_and(|&(at, _)| newest < at + k) {
                continue;
            }
            peer.resent.insert(s, (newest, now));
            entries.push(slot.entry.clone());
        }
        if entries.is_empty() {
            return;
        }
        self.stats.hole_resends += entries.len() as u64;
        self.send_entries(p, entries);
    }

    /// Resends to each follower the uncommitted slots it has not acknowledged within its
    /// timeout ([`OooConfig::timed_resend`]), at most a batch at a time: only slots first
    /// sent since the last periodic resend (older ones are its), each again only twice the
    /// timeout after its last resend.
    ///
    /// [`OooConfig::timed_resend`]: super::OooConfig::timed_resend
    pub(super) fn resend_timed(&mut self) {
        let factor = self.cfg.timed_resend;
        let (now, timeout, head) = (self.now, self.cfg.election_timeout, self.commits.head());
        let batch = self.cfg.max_batch.max(1);
        let Some(lead) = self.lead.as_mut() else {
            return;
        };
        if factor == 0 || lead.commit.is_none() {
            return;
        }
        // What is committed needs no timer, but a follower's acknowledgements of slots it
        // does not know committed yet are still round trips: keep those until its head
        // passes them (followers that do not keep pace do not hold this back).
        let keep = head.min(lead.slowest(now, timeout, |p| p.head));
        while lead.sent.front().is_some_and(|&(s, _)| s < keep) {
            lead.sent.pop_front();
        }
        let mut sends = Vec::new();
        for (&id, peer) in lead.peers.iter_mut() {
            let Some(after) = peer.rtt.timeout(factor) else {
                continue;
            };
            if !peer.keeps_pace(now, timeout) {
                continue;
            }
            let lo = lead.fresh.max(peer.head);
            let first = lead.sent.partition_point(|&(s, _)| s < lo);
            let mut entries = Vec::new();
            for &(s, at) in lead.sent.range(first..) {
                if at.saturating_add(after) > now || entries.len() >= batch {
                    break;
                }
                let Some(slot) = self.log.get(&s) else {
                    continue;
                };
                if slot.committed || peer.acked.contains(&s) {
                    continue;
                }
                if peer
                    .resent
                    .get(&s)
                    .is_some_and(|&(_, t)| t.saturating_add(2 * after) > now)
                {
                    continue;
                }
                let newest = peer.acked.last().copied().unwrap_or(0);
                peer.resent.insert(s, (newest, now));
                entries.push(slot.entry.clone());
            }
            if !entries.is_empty() {
                sends.push((id, entries));
            }
        }
        for (to, entries) in sends {
            self.stats.timed_resends += entries.len() as u64;
            self.send_entries(to, entries);
        }
    }

    /// Leader: when [`OooConfig::timed_resend`] may next resend something (the oldest
    /// uncommitted slot's timeout at the quickest follower), so that a driver waiting for
    /// input wakes for it; `None` when nothing is in flight or the rule is off. A time
    /// already past means "on the next tick".
    ///
    /// [`OooConfig::timed_resend`]: super::OooConfig::timed_resend
    pub fn resend_due(&self) -> Option<Nanos> {
        let lead = self.lead.as_ref()?;
        if self.cfg.timed_resend == 0 || lead.commit.is_none() {
            return None;
        }
        let head = self.commits.head();
        let &(_, at) = lead
            .sent
            .get(lead.sent.partition_point(|&(s, _)| s < head))?;
        let after = lead
            .peers
            .values()
            .filter_map(|p| p.rtt.timeout(self.cfg.timed_resend))
            .min()?;
        Some(at.saturating_add(after))
    }

    /// Whether a piece for `p` fits its catch-up budget (charging it if so). Only a
    /// follower in streaming catch-up is limited: new appends and the merge are not.
    pub(super) fn spend_catchup(&mut self, p: NodeId, need: u64) -> bool {
        // The bucket holds at most 100 ms of the rate (or two pieces, if more).
        let rate = self.cfg.catchup_rate;
        let (cap, now) = (
            (2 * self.cfg.max_batch_bytes.max(1) as u64).max(rate / 10),
            self.now,
        );
        let Some(peer) = self.lead.as_mut().and_then(|l| l.peers.get_mut(&p)) else {
            return false;
        };
        if rate == 0 || !(peer.catching_up || peer.snap.is_some()) {
            return true;
        }
        let earned = (now.saturating_sub(peer.refilled) as u128 * rate as u128 / 1_000_000_000)
            .min(cap as u128) as u64;
        if earned > 0 {
            peer.budget = (peer.budget + earned).min(cap);
            peer.refilled = now;
        }
        // A piece larger than the cap (one huge entry) goes once the budget is full.
        if peer.budget >= need.min(cap) {
            peer.budget = peer.budget.saturating_sub(need);
            self.stats.catchup_bytes += need;
            true
        } else {
            self.stats.catchup_deferred += 1;
            false
        }
    }

    /// The next piece a follower lacks: the slots from its first uncommitted one that it
    /// has not acknowledged in this term. A follower catching up gets every slot from its
    /// head, acknowledged or not: it may have restarted since, and a slot read back from
    /// disk is not confirmed until this leader sends it again.
    ///
    /// While the merge is under way, the merged slots it has not acknowledged come first,
    /// whatever its head: they must reach a majority before the leader serves.
    pub(super) fn missing_for(&self, p: NodeId) -> Vec<Entry> {
        let Some(lead) = self.lead.as_ref() else {
            return Vec::new();
        };
        let Some(peer) = lead.peers.get(&p) else {
            return Vec::new();
        };
        if peer.head < self.hard.base && lead.merging.is_empty() {
            // What it lacks first is compacted here: it gets an image ([`Self::snapshot_tick`]).
            return Vec::new();
        }
        let batch = self.cfg.max_batch.max(1);
        let merging = lead
            .merging
            .iter()
            .filter(|(_, acks)| !acks.contains(&p))
            .map(|(s, _)| *s);
        let normal = self
            .log
            .range(peer.head..lead.end)
            .filter(|(s, _)| peer.catching_up || !peer.acked.contains(s))
            .map(|(s, _)| *s);
        let mut seqs: Vec<Seq> = merging.take(batch).collect();
        if seqs.len() < batch {
            let more: Vec<Seq> = normal
                .filter(|s| !seqs.contains(s))
                .take(batch - seqs.len())
                .collect();
            seqs.extend(more);
        }
        let max_bytes = self.cfg.max_batch_bytes.max(1) as u64;
        let mut bytes = 0;
        let mut out = Vec::new();
        for slot in seqs.iter().filter_map(|s| self.log.get(s)) {
            let b = entry_bytes(&slot.entry);
            if !out.is_empty() && bytes + b > max_bytes {
                break;
            }
            bytes += b;
            out.push(slot.entry.clone());
        }
        out
    }
}
