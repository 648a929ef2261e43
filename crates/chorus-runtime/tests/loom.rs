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
