//! Follower reads by CSN and the role stream: the bodies of `Read`/`Tail`'s `min_csn`
//! wait and of `WatchRole`.
//!
//! A follower read (PALF section 4.2) is served at CSN T once every record with a CSN at
//! most T is committed and in this replica's log: its readable CSN, the largest CSN below
//! the committed end it learned from its leader ([`LogHandle::readable_csn`]). CSNs grow
//! with LSNs and every later record gets a larger one, so nothing at or below T can still
//! arrive. The wait is woken by the group as its commit point advances (a watch the
//! runtime publishes after the records are in the log), not by polling.
//!
//! The role stream is PALF's `monitor_role` (section 3.3): the runtime publishes each
//! replica's role, leader and proposal id (an out-of-order replica's term) after every
//! step that changed them, including a follower hearing a new leader, and wakes the
//! watch when the replica stops or is taken off the node.

use std::time::{Duration, Instant};

use chorus_runtime::ooo::OooRole;
use chorus_runtime::RoleInfo;
use tokio::sync::watch;

use super::*;

/// The longest a `Read` or `Tail` waits for its `min_csn` (`wait_ms` above it is cut to
/// it): a waiting call holds a task and a connection slot, and a client that needs longer
/// asks again.
pub(super) const MAX_WAIT_MS: u32 = 60_000;

/// How long a role stream looks for the group again after its replica was taken off the
/// node (a restart opens it again; a deletion ends the stream NOT_FOUND at once).
const REFIND_FOR: Duration = Duration::from_secs(30);

/// Waits until `log`'s readable CSN reaches `min_csn` (0: no wait), for at most
/// `wait_ms` (cut to [`MAX_WAIT_MS`]; 0 only looks). Past it: DEADLINE_EXCEEDED naming the
/// group, the CSN asked and the readable CSN reached ([`Error::CsnNotReached`]); a group
/// that stops, is taken off the node or whose node shuts down meanwhile ends it at once,
/// UNAVAILABLE by name.
pub(super) async fn wait_min_csn(
    log: &LogHandle,
    group: u64,
    min_csn: u64,
    wait_ms: u32,
) -> Result<(), Status> {
    if min_csn == 0 {
        return Ok(());
    }
    let wait_ms = wait_ms.min(MAX_WAIT_MS);
    // `timeout` polls the wait once before its clock: a CSN already readable is served
    // even with no wait.
    match tokio::time::timeout(
        Duration::from_millis(wait_ms.into()),
        log.wait_readable_csn(min_csn),
    )
    .await
    {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(status(e)),
        Err(_) => Err(status(Error::CsnNotReached {
            group,
            csn: min_csn,
            reached: log.readable_csn(),
            waited_ms: wait_ms.into(),
        })),
    }
}

/// What a role stream follows: one incarnation of the group's replica here.
enum Watched {
    /// An ordered group: its handle (held: an ordered delete does not wait for handles,
    /// and the handle says when its incarnation is gone) and its role watch.
    Ordered(LogHandle, watch::Receiver<RoleInfo>),
    /// An out-of-order group: only its role watch (a held handle would hold up its
    /// deletion), which closes when the replica is dropped.
    OutOfOrder {
        mode: &'static str,
        role: watch::Receiver<OooRole>,
    },
}

impl Watched {
    fn of(served: Served) -> Self {
        match served {
            Served::Ordered(log) => {
                let role = log.subscribe_role();
                Watched::Ordered(log, role)
            }
            Served::OutOfOrder(h, _) => Watched::OutOfOrder {
                mode: mode_name(h.mode()),
                role: h.node().subscribe_role(),
            },
        }
    }

    /// Marks the current value seen: a change from now on wakes [`Watched::changed`].
    fn mark_seen(&mut self) {
        match self {
            Watched::Ordered(_, r) => {
                r.borrow_and_update();
            }
            Watched::OutOfOrder { role, .. } => {
                role.borrow_and_update();
            }
        }
    }

    /// Waits for a change (or a wake-up: a stop, a removal); false once the watch closed.
    async fn changed(&mut self) -> bool {
        match self {
            Watched::Ordered(_, r) => r.changed().await.is_ok(),
            Watched::OutOfOrder { role, .. } => role.changed().await.is_ok(),
        }
    }

