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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_system_on_a_volume_survives_a_writer_change_and_a_killed_node() {
    let mut c = Cluster::start(3, 600_000);
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let req = pb::CreateVolumeRequest {
            name: "fsvol".into(),
            size_bytes: 4 * CHUNK,
            ..Default::default()
        };
        let r = on_control(&c.control, Duration::from_secs(30), |mut cl| {
            let req = req.clone();
            async move { cl.create_volume(req).await.map(|r| r.into_inner()) }
        })
        .await;
        match r {
            Ok(Ok(v)) if v.state == "ready" => break,
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
