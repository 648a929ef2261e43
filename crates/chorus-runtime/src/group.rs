//! One log group hosted by an [`crate::Env`]: the pure replica, its storage, and the
//! driver that executes the replica's actions.
//!
//! # Threads and locks
//!
//! - `core` (a mutex) guards the replica and the table of waiting appenders. Appenders,
//!   transport readers and control calls lock it only to call the replica (microseconds)
//!   and never do IO under it: PALF section 6's point that the append path must not wait
//!   on IO. An appender gets its LSN and CSN under this lock and returns at once.
//! - `io` (a read-write lock) guards the log and meta storage. Only the driver writes;
//!   readers share it. The `fdatasync` runs with *no* lock held
//!   ([`chorus_storage::SyncPoint`]), so reads and appends go on during it: the next
//!   group fills up while the previous one syncs (group commit).
//! - The driver runs on the environment's bounded worker pool; a group is on at most one
//!   worker at a time (the pool's scheduling states), so the replica's actions execute in order.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use chorus_core::format::entry;
use chorus_core::format::entry::EntryIter;
use chorus_core::format::group::{entry_lsn, GroupHeader, GROUP_HEADER_SIZE};
use chorus_core::format::meta::{AccessMode, ConfigVersion, Membership, MetaRecord, NodeId};
use chorus_core::replica::{
    Action, MembershipChange, Message, Nanos, Outcome, Replica, ReplicaConfig, Role,
};
use chorus_core::{Csn, Lsn};
use chorus_storage::fs::FileSystem;
use chorus_storage::log::{Damage, SealedBlock};
use chorus_storage::{LogOptions, LogStorage, MetaStorage, StorageError};
use tokio::sync::{oneshot, watch};

use crate::error::Error;
use crate::lane::{LaneBuf, MAX_LANE_ENTRIES};
use crate::ordered::{self, Answer, Feedback, Note, StepError};
use crate::pool::Pool;
use crate::transport::Transport;

mod api;
pub use api::{AppendFuture, AppendResult, Appended, GroupCounters, GroupStatus, Record, RoleInfo};

/// What one [`Group::round`] left to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stepped {
    /// Nothing: the replica had no actions and no answers (its IO reports, if any,
    /// were taken in this round).
    Idle,
    /// The round wrote the log: [`Group::sync_log`] comes next, before the replica is
    /// told anything of it.
    Wrote,
    /// The round ran without writing; the next round may have work.
    Again,
}

/// An entry's result slot in a lane: its LSN, CSN and where its result goes.
type Slot = (Lsn, Csn, Waiter);

/// An appender's result, ready to send once the round's actions have run.
type Answered = (
    oneshot::Sender<Result<AppendResult, Error>>,
    Result<AppendResult, Error>,
);

/// Where an append's result goes, and when it was appended (for
/// [`GroupCounters::append_latency`]).
struct Waiter {
    tx: oneshot::Sender<Result<AppendResult, Error>>,
    since: Nanos,
}

/// Identity of a log group within an environment (also the log id in its block headers).
pub type GroupId = u64;

pub(crate) struct EnvShared {
    pub node: NodeId,
    pub start: Instant,
    pub transport: std::sync::OnceLock<Arc<dyn Transport>>,
    pub pool: Pool,
    /// The apply workers out-of-order groups share ([`crate::pool::ApplyPool`]).
    pub apply: crate::pool::ApplyPool,
    /// [`crate::EnvConfig::pipelined_sync`].
    pub pipelined_sync: bool,
    /// The threads ordered groups' log syncs run on with pipelined syncs
    /// ([`Group::start_sync`]), so that a group's next batch is written while its last
    /// one syncs; none without.
    pub syncers: crate::pool::ApplyPool,
    pub replica: ReplicaConfig,
    pub log: LogOptions,
    pub fsync_hist: crate::metrics::Histogram,
    /// The timer thread, unparked when a group's timed resend falls due before it would
    /// wake ([`Group::resend_at`]).
    pub timer: std::sync::OnceLock<std::thread::Thread>,
    /// When the timer thread will next wake by itself.
    pub timer_next: AtomicU64,
    /// Free space on the data directory; a leader refuses appends while it is low.
    pub disk: Arc<crate::DiskSpace>,
    /// Groups restarted in place ([`crate::Env::restart_group`]).
    pub restarts: AtomicU64,
    /// The file system groups are on ([`crate::EnvConfig::fs`]).
    pub fs: Arc<dyn FileSystem>,
    /// Settings of the ordered groups' driver step.
    pub step: ordered::StepSettings,
}

impl EnvShared {
    pub fn now(&self) -> Nanos {
        self.start.elapsed().as_nanos() as Nanos
    }

    /// A group's next timed resend is due at `due`: wake the timer thread if it would
    /// sleep past that.
    pub(crate) fn wake_timer_by(&self, due: Nanos) {
        if due < self.timer_next.load(Ordering::SeqCst) {
            if let Some(t) = self.timer.get() {
                t.unpark();
            }
        }
    }
}

struct Core {
    replica: Replica,
    waiters: HashMap<u64, Waiter>,
    /// Reports of IO the replica has not been told yet ([`ordered::take_round`] drains
    /// them). Kept here, not on the driver's stack, so that a group can leave a worker
    /// between its sync and the round that reports it ([`crate::pass`]).
    feedback: Vec<Feedback>,
}

pub(crate) struct Io {
    pub(crate) log: LogStorage,
    meta: MetaStorage,
}

/// Group boundaries of a block, walked from its headers and cached (reads by LSN and
/// `locate` need them; the replica only keeps recent groups in memory).
#[derive(Clone, Copy, Debug)]
struct GroupInfo {
    lsn: Lsn,
    end: Lsn,
    max_csn: Csn,
    entries: u32,
}

#[derive(Default)]
struct ReadIndex {
    blocks: HashMap<u64, Vec<GroupInfo>>,
}