    /// The event for the replica as it stands.
    async fn event(&self, env: &Env, group: u64) -> Result<pb::RoleEvent, Status> {
        let node = env.node();
        match self {
            Watched::Ordered(log, r) => {
                let role = *r.borrow();
                Ok(pb::RoleEvent {
                    group,
                    node,
                    role: role_name(role.role).into(),
                    proposal_id: role.proposal_id,
                    leader: role.leader.unwrap_or(0),
                    has_leader: role.leader.is_some(),
                    readable_csn: log.readable_csn(),
                    mode: "ordered".into(),
                    stopped: log.stopped_reason().unwrap_or_default(),
                    ..Default::default()
                })
            }
            Watched::OutOfOrder { mode, role } => {
                let role = *role.borrow();
                // The applied head and why it stopped come from the node, looked up for
                // the moment (not held while the stream waits).
                let (applied, stopped) = match env.ooo_group(group) {
                    Ok(h) => tokio::task::spawn_blocking(move || {
                        let why = h.node().stopped_reason();
                        let applied = match why {
                            None => h.node().status().map_or(0, |s| s.applied_head),
                            Some(_) => 0,
                        };
                        (applied, why.unwrap_or_default())
                    })
                    .await
                    .map_err(|e| Status::internal(e.to_string()))?,
                    Err(_) => (0, String::new()),
                };
                Ok(pb::RoleEvent {
                    group,
                    node,
                    role: role_name(role.role).into(),
                    proposal_id: role.term,
                    leader: role.leader.unwrap_or(0),
                    has_leader: role.leader.is_some(),
                    mode: (*mode).into(),
                    applied_seq: applied,
                    serving: role.serving,
                    stopped,
                    ..Default::default()
                })
            }
        }
    }

    /// Whether this incarnation is gone from the node (deleted, restarted, shut down).
    fn gone(&self, env: &Env, group: u64) -> bool {
        match self {
            Watched::Ordered(log, _) => log.is_removed(),
            Watched::OutOfOrder { .. } => env.ooo_group(group).is_err(),
        }
    }
}

/// What makes two events the same change: the readable CSN and applied slot move on
/// their own and are only reported with a change.
fn change_key(e: &pb::RoleEvent) -> (&str, u64, u64, bool, bool, &str) {
    (
        &e.role,
        e.proposal_id,
        e.leader,
        e.has_leader,
        e.serving,
        &e.stopped,
    )
}

/// Group `group` again after its replica here was taken off: the new incarnation of a
/// restart, or why the stream ends — NOT_FOUND once it was deleted, UNAVAILABLE when the
/// node shuts down or the group did not start again (or is not back within
/// [`REFIND_FOR`]).
async fn refind(env: &Env, group: u64) -> Result<Watched, Status> {
    let node = env.node();
    let until = Instant::now() + REFIND_FOR;
    loop {
        if env.is_shut_down() {
            return Err(Status::unavailable(format!(
                "node {node} is shutting down: the role stream of group {group} ends"
            )));
        }
        let again = match env.hosted(group) {
            Ok(HostedGroup::Ordered(log)) if log.is_removed() => None,
            Ok(HostedGroup::Ordered(log)) => Some(Served::Ordered(log)),
            Ok(HostedGroup::OutOfOrder(h)) => match h.state::<GroupStateMachine>() {
                Some(sm) => Some(Served::OutOfOrder(h, sm)),
                None => {
                    return Err(Status::internal(format!(
                        "group {group}: not the server's state machine"
                    )))
                }
            },
            Err(Error::NoSuchGroup(_)) => {
                return Err(Status::not_found(format!(
                    "group {group} was deleted on node {node}: its role stream ends"
                )))
            }
            Err(Error::Shutdown) => {
                return Err(Status::unavailable(format!(
                    "node {node} is shutting down: the role stream of group {group} ends"
                )))
            }
            // Being restarted or deleted right now: look again shortly.
            Err(Error::NotRunning { .. }) => None,
            Err(e) => {
                return Err(Status::unavailable(format!(
                    "group {group} on node {node} did not start again: {e}"
                )))
            }
        };
        if let Some(s) = again {
            return Ok(Watched::of(s));
        }
        if Instant::now() >= until {
            return Err(Status::unavailable(format!(
                "group {group} on node {node} was taken off and is not back within {REFIND_FOR:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The `WatchRole` stream of `group` here, from `first` (the group as the call found it):
/// the replica's state now, then one event per change (see [`change_key`]); across a
/// restart of the replica it follows the new incarnation. Ends when the client goes away,
/// or with [`refind`]'s status.
pub(super) fn watch_role(env: Env, group: u64, first: Served) -> Follow<pb::RoleEvent> {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        let mut cur = Watched::of(first);
        let mut last: Option<pb::RoleEvent> = None;
        loop {
            // Seen before the event is built: a change after that wakes the wait below.
            cur.mark_seen();
            let ev = match cur.event(&env, group).await {
                Ok(ev) => ev,
                Err(s) => {
                    let _ = tx.send(Err(s)).await;
                    return;
                }
            };
            if last.as_ref().map(change_key) != Some(change_key(&ev)) {
                if tx.send(Ok(ev.clone())).await.is_err() {
                    return; // the client went away
                }
                last = Some(ev);
            }
            let open = tokio::select! {
                open = cur.changed() => open,
                _ = tx.closed() => return,
                // An out-of-order replica's watch closes once it is dropped; this also
                // notices a deletion should something hold the old one a while.
                _ = tokio::time::sleep(Duration::from_secs(1)) => true,
            };
            if !open || cur.gone(&env, group) {
                cur = match refind(&env, group).await {
                    Ok(w) => w,
                    Err(s) => {
                        let _ = tx.send(Err(s)).await;
                        return;
                    }
                };
            }
        }
    });
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}
