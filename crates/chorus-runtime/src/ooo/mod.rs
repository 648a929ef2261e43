//! A real driver for one out-of-order group replica: the pure [`OooReplica`] with its
//! [`OooStore`] on the real file system (fdatasync), hosted by an [`crate::Env`] and
//! replicating over its transport.
//!
//! A group costs no thread, port or unbounded queue of its own: its driver
//! (`ooo::driver`) and its store's IO are tasks on the environment's shared IO workers, its
//! state-machine work runs on the environment's shared apply workers, and its messages
//! share the node's connections (`ooo::task` has the shape and the bounds). The driver takes
//! every queued event, lets the replica react and hands the writes (and hard-state saves)
//! of that batch to the IO task in order; the acknowledgements and votes of the batch
//! wait until the IO task reports it — and every batch before it — durable, so nothing
//! is acknowledged or voted before what it depends on is on disk.
//!
//! A leader packs the appends a round took into group entries at the end of the round;
//! with [`OooNodeConfig::freeze_interval`] set, appends taken while its own log write is in
//! flight wait for that write (or the interval) and leave together (PALF section 6's
//! adaptive group replication, as the ordered replica freezes its groups).
//!
//! Applies run on the apply workers (`ooo::apply`) when [`OooNodeConfig::apply_threads`] is
//! one or more (an entry is then cut into at most that many pieces of independent
//! records); with 0 the driver applies itself, one released batch after another.
//!
//! Messages travel on the node's transport ([`crate::transport`]), which every group of
//! every mode shares: one connection per peer, `OooMsg` frames keyed by the group id
//! (`docs/formats.md`, "Replication frames"), the same bounded per-peer queue, the same
//! inline non-blocking sends, and with `[tls]` the same mutual TLS. The environment's
//! router hands each inbound message to its group's driver (`OooNode::deliver`).
//!
//! **Checkpoints and compaction.** When the entries file passes `compact_bytes` (or the
//! state machine's [`OooStateMachine::checkpoint_cost`], if larger), the driver reads how
//! far the replica may compact ([`OooReplica::compactable`]: the applied head, on a
//! leader no further than its live followers' heads, unless the file reached four times
//! its bound), has the state machine make everything
//! applied durable ([`OooStateMachine::checkpoint`], on an apply worker), and then tells
//! the replica, which saves the new base and lets the IO task rewrite the file with the
//! live tail only. A follower behind a leader's base gets the leader's
//! [`OooStateMachine::image`] in pieces (PolarFS section 5.4) and installs it with
//! [`OooStateMachine::restore`], again on an apply worker; when the replica names the
//! part the follower lacks ([`OooReplica::image_scope`]) and the state machine can build
//! it, only that part travels ([`OooStateMachine::image_part`],
//! [`OooStateMachine::restore_part`]).

mod apply;
pub mod driver;
pub mod io;
pub(crate) mod task;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::group::EnvShared;
use crate::metrics::Histogram;
use crate::pool::Task;
use chorus_core::format::meta::NodeId;
use chorus_core::ooo::group::Record;
use chorus_core::ooo::replica::{
    Declared, Entry, Footprint, Membership, Mode, Msg, OooAppendError, OooChangeError, OooConfig,
    OooMembershipChange, OooReadError, OooReadIndexError, OooReplica, OooStats, OooTransferError,
};
use chorus_core::replica::{Outcome, Role};
use chorus_storage::fs::{FileSystem, RealFs};
use chorus_storage::ooo::OooStore;
use driver::{Driver, DriverOutputs, DriverSettings};
use task::{EnvHost, IoTask, Mailbox, OooTask};

/// The smallest frame limit of a node that hosts out-of-order groups: what an
/// out-of-order message may need ([`crate::Env`] raises its transport's limit to at least
/// this). A vote carries at most `vote_bytes` (32 MiB by default) of entries per piece, or
/// one entry of up to 64 MiB; appends and resends are bounded by their batches.
pub const MIN_FRAME_BYTES: u32 = 256 << 20;