pub(crate) struct Group {
    pub id: GroupId,
    pub dir: PathBuf,
    env: Arc<EnvShared>,
    pub sched: crate::sched::SchedState,
    pub tick_due: AtomicBool,
    pub busy: AtomicBool,
    pub last_tick: AtomicU64,
    /// When the replica's next timed resend is due (`Replica::resend_due`; `u64::MAX`:
    /// none). The timer ticks the group then rather than on its next millisecond, so a
    /// late copy is resent after the timeout it was given, not up to a tick later.
    pub resend_at: AtomicU64,
    /// The log IO is idle (everything written is flushed): small lanes freeze at once.
    io_idle: AtomicBool,
    /// A log sync is in flight on a sync thread ([`Group::start_sync`]): at most one at a
    /// time. Whoever clears it checks for writes made meanwhile and starts the next.
    syncing: AtomicBool,
    /// The lane appenders fill without locks (PALF section 6), if one is open.
    lane: ArcSwapOption<LaneBuf<Slot>>,
    /// Size of the last closed lane, to size the next one's buffers.
    lane_hint: AtomicU64,
    core: Mutex<Core>,
    pub(crate) io: RwLock<Io>,
    /// Damage the scrubber found in a sealed block, for the next round to take
    /// (`crate::scrub`, `Group::take_scrub_damage`).
    pub(crate) scrub_damage: Mutex<Option<(SealedBlock, Damage)>>,
    /// Set after `scrub_damage` is filled, cleared before it is taken: a round looks at
    /// this flag and takes the lock only when damage waits (rounds run once per batch).
    pub(crate) scrub_pending: AtomicBool,
    /// When (env time) a round last warned that it ran longer than a heartbeat interval:
    /// at most one such warning a second.
    slow_warned: AtomicU64,
    index: Mutex<ReadIndex>,
    commit_tx: watch::Sender<Lsn>,
    commit_cv: (Mutex<Lsn>, Condvar),
    /// The readable CSN ([`GroupStatus::readable_csn`]), published after the committed
    /// end it belongs to, so a reader woken by it finds the records in the log.
    readable_tx: watch::Sender<Csn>,
    /// The role, leader and proposal id, published after every round that changed them
    /// (PALF's monitor_role): not only on role changes, as a follower hearing a new
    /// leader keeps its role.
    role_tx: watch::Sender<RoleInfo>,
    /// Why the group stopped (the first reason wins); read on every append without a lock.
    stopped: std::sync::OnceLock<String>,
    /// The group stopped because its disk was full ([`StorageError::is_disk_full`]): the
    /// environment restarts it once space is back ([`crate::Env::restart_group`]).
    pub stopped_by_full_disk: AtomicBool,
    /// When the environment last tried to restart it, [`EnvShared::now`] (0: never).
    pub restart_tried: AtomicU64,
    pub removed: AtomicBool,
    pub counters: GroupCounters,
}

fn storage(group: u64) -> impl Fn(StorageError) -> Error {
    move |source| Error::Storage { group, source }
}

impl Group {
    /// Creates the group's directory, meta and log with the initial membership.
    pub fn create(
        env: Arc<EnvShared>,
        id: GroupId,
        dir: &Path,
        voters: Vec<NodeId>,
        learners: Vec<NodeId>,
        access_mode: AccessMode,
    ) -> Result<Arc<Self>, Error> {
        let fs = env.fs.clone();
        fs.create_dir_all(dir).map_err(|e| Error::Io {
            what: format!("create {}", dir.display()),
            source: e,
        })?;
        let record = MetaRecord {
            log_id: id,
            block_size: env.log.block_size,
            membership: Membership {
                voters,
                learners,
                access_mode,
                ..Membership::default()
            },
            // A group created as a mirror counts as switched once (see
            // `Replica::change_access_mode`).
            access_mode_version: (access_mode != AccessMode::Append) as u64,
            ..MetaRecord::default()
        };
        MetaStorage::create(fs.clone(), dir, &record).map_err(storage(id))?;
        LogStorage::create(fs, dir, env.log, id).map_err(storage(id))?;
        Self::open(env, id, dir)
    }

    /// Opens an existing group from its directory (recovery: PALF section 3.4 and the
    /// piggyback paper's section 5; a damaged range starts the replica in repair mode).
    pub fn open(env: Arc<EnvShared>, id: GroupId, dir: &Path) -> Result<Arc<Self>, Error> {
        let fs = env.fs.clone();
        let (log, report) =
            LogStorage::open_damaged(fs.clone(), dir, env.log, id).map_err(storage(id))?;
        if let Some((lsn, bytes)) = report.torn_tail {
            tracing::info!(group = id, lsn, bytes, "cut a torn log tail");
        }
        let (meta, _) = MetaStorage::open(fs, dir).map_err(storage(id))?;
        let replica = build_replica(&env, id, &log, &meta)?;
        let committed = replica.committed_end();
        let readable = replica.committed_csn();
        let role = role_info(&replica);
        let g = Arc::new(Self {
            id,
            dir: dir.to_path_buf(),
            env,
            sched: Default::default(),
            tick_due: AtomicBool::new(true),
            busy: AtomicBool::new(false),
            last_tick: AtomicU64::new(0),
            resend_at: AtomicU64::new(u64::MAX),
            io_idle: AtomicBool::new(true),
            syncing: AtomicBool::new(false),
            lane: ArcSwapOption::empty(),
            lane_hint: AtomicU64::new(0),
            core: Mutex::new(Core {
                replica,
                waiters: HashMap::new(),
                feedback: Vec::new(),
            }),
            io: RwLock::new(Io { log, meta }),
            index: Mutex::new(ReadIndex::default()),
            commit_tx: watch::Sender::new(committed),
            commit_cv: (Mutex::new(committed), Condvar::new()),
            readable_tx: watch::Sender::new(readable),
            role_tx: watch::Sender::new(role),
            stopped: std::sync::OnceLock::new(),
            stopped_by_full_disk: AtomicBool::new(false),
            restart_tried: AtomicU64::new(0),
            removed: AtomicBool::new(false),
            scrub_damage: Mutex::new(None),
            scrub_pending: AtomicBool::new(false),
            slow_warned: AtomicU64::new(0),
            counters: GroupCounters::default(),
        });
        Ok(g)
    }

    pub(crate) fn schedule(self: &Arc<Self>) {
        self.env.pool.schedule(self);
    }

