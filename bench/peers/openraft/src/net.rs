//! Raft RPC over TCP for openraft's network v2 (`RaftNetworkV2`), with a pipelined
//! `stream_append`.
//!
//! Each node dials each peer once; everything it sends to that peer (replication streams,
//! heartbeats, votes, snapshots) shares that connection, which is re-dialled only after it
//! breaks. A connection starts with the sender's node id (u64 LE). After that both directions
//! carry frames `[u32 LE length][bincode payload]`: requests `Req { id, msg }` from the
//! dialling side, responses `Resp { id, body }` from the accepting side, matched to their
//! callers by `id`, so any number of requests can be in flight.
//!
//! `stream_append` (replication): openraft hands the network a stream of AppendEntries
//! requests and wants a stream of their results back, in order. Here a pump task sends each
//! request as soon as openraft produces it (`Msg::Stream { sid, .. }`), without waiting for
//! the answers to the earlier ones, and the returned stream awaits the answers in request
//! order. On the receiving side, the frames of one stream (`sid`) are fed, in order, into one
//! `Raft::stream_append` call, which pipelines them into the follower's RaftCore; its results
//! go back tagged with each request's id. The follower answers a request only after its log
//! has flushed the entries (openraft's `IOFlushed` condition).

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use openraft::alias::{SnapshotMetaOf, SnapshotOf, VoteOf};
use openraft::base::{BoxFuture, BoxStream};
use openraft::errors::{NetworkError, RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::RPCOption;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, StreamAppendResult, VoteRequest,
    VoteResponse,
};
use openraft::{BasicNode, OptionalSend, RaftNetworkFactory, RaftNetworkV2};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};

use crate::{NodeId, Raft, TypeConfig};

type C = TypeConfig;
const MAX_FRAME: usize = 1 << 30;

/// Raft request frames this process received from peers (not `Stats` or `StreamEnd`).
pub static FRAMES_RECEIVED: AtomicU64 = AtomicU64::new(0);

#[derive(Serialize, Deserialize)]
enum Msg {
    Append(AppendEntriesRequest<C>),
    /// One request of the replication stream `sid`.
    Stream {
        sid: u64,
        req: AppendEntriesRequest<C>,
    },
    /// The sender will send nothing more on stream `sid` (no response).
    StreamEnd {
        sid: u64,
    },
    Vote(VoteRequest<C>),
    PreVote(VoteRequest<C>),
    Snapshot {
        vote: VoteOf<C>,
        meta: SnapshotMetaOf<C>,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    /// The benchmark's counters (fdatasyncs, frames received); not a raft message.
    Stats,
}

#[derive(Serialize, Deserialize)]
struct Req {
    id: u64,
    msg: Msg,
}

#[derive(Serialize, Deserialize)]
enum Body {
    Append(AppendEntriesResponse<C>),
    Stream(StreamAppendResult<C>),
    Vote(VoteResponse<C>),
    Snapshot(SnapshotResponse<C>),
    Stats { fsyncs: u64, frames: u64 },
    Err(String),
}

#[derive(Serialize, Deserialize)]
struct Resp {
    id: u64,
    body: Body,
}

fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    let mut b = Vec::with_capacity(256);
    b.extend_from_slice(&[0u8; 4]);
    bincode::serialize_into(&mut b, v).expect("bincode encode");
    let len = (b.len() - 4) as u32;
    b[..4].copy_from_slice(&len.to_le_bytes());
    b
}

async fn read_frame<T: DeserializeOwned>(
    r: &mut BufReader<OwnedReadHalf>,
    buf: &mut Vec<u8>,
) -> io::Result<T> {
    let len = r.read_u32_le().await? as usize;
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "frame too large",
        ));
    }
    buf.resize(len, 0);
    r.read_exact(buf).await?;
    bincode::deserialize(buf).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Writes queued frames; everything queued since the last write goes out with one flush.
