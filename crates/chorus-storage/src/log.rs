//! The log of one replica in constant-size block files (PALF section 3.4).
//!
//! Block `n` is the file `log/{n:020}.blk`: a 4 KiB [`BlockHeader`] followed by the log
//! bytes of LSNs `[n * block_size, (n + 1) * block_size)`. Groups never straddle blocks
//! ([`fits_in_block`]); the leader fills a block's tail with a padding group.
//!
//! # Recovery
//!
//! Opening reads every block header (one 4 KiB read each) and scans only the **last**
//! block: before a new block is created the previous one is synced whole, so everything
//! before the last block is known to be complete. Restart time is therefore bounded by
//! the block size, not the log length.
//!
//! In the last block, the first group that fails a check at LSN `B` is classified
//! (protocol-aware recovery, Alagappan et al., FAST 2018):
//! - if no valid group header for a later position follows it, `B..` is a **torn tail**
//!   left by a crash before its sync: it is cut off and reported in [`RecoveryReport`];
//! - if a valid group follows it, the bad bytes lie *before* the tail: that is
//!   **corruption** and opening fails with [`StorageError::Corrupt`] naming file, offset,
//!   expected and found checksums. Nothing is truncated; the replica repairs the range
//!   from a peer.
//!
//! Corruption in older blocks is found when the range is read (every read checks the
//! group's header and body checksums), by `chorus inspect --verify`, and by a scrub of
//! the sealed blocks ([`SealedBlock`], module `scrub`), whose findings go to the same
//! repair as damage found at open ([`LogStorage::note_damage`]).
//!
//! # Zeros ahead of the end
//!
//! Block files are not preallocated whole, but appends keep up to
//! [`LogOptions::preallocate`] bytes of zeros written after the end of the tail block
//! (never past the block's last byte). An `fdatasync` that changes a file's size or turns
//! unallocated space into data also commits file-system metadata (on ext4 a journal
//! commit); one that only overwrites written space does not. Zero-filling ahead, one
//! piece every `preallocate / 2` bytes of log, makes the other syncs of the append path
//! overwrites: on this project's test machine 1.6–2.5× more syncs per second
//! (docs/benchmarks/storage.md). Zeroing writes each byte twice, so it stops while syncs carry
//! much data ([`ZERO_AHEAD_BELOW`]): there the metadata commit is small next to the data.
//! `fallocate` would not do: it leaves unwritten extents, and turning those into data
//! costs the same metadata commit. Recovery and readers already
//! treat zeros after the last valid group as the end of the log (below), so the format
//! does not change; recovery cuts the zeros off and appends write them again.
//!
//! # Trim and rebase
//!
//! The log's start is always a block start: [`LogStorage::trim`] deletes whole blocks
//! below the trim point and the log then starts at the first block kept, which is also
//! what opening finds. [`LogStorage::rebase`] replaces the whole log by an empty one
//! starting at a chain point taken from a peer (a replica catching up past a leader's
//! trim point), crash-atomically through a temporary file that opening finishes or
//! discards (docs/formats.md, "Block file").
//!
//! # Durability
//!
//! [`LogStorage::append`] writes; [`LogStorage::sync`] makes everything appended durable
//! with one `fdatasync` (group commit) and only then advances
//! [`LogStorage::flushed_end`]. A failed write or sync moves the storage into a failed
//! state: every later call fails with [`StorageError::Failed`] until it is reopened.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use chorus_core::format::block::{valid_block_size, BlockHeader, BLOCK_HEADER_SIZE};
use chorus_core::format::group::{
    fits_in_block, ChainPoint, GroupHeader, GROUP_HEADER_SIZE, MAX_GROUP_BODY_BYTES,
};
use chorus_core::format::FormatError;
use chorus_core::Lsn;

use crate::align::{round_down, DirectAppend};
use crate::error::{IoContext, Result, StorageError};
use crate::fs::{FileSystem, FsFile, OpenOptions, DIRECT_IO_ALIGN};

mod read;
mod scrub;

pub use read::GroupIter;
pub use scrub::SealedBlock;

/// Default bytes of log per block file (64 MiB).
pub const DEFAULT_BLOCK_SIZE: u64 = 64 << 20;

/// Default bytes of zeros kept written ahead of the log's end (1 MiB); see the module
/// docs, "Zeros ahead of the end".
pub const DEFAULT_PREALLOCATE: u64 = 1 << 20;

/// The largest accepted [`LogOptions::preallocate`] (64 MiB).
pub const MAX_PREALLOCATE: u64 = 64 << 20;

/// Zeros are written ahead only while the log's syncs average fewer bytes than this
/// (64 KiB; a moving average over about the last eight syncs). Zeroing writes every byte
/// of log twice; it pays while each sync's metadata commit is large next to its data, and
/// costs throughput once syncs carry much data. Measured on the ordered runtime
/// (docs/benchmarks/storage.md): ≈ 2–17 KiB per sync +10–29% appends/s, ≈ 110 KiB
/// per sync −13%.
pub const ZERO_AHEAD_BELOW: u64 = 64 << 10;

/// The moving average of bytes per sync that [`ZERO_AHEAD_BELOW`] is compared with:
/// `avg` moved an eighth of the way towards `bytes`.
pub fn sync_bytes_average(avg: u64, bytes: u64) -> u64 {
    avg - avg / 8 + bytes / 8
}

/// Log storage settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogOptions {
    /// Bytes of log per block file: a multiple of 4096 in 64 KiB ..= 4 GiB. Fixed when the
    /// log is created; opening with another value fails with
    /// [`StorageError::BlockSizeMismatch`].
    pub block_size: u64,
    /// Append with direct IO (`O_DIRECT`): whole aligned pages, the partial last page kept
    /// in memory and rewritten by the next append. Falls back to buffered IO where the
    /// file system does not support it ([`LogStorage::is_direct`] tells). On by default:
    /// measured side by side with buffered appends (docs/benchmarks/storage.md) it was at least as
    /// fast (median 1.05x over three runs) and steadier, and it keeps the log out of the
    /// page cache.
    pub direct_io: bool,
    /// Bytes of zeros kept written ahead of the end of the tail block, so most syncs
    /// overwrite written space instead of growing the file (module docs, "Zeros ahead of
    /// the end"). 0 turns it off; otherwise a multiple of 4096 up to
    /// [`MAX_PREALLOCATE`]. Default [`DEFAULT_PREALLOCATE`].
    pub preallocate: u64,
}

impl Default for LogOptions {
    fn default() -> Self {
        Self {
            block_size: DEFAULT_BLOCK_SIZE,
            direct_io: true,
            preallocate: DEFAULT_PREALLOCATE,
        }
    }
}

/// The direct-IO handle of the tail block and the bytes of its partial last page.
#[derive(Debug)]
struct DirectTail {
    id: u64,
    file: Arc<dyn FsFile>,
    tail: DirectAppend,
}

