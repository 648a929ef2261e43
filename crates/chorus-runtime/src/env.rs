//! The environment (PALF's PALFEnv, section 3.3): one per process. It owns the data
//! directory, the worker pool shared by every log group, the transport and the timer,
//! and hosts any number of log groups.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use chorus_core::format::meta::{AccessMode, ConfigVersion, NodeId};
use chorus_core::replica::{MembershipChange, Message, Nanos, ReplicaConfig};
use chorus_core::{Csn, Lsn};
use chorus_storage::{LogOptions, StorageError};
use tokio::sync::watch;

use crate::error::Error;
use crate::group::{Appended, EnvShared, Group, GroupId, GroupStatus, Record, RoleInfo};
use crate::ooo::{OooNode, OooNodeConfig, OooNodeError, OooStateMachine};
use crate::pool::Pool;
use crate::transport::{Handler, TcpConfig, TcpTransport, TlsFiles, Transport, TransportStats};
use chorus_core::ooo::replica::Msg as OooMsg;

mod ooo_groups;
mod ooo_spec;
mod render;
pub use ooo_groups::{
    GroupMode, HostedGroup, ListedGroup, NotStarted, OooGroupSettings, OooHandle, StateMachines,
    RELEASE_WAIT,
};
pub use ooo_spec::{OooGroupSpec, SpecError, MAX_PARAMS, MAX_REPLICAS, MAX_SPAN, SPEC_FILE};
pub use render::mode_label;

/// Settings of an [`Env`].
#[derive(Clone, Debug)]
pub struct EnvConfig {
    /// This node's id (unique in the cluster, never 0).
    pub node: NodeId,
    /// Directory holding every group of every mode, each in `groups/{id:020}/`: an
    /// ordered group's log and meta, or an out-of-order group's spec (`ooo.spec`),
    /// replica store and state machine files.
    pub data_dir: PathBuf,
    /// Cluster identity checked in every connection handshake.
    pub cluster_id: u64,
    /// Replication listen address (port 0 picks one).
    pub listen: SocketAddr,
    /// Address peers dial to reach this node, if not `listen`.
    pub advertise: Option<String>,
    /// Replication addresses of the other nodes.
    pub peers: HashMap<NodeId, String>,
    /// Worker threads shared by all groups (they also run the fsyncs).
    pub io_workers: usize,
    /// How many ordered groups with work one IO worker steps together, sharing its
    /// wake-up, one `send` per peer and the wait for their syncs (docs/architecture.md, "Passes");
    /// 1 steps each group on its own. Default [`DEFAULT_PASS_GROUPS`].
    pub pass_groups: usize,
    /// Pipelined group commit for ordered groups: a group's log sync runs on a sync
    /// thread while its next rounds write the next batch (one sync in flight per group,
    /// each reported only up to the point it began at). Off: the IO worker syncs after
    /// each write before the group's next round. Off by default: on the 2-core machine of
    /// docs/benchmarks.md the hand-off to the sync thread costs more CPU than the overlap
    /// saves (`chorus bench --pipelined-sync`).
    pub pipelined_sync: bool,
    /// Threads shared by every out-of-order group's state machine: applying released
    /// entries, checkpoints, images ([`crate::ooo`]).
    pub apply_threads: usize,
    /// Replica timings and limits (the `id` and `seed` fields are set per group).
    pub replica: ReplicaConfig,
    /// Log storage options.
    pub log: LogOptions,
    /// Largest replication frame.
    pub max_frame_bytes: u32,
    /// Mutual TLS for replication, when set.
    pub tls: Option<TlsFiles>,
    /// A leader refuses appends ([`Error::DiskLow`]) while the file system holding
    /// `data_dir` has fewer bytes than this available, so that it does not fill up and
    /// stop the group ([`crate::disk`]); 0 turns the guard off. Default
    /// [`DEFAULT_MIN_FREE_BYTES`].
    pub min_free_bytes: u64,
    /// The file system the groups' logs and meta records are on: the real one by
    /// default. Tests put a full disk here ([`chorus_storage::fs::Fillable`]).
    pub fs: Arc<dyn chorus_storage::fs::FileSystem>,
    /// Scrubbing of the ordered groups' sealed log blocks ([`crate::scrub`]).
    pub scrub: crate::ScrubOptions,
    /// Settings every out-of-order group of this node shares.
    pub ooo: OooGroupSettings,
    /// Opens the state machines of out-of-order groups. None: this node hosts none (a
    /// data directory holding one is refused, [`Error::NoStateMachines`]).
    pub state_machines: Option<Arc<dyn StateMachines>>,
}

/// Default of [`EnvConfig::pass_groups`].
pub const DEFAULT_PASS_GROUPS: usize = 32;

/// Default of [`EnvConfig::min_free_bytes`]: 128 MiB, room for the appends in flight
/// (a leader's window is 64 MiB by default) and a new block file after the refusals
/// start.
pub const DEFAULT_MIN_FREE_BYTES: u64 = 128 << 20;

impl EnvConfig {
    /// Defaults for `node` with data under `data_dir`, listening on `listen`.
    pub fn new(node: NodeId, data_dir: impl Into<PathBuf>, listen: SocketAddr) -> Self {
        Self {
            node,
            data_dir: data_dir.into(),
            cluster_id: 1,
            listen,
            advertise: None,
            peers: HashMap::new(),
            io_workers: 4,
            pass_groups: DEFAULT_PASS_GROUPS,
            pipelined_sync: false,
            apply_threads: 2,
            replica: ReplicaConfig {
                // Adaptive group replication (PALF section 6): with the log IO idle, a group
                // of fewer entries than there are cores ships at once — that many appenders
                // can be running at the same moment, so waiting would only add latency;
                // beyond that, the group fills while the IO runs. Derived from the machine,
                // not hand-tuned.
                group_factor_threshold: std::thread::available_parallelism()
                    .map_or(2, |n| n.get() as u32),
                ..ReplicaConfig::default()
            },
            log: LogOptions::default(),
            max_frame_bytes: chorus_core::format::wire::DEFAULT_MAX_FRAME_BYTES,
            tls: None,
            min_free_bytes: DEFAULT_MIN_FREE_BYTES,
            fs: Arc::new(chorus_storage::fs::RealFs),
            scrub: crate::ScrubOptions::default(),
            ooo: OooGroupSettings::default(),
            state_machines: None,
        }
    }

