//! Parallel mode (ParallelRaft, PolarFS VLDB 2018 section 5.2): block ranges, the
//! look-behind buffer, and which committed entries a replica may apply while earlier ones
//! are missing.
//!
//! The rule: two entries whose block ranges do not overlap may apply in any order; entries
//! that overlap apply in sequence order, so newer data is never overwritten by older. A
//! replica applies entry `e` once it is committed and every unapplied entry before it has
//! *known* ranges disjoint from `e`'s. The ranges of an entry the replica holds are in the
//! entry; the ranges of a missing one are known from the look-behind buffer of any later
//! entry within `span` of it. A hole longer than `span` has unknown ranges and blocks
//! everything after it until it is filled (the paper: "the maximum size of a log hole
//! permitted").

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use super::{OooError, Seq};

/// The blocks `start..end` (logical block addresses) written by an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockRange {
    /// First block.
    pub start: u64,
    /// One past the last block.
    pub end: u64,
}

impl BlockRange {
    /// `len` blocks from `start`; `None` when empty or past `u64::MAX`.
    pub fn new(start: u64, len: u64) -> Option<Self> {
        let end = start.checked_add(len)?;
        (len > 0).then_some(Self { start, end })
    }

    /// Whether the two ranges share a block.
    pub fn overlaps(&self, other: &BlockRange) -> bool {
        self.start < other.end && other.start < self.end
    }
}

/// Whether any range of `a` overlaps any range of `b`.
pub fn overlap(a: &[BlockRange], b: &[BlockRange]) -> bool {
    a.iter().any(|x| b.iter().any(|y| x.overlaps(y)))
}

fn check_ranges(seq: Seq, ranges: &[BlockRange]) -> Result<(), OooError> {
    if let Some(r) = ranges.iter().find(|r| r.start >= r.end) {
        return Err(OooError::Malformed {
            seq,
            detail: format!("empty block range {}..{}", r.start, r.end),
        });
    }
    Ok(())
}

/// The leader's side: numbers entries and stamps each with the look-behind buffer, the
/// ranges of the `span` entries before it (nearest first).
#[derive(Clone, Debug)]
pub struct LookBehind {
    span: usize,
    next: Seq,
    recent: VecDeque<Vec<BlockRange>>,
}

/// An entry as the parallel mode replicates it: its ranges and its look-behind buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stamped {
    /// Sequence number.
    pub seq: Seq,
    /// Blocks this entry writes.
    pub ranges: Vec<BlockRange>,
    /// `look_behind[i]` holds the ranges of entry `seq - 1 - i`.
    pub look_behind: Vec<Vec<BlockRange>>,
}

impl LookBehind {
    /// A leader whose next entry is `next`, carrying `span` entries back (the paper's N,
    /// default 2). A new leader starts with an empty buffer at its first new entry: the
    /// entries it merged are committed before it serves, so no follower needs a bridge
    /// over them.
    pub fn new(span: usize, next: Seq) -> Self {
        Self {
            span,
            next,
            recent: VecDeque::with_capacity(span + 1),
        }
    }

    /// Admits an entry writing `ranges`.
    pub fn stamp(&mut self, ranges: Vec<BlockRange>) -> Result<Stamped, OooError> {
        check_ranges(self.next, &ranges)?;
        let look_behind: Vec<_> = self.recent.iter().rev().cloned().collect();
        let seq = self.next;
        self.next += 1;
        if self.span > 0 {
            if self.recent.len() == self.span {
                self.recent.pop_front();
            }
            self.recent.push_back(ranges.clone());
        }
        Ok(Stamped {
            seq,
            ranges,
            look_behind,
        })
    }
}

#[derive(Clone, Debug)]
struct Slot {
    ranges: Vec<BlockRange>,
    committed: bool,
    applied: bool,
    /// Returned by [`ParallelApplier::take_ready`] (being applied).
    returned: bool,
}

