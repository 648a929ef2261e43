//! Exhaustive interleavings of the worker pool's per-group scheduling state
//! (`chorus_runtime::sched`), with `loom`:
//!
//! ```sh
//! cargo test -p chorus-runtime --features loom --test loom --release
//! ```
//!
//! Producers announce work and schedule; a worker runs the group whenever it is queued.
//! In every interleaving: all announced work is taken by some run (no lost wake-up), the
//! group is never queued twice at once, and never runs twice at once.
//!
//! Also the lane's reservations (`chorus_runtime::lane`) and the out-of-order apply
//! pool's queue and piece countdown (`chorus_runtime::applyq`).
#![cfg(feature = "loom")]

use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::sync::{Arc, Mutex};
use loom::thread;

use chorus_runtime::sched::SchedState;

struct Group {
    sched: SchedState,
    work: AtomicUsize,
    running: AtomicBool,
    taken: AtomicUsize,
}

fn run_once(g: &Group) {
    assert!(
        !g.running.swap(true, Ordering::SeqCst),
        "the group runs on two workers at once"
    );
    let w = g.work.swap(0, Ordering::SeqCst);
    g.taken.fetch_add(w, Ordering::SeqCst);
    g.running.store(false, Ordering::SeqCst);
}

fn worker(g: &Group, queue: &Mutex<Vec<()>>) -> bool {
    let popped = queue.lock().unwrap().pop().is_some();
    if !popped {
        return false;
    }
    loop {
        g.sched.begin();
        run_once(g);
        if g.sched.finish() {
            return true;
        }
    }
}

#[test]
fn no_lost_wakeup_no_double_run() {
    // Two producers and two competing workers; a preemption bound keeps the exhaustive
    // search to seconds (bugs of this kind need few preemptions to show).
    let mut model = loom::model::Builder::new();
    model.preemption_bound = Some(3);
    model.check(|| {
        let g = Arc::new(Group {
            sched: SchedState::default(),
            work: AtomicUsize::new(0),
            running: AtomicBool::new(false),
            taken: AtomicUsize::new(0),
        });
        let queue = Arc::new(Mutex::new(Vec::new()));
        let mut producers = Vec::new();
        for _ in 0..2 {
            let (g, queue) = (g.clone(), queue.clone());
            producers.push(thread::spawn(move || {
                g.work.fetch_add(1, Ordering::SeqCst);
                if g.sched.schedule() {
                    let mut q = queue.lock().unwrap();
                    q.push(());
                    assert!(q.len() <= 1, "queued twice");
                }
            }));
        }
        // A second worker competes with the first.
        let (g2, q2) = (g.clone(), queue.clone());
        let other = thread::spawn(move || {
            worker(&g2, &q2);
        });
        worker(&g, &queue);
        for p in producers {
            p.join().unwrap();
        }
        other.join().unwrap();
        // Drain what is left, as the pool's workers would.
        while worker(&g, &queue) {}
        assert_eq!(
            g.taken.load(Ordering::SeqCst),
            2,
            "announced work was never run"
        );
        assert!(!g.sched.is_running());
    });
}

/// A worker that runs the group once and hands it back to the queue instead of letting
/// it go (a pass that ran out of rounds, `chorus_runtime::pass`).
fn requeuing_worker(g: &Group, queue: &Mutex<Vec<()>>) -> bool {
    let popped = queue.lock().unwrap().pop().is_some();
    if !popped {
        return false;
    }
    g.sched.begin();
    run_once(g);
    g.sched.requeue();
    let mut q = queue.lock().unwrap();
    q.push(());
    assert!(q.len() <= 1, "queued twice");
    true
}

#[test]
fn a_requeued_group_loses_no_work_and_is_queued_once() {
    let mut model = loom::model::Builder::new();
    model.preemption_bound = Some(3);
    model.check(|| {
        let g = Arc::new(Group {
            sched: SchedState::default(),
            work: AtomicUsize::new(0),
            running: AtomicBool::new(false),
            taken: AtomicUsize::new(0),
        });
        let queue = Arc::new(Mutex::new(Vec::new()));
        let mut producers = Vec::new();
        for _ in 0..2 {
            let (g, queue) = (g.clone(), queue.clone());
            producers.push(thread::spawn(move || {
                g.work.fetch_add(1, Ordering::SeqCst);
                if g.sched.schedule() {
                    let mut q = queue.lock().unwrap();
                    q.push(());
                    assert!(q.len() <= 1, "queued twice");
                }
            }));
        }
        let (g2, q2) = (g.clone(), queue.clone());
        let other = thread::spawn(move || {
            worker(&g2, &q2);
        });
        requeuing_worker(&g, &queue);
        for p in producers {
            p.join().unwrap();
        }
        other.join().unwrap();
        while worker(&g, &queue) {}
        assert_eq!(
            g.taken.load(Ordering::SeqCst),
            2,
            "announced work was never run"
        );
        assert!(!g.sched.is_running());
    });
}