/// What recovery found when the log was opened.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Number of block files.
    pub blocks: u64,
    /// Bytes of the last block that were scanned.
    pub scanned_bytes: u64,
    /// Where a torn tail was cut off, and how many bytes it had up to its last byte that
    /// is not zero (zeros after it are page padding or zeros written ahead).
    pub torn_tail: Option<(Lsn, u64)>,
    /// A half-created empty block file that was removed.
    pub removed_empty_block: Option<u64>,
    /// The end of the log after recovery.
    pub end_lsn: Lsn,
    /// The damaged ranges before the tail, in LSN order, when opened with
    /// [`LogStorage::open_damaged`] (empty: none).
    pub damaged: Vec<Damage>,
    /// A rebase interrupted by a crash after its temporary file was complete, finished
    /// at open: the id of the log's only block, where it now starts
    /// ([`LogStorage::rebase`]).
    pub completed_rebase: Option<u64>,
    /// An incomplete rebase temporary file (a crash while it was written) that was
    /// removed; the log was left as it was before the rebase.
    pub removed_rebase_tmp: bool,
}

/// A range of the log that failed its checksums although valid groups follow it: synced
/// data that went bad, never a torn tail. Protocol-aware recovery (Alagappan et al., FAST
/// 2018) repairs it from a peer with [`LogStorage::repair`] instead of truncating.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Damage {
    /// First LSN of the damaged range (a group boundary).
    pub lsn: Lsn,
    /// LSN of the first valid group after it: the range is `lsn..next_valid`.
    pub next_valid: Lsn,
    /// The block file holding it.
    pub path: PathBuf,
    /// Offset of `lsn` in that file.
    pub file_offset: u64,
    /// What was wrong, as found.
    pub detail: String,
}

/// The log of one replica. See the module docs.
#[derive(Debug)]
pub struct LogStorage {
    fs: Arc<dyn FileSystem>,
    dir: PathBuf,
    log_id: u64,
    block_size: u64,
    /// Open handles by block id. Invariant: ids are contiguous, the last is the tail.
    blocks: BTreeMap<u64, Arc<dyn FsFile>>,
    /// First readable LSN. Invariants: `start_lsn <= chain.end_lsn`, and it is the start
    /// of the first block (`first id * block_size`), so a group boundary.
    start_lsn: Lsn,
    /// Where the chain stands after the last appended group (the written end).
    chain: ChainPoint,
    /// Everything below is durable. Invariant: `flushed_end <= chain.end_lsn`.
    flushed_end: Lsn,
    failed: Option<String>,
    /// Damaged ranges not repaired yet, in LSN order, each followed by a valid group.
    damaged: Vec<Damage>,
    want_direct: bool,
    direct: Option<DirectTail>,
    /// See [`LogOptions::preallocate`].
    preallocate: u64,
    /// File offset in the tail block below which the file holds log bytes or zeros
    /// written by this log (never stale bytes). Invariant: at least the written end.
    zeroed: u64,
    /// Bytes per sync, averaged ([`sync_bytes_average`]).
    sync_bytes: u64,
    /// Bumped by every [`LogStorage::rebase`] and [`LogStorage::truncate`]: a
    /// [`SyncPoint`] taken before one synced bytes that were then discarded, so its
    /// outcome says nothing about what was written after.
    generation: u64,
    /// Set by a [`SyncPoint::sync`] that failed, as it returns, before its outcome is
    /// recorded ([`LogStorage::synced`]): from then on nothing is written. With syncs
    /// pipelined, a write made between a failed `fdatasync` and the report of it could be
    /// made durable (by the next block's creation, or by writeback) beside the earlier
    /// write the failure lost, leaving a hole before valid groups.
    sync_failed: Arc<std::sync::atomic::AtomicBool>,
    /// Chain points at group boundaries learnt by reads (module `read`), by LSN, so that
    /// [`LogStorage::chain_at`] walks headers from the nearest one below, not from the
    /// block's start: a leader catching a follower up reads range after range, each
    /// starting where the last ended. Invariant: each is the chain point of the kept
    /// log at its LSN, `start_lsn <= lsn <= chain.end_lsn`. Kept so by
    /// [`LogStorage::truncate`] (drops those past the cut), [`LogStorage::trim`],
    /// [`LogStorage::rebase`] and [`LogStorage::repair`] (drop all); at most
    /// `read::MAX_HINTS`.
    chain_hints: std::sync::Mutex<BTreeMap<Lsn, ChainPoint>>,
}

/// The name of the temporary file in the log directory that holds the new block header
/// while a [`LogStorage::rebase`] is in progress (docs/formats.md, "Block file").
pub const REBASE_TMP_NAME: &str = "rebase.tmp";

/// The file name of block `id`.
pub fn block_file_name(id: u64) -> String {
    format!("{id:020}.blk")
}

fn parse_block_name(name: &str) -> Option<u64> {
    let id = name.strip_suffix(".blk")?;
    if id.len() != 20 || !id.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    id.parse().ok()
}

/// The outcome of scanning a block's groups.
struct Scan {
    /// Chain point after the last good group (or at `upto`).
    chain: ChainPoint,
    /// The first bad place and what was wrong with it.
    bad: Option<(Lsn, FormatError)>,
    /// Log bytes present in the file.
    data_len: u64,
    /// The data read (from the block start).
    data: Vec<u8>,
}

impl LogStorage {
    fn log_dir(dir: &Path) -> PathBuf {
        dir.join("log")
    }

    fn block_path(&self, id: u64) -> PathBuf {
        self.dir.join(block_file_name(id))
    }

    /// The in-memory state before any block is created or opened.
    fn empty(fs: Arc<dyn FileSystem>, dir: PathBuf, log_id: u64, opts: &LogOptions) -> Self {
        Self {
            fs,
            dir,
            log_id,
            block_size: opts.block_size,
            blocks: BTreeMap::new(),
            start_lsn: 0,
            chain: ChainPoint::default(),
            flushed_end: 0,
            failed: None,
            damaged: Vec::new(),
            want_direct: false,
            direct: None,
            preallocate: opts.preallocate,
            zeroed: BLOCK_HEADER_SIZE as u64,
            sync_bytes: 0,
            generation: 0,
            sync_failed: Arc::default(),
            chain_hints: Default::default(),
        }
    }

    /// Creates an empty log with identity `log_id` under `dir/log/`.
    pub fn create(
        fs: Arc<dyn FileSystem>,
        dir: &Path,
        opts: LogOptions,
        log_id: u64,
    ) -> Result<Self> {
        check_options(&opts)?;
        let log_dir = Self::log_dir(dir);
        fs.create_dir_all(&log_dir)
            .ctx(&log_dir, "create directory")?;
        if !fs.list_dir(&log_dir).ctx(&log_dir, "list")?.is_empty() {
            return Err(StorageError::AlreadyExists { dir: log_dir });
        }
        let mut s = Self::empty(fs, log_dir, log_id, &opts);
        s.create_block(0, ChainPoint::default())?;
        s.want_direct = opts.direct_io && s.fs.supports_direct_io(&s.dir);
        if let Some(parent) = s.dir.parent() {
            s.fs.sync_dir(parent).ctx(parent, "fsync directory")?;
        }
        Ok(s)
    }