/// Settings of an out-of-order node.
#[derive(Clone, Debug)]
pub struct OooNodeConfig {
    /// This node.
    pub id: NodeId,
    /// The group: its messages travel keyed by this id on the node's shared transport.
    pub group: u64,
    /// Every voter the group was created with (this node too, unless it is one of
    /// `others`). Their replication addresses are the node's peers' (the transport's).
    pub voters: Vec<NodeId>,
    /// Replicas that were not voters at creation but may be added by a membership change
    /// ([`OooNode::change_membership`]). Messages go to every voter and every one of
    /// these, and only they are heard. A node listed here starts knowing no membership of
    /// its own and follows whichever leader adds it.
    pub others: Vec<NodeId>,
    /// The group's mode.
    pub mode: Mode,
    /// The group's directory.
    pub dir: PathBuf,
    /// Election timeout.
    pub election_timeout: Duration,
    /// Threads applying committed entries (0: the driver thread applies).
    pub apply_threads: usize,
    /// Bytes per second of streaming catch-up to one follower (0: no limit; pieces are
    /// at most 128 KiB either way).
    pub catchup_rate: u64,
    /// Parallel mode: commit in conflict order ([`OooConfig::conflict_order`]).
    pub conflict_order: bool,
    /// Checkpoint the state machine and compact the entries file once it holds this many
    /// bytes (0: never).
    pub compact_bytes: u64,
    /// Leader: resend a recent slot at once to a follower that acknowledged a slot this
    /// many after it but not that one ([`OooConfig::hole_resend`]; 0: only the periodic
    /// resend).
    pub hole_resend: u64,
    /// Leader: resend an uncommitted slot to a follower that has not acknowledged it
    /// within this many median round trips ([`OooConfig::timed_resend`]; 0: off).
    pub timed_resend: u32,
    /// Leader: how long appends may wait to be packed into a group entry while the
    /// leader's own log write is in flight (zero: appends taken in a driver round are
    /// packed at the end of that round). Adaptive group replication, PALF section 6 (1 ms
    /// there): appends are packed at once when this node's log IO is idle (low
    /// concurrency: no added latency), and otherwise when that write is durable or this
    /// interval has passed (high concurrency: fewer, fuller entries, so fewer frames,
    /// syncs and acknowledgements per append). The cost: followers learn commits from the
    /// next entry, which now leaves later (see `docs/benchmarks/out-of-order.md`).
    pub freeze_interval: Duration,
    /// Bytes of zeros the store keeps written past the end of its entries file, so most
    /// syncs do not grow the file ([`OooStore::set_preallocate`]; 0: none).
    pub preallocate: u64,
    /// Append to the entries file with direct IO where the file system takes it
    /// ([`OooStore::set_direct_io`]; false: through the page cache).
    pub direct_io: bool,
    /// The free-space guard of the disk holding `dir` ([`crate::disk`]; the server passes
    /// its environment's, [`crate::Env::disk_space`]): while it is low, the leader refuses
    /// appends ([`OooNodeError::DiskLow`]). None: no guard.
    pub disk: Option<Arc<crate::DiskSpace>>,
    /// The file system `dir` is on (None: the real one). Tests put a full disk here
    /// ([`chorus_storage::fs::Fillable`]).
    pub fs: Option<Arc<dyn FileSystem>>,
}

/// The state machine of an out-of-order group, as [`OooNode`] drives it.
///
/// Its writes must be blind (a block write, a put): after a restart, or after a
/// checkpoint that caught entries applied out of order past the replica's base, entries
/// from the base on are applied again over an image that may already hold them; blind
/// writes, replayed in an order the apply rules allow, end in the same state.
///
/// It is [`std::any::Any`], so that its embedder gets its own type back from a hosted
/// group ([`crate::env::OooHandle::state`]) for reads of the applied state.
pub trait OooStateMachine: std::any::Any + Send + Sync + 'static {
    /// Applies records of the committed entry at `slot` (the group of records the driver
    /// packed into it; [`chorus_core::ooo::group`]), each with its place in the group, in
    /// group order, once the apply rules released the entry. Called on several threads
    /// at once, for entries that do not conflict and — with two or more apply threads —
    /// for pieces of one entry, each a union of its independent sets
    /// ([`chorus_core::ooo::group::independent_sets`]: no two pieces write a block or key in common), so one
    /// call may carry only some of a slot's records; the slot counts as applied when every
    /// piece has been. NULL slots are not passed. An error stops the node (its state would
    /// no longer follow the log).
    fn apply(&self, slot: u64, records: &[(u32, Record)]) -> std::io::Result<()>;
    /// Makes everything applied before the call durable (a checkpoint).
    fn checkpoint(&self) -> std::io::Result<()>;
    /// Bytes the next checkpoint is expected to write beyond what the applies already
    /// wrote: the size of the whole state for a state machine that checkpoints by
    /// rewriting it (the demo key-value store), 0 (the default) for one whose checkpoint
    /// only syncs what its applies wrote in place (the demo volume). The driver lets the
    /// entries file grow to at least this size past `compact_bytes` before it checkpoints,
    /// so that checkpoints never write more than the log they let go (a store larger than
    /// `compact_bytes` was otherwise rewritten whole every `compact_bytes` of entries).
    /// Called whenever the file is past its bound: keep it cheap.
    fn checkpoint_cost(&self) -> u64 {
        0
    }
    /// An image of the state, holding at least everything applied before the call.
    fn image(&self) -> std::io::Result<Vec<u8>>;
    /// Replaces the whole state with an image from [`OooStateMachine::image`] (another
    /// replica's), durably. A damaged image is refused with an error, the state kept.
    fn restore(&self, image: &[u8]) -> std::io::Result<()>;
    /// A partial image: the state of the blocks and keys `scope` names (those that hold
    /// nothing included, so that installing it clears them), holding at least everything
    /// applied before the call. The leader sends it instead of the whole state to a
    /// follower that lacks only what `scope` covers (PolarFS section 5.4, fast
    /// catch-up); installed with [`OooStateMachine::restore_part`]. `Ok(None)`, the
    /// default: this state machine sends whole images only.
    fn image_part(&self, scope: &Footprint) -> std::io::Result<Option<Vec<u8>>> {
        let _ = scope;
        Ok(None)
    }
    /// Overwrites the part of the state a partial image from
    /// [`OooStateMachine::image_part`] carries, keeps the rest, and makes the whole state
    /// durable, as [`OooStateMachine::checkpoint`] does (the replica drops the slots below
    /// the image's base, the ones this replica applied and had not checkpointed among
    /// them). A damaged image is refused with an error, the state kept. Called only for
    /// images of a state machine whose `image_part` returns some.
    fn restore_part(&self, image: &[u8]) -> std::io::Result<()> {
        let _ = image;
        Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "this state machine does not install partial images",
        ))
    }
    /// Told once, before any apply, when a driver starts on a recovered replica: the
    /// entries below `end` that it applies are replays, and the state may already hold
    /// writes of later slots among them (applied before the restart, not yet
    /// checkpointed). Blind writes do not care; an apply that reads the state (a
    /// checksum of a scrub point) must not trust what it reads there. The default does
    /// nothing.
    fn replaying_below(&self, end: u64) {
        let _ = end;
    }
}

