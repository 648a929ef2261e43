//! Durable log store (`RaftLogStorage`) with group commit, and the in-memory state machine.
//!
//! Log file `DIR/log`: records `[u32 LE len][u32 LE crc32(body)][body = bincode(Entry)]`, back
//! to back. A zero `len` marks the end of the log: the file is kept zero-filled ahead of its
//! end (below), and a truncation overwrites the removed records with zeros.
//!
//! `append()` only queues: it puts the entries into the in-memory log (so every reader sees
//! them at once, as openraft requires) and hands them, with openraft's `IOFlushed` callback,
//! to the flusher thread. It never waits for the disk, so openraft 0.10 goes on with the
//! next request while the flusher works.
//!
//! The flusher thread takes everything queued since its last sync: it encodes all of those
//! appends into one buffer, writes it with one `pwrite`, runs one `fdatasync`, and only then
//! calls each append's callback, in order (group commit). Truncations and vote / purge-point
//! saves go through the same thread, so all write I/O stays in the order openraft issued it.
//!
//! Zeros ahead: while syncs are small, the flusher keeps up to `PREALLOCATE` bytes of zeros
//! written past the log's end (topped up in one piece when fewer than half are left), so
//! most `fdatasync`s overwrite blocks that are already allocated and written and do not
//! change the file's size, and the file system has no metadata to commit for them. This is
//! what Chorus's log does (`crates/chorus-storage/src/log.rs`, "Zeros ahead of the end"),
//! with the same sizes. Zeros are written rather than `fallocate`d: `fallocate` leaves
//! unwritten extents, and converting those at the first write is a metadata commit again.
//!
//! Vote and purge point live in `DIR/meta` (tmp file + fdatasync + rename + fsync(dir)).

use std::collections::VecDeque;
use std::fmt::Debug;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::ops::{Bound, RangeBounds};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc as std_mpsc, Arc, Mutex};

use futures_util::{Stream, StreamExt};
use openraft::alias::{EntryOf, LogIdOf, SnapshotMetaOf, SnapshotOf, StoredMembershipOf, VoteOf};
use openraft::storage::{EntryResponder, IOFlushed, RaftLogStorage, RaftStateMachine};
use openraft::{
    EntryPayload, LogState, OptionalSend, RaftLogReader, RaftSnapshotBuilder, StoredMembership,
};
use serde::{Deserialize, Serialize};

use crate::TypeConfig;

type Entry = EntryOf<TypeConfig>;
type LogId = LogIdOf<TypeConfig>;
type Vote = VoteOf<TypeConfig>;

/// fdatasync/fsync calls made by this process's stores (the log and `meta`).
pub static FSYNCS: AtomicU64 = AtomicU64::new(0);

/// Bytes of zeros kept written past the end of the log (as Chorus's `DEFAULT_PREALLOCATE`).
const PREALLOCATE: u64 = 1 << 20;
/// Zeros ahead are written only while the moving average of bytes per sync is below this (as
/// Chorus's `ZERO_AHEAD_BELOW`): with large syncs the metadata commit is small next to the
/// data, and writing the zeros would cost more than it saves.
const ZERO_AHEAD_BELOW: u64 = 64 << 10;
const REC_HEADER: usize = 8;

