//! Follower reads by CSN and the role watch (PALF sections 4.2 and 3.3), on three real
//! environments in one process over loopback TCP: every replica's readable CSN never
//! claims a record its log cannot serve, reaches each committed record's CSN, and a wait
//! on it ends by itself when the group goes; the role watch publishes leader changes on
//! every replica, followers included.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use chorus_core::format::meta::NodeId;
use chorus_core::replica::ReplicaConfig;
use chorus_runtime::{Env, EnvConfig, Error, LogHandle, Outcome, Role};

const MS: u64 = 1_000_000;

fn config(node: NodeId, dir: &Path) -> EnvConfig {
    let mut c = EnvConfig::new(node, dir, "127.0.0.1:0".parse::<SocketAddr>().unwrap());
    c.replica = ReplicaConfig {
        lease: 600 * MS,
        heartbeat_interval: 50 * MS,
        ping_interval: 50 * MS,
        resend_interval: 100 * MS,
        ..ReplicaConfig::default()
    };
    c.log.block_size = 1 << 20;
    c.io_workers = 2;
    c
}

/// Three environments, each a voter of group 1.
fn three(root: &Path) -> HashMap<NodeId, Env> {
    let mut envs: HashMap<NodeId, Env> = HashMap::new();
    for n in 1..=3 {
        let env = Env::open(config(n, &root.join(format!("n{n}")))).unwrap();
        for (id, other) in &envs {
            other.set_peer_addr(n, env.replication_addr().to_string());
            env.set_peer_addr(*id, other.replication_addr().to_string());
        }
        envs.insert(n, env);
    }
    for e in envs.values() {
        e.create_group(1, &[1, 2, 3], &[]).unwrap();
    }
    envs
}

