//! Appends: records go into an open group at the log tail under a reference CSN (PALF
//! section 4.2: a record's CSN is at least its reference and grows with the LSN), and the
//! group is sealed and replicated when full, when the IO worker is idle, or at the freeze
//! interval (adaptive group replication, PALF section 6). A lane reserves the tail for
//! lock-free appends the driver fills itself (PALF section 6). Only the serving leader
//! takes appends, outside a transfer and while its config's access mode is Append.

use crate::format::entry;
use crate::format::group::{block_remaining, fits_in_block, GROUP_HEADER_SIZE};
use crate::format::meta::{AccessMode, NodeId};
use crate::{Csn, Lsn};

use super::mirror::access_mode_refusal;
use super::{Nanos, Replica, Ticket};

/// Why an append was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AppendError {
    /// Not the serving leader; `leader` is a hint.
    #[error("not the leader ({})", crate::LeaderHint(*.leader))]
    NotLeader {
        /// The leader this replica follows, if any.
        leader: Option<NodeId>,
    },
    /// The window of uncommitted log is full; retry after results arrive.
    #[error("replication window full")]
    WindowFull,
    /// Leadership is being transferred.
    #[error("leader transfer in progress")]
    Transferring,
    /// The record exceeds the largest record or group size.
    #[error("record of {len} bytes exceeds the limit of {max}")]
    TooLarge {
        /// Record length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The replica has halted.
    #[error("replica halted: {0}")]
    Halted(&'static str),
    /// The group's access mode is not [`AccessMode::Append`] (it is a mirror, or a switch
    /// is under way): appends are refused.
    #[error("{}", access_mode_refusal("appends", *.mode, *.switching))]
    AccessMode {
        /// The mode of the group's config.
        mode: AccessMode,
        /// A switch to `mode` is not yet accepted by a majority.
        switching: bool,
    },
}

/// The log tail reserved for lock-free appends (PALF section 6).
///
/// The driver opens a lane with [`Replica::open_lane`]; appenders then take their LSN and
/// CSN with an atomic compare-and-swap on the driver's side and copy their entries into
/// the group body at that offset with no lock and no call into the replica; the driver
/// hands the filled body back with [`Replica::close_lane`], and the replica seals and
/// replicates it as one group. While a lane is open the replica writes nothing else, so
/// the driver must close it before any other input: an input that finds a lane open
/// abandons it (counted as a drop), and its entries then fail — they were never written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lane {
    /// LSN of the group the entries form; the first entry is at `lsn + GROUP_HEADER_SIZE`.
    pub lsn: Lsn,
    /// Proposal id of the leader that opened it.
    pub pid: u64,
    /// Most bytes of entries (headers included) the group body may hold.
    pub capacity: usize,
    /// Largest record one entry may carry.
    pub max_record: usize,
    /// CSN of the last record before the lane: the entries' CSNs must exceed it and grow.
    pub last_csn: Csn,
    /// When it was opened (the group's age for the freeze interval).
    pub opened: Nanos,
}

/// A sealed group of this replica waiting for its result.
#[derive(Clone, Debug)]
pub(super) struct PendingGroup {
    /// Where it starts.
    pub(super) lsn: Lsn,
    /// The proposal id it was sealed under.
    pub(super) pid: u64,
    /// The accumulated checksum after it: with the LSN and proposal id, what the
    /// committed log must hold for it to be committed.
    pub(super) acc: u32,
    /// Its records: ticket id, LSN and CSN of each.
    pub(super) records: Vec<(u64, Lsn, Csn)>,
}

/// The group a leader is filling at its log end.
#[derive(Debug)]
pub(super) struct OpenGroup {
    /// Where it starts: the log end.
    pub(super) lsn: Lsn,
    /// Room for the header, then the entries.
    pub(super) buf: Vec<u8>,
    /// Entries in it.
    pub(super) entries: u32,
    /// The last entry's CSN.
    pub(super) max_csn: Csn,
    /// Its records: ticket id, LSN and CSN of each.
    pub(super) records: Vec<(u64, Lsn, Csn)>,
    /// When it was opened: it is sealed a freeze interval later at the latest.
    pub(super) opened: Nanos,
}

