//! Applying an out-of-order group's released entries on the environment's shared apply
//! workers (DP-Raft section 4.3: followers apply independent entries in parallel).
//!
//! The replica only releases together entries that do not conflict; a job calls the
//! state machine and reports the slot back to the driver, which then releases what waited
//! on it. A group entry's WAW rule is that of the union of its records' writes, so with
//! two or more pieces allowed ([`super::OooNodeConfig::apply_threads`]) a job also cuts
//! the entry it takes into pieces — at most that many, each a union of whole independent
//! sets (records that write nothing in common with the rest), balanced by size — and
//! submits all but one as jobs of their own; the last piece applied reports the slot (the
//! countdown is [`crate::applyq::Countdown`], checked with loom). Without that, a group
//! holding one write of a hot key would apply its ~20 records one after another while
//! every later group writing that key waited.

use std::sync::Arc;

use chorus_core::ooo::group::{self, Record};
use chorus_core::ooo::replica::Entry;

use super::driver::Jobs;
use super::{Ev, OooStateMachine};
use crate::applyq::Countdown;

/// What a group's apply jobs need.
pub(super) struct ApplyCtx<J: Jobs> {
    pub sm: Arc<dyn OooStateMachine>,
    pub jobs: J,
    /// Pieces an entry may be cut into (at least 1).
    pub pieces: usize,
}

impl<J: Jobs> ApplyCtx<J> {
    /// Applies a released entry on the apply workers; the slot is reported applied (or the
    /// state machine failed) as an event.
    pub fn submit(self: &Arc<Self>, e: Entry) {
        self.submit_work(ApplyWork::Entry(e));
    }

    fn submit_work(self: &Arc<Self>, w: ApplyWork) {
        let me = self.clone();
        self.jobs.submit(Box::new(move || {
            let push = |w| me.submit_work(w);
            if let Some(ev) = apply_work(&*me.sm, &push, w, me.pieces) {
                me.jobs.post(ev);
            }
        }));
    }
}

/// Decodes a committed entry's group and applies its records; a failure names the slot.
pub(super) fn apply_entry(sm: &dyn OooStateMachine, e: &Entry) -> Result<(), String> {
    if e.is_null() {
        return Ok(());
    }
    let records = group::records(e).map_err(|err| format!("slot {}: {err}", e.seq))?;
    let placed: Vec<(u32, Record)> = (0u32..).zip(records).collect();
    guarded(|| sm.apply(e.seq, &placed)).map_err(|err| format!("applying slot {}: {err}", e.seq))
}

/// Runs a state-machine call, turning a panic in it into an error: the group stops (its
/// state would no longer follow the log), the shared worker goes on.
pub(super) fn guarded<T>(f: impl FnOnce() -> std::io::Result<T>) -> std::io::Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let what = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".into());
        Err(std::io::Error::other(format!(
            "the state machine panicked: {what}"
        )))
    })
}

/// Work for the apply pool.
enum ApplyWork {
    /// An entry the replica released.
    Entry(Entry),
    /// One piece of an entry a worker cut up ([`group::pieces`]), its records with their
    /// places.
    Piece(Arc<SplitEntry>, Vec<(u32, Record)>),
}

/// An entry whose pieces are applied by several workers: the worker that applies its
/// last piece reports the slot applied.
struct SplitEntry {
    seq: u64,
    left: Countdown,
}

