//! Follower reads by CSN and the role stream (PALF sections 4.2 and 3.3) against three
//! real `chorus server` processes: a follower asked for the CSN an append just returned
//! answers with that record, at once or after catching up (a follower paused with
//! SIGSTOP while the record committed), by Read, Tail and the CLI; a follower cut off
//! from every other node (the leader and the third node paused) serves what it holds and
//! refuses a CSN past it with DEADLINE_EXCEEDED naming the group and both CSNs; the role
//! stream of every node, of an ordered and of an out-of-order group, starts with the
//! leader, shows a leader transfer and a killed leader's successor, and ends NOT_FOUND,
//! by name, when the group is deleted there.

use std::io::Write;
use std::process::Command;
use std::time::{Duration, Instant};

use chorus_client::{pb, AtCsn, Client, ClientError};
use tonic::Code;

mod common;
use common::{free_port, Server};

/// The ordered group.
const ORD: u64 = 1;
/// The dependent-mode (out-of-order) group.
const DEP: u64 = 3;

struct Cluster {
    nodes: Vec<Server>,
    eps: Vec<String>,
    _dir: tempfile::TempDir,
}

impl Cluster {
    /// Endpoint of node `id`.
    fn ep(&self, id: u64) -> String {
        self.eps[(id - 1) as usize].clone()
    }

    /// A client of node `id` alone.
    fn at(&self, id: u64) -> Client {
        Client::new(vec![self.ep(id)])
    }

    /// Sends `sig` to node `id`'s process.
    fn signal(&self, id: u64, sig: i32) {
        let pid = self.nodes[(id - 1) as usize]
            .child
            .as_ref()
            .expect("running")
            .id();
        assert_eq!(unsafe { libc::kill(pid as i32, sig) }, 0, "kill {pid}");
    }
}

fn cluster() -> Cluster {
    let dir = tempfile::tempdir().unwrap();
    let ports: Vec<[u16; 2]> = (0..3).map(|_| [free_port(), free_port()]).collect();
    let mut nodes = Vec::new();
    let mut eps = Vec::new();
    for i in 1..=3u64 {
        let [api, repl] = ports[(i - 1) as usize];
        let peers: String = (1..=3u64)
            .filter(|j| *j != i)
            .map(|j| format!("\"{j}\" = \"127.0.0.1:{}\"\n", ports[(j - 1) as usize][1]))
            .collect();
        let cfg = dir.path().join(format!("n{i}.toml"));
        let mut f = std::fs::File::create(&cfg).unwrap();
        write!(
            f,
            "node = {i}\ndata_dir = \"{}\"\nlisten = \"127.0.0.1:{repl}\"\napi_listen = \"127.0.0.1:{api}\"\n\
             io_workers = 2\nlog_filter = \"info\"\n\n[peers]\n{peers}\n\
             [[groups]]\nid = {ORD}\nvoters = [1, 2, 3]\n\n\
             [[groups]]\nid = {DEP}\nvoters = [1, 2, 3]\nmode = \"dependent\"\n\n\
             [replica]\nlease_ms = 1000\nheartbeat_ms = 100\nping_ms = 100\nresend_ms = 200\n\n\
             [out_of_order]\nelection_timeout_ms = 300\n",
            dir.path().join(format!("n{i}")).display(),
        )
        .unwrap();
        let mut n = Server::new(cfg, dir.path().join(format!("n{i}.log")));
        n.start();
        nodes.push(n);
        eps.push(format!("http://127.0.0.1:{api}"));
    }
    Cluster {
        nodes,
        eps,
        _dir: dir,
    }
}

