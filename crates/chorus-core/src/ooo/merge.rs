//! What a new leader does with the quorum's versions of each slot before it serves: the
//! merge stage of ParallelRaft (PolarFS section 5.3) and the pre-leader merge of DP-Raft
//! (section 4.4, Fig. 4).
//!
//! For every slot from the first one the candidate has not seen committed up to the
//! highest one any answering replica holds, each answering replica reports its version
//! (or a hole). The decision follows DP-Raft's Fig. 4, which is ParallelRaft's three
//! conditions spelled out per case:
//!
//! | candidate holds it? | committed? | other replicas | decision | case |
//! |---|---|---|---|---|
//! | yes | yes, here | – | keep ours | 1 |
//! | yes | yes, elsewhere | – | take the committed version | 2 |
//! | yes | no | all hold nothing | keep ours | 3 |
//! | yes | no | some hold a version | the version with the highest term | 4 |
//! | no | yes, elsewhere | – | take the committed version | 5 |
//! | no | no | all hold nothing | NULL: no entry here | 6 |
//! | no | no | some hold a version | the version with the highest term | 7 |
//!
//! Two rules beyond the papers' tables:
//!
//! - **The ghost guard.** A NULL decision is not a gap left in the log: the new leader
//!   writes a NULL entry stamped with *its own* term into the slot and commits it (with
//!   every kept entry) before serving. Gu et al. ("Raft with out-of-order executions")
//!   show what happens otherwise: a slot left empty can later meet, in another quorum, an
//!   old uncommitted version held by a replica that missed this merge; case 7 then
//!   resurrects it — a *ghost entry* — after its appender was told it failed and after
//!   later entries to the same blocks applied. A committed NULL at a higher term wins
//!   every later merge (cases 2/5, or the highest term in 4/7). [`MergeOptions`] can turn
//!   the guard off only in the test-only `broken` build, to show the anomaly.
//! - **NULLs cascade along commit dependencies.** An entry kept uncommitted (cases 3, 4,
//!   7) whose listed predecessor became NULL becomes NULL too. In dependent mode the list
//!   is its RAW predecessors: it read a value that never existed (DP-Raft section 3:
//!   committing it would be a dirty read). In parallel mode under conflict order it is the
//!   overlapping slots its leader made it wait for (the DP-Raft paper's adaptation of
//!   ParallelRaft, section 5): it may commit only after them, so it cannot commit if they
//!   never do. A committed entry never has a NULL predecessor, because it committed only
//!   after its predecessors did. The cascade follows whatever lists the entries carry,
//!   whatever the merging replica's own configuration: the leader that wrote them decided.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::Seq;
use crate::format::meta::NodeId;

/// One replica's version of a slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Version {
    /// The term (proposal id) of the leader that wrote it.
    pub term: u64,
    /// Identity of the contents (e.g. their checksum); versions with the same term and
    /// slot always have the same contents.
    pub id: u64,
    /// A NULL entry: a merge decided no entry exists here.
    pub null: bool,
    /// Whether this replica knows the slot committed.
    pub committed: bool,
    /// The predecessors it commits only after: RAW predecessors in dependent mode, the
    /// overlapping slots it waited for in parallel mode under conflict order (empty
    /// otherwise).
    pub after: Vec<Seq>,
}

/// Which row of the table in the module docs decided a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Case {
    /// Held and committed here.
    LocalCommitted = 1,
    /// Held here uncommitted, committed elsewhere.
    CommittedElsewhere = 2,
    /// Held here uncommitted, nobody else holds it.
    OnlyLocal = 3,
    /// Held here uncommitted, others hold versions: highest term.
    HighestTermWithLocal = 4,
    /// Not held here, committed elsewhere.
    MissingCommittedElsewhere = 5,
    /// Nobody holds it.
    Nowhere = 6,
    /// Not held here, others hold uncommitted versions: highest term.
    HighestTermElsewhere = 7,
}

