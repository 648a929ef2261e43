//! Reading the log: groups, headers, the checksum chain at a boundary, ranges for peers,
//! and what the replica needs to start ([`LogStorage::recovered`]).

use std::path::PathBuf;

use chorus_core::format::block::BLOCK_HEADER_SIZE;
use chorus_core::format::group::{ChainPoint, GroupHeader, GROUP_HEADER_SIZE};
use chorus_core::format::FormatError;
use chorus_core::replica::{GroupMeta, RecoveredLog};
use chorus_core::Lsn;

use super::{check_group, LogStorage};

use crate::error::{IoContext, Result, StorageError};
use crate::fs::FsFile;

/// Bytes of log between the chain points a walk in [`LogStorage::chain_at`] keeps.
const HINT_SPACING: u64 = 256 << 10;

/// Bytes one read of a walk in [`LogStorage::chain_at`] takes.
const WALK_READ: u64 = 256 << 10;

/// Most chain points kept: about 1 MiB of memory, 4 GiB of log at [`HINT_SPACING`].
/// Past it they are dropped all at once and learnt again.
const MAX_HINTS: usize = 16_384;

impl LogStorage {
    /// Reads and checks the group that starts at `lsn`: its header and body checksums,
    /// and that it names `lsn` (a misdirected write or a non-boundary LSN is caught).
    pub fn read_group(&self, lsn: Lsn) -> Result<(GroupHeader, Vec<u8>)> {
        let h = self.read_header(lsn)?;
        let body = self.read_body(&h)?;
        Ok((h, body))
    }

    /// Reads and checks the body of the group whose header [`LogStorage::read_header`]
    /// returned as `h`.
    pub(super) fn read_body(&self, h: &GroupHeader) -> Result<Vec<u8>> {
        let lsn = h.lsn;
        let (path, off) = self.place(lsn);
        let mut body = vec![0u8; h.body_len as usize];
        let file: &dyn FsFile = self.blocks[&(lsn / self.block_size)].as_ref();
        file.read_exact_at(&mut body, off + GROUP_HEADER_SIZE as u64)
            .ctx(&path, "read")?;
        h.verify_body(&body)
            .map_err(|source| StorageError::Corrupt {
                path,
                file_offset: off,
                lsn,
                source,
            })?;
        Ok(body)
    }

    /// Reads and checks only the header of the group that starts at `lsn` (one small
    /// read): its checksum, that it names `lsn`, and that its body ends within the log —
    /// enough to walk group boundaries without reading bodies.
    pub fn read_header(&self, lsn: Lsn) -> Result<GroupHeader> {
        self.check_in_log(lsn, false)?;
        let (path, off) = self.place(lsn);
        let mut hb = [0u8; GROUP_HEADER_SIZE];
        let file: &dyn FsFile = self.blocks[&(lsn / self.block_size)].as_ref();
        file.read_exact_at(&mut hb, off).ctx(&path, "read")?;
        self.check_header(&hb, lsn)
    }

    /// Decodes and checks the group header in `hb`, read from `lsn`: as
    /// [`LogStorage::read_header`] checks it.
    fn check_header(&self, hb: &[u8], lsn: Lsn) -> Result<GroupHeader> {
        let (path, off) = self.place(lsn);
        let corrupt = |source| StorageError::Corrupt {
            path: path.clone(),
            file_offset: off,
            lsn,
            source,
        };
        let h = GroupHeader::decode(hb).map_err(corrupt)?;
        if h.lsn != lsn {
            return Err(StorageError::NotAGroupBoundary { lsn });
        }
        if h.end_lsn() > self.chain.end_lsn {
            return Err(corrupt(FormatError::LengthOutOfRange {
                what: "group header",
                field: "body_len",
                value: h.body_len as u64,
                min: 0,
                max: self.chain.end_lsn - lsn - GROUP_HEADER_SIZE as u64,
            }));
        }
        Ok(h)
    }

    /// `lsn` is in the kept log: not trimmed, and before the end (or at it, when
    /// `end_ok`).
    pub(super) fn check_in_log(&self, lsn: Lsn, end_ok: bool) -> Result<()> {
        if lsn < self.start_lsn {
            return Err(StorageError::Trimmed {
                lsn,
                start: self.start_lsn,
            });
        }
        if lsn > self.chain.end_lsn || (lsn == self.chain.end_lsn && !end_ok) {
            return Err(StorageError::BeyondEnd {
                lsn,
                end: self.chain.end_lsn,
            });
        }
        Ok(())
    }

    /// The block file holding `lsn` and the offset of `lsn` in it.
    pub(super) fn place(&self, lsn: Lsn) -> (PathBuf, u64) {
        let id = lsn / self.block_size;
        (
            self.block_path(id),
            BLOCK_HEADER_SIZE as u64 + lsn % self.block_size,
        )
    }

