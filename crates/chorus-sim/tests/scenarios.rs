//! Scenario scripts with golden output: `tests/testdata/*.txt` drive a simulated ordered
//! cluster ([`chorus_sim::script`]), `tests/testdata/ooo/*.txt` out-of-order replicas at
//! the message level ([`chorus_sim::ooo::script`]). Each command is followed by `----` and
//! its expected output. Regenerate with `UPDATE_GOLDEN=1 cargo test -p chorus-sim --test
//! scenarios` and review the diff like code.

use std::path::{Path, PathBuf};

/// Runs one script with `run`; `Err` says how it failed.
fn check(path: &Path, run: fn(&str) -> String) -> Result<(), String> {
    let name = path.file_name().expect("a file").to_string_lossy();
    let script = std::fs::read_to_string(path).map_err(|e| format!("{name}: read: {e}"))?;
    let actual = run(&script);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(path, format!("{}\n", actual.trim_end()))
            .map_err(|e| format!("{name}: write: {e}"))?;
    } else if actual.trim_end() != script.trim_end() {
        return Err(format!(
            "{name}: output differs from the golden file; actual:\n{actual}"
        ));
    }
    if actual.contains("error:") {
        return Err(format!("{name}: a command failed:\n{actual}"));
    }
    Ok(())
}

/// The `*.txt` scripts in `tests/testdata/<sub>`, sorted.
fn scripts(sub: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/testdata")
        .join(sub);
    let mut scripts: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("list {}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "txt"))
        .collect();
    scripts.sort();
    scripts
}

/// Runs every script of a directory; a new scenario needs only its file.
fn run_all(sub: &str, at_least: usize, run: fn(&str) -> String) {
    let scripts = scripts(sub);
    assert!(
        scripts.len() >= at_least,
        "scripts missing from tests/testdata/{sub}"
    );
    let failed: Vec<String> = scripts.iter().filter_map(|p| check(p, run).err()).collect();
    assert!(
        failed.is_empty(),
        "{} of {} scenarios failed:\n{}",
        failed.len(),
        scripts.len(),
        failed.join("\n")
    );
}

/// The ordered replica's scenarios (PALF, the piggyback paper).
#[test]
fn every_scenario_in_testdata_matches_its_golden_output() {
    run_all("", 15, chorus_sim::script::run_script);
}

/// The out-of-order replicas' scenarios (ParallelRaft's look-behind, merge and catch-up;
/// DP-Raft Fig. 5; a membership change and a transfer).
#[test]
fn every_ooo_scenario_in_testdata_matches_its_golden_output() {
    run_all("ooo", 5, chorus_sim::ooo::script::run_script);
}
