//! Invariant checkers, run after every step of a simulated cluster.
//!
//! What they hold the cluster to (issue 3): at most one leader per proposal id; the
//! committed prefix identical on every replica; the commit point never moving backwards;
//! nothing committed ever lost; every append result delivered exactly once and never
//! Failed-then-Committed; CSNs monotonic and at least the appender's reference CSN.

use std::collections::{BTreeMap, BTreeSet};

use chorus_core::format::entry::EntryIter;
use chorus_core::format::group::{ChainPoint, GroupHeader, FLAG_MIRRORED};
use chorus_core::format::meta::NodeId;
use chorus_core::replica::{Outcome, Role, Ticket};
use chorus_core::{Csn, Lsn};
use chorus_storage::LogStorage;

/// A committed group as the reference history knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RefGroup {
    end: Lsn,
    pid: u64,
    acc: u32,
}

/// An append a replica accepted.
#[derive(Clone, Copy, Debug)]
pub struct Accepted {
    /// The record's unique tag (its first 8 bytes).
    pub tag: u64,
    /// The ticket.
    pub ticket: Ticket,
    /// The reference CSN passed in.
    pub ref_csn: Csn,
    /// A mirror write ([`chorus_core::replica::Replica::mirror`]) rather than an append:
    /// its entries are the primary's, so it has no tag; Committed means the committed
    /// history holds a group at its LSN, and Failed only that this copy did not commit
    /// (a later leader may have committed the same group re-sealed).
    pub mirror: bool,
}

/// What a mirrored group must keep of the primary's group at its LSN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct PrimaryGroup {
    len: u64,
    seq: u64,
    max_csn: Csn,
    data_crc: u32,
    entries: u32,
}

impl PrimaryGroup {
    fn of(h: &GroupHeader) -> Self {
        Self {
            len: h.total_len(),
            seq: h.group_seq,
            max_csn: h.max_csn,
            data_crc: h.data_crc,
            entries: h.entry_count,
        }
    }
}

/// The checker state.
#[derive(Debug, Default)]
pub struct Checker {
    /// Violations found so far, each with the simulated time.
    pub violations: Vec<String>,
    leaders: BTreeMap<u64, NodeId>,
    reference: BTreeMap<Lsn, RefGroup>,
    /// End of the reference committed log.
    pub ref_end: Lsn,
    last_csn: Csn,
    checked: BTreeMap<NodeId, Lsn>,
    committed: BTreeMap<(NodeId, u32), Lsn>,
    accepted: BTreeMap<(NodeId, u32, u64), Accepted>,
    results: BTreeMap<(NodeId, u32, u64), Outcome>,
    failed_tags: BTreeSet<u64>,
    committed_tags: BTreeMap<u64, Lsn>,
    /// Results delivered, by outcome.
    pub outcomes: BTreeMap<&'static str, u64>,
    /// Groups the simulated primaries generated, by LSN (mirror runs).
    primary: BTreeMap<Lsn, Vec<PrimaryGroup>>,
    /// Every committed group must be mirrored (or padding): the group was a mirror for the
    /// whole run, so its leaders may write no group of their own.
    pub strict_mirror: bool,
    /// Committed groups that were mirrored.
    pub mirrored_committed: u64,
}

impl Checker {
    fn violation(&mut self, now: u64, what: String) {
        if self.violations.len() < 20 {
            self.violations
                .push(format!("t={:.3}s: {what}", now as f64 / 1e9));
        }
    }

    /// A replica changed role.
    pub fn on_role(&mut self, now: u64, node: NodeId, role: Role, pid: u64) {
        if role == Role::Leader {
            if let Some(other) = self.leaders.insert(pid, node) {
                if other != node {
                    self.violation(
                        now,
                        format!("two leaders under proposal id {pid}: {other} and {node}"),
                    );
                }
            }
        }
    }

    /// A replica accepted an append.
    pub fn on_accepted(&mut self, now: u64, node: NodeId, inc: u32, a: Accepted) {
        if a.ticket.csn < a.ref_csn {
            self.violation(
                now,
                format!(
                    "node {node}: CSN {} below the reference CSN {}",
                    a.ticket.csn, a.ref_csn
                ),
            );
        }
        self.accepted.insert((node, inc, a.ticket.id), a);
    }

    /// A simulated primary generated the group `h`.
    pub fn on_generated(&mut self, h: &GroupHeader) {
        self.primary
            .entry(h.lsn)
            .or_default()
            .push(PrimaryGroup::of(h));
    }