fn other(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

#[derive(Serialize, Deserialize, Default, Clone, Debug)]
struct Meta {
    vote: Option<Vote>,
    last_purged: Option<LogId>,
}

/// The in-memory log: `entries[i]` has index `first + i`.
struct Mem {
    first: u64,
    entries: VecDeque<Entry>,
    meta: Meta,
}

impl Mem {
    fn next_index(&self) -> u64 {
        self.first + self.entries.len() as u64
    }
}

enum FlushOp {
    Append {
        entries: Vec<Entry>,
        cb: IOFlushed<TypeConfig>,
    },
    /// Remove every entry with index >= `from`.
    Truncate {
        from: u64,
        done: tokio::sync::oneshot::Sender<io::Result<()>>,
    },
    /// Write `meta`; forget the file offsets of entries with index < `purge_below`.
    SaveMeta {
        meta: Meta,
        purge_below: Option<u64>,
        done: tokio::sync::oneshot::Sender<io::Result<()>>,
    },
}

/// Log store handle; clones share state (a clone is also the `LogReader`).
#[derive(Clone)]
pub struct LogStore {
    mem: Arc<Mutex<Mem>>,
    flusher: std_mpsc::Sender<FlushOp>,
}

/// One record parsed from a log file.
pub struct Parsed {
    pub offset: u64,
    pub entry: Entry,
}

/// Parses the records of a log file from the start; stops at the first zero length, short
/// record or checksum mismatch (the end, or a torn tail). Returns the records and where the
/// valid part ends.
pub fn parse_log(data: &[u8]) -> (Vec<Parsed>, usize) {
    let mut out = Vec::new();
    let mut off = 0usize;
    while off + REC_HEADER <= data.len() {
        let len = u32::from_le_bytes(data[off..off + 4].try_into().unwrap()) as usize;
        let crc = u32::from_le_bytes(data[off + 4..off + 8].try_into().unwrap());
        if len == 0 || off + REC_HEADER + len > data.len() {
            break;
        }
        let body = &data[off + REC_HEADER..off + REC_HEADER + len];
        if crc32fast::hash(body) != crc {
            break;
        }
        let Ok(entry) = bincode::deserialize::<Entry>(body) else {
            break;
        };
        out.push(Parsed {
            offset: off as u64,
            entry,
        });
        off += REC_HEADER + len;
    }
    (out, off)
}

impl LogStore {
    /// Opens (or creates) the log in `dir`, replaying whatever is there.
    pub fn open(dir: &Path) -> io::Result<LogStore> {
        std::fs::create_dir_all(dir)?;
        let meta: Meta = match std::fs::read(dir.join("meta")) {
            Ok(b) => bincode::deserialize(&b).map_err(other)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Meta::default(),
            Err(e) => return Err(e),
        };
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.join("log"))?;
        let mut data = Vec::new();
        file.read_to_end(&mut data)?;
        let (records, end) = parse_log(&data);

        // Rebuild the in-memory log and the file offsets. A later record for an index
        // replaces that index and everything after it (not written by this store, which
        // zeroes truncated records, but cheap to honour).
        let mut entries: VecDeque<Entry> = VecDeque::new();
        let mut offsets: VecDeque<u64> = VecDeque::new();
        let mut first = meta.last_purged.map_or(0, |l| l.index + 1);
        for p in records {
            let idx = p.entry.log_id.index;
            if idx < first && entries.is_empty() {
                continue; // purged
            }
            if !entries.is_empty() && idx < first + entries.len() as u64 {
                let keep = idx.saturating_sub(first) as usize;
                entries.truncate(keep);
                offsets.truncate(keep);
            }
            if entries.is_empty() {
                first = idx;
            } else if idx != first + entries.len() as u64 {
                return Err(other(format!("log hole before index {idx}")));
            }
            entries.push_back(p.entry);
            offsets.push_back(p.offset);
        }
        // Anything after the valid part that is not zero is a torn tail: zero it, so that
        // the next record written there is followed by zeros.
        if data[end..].iter().any(|&b| b != 0) {
            write_zeros(&file, end as u64, data.len() as u64)?;
            file.sync_data()?;
        }
        sync_dir(dir)?;

        let flusher = Flusher {
            file,
            dir: dir.to_path_buf(),
            end: end as u64,
            zeroed: data.len() as u64,
            offsets_first: first,
            offsets,
            avg_sync_bytes: 0,
            buf: Vec::with_capacity(1 << 20),
        };
        let (tx, rx) = std_mpsc::channel::<FlushOp>();
        std::thread::Builder::new()
            .name("log-flusher".into())
            .spawn(move || flusher.run(rx))?;

        Ok(LogStore {
            mem: Arc::new(Mutex::new(Mem {
                first,
                entries,
                meta,
            })),
            flusher: tx,
        })
    }

    fn send(&self, op: FlushOp) -> io::Result<()> {
        self.flusher
            .send(op)
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "flusher thread gone"))
    }

    async fn save_meta(&self, meta: Meta, purge_below: Option<u64>) -> io::Result<()> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.send(FlushOp::SaveMeta {
            meta,
            purge_below,
            done: tx,
        })?;
        rx.await.map_err(other)?
    }

    /// The entry at `index`, if the in-memory log has it (for the end-of-run check).
    pub fn entry(&self, index: u64) -> Option<Entry> {
        let g = self.mem.lock().unwrap();
        let i = index.checked_sub(g.first)?;
        g.entries.get(i as usize).cloned()
    }
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()?;
    FSYNCS.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

