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

/// Record bytes after which a `ReadOutOfOrder` response stops (well inside gRPC's 4 MiB
/// default message bound with the metadata).
const READ_OOO_BYTES: usize = 2 << 20;

fn pb_ranges(rs: &[BlockRange]) -> Vec<pb::BlockRange> {
    rs.iter()
        .map(|r| pb::BlockRange {
            start: r.start,
            count: r.end - r.start,
        })
        .collect()
}

/// An out-of-order entry as `ReadOutOfOrder` returns it, its group split into records; an
/// entry whose data is not a group is an error naming its slot.
fn ooo_entry(e: chorus_core::ooo::replica::Entry) -> Result<pb::OutOfOrderEntry, String> {
    let records = group::records(&e)
        .map_err(|err| format!("slot {}: {err}", e.seq))?
        .into_iter()
        .map(|r| match r.declared {
            Declared::Blocks(rs) => pb::OutOfOrderRecord {
                data: r.data,
                blocks: pb_ranges(&rs),
                ..Default::default()
            },
            Declared::Txn {
                read_set,
                write_set,
            } => pb::OutOfOrderRecord {
                data: r.data,
                read_set,
                write_set,
                ..Default::default()
            },
        })
        .collect();
    let mut out = pb::OutOfOrderEntry {
        seq: e.seq,
        term: e.term,
        null: e.is_null(),
        records,
        ..Default::default()
    };
    match e.body {
        Body::Null => {}
        Body::Parallel { ranges, after, .. } => {
            out.blocks = pb_ranges(&ranges);
            out.raw = after;
        }
        Body::Dependent {
            deps, write_set, ..
        } => {
            out.write_set = write_set;
            out.raw = deps.raw;
            out.waw = deps.waw;
        }
    }
    Ok(out)
}

/// The service.
#[derive(Clone, Debug)]
pub struct Service {
    env: Env,
    /// Who may call what ([`crate::auth`]); open when no identity is configured.
    auth: std::sync::Arc<Authz>,
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
        Self { env, auth }
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

/// UNAVAILABLE by name for a group whose damaged replica did not start here, marked
/// [`chorus_client::NOT_STARTED_KEY`]: refused before anything was done, so not an
/// indeterminate result.
fn not_started(group: u64, why: &str) -> Status {
    nothing_done(
        Status::unavailable(format!(
            "group {group} not started on this node: its replica is damaged: {why}"
        )),
        group,
    )
}

/// Marks a refusal of `group`'s request that did nothing with it
/// ([`chorus_client::NOT_STARTED_KEY`]), so that a client may send even a non-idempotent
/// request to another node.
fn nothing_done(mut s: Status, group: u64) -> Status {
    s.metadata_mut()
        .insert(chorus_client::NOT_STARTED_KEY, group.into());
    s
}

fn mode_name(m: Mode) -> &'static str {
    match m {
        Mode::Parallel { .. } => "parallel",
        Mode::Dependent => "dependent",
    }
}

/// Maps an out-of-order append error of `group` to a gRPC status.
pub(crate) fn ooo_status(group: u64, e: chorus_runtime::ooo::OooNodeError) -> Status {
    use chorus_runtime::ooo::OooNodeError as E;
    let msg = e.to_string();
    match &e {
        E::Refused(OooAppendError::NotLeader { leader }) => {
            let mut s = Status::failed_precondition(msg);
            if let Some(l) = leader {
                if let Ok(v) = l.to_string().parse() {
                    s.metadata_mut().insert("chorus-leader", v);
                }
            }
            s
        }
        E::Refused(OooAppendError::WrongMode { .. }) => Status::invalid_argument(msg),
        // As the ordered mode's AppendError::Transferring: retry at the new leader.
        E::Refused(OooAppendError::Transferring { .. }) => Status::failed_precondition(msg),
        // A leader a membership change removes: retry at the next leader.
        E::Refused(OooAppendError::Leaving { .. }) => Status::failed_precondition(msg),
        E::Refused(_) => Status::resource_exhausted(msg),
        E::Stopped => Status::unavailable(msg),
        // Stopped before the append reached it: not taken, another node may be asked.
        E::NotRunning => nothing_done(Status::unavailable(msg), group),
        // The leader's disk is low: nothing appended; retrying elsewhere cannot help
        // (only the leader appends), retrying later can.
        E::DiskLow { .. } => Status::resource_exhausted(msg),
        // The append may have committed or failed: the caller must look (UNKNOWN).
        E::Unknown { .. } => Status::unknown(msg),
        E::Storage(_) | E::Io(_) => Status::internal(msg),
        E::Exists(_) => Status::failed_precondition(msg),
        E::Shutdown => nothing_done(Status::unavailable(msg), group),
        // The group's queue is full: nothing appended; the caller may retry.
        E::Busy => nothing_done(Status::resource_exhausted(msg), group),
    }
}

