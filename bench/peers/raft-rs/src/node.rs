//! One replica: the raft thread (a `RawNode` Ready loop with asynchronous ready, as TiKV's
//! raftstore drives it) and the log writer thread (TiKV's async-io `StoreWriter`).
//!
//! Raft thread, each iteration: take every queued event (messages from peers, client
//! proposals, write completions), tick if due, propose the clients' records, then handle
//! one Ready:
//! 1. leader: send `messages()` at once, before its own write;
//! 2. put the new entries in the storage's cache, `advance_append_async`, and queue a write
//!    task (entries, hard state, `persisted_messages()`) for the writer;
//! 3. apply `committed_entries()`, waking the clients waiting on them, `advance_apply_to`.
//!
//! Writer thread: takes every queued task, writes them as one raft-engine `LogBatch` with
//! `Engine::write(batch, sync)`, then sends the tasks' persisted messages (a follower's
//! acknowledgements go out only once its log is synced) and reports the last task's ready
//! number, which the raft thread passes to `on_persist_ready`.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use raft::eraftpb::{Entry, EntryType, HardState, Message};
use raft::{RawNode, StateRole};
use raft_engine::{Engine, LogBatch};

use crate::net::Transport;
use crate::storage::{MsgExt, PeerStorage, HARD_STATE_KEY, REGION};

/// raft's logical clock: heartbeats every tick (100 ms), elections after 10–20 ticks.
pub const TICK: Duration = Duration::from_millis(100);

/// A client's answer: the index its record was committed at, or why it was not.
pub type Reply = tokio::sync::oneshot::Sender<Result<u64, &'static str>>;

pub enum Event {
    Msg(Message),
    /// A client record: `key` (unique per append, stored as the entry's context) and the
    /// payload (the entry's data).
    Propose {
        key: u64,
        data: Vec<u8>,
        reply: Reply,
    },
    /// The writer synced every task up to this ready number.
    Persisted(u64),
    Unreachable(u64),
}

struct WriteTask {
    number: u64,
    entries: Vec<Entry>,
    hard_state: Option<HardState>,
    must_sync: bool,
    messages: Vec<Message>,
}

