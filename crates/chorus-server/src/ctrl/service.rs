//! The Control gRPC service (`proto/chorus.proto`, `service Control`) on a control node.

use std::pin::Pin;
use std::sync::Arc;

use chorus_client::pb;
use chorus_client::pb::control_server::Control;
use chorus_ctrl::{place_chunks, Chunk, Command, NodeState, SnapshotState};
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use super::{node_info, snapshot_info, volume_info, Controller};
use crate::auth::{Authz, Class};

/// The first chunk group id: chunk groups are numbered from 2^40 up, so that they never
/// meet the groups an operator creates by hand (the control group among them).
pub const CHUNK_GROUP_BASE: u64 = 1 << 40;
/// Replicas per chunk (PolarFS section 3.2: three).
pub const COPIES: usize = 3;
/// The largest volume: 1 PiB.
const MAX_VOLUME_BYTES: u64 = 1 << 50;
/// How long CreateVolume waits for the chunk groups before it answers "creating".
const CREATE_WAIT: std::time::Duration = std::time::Duration::from_secs(20);
/// GrowVolume to the size a volume has: nothing to propose, only groups to create.
const ALREADY_THAT_SIZE: &str = "the volume already has that size";
/// The most chunks one volume has.
const MAX_CHUNKS: u64 = 1 << 16;

/// The Control service of one control node.
#[derive(Clone, Debug)]
pub struct ControlService {
    c: Arc<Controller>,
    /// Who may call what ([`crate::auth`]): the control plane's operations name no one
    /// group, so each needs an identity allowed every group.
    auth: Arc<Authz>,
}

impl ControlService {
    /// Serves `c`, checking every call against `auth`.
    pub fn new(c: Arc<Controller>, auth: Arc<Authz>) -> Self {
        Self { c, auth }
    }

    /// Chunk groups for `count` new chunks placed on live nodes, numbered from the
    /// state's next group id.
    fn place(&self, m: &chorus_ctrl::Meta, count: u64) -> Result<Vec<Chunk>, Status> {
        let live = self.c.live_set();
        let placed = place_chunks(m, &live, count as usize, COPIES).map_err(|e| {
            Status::failed_precondition(format!("cannot place {count} chunks: {e}"))
        })?;
        Ok(placed
            .into_iter()
            .enumerate()
            .map(|(i, replicas)| Chunk {
                group: m.next_group().max(CHUNK_GROUP_BASE) + i as u64,
                replicas,
                moving: None,
            })
            .collect())
    }
}

fn chunk_count(size_bytes: u64, chunk_bytes: u64) -> Result<u64, Status> {
    if size_bytes == 0 || size_bytes > MAX_VOLUME_BYTES {
        return Err(Status::invalid_argument(format!(
            "size_bytes {size_bytes}: a volume holds 1 byte to 1 PiB"
        )));
    }
    let n = size_bytes.div_ceil(chunk_bytes.max(1));
    if n > MAX_CHUNKS {
        return Err(Status::invalid_argument(format!(
            "{size_bytes} bytes in chunks of {chunk_bytes} is {n} chunks, more than {MAX_CHUNKS}"
        )));
    }
    Ok(n)
}

type InfoStream = Pin<Box<dyn Stream<Item = Result<pb::VolumeInfo, Status>> + Send>>;

