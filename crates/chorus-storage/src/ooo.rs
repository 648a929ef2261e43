//! Durable storage of one out-of-order group replica: its entries (any slot, in any
//! order, holes and all, a later write of a slot replacing an earlier one) and its hard
//! state.
//!
//! Layout of the group directory:
//!
//! - `entries.log`: entry records (`chorus_core::format::ooo`) appended back to back in
//!   the order they were written; the last record of a slot wins. [`OooStore::write`]
//!   buffers, [`OooStore::sync`] appends the buffer and runs `fdatasync` — the driver
//!   syncs before executing any action after a `Write` (the replica's durability rule).
//!   Appends use direct IO (`O_DIRECT`) where the file system takes it
//!   ([`OooStore::set_direct_io`]), as the ordered log's tail block does: the partial last
//!   page is kept in memory and rewritten with the new records in one aligned write,
//!   zero-padded to the page boundary, so a group's bytes go from the buffer to the
//!   device without a copy into the page cache (a parallel follower at block depth 32
//!   spent a quarter of its CPU in that copy; bench/results/2026-11-28-ooo-x/NOTES.md). The
//!   padding is zeros after the last record, which recovery takes for the end.
//!   Like the ordered log's tail block (`crate::log`, "Zeros ahead of the end"), the file
//!   is kept zero-filled up to [`OooStore::set_preallocate`] bytes past its end, so most
//!   syncs overwrite written space instead of growing the file (while syncs carry little
//!   data, `crate::log::ZERO_AHEAD_BELOW`); recovery takes zeros after the last valid
//!   record for the end (they are never a torn tail) and cuts them.
//! - `hard`: the hard state record, and `members`: the membership last saved (absent
//!   while the group keeps the voters it was created with). Each is a slot file
//!   ([`crate::slots`]; magics `b"CHORUSHD"` and `b"CHORUSMB"`): two copies, each written
//!   and synced in turn, so a torn write or a flipped bit in one leaves the other. A file
//!   shorter than a slot is the single-record layout written before (crash-atomically
//!   by rename); it is read as such and rewritten as a slot file when opened.
//!
//! Recovery reads every record. A record that fails its checks is a **torn tail** only if
//! no valid record follows it anywhere in the file — then the file is cut there (those
//! bytes were never synced, so nothing acknowledged is lost); otherwise it is corruption:
//! [`OooStore::open`] refuses it by name with its file offset, never cut.
//! [`OooStore::open_tolerating_damage`] instead skips each damaged stretch to the next
//! valid record, reports it ([`OooRecovery::damaged`]) and keeps a copy of the file as
//! found (`entries.damaged`); the replica then recovers what it lost from its peers
//! (`Hard::after_loss`, protocol-aware recovery), and the driver saves that hard state
//! before rewriting the file without the damage ([`OooStore::compact`]).
//!
//! **Compaction** ([`OooStore::compact`], after the replica's `Action::Compact`): once the
//! state machine's image covers every slot below the replica's base (and the hard state
//! naming that base is saved), the file is rewritten with only the latest version of each
//! slot from the base on — written to `entries.tmp`, synced, renamed over `entries.log`,
//! the directory synced. A crash before the rename leaves the old file whole and a stray
//! `entries.tmp`, removed at the next open; entries below the base that an interrupted
//! compaction left behind are ignored by the replica.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use chorus_core::format::ooo::{
    decode_entry, decode_hard, decode_membership, encode_entry_into, encode_hard,
    encode_membership, entry_len, ENTRY_MAGIC,
};
use chorus_core::format::FormatError;
use chorus_core::ooo::replica::{Entry, Hard, Membership};
use chorus_core::ooo::Seq;

use crate::align::{round_down, DirectAppend};
use crate::fs::{FileSystem, FsFile, OpenOptions, DIRECT_IO_ALIGN};
use crate::slots::{Magic, SlotFile, SLOT_SIZE};
use crate::{Result, StorageError};

const ENTRIES: &str = "entries.log";
const HARD: &str = "hard";
const ENTRIES_TMP: &str = "entries.tmp";
const MEMBERS: &str = "members";
const DAMAGED: &str = "entries.damaged";
const DAMAGED_TMP: &str = "entries.damaged.tmp";
/// The hard state file's slot magic.
const HARD_MAGIC: Magic = *b"CHORUSHD";
/// The membership file's slot magic.
const MEMBERS_MAGIC: Magic = *b"CHORUSMB";

/// What [`OooStore::open`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OooRecovery {
    /// Records read.
    pub records: u64,
    /// Bytes of a torn tail cut off.
    pub torn_bytes: u64,
    /// Damaged stretches that valid records follow, skipped
    /// ([`OooStore::open_tolerating_damage`] only; [`OooStore::open`] refuses them).
    pub damaged: Vec<OooDamage>,
}

/// A stretch of the entries file that fails its checks although a valid record follows
/// it: synced data that went bad, never a torn tail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OooDamage {
    /// The entries file.
    pub path: PathBuf,
    /// Where the stretch starts.
    pub file_offset: u64,
    /// Its length: the next valid record starts at `file_offset + len`.
    pub len: u64,
    /// What was wrong with the record at `file_offset`, as found.
    pub detail: String,
}

impl OooDamage {
    /// The damage as the error [`OooStore::open`] refuses it with.
    pub fn to_error(&self) -> StorageError {
        StorageError::CorruptRecord {
            path: self.path.clone(),
            file_offset: self.file_offset,
            source: FormatError::Malformed {
                what: "out-of-order entries file",
                detail: format!(
                    "{}; a valid record follows at offset {}",
                    self.detail,
                    self.file_offset + self.len
                ),
            },
        }
    }
}

