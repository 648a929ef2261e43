//! The gRPC service (`proto/chorus.proto`) over a runtime [`Env`], and the Prometheus
//! metrics endpoint.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use chorus_client::pb;
use chorus_core::format::meta::AccessMode;
use chorus_core::ooo::group;
use chorus_core::ooo::parallel::BlockRange;
use chorus_core::ooo::replica::{Body, Declared, Mode, OooAppendError};
use chorus_core::replica::{AppendError, ChangeError, MirrorError, Role};
use chorus_runtime::env::{GroupMode, HostedGroup, OooHandle};

use crate::auth::{Authz, Class};
use chorus_runtime::{Env, Error, LogHandle, MembershipChange, Outcome};
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::chunk_io;
use crate::ooo::{check_record, GroupStateMachine};

/// Largest batch of records in one `Append` call.
pub const MAX_APPEND_BATCH: usize = 10_000;

mod follower;
mod reply;
mod stream;
pub(crate) use reply::*;

/// The service.
#[derive(Clone, Debug)]
pub struct Service {
    env: Env,
    /// Who may call what ([`crate::auth`]); open when no identity is configured.
    auth: std::sync::Arc<Authz>,
    /// The archive and the groups it covers (empty: all ordered groups), when `[archive]`
    /// is on: a trim of a covered group stays below what it holds.
    archive: Option<(crate::archive::Archive, Vec<u64>)>,
}

/// A group a request names, resolved once per request: each handler matches on its mode.
enum Served {
    /// An ordered group.
    Ordered(LogHandle),
    /// An out-of-order group and its state machine (the server's own type).
    OutOfOrder(OooHandle, Arc<GroupStateMachine>),
}

impl Served {
    /// The mode's name, as `Status` reports it.
    fn mode_name(&self) -> &'static str {
        match self {
            Served::Ordered(_) => "ordered",
            Served::OutOfOrder(h, _) => mode_name(h.mode()),
        }
    }
}

impl Service {
    /// Serves the groups of every mode `env` hosts.
    pub fn new(env: Env) -> Self {
        Self::with_auth(env, std::sync::Arc::new(Authz::default()))
    }

    /// Serves `env`, checking every call against `auth` ([`crate::auth`]).
    pub fn with_auth(env: Env, auth: std::sync::Arc<Authz>) -> Self {
        Self {
            env,
            auth,
            archive: None,
        }
    }

    /// With `archive` (and the groups it covers) guarding trims.
    pub fn with_archive(mut self, archive: Option<(crate::archive::Archive, Vec<u64>)>) -> Self {
        self.archive = archive;
        self
    }

    /// Group `id` of any mode: the one place a request's group is looked up, and where
    /// "no such group" and "not started here" are answered. A group whose damaged files
    /// kept it from starting is UNAVAILABLE by name, marked as nothing done (clients go
    /// on to another endpoint), not "no such group".
    fn served(&self, id: u64) -> Result<Served, Status> {
        match self.env.hosted(id) {
            Ok(HostedGroup::Ordered(log)) => Ok(Served::Ordered(log)),
            Ok(HostedGroup::OutOfOrder(h)) => {
                let sm = h.state::<GroupStateMachine>().ok_or_else(|| {
                    Status::internal(format!("group {id}: not the server's state machine"))
                })?;
                Ok(Served::OutOfOrder(h, sm))
            }
            Err(e @ Error::GroupDamaged { .. }) => match self.env.not_started(id) {
                Some(n) if n.mode != Some(GroupMode::Ordered) => Err(not_started(id, &n.reason)),
                _ => Err(status(e)),
            },
            Err(e) => Err(status(e)),
        }
    }

    /// The ordered group `id`; an out-of-order group is refused by name and mode
    /// (instead of "no such group"), saying what to use.
    fn ordered(&self, group: u64, op: &str) -> Result<LogHandle, Status> {
        match self.served(group)? {
            Served::Ordered(log) => Ok(log),
            Served::OutOfOrder(h, _) => Err(Status::unimplemented(format!(
                "group {group} is a {}-mode group: {op} is for ordered groups{}",
                mode_name(h.mode()),
                match op {
                    "Append" => " (use AppendOutOfOrder, `chorus append --blocks` or `--writes`)",
                    "Read" | "Tail" => {
                        " (read its log with ReadOutOfOrder or TailOutOfOrder, `chorus read` or `chorus tail`; its applied state with ReadBlocks or GetKeys, `chorus state`)"
                    }
                    _ => " (not built for out-of-order groups yet)",
                }
            ))),
        }
    }

