//! Dependent mode (DP-Raft, DASFAA 2020 sections 3–4): read and write sets, the RAW and
//! WAW predecessors of each entry, the leader's commit rule and a replica's apply rule.
//!
//! Section 3 of the paper: only two dependencies order anything. An entry that **reads**
//! what an earlier entry wrote (RAW) must not commit before it — if the earlier one then
//! failed, the later one would have read data that never existed. An entry that **writes**
//! what an earlier entry wrote (WAW) must not apply before it — the older value would
//! overwrite the newer. Everything else commits and applies in any order.
//!
//! What each entry records, and why this differs slightly from the paper:
//! - `raw`: the last writer of each key it reads, if that writer was not yet committed
//!   when it was admitted. The last writer is the one whose value was read; if it fails,
//!   this entry must fail too (the merge cascades that, see [`super::merge`]).
//! - `waw`: **every** writer of a key it writes that is inside the window (at or above
//!   `base`, the leader's window head when it was admitted), not only the last one. The
//!   paper's "last writer" relies on a chain through that writer; if that writer is later
//!   merged away (never committed), the chain breaks and an older writer could apply
//!   after this entry. Listing all in-window writers keeps the order without the chain.
//! - `base`: writers below it were committed at admission and are not listed. A replica
//!   may still not have applied them, so for predecessors below `base` it compares write
//!   sets itself, and a missing one blocks until catch-up brings it (the paper: missing
//!   entries before the window head are fetched from the leader). The paper's window
//!   starts at the first uncommitted entry; ours starts lower while a live follower is
//!   missing a committed entry ([`DepLeader::set_floor`], at most [`WAW_TRAIL`] below the
//!   head), so that follower finds the writers it lacks in the WAW lists and applies every
//!   later entry that does not write what the missing one wrote, instead of blocking
//!   everything admitted after the missing entry committed (an entry overtaken on a slow
//!   connection commits with the other follower and would otherwise stall this one's
//!   whole apply, as in the ordered mode).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::Hash;

use super::{CommitWindow, OooError, Seq};
use crate::format::meta::NodeId;
use crate::quorum::Quorum;

/// How far below its first uncommitted entry a leader's window may start for a follower
/// that is missing committed entries ([`DepLeader::set_floor`]): at most this many
/// committed entries are still listed as WAW predecessors. A follower further behind
/// compares write sets itself (the `base` rule), as it is catching up anyway. Bounded
/// because a hot key's writers all go into each later writer's WAW list.
pub const WAW_TRAIL: u64 = 128;

/// The predecessors an entry must wait for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Deps {
    /// Commit only after these committed (ascending).
    pub raw: Vec<Seq>,
    /// Apply only after these applied (ascending).
    pub waw: Vec<Seq>,
}

/// An entry as the dependent mode replicates it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DepEntry<K> {
    /// Sequence number.
    pub seq: Seq,
    /// The leader's window head when it admitted the entry.
    pub base: Seq,
    /// Its predecessors.
    pub deps: Deps,
    /// The keys it writes (a replica needs them to apply, and to order itself after
    /// writers below `base`).
    pub write_set: Vec<K>,
}

#[derive(Clone, Debug)]
struct Pending {
    acks: BTreeSet<NodeId>,
    raw: Vec<Seq>,
    /// Had a majority while a RAW predecessor was still uncommitted (counted once).
    held: bool,
}

/// The leader's side: admits entries (finding their predecessors) and commits them by
/// Algorithm 1 — a majority has the entry and every RAW predecessor is committed.
#[derive(Clone, Debug)]
pub struct DepLeader<K> {
    quorum: Quorum,
    window: u64,
    next: Seq,
    commits: CommitWindow,
    /// Admitted, not committed.
    pending: BTreeMap<Seq, Pending>,
    /// For each uncommitted entry, the pending entries that list it as a RAW predecessor:
    /// the only entries its commit can make committable. An acknowledgement then costs
    /// the entries it may release, not a walk of everything in flight (which made a full
    /// window quadratic: 16% of the leader's CPU at 256 clients).
    waiters: HashMap<Seq, Vec<Seq>>,
    /// Writers of each key at or above the window base (ascending).
    writers: HashMap<K, Vec<Seq>>,
    /// The lowest window base followers asked for ([`DepLeader::set_floor`]); never falls.
    floor: Seq,
    /// How far below the head the base may go (0: always the head).
    trail: u64,
    /// Test-only (`broken` build): list only uncommitted WAW writers even below the head.
    #[cfg(feature = "broken")]
    broken_trail: bool,
    /// The last entry admitted as conflicting with everything
    /// ([`DepLeader::admit_conflicting`] without keys): every later entry commits after it.
    barrier: Option<Seq>,
    /// Entries that had a majority before their RAW predecessors committed.
    held: u64,
}

impl<K: Clone + Eq + Hash> DepLeader<K> {
    /// A leader whose next entry is `next` (everything before committed), committing with
    /// `quorum` acknowledgements, at most `window` entries in flight.
    pub fn new(quorum: Quorum, window: u64, next: Seq) -> Self {
        Self {
            quorum,
            window,
            next,
            commits: CommitWindow::new(next),
            pending: BTreeMap::new(),
            waiters: HashMap::new(),
            writers: HashMap::new(),
            floor: next,
            trail: 0,
            #[cfg(feature = "broken")]
            broken_trail: false,
            barrier: None,
            held: 0,
        }
    }

    /// As [`DepLeader::new`], with a window base that may trail the head by up to `trail`
    /// entries for followers missing committed ones ([`DepLeader::set_floor`]).
    pub fn with_trail(quorum: Quorum, window: u64, next: Seq, trail: u64) -> Self {
        Self {
            trail,
            ..Self::new(quorum, window, next)
        }
    }

    /// The first slot some live follower may still be missing (its first uncommitted
    /// slot, as it last said; `Seq::MAX` when none lags). Entries admitted from now on
    /// list their WAW predecessors from there (at most `trail` below the head), committed
    /// ones included, so that follower can apply past its holes wherever the keys differ.
    /// The base never falls: the writers below it are no longer indexed.
    pub fn set_floor(&mut self, first_missing: Seq) {
        self.floor = self.floor.max(first_missing.min(self.commits.head()));
    }

