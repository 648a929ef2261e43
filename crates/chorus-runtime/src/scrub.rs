//! The scrubber: one thread per environment that reads every ordered group's sealed
//! blocks (those below the tail, which opening does not scan) and checks every group in
//! them, so that bytes gone bad at rest are found before a reader, or a follower that
//! needs the range, meets them.
//!
//! Damage found goes to the group (`Group::scrub_found`); its next round rebuilds the
//! replica in repair mode, exactly as for damage found at open: it neither votes nor
//! acknowledges, fetches a copy of the range from a peer, and the log writes the copy in
//! place once it continues the checksum chain on both sides (protocol-aware recovery,
//! Alagappan et al., FAST 2018; `chorus_storage::log`'s module `scrub`).
//!
//! A pass reads each sealed block once, at most [`ScrubOptions::bytes_per_sec`], the
//! groups in turn; passes start [`ScrubOptions::interval`] apart, the first when the
//! environment starts (a restart after a crash is when damage is most likely found).
//! Blocks are read without holding the log, so appends and reads go on meanwhile.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::group::Group;

/// How the sealed blocks of ordered groups are scrubbed ([`crate::EnvConfig::scrub`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScrubOptions {
    /// Bytes read per second at most, over all groups; 0 turns scrubbing off. Default
    /// [`DEFAULT_SCRUB_BYTES_PER_SEC`].
    pub bytes_per_sec: u64,
    /// Time from the start of one pass to the start of the next. Default
    /// [`DEFAULT_SCRUB_INTERVAL`].
    pub interval: Duration,
}

/// Default of [`ScrubOptions::bytes_per_sec`]: 32 MiB/s, a small share of a disk's
/// sequential read rate; a 64 MiB block a little over every 2 s.
pub const DEFAULT_SCRUB_BYTES_PER_SEC: u64 = 32 << 20;

/// Default of [`ScrubOptions::interval`]: a day.
pub const DEFAULT_SCRUB_INTERVAL: Duration = Duration::from_secs(24 * 3600);

impl Default for ScrubOptions {
    fn default() -> Self {
        Self {
            bytes_per_sec: DEFAULT_SCRUB_BYTES_PER_SEC,
            interval: DEFAULT_SCRUB_INTERVAL,
        }
    }
}

/// The scrubber's loop. `groups` lists the environment's ordered groups, `None` once the
/// environment is gone (the loop then ends); `stopped` says it is shutting down.
pub(crate) fn run(
    opts: ScrubOptions,
    groups: impl Fn() -> Option<Vec<Arc<Group>>>,
    stopped: impl Fn() -> bool,
) {
    if opts.bytes_per_sec == 0 {
        return;
    }
    // The shortest wait between checks of `stopped`, so a shut-down node's scrubber ends
    // promptly even in the middle of a long pause.
    const NAP: Duration = Duration::from_millis(100);
    let nap_until = |until: Instant| {
        while Instant::now() < until {
            if stopped() {
                return false;
            }
            std::thread::sleep(NAP.min(until - Instant::now()));
        }
        !stopped()
    };
    // A short grace period after start: the groups' own recovery first.
    if !nap_until(Instant::now() + Duration::from_secs(1)) {
        return;
    }
    loop {
        let pass = Instant::now();
        // Blocks checked in this pass, per group (a group restarted or recreated since
        // is checked again from the start).
        let mut done: HashMap<u64, Vec<u64>> = HashMap::new();
        let Some(list) = groups() else { return };
        for g in list {
            let ids = g.sealed_block_ids();
            for id in ids {
                if stopped() || g.is_removed() {
                    break;
                }
                if done.get(&g.id).is_some_and(|d| d.contains(&id)) {
                    continue;
                }
                let Some(block) = g.sealed_block(id) else {
                    continue;
                };
                let t0 = Instant::now();
                match block.verify() {
                    Ok(None) => {}
                    Ok(Some(d)) => {
                        tracing::error!(group = g.id, block = id, from = d.lsn, to = d.next_valid,
                            path = %d.path.display(), offset = d.file_offset, detail = %d.detail,
                            "scrub found a damaged range in a sealed log block; repairing it from peers");
                        g.scrub_found(block, d);
                    }
                    Err(e) => {
                        tracing::error!(group = g.id, block = id, error = %e,
                            "scrub could not check a sealed log block (a damaged block header \
                             is not repaired from peers: docs/operations.md, a damaged replica)");
                    }
                }
                done.entry(g.id).or_default().push(id);
                let spent =
                    Duration::from_secs_f64(g.block_size() as f64 / opts.bytes_per_sec as f64);
                if !nap_until(t0 + spent) {
                    return;
                }
            }
        }
        if !nap_until(pass + opts.interval) {
            return;
        }
    }
}

impl Group {
    /// The ids of the log's sealed blocks (every block but the tail).
    pub(crate) fn sealed_block_ids(&self) -> Vec<u64> {
        self.io.read().expect("io").log.sealed_block_ids()
    }

    /// A handle to read sealed block `id` without holding the log.
    pub(crate) fn sealed_block(&self, id: u64) -> Option<chorus_storage::log::SealedBlock> {
        self.io.read().expect("io").log.sealed_block(id)
    }

    /// Bytes of log per block.
    pub(crate) fn block_size(&self) -> u64 {
        self.io.read().expect("io").log.block_size()
    }

    /// The scrubber found damage `d` in `block`: kept for the group's next round
    /// ([`Group::take_scrub_damage`]), which is scheduled now.
    pub(crate) fn scrub_found(
        self: &Arc<Self>,
        block: chorus_storage::log::SealedBlock,
        d: chorus_storage::log::Damage,
    ) {
        *self.scrub_damage.lock().expect("scrub") = Some((block, d));
        self.scrub_pending
            .store(true, std::sync::atomic::Ordering::Release);
        self.tick_due
            .store(true, std::sync::atomic::Ordering::Release);
        self.schedule();
    }

    /// At the start of a round: damage the scrubber found is noted in the log
    /// (`LogStorage::note_damage`) and the replica rebuilt from storage, in repair mode
    /// (as after damage found at open). Nothing happens when the block was trimmed or
    /// replaced since it was read, or the range is already being repaired.
    pub(crate) fn take_scrub_damage(&self) -> Result<(), crate::Error> {
        if !self
            .scrub_pending
            .swap(false, std::sync::atomic::Ordering::Acquire)
        {
            return Ok(());
        }
        let Some((block, d)) = self.scrub_damage.lock().expect("scrub").take() else {
            return Ok(());
        };
        let noted = self.io.write().expect("io").log.note_damage(&block, d);
        if noted {
            self.restart_replica()?;
        }
        Ok(())
    }
}
