//! Three (and four) real environments in one process, replicating over loopback TCP with
//! real files: election, concurrent appends, reads on every replica, leader loss,
//! restart and catch-up, membership change, and a wiped replica rejoining.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chorus_core::format::group::GroupHeader;
use chorus_core::format::meta::NodeId;
use chorus_core::replica::{AppendError, ReplicaConfig};
use chorus_runtime::{
    AccessMode, Env, EnvConfig, Error, LogHandle, MembershipChange, MirrorError, Outcome, Record,
    Role,
};

const MS: u64 = 1_000_000;

fn config(node: NodeId, dir: &Path) -> EnvConfig {
    let mut c = EnvConfig::new(node, dir, "127.0.0.1:0".parse::<SocketAddr>().unwrap());
    // Short timings keep the test quick; the protocol is the same.
    c.replica = ReplicaConfig {
        lease: 600 * MS,
        heartbeat_interval: 50 * MS,
        ping_interval: 50 * MS,
        resend_interval: 100 * MS,
        ..ReplicaConfig::default()
    };
    c.log.block_size = 1 << 20;
    c.io_workers = 2;
    // Both write paths in every cluster: even nodes pipeline their syncs.
    c.pipelined_sync = node.is_multiple_of(2);
    c
}

struct Cluster {
    root: tempfile::TempDir,
    envs: HashMap<NodeId, Env>,
    /// Block size of every node's log.
    block_size: u64,
    /// Groups indexed and bytes cached in memory by each replica (default when `None`).
    memory: Option<(usize, usize)>,
}

impl Cluster {
    /// Three nodes with logs of `block_size`-byte blocks (and `memory`, see the field),
    /// each a voter of group 1.
    fn three(block_size: u64, memory: Option<(usize, usize)>) -> Self {
        let mut c = Cluster {
            root: tempfile::tempdir().unwrap(),
            envs: HashMap::new(),
            block_size,
            memory,
        };
        for n in 1..=3 {
            c.start(n);
        }
        for e in c.envs.values() {
            e.create_group(1, &[1, 2, 3], &[]).unwrap();
        }
        c
    }

    fn dir(&self, n: NodeId) -> PathBuf {
        self.root.path().join(format!("n{n}"))
    }

    fn start(&mut self, n: NodeId) -> Env {
        let mut cfg = config(n, &self.dir(n));
        cfg.log.block_size = self.block_size;
        if let Some((groups, bytes)) = self.memory {
            cfg.replica.max_index_groups = groups;
            cfg.replica.cache_bytes = bytes;
        }
        let env = Env::open(cfg).unwrap();
        for (id, other) in &self.envs {
            other.set_peer_addr(n, env.replication_addr().to_string());
            env.set_peer_addr(*id, other.replication_addr().to_string());
        }
        self.envs.insert(n, env.clone());
        env
    }

    fn handles(&self) -> Vec<LogHandle> {
        self.envs.values().filter_map(|e| e.group(1).ok()).collect()
    }

    fn stop(&mut self, n: NodeId) {
        if let Some(e) = self.envs.remove(&n) {
            e.shutdown();
        }
    }