async fn writer_loop(
    w: OwnedWriteHalf,
    mut rx: mpsc::UnboundedReceiver<Vec<u8>>,
) -> io::Result<()> {
    let mut w = BufWriter::with_capacity(256 * 1024, w);
    while let Some(f) = rx.recv().await {
        w.write_all(&f).await?;
        while let Ok(f) = rx.try_recv() {
            w.write_all(&f).await?;
        }
        w.flush().await?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Client side.

struct Conn {
    tx: mpsc::UnboundedSender<Vec<u8>>,
    pending: Mutex<HashMap<u64, oneshot::Sender<Body>>>,
    dead: AtomicBool,
}

impl Conn {
    fn fail_all(&self) {
        self.dead.store(true, Ordering::SeqCst);
        self.pending.lock().unwrap().clear(); // dropping the senders wakes the callers
    }

    /// Registers a response slot for `id` and queues the frame. If the connection is dead,
    /// the slot is dropped, so its receiver reports the loss.
    fn start(&self, id: u64, msg: Msg) -> oneshot::Receiver<Body> {
        let (tx, rx) = oneshot::channel();
        self.pending.lock().unwrap().insert(id, tx);
        if self.dead.load(Ordering::SeqCst) || self.tx.send(encode(&Req { id, msg })).is_err() {
            self.pending.lock().unwrap().remove(&id);
        }
        rx
    }
}

/// The shared connection to one peer (every `RaftNetworkV2` client for that peer uses it).
pub struct PeerConn {
    my_id: NodeId,
    addr: String,
    conn: tokio::sync::Mutex<Option<Arc<Conn>>>,
    next_id: AtomicU64,
}

enum CallErr {
    Unreachable(io::Error),
    Network(io::Error),
}

fn lost() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionReset, "connection lost")
}

impl PeerConn {
    fn new(my_id: NodeId, addr: String) -> Self {
        PeerConn {
            my_id,
            addr,
            conn: tokio::sync::Mutex::new(None),
            next_id: AtomicU64::new(1),
        }
    }

    fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    async fn get(&self) -> Result<Arc<Conn>, CallErr> {
        let mut g = self.conn.lock().await;
        if let Some(c) = g.as_ref() {
            if !c.dead.load(Ordering::SeqCst) {
                return Ok(c.clone());
            }
        }
        *g = None;
        let s = tokio::time::timeout(Duration::from_secs(1), TcpStream::connect(&self.addr))
            .await
            .map_err(|_| {
                CallErr::Unreachable(io::Error::new(io::ErrorKind::TimedOut, "connect timeout"))
            })?
            .map_err(CallErr::Unreachable)?;
        s.set_nodelay(true).map_err(CallErr::Unreachable)?;
        let (r, mut w) = s.into_split();
        w.write_all(&self.my_id.to_le_bytes())
            .await
            .map_err(CallErr::Unreachable)?;
        let (tx, rx) = mpsc::unbounded_channel();
        let conn = Arc::new(Conn {
            tx,
            pending: Mutex::new(HashMap::new()),
            dead: AtomicBool::new(false),
        });
        {
            let conn = conn.clone();
            tokio::spawn(async move {
                let _ = writer_loop(w, rx).await;
                conn.fail_all();
            });
        }
        {
            let conn = conn.clone();
            tokio::spawn(async move {
                let mut r = BufReader::with_capacity(256 * 1024, r);
                let mut buf = Vec::new();
                while let Ok(resp) = read_frame::<Resp>(&mut r, &mut buf).await {
                    let tx = conn.pending.lock().unwrap().remove(&resp.id);
                    if let Some(tx) = tx {
                        let _ = tx.send(resp.body);
                    }
                }
                conn.fail_all();
            });
        }
        *g = Some(conn.clone());
        Ok(conn)
    }

    /// One request, one response.
    async fn call(&self, msg: Msg, ttl: Duration) -> Result<Body, CallErr> {
        let conn = self.get().await?;
        let id = self.next_id();
        let rx = conn.start(id, msg);
        match tokio::time::timeout(ttl, rx).await {
            Ok(Ok(body)) => Ok(body),
            Ok(Err(_)) => Err(CallErr::Network(lost())),
            Err(_) => {
                conn.pending.lock().unwrap().remove(&id);
                Err(CallErr::Network(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "rpc timeout",
                )))
            }
        }
    }
}

/// The network factory; clones share the per-peer connections.
#[derive(Clone)]
pub struct Network {
    my_id: NodeId,
    peers: Arc<Mutex<HashMap<NodeId, Arc<PeerConn>>>>,
}