/// A replica's apply side: which committed entries may apply now, with holes.
#[derive(Clone, Debug)]
pub struct ParallelApplier {
    span: usize,
    /// Every entry below is applied (or was merged away).
    head: Seq,
    /// Entries held, at or above `head`.
    held: BTreeMap<Seq, Slot>,
    /// Ranges of entries at or above `head` learned from look-behind buffers.
    known: BTreeMap<Seq, Vec<BlockRange>>,
    /// Entries the leader marked committed that are not held yet.
    committed_missing: BTreeSet<Seq>,
    /// Safety valve: entries held beyond `head + limit` are refused.
    limit: u64,
    /// Incremental readiness for [`ParallelApplier::take_ready`]: its cost follows what
    /// changed, not how many entries are held. A full walk per call made a follower whose
    /// apply fell behind spend more on each message the further behind it was, until it
    /// never caught up (measured: 46% of a lagging follower's CPU in the walk, 16,000
    /// entries behind, at 256 clients).
    ///
    /// The ranges of every unapplied held entry and every known hole, by slot.
    busy: Busy,
    /// Holes (slots in `head..=top held` not held) whose ranges are unknown.
    unknown: BTreeSet<Seq>,
    /// Entries to check at the next call: newly committed, or woken.
    candidates: BTreeSet<Seq>,
    /// Committed entries found waiting, by the slot they wait on (the first unknown hole
    /// before them, or an unapplied slot before them writing a block of theirs). Only a
    /// change of that slot — held, applied, skipped, its ranges learned — can release
    /// them, so only then are they checked again: a hot block's queue of conflicting
    /// writes costs one check per apply, not a walk of the queue.
    waiting: HashMap<Seq, Vec<Seq>>,
}

impl ParallelApplier {
    /// Everything below `head` applied; look-behind span `span`; at most `limit` entries
    /// tracked past the head (the replication window).
    pub fn new(span: usize, head: Seq, limit: u64) -> Self {
        Self {
            span,
            head,
            held: BTreeMap::new(),
            known: BTreeMap::new(),
            committed_missing: BTreeSet::new(),
            limit,
            busy: Busy::default(),
            unknown: BTreeSet::new(),
            candidates: BTreeSet::new(),
            waiting: HashMap::new(),
        }
    }

    /// The first entry not applied.
    pub fn head(&self) -> Seq {
        self.head
    }

    fn in_range(&self, seq: Seq) -> Result<(), OooError> {
        let limit = self.head.saturating_add(self.limit);
        if seq < self.head || seq >= limit {
            return Err(OooError::OutOfRange {
                seq,
                head: self.head,
                limit,
            });
        }
        Ok(())
    }

    /// A durable entry, in any order. A duplicate with the same contents is ignored; one
    /// with different contents is refused.
    pub fn insert(&mut self, e: &Stamped) -> Result<(), OooError> {
        if e.seq < self.head {
            return Ok(()); // applied long ago: a retransmission
        }
        self.in_range(e.seq)?;
        check_ranges(e.seq, &e.ranges)?;
        if e.look_behind.len() > self.span {
            return Err(OooError::Malformed {
                seq: e.seq,
                detail: format!(
                    "look-behind buffer of {} entries, span is {}",
                    e.look_behind.len(),
                    self.span
                ),
            });
        }
        if e.look_behind.len() as u64 > e.seq {
            return Err(OooError::Malformed {
                seq: e.seq,
                detail: "look-behind buffer reaches before entry 0".into(),
            });
        }
        for (i, r) in e.look_behind.iter().enumerate() {
            check_ranges(e.seq - 1 - i as u64, r)?;
        }
        if let Some(s) = self.held.get(&e.seq) {
            if s.ranges != e.ranges {
                return Err(OooError::Conflict { seq: e.seq });
            }
            return Ok(());
        }
        for (i, r) in e.look_behind.iter().enumerate() {
            let p = e.seq - 1 - i as u64;
            if p >= self.head && !self.held.contains_key(&p) {
                match self.known.insert(p, r.clone()) {
                    Some(old) if old == *r => continue,
                    Some(old) => self.busy.remove(p, &old),
                    None => {}
                }
                self.busy.add(p, r);
                self.unknown.remove(&p);
                self.wake(p);
            }
        }
        if let Some(old) = self.known.remove(&e.seq) {
            self.busy.remove(e.seq, &old);
        }
        let committed = self.committed_missing.remove(&e.seq);
        self.busy.add(e.seq, &e.ranges);
        self.hold(e.seq);
        self.held.insert(
            e.seq,
            Slot {
                ranges: e.ranges.clone(),
                committed,
                applied: false,
                returned: false,
            },
        );
        if committed {
            self.candidates.insert(e.seq);
        }
        // A filled hole may release entries after it.
        self.wake(e.seq);
        Ok(())
    }

