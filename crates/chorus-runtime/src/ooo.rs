//! A real driver for one out-of-order group replica: the pure [`OooReplica`] with its
//! [`OooStore`] on the real file system (fdatasync) and plain TCP between processes.
//!
//! One driver thread owns the replica; one IO thread owns its store. The driver takes
//! every queued event, lets the replica react and hands the writes (and hard-state saves)
//! of that batch to the IO thread in order; the acknowledgements, votes, results and
//! applies of the batch wait until the IO thread reports it — and every batch before it —
//! durable, so nothing is acknowledged, voted or reported before what it depends on is on
//! disk. Meanwhile the driver goes on taking events: its rounds overlap the syncs, and the
//! IO thread puts every batch queued while it synced into one `fdatasync` (group commit).
//! A leader's appends to followers leave at once (the replica's documented exception), and
//! the replica counts the leader's own copy of a slot only when the driver reports it
//! durable ([`OooReplica::persisted`]).
//!
//! Applies run on a pool of `apply_threads` threads (DP-Raft section 4.3: followers apply
//! independent entries in parallel): the replica only releases together entries that do
//! not conflict, each worker calls the caller's callback and reports the slot back to the
//! driver, which then releases what waited on it. With `apply_threads = 0` the driver
//! applies itself, one released batch after another.
//!
//! Messages travel as frames `u32 length | u32 CRC32C | message` (`docs/formats.md`,
//! "Out-of-order groups"); each node dials every peer it sends to, announcing itself with
//! `u64 node id | u64 group id` (a connection naming another group is closed, so two
//! groups given the same address by mistake never mix), and a broken connection drops
//! what was queued (the protocol retransmits) and is redialled.
//!
//! Not done yet (issue 6): no TLS on this transport, no rate limit on catch-up, and the
//! entries file is never compacted.

use std::collections::HashMap;
use std::future::Future;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use chorus_core::format::meta::NodeId;
use chorus_core::format::ooo::{decode_msg, encode_msg};
use chorus_core::ooo::replica::{
    Action, Declared, Entry, Mode, Msg, OooAppendError, OooConfig, OooReplica, OooStats,
};
use chorus_core::replica::{Outcome, Role};
use chorus_storage::fs::{FileSystem, RealFs};
use chorus_storage::ooo::OooStore;

/// Largest frame accepted.
const MAX_FRAME: usize = 256 << 20;

/// Settings of an out-of-order node.
#[derive(Clone, Debug)]
pub struct OooNodeConfig {
    /// This node.
    pub id: NodeId,
    /// The group (checked on every inbound connection).
    pub group: u64,
    /// Every voter and its replication address, this node included.
    pub voters: Vec<(NodeId, SocketAddr)>,
    /// The group's mode.
    pub mode: Mode,
    /// The group's directory.
    pub dir: PathBuf,
    /// Election timeout.
    pub election_timeout: Duration,
    /// Fault injection for benchmarks and tests: before each write to this peer, wait a
    /// random time below the given bound (a jittery replication link; frames keep their
    /// order).
    pub link_jitter: Option<(NodeId, Duration)>,
    /// Threads applying committed entries (0: the driver thread applies).
    pub apply_threads: usize,
    /// Bytes per second of streaming catch-up to one follower (0: no limit; pieces are
    /// at most 128 KiB either way).
    pub catchup_rate: u64,
}

/// The state machine callback: called once per committed entry the apply rules release,
/// possibly on several threads at once for entries that do not conflict.
pub type ApplyFn = Arc<dyn Fn(&Entry) + Send + Sync>;