    /// A message from a peer.
    pub fn deliver(self: &Arc<Self>, from: NodeId, msg: Message) {
        // On a low disk a follower takes no new log (`crate::disk`): the message goes as
        // if lost (heartbeats, with no groups, still arrive, so it keeps its leader).
        if let Message::Append { groups, .. } = &msg {
            if !groups.is_empty() && self.env.disk.decline() {
                return;
            }
        }
        let now = self.env.now();
        let mut c = self.core.lock().expect("core");
        self.close_lane(&mut c, now);
        c.replica.receive(now, from, msg);
        let wake = c.replica.has_actions();
        drop(c);
        if wake {
            self.schedule();
        }
    }

    /// The driver: steps the replica ([`crate::ordered`]) until it has nothing to do, on
    /// a pool worker, syncing after each round that wrote. A worker that took several
    /// groups at once steps them together instead ([`crate::pass`]).
    pub fn run(self: &Arc<Self>) {
        let mut rounds = 0u32;
        loop {
            rounds += 1;
            if rounds > 10_000 {
                // Let other groups have the worker; come back later.
                self.schedule();
                return;
            }
            match self.round() {
                Stepped::Idle => return,
                Stepped::Again => {}
                Stepped::Wrote => {
                    if !self.sync_after_write() {
                        return;
                    }
                }
            }
        }
    }

    /// One round of the driver: the IO reports since the last round and a tick if due
    /// go to the replica, and its actions run ([`ordered::take_round`],
    /// [`ordered::execute`]). Appenders whose outcome the round decided are answered
    /// after its actions. A round that wrote returns [`Stepped::Wrote`]: what it wrote
    /// is not durable, and the replica is told nothing of it, until [`Group::sync_log`].
    pub(crate) fn round(self: &Arc<Self>) -> Stepped {
        // Everything the driver logs carries the group, the node and the proposal id.
        let span = tracing::debug_span!(
            "group",
            group = self.id,
            node = self.env.node,
            pid = tracing::field::Empty
        );
        let _entered = span.enter();
        if let Err(e) = self.take_scrub_damage() {
            self.storage_failed(e);
            return Stepped::Idle;
        }
        let now = self.env.now();
        let mut results = Vec::new();
        let role;
        let actions = {
            let mut c = self.core.lock().expect("core");
            // The group commit point: whatever appenders put in the lane while the last
            // IO ran becomes one group now.
            self.close_lane(&mut c, now);
            span.record("pid", c.replica.proposal_id());
            let tick = self.tick_due.swap(false, Ordering::AcqRel);
            let mut feedback = std::mem::take(&mut c.feedback);
            let round = ordered::take_round(&mut c.replica, now, &mut feedback, tick);
            // Keep the (now empty) allocation for the next reports.
            c.feedback = feedback;
            if tick {
                self.last_tick.store(now, Ordering::Relaxed);
            }
            let answered = self.env.now();
            for answer in round.answers {
                self.answered(&mut c, answer, answered, &mut results);
            }
            self.busy
                .store(c.replica.pending_appends() > 0, Ordering::Relaxed);
            self.io_idle.store(
                c.replica.flushed_end() == c.replica.end_lsn(),
                Ordering::Relaxed,
            );
            let due = c.replica.resend_due().unwrap_or(u64::MAX);
            if self.resend_at.swap(due, Ordering::SeqCst) != due {
                self.env.wake_timer_by(due);
            }
            role = role_info(&c.replica);
            round.actions
        };
        if actions.is_empty() && results.is_empty() {
            self.publish_role(role);
            return Stepped::Idle;
        }
        let started = self.env.now();
        let (count, reads) = (
            actions.len(),
            actions
                .iter()
                .filter(|a| matches!(a, Action::ReadLog { .. }))
                .count(),
        );
        let executed = ordered::execute(actions, &mut GroupHost(self), &self.env.step);
        self.warn_if_slow(started, count, reads);
        let done = match executed {
            Ok(done) => done,
            Err(e) => {
                self.storage_failed(match e {
                    StepError::Storage(source) => Error::Storage {
                        group: self.id,
                        source,
                    },
                    StepError::Broken(reason) => Error::Stopped {
                        group: self.id,
                        reason,
                    },
                });
                return Stepped::Idle;
            }
        };
        if !done.feedback.is_empty() {
            self.core
                .lock()
                .expect("core")
                .feedback
                .extend(done.feedback);
        }
        // After the round's actions (a new leader's first writes, a deposed one's
        // answers), as the replica stood when the round was taken.
        self.publish_role(role);
        for (tx, r) in results {
            let _ = tx.send(r);
        }
        if done.restart {
            if let Err(e) = self.restart_replica() {
                self.storage_failed(e);
                return Stepped::Idle;
            }
            return Stepped::Again;
        }
        if done.wrote {
            Stepped::Wrote
        } else {
            Stepped::Again
        }
    }

    /// Warns when a round's actions, run from `started`, took longer than a heartbeat
    /// interval: meanwhile this replica sent no heartbeat, vote or acknowledgement, so
    /// its peers may take it for gone (a leader's followers campaign after a lease).
    fn warn_if_slow(&self, started: Nanos, actions: usize, log_reads: usize) {
        let now = self.env.now();
        let took = now.saturating_sub(started);
        if took <= self.env.replica.heartbeat_interval {
            return;
        }
        self.counters.slow_rounds.fetch_add(1, Ordering::Relaxed);
        let last = self.slow_warned.load(Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) < 1_000_000_000 {
            return;
        }
        self.slow_warned.store(now, Ordering::Relaxed);
        tracing::warn!(
            group = self.id,
            node = self.env.node,
            took_ms = took / 1_000_000,
            actions,
            log_reads,
            "a round ran longer than a heartbeat interval"
        );
    }

    /// After a round that wrote: with pipelined syncs, starts one on a sync thread (the
    /// next rounds may write the next batch meanwhile, see `crate::ordered`); without,
    /// syncs here. False when the sync failed (the group stops).
    pub(crate) fn sync_after_write(self: &Arc<Self>) -> bool {
        if self.env.pipelined_sync {
            self.start_sync();
            true
        } else {
            self.sync_once()
        }
    }