/// An outcome as the API spells it.
fn pb_outcome(o: Outcome) -> i32 {
    let o = match o {
        Outcome::Committed => pb::Outcome::Committed,
        Outcome::Failed => pb::Outcome::Failed,
    };
    o as i32
}

/// The answer to an ordered append, from each appended record's (LSN, CSN, result) in
/// request order: a record whose outcome this replica cannot know (it stopped) is
/// reported `unknown` beside the results known before it, so a client does not append
/// the committed ones again; the call fails whole only when no outcome is known.
/// Writes `items` in order with `write` (an append or a mirror write) and answers once
/// each taken one has its result. A refusal of the first is the answer; a later refusal
/// cuts the batch short there, so the caller knows exactly which items have an outcome.
async fn write_batch(
    items: &[Vec<u8>],
    write: impl Fn(&[u8]) -> Result<chorus_runtime::Appended, Error>,
) -> Result<Response<pb::AppendResponse>, Status> {
    let mut pending = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        match write(item) {
            Ok(a) => pending.push(a),
            Err(e) if i == 0 => return Err(status(e)),
            Err(e) => {
                tracing::debug!(error = %e, accepted = i, "write batch cut short");
                break;
            }
        }
    }
    let mut results = Vec::with_capacity(pending.len());
    for a in pending {
        let (lsn, csn) = (a.lsn, a.csn);
        results.push((lsn, csn, a.result.await));
    }
    append_response(results).map(Response::new)
}

fn append_response(
    results: Vec<(u64, u64, Result<chorus_runtime::AppendResult, Error>)>,
) -> Result<pb::AppendResponse, Status> {
    if results.iter().all(|r| r.2.is_err()) {
        if let Some((_, _, Err(e))) = results.into_iter().next() {
            return Err(status(e));
        }
        return Ok(pb::AppendResponse::default());
    }
    let results = results
        .into_iter()
        .map(|(lsn, csn, r)| match r {
            Ok(r) => pb::AppendResult {
                lsn: r.lsn,
                csn: r.csn,
                outcome: pb_outcome(r.outcome),
                ..Default::default()
            },
            Err(e) => pb::AppendResult {
                lsn,
                csn,
                unknown: e.to_string(),
                ..Default::default()
            },
        })
        .collect();
    Ok(pb::AppendResponse { results })
}

/// The answer to an out-of-order append of several records, from each record's result
/// in request order (see `AppendOutOfOrderResponse` in `proto/chorus.proto`): every record
/// is reported — the records of a request are independent appends, so one refused (a
/// full window, a leader stepping down) says nothing of those after it, which may have
/// been packed first and committed. The call fails whole only when no record has a
/// result and all failed alike, so that a client retrying it elsewhere cannot append a
/// record twice unknowingly: all refused (nothing was appended), or none refused and
/// none known.
fn ooo_batch_response(
    group: u64,
    results: Vec<Result<chorus_runtime::ooo::OooResult, chorus_runtime::ooo::OooNodeError>>,
) -> Result<pb::AppendOutOfOrderResponse, Status> {
    use chorus_runtime::ooo::OooNodeError as E;
    // Refused: never appended (a node already stopped did not take it either).
    let refused =
        |r: &Result<_, E>| matches!(r, Err(E::Refused(_) | E::NotRunning | E::DiskLow { .. }));
    let all_refused = results.iter().all(refused);
    let none_known = results.iter().all(|r| r.is_err() && !refused(r));
    if !results.is_empty() && (all_refused || none_known) {
        let first = results.into_iter().next().expect("not empty");
        return Err(ooo_status(group, first.expect_err("no result")));
    }
    let results = results
        .into_iter()
        .map(|r| match r {
            Ok(r) => pb::OutOfOrderResult {
                seq: r.seq,
                index: r.index,
                outcome: pb_outcome(r.outcome),
                ..Default::default()
            },
            Err(e @ (E::Refused(_) | E::NotRunning | E::DiskLow { .. })) => pb::OutOfOrderResult {
                refused: e.to_string(),
                ..Default::default()
            },
            Err(e) => pb::OutOfOrderResult {
                unknown: e.to_string(),
                ..Default::default()
            },
        })
        .collect();
    Ok(pb::AppendOutOfOrderResponse { results })
}

