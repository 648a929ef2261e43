//! Scenario scripts with golden output: `tests/testdata/*.txt`. Each command is followed by
//! `----` and its expected output. Regenerate with `UPDATE_GOLDEN=1 cargo test -p
//! chorus-sim --test scenarios` and review the diff like code.

use std::path::Path;

use chorus_sim::script::run_script;

fn check(name: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/testdata")
        .join(name);
    let script = std::fs::read_to_string(&path).expect("read script");
    let actual = run_script(&script);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &actual).expect("write golden");
        return;
    }
    assert!(
        actual.trim_end() == script.trim_end(),
        "{name}: output differs from the golden file; actual:\n{actual}"
    );
    assert!(
        !actual.contains("error:"),
        "{name}: a command failed:\n{actual}"
    );
}

macro_rules! scenarios {
    ($($t:ident),* $(,)?) => {
        $(#[test] fn $t() { check(concat!(stringify!($t), ".txt")); })*
    };
}

scenarios!(
    gap_resend,
    timed_resend,
    fig6_pending_follower,
    fig8a_barrier,
    fig8b_config_version,
    priority_failover,
    piggyback_fig3_commit_point,
    leader_recovery,
    follower_recovery,
    lease_expiry,
    repair_from_peer,
    repair_all_copies_bad,
    rebase_behind_trim,
    rebase_pending_unknown,
    rebase_candidate_fetch,
);