/// What the merge decided for a slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// This version, as held by `from`.
    Entry {
        /// A replica that holds it (the candidate itself when it does).
        from: NodeId,
        /// The version.
        version: Version,
    },
    /// No entry: `written` is the NULL entry the leader writes (stamped with its term),
    /// or `None` when the ghost guard is off (`broken` builds only).
    Null {
        /// The NULL entry to write and commit.
        written: Option<Version>,
    },
}

/// One slot's decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotDecision {
    /// The slot.
    pub seq: Seq,
    /// The row of the table that applied.
    pub case: Case,
    /// The version was kept by cases 3/4/7 but a predecessor it lists
    /// ([`Version::after`]) became NULL, so it became NULL as well.
    pub cascaded: bool,
    /// The outcome.
    pub outcome: Outcome,
}

/// How to merge.
#[derive(Clone, Copy, Debug)]
pub struct MergeOptions {
    /// The merging leader's term: NULL entries are stamped with it.
    pub term: u64,
    /// Write NULL entries (the ghost guard). Only the `broken` build can turn it off.
    ghost_guard: bool,
    /// Cascade NULLs along [`Version::after`]. Only the `broken` build can turn it off.
    cascade: bool,
}

impl MergeOptions {
    /// Options for a leader of `term`.
    pub fn new(term: u64) -> Self {
        Self {
            term,
            ghost_guard: true,
            cascade: true,
        }
    }

    /// Turns the NULL cascade off, to show what it prevents. Test-only.
    #[cfg(feature = "broken")]
    pub fn without_cascade(mut self) -> Self {
        self.cascade = false;
        self
    }

    /// Turns the ghost guard off, to show the anomaly it prevents. Test-only.
    #[cfg(feature = "broken")]
    pub fn without_ghost_guard(mut self) -> Self {
        self.ghost_guard = false;
        self
    }
}

/// The second half of the ghost guard: drops versions that a later leader has already
/// superseded, before the table is applied.
///
/// A leader of term `T` decides every slot below `starts[T]` (the first slot after its
/// merge) by its merge, and writes its own entries from `starts[T]` on. An uncommitted
/// version of an older term at a slot `p >= starts[T]` was not held by any replica of
/// `T`'s merge quorum, so it was never committed and never can be under its own term; and
/// it was admitted against its own leader's versions of the slots before it (block ranges
/// in its look-behind buffer, predecessors in its dependencies), which `T` may have
/// decided differently. Case 7 would resurrect it anyway — Gu et al.'s ghost, here with
/// the dependencies of later entries broken rather than a failed entry revived. So every
/// such version is dropped, as Raft's new leader truncates a follower's conflicting
/// suffix. A version kept therefore has every predecessor decided as its own leader saw
/// it or NULL (NULLs then cascade to RAW dependents in dependent mode).
///
/// Committed versions are never dropped: a version committed at `p` under term `L` was
/// held by a majority in term `L`, so the merge quorum of any later `T` saw it and
/// `starts[T] > p`.
///
/// `starts` maps the terms the answering replicas know of (from the entries they hold and
/// the newest leader each accepted) to their leaders' starts. Returns how many versions
/// were dropped.
pub fn drop_superseded(answers: &mut Answers, starts: &BTreeMap<u64, Seq>) -> usize {
    let mut dropped = 0;
    for (&p, views) in answers.iter_mut() {
        // The newest term whose leader wrote from a slot at or before `p`.
        let Some(cover) = starts
            .iter()
            .filter(|(_, &start)| start <= p)
            .map(|(&t, _)| t)
            .max()
        else {
            continue;
        };
        for (_, v) in views.iter_mut() {
            if v.as_ref()
                .is_some_and(|ver| ver.term < cover && !ver.committed)
            {
                *v = None;
                dropped += 1;
            }
        }
    }
    dropped
}

