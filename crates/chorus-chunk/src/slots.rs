//! [`Slots`]: a chunk replica's block maps in memory — the current one, the snapshots'
//! (PolarFS section 7.2) — and the bookkeeping of the data file's slots: which are
//! frozen (a snapshot names them: never written in place again), which are free, and
//! which wait for a checkpoint before they may be reused. No I/O: [`crate::store`] does
//! the writes and calls in here under its lock.

use std::collections::{BTreeMap, BTreeSet};

use crate::map::{MapFile, SnapshotMap};
use crate::Geometry;

/// No slot: the block was never written.
pub(crate) const NONE: u32 = u32::MAX;

/// The block maps and the slots' states. Every slot below [`Slots::slot_count`] is in
/// exactly one of four states: *in use* (some map names it), *pending*, *releasing* or
/// *free* (no map names it).
#[derive(Debug)]
pub(crate) struct Slots {
    /// The current map: block → slot, [`NONE`] for a block never written. Invariant:
    /// `len()` is the chunk's block count; no slot twice.
    current: Vec<u32>,
    /// Blocks with a slot in `current`.
    allocated: u32,
    /// Snapshot id → its map, `(block, slot)` ascending by block: a copy of `current`
    /// when it was taken, never changed after. Invariant: ids at least 1; a slot any two
    /// maps (current or snapshot) name holds the same block in both.
    snapshots: BTreeMap<u64, Vec<(u32, u32)>>,
    /// Ids of deleted snapshots: never taken again (see [`crate::ChunkStore::snapshot`]).
    /// Invariant: at least 1, none in `snapshots`.
    deleted: BTreeSet<u64>,
    /// Per slot of the data file (`len()` is the slot count): how many snapshot maps name
    /// it. A slot with a count above 0 is *frozen*: a write to its block goes to a new
    /// slot (copy-on-write), so the snapshot's bytes never change.
    frozen: Vec<u32>,
    /// Slots no map names, and that the last durable block map does not name either:
    /// new slots come from here first (lowest first), else past the end.
    free: BTreeSet<u32>,
    /// Slots no map names any more (a deleted snapshot held the last reference), but that
    /// the last durable block map may still name. Invariant: not reused until a
    /// checkpoint has durably written a map that no longer names them — after a crash
    /// the chunk opens to that older map and reads its snapshots' (or current) blocks
    /// from them, and the log's replay copies-on-write from them (a slot overwritten
    /// early would hand the replay another block's bytes).
    pending: Vec<u32>,
    /// Pending slots a running checkpoint took when it copied the maps (which therefore
    /// do not name them): free once its map is durable, pending again if it fails.
    releasing: Vec<u32>,
}

impl Slots {
    /// The maps of a chunk of `geometry` with nothing written.
    pub(crate) fn empty(geometry: Geometry) -> Self {
        Self {
            current: vec![NONE; geometry.blocks() as usize],
            allocated: 0,
            snapshots: BTreeMap::new(),
            deleted: BTreeSet::new(),
            frozen: Vec::new(),
            free: BTreeSet::new(),
            pending: Vec::new(),
            releasing: Vec::new(),
        }
    }

    /// The maps a checked block map file holds (its slots all below `slot_count`), with
    /// a data file of `slot_count` slots: the slots no map names are free.
    pub(crate) fn from_maps(
        geometry: Geometry,
        slot_count: u32,
        current: &[(u32, u32)],
        snapshots: &[SnapshotMap],
        deleted: &[u64],
    ) -> Self {
        let mut s = Self::empty(geometry);
        s.frozen = vec![0; slot_count as usize];
        let mut named = vec![false; slot_count as usize];
        for &(b, slot) in current {
            s.current[b as usize] = slot;
            named[slot as usize] = true;
        }
        s.allocated = current.len() as u32;
        for m in snapshots {
            for &(_, slot) in &m.entries {
                s.frozen[slot as usize] += 1;
                named[slot as usize] = true;
            }
            s.snapshots.insert(m.id, m.entries.clone());
        }
        s.deleted = deleted.iter().copied().collect();
        s.free = (0..slot_count).filter(|i| !named[*i as usize]).collect();
        s
    }

    /// The current slot of `block`, if it has one.
    pub(crate) fn current(&self, block: u32) -> Option<u32> {
        self.current
            .get(block as usize)
            .copied()
            .filter(|s| *s != NONE)
    }

    /// The slot of `block` in snapshot `id`: `None` when there is no such snapshot,
    /// `Some(None)` when the snapshot holds nothing for the block.
    pub(crate) fn in_snapshot(&self, id: u64, block: u32) -> Option<Option<u32>> {
        let m = self.snapshots.get(&id)?;
        Some(
            m.binary_search_by_key(&block, |(b, _)| *b)
                .ok()
                .map(|i| m[i].1),
        )
    }

