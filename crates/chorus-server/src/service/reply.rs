//! What the gRPC handlers answer: protobuf conversions of runtime results, and the
//! mapping of runtime errors to gRPC statuses (which of them mark "nothing was done",
//! so a client may retry elsewhere).

use super::*;

/// Record bytes after which a `ReadOutOfOrder` response stops (well inside gRPC's 4 MiB
/// default message bound with the metadata).
pub(super) const READ_OOO_BYTES: usize = 2 << 20;

pub(super) fn pb_ranges(rs: &[BlockRange]) -> Vec<pb::BlockRange> {
    rs.iter()
        .map(|r| pb::BlockRange {
            start: r.start,
            count: r.end - r.start,
        })
        .collect()
}

/// An out-of-order entry as `ReadOutOfOrder` returns it, its group split into records; an
/// entry whose data is not a group is an error naming its slot.
pub(super) fn ooo_entry(
    e: chorus_core::ooo::replica::Entry,
) -> Result<pb::OutOfOrderEntry, String> {
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

/// UNAVAILABLE by name for a group whose damaged replica did not start here, marked
/// [`chorus_client::NOT_STARTED_KEY`]: refused before anything was done, so not an
/// indeterminate result.
pub(super) fn not_started(group: u64, why: &str) -> Status {
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
pub(super) fn nothing_done(mut s: Status, group: u64) -> Status {
    s.metadata_mut()
        .insert(chorus_client::NOT_STARTED_KEY, group.into());
    s
}

pub(super) fn mode_name(m: Mode) -> &'static str {
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
pub(super) fn pb_outcome(o: Outcome) -> i32 {
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
pub(super) async fn write_batch(
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

pub(super) fn append_response(
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
pub(super) fn ooo_batch_response(
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
        // A read at a CSN gave up waiting for it (nothing was read).
        Error::CsnNotReached { .. } => Status::deadline_exceeded(msg),
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
pub(super) fn not_leader(msg: String, leader: Option<u64>) -> Status {
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
pub(super) fn access_mode_refusal(msg: String, mode: AccessMode) -> Status {
    let mut s = Status::failed_precondition(msg);
    s.metadata_mut().insert(
        chorus_client::ACCESS_MODE_KEY,
        mode.name().parse().expect("an ASCII name"),
    );
    s
}

pub(super) fn role_name(r: Role) -> &'static str {
    match r {
        Role::Leader => "leader",
        Role::Follower => "follower",
        Role::Candidate => "candidate",
        Role::PendingFollower => "pending_follower",
    }
}

pub(super) fn group_status(s: chorus_runtime::GroupStatus) -> pb::GroupStatus {
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
        readable_csn: s.readable_csn,
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
        recovering_lost: s.repairing.is_some(),
        ..Default::default()
    }
}

pub(super) fn ooo_group_status(
    group: u64,
    node: u64,
    s: chorus_runtime::ooo::OooStatus,
) -> pb::GroupStatus {
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
pub(super) fn declared(mode: Mode, r: &pb::OutOfOrderRecord) -> Result<Declared, String> {
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

pub(super) fn read_batch(
    env: &Env,
    group: u64,
    from: u64,
    max: u32,
) -> Result<pb::ReadResponse, Status> {
    let log = env.group(group).map_err(status)?;
    let max = if max == 0 { 1000 } else { max.min(100_000) } as usize;
    // Taken before the read: every record with a CSN up to it is in what follows `from`
    // or before it (see ReadResponse.readable_csn).
    let readable_csn = log.readable_csn();
    // At the committed end a read is empty (nothing yet: a poller's normal answer); past
    // it the LSN is not committed here, which the caller must learn rather than wait on.
    let committed = log.committed_end();
    if from > committed {
        return Err(status(chorus_runtime::Error::NotCommitted {
            group,
            lsn: from,
            committed,
        }));
    }
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
        readable_csn,
    })
}

/// A stream [`follow`] makes.
pub(super) type Follow<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// A stream of what `read` finds from `from` on: each batch it returns (with where to
/// go on) is sent; when it finds nothing new the stream waits for `moved` (the group's
/// committed position) to change, or a second in case a wake-up was missed. Ends when
/// the client goes away, with `read`'s error, or UNAVAILABLE once the group stops.
pub(super) fn follow<T, W, F, Fut>(
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
pub(super) async fn read_ooo_batch(
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