    /// The checksum chain at `lsn`, a group boundary: what a group starting there must
    /// continue. Found from the header of the block holding `lsn` plus the groups before
    /// `lsn` in that block, so it costs at most one block read. The replica uses it to
    /// send a lagging follower groups from storage with the chain they continue.
    pub fn chain_at(&self, lsn: Lsn) -> Result<ChainPoint> {
        if lsn == self.chain.end_lsn {
            return Ok(self.chain);
        }
        self.check_in_log(lsn, true)?;
        let id = lsn / self.block_size;
        let block_lsn = id * self.block_size;
        let mut chain = match self.chain_hint(lsn) {
            Some(c) if c.end_lsn >= block_lsn => c,
            _ => {
                let path = self.block_path(id);
                let file = self.blocks[&id].clone();
                self.read_block_header(&path, file.as_ref(), id)?
                    .start_chain()
            }
        };
        // Headers alone carry the chain, and damage in a body before `lsn` does not stop
        // a read from `lsn`. The bytes are read WALK_READ at a time (a block of small
        // groups holds a hundred thousand headers; a read each, through a FUSE file
        // system, is seconds). Points on the way are kept every HINT_SPACING bytes, so a
        // later walk in this block is short.
        let mut kept = chain.end_lsn;
        let (mut buf, mut buf_lsn) = (Vec::new(), 0u64);
        while chain.end_lsn < lsn {
            let at = chain.end_lsn;
            let have = buf_lsn <= at && at + GROUP_HEADER_SIZE as u64 <= buf_lsn + buf.len() as u64;
            if !have {
                // A group starting before `lsn` ends at or before it, header included.
                let len = (lsn - at).min(WALK_READ).max(GROUP_HEADER_SIZE as u64);
                let (path, off) = self.place(at);
                buf.resize(len as usize, 0);
                self.blocks[&id]
                    .read_exact_at(&mut buf, off)
                    .ctx(&path, "read")?;
                buf_lsn = at;
            }
            let o = (at - buf_lsn) as usize;
            chain = self
                .check_header(&buf[o..o + GROUP_HEADER_SIZE], at)?
                .chain_after();
            if chain.end_lsn - kept >= HINT_SPACING && chain.end_lsn <= lsn {
                self.learn_chain(chain);
                kept = chain.end_lsn;
            }
        }
        if chain.end_lsn != lsn {
            return Err(StorageError::NotAGroupBoundary { lsn });
        }
        self.learn_chain(chain);
        Ok(chain)
    }

    /// Reads whole groups from `lsn` (a group boundary) up to about `max_bytes` (at least
    /// one group when any exist) and returns them with the chain they continue. Each group
    /// is checked (header, body, and that it continues the chain) as a scan checks it.
    ///
    /// One read per block spanned (plus one for the first group's header): a leader
    /// catching a follower up reads ranges of many small groups, and reading each group
    /// alone cost two reads a group, tens of thousands a range, inside the leader's
    /// round. The chain at the range's end is kept ([`LogStorage::chain_at`]): the next
    /// range starts there.
    pub fn read_range(&self, lsn: Lsn, max_bytes: usize) -> Result<(ChainPoint, Vec<u8>)> {
        let start = self.chain_at(lsn)?;
        let mut chain = start;
        let mut out = Vec::new();
        // A group past the limit is not read at all, header included: a replica under
        // repair serves a copy of a range that ends where its own damage starts, and
        // reading on into the damage would fail the whole read (the simulator's seed 5084
        // with --double-damage: two replicas, each waiting on the other's copy).
        while chain.end_lsn < self.chain.end_lsn && (out.is_empty() || out.len() < max_bytes) {
            let next = chain.end_lsn;
            let id = next / self.block_size;
            // Groups never straddle blocks: one read, up to the block's end at most.
            let region = ((id + 1) * self.block_size).min(self.chain.end_lsn) - next;
            let want = if out.is_empty() {
                let first = self.read_header(next)?.total_len();
                first.max(max_bytes as u64)
            } else {
                (max_bytes - out.len()) as u64
            };
            let len = want.min(region) as usize;
            let (path, off) = self.place(next);
            let mut buf = vec![0u8; len];
            self.blocks[&id]
                .read_exact_at(&mut buf, off)
                .ctx(&path, "read")?;
            let mut pos = 0usize;
            while buf.len() - pos >= GROUP_HEADER_SIZE {
                match check_group(&buf[pos..], &chain, self.block_size, true) {
                    Ok(h) => {
                        let n = h.total_len() as usize;
                        out.extend_from_slice(&buf[pos..pos + n]);
                        pos += n;
                        chain = h.chain_after();
                    }
                    // Cut by the limit, not by the block or the log: the range ends here.
                    Err(FormatError::Truncated { .. }) if (len as u64) < region => break,
                    Err(source) => {
                        return Err(StorageError::Corrupt {
                            path,
                            file_offset: off + pos as u64,
                            lsn: next + pos as u64,
                            source,
                        })
                    }
                }
            }
            if pos < len {
                if (len as u64) < region {
                    break; // the limit cut the buffer short of the block's end
                }
                // Groups fill a block to its end and the log to its end: bytes too few
                // for a header there are not the log's.
                return Err(StorageError::Corrupt {
                    path,
                    file_offset: off + pos as u64,
                    lsn: next + pos as u64,
                    source: FormatError::Truncated {
                        what: "group header",
                        need: GROUP_HEADER_SIZE as u64,
                        have: (len - pos) as u64,
                    },
                });
            }
        }
        self.learn_chain(chain);
        Ok((start, out))
    }