    /// Snapshot `id`'s map, if it exists.
    pub(crate) fn snapshot_map(&self, id: u64) -> Option<&[(u32, u32)]> {
        self.snapshots.get(&id).map(Vec::as_slice)
    }

    /// Whether a snapshot names `slot` (a write to its block must copy it first).
    pub(crate) fn is_frozen(&self, slot: u32) -> bool {
        self.frozen.get(slot as usize).is_some_and(|n| *n > 0)
    }

    /// The slot a new block would take: the lowest free one, else the next past the end
    /// (`None` when the slot numbers ran out).
    pub(crate) fn next_slot(&self) -> Option<u32> {
        match self.free.first() {
            Some(s) => Some(*s),
            None => u32::try_from(self.frozen.len()).ok().filter(|n| *n < NONE),
        }
    }

    /// Points `block` at `slot`, from [`Slots::next_slot`], whose whole block the caller
    /// has written: a first write, or a copy-on-write away from a frozen slot (which
    /// the snapshots naming it keep in use).
    pub(crate) fn place(&mut self, block: u32, slot: u32) {
        debug_assert!(self.current(block).is_none_or(|s| self.is_frozen(s)));
        if !self.free.remove(&slot) {
            debug_assert_eq!(slot as usize, self.frozen.len());
            self.frozen.push(0);
        }
        if self.current[block as usize] == NONE {
            self.allocated += 1;
        }
        self.current[block as usize] = slot;
    }

    /// Takes snapshot `id`: a copy of the current map, whose slots are frozen from now
    /// on. `false` (nothing done) when it exists or was deleted.
    pub(crate) fn snapshot(&mut self, id: u64) -> bool {
        if self.snapshots.contains_key(&id) || self.deleted.contains(&id) {
            return false;
        }
        let map = self.current_entries();
        for (_, s) in &map {
            self.frozen[*s as usize] += 1;
        }
        self.snapshots.insert(id, map);
        true
    }

    /// Deletes snapshot `id` and remembers the id as deleted; `false` when it did not
    /// exist. A slot no map names any more goes to the pending list.
    pub(crate) fn delete(&mut self, id: u64) -> bool {
        self.deleted.insert(id);
        let Some(map) = self.snapshots.remove(&id) else {
            return false;
        };
        for (b, s) in map {
            let n = &mut self.frozen[s as usize];
            *n -= 1;
            // A slot holds one block, so the current map names it only for `b`.
            if *n == 0 && self.current[b as usize] != s {
                self.pending.push(s);
            }
        }
        true
    }

    /// The snapshots' ids, ascending.
    pub(crate) fn snapshot_ids(&self) -> Vec<u64> {
        self.snapshots.keys().copied().collect()
    }

    /// Ids of deleted snapshots, ascending.
    pub(crate) fn deleted_ids(&self) -> Vec<u64> {
        self.deleted.iter().copied().collect()
    }

    /// Snapshot ids held or deleted.
    pub(crate) fn ids_seen(&self) -> u64 {
        (self.snapshots.len() + self.deleted.len()) as u64
    }

    /// Blocks the current map holds.
    pub(crate) fn allocated(&self) -> u32 {
        self.allocated
    }

    /// Slots of the data file: in use, pending, releasing or free.
    pub(crate) fn slot_count(&self) -> u32 {
        self.frozen.len() as u32
    }

    /// Slots some map names (each once).
    pub(crate) fn in_use(&self) -> u32 {
        (self.frozen.len() - self.free.len() - self.pending.len() - self.releasing.len()) as u32
    }

    /// The current map, ascending by block.
    pub(crate) fn current_entries(&self) -> Vec<(u32, u32)> {
        self.current
            .iter()
            .enumerate()
            .filter(|(_, s)| **s != NONE)
            .map(|(b, s)| (b as u32, *s))
            .collect()
    }

    /// Bytes of the block map file of these maps.
    pub(crate) fn map_bytes(&self) -> u64 {
        crate::map::encoded_len(
            self.allocated as usize,
            self.snapshots.values().map(Vec::len),
            self.deleted.len(),
        )
    }

    /// A checkpoint starts: the block map file of the maps as they are now, of the data
    /// file of `generation`. The pending slots move to the releasing list: the map does
    /// not name them, so once it is durable they may be reused
    /// ([`Slots::end_checkpoint`]).
    pub(crate) fn begin_checkpoint(&mut self, geometry: Geometry, generation: u64) -> MapFile {
        self.releasing.append(&mut self.pending);
        MapFile {
            geometry,
            generation,
            slot_count: self.slot_count(),
            entries: self.current_entries(),
            snapshots: self
                .snapshots
                .iter()
                .map(|(id, m)| SnapshotMap {
                    id: *id,
                    entries: m.clone(),
                })
                .collect(),
            deleted: self.deleted.iter().copied().collect(),
        }
    }

