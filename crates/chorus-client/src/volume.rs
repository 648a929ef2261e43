//! The routing client (PolarFS section 3.2.2, PolarSwitch): byte-addressed I/O on a
//! volume, routed to the leaders of its chunks.
//!
//! A [`VolumeClient`] keeps the volume's chunk map, tagged with its version. The control
//! plane keeps it current both ways: it pushes every change (`WatchVolume`, a task the
//! client runs) and answers a pull (`StatVolume`) when a chunk's group is not where the
//! map says. An I/O is split at chunk boundaries ([`crate::split`]); each chunk's piece is
//! sent to that chunk's leader, found by trying its replicas (a follower refuses with the
//! leader's id, which the client remembers).
//!
//! Every outcome is explicit:
//! - `Ok` from [`VolumeClient::write`]: every piece committed — on a majority of each
//!   chunk's replicas, and applied at the leader that acknowledged it.
//! - [`VolumeError::Failed`]: the piece named was not committed (refused by every
//!   replica within [`VolumeClient::retry_for`], or failed by the group); the write is not
//!   acknowledged, though pieces of other chunks before it may have committed.
//! - [`VolumeError::Unknown`]: the piece named may or may not have committed (the leader
//!   stopped or the connection broke after sending it). It is not retried: the caller
//!   decides, as after a crash.
//!
//! Retries are bounded by [`VolumeClient::retry_for`], and only ever repeat a request
//! that surely did nothing (not the leader, a connection refused, a window full).
//! Writes must be whole sectors or are read, patched and written back: two clients
//! writing different bytes of one sector at once may then lose one of the writes, as on a
//! disk with 4 KiB sectors.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::time::Instant;
use tonic::transport::Channel;

use crate::security::Conn;
use tonic::{Code, Status};

use crate::pb;
use crate::pb::chorus_client::ChorusClient;
use crate::pb::control_client::ControlClient;
use crate::split::{split, SplitError};

/// Bytes per sector: the unit a chunk takes writes in.
pub const SECTOR: u64 = 4096;
/// Most bytes one record carries (a piece is cut into records of at most this).
const RECORD_BYTES_MAX: u64 = 1 << 20;
/// Most sectors one `ReadBlocks` call returns.
const READ_SECTORS_MAX: u64 = 4096;

/// A volume's chunk map as the control plane answered it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeMap {
    /// The volume's name.
    pub name: String,
    /// Its size.
    pub size_bytes: u64,
    /// Bytes per chunk.
    pub chunk_bytes: u64,
    /// Its chunks' allocation unit.
    pub block_bytes: u32,
    /// `creating`, `ready` or `deleting`.
    pub state: String,
    /// Increases with every change to the map; a newer map replaces an older one only.
    pub version: u64,
    /// Chunk `i` covers bytes `[i × chunk_bytes, (i + 1) × chunk_bytes)`.
    pub chunks: Vec<pb::ChunkInfo>,
    /// Client API address of every node the chunks name.
    pub addrs: HashMap<u64, String>,
    /// The snapshot being taken (its id), 0 when none: writes issued while it is set
    /// carry it as their snapshot tag (PolarFS section 7.2), so that none of them is in
    /// the snapshot.
    pub snapshot_tag: u64,
}