/// Why an append through [`OooNode::append`] did not get a result.
#[derive(Debug, thiserror::Error)]
pub enum OooNodeError {
    /// The replica refused it.
    #[error(transparent)]
    Refused(#[from] OooAppendError),
    /// The node stopped (or crashed on a storage error) before the result was known.
    #[error("the node stopped before the append's result was known")]
    Stopped,
    /// The node had already stopped when the append reached it: the append was not
    /// taken, so another replica may be asked.
    #[error("the node is stopped, the append was not taken")]
    NotRunning,
    /// The leader refused the append, appending nothing, because the file system holding
    /// its data has less free space than its guard's floor ([`crate::disk`]); appends are
    /// taken again once space is freed.
    #[error("append refused, nothing appended: {free} bytes free on the data directory's file system, below min_free_bytes {min_free} (free space; appends resume by themselves)")]
    DiskLow {
        /// Bytes free at the last measurement.
        free: u64,
        /// The floor.
        min_free: u64,
    },
    /// Storage failed when opening.
    #[error(transparent)]
    Storage(#[from] chorus_storage::StorageError),
    /// The slot was compacted by the group before this replica (a deposed leader) learned
    /// which entry committed there: the append may have committed or failed.
    #[error("the result of the append at slot {seq} is unknown: the group compacted the slot before this replica learned its outcome")]
    Unknown {
        /// The append's slot.
        seq: u64,
    },
    /// A thread could not be started.
    #[error("starting the group's threads: {0}")]
    Io(#[from] std::io::Error),
    /// The node hosts a group with this id already (of any mode).
    #[error("group {0} already exists on this node")]
    Exists(u64),
    /// The node's environment is shut down.
    #[error("the node is shut down")]
    Shutdown,
    /// The group's queue of events is full (its driver is far behind): nothing was
    /// appended; retry later.
    #[error("the group's queue is full: nothing appended; retry later")]
    Busy,
}

/// What the driver reports about its replica.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OooStatus {
    /// The group's mode.
    pub mode: Mode,
    /// Role.
    pub role: Role,
    /// Term.
    pub term: u64,
    /// The leader this replica knows of.
    pub leader: Option<NodeId>,
    /// Serving appends.
    pub serving: bool,
    /// First slot not known committed.
    pub committed_head: u64,
    /// First slot not applied.
    pub applied_head: u64,
    /// Every slot below this one is compacted ([`chorus_core::ooo::replica::Hard::base`]).
    pub base: u64,
    /// Recovering entries it lost on disk: following and acknowledging, but neither
    /// voting nor campaigning until it holds them again
    /// ([`chorus_core::ooo::replica::Hard::after_loss`]).
    pub recovering_lost: bool,
    /// The replica's counters.
    pub stats: OooStats,
    /// The driver's counters.
    pub counters: OooCounters,
    /// Leader only (empty otherwise): each follower's first slot not known committed and
    /// first slot not applied, as it last acknowledged them.
    pub followers: Vec<(NodeId, u64, u64)>,
}

/// An out-of-order replica's role as [`OooNode::subscribe_role`] publishes it (PALF's
/// monitor_role, section 3.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OooRole {
    /// Role.
    pub role: Role,
    /// Term.
    pub term: u64,
    /// The leader this replica knows of.
    pub leader: Option<NodeId>,
    /// Leading and serving appends (its merge finished).
    pub serving: bool,
}

impl OooRole {
    /// The role `r` holds now.
    pub fn of(r: &OooReplica) -> Self {
        Self {
            role: r.role(),
            term: r.term(),
            leader: r.leader(),
            serving: r.is_serving(),
        }
    }
}

/// What the driver counted since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OooCounters {
    /// Appends (records) accepted as leader.
    pub appends: u64,
    /// Group entries those appends were packed into.
    pub groups: u64,
    /// Appends (records) reported committed.
    pub committed: u64,
    /// Appends (records) reported failed.
    pub failed: u64,
    /// Entries written to the store.
    pub writes: u64,
    /// fdatasyncs of the entries file (hard-state saves not included).
    pub syncs: u64,
    /// Hard-state saves.
    pub hard_saves: u64,
    /// Messages received and sent.
    pub msgs_in: u64,
    /// Messages sent.
    pub msgs_out: u64,
    /// Entries applied.
    pub applied: u64,
    /// Checkpoints of the state machine taken for compaction.
    pub checkpoints: u64,
    /// Images taken for followers behind the base.
    pub images: u64,
    /// Of those, partial ones ([`OooStateMachine::image_part`]).
    pub partial_images: u64,
    /// Bytes of the images taken.
    pub image_bytes: u64,
    /// Images installed from a leader.
    pub installs: u64,
    /// Of those, partial ones.
    pub partial_installs: u64,
    /// Bytes of the entries file (synced part).
    pub log_bytes: u64,
    /// Every slot below is compacted.
    pub base: u64,
    /// Damaged stretches of the entries file found at start (synced records that went
    /// bad, valid records after them): skipped, the replica recovering what it lost from
    /// its peers.
    pub damaged_at_start: u64,
    /// Messages dropped and appends refused ([`OooNodeError::Busy`]) because the group's
    /// inbox was full.
    pub inbox_overflows: u64,
}

