//! The standard gRPC services through a real reflection client: `grpcurl` (built from the
//! Go module proxy, `go install github.com/fullstorydev/grpcurl/cmd/grpcurl@v1.9.4`)
//! against a real `chorus server`. It lists and describes the services from reflection
//! alone (no proto file), calls Chorus's own `Status` and `Append` through it, and checks
//! the health names: the node's, a group's once it has a leader, an out-of-order group's,
//! a group's that cannot elect (NOT_SERVING) and a deleted group's (unknown: NOT_FOUND).
//!
//! `grpcurl` is found as `$CHORUS_GRPCURL`, or on the `PATH`; without it the test skips,
//! unless `CHORUS_REQUIRE_GRPCURL` is set (CI sets it).

use std::io::Write;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use chorus_client::{pb, Client};

mod common;
use common::{free_port, Server};

fn grpcurl() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("CHORUS_GRPCURL") {
        return Some(p.into());
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("grpcurl"))
            .find(|p| p.is_file())
    })
}

/// `grpcurl -plaintext [args…] ADDR [method]` with `data` as `-d`: (exit success,
/// stdout, stderr).
fn call(bin: &PathBuf, addr: &str, data: Option<&str>, rest: &[&str]) -> (bool, String, String) {
    let mut c = Command::new(bin);
    c.args(["-plaintext", "-max-time", "10"]);
    if let Some(d) = data {
        c.args(["-d", d]);
    }
    c.arg(addr);
    c.args(rest);
    let out = c.output().expect("run grpcurl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The health status grpcurl prints for `service` (`SERVING`, …), or its error.
fn health(bin: &PathBuf, addr: &str, service: &str) -> Result<String, String> {
    let (ok, out, err) = call(
        bin,
        addr,
        Some(&format!("{{\"service\":\"{service}\"}}")),
        &["grpc.health.v1.Health/Check"],
    );
    if !ok {
        return Err(err);
    }
    let v: serde_json::Value = serde_json::from_str(&out).map_err(|e| format!("{e}: {out}"))?;
    Ok(v["status"].as_str().unwrap_or("").to_string())
}

/// Polls `health` of `service` until it is `want`, for at most 30 s.
fn health_becomes(bin: &PathBuf, addr: &str, service: &str, want: &str) {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let got = health(bin, addr, service);
        if got.as_deref() == Ok(want) {
            return;
        }
        assert!(
            Instant::now() < end,
            "health of {service:?}: {got:?}, want {want}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn grpcurl_lists_calls_and_checks_health_by_reflection() {
    let Some(bin) = grpcurl() else {
        assert!(
            std::env::var_os("CHORUS_REQUIRE_GRPCURL").is_none(),
            "CHORUS_REQUIRE_GRPCURL is set, but no grpcurl (CHORUS_GRPCURL or PATH)"
        );
        eprintln!("skipped: no grpcurl (set CHORUS_GRPCURL, or put it on the PATH)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (api, repl, nobody) = (free_port(), free_port(), free_port());
    let cfg = dir.path().join("n1.toml");
    let mut f = std::fs::File::create(&cfg).unwrap();
    write!(
        f,
        "node = 1\ndata_dir = \"{}\"\nlisten = \"127.0.0.1:{repl}\"\napi_listen = \"127.0.0.1:{api}\"\n\
         io_workers = 1\nlog_filter = \"info\"\n\n[peers]\n\"2\" = \"127.0.0.1:{nobody}\"\n\n\
         [[groups]]\nid = 1\nvoters = [1]\n\n\
         [[groups]]\nid = 2\nvoters = [1]\nmode = \"parallel\"\n\n\
         [[groups]]\nid = 3\nvoters = [1, 2]\n",
        dir.path().join("n1").display(),
    )
    .unwrap();
    let mut node = Server::new(cfg, dir.path().join("n1.log"));
    node.start();
    let addr = format!("127.0.0.1:{api}");

    // The node is up once it answers its own health check.
    health_becomes(&bin, &addr, "", "SERVING");
    health_becomes(&bin, &addr, "chorus.v1.Chorus", "SERVING");

    // Reflection alone tells grpcurl the services and their methods.
    let (ok, out, err) = call(&bin, &addr, None, &["list"]);
    assert!(ok, "list: {err}");
    for s in [
        "chorus.v1.Chorus",
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
    ] {
        assert!(out.lines().any(|l| l.trim() == s), "{s} not listed: {out}");
    }
    // This node hosts no control plane: its service is not served, so not listed.
    assert!(!out.contains("chorus.v1.Control"), "{out}");
    let (ok, out, err) = call(&bin, &addr, None, &["describe", "chorus.v1.Chorus.Append"]);
    assert!(ok, "describe: {err}");
    assert!(
        out.contains("rpc Append") && out.contains("AppendRequest"),
        "{out}"
    );
    let (ok, out, err) = call(&bin, &addr, None, &["describe", "chorus.v1.AppendRequest"]);
    assert!(ok && out.contains("group"), "describe message: {out} {err}");

    // Groups: serving once each knows a leader (a one-voter group elects itself).
    health_becomes(&bin, &addr, "chorus.v1.Chorus/group/1", "SERVING");
    health_becomes(&bin, &addr, "chorus.v1.Chorus/group/2", "SERVING");
    // Group 3 needs node 2, which is not there: no leader, so not serving.
    health_becomes(&bin, &addr, "chorus.v1.Chorus/group/3", "NOT_SERVING");
    // Not hosted here: unknown to the health service.
    let err = health(&bin, &addr, "chorus.v1.Chorus/group/77").unwrap_err();
    assert!(err.contains("NotFound"), "{err}");

    // Chorus's own methods through reflection: Status, then an append that commits.
    let (ok, out, err) = call(
        &bin,
        &addr,
        Some("{\"group\":1}"),
        &["chorus.v1.Chorus/Status"],
    );
    assert!(ok, "Status: {err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["groups"][0]["role"], "leader", "{out}");
    // bytes fields are base64 in grpcurl's JSON: "aGVsbG8=" is "hello".
    let (ok, out, err) = call(
        &bin,
        &addr,
        Some("{\"group\":1,\"records\":[\"aGVsbG8=\"]}"),
        &["chorus.v1.Chorus/Append"],
    );
    assert!(ok, "Append: {err}");
    assert!(out.contains("COMMITTED"), "{out}");

    // A deleted group is no longer known to the health service.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut c = Client::new(vec![format!("http://{addr}")]);
        c.delete_group(0, 2, true).await.unwrap();
        let s: Vec<pb::StatusResponse> = c
            .status_all(0)
            .await
            .into_iter()
            .map(|(_, r)| r.unwrap())
            .collect();
        assert!(s[0].groups.iter().all(|g| g.group != 2), "{s:?}");
    });
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        match health(&bin, &addr, "chorus.v1.Chorus/group/2") {
            Err(e) if e.contains("NotFound") => break,
            other => assert!(Instant::now() < end, "deleted group's health: {other:?}"),
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    node.kill9();
}