    /// Starts a sync of the log on a sync thread, unless one is in flight (that one
    /// starts the next when it ends, for what was written meanwhile). Pipelined group
    /// commit, as PALF's IO workers do it: the group goes on with rounds, and may write
    /// its next batch, while the last batch syncs. Each sync covers the log up to the
    /// point taken when it began and is reported ([`Feedback::Flushed`]) only up to
    /// there ([`ordered::sync_finished`]), so nothing written during a sync is
    /// acknowledged or voted before a sync of its own; the replica learns of each sync
    /// in the group's next round, which the sync thread schedules.
    pub(crate) fn start_sync(self: &Arc<Self>) {
        if self.syncing.swap(true, Ordering::AcqRel) {
            return;
        }
        let g = self.clone();
        self.env.syncers.submit(Box::new(move || g.sync_loop()));
    }

    /// A sync thread's part: syncs, then again while more was written meanwhile; then
    /// wakes the group for its reports.
    fn sync_loop(self: &Arc<Self>) {
        loop {
            let ok = self.sync_once();
            self.syncing.store(false, Ordering::SeqCst);
            if !ok {
                break;
            }
            // A round that wrote while this sync ran found it in flight and left its
            // batch to us (it saw `syncing` set after its write, so its write is seen
            // here; or it saw it clear and started a sync of its own, which the swap
            // below then finds).
            let more = {
                let io = self.io.read().expect("io");
                io.log.end_lsn() > io.log.flushed_end()
            };
            if !more || self.syncing.swap(true, Ordering::AcqRel) {
                break;
            }
        }
        self.schedule();
    }

    /// One `fdatasync` of the log up to its end now; queues [`Feedback::Flushed`] for
    /// the next round. Returns false when the sync failed (the group stops).
    fn sync_once(&self) -> bool {
        let t0 = Instant::now();
        let point = self.io.read().expect("io").log.sync_point();
        let r = point.and_then(|p| {
            #[cfg(feature = "broken")]
            let r = if self.env.step.broken_skip_fsync {
                Ok(())
            } else {
                p.sync()
            };
            #[cfg(not(feature = "broken"))]
            let r = p.sync();
            let mut io = self.io.write().expect("io");
            ordered::sync_finished(&mut io.log, &p, r, &self.env.step)
        });
        let took = t0.elapsed().as_nanos() as u64;
        self.counters.fsyncs.fetch_add(1, Ordering::Relaxed);
        self.counters.fsync_nanos.fetch_add(took, Ordering::Relaxed);
        self.env.fsync_hist.record(took);
        match r {
            Ok(flushed) => {
                self.core.lock().expect("core").feedback.push(flushed);
                true
            }
            Err(e) => {
                self.storage_failed(Error::Storage {
                    group: self.id,
                    source: e,
                });
                false
            }
        }
    }

    /// Routes an answer to its appender's waiter (under the core lock; the result is
    /// sent once the round's actions have run).
    fn answered(&self, c: &mut Core, answer: Answer, now: Nanos, results: &mut Vec<Answered>) {
        match answer {
            Answer::Result {
                id,
                lsn,
                csn,
                outcome,
            } => {
                match outcome {
                    Outcome::Committed => &self.counters.committed,
                    Outcome::Failed => &self.counters.failed,
                }
                .fetch_add(1, Ordering::Relaxed);
                if let Some(w) = c.waiters.remove(&id) {
                    self.counters
                        .append_latency
                        .record(now.saturating_sub(w.since));
                    results.push((w.tx, Ok(AppendResult { lsn, csn, outcome })));
                }
            }
            Answer::Unknown { id, lsn } => {
                self.counters.unknown.fetch_add(1, Ordering::Relaxed);
                if let Some(w) = c.waiters.remove(&id) {
                    results.push((
                        w.tx,
                        Err(Error::OutcomeUnknown {
                            group: self.id,
                            lsn,
                        }),
                    ));
                }
            }
        }
    }

    /// Publishes a committed end and its readable CSN ([`ordered::Host::committed`]):
    /// the CSN after the end, so that whoever sees the CSN reads with the end.
    fn publish_commit(&self, end: Lsn, csn: Csn) {
        self.commit_tx.send_if_modified(|c| {
            let changed = end > *c;
            *c = (*c).max(end);
            changed
        });
        {
            let (m, cv) = &self.commit_cv;
            let mut c = m.lock().expect("commit");
            *c = (*c).max(end);
            cv.notify_all();
        }
        self.readable_tx.send_if_modified(|c| {
            let changed = csn > *c;
            *c = (*c).max(csn);
            changed
        });
    }

    /// Publishes the replica's role, leader and proposal id if they changed.
    fn publish_role(&self, role: RoleInfo) {
        self.role_tx.send_if_modified(|r| {
            let changed = *r != role;
            *r = role;
            changed
        });
    }

    /// Wakes whoever waits on the readable CSN or the role without changing them: the
    /// group stopped or is removed, which they look at when woken.
    fn wake_watchers(&self) {
        self.readable_tx.send_modify(|_| {});
        self.role_tx.send_modify(|_| {});
    }

    /// Rebuilds the replica from storage (after a repair, a discarded damaged tail, or
    /// damage the scrubber found).
    pub(crate) fn restart_replica(&self) -> Result<(), Error> {
        self.index.lock().expect("index").blocks.clear();
        let io = self.io.read().expect("io");
        let replica = build_replica(&self.env, self.id, &io.log, &io.meta)?;
        drop(io);
        let mut c = self.core.lock().expect("core");
        let now = self.env.now();
        self.close_lane(&mut c, now);
        self.counters
            .gap_resends_before
            .fetch_add(c.replica.gap_resend_requests(), Ordering::Relaxed);
        self.counters
            .timed_resends_before
            .fetch_add(c.replica.timed_resends(), Ordering::Relaxed);
        self.counters
            .rebases_sent_before
            .fetch_add(c.replica.rebases_sent(), Ordering::Relaxed);
        c.replica = replica;
        // Reports for the old incarnation mean nothing to the new one.
        c.feedback.clear();
        // Appends of the old incarnation have no result any more (only a leader has them,
        // and a repairing replica is never leader); their futures report Unknown.
        c.waiters.clear();
        let role = role_info(&c.replica);
        drop(c);
        self.publish_role(role);
        Ok(())
    }