/// Committed entries read from a replica ([`OooNode::read`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OooRead {
    /// The entries, in slot order from the slot asked for, contiguous.
    pub entries: Vec<Entry>,
    /// The replica's first slot not known committed when read: a reader that reached it
    /// has read everything committed here so far.
    pub committed_head: u64,
}

/// The final result of an append.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OooResult {
    /// Its slot.
    pub seq: u64,
    /// Its place among the records of the slot's group entry.
    pub index: u32,
    /// Committed or Failed.
    pub outcome: Outcome,
}

/// A writer waiting for its record's answer, and when it submitted the record (for
/// [`OooLatency`]).
pub struct Reply {
    tx: tokio::sync::oneshot::Sender<Result<OooResult, OooNodeError>>,
    since: Instant,
}

impl Reply {
    /// A reply submitted now, and the receiver its writer waits on.
    pub fn channel() -> (
        Self,
        tokio::sync::oneshot::Receiver<Result<OooResult, OooNodeError>>,
    ) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let since = Instant::now();
        (Self { tx, since }, rx)
    }

    /// Tells the writer (who may have stopped waiting: then nobody hears).
    fn send(self, r: Result<OooResult, OooNodeError>) {
        let _ = self.tx.send(r);
    }
}

/// Latency histograms of one out-of-order node, recorded as it runs (each an atomic add
/// or two) and exported by the server as `chorus_*_seconds` (`docs/operations.md`).
/// They say where an append's time goes: waiting to be packed into a group entry, the
/// log's fdatasync, each peer's acknowledgement round trip, and the whole.
#[derive(Debug)]
pub struct OooLatency {
    /// Leader: from an append's submission ([`OooNode::submit`]) to its outcome
    /// (committed or failed), per record.
    pub append: Histogram,
    /// Leader: from an append's submission to its packing into a group entry, per record:
    /// the driver's queue and adaptive grouping (PALF section 6).
    pub queue: Histogram,
    /// Every node: one fdatasync of the entries file (by the IO thread).
    pub fsync: Histogram,
    /// Leader: from an entry's first send to a peer to that peer's acknowledgement of it,
    /// per entry, one histogram per peer: network both ways, the peer's queue and its
    /// sync. A resend does not restart the clock, so a copy lost or stuck behind a slow
    /// connection shows here as the time its repair took.
    pub peer_ack: Vec<(NodeId, Histogram)>,
}

impl OooLatency {
    /// Empty histograms, one acknowledgement histogram per peer.
    pub fn new(peers: impl IntoIterator<Item = NodeId>) -> Self {
        Self {
            append: Histogram::default(),
            queue: Histogram::default(),
            fsync: Histogram::default(),
            peer_ack: peers
                .into_iter()
                .map(|p| (p, Histogram::default()))
                .collect(),
        }
    }

    fn peer(&self, p: NodeId) -> Option<&Histogram> {
        self.peer_ack.iter().find(|(q, _)| *q == p).map(|(_, h)| h)
    }
}

/// Leader: when each entry was first sent to each peer and not yet acknowledged by it,
/// for [`OooLatency::peer_ack`]. Bounded: past [`AckClock::MAX`] entries per peer (a
/// peer down or far behind) the oldest are forgotten, unmeasured.
#[derive(Default)]
struct AckClock {
    sent: HashMap<NodeId, std::collections::BTreeMap<u64, Instant>>,
}

impl AckClock {
    const MAX: usize = 8192;

    /// Notes the first send of `seqs` to `to` at `at` (a resend keeps the first time).
    fn sent(&mut self, to: NodeId, seqs: impl Iterator<Item = u64>, at: Instant) {
        let m = self.sent.entry(to).or_default();
        for s in seqs {
            m.entry(s).or_insert(at);
        }
        while m.len() > Self::MAX {
            m.pop_first();
        }
    }

    /// Records the round trips of the slots `from` acknowledged that this clock holds.
    fn acked(&mut self, from: NodeId, seqs: impl Iterator<Item = u64>, lat: &OooLatency) {
        let (Some(m), Some(h)) = (self.sent.get_mut(&from), lat.peer(from)) else {
            return;
        };
        let now = Instant::now();
        for s in seqs {
            if let Some(t) = m.remove(&s) {
                h.record(now.duration_since(t).as_nanos() as u64);
            }
        }
    }
}