    fn check(&self) -> Result<(), Error> {
        let bad = |setting: &str, value: String, accepted: &str| {
            Err(Error::Config {
                setting: setting.into(),
                value,
                accepted: accepted.into(),
            })
        };
        if self.node == 0 {
            return bad("node", "0".into(), "a node id from 1 to 2^64-1");
        }
        if self.io_workers == 0 || self.io_workers > 256 {
            return bad("io_workers", self.io_workers.to_string(), "1 to 256");
        }
        if self.pass_groups == 0 || self.pass_groups > 4096 {
            return bad("pass_groups", self.pass_groups.to_string(), "1 to 4096");
        }
        if self.apply_threads == 0 || self.apply_threads > 256 {
            return bad("apply_threads", self.apply_threads.to_string(), "1 to 256");
        }
        if self.ooo.apply_threads > 64 {
            return bad(
                "ooo.apply_threads",
                self.ooo.apply_threads.to_string(),
                "0 to 64",
            );
        }
        if self.ooo.election_timeout < Duration::from_millis(10) {
            return bad(
                "ooo.election_timeout",
                format!("{:?}", self.ooo.election_timeout),
                "at least 10 ms",
            );
        }
        if let Some(a) = &self.advertise {
            let max = chorus_core::format::wire::MAX_LISTEN_ADDR_BYTES;
            if a.is_empty() || a.len() > max {
                return bad(
                    "advertise",
                    a.clone(),
                    &format!("HOST:PORT of 1 to {max} bytes"),
                );
            }
        }
        if self.replica.max_group_bytes > self.replica.max_message_bytes {
            return bad(
                "replica.max_group_bytes",
                self.replica.max_group_bytes.to_string(),
                "at most replica.max_message_bytes (a message carries whole groups)",
            );
        }
        let frame_floor = (self.replica.max_message_bytes as u64) + (1 << 16);
        if (self.max_frame_bytes as u64) < frame_floor {
            return bad(
                "max_frame_bytes",
                self.max_frame_bytes.to_string(),
                &format!("at least the replica's max_message_bytes plus 64 KiB ({frame_floor})"),
            );
        }
        Ok(())
    }
}

/// An out-of-order group on the router: its incarnation, the node, its driver task.
type OooEntry = (
    u64,
    std::sync::Weak<OooNode>,
    Arc<crate::ooo::task::OooTask>,
);

struct Router {
    groups: RwLock<HashMap<GroupId, Arc<Group>>>,
    /// The out-of-order groups this node hosts, each with the incarnation it was started
    /// as (a restarted group's old node, dropped later, must not take the new one off).
    /// Weak: whoever started the group owns it, and dropping it stops the group.
    /// The driver task is held here too, so the timer polls it without taking (and
    /// perhaps dropping last) the node itself.
    ooo: RwLock<HashMap<GroupId, OooEntry>>,
    /// Incarnations handed out to out-of-order groups.
    ooo_started: AtomicU64,
    unknown_group: std::sync::atomic::AtomicU64,
}

impl Router {
    /// Whether group `id` runs here, in any mode.
    fn hosts(&self, id: GroupId) -> bool {
        self.groups.read().expect("groups").contains_key(&id)
            || self
                .ooo
                .read()
                .expect("ooo groups")
                .get(&id)
                .is_some_and(|(_, n, _)| n.strong_count() > 0)
    }
}

impl Handler for Router {
    fn deliver_ooo(&self, from: NodeId, group: u64, msg: OooMsg) {
        let node = self
            .ooo
            .read()
            .expect("ooo groups")
            .get(&group)
            .and_then(|(_, n, _)| n.upgrade());
        match node {
            Some(n) => n.deliver(from, msg),
            None => {
                self.unknown_group.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(from, group, "message for an unknown group dropped");
            }
        }
    }

    fn deliver(&self, from: NodeId, group: u64, msg: Message) {
        let g = self.groups.read().expect("groups").get(&group).cloned();
        match g {
            Some(g) => g.deliver(from, msg),
            None => {
                // Counted and logged, never fatal: a group being created or removed on
                // this node, or a misdirected peer.
                self.unknown_group.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(from, group, "message for an unknown group dropped");
            }
        }
    }
}

/// One process's Chorus environment. Cheap to clone (a handle).
#[derive(Clone)]
pub struct Env {
    inner: Arc<Inner>,
}

struct Inner {
    cfg: EnvConfig,
    shared: Arc<EnvShared>,
    router: Arc<Router>,
    transport: Arc<TcpTransport>,
    timer: Mutex<Option<JoinHandle<()>>>,
    create_lock: Mutex<()>,
    stopped: std::sync::atomic::AtomicBool,
    /// Groups of any mode that did not start: found damaged at open
    /// ([`Error::GroupDamaged`]), or an out-of-order group that did not start again when
    /// restarted. None of them is routed or registered.
    damaged: Mutex<BTreeMap<GroupId, NotStarted>>,
    /// The out-of-order groups started from their specs, the only strong holders of
    /// their nodes besides the handles lent out.
    ooo: ooo_groups::Registry,
}

/// Whether a group failed to open because its files are damaged — as opposed to an IO
/// error or a setting, which concern the whole node — so the node may go on without it.
/// The ordered driver step's settings: the defaults, or, in a test-only `broken` build,
/// a step broken as `CHORUS_BROKEN` names (`flushed-before-sync`: writes reported durable
/// before their sync; `ack-past-sync-point`: a sync reported as covering what was written
/// while it ran; `skip-fsync`: the log's syncs skipped).
fn step_settings() -> crate::ordered::StepSettings {
    #[allow(unused_mut)]
    let mut s = crate::ordered::StepSettings::default();
    #[cfg(feature = "broken")]
    match std::env::var("CHORUS_BROKEN").as_deref() {
        Ok("flushed-before-sync") => s.broken_flushed_before_sync = true,
        Ok("ack-past-sync-point") => s.broken_ack_past_sync_point = true,
        Ok("skip-fsync") => s.broken_skip_fsync = true,
        _ => {}
    }
    s
}

/// Test-only `broken` build: whether `CHORUS_BROKEN=skip-fsync` asks every log's syncs
/// skipped, the out-of-order groups' entries files included (read once per process).
#[cfg(feature = "broken")]
pub(crate) fn broken_skip_fsync() -> bool {
    static SKIP: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SKIP.get_or_init(|| std::env::var("CHORUS_BROKEN").as_deref() == Ok("skip-fsync"))
}

fn is_damage(e: &Error) -> bool {
    matches!(
        e,
        Error::Storage {
            source: StorageError::Corrupt { .. }
                | StorageError::CorruptRecord { .. }
                | StorageError::ForeignBlock { .. }
                | StorageError::Layout { .. }
                | StorageError::NotFound { .. },
            ..
        } | Error::Spec { .. }
            | Error::StateMachineDamaged { .. }
    )
}

impl std::fmt::Debug for Env {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Env")
            .field("node", &self.inner.cfg.node)
            .field("data_dir", &self.inner.cfg.data_dir)
            .finish()
    }
}