    /// The out-of-order group `id` and its state machine; an ordered group is refused by
    /// name.
    fn out_of_order(
        &self,
        group: u64,
        op: &str,
    ) -> Result<(OooHandle, Arc<GroupStateMachine>), Status> {
        match self.served(group)? {
            Served::OutOfOrder(h, sm) => Ok((h, sm)),
            Served::Ordered(_) => Err(Status::unimplemented(format!(
                "group {group} is an ordered group: {op} is for out-of-order groups"
            ))),
        }
    }

    /// `ChangeMembership` on an out-of-order group: adds, removes or replaces a voter
    /// (joint consensus in the replica). A node to add must be a voter or one of the
    /// group's `replicas`; these groups have no learners.
    async fn change_ooo_membership(
        env: &Env,
        g: OooHandle,
        r: pb::ChangeMembershipRequest,
    ) -> Result<Response<pb::Empty>, Status> {
        use chorus_core::ooo::replica::{OooChangeError as E, OooMembershipChange as C};
        let group = r.group;
        let change = match pb::ChangeKind::try_from(r.kind) {
            Ok(pb::ChangeKind::AddVoter) => C::AddVoter(r.node),
            Ok(pb::ChangeKind::Remove) => C::Remove(r.node),
            Ok(pb::ChangeKind::Replace) => C::Replace {
                remove: r.old_node,
                add: r.node,
            },
            _ => {
                return Err(Status::invalid_argument(format!(
                    "group {group}: out-of-order groups have no learners (add, remove or replace a voter)"
                )))
            }
        };
        if let C::AddVoter(n) | C::Replace { add: n, .. } = change {
            if !r.node_addr.is_empty() {
                // A node the group was not created naming (a chunk re-replicated onto a
                // new chunk server): its address taught to this node's transport; the
                // driver hears and sends to it once the change puts it in the membership.
                env.set_peer_addr(n, r.node_addr.clone());
            } else if !g.spec().knows(n) {
                return Err(Status::invalid_argument(format!(
                    "group {group}: node {n} is not one of the group's voters or `replicas` (give its replication address, node_addr, to add a node the group was not created naming)"
                )));
            }
        } else if !r.node_addr.is_empty() {
            return Err(Status::invalid_argument(format!(
                "group {group}: node_addr names a joining node's address; a removal has none"
            )));
        }
        let force = r.force;
        tokio::task::spawn_blocking(move || {
            match g.node().change_membership_checked(change, force) {
                None => Err(Status::unavailable(format!("group {group} stopped"))),
                Some(Ok(())) => Ok(Response::new(pb::Empty {})),
                Some(Err(e @ E::NotLeader { leader })) => {
                    let mut s = Status::failed_precondition(format!("group {group}: {e}"));
                    if let Some(v) = leader.and_then(|l| l.to_string().parse().ok()) {
                        s.metadata_mut().insert("chorus-leader", v);
                    }
                    Err(s)
                }
                Some(Err(e @ E::InProgress { .. })) => {
                    Err(Status::failed_precondition(format!("group {group}: {e}")))
                }
                Some(Err(e @ E::Invalid { .. })) => {
                    Err(Status::invalid_argument(format!("group {group}: {e}")))
                }
                Some(Err(e @ E::Unsafe(_))) => {
                    // Marked refused, as the ordered groups' strict check is: a client
                    // does not take it for "not the leader" and try elsewhere.
                    let mut s = Status::failed_precondition(format!("group {group}: {e}"));
                    s.metadata_mut()
                        .insert(chorus_client::REFUSED_KEY, "strict".parse().expect("ASCII"));
                    Err(s)
                }
            }
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))?
    }
}