    /// The kept chain point nearest at or below `lsn`, if any.
    fn chain_hint(&self, lsn: Lsn) -> Option<ChainPoint> {
        let hints = self.chain_hints.lock().unwrap_or_else(|e| e.into_inner());
        hints.range(..=lsn).next_back().map(|(_, c)| *c)
    }

    /// Keeps `c`, the chain point of the kept log at `c.end_lsn`.
    fn learn_chain(&self, c: ChainPoint) {
        if c.end_lsn < self.start_lsn || c.end_lsn > self.chain.end_lsn {
            return;
        }
        let mut hints = self.chain_hints.lock().unwrap_or_else(|e| e.into_inner());
        if hints.len() >= MAX_HINTS {
            // Rare (a long log read all over): learnt again as reads go on.
            hints.clear();
        }
        hints.insert(c.end_lsn, c);
    }

    /// Drops the kept chain points at or past `from`.
    pub(super) fn forget_chain_hints(&self, from: Lsn) {
        let mut hints = self.chain_hints.lock().unwrap_or_else(|e| e.into_inner());
        hints.split_off(&from);
    }

    /// Drops the kept chain points below `below`.
    pub(super) fn forget_chain_hints_below(&self, below: Lsn) {
        let mut hints = self.chain_hints.lock().unwrap_or_else(|e| e.into_inner());
        *hints = hints.split_off(&below);
    }

    /// What the replica needs to start on this log (see
    /// [`chorus_core::replica::RecoveredLog`]): the committed end piggybacked in the tail
    /// (the highest `committed_end_lsn` of the last block's groups) and the index of groups
    /// from the start of the block holding the group before it. Reads at most the last
    /// block or two, however long the log is.
    pub fn recovered(&self) -> Result<RecoveredLog> {
        let end = self.chain.end_lsn;
        let bs = self.block_size;
        if end == self.start_lsn {
            return Ok(RecoveredLog {
                start: self.start_lsn,
                floor: self.chain,
                floor_pid: 0,
                groups: Vec::new(),
                committed: self.start_lsn,
            });
        }
        let tail_block_start = ((end - 1) / bs * bs).max(self.start_lsn);
        let mut committed = self.start_lsn;
        let mut groups = Vec::new();
        let collect = |from: Lsn, groups: &mut Vec<GroupMeta>, committed: &mut Lsn| {
            for g in self.iter_from(from) {
                let (h, _) = g?;
                *committed = (*committed).max(h.committed_end_lsn);
                groups.push(GroupMeta {
                    lsn: h.lsn,
                    pid: h.proposal_id,
                    after: h.chain_after(),
                });
            }
            Ok::<(), StorageError>(())
        };
        collect(tail_block_start, &mut groups, &mut committed)?;
        let mut floor_lsn = tail_block_start;
        // The index must reach back to the committed point (and before it, to the group
        // ending there) so the replica knows that group's proposal id and can name the
        // committed point as a log position. That includes a log in which nothing was
        // committed yet (committed == start): a leader cut off from its followers fills its
        // whole window, possibly past a block, with groups that piggyback committed 0 (found
        // by the simulator, seed 101006 in sync mode). The span read stays bounded: the
        // committed point piggybacked in the tail trails the end by at most the leader's
        // window.
        if committed <= tail_block_start && tail_block_start > self.start_lsn {
            floor_lsn = if committed > self.start_lsn {
                ((committed - 1) / bs * bs).max(self.start_lsn)
            } else {
                self.start_lsn
            };
            groups.clear();
            let mut ignored = committed;
            collect(floor_lsn, &mut groups, &mut ignored)?;
        }
        Ok(RecoveredLog {
            start: self.start_lsn,
            floor: self.chain_at(floor_lsn)?,
            floor_pid: 0,
            groups,
            committed: committed.min(end),
        })
    }

    /// Iterates over the groups from `lsn` (a group boundary) to the current end.
    pub fn iter_from(&self, lsn: Lsn) -> GroupIter<'_> {
        GroupIter {
            log: self,
            next: lsn,
            done: false,
        }
    }
}

/// Iterator over groups, see [`LogStorage::iter_from`]. Stops after the first error.
#[derive(Debug)]
pub struct GroupIter<'a> {
    log: &'a LogStorage,
    next: Lsn,
    done: bool,
}

impl Iterator for GroupIter<'_> {
    type Item = Result<(GroupHeader, Vec<u8>)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done || self.next >= self.log.end_lsn() {
            return None;
        }
        let r = self.log.read_group(self.next);
        match &r {
            Ok((h, _)) => self.next = h.end_lsn(),
            Err(_) => self.done = true,
        }
        Some(r)
    }
}
