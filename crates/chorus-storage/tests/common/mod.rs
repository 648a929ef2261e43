//! Helpers shared by the log storage tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use chorus_core::format::group::{
    block_remaining, encode_group, encode_padding, fits_in_block, ChainPoint, SealParams,
};
use chorus_core::rng::Rng;
use chorus_storage::fs::{FileSystem, SimFs};
use chorus_storage::{LogOptions, LogStorage};

pub const BS: u64 = 64 << 10;
pub const LOG_ID: u64 = 0xC0FFEE;

pub fn opts() -> LogOptions {
    LogOptions {
        block_size: BS,
        ..LogOptions::default()
    }
}

pub fn direct() -> LogOptions {
    LogOptions {
        block_size: BS,
        direct_io: true,
        ..LogOptions::default()
    }
}

/// `o` writing `preallocate` bytes of zeros ahead.
pub fn ahead(o: LogOptions, preallocate: u64) -> LogOptions {
    LogOptions { preallocate, ..o }
}

/// Encodes the next group of `n` random records after `chain`, preceded by a padding group
/// when it would not fit in the current block.
pub fn next_groups(rng: &mut Rng, chain: &ChainPoint, n: usize) -> Vec<u8> {
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

pub fn sim() -> (SimFs, Arc<dyn FileSystem>, PathBuf) {
    let fs = SimFs::new(7);
    let dyn_fs: Arc<dyn FileSystem> = Arc::new(fs.clone());
    let dir = PathBuf::from("/replica");
    dyn_fs.create_dir_all(&dir).unwrap();
    (fs, dyn_fs, dir)
}

pub fn all_bytes(log: &LogStorage) -> Vec<u8> {
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

/// A log of random groups reaching at least `until`, all synced; returns it and its bytes.
pub fn build(
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
pub fn groups_from(peer: &LogStorage, lsn: u64) -> Vec<u8> {
    let (_, bytes) = peer.read_range(lsn, usize::MAX).unwrap();
    bytes
}

pub fn list_log(fs: &Arc<dyn FileSystem>, dir: &Path) -> Vec<String> {
    fs.list_dir(&dir.join("log")).unwrap()
}
