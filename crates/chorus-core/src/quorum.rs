//! Quorum arithmetic, shared by the ordered replica ([`crate::replica`]) and the
//! out-of-order one ([`crate::ooo::replica`]): who must agree for something to count as
//! decided, and how far a log is committed given how far each voter holds it.
//!
//! A decision needs a majority of one voter set, or — while a membership change is under
//! way — a majority of *each* of several sets: the voters after the change and the voters
//! before it. That is Raft's joint consensus (Ongaro and Ousterhout, USENIX ATC 2014,
//! section 6), which the out-of-order replica follows for every decision. The ordered
//! replica follows PALF section 5.3 (single-member changes, the membership in meta
//! storage, a log barrier): there only the commit point is joint, counting the previous
//! voters too until the new config is accepted, so that a committed prefix is always held
//! by a majority of whichever voters a later leader is elected from (the loss of Fig. 8a).
//! Any two quorums of the same voters intersect, and a joint quorum intersects every quorum
//! of either of its sets, which is what lets a new leader's election or merge see whatever
//! a commit quorum held.
//!
//! Both replicas ask the same two questions of a [`Quorum`]:
//!
//! - [`Quorum::is_reached`]: do these nodes (the ones that voted yes, acknowledged a slot,
//!   accepted a config, answered a prepare) form a quorum?
//! - [`Quorum::commit_point`]: given each voter's matched position (the end of the prefix
//!   it holds durably, or any other value that only grows, such as the time of its last
//!   lease acknowledgement), what is the largest position a quorum has reached? For one
//!   set that is the majority-th largest matched value — the piggyback paper's Fig. 3: a
//!   leader at 130 and followers at 120 and 110 commit 120 — and for a joint quorum the
//!   smallest of the sets' points.
//!
//! What differs between the replicas — byte-LSN groups elected by priority and reconfirmed
//! from the longest log (PALF section 3.4), against numbered slots with terms, holes and a
//! per-slot merge (ParallelRaft, DP-Raft) — stays in each replica; only this arithmetic is
//! common.

use std::collections::BTreeSet;

use crate::format::meta::NodeId;

/// The number of members of a set of `n` that form a majority: more than half.
fn majority(n: usize) -> usize {
    n / 2 + 1
}

/// Who must agree to a decision: a majority of each of its voter sets.
///
/// A set's members are taken as listed: the memberships both replicas build from keep
/// their voters distinct, and a node listed twice would count twice. An empty set has no
/// majority, so a quorum with an empty set is never reached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quorum {
    /// The voter sets, at least one (every constructor builds one or two): a majority of
    /// each is needed. The first is the current voters; during a joint stage the second
    /// is the voters before the change.
    sets: Vec<Vec<NodeId>>,
}

impl Quorum {
    /// A majority of `voters`: the quorum outside membership changes.
    pub fn majority(voters: impl Into<Vec<NodeId>>) -> Self {
        Self {
            sets: vec![voters.into()],
        }
    }

    /// A majority of `new` and a majority of `old`: a membership change's joint stage
    /// (Raft's joint consensus, section 6; the ordered replica's commit point during a
    /// PALF section 5.3 change), so that nothing decided during the change is missed by a
    /// later quorum of either the old or the new voters.
    pub fn joint(new: impl Into<Vec<NodeId>>, old: impl Into<Vec<NodeId>>) -> Self {
        Self {
            sets: vec![new.into(), old.into()],
        }
    }

    /// The voter sets, the current voters first.
    pub fn sets(&self) -> &[Vec<NodeId>] {
        &self.sets
    }

    /// The current voters: the only set outside a change, the new voters in a joint stage.
    pub fn voters(&self) -> &[NodeId] {
        self.sets.first().map_or(&[], Vec::as_slice)
    }

    /// Whether the nodes for which `acked` holds form a quorum: a majority of every set.
    /// Nodes outside every set count for nothing.
    pub fn is_reached(&self, acked: impl Fn(NodeId) -> bool) -> bool {
        self.sets
            .iter()
            .all(|set| set.iter().filter(|n| acked(**n)).count() >= majority(set.len()))
    }

    /// Whether `nodes` form a quorum ([`Quorum::is_reached`] over a set).
    pub fn reached_by(&self, nodes: &BTreeSet<NodeId>) -> bool {
        self.is_reached(|n| nodes.contains(&n))
    }

