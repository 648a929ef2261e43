//! Raft RPC over TCP: one persistent connection per (sender, peer) pair, pipelined.
//!
//! A connection starts with the sender's node id (u64 LE). After that both directions carry
//! frames `[u32 LE length][bincode payload]`: requests `Req { id, msg }` from the dialling
//! side and responses `Resp { id, body }` from the accepting side. Any number of requests
//! can be in flight on one connection; responses are matched to callers by `id`.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::error::{
    Fatal, NetworkError, RPCError, RaftError, ReplicationClosed, StreamingError, Unreachable,
};
use openraft::network::RPCOption;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::{
    BasicNode, OptionalSend, Raft, RaftNetwork, RaftNetworkFactory, Snapshot, SnapshotMeta, Vote,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};

use crate::{NodeId, TypeConfig};

const MAX_FRAME: usize = 1 << 30;

#[derive(Serialize, Deserialize)]
enum Msg {
    Append(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<NodeId>),
    Snapshot {
        vote: Vote<NodeId>,
        meta: SnapshotMeta<NodeId, BasicNode>,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
}

#[derive(Serialize, Deserialize)]
struct Req {
    id: u64,
    msg: Msg,
}

#[derive(Serialize, Deserialize)]
enum Body {
    Append(AppendEntriesResponse<NodeId>),
    Vote(VoteResponse<NodeId>),
    Snapshot(SnapshotResponse<NodeId>),
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
}

/// The shared connection to one peer (all `RaftNetwork` clients for that peer use it).
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

impl PeerConn {
    fn new(my_id: NodeId, addr: String) -> Self {
        PeerConn {
            my_id,
            addr,
            conn: tokio::sync::Mutex::new(None),
            next_id: AtomicU64::new(1),
        }
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

    async fn call(&self, msg: Msg, ttl: Duration) -> Result<Body, CallErr> {
        let conn = self.get().await?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        conn.pending.lock().unwrap().insert(id, tx);
        if conn.dead.load(Ordering::SeqCst) || conn.tx.send(encode(&Req { id, msg })).is_err() {
            conn.pending.lock().unwrap().remove(&id);
            return Err(CallErr::Network(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "connection closed",
            )));
        }
        match tokio::time::timeout(ttl, rx).await {
            Ok(Ok(body)) => Ok(body),
            Ok(Err(_)) => Err(CallErr::Network(io::Error::new(
                io::ErrorKind::ConnectionReset,
                "connection lost",
            ))),
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

#[derive(Clone)]
pub struct Network {
    my_id: NodeId,
    peers: HashMap<NodeId, Arc<PeerConn>>,
}

impl Network {
    pub fn new(my_id: NodeId) -> Self {
        Network {
            my_id,
            peers: HashMap::new(),
        }
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> PeerClient {
        let my_id = self.my_id;
        let p = self
            .peers
            .entry(target)
            .or_insert_with(|| Arc::new(PeerConn::new(my_id, node.addr.clone())))
            .clone();
        PeerClient { peer: p }
    }
}

pub struct PeerClient {
    peer: Arc<PeerConn>,
}

type RpcErr = RPCError<NodeId, BasicNode, RaftError<NodeId>>;

fn rpc_err(e: CallErr) -> RpcErr {
    match e {
        CallErr::Unreachable(e) => RPCError::Unreachable(Unreachable::new(&e)),
        CallErr::Network(e) => RPCError::Network(NetworkError::new(&e)),
    }
}

fn remote_err(kind: &str, s: String) -> io::Error {
    io::Error::other(format!("remote {kind} error: {s}"))
}

fn unexpected() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, "unexpected response type")
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RpcErr> {
        match self
            .peer
            .call(Msg::Append(rpc), option.hard_ttl())
            .await
            .map_err(rpc_err)?
        {
            Body::Append(r) => Ok(r),
            Body::Err(s) => Err(RPCError::Network(NetworkError::new(&remote_err(
                "append", s,
            )))),
            _ => Err(RPCError::Network(NetworkError::new(&unexpected()))),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RpcErr> {
        match self
            .peer
            .call(Msg::Vote(rpc), option.hard_ttl())
            .await
            .map_err(rpc_err)?
        {
            Body::Vote(r) => Ok(r),
            Body::Err(s) => Err(RPCError::Network(NetworkError::new(&remote_err("vote", s)))),
            _ => Err(RPCError::Network(NetworkError::new(&unexpected()))),
        }
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote<NodeId>,
        snapshot: Snapshot<TypeConfig>,
        _cancel: impl Future<Output = ReplicationClosed> + OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<NodeId>, StreamingError<TypeConfig, Fatal<NodeId>>> {
        let msg = Msg::Snapshot {
            vote,
            meta: snapshot.meta,
            data: snapshot.snapshot.into_inner(),
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

/// Accepts peer connections and serves their RPCs against `raft`. If `exit_on_close_from` is
/// set, the process exits once an established connection from that node closes.
pub async fn serve(
    listener: TcpListener,
    raft: Raft<TypeConfig>,
    exit_on_close_from: Option<NodeId>,
) {
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
            let mut buf = Vec::new();
            while let Ok(req) = read_frame::<Req>(&mut r, &mut buf).await {
                let raft = raft.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    let body = match req.msg {
                        Msg::Append(rpc) => match raft.append_entries(rpc).await {
                            Ok(x) => Body::Append(x),
                            Err(e) => Body::Err(e.to_string()),
                        },
                        Msg::Vote(rpc) => match raft.vote(rpc).await {
                            Ok(x) => Body::Vote(x),
                            Err(e) => Body::Err(e.to_string()),
                        },
                        Msg::Snapshot { vote, meta, data } => {
                            let snap = Snapshot {
                                meta,
                                snapshot: Box::new(std::io::Cursor::new(data)),
                            };
                            match raft.install_full_snapshot(vote, snap).await {
                                Ok(x) => Body::Snapshot(x),
                                Err(e) => Body::Err(e.to_string()),
                            }
                        }
                    };
                    let _ = tx.send(encode(&Resp { id: req.id, body }));
                });
            }
            if exit_on_close_from == Some(from) {
                eprintln!("connection from node {from} closed; exiting");
                std::process::exit(0);
            }
        });
    }
}
