//! `chorus dev`, the README's first command, end to end: a detached local cluster leads,
//! takes appends and reads them back; starting it again on the same directory in another
//! mode is refused with the way out named; `--fresh` starts over in that mode.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn chorus() -> Command {
    Command::new(env!("CARGO_BIN_EXE_chorus"))
}

/// A base port whose API, replication, metrics and out-of-order replication ports for
/// three nodes (base+1..=3, +101..=103, +201..=203, +301..=303) are free now, below the
/// kernel's ephemeral range (see `common::free_port`), in this process's own stretch.
fn free_base() -> u16 {
    // Tests of this process run at once: each call starts its search elsewhere.
    static CALLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let first = (std::process::id() + call * 97) % 290;
    for k in 0..290u32 {
        let base = 20_000 + (first + k) % 290 * 40;
        let ports = (1..=3).flat_map(|i| [0, 100, 200, 300].map(|off| base + off + i));
        if ports
            .into_iter()
            .all(|p| TcpListener::bind(("127.0.0.1", p as u16)).is_ok())
        {
            return base as u16;
        }
    }
    panic!("no free stretch of ports for a dev cluster")
}

/// The dev cluster's processes (from `DIR/pids`), SIGKILLed when dropped — also when the
/// test fails half-way.
struct Running(PathBuf);

impl Running {
    fn pids(&self) -> Vec<String> {
        std::fs::read_to_string(self.0.join("pids"))
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_string)
            .collect()
    }

    /// Kills the nodes and waits until they are gone (their ports and data free).
    fn stop(&self) {
        let pids = self.pids();
        if pids.is_empty() {
            return;
        }
        let _ = Command::new("kill").arg("-9").args(&pids).output();
        let end = Instant::now() + Duration::from_secs(10);
        while pids
            .iter()
            .any(|p| Path::new(&format!("/proc/{p}")).exists())
            && Instant::now() < end
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = std::fs::remove_file(self.0.join("pids"));
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop();
    }
}

fn dev(dir: &Path, base: u16, extra: &[&str]) -> Output {
    chorus()
        .args(["dev", "--detach", "--dir"])
        .arg(dir)
        .args(["--base-port", &base.to_string()])
        .args(extra)
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn dev_cluster_serves_and_a_directory_of_another_mode_is_refused_with_the_way_out() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("chorus-dev");
    let base = free_base();
    let eps: Vec<String> = (1..=3)
        .map(|i| format!("http://127.0.0.1:{}", base + i))
        .collect();
    let eps = eps.join(",");
    let running = Running(dir.clone());

    let out = dev(&dir, base, &[]);
    let said = text(&out.stdout);
    assert!(out.status.success(), "{said}{}", text(&out.stderr));
    assert!(
        said.contains("3 nodes, group 1 (ordered mode), node") && said.contains("leads"),
        "{said}"
    );
    let out = chorus()
        .args(["append", "--endpoints", &eps, "hello", "world"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).matches("committed").count(), 2);
    let out = chorus()
        .args(["read", "--endpoints", &eps, "--max", "3"])
        .output()
        .unwrap();
    let read = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(read.contains("hello") && read.contains("world"), "{read}");
    running.stop();

    // The directory holds an ordered group 1: a dependent cluster there is refused, by
    // name, with the flags that start over.
    let out = dev(&dir, base, &["--mode", "dependent"]);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{}", text(&out.stdout));
    assert!(
        err.contains("configured as dependent but exists here as an ordered group")
            && err.contains("--fresh --mode dependent"),
        "{err}"
    );

    // --fresh deletes the earlier data and starts that mode (the refused run stopped
    // the nodes it had started).
    running.stop();
    let out = dev(&dir, base, &["--fresh", "--mode", "dependent"]);
    let said = text(&out.stdout);
    assert!(out.status.success(), "{said}{}", text(&out.stderr));
    assert!(said.contains("group 1 (dependent mode)"), "{said}");
    let out = chorus()
        .args(["status", "--endpoints", &eps])
        .output()
        .unwrap();
    let status = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(status.contains("leader"), "{status}");
}

