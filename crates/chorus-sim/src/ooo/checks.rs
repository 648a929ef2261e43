//! The checks of the out-of-order simulation (module docs of [`super`]): agreement on
//! committed slots, one explicit result per append, conflict order, images that hold what
//! their base promises, and after healing serial equivalence, the committed log as a
//! reader gets it, and liveness.

use std::collections::{BTreeSet, HashMap};

use chorus_core::format::meta::NodeId;
use chorus_core::ooo::replica::{Entry, Membership, Mode};
use chorus_core::ooo::Seq;
use chorus_core::replica::Outcome;

use super::overlap;
use super::sim::Sim;
use super::sm::{decode_txn, records, writes};

impl Sim {
    pub(super) fn observe_commit(&mut self, id: NodeId, e: Entry) {
        match self.committed.get(&e.seq) {
            Some(c) if c.eid != e.eid || c.is_null() != e.is_null() || c.data() != e.data() => {
                let (ce, ee) = (c.eid, e.eid);
                self.violation(format!(
                    "slot {} committed as {ce:#x} elsewhere and as {ee:#x} on node {id}",
                    e.seq
                ));
            }
            Some(_) => {}
            None => {
                // A result given before this commit was observed must agree.
                if let Some(&(_, _, seq, Some(out), _)) = self.appends.get(&e.eid) {
                    if seq == e.seq && out == Outcome::Failed {
                        self.violation(format!(
                            "append {:#x} was told Failed, then slot {seq} committed with it",
                            e.eid
                        ));
                    }
                }
                self.committed.insert(e.seq, e);
            }
        }
    }

    /// A node tells a writer its append committed only once the slot is applied in its
    /// state machine, so that a read served there afterwards sees it (PolarFS section
    /// 4, the IoScheduler's guarantee): every key the slot writes has it, or a later
    /// slot, as its last writer there. Slots below the node's last restart or image
    /// base are not judged (their writers may be forgotten).
    pub(super) fn check_applied_before_told(&mut self, id: NodeId, eid: u64, seq: Seq) {
        let Some(keys) = self.written.remove(&(seq, eid)) else {
            return;
        };
        let Some(sm) = self.nodes.get(&id).and_then(|n| n.sm.clone()) else {
            return;
        };
        let bad = {
            let v = sm.vol();
            if seq < v.forgot_below {
                return;
            }
            keys.into_iter()
                .find(|k| v.last_writer.get(k).is_none_or(|w| *w < seq))
                .map(|k| (k, v.last_writer.get(&k).copied()))
        };
        self.bump("results_checked_applied", 1);
        if let Some((k, w)) = bad {
            self.violation(format!(
                "node {id} told slot {seq} committed before applying it (key {k}: last applied writer {w:?})"
            ));
        }
    }

    pub(super) fn observe_result(
        &mut self,
        id: NodeId,
        eid: u64,
        seq: Seq,
        out: Outcome,
        term: u64,
    ) {
        self.bump(
            if out == Outcome::Committed {
                "committed"
            } else {
                "failed"
            },
            1,
        );
        let Some(a) = self.appends.get_mut(&eid) else {
            self.violation(format!("node {id}: result for unknown append {eid:#x}"));
            return;
        };
        if a.3.is_some() || a.4 {
            let unknown = a.4;
            self.violation(format!(
                "append {eid:#x} got a second result {out:?} (unknown before: {unknown})"
            ));
            return;
        }
        a.3 = Some(out);
        let at = a.2;
        self.check_conflict_order(id, eid, seq, out, term);
        if at != seq {
            self.violation(format!("append {eid:#x} at slot {at} resulted at {seq}"));
        }
        if let Some(c) = self.committed.get(&seq) {
            let with_it = c.eid == eid;
            if with_it != (out == Outcome::Committed) {
                self.violation(format!(
                    "append {eid:#x} at slot {seq} told {out:?} but the slot committed {:#x}",
                    c.eid
                ));
            }
        }
    }