#[tonic::async_trait]
impl Control for ControlService {
    async fn heartbeat(
        &self,
        req: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatResponse>, Status> {
        self.auth.check(req.metadata(), Class::Admin, None)?;
        let r = req.into_inner();
        if r.node == 0 {
            return Err(Status::invalid_argument("node id 0 is reserved"));
        }
        if !self.c.is_leader() {
            return Err(self.c.not_leader());
        }
        let known = self.c.with_meta(|m| {
            m.node(r.node).map(|n| {
                n.repl_addr == r.repl_addr && n.client_addr == r.client_addr && n.rack == r.rack
            })
        });
        if known != Some(true) {
            self.c
                .propose(Command::RegisterNode {
                    id: r.node,
                    repl_addr: r.repl_addr.clone(),
                    client_addr: r.client_addr.clone(),
                    rack: r.rack.clone(),
                })
                .await?;
            tracing::info!(node = r.node, addr = %r.client_addr, rack = %r.rack, "node registered");
        }
        self.c.heartbeat(r.node);
        let nodes = self
            .c
            .with_meta(|m| m.nodes().values().map(node_info).collect());
        Ok(Response::new(pb::HeartbeatResponse { nodes }))
    }

    async fn create_volume(
        &self,
        req: Request<pb::CreateVolumeRequest>,
    ) -> Result<Response<pb::VolumeInfo>, Status> {
        self.auth.check(req.metadata(), Class::Admin, None)?;
        let r = req.into_inner();
        let chunk_bytes = if r.chunk_bytes == 0 {
            self.c.cfg.chunk_bytes
        } else {
            r.chunk_bytes
        };
        let block_bytes = if r.block_bytes == 0 {
            chorus_chunk::DEFAULT_BLOCK_BYTES
        } else {
            r.block_bytes
        };
        let geo = chorus_chunk::Geometry {
            chunk_bytes,
            block_bytes,
        };
        geo.check()
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let n = chunk_count(r.size_bytes, chunk_bytes)?;
        let name = r.name.clone();
        self.c
            .propose_with(|m| {
                Ok(Command::CreateVolume {
                    name: r.name,
                    size_bytes: r.size_bytes,
                    chunk_bytes,
                    block_bytes,
                    chunks: self.place(m, n)?,
                })
            })
            .await?;
        // The volume exists from here on (its creation is not repeated: a retry would be
        // refused as existing). Its chunk groups are created now, or by the duties if a
        // node cannot be reached yet: answer once it is ready, or as still creating after
        // CREATE_WAIT.
        let end = tokio::time::Instant::now() + CREATE_WAIT;
        loop {
            match super::duties::finish_creating(&self.c, &name).await {
                Ok(()) => break,
                Err(e) if tokio::time::Instant::now() >= end => {
                    tracing::warn!(volume = %name, error = %e, "volume created, its chunk groups not yet");
                    break;
                }
                Err(e) => {
                    tracing::debug!(volume = %name, error = %e, "creating chunk groups");
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                }
            }
        }
        self.c
            .volume_info(&name)
            .map(Response::new)
            .ok_or_else(|| Status::not_found(format!("volume `{name}` was deleted meanwhile")))
    }

    async fn stat_volume(
        &self,
        req: Request<pb::VolumeName>,
    ) -> Result<Response<pb::VolumeInfo>, Status> {
        self.auth.check(req.metadata(), Class::Read, None)?;
        let name = req.into_inner().name;
        self.c
            .volume_info(&name)
            .map(Response::new)
            .ok_or_else(|| Status::not_found(format!("volume `{name}` does not exist")))
    }

    async fn list_volumes(
        &self,
        req: Request<pb::Empty>,
    ) -> Result<Response<pb::ListVolumesResponse>, Status> {
        self.auth.check(req.metadata(), Class::Read, None)?;
        let volumes = self
            .c
            .with_meta(|m| m.volumes().values().map(|v| volume_info(m, v)).collect());
        Ok(Response::new(pb::ListVolumesResponse { volumes }))
    }

    async fn grow_volume(
        &self,
        req: Request<pb::GrowVolumeRequest>,
    ) -> Result<Response<pb::VolumeInfo>, Status> {
        self.auth.check(req.metadata(), Class::Admin, None)?;
        let r = req.into_inner();
        let name = r.name.clone();
        let grown = self
            .c
            .propose_with(|m| {
                let v = m.volume(&r.name).ok_or_else(|| {
                    Status::not_found(format!("volume `{}` does not exist", r.name))
                })?;
                if r.size_bytes == v.size_bytes {
                    // Finishing an earlier grow: nothing to change in the map.
                    return Err(Status::already_exists(ALREADY_THAT_SIZE));
                }
                if r.size_bytes < v.size_bytes {
                    return Err(Status::invalid_argument(format!(
                        "volume `{}` is {} bytes; it grows only, to more than that (asked {})",
                        r.name, v.size_bytes, r.size_bytes
                    )));
                }
                let want = chunk_count(r.size_bytes, v.chunk_bytes)?;
                let add = want - v.chunks.len() as u64;
                Ok(Command::GrowVolume {
                    name: r.name,
                    size_bytes: r.size_bytes,
                    chunks: self.place(m, add)?,
                })
            })
            .await;
        match grown {
            Err(s)
                if s.code() == tonic::Code::AlreadyExists && s.message() == ALREADY_THAT_SIZE => {}
            r => r?,
        }
        // Grown in the map; its new chunk groups are created now (a group that exists is
        // left as it is), retried until CREATE_WAIT.
        let end = tokio::time::Instant::now() + CREATE_WAIT;
        loop {
            match super::duties::create_chunk_groups(&self.c, &name).await {
                Ok(()) => break,
                Err(e) if tokio::time::Instant::now() >= end => {
                    return Err(Status::unavailable(format!(
                        "volume `{name}` grew, but not every new chunk group could be created yet (GrowVolume to the same size finishes it): {}",
                        e.message()
                    )))
                }
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(200)).await,
            }
        }
        self.c
            .volume_info(&name)
            .map(Response::new)
            .ok_or_else(|| Status::not_found(format!("volume `{name}` was deleted meanwhile")))
    }

