//! The control leader's duties (PolarFS section 3.2.3): creating the chunk groups of new
//! volumes (and filling clones, `super::snap`), finishing snapshots, removing those of deleted ones, watching heartbeats, re-replicating the
//! chunks of a node that is drained or has been down for `replace_after_ms`, and
//! rebalancing chunks onto new or returned nodes. They run on every
//! control node and act only while it leads the control group; each step is idempotent
//! (creating a group that exists with the same spec, deleting one already gone), so a new
//! leader finishes what a previous one began from the state alone.

use std::sync::Arc;
use std::time::Duration;

use chorus_client::{pb, Client, ClientError};
use chorus_ctrl::{drain_moves, rebalance, Command, NodeState, VolumeState};
use tonic::{Code, Status};

use super::Controller;

/// How often the duties run.
const PERIOD: Duration = Duration::from_millis(500);

/// Runs the duties until the controller is dropped.
pub async fn run(c: std::sync::Weak<Controller>) {
    let mut leading = false;
    let mut round = 0u64;
    loop {
        round += 1;
        tokio::time::sleep(PERIOD).await;
        let Some(c) = c.upgrade() else { return };
        if !c.is_leader() {
            leading = false;
            continue;
        }
        if !leading {
            // A new leader has heard from nobody yet: every registered node starts
            // live, and is down only if it then stays silent (no node is declared down
            // because the control plane changed leaders).
            leading = true;
            let nodes: Vec<u64> = c.with_meta(|m| m.nodes().keys().copied().collect());
            for n in nodes {
                c.heartbeat(n);
            }
        }
        let pending: Vec<(String, VolumeState)> = c.with_meta(|m| {
            m.volumes()
                .values()
                .filter(|v| v.state != VolumeState::Ready)
                .map(|v| (v.name.clone(), v.state))
                .collect()
        });
        for (name, state) in pending {
            let r = match state {
                VolumeState::Creating => finish_creating(&c, &name).await,
                VolumeState::Deleting => finish_deleting(&c, &name).await,
                VolumeState::Ready => Ok(()),
            };
            if let Err(e) = r {
                tracing::debug!(volume = %name, error = %e, "control duty not done yet");
            }
        }
        super::snap::drive(&c).await;
        rereplicate(&c).await;
        super::scrub::turn(&c).await;
        if round.is_multiple_of(super::balance::EVERY) {
            super::balance::balance_leaders(&c).await;
        }
    }
}

/// Most chunk moves under way at once (each streams a chunk to its new replica at the
/// group's catch-up rate).
const MOVES_MAX: usize = 4;