    /// Conflict order: a leader serving the term it admitted `eid` in reports it committed
    /// only after every earlier overlapping entry it admitted in that term has a result.
    /// (Results a later term reports are the merge's; parallel entries carry no
    /// dependency lists to cascade a failure, see [`OooConfig::conflict_order`].)
    fn check_conflict_order(&mut self, id: NodeId, eid: u64, seq: Seq, out: Outcome, term: u64) {
        let Some((_, mine)) = self.open.remove(&(eid >> 32, seq)) else {
            return;
        };
        if !self.conflict_order() || out != Outcome::Committed || term != eid >> 32 {
            return;
        }
        self.bump("conflict_order_checks", 1);
        let early = self
            .open
            .range((eid >> 32, 0)..(eid >> 32, seq))
            .find(|(_, (_, b))| overlap(b, &mine))
            .map(|(&(_, s), &(e, _))| (s, e));
        if let Some((s, e)) = early {
            self.violation(format!(
                "node {id}: append {eid:#x} at slot {seq} reported committed before the overlapping append {e:#x} at slot {s} of the same term had a result (conflict order)"
            ));
        }
    }

    /// Right after an install of an image covering every slot below `base`: each key
    /// holds the value the serial application of the committed slots below `base` gives
    /// it, or one a committed slot from `base` on wrote (an image holds at least its base,
    /// and this node may have applied later slots out of order). A partial image that left
    /// out something the node lacked shows here, before later writes to the same blocks
    /// could hide it from the final check.
    pub(super) fn check_installed(&mut self, id: NodeId, base: Seq, part: bool) {
        let mut serial: HashMap<u64, u64> = HashMap::new();
        let mut later: HashMap<u64, Vec<u64>> = HashMap::new();
        for (&s, e) in &self.committed {
            for (k, v) in writes(e) {
                if s < base {
                    serial.insert(k, v);
                } else {
                    later.entry(k).or_default().push(v);
                }
            }
        }
        let Some(sm) = self.nodes[&id].sm.clone() else {
            return;
        };
        let v = sm.vol();
        let keys: BTreeSet<u64> = serial.keys().chain(v.state.keys()).copied().collect();
        let bad = keys.into_iter().find(|k| {
            let (have, want) = (v.state.get(k), serial.get(k));
            have != want && !have.is_some_and(|v| later.get(k).is_some_and(|l| l.contains(v)))
        });
        if let Some(k) = bad {
            let have = v.state.get(&k).copied();
            drop(v);
            let want = serial.get(&k).copied();
            self.violation(format!(
                "node {id} installed a{} image with base {base}: key {k} holds {have:x?}, the slots below the base give {want:x?} and no later slot wrote it",
                if part { " partial" } else { " whole" }
            ));
        }
    }

