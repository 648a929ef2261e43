//! A pass: one IO worker steps many ordered groups together, so that what they share —
//! the worker's wake-up, the frames to each peer, the wait for the disk — is paid once
//! per pass instead of once per group.
//!
//! With one group per appender (many groups, each lightly loaded), every round of a
//! group carries one record, and on its own it would pay a wake-up, a `send` per frame
//! and an `fdatasync` for it (docs/benchmarks/many-groups.md). A worker that finds
//! several ordered groups waiting at the front of the run queue takes up to
//! [`crate::EnvConfig::pass_groups`] of them (TiKV's raftstore polls its regions in
//! batches for the same reason) and goes round them:
//!
//! 1. **Step.** Each group runs rounds ([`Group::round`]) until it has nothing to do or
//!    a round wrote its log. Its frames go to the peers' buffers but are not sent: the
//!    worker holds a [`Cork`].
//! 2. **Send.** The cork ends: each peer's frames of every group leave in one `send`.
//!    Followers get the records before the leader syncs, as when a group runs alone.
//! 3. **Sync.** Every log written in step 1 is synced ([`Group::sync_after_write`]: on
//!    the worker, or with [`crate::EnvConfig::pipelined_sync`] started on the node's sync
//!    threads, one in flight per group, the next batch written meanwhile), and each group
//!    gets [`crate::ordered::Feedback::Flushed`] for the round after its sync returns.
//!    Nothing is acknowledged or voted before its own log's sync returned: the replica
//!    learns of the sync only in the group's next round.
//!
//! Then again, with the groups that still have work, for at most [`PASS_ROUNDS`]
//! times while other tasks wait; a group still busy after that goes back to the end of
//! the run queue with its reports kept ([`crate::pool::Pool::requeue`]), so a pass never
//! holds a group from the other workers for long. With nothing else waiting the pass
//! goes on (up to 10,000 cycles): requeueing would only wake another worker to take the
//! same groups. A group that ran out of work lets go of the worker
//! (`SchedState::finish`), or stays in the pass when work arrived meanwhile.
//!
//! The syncs of a pass run one after another on the worker (the node's other workers run
//! their passes, and their syncs, at the same time), or with pipelined syncs on the sync
//! threads, several at once, while the worker goes on with the groups that still have
//! work.

use std::sync::Arc;

use crate::group::{Group, Stepped};
use crate::pool::Pool;
use crate::transport::Cork;

/// At most this many step–send–sync cycles per pass: a group that is still busy after
/// them goes back to the run queue.
pub const PASS_ROUNDS: usize = 8;

/// At most this many cycles per pass even when no other task waits (then a pass goes
/// on past [`PASS_ROUNDS`]: handing its groups to the queue would only wake another
/// worker for them).
const MAX_CYCLES: usize = 10_000;

/// Rounds that do not write, in a row, that one group may run in one step.
const ROUNDS_WITHOUT_WRITE: usize = 64;

/// Steps `groups` (taken from the run queue; each `QUEUED`) in one pass, and empties
/// the vector.
pub(crate) fn run(pool: &Pool, groups: &mut Vec<Arc<Group>>) {
    for g in groups.iter() {
        g.sched.begin();
    }
    let mut wrote: Vec<Arc<Group>> = Vec::with_capacity(groups.len());
    let mut next: Vec<Arc<Group>> = Vec::with_capacity(groups.len());
    let mut cycles = 0;
    loop {
        if groups.is_empty() {
            return;
        }
        if cycles >= MAX_CYCLES || (cycles >= PASS_ROUNDS && pool.has_waiting()) {
            break;
        }
        cycles += 1;
        {
            // One group alone has nobody to share a send with: its frames leave as it
            // queues them, so a follower gets a record before the leader's own write.
            let _cork = (groups.len() > 1).then(Cork::new);
            for g in groups.drain(..) {
                match step(&g) {
                    Stepped::Wrote => wrote.push(g),
                    Stepped::Again => next.push(g),
                    Stepped::Idle => release(g, &mut next),
                }
            }
        }
        for g in wrote.drain(..) {
            if g.sync_after_write() {
                next.push(g);
            } else {
                release(g, &mut next);
            }
        }
        std::mem::swap(groups, &mut next);
    }
    for g in groups.drain(..) {
        pool.requeue(g);
    }
}

/// Runs `g`'s rounds until one wrote or it has nothing left to do (or it ran
/// [`ROUNDS_WITHOUT_WRITE`] rounds: [`Stepped::Again`]).
fn step(g: &Arc<Group>) -> Stepped {
    if g.removed.load(std::sync::atomic::Ordering::Relaxed) {
        return Stepped::Idle;
    }
    for _ in 0..ROUNDS_WITHOUT_WRITE {
        // A panic (a bug) ends this group's part in the pass, not the pass.
        let round = std::panic::AssertUnwindSafe(|| g.round());
        match std::panic::catch_unwind(round) {
            Ok(Stepped::Again) => {}
            Ok(s) => return s,
            Err(_) => {
                tracing::error!(group = g.id, "a group's round panicked; the worker goes on");
                return Stepped::Idle;
            }
        }
    }
    Stepped::Again
}

/// `g` has nothing to do: it lets go of the worker, or stays in the pass when work
/// arrived while it ran.
fn release(g: Arc<Group>, next: &mut Vec<Arc<Group>>) {
    if !g.sched.finish() {
        g.sched.begin();
        next.push(g);
    }
}