/// What a driver's round takes ([`driver::Driver::round`]): messages, appends, reports of
/// its IO side and state-machine jobs, and control requests.
pub enum Ev {
    /// A message from a peer.
    Msg(NodeId, Msg),
    /// A record to append, with its writer.
    Append(Declared, Vec<u8>, Reply),
    /// The state machine applied this slot.
    Applied(u64),
    /// The replica's status.
    Status(Sender<OooStatus>),
    /// Checkpoint the state machine and compact the entries below this slot (capped at
    /// the applied head); the answer is the replica's base after it
    /// ([`OooNode::compact`]).
    Compact(u64, Sender<u64>),
    /// Hand leadership to this node ([`OooReplica::transfer_leader`]).
    Transfer(NodeId, bool, Sender<Result<(), OooTransferError>>),
    /// Change the voters ([`OooReplica::change_membership`]).
    Change(
        OooMembershipChange,
        bool,
        Sender<Result<(), OooChangeError>>,
    ),
    /// The membership this replica holds.
    Membership(Sender<Membership>),
    /// Committed entries from a slot on (at most a count), with the committed head.
    Read(u64, usize, Sender<Result<OooRead, OooReadError>>),
    /// A leader read: answered once a quorum confirmed this node still leads and it
    /// applied everything committed when the read arrived ([`OooNode::read_index`]).
    ReadIndex(tokio::sync::oneshot::Sender<Result<(), OooReadIndexError>>),
    /// The IO side made every batch up to this one durable, with this many fdatasyncs;
    /// the entries file is `len` bytes.
    Synced {
        /// The last batch made durable.
        upto: u64,
        /// fdatasyncs that wrote something.
        syncs: u64,
        /// Bytes of the entries file.
        len: u64,
    },
    /// The IO side failed (the store refuses everything after).
    IoFailed(String),
    /// The state machine made everything below this slot durable.
    Checkpointed(u64),
    /// An image for a follower, covering every slot below `base` (partial: built for a
    /// follower that applied every slot below `part`).
    Image {
        /// The follower.
        to: NodeId,
        /// Every slot below it is covered.
        base: u64,
        /// Partial: the follower applied every slot below this one.
        part: Option<u64>,
        /// The image's bytes.
        image: Vec<u8>,
    },
    /// The leader's image (partial or not) is installed here, covering every slot below
    /// this one.
    Installed(u64, bool),
    /// The state machine refused the leader's image (its state kept).
    InstallFailed(u64, String),
    /// The state machine failed (apply, checkpoint or image).
    SmFailed(String),
}

/// A running out-of-order replica, hosted by an [`crate::Env`]
/// ([`crate::Env::start_ooo_group`]). Dropping it stops it.
pub struct OooNode {
    /// The group's mode.
    mode: Mode,
    task: Arc<OooTask>,
    io: Arc<IoTask>,
    env: Arc<EnvShared>,
    mail: Mailbox,
    /// Takes the group off its environment's router when the node is dropped.
    unregister: Mutex<Option<Box<dyn FnOnce() + Send>>>,
    /// The committed head, published by the driver at the end of every round.
    committed: tokio::sync::watch::Sender<u64>,
    /// The role, published by the driver at the end of every round that changed it.
    role: tokio::sync::watch::Sender<OooRole>,
    latency: Arc<OooLatency>,
    /// Set by the driver when a failure stops it (storage, state machine): why.
    stopped: Arc<OnceLock<String>>,
    /// Set by the IO task when a write failed for want of space
    /// ([`OooNode::stopped_by_full_disk`]).
    disk_full: Arc<AtomicBool>,
}

