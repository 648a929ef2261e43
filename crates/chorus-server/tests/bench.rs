//! `chorus bench --local`: three replica processes, closed-loop clients on both paths, and
//! a result in the schema the benchmark matrix reads (docs/benchmarks/result-fields.md).

use std::process::Command;

/// Runs `chorus bench --local` with OS-chosen ports (the default `--base-port 0`): fixed
/// ports collide with whatever else the machine runs.
fn run(path: &str, mode: &str) -> serde_json::Value {
    run_with(&["--path", path, "--commit-mode", mode])
}

/// Runs `chorus bench --local` with `flags` and the common small settings.
fn run_with(flags: &[&str]) -> serde_json::Value {
    let dir = std::env::temp_dir().join(format!(
        "chorus-bench-test-{}-{}",
        flags.join("-").replace("--", ""),
        std::process::id()
    ));
    let json = dir.with_extension("json");
    let out = Command::new(env!("CARGO_BIN_EXE_chorus"))
        .args(["bench", "--local"])
        .arg(&dir)
        .args(flags)
        .args([
            "--clients",
            "4",
            "--size",
            "256",
            "--warmup",
            "0.5",
            "--duration",
            "1.5",
        ])
        .args(["-o", "json", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let line = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(line.lines().last().unwrap()).unwrap();
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    assert_eq!(v, file, "stdout and --json agree");
    v
}

fn check(v: &serde_json::Value, path: &str, mode: &str) {
    assert_eq!(v["commit_mode"], mode);
    assert_eq!(v["group_mode"], "ordered");
    check_run(v, path, 256);
}

/// What every run reports: `size` bytes per record, written durably on all three replicas.
fn check_run(v: &serde_json::Value, path: &str, size: u64) {
    assert_eq!(v["system"], "chorus");
    assert_eq!(v["path"], path);
    assert_eq!(v["size"], size, "{v}");
    assert_eq!(v["replicas"], 3);
    let appends = v["appends"].as_u64().unwrap();
    assert!(appends > 0, "{v}");
    let rate = v["appends_per_sec"].as_f64().unwrap();
    let secs = v["seconds"].as_f64().unwrap();
    assert!((rate * secs - appends as f64).abs() < 1.0, "{v}");
    assert!(v["p50_us"].as_u64().unwrap() <= v["p99_us"].as_u64().unwrap());
    // Every replica wrote at least the payload: the log is durable on all three.
    let written = v["proc_write_bytes"].as_array().unwrap();
    assert_eq!(written.len(), 3, "{v}");
    for w in written {
        assert!(w.as_u64().unwrap() >= appends * size * 9 / 10, "{v}");
    }
    assert!(v["write_amp"].as_f64().unwrap() >= 0.9, "{v}");
    // The device's figure is reported (its size depends on what holds the directory).
    assert!(v["dev_write_amp"].as_f64().unwrap() >= 0.0, "{v}");
    assert!(v["cpu_seconds"].as_f64().unwrap() > 0.0, "{v}");
    assert!(v["fsyncs_per_sec"].as_f64().unwrap() > 0.0, "{v}");
    assert!(v["follower_msgs_per_sec"].as_f64().unwrap() > 0.0, "{v}");
}

#[test]
fn bench_local_embedded_and_grpc_report_the_schema() {
    let v = run("embedded", "piggyback");
    check(&v, "embedded", "piggyback");
    let v = run("grpc", "sync");
    check(&v, "grpc", "sync");
}

#[test]
fn bench_local_out_of_order_groups_append_their_workload() {
    // 256 bytes round up to one 4 KiB block; the clients use gRPC without being told.
    let v = run_with(&["--mode", "parallel", "--volume-blocks", "1000"]);
    check_run(&v, "grpc", 4096);
    assert_eq!(v["group_mode"], "parallel");
    assert_eq!(v["volume_blocks"], 1000);
    assert!(v["commit_mode"].is_null(), "{v}");
    let v = run_with(&["--mode", "dependent", "--keys", "1000", "--theta", "0.5"]);
    check_run(&v, "grpc", 256);
    assert_eq!(v["group_mode"], "dependent");
    assert_eq!(
        (v["keys"].as_u64(), v["theta"].as_f64()),
        (Some(1000), Some(0.5))
    );
}

#[test]
fn bench_refuses_bad_flags_by_name() {
    for (flags, names) in [
        (
            &["--mode", "parallel", "--path", "embedded"][..],
            &["--path embedded", "--path grpc"][..],
        ),
        (&["--theta", "1"], &["--theta 1"]),
        (&["--keys", "1"], &["--keys"]),
        (
            &[
                "--mode",
                "parallel",
                "--size",
                "5000",
                "--volume-blocks",
                "1",
            ],
            &["--size 5000", "--volume-blocks 1"],
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_chorus"))
            .args(["bench", "--local", "/tmp/never-made"])
            .args(flags)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{flags:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        for n in names {
            assert!(err.contains(n), "{flags:?}: {err}");
        }
    }
    let out = Command::new(env!("CARGO_BIN_EXE_chorus"))
        .args([
            "bench",
            "--local",
            "/tmp/never-made",
            "--commit-mode",
            "eventually",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--commit-mode") && err.contains("eventually"),
        "{err}"
    );
    assert!(!std::path::Path::new("/tmp/never-made").exists());
}

#[test]
fn bench_refuses_a_privileged_or_out_of_range_base_port() {
    for bad in ["80", "65001", "x"] {
        let out = Command::new(env!("CARGO_BIN_EXE_chorus"))
            .args(["bench", "--local", "/tmp/never-made", "--base-port", bad])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("--base-port") && err.contains("1024..=65000"),
            "{err}"
        );
    }
    assert!(!std::path::Path::new("/tmp/never-made").exists());
}