    fn storage_failed(&self, e: Error) {
        tracing::error!(group = self.id, error = %e, "storage failed; the group stops");
        // Marked stopped first, so that an append arriving from now on is refused as not
        // taken (`Error::NotRunning`) rather than by the stepped-down replica.
        let full = matches!(&e, Error::Storage { source, .. } if source.is_disk_full());
        if self.stopped.set(e.to_string()).is_ok() && full {
            self.stopped_by_full_disk.store(true, Ordering::SeqCst);
        }
        let now = self.env.now();
        let mut c = self.core.lock().expect("core");
        self.close_lane(&mut c, now);
        c.replica.storage_failed(now);
        let _ = c.replica.take_actions();
        c.waiters.clear();
        // The replica stepped down; its actions, the role's among them, are dropped.
        let role = role_info(&c.replica);
        drop(c);
        self.publish_role(role);
        self.wake_watchers();
    }

    // ------------------------------------------------------------------ API

    /// Appends a record: the lock-free path through the open lane when it can (see
    /// [`crate::lane`]), otherwise the slow path under the core lock, which closes the
    /// lane, opens the next, and retries (or appends directly for records a lane cannot
    /// take).
    pub fn append(self: &Arc<Self>, data: &[u8], ref_csn: Csn) -> Result<Appended, Error> {
        if let Some(r) = self.stopped.get() {
            return Err(Error::NotRunning {
                group: self.id,
                reason: r.clone(),
            });
        }
        self.check_disk()?;
        let size = entry::entry_size(data.len());
        for attempt in 0.. {
            if let Some(l) = &*self.lane.load() {
                if data.len() <= l.lane.max_record {
                    if let Ok(r) = l.state.reserve(size, ref_csn) {
                        let lsn = l.lane.lsn + GROUP_HEADER_SIZE as u64 + r.offset as u64;
                        let (tx, rx) = oneshot::channel();
                        let since = self.env.now();
                        l.fill(
                            &r,
                            size,
                            |dst| entry::write_entry(dst, r.csn, data),
                            (lsn, r.csn, Waiter { tx, since }),
                        );
                        self.counted(data.len());
                        // Adaptive group replication (PALF section 6): with the log IO
                        // idle and few entries waiting, the group goes out now; otherwise
                        // the driver closes the lane after the IO in progress or at the
                        // freeze interval.
                        if r.index + 1 < self.env.replica.group_factor_threshold as usize
                            && self.io_idle.load(Ordering::Relaxed)
                        {
                            self.schedule();
                        }
                        return Ok(Appended {
                            lsn,
                            csn: r.csn,
                            result: AppendFuture { rx, group: self.id },
                        });
                    }
                }
            }
            // Slow path: close the lane (full, sealed, or absent) and open the next.
            let now = self.env.now();
            let mut c = self.core.lock().expect("core");
            self.close_lane(&mut c, now);
            if attempt < 3 {
                let lane = c.replica.open_lane(now).map_err(|source| Error::Append {
                    group: self.id,
                    source,
                })?;
                if data.len() <= lane.max_record {
                    let hint = self.lane_hint.load(Ordering::Relaxed);
                    let (bytes, entries) = ((hint >> 20) as usize, (hint & 0xF_FFFF) as usize);
                    let buf = LaneBuf::new(
                        lane,
                        (2 * bytes).max(64 << 10).max(size),
                        (2 * entries).clamp(64, MAX_LANE_ENTRIES),
                    );
                    self.lane.store(Some(Arc::new(buf)));
                    let wake = c.replica.has_actions();
                    drop(c);
                    if wake {
                        self.schedule();
                    }
                    continue;
                }
                // Too large for a lane: close it empty and append directly.
                let _ = c.replica.close_lane(now, &lane, Vec::new(), &[]);
            }
            let (tx, rx) = oneshot::channel();
            let t = c
                .replica
                .append(now, data, ref_csn)
                .map_err(|source| Error::Append {
                    group: self.id,
                    source,
                })?;
            c.waiters.insert(t.id, Waiter { tx, since: now });
            let wake = c.replica.has_actions();
            drop(c);
            self.counted(data.len());
            if wake {
                self.schedule();
            }
            return Ok(Appended {
                lsn: t.lsn,
                csn: t.csn,
                result: AppendFuture { rx, group: self.id },
            });
        }
        unreachable!("the loop returns")
    }

    /// Writes are refused before the disk fills ([`crate::disk`]), by a leader only: a
    /// follower answers NotLeader, as always, so clients still find the leader.
    fn check_disk(&self) -> Result<(), Error> {
        if self.env.disk.is_low() {
            let leads = self.core.lock().expect("core").replica.role() == Role::Leader;
            if leads {
                if let Err((free, min_free)) = self.env.disk.check() {
                    return Err(Error::DiskLow {
                        group: self.id,
                        free,
                        min_free,
                    });
                }
            }
        }
        Ok(())
    }

    fn counted(&self, bytes: usize) {
        self.counters.appends.fetch_add(1, Ordering::Relaxed);
        self.counters
            .append_bytes
            .fetch_add(bytes as u64, Ordering::Relaxed);
        self.busy.store(true, Ordering::Relaxed);
    }