impl VolumeMap {
    /// The map in a control plane answer, checked: one chunk per `chunk_bytes` of size,
    /// every chunk with replicas whose addresses are known.
    pub fn from_info(v: pb::VolumeInfo) -> Result<Self, VolumeError> {
        let bad = |detail: String| VolumeError::BadMap {
            name: v.name.clone(),
            detail,
        };
        if v.chunk_bytes == 0 || !v.chunk_bytes.is_multiple_of(SECTOR) {
            return Err(bad(format!(
                "chunk_bytes {} is not a positive multiple of {SECTOR}",
                v.chunk_bytes
            )));
        }
        let want = v.size_bytes.div_ceil(v.chunk_bytes);
        if v.chunks.len() as u64 != want {
            return Err(bad(format!(
                "{} chunks for {} bytes of {}-byte chunks",
                v.chunks.len(),
                v.size_bytes,
                v.chunk_bytes
            )));
        }
        let addrs: HashMap<u64, String> = v
            .nodes
            .iter()
            .map(|n| (n.id, n.client_addr.clone()))
            .collect();
        for c in &v.chunks {
            if c.replicas.is_empty() {
                return Err(bad(format!("chunk group {} has no replicas", c.group)));
            }
            if let Some(n) = c.replicas.iter().find(|n| !addrs.contains_key(n)) {
                return Err(bad(format!(
                    "chunk group {} names node {n}, whose address is not given",
                    c.group
                )));
            }
        }
        Ok(Self {
            name: v.name,
            size_bytes: v.size_bytes,
            chunk_bytes: v.chunk_bytes,
            block_bytes: v.block_bytes,
            state: v.state,
            version: v.version,
            chunks: v.chunks,
            addrs,
            snapshot_tag: v.snapshot_tag,
        })
    }
}

/// What went wrong with a volume I/O or its map.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// No control node answered, or one answered with an error.
    #[error("control plane: {0}")]
    Control(String),
    /// The volume does not exist.
    #[error("volume `{0}` does not exist")]
    NoSuchVolume(String),
    /// The volume exists but takes no I/O (being created or deleted).
    #[error("volume `{name}` is {state}, not ready for I/O")]
    NotReady {
        /// The volume.
        name: String,
        /// Its state.
        state: String,
    },
    /// The control plane's map breaks its invariants.
    #[error("volume `{name}`: the control plane's chunk map is not usable: {detail}")]
    BadMap {
        /// The volume.
        name: String,
        /// What is wrong.
        detail: String,
    },
    /// The range is not inside the volume.
    #[error(transparent)]
    Range(#[from] SplitError),
    /// The piece was not committed; the write is not acknowledged.
    #[error("chunk {chunk} (group {group}): the write failed and was not committed: {why}")]
    Failed {
        /// The chunk's index in the volume.
        chunk: u64,
        /// Its group.
        group: u64,
        /// Why.
        why: String,
    },
    /// The piece may or may not have committed.
    #[error("chunk {chunk} (group {group}): outcome unknown, the write may have committed: {why}")]
    Unknown {
        /// The chunk's index in the volume.
        chunk: u64,
        /// Its group.
        group: u64,
        /// Why.
        why: String,
    },
    /// A read could not be served.
    #[error("chunk {chunk} (group {group}): read failed: {why}")]
    ReadFailed {
        /// The chunk's index in the volume.
        chunk: u64,
        /// Its group.
        group: u64,
        /// Why.
        why: String,
    },
}

/// What the clones of one client share.
#[derive(Debug)]
struct Shared {
    /// Control plane endpoints (`http://host:port`).
    control: Vec<String>,
    /// The cached map; replaced only by one of a higher version.
    map: Mutex<VolumeMap>,
    /// The leader last seen per chunk group.
    leaders: Mutex<HashMap<u64, u64>>,
    /// One connection per chunk server address.
    conns: Mutex<HashMap<String, ChorusClient<Conn>>>,
    /// Maps pulled or pushed (for tests and status).
    refreshes: std::sync::atomic::AtomicU64,
}

/// Byte-addressed I/O on one volume (see the module docs). Cheap to clone: clones share
/// the map, the leaders and the connections, so many tasks can run I/O at once.
#[derive(Clone, Debug)]
pub struct VolumeClient {
    shared: Arc<Shared>,
    /// How long one piece keeps looking for its chunk's leader.
    pub retry_for: Duration,
    /// How long one call waits for its answer before it is cut off (an append then ends
    /// [`VolumeError::Unknown`]).
    pub call_timeout: Duration,
}