impl Replica {
    /// Appends a record with reference CSN `ref_csn` (PALF section 4.2: the record's CSN is
    /// at least `ref_csn` and grows with the LSN). Only the serving leader accepts.
    pub fn append(&mut self, now: Nanos, data: &[u8], ref_csn: Csn) -> Result<Ticket, AppendError> {
        self.check_invariants();
        self.abandon_lane();
        self.now = self.now.max(now);
        if self.halted.is_some() {
            return Err(AppendError::Halted("halted"));
        }
        let max_record = (self.cfg.max_group_bytes - GROUP_HEADER_SIZE - entry::ENTRY_HEADER_SIZE)
            .min(entry::MAX_RECORD_BYTES as usize)
            .min(self.cfg.block_size as usize - GROUP_HEADER_SIZE - entry::ENTRY_HEADER_SIZE);
        self.check_serving()?;
        self.check_mode(AccessMode::Append)?;
        let l = self.leading.as_ref().expect("a serving leader");
        if data.len() > max_record {
            return Err(AppendError::TooLarge {
                len: data.len(),
                max: max_record,
            });
        }
        let open_len = l.open.as_ref().map_or(0, |o| o.buf.len() as u64);
        if self.log.end() + open_len - self.log.committed > self.cfg.window_bytes {
            return Err(AppendError::WindowFull);
        }
        let esz = entry::entry_size(data.len());
        let bs = self.cfg.block_size;
        let max_group = self.cfg.max_group_bytes;
        if let Some(o) = &l.open {
            let len = o.buf.len() + esz;
            if len > max_group || !fits_in_block(o.lsn, len as u64, bs) {
                self.freeze();
            }
        }
        if self.leading.as_ref().is_some_and(|l| l.open.is_none()) {
            if !fits_in_block(self.log.end(), (GROUP_HEADER_SIZE + esz) as u64, bs) {
                self.write_padding();
            }
            let lsn = self.log.end();
            let now = self.now;
            self.leading.as_mut().expect("leading").open = Some(OpenGroup {
                lsn,
                buf: vec![0u8; GROUP_HEADER_SIZE],
                entries: 0,
                max_csn: 0,
                records: Vec::new(),
                opened: now,
            });
        }
        let csn = (self.last_csn + 1).max(ref_csn);
        self.last_csn = csn;
        let id = self.next_ticket;
        self.next_ticket += 1;
        let io_idle = self.log.flushed == self.log.end();
        let threshold = self.cfg.group_factor_threshold;
        let o = self
            .leading
            .as_mut()
            .and_then(|l| l.open.as_mut())
            .expect("open group");
        let lsn = o.lsn + o.buf.len() as u64;
        entry::encode_entry(&mut o.buf, csn, data);
        o.entries += 1;
        o.max_csn = csn;
        o.records.push((id, lsn, csn));
        if io_idle && o.entries < threshold {
            self.freeze();
        }
        Ok(Ticket { id, lsn, csn })
    }

    /// Opens a [`Lane`]: reserves the log tail for one group of lock-free appends. Refused
    /// like [`Replica::append`] (not the serving leader, transferring, window full,
    /// halted). Any open group of slow-path appends is frozen first; a block tail too
    /// small for a useful group is padded.
    pub fn open_lane(&mut self, now: Nanos) -> Result<Lane, AppendError> {
        self.now = self.now.max(now);
        if let Some(l) = self.lane {
            return Ok(l);
        }
        if self.halted.is_some() {
            return Err(AppendError::Halted("halted"));
        }
        self.check_serving()?;
        self.check_mode(AccessMode::Append)?;
        self.freeze();
        if let Some(l) = &mut self.leading {
            if l.open.as_ref().is_some_and(|o| o.entries == 0) {
                l.open = None;
            }
        }
        let bs = self.cfg.block_size;
        let want = self.cfg.max_group_bytes.min(64 << 10) as u64;
        if block_remaining(self.log.end(), bs) < 2 * GROUP_HEADER_SIZE as u64 + want {
            self.write_padding();
        }
        let end = self.log.end();
        let inflight = end - self.log.committed;
        let window_left = self.cfg.window_bytes.saturating_sub(inflight) as usize;
        // A group never straddles a block: its length plus a header's worth must fit
        // (fits_in_block), so the body gets what is left after two headers.
        let rem = block_remaining(end, bs) as usize;
        let group = self
            .cfg
            .max_group_bytes
            .min(rem - GROUP_HEADER_SIZE)
            .min(window_left);
        if group < GROUP_HEADER_SIZE + entry::entry_size(1) {
            return Err(AppendError::WindowFull);
        }
        let capacity = group - GROUP_HEADER_SIZE;
        let max_record =
            (capacity - entry::ENTRY_HEADER_SIZE).min(entry::MAX_RECORD_BYTES as usize);
        let lane = Lane {
            lsn: end,
            pid: self.leading.as_ref().expect("leading").pid,
            capacity,
            max_record,
            last_csn: self.last_csn,
            opened: self.now,
        };
        self.lane = Some(lane);
        Ok(lane)
    }

