//! Durable log store (`RaftLogStorage`) and in-memory state machine (`RaftStateMachine`).
//!
//! Log file `DIR/log`: a sequence of records `[u32 LE len][bincode(Entry)]`, appended.
//! Every `append()` call encodes its whole batch into one buffer and hands it to a
//! dedicated flusher thread, which does exactly one `write_all` + one `File::sync_data()`
//! (fdatasync) for it and only then invokes openraft's `LogFlushed` callback. The entries
//! are also kept in memory (with the file offset of their record) so that the log reader
//! (used by the replication streams) never touches the disk.
//!
//! `truncate()` cuts the file at the record offset of the first removed entry (set_len +
//! fdatasync, through the same flusher thread so it is ordered with the appends).
//!
//! Vote and purge point live in `DIR/meta`, rewritten as tmp file + fdatasync + rename +
//! fsync(dir): `save_vote()` returns only once the vote is on disk.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs::{File, OpenOptions};
use std::io::{self, Cursor, Read, Seek, SeekFrom, Write};
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::{mpsc as std_mpsc, Arc, Mutex};

use openraft::storage::{LogFlushed, RaftLogStorage, RaftStateMachine};
use openraft::{
    AnyError, Entry, EntryPayload, LogId, LogState, OptionalSend, RaftLogReader,
    RaftSnapshotBuilder, Snapshot, SnapshotMeta, StorageError, StorageIOError, StoredMembership,
    Vote,
};
use serde::{Deserialize, Serialize};

use crate::{NodeId, TypeConfig};

type SErr = StorageError<NodeId>;

fn werr(e: impl std::error::Error + 'static) -> SErr {
    StorageIOError::write_logs(AnyError::new(&e)).into()
}

#[derive(Serialize, Deserialize, Default, Clone, Debug)]
struct Meta {
    vote: Option<Vote<NodeId>>,
    last_purged: Option<LogId<NodeId>>,
}

struct LogInner {
    /// index -> (file offset of the record, entry)
    entries: BTreeMap<u64, (u64, Entry<TypeConfig>)>,
    meta: Meta,
    /// Logical end of the log file (all appends handed to the flusher so far).
    file_end: u64,
}

enum FlushOp {
    Append {
        buf: Vec<u8>,
        cb: LogFlushed<TypeConfig>,
    },
    Truncate {
        len: u64,
        done: tokio::sync::oneshot::Sender<io::Result<()>>,
    },
}

/// Log store handle; clones share state (the clone is also the `LogReader`).
#[derive(Clone)]
pub struct LogStore {
    inner: Arc<Mutex<LogInner>>,
    flusher: std_mpsc::Sender<FlushOp>,
    dir: PathBuf,
    meta_lock: Arc<tokio::sync::Mutex<()>>,
}

impl LogStore {
    /// Open (or create) the log in `dir`, replaying whatever is there.
    pub fn open(dir: &Path) -> io::Result<LogStore> {
        std::fs::create_dir_all(dir)?;
        let meta: Meta = match std::fs::read(dir.join("meta")) {
            Ok(b) => bincode::deserialize(&b)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Meta::default(),
            Err(e) => return Err(e),
        };
        let path = dir.join("log");
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        let mut data = Vec::new();
        file.read_to_end(&mut data)?;
        let mut entries = BTreeMap::new();
        let mut off = 0usize;
        while off + 4 <= data.len() {
            let len = u32::from_le_bytes(data[off..off + 4].try_into().unwrap()) as usize;
            if len == 0 || off + 4 + len > data.len() {
                break;
            }
            let ent: Entry<TypeConfig> = match bincode::deserialize(&data[off + 4..off + 4 + len]) {
                Ok(e) => e,
                Err(_) => break,
            };
            let idx = ent.log_id.index;
            // A later record for an index replaces it and everything after it.
            let _ = entries.split_off(&idx);
            if meta.last_purged.is_none_or(|p| idx > p.index) {
                entries.insert(idx, (off as u64, ent));
            }
            off += 4 + len;
        }
        if off < data.len() {
            // Torn tail from a crash: cut it off.
            file.set_len(off as u64)?;
            file.sync_data()?;
        }
        file.seek(SeekFrom::Start(off as u64))?;
        sync_dir(dir)?;

        let (tx, rx) = std_mpsc::channel::<FlushOp>();
        std::thread::Builder::new()
            .name("log-flusher".into())
            .spawn(move || flusher(file, rx))?;

        Ok(LogStore {
            inner: Arc::new(Mutex::new(LogInner {
                entries,
                meta,
                file_end: off as u64,
            })),
            flusher: tx,
            dir: dir.to_path_buf(),
            meta_lock: Arc::new(tokio::sync::Mutex::new(())),
        })
    }