    /// A group newly in the committed history: a mirrored one must be the primary's
    /// group at its LSN (entries, CSNs, length and sequence number kept by the re-seal).
    fn check_mirrored(&mut self, now: u64, node: NodeId, h: &GroupHeader) {
        let mirrored = h.flags & FLAG_MIRRORED != 0;
        if mirrored {
            self.mirrored_committed += 1;
            let this = PrimaryGroup::of(h);
            let known = self.primary.get(&h.lsn).is_some_and(|v| v.contains(&this));
            if !known {
                self.violation(
                    now,
                    format!(
                        "node {node}: committed mirrored group at LSN {} ({this:?}) is no \
                         primary's group there ({:?})",
                        h.lsn,
                        self.primary.get(&h.lsn)
                    ),
                );
            }
        } else if self.strict_mirror && !h.is_padding() {
            self.violation(
                now,
                format!(
                    "node {node}: committed group at LSN {} (pid {}, {} entries) in a mirror \
                     is not mirrored: its leader wrote a group of its own",
                    h.lsn, h.proposal_id, h.entry_count
                ),
            );
        }
    }

    /// A replica's committed end advanced to `end`; compare its log with the reference.
    pub fn on_commit(&mut self, now: u64, node: NodeId, inc: u32, end: Lsn, log: &LogStorage) {
        let prev = self.committed.insert((node, inc), end).unwrap_or(0);
        if end < prev {
            self.violation(
                now,
                format!("node {node}: commit point moved back from {prev} to {end}"),
            );
        }
        let from = self
            .checked
            .get(&node)
            .copied()
            .unwrap_or(0)
            .max(log.start_lsn());
        if from >= end {
            return;
        }
        let mut at = from;
        for g in log.iter_from(from) {
            if at >= end {
                break;
            }
            let (h, body) = match g {
                Ok(g) => g,
                Err(e) => {
                    self.violation(
                        now,
                        format!("node {node}: committed log unreadable at {at}: {e}"),
                    );
                    return;
                }
            };
            let this = RefGroup {
                end: h.end_lsn(),
                pid: h.proposal_id,
                acc: h.acc_crc,
            };
            match self.reference.get(&h.lsn) {
                Some(r) if *r == this => {}
                Some(r) => {
                    let r = *r;
                    self.violation(
                        now,
                        format!(
                            "node {node}: committed group at LSN {} differs: pid {} acc {:08x} \
                             vs pid {} acc {:08x} in the committed history",
                            h.lsn, this.pid, this.acc, r.pid, r.acc
                        ),
                    );
                    return;
                }
                None if h.lsn == self.ref_end => {
                    self.reference.insert(h.lsn, this);
                    self.ref_end = this.end;
                    self.check_mirrored(now, node, &h);
                    for e in EntryIter::new(&body) {
                        let Ok(e) = e else { break };
                        let lsn = chorus_core::format::group::entry_lsn(h.lsn, e.offset);
                        if e.csn <= self.last_csn {
                            self.violation(
                                now,
                                format!(
                                    "CSN {} at LSN {lsn} not above the previous {}",
                                    e.csn, self.last_csn
                                ),
                            );
                        }
                        self.last_csn = self.last_csn.max(e.csn);
                        if e.data.len() >= 8 {
                            let tag = u64::from_le_bytes(e.data[..8].try_into().expect("8"));
                            if self.failed_tags.contains(&tag) {
                                self.violation(
                                    now,
                                    format!("record {tag:#x} reported Failed, then committed at LSN {lsn}"),
                                );
                            }
                            self.committed_tags.insert(tag, lsn);
                        }
                    }
                }
                None => {
                    self.violation(
                        now,
                        format!(
                            "node {node}: committed group at LSN {} beyond the history end {}",
                            h.lsn, self.ref_end
                        ),
                    );
                    return;
                }
            }
            at = h.end_lsn();
        }
        if at != end {
            self.violation(
                now,
                format!("node {node}: committed end {end} is not a group boundary (at {at})"),
            );
            return;
        }
        self.checked.insert(node, end);
    }

    /// A replica handed over readable CSN `csn` with committed end `end`: it must be
    /// exactly the largest CSN its log holds below `end` (PALF section 4.2, follower
    /// reads). More would let a follower answer a read at a CSN it does not hold; less
    /// would keep readers waiting for records it has.
    pub fn on_readable_csn(
        &mut self,
        now: u64,
        node: NodeId,
        end: Lsn,
        csn: u64,
        log: &LogStorage,
    ) {
        // Below the log's start (trimmed) there is nothing to compare with.
        let Ok(held) = log.chain_at(end) else { return };
        if csn != held.max_csn {
            let how = if csn > held.max_csn {
                "overstated: reads there could miss records"
            } else {
                "understated"
            };
            self.violation(
                now,
                format!(
                    "node {node}: readable CSN {csn} at committed end {end}, but its log's \
                     largest CSN below it is {} ({how})",
                    held.max_csn
                ),
            );
        }
    }