    /// Bookkeeping of the holes when `seq` becomes held: it is no longer one, and the
    /// slots between the previous top and it are.
    fn hold(&mut self, seq: Seq) {
        self.unknown.remove(&seq);
        let from = match self.held.keys().next_back() {
            Some(&top) => top + 1,
            None => self.head,
        };
        for g in from.max(self.head)..seq {
            if !self.known.contains_key(&g) {
                self.unknown.insert(g);
            }
        }
    }

    /// `seq` changed: what waited on it is checked again.
    fn wake(&mut self, seq: Seq) {
        if let Some(w) = self.waiting.remove(&seq) {
            self.candidates.extend(w);
        }
    }

    /// What a committed, held entry `p` writing `ranges` waits on, if anything: the
    /// nearest unknown hole before it, else the nearest slot before it writing one of its
    /// blocks. The nearest, so a queue of writes to one hot block waits in a chain (each
    /// apply wakes one entry) rather than all on its first (each apply waking all).
    fn blocker(&self, p: Seq, ranges: &[BlockRange]) -> Option<Seq> {
        if let Some(&h) = self.unknown.range(..p).next_back() {
            return Some(h);
        }
        self.busy.nearest_before(ranges, p)
    }

    /// The leader says `seq` is committed (from its commit window).
    pub fn commit(&mut self, seq: Seq) {
        if seq < self.head {
            return;
        }
        match self.held.get_mut(&seq) {
            Some(s) => {
                if !s.committed {
                    s.committed = true;
                    self.candidates.insert(seq);
                }
            }
            None => {
                self.committed_missing.insert(seq);
            }
        }
    }

    /// Committed entries that may apply now, ascending: every unapplied entry before each
    /// has known ranges disjoint from its own.
    pub fn ready(&self) -> Vec<Seq> {
        // One ascending walk, keeping the union of the ranges of the unapplied entries
        // passed so far: O(n log n) however long the tail behind a hole is.
        let mut out = Vec::new();
        let mut busy = Blocks::default();
        let Some(&top) = self.held.keys().next_back() else {
            return out;
        };
        for p in self.head..=top {
            match self.held.get(&p) {
                Some(s) if s.applied => {}
                Some(s) => {
                    if s.committed && !busy.overlaps(&s.ranges) {
                        out.push(p);
                    }
                    busy.add(&s.ranges);
                }
                None => match self.known.get(&p) {
                    Some(r) => busy.add(r),
                    // A hole of unknown ranges blocks everything after it.
                    None => break,
                },
            }
        }
        out
    }

    /// Committed entries that became ready since the last call, ascending: the same rule
    /// as [`ParallelApplier::ready`], each entry returned once, at a cost that follows
    /// what changed since the last call rather than the number of entries held.
    pub fn take_ready(&mut self) -> Vec<Seq> {
        let mut out = Vec::new();
        for p in std::mem::take(&mut self.candidates) {
            let Some(s) = self.held.get(&p) else { continue };
            if s.applied || s.returned || !s.committed {
                continue;
            }
            if let Some(b) = self.blocker(p, &s.ranges) {
                self.waiting.entry(b).or_default().push(p);
                continue;
            }
            self.held.get_mut(&p).expect("held").returned = true;
            out.push(p);
        }
        out
    }

    /// Records that `seq` (one of [`ParallelApplier::ready`]) was applied.
    pub fn applied(&mut self, seq: Seq) -> Result<(), OooError> {
        match self.held.get_mut(&seq) {
            Some(s) if s.committed && !s.applied => {
                s.applied = true;
                // `held` and `busy` are disjoint fields: no need to move the ranges out.
                self.busy.remove(seq, &s.ranges);
            }
            Some(s) if s.committed => {}
            _ => return Err(OooError::not_applicable(seq)),
        }
        self.wake(seq);
        self.advance();
        Ok(())
    }

