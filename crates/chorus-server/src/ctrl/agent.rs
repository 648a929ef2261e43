//! A chunk server's side of the control plane: it heartbeats to the control nodes every
//! `[control] heartbeat_ms` (registering itself, its addresses and its rack), and
//! teaches its transport every registered node's replication address from the answer,
//! so that the chunk groups placed on it reach their other replicas.

use std::time::Duration;

use chorus_client::pb;
use chorus_client::volume::on_control;
use chorus_runtime::Env;

/// What a node says of itself in its heartbeats.
#[derive(Clone, Debug)]
pub struct Identity {
    /// Its id.
    pub node: u64,
    /// Its replication address.
    pub repl_addr: String,
    /// Its client API address.
    pub client_addr: String,
    /// Its rack or zone.
    pub rack: String,
}

/// Heartbeats until the process ends.
pub async fn run(env: Env, me: Identity, endpoints: Vec<String>, every: Duration) {
    let mut logged_down = false;
    loop {
        let req = pb::HeartbeatRequest {
            node: me.node,
            repl_addr: me.repl_addr.clone(),
            client_addr: me.client_addr.clone(),
            rack: me.rack.clone(),
        };
        let r = on_control(&endpoints, every.max(Duration::from_secs(1)), |mut c| {
            let req = req.clone();
            async move { c.heartbeat(req).await.map(|r| r.into_inner()) }
        })
        .await;
        match r {
            Ok(Ok(resp)) => {
                if logged_down {
                    tracing::info!("control plane reached again");
                    logged_down = false;
                }
                for n in resp.nodes {
                    if n.id != me.node && !n.repl_addr.is_empty() {
                        env.set_peer_addr(n.id, n.repl_addr);
                    }
                }
            }
            Ok(Err(s)) => {
                if !logged_down {
                    tracing::warn!(code = ?s.code(), error = %s.message(), "heartbeat refused");
                    logged_down = true;
                }
            }
            Err(e) => {
                if !logged_down {
                    tracing::warn!(error = %e, "control plane unreachable");
                    logged_down = true;
                }
            }
        }
        tokio::time::sleep(every).await;
    }
}