impl Env {
    /// Opens (or initialises) the data directory, opens every group of every mode found
    /// in it, and starts the transport, the worker pool and the timer. A group whose files
    /// are damaged does not start ([`Env::not_started`]); the others do.
    pub fn open(cfg: EnvConfig) -> Result<Env, Error> {
        cfg.check()?;
        let groups_dir = cfg.data_dir.join("groups");
        std::fs::create_dir_all(&groups_dir).map_err(|e| Error::Io {
            what: format!("create {}", groups_dir.display()),
            source: e,
        })?;
        let shared = Arc::new(EnvShared {
            node: cfg.node,
            start: Instant::now(),
            transport: std::sync::OnceLock::new(),
            pool: Pool::new(cfg.pass_groups),
            apply: crate::pool::ApplyPool::start("apply", cfg.apply_threads).map_err(|e| {
                Error::Io {
                    what: "start apply workers".into(),
                    source: e,
                }
            })?,
            // With pipelined syncs, as many sync threads as IO workers: each worker may
            // have a group whose sync runs while it goes on writing.
            pipelined_sync: cfg.pipelined_sync,
            syncers: crate::pool::ApplyPool::start(
                "sync",
                if cfg.pipelined_sync {
                    cfg.io_workers
                } else {
                    0
                },
            )
            .map_err(|e| Error::Io {
                what: "start sync threads".into(),
                source: e,
            })?,
            replica: cfg.replica.clone(),
            log: cfg.log,
            fsync_hist: Default::default(),
            timer: std::sync::OnceLock::new(),
            timer_next: AtomicU64::new(0),
            disk: Arc::new(crate::DiskSpace::new(&cfg.data_dir, cfg.min_free_bytes)),
            restarts: AtomicU64::new(0),
            fs: cfg.fs.clone(),
            step: step_settings(),
        });
        let router = Arc::new(Router {
            groups: RwLock::new(HashMap::new()),
            ooo: RwLock::new(HashMap::new()),
            ooo_started: AtomicU64::new(0),
            unknown_group: Default::default(),
        });
        // Open existing groups before any message can arrive for them.
        let mut found = Vec::new();
        let entries = std::fs::read_dir(&groups_dir).map_err(|e| Error::Io {
            what: format!("list {}", groups_dir.display()),
            source: e,
        })?;
        for e in entries {
            let e = e.map_err(|e| Error::Io {
                what: format!("list {}", groups_dir.display()),
                source: e,
            })?;
            let name = e.file_name();
            let Some(id) = name.to_str().and_then(|s| s.parse::<u64>().ok()) else {
                tracing::warn!(entry = ?name, "ignoring a non-group entry in the groups directory");
                continue;
            };
            found.push((id, e.path()));
        }
        found.sort();
        // An out-of-order group's directory has its spec; it starts once the transport
        // it sends on runs (below).
        let mut ooo_found = Vec::new();
        let mut ordered_found = Vec::new();
        for (id, path) in found {
            let spec = ooo_spec::spec_path(&path);
            let is_ooo = cfg.fs.exists(&spec).map_err(|e| Error::Io {
                what: format!("look for {}", spec.display()),
                source: e,
            })?;
            if is_ooo {
                ooo_found.push((id, path));
            } else {
                ordered_found.push((id, path));
            }
        }
        if let (Some((id, _)), None) = (ooo_found.first(), &cfg.state_machines) {
            return Err(Error::NoStateMachines(*id));
        }
        // A group damaged beyond what its replica repairs alone stays on disk, not
        // started: the node serves its other groups, and the operator replaces the
        // replica (docs/operations.md, "A damaged replica").
        let mut damaged = BTreeMap::new();
        for (id, path) in ordered_found {
            match Group::open(shared.clone(), id, &path) {
                Ok(g) => {
                    router.groups.write().expect("groups").insert(id, g);
                }
                Err(e) if is_damage(&e) => {
                    tracing::error!(
                        group = id,
                        error = %e,
                        "log group not started: its files are damaged; the node serves \
                         its other groups (docs/operations.md: a damaged replica)"
                    );
                    damaged.insert(
                        id,
                        NotStarted {
                            reason: e.to_string(),
                            mode: Some(GroupMode::Ordered),
                            spec: None,
                        },
                    );
                }
                Err(e) => return Err(e),
            }
        }
        let mut tcfg = TcpConfig::new(cfg.node, cfg.listen);
        tcfg.cluster_id = cfg.cluster_id;
        tcfg.advertise = cfg.advertise.clone();
        tcfg.peers = cfg.peers.clone();
        // Out-of-order groups share the transport; their messages may be larger than an
        // ordered group's (`crate::ooo::MIN_FRAME_BYTES`). A sender still bounds each
        // ordered message by the replica's `max_message_bytes`.
        tcfg.max_frame_bytes = cfg.max_frame_bytes.max(crate::ooo::MIN_FRAME_BYTES);
        tcfg.tls = cfg.tls.clone();
        let transport = Arc::new(TcpTransport::start(tcfg, router.clone())?);
        let t: Arc<dyn Transport> = transport.clone();
        let _ = shared.transport.set(t);
        Pool::start(&shared, cfg.io_workers).map_err(|e| Error::Io {
            what: "start io workers".into(),
            source: e,
        })?;
        let env = Env {
            inner: Arc::new(Inner {
                cfg,
                shared,
                router,
                transport,
                timer: Mutex::new(None),
                create_lock: Mutex::new(()),
                stopped: Default::default(),
                damaged: Mutex::new(damaged),
                ooo: Default::default(),
            }),
        };
        let weak = Arc::downgrade(&env.inner);
        let timer = std::thread::Builder::new()
            .name("chorus-timer".into())
            .spawn(move || timer_loop(weak))
            .map_err(|e| Error::Io {
                what: "start timer".into(),
                source: e,
            })?;
        let _ = env.inner.shared.timer.set(timer.thread().clone());
        *env.inner.timer.lock().expect("timer") = Some(timer);
        let (list, stop) = (Arc::downgrade(&env.inner), Arc::downgrade(&env.inner));
        let scrub = env.inner.cfg.scrub;
        std::thread::Builder::new()
            .name("chorus-scrub".into())
            .spawn(move || {
                crate::scrub::run(
                    scrub,
                    || {
                        let inner = list.upgrade()?;
                        let groups = inner.router.groups.read().expect("groups");
                        Some(groups.values().cloned().collect())
                    },
                    || {
                        stop.upgrade()
                            .is_none_or(|i| i.stopped.load(Ordering::SeqCst))
                    },
                )
            })
            .map_err(|e| Error::Io {
                what: "start scrubber".into(),
                source: e,
            })?;
        for g in env.inner.router.groups.read().expect("groups").values() {
            env.inner.shared.pool.schedule(g);
        }
        ooo_groups::open_all(&env.inner, ooo_found)?;
        Ok(env)
    }

    /// This node's id.
    pub fn node(&self) -> NodeId {
        self.inner.cfg.node
    }

