//! Access modes and mirrors (PALF section 5.2). The access mode is part of the config and
//! is switched like a membership change ([`Replica::change_access_mode`]). In
//! [`AccessMode::RawWrite`] the group is a mirror: appends are refused and the leader
//! takes whole groups another log committed ([`Replica::mirror`]), at the same LSN with
//! the same entries and CSNs, re-sealed under its own proposal id.

use crate::format::entry;
use crate::format::group::{
    block_remaining, decode_group, encode_padding, fits_in_block, seal_group, SealParams,
    FLAG_MIRRORED,
};
use crate::format::meta::{AccessMode, ConfigVersion, NodeId};
use crate::Lsn;

use super::append::PendingGroup;
use super::{AppendError, ChangeError, Nanos, Replica, Ticket};

/// The text of a refusal by access mode; the runtime's error already says what was
/// refused ("append refused: ...", "mirror write refused: ...").
pub(super) fn access_mode_refusal(what: &str, mode: AccessMode, switching: bool) -> String {
    if switching {
        format!(
            "the group's access mode is being switched to {}: no {what} until a majority holds it",
            mode.name()
        )
    } else {
        let takes = match mode {
            AccessMode::Append => "a primary takes no mirror writes",
            AccessMode::RawWrite => "a mirror takes no appends",
        };
        format!("the group's access mode is {}: {takes}", mode.name())
    }
}

/// Why a [`Replica::mirror`] was refused. Nothing was written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MirrorError {
    /// Not the serving leader; `leader` is a hint.
    #[error("not the leader ({})", crate::LeaderHint(*.leader))]
    NotLeader {
        /// The leader this replica follows, if any.
        leader: Option<NodeId>,
    },
    /// Leadership is being transferred.
    #[error("leader transfer in progress")]
    Transferring,
    /// The window of uncommitted log is full; retry after results arrive.
    #[error("replication window full")]
    WindowFull,
    /// The replica has halted.
    #[error("replica halted: {0}")]
    Halted(&'static str),
    /// The group's access mode is not [`AccessMode::RawWrite`] (or a switch is under way).
    #[error("{}", access_mode_refusal("mirror writes", *.mode, *.switching))]
    AccessMode {
        /// The mode of the group's config.
        mode: AccessMode,
        /// A switch to `mode` is not yet accepted by a majority.
        switching: bool,
    },
    /// The group does not start where this log ends: mirror from `expected`.
    #[error("the mirrored group is at LSN {found}, but this log ends at {expected}")]
    Lsn {
        /// This log's end: where the next mirrored group must start.
        expected: Lsn,
        /// The group's LSN.
        found: Lsn,
    },
    /// The bytes are not one whole, valid group that can continue this log.
    #[error("mirrored group refused: {0}")]
    Invalid(String),
}

impl From<AppendError> for MirrorError {
    fn from(e: AppendError) -> Self {
        match e {
            AppendError::NotLeader { leader } => MirrorError::NotLeader { leader },
            AppendError::Transferring => MirrorError::Transferring,
            AppendError::WindowFull => MirrorError::WindowFull,
            AppendError::Halted(w) => MirrorError::Halted(w),
            AppendError::AccessMode { mode, switching } => {
                MirrorError::AccessMode { mode, switching }
            }
            AppendError::TooLarge { len, max } => {
                MirrorError::Invalid(format!("group of {len} bytes exceeds the limit of {max}"))
            }
        }
    }
}

impl Replica {
    /// The access mode of this replica's config (the mode in force once the config is
    /// accepted by a majority).
    pub fn access_mode(&self) -> AccessMode {
        self.meta_want.membership.access_mode
    }

