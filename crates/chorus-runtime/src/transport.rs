//! Moving replica messages between processes.
//!
//! [`Transport`] is the seam: the runtime hands it `(peer, group, message)` and receives
//! through a [`Handler`]. Groups of every mode share it: an ordered group's messages
//! travel as `Msg` frames, an out-of-order group's as `OooMsg` frames, both keyed by the
//! group id, on the same connection to each peer with the same bounds. [`TcpTransport`] is the real one: framed messages
//! (`docs/formats.md`, "Replication frames": CRC32C per frame, bounded size) over TCP,
//! optionally inside mutual TLS.
//!
//! # Shape, and why
//!
//! Connections are one-way: each node dials every peer it sends to and only writes on
//! that connection; it only reads on connections others dialled. A one-way stream has a
//! single reader and one writer at a time, and a broken connection is simply redialled
//! by the writer thread.
//!
//! Frames for one peer are encoded straight into that peer's output buffer by the
//! sending thread (no per-message allocation or hand-off). When the buffer was empty and
//! nobody is writing to the connection, the sender writes it itself with a non-blocking
//! `send` (plain TCP): no thread is woken, which on this 2-core VM saves a wake-up of tens
//! to a hundred µs on each hop of a replicated append (docs/benchmarks/transport.md, 1 client).
//! Otherwise — a write in progress, a full socket buffer, a connection to (re)dial, TLS —
//! the peer's writer thread takes the whole buffer at once: everything queued for a peer,
//! from any number of log groups, leaves in one `write` (batching across groups on one
//! connection). Whoever writes holds the peer's connection lock from taking the buffer to
//! the end of the write, and a partly sent buffer goes back to the front of the queue, so
//! the byte stream keeps the order in which frames were queued.
//!
//! A framed codec over plain TCP was chosen over gRPC streaming for replication by
//! measurement (`chorus-bench transport`, `docs/benchmarks/transport.md`): log payload moves 1.3×
//! (pipelined) to 1.6× (one in flight) faster than in a tonic bidirectional stream; the
//! replica already produces whole, checksummed groups, so a protobuf envelope only adds a
//! copy and an allocation per message and HTTP/2 flow control a second window on top of
//! the replica's own. gRPC remains the client API.
//!
//! Loss is fine: the protocol retransmits, so a full output buffer (a peer that does not
//! read) drops the newest frames and counts them instead of growing without bound.

use std::cell::RefCell;
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use chorus_core::format::meta::NodeId;
use chorus_core::format::wire::{self, Frame};
use chorus_core::ooo::replica::Msg as OooMsg;
use chorus_core::replica::Message;

use crate::error::Error;

/// Where inbound messages go.
pub trait Handler: Send + Sync + 'static {
    /// A message for ordered group `group` from peer `from` arrived.
    fn deliver(&self, from: NodeId, group: u64, msg: Message);
    /// A message for out-of-order group `group` from peer `from` arrived.
    fn deliver_ooo(&self, from: NodeId, group: u64, msg: OooMsg);
}

/// Sends replica messages to peers. Best effort: the protocol tolerates loss.
pub trait Transport: Send + Sync + 'static {
    /// Queues `msg` for ordered group `group` on peer `to`.
    fn send(&self, to: NodeId, group: u64, msg: &Message);
    /// Queues `msg` for out-of-order group `group` on peer `to`.
    fn send_ooo(&self, to: NodeId, group: u64, msg: &OooMsg);
    /// Learns (or changes) the address of a peer.
    fn set_peer_addr(&self, node: NodeId, addr: String);
    /// Counters for metrics and `status`.
    fn stats(&self) -> TransportStats;
}

/// Transport counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TransportStats {
    /// Frames queued for sending.
    pub frames_sent: u64,
    /// Bytes written to sockets.
    pub bytes_sent: u64,
    /// Frames received and decoded.
    pub frames_received: u64,
    /// Frames dropped because a peer's output buffer was full or it has no address; a
    /// failed dial drops what was queued for the peer and counts one.
    pub frames_dropped: u64,
    /// Inbound connections refused or closed for bad input (bad handshake, bad frame).
    pub bad_connections: u64,
}

/// Mutual-TLS settings (PEM files).
#[derive(Clone, Debug)]
pub struct TlsFiles {
    /// CA certificate(s) that sign every node's certificate.
    pub ca: PathBuf,
    /// This node's certificate chain.
    pub cert: PathBuf,
    /// This node's private key.
    pub key: PathBuf,
    /// The name every node's certificate carries (checked by the dialling side).
    pub server_name: String,
}