#[tonic::async_trait]
impl pb::chorus_server::Chorus for Service {
    async fn append(
        &self,
        req: Request<pb::AppendRequest>,
    ) -> Result<Response<pb::AppendResponse>, Status> {
        self.auth
            .check(req.metadata(), Class::Append, Some(req.get_ref().group))?;
        let req = req.into_inner();
        // Refused on every node alike (a follower would otherwise answer an empty batch
        // with an empty success before it looked at its role).
        if req.records.is_empty() {
            return Err(Status::invalid_argument(format!(
                "group {}: an append needs at least one record",
                req.group
            )));
        }
        if req.records.len() > MAX_APPEND_BATCH {
            return Err(Status::invalid_argument(format!(
                "{} records in one append; at most {MAX_APPEND_BATCH}",
                req.records.len()
            )));
        }
        let log = self.ordered(req.group, "Append")?;
        let ref_csn = req.ref_csn;
        write_batch(&req.records, |r| log.append(r, ref_csn)).await
    }

    type AppendStreamStream = Follow<pb::AppendStreamResponse>;

    async fn append_stream(
        &self,
        req: Request<tonic::Streaming<pb::AppendStreamRequest>>,
    ) -> Result<Response<Self::AppendStreamStream>, Status> {
        stream::serve(self, req)
    }

    async fn read(
        &self,
        req: Request<pb::ReadRequest>,
    ) -> Result<Response<pb::ReadResponse>, Status> {
        self.auth
            .check(req.metadata(), Class::Read, Some(req.get_ref().group))?;
        let r = req.into_inner();
        let log = self.ordered(r.group, "Read")?;
        // A follower read (PALF section 4.2): nothing is read before the replica holds
        // every record up to min_csn.
        follower::wait_min_csn(&log, r.group, r.min_csn, r.wait_ms).await?;
        drop(log);
        let env = self.env.clone();
        let resp = tokio::task::spawn_blocking(move || {
            read_batch(&env, r.group, r.from_lsn, r.max_records)
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))??;
        Ok(Response::new(resp))
    }

    type TailStream = Follow<pb::ReadResponse>;

    async fn tail(
        &self,
        req: Request<pb::TailRequest>,
    ) -> Result<Response<Self::TailStream>, Status> {
        self.auth
            .check(req.metadata(), Class::Read, Some(req.get_ref().group))?;
        let r = req.into_inner();
        let log = self.ordered(r.group, "Tail")?;
        let env = self.env.clone();
        let tail = log.subscribe_tail();
        // The first read waits for min_csn, as Read does (on the stream: the call has
        // answered, so the client's call timeout does not bound the wait).
        let mut first = (r.min_csn > 0).then_some(log);
        Ok(Response::new(follow(
            r.group,
            r.from_lsn,
            tail,
            move |from| {
                let env = env.clone();
                let first = first.take();
                async move {
                    if let Some(log) = first {
                        follower::wait_min_csn(&log, r.group, r.min_csn, r.wait_ms).await?;
                    }
                    let b = tokio::task::spawn_blocking(move || {
                        read_batch(&env, r.group, from, r.max_records)
                    })
                    .await
                    .map_err(|e| Status::internal(e.to_string()))??;
                    let next = b.next_lsn;
                    Ok((!b.records.is_empty()).then_some((b, next)))
                }
            },
        )))
    }

    type WatchRoleStream = Follow<pb::RoleEvent>;

    async fn watch_role(
        &self,
        req: Request<pb::WatchRoleRequest>,
    ) -> Result<Response<Self::WatchRoleStream>, Status> {
        self.auth
            .check(req.metadata(), Class::Read, Some(req.get_ref().group))?;
        let group = req.into_inner().group;
        // Looked up here, so that a group not hosted is the call's answer.
        let first = self.served(group)?;
        Ok(Response::new(follower::watch_role(
            self.env.clone(),
            group,
            first,
        )))
    }

    async fn locate(
        &self,
        req: Request<pb::LocateRequest>,
    ) -> Result<Response<pb::LocateResponse>, Status> {
        self.auth
            .check(req.metadata(), Class::Read, Some(req.get_ref().group))?;
        let r = req.into_inner();
        let log = self.ordered(r.group, "Locate")?;
        let found = tokio::task::spawn_blocking(move || log.locate(r.csn))
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map_err(status)?;
        Ok(Response::new(pb::LocateResponse {
            found: found.is_some(),
            lsn: found.unwrap_or(0),
        }))
    }

