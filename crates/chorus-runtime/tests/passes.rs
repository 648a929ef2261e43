//! Ordered groups stepped together in passes (`chorus_runtime::pass`): with one IO
//! worker per node taking four groups at a time, many groups under concurrent appends
//! all commit every append, every replica holds the same records, and a group that is
//! still busy when its pass runs out of rounds goes back to the queue with nothing lost.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chorus_core::replica::ReplicaConfig;
use chorus_runtime::{Env, EnvConfig, Error, Outcome};

const MS: u64 = 1_000_000;

fn config(node: u64, dir: &Path) -> EnvConfig {
    let mut c = EnvConfig::new(node, dir, "127.0.0.1:0".parse::<SocketAddr>().unwrap());
    c.replica = ReplicaConfig {
        lease: 600 * MS,
        heartbeat_interval: 50 * MS,
        ping_interval: 50 * MS,
        resend_interval: 100 * MS,
        ..ReplicaConfig::default()
    };
    c.log.block_size = 1 << 20;
    // Both write paths under passes: even nodes pipeline their syncs.
    c.pipelined_sync = node.is_multiple_of(2);
    // One worker: every group with work waits for it, so passes are full and long.
    c.io_workers = 1;
    c.pass_groups = 4;
    c
}

#[test]
fn many_groups_stepped_in_passes_commit_every_append_on_every_replica() {
    const GROUPS: u64 = 24;
    const PER_GROUP: usize = 30;
    let root = tempfile::tempdir().unwrap();
    let envs: Vec<Env> = (1..=3)
        .map(|n| Env::open(config(n, &root.path().join(format!("n{n}")))).unwrap())
        .collect();
    for (i, a) in envs.iter().enumerate() {
        for (j, b) in envs.iter().enumerate() {
            if i != j {
                a.set_peer_addr(j as u64 + 1, b.replication_addr().to_string());
            }
        }
    }
    for e in &envs {
        for g in 1..=GROUPS {
            e.create_group(g, &[1, 2, 3], &[]).unwrap();
        }
    }
    let envs = Arc::new(envs);
    // One appender per group, all at once: each appends its records one after another
    // through whichever node leads the group.
    let appenders: Vec<_> = (1..=GROUPS)
        .map(|g| {
            let envs = envs.clone();
            std::thread::spawn(move || {
                let deadline = Instant::now() + Duration::from_secs(60);
                let mut lsns = Vec::new();
                while lsns.len() < PER_GROUP {
                    assert!(Instant::now() < deadline, "group {g}: appends stalled");
                    let data = format!("group {g} record {}", lsns.len());
                    let taken = envs.iter().find_map(|e| {
                        let log = e.group(g).ok()?;
                        log.append(data.as_bytes(), 0).ok()
                    });
                    let Some(a) = taken else {
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    };
                    match a.result.wait() {
                        Ok(r) if r.outcome == Outcome::Committed => lsns.push((a.lsn, data)),
                        // A leader change: the append's outcome is settled, try again.
                        Ok(_) | Err(Error::OutcomeUnknown { .. }) => {}
                        Err(e) => panic!("group {g}: {e}"),
                    }
                }
                (g, lsns)
            })
        })
        .collect();
    let appended: Vec<_> = appenders.into_iter().map(|h| h.join().unwrap()).collect();
    for (g, lsns) in appended {
        let last = lsns.last().unwrap().0;
        for e in envs.iter() {
            let log = e.group(g).unwrap();
            assert!(
                log.wait_committed_past(last, Duration::from_secs(30)) > last,
                "node {}: group {g} never learned its last append committed",
                e.node()
            );
            for (lsn, data) in &lsns {
                assert_eq!(
                    log.read(*lsn).unwrap().data,
                    data.as_bytes(),
                    "node {}, group {g}, lsn {lsn}",
                    e.node()
                );
            }
        }
    }
    for e in envs.iter() {
        e.shutdown();
    }
}

#[test]
fn pass_groups_out_of_range_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(1, dir.path());
    c.pass_groups = 0;
    match Env::open(c) {
        Err(Error::Config { setting, .. }) => assert_eq!(setting, "pass_groups"),
        other => panic!("pass_groups 0 accepted: {:?}", other.map(|_| ())),
    }
}