/// Keys are already unique integers.
#[derive(Default)]
struct IdHasher(u64);
impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }
    fn write(&mut self, _: &[u8]) {
        unreachable!()
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// What the load generator reads: this node's id while it leads, else 0.
#[derive(Default)]
pub struct Shared {
    pub leader: AtomicU64,
}

pub struct Node {
    id: u64,
    raw: RawNode<PeerStorage>,
    transport: Transport,
    writes: Sender<WriteTask>,
    /// (ready number, last log index when it was queued) of write tasks not yet synced.
    unsynced: VecDeque<(u64, u64)>,
    waiters: HashMap<u64, Reply, BuildHasherDefault<IdHasher>>,
    pending: Vec<(u64, Vec<u8>, Reply)>,
    applied: u64,
    shared: Arc<Shared>,
    next_campaign: Instant,
}

pub fn slog_logger() -> slog::Logger {
    struct Stderr;
    impl slog::Drain for Stderr {
        type Ok = ();
        type Err = slog::Never;
        fn log(&self, r: &slog::Record, _: &slog::OwnedKVList) -> Result<(), slog::Never> {
            if r.level().is_at_least(slog::Level::Warning) {
                eprintln!("raft {}: {}", r.level().as_short_str(), r.msg());
            }
            Ok(())
        }
    }
    slog::Logger::root(Stderr, slog::o!())
}

impl Node {
    pub fn new(
        id: u64,
        n: u64,
        engine: Arc<Engine>,
        transport: Transport,
        events: Sender<Event>,
        shared: Arc<Shared>,
    ) -> raft::Result<Node> {
        let storage = PeerStorage::open(engine.clone(), (1..=n).collect())?;
        let cfg = raft::Config {
            id,
            election_tick: 10,
            heartbeat_tick: 1,
            // As TiKV: 1 MiB per MsgAppend, 256 in flight per follower.
            max_size_per_msg: 1 << 20,
            max_inflight_msgs: 256,
            // Several MsgAppends to one follower in one Ready become one.
            batch_append: true,
            // The commit index reaches followers with the next append or heartbeat, not
            // with a message of its own.
            skip_bcast_commit: true,
            ..Default::default()
        };
        cfg.validate()?;
        let raw = RawNode::new(&cfg, storage, &slog_logger())?;
        let (wtx, wrx) = crossbeam_channel::unbounded();
        let t = transport.clone();
        thread::Builder::new()
            .name("raft-write".into())
            .spawn(move || writer(engine, wrx, t, events))
            .expect("spawn writer");
        Ok(Node {
            id,
            raw,
            transport,
            writes: wtx,
            unsynced: VecDeque::new(),
            waiters: HashMap::default(),
            pending: Vec::new(),
            applied: 0,
            shared,
            next_campaign: Instant::now(),
        })
    }

    /// The raft thread's loop; returns when every event sender is gone.
    pub fn run(mut self, events: Receiver<Event>) {
        let mut next_tick = Instant::now() + TICK;
        loop {
            let wait = next_tick.saturating_duration_since(Instant::now());
            match events.recv_timeout(wait) {
                Ok(ev) => {
                    self.handle(ev);
                    while let Ok(ev) = events.try_recv() {
                        self.handle(ev);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
            let now = Instant::now();
            if now >= next_tick {
                self.raw.tick();
                next_tick = now + TICK;
            }
            self.maybe_campaign(now);
            self.propose_pending();
            self.on_ready();
        }
    }

    fn handle(&mut self, ev: Event) {
        match ev {
            Event::Msg(m) => {
                // Messages for another term or from a removed peer are just ignored.
                let _ = self.raw.step(m);
            }
            Event::Propose { key, data, reply } => self.pending.push((key, data, reply)),
            Event::Persisted(number) => {
                let mut upto = None;
                while let Some(&(n, idx)) = self.unsynced.front() {
                    if n > number {
                        break;
                    }
                    upto = Some(idx);
                    self.unsynced.pop_front();
                }
                if let Some(idx) = upto {
                    self.raw.mut_store().on_persisted(idx);
                }
                self.raw.on_persist_ready(number);
            }
            Event::Unreachable(id) => self.raw.report_unreachable(id),
        }
    }

    /// Node 1 makes itself leader once it can reach everyone, and again if it lost.
    fn maybe_campaign(&mut self, now: Instant) {
        if self.id != 1 || self.raw.raft.state == StateRole::Leader || now < self.next_campaign {
            return;
        }
        if !self.transport.all_connected() {
            return;
        }
        if self.raw.raft.state != StateRole::Candidate {
            eprintln!(
                "node 1 campaigns (term {}, leader {})",
                self.raw.raft.term, self.raw.raft.leader_id
            );
            let _ = self.raw.campaign();
        }
        self.next_campaign = now + Duration::from_millis(1500);
    }

    /// The records the clients queued since the last iteration, one entry each; they all go
    /// into the next Ready, so they share its write, its fsync and its MsgAppend.
    fn propose_pending(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let leader = self.raw.raft.state == StateRole::Leader;
        for (key, data, reply) in std::mem::take(&mut self.pending) {
            if !leader {
                let _ = reply.send(Err("not leader"));
                continue;
            }
            match self.raw.propose(key.to_be_bytes().to_vec(), data) {
                Ok(()) => {
                    self.waiters.insert(key, reply);
                }
                Err(_) => {
                    let _ = reply.send(Err("proposal dropped"));
                }
            }
        }
    }

    /// Handles Readies until there is none (usually one per iteration).
    fn on_ready(&mut self) {
        for _ in 0..16 {
            if !self.raw.has_ready() {
                return;
            }
            self.handle_ready();
        }
    }

    fn handle_ready(&mut self) {
        let mut rd = self.raw.ready();
        if let Some(ss) = rd.ss() {
            let leader = if ss.raft_state == StateRole::Leader {
                self.id
            } else {
                0
            };
            self.shared.leader.store(leader, Ordering::Release);
            if ss.raft_state != StateRole::Leader {
                for (_, w) in self.waiters.drain() {
                    let _ = w.send(Err("leadership lost"));
                }
            }
        }
        assert!(rd.snapshot().is_empty(), "this peer never sends snapshots");
        // 1. A leader's messages (appends) go out before its own write: the followers'
        //    fsyncs run alongside the leader's (raft thesis 10.2.1).
        if !rd.messages().is_empty() {
            self.transport.send(rd.take_messages());
        }
        let committed = rd.take_committed_entries();
        // 2. Persist asynchronously: the entries are readable from the cache right away.
        let entries = rd.take_entries();
        let hard_state = rd.hs().cloned();
        let must_sync = rd.must_sync();
        let messages = rd.take_persisted_messages();
        let number = rd.number();
        if !entries.is_empty() {
            self.raw.mut_store().append(&entries);
        }
        if let Some(hs) = &hard_state {
            self.raw.mut_store().set_hard_state(hs.clone());
        }
        self.raw.advance_append_async(rd);
        if !entries.is_empty() || hard_state.is_some() || !messages.is_empty() {
            self.unsynced
                .push_back((number, self.raw.store().last_index()));
            let _ = self.writes.send(WriteTask {
                number,
                entries,
                hard_state,
                must_sync,
                messages,
            });
        }
        // 3. Apply: the records are committed (on a majority's disk, the leader's
        //    included); wake their clients.
        if let Some(last) = committed.last() {
            let last = last.index;
            for e in &committed {
                if e.get_entry_type() != EntryType::EntryNormal || e.context.len() != 8 {
                    continue;
                }
                let key = u64::from_be_bytes(e.context[..].try_into().unwrap());
                if let Some(w) = self.waiters.remove(&key) {
                    let _ = w.send(Ok(e.index));
                }
            }
            self.applied = last;
            self.raw.advance_apply_to(last);
            self.trim_cache();
        }
    }

    /// Keeps what a follower may still need: entries above what every replica has (on the
    /// leader), and anything not yet synced.
    fn trim_cache(&mut self) {
        const KEEP_MAX: usize = 1 << 18;
        let store = self.raw.store();
        if store.cache_len() < 4096 {
            return;
        }
        let mut to = self.applied + 1;
        if self.raw.raft.state == StateRole::Leader && store.cache_len() < KEEP_MAX {
            for (_, p) in self.raw.raft.prs().iter() {
                to = to.min(p.matched + 1);
            }
        }
        self.raw.mut_store().trim_cache(to);
    }
}

/// The log writer thread.
fn writer(
    engine: Arc<Engine>,
    tasks: Receiver<WriteTask>,
    transport: Transport,
    events: Sender<Event>,
) {
    let mut batch = LogBatch::with_capacity(1 << 20);
    while let Ok(first) = tasks.recv() {
        let mut group = vec![first];
        while let Ok(t) = tasks.try_recv() {
            group.push(t);
        }
        let mut sync = false;
        let mut hard_state = None;
        for t in &mut group {
            if !t.entries.is_empty() {
                batch
                    .add_entries::<MsgExt>(REGION, &t.entries)
                    .expect("LogBatch::add_entries");
                sync = true;
            }
            if let Some(hs) = t.hard_state.take() {
                hard_state = Some(hs);
                sync |= t.must_sync;
            }
        }
        // Only the newest hard state matters. A write that only moves the commit index need
        // not be synced (raft-rs's must_sync, etcd's rule too).
        if let Some(hs) = hard_state {
            batch
                .put_message(REGION, HARD_STATE_KEY.to_vec(), &hs)
                .expect("LogBatch::put_message");
        }
        if !batch.is_empty() {
            // Drains the batch: it is reused for the next group.
            engine.write(&mut batch, sync).expect("Engine::write");
        }
        let number = group.last().unwrap().number;
        for t in group {
            if !t.messages.is_empty() {
                transport.send(t.messages);
            }
        }
        if events.send(Event::Persisted(number)).is_err() {
            return;
        }
    }
}