    /// Opens the log under `dir/log/`, recovering its tail (see the module docs).
    pub fn open(
        fs: Arc<dyn FileSystem>,
        dir: &Path,
        opts: LogOptions,
        log_id: u64,
    ) -> Result<(Self, RecoveryReport)> {
        Self::open_inner(fs, dir, opts, log_id, false)
    }

    /// As [`LogStorage::open`], but a damaged range before the tail of the last block (bad
    /// checksums with valid groups after them) does not fail the open: it is reported in
    /// [`RecoveryReport::damaged`], reads inside it fail with [`StorageError::Corrupt`], and
    /// [`LogStorage::repair`] rewrites it with a verified copy from a peer. This is the hook
    /// for the replica's protocol-aware repair; nothing is truncated.
    pub fn open_damaged(
        fs: Arc<dyn FileSystem>,
        dir: &Path,
        opts: LogOptions,
        log_id: u64,
    ) -> Result<(Self, RecoveryReport)> {
        Self::open_inner(fs, dir, opts, log_id, true)
    }

    fn open_inner(
        fs: Arc<dyn FileSystem>,
        dir: &Path,
        opts: LogOptions,
        log_id: u64,
        tolerate_damage: bool,
    ) -> Result<(Self, RecoveryReport)> {
        check_options(&opts)?;
        let log_dir = Self::log_dir(dir);
        if !fs.exists(&log_dir).ctx(&log_dir, "stat")? {
            return Err(StorageError::NotFound { dir: log_dir });
        }
        let mut s = Self::empty(fs, log_dir.clone(), log_id, &opts);
        let mut report = RecoveryReport::default();
        let mut names = s.fs.list_dir(&log_dir).ctx(&log_dir, "list")?;
        if names.iter().any(|n| n == REBASE_TMP_NAME) {
            s.recover_rebase(&names, &mut report)?;
            names = s.fs.list_dir(&log_dir).ctx(&log_dir, "list")?;
        }
        let mut ids = Vec::new();
        for name in names {
            match parse_block_name(&name) {
                Some(id) => ids.push(id),
                None => {
                    return Err(StorageError::Layout {
                        dir: log_dir,
                        detail: format!("unexpected file {name:?} (block files are NNNN….blk)"),
                    })
                }
            }
        }
        if ids.is_empty() {
            return Err(StorageError::NotFound { dir: log_dir });
        }
        for w in ids.windows(2) {
            if w[1] != w[0] + 1 {
                return Err(StorageError::Layout {
                    dir: log_dir,
                    detail: format!(
                        "block {} is missing between {} and {}",
                        w[0] + 1,
                        w[0],
                        w[1]
                    ),
                });
            }
        }
        let last = *ids.last().expect("non-empty");
        let mut headers = BTreeMap::new();
        for &id in &ids {
            let path = s.block_path(id);
            let file: Arc<dyn FsFile> = Arc::from(
                s.fs.open(&path, OpenOptions::read_write())
                    .ctx(&path, "open")?,
            );
            match s.read_block_header(&path, file.as_ref(), id) {
                Ok(h) => {
                    headers.insert(id, h);
                }
                Err(e) if id == last && ids.len() > 1 && is_empty_block(file.as_ref())? => {
                    // A crash while creating the next block: the previous block was synced
                    // whole before creation began, so nothing is lost by removing it.
                    let _ = e;
                    drop(file);
                    s.fs.remove_file(&path).ctx(&path, "remove")?;
                    s.fs.sync_dir(&s.dir).ctx(&s.dir, "fsync directory")?;
                    report.removed_empty_block = Some(id);
                    continue;
                }
                Err(e) => return Err(e),
            }
            s.blocks.insert(id, file);
        }
        let (&tail, _) = s.blocks.last_key_value().expect("at least one block");
        let first = *s.blocks.keys().next().expect("at least one block");
        s.start_lsn = first * s.block_size;
        let header = headers[&tail];
        let file = s.blocks[&tail].clone();
        let mut scan = s.scan_block(file.as_ref(), &header, None)?;
        report.scanned_bytes = scan.data_len;
        if let Some((bad_lsn, err)) = scan.bad.take() {
            let off = bad_lsn - header.start_lsn();
            if let Some(next) = find_valid_header(&scan.data, off + 1, header.start_lsn()) {
                let corrupt = StorageError::Corrupt {
                    path: s.block_path(tail),
                    file_offset: BLOCK_HEADER_SIZE as u64 + off,
                    lsn: bad_lsn,
                    source: err.clone(),
                };
                if !tolerate_damage {
                    return Err(corrupt);
                }
                // Resume after the damage from the next valid group's own header. A later
                // damaged stretch that valid groups follow again is a range of its own,
                // repaired after this one (each from its own verified copy, so that each
                // fits one message); a torn tail after the damage is cut.
                let next_lsn = header.start_lsn() + next;
                let mut stretches = vec![Damage {
                    lsn: bad_lsn,
                    next_valid: next_lsn,
                    path: s.block_path(tail),
                    file_offset: BLOCK_HEADER_SIZE as u64 + off,
                    detail: err.to_string(),
                }];
                let h = GroupHeader::decode(&scan.data[next as usize..]).expect("found valid");
                let mut chain = h.chain_after();
                if h.verify_body(
                    scan.data
                        .get(next as usize + GROUP_HEADER_SIZE..(next + h.total_len()) as usize)
                        .unwrap_or(&[]),
                )
                .is_err()
                {
                    return Err(corrupt);
                }
                loop {
                    let o = (chain.end_lsn - header.start_lsn()) as usize;
                    if o >= scan.data.len() {
                        break;
                    }
                    match check_group(&scan.data[o..], &chain, s.block_size, true) {
                        Ok(g) => chain = g.chain_after(),
                        // Nothing valid after it: a torn tail (or direct-IO zero padding)
                        // after the damaged range, cut like any torn tail.
                        Err(_)
                            if find_valid_header(&scan.data, o as u64 + 1, header.start_lsn())
                                .is_none() =>
                        {
                            if let Some(n) = torn_len(&scan.data[o..]) {
                                report.torn_tail = Some((chain.end_lsn, n));
                            }
                            let path = s.block_path(tail);
                            file.set_len(BLOCK_HEADER_SIZE as u64 + o as u64)
                                .ctx(&path, "truncate torn tail")?;
                            break;
                        }
                        Err(e) => {
                            let more =
                                find_valid_header(&scan.data, o as u64 + 1, header.start_lsn())
                                    .expect("checked in the arm above");
                            let h = GroupHeader::decode(&scan.data[more as usize..])
                                .expect("found valid");
                            let body = scan
                                .data
                                .get(
                                    more as usize + GROUP_HEADER_SIZE
                                        ..(more + h.total_len()) as usize,
                                )
                                .unwrap_or(&[]);
                            if h.verify_body(body).is_err() {
                                return Err(corrupt);
                            }
                            stretches.push(Damage {
                                lsn: chain.end_lsn,
                                next_valid: header.start_lsn() + more,
                                path: s.block_path(tail),
                                file_offset: BLOCK_HEADER_SIZE as u64 + o as u64,
                                detail: e.to_string(),
                            });
                            chain = h.chain_after();
                        }
                    }
                }
                scan.chain = chain;
                report.damaged = stretches.clone();
                s.damaged = stretches;
            } else {
                let path = s.block_path(tail);
                file.set_len(BLOCK_HEADER_SIZE as u64 + off)
                    .ctx(&path, "truncate torn tail")?;
                // Zeros after the end are the padding of direct-IO pages or zeros written
                // ahead, not a torn write.
                if let Some(n) = torn_len(&scan.data[off as usize..]) {
                    report.torn_tail = Some((bad_lsn, n));
                }
            }
        }
        // Bytes that survived a process crash may still be only in the page cache: make
        // them durable before reporting them as the flushed end.
        let path = s.block_path(tail);
        file.sync_data().ctx(&path, "fdatasync")?;
        // Everything left in the file is log bytes (or direct-IO page padding): appends
        // zero ahead from here.
        s.zeroed = file.len().ctx(&path, "stat")?;
        s.chain = scan.chain;
        s.flushed_end = s.chain.end_lsn;
        s.want_direct = opts.direct_io && s.fs.supports_direct_io(&s.dir);
        report.blocks = s.blocks.len() as u64;
        report.end_lsn = s.chain.end_lsn;
        Ok((s, report))
    }