    /// Seals the open lane, waits for the copies in flight, and hands its entries to the
    /// replica as one group (their results then come as usual). If the replica refuses
    /// (leadership changed since the lane opened), nothing was written: they failed.
    fn close_lane(&self, c: &mut Core, now: Nanos) {
        let Some(l) = self.lane.swap(None) else {
            return;
        };
        let (n, bytes) = l.state.seal();
        let mut spins = 0u32;
        while !l.state.all_copied(bytes) {
            // An appender between its reservation and the end of its copy: microseconds,
            // unless it was preempted.
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        let (body, slots) = l.take(n, bytes).expect("sealed, copied, taken once");
        self.lane_hint
            .store(((bytes as u64) << 20) | n as u64, Ordering::Relaxed);
        let records: Vec<(Lsn, Csn)> = slots.iter().map(|(l, c, _)| (*l, *c)).collect();
        match c.replica.close_lane(now, &l.lane, body, &records) {
            Ok(first) => {
                for (i, (_, _, w)) in slots.into_iter().enumerate() {
                    c.waiters.insert(first + i as u64, w);
                }
            }
            Err(e) => {
                tracing::debug!(group = self.id, entries = n, error = %e, "lane closed unwritten: its appends failed");
                for (lsn, csn, w) in slots {
                    self.counters.failed.fetch_add(1, Ordering::Relaxed);
                    let _ = w.tx.send(Ok(AppendResult {
                        lsn,
                        csn,
                        outcome: Outcome::Failed,
                    }));
                }
            }
        }
    }

    pub fn control<T>(self: &Arc<Self>, f: impl FnOnce(&mut Replica, Nanos) -> T) -> T {
        let now = self.env.now();
        let mut c = self.core.lock().expect("core");
        self.close_lane(&mut c, now);
        let r = f(&mut c.replica, now);
        let wake = c.replica.has_actions();
        drop(c);
        if wake {
            self.schedule();
        }
        r
    }

    /// Mirrors one whole group another log committed ([`Replica::mirror`]), under the
    /// core lock (mirror writes are whole groups: there is no lane to share).
    pub fn mirror(self: &Arc<Self>, group: &[u8]) -> Result<Appended, Error> {
        if let Some(r) = self.stopped.get() {
            return Err(Error::NotRunning {
                group: self.id,
                reason: r.clone(),
            });
        }
        self.check_disk()?;
        let now = self.env.now();
        let mut c = self.core.lock().expect("core");
        self.close_lane(&mut c, now);
        let t = c
            .replica
            .mirror(now, group)
            .map_err(|source| Error::Mirror {
                group: self.id,
                source,
            })?;
        let (tx, rx) = oneshot::channel();
        c.waiters.insert(t.id, Waiter { tx, since: now });
        let wake = c.replica.has_actions();
        drop(c);
        self.counted(group.len());
        if wake {
            self.schedule();
        }
        Ok(Appended {
            lsn: t.lsn,
            csn: t.csn,
            result: AppendFuture { rx, group: self.id },
        })
    }

    pub fn change_access_mode(self: &Arc<Self>, mode: AccessMode) -> Result<ConfigVersion, Error> {
        self.control(|r, now| r.change_access_mode(now, mode))
            .map_err(|source| Error::Change {
                group: self.id,
                source,
            })
    }

    /// Whole committed groups from `from` (a group boundary), as storage holds them: at
    /// least one group, then more while they fit in `max_bytes`. Returns them and the LSN
    /// after them.
    pub fn read_groups(&self, from: Lsn, max_bytes: usize) -> Result<(Vec<Vec<u8>>, Lsn), Error> {
        let committed = self.readable_end();
        if from >= committed {
            return Err(Error::NotCommitted {
                group: self.id,
                lsn: from,
                committed,
            });
        }
        let mut out = Vec::new();
        let mut bytes = 0u64;
        let mut at = from;
        while at < committed {
            let g = self.group_containing(at)?;
            if g.lsn != at {
                return Err(Error::NotAGroup {
                    group: self.id,
                    lsn: at,
                });
            }
            if !out.is_empty() && bytes + (g.end - g.lsn) > max_bytes as u64 {
                break;
            }
            bytes += g.end - g.lsn;
            let (h, body) = self.read_stored_group(g.lsn)?;
            let mut group = h.encode().to_vec();
            group.extend_from_slice(&body);
            out.push(group);
            at = g.end;
        }
        Ok((out, at))
    }

    pub fn change(self: &Arc<Self>, change: MembershipChange, force: bool) -> Result<(), Error> {
        self.control(|r, now| {
            if !force {
                r.check_change(&change)?;
            }
            r.change_membership(now, change)
        })
        .map(|_| ())
        .map_err(|source| Error::Change {
            group: self.id,
            source,
        })
    }

    pub fn transfer(self: &Arc<Self>, to: NodeId, force: bool) -> Result<(), Error> {
        self.control(|r, now| {
            if !force {
                r.check_transfer_to(to)?;
            }
            r.transfer_leader(now, to)
        })
        .map_err(|source| Error::Change {
            group: self.id,
            source,
        })
    }

    pub fn committed_end(&self) -> Lsn {
        *self.commit_tx.borrow()
    }

    pub fn subscribe_tail(&self) -> watch::Receiver<Lsn> {
        self.commit_tx.subscribe()
    }

    pub fn subscribe_role(&self) -> watch::Receiver<RoleInfo> {
        self.role_tx.subscribe()
    }

    pub fn readable_csn(&self) -> Csn {
        *self.readable_tx.borrow()
    }

    pub fn subscribe_readable(&self) -> watch::Receiver<Csn> {
        self.readable_tx.subscribe()
    }

    /// Why the group stopped, if it did.
    pub fn stopped_reason(&self) -> Option<String> {
        self.stopped.get().cloned()
    }

    /// Whether this incarnation was taken off its node (deleted, restarted, or the node
    /// shut down).
    pub fn is_removed(&self) -> bool {
        self.removed.load(Ordering::SeqCst)
    }

    /// Whether the node's workers stopped (the node shuts down).
    pub fn env_stopped(&self) -> bool {
        self.env.pool.is_stopped()
    }

    /// Waits (blocking) until the committed end passes `lsn` or `timeout` elapses.
    pub fn wait_committed_past(&self, lsn: Lsn, timeout: Duration) -> Lsn {
        let (m, cv) = &self.commit_cv;
        let deadline = Instant::now() + timeout;
        let mut c = m.lock().expect("commit");
        while *c <= lsn && !self.removed.load(Ordering::Relaxed) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            c = cv.wait_timeout(c, left).expect("commit").0;
        }
        *c
    }

    pub fn status(&self) -> GroupStatus {
        let c = self.core.lock().expect("core");
        let r = &c.replica;
        let io = self.io.read().expect("io");
        GroupStatus {
            group: self.id,
            node: self.env.node,
            role: RoleInfo {
                role: r.role(),
                proposal_id: r.proposal_id(),
                leader: r.leader(),
            },
            start_lsn: io.log.start_lsn(),
            end_lsn: io.log.end_lsn(),
            flushed_end: io.log.flushed_end(),
            committed_end: r.committed_end(),
            readable_csn: self.readable_csn(),
            membership: r.membership().clone(),
            followers: r.follower_progress(),
            pending_appends: r.pending_appends(),
            stopped: self.stopped.get().cloned(),
            drops: r.drops().iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            gap_resend_requests: self.counters.gap_resends_before.load(Ordering::Relaxed)
                + r.gap_resend_requests(),
            timed_resends: self.counters.timed_resends_before.load(Ordering::Relaxed)
                + r.timed_resends(),
            rebased: self.counters.rebased.load(Ordering::Relaxed),
            repaired: self.counters.repaired.load(Ordering::Relaxed),
            repairing: r.repairing_range(),
            rebases_sent: self.counters.rebases_sent_before.load(Ordering::Relaxed)
                + r.rebases_sent(),
            outcomes_unknown: self.counters.unknown.load(Ordering::Relaxed),
        }
    }

