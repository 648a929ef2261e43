//! Log storage: conformance on both file systems, crash recovery on the fault-injecting
//! twin, and bad input.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use chorus_core::format::block::BLOCK_HEADER_SIZE;
use chorus_core::format::group::{
    block_remaining, encode_group, encode_padding, fits_in_block, ChainPoint, SealParams,
};
use chorus_core::rng::Rng;
use chorus_storage::fs::{CrashMode, FileSystem, OpenOptions, RealFs, SimFs};
use chorus_storage::log::block_file_name;
use chorus_storage::{LogOptions, LogStorage, StorageError};

mod common;
use common::*;

fn conformance(fs: Arc<dyn FileSystem>, dir: &Path, o: LogOptions) {
    let mut log = LogStorage::create(fs.clone(), dir, o, LOG_ID).unwrap();
    assert!(matches!(
        LogStorage::create(fs.clone(), dir, o, LOG_ID),
        Err(StorageError::AlreadyExists { .. })
    ));
    let mut rng = Rng::new(1);
    let mut written = Vec::new();
    // Enough to cross several blocks.
    while log.end_lsn() < 3 * BS + 1000 {
        let n = rng.range(1, 20) as usize;
        let g = next_groups(&mut rng, &log.chain(), n);
        log.append(&g).unwrap();
        written.extend_from_slice(&g);
        if rng.chance(1, 3) {
            assert_eq!(log.sync().unwrap(), log.end_lsn());
        }
    }
    log.sync().unwrap();
    assert_eq!(all_bytes(&log), written);
    assert!(log.block_ids().len() >= 4);
    // A non-boundary read is refused.
    assert!(log.read_group(1).is_err());
    let end = log.end_lsn();
    drop(log);

    let (mut log, report) = LogStorage::open(fs.clone(), dir, o, LOG_ID).unwrap();
    assert_eq!(report.end_lsn, end);
    assert_eq!(report.torn_tail, None);
    assert!(report.scanned_bytes <= BS, "recovery scans one block");
    assert_eq!(all_bytes(&log), written);

    // Truncate into an earlier block, then append a different suffix.
    let cut = {
        let mut lsn = 0;
        for g in log.iter_from(0) {
            let (h, _) = g.unwrap();
            if h.lsn > BS + BS / 2 {
                lsn = h.lsn;
                break;
            }
        }
        lsn
    };
    log.truncate(cut).unwrap();
    assert_eq!(log.end_lsn(), cut);
    written.truncate(cut as usize);
    let g = next_groups(&mut rng, &log.chain(), 3);
    log.append(&g).unwrap();
    written.extend_from_slice(&g);
    log.sync().unwrap();
    drop(log);
    let (mut log, _) = LogStorage::open(fs.clone(), dir, o, LOG_ID).unwrap();
    assert_eq!(all_bytes(&log), written);

    // Trim: whole blocks below go away, reads below fail, the log starts at the first
    // block kept (as after a reopen).
    log.trim(BS + 10).unwrap();
    assert_eq!(log.block_ids()[0], 1);
    assert_eq!(log.start_lsn(), BS);
    assert!(matches!(
        log.read_group(0),
        Err(StorageError::Trimmed { .. })
    ));
    let start = log.start_chain().unwrap();
    assert_eq!(start, log.chain_at(BS).unwrap());
    assert_eq!(all_bytes(&log), written[BS as usize..]);
    drop(log);
    let (log, _) = LogStorage::open(fs, dir, o, LOG_ID).unwrap();
    assert_eq!(log.start_lsn(), BS);
    assert_eq!(log.start_chain().unwrap(), start);
}

#[test]
fn conformance_sim() {
    let (_, fs, dir) = sim();
    conformance(fs, &dir, opts());
}

#[test]
fn conformance_sim_direct_io() {
    let (_, fs, dir) = sim();
    conformance(fs, &dir, direct());
}

