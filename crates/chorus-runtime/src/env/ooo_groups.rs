//! Out-of-order groups' lifecycle in the environment. One environment hosts every log
//! stream of a server (PALF section 3.3, the PALFEnv), whatever its mode: an out-of-order
//! (parallel or dependent) group is created, opened at start, deleted and restarted by
//! the [`Env`] as an ordered group is, in the same directory layout
//! (`groups/{id:020}/`), where its spec file ([`super::ooo_spec`], `ooo.spec`) says what
//! it is and how to start it again. Its state machine comes from the embedder's
//! [`StateMachines`]; the settings every such group shares are
//! [`EnvConfig::ooo`](super::EnvConfig::ooo).
//!
//! The environment holds each running group's [`OooNode`] (its router only weakly, so
//! the group stops when the environment lets it go) and hands out [`OooHandle`]s. A
//! delete or restart waits, bounded, until no other holder of the group's handle is left
//! (requests in flight), so that a group is never stopped under a request reading it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chorus_core::ooo::replica::Mode;
use chorus_core::replica::Nanos;

use super::ooo_spec::{read_spec, spec_path, write_spec, OooGroupSpec, SpecError};
use super::{group_dir, is_damage, Env, Inner, LogHandle};
use crate::error::Error;
use crate::group::GroupId;
use crate::ooo::{OooNode, OooNodeConfig, OooNodeError, OooStateMachine};

/// How long [`Env::remove_group`] and [`Env::restart_group`] wait for other holders of an
/// out-of-order group's handle to let it go before they answer [`Error::GroupBusy`].
pub const RELEASE_WAIT: Duration = Duration::from_secs(10);
/// The same wait for a restart the environment makes itself (a group a full disk
/// stopped): shorter, as it is tried again later.
const TIMER_RELEASE_WAIT: Duration = Duration::from_secs(1);

/// Settings every out-of-order group of an environment shares
/// ([`crate::ooo::OooNodeConfig`] has what each means).
#[derive(Clone, Debug)]
pub struct OooGroupSettings {
    /// Election timeout (randomised up to twice this); at least 10 ms.
    pub election_timeout: Duration,
    /// Pieces a group's applies are cut into on the environment's apply workers (0: the
    /// group's driver applies, one entry after another); at most 64.
    pub apply_threads: usize,
    /// Streaming catch-up bytes per second to one follower (0: no limit).
    pub catchup_rate: u64,
    /// Checkpoint the state machine and compact the entries file past this many bytes
    /// (0: never).
    pub compact_bytes: u64,
    /// Leaders: resend a slot a follower skipped this many slots past at once (0: only the
    /// periodic resend).
    pub hole_resend: u64,
    /// Leaders: resend an entry not acknowledged within this many median round trips (0:
    /// off).
    pub timed_resend: u32,
    /// Leaders: how long appends may gather while their own log write is in flight (PALF
    /// section 6; zero: not at all).
    pub freeze_interval: Duration,
    /// Bytes of zeros kept written past the end of each entries file.
    pub preallocate: u64,
    /// Append to the entries file with direct IO where the file system takes it.
    pub direct_io: bool,
}

impl Default for OooGroupSettings {
    fn default() -> Self {
        Self {
            election_timeout: Duration::from_secs(1),
            apply_threads: 2,
            catchup_rate: 64 << 20,
            compact_bytes: 64 << 20,
            hole_resend: chorus_core::ooo::replica::HOLE_RESEND,
            timed_resend: chorus_core::ooo::replica::TIMED_RESEND,
            freeze_interval: Duration::ZERO,
            preallocate: chorus_storage::ooo::DEFAULT_PREALLOCATE,
            direct_io: true,
        }
    }
}

/// The embedder's state machines for out-of-order groups: the environment opens one for
/// every such group it creates, opens or restarts.
pub trait StateMachines: Send + Sync + std::fmt::Debug + 'static {
    /// Opens (or creates, in a new group's empty directory) the state machine of the
    /// group `spec` describes (its id, mode and the embedder's parameters,
    /// [`OooGroupSpec::params`]), whose files lie in `dir` (the group's directory, shared
    /// with its replica's store: names other than `entries.*`, `hard`, `membership*` and
    /// `ooo.spec*` are the state machine's). Parameters it cannot use are an error of
    /// kind `InvalidData` naming them: the group is then not opened.
    fn open(&self, spec: &OooGroupSpec, dir: &Path) -> std::io::Result<Arc<dyn OooStateMachine>>;
}