/// Re-replication: starts a move for every chunk with a replica on a drained node or on
/// one down for `replace_after_ms` (to a live node in a rack the chunk does not use yet,
/// the least loaded: `chorus_ctrl::drain_moves`), then drives every move under way.
async fn rereplicate(c: &Arc<Controller>) {
    let live = c.live_set();
    let (leaving, moving) = c.with_meta(|m| {
        let leaving: Vec<u64> = m
            .nodes()
            .values()
            .filter(|n| m.load(n.id) > 0)
            .filter(|n| {
                n.state == NodeState::Draining
                    || (n.state == NodeState::Up
                        && c.down_for_ms(n.id)
                            .is_some_and(|d| d >= c.cfg.replace_after_ms))
            })
            .map(|n| n.id)
            .collect();
        let moving = m.chunks().filter(|(_, ch)| ch.moving.is_some()).count();
        (leaving, moving)
    });
    let mut room = MOVES_MAX.saturating_sub(moving);
    // Rebalancing onto new (or returned) nodes, only while nothing else moves and no
    // node is leaving: replacing lost replicas comes first.
    if leaving.is_empty() && moving == 0 {
        let moves = c.with_meta(|m| rebalance(m, &live, room));
        for (group, from, to) in moves {
            match c.propose(Command::StartMove { group, from, to }).await {
                Ok(()) => {
                    c.moves_started
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tracing::info!(group, from, to, "rebalancing a chunk");
                    room = room.saturating_sub(1);
                }
                Err(e) => tracing::debug!(group, error = %e, "move not started"),
            }
        }
    }
    for node in leaving {
        let moves = c.with_meta(|m| drain_moves(m, &live, node));
        for (group, from, to) in moves.into_iter().take(room) {
            match c.propose(Command::StartMove { group, from, to }).await {
                Ok(()) => {
                    c.moves_started
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tracing::info!(group, from, to, "re-replicating a chunk");
                    room -= 1;
                }
                Err(e) => tracing::debug!(group, error = %e, "move not started"),
            }
        }
    }
    let under_way: Vec<(u64, Vec<u64>, u64, u64, u64, u32)> = c.with_meta(|m| {
        m.chunks()
            .filter_map(|(v, ch)| {
                ch.moving.map(|mv| {
                    (
                        ch.group,
                        ch.replicas.clone(),
                        mv.from,
                        mv.to,
                        v.chunk_bytes,
                        v.block_bytes,
                    )
                })
            })
            .collect()
    });
    for (group, replicas, from, to, chunk_bytes, block_bytes) in under_way {
        if let Err(e) = drive_move(c, group, &replicas, from, to, chunk_bytes, block_bytes).await {
            tracing::debug!(group, from, to, error = %e, "move not done yet");
        }
    }
}