    fn read_block_header(&self, path: &Path, file: &dyn FsFile, id: u64) -> Result<BlockHeader> {
        let mut buf = vec![0u8; BLOCK_HEADER_SIZE];
        let n = file.read_at(&mut buf, 0).ctx(path, "read block header")?;
        Self::check_block_header(path, &buf[..n], id, self.block_size, self.log_id)
    }

    /// Decodes block `id`'s header from `buf` (read from `path`) and checks that it
    /// belongs to this log, at this place, with this block size.
    fn check_block_header(
        path: &Path,
        buf: &[u8],
        id: u64,
        block_size: u64,
        log_id: u64,
    ) -> Result<BlockHeader> {
        let h = BlockHeader::decode(buf).map_err(|source| StorageError::Corrupt {
            path: path.to_path_buf(),
            file_offset: 0,
            lsn: id * block_size,
            source,
        })?;
        if h.log_id != log_id {
            return Err(StorageError::ForeignBlock {
                path: path.to_path_buf(),
                expected: log_id,
                found: h.log_id,
            });
        }
        if h.block_size != block_size {
            return Err(StorageError::BlockSizeMismatch {
                path: path.to_path_buf(),
                configured: block_size,
                on_disk: h.block_size,
            });
        }
        if h.block_id != id {
            return Err(StorageError::Layout {
                dir: path.parent().map(Path::to_path_buf).unwrap_or_default(),
                detail: format!("{} holds block {}", path.display(), h.block_id),
            });
        }
        Ok(h)
    }

    /// Scans the groups of a block from its start, stopping at the first bad place or at
    /// `upto` (a group boundary).
    fn scan_block(&self, file: &dyn FsFile, h: &BlockHeader, upto: Option<Lsn>) -> Result<Scan> {
        let path = self.block_path(h.block_id);
        let len = file.len().ctx(&path, "stat")?;
        let data_len = len
            .saturating_sub(BLOCK_HEADER_SIZE as u64)
            .min(self.block_size);
        let data = read_block_data(file, &path, data_len as usize)?;
        let mut chain = h.start_chain();
        let mut bad = None;
        loop {
            let off = (chain.end_lsn - h.start_lsn()) as usize;
            if upto.is_some_and(|u| chain.end_lsn >= u) || off >= data.len() {
                break;
            }
            match check_group(&data[off..], &chain, self.block_size, true) {
                Ok(g) => chain = g.chain_after(),
                Err(e) => {
                    bad = Some((chain.end_lsn, e));
                    break;
                }
            }
        }
        Ok(Scan {
            chain,
            bad,
            data_len: data.len() as u64,
            data,
        })
    }

    fn create_block(&mut self, id: u64, start: ChainPoint) -> Result<()> {
        let path = self.block_path(id);
        let file = self.write_block_file(&path, id, start)?;
        self.sync_dir()?;
        self.blocks.insert(id, file);
        self.zeroed = BLOCK_HEADER_SIZE as u64;
        Ok(())
    }

    /// Creates (or empties) the file `path` holding only the header of block `id`, whose
    /// chain starts at `start`, and syncs it. Its directory entry is not synced here.
    fn write_block_file(&self, path: &Path, id: u64, start: ChainPoint) -> Result<Arc<dyn FsFile>> {
        let file: Arc<dyn FsFile> = Arc::from(
            self.fs
                .open(path, OpenOptions::create())
                .ctx(path, "create")?,
        );
        let h = BlockHeader {
            log_id: self.log_id,
            block_id: id,
            block_size: self.block_size,
            start_acc_crc: start.acc_crc,
            start_group_seq: start.next_group_seq,
            start_max_csn: start.max_csn,
        };
        file.set_len(0).ctx(path, "truncate")?;
        file.write_all_at(&h.encode(), 0)
            .ctx(path, "write block header")?;
        file.sync_data().ctx(path, "fdatasync")?;
        Ok(file)
    }

    /// Makes the log directory's entries durable.
    fn sync_dir(&self) -> Result<()> {
        self.fs
            .sync_dir(&self.dir)
            .ctx(&self.dir, "fsync directory")
    }

    fn check_failed(&self) -> Result<()> {
        match &self.failed {
            Some(reason) => Err(StorageError::Failed {
                reason: reason.clone(),
            }),
            None if self.sync_failed.load(std::sync::atomic::Ordering::SeqCst) => {
                Err(StorageError::Failed {
                    reason: "an fdatasync of the log failed".into(),
                })
            }
            None => Ok(()),
        }
    }

    /// Records an IO failure: from now on the storage refuses everything.
    fn fail<T>(&mut self, r: Result<T>) -> Result<T> {
        if let Err(e) = &r {
            if self.failed.is_none() {
                self.failed = Some(e.to_string());
            }
        }
        r
    }

