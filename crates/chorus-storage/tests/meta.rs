//! Meta storage: crash atomicity on the fault-injecting twin, slot repair, bad input.

use std::path::PathBuf;
use std::sync::Arc;

use chorus_core::format::meta::MetaRecord;
use chorus_core::rng::Rng;
use chorus_storage::fs::{CrashMode, FileSystem, OpenOptions, RealFs, SimFs};
use chorus_storage::{MetaStorage, StorageError};

fn record(n: u64) -> MetaRecord {
    let mut r = MetaRecord {
        log_id: 1,
        block_size: 1 << 26,
        ..MetaRecord::default()
    };
    r.vote.promised_proposal_id = n;
    r.vote.voted_for = Some(n % 3);
    r.membership.voters = vec![0, 1, 2];
    r.base_lsn = n * 100;
    r
}

fn sim(seed: u64) -> (SimFs, Arc<dyn FileSystem>, PathBuf) {
    let fs = SimFs::new(seed);
    let d: Arc<dyn FileSystem> = Arc::new(fs.clone());
    let dir = PathBuf::from("/m");
    d.create_dir_all(&dir).unwrap();
    (fs, d, dir)
}

#[test]
fn survives_random_crashes() {
    let mut steps = 0;
    for seed in 0..100u64 {
        let (fs, d, dir) = sim(seed);
        let mut rng = Rng::new(seed);
        let mut m = MetaStorage::create(d.clone(), &dir, &record(0)).unwrap();
        let mut last_ok = 0;
        for _ in 0..40 {
            steps += 1;
            if rng.chance(1, 4) {
                // A save in flight at the crash: a sync failure models it being cut.
                let n = last_ok + 1;
                fs.fail_next_sync(None);
                assert!(m.save(&record(n)).is_err());
                fs.crash(if rng.chance(1, 2) {
                    CrashMode::Prefix
                } else {
                    CrashMode::Arbitrary
                });
                let (m2, _) = MetaStorage::open(d.clone(), &dir).unwrap();
                let got = m2.current().vote.promised_proposal_id;
                assert!(
                    got == last_ok || got == n,
                    "seed {seed}: got {got}, last ok {last_ok}"
                );
                last_ok = got;
                m = m2;
            } else {
                last_ok += 1;
                m.save(&record(last_ok)).unwrap();
                if rng.chance(1, 3) {
                    fs.crash(CrashMode::Prefix);
                    let (m2, _) = MetaStorage::open(d.clone(), &dir).unwrap();
                    assert_eq!(m2.current(), &record(last_ok), "seed {seed}");
                    m = m2;
                }
            }
        }
    }
    assert!(steps >= 4000);
}

#[test]
fn one_bad_slot_is_repaired_two_are_an_error() {
    let (fs, d, dir) = sim(1);
    let mut m = MetaStorage::create(d.clone(), &dir, &record(1)).unwrap();
    m.save(&record(2)).unwrap();
    let path = dir.join("meta");
    fs.flip_bits(&path, 40, 8, 1).unwrap();
    let (m, rec) = MetaStorage::open(d.clone(), &dir).unwrap();
    assert_eq!(m.current(), &record(2));
    assert_eq!(rec.repaired_slot, Some(0));
    assert!(rec.slot_errors[0].is_some());
    drop(m);
    fs.flip_bits(&path, 40, 8, 1).unwrap();
    fs.flip_bits(&path, 4096 + 40, 8, 1).unwrap();
    let before = fs.durable_content(&path).unwrap();
    match MetaStorage::open(d.clone(), &dir) {
        Err(StorageError::Corrupt { source, .. }) => {
            let s = source.to_string();
            assert!(s.contains("slot 0") && s.contains("slot 1"), "{s}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    assert_eq!(
        fs.durable_content(&path).unwrap(),
        before,
        "nothing changed on disk"
    );
}

#[test]
fn failed_sync_fails_later_saves() {
    let (fs, d, dir) = sim(2);
    let mut m = MetaStorage::create(d, &dir, &record(1)).unwrap();
    fs.fail_next_sync(None);
    assert!(m.save(&record(2)).is_err());
    assert_eq!(m.current(), &record(1));
    assert!(matches!(
        m.save(&record(3)),
        Err(StorageError::Failed { .. })
    ));
}

#[test]
fn garbage_files_are_clear_errors() {
    let (fs, d, dir) = sim(3);
    assert!(matches!(
        MetaStorage::open(d.clone(), &dir),
        Err(StorageError::NotFound { .. })
    ));
    let path = dir.join("meta");
    let f = d.open(&path, OpenOptions::create()).unwrap();
    f.sync_data().unwrap();
    assert!(matches!(
        MetaStorage::open(d.clone(), &dir),
        Err(StorageError::Corrupt { .. })
    ));
    let mut junk = vec![0u8; 8192];
    Rng::new(4).fill(&mut junk);
    f.write_all_at(&junk, 0).unwrap();
    f.sync_data().unwrap();
    assert!(MetaStorage::open(d.clone(), &dir).is_err());
    assert_eq!(fs.durable_content(&path).unwrap(), junk);
    assert!(matches!(
        MetaStorage::create(d, &dir, &record(1)),
        Err(StorageError::AlreadyExists { .. })
    ));
}

#[test]
fn real_fs_round_trip() {
    let dir = std::env::temp_dir().join(format!("chorus-meta-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let fs: Arc<dyn FileSystem> = Arc::new(RealFs::new());
    let mut m = MetaStorage::create(fs.clone(), &dir, &record(1)).unwrap();
    m.save(&record(5)).unwrap();
    drop(m);
    let (m, rec) = MetaStorage::open(fs, &dir).unwrap();
    assert_eq!(m.current(), &record(5));
    assert_eq!(rec.repaired_slot, None);
    std::fs::remove_dir_all(&dir).unwrap();
}
