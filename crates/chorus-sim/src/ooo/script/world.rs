//! The world a script drives: replicas of one out-of-order group, each with a disk that
//! keeps what was synced, a state machine (block or key -> the record that last wrote
//! it), and one message queue the script controls. No threads, no randomness beyond the
//! replicas' seeded election timers: a script runs the same way every time.
//!
//! A node executes its replica's actions in order, as a driver must (see
//! `chorus_core::ooo::replica`): writes, saved hard states and memberships, compactions
//! go to its disk, messages to the queue, applies to its state machine. A node syncs at
//! once by default; under `sync N manual` its disk operations wait for `persist N`, and
//! every action behind them waits too — except what the replica allows to go first (an
//! `Append`, results, and what is for observers only: commits, roles, serving). So a
//! follower's acknowledgement never leaves before the entry it acknowledges is durable.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use chorus_core::format::meta::NodeId;
use chorus_core::ooo::replica::{
    Action, Body, Entry, Hard, Membership, Msg, OooConfig, OooReplica,
};
use chorus_core::ooo::Seq;
use chorus_core::replica::Nanos;

use super::render;

/// What a node's disk holds durably.
#[derive(Default)]
pub struct Disk {
    pub hard: Hard,
    pub membership: Option<Membership>,
    pub entries: BTreeMap<Seq, Entry>,
}

/// A slot as the node's replica holds it (from the writes and commits it reported).
pub struct Held {
    pub entry: Entry,
    pub committed: bool,
    pub durable: bool,
}

pub struct Node {
    pub id: NodeId,
    pub cfg: OooConfig,
    /// `None` while crashed.
    pub r: Option<OooReplica>,
    pub disk: Disk,
    /// Syncs only on `persist`.
    pub manual: bool,
    /// Disk operations not yet durable (manual sync).
    pub pending: Vec<Action>,
    /// Actions waiting behind them.
    pub blocked: VecDeque<Action>,
    /// The replica's log, as its actions tell it.
    pub mem: BTreeMap<Seq, Held>,
    /// Slots applied since the last start (or install).
    pub applied: BTreeSet<Seq>,
    /// The state machine: block or key -> identity of the record that last wrote it.
    pub state: BTreeMap<u64, u64>,
    /// The durable image of the state machine (a checkpoint or an installed image).
    pub ckpt: BTreeMap<u64, u64>,
}

/// A message in flight.
pub struct Queued {
    pub from: NodeId,
    pub to: NodeId,
    pub msg: Msg,
}

pub struct World {
    pub nodes: BTreeMap<NodeId, Node>,
    pub queue: Vec<Queued>,
    pub now: Nanos,
    /// Links that lose every message (partitions), as (from, to).
    pub cut: BTreeSet<(NodeId, NodeId)>,
    /// Links whose messages wait for an explicit `deliver`, as (from, to).
    pub held: BTreeSet<(NodeId, NodeId)>,
    /// Leave heartbeats and empty acknowledgements out of the trace (`run`).
    pub quiet: bool,
    /// Prefix trace lines with the time (`run`).
    pub stamp: bool,
    /// Each node's latest campaign, for `merge-table`.
    pub campaigns: BTreeMap<NodeId, Campaign>,
    out: Vec<TraceLine>,
}