/// The store. See the module documentation.
#[derive(Debug)]
pub struct OooStore {
    fs: Arc<dyn FileSystem>,
    dir: PathBuf,
    file: Box<dyn FsFile>,
    end: u64,
    buf: Vec<u8>,
    failed: Option<String>,
    /// Bytes of zeros kept written past `end` (0: none).
    preallocate: u64,
    /// Below this offset the file holds records or zeros this store wrote. Invariant:
    /// `zeroed >= end`.
    zeroed: u64,
    /// Bytes per sync, averaged ([`crate::log::sync_bytes_average`]).
    sync_bytes: u64,
    /// Append with direct IO (asked for, and the file system takes it).
    want_direct: bool,
    /// The direct-IO handle, opened at the first append that uses it.
    direct: Option<DirectTail>,
    /// The hard state's slot file; `None` until the first save.
    hard: Option<SlotFile>,
    /// The membership's slot file (`None` until the first save) and what it holds.
    members: Option<(SlotFile, Membership)>,
}

/// The direct-IO handle of the entries file and its partial last page.
#[derive(Debug)]
struct DirectTail {
    file: Box<dyn FsFile>,
    tail: DirectAppend,
}

/// Default bytes of zeros an [`OooStore`] keeps written past the end of its entries file
/// (1 MiB, as the ordered log's [`crate::log::DEFAULT_PREALLOCATE`]).
pub const DEFAULT_PREALLOCATE: u64 = crate::log::DEFAULT_PREALLOCATE;

fn io<'a>(path: &'a Path, op: &'static str) -> impl FnOnce(std::io::Error) -> StorageError + 'a {
    move |source| StorageError::Io {
        path: path.to_path_buf(),
        op,
        source,
    }
}

impl OooStore {
    /// Opens (creating if needed) the store in `dir`; returns it with the saved hard state
    /// (default when none was saved) and the latest entry of every slot. Damage before
    /// the tail is refused ([`StorageError::CorruptRecord`]).
    pub fn open(
        fs: Arc<dyn FileSystem>,
        dir: &Path,
    ) -> Result<(Self, Hard, Vec<Entry>, OooRecovery)> {
        Self::open_with(fs, dir, false)
    }

    /// As [`OooStore::open`], but damaged stretches that valid records follow are skipped
    /// and reported in [`OooRecovery::damaged`] rather than refused; the file as found is
    /// first copied to `entries.damaged` (synced), for the operator. The entries returned
    /// are then only what survived: the caller must treat the replica as having lost
    /// acknowledged entries (`Hard::after_loss`, saved before [`OooStore::compact`]
    /// rewrites the file without the damage).
    pub fn open_tolerating_damage(
        fs: Arc<dyn FileSystem>,
        dir: &Path,
    ) -> Result<(Self, Hard, Vec<Entry>, OooRecovery)> {
        Self::open_with(fs, dir, true)
    }