/// Why an append through [`OooNode::append`] did not get a result.
#[derive(Debug, thiserror::Error)]
pub enum OooNodeError {
    /// The replica refused it.
    #[error(transparent)]
    Refused(#[from] OooAppendError),
    /// The node stopped (or crashed on a storage error) before the result was known.
    #[error("the node stopped before the append's result was known")]
    Stopped,
    /// Storage failed when opening.
    #[error(transparent)]
    Storage(#[from] chorus_storage::StorageError),
    /// The listener could not be used.
    #[error("replication listener: {0}")]
    Io(#[from] std::io::Error),
}

/// What the driver reports about its replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OooStatus {
    /// The group's mode.
    pub mode: Mode,
    /// Role.
    pub role: Role,
    /// Term.
    pub term: u64,
    /// The leader this replica knows of.
    pub leader: Option<NodeId>,
    /// Serving appends.
    pub serving: bool,
    /// First slot not known committed.
    pub committed_head: u64,
    /// First slot not applied.
    pub applied_head: u64,
    /// The replica's counters.
    pub stats: OooStats,
    /// The driver's counters.
    pub counters: OooCounters,
}

/// What the driver counted since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OooCounters {
    /// Appends accepted as leader.
    pub appends: u64,
    /// Appends reported committed.
    pub committed: u64,
    /// Appends reported failed.
    pub failed: u64,
    /// Entries written to the store.
    pub writes: u64,
    /// fdatasyncs of the entries file (hard-state saves not included).
    pub syncs: u64,
    /// Hard-state saves.
    pub hard_saves: u64,
    /// Messages received and sent.
    pub msgs_in: u64,
    /// Messages sent.
    pub msgs_out: u64,
    /// Entries applied.
    pub applied: u64,
}

/// The final result of an append.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OooResult {
    /// Its slot.
    pub seq: u64,
    /// Committed or Failed.
    pub outcome: Outcome,
}

type Reply = tokio::sync::oneshot::Sender<Result<OooResult, OooNodeError>>;

enum Ev {
    Msg(NodeId, Msg),
    Append(Declared, Vec<u8>, Reply),
    Applied(u64),
    Status(Sender<OooStatus>),
    /// The IO thread made every batch up to this one durable, with this many fdatasyncs.
    Synced {
        upto: u64,
        syncs: u64,
    },
    /// The IO thread failed (the store refuses everything after).
    IoFailed(String),
}

/// A write for the IO thread, in the order the replica asked.
enum IoOp {
    Write(Entry),
    Hard(chorus_core::ooo::replica::Hard),
}

/// What waits for an IO batch: the actions that may run only once the writes before
/// them are durable, and the writes to report to the replica.
struct Pending {
    id: u64,
    io: bool,
    written: Vec<(u64, u64, u64)>,
    actions: Vec<Action>,
}

/// The IO thread: executes batches in order; every batch it has taken when the queue runs
/// dry shares one fdatasync (a hard-state save first syncs the writes before it).
fn io_loop(mut store: OooStore, rx: Receiver<(u64, Vec<IoOp>)>, tx: Sender<Ev>) {
    while let Ok(first) = rx.recv() {
        let mut upto = first.0;
        let mut ops = first.1;
        while let Ok((id, more)) = rx.try_recv() {
            upto = id;
            ops.extend(more);
        }
        let mut syncs = 0;
        let mut unsynced = false;
        let mut r = Ok(());
        for op in ops {
            r = match op {
                IoOp::Write(e) => {
                    unsynced = true;
                    store.write(&e)
                }
                IoOp::Hard(h) => {
                    syncs += std::mem::take(&mut unsynced) as u64;
                    store.sync().and_then(|()| store.save_hard(&h))
                }
            };
            if r.is_err() {
                break;
            }
        }
        if r.is_ok() {
            syncs += unsynced as u64;
            r = store.sync();
        }
        let ev = match r {
            Ok(()) => Ev::Synced { upto, syncs },
            Err(e) => Ev::IoFailed(e.to_string()),
        };
        let failed = matches!(ev, Ev::IoFailed(_));
        if tx.send(ev).is_err() || failed {
            return;
        }
    }
}

