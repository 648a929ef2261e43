//! The control leader's duties (PolarFS section 3.2.3): creating the chunk groups of new
//! volumes, removing those of deleted ones, and watching heartbeats. They run on every
//! control node and act only while it leads the control group; each step is idempotent
//! (creating a group that exists with the same spec, deleting one already gone), so a new
//! leader finishes what a previous one began from the state alone.

use std::sync::Arc;
use std::time::Duration;

use chorus_client::{pb, Client, ClientError};
use chorus_ctrl::{Command, VolumeState};
use tonic::{Code, Status};

use super::Controller;

/// How often the duties run.
const PERIOD: Duration = Duration::from_millis(500);

/// Runs the duties until the controller is dropped.
pub async fn run(c: std::sync::Weak<Controller>) {
    let mut leading = false;
    loop {
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
    }
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
    let creating = c.with_meta(|m| m.volume(name).map(|v| v.state == VolumeState::Creating));
    if creating == Some(true) {
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