    /// The merge decided no entry exists at `seq` (a slot nobody held): it applies as
    /// nothing, writing no blocks.
    pub fn skip(&mut self, seq: Seq) -> Result<(), OooError> {
        if seq < self.head {
            return Ok(());
        }
        self.in_range(seq)?;
        if let Some(old) = self.held.get(&seq).filter(|s| !s.applied) {
            self.busy.remove(seq, &old.ranges);
        }
        if let Some(old) = self.known.remove(&seq) {
            self.busy.remove(seq, &old);
        }
        self.hold(seq);
        self.held.insert(
            seq,
            Slot {
                ranges: Vec::new(),
                committed: true,
                applied: true,
                returned: true,
            },
        );
        self.committed_missing.remove(&seq);
        self.candidates.remove(&seq);
        self.wake(seq);
        self.advance();
        Ok(())
    }

    /// Entries at or above the head that are neither held nor skipped: what catch-up must
    /// fetch (ascending, up to the highest entry known).
    pub fn holes(&self) -> Vec<Seq> {
        let top = self
            .held
            .keys()
            .next_back()
            .copied()
            .max(self.committed_missing.iter().next_back().copied());
        super::holes(self.head, top, &self.held)
    }

    fn advance(&mut self) {
        while self.held.get(&self.head).is_some_and(|s| s.applied) {
            self.held.remove(&self.head);
            if let Some(old) = self.known.remove(&self.head) {
                self.busy.remove(self.head, &old);
            }
            self.candidates.remove(&self.head);
            self.head += 1;
        }
    }
}

/// The block ranges of slots, for "does any slot before `p` write a block of these
/// ranges": keyed by (start, slot), with the longest range seen bounding how far back a
/// lookup starts. Ranges are small in practice (a write's blocks), so a lookup touches
/// the ranges near its own.
#[derive(Clone, Debug, Default)]
struct Busy {
    by_start: BTreeMap<(u64, Seq), u64>,
    /// Longest range added since the index was last empty.
    longest: u64,
}

impl Busy {
    fn add(&mut self, seq: Seq, ranges: &[BlockRange]) {
        for r in ranges {
            self.longest = self.longest.max(r.end - r.start);
            self.by_start.insert((r.start, seq), r.end);
        }
    }

    fn remove(&mut self, seq: Seq, ranges: &[BlockRange]) {
        for r in ranges {
            self.by_start.remove(&(r.start, seq));
        }
        if self.by_start.is_empty() {
            self.longest = 0;
        }
    }

    /// The last slot before `p` writing a block of `ranges`, if any.
    fn nearest_before(&self, ranges: &[BlockRange], p: Seq) -> Option<Seq> {
        let mut best: Option<Seq> = None;
        for r in ranges {
            // A range overlapping r starts before r.end, and at r.start + 1 - longest or
            // later (it ends after r.start). Per start, the slots come in ascending
            // order: look at the last ones before `p` only.
            let mut next = (r.start + 1).saturating_sub(self.longest);
            while let Some((&(start, _), _)) = self.by_start.range((next, 0)..(r.end, 0)).next() {
                for (&(_, s), &end) in self.by_start.range((start, 0)..(start, p)).rev() {
                    if best.is_some_and(|b| s <= b) {
                        break;
                    }
                    if end > r.start {
                        best = Some(s);
                        break;
                    }
                }
                match start.checked_add(1) {
                    Some(n) => next = n,
                    None => break,
                }
            }
        }
        best
    }
}

/// A union of block ranges (disjoint, merged), for [`ParallelApplier::ready`].
#[derive(Default)]
struct Blocks(BTreeMap<u64, u64>);

impl Blocks {
    fn overlaps(&self, ranges: &[BlockRange]) -> bool {
        ranges.iter().any(|r| {
            self.0
                .range(..r.end)
                .next_back()
                .is_some_and(|(_, &end)| end > r.start)
        })
    }

