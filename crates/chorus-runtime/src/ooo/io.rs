//! The IO side of an out-of-order group: the batches of writes and hard-state saves its
//! driver hands over, executed in order on the group's [`OooStore`] — by the group's IO
//! task on the environment's IO workers (`super::task::IoTask`), and by the simulator on
//! its simulated disk, with the same function.
//!
//! Every batch queued when the IO side runs shares one fdatasync (group commit); a
//! hard-state or membership save first syncs the writes before it, so a saved term or
//! vote never outlives the entries it was decided on.

use std::time::Instant;

use chorus_core::ooo::replica::{Entry, Hard, Membership};
use chorus_storage::ooo::OooStore;
use chorus_storage::StorageError;

use crate::metrics::Histogram;

/// A write for the IO side, in the order the replica asked.
#[derive(Debug)]
pub enum IoOp {
    /// An entry, appended to the entries file (durable at the next sync).
    Write(Entry),
    /// The hard state (term, vote, base), saved after the writes before it are synced.
    Hard(Hard),
    /// The membership, saved after the writes before it are synced.
    Members(Membership),
    /// The entries file rewritten with these live entries only (compaction).
    Compact(Vec<Entry>),
}

/// What one run of the IO side made durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoDone {
    /// Every batch up to this id is durable.
    pub upto: u64,
    /// fdatasyncs that wrote something.
    pub syncs: u64,
    /// Bytes of the entries file now.
    pub len: u64,
}

/// Executes `batches` (ids increasing) on `store` in order and syncs once at the end;
/// each sync that wrote something is timed into `fsync`. `None` when there is nothing
/// to do. On an error the store must not be used again (what it holds is unknown).
pub fn run_io(
    store: &mut OooStore,
    batches: Vec<(u64, Vec<IoOp>)>,
    fsync: Option<&Histogram>,
) -> Option<Result<IoDone, StorageError>> {
    let upto = batches.last()?.0;
    let sync = |store: &mut OooStore, dirty: bool| {
        let t = Instant::now();
        #[cfg(feature = "broken")]
        let r = if crate::env::broken_skip_fsync() {
            Ok(())
        } else {
            store.sync()
        };
        #[cfg(not(feature = "broken"))]
        let r = store.sync();
        if let (true, Ok(()), Some(h)) = (dirty, &r, fsync) {
            h.record(t.elapsed().as_nanos() as u64);
        }
        r
    };
    let mut syncs = 0;
    let mut unsynced = false;
    let run = || -> Result<(), StorageError> {
        for (_, ops) in batches {
            for op in ops {
                match op {
                    IoOp::Write(e) => {
                        unsynced = true;
                        store.write(&e)?;
                    }
                    IoOp::Hard(h) => {
                        let dirty = std::mem::take(&mut unsynced);
                        syncs += dirty as u64;
                        sync(store, dirty)?;
                        store.save_hard(&h)?;
                    }
                    IoOp::Members(m) => {
                        let dirty = std::mem::take(&mut unsynced);
                        syncs += dirty as u64;
                        sync(store, dirty)?;
                        store.save_membership(&m)?;
                    }
                    IoOp::Compact(live) => {
                        syncs += std::mem::take(&mut unsynced) as u64;
                        store.compact(&live)?;
                    }
                }
            }
        }
        syncs += unsynced as u64;
        sync(store, unsynced)
    };
    let done = run();
    Some(done.map(|()| IoDone {
        upto,
        syncs,
        len: store.len(),
    }))
}