    /// Appends `bytes`: one or more whole groups that continue the log (LSN, sequence and
    /// accumulated checksum) and respect block placement. Not durable until
    /// [`LogStorage::sync`]. Invalid groups are refused with nothing written.
    ///
    /// The caller vouches for the body checksums (it sealed the groups, or verified them on
    /// receipt); headers, chain and placement are checked here.
    pub fn append(&mut self, bytes: &[u8]) -> Result<()> {
        self.check_failed()?;
        // Validate everything first so a refused append writes nothing.
        let mut chain = self.chain;
        let mut pieces = Vec::new();
        let mut off = 0usize;
        while off < bytes.len() {
            let g = check_group(&bytes[off..], &chain, self.block_size, false).map_err(|e| {
                StorageError::InvalidAppend {
                    lsn: chain.end_lsn,
                    detail: e.to_string(),
                }
            })?;
            pieces.push((chain, off, g.total_len() as usize));
            off += g.total_len() as usize;
            chain = g.chain_after();
        }
        // One write per block touched, not per group: per-group cost stays off the
        // syscall path (DESIGN.md principle 3).
        let mut i = 0;
        while i < pieces.len() {
            let (before, off, _) = pieces[i];
            let block = before.end_lsn / self.block_size;
            let mut end = off;
            while i < pieces.len() && pieces[i].0.end_lsn / self.block_size == block {
                end = pieces[i].1 + pieces[i].2;
                i += 1;
            }
            let r = self.write_groups(before, &bytes[off..end]);
            self.fail(r)?;
        }
        self.chain = chain;
        Ok(())
    }

    /// Writes `bytes` (whole groups, all in one block) that start at `before.end_lsn`.
    fn write_groups(&mut self, before: ChainPoint, bytes: &[u8]) -> Result<()> {
        let lsn = before.end_lsn;
        let id = lsn / self.block_size;
        let tail = *self.blocks.keys().next_back().expect("a block");
        if id != tail {
            debug_assert_eq!(id, tail + 1);
            // The previous block is complete: sync it whole before the next block exists,
            // so recovery needs to scan only the last block.
            let path = self.block_path(tail);
            self.blocks[&tail].sync_data().ctx(&path, "fdatasync")?;
            // A pipelined sync of this block that failed meanwhile may have lost writes
            // this sync did not: the block must stay the tail, where recovery looks.
            self.check_failed()?;
            // The new block header carries the chain at its start.
            self.create_block(id, before)?;
        }
        let path = self.block_path(id);
        let off = BLOCK_HEADER_SIZE as u64 + lsn % self.block_size;
        let end = off + bytes.len() as u64;
        if self.want_direct {
            self.write_direct(id, off, bytes)?;
            // The write went out in whole pages, zero-padded.
            self.zeroed = self
                .zeroed
                .max(end.next_multiple_of(DIRECT_IO_ALIGN as u64));
        } else {
            self.blocks[&id]
                .write_all_at(bytes, off)
                .ctx(&path, "write")?;
            self.zeroed = self.zeroed.max(end);
        }
        self.zero_ahead(id, end)
    }

    /// Writes zeros after `end` (a file offset of block `id`, the tail) when fewer than
    /// half of [`LogOptions::preallocate`] bytes are left zeroed past it; see the module
    /// docs. The next sync makes them durable with the log bytes before them.
    fn zero_ahead(&mut self, id: u64, end: u64) -> Result<()> {
        let limit = BLOCK_HEADER_SIZE as u64 + self.block_size;
        if self.preallocate == 0
            || self.sync_bytes >= ZERO_AHEAD_BELOW
            || self.zeroed >= limit
            || self.zeroed >= end + self.preallocate / 2
        {
            return Ok(());
        }
        let align = DIRECT_IO_ALIGN as u64;
        let from = self.zeroed.next_multiple_of(align);
        let to = (end.next_multiple_of(align) + self.preallocate).min(limit);
        if from >= to {
            return Ok(());
        }
        let file: &dyn FsFile = match &self.direct {
            Some(d) if self.want_direct && d.id == id => d.file.as_ref(),
            _ => self.blocks[&id].as_ref(),
        };
        crate::align::write_zeros(file, from, (to - from) as usize)
            .ctx(&self.dir.join(block_file_name(id)), "write zeros ahead")?;
        self.zeroed = to;
        Ok(())
    }

    /// Direct-IO append: the partial last page and `bytes`, padded with zeros to whole
    /// pages, in one aligned write at the page boundary.
    fn write_direct(&mut self, id: u64, off: u64, bytes: &[u8]) -> Result<()> {
        let path = self.block_path(id);
        if self.direct.as_ref().is_none_or(|d| d.id != id) {
            let file: Arc<dyn FsFile> = Arc::from(
                self.fs
                    .open(&path, OpenOptions::read_write().with_direct(true))
                    .ctx(&path, "open direct")?,
            );
            let page = self.read_tail_page(id, off)?;
            self.direct = Some(DirectTail {
                id,
                file,
                tail: DirectAppend::new(page),
            });
        }
        let d = self.direct.as_mut().expect("direct tail");
        d.tail
            .append(d.file.as_ref(), off, bytes)
            .ctx(&path, "write direct")
    }

    /// The bytes of block `id` from the page boundary at or below file offset `off` to
    /// `off`.
    fn read_tail_page(&self, id: u64, off: u64) -> Result<Vec<u8>> {
        let path = self.block_path(id);
        let page_start = round_down(off, DIRECT_IO_ALIGN as u64);
        let mut page = vec![0u8; (off - page_start) as usize];
        let file: &dyn FsFile = self.blocks[&id].as_ref();
        file.read_exact_at(&mut page, page_start)
            .ctx(&path, "read tail page")?;
        Ok(page)
    }

    /// Whether appends use direct IO (asked for and supported by the file system).
    pub fn is_direct(&self) -> bool {
        self.want_direct
    }

    /// Makes everything appended durable (one `fdatasync`) and returns the flushed end.
    pub fn sync(&mut self) -> Result<Lsn> {
        self.check_failed()?;
        let tail = *self.blocks.keys().next_back().expect("a block");
        let path = self.block_path(tail);
        let r = self.blocks[&tail].sync_data().ctx(&path, "fdatasync");
        self.fail(r)?;
        self.sync_bytes =
            sync_bytes_average(self.sync_bytes, self.chain.end_lsn - self.flushed_end);
        self.flushed_end = self.chain.end_lsn;
        Ok(self.flushed_end)
    }

    /// A handle that makes everything appended so far durable without borrowing the log,
    /// so readers go on while the `fdatasync` runs (the runtime syncs outside its locks).
    /// Complete earlier blocks were synced when the next block was created, so syncing
    /// the tail file covers everything up to [`SyncPoint::end`]. Report the outcome with
    /// [`LogStorage::synced`].
    pub fn sync_point(&self) -> Result<SyncPoint> {
        self.check_failed()?;
        let tail = *self.blocks.keys().next_back().expect("a block");
        Ok(SyncPoint {
            file: self.blocks[&tail].clone(),
            path: self.block_path(tail),
            end: self.chain.end_lsn,
            generation: self.generation,
            failed: self.sync_failed.clone(),
        })
    }