/// Settings of [`TcpTransport`].
#[derive(Clone, Debug)]
pub struct TcpConfig {
    /// This node.
    pub node: NodeId,
    /// Cluster identity: a peer presenting another is refused (a misdirected node).
    pub cluster_id: u64,
    /// Address to listen on (port 0 picks one).
    pub listen: SocketAddr,
    /// Address peers should dial to reach this node (sent in the handshake).
    pub advertise: Option<String>,
    /// Known peers.
    pub peers: HashMap<NodeId, String>,
    /// Largest frame body accepted or sent.
    pub max_frame_bytes: u32,
    /// Bytes queued per peer before frames are dropped.
    pub max_queued_bytes: usize,
    /// Mutual TLS, when set.
    pub tls: Option<TlsFiles>,
}

impl TcpConfig {
    /// Defaults for `node` listening on `listen`.
    pub fn new(node: NodeId, listen: SocketAddr) -> Self {
        Self {
            node,
            cluster_id: 1,
            listen,
            advertise: None,
            peers: HashMap::new(),
            max_frame_bytes: wire::DEFAULT_MAX_FRAME_BYTES,
            max_queued_bytes: 256 << 20,
            tls: None,
        }
    }
}

#[derive(Default)]
struct Counters {
    frames_sent: AtomicU64,
    bytes_sent: AtomicU64,
    frames_received: AtomicU64,
    frames_dropped: AtomicU64,
    bad_connections: AtomicU64,
}

struct Outbox {
    buf: Vec<u8>,
    addr: Option<String>,
    /// The address changed since the connection was dialled: the next write dials the
    /// new one. The old connection may go on taking bytes for a while (seen under load in
    /// `tests/ooo.rs`: a peer restarted on a new port while the old connection was never
    /// reset), and what it takes is lost.
    redial: bool,
    /// The peer dialled us and said hello since the writer last looked: it is up, so a
    /// writer backing off after failed dials dials again at once instead of waiting out a
    /// backoff that grew while the peer was down (up to a second; after a whole cluster
    /// restarted, each node would otherwise wait that long to reach the ones that came up
    /// after it).
    heard: bool,
    closed: bool,
}

struct Peer {
    id: NodeId,
    out: Mutex<Outbox>,
    ready: Condvar,
    /// The outbound connection, held by whoever writes to it (lock order: `conn`, then
    /// `out`).
    conn: Mutex<Option<Conn>>,
}

/// An outbound connection.
enum Conn {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Conn {
    /// Writes all of `buf`, blocking (bounded by the socket's write timeout).
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        match self {
            Conn::Plain(t) => t.write_all(buf),
            Conn::Tls(t) => t.write_all(buf).and_then(|_| t.flush()),
        }
    }
}

/// Loaded TLS material: the server and client configurations of mutual TLS and the name
/// every node's certificate carries. Shared with the out-of-order transport.
pub(crate) struct Tls {
    pub(crate) server: Arc<rustls::ServerConfig>,
    pub(crate) client: Arc<rustls::ClientConfig>,
    pub(crate) name: rustls::pki_types::ServerName<'static>,
}

struct Shared {
    cfg: TcpConfig,
    advertise: String,
    handler: Arc<dyn Handler>,
    peers: RwLock<HashMap<NodeId, Arc<Peer>>>,
    counters: Counters,
    stop: AtomicBool,
    tls: Option<Tls>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// The authenticated inbound connection of each peer (to close on shutdown).
    inbound: Mutex<HashMap<NodeId, TcpStream>>,
}

/// The TCP transport. Dropping it (or [`TcpTransport::shutdown`]) stops its threads.
pub struct TcpTransport {
    shared: Arc<Shared>,
    local: SocketAddr,
}

impl std::fmt::Debug for TcpTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpTransport")
            .field("node", &self.shared.cfg.node)
            .field("local", &self.local)
            .finish()
    }
}

