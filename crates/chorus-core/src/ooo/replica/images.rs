//! Compaction and state-machine images. A driver's checkpoint lets the replica drop the
//! slots below it ([`OooReplica::compact`]); a follower whose first uncommitted slot was
//! compacted gets an image of the leader's state machine instead of entries (PolarFS
//! section 5.4, catch up): a partial one carrying only what the slots it has not applied
//! wrote ([`Footprint`], fast catch-up), or the whole state streamed in bounded pieces
//! under the catch-up rate limit (streaming catch-up, 128 KiB pieces), then the log from
//! the image's base on. The follower installs it once no apply is in flight.

use std::collections::BTreeMap;

use super::apply::Applier;
use super::{Action, Body, Entry, Msg, OooReplica, Slot};
use crate::format::meta::NodeId;
use crate::ooo::parallel::BlockRange;
use crate::ooo::{CommitWindow, OooError, Seq};
use crate::replica::Nanos;

/// What a run of entries wrote: the blocks (parallel mode) and keys (dependent mode). A
/// partial image carries the state of a footprint only (PolarFS section 5.4, fast
/// catch-up: holes "already checkpointed" are filled from the leader's data, and only the
/// data they wrote need travel).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Footprint {
    /// Blocks written: ascending, disjoint, none adjacent to the next.
    pub blocks: Vec<BlockRange>,
    /// Keys written: ascending, distinct.
    pub keys: Vec<u64>,
}

impl Footprint {
    /// What `e` writes (nothing for NULL).
    pub fn of(e: &Entry) -> Self {
        let mut f = Self::default();
        f.add_entry(e);
        f
    }

    fn add_entry(&mut self, e: &Entry) {
        match &e.body {
            Body::Null => {}
            Body::Parallel { ranges, .. } => self.add_blocks(ranges),
            Body::Dependent { write_set, .. } => self.add_keys(write_set),
        }
    }

    /// Adds `other`'s blocks and keys.
    pub fn add(&mut self, other: &Footprint) {
        self.add_blocks(&other.blocks);
        self.add_keys(&other.keys);
    }

    fn add_blocks(&mut self, ranges: &[BlockRange]) {
        if ranges.is_empty() {
            return;
        }
        let mut all: Vec<BlockRange> = self.blocks.iter().chain(ranges).copied().collect();
        all.sort_by_key(|r| r.start);
        let mut out: Vec<BlockRange> = Vec::with_capacity(all.len());
        for r in all {
            match out.last_mut() {
                Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
                _ => out.push(r),
            }
        }
        self.blocks = out;
    }

    fn add_keys(&mut self, keys: &[u64]) {
        if keys.is_empty() {
            return;
        }
        self.keys.extend_from_slice(keys);
        self.keys.sort_unstable();
        self.keys.dedup();
    }

    /// Blocks plus keys named.
    pub fn items(&self) -> u64 {
        self.blocks
            .iter()
            .map(|r| r.end - r.start)
            .sum::<u64>()
            .saturating_add(self.keys.len() as u64)
    }

    /// Whether it names nothing.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty() && self.keys.is_empty()
    }
}

/// A state-machine image a leader streams to one follower.
#[derive(Debug)]
pub(super) struct Outgoing {
    /// Every slot below is in the image.
    pub(super) base: Seq,
    /// A partial image's first slot ([`Msg::Snapshot::part`]).
    pub(super) part: Option<Seq>,
    /// The image.
    image: Vec<u8>,
    /// Bytes sent: at most the image's length.
    sent: usize,
    /// Every piece sent (an empty image is one empty piece).
    finished: bool,
    /// When the image was handed over ([`OooReplica::snapshot_ready`]): a retry is due
    /// `snapshot_retry` later.
    started: Nanos,
}

/// A state-machine image a follower is receiving.
#[derive(Debug)]
pub(super) struct Incoming {
    /// The term of the leader sending it.
    term: u64,
    /// Every slot below is in the image.
    base: Seq,
    /// A partial image's first slot.
    part: Option<Seq>,
    /// The image's length.
    total: u64,
    /// The pieces received so far, in order from offset 0: at most `total` bytes.
    buf: Vec<u8>,
}

