//! The file system (PolarFS section 6) on a replicated volume, through real processes:
//! three `chorus server`s (control nodes and chunk servers) and the `chorus fs` CLI.
//! A file system is made on a volume; a directory and a file are written by host 1;
//! host 2 takes the journal over by Disk Paxos and writes another file, then host 1
//! takes it back; everything reads back, `fsck` is clean; a chunk server is killed with
//! SIGKILL and every byte still reads back; bad input is refused by name.

use std::process::Command;
use std::time::{Duration, Instant};

use chorus_client::pb;
use chorus_client::volume::on_control;

mod common;
#[path = "common/storage.rs"]
mod storage;
use storage::{Cluster, CHUNK};

fn fs(ctl: &str, args: &[&str]) -> std::process::Output {
    let mut a = vec!["fs", args[0], args[1], "--control", ctl];
    a.extend_from_slice(&args[2..]);
    Command::new(env!("CARGO_BIN_EXE_chorus"))
        .args(&a)
        .output()
        .unwrap()
}

fn ok(o: std::process::Output) -> Vec<u8> {
    assert!(
        o.status.success(),
        "exit {:?}: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stderr)
    );
    o.stdout
}

/// Creates volume `fsvol` of `size` bytes, retrying (bounded) until the chunk servers
/// have joined the control plane.
async fn create_volume(c: &Cluster, size: u64) {
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let req = pb::CreateVolumeRequest {
            name: "fsvol".into(),
            size_bytes: size,
            ..Default::default()
        };
        let r = on_control(&c.control, Duration::from_secs(30), |mut cl| {
            let req = req.clone();
            async move { cl.create_volume(req).await.map(|r| r.into_inner()) }
        })
        .await;
        match r {
            Ok(Ok(v)) if v.state == "ready" => return,
            r if Instant::now() < end => {
                eprintln!("create: {r:?}");
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            r => {
                c.dump_logs();
                panic!("create: {r:?}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_system_on_a_volume_survives_a_writer_change_and_a_killed_node() {
    let mut c = Cluster::start(3, 600_000);
    create_volume(&c, 4 * CHUNK).await;
    let ctl = c.control.join(",");
    let out = ok(fs(
        &ctl,
        &[
            "mkfs",
            "fsvol",
            "--inodes-per-chunk",
            "60",
            "--dirents-per-chunk",
            "60",
            "--max-hosts",
            "4",
            "--journal-size",
            "256K",
        ],
    ));
    assert!(String::from_utf8_lossy(&out).contains("made a file system"));
    ok(fs(&ctl, &["mkdir", "fsvol", "/db"]));
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..200_000u32).map(|i| (i * 31 % 251) as u8).collect();
    let local = dir.path().join("data.bin");
    std::fs::write(&local, &data).unwrap();
    ok(fs(
        &ctl,
        &["put", "fsvol", local.to_str().unwrap(), "/db/data.bin"],
    ));
    // Host 2 takes the journal over for its write, then host 1 takes it back.
    let other = dir.path().join("other");
    std::fs::write(&other, b"from host 2").unwrap();
    ok(fs(
        &ctl,
        &[
            "put",
            "fsvol",
            other.to_str().unwrap(),
            "/db/other",
            "--host-id",
            "2",
        ],
    ));
    ok(fs(&ctl, &["mkdir", "fsvol", "/logs", "--host-id", "1"]));
    let ls = String::from_utf8(ok(fs(&ctl, &["ls", "fsvol", "/db"]))).unwrap();
    assert!(ls.contains("data.bin") && ls.contains("200000"), "{ls}");
    assert!(ls.contains("other"), "{ls}");
    assert_eq!(ok(fs(&ctl, &["cat", "fsvol", "/db/data.bin"])), data);
    assert_eq!(ok(fs(&ctl, &["cat", "fsvol", "/db/other"])), b"from host 2");
    let fsck = String::from_utf8(ok(fs(&ctl, &["fsck", "fsvol"]))).unwrap();
    assert!(fsck.contains("clean: 2 files, 3 directories"), "{fsck}");
    let stat = String::from_utf8(ok(fs(&ctl, &["stat", "fsvol"]))).unwrap();
    assert!(stat.contains("writer host 1"), "{stat}");

    // A chunk server killed: every byte still reads back, the metadata is clean.
    c.nodes[2].kill9();
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let o = fs(&ctl, &["cat", "fsvol", "/db/data.bin"]);
        if o.status.success() {
            assert_eq!(o.stdout, data);
            break;
        }
        assert!(
            Instant::now() < end,
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let fsck = String::from_utf8(ok(fs(&ctl, &["fsck", "fsvol"]))).unwrap();
    assert!(fsck.contains("clean"), "{fsck}");
    ok(fs(&ctl, &["rm", "fsvol", "/db/other"]));
    let ls = String::from_utf8(ok(fs(&ctl, &["ls", "fsvol", "/db"]))).unwrap();
    assert!(!ls.contains("other"), "{ls}");

    // Bad input, refused by name.
    let o = fs(&ctl, &["ls", "fsvol", "/nope"]);
    assert_eq!(o.status.code(), Some(4));
    assert!(String::from_utf8_lossy(&o.stderr).contains("/nope: no such file"));
    let o = fs(&ctl, &["cat", "missing", "/x"]);
    assert_eq!(o.status.code(), Some(4));
    assert!(String::from_utf8_lossy(&o.stderr).contains("does not exist"));
    let o = fs(&ctl, &["mkdir", "fsvol", "/x", "--host-id", "9"]);
    assert_eq!(o.status.code(), Some(4));
    assert!(String::from_utf8_lossy(&o.stderr).contains("hosts 1 to 4"));
}

/// A mounting process and its mount point: on drop (also when a test fails) the
/// process is killed by pid and the mount point detached.
struct Mounted {
    child: std::process::Child,
    dir: std::path::PathBuf,
}

impl Mounted {
    /// Starts `chorus fs mount` at `dir` and waits (bounded) until the kernel lists it.
    fn start(ctl: &str, dir: &std::path::Path, extra: &[&str]) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let mut a = vec![
            "fs",
            "mount",
            "fsvol",
            dir.to_str().unwrap(),
            "--control",
            ctl,
        ];
        a.extend_from_slice(&["--poll-ms", "50", "--ttl-ms", "200"]);
        a.extend_from_slice(extra);
        let child = Command::new(env!("CARGO_BIN_EXE_chorus"))
            .args(&a)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut m = Self {
            child,
            dir: dir.to_path_buf(),
        };
        let end = Instant::now() + Duration::from_secs(30);
        while !m.listed() {
            if let Some(s) = m.child.try_wait().unwrap() {
                panic!("chorus fs mount {extra:?} ended: {s}");
            }
            assert!(
                Instant::now() < end,
                "{} not mounted in 30 s",
                dir.display()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        m
    }

    fn listed(&self) -> bool {
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
        let d = self.dir.to_str().unwrap();
        mounts.lines().any(|l| l.split(' ').nth(1) == Some(d))
    }

    /// Unmounts through `chorus fs umount`; the mounting process ends by itself.
    fn umount(mut self) {
        let o = Command::new(env!("CARGO_BIN_EXE_chorus"))
            .args(["fs", "umount", self.dir.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                assert!(s.success(), "the mounting process ended with {s}");
                break;
            }
            assert!(Instant::now() < end, "the mounting process did not end");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if self.listed() {
            let _ = Command::new("umount").arg("-l").arg(&self.dir).output();
        }
    }
}

fn fuse_and_sqlite() -> bool {
    use std::os::unix::fs::MetadataExt;
    let root = std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
    let sqlite = Command::new("sqlite3").arg("--version").output().is_ok();
    let ok = root && std::path::Path::new("/dev/fuse").exists() && sqlite;
    if !ok {
        assert!(
            std::env::var_os("CHORUS_REQUIRE_FUSE").is_none(),
            "CHORUS_REQUIRE_FUSE is set, but FUSE (root, /dev/fuse) or sqlite3 is missing"
        );
        eprintln!("skipped: needs root, /dev/fuse and sqlite3");
    }
    ok
}

fn sqlite(db: &std::path::Path, sql: &str) -> std::process::Output {
    Command::new("sqlite3").arg(db).arg(sql).output().unwrap()
}

/// PolarFS section 6.2 through real processes: SQLite writes through a read-write
/// FUSE mount (host 1) while host 2 has the volume mounted read-only; the writing
/// mount's process is killed with SIGKILL in the middle of the stream of transactions.
/// Host 3 takes the writer role by Disk Paxos, the journal is replayed (or the torn
/// transaction rolled back), `fsck` is clean, SQLite's integrity check passes and every
/// transaction SQLite reported committed is there; the reader sees the same rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_on_a_mount_survives_its_writer_killed_mid_transaction() {
    if !fuse_and_sqlite() {
        return;
    }
    let c = Cluster::start(3, 600_000);
    create_volume(&c, 8 * CHUNK).await;
    let ctl = c.control.join(",");
    ok(fs(
        &ctl,
        &[
            "mkfs",
            "fsvol",
            "--block-size",
            "16K",
            "--inodes-per-chunk",
            "60",
            "--dirents-per-chunk",
            "60",
            "--max-hosts",
            "4",
            "--journal-size",
            "128K",
        ],
    ));
    let tmp = tempfile::tempdir().unwrap();
    let (w, r, w2) = (
        tmp.path().join("w"),
        tmp.path().join("r"),
        tmp.path().join("w2"),
    );
    let writer = Mounted::start(&ctl, &w, &["--host-id", "1"]);
    let reader = Mounted::start(&ctl, &r, &["--host-id", "2", "--read-only"]);
    let db = w.join("app.sqlite");
    let o = sqlite(
        &db,
        "CREATE TABLE t(k INTEGER PRIMARY KEY, batch INTEGER, v TEXT);",
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    // A stream of transactions, one `sqlite3` process each: its exit status 0 is
    // SQLite's word that the transaction committed.
    let (tx, rx) = std::sync::mpsc::channel::<u64>();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let app = {
        let (db, stop) = (db.clone(), stop.clone());
        std::thread::spawn(move || {
            for b in 0..2000u64 {
                if stop.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                let mut sql = String::from("BEGIN;");
                for i in 0..10 {
                    sql.push_str(&format!(
                        "INSERT INTO t(batch, v) VALUES ({b}, 'row {i} {}');",
                        "y".repeat(200)
                    ));
                }
                sql.push_str("COMMIT;");
                if !sqlite(&db, &sql).status.success() || tx.send(b).is_err() {
                    break;
                }
            }
        })
    };
    // Kill the writer's mount once a few dozen transactions have committed, while the
    // next one runs.
    let mut acked = None;
    let end = Instant::now() + Duration::from_secs(120);
    while acked.is_none_or(|b| b < 30) {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(b) => acked = Some(b),
            Err(_) => assert!(
                Instant::now() < end,
                "SQLite committed too little: {acked:?}"
            ),
        }
    }
    let mut writer = writer;
    writer.child.kill().unwrap(); // SIGKILL
    writer.child.wait().unwrap();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    drop(writer); // detaches the dead mount: the running sqlite3 fails
    app.join().unwrap();
    while let Ok(b) = rx.try_recv() {
        acked = Some(b);
    }
    let acked = acked.unwrap();
    eprintln!(
        "{} transactions reported committed before the kill",
        acked + 1
    );

    // Host 3 takes the writer role: SQLite finds its hot journal and rolls back.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let metrics = format!("127.0.0.1:{port}");
    let w2m = Mounted::start(&ctl, &w2, &["--host-id", "3", "--metrics", &metrics]);
    let o = sqlite(
        &w2.join("app.sqlite"),
        "PRAGMA integrity_check; SELECT max(batch), count(*) FROM t;",
    );
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some("ok"), "{out}");
    let (max, count) = lines.next().unwrap().split_once('|').unwrap();
    let (max, count): (u64, u64) = (max.parse().unwrap(), count.parse().unwrap());
    assert!(
        max >= acked,
        "batch {acked} was reported committed, the table ends at {max}"
    );
    assert_eq!(count, (max + 1) * 10, "whole transactions only: {out}");
    let fsck = String::from_utf8(ok(fs(&ctl, &["fsck", "fsvol"]))).unwrap();
    assert!(fsck.contains("clean"), "{fsck}");
    let stat = String::from_utf8(ok(fs(&ctl, &["stat", "fsvol"]))).unwrap();
    assert!(stat.contains("writer host 3"), "{stat}");
    // The new writer's counters: it won the journal by Disk Paxos, and commits.
    std::fs::write(w2.join("after-kill"), b"host 3 writes").unwrap();
    let m = storage::metrics_text(&metrics).expect("the mount serves /metrics");
    let value = |name: &str| -> u64 {
        m.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} missing:\n{m}"))
    };
    assert_eq!(value("chorus_fs_writer "), 1, "{m}");
    assert!(value("chorus_fs_handovers_total ") >= 1, "{m}");
    assert!(value("chorus_fs_paxos_rounds_total ") >= 2, "{m}");
    assert_eq!(value("chorus_fs_lost_total "), 0, "{m}");
    value("chorus_fs_replays_total ");
    assert!(value("chorus_fs_journal_appends_total ") >= 1, "{m}");

    // The reading host sees the same rows.
    let ro = format!("file:{}?immutable=1", r.join("app.sqlite").display());
    let want = format!("ok\n{max}|{count}\n");
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let o = Command::new("sqlite3")
            .arg(&ro)
            .arg("PRAGMA integrity_check; SELECT max(batch), count(*) FROM t;")
            .output()
            .unwrap();
        if String::from_utf8_lossy(&o.stdout) == want {
            break;
        }
        assert!(
            Instant::now() < end,
            "the reader: {:?} {:?}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    reader.umount();
    w2m.umount();
}