    /// The checkpoint [`Slots::begin_checkpoint`] started ended: its map is durable
    /// (`durable`), and the slots it took are free; or it failed, and they are pending
    /// again (the old map, or the new one, may be the durable one).
    pub(crate) fn end_checkpoint(&mut self, durable: bool) {
        if durable {
            self.free.extend(self.releasing.drain(..));
        } else {
            self.pending.append(&mut self.releasing);
        }
    }

    /// Checks every invariant the fields state (for tests).
    #[cfg(test)]
    pub(crate) fn check(&self) -> Result<(), String> {
        let n = self.frozen.len();
        let mut owner = vec![NONE; n];
        let mut named = vec![false; n];
        let mut refs = vec![0u32; n];
        let mut claim = |b: u32, s: u32| -> Result<(), String> {
            let i = s as usize;
            if i >= n {
                return Err(format!("slot {s} past the {n} slots"));
            }
            if owner[i] != NONE && owner[i] != b {
                return Err(format!("slot {s} holds blocks {} and {b}", owner[i]));
            }
            owner[i] = b;
            named[i] = true;
            Ok(())
        };
        let mut cur = 0;
        for (b, s) in self.current.iter().enumerate() {
            if *s != NONE {
                claim(b as u32, *s)?;
                cur += 1;
            }
        }
        if cur != self.allocated {
            return Err(format!("allocated {} but {cur} blocks", self.allocated));
        }
        for (id, m) in &self.snapshots {
            if *id == 0 || self.deleted.contains(id) {
                return Err(format!("snapshot id {id}"));
            }
            for w in m.windows(2) {
                if w[0].0 >= w[1].0 {
                    return Err(format!("snapshot {id} out of order"));
                }
            }
            for (b, s) in m {
                claim(*b, *s)?;
                refs[*s as usize] += 1;
            }
        }
        if refs != self.frozen {
            return Err("snapshot counts differ".into());
        }
        let mut state = vec![0u8; n];
        for s in self.free.iter().chain(&self.pending).chain(&self.releasing) {
            let i = *s as usize;
            if i >= n || named[i] || state[i] != 0 {
                return Err(format!("slot {s} free twice, in use or past the end"));
            }
            state[i] = 1;
        }
        if let Some(i) = (0..n).find(|i| !named[*i] && state[*i] == 0) {
            return Err(format!("slot {i} neither in use nor free"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random operations keep every invariant, and a slot freed is reused only after a
    /// checkpoint took it.
    #[test]
    fn random_operations_keep_the_invariants() {
        let g = Geometry {
            chunk_bytes: 16 * 4096,
            block_bytes: 4096,
        };
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        for _ in 0..50 {
            let mut s = Slots::empty(g);
            for _ in 0..300 {
                match next(6) {
                    0 | 1 => {
                        let b = next(16) as u32;
                        if s.current(b).is_none_or(|x| s.is_frozen(x)) {
                            let slot = s.next_slot().expect("a slot");
                            assert!(!s.pending.contains(&slot) && !s.releasing.contains(&slot));
                            s.place(b, slot);
                        }
                    }
                    2 => {
                        s.snapshot(1 + next(200));
                    }
                    3 => {
                        let ids = s.snapshot_ids();
                        if !ids.is_empty() {
                            s.delete(ids[next(ids.len() as u64) as usize]);
                        }
                    }
                    4 => {
                        let m = s.begin_checkpoint(g, 0);
                        let named = m
                            .entries
                            .iter()
                            .chain(m.snapshots.iter().flat_map(|x| x.entries.iter()));
                        for (_, x) in named {
                            assert!(!s.releasing.contains(x));
                        }
                        s.end_checkpoint(next(4) != 0);
                    }
                    _ => {
                        let m = s.begin_checkpoint(g, 0);
                        // A restart from this map: the same slots in use, and every
                        // slot not named (the releasing ones too) free.
                        let back =
                            Slots::from_maps(g, m.slot_count, &m.entries, &m.snapshots, &m.deleted);
                        back.check().unwrap();
                        assert_eq!(back.in_use(), s.in_use());
                        assert_eq!(back.free.len(), s.free.len() + s.releasing.len());
                        s.end_checkpoint(true);
                    }
                }
                s.check().unwrap();
            }
        }
    }
}
