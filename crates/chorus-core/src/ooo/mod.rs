//! The rules of the out-of-order modes, as pure data structures: who may commit and apply
//! which entry while earlier ones are missing, and what a new leader merges.
//!
//! Two relaxations of the ordered (PALF / Raft) mode, chosen per group at creation:
//!
//! - **Parallel** ([`parallel`], ParallelRaft, PolarFS VLDB 2018 section 5): appenders
//!   declare the block ranges each entry writes; followers acknowledge as soon as an entry
//!   is durable, holes and all; the leader commits an entry once a majority has it; an
//!   entry applies once no unapplied predecessor writes an overlapping range. Each entry
//!   carries the ranges of the previous N entries (the *look-behind buffer*) so that a
//!   follower can judge a hole of up to N entries.
//! - **Dependent** ([`dependent`], DP-Raft, DASFAA 2020 sections 3–4): appenders declare
//!   read and write sets; an entry commits once a majority has it **and** its
//!   read-after-write predecessors committed (Algorithm 1), and applies once committed
//!   **and** its write-after-write predecessors applied.
//!
//! [`merge`] holds what a new leader does with the quorum's versions of each slot before it
//! serves (ParallelRaft's merge stage, DP-Raft's pre-leader merge, Fig. 4), including the
//! guard against the *ghost log entry* of Gu et al.
//!
//! Entries are numbered by [`Seq`], consecutive from 0 in a group. Everything here is a
//! deterministic function of its inputs (no clock, IO or randomness: DESIGN.md principle
//! 1), so the simulator and property tests drive it directly. [`replica`] is the replica
//! of an out-of-order group built on them, run by the simulator (`chorus_sim::ooo`) and by
//! the runtime (`chorus_runtime::ooo`); [`group`] is how the runtime packs many writers'
//! records into one entry.

pub mod dependent;
pub mod group;
pub mod merge;
pub mod parallel;
pub mod replica;

use std::fmt;

/// The sequence number of an entry in an out-of-order group: 0, 1, 2, … in the order the
/// leader admitted them.
pub type Seq = u64;

/// Why an out-of-order structure refused an input. Inputs come from the network or from
/// appenders; a refusal leaves the structure unchanged.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OooError {
    /// The window of entries in flight is full: the appender must wait for commits.
    #[error("the window is full: entries {head}..{next} are in flight (window {window})")]
    WindowFull {
        /// First uncommitted entry.
        head: Seq,
        /// Next entry to admit.
        next: Seq,
        /// Window size.
        window: u64,
    },
    /// The entry lies outside what the structure tracks (below its head, or beyond the
    /// window).
    #[error("entry {seq} is outside the tracked range {head}..{limit}")]
    OutOfRange {
        /// The entry.
        seq: Seq,
        /// First tracked entry.
        head: Seq,
        /// First entry past the tracked range.
        limit: Seq,
    },
    /// The same entry arrived twice with different contents.
    #[error("entry {seq} arrived twice with different contents")]
    Conflict {
        /// The entry.
        seq: Seq,
    },
    /// A malformed input (a dependency that does not precede its entry, an empty or
    /// overflowing range, a look-behind buffer longer than the span, …).
    #[error("entry {seq}: {detail}")]
    Malformed {
        /// The entry.
        seq: Seq,
        /// What was wrong.
        detail: String,
    },
}

impl OooError {
    /// An apply reported for an entry the applier does not hold committed.
    fn not_applicable(seq: Seq) -> Self {
        Self::Malformed {
            seq,
            detail: "applied an entry that is not held and committed".into(),
        }
    }
}

/// The entries from `head` up to the highest of `top` that `held` does not hold: the
/// holes catch-up must fill.
fn holes<V>(head: Seq, top: Option<Seq>, held: &std::collections::BTreeMap<Seq, V>) -> Vec<Seq> {
    match top {
        Some(top) => (head..=top).filter(|s| !held.contains_key(s)).collect(),
        None => Vec::new(),
    }
}

/// Which entries of a window are committed: every entry below `head`, and entry
/// `head + i` when bit `i` is set. This is what the leader piggybacks on its next append or
/// heartbeat instead of a single committed index (DP-Raft section 4.3, *commitFlag* and
/// *windowHead*); ParallelRaft needs the same, since it too commits out of order.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct CommitWindow {
    head: Seq,
    /// Bit `i` of word `i / 64` is entry `head + i`; never has a set bit 0 (the head would
    /// have advanced) and never ends with a zero word.
    bits: Vec<u64>,
}

impl fmt::Debug for CommitWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CommitWindow {{ head: {}, committed: [", self.head)?;
        let mut first = true;
        for s in self.committed_above_head() {
            if !first {
                write!(f, ", ")?;
            }
            first = false;
            write!(f, "{s}")?;
        }
        write!(f, "] }}")
    }
}

impl CommitWindow {
    /// Everything below `head` committed, nothing at or above it.
    pub fn new(head: Seq) -> Self {
        Self {
            head,
            bits: Vec::new(),
        }
    }

    /// Rebuilds a window received from a leader. Refuses a bitmap with bit 0 set (the head
    /// would be committed) or with trailing zero words (not canonical), or one reaching
    /// past `u64::MAX`.
    pub fn from_parts(head: Seq, bits: Vec<u64>) -> Result<Self, OooError> {
        let bad = |detail: &str| OooError::Malformed {
            seq: head,
            detail: detail.to_string(),
        };
        if bits.first().is_some_and(|w| w & 1 == 1) {
            return Err(bad("commit bitmap marks the window head committed"));
        }
        if bits.last() == Some(&0) {
            return Err(bad("commit bitmap ends with a zero word"));
        }
        if head.checked_add(bits.len() as u64 * 64).is_none() {
            return Err(bad("commit bitmap reaches past the last sequence number"));
        }
        Ok(Self { head, bits })
    }

