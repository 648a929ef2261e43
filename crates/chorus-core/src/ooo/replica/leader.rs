//! The serving leader: appends and what each declares (the look-behind buffer of PolarFS
//! section 5.2, the RAW and WAW predecessors of DP-Raft section 4.2, or conflict order),
//! its own copy counted once durable ([`OooReplica::persisted`]), followers'
//! acknowledgements, the commit rule (a majority, and in dependent mode or under conflict
//! order every RAW predecessor committed: DP-Raft section 4.3, Algorithm 1; plain
//! ParallelRaft commits on a majority alone, PolarFS section 5.2), and the leader's timer:
//! the quorum check, expired transfers, periodic resends and heartbeats. Outcomes reach
//! appenders as the slots commit ([`OooReplica::mark_committed`]).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::entry::entry_bytes;
use super::images::Outgoing;
use super::membership::Change;
use super::transfer::Transfer;
use super::{Action, Body, Declared, Entry, Mode, Msg, OooReplica};
use crate::format::meta::NodeId;
use crate::ooo::dependent::DepLeader;
use crate::ooo::parallel::{BlockRange, LookBehind};
use crate::ooo::{CommitWindow, OooError, Seq};
use crate::replica::Nanos;
use crate::rtt::RttWindow;

/// A leader's state, from its merge on.
#[derive(Debug)]
pub(super) struct Lead {
    /// First slot of new entries (the end of the merge): at most `end`.
    pub(super) start: Seq,
    /// Merged slots and who holds the re-stamped version; empty once serving.
    pub(super) merging: BTreeMap<Seq, BTreeSet<NodeId>>,
    /// Commit tracking once serving.
    pub(super) commit: Option<DepLeader<u64>>,
    /// Parallel mode: the look-behind buffers of the entries this leader appends.
    pub(super) look: LookBehind,
    /// The low half of the next append's identity (the high half is the term).
    pub(super) next_eid: u64,
    /// Next slot: every slot this replica holds is below it.
    pub(super) end: Seq,
    /// The followers: every other voter of the membership (and, during a change, the
    /// voters it adds); never this replica.
    pub(super) peers: BTreeMap<NodeId, Peer>,
    /// When entries or a heartbeat last went to every follower.
    pub(super) last_send: Nanos,
    /// When the periodic resend last ran.
    pub(super) last_resend: Nanos,
    /// The first slot broadcast since the last periodic resend: hole resends
    /// ([`OooConfig::hole_resend`]) cover slots from here on, older holes the periodic
    /// resend.
    ///
    /// [`OooConfig::hole_resend`]: super::OooConfig::hole_resend
    pub(super) fresh: Seq,
    /// When each slot not known committed was first sent, in slot order: the round trips
    /// and timeouts of [`OooConfig::timed_resend`].
    ///
    /// [`OooConfig::timed_resend`]: super::OooConfig::timed_resend
    pub(super) sent: VecDeque<(Seq, Nanos)>,
    /// The commit window last sent.
    pub(super) sent_commits: CommitWindow,
    /// A leader transfer under way.
    pub(super) transfer: Option<Transfer>,
    /// A membership change under way.
    pub(super) change: Option<Change>,
    /// Memberships set in this term so far (the second half of their versions).
    pub(super) versions: u64,
    /// Read probes of this leadership (leader reads, the `reads` module).
    pub(super) probes: super::reads::Probes,
}

impl Lead {
    /// The least of `at` over the followers that keep pace ([`Peer::keeps_pace`]);
    /// `Seq::MAX` when none does.
    pub(super) fn slowest(&self, now: Nanos, timeout: Nanos, at: impl Fn(&Peer) -> Seq) -> Seq {
        self.peers
            .values()
            .filter(|p| p.keeps_pace(now, timeout))
            .map(at)
            .min()
            .unwrap_or(Seq::MAX)
    }
}