impl OooNode {
    /// Starts the replica on the environment's workers and transport (the environment
    /// delivers its inbound messages, `OooNode::deliver`); `sm` is called with every
    /// committed entry the apply rules release (see the module documentation). Hosted
    /// groups start through [`crate::Env::start_ooo_group`].
    pub(crate) fn start(
        cfg: OooNodeConfig,
        env: Arc<EnvShared>,
        sm: Arc<dyn OooStateMachine>,
    ) -> Result<Self, OooNodeError> {
        let transport = env.transport.get().ok_or(OooNodeError::Shutdown)?.clone();
        let fs: Arc<dyn FileSystem> = cfg.fs.clone().unwrap_or_else(|| Arc::new(RealFs::new()));
        let (mut store, mut hard, entries, rec) = OooStore::open_tolerating_damage(fs, &cfg.dir)?;
        store.set_preallocate(cfg.preallocate);
        store.set_direct_io(cfg.direct_io);
        let members = store.load_membership()?;
        if let Some(first) = rec.damaged.first() {
            // Synced entries went bad on disk. With another voter to learn them from, the
            // replica saves that it lost acknowledged entries (so it stays out of
            // elections until it holds them again) before the damage is dropped from the
            // file; alone, nothing can replace them and the node does not start.
            let voters = members
                .as_ref()
                .map(|m| m.members())
                .unwrap_or_else(|| cfg.voters.clone());
            if !voters.iter().any(|&v| v != cfg.id) {
                return Err(first.to_error().into());
            }
            for d in &rec.damaged {
                tracing::warn!(
                    group = cfg.group,
                    path = %d.path.display(),
                    offset = d.file_offset,
                    len = d.len,
                    detail = %d.detail,
                    "damaged out-of-order entries skipped; recovering them from peers \
                     (the file as found is kept as entries.damaged)"
                );
            }
            hard = hard.after_loss();
            store.save_hard(&hard)?;
            store.compact(&entries)?;
        }
        let damaged_at_start = rec.damaged.len() as u64;
        let log_bytes = store.len();
        let mut rc = OooConfig::new(cfg.id, cfg.voters.clone(), cfg.mode);
        rc.election_timeout = cfg.election_timeout.as_nanos() as u64;
        rc.heartbeat_interval = rc.election_timeout / 6;
        rc.resend_interval = rc.election_timeout / 6;
        rc.seed = cfg.id ^ cfg.group ^ std::process::id() as u64;
        rc.catchup_rate = cfg.catchup_rate;
        rc.conflict_order = cfg.conflict_order;
        rc.hole_resend = cfg.hole_resend;
        rc.timed_resend = cfg.timed_resend;
        let replica = OooReplica::recover(rc, hard, members, entries, env.now());
        // Outbound: the node's transport, to the group's other replicas.
        let peers: HashSet<NodeId> = cfg
            .voters
            .iter()
            .chain(&cfg.others)
            .copied()
            .filter(|&p| p != cfg.id)
            .collect();
        let latency = Arc::new(OooLatency::new(peers.iter().copied()));
        let committed = tokio::sync::watch::Sender::new(replica.committed_head());
        let role = tokio::sync::watch::Sender::new(OooRole::of(&replica));
        let stopped = Arc::new(OnceLock::new());
        let disk_full = Arc::new(AtomicBool::new(false));
        let inflight = Arc::new(AtomicUsize::new(0));
        let io_slot: Arc<OnceLock<Arc<IoTask>>> = Arc::new(OnceLock::new());
        let mut mail_out = None;
        let task = OooTask::new(env.clone(), inflight, |mail| {
            mail_out = Some(mail.clone());
            Driver::new(
                replica,
                DriverSettings {
                    mode: cfg.mode,
                    compact_bytes: cfg.compact_bytes,
                    freeze: cfg.freeze_interval,
                    disk: cfg.disk.clone(),
                    idle_tick: driver::idle_tick(cfg.election_timeout / 6),
                    #[cfg(feature = "broken")]
                    broken_ack_before_sync: false,
                    #[cfg(feature = "broken")]
                    broken_ack_before_apply: false,
                },
                EnvHost {
                    env: env.clone(),
                    transport,
                    group: cfg.group,
                    mail,
                    io: io_slot.clone(),
                },
                peers,
                sm.clone(),
                cfg.apply_threads,
                DriverOutputs {
                    why: stopped.clone(),
                    committed: committed.clone(),
                    role: role.clone(),
                    lat: latency.clone(),
                },
                OooCounters {
                    damaged_at_start,
                    ..OooCounters::default()
                },
                log_bytes,
            )
        });
        let mail = mail_out.expect("the driver was built");
        let io = IoTask::new(
            store,
            mail.clone(),
            latency.clone(),
            disk_full.clone(),
            env.clone(),
        );
        let _ = io_slot.set(io.clone());
        // The first round: the replica's start-up actions and its first tick.
        task.poke(0);
        Ok(Self {
            mode: cfg.mode,
            task,
            io,
            env,
            mail,
            unregister: Mutex::new(None),
            committed,
            role,
            latency,
            stopped,
            disk_full,
        })
    }

    /// Whether the node takes no more requests: stopped by a failure, or its environment
    /// shut down.
    fn down(&self) -> bool {
        self.stopped.get().is_some() || self.env.pool.is_stopped()
    }

    /// Asks the driver something; `None` if the node is down or does not answer within
    /// 5 s.
    fn ask<T>(&self, ev: impl FnOnce(mpsc::Sender<T>) -> Ev) -> Option<T> {
        self.ask_within(Duration::from_secs(5), ev)
    }

    /// [`Self::ask`] with another bound on the wait.
    fn ask_within<T>(&self, wait: Duration, ev: impl FnOnce(mpsc::Sender<T>) -> Ev) -> Option<T> {
        if self.down() {
            return None;
        }
        let (tx, rx) = mpsc::channel();
        self.task.push(ev(tx));
        rx.recv_timeout(wait).ok()
    }

    /// The driver task (the environment's timer polls it).
    pub(crate) fn task(&self) -> Arc<OooTask> {
        self.task.clone()
    }

    /// The group's mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// This node's latency histograms, as they are now (they only grow).
    pub fn latency(&self) -> &OooLatency {
        &self.latency
    }

    /// Follows this replica's committed head (the first slot not known committed here,
    /// [`OooReplica::committed_head`]): the receiver sees each value the driver publishes
    /// at the end of a round, so a reader of [`OooNode::read`] can wait for new entries
    /// instead of polling. It closes once the node is dropped.
    pub fn subscribe_committed(&self) -> tokio::sync::watch::Receiver<u64> {
        self.committed.subscribe()
    }