    /// Records the outcome of [`SyncPoint::sync`]: on success everything below the
    /// point's end is durable; on failure the storage moves to the failed state (after a
    /// failed fsync the durability of earlier writes is unknown). A point taken before a
    /// truncation below its end is ignored (its end no longer names this log's bytes), and
    /// so is one taken before a [`LogStorage::rebase`] (it synced a discarded file).
    pub fn synced(&mut self, point: &SyncPoint, r: Result<()>) -> Result<Lsn> {
        self.fail(r)?;
        if point.generation == self.generation
            && point.end <= self.chain.end_lsn
            && point.end > self.flushed_end
        {
            self.sync_bytes = sync_bytes_average(self.sync_bytes, point.end - self.flushed_end);
            self.flushed_end = point.end;
        }
        Ok(self.flushed_end)
    }
}

/// See [`LogStorage::sync_point`].
#[derive(Debug)]
pub struct SyncPoint {
    file: Arc<dyn FsFile>,
    path: PathBuf,
    end: Lsn,
    generation: u64,
    /// The log's [`LogStorage::sync_failed`].
    failed: Arc<std::sync::atomic::AtomicBool>,
}

impl SyncPoint {
    /// The LSN below which [`SyncPoint::sync`] makes the log durable.
    pub fn end(&self) -> Lsn {
        self.end
    }

    /// One `fdatasync` of the tail block file. A failure stops the log's writes at once,
    /// before it is reported (see [`LogStorage::synced`]).
    pub fn sync(&self) -> Result<()> {
        let r = self.file.sync_data().ctx(&self.path, "fdatasync");
        if r.is_err() {
            self.failed.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        r
    }
}

impl LogStorage {
    /// First readable LSN: the start of the first block kept (`first_id * block_size`),
    /// so always a group boundary. Everything below was trimmed ([`LogStorage::trim`],
    /// [`LogStorage::rebase`]); reads there fail with [`StorageError::Trimmed`]. The same
    /// after a restart.
    pub fn start_lsn(&self) -> Lsn {
        self.start_lsn
    }

    /// The checksum chain at [`LogStorage::start_lsn`]: from the first block's header
    /// (one 4 KiB read), or [`LogStorage::chain`] when the log is empty there. What the
    /// log's first group continues, and what a peer rebasing onto this log's start
    /// ([`LogStorage::rebase`]) starts from.
    pub fn start_chain(&self) -> Result<ChainPoint> {
        if self.start_lsn == self.chain.end_lsn {
            return Ok(self.chain);
        }
        let id = self.start_lsn / self.block_size;
        let path = self.block_path(id);
        let file = self.blocks[&id].clone();
        Ok(self
            .read_block_header(&path, file.as_ref(), id)?
            .start_chain())
    }

    /// LSN just past the last appended group (written, maybe not yet durable).
    pub fn end_lsn(&self) -> Lsn {
        self.chain.end_lsn
    }

    /// LSN below which everything is durable.
    pub fn flushed_end(&self) -> Lsn {
        self.flushed_end
    }

    /// Where the checksum chain stands after the last group: what the next group must
    /// continue.
    pub fn chain(&self) -> ChainPoint {
        self.chain
    }

    /// The log's identity.
    pub fn log_id(&self) -> u64 {
        self.log_id
    }

    /// Bytes of log per block.
    pub fn block_size(&self) -> u64 {
        self.block_size
    }

    /// The ids of the block files, oldest first.
    pub fn block_ids(&self) -> Vec<u64> {
        self.blocks.keys().copied().collect()
    }

    /// The first damaged range found at open and not repaired yet, if any (see
    /// [`LogStorage::open_damaged`]; after [`LogStorage::repair`], the next one).
    pub fn damaged(&self) -> Option<&Damage> {
        self.damaged.first()
    }

    /// Rewrites the first damaged range with `bytes`, whole groups fetched from a peer,
    /// durably.
    /// The copy must start at the damage, continue the checksum chain of the groups before
    /// it, end exactly where the next valid group starts, and that group must continue the
    /// copy's chain: together these prove (up to CRC32C) that the copy holds the bytes that
    /// were there. Anything else is refused with nothing written.
    pub fn repair(&mut self, bytes: &[u8]) -> Result<()> {
        self.check_failed()?;
        let Some(d) = self.damaged.first().cloned() else {
            return Err(StorageError::InvalidAppend {
                lsn: 0,
                detail: "no damaged range to repair".into(),
            });
        };
        let refuse = |detail: String| StorageError::InvalidAppend { lsn: d.lsn, detail };
        let id = d.lsn / self.block_size;
        let path = self.block_path(id);
        let file = self.blocks[&id].clone();
        let header = self.read_block_header(&path, file.as_ref(), id)?;
        let mut chain = header.start_chain();
        while chain.end_lsn < d.lsn {
            let (h, _) = self.read_group(chain.end_lsn)?;
            chain = h.chain_after();
        }
        let mut off = 0usize;
        while off < bytes.len() {
            let g = check_group(&bytes[off..], &chain, self.block_size, true)
                .map_err(|e| refuse(format!("repair copy at offset {off}: {e}")))?;
            off += g.total_len() as usize;
            chain = g.chain_after();
        }
        if chain.end_lsn != d.next_valid {
            return Err(refuse(format!(
                "repair copy ends at {} but the damage ends at {}",
                chain.end_lsn, d.next_valid
            )));
        }
        if d.next_valid % self.block_size == 0 {
            // Damage a scrub found running to its block's end (`scrub`): the next block's
            // header carries the chain on.
            let next = self.block_start_chain(d.next_valid / self.block_size)?;
            if next != chain {
                return Err(refuse(format!(
                    "the next block's start {next:?} does not continue the copy {chain:?}"
                )));
            }
        } else {
            let mut hb = [0u8; GROUP_HEADER_SIZE];
            let next_off = BLOCK_HEADER_SIZE as u64 + d.next_valid % self.block_size;
            file.read_exact_at(&mut hb, next_off).ctx(&path, "read")?;
            let next = GroupHeader::decode(&hb).map_err(|e| refuse(e.to_string()))?;
            next.verify_chain(&chain).map_err(|e| {
                refuse(format!(
                    "the group after the damage does not continue the copy: {e}"
                ))
            })?;
        }
        let r = file
            .write_all_at(bytes, d.file_offset)
            .ctx(&path, "write repair")
            .and_then(|_| file.sync_data().ctx(&path, "fdatasync"));
        self.fail(r)?;
        self.damaged.remove(0);
        // Nothing learnt through the damage is kept (none should have been: a damaged
        // header stops a walk).
        self.forget_chain_hints(self.start_lsn);
        Ok(())
    }