/// What a leader knows of one follower.
#[derive(Debug)]
pub(super) struct Peer {
    /// Its first uncommitted slot, as it last said.
    pub(super) head: Seq,
    /// Its first unapplied slot, as it last said.
    pub(super) applied: Seq,
    /// Slots at or above `head` it acknowledged in this term.
    pub(super) acked: BTreeSet<Seq>,
    /// The nonce of the last [`Msg::AskEnd`] that made us forget its acknowledgements.
    forgot: Option<u64>,
    /// Slots resent to it because it acknowledged later ones ([`OooConfig::hole_resend`]),
    /// at or above its head and [`Lead::fresh`], each with the newest slot it had
    /// acknowledged when it was resent: sent again only once it acknowledged
    /// [`OooConfig::hole_resend`] more past that (the resent copy was overtaken too), so
    /// one late acknowledgement does not resend a slot on every later one.
    /// Each also with when it was resent ([`OooConfig::timed_resend`] waits twice its
    /// timeout after that).
    ///
    /// [`OooConfig::hole_resend`]: super::OooConfig::hole_resend
    /// [`OooConfig::timed_resend`]: super::OooConfig::timed_resend
    pub(super) resent: BTreeMap<Seq, (Seq, Nanos)>,
    /// Its recent acknowledgement round trips ([`OooConfig::timed_resend`]).
    ///
    /// [`OooConfig::timed_resend`]: super::OooConfig::timed_resend
    pub(super) rtt: RttWindow,
    /// When it last answered.
    pub(super) heard: Nanos,
    /// Its head at the last resend tick.
    tick_head: Seq,
    /// Its head stayed below our committed head for a whole resend interval: stream the
    /// slots from its head, acknowledged or not, one piece per acknowledgement.
    pub(super) catching_up: bool,
    /// Catch-up bytes it may be sent now (with `catchup_rate`), and when that was
    /// computed.
    pub(super) budget: u64,
    /// When `budget` was last refilled.
    pub(super) refilled: Nanos,
    /// When the driver was last asked for an image for it (its head is below our base).
    pub(super) snap_asked: Option<Nanos>,
    /// The image being streamed to it.
    pub(super) snap: Option<Outgoing>,
    /// The [`Membership::version`] it last said it holds.
    ///
    /// [`Membership::version`]: super::Membership::version
    pub(super) config: Option<(u64, u64)>,
}

impl Peer {
    /// Heard within `timeout` of `now` and not being caught up by streaming or an image:
    /// a follower whose progress the dependent window follows (the window base, and
    /// which records are packed last). One that is not does not hold either back.
    pub(super) fn keeps_pace(&self, now: Nanos, timeout: Nanos) -> bool {
        now.saturating_sub(self.heard) < timeout
            && !self.catching_up
            && self.snap.is_none()
            && self.snap_asked.is_none()
    }

    pub(super) fn new(now: Nanos) -> Self {
        Self {
            head: 0,
            applied: 0,
            acked: BTreeSet::new(),
            forgot: None,
            resent: BTreeMap::new(),
            rtt: RttWindow::default(),
            heard: now,
            tick_head: 0,
            catching_up: false,
            budget: 0,
            refilled: now,
            snap_asked: None,
            snap: None,
            config: None,
        }
    }
}

/// Most blocks a parallel entry lists for [`OooConfig::conflict_order`]; an entry
/// writing more conflicts with every entry in flight.
///
/// [`OooConfig::conflict_order`]: super::OooConfig::conflict_order
const CONFLICT_KEYS: u64 = 4096;

/// The blocks of `ranges` as keys for conflict order, or `None` past [`CONFLICT_KEYS`].
fn conflict_keys(ranges: &[BlockRange]) -> Option<Vec<u64>> {
    let mut n = 0u64;
    for r in ranges {
        n = n.saturating_add(r.end.saturating_sub(r.start));
        if n > CONFLICT_KEYS {
            return None;
        }
    }
    Some(ranges.iter().flat_map(|r| r.start..r.end).collect())
}

/// An accepted append.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket {
    /// Its slot.
    pub seq: Seq,
    /// Its identity, named again in [`Action::Result`].
    pub eid: u64,
}

