//! `AppendStream` through the Rust client's streaming appender
//! (`chorus_client::stream::AppendStream`) against three real `chorus server` processes:
//! many concurrent appenders share one stream; the leader is killed with SIGKILL under
//! that load; every record's outcome is then checked against every surviving node's log:
//! committed records are there once, at their LSN and CSN; failed and refused ones are
//! not; unknown ones at most once; nothing else is. A refusal every node would give ends
//! the stream by name, not by timeout.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chorus_client::stream::{AppendStream, StreamOptions};
use chorus_client::{pb, Client, ClientError};

mod common;
#[path = "common/three.rs"]
mod three;
use three::{cluster, leader_of, read_all};

/// What a record's append came to.
#[derive(Debug)]
enum Seen {
    Committed(u64, u64),
    Failed,
    Unknown,
    NotAppended(String),
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_under_a_streaming_load_leaves_every_outcome_explicit_and_true() {
    let root = tempfile::tempdir().unwrap();
    let mut nodes = cluster(root.path(), 3);
    let eps: Vec<String> = nodes.iter().map(|n| n.api.clone()).collect();
    let leader = leader_of(&eps, Duration::from_secs(20)).await;

    // A follower first: the appender finds the leader by its refusal.
    let mut order = eps.clone();
    order.rotate_left(leader as usize % 3);
    let mut client = Client::new(order);
    client.leader_timeout = Duration::from_secs(20);
    let s = AppendStream::new(client, 1, StreamOptions::default());

    let seen: Arc<Mutex<HashMap<Vec<u8>, Seen>>> = Default::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for w in 0..200u32 {
        let (s, seen, stop) = (s.clone(), seen.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = 0u32;
            while !stop.load(Ordering::Relaxed) {
                let data = format!("w{w}-{i}").into_bytes();
                i += 1;
                let outcome = match s.append(data.clone()).await {
                    Ok(r) if !r.unknown.is_empty() => Seen::Unknown,
                    Ok(r) if r.outcome == pb::Outcome::Committed as i32 => {
                        Seen::Committed(r.lsn, r.csn)
                    }
                    Ok(_) => Seen::Failed,
                    Err(ClientError::Indeterminate { .. }) => Seen::Unknown,
                    Err(e) => Seen::NotAppended(e.to_string()),
                };
                seen.lock().unwrap().insert(data, outcome);
            }
        }));
    }
    let committed = |seen: &Mutex<HashMap<Vec<u8>, Seen>>| {
        seen.lock()
            .unwrap()
            .values()
            .filter(|o| matches!(o, Seen::Committed(..)))
            .count()
    };
    // Load on the first leader, then kill it under load, then load on the next.
    tokio::time::timeout(Duration::from_secs(60), async {
        while committed(&seen) < 5_000 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("5,000 records committed through the stream within 60 s");
    let killed = nodes.iter_mut().find(|n| n.id == leader).unwrap();
    killed.kill9();
    let before = committed(&seen);
    let survivors: Vec<String> = nodes
        .iter()
        .filter(|n| n.id != leader)
        .map(|n| n.api.clone())
        .collect();
    tokio::time::timeout(Duration::from_secs(60), async {
        while committed(&seen) < before + 5_000 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the stream went on at the new leader");
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }

    // Every survivor's whole log, once it holds everything committed.
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    let max_lsn = seen
        .values()
        .filter_map(|o| match o {
            Seen::Committed(l, _) => Some(*l),
            _ => None,
        })
        .max()
        .unwrap();
    for ep in &survivors {
        let mut log = read_all(ep).await;
        for _ in 0..100 {
            if log.iter().any(|r| r.lsn >= max_lsn) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            log = read_all(ep).await;
        }
        let mut at: HashMap<&[u8], (u64, u64)> = HashMap::new();
        for r in &log {
            assert!(
                seen.contains_key(&r.data),
                "{ep}: a record nobody appended at LSN {}",
                r.lsn
            );
            assert!(
                at.insert(&r.data, (r.lsn, r.csn)).is_none(),
                "{ep}: {:?} twice in the log",
                String::from_utf8_lossy(&r.data)
            );
        }
        let (mut c, mut f, mut u, mut n) = (0, 0, 0, 0);
        for (data, o) in seen.iter() {
            let name = String::from_utf8_lossy(data);
            match o {
                Seen::Committed(lsn, csn) => {
                    c += 1;
                    assert_eq!(
                        at.get(data.as_slice()),
                        Some(&(*lsn, *csn)),
                        "{ep}: {name} reported committed at LSN {lsn} CSN {csn}"
                    );
                }
                Seen::Failed => {
                    f += 1;
                    assert!(
                        !at.contains_key(data.as_slice()),
                        "{ep}: {name} failed but is in the log"
                    );
                }
                Seen::NotAppended(why) => {
                    n += 1;
                    assert!(
                        !at.contains_key(data.as_slice()),
                        "{ep}: {name} refused ({why}) but is in the log"
                    );
                }
                Seen::Unknown => u += 1,
            }
        }
        eprintln!(
            "{ep}: {c} committed, {f} failed, {u} unknown, {n} not appended; log holds {}",
            log.len()
        );
    }

    // A refusal every node gives ends the stream by name.
    let s = AppendStream::new(Client::new(survivors.clone()), 99, StreamOptions::default());
    let e = tokio::time::timeout(Duration::from_secs(10), s.append(b"x".to_vec()))
        .await
        .expect("answered, not left waiting")
        .unwrap_err();
    assert!(e.to_string().contains("99"), "{e}");
}