/// Decides one slot. `local` is the candidate's version; `others` the versions (or holes)
/// of the other answering replicas.
pub fn merge_slot(
    me: NodeId,
    local: Option<&Version>,
    others: &[(NodeId, Option<Version>)],
    opts: &MergeOptions,
) -> (Case, Outcome) {
    let committed_elsewhere = others
        .iter()
        .filter_map(|(n, v)| v.as_ref().map(|v| (*n, v)))
        .find(|(_, v)| v.committed);
    let any_other = others.iter().any(|(_, v)| v.is_some());
    match local {
        Some(l) if l.committed => (
            Case::LocalCommitted,
            Outcome::Entry {
                from: me,
                version: l.clone(),
            },
        ),
        Some(_) | None if committed_elsewhere.is_some() => {
            let (n, v) = committed_elsewhere.expect("checked");
            let case = if local.is_some() {
                Case::CommittedElsewhere
            } else {
                Case::MissingCommittedElsewhere
            };
            (
                case,
                Outcome::Entry {
                    from: n,
                    version: v.clone(),
                },
            )
        }
        Some(l) if !any_other => (
            Case::OnlyLocal,
            Outcome::Entry {
                from: me,
                version: l.clone(),
            },
        ),
        Some(l) => {
            let it = std::iter::once((me, l)).chain(
                others
                    .iter()
                    .filter_map(|(n, v)| v.as_ref().map(|v| (*n, v))),
            );
            (
                Case::HighestTermWithLocal,
                highest(it).expect("the local version"),
            )
        }
        None if !any_other => (Case::Nowhere, null_outcome(opts)),
        None => {
            let it = others
                .iter()
                .filter_map(|(n, v)| v.as_ref().map(|v| (*n, v)));
            (
                Case::HighestTermElsewhere,
                highest(it).expect("some version"),
            )
        }
    }
}

/// A NULL decision: with the ghost guard, the NULL entry stamped with the merging
/// leader's term that it writes and commits before serving.
fn null_outcome(opts: &MergeOptions) -> Outcome {
    Outcome::Null {
        written: opts.ghost_guard.then(|| Version {
            term: opts.term,
            id: 0,
            null: true,
            committed: false,
            after: Vec::new(),
        }),
    }
}

/// The version with the highest term; on a tie (the same term means the same entry) the
/// first one, which is the candidate's own when it holds one.
fn highest<'a>(cands: impl Iterator<Item = (NodeId, &'a Version)>) -> Option<Outcome> {
    let mut best: Option<(NodeId, &Version)> = None;
    for (n, v) in cands {
        if best.is_none_or(|(_, b)| v.term > b.term) {
            best = Some((n, v));
        }
    }
    best.map(|(n, v)| Outcome::Entry {
        from: n,
        version: v.clone(),
    })
}

/// The answers of a quorum: for each slot, each answering replica's version or hole.
/// Every replica that answered appears in every slot (a hole is `None`).
pub type Answers = BTreeMap<Seq, Vec<(NodeId, Option<Version>)>>;

/// Merges every slot of `answers` for candidate `me`, ascending, cascading NULLs along
/// the predecessors each version lists.
pub fn merge(me: NodeId, answers: &Answers, opts: &MergeOptions) -> Vec<SlotDecision> {
    let mut out: Vec<SlotDecision> = Vec::with_capacity(answers.len());
    let mut nulls = std::collections::BTreeSet::new();
    for (&seq, views) in answers {
        let local = views
            .iter()
            .find(|(n, _)| *n == me)
            .and_then(|(_, v)| v.as_ref());
        let others: Vec<(NodeId, Option<Version>)> =
            views.iter().filter(|(n, _)| *n != me).cloned().collect();
        let (case, mut outcome) = merge_slot(me, local, &others, opts);
        let mut cascaded = false;
        if opts.cascade {
            if let Outcome::Entry { version, .. } = &outcome {
                let kept_uncommitted = matches!(
                    case,
                    Case::OnlyLocal | Case::HighestTermWithLocal | Case::HighestTermElsewhere
                ) && !version.committed;
                if kept_uncommitted && version.after.iter().any(|r| nulls.contains(r)) {
                    cascaded = true;
                    outcome = null_outcome(opts);
                }
            }
        }
        let is_null = match &outcome {
            Outcome::Null { .. } => true,
            Outcome::Entry { version, .. } => version.null,
        };
        if is_null {
            nulls.insert(seq);
        }
        out.push(SlotDecision {
            seq,
            case,
            cascaded,
            outcome,
        });
    }
    out
}