/// Why an append was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OooAppendError {
    /// Not a serving leader.
    #[error("not the serving leader ({})", crate::LeaderHint(*.leader))]
    NotLeader {
        /// The leader this replica follows, if any.
        leader: Option<NodeId>,
    },
    /// The declaration does not fit the group's mode.
    #[error("a {declared} declaration in a {mode:?} group")]
    WrongMode {
        /// What was declared.
        declared: &'static str,
        /// The group's mode.
        mode: Mode,
    },
    /// The window is full or the declaration is malformed.
    #[error(transparent)]
    Refused(#[from] OooError),
    /// The leader is handing leadership to another replica
    /// ([`OooReplica::transfer_leader`]); append there once it leads.
    #[error("leadership is being transferred to node {to}")]
    Transferring {
        /// The replica leadership goes to.
        to: NodeId,
    },
    /// A membership change under way removes this leader: append at the next one.
    #[error("this leader is being removed from the group (new voters {voters:?})")]
    Leaving {
        /// The voters after the change.
        voters: Vec<NodeId>,
    },
}

impl OooReplica {
    /// Appends a record declaring what it touches. Returns its ticket; the result follows
    /// as an [`Action::Result`].
    pub fn append(
        &mut self,
        now: Nanos,
        declared: Declared,
        data: Vec<u8>,
    ) -> Result<Ticket, OooAppendError> {
        self.check_invariants();
        self.now = self.now.max(now);
        let mode = self.cfg.mode;
        let term = self.hard.term;
        let leader = self.leader;
        let Some(lead) = self.lead.as_mut().filter(|l| l.commit.is_some()) else {
            return Err(OooAppendError::NotLeader { leader });
        };
        if let Some(t) = &lead.transfer {
            return Err(OooAppendError::Transferring { to: t.to });
        }
        if !self.members.voters.contains(&self.cfg.id) {
            return Err(OooAppendError::Leaving {
                voters: self.members.voters.clone(),
            });
        }
        let commit = lead.commit.as_mut().expect("serving");
        let body_of = |seq| -> Result<(), OooError> {
            if let Declared::Blocks(r) = &declared {
                if let Some(r) = r.iter().find(|r| r.start >= r.end) {
                    return Err(OooError::Malformed {
                        seq,
                        detail: format!("empty block range {}..{}", r.start, r.end),
                    });
                }
            }
            Ok(())
        };
        body_of(lead.end)?;
        let body = match (mode, declared) {
            (Mode::Parallel { .. }, Declared::Blocks(ranges)) => {
                let after = if self.cfg.conflict_order {
                    let raw = commit
                        .admit_conflicting(conflict_keys(&ranges).as_deref())?
                        .deps
                        .raw;
                    self.stats.admitted_after += u64::from(!raw.is_empty());
                    raw
                } else {
                    commit.admit(&[], &[])?;
                    Vec::new()
                };
                let st = lead.look.stamp(ranges)?;
                Body::Parallel {
                    ranges: st.ranges,
                    look_behind: st.look_behind,
                    after,
                    data: data.into(),
                }
            }
            (
                Mode::Dependent,
                Declared::Txn {
                    read_set,
                    write_set,
                },
            ) => {
                let de = commit.admit(&read_set, &write_set)?;
                self.stats.admitted_after += u64::from(!de.deps.raw.is_empty());
                Body::Dependent {
                    base: de.base,
                    deps: de.deps,
                    write_set: de.write_set,
                    data: data.into(),
                }
            }
            (mode, d) => {
                return Err(OooAppendError::WrongMode {
                    declared: match d {
                        Declared::Blocks(_) => "block-range",
                        Declared::Txn { .. } => "read/write-set",
                    },
                    mode,
                })
            }
        };
        let seq = lead.end;
        lead.end += 1;
        let eid = term << 32 | lead.next_eid;
        lead.next_eid += 1;
        let e = Entry {
            seq,
            term,
            start: lead.start,
            eid,
            body,
        };
        self.write_local(e.clone(), term);
        self.outbox.push(e);
        self.mine.insert(seq, eid);
        // The leader's own copy counts toward a majority once it is durable
        // ([`Self::persisted`]), so a driver may keep appending and replicating while
        // its disk syncs.
        self.finish();
        Ok(Ticket { seq, eid })
    }