    fn leader(&self, group: u64, timeout: Duration) -> (NodeId, LogHandle) {
        let end = Instant::now() + timeout;
        loop {
            for (id, e) in &self.envs {
                if let Ok(g) = e.group(group) {
                    if g.role().role == Role::Leader && g.append(b"probe", 0).is_ok() {
                        return (*id, g);
                    }
                }
            }
            assert!(Instant::now() < end, "no leader within {timeout:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn all_records(g: &LogHandle) -> Vec<Record> {
    g.reader(0).collect::<Result<Vec<_>, _>>().unwrap()
}

/// Appends `n` records from `threads` writers, following leadership among `hs` (it may
/// move: fail-back to a higher-priority replica is automatic); returns the committed ones
/// (lsn, data).
fn append_many(hs: &[LogHandle], n: usize, threads: usize, tag: &str) -> Vec<(u64, Vec<u8>)> {
    let hs: Arc<Vec<LogHandle>> = Arc::new(hs.to_vec());
    let mut joins = Vec::new();
    for t in 0..threads {
        let hs = hs.clone();
        let tag = tag.to_string();
        joins.push(std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(60);
            let mut at = 0usize;
            let mut out = Vec::new();
            let mut pending = Vec::new();
            let settle = |pending: &mut Vec<(chorus_runtime::Appended, Vec<u8>)>,
                          out: &mut Vec<(u64, Vec<u8>)>| {
                for (a, d) in pending.drain(..) {
                    let lsn = a.lsn;
                    if a.result.wait().unwrap().outcome == Outcome::Committed {
                        out.push((lsn, d));
                    }
                }
            };
            for i in 0..n / threads {
                let data = format!("{tag}-{t}-{i}").into_bytes();
                loop {
                    match hs[at % hs.len()].append(&data, 0) {
                        Ok(a) => {
                            pending.push((a, data));
                            break;
                        }
                        Err(Error::Append { .. }) => {
                            assert!(Instant::now() < deadline, "no leader accepts appends");
                            at += 1;
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        Err(e) => panic!("{e}"),
                    }
                }
                if pending.len() >= 32 {
                    settle(&mut pending, &mut out);
                }
            }
            settle(&mut pending, &mut out);
            out
        }));
    }
    let mut all: Vec<_> = joins.into_iter().flat_map(|h| h.join().unwrap()).collect();
    all.sort();
    all
}

fn wait_caught_up(g: &LogHandle, lsn: u64) {
    let end = g.wait_committed_past(lsn.saturating_sub(1), Duration::from_secs(20));
    assert!(end >= lsn, "replica stuck at {end}, wanted {lsn}");
}

#[test]
fn three_replicas_replicate_fail_over_restart_and_change_membership() {
    let mut c = Cluster::three(1 << 20, None);
    let (leader, g) = c.leader(1, Duration::from_secs(10));

    // A follower replays the committed log to a callback, in LSN order.
    let follower = c.envs.keys().copied().find(|n| *n != leader).unwrap();
    let replayed = Arc::new(std::sync::Mutex::new(Vec::new()));
    let replayer = {
        let r = replayed.clone();
        c.envs[&follower]
            .group(1)
            .unwrap()
            .replay(0, move |rec| r.lock().unwrap().push(rec))
            .unwrap()
    };

    // 0. Whoever is told "Committed" can read the record at once (the committed end is
    //    published before the result).
    for i in 0..50 {
        let a = g.append(format!("now-{i}").as_bytes(), 0).unwrap();
        let lsn = a.lsn;
        assert_eq!(a.result.wait().unwrap().outcome, Outcome::Committed);
        assert_eq!(g.read(lsn).unwrap().data, format!("now-{i}").as_bytes());
    }

    // 1. Concurrent appends: every one commits, and every replica holds the same log.
    let committed = append_many(&c.handles(), 4000, 4, "a");
    assert!(committed.len() >= 3600, "{}", committed.len());
    let end = g.committed_end();
    for e in c.envs.values() {
        let h = e.group(1).unwrap();
        wait_caught_up(&h, end);
        let recs = all_records(&h);
        let by_lsn: HashMap<u64, &Vec<u8>> = recs.iter().map(|r| (r.lsn, &r.data)).collect();
        for (lsn, d) in &committed {
            assert_eq!(
                by_lsn.get(lsn),
                Some(&d),
                "node {}: record at {lsn}",
                e.node()
            );
        }
        // Records are in LSN order with CSNs growing with them.
        assert!(recs
            .windows(2)
            .all(|w| w[0].lsn < w[1].lsn && w[0].csn < w[1].csn));
    }
    // Every node exports its group's counters, the gap resends among them (a TCP
    // connection does not reorder, so any count is fine; the line must be there).
    for e in c.envs.values() {
        let m = e.render_metrics();
        let line = format!(
            "chorus_gap_resend_requests_total{{node=\"{}\",group=\"1\",mode=\"ordered\"}} ",
            e.node()
        );
        assert!(m.contains(&line), "node {}: no {line:?} in\n{m}", e.node());
        let timed = format!(
            "chorus_timed_resends_total{{node=\"{}\",group=\"1\",mode=\"ordered\"}} ",
            e.node()
        );
        assert!(m.contains(&timed), "node {}: no {timed:?}", e.node());
        let commits = format!(
            "chorus_commits_total{{node=\"{}\",group=\"1\",mode=\"ordered\"}} ",
            e.node()
        );
        assert!(m.contains(&commits), "node {}: no {commits:?}", e.node());
    }
    // Leaders time every append they answer (summed over the nodes: the appends above
    // may have met more than one leader).
    let timed: u64 = c
        .envs
        .values()
        .map(|e| {
            let prefix = format!(
                "chorus_append_seconds_count{{node=\"{}\",group=\"1\",mode=\"ordered\"}} ",
                e.node()
            );
            let m = e.render_metrics();
            let line = m.lines().find(|l| l.starts_with(&prefix));
            let line = line.unwrap_or_else(|| panic!("node {}: no {prefix:?} in\n{m}", e.node()));
            line[prefix.len()..].parse::<u64>().unwrap()
        })
        .sum();
    let answered = 50 + committed.len() as u64;
    assert!(
        timed >= answered,
        "{timed} appends timed, {answered} answered"
    );
    // The replay saw the same records, in order.
    let fend = c.envs[&follower].group(1).unwrap().committed_end();
    let deadline = Instant::now() + Duration::from_secs(10);
    while replayed
        .lock()
        .unwrap()
        .last()
        .is_none_or(|r| r.lsn < fend.saturating_sub(600))
    {
        assert!(Instant::now() < deadline, "replay does not keep up");
        std::thread::sleep(Duration::from_millis(10));
    }
    let pos = replayer.stop().unwrap();
    let seen = replayed.lock().unwrap().clone();
    let fol = all_records(&c.envs[&follower].group(1).unwrap());
    assert_eq!(&fol[..seen.len()], &seen[..]);
    assert!(pos > seen.last().unwrap().lsn);

    // Point reads and locate agree with the iterator.
    let recs = all_records(&g);
    let mid = &recs[recs.len() / 2];
    assert_eq!(&g.read(mid.lsn).unwrap(), mid);
    assert_eq!(g.locate(mid.csn).unwrap(), Some(mid.lsn));
    assert!(matches!(g.read(mid.lsn + 1), Err(Error::NotARecord { .. })));
    assert!(matches!(
        g.read(g.committed_end() + 10),
        Err(Error::NotCommitted { .. })
    ));

    // 2. The leader stops: another takes over, nothing committed is lost.
    c.stop(leader);
    let (leader2, g2) = c.leader(1, Duration::from_secs(10));
    assert_ne!(leader2, leader);
    let more = append_many(&c.handles(), 1000, 2, "b");
    assert!(more.len() >= 900, "{}", more.len());
    let recs2 = all_records(&g2);
    let have: HashMap<u64, &Vec<u8>> = recs2.iter().map(|r| (r.lsn, &r.data)).collect();
    for (lsn, d) in committed.iter().chain(more.iter()) {
        assert_eq!(have.get(lsn), Some(&d), "lost committed record at {lsn}");
    }

    // 3. The old leader restarts from its directory and catches up.
    c.start(leader);
    let end = g2.committed_end();
    let back = c.envs[&leader].group(1).unwrap();
    wait_caught_up(&back, end);
    let recs_back = all_records(&back);
    assert_eq!(&recs_back[..recs2.len()], &recs2[..]);

    // 4. Membership under load: node 4 joins as learner, is promoted, node 3 leaves.
    c.start(4);
    let g4 = c.envs[&4].create_group(1, &[], &[]).unwrap();
    let (_, lead) = c.leader(1, Duration::from_secs(10));
    let load = {
        let hs = c.handles();
        std::thread::spawn(move || append_many(&hs, 2000, 2, "c"))
    };
    change(&c, MembershipChange::AddLearner(4));
    wait_caught_up(&g4, lead.committed_end());
    change(&c, MembershipChange::Promote(4));
    let leaving = if leader2 == 3 { 2 } else { 3 };
    let leaving = if leaving == c.leader(1, Duration::from_secs(10)).0 {
        // Never remove the current leader here (transfer first in real life).
        if leaving == 3 {
            2
        } else {
            3
        }
    } else {
        leaving
    };
    change(&c, MembershipChange::Remove(leaving));
    let third = load.join().unwrap();
    assert!(third.len() >= 1800, "{}", third.len());
    let (_, lead) = c.leader(1, Duration::from_secs(10));
    let st = lead.status();
    assert!(st.membership.voters.contains(&4), "{:?}", st.membership);
    assert!(
        !st.membership.voters.contains(&leaving),
        "{:?}",
        st.membership
    );

    // 5. A replica whose data directory is wiped rejoins: it lost its promises, so it
    //    must not vote as its old self; it comes back as a new learner and is promoted.
    c.stop(leaving);
    std::fs::remove_dir_all(c.dir(leaving)).unwrap();
    c.start(leaving);
    let gw = c.envs[&leaving].create_group(1, &[], &[]).unwrap();
    change(&c, MembershipChange::AddLearner(leaving));
    let (_, lead) = c.leader(1, Duration::from_secs(10));
    wait_caught_up(&gw, lead.committed_end());
    change(&c, MembershipChange::Promote(leaving));
    let last = append_many(&c.handles(), 200, 1, "d");
    assert!(last.len() >= 180, "{}", last.len());
    let (_, lead) = c.leader(1, Duration::from_secs(10));
    wait_caught_up(&gw, lead.committed_end());
    let (a, b) = (all_records(&gw), all_records(&lead));
    let n = a.len().min(b.len());
    assert!(
        n > 0 && a[..n] == b[..n],
        "the rejoined replica's log differs"
    );

    for n in c.envs.keys().copied().collect::<Vec<_>>() {
        c.stop(n);
    }
}

/// Runs a membership change on the leader, retrying while it cannot be taken yet: a
/// previous change is in progress, the leadership moves (the replica found leading refused
/// as not the leader), or a learner to promote has not caught up. Any other refusal fails
/// the test at once.
fn change(c: &Cluster, ch: MembershipChange) {
    use chorus_core::replica::ChangeError;
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, lead) = c.leader(1, Duration::from_secs(10));
        match lead.change_membership(ch) {
            Ok(()) => break,
            Err(Error::Change {
                source: e @ (ChangeError::InProgress | ChangeError::NotLeader),
                ..
            }) => {
                assert!(
                    Instant::now() < end,
                    "{ch:?}: still refused after 20 s: {e}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(Error::Change {
                source: ChangeError::Invalid(why),
                ..
            }) if why.contains("has not caught up") => {
                assert!(
                    Instant::now() < end,
                    "{ch:?}: still refused after 20 s: {why}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("{ch:?}: {e}"),
        }
    }
    // Wait until the change is accepted (no change in progress any more).
    loop {
        let (_, lead) = c.leader(1, Duration::from_secs(10));
        let st = lead.status();
        let applied = match ch {
            MembershipChange::AddLearner(n) => st.membership.learners.contains(&n),
            MembershipChange::Promote(n) | MembershipChange::AddVoter(n) => {
                st.membership.voters.contains(&n)
            }
            MembershipChange::Remove(n) => {
                !st.membership.voters.contains(&n) && !st.membership.learners.contains(&n)
            }
            MembershipChange::Replace { new, .. } => st.membership.voters.contains(&new),
        };
        if applied {
            return;
        }
        assert!(
            Instant::now() < end,
            "{ch:?} not applied: {:?}",
            st.membership
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A follower that was away while the leader appended and trimmed its log is rebased at
/// the leader's log start when it returns (the leader no longer holds what it lacks): its
/// log starts again there, it holds the same records as the leader from there on, reads
/// below its start are refused as trimmed, and it can lead afterwards.
#[test]
fn a_follower_behind_the_leaders_trimmed_log_is_rebased() {
    // The smallest block, so a few hundred KiB of appends fill several, and a small
    // memory, so the leader holds the trimmed groups nowhere (with the defaults it
    // would send them from its cache).
    let mut c = Cluster::three(64 << 10, Some((64, 64 << 10)));
    let (leader, _) = c.leader(1, Duration::from_secs(10));
    let away = c.envs.keys().copied().find(|n| *n != leader).unwrap();
    let other = (1..=3).find(|n| *n != leader && *n != away).unwrap();
    c.stop(away);

    // ~300 KiB committed on the two others, then both trim below all but the last block.
    let (_, g) = c.leader(1, Duration::from_secs(10));
    let payload = vec![b'x'; 1000];
    for _ in 0..10 {
        let batch: Vec<_> = (0..30).map(|_| g.append(&payload, 0).unwrap()).collect();
        for a in batch {
            assert_eq!(a.result.wait().unwrap().outcome, Outcome::Committed);
        }
    }
    let committed = g.committed_end();
    assert!(committed > 4 * (64 << 10), "committed {committed}");
    for n in [leader, other] {
        let h = c.envs[&n].group(1).unwrap();
        wait_caught_up(&h, committed);
        h.trim(committed).unwrap();
        let start = h.status().start_lsn;
        assert!(start > 0 && start <= committed, "node {n} start {start}");
        assert!(matches!(h.read(0), Err(Error::Trimmed { .. })));
    }
    let start = g.status().start_lsn;
    // Records past the start on both, so the comparison below is of something even when
    // the committed end fell at the start of the last block.
    let batch: Vec<_> = (0..30).map(|_| g.append(&payload, 0).unwrap()).collect();
    for a in batch {
        assert_eq!(a.result.wait().unwrap().outcome, Outcome::Committed);
    }
    let committed = g.committed_end();
    // What the leader queued for the stopped node before the trim (a resend from LSN 64
    // read before it) would reach it on reconnecting, and it would need no rebase. Each
    // failed dial drops what was queued when it began (the leader's heartbeats keep it
    // dialling): two failed dials after the trim leave nothing from before it.
    let sender = &c.envs[&g.status().node];
    let (before, end) = (
        sender.transport_stats().frames_dropped,
        Instant::now() + Duration::from_secs(20),
    );
    while sender.transport_stats().frames_dropped < before + 2 {
        assert!(
            Instant::now() < end,
            "the leader never redialled the stopped node"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // The follower comes back: rebased at the leader's start, then caught up.
    c.start(away);
    let back = c.envs[&away].group(1).unwrap();
    wait_caught_up(&back, committed);
    let st = back.status();
    assert_eq!(
        (st.start_lsn, st.rebased),
        (start, 1),
        "rebased once, at the leader's log start: {st:?}"
    );
    assert!(g.status().rebases_sent >= 1);
    match back.read(0) {
        Err(Error::Trimmed { start: s, .. }) => assert_eq!(s, start),
        other => panic!("read below the start: {other:?}"),
    }
    let mine: Vec<Record> = back.reader(start).map(|r| r.unwrap()).collect();
    let theirs: Vec<Record> = g.reader(start).map(|r| r.unwrap()).collect();
    assert!(mine.len() >= 30, "{} records from the start", mine.len());
    assert_eq!(mine, theirs);
    let text = c.envs[&away].render_metrics();
    assert!(
        text.contains(&format!(
            "chorus_log_rebased_total{{node=\"{away}\",group=\"1\",mode=\"ordered\"}} 1"
        )),
        "{text}"
    );

    // It replicates what comes next, and can lead: the old leader stops.
    let a = g.append(b"after the rebase", 0).unwrap();
    assert_eq!(a.result.wait().unwrap().outcome, Outcome::Committed);
    wait_caught_up(&back, a.lsn + 1);
    c.stop(leader);
    let (_, g2) = c.leader(1, Duration::from_secs(10));
    let b = g2.append(b"under a new leader", 0).unwrap();
    assert_eq!(b.result.wait().unwrap().outcome, Outcome::Committed);
    wait_caught_up(&back, b.lsn + 1);
    assert_eq!(back.read(a.lsn).unwrap().data, b"after the rebase");
    for n in c.envs.keys().copied().collect::<Vec<_>>() {
        c.stop(n);
    }
}

/// A follower whose disk is below `min_free_bytes` takes no new log (the messages carrying
/// groups go as if lost) while the leader and the other follower commit; it stays up and
/// following, and once space is back it catches up by itself to the same records.
#[test]
fn a_follower_on_a_low_disk_takes_no_log_and_catches_up() {
    let mut c = Cluster::three(1 << 20, None);
    let (leader, g) = c.leader(1, Duration::from_secs(10));
    let low = c.envs.keys().copied().find(|n| *n != leader).unwrap();
    let f = c.envs[&low].group(1).unwrap();
    wait_caught_up(&f, g.committed_end());
    let disk = c.envs[&low].disk_space();
    disk.set_min_free(u64::MAX - 1);
    // What it was handed before the disk went low may still be in its write queue.
    std::thread::sleep(Duration::from_millis(300));
    let before = f.status().end_lsn;
    for i in 0..100 {
        let a = g.append(format!("while low {i}").as_bytes(), 0).unwrap();
        assert_eq!(a.result.wait().unwrap().outcome, Outcome::Committed);
    }
    let st = f.status();
    assert_eq!(st.end_lsn, before, "a follower on a low disk wrote log");
    assert!(st.stopped.is_none());
    assert_eq!(st.role.leader, Some(leader), "it keeps following");
    assert!(disk.declined() > 0);
    let m = c.envs[&low].render_metrics();
    let key = format!("chorus_replication_declined_disk_low_total{{node=\"{low}\"}} ");
    let declined: u64 = m
        .lines()
        .find_map(|l| l.strip_prefix(&key))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key}in {m}"));
    assert!(declined > 0, "{m}");
    disk.set_min_free(0);
    let end = g.committed_end();
    wait_caught_up(&f, end);
    assert_eq!(all_records(&f), all_records(&g));
    for n in c.envs.keys().copied().collect::<Vec<_>>() {
        c.stop(n);
    }
}

/// The serving leader of a mirror group (appends cannot probe it: they are refused).
fn mirror_leader(c: &Cluster, group: u64, timeout: Duration) -> LogHandle {
    let end = Instant::now() + timeout;
    loop {
        for e in c.envs.values() {
            if let Ok(g) = e.group(group) {
                if g.role().role == Role::Leader {
                    return g;
                }
            }
        }
        assert!(
            Instant::now() < end,
            "no leader of group {group} within {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Mirrors the primary's committed log into the mirror's leader from the mirror's end,
/// group by group, until the mirror has committed everything the primary had; retries
/// refusals (a new leader's config not yet in force) for a while.
fn mirror_all(c: &Cluster, primary: &LogHandle, mirror: u64, target: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut groups = 0;
    loop {
        let m = mirror_leader(c, mirror, Duration::from_secs(10));
        let at = m.status().end_lsn;
        if at >= target {
            m.wait_committed_past(target - 1, Duration::from_secs(10));
            if m.committed_end() >= target {
                return groups;
            }
        }
        let (batch, _) = primary.read_groups(at, 256 << 10).unwrap();
        let mut results = Vec::new();
        for g in batch {
            let h = GroupHeader::decode(&g).unwrap();
            match m.mirror(&g) {
                Ok(a) => {
                    assert_eq!(a.lsn, h.lsn, "a mirrored group keeps its LSN");
                    results.push(a.result);
                    groups += 1;
                }
                Err(e) => {
                    assert!(Instant::now() < deadline, "mirroring stuck: {e}");
                    std::thread::sleep(Duration::from_millis(20));
                    break;
                }
            }
        }
        for r in results {
            let _ = r.wait();
        }
    }
}

#[test]
fn a_mirror_holds_the_primary_s_committed_log_and_takes_appends_after_failover() {
    let c = Cluster::three(1 << 20, None);
    for e in c.envs.values() {
        e.create_group_in_mode(2, &[1, 2, 3], &[], AccessMode::RawWrite)
            .unwrap();
    }
    let committed = append_many(&c.handles(), 300, 2, "primary");
    assert_eq!(committed.len(), 300);
    let (_, p) = c.leader(1, Duration::from_secs(10));
    // The mirror's leadership may still move (to the node with the highest priority)
    // between finding its leader and appending: a refusal as not the leader is asked again
    // of the new leader; any other refusal than by the access mode is a failure.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = mirror_leader(&c, 2, Duration::from_secs(10));
        match m.append(b"not here", 0) {
            Err(Error::Append {
                source: AppendError::AccessMode { mode, .. },
                ..
            }) => {
                assert_eq!(mode, AccessMode::RawWrite);
                break;
            }
            Err(Error::Append {
                source: AppendError::NotLeader { .. },
                ..
            }) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("a mirror refused an append with {e}, not by its access mode"),
            Ok(_) => panic!("a mirror took an append"),
        }
    }
    // (The leader's probe append may still be committing: mirror what is committed.)
    let end = p.committed_end();
    let groups = mirror_all(&c, &p, 2, end);
    assert!(groups > 0);
    // The mirror holds the primary's records at the same LSNs and CSNs, on every replica.
    let want: Vec<Record> = all_records(&p)
        .into_iter()
        .filter(|r| r.lsn < end)
        .collect();
    assert!(want.len() >= 300);
    for e in c.envs.values() {
        let g = e.group(2).unwrap();
        g.wait_committed_past(end - 1, Duration::from_secs(10));
        let got: Vec<Record> = all_records(&g)
            .into_iter()
            .filter(|r| r.lsn < end)
            .collect();
        assert_eq!(got.len(), want.len(), "node {}", e.node());
        for (a, b) in got.iter().zip(&want) {
            assert_eq!((a.lsn, a.csn, &a.data), (b.lsn, b.csn, &b.data));
        }
    }
    // A group that does not continue the mirror's log is refused by name.
    let (first, _) = p.read_groups(0, 1).unwrap();
    let first = first.into_iter().next().unwrap();
    let m = mirror_leader(&c, 2, Duration::from_secs(10));
    match m.mirror(&first) {
        Err(Error::Mirror {
            source: MirrorError::Lsn { expected, found },
            ..
        }) => assert_eq!((expected, found), (m.status().end_lsn, 0)),
        other => panic!("a group at LSN 0 mirrored at the end: {other:?}"),
    }
    // Failover: the mirror becomes a primary; appends continue its log, CSNs above.
    let max_csn = want.last().unwrap().csn;
    let deadline = Instant::now() + Duration::from_secs(20);
    let appended = loop {
        let m = mirror_leader(&c, 2, Duration::from_secs(10));
        let _ = m.change_access_mode(AccessMode::Append);
        if let Ok(a) = m.append(b"after failover", 0) {
            break a;
        }
        assert!(Instant::now() < deadline, "failover did not take effect");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(appended.lsn >= end && appended.csn > max_csn);
    assert_eq!(appended.result.wait().unwrap().outcome, Outcome::Committed);
    let m = mirror_leader(&c, 2, Duration::from_secs(10));
    assert_eq!(m.status().membership.access_mode, AccessMode::Append);
    match m.mirror(&first) {
        Err(Error::Mirror {
            source: MirrorError::AccessMode { mode, .. },
            ..
        }) => assert_eq!(mode, AccessMode::Append),
        other => panic!("a primary took a mirror write: {other:?}"),
    }
}

/// Bits flipped at rest in a sealed block (below the tail, which opening does not scan)
/// of a follower's log: the scrubber finds them once the node is back, the replica
/// repairs the range from a peer's copy, and every record reads back on it as on the
/// leader, the damaged bytes restored.
#[test]
fn the_scrubber_repairs_bits_flipped_in_a_sealed_block_from_a_peer() {
    let mut c = Cluster::three(64 << 10, None);
    let (leader, g) = c.leader(1, Duration::from_secs(10));
    let payload = vec![b's'; 1000];
    for _ in 0..8 {
        let batch: Vec<_> = (0..30).map(|_| g.append(&payload, 0).unwrap()).collect();
        for a in batch {
            assert_eq!(a.result.wait().unwrap().outcome, Outcome::Committed);
        }
    }
    let committed = g.committed_end();
    assert!(committed > 3 * (64 << 10), "committed {committed}");
    let f = (1..=3).find(|n| *n != leader).unwrap();
    wait_caught_up(&c.envs[&f].group(1).unwrap(), committed);
    c.stop(f);
    // A byte in the middle of block 1, then a byte of block 0's first group's body.
    let dir = chorus_runtime::env::group_dir(&c.dir(f), 1);
    let block = |id: u64| {
        dir.join("log")
            .join(chorus_storage::log::block_file_name(id))
    };
    let mut flipped = Vec::new();
    for (id, at) in [(1u64, 4096 + 30_000u64), (0, 4096 + 200)] {
        let mut bytes = std::fs::read(block(id)).unwrap();
        flipped.push((id, at, bytes[at as usize]));
        bytes[at as usize] ^= 0x10;
        std::fs::write(block(id), &bytes).unwrap();
    }
    c.start(f);
    let back = c.envs[&f].group(1).unwrap();
    let end = Instant::now() + Duration::from_secs(30);
    while back.status().repaired < 2 {
        assert!(
            Instant::now() < end,
            "not repaired within 30 s: {:?}",
            back.status()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for (id, at, was) in flipped {
        assert_eq!(std::fs::read(block(id)).unwrap()[at as usize], was);
    }
    let (_, g) = c.leader(1, Duration::from_secs(10));
    let a = g.append(b"after the repair", 0).unwrap();
    assert_eq!(a.result.wait().unwrap().outcome, Outcome::Committed);
    wait_caught_up(&back, a.lsn + 1);
    assert_eq!(all_records(&back), all_records(&g));
    let text = c.envs[&f].render_metrics();
    assert!(
        text.contains(&format!(
            "chorus_log_repaired_total{{node=\"{f}\",group=\"1\",mode=\"ordered\"}} 2"
        )),
        "{text}"
    );
    for n in c.envs.keys().copied().collect::<Vec<_>>() {
        c.stop(n);
    }
}