/// The lane: two appenders reserve and copy while a closer seals and waits for the
/// copies. In every interleaving the closer sees every reserved entry's bytes, ranges do
/// not overlap, and CSN grows with the offset.
#[test]
fn lane_reservations_are_disjoint_ordered_and_complete_when_sealed() {
    use chorus_runtime::lane::{LaneState, Miss};
    let mut model = loom::model::Builder::new();
    model.preemption_bound = Some(3);
    model.check(|| {
        let lane = Arc::new(LaneState::new(64, 8, 100));
        // One cell per byte offset, standing for the body: an appender writes its marker
        // at its offset, then publishes the copy.
        let cells: Arc<Vec<AtomicUsize>> = Arc::new((0..64).map(|_| AtomicUsize::new(0)).collect());
        let got: Arc<Mutex<Vec<(usize, u64)>>> = Arc::new(Mutex::new(Vec::new()));
        let mut appenders = Vec::new();
        for a in 0..2usize {
            let (lane, cells, got) = (lane.clone(), cells.clone(), got.clone());
            appenders.push(thread::spawn(move || match lane.reserve(16, 0) {
                Ok(r) => {
                    cells[r.offset].store(a + 1, Ordering::Relaxed);
                    got.lock().unwrap().push((r.offset, r.csn));
                    lane.copied(16);
                }
                Err(m) => assert_eq!(m, Miss::Sealed),
            }));
        }
        let (entries, bytes) = lane.seal();
        while !lane.all_copied(bytes) {
            thread::yield_now();
        }
        // Everything reserved before the seal is copied and visible now.
        assert_eq!(bytes, entries * 16);
        for e in 0..entries {
            assert_ne!(
                cells[e * 16].load(Ordering::Relaxed),
                0,
                "entry {e} not copied"
            );
        }
        for a in appenders {
            a.join().unwrap();
        }
        let mut g = got.lock().unwrap().clone();
        g.sort();
        assert_eq!(g.len(), entries, "a reservation after the seal");
        for w in g.windows(2) {
            assert!(w[0].0 + 16 <= w[1].0, "overlapping reservations");
            assert!(w[0].1 < w[1].1, "CSN does not grow with LSN");
        }
        assert!(lane.reserve(1, 0).is_err(), "sealed lanes take nothing");
    });
}

/// One entry's non-atomic state, written by the workers that apply its pieces.
struct Pieces([loom::cell::UnsafeCell<usize>; 2]);

// SAFETY: each cell is written by the one worker that popped its piece, and read only by
// the worker whose `Countdown::done` returned true; loom checks that this read happens
// after both writes (a missing happens-before fails the model).
unsafe impl Sync for Pieces {}

/// The out-of-order apply pool: an entry cut into two pieces, two workers on the queue.
/// In every interleaving each piece is applied once, exactly one worker reports the entry
/// applied, that worker sees both pieces' writes, and closing the queue stops both
/// workers (none waits forever).
#[test]
fn an_entry_is_reported_applied_once_after_all_its_pieces() {
    use chorus_runtime::applyq::{Countdown, WorkQueue};
    let mut model = loom::model::Builder::new();
    model.preemption_bound = Some(3);
    model.check(|| {
        let queue = Arc::new(WorkQueue::<usize>::default());
        let left = Arc::new(Countdown::new(2));
        let pieces = Arc::new(Pieces([
            loom::cell::UnsafeCell::new(0),
            loom::cell::UnsafeCell::new(0),
        ]));
        let reported = Arc::new(AtomicUsize::new(0));
        let workers: Vec<_> = (0..2)
            .map(|_| {
                let (queue, left, pieces, reported) = (
                    queue.clone(),
                    left.clone(),
                    pieces.clone(),
                    reported.clone(),
                );
                thread::spawn(move || {
                    while let Some(p) = queue.pop() {
                        // SAFETY: piece `p` was popped by this worker only.
                        pieces.0[p].with_mut(|c| unsafe { *c += 1 });
                        if left.done() {
                            // SAFETY: both pieces are done; see `Pieces`.
                            let seen: Vec<usize> =
                                pieces.0.iter().map(|c| c.with(|v| unsafe { *v })).collect();
                            assert_eq!(seen, [1, 1], "reported before every piece applied");
                            reported.fetch_add(1, Ordering::SeqCst);
                            queue.close();
                        }
                    }
                })
            })
            .collect();
        queue.push(0);
        queue.push(1);
        for w in workers {
            w.join().unwrap();
        }
        assert_eq!(
            reported.load(Ordering::SeqCst),
            1,
            "reported applied twice or never"
        );
        assert!(
            queue.try_pop().is_none(),
            "a closed queue hands out nothing"
        );
    });
}
