//! Scrubbing sealed blocks: finding bytes that went bad at rest in the blocks before the
//! tail, which opening does not scan (module docs of [`crate::log`], "Recovery").
//!
//! A block below the tail was synced whole before the next one was created and is never
//! appended to again, so every group in it must verify: its header, its place in the
//! checksum chain that starts at the block header, and its body. The first group that
//! does not is damage, never a torn write. It is reported as a [`Damage`] whose range
//! ends at the next group that verifies in the block (or at the block's end when none
//! does), and [`LogStorage::note_damage`] hands it to the same protocol-aware repair as
//! damage found at open (Alagappan et al., FAST 2018): the replica stops voting and
//! acknowledging, fetches the range from a peer, and [`LogStorage::repair`] writes the
//! copy in place once it continues the chain on both sides.
//!
//! A scrub reads through a [`SealedBlock`] taken under the caller's lock and released
//! before reading, so appends are not held up while a block of up to 4 GiB is read.

use std::path::PathBuf;
use std::sync::Arc;

use chorus_core::format::block::BLOCK_HEADER_SIZE;
use chorus_core::format::group::{ChainPoint, GroupHeader, GROUP_HEADER_SIZE};

use super::{check_group, find_valid_header, read_block_data, Damage, LogStorage};
use crate::error::{IoContext, Result};
use crate::fs::FsFile;

/// A block below the tail, to be verified without holding the log (see the module docs).
#[derive(Clone, Debug)]
pub struct SealedBlock {
    /// The block's id.
    pub id: u64,
    /// Its file.
    pub path: PathBuf,
    /// The open handle, shared with the log (a trim or rebase that drops the block
    /// leaves this one readable; [`LogStorage::note_damage`] then ignores what it found).
    file: Arc<dyn FsFile>,
    block_size: u64,
    log_id: u64,
}

impl SealedBlock {
    /// Reads the block and checks every group in it (header, chain and body). Returns the
    /// first damaged stretch, or `None` when the block verifies to its end. A header that
    /// does not decode, or names another block, is an error, as at open.
    pub fn verify(&self) -> Result<Option<Damage>> {
        let mut hb = vec![0u8; BLOCK_HEADER_SIZE];
        let n = self
            .file
            .read_at(&mut hb, 0)
            .ctx(&self.path, "read block header")?;
        let header = LogStorage::check_block_header(
            &self.path,
            &hb[..n],
            self.id,
            self.block_size,
            self.log_id,
        )?;
        let data = read_block_data(self.file.as_ref(), &self.path, self.block_size as usize)?;
        let start = header.start_lsn();
        let end = start + self.block_size;
        let mut chain = header.start_chain();
        while chain.end_lsn < end {
            let off = (chain.end_lsn - start) as usize;
            let e = match check_group(
                data.get(off..).unwrap_or(&[]),
                &chain,
                self.block_size,
                true,
            ) {
                Ok(g) => {
                    chain = g.chain_after();
                    continue;
                }
                Err(e) => e,
            };
            // The next group that verifies whole after the bad place, in this block; none:
            // the damage runs to the block's end (the next block's header carries the
            // chain on).
            let mut from = off as u64 + 1;
            let next_valid = loop {
                match find_valid_header(&data, from, start) {
                    Some(p) => {
                        let h = GroupHeader::decode(&data[p as usize..]).expect("found valid");
                        let body = data
                            .get(p as usize + GROUP_HEADER_SIZE..(p + h.total_len()) as usize)
                            .unwrap_or(&[]);
                        if h.verify_body(body).is_ok() {
                            break start + p;
                        }
                        from = p + 1;
                    }
                    None => break end,
                }
            };
            return Ok(Some(Damage {
                lsn: chain.end_lsn,
                next_valid,
                path: self.path.clone(),
                file_offset: BLOCK_HEADER_SIZE as u64 + off as u64,
                detail: e.to_string(),
            }));
        }
        Ok(None)
    }
}

impl LogStorage {
    /// The ids of the blocks below the tail (every block but the last), oldest first.
    pub fn sealed_block_ids(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self.blocks.keys().copied().collect();
        ids.pop();
        ids
    }

    /// A handle to verify sealed block `id` without holding the log ([`SealedBlock`]);
    /// `None` if it is the tail or not (any longer) in the log.
    pub fn sealed_block(&self, id: u64) -> Option<SealedBlock> {
        let (&tail, _) = self.blocks.last_key_value()?;
        if id >= tail {
            return None;
        }
        Some(SealedBlock {
            id,
            path: self.block_path(id),
            file: self.blocks.get(&id)?.clone(),
            block_size: self.block_size,
            log_id: self.log_id,
        })
    }

    /// Takes damage a scrub found in `block` ([`SealedBlock::verify`]) for repair: the
    /// replica is then rebuilt in repair mode from [`LogStorage::damaged`], as after
    /// damage found at open. False (nothing noted) when the block is no longer the one
    /// read (trimmed or replaced by a rebase since), when it is the tail, or when the
    /// range is already noted.
    pub fn note_damage(&mut self, block: &SealedBlock, d: Damage) -> bool {
        let same = self
            .blocks
            .get(&block.id)
            .is_some_and(|f| Arc::ptr_eq(f, &block.file));
        let tail = self.blocks.keys().next_back().copied();
        if !same || tail.is_none_or(|t| block.id >= t) || d.lsn < self.start_lsn {
            return false;
        }
        if self.damaged.iter().any(|x| x.lsn == d.lsn) {
            return false;
        }
        let at = self.damaged.partition_point(|x| x.lsn < d.lsn);
        self.damaged.insert(at, d);
        true
    }

    /// The chain point at the start of block `id` (from its header), for a repair copy
    /// that ends at that block's start.
    pub(super) fn block_start_chain(&self, id: u64) -> Result<ChainPoint> {
        let path = self.block_path(id);
        let file =
            self.blocks
                .get(&id)
                .cloned()
                .ok_or_else(|| crate::StorageError::InvalidAppend {
                    lsn: id * self.block_size,
                    detail: format!("block {id} is not in the log"),
                })?;
        Ok(self
            .read_block_header(&path, file.as_ref(), id)?
            .start_chain())
    }
}
