//! Committed slots and applies. A slot is marked committed only where this replica holds
//! it (an observer sees it, a pending append learns its outcome: committed if the slot
//! holds its identity, failed otherwise, PALF section 4.1), and only committed slots enter
//! the apply rules: the look-behind buffer of ParallelRaft (PolarFS section 5.2, apply
//! with holes in the log) or DP-Raft's WAW predecessors (section 4.3, Algorithm 1). The
//! entries they release are mutually independent, so a driver may apply them on several
//! threads.

use super::{Action, Body, Entry, Mode, OooReplica};
use crate::ooo::dependent::{DepApplier, DepEntry};
use crate::ooo::parallel::{ParallelApplier, Stamped};
use crate::ooo::{OooError, Seq};
use crate::replica::Outcome;

/// The apply rules of the group's mode, fed committed entries only.
#[derive(Debug)]
pub(super) enum Applier {
    /// ParallelRaft's look-behind buffers.
    Parallel(ParallelApplier),
    /// DP-Raft's WAW predecessors.
    Dependent(DepApplier<u64>),
}

/// Slots tracked past the apply head. Committed slots only enter the appliers, and the
/// leader's window bounds how far commits run ahead of a hole.
const APPLY_LIMIT: u64 = 1 << 24;

impl Applier {
    /// Everything below `head` applied.
    pub(super) fn new(mode: Mode, head: Seq) -> Self {
        match mode {
            Mode::Parallel { span } => {
                Self::Parallel(ParallelApplier::new(span, head, APPLY_LIMIT))
            }
            Mode::Dependent => Self::Dependent(DepApplier::new(head, APPLY_LIMIT)),
        }
    }

    pub(super) fn feed(&mut self, e: &Entry) -> Result<(), OooError> {
        match (self, &e.body) {
            (Self::Parallel(a), Body::Null) => a.skip(e.seq),
            (Self::Dependent(a), Body::Null) => {
                a.skip(e.seq);
                Ok(())
            }
            (
                Self::Parallel(a),
                Body::Parallel {
                    ranges,
                    look_behind,
                    ..
                },
            ) => {
                a.insert(&Stamped {
                    seq: e.seq,
                    ranges: ranges.clone(),
                    look_behind: look_behind.clone(),
                })?;
                a.commit(e.seq);
                Ok(())
            }
            (
                Self::Dependent(a),
                Body::Dependent {
                    base,
                    deps,
                    write_set,
                    ..
                },
            ) => {
                a.insert(DepEntry {
                    seq: e.seq,
                    base: *base,
                    deps: deps.clone(),
                    write_set: write_set.clone(),
                })?;
                a.commit(e.seq);
                Ok(())
            }
            _ => Err(OooError::Malformed {
                seq: e.seq,
                detail: "entry of the other mode".into(),
            }),
        }
    }

    /// Entries released since the last call (each once).
    fn take_ready(&mut self) -> Vec<Seq> {
        match self {
            Self::Parallel(a) => a.take_ready(),
            Self::Dependent(a) => a.take_ready(),
        }
    }

    fn applied(&mut self, seq: Seq) -> Result<(), OooError> {
        match self {
            Self::Parallel(a) => a.applied(seq),
            Self::Dependent(a) => a.applied(seq),
        }
    }

    pub(super) fn head(&self) -> Seq {
        match self {
            Self::Parallel(a) => a.head(),
            Self::Dependent(a) => a.head(),
        }
    }
}

impl OooReplica {
    /// Slots the apply rules wait for (neither held nor skipped), ascending: what
    /// catch-up still has to bring. For diagnostics.
    pub fn apply_holes(&self) -> Vec<Seq> {
        match &self.applier {
            Applier::Parallel(a) => a.holes(),
            Applier::Dependent(a) => a.holes(),
        }
    }

    /// Marks a slot this replica holds committed: observers, the applier, results.
    pub(super) fn mark_committed(&mut self, s: Seq) {
        let Some(slot) = self.log.get_mut(&s) else {
            return;
        };
        if slot.committed {
            return;
        }
        slot.committed = true;
        let e = slot.entry.clone();
        self.commits.commit(s);
        if let Err(why) = self.applier.feed(&e) {
            debug_assert!(false, "committed entry refused by the applier: {why}");
        }
        if let Some(eid) = self.mine.remove(&s) {
            let outcome = if eid == e.eid {
                Outcome::Committed
            } else {
                Outcome::Failed
            };
            self.actions.push(Action::Result {
                eid,
                seq: s,
                outcome,
            });
        }
        self.actions.push(Action::Committed(e));
    }

    pub(super) fn pump_apply(&mut self) {
        if self.install.is_some() || self.installing.is_some() {
            // The state machine is about to be replaced.
            return;
        }
        for s in self.applier.take_ready() {
            if self.applying.insert(s) {
                let e = self.log[&s].entry.clone();
                self.actions.push(Action::Apply(e));
            }
        }
    }

    /// The driver applied `seq` (from an [`Action::Apply`]).
    pub fn applied(&mut self, seq: Seq) -> Result<(), OooError> {
        self.check_invariants();
        if !self.applying.remove(&seq) {
            return Err(OooError::Malformed {
                seq,
                detail: "applied without an Apply action".into(),
            });
        }
        self.applier.applied(seq)?;
        self.try_install();
        self.finish();
        Ok(())
    }
}