    /// The free-space guard of the data directory ([`EnvConfig::min_free_bytes`]),
    /// measured by the environment every [`crate::DiskSpace::REFRESH`]; out-of-order
    /// nodes on the same disk share it ([`crate::ooo::OooNodeConfig::disk`]).
    pub fn disk_space(&self) -> Arc<crate::DiskSpace> {
        self.inner.shared.disk.clone()
    }

    /// The replication address this node listens on.
    pub fn replication_addr(&self) -> SocketAddr {
        self.inner.transport.local_addr()
    }

    /// Teaches the transport a peer's replication address (for example a new member's).
    pub fn set_peer_addr(&self, node: NodeId, addr: String) {
        self.inner.transport.set_peer_addr(node, addr);
    }

    /// Creates log group `id` on this node with the initial membership. Every initial
    /// voter must create it with the same membership; a node joining later (as learner
    /// or voter, added by the leader) creates it with empty `voters` and learns the
    /// membership from the leader.
    pub fn create_group(
        &self,
        id: GroupId,
        voters: &[NodeId],
        learners: &[NodeId],
    ) -> Result<LogHandle, Error> {
        self.create_group_in_mode(id, voters, learners, AccessMode::Append)
    }

    /// [`Env::create_group`] in the given access mode: [`AccessMode::RawWrite`] creates a
    /// mirror, which takes only groups another log committed ([`LogHandle::mirror`])
    /// until it is switched ([`LogHandle::change_access_mode`]; PALF section 5.2).
    pub fn create_group_in_mode(
        &self,
        id: GroupId,
        voters: &[NodeId],
        learners: &[NodeId],
        access_mode: AccessMode,
    ) -> Result<LogHandle, Error> {
        self.check_running()?;
        let _guard = self.inner.create_lock.lock().expect("create");
        self.check_damaged(id)?;
        if self.inner.router.hosts(id) {
            return Err(Error::GroupExists(id));
        }
        let dir = self.group_dir(id);
        if dir.exists() {
            return Err(Error::GroupExists(id));
        }
        let g = Group::create(
            self.inner.shared.clone(),
            id,
            &dir,
            voters.to_vec(),
            learners.to_vec(),
            access_mode,
        )?;
        self.inner
            .router
            .groups
            .write()
            .expect("groups")
            .insert(id, g.clone());
        self.inner.shared.pool.schedule(&g);
        tracing::info!(
            group = id,
            ?voters,
            ?learners,
            mode = access_mode.name(),
            "group created"
        );
        Ok(LogHandle { g })
    }

    /// Starts out-of-order group `cfg.group` (parallel or dependent mode) on this node
    /// from its directory `cfg.dir` (created empty if new): its messages share this
    /// node's transport — one connection per peer, with its bounds and TLS — keyed by the
    /// group id, and the replicas it sends to are reached at this node's peer addresses.
    /// `sm` applies its committed entries. The group runs until the returned node is
    /// dropped. A group id in use on this node, in any mode, is refused. The caller owns
    /// the group's directory and lifecycle (benchmarks, tests): the environment neither
    /// reopens such a group at its next start nor deletes or restarts it — a group made
    /// with [`Env::create_ooo_group`] it does.
    pub fn start_ooo_group(
        &self,
        cfg: OooNodeConfig,
        sm: Arc<dyn OooStateMachine>,
    ) -> Result<Arc<OooNode>, OooNodeError> {
        if self.inner.stopped.load(Ordering::SeqCst) {
            return Err(OooNodeError::Shutdown);
        }
        let _guard = self.inner.create_lock.lock().expect("create");
        let id = cfg.group;
        if self.inner.router.hosts(id)
            || self
                .inner
                .damaged
                .lock()
                .expect("damaged")
                .contains_key(&id)
        {
            return Err(OooNodeError::Exists(id));
        }
        launch(&self.inner, cfg, sm)
    }

    /// Ids of the out-of-order groups running on this node, ascending.
    pub fn ooo_groups(&self) -> Vec<GroupId> {
        let ooo = self.inner.router.ooo.read().expect("ooo groups");
        let mut v: Vec<_> = ooo
            .iter()
            .filter(|(_, (_, n, _))| n.strong_count() > 0)
            .map(|(&id, _)| id)
            .collect();
        v.sort();
        v
    }

