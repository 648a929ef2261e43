//! Tests of the parent module, by topic. This file holds the harness they share: [`Net`],
//! a network of replicas that delivers every message at once, and helpers for what the
//! tests do again and again (appends, clock steps, cut-off nodes, lost copies).

use std::cell::Cell;

use super::*;
use crate::ooo::parallel::BlockRange;
use crate::replica::Outcome;

mod commit;
mod election;
mod images;
mod lost;
mod membership;
mod merge;
mod reads;
mod resend;

/// Delivers every message at once, in order, with no faults; applies at once to a
/// block map per node (the first block of each range gets the record).
struct Net {
    nodes: BTreeMap<NodeId, OooReplica>,
    results: Vec<(NodeId, u64, Outcome)>,
    applied: BTreeMap<NodeId, Vec<Seq>>,
    state: BTreeMap<NodeId, BTreeMap<u64, Vec<u8>>>,
    /// Images installed: (node, partial, bytes).
    installs: Vec<(NodeId, bool, usize)>,
    now: Nanos,
}

fn image(m: &BTreeMap<u64, Vec<u8>>) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in m {
        out.extend_from_slice(&k.to_le_bytes());
        out.extend_from_slice(&(v.len() as u64).to_le_bytes());
        out.extend_from_slice(v);
    }
    out
}

/// The blocks of `f` (this harness keys its state by a range's first block): the
/// scope's ranges, then the entries within them.
fn image_part(m: &BTreeMap<u64, Vec<u8>>, f: &Footprint) -> Vec<u8> {
    let mut out = (f.blocks.len() as u64).to_le_bytes().to_vec();
    for r in &f.blocks {
        out.extend_from_slice(&r.start.to_le_bytes());
        out.extend_from_slice(&r.end.to_le_bytes());
    }
    let inside: BTreeMap<u64, Vec<u8>> = m
        .iter()
        .filter(|(k, _)| f.blocks.iter().any(|r| (r.start..r.end).contains(*k)))
        .map(|(k, v)| (*k, v.clone()))
        .collect();
    out.extend(image(&inside));
    out
}

fn restore_part(m: &mut BTreeMap<u64, Vec<u8>>, b: &[u8]) {
    let u = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    let n = u(0) as usize;
    for i in 0..n {
        let (start, end) = (u(8 + 16 * i), u(16 + 16 * i));
        m.retain(|k, _| !(start..end).contains(k));
    }
    m.extend(restore(&b[8 + 16 * n..]));
}

fn restore(mut b: &[u8]) -> BTreeMap<u64, Vec<u8>> {
    let mut m = BTreeMap::new();
    while !b.is_empty() {
        let k = u64::from_le_bytes(b[..8].try_into().unwrap());
        let n = u64::from_le_bytes(b[8..16].try_into().unwrap()) as usize;
        m.insert(k, b[16..16 + n].to_vec());
        b = &b[16 + n..];
    }
    m
}

impl Net {
    fn new(n: u64, mode: Mode) -> Self {
        Self::with(n, mode, |_| {})
    }

    fn with(n: u64, mode: Mode, f: impl Fn(&mut OooConfig)) -> Self {
        let voters: Vec<NodeId> = (1..=n).collect();
        let nodes = voters
            .iter()
            .map(|&id| {
                let mut cfg = OooConfig::new(id, voters.clone(), mode);
                f(&mut cfg);
                (id, OooReplica::new(cfg, 0))
            })
            .collect();
        Self {
            nodes,
            results: Vec::new(),
            applied: BTreeMap::new(),
            state: BTreeMap::new(),
            installs: Vec::new(),
            now: 0,
        }
    }

    fn run(&mut self) {
        self.run_with(|_, _, _| true)
    }

