//! The leader: pipelined replication with a bounded window (PALF section 3.4), each
//! follower's progress, adaptive group replication (an open group is sealed when the IO
//! worker is idle or the freeze interval passes, PALF section 6), heartbeats carrying the
//! commit point (the piggyback paper's section 4; commit-only groups in the SYNC and ASYNC
//! baselines), resends after silence or on time (TCP's tail loss probe) and catch-up from
//! storage, and the leader lease that keeps it serving.

use std::collections::{BTreeMap, VecDeque};

use crate::format::group::{
    block_remaining, encode_padding, fits_in_block, seal_group, SealParams, GROUP_HEADER_SIZE,
};
use crate::format::meta::{AccessMode, ConfigVersion, Membership, NodeId};
use crate::rtt::RttWindow;
use crate::Lsn;

use super::append::{OpenGroup, PendingGroup};
use super::{Action, CommitMode, LogPos, Message, Nanos, ReadPurpose, Replica};

/// What a leader knows of one follower's log.
#[derive(Clone, Debug)]
pub(super) struct Progress {
    /// The end of its log known to match ours, durably: within our log.
    pub(super) matched: Lsn,
    /// Where replication to it continues.
    pub(super) next: Lsn,
    /// When `matched` last moved (or a resend after silence started).
    last_progress: Nanos,
    /// A storage read for its catch-up is under way: nothing else is sent until it is
    /// back.
    pub(super) read_pending: bool,
    /// The newest config version it acknowledged.
    pub(super) config_version: ConfigVersion,
    /// What was sent past `matched`, in order: each message's end, when it left, and
    /// whether it was the first copy of those bytes (only those give round trips, Karn's
    /// rule). A rewind leaves one entry, not first, for everything resent
    /// ([`ReplicaConfig::timed_resend`]).
    ///
    /// [`ReplicaConfig::timed_resend`]: super::ReplicaConfig::timed_resend
    sent: VecDeque<(Lsn, Nanos, bool)>,
    /// The furthest end ever sent to it.
    sent_max: Lsn,
    /// Its recent acknowledgement round trips.
    rtt: RttWindow,
    /// Timed resends since it last acknowledged anything new: each doubles the wait for
    /// the next (a follower that is down or cut off is not sent its log over and over).
    timed: u32,
}

impl Progress {
    pub(super) fn new(end: Lsn, now: Nanos) -> Self {
        Self {
            matched: 0,
            next: end,
            last_progress: now,
            read_pending: false,
            config_version: ConfigVersion::default(),
            sent: VecDeque::new(),
            sent_max: end,
            rtt: RttWindow::default(),
            timed: 0,
        }
    }

    /// A message ending at `next` left now.
    pub(super) fn sent_upto(&mut self, next: Lsn, now: Nanos) {
        self.next = next;
        if next > self.sent_max {
            self.sent_max = next;
            self.sent.push_back((next, now, true));
        }
    }

    /// Sending starts again from `from` (a resend): what was in flight is resent now.
    fn rewind(&mut self, from: Lsn, now: Nanos) {
        self.next = from;
        self.sent.clear();
        if self.sent_max > from {
            self.sent.push_back((self.sent_max, now, false));
        }
    }

    /// When its oldest unacknowledged message is due to be sent again on time
    /// ([`ReplicaConfig::timed_resend`]): `factor` times its median round trip after a
    /// first copy left; after a resent one twice that, doubled again for each timed
    /// resend it went without acknowledging anything (up to 1024 times). `None` while
    /// nothing is due: no timeout measured yet, a read of the log pending, or nothing
    /// past its match.
    ///
    /// [`ReplicaConfig::timed_resend`]: super::ReplicaConfig::timed_resend
    pub(super) fn timed_due(&self, factor: u32, end: Lsn) -> Option<Nanos> {
        let after = self.rtt.timeout(factor)?;
        if self.read_pending || self.matched >= end {
            return None;
        }
        self.sent.front().map(|&(_, at, first)| {
            let wait = if first {
                after
            } else {
                after.saturating_mul(1 << (self.timed + 1).min(10))
            };
            at.saturating_add(wait)
        })
    }

    /// Its oldest unacknowledged message goes again now: it counts as resent (no round
    /// trip from it, Karn's rule). Returns its end.
    fn resend_front(&mut self, now: Nanos) -> Option<Lsn> {
        let f = self.sent.front_mut()?;
        f.1 = now;
        f.2 = false;
        self.timed = self.timed.saturating_add(1);
        Some(f.0)
    }

