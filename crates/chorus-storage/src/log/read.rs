//! Reading the log: groups, headers, the checksum chain at a boundary, ranges for peers,
//! and what the replica needs to start ([`LogStorage::recovered`]).

use std::path::PathBuf;

use chorus_core::format::block::BLOCK_HEADER_SIZE;
use chorus_core::format::group::{ChainPoint, GroupHeader, GROUP_HEADER_SIZE};
use chorus_core::format::FormatError;
use chorus_core::replica::{GroupMeta, RecoveredLog};
use chorus_core::Lsn;

use super::LogStorage;
use crate::error::{IoContext, Result, StorageError};
use crate::fs::FsFile;

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
        let corrupt = |source| StorageError::Corrupt {
            path: path.clone(),
            file_offset: off,
            lsn,
            source,
        };
        let mut hb = [0u8; GROUP_HEADER_SIZE];
        let file: &dyn FsFile = self.blocks[&(lsn / self.block_size)].as_ref();
        file.read_exact_at(&mut hb, off).ctx(&path, "read")?;
        let h = GroupHeader::decode(&hb).map_err(corrupt)?;
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
        let path = self.block_path(id);
        let file = self.blocks[&id].clone();
        let header = self.read_block_header(&path, file.as_ref(), id)?;
        let mut chain = header.start_chain();
        // Headers alone carry the chain: one small read per group, and damage in a body
        // before `lsn` does not stop a read from `lsn`.
        while chain.end_lsn < lsn {
            chain = self.read_header(chain.end_lsn)?.chain_after();
        }
        if chain.end_lsn != lsn {
            return Err(StorageError::NotAGroupBoundary { lsn });
        }
        Ok(chain)
    }

    /// Reads whole groups from `lsn` (a group boundary) up to about `max_bytes` (at least
    /// one group when any exist) and returns them with the chain they continue.
    pub fn read_range(&self, lsn: Lsn, max_bytes: usize) -> Result<(ChainPoint, Vec<u8>)> {
        let chain = self.chain_at(lsn)?;
        let mut out = Vec::new();
        let mut next = lsn;
        // A group past the limit is not read at all, header included: a replica under
        // repair serves a copy of a range that ends where its own damage starts, and
        // reading on into the damage would fail the whole read (the simulator's seed 5084
        // with --double-damage: two replicas, each waiting on the other's copy).
        while next < self.chain.end_lsn && (out.is_empty() || out.len() < max_bytes) {
            let h = self.read_header(next)?;
            if !out.is_empty() && out.len() + h.total_len() as usize > max_bytes {
                break;
            }
            let body = self.read_body(&h)?;
            out.extend_from_slice(&h.encode());
            out.extend_from_slice(&body);
            next = h.end_lsn();
        }
        Ok((chain, out))
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