/// `chorus dev --storage --fs DIR`: a fresh storage cluster, volume `fs` with a file
/// system on it, mounted at DIR (FUSE); files written there read back and are on the
/// volume; SIGTERM to the mount (the first pid) unmounts it. Needs /dev/fuse and root
/// (skipped otherwise, unless CHORUS_REQUIRE_FUSE is set).
#[test]
fn dev_storage_mounts_a_file_system_and_a_stop_unmounts_it() {
    use std::os::unix::fs::MetadataExt;
    let root = std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
    if !(root && Path::new("/dev/fuse").exists()) {
        assert!(
            std::env::var_os("CHORUS_REQUIRE_FUSE").is_none(),
            "CHORUS_REQUIRE_FUSE is set, but /dev/fuse is missing or this is not root"
        );
        eprintln!("skipped: needs root and /dev/fuse");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (dir, mnt) = (tmp.path().join("dev"), tmp.path().join("mnt"));
    let base = free_base();
    let run = Running(dir.clone());
    let o = dev(
        &dir,
        base,
        &[
            "--storage",
            "--fs",
            mnt.to_str().unwrap(),
            "--fs-size",
            "128M",
        ],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(out.contains("mounted read-write as host 1 at"), "{out}");
    let listed = |m: &Path| {
        std::fs::read_to_string("/proc/mounts")
            .unwrap()
            .lines()
            .any(|l| l.split(' ').nth(1) == m.to_str())
    };
    assert!(listed(&mnt));
    std::fs::write(mnt.join("hello"), b"from dev").unwrap();
    assert_eq!(std::fs::read(mnt.join("hello")).unwrap(), b"from dev");
    let ctl = (1..=3)
        .map(|i| format!("127.0.0.1:{}", base as u32 + i))
        .collect::<Vec<_>>()
        .join(",");
    let o = chorus()
        .args(["fs", "cat", "fs", "/hello", "--control", &ctl])
        .output()
        .unwrap();
    assert_eq!(text(&o.stdout), "from dev", "{}", text(&o.stderr));
    // The mount stops first (pids lists it first) and unmounts.
    let mount_pid = run.pids()[0].clone();
    Command::new("kill")
        .args(["-TERM", &mount_pid])
        .output()
        .unwrap();
    let end = Instant::now() + Duration::from_secs(20);
    while listed(&mnt) {
        assert!(Instant::now() < end, "still mounted 20 s after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
    run.stop();
}

/// `chorus dev --tls`: a secured cluster (mutual TLS on replication and on the API, the
/// operator's token) leads; client commands with the variables it prints are served,
/// without them refused; a second run reuses the generated files.
#[test]
fn dev_tls_cluster_serves_only_the_operator() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("chorus-dev");
    let base = free_base();
    let eps: Vec<String> = (1..=3)
        .map(|i| format!("https://127.0.0.1:{}", base + i))
        .collect();
    let eps = eps.join(",");
    let running = Running(dir.clone());
    let out = dev(&dir, base, &["--tls"]);
    let said = text(&out.stdout);
    assert!(out.status.success(), "{said}{}", text(&out.stderr));
    assert!(said.contains("export CHORUS_CA="), "{said}");
    let t = dir.join("tls");
    let token = std::fs::read_to_string(t.join("operator.token")).unwrap();
    let secured = |args: &[&str]| {
        chorus()
            .env("CHORUS_CA", t.join("ca.pem"))
            .env("CHORUS_CERT", t.join("client.pem"))
            .env("CHORUS_KEY", t.join("client.key"))
            .env("CHORUS_TLS_NAME", "localhost")
            .env("CHORUS_TOKEN", token.trim())
            .args(args)
            .output()
            .unwrap()
    };
    let out = secured(&["append", "--endpoints", &eps, "hello"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = secured(&["read", "--endpoints", &eps]);
    assert!(text(&out.stdout).contains("hello"), "{}", text(&out.stderr));
    // No token: refused by name. No certificates at all: the handshake fails.
    let out = chorus()
        .env("CHORUS_CA", t.join("ca.pem"))
        .env("CHORUS_CERT", t.join("client.pem"))
        .env("CHORUS_KEY", t.join("client.key"))
        .env("CHORUS_TLS_NAME", "localhost")
        .env_remove("CHORUS_TOKEN")
        .args(["read", "--endpoints", &eps])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("no bearer token"),
        "{}",
        text(&out.stderr)
    );
    let out = chorus()
        .args(["read", "--endpoints", &eps.replace("https", "http")])
        .env_remove("CHORUS_CA")
        .output()
        .unwrap();
    assert!(!out.status.success(), "served in plain text");
    // Again on the same directory: the same CA and token, and the data kept.
    running.stop();
    let out = dev(&dir, base, &["--tls"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        std::fs::read_to_string(t.join("operator.token")).unwrap(),
        token
    );
    let out = secured(&["read", "--endpoints", &eps]);
    assert!(text(&out.stdout).contains("hello"), "{}", text(&out.stderr));
}