/// The node that leads `group` among `ids` (and, out of order, serves); waits for one.
async fn leader(c: &Cluster, ids: &[u64], group: u64) -> u64 {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        for &id in ids {
            if let Ok(s) = &c.at(id).status_all(group).await[0].1 {
                if s.groups
                    .iter()
                    .any(|g| g.role == "leader" && (g.mode == "ordered" || g.serving))
                {
                    return id;
                }
            }
        }
        assert!(
            Instant::now() < end,
            "group {group}: no leader among {ids:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Appends `data` to the ordered group at its leader: its LSN and CSN.
async fn append(c: &Cluster, data: &str) -> (u64, u64) {
    let mut cl = Client::new(c.eps.clone());
    cl.leader_timeout = Duration::from_secs(20);
    let r = cl
        .append(ORD, vec![data.as_bytes().to_vec()], 0)
        .await
        .unwrap();
    assert_eq!(r[0].outcome, pb::Outcome::Committed as i32, "{r:?}");
    (r[0].lsn, r[0].csn)
}

/// Node `id`'s readable CSN of the ordered group, from its status.
async fn readable(c: &Cluster, id: u64) -> u64 {
    match &c.at(id).status_all(ORD).await[0].1 {
        Ok(s) => s.groups[0].readable_csn,
        Err(e) => panic!("node {id}: {e}"),
    }
}

fn chorus(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_chorus"))
        .env_remove("CHORUS_ENDPOINTS")
        .env_remove("CHORUS_TOKEN")
        .args(args)
        .output()
        .unwrap()
}

/// A follower asked for the CSN of an append the leader just answered answers with that
/// record: every time, at once after the append (Read, then Tail); after it was paused
/// while the record committed (it waits while it catches up); and through the CLI,
/// which prints the readable CSN.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_read_at_a_just_committed_csn_returns_the_record() {
    let c = cluster();
    let l = leader(&c, &[1, 2, 3], ORD).await;
    let followers: Vec<u64> = (1..=3).filter(|n| *n != l).collect();
    let wait = AtCsn::new(0, Duration::from_secs(10));
    // Read at once after each append, alternating followers.
    for i in 0..40 {
        let data = format!("rec-{i}");
        let (lsn, csn) = append(&c, &data).await;
        let f = followers[i % 2];
        let r = c
            .at(f)
            .read_at_csn(
                ORD,
                lsn,
                1,
                AtCsn {
                    min_csn: csn,
                    ..wait
                },
            )
            .await
            .unwrap_or_else(|e| panic!("node {f}, CSN {csn}: {e}"));
        assert_eq!(r.records.len(), 1, "node {f} at CSN {csn}: {r:?}");
        assert_eq!(
            (r.records[0].lsn, r.records[0].csn, &r.records[0].data[..]),
            (lsn, csn, data.as_bytes())
        );
        assert!(r.readable_csn >= csn, "node {f}: {r:?}");
    }
    // Tail from a follower with min_csn: the first message holds the record.
    let (lsn, csn) = append(&c, "tailed").await;
    let f = followers[0];
    let mut s = c
        .at(f)
        .tail_at_csn(
            ORD,
            lsn,
            AtCsn {
                min_csn: csn,
                ..wait
            },
        )
        .await
        .unwrap();
    let m = tokio::time::timeout(Duration::from_secs(10), s.message())
        .await
        .expect("a tail message")
        .unwrap()
        .expect("the stream goes on");
    assert_eq!(m.records[0].data, b"tailed");
    assert!(m.readable_csn >= csn);
    drop(s);
    // A follower paused while records commit: asked at once after it resumes, it answers
    // only once it holds the last of them.
    let f = followers[1];
    c.signal(f, libc::SIGSTOP);
    let mut last = (0, 0);
    for i in 0..20 {
        last = append(&c, &format!("while-paused-{i}")).await;
    }
    c.signal(f, libc::SIGCONT);
    let r = c
        .at(f)
        .read_at_csn(
            ORD,
            last.0,
            1,
            AtCsn {
                min_csn: last.1,
                ..wait
            },
        )
        .await
        .unwrap();
    assert_eq!(r.records[0].data, b"while-paused-19");
    assert!(readable(&c, f).await >= last.1);
    // The CLI: the record and the readable CSN it was read at.
    let (lsn, csn) = append(&c, "by-cli").await;
    let ep = c.ep(followers[0]);
    let o = chorus(&[
        "read",
        "--endpoints",
        &ep,
        "-g",
        "1",
        "--from",
        &lsn.to_string(),
        "--max",
        "1",
        "--min-csn",
        &csn.to_string(),
        "--wait",
        "5s",
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        out.contains("by-cli") && out.contains("readable CSN"),
        "{out}"
    );
    let o = chorus(&[
        "tail",
        "--endpoints",
        &ep,
        "-g",
        "1",
        "--from",
        &lsn.to_string(),
        "-o",
        "json",
        "--min-csn",
        &csn.to_string(),
        "--wait",
        "5s",
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert_eq!(v["data"], "by-cli");
    assert!(v["readable_csn"].as_u64().unwrap() >= csn, "{v}");
}

/// A follower cut off from every other node (the leader and the third node paused)
/// still serves what it holds, and refuses a CSN past it once the wait runs out:
/// DEADLINE_EXCEEDED naming the group, the CSN asked and the CSN reached, by Read and
/// by Tail. Resumed, the cluster commits again and the follower serves the new CSN.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_follower_refuses_a_csn_it_has_not_reached_by_name() {
    let c = cluster();
    let l = leader(&c, &[1, 2, 3], ORD).await;
    let (_, csn) = append(&c, "before").await;
    let f = (1..=3).find(|n| *n != l).unwrap();
    let other = (1..=3).find(|n| *n != l && *n != f).unwrap();
    // It holds `csn` before it is cut off.
    c.at(f)
        .read_at_csn(ORD, 0, 10, AtCsn::new(csn, Duration::from_secs(10)))
        .await
        .unwrap();
    c.signal(l, libc::SIGSTOP);
    c.signal(other, libc::SIGSTOP);
    let reached = readable(&c, f).await;
    assert!(reached >= csn);
    // What it holds it serves at once.
    let r = c
        .at(f)
        .read_at_csn(ORD, 0, 1000, AtCsn::new(csn, Duration::ZERO))
        .await
        .unwrap();
    assert!(r.records.iter().any(|r| r.data == b"before"));
    // Past it: refused once the wait runs out, naming the CSNs.
    let asked = reached + 1;
    let t0 = Instant::now();
    let e = c
        .at(f)
        .read_at_csn(ORD, 0, 10, AtCsn::new(asked, Duration::from_millis(1500)))
        .await
        .unwrap_err();
    let took = t0.elapsed();
    match &e {
        ClientError::Status { code, message, .. } => {
            assert_eq!(*code, Code::DeadlineExceeded, "{e}");
            assert!(
                message.contains(&format!("group {ORD}"))
                    && message.contains(&format!("readable CSN {reached}"))
                    && message.contains(&format!("CSN {asked}")),
                "{message}"
            );
        }
        other => panic!("{other}"),
    }
    assert!(
        took >= Duration::from_millis(1400) && took < Duration::from_secs(10),
        "{took:?}"
    );
    // A far-future CSN, by Tail: the stream ends with the same refusal.
    let far = reached + 1_000_000;
    let mut s = c
        .at(f)
        .tail_at_csn(ORD, 0, AtCsn::new(far, Duration::from_millis(500)))
        .await
        .unwrap();
    let st = tokio::time::timeout(Duration::from_secs(10), s.message())
        .await
        .expect("the tail ended")
        .unwrap_err();
    assert_eq!(st.code(), Code::DeadlineExceeded, "{st:?}");
    assert!(
        st.message().contains(&format!("CSN {far}"))
            && st.message().contains(&format!("readable CSN {reached}")),
        "{}",
        st.message()
    );
    // Resumed: a new commit, served there at its CSN.
    c.signal(l, libc::SIGCONT);
    c.signal(other, libc::SIGCONT);
    let (lsn, csn2) = append(&c, "after").await;
    assert!(csn2 > reached);
    let r = c
        .at(f)
        .read_at_csn(ORD, lsn, 1, AtCsn::new(csn2, Duration::from_secs(10)))
        .await
        .unwrap();
    assert_eq!(r.records[0].data, b"after");
}

/// The next event of `s` that `f` accepts, within 20 s; the events passed over are
/// checked by `f` too (it sees every one).
async fn event_until(
    node: u64,
    s: &mut tonic::Streaming<pb::RoleEvent>,
    mut f: impl FnMut(&pb::RoleEvent) -> bool,
) -> pb::RoleEvent {
    let end = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let e = tokio::time::timeout_at(end, s.message())
            .await
            .unwrap_or_else(|_| panic!("node {node}: no such event within 20 s"))
            .unwrap_or_else(|st| panic!("node {node}: the stream ended: {st:?}"))
            .unwrap_or_else(|| panic!("node {node}: the stream ended"));
        assert_eq!(e.node, node);
        if f(&e) {
            return e;
        }
    }
}

/// Role streams of `group` on every node (a node just restarted is waited for).
async fn watch_all(c: &Cluster, group: u64) -> Vec<(u64, tonic::Streaming<pb::RoleEvent>)> {
    let mut out = Vec::new();
    for id in 1..=3 {
        let end = Instant::now() + Duration::from_secs(20);
        let s = loop {
            match c.at(id).watch_role(group).await {
                Ok(s) => break s,
                Err(e) if Instant::now() < end => {
                    eprintln!("node {id} not watched yet: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("node {id}: {e}"),
            }
        };
        out.push((id, s));
    }
    out
}

/// The role stream, on every node, of the ordered and of the out-of-order group: the
/// first event names the leader; a transfer shows the new leader on each; after the
/// ordered group's leader is killed the survivors show its successor; deleting a
/// replica ends its stream NOT_FOUND by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_role_stream_shows_the_leader_its_changes_and_a_deletion() {
    let mut c = cluster();
    let (_, csn) = append(&c, "before the watch").await;
    for group in [ORD, DEP] {
        let l = leader(&c, &[1, 2, 3], group).await;
        let mut streams = watch_all(&c, group).await;
        let mode = if group == ORD { "ordered" } else { "dependent" };
        for (id, s) in &mut streams {
            // The first event is the current state: it may predate the leader's election
            // finishing only by moments, so the leader shows within the first few.
            let e = event_until(*id, s, |e| e.has_leader && e.leader == l).await;
            assert_eq!(e.group, group);
            assert_eq!(e.mode, mode);
            assert_eq!(e.role == "leader", *id == l, "{e:?}");
        }
        let to = (1..=3).find(|n| *n != l).unwrap();
        let mut cl = c.at(l);
        cl.leader_timeout = Duration::from_secs(20);
        cl.transfer_leader_forced(group, to, true).await.unwrap();
        for (id, s) in &mut streams {
            // A deposed leader names the new one before it hears from it (its proposal
            // id is then not known yet): wait for the settled state.
            let e = event_until(*id, s, |e| {
                e.has_leader
                    && e.leader == to
                    && (e.role == "leader") == (*id == to)
                    && e.proposal_id > 0
            })
            .await;
            if group == ORD {
                // Never more than what committed; a serving leader has committed its
                // predecessor's log, so it reads all of it (a follower may learn the
                // commit point a moment later than the new leader).
                assert!(e.readable_csn <= csn, "{e:?}");
                if *id == to {
                    assert_eq!(e.readable_csn, csn, "{e:?}");
                }
            }
        }
        if group == ORD {
            // The leader killed: the survivors' streams show another.
            c.nodes[(to - 1) as usize].kill9();
            let survivors: Vec<u64> = (1..=3).filter(|n| *n != to).collect();
            let l3 = leader(&c, &survivors, ORD).await;
            for (id, s) in streams.iter_mut().filter(|(id, _)| *id != to) {
                event_until(*id, s, |e| e.has_leader && e.leader == l3).await;
            }
            // Deleting a survivor's replica (forced: it is a voter) ends its stream.
            let gone = survivors.into_iter().find(|n| *n != l3).unwrap();
            let s = &mut streams.iter_mut().find(|(id, _)| *id == gone).unwrap().1;
            c.at(gone).delete_group(0, ORD, true).await.unwrap();
            let st = loop {
                match tokio::time::timeout(Duration::from_secs(20), s.message())
                    .await
                    .expect("the stream ended")
                {
                    Ok(Some(_)) => continue,
                    Ok(None) => panic!("node {gone}: the stream ended without a status"),
                    Err(st) => break st,
                }
            };
            assert_eq!(st.code(), Code::NotFound, "{st:?}");
            assert!(
                st.message()
                    .contains(&format!("group {ORD} was deleted on node {gone}")),
                "{}",
                st.message()
            );
            // The killed node back, for the out-of-order group.
            c.nodes[(to - 1) as usize].start();
        } else {
            // An out-of-order replica deleted: its stream ends by name as well.
            let gone = (1..=3).find(|n| *n != to).unwrap();
            let s = &mut streams.iter_mut().find(|(id, _)| *id == gone).unwrap().1;
            c.at(gone).delete_group(0, DEP, true).await.unwrap();
            let st = loop {
                match tokio::time::timeout(Duration::from_secs(20), s.message())
                    .await
                    .expect("the stream ended")
                {
                    Ok(Some(_)) => continue,
                    Ok(None) => panic!("node {gone}: the stream ended without a status"),
                    Err(st) => break st,
                }
            };
            assert_eq!(st.code(), Code::NotFound, "{st:?}");
            assert!(
                st.message()
                    .contains(&format!("group {DEP} was deleted on node {gone}")),
                "{}",
                st.message()
            );
        }
    }
    // A group this node does not have: the call itself is refused.
    match c.at(1).watch_role(99).await {
        Err(ClientError::Status { code, .. }) => assert_eq!(code, Code::NotFound),
        other => panic!("{:?}", other.map(|_| ())),
    }
}