    async fn status(
        &self,
        req: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        self.auth.check(
            req.metadata(),
            Class::Read,
            match req.get_ref().group {
                0 => None,
                g => Some(g),
            },
        )?;
        let g = req.into_inner().group;
        let ids: Vec<u64> = if g == 0 {
            self.env.list_groups().into_iter().map(|l| l.id).collect()
        } else {
            vec![g]
        };
        let node = self.env.node();
        let mut groups = Vec::new();
        for id in ids {
            if let Some(n) = self.env.not_started(id) {
                let what = match n.mode {
                    Some(GroupMode::Ordered) => "its files are damaged",
                    _ => "its replica is damaged",
                };
                groups.push(pb::GroupStatus {
                    group: id,
                    node,
                    voters: n
                        .spec
                        .as_ref()
                        .map(|s| s.voters.clone())
                        .unwrap_or_default(),
                    mode: n.mode_label().into(),
                    stopped: format!("not started, {what}: {}", n.reason),
                    ..Default::default()
                });
                continue;
            }
            let served = match self.served(id) {
                Ok(s) => s,
                // Listed a moment ago and gone since (deleted, or between the stop and
                // the start of a restart): not an error of the listing.
                Err(_) if g == 0 => continue,
                Err(e) => return Err(e),
            };
            let mode = served.mode_name();
            match served {
                Served::Ordered(log) => groups.push(group_status(log.status())),
                Served::OutOfOrder(h, _) => {
                    let voters = h.spec().voters.clone();
                    let why = h.node().stopped_reason();
                    let (s, m) = tokio::task::spawn_blocking(move || {
                        (h.node().status(), h.node().membership())
                    })
                    .await
                    .map_err(|e| Status::internal(e.to_string()))?;
                    groups.push(match s {
                        Some(s) => pb::GroupStatus {
                            voters: m.as_ref().map_or(voters, |m| m.voters.clone()),
                            prev_voters: m
                                .as_ref()
                                .and_then(|m| m.prev.clone())
                                .unwrap_or_default(),
                            config_proposal_id: m.as_ref().map_or(0, |m| m.version.0),
                            config_seq: m.as_ref().map_or(0, |m| m.version.1),
                            ..ooo_group_status(id, node, s)
                        },
                        None => pb::GroupStatus {
                            group: id,
                            node,
                            mode: mode.into(),
                            stopped: match why {
                                Some(why) => format!("the out-of-order replica stopped: {why}"),
                                None => "the out-of-order replica stopped".into(),
                            },
                            ..Default::default()
                        },
                    });
                }
            }
        }
        let disk = self.env.disk_space();
        Ok(Response::new(pb::StatusResponse {
            node,
            replication_addr: self.env.replication_addr().to_string(),
            groups,
            disk_free_bytes: disk.free_bytes().unwrap_or(0),
            min_free_bytes: disk.min_free(),
            disk_low: disk.is_low(),
        }))
    }

    async fn create_group(
        &self,
        req: Request<pb::CreateGroupRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        self.auth
            .check(req.metadata(), Class::Admin, Some(req.get_ref().group))?;
        let r = req.into_inner();
        if r.group == 0 {
            return Err(Status::invalid_argument("group id 0 is reserved"));
        }
        for (node, addr) in &r.peer_addrs {
            if *node != self.env.node() {
                self.env.set_peer_addr(*node, addr.clone());
            }
        }
        if !matches!(r.mode.as_str(), "" | "ordered") {
            // A group of another kind or spec is an error, not "already done".
            if self.env.group(r.group).is_ok() {
                return Err(Status::failed_precondition(format!(
                    "group {} already exists as an ordered group",
                    r.group
                )));
            }
            let mut g = crate::config::GroupSpec::ordered(r.group, r.voters, r.learners);
            g.mode = r.mode;
            g.look_behind = r.look_behind;
            g.commit_order = r.commit_order;
            g.access_mode = r.access_mode;
            g.replicas = r.replicas;
            g.chunk_bytes = r.chunk_bytes;
            g.block_bytes = r.block_bytes;
            let spec = crate::ooo::parse_spec(&g, self.env.node())
                .map_err(|e| Status::invalid_argument(e.to_string()))?
                .ok_or_else(|| Status::invalid_argument("not an out-of-order mode"))?;
            let env = self.env.clone();
            return match tokio::task::spawn_blocking(move || env.create_ooo_group(spec))
                .await
                .map_err(|e| Status::internal(e.to_string()))?
            {
                Ok(_) => Ok(Response::new(pb::Empty {})),
                Err(Error::GroupExists(id)) => Err(Status::failed_precondition(format!(
                    "group {id} already exists (with a different spec)"
                ))),
                Err(e) => Err(status(e)),
            };
        }
        if self.env.ooo_group(r.group).is_ok() {
            return Err(Status::failed_precondition(format!(
                "group {} already exists as an out-of-order group",
                r.group
            )));
        }
        if r.voters.is_empty() && r.learners.is_empty() {
            // A joining replica: it learns its membership from the leader.
            tracing::info!(group = r.group, "creating a joining replica");
        }
        let mode =
            crate::config::parse_access_mode(&r.access_mode).map_err(Status::invalid_argument)?;
        let env = self.env.clone();
        tokio::task::spawn_blocking(move || {
            env.create_group_in_mode(r.group, &r.voters, &r.learners, mode)
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))?
        .map_err(status)?;
        Ok(Response::new(pb::Empty {}))
    }