    /// It acknowledged everything below `matched`: a round trip from the latest first
    /// copy that answer covers.
    fn acked_upto(&mut self, matched: Lsn, now: Nanos) {
        let mut latest = None;
        self.timed = 0;
        while let Some(&(end, at, first)) = self.sent.front() {
            if end > matched {
                break;
            }
            self.sent.pop_front();
            latest = first.then_some(at);
        }
        if let Some(at) = latest {
            self.rtt.sample(now.saturating_sub(at));
        }
    }
}

/// A leader's state, from its StartWorking group on.
#[derive(Debug)]
pub(super) struct Leading {
    /// The proposal id it leads under.
    pub(super) pid: u64,
    /// Each other member's progress (voters and learners, and during a change those of
    /// the previous config too).
    pub(super) progress: BTreeMap<NodeId, Progress>,
    /// The end of the StartWorking group (of the first mirrored group, for a mirror):
    /// nothing commits by counting before the commit point reaches it.
    pub(super) start_working_end: Lsn,
    /// Taking appends: StartWorking is committed (a mirror: reconfirmed).
    pub(super) serving: bool,
    /// The newest timestamp each voter echoed: the leader's lease.
    pub(super) lease_acks: BTreeMap<NodeId, Nanos>,
    /// The group being filled at the log end, not yet sealed.
    pub(super) open: Option<OpenGroup>,
    /// When heartbeats last went out.
    pub(super) last_heartbeat: Nanos,
    /// A leader transfer under way: the target, and when it is given up.
    pub(super) transfer: Option<(NodeId, Nanos)>,
    /// The config before the change under way, until the change is accepted: commits
    /// count a majority of its voters too.
    pub(super) prev_config: Option<Membership>,
    /// The current config is accepted by a majority.
    pub(super) config_committed: bool,
    /// The access mode of the last config this leader saw accepted by a majority (none
    /// until its re-stamped config is).
    pub(super) committed_mode: Option<AccessMode>,
    /// A replacement under way: the voter to remove once its successor's addition is
    /// accepted.
    pub(super) replace_then_remove: Option<NodeId>,
    /// The commit point published in groups (the SYNC and ASYNC modes): never past the
    /// committed end.
    pub(super) published_commit: Lsn,
    /// The log end after the last commit-only group (or StartWorking).
    pub(super) last_commit_record_end: Lsn,
    /// When the ASYNC mode last considered writing a commit-only group.
    pub(super) last_async: Nanos,
    /// When it began serving: fail-back waits a lease after it.
    pub(super) became_leader: Nanos,
}

impl Replica {
    pub(super) fn leader_tick(&mut self) {
        let now = self.now;
        if !self.lease_valid() {
            self.abandon_campaign();
            return;
        }
        let (hb_due, freeze_due) = {
            let l = self.leading.as_ref().expect("leading");
            (
                now >= l.last_heartbeat + self.cfg.heartbeat_interval,
                l.open
                    .as_ref()
                    .is_some_and(|o| now >= o.opened + self.cfg.freeze_interval),
            )
        };
        if freeze_due || self.log.flushed == self.log.end() {
            self.freeze();
        }
        if let CommitMode::Async { interval } = self.cfg.commit_mode {
            let l = self.leading.as_mut().expect("leading");
            if now >= l.last_async + interval {
                l.last_async = now;
                if self.log.committed > l.last_commit_record_end
                    && self.meta_want.membership.access_mode != AccessMode::RawWrite
                {
                    self.write_commit_record();
                }
            }
        }
        // Resend after silence: messages may have been lost. And on time: a follower's
        // oldest unacknowledged message, sent a few of its round trips ago, goes again
        // (only that message: later ones wait in its buffer for the gap to fill).
        let (resend, pieces) = {
            let factor = self.cfg.timed_resend;
            let l = self.leading.as_mut().expect("leading");
            let end = self.log.end();
            let mut v = Vec::new();
            let mut pieces = Vec::new();
            for (n, p) in l.progress.iter_mut() {
                if p.matched < end && now > p.last_progress + self.cfg.resend_interval {
                    p.rewind(p.matched, now);
                    p.read_pending = false;
                    p.last_progress = now;
                    v.push(*n);
                    continue;
                }
                if p.timed_due(factor, end).is_some_and(|t| now >= t) {
                    if let Some(upto) = p.resend_front(now) {
                        pieces.push((*n, p.matched, upto));
                    }
                }
            }
            (v, pieces)
        };
        for n in resend {
            self.replicate_to(n, false);
        }
        for (n, from, upto) in pieces {
            self.timed_resends += 1;
            self.resend_piece(n, from, upto);
        }
        if hb_due {
            self.leading.as_mut().expect("leading").last_heartbeat = now;
            self.broadcast(true);
        }
        let transfer = self.leading.as_ref().and_then(|l| l.transfer);
        if let Some((_, deadline)) = transfer {
            if now > deadline {
                self.leading.as_mut().expect("leading").transfer = None;
            } else {
                self.check_transfer();
            }
        }
        self.maybe_fail_back();
    }