    /// Mirrors one group another log committed (PALF section 5.2, `mirror`): `group` is
    /// the whole group as that log stores it, header included, and must start at this
    /// log's end. Taken only by the serving leader of a group in [`AccessMode::RawWrite`].
    ///
    /// The group keeps its LSN, length, entries, CSNs and sequence number; the leader
    /// re-seals it under its own proposal id and committed end with [`FLAG_MIRRORED`]
    /// and replicates it like any group. The ticket's id gets one [`Action::Result`] (its
    /// `lsn` the group's, its `csn` the group's last); [`Outcome::Failed`] means this
    /// copy did not commit — a later leader may hold the same group re-sealed, so a
    /// mirroring process resumes from the group's committed end, not from the result.
    ///
    /// [`Action::Result`]: super::Action::Result
    /// [`Outcome::Failed`]: super::Outcome::Failed
    pub fn mirror(&mut self, now: Nanos, group: &[u8]) -> Result<Ticket, MirrorError> {
        self.check_invariants();
        self.abandon_lane();
        self.now = self.now.max(now);
        if self.halted.is_some() {
            return Err(MirrorError::Halted("halted"));
        }
        self.check_serving()?;
        self.check_mode(AccessMode::RawWrite)?;
        let invalid = |s: String| Err(MirrorError::Invalid(s));
        let (h, body) = match decode_group(group) {
            Ok(g) => g,
            Err(e) => return invalid(e.to_string()),
        };
        if group.len() as u64 != h.total_len() {
            return invalid(format!(
                "{} bytes after the group at LSN {}: mirror one group at a time",
                group.len() as u64 - h.total_len(),
                h.lsn
            ));
        }
        let chain = self.log.chain;
        if h.lsn != chain.end_lsn {
            return Err(MirrorError::Lsn {
                expected: chain.end_lsn,
                found: h.lsn,
            });
        }
        if h.group_seq != chain.next_group_seq {
            return invalid(format!(
                "group {} at LSN {}, but this log's next group is {}: the logs differ",
                h.group_seq, h.lsn, chain.next_group_seq
            ));
        }
        let bs = self.cfg.block_size;
        let total = h.total_len();
        if h.is_padding() {
            if total != block_remaining(h.lsn, bs) {
                return invalid(format!(
                    "padding of {total} bytes at LSN {}, where this log's block has {} \
                     left: the logs' block sizes differ",
                    h.lsn,
                    block_remaining(h.lsn, bs)
                ));
            }
        } else if !fits_in_block(h.lsn, total, bs) {
            return invalid(format!(
                "a group of {total} bytes at LSN {} does not fit this log's block of {bs} \
                 bytes: the logs' block sizes differ",
                h.lsn
            ));
        }
        if !h.is_padding() && total as usize > self.cfg.max_group_bytes {
            return invalid(format!(
                "a group of {total} bytes exceeds this group's limit of {}",
                self.cfg.max_group_bytes
            ));
        }
        let first_csn = entry::EntryIter::new(body)
            .next()
            .and_then(|e| e.ok())
            .map(|e| e.csn);
        let csn_ok = match first_csn {
            Some(csn) => csn > chain.max_csn,
            None => h.max_csn == chain.max_csn,
        };
        if !csn_ok {
            return invalid(format!(
                "the group at LSN {} does not continue this log's CSNs (last {})",
                h.lsn, chain.max_csn
            ));
        }
        // The log a new leader inherited commits only with the first group it mirrors, so
        // that group is taken even when the inherited log fills the window.
        let first = self
            .leading
            .as_ref()
            .is_some_and(|l| l.start_working_end > self.log.end());
        if !first && self.log.end() + total - self.log.committed > self.cfg.window_bytes {
            return Err(MirrorError::WindowFull);
        }
        self.freeze();
        let pid = self.leading.as_ref().expect("a serving leader").pid;
        let committed = self.published().min(chain.end_lsn);
        let (nh, buf) = if h.is_padding() {
            let mut buf = Vec::new();
            let nh = encode_padding(&mut buf, &chain, pid, committed, total);
            (nh, buf)
        } else {
            let mut buf = group.to_vec();
            let nh = seal_group(
                &mut buf,
                &chain,
                SealParams {
                    proposal_id: pid,
                    committed_end_lsn: committed,
                    flags: h.flags | FLAG_MIRRORED,
                },
                h.entry_count,
                h.max_csn,
            );
            (nh, buf)
        };
        let id = self.next_ticket;
        self.next_ticket += 1;
        let pg = PendingGroup {
            lsn: nh.lsn,
            pid,
            acc: nh.acc_crc,
            records: vec![(id, nh.lsn, nh.max_csn)],
        };
        let at = self.pending.partition_point(|g| g.lsn <= pg.lsn);
        self.pending.insert(at, pg);
        self.write_group(&nh, buf);
        self.broadcast(false);
        Ok(Ticket {
            id,
            lsn: nh.lsn,
            csn: nh.max_csn,
        })
    }

    /// Switches the group's access mode (PALF section 5.2: failover makes a mirror a
    /// primary, switchover a primary a mirror). The mode is part of the config, so the
    /// switch is a config change: refused like [`Replica::change_membership`] while
    /// another is under way, guarded by a log barrier at the current end, and in force
    /// once a majority accepts it ([`Action::ConfigCommitted`]); until then neither
    /// appends nor mirror writes are taken. Asking for the mode in force changes nothing
    /// and returns the current version.
    ///
    /// [`Action::ConfigCommitted`]: super::Action::ConfigCommitted
    pub fn change_access_mode(
        &mut self,
        now: Nanos,
        mode: AccessMode,
    ) -> Result<ConfigVersion, ChangeError> {
        self.abandon_lane();
        self.now = self.now.max(now);
        let cur = self.meta_want.membership.clone();
        let Some(l) = &self.leading else {
            return Err(ChangeError::NotLeader);
        };
        if !l.serving || self.storage_failed {
            return Err(ChangeError::NotLeader);
        }
        if !l.config_committed || l.replace_then_remove.is_some() {
            return Err(ChangeError::InProgress);
        }
        if cur.access_mode == mode {
            return Ok(cur.version);
        }
        if mode == AccessMode::RawWrite {
            // A mirror's log continues another log from its barrier, so the barrier must
            // be committed: a log a crash could still cut short would leave the mirror
            // holding its own uncommitted groups past it, which no primary has.
            self.freeze();
            let (committed, end) = (self.log.committed, self.log.end());
            if committed < end {
                return Err(ChangeError::Uncommitted { committed, end });
            }
        }
        let mut new = cur;
        new.access_mode = mode;
        Ok(self.propose_config(new, None))
    }
}