/// Maps a runtime error to a gRPC status (see the codes in `proto/chorus.proto`).
pub fn status(e: Error) -> Status {
    let msg = e.to_string();
    match &e {
        Error::NoSuchGroup(_) | Error::NotARecord { .. } => Status::not_found(msg),
        Error::GroupExists(_) => Status::already_exists(msg),
        Error::GroupRunning(_) => Status::failed_precondition(msg),
        // Still held by requests: try again.
        Error::GroupBusy(_) => Status::unavailable(msg),
        Error::Spec { .. } => Status::invalid_argument(msg),
        Error::GroupDamaged { group, .. } | Error::StateMachineDamaged { group, .. } => {
            nothing_done(Status::unavailable(msg), *group)
        }
        Error::NotCommitted { .. } | Error::Trimmed { .. } => Status::out_of_range(msg),
        Error::Append { source, group } => match source {
            AppendError::NotLeader { leader } => not_leader(msg, *leader),
            AppendError::Transferring => Status::failed_precondition(msg),
            AppendError::WindowFull => Status::resource_exhausted(msg),
            AppendError::TooLarge { .. } => Status::invalid_argument(msg),
            // A halted replica refuses before writing or sending anything: another node
            // may take the append.
            AppendError::Halted(_) => nothing_done(Status::unavailable(msg), *group),
            AppendError::AccessMode { mode, .. } => access_mode_refusal(msg, *mode),
        },
        Error::Mirror { source, group } => match source {
            MirrorError::NotLeader { leader } => not_leader(msg, *leader),
            MirrorError::Transferring => Status::failed_precondition(msg),
            MirrorError::WindowFull => Status::resource_exhausted(msg),
            MirrorError::Halted(_) => nothing_done(Status::unavailable(msg), *group),
            MirrorError::AccessMode { mode, .. } => access_mode_refusal(msg, *mode),
            MirrorError::Lsn { .. } => Status::out_of_range(msg),
            MirrorError::Invalid(_) => Status::invalid_argument(msg),
        },
        Error::NotAGroup { .. } => Status::invalid_argument(msg),
        Error::Change { source, .. } => match source {
            ChangeError::NotLeader => Status::failed_precondition(msg),
            ChangeError::InProgress | ChangeError::Uncommitted { .. } => Status::aborted(msg),
            ChangeError::Invalid(_) => Status::invalid_argument(msg),
            ChangeError::Unsafe(_) => {
                let mut s = Status::failed_precondition(msg);
                s.metadata_mut()
                    .insert(chorus_client::REFUSED_KEY, "strict".parse().expect("ASCII"));
                s
            }
        },
        Error::Config { .. } => Status::invalid_argument(msg),
        // Stopped before the request reached it: nothing was taken, another node may be
        // asked. (A group stopping under a request, `Stopped`, leaves its outcome unknown.)
        Error::NotRunning { group, .. } => nothing_done(Status::unavailable(msg), *group),
        // The leader's disk is low: nothing appended; retry later (docs/operations.md).
        Error::DiskLow { .. } => Status::resource_exhausted(msg),
        // The outcome is unknown, as when the replica stops under a request.
        Error::Stopped { .. } | Error::Shutdown | Error::OutcomeUnknown { .. } => {
            Status::unavailable(msg)
        }
        Error::Io { .. }
        | Error::Storage { .. }
        | Error::NoStateMachines(_)
        | Error::OooStart { .. } => Status::internal(msg),
    }
}

/// A refusal by a replica that does not lead: FAILED_PRECONDITION, naming the leader it
/// knows in the `chorus-leader` trailer.
fn not_leader(msg: String, leader: Option<u64>) -> Status {
    let mut s = Status::failed_precondition(msg);
    if let Some(l) = leader {
        if let Ok(v) = l.to_string().parse() {
            s.metadata_mut().insert("chorus-leader", v);
        }
    }
    s
}

/// A leader's refusal of a write its group's access mode does not take: marked so that
/// clients do not try the other nodes (see [`chorus_client::ACCESS_MODE_KEY`]).
fn access_mode_refusal(msg: String, mode: AccessMode) -> Status {
    let mut s = Status::failed_precondition(msg);
    s.metadata_mut().insert(
        chorus_client::ACCESS_MODE_KEY,
        mode.name().parse().expect("an ASCII name"),
    );
    s
}