    /// Closes the open lane with the entries appended into it: `body` holds `records`
    /// entries back to back (`(lsn, csn)` of each, in order). On success they become one
    /// group, sealed and replicated like any other, and the result is the ticket id of the
    /// first record (the others follow consecutively); their results arrive as
    /// [`Action::Result`]. If the lane was abandoned, or leadership changed since it
    /// opened, nothing is written and the records have failed.
    ///
    /// [`Action::Result`]: super::Action::Result
    pub fn close_lane(
        &mut self,
        now: Nanos,
        lane: &Lane,
        body: Vec<u8>,
        records: &[(Lsn, Csn)],
    ) -> Result<u64, AppendError> {
        self.now = self.now.max(now);
        let open = self.lane.take();
        if open != Some(*lane) {
            return Err(AppendError::NotLeader { leader: None });
        }
        let valid = self.halted.is_none()
            && !self.storage_failed
            && self.log.end() == lane.lsn
            && self
                .leading
                .as_ref()
                .is_some_and(|l| l.pid == lane.pid && l.serving && l.open.is_none());
        if !valid {
            return Err(AppendError::NotLeader {
                leader: self.leader,
            });
        }
        let first = self.next_ticket;
        if records.is_empty() {
            return Ok(first);
        }
        // The runtime built the body; check it is exactly what it says before it becomes
        // part of the log (a bug here must not become a bad group).
        let mut prev_csn = lane.last_csn;
        let mut n = 0usize;
        let mut ok = body.len() <= lane.capacity;
        for e in entry::EntryIter::new(&body) {
            let Ok(e) = e else {
                ok = false;
                break;
            };
            let lsn = lane.lsn + GROUP_HEADER_SIZE as u64 + e.offset as u64;
            if records.get(n) != Some(&(lsn, e.csn)) || e.csn <= prev_csn {
                ok = false;
                break;
            }
            prev_csn = e.csn;
            n += 1;
        }
        if !ok || n != records.len() {
            self.drop_input(None, "lane body does not match its records");
            return Err(AppendError::Halted("lane body does not match its records"));
        }
        let mut buf = Vec::with_capacity(GROUP_HEADER_SIZE + body.len());
        buf.resize(GROUP_HEADER_SIZE, 0);
        buf.extend_from_slice(&body);
        let ids: Vec<(u64, Lsn, Csn)> = records
            .iter()
            .enumerate()
            .map(|(i, (lsn, csn))| (first + i as u64, *lsn, *csn))
            .collect();
        self.next_ticket += records.len() as u64;
        self.last_csn = self.last_csn.max(prev_csn);
        self.leading.as_mut().expect("leading").open = Some(OpenGroup {
            lsn: lane.lsn,
            buf,
            entries: records.len() as u32,
            max_csn: prev_csn,
            records: ids,
            opened: lane.opened,
        });
        self.freeze();
        Ok(first)
    }

    /// Appends are accepted only by the serving leader, outside a leader transfer.
    pub(super) fn check_serving(&self) -> Result<(), AppendError> {
        let Some(l) = &self.leading else {
            return Err(AppendError::NotLeader {
                leader: self.leader,
            });
        };
        if !l.serving || self.storage_failed {
            return Err(AppendError::NotLeader { leader: None });
        }
        if l.transfer.is_some() {
            return Err(AppendError::Transferring);
        }
        Ok(())
    }

    /// Writes of the `want` access mode are taken only while it is the mode in force: the
    /// mode of the leader's config, accepted by a majority. A new leader takes none until
    /// its re-stamped config is accepted (PALF's StartWorking is a config entry for the
    /// same reason): a minority may hold a switch no majority accepted, and had the leader
    /// written under its own mode meanwhile, such a replica could later lead with the
    /// other mode over a log it wrote. Until then it answers like a leader not yet
    /// serving.
    pub(super) fn check_mode(&self, want: AccessMode) -> Result<(), AppendError> {
        let mode = self.meta_want.membership.access_mode;
        let l = self.leading.as_ref().expect("a serving leader");
        let Some(committed) = l.committed_mode else {
            return Err(AppendError::NotLeader {
                leader: Some(self.cfg.id),
            });
        };
        if mode == want && committed == mode {
            return Ok(());
        }
        Err(AppendError::AccessMode {
            mode,
            switching: committed != mode,
        })
    }

    /// Whether this replica is the serving leader and takes the writes of its config's
    /// access mode (its config is accepted by a majority).
    pub fn takes_writes(&self) -> bool {
        self.leading.as_ref().is_some_and(|l| {
            l.serving
                && !self.storage_failed
                && l.committed_mode == Some(self.meta_want.membership.access_mode)
        })
    }

    /// The open lane, if any.
    pub fn lane(&self) -> Option<&Lane> {
        self.lane.as_ref()
    }

    /// Any input other than the lane calls finds the lane closed; if the driver forgot,
    /// the lane is abandoned (its appends fail, never written).
    pub(super) fn abandon_lane(&mut self) {
        if self.lane.take().is_some() {
            self.drop_input(None, "lane abandoned: input while a lane was open");
        }
    }
}
