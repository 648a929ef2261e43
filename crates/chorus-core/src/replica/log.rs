//! The replica's in-memory view of its own log: an index of recent groups (LSN, proposal
//! id, chain point) and a bounded cache of their bytes. The bytes themselves live in
//! storage; this is what the protocol needs to match, truncate and replicate without
//! reading the disk on the hot path.

use std::collections::VecDeque;

use crate::format::group::ChainPoint;
use crate::{Csn, Lsn};

use super::message::LogPos;

/// What the replica knows about one group of its log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupMeta {
    /// LSN of the group.
    pub lsn: Lsn,
    /// Proposal id of the leader that sealed it.
    pub pid: u64,
    /// The chain point just after it.
    pub after: ChainPoint,
}

impl GroupMeta {
    /// LSN just past the group.
    pub fn end(&self) -> Lsn {
        self.after.end_lsn
    }
}

/// The log as storage recovered it: what a replica is built from at start-up.
///
/// `groups` must continue `floor` without gaps and should reach back to before the
/// committed point, so the replica knows the proposal id of every group it may need to
/// compare (the piggyback paper's follower recovery, section 5.2, replays up to
/// `committed` and treats the rest as undecided).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveredLog {
    /// First LSN still in storage.
    pub start: Lsn,
    /// Chain point where `groups` begin.
    pub floor: ChainPoint,
    /// Proposal id of the group ending at `floor` (0 if unknown or none).
    pub floor_pid: u64,
    /// The groups from `floor` to the end of the log.
    pub groups: Vec<GroupMeta>,
    /// The highest committed end LSN piggybacked in the log (at least `start`).
    pub committed: Lsn,
}

#[derive(Debug)]
pub(crate) struct LogView {
    pub start: Lsn,
    pub floor: ChainPoint,
    pub floor_pid: u64,
    pub index: VecDeque<GroupMeta>,
    pub chain: ChainPoint,
    pub flushed: Lsn,
    pub committed: Lsn,
    pub cache: VecDeque<(Lsn, Vec<u8>)>,
    pub cache_len: usize,
    pub cache_limit: usize,
}

impl LogView {
    pub fn new(r: RecoveredLog, cache_limit: usize) -> Self {
        let chain = r.groups.last().map_or(r.floor, |g| g.after);
        Self {
            start: r.start,
            floor: r.floor,
            floor_pid: r.floor_pid,
            index: r.groups.into(),
            chain,
            flushed: chain.end_lsn,
            committed: r.committed.min(chain.end_lsn),
            cache: VecDeque::new(),
            cache_len: 0,
            cache_limit,
        }
    }

    pub fn end(&self) -> Lsn {
        self.chain.end_lsn
    }

    fn find(&self, lsn: Lsn) -> Result<usize, usize> {
        self.index.binary_search_by(|g| g.lsn.cmp(&lsn))
    }

    /// The group starting at `lsn`, if indexed.
    pub fn group_at(&self, lsn: Lsn) -> Option<&GroupMeta> {
        self.find(lsn).ok().map(|i| &self.index[i])
    }

    /// The chain point at `lsn` if it is an indexed group boundary (or the floor).
    pub fn chain_at(&self, lsn: Lsn) -> Option<ChainPoint> {
        if lsn == self.floor.end_lsn {
            return Some(self.floor);
        }
        if lsn == self.chain.end_lsn {
            return Some(self.chain);
        }
        // The group ending at `lsn` is the one before the group starting at `lsn`.
        match self.find(lsn) {
            Ok(i) if i > 0 => Some(self.index[i - 1].after),
            _ => None,
        }
    }

    pub fn pos_at(&self, lsn: Lsn) -> Option<LogPos> {
        self.chain_at(lsn).map(|c| LogPos {
            lsn: c.end_lsn,
            acc: c.acc_crc,
        })
    }

    /// Whether groups sent after `prev` continue this log: `prev` is a boundary with the
    /// same accumulated checksum, or lies in the committed prefix below the index (committed
    /// prefixes are identical on every replica).
    pub fn continues_at(&self, prev: LogPos) -> bool {
        if prev.lsn < self.floor.end_lsn {
            prev.lsn <= self.committed
        } else {
            self.pos_at(prev.lsn) == Some(prev)
        }
    }

    /// The largest CSN of the records below `lsn`, from the chain points the index holds
    /// (each carries the largest CSN before it): exact when `lsn` is an indexed boundary
    /// or past the log's end, else that of the last boundary known below it. Never more
    /// than the truth, since CSNs grow with LSNs (PALF section 4.2), which is what a
    /// readable CSN needs (a follower must not claim records it does not hold); below
    /// the floor, where nothing is known, 0.
    pub fn csn_at(&self, lsn: Lsn) -> Csn {
        if lsn >= self.chain.end_lsn {
            return self.chain.max_csn;
        }
        if lsn < self.floor.end_lsn {
            return 0;
        }
        // Groups wholly below `lsn`: the last one's chain point is the last boundary at
        // or below it (the floor when there is none).
        let below = self.index.partition_point(|g| g.end() <= lsn);
        match below {
            0 => self.floor.max_csn,
            i => self.index[i - 1].after.max_csn,
        }
    }