/// A group's mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupMode {
    /// An ordered (PALF) group.
    Ordered,
    /// An out-of-order group, parallel or dependent.
    OutOfOrder(Mode),
}

impl GroupMode {
    /// Its name: `ordered`, `parallel` or `dependent` (the metrics' `mode` label).
    pub fn label(self) -> &'static str {
        match self {
            GroupMode::Ordered => "ordered",
            GroupMode::OutOfOrder(m) => super::mode_label(m),
        }
    }
}

/// A group that did not start on this node: its files were found damaged at start, or it
/// did not start again when restarted. It stays so, files untouched, until it is
/// restarted ([`Env::restart_group`]) or deleted ([`Env::remove_group`]).
#[derive(Clone, Debug)]
pub struct NotStarted {
    /// Why, naming the file where it is one.
    pub reason: String,
    /// Its mode; `None` for an out-of-order group whose spec file is what is damaged.
    pub mode: Option<GroupMode>,
    /// An out-of-order group's spec, when it could be read.
    pub spec: Option<OooGroupSpec>,
}

impl NotStarted {
    /// The `mode` label: the mode's, or `out-of-order` when the spec is unreadable.
    pub fn mode_label(&self) -> &'static str {
        self.mode.map_or("out-of-order", GroupMode::label)
    }
}

/// One group of this node, as [`Env::list_groups`] gives it.
#[derive(Clone, Debug)]
pub struct ListedGroup {
    /// Its id.
    pub id: GroupId,
    /// Its mode (`None`: an out-of-order group whose spec file is damaged).
    pub mode: Option<GroupMode>,
    /// Why it did not start, if it did not ([`NotStarted`]).
    pub not_started: Option<String>,
}

/// A handle on one out-of-order group the environment hosts. Cheap to clone; while any
/// clone is held, [`Env::remove_group`] and [`Env::restart_group`] of the group wait.
#[derive(Clone)]
pub struct OooHandle {
    spec: Arc<OooGroupSpec>,
    node: Arc<OooNode>,
    state: Arc<dyn OooStateMachine>,
}

impl std::fmt::Debug for OooHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OooHandle")
            .field("spec", &self.spec)
            .finish()
    }
}

impl OooHandle {
    /// The group's id.
    pub fn id(&self) -> GroupId {
        self.spec.id
    }

    /// Its mode.
    pub fn mode(&self) -> Mode {
        self.spec.mode
    }

    /// The spec it was created with (its replica's current membership is
    /// [`OooNode::membership`]).
    pub fn spec(&self) -> &OooGroupSpec {
        &self.spec
    }

    /// Its replica: append, read, status, membership, leader transfer.
    pub fn node(&self) -> &Arc<OooNode> {
        &self.node
    }

    /// Its state machine as the embedder's type `T` (the one its [`StateMachines`]
    /// opened), for reads of the applied state; `None` if it is of another type.
    pub fn state<T: OooStateMachine>(&self) -> Option<Arc<T>> {
        let any: Arc<dyn std::any::Any + Send + Sync> = self.state.clone();
        any.downcast::<T>().ok()
    }
}

/// Either kind of group: what [`Env::hosted`] resolves an id to, so that a caller
/// dispatches on the mode once.
#[derive(Clone, Debug)]
pub enum HostedGroup {
    /// An ordered group.
    Ordered(LogHandle),
    /// An out-of-order group.
    OutOfOrder(OooHandle),
}

impl HostedGroup {
    /// The ordered group's handle, if it is one.
    pub fn ordered(self) -> Option<LogHandle> {
        match self {
            HostedGroup::Ordered(l) => Some(l),
            HostedGroup::OutOfOrder(_) => None,
        }
    }

    /// The out-of-order group's handle, if it is one.
    pub fn out_of_order(self) -> Option<OooHandle> {
        match self {
            HostedGroup::OutOfOrder(h) => Some(h),
            HostedGroup::Ordered(_) => None,
        }
    }
}

