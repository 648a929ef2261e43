//! Leader balancing (PolarFS section 3.2.3: PolarCtrl balances chunk leaders across
//! chunk servers, since a chunk's leader serves all its I/O).
//!
//! Two steps, every [`EVERY`] rounds of the duties:
//! 1. **Preferred leaders.** `chorus_ctrl::leader_moves` picks, for chunks whose
//!    preferred leader (first replica) is down, draining or removed, a live replica, and
//!    evens out how many chunks each live node is preferred leader of;
//!    `SetPreferredLeader` records each in the state (a new map version: routing
//!    clients try the preferred leader first).
//! 2. **Actual leaders.** Every live node is asked which chunk groups it leads; a chunk
//!    led elsewhere than its live preferred leader is asked to hand leadership over
//!    (`TransferLeader` at its leader; the group's own transfer, which waits for the
//!    target to be caught up). Chunks being moved are left alone.
//!
//! At most eight of each per turn, so balancing never floods the groups.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use chorus_client::Client;
use chorus_ctrl::{leader_moves, Command, VolumeState};

use super::Controller;

/// Balancing runs once every this many rounds of the duties.
pub const EVERY: u64 = 10;
/// Most preferred-leader changes, and most transfers, per turn.
const TRANSFERS_MAX: usize = 8;

/// One turn of leader balancing (see the module docs).
pub async fn balance_leaders(c: &Arc<Controller>) {
    let live = c.live_set();
    let moves = c.with_meta(|m| leader_moves(m, &live));
    for (group, node) in moves.into_iter().take(TRANSFERS_MAX) {
        match c.propose(Command::SetPreferredLeader { group, node }).await {
            Ok(()) => tracing::info!(group, node, "preferred leader set"),
            Err(e) => tracing::debug!(group, node, error = %e, "preferred leader not set"),
        }
    }
    // Where each chunk's leadership should be, and where the live nodes are.
    let (want, addrs): (BTreeMap<u64, u64>, BTreeMap<u64, String>) = c.with_meta(|m| {
        let want = m
            .chunks()
            .filter(|(v, ch)| v.state == VolumeState::Ready && ch.moving.is_none())
            .filter_map(|(_, ch)| ch.replicas.first().map(|p| (ch.group, *p)))
            .filter(|(_, p)| live.contains(p))
            .collect();
        let addrs = m
            .nodes()
            .values()
            .filter(|n| live.contains(&n.id))
            .map(|n| (n.id, n.client_addr.clone()))
            .collect();
        (want, addrs)
    });
    if want.is_empty() {
        return;
    }
    let mut st = Client::new(addrs.values().cloned().collect());
    st.call_timeout = Duration::from_secs(5);
    let mut led: BTreeMap<u64, u64> = BTreeMap::new();
    for (_, r) in st.status_all(0).await {
        let Ok(s) = r else { continue };
        for g in s.groups {
            if g.role == "leader" && g.serving && want.contains_key(&g.group) {
                led.insert(g.group, s.node);
            }
        }
    }
    let mut done = 0;
    for (group, leader) in led {
        let preferred = want[&group];
        if leader == preferred || done >= TRANSFERS_MAX {
            continue;
        }
        let Some(addr) = addrs.get(&leader) else {
            continue;
        };
        let mut cl = Client::new(vec![addr.clone()]);
        cl.call_timeout = Duration::from_secs(5);
        cl.leader_timeout = Duration::from_secs(2);
        match cl.transfer_leader(group, preferred).await {
            Ok(()) => {
                done += 1;
                c.leader_transfers.fetch_add(1, Ordering::Relaxed);
                tracing::info!(
                    group,
                    from = leader,
                    to = preferred,
                    "chunk leadership handed to its preferred leader"
                );
            }
            Err(e) => {
                tracing::debug!(group, to = preferred, error = %e, "leader transfer not made")
            }
        }
    }
}