async fn connect(ep: &str, timeout: Duration) -> Result<Channel, String> {
    crate::security::endpoint(ep)
        .map_err(|e| format!("endpoint `{ep}`: {e}"))?
        .connect_timeout(Duration::from_secs(2))
        .timeout(timeout)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(10))
        .tcp_nodelay(true)
        .connect()
        .await
        .map_err(|e| format!("{ep}: unreachable: {e}: {}", chain(&e)))
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut s = String::new();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(&c.to_string());
        s.push_str("; ");
        cur = c.source();
    }
    s
}

/// Whether a failed call surely did nothing: the server marked it not started, or the
/// connection could not be made.
fn not_sent(s: &Status) -> bool {
    if s.metadata().contains_key(crate::NOT_STARTED_KEY) {
        return true;
    }
    let mut text = s.message().to_ascii_lowercase();
    let mut src = std::error::Error::source(s);
    while let Some(e) = src {
        text.push_str(&e.to_string().to_ascii_lowercase());
        src = e.source();
    }
    text.contains("connection refused") || text.contains("tcp connect error")
}

fn leader_hint(s: &Status) -> Option<u64> {
    s.metadata()
        .get("chorus-leader")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

/// Calls the control plane: each endpoint in turn until one answers (a follower's
/// FAILED_PRECONDITION sends it on to the next). `Ok(Err(status))` is an answer.
pub async fn on_control<T, F, Fut>(
    control: &[String],
    timeout: Duration,
    mut call: F,
) -> Result<Result<T, Status>, String>
where
    F: FnMut(ControlClient<Conn>) -> Fut,
    Fut: std::future::Future<Output = Result<T, Status>>,
{
    if control.is_empty() {
        return Err("no control plane endpoints given".into());
    }
    let start = Instant::now();
    // The last answer of each endpoint, for the error.
    let mut last: Vec<String> = vec![String::new(); control.len()];
    loop {
        for (i, ep) in control.iter().enumerate() {
            let ch = match connect(ep, timeout).await {
                Ok(ch) => ch,
                Err(e) => {
                    last[i] = e;
                    continue;
                }
            };
            match call(ControlClient::new(crate::security::authed(ch))).await {
                Err(s) if s.code() == Code::FailedPrecondition || s.code() == Code::Unavailable => {
                    last[i] = format!("{ep}: {:?}: {}", s.code(), s.message());
                }
                r => return Ok(r),
            }
        }
        if start.elapsed() >= timeout {
            return Err(format!(
                "no control node answered within {timeout:?}; last answers: {}",
                last.join("; ")
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

impl VolumeClient {
    /// Opens volume `name` through the control plane at `control` (its nodes' client API
    /// addresses): pulls its map and starts following its changes.
    pub async fn open(control: Vec<String>, name: &str) -> Result<Self, VolumeError> {
        let map = Self::pull(&control, name).await?;
        let c = Self {
            shared: Arc::new(Shared {
                control,
                map: Mutex::new(map),
                leaders: Mutex::new(HashMap::new()),
                conns: Mutex::new(HashMap::new()),
                refreshes: 0.into(),
            }),
            retry_for: Duration::from_secs(15),
            call_timeout: Duration::from_secs(30),
        };
        tokio::spawn(watch(Arc::downgrade(&c.shared), name.to_string()));
        Ok(c)
    }

    async fn pull(control: &[String], name: &str) -> Result<VolumeMap, VolumeError> {
        let req = pb::VolumeName { name: name.into() };
        let r = on_control(control, Duration::from_secs(10), |mut c| {
            let req = req.clone();
            async move { c.stat_volume(req).await.map(|r| r.into_inner()) }
        })
        .await
        .map_err(VolumeError::Control)?;
        match r {
            Ok(info) => {
                // Any control node answers from the state it has applied, which may lag:
                // the latest map the others offer wins.
                let mut best = VolumeMap::from_info(info)?;
                for ep in control {
                    let Ok(ch) = connect(ep, Duration::from_secs(2)).await else {
                        continue;
                    };
                    let r = ControlClient::new(crate::security::authed(ch))
                        .stat_volume(req.clone())
                        .await;
                    if let Ok(Ok(m)) = r.map(|r| VolumeMap::from_info(r.into_inner())) {
                        if newer(&m, &best) {
                            best = m;
                        }
                    }
                }
                Ok(best)
            }
            Err(s) if s.code() == Code::NotFound => Err(VolumeError::NoSuchVolume(name.into())),
            Err(s) => Err(VolumeError::Control(format!(
                "{:?}: {}",
                s.code(),
                s.message()
            ))),
        }
    }

    /// Pulls the map again (done by itself when a chunk is not where the map says).
    pub async fn refresh(&self) -> Result<(), VolumeError> {
        let name = self.map().name;
        let m = Self::pull(&self.shared.control, &name).await?;
        install(&self.shared, m);
        Ok(())
    }

    /// The cached map.
    pub fn map(&self) -> VolumeMap {
        self.shared
            .map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// How many newer maps were installed since open (pulled or pushed).
    pub fn refreshes(&self) -> u64 {
        self.shared
            .refreshes
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    fn ready_map(&self) -> Result<VolumeMap, VolumeError> {
        let m = self.map();
        if m.state != "ready" {
            return Err(VolumeError::NotReady {
                name: m.name,
                state: m.state,
            });
        }
        Ok(m)
    }

    async fn conn(&self, addr: &str) -> Result<ChorusClient<Conn>, String> {
        if let Some(c) = self
            .shared
            .conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(addr)
        {
            return Ok(c.clone());
        }
        let ch = connect(addr, self.call_timeout).await?;
        let c = ChorusClient::new(crate::security::authed(ch))
            .max_decoding_message_size(64 << 20)
            .max_encoding_message_size(64 << 20);
        self.shared
            .conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(addr.to_string(), c.clone());
        Ok(c)
    }

    fn forget_conn(&self, addr: &str) {
        self.shared
            .conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(addr);
    }

    /// Chunk `i`'s group and its replicas with their addresses, the last leader seen
    /// first.
    fn route(&self, i: u64) -> Result<(u64, Vec<(u64, String)>), VolumeError> {
        let m = self.ready_map()?;
        let c = m
            .chunks
            .get(i as usize)
            .ok_or_else(|| VolumeError::BadMap {
                name: m.name.clone(),
                detail: format!("no chunk {i}"),
            })?;
        let leader = self
            .shared
            .leaders
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&c.group)
            .copied();
        let mut nodes: Vec<u64> = c.replicas.clone();
        // A replica being added may lead once its change is done, before the map that
        // records the move is pushed.
        if c.moving_to != 0 && !nodes.contains(&c.moving_to) {
            nodes.push(c.moving_to);
        }
        if let Some(l) = leader.filter(|l| nodes.contains(l)) {
            nodes.retain(|n| *n != l);
            nodes.insert(0, l);
        }
        let routed = nodes
            .into_iter()
            .filter_map(|n| m.addrs.get(&n).map(|a| (n, a.clone())))
            .collect();
        Ok((c.group, routed))
    }

    /// Routes chunk group `group` to `leader`, named by a replica's hint. A leader the
    /// cached map does not list among the chunk's replicas (`routed`) holds a replica
    /// added since the map was cached (a push may not have arrived, or its stream may
    /// be reconnecting): the map is pulled, or the hint could never be followed and every
    /// replica listed would keep naming it.
    async fn follow_hint(&self, group: u64, leader: u64, routed: &[(u64, String)]) {
        self.note_leader(group, leader);
        if !routed.iter().any(|(n, _)| *n == leader) {
            let _ = self.refresh().await;
        }
    }

    fn note_leader(&self, group: u64, node: u64) {
        self.shared
            .leaders
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(group, node);
    }

    /// Writes `data` at byte `offset` of the volume (see the module docs for what each
    /// outcome means).
    pub async fn write(&self, offset: u64, data: &[u8]) -> Result<(), VolumeError> {
        let m = self.ready_map()?;
        let len = data.len() as u64;
        split(offset, len, m.size_bytes, m.chunk_bytes, m.chunk_bytes)?;
        if len == 0 {
            return Ok(());
        }
        let (start, end) = crate::split::sector_span(offset, len, SECTOR);
        let end = end.min(m.size_bytes.div_ceil(SECTOR) * SECTOR);
        let aligned: std::borrow::Cow<'_, [u8]> = if start == offset && end == offset + len {
            std::borrow::Cow::Borrowed(data)
        } else {
            // Read the sectors the write touches, patch the bytes asked, write them back.
            let mut buf = self.read_sectors(&m, start, end - start).await?;
            let at = (offset - start) as usize;
            buf[at..at + data.len()].copy_from_slice(data);
            std::borrow::Cow::Owned(buf)
        };
        // One piece per chunk; pieces of different chunks go out at once.
        let pieces = split(start, end - start, end, m.chunk_bytes, m.chunk_bytes)?;
        let mut tasks = Vec::with_capacity(pieces.len());
        for p in &pieces {
            let bytes = &aligned[p.at as usize..(p.at + p.len) as usize];
            let mut records = Vec::new();
            let mut at = 0u64;
            while at < p.len {
                let n = (p.len - at).min(RECORD_BYTES_MAX);
                let first = (p.offset + at) / SECTOR;
                records.push(pb::OutOfOrderRecord {
                    data: bytes[at as usize..(at + n) as usize].to_vec(),
                    blocks: vec![pb::BlockRange {
                        start: first,
                        count: n / SECTOR,
                    }],
                    read_set: vec![],
                    write_set: vec![],
                });
                at += n;
            }
            tasks.push(self.append_chunk(p.chunk, records, m.snapshot_tag));
        }
        let results = futures_join(tasks).await;
        // The first piece that failed or is unknown names the write's outcome; an
        // unknown one outranks a failed one (something may have been written).
        let mut failed = None;
        for r in results {
            match r {
                Ok(()) => {}
                Err(e @ VolumeError::Unknown { .. }) => return Err(e),
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// Appends one chunk's records at its leader (the retry rules in the module docs).
    async fn append_chunk(
        &self,
        chunk: u64,
        mut records: Vec<pb::OutOfOrderRecord>,
        snapshot: u64,
    ) -> Result<(), VolumeError> {
        let deadline = Instant::now() + self.retry_for;
        let mut last = String::from("no replica tried");
        loop {
            let (group, nodes) = self.route(chunk)?;
            let failed = |why: String| VolumeError::Failed { chunk, group, why };
            let unknown = |why: String| VolumeError::Unknown { chunk, group, why };
            let mut rerouted = false;
            for (node, addr) in &nodes {
                let mut c = match self.conn(addr).await {
                    Ok(c) => c,
                    Err(e) => {
                        last = e;
                        continue;
                    }
                };
                let req = pb::AppendOutOfOrderRequest {
                    group,
                    records: records.clone(),
                    snapshot,
                };
                match c.append_out_of_order(req).await {
                    Ok(r) => {
                        let results = r.into_inner().results;
                        if results.len() != records.len() {
                            return Err(unknown(format!(
                                "{addr}: {} results for {} records",
                                results.len(),
                                records.len()
                            )));
                        }
                        let mut refused = Vec::new();
                        for (rec, res) in records.iter().zip(&results) {
                            if !res.unknown.is_empty() {
                                return Err(unknown(format!("{addr}: {}", res.unknown)));
                            }
                            if !res.refused.is_empty() {
                                last = format!("{addr}: {}", res.refused);
                                refused.push(rec.clone());
                            } else if res.outcome != pb::Outcome::Committed as i32 {
                                return Err(failed(format!(
                                    "{addr}: the group failed slot {}",
                                    res.seq
                                )));
                            }
                        }
                        self.note_leader(group, *node);
                        if refused.is_empty() {
                            return Ok(());
                        }
                        // Only the refused records go again: they were never appended.
                        records = refused;
                        rerouted = true;
                        break;
                    }
                    Err(s) => match s.code() {
                        Code::FailedPrecondition => {
                            last = format!("{addr}: {}", s.message());
                            if let Some(l) = leader_hint(&s).filter(|l| l != node) {
                                self.follow_hint(group, l, &nodes).await;
                                rerouted = true;
                                break;
                            }
                        }
                        Code::ResourceExhausted => {
                            last = format!("{addr}: {}", s.message());
                            tokio::time::sleep(Duration::from_millis(5)).await;
                            rerouted = true;
                            break;
                        }
                        Code::NotFound => {
                            // The chunk moved: pull the map and route again.
                            last = format!("{addr}: {}", s.message());
                            let _ = self.refresh().await;
                            rerouted = true;
                            break;
                        }
                        Code::Unavailable if not_sent(&s) => {
                            self.forget_conn(addr);
                            last = format!("{addr}: {}", s.message());
                        }
                        Code::Unavailable
                        | Code::Unknown
                        | Code::Cancelled
                        | Code::DeadlineExceeded
                        | Code::Internal => {
                            self.forget_conn(addr);
                            return Err(unknown(format!(
                                "{addr}: {:?}: {}",
                                s.code(),
                                s.message()
                            )));
                        }
                        _ => {
                            return Err(failed(format!("{addr}: {:?}: {}", s.code(), s.message())))
                        }
                    },
                }
            }
            if Instant::now() >= deadline {
                return Err(failed(format!(
                    "no serving leader took it within {:?}; last: {last}",
                    self.retry_for
                )));
            }
            if !rerouted {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }

    /// Reads `len` bytes at byte `offset` of the volume, each chunk's piece at its
    /// leader once it has applied everything committed before the read: the read sees
    /// every write acknowledged before it began.
    pub async fn read(&self, offset: u64, len: u64) -> Result<Vec<u8>, VolumeError> {
        let m = self.ready_map()?;
        split(offset, len, m.size_bytes, m.chunk_bytes, m.chunk_bytes)?;
        if len == 0 {
            return Ok(Vec::new());
        }
        let (start, end) = crate::split::sector_span(offset, len, SECTOR);
        let buf = self.read_sectors(&m, start, end - start).await?;
        let at = (offset - start) as usize;
        Ok(buf[at..at + len as usize].to_vec())
    }

    /// Reads whole sectors `[start, start + len)` (sector-aligned bytes; the last sector
    /// may run past a size that is not a multiple of a sector: its tail reads as zeros).
    async fn read_sectors(
        &self,
        m: &VolumeMap,
        start: u64,
        len: u64,
    ) -> Result<Vec<u8>, VolumeError> {
        let whole = m.chunks.len() as u64 * m.chunk_bytes;
        let pieces = split(start, len, whole, m.chunk_bytes, m.chunk_bytes)?;
        let tasks = pieces
            .iter()
            .map(|p| self.read_chunk(p.chunk, p.offset / SECTOR, p.len / SECTOR));
        let parts = futures_join(tasks.collect()).await;
        let mut out = Vec::with_capacity(len as usize);
        for p in parts {
            out.extend(p?);
        }
        Ok(out)
    }

    /// Reads `count` sectors from sector `first` of chunk `chunk` at its leader.
    async fn read_chunk(&self, chunk: u64, first: u64, count: u64) -> Result<Vec<u8>, VolumeError> {
        let mut out = Vec::with_capacity((count * SECTOR) as usize);
        let mut at = 0;
        while at < count {
            let n = (count - at).min(READ_SECTORS_MAX);
            out.extend(self.read_at_leader(chunk, first + at, n).await?);
            at += n;
        }
        Ok(out)
    }

    async fn read_at_leader(
        &self,
        chunk: u64,
        start: u64,
        count: u64,
    ) -> Result<Vec<u8>, VolumeError> {
        let deadline = Instant::now() + self.retry_for;
        let mut last = String::from("no replica tried");
        loop {
            let (group, nodes) = self.route(chunk)?;
            let mut rerouted = false;
            for (node, addr) in &nodes {
                let mut c = match self.conn(addr).await {
                    Ok(c) => c,
                    Err(e) => {
                        last = e;
                        continue;
                    }
                };
                let req = pb::ReadBlocksRequest {
                    group,
                    start,
                    count,
                    at_leader: true,
                    snapshot: 0,
                };
                match c.read_blocks(req).await {
                    Ok(r) => {
                        self.note_leader(group, *node);
                        return Ok(r.into_inner().data);
                    }
                    Err(s) => {
                        last = format!("{addr}: {:?}: {}", s.code(), s.message());
                        match s.code() {
                            Code::FailedPrecondition => {
                                if let Some(l) = leader_hint(&s).filter(|l| l != node) {
                                    self.follow_hint(group, l, &nodes).await;
                                    rerouted = true;
                                    break;
                                }
                            }
                            Code::NotFound => {
                                let _ = self.refresh().await;
                                rerouted = true;
                                break;
                            }
                            Code::InvalidArgument | Code::OutOfRange => {
                                return Err(VolumeError::ReadFailed {
                                    chunk,
                                    group,
                                    why: last,
                                })
                            }
                            // Reads change nothing: any other error tries elsewhere.
                            _ => self.forget_conn(addr),
                        }
                    }
                }
            }
            if Instant::now() >= deadline {
                return Err(VolumeError::ReadFailed {
                    chunk,
                    group,
                    why: format!(
                        "no serving leader answered within {:?}; last: {last}",
                        self.retry_for
                    ),
                });
            }
            if !rerouted {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// Where a volume's lifecycle state is: it only moves forward (creating, ready,
/// deleting), and a state change need not bump the map's version.
fn state_rank(state: &str) -> u8 {
    match state {
        "creating" => 0,
        "ready" => 1,
        _ => 2,
    }
}

/// Whether `m` is a later map than `cur`: a higher version, or the same version in a later
/// state. A control node that has not yet applied the latest changes (it answers from
/// the state it has applied) can only offer an older map, which is never installed.
fn newer(m: &VolumeMap, cur: &VolumeMap) -> bool {
    (m.version, state_rank(&m.state)) > (cur.version, state_rank(&cur.state))
}

/// Installs `m` if it is newer than the cached map.
fn install(shared: &Shared, m: VolumeMap) {
    let mut cur = shared.map.lock().unwrap_or_else(|p| p.into_inner());
    if newer(&m, &cur) {
        *cur = m;
        shared
            .refreshes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Follows the control plane's pushes of the volume's map until the client is dropped
/// (the control plane's side of the cache, PolarFS section 3.2.2).
async fn watch(shared: Weak<Shared>, name: String) {
    loop {
        let Some(control) = shared.upgrade().map(|s| s.control.clone()) else {
            return;
        };
        let req = pb::VolumeName { name: name.clone() };
        let stream = on_control(&control, Duration::from_secs(5), |mut c| {
            let req = req.clone();
            async move { c.watch_volume(req).await.map(|r| r.into_inner()) }
        })
        .await;
        if let Ok(Ok(mut s)) = stream {
            loop {
                let next = tokio::time::timeout(Duration::from_secs(1), s.message()).await;
                let Some(sh) = shared.upgrade() else { return };
                match next {
                    Ok(Ok(Some(info))) => {
                        if let Ok(m) = VolumeMap::from_info(info) {
                            install(&sh, m);
                        }
                    }
                    Ok(Ok(None)) | Ok(Err(_)) => break,
                    Err(_) => continue, // no change within a second: still watched
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Runs futures at once and returns their outputs in order.
async fn futures_join<T>(tasks: Vec<impl std::future::Future<Output = T>>) -> Vec<T> {
    let mut pinned: Vec<_> = tasks.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<T>> = pinned.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, f) in pinned.iter_mut().enumerate() {
            if out[i].is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => out[i] = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter()
        .map(|v| v.expect("every future finished"))
        .collect()
}
