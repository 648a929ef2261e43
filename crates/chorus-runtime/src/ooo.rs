//! A real driver for one out-of-order group replica: the pure [`OooReplica`] with its
//! [`OooStore`] on the real file system (fdatasync) and plain TCP between processes.
//!
//! One driver thread owns the replica; one IO thread owns its store. The driver takes
//! every queued event, lets the replica react and hands the writes (and hard-state saves)
//! of that batch to the IO thread in order; the acknowledgements and votes of the batch
//! wait until the IO thread reports it — and every batch before it — durable, so nothing
//! is acknowledged or voted before what it depends on is on disk. Meanwhile the driver goes
//! on taking events: its rounds overlap the syncs, and the IO thread puts every batch
//! queued while it synced into one `fdatasync` (group commit). A leader's appends to
//! followers leave at once (the replica's first documented exception), and the replica
//! counts the leader's own copy of a slot only when the driver reports it durable
//! ([`OooReplica::persisted`]). Results leave at once too (the second exception: an
//! outcome rests on durable copies only), and an apply waits for its own entry's write
//! only, not for the other writes of its batch.
//!
//! A leader packs the appends a round took into group entries at the end of the round;
//! with [`OooNodeConfig::freeze_interval`] set, appends taken while its own log write is in
//! flight wait for that write (or the interval) and leave together (PALF section 6's
//! adaptive group replication, as the ordered replica freezes its groups).
//!
//! Applies run on a pool of `apply_threads` threads (DP-Raft section 4.3: followers apply
//! independent entries in parallel): the replica only releases together entries that do
//! not conflict, each worker calls the caller's callback and reports the slot back to the
//! driver, which then releases what waited on it. A group entry's WAW rule is that of the
//! union of its records' writes, so with two or more threads a worker also cuts the
//! entry it takes into pieces — at most one per thread, each a union of whole independent
//! sets (records that write nothing in common with the rest), balanced by size — and
//! leaves all but one piece to the other workers; the last piece applied reports the
//! slot (the queue and that countdown are [`crate::applyq`], checked with loom). Without
//! that, a group holding one write of a hot key would apply its ~20 records one after
//! another while every later group writing that key waited. With `apply_threads = 0` the
//! driver applies itself, one released batch after another.
//!
//! Messages travel as frames `u32 length | u32 CRC32C | message` (`docs/formats.md`,
//! "Out-of-order groups"); each node dials every peer it sends to, announcing itself with
//! `u64 node id | u64 group id` (a connection naming another group is closed, so two
//! groups given the same address by mistake never mix), and a broken connection drops
//! what was queued (the protocol retransmits) and is redialled. A writer thread per peer
//! dials and writes; while a plain-TCP connection is up and nothing is queued for it, the
//! driver writes a frame itself with a non-blocking send and queues only what the socket
//! did not take (no wake-up of the writer thread on the common path).
//!
//! **Checkpoints and compaction.** When the entries file passes `compact_bytes` (or the
//! state machine's [`OooStateMachine::checkpoint_cost`], if larger), the driver reads how
//! far the replica may compact ([`OooReplica::compactable`]: the applied head, on a
//! leader no further than its live followers' heads, unless the file reached four times
//! its bound), has the state machine make everything
//! applied durable ([`OooStateMachine::checkpoint`], on a helper thread), and then tells
//! the replica, which saves the new base and lets the IO thread rewrite the file with the
//! live tail only. A follower behind a leader's base gets the leader's
//! [`OooStateMachine::image`] in pieces (PolarFS section 5.3) and installs it with
//! [`OooStateMachine::restore`], again off the driver thread; when the replica names the
//! part the follower lacks ([`OooReplica::image_scope`]) and the state machine can build
//! it, only that part travels ([`OooStateMachine::image_part`],
//! [`OooStateMachine::restore_part`]).
//!
//! With [`OooNodeConfig::tls`] every connection is mutual TLS with the same files and
//! rules as the ordered transport (`crate::transport`): both ends present certificates
//! of the cluster's CA and the dialling side checks the server name; a peer that fails
//! the handshake is closed before it can send a byte of protocol.

use std::collections::HashMap;
use std::future::Future;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::applyq::{Countdown, WorkQueue};
use crate::metrics::Histogram;
use chorus_core::format::meta::NodeId;
use chorus_core::format::ooo::encode_group;
use chorus_core::format::ooo::{decode_msg, encode_msg};
use chorus_core::ooo::group::{self, Record};
use chorus_core::ooo::replica::{
    Action, Declared, Entry, Footprint, Membership, Mode, Msg, OooAppendError, OooChangeError,
    OooConfig, OooMembershipChange, OooReadError, OooReplica, OooStats, OooTransferError,
};
use chorus_core::replica::{Outcome, Role};
use chorus_storage::fs::{FileSystem, RealFs};
use chorus_storage::ooo::OooStore;

/// Starts a thread named `name` (shown by `top -H`, `perf` and debuggers; Linux keeps
/// the first 15 bytes).
fn spawn<F: FnOnce() + Send + 'static>(name: &str, f: F) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new().name(name.to_string()).spawn(f)
}

/// Largest frame accepted.
const MAX_FRAME: usize = 256 << 20;