impl OooReplica {
    /// The driver made its state machine durable after every slot below `upto` had been
    /// applied (a checkpoint; PolarFS section 5.3: "all log entries before the checkpoint
    /// are applied to data blocks and the checkpoint is allowed to contain some log
    /// entries committed after the checkpoint"). Those slots are compacted: dropped here,
    /// the new base saved, then an [`Action::Compact`] lets the driver drop them from its
    /// file. `upto` is capped at the applied head; nothing happens while an image is being
    /// installed.
    ///
    /// The image may hold effects of entries past `upto` (applied out of order); replaying
    /// them after a restart writes the same values again in an order the apply rules
    /// allow, so the state machine's writes must be blind (a block write, a put), as both
    /// demo state machines' are.
    pub fn compact(&mut self, now: Nanos, upto: Seq) {
        self.now = self.now.max(now);
        let upto = upto.min(self.applier.head());
        // Not while an image is coming in either: its base could fall below ours, and
        // installing it would then take the state back.
        if upto <= self.hard.base
            || self.incoming.is_some()
            || self.install.is_some()
            || self.installing.is_some()
        {
            return;
        }
        let kept = self.log.split_off(&upto);
        let gone = std::mem::replace(&mut self.log, kept);
        self.remember_written(self.hard.base, upto, gone);
        self.hard.base = upto;
        self.hard.committed_head = self.hard.committed_head.max(self.commits.head());
        self.stats.compactions += 1;
        self.save_hard();
        let live = self.log.values().map(|s| s.entry.clone()).collect();
        self.actions.push(Action::Compact { base: upto, live });
        self.finish();
    }

    /// Every slot below this one is compacted ([`Hard::base`]).
    ///
    /// [`Hard::base`]: super::Hard::base
    pub fn base(&self) -> Seq {
        self.hard.base
    }

    /// How far a checkpoint taken now may let [`Self::compact`] go without sending anyone
    /// an image: the applied head, and on a leader no further than the first uncommitted
    /// slot of any follower heard from within the election timeout (followers learn
    /// commits a message later than the leader, so compacting to the leader's own head
    /// would send every follower an image at every compaction). A follower that is not
    /// heard from does not hold compaction back; it gets an image when it returns. A
    /// driver short of space may compact to the applied head regardless (PolarFS section
    /// 5.3 keeps entries "until short of resource or some threshold reached").
    pub fn compactable(&self) -> Seq {
        let applied = self.applier.head();
        let Some(lead) = self.lead.as_ref() else {
            return applied;
        };
        let timeout = self.cfg.election_timeout;
        lead.peers
            .values()
            .filter(|p| self.now.saturating_sub(p.heard) < timeout)
            .map(|p| p.head)
            .fold(applied, Seq::min)
    }

    /// What the compacted slots `from..upto` (dropped from the log: `gone`) wrote, kept
    /// for partial images while the total stays within bounds (the oldest forgotten
    /// first).
    fn remember_written(&mut self, from: Seq, upto: Seq, gone: BTreeMap<Seq, Slot>) {
        if self.cfg.partial_image_items == 0 {
            return;
        }
        // The map covers `written_from..from` slot by slot (each compaction adds its
        // slots; eviction takes from the front).
        debug_assert_eq!(self.written_from + self.written.len() as u64, from);
        for s in from..upto {
            let f = gone
                .get(&s)
                .map(|x| Footprint::of(&x.entry))
                .unwrap_or_default();
            self.written_items += f.items();
            self.written.insert(s, f);
        }
        let cap = self.cfg.partial_image_items.saturating_mul(4);
        while self.written_items > cap || self.written.len() as u64 > cap {
            let Some((s, f)) = self.written.pop_first() else {
                break;
            };
            self.written_items -= f.items();
            self.written_from = s + 1;
        }
    }

    /// Leader, for the driver serving an [`Action::Snapshot`] for `to`: `Some((from,
    /// footprint))` when `to` may be sent a partial image — what the slots from its first
    /// unapplied slot `from` up to [`Self::applied_head`] wrote — instead of the whole
    /// state. Read it together with the applied head, and pass `from` to
    /// [`Self::snapshot_ready`] as the image's part.
    ///
    /// Why that suffices (PolarFS section 5.4's fast catch-up): the follower has applied
    /// every slot below `from`, so every block or key no slot from `from` on writes is
    /// already as the image would have it; the rest is in the footprint, whose state the
    /// image carries at least as new as the base (later effects are written again by
    /// replay, the writes being blind). `None` (a whole image): this replica does not
    /// remember what some of those slots wrote (it restarted or installed an image since
    /// they were compacted), the footprint is larger than
    /// [`OooConfig::partial_image_items`], or `to` is not a follower it leads.
    ///
    /// [`OooConfig::partial_image_items`]: super::OooConfig::partial_image_items
    pub fn image_scope(&self, to: NodeId) -> Option<(Seq, Footprint)> {
        let peer = self.lead.as_ref()?.peers.get(&to)?;
        let (from, upto) = (peer.applied, self.applier.head());
        let cap = self.cfg.partial_image_items;
        if cap == 0 || from < self.written_from || from >= upto {
            return None;
        }
        let mut f = Footprint::default();
        for (_, w) in self.written.range(from..) {
            f.add(w);
            if f.items() > cap {
                return None;
            }
        }
        for (_, slot) in self.log.range(from.max(self.hard.base)..upto) {
            f.add_entry(&slot.entry);
            if f.items() > cap {
                return None;
            }
        }
        Some((from, f))
    }