    /// Test-only (`broken` build): entries keep the trailing base but list only
    /// uncommitted WAW writers, so a follower missing a committed writer applies a later
    /// writer of its keys first. The simulator must catch it.
    #[cfg(feature = "broken")]
    pub fn break_trail(&mut self) {
        self.broken_trail = true;
    }

    /// The window base for the next entry: WAW predecessors from here on are listed.
    /// Every slot below it is committed.
    pub fn base(&self) -> Seq {
        let head = self.commits.head();
        if self.trail == 0 {
            return head;
        }
        self.floor.max(head.saturating_sub(self.trail)).min(head)
    }

    /// How many entries this leader held back by the commit rule: each reached a
    /// majority while one of its RAW predecessors was uncommitted, and so committed
    /// later than a majority alone would have let it (counted once per entry). Measures
    /// what the rule costs, as opposed to how many entries merely have predecessors.
    pub fn held(&self) -> u64 {
        self.held
    }

    /// The commit state to piggyback on the next append or heartbeat.
    pub fn commit_window(&self) -> &CommitWindow {
        &self.commits
    }

    /// Admits a transaction's entry: assigns its sequence number and records its
    /// predecessors. Refused when `window` entries are in flight.
    pub fn admit(&mut self, read_set: &[K], write_set: &[K]) -> Result<DepEntry<K>, OooError> {
        let head = self.commits.head();
        if self.next - head >= self.window {
            return Err(OooError::WindowFull {
                head,
                next: self.next,
                window: self.window,
            });
        }
        let seq = self.next;
        let mut raw = BTreeSet::new();
        if let Some(b) = self
            .barrier
            .filter(|&b| b >= head && !self.commits.is_committed(b))
        {
            raw.insert(b);
        }
        for k in read_set {
            if let Some(&w) = self.writers.get(k).and_then(|v| v.last()) {
                if w >= head && !self.commits.is_committed(w) {
                    raw.insert(w);
                }
            }
        }
        let base = self.base();
        #[cfg(feature = "broken")]
        let base_waw = if self.broken_trail { head } else { base };
        #[cfg(not(feature = "broken"))]
        let base_waw = base;
        let mut waw = BTreeSet::new();
        for k in write_set {
            if let Some(v) = self.writers.get(k) {
                waw.extend(v.iter().copied().filter(|&w| w >= base_waw));
            }
        }
        for k in write_set {
            let v = self.writers.entry(k.clone()).or_default();
            if v.last() != Some(&seq) {
                v.push(seq);
            }
        }
        self.next += 1;
        let raw: Vec<Seq> = raw.into_iter().collect();
        for &r in &raw {
            self.waiters.entry(r).or_default().push(seq);
        }
        self.pending.insert(
            seq,
            Pending {
                acks: BTreeSet::new(),
                raw: raw.clone(),
                held: false,
            },
        );
        Ok(DepEntry {
            seq,
            base,
            deps: Deps {
                raw,
                waw: waw.into_iter().collect(),
            },
            write_set: write_set.to_vec(),
        })
    }

    /// Whether an entry reading `read_set` would have to commit after an entry not yet
    /// committed: the last writer of a key it reads, or the last entry admitted as
    /// conflicting with everything. A driver packing several writers' records into one
    /// entry asks per record, so that records that would wait do not hold back the
    /// others' commit (see `chorus_runtime::ooo`).
    pub fn would_wait(&self, read_set: &[K]) -> bool {
        let head = self.commits.head();
        let pending = |w: Seq| w >= head && !self.commits.is_committed(w);
        self.barrier.is_some_and(pending)
            || read_set.iter().any(|k| {
                self.writers
                    .get(k)
                    .and_then(|v| v.last())
                    .is_some_and(|&w| pending(w))
            })
    }

    /// Whether an entry writing `write_set`, admitted now, would list a WAW predecessor
    /// at or above `since`: a writer of one of its keys that a replica which has applied
    /// everything below `since` may still have to apply first. A driver packing several
    /// writers' records into one entry asks per record (with `since` the lowest apply
    /// head among the live replicas), so that records a follower could apply at once are
    /// not held back by a group whose union writes a hot key another copy is still
    /// carrying (DP-Raft applies per transaction; a group entry applies as one).
    pub fn would_order(&self, write_set: &[K], since: Seq) -> bool {
        let from = self.base().max(since);
        write_set.iter().any(|k| {
            self.writers
                .get(k)
                .and_then(|v| v.last())
                .is_some_and(|&w| w >= from)
        })
    }

    /// Admits a parallel-mode entry under conflict order (the DP-Raft paper's adaptation
    /// of ParallelRaft, section 5: the read and write keys of a transaction stand for its
    /// blocks, and an entry commits only once every earlier entry overlapping it has):
    /// `keys` are the blocks it touches, each read and written, so every uncommitted
    /// earlier writer of one of them is a RAW predecessor (through the chain of last
    /// writers, every earlier overlapping entry commits first). `None` (too many blocks
    /// to list) conflicts with everything: it commits after every entry in flight, and
    /// every later entry after it. The RAW list of the result names the uncommitted
    /// entries it waits for: the parallel entry carries it, so that a merge can cascade a
    /// NULL to it (`Body::Parallel`'s `after`); the WAW list and write set are unused.
    pub fn admit_conflicting(&mut self, keys: Option<&[K]>) -> Result<DepEntry<K>, OooError> {
        match keys {
            Some(k) => self.admit(k, k),
            None => {
                let seq = self.next;
                let mut e = self.admit(&[], &[])?;
                // Admitted: `pending` holds every uncommitted entry, this one last.
                let raw: Vec<Seq> = self.pending.range(..seq).map(|(&s, _)| s).collect();
                for &r in raw.iter().filter(|r| !e.deps.raw.contains(r)) {
                    self.waiters.entry(r).or_default().push(seq);
                }
                if let Some(p) = self.pending.get_mut(&seq) {
                    p.raw = raw.clone();
                }
                e.deps.raw = raw;
                self.barrier = Some(seq);
                Ok(e)
            }
        }
    }

