//! Log storage: trimming and rebasing, and a rebase under crashes and IO errors at every
//! step.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use chorus_core::format::block::BlockHeader;
use chorus_core::format::group::ChainPoint;
use chorus_core::rng::Rng;
use chorus_storage::fs::{CrashMode, FileSystem, FsFile, OpenOptions, RealFs, SimFs};
use chorus_storage::log::block_file_name;
use chorus_storage::{LogOptions, LogStorage, StorageError};

mod common;
use common::*;

/// Trim keeps whole blocks: the start becomes the start of the first block kept (the same
/// after a reopen), its chain point comes from that block's header, and the tail stays.
#[test]
fn trim_is_block_granular_and_the_start_has_a_chain_point() {
    let (_, fs, dir) = sim();
    let (mut log, written) = build(&fs, &dir, opts(), 21, 4 * BS + 500);
    assert_eq!(log.start_chain().unwrap(), ChainPoint::default());
    let ids = log.block_ids();
    let tail = *ids.last().unwrap();
    assert!(ids.len() >= 5);

    // Below the end of the first block: nothing goes.
    log.trim(BS / 2).unwrap();
    assert_eq!(log.start_lsn(), 0);
    assert_eq!(log.block_ids(), ids);

    // Mid-block: the blocks wholly below go, the start is the next block's start.
    log.trim(2 * BS + 10).unwrap();
    assert_eq!(log.start_lsn(), 2 * BS);
    assert_eq!(log.block_ids()[0], 2);
    let start = log.start_chain().unwrap();
    assert_eq!(start, log.chain_at(2 * BS).unwrap());
    assert_eq!(start.end_lsn, 2 * BS);
    // The first group kept starts there and continues that chain.
    let (h, _) = log.read_group(2 * BS).unwrap();
    assert_eq!(h.lsn, 2 * BS);
    match log.read_group(2 * BS - 100) {
        Err(StorageError::Trimmed { start, .. }) => assert_eq!(start, 2 * BS),
        other => panic!("expected Trimmed, got {other:?}"),
    }
    assert!(matches!(
        log.chain_at(BS),
        Err(StorageError::Trimmed { .. })
    ));
    let kept = all_bytes(&log);
    assert_eq!(&kept[..], &written[2 * BS as usize..]);
    // Trimming again at or below the start changes nothing.
    log.trim(BS).unwrap();
    log.trim(2 * BS + 4000).unwrap();
    assert_eq!(log.start_lsn(), 2 * BS);

    // After a restart the start and its chain are the same.
    drop(log);
    let (mut log, _) = LogStorage::open(fs.clone(), &dir, opts(), LOG_ID).unwrap();
    assert_eq!(log.start_lsn(), 2 * BS);
    assert_eq!(log.start_chain().unwrap(), start);

    // Past the end: the tail block is kept, the end does not move.
    let end = log.end_lsn();
    log.trim(u64::MAX).unwrap();
    assert_eq!(log.block_ids(), vec![tail]);
    assert_eq!(log.start_lsn(), tail * BS);
    assert_eq!(log.end_lsn(), end);
    assert_eq!(log.start_chain().unwrap(), log.chain_at(tail * BS).unwrap());
    let r = log.recovered().unwrap();
    assert_eq!(r.start, tail * BS);
    assert_eq!(r.groups.last().map(|g| g.end()), Some(end));
}