    /// Leader: the image the driver took for follower `to` after an [`Action::Snapshot`].
    /// It covers every slot below `base`, the applied head when the driver took it;
    /// `part` is `Some(from)` for a partial image built from [`Self::image_scope`]. It is
    /// streamed in pieces of `max_batch_bytes` under the catch-up rate limit; the follower
    /// installs it and continues from `base` with the log, which this replica still holds
    /// from there on (an image whose base fell below a later compaction is dropped, and a
    /// new one asked for at the next resend).
    pub fn snapshot_ready(
        &mut self,
        now: Nanos,
        to: NodeId,
        base: Seq,
        part: Option<Seq>,
        image: Vec<u8>,
    ) {
        self.now = self.now.max(now);
        let (hard_base, applied, started) = (self.hard.base, self.applier.head(), self.now);
        if let Some(peer) = self.lead.as_mut().and_then(|l| l.peers.get_mut(&to)) {
            if base >= hard_base
                && base <= applied
                && peer.head < base
                && peer.snap.is_none()
                && part.is_none_or(|f| f <= base)
            {
                if part.is_some() {
                    self.stats.partial_images += 1;
                }
                peer.snap = Some(Outgoing {
                    base,
                    part,
                    image,
                    sent: 0,
                    finished: false,
                    started,
                });
                self.send_pieces(to);
            } else {
                peer.snap_asked = None;
            }
        }
        self.finish();
    }

    /// Leader, at each resend: a follower whose first uncommitted slot is below our base
    /// gets an image instead of entries. Asks the driver for one, streams the pieces the
    /// budget allows, and starts over if the follower has not installed it `snapshot_retry`
    /// after it began. Returns whether `p` is below the base.
    pub(super) fn snapshot_tick(&mut self, p: NodeId) -> bool {
        let (now, base, retry) = (self.now, self.hard.base, self.cfg.snapshot_retry);
        let Some(peer) = self.lead.as_mut().and_then(|l| l.peers.get_mut(&p)) else {
            return false;
        };
        if peer.head >= base {
            return false;
        }
        if peer
            .snap
            .as_ref()
            .is_some_and(|o| o.finished && now.saturating_sub(o.started) >= retry)
        {
            // Streamed and still not installed: a piece was lost, or the follower
            // restarted. Take a fresh image.
            peer.snap = None;
            peer.snap_asked = None;
        }
        if peer.snap.is_none() {
            if peer
                .snap_asked
                .is_none_or(|t| now.saturating_sub(t) >= retry)
            {
                peer.snap_asked = Some(now);
                self.stats.snapshots_sent += 1;
                self.actions.push(Action::Snapshot { to: p });
            }
            return true;
        }
        self.send_pieces(p);
        true
    }

    /// Sends the pieces of `p`'s image that its catch-up budget covers.
    fn send_pieces(&mut self, p: NodeId) {
        let piece = self.cfg.max_batch_bytes.max(1);
        let term = self.hard.term;
        loop {
            let Some(out) = self
                .lead
                .as_ref()
                .and_then(|l| l.peers.get(&p))
                .and_then(|x| x.snap.as_ref())
            else {
                return;
            };
            if out.finished {
                return;
            }
            let end = (out.sent + piece).min(out.image.len());
            if !self.spend_catchup(p, (end - out.sent) as u64 + 64) {
                return;
            }
            let out = self
                .lead
                .as_mut()
                .and_then(|l| l.peers.get_mut(&p))
                .and_then(|x| x.snap.as_mut())
                .expect("checked above");
            let msg = Msg::Snapshot {
                term,
                base: out.base,
                offset: out.sent as u64,
                total: out.image.len() as u64,
                part: out.part,
                data: out.image[out.sent..end].to_vec(),
            };
            out.sent = end;
            out.finished = end == out.image.len();
            self.actions.push(Action::Send { to: p, msg });
        }
    }