    async fn save_meta(&self, meta: Meta) -> Result<(), SErr> {
        let _g = self.meta_lock.lock().await;
        let dir = self.dir.clone();
        tokio::task::spawn_blocking(move || -> io::Result<()> {
            let tmp = dir.join("meta.tmp");
            let mut f = File::create(&tmp)?;
            f.write_all(&bincode::serialize(&meta).map_err(io::Error::other)?)?;
            f.sync_data()?;
            std::fs::rename(&tmp, dir.join("meta"))?;
            sync_dir(&dir)
        })
        .await
        .map_err(|e| StorageError::from(StorageIOError::write_vote(AnyError::new(&e))))?
        .map_err(|e| StorageIOError::write_vote(AnyError::new(&e)).into())
    }
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// The flusher thread: one write + one fdatasync per append() call, callback after the sync.
fn flusher(mut file: File, rx: std_mpsc::Receiver<FlushOp>) {
    while let Ok(op) = rx.recv() {
        match op {
            FlushOp::Append { buf, cb } => {
                let r = file.write_all(&buf).and_then(|_| file.sync_data());
                cb.log_io_completed(r);
            }
            FlushOp::Truncate { len, done } => {
                let r = file
                    .set_len(len)
                    .and_then(|_| file.sync_data())
                    .and_then(|_| file.seek(SeekFrom::Start(len)).map(|_| ()));
                let _ = done.send(r);
            }
        }
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, SErr> {
        let g = self.inner.lock().unwrap();
        Ok(g.entries
            .range(range)
            .map(|(_, (_, e))| e.clone())
            .collect())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, SErr> {
        let g = self.inner.lock().unwrap();
        let last = g
            .entries
            .iter()
            .next_back()
            .map(|(_, (_, e))| e.log_id)
            .or(g.meta.last_purged);
        Ok(LogState {
            last_purged_log_id: g.meta.last_purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), SErr> {
        let meta = {
            let mut g = self.inner.lock().unwrap();
            g.meta.vote = Some(*vote);
            g.meta.clone()
        };
        self.save_meta(meta).await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, SErr> {
        Ok(self.inner.lock().unwrap().meta.vote)
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), SErr>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut buf = Vec::new();
        {
            let mut g = self.inner.lock().unwrap();
            let base = g.file_end;
            for ent in entries {
                let start = buf.len();
                buf.extend_from_slice(&[0u8; 4]);
                bincode::serialize_into(&mut buf, &ent).map_err(werr)?;
                let len = (buf.len() - start - 4) as u32;
                buf[start..start + 4].copy_from_slice(&len.to_le_bytes());
                g.entries
                    .insert(ent.log_id.index, (base + start as u64, ent));
            }
            g.file_end = base + buf.len() as u64;
        }
        self.flusher
            .send(FlushOp::Append { buf, cb: callback })
            .map_err(|_| {
                werr(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    "flusher thread gone",
                ))
            })?;
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), SErr> {
        let len = {
            let mut g = self.inner.lock().unwrap();
            let removed = g.entries.split_off(&log_id.index);
            match removed.values().next() {
                None => return Ok(()),
                Some((off, _)) => {
                    g.file_end = *off;
                    *off
                }
            }
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.flusher
            .send(FlushOp::Truncate { len, done: tx })
            .map_err(|_| {
                werr(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    "flusher thread gone",
                ))
            })?;
        rx.await.map_err(werr)?.map_err(werr)
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), SErr> {
        let meta = {
            let mut g = self.inner.lock().unwrap();
            let keep = g.entries.split_off(&(log_id.index + 1));
            g.entries = keep;
            g.meta.last_purged = Some(log_id);
            g.meta.clone()
        };
        // The purged records stay in the file; replay skips them using `last_purged`.
        self.save_meta(meta).await
    }
}

// ---------------------------------------------------------------------------------------------
// State machine: in memory, records the last applied log id (and membership, which openraft
// needs). openraft answers the waiting `client_write` once `apply()` returns.

#[derive(Serialize, Deserialize, Default, Clone, Debug)]
struct SmData {
    last_applied: Option<LogId<NodeId>>,
    last_membership: StoredMembership<NodeId, openraft::BasicNode>,
}

#[derive(Default)]
struct SmInner {
    data: SmData,
    snapshot_idx: u64,
    current: Option<(SnapshotMeta<NodeId, openraft::BasicNode>, Vec<u8>)>,
}

#[derive(Clone, Default)]
pub struct StateMachine {
    inner: Arc<Mutex<SmInner>>,
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, SErr> {
        let mut g = self.inner.lock().unwrap();
        let bytes = bincode::serialize(&g.data).map_err(werr)?;
        g.snapshot_idx += 1;
        let meta = SnapshotMeta {
            last_log_id: g.data.last_applied,
            last_membership: g.data.last_membership.clone(),
            snapshot_id: format!(
                "{:?}-{}",
                g.data.last_applied.map(|l| l.index),
                g.snapshot_idx
            ),
        };
        g.current = Some((meta.clone(), bytes.clone()));
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(bytes)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = StateMachine;

    async fn applied_state(
        &mut self,
    ) -> Result<
        (
            Option<LogId<NodeId>>,
            StoredMembership<NodeId, openraft::BasicNode>,
        ),
        SErr,
    > {
        let g = self.inner.lock().unwrap();
        Ok((g.data.last_applied, g.data.last_membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<()>, SErr>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut g = self.inner.lock().unwrap();
        let mut res = Vec::new();
        for ent in entries {
            g.data.last_applied = Some(ent.log_id);
            if let EntryPayload::Membership(m) = ent.payload {
                g.data.last_membership = StoredMembership::new(Some(ent.log_id), m);
            }
            res.push(());
        }
        Ok(res)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, SErr> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, openraft::BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), SErr> {
        let bytes = snapshot.into_inner();
        let data: SmData = bincode::deserialize(&bytes).map_err(werr)?;
        let mut g = self.inner.lock().unwrap();
        g.data = data;
        g.current = Some((meta.clone(), bytes));
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, SErr> {
        let g = self.inner.lock().unwrap();
        Ok(g.current.as_ref().map(|(meta, bytes)| Snapshot {
            meta: meta.clone(),
            snapshot: Box::new(Cursor::new(bytes.clone())),
        }))
    }
}