    /// Runs until quiet, delivering only the messages `keep` allows.
    fn run_with(&mut self, keep: impl Fn(NodeId, NodeId, &Msg) -> bool) {
        loop {
            let mut msgs = Vec::new();
            let mut progress = false;
            for (&id, r) in &mut self.nodes {
                let mut written = Vec::new();
                for a in r.take_actions() {
                    match a {
                        Action::Write(e) => written.push((e.seq, e.eid, e.term)),
                        Action::Send { to, msg } => msgs.push((id, to, msg)),
                        Action::Result { eid, outcome, .. } => {
                            self.results.push((id, eid, outcome))
                        }
                        Action::Apply(e) => {
                            self.applied.entry(id).or_default().push(e.seq);
                            if let Body::Parallel { ranges, data, .. } = &e.body {
                                let st = self.state.entry(id).or_default();
                                for rg in ranges {
                                    st.insert(rg.start, data.to_vec());
                                }
                            }
                            r.applied(e.seq).expect("apply");
                        }
                        Action::Snapshot { to } => {
                            let st = self.state.entry(id).or_default();
                            let (base, scope) = (r.applied_head(), r.image_scope(to));
                            let (part, img) = match scope {
                                Some((from, f)) => (Some(from), image_part(st, &f)),
                                None => (None, image(st)),
                            };
                            r.snapshot_ready(self.now, to, base, part, img);
                            progress = true;
                        }
                        Action::Install { base, image, part } => {
                            let st = self.state.entry(id).or_default();
                            if part {
                                restore_part(st, &image);
                            } else {
                                *st = restore(&image);
                            }
                            self.installs.push((id, part, image.len()));
                            r.installed(self.now, base).expect("install");
                            progress = true;
                        }
                        _ => {}
                    }
                }
                if !written.is_empty() {
                    r.persisted(self.now, &written);
                    progress = true;
                }
            }
            if msgs.is_empty() && !progress {
                break;
            }
            for (from, to, m) in msgs.into_iter().filter(|(f, t, m)| keep(*f, *t, m)) {
                self.nodes.get_mut(&to).unwrap().receive(self.now, from, m);
            }
        }
    }

    fn elect(&mut self, id: NodeId) {
        self.now += 10_000_000_000;
        self.nodes.get_mut(&id).unwrap().tick(self.now);
        self.run();
        assert!(self.nodes[&id].is_serving());
    }

    /// Node `id`.
    fn node(&mut self, id: NodeId) -> &mut OooReplica {
        self.nodes.get_mut(&id).unwrap()
    }

    /// Appends `data` declaring `declared` through node `id`, at the net's time.
    fn append(
        &mut self,
        id: NodeId,
        declared: Declared,
        data: Vec<u8>,
    ) -> Result<Ticket, OooAppendError> {
        let now = self.now;
        self.node(id).append(now, declared, data)
    }

    /// Node 1 appends one record writing block `block`, at the net's time.
    fn append_block(&mut self, block: u64) -> Ticket {
        self.append(1, blocks(block, 1), vec![1]).unwrap()
    }

    /// Moves the clock on by `dt`, ticks node `id` and runs the net.
    fn tick(&mut self, id: NodeId, dt: Nanos) {
        self.tick_with(id, dt, |_, _, _| true)
    }

    /// [`Net::tick`], delivering only the messages `keep` allows.
    fn tick_with(&mut self, id: NodeId, dt: Nanos, keep: impl Fn(NodeId, NodeId, &Msg) -> bool) {
        self.now += dt;
        let now = self.now;
        self.node(id).tick(now);
        self.run_with(keep);
    }

    /// Moves the clock on by `dt` and ticks every node, without running the net.
    fn tick_all(&mut self, dt: Nanos) {
        self.now += dt;
        let now = self.now;
        for r in self.nodes.values_mut() {
            r.tick(now);
        }
    }

    /// The outcomes reported for append `eid`, by any node, in order.
    fn outcomes(&self, eid: u64) -> Vec<Outcome> {
        self.results
            .iter()
            .filter(|r| r.1 == eid)
            .map(|r| r.2)
            .collect()
    }

    /// Whether node `id` reported append `eid` committed.
    fn committed_on(&self, id: NodeId, eid: u64) -> bool {
        self.results
            .iter()
            .any(|r| r.0 == id && r.1 == eid && r.2 == Outcome::Committed)
    }