    /// Leader: whether an entry declaring `declared`, appended now, would wait to commit
    /// for an entry not yet committed — in dependent mode a RAW predecessor, under
    /// conflict order an earlier entry overlapping its blocks ([`DepLeader::would_wait`]).
    /// False where nothing orders commits (plain parallel mode) and when not serving.
    pub fn would_wait(&self, declared: &Declared) -> bool {
        let Some(commit) = self.lead.as_ref().and_then(|l| l.commit.as_ref()) else {
            return false;
        };
        match (self.cfg.mode, declared) {
            (Mode::Dependent, Declared::Txn { read_set, .. }) => commit.would_wait(read_set),
            (Mode::Parallel { .. }, Declared::Blocks(ranges)) if self.cfg.conflict_order => {
                conflict_keys(ranges).is_none_or(|keys| commit.would_wait(&keys))
            }
            _ => false,
        }
    }

    /// Leader, dependent mode: whether an entry writing what `declared` writes, appended
    /// now, would be ordered after a writer some live replica (this one included) has not
    /// applied yet, as its last acknowledgement said ([`DepLeader::would_order`]). Such an
    /// entry waits on that replica for the writer — for as long as its copy takes to
    /// arrive when it is the one that is late. False in parallel mode and when not
    /// serving. Followers not heard within an election timeout, or being caught up, are
    /// left out, as they are when the leader sets the window base.
    pub fn would_order(&self, declared: &Declared) -> bool {
        self.orders_after(declared, self.apply_floor())
    }