/// A running out-of-order replica. Dropping it stops it.
pub struct OooNode {
    tx: Sender<Ev>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    addr: SocketAddr,
}

impl OooNode {
    /// Starts the node on `listener` (already bound, so tests and `chorus dev` can pick
    /// free ports first); `apply` is called with every committed entry the apply rules
    /// release (see the module documentation for the threads).
    pub fn start(
        cfg: OooNodeConfig,
        listener: TcpListener,
        apply: ApplyFn,
    ) -> Result<Self, OooNodeError> {
        let fs: Arc<dyn FileSystem> = Arc::new(RealFs::new());
        let (store, hard, entries, _rec) = OooStore::open(fs, &cfg.dir)?;
        let mut rc = OooConfig::new(cfg.id, cfg.voters.iter().map(|v| v.0).collect(), cfg.mode);
        rc.election_timeout = cfg.election_timeout.as_nanos() as u64;
        rc.heartbeat_interval = rc.election_timeout / 6;
        rc.resend_interval = rc.election_timeout / 6;
        rc.seed = cfg.id ^ std::process::id() as u64;
        rc.catchup_rate = cfg.catchup_rate;
        let t0 = Instant::now();
        let now = move || t0.elapsed().as_nanos() as u64;
        let mut replica = OooReplica::recover(rc, hard, entries, now());
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel::<Ev>();
        let mut threads = Vec::new();
        // Inbound connections.
        listener.set_nonblocking(true)?;
        {
            let (tx, stop, group) = (tx.clone(), stop.clone(), cfg.group);
            threads.push(std::thread::spawn(move || {
                accept_loop(listener, group, tx, stop)
            }));
        }
        // Apply workers: they take released entries from one queue and report each
        // applied slot back to the driver.
        let (work_tx, work_rx) = mpsc::channel::<Entry>();
        let work_rx = Arc::new(Mutex::new(work_rx));
        for _ in 0..cfg.apply_threads {
            let (rx, tx, apply) = (work_rx.clone(), tx.clone(), apply.clone());
            threads.push(std::thread::spawn(move || loop {
                let next = rx.lock().map(|r| r.recv());
                let Ok(Ok(e)) = next else { return };
                apply(&e);
                if tx.send(Ev::Applied(e.seq)).is_err() {
                    return;
                }
            }));
        }
        let pool = cfg.apply_threads > 0;
        let mode = cfg.mode;
        // Outbound: one writer thread per peer.
        let mut peers: HashMap<NodeId, Sender<Vec<u8>>> = HashMap::new();
        for &(p, a) in &cfg.voters {
            if p == cfg.id {
                continue;
            }
            let (ptx, prx) = mpsc::channel::<Vec<u8>>();
            let (stop, hello) = (stop.clone(), (cfg.id, cfg.group));
            let jitter = cfg.link_jitter.filter(|j| j.0 == p).map(|j| j.1);
            threads.push(std::thread::spawn(move || {
                writer_loop(hello, a, prx, stop, jitter)
            }));
            peers.insert(p, ptx);
        }
        let stop2 = stop.clone();
        let (io_tx, io_rx) = mpsc::channel::<(u64, Vec<IoOp>)>();
        {
            let tx = tx.clone();
            threads.push(std::thread::spawn(move || io_loop(store, io_rx, tx)));
        }
        threads.push(std::thread::spawn(move || {
            // Dropping the work queue's and the IO queue's senders when the driver ends
            // stops the workers and the IO thread.
            let (work_tx, io_tx) = (work_tx, io_tx);
            let mut waiters: HashMap<u64, Reply> = HashMap::new();
            let mut failed = false;
            let mut c = OooCounters::default();
            // Batches whose actions wait for their writes (and every earlier batch's).
            let mut pending: std::collections::VecDeque<Pending> = Default::default();
            let (mut next_id, mut synced_upto) = (0u64, 0u64);
            while !stop2.load(Ordering::Relaxed) && !failed {
                // Take every event already queued (up to a bound) before draining the
                // replica: their writes go to the IO thread as one batch.
                let mut next = match rx.recv_timeout(Duration::from_millis(5)) {
                    Ok(ev) => Some(ev),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => break,
                };
                let mut taken = 0;
                while let Some(ev) = next.take() {
                    taken += 1;
                    match ev {
                        Ev::Msg(from, m) => {
                            c.msgs_in += 1;
                            replica.receive(now(), from, m)
                        }
                        Ev::Append(d, data, reply) => match replica.append(now(), d, data) {
                            Ok(t) => {
                                c.appends += 1;
                                waiters.insert(t.eid, reply);
                            }
                            Err(e) => {
                                let _ = reply.send(Err(e.into()));
                            }
                        },
                        Ev::Applied(seq) => {
                            c.applied += 1;
                            if let Err(e) = replica.applied(seq) {
                                tracing::error!(error = %e, "apply report refused; stopping");
                                failed = true;
                            }
                        }
                        Ev::Status(reply) => {
                            let _ = reply.send(OooStatus {
                                mode,
                                role: replica.role(),
                                term: replica.term(),
                                leader: replica.leader(),
                                serving: replica.is_serving(),
                                committed_head: replica.committed_head(),
                                applied_head: replica.applied_head(),
                                stats: replica.stats(),
                                counters: c,
                            });
                        }
                        Ev::Synced { upto, syncs } => {
                            c.syncs += syncs;
                            synced_upto = upto;
                        }
                        Ev::IoFailed(e) => {
                            tracing::error!(error = %e, "out-of-order store failed; stopping");
                            failed = true;
                        }
                    }
                    if taken < 4096 {
                        next = rx.try_recv().ok();
                    }
                }
                if failed {
                    break;
                }
                replica.tick(now());
                loop {
                    // Batches now durable, in order: the replica learns which of its
                    // writes are, and their waiting actions run.
                    let mut ran = false;
                    while pending
                        .front()
                        .is_some_and(|p| !p.io || p.id <= synced_upto)
                    {
                        let p = pending.pop_front().expect("front");
                        if !p.written.is_empty() {
                            replica.persisted(now(), &p.written);
                        }
                        run_actions(
                            p.actions,
                            &peers,
                            &mut waiters,
                            &mut c,
                            pool.then_some(&work_tx),
                            &apply,
                            &mut replica,
                        );
                        ran = true;
                    }
                    let actions = replica.take_actions();
                    if actions.is_empty() && !ran {
                        break;
                    }
                    // Writes and hard-state saves go to the IO thread in order; a leader's
                    // Append goes out at once, so followers write while this node syncs
                    // (the replica's one exception: it promises nothing about this disk);
                    // everything else waits for the batch's writes and all before them.
                    let mut ops = Vec::new();
                    let mut written = Vec::new();
                    let mut waiting = Vec::new();
                    for a in actions {
                        match a {
                            Action::Write(e) => {
                                c.writes += 1;
                                written.push((e.seq, e.eid, e.term));
                                ops.push(IoOp::Write(e));
                            }
                            Action::SaveHard(h) => {
                                c.hard_saves += 1;
                                ops.push(IoOp::Hard(h));
                            }
                            Action::Send {
                                to,
                                msg: msg @ Msg::Append { .. },
                            } => send(&peers, &mut c, to, &msg),
                            other => waiting.push(other),
                        }
                    }
                    if ops.is_empty() && waiting.is_empty() {
                        continue;
                    }
                    // A batch without writes behind an empty queue runs at the top of
                    // the next round.
                    next_id += 1;
                    let io = !ops.is_empty();
                    if io && io_tx.send((next_id, ops)).is_err() {
                        failed = true;
                        break;
                    }
                    pending.push_back(Pending {
                        id: next_id,
                        io,
                        written,
                        actions: waiting,
                    });
                }
            }
            // Whatever is still waiting learns that its result is unknown.
            for (_, w) in waiters {
                let _ = w.send(Err(OooNodeError::Stopped));
            }
        }));
        Ok(Self {
            tx,
            stop,
            threads,
            addr,
        })
    }

