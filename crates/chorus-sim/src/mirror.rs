//! A primary log for simulated mirrors (PALF section 5.2).
//!
//! A group in [`chorus_core::format::meta::AccessMode::RawWrite`] takes only groups another
//! log committed, at the same LSNs. The simulator stands in for that other log with a
//! [`Primary`]: a log of sealed groups (entries, empty groups and the padding that ends
//! each block, as a real primary writes them) generated from a seed, starting at a chain
//! point of the mirror's own log — its start, or the barrier of a switch to raw-write.
//! The group at an LSN depends only on the seed, the epoch and the LSN, so two leaders
//! asking for the group at the same end get the same bytes, as two restorers reading the
//! same primary would.

use std::collections::BTreeMap;

use chorus_core::format::entry::entry_size;
use chorus_core::format::group::{
    block_remaining, encode_group, encode_padding, fits_in_block, ChainPoint, GroupHeader,
    SealParams, GROUP_HEADER_SIZE,
};
use chorus_core::rng::Rng;
use chorus_core::Lsn;

/// Entries of generated groups begin with this marker, never an append's tag.
pub const PRIMARY_MARK: u64 = u64::MAX;

/// A generated primary log. See the module docs.
#[derive(Debug)]
pub struct Primary {
    seed: u64,
    epoch: u64,
    groups: BTreeMap<Lsn, Vec<u8>>,
    next: ChainPoint,
    block_size: u64,
    max_group: usize,
}

impl Primary {
    /// A primary whose log continues the mirror's at `start`.
    pub fn new(
        seed: u64,
        epoch: u64,
        start: ChainPoint,
        block_size: u64,
        max_group: usize,
    ) -> Self {
        Self {
            seed,
            epoch,
            groups: BTreeMap::new(),
            next: start,
            block_size,
            max_group,
        }
    }

    /// The epoch: how many primaries the run had before this one.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The group starting at `lsn`, generating the log up to it; `None` when `lsn` is not
    /// a group boundary of this primary. Newly generated headers are passed to `seen`.
    pub fn group_at(&mut self, lsn: Lsn, mut seen: impl FnMut(&GroupHeader)) -> Option<Vec<u8>> {
        // Bounded: the mirror's window keeps `lsn` within a few hundred KiB of the log.
        while self.next.end_lsn <= lsn && lsn - self.next.end_lsn < (64 << 20) {
            let h = self.generate();
            seen(&h);
        }
        self.groups.get(&lsn).cloned()
    }

    fn generate(&mut self) -> GroupHeader {
        let at = self.next;
        let mut rng = Rng::new(
            self.seed ^ self.epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ at.end_lsn.rotate_left(17),
        );
        let pid = 1_000 + self.epoch;
        let committed = at.end_lsn.saturating_sub(rng.below(4096)).min(at.end_lsn);
        let rem = block_remaining(at.end_lsn, self.block_size);
        let mut buf = Vec::new();
        let h = 'group: {
            // An empty group (a primary leader's StartWorking) now and then.
            let n = if rng.chance(1, 10) {
                0
            } else {
                rng.range(1, 5)
            };
            let mut records: Vec<(u64, Vec<u8>)> = Vec::new();
            let mut csn = at.max_csn;
            let mut len = GROUP_HEADER_SIZE;
            for _ in 0..n {
                let mut data = PRIMARY_MARK.to_le_bytes().to_vec();
                let extra = rng.below(600) as usize;
                data.extend((0..extra).map(|i| (i as u8) ^ (at.end_lsn as u8)));
                csn += 1 + rng.below(3);
                len += entry_size(data.len());
                records.push((csn, data));
            }
            if len <= self.max_group && fits_in_block(at.end_lsn, len as u64, self.block_size) {
                let recs: Vec<(u64, &[u8])> =
                    records.iter().map(|(c, d)| (*c, d.as_slice())).collect();
                break 'group encode_group(
                    &mut buf,
                    &at,
                    SealParams {
                        proposal_id: pid,
                        committed_end_lsn: committed,
                        flags: 0,
                    },
                    &recs,
                );
            }
            // Too big for what is left of the block: the primary pads it.
            encode_padding(&mut buf, &at, pid, committed, rem)
        };
        self.groups.insert(h.lsn, buf);
        self.next = h.chain_after();
        h
    }
}