    async fn delete_group(
        &self,
        req: Request<pb::DeleteGroupRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        self.auth
            .check(req.metadata(), Class::Admin, Some(req.get_ref().group))?;
        let r = req.into_inner();
        let (group, me) = (r.group, self.env.node());
        let voter = |voters: &[u64]| -> Result<(), Status> {
            if voters.contains(&me) && !r.force {
                return Err(Status::failed_precondition(format!(
                    "group {group}: this node ({me}) is one of its voters {voters:?}; remove it \
                     from the membership first (or pass force: the group loses a replica)"
                )));
            }
            Ok(())
        };
        if let Some(n) = self.env.not_started(group) {
            match &n.spec {
                // An out-of-order group whose replica did not start: its saved membership
                // is not trusted, so the voters it was created with decide whether force
                // is needed.
                Some(spec) => voter(&spec.voters)?,
                // Its membership here is unknown (its meta record or spec may be what is
                // damaged), so deleting it takes force.
                None if !r.force => {
                    return Err(Status::failed_precondition(format!(
                        "group {group}: its files on this node are damaged, so whether this node \
                         ({me}) is still one of its voters is unknown here; remove it from the \
                         membership at the leader, then pass force"
                    )))
                }
                None => {}
            }
        } else {
            match self.served(group)? {
                Served::Ordered(log) => voter(&log.status().membership.voters)?,
                Served::OutOfOrder(h, _) => {
                    // The handle goes with the closure: the delete waits for every holder.
                    let m = tokio::task::spawn_blocking(move || h.node().membership())
                        .await
                        .map_err(|e| Status::internal(e.to_string()))?;
                    if let Some(m) = m {
                        voter(&m.voters)?;
                        voter(m.prev.as_deref().unwrap_or_default())?;
                    }
                }
            }
        }
        let env = self.env.clone();
        tokio::task::spawn_blocking(move || env.remove_group(group))
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map_err(status)?;
        Ok(Response::new(pb::Empty {}))
    }

    async fn restart_group(
        &self,
        req: Request<pb::RestartGroupRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        self.auth
            .check(req.metadata(), Class::Admin, Some(req.get_ref().group))?;
        let group = req.into_inner().group;
        let env = self.env.clone();
        tokio::task::spawn_blocking(move || env.restart_group(group).map(drop))
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map_err(|e| match e {
                // Not started again: why, not "try elsewhere" (the trailer that sends
                // clients on would hide it).
                Error::GroupDamaged { .. } | Error::NotRunning { .. } => {
                    Status::unavailable(e.to_string())
                }
                e => status(e),
            })?;
        Ok(Response::new(pb::Empty {}))
    }