/// The decisions as a table, one line per slot (for golden scenario tests and logs).
pub fn render(decisions: &[SlotDecision]) -> String {
    let mut s = String::new();
    for d in decisions {
        let what = match &d.outcome {
            Outcome::Entry { from, version } => format!(
                "entry of term {} from S{}{}{}",
                version.term,
                from,
                if version.committed { ", committed" } else { "" },
                if version.null { " (NULL)" } else { "" }
            ),
            Outcome::Null { written: Some(v) } => {
                format!("NULL, written at term {}", v.term)
            }
            Outcome::Null { written: None } => "NULL, left empty (no ghost guard)".into(),
        };
        let _ = writeln!(
            s,
            "entry {}: case {} -> {}{}",
            d.seq,
            d.case as u8,
            what,
            if d.cascaded {
                " (a predecessor it commits after became NULL)"
            } else {
                ""
            }
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(term: u64, committed: bool) -> Option<Version> {
        Some(Version {
            term,
            id: term * 1000,
            null: false,
            committed,
            after: Vec::new(),
        })
    }

    #[test]
    fn every_case_of_fig4() {
        let o = MergeOptions::new(9);
        let case = |local: Option<Version>, others: Vec<Option<Version>>| {
            let others: Vec<_> = others
                .into_iter()
                .enumerate()
                .map(|(i, v)| (i as NodeId + 2, v))
                .collect();
            merge_slot(1, local.as_ref(), &others, &o)
        };
        assert_eq!(
            case(v(2, true), vec![None, v(3, false)]).0,
            Case::LocalCommitted
        );
        let (c, out) = case(v(2, false), vec![v(3, true), None]);
        assert_eq!(c, Case::CommittedElsewhere);
        assert!(matches!(out, Outcome::Entry { from: 2, ref version } if version.term == 3));
        assert_eq!(case(v(2, false), vec![None, None]).0, Case::OnlyLocal);
        let (c, out) = case(v(2, false), vec![v(4, false), v(3, false)]);
        assert_eq!(c, Case::HighestTermWithLocal);
        assert!(matches!(out, Outcome::Entry { from: 2, ref version } if version.term == 4));
        let (c, out) = case(v(3, false), vec![v(3, false), v(2, false)]);
        assert_eq!(c, Case::HighestTermWithLocal);
        assert!(
            matches!(out, Outcome::Entry { from: 1, .. }),
            "a tie keeps ours"
        );
        assert_eq!(
            case(None, vec![v(2, true), None]).0,
            Case::MissingCommittedElsewhere
        );
        let (c, out) = case(None, vec![None, None]);
        assert_eq!(c, Case::Nowhere);
        assert!(matches!(out, Outcome::Null { written: Some(ref w) } if w.term == 9 && w.null));
        let (c, out) = case(None, vec![v(2, false), v(5, false)]);
        assert_eq!(c, Case::HighestTermElsewhere);
        assert!(matches!(out, Outcome::Entry { from: 3, .. }));
    }

    #[test]
    fn versions_a_newer_leader_replaced_are_dropped_unless_committed() {
        // Term 3's leader wrote its own entries from slot 5 on. An uncommitted term-2
        // version at slot 7 is dead; a committed one at 7 and anything below 5 stay.
        let mut a = Answers::new();
        a.insert(4, vec![(1, v(2, false)), (2, None)]);
        a.insert(7, vec![(1, v(2, false)), (2, v(2, true))]);
        a.insert(8, vec![(1, v(3, false)), (2, v(2, false))]);
        let starts = BTreeMap::from([(2, 0), (3, 5)]);
        assert_eq!(drop_superseded(&mut a, &starts), 2);
        assert!(a[&4][0].1.is_some(), "below term 3's start");
        assert!(
            a[&7][0].1.is_none() && a[&7][1].1.is_some(),
            "committed stays"
        );
        assert!(a[&8][0].1.is_some() && a[&8][1].1.is_none());
    }

    proptest::proptest! {
        /// Whatever the quorum holds, no entry the merge keeps uncommitted lists a slot it
        /// decided NULL, directly or through a chain of lists; and without lists nothing
        /// cascades.
        #[test]
        fn no_kept_entry_lists_a_null_slot(
            rows in proptest::collection::vec(
                proptest::collection::vec(
                    proptest::option::of((1u64..4, proptest::bool::ANY, proptest::collection::vec(0u64..12, 0..3))),
                    3,
                ),
                1..12,
            )
        ) {
            let mut answers = Answers::new();
            for (seq, row) in rows.iter().enumerate() {
                let seq = seq as Seq;
                let views = row
                    .iter()
                    .enumerate()
                    .map(|(n, v)| {
                        let v = v.as_ref().map(|(term, committed, after)| Version {
                            term: *term,
                            id: *term * 100 + seq,
                            null: false,
                            // Committed versions list nothing the cascade could touch.
                            committed: *committed && after.is_empty(),
                            after: after.iter().copied().filter(|&p| p < seq).collect(),
                        });
                        (n as NodeId + 1, v)
                    })
                    .collect();
                answers.insert(seq, views);
            }
            let d = merge(1, &answers, &MergeOptions::new(9));
            let null: std::collections::BTreeSet<Seq> = d
                .iter()
                .filter(|x| matches!(x.outcome, Outcome::Null { .. }))
                .map(|x| x.seq)
                .collect();
            for x in &d {
                if let Outcome::Entry { version, .. } = &x.outcome {
                    let ok = version.committed || !version.after.iter().any(|p| null.contains(p));
                    let seq = x.seq;
                    proptest::prop_assert!(ok, "slot {} kept although it lists a NULL slot", seq);
                }
                let ok = !x.cascaded || matches!(x.outcome, Outcome::Null { .. });
                proptest::prop_assert!(ok);
            }
        }
    }

    #[test]
    fn nulls_cascade_to_the_entries_that_list_them() {
        let mut answers = Answers::new();
        // Slot 1: nobody holds it -> NULL. Slot 2: only we hold it, it commits after slot
        // 1 (read it, or waited for it). Slot 3: the same, but lists nothing. Slot 4:
        // lists slot 2, so the NULL cascades on.
        answers.insert(1, vec![(1, None), (2, None)]);
        let after = |slots: Vec<Seq>| {
            let mut x = v(3, false);
            x.as_mut().expect("some").after = slots;
            x
        };
        answers.insert(2, vec![(1, after(vec![1])), (2, None)]);
        answers.insert(3, vec![(1, v(3, false)), (2, None)]);
        answers.insert(4, vec![(1, None), (2, after(vec![2]))]);
        let d = merge(1, &answers, &MergeOptions::new(4));
        assert_eq!(d[1].case, Case::OnlyLocal);
        assert!(d[1].cascaded);
        assert!(matches!(d[1].outcome, Outcome::Null { .. }));
        assert!(!d[2].cascaded, "an entry listing nothing is kept");
        assert!(matches!(d[2].outcome, Outcome::Entry { .. }));
        assert_eq!(d[3].case, Case::HighestTermElsewhere);
        assert!(d[3].cascaded, "the cascade goes on along the lists");
        // A committed version is never touched (it committed after its predecessors).
        let mut committed = after(vec![1]);
        committed.as_mut().expect("some").committed = true;
        answers.insert(2, vec![(1, committed), (2, None)]);
        let d = merge(1, &answers, &MergeOptions::new(4));
        assert!(!d[1].cascaded && matches!(d[1].outcome, Outcome::Entry { .. }));
    }
}
