//! The `chorus-sim` command line: flags are honoured or refused by name, never ignored.

use std::process::Command;
use std::time::{Duration, Instant};

fn sim(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_chorus-sim"))
        .args(args)
        .output()
        .expect("run chorus-sim")
}

/// `--time-budget` stops an out-of-order batch from starting new seeds: a batch far too
/// large for the budget ends soon after it, having run fewer seeds than asked.
#[test]
fn an_out_of_order_batch_keeps_its_time_budget() {
    let t = Instant::now();
    let out = sim(&[
        "--ooo",
        "dependent",
        "--seeds",
        "100000",
        "--time-budget",
        "1",
        "--threads",
        "1",
    ]);
    let took = t.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let seeds: u64 = stdout
        .split_whitespace()
        .find_map(|w| w.strip_prefix("seeds="))
        .expect("a seeds= count")
        .parse()
        .unwrap();
    assert!((1..100000).contains(&seeds), "ran {seeds} seeds: {stdout}");
    // One seed runs for well under a minute even in a debug build; 100,000 would not.
    assert!(took < Duration::from_secs(120), "took {took:?}");
}

/// Flags of one kind of run are refused by the other, naming the flag, with exit code 2.
#[test]
fn flags_of_the_other_kind_of_run_are_refused_by_name() {
    for (args, flag) in [
        (&["--ooo", "parallel", "--mirror"][..], "--mirror"),
        (&["--ooo", "parallel", "--mode", "sync"][..], "--mode"),
        (
            &["--ooo", "dependent", "--gap-resend", "1"][..],
            "--gap-resend",
        ),
        (&["--no-transfers"][..], "--no-transfers"),
        (&["--mode", "sync", "--full-images"][..], "--full-images"),
        (&["--trim-followers"][..], "--trim-followers"),
    ] {
        let out = sim(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(flag), "{args:?}: {stderr}");
    }
}