/// Rebase to a chain point beyond the end, then into the middle of the old log (the new
/// block's id among the old ones): empty at the base, reads below trimmed, appends from a
/// peer continue it, and it all survives reopening.
fn rebase_roundtrip(fs: Arc<dyn FileSystem>, dir: &Path, o: LogOptions) {
    let peer_dir = dir.join("peer");
    let (mut peer, _) = build(&fs, &peer_dir, o, 31, 6 * BS + 700);
    let own_dir = dir.join("own");
    let (mut log, _) = build(&fs, &own_dir, o, 32, 2 * BS + 300);

    for base_lsn in [5 * BS, BS] {
        // The peer trimmed up to there; its start chain is the base.
        if peer.start_lsn() < base_lsn {
            peer.trim(base_lsn).unwrap();
        }
        let base = peer.chain_at(base_lsn).unwrap();
        log.rebase(base).unwrap();
        assert_eq!(log.start_lsn(), base_lsn);
        assert_eq!(log.end_lsn(), base_lsn);
        assert_eq!(log.flushed_end(), base_lsn);
        assert_eq!(log.chain(), base);
        assert_eq!(log.start_chain().unwrap(), base);
        assert_eq!(log.block_ids(), vec![base_lsn / BS]);
        assert!(log.damaged().is_none());
        assert!(matches!(
            log.read_group(base_lsn - 64),
            Err(StorageError::Trimmed { .. })
        ));
        assert!(matches!(
            log.read_group(base_lsn),
            Err(StorageError::BeyondEnd { .. })
        ));
        assert_eq!(log.iter_from(base_lsn).count(), 0);
        let r = log.recovered().unwrap();
        assert_eq!(r.start, base_lsn);
        assert_eq!(r.floor, base);
        assert!(r.groups.is_empty());
        assert_eq!(r.committed, base_lsn);
        assert_eq!(
            list_log(&fs, &own_dir),
            vec![block_file_name(base_lsn / BS)]
        );

        // Reopened as it is: the same empty log.
        drop(log);
        let (l, report) = LogStorage::open(fs.clone(), &own_dir, o, LOG_ID).unwrap();
        log = l;
        assert_eq!(report.end_lsn, base_lsn);
        assert_eq!(report.completed_rebase, None);
        assert_eq!((log.start_lsn(), log.chain()), (base_lsn, base));
        let r = log.recovered().unwrap();
        assert_eq!((r.start, r.floor, r.committed), (base_lsn, base, base_lsn));

        // The peer's groups continue it, across blocks.
        let more = groups_from(&peer, base_lsn);
        log.append(&more).unwrap();
        assert_eq!(log.end_lsn(), peer.end_lsn());
        assert_eq!(log.chain(), peer.chain());
        assert_eq!(log.sync().unwrap(), peer.end_lsn());
        assert_eq!(all_bytes(&log), more);
        drop(log);
        let (l, report) = LogStorage::open(fs.clone(), &own_dir, o, LOG_ID).unwrap();
        log = l;
        assert_eq!(report.end_lsn, peer.end_lsn());
        assert_eq!(log.start_lsn(), base_lsn);
        assert_eq!(all_bytes(&log), more);
        assert_eq!(log.block_ids()[0], base_lsn / BS);
        let r = log.recovered().unwrap();
        assert_eq!(r.start, base_lsn);
        assert_eq!(r.groups.last().map(|g| g.end()), Some(peer.end_lsn()));
        assert!(r.committed >= base_lsn);
        // A fresh peer log for the next round, since trims cannot go back.
        if base_lsn == 5 * BS {
            drop(peer);
            let d = dir.join("peer2");
            peer = build(&fs, &d, o, 33, 3 * BS + 100).0;
        }
    }
    // The first round rebased beyond the end, the second below the start (blocks 5..
    // gone, block 1 new); now a base inside the log (blocks 1..=3), whose new block has
    // the id of an old one, and the same log continued after it.
    assert_eq!(log.block_ids(), vec![1, 2, 3]);
    let base = peer.chain_at(2 * BS).unwrap();
    assert_eq!(log.chain_at(2 * BS).unwrap(), base, "the same log");
    log.rebase(base).unwrap();
    assert_eq!(log.block_ids(), vec![2]);
    assert_eq!((log.start_lsn(), log.end_lsn()), (2 * BS, 2 * BS));
    assert_eq!(list_log(&fs, &own_dir), vec![block_file_name(2)]);
    let more = groups_from(&peer, 2 * BS);
    log.append(&more).unwrap();
    log.sync().unwrap();
    drop(log);
    let (log, _) = LogStorage::open(fs, &own_dir, o, LOG_ID).unwrap();
    assert_eq!(log.start_lsn(), 2 * BS);
    assert_eq!(log.start_chain().unwrap(), base);
    assert_eq!(log.chain(), peer.chain());
    assert_eq!(all_bytes(&log), more);
}