    /// The replication address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Appends a record and blocks until its result (not from inside an async runtime:
    /// use [`OooNode::append_async`] there).
    pub fn append(&self, declared: Declared, data: Vec<u8>) -> Result<Outcome, OooNodeError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.tx
            .send(Ev::Append(declared, data, tx))
            .map_err(|_| OooNodeError::Stopped)?;
        rx.blocking_recv()
            .map_err(|_| OooNodeError::Stopped)?
            .map(|r| r.outcome)
    }

    /// Appends a record; the future resolves to its result.
    pub fn append_async(
        &self,
        declared: Declared,
        data: Vec<u8>,
    ) -> impl Future<Output = Result<Outcome, OooNodeError>> + Send + 'static {
        let r = self.submit(declared, data);
        async move { r.await.map(|r| r.outcome) }
    }

    /// Appends a record; the future resolves to its result and slot. Appends submitted
    /// from one thread get increasing slots in submission order.
    pub fn submit(
        &self,
        declared: Declared,
        data: Vec<u8>,
    ) -> impl Future<Output = Result<OooResult, OooNodeError>> + Send + 'static {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let sent = self.tx.send(Ev::Append(declared, data, tx)).is_ok();
        async move {
            if !sent {
                return Err(OooNodeError::Stopped);
            }
            rx.await.map_err(|_| OooNodeError::Stopped)?
        }
    }

    /// The replica's status, or `None` if the node stopped.
    pub fn status(&self) -> Option<OooStatus> {
        let (tx, rx) = mpsc::channel();
        self.tx.send(Ev::Status(tx)).ok()?;
        rx.recv_timeout(Duration::from_secs(5)).ok()
    }
}