    /// The first uncommitted entry.
    pub fn head(&self) -> Seq {
        self.head
    }

    /// The bitmap words (bit `i` of word `i / 64` is entry `head + i`).
    pub fn bits(&self) -> &[u64] {
        &self.bits
    }

    /// Whether `seq` is committed.
    pub fn is_committed(&self, seq: Seq) -> bool {
        if seq < self.head {
            return true;
        }
        let i = seq - self.head;
        let (w, b) = ((i / 64) as usize, i % 64);
        self.bits.get(w).is_some_and(|x| x >> b & 1 == 1)
    }

    /// Marks `seq` committed; moves the head past every committed entry at its front.
    /// Returns whether it was newly committed.
    pub fn commit(&mut self, seq: Seq) -> bool {
        if self.is_committed(seq) {
            return false;
        }
        let i = seq - self.head;
        let (w, b) = ((i / 64) as usize, i % 64);
        if self.bits.len() <= w {
            self.bits.resize(w + 1, 0);
        }
        self.bits[w] |= 1 << b;
        self.normalise();
        true
    }

    /// Learns a leader's window: everything it marks committed is committed here too.
    pub fn absorb(&mut self, other: &CommitWindow) {
        if other.head > self.head {
            let old: Vec<Seq> = self
                .committed_above_head()
                .filter(|&s| s >= other.head)
                .collect();
            self.head = other.head;
            self.bits.clear();
            for s in old {
                self.commit(s);
            }
        }
        for s in other.committed_above_head() {
            self.commit(s);
        }
    }

    /// Committed entries above the head, ascending.
    pub fn committed_above_head(&self) -> impl Iterator<Item = Seq> + '_ {
        self.bits.iter().enumerate().flat_map(move |(w, &word)| {
            (0..64)
                .filter(move |b| word >> b & 1 == 1)
                .map(move |b| self.head + w as u64 * 64 + b)
        })
    }

    fn normalise(&mut self) {
        // Advance over committed entries at the front: shift whole words, then bits.
        while self.bits.first() == Some(&u64::MAX) {
            self.bits.remove(0);
            self.head += 64;
        }
        if let Some(&w) = self.bits.first() {
            let n = w.trailing_ones() as u64;
            if n > 0 {
                self.shift(n);
            }
        }
        while self.bits.last() == Some(&0) {
            self.bits.pop();
        }
    }

    /// Drops the first `n < 64` bits (all set) and moves the head by `n`.
    fn shift(&mut self, n: u64) {
        debug_assert!(n > 0 && n < 64);
        let len = self.bits.len();
        for i in 0..len {
            let next = if i + 1 < len { self.bits[i + 1] } else { 0 };
            self.bits[i] = self.bits[i] >> n | next << (64 - n);
        }
        self.head += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn head_advances_over_a_committed_prefix() {
        let mut w = CommitWindow::new(10);
        assert!(w.commit(12));
        assert!(w.commit(11));
        assert_eq!(w.head(), 10);
        assert!(w.is_committed(9) && w.is_committed(11) && w.is_committed(12));
        assert!(!w.is_committed(10) && !w.is_committed(13));
        assert!(w.commit(10));
        assert_eq!(w.head(), 13);
        assert!(w.bits().is_empty());
        assert!(!w.commit(5), "below the head is already committed");
    }

    #[test]
    fn malformed_windows_are_refused() {
        assert!(CommitWindow::from_parts(0, vec![1]).is_err());
        assert!(CommitWindow::from_parts(0, vec![2, 0]).is_err());
        assert!(CommitWindow::from_parts(u64::MAX - 3, vec![2]).is_err());
        let w = CommitWindow::from_parts(7, vec![0b110, 1]).expect("valid");
        assert_eq!(w.committed_above_head().collect::<Vec<_>>(), vec![8, 9, 71]);
    }

    proptest! {
        /// The window agrees with a plain set of committed entries, whatever the order of
        /// commits, and stays canonical.
        #[test]
        fn window_matches_a_set(order in proptest::collection::vec(0u64..300, 0..400)) {
            let mut w = CommitWindow::new(0);
            let mut set = std::collections::BTreeSet::new();
            for s in order {
                prop_assert_eq!(w.commit(s), set.insert(s));
                let head = (0..).find(|x| !set.contains(x)).unwrap_or(0);
                prop_assert_eq!(w.head(), head);
                for x in 0..320 {
                    prop_assert_eq!(w.is_committed(x), set.contains(&x));
                }
                prop_assert!(CommitWindow::from_parts(w.head(), w.bits().to_vec()).is_ok());
            }
        }

        /// A follower absorbing the leader's windows in any order ends where the leader is.
        #[test]
        fn absorb_catches_up(order in proptest::collection::vec(0u64..200, 0..200), skip in 0usize..5) {
            let mut leader = CommitWindow::new(0);
            let mut follower = CommitWindow::new(0);
            for (i, s) in order.iter().enumerate() {
                leader.commit(*s);
                if i % (skip + 1) == 0 {
                    follower.absorb(&leader);
                }
            }
            follower.absorb(&leader);
            prop_assert_eq!(follower, leader);
        }
    }
}
