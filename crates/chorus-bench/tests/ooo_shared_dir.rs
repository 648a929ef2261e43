//! `chorus-bench ooo` runs may share `--dir` (CI's smoke and a developer's sweep on one
//! machine both default to `/tmp/chorus-bench-ooo`): a run must touch nothing in it but a
//! subdirectory of its own. Before, a run worked in `--dir` itself, under point directories
//! named only by part, system, clients and repeat, and removed `--dir` at its end: another
//! run's nodes lost their data directories under them and their point failed with "node 1
//! did not lead within 30s".

use std::path::PathBuf;
use std::process::Command;

#[test]
fn a_run_leaves_another_runs_data_in_a_shared_dir_alone() {
    let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("ooo-shared-dir-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let dir = base.join("scratch");
    // Another run's files: a node of the same point (the path this point had before) and a
    // run directory of its own.
    let same_point = dir.join("block-ordered-1-r0/n1");
    let other_run = dir.join("run-other");
    for d in [&same_point, &other_run] {
        std::fs::create_dir_all(d).unwrap();
        std::fs::write(d.join("keep"), b"another run's data").unwrap();
    }
    let out = Command::new(env!("CARGO_BIN_EXE_chorus-bench"))
        .arg("ooo")
        .arg("--dir")
        .arg(&dir)
        .arg("--out")
        .arg(base.join("out"))
        .args([
            "--parts",
            "block",
            "--block-systems",
            "ordered",
            "--depths",
            "1",
        ])
        .args([
            "--repeats",
            "1",
            "--seconds",
            "0.5",
            "--warmup",
            "0",
            "--jitter-ms",
            "0",
        ])
        .output()
        .expect("run chorus-bench");
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        same_point.join("keep").exists(),
        "the run removed another run's node directory\n{log}"
    );
    assert!(
        other_run.join("keep").exists(),
        "the run removed another run's directory\n{log}"
    );
    assert!(out.status.success(), "the run failed\n{log}");
    // And it cleaned up after itself: only the other run's directories are left.
    let mut left: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["block-ordered-1-r0", "run-other"]);
    std::fs::remove_dir_all(&base).unwrap();
}