    /// Follows this replica's role, term and leader (PALF's monitor_role): the receiver
    /// sees each change the driver publishes at the end of a round, and is woken without
    /// a change when a failure stops the node ([`OooNode::stopped_reason`]). It closes
    /// once the node is dropped (deleted or restarted).
    pub fn subscribe_role(&self) -> tokio::sync::watch::Receiver<OooRole> {
        self.role.subscribe()
    }

    /// Hands the replica a message from peer `from` (the environment's router calls
    /// this for the group's frames); a message for a stopped node is dropped.
    pub(crate) fn deliver(&self, from: NodeId, msg: Msg) {
        self.task.push(Ev::Msg(from, msg));
    }

    /// Has `f` run when the node is dropped (the environment takes it off its router).
    pub(crate) fn on_drop(&self, f: Box<dyn FnOnce() + Send>) {
        *self.unregister.lock().expect("unregister") = Some(f);
    }

    /// Appends a record and blocks until its result (not from inside an async runtime:
    /// use [`OooNode::append_async`] there).
    pub fn append(&self, declared: Declared, data: Vec<u8>) -> Result<Outcome, OooNodeError> {
        if self.down() {
            return Err(OooNodeError::NotRunning);
        }
        let (reply, rx) = Reply::channel();
        self.task.push(Ev::Append(declared, data, reply));
        rx.blocking_recv()
            .map_err(|_| OooNodeError::Stopped)?
            .map(|r| r.outcome)
    }

    /// Appends a record; the future resolves to its result.
    pub fn append_async(
        &self,
        declared: Declared,
        data: Vec<u8>,
    ) -> impl Future<Output = Result<Outcome, OooNodeError>> + Send + 'static {
        let r = self.submit(declared, data);
        async move { r.await.map(|r| r.outcome) }
    }

    /// Appends a record; the future resolves to its result and slot. Appends submitted
    /// from one thread that touch a block or key in common get increasing (slot, index)
    /// places in submission order; others may not (a record that would wait to commit,
    /// or on some replica to apply, is packed after the rest, [`chorus_core::ooo::group::waiting_last`]),
    /// and one may be refused while a later one is appended.
    pub fn submit(
        &self,
        declared: Declared,
        data: Vec<u8>,
    ) -> impl Future<Output = Result<OooResult, OooNodeError>> + Send + 'static {
        let (reply, rx) = Reply::channel();
        // A failure already stopped the driver (or is stopping it): not taken.
        let sent = !self.down();
        if sent {
            self.task.push(Ev::Append(declared, data, reply));
        }
        async move {
            if !sent {
                return Err(OooNodeError::NotRunning);
            }
            rx.await.map_err(|_| OooNodeError::Stopped)?
        }
    }

    /// Committed entries of this replica from slot `from` on, at most `max`, in slot order:
    /// the committed prefix (see [`OooReplica::read_committed`]). Entries are read from
    /// memory by the driver; `None` if the node stopped.
    pub fn read(&self, from: u64, max: usize) -> Option<Result<OooRead, OooReadError>> {
        self.ask(|tx| Ev::Read(from, max, tx))
    }

    /// Waits until a read served from this node's state now sees every write
    /// acknowledged before the call, on any node: this node must be the serving leader,
    /// a quorum of the voters must confirm it still is (a deposed leader that has not
    /// heard of its successor gets `NotLeader` instead of serving an old state), and it
    /// must have applied every slot committed when the call arrived
    /// ([`OooReplica::read_index`]). `Err(None)` if the node stopped.
    pub fn read_index(
        &self,
    ) -> impl Future<Output = Result<(), Option<OooReadIndexError>>> + Send + 'static {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let sent = !self.down();
        if sent {
            self.task.push(Ev::ReadIndex(tx));
        }
        async move {
            if !sent {
                return Err(None);
            }
            match rx.await {
                Ok(r) => r.map_err(Some),
                Err(_) => Err(None),
            }
        }
    }

    /// Starts handing leadership to node `to` ([`OooReplica::transfer_leader`]): this
    /// node, a serving leader, refuses appends ([`OooAppendError::Transferring`]) until
    /// `to` has caught up and campaigns, or for an election timeout if it does not.
    /// Returns once the transfer is under way, not when `to` leads: watch
    /// [`OooNode::status`]. No strict check (forced; [`Self::transfer_leader_checked`]).
    /// `None` if the node stopped.
    pub fn transfer_leader(&self, to: NodeId) -> Option<Result<(), OooTransferError>> {
        self.transfer_leader_checked(to, true)
    }

    /// [`Self::transfer_leader`] after the strict check unless `force`
    /// ([`OooReplica::transfer_leader_checked`]): a target not heard from within an
    /// election timeout, or more than a window behind, is refused.
    pub fn transfer_leader_checked(
        &self,
        to: NodeId,
        force: bool,
    ) -> Option<Result<(), OooTransferError>> {
        self.ask(|tx| Ev::Transfer(to, force, tx))
    }

    /// Checkpoints the state machine and compacts the entries below `upto` (capped at
    /// what this replica applied), as the driver does by itself once the entries file
    /// passes `compact_bytes`: the operator's trim of an out-of-order group. A follower
    /// that has not got what is compacted catches up by image. Returns the replica's
    /// base after it (every slot below is compacted): below `upto` when an image is
    /// coming in (the replica does not compact then) or when little was applied. Asked
    /// while a checkpoint runs, it waits for that one and, if that does not cover it, for
    /// one more. `None` if the node stopped or did not answer within 30 s.
    pub fn compact(&self, upto: u64) -> Option<u64> {
        self.ask_within(Duration::from_secs(30), |tx| Ev::Compact(upto, tx))
    }

    /// Changes the group's voters (PALF section 5.3; joint consensus, see
    /// [`Membership`]): on the serving leader, starts the change and returns; the change
    /// completes once a majority of the old and the new voters hold it, then a majority
    /// of the new voters its final stage ([`OooNode::membership`] shows where it is).
    /// A node to add must be among the configured replicas. No strict check (the
    /// change is forced; [`Self::change_membership_checked`]). `None` if the node
    /// stopped.
    pub fn change_membership(
        &self,
        change: OooMembershipChange,
    ) -> Option<Result<(), OooChangeError>> {
        self.change_membership_checked(change, true)
    }

    /// [`Self::change_membership`] after the strict check unless `force`: a removal that
    /// would leave fewer voters heard from than a majority is refused
    /// ([`OooChangeError::Unsafe`]).
    pub fn change_membership_checked(
        &self,
        change: OooMembershipChange,
        force: bool,
    ) -> Option<Result<(), OooChangeError>> {
        self.ask(|tx| Ev::Change(change, force, tx))
    }

    /// The membership this replica holds (`prev` set while a change is in its joint
    /// stage), or `None` if the node stopped.
    pub fn membership(&self) -> Option<Membership> {
        self.ask(Ev::Membership)
    }

    /// The replica's status, or `None` if the node stopped.
    pub fn status(&self) -> Option<OooStatus> {
        let mut st = self.ask(Ev::Status)?;
        // Counted where events are queued, not by the driver.
        st.counters.inbox_overflows = self.task.overflowed.load(Ordering::Relaxed);
        Some(st)
    }

    /// Why the node stopped, once a failure stopped it (its storage failed, e.g. on a full
    /// disk, or its state machine did); `None` while it runs.
    pub fn stopped_reason(&self) -> Option<String> {
        self.stopped.get().cloned()
    }

    /// Whether the node stopped because a write to its store failed for want of space
    /// (`ENOSPC`): freeing space removes the cause, so its host may start it again.
    pub fn stopped_by_full_disk(&self) -> bool {
        self.stopped.get().is_some() && self.disk_full.load(Ordering::SeqCst)
    }
}