    /// Removes the suffix of the log from `lsn` (a group boundary), durably: used when a
    /// new leader overrides an uncommitted suffix. Blocks after `lsn`'s block are deleted
    /// and its file is cut at `lsn`, so recovery can never resurrect the removed groups.
    pub fn truncate(&mut self, lsn: Lsn) -> Result<()> {
        self.check_failed()?;
        self.check_in_log(lsn, true)?;
        if lsn == self.chain.end_lsn {
            return Ok(());
        }
        // A sync point taken before this truncation names bytes that are going: once
        // appends pass its end again it must not mark them durable (see `synced`).
        self.generation += 1;
        let id = lsn / self.block_size;
        let path = self.block_path(id);
        let file = self.blocks[&id].clone();
        let mut hb = vec![0u8; BLOCK_HEADER_SIZE];
        file.read_exact_at(&mut hb, 0)
            .ctx(&path, "read block header")?;
        let header = BlockHeader::decode(&hb).map_err(|source| StorageError::Corrupt {
            path: path.clone(),
            file_offset: 0,
            lsn: id * self.block_size,
            source,
        })?;
        let scan = self.scan_block(file.as_ref(), &header, Some(lsn))?;
        if scan.chain.end_lsn != lsn {
            if let Some((bad, source)) = scan.bad {
                if bad < lsn {
                    return Err(StorageError::Corrupt {
                        path,
                        file_offset: BLOCK_HEADER_SIZE as u64 + bad % self.block_size,
                        lsn: bad,
                        source,
                    });
                }
            }
            return Err(StorageError::NotAGroupBoundary { lsn });
        }
        // The direct tail's page is reloaded from the file at the next append.
        self.direct = None;
        // Cutting at or before a damaged range removes it.
        self.damaged.retain(|d| d.lsn < lsn);
        let r = self.cut(id, lsn, &file);
        self.fail(r)?;
        self.chain = scan.chain;
        self.flushed_end = self.flushed_end.min(lsn);
        self.forget_chain_hints(lsn + 1);
        Ok(())
    }

    fn cut(&mut self, id: u64, lsn: Lsn, file: &Arc<dyn FsFile>) -> Result<()> {
        let later: Vec<u64> = self.blocks.range(id + 1..).map(|(k, _)| *k).collect();
        // Newest first, so a crash midway leaves a contiguous set of blocks.
        for b in later.into_iter().rev() {
            self.blocks.remove(&b);
            let p = self.block_path(b);
            self.fs.remove_file(&p).ctx(&p, "remove")?;
        }
        self.fs
            .sync_dir(&self.dir)
            .ctx(&self.dir, "fsync directory")?;
        let path = self.block_path(id);
        let len = BLOCK_HEADER_SIZE as u64 + lsn % self.block_size;
        file.set_len(len).ctx(&path, "truncate")?;
        self.zeroed = len;
        file.sync_data().ctx(&path, "fdatasync")
    }

    /// Trims the log below `lsn`, block by block: every block file lying wholly below
    /// `lsn` is deleted (oldest first, so a crash midway leaves a contiguous suffix), and
    /// the log then starts at the start of the first block kept, `first_kept_id *
    /// block_size` — at or below `lsn`, and exactly where [`LogStorage::open`] finds the
    /// start after a restart. Reads below it fail with [`StorageError::Trimmed`]. The
    /// start is always a group boundary (groups never straddle blocks) whose chain point
    /// is in that block's header ([`LogStorage::start_chain`]). The tail block is always
    /// kept, so the log's end never moves. Nothing else records the trim: the blocks
    /// present are the record, so a restart finds the same start.
    pub fn trim(&mut self, lsn: Lsn) -> Result<()> {
        self.check_failed()?;
        let lsn = lsn.min(self.chain.end_lsn);
        let tail = *self.blocks.keys().next_back().expect("a block");
        let keep = (lsn / self.block_size).min(tail);
        let doomed: Vec<u64> = self.blocks.range(..keep).map(|(&b, _)| b).collect();
        if doomed.is_empty() {
            return Ok(());
        }
        let r = (|| {
            for &b in &doomed {
                let p = self.block_path(b);
                self.fs.remove_file(&p).ctx(&p, "remove")?;
                self.blocks.remove(&b);
            }
            self.sync_dir()
        })();
        // Whatever was removed, the start stays the first remaining block's.
        let first = *self.blocks.keys().next().expect("the tail is kept");
        self.start_lsn = first * self.block_size;
        self.forget_chain_hints_below(self.start_lsn);
        self.fail(r)
    }

    /// Discards the whole log and starts it again, empty, at `base`: a chain point at a
    /// block boundary (`base.end_lsn` a multiple of the block size) taken from a peer's
    /// log. Afterwards `start_lsn() == end_lsn() == flushed_end() == base.end_lsn`,
    /// `chain() == base`, the only block is `base.end_lsn / block_size`, and appends
    /// continue `base`.
    ///
    /// This is how a replica that fell behind a leader's trim point catches up (like
    /// Raft's InstallSnapshot; the database's state up to `base` is transferred outside
    /// the log): the groups it lacks are gone from every peer, so its own log can only
    /// restart where the leader's begins. The caller must rebase only to a `base` at or
    /// below the group's committed end, so that nothing is discarded that is uncommitted
    /// and that a majority may still need.
    ///
    /// Crash-atomic: after a crash at any point, [`LogStorage::open`] finds either the
    /// old log intact or the new empty log at `base`, never a mix (docs/formats.md,
    /// "Block file"): the new block is written and synced under the temporary name
    /// [`REBASE_TMP_NAME`] first, then every old block is removed and the temporary file
    /// renamed to the new block's name, each step followed by a directory fsync; `open`
    /// finishes a rebase whose temporary file is complete and discards one that is not.
    ///
    /// An unaligned `base` is refused with [`StorageError::NotABlockBoundary`], changing
    /// nothing. An IO error moves the storage into the failed state; reopen it to find
    /// the old or the new log.
    pub fn rebase(&mut self, base: ChainPoint) -> Result<()> {
        self.check_failed()?;
        if !base.end_lsn.is_multiple_of(self.block_size) {
            return Err(StorageError::NotABlockBoundary {
                lsn: base.end_lsn,
                block_size: self.block_size,
            });
        }
        let id = base.end_lsn / self.block_size;
        let r = self.rebase_files(id, base);
        let file = self.fail(r)?;
        self.blocks.clear();
        self.blocks.insert(id, file);
        self.start_lsn = base.end_lsn;
        self.chain = base;
        self.flushed_end = base.end_lsn;
        self.damaged.clear();
        // As for a freshly created block: the direct tail is opened at the next append,
        // the file holds nothing after its header, and the sync sizes start over.
        self.direct = None;
        self.zeroed = BLOCK_HEADER_SIZE as u64;
        self.sync_bytes = 0;
        self.generation += 1;
        self.forget_chain_hints(0);
        Ok(())
    }

