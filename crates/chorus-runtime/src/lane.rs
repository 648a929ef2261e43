//! The lock-free write path (PALF section 6).
//!
//! A [`LaneBuf`] is the body of the group being filled at the log tail, reserved from the
//! replica with [`chorus_core::replica::Replica::open_lane`]. Appenders take their offset
//! and CSN together with one compare-and-swap on a packed state word, copy their entry
//! into the buffer at that offset with no lock, and return at once with their LSN and
//! CSN; the driver seals the lane (one atomic OR), waits for the copies still in flight,
//! and hands the body to the replica as one group.
//!
//! State word (64 bits): `sealed:1 | count:13 | offset:24 | csn_delta:26`, where
//! `csn_delta` is the last CSN taken minus the lane's base CSN. CSN and offset move in
//! the same CAS, so CSN grows with LSN inside a lane (PALF section 4.2). A reservation
//! that does not fit (bytes, entries, or a reference CSN too far ahead) fails and the
//! appender takes the slow path, which closes the lane and opens the next.
//!
//! `written` counts the bytes whose copy is complete; an appender publishes its copy (and
//! its result slot) with a release add, and the sealer reads the body only after an
//! acquire load shows every reserved byte written. The protocol is checked with `loom`
//! (`tests/loom.rs`).

use std::cell::UnsafeCell;

#[cfg(feature = "loom")]
use loom::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
#[cfg(not(feature = "loom"))]
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Most entries in one lane.
pub const MAX_LANE_ENTRIES: usize = (1 << 13) - 1;
const SEALED: u64 = 1 << 63;
const COUNT_SHIFT: u32 = 50;
const OFFSET_SHIFT: u32 = 26;
const MAX_OFFSET: u64 = (1 << 24) - 1;
const MAX_CSN_DELTA: u64 = (1 << 26) - 1;

fn unpack(s: u64) -> (bool, usize, usize, u64) {
    (
        s & SEALED != 0,
        ((s >> COUNT_SHIFT) & ((1 << 13) - 1)) as usize,
        ((s >> OFFSET_SHIFT) & MAX_OFFSET) as usize,
        s & MAX_CSN_DELTA,
    )
}

fn pack(count: usize, offset: usize, csn_delta: u64) -> u64 {
    ((count as u64) << COUNT_SHIFT) | ((offset as u64) << OFFSET_SHIFT) | csn_delta
}

/// Why a reservation failed: the appender must take the slow path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Miss {
    /// The lane is being closed.
    Sealed,
    /// Not enough room (bytes or entries) left.
    Full,
    /// The reference CSN is too far beyond the lane's base to encode.
    CsnTooFar,
}

/// A successful reservation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reserved {
    /// Offset of the entry in the body.
    pub offset: usize,
    /// Index of the entry (its result slot).
    pub index: usize,
    /// The entry's CSN.
    pub csn: u64,
}

/// The atomic part of a lane: reservation, sealing, and copy completion.
#[derive(Debug)]
pub struct LaneState {
    state: AtomicU64,
    written: AtomicUsize,
    capacity: usize,
    max_entries: usize,
    base_csn: u64,
}

impl LaneState {
    /// A lane of `capacity` body bytes, at most `max_entries` entries, after CSN
    /// `base_csn`.
    pub fn new(capacity: usize, max_entries: usize, base_csn: u64) -> Self {
        Self {
            state: AtomicU64::new(0),
            written: AtomicUsize::new(0),
            capacity: capacity.min(MAX_OFFSET as usize),
            max_entries: max_entries.min(MAX_LANE_ENTRIES),
            base_csn,
        }
    }

    /// Reserves `size` bytes for an entry whose CSN must be at least `ref_csn`.
    pub fn reserve(&self, size: usize, ref_csn: u64) -> Result<Reserved, Miss> {
        let mut s = self.state.load(Ordering::Acquire);
        loop {
            let (sealed, count, offset, delta) = unpack(s);
            if sealed {
                return Err(Miss::Sealed);
            }
            if offset + size > self.capacity || count + 1 > self.max_entries {
                return Err(Miss::Full);
            }
            let csn = (self.base_csn + delta + 1).max(ref_csn);
            let nd = csn - self.base_csn;
            if nd > MAX_CSN_DELTA {
                return Err(Miss::CsnTooFar);
            }
            let next = pack(count + 1, offset + size, nd);
            match self
                .state
                .compare_exchange_weak(s, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    return Ok(Reserved {
                        offset,
                        index: count,
                        csn,
                    })
                }
                Err(now) => s = now,
            }
        }
    }

    /// The copy of `size` reserved bytes (and its result slot) is complete.
    pub fn copied(&self, size: usize) {
        self.written.fetch_add(size, Ordering::Release);
    }

    /// Seals the lane: no reservation succeeds after this. Returns `(entries, bytes)`
    /// reserved.
    pub fn seal(&self) -> (usize, usize) {
        let s = self.state.fetch_or(SEALED, Ordering::AcqRel);
        let (_, count, offset, _) = unpack(s);
        (count, offset)
    }

    /// Whether every one of `bytes` reserved bytes has been copied.
    pub fn all_copied(&self, bytes: usize) -> bool {
        self.written.load(Ordering::Acquire) >= bytes
    }
}