    /// Forgets every acknowledgement `node` gave an entry not committed yet: it lost them
    /// on disk (a replica recovering lost entries, `Hard::after_loss`), so they are no
    /// longer copies a commit may count. Nothing is committed by this.
    pub fn forget(&mut self, node: NodeId) {
        for p in self.pending.values_mut() {
            p.acks.remove(&node);
        }
    }

    /// `node` (the leader included) has `seq` durable. Returns the entries this commits,
    /// ascending: possibly `seq` and entries that were waiting for it as a RAW
    /// predecessor.
    pub fn ack(&mut self, seq: Seq, node: NodeId) -> Vec<Seq> {
        match self.pending.get_mut(&seq) {
            Some(p) => {
                p.acks.insert(node);
            }
            None => return Vec::new(), // committed already, or never admitted
        }
        // An entry becomes committable when its own acknowledgements reach a majority
        // with its RAW predecessors committed, or when its last uncommitted RAW
        // predecessor commits while it has a majority: follow those edges only.
        let mut out = Vec::new();
        let mut work = vec![seq];
        while let Some(s) = work.pop() {
            let Some(p) = self.pending.get_mut(&s) else {
                continue;
            };
            if !self.quorum.reached_by(&p.acks) {
                continue;
            }
            if p.raw.iter().all(|&r| self.commits.is_committed(r)) {
                self.pending.remove(&s);
                self.commits.commit(s);
                out.push(s);
                if let Some(w) = self.waiters.remove(&s) {
                    work.extend(w);
                }
            } else if !p.held {
                p.held = true;
                self.held += 1;
            }
        }
        out.sort_unstable();
        self.prune();
        out
    }

    /// Whether `seq` is committed.
    pub fn is_committed(&self, seq: Seq) -> bool {
        self.commits.is_committed(seq)
    }

    /// Changes who must acknowledge (a membership change moved to its next stage).
    /// Returns the entries the new quorum commits at once, ascending: a smaller set of
    /// voters may already hold pending entries.
    pub fn set_quorum(&mut self, quorum: Quorum) -> Vec<Seq> {
        self.quorum = quorum;
        let mut out = Vec::new();
        loop {
            let ready: Vec<Seq> = self
                .pending
                .iter()
                .filter(|(_, p)| {
                    self.quorum.reached_by(&p.acks)
                        && p.raw.iter().all(|&r| self.commits.is_committed(r))
                })
                .map(|(&s, _)| s)
                .collect();
            if ready.is_empty() {
                break;
            }
            for s in ready {
                self.pending.remove(&s);
                self.waiters.remove(&s);
                self.commits.commit(s);
                out.push(s);
            }
        }
        out.sort_unstable();
        self.prune();
        out
    }

    fn prune(&mut self) {
        let base = self.base();
        if self.writers.len() as u64 > 4 * (self.window + self.trail) + 64 {
            self.writers.retain(|_, v| {
                v.retain(|&w| w >= base);
                !v.is_empty()
            });
        }
    }
}

#[derive(Clone, Debug)]
struct Held<K> {
    entry: DepEntry<K>,
    applied: bool,
    /// Returned by [`DepApplier::take_ready`] (being applied).
    returned: bool,
}

/// A replica's apply side: an entry applies once committed and every WAW predecessor
/// applied (Algorithm 1, ParallelApply), with holes.
#[derive(Clone, Debug)]
pub struct DepApplier<K> {
    head: Seq,
    commits: CommitWindow,
    held: BTreeMap<Seq, Held<K>>,
    limit: u64,
    /// Incremental readiness for [`DepApplier::take_ready`] (why: see
    /// [`super::parallel::ParallelApplier::take_ready`]). The rule of
    /// [`DepApplier::ready`] reads two prefix facts — the first missing entry and, per
    /// key, the first unapplied writer — and both are indexed here, so one entry is
    /// checked without walking the entries before it.
    ///
    /// Unapplied held writers of each key.
    writers: HashMap<K, BTreeSet<Seq>>,
    /// Slots in `head..=top held` that are not held.
    gaps: BTreeSet<Seq>,
    /// Entries to check at the next call: newly committed, or woken.
    candidates: BTreeSet<Seq>,
    /// Committed entries found waiting, by the slot they wait on (an unapplied WAW
    /// predecessor, a missing slot below their base, or an unapplied writer of one of
    /// their keys below their base); checked again only when that slot is held, applied
    /// or skipped.
    waiting: HashMap<Seq, Vec<Seq>>,
}

impl<K: Clone + Eq + Hash> DepApplier<K> {
    /// Everything below `head` applied; at most `limit` entries tracked past the head.
    pub fn new(head: Seq, limit: u64) -> Self {
        Self {
            head,
            commits: CommitWindow::new(head),
            held: BTreeMap::new(),
            limit,
            writers: HashMap::new(),
            gaps: BTreeSet::new(),
            candidates: BTreeSet::new(),
            waiting: HashMap::new(),
        }
    }

    /// The first entry not applied.
    pub fn head(&self) -> Seq {
        self.head
    }

    /// A durable entry, in any order. Duplicates with the same contents are ignored; with
    /// different contents, refused.
    pub fn insert(&mut self, e: DepEntry<K>) -> Result<(), OooError> {
        if e.seq < self.head {
            return Ok(());
        }
        let limit = self.head.saturating_add(self.limit);
        if e.seq >= limit {
            return Err(OooError::OutOfRange {
                seq: e.seq,
                head: self.head,
                limit,
            });
        }
        let bad = |detail: &str| OooError::Malformed {
            seq: e.seq,
            detail: detail.to_string(),
        };
        if e.base > e.seq {
            return Err(bad("window base after the entry"));
        }
        for d in [&e.deps.raw, &e.deps.waw] {
            if d.windows(2).any(|w| w[0] >= w[1]) {
                return Err(bad("dependencies not strictly ascending"));
            }
            if d.iter().any(|&p| p >= e.seq || p < e.base) {
                return Err(bad("a dependency outside base..seq"));
            }
        }
        if let Some(h) = self.held.get(&e.seq) {
            if h.entry != e {
                return Err(OooError::Conflict { seq: e.seq });
            }
            return Ok(());
        }
        let seq = e.seq;
        for k in &e.write_set {
            self.writers.entry(k.clone()).or_default().insert(seq);
        }
        self.hold(seq);
        self.held.insert(
            seq,
            Held {
                entry: e,
                applied: false,
                returned: false,
            },
        );
        if self.commits.is_committed(seq) {
            self.candidates.insert(seq);
        }
        // A filled hole may release entries after it.
        self.wake(seq);
        Ok(())
    }

