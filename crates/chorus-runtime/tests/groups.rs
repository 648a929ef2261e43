//! One environment hosting several groups: create, list, append to each, remove one
//! (its directory goes, its handle stops, others keep working), create it again, and
//! reopen the environment to find the survivors.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chorus_runtime::{Env, EnvConfig, Error, LogHandle, Outcome};
use chorus_storage::fs::{Fillable, RealFs};

fn leader_append(env: &Env, g: u64, data: &[u8]) -> u64 {
    let log = env.group(g).unwrap();
    for _ in 0..500 {
        if let Ok(a) = log.append(data, 0) {
            assert_eq!(a.result.wait().unwrap().outcome, Outcome::Committed);
            return a.lsn;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("group {g} never accepted an append");
}

#[test]
fn many_groups_in_one_env_and_removal() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = || EnvConfig::new(1, dir.path(), "127.0.0.1:0".parse::<SocketAddr>().unwrap());
    let env = Env::open(cfg()).unwrap();
    for g in [3, 1, 2] {
        env.create_group(g, &[1], &[]).unwrap();
    }
    assert!(matches!(
        env.create_group(2, &[1], &[]),
        Err(Error::GroupExists(2))
    ));
    assert_eq!(env.ordered_groups(), vec![1, 2, 3]);
    for g in 1..=3 {
        let lsn = leader_append(&env, g, format!("in {g}").as_bytes());
        assert_eq!(
            env.group(g).unwrap().read(lsn).unwrap().data,
            format!("in {g}").as_bytes()
        );
    }
    let old = env.group(2).unwrap();
    env.remove_group(2).unwrap();
    assert!(!chorus_runtime::env::group_dir(dir.path(), 2).exists());
    assert!(matches!(env.group(2), Err(Error::NoSuchGroup(2))));
    assert!(matches!(env.remove_group(2), Err(Error::NoSuchGroup(2))));
    assert_eq!(env.ordered_groups(), vec![1, 3]);
    let _ = old.append(b"after removal", 0); // refused or unresolved, never a panic
    leader_append(&env, 1, b"group 1 still serves");
    // Created again from nothing.
    env.create_group(2, &[1], &[]).unwrap();
    leader_append(&env, 2, b"new 2");
    env.shutdown();
    let env = Env::open(cfg()).unwrap();
    assert_eq!(env.ordered_groups(), vec![1, 2, 3]);
    // After a restart the log's tail past the last piggybacked commit point is decided by
    // reconfirmation (piggyback paper section 5): once the replica serves again, it is
    // committed and readable.
    leader_append(&env, 1, b"after reopen");
    let recs: Vec<_> = env
        .group(1)
        .unwrap()
        .reader(0)
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(recs.iter().any(|r| r.data == b"group 1 still serves"));
    env.shutdown();
}

/// A group whose files are damaged beyond what its replica repairs alone (here both
/// slots of its meta record) does not stop the node: the others start and serve, the
/// damaged one is named by every call and by the metrics until it is removed, and
/// creating it again is refused until then (its files are kept for the post-mortem).
#[test]
fn a_damaged_group_stops_only_itself() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = || EnvConfig::new(1, dir.path(), "127.0.0.1:0".parse::<SocketAddr>().unwrap());
    let env = Env::open(cfg()).unwrap();
    for g in [1, 2] {
        env.create_group(g, &[1], &[]).unwrap();
        leader_append(&env, g, format!("in {g}").as_bytes());
    }
    env.shutdown();
    drop(env);
    let gdir = chorus_runtime::env::group_dir(dir.path(), 2);
    let meta = gdir.join("meta");
    let len = std::fs::metadata(&meta).unwrap().len() as usize;
    std::fs::write(&meta, vec![0x5A; len]).unwrap();

    let env = Env::open(cfg()).unwrap();
    assert_eq!(env.ordered_groups(), vec![1]);
    let damaged = env.damaged_groups();
    assert_eq!(damaged.len(), 1);
    assert_eq!(damaged[0].0, 2);
    assert!(damaged[0].1.contains("meta"), "{}", damaged[0].1);
    match env.group(2) {
        Err(e @ Error::GroupDamaged { group: 2, .. }) => {
            assert!(e.to_string().contains("damaged"), "{e}")
        }
        other => panic!("{:?}", other.map(|_| ())),
    }
    assert!(matches!(
        env.create_group(2, &[1], &[]),
        Err(Error::GroupDamaged { group: 2, .. })
    ));
    assert!(gdir.join("meta").exists(), "the damaged files are kept");
    let m = env.render_metrics();
    assert!(
        m.contains("chorus_group_not_started{node=\"1\",group=\"2\",mode=\"ordered\"} 1"),
        "{m}"
    );
    leader_append(&env, 1, b"group 1 serves beside the damaged one");
    // Removing it deletes its files; it can then be created again, empty.
    env.remove_group(2).unwrap();
    assert!(!gdir.exists());
    assert!(env.damaged_groups().is_empty());
    assert!(matches!(env.group(2), Err(Error::NoSuchGroup(2))));
    env.create_group(2, &[1], &[]).unwrap();
    leader_append(&env, 2, b"new 2");
    env.shutdown();
    drop(env);
    let env = Env::open(cfg()).unwrap();
    assert_eq!(env.ordered_groups(), vec![1, 2]);
    assert!(env.damaged_groups().is_empty());
    env.shutdown();
}