impl Network {
    pub fn new(my_id: NodeId) -> Self {
        Network {
            my_id,
            peers: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    fn peer(&self, target: NodeId, addr: &str) -> Arc<PeerConn> {
        self.peers
            .lock()
            .unwrap()
            .entry(target)
            .or_insert_with(|| Arc::new(PeerConn::new(self.my_id, addr.to_string())))
            .clone()
    }

    /// A peer's benchmark counters: (fdatasync calls, request frames received).
    pub async fn stats(&self, target: NodeId, addr: &str) -> io::Result<(u64, u64)> {
        match self
            .peer(target, addr)
            .call(Msg::Stats, Duration::from_secs(5))
            .await
        {
            Ok(Body::Stats { fsyncs, frames }) => Ok((fsyncs, frames)),
            Ok(_) => Err(unexpected()),
            Err(CallErr::Unreachable(e)) | Err(CallErr::Network(e)) => Err(e),
        }
    }
}

impl RaftNetworkFactory<C> for Network {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> PeerClient {
        PeerClient {
            peer: self.peer(target, &node.addr),
        }
    }
}

pub struct PeerClient {
    peer: Arc<PeerConn>,
}

fn rpc_err(e: CallErr) -> RPCError<C> {
    match e {
        CallErr::Unreachable(e) => RPCError::Unreachable(Unreachable::new(&e)),
        CallErr::Network(e) => RPCError::Network(NetworkError::new(&e)),
    }
}

fn net_err(e: io::Error) -> RPCError<C> {
    RPCError::Network(NetworkError::new(&e))
}

fn remote_err(kind: &str, s: String) -> io::Error {
    io::Error::other(format!("remote {kind} error: {s}"))
}

fn unexpected() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, "unexpected response type")
}

/// How long a replication stream waits for the next answer before it gives up on the stream
/// (openraft then opens a new one). openraft's `RPCOption` asks for the heartbeat interval;
/// a shared disk's fdatasync can stall longer than that, and giving up would only make the
/// leader resend, so allow at least a second.
fn stream_ttl(option: &RPCOption) -> Duration {
    option.hard_ttl().max(Duration::from_secs(1))
}

/// The receiving end of one `stream_append` call: the answers, in request order.
struct StreamOut {
    conn: Arc<Conn>,
    order: mpsc::UnboundedReceiver<(u64, oneshot::Receiver<Body>)>,
    /// Dropped with this struct: tells the pump to stop.
    _stop: oneshot::Sender<()>,
    ttl: Duration,
    done: bool,
}

impl Drop for StreamOut {
    fn drop(&mut self) {
        // Forget the answers nobody will wait for.
        let mut p = self.conn.pending.lock().unwrap();
        while let Ok((id, _)) = self.order.try_recv() {
            p.remove(&id);
        }
    }
}

/// Sends each request of `input` on stream `sid` as soon as openraft produces it.
async fn pump<S>(
    peer: Arc<PeerConn>,
    conn: Arc<Conn>,
    sid: u64,
    mut input: S,
    order: mpsc::UnboundedSender<(u64, oneshot::Receiver<Body>)>,
    mut stop: oneshot::Receiver<()>,
) where
    S: Stream<Item = AppendEntriesRequest<C>> + Unpin,
{
    loop {
        let req = tokio::select! {
            biased;
            _ = &mut stop => break,
            r = input.next() => match r {
                Some(r) => r,
                None => break,
            },
        };
        let id = peer.next_id();
        let rx = conn.start(id, Msg::Stream { sid, req });
        if order.send((id, rx)).is_err() {
            conn.pending.lock().unwrap().remove(&id);
            break;
        }
    }
    let _ = conn.tx.send(encode(&Req {
        id: 0,
        msg: Msg::StreamEnd { sid },
    }));
}

impl RaftNetworkV2<C> for PeerClient {
    type SnapshotData = Vec<u8>;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<C>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<C>, RPCError<C>> {
        match self
            .peer
            .call(Msg::Append(rpc), option.hard_ttl())
            .await
            .map_err(rpc_err)?
        {
            Body::Append(r) => Ok(r),
            Body::Err(s) => Err(net_err(remote_err("append", s))),
            _ => Err(net_err(unexpected())),
        }
    }