    /// [`Error::GroupDamaged`] for a group that did not start because it is damaged.
    fn check_damaged(&self, id: GroupId) -> Result<(), Error> {
        match self.inner.damaged.lock().expect("damaged").get(&id) {
            Some(n) => Err(Error::GroupDamaged {
                group: id,
                reason: n.reason.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Groups of any mode that did not start here — their files were found damaged when
    /// this node started, or an out-of-order group did not start again when restarted —
    /// with why ([`Error::GroupDamaged`]; [`Env::not_started`] has their modes), until
    /// [`Env::restart_group`] starts or [`Env::remove_group`] deletes them.
    pub fn damaged_groups(&self) -> Vec<(GroupId, String)> {
        let d = self.inner.damaged.lock().expect("damaged");
        d.iter().map(|(&id, n)| (id, n.reason.clone())).collect()
    }

    /// The ordered group `id`, if this node hosts it; [`Error::GroupDamaged`] if a group
    /// `id` did not start here ([`Env::hosted`] resolves an id of any mode).
    pub fn group(&self, id: GroupId) -> Result<LogHandle, Error> {
        self.check_damaged(id)?;
        routed(&self.inner, id).map(|g| LogHandle { g })
    }

    /// Ids of the ordered groups this node runs (or that stopped), ascending
    /// ([`Env::list_groups`] lists every group of every mode).
    pub fn ordered_groups(&self) -> Vec<GroupId> {
        let mut v: Vec<_> = self
            .inner
            .router
            .groups
            .read()
            .expect("groups")
            .keys()
            .copied()
            .collect();
        v.sort();
        v
    }

    /// Stops hosting group `id`, of any mode, and deletes its directory. Its pending
    /// appends resolve as stopped. An out-of-order group is stopped once no one else
    /// holds its handle, waiting up to [`RELEASE_WAIT`] ([`Error::GroupBusy`] if still
    /// held; it keeps running). A group that did not start is deleted as found. (Remove
    /// the node from the group's membership first, or the group loses a replica.)
    pub fn remove_group(&self, id: GroupId) -> Result<(), Error> {
        let mut damaged = self.inner.damaged.lock().expect("damaged");
        if damaged.contains_key(&id) {
            // Nothing runs: its files go, and the group can be created again, empty. It
            // stays named damaged if they cannot be removed.
            let dir = self.group_dir(id);
            std::fs::remove_dir_all(&dir).map_err(|e| Error::Io {
                what: format!("remove {}", dir.display()),
                source: e,
            })?;
            damaged.remove(&id);
            tracing::info!(group = id, "damaged group removed");
            return Ok(());
        }
        drop(damaged);
        if self.inner.ooo.contains(id) {
            return ooo_groups::remove(&self.inner, id, RELEASE_WAIT);
        }
        let g = self
            .inner
            .router
            .groups
            .write()
            .expect("groups")
            .remove(&id)
            .ok_or(Error::NoSuchGroup(id))?;
        g.shutdown();
        // Wait for a worker that may be running it.
        let deadline = Instant::now() + Duration::from_secs(10);
        while g.sched.is_running() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::fs::remove_dir_all(&g.dir).map_err(|e| Error::Io {
            what: format!("remove {}", g.dir.display()),
            source: e,
        })?;
        tracing::info!(group = id, "group removed");
        Ok(())
    }

    /// Starts group `id`, of any mode, again on this node, from its files, as a node
    /// restart would:
    /// for a group that stopped while running (its storage failed — a full disk, an IO
    /// error — or its replica halted) once the cause is fixed, and for one that did not
    /// start because its files were damaged. Its log is recovered as after a crash (a torn
    /// tail cut, every synced record kept) and its replica starts as at a node start (a
    /// follower that catches up from the leader); the node's other groups are not
    /// touched. A running group is refused ([`Error::GroupRunning`]). If the group
    /// cannot be opened it stays as it was (stopped, with why; or damaged) and the error
    /// is returned.
    ///
    /// Handles taken before the restart keep answering for the stopped incarnation
    /// ([`Error::NotRunning`]): take a new one with [`Env::group`] or [`Env::hosted`]. An
    /// out-of-order group is restarted once no one else holds its handle, waiting up to
    /// [`RELEASE_WAIT`] ([`Error::GroupBusy`]); one that does not start again is kept
    /// among those that did not start ([`Env::not_started`]).
    pub fn restart_group(&self, id: GroupId) -> Result<HostedGroup, Error> {
        if self.inner.stopped.load(Ordering::SeqCst) {
            return Err(Error::Shutdown);
        }
        let damaged = self
            .inner
            .damaged
            .lock()
            .expect("damaged")
            .contains_key(&id);
        if self.inner.ooo.contains(id)
            || (damaged && ooo_groups::is_ooo_dir(&self.inner, &self.group_dir(id))?)
        {
            return ooo_groups::restart(&self.inner, id, RELEASE_WAIT).map(HostedGroup::OutOfOrder);
        }
        restart_group(&self.inner, id).map(|g| HostedGroup::Ordered(LogHandle { g }))
    }

    /// Log `fdatasync`s the node's ordered groups have run since it opened (each may
    /// make several groups' writes durable: [`crate::group`]).
    pub fn log_fsyncs(&self) -> u64 {
        self.inner.shared.fsync_hist.count()
    }

    /// Transport counters.
    pub fn transport_stats(&self) -> TransportStats {
        self.inner.transport.stats()
    }

    /// Stops the timer, the transport and the workers. Pending appends resolve as
    /// stopped (outcome unknown). Data on disk is untouched.
    pub fn shutdown(&self) {
        if self.inner.stopped.swap(true, Ordering::SeqCst) {
            return;
        }
        if let Some(t) = self.inner.timer.lock().expect("timer").take() {
            let _ = t.join();
        }
        // The out-of-order groups finish their work while the workers still run it.
        self.inner.ooo.clear();
        self.inner.transport.shutdown();
        // Syncs in flight finish first (each then wakes its group on the pool).
        self.inner.shared.syncers.shutdown();
        self.inner.shared.pool.shutdown();
        self.inner.shared.apply.shutdown();
        let groups: Vec<_> = self
            .inner
            .router
            .groups
            .write()
            .expect("groups")
            .drain()
            .map(|(_, g)| g)
            .collect();
        for g in groups {
            g.shutdown();
        }
    }

    /// Whether [`Env::shutdown`] ran: its groups are gone because the node stops, not
    /// because they were deleted.
    pub fn is_shut_down(&self) -> bool {
        self.inner.stopped.load(Ordering::SeqCst)
    }

    fn check_running(&self) -> Result<(), Error> {
        if self.inner.stopped.load(Ordering::SeqCst) {
            return Err(Error::Shutdown);
        }
        Ok(())
    }

    fn group_dir(&self, id: GroupId) -> PathBuf {
        group_dir(&self.inner.cfg.data_dir, id)
    }
}

/// Directory of group `id` under a data directory.
pub fn group_dir(data_dir: &Path, id: GroupId) -> PathBuf {
    data_dir.join("groups").join(format!("{id:020}"))
}

/// Starts an out-of-order group's replica on the environment's workers and transport and
/// routes its messages to it (weakly: the group stops when the returned node is
/// dropped). The caller holds `create_lock` and has checked that the id is free.
fn launch(
    inner: &Inner,
    cfg: OooNodeConfig,
    sm: Arc<dyn OooStateMachine>,
) -> Result<Arc<OooNode>, OooNodeError> {
    let id = cfg.group;
    let node = Arc::new(OooNode::start(cfg, inner.shared.clone(), sm)?);
    let router = &inner.router;
    let incarnation = router.ooo_started.fetch_add(1, Ordering::Relaxed) + 1;
    router
        .ooo
        .write()
        .expect("ooo groups")
        .insert(id, (incarnation, Arc::downgrade(&node), node.task()));
    let weak = Arc::downgrade(router);
    node.on_drop(Box::new(move || {
        if let Some(r) = weak.upgrade() {
            let mut ooo = r.ooo.write().expect("ooo groups");
            if ooo.get(&id).is_some_and(|(i, _, _)| *i == incarnation) {
                ooo.remove(&id);
            }
        }
    }));
    tracing::info!(group = id, "out-of-order group started");
    Ok(node)
}

/// [`Env::restart_group`] of an ordered group, for the environment's own threads too
/// (the timer restarts groups a full disk stopped).
fn restart_group(inner: &Arc<Inner>, id: GroupId) -> Result<Arc<Group>, Error> {
    if inner.stopped.load(Ordering::SeqCst) {
        return Err(Error::Shutdown);
    }
    let _guard = inner.create_lock.lock().expect("create");
    let dir = group_dir(&inner.cfg.data_dir, id);
    if inner.damaged.lock().expect("damaged").contains_key(&id) {
        return match Group::open(inner.shared.clone(), id, &dir) {
            Ok(g) => {
                inner.damaged.lock().expect("damaged").remove(&id);
                Ok(install_restarted(inner, g))
            }
            Err(e) => {
                if is_damage(&e) {
                    let mut d = inner.damaged.lock().expect("damaged");
                    d.insert(
                        id,
                        NotStarted {
                            reason: e.to_string(),
                            mode: Some(GroupMode::Ordered),
                            spec: None,
                        },
                    );
                }
                Err(e)
            }
        };
    }
    let old = routed(inner, id)?;
    let Some(reason) = old.status().stopped else {
        return Err(Error::GroupRunning(id));
    };
    // The stopped incarnation does no more IO once no worker runs it: its storage
    // refuses every write after the failure, and a removed group is never run again.
    old.shutdown();
    let deadline = Instant::now() + Duration::from_secs(10);
    while old.sched.is_running() {
        if Instant::now() >= deadline {
            return Err(Error::NotRunning {
                group: id,
                reason: format!("{reason} (its last run has not finished; try again)"),
            });
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    match Group::open(inner.shared.clone(), id, &dir) {
        Ok(g) => {
            tracing::warn!(group = id, stopped = %reason, "stopped group restarted");
            Ok(install_restarted(inner, g))
        }
        Err(e) => {
            tracing::error!(group = id, error = %e, "stopped group could not restart");
            Err(e)
        }
    }
}

/// The running (or stopped) group `id` messages are routed to.
fn routed(inner: &Inner, id: GroupId) -> Result<Arc<Group>, Error> {
    let groups = inner.router.groups.read().expect("groups");
    groups.get(&id).cloned().ok_or(Error::NoSuchGroup(id))
}

/// Routes to and schedules a restarted group (replacing its stopped incarnation).
fn install_restarted(inner: &Inner, g: Arc<Group>) -> Arc<Group> {
    let id = g.id;
    inner
        .router
        .groups
        .write()
        .expect("groups")
        .insert(id, g.clone());
    inner.shared.restarts.fetch_add(1, Ordering::Relaxed);
    inner.shared.pool.schedule(&g);
    g
}

/// Restarts, each on a thread of its own, the groups a full disk stopped once the data
/// directory has room again: above `min_free_bytes` and at least a block free. A
/// restart is the operator's `chorus group restart`, so it is as safe as a node restart
/// (the log is recovered as after a crash); one that fails, or a disk that fills again,
/// is tried again after [`crate::disk::FULL_DISK_RESTART_BACKOFF`].
fn restart_groups_stopped_by_a_full_disk(inner: &Arc<Inner>) {
    if !inner.shared.disk.has_room(inner.shared.log.block_size) {
        return;
    }
    ooo_groups::restart_stopped_by_full_disk(inner);
    let backoff = crate::disk::FULL_DISK_RESTART_BACKOFF.as_nanos() as Nanos;
    let now = inner.shared.now();
    let due: Vec<GroupId> = inner
        .router
        .groups
        .read()
        .expect("groups")
        .values()
        .filter(|g| g.stopped_by_full_disk.load(Ordering::SeqCst))
        .filter(|g| {
            let tried = g.restart_tried.load(Ordering::Relaxed);
            tried == 0 || now.saturating_sub(tried) >= backoff
        })
        .map(|g| {
            g.restart_tried.store(now.max(1), Ordering::Relaxed);
            g.id
        })
        .collect();
    for id in due {
        let inner = inner.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("chorus-restart-{id}"))
            .spawn(move || match restart_group(&inner, id) {
                Ok(_) => tracing::warn!(
                    group = id,
                    "group stopped by a full disk restarted: the disk has room again"
                ),
                Err(e) => tracing::warn!(
                    group = id,
                    error = %e,
                    "group stopped by a full disk did not restart; trying again later"
                ),
            });
        if let Err(e) = spawned {
            tracing::warn!(group = id, error = %e, "cannot start a restart thread");
        }
    }
}

/// Ticks every group: often (1 ms, the freeze interval of PALF section 6) while it has
/// appends waiting, otherwise every 10 ms (pings, heartbeats and leases are hundreds of
/// milliseconds), and when its next timed resend is due (`Group::resend_at`; a group
/// that sets an earlier one than the timer's next wake unparks it).
fn timer_loop(env: std::sync::Weak<Inner>) {
    // The longest the timer sleeps (it also refreshes the free-space guard).
    const PERIOD: Nanos = 100_000_000;
    // A group with appends in flight ticks every millisecond (its freeze and lease
    // bookkeeping); a group at rest every quarter heartbeat interval, between 10 and 50
    // ms: its timers are deadlines the replica checks on each tick, so they fire at most
    // that late, and a node at rest runs each group a few dozen times a second.
    const BUSY_TICK: Nanos = 1_000_000;
    let idle_tick = env.upgrade().map_or(10_000_000, |i| {
        (i.shared.replica.heartbeat_interval / 4).clamp(10_000_000, 50_000_000)
    });
    let mut sleep = BUSY_TICK;
    let mut measured = Instant::now();
    // Whether the last measurement failed: a failure is logged once, not every 100 ms.
    let mut unmeasured = false;
    loop {
        std::thread::park_timeout(Duration::from_nanos(sleep));
        let Some(inner) = env.upgrade() else { return };
        if inner.stopped.load(Ordering::SeqCst) {
            return;
        }
        if measured.elapsed() >= crate::DiskSpace::REFRESH {
            measured = Instant::now();
            let was_low = inner.shared.disk.is_low();
            let r = inner.shared.disk.refresh();
            if let (Err(e), false) = (&r, unmeasured) {
                tracing::warn!(error = %e, dir = %inner.shared.disk.dir().display(), "cannot measure the data directory's free space; the last measurement stands");
            }
            unmeasured = r.is_err();
            match r {
                Ok(free) if inner.shared.disk.is_low() != was_low => {
                    let min_free = inner.shared.disk.min_free();
                    if was_low {
                        tracing::info!(
                            free,
                            min_free,
                            "free space is above min_free_bytes again: appends are taken"
                        );
                    } else {
                        tracing::warn!(
                            free,
                            min_free,
                            "free space is below min_free_bytes: leaders refuse appends and followers take no new log"
                        );
                    }
                }
                _ => {}
            }
            restart_groups_stopped_by_a_full_disk(&inner);
        }
        let now = inner.shared.now();
        // Published before the groups are read: a group that sets an earlier due time
        // after this either is seen below or sees this and unparks us.
        let mut next = now + PERIOD;
        inner.shared.timer_next.store(next, Ordering::SeqCst);
        // The tables are read in place (scheduling only queues a task): no copy of every
        // group per wake-up.
        for (_, _, task) in inner.router.ooo.read().expect("ooo groups").values() {
            // Scheduled if its wake-up time came; else the timer wakes for it.
            next = next.min(task.poke(now));
        }
        let groups = inner.router.groups.read().expect("groups");
        for g in groups.values() {
            let last = g.last_tick.load(Ordering::Relaxed);
            let period = if g.busy.load(Ordering::Relaxed) {
                BUSY_TICK
            } else {
                idle_tick
            };
            let resend = g.resend_at.load(Ordering::SeqCst);
            // At rest, due on the first tick instant after a period (see
            // `sched::TICK_QUANTUM`), so the groups at rest run together.
            let due_at = if period == BUSY_TICK {
                last.saturating_add(period)
            } else {
                crate::sched::tick_instant(last.saturating_add(period))
            };
            if (now >= due_at || now >= resend) && !g.tick_due.swap(true, Ordering::AcqRel) {
                inner.shared.pool.schedule(g);
                next = next.min(now + period);
            } else {
                // Its next tick (one already asked for and not yet run: a period on).
                next = next.min(due_at.max(now + BUSY_TICK));
                if resend > now {
                    next = next.min(resend);
                }
            }
        }
        inner.shared.timer_next.store(next, Ordering::SeqCst);
        sleep = next.saturating_sub(inner.shared.now()).max(1);
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.ooo.clear();
        self.transport.shutdown();
        self.shared.pool.shutdown();
        self.shared.apply.shutdown();
        for (_, g) in self.router.groups.write().expect("groups").drain() {
            g.shutdown();
        }
    }
}

/// A handle on one log group: the file-like API of PALF (Fig. 3). Cheap to clone.
#[derive(Clone)]
pub struct LogHandle {
    g: Arc<Group>,
}

impl std::fmt::Debug for LogHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogHandle")
            .field("group", &self.g.id)
            .finish()
    }
}

impl LogHandle {
    /// The group's id.
    pub fn id(&self) -> GroupId {
        self.g.id
    }

    /// Appends `record` with reference CSN `ref_csn` (the record's CSN will be at least
    /// that, PALF section 4.2). Returns at once with the LSN and CSN and a future that
    /// resolves once to Committed or Failed. Refused (with a reason and, when not leader,
    /// a leader hint) if this replica is not the serving leader, the window of
    /// uncommitted log is full, or the record is too large.
    pub fn append(&self, record: &[u8], ref_csn: Csn) -> Result<Appended, Error> {
        self.g.append(record, ref_csn)
    }

    /// Reads the committed record at `lsn`.
    pub fn read(&self, lsn: Lsn) -> Result<Record, Error> {
        self.g.read(lsn)
    }

    /// An iterator over committed records from `lsn` (a record's LSN, or any group
    /// boundary such as 0 or [`LogHandle::committed_end`]).
    pub fn reader(&self, lsn: Lsn) -> LogReader {
        LogReader {
            g: self.g.clone(),
            pos: lsn,
            buf: VecDeque::new(),
            tail: self.g.subscribe_tail(),
        }
    }

    /// LSN of the first committed record whose CSN is at least `csn`, if any.
    pub fn locate(&self, csn: Csn) -> Result<Option<Lsn>, Error> {
        self.g.locate(csn)
    }

    /// Replays committed records from `lsn` to `apply`, in LSN order, on a thread of its
    /// own, following the committed tail until [`Replayer::stop`] (PALF's replay service
    /// for followers and standbys). A read error stops the replay and is returned by
    /// `stop`.
    pub fn replay(
        &self,
        lsn: Lsn,
        mut apply: impl FnMut(Record) + Send + 'static,
    ) -> Result<Replayer, Error> {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut reader = self.reader(lsn);
        let s = stop.clone();
        let handle = std::thread::Builder::new()
            .name(format!("chorus-replay-{}", self.g.id))
            .spawn(move || {
                while !s.load(Ordering::Relaxed) {
                    match reader.next_wait(Duration::from_millis(100))? {
                        Some(r) => apply(r),
                        None => continue,
                    }
                }
                Ok(reader.position())
            })
            .map_err(|e| Error::Io {
                what: "start replay thread".into(),
                source: e,
            })?;
        Ok(Replayer {
            stop,
            handle: Some(handle),
        })
    }

    /// The committed end LSN known here.
    pub fn committed_end(&self) -> Lsn {
        self.g.committed_end()
    }

    /// Subscribes to the committed end (PALF's monitor_tail).
    pub fn subscribe_tail(&self) -> watch::Receiver<Lsn> {
        self.g.subscribe_tail()
    }

    /// Subscribes to role changes (PALF's monitor_role).
    pub fn subscribe_role(&self) -> watch::Receiver<RoleInfo> {
        self.g.subscribe_role()
    }

    /// The current role.
    pub fn role(&self) -> RoleInfo {
        *self.g.subscribe_role().borrow()
    }

    /// This replica's readable CSN: every record with a CSN at most this one is committed
    /// and in this replica's log, so a read here sees all of them, and every record still
    /// to come gets a larger CSN (PALF section 4.2, follower reads). It is the largest
    /// CSN below the committed end this replica knows, which a follower learns from its
    /// leader, piggybacked on replication, and caps at what it holds itself.
    pub fn readable_csn(&self) -> Csn {
        self.g.readable_csn()
    }

    /// Subscribes to the readable CSN ([`LogHandle::readable_csn`]): it is published after
    /// the committed end it belongs to, so a reader woken by it finds the records there.
    /// A removed or stopped group wakes its receivers without a change.
    pub fn subscribe_readable_csn(&self) -> watch::Receiver<Csn> {
        self.g.subscribe_readable()
    }

    /// Waits until the readable CSN reaches `csn` and returns it: a read started then
    /// sees every record with a CSN at most `csn` (PALF section 4.2). Woken as the
    /// commit point advances, without polling. Ends with an error if, before that, the
    /// group stops here ([`Error::NotRunning`], with why), is taken off this node (deleted
    /// or restarted: [`Error::NotRunning`]) or the node shuts down ([`Error::Shutdown`]).
    /// It has no deadline of its own: the caller bounds it (and reports
    /// [`Error::CsnNotReached`]).
    pub async fn wait_readable_csn(&self, csn: Csn) -> Result<Csn, Error> {
        let mut rx = self.g.subscribe_readable();
        loop {
            // Seen before the checks: a removal or stop after them wakes `changed`.
            let reached = *rx.borrow_and_update();
            if reached >= csn {
                return Ok(reached);
            }
            self.check_live()?;
            // The handle holds the sender, so the watch does not close under it.
            let _ = rx.changed().await;
        }
    }

    /// Whether this incarnation of the group was taken off the node (deleted, restarted,
    /// or the node shut down): a watcher of it then looks the group up again. Its
    /// watches ([`LogHandle::subscribe_role`], [`LogHandle::subscribe_readable_csn`]) are
    /// woken when this happens.
    pub fn is_removed(&self) -> bool {
        self.g.is_removed()
    }

    /// Why this incarnation stopped (its storage failed, its replica halted), if it did;
    /// it stays hosted, stopped, until restarted ([`Env::restart_group`]).
    pub fn stopped_reason(&self) -> Option<String> {
        self.g.stopped_reason()
    }

    /// Whether this incarnation of the group still runs here: [`Error::Shutdown`] once the
    /// node shuts down, [`Error::NotRunning`] once it was taken off this node (deleted or
    /// restarted: take a new handle) or stopped (its storage failed, its replica halted).
    pub fn check_live(&self) -> Result<(), Error> {
        if self.g.env_stopped() {
            return Err(Error::Shutdown);
        }
        if self.g.is_removed() {
            return Err(Error::NotRunning {
                group: self.g.id,
                reason: "this replica was taken off the node (deleted or restarted)".into(),
            });
        }
        match self.g.stopped_reason() {
            Some(reason) => Err(Error::NotRunning {
                group: self.g.id,
                reason,
            }),
            None => Ok(()),
        }
    }

    /// Deletes this replica's log below `lsn` (committed only): whole block files, so the
    /// log then starts at the first block kept (at or below `lsn`). A follower that later
    /// needs what is gone is rebased at this replica's start when it leads
    /// ([`chorus_core::replica::Message::Rebase`]).
    pub fn trim(&self, lsn: Lsn) -> Result<(), Error> {
        self.g.trim(lsn)
    }

    /// Starts a single-member membership change (leader only; PALF section 5.3), with
    /// no strict check: what the control plane and tests use.
    pub fn change_membership(&self, change: MembershipChange) -> Result<(), Error> {
        self.g.change(change, true)
    }

    /// As [`LogHandle::change_membership`], an operator's change: refused unless it passes
    /// the strict reconfiguration check ([`Replica::check_change`]) or `force` is set.
    ///
    /// [`Replica::check_change`]: chorus_core::replica::Replica::check_change
    pub fn change_membership_checked(
        &self,
        change: MembershipChange,
        force: bool,
    ) -> Result<(), Error> {
        self.g.change(change, force)
    }

    /// Mirrors one group another log committed (PALF section 5.2, `mirror`): `group` is
    /// the whole group as that log stores it ([`LogHandle::read_groups`] on it), and must
    /// start at this log's end. Leader of a group in [`AccessMode::RawWrite`] only. The
    /// group keeps its LSN, entries and CSNs; the returned future resolves once, as an
    /// append's does — Failed meaning only that this copy did not commit: a later leader
    /// may hold the same group, so a mirroring process resumes from this log's end
    /// ([`GroupStatus::end_lsn`] on the leader), never from a result alone.
    pub fn mirror(&self, group: &[u8]) -> Result<Appended, Error> {
        self.g.mirror(group)
    }

    /// Switches the access mode (leader only): failover makes a mirror a primary,
    /// switchover a primary a mirror. A config change: in force once a majority holds it.
    pub fn change_access_mode(&self, mode: AccessMode) -> Result<ConfigVersion, Error> {
        self.g.change_access_mode(mode)
    }

    /// Whole committed groups from `from` (a group boundary) as this replica stores them,
    /// headers included — what a mirror takes ([`LogHandle::mirror`]): at least one
    /// group, then more while they fit in `max_bytes`. Returns them and the LSN after.
    pub fn read_groups(&self, from: Lsn, max_bytes: usize) -> Result<(Vec<Vec<u8>>, Lsn), Error> {
        self.g.read_groups(from, max_bytes)
    }

    /// Hands leadership to voter `to` (leader only), with no strict check.
    pub fn transfer_leader(&self, to: NodeId) -> Result<(), Error> {
        self.g.transfer(to, true)
    }

    /// As [`LogHandle::transfer_leader`], an operator's transfer: refused unless the
    /// target passes the strict check ([`Replica::check_transfer_to`]) or `force` is set.
    ///
    /// [`Replica::check_transfer_to`]: chorus_core::replica::Replica::check_transfer_to
    pub fn transfer_leader_checked(&self, to: NodeId, force: bool) -> Result<(), Error> {
        self.g.transfer(to, force)
    }

    /// Sets this replica's election priority (higher wins after config version).
    pub fn set_priority(&self, priority: u32) {
        self.g.control(|r, _| r.set_priority(priority));
    }

    /// A snapshot of the group's state here.
    pub fn status(&self) -> GroupStatus {
        self.g.status()
    }

    /// Waits until the committed end passes `lsn` or `timeout` elapses; returns the
    /// committed end.
    pub fn wait_committed_past(&self, lsn: Lsn, timeout: Duration) -> Lsn {
        self.g.wait_committed_past(lsn, timeout)
    }
}

/// Iterates over committed records in LSN order, and can follow the committed tail.
pub struct LogReader {
    g: Arc<Group>,
    pos: Lsn,
    buf: VecDeque<Record>,
    tail: watch::Receiver<Lsn>,
}

impl std::fmt::Debug for LogReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogReader")
            .field("group", &self.g.id)
            .field("pos", &self.pos)
            .finish()
    }
}

impl LogReader {
    /// The next committed record, or `None` at the committed end (call again later, or
    /// use [`LogReader::next_wait`] / [`LogReader::next_async`] to wait).
    pub fn try_next(&mut self) -> Result<Option<Record>, Error> {
        if self.buf.is_empty() {
            self.pos = self.g.read_next(self.pos, &mut self.buf)?;
        }
        Ok(self.buf.pop_front())
    }