impl Drop for OooNode {
    fn drop(&mut self) {
        if let Some(f) = self.unregister.lock().expect("unregister").take() {
            f();
        }
        self.task.removed.store(true, Ordering::Release);
        self.io.removed.store(true, Ordering::Release);
        // Wait for a worker running either task and for its jobs on the apply workers,
        // so that the group's files and state machine are not touched once this returns
        // (a restarted group opens them again). Bounded: a state machine stuck in a call
        // is logged, not waited on for ever.
        let deadline = Instant::now() + Duration::from_secs(30);
        while (self.task.sched().is_running()
            || self.io.sched().is_running()
            || self.mail.inflight() > 0)
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        if Instant::now() >= deadline {
            tracing::error!("an out-of-order group's work did not end within 30 s of its stop");
        }
        // Whatever is still waiting learns that its result is unknown, or that it was not
        // taken.
        self.task.with_driver(|d| d.fail_waiters());
        self.task.refuse_queued();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An acknowledgement is timed from the entry's first send to that peer: a resend does
    /// not restart the clock, a second acknowledgement is not counted again, a slot never
    /// sent is not counted, and a peer's clock forgets its oldest sends past its bound.
    #[test]
    fn the_ack_clock_times_first_sends_once_and_stays_bounded() {
        let lat = OooLatency::new([2, 3]);
        let mut c = AckClock::default();
        let long_ago = Instant::now() - Duration::from_millis(50);
        c.sent(2, [1, 2].into_iter(), long_ago);
        c.sent(2, [1].into_iter(), Instant::now());
        c.acked(2, [1, 2, 9].into_iter(), &lat);
        let two = lat.peer(2).expect("peer 2");
        assert_eq!(two.count(), 2);
        assert!(two.mean_ns() >= 50_000_000, "{} ns", two.mean_ns());
        c.acked(2, [1].into_iter(), &lat);
        assert_eq!(two.count(), 2);
        let three = lat.peer(3).expect("peer 3");
        c.acked(3, [1].into_iter(), &lat);
        assert_eq!(three.count(), 0);
        let n = AckClock::MAX as u64 + 10;
        c.sent(3, 0..n, Instant::now());
        assert_eq!(c.sent[&3].len(), AckClock::MAX);
        c.acked(3, [0, n - 1].into_iter(), &lat);
        assert_eq!(
            three.count(),
            1,
            "slot 0 was forgotten, slot {} timed",
            n - 1
        );
        // A peer the node does not send to is not timed.
        c.sent(7, [1].into_iter(), long_ago);
        c.acked(7, [1].into_iter(), &lat);
        assert!(lat.peer(7).is_none());
    }
}