/// The serving leader (it takes an append); returns its id.
async fn leader(envs: &HashMap<NodeId, Env>) -> NodeId {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        for (id, e) in envs {
            let g = e.group(1).unwrap();
            if g.role().role == Role::Leader {
                if let Ok(a) = g.append(b"probe", 0) {
                    if matches!(a.result.await, Ok(r) if r.outcome == Outcome::Committed) {
                        return *id;
                    }
                }
            }
        }
        assert!(Instant::now() < end, "no leader");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The largest CSN a full read of `g` from its start returns.
fn max_csn_read(g: &LogHandle) -> u64 {
    g.reader(0).map(|r| r.unwrap().csn).max().unwrap_or(0)
}

/// While records commit, every replica's readable CSN, each time it is looked at, is
/// one its log serves in full (a read from the start there reaches at least that CSN);
/// after each commit it reaches the record's CSN on every replica (a wait that returns
/// without polling); a jump of the reference CSN is readable as soon as committed. A
/// wait for a CSN no record has never returns, and ends by itself, named, when the
/// replica is deleted.
#[tokio::test]
async fn the_readable_csn_is_served_in_full_and_reached_everywhere() {
    let root = tempfile::tempdir().unwrap();
    let envs = three(root.path());
    let l = leader(&envs).await;
    let lg = envs[&l].group(1).unwrap();
    let handles: Vec<(NodeId, LogHandle)> = envs
        .iter()
        .map(|(id, e)| (*id, e.group(1).unwrap()))
        .collect();
    let mut last = 0;
    for i in 0..60u64 {
        // Every tenth record jumps its CSN by a reference (PALF section 4.2).
        let ref_csn = if i % 10 == 9 { last + 1_000 } else { 0 };
        let a = lg.append(format!("r{i}").as_bytes(), ref_csn).unwrap();
        let csn = a.csn;
        // Looked at while the record is in flight: never more than what is held.
        for (id, g) in &handles {
            let seen = g.readable_csn();
            let held = max_csn_read(g);
            assert!(
                held >= seen,
                "node {id}: readable CSN {seen} but a read from the start ends at CSN {held}"
            );
        }
        assert_eq!(a.result.await.unwrap().outcome, Outcome::Committed);
        assert!(csn > last && csn >= ref_csn);
        last = csn;
        for (id, g) in &handles {
            let reached = tokio::time::timeout(Duration::from_secs(10), g.wait_readable_csn(csn))
                .await
                .unwrap_or_else(|_| panic!("node {id}: CSN {csn} not readable within 10 s"))
                .unwrap();
            assert!(reached >= csn);
            assert!(
                max_csn_read(g) >= csn,
                "node {id}: CSN {csn} readable but not read"
            );
            assert!(g.status().readable_csn >= csn);
        }
    }
    // A CSN nothing has: the wait stays pending; deleting the replica ends it by name.
    let (fid, fg) = handles.iter().find(|(id, _)| *id != l).unwrap().clone();
    let far = last + 1_000_000;
    let wait = tokio::spawn({
        let fg = fg.clone();
        async move { fg.wait_readable_csn(far).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !wait.is_finished(),
        "node {fid}: a wait for CSN {far} returned"
    );
    let env = envs[&fid].clone();
    tokio::task::spawn_blocking(move || env.remove_group(1))
        .await
        .unwrap()
        .unwrap();
    let r = tokio::time::timeout(Duration::from_secs(5), wait)
        .await
        .expect("the wait ended once the replica was deleted")
        .unwrap();
    match r {
        Err(e @ Error::NotRunning { group: 1, .. }) => {
            assert!(e.to_string().contains("taken off"), "{e}")
        }
        other => panic!("node {fid}: {other:?}"),
    }
    for e in envs.values() {
        e.shutdown();
    }
}

/// The role watch of every replica publishes a leader transfer: the new leader's
/// watch says leader, the old one's and the bystander's name the new leader (a follower
/// whose role did not change sees its leader change).
#[tokio::test]
async fn the_role_watch_shows_a_transfer_on_every_replica() {
    let root = tempfile::tempdir().unwrap();
    let envs = three(root.path());
    let l = leader(&envs).await;
    let mut watches: Vec<(
        NodeId,
        tokio::sync::watch::Receiver<chorus_runtime::RoleInfo>,
    )> = envs
        .iter()
        .map(|(id, e)| (*id, e.group(1).unwrap().subscribe_role()))
        .collect();
    for (id, w) in &mut watches {
        let end = Instant::now() + Duration::from_secs(10);
        while w.borrow_and_update().leader != Some(l) {
            assert!(Instant::now() < end, "node {id} never named leader {l}");
            let _ = tokio::time::timeout(Duration::from_millis(200), w.changed()).await;
        }
    }
    let to = (1..=3).find(|n| *n != l).unwrap();
    envs[&l].group(1).unwrap().transfer_leader(to).unwrap();
    // A transfer lapses if the target has not acknowledged the leader's whole log within
    // a lease (600 ms here): the leader then goes on leading. With its fsyncs slowed by
    // other IO on the machine (a CI run beside a real-process fault run) it did, and the
    // watch rightly kept naming the old leader. What is tested here is the watch, so
    // whoever leads is asked again, at most every second, until the target leads.
    let end = Instant::now() + Duration::from_secs(20);
    let mut asked = Instant::now();
    for (id, w) in &mut watches {
        loop {
            let r = *w.borrow_and_update();
            if r.leader == Some(to) && (r.role == Role::Leader) == (*id == to) {
                break;
            }
            assert!(
                Instant::now() < end,
                "node {id}: the watch still says {r:?} after the transfer to {to}"
            );
            if asked.elapsed() >= Duration::from_secs(1) {
                asked = Instant::now();
                for (n, e) in &envs {
                    let g = e.group(1).unwrap();
                    if *n != to && g.role().role == Role::Leader {
                        let _ = g.transfer_leader(to);
                    }
                }
            }
            let _ = tokio::time::timeout(Duration::from_millis(200), w.changed()).await;
        }
    }
    for e in envs.values() {
        e.shutdown();
    }
}