    async fn delete_volume(
        &self,
        req: Request<pb::VolumeName>,
    ) -> Result<Response<pb::Empty>, Status> {
        self.auth.check(req.metadata(), Class::Admin, None)?;
        let name = req.into_inner().name;
        self.c
            .propose(Command::DeleteVolume { name: name.clone() })
            .await?;
        // The duties remove its chunk groups and then the volume; try once now.
        let _ = super::duties::finish_deleting(&self.c, &name).await;
        Ok(Response::new(pb::Empty {}))
    }

    async fn list_nodes(
        &self,
        req: Request<pb::Empty>,
    ) -> Result<Response<pb::ListNodesResponse>, Status> {
        self.auth.check(req.metadata(), Class::Read, None)?;
        // Liveness is the leader's: only it hears the heartbeats.
        if !self.c.is_leader() {
            return Err(self.c.not_leader());
        }
        let nodes = self.c.with_meta(|m| {
            let mut incoming = std::collections::BTreeMap::<u64, u64>::new();
            for (_, c) in m.chunks() {
                if let Some(mv) = c.moving {
                    *incoming.entry(mv.to).or_default() += 1;
                }
            }
            m.nodes()
                .values()
                .map(|n| pb::NodeInfo {
                    live: self.c.is_live(n.id),
                    chunks: m.load(n.id) as u64,
                    leaders: m.leader_load(n.id) as u64,
                    incoming: incoming.get(&n.id).copied().unwrap_or(0),
                    ..node_info(n)
                })
                .collect()
        });
        Ok(Response::new(pb::ListNodesResponse {
            nodes,
            leader: self.c.leader().unwrap_or(0),
        }))
    }

    async fn drain_node(
        &self,
        req: Request<pb::DrainNodeRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        self.auth.check(req.metadata(), Class::Admin, None)?;
        let id = req.into_inner().node;
        self.c
            .propose(Command::SetNodeState {
                id,
                state: NodeState::Draining,
            })
            .await?;
        Ok(Response::new(pb::Empty {}))
    }

    async fn create_snapshot(
        &self,
        req: Request<pb::CreateSnapshotRequest>,
    ) -> Result<Response<pb::SnapshotInfo>, Status> {
        self.auth.check(req.metadata(), Class::Admin, None)?;
        self.do_create_snapshot(req.into_inner())
            .await
            .map(Response::new)
    }

    async fn delete_snapshot(
        &self,
        req: Request<pb::SnapshotName>,
    ) -> Result<Response<pb::Empty>, Status> {
        self.auth.check(req.metadata(), Class::Admin, None)?;
        let r = req.into_inner();
        let id = self.snapshot_id(&r.volume, &r.name)?;
        self.c
            .propose(Command::DeleteSnapshot {
                volume: r.volume.clone(),
                id,
            })
            .await?;
        // The duties drop it from every chunk, then from the state; try once now.
        let _ = super::snap::finish_snapshot_delete(&self.c, &r.volume, id).await;
        Ok(Response::new(pb::Empty {}))
    }

    async fn clone_volume(
        &self,
        req: Request<pb::CloneVolumeRequest>,
    ) -> Result<Response<pb::VolumeInfo>, Status> {
        self.auth.check(req.metadata(), Class::Admin, None)?;
        let r = req.into_inner();
        let id = self.snapshot_id(&r.source_volume, &r.snapshot)?;
        self.c
            .propose_with(|m| {
                let v = m.volume(&r.source_volume).ok_or_else(|| {
                    Status::not_found(format!("volume `{}` does not exist", r.source_volume))
                })?;
                let n = v.chunks.len() as u64;
                Ok(Command::CloneVolume {
                    name: r.name.clone(),
                    source: r.source_volume.clone(),
                    snapshot: id,
                    chunks: self.place(m, n)?,
                })
            })
            .await?;
        let c = self.c.clone();
        let name = r.name.clone();
        Self::retry(&format!("clone `{name}`"), || {
            let c = c.clone();
            let name = name.clone();
            async move { super::duties::finish_creating(&c, &name).await }
        })
        .await?;
        self.c
            .volume_info(&r.name)
            .map(Response::new)
            .ok_or_else(|| Status::not_found(format!("volume `{}` was deleted meanwhile", r.name)))
    }