/// One step of moving chunk `group`'s replica from `from` to `to` (a membership change
/// of its group: `to` created as a replica that follows whoever adds it, then
/// `Replace{from → to}` at the chunk's leader, which `to` catches up from, by image when
/// the log was compacted). Done once the leader's voters have `to` and not `from` and no
/// change is under way: the move is finished in the state, and `from`'s replica deleted
/// if it can be reached. Every step is idempotent.
async fn drive_move(
    c: &Arc<Controller>,
    group: u64,
    replicas: &[u64],
    from: u64,
    to: u64,
    chunk_bytes: u64,
    block_bytes: u32,
) -> Result<(), Status> {
    let nodes: std::collections::BTreeMap<u64, chorus_ctrl::Node> = c.with_meta(|m| {
        replicas
            .iter()
            .chain([&to])
            .filter_map(|n| m.node(*n).map(|x| (*n, x.clone())))
            .collect()
    });
    let target = nodes
        .get(&to)
        .ok_or_else(|| Status::not_found(format!("node {to} is not registered")))?;
    // a. The new replica.
    let req = pb::CreateGroupRequest {
        group,
        voters: replicas.to_vec(),
        replicas: vec![to],
        mode: "parallel".into(),
        chunk_bytes,
        block_bytes,
        peer_addrs: nodes
            .values()
            .map(|n| (n.id, n.repl_addr.clone()))
            .collect(),
        ..Default::default()
    };
    let mut cl = Client::new(vec![target.client_addr.clone()]);
    cl.call_timeout = Duration::from_secs(10);
    match cl.create_group_with(req.clone()).await {
        Ok(()) => {}
        // A stale replica from before this node lost the chunk (it was down and the chunk
        // moved away): it is no voter of the chunk now, so it goes, and a fresh one is
        // created that catches up from the leader.
        Err(ClientError::Status {
            code: Code::FailedPrecondition,
            message,
            ..
        }) if message.contains("already exists") => {
            tracing::info!(
                group,
                node = to,
                "deleting a stale chunk replica before moving the chunk back"
            );
            cl.delete_group(0, group, true)
                .await
                .map_err(client_status)?;
            cl.create_group_with(req).await.map_err(client_status)?;
        }
        Err(e) => return Err(client_status(e)),
    }
    // b. The chunk's leader, among its live replicas and the new one (which may lead
    //    once the change is done).
    let eps: Vec<(u64, String)> = replicas
        .iter()
        .chain([&to])
        .filter(|n| **n != from || c.is_live(from))
        .filter_map(|n| nodes.get(n).map(|x| (*n, x.client_addr.clone())))
        .collect();
    let mut st = Client::new(eps.iter().map(|(_, a)| a.clone()).collect());
    st.call_timeout = Duration::from_secs(5);
    let leader = st
        .status_all(group)
        .await
        .into_iter()
        .filter_map(|(_, r)| r.ok())
        .find_map(|s| {
            s.groups
                .iter()
                .find(|g| g.group == group && g.role == "leader" && g.serving)
                .map(|g| {
                    (
                        s.node,
                        g.voters.clone(),
                        g.prev_voters.clone(),
                        g.committed_seq,
                    )
                })
        });
    let Some((lnode, voters, prev, committed)) = leader else {
        return Err(Status::unavailable(format!(
            "chunk group {group} has no serving leader"
        )));
    };
    // c. Done once the change is and the new replica has caught up (applied all the
    //    leader had committed): only then is the move finished in the state and the old
    //    replica dropped (if it is up), so the chunk never has fewer complete copies
    //    than it had, not only a majority (PolarFS section 3.2.3: catch up, then
    //    remove).
    if prev.is_empty() && voters.contains(&to) && !voters.contains(&from) {
        let mut nc = Client::new(vec![target.client_addr.clone()]);
        nc.call_timeout = Duration::from_secs(5);
        let applied = nc
            .status_all(group)
            .await
            .into_iter()
            .filter_map(|(_, r)| r.ok())
            .flat_map(|s| s.groups)
            .find(|g| g.group == group)
            .map_or(0, |g| g.applied_seq);
        if applied < committed {
            tracing::debug!(
                group,
                to,
                applied,
                committed,
                "new replica still catching up"
            );
            return Ok(());
        }
        c.propose(Command::FinishMove { group, from, to }).await?;
        c.moves_finished
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::info!(group, from, to, "chunk moved");
        if c.is_live(from) {
            let addr = c.with_meta(|m| m.node(from).map(|n| n.client_addr.clone()));
            if let Some(addr) = addr {
                let mut cl = Client::new(vec![addr]);
                cl.call_timeout = Duration::from_secs(10);
                if let Err(e) = cl.delete_group(0, group, true).await {
                    tracing::warn!(group, node = from, error = %e, "old chunk replica not deleted");
                }
            }
        }
        return Ok(());
    }
    if !prev.is_empty() {
        return Ok(()); // a change under way: the next round looks again
    }
    // d. Start the change at the leader.
    let laddr = nodes
        .get(&lnode)
        .map(|n| n.client_addr.clone())
        .ok_or_else(|| Status::not_found(format!("leader node {lnode} is not registered")))?;
    let mut cl = Client::new(vec![laddr]);
    cl.call_timeout = Duration::from_secs(10);
    cl.change_membership(pb::ChangeMembershipRequest {
        group,
        kind: pb::ChangeKind::Replace as i32,
        node: to,
        old_node: from,
        node_addr: target.repl_addr.clone(),
        // Chunk groups are out of order (no learners): the control plane picked a live,
        // heartbeating target, which the group's strict check would count as not heard
        // from until it joins.
        force: true,
    })
    .await
    .map_err(client_status)
}

fn client_status(e: ClientError) -> Status {
    match e {
        ClientError::Status {
            code,
            message,
            endpoint,
        } => Status::new(code, format!("{endpoint}: {message}")),
        e => Status::unavailable(e.to_string()),
    }
}