    /// The final checks after healing (module docs, 2 and 5).
    pub(super) fn final_checks(&mut self) {
        // Serial application of the committed log, in slot order.
        let end = self.committed.keys().next_back().map_or(0, |s| s + 1);
        let mut serial: HashMap<u64, u64> = HashMap::new();
        let mut problems = Vec::new();
        for s in 0..end {
            let Some(e) = self.committed.get(&s) else {
                problems.push(format!(
                    "slot {s} never committed below committed slot {}",
                    end - 1
                ));
                break;
            };
            if self.o.mode == Mode::Dependent {
                // Record by record: a transaction reads what the records before it in the
                // serial order (its own group's included) wrote.
                for (i, r) in records(e).iter().enumerate() {
                    let Some([rk, rv, wk, wv]) = decode_txn(&r.data) else {
                        continue;
                    };
                    let want = serial.get(&rk).copied().unwrap_or(0);
                    if rv != want {
                        problems.push(format!(
                            "committed transaction at slot {s} record {i} read key {rk} = {rv:#x}, the serial order gives {want:#x}"
                        ));
                    }
                    serial.insert(wk, wv);
                }
            } else {
                for (k, v) in writes(e) {
                    serial.insert(k, v);
                }
            }
        }
        // The final membership: the serving leader's (or the newest any live replica
        // holds). Nodes outside it (the spare, a removed voter, a node added by a joint
        // stage that a later leader abandoned) are not sent the log, so they are not held
        // to it.
        let live = || self.nodes.values().filter_map(|n| n.replica());
        let last: Option<Membership> = live()
            .find(|r| r.is_serving())
            .or_else(|| live().max_by_key(|r| r.membership().version))
            .map(|r| r.membership().clone());
        let mut heads = Vec::new();
        for (&id, n) in &self.nodes {
            let (Some(r), Some(sm)) = (n.replica(), n.sm.as_ref()) else {
                continue;
            };
            let state = sm.vol().state.clone();
            if last.as_ref().is_some_and(|m| !m.is_member(id)) {
                continue;
            }
            heads.push((id, r.applied_head()));
            if r.is_recovering_lost() {
                problems.push(format!(
                    "node {id} is still recovering entries it lost on disk after settling"
                ));
            }
            if r.applied_head() == end && state != serial {
                let diff = serial
                    .iter()
                    .find(|(k, v)| state.get(k) != Some(v))
                    .map(|(k, v)| format!("key {k}: serial {v:#x}, node {:?}", state.get(k)));
                problems.push(format!(
                    "node {id} applied everything but its state differs from serial application ({})",
                    diff.unwrap_or_else(|| "extra keys".into())
                ));
            }
            // The log as a reader gets it: the committed prefix from the base, every slot
            // the version observed committed, contiguous up to the committed head.
            match r.read_committed(r.base(), usize::MAX) {
                Ok(es) => {
                    let want = r.committed_head() - r.base().min(r.committed_head());
                    if es.len() as u64 != want {
                        problems.push(format!(
                            "node {id} reads {} committed slots from its base {}, its committed head is {}",
                            es.len(),
                            r.base(),
                            r.committed_head()
                        ));
                    }
                    for (e, s) in es.iter().zip(r.base()..) {
                        let same = self.committed.get(&e.seq).is_some_and(|c| {
                            c.eid == e.eid && c.is_null() == e.is_null() && c.data() == e.data()
                        });
                        if e.seq != s || !same {
                            problems.push(format!(
                                "node {id} reads slot {} ({:#x}) where slot {s} committed {:?}",
                                e.seq,
                                e.eid,
                                self.committed.get(&s).map(|c| c.eid)
                            ));
                            break;
                        }
                    }
                }
                Err(e) => problems.push(format!("node {id} cannot read from its base: {e}")),
            }
            if r.applied_head() != end {
                let holes = r.apply_holes();
                problems.push(format!(
                    "node {id} applied up to slot {} of {end} after healing (committed up to {}, waiting for {:?})",
                    r.applied_head(),
                    r.committed_head(),
                    &holes[..holes.len().min(5)],
                ));
            }
        }
        // Conflict order across leader changes (module docs, 6): the result check sees
        // only what one serving leader reports; a new leader's merge must not keep an
        // entry whose overlapping predecessor it drops. Checked along each block's chain
        // of writers within a term: every committed entry's nearest earlier writer
        // committed, so by induction every earlier one did.
        let mut last: HashMap<u64, (Seq, u64)> = HashMap::new();
        let mut this_term = None;
        for (&(term, seq), &(eid, ref blocks)) in &self.admitted {
            if this_term != Some(term) {
                this_term = Some(term);
                last.clear();
            }
            let committed = self.committed.get(&seq).is_some_and(|c| c.eid == eid);
            for b in blocks.iter().flat_map(|r| r.start..r.end) {
                if let Some((s, e)) = last.insert(b, (seq, eid)) {
                    let held = self.committed.get(&s).map(|c| c.eid);
                    if committed && held != Some(e) {
                        problems.push(format!(
                            "append {eid:#x} at slot {seq} committed, but the earlier append {e:#x} of its term at slot {s} writing block {b} did not (slot {s}: {held:x?}; conflict order)"
                        ));
                    }
                }
            }
        }
        let mut open = 0;
        for (&eid, &(node, inc, seq, out, unknown)) in &self.appends {
            let alive = self.nodes[&node].incarnation == inc && self.nodes[&node].driver.is_some();
            if out.is_none() && !unknown && alive {
                open += 1;
                if open <= 3 {
                    problems.push(format!(
                        "append {eid:#x} at slot {seq} on node {node} has no result after healing"
                    ));
                }
            }
            if let (Some(Outcome::Committed), None) = (out, self.committed.get(&seq)) {
                problems.push(format!(
                    "append {eid:#x} told Committed, slot {seq} not committed"
                ));
            }
        }
        if !problems.is_empty() {
            let roles: Vec<String> = self
                .nodes
                .iter()
                .map(|(id, n)| match n.replica() {
                    Some(r) => format!(
                        "{id}: {:?} term {} serving {} heads {}/{} {:?} {:?}",
                        r.role(),
                        r.term(),
                        r.is_serving(),
                        r.committed_head(),
                        r.applied_head(),
                        r.membership(),
                        r.stats()
                    ),
                    None => format!("{id}: down"),
                })
                .collect();
            problems.push(format!("at the end: {}", roles.join("; ")));
        }
        for p in problems {
            self.violation(p);
        }
        self.stats.insert("committed_slots", end);
    }
}