    fn open_with(
        fs: Arc<dyn FileSystem>,
        dir: &Path,
        tolerate: bool,
    ) -> Result<(Self, Hard, Vec<Entry>, OooRecovery)> {
        fs.create_dir_all(dir).map_err(io(dir, "create_dir_all"))?;
        let hard_file = open_small(&fs, &dir.join(HARD), HARD_MAGIC, "hard state", decode_hard)?;
        let members = open_small(
            &fs,
            &dir.join(MEMBERS),
            MEMBERS_MAGIC,
            "membership",
            decode_membership,
        )?;
        let hard = hard_file.as_ref().map_or_else(Hard::default, |h| h.1);
        let stray = dir.join(ENTRIES_TMP);
        if fs.exists(&stray).map_err(io(&stray, "stat"))? {
            // A compaction that crashed before its rename: entries.log is whole.
            fs.remove_file(&stray).map_err(io(&stray, "remove"))?;
        }
        let path = dir.join(ENTRIES);
        let fresh = !fs.exists(&path).map_err(io(&path, "stat"))?;
        let file = fs
            .open(&path, OpenOptions::create())
            .map_err(io(&path, "open"))?;
        if fresh {
            // A new file's name is durable only once its directory is synced (and the
            // directory's own name once its parent is): without this a crash could take
            // entries.log away with every entry synced into it.
            fs.sync_dir(dir).map_err(io(dir, "fsync dir"))?;
            if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                fs.sync_dir(parent).map_err(io(parent, "fsync dir"))?;
            }
        }
        let len = file.len().map_err(io(&path, "stat"))?;
        let mut bytes = vec![0u8; len as usize];
        file.read_exact_at(&mut bytes, 0)
            .map_err(io(&path, "read"))?;
        let scan = scan_entries(&path, &bytes);
        if let Some(d) = scan.damaged.first().filter(|_| !tolerate) {
            return Err(d.to_error());
        }
        let at = scan.end as usize;
        let rec = OooRecovery {
            records: scan.records.len() as u64,
            torn_bytes: scan.torn,
            damaged: scan.damaged,
        };
        if at < bytes.len() {
            file.set_len(at as u64).map_err(io(&path, "truncate"))?;
            file.sync_data().map_err(io(&path, "fdatasync"))?;
        }
        let slots = scan.slots;
        let want_direct = fs.supports_direct_io(dir);
        let mut store = Self {
            fs,
            dir: dir.to_path_buf(),
            file,
            end: at as u64,
            buf: Vec::new(),
            failed: None,
            preallocate: DEFAULT_PREALLOCATE,
            zeroed: at as u64,
            sync_bytes: 0,
            want_direct,
            direct: None,
            hard: hard_file.map(|h| h.0),
            members,
        };
        if !rec.damaged.is_empty() {
            // The file as found, for whoever wants to look at the damage; an earlier copy
            // (a second loss) is replaced.
            store.replace(DAMAGED_TMP, DAMAGED, &bytes)?;
        }
        Ok((store, hard, slots.into_values().collect(), rec))
    }

    fn check(&self) -> Result<()> {
        match &self.failed {
            Some(reason) => Err(StorageError::Failed {
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Sets how many bytes of zeros [`OooStore::sync`] keeps written past the end of the
    /// entries file (0: none; default [`DEFAULT_PREALLOCATE`]); see the module docs.
    pub fn set_preallocate(&mut self, bytes: u64) {
        self.preallocate = bytes;
    }

    /// Whether appends use direct IO ([`OooStore::set_direct_io`]; on by default where
    /// the file system takes `O_DIRECT`).
    pub fn is_direct(&self) -> bool {
        self.want_direct
    }

    /// Appends with direct IO (`on`, the default) where the file system takes it, or
    /// through the page cache; see the module documentation. Either way each sync ends
    /// in `fdatasync`.
    pub fn set_direct_io(&mut self, on: bool) {
        self.want_direct = on && self.fs.supports_direct_io(&self.dir);
        if !self.want_direct {
            self.direct = None;
        }
    }

    /// Buffers an entry; durable after the next [`OooStore::sync`].
    pub fn write(&mut self, e: &Entry) -> Result<()> {
        self.check()?;
        encode_entry_into(e, &mut self.buf);
        Ok(())
    }

    /// Appends what [`OooStore::write`] buffered and makes it durable. After a failed
    /// write or sync the store refuses everything until reopened (the durability of what
    /// was written is unknown; an fsync is never retried and trusted).
    pub fn sync(&mut self) -> Result<()> {
        self.check()?;
        if self.buf.is_empty() {
            return Ok(());
        }
        let path = self.dir.join(ENTRIES);
        let end = self.end + self.buf.len() as u64;
        // A direct write covers whole pages: the file holds records or zeros up to the
        // page boundary after `end`.
        let align = if self.want_direct {
            DIRECT_IO_ALIGN as u64
        } else {
            1
        };
        let written = end.next_multiple_of(align);
        let zeroed = self.zeroed.max(written);
        // Zeros ahead once fewer than half of `preallocate` are left past the new end;
        // the sync below makes them durable with the records. Whole pages, so that a
        // direct handle can write them.
        let ahead = (self.preallocate > 0
            && self.sync_bytes < crate::log::ZERO_AHEAD_BELOW
            && zeroed < end + self.preallocate / 2)
            .then(|| {
                let to = written + self.preallocate.next_multiple_of(align);
                (zeroed.next_multiple_of(align), to)
            })
            .filter(|(from, to)| from < to);
        let r = self
            .append(&path)
            .and_then(|()| match ahead {
                Some((from, to)) => self.write_zeros(&path, from, to),
                None => Ok(()),
            })
            .and_then(|()| {
                let file = self.direct.as_ref().map_or(&self.file, |d| &d.file);
                file.sync_data().map_err(io(&path, "fdatasync"))
            });
        if let Err(e) = r {
            self.failed = Some(e.to_string());
            return Err(e);
        }
        self.sync_bytes = crate::log::sync_bytes_average(self.sync_bytes, end - self.end);
        self.end = end;
        self.zeroed = ahead.map_or(zeroed, |(_, to)| to);
        self.buf.clear();
        Ok(())
    }

    /// Writes the buffered records at the end: through the page cache, or with direct
    /// IO as the partial last page and the records, zero-padded to whole pages, in one
    /// aligned write at the page boundary.
    fn append(&mut self, path: &Path) -> Result<()> {
        if !self.want_direct {
            return self
                .file
                .write_all_at(&self.buf, self.end)
                .map_err(io(path, "write"));
        }
        if self.direct.is_none() {
            let page_start = round_down(self.end, DIRECT_IO_ALIGN as u64);
            let file = self
                .fs
                .open(path, OpenOptions::read_write().with_direct(true))
                .map_err(io(path, "open direct"))?;
            let mut page = vec![0u8; (self.end - page_start) as usize];
            self.file
                .read_exact_at(&mut page, page_start)
                .map_err(io(path, "read the last page"))?;
            self.direct = Some(DirectTail {
                file,
                tail: DirectAppend::new(page),
            });
        }
        let d = self.direct.as_mut().expect("direct tail");
        d.tail
            .append(d.file.as_ref(), self.end, &self.buf)
            .map_err(io(path, "write direct"))
    }

    /// Writes zeros over `from..to` (whole pages).
    fn write_zeros(&mut self, path: &Path, from: u64, to: u64) -> Result<()> {
        let file = self.direct.as_ref().map_or(&self.file, |d| &d.file);
        crate::align::write_zeros(file.as_ref(), from, (to - from) as usize)
            .map_err(io(path, "write zeros ahead"))
    }

    /// The membership last saved ([`OooStore::save_membership`]), if any: `None` for a
    /// group that has kept the voters it was created with.
    pub fn load_membership(&self) -> Result<Option<Membership>> {
        Ok(self.members.as_ref().map(|m| m.1.clone()))
    }

    /// Saves the membership durably (`members`, a slot file).
    pub fn save_membership(&mut self, m: &Membership) -> Result<()> {
        self.check()?;
        let bytes = encode_membership(m);
        let r = match &mut self.members {
            Some((f, _)) => f.save(&bytes),
            None => SlotFile::create(
                self.fs.clone(),
                &self.dir.join(MEMBERS),
                MEMBERS_MAGIC,
                "membership",
                &bytes,
            )
            .map(|f| self.members = Some((f, m.clone()))),
        };
        self.fail_on(r)?;
        if let Some((_, held)) = &mut self.members {
            *held = m.clone();
        }
        Ok(())
    }

    /// Saves the hard state durably (`hard`, a slot file).
    pub fn save_hard(&mut self, h: &Hard) -> Result<()> {
        self.check()?;
        let bytes = encode_hard(h);
        let r = match &mut self.hard {
            Some(f) => f.save(&bytes),
            None => SlotFile::create(
                self.fs.clone(),
                &self.dir.join(HARD),
                HARD_MAGIC,
                "hard state",
                &bytes,
            )
            .map(|f| self.hard = Some(f)),
        };
        self.fail_on(r)
    }

    /// A failure fails the store: what reached the disk is unknown.
    fn fail_on(&mut self, r: Result<()>) -> Result<()> {
        if let Err(e) = &r {
            self.failed = Some(e.to_string());
        }
        r
    }

    /// Rewrites the entries file to hold only `live` (the latest version of every slot
    /// from the replica's base on), crash-atomically; see the module documentation. What
    /// was buffered is synced to the old file first, so a crash at any point leaves either
    /// file whole.
    pub fn compact(&mut self, live: &[Entry]) -> Result<()> {
        self.sync()?;
        let mut bytes = Vec::new();
        for e in live {
            encode_entry_into(e, &mut bytes);
        }
        self.file = self.replace(ENTRIES_TMP, ENTRIES, &bytes)?;
        // The direct handle was of the file just replaced; the next append opens one on
        // the new file.
        self.direct = None;
        self.end = bytes.len() as u64;
        self.zeroed = self.end;
        Ok(())
    }

    /// Writes `bytes` to `tmp`, syncs it, renames it over `dst` and syncs the directory;
    /// returns the file. A failure fails the store (what reached the disk is unknown).
    fn replace(&mut self, tmp: &str, dst: &str, bytes: &[u8]) -> Result<Box<dyn FsFile>> {
        let (tmp, dst) = (self.dir.join(tmp), self.dir.join(dst));
        let r = (|| -> Result<Box<dyn FsFile>> {
            let f = self
                .fs
                .open(&tmp, OpenOptions::create())
                .map_err(io(&tmp, "open"))?;
            f.set_len(0).map_err(io(&tmp, "truncate"))?;
            f.write_all_at(bytes, 0).map_err(io(&tmp, "write"))?;
            f.sync_data().map_err(io(&tmp, "fdatasync"))?;
            self.fs.rename(&tmp, &dst).map_err(io(&dst, "rename"))?;
            self.fs
                .sync_dir(&self.dir)
                .map_err(io(&self.dir, "fsync dir"))?;
            Ok(f)
        })();
        if let Err(e) = &r {
            self.failed = Some(e.to_string());
        }
        r
    }

    /// Bytes of the entries file (synced part).
    pub fn len(&self) -> u64 {
        self.end
    }

    /// Whether no entry was ever synced.
    pub fn is_empty(&self) -> bool {
        self.end == 0
    }
}

/// Opens the small record file at `path` (the hard state or the membership), if there
/// is one: a slot file, or the older single-record layout (shorter than a slot), which
/// is read and rewritten as a slot file crash-atomically. Neither slot usable, or an
/// older file that does not decode, is [`StorageError::CorruptRecord`] naming the file.
fn open_small<T>(
    fs: &Arc<dyn FileSystem>,
    path: &Path,
    magic: Magic,
    what: &'static str,
    decode: fn(&[u8]) -> std::result::Result<T, FormatError>,
) -> Result<Option<(SlotFile, T)>> {
    if !fs.exists(path).map_err(io(path, "stat"))? {
        return Ok(None);
    }
    let len = {
        let f = fs
            .open(path, OpenOptions::read_only())
            .map_err(io(path, "open"))?;
        let len = f.len().map_err(io(path, "stat"))?;
        if len < SLOT_SIZE as u64 {
            let mut b = vec![0u8; len as usize];
            f.read_exact_at(&mut b, 0).map_err(io(path, "read"))?;
            let v = decode(&b).map_err(|source| StorageError::CorruptRecord {
                path: path.to_path_buf(),
                file_offset: 0,
                source,
            })?;
            drop(f);
            let file = SlotFile::create(fs.clone(), path, magic, what, &b)?;
            return Ok(Some((file, v)));
        }
        len
    };
    match SlotFile::open(fs.clone(), path, magic, what, decode) {
        Ok((f, v, _)) => Ok(Some((f, v))),
        Err(StorageError::Corrupt { source, .. }) => Err(StorageError::CorruptRecord {
            path: path.to_path_buf(),
            file_offset: 0,
            source: FormatError::Malformed {
                what,
                detail: format!("{source} ({len} bytes)"),
            },
        }),
        Err(e) => Err(e),
    }
}

/// Decodes a small record file's bytes as they lie on disk (for inspection tools): the
/// newest valid slot of a slot file, or the older single-record layout.
fn decode_small<T>(
    b: &[u8],
    magic: Magic,
    what: &'static str,
    decode: fn(&[u8]) -> std::result::Result<T, FormatError>,
) -> std::result::Result<T, FormatError> {
    if b.len() < SLOT_SIZE {
        return decode(b);
    }
    let slot = |i: usize| {
        let s = &b[(i * SLOT_SIZE).min(b.len())..((i + 1) * SLOT_SIZE).min(b.len())];
        crate::slots::decode_slot(magic, what, s).and_then(|(seq, p)| Ok((seq, decode(p)?)))
    };
    match (slot(0), slot(1)) {
        (Ok(a), Ok(c)) => Ok(if a.0 >= c.0 { a.1 } else { c.1 }),
        (Ok(a), Err(_)) | (Err(_), Ok(a)) => Ok(a.1),
        (Err(e), Err(_)) => Err(e),
    }
}

/// The hard state a `hard` file's bytes hold (either layout).
pub fn decode_hard_file(b: &[u8]) -> std::result::Result<Hard, FormatError> {
    decode_small(b, HARD_MAGIC, "hard state", decode_hard)
}

/// The membership a `members` file's bytes hold (either layout).
pub fn decode_membership_file(b: &[u8]) -> std::result::Result<Membership, FormatError> {
    decode_small(b, MEMBERS_MAGIC, "membership", decode_membership)
}

/// What reading an entries file finds ([`scan_entries`]), changing nothing.
#[derive(Clone, Debug, Default)]
pub struct EntriesScan {
    /// The latest valid record of every slot.
    pub slots: BTreeMap<Seq, Entry>,
    /// Every valid record, in file order: (file offset, length, slot, term, eid).
    pub records: Vec<(u64, u64, Seq, u64, u64)>,
    /// Damaged stretches that valid records follow.
    pub damaged: Vec<OooDamage>,
    /// Where the valid records end; from here to the end of the file run zeros written
    /// ahead (see the module docs) or a torn tail (bad bytes with no valid record after
    /// them).
    pub end: u64,
    /// Bytes of a torn tail after `end`, up to the last byte that is not zero: 0 when
    /// nothing or only zeros follow `end`.
    pub torn: u64,
}

/// Reads an entries file's bytes as recovery does ([`OooStore::open`]), without changing
/// anything: for `chorus inspect` and for the open itself.
pub fn scan_entries(path: &Path, bytes: &[u8]) -> EntriesScan {
    let mut scan = EntriesScan::default();
    let mut at = 0usize;
    while at < bytes.len() {
        match record_at(bytes, at) {
            Ok((e, n)) => {
                scan.records
                    .push((at as u64, n as u64, e.seq, e.term, e.eid));
                scan.slots.insert(e.seq, e);
                at += n;
            }
            Err(source) => match next_valid(bytes, at + 1) {
                Some(next) => {
                    scan.damaged.push(OooDamage {
                        path: path.to_path_buf(),
                        file_offset: at as u64,
                        len: (next - at) as u64,
                        detail: source.to_string(),
                    });
                    at = next;
                }
                None => break,
            },
        }
    }
    scan.end = at as u64;
    // Zeros after the torn bytes are zeros written ahead, not part of the tear.
    scan.torn = crate::log::torn_len(&bytes[at..]).unwrap_or(0);
    scan
}

fn record_at(bytes: &[u8], at: usize) -> std::result::Result<(Entry, usize), FormatError> {
    let rest = &bytes[at..];
    let n = entry_len(rest)?;
    if n > rest.len() {
        return Err(FormatError::Truncated {
            what: "out-of-order entry",
            need: n as u64,
            have: rest.len() as u64,
        });
    }
    Ok((decode_entry(&rest[..n])?, n))
}

/// The offset of the first valid record at or after `from`, if any.
fn next_valid(bytes: &[u8], from: usize) -> Option<usize> {
    let magic = ENTRY_MAGIC.to_le_bytes();
    (from..bytes.len().saturating_sub(3))
        .filter(|&i| bytes[i..i + 4] == magic)
        .find(|&i| record_at(bytes, i).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::{CrashMode, SimFs};
    use chorus_core::format::ooo::encode_entry;
    use chorus_core::ooo::dependent::Deps;
    use chorus_core::ooo::replica::Body;

    fn e(seq: Seq, term: u64, eid: u64) -> Entry {
        Entry {
            seq,
            term,
            start: 0,
            eid,
            body: Body::Dependent {
                base: 0,
                deps: Deps::default(),
                write_set: vec![seq],
                data: vec![7; 100].into(),
            },
        }
    }

    fn open(fs: &Arc<SimFs>) -> (OooStore, Hard, Vec<Entry>, OooRecovery) {
        let fs: Arc<dyn FileSystem> = fs.clone();
        OooStore::open(fs, Path::new("/g")).expect("open")
    }

    #[test]
    fn holes_replacements_and_hard_state_survive_a_crash() {
        let fs = Arc::new(SimFs::new(1));
        let (mut s, h, es, _) = open(&fs);
        assert_eq!((h, es.len()), (Hard::default(), 0));
        for x in [e(5, 1, 11), e(2, 1, 12), e(5, 2, 13)] {
            s.write(&x).unwrap();
        }
        s.sync().unwrap();
        let hard = Hard {
            term: 2,
            voted_for: Some(1),
            committed_head: 0,
            leader_start: (2, 5),
            base: 0,
            lost_below: 0,
        };
        s.save_hard(&hard).unwrap();
        s.write(&e(9, 2, 14)).unwrap(); // never synced
        fs.crash(CrashMode::Prefix);
        let (_, h, es, rec) = open(&fs);
        assert_eq!(h, hard);
        assert_eq!(
            es,
            vec![e(2, 1, 12), e(5, 2, 13)],
            "last write of a slot wins"
        );
        assert_eq!(rec.records, 3);
    }

    #[test]
    fn the_membership_survives_a_crash_and_damage_is_named() {
        let fs = Arc::new(SimFs::new(4));
        let (mut s, _, _, _) = open(&fs);
        assert_eq!(s.load_membership().unwrap(), None, "a group's first voters");
        let joint = Membership {
            version: (3, 1),
            voters: vec![1, 2, 4],
            prev: Some(vec![1, 2, 3]),
        };
        s.save_membership(&joint).unwrap();
        fs.crash(CrashMode::Prefix);
        let (mut s, _, _, _) = open(&fs);
        assert_eq!(s.load_membership().unwrap(), Some(joint));
        let last = Membership {
            version: (3, 2),
            voters: vec![1, 2, 4],
            prev: None,
        };
        s.save_membership(&last).unwrap();
        assert_eq!(s.load_membership().unwrap(), Some(last.clone()));
        // One damaged copy is survived (and rewritten from the other)...
        let dynfs: Arc<dyn FileSystem> = fs.clone();
        let path = Path::new("/g/members");
        let f = dynfs.open(path, OpenOptions::create()).unwrap();
        f.write_all_at(&[0xFF], 40).unwrap();
        f.sync_data().unwrap();
        let (s, _, _, _) = open(&fs);
        assert_eq!(s.load_membership().unwrap(), Some(last.clone()));
        // ...both damaged is refused by name, never taken for the first voters.
        f.write_all_at(&[0xFF], 40).unwrap();
        f.write_all_at(&[0xFF], (SLOT_SIZE + 40) as u64).unwrap();
        f.sync_data().unwrap();
        match OooStore::open(fs.clone(), Path::new("/g")) {
            Err(StorageError::CorruptRecord { path: p, .. }) => assert_eq!(p, path),
            other => panic!("{:?}", other.map(|o| o.1)),
        }
    }

    /// The hard state survives a flipped bit in either copy and a torn save; a file in
    /// the single-record layout written before slot files is read and rewritten as one.
    #[test]
    fn the_hard_state_survives_damage_to_one_copy_and_older_files_are_migrated() {
        let fs = Arc::new(SimFs::new(5));
        let dynfs: Arc<dyn FileSystem> = fs.clone();
        let path = Path::new("/g/hard");
        let h = |term| Hard {
            term,
            voted_for: Some(2),
            ..Hard::default()
        };
        // The older layout: the record alone.
        dynfs.create_dir_all(Path::new("/g")).unwrap();
        let f = dynfs.open(path, OpenOptions::create()).unwrap();
        f.write_all_at(&encode_hard(&h(3)), 0).unwrap();
        f.sync_data().unwrap();
        drop(f);
        let (mut s, got, _, _) = open(&fs);
        assert_eq!(got, h(3));
        assert_eq!(
            dynfs
                .open(path, OpenOptions::read_only())
                .unwrap()
                .len()
                .unwrap(),
            2 * SLOT_SIZE as u64
        );
        s.save_hard(&h(4)).unwrap();
        for at in [9u64, SLOT_SIZE as u64 + 9, 40, SLOT_SIZE as u64 + 40] {
            let f = dynfs.open(path, OpenOptions::create()).unwrap();
            let mut b = [0u8];
            f.read_exact_at(&mut b, at).unwrap();
            f.write_all_at(&[b[0] ^ 0x20], at).unwrap();
            f.sync_data().unwrap();
            let (_, got, _, _) = open(&fs);
            assert_eq!(got, h(4), "damage at {at}");
        }
        // A save torn by a crash leaves the old or the new state, never none.
        let (mut s, _, _, _) = open(&fs);
        s.save_hard(&h(5)).unwrap();
        fs.crash(CrashMode::Prefix);
        let (_, got, _, _) = open(&fs);
        assert!(got == h(5) || got == h(4), "{got:?}");
    }

    #[test]
    fn compaction_keeps_only_the_live_slots_and_survives_crashes() {
        let fs = Arc::new(SimFs::new(3));
        let (mut s, _, _, _) = open(&fs);
        for i in 0..6 {
            s.write(&e(i, 1, 100 + i)).unwrap();
        }
        s.sync().unwrap();
        let before = s.len();
        let hard = Hard {
            term: 1,
            base: 4,
            committed_head: 6,
            ..Hard::default()
        };
        s.save_hard(&hard).unwrap();
        s.compact(&[e(4, 1, 104), e(5, 1, 105)]).unwrap();
        assert!(s.len() < before / 2, "{} of {before}", s.len());
        s.write(&e(6, 1, 106)).unwrap();
        s.sync().unwrap();
        fs.crash(CrashMode::Prefix);
        let (_, h, es, rec) = open(&fs);
        assert_eq!(h, hard);
        assert_eq!(es, vec![e(4, 1, 104), e(5, 1, 105), e(6, 1, 106)]);
        assert_eq!(rec.records, 3);
        // A compaction that crashed before its rename leaves entries.tmp behind: it is
        // removed and entries.log read whole.
        let t = fs
            .open(Path::new("/g/entries.tmp"), OpenOptions::create())
            .unwrap();
        t.write_all_at(b"half a rewrite", 0).unwrap();
        t.sync_data().unwrap();
        fs.sync_dir(Path::new("/g")).unwrap();
        let (_, _, es2, _) = open(&fs);
        assert_eq!(es2, es);
        assert!(!fs.exists(Path::new("/g/entries.tmp")).unwrap());
    }

    /// Entries synced into a fresh store survive a crash that comes before anything else
    /// (a hard state, a membership) has synced the directory: the file's name is made
    /// durable when the file is created.
    #[test]
    fn a_fresh_stores_synced_entries_survive_a_crash() {
        for seed in 0..20 {
            let fs = Arc::new(SimFs::new(seed));
            let (mut s, _, _, _) = open(&fs);
            s.write(&e(1, 1, 7)).unwrap();
            s.sync().unwrap();
            fs.crash(CrashMode::Arbitrary);
            let (_, _, es, _) = open(&fs);
            assert_eq!(es, vec![e(1, 1, 7)], "seed {seed}");
        }
    }

    /// Zeros written ahead: most syncs leave the file's length alone, a reopen takes the
    /// zeros for the end (no torn bytes), and a compaction or a crash loses nothing.
    #[test]
    fn zeros_ahead_keep_the_length_and_are_no_torn_tail() {
        for (p, direct) in [0, 4096, DEFAULT_PREALLOCATE]
            .into_iter()
            .flat_map(|p| [(p, false), (p, true)])
        {
            let fs = Arc::new(SimFs::new(9));
            let (mut s, _, _, _) = open(&fs);
            s.set_preallocate(p);
            s.set_direct_io(direct);
            let path = Path::new("/g/entries.log");
            let (mut syncs, mut growths, mut last) = (0, 0, 0);
            for i in 0..200 {
                s.write(&e(i, 1, 1000 + i)).unwrap();
                s.sync().unwrap();
                let len = fs.durable_content(path).unwrap().len() as u64;
                assert!(len >= s.len() + p / 2, "{len} < {} + {p} / 2", s.len());
                syncs += 1;
                if len != last {
                    growths += 1;
                }
                last = len;
            }
            if p == 0 && !direct {
                assert_eq!(growths, syncs);
            } else if p == 0 {
                // Direct writes pad to the page: the file grows a page at a time.
                assert_eq!(last, s.len().next_multiple_of(4096));
                assert!(growths * 10 <= syncs, "{growths} in {syncs} syncs");
            } else {
                // ~150 bytes a record: a growth per p / 300 records or so.
                assert!(
                    growths * 10 <= syncs,
                    "{growths} length changes in {syncs} syncs"
                );
            }
            s.write(&e(500, 1, 5000)).unwrap(); // never synced
            fs.crash(CrashMode::Arbitrary);
            let (mut s, _, es, r) = open(&fs);
            assert_eq!((es.len(), r.records, r.torn_bytes), (200, 200, 0));
            s.set_preallocate(p);
            s.set_direct_io(direct);
            let live: Vec<Entry> = es.iter().filter(|x| x.seq >= 150).cloned().collect();
            s.compact(&live).unwrap();
            s.write(&e(300, 2, 3000)).unwrap();
            s.sync().unwrap();
            fs.crash(CrashMode::Prefix);
            let (_, _, es, r) = open(&fs);
            assert_eq!((es.len(), r.torn_bytes), (51, 0));
        }
    }

    /// Large syncs stop the zeros ahead, small ones bring them back (as the ordered log).
    #[test]
    fn large_syncs_stop_the_zeros_ahead() {
        for direct in [false, true] {
            large_syncs_stop_the_zeros_ahead_in(direct);
        }
    }

    fn large_syncs_stop_the_zeros_ahead_in(direct: bool) {
        let fs = Arc::new(SimFs::new(3));
        let (mut s, _, _, _) = open(&fs);
        s.set_preallocate(16384);
        s.set_direct_io(direct);
        // Direct writes pad to the page boundary; nothing past it.
        let end = |s: &OooStore| {
            if direct {
                s.len().next_multiple_of(4096)
            } else {
                s.len()
            }
        };
        let path = Path::new("/g/entries.log");
        let big = |seq: Seq| Entry {
            body: Body::Dependent {
                base: 0,
                deps: Deps::default(),
                write_set: vec![seq],
                data: vec![9; 128 << 10].into(),
            },
            ..e(seq, 1, seq + 1)
        };
        s.write(&e(0, 1, 1)).unwrap();
        s.sync().unwrap();
        assert!(fs.durable_content(path).unwrap().len() as u64 >= s.len() + 8192);
        for i in 1..=12 {
            s.write(&big(i)).unwrap();
            s.sync().unwrap();
        }
        assert_eq!(fs.durable_content(path).unwrap().len() as u64, end(&s));
        for i in 13..60 {
            s.write(&e(i, 1, i + 1)).unwrap();
            s.sync().unwrap();
        }
        assert!(fs.durable_content(path).unwrap().len() as u64 >= s.len() + 8192);
    }

    #[test]
    fn a_torn_tail_is_cut_and_corruption_is_named() {
        let fs = Arc::new(SimFs::new(2));
        let (mut s, _, _, _) = open(&fs);
        for i in 0..4 {
            s.write(&e(i, 1, 100 + i)).unwrap();
        }
        s.sync().unwrap();
        let len = s.len();
        drop(s);
        let f = fs
            .open(Path::new("/g/entries.log"), OpenOptions::read_write())
            .unwrap();
        // A torn last record: its second half never reached the disk.
        let rec = encode_entry(&e(4, 1, 104));
        f.write_all_at(&rec[..rec.len() / 2], len).unwrap();
        f.sync_data().unwrap();
        let (_, _, es, r) = open(&fs);
        assert_eq!(es.len(), 4);
        assert_eq!(r.torn_bytes, (rec.len() / 2) as u64);
        assert_eq!(f.len().unwrap(), len, "cut back to the last whole record");
        // A flipped byte inside the second record, with valid records after it.
        let mut b = [0u8; 1];
        let off = rec.len() as u64 + 60;
        f.read_exact_at(&mut b, off).unwrap();
        f.write_all_at(&[b[0] ^ 0x40], off).unwrap();
        f.sync_data().unwrap();
        let fs2: Arc<dyn FileSystem> = fs.clone();
        match OooStore::open(fs2, Path::new("/g")) {
            Err(StorageError::CorruptRecord { file_offset, .. }) => {
                assert_eq!(file_offset, rec.len() as u64)
            }
            other => panic!("expected corruption, got {other:?}"),
        }
        let damaged_file = {
            let mut all = vec![0u8; len as usize];
            f.read_exact_at(&mut all, 0).unwrap();
            all
        };
        // Tolerating damage: the record is skipped (the torn tail still cut), the rest
        // read, the file as found kept aside, and the file itself untouched until the
        // caller has saved the hard state of a replica that lost entries.
        let fs2: Arc<dyn FileSystem> = fs.clone();
        let (mut s, hard, es, r) =
            OooStore::open_tolerating_damage(fs2, Path::new("/g")).expect("tolerated");
        assert_eq!(
            es.iter().map(|x| x.seq).collect::<Vec<_>>(),
            vec![0, 2, 3],
            "slot 1's record is the damaged one"
        );
        assert_eq!(r.records, 3);
        assert_eq!(r.damaged.len(), 1);
        assert_eq!(
            (r.damaged[0].file_offset, r.damaged[0].len),
            (rec.len() as u64, rec.len() as u64)
        );
        assert!(matches!(
            r.damaged[0].to_error(),
            StorageError::CorruptRecord { file_offset, .. } if file_offset == rec.len() as u64
        ));
        let kept = fs
            .open(Path::new("/g/entries.damaged"), OpenOptions::read_only())
            .unwrap();
        let mut copy = vec![0u8; kept.len().unwrap() as usize];
        kept.read_exact_at(&mut copy, 0).unwrap();
        assert_eq!(copy, damaged_file, "the damaged file is kept as found");
        let lost = hard.after_loss();
        s.save_hard(&lost).unwrap();
        s.compact(&es).unwrap();
        drop(s);
        // Reopened strictly: clean, what survived, and the loss remembered.
        let (_, h, es2, r2) = open(&fs);
        assert_eq!((h, es2, r2.damaged.len()), (lost, es, 0));
        assert_eq!(h.lost_below, 1);
    }

    fn sized(seq: Seq, term: u64, n: usize) -> Entry {
        Entry {
            body: Body::Dependent {
                base: 0,
                deps: Deps::default(),
                write_set: vec![seq],
                data: (0..n)
                    .map(|i| (i as u8) ^ (seq as u8))
                    .collect::<Vec<_>>()
                    .into(),
            },
            ..e(seq, term, seq + 1)
        }
    }

    /// Direct-IO appends (the simulated file system refuses any write that is not whole
    /// aligned pages from an aligned buffer) carry the partial last page across syncs,
    /// reopens and a compaction, and leave the same records as appends through the page
    /// cache: the file's bytes up to the end are equal, and only zeros follow them.
    #[test]
    fn direct_appends_leave_the_records_buffered_appends_do() {
        let run = |direct: bool, preallocate: u64| {
            let fs = Arc::new(SimFs::new(5));
            let (mut s, _, _, _) = open(&fs);
            let mut seq = 0;
            for round in 0..3 {
                s.set_preallocate(preallocate);
                s.set_direct_io(direct);
                assert_eq!(s.is_direct(), direct);
                // Records below, across and exactly at page boundaries, one or two a sync.
                for (k, n) in [1, 100, 3_900, 4_048, 5_000, 9_000, 40_000, 0, 12]
                    .into_iter()
                    .enumerate()
                {
                    s.write(&sized(seq, 1 + round, n)).unwrap();
                    seq += 1;
                    if k % 2 == 1 {
                        s.sync().unwrap();
                    }
                }
                s.sync().unwrap();
                drop(s);
                let (again, _, es, r) = open(&fs);
                assert_eq!((es.len() as u64, r.torn_bytes), (seq, 0), "round {round}");
                s = again;
            }
            s.set_direct_io(direct);
            let live: Vec<Entry> = (20..seq).map(|q| sized(q, 3, 3 * q as usize)).collect();
            s.compact(&live).unwrap();
            for q in seq..seq + 5 {
                s.write(&sized(q, 4, 4_000 + q as usize)).unwrap();
                s.sync().unwrap();
            }
            if direct {
                let n = fs
                    .durable_content(Path::new("/g/entries.log"))
                    .unwrap()
                    .len();
                assert_eq!(n % 4096, 0, "whole pages");
            }
            s.write(&sized(99, 4, 10)).unwrap(); // never synced
            fs.crash(CrashMode::Arbitrary);
            let (s, _, es, r) = open(&fs);
            assert_eq!(r.torn_bytes, 0);
            let bytes = fs.durable_content(Path::new("/g/entries.log")).unwrap();
            let end = s.len() as usize;
            assert!(
                bytes[end..].iter().all(|&b| b == 0),
                "only zeros after the end"
            );
            (bytes[..end].to_vec(), es)
        };
        for p in [0, DEFAULT_PREALLOCATE] {
            let (buffered, es) = run(false, p);
            assert_eq!(es.len(), 7 + 5);
            assert_eq!(run(true, p), (buffered, es), "preallocate {p}");
        }
    }

    /// Where the file system refuses `O_DIRECT` (tmpfs), the store appends through the
    /// page cache whatever it is asked.
    #[test]
    fn direct_io_falls_back_where_the_file_system_refuses_it() {
        let fs = Arc::new(SimFs::new(6));
        fs.set_direct_io_supported(false);
        let (mut s, _, _, _) = open(&fs);
        assert!(!s.is_direct());
        s.set_direct_io(true);
        assert!(!s.is_direct());
        s.write(&sized(0, 1, 5_000)).unwrap();
        s.sync().unwrap();
        fs.crash(CrashMode::Prefix);
        let (s, _, es, _) = open(&fs);
        assert_eq!(es, vec![sized(0, 1, 5_000)]);
        assert!(!s.is_direct());
    }
}