    /// Follower: a piece of the leader's image. Pieces must arrive in order from offset
    /// 0; a gap drops what was gathered (the leader starts over after `snapshot_retry`).
    pub(super) fn on_snapshot(
        &mut self,
        from: NodeId,
        term: u64,
        (base, part): (Seq, Option<Seq>),
        offset: u64,
        total: u64,
        data: Vec<u8>,
    ) {
        if !self.follow(from, term) {
            return;
        }
        self.save_hard();
        if base <= self.commits.head() || self.install.is_some() || self.installing.is_some() {
            // The log from our head on does (or an image being installed will): say where
            // we are, so the leader stops streaming.
            self.incoming = None;
            if self.install.is_none() && self.installing.is_none() {
                self.send_head(from);
            }
            return;
        }
        if offset
            .checked_add(data.len() as u64)
            .is_none_or(|e| e > total)
        {
            self.stats.refused += 1;
            self.incoming = None;
            return;
        }
        match &mut self.incoming {
            _ if offset == 0 => {
                self.incoming = Some(Incoming {
                    term,
                    base,
                    part,
                    total,
                    buf: data,
                })
            }
            Some(inc)
                if inc.term == term
                    && inc.base == base
                    && inc.part == part
                    && inc.total == total
                    && inc.buf.len() as u64 == offset =>
            {
                inc.buf.extend_from_slice(&data)
            }
            _ => {
                self.incoming = None;
                return;
            }
        }
        if self
            .incoming
            .as_ref()
            .is_some_and(|i| i.buf.len() as u64 == i.total)
        {
            let inc = self.incoming.take().expect("checked");
            self.install = Some((inc.base, inc.part, inc.buf));
            self.try_install();
        }
    }

    /// Hands a received image to the driver once no apply is in flight. A partial image
    /// built for a first unapplied slot past ours is refused: what we lack below it is
    /// not in the image (we restarted since we told the leader, and replay from our base
    /// has not reached it); the leader learns our applied slot and sends another.
    pub(super) fn try_install(&mut self) {
        if !self.applying.is_empty() {
            return;
        }
        let Some((base, part, image)) = self.install.take() else {
            return;
        };
        if part.is_some_and(|f| self.applier.head() < f) {
            self.stats.partial_images_refused += 1;
            if let Some(l) = self.leader.filter(|_| self.lead.is_none()) {
                self.send_head(l);
            }
            return;
        }
        self.installing = Some(base);
        self.actions.push(Action::Install {
            base,
            image,
            part: part.is_some(),
        });
    }

    /// Follower: the driver installed the image of an [`Action::Install`] durably. Slots
    /// below its base are dropped, the apply rules restart there (the slots from there on
    /// that this replica holds committed are applied again: blind writes, see
    /// [`Self::compact`]), the new base is saved and the leader learns our head.
    ///
    /// A pending append (a deposed leader's) at a slot below the base cannot learn which
    /// entry committed there: it ends in [`Action::Unknown`].
    pub fn installed(&mut self, now: Nanos, base: Seq) -> Result<(), OooError> {
        self.install_reported(now, base)?;
        self.stats.snapshots_installed += 1;
        self.log = self.log.split_off(&base);
        // What the slots below the image's base wrote is not known here.
        self.written.clear();
        self.written_items = 0;
        self.written_from = base;
        let kept = self.mine.split_off(&base);
        for (seq, eid) in std::mem::replace(&mut self.mine, kept) {
            self.actions.push(Action::Unknown { eid, seq });
        }
        let committed: Vec<Seq> = self
            .log
            .iter()
            .filter(|(_, s)| s.committed)
            .map(|(&s, _)| s)
            .collect();
        let mut w = CommitWindow::new(base);
        for &s in &committed {
            w.commit(s);
        }
        self.commits = w;
        self.applier = Applier::new(self.cfg.mode, base);
        for s in committed {
            let e = self.log[&s].entry.clone();
            if let Err(why) = self.applier.feed(&e) {
                debug_assert!(false, "committed entry refused by the applier: {why}");
            }
        }
        self.hard.base = base;
        self.hard.committed_head = self.commits.head();
        self.save_hard();
        let live = self.log.values().map(|s| s.entry.clone()).collect();
        self.actions.push(Action::Compact { base, live });
        if let Some(l) = self.leader.filter(|_| self.lead.is_none()) {
            self.send_head(l);
        }
        self.finish();
        Ok(())
    }

    /// Follower: the driver could not install the image of an [`Action::Install`] (its
    /// state machine refused it and kept its state). Applies resume; the leader sends a
    /// new image after `snapshot_retry`.
    pub fn install_failed(&mut self, now: Nanos, base: Seq) -> Result<(), OooError> {
        self.install_reported(now, base)?;
        self.finish();
        Ok(())
    }

    /// The driver reports on the [`Action::Install`] of `base`: refused if there is none.
    fn install_reported(&mut self, now: Nanos, base: Seq) -> Result<(), OooError> {
        self.now = self.now.max(now);
        if self.installing != Some(base) {
            return Err(OooError::Malformed {
                seq: base,
                detail: "an install reported without an Install action".into(),
            });
        }
        self.installing = None;
        Ok(())
    }
}