/// The out-of-order groups the environment started from their specs (not those an
/// embedder starts itself with [`Env::start_ooo_group`]).
#[derive(Default)]
pub(super) struct Registry {
    groups: Mutex<BTreeMap<GroupId, Hosted>>,
    /// Groups being deleted or restarted: out of `groups` (so no new request takes
    /// them) until they are gone or started again. A lookup meanwhile is
    /// [`Error::NotRunning`] — not taken, ask another replica — as for an ordered group's
    /// stopped incarnation, rather than "no such group".
    closing: Mutex<std::collections::BTreeSet<GroupId>>,
}

/// Marks a group as being deleted or restarted ([`Registry::closing`]) while it lives.
struct Closing<'a> {
    registry: &'a Registry,
    id: GroupId,
}

impl Drop for Closing<'_> {
    fn drop(&mut self) {
        self.registry.closing_set().remove(&self.id);
    }
}

struct Hosted {
    handle: OooHandle,
    /// When the environment last tried to restart it after a full disk stopped it
    /// (nanoseconds on the environment's clock; 0: never).
    restart_tried: Nanos,
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<GroupId, Hosted>> {
        self.groups.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn contains(&self, id: GroupId) -> bool {
        self.lock().contains_key(&id)
    }

    fn closing_set(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeSet<GroupId>> {
        self.closing.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks group `id` as being deleted or restarted until the returned guard drops.
    fn closing(&self, id: GroupId) -> Closing<'_> {
        self.closing_set().insert(id);
        Closing { registry: self, id }
    }

    /// Lets every group go (their drivers finish; the environment is stopping).
    pub(super) fn clear(&self) {
        let all = std::mem::take(&mut *self.lock());
        drop(all);
    }
}

impl Env {
    /// Creates out-of-order group `spec.id` on this node and starts it: its directory
    /// `groups/{id:020}/` with the spec written crash-atomically before the replica
    /// starts (so a group that ever voted is reopened at every start), its state machine
    /// from [`EnvConfig::state_machines`](super::EnvConfig::state_machines), its replica on
    /// the environment's workers and transport. Every initial voter creates it with the
    /// same spec. The same spec again is accepted (the running group's handle is
    /// returned); another spec for a group this node has, or an id any group of any mode
    /// has here, is [`Error::GroupExists`]; a group that did not start here is
    /// [`Error::GroupDamaged`]. A spec that breaks its invariants, or does not name this
    /// node among its replicas, is [`Error::Spec`].
    pub fn create_ooo_group(&self, spec: OooGroupSpec) -> Result<OooHandle, Error> {
        let id = spec.id;
        let bad = |source: SpecError| Error::Spec {
            group: id,
            what: "the spec given".into(),
            source,
        };
        spec.check().map_err(bad)?;
        let me = self.node();
        if !spec.knows(me) {
            return Err(bad(SpecError::Field {
                field: "voters",
                detail: format!("this node ({me}) is neither one of its voters nor of its others"),
            }));
        }
        self.check_running()?;
        let inner = &self.inner;
        let _guard = inner.create_lock.lock().expect("create");
        if let Some(n) = inner.damaged.lock().expect("damaged").get(&id) {
            if n.spec.as_ref().is_some_and(|s| *s != spec) || n.mode == Some(GroupMode::Ordered) {
                return Err(Error::GroupExists(id));
            }
            return Err(Error::GroupDamaged {
                group: id,
                reason: n.reason.clone(),
            });
        }
        if let Some(h) = inner.ooo.lock().get(&id) {
            return if *h.handle.spec == spec {
                Ok(h.handle.clone())
            } else {
                Err(Error::GroupExists(id))
            };
        }
        let dir = group_dir(&inner.cfg.data_dir, id);
        if inner.router.hosts(id) || dir.exists() {
            return Err(Error::GroupExists(id));
        }
        if inner.cfg.state_machines.is_none() {
            return Err(Error::NoStateMachines(id));
        }
        write_spec(&inner.cfg.fs, &dir, &spec).map_err(|e| Error::Io {
            what: format!("group {id}: write {}", spec_path(&dir).display()),
            source: e,
        })?;
        match start(inner, spec, dir.clone()) {
            Ok(h) => {
                tracing::info!(
                    group = id,
                    mode = super::mode_label(h.mode()),
                    "out-of-order group created"
                );
                Ok(h)
            }
            Err(e) => {
                // It never ran: nothing was voted or acknowledged, so nothing is left
                // behind that a restart would reopen.
                if let Err(rm) = std::fs::remove_dir_all(&dir) {
                    tracing::warn!(group = id, error = %rm, "cannot remove the directory of a group that did not start");
                }
                Err(e)
            }
        }
    }

    /// The out-of-order group `id`: [`Error::GroupDamaged`] if it did not start here,
    /// [`Error::NotRunning`] while it is being restarted or deleted,
    /// [`Error::NoSuchGroup`] if this node has no such out-of-order group.
    pub fn ooo_group(&self, id: GroupId) -> Result<OooHandle, Error> {
        self.check_damaged(id)?;
        let registry = &self.inner.ooo;
        if let Some(h) = registry.lock().get(&id) {
            return Ok(h.handle.clone());
        }
        if registry.closing_set().contains(&id) {
            return Err(Error::NotRunning {
                group: id,
                reason: "it is being restarted or deleted on this node".into(),
            });
        }
        Err(Error::NoSuchGroup(id))
    }

    /// Group `id` of any mode: the one lookup a caller dispatches on.
    /// [`Error::GroupDamaged`] for a group that did not start here, [`Error::NoSuchGroup`]
    /// for an id no group has.
    pub fn hosted(&self, id: GroupId) -> Result<HostedGroup, Error> {
        match self.ooo_group(id) {
            Ok(h) => Ok(HostedGroup::OutOfOrder(h)),
            Err(Error::NoSuchGroup(_)) => self.group(id).map(HostedGroup::Ordered),
            Err(e) => Err(e),
        }
    }

    /// Why group `id` did not start here, if it did not.
    pub fn not_started(&self, id: GroupId) -> Option<NotStarted> {
        self.inner
            .damaged
            .lock()
            .expect("damaged")
            .get(&id)
            .cloned()
    }

    /// Every group of this node, of every mode, running, stopped or not started,
    /// ascending by id (out-of-order groups an embedder started itself with
    /// [`Env::start_ooo_group`] are not among them).
    pub fn list_groups(&self) -> Vec<ListedGroup> {
        let mut all: BTreeMap<GroupId, ListedGroup> = BTreeMap::new();
        let listed = |id, mode, not_started| ListedGroup {
            id,
            mode,
            not_started,
        };
        for id in self.ordered_groups() {
            all.insert(id, listed(id, Some(GroupMode::Ordered), None));
        }
        for (&id, h) in self.inner.ooo.lock().iter() {
            let mode = Some(GroupMode::OutOfOrder(h.handle.mode()));
            all.insert(id, listed(id, mode, None));
        }
        for (&id, n) in self.inner.damaged.lock().expect("damaged").iter() {
            all.insert(id, listed(id, n.mode, Some(n.reason.clone())));
        }
        all.into_values().collect()
    }
}

/// Whether `dir` is an out-of-order group's directory (it has a spec file).
pub(super) fn is_ooo_dir(inner: &Inner, dir: &Path) -> Result<bool, Error> {
    inner.cfg.fs.exists(&spec_path(dir)).map_err(|e| Error::Io {
        what: format!("look for {}", spec_path(dir).display()),
        source: e,
    })
}

/// Starts an out-of-order group from its spec and registers it.
fn start(inner: &Arc<Inner>, spec: OooGroupSpec, dir: PathBuf) -> Result<OooHandle, Error> {
    let id = spec.id;
    let factory = inner
        .cfg
        .state_machines
        .clone()
        .ok_or(Error::NoStateMachines(id))?;
    let state = factory.open(&spec, &dir).map_err(|e| {
        // The state machines report damaged files as InvalidData: the group stays on
        // disk, not started, as for damage to the replica's own files.
        if e.kind() == std::io::ErrorKind::InvalidData {
            Error::StateMachineDamaged {
                group: id,
                dir: dir.display().to_string(),
                source: e,
            }
        } else {
            Error::Io {
                what: format!("group {id}: open its state machine in {}", dir.display()),
                source: e,
            }
        }
    })?;
    let s = &inner.cfg.ooo;
    let cfg = OooNodeConfig {
        id: inner.cfg.node,
        group: id,
        voters: spec.voters.clone(),
        others: spec.others.clone(),
        mode: spec.mode,
        dir,
        election_timeout: s.election_timeout,
        apply_threads: s.apply_threads,
        catchup_rate: s.catchup_rate,
        conflict_order: spec.conflict_order,
        compact_bytes: s.compact_bytes,
        hole_resend: s.hole_resend,
        timed_resend: s.timed_resend,
        freeze_interval: s.freeze_interval,
        preallocate: s.preallocate,
        direct_io: s.direct_io,
        // One guard for the node: every group's files share its data directory's disk.
        disk: Some(inner.shared.disk.clone()),
        fs: Some(inner.cfg.fs.clone()),
    };
    let node = super::launch(inner, cfg, state.clone()).map_err(|e| match e {
        OooNodeError::Storage(source) => Error::Storage { group: id, source },
        OooNodeError::Exists(g) => Error::GroupExists(g),
        OooNodeError::Shutdown => Error::Shutdown,
        source => Error::OooStart { group: id, source },
    })?;
    let handle = OooHandle {
        spec: Arc::new(spec),
        node,
        state,
    };
    inner.ooo.lock().insert(
        id,
        Hosted {
            handle: handle.clone(),
            restart_tried: 0,
        },
    );
    Ok(handle)
}

/// Reads the spec of the group in `dir` (named `id` by its directory).
fn read_dir_spec(inner: &Inner, id: GroupId, dir: &Path) -> Result<OooGroupSpec, Error> {
    let path = spec_path(dir);
    let what = || path.display().to_string();
    let io = |source| Error::Io {
        what: format!("group {id}: read {}", path.display()),
        source,
    };
    match read_spec(&inner.cfg.fs, dir) {
        Ok(Some(Ok(s))) if s.id == id => Ok(s),
        Ok(Some(Ok(s))) => Err(Error::Spec {
            group: id,
            what: what(),
            source: SpecError::Field {
                field: "id",
                detail: format!("{} in the directory of group {id}", s.id),
            },
        }),
        Ok(Some(Err(source))) => Err(Error::Spec {
            group: id,
            what: what(),
            source,
        }),
        Ok(None) => Err(io(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "no spec file",
        ))),
        Err(source) => Err(io(source)),
    }
}

/// Opens, at the environment's start, every out-of-order group found in the data
/// directory. A group damaged beyond what its replica repairs alone — its spec or its
/// hard state or membership in both their copies, entries no other voter holds, or its
/// state machine's files — stays on disk, not started
/// ([`NotStarted`]): the node serves its other groups, and the operator replaces the
/// replica (docs/operations.md, "A damaged replica"). Any other failure is the node's.
pub(super) fn open_all(inner: &Arc<Inner>, found: Vec<(GroupId, PathBuf)>) -> Result<(), Error> {
    for (id, dir) in found {
        let mut spec = None;
        let started = read_dir_spec(inner, id, &dir).and_then(|s| {
            spec = Some(s.clone());
            start(inner, s, dir)
        });
        match started {
            Ok(_) => {}
            Err(e) if is_damage(&e) => {
                tracing::error!(
                    group = id,
                    error = %e,
                    "out-of-order group not started: its files are damaged; the node \
                     serves its other groups (docs/operations.md: a damaged replica)"
                );
                not_started(inner, id, e.to_string(), spec);
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn not_started(inner: &Inner, id: GroupId, reason: String, spec: Option<OooGroupSpec>) {
    let mode = spec.as_ref().map(|s| GroupMode::OutOfOrder(s.mode));
    inner
        .damaged
        .lock()
        .expect("damaged")
        .insert(id, NotStarted { reason, mode, spec });
}

/// Takes group `id` out of the registry once no one else holds its handle, waiting up
/// to `wait`; still held then, it stays registered and running ([`Error::GroupBusy`]).
/// The group is stopped when this returns: its driver, IO and applies finished.
fn take(inner: &Inner, id: GroupId, wait: Duration) -> Result<OooGroupSpec, Error> {
    let hosted = inner.ooo.lock().remove(&id).ok_or(Error::NoSuchGroup(id))?;
    let deadline = Instant::now() + wait;
    while Arc::strong_count(&hosted.handle.node) > 1 {
        if Instant::now() >= deadline {
            // Still in use: keep hosting it rather than stop it under a reader.
            inner.ooo.lock().insert(id, hosted);
            return Err(Error::GroupBusy(id));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let spec = (*hosted.handle.spec).clone();
    let node = Arc::downgrade(&hosted.handle.node);
    drop(hosted);
    // The router may have lent the node to a delivery for a moment: the last holder's
    // drop joins the group's work; wait (bounded) for it before its files are touched.
    let deadline = Instant::now() + Duration::from_secs(30);
    while node.strong_count() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(spec)
}

/// [`Env::remove_group`] of a running (or stopped) out-of-order group: stops it once no
/// request holds it (waiting up to `wait`) and deletes its directory, spec included.
pub(super) fn remove(inner: &Inner, id: GroupId, wait: Duration) -> Result<(), Error> {
    let _closing = inner.ooo.closing(id);
    take(inner, id, wait)?;
    let dir = group_dir(&inner.cfg.data_dir, id);
    std::fs::remove_dir_all(&dir).map_err(|e| Error::Io {
        what: format!("remove {}", dir.display()),
        source: e,
    })?;
    tracing::info!(group = id, "out-of-order group removed");
    Ok(())
}

/// [`Env::restart_group`] of an out-of-order group: one whose replica stopped while
/// running (its storage failed — a full disk, an IO error — or its state machine), once
/// no request holds it (waiting up to `wait`), or one that did not start. Its replica
/// recovers its store as after a crash and rejoins its group; the node's other groups are
/// not touched. A running group is refused ([`Error::GroupRunning`]). A group that does
/// not start again is kept, with why, among those that did not start ([`NotStarted`]).
pub(super) fn restart(inner: &Arc<Inner>, id: GroupId, wait: Duration) -> Result<OooHandle, Error> {
    let _guard = inner.create_lock.lock().expect("create");
    let dir = group_dir(&inner.cfg.data_dir, id);
    let damaged = inner.damaged.lock().expect("damaged").contains_key(&id);
    let _closing;
    let mut was_damaged = None;
    let spec = if damaged {
        _closing = inner.ooo.closing(id);
        was_damaged = inner.damaged.lock().expect("damaged").remove(&id);
        None
    } else {
        let reason = {
            let g = inner.ooo.lock();
            let h = g.get(&id).ok_or(Error::NoSuchGroup(id))?;
            h.handle
                .node
                .stopped_reason()
                .ok_or(Error::GroupRunning(id))?
        };
        _closing = inner.ooo.closing(id);
        let spec = take(inner, id, wait)?;
        tracing::warn!(group = id, stopped = %reason, "restarting a stopped out-of-order group");
        Some(spec)
    };
    // Read again for a group that did not start: the operator may have replaced what
    // was damaged.
    let spec = match spec {
        Some(s) => Ok(s),
        None => read_dir_spec(inner, id, &dir),
    };
    let known = spec.as_ref().ok().cloned();
    match spec.and_then(|s| start(inner, s, dir)) {
        Ok(h) => {
            inner.shared.restarts.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(group = id, "out-of-order group restarted");
            Ok(h)
        }
        Err(e) => {
            tracing::error!(group = id, error = %e, "out-of-order group did not start again");
            let spec = known.or(was_damaged.and_then(|n| n.spec));
            not_started(inner, id, e.to_string(), spec);
            Err(e)
        }
    }
}

/// Restarts, each on a thread of its own, the out-of-order groups a full disk stopped
/// (the caller has checked that the data directory has room again), each at most once
/// every [`crate::disk::FULL_DISK_RESTART_BACKOFF`], as ordered groups are.
pub(super) fn restart_stopped_by_full_disk(inner: &Arc<Inner>) {
    let backoff = crate::disk::FULL_DISK_RESTART_BACKOFF.as_nanos() as Nanos;
    let now = inner.shared.now();
    let due: Vec<GroupId> = inner
        .ooo
        .lock()
        .iter_mut()
        .filter(|(_, h)| h.handle.node.stopped_by_full_disk())
        .filter(|(_, h)| h.restart_tried == 0 || now.saturating_sub(h.restart_tried) >= backoff)
        .map(|(&id, h)| {
            h.restart_tried = now.max(1);
            id
        })
        .collect();
    for id in due {
        let inner = inner.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("chorus-restart-{id}"))
            .spawn(move || match restart(&inner, id, TIMER_RELEASE_WAIT) {
                Ok(_) => tracing::warn!(
                    group = id,
                    "out-of-order group stopped by a full disk restarted: the disk has room again"
                ),
                Err(e) => tracing::warn!(
                    group = id,
                    error = %e,
                    "out-of-order group stopped by a full disk did not restart; trying again later"
                ),
            });
        if let Err(e) = spawned {
            tracing::warn!(group = id, error = %e, "cannot start a restart thread");
        }
    }
}