    type WatchVolumeStream = InfoStream;

    async fn watch_volume(
        &self,
        req: Request<pb::VolumeName>,
    ) -> Result<Response<Self::WatchVolumeStream>, Status> {
        self.auth.check(req.metadata(), Class::Read, None)?;
        let name = req.into_inner().name;
        let first = self
            .c
            .volume_info(&name)
            .ok_or_else(|| Status::not_found(format!("volume `{name}` does not exist")))?;
        let c = self.c.clone();
        let mut rx = c.subscribe();
        let s = async_stream_of(move |tx| async move {
            let mut last = (first.version, first.state.clone());
            if tx.send(Ok(first)).await.is_err() {
                return;
            }
            while rx.changed().await.is_ok() {
                let Some(v) = c.volume_info(&name) else {
                    return; // gone: the stream ends
                };
                if (v.version, v.state.clone()) != last {
                    last = (v.version, v.state.clone());
                    if tx.send(Ok(v)).await.is_err() {
                        return;
                    }
                }
            }
        });
        Ok(Response::new(s))
    }
}

impl ControlService {
    /// The id of snapshot `name` of `volume`, or NOT_FOUND naming what is missing.
    fn snapshot_id(&self, volume: &str, name: &str) -> Result<u64, Status> {
        self.c.with_meta(|m| {
            let v = m
                .volume(volume)
                .ok_or_else(|| Status::not_found(format!("volume `{volume}` does not exist")))?;
            v.snapshot_named(name).map(|s| s.id).ok_or_else(|| {
                Status::not_found(format!("volume `{volume}` has no snapshot `{name}`"))
            })
        })
    }

    /// Waits (up to CREATE_WAIT) for `step` to succeed, retrying it.
    async fn retry<F, Fut>(what: &str, mut step: F) -> Result<(), Status>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<(), Status>>,
    {
        let end = tokio::time::Instant::now() + CREATE_WAIT;
        loop {
            match step().await {
                Ok(()) => return Ok(()),
                Err(e) if tokio::time::Instant::now() >= end => {
                    return Err(Status::unavailable(format!(
                        "{what} is under way and not finished within {CREATE_WAIT:?} (the control plane goes on with it): {}",
                        e.message()
                    )))
                }
                Err(e) => {
                    tracing::debug!(error = %e, "{what}: retrying");
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                }
            }
        }
    }

    pub(super) async fn do_create_snapshot(
        &self,
        r: pb::CreateSnapshotRequest,
    ) -> Result<pb::SnapshotInfo, Status> {
        self.c
            .propose(Command::CreateSnapshot {
                volume: r.volume.clone(),
                name: r.name.clone(),
            })
            .await?;
        let id = self.snapshot_id(&r.volume, &r.name)?;
        let c = self.c.clone();
        let what = format!("snapshot `{}` of volume `{}`", r.name, r.volume);
        Self::retry(&what, || {
            let c = c.clone();
            let v = r.volume.clone();
            async move {
                let done = c.with_meta(|m| {
                    m.volume(&v)
                        .and_then(|x| x.snapshot(id))
                        .is_some_and(|s| s.state != SnapshotState::Creating)
                });
                if done {
                    return Ok(());
                }
                super::snap::finish_snapshot(&c, &v, id).await
            }
        })
        .await?;
        self.c
            .with_meta(|m| {
                m.volume(&r.volume)
                    .and_then(|v| v.snapshot(id))
                    .map(snapshot_info)
            })
            .ok_or_else(|| Status::not_found(format!("{what} was deleted meanwhile")))
    }
}

/// A stream fed by a task through a channel (the task ends when the receiver is gone).
fn async_stream_of<F, Fut>(f: F) -> InfoStream
where
    F: FnOnce(tokio::sync::mpsc::Sender<Result<pb::VolumeInfo, Status>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(f(tx));
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}
