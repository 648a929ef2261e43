//! A real driver for one out-of-order group replica: the pure [`OooReplica`] with its
//! [`OooStore`] on the real file system (fdatasync) and plain TCP between processes.
//!
//! One driver thread owns the replica and executes its actions in order: consecutive
//! writes go to the store's buffer and are synced (one `fdatasync`) before the next action
//! that is not a write, so nothing is acknowledged, voted or sent before what it depends
//! on is durable. Applies run on the driver thread through the caller's callback, one
//! released batch after another (the batch members are independent; a pool of apply
//! threads is not built yet). Messages travel as frames `u32 length | u32 CRC32C |
//! message` (`docs/formats.md`, "Out-of-order groups"); each node dials every peer it
//! sends to, announcing itself with a `u64` node id, and a broken connection drops what
//! was queued (the protocol retransmits) and is redialled.
//!
//! Not done yet (issue 6): this driver is not reachable from the gRPC service or the
//! `chorus` CLI, has no TLS, no metrics and no rate limit on catch-up.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use chorus_core::format::meta::NodeId;
use chorus_core::format::ooo::{decode_msg, encode_msg};
use chorus_core::ooo::replica::{
    Action, Declared, Entry, Mode, Msg, OooAppendError, OooConfig, OooReplica,
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
}

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
    /// Role.
    pub role: Role,
    /// Term.
    pub term: u64,
    /// Serving appends.
    pub serving: bool,
    /// First slot not known committed.
    pub committed_head: u64,
    /// First slot not applied.
    pub applied_head: u64,
}

type Reply = Sender<Result<Outcome, OooNodeError>>;

enum Ev {
    Msg(NodeId, Msg),
    Append(Declared, Vec<u8>, Reply),
    Status(Sender<OooStatus>),
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
    /// release, on the driver thread.
    pub fn start(
        cfg: OooNodeConfig,
        listener: TcpListener,
        mut apply: impl FnMut(&Entry) + Send + 'static,
    ) -> Result<Self, OooNodeError> {
        let fs: Arc<dyn FileSystem> = Arc::new(RealFs::new());
        let (mut store, hard, entries, _rec) = OooStore::open(fs, &cfg.dir)?;
        let mut rc = OooConfig::new(cfg.id, cfg.voters.iter().map(|v| v.0).collect(), cfg.mode);
        rc.election_timeout = cfg.election_timeout.as_nanos() as u64;
        rc.heartbeat_interval = rc.election_timeout / 6;
        rc.resend_interval = rc.election_timeout / 6;
        rc.seed = cfg.id ^ std::process::id() as u64;
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
            let (tx, stop) = (tx.clone(), stop.clone());
            threads.push(std::thread::spawn(move || accept_loop(listener, tx, stop)));
        }
        // Outbound: one writer thread per peer.
        let mut peers: HashMap<NodeId, Sender<Vec<u8>>> = HashMap::new();
        for &(p, a) in &cfg.voters {
            if p == cfg.id {
                continue;
            }
            let (ptx, prx) = mpsc::channel::<Vec<u8>>();
            let (stop, me) = (stop.clone(), cfg.id);
            let jitter = cfg.link_jitter.filter(|j| j.0 == p).map(|j| j.1);
            threads.push(std::thread::spawn(move || {
                writer_loop(me, a, prx, stop, jitter)
            }));
            peers.insert(p, ptx);
        }
        let stop2 = stop.clone();
        threads.push(std::thread::spawn(move || {
            let mut waiters: HashMap<u64, Reply> = HashMap::new();
            let mut failed = false;
            while !stop2.load(Ordering::Relaxed) && !failed {
                // Group commit: take every event already queued (up to a bound) before
                // executing the actions, so that their writes share one fdatasync.
                let mut next = match rx.recv_timeout(Duration::from_millis(5)) {
                    Ok(ev) => Some(ev),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => break,
                };
                let mut taken = 0;
                while let Some(ev) = next.take() {
                    taken += 1;
                    match ev {
                    Ev::Msg(from, m) => replica.receive(now(), from, m),
                    Ev::Append(d, data, reply) => match replica.append(now(), d, data) {
                        Ok(t) => {
                            waiters.insert(t.eid, reply);
                        }
                        Err(e) => {
                            let _ = reply.send(Err(e.into()));
                        }
                    },
                    Ev::Status(reply) => {
                        let _ = reply.send(OooStatus {
                            role: replica.role(),
                            term: replica.term(),
                            serving: replica.is_serving(),
                            committed_head: replica.committed_head(),
                            applied_head: replica.applied_head(),
                        });
                    }
                    }
                    if taken < 4096 {
                        next = rx.try_recv().ok();
                    }
                }
                replica.tick(now());
                // Execute until the replica is quiet (applies release more actions).
                loop {
                    let actions = replica.take_actions();
                    if actions.is_empty() {
                        break;
                    }
                    let mut unsynced = false;
                    let mut applied = Vec::new();
                    for a in actions {
                        if unsynced && !matches!(a, Action::Write(_)) {
                            unsynced = false;
                            if let Err(e) = store.sync() {
                                tracing::error!(error = %e, "out-of-order store sync failed; stopping");
                                failed = true;
                                break;
                            }
                        }
                        match a {
                            Action::Write(e) => {
                                unsynced = true;
                                if store.write(&e).is_err() {
                                    failed = true;
                                    break;
                                }
                            }
                            Action::SaveHard(h) => {
                                if let Err(e) = store.save_hard(&h) {
                                    tracing::error!(error = %e, "saving the hard state failed; stopping");
                                    failed = true;
                                    break;
                                }
                            }
                            Action::Send { to, msg } => {
                                if let Some(p) = peers.get(&to) {
                                    let _ = p.send(frame(&encode_msg(&msg)));
                                }
                            }
                            Action::Apply(e) => {
                                apply(&e);
                                applied.push(e.seq);
                            }
                            Action::Result { eid, outcome, .. } => {
                                if let Some(w) = waiters.remove(&eid) {
                                    let _ = w.send(Ok(outcome));
                                }
                            }
                            Action::Committed(_) | Action::Role { .. } | Action::Serving { .. } => {}
                        }
                    }
                    if failed {
                        break;
                    }
                    if unsynced && store.sync().is_err() {
                        failed = true;
                        break;
                    }
                    for s in applied {
                        let _ = replica.applied(s);
                    }
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

    /// Appends a record and waits for its result.
    pub fn append(&self, declared: Declared, data: Vec<u8>) -> Result<Outcome, OooNodeError> {
        let (tx, rx) = mpsc::channel();
        self.tx
            .send(Ev::Append(declared, data, tx))
            .map_err(|_| OooNodeError::Stopped)?;
        rx.recv().map_err(|_| OooNodeError::Stopped)?
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

fn frame(payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(8 + payload.len());
    f.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    f.extend_from_slice(&crc32c::crc32c(payload).to_le_bytes());
    f.extend_from_slice(payload);
    f
}

fn accept_loop(listener: TcpListener, tx: Sender<Ev>, stop: Arc<AtomicBool>) {
    let mut readers = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((s, _)) => {
                let (tx, stop) = (tx.clone(), stop.clone());
                readers.push(std::thread::spawn(move || reader_loop(s, tx, stop)));
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
fn reader_loop(mut s: TcpStream, tx: Sender<Ev>, stop: Arc<AtomicBool>) {
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
                if rest.len() < 8 {
                    break;
                }
                from = Some(u64::from_le_bytes(rest[..8].try_into().expect("8")));
                at += 8;
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
    me: NodeId,
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
                    if s.write_all(&me.to_le_bytes()).is_ok() {
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
