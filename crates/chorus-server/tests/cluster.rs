//! Real processes on loopback: three `chorus server` nodes, 100k records from many
//! concurrent writers over gRPC, `kill -9` of the leader mid-stream, a new leader, every
//! record reported committed readable on every surviving replica in the same order,
//! nothing reported failed in the log, and the killed node restarted and caught up. Also:
//! bad input over the wire leaves the node serving, and `chorus trim`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chorus_client::{pb, Client, ClientError};

mod common;
use common::{free_port, Server};
#[path = "common/three.rs"]
mod three;
use three::{cluster, leader_of, read_all, Node};

async fn committed_end(ep: &str) -> u64 {
    let mut c = Client::new(vec![ep.to_string()]);
    match &c.status_all(1).await[0].1 {
        Ok(s) => s.groups.first().map_or(0, |g| g.committed_lsn),
        Err(_) => 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_nine_the_leader_under_load() {
    let root = tempfile::tempdir().unwrap();
    let mut nodes = cluster(root.path(), 3);
    let eps: Vec<String> = nodes.iter().map(|n| n.api.clone()).collect();
    let leader = leader_of(&eps, Duration::from_secs(20)).await;

    const WRITERS: usize = 32;
    const TOTAL: usize = 100_000;
    const BATCH: usize = 10;
    let committed: Arc<Mutex<BTreeMap<u64, Vec<u8>>>> = Default::default();
    let failed: Arc<Mutex<HashSet<Vec<u8>>>> = Default::default();
    let unknown = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let (eps, committed, failed, unknown, done, stop) = (
            eps.clone(),
            committed.clone(),
            failed.clone(),
            unknown.clone(),
            done.clone(),
            stop.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut c = Client::new(eps);
            c.leader_timeout = Duration::from_secs(30);
            let per = TOTAL / WRITERS;
            let mut i = 0;
            while i < per && !stop.load(Ordering::Relaxed) {
                let recs: Vec<Vec<u8>> = (i..(i + BATCH).min(per))
                    .map(|k| format!("w{w}-r{k}").into_bytes())
                    .collect();
                i += recs.len();
                match c.append(1, recs.clone(), 0).await {
                    Ok(res) => {
                        for (r, data) in res.iter().zip(&recs) {
                            if r.outcome == pb::Outcome::Committed as i32 {
                                committed.lock().unwrap().insert(r.lsn, data.clone());
                            } else {
                                failed.lock().unwrap().insert(data.clone());
                            }
                        }
                        // Records past the accepted ones were not appended.
                        unknown.fetch_add((recs.len() - res.len()) as u64, Ordering::Relaxed);
                    }
                    Err(ClientError::Indeterminate { .. }) => {
                        // The leader died with these in flight: their outcome is unknown
                        // (as after a crash), so they are neither counted nor retried.
                        unknown.fetch_add(recs.len() as u64, Ordering::Relaxed);
                    }
                    Err(e) => panic!("writer {w}: {e}"),
                }
                done.fetch_add(BATCH as u64, Ordering::Relaxed);
            }
        }));
    }
    // Kill the leader a third of the way in.
    while done.load(Ordering::Relaxed) < (TOTAL / 3) as u64 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let li = nodes.iter().position(|n| n.id == leader).unwrap();
    nodes[li].kill9();
    let survivors: Vec<String> = nodes
        .iter()
        .filter(|n| n.id != leader)
        .map(|n| n.api.clone())
        .collect();
    let new_leader = leader_of(&survivors, Duration::from_secs(20)).await;
    assert_ne!(new_leader, leader);
    for t in tasks {
        t.await.unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let committed = committed.lock().unwrap().clone();
    let failed = failed.lock().unwrap().clone();
    eprintln!(
        "committed {}, failed {}, unknown {}",
        committed.len(),
        failed.len(),
        unknown.load(Ordering::Relaxed)
    );
    assert!(
        committed.len() >= TOTAL * 9 / 10,
        "too few commits: {}",
        committed.len()
    );

    // Every committed record is on every survivor at its LSN, in the same order; nothing
    // reported failed is in the log; the survivors' logs are identical.
    let mut logs = Vec::new();
    let target = {
        let mut m = 0;
        for ep in &survivors {
            m = m.max(committed_end(ep).await);
        }
        m
    };
    for ep in &survivors {
        let end = Instant::now() + Duration::from_secs(20);
        while committed_end(ep).await < target {
            assert!(Instant::now() < end, "{ep} does not catch up");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Its committed end may run ahead of its own log for a moment: wait for the log.
        let max_lsn = committed.keys().next_back().copied().unwrap_or(0);
        let recs = loop {
            let recs = read_all(ep).await;
            if recs.last().is_some_and(|r| r.lsn >= max_lsn) {
                break recs;
            }
            assert!(Instant::now() < end, "{ep} does not catch up");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let by_lsn: HashMap<u64, &Vec<u8>> = recs.iter().map(|r| (r.lsn, &r.data)).collect();
        for (lsn, d) in &committed {
            assert_eq!(by_lsn.get(lsn), Some(&d), "{ep}: committed record at {lsn}");
        }
        for r in &recs {
            assert!(!failed.contains(&r.data), "{ep}: failed record in the log");
        }
        logs.push(recs);
    }
    let n = logs.iter().map(|l| l.len()).min().unwrap();
    for l in &logs[1..] {
        assert_eq!(&l[..n], &logs[0][..n], "survivors' logs differ");
    }

    // The killed node restarts and catches up.
    nodes[li].start();
    let killed = nodes[li].api.clone();
    let end = Instant::now() + Duration::from_secs(30);
    while committed_end(&killed).await < target {
        assert!(Instant::now() < end, "restarted node does not catch up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Caught up means its log holds what the survivors had (the committed end it knows
    // may run ahead of its own log while it catches up).
    let recs = loop {
        let recs = read_all(&killed).await;
        if recs.len() >= n {
            break recs;
        }
        assert!(Instant::now() < end, "restarted node does not catch up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(&recs[..n], &logs[0][..n]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_over_the_wire_leaves_the_node_serving() {
    let root = tempfile::tempdir().unwrap();
    let nodes = cluster(root.path(), 3);
    let eps: Vec<String> = nodes.iter().map(|n| n.api.clone()).collect();
    let leader = leader_of(&eps, Duration::from_secs(20)).await;
    let repl = nodes[0].repl.clone();
    let api = nodes[0].api.trim_start_matches("http://").to_string();
    tokio::task::spawn_blocking(move || {
        use std::io::Read;
        use std::net::TcpStream;
        // Garbage on the replication port, an oversized frame header, a client speaking
        // HTTP/1 to the replication port, and garbage on the gRPC port.
        let mut oversized = Vec::new();
        oversized.extend_from_slice(&0x5752_4843u32.to_le_bytes());
        oversized.extend_from_slice(&[1, 0, 2, 0]);
        oversized.extend_from_slice(&u32::MAX.to_le_bytes());
        oversized.extend_from_slice(&[0u8; 8]);
        for (addr, bytes) in [
            (&repl, b"\x00\xffgarbage garbage garbage garbage".to_vec()),
            (&repl, oversized),
            (&repl, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()),
            (&api, b"\x16\x03\x01 definitely not http2".to_vec()),
        ] {
            let mut s = TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let _ = s.write_all(&bytes);
            let mut buf = [0u8; 64];
            // The node closes the connection (or answers an error), it does not hang.
            let _ = s.read(&mut buf);
        }
    })
    .await
    .unwrap();
    // An unknown group is a clear NOT_FOUND; the cluster still serves appends.
    let mut c = Client::new(eps.clone());
    match c.read(999, 0, 1).await {
        Err(ClientError::Status { code, message, .. }) => {
            assert_eq!(code, tonic::Code::NotFound);
            assert!(message.contains("999"), "{message}");
        }
        other => panic!("unknown group: {other:?}"),
    }
    // A follower's Tail, opened at its committed end, carries the next record once it
    // commits (the stream waits on the committed end) — even when that is later than
    // the client's call timeout, which bounds only the stream's opening.
    let follower = nodes.iter().find(|n| n.id != leader).unwrap().api.clone();
    let end = committed_end(&follower).await;
    let mut tailer = Client::new(vec![follower]);
    tailer.call_timeout = Duration::from_millis(500);
    let mut tail = tailer.tail(1, end).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let r = c
        .append(1, vec![b"still serving".to_vec()], 0)
        .await
        .unwrap();
    assert_eq!(r[0].outcome, pb::Outcome::Committed as i32);
    bad_reads_and_appends_get_their_codes(&eps, leader, r[0].lsn).await;
    let got = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let m = tail.message().await.unwrap().expect("the stream ended");
            if let Some(rec) = m.records.into_iter().find(|r| r.data == b"still serving") {
                return rec;
            }
        }
    })
    .await
    .expect("Tail did not carry the record within 10 s");
    assert!(
        got.lsn >= end,
        "{} below the end {end} the tail began at",
        got.lsn
    );
    // The replication listener counted the bad connections and kept running.
    let mut st = Client::new(vec![nodes[0].api.clone()]);
    assert!(st.status_all(1).await[0].1.is_ok());
    // And, on the same running cluster, `chorus trim`.
    trim_with_the_cli(root.path(), &nodes).await;
}

/// On every node of group 1: a Read past the committed end is OUT_OF_RANGE and one from
/// inside a record (`lsn + 1`, `lsn` a record) NOT_FOUND, never an empty or shifted
/// answer; an Append of no records is INVALID_ARGUMENT, followers included; a follower's
/// refusal names the leader as a node, not in Rust's notation.
async fn bad_reads_and_appends_get_their_codes(eps: &[String], leader: u64, lsn: u64) {
    // Nothing else appends meanwhile: once every node knows the leader's committed end,
    // the ends stay put.
    let end = committed_end(&eps[(leader - 1) as usize]).await;
    for ep in eps {
        let t = Instant::now();
        while committed_end(ep).await != end {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "{ep} never reached {end}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    for (i, ep) in eps.iter().enumerate() {
        let mut c = Client::new(vec![ep.clone()]);
        let mut raw = c.conn(0).await.unwrap();
        let read = |from: u64| pb::ReadRequest {
            group: 1,
            from_lsn: from,
            max_records: 1,
            ..Default::default()
        };
        let e = raw.read(read(end + 1)).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::OutOfRange, "{ep}: {e:?}");
        assert!(e.message().contains(&format!("{}", end + 1)), "{e:?}");
        // At the end: empty, as a poller expects.
        let at_end = raw.read(read(end)).await.unwrap().into_inner();
        assert!(at_end.records.is_empty(), "{ep}: {at_end:?}");
        if lsn < end {
            let e = raw.read(read(lsn + 1)).await.unwrap_err();
            assert_eq!(e.code(), tonic::Code::NotFound, "{ep}: {e:?}");
            assert!(e.message().contains("not the start of a record"), "{e:?}");
            let ok = raw.read(read(lsn)).await.unwrap().into_inner();
            assert_eq!(ok.records[0].lsn, lsn, "{ep}");
        }
        let e = raw
            .append(pb::AppendRequest {
                group: 1,
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{ep}: {e:?}");
        if i as u64 + 1 != leader {
            let e = raw
                .append(pb::AppendRequest {
                    group: 1,
                    records: vec![b"to a follower".to_vec()],
                    ..Default::default()
                })
                .await
                .unwrap_err();
            assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{ep}: {e:?}");
            assert!(
                !e.message().contains("Some(") && !e.message().contains("None"),
                "{e:?}"
            );
        }
    }
}

/// The `chorus` binary with `args`: exit code, stdout, stderr.
fn chorus_cli(args: &[&str]) -> (Option<i32>, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_chorus"))
        .args(args)
        .env_remove("CHORUS_ENDPOINTS")
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `chorus trim` on a running 3-node cluster (4 MiB blocks): with 10 MiB of records, a
/// trim below a record in the middle of the second block trims every node and reports
/// each one's new log start, the second block's (the first block kept): the first block
/// file is deleted everywhere, the second kept; reads below the start are refused as
/// trimmed, while the records from it on (those below L in the kept block included) are
/// still read, and appends go on. An LSN beyond the committed end is refused by every
/// node, naming its committed end (exit 4); a node that cannot be reached is reported by
/// name while the others are still trimmed (exit 3).
async fn trim_with_the_cli(root: &Path, nodes: &[Node]) {
    const BLOCK: u64 = 4 << 20;
    let eps: Vec<String> = nodes.iter().map(|n| n.api.clone()).collect();
    let mut c = Client::new(eps.clone());
    c.leader_timeout = Duration::from_secs(20);
    let mut lsns = Vec::new();
    for b in 0..20u8 {
        let r = c.append(1, vec![vec![b; 64 << 10]; 8], 0).await.unwrap();
        assert!(r.iter().all(|r| r.outcome == pb::Outcome::Committed as i32));
        lsns.extend(r.iter().map(|r| r.lsn));
    }
    assert!(*lsns.last().unwrap() > 2 * BLOCK, "{lsns:?}");
    // The first record at or past the middle of the second block.
    let at = lsns.iter().position(|&l| l >= BLOCK + BLOCK / 2).unwrap();
    let (lsn, below) = (lsns[at], lsns[at - 1]);
    let first = lsns[0];
    assert!(first < BLOCK && below >= BLOCK, "{first} {below}");
    // Every node must hold L committed before it may trim below it.
    let end = Instant::now() + Duration::from_secs(20);
    for ep in &eps {
        while committed_end(ep).await <= lsn {
            assert!(Instant::now() < end, "{ep} does not catch up");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let list = eps.join(",");
    let l = lsn.to_string();
    let (code, out, err) = chorus_cli(&["trim", "--endpoints", &list, "--lsn", &l, "-o", "json"]);
    assert_eq!(code, Some(0), "{out}{err}");
    let rows: serde_json::Value = serde_json::from_str(&out).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 3, "{out}");
    for (r, ep) in rows.iter().zip(&eps) {
        assert_eq!(r["endpoint"], ep.as_str(), "{out}");
        assert_eq!(r["result"], "trimmed", "{out}");
        assert_eq!(r["start_lsn_before"].as_u64(), Some(0), "{out}");
        assert_eq!(r["start_lsn"].as_u64(), Some(BLOCK), "{out}");
        assert!(r["committed_lsn"].as_u64().unwrap() > lsn, "{out}");
    }
    // Whole block files below L are gone, the one holding L is kept.
    for n in nodes {
        let log = root
            .join(format!("n{}", n.id))
            .join("groups")
            .join(format!("{:020}", 1))
            .join("log");
        assert!(
            !log.join(format!("{:020}.blk", 0)).exists(),
            "node {}",
            n.id
        );
        assert!(log.join(format!("{:020}.blk", 1)).exists(), "node {}", n.id);
    }
    // Below the start: trimmed, on every node; from the start on, the records are there.
    let kept = lsns.iter().position(|&l| l >= BLOCK).unwrap();
    for ep in &eps {
        let mut one = Client::new(vec![ep.clone()]);
        for from in [first, lsns[kept - 1]] {
            match one.read(1, from, 1).await {
                Err(ClientError::Status { code, message, .. }) => {
                    assert_eq!(code, tonic::Code::OutOfRange, "{ep}: {message}");
                    assert!(
                        message.contains("trimmed")
                            && message.contains(&format!("starts at {BLOCK}")),
                        "{ep}: {message}"
                    );
                }
                other => panic!("{ep}: read at {from} after the trim: {other:?}"),
            }
        }
        let r = one.read(1, BLOCK, 1).await.unwrap();
        assert_eq!(r.records[0].lsn, lsns[kept], "{ep}");
        let r = one.read(1, below, 1).await.unwrap();
        assert_eq!(r.records[0].lsn, below, "{ep}");
        let r = one.read(1, lsn, 2).await.unwrap();
        assert_eq!(r.records[0].lsn, lsn, "{ep}");
        assert_eq!(r.records[0].data, vec![(at / 8) as u8; 64 << 10], "{ep}");
        assert_eq!(r.records[1].lsn, lsns[at + 1], "{ep}");
    }
    // `chorus read` from 0 says so too.
    let (code, _, err) = chorus_cli(&["read", "--endpoints", &list, "--from", "0"]);
    assert_eq!(code, Some(4), "{err}");
    assert!(err.contains("trimmed"), "{err}");
    // Appends go on after a trim.
    let r = c
        .append(1, vec![b"after the trim".to_vec()], 0)
        .await
        .unwrap();
    assert_eq!(r[0].outcome, pb::Outcome::Committed as i32);

    // Beyond the committed end: every node refuses, naming its committed end; exit 4.
    let beyond = (lsns.last().unwrap() + (1 << 30)).to_string();
    let (code, out, err) = chorus_cli(&["trim", "--endpoints", &list, "--lsn", &beyond]);
    assert_eq!(code, Some(4), "{out}{err}");
    for ep in &eps {
        let row = out
            .lines()
            .find(|l| l.starts_with(ep.trim_start_matches("http://")))
            .unwrap_or_else(|| panic!("no row for {ep}: {out}"));
        assert!(
            row.contains("refused (OutOfRange)")
                && row.contains(&format!("LSN {beyond}"))
                && row.contains("committed end"),
            "{row}"
        );
    }
    assert!(
        err.contains("not trimmed below LSN") && err.contains("3 of 3"),
        "{err}"
    );

    // One endpoint with nothing listening: named unreachable, the others trimmed (again
    // at L: nothing more to delete), exit 3.
    let dead = format!("127.0.0.1:{}", free_port());
    let list = format!("{list},{dead}");
    let (code, out, err) = chorus_cli(&["trim", "--endpoints", &list, "--lsn", &l]);
    assert_eq!(code, Some(3), "{out}{err}");
    let rows: Vec<&str> = out.lines().skip(1).collect();
    assert_eq!(rows.len(), 4, "{out}");
    for row in &rows[..3] {
        assert!(
            row.contains(&format!(
                "trimmed: log starts at {BLOCK} (unchanged: no whole block left below LSN {lsn}), committed end"
            )),
            "{out}"
        );
    }
    assert!(
        rows[3].starts_with(&dead) && rows[3].contains("unreachable"),
        "{out}"
    );
    assert!(err.contains("1 of 4"), "{err}");
}

/// Membership change under load through the CLI-facing API: node 4 joins as a learner
/// while writers append, is promoted, and a voter is removed; then that removed node's
/// data directory is wiped and it rejoins as a new learner and catches up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_change_under_load_and_a_wiped_node_rejoins() {
    let root = tempfile::tempdir().unwrap();
    let mut nodes = cluster(root.path(), 3);
    let eps: Vec<String> = nodes.iter().map(|n| n.api.clone()).collect();
    let leader = leader_of(&eps, Duration::from_secs(20)).await;

    // A fourth node, started with no groups: it creates group 1 empty and learns the
    // membership from the leader once added.
    let (api4, repl4) = (free_port(), free_port());
    let peers: String = nodes
        .iter()
        .map(|n| format!("\"{}\" = \"{}\"\n", n.id, n.repl))
        .collect();
    let cfg4 = root.path().join("n4.toml");
    std::fs::write(
        &cfg4,
        format!(
            "node = 4\ndata_dir = \"{}\"\nlisten = \"127.0.0.1:{repl4}\"\napi_listen = \"127.0.0.1:{api4}\"\n\
             io_workers = 2\n\n[peers]\n{peers}\n[replica]\nlease_ms = 1000\nheartbeat_ms = 100\nping_ms = 100\nresend_ms = 200\n\n[log]\nblock_size = 4194304\n",
            root.path().join("n4").display()
        ),
    )
    .unwrap();
    let mut n4 = Node {
        id: 4,
        api: format!("http://127.0.0.1:{api4}"),
        repl: format!("127.0.0.1:{repl4}"),
        server: Server::new(cfg4, root.path().join("n4.log")),
    };
    n4.start();
    let mut c4 = Client::new(vec![n4.api.clone()]);
    let end = Instant::now() + Duration::from_secs(10);
    while c4.create_group(1, vec![], vec![]).await.is_err() {
        assert!(Instant::now() < end, "node 4 does not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Load from 8 writers for the whole change.
    let stop = Arc::new(AtomicBool::new(false));
    let committed = Arc::new(AtomicU64::new(0));
    let mut writers = Vec::new();
    for w in 0..8 {
        let (eps, stop, committed) = (eps.clone(), stop.clone(), committed.clone());
        writers.push(tokio::spawn(async move {
            let mut c = Client::new(eps);
            c.leader_timeout = Duration::from_secs(30);
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                match c.append(1, vec![format!("m{w}-{i}").into_bytes()], 0).await {
                    Ok(r) if r[0].outcome == pb::Outcome::Committed as i32 => {
                        committed.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(_) | Err(ClientError::Indeterminate { .. }) => {}
                    Err(e) => panic!("{e}"),
                }
            }
        }));
    }
    let all = {
        let mut v = eps.clone();
        v.push(n4.api.clone());
        v
    };
    let mut admin = Client::new(all.clone());
    let change = |kind: pb::ChangeKind, node: u64, addr: &str| pb::ChangeMembershipRequest {
        group: 1,
        kind: kind as i32,
        node,
        old_node: 0,
        node_addr: addr.to_string(),
        force: false,
    };
    retry_change(&mut admin, change(pb::ChangeKind::AddLearner, 4, &n4.repl)).await;
    wait_members(&mut admin, |g| g.learners.contains(&4)).await;
    // Promote once caught up (the leader refuses a learner that lags).
    retry_change(&mut admin, change(pb::ChangeKind::Promote, 4, "")).await;
    wait_members(&mut admin, |g| g.voters.contains(&4)).await;
    let leaving = (1..=3).find(|n| *n != leader).unwrap();
    retry_change(&mut admin, change(pb::ChangeKind::Remove, leaving, "")).await;
    wait_members(&mut admin, |g| !g.voters.contains(&leaving)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    assert!(
        committed.load(Ordering::Relaxed) > 100,
        "load kept committing"
    );

    // DeleteGroup: a voter's replica is refused by name; the removed node's replica is
    // deleted (with force: it may not have learnt its removal) and is gone from it.
    let li = nodes.iter().position(|n| n.id == leaving).unwrap();
    let lead_api = nodes.iter().find(|n| n.id == leader).unwrap().api.clone();
    let mut one = Client::new(vec![lead_api, nodes[li].api.clone()]);
    let err = one.delete_group(0, 1, false).await.unwrap_err().to_string();
    assert!(err.contains("is one of its voters"), "{err}");
    one.delete_group(1, 1, true).await.unwrap();
    let st = one.status_all(1).await.remove(1).1;
    assert!(st.is_err(), "group 1 still at node {leaving}: {st:?}");

    // The removed node's directory is wiped; it comes back empty and rejoins as a new
    // learner (it lost its promises, so it must not return as its old voting self).
    nodes[li].kill9();
    std::fs::remove_dir_all(root.path().join(format!("n{leaving}"))).unwrap();
    // Restart without the bootstrap group: drop `[[groups]]` from its config.
    let cfg = std::fs::read_to_string(&nodes[li].cfg).unwrap();
    let cfg = cfg.split("[[groups]]").next().unwrap().to_string()
        + &cfg[cfg.find("[replica]").unwrap()..];
    std::fs::write(&nodes[li].cfg, cfg).unwrap();
    nodes[li].start();
    let mut cw = Client::new(vec![nodes[li].api.clone()]);
    let end = Instant::now() + Duration::from_secs(10);
    while cw.create_group(1, vec![], vec![]).await.is_err() {
        assert!(Instant::now() < end, "wiped node does not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    retry_change(
        &mut admin,
        change(pb::ChangeKind::AddLearner, leaving, &nodes[li].repl.clone()),
    )
    .await;
    let target = {
        let mut m = 0;
        for ep in &all {
            m = m.max(committed_end(ep).await);
        }
        m
    };
    let end = Instant::now() + Duration::from_secs(30);
    while committed_end(&nodes[li].api).await < target {
        assert!(Instant::now() < end, "wiped node does not catch up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let lead_ep = {
        let l = leader_of(&all, Duration::from_secs(10)).await;
        all.iter()
            .find(|e| nodes.iter().any(|n| n.id == l && &&n.api == e) || (l == 4 && **e == n4.api))
            .unwrap()
            .clone()
    };
    let a = read_all(&lead_ep).await;
    // Its committed end can run ahead of its own log while it catches up: wait for the log.
    let want = a.iter().filter(|r| r.lsn < target).count();
    assert!(want > 0);
    let b = loop {
        let b = read_all(&nodes[li].api).await;
        if b.len() >= want {
            break b;
        }
        assert!(Instant::now() < end, "wiped node's log does not catch up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(&a[..want], &b[..want], "the rejoined node's log differs");
}

/// Asks for a membership change, retrying while it cannot be taken yet: a previous change
/// is in progress (ABORTED), the leadership moves (not the leader, or no leader found), or
/// a learner to promote has not caught up or not yet answered the leader (the strict
/// check's "not heard from within the lease", as `chorus member add` waits it out). Any
/// other error fails the test at once.
async fn retry_change(c: &mut Client, req: pb::ChangeMembershipRequest) {
    use chorus_client::ClientError;
    use tonic::Code;
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        match c.change_membership(req.clone()).await {
            Ok(()) => return,
            Err(e) => {
                let retry = match &e {
                    ClientError::Status { code, message, .. } => {
                        (*code == Code::Aborted && message.contains("in progress"))
                            || (*code == Code::FailedPrecondition
                                && message.contains("not the leader"))
                            || (*code == Code::InvalidArgument
                                && message.contains("has not caught up"))
                            || (*code == Code::FailedPrecondition
                                && matches!(req.kind(), pb::ChangeKind::Promote)
                                && message.contains("has not been heard from"))
                    }
                    ClientError::NoLeader { .. } => true,
                    _ => false,
                };
                assert!(retry, "{req:?}: {e}");
                assert!(
                    Instant::now() < end,
                    "{req:?}: still refused after 20 s: {e}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn wait_members(c: &mut Client, f: impl Fn(&pb::GroupStatus) -> bool) {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        for (_, r) in c.status_all(1).await {
            if let Ok(s) = r {
                if s.groups.iter().any(|g| g.role == "leader" && f(g)) {
                    return;
                }
            }
        }
        assert!(Instant::now() < end, "membership change not accepted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The operator's strict check (etcd's strict reconfiguration check), through the CLI and
/// the API against three real servers: `chorus member add` of a node that does not exist
/// joins it as a learner, finds it never catches up, removes it again and fails by name; a
/// voter added directly is refused FAILED_PRECONDITION (not tried at other nodes); with a
/// follower killed, removing the other follower (the group would stop) and a transfer to
/// the dead one are refused, and removing the dead one is accepted. The membership is
/// unchanged by every refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_strict_check_refuses_changes_that_would_cost_availability() {
    use std::process::Command;
    let root = tempfile::tempdir().unwrap();
    let mut nodes = cluster(root.path(), 3);
    let eps: Vec<String> = nodes.iter().map(|n| n.api.clone()).collect();
    let leader = leader_of(&eps, Duration::from_secs(20)).await;
    let cli = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_chorus"))
            .args(args)
            .args(["--endpoints", &eps.join(",")])
            .output()
            .unwrap();
        (
            out.status.code(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let mut admin = Client::new(eps.clone());
    let same = |g: &pb::GroupStatus| g.voters == vec![1, 2, 3] && g.learners.is_empty();

    let (code, text) = cli(&["member", "add", "--node", "9", "--catch-up", "3"]);
    assert_ne!(code, Some(0), "{text}");
    assert!(
        text.contains("did not catch up") && text.contains("removed again"),
        "{text}"
    );
    wait_members(&mut admin, same).await;

    let direct = pb::ChangeMembershipRequest {
        group: 1,
        kind: pb::ChangeKind::AddVoter as i32,
        node: 9,
        ..Default::default()
    };
    match admin.change_membership(direct).await {
        Err(ClientError::Status { code, message, .. }) => {
            assert_eq!(code, tonic::Code::FailedPrecondition, "{message}");
            assert!(message.contains("holding none of the log"), "{message}");
        }
        other => panic!("a voter added directly: {other:?}"),
    }

    let followers: Vec<u64> = (1..=3).filter(|n| *n != leader).collect();
    let (dead, live) = (followers[0], followers[1]);
    nodes.iter_mut().find(|n| n.id == dead).unwrap().kill9();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let (code, text) = cli(&["member", "remove", "--node", &live.to_string()]);
    assert_ne!(code, Some(0), "{text}");
    assert!(text.contains("fewer than a majority"), "{text}");
    let (code, text) = cli(&["leader", "transfer", "--to", &dead.to_string()]);
    assert_ne!(code, Some(0), "{text}");
    assert!(text.contains("has not been heard from"), "{text}");
    wait_members(&mut admin, same).await;
    let (code, text) = cli(&["member", "remove", "--node", &dead.to_string()]);
    assert_eq!(code, Some(0), "{text}");
    wait_members(&mut admin, |g| !g.voters.contains(&dead)).await;
}

/// One `chorus server` with two ordered groups; group 2's meta record damaged in both
/// slots while the node is down. The node starts and serves group 1; group 2 is reported
/// not started, by name, in `Status`, in its refusals and in the metrics, its files kept
/// as found; deleting it takes force (its membership here is unknown), and after that a
/// restart creates it again, empty, from the configuration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_ordered_group_stops_only_itself() {
    let root = tempfile::tempdir().unwrap();
    let (api, repl, metrics) = (free_port(), free_port(), free_port());
    let cfg = root.path().join("n1.toml");
    let data = root.path().join("n1");
    std::fs::write(
        &cfg,
        format!(
            "node = 1\ndata_dir = \"{}\"\nlisten = \"127.0.0.1:{repl}\"\napi_listen = \"127.0.0.1:{api}\"\n\
             metrics_listen = \"127.0.0.1:{metrics}\"\nio_workers = 2\nlog_filter = \"info\"\n\n\
             [[groups]]\nid = 1\nvoters = [1]\n\n[[groups]]\nid = 2\nvoters = [1]\n\n\
             [replica]\nlease_ms = 1000\nheartbeat_ms = 100\nping_ms = 100\nresend_ms = 200\n\n\
             [log]\nblock_size = 4194304\n",
            data.display()
        ),
    )
    .unwrap();
    let mut node = Server::new(cfg, root.path().join("n1.log"));
    node.start();
    let eps = vec![format!("127.0.0.1:{api}")];
    let mut c = Client::new(eps.clone());
    c.leader_timeout = Duration::from_secs(20);
    for g in [1, 2] {
        let r = c
            .append(g, vec![format!("in {g}").into_bytes()], 0)
            .await
            .unwrap();
        assert_eq!(r[0].outcome, pb::Outcome::Committed as i32);
    }
    node.kill9();
    let meta = data.join("groups").join(format!("{:020}", 2)).join("meta");
    let len = std::fs::metadata(&meta).unwrap().len() as usize;
    std::fs::write(&meta, vec![0x5A; len]).unwrap();
    node.start();
    let end = Instant::now() + Duration::from_secs(20);
    let st = loop {
        if let Ok(s) = &c.status_all(0).await[0].1 {
            break s.clone();
        }
        assert!(Instant::now() < end, "the node did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let g2 = st
        .groups
        .iter()
        .find(|g| g.group == 2)
        .expect("group 2 listed");
    assert!(
        g2.stopped.contains("damaged") && g2.stopped.contains(&meta.display().to_string()),
        "{g2:?}"
    );
    assert_eq!(g2.mode, "ordered");
    let r = c
        .append(1, vec![b"group 1 serves".to_vec()], 0)
        .await
        .unwrap();
    assert_eq!(r[0].outcome, pb::Outcome::Committed as i32);
    c.leader_timeout = Duration::from_secs(1);
    let err = c.append(2, vec![b"x".to_vec()], 0).await.unwrap_err();
    assert!(err.to_string().contains("damaged"), "{err}");
    let text = metrics_page(metrics).await;
    assert!(
        text.contains("chorus_group_not_started{node=\"1\",group=\"2\",mode=\"ordered\"} 1"),
        "{text}"
    );
    assert_eq!(
        std::fs::read(&meta).unwrap(),
        vec![0x5A; len],
        "the damaged file was changed"
    );
    let err = c.delete_group(0, 2, false).await.unwrap_err();
    assert!(err.to_string().contains("pass force"), "{err}");
    c.delete_group(0, 2, true).await.unwrap();
    assert!(!meta.parent().unwrap().exists());
    node.kill9();
    node.start();
    // Wait until the restarted node answers: an append sent while it is still starting
    // ends Indeterminate (the client cannot know whether it landed).
    let end = Instant::now() + Duration::from_secs(20);
    while c.status_all(0).await[0].1.is_err() {
        assert!(Instant::now() < end, "the restarted node does not answer");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    c.leader_timeout = Duration::from_secs(20);
    let r = c.append(2, vec![b"new 2".to_vec()], 0).await.unwrap();
    assert_eq!(r[0].outcome, pb::Outcome::Committed as i32);
}

/// The metrics page at `port`, over a plain TCP request (bounded).
async fn metrics_page(port: u16) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
            s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
                .await
                .unwrap();
            let mut out = String::new();
            let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut out)).await;
            if !out.is_empty() {
                return out;
            }
        }
        assert!(Instant::now() < end, "no metrics page on port {port}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A follower whose storage fails while it runs (its group's log directory is gone when
/// the log needs its next block file, as a write fails on a full disk) stops that group;
/// a client whose first endpoint is that node is told the append was not taken there
/// and goes on to the others, so the append commits instead of ending "outcome unknown".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_storage_failed_sends_clients_on() {
    let root = tempfile::tempdir().unwrap();
    let mut nodes = cluster(root.path(), 3);
    let eps: Vec<String> = nodes.iter().map(|n| n.api.clone()).collect();
    let leader = leader_of(&eps, Duration::from_secs(20)).await;
    let f = nodes.iter().find(|n| n.id != leader).unwrap();
    let (f_id, f_api) = (f.id, f.api.clone());
    let log_dir = root
        .path()
        .join(format!("n{f_id}"))
        .join("groups")
        .join(format!("{:020}", 1))
        .join("log");
    // The log directory goes away (its open block file stays writable): the follower's
    // group stops when it rolls to a new block file.
    let away = root.path().join(format!("n{f_id}-log-away"));
    std::fs::rename(&log_dir, &away).unwrap();
    // Fill past the 4 MiB block (bounded: 12 MiB) until the follower's group stops.
    let mut c = Client::new(eps.clone());
    c.leader_timeout = Duration::from_secs(20);
    let mut fc = Client::new(vec![f_api.clone()]);
    let end = Instant::now() + Duration::from_secs(60);
    let mut stopped = String::new();
    for _ in 0..24 {
        let batch = vec![vec![1u8; 64 << 10]; 8];
        c.append(1, batch, 0).await.unwrap();
        if let Ok(s) = &fc.status_all(1).await[0].1 {
            stopped = s.groups[0].stopped.clone();
        }
        if !stopped.is_empty() || Instant::now() > end {
            break;
        }
    }
    assert!(
        stopped.contains("storage"),
        "node {f_id} did not stop: {stopped:?}"
    );
    // The stopped node first: refused as not taken, then sent on.
    let mut order = vec![f_api.clone()];
    order.extend(eps.iter().filter(|e| **e != f_api).cloned());
    let mut c = Client::new(order);
    c.leader_timeout = Duration::from_secs(20);
    let r = c
        .append(1, vec![b"after the failure".to_vec()], 0)
        .await
        .unwrap();
    assert_eq!(r[0].outcome, pb::Outcome::Committed as i32);
    // Alone, the stopped node says why and that nothing was taken.
    fc.leader_timeout = Duration::from_secs(1);
    let err = fc.append(1, vec![b"x".to_vec()], 0).await.unwrap_err();
    assert!(
        err.to_string().contains("not taken") && !matches!(err, ClientError::Indeterminate { .. }),
        "{err}"
    );

    // The cause fixed, `chorus group restart` starts the group again on that node only:
    // it recovers its log and catches up with the others.
    std::fs::rename(&away, &log_dir).unwrap();
    let restart = |g: &str| {
        chorus_cli(&[
            "group",
            "restart",
            "--endpoints",
            &f_api,
            "--at",
            "0",
            "-g",
            g,
        ])
    };
    let (code, out, err) = restart("1");
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("restarted"), "{out}");
    let r = c
        .append(1, vec![b"after the restart".to_vec()], 0)
        .await
        .unwrap();
    assert_eq!(r[0].outcome, pb::Outcome::Committed as i32);
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let s = fc.status_all(1).await.remove(0).1.unwrap();
        assert!(s.groups[0].stopped.is_empty(), "{:?}", s.groups[0].stopped);
        if s.groups[0].committed_lsn > r[0].lsn {
            break;
        }
        assert!(
            Instant::now() < end,
            "the restarted replica never caught up"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Running now: a second restart is refused by name (exit 4), and an unknown group
    // is not found.
    let (code, out, err) = restart("1");
    assert_eq!(code, Some(4), "{out}{err}");
    assert!(err.contains("only a stopped group is restarted"), "{err}");
    let (code, _, err) = restart("77");
    assert_ne!(code, Some(0), "{err}");
    assert!(err.contains("77"), "{err}");
    for n in &mut nodes {
        n.kill9();
    }
}

/// `[log] min_free_bytes` above the disk's free space: a leader refuses appends to an
/// ordered and to an out-of-order group alike, RESOURCE_EXHAUSTED naming the free space
/// and the setting, with nothing appended; the node keeps serving (status, reads) and
/// its metrics say the disk is low.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_on_a_low_disk_refuses_appends_by_name() {
    let root = tempfile::tempdir().unwrap();
    let (api, repl, metrics) = (free_port(), free_port(), free_port());
    let cfg = root.path().join("n1.toml");
    std::fs::write(
        &cfg,
        format!(
            "node = 1\ndata_dir = \"{}\"\nlisten = \"127.0.0.1:{repl}\"\napi_listen = \"127.0.0.1:{api}\"\n\
             metrics_listen = \"127.0.0.1:{metrics}\"\nio_workers = 2\nlog_filter = \"info\"\n\n\
             [[groups]]\nid = 1\nvoters = [1]\n\n\
             [[groups]]\nid = 2\nvoters = [1]\nmode = \"dependent\"\n\n\
             [replica]\nlease_ms = 1000\nheartbeat_ms = 100\nping_ms = 100\nresend_ms = 200\n\n\
             [log]\nblock_size = 4194304\nmin_free_bytes = {}\n",
            root.path().join("n1").display(),
            i64::MAX
        ),
    )
    .unwrap();
    let mut node = Server::new(cfg, root.path().join("n1.log"));
    node.start();
    let mut c = Client::new(vec![format!("127.0.0.1:{api}")]);
    c.leader_timeout = Duration::from_secs(20);
    let end = Instant::now() + Duration::from_secs(20);
    let refused = loop {
        match c.append(1, vec![b"x".to_vec()], 0).await {
            Err(ClientError::Status {
                code: tonic::Code::ResourceExhausted,
                message,
                ..
            }) => break message,
            other => {
                assert!(Instant::now() < end, "never refused: {other:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    assert!(
        refused.contains("min_free_bytes") && refused.contains("nothing appended"),
        "{refused}"
    );
    let rec = pb::OutOfOrderRecord {
        read_set: vec![1],
        write_set: vec![2],
        data: b"v".to_vec(),
        ..Default::default()
    };
    let end = Instant::now() + Duration::from_secs(20);
    let refused = loop {
        match c.append_out_of_order(2, vec![rec.clone()]).await {
            Err(ClientError::Status {
                code: tonic::Code::ResourceExhausted,
                message,
                ..
            }) => break message,
            other => {
                assert!(Instant::now() < end, "never refused: {other:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    assert!(refused.contains("min_free_bytes"), "{refused}");
    let st = c.status_all(1).await;
    let st = st[0].1.as_ref().unwrap();
    assert!(st.groups[0].stopped.is_empty());
    assert!(st.disk_low && st.min_free_bytes == i64::MAX as u64 && st.disk_free_bytes > 0);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_chorus"))
        .args(["status", "--endpoints", &format!("127.0.0.1:{api}")])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("DISK LOW") && text.contains("refuse appends"),
        "{text}"
    );
    assert_eq!(c.read(1, 0, 10).await.unwrap().records.len(), 0);
    let text = metrics_page(metrics).await;
    assert!(text.contains("chorus_disk_low{node=\"1\"} 1"), "{text}");
    node.kill9();
}

/// Committed records of `group` at one endpoint.
async fn read_group(ep: &str, group: u64) -> Vec<pb::Record> {
    let mut c = Client::new(vec![ep.to_string()]);
    let mut out = Vec::new();
    let mut from = 0;
    loop {
        let r = c.read(group, from, 10_000).await.unwrap();
        if r.records.is_empty() {
            return out;
        }
        from = r.next_lsn;
        out.extend(r.records);
    }
}

/// A mirror (PALF section 5.2) with the CLI: group 2 created in access mode raw-write
/// refuses appends by name (exit 4), `chorus mirror` copies group 1's committed log into
/// it (same LSNs, CSNs and records on every node), a group of the wrong place is refused,
/// and after `chorus group access-mode --mode append` (failover) it takes appends that
/// continue its log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_copies_its_primary_and_fails_over_with_the_cli() {
    let root = tempfile::tempdir().unwrap();
    let nodes = cluster(root.path(), 3);
    let eps: Vec<String> = nodes.iter().map(|n| n.api.clone()).collect();
    let joined = eps.join(",");
    leader_of(&eps, Duration::from_secs(20)).await;
    let (code, out, err) = chorus_cli(&[
        "group",
        "create",
        "-g",
        "2",
        "--voters",
        "1,2,3",
        "--access-mode",
        "raw-write",
        "--endpoints",
        &joined,
    ]);
    assert_eq!(code, Some(0), "{out}{err}");
    let mut c = Client::new(eps.clone());
    c.leader_timeout = Duration::from_secs(20);
    for i in 0..200u32 {
        let r = c
            .append(1, vec![format!("primary record {i}").into_bytes()], 0)
            .await
            .unwrap();
        assert_eq!(r[0].outcome, pb::Outcome::Committed as i32);
    }
    // An append to the mirror is refused by its leader, by name, and not retried.
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let (code, out, err) = chorus_cli(&["append", "-g", "2", "x", "--endpoints", &joined]);
        if code == Some(4) && err.contains("access mode is raw-write") {
            break;
        }
        // (Before the mirror's first leader is serving, appends find no leader.)
        assert!(
            Instant::now() < end,
            "append to a mirror: {code:?} {out}{err}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (code, out, err) = chorus_cli(&[
        "mirror",
        "--from",
        &joined,
        "--from-group",
        "1",
        "-g",
        "2",
        "--endpoints",
        &joined,
        "-o",
        "json",
    ]);
    assert_eq!(code, Some(0), "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let primary_end = v["end_lsn"].as_u64().unwrap();
    assert!(v["groups"].as_u64().unwrap() > 0, "{out}");
    assert!(v["committed_lsn"].as_u64().unwrap() >= primary_end, "{out}");
    let want: Vec<pb::Record> = read_group(&eps[0], 1)
        .await
        .into_iter()
        .filter(|r| r.lsn < primary_end)
        .collect();
    assert!(want.len() >= 200);
    for ep in &eps {
        let end = Instant::now() + Duration::from_secs(20);
        let got = loop {
            let got: Vec<pb::Record> = read_group(ep, 2)
                .await
                .into_iter()
                .filter(|r| r.lsn < primary_end)
                .collect();
            if got.len() == want.len() || Instant::now() > end {
                break got;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(got, want, "the mirror at {ep} holds the primary's records");
    }
    // A group that does not start at the mirror's end: OUT_OF_RANGE, naming both LSNs.
    let first = c.read_groups(1, 0, 1).await.unwrap().groups;
    match c.mirror(2, first).await {
        Err(ClientError::Status { code, message, .. }) => {
            assert_eq!(code, tonic::Code::OutOfRange, "{message}");
            assert!(message.contains("at LSN 0"), "{message}");
        }
        other => panic!("a misplaced group was mirrored: {other:?}"),
    }
    // Failover: the mirror becomes a primary and takes appends after the mirrored log.
    let (code, out, err) = chorus_cli(&[
        "group",
        "access-mode",
        "-g",
        "2",
        "--mode",
        "append",
        "--endpoints",
        &joined,
    ]);
    assert_eq!(code, Some(0), "{out}{err}");
    let end = Instant::now() + Duration::from_secs(20);
    let r = loop {
        match c.append(2, vec![b"after failover".to_vec()], 0).await {
            Ok(r) => break r,
            Err(e) => {
                assert!(Instant::now() < end, "no append after failover: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    assert_eq!(r[0].outcome, pb::Outcome::Committed as i32);
    assert!(r[0].lsn >= primary_end);
    assert!(r[0].csn > want.last().unwrap().csn);
    let (code, out, err) = chorus_cli(&["status", "-g", "2", "-o", "json", "--endpoints", &joined]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("\"access_mode\": \"append\""), "{out}");
    drop(nodes);
}
