//! The simulated nodes' state machine: a block volume (parallel mode) or a key-value store
//! (dependent mode), as an [`OooStateMachine`] that the production driver calls — applies,
//! checkpoints, images and installs on the simulator's seeded job queue — and that checks,
//! as it applies, that no record is applied after a later slot's write of the same block
//! or key (check 3 of the module docs).
//!
//! Both modes keep `key -> value` with the slot that last wrote each key: a parallel
//! record writes its token to every block of its ranges, a dependent record (a
//! transaction `read rk seeing rv, write wk := wv`) writes one key.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use chorus_core::ooo::group::{self, Record};
use chorus_core::ooo::replica::{Declared, Entry, Footprint};
use chorus_core::ooo::Seq;
use chorus_runtime::ooo::OooStateMachine;

/// A state machine image: every key with its value and the slot that wrote it.
pub(super) type Image = BTreeMap<u64, (u64, Seq)>;

/// A transaction's record in dependent mode: read `rk` (seeing `rv`), write `wk := wv`.
pub(super) fn encode_txn(rk: u64, rv: u64, wk: u64, wv: u64) -> Vec<u8> {
    [rk, rv, wk, wv]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect()
}

/// The four words of a transaction record, if it is one.
pub(super) fn decode_txn(d: &[u8]) -> Option<[u64; 4]> {
    if d.len() != 32 {
        return None;
    }
    let w = |i: usize| u64::from_le_bytes(d[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    Some([w(0), w(1), w(2), w(3)])
}

/// A seeded mix of two words (values written, per-node seeds).
pub(super) fn mix(a: u64, b: u64) -> u64 {
    let mut x = a ^ b.rotate_left(29) ^ 0x9E37_79B9_7F4A_7C15;
    x ^= x >> 31;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^ x >> 29
}

/// The prefix of a snapshot record's data (the volume simulation's snapshot barrier).
const SNAP: &[u8; 4] = b"SNAP";

/// A snapshot record of the volume simulation: it declares the whole chunk of `blocks`
/// blocks (as a chunk leader's snapshot barrier does, `chorus_chunk::op`) and writes
/// nothing; the state machine checks that it is applied after every earlier write to
/// the chunk and before every later one.
pub(super) fn snapshot_record(id: u64, blocks: u64) -> Record {
    Record {
        declared: Declared::Blocks(vec![
            chorus_core::ooo::parallel::BlockRange::new(0, blocks).expect("non-empty")
        ]),
        data: [&SNAP[..], &id.to_le_bytes()].concat(),
    }
}

/// Whether `r` is a [`snapshot_record`].
fn is_snapshot(r: &Record) -> bool {
    r.data.len() == 12 && r.data.starts_with(SNAP)
}

/// What a record writes: every block of its ranges to its token (parallel), or its one
/// key (dependent); a snapshot record writes nothing.
pub(super) fn record_writes(r: &Record) -> Vec<(u64, u64)> {
    if is_snapshot(r) {
        return Vec::new();
    }
    match &r.declared {
        Declared::Blocks(ranges) => {
            let t = r
                .data
                .as_slice()
                .try_into()
                .map(u64::from_le_bytes)
                .unwrap_or(0);
            ranges
                .iter()
                .flat_map(|r| (r.start..r.end).map(move |b| (b, t)))
                .collect()
        }
        Declared::Txn { .. } => decode_txn(&r.data)
            .map(|[_, _, wk, wv]| vec![(wk, wv)])
            .unwrap_or_default(),
    }
}

/// The records of a committed entry, in group order (none for NULL or a payload that is
/// not a group).
pub(super) fn records(e: &Entry) -> Vec<Record> {
    group::records(e).unwrap_or_default()
}

/// What an entry writes, record by record in the group's order.
pub(super) fn writes(e: &Entry) -> Vec<(u64, u64)> {
    records(e).iter().flat_map(record_writes).collect()
}

fn encode_image(state: &HashMap<u64, u64>, writers: &HashMap<u64, Seq>) -> Vec<u8> {
    let sorted: BTreeMap<u64, u64> = state.iter().map(|(&k, &v)| (k, v)).collect();
    let mut out = Vec::with_capacity(sorted.len() * 24);
    for (k, v) in sorted {
        for x in [k, v, writers.get(&k).copied().unwrap_or(0)] {
            out.extend_from_slice(&x.to_le_bytes());
        }
    }
    out
}

/// A partial image: every key `f` names (blocks are keys in parallel mode), with its
/// value and writer, or absent: `u64 key | u64 present (0/1) | u64 value | u64 writer`.
fn encode_part(state: &HashMap<u64, u64>, writers: &HashMap<u64, Seq>, f: &Footprint) -> Vec<u8> {
    let mut keys: Vec<u64> = f
        .blocks
        .iter()
        .flat_map(|r| r.start..r.end)
        .chain(f.keys.iter().copied())
        .collect();
    keys.sort_unstable();
    keys.dedup();
    let mut out = Vec::with_capacity(keys.len() * 32);
    for k in keys {
        let (present, v) = match state.get(&k) {
            Some(&v) => (1, v),
            None => (0, 0),
        };
        for x in [k, present, v, writers.get(&k).copied().unwrap_or(0)] {
            out.extend_from_slice(&x.to_le_bytes());
        }
    }
    out
}

type Part = Vec<(u64, Option<(u64, Seq)>)>;

fn decode_part(b: &[u8]) -> Option<Part> {
    if !b.len().is_multiple_of(32) {
        return None;
    }
    let u = |c: &[u8]| u64::from_le_bytes(c.try_into().expect("8"));
    b.chunks(32)
        .map(|c| match u(&c[8..16]) {
            0 => Some((u(&c[..8]), None)),
            1 => Some((u(&c[..8]), Some((u(&c[16..24]), u(&c[24..]))))),
            _ => None,
        })
        .collect()
}

fn decode_image(b: &[u8]) -> Option<Image> {
    if !b.len().is_multiple_of(24) {
        return None;
    }
    let u = |c: &[u8]| u64::from_le_bytes(c.try_into().expect("8"));
    Some(
        b.chunks(24)
            .map(|c| (u(&c[..8]), (u(&c[8..16]), u(&c[16..]))))
            .collect(),
    )
}

fn damaged() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, "a damaged image")
}

