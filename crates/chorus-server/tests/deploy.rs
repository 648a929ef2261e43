//! The deployment files checked into `deploy/` stay usable: every example node
//! configuration is accepted by `chorus server --print-config` (settings renamed or
//! removed would break it), and the systemd unit passes `systemd-analyze verify` with its
//! `ExecStart` pointed at the binary just built.
//!
//! `systemd-analyze` comes with Debian's systemd; without it the unit check warns and
//! returns, unless `CHORUS_REQUIRE_SYSTEMD_ANALYZE=1` (as in CI).

use std::path::{Path, PathBuf};
use std::process::Command;

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

#[test]
fn every_example_node_configuration_is_accepted() {
    let mut seen = 0;
    for e in std::fs::read_dir(deploy().join("config")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_none_or(|x| x != "toml") {
            continue;
        }
        let o = Command::new(env!("CARGO_BIN_EXE_chorus"))
            .args(["server", "--print-config", "--config"])
            .arg(&p)
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success(),
            "{}: {}{}",
            p.display(),
            out,
            String::from_utf8_lossy(&o.stderr)
        );
        let n: u64 = p
            .file_stem()
            .unwrap()
            .to_str()
            .unwrap()
            .trim_start_matches("node")
            .parse()
            .unwrap();
        assert!(out.contains(&format!("node = {n}\n")), "{out}");
        for section in ["[tls]", "[api_tls]", "[api_auth]", "[archive]"] {
            assert!(out.contains(section), "{}: no {section}", p.display());
        }
        seen += 1;
    }
    assert_eq!(
        seen, 3,
        "deploy/config holds the three hosts' configurations"
    );
}

#[test]
fn the_systemd_unit_verifies() {
    let ok = Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var("CHORUS_REQUIRE_SYSTEMD_ANALYZE").as_deref() != Ok("1"),
            "CHORUS_REQUIRE_SYSTEMD_ANALYZE=1 but systemd-analyze is not installed"
        );
        eprintln!("warning: no systemd-analyze: the unit file is not verified");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let unit = std::fs::read_to_string(deploy().join("systemd/chorus.service")).unwrap();
    assert!(unit.contains("ExecStart=/usr/local/bin/chorus server --config "));
    let unit = unit.replace("/usr/local/bin/chorus", env!("CARGO_BIN_EXE_chorus"));
    let path = tmp.path().join("chorus.service");
    std::fs::write(&path, unit).unwrap();
    let o = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    // Complaints about the unit name its file; others (the host's own units) do not.
    let about_ours: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("chorus.service"))
        .collect();
    assert!(o.status.success() && about_ours.is_empty(), "{text}");
}