impl Drop for OooNode {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Runs actions whose writes are durable: sends, results and applies (inline when there
/// is no apply pool, reporting each applied slot to the replica).
fn run_actions(
    actions: Vec<Action>,
    peers: &HashMap<NodeId, Sender<Vec<u8>>>,
    waiters: &mut HashMap<u64, Reply>,
    c: &mut OooCounters,
    pool: Option<&Sender<Entry>>,
    apply: &ApplyFn,
    replica: &mut OooReplica,
) {
    let mut applied = Vec::new();
    for a in actions {
        match a {
            Action::Send { to, msg } => send(peers, c, to, &msg),
            Action::Apply(e) => match pool {
                Some(w) => {
                    let _ = w.send(e);
                }
                None => {
                    apply(&e);
                    c.applied += 1;
                    applied.push(e.seq);
                }
            },
            Action::Result { eid, seq, outcome } => {
                match outcome {
                    Outcome::Committed => c.committed += 1,
                    Outcome::Failed => c.failed += 1,
                }
                if let Some(w) = waiters.remove(&eid) {
                    let _ = w.send(Ok(OooResult { seq, outcome }));
                }
            }
            Action::Write(_)
            | Action::SaveHard(_)
            | Action::Committed(_)
            | Action::Role { .. }
            | Action::Serving { .. } => {}
        }
    }
    for s in applied {
        let _ = replica.applied(s);
    }
}

/// Queues a message to a peer's writer (a lost one is the protocol's to resend).
fn send(peers: &HashMap<NodeId, Sender<Vec<u8>>>, c: &mut OooCounters, to: NodeId, msg: &Msg) {
    if let Some(p) = peers.get(&to) {
        c.msgs_out += 1;
        let _ = p.send(frame(&encode_msg(msg)));
    }
}

fn frame(payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(8 + payload.len());
    f.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    f.extend_from_slice(&crc32c::crc32c(payload).to_le_bytes());
    f.extend_from_slice(payload);
    f
}

fn accept_loop(listener: TcpListener, group: u64, tx: Sender<Ev>, stop: Arc<AtomicBool>) {
    let mut readers = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((s, _)) => {
                let (tx, stop) = (tx.clone(), stop.clone());
                readers.push(std::thread::spawn(move || reader_loop(s, group, tx, stop)));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    for r in readers {
        let _ = r.join();
    }
}

/// Reads frames from one inbound connection until it breaks or a frame is bad (the
/// connection is then closed: the sender redials, and the protocol retransmits).
fn reader_loop(mut s: TcpStream, group: u64, tx: Sender<Ev>, stop: Arc<AtomicBool>) {
    let _ = s.set_nodelay(true);
    let _ = s.set_read_timeout(Some(Duration::from_millis(100)));
    let mut buf: Vec<u8> = Vec::new();
    let mut from: Option<NodeId> = None;
    let mut chunk = vec![0u8; 64 << 10];
    while !stop.load(Ordering::Relaxed) {
        match s.read(&mut chunk) {
            Ok(0) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(_) => return,
        }
        // Decode every whole frame in the buffer, then drop the consumed bytes once.
        let mut at = 0;
        loop {
            let rest = &buf[at..];
            if from.is_none() {
                if rest.len() < 16 {
                    break;
                }
                let g = u64::from_le_bytes(rest[8..16].try_into().expect("8"));
                if g != group {
                    tracing::warn!(
                        group,
                        named = g,
                        "out-of-order connection for another group; closing it"
                    );
                    return;
                }
                from = Some(u64::from_le_bytes(rest[..8].try_into().expect("8")));
                at += 16;
                continue;
            }
            if rest.len() < 8 {
                break;
            }
            let len = u32::from_le_bytes(rest[..4].try_into().expect("4")) as usize;
            if len > MAX_FRAME {
                tracing::warn!(len, "out-of-order frame too large; closing the connection");
                return;
            }
            if rest.len() < 8 + len {
                break;
            }
            let crc = u32::from_le_bytes(rest[4..8].try_into().expect("4"));
            let payload = &rest[8..8 + len];
            if crc32c::crc32c(payload) != crc {
                tracing::warn!("out-of-order frame checksum mismatch; closing the connection");
                return;
            }
            match decode_msg(payload) {
                Ok(m) => {
                    if tx.send(Ev::Msg(from.expect("hello read"), m)).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "bad out-of-order message; closing the connection");
                    return;
                }
            }
            at += 8 + len;
        }
        buf.drain(..at);
    }
}

/// Sends queued frames to one peer, dialling (and redialling) as needed.
fn writer_loop(
    (me, group): (NodeId, u64),
    addr: SocketAddr,
    rx: Receiver<Vec<u8>>,
    stop: Arc<AtomicBool>,
    jitter: Option<Duration>,
) {
    let mut conn: Option<TcpStream> = None;
    let mut rng = chorus_core::rng::Rng::new(me ^ addr.port() as u64);
    while !stop.load(Ordering::Relaxed) {
        let first = match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(f) => f,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        if let Some(j) = jitter {
            let ns = rng.below(j.as_nanos().max(1) as u64);
            std::thread::sleep(Duration::from_nanos(ns));
        }
        let mut out = first;
        while let Ok(more) = rx.try_recv() {
            out.extend_from_slice(&more);
        }
        if conn.is_none() {
            match TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
                Ok(mut s) => {
                    let _ = s.set_nodelay(true);
                    let mut hello = me.to_le_bytes().to_vec();
                    hello.extend_from_slice(&group.to_le_bytes());
                    if s.write_all(&hello).is_ok() {
                        conn = Some(s);
                    }
                }
                Err(_) => continue, // dropped: the protocol resends
            }
        }
        if let Some(s) = conn.as_mut() {
            if s.write_all(&out).is_err() {
                conn = None;
            }
        }
    }
}