fn role_name(r: Role) -> &'static str {
    match r {
        Role::Leader => "leader",
        Role::Follower => "follower",
        Role::Candidate => "candidate",
        Role::PendingFollower => "pending_follower",
    }
}

fn group_status(s: chorus_runtime::GroupStatus) -> pb::GroupStatus {
    pb::GroupStatus {
        group: s.group,
        node: s.node,
        role: role_name(s.role.role).into(),
        proposal_id: s.role.proposal_id,
        leader: s.role.leader.unwrap_or(0),
        has_leader: s.role.leader.is_some(),
        start_lsn: s.start_lsn,
        end_lsn: s.end_lsn,
        flushed_lsn: s.flushed_end,
        committed_lsn: s.committed_end,
        voters: s.membership.voters.clone(),
        learners: s.membership.learners.clone(),
        config_proposal_id: s.membership.version.proposal_id,
        config_seq: s.membership.version.seq,
        followers: s
            .followers
            .iter()
            .map(|(n, m)| pb::Follower {
                node: *n,
                matched_lsn: *m,
            })
            .collect(),
        pending_appends: s.pending_appends as u64,
        stopped: s.stopped.unwrap_or_default(),
        mode: "ordered".into(),
        access_mode: s.membership.access_mode.name().into(),
        ..Default::default()
    }
}

fn ooo_group_status(group: u64, node: u64, s: chorus_runtime::ooo::OooStatus) -> pb::GroupStatus {
    pb::GroupStatus {
        group,
        node,
        role: role_name(s.role).into(),
        proposal_id: s.term,
        leader: s.leader.unwrap_or(0),
        has_leader: s.leader.is_some(),
        mode: mode_name(s.mode).into(),
        committed_seq: s.committed_head,
        applied_seq: s.applied_head,
        base_seq: s.base,
        serving: s.serving,
        recovering_lost: s.recovering_lost,
        ..Default::default()
    }
}

/// What an out-of-order record declares, read from the request (its shape only: whether
/// it suits the group's mode is [`check_record`]'s to say).
fn declared(mode: Mode, r: &pb::OutOfOrderRecord) -> Result<Declared, String> {
    let has_blocks = !r.blocks.is_empty();
    let has_sets = !r.read_set.is_empty() || !r.write_set.is_empty();
    if has_blocks && has_sets {
        return Err("a record declares block ranges or read/write sets, not both".into());
    }
    // Nothing declared reads as the mode's own (empty) kind, refused by name there.
    let blocks = has_blocks || (!has_sets && matches!(mode, Mode::Parallel { .. }));
    if !blocks {
        return Ok(Declared::Txn {
            read_set: r.read_set.clone(),
            write_set: r.write_set.clone(),
        });
    }
    r.blocks
        .iter()
        .map(|b| {
            BlockRange::new(b.start, b.count)
                .ok_or_else(|| format!("block range {}+{} is empty or overflows", b.start, b.count))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Declared::Blocks)
}

fn read_batch(env: &Env, group: u64, from: u64, max: u32) -> Result<pb::ReadResponse, Status> {
    let log = env.group(group).map_err(status)?;
    let max = if max == 0 { 1000 } else { max.min(100_000) } as usize;
    let mut reader = log.reader(from);
    let mut records = Vec::new();
    let mut bytes = 0usize;
    while records.len() < max && bytes < (32 << 20) {
        match reader.try_next().map_err(status)? {
            Some(r) => {
                bytes += r.data.len();
                records.push(pb::Record {
                    lsn: r.lsn,
                    csn: r.csn,
                    data: r.data,
                });
            }
            None => break,
        }
    }
    Ok(pb::ReadResponse {
        records,
        next_lsn: reader.position(),
        committed_end: log.committed_end(),
    })
}

/// A stream [`follow`] makes.
type Follow<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// A stream of what `read` finds from `from` on: each batch it returns (with where to
/// go on) is sent; when it finds nothing new the stream waits for `moved` (the group's
/// committed position) to change, or a second in case a wake-up was missed. Ends when
/// the client goes away, with `read`'s error, or UNAVAILABLE once the group stops.
fn follow<T, W, F, Fut>(
    group: u64,
    mut from: u64,
    mut moved: tokio::sync::watch::Receiver<W>,
    mut read: F,
) -> Follow<T>
where
    T: Send + 'static,
    W: Send + Sync + 'static,
    F: FnMut(u64) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<Option<(T, u64)>, Status>> + Send,
{
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        loop {
            // Seen before the read: a change after it wakes the wait below.
            moved.borrow_and_update();
            match read(from).await {
                Ok(Some((batch, next))) => {
                    from = next;
                    if tx.send(Ok(batch)).await.is_err() {
                        return; // the client went away
                    }
                }
                Ok(None) => tokio::select! {
                    ch = moved.changed() => if ch.is_err() {
                        let stopped = Status::unavailable(format!("group {group} stopped"));
                        let _ = tx.send(Err(stopped)).await;
                        return;
                    },
                    _ = tx.closed() => return,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                },
                Err(s) => {
                    let _ = tx.send(Err(s)).await;
                    return;
                }
            }
        }
    });
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