/// Settings of an out-of-order node.
#[derive(Clone, Debug)]
pub struct OooNodeConfig {
    /// This node.
    pub id: NodeId,
    /// The group (checked on every inbound connection).
    pub group: u64,
    /// Every voter the group was created with and its replication address (this node
    /// too, unless it is one of `others`).
    pub voters: Vec<(NodeId, SocketAddr)>,
    /// Replicas that were not voters at creation but may be added by a membership change
    /// ([`OooNode::change_membership`]), with their addresses. Links go to every voter
    /// and every one of these, and only they are heard. A node listed here starts
    /// knowing no membership of its own and follows whichever leader adds it.
    pub others: Vec<(NodeId, SocketAddr)>,
    /// The group's mode.
    pub mode: Mode,
    /// The group's directory.
    pub dir: PathBuf,
    /// Election timeout.
    pub election_timeout: Duration,
    /// Fault injection for benchmarks and tests: before each write to this peer, wait a
    /// random time below the given bound (a jittery replication link; frames keep their
    /// order).
    pub link_jitter: Option<(NodeId, Duration)>,
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
    /// next entry, which now leaves later (see `docs/benchmarks.md`).
    pub freeze_interval: Duration,
    /// Bytes of zeros the store keeps written past the end of its entries file, so most
    /// syncs do not grow the file ([`OooStore::set_preallocate`]; 0: none).
    pub preallocate: u64,
    /// Append to the entries file with direct IO where the file system takes it
    /// ([`OooStore::set_direct_io`]; false: through the page cache).
    pub direct_io: bool,
    /// Mutual TLS on every replication connection (None: plain TCP).
    pub tls: Option<crate::transport::TlsFiles>,
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
pub trait OooStateMachine: Send + Sync + 'static {
    /// Applies records of the committed entry at `slot` (the group of records the driver
    /// packed into it; [`chorus_core::ooo::group`]), each with its place in the group, in
    /// group order, once the apply rules released the entry. Called on several threads
    /// at once, for entries that do not conflict and — with two or more apply threads —
    /// for pieces of one entry, each a union of its independent sets
    /// ([`group::independent_sets`]: no two pieces write a block or key in common), so one
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
    /// follower that lacks only what `scope` covers (PolarFS section 5.3, fast
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
    /// The listener could not be used.
    #[error("replication listener: {0}")]
    Io(#[from] std::io::Error),
    /// The TLS files could not be loaded.
    #[error(transparent)]
    Tls(crate::Error),
}

/// What the driver reports about its replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
    /// Recovering entries it lost on disk: following and acknowledging, but neither
    /// voting nor campaigning until it holds them again
    /// ([`chorus_core::ooo::replica::Hard::after_loss`]).
    pub recovering_lost: bool,
    /// The replica's counters.
    pub stats: OooStats,
    /// The driver's counters.
    pub counters: OooCounters,
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
struct Reply {
    tx: tokio::sync::oneshot::Sender<Result<OooResult, OooNodeError>>,
    since: Instant,
}

impl Reply {
    /// A reply submitted now, and the receiver its writer waits on.
    fn channel() -> (
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
/// or two) and exported by the server as `chorus_ooo_*_seconds` (`docs/operations.md`).
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
    fn new(peers: impl IntoIterator<Item = NodeId>) -> Self {
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

enum Ev {
    Msg(NodeId, Msg),
    Append(Declared, Vec<u8>, Reply),
    Applied(u64),
    Status(Sender<OooStatus>),
    /// Hand leadership to this node ([`OooReplica::transfer_leader`]).
    Transfer(NodeId, Sender<Result<(), OooTransferError>>),
    /// Change the voters ([`OooReplica::change_membership`]).
    Change(OooMembershipChange, Sender<Result<(), OooChangeError>>),
    /// The membership this replica holds.
    Membership(Sender<Membership>),
    /// Committed entries from a slot on (at most a count), with the committed head.
    Read(u64, usize, Sender<Result<OooRead, OooReadError>>),
    /// The IO thread made every batch up to this one durable, with this many fdatasyncs;
    /// the entries file is `len` bytes.
    Synced {
        upto: u64,
        syncs: u64,
        len: u64,
    },
    /// The IO thread failed (the store refuses everything after).
    IoFailed(String),
    /// The state machine made everything below this slot durable.
    Checkpointed(u64),
    /// An image for a follower, covering every slot below `base` (partial: built for a
    /// follower that applied every slot below `part`).
    Image {
        to: NodeId,
        base: u64,
        part: Option<u64>,
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

/// A write for the IO thread, in the order the replica asked.
enum IoOp {
    Write(Entry),
    Hard(chorus_core::ooo::replica::Hard),
    Members(chorus_core::ooo::replica::Membership),
    Compact(Vec<Entry>),
}

/// What waits for an IO batch: the actions that may run only once the writes before
/// them are durable, and the writes to report to the replica.
struct Pending {
    id: u64,
    io: bool,
    written: Vec<(u64, u64, u64)>,
    actions: Vec<Action>,
}

/// The IO thread: executes batches in order; every batch it has taken when the queue runs
/// dry shares one fdatasync (a hard-state save first syncs the writes before it).
fn io_loop(
    mut store: OooStore,
    rx: Receiver<(u64, Vec<IoOp>)>,
    tx: Sender<Ev>,
    lat: Arc<OooLatency>,
    disk_full: Arc<AtomicBool>,
) {
    // Every sync, timed when it has written something (else it returns at once).
    let sync = |store: &mut OooStore, dirty: bool| {
        let t = Instant::now();
        let r = store.sync();
        if dirty && r.is_ok() {
            lat.fsync.record(t.elapsed().as_nanos() as u64);
        }
        r
    };
    while let Ok(first) = rx.recv() {
        let mut upto = first.0;
        let mut ops = first.1;
        while let Ok((id, more)) = rx.try_recv() {
            upto = id;
            ops.extend(more);
        }
        let mut syncs = 0;
        let mut unsynced = false;
        let mut r = Ok(());
        for op in ops {
            r = match op {
                IoOp::Write(e) => {
                    unsynced = true;
                    store.write(&e)
                }
                IoOp::Hard(h) => {
                    let dirty = std::mem::take(&mut unsynced);
                    syncs += dirty as u64;
                    sync(&mut store, dirty).and_then(|()| store.save_hard(&h))
                }
                IoOp::Members(m) => {
                    let dirty = std::mem::take(&mut unsynced);
                    syncs += dirty as u64;
                    sync(&mut store, dirty).and_then(|()| store.save_membership(&m))
                }
                IoOp::Compact(live) => {
                    syncs += std::mem::take(&mut unsynced) as u64;
                    store.compact(&live)
                }
            };
            if r.is_err() {
                break;
            }
        }
        if r.is_ok() {
            syncs += unsynced as u64;
            r = sync(&mut store, unsynced);
        }
        let ev = match r {
            Ok(()) => Ev::Synced {
                upto,
                syncs,
                len: store.len(),
            },
            Err(e) => {
                // Before the driver hears: once it reports the node stopped, whether a
                // full disk did it is known.
                disk_full.store(e.is_disk_full(), Ordering::SeqCst);
                Ev::IoFailed(e.to_string())
            }
        };
        let failed = matches!(ev, Ev::IoFailed(_));
        if tx.send(ev).is_err() || failed {
            return;
        }
    }
}

/// A running out-of-order replica. Dropping it stops it.
pub struct OooNode {
    tx: Sender<Ev>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    addr: SocketAddr,
    /// The committed head, published by the driver at the end of every round.
    committed: tokio::sync::watch::Sender<u64>,
    latency: Arc<OooLatency>,
    /// Set by the driver when a failure stops it (storage, state machine): why.
    stopped: Arc<OnceLock<String>>,
    /// Set by the IO thread when a write failed for want of space
    /// ([`OooNode::stopped_by_full_disk`]).
    disk_full: Arc<AtomicBool>,
}

impl OooNode {
    /// Starts the node on `listener` (already bound, so tests and `chorus dev` can pick
    /// free ports first); `apply` is called with every committed entry the apply rules
    /// release (see the module documentation for the threads).
    pub fn start(
        cfg: OooNodeConfig,
        listener: TcpListener,
        sm: Arc<dyn OooStateMachine>,
    ) -> Result<Self, OooNodeError> {
        let tls = match &cfg.tls {
            Some(f) => Some(Arc::new(
                crate::transport::load_tls(f).map_err(OooNodeError::Tls)?,
            )),
            None => None,
        };
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
                .unwrap_or_else(|| cfg.voters.iter().map(|v| v.0).collect());
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
        let mut log_bytes = store.len();
        let mut rc = OooConfig::new(cfg.id, cfg.voters.iter().map(|v| v.0).collect(), cfg.mode);
        rc.election_timeout = cfg.election_timeout.as_nanos() as u64;
        rc.heartbeat_interval = rc.election_timeout / 6;
        rc.resend_interval = rc.election_timeout / 6;
        rc.seed = cfg.id ^ std::process::id() as u64;
        rc.catchup_rate = cfg.catchup_rate;
        rc.conflict_order = cfg.conflict_order;
        rc.hole_resend = cfg.hole_resend;
        rc.timed_resend = cfg.timed_resend;
        let t0 = Instant::now();
        let now = move || t0.elapsed().as_nanos() as u64;
        let mut replica = OooReplica::recover(rc, hard, members, entries, now());
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        // A thread the system refuses to start fails the start; the threads already
        // running see `stop` (or their queue close as this function's locals drop) and end.
        let halt = |e: std::io::Error| {
            stop.store(true, Ordering::Relaxed);
            e
        };
        let (tx, rx) = mpsc::channel::<Ev>();
        let mut threads = Vec::new();
        // Inbound connections.
        listener.set_nonblocking(true)?;
        {
            let (tx, stop, group, tls) = (tx.clone(), stop.clone(), cfg.group, tls.clone());
            threads.push(
                spawn("ooo-accept", move || {
                    accept_loop(listener, group, tls, tx, stop)
                })
                .map_err(&halt)?,
            );
        }
        // Apply workers: they take released entries from one queue and report each
        // applied slot back to the driver; a worker cuts an entry into pieces of whole
        // independent sets and leaves all but one to the others.
        let work = Arc::new(ApplyQueue::default());
        for _ in 0..cfg.apply_threads {
            let (work, tx, sm) = (work.clone(), tx.clone(), sm.clone());
            let pieces = cfg.apply_threads;
            threads.push(
                spawn("ooo-apply", move || {
                    while let Some(w) = work.pop() {
                        if let Some(ev) = apply_work(&*sm, &work, w, pieces) {
                            if tx.send(ev).is_err() {
                                return;
                            }
                        }
                    }
                })
                .map_err(&halt)?,
            );
        }
        let work = ApplyPool(work);
        let pool = cfg.apply_threads > 0;
        let mode = cfg.mode;
        // Outbound: one writer thread per peer.
        let mut peers: HashMap<NodeId, Arc<Link>> = HashMap::new();
        for &(p, a) in cfg.voters.iter().chain(&cfg.others) {
            if p == cfg.id || peers.contains_key(&p) {
                continue;
            }
            let (ptx, prx) = mpsc::channel::<Vec<u8>>();
            let link = Arc::new(Link {
                tx: ptx,
                queued: std::sync::atomic::AtomicUsize::new(0),
                inline: Mutex::new(None),
            });
            let (stop, hello) = (stop.clone(), (cfg.id, cfg.group));
            let jitter = cfg.link_jitter.filter(|j| j.0 == p).map(|j| j.1);
            let tls = tls.clone();
            let l = link.clone();
            threads.push(
                spawn(&format!("ooo-send-{p}"), move || {
                    writer_loop(hello, a, tls, prx, l, stop, jitter)
                })
                .map_err(&halt)?,
            );
            peers.insert(p, link);
        }
        let stop2 = stop.clone();
        let compact_bytes = cfg.compact_bytes;
        let disk = cfg.disk.clone();
        let freeze = cfg.freeze_interval;
        let committed = tokio::sync::watch::Sender::new(replica.committed_head());
        let committed_tx = committed.clone();
        let ev_tx = tx.clone();
        let (io_tx, io_rx) = mpsc::channel::<(u64, Vec<IoOp>)>();
        let latency = Arc::new(OooLatency::new(peers.keys().copied()));
        // Why the driver stopped, if it did on a failure ([`OooNode::stopped_reason`]).
        let stopped = Arc::new(OnceLock::new());
        let why = stopped.clone();
        let disk_full = Arc::new(AtomicBool::new(false));
        let lat = latency.clone();
        {
            let (tx, lat, full) = (tx.clone(), lat.clone(), disk_full.clone());
            threads.push(
                spawn("ooo-io", move || io_loop(store, io_rx, tx, lat, full)).map_err(&halt)?,
            );
        }
        threads.push(spawn("ooo-driver", move || {
            // Dropping the apply pool (it closes its queue) and the IO queue's sender when
            // the driver ends stops the workers and the IO thread.
            let (work, io_tx) = (work, io_tx);
            // The writers of each group entry in flight, by entry id, in record order.
            let mut waiters: HashMap<u64, Vec<Reply>> = HashMap::new();
            // Records taken this round, packed into group entries once the round's events
            // are all taken.
            let mut staged: Vec<(Record, Reply)> = Vec::new();
            // When the oldest staged record was taken, and the staged records' bytes.
            let mut staged_since: Option<Instant> = None;
            let mut staged_bytes = 0usize;
            // The last batch handed to the IO thread: the log IO is idle once every
            // batch up to it is reported durable.
            let mut io_sent = 0u64;
            let mut failed = false;
            let mut c = OooCounters {
                damaged_at_start,
                ..OooCounters::default()
            };
            // A checkpoint is under way (at most one at a time).
            let mut checkpointing = false;
            // Batches whose actions wait for their writes (and every earlier batch's).
            let mut pending: std::collections::VecDeque<Pending> = Default::default();
            let (mut next_id, mut synced_upto) = (0u64, 0u64);
            // Slots whose latest write is not known durable yet, with its batch: an
            // Apply of any other slot runs at once (its entry is on disk already).
            let mut unsynced: HashMap<u64, u64> = HashMap::new();
            let mut clock = AckClock::default();
            let ctx = Ctx {
                peers: &peers,
                lat: &lat,
                pool: pool.then_some(&work.0),
                sm: &sm,
                events: &ev_tx,
            };
            while !stop2.load(Ordering::Relaxed) && !failed {
                // Take every event already queued (up to a bound) before draining the
                // replica: their writes go to the IO thread as one batch.
                // Staged records wait at most until their freeze deadline.
                let mut wait = staged_since.map_or(Duration::from_millis(5), |t| {
                    (t + freeze).saturating_duration_since(Instant::now())
                });
                // A timed resend due: wake for it (once a millisecond while one is
                // already past due, waiting out its back-off or its commit).
                if let Some(due) = replica.resend_due() {
                    let t = now();
                    let until = if due > t {
                        Duration::from_nanos(due - t)
                    } else {
                        Duration::from_millis(1)
                    };
                    wait = wait.min(until);
                }
                let mut next = match rx.recv_timeout(wait.min(Duration::from_millis(5))) {
                    Ok(ev) => Some(ev),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => break,
                };
                let mut taken = 0;
                while let Some(ev) = next.take() {
                    taken += 1;
                    match ev {
                        // Only the configured replicas (voters and `others`) are heard.
                        Ev::Msg(from, m) if peers.contains_key(&from) => {
                            c.msgs_in += 1;
                            // On a low disk a follower takes no new entries
                            // (`crate::disk`): the message goes as if lost.
                            let declined = matches!(&m, Msg::Append { entries, .. }
                                if !entries.is_empty()
                                    && replica.role() != Role::Leader
                                    && disk.as_ref().is_some_and(|d| d.decline()));
                            if let Msg::Ack { seqs, .. } = &m {
                                clock.acked(from, seqs.iter().map(|s| s.0), &lat);
                            }
                            if !declined {
                                replica.receive(now(), from, m)
                            }
                        }
                        Ev::Msg(..) => {}
                        Ev::Append(declared, data, reply) => match group::check(mode, &declared) {
                            Ok(()) => {
                                // Refused before the disk fills, by a leader only (a
                                // follower refuses as NotLeader when the group is packed).
                                let low = disk.as_ref().filter(|d| {
                                    d.is_low() && replica.role() == Role::Leader
                                });
                                if let Some(Err((free, min_free))) = low.map(|d| d.check()) {
                                    reply.send(Err(OooNodeError::DiskLow { free, min_free }));
                                } else {
                                    staged_bytes += data.len();
                                    staged.push((Record { declared, data }, reply))
                                }
                            }
                            Err(e) => reply.send(Err(e.into())),
                        },
                        Ev::Applied(seq) => {
                            c.applied += 1;
                            if let Err(e) = replica.applied(seq) {
                                tracing::error!(error = %e, "apply report refused; stopping");
                                let _ = why.set(format!("apply report refused: {e}"));
                                failed = true;
                            }
                        }
                        Ev::Status(reply) => {
                            c.log_bytes = log_bytes;
                            c.base = replica.base();
                            let _ = reply.send(OooStatus {
                                mode,
                                role: replica.role(),
                                term: replica.term(),
                                leader: replica.leader(),
                                serving: replica.is_serving(),
                                committed_head: replica.committed_head(),
                                applied_head: replica.applied_head(),
                                recovering_lost: replica.is_recovering_lost(),
                                stats: replica.stats(),
                                counters: c,
                            });
                        }
                        Ev::Transfer(to, reply) => {
                            let _ = reply.send(replica.transfer_leader(now(), to));
                        }
                        Ev::Change(change, reply) => {
                            let _ = reply.send(replica.change_membership(now(), change));
                        }
                        Ev::Membership(reply) => {
                            let _ = reply.send(replica.membership().clone());
                        }
                        Ev::Read(from, max, reply) => {
                            let _ = reply.send(replica.read_committed(from, max).map(
                                |entries| OooRead {
                                    entries,
                                    committed_head: replica.committed_head(),
                                },
                            ));
                        }
                        Ev::Synced { upto, syncs, len } => {
                            c.syncs += syncs;
                            synced_upto = upto;
                            log_bytes = len;
                        }
                        Ev::IoFailed(e) => {
                            tracing::error!(error = %e, "out-of-order store failed; stopping");
                            let _ = why.set(format!("storage: {e}"));
                            failed = true;
                        }
                        Ev::Checkpointed(upto) => {
                            checkpointing = false;
                            c.checkpoints += 1;
                            let before = replica.base();
                            replica.compact(now(), upto);
                            if replica.base() > before {
                                // The file is rewritten next; its size is known again
                                // when the IO thread reports. Until then, no second
                                // checkpoint on the old size.
                                log_bytes = 0;
                            }
                        }
                        Ev::Image {
                            to,
                            base,
                            part,
                            image,
                        } => {
                            c.images += 1;
                            c.partial_images += u64::from(part.is_some());
                            c.image_bytes += image.len() as u64;
                            replica.snapshot_ready(now(), to, base, part, image);
                        }
                        Ev::Installed(base, part) => {
                            c.installs += 1;
                            c.partial_installs += u64::from(part);
                            if let Err(e) = replica.installed(now(), base) {
                                tracing::error!(error = %e, "install report refused; stopping");
                                let _ = why.set(format!("install report refused: {e}"));
                                failed = true;
                            }
                        }
                        Ev::InstallFailed(base, e) => {
                            tracing::warn!(base, error = %e, "the leader's image was refused; it will be sent again");
                            if let Err(e) = replica.install_failed(now(), base) {
                                tracing::error!(error = %e, "install report refused; stopping");
                                let _ = why.set(format!("install report refused: {e}"));
                                failed = true;
                            }
                        }
                        Ev::SmFailed(e) => {
                            tracing::error!(error = %e, "out-of-order state machine failed; stopping");
                            let _ = why.set(format!("state machine: {e}"));
                            failed = true;
                        }
                    }
                    if taken < 4096 {
                        next = rx.try_recv().ok();
                    }
                }
                if failed {
                    break;
                }
                if !staged.is_empty() {
                    // Adaptive group replication (PALF section 6): pack at once while
                    // this node's log IO is idle; while a write is in flight, let
                    // appends gather until it is durable (its Synced event starts a
                    // round), a full group is staged, or the freeze interval passed.
                    let since = *staged_since.get_or_insert_with(Instant::now);
                    let due = io_sent <= synced_upto
                        || since.elapsed() >= freeze
                        || staged.len() >= group::MAX_GROUP_RECORDS
                        || staged_bytes >= group::MAX_GROUP_BYTES
                        || !replica.is_serving();
                    if due {
                        append_groups(
                            &mut replica,
                            mode,
                            now(),
                            &mut staged,
                            &mut waiters,
                            &mut c,
                            &lat,
                        );
                        (staged_since, staged_bytes) = (None, 0);
                    }
                }
                replica.tick(now());
                // Checkpoint, then compact, once the entries file passed its bound (and
                // the checkpoint's own cost: a state machine that rewrites its whole
                // state waits for as many bytes of entries) and something applied is not
                // compacted yet: up to what every live follower has, unless the file grew
                // to four times its bound.
                let bound = if compact_bytes > 0 && log_bytes >= compact_bytes {
                    compact_bytes.max(sm.checkpoint_cost())
                } else {
                    compact_bytes
                };
                let upto = if log_bytes >= bound.saturating_mul(4) {
                    replica.applied_head()
                } else {
                    replica.compactable()
                };
                if compact_bytes > 0 && !checkpointing && log_bytes >= bound && upto > replica.base()
                {
                    checkpointing = true;
                    let (sm, tx) = (sm.clone(), ev_tx.clone());
                    std::thread::spawn(move || {
                        let _ = tx.send(match sm.checkpoint() {
                            Ok(()) => Ev::Checkpointed(upto),
                            Err(e) => Ev::SmFailed(format!("checkpoint: {e}")),
                        });
                    });
                }
                loop {
                    // Batches now durable, in order: the replica learns which of its
                    // writes are, and their waiting actions run.
                    let mut ran = false;
                    while pending
                        .front()
                        .is_some_and(|p| !p.io || p.id <= synced_upto)
                    {
                        let p = pending.pop_front().expect("front");
                        for w in &p.written {
                            if unsynced.get(&w.0) == Some(&p.id) {
                                unsynced.remove(&w.0);
                            }
                        }
                        if !p.written.is_empty() {
                            replica.persisted(now(), &p.written);
                        }
                        run_actions(p.actions, &ctx, &mut waiters, &mut c, &mut replica);
                        ran = true;
                    }
                    let actions = replica.take_actions();
                    if actions.is_empty() && !ran {
                        break;
                    }
                    // Writes and hard-state saves go to the IO thread in order; a leader's
                    // Append goes out at once, so followers write while this node syncs
                    // (the replica's first exception: it promises nothing about this disk);
                    // results run at once too (the second exception), and so does an
                    // apply whose own entry is on disk; everything else waits for the
                    // batch's writes and all before them.
                    let mut ops = Vec::new();
                    let mut written = Vec::new();
                    let mut waiting = Vec::new();
                    let mut now_actions = Vec::new();
                    let id = next_id + 1;
                    for a in actions {
                        match a {
                            Action::Write(e) => {
                                c.writes += 1;
                                unsynced.insert(e.seq, id);
                                written.push((e.seq, e.eid, e.term));
                                ops.push(IoOp::Write(e));
                            }
                            Action::SaveHard(h) => {
                                c.hard_saves += 1;
                                ops.push(IoOp::Hard(h));
                            }
                            Action::SaveMembership(m) => ops.push(IoOp::Members(m)),
                            Action::Compact { live, .. } => ops.push(IoOp::Compact(live)),
                            Action::Send {
                                to,
                                msg: msg @ Msg::Append { .. },
                            } => {
                                if let Msg::Append { entries, .. } = &msg {
                                    clock.sent(to, entries.iter().map(|e| e.seq), Instant::now());
                                }
                                send(&peers, &mut c, to, &msg)
                            }
                            // Outcomes rest on durable copies only: the writer hears at
                            // once, not after this batch's fsync of other appends. An
                            // Apply waits for its own entry's write only (the state
                            // machine must never hold what this disk could lose).
                            a @ (Action::Result { .. } | Action::Unknown { .. }) => {
                                now_actions.push(a)
                            }
                            Action::Apply(e) if !unsynced.contains_key(&e.seq) => {
                                now_actions.push(Action::Apply(e))
                            }
                            other => {
                                // A new role or term: what was sent before is
                                // acknowledged to a leader that no longer asks.
                                if matches!(other, Action::Role { .. }) {
                                    clock = AckClock::default();
                                }
                                waiting.push(other)
                            }
                        }
                    }
                    if !now_actions.is_empty() {
                        run_actions(now_actions, &ctx, &mut waiters, &mut c, &mut replica);
                    }
                    if ops.is_empty() && waiting.is_empty() {
                        continue;
                    }
                    // A batch without writes behind an empty queue runs at the top of
                    // the next round.
                    next_id = id;
                    let io = !ops.is_empty();
                    if io {
                        if io_tx.send((next_id, ops)).is_err() {
                            let _ = why.set("its IO thread ended".into());
                            failed = true;
                            break;
                        }
                        io_sent = next_id;
                    }
                    pending.push_back(Pending {
                        id: next_id,
                        io,
                        written,
                        actions: waiting,
                    });
                }
                // Readers following the log (tail) wake only when the head moves.
                let head = replica.committed_head();
                committed_tx.send_if_modified(|h| std::mem::replace(h, head) != head);
            }
            // Whatever is still waiting learns that its result is unknown.
            for w in waiters.into_values().flatten().chain(staged.into_iter().map(|s| s.1)) {
                w.send(Err(OooNodeError::Stopped));
            }
        }).map_err(&halt)?);
        Ok(Self {
            tx,
            stop,
            threads,
            addr,
            committed,
            latency,
            stopped,
            disk_full,
        })
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

    /// The replication address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Appends a record and blocks until its result (not from inside an async runtime:
    /// use [`OooNode::append_async`] there).
    pub fn append(&self, declared: Declared, data: Vec<u8>) -> Result<Outcome, OooNodeError> {
        if self.stopped.get().is_some() {
            return Err(OooNodeError::NotRunning);
        }
        let (reply, rx) = Reply::channel();
        self.tx
            .send(Ev::Append(declared, data, reply))
            .map_err(|_| OooNodeError::NotRunning)?;
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
    /// or on some replica to apply, is packed after the rest, [`group::waiting_last`]),
    /// and one may be refused while a later one is appended.
    pub fn submit(
        &self,
        declared: Declared,
        data: Vec<u8>,
    ) -> impl Future<Output = Result<OooResult, OooNodeError>> + Send + 'static {
        let (reply, rx) = Reply::channel();
        // A failure already stopped the driver (or is stopping it): not taken.
        let sent =
            self.stopped.get().is_none() && self.tx.send(Ev::Append(declared, data, reply)).is_ok();
        async move {
            if !sent {
                return Err(OooNodeError::NotRunning);
            }
            rx.await.map_err(|_| OooNodeError::Stopped)?
        }
    }

    /// Committed entries of this replica from slot `from` on, at most `max`, in slot order:
    /// the committed prefix (see [`OooReplica::read_committed`]). Entries are read from
    /// memory by the driver thread; `None` if the node stopped.
    pub fn read(&self, from: u64, max: usize) -> Option<Result<OooRead, OooReadError>> {
        let (tx, rx) = mpsc::channel();
        self.tx.send(Ev::Read(from, max, tx)).ok()?;
        rx.recv_timeout(Duration::from_secs(5)).ok()
    }

    /// Starts handing leadership to node `to` ([`OooReplica::transfer_leader`]): this
    /// node, a serving leader, refuses appends ([`OooAppendError::Transferring`]) until
    /// `to` has caught up and campaigns, or for an election timeout if it does not.
    /// Returns once the transfer is under way, not when `to` leads: watch
    /// [`OooNode::status`]. `None` if the node stopped.
    pub fn transfer_leader(&self, to: NodeId) -> Option<Result<(), OooTransferError>> {
        let (tx, rx) = mpsc::channel();
        self.tx.send(Ev::Transfer(to, tx)).ok()?;
        rx.recv_timeout(Duration::from_secs(5)).ok()
    }

    /// Changes the group's voters (PALF section 4.3; joint consensus, see
    /// [`Membership`]): on the serving leader, starts the change and returns; the change
    /// completes once a majority of the old and the new voters hold it, then a majority
    /// of the new voters its final stage ([`OooNode::membership`] shows where it is).
    /// A node to add must be among the configured replicas. `None` if the node stopped.
    pub fn change_membership(
        &self,
        change: OooMembershipChange,
    ) -> Option<Result<(), OooChangeError>> {
        let (tx, rx) = mpsc::channel();
        self.tx.send(Ev::Change(change, tx)).ok()?;
        rx.recv_timeout(Duration::from_secs(5)).ok()
    }

    /// The membership this replica holds (`prev` set while a change is in its joint
    /// stage), or `None` if the node stopped.
    pub fn membership(&self) -> Option<Membership> {
        let (tx, rx) = mpsc::channel();
        self.tx.send(Ev::Membership(tx)).ok()?;
        rx.recv_timeout(Duration::from_secs(5)).ok()
    }

    /// The replica's status, or `None` if the node stopped.
    pub fn status(&self) -> Option<OooStatus> {
        let (tx, rx) = mpsc::channel();
        self.tx.send(Ev::Status(tx)).ok()?;
        rx.recv_timeout(Duration::from_secs(5)).ok()
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
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Packs the records taken this round into group entries ([`group::split`] bounds them)
/// and appends each with the union of its records' declarations; a refused group's
/// writers hear why. Records that would wait to commit for an uncommitted entry, or in
/// dependent mode on some replica to apply after a writer of their keys it has not
/// applied ([`OooReplica::packs_last`]), go into entries after the others
/// ([`group::waiting_last`]), so that one of them does not hold back the commit or the
/// followers' apply of a whole group of writers that need not wait.
fn append_groups(
    replica: &mut OooReplica,
    mode: Mode,
    now: u64,
    staged: &mut Vec<(Record, Reply)>,
    waiters: &mut HashMap<u64, Vec<Reply>>,
    c: &mut OooCounters,
    lat: &OooLatency,
) {
    let (_, waiting) =
        group::waiting_last(staged.iter().map(|s| &s.0.declared), replica.packs_last());
    let mut wait = vec![false; staged.len()];
    for i in waiting {
        wait[i] = true;
    }
    let (free, waiting): (Vec<_>, Vec<_>) = std::mem::take(staged)
        .into_iter()
        .zip(wait)
        .partition(|(_, w)| !w);
    for part in [free, waiting] {
        let lens = group::split(part.iter().map(|s| s.0 .0.data.len()));
        let mut rest = part.into_iter().map(|(s, _)| s);
        for n in lens {
            let (records, replies): (Vec<Record>, Vec<Reply>) = rest.by_ref().take(n).unzip();
            let declared = group::union(mode, &records);
            match replica.append(now, declared, encode_group(&records)) {
                Ok(t) => {
                    c.appends += n as u64;
                    c.groups += 1;
                    let packed = Instant::now();
                    for r in &replies {
                        lat.queue
                            .record(packed.duration_since(r.since).as_nanos() as u64);
                    }
                    waiters.insert(t.eid, replies);
                }
                // The group is refused whole (not the leader, or the window is full): each
                // of its writers hears why.
                Err(e) => {
                    for r in replies {
                        r.send(Err(e.clone().into()));
                    }
                }
            }
        }
    }
}

/// Decodes a committed entry's group and applies its records; a failure names the slot.
fn apply_entry(sm: &dyn OooStateMachine, e: &Entry) -> Result<(), String> {
    if e.is_null() {
        return Ok(());
    }
    let records = group::records(e).map_err(|err| format!("slot {}: {err}", e.seq))?;
    let placed: Vec<(u32, Record)> = (0u32..).zip(records).collect();
    sm.apply(e.seq, &placed)
        .map_err(|err| format!("applying slot {}: {err}", e.seq))
}

/// Work for the apply pool.
enum ApplyWork {
    /// An entry the replica released.
    Entry(Entry),
    /// One piece of an entry a worker cut up ([`group::pieces`]), its records with their
    /// places.
    Piece(Arc<SplitEntry>, Vec<(u32, Record)>),
}

/// An entry whose pieces are applied by several workers: the worker that applies its
/// last piece reports the slot applied.
struct SplitEntry {
    seq: u64,
    left: Countdown,
}

/// The apply pool's queue: the driver pushes released entries, workers push the pieces
/// they cut off; closed when the driver ends.
type ApplyQueue = WorkQueue<ApplyWork>;

/// The driver's handle on the apply queue: dropping it closes the queue, which stops the
/// workers (work still queued is dropped: the node is stopping, and the replica replays
/// unapplied entries from its base at the next start).
struct ApplyPool(Arc<ApplyQueue>);

impl Drop for ApplyPool {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// Applies one piece of work on a pool worker; returns what to tell the driver, if
/// anything (a piece that is not its entry's last says nothing). With `pieces` of two or
/// more (the pool's size), an entry whose records form several independent sets is cut
/// into at most that many pieces ([`group::pieces`]: unions of whole sets, so no two
/// pieces write the same block or key, balanced by record count): this worker applies
/// the first and queues the others for the free workers. One piece per worker, not one
/// per set, bounds the queue hand-offs per entry by the pool's size (at high load nearly
/// every record of an entry is its own set); the two measured the same
/// (`docs/benchmarks.md`).
fn apply_work(
    sm: &dyn OooStateMachine,
    queue: &ApplyQueue,
    w: ApplyWork,
    pieces: usize,
) -> Option<Ev> {
    let (seq, piece, parent) = match w {
        ApplyWork::Entry(e) => {
            if e.is_null() || pieces < 2 {
                return Some(match apply_entry(sm, &e) {
                    Ok(()) => Ev::Applied(e.seq),
                    Err(err) => Ev::SmFailed(err),
                });
            }
            let records = match group::records(&e) {
                Ok(r) => r,
                Err(err) => return Some(Ev::SmFailed(format!("slot {}: {err}", e.seq))),
            };
            let cut = group::pieces(group::independent_sets(&records), pieces);
            let mut slots: Vec<Option<Record>> = records.into_iter().map(Some).collect();
            let mut cut = cut.into_iter().map(|places| {
                places
                    .into_iter()
                    .map(|i| (i as u32, slots[i].take().expect("each record in one piece")))
                    .collect::<Vec<_>>()
            });
            let first = cut.next().unwrap_or_default();
            let rest: Vec<_> = cut.collect();
            if rest.is_empty() {
                (e.seq, first, None)
            } else {
                let parent = Arc::new(SplitEntry {
                    seq: e.seq,
                    left: Countdown::new(rest.len() + 1),
                });
                for piece in rest {
                    queue.push(ApplyWork::Piece(parent.clone(), piece));
                }
                (e.seq, first, Some(parent))
            }
        }
        ApplyWork::Piece(parent, piece) => (parent.seq, piece, Some(parent)),
    };
    if let Err(err) = sm.apply(seq, &piece) {
        return Some(Ev::SmFailed(format!("applying slot {seq}: {err}")));
    }
    match parent {
        Some(p) if !p.left.done() => None,
        _ => Some(Ev::Applied(seq)),
    }
}

/// What [`run_actions`] reaches besides the replica.
struct Ctx<'a> {
    peers: &'a HashMap<NodeId, Arc<Link>>,
    lat: &'a OooLatency,
    pool: Option<&'a ApplyQueue>,
    sm: &'a Arc<dyn OooStateMachine>,
    events: &'a Sender<Ev>,
}

/// Runs actions whose writes are durable: sends, results and applies (inline when there
/// is no apply pool, reporting each applied slot to the replica); images are taken and
/// installed on helper threads, which report back as events.
fn run_actions(
    actions: Vec<Action>,
    x: &Ctx<'_>,
    waiters: &mut HashMap<u64, Vec<Reply>>,
    c: &mut OooCounters,
    replica: &mut OooReplica,
) {
    let mut applied = Vec::new();
    for a in actions {
        match a {
            Action::Send { to, msg } => send(x.peers, c, to, &msg),
            Action::Apply(e) => match x.pool {
                Some(w) => w.push(ApplyWork::Entry(e)),
                None => match apply_entry(&**x.sm, &e) {
                    Ok(()) => {
                        c.applied += 1;
                        applied.push(e.seq);
                    }
                    Err(err) => {
                        let _ = x.events.send(Ev::SmFailed(err));
                    }
                },
            },
            Action::Snapshot { to } => {
                // Read before the image is taken, so the image covers it; the scope is
                // what the follower lacks below that head.
                let base = replica.applied_head();
                let scope = replica.image_scope(to);
                let (sm, tx) = (x.sm.clone(), x.events.clone());
                std::thread::spawn(move || {
                    let part = match &scope {
                        Some((from, f)) => sm.image_part(f).map(|i| i.map(|i| (*from, i))),
                        None => Ok(None),
                    };
                    let ev = match part {
                        Ok(Some((from, image))) => Ev::Image {
                            to,
                            base,
                            part: Some(from),
                            image,
                        },
                        Ok(None) => match sm.image() {
                            Ok(image) => Ev::Image {
                                to,
                                base,
                                part: None,
                                image,
                            },
                            Err(e) => Ev::SmFailed(format!("taking an image: {e}")),
                        },
                        Err(e) => Ev::SmFailed(format!("taking a partial image: {e}")),
                    };
                    let _ = tx.send(ev);
                });
            }
            Action::Install { base, image, part } => {
                let (sm, tx) = (x.sm.clone(), x.events.clone());
                std::thread::spawn(move || {
                    let done = if part {
                        sm.restore_part(&image)
                    } else {
                        sm.restore(&image)
                    };
                    let _ = tx.send(match done {
                        Ok(()) => Ev::Installed(base, part),
                        Err(e) => Ev::InstallFailed(base, e.to_string()),
                    });
                });
            }
            Action::Unknown { eid, seq } => {
                for w in waiters.remove(&eid).unwrap_or_default() {
                    w.send(Err(OooNodeError::Unknown { seq }));
                }
            }
            Action::Result { eid, seq, outcome } => {
                // Every record of the group gets the entry's outcome, in its order.
                let answered = Instant::now();
                for (index, w) in waiters
                    .remove(&eid)
                    .unwrap_or_default()
                    .into_iter()
                    .enumerate()
                {
                    match outcome {
                        Outcome::Committed => c.committed += 1,
                        Outcome::Failed => c.failed += 1,
                    }
                    let index = index as u32;
                    x.lat
                        .append
                        .record(answered.duration_since(w.since).as_nanos() as u64);
                    w.send(Ok(OooResult {
                        seq,
                        index,
                        outcome,
                    }));
                }
            }
            Action::Write(_)
            | Action::SaveHard(_)
            | Action::SaveMembership(_)
            | Action::Compact { .. }
            | Action::Committed(_)
            | Action::Role { .. }
            | Action::Serving { .. } => {}
        }
    }
    for s in applied {
        let _ = replica.applied(s);
    }
}

/// Queues a message to a peer's writer (a lost one is the protocol's to resend).
fn send(peers: &HashMap<NodeId, Arc<Link>>, c: &mut OooCounters, to: NodeId, msg: &Msg) {
    if let Some(p) = peers.get(&to) {
        c.msgs_out += 1;
        p.send(frame(&encode_msg(msg)));
    }
}

/// The way to one peer: its writer thread's queue and, while a plain-TCP connection is
/// up and idle, the socket itself.
struct Link {
    /// Byte chunks (frames, or the unsent rest of one) for the writer thread, in order.
    tx: Sender<Vec<u8>>,
    /// Chunks handed to the writer thread and not yet written by it.
    queued: std::sync::atomic::AtomicUsize,
    /// The connection's socket, when it is plain TCP without injected jitter; the writer
    /// thread holds this lock while it writes.
    inline: Mutex<Option<TcpStream>>,
}

impl Link {
    /// Sends a frame: written by the caller itself when nothing is queued and the socket
    /// takes it without blocking (as the ordered transport does: no wake-up of the writer
    /// thread, and on a commit round-trip that is four fewer thread hand-offs); otherwise,
    /// and for whatever the socket did not take, queued for the writer thread. Order is
    /// kept: the caller writes only while holding the socket's lock with nothing queued,
    /// and the writer thread counts a chunk as written only after writing it under that
    /// lock.
    fn send(&self, f: Vec<u8>) {
        if self.queued.load(Ordering::Acquire) == 0 {
            if let Ok(g) = self.inline.try_lock() {
                if let (Some(tcp), 0) = (g.as_ref(), self.queued.load(Ordering::Acquire)) {
                    // An error (a full buffer, a broken connection) sends nothing: the
                    // writer thread waits, or redials.
                    let sent = socket2::SockRef::from(tcp)
                        .send_with_flags(&f, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
                        .unwrap_or(0);
                    if sent == f.len() {
                        return;
                    }
                    self.queued.fetch_add(1, Ordering::AcqRel);
                    let _ = self.tx.send(f[sent..].to_vec());
                    return;
                }
            }
        }
        self.queued.fetch_add(1, Ordering::AcqRel);
        let _ = self.tx.send(f);
    }
}

fn frame(payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(8 + payload.len());
    f.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    f.extend_from_slice(&crc32c::crc32c(payload).to_le_bytes());
    f.extend_from_slice(payload);
    f
}

type Tls = Option<Arc<crate::transport::Tls>>;

fn accept_loop(listener: TcpListener, group: u64, tls: Tls, tx: Sender<Ev>, stop: Arc<AtomicBool>) {
    let mut readers = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((s, _)) => {
                let (tx, stop, tls) = (tx.clone(), stop.clone(), tls.clone());
                // A connection no thread can be started for is closed (dropped with the
                // closure); the peer redials.
                match spawn("ooo-recv", move || reader_loop(s, group, tls, tx, stop)) {
                    Ok(r) => readers.push(r),
                    Err(e) => tracing::warn!(error = %e, "no thread for an inbound connection"),
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    for r in readers {
        let _ = r.join();
    }
}

/// Reads frames from one inbound connection until it breaks or a frame is bad (the
/// connection is then closed: the sender redials, and the protocol retransmits).
/// Completes a TLS handshake within `limit` (the socket may have a short read timeout).
fn handshake<C, D>(
    st: &mut rustls::StreamOwned<C, TcpStream>,
    limit: Duration,
) -> std::io::Result<()>
where
    C: std::ops::DerefMut + std::ops::Deref<Target = rustls::ConnectionCommon<D>>,
    D: rustls::SideData,
{
    let end = Instant::now() + limit;
    while st.conn.is_handshaking() {
        match st.conn.complete_io(&mut st.sock) {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) && Instant::now() < end => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn reader_loop(tcp: TcpStream, group: u64, tls: Tls, tx: Sender<Ev>, stop: Arc<AtomicBool>) {
    let _ = tcp.set_nodelay(true);
    let _ = tcp.set_read_timeout(Some(Duration::from_millis(100)));
    let mut s: Box<dyn Read + Send> = match tls {
        Some(t) => {
            let Ok(conn) = rustls::ServerConnection::new(t.server.clone()) else {
                return;
            };
            let mut st = rustls::StreamOwned::new(conn, tcp);
            if let Err(e) = handshake(&mut st, Duration::from_secs(10)) {
                tracing::warn!(error = %e, "out-of-order connection refused: TLS handshake failed");
                return;
            }
            Box::new(st)
        }
        None => Box::new(tcp),
    };
    let mut buf: Vec<u8> = Vec::new();
    let mut from: Option<NodeId> = None;
    let mut chunk = vec![0u8; 64 << 10];
    while !stop.load(Ordering::Relaxed) {
        match s.read(&mut chunk) {
            Ok(0) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(_) => return,
        }
        // Decode every whole frame in the buffer, then drop the consumed bytes once.
        let mut at = 0;
        loop {
            let rest = &buf[at..];
            if from.is_none() {
                if rest.len() < 16 {
                    break;
                }
                let g = u64::from_le_bytes(rest[8..16].try_into().expect("8"));
                if g != group {
                    tracing::warn!(
                        group,
                        named = g,
                        "out-of-order connection for another group; closing it"
                    );
                    return;
                }
                from = Some(u64::from_le_bytes(rest[..8].try_into().expect("8")));
                at += 16;
                continue;
            }
            if rest.len() < 8 {
                break;
            }
            let len = u32::from_le_bytes(rest[..4].try_into().expect("4")) as usize;
            if len > MAX_FRAME {
                tracing::warn!(len, "out-of-order frame too large; closing the connection");
                return;
            }
            if rest.len() < 8 + len {
                break;
            }
            let crc = u32::from_le_bytes(rest[4..8].try_into().expect("4"));
            let payload = &rest[8..8 + len];
            if crc32c::crc32c(payload) != crc {
                tracing::warn!("out-of-order frame checksum mismatch; closing the connection");
                return;
            }
            match decode_msg(payload) {
                Ok(m) => {
                    if tx.send(Ev::Msg(from.expect("hello read"), m)).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "bad out-of-order message; closing the connection");
                    return;
                }
            }
            at += 8 + len;
        }
        buf.drain(..at);
    }
}

/// Sends queued frames to one peer, dialling (and redialling) as needed.
fn writer_loop(
    (me, group): (NodeId, u64),
    addr: SocketAddr,
    tls: Tls,
    rx: Receiver<Vec<u8>>,
    link: Arc<Link>,
    stop: Arc<AtomicBool>,
    jitter: Option<Duration>,
) {
    let mut conn: Option<Box<dyn Write + Send>> = None;
    let mut rng = chorus_core::rng::Rng::new(me ^ addr.port() as u64);
    while !stop.load(Ordering::Relaxed) {
        let first = match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(f) => f,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        if let Some(j) = jitter {
            let ns = rng.below(j.as_nanos().max(1) as u64);
            std::thread::sleep(Duration::from_nanos(ns));
        }
        let mut out = first;
        let mut n = 1;
        while let Ok(more) = rx.try_recv() {
            out.extend_from_slice(&more);
            n += 1;
        }
        let mut inline = link.inline.lock().unwrap_or_else(|e| e.into_inner());
        if conn.is_none() {
            let mut hello = me.to_le_bytes().to_vec();
            hello.extend_from_slice(&group.to_le_bytes());
            match dial(addr, tls.as_deref()) {
                Ok((mut s, tcp)) => {
                    if s.write_all(&hello).and_then(|()| s.flush()).is_ok() {
                        conn = Some(s);
                        // Jitter is injected here only, so a jittery link is never
                        // written inline.
                        *inline = tcp.filter(|_| jitter.is_none());
                    }
                }
                Err(e) => {
                    tracing::debug!(%addr, error = %e, "out-of-order dial failed");
                }
            }
        }
        // Without a connection the chunks are dropped: the protocol resends.
        if let Some(s) = conn.as_mut() {
            if s.write_all(&out).and_then(|()| s.flush()).is_err() {
                conn = None;
                *inline = None;
            }
        }
        link.queued.fetch_sub(n, Ordering::AcqRel);
    }
}

/// A dialled connection, and for plain TCP a handle on its socket (for inline sends).
type Dialled = (Box<dyn Write + Send>, Option<TcpStream>);

/// Dials a peer (with TLS, completing the handshake within 5 s, so a refused certificate
/// shows here and a silent peer cannot hold the writer).
fn dial(addr: SocketAddr, tls: Option<&crate::transport::Tls>) -> std::io::Result<Dialled> {
    let tcp = TcpStream::connect_timeout(&addr, Duration::from_millis(200))?;
    tcp.set_nodelay(true)?;
    tcp.set_write_timeout(Some(Duration::from_secs(5)))?;
    Ok(match tls {
        Some(t) => {
            tcp.set_read_timeout(Some(Duration::from_millis(100)))?;
            let conn = rustls::ClientConnection::new(t.client.clone(), t.name.clone())
                .map_err(std::io::Error::other)?;
            let mut st = rustls::StreamOwned::new(conn, tcp);
            handshake(&mut st, Duration::from_secs(5))?;
            (Box::new(st), None)
        }
        None => {
            let handle = tcp.try_clone().ok();
            (Box::new(tcp), handle)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key-value map that notes each record's place as it applies it.
    #[derive(Default)]
    struct Kv {
        map: Mutex<HashMap<u64, Vec<u8>>>,
        places: Mutex<Vec<u32>>,
    }

    impl OooStateMachine for Kv {
        fn apply(&self, _slot: u64, records: &[(u32, Record)]) -> std::io::Result<()> {
            assert!(
                records.windows(2).all(|w| w[0].0 < w[1].0),
                "a call's records in group order"
            );
            for (i, r) in records {
                if let Declared::Txn { write_set, .. } = &r.declared {
                    for k in write_set {
                        self.map.lock().unwrap().insert(*k, r.data.clone());
                    }
                }
                self.places.lock().unwrap().push(*i);
            }
            Ok(())
        }
        fn checkpoint(&self) -> std::io::Result<()> {
            Ok(())
        }
        fn image(&self) -> std::io::Result<Vec<u8>> {
            Ok(Vec::new())
        }
        fn restore(&self, _: &[u8]) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A group entry cut into pieces, applied in the worst order the pool allows (the
    /// worker's own piece first, then the queued pieces last first), ends in the state of
    /// applying the group in order; every record is applied once, and the slot is
    /// reported applied once, by its last piece. Every fifth record writes hot key 0
    /// (a chain through the group) and every seventh key 1.
    #[test]
    fn a_split_entry_applies_like_its_group_in_order() {
        let records: Vec<Record> = (0..40u64)
            .map(|i| {
                let mut write_set = vec![100 + i];
                if i % 5 == 0 {
                    write_set.push(0);
                }
                if i % 7 == 0 {
                    write_set.push(1);
                }
                Record {
                    declared: Declared::Txn {
                        read_set: vec![0],
                        write_set,
                    },
                    data: i.to_le_bytes().to_vec(),
                }
            })
            .collect();
        let Declared::Txn { write_set, .. } = group::union(Mode::Dependent, &records) else {
            unreachable!("a dependent union")
        };
        let entry = Entry {
            seq: 9,
            term: 1,
            start: 0,
            eid: 1,
            body: chorus_core::ooo::replica::Body::Dependent {
                base: 0,
                deps: Default::default(),
                write_set,
                data: encode_group(&records).into(),
            },
        };
        let serial = Kv::default();
        assert!(matches!(
            apply_work(
                &serial,
                &ApplyQueue::default(),
                ApplyWork::Entry(entry.clone()),
                1
            ),
            Some(Ev::Applied(9))
        ));
        assert_eq!(
            *serial.places.lock().unwrap(),
            (0..40).collect::<Vec<u32>>()
        );

        // With as many pieces as it can use, each set is its own piece: the worker kept
        // the set of record 0 (the 12 records 0, 5, 7, 10, 14, 15, 20, 21, 25, 28, 30, 35
        // chain through keys 0 and 1), the other 28 are alone. With 4 pieces, the chain is
        // one and the 28 are spread over three others.
        for (pieces, queued_pieces) in [(64, 28), (4, 3)] {
            let split = Kv::default();
            let queue = ApplyQueue::default();
            assert!(apply_work(&split, &queue, ApplyWork::Entry(entry.clone()), pieces).is_none());
            let mut queued = Vec::new();
            while let Some(w) = queue.try_pop() {
                queued.push(w);
            }
            assert_eq!(queued.len(), queued_pieces, "{pieces} pieces");
            let mut reports = Vec::new();
            for w in queued.into_iter().rev() {
                reports.push(apply_work(&split, &queue, w, pieces));
            }
            let (last, others) = reports.split_last().unwrap();
            assert!(others.iter().all(Option::is_none));
            assert!(matches!(last, Some(Ev::Applied(9))));
            assert_eq!(*split.map.lock().unwrap(), *serial.map.lock().unwrap());
            let mut places = split.places.lock().unwrap().clone();
            places.sort_unstable();
            assert_eq!(places, (0..40).collect::<Vec<u32>>());
        }
    }

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

    /// Frames sent through a [`Link`] — inline when the socket is idle, through the
    /// writer thread otherwise, and split between the two when the socket takes only part
    /// of a frame — arrive whole and in order.
    #[test]
    fn a_link_keeps_frames_whole_and_in_order() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (ptx, prx) = mpsc::channel::<Vec<u8>>();
        let link = Arc::new(Link {
            tx: ptx,
            queued: std::sync::atomic::AtomicUsize::new(0),
            inline: Mutex::new(None),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (l, stop) = (link.clone(), stop.clone());
            std::thread::spawn(move || writer_loop((7, 9), addr, None, prx, l, stop, None))
        };
        // Frames of growing size, some larger than a socket buffer takes at once, sent
        // while the reader is slow at first (so the socket fills and the writer thread
        // takes over) and then keeps up (so sends go inline).
        let n = 1000u32;
        let sender = {
            let link = link.clone();
            std::thread::spawn(move || {
                for i in 0..n {
                    let len = 16 + (i as usize * 7919) % (if i % 10 == 0 { 100_000 } else { 4096 });
                    let mut payload = vec![(i % 251) as u8; len];
                    payload[..4].copy_from_slice(&i.to_le_bytes());
                    link.send(frame(&payload));
                    if i % 20 == 0 {
                        // Let the queue drain, so the next sends go inline.
                        std::thread::sleep(Duration::from_millis(2));
                    }
                }
            })
        };
        // The writer thread dials once the first frame is queued.
        let (mut rx, _) = listener.accept().unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        // A small receive buffer, so the socket often takes only part of a frame.
        socket2::SockRef::from(&rx)
            .set_recv_buffer_size(64 << 10)
            .unwrap();
        let mut hello = [0u8; 16];
        rx.read_exact(&mut hello).unwrap();
        assert_eq!(u64::from_le_bytes(hello[..8].try_into().unwrap()), 7);
        for i in 0..n {
            if i % 100 == 0 {
                // Stop reading for a while: the socket fills, and sends go in part.
                std::thread::sleep(Duration::from_millis(30));
            }
            let mut head = [0u8; 8];
            rx.read_exact(&mut head).unwrap();
            let len = u32::from_le_bytes(head[..4].try_into().unwrap()) as usize;
            let mut payload = vec![0u8; len];
            rx.read_exact(&mut payload).unwrap();
            assert_eq!(
                crc32c::crc32c(&payload),
                u32::from_le_bytes(head[4..].try_into().unwrap()),
                "frame {i} damaged"
            );
            assert_eq!(
                u32::from_le_bytes(payload[..4].try_into().unwrap()),
                i,
                "out of order"
            );
        }
        sender.join().unwrap();
        assert!(
            link.inline.lock().unwrap().is_some(),
            "the socket was never shared"
        );
        stop.store(true, Ordering::Relaxed);
        drop(link);
        writer.join().unwrap();
    }
}