/// A line of the trace, with the node and kind of action it lists (lines of one node's
/// consecutive actions of a kind are joined).
type TraceLine = (Option<(NodeId, &'static str)>, String);

/// A granted vote as the candidate got it: voter, versions, leader start.
pub type Reply = (NodeId, Vec<(Entry, bool)>, (u64, Seq));

/// What a candidate merges: its own versions from its first uncommitted slot on and the
/// granted votes that reached it before it merged (seen on the wire).
pub struct Campaign {
    pub term: u64,
    pub head: Seq,
    pub own: BTreeMap<Seq, (Entry, bool)>,
    /// Its saved [`Hard::leader_start`].
    pub own_start: (u64, Seq),
    /// Granted votes: voter, versions (with whether the voter knows each committed), its
    /// leader start.
    pub replies: Vec<Reply>,
    /// It merged (sent its first append of the term): later votes are not merged.
    pub merged: bool,
}

const MS: Nanos = 1_000_000;

impl World {
    pub fn new(cfgs: Vec<OooConfig>) -> Self {
        let nodes = cfgs
            .into_iter()
            .map(|cfg| {
                let id = cfg.id;
                let r = OooReplica::new(cfg.clone(), 0);
                let n = Node {
                    id,
                    cfg,
                    r: Some(r),
                    disk: Disk::default(),
                    manual: false,
                    pending: Vec::new(),
                    blocked: VecDeque::new(),
                    mem: BTreeMap::new(),
                    applied: BTreeSet::new(),
                    state: BTreeMap::new(),
                    ckpt: BTreeMap::new(),
                };
                (id, n)
            })
            .collect();
        Self {
            nodes,
            queue: Vec::new(),
            now: 0,
            cut: BTreeSet::new(),
            held: BTreeSet::new(),
            quiet: false,
            stamp: false,
            campaigns: BTreeMap::new(),
            out: Vec::new(),
        }
    }

    /// The trace so far, emptied.
    pub fn take_trace(&mut self) -> String {
        let mut s = String::new();
        for (_, l) in self.out.drain(..) {
            s.push_str(&l);
            s.push('\n');
        }
        s
    }

    fn prefix(&self) -> String {
        if self.stamp {
            format!("{:>6}ms ", self.now / MS)
        } else {
            String::new()
        }
    }

    /// A trace line of its own.
    pub fn line(&mut self, s: String) {
        let p = self.prefix();
        self.out.push((None, format!("{p}{s}")));
    }

    /// `nN: WHAT ITEM`, joined with the line before when that one is the same node's same
    /// kind of action: `n2: write 4@2 5@2`.
    fn item(&mut self, id: NodeId, what: &'static str, item: String) {
        if let Some((Some(k), l)) = self.out.last_mut() {
            if *k == (id, what) {
                l.push(' ');
                l.push_str(&item);
                return;
            }
        }
        let p = self.prefix();
        self.out
            .push((Some((id, what)), format!("{p}n{id}: {what} {item}")));
    }

    pub fn up(&self) -> Vec<NodeId> {
        self.nodes
            .values()
            .filter(|n| n.r.is_some())
            .map(|n| n.id)
            .collect()
    }

    /// Runs node `id`'s actions until it has none left.
    pub fn drain(&mut self, id: NodeId) {
        for _ in 0..10_000 {
            let Some(acts) = self
                .nodes
                .get_mut(&id)
                .and_then(|n| n.r.as_mut())
                .map(|r| r.take_actions())
            else {
                return;
            };
            if acts.is_empty() {
                return;
            }
            let mut written = Vec::new();
            for a in acts {
                self.handle(id, a, &mut written);
            }
            if !written.is_empty() {
                let now = self.now;
                if let Some(r) = self.nodes.get_mut(&id).and_then(|n| n.r.as_mut()) {
                    r.persisted(now, &written);
                }
            }
        }
        panic!("node {id} never stops acting");
    }

    pub fn drain_all(&mut self) {
        for id in self.up() {
            self.drain(id);
        }
    }

    fn handle(&mut self, id: NodeId, a: Action, written: &mut Vec<(Seq, u64, u64)>) {
        let n = self.nodes.get_mut(&id).expect("node");
        let stalled = n.manual && (!n.pending.is_empty() || !n.blocked.is_empty());
        match &a {
            Action::Write(e) => {
                let e = e.clone();
                n.mem.insert(
                    e.seq,
                    Held {
                        entry: e.clone(),
                        committed: n.mem.get(&e.seq).is_some_and(|h| h.committed),
                        durable: false,
                    },
                );
                if n.manual {
                    n.pending.push(a);
                    self.item(id, "write (unsynced)", render::entry(&e));
                } else {
                    disk_op(n, a, written);
                    self.item(id, "write", render::entry(&e));
                }
            }
            Action::SaveHard(_) | Action::SaveMembership(_) | Action::Compact { .. } => {
                let text = match &a {
                    Action::SaveHard(h) => Some(("save", hard(h))),
                    Action::SaveMembership(m) => Some((
                        "save membership",
                        format!("v{}.{} voters={:?}", m.version.0, m.version.1, m.voters),
                    )),
                    Action::Compact { base, .. } => Some(("compact", format!("below {base}"))),
                    _ => None,
                };
                if let Action::Compact { base, .. } = &a {
                    let base = *base;
                    n.mem = n.mem.split_off(&base);
                }
                if n.manual {
                    n.pending.push(a);
                } else {
                    disk_op(n, a, written);
                }
                if let Some((what, s)) = text {
                    if !(self.quiet && what.starts_with("save")) {
                        self.item(id, what, s);
                    }
                }
            }
            Action::Send {
                msg: Msg::Append { .. },
                ..
            }
            | Action::Result { .. }
            | Action::Unknown { .. }
            | Action::Committed(_)
            | Action::Role { .. }
            | Action::Serving { .. } => self.execute(id, a),
            _ if stalled => n.blocked.push_back(a),
            _ => self.execute(id, a),
        }
    }

    /// Carries out an action that is not a disk operation.
    fn execute(&mut self, id: NodeId, a: Action) {
        let now = self.now;
        let n = self.nodes.get_mut(&id).expect("node");
        match a {
            Action::Send { to, msg } => {
                match &msg {
                    Msg::Vote { term, head, .. }
                        if self.campaigns.get(&id).is_none_or(|c| c.term != *term) =>
                    {
                        let own_start = n
                            .pending
                            .iter()
                            .rev()
                            .find_map(|a| match a {
                                Action::SaveHard(h) => Some(h.leader_start),
                                _ => None,
                            })
                            .unwrap_or(n.disk.hard.leader_start);
                        let own = n
                            .mem
                            .range(*head..)
                            .map(|(&s, h)| (s, (h.entry.clone(), h.committed)))
                            .collect();
                        self.campaigns.insert(
                            id,
                            Campaign {
                                term: *term,
                                head: *head,
                                own,
                                own_start,
                                replies: Vec::new(),
                                merged: false,
                            },
                        );
                    }
                    Msg::Append { term, .. } => {
                        if let Some(c) = self.campaigns.get_mut(&id).filter(|c| c.term == *term) {
                            c.merged = true;
                        }
                    }
                    _ => {}
                }
                if !(self.quiet && render::is_chatter(&msg)) {
                    self.line(format!("n{id}>n{to} {}", render::msg(&msg)));
                }
                self.queue.push(Queued { from: id, to, msg });
            }
            Action::Committed(e) => {
                if let Some(h) = n.mem.get_mut(&e.seq) {
                    h.committed = true;
                }
                self.item(id, "commit", e.seq.to_string());
            }
            Action::Apply(e) => {
                match &e.body {
                    Body::Parallel { ranges, .. } => {
                        for r in ranges {
                            for b in r.start..r.end.min(r.start + 64) {
                                n.state.insert(b, e.eid);
                            }
                        }
                    }
                    Body::Dependent { write_set, .. } => {
                        for &k in write_set {
                            n.state.insert(k, e.eid);
                        }
                    }
                    Body::Null => {}
                }
                n.applied.insert(e.seq);
                let r = n.r.as_mut().expect("up");
                r.applied(e.seq).expect("applied");
                self.item(id, "apply", e.seq.to_string());
            }
            Action::Result { eid, seq, outcome } => {
                self.line(format!(
                    "n{id}: result {} at slot {seq}: {outcome:?}",
                    render::eid(eid)
                ));
            }
            Action::Unknown { eid, seq } => {
                self.line(format!(
                    "n{id}: result {} at slot {seq}: Unknown",
                    render::eid(eid)
                ));
            }
            Action::Role { role, term } => {
                self.line(format!("n{id}: role {role:?} t{term}"));
            }
            Action::Serving { term, start } => {
                self.line(format!("n{id}: serving t{term} from slot {start}"));
            }
            Action::Snapshot { to } => {
                let r = n.r.as_mut().expect("up");
                let (base, scope) = (r.applied_head(), r.image_scope(to));
                let (part, img, what) = match scope {
                    Some((from, f)) => {
                        let keys: BTreeSet<u64> = n
                            .state
                            .keys()
                            .copied()
                            .filter(|k| {
                                f.keys.contains(k)
                                    || f.blocks.iter().any(|r| (r.start..r.end).contains(k))
                            })
                            .collect();
                        let img = image(&n.state, Some((&f.blocks, &f.keys)), &keys);
                        (
                            Some(from),
                            img,
                            format!("partial (what slots {from}..{base} wrote)"),
                        )
                    }
                    None => {
                        let keys = n.state.keys().copied().collect();
                        (None, image(&n.state, None, &keys), "whole".to_string())
                    }
                };
                let len = img.len();
                r.snapshot_ready(now, to, base, part, img);
                self.line(format!(
                    "n{id}: image for n{to}: {what}, base {base}, {len} bytes"
                ));
            }
            Action::Install { base, image, part } => {
                install(&mut n.state, &image, part);
                n.ckpt = n.state.clone();
                n.applied.retain(|&s| s >= base);
                n.mem = n.mem.split_off(&base);
                let r = n.r.as_mut().expect("up");
                r.installed(now, base).expect("installed");
                self.line(format!(
                    "n{id}: install {} image, base {base}",
                    if part { "partial" } else { "whole" }
                ));
            }
            other => self.line(format!("n{id}: unexpected action {other:?}")),
        }
    }

    /// Makes node `id`'s pending disk operations durable, tells its replica, and runs the
    /// actions that waited for them.
    pub fn persist(&mut self, id: NodeId) {
        let now = self.now;
        let n = self.nodes.get_mut(&id).expect("node");
        if n.r.is_none() {
            return;
        }
        let ops = std::mem::take(&mut n.pending);
        let mut written = Vec::new();
        let mut synced = Vec::new();
        for a in ops {
            if let Action::Write(e) = &a {
                synced.push(render::entry(e));
            }
            disk_op(n, a, &mut written);
        }
        if !written.is_empty() {
            n.r.as_mut().expect("up").persisted(now, &written);
        }
        if !synced.is_empty() {
            self.line(format!("n{id}: synced {}", synced.join(" ")));
        }
        let blocked = std::mem::take(&mut self.nodes.get_mut(&id).expect("node").blocked);
        for a in blocked {
            self.execute(id, a);
        }
        self.drain(id);
    }

    /// Whether a queued message may go now: `Some(false)` if its link is cut (it is
    /// lost), `None` if its link is held and the delivery is not `explicit`.
    fn fate(&self, q: &Queued, explicit: bool) -> Option<bool> {
        if self.cut.contains(&(q.from, q.to)) {
            return Some(false);
        }
        if !explicit && self.held.contains(&(q.from, q.to)) {
            return None;
        }
        Some(true)
    }

    /// Delivers (or loses, on a cut link or to a crashed node) the queued messages at
    /// `picks` (indexes, ascending), draining each receiver after its message.
    pub fn deliver(&mut self, picks: &[usize], explicit: bool) {
        let mut taken = Vec::new();
        for &i in picks.iter().rev() {
            taken.push(self.queue.remove(i));
        }
        taken.reverse();
        for q in taken {
            match self.fate(&q, explicit) {
                Some(true) => {}
                Some(false) => {
                    if !(self.quiet && render::is_chatter(&q.msg)) {
                        self.line(format!(
                            "lost n{}>n{} {} (partitioned)",
                            q.from,
                            q.to,
                            render::msg(&q.msg)
                        ));
                    }
                    continue;
                }
                None => {
                    self.queue.push(q);
                    continue;
                }
            }
            let now = self.now;
            let Some(r) = self.nodes.get_mut(&q.to).and_then(|n| n.r.as_mut()) else {
                if !(self.quiet && render::is_chatter(&q.msg)) {
                    self.line(format!(
                        "lost n{}>n{} {} (n{} is down)",
                        q.from,
                        q.to,
                        render::msg(&q.msg),
                        q.to
                    ));
                }
                continue;
            };
            if let Msg::VoteReply {
                term,
                granted: true,
                entries,
                leader_start,
            } = &q.msg
            {
                if let Some(c) = self
                    .campaigns
                    .get_mut(&q.to)
                    .filter(|c| c.term == *term && !c.merged)
                {
                    c.replies.push((q.from, entries.clone(), *leader_start));
                }
            }
            r.receive(now, q.from, q.msg);
            self.drain(q.to);
        }
    }

    /// Delivers every message not held, round after round, until none is left.
    pub fn stabilize(&mut self) -> Result<(), String> {
        for _ in 0..1000 {
            self.drain_all();
            let picks: Vec<usize> = (0..self.queue.len())
                .filter(|&i| self.fate(&self.queue[i], false).is_some())
                .collect();
            if picks.is_empty() {
                return Ok(());
            }
            self.deliver(&picks, false);
        }
        Err("the network never settles".into())
    }

    /// Advances the clock by `dt` and ticks every node that is up.
    pub fn tick_all(&mut self, dt: Nanos) {
        self.now += dt;
        for id in self.up() {
            let now = self.now;
            self.nodes
                .get_mut(&id)
                .unwrap()
                .r
                .as_mut()
                .unwrap()
                .tick(now);
            self.drain(id);
        }
    }

    /// The node's replica crashes: what was not synced is lost, and so are the messages
    /// queued to or from it.
    pub fn crash(&mut self, id: NodeId) -> usize {
        let n = self.nodes.get_mut(&id).expect("node");
        n.r = None;
        n.pending.clear();
        n.blocked.clear();
        n.mem.clear();
        n.applied.clear();
        n.state.clear();
        let before = self.queue.len();
        self.queue.retain(|q| q.from != id && q.to != id);
        before - self.queue.len()
    }

    /// The node restarts from its disk and its state machine's durable image.
    pub fn restart(&mut self, id: NodeId) {
        let now = self.now;
        let n = self.nodes.get_mut(&id).expect("node");
        let entries: Vec<Entry> = n.disk.entries.values().cloned().collect();
        let r = OooReplica::recover(
            n.cfg.clone(),
            n.disk.hard,
            n.disk.membership.clone(),
            entries.clone(),
            now,
        );
        let head = r.committed_head();
        n.mem = entries
            .into_iter()
            .filter(|e| e.seq >= r.base())
            .map(|e| {
                let committed = e.seq < head;
                (
                    e.seq,
                    Held {
                        entry: e,
                        committed,
                        durable: true,
                    },
                )
            })
            .collect();
        n.state = n.ckpt.clone();
        n.applied.clear();
        n.r = Some(r);
        self.drain(id);
    }
}

/// `term=T vote=V ...` of a saved hard state.
fn hard(h: &Hard) -> String {
    let mut s = format!(
        "term={} vote={} leader-start={}@t{}",
        h.term,
        h.voted_for.map_or("-".into(), |v| v.to_string()),
        h.leader_start.1,
        h.leader_start.0
    );
    if h.committed_head != 0 {
        s.push_str(&format!(" committed-head={}", h.committed_head));
    }
    if h.base != 0 {
        s.push_str(&format!(" base={}", h.base));
    }
    if h.lost_below != 0 {
        s.push_str(&format!(" lost-below={}", h.lost_below));
    }
    s
}

fn disk_op(n: &mut Node, a: Action, written: &mut Vec<(Seq, u64, u64)>) {
    match a {
        Action::Write(e) => {
            written.push((e.seq, e.eid, e.term));
            if let Some(h) = n.mem.get_mut(&e.seq) {
                if h.entry == e {
                    h.durable = true;
                }
            }
            n.disk.entries.insert(e.seq, e);
        }
        Action::SaveHard(h) => n.disk.hard = h,
        Action::SaveMembership(m) => n.disk.membership = Some(m),
        Action::Compact { live, .. } => {
            n.disk.entries = live.into_iter().map(|e| (e.seq, e)).collect();
            // The image the compaction relies on is the state as it stands.
            n.ckpt = n.state.clone();
        }
        _ => unreachable!("not a disk operation"),
    }
}

fn put(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// An image of the state machine: the scope it covers (none: all of it), then pairs.
fn image(
    state: &BTreeMap<u64, u64>,
    scope: Option<(&[chorus_core::ooo::parallel::BlockRange], &[u64])>,
    keys: &BTreeSet<u64>,
) -> Vec<u8> {
    let mut out = Vec::new();
    let (blocks, ks) = scope.unwrap_or((&[], &[]));
    put(&mut out, blocks.len() as u64);
    for r in blocks {
        put(&mut out, r.start);
        put(&mut out, r.end);
    }
    put(&mut out, ks.len() as u64);
    for &k in ks {
        put(&mut out, k);
    }
    for k in keys {
        put(&mut out, *k);
        put(&mut out, state[k]);
    }
    out
}

fn install(state: &mut BTreeMap<u64, u64>, b: &[u8], part: bool) {
    let u = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    let mut at = 0;
    let nr = u(at) as usize;
    at += 8;
    let mut ranges = Vec::new();
    for _ in 0..nr {
        ranges.push((u(at), u(at + 8)));
        at += 16;
    }
    let nk = u(at) as usize;
    at += 8;
    let mut keys = BTreeSet::new();
    for _ in 0..nk {
        keys.insert(u(at));
        at += 8;
    }
    if part {
        state.retain(|k, _| !keys.contains(k) && !ranges.iter().any(|&(s, e)| (s..e).contains(k)));
    } else {
        state.clear();
    }
    while at < b.len() {
        state.insert(u(at), u(at + 8));
        at += 16;
    }
}