/// The volatile part of a node's state machine: lost in a crash.
#[derive(Default)]
pub(super) struct Vol {
    /// Every key written, with its value.
    pub state: HashMap<u64, u64>,
    /// The slot that last wrote each key (the apply-order check); a key restored from an
    /// image has the image's writer only when that writer is below the image's base (the
    /// slots from the base on are applied again from the log).
    pub last_writer: HashMap<u64, Seq>,
    /// Leader only: writes admitted and not applied here yet (key -> (slot, value, term
    /// admitted in)), so that the simulated clients execute transactions against them
    /// (dependent mode).
    pub spec: HashMap<u64, (Seq, u64, u64)>,
    /// Apply-order violations found (check 3), for the simulator to report.
    pub violations: Vec<String>,
    /// The latest snapshot record applied since the state was loaded: its slot. A write
    /// of an earlier slot applied after it would be missing from the snapshot.
    pub snapshot_at: Seq,
    /// The writers of slots below this one may be forgotten (the state came from an
    /// image or a restart with this base): the applied-before-told check does not judge
    /// them.
    pub forgot_below: Seq,
}

/// One node's state machine. The checkpointed image lives on the node's simulated disk
/// (`disk`, surviving crashes); everything else is [`Vol`].
pub(super) struct SimSm {
    node: u64,
    vol: Mutex<Vol>,
    disk: Arc<Mutex<Image>>,
}

impl SimSm {
    /// A state machine started from the image on `disk`, taken with every slot below
    /// `base` applied (writes of later slots it holds are applied again from the log, so
    /// they are not counted as applied for the order check).
    pub fn open(node: u64, disk: Arc<Mutex<Image>>, base: Seq) -> Self {
        let sm = Self {
            node,
            vol: Mutex::new(Vol::default()),
            disk,
        };
        sm.load(base);
        sm
    }

