//! Stopping an out-of-order group whose environment shut down under load. A file of its
//! own: its 2,000 concurrent appends would load the machine under the timing-sensitive
//! cluster tests of `tests/ooo.rs` if they ran side by side.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chorus_core::ooo::group::Record;
use chorus_core::ooo::replica::{Declared, Mode};
use chorus_runtime::ooo::{OooNodeConfig, OooStateMachine};
use chorus_runtime::{Env, EnvConfig};

/// Applies slowly (20 ms a call: a state machine waiting on its own IO).
struct Slow;

impl OooStateMachine for Slow {
    fn apply(&self, _slot: u64, _records: &[(u32, Record)]) -> std::io::Result<()> {
        std::thread::sleep(Duration::from_millis(20));
        Ok(())
    }
    fn checkpoint(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn image(&self) -> std::io::Result<Vec<u8>> {
        Ok(Vec::new())
    }
    fn restore(&self, _: &[u8]) -> std::io::Result<()> {
        Ok(())
    }
}

/// A group whose environment shut down under load stops at once when dropped, and every
/// writer still waiting hears back (a result, or that the group stopped). Jobs left on
/// the apply workers' queue at their shutdown are dropped with it: `applyq`'s
/// `a_closed_queue_keeps_nothing` checks that part deterministically.
#[test]
fn a_group_dropped_after_its_environment_shut_down_stops_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let env = Env::open(EnvConfig::new(
        1,
        dir.path(),
        "127.0.0.1:0".parse().unwrap(),
    ))
    .unwrap();
    let cfg = OooNodeConfig {
        id: 1,
        group: 7,
        voters: vec![1],
        others: Vec::new(),
        mode: Mode::Dependent,
        dir: dir.path().join("ooo"),
        election_timeout: Duration::from_millis(300),
        apply_threads: 2,
        catchup_rate: 0,
        conflict_order: false,
        compact_bytes: 0,
        hole_resend: chorus_core::ooo::replica::HOLE_RESEND,
        timed_resend: chorus_core::ooo::replica::TIMED_RESEND,
        freeze_interval: Duration::ZERO,
        preallocate: 0,
        direct_io: true,
        disk: None,
        fs: None,
    };
    let node = env.start_ooo_group(cfg, Arc::new(Slow)).unwrap();
    let t0 = Instant::now();
    while !node.status().is_some_and(|s| s.serving) {
        assert!(t0.elapsed() < Duration::from_secs(20), "no leader");
        std::thread::sleep(Duration::from_millis(10));
    }
    let pending: Vec<_> = (0..2000u64)
        .map(|i| {
            let d = Declared::Txn {
                read_set: vec![i % 7],
                write_set: vec![i % 5],
            };
            node.submit(d, i.to_le_bytes().to_vec())
        })
        .collect();
    std::thread::sleep(Duration::from_millis(20));
    env.shutdown();
    let t = Instant::now();
    drop(node);
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "the drop waited {:?}",
        t.elapsed()
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        for f in pending {
            let r = tokio::time::timeout(Duration::from_secs(10), f).await;
            assert!(r.is_ok(), "a writer never heard back");
        }
    });
}