    fn lease_valid(&self) -> bool {
        let Some(l) = &self.leading else { return false };
        let me = self.cfg.id;
        // The latest time a majority of voters had acknowledged us by: the commit point
        // of their acknowledgement times (our own is now).
        let Some(t) = self.voters_quorum().commit_point(|v| {
            if v == me {
                self.now
            } else {
                l.lease_acks.get(&v).copied().unwrap_or(0)
            }
        }) else {
            return false;
        };
        let margin = self.cfg.lease / 1_000_000 * 2 * self.cfg.max_clock_drift_ppm as u64;
        t + self.cfg.lease.saturating_sub(margin) > self.now
    }

    pub(super) fn published(&self) -> Lsn {
        let l = self.leading.as_ref().expect("leading");
        match self.cfg.commit_mode {
            CommitMode::Piggyback => self.log.committed,
            // A mirror writes no commit-only groups (the LSN space is the primary's).
            _ if self.meta_want.membership.access_mode == AccessMode::RawWrite => {
                self.log.committed
            }
            _ => l.published_commit,
        }
    }

    /// Seals the open group and sends it.
    pub(super) fn freeze(&mut self) {
        let published = match &self.leading {
            Some(l) if l.open.as_ref().is_some_and(|o| o.entries > 0) => self.published(),
            _ => return,
        };
        let l = self.leading.as_mut().expect("leading");
        let mut o = l.open.take().expect("open");
        let pid = l.pid;
        let prev = self.log.chain;
        debug_assert_eq!(o.lsn, prev.end_lsn);
        let h = seal_group(
            &mut o.buf,
            &prev,
            SealParams {
                proposal_id: pid,
                committed_end_lsn: published.min(prev.end_lsn),
                flags: 0,
            },
            o.entries,
            o.max_csn,
        );
        let pg = PendingGroup {
            lsn: h.lsn,
            pid,
            acc: h.acc_crc,
            records: o.records,
        };
        let at = self.pending.partition_point(|g| g.lsn <= pg.lsn);
        self.pending.insert(at, pg);
        self.write_group(&h, o.buf);
        self.broadcast(false);
        self.check_transfer();
    }

    pub(super) fn write_padding(&mut self) {
        let l = self.leading.as_ref().expect("leading");
        let pid = l.pid;
        let published = self.published().min(self.log.end());
        let rem = block_remaining(self.log.end(), self.cfg.block_size);
        let mut buf = Vec::new();
        let h = encode_padding(&mut buf, &self.log.chain, pid, published, rem);
        self.write_group(&h, buf);
    }

    /// An empty group under the leader's pid: StartWorking, or a commit record.
    pub(super) fn write_empty_group(&mut self) {
        self.freeze();
        if !fits_in_block(
            self.log.end(),
            GROUP_HEADER_SIZE as u64,
            self.cfg.block_size,
        ) {
            self.write_padding();
        }
        let pid = self.leading.as_ref().expect("leading").pid;
        let published = self.published().min(self.log.end());
        let mut buf = vec![0u8; GROUP_HEADER_SIZE];
        let prev = self.log.chain;
        let h = seal_group(
            &mut buf,
            &prev,
            SealParams {
                proposal_id: pid,
                committed_end_lsn: published,
                flags: 0,
            },
            0,
            prev.max_csn,
        );
        self.write_group(&h, buf);
        self.broadcast(false);
    }

    /// SYNC and ASYNC modes: persist and send the commit point as a commit-only group.
    pub(super) fn write_commit_record(&mut self) {
        let committed = self.log.committed;
        let l = self.leading.as_mut().expect("leading");
        l.published_commit = committed;
        self.write_empty_group();
        let end = self.log.end();
        self.leading
            .as_mut()
            .expect("leading")
            .last_commit_record_end = end;
    }

    pub(super) fn append_msg(&self, peer: NodeId, prev: LogPos, groups: Vec<u8>) -> Message {
        let l = self.leading.as_ref().expect("leading");
        Message::Append {
            pid: l.pid,
            ts: self.now,
            prev,
            groups,
            leader_end: self.log.end(),
            committed: self.published(),
            config: self.config_offer(peer, l.pid),
        }
    }

    /// Our membership when we lead under `pid` and `peer` has not acknowledged it: sent
    /// with each [`Message::Append`] and [`Message::Rebase`] until it has, since a
    /// follower whose membership predates ours hears us only when a newer membership
    /// names us a voter.
    pub(super) fn config_offer(&self, peer: NodeId, pid: u64) -> Option<Membership> {
        let l = self.leading.as_ref().filter(|l| l.pid == pid)?;
        let m = &self.meta_want.membership;
        l.progress
            .get(&peer)
            .is_some_and(|p| p.config_version < m.version)
            .then(|| m.clone())
    }

