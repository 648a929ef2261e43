//! Tests of the parent module.

use super::*;

#[test]
fn peers_round_trip_and_bad_ones_are_named() {
    let p = vec![
        (1, "127.0.0.1:5000".parse().unwrap()),
        (2, "127.0.0.1:6000".parse().unwrap()),
    ];
    assert_eq!(parse_peers(&format_peers(&p)).unwrap(), p);
    assert!(parse_peers("1").unwrap_err().contains("ID=HOST:PORT"));
    assert!(parse_peers("0=127.0.0.1:1")
        .unwrap_err()
        .contains("1 or more"));
    assert!(parse_peers("1=nowhere").unwrap_err().contains("nowhere"));
}

#[test]
fn declarations_follow_the_documented_adaptation() {
    // Parallel: the read key is a block too, once.
    assert_eq!(
        declare(System::Parallel, Some(5), 9),
        Some(Declared::Blocks(vec![
            BlockRange::new(9, 1).unwrap(),
            BlockRange::new(5, 1).unwrap()
        ]))
    );
    assert_eq!(
        declare(System::ParallelTxn, Some(5), 9),
        declare(System::Parallel, Some(5), 9)
    );
    assert_eq!(
        declare(System::Parallel, Some(9), 9),
        Some(Declared::Blocks(vec![BlockRange::new(9, 1).unwrap()]))
    );
    assert_eq!(
        declare(System::Dependent, Some(5), 9),
        Some(Declared::Txn {
            read_set: vec![5],
            write_set: vec![9]
        })
    );
    assert_eq!(
        declare(System::InOrder, Some(5), 9),
        Some(Declared::Txn {
            read_set: vec![0],
            write_set: vec![0]
        })
    );
    assert_eq!(declare(System::Ordered, Some(5), 9), None);
}

#[test]
fn names_parse_back_and_unknown_ones_are_refused() {
    for s in System::ALL {
        assert_eq!(System::parse(s.name()).unwrap(), s);
    }
    assert!(System::parse("raft")
        .unwrap_err()
        .contains("expected ordered"));
    assert!(Part::parse("x").unwrap_err().contains("expected block"));
}

#[test]
fn records_carry_a_unique_id_and_their_keys() {
    let mut g = Gen {
        part: Part::YcsbClients,
        sys: System::Dependent,
        rng: Rng::new(1),
        zipf: Some(Arc::new(Zipf::new(1000, 0.9).unwrap())),
        id_base: 3 << 40,
        seq: 0,
        bytes: 100,
    };
    let (d1, a) = g.next();
    let (_, b) = g.next();
    assert_eq!(a.len(), 100);
    assert_ne!(a[..8], b[..8]);
    let w = u64::from_le_bytes(a[8..16].try_into().unwrap());
    let r = u64::from_le_bytes(a[16..24].try_into().unwrap());
    assert_eq!(
        d1,
        Some(Declared::Txn {
            read_set: vec![r],
            write_set: vec![w]
        })
    );
}

#[test]
fn summary_takes_medians_and_ratios() {
    let mk = |system, ops: f64, gap_us: f64| Point {
        part: Part::YcsbClients,
        system,
        repeat: 0,
        clients: 4,
        theta: Some(0.99),
        ops_per_sec: ops,
        committed: 1,
        errors: 0,
        seconds: 1.0,
        lat_mean_us: 1.0,
        lat_p50_us: 1.0,
        lat_p99_us: 1.0,
        cpu: vec![0.5, 0.1, 0.1],
        gap: Some(GapStats {
            count: 1,
            median_us: gap_us,
            p99_us: gap_us,
            mean_us: gap_us,
            max_us: gap_us,
        }),
        gap_per_follower: vec![],
        staleness: Some(GapStats {
            count: 1,
            median_us: 2.0 * gap_us,
            p99_us: 2.0 * gap_us,
            mean_us: 2.0 * gap_us,
            max_us: 2.0 * gap_us,
        }),
        applied_by_end: vec![ops / 1000.0, 1.0],
        error: None,
        terms: None,
        records_per_entry: None,
        after_per_entry: None,
        held_per_entry: (system == System::Dependent).then_some(ops / 1000.0),
        queue_mean_us: None,
        fsync_mean_us: None,
        peer_ack_mean_us: vec![],
    };
    let pts = vec![
        mk(System::Dependent, 300.0, 50.0),
        mk(System::Dependent, 100.0, 50.0),
        mk(System::Dependent, 200.0, 50.0),
        mk(System::Ordered, 100.0, 200.0),
        mk(System::OrderedNoRepair, 50.0, 400.0),
    ];
    let s = summarize(&pts);
    // Against the ordered replica without its repairs too, each ratio once.
    let vs = |a: &str, b: &str| {
        let v: Vec<_> = s["ratios"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["system"] == a && r["vs"] == b)
            .cloned()
            .collect();
        assert_eq!(v.len(), 1, "{a} vs {b}: {v:?}");
        v[0].clone()
    };
    assert_eq!(
        vs("dependent", "ordered-no-repair")["throughput_ratio"],
        4.0
    );
    assert_eq!(vs("dependent", "ordered-no-repair")["gap_lower_by"], 8.0);
    assert_eq!(vs("ordered", "ordered-no-repair")["throughput_ratio"], 2.0);
    let r = s["ratios"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["vs"] == "ordered")
        .unwrap()
        .clone();
    assert_eq!(r["throughput_ratio"], 2.0);
    assert_eq!(r["gap_lower_by"], 4.0);
    // Staleness medians, and the slower follower's fraction applied (median of the
    // repeats' minima: 0.1, 0.3, 0.2 -> 0.2).
    let dep = s["medians"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["system"] == "dependent")
        .unwrap()
        .clone();
    assert_eq!(dep["staleness_median_us"], 100.0);
    assert_eq!(dep["applied_by_end_min"], 0.2);
    assert_eq!(dep["held_per_entry"], 0.2);
    assert_eq!(
        dep["after_per_entry"],
        serde_json::Value::Null,
        "none measured"
    );
}

#[test]
fn each_run_gets_a_scratch_of_its_own_and_removes_only_that() {
    let dir = std::env::temp_dir().join(format!("chorus-bench-scratch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("someone-else")).unwrap();
    std::fs::write(dir.join("someone-else/keep"), b"x").unwrap();
    let a = Scratch::create(&dir).unwrap();
    let b = Scratch::create(&dir).unwrap();
    assert_ne!(a.path(), b.path(), "two runs, two directories");
    let canon = std::fs::canonicalize(&dir).unwrap();
    assert_eq!(a.path().parent(), Some(canon.as_path()));
    std::fs::write(b.path().join("node"), b"y").unwrap();
    drop(a);
    assert!(
        dir.join("someone-else/keep").exists(),
        "another run's data stays"
    );
    assert!(b.path().join("node").exists(), "the other scratch stays");
    let bp = b.path().to_path_buf();
    drop(b);
    assert!(!bp.exists(), "a scratch is removed with what is in it");
    assert!(dir.join("someone-else/keep").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}