    pub fn wake_all_readers(&self) {
        let (_, cv) = &self.commit_cv;
        cv.notify_all();
    }

    // ------------------------------------------------------------ reads

    /// Walks (and caches) the group boundaries of block `b` up to `upto`.
    fn group_containing(&self, lsn: Lsn) -> Result<GroupInfo, Error> {
        let io = self.io.read().expect("io");
        let log = &io.log;
        if lsn < log.start_lsn() {
            return Err(Error::Trimmed {
                group: self.id,
                lsn,
                start: log.start_lsn(),
            });
        }
        let bs = log.block_size();
        let b = lsn / bs;
        let mut idx = self.index.lock().expect("index");
        let list = idx.blocks.entry(b).or_default();
        if let Some(g) = find(list, lsn) {
            return Ok(g);
        }
        let mut at = list.last().map_or((b * bs).max(log.start_lsn()), |g| g.end);
        while at <= lsn && at < log.end_lsn() && at < (b + 1) * bs {
            let h: GroupHeader = log.read_header(at).map_err(storage(self.id))?;
            list.push(GroupInfo {
                lsn: at,
                end: h.end_lsn(),
                max_csn: h.max_csn,
                entries: h.entry_count,
            });
            at = h.end_lsn();
        }
        find(list, lsn).ok_or(Error::NotARecord {
            group: self.id,
            lsn,
        })
    }

    /// The stored group at `lsn`: its header and body, read under the IO lock.
    fn read_stored_group(&self, lsn: Lsn) -> Result<(GroupHeader, Vec<u8>), Error> {
        self.io
            .read()
            .expect("io")
            .log
            .read_group(lsn)
            .map_err(storage(self.id))
    }

    fn read_group_records(
        &self,
        g: &GroupInfo,
        from: Lsn,
        out: &mut VecDeque<Record>,
    ) -> Result<(), Error> {
        // A position inside the group must be one of its records: a reader stops only
        // at group boundaries and record starts, so anything else is a caller's bad LSN,
        // and skipping to the next record would hide it.
        let not_a_record = Err(Error::NotARecord {
            group: self.id,
            lsn: from,
        });
        if g.entries == 0 {
            return if from > g.lsn { not_a_record } else { Ok(()) };
        }
        let (h, body) = self.read_stored_group(g.lsn)?;
        if h.is_padding() {
            return if from > g.lsn { not_a_record } else { Ok(()) };
        }
        let mut found = from <= g.lsn;
        for e in EntryIter::new(&body) {
            let e = e.map_err(|source| Error::Storage {
                group: self.id,
                source: StorageError::Corrupt {
                    path: self.dir.clone(),
                    file_offset: 0,
                    lsn: g.lsn,
                    source,
                },
            })?;
            let lsn = entry_lsn(g.lsn, e.offset);
            found |= lsn == from;
            if lsn >= from {
                out.push_back(Record {
                    lsn,
                    csn: e.csn,
                    data: e.data.to_vec(),
                });
            }
        }
        if found {
            Ok(())
        } else {
            out.clear();
            not_a_record
        }
    }

    /// The end of what may be read here: committed, and present in the local log.
    fn readable_end(&self) -> Lsn {
        self.committed_end()
            .min(self.io.read().expect("io").log.end_lsn())
    }

    pub fn read(&self, lsn: Lsn) -> Result<Record, Error> {
        let committed = self.readable_end();
        if lsn >= committed {
            return Err(Error::NotCommitted {
                group: self.id,
                lsn,
                committed,
            });
        }
        let g = self.group_containing(lsn)?;
        let mut out = VecDeque::new();
        self.read_group_records(&g, lsn, &mut out)?;
        match out.pop_front() {
            Some(r) if r.lsn == lsn => Ok(r),
            _ => Err(Error::NotARecord {
                group: self.id,
                lsn,
            }),
        }
    }

    /// LSN of the first committed record whose CSN is at least `csn`, if any.
    pub fn locate(&self, csn: Csn) -> Result<Option<Lsn>, Error> {
        let committed = self.readable_end();
        let (blocks, bs, start) = {
            let io = self.io.read().expect("io");
            (io.log.block_ids(), io.log.block_size(), io.log.start_lsn())
        };
        // CSN grows with LSN (PALF section 4.2), so binary-search blocks by the CSN of
        // their first group, then walk one or two blocks.
        let first_csn = |b: u64| -> Result<Option<Csn>, Error> {
            let mut at = (b * bs).max(start);
            while at < committed && at < (b + 1) * bs {
                let g = self.group_containing(at)?;
                if g.entries > 0 {
                    return Ok(Some(g.max_csn));
                }
                at = g.end;
            }
            Ok(None)
        };
        let (mut lo, mut hi) = (0usize, blocks.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            match first_csn(blocks[mid])? {
                Some(c) if c < csn => lo = mid + 1,
                _ => hi = mid,
            }
        }
        let from_block = lo.saturating_sub(1);
        for &b in &blocks[from_block..] {
            let mut at = (b * bs).max(start);
            while at < committed && at < (b + 1) * bs {
                let g = self.group_containing(at)?;
                if g.entries > 0 && g.max_csn >= csn {
                    let mut out = VecDeque::new();
                    self.read_group_records(&g, g.lsn, &mut out)?;
                    if let Some(r) = out.into_iter().find(|r| r.csn >= csn) {
                        return Ok(Some(r.lsn));
                    }
                }
                at = g.end;
            }
        }
        Ok(None)
    }

