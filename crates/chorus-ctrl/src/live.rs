//! Chunk servers' liveness from their heartbeats (PolarFS section 3.2.3, duty 1: "keeping
//! track of the membership and liveness of all ChunkServers").
//!
//! Liveness is not in the control log: it changes with every heartbeat, and a new control
//! leader relearns it within one heartbeat period. Only its consequences are logged — a
//! [`crate::Command::StartMove`] off a node down longer than the migration threshold
//! (section 3.2.2: wait for a briefly disconnected server to rejoin, migrate off one
//! with a lasting fault). The caller supplies a monotonic clock in milliseconds, so the
//! type is pure and testable.

use std::collections::{BTreeMap, BTreeSet};

use crate::meta::NodeId;

/// The last heartbeat heard from each node, and how long a silence means down.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Liveness {
    /// The latest heartbeat time heard from each node (monotonic ms; never goes back).
    last_ms: BTreeMap<NodeId, u64>,
    /// A node silent for this long or longer is down.
    down_after_ms: u64,
}

impl Liveness {
    /// No node heard from yet; a node is down once silent for `down_after_ms`.
    pub fn new(down_after_ms: u64) -> Self {
        Self {
            last_ms: BTreeMap::new(),
            down_after_ms,
        }
    }

    /// A heartbeat from `node` at `now_ms`. An older time than one already heard (a
    /// delayed heartbeat) is ignored, so liveness never moves back.
    pub fn heartbeat(&mut self, node: NodeId, now_ms: u64) {
        let last = self.last_ms.entry(node).or_insert(now_ms);
        *last = (*last).max(now_ms);
    }

    /// Whether `node` was heard from less than `down_after_ms` before `now_ms`. A node
    /// never heard from is not live.
    pub fn is_live(&self, node: NodeId, now_ms: u64) -> bool {
        self.last_ms
            .get(&node)
            .is_some_and(|&last| now_ms.saturating_sub(last) < self.down_after_ms)
    }

    /// How long `node` has been unavailable at `now_ms`: `None` if never heard from, 0 if
    /// live, else the time since its last heartbeat (it became unavailable then; the
    /// threshold only delays the verdict). Compare with a migration threshold to decide
    /// a fault is lasting (section 3.2.2).
    pub fn down_for_ms(&self, node: NodeId, now_ms: u64) -> Option<u64> {
        let last = *self.last_ms.get(&node)?;
        let silent_ms = now_ms.saturating_sub(last);
        Some(if silent_ms < self.down_after_ms {
            0
        } else {
            silent_ms
        })
    }

    /// Every node live at `now_ms`.
    pub fn live_set(&self, now_ms: u64) -> BTreeSet<NodeId> {
        self.last_ms
            .keys()
            .copied()
            .filter(|&n| self.is_live(n, now_ms))
            .collect()
    }

    /// Forgets `node` (removed for good): it is no longer reported at all.
    pub fn forget(&mut self, node: NodeId) {
        self.last_ms.remove(&node);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_heard_is_not_live() {
        let l = Liveness::new(1000);
        assert!(!l.is_live(1, 0));
        assert_eq!(l.down_for_ms(1, 5000), None);
        assert!(l.live_set(0).is_empty());
    }

    #[test]
    fn live_until_threshold_then_down_since_last_heartbeat() {
        let mut l = Liveness::new(1000);
        l.heartbeat(1, 100);
        l.heartbeat(2, 500);
        assert!(l.is_live(1, 1099));
        assert_eq!(l.down_for_ms(1, 1099), Some(0));
        assert!(!l.is_live(1, 1100));
        assert_eq!(l.down_for_ms(1, 1100), Some(1000));
        assert_eq!(l.down_for_ms(1, 3100), Some(3000));
        assert_eq!(l.live_set(1100), BTreeSet::from([2]));
    }

    #[test]
    fn late_heartbeat_does_not_move_back() {
        let mut l = Liveness::new(1000);
        l.heartbeat(1, 5000);
        l.heartbeat(1, 100);
        assert!(l.is_live(1, 5500));
        // A clock read before the heartbeat (callers racing) counts as no silence.
        assert!(l.is_live(1, 4000));
    }

    #[test]
    fn forget_drops_the_node() {
        let mut l = Liveness::new(1000);
        l.heartbeat(1, 0);
        l.forget(1);
        assert!(!l.is_live(1, 0));
        assert_eq!(l.down_for_ms(1, 0), None);
    }
}