    async fn change_membership(
        &self,
        req: Request<pb::ChangeMembershipRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        self.auth
            .check(req.metadata(), Class::Admin, Some(req.get_ref().group))?;
        let r = req.into_inner();
        let change = match pb::ChangeKind::try_from(r.kind) {
            Ok(pb::ChangeKind::AddLearner) => MembershipChange::AddLearner(r.node),
            Ok(pb::ChangeKind::AddVoter) => MembershipChange::AddVoter(r.node),
            Ok(pb::ChangeKind::Promote) => MembershipChange::Promote(r.node),
            Ok(pb::ChangeKind::Remove) => MembershipChange::Remove(r.node),
            Ok(pb::ChangeKind::Replace) => MembershipChange::Replace {
                old: r.old_node,
                new: r.node,
            },
            _ => {
                return Err(Status::invalid_argument(format!(
                    "unknown membership change kind {}",
                    r.kind
                )))
            }
        };
        if r.node == 0 {
            return Err(Status::invalid_argument("node id 0 is not valid"));
        }
        let log = match self.served(r.group)? {
            Served::OutOfOrder(h, _) => return Self::change_ooo_membership(&self.env, h, r).await,
            Served::Ordered(log) => log,
        };
        if !r.node_addr.is_empty() {
            self.env.set_peer_addr(r.node, r.node_addr.clone());
        }
        log.change_membership_checked(change, r.force)
            .map_err(status)?;
        Ok(Response::new(pb::Empty {}))
    }

    async fn transfer_leader(
        &self,
        req: Request<pb::TransferLeaderRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        self.auth
            .check(req.metadata(), Class::Admin, Some(req.get_ref().group))?;
        let r = req.into_inner();
        let log = match self.served(r.group)? {
            Served::Ordered(log) => log,
            Served::OutOfOrder(g, _) => {
                return tokio::task::spawn_blocking(move || {
                    use chorus_core::ooo::replica::OooTransferError as E;
                    match g.node().transfer_leader_checked(r.to, r.force) {
                        None => Err(Status::unavailable(format!("group {} stopped", r.group))),
                        Some(Ok(())) => Ok(Response::new(pb::Empty {})),
                        Some(Err(e @ E::NotLeader { leader })) => {
                            let mut s =
                                Status::failed_precondition(format!("group {}: {e}", r.group));
                            if let Some(v) = leader.and_then(|l| l.to_string().parse().ok()) {
                                s.metadata_mut().insert("chorus-leader", v);
                            }
                            Err(s)
                        }
                        Some(Err(e @ E::NotVoter { .. })) => {
                            Err(Status::invalid_argument(format!("group {}: {e}", r.group)))
                        }
                        Some(Err(e @ (E::NotHeard { .. } | E::Behind { .. }))) => {
                            // Refused, not "not the leader": a client does not try elsewhere.
                            let mut s =
                                Status::failed_precondition(format!("group {}: {e}", r.group));
                            s.metadata_mut().insert(
                                chorus_client::REFUSED_KEY,
                                "strict".parse().expect("ASCII"),
                            );
                            Err(s)
                        }
                    }
                })
                .await
                .map_err(|e| Status::internal(e.to_string()))?;
            }
        };
        log.transfer_leader_checked(r.to, r.force).map_err(status)?;
        Ok(Response::new(pb::Empty {}))
    }

    async fn set_priority(
        &self,
        req: Request<pb::SetPriorityRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        self.auth
            .check(req.metadata(), Class::Admin, Some(req.get_ref().group))?;
        let r = req.into_inner();
        let log = self.ordered(r.group, "SetPriority")?;
        log.set_priority(r.priority);
        Ok(Response::new(pb::Empty {}))
    }

    async fn trim(&self, req: Request<pb::TrimRequest>) -> Result<Response<pb::Empty>, Status> {
        self.auth
            .check(req.metadata(), Class::Admin, Some(req.get_ref().group))?;
        let r = req.into_inner();
        match self.served(r.group)? {
            Served::Ordered(log) => {
                // Nothing not yet archived is deleted (PALF section 5.2).
                if let Some((a, groups)) = &self.archive {
                    if groups.is_empty() || groups.contains(&r.group) {
                        let start = log.status().start_lsn;
                        a.check_trim(r.group, start, r.lsn)
                            .await
                            .map_err(Status::failed_precondition)?;
                    }
                }
                tokio::task::spawn_blocking(move || log.trim(r.lsn))
                    .await
                    .map_err(|e| Status::internal(e.to_string()))?
                    .map_err(status)?;
            }
            Served::OutOfOrder(h, _) => {
                let node = h.node().clone();
                let group = r.group;
                match tokio::task::spawn_blocking(move || node.compact(r.lsn))
                    .await
                    .map_err(|e| Status::internal(e.to_string()))?
                {
                    Some(_) => {}
                    None => {
                        return Err(Status::unavailable(format!(
                            "group {group}: stopped, or its checkpoint did not finish within 30 s"
                        )))
                    }
                }
            }
        }
        Ok(Response::new(pb::Empty {}))
    }