/// Committed entries of out-of-order group `id` (`g`) from slot `from`, at most `max`
/// (0: 1000; at most 10,000) and about [`READ_OOO_BYTES`] of record bytes (always one
/// entry at least): what ReadOutOfOrder answers and TailOutOfOrder streams.
async fn read_ooo_batch(
    g: OooHandle,
    id: u64,
    from: u64,
    max: u32,
) -> Result<pb::ReadOutOfOrderResponse, Status> {
    let max = match max {
        0 => 1000,
        n => n.min(10_000),
    } as usize;
    tokio::task::spawn_blocking(move || {
        let read = g
            .node()
            .read(from, max)
            .ok_or_else(|| Status::unavailable(format!("group {id} stopped")))?
            .map_err(|e| Status::out_of_range(format!("group {id}: {e}")))?;
        let mut entries = Vec::new();
        let mut bytes = 0usize;
        for e in read.entries {
            if bytes >= READ_OOO_BYTES {
                break;
            }
            bytes += e.data().len();
            entries.push(ooo_entry(e).map_err(Status::data_loss)?);
        }
        let next_seq = entries.last().map_or(from, |e| e.seq + 1);
        Ok(pb::ReadOutOfOrderResponse {
            entries,
            next_seq,
            committed_seq: read.committed_head,
        })
    })
    .await
    .map_err(|e| Status::internal(e.to_string()))?
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

    async fn read(
        &self,
        req: Request<pb::ReadRequest>,
    ) -> Result<Response<pb::ReadResponse>, Status> {
        self.auth
            .check(req.metadata(), Class::Read, Some(req.get_ref().group))?;
        let r = req.into_inner();
        self.ordered(r.group, "Read")?;
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
        Ok(Response::new(follow(
            r.group,
            r.from_lsn,
            log.subscribe_tail(),
            move |from| {
                let env = env.clone();
                async move {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Only refusals that surely did nothing carry the mark a client retries elsewhere
    /// on: a halted replica's refusal and a group's that had stopped before the request
    /// do; a group stopping under it (the append may have been taken) does not.
    #[test]
    fn a_halted_replicas_refusal_is_marked_as_nothing_done() {
        let halted = status(Error::Append {
            group: 7,
            source: AppendError::Halted("halted"),
        });
        assert_eq!(halted.code(), tonic::Code::Unavailable);
        assert_eq!(
            halted
                .metadata()
                .get(chorus_client::NOT_STARTED_KEY)
                .map(|v| v.to_str().unwrap().to_string()),
            Some("7".to_string())
        );
        let not_running = status(Error::NotRunning {
            group: 7,
            reason: "storage: No space left on device".into(),
        });
        assert_eq!(not_running.code(), tonic::Code::Unavailable);
        assert_eq!(
            not_running
                .metadata()
                .get(chorus_client::NOT_STARTED_KEY)
                .map(|v| v.to_str().unwrap().to_string()),
            Some("7".to_string())
        );
        let stopped = status(Error::Shutdown);
        assert_eq!(stopped.code(), tonic::Code::Unavailable);
        assert!(stopped
            .metadata()
            .get(chorus_client::NOT_STARTED_KEY)
            .is_none());
        let full = status(Error::Append {
            group: 7,
            source: AppendError::WindowFull,
        });
        assert!(full
            .metadata()
            .get(chorus_client::NOT_STARTED_KEY)
            .is_none());
    }

    /// Every record of an out-of-order batch is reported: a refusal in the middle does
    /// not hide the results after it (those records may have been packed first and
    /// committed), and the call fails whole only when nothing has a result and all
    /// failed alike.
    #[test]
    fn an_out_of_order_batch_reports_every_record() {
        use chorus_runtime::ooo::{OooNodeError as E, OooResult};
        let ok = |seq| {
            Ok(OooResult {
                seq,
                index: 0,
                outcome: Outcome::Committed,
            })
        };
        let not_leader = || Err(E::Refused(OooAppendError::NotLeader { leader: Some(2) }));
        // Refused, then committed: both reported, in request order.
        let r = ooo_batch_response(7, vec![ok(5), not_leader(), ok(4), Err(E::Stopped)]).unwrap();
        assert_eq!(r.results.len(), 4);
        assert_eq!(
            (r.results[0].seq, r.results[0].outcome),
            (5, pb::Outcome::Committed as i32)
        );
        assert!(r.results[0].refused.is_empty() && r.results[0].unknown.is_empty());
        assert!(
            r.results[1].refused.contains("not the serving leader"),
            "{:?}",
            r.results[1]
        );
        assert_eq!(r.results[1].outcome, pb::Outcome::Unspecified as i32);
        assert_eq!(r.results[2].seq, 4);
        assert!(
            r.results[3].unknown.contains("stopped"),
            "{:?}",
            r.results[3]
        );
        assert!(r.results[3].refused.is_empty());
        // The first refused, a later one appended: not a whole-call refusal (a client
        // retrying it elsewhere would append the later one twice).
        let r = ooo_batch_response(7, vec![not_leader(), ok(9)]).unwrap();
        assert!(!r.results[0].refused.is_empty());
        assert_eq!(r.results[1].seq, 9);
        // All refused: nothing appended, the call fails with the first's code and hint.
        let e = ooo_batch_response(
            7,
            vec![
                not_leader(),
                Err(E::Refused(OooAppendError::Transferring { to: 3 })),
            ],
        )
        .unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition);
        assert_eq!(e.metadata().get("chorus-leader").unwrap(), "2");
        // None known and none refused: the call fails as a single unknown append does.
        let e =
            ooo_batch_response(7, vec![Err(E::Unknown { seq: 3 }), Err(E::Stopped)]).unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unknown);
        // Refused and unknown mixed: the unknown one may have committed, so no whole-call
        // refusal; each is reported.
        let r = ooo_batch_response(7, vec![not_leader(), Err(E::Stopped)]).unwrap();
        assert!(!r.results[0].refused.is_empty() && !r.results[1].unknown.is_empty());
        assert!(ooo_batch_response(7, vec![]).unwrap().results.is_empty());
        // A node already stopped took none of them: the call fails whole, marked as
        // nothing done, so a client sends it to another node.
        let e = ooo_batch_response(7, vec![Err(E::NotRunning), Err(E::NotRunning)]).unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unavailable);
        assert_eq!(
            e.metadata().get(chorus_client::NOT_STARTED_KEY).unwrap(),
            "7"
        );
        // Beside a result, it is reported refused (append it again), not unknown.
        let r = ooo_batch_response(7, vec![ok(3), Err(E::NotRunning)]).unwrap();
        assert!(r.results[1].refused.contains("not taken") && r.results[1].unknown.is_empty());
    }

    /// An ordered append answers for every appended record: one whose outcome the
    /// replica never learned is `unknown` beside the known ones before it; the call fails
    /// whole only when nothing is known.
    #[test]
    fn an_ordered_append_reports_unknown_outcomes_beside_known_ones() {
        let done = |lsn, csn| {
            Ok(chorus_runtime::AppendResult {
                lsn,
                csn,
                outcome: Outcome::Committed,
            })
        };
        let stopped = || Error::Stopped {
            group: 1,
            reason: "the replica stopped before the outcome was known".into(),
        };
        let r = append_response(vec![(0, 1, done(0, 1)), (40, 2, Err(stopped()))]).unwrap();
        assert_eq!(r.results.len(), 2);
        assert_eq!(r.results[0].outcome, pb::Outcome::Committed as i32);
        assert!(r.results[0].unknown.is_empty());
        assert_eq!((r.results[1].lsn, r.results[1].csn), (40, 2));
        assert_eq!(r.results[1].outcome, pb::Outcome::Unspecified as i32);
        assert!(
            r.results[1].unknown.contains("stopped"),
            "{:?}",
            r.results[1]
        );
        let e = append_response(vec![(0, 1, Err(stopped())), (40, 2, Err(stopped()))]).unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unavailable);
        assert!(append_response(vec![]).unwrap().results.is_empty());
    }
}
