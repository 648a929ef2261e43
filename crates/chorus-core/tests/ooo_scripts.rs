//! Golden scenario scripts for the out-of-order replicas: `tests/testdata/ooo/*.txt`,
//! run by the interpreter in `tests/ooo_scripts/` (its module documentation lists the
//! commands). Each command is followed by `----` and its expected output. Regenerate with
//! `UPDATE_GOLDEN=1 cargo test -p chorus-core --test ooo_scripts` and review the diff like
//! code.

#[path = "ooo_scripts/mod.rs"]
mod script;

use std::path::Path;

use script::run_script;

/// Scripts that must exist: each reproduces a passage of the papers.
const AT_LEAST: usize = 5;

/// Runs one script; `Err` says how it failed.
fn check(path: &Path) -> Result<(), String> {
    let name = path.file_name().expect("a file").to_string_lossy();
    let script = std::fs::read_to_string(path).map_err(|e| format!("{name}: read: {e}"))?;
    let actual = run_script(&script);
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

/// Every script in `tests/testdata/ooo/` runs: a new scenario needs only its file.
#[test]
fn every_ooo_scenario_in_testdata_matches_its_golden_output() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/testdata/ooo");
    let mut scripts: Vec<_> = std::fs::read_dir(&dir)
        .expect("list testdata/ooo")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "txt"))
        .collect();
    scripts.sort();
    assert!(
        scripts.len() >= AT_LEAST,
        "scripts missing from {}",
        dir.display()
    );
    let failed: Vec<String> = scripts.iter().filter_map(|p| check(p).err()).collect();
    assert!(
        failed.is_empty(),
        "{} of {} scenarios failed:\n{}",
        failed.len(),
        scripts.len(),
        failed.join("\n")
    );
}