    async fn mirror(
        &self,
        req: Request<pb::MirrorRequest>,
    ) -> Result<Response<pb::AppendResponse>, Status> {
        self.auth
            .check(req.metadata(), Class::Append, Some(req.get_ref().group))?;
        let req = req.into_inner();
        if req.groups.len() > MAX_APPEND_BATCH {
            return Err(Status::invalid_argument(format!(
                "{} groups in one mirror request; at most {MAX_APPEND_BATCH}",
                req.groups.len()
            )));
        }
        let log = self.ordered(req.group, "Mirror")?;
        write_batch(&req.groups, |g| log.mirror(g)).await
    }

    async fn set_access_mode(
        &self,
        req: Request<pb::SetAccessModeRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        self.auth
            .check(req.metadata(), Class::Admin, Some(req.get_ref().group))?;
        let r = req.into_inner();
        let log = self.ordered(r.group, "SetAccessMode")?;
        let mode = AccessMode::from_name(&r.mode).ok_or_else(|| {
            Status::invalid_argument(format!(
                "access mode `{}` is not one of append, raw-write",
                r.mode
            ))
        })?;
        log.change_access_mode(mode).map_err(status)?;
        Ok(Response::new(pb::Empty {}))
    }

    async fn read_groups(
        &self,
        req: Request<pb::ReadGroupsRequest>,
    ) -> Result<Response<pb::ReadGroupsResponse>, Status> {
        self.auth
            .check(req.metadata(), Class::Read, Some(req.get_ref().group))?;
        let r = req.into_inner();
        let log = self.ordered(r.group, "ReadGroups")?;
        let max = if r.max_bytes == 0 {
            1 << 20
        } else {
            (r.max_bytes as usize).min(16 << 20)
        };
        tokio::task::spawn_blocking(move || {
            let committed = log.committed_end();
            let (groups, next) = log.read_groups(r.from_lsn, max)?;
            Ok::<_, Error>(pb::ReadGroupsResponse {
                groups,
                next_lsn: next,
                committed_lsn: committed,
            })
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))?
        .map(Response::new)
        .map_err(status)
    }

    async fn append_out_of_order(
        &self,
        req: Request<pb::AppendOutOfOrderRequest>,
    ) -> Result<Response<pb::AppendOutOfOrderResponse>, Status> {
        self.auth
            .check(req.metadata(), Class::Append, Some(req.get_ref().group))?;
        let req = req.into_inner();
        // Refused on every node alike (a follower would otherwise answer an empty batch
        // with an empty success before it looked at its role).
        if req.records.is_empty() {
            return Err(Status::invalid_argument(format!(
                "group {}: an append needs at least one record",
                req.group
            )));
        }
        if req.records.len() > MAX_APPEND_BATCH {
            return Err(Status::invalid_argument(format!(
                "{} records in one append; at most {MAX_APPEND_BATCH}",
                req.records.len()
            )));
        }
        let (g, sm) = self.out_of_order(req.group, "AppendOutOfOrder")?;
        let sectors = sm.geometry().map_or(0, |g| g.sectors());
        // Every record is checked before any is appended, so a bad one refuses the whole
        // request and none of it has an outcome.
        let mut checked = Vec::with_capacity(req.records.len());
        for (i, r) in req.records.into_iter().enumerate() {
            let d = declared(g.mode(), &r)
                .and_then(|d| check_record(g.mode(), sectors, &d, r.data.len()).map(|()| d))
                .map_err(|e| Status::invalid_argument(format!("record {i}: {e}")))?;
            checked.push((d, r.data));
        }
        // A write issued once the writer knew of a snapshot is appended after the chunk's
        // snapshot barrier (PolarFS section 7.2, the snapshot tag).
        chunk_io::before_tagged_write(&g, &sm, req.group, req.snapshot).await?;
        let pending: Vec<_> = checked
            .into_iter()
            .map(|(d, data)| g.node().submit(d, data))
            .collect();
        let mut results = Vec::with_capacity(pending.len());
        for p in pending {
            results.push(p.await);
        }
        ooo_batch_response(req.group, results).map(Response::new)
    }