    /// The volatile state.
    pub fn vol(&self) -> MutexGuard<'_, Vol> {
        self.vol.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn disk(&self) -> MutexGuard<'_, Image> {
        self.disk.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The state restarts from the durable image (see [`SimSm::open`]).
    fn load(&self, base: Seq) {
        let img = self.disk().clone();
        let mut v = self.vol();
        v.state = img.iter().map(|(&k, &(v, _))| (k, v)).collect();
        v.last_writer = img
            .iter()
            .filter(|(_, &(_, w))| w < base)
            .map(|(&k, &(_, w))| (k, w))
            .collect();
        v.forgot_below = v.forgot_below.max(base);
        v.snapshot_at = 0;
    }

    /// After an image covering every slot below `base` is installed: writers at or past
    /// the base are forgotten, as at a restart.
    pub fn installed(&self, base: Seq) {
        let mut v = self.vol();
        v.last_writer.retain(|_, w| *w < base);
        v.forgot_below = v.forgot_below.max(base);
    }

    fn image_of(v: &Vol) -> Image {
        v.state
            .iter()
            .map(|(&k, &x)| (k, (x, v.last_writer.get(&k).copied().unwrap_or(0))))
            .collect()
    }
}

impl OooStateMachine for SimSm {
    fn apply(&self, slot: u64, records: &[(u32, Record)]) -> std::io::Result<()> {
        let mut v = self.vol();
        let mut bad = None;
        for (_, r) in records {
            if is_snapshot(r) {
                // Every block it declares was last written below it (a later write
                // applied first would be in the snapshot).
                if let Declared::Blocks(ranges) = &r.declared {
                    for k in ranges.iter().flat_map(|r| r.start..r.end) {
                        if let Some(&w) = v.last_writer.get(&k) {
                            if w > slot {
                                bad = Some((k, w));
                            }
                        }
                    }
                }
                v.snapshot_at = v.snapshot_at.max(slot);
                continue;
            }
            for (k, x) in record_writes(r) {
                if slot < v.snapshot_at && slot >= v.forgot_below {
                    let (node, at) = (self.node, v.snapshot_at);
                    v.violations.push(format!(
                        "node {node} applied slot {slot}, writing {k}, after the snapshot at \
                         slot {at}"
                    ));
                }
                if let Some(&w) = v.last_writer.get(&k) {
                    if w > slot {
                        bad = Some((k, w));
                    }
                }
                v.last_writer.insert(k, slot);
                v.state.insert(k, x);
                if v.spec.get(&k).is_some_and(|&(s, _, _)| s == slot) {
                    v.spec.remove(&k);
                }
            }
        }
        if let Some((k, w)) = bad {
            let node = self.node;
            v.violations.push(format!(
                "node {node} applied slot {slot} after slot {w}, both writing {k}"
            ));
        }
        Ok(())
    }

    fn checkpoint(&self) -> std::io::Result<()> {
        let img = Self::image_of(&self.vol());
        *self.disk() = img;
        Ok(())
    }

    fn image(&self) -> std::io::Result<Vec<u8>> {
        let v = self.vol();
        Ok(encode_image(&v.state, &v.last_writer))
    }

    fn restore(&self, image: &[u8]) -> std::io::Result<()> {
        let img = decode_image(image).ok_or_else(damaged)?;
        *self.disk() = img;
        // Every writer kept until the replica reports the base (`SimSm::installed`).
        self.load(Seq::MAX);
        Ok(())
    }

    fn image_part(&self, scope: &Footprint) -> std::io::Result<Option<Vec<u8>>> {
        let v = self.vol();
        Ok(Some(encode_part(&v.state, &v.last_writer, scope)))
    }

    fn restore_part(&self, image: &[u8]) -> std::io::Result<()> {
        let part = decode_part(image).ok_or_else(damaged)?;
        // Over this node's own state, which becomes durable whole (the contract).
        let mut img = Self::image_of(&self.vol());
        for (k, x) in part {
            match x {
                Some(x) => img.insert(k, x),
                None => img.remove(&k),
            };
        }
        *self.disk() = img;
        self.load(Seq::MAX);
        Ok(())
    }
}