impl TcpTransport {
    /// Binds the listener and starts accepting; inbound messages go to `handler`.
    pub fn start(cfg: TcpConfig, handler: Arc<dyn Handler>) -> Result<Self, Error> {
        let tls = match &cfg.tls {
            Some(files) => Some(load_tls(files)?),
            None => None,
        };
        let listener = TcpListener::bind(cfg.listen).map_err(|e| Error::Io {
            what: format!("bind replication listener {}", cfg.listen),
            source: e,
        })?;
        let local = listener.local_addr().map_err(|e| Error::Io {
            what: "listener address".into(),
            source: e,
        })?;
        let advertise = cfg.advertise.clone().unwrap_or_else(|| local.to_string());
        let shared = Arc::new(Shared {
            advertise,
            handler,
            peers: RwLock::new(HashMap::new()),
            counters: Counters::default(),
            stop: AtomicBool::new(false),
            tls,
            threads: Mutex::new(Vec::new()),
            inbound: Mutex::new(HashMap::new()),
            cfg,
        });
        let peers: Vec<(NodeId, String)> = shared
            .cfg
            .peers
            .iter()
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        for (id, addr) in peers {
            if id != shared.cfg.node {
                shared.peer(id, Some(addr));
            }
        }
        let s = shared.clone();
        let h = std::thread::Builder::new()
            .name("chorus-accept".into())
            .spawn(move || accept_loop(s, listener))
            .map_err(|e| Error::Io {
                what: "spawn accept thread".into(),
                source: e,
            })?;
        shared.threads.lock().expect("threads").push(h);
        Ok(Self { shared, local })
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Stops every thread and closes every connection.
    pub fn shutdown(&self) {
        if self.shared.stop.swap(true, Ordering::SeqCst) {
            return;
        }
        for p in self.shared.peers.read().expect("peers").values() {
            p.out.lock().expect("outbox").closed = true;
            p.ready.notify_all();
        }
        for (_, s) in self.shared.inbound.lock().expect("inbound").drain() {
            let _ = s.shutdown(Shutdown::Both);
        }
        // Wake the accept loop with a connection of our own.
        let _ = TcpStream::connect_timeout(&self.local, Duration::from_millis(200));
        let threads: Vec<_> = self
            .shared
            .threads
            .lock()
            .expect("threads")
            .drain(..)
            .collect();
        for t in threads {
            let _ = t.join();
        }
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl TcpTransport {
    /// Queues one frame for peer `to`, encoded by `encode` straight into its output
    /// buffer; `kind` names the message in a log line.
    fn queue(&self, to: NodeId, group: u64, kind: &str, encode: impl FnOnce(&mut Vec<u8>)) {
        let peer = self.shared.peer(to, None);
        let mut out = peer.out.lock().expect("outbox");
        if out.closed || out.buf.len() >= self.shared.cfg.max_queued_bytes {
            self.shared
                .counters
                .frames_dropped
                .fetch_add(1, Ordering::Relaxed);
            return;
        }
        let was_empty = out.buf.is_empty();
        let before = out.buf.len();
        encode(&mut out.buf);
        if out.buf.len() - before
            > self.shared.cfg.max_frame_bytes as usize + wire::FRAME_HEADER_SIZE
        {
            // The replica bounds its messages below the frame limit; a frame over it would
            // be refused by the receiver, so do not send it.
            out.buf.truncate(before);
            self.shared
                .counters
                .frames_dropped
                .fetch_add(1, Ordering::Relaxed);
            tracing::error!(to, group, kind, "message exceeds the frame limit");
            return;
        }
        self.shared
            .counters
            .frames_sent
            .fetch_add(1, Ordering::Relaxed);
        drop(out);
        // A non-empty buffer already has a wake-up (or an inline write) coming.
        if was_empty && !corked(&self.shared, &peer) && !self.shared.write_inline(&peer) {
            peer.ready.notify_one();
        }
    }
}

/// Peers that frames were queued for while this thread was corked: written when the
/// cork ends.
type CorkedPeers = Vec<(Arc<Shared>, Arc<Peer>)>;

thread_local! {
    /// `Some` while this thread holds a [`Cork`].
    static CORKED: RefCell<Option<CorkedPeers>> = const { RefCell::new(None) };
}

/// Records `peer` for the thread's cork, if it holds one: the caller does not write.
fn corked(shared: &Arc<Shared>, peer: &Arc<Peer>) -> bool {
    CORKED.with(|c| match c.borrow_mut().as_mut() {
        Some(peers) => {
            if !peers.iter().any(|(_, p)| Arc::ptr_eq(p, peer)) {
                peers.push((shared.clone(), peer.clone()));
            }
            true
        }
        None => false,
    })
}

/// While a cork is held, the frames its thread queues for a peer wait in the peer's
/// buffer instead of being written at once; when the cork is dropped, each peer that got
/// frames is written once, everything queued for it in one `send`. A worker stepping
/// many groups in one pass holds one ([`crate::pass`]), so that the frames of tens of
/// groups to one peer cost one system call, not one each. Frames other threads queue
/// meanwhile join the same buffer (they find it non-empty and leave the write to the
/// cork's owner). Holding a cork while blocking on IO would delay every frame queued
/// for those peers: the pass drops it before it syncs.
pub(crate) struct Cork {
    /// Whether this cork began the thread's corking (a nested one does nothing).
    outer: bool,
}

impl Cork {
    /// Corks this thread.
    pub(crate) fn new() -> Self {
        let outer = CORKED.with(|c| {
            let mut c = c.borrow_mut();
            if c.is_some() {
                false
            } else {
                *c = Some(Vec::new());
                true
            }
        });
        Self { outer }
    }
}

impl Drop for Cork {
    fn drop(&mut self) {
        if !self.outer {
            return;
        }
        let peers = CORKED.with(|c| c.borrow_mut().take()).unwrap_or_default();
        for (shared, peer) in peers {
            if !shared.write_inline(&peer) {
                peer.ready.notify_one();
            }
        }
    }
}

impl Transport for TcpTransport {
    fn send(&self, to: NodeId, group: u64, msg: &Message) {
        self.queue(to, group, msg.kind(), |out| {
            wire::encode_msg_frame(group, msg, out)
        });
    }

    fn send_ooo(&self, to: NodeId, group: u64, msg: &OooMsg) {
        self.queue(to, group, "out-of-order", |out| {
            wire::encode_ooo_msg_frame(group, msg, out)
        });
    }

    fn set_peer_addr(&self, node: NodeId, addr: String) {
        if node != self.shared.cfg.node {
            self.shared.peer(node, Some(addr));
        }
    }

    fn stats(&self) -> TransportStats {
        let c = &self.shared.counters;
        TransportStats {
            frames_sent: c.frames_sent.load(Ordering::Relaxed),
            bytes_sent: c.bytes_sent.load(Ordering::Relaxed),
            frames_received: c.frames_received.load(Ordering::Relaxed),
            frames_dropped: c.frames_dropped.load(Ordering::Relaxed),
            bad_connections: c.bad_connections.load(Ordering::Relaxed),
        }
    }
}

impl Shared {
    /// Sends the peer's queued bytes from the calling thread if that needs no waiting:
    /// nobody else is writing, the connection is up and plain TCP, and the socket takes
    /// the bytes without blocking. Returns false when the writer thread must take over
    /// (what was not sent is back at the front of the queue).
    fn write_inline(&self, peer: &Peer) -> bool {
        let Ok(mut guard) = peer.conn.try_lock() else {
            return false;
        };
        let Some(Conn::Plain(tcp)) = guard.as_mut() else {
            return false;
        };
        let mut batch = {
            let mut out = peer.out.lock().expect("outbox");
            if out.closed {
                return true;
            }
            if out.redial {
                // The writer thread dials the new address.
                return false;
            }
            std::mem::take(&mut out.buf)
        };
        if batch.is_empty() {
            return true;
        }
        // An error (a full socket buffer, a broken connection) sent nothing: the writer
        // thread waits, or redials.
        let sent = socket2::SockRef::from(&*tcp)
            .send_with_flags(&batch, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
            .unwrap_or(0);
        self.counters
            .bytes_sent
            .fetch_add(sent as u64, Ordering::Relaxed);
        if sent == batch.len() {
            batch.clear();
            let mut out = peer.out.lock().expect("outbox");
            if out.buf.is_empty() && out.buf.capacity() < batch.capacity() {
                // Keep the larger allocation for the next frames.
                out.buf = batch;
            }
            return out.buf.is_empty();
        }
        // The unsent rest goes first, then whatever was queued meanwhile: the stream
        // continues exactly where this write stopped.
        batch.drain(..sent);
        let mut out = peer.out.lock().expect("outbox");
        batch.extend_from_slice(&out.buf);
        out.buf = batch;
        false
    }

    /// The peer's outbox, created (with its writer thread) on first use.
    fn peer(self: &Arc<Self>, id: NodeId, addr: Option<String>) -> Arc<Peer> {
        if let Some(p) = self.peers.read().expect("peers").get(&id) {
            if let Some(a) = addr {
                let mut out = p.out.lock().expect("outbox");
                if out.addr.as_deref() != Some(&a) {
                    out.addr = Some(a);
                    out.redial = true;
                    drop(out);
                    p.ready.notify_one();
                }
            }
            return p.clone();
        }
        let mut peers = self.peers.write().expect("peers");
        if let Some(p) = peers.get(&id) {
            return p.clone();
        }
        let p = Arc::new(Peer {
            id,
            out: Mutex::new(Outbox {
                buf: Vec::new(),
                addr,
                redial: false,
                heard: false,
                closed: self.stop.load(Ordering::SeqCst),
            }),
            ready: Condvar::new(),
            conn: Mutex::new(None),
        });
        peers.insert(id, p.clone());
        let s = self.clone();
        let p2 = p.clone();
        match std::thread::Builder::new()
            .name(format!("chorus-send-{id}"))
            .spawn(move || writer_loop(s, p2))
        {
            Ok(h) => self.threads.lock().expect("threads").push(h),
            Err(e) => tracing::error!(peer = id, error = %e, "cannot start sender thread"),
        }
        p
    }
}

/// Dials the peer (with TLS if configured) and sends the handshake.
fn dial(s: &Shared, addr: &str) -> io::Result<Conn> {
    let sa = addr
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "address resolves to nothing"))?;
    let tcp = TcpStream::connect_timeout(&sa, Duration::from_secs(2))?;
    tcp.set_nodelay(true)?;
    tcp.set_write_timeout(Some(Duration::from_secs(10)))?;
    let mut hello = Vec::new();
    wire::encode_frame(
        &Frame::Hello {
            cluster_id: s.cfg.cluster_id,
            node: s.cfg.node,
            listen_addr: s.advertise.clone(),
        },
        &mut hello,
    );
    let mut stream = match &s.tls {
        Some(t) => {
            let conn = rustls::ClientConnection::new(t.client.clone(), t.name.clone())
                .map_err(io::Error::other)?;
            let mut st = rustls::StreamOwned::new(conn, tcp);
            // Complete the handshake now so a refused certificate shows up here.
            while st.conn.is_handshaking() {
                st.conn.complete_io(&mut st.sock)?;
            }
            Conn::Tls(Box::new(st))
        }
        None => Conn::Plain(tcp),
    };
    stream.write_all(&hello)?;
    Ok(stream)
}

fn writer_loop(s: Arc<Shared>, p: Arc<Peer>) {
    let mut backoff = Duration::from_millis(10);
    let mut spare = Vec::new();
    loop {
        let closed = {
            let mut out = p.out.lock().expect("outbox");
            while out.buf.is_empty() && !out.closed {
                out = p.ready.wait(out).expect("outbox");
            }
            out.closed
        };
        if closed {
            *p.conn.lock().expect("connection") = None;
            return;
        }
        // Hold the connection from taking the buffer to the end of the write, so an
        // inline sender cannot write between (see `Shared::write_inline`).
        let mut conn = p.conn.lock().expect("connection");
        let (batch, addr) = {
            let mut out = p.out.lock().expect("outbox");
            std::mem::swap(&mut out.buf, &mut spare);
            if std::mem::take(&mut out.redial) && conn.is_some() {
                tracing::info!(peer = p.id, "address changed: redialling");
                *conn = None;
            }
            (std::mem::take(&mut spare), out.addr.clone())
        };
        if batch.is_empty() {
            // An inline sender took it.
            spare = batch;
            continue;
        }
        let Some(addr) = addr else {
            s.counters.frames_dropped.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        if conn.is_none() {
            match dial(&s, &addr) {
                Ok(c) => {
                    tracing::info!(peer = p.id, addr = %addr, "connected");
                    *conn = Some(c);
                    p.out.lock().expect("outbox").heard = false;
                    backoff = Duration::from_millis(10);
                }
                Err(e) => {
                    tracing::debug!(peer = p.id, addr = %addr, error = %e, "dial failed");
                    // The batch is lost; the protocol resends. Back off so a dead peer costs
                    // little (bounded exponential backoff).
                    s.counters.frames_dropped.fetch_add(1, Ordering::Relaxed);
                    spare = batch;
                    spare.clear();
                    drop(conn);
                    backoff = if backoff_wait(&s, &p, backoff) {
                        Duration::from_millis(10)
                    } else {
                        (backoff * 2).min(Duration::from_secs(1))
                    };
                    continue;
                }
            }
        }
        let c = conn.as_mut().expect("connected");
        match c.write_all(&batch) {
            Ok(()) => {
                s.counters
                    .bytes_sent
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
            }
            Err(e) => {
                tracing::info!(peer = p.id, error = %e, "connection lost");
                *conn = None;
            }
        }
        drop(conn);
        spare = batch;
        spare.clear();
        if spare.capacity() > 16 << 20 {
            spare = Vec::new();
        }
    }
}

/// Waits `d` after a failed dial of `p`, or less: true as soon as `p` has dialled us
/// (it is up again, [`Outbox::heard`]), false after `d` or once the transport stops.
fn backoff_wait(s: &Shared, p: &Peer, d: Duration) -> bool {
    let until = Instant::now() + d;
    let mut out = p.out.lock().expect("outbox");
    loop {
        if std::mem::take(&mut out.heard) {
            return true;
        }
        let now = Instant::now();
        if now >= until || out.closed || s.stop.load(Ordering::SeqCst) {
            return false;
        }
        let step = (until - now).min(Duration::from_millis(10));
        out = p.ready.wait_timeout(out, step).expect("outbox").0;
    }
}

fn accept_loop(s: Arc<Shared>, listener: TcpListener) {
    for conn in listener.incoming() {
        if s.stop.load(Ordering::SeqCst) {
            return;
        }
        let tcp = match conn {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                continue;
            }
        };
        let s2 = s.clone();
        let spawned = std::thread::Builder::new()
            .name("chorus-recv".into())
            .spawn(move || {
                let peer = tcp.peer_addr().ok();
                if let Err(e) = reader(&s2, tcp) {
                    if !s2.stop.load(Ordering::SeqCst) {
                        s2.counters.bad_connections.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(peer = ?peer, error = %e, "inbound connection closed");
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start receiver thread");
        }
    }
}

/// Why an inbound connection ended.
#[derive(Debug, thiserror::Error)]
enum ReadError {
    #[error("io: {0}")]
    Io(#[from] io::Error),
    #[error("bad frame: {0}")]
    Frame(#[from] chorus_core::format::FormatError),
    #[error("expected a hello frame first")]
    NoHello,
    #[error("peer belongs to cluster {found}, this node to cluster {expected}")]
    WrongCluster { expected: u64, found: u64 },
    #[error("tls: {0}")]
    Tls(String),
}

fn reader(s: &Arc<Shared>, tcp: TcpStream) -> Result<(), ReadError> {
    tcp.set_nodelay(true)?;
    // A peer that opens a connection and says nothing is not allowed to hold a thread.
    tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
    let ctl = tcp.try_clone()?;
    let stream: Box<dyn Read + Send> = match &s.tls {
        Some(t) => {
            let conn = rustls::ServerConnection::new(t.server.clone())
                .map_err(|e| ReadError::Tls(e.to_string()))?;
            let mut st = rustls::StreamOwned::new(conn, tcp);
            while st.conn.is_handshaking() {
                st.conn
                    .complete_io(&mut st.sock)
                    .map_err(|e| ReadError::Tls(e.to_string()))?;
            }
            Box::new(st)
        }
        None => Box::new(tcp),
    };
    // Frames are read through a buffer: a read takes whatever the socket holds, so a
    // burst of small frames (acknowledgements) costs one system call, not two per frame.
    let mut stream = io::BufReader::with_capacity(64 << 10, stream);
    let max = s.cfg.max_frame_bytes;
    let mut header = [0u8; wire::FRAME_HEADER_SIZE];
    let mut body = Vec::new();
    let mut from: Option<NodeId> = None;
    loop {
        if let Err(e) = stream.read_exact(&mut header) {
            if e.kind() == io::ErrorKind::UnexpectedEof && from.is_some() {
                return Ok(());
            }
            return Err(e.into());
        }
        let h = wire::decode_header(&header, max)?;
        body.resize(h.body_len as usize, 0);
        stream.read_exact(&mut body)?;
        let frame = wire::decode_body(&h, &body)?;
        match (frame, from) {
            (
                Frame::Hello {
                    cluster_id,
                    node,
                    listen_addr,
                },
                None,
            ) => {
                if cluster_id != s.cfg.cluster_id {
                    return Err(ReadError::WrongCluster {
                        expected: s.cfg.cluster_id,
                        found: cluster_id,
                    });
                }
                from = Some(node);
                // Authenticated: no more read timeout (a quiet group is not a dead peer),
                // and this connection replaces any older one from the same node, whose
                // reader would otherwise linger until TCP noticed.
                ctl.set_read_timeout(None)?;
                if let Some(old) = s
                    .inbound
                    .lock()
                    .expect("inbound")
                    .insert(node, ctl.try_clone()?)
                {
                    let _ = old.shutdown(Shutdown::Both);
                }
                // Learn how to answer a node we had no address for (a new member).
                let known = s
                    .peers
                    .read()
                    .expect("peers")
                    .get(&node)
                    .is_some_and(|p| p.out.lock().expect("outbox").addr.is_some());
                if !known && node != s.cfg.node && !listen_addr.is_empty() {
                    s.peer(node, Some(listen_addr));
                }
                // It is up: a writer backing off from it dials again now.
                if let Some(p) = s.peers.read().expect("peers").get(&node) {
                    p.out.lock().expect("outbox").heard = true;
                    p.ready.notify_one();
                }
            }
            (Frame::Msg { group, msg }, Some(node)) => {
                s.counters.frames_received.fetch_add(1, Ordering::Relaxed);
                s.handler.deliver(node, group, msg);
            }
            (Frame::OooMsg { group, msg }, Some(node)) => {
                s.counters.frames_received.fetch_add(1, Ordering::Relaxed);
                s.handler.deliver_ooo(node, group, msg);
            }
            _ => return Err(ReadError::NoHello),
        }
        if body.capacity() > 16 << 20 {
            body = Vec::new();
        }
    }
}

pub(crate) fn load_tls(files: &TlsFiles) -> Result<Tls, Error> {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    let bad = |what: &str, detail: String| Error::Config {
        setting: "tls".into(),
        value: what.into(),
        accepted: detail,
    };
    let read = |p: &PathBuf| {
        std::fs::read(p).map_err(|e| Error::Io {
            what: format!("read {}", p.display()),
            source: e,
        })
    };
    let certs = |p: &PathBuf| -> Result<Vec<CertificateDer<'static>>, Error> {
        let pem = read(p)?;
        let v: Result<Vec<_>, _> = rustls_pemfile::certs(&mut &pem[..]).collect();
        let v = v.map_err(|e| bad(&p.display().to_string(), format!("PEM certificates: {e}")))?;
        if v.is_empty() {
            return Err(bad(
                &p.display().to_string(),
                "a PEM file with at least one certificate".into(),
            ));
        }
        Ok(v)
    };
    let ca = certs(&files.ca)?;
    let chain = certs(&files.cert)?;
    let key_pem = read(&files.key)?;
    let key: PrivateKeyDer<'static> = rustls_pemfile::private_key(&mut &key_pem[..])
        .map_err(|e| {
            bad(
                &files.key.display().to_string(),
                format!("a PEM private key: {e}"),
            )
        })?
        .ok_or_else(|| {
            bad(
                &files.key.display().to_string(),
                "a PEM file with a private key".into(),
            )
        })?;
    let mut roots = rustls::RootCertStore::empty();
    for c in ca {
        roots.add(c).map_err(|e| {
            bad(
                &files.ca.display().to_string(),
                format!("a CA certificate: {e}"),
            )
        })?;
    }
    let roots = Arc::new(roots);
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        roots.clone(),
        provider.clone(),
    )
    .build()
    .map_err(|e| bad("ca", e.to_string()))?;
    let server = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| bad("protocol versions", e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain.clone(), key.clone_key())
        .map_err(|e| bad(&files.cert.display().to_string(), e.to_string()))?;
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad("protocol versions", e.to_string()))?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(|e| bad(&files.cert.display().to_string(), e.to_string()))?;
    let name = ServerName::try_from(files.server_name.clone()).map_err(|e| Error::Config {
        setting: "tls.server_name".into(),
        value: files.server_name.clone(),
        accepted: format!("a DNS name or IP address ({e})"),
    })?;
    Ok(Tls {
        server: Arc::new(server),
        client: Arc::new(client),
        name,
    })
}