static ZEROS: [u8; 4096] = [0u8; 4096];

/// Writes zeros over `from..to`, one page-aligned 4 KiB `pwrite` at a time. Not in larger
/// writes: the page cache (ext4 with large folios, Linux 6.16+) sizes a new folio by the
/// write that creates it, and a record later written into a 64 KiB folio would dirty (and be
/// accounted in `/proc/<pid>/io` as) the whole folio at every sync.
fn write_zeros(file: &File, from: u64, to: u64) -> io::Result<()> {
    let mut at = from;
    while at < to {
        let n = ((to - at) as usize).min(4096 - (at % 4096) as usize);
        file.write_all_at(&ZEROS[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

/// Owns the log file. Runs on its own thread.
struct Flusher {
    file: File,
    dir: PathBuf,
    /// End of the valid log in the file.
    end: u64,
    /// The file holds records or zeros written by this store below this offset.
    zeroed: u64,
    /// `offsets[i]`: file offset of the record of index `offsets_first + i`.
    offsets_first: u64,
    offsets: VecDeque<u64>,
    /// Moving average of bytes per sync.
    avg_sync_bytes: u64,
    buf: Vec<u8>,
}

impl Flusher {
    fn run(mut self, rx: std_mpsc::Receiver<FlushOp>) {
        let mut cbs: Vec<IOFlushed<TypeConfig>> = Vec::new();
        while let Ok(op) = rx.recv() {
            // Everything queued now goes into this round: consecutive appends share one
            // write and one fdatasync.
            let mut next = Some(op);
            while let Some(op) = next.take().or_else(|| rx.try_recv().ok()) {
                match op {
                    FlushOp::Append { entries, cb } => {
                        if let Err(e) = self.encode(&entries) {
                            // Not expected (an in-order append of encodable entries); the
                            // buffer may hold a partial record, so write nothing more.
                            eprintln!("log flusher: {e}; exiting");
                            std::process::exit(1);
                        }
                        cbs.push(cb);
                    }
                    FlushOp::Truncate { from, done } => {
                        self.commit(&mut cbs);
                        let _ = done.send(self.truncate(from));
                    }
                    FlushOp::SaveMeta {
                        meta,
                        purge_below,
                        done,
                    } => {
                        self.commit(&mut cbs);
                        if let Some(p) = purge_below {
                            while self.offsets_first < p && !self.offsets.is_empty() {
                                self.offsets.pop_front();
                                self.offsets_first += 1;
                            }
                            self.offsets_first = self.offsets_first.max(p);
                        }
                        let _ = done.send(self.save_meta(&meta));
                    }
                }
            }
            self.commit(&mut cbs);
        }
    }

    /// Appends the records of `entries` to the pending buffer and notes their offsets.
    fn encode(&mut self, entries: &[Entry]) -> io::Result<()> {
        for ent in entries {
            let idx = ent.log_id.index;
            let next = self.offsets_first + self.offsets.len() as u64;
            if self.offsets.is_empty() {
                self.offsets_first = idx;
            } else if idx != next {
                return Err(other(format!("append of index {idx}, expected {next}")));
            }
            let start = self.buf.len();
            self.buf.extend_from_slice(&[0u8; REC_HEADER]);
            bincode::serialize_into(&mut self.buf, ent).map_err(other)?;
            let body = &self.buf[start + REC_HEADER..];
            let crc = crc32fast::hash(body);
            let len = body.len() as u32;
            self.buf[start..start + 4].copy_from_slice(&len.to_le_bytes());
            self.buf[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
            self.offsets.push_back(self.end + start as u64);
        }
        Ok(())
    }

    /// Writes the pending buffer (and zeros ahead), runs one fdatasync, then reports every
    /// pending append as flushed.
    fn commit(&mut self, cbs: &mut Vec<IOFlushed<TypeConfig>>) {
        if self.buf.is_empty() && cbs.is_empty() {
            return;
        }
        let res = self.write_and_sync();
        self.buf.clear();
        for cb in cbs.drain(..) {
            cb.io_completed(match &res {
                Ok(()) => Ok(()),
                Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
            });
        }
        if let Err(e) = res {
            // The file's state is unknown now; stop rather than write more after it.
            eprintln!("log flusher: {e}; exiting");
            std::process::exit(1);
        }
    }

    fn write_and_sync(&mut self) -> io::Result<()> {
        let n = self.buf.len() as u64;
        self.file.write_all_at(&self.buf, self.end)?;
        self.end += n;
        self.avg_sync_bytes = (self.avg_sync_bytes * 7 + n) / 8;
        if self.avg_sync_bytes < ZERO_AHEAD_BELOW && self.zeroed < self.end + PREALLOCATE / 2 {
            let from = self.zeroed.max(self.end);
            let to = self.end.next_multiple_of(4096) + PREALLOCATE;
            write_zeros(&self.file, from, to)?;
            self.zeroed = to;
        }
        self.zeroed = self.zeroed.max(self.end);
        self.file.sync_data()?;
        FSYNCS.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn truncate(&mut self, from: u64) -> io::Result<()> {
        if from < self.offsets_first {
            return Err(other(format!("truncate at {from}, below the first offset")));
        }
        let i = (from - self.offsets_first) as usize;
        let Some(&off) = self.offsets.get(i) else {
            return Ok(());
        };
        self.offsets.truncate(i);
        // Zero the removed records: replay then ends at `off`, and the file keeps its size.
        write_zeros(&self.file, off, self.end)?;
        self.end = off;
        self.file.sync_data()?;
        FSYNCS.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn save_meta(&self, meta: &Meta) -> io::Result<()> {
        let tmp = self.dir.join("meta.tmp");
        let mut f = File::create(&tmp)?;
        f.write_all(&bincode::serialize(meta).map_err(other)?)?;
        f.sync_data()?;
        FSYNCS.fetch_add(1, Ordering::Relaxed);
        std::fs::rename(&tmp, self.dir.join("meta"))?;
        sync_dir(&self.dir)
    }
}

fn range_of(range: &impl RangeBounds<u64>) -> (u64, u64) {
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s + 1,
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.saturating_add(1),
        Bound::Excluded(&e) => e,
        Bound::Unbounded => u64::MAX,
    };
    (start, end)
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        let (start, end) = range_of(&range);
        let g = self.mem.lock().unwrap();
        let start = start.max(g.first);
        let end = end.min(g.next_index());
        if start >= end {
            return Ok(Vec::new());
        }
        let (a, b) = ((start - g.first) as usize, (end - g.first) as usize);
        Ok(g.entries.range(a..b).cloned().collect())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        Ok(self.mem.lock().unwrap().meta.vote)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        let g = self.mem.lock().unwrap();
        let last = g.entries.back().map(|e| e.log_id).or(g.meta.last_purged);
        Ok(LogState {
            last_purged_log_id: g.meta.last_purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        let meta = {
            let mut g = self.mem.lock().unwrap();
            g.meta.vote = Some(*vote);
            g.meta.clone()
        };
        self.save_meta(meta, None).await
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: IOFlushed<TypeConfig>,
    ) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        // Entries are cheap to clone (the payload is an Arc): one copy for the readers, one
        // for the flusher, which does the encoding off this (RaftCore's) task.
        let entries: Vec<Entry> = entries.into_iter().collect();
        {
            let mut g = self.mem.lock().unwrap();
            for ent in &entries {
                let idx = ent.log_id.index;
                if g.entries.is_empty() {
                    g.first = idx;
                } else if idx != g.next_index() {
                    return Err(other(format!(
                        "append of index {idx}, expected {}",
                        g.next_index()
                    )));
                }
                g.entries.push_back(ent.clone());
            }
        }
        self.send(FlushOp::Append {
            entries,
            cb: callback,
        })
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        let from = last_log_id.map_or(0, |l| l.index + 1);
        {
            let mut g = self.mem.lock().unwrap();
            if from < g.next_index() {
                let keep = from.saturating_sub(g.first) as usize;
                g.entries.truncate(keep);
                if g.entries.is_empty() {
                    g.first = from;
                }
            }
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.send(FlushOp::Truncate { from, done: tx })?;
        rx.await.map_err(other)?
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        let meta = {
            let mut g = self.mem.lock().unwrap();
            while g.first <= log_id.index && !g.entries.is_empty() {
                g.entries.pop_front();
                g.first += 1;
            }
            g.first = g.first.max(log_id.index + 1);
            g.meta.last_purged = Some(log_id);
            g.meta.clone()
        };
        // The purged records stay in the file; replay skips them using `last_purged`.
        self.save_meta(meta, Some(log_id.index + 1)).await
    }
}

// ---------------------------------------------------------------------------------------------
// State machine: in memory. It records the last applied log id (and the membership, which
// openraft needs) and answers each waiting client with `()`.

#[derive(Serialize, Deserialize, Default, Clone, Debug)]
struct SmData {
    last_applied: Option<LogId>,
    last_membership: StoredMembershipOf<TypeConfig>,
}

#[derive(Default)]
struct SmInner {
    data: SmData,
    current: Option<(SnapshotMetaOf<TypeConfig>, Vec<u8>)>,
}

#[derive(Clone, Default)]
pub struct StateMachine {
    inner: Arc<Mutex<SmInner>>,
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    type SnapshotData = Vec<u8>;

    async fn build_snapshot(&mut self) -> Result<SnapshotOf<TypeConfig, Vec<u8>>, io::Error> {
        let mut g = self.inner.lock().unwrap();
        let bytes = bincode::serialize(&g.data).map_err(other)?;
        let meta = SnapshotMetaOf::<TypeConfig> {
            last_log_id: g.data.last_applied,
            last_membership: g.data.last_membership.clone(),
        };
        g.current = Some((meta.clone(), bytes.clone()));
        Ok(SnapshotOf::<TypeConfig, Vec<u8>> {
            meta,
            snapshot: bytes,
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotData = Vec<u8>;
    type SnapshotBuilder = StateMachine;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId>, StoredMembershipOf<TypeConfig>), io::Error> {
        let g = self.inner.lock().unwrap();
        Ok((g.data.last_applied, g.data.last_membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), io::Error>
    where
        Strm: Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>> + Unpin + OptionalSend,
    {
        while let Some(item) = entries.next().await {
            let (ent, responder) = item?;
            {
                let mut g = self.inner.lock().unwrap();
                g.data.last_applied = Some(ent.log_id);
                if let EntryPayload::Membership(m) = &ent.payload {
                    g.data.last_membership = StoredMembership::new(Some(ent.log_id), m.clone());
                }
            }
            if let Some(r) = responder {
                r.send(());
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMetaOf<TypeConfig>,
        snapshot: Vec<u8>,
    ) -> Result<(), io::Error> {
        let data: SmData = bincode::deserialize(&snapshot).map_err(other)?;
        let mut g = self.inner.lock().unwrap();
        g.data = data;
        g.current = Some((meta.clone(), snapshot));
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<SnapshotOf<TypeConfig, Vec<u8>>>, io::Error> {
        let g = self.inner.lock().unwrap();
        Ok(g.current
            .as_ref()
            .map(|(meta, bytes)| SnapshotOf::<TypeConfig, Vec<u8>> {
                meta: meta.clone(),
                snapshot: bytes.clone(),
            }))
    }
}