    /// Proposal id of the group ending at `lsn` (a boundary), if known.
    pub fn pid_ending_at(&self, lsn: Lsn) -> u64 {
        if lsn == self.floor.end_lsn {
            return self.floor_pid;
        }
        if lsn == self.chain.end_lsn {
            return self.index.back().map_or(self.floor_pid, |g| g.pid);
        }
        match self.find(lsn) {
            Ok(i) if i > 0 => self.index[i - 1].pid,
            _ => 0,
        }
    }

    /// Records a group appended at the end.
    pub fn push(&mut self, meta: GroupMeta, bytes: Vec<u8>) {
        debug_assert_eq!(meta.lsn, self.chain.end_lsn);
        self.chain = meta.after;
        self.index.push_back(meta);
        self.cache_len += bytes.len();
        self.cache.push_back((meta.lsn, bytes));
        while self.cache_len > self.cache_limit && self.cache.len() > 1 {
            let (_, b) = self.cache.pop_front().expect("non-empty");
            self.cache_len -= b.len();
        }
    }

    /// Forgets the groups from `lsn` (a boundary).
    pub fn truncate(&mut self, lsn: Lsn) {
        let chain = self.chain_at(lsn).expect("truncate at a known boundary");
        while self.index.back().is_some_and(|g| g.lsn >= lsn) {
            self.index.pop_back();
        }
        while self.cache.back().is_some_and(|(l, _)| *l >= lsn) {
            let (_, b) = self.cache.pop_back().expect("non-empty");
            self.cache_len -= b.len();
        }
        self.chain = chain;
        self.flushed = self.flushed.min(lsn);
    }

    /// Forgets the whole log: it starts again, empty, at `base` (everything below it is
    /// committed), with `base_pid` as the proposal id of the group ending there.
    pub fn rebase(&mut self, base: ChainPoint, base_pid: u64) {
        self.start = base.end_lsn;
        self.floor = base;
        self.floor_pid = base_pid;
        self.index.clear();
        self.chain = base;
        self.flushed = base.end_lsn;
        self.committed = base.end_lsn;
        self.cache.clear();
        self.cache_len = 0;
    }

    /// Drops index entries wholly below `keep_from` while more than `max` are held.
    pub fn prune(&mut self, keep_from: Lsn, max: usize) {
        while self.index.len() > max {
            let g = self.index[0];
            if g.end() > keep_from {
                break;
            }
            self.floor = g.after;
            self.floor_pid = g.pid;
            self.index.pop_front();
        }
        let first = self.index.front().map_or(self.chain.end_lsn, |g| g.lsn);
        while self.cache.front().is_some_and(|(l, _)| *l < first) {
            let (_, b) = self.cache.pop_front().expect("non-empty");
            self.cache_len -= b.len();
        }
    }

    /// Cached bytes of whole groups from `lsn` (a boundary), up to about `max` bytes (at
    /// least one group), or `None` if `lsn` is not cached.
    pub fn cached_from(&self, lsn: Lsn, max: usize) -> Option<Vec<u8>> {
        if lsn >= self.chain.end_lsn {
            return Some(Vec::new());
        }
        let i = self.cache.binary_search_by(|(l, _)| l.cmp(&lsn)).ok()?;
        let mut out = Vec::new();
        for (_, b) in self.cache.iter().skip(i) {
            if !out.is_empty() && out.len() + b.len() > max {
                break;
            }
            out.extend_from_slice(b);
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(end_lsn: Lsn, max_csn: Csn) -> ChainPoint {
        ChainPoint {
            end_lsn,
            acc_crc: end_lsn as u32,
            next_group_seq: 0,
            max_csn,
        }
    }

    /// The readable CSN's source: at every boundary the exact largest CSN below it,
    /// between boundaries that of the boundary below (never more than the truth), past
    /// the end the log's largest, below the floor nothing.
    #[test]
    fn csn_at_is_exact_at_boundaries_and_never_more_than_the_truth() {
        // Floor at 100 (CSN 7), then groups [100, 160) with CSNs up to 9, [160, 200)
        // empty (a StartWorking group keeps the chain's CSN), [200, 260) up to 12.
        let mut v = LogView::new(
            RecoveredLog {
                start: 0,
                floor: point(100, 7),
                floor_pid: 1,
                groups: vec![
                    GroupMeta {
                        lsn: 100,
                        pid: 1,
                        after: point(160, 9),
                    },
                    GroupMeta {
                        lsn: 160,
                        pid: 2,
                        after: point(200, 9),
                    },
                    GroupMeta {
                        lsn: 200,
                        pid: 2,
                        after: point(260, 12),
                    },
                ],
                committed: 160,
            },
            1 << 20,
        );
        assert_eq!(v.csn_at(100), 7);
        assert_eq!(v.csn_at(130), 7, "inside a group: the boundary below");
        assert_eq!(v.csn_at(160), 9);
        assert_eq!(v.csn_at(200), 9);
        assert_eq!(v.csn_at(259), 9);
        assert_eq!(v.csn_at(260), 12);
        assert_eq!(v.csn_at(10_000), 12);
        assert_eq!(v.csn_at(99), 0, "below the floor nothing is known");
        // Pruning moves the floor up; the boundaries kept answer as before.
        v.prune(200, 1);
        assert_eq!(v.floor.end_lsn, 200);
        assert_eq!(v.csn_at(200), 9);
        assert_eq!(v.csn_at(260), 12);
        // A rebase starts the log at the leader's start, whose CSN it carries.
        v.rebase(point(1000, 40), 3);
        assert_eq!(v.csn_at(1000), 40);
    }
}