    /// Reads committed records from `pos` (a record start or group boundary) into `out`,
    /// at most one group; returns the next position.
    pub fn read_next(&self, pos: Lsn, out: &mut VecDeque<Record>) -> Result<Lsn, Error> {
        let committed = self.readable_end();
        let mut pos = pos;
        while pos < committed && out.is_empty() {
            let g = self.group_containing(pos)?;
            self.read_group_records(&g, pos, out)?;
            pos = g.end;
        }
        Ok(pos)
    }

    pub fn trim(self: &Arc<Self>, lsn: Lsn) -> Result<(), Error> {
        let committed = self.committed_end();
        if lsn > committed {
            return Err(Error::NotCommitted {
                group: self.id,
                lsn,
                committed,
            });
        }
        let start = {
            let mut io = self.io.write().expect("io");
            io.log.trim(lsn).map_err(storage(self.id))?;
            io.log.start_lsn()
        };
        self.index.lock().expect("index").blocks.clear();
        // The replica sends a follower behind the new start a Rebase instead of reading
        // what storage no longer holds.
        self.control(|r, now| r.log_trimmed(now, start));
        Ok(())
    }

    pub fn shutdown(&self) {
        self.removed.store(true, Ordering::SeqCst);
        self.core.lock().expect("core").waiters.clear();
        self.wake_all_readers();
        self.wake_watchers();
    }
}

impl crate::pool::Task for Group {
    fn queued(self: Arc<Self>) -> crate::pool::Queued {
        crate::pool::Queued::Ordered(self)
    }

    fn sched(&self) -> &crate::sched::SchedState {
        &self.sched
    }

    fn removed(&self) -> bool {
        self.removed.load(Ordering::Relaxed)
    }

    fn run(self: Arc<Self>) {
        Group::run(&self)
    }
}

/// The runtime's [`ordered::Host`]: the group's storage under its IO lock (the sync runs
/// with no lock held, in [`Group::run`]), the node's transport, and the group's counters,
/// watches and logs.
struct GroupHost<'a>(&'a Arc<Group>);

impl ordered::Host for GroupHost<'_> {
    fn log<R>(&mut self, f: impl FnOnce(&mut LogStorage) -> R) -> R {
        f(&mut self.0.io.write().expect("io").log)
    }

    fn read_log<R>(&mut self, f: impl FnOnce(&LogStorage) -> R) -> R {
        f(&self.0.io.read().expect("io").log)
    }

    fn meta<R>(&mut self, f: impl FnOnce(&mut MetaStorage) -> R) -> R {
        f(&mut self.0.io.write().expect("io").meta)
    }

    fn send(&mut self, to: NodeId, msg: Message) {
        if let Some(t) = self.0.env.transport.get() {
            t.send(to, self.0.id, &msg);
        }
    }

    fn committed(&mut self, end: Lsn, csn: Csn) {
        self.0.publish_commit(end, csn);
    }

    fn note(&mut self, note: Note<'_>) {
        let g = self.0;
        match note {
            Note::Wrote(bytes) => {
                g.io_idle.store(false, Ordering::Relaxed);
                g.counters
                    .log_bytes
                    .fetch_add(bytes as u64, Ordering::Relaxed);
                g.counters.log_writes.fetch_add(1, Ordering::Relaxed);
            }
            Note::Truncated(_) => g.index.lock().expect("index").blocks.clear(),
            Note::MetaSaved => {
                g.counters.meta_saves.fetch_add(1, Ordering::Relaxed);
            }
            Note::Role { role, pid, leader } => {
                // Published at the end of the round ([`Group::publish_role`]), with the
                // leader changes that come without a role change.
                tracing::info!(group = g.id, node = g.env.node, ?role, pid, ?leader, "role");
            }
            Note::ConfigCommitted(version) => {
                tracing::info!(group = g.id, ?version, "membership accepted by a majority");
            }
            Note::Dropped { from, reason } => {
                g.counters.drops.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(group = g.id, ?from, reason, "input dropped");
            }
            Note::Halted(reason) => {
                tracing::error!(group = g.id, %reason, "group halted");
                let _ = g.stopped.set(reason.to_string());
                // Watchers of the role and readable CSN learn of the stop.
                g.wake_watchers();
            }
            Note::Rebased(base) => {
                g.index.lock().expect("index").blocks.clear();
                g.counters.rebased.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    group = g.id,
                    node = g.env.node,
                    lsn = base.end_lsn,
                    "this replica fell behind the leader's log start (trimmed): its log \
                     starts again, empty, there; reads below it are refused as trimmed"
                );
            }
            Note::Repaired { lsn, peer } => {
                g.counters.repaired.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(group = g.id, lsn, peer, "repaired damaged log range");
            }
            Note::RepairRefused { lsn, peer, error } => {
                tracing::warn!(group = g.id, lsn, peer, error = %error, "peer's copy refused");
            }
            Note::DiscardedDamaged(lsn) => {
                tracing::warn!(group = g.id, lsn, "discarded uncommitted damaged log tail");
            }
        }
    }
}

/// The replica's role as the role watch publishes it ([`Replica::role_info`]).
fn role_info(r: &Replica) -> RoleInfo {
    let (role, proposal_id, leader) = r.role_info();
    RoleInfo {
        role,
        proposal_id,
        leader,
    }
}

fn find(list: &[GroupInfo], lsn: Lsn) -> Option<GroupInfo> {
    let i = list.partition_point(|g| g.end <= lsn);
    list.get(i).copied().filter(|g| g.lsn <= lsn)
}

fn build_replica(
    env: &EnvShared,
    id: GroupId,
    log: &LogStorage,
    meta: &MetaStorage,
) -> Result<Replica, Error> {
    let mut cfg = env.replica.clone();
    cfg.id = env.node;
    cfg.block_size = log.block_size();
    cfg.seed = env.node ^ (id << 20) ^ env.start.elapsed().as_nanos() as u64;
    let record = meta.current().clone();
    let now = env.now();
    Ok(match log.damaged() {
        Some(d) => {
            tracing::warn!(group = id, from = d.lsn, to = d.next_valid, detail = %d.detail,
                "log damaged before its tail; repairing from peers");
            Replica::repairing(cfg, record, d.lsn, d.next_valid, log.end_lsn(), now)
        }
        None => Replica::new(cfg, record, log.recovered().map_err(storage(id))?, now),
    })
}