/// Node 1 alone, with small blocks (256 KiB) and groups (64 KiB), leading groups 1 and 2,
/// each holding one committed record.
fn two_groups(dir: &std::path::Path) -> Env {
    let mut cfg = EnvConfig::new(1, dir, "127.0.0.1:0".parse::<SocketAddr>().unwrap());
    cfg.log.block_size = 256 << 10;
    cfg.replica.max_group_bytes = 64 << 10;
    let env = Env::open(cfg).unwrap();
    for g in [1, 2] {
        env.create_group(g, &[1], &[]).unwrap();
        leader_append(&env, g, format!("in {g}").as_bytes());
    }
    env
}

/// Appends 16 KiB records to `g` (at most 200: about 12 blocks) until it stops; returns
/// the records that committed before, with their LSNs, and the refusal that said it
/// stopped. An append racing the failure may be refused by the stepping-down replica
/// instead; once the group is stopped, every append is refused as not taken.
fn append_until_stopped(g: &LogHandle) -> (Vec<(u64, Vec<u8>)>, Error) {
    let mut committed = Vec::new();
    for i in 0..200u32 {
        let record = vec![i as u8; 16 << 10];
        match g.append(&record, 0) {
            // Committed before the failure, or unknown.
            Ok(a) => {
                if a.result
                    .wait()
                    .is_ok_and(|r| r.outcome == Outcome::Committed)
                {
                    committed.push((a.lsn, record));
                }
            }
            Err(e @ Error::NotRunning { .. }) => return (committed, e),
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
    panic!("the group never stopped");
}

/// A group whose storage fails while it runs (here its log directory is gone when the
/// log needs its next block file, as a full disk fails a write) stops only itself: the
/// failure is named by its status and the `chorus_group_stopped` gauge, an append that
/// reaches it afterwards is refused as not taken (`Error::NotRunning`, so a client may
/// send it to another replica), and the other group keeps serving.
#[test]
fn a_group_whose_storage_fails_stops_only_itself() {
    let dir = tempfile::tempdir().unwrap();
    let env = two_groups(dir.path());
    let log_dir = chorus_runtime::env::group_dir(dir.path(), 2).join("log");
    std::fs::remove_dir_all(&log_dir).unwrap();
    let g2 = env.group(2).unwrap();
    let (_, e) = append_until_stopped(&g2);
    match &e {
        Error::NotRunning { group: 2, reason } => {
            assert!(reason.contains("storage"), "{reason}")
        }
        other => panic!("{other}"),
    }
    assert!(e.to_string().contains("not taken"), "{e}");
    let st = g2.status();
    assert!(
        st.stopped.as_deref().is_some_and(|r| r.contains("storage")),
        "{st:?}"
    );
    let m = env.render_metrics();
    assert!(
        m.contains("chorus_group_stopped{node=\"1\",group=\"2\",mode=\"ordered\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("chorus_group_stopped{node=\"1\",group=\"1\",mode=\"ordered\"} 0"),
        "{m}"
    );
    leader_append(&env, 1, b"group 1 serves beside the stopped one");
    env.shutdown();
}

/// A group stopped by a failed storage write is restarted in place once the cause is
/// fixed: its log is recovered as after a crash, every record committed before the
/// failure reads back the same, it commits again, and the node's other group never
/// stopped. A running group and an unknown one are refused by name.
#[test]
fn a_stopped_group_restarts_in_place_and_keeps_its_log() {
    let dir = tempfile::tempdir().unwrap();
    let env = two_groups(dir.path());
    assert!(matches!(env.restart_group(2), Err(Error::GroupRunning(2))));
    assert!(matches!(env.restart_group(9), Err(Error::NoSuchGroup(9))));
    // The log directory goes away (the open block file stays writable), so the first
    // roll to a new block file fails and the group stops; then it comes back.
    let log_dir = chorus_runtime::env::group_dir(dir.path(), 2).join("log");
    let away = dir.path().join("log-away");
    std::fs::rename(&log_dir, &away).unwrap();
    let g2 = env.group(2).unwrap();
    let (committed, _) = append_until_stopped(&g2);
    assert!(!committed.is_empty());
    std::fs::rename(&away, &log_dir).unwrap();

    let old = g2;
    let g2 = env.restart_group(2).unwrap().ordered().unwrap();
    assert!(g2.status().stopped.is_none());
    assert!(env.group(2).unwrap().status().stopped.is_none());
    // A handle taken before the restart still names the stopped incarnation.
    assert!(old.status().stopped.is_some());
    assert!(matches!(old.append(b"x", 0), Err(Error::NotRunning { .. })));
    leader_append(&env, 2, b"after the restart");
    for (lsn, data) in &committed {
        let r = g2.read(*lsn).unwrap();
        assert_eq!(&r.data, data, "record at {lsn}");
    }
    assert!(matches!(env.restart_group(2), Err(Error::GroupRunning(2))));
    let m = env.render_metrics();
    assert!(
        m.contains("chorus_group_restarts_total{node=\"1\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("chorus_group_stopped{node=\"1\",group=\"2\",mode=\"ordered\"} 0"),
        "{m}"
    );
    leader_append(&env, 1, b"group 1 never stopped");
    env.shutdown();
}

/// A group stopped by a full disk (`ENOSPC` on a log write) starts again by itself once
/// the disk has room: its log recovered, every record committed before reads back the
/// same, and it commits again. While the free-space guard says the disk is low it stays
/// stopped.
#[test]
fn a_group_stopped_by_a_full_disk_restarts_once_there_is_room() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = EnvConfig::new(1, dir.path(), "127.0.0.1:0".parse::<SocketAddr>().unwrap());
    let disk = Fillable::new(Arc::new(RealFs));
    cfg.fs = Arc::new(disk.clone());
    cfg.min_free_bytes = 0;
    let env = Env::open(cfg).unwrap();
    env.create_group(1, &[1], &[]).unwrap();
    let mut committed = vec![(leader_append(&env, 1, b"before"), b"before".to_vec())];
    for i in 0..20u32 {
        let r = format!("record {i}").into_bytes();
        committed.push((leader_append(&env, 1, &r), r));
    }
    disk.set_full(true);
    let g = env.group(1).unwrap();
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        match g.append(b"on a full disk", 0) {
            Err(Error::NotRunning { reason, .. }) => {
                assert!(reason.contains("No space left on device"), "{reason}");
                break;
            }
            Ok(a) => {
                let _ = a.result.wait();
            }
            Err(_) => {}
        }
        assert!(Instant::now() < end, "the group never stopped");
        std::thread::sleep(Duration::from_millis(5));
    }
    // While the disk is low (the guard), nothing restarts it.
    env.disk_space().set_min_free(u64::MAX - 1);
    std::thread::sleep(Duration::from_millis(400));
    assert!(env.group(1).unwrap().status().stopped.is_some());
    // Room again: restarted within the refresh period, or after one back-off if the
    // timer tried while the disk was still full.
    disk.set_full(false);
    env.disk_space().set_min_free(0);
    let end = Instant::now() + Duration::from_secs(30);
    while env.group(1).unwrap().status().stopped.is_some() {
        assert!(Instant::now() < end, "the group never restarted");
        std::thread::sleep(Duration::from_millis(20));
    }
    leader_append(&env, 1, b"after the restart");
    let g = env.group(1).unwrap();
    for (lsn, data) in &committed {
        assert_eq!(&g.read(*lsn).unwrap().data, data, "record at {lsn}");
    }
    let m = env.render_metrics();
    assert!(
        m.contains("chorus_group_restarts_total{node=\"1\"} 1"),
        "{m}"
    );
    env.shutdown();
}

/// While the data directory's free space is below `min_free_bytes`, a leader refuses
/// appends by name with nothing appended, a replica that does not lead still answers
/// NotLeader (so clients find the leader), the group keeps running, the metrics say so,
/// and once the floor is met again appends commit with no restart.
#[test]
fn a_leader_refuses_appends_while_its_disk_is_low_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let env = Env::open(EnvConfig::new(
        1,
        dir.path(),
        "127.0.0.1:0".parse::<SocketAddr>().unwrap(),
    ))
    .unwrap();
    env.create_group(1, &[1], &[]).unwrap();
    // Node 2 never runs: node 1 cannot lead group 2.
    env.create_group(2, &[1, 2], &[]).unwrap();
    leader_append(&env, 1, b"before");
    let disk = env.disk_space();
    assert!(disk.free_bytes().is_some_and(|f| f > 0));
    disk.set_min_free(u64::MAX - 1);
    let g1 = env.group(1).unwrap();
    match g1.append(b"refused", 0) {
        Err(e @ Error::DiskLow { group: 1, .. }) => {
            assert!(e.to_string().contains("nothing appended"), "{e}")
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("appended with the disk low"),
    }
    match env.group(2).unwrap().append(b"not a leader", 0) {
        Err(Error::Append { group: 2, source }) => {
            assert!(source.to_string().contains("leader"), "{source}")
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("appended without a leader"),
    }
    assert!(g1.status().stopped.is_none());
    let m = env.render_metrics();
    assert!(m.contains("chorus_disk_low{node=\"1\"} 1"), "{m}");
    assert!(
        m.contains("chorus_appends_refused_disk_low_total{node=\"1\"} 1"),
        "{m}"
    );
    disk.set_min_free(0);
    leader_append(&env, 1, b"after");
    let recs: Vec<_> = g1.reader(0).collect::<Result<_, _>>().unwrap();
    let data: Vec<&[u8]> = recs.iter().map(|r| r.data.as_slice()).collect();
    assert_eq!(data, vec![&b"before"[..], &b"after"[..]]);
    env.shutdown();
}
