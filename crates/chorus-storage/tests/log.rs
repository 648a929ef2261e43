//! Log storage: conformance on both file systems, crash recovery on the fault-injecting
//! twin, and bad input.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use chorus_core::format::block::{BlockHeader, BLOCK_HEADER_SIZE};
use chorus_core::format::group::{
    block_remaining, encode_group, encode_padding, fits_in_block, ChainPoint, SealParams,
};
use chorus_core::rng::Rng;
use chorus_storage::fs::{CrashMode, FileSystem, FsFile, OpenOptions, RealFs, SimFs};
use chorus_storage::log::block_file_name;
use chorus_storage::{LogOptions, LogStorage, StorageError};

const BS: u64 = 64 << 10;
const LOG_ID: u64 = 0xC0FFEE;

fn opts() -> LogOptions {
    LogOptions {
        block_size: BS,
        ..LogOptions::default()
    }
}

fn direct() -> LogOptions {
    LogOptions {
        block_size: BS,
        direct_io: true,
        ..LogOptions::default()
    }
}

/// `o` writing `preallocate` bytes of zeros ahead.
fn ahead(o: LogOptions, preallocate: u64) -> LogOptions {
    LogOptions { preallocate, ..o }
}

/// Encodes the next group of `n` random records after `chain`, preceded by a padding group
/// when it would not fit in the current block.
fn next_groups(rng: &mut Rng, chain: &ChainPoint, n: usize) -> Vec<u8> {
    let records: Vec<Vec<u8>> = (0..n)
        .map(|_| {
            let mut r = vec![0u8; rng.range(0, 700) as usize];
            rng.fill(&mut r);
            r
        })
        .collect();
    let mut chain = *chain;
    let size: u64 = 64 + records.iter().map(|r| 24 + r.len() as u64).sum::<u64>();
    let mut out = Vec::new();
    if !fits_in_block(chain.end_lsn, size, BS) {
        let pad = block_remaining(chain.end_lsn, BS);
        chain = encode_padding(&mut out, &chain, 1, 0, pad).chain_after();
    }
    let recs: Vec<(u64, &[u8])> = records
        .iter()
        .enumerate()
        .map(|(i, r)| (chain.max_csn + 1 + i as u64, &r[..]))
        .collect();
    let params = SealParams {
        proposal_id: 1,
        committed_end_lsn: chain.end_lsn / 2,
        flags: 0,
    };
    encode_group(&mut out, &chain, params, &recs);
    out
}

fn sim() -> (SimFs, Arc<dyn FileSystem>, PathBuf) {
    let fs = SimFs::new(7);
    let dyn_fs: Arc<dyn FileSystem> = Arc::new(fs.clone());
    let dir = PathBuf::from("/replica");
    dyn_fs.create_dir_all(&dir).unwrap();
    (fs, dyn_fs, dir)
}

fn all_bytes(log: &LogStorage) -> Vec<u8> {
    let mut out = Vec::new();
    for g in log.iter_from(log.start_lsn()) {
        let (h, body) = g.unwrap();
        assert_eq!(
            log.read_header(h.lsn).unwrap(),
            h,
            "header-only read agrees"
        );
        out.extend_from_slice(&h.encode());
        out.extend_from_slice(&body);
    }
    out
}

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

// ------------------------------------------------------------ trim and rebase

/// A log of random groups reaching at least `until`, all synced; returns it and its bytes.
fn build(
    fs: &Arc<dyn FileSystem>,
    dir: &Path,
    o: LogOptions,
    seed: u64,
    until: u64,
) -> (LogStorage, Vec<u8>) {
    let mut log = LogStorage::create(fs.clone(), dir, o, LOG_ID).unwrap();
    let mut rng = Rng::new(seed);
    let mut written = Vec::new();
    while log.end_lsn() < until {
        let n = rng.range(1, 20) as usize;
        let g = next_groups(&mut rng, &log.chain(), n);
        log.append(&g).unwrap();
        written.extend_from_slice(&g);
    }
    log.sync().unwrap();
    (log, written)
}

/// The groups of `peer` from `lsn` to its end, as one append.
fn groups_from(peer: &LogStorage, lsn: u64) -> Vec<u8> {
    let (_, bytes) = peer.read_range(lsn, usize::MAX).unwrap();
    bytes
}

fn list_log(fs: &Arc<dyn FileSystem>, dir: &Path) -> Vec<String> {
    fs.list_dir(&dir.join("log")).unwrap()
}

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