/// Applies one piece of work on an apply worker; returns what to tell the driver, if
/// anything (a piece that is not its entry's last says nothing). With `pieces` of two or
/// more (the pool's size), an entry whose records form several independent sets is cut
/// into at most that many pieces ([`group::pieces`]: unions of whole sets, so no two
/// pieces write the same block or key, balanced by record count): this worker applies
/// the first and submits the others for the free workers. One piece per worker, not one
/// per set, bounds the queue hand-offs per entry by the pool's size (at high load nearly
/// every record of an entry is its own set); the two measured the same
/// (`docs/benchmarks/apply-cost.md`).
fn apply_work(
    sm: &dyn OooStateMachine,
    queue: &dyn Fn(ApplyWork),
    w: ApplyWork,
    pieces: usize,
) -> Option<Ev> {
    let (seq, piece, parent) = match w {
        ApplyWork::Entry(e) => {
            if e.is_null() || pieces < 2 {
                return Some(match apply_entry(sm, &e) {
                    Ok(()) => Ev::Applied(e.seq),
                    Err(err) => Ev::SmFailed(err),
                });
            }
            let records = match group::records(&e) {
                Ok(r) => r,
                Err(err) => return Some(Ev::SmFailed(format!("slot {}: {err}", e.seq))),
            };
            let cut = group::pieces(group::independent_sets(&records), pieces);
            let mut slots: Vec<Option<Record>> = records.into_iter().map(Some).collect();
            let mut cut = cut.into_iter().map(|places| {
                places
                    .into_iter()
                    .map(|i| (i as u32, slots[i].take().expect("each record in one piece")))
                    .collect::<Vec<_>>()
            });
            let first = cut.next().unwrap_or_default();
            let rest: Vec<_> = cut.collect();
            if rest.is_empty() {
                (e.seq, first, None)
            } else {
                let parent = Arc::new(SplitEntry {
                    seq: e.seq,
                    left: Countdown::new(rest.len() + 1),
                });
                for piece in rest {
                    queue(ApplyWork::Piece(parent.clone(), piece));
                }
                (e.seq, first, Some(parent))
            }
        }
        ApplyWork::Piece(parent, piece) => (parent.seq, piece, Some(parent)),
    };
    if let Err(err) = guarded(|| sm.apply(seq, &piece)) {
        return Some(Ev::SmFailed(format!("applying slot {seq}: {err}")));
    }
    match parent {
        Some(p) if !p.left.done() => None,
        _ => Some(Ev::Applied(seq)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::applyq::WorkQueue;
    use chorus_core::format::ooo::encode_group;
    use chorus_core::ooo::replica::{Declared, Mode};
    use std::collections::HashMap;
    use std::sync::Mutex;

    /// A key-value map that notes each record's place as it applies it.
    #[derive(Default)]
    struct Kv {
        map: Mutex<HashMap<u64, Vec<u8>>>,
        places: Mutex<Vec<u32>>,
    }

    impl OooStateMachine for Kv {
        fn apply(&self, _slot: u64, records: &[(u32, Record)]) -> std::io::Result<()> {
            assert!(
                records.windows(2).all(|w| w[0].0 < w[1].0),
                "a call's records in group order"
            );
            for (i, r) in records {
                if let Declared::Txn { write_set, .. } = &r.declared {
                    for k in write_set {
                        self.map.lock().unwrap().insert(*k, r.data.clone());
                    }
                }
                self.places.lock().unwrap().push(*i);
            }
            Ok(())
        }
        fn checkpoint(&self) -> std::io::Result<()> {
            Ok(())
        }
        fn image(&self) -> std::io::Result<Vec<u8>> {
            Ok(Vec::new())
        }
        fn restore(&self, _: &[u8]) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A group entry cut into pieces, applied in the worst order the pool allows (the
    /// worker's own piece first, then the queued pieces last first), ends in the state of
    /// applying the group in order; every record is applied once, and the slot is
    /// reported applied once, by its last piece. Every fifth record writes hot key 0
    /// (a chain through the group) and every seventh key 1.
    #[test]
    fn a_split_entry_applies_like_its_group_in_order() {
        let records: Vec<Record> = (0..40u64)
            .map(|i| {
                let mut write_set = vec![100 + i];
                if i % 5 == 0 {
                    write_set.push(0);
                }
                if i % 7 == 0 {
                    write_set.push(1);
                }
                Record {
                    declared: Declared::Txn {
                        read_set: vec![0],
                        write_set,
                    },
                    data: i.to_le_bytes().to_vec(),
                }
            })
            .collect();
        let Declared::Txn { write_set, .. } = group::union(Mode::Dependent, &records) else {
            unreachable!("a dependent union")
        };
        let entry = Entry {
            seq: 9,
            term: 1,
            start: 0,
            eid: 1,
            body: chorus_core::ooo::replica::Body::Dependent {
                base: 0,
                deps: Default::default(),
                write_set,
                data: encode_group(&records).into(),
            },
        };
        let serial = Kv::default();
        assert!(matches!(
            apply_work(&serial, &|_| {}, ApplyWork::Entry(entry.clone()), 1),
            Some(Ev::Applied(9))
        ));
        assert_eq!(
            *serial.places.lock().unwrap(),
            (0..40).collect::<Vec<u32>>()
        );

        // With as many pieces as it can use, each set is its own piece: the worker kept
        // the set of record 0 (the 12 records 0, 5, 7, 10, 14, 15, 20, 21, 25, 28, 30, 35
        // chain through keys 0 and 1), the other 28 are alone. With 4 pieces, the chain is
        // one and the 28 are spread over three others.
        for (pieces, queued_pieces) in [(64, 28), (4, 3)] {
            let split = Kv::default();
            let queue = WorkQueue::default();
            let push = |w| queue.push(w);
            assert!(apply_work(&split, &push, ApplyWork::Entry(entry.clone()), pieces).is_none());
            let mut queued = Vec::new();
            while let Some(w) = queue.try_pop() {
                queued.push(w);
            }
            assert_eq!(queued.len(), queued_pieces, "{pieces} pieces");
            let mut reports = Vec::new();
            for w in queued.into_iter().rev() {
                reports.push(apply_work(&split, &push, w, pieces));
            }
            let (last, others) = reports.split_last().unwrap();
            assert!(others.iter().all(Option::is_none));
            assert!(matches!(last, Some(Ev::Applied(9))));
            assert_eq!(*split.map.lock().unwrap(), *serial.map.lock().unwrap());
            let mut places = split.places.lock().unwrap().clone();
            places.sort_unstable();
            assert_eq!(places, (0..40).collect::<Vec<u32>>());
        }
    }
}
