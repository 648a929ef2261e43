//! Mutual TLS on replication: three nodes with certificates from one CA replicate; a node
//! whose certificate comes from another CA is refused (and counted), and cannot take part.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use chorus_core::replica::ReplicaConfig;
use chorus_runtime::transport::TlsFiles;
use chorus_runtime::{Env, EnvConfig, Outcome, Role};

mod common;
use common::{ca, node_files};

const MS: u64 = 1_000_000;

fn config(n: u64, root: &Path, tls: TlsFiles) -> EnvConfig {
    let mut c = EnvConfig::new(
        n,
        root.join(format!("n{n}")),
        "127.0.0.1:0".parse::<SocketAddr>().unwrap(),
    );
    c.replica = ReplicaConfig {
        lease: 600 * MS,
        heartbeat_interval: 50 * MS,
        ping_interval: 50 * MS,
        resend_interval: 100 * MS,
        ..ReplicaConfig::default()
    };
    c.log.block_size = 1 << 20;
    c.io_workers = 1;
    c.tls = Some(tls);
    c
}

#[test]
fn mutual_tls_replicates_and_refuses_a_stranger() {
    let root = tempfile::tempdir().unwrap();
    let good = ca();
    let evil = ca();
    // Nodes 1 and 2 hold certificates of the cluster CA; node 3's is from another CA.
    let envs: Vec<Env> = (1..=3)
        .map(|n| {
            let authority = if n == 3 { &evil } else { &good };
            Env::open(config(
                n,
                root.path(),
                node_files(root.path(), authority, n),
            ))
            .unwrap()
        })
        .collect();
    for a in &envs {
        for b in &envs {
            if a.node() != b.node() {
                a.set_peer_addr(b.node(), b.replication_addr().to_string());
            }
        }
    }
    let logs: Vec<_> = envs
        .iter()
        .map(|e| e.create_group(1, &[1, 2, 3], &[]).unwrap())
        .collect();
    // Nodes 1 and 2 are a majority: they elect a leader and commit over TLS.
    let end = Instant::now() + Duration::from_secs(15);
    let leader = loop {
        if let Some(l) = logs[..2]
            .iter()
            .find(|l| l.role().role == Role::Leader && l.append(b"probe", 0).is_ok())
        {
            break l;
        }
        assert!(Instant::now() < end, "no leader over TLS");
        std::thread::sleep(Duration::from_millis(20));
    };
    for i in 0..100 {
        let a = leader.append(format!("r{i}").as_bytes(), 0).unwrap();
        assert_eq!(a.result.wait().unwrap().outcome, Outcome::Committed);
    }
    let target = leader.committed_end();
    let other = if leader.status().node == 1 {
        &logs[1]
    } else {
        &logs[0]
    };
    assert!(other.wait_committed_past(target - 1, Duration::from_secs(10)) >= target);

    // Node 3 never got anything: its handshakes were refused on both sides.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(logs[2].status().end_lsn, 0, "the stranger received log");
    assert_ne!(logs[2].role().role, Role::Leader);
    let refused: u64 = envs
        .iter()
        .map(|e| e.transport_stats().bad_connections)
        .sum();
    assert!(refused > 0, "refused handshakes are counted");
    for e in envs {
        e.shutdown();
    }
}

#[test]
fn unreadable_tls_files_are_named() {
    let root = tempfile::tempdir().unwrap();
    let tls = TlsFiles {
        ca: root.path().join("missing-ca.pem"),
        cert: root.path().join("missing.pem"),
        key: root.path().join("missing.key"),
        server_name: "localhost".into(),
    };
    let err = Env::open(config(1, root.path(), tls))
        .unwrap_err()
        .to_string();
    assert!(err.contains("missing-ca.pem"), "{err}");
    let bad = root.path().join("garbage.pem");
    std::fs::write(&bad, "not a certificate").unwrap();
    let tls = TlsFiles {
        ca: bad.clone(),
        cert: bad.clone(),
        key: bad,
        server_name: "localhost".into(),
    };
    let err = Env::open(config(1, root.path(), tls))
        .unwrap_err()
        .to_string();
    assert!(err.contains("garbage.pem"), "{err}");
}