/// Creates every chunk group of volume `name` on its replicas' nodes.
pub async fn create_chunk_groups(c: &Arc<Controller>, name: &str) -> Result<(), Status> {
    let plan = c.with_meta(|m| {
        m.volume(name).map(|v| {
            v.chunks
                .iter()
                .map(|ch| {
                    let nodes: Vec<_> = ch
                        .replicas
                        .iter()
                        .filter_map(|n| m.node(*n).cloned())
                        .collect();
                    (ch.group, nodes, v.chunk_bytes, v.block_bytes)
                })
                .collect::<Vec<_>>()
        })
    });
    let Some(plan) = plan else {
        return Err(Status::not_found(format!("volume `{name}` does not exist")));
    };
    for (group, nodes, chunk_bytes, block_bytes) in plan {
        let req = pb::CreateGroupRequest {
            group,
            voters: nodes.iter().map(|n| n.id).collect(),
            mode: "parallel".into(),
            chunk_bytes,
            block_bytes,
            peer_addrs: nodes.iter().map(|n| (n.id, n.repl_addr.clone())).collect(),
            ..Default::default()
        };
        // Each replica on its own: a chunk group serves once a majority of its replicas
        // exist, and a node that cannot be reached (it may have died since it was placed
        // on) must not hold up the others.
        let mut made = 0;
        let mut last = None;
        for n in &nodes {
            let mut cl = Client::new(vec![n.client_addr.clone()]);
            cl.call_timeout = Duration::from_secs(10);
            match cl.create_group_with(req.clone()).await {
                Ok(()) => made += 1,
                Err(e) => last = Some(client_status(e)),
            }
        }
        if made < nodes.len() / 2 + 1 {
            return Err(last.unwrap_or_else(|| {
                Status::failed_precondition(format!("chunk group {group} names no registered node"))
            }));
        }
        if let Some(e) = last {
            tracing::warn!(group, error = %e, "chunk group created on a majority of its replicas only");
        }
    }
    Ok(())
}

/// Creates volume `name`'s chunk groups and marks it ready (if it is being created).
pub async fn finish_creating(c: &Arc<Controller>, name: &str) -> Result<(), Status> {
    create_chunk_groups(c, name).await?;
    let (creating, clone) = c.with_meta(|m| match m.volume(name) {
        Some(v) => (v.state == VolumeState::Creating, v.source.is_some()),
        None => (false, false),
    });
    if creating && clone {
        // A clone is ready once its source snapshot's blocks are copied in.
        return super::snap::finish_clone(c, name).await;
    }
    if creating {
        match c
            .propose(Command::VolumeReady {
                name: name.to_string(),
            })
            .await
        {
            // Another proposal made it ready first.
            Err(s) if s.code() == Code::FailedPrecondition && c.is_leader() => {}
            r => r?,
        }
    }
    Ok(())
}

/// Removes volume `name`'s chunk groups from their nodes, then the volume. A node that
/// cannot be reached holds the deletion up until it has been down for
/// `[control] replace_after_ms` (its replicas are then abandoned with it).
pub async fn finish_deleting(c: &Arc<Controller>, name: &str) -> Result<(), Status> {
    let plan = c.with_meta(|m| {
        m.volume(name).map(|v| {
            v.chunks
                .iter()
                .flat_map(|ch| {
                    let mut on = ch.replicas.clone();
                    if let Some(mv) = ch.moving {
                        on.push(mv.to);
                    }
                    on.into_iter()
                        .filter_map(|n| m.node(n).cloned())
                        .map(move |n| (ch.group, n))
                        .collect::<Vec<_>>()
                })
                .collect::<Vec<_>>()
        })
    });
    let Some(plan) = plan else { return Ok(()) };
    for (group, node) in plan {
        let mut cl = Client::new(vec![node.client_addr.clone()]);
        cl.call_timeout = Duration::from_secs(10);
        match cl.delete_group(0, group, true).await {
            Ok(()) => {}
            Err(ClientError::Status {
                code: Code::NotFound,
                ..
            }) => {}
            Err(e) => {
                let gone = c
                    .down_for_ms(node.id)
                    .is_some_and(|d| d >= c.cfg.replace_after_ms);
                if !gone {
                    return Err(client_status(e));
                }
            }
        }
    }
    c.propose(Command::VolumeGone {
        name: name.to_string(),
    })
    .await
}