    /// The file steps of [`LogStorage::rebase`]; returns the new block's handle.
    fn rebase_files(&self, id: u64, base: ChainPoint) -> Result<Arc<dyn FsFile>> {
        let tmp = self.dir.join(REBASE_TMP_NAME);
        // 1. The new block, complete and durable under the temporary name: from here on
        //    a crash ends in the new log.
        self.write_block_file(&tmp, id, base)?;
        self.sync_dir()?;
        // 2. Every old block goes, the new block's id included if the log had it.
        for &b in self.blocks.keys() {
            let p = self.block_path(b);
            self.fs.remove_file(&p).ctx(&p, "remove")?;
        }
        self.sync_dir()?;
        // 3. The temporary file becomes the block.
        let path = self.block_path(id);
        self.fs.rename(&tmp, &path).ctx(&tmp, "rename")?;
        self.sync_dir()?;
        let file = self
            .fs
            .open(&path, OpenOptions::read_write())
            .ctx(&path, "open")?;
        Ok(Arc::from(file))
    }

    /// At open, with [`REBASE_TMP_NAME`] among the log directory's `names`: finishes the
    /// rebase if the temporary file holds a complete, valid header (it was synced before
    /// any old block was touched), or removes it (a crash while it was written, so the
    /// old log is intact).
    fn recover_rebase(&mut self, names: &[String], report: &mut RecoveryReport) -> Result<()> {
        let tmp = self.dir.join(REBASE_TMP_NAME);
        let file = self
            .fs
            .open(&tmp, OpenOptions::read_write())
            .ctx(&tmp, "open")?;
        let mut buf = vec![0u8; BLOCK_HEADER_SIZE];
        let header = if file.len().ctx(&tmp, "stat")? >= BLOCK_HEADER_SIZE as u64 {
            file.read_exact_at(&mut buf, 0)
                .ctx(&tmp, "read block header")?;
            BlockHeader::decode(&buf).ok()
        } else {
            None
        };
        let Some(h) = header else {
            drop(file);
            self.fs.remove_file(&tmp).ctx(&tmp, "remove")?;
            self.sync_dir()?;
            report.removed_rebase_tmp = true;
            return Ok(());
        };
        // A valid header of another log or block size is not guessed at: removing it
        // could leave a half-removed old log, so opening fails as it would on a block.
        if h.log_id != self.log_id {
            return Err(StorageError::ForeignBlock {
                path: tmp,
                expected: self.log_id,
                found: h.log_id,
            });
        }
        if h.block_size != self.block_size {
            return Err(StorageError::BlockSizeMismatch {
                path: tmp,
                configured: self.block_size,
                on_disk: h.block_size,
            });
        }
        // The header may be only in the page cache (the rebase stopped before its
        // fdatasync), or visible but never to be written back (its fdatasync failed,
        // fsyncgate): write it again and sync it, and its directory entry, before any old
        // block is removed.
        let r = file
            .set_len(BLOCK_HEADER_SIZE as u64)
            .and_then(|_| file.write_all_at(&buf, 0))
            .and_then(|_| file.sync_data());
        r.ctx(&tmp, "rewrite and fdatasync")?;
        drop(file);
        self.sync_dir()?;
        for id in names.iter().filter_map(|n| parse_block_name(n)) {
            let p = self.block_path(id);
            self.fs.remove_file(&p).ctx(&p, "remove")?;
        }
        self.sync_dir()?;
        let path = self.block_path(h.block_id);
        self.fs.rename(&tmp, &path).ctx(&tmp, "rename")?;
        self.sync_dir()?;
        report.completed_rebase = Some(h.block_id);
        Ok(())
    }
}

fn check_options(opts: &LogOptions) -> Result<()> {
    if !valid_block_size(opts.block_size) {
        return Err(StorageError::InvalidConfig {
            setting: "block_size",
            value: opts.block_size.to_string(),
            accepted: "a multiple of 4096 from 65536 to 4294967296",
        });
    }
    if !opts.preallocate.is_multiple_of(DIRECT_IO_ALIGN as u64)
        || opts.preallocate > MAX_PREALLOCATE
    {
        return Err(StorageError::InvalidConfig {
            setting: "preallocate",
            value: opts.preallocate.to_string(),
            accepted: "0 or a multiple of 4096 up to 67108864",
        });
    }
    Ok(())
}

/// The length of a torn tail that starts `rest`: up to its last byte that is not zero
/// (zeros after it are direct-IO padding or zeros written ahead); `None` if all are zero.
pub(crate) fn torn_len(rest: &[u8]) -> Option<u64> {
    rest.iter().rposition(|b| *b != 0).map(|i| i as u64 + 1)
}

/// Up to `len` bytes of a block file's data (what follows its header), fewer where the
/// file ends: what open's scan and the scrubber's pass both check group by group.
fn read_block_data(file: &dyn FsFile, path: &Path, len: usize) -> Result<Vec<u8>> {
    let mut data = vec![0u8; len];
    let mut got = 0;
    while got < data.len() {
        let n = file
            .read_at(&mut data[got..], BLOCK_HEADER_SIZE as u64 + got as u64)
            .ctx(path, "read")?;
        if n == 0 {
            break;
        }
        got += n;
    }
    data.truncate(got);
    Ok(data)
}

fn is_empty_block(file: &dyn FsFile) -> Result<bool> {
    let len = file.len().map_err(|source| StorageError::Io {
        path: PathBuf::new(),
        op: "stat",
        source,
    })?;
    Ok(len <= BLOCK_HEADER_SIZE as u64)
}

/// Checks one whole group at the start of `buf` against the chain and the placement rule.
///
/// `verify_body` is false on the append path: the leader computed the body checksum while
/// sealing and a follower verifies it when the group arrives, so checking it a third time
/// here would cost about 10% of append throughput (measured, `docs/benchmarks/storage.md`) for no
/// protection. Recovery and reads always check it.
fn check_group(
    buf: &[u8],
    chain: &ChainPoint,
    block_size: u64,
    verify_body: bool,
) -> Result<GroupHeader, FormatError> {
    let h = GroupHeader::decode(buf)?;
    h.verify_chain(chain)?;
    if !fits_in_block(h.lsn, h.total_len(), block_size) {
        return Err(FormatError::Malformed {
            what: "group header",
            detail: format!(
                "group of {} bytes at lsn {} breaks block placement (block size {block_size})",
                h.total_len(),
                h.lsn
            ),
        });
    }
    let end = h.total_len() as usize;
    if buf.len() < end {
        return Err(FormatError::Truncated {
            what: "group body",
            need: end as u64,
            have: buf.len() as u64,
        });
    }
    if verify_body {
        h.verify_body(&buf[GROUP_HEADER_SIZE..end])?;
    }
    debug_assert!(h.body_len <= MAX_GROUP_BODY_BYTES);
    Ok(h)
}

/// The first position at or after `from` in `data` (a block's log bytes starting at
/// `block_lsn`) holding a group header that decodes and names that very position.
fn find_valid_header(data: &[u8], from: u64, block_lsn: Lsn) -> Option<u64> {
    let mut pos = from as usize;
    while pos + GROUP_HEADER_SIZE <= data.len() {
        if let Ok(h) = GroupHeader::decode(&data[pos..]) {
            if h.lsn == block_lsn + pos as u64 {
                return Some(pos as u64);
            }
        }
        pos += 1;
    }
    None
}