    async fn read_blocks(
        &self,
        req: Request<pb::ReadBlocksRequest>,
    ) -> Result<Response<pb::ReadBlocksResponse>, Status> {
        self.auth
            .check(req.metadata(), Class::Read, Some(req.get_ref().group))?;
        let r = req.into_inner();
        let (g, sm) = self.out_of_order(r.group, "ReadBlocks")?;
        chunk_io::read_blocks(g, sm, r).await.map(Response::new)
    }

    async fn chunk_snapshot(
        &self,
        req: Request<pb::ChunkSnapshotRequest>,
    ) -> Result<Response<pb::ChunkSnapshotResponse>, Status> {
        self.auth
            .check(req.metadata(), Class::Admin, Some(req.get_ref().group))?;
        let r = req.into_inner();
        let (g, sm) = self.out_of_order(r.group, "ChunkSnapshot")?;
        chunk_io::chunk_snapshot(g, sm, r).await.map(Response::new)
    }

    async fn chunk_scrub(
        &self,
        req: Request<pb::ChunkScrubRequest>,
    ) -> Result<Response<pb::ChunkScrubResponse>, Status> {
        self.auth
            .check(req.metadata(), Class::Admin, Some(req.get_ref().group))?;
        let r = req.into_inner();
        let (g, sm) = self.out_of_order(r.group, "ChunkScrub")?;
        chunk_io::chunk_scrub(g, sm, r).await.map(Response::new)
    }

    async fn read_out_of_order(
        &self,
        req: Request<pb::ReadOutOfOrderRequest>,
    ) -> Result<Response<pb::ReadOutOfOrderResponse>, Status> {
        self.auth
            .check(req.metadata(), Class::Read, Some(req.get_ref().group))?;
        let r = req.into_inner();
        let (g, _) = self.out_of_order(r.group, "ReadOutOfOrder")?;
        read_ooo_batch(g, r.group, r.from_seq, r.max_records)
            .await
            .map(Response::new)
    }

    type TailOutOfOrderStream = Follow<pb::ReadOutOfOrderResponse>;

    async fn tail_out_of_order(
        &self,
        req: Request<pb::TailOutOfOrderRequest>,
    ) -> Result<Response<Self::TailOutOfOrderStream>, Status> {
        self.auth
            .check(req.metadata(), Class::Read, Some(req.get_ref().group))?;
        let r = req.into_inner();
        let head = self
            .out_of_order(r.group, "TailOutOfOrder")?
            .0
            .node()
            .subscribe_committed();
        let env = self.env.clone();
        Ok(Response::new(follow(
            r.group,
            r.from_seq,
            head,
            move |from| {
                // The group is looked up again for every read and not held while the stream
                // waits, so DeleteGroup is not kept waiting by a follower of it.
                let g = env.ooo_group(r.group).ok();
                async move {
                    let g = g.ok_or_else(|| {
                        Status::unavailable(format!("group {} is no longer hosted here", r.group))
                    })?;
                    let b = read_ooo_batch(g, r.group, from, r.max_records).await?;
                    let next = b.next_seq;
                    Ok((!b.entries.is_empty()).then_some((b, next)))
                }
            },
        )))
    }

    async fn get_keys(
        &self,
        req: Request<pb::GetKeysRequest>,
    ) -> Result<Response<pb::GetKeysResponse>, Status> {
        self.auth
            .check(req.metadata(), Class::Read, Some(req.get_ref().group))?;
        let r = req.into_inner();
        if r.keys.len() > 100_000 {
            return Err(Status::invalid_argument(format!(
                "{} keys in one call; at most 100000",
                r.keys.len()
            )));
        }
        let (g, sm) = self.out_of_order(r.group, "GetKeys")?;
        tokio::task::spawn_blocking(move || {
            let applied = g.node().status().map(|s| s.applied_head).unwrap_or(0);
            let vals = sm
                .get_keys(&r.keys)
                .map_err(|e| Status::invalid_argument(format!("group {}: {e}", r.group)))?;
            Ok(Response::new(pb::GetKeysResponse {
                values: r
                    .keys
                    .iter()
                    .zip(vals)
                    .map(|(k, v)| pb::KeyValue {
                        key: *k,
                        found: v.is_some(),
                        value: v.unwrap_or_default(),
                    })
                    .collect(),
                applied_seq: applied,
            }))
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))?
    }
}
