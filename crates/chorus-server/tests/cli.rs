//! The `chorus` binary end to end: demo writes a log, inspect reads and verifies it, and a
//! flipped byte is found and named.

use std::path::PathBuf;
use std::process::Command;

fn chorus() -> Command {
    Command::new(env!("CARGO_BIN_EXE_chorus"))
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("chorus-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn demo_then_inspect_verify_then_corruption_is_named() {
    let dir = temp_dir("inspect");
    let out = chorus()
        .args([
            "demo",
            dir.to_str().unwrap(),
            "--records",
            "5000",
            "-o",
            "json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let demo: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(demo["end_lsn"], demo["recovered_end_lsn"]);

    let out = chorus()
        .args([
            "inspect",
            dir.to_str().unwrap(),
            "--verify",
            "--groups",
            "-o",
            "json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(report["first_problem"].is_null());
    let groups = report["blocks"][0]["group_list"].as_array().unwrap();
    assert_eq!(groups.len() as u64, demo["groups"].as_u64().unwrap());

    // Flip one byte inside the 3rd group's body: --verify exits 1 naming the place.
    let block = dir.join("log").join("00000000000000000000.blk");
    let mut bytes = std::fs::read(&block).unwrap();
    let lsn = groups[2]["lsn"].as_u64().unwrap() as usize;
    bytes[4096 + lsn + 200] ^= 0x40;
    std::fs::write(&block, &bytes).unwrap();
    let out = chorus()
        .args(["inspect", dir.to_str().unwrap(), "--verify"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("file offset {}", 4096 + lsn)) && text.contains("checksum mismatch"),
        "{text}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn inspect_of_a_missing_dir_is_a_clear_error() {
    let out = chorus()
        .args(["inspect", "/nonexistent/chorus"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/chorus/log"));
}

#[test]
fn inspect_shows_meta_and_flags_two_bad_slots() {
    let dir = temp_dir("meta");
    let st = chorus()
        .args(["demo", dir.to_str().unwrap(), "--records", "100"])
        .output()
        .unwrap();
    assert!(st.status.success());
    let out = chorus()
        .args(["inspect", dir.to_str().unwrap(), "--verify", "-o", "json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["meta"][0]["voters"], serde_json::json!([1]));
    // --entries lists every entry with its LSN and CSN.
    let out = chorus()
        .args(["inspect", dir.to_str().unwrap(), "--entries", "-o", "json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let e: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let total: usize = e["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|b| b["group_list"].as_array().cloned().unwrap_or_default())
        .map(|g| g["entry_list"].as_array().map_or(0, |l| l.len()))
        .sum();
    assert_eq!(total, 100);
    assert!(v["meta"][1]["problem"].is_null());
    // One torn slot is what a crash mid-save leaves: reported, not a failure.
    let meta = dir.join("meta");
    let mut bytes = std::fs::read(&meta).unwrap();
    bytes[40] ^= 0xFF;
    std::fs::write(&meta, &bytes).unwrap();
    let out = chorus()
        .args(["inspect", dir.to_str().unwrap(), "--verify", "-o", "json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["meta"][0]["problem"].as_str().unwrap().contains("slot 0"));
    // Both slots bad: exit 1 naming the meta file.
    bytes[4096 + 40] ^= 0xFF;
    std::fs::write(&meta, &bytes).unwrap();
    let out = chorus()
        .args(["inspect", dir.to_str().unwrap(), "--verify"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("both meta slots are unreadable"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `chorus inspect ... | head`: the reader closes the pipe after a few lines and the
/// command ends quietly (killed by SIGPIPE, as Unix tools are), not with a panic about
/// printing to stdout.
#[test]
fn output_into_a_pipe_closed_early_ends_quietly() {
    use std::io::Read;
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;
    let dir = temp_dir("pipe");
    let out = chorus()
        .args(["demo", dir.to_str().unwrap(), "--records", "20000"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let mut child = chorus()
        .args(["inspect", dir.to_str().unwrap(), "--entries"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 256];
    stdout.read_exact(&mut first).unwrap();
    drop(stdout);
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let status = child.wait().unwrap();
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        status.success() || status.signal() == Some(libc::SIGPIPE),
        "{status:?}: {err}"
    );
    // Enough output that the pipe was closed before it was all written.
    let all = chorus()
        .args(["inspect", dir.to_str().unwrap(), "--entries"])
        .output()
        .unwrap();
    assert!(all.stdout.len() > 1 << 20, "{} bytes", all.stdout.len());
    let _ = std::fs::remove_dir_all(&dir);
}

/// `chorus inspect` of an out-of-order group's directory: the hard state, the membership
/// and every entry record, read only; a bit flipped in a record that valid ones follow is
/// named with its offset and `--verify` exits 1, and the file is left as it was.
#[test]
fn inspect_of_an_out_of_order_replica_names_damage_and_changes_nothing() {
    use chorus_core::ooo::dependent::Deps;
    use chorus_core::ooo::replica::{Body, Entry, Hard};
    use chorus_storage::fs::{FileSystem, RealFs};
    use chorus_storage::ooo::OooStore;
    use std::sync::Arc;
    let dir = temp_dir("inspect-ooo");
    let fs: Arc<dyn FileSystem> = Arc::new(RealFs::new());
    let (mut store, _, _, _) = OooStore::open(fs, &dir).unwrap();
    for seq in 0..4u64 {
        store
            .write(&Entry {
                seq,
                term: 2,
                start: 0,
                eid: 2 << 32 | seq,
                body: Body::Dependent {
                    base: 0,
                    deps: Deps::default(),
                    write_set: vec![seq],
                    data: vec![7; 50].into(),
                },
            })
            .unwrap();
    }
    store.sync().unwrap();
    let hard = Hard {
        term: 2,
        voted_for: Some(1),
        committed_head: 3,
        leader_start: (2, 0),
        ..Hard::default()
    };
    store.save_hard(&hard).unwrap();
    drop(store);
    let json = |args: &[&str]| {
        let out = chorus()
            .arg("inspect")
            .arg(&dir)
            .args(args)
            .args(["-o", "json"])
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
        (out.status.code(), v)
    };
    let (code, v) = json(&["--verify", "--groups"]);
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(v["kind"], "out-of-order");
    assert_eq!(
        (v["term"].as_u64(), v["voted_for"].as_u64()),
        (Some(2), Some(1))
    );
    assert_eq!(
        (v["records"].as_u64(), v["slots"].as_u64()),
        (Some(4), Some(4))
    );
    assert_eq!(v["lost_below"], 0);
    assert!(v["first_problem"].is_null(), "{v}");
    let list = v["record_list"].as_array().unwrap();
    let second = list[1]["file_offset"].as_u64().unwrap();
    let entries = dir.join("entries.log");
    let mut b = std::fs::read(&entries).unwrap();
    b[second as usize + 20] ^= 0x01;
    std::fs::write(&entries, &b).unwrap();
    let (code, v) = json(&["--verify"]);
    assert_eq!(code, Some(1), "{v}");
    assert_eq!(v["records"], 3);
    assert_eq!(v["damaged"][0]["file_offset"].as_u64(), Some(second));
    let problem = v["first_problem"].as_str().unwrap();
    assert!(
        problem.contains(&format!("file offset {second}")),
        "{problem}"
    );
    assert_eq!(
        std::fs::read(&entries).unwrap(),
        b,
        "inspect changed the file"
    );
    assert!(!dir.join("entries.damaged").exists());
    // The table names the damage too.
    let out = chorus().arg("inspect").arg(&dir).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("DAMAGED at file offset {second}")),
        "{text}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `chorus trim` with an `--lsn` that is not an LSN, or without one, is a usage error
/// (exit 2) naming the option, and nothing is sent; its help states what a trim does.
#[test]
fn trim_with_a_bad_lsn_is_a_usage_error() {
    for args in [
        &["trim", "--lsn", "12abc"][..],
        &["trim", "--lsn", "-5"],
        &["trim", "--lsn", "18446744073709551616"],
        &["trim"],
    ] {
        let out = chorus()
            .args(args)
            .args(["--endpoints", "127.0.0.1:1"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("--lsn"), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    let out = chorus().args(["trim", "--help"]).output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains("block_size") && help.contains("checkpoint") && help.contains("rebased"),
        "{help}"
    );
}

/// `--timeout` bounds each request: an append to a server that takes the request and
/// never answers reports outcome unknown (exit 3) once it passes; a bad value is a usage
/// error naming the flag.
#[test]
fn an_append_with_no_answer_within_the_timeout_is_outcome_unknown() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        // Accept and read everything, answer nothing, close nothing.
        let mut held = Vec::new();
        for conn in listener.incoming().take(8) {
            let Ok(mut conn) = conn else { return };
            held.push(conn.try_clone().unwrap());
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while matches!(std::io::Read::read(&mut conn, &mut buf), Ok(n) if n > 0) {}
            });
        }
    });
    let started = std::time::Instant::now();
    let out = chorus()
        .args([
            "append",
            "--endpoints",
            &addr.to_string(),
            "--timeout",
            "0.5",
        ])
        .arg("never answered")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(
        err.contains("outcome unknown") && err.contains("no answer within 500ms"),
        "{err}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
    for bad in ["0", "-1", "soon", "100000"] {
        let out = chorus()
            .args(["append", "--endpoints", "127.0.0.1:1"])
            .arg(format!("--timeout={bad}"))
            .arg("x")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {err}");
        assert!(err.contains("--timeout"), "{bad}: {err}");
    }
}
