//! The raft log of one replica: raft-engine on disk, plus an in-memory cache of the newest
//! entries.
//!
//! With asynchronous ready, raft-rs hands entries to the application and, at
//! `advance_append_async`, forgets them from its own unstable log before they are on disk;
//! from then on it reads them through `Storage`. So `append` puts them in the cache at once,
//! and the cache keeps every entry that is not yet known to be persisted (TiKV's entry cache
//! plays the same part). Older entries are read back from raft-engine.

use std::collections::VecDeque;
use std::sync::Arc;

use raft::eraftpb::{ConfState, Entry, HardState, Snapshot};
use raft::{GetEntriesContext, RaftState, StorageError};
use raft_engine::{Engine, MessageExt};

/// The single raft group's id inside raft-engine.
pub const REGION: u64 = 1;
/// raft-engine key of the hard state.
pub const HARD_STATE_KEY: &[u8] = b"hs";

/// Tells raft-engine how to index raft-rs entries.
pub struct MsgExt;

impl MessageExt for MsgExt {
    type Entry = Entry;
    fn index(e: &Entry) -> u64 {
        e.index
    }
}

pub struct PeerStorage {
    engine: Arc<Engine>,
    hard_state: HardState,
    conf_state: ConfState,
    /// Entries `cache_first ..= last_index`, newest last.
    cache: VecDeque<Entry>,
    cache_first: u64,
    last_index: u64,
    /// Every entry up to here is in raft-engine and synced.
    persisted: u64,
}

fn store_err<E: std::fmt::Display>(e: E) -> raft::Error {
    raft::Error::Store(StorageError::Other(e.to_string().into()))
}

impl PeerStorage {
    /// Opens the group's state in `engine`: empty on a first start, else the hard state and
    /// the log raft-engine recovered. The membership is fixed: `voters`.
    pub fn open(engine: Arc<Engine>, voters: Vec<u64>) -> raft::Result<Self> {
        let hard_state = engine
            .get_message::<HardState>(REGION, HARD_STATE_KEY)
            .map_err(store_err)?
            .unwrap_or_default();
        let last_index = engine.last_index(REGION).unwrap_or(0);
        if let Some(first) = engine.first_index(REGION) {
            if first != 1 {
                return Err(store_err(format!(
                    "log starts at {first}: this peer never compacts, so it cannot restart from that"
                )));
            }
        }
        let conf_state = ConfState {
            voters,
            ..Default::default()
        };
        Ok(PeerStorage {
            engine,
            hard_state,
            conf_state,
            cache: VecDeque::new(),
            cache_first: last_index + 1,
            last_index,
            persisted: last_index,
        })
    }

    pub fn last_index(&self) -> u64 {
        self.last_index
    }

    pub fn set_hard_state(&mut self, hs: HardState) {
        self.hard_state = hs;
    }

    /// New entries from a Ready, not yet on disk. A first index at or below `last_index`
    /// replaces the tail from there (a follower's log that conflicts with its leader's).
    pub fn append(&mut self, ents: &[Entry]) {
        let Some(first) = ents.first() else { return };
        let first = first.index;
        assert!(
            first >= 1 && first <= self.last_index + 1,
            "append at {first} leaves a hole after {}",
            self.last_index
        );
        if first < self.cache_first {
            // Replaces entries that were only on disk: raft-engine drops its tail when the
            // new ones are written over it.
            self.cache.clear();
            self.cache_first = first;
        } else {
            self.cache.truncate((first - self.cache_first) as usize);
        }
        self.cache.extend(ents.iter().cloned());
        self.last_index = ents.last().unwrap().index;
        self.persisted = self.persisted.min(first - 1);
    }

    /// Everything up to `index` is synced in raft-engine (reported by the writer thread for
    /// the log as it stood when the write was queued).
    pub fn on_persisted(&mut self, index: u64) {
        self.persisted = self.persisted.max(index.min(self.last_index));
    }

    /// Drops cached entries below `index`, never one that is not persisted: those would not
    /// be readable anywhere else.
    pub fn trim_cache(&mut self, index: u64) {
        let to = index.min(self.persisted + 1);
        if to > self.cache_first {
            let n = ((to - self.cache_first) as usize).min(self.cache.len());
            self.cache.drain(..n);
            self.cache_first += n as u64;
        }
    }

    pub fn cache_len(&self) -> usize {
        self.cache.len()
    }

    fn cached(&self, idx: u64) -> Option<&Entry> {
        if idx < self.cache_first {
            return None;
        }
        self.cache.get((idx - self.cache_first) as usize)
    }
}

/// The size raft-rs's `limit_size` would count, near enough: payload plus a few bytes of
/// framing per entry.
fn approx_size(e: &Entry) -> u64 {
    (e.data.len() + e.context.len() + 24) as u64
}

impl raft::Storage for PeerStorage {
    fn initial_state(&self) -> raft::Result<RaftState> {
        Ok(RaftState::new(
            self.hard_state.clone(),
            self.conf_state.clone(),
        ))
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        if low < 1 {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if high > self.last_index + 1 {
            panic!(
                "entries [{low}, {high}) past the last index {}",
                self.last_index
            );
        }
        let max = max_size.into().unwrap_or(u64::MAX);
        let mut out = Vec::with_capacity((high - low).min(1024) as usize);
        let mut size = 0u64;
        if low < self.cache_first {
            // Persisted entries no longer cached: read them back from raft-engine (a slow
            // follower catching up).
            let end = high.min(self.cache_first);
            let limit = usize::try_from(max).unwrap_or(usize::MAX);
            self.engine
                .fetch_entries_to::<MsgExt>(REGION, low, end, Some(limit), &mut out)
                .map_err(store_err)?;
            size = out.iter().map(approx_size).sum();
            if out.len() as u64 != end - low {
                // raft-engine stopped at the size limit.
                return Ok(out);
            }
        }
        let from = low.max(self.cache_first);
        for idx in from..high {
            let e = self.cached(idx).expect("cached entry");
            size += approx_size(e);
            if !out.is_empty() && size > max {
                break;
            }
            out.push(e.clone());
        }
        Ok(out)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        if idx == 0 {
            return Ok(0);
        }
        if idx > self.last_index {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        if let Some(e) = self.cached(idx) {
            return Ok(e.term);
        }
        match self
            .engine
            .get_entry::<MsgExt>(REGION, idx)
            .map_err(store_err)?
        {
            Some(e) => Ok(e.term),
            None => Err(raft::Error::Store(StorageError::Unavailable)),
        }
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(1)
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.last_index)
    }

    fn snapshot(&self, _request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        // The log is never compacted, so raft never needs one.
        Err(raft::Error::Store(
            StorageError::SnapshotTemporarilyUnavailable,
        ))
    }
}
