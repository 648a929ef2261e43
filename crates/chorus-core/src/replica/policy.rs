//! The policy seam: who may acknowledge, commit and apply what, and what a new leader
//! merges (DESIGN.md principle 7).
//!
//! The ordered mode (PALF, this file) acknowledges and commits in LSN order and merges by
//! taking the log of the replica with the highest (last proposal id, end) in a majority
//! (PALF Alg. 1 line 4). The out-of-order modes (ParallelRaft, DP-Raft) implement the same
//! trait with holes, dependency gates and their merge stages; handlers in the replica call
//! through it instead of hard-coding the ordered rules.

use crate::format::meta::NodeId;
use crate::Lsn;

/// One replica's answer to a reconfirmation prepare, as the merge sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MergeCandidate {
    /// The replica.
    pub node: NodeId,
    /// Its flushed end LSN.
    pub end: Lsn,
    /// Proposal id of its last flushed group.
    pub last_pid: u64,
}

/// Commit and merge rules of a group's mode.
pub trait Policy: std::fmt::Debug + Send {
    /// The mode's name.
    fn name(&self) -> &'static str;

    /// The committed end given each voter's matched (acknowledged, durable) end and the
    /// quorum size.
    fn commit_point(&self, matched: &mut [Lsn], quorum: usize) -> Lsn;

    /// Which replica's log the new leader adopts, given the answers of a majority.
    fn merge_source(&self, answers: &[MergeCandidate], me: NodeId) -> MergeCandidate;

    /// Whether a follower may hold groups past a hole (ordered: no, it buffers them and
    /// accepts in LSN order).
    fn accepts_holes(&self) -> bool;
}

/// The ordered (PALF / Raft) mode.
#[derive(Clone, Copy, Debug, Default)]
pub struct Ordered;

impl Policy for Ordered {
    fn name(&self) -> &'static str {
        "ordered"
    }

    fn commit_point(&self, matched: &mut [Lsn], quorum: usize) -> Lsn {
        if quorum == 0 || matched.len() < quorum {
            return 0;
        }
        matched.sort_unstable_by(|a, b| b.cmp(a));
        matched[quorum - 1]
    }

    fn merge_source(&self, answers: &[MergeCandidate], me: NodeId) -> MergeCandidate {
        // Highest (last proposal id, end); prefer ourselves on a tie to save a fetch.
        *answers
            .iter()
            .max_by(|a, b| {
                (a.last_pid, a.end, a.node == me).cmp(&(b.last_pid, b.end, b.node == me))
            })
            .expect("a majority answered")
    }

    fn accepts_holes(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_point_is_the_quorum_th_largest() {
        // The piggyback paper's Fig. 3: leader 130, followers 120 and 110 -> 120.
        let mut m = [130, 120, 110];
        assert_eq!(Ordered.commit_point(&mut m, 2), 120);
        let mut m = [5, 1, 9, 7, 3];
        assert_eq!(Ordered.commit_point(&mut m, 3), 5);
        let mut m = [5];
        assert_eq!(Ordered.commit_point(&mut m, 2), 0);
    }

    #[test]
    fn merge_prefers_last_pid_over_length() {
        let a = MergeCandidate {
            node: 1,
            end: 500,
            last_pid: 3,
        };
        let b = MergeCandidate {
            node: 2,
            end: 100,
            last_pid: 4,
        };
        assert_eq!(Ordered.merge_source(&[a, b], 1).node, 2);
        let c = MergeCandidate {
            node: 3,
            end: 100,
            last_pid: 4,
        };
        assert_eq!(Ordered.merge_source(&[b, c], 3).node, 3);
    }
}