    /// `seq` changed: what waited on it is checked again.
    fn wake(&mut self, seq: Seq) {
        if let Some(w) = self.waiting.remove(&seq) {
            self.candidates.extend(w);
        }
    }

    /// What a committed, held entry waits on, if anything: the rule of
    /// [`DepApplier::ready`] with its two prefix facts read from the indexes.
    fn blocker(&self, e: &DepEntry<K>) -> Option<Seq> {
        // The leader listed every writer of our keys in the window.
        // The nearest of each kind, so a chain of writers of one hot key waits in a
        // chain (each apply wakes one entry), not all on the chain's first.
        if let Some(&w) = e
            .deps
            .waw
            .iter()
            .rev()
            .find(|&&w| w >= self.head && self.held.get(&w).is_none_or(|x| !x.applied))
        {
            return Some(w);
        }
        // Committed before we were admitted: compare write sets ourselves; a missing one
        // could write anything.
        if e.base > self.head {
            if let Some(&g) = self.gaps.range(self.head..e.base).next_back() {
                return Some(g);
            }
        }
        e.write_set.iter().find_map(|k| {
            self.writers
                .get(k)
                .and_then(|v| v.range(..e.base).next_back())
                .copied()
        })
    }

    /// Bookkeeping of the holes when `seq` becomes held.
    fn hold(&mut self, seq: Seq) {
        self.gaps.remove(&seq);
        let from = match self.held.keys().next_back() {
            Some(&top) => top + 1,
            None => self.head,
        };
        self.gaps.extend(from.max(self.head)..seq);
    }

    fn unwrite(&mut self, seq: Seq) {
        let Some(h) = self.held.get(&seq) else { return };
        for k in &h.entry.write_set {
            if let Some(v) = self.writers.get_mut(k) {
                v.remove(&seq);
                if v.is_empty() {
                    self.writers.remove(k);
                }
            }
        }
    }

    /// Committed entries that became ready since the last call, ascending: the rule of
    /// [`DepApplier::ready`], each entry returned once, at a cost that follows what
    /// changed since the last call rather than the number of entries held.
    pub fn take_ready(&mut self) -> Vec<Seq> {
        let mut out = Vec::new();
        for p in std::mem::take(&mut self.candidates) {
            let Some(h) = self.held.get(&p) else { continue };
            if h.applied || h.returned || !self.commits.is_committed(p) {
                continue;
            }
            if let Some(b) = self.blocker(&h.entry) {
                self.waiting.entry(b).or_default().push(p);
                continue;
            }
            self.held.get_mut(&p).expect("held").returned = true;
            out.push(p);
        }
        out
    }

    /// Learns the leader's commit window.
    pub fn absorb(&mut self, w: &CommitWindow) {
        self.commits.absorb(w);
        let fresh: Vec<Seq> = self
            .held
            .iter()
            .filter(|(&s, h)| !h.applied && !h.returned && self.commits.is_committed(s))
            .map(|(&s, _)| s)
            .collect();
        self.candidates.extend(fresh);
    }

    /// Committed entries that may apply now, ascending.
    pub fn ready(&self) -> Vec<Seq> {
        // One ascending walk: the first missing entry and, per key, the first unapplied
        // writer passed so far answer the check below `base`; the WAW list answers the
        // rest. Linear in the entries held (times their sets), however long the tail.
        let mut out = Vec::new();
        let Some(&top) = self.held.keys().next_back() else {
            return out;
        };
        let mut first_missing: Option<Seq> = None;
        let mut first_writer: HashMap<&K, Seq> = HashMap::new();
        for p in self.head..=top {
            let Some(h) = self.held.get(&p) else {
                first_missing.get_or_insert(p);
                continue;
            };
            if h.applied {
                continue;
            }
            let e = &h.entry;
            if self.commits.is_committed(p) {
                // The leader listed every writer of our keys in the window.
                let waw = e
                    .deps
                    .waw
                    .iter()
                    .any(|&w| w >= self.head && self.held.get(&w).is_none_or(|x| !x.applied));
                // Committed before we were admitted: compare write sets ourselves; a
                // missing one could write anything.
                let below = first_missing.is_some_and(|m| m < e.base)
                    || e.write_set
                        .iter()
                        .any(|k| first_writer.get(k).is_some_and(|&w| w < e.base));
                if !waw && !below {
                    out.push(p);
                }
            }
            for k in &e.write_set {
                first_writer.entry(k).or_insert(p);
            }
        }
        out
    }

    /// `seq` is committed (one entry of the leader's window).
    pub fn commit(&mut self, seq: Seq) {
        if seq >= self.head && self.commits.commit(seq) && self.held.contains_key(&seq) {
            self.candidates.insert(seq);
        }
    }

    /// Records that `seq` (one of [`DepApplier::ready`]) was applied.
    pub fn applied(&mut self, seq: Seq) -> Result<(), OooError> {
        let committed = self.commits.is_committed(seq);
        match self.held.get(&seq) {
            Some(h) if committed => {
                if !h.applied {
                    self.unwrite(seq);
                }
                self.held.get_mut(&seq).expect("held").applied = true;
            }
            _ => return Err(OooError::not_applicable(seq)),
        }
        self.wake(seq);
        self.advance();
        Ok(())
    }

    /// The merge decided no entry exists at `seq`: nothing to apply.
    pub fn skip(&mut self, seq: Seq) {
        if seq < self.head {
            return;
        }
        self.commits.commit(seq);
        if self.held.get(&seq).is_some_and(|h| !h.applied) {
            self.unwrite(seq);
        }
        self.hold(seq);
        self.held.insert(
            seq,
            Held {
                entry: DepEntry {
                    seq,
                    base: seq,
                    deps: Deps::default(),
                    write_set: Vec::new(),
                },
                applied: true,
                returned: true,
            },
        );
        self.candidates.remove(&seq);
        self.wake(seq);
        self.advance();
    }