/// A lane with its body buffer and one result slot per entry.
pub struct LaneBuf<T> {
    /// What the replica reserved.
    pub lane: chorus_core::replica::Lane,
    /// The atomic protocol.
    pub state: LaneState,
    body: Box<[UnsafeCell<u8>]>,
    slots: Box<[UnsafeCell<Option<T>>]>,
    taken: std::sync::atomic::AtomicBool,
}

// SAFETY: every byte range of `body` and every slot is written by exactly one appender
// (the CAS hands out disjoint ranges and indexes) before it publishes its copy with a
// release add, and read only once (`taken`), after the lane is sealed and an acquire load
// has seen every copy.
unsafe impl<T: Send> Sync for LaneBuf<T> {}
// SAFETY: as above; the buffer owns plain bytes.
unsafe impl<T: Send> Send for LaneBuf<T> {}

impl<T> std::fmt::Debug for LaneBuf<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaneBuf").field("lane", &self.lane).finish()
    }
}

impl<T> LaneBuf<T> {
    /// A buffer for `lane` of at most `capacity` bytes (no more than the lane allows)
    /// and `max_entries` entries.
    pub fn new(lane: chorus_core::replica::Lane, capacity: usize, max_entries: usize) -> Self {
        let cap = capacity.min(lane.capacity).min(MAX_OFFSET as usize);
        let max_entries = max_entries.clamp(1, MAX_LANE_ENTRIES);
        // `vec![0; n]` gets zeroed pages from the allocator without writing them.
        let bytes: Box<[u8]> = vec![0u8; cap].into_boxed_slice();
        // SAFETY: `UnsafeCell<u8>` has the same layout as `u8` (repr(transparent)).
        let body = unsafe { Box::from_raw(Box::into_raw(bytes) as *mut [UnsafeCell<u8>]) };
        Self {
            state: LaneState::new(cap, max_entries, lane.last_csn),
            lane,
            body,
            slots: (0..max_entries).map(|_| UnsafeCell::new(None)).collect(),
            taken: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Writes the entry of a reservation and fills its slot, then publishes the copy.
    pub fn fill(&self, r: &Reserved, size: usize, write: impl FnOnce(&mut [u8]), slot: T) {
        // SAFETY: `r.offset..r.offset + size` was reserved by this caller alone (the CAS in
        // `reserve`) and lies within `body`; nobody reads it before `copied` is published.
        let dst = unsafe {
            let p = UnsafeCell::raw_get(self.body.as_ptr().add(r.offset));
            std::slice::from_raw_parts_mut(p, size)
        };
        write(dst);
        // SAFETY: slot `r.index` was reserved by this caller alone, as above.
        unsafe { *self.slots[r.index].get() = Some(slot) };
        self.state.copied(size);
    }

    /// The body and the slots, in order, once: after [`LaneState::seal`] returned
    /// `(entries, bytes)` and [`LaneState::all_copied`] holds for `bytes`. `None` if
    /// those do not hold or it was taken already.
    pub fn take(&self, entries: usize, bytes: usize) -> Option<(Vec<u8>, Vec<T>)> {
        let (sealed, n, b, _) = unpack(self.state.state.load(Ordering::Acquire));
        if !sealed || n != entries || b != bytes || !self.state.all_copied(bytes) {
            return None;
        }
        if self.taken.swap(true, std::sync::atomic::Ordering::AcqRel) {
            return None;
        }
        // SAFETY: sealed, every reserved byte and slot copied (acquired above), taken once.
        let body: Vec<u8> = self.body[..bytes]
            .iter()
            .map(|c| unsafe { *c.get() })
            .collect();
        let slots = self.slots[..entries]
            .iter()
            // SAFETY: as above.
            .map(|s| unsafe { (*s.get()).take() }.expect("a copied entry has its slot"))
            .collect();
        Some((body, slots))
    }
}