    fn stream_append<'s, S>(
        &'s mut self,
        input: S,
        option: RPCOption,
    ) -> BoxFuture<'s, Result<BoxStream<'s, Result<StreamAppendResult<C>, RPCError<C>>>, RPCError<C>>>
    where
        S: Stream<Item = AppendEntriesRequest<C>> + OptionalSend + Unpin + 'static,
    {
        let peer = self.peer.clone();
        Box::pin(async move {
            let conn = peer.get().await.map_err(rpc_err)?;
            let sid = peer.next_id();
            let (order_tx, order_rx) = mpsc::unbounded_channel();
            let (stop_tx, stop_rx) = oneshot::channel();
            tokio::spawn(pump(peer, conn.clone(), sid, input, order_tx, stop_rx));
            let out = StreamOut {
                conn,
                order: order_rx,
                _stop: stop_tx,
                ttl: stream_ttl(&option),
                done: false,
            };
            let strm = futures_util::stream::unfold(out, |mut out| async move {
                if out.done {
                    return None;
                }
                // None: the input ended and every answer was yielded.
                let (id, rx) = out.order.recv().await?;
                let res = match tokio::time::timeout(out.ttl, rx).await {
                    Ok(Ok(Body::Stream(r))) => Ok(r),
                    Ok(Ok(Body::Err(s))) => Err(net_err(remote_err("stream_append", s))),
                    Ok(Ok(_)) => Err(net_err(unexpected())),
                    Ok(Err(_)) => Err(net_err(lost())),
                    Err(_) => {
                        out.conn.pending.lock().unwrap().remove(&id);
                        Err(net_err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "stream_append timeout",
                        )))
                    }
                };
                // openraft ends a stream at its first error (Conflict, HigherVote); so does
                // this side.
                out.done = !matches!(res, Ok(Ok(_)));
                Some((res, out))
            });
            let strm: BoxStream<'s, _> = Box::pin(strm);
            Ok(strm)
        })
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<C>,
        option: RPCOption,
    ) -> Result<VoteResponse<C>, RPCError<C>> {
        match self
            .peer
            .call(Msg::Vote(rpc), option.hard_ttl())
            .await
            .map_err(rpc_err)?
        {
            Body::Vote(r) => Ok(r),
            Body::Err(s) => Err(net_err(remote_err("vote", s))),
            _ => Err(net_err(unexpected())),
        }
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<C>,
        option: RPCOption,
    ) -> Result<VoteResponse<C>, RPCError<C>> {
        match self
            .peer
            .call(Msg::PreVote(rpc), option.hard_ttl())
            .await
            .map_err(rpc_err)?
        {
            Body::Vote(r) => Ok(r),
            Body::Err(s) => Err(net_err(remote_err("pre_vote", s))),
            _ => Err(net_err(unexpected())),
        }
    }

    async fn full_snapshot(
        &mut self,
        vote: VoteOf<C>,
        snapshot: SnapshotOf<C, Vec<u8>>,
        _cancel: impl Future<Output = ReplicationClosed> + OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<C>, StreamingError<C>> {
        let msg = Msg::Snapshot {
            vote,
            meta: snapshot.meta,
            data: snapshot.snapshot,
        };
        let ttl = option.hard_ttl().max(Duration::from_secs(10));
        match self.peer.call(msg, ttl).await {
            Ok(Body::Snapshot(r)) => Ok(r),
            Ok(Body::Err(s)) => Err(StreamingError::Network(NetworkError::new(&remote_err(
                "snapshot", s,
            )))),
            Ok(_) => Err(StreamingError::Network(NetworkError::new(&unexpected()))),
            Err(CallErr::Unreachable(e)) => Err(StreamingError::Unreachable(Unreachable::new(&e))),
            Err(CallErr::Network(e)) => Err(StreamingError::Network(NetworkError::new(&e))),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Server side.

type StreamIn = mpsc::UnboundedSender<(u64, AppendEntriesRequest<C>)>;

/// Starts serving one replication stream: its requests go, in order, into one
/// `Raft::stream_append`; each result goes back tagged with its request's id.
fn start_stream(raft: &Raft, out: mpsc::UnboundedSender<Vec<u8>>) -> StreamIn {
    let (tx, rx) = mpsc::unbounded_channel::<(u64, AppendEntriesRequest<C>)>();
    let ids: Arc<Mutex<VecDeque<u64>>> = Arc::new(Mutex::new(VecDeque::new()));
    let in_ids = ids.clone();
    let input = futures_util::stream::unfold(rx, move |mut rx| {
        let ids = in_ids.clone();
        async move {
            let (id, req) = rx.recv().await?;
            ids.lock().unwrap().push_back(id);
            Some((req, rx))
        }
    });
    let results = raft.stream_append(input);
    tokio::spawn(async move {
        let mut results = std::pin::pin!(results);
        while let Some(r) = results.next().await {
            let Some(id) = ids.lock().unwrap().pop_front() else {
                break;
            };
            let body = match r {
                Ok(r) => Body::Stream(r),
                Err(fatal) => Body::Err(fatal.to_string()),
            };
            if out.send(encode(&Resp { id, body })).is_err() {
                break;
            }
        }
    });
    tx
}

/// Accepts peer connections and serves their RPCs against `raft`. If `exit_on_close_from` is
/// set, the process exits once an established connection from that node closes.
pub async fn serve(listener: TcpListener, raft: Raft, exit_on_close_from: Option<NodeId>) {
    loop {
        let (s, _) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                eprintln!("accept: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let raft = raft.clone();
        tokio::spawn(async move {
            let _ = s.set_nodelay(true);
            let (r, w) = s.into_split();
            let mut r = BufReader::with_capacity(256 * 1024, r);
            let from = match r.read_u64_le().await {
                Ok(id) => id,
                Err(_) => return,
            };
            let (tx, rx) = mpsc::unbounded_channel::<Vec<u8>>();
            tokio::spawn(writer_loop(w, rx));
            let mut streams: HashMap<u64, StreamIn> = HashMap::new();
            let mut buf = Vec::new();
            while let Ok(req) = read_frame::<Req>(&mut r, &mut buf).await {
                if !matches!(req.msg, Msg::Stats | Msg::StreamEnd { .. }) {
                    FRAMES_RECEIVED.fetch_add(1, Ordering::Relaxed);
                }
                let id = req.id;
                let msg = match req.msg {
                    Msg::Stream { sid, req } => {
                        let s = streams
                            .entry(sid)
                            .or_insert_with(|| start_stream(&raft, tx.clone()));
                        let _ = s.send((id, req));
                        continue;
                    }
                    Msg::StreamEnd { sid } => {
                        streams.remove(&sid);
                        continue;
                    }
                    m => m,
                };
                let raft = raft.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    let body = match msg {
                        Msg::Append(rpc) => match raft.append_entries(rpc).await {
                            Ok(x) => Body::Append(x),
                            Err(e) => Body::Err(e.to_string()),
                        },
                        Msg::Vote(rpc) => match raft.vote(rpc).await {
                            Ok(x) => Body::Vote(x),
                            Err(e) => Body::Err(e.to_string()),
                        },
                        Msg::PreVote(rpc) => match raft.pre_vote(rpc).await {
                            Ok(x) => Body::Vote(x),
                            Err(e) => Body::Err(e.to_string()),
                        },
                        Msg::Snapshot { vote, meta, data } => {
                            let snap = SnapshotOf::<C, Vec<u8>> {
                                meta,
                                snapshot: data,
                            };
                            match raft.install_full_snapshot(vote, snap).await {
                                Ok(x) => Body::Snapshot(x),
                                Err(e) => Body::Err(e.to_string()),
                            }
                        }
                        Msg::Stats => Body::Stats {
                            fsyncs: crate::store::FSYNCS.load(Ordering::Relaxed),
                            frames: FRAMES_RECEIVED.load(Ordering::Relaxed),
                        },
                        Msg::Stream { .. } | Msg::StreamEnd { .. } => unreachable!(),
                    };
                    let _ = tx.send(encode(&Resp { id, body }));
                });
            }
            if exit_on_close_from == Some(from) {
                eprintln!("connection from node {from} closed; exiting");
                std::process::exit(0);
            }
        });
    }
}