    /// The next committed record, waiting up to `timeout` for one to commit.
    pub fn next_wait(&mut self, timeout: Duration) -> Result<Option<Record>, Error> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(r) = self.try_next()? {
                return Ok(Some(r));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || self.g.removed.load(Ordering::Relaxed) {
                return Ok(None);
            }
            self.g.wait_committed_past(self.pos, left);
        }
    }

    /// The next committed record, waiting for it (for async callers).
    pub async fn next_async(&mut self) -> Result<Record, Error> {
        loop {
            if let Some(r) = self.try_next()? {
                return Ok(r);
            }
            if self.tail.changed().await.is_err() {
                return Err(Error::Shutdown);
            }
        }
    }

    /// Where the reader continues (a group boundary once buffered records are consumed).
    pub fn position(&self) -> Lsn {
        self.buf.front().map_or(self.pos, |r| r.lsn)
    }
}

impl Iterator for LogReader {
    type Item = Result<Record, Error>;

    /// Committed records until the committed end (does not wait).
    fn next(&mut self) -> Option<Self::Item> {
        self.try_next().transpose()
    }
}

/// A running replay (see [`LogHandle::replay`]).
#[derive(Debug)]
pub struct Replayer {
    stop: Arc<std::sync::atomic::AtomicBool>,
    handle: Option<JoinHandle<Result<Lsn, Error>>>,
}

impl Replayer {
    /// Stops the replay and returns where it stood (the next LSN to replay), or the read
    /// error that stopped it.
    pub fn stop(mut self) -> Result<Lsn, Error> {
        self.stop.store(true, Ordering::Relaxed);
        match self.handle.take().map(|h| h.join()) {
            Some(Ok(r)) => r,
            _ => Err(Error::Shutdown),
        }
    }
}

impl Drop for Replayer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