    fn add(&mut self, ranges: &[BlockRange]) {
        for r in ranges {
            let (mut start, mut end) = (r.start, r.end);
            // Absorb every interval touching [start, end).
            let touching: Vec<(u64, u64)> = self
                .0
                .range(..=end)
                .rev()
                .take_while(|(_, &e)| e >= start)
                .map(|(&s, &e)| (s, e))
                .collect();
            for (s, e) in touching {
                self.0.remove(&s);
                start = start.min(s);
                end = end.max(e);
            }
            self.0.insert(start, end);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn r(start: u64, len: u64) -> BlockRange {
        BlockRange::new(start, len).expect("range")
    }

    #[test]
    fn look_behind_carries_the_previous_span_entries() {
        let mut lb = LookBehind::new(2, 0);
        let a = lb.stamp(vec![r(0, 1)]).unwrap();
        let b = lb.stamp(vec![r(1, 1)]).unwrap();
        let c = lb.stamp(vec![r(2, 1)]).unwrap();
        assert_eq!(a.look_behind, Vec::<Vec<BlockRange>>::new());
        assert_eq!(b.look_behind, vec![vec![r(0, 1)]]);
        assert_eq!(c.look_behind, vec![vec![r(1, 1)], vec![r(0, 1)]]);
        assert_eq!(c.seq, 2);
        assert!(lb.stamp(vec![BlockRange { start: 4, end: 4 }]).is_err());
    }

    #[test]
    fn a_disjoint_entry_applies_over_a_hole_and_a_conflicting_one_waits() {
        let mut lb = LookBehind::new(2, 0);
        let e0 = lb.stamp(vec![r(0, 8)]).unwrap();
        let e1 = lb.stamp(vec![r(100, 8)]).unwrap(); // disjoint from e0
        let e2 = lb.stamp(vec![r(4, 2)]).unwrap(); // overlaps e0
        let mut ap = ParallelApplier::new(2, 0, 64);
        ap.insert(&e1).unwrap();
        ap.insert(&e2).unwrap();
        for s in 0..3 {
            ap.commit(s);
        }
        // e0 is a hole; its ranges are known from e1's and e2's look-behind buffers.
        assert_eq!(ap.ready(), vec![1]);
        ap.applied(1).unwrap();
        assert_eq!(ap.ready(), Vec::<Seq>::new(), "e2 overlaps the missing e0");
        assert_eq!(ap.holes(), vec![0]);
        ap.insert(&e0).unwrap();
        assert_eq!(ap.ready(), vec![0]);
        ap.applied(0).unwrap();
        assert_eq!(ap.ready(), vec![2]);
        ap.applied(2).unwrap();
        assert_eq!(ap.head(), 3);
    }

    #[test]
    fn a_hole_longer_than_the_span_blocks_until_filled() {
        let mut lb = LookBehind::new(2, 0);
        let es: Vec<_> = (0..4)
            .map(|i| lb.stamp(vec![r(i * 10, 1)]).unwrap())
            .collect();
        let mut ap = ParallelApplier::new(2, 0, 64);
        ap.insert(&es[3]).unwrap();
        for s in 0..4 {
            ap.commit(s);
        }
        // Entry 0 is three back from entry 3: nobody told us its ranges.
        assert!(ap.ready().is_empty());
        ap.insert(&es[1]).unwrap(); // its buffer covers entry 0
        assert_eq!(ap.ready(), vec![1, 3]);
    }

    #[test]
    fn bad_inputs_are_refused_and_change_nothing() {
        let mut lb = LookBehind::new(1, 0);
        let e0 = lb.stamp(vec![r(0, 1)]).unwrap();
        let e1 = lb.stamp(vec![r(1, 1)]).unwrap();
        let mut ap = ParallelApplier::new(1, 0, 4);
        ap.insert(&e0).unwrap();
        let mut other = e0.clone();
        other.ranges = vec![r(7, 1)];
        assert_eq!(ap.insert(&other), Err(OooError::Conflict { seq: 0 }));
        let mut long = e1.clone();
        long.look_behind.push(vec![r(3, 1)]);
        assert!(matches!(ap.insert(&long), Err(OooError::Malformed { .. })));
        let far = Stamped {
            seq: 9,
            ranges: vec![r(0, 1)],
            look_behind: vec![],
        };
        assert!(matches!(ap.insert(&far), Err(OooError::OutOfRange { .. })));
        assert!(ap.applied(0).is_err(), "not committed yet");
        assert_eq!(ap.holes(), Vec::<Seq>::new());
    }

    proptest! {
        /// `take_ready` against the full walk of `ready`, the rule's reference: after
        /// any sequence of arrivals (with holes longer and shorter than the span),
        /// commits, skips and applies, the entries `take_ready` has returned and that are
        /// not applied yet are exactly those `ready` lists; and everything applies.
        #[test]
        fn take_ready_returns_exactly_what_ready_lists(
            writes in proptest::collection::vec((0u64..24, 1u64..4, 1usize..3), 1..40),
            ops in proptest::collection::vec((0u8..6, any::<u16>()), 0..200),
            span in 1usize..4,
        ) {
            let mut lb = LookBehind::new(span, 0);
            let entries: Vec<Stamped> = writes
                .iter()
                .map(|&(s, l, k)| {
                    let rs = (0..k as u64).map(|i| r(s + 30 * i, l)).collect();
                    lb.stamp(rs).unwrap()
                })
                .collect();
            let n = entries.len();
            let mut ap = ParallelApplier::new(span, 0, 64);
            let mut out: BTreeSet<Seq> = BTreeSet::new();
            let check = |ap: &mut ParallelApplier, out: &mut BTreeSet<Seq>| {
                for s in ap.take_ready() {
                    assert!(out.insert(s), "slot {s} returned twice");
                }
                let want: BTreeSet<Seq> = ap.ready().into_iter().collect();
                assert_eq!(*out, want);
            };
            for (op, x) in ops {
                let i = x as usize % n;
                match op {
                    0 | 1 => { let _ = ap.insert(&entries[i]); }
                    2 => ap.commit(i as Seq),
                    3 => {
                        if let Some(&s) = out.iter().nth(x as usize % out.len().max(1)) {
                            out.remove(&s);
                            ap.applied(s).unwrap();
                        }
                    }
                    4 => check(&mut ap, &mut out),
                    // A merge decides a slot holds nothing (never one being applied).
                    _ => if !out.contains(&(i as Seq)) { ap.skip(i as Seq).unwrap() },
                }
            }
            check(&mut ap, &mut out);
            for e in &entries {
                let _ = ap.insert(e);
                ap.commit(e.seq);
            }
            loop {
                check(&mut ap, &mut out);
                let Some(s) = out.pop_first() else { break };
                ap.applied(s).unwrap();
            }
            prop_assert_eq!(ap.head(), n as u64);
        }

        /// Whatever order entries arrive, commit and apply in, as long as every applied
        /// entry was `ready`, the blocks end up exactly as a serial application in
        /// sequence order leaves them; and every entry applies once all have arrived.
        #[test]
        fn any_allowed_order_equals_serial_order(
            writes in proptest::collection::vec((0u64..24, 1u64..4), 1..40),
            arrival in proptest::collection::vec(any::<u16>(), 40),
            commits in proptest::collection::vec(any::<u16>(), 40),
            picks in proptest::collection::vec(any::<u16>(), 200),
            span in 1usize..4,
        ) {
            let mut lb = LookBehind::new(span, 0);
            let entries: Vec<Stamped> = writes
                .iter()
                .map(|&(s, l)| lb.stamp(vec![r(s, l)]).unwrap())
                .collect();
            let n = entries.len();
            // Serial: each block holds the last writer in sequence order.
            let mut serial = std::collections::BTreeMap::new();
            for e in &entries {
                for b in e.ranges[0].start..e.ranges[0].end {
                    serial.insert(b, e.seq);
                }
            }
            let mut order: Vec<usize> = (0..n).collect();
            order.sort_by_key(|&i| arrival[i]);
            let mut corder: Vec<usize> = (0..n).collect();
            corder.sort_by_key(|&i| commits[i]);
            let mut ap = ParallelApplier::new(span, 0, 64);
            let mut state = std::collections::BTreeMap::new();
            let mut pick = picks.iter().cycle();
            let step = |ap: &mut ParallelApplier, state: &mut BTreeMap<u64, Seq>, p: u16| {
                let ready = ap.ready();
                if ready.is_empty() {
                    return false;
                }
                let s = ready[p as usize % ready.len()];
                let e = &entries[s as usize];
                for b in e.ranges[0].start..e.ranges[0].end {
                    state.insert(b, s);
                }
                ap.applied(s).unwrap();
                true
            };
            for k in 0..n {
                ap.insert(&entries[order[k]]).unwrap();
                ap.commit(entries[corder[k]].seq);
                let _ = step(&mut ap, &mut state, *pick.next().unwrap());
            }
            while step(&mut ap, &mut state, *pick.next().unwrap()) {}
            prop_assert_eq!(ap.head(), n as u64, "everything applies once all arrived");
            prop_assert_eq!(state, serial);
        }
    }
}