    /// A replica crashed: results of its accepted appends may never come.
    pub fn on_crash(&mut self, node: NodeId, inc: u32) {
        let keys: Vec<_> = self
            .accepted
            .range((node, inc, 0)..=(node, inc, u64::MAX))
            .map(|(k, _)| *k)
            .filter(|k| !self.results.contains_key(k))
            .collect();
        for k in keys {
            self.accepted.remove(&k);
        }
        self.checked.remove(&node);
    }

    /// A replica's log was started again at `base` (it fell behind its leader's log
    /// start): `base` must be a point of the committed history, with its checksum chain.
    pub fn on_rebase(&mut self, now: u64, node: NodeId, base: &ChainPoint) {
        if base.end_lsn > self.ref_end {
            let end = self.ref_end;
            self.violation(
                now,
                format!(
                    "node {node}: rebased at {} past the committed history's end {end}",
                    base.end_lsn
                ),
            );
            return;
        }
        if base.end_lsn == 0 {
            return;
        }
        match self.reference.range(..base.end_lsn).next_back() {
            Some((_, r)) if r.end == base.end_lsn && r.acc == base.acc_crc => {}
            Some((&lsn, r)) => {
                let r = *r;
                self.violation(
                    now,
                    format!(
                        "node {node}: rebased at {} acc {:08x}, but the committed history's \
                         group at {lsn} ends at {} acc {:08x}",
                        base.end_lsn, base.acc_crc, r.end, r.acc
                    ),
                );
            }
            None => {}
        }
    }

    /// An append's result became unknown (its replica fell behind the leader's log start
    /// before learning it): like a crash, for that append alone.
    pub fn on_unknown(&mut self, node: NodeId, inc: u32, id: u64) {
        let key = (node, inc, id);
        if !self.results.contains_key(&key) {
            self.accepted.remove(&key);
            *self.outcomes.entry("unknown").or_default() += 1;
        }
    }

    /// A replica delivered a result.
    pub fn on_result(
        &mut self,
        now: u64,
        node: NodeId,
        inc: u32,
        id: u64,
        lsn: Lsn,
        outcome: Outcome,
    ) {
        let key = (node, inc, id);
        let Some(a) = self.accepted.get(&key).copied() else {
            self.violation(now, format!("node {node}: result for unknown append {id}"));
            return;
        };
        if let Some(prev) = self.results.insert(key, outcome) {
            self.violation(
                now,
                format!("node {node}: append {id} got a second result {outcome:?} after {prev:?}"),
            );
            return;
        }
        if a.ticket.lsn != lsn {
            self.violation(now, format!("node {node}: result LSN {lsn} != ticket"));
        }
        if a.mirror {
            let key = match outcome {
                Outcome::Committed => "mirror_committed",
                Outcome::Failed => "mirror_failed",
            };
            *self.outcomes.entry(key).or_default() += 1;
            if outcome == Outcome::Committed && !self.reference.contains_key(&lsn) {
                self.violation(
                    now,
                    format!(
                        "node {node}: mirror write {id} reported Committed at LSN {lsn}, where \
                         the committed history has no group (its end is {})",
                        self.ref_end
                    ),
                );
            }
            return;
        }
        match outcome {
            Outcome::Committed => {
                *self.outcomes.entry("committed").or_default() += 1;
                if self.committed_tags.get(&a.tag) != Some(&lsn) {
                    self.violation(
                        now,
                        format!(
                            "node {node}: append {id} reported Committed at LSN {lsn} but the \
                             committed history holds {:?}",
                            self.committed_tags.get(&a.tag)
                        ),
                    );
                }
            }
            Outcome::Failed => {
                *self.outcomes.entry("failed").or_default() += 1;
                if let Some(at) = self.committed_tags.get(&a.tag) {
                    self.violation(
                        now,
                        format!("node {node}: append {id} reported Failed but committed at {at}"),
                    );
                }
                self.failed_tags.insert(a.tag);
            }
        }
    }

    /// Appends accepted by `node` (incarnation `inc`) still without a result.
    pub fn unresolved(&self, node: NodeId, inc: u32) -> usize {
        self.accepted
            .range((node, inc, 0)..=(node, inc, u64::MAX))
            .filter(|(k, _)| !self.results.contains_key(k))
            .count()
    }

    /// Whether `tag` is committed, and where.
    pub fn committed_at(&self, tag: u64) -> Option<Lsn> {
        self.committed_tags.get(&tag).copied()
    }

    /// Records a violation found by the driver.
    pub fn report(&mut self, now: u64, what: String) {
        self.violation(now, what);
    }
}