    /// Entries at or above the head, up to the highest held or committed, that are not
    /// held: what catch-up must fetch.
    pub fn holes(&self) -> Vec<Seq> {
        let top = self
            .held
            .keys()
            .next_back()
            .copied()
            .max(self.commits.committed_above_head().last());
        super::holes(self.head, top, &self.held)
    }

    fn advance(&mut self) {
        while self.held.get(&self.head).is_some_and(|h| h.applied) {
            self.held.remove(&self.head);
            self.candidates.remove(&self.head);
            self.head += 1;
        }
    }
}

/// What a candidate's vote request says about its log, in dependent mode (DP-Raft
/// section 4.4): the term and sequence number of its last entry, and its first
/// uncommitted entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VoteLog {
    /// Term of the last entry held.
    pub last_term: u64,
    /// Sequence number of the last entry held.
    pub last_seq: Seq,
    /// First entry not known committed (the window head).
    pub first_uncommitted: Seq,
    /// Every entry below is compacted into the replica's state-machine image
    /// ([`crate::ooo::replica::Hard::base`]).
    pub base: Seq,
}

/// Whether a replica whose log is `mine` grants its vote to a candidate whose log is
/// `theirs` (DP-Raft section 4.4): (1) the candidate's last entry must be at least as new
/// (higher term, or the same term and at least as far); (2) when both are equally new, the
/// candidate's first uncommitted entry must not be behind ours, so that the pre-leader's
/// merge range (from its first uncommitted entry on) stays as short as the quorum allows.
///
/// Compaction adds two rules ahead of these (PolarFS section 5.4: ParallelRaft picks "the
/// node with newest checkpoint as the leader candidate"): a candidate whose first
/// uncommitted entry is below our base is refused, since our answer could not carry the
/// committed entries we compacted and the merge would decide those slots without them;
/// a candidate whose base is past our first uncommitted entry is granted (by the first
/// rule no one whose answer the merge needs has compacted past its head), so two replicas
/// each refused by the other's older log and older checkpoint cannot block an election.
pub fn grants_vote(mine: &VoteLog, theirs: &VoteLog) -> bool {
    if theirs.first_uncommitted < mine.base {
        return false;
    }
    if theirs.base > mine.first_uncommitted {
        return true;
    }
    let newer = (theirs.last_term, theirs.last_seq).cmp(&(mine.last_term, mine.last_seq));
    match newer {
        std::cmp::Ordering::Greater => true,
        std::cmp::Ordering::Less => false,
        std::cmp::Ordering::Equal => theirs.first_uncommitted >= mine.first_uncommitted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn section_4_2_example() {
        // The example of DP-Raft section 4.2 as far as its text gives it: L1 and L2 both
        // write a; L4 reads b and c; L5 reads b, "last modified by L2", and writes d, last
        // written by L4; L3 touches nothing of theirs. For b to be last modified by L2, L2
        // writes b as well, so the value of b that L4 read is L2's too.
        let mut l = DepLeader::<&str>::new(Quorum::majority([1, 2, 3]), 64, 1);
        let e1 = l.admit(&[], &["a", "b"]).unwrap();
        let e2 = l.admit(&[], &["a", "c", "b"]).unwrap();
        let e3 = l.admit(&["x"], &["y"]).unwrap();
        let e4 = l.admit(&["b", "c"], &["d"]).unwrap();
        let e5 = l.admit(&["b"], &["d"]).unwrap();
        assert_eq!(e1.seq, 1);
        assert_eq!(e2.deps.waw, vec![1], "L2 writes a after L1");
        assert_eq!(e3.deps, Deps::default());
        assert_eq!(e4.deps.raw, vec![2], "L4 read b and c, last written by L2");
        assert_eq!(e5.deps.raw, vec![2]);
        assert_eq!(e5.deps.waw, vec![4], "L5 writes d after L4");
    }

    /// Commits `seq` with acknowledgements from nodes 1 and 2.
    fn commit_now(l: &mut DepLeader<u32>, seq: Seq) {
        l.ack(seq, 1);
        l.ack(seq, 2);
        assert!(l.is_committed(seq));
    }

    /// While a follower is missing a committed entry, later entries list committed WAW
    /// predecessors from its first missing slot on (its base), RAW lists only uncommitted
    /// ones; the base never falls, never passes the head, and trails it by at most the
    /// trail; without a trail the base is the head, as in the paper.
    #[test]
    fn the_window_base_trails_the_head_for_a_follower_missing_committed_entries() {
        let mut l = DepLeader::<u32>::with_trail(Quorum::majority([1, 2, 3]), 64, 0, 4);
        let a = l.admit(&[], &[1]).unwrap();
        let b = l.admit(&[], &[2]).unwrap();
        commit_now(&mut l, a.seq);
        commit_now(&mut l, b.seq);
        // A follower still lacks `a` (its first uncommitted slot).
        l.set_floor(a.seq);
        let c = l.admit(&[1], &[1]).unwrap();
        assert_eq!(c.base, a.seq, "base at the follower's first missing slot");
        assert_eq!(c.deps.waw, vec![a.seq], "committed writer listed");
        assert!(
            c.deps.raw.is_empty(),
            "a committed writer is no RAW predecessor"
        );
        let d = l.admit(&[], &[2]).unwrap();
        assert_eq!(d.deps.waw, vec![b.seq]);
        // A lower hint later (a restarted follower) does not lower it.
        l.set_floor(0);
        assert_eq!(l.base(), a.seq);
        // Once the follower has everything, the base is the head again.
        commit_now(&mut l, c.seq);
        commit_now(&mut l, d.seq);
        l.set_floor(Seq::MAX);
        assert_eq!(l.base(), 4);
        let e = l.admit(&[], &[1, 2]).unwrap();
        assert_eq!((e.base, e.deps.waw.clone()), (4, vec![]));
        commit_now(&mut l, e.seq);
        // A follower far behind (missing 5 on): the base trails the head by at most 4.
        for _ in 0..10 {
            let x = l.admit(&[], &[1]).unwrap();
            commit_now(&mut l, x.seq);
        }
        l.set_floor(5);
        let head = 15;
        assert!(l.is_committed(head - 1) && !l.is_committed(head));
        assert_eq!(l.base(), head - 4);
        let f = l.admit(&[], &[1]).unwrap();
        assert_eq!(f.base, head - 4);
        assert_eq!(f.deps.waw, (head - 4..head).collect::<Vec<_>>());
        // No trail: the paper's window, from the first uncommitted entry.
        let mut p = DepLeader::<u32>::new(Quorum::majority([1, 2, 3]), 64, 0);
        let a = p.admit(&[], &[1]).unwrap();
        commit_now(&mut p, a.seq);
        p.set_floor(0);
        let b = p.admit(&[], &[1]).unwrap();
        assert_eq!((b.base, b.deps.waw), (1, vec![]));
    }

    /// `would_wait` answers what `admit` would record: a read of a key whose last writer
    /// is uncommitted, or an uncommitted barrier; not a write (WAW does not order commits).
    #[test]
    fn would_wait_is_whether_admit_would_list_a_raw_predecessor() {
        let mut l = DepLeader::<u32>::new(Quorum::majority([1, 2, 3]), 64, 0);
        let w = l.admit(&[], &[7]).unwrap();
        assert!(l.would_wait(&[7]));
        assert!(l.would_wait(&[1, 7]));
        assert!(!l.would_wait(&[8]));
        assert!(!l.would_wait(&[]));
        let r = l.admit(&[7], &[]).unwrap();
        assert_eq!(r.deps.raw, vec![w.seq]);
        commit_now(&mut l, w.seq);
        assert!(!l.would_wait(&[7]), "its writer committed");
        assert!(l.admit(&[7], &[]).unwrap().deps.raw.is_empty());
        // A barrier (conflict order, too many blocks): everything waits until it commits.
        let b = l.admit_conflicting(None).unwrap();
        assert!(l.would_wait(&[]) && l.would_wait(&[99]));
        commit_now(&mut l, r.seq);
        commit_now(&mut l, r.seq + 1);
        commit_now(&mut l, b.seq);
        assert!(!l.would_wait(&[99]));
    }

    #[test]
    fn a_raw_dependent_waits_for_its_predecessor_to_commit() {
        let mut l = DepLeader::<u32>::new(Quorum::majority([1, 2, 3]), 64, 0);
        let w = l.admit(&[], &[7]).unwrap();
        let r = l.admit(&[7], &[8]).unwrap();
        assert_eq!(r.deps.raw, vec![w.seq]);
        assert!(l.ack(r.seq, 1).is_empty());
        assert_eq!(l.held(), 0, "no majority yet: nothing held back");
        assert!(
            l.ack(r.seq, 2).is_empty(),
            "majority, but its RAW predecessor is not committed"
        );
        assert_eq!(l.held(), 1, "held back by the rule");
        assert!(l.ack(r.seq, 3).is_empty());
        assert_eq!(l.held(), 1, "counted once however many acks follow");
        assert_eq!(l.ack(w.seq, 1), Vec::<Seq>::new());
        assert_eq!(
            l.ack(w.seq, 3),
            vec![0, 1],
            "the predecessor commits, then the dependent"
        );
        assert_eq!(l.commit_window().head(), 2);
        assert_eq!(l.held(), 1, "the predecessor itself was never held");
        let w = l.admit(&[], &[7]).unwrap();
        let r = l.admit(&[7], &[8]).unwrap();
        for s in [w.seq, r.seq] {
            l.ack(s, 1);
            l.ack(s, 2);
        }
        assert_eq!(
            l.held(),
            1,
            "a dependent acknowledged after its predecessor committed"
        );
    }

    /// `would_order` names a writer of the keys that a replica which applied everything
    /// below `since` may still have to apply first: at or above both `since` and the
    /// window base; reads are not writes.
    #[test]
    fn would_order_looks_at_writers_from_since_and_the_base() {
        let mut l = DepLeader::<u64>::new(Quorum::majority([1, 2, 3]), 64, 0);
        l.admit(&[], &[5]).unwrap();
        l.admit(&[5], &[6]).unwrap();
        assert!(l.would_order(&[5], 0), "slot 0 writes 5");
        assert!(l.would_order(&[7, 6], 1), "slot 1 writes 6");
        assert!(!l.would_order(&[5], 1), "every replica applied slot 0");
        assert!(!l.would_order(&[7], 0), "nobody writes 7");
        assert!(!l.would_order(&[], 0));
        // Slot 0 commits: it falls below the window base, so the base rule orders a later
        // writer of 5 and nothing is listed.
        l.ack(0, 1);
        l.ack(0, 2);
        assert_eq!(l.base(), 1);
        assert!(!l.would_order(&[5], 0), "below the window base");
        assert!(l.would_order(&[6], 0), "slot 1 is above it");
    }

    #[test]
    fn conflict_order_commits_overlapping_entries_in_order() {
        // Parallel mode's conflict order: blocks 1 and 2 overlap entry 0 through a chain
        // (0 writes 1, 1 writes 1 and 2, 2 writes 2), entry 3 is disjoint.
        let mut l = DepLeader::<u64>::new(Quorum::majority([1, 2, 3]), 64, 0);
        l.admit_conflicting(Some(&[1])).unwrap();
        l.admit_conflicting(Some(&[1, 2])).unwrap();
        l.admit_conflicting(Some(&[2])).unwrap();
        l.admit_conflicting(Some(&[9])).unwrap();
        for s in [3, 2, 1] {
            l.ack(s, 1);
        }
        assert_eq!(l.ack(3, 2), vec![3], "a disjoint entry commits at once");
        assert!(l.ack(2, 2).is_empty(), "2 overlaps 1, not committed");
        assert!(l.ack(1, 2).is_empty(), "1 overlaps 0, not committed");
        l.ack(0, 1);
        assert_eq!(l.ack(0, 2), vec![0, 1, 2], "then all three, in order");
        assert_eq!(l.held(), 2, "entries 1 and 2 were held back, 3 was not");
    }

    #[test]
    fn conflict_order_without_keys_is_a_barrier() {
        let mut l = DepLeader::<u64>::new(Quorum::majority([1]), 64, 0);
        l.admit_conflicting(Some(&[1])).unwrap();
        l.admit_conflicting(Some(&[2])).unwrap();
        let b = l.admit_conflicting(None).unwrap();
        assert_eq!(b.deps.raw, vec![0, 1], "after everything in flight");
        let after = l.admit_conflicting(Some(&[3])).unwrap();
        assert_eq!(after.deps.raw, vec![2], "and everything later after it");
        assert!(l.ack(3, 1).is_empty());
        assert!(l.ack(2, 1).is_empty());
        assert_eq!(l.ack(1, 1), vec![1]);
        assert_eq!(l.ack(0, 1), vec![0, 2, 3]);
        // Committed: no longer a barrier.
        assert!(l.admit_conflicting(Some(&[4])).unwrap().deps.raw.is_empty());
    }

    #[test]
    fn independent_entries_commit_out_of_order() {
        let mut l = DepLeader::<u32>::new(Quorum::majority([1, 2, 3]), 64, 0);
        for k in 0..3 {
            l.admit(&[k], &[k]).unwrap();
        }
        assert_eq!(l.ack(2, 1), Vec::<Seq>::new());
        assert_eq!(l.ack(2, 2), vec![2]);
        assert_eq!(l.commit_window().head(), 0);
        assert!(l.is_committed(2) && !l.is_committed(0));
    }

    #[test]
    fn the_window_bounds_entries_in_flight() {
        let mut l = DepLeader::<u32>::new(Quorum::majority([1]), 2, 0);
        l.admit(&[], &[1]).unwrap();
        l.admit(&[], &[1]).unwrap();
        assert!(matches!(
            l.admit(&[], &[1]),
            Err(OooError::WindowFull { .. })
        ));
        l.ack(0, 1);
        assert!(l.admit(&[], &[1]).is_ok());
    }

    #[test]
    fn malformed_entries_are_refused() {
        let mut a = DepApplier::<u32>::new(0, 16);
        let e = |seq, base, raw: Vec<Seq>, waw: Vec<Seq>| DepEntry {
            seq,
            base,
            deps: Deps { raw, waw },
            write_set: vec![1],
        };
        assert!(a.insert(e(3, 4, vec![], vec![])).is_err());
        assert!(a.insert(e(3, 0, vec![3], vec![])).is_err());
        assert!(a.insert(e(3, 1, vec![], vec![0])).is_err());
        assert!(a.insert(e(3, 0, vec![], vec![2, 1])).is_err());
        assert!(a.insert(e(99, 0, vec![], vec![])).is_err());
        a.insert(e(3, 0, vec![], vec![1])).unwrap();
        assert_eq!(
            a.insert(e(3, 0, vec![], vec![2])),
            Err(OooError::Conflict { seq: 3 })
        );
        assert_eq!(a.holes(), vec![0, 1, 2]);
    }

    #[test]
    fn votes_follow_section_4_4() {
        let v = |last_term, last_seq, first_uncommitted| VoteLog {
            last_term,
            last_seq,
            first_uncommitted,
            base: 0,
        };
        let mine = v(3, 10, 6);
        assert!(grants_vote(&mine, &v(4, 2, 0)), "a higher last term wins");
        assert!(grants_vote(&mine, &v(3, 11, 0)), "same term, longer");
        assert!(
            !grants_vote(&mine, &v(2, 20, 20)),
            "an older last term loses"
        );
        assert!(!grants_vote(&mine, &v(3, 9, 9)), "same term, shorter");
        assert!(grants_vote(&mine, &v(3, 10, 6)), "equal logs");
        assert!(grants_vote(&mine, &v(3, 10, 8)));
        assert!(
            !grants_vote(&mine, &v(3, 10, 4)),
            "equally new, but the candidate would merge more than we would"
        );
    }

    #[test]
    fn compaction_rules_come_first() {
        let v = |last_term, last_seq, first_uncommitted, base| VoteLog {
            last_term,
            last_seq,
            first_uncommitted,
            base,
        };
        let mine = v(3, 100, 60, 50);
        assert!(
            !grants_vote(&mine, &v(9, 200, 40, 0)),
            "a newer log, but missing what we compacted"
        );
        assert!(grants_vote(&mine, &v(9, 200, 50, 0)));
        assert!(
            grants_vote(&mine, &v(2, 90, 80, 70)),
            "an older log, but a checkpoint past our head"
        );
        assert!(
            !grants_vote(&mine, &v(2, 90, 80, 60)),
            "otherwise 4.4 rules"
        );
    }

    #[test]
    fn a_broken_waw_chain_still_orders_writers() {
        // q and p write k, e writes k; p is merged away (never committed). e must still
        // apply after q.
        let mut l = DepLeader::<u32>::new(Quorum::majority([1]), 16, 0);
        let q = l.admit(&[], &[5]).unwrap();
        let p = l.admit(&[], &[5]).unwrap();
        let e = l.admit(&[], &[5]).unwrap();
        assert_eq!(e.deps.waw, vec![q.seq, p.seq]);
        let mut a = DepApplier::new(0, 16);
        a.insert(e.clone()).unwrap();
        let mut w = CommitWindow::new(0);
        w.commit(0);
        w.commit(2);
        a.absorb(&w);
        a.skip(p.seq);
        assert!(a.ready().is_empty(), "q (missing) must apply first");
        a.insert(q).unwrap();
        assert_eq!(a.ready(), vec![0]);
        a.applied(0).unwrap();
        assert_eq!(a.ready(), vec![2]);
    }

    proptest! {
        /// Algorithm 1 as a fixpoint: after every acknowledgement the committed set is
        /// exactly the entries with a majority whose RAW predecessors are all committed
        /// (the least such set), and each call returns what it newly committed in
        /// ascending order. Checks the waiter index against the rule itself.
        #[test]
        fn acknowledgements_commit_exactly_algorithm_1s_fixpoint(
            txns in proptest::collection::vec(
                (proptest::collection::vec(0u8..5, 0..3), proptest::collection::vec(0u8..5, 1..3)),
                1..40),
            acks in proptest::collection::vec((any::<u16>(), 1u64..4), 0..150),
        ) {
            let n = txns.len();
            let mut l = DepLeader::<u8>::new(Quorum::majority([1, 2, 3]), 64, 0);
            let entries: Vec<DepEntry<u8>> =
                txns.iter().map(|(r, w)| l.admit(r, w).unwrap()).collect();
            let mut held: Vec<BTreeSet<NodeId>> = vec![BTreeSet::new(); n];
            let mut committed = vec![false; n];
            for (pick, node) in acks {
                let s = pick as usize % n;
                held[s].insert(node);
                let got = l.ack(s as Seq, node);
                let before = committed.clone();
                loop {
                    let mut moved = false;
                    for i in 0..n {
                        if !committed[i]
                            && held[i].len() >= 2
                            && entries[i].deps.raw.iter().all(|&r| committed[r as usize])
                        {
                            committed[i] = true;
                            moved = true;
                        }
                    }
                    if !moved {
                        break;
                    }
                }
                let want: Vec<Seq> =
                    (0..n).filter(|&i| committed[i] && !before[i]).map(|i| i as Seq).collect();
                prop_assert_eq!(got, want);
                for (i, &c) in committed.iter().enumerate() {
                    prop_assert_eq!(l.is_committed(i as Seq), c, "slot {}", i);
                }
            }
        }

        /// `take_ready` against the full walk of `ready`, the rule's reference: after
        /// any sequence of arrivals, commits, skips and applies, the entries `take_ready`
        /// has returned and that are not applied yet are exactly those `ready` lists.
        #[test]
        fn take_ready_returns_exactly_what_ready_lists(
            txns in proptest::collection::vec(
                (proptest::collection::vec(0u8..5, 0..3), proptest::collection::vec(0u8..5, 1..3)),
                1..40),
            acks in proptest::collection::vec(any::<u16>(), 0..120),
            ops in proptest::collection::vec((0u8..6, any::<u16>()), 0..200),
        ) {
            let n = txns.len();
            // Admit with some commits in between, so bases move and some writers fall
            // below later entries' bases.
            let mut l = DepLeader::<u8>::new(Quorum::majority([1, 2, 3]), 64, 0);
            let mut acks = acks.into_iter();
            let mut entries = Vec::new();
            for (r, w) in &txns {
                entries.push(l.admit(r, w).unwrap());
                if let Some(a) = acks.next() {
                    let s = a as usize % entries.len();
                    l.ack(s as Seq, 1);
                    l.ack(s as Seq, 2);
                }
            }
            let mut ap = DepApplier::<u8>::new(0, 64);
            let mut out: BTreeSet<Seq> = BTreeSet::new();
            let check = |ap: &mut DepApplier<u8>, out: &mut BTreeSet<Seq>| {
                for s in ap.take_ready() {
                    assert!(out.insert(s), "slot {s} returned twice");
                }
                let want: BTreeSet<Seq> = ap.ready().into_iter().collect();
                assert_eq!(*out, want);
            };
            for (op, x) in ops {
                let i = x as usize % n;
                match op {
                    0 | 1 => { let _ = ap.insert(entries[i].clone()); }
                    2 => ap.commit(i as Seq),
                    3 => {
                        if let Some(&s) = out.iter().nth(x as usize % out.len().max(1)) {
                            out.remove(&s);
                            ap.applied(s).unwrap();
                        }
                    }
                    4 => check(&mut ap, &mut out),
                    _ => if !out.contains(&(i as Seq)) { ap.skip(i as Seq) },
                }
            }
            check(&mut ap, &mut out);
        }

        /// Leader and replica together: whatever the order of acknowledgements, arrivals,
        /// commit-window updates and applies, (1) no entry commits before a RAW
        /// predecessor, (2) everything commits and applies in the end, and (3) the
        /// replica's key-value state equals applying every entry serially in sequence
        /// order.
        #[test]
        fn any_allowed_order_equals_serial_order(
            txns in proptest::collection::vec(
                (proptest::collection::vec(0u8..6, 0..3), proptest::collection::vec(0u8..6, 1..3)),
                1..40),
            acks in proptest::collection::vec(any::<u16>(), 120),
            arrival in proptest::collection::vec(any::<u16>(), 40),
            picks in proptest::collection::vec(any::<u16>(), 300),
        ) {
            let n = txns.len();
            let mut l = DepLeader::<u8>::new(Quorum::majority([1, 2, 3]), 64, 0);
            let entries: Vec<DepEntry<u8>> = txns
                .iter()
                .map(|(r, w)| l.admit(r, w).unwrap())
                .collect();
            let mut serial = BTreeMap::new();
            for e in &entries {
                for k in &e.write_set {
                    serial.insert(*k, e.seq);
                }
            }
            // Acknowledgements from nodes 1..=3 in a random order.
            let mut ackv: Vec<(Seq, NodeId)> =
                (0..n as u64).flat_map(|s| (1..=3).map(move |nd| (s, nd))).collect();
            ackv.sort_by_key(|&(s, nd)| acks[(s as usize * 3 + nd as usize - 1) % acks.len()]);
            let mut order: Vec<usize> = (0..n).collect();
            order.sort_by_key(|&i| arrival[i]);
            let mut a = DepApplier::new(0, 64);
            let mut state = BTreeMap::new();
            let mut pick = picks.iter().cycle();
            let mut step = |a: &mut DepApplier<u8>, state: &mut BTreeMap<u8, Seq>| {
                let ready = a.ready();
                if ready.is_empty() {
                    return false;
                }
                let s = ready[*pick.next().unwrap() as usize % ready.len()];
                for k in &entries[s as usize].write_set {
                    state.insert(*k, s);
                }
                a.applied(s).unwrap();
                true
            };
            for (i, (s, nd)) in ackv.iter().enumerate() {
                for c in l.ack(*s, *nd) {
                    for &r in &entries[c as usize].deps.raw {
                        prop_assert!(l.is_committed(r), "entry {} committed before RAW {}", c, r);
                    }
                }
                if i % 3 == 0 && i / 3 < n {
                    a.insert(entries[order[i / 3]].clone()).unwrap();
                }
                if i % 2 == 0 {
                    a.absorb(l.commit_window());
                }
                let _ = step(&mut a, &mut state);
            }
            for e in &entries {
                a.insert(e.clone()).unwrap();
            }
            a.absorb(l.commit_window());
            while step(&mut a, &mut state) {}
            prop_assert_eq!(l.commit_window().head(), n as u64);
            prop_assert_eq!(a.head(), n as u64);
            prop_assert_eq!(state, serial);
        }
    }
}