    /// The largest position a quorum has reached, given each voter's `matched` position:
    /// the largest `p` such that the voters whose matched position is at least `p` form a
    /// quorum. For one set that is its majority-th largest matched value (the piggyback
    /// paper's Fig. 3: leader 130, followers 120 and 110 -> 120); for a joint quorum the
    /// smallest of its sets' values, since a majority of each must hold it.
    ///
    /// `None` when a set is empty: it has no majority, so nothing is reached.
    pub fn commit_point<T: Ord + Copy>(&self, matched: impl Fn(NodeId) -> T) -> Option<T> {
        let mut point: Option<T> = None;
        let mut values = Vec::new();
        for set in &self.sets {
            values.clear();
            values.extend(set.iter().map(|n| matched(*n)));
            let k = majority(values.len());
            if values.len() < k {
                return None;
            }
            // The k-th largest: the k voters at or above it are a majority of the set, and
            // no larger value is held by k of them.
            values.sort_unstable_by(|a, b| b.cmp(a));
            let p = values[k - 1];
            point = Some(point.map_or(p, |q| q.min(p)));
        }
        point
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_majority_is_more_than_half() {
        assert_eq!(
            (0..=6).map(majority).collect::<Vec<_>>(),
            [1, 1, 2, 2, 3, 3, 4]
        );
    }

    #[test]
    fn one_set_needs_a_majority_of_it() {
        let q = Quorum::majority([1, 2, 3]);
        assert!(!q.is_reached(|_| false));
        assert!(!q.is_reached(|n| n == 1));
        assert!(q.is_reached(|n| n == 1 || n == 3));
        assert!(q.is_reached(|_| true));
        // Nodes outside the set count for nothing.
        assert!(!q.reached_by(&BTreeSet::from([1, 4, 5, 6])));
        assert!(q.reached_by(&BTreeSet::from([2, 3, 9])));
        // Four voters need three: two is half, not a majority.
        let q = Quorum::majority([1, 2, 3, 4]);
        assert!(!q.reached_by(&BTreeSet::from([1, 2])));
        assert!(q.reached_by(&BTreeSet::from([1, 2, 4])));
        // One voter is its own majority.
        assert!(Quorum::majority([7]).reached_by(&BTreeSet::from([7])));
    }

    #[test]
    fn an_empty_set_is_never_reached() {
        let q = Quorum::majority(Vec::new());
        assert!(!q.is_reached(|_| true));
        assert_eq!(q.commit_point(|_| 5u64), None);
        let q = Quorum::joint([1, 2, 3], Vec::new());
        assert!(!q.is_reached(|_| true));
        assert_eq!(q.commit_point(|_| 5u64), None);
    }

    #[test]
    fn a_joint_quorum_needs_a_majority_of_each_set() {
        // Replacing 3 by 4: old {1, 2, 3}, new {1, 2, 4}.
        let q = Quorum::joint([1, 2, 4], [1, 2, 3]);
        assert_eq!(q.sets(), [vec![1, 2, 4], vec![1, 2, 3]]);
        assert_eq!(q.voters(), [1, 2, 4]);
        assert_eq!(Quorum::majority([3, 1]).voters(), [3, 1]);
        assert!(q.reached_by(&BTreeSet::from([1, 2])));
        // {1, 4} is a majority of the new voters only; {1, 3} of the old only.
        assert!(!q.reached_by(&BTreeSet::from([1, 4])));
        assert!(!q.reached_by(&BTreeSet::from([1, 3])));
        assert!(q.reached_by(&BTreeSet::from([1, 3, 4])));
        // Disjoint sets (moving a group from {1, 2, 3} to {4, 5, 6}).
        let q = Quorum::joint([4, 5, 6], [1, 2, 3]);
        assert!(!q.reached_by(&BTreeSet::from([1, 2, 3])));
        assert!(!q.reached_by(&BTreeSet::from([4, 5, 6])));
        assert!(q.reached_by(&BTreeSet::from([1, 2, 5, 6])));
    }

    #[test]
    fn the_commit_point_is_the_majority_th_largest() {
        // The piggyback paper's Fig. 3: leader 130, followers 120 and 110 -> 120.
        let m = BTreeMap::from([(1, 130u64), (2, 120), (3, 110)]);
        let q = Quorum::majority([1, 2, 3]);
        assert_eq!(q.commit_point(|n| m[&n]), Some(120));
        let m = BTreeMap::from([(1, 5u64), (2, 1), (3, 9), (4, 7), (5, 3)]);
        assert_eq!(
            Quorum::majority([1, 2, 3, 4, 5]).commit_point(|n| m[&n]),
            Some(5)
        );
        // Four voters (9, 7, 5, 1): the third largest, as two is not a majority.
        assert_eq!(
            Quorum::majority([1, 2, 3, 4]).commit_point(|n| m[&n]),
            Some(5)
        );
        assert_eq!(
            Quorum::majority([2, 3, 4, 5]).commit_point(|n| m[&n]),
            Some(3)
        );
        assert_eq!(Quorum::majority([3]).commit_point(|n| m[&n]), Some(9));
    }

    #[test]
    fn a_joint_commit_point_is_the_smallest_of_the_sets() {
        // Old voters {1, 2, 3} far ahead, the new voter 4 still catching up: the new set
        // {1, 2, 4} holds 100 on a majority (1 and 2), the old holds 150 (1 and 3).
        let m = BTreeMap::from([(1, 200u64), (2, 100), (3, 150), (4, 10)]);
        let q = Quorum::joint([1, 2, 4], [1, 2, 3]);
        assert_eq!(q.commit_point(|n| m[&n]), Some(100));
        assert_eq!(
            Quorum::majority([1, 2, 4]).commit_point(|n| m[&n]),
            Some(100)
        );
        assert_eq!(
            Quorum::majority([1, 2, 3]).commit_point(|n| m[&n]),
            Some(150)
        );
        // A point is only as high as the lagging set allows.
        let q = Quorum::joint([4, 5, 6], [1, 2, 3]);
        let m = BTreeMap::from([(1, 9u64), (2, 9), (3, 9), (4, 2), (5, 3), (6, 1)]);
        assert_eq!(q.commit_point(|n| m[&n]), Some(2));
    }

    /// Voter sets of up to seven distinct nodes out of 1..=9, one or two of them.
    fn quorums() -> impl Strategy<Value = Quorum> {
        let set = proptest::collection::btree_set(1u64..10, 0..8)
            .prop_map(|s| s.into_iter().collect::<Vec<NodeId>>());
        (set.clone(), proptest::option::of(set)).prop_map(|(new, old)| match old {
            Some(old) => Quorum::joint(new, old),
            None => Quorum::majority(new),
        })
    }

    proptest! {
        /// The commit point is exactly the largest position whose holders form a quorum,
        /// and nothing is reached when no position is.
        #[test]
        fn the_commit_point_is_the_largest_position_a_quorum_holds(
            q in quorums(),
            matched in proptest::collection::vec(0u64..6, 10),
        ) {
            let m = |n: NodeId| matched[n as usize];
            let reached = |p: u64| q.is_reached(|n| m(n) >= p);
            let best = (0..6).filter(|p| reached(*p)).max();
            prop_assert_eq!(q.commit_point(m), best);
        }

        /// Adding acknowledgements never loses a quorum, and a quorum of a joint stage is
        /// a quorum of each stage alone.
        #[test]
        fn quorums_are_monotone_and_joint_ones_cover_each_stage(
            q in quorums(),
            acks in proptest::collection::btree_set(1u64..10, 0..10),
            more in proptest::collection::btree_set(1u64..10, 0..10),
        ) {
            let all: BTreeSet<NodeId> = acks.union(&more).copied().collect();
            if q.reached_by(&acks) {
                prop_assert!(q.reached_by(&all));
            }
            let each = q.sets().iter().all(|s| Quorum::majority(s.clone()).reached_by(&acks));
            prop_assert_eq!(q.reached_by(&acks), each);
        }

        /// Any two quorums of the same voters intersect in a voter of every set: what one
        /// decided, the other sees (the reason a majority is enough).
        #[test]
        fn two_quorums_meet_in_every_set(
            q in quorums(),
            a in proptest::collection::btree_set(1u64..10, 0..10),
            b in proptest::collection::btree_set(1u64..10, 0..10),
        ) {
            if q.reached_by(&a) && q.reached_by(&b) {
                for set in q.sets() {
                    prop_assert!(set.iter().any(|n| a.contains(n) && b.contains(n)));
                }
            }
        }
    }
}