    pub(super) fn broadcast(&mut self, heartbeat: bool) {
        let peers: Vec<NodeId> = match &self.leading {
            Some(l) => l.progress.keys().copied().collect(),
            None => return,
        };
        for p in peers {
            self.replicate_to(p, heartbeat);
        }
    }

    /// Sends `peer` the log in `[from, upto)` again (a timed resend) without moving
    /// where its replication continues: a follower that buffered what came after
    /// (reordering) fills its gap and acknowledges all of it. A first copy of a lone
    /// append lost on both links is the same message sent again (TCP's tail loss probe);
    /// a follower that lags behind the commit point gets the piece it lacks, so it can
    /// acknowledge what it holds past it, and the next commit has two followers to count
    /// on, not one. Bytes no longer cached are read from the log by the catch-up path.
    fn resend_piece(&mut self, peer: NodeId, from: Lsn, upto: Lsn) {
        let max = (upto.saturating_sub(from) as usize).min(self.cfg.max_message_bytes);
        let groups = self.log.cached_from(from, max);
        match (self.log.pos_at(from), groups) {
            (Some(prev), Some(groups)) if !groups.is_empty() => {
                let msg = self.append_msg(peer, prev, groups);
                self.send(peer, msg);
            }
            _ => {
                let now = self.now;
                let l = self.leading.as_mut().expect("leading");
                if let Some(p) = l.progress.get_mut(&peer) {
                    p.rewind(p.matched, now);
                }
                self.replicate_to(peer, false);
            }
        }
    }

    fn replicate_to(&mut self, peer: NodeId, heartbeat: bool) {
        let end = self.log.end();
        let Some(l) = &self.leading else { return };
        let Some(p) = l.progress.get(&peer) else {
            return;
        };
        if p.read_pending {
            return;
        }
        let from = p.next.min(end);
        let in_flight = from.saturating_sub(p.matched);
        if !heartbeat && (from == end || in_flight > self.cfg.window_bytes) {
            return;
        }
        let groups = if from == end || in_flight > self.cfg.window_bytes {
            Some(Vec::new())
        } else {
            self.log.cached_from(from, self.cfg.max_message_bytes)
        };
        match (self.log.pos_at(from), groups) {
            (Some(prev), Some(groups)) => {
                let next = from + groups.len() as u64;
                let msg = self.append_msg(peer, prev, groups);
                let l = self.leading.as_mut().expect("leading");
                let now = self.now;
                l.progress
                    .get_mut(&peer)
                    .expect("peer")
                    .sent_upto(next, now);
                self.send(peer, msg);
            }
            _ => {
                let l = self.leading.as_mut().expect("leading");
                l.progress.get_mut(&peer).expect("peer").read_pending = true;
                // Below our log start storage holds nothing: read from the start, and
                // the follower is rebased there (see `log_read`).
                let from = from.max(self.log.start);
                self.actions.push(Action::ReadLog {
                    purpose: ReadPurpose::CatchUp { peer },
                    from,
                    max_bytes: self.cfg.max_message_bytes,
                });
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn on_append_ack(
        &mut self,
        from: NodeId,
        pid: u64,
        ts: Nanos,
        success: bool,
        matched: Lsn,
        hint: Lsn,
        committed: Lsn,
        config_version: ConfigVersion,
    ) {
        self.max_seen_pid = self.max_seen_pid.max(pid);
        let end = self.log.end();
        let Some(l) = &mut self.leading else { return };
        if pid > l.pid {
            self.abandon_campaign();
            return;
        }
        if pid < l.pid {
            self.drop_input(Some(from), "ack for an old proposal id");
            return;
        }
        let Some(p) = l.progress.get_mut(&from) else {
            self.drop_input(Some(from), "ack from a non-member");
            return;
        };
        let e = l.lease_acks.entry(from).or_default();
        *e = (*e).max(ts);
        p.config_version = p.config_version.max(config_version);
        if success {
            let matched = matched.min(end);
            if matched > p.matched {
                p.matched = matched;
                p.last_progress = self.now;
                p.acked_upto(matched, self.now);
            }
            if p.next < p.matched {
                p.next = p.matched;
            }
        } else {
            let retry = if hint <= end && self.log.pos_at(hint).is_some() {
                hint
            } else {
                committed.min(end)
            };
            // A follower that reports less than it acknowledged lost durable data (a
            // replaced disk, a broken fsync); believe the report, or we would resend from
            // past its end forever.
            p.matched = p.matched.min(retry);
            p.rewind(retry, self.now);
            p.read_pending = false;
        }
        self.try_commit();
        self.replicate_to(from, false);
        self.check_transfer();
    }
}