    /// Restarts node `id` as after losing the record of slot `lost` on disk: from
    /// [`Hard::after_loss`] and the entries it still holds, configured by default for its
    /// voters and mode.
    fn restart_after_loss(&mut self, id: NodeId, lost: Seq) {
        let r = &self.nodes[&id];
        let survived: Vec<Entry> = r
            .log
            .values()
            .map(|s| s.entry.clone())
            .filter(|e| e.seq != lost)
            .collect();
        let cfg = OooConfig::new(id, r.cfg.voters.clone(), r.cfg.mode);
        let r = OooReplica::recover(cfg, r.hard.after_loss(), None, survived, self.now);
        assert!(r.is_recovering_lost());
        self.nodes.insert(id, r);
    }
}

/// A filter for [`Net::run_with`] that delivers only between the nodes other than `n`.
fn without(n: NodeId) -> impl Fn(NodeId, NodeId, &Msg) -> bool {
    move |f, t, _| f != n && t != n
}

/// Parallel mode: a record writing `len` blocks from `start`.
fn blocks(start: u64, len: u64) -> Declared {
    Declared::Blocks(vec![BlockRange::new(start, len).unwrap()])
}

/// Dependent mode: a transaction reading `read` and writing `write`.
fn txn(read: &[u64], write: &[u64]) -> Declared {
    Declared::Txn {
        read_set: read.to_vec(),
        write_set: write.to_vec(),
    }
}

/// Whether `m` is an append carrying the entry of ticket `t`.
fn carries(m: &Msg, t: &Ticket) -> bool {
    matches!(m, Msg::Append { entries, .. }
        if entries.iter().any(|e| e.seq == t.seq && e.eid == t.eid))
}

/// The messages `acts` sends to `to`.
fn sent(acts: &[Action], to: NodeId) -> impl Iterator<Item = &Msg> {
    acts.iter().filter_map(move |a| match a {
        Action::Send { to: t, msg } if *t == to => Some(msg),
        _ => None,
    })
}

/// Loses the first `n` messages `pick` selects on their way to `to` (to any node when
/// `None`), counting them, and delivers the rest: a filter for [`Net::run_with`] by
/// [`Loss::keep`].
struct Loss<P> {
    n: usize,
    to: Option<NodeId>,
    pick: P,
    lost: Cell<usize>,
}

impl<P: Fn(&Msg) -> bool> Loss<P> {
    fn new(n: usize, to: Option<NodeId>, pick: P) -> Self {
        Self {
            n,
            to,
            pick,
            lost: Cell::new(0),
        }
    }

    fn keep(&self, _from: NodeId, to: NodeId, m: &Msg) -> bool {
        if self.to.is_none_or(|t| t == to) && (self.pick)(m) && self.lost.get() < self.n {
            self.lost.set(self.lost.get() + 1);
            return false;
        }
        true
    }

    /// Messages lost so far.
    fn lost(&self) -> usize {
        self.lost.get()
    }
}

/// Parallel mode, node 1 leading: it appends `a` (block 0), which the followers do
/// not get (until a resend the caller allows), then `b` (blocks 0..2, overlapping
/// `a`) and `c` (block 10), which they do. `conflict_order` says which nodes commit
/// in conflict order. Returns the net and the tickets of `a`, `b`, `c`.
fn withheld_a_then_b_and_c(conflict_order: fn(NodeId) -> bool) -> (Net, [Ticket; 3]) {
    let mut net = Net::with(3, Mode::Parallel { span: 2 }, |c| {
        c.conflict_order = conflict_order(c.id)
    });
    net.elect(1);
    let a = net.append(1, blocks(0, 1), vec![1]).unwrap();
    net.run_with(|_, _, m| !carries(m, &a));
    let b = net.append(1, blocks(0, 2), vec![1]).unwrap();
    let c = net.append(1, blocks(10, 1), vec![1]).unwrap();
    net.run_with(|_, _, m| !carries(m, &a));
    (net, [a, b, c])
}