#[test]
fn rebase_sim() {
    let (_, fs, dir) = sim();
    rebase_roundtrip(fs, &dir, opts());
}

#[test]
fn rebase_sim_buffered_with_zeros_ahead() {
    let (_, fs, dir) = sim();
    let o = LogOptions {
        direct_io: false,
        ..ahead(opts(), 16384)
    };
    rebase_roundtrip(fs, &dir, o);
}

#[test]
fn rebase_real() {
    let dir = std::env::temp_dir().join(format!("chorus-log-rebase-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    rebase_roundtrip(Arc::new(RealFs::new()), &dir, direct());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A base not at a block start is refused by name, changing nothing.
#[test]
fn rebase_to_an_unaligned_base_is_refused() {
    let (_, fs, dir) = sim();
    let (mut log, written) = build(&fs, &dir, opts(), 41, BS + 200);
    let base = log
        .chain_at(log.read_group(BS).unwrap().0.end_lsn())
        .unwrap();
    match log.rebase(base) {
        Err(StorageError::NotABlockBoundary { lsn, block_size }) => {
            assert_eq!((lsn, block_size), (base.end_lsn, BS));
        }
        other => panic!("expected NotABlockBoundary, got {other:?}"),
    }
    assert_eq!(all_bytes(&log), written);
    assert_eq!(log.block_ids(), vec![0, 1]);
    assert_eq!(
        list_log(&fs, &dir),
        vec![block_file_name(0), block_file_name(1)]
    );
    // Not a failure of the storage: appends go on.
    let g = next_groups(&mut Rng::new(1), &log.chain(), 2);
    log.append(&g).unwrap();
    log.sync().unwrap();
}

/// The file system of the crash tests: the sim's, with a crash (or a plain IO error) in
/// place of the n-th operation that changes something.
#[derive(Debug)]
struct Faulty(Arc<FaultyShared>);

#[derive(Debug)]
struct FaultyShared {
    sim: SimFs,
    ctl: Mutex<Ctl>,
}

#[derive(Debug, Default)]
struct Ctl {
    /// Operations to let through before the fault; `None`: no fault.
    left: Option<u64>,
    /// Crash the sim in place of the operation, or only fail it.
    crash: Option<CrashMode>,
    tripped: bool,
}

impl FaultyShared {
    fn arm(&self, left: u64, crash: Option<CrashMode>) {
        *self.ctl.lock().unwrap() = Ctl {
            left: Some(left),
            crash,
            tripped: false,
        };
    }

    fn disarm(&self) -> bool {
        std::mem::take(&mut *self.ctl.lock().unwrap()).tripped
    }

    fn step(&self) -> io::Result<()> {
        let mut c = self.ctl.lock().unwrap();
        if c.tripped {
            return Err(io::Error::other("after the injected fault"));
        }
        match c.left {
            Some(0) => {
                c.tripped = true;
                if let Some(mode) = c.crash {
                    self.sim.crash(mode);
                }
                Err(io::Error::other("injected fault"))
            }
            Some(n) => {
                c.left = Some(n - 1);
                Ok(())
            }
            None => Ok(()),
        }
    }
}

#[derive(Debug)]
struct FaultyFile {
    inner: Box<dyn FsFile>,
    fs: Arc<FaultyShared>,
}

impl FsFile for FaultyFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.inner.read_at(buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.fs.step()?;
        self.inner.write_all_at(buf, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.fs.step()?;
        self.inner.sync_data()
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.fs.step()?;
        self.inner.set_len(len)
    }
    fn is_direct(&self) -> bool {
        self.inner.is_direct()
    }
}

impl FileSystem for Faulty {
    fn open(&self, path: &Path, opts: OpenOptions) -> io::Result<Box<dyn FsFile>> {
        self.0.step()?;
        Ok(Box::new(FaultyFile {
            inner: self.0.sim.open(path, opts)?,
            fs: self.0.clone(),
        }))
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.0.step()?;
        self.0.sim.create_dir_all(path)
    }
    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        self.0.sim.list_dir(path)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.0.step()?;
        self.0.sim.remove_file(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.0.step()?;
        self.0.sim.rename(from, to)
    }
    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        self.0.step()?;
        self.0.sim.sync_dir(path)
    }
    fn exists(&self, path: &Path) -> io::Result<bool> {
        self.0.sim.exists(path)
    }
    fn supports_direct_io(&self, dir: &Path) -> bool {
        self.0.sim.supports_direct_io(dir)
    }
}

/// What a reopened log is after an interrupted rebase.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Old,
    New,
}

struct Before {
    bytes: Vec<u8>,
    end: u64,
    blocks: Vec<u64>,
}

/// A log on a fault-injecting file system, and what it held before the faults.
struct FaultyLog {
    sim: SimFs,
    shared: Arc<FaultyShared>,
    fs: Arc<dyn FileSystem>,
    dir: PathBuf,
    log: LogStorage,
    before: Before,
}

/// A log of `len` bytes of groups (from `seed`) in `/r`, on a fault-injecting file
/// system over a fresh [`SimFs`] seeded with `fs_seed`.
fn faulty_log(fs_seed: u64, seed: u64, len: u64) -> FaultyLog {
    let sim = SimFs::new(fs_seed);
    let shared = Arc::new(FaultyShared {
        sim: sim.clone(),
        ctl: Mutex::new(Ctl::default()),
    });
    let fs: Arc<dyn FileSystem> = Arc::new(Faulty(shared.clone()));
    let dir = PathBuf::from("/r");
    fs.create_dir_all(&dir).unwrap();
    let (log, bytes) = build(&fs, &dir, opts(), seed, len);
    let before = Before {
        bytes,
        end: log.end_lsn(),
        blocks: log.block_ids(),
    };
    FaultyLog {
        sim,
        shared,
        fs,
        dir,
        log,
        before,
    }
}

/// Opens the log on the sim (no faults) and checks it is exactly the old log or exactly
/// the new one at `base`, with no temporary file left.
fn classify(sim: &SimFs, dir: &Path, before: &Before, base: ChainPoint, what: &str) -> Outcome {
    let fs: Arc<dyn FileSystem> = Arc::new(sim.clone());
    let (log, report) = LogStorage::open(fs.clone(), dir, opts(), LOG_ID)
        .unwrap_or_else(|e| panic!("{what}: open failed: {e}"));
    assert!(
        !list_log(&fs, dir).iter().any(|n| n == "rebase.tmp"),
        "{what}: temporary file left"
    );
    if log.start_lsn() == base.end_lsn {
        assert_eq!(log.end_lsn(), base.end_lsn, "{what}");
        assert_eq!(log.chain(), base, "{what}");
        assert_eq!(log.block_ids(), vec![base.end_lsn / BS], "{what}");
        assert_eq!(report.end_lsn, base.end_lsn, "{what}");
        Outcome::New
    } else {
        assert_eq!(log.start_lsn(), 0, "{what}");
        assert_eq!(log.end_lsn(), before.end, "{what}");
        assert_eq!(log.block_ids(), before.blocks, "{what}");
        assert_eq!(all_bytes(&log), before.bytes, "{what}");
        assert_eq!(report.completed_rebase, None, "{what}");
        Outcome::Old
    }
}

/// A crash in place of every file operation of a rebase, and then again in place of every
/// operation of the open that finishes it: every reopen finds the old log intact or the
/// new empty log at the base, never a mix or an error, and the new one from the moment
/// the temporary file was durable.
#[test]
fn a_crash_at_any_step_of_a_rebase_leaves_the_old_or_the_new_log() {
    let mut runs = 0;
    for (target, base_lsn) in [("beyond", 6 * BS), ("inside", 2 * BS)] {
        for mode in [CrashMode::Prefix, CrashMode::Arbitrary] {
            let mut first_new = None;
            let mut n = 0;
            loop {
                let mut finished = false;
                let mut m = 0;
                loop {
                    runs += 1;
                    let what = format!("{target} {mode:?} crash at op {n}, then at op {m}");
                    let FaultyLog {
                        sim,
                        shared,
                        fs,
                        dir,
                        mut log,
                        before,
                    } = faulty_log(n * 1000 + m, 51, 3 * BS + 300);
                    let base = ChainPoint {
                        end_lsn: base_lsn,
                        acc_crc: 0x1234_5678 ^ base_lsn as u32,
                        next_group_seq: 1000 + base_lsn,
                        max_csn: 77 + base_lsn,
                    };
                    shared.arm(n, Some(mode));
                    let r = log.rebase(base);
                    if !shared.disarm() {
                        r.unwrap();
                        finished = true;
                        sim.crash(mode);
                    } else {
                        assert!(matches!(r, Err(StorageError::Io { .. })), "{what}: {r:?}");
                        assert!(
                            matches!(log.rebase(base), Err(StorageError::Failed { .. })),
                            "{what}: failed storage refuses"
                        );
                    }
                    drop(log);
                    // The open after the crash crashes too, at its m-th operation.
                    shared.arm(m, Some(mode));
                    let first = LogStorage::open(fs.clone(), &dir, opts(), LOG_ID);
                    let crashed_open = shared.disarm();
                    if let (Err(e), false) = (&first, crashed_open) {
                        panic!("{what}: {e}");
                    }
                    drop(first);
                    let got = classify(&sim, &dir, &before, base, &what);
                    match (got, first_new) {
                        (Outcome::New, None) => first_new = Some(n),
                        (Outcome::Old, Some(f)) => {
                            panic!("{what}: old log after the new one from op {f}")
                        }
                        _ => {}
                    }
                    if !crashed_open {
                        break;
                    }
                    m += 1;
                }
                if finished {
                    break;
                }
                n += 1;
            }
            // Creating, truncating, writing and syncing the temporary file, then the
            // directory sync that makes it durable: the old log up to there.
            assert_eq!(first_new, Some(5), "{target} {mode:?}");
            assert!(n >= 9, "{target} {mode:?}: {n} operations");
        }
    }
    assert!(runs > 100, "{runs}");
}

/// The same faults as plain IO errors without a crash: the storage fails, and reopening
/// (with or without a crash after it) finds the old or the new log.
#[test]
fn an_io_error_at_any_step_of_a_rebase_fails_the_storage() {
    for crash_after in [false, true] {
        let mut n = 0;
        loop {
            let what = format!("error at op {n}, crash after: {crash_after}");
            let FaultyLog {
                sim,
                shared,
                dir,
                mut log,
                before,
                ..
            } = faulty_log(n, 52, 2 * BS + 300);
            let base = ChainPoint {
                end_lsn: BS,
                acc_crc: 9,
                next_group_seq: 9,
                max_csn: 9,
            };
            shared.arm(n, None);
            let r = log.rebase(base);
            let tripped = shared.disarm();
            if tripped {
                assert!(matches!(r, Err(StorageError::Io { .. })), "{what}: {r:?}");
                let g = next_groups(&mut Rng::new(1), &log.chain(), 1);
                assert!(matches!(log.append(&g), Err(StorageError::Failed { .. })));
                assert!(matches!(log.sync(), Err(StorageError::Failed { .. })));
            } else {
                r.unwrap();
            }
            drop(log);
            let got = classify(&sim, &dir, &before, base, &what);
            if crash_after {
                sim.crash(CrashMode::Arbitrary);
                assert_eq!(classify(&sim, &dir, &before, base, &what), got, "{what}");
            }
            if !tripped {
                assert_eq!(got, Outcome::New);
                break;
            }
            n += 1;
        }
    }
}

/// fsyncgate: the temporary file's fdatasync fails, so its header is visible but will
/// never be written back. Reopening without a crash finishes the rebase, and must write
/// the header again so a later crash does not leave a block without one.
#[test]
fn a_rebase_whose_fdatasync_failed_is_finished_durably() {
    let (sim, fs, dir) = sim();
    let (mut log, _) = build(&fs, &dir, opts(), 53, 2 * BS + 300);
    let base = ChainPoint {
        end_lsn: 4 * BS,
        acc_crc: 1,
        next_group_seq: 2,
        max_csn: 3,
    };
    sim.fail_next_sync(Some(&dir.join("log").join("rebase.tmp")));
    assert!(matches!(log.rebase(base), Err(StorageError::Io { .. })));
    drop(log);
    let (log, report) = LogStorage::open(fs.clone(), &dir, opts(), LOG_ID).unwrap();
    assert_eq!(report.completed_rebase, Some(4));
    assert_eq!(log.chain(), base);
    drop(log);
    sim.crash(CrashMode::Prefix);
    let (log, _) = LogStorage::open(fs, &dir, opts(), LOG_ID).unwrap();
    assert_eq!((log.start_lsn(), log.chain()), (4 * BS, base));
}

/// A leftover temporary file: complete and valid, the rebase is finished at open (the old
/// blocks removed even when one has the new block's id); short or garbage, it is removed
/// and the old log opens intact.
#[test]
fn open_finishes_or_discards_a_leftover_rebase_file() {
    let tmp_header = |id: u64, log_id: u64, block_size: u64| {
        BlockHeader {
            log_id,
            block_id: id,
            block_size,
            start_acc_crc: 5,
            start_group_seq: 6,
            start_max_csn: 7,
        }
        .encode()
    };
    let setup = || {
        let (sim, fs, dir) = sim();
        let (log, written) = build(&fs, &dir, opts(), 61, 2 * BS + 300);
        drop(log);
        (sim, fs, dir, written)
    };
    let put = |fs: &Arc<dyn FileSystem>, dir: &Path, bytes: &[u8]| {
        let p = dir.join("log").join("rebase.tmp");
        let f = fs.open(&p, OpenOptions::create()).unwrap();
        f.write_all_at(bytes, 0).unwrap();
        f.sync_data().unwrap();
        fs.sync_dir(&dir.join("log")).unwrap();
    };

    // Valid, new id among the old ones (block 1), one old block already removed.
    let (sim, fs, dir, _) = setup();
    put(&fs, &dir, &tmp_header(1, LOG_ID, BS));
    fs.remove_file(&dir.join("log").join(block_file_name(0)))
        .unwrap();
    let (log, report) = LogStorage::open(fs.clone(), &dir, opts(), LOG_ID).unwrap();
    assert_eq!(report.completed_rebase, Some(1));
    assert!(!report.removed_rebase_tmp);
    let base = ChainPoint {
        end_lsn: BS,
        acc_crc: 5,
        next_group_seq: 6,
        max_csn: 7,
    };
    assert_eq!(
        (log.start_lsn(), log.end_lsn(), log.chain()),
        (BS, BS, base)
    );
    assert_eq!(log.block_ids(), vec![1]);
    assert_eq!(list_log(&fs, &dir), vec![block_file_name(1)]);
    drop(log);
    sim.crash(CrashMode::Arbitrary);
    let (log, _) = LogStorage::open(fs.clone(), &dir, opts(), LOG_ID).unwrap();
    assert_eq!(log.chain(), base, "finished durably");

    // Valid, beyond the end, every old block still there.
    let (_, fs, dir, _) = setup();
    put(&fs, &dir, &tmp_header(9, LOG_ID, BS));
    let (log, report) = LogStorage::open(fs.clone(), &dir, opts(), LOG_ID).unwrap();
    assert_eq!(report.completed_rebase, Some(9));
    assert_eq!(log.block_ids(), vec![9]);
    assert_eq!(log.start_lsn(), 9 * BS);

    // Invalid: empty, short, torn or garbage. The old log is intact.
    let mut garbage = vec![0u8; 4096];
    Rng::new(3).fill(&mut garbage);
    let full = tmp_header(9, LOG_ID, BS);
    let mut bad_crc = full.clone();
    bad_crc[60] ^= 1;
    for bytes in [
        &[][..],
        &full[..100],
        &full[..4095],
        &garbage,
        &bad_crc,
        &[0u8; 4096],
    ] {
        let (sim, fs, dir, written) = setup();
        put(&fs, &dir, bytes);
        let (log, report) = LogStorage::open(fs.clone(), &dir, opts(), LOG_ID).unwrap();
        assert!(report.removed_rebase_tmp);
        assert_eq!(report.completed_rebase, None);
        assert_eq!(all_bytes(&log), written);
        assert_eq!(log.block_ids(), vec![0, 1, 2]);
        assert_eq!(list_log(&fs, &dir).len(), 3);
        drop(log);
        sim.crash(CrashMode::Prefix);
        let (log, _) = LogStorage::open(fs, &dir, opts(), LOG_ID).unwrap();
        assert_eq!(all_bytes(&log), written, "the removal was durable");
    }

    // A valid header of another log or block size is not guessed at.
    let (_, fs, dir, _) = setup();
    put(&fs, &dir, &tmp_header(1, 99, BS));
    assert!(matches!(
        LogStorage::open(fs.clone(), &dir, opts(), LOG_ID),
        Err(StorageError::ForeignBlock { .. })
    ));
    let (_, fs, dir, _) = setup();
    put(&fs, &dir, &tmp_header(1, LOG_ID, 2 * BS));
    assert!(matches!(
        LogStorage::open(fs.clone(), &dir, opts(), LOG_ID),
        Err(StorageError::BlockSizeMismatch { .. })
    ));
    // Any other stray name still fails the open.
    let (_, fs, dir, _) = setup();
    fs.open(&dir.join("log").join("rebase.tmp2"), OpenOptions::create())
        .unwrap();
    assert!(matches!(
        LogStorage::open(fs, &dir, opts(), LOG_ID),
        Err(StorageError::Layout { .. })
    ));
}

/// A sync point taken before a rebase synced a file of the discarded log: reporting it
/// afterwards does not move the flushed end over the new log's unsynced appends.
#[test]
fn a_sync_point_from_before_a_rebase_is_ignored() {
    let (_, fs, dir) = sim();
    let (mut log, _) = build(&fs, &dir.join("own"), opts(), 71, 2 * BS + 300);
    let (peer, _) = build(&fs, &dir.join("peer"), opts(), 72, 4 * BS);
    let g = next_groups(&mut Rng::new(2), &log.chain(), 3);
    log.append(&g).unwrap();
    let point = log.sync_point().unwrap();
    let base = peer.chain_at(2 * BS).unwrap();
    log.rebase(base).unwrap();
    let more = peer.read_range(2 * BS, 20_000).unwrap().1;
    log.append(&more).unwrap();
    assert!(point.end() > 2 * BS && point.end() <= log.end_lsn());
    let r = point.sync();
    assert_eq!(log.synced(&point, r).unwrap(), 2 * BS);
    assert_eq!(log.flushed_end(), 2 * BS);
    assert_eq!(log.sync().unwrap(), log.end_lsn());
}

/// A sync point taken before a truncation named bytes that went: once appends pass its
/// end again, reporting it does not mark the new, unsynced bytes durable.
#[test]
fn a_sync_point_from_before_a_truncate_is_ignored() {
    let (_, fs, dir) = sim();
    let (mut log, _) = build(&fs, &dir, opts(), 73, BS / 2);
    let flushed = log.sync().unwrap();
    let g = next_groups(&mut Rng::new(3), &log.chain(), 3);
    log.append(&g).unwrap();
    let point = log.sync_point().unwrap();
    log.truncate(flushed).unwrap();
    let more = next_groups(&mut Rng::new(4), &log.chain(), 6);
    log.append(&more).unwrap();
    assert!(point.end() > flushed && point.end() <= log.end_lsn());
    let r = point.sync();
    assert_eq!(log.synced(&point, r).unwrap(), flushed);
    assert_eq!(log.flushed_end(), flushed);
    assert_eq!(log.sync().unwrap(), log.end_lsn());
}