    /// Leader: the rule a driver packing the records of one round into group entries
    /// asks per record ([`super::group::waiting_last`]): whether to put it into an entry
    /// after the others taken with it, because it would wait to commit
    /// ([`Self::would_wait`]) or, on some replica, to apply ([`Self::would_order`]).
    /// Either way a group whose other records need not wait would wait with it, as a
    /// group commits and applies whole. The replicas' apply heads are read once, here.
    ///
    /// [`super::group::waiting_last`]: crate::ooo::group::waiting_last
    pub fn packs_last(&self) -> impl Fn(&Declared) -> bool + '_ {
        let floor = self.apply_floor();
        move |d| self.would_wait(d) || self.orders_after(d, floor)
    }

    /// Leader, dependent mode: the lowest apply head among the live replicas, this one
    /// included; `None` in parallel mode and when not serving.
    fn apply_floor(&self) -> Option<Seq> {
        let lead = self.lead.as_ref().filter(|l| l.commit.is_some())?;
        if !matches!(self.cfg.mode, Mode::Dependent) {
            return None;
        }
        let live = lead.slowest(self.now, self.cfg.election_timeout, |p| p.applied);
        Some(live.min(self.applier.head()))
    }

    /// Whether `declared` writes a key whose last writer a replica that applied every
    /// slot below `floor` may still have to apply ([`Self::apply_floor`]).
    fn orders_after(&self, declared: &Declared, floor: Option<Seq>) -> bool {
        let commit = self.lead.as_ref().and_then(|l| l.commit.as_ref());
        match (floor, commit, declared) {
            (Some(since), Some(c), Declared::Txn { write_set, .. }) => {
                c.would_order(write_set, since)
            }
            _ => false,
        }
    }

    /// The driver made these writes durable: the `(seq, eid, term)` of entries from
    /// [`Action::Write`]s, reported in any later call once synced. A leader counts its own
    /// copy of a slot toward a majority only from here — not when it asked for the write —
    /// so a driver may overlap the leader's sync with replication and with the next
    /// appends (Raft's leader writes its log in parallel with replicating it, for the same
    /// reason). Reports of another term's versions, or of versions replaced since, are
    /// ignored.
    pub fn persisted(&mut self, now: Nanos, written: &[(Seq, u64, u64)]) {
        self.check_invariants();
        self.now = self.now.max(now);
        let (me, term) = (self.me(), self.hard.term);
        for &(seq, eid, t) in written {
            if t != term
                || !self
                    .log
                    .get(&seq)
                    .is_some_and(|s| s.entry.eid == eid && s.entry.term == t)
            {
                continue;
            }
            let Some(lead) = self.lead.as_mut() else {
                break;
            };
            if lead.commit.is_none() {
                if let Some(holders) = lead.merging.get_mut(&seq) {
                    holders.insert(me);
                }
            } else {
                self.leader_ack(seq, me);
            }
        }
        self.check_merged();
        self.finish();
    }

    fn leader_ack(&mut self, seq: Seq, node: NodeId) {
        let Some(commit) = self.lead.as_mut().and_then(|l| l.commit.as_mut()) else {
            return;
        };
        let held = commit.held();
        let committed = commit.ack(seq, node);
        self.stats.held_at_quorum += commit.held() - held;
        for s in committed {
            self.mark_committed(s);
        }
    }

    pub(super) fn on_ack(
        &mut self,
        from: NodeId,
        term: u64,
        seqs: Vec<(Seq, u64)>,
        head: Seq,
        applied: Seq,
    ) {
        if term > self.hard.term {
            self.step_down(term, None);
            return;
        }
        if term < self.hard.term {
            return;
        }
        let now = self.now;
        let Some(lead) = self.lead.as_mut() else {
            return;
        };
        let Some(peer) = lead.peers.get_mut(&from) else {
            return;
        };
        peer.heard = now;
        // Its latest word, even if lower: a restarted follower may know less committed
        // than it said before (its saved head is a lower bound), and resends start here.
        peer.head = head;
        peer.applied = applied;
        if peer.head >= self.commits.head() {
            peer.catching_up = false;
        }
        if peer.head >= self.hard.base
            || peer
                .snap
                .as_ref()
                .is_some_and(|o| head >= o.base || o.part.is_some_and(|f| applied < f))
        {
            // Caught up with the log, or installed the image it was sent and still behind
            // (this replica compacted again meanwhile), or the partial image it is being
            // sent was built for more than it has applied (it restarted, and refuses
            // that image): a fresh image, at once.
            peer.snap = None;
            peer.snap_asked = None;
        }
        // Streaming catch-up: a follower still below our committed head gets the next
        // piece with every acknowledgement — one batch per round trip, within the rate
        // limit — instead of one per resend interval.
        let catch_up = peer.catching_up;
        let h = peer.head;
        peer.acked = peer.acked.split_off(&h);
        let mut acked = Vec::new();
        let sent = &lead.sent;
        let mut rtt = None;
        for (s, eid) in seqs {
            if self.log.get(&s).is_some_and(|slot| slot.entry.eid == eid) {
                // A round trip from a copy sent once (Karn's rule: an answer to a resent
                // copy does not say which copy it answers); of those one message answers,
                // the latest sent gives the tightest.
                if peer.acked.insert(s) && !peer.resent.contains_key(&s) {
                    if let Ok(i) = sent.binary_search_by_key(&s, |&(q, _)| q) {
                        let r = now.saturating_sub(sent[i].1);
                        rtt = Some(rtt.map_or(r, |x: Nanos| x.min(r)));
                    }
                }
                acked.push(s);
            }
        }
        if let Some(r) = rtt {
            peer.rtt.sample(r);
        }
        if catch_up {
            let missing = self.missing_for(from);
            if !missing.is_empty()
                && self.spend_catchup(from, missing.iter().map(entry_bytes).sum())
            {
                self.send_entries(from, missing);
            }
        }
        let lead = self.lead.as_mut().expect("leading");
        if lead.commit.is_none() {
            for s in acked {
                if let Some(a) = lead.merging.get_mut(&s) {
                    a.insert(from);
                }
            }
            self.check_merged();
        } else {
            self.set_waw_floor();
            for s in acked {
                self.leader_ack(s, from);
            }
            self.resend_holes(from);
            self.check_transfer();
            self.check_change();
        }
    }

    /// Dependent mode: entries admitted from now on list WAW predecessors from the first
    /// slot a live follower may be missing ([`DepLeader::set_floor`]). Followers not
    /// heard within an election timeout, or being caught up by streaming or an image,
    /// do not hold the base down.
    fn set_waw_floor(&mut self) {
        let (now, timeout) = (self.now, self.cfg.election_timeout);
        let Some(lead) = self.lead.as_mut() else {
            return;
        };
        let first_missing = lead.slowest(now, timeout, |p| p.head);
        if let Some(c) = lead.commit.as_mut() {
            c.set_floor(first_missing);
        }
    }

    /// A follower recovering lost entries asks where our slots end. The first time for
    /// a restart (`nonce`), its acknowledgements of slots not yet committed are forgotten
    /// — it may have lost those copies — so it is resent what it lacks from its first
    /// uncommitted slot on, acknowledged or not, and no commit or merge counts a lost
    /// copy. The answer is our end: every slot it was ever sent by us is below, and every
    /// slot an earlier term may have committed is below our merge start.
    pub(super) fn on_ask_end(&mut self, from: NodeId, term: u64, nonce: u64) {
        if term != self.hard.term {
            return;
        }
        let Some(lead) = self.lead.as_mut() else {
            return;
        };
        let Some(peer) = lead.peers.get_mut(&from) else {
            return;
        };
        if peer.forgot != Some(nonce) {
            peer.forgot = Some(nonce);
            peer.acked.clear();
            for acks in lead.merging.values_mut() {
                acks.remove(&from);
            }
            if let Some(c) = lead.commit.as_mut() {
                c.forget(from);
            }
        }
        let end = lead.end;
        self.actions.push(Action::Send {
            to: from,
            msg: Msg::End { term, end },
        });
    }

    pub(super) fn broadcast(&mut self, entries: Vec<Entry>) {
        let Some(lead) = self.lead.as_mut() else {
            return;
        };
        lead.last_send = self.now;
        lead.sent_commits = self.commits.clone();
        for e in &entries {
            if lead.sent.back().is_none_or(|&(s, _)| s < e.seq) {
                lead.sent.push_back((e.seq, self.now));
            }
        }
        for p in self.peers() {
            self.send_entries(p, entries.clone());
        }
    }

    /// Leader: sends `entries` to one follower, with the commit window and membership
    /// version every [`Msg::Append`] carries.
    pub(super) fn send_entries(&mut self, to: NodeId, entries: Vec<Entry>) {
        self.actions.push(Action::Send {
            to,
            msg: Msg::Append {
                term: self.hard.term,
                start: self.hard.leader_start.1,
                entries,
                commits: self.commits.clone(),
                config: self.members.version,
            },
        });
    }

    pub(super) fn lead_tick(&mut self) {
        let now = self.now;
        let timeout = self.cfg.election_timeout;
        let lead = self.lead.as_ref().expect("leading");
        let heard: Vec<NodeId> = lead
            .peers
            .iter()
            .filter(|(_, p)| now.saturating_sub(p.heard) < timeout)
            .map(|(&id, _)| id)
            .collect();
        if !self.quorum_with_me(heard) {
            // Cannot reach a majority: stop taking appends that cannot commit.
            self.step_down(self.hard.term, None);
            return;
        }
        let lead = self.lead.as_mut().expect("leading");
        if lead.transfer.is_some_and(|t| now >= t.until) {
            lead.transfer = None;
            self.stats.transfers_expired += 1;
        }
        self.check_transfer();
        self.resend_probes();
        self.resend_timed();
        let lead = self.lead.as_mut().expect("leading");
        if now.saturating_sub(lead.last_resend) >= self.cfg.resend_interval {
            lead.last_resend = now;
            lead.fresh = lead.end;
            let committed = self.commits.head();
            for peer in lead.peers.values_mut() {
                peer.catching_up = peer.head < committed && peer.head == peer.tick_head;
                peer.tick_head = peer.head;
            }
            let mut sends = Vec::new();
            for p in self.peers() {
                if self.snapshot_tick(p) {
                    continue;
                }
                let missing = self.missing_for(p);
                if !missing.is_empty()
                    && self.spend_catchup(p, missing.iter().map(entry_bytes).sum())
                {
                    sends.push((p, missing));
                }
            }
            for (to, entries) in sends {
                self.send_entries(to, entries);
            }
            // Followers that have not said they hold our membership get it again.
            let version = self.members.version;
            let stale: Vec<NodeId> = self
                .lead
                .as_ref()
                .expect("leading")
                .peers
                .iter()
                .filter(|(_, p)| p.config.unwrap_or((0, 0)) != version)
                .map(|(&id, _)| id)
                .collect();
            for p in stale {
                self.send_config(Some(p));
            }
        }
        let lead = self.lead.as_ref().expect("leading");
        if now.saturating_sub(lead.last_send) >= self.cfg.heartbeat_interval {
            self.broadcast(Vec::new());
        }
    }
}