#[test]
fn conformance_real() {
    let dir = std::env::temp_dir().join(format!("chorus-log-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    conformance(Arc::new(RealFs::new()), &dir, opts());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Direct IO on the real file system (where the temp directory supports it; elsewhere the
/// log falls back to buffered IO and says so).
#[test]
fn conformance_real_direct_io() {
    let dir = std::env::temp_dir().join(format!("chorus-log-test-d-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let fs: Arc<dyn FileSystem> = Arc::new(RealFs::new());
    let probe = LogStorage::create(fs.clone(), &dir.join("probe"), direct(), LOG_ID).unwrap();
    assert_eq!(
        probe.is_direct(),
        fs.supports_direct_io(&dir.join("probe").join("log"))
    );
    conformance(fs, &dir.join("c"), direct());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Thousands of random append/sync/crash/reopen steps: every group synced before a crash
/// is there byte for byte afterwards, and nothing beyond what was written appears.
fn crash_recovery(o: LogOptions) {
    let mut steps = 0;
    for seed in 0..60u64 {
        let fs = SimFs::new(seed);
        let dyn_fs: Arc<dyn FileSystem> = Arc::new(fs.clone());
        let dir = PathBuf::from("/r");
        dyn_fs.create_dir_all(&dir).unwrap();
        let mut rng = Rng::new(seed ^ 0xABCD);
        let mut log = LogStorage::create(dyn_fs.clone(), &dir, o, LOG_ID).unwrap();
        let mut written: Vec<u8> = Vec::new();
        let mut synced = 0usize;
        for _ in 0..60 {
            steps += 1;
            match rng.below(10) {
                0..=5 => {
                    let n = rng.range(1, 30) as usize;
                    let g = next_groups(&mut rng, &log.chain(), n);
                    log.append(&g).unwrap();
                    written.extend_from_slice(&g);
                }
                6 => {
                    synced = log.sync().unwrap() as usize;
                    assert_eq!(synced, written.len());
                }
                7 => {
                    // The runtime's path: sync outside the log's borrow, then report.
                    let point = log.sync_point().unwrap();
                    let r = point.sync();
                    synced = log.synced(&point, r).unwrap() as usize;
                    assert_eq!(synced, written.len());
                }
                _ => {
                    fs.crash(CrashMode::Prefix);
                    let (l, report) = LogStorage::open(dyn_fs.clone(), &dir, o, LOG_ID).unwrap();
                    log = l;
                    let got = all_bytes(&log);
                    assert!(got.len() >= synced, "seed {seed}: lost synced data");
                    assert_eq!(&got[..], &written[..got.len()], "seed {seed}: bytes differ");
                    assert_eq!(log.flushed_end(), report.end_lsn);
                    written.truncate(got.len());
                    synced = got.len();
                }
            }
        }
    }
    assert!(steps >= 3000);
}

#[test]
fn crash_recovery_keeps_every_synced_group() {
    crash_recovery(opts());
}

#[test]
fn crash_recovery_keeps_every_synced_group_direct_io() {
    crash_recovery(direct());
}

/// Zeros ahead extended every few appends (one page, four pages) or never.
#[test]
fn crash_recovery_keeps_every_synced_group_with_any_zeros_ahead() {
    let buffered = LogOptions {
        direct_io: false,
        ..opts()
    };
    for p in [0, 4096, 16384] {
        crash_recovery(ahead(buffered, p));
        crash_recovery(ahead(direct(), p));
    }
}

/// The point of zeros ahead: while appends fill zeros already written, syncs do not grow
/// the file (no file-system metadata to commit), so the tail file's length changes only
/// once per `preallocate / 2` bytes of log or so, never passes the block's end, and a
/// reopen finds the log's end with no torn tail.
#[test]
fn zeros_ahead_keep_the_file_length_while_appends_fill_them() {
    let buffered = LogOptions {
        direct_io: false,
        ..opts()
    };
    for (o, p) in [(buffered, 16384), (direct(), 16384), (buffered, 0)] {
        let (fs, dyn_fs, dir) = sim();
        let o = ahead(o, p);
        let mut log = LogStorage::create(dyn_fs.clone(), &dir, o, LOG_ID).unwrap();
        let mut rng = Rng::new(3);
        let mut growths = 0;
        let mut syncs = 0;
        let mut last_len = 0;
        while log.end_lsn() < 3 * BS {
            let g = next_groups(&mut rng, &log.chain(), 2);
            log.append(&g).unwrap();
            log.sync().unwrap();
            syncs += 1;
            let tail = log.block_ids().pop().unwrap();
            let path = dir.join("log").join(block_file_name(tail));
            let len = fs.durable_content(&path).unwrap().len() as u64;
            let data_end = BLOCK_HEADER_SIZE as u64 + log.end_lsn() - tail * BS;
            assert!(len <= BLOCK_HEADER_SIZE as u64 + BS, "past the block's end");
            if p > 0 {
                assert!(
                    len >= data_end.min(BLOCK_HEADER_SIZE as u64 + BS),
                    "the log is in the file"
                );
                assert!(
                    len >= (data_end + p / 2).min(BLOCK_HEADER_SIZE as u64 + BS),
                    "at least half of the zeros ahead are left ({len} < {data_end} + {})",
                    p / 2
                );
            }
            if len != last_len {
                growths += 1;
            }
            last_len = len;
        }
        if p == 0 {
            assert!(growths * 10 > syncs * 9, "{growths} of {syncs}");
        } else {
            // A few hundred bytes a group: one growth per several KiB of log, plus the
            // block rolls.
            assert!(
                growths * 5 < syncs,
                "{growths} length changes in {syncs} syncs"
            );
        }
        let end = log.end_lsn();
        let written = all_bytes(&log);
        drop(log);
        let (log, report) = LogStorage::open(dyn_fs, &dir, o, LOG_ID).unwrap();
        assert_eq!(report.end_lsn, end);
        assert_eq!(report.torn_tail, None, "zeros are not a torn tail");
        assert_eq!(all_bytes(&log), written);
    }
}

/// Syncs that carry much data stop the zeros ahead (each byte would be written twice for
/// a metadata commit that is small next to the data); small syncs bring them back.
#[test]
fn large_syncs_stop_the_zeros_ahead_and_small_ones_bring_them_back() {
    const BIG: u64 = 4 << 20;
    let (fs, dyn_fs, dir) = sim();
    let o = LogOptions {
        block_size: BIG,
        direct_io: false,
        preallocate: 16384,
    };
    let mut log = LogStorage::create(dyn_fs, &dir, o, LOG_ID).unwrap();
    let path = dir.join("log").join(block_file_name(0));
    let len = |log: &LogStorage| {
        let file = fs.durable_content(&path).unwrap().len() as u64;
        (file, BLOCK_HEADER_SIZE as u64 + log.end_lsn())
    };
    let mut rng = Rng::new(11);
    let mut append = |log: &mut LogStorage, bytes: u64| {
        let start = log.end_lsn();
        while log.end_lsn() - start < bytes {
            // Groups sized for a 64 KiB block fit in this one too.
            let g = next_groups(&mut rng, &log.chain(), 20);
            log.append(&g).unwrap();
        }
        log.sync().unwrap();
    };
    append(&mut log, 100);
    let (file, data) = len(&log);
    assert!(
        file >= data + 8192,
        "small syncs zero ahead: {file} vs {data}"
    );
    for _ in 0..12 {
        append(&mut log, 128 << 10);
    }
    let (file, data) = len(&log);
    assert_eq!(file, data, "128 KiB syncs: the file ends with the log");
    for _ in 0..40 {
        append(&mut log, 100);
    }
    let (file, data) = len(&log);
    assert!(file >= data + 8192, "small syncs again: {file} vs {data}");
}

/// A torn group followed by zeros written ahead is a torn tail, cut and reported.
#[test]
fn a_torn_group_before_zeros_ahead_is_a_torn_tail() {
    let (fs, dyn_fs, dir) = sim();
    let o = LogOptions {
        direct_io: false,
        ..ahead(opts(), 16384)
    };
    let mut log = LogStorage::create(dyn_fs.clone(), &dir, o, LOG_ID).unwrap();
    let mut rng = Rng::new(5);
    let g = next_groups(&mut rng, &log.chain(), 3);
    log.append(&g).unwrap();
    log.sync().unwrap();
    let end = log.end_lsn();
    drop(log);
    // Half a group written over the zeros after the end, as a crash mid-write leaves it.
    let path = dir.join("log").join(block_file_name(0));
    let f = dyn_fs.open(&path, OpenOptions::read_write()).unwrap();
    let half = next_groups(
        &mut rng,
        &ChainPoint {
            end_lsn: end,
            ..Default::default()
        },
        2,
    );
    f.write_all_at(&half[..half.len() / 2], BLOCK_HEADER_SIZE as u64 + end)
        .unwrap();
    f.sync_data().unwrap();
    assert!(
        fs.durable_content(&path).unwrap().len() as u64 > BLOCK_HEADER_SIZE as u64 + end + 8192
    );
    let (_, report) = LogStorage::open(dyn_fs, &dir, o, LOG_ID).unwrap();
    assert_eq!(report.end_lsn, end);
    let (at, bytes) = report.torn_tail.expect("a torn tail");
    assert_eq!(at, end);
    let torn = &half[..half.len() / 2];
    let last = torn.iter().rposition(|b| *b != 0).unwrap() as u64 + 1;
    assert_eq!(bytes, last, "the torn bytes, not the zeros after them");
    assert_eq!(
        fs.durable_content(&path).unwrap().len() as u64,
        BLOCK_HEADER_SIZE as u64 + end,
        "cut at the end"
    );
}

/// A bad group before the tail is corruption: opening fails naming the place, and the
/// file is not truncated.
#[test]
fn corruption_before_tail_is_reported_not_truncated() {
    let (fs, dyn_fs, dir) = sim();
    let mut log = LogStorage::create(dyn_fs.clone(), &dir, opts(), LOG_ID).unwrap();
    let mut rng = Rng::new(3);
    for _ in 0..10 {
        let g = next_groups(&mut rng, &log.chain(), 5);
        log.append(&g).unwrap();
    }
    log.sync().unwrap();
    drop(log);
    let path = dir.join("log").join(block_file_name(0));
    let before = fs.durable_content(&path).unwrap();
    // Flip a bit in the body of the first group.
    fs.flip_bits(&path, BLOCK_HEADER_SIZE as u64 + 100, 8, 1)
        .unwrap();
    match LogStorage::open(dyn_fs.clone(), &dir, opts(), LOG_ID) {
        Err(StorageError::Corrupt { lsn, .. }) => assert_eq!(lsn, 0),
        other => panic!("expected corruption, got {other:?}"),
    }
    assert_eq!(fs.durable_len(&path).unwrap(), before.len() as u64);
}

/// The repair hook: opened with `open_damaged`, the damaged range is reported (not
/// truncated), reads in it fail, appends continue after the tail, a wrong copy is refused,
/// and the right copy (from a peer holding the same log) repairs it durably.
#[test]
fn damaged_range_is_reported_and_repaired_from_a_copy() {
    let (fs, dyn_fs, dir) = sim();
    let (_peer_fs, peer_dyn, peer_dir) = sim();
    let mut log = LogStorage::create(dyn_fs.clone(), &dir, opts(), LOG_ID).unwrap();
    let mut peer = LogStorage::create(peer_dyn.clone(), &peer_dir, opts(), LOG_ID).unwrap();
    let mut rng = Rng::new(4);
    for _ in 0..10 {
        let g = next_groups(&mut rng, &log.chain(), 5);
        log.append(&g).unwrap();
        peer.append(&g).unwrap();
    }
    log.sync().unwrap();
    peer.sync().unwrap();
    let end = log.end_lsn();
    drop(log);
    let path = dir.join("log").join(block_file_name(0));
    fs.flip_bits(&path, BLOCK_HEADER_SIZE as u64 + 100, 8, 1)
        .unwrap();
    let (mut log, report) = LogStorage::open_damaged(dyn_fs.clone(), &dir, opts(), LOG_ID).unwrap();
    assert_eq!(report.damaged.len(), 1);
    let d = report.damaged[0].clone();
    assert_eq!(d.lsn, 0);
    assert!(d.next_valid > 0 && d.next_valid < end);
    assert_eq!(log.end_lsn(), end, "nothing truncated");
    assert!(matches!(
        log.read_group(0),
        Err(StorageError::Corrupt { .. })
    ));
    // A copy that is not the original (a different group) is refused.
    let wrong = next_groups(&mut Rng::new(99), &ChainPoint::default(), 1);
    assert!(log.repair(&wrong).is_err());
    // The peer's copy of exactly the damaged range repairs it.
    let (_, copy) = peer
        .read_range(d.lsn, (d.next_valid - d.lsn) as usize)
        .unwrap();
    assert_eq!(copy.len() as u64, d.next_valid - d.lsn);
    log.repair(&copy).unwrap();
    assert!(log.damaged().is_none());
    let g = next_groups(&mut rng, &log.chain(), 2);
    log.append(&g).unwrap();
    log.sync().unwrap();
    drop(log);
    // After a crash, the repaired log opens cleanly with every group readable.
    fs.crash(CrashMode::Prefix);
    let (log, report) = LogStorage::open(dyn_fs, &dir, opts(), LOG_ID).unwrap();
    assert!(report.damaged.is_empty());
    assert_eq!(log.iter_from(0).filter(|g| g.is_err()).count(), 0);
    assert!(log.end_lsn() > end);
}

/// A damaged log still serves ranges outside its damage, as a replica under repair does
/// for a peer under repair: a range that ends where the damage begins is read whole (the
/// read stops before the next group without reading it), and so is one after the damage
/// in the same block (the chain is walked through headers, and only a body is damaged).
#[test]
fn a_damaged_log_reads_whole_ranges_on_either_side_of_its_damage() {
    let (fs, dyn_fs, dir) = sim();
    let mut log = LogStorage::create(dyn_fs.clone(), &dir, opts(), LOG_ID).unwrap();
    let mut rng = Rng::new(5);
    let mut bounds = vec![0];
    for _ in 0..6 {
        let g = next_groups(&mut rng, &log.chain(), 3);
        log.append(&g).unwrap();
        bounds.push(log.end_lsn());
    }
    log.sync().unwrap();
    let before = log
        .read_range(bounds[1], (bounds[2] - bounds[1]) as usize)
        .unwrap();
    let after = log
        .read_range(bounds[3], (bounds[4] - bounds[3]) as usize)
        .unwrap();
    drop(log);
    // Damage the body of the third group (past its 64-byte header).
    let path = dir.join("log").join(block_file_name(0));
    fs.flip_bits(&path, BLOCK_HEADER_SIZE as u64 + bounds[2] + 64, 8, 1)
        .unwrap();
    let (log, report) = LogStorage::open_damaged(dyn_fs, &dir, opts(), LOG_ID).unwrap();
    assert_eq!(report.damaged.len(), 1);
    assert_eq!(report.damaged[0].lsn, bounds[2]);
    assert_eq!(
        log.read_range(bounds[1], (bounds[2] - bounds[1]) as usize)
            .unwrap(),
        before,
        "the range up to the damage"
    );
    assert_eq!(
        log.read_range(bounds[3], (bounds[4] - bounds[3]) as usize)
            .unwrap(),
        after,
        "a range after the damage"
    );
    assert!(log.read_range(bounds[2], 1).is_err(), "the damaged group");
}

/// Two damaged stretches with valid groups between and after them (bits flipped at rest
/// in two places, as the real-process nemesis does): both are reported, each a range of
/// its own, and each is repaired in turn from a peer's copy of just that range.
#[test]
fn two_damaged_stretches_are_repaired_one_after_the_other() {
    let (fs, dyn_fs, dir) = sim();
    let (_peer_fs, peer_dyn, peer_dir) = sim();
    let mut log = LogStorage::create(dyn_fs.clone(), &dir, opts(), LOG_ID).unwrap();
    let mut peer = LogStorage::create(peer_dyn.clone(), &peer_dir, opts(), LOG_ID).unwrap();
    let mut rng = Rng::new(7);
    let mut ends = Vec::new();
    for _ in 0..12 {
        let g = next_groups(&mut rng, &log.chain(), 1);
        log.append(&g).unwrap();
        peer.append(&g).unwrap();
        ends.push(log.end_lsn());
    }
    log.sync().unwrap();
    peer.sync().unwrap();
    let end = log.end_lsn();
    drop(log);
    let path = dir.join("log").join(block_file_name(0));
    // Group 2 (from ends[0]) and group 7 (from ends[5]) lose a bit each in their bodies.
    for start in [ends[0], ends[5]] {
        fs.flip_bits(&path, BLOCK_HEADER_SIZE as u64 + start + 70, 8, 1)
            .unwrap();
    }
    let (mut log, report) = LogStorage::open_damaged(dyn_fs.clone(), &dir, opts(), LOG_ID).unwrap();
    let ranges: Vec<(u64, u64)> = report
        .damaged
        .iter()
        .map(|d| (d.lsn, d.next_valid))
        .collect();
    assert_eq!(ranges, vec![(ends[0], ends[1]), (ends[5], ends[6])]);
    assert_eq!(log.end_lsn(), end, "nothing truncated");
    // A copy of the second range is refused while the first is the one to repair.
    let (_, second) = peer
        .read_range(ends[5], (ends[6] - ends[5]) as usize)
        .unwrap();
    assert!(log.repair(&second).is_err());
    for (from, to) in ranges {
        assert_eq!(log.damaged().map(|d| d.lsn), Some(from));
        let (_, copy) = peer.read_range(from, (to - from) as usize).unwrap();
        log.repair(&copy).unwrap();
    }
    assert!(log.damaged().is_none());
    drop(log);
    fs.crash(CrashMode::Prefix);
    let (log, report) = LogStorage::open(dyn_fs, &dir, opts(), LOG_ID).unwrap();
    assert!(report.damaged.is_empty());
    assert_eq!(log.iter_from(0).filter(|g| g.is_err()).count(), 0);
    assert_eq!(log.end_lsn(), end);
}

/// Bits flipped at rest in blocks below the tail, which opening does not scan, are found
/// by a scrub of the sealed blocks and repaired from a peer's copy through the same path
/// as damage found at open: one stretch in the middle of block 0, and one in the last
/// group of block 1 (the range then ends at block 2's start, whose header carries the
/// chain on).
#[test]
fn a_scrub_finds_damage_in_sealed_blocks_and_a_peers_copy_repairs_it() {
    let (fs, dyn_fs, dir) = sim();
    let (_peer_fs, peer_dyn, peer_dir) = sim();
    let mut log = LogStorage::create(dyn_fs.clone(), &dir, opts(), LOG_ID).unwrap();
    let mut peer = LogStorage::create(peer_dyn.clone(), &peer_dir, opts(), LOG_ID).unwrap();
    let mut rng = Rng::new(11);
    // Group boundaries: (start, end) of each group written.
    let mut groups = Vec::new();
    while log.end_lsn() < 2 * BS + BS / 2 {
        let start = log.end_lsn();
        let g = next_groups(&mut rng, &log.chain(), 3);
        log.append(&g).unwrap();
        peer.append(&g).unwrap();
        groups.push((start, log.end_lsn()));
    }
    log.sync().unwrap();
    peer.sync().unwrap();
    let end = log.end_lsn();
    assert_eq!(log.sealed_block_ids(), vec![0, 1]);
    assert!(log.sealed_block(2).is_none(), "the tail is not sealed");
    for id in [0, 1] {
        assert_eq!(log.sealed_block(id).unwrap().verify().unwrap(), None);
    }
    // A group in the middle of block 0, and the padding group that fills block 1 up to
    // block 2's start (written with the first group of block 2).
    let (mid_from, mid_to) = groups[groups.len() / 8];
    let &(last_from, _) = groups
        .iter()
        .find(|(s, e)| *s < 2 * BS && *e > 2 * BS)
        .unwrap();
    assert!(mid_to < BS && (BS..2 * BS).contains(&last_from));
    let file = |id: u64| dir.join("log").join(block_file_name(id));
    fs.flip_bits(&file(0), BLOCK_HEADER_SIZE as u64 + mid_from + 70, 8, 1)
        .unwrap();
    fs.flip_bits(
        &file(1),
        BLOCK_HEADER_SIZE as u64 + (last_from - BS) + 40,
        8,
        1,
    )
    .unwrap();
    // Opening scans only the tail: nothing is found there.
    drop(log);
    let (mut log, report) = LogStorage::open_damaged(dyn_fs.clone(), &dir, opts(), LOG_ID).unwrap();
    assert!(report.damaged.is_empty() && log.damaged().is_none());
    let mut found = Vec::new();
    for id in log.sealed_block_ids() {
        let b = log.sealed_block(id).unwrap();
        let d = b.verify().unwrap().expect("damage found");
        found.push((d.lsn, d.next_valid));
        assert!(log.note_damage(&b, d.clone()));
        assert!(!log.note_damage(&b, d), "noted once");
    }
    assert_eq!(found, vec![(mid_from, mid_to), (last_from, 2 * BS)]);
    for (from, to) in found {
        assert_eq!(log.damaged().map(|d| d.lsn), Some(from));
        let (_, copy) = peer.read_range(from, (to - from) as usize).unwrap();
        // A copy one group short does not end where the damage does: refused.
        if to - from > 1 {
            assert!(log.repair(&copy[..copy.len() - 1]).is_err());
        }
        log.repair(&copy).unwrap();
    }
    assert!(log.damaged().is_none());
    for id in log.sealed_block_ids() {
        assert_eq!(log.sealed_block(id).unwrap().verify().unwrap(), None);
    }
    drop(log);
    fs.crash(CrashMode::Prefix);
    let (log, _) = LogStorage::open(dyn_fs, &dir, opts(), LOG_ID).unwrap();
    assert_eq!(log.iter_from(0).filter(|g| g.is_err()).count(), 0);
    assert_eq!(log.end_lsn(), end);
}

/// Damage a scrub found in a block that was trimmed since is not taken.
#[test]
fn damage_in_a_block_trimmed_since_the_scrub_read_it_is_ignored() {
    let (fs, dyn_fs, dir) = sim();
    let mut log = LogStorage::create(dyn_fs.clone(), &dir, opts(), LOG_ID).unwrap();
    let mut rng = Rng::new(12);
    while log.end_lsn() < BS + BS / 2 {
        let g = next_groups(&mut rng, &log.chain(), 3);
        log.append(&g).unwrap();
    }
    log.sync().unwrap();
    drop(log);
    fs.flip_bits(
        &dir.join("log").join(block_file_name(0)),
        BLOCK_HEADER_SIZE as u64 + 100,
        8,
        1,
    )
    .unwrap();
    let (mut log, _) = LogStorage::open_damaged(dyn_fs, &dir, opts(), LOG_ID).unwrap();
    let b = log.sealed_block(0).unwrap();
    let d = b.verify().unwrap().expect("damage found");
    log.trim(BS).unwrap();
    assert!(!log.note_damage(&b, d));
    assert!(log.damaged().is_none());
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let (fs, dyn_fs, dir) = sim();
    let mut log = LogStorage::create(dyn_fs.clone(), &dir, opts(), LOG_ID).unwrap();
    let mut rng = Rng::new(5);
    let g = next_groups(&mut rng, &log.chain(), 3);
    log.append(&g).unwrap();
    log.sync().unwrap();
    // A group that does not continue the chain is refused.
    let stale = next_groups(&mut rng, &ChainPoint::default(), 1);
    assert!(matches!(
        log.append(&stale),
        Err(StorageError::InvalidAppend { .. })
    ));
    drop(log);
    let path = dir.join("log").join(block_file_name(0));
    let before = fs.durable_content(&path).unwrap();

    assert!(matches!(
        LogStorage::open(
            dyn_fs.clone(),
            &dir,
            LogOptions {
                block_size: 2 * BS,
                ..LogOptions::default()
            },
            LOG_ID
        ),
        Err(StorageError::BlockSizeMismatch { .. })
    ));
    assert!(matches!(
        LogStorage::open(dyn_fs.clone(), &dir, opts(), 99),
        Err(StorageError::ForeignBlock { .. })
    ));
    assert!(matches!(
        LogStorage::open(
            dyn_fs.clone(),
            &dir,
            LogOptions {
                block_size: 1000,
                ..LogOptions::default()
            },
            LOG_ID
        ),
        Err(StorageError::InvalidConfig { .. })
    ));
    for p in [1000, 128 << 20] {
        match LogStorage::open(dyn_fs.clone(), &dir, ahead(opts(), p), LOG_ID) {
            Err(StorageError::InvalidConfig { setting, .. }) => assert_eq!(setting, "preallocate"),
            other => panic!("preallocate {p}: {other:?}"),
        }
    }
    // A gap in the block sequence.
    let stray = dir.join("log").join(block_file_name(5));
    dyn_fs.open(&stray, OpenOptions::create()).unwrap();
    assert!(matches!(
        LogStorage::open(dyn_fs.clone(), &dir, opts(), LOG_ID),
        Err(StorageError::Layout { .. })
    ));
    dyn_fs.remove_file(&stray).unwrap();
    // A zeroed block header and a block of random bytes.
    let mut junk = vec![0u8; 8192];
    fs.corrupt(&path, 0, &junk[..4096]).unwrap();
    assert!(matches!(
        LogStorage::open(dyn_fs.clone(), &dir, opts(), LOG_ID),
        Err(StorageError::Corrupt { file_offset: 0, .. })
    ));
    rng.fill(&mut junk);
    fs.corrupt(&path, 0, &junk).unwrap();
    assert!(LogStorage::open(dyn_fs.clone(), &dir, opts(), LOG_ID).is_err());
    assert_eq!(
        fs.durable_content(&path).unwrap().len(),
        before.len().max(8192)
    );
}

#[test]
fn failed_fsync_fails_the_storage() {
    let (fs, dyn_fs, dir) = sim();
    let mut log = LogStorage::create(dyn_fs.clone(), &dir, opts(), LOG_ID).unwrap();
    let mut rng = Rng::new(9);
    let g = next_groups(&mut rng, &log.chain(), 3);
    log.append(&g).unwrap();
    fs.fail_next_sync(None);
    assert!(matches!(log.sync(), Err(StorageError::Io { .. })));
    assert_eq!(log.flushed_end(), 0);
    assert!(matches!(log.sync(), Err(StorageError::Failed { .. })));
    let g = next_groups(&mut rng, &log.chain(), 1);
    assert!(matches!(log.append(&g), Err(StorageError::Failed { .. })));
    // Reopening recovers from what is on disk.
    drop(log);
    fs.crash(CrashMode::Prefix);
    let (log, _) = LogStorage::open(dyn_fs, &dir, opts(), LOG_ID).unwrap();
    assert_eq!(log.end_lsn(), 0, "writes whose fsync failed are gone");
}

#[test]
fn failed_sync_point_fails_the_storage() {
    let (fs, dyn_fs, dir) = sim();
    let mut log = LogStorage::create(dyn_fs, &dir, opts(), LOG_ID).unwrap();
    let mut rng = Rng::new(10);
    let g = next_groups(&mut rng, &log.chain(), 3);
    log.append(&g).unwrap();
    let point = log.sync_point().unwrap();
    assert_eq!(point.end(), log.end_lsn());
    fs.fail_next_sync(None);
    let r = point.sync();
    assert!(matches!(
        log.synced(&point, r),
        Err(StorageError::Io { .. })
    ));
    assert_eq!(log.flushed_end(), 0, "nothing reported durable");
    assert!(matches!(log.sync_point(), Err(StorageError::Failed { .. })));
    assert!(matches!(
        log.read_header(log.end_lsn()),
        Err(StorageError::BeyondEnd { .. })
    ));
}

/// A log in which nothing was ever committed (every group piggybacks committed 0) that
/// spans several blocks — a leader cut off from its followers filled its window — must
/// recover with an index reaching back to the start, so the replica can name its committed
/// point as a log position (simulator seed 101006 in sync mode panicked on this).
#[test]
fn recovered_index_reaches_the_committed_point_when_nothing_was_committed() {
    let (_, fs, dir) = sim();
    let mut log = LogStorage::create(fs, &dir, opts(), LOG_ID).unwrap();
    let mut rng = Rng::new(3);
    while log.end_lsn() < 2 * BS + 1000 {
        let mut chain = log.chain();
        let mut out = Vec::new();
        let size = 64 + 24 + 500;
        if !fits_in_block(chain.end_lsn, size, BS) {
            let pad = block_remaining(chain.end_lsn, BS);
            chain = encode_padding(&mut out, &chain, 1, 0, pad).chain_after();
        }
        let mut rec = vec![0u8; 500];
        rng.fill(&mut rec);
        let params = SealParams {
            proposal_id: 1,
            committed_end_lsn: 0,
            flags: 0,
        };
        encode_group(&mut out, &chain, params, &[(chain.max_csn + 1, &rec[..])]);
        log.append(&out).unwrap();
    }
    log.sync().unwrap();
    let r = log.recovered().unwrap();
    assert_eq!(r.committed, 0);
    assert_eq!(
        r.floor.end_lsn, 0,
        "the index starts at the committed point"
    );
    assert_eq!(r.groups.first().map(|g| g.lsn), Some(0));
    assert_eq!(r.groups.last().map(|g| g.end()), Some(log.end_lsn()));
}
