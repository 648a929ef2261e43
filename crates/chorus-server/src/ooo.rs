//! Out-of-order groups in `chorus server`: each one an [`OooNode`] (parallel or dependent
//! mode, `chorus_runtime::ooo`) with its state machine.
//!
//! - **parallel** groups drive a block volume: a record declares the 4 KiB blocks it
//!   writes and carries their new contents; applying it writes them into the file
//!   `volume` (`ReadBlocks` reads it back).
//! - **dependent** groups drive a key-value store in the WAL model: the database (the
//!   appender) executed a transaction that read and wrote some keys and logs its redo;
//!   replicas replay it by setting every written key to the record's bytes (`GetKeys`).
//!
//! Both are in [`crate::state_machines`], with their checkpoints and images: once a group's entries
//! file passes `[out_of_order] compact_bytes`, the state is checkpointed and the file
//! compacted; at start the state machine reopens from its checkpoint and the replica
//! replays the log from its base. A group lives in `DATA_DIR/ooo/<id>/`: the replica's
//! store (`entries.log`, `hard`), `group.toml` (its spec, written when it is created, so a
//! restart reopens it without the configuration naming it), and `volume` or `kv.image`.

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use chorus_core::ooo::parallel::BlockRange;
use chorus_core::ooo::replica::{Declared, Mode};
use chorus_runtime::disk::FULL_DISK_RESTART_BACKOFF;
use chorus_runtime::metrics::{Exposition, Kind};
use chorus_runtime::ooo::{OooNode, OooNodeConfig, OooStatus};

use crate::config::GroupSpec;

pub use crate::state_machines::{GroupStateMachine, BLOCK, MAX_BLOCKS};

/// Why an out-of-order group could not be created, opened or used.
#[derive(Debug, thiserror::Error)]
pub enum OooGroupError {
    /// The spec is not usable; names the field.
    #[error("group {group}: {detail}")]
    BadSpec {
        /// The group.
        group: u64,
        /// What is wrong.
        detail: String,
    },
    /// A group with this id exists with another spec.
    #[error("group {0} already exists (with a different spec)")]
    Exists(u64),
    /// Files of the group could not be read or written.
    #[error("group {group}: {path}: {source}")]
    Io {
        /// The group.
        group: u64,
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// No out-of-order group with this id on this node.
    #[error("group {0}: no such out-of-order group on this node")]
    NoSuchGroup(u64),
    /// The group is still in use by requests after the wait; it keeps running.
    #[error("group {0}: still in use by requests; try again")]
    Busy(u64),
    /// A restart of a group that is running: only a stopped one is restarted.
    #[error("group {0} is running on this node; only a stopped group is restarted")]
    Running(u64),
    /// The replica failed to start.
    #[error("group {group}: {source}")]
    Node {
        /// The group.
        group: u64,
        /// The error.
        source: chorus_runtime::ooo::OooNodeError,
    },
}

/// A group's parsed spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OooSpec {
    /// Group id.
    pub id: u64,
    /// Mode.
    pub mode: Mode,
    /// Parallel mode: commit in conflict order (`commit_order = "conflicts"`).
    pub conflict_order: bool,
    /// Every voter the group was created with.
    pub voters: Vec<u64>,
    /// Replicas in `replicas` that are not voters at creation (a membership change may
    /// add them).
    pub others: Vec<u64>,
}

impl OooSpec {
    /// Parses an out-of-order group spec for node `me`; `None` for an ordered group.
    pub fn parse(g: &GroupSpec, me: u64) -> Result<Option<Self>, OooGroupError> {
        let bad = |detail: String| OooGroupError::BadSpec {
            group: g.id,
            detail,
        };
        let mode = match g.mode.as_str() {
            "" | "ordered" => return Ok(None),
            "parallel" => Mode::Parallel {
                span: if g.look_behind == 0 {
                    2
                } else {
                    g.look_behind as usize
                },
            },
            "dependent" => Mode::Dependent,
            other => {
                return Err(bad(format!(
                    "mode `{other}` is not one of ordered, parallel, dependent"
                )))
            }
        };
        if g.id == 0 {
            return Err(bad("group id 0 is reserved".into()));
        }
        if !g.learners.is_empty() {
            return Err(bad(
                "out-of-order groups have no learners (membership changes of these modes are not built)"
                    .into(),
            ));
        }
        if g.look_behind != 0 && matches!(mode, Mode::Dependent) {
            return Err(bad("look_behind applies to parallel groups only".into()));
        }
        if !g.access_mode.is_empty() {
            return Err(bad(
                "access_mode applies to ordered groups only (an out-of-order group has no mirrors)"
                    .into(),
            ));
        }
        let conflict_order = match g.commit_order.as_str() {
            "" | "any" => false,
            "conflicts" if matches!(mode, Mode::Parallel { .. }) => true,
            "conflicts" => {
                return Err(bad(
                    "commit_order applies to parallel groups only (a dependent group commits in RAW order always)"
                        .into(),
                ))
            }
            other => {
                return Err(bad(format!(
                    "commit_order `{other}` is not one of any, conflicts"
                )))
            }
        };
        if g.look_behind > 64 {
            return Err(bad(format!(
                "look_behind {} is above the limit of 64",
                g.look_behind
            )));
        }
        let mut voters = g.voters.clone();
        if voters.is_empty() {
            return Err(bad("no voters".into()));
        }
        if let Some(&z) = voters.iter().chain(&g.replicas).find(|&&n| n == 0) {
            return Err(bad(format!("node id {z} is reserved")));
        }
        let mut others: Vec<u64> = g
            .replicas
            .iter()
            .copied()
            .filter(|r| !g.voters.contains(r))
            .collect();
        others.sort_unstable();
        others.dedup();
        if !g.voters.contains(&me) && !others.contains(&me) {
            return Err(bad(format!(
                "this node ({me}) is neither one of its voters nor named in `replicas`"
            )));
        }
        voters.sort_unstable();
        if voters.windows(2).any(|w| w[0] == w[1]) {
            return Err(bad("a voter is listed twice".into()));
        }
        Ok(Some(Self {
            id: g.id,
            mode,
            conflict_order,
            voters,
            others,
        }))
    }
}

/// Checks what an appender declares against the group's mode and state machine,
/// before the record reaches the replica.
pub fn check_record(mode: Mode, d: &Declared, data_len: usize) -> Result<(), String> {
    match (mode, d) {
        (Mode::Parallel { .. }, Declared::Blocks(ranges)) => {
            if ranges.is_empty() {
                return Err("a parallel-mode record declares at least one block range".into());
            }
            let mut sorted = ranges.clone();
            sorted.sort_by_key(|r| r.start);
            if let Some(w) = sorted.windows(2).find(|w| w[0].overlaps(&w[1])) {
                return Err(format!(
                    "block ranges {}..{} and {}..{} overlap",
                    w[0].start, w[0].end, w[1].start, w[1].end
                ));
            }
            if let Some(r) = ranges.iter().find(|r| r.end > MAX_BLOCKS) {
                return Err(format!(
                    "block range {}..{} is past the volume's {MAX_BLOCKS} blocks",
                    r.start, r.end
                ));
            }
            let blocks: u64 = ranges.iter().map(|r| r.end - r.start).sum();
            if blocks * BLOCK != data_len as u64 {
                return Err(format!(
                    "the record has {data_len} bytes but declares {blocks} blocks ({} bytes: 4096 per block)",
                    blocks * BLOCK
                ));
            }
            Ok(())
        }
        (Mode::Dependent, Declared::Txn { write_set, .. }) => {
            if write_set.is_empty() {
                return Err(
                    "a dependent-mode record declares at least one written key (a read-only transaction logs nothing)"
                        .into(),
                );
            }
            Ok(())
        }
        (Mode::Parallel { .. }, Declared::Txn { .. }) => {
            Err("this is a parallel-mode group: declare block ranges, not read/write sets".into())
        }
        (Mode::Dependent, Declared::Blocks(_)) => {
            Err("this is a dependent-mode group: declare read/write sets, not block ranges".into())
        }
    }
}

/// Parses `START+COUNT` or `START` (one block).
pub fn parse_blocks(s: &str) -> Result<BlockRange, String> {
    let (a, b) = s.split_once('+').unwrap_or((s, "1"));
    let start: u64 = a
        .trim()
        .parse()
        .map_err(|_| format!("`{s}`: expected START or START+COUNT (block numbers)"))?;
    let count: u64 = b
        .trim()
        .parse()
        .map_err(|_| format!("`{s}`: expected START or START+COUNT (block numbers)"))?;
    BlockRange::new(start, count).ok_or_else(|| format!("`{s}`: an empty or overflowing range"))
}

/// One running out-of-order group.
pub struct OooGroup {
    spec: GroupSpec,
    /// Its mode.
    pub mode: Mode,
    /// The replica's driver (hosted by the node's environment, which holds it weakly:
    /// dropping the group stops it).
    pub node: Arc<OooNode>,
    /// The state machine.
    pub state: Arc<GroupStateMachine>,
}

impl OooGroup {
    /// The replica's status (`None` if it stopped).
    pub fn status(&self) -> Option<OooStatus> {
        self.node.status()
    }

    /// The voters the group was created with (its spec; the replica's current ones are
    /// [`OooNode::membership`]).
    pub fn voters(&self) -> Vec<u64> {
        self.spec.voters.clone()
    }

    /// Whether `node` is a replica in the group's spec (a voter at creation or one of the
    /// other replicas a change may add).
    pub fn knows(&self, node: u64) -> bool {
        self.spec.voters.contains(&node) || self.spec.replicas.contains(&node)
    }
}

/// Settings every out-of-order group of a node shares.
#[derive(Clone, Debug)]
pub struct OooSettings {
    /// This node.
    pub node: u64,
    /// `DATA_DIR/ooo`.
    pub dir: PathBuf,
    /// Election timeout.
    pub election_timeout: Duration,
    /// Apply threads per group.
    pub apply_threads: usize,
    /// Streaming catch-up bytes per second per follower (0: no limit).
    pub catchup_rate: u64,
    /// Checkpoint and compact a group's entries file past this many bytes (0: never).
    pub compact_bytes: u64,
    /// How long a leader lets appends gather while its own log write is in flight
    /// ([`chorus_runtime::ooo::OooNodeConfig::freeze_interval`]; zero: not at all).
    pub freeze_interval: std::time::Duration,
    /// Leaders: [`chorus_core::ooo::replica::OooConfig::timed_resend`] (0: off).
    pub timed_resend: u32,
    /// Bytes of zeros each group's entries file keeps written past its end
    /// ([`chorus_runtime::ooo::OooNodeConfig::preallocate`]; the `[log] preallocate`
    /// setting).
    pub preallocate: u64,
    /// Append to each group's entries file with direct IO where the file system takes it
    /// (the `[log] direct_io` setting).
    pub direct_io: bool,
    /// The node's environment: it hosts the groups, whose messages share its transport
    /// (its connections, bounds and `[tls]`).
    pub env: chorus_runtime::Env,
    /// The node's free-space guard (its environment's: `[log] min_free_bytes`).
    pub disk: Option<Arc<chorus_runtime::DiskSpace>>,
    /// The file system the groups' directories are on (None: the real one).
    pub fs: Option<Arc<dyn chorus_storage::fs::FileSystem>>,
}

/// The free bytes, besides `min_free_bytes`, the data directory must have before a group
/// a full disk stopped is restarted.
pub const FULL_DISK_ROOM: u64 = 4 << 20;

/// The node's out-of-order groups.
pub struct OooGroups {
    settings: OooSettings,
    groups: RwLock<BTreeMap<u64, Arc<OooGroup>>>,
    /// Groups whose replica did not start because its files are damaged beyond what it
    /// recovers alone (a damaged hard state or membership, or damaged entries with no
    /// other voter), or that did not start again when restarted ([`OooGroups::restart`]):
    /// their spec and the error. The node serves its other groups; the operator replaces
    /// the replica or fixes the cause and restarts it (docs/operations.md).
    failed: RwLock<BTreeMap<u64, (GroupSpec, String)>>,
    /// When each group a full disk stopped was last tried
    /// ([`OooGroups::restart_stopped_by_full_disk`]).
    full_disk_tries: std::sync::Mutex<BTreeMap<u64, std::time::Instant>>,
}

impl std::fmt::Debug for OooGroups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OooGroups")
            .field("settings", &self.settings)
            .field("groups", &self.ids())
            .finish()
    }
}

/// Whether a group failed to start because its files are damaged (as opposed to a bad
/// spec or an IO error), so the node may go on without it.
fn is_damage(e: &OooGroupError) -> bool {
    use chorus_runtime::ooo::OooNodeError;
    use chorus_storage::StorageError;
    matches!(
        e,
        OooGroupError::Node {
            source: OooNodeError::Storage(
                StorageError::CorruptRecord { .. } | StorageError::Corrupt { .. }
            ),
            ..
        }
    )
}

fn io(group: u64, path: &Path) -> impl FnOnce(std::io::Error) -> OooGroupError + '_ {
    move |source| OooGroupError::Io {
        group,
        path: path.to_path_buf(),
        source,
    }
}

impl OooGroups {
    /// Opens every group created earlier under `settings.dir`.
    pub fn open(settings: OooSettings) -> Result<Self, OooGroupError> {
        let me = Self {
            settings,
            groups: RwLock::new(BTreeMap::new()),
            failed: RwLock::new(BTreeMap::new()),
            full_disk_tries: Default::default(),
        };
        let dir = me.settings.dir.clone();
        if dir.exists() {
            let mut specs = Vec::new();
            for ent in std::fs::read_dir(&dir).map_err(io(0, &dir))? {
                let path = ent.map_err(io(0, &dir))?.path().join("group.toml");
                if path.exists() {
                    let text = std::fs::read_to_string(&path).map_err(io(0, &path))?;
                    let g: GroupSpec =
                        toml::from_str(&text).map_err(|e| OooGroupError::BadSpec {
                            group: 0,
                            detail: format!("{}: {e}", path.display()),
                        })?;
                    specs.push(g);
                }
            }
            for g in specs {
                match me.start(g.clone()) {
                    Ok(()) => {}
                    Err(e) if is_damage(&e) => {
                        tracing::error!(
                            group = g.id,
                            error = %e,
                            "out-of-order group not started: its replica is damaged; the \
                             node serves its other groups (docs/operations.md: a damaged \
                             replica)"
                        );
                        me.failed
                            .write()
                            .unwrap_or_else(|p| p.into_inner())
                            .insert(g.id, (g, e.to_string()));
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(me)
    }

    /// Why group `id` did not start here, if it is one whose replica is damaged; with
    /// the group's configured voters.
    pub fn failed(&self, id: u64) -> Option<(Vec<u64>, String)> {
        let f = self.failed.read().unwrap_or_else(|p| p.into_inner());
        f.get(&id).map(|(g, e)| (g.voters.clone(), e.clone()))
    }

    /// The mode named in the spec of a group that did not start (see
    /// [`OooGroups::failed`]).
    pub fn failed_mode(&self, id: u64) -> Option<String> {
        let f = self.failed.read().unwrap_or_else(|p| p.into_inner());
        f.get(&id).map(|(g, _)| g.mode.to_string())
    }

    /// Groups that did not start because their replica is damaged.
    pub fn failed_ids(&self) -> Vec<u64> {
        let f = self.failed.read().unwrap_or_else(|p| p.into_inner());
        f.keys().copied().collect()
    }

    /// Group ids.
    pub fn ids(&self) -> Vec<u64> {
        self.groups
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .copied()
            .collect()
    }

    /// A group.
    pub fn get(&self, id: u64) -> Option<Arc<OooGroup>> {
        self.groups
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .cloned()
    }

    /// Stops group `id` and deletes its directory (its spec included, so a restart does
    /// not reopen it). Waits, up to `wait`, for requests still holding the group to let
    /// it go; the replica's threads are joined before anything is deleted.
    pub fn remove(&self, id: u64, wait: std::time::Duration) -> Result<(), OooGroupError> {
        let damaged = self
            .failed
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        if damaged.is_some() {
            // Nothing runs: its files go, and the group can be created again, empty.
            let dir = self.settings.dir.join(id.to_string());
            std::fs::remove_dir_all(&dir).map_err(io(id, &dir))?;
            tracing::info!(group = id, "damaged out-of-order group deleted");
            return Ok(());
        }
        let group = self.take(id, wait)?;
        // Joins the driver, IO and apply threads; the node's router forgets the group.
        drop(group);
        let dir = self.settings.dir.join(id.to_string());
        std::fs::remove_dir_all(&dir).map_err(io(id, &dir))?;
        tracing::info!(group = id, "out-of-order group deleted");
        Ok(())
    }

    /// Takes group `id` out of the running set once no request holds it (waiting up to
    /// `wait`; still held then, it keeps running and [`OooGroupError::Busy`] is returned).
    fn take(&self, id: u64, wait: std::time::Duration) -> Result<OooGroup, OooGroupError> {
        let mut g = self
            .groups
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id)
            .ok_or(OooGroupError::NoSuchGroup(id))?;
        let deadline = std::time::Instant::now() + wait;
        loop {
            match Arc::try_unwrap(g) {
                Ok(group) => return Ok(group),
                Err(back) if std::time::Instant::now() < deadline => {
                    g = back;
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                Err(back) => {
                    // Still in use: keep hosting it rather than stop it under a reader.
                    self.groups
                        .write()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(id, back);
                    return Err(OooGroupError::Busy(id));
                }
            }
        }
    }

    /// Starts group `id` again from its files, as a node restart would: one whose
    /// replica stopped while running (its storage failed — a full disk, an IO error) once
    /// the cause is fixed, or one that did not start (damaged files since replaced or
    /// repaired, or a failed earlier restart). The replica recovers its store as after a
    /// crash and rejoins its group; the node's other groups are not touched. A running
    /// group is refused ([`OooGroupError::Running`]); one still held by requests after
    /// `wait` keeps its stopped replica ([`OooGroupError::Busy`]). A group that does not
    /// start again is kept, with why, among those that did not start.
    pub fn restart(&self, id: u64, wait: std::time::Duration) -> Result<(), OooGroupError> {
        let spec = match self
            .failed
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id)
        {
            Some((spec, _)) => spec,
            None => {
                let g = self.get(id).ok_or(OooGroupError::NoSuchGroup(id))?;
                let Some(reason) = g.node.stopped_reason() else {
                    return Err(OooGroupError::Running(id));
                };
                drop(g);
                let group = self.take(id, wait)?;
                let spec = group.spec.clone();
                // Joins its threads (none does IO any more: the store refuses every
                // write after its failure) and takes it off the node's router, so the
                // new replica takes its place.
                drop(group);
                tracing::warn!(group = id, stopped = %reason, "restarting a stopped out-of-order group");
                spec
            }
        };
        match self.start(spec.clone()) {
            Ok(()) => {
                self.settings.env.count_group_restart();
                tracing::warn!(group = id, "out-of-order group restarted");
                Ok(())
            }
            Err(e) => {
                tracing::error!(group = id, error = %e, "out-of-order group did not start again");
                self.failed
                    .write()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(id, (spec, e.to_string()));
                Err(e)
            }
        }
    }

    /// Creates a group (or accepts an existing one with the same spec) and starts it.
    pub fn create(&self, g: GroupSpec) -> Result<(), OooGroupError> {
        if let Some((have, _)) = self
            .failed
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&g.id)
        {
            // Known, damaged, not running: the same spec is that group.
            return if *have == g {
                Ok(())
            } else {
                Err(OooGroupError::Exists(g.id))
            };
        }
        if let Some(have) = self.get(g.id) {
            return if have.spec == g {
                Ok(())
            } else {
                Err(OooGroupError::Exists(g.id))
            };
        }
        let spec =
            OooSpec::parse(&g, self.settings.node)?.ok_or_else(|| OooGroupError::BadSpec {
                group: g.id,
                detail: "an ordered group is not an out-of-order group".into(),
            })?;
        // An id an ordered group has on this node is refused before a spec is left behind
        // that would stop the next start.
        if self.settings.env.group(g.id).is_ok() {
            return Err(OooGroupError::Exists(g.id));
        }
        drop(spec);
        let dir = self.settings.dir.join(g.id.to_string());
        std::fs::create_dir_all(&dir).map_err(io(g.id, &dir))?;
        let path = dir.join("group.toml");
        let text = toml::to_string(&g).map_err(|e| OooGroupError::BadSpec {
            group: g.id,
            detail: e.to_string(),
        })?;
        // Written crash-atomically before the replica starts: a group that ever voted or
        // acknowledged is reopened at restart.
        let tmp = dir.join("group.toml.tmp");
        let write = || -> std::io::Result<()> {
            let f = std::fs::File::create(&tmp)?;
            f.write_all_at(text.as_bytes(), 0)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            std::fs::File::open(&dir)?.sync_all()
        };
        write().map_err(io(g.id, &path))?;
        self.start(g)
    }

    fn start(&self, g: GroupSpec) -> Result<(), OooGroupError> {
        let spec =
            OooSpec::parse(&g, self.settings.node)?.ok_or_else(|| OooGroupError::BadSpec {
                group: g.id,
                detail: "an ordered group is not an out-of-order group".into(),
            })?;
        let id = g.id;
        let dir = self.settings.dir.join(id.to_string());
        std::fs::create_dir_all(&dir).map_err(io(id, &dir))?;
        let state = Arc::new(
            match spec.mode {
                Mode::Parallel { .. } => GroupStateMachine::block_volume(&dir),
                Mode::Dependent => GroupStateMachine::key_value(&dir),
            }
            .map_err(io(id, &dir))?,
        );
        let me = self.settings.node;
        let node = self
            .settings
            .env
            .start_ooo_group(
                OooNodeConfig {
                    id: me,
                    group: id,
                    voters: spec.voters.clone(),
                    others: spec.others.clone(),
                    mode: spec.mode,
                    dir: dir.clone(),
                    election_timeout: self.settings.election_timeout,
                    apply_threads: self.settings.apply_threads,
                    catchup_rate: self.settings.catchup_rate,
                    conflict_order: spec.conflict_order,
                    compact_bytes: self.settings.compact_bytes,
                    hole_resend: chorus_core::ooo::replica::HOLE_RESEND,
                    timed_resend: self.settings.timed_resend,
                    freeze_interval: self.settings.freeze_interval,
                    preallocate: self.settings.preallocate,
                    direct_io: self.settings.direct_io,
                    disk: self.settings.disk.clone(),
                    fs: self.settings.fs.clone(),
                },
                state.clone(),
            )
            .map_err(|source| match source {
                chorus_runtime::ooo::OooNodeError::Exists(g) => OooGroupError::Exists(g),
                source => OooGroupError::Node { group: id, source },
            })?;
        tracing::info!(group = id, mode = %g.mode, "out-of-order group started");
        self.groups
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                id,
                Arc::new(OooGroup {
                    spec: g,
                    mode: spec.mode,
                    node,
                    state,
                }),
            );
        Ok(())
    }

    /// Restarts ([`OooGroups::restart`]) the groups whose replica a full disk stopped,
    /// once the node's free-space guard says there is room again (above `min_free_bytes`
    /// and at least [`FULL_DISK_ROOM`] free); a group is tried at most once every
    /// [`FULL_DISK_RESTART_BACKOFF`] (a restart that fails, or a disk that fills again,
    /// waits for the next). Returns the groups restarted. Without a guard nothing is
    /// restarted: whether there is room is unknown. The server calls it twice a second.
    pub fn restart_stopped_by_full_disk(&self) -> Vec<u64> {
        let Some(disk) = &self.settings.disk else {
            return Vec::new();
        };
        if !disk.has_room(FULL_DISK_ROOM) {
            return Vec::new();
        }
        let now = std::time::Instant::now();
        let due: Vec<u64> = {
            let mut tries = self
                .full_disk_tries
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let groups = self.groups.read().unwrap_or_else(|p| p.into_inner());
            tries.retain(|id, _| groups.contains_key(id));
            let mut due = Vec::new();
            for (&id, g) in groups.iter() {
                let waited = tries
                    .get(&id)
                    .is_none_or(|t| now.duration_since(*t) >= FULL_DISK_RESTART_BACKOFF);
                if waited && g.node.stopped_by_full_disk() {
                    tries.insert(id, now);
                    due.push(id);
                }
            }
            due
        };
        let mut restarted = Vec::new();
        for id in due {
            match self.restart(id, std::time::Duration::from_secs(1)) {
                Ok(()) => {
                    tracing::warn!(
                        group = id,
                        "out-of-order group stopped by a full disk restarted: the disk has room again"
                    );
                    restarted.push(id);
                }
                Err(e) => tracing::warn!(
                    group = id,
                    error = %e,
                    "out-of-order group stopped by a full disk did not restart; trying again later"
                ),
            }
        }
        restarted
    }

    /// Adds what only this registry knows to the node's metrics (`Env::metrics`, which
    /// reports every running group of every mode): the out-of-order groups whose replica
    /// did not start here (damaged files, or a restart that failed).
    pub fn add_metrics(&self, e: &mut Exposition, node: u64) {
        for id in self.failed_ids() {
            let mode = self.failed_mode(id).unwrap_or_default();
            e.sample(
                "chorus_group_not_started",
                Kind::Gauge,
                "",
                &format!("node=\"{node}\",group=\"{id}\",mode=\"{mode}\""),
                1,
            );
        }
    }

    /// Stops every group (their drivers finish and their threads are joined).
    pub fn shutdown(&self) {
        let all = std::mem::take(&mut *self.groups.write().unwrap_or_else(|p| p.into_inner()));
        drop(all);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `dir` (a node's `DATA_DIR/ooo`) holds any out-of-order group's spec.
    fn any_in(dir: &Path) -> bool {
        std::fs::read_dir(dir)
            .is_ok_and(|mut d| d.any(|e| e.is_ok_and(|e| e.path().join("group.toml").exists())))
    }

    /// Node 1's settings with its groups under `root/ooo`, no guard, the real disk, and
    /// an environment of its own under `root/env` (listening on a free port).
    fn settings(root: &Path) -> OooSettings {
        let env = chorus_runtime::Env::open(chorus_runtime::EnvConfig::new(
            1,
            root.join("env"),
            "127.0.0.1:0".parse().unwrap(),
        ))
        .unwrap();
        OooSettings {
            env,
            node: 1,
            dir: root.join("ooo"),
            election_timeout: Duration::from_millis(100),
            apply_threads: 0,
            catchup_rate: 0,
            compact_bytes: 0,
            freeze_interval: std::time::Duration::ZERO,
            timed_resend: chorus_core::ooo::replica::TIMED_RESEND,
            preallocate: chorus_storage::ooo::DEFAULT_PREALLOCATE,
            direct_io: true,
            disk: None,
            fs: None,
        }
    }

    fn spec(mode: &str, voters: &[u64], replicas: &[u64]) -> GroupSpec {
        let mut g = GroupSpec::ordered(5, voters.to_vec(), vec![]);
        g.mode = mode.into();
        g.replicas = replicas.to_vec();
        g
    }

    #[test]
    fn specs_are_checked_by_name() {
        let ok = spec("parallel", &[1, 2], &[]);
        let p = OooSpec::parse(&ok, 1).unwrap().unwrap();
        assert_eq!(p.mode, Mode::Parallel { span: 2 });
        assert!(OooSpec::parse(&spec("ordered", &[1], &[]), 1)
            .unwrap()
            .is_none());
        let err = |g: &GroupSpec, me| OooSpec::parse(g, me).unwrap_err().to_string();
        assert!(err(&spec("fast", &[1], &[]), 1).contains("mode `fast`"));
        assert!(err(&spec("parallel", &[1, 1], &[]), 1).contains("a voter is listed twice"));
        assert!(err(&spec("parallel", &[], &[1]), 1).contains("no voters"));
        assert!(err(&spec("parallel", &[1], &[0]), 1).contains("node id 0 is reserved"));
        // A replica that is not a voter yet (a membership change may add it) may open
        // the group; a voter named in `replicas` too is a voter.
        let spare = spec("dependent", &[1], &[1, 9]);
        for me in [1, 9] {
            let p = OooSpec::parse(&spare, me).unwrap().unwrap();
            assert_eq!(p.voters, vec![1]);
            assert_eq!(p.others, vec![9]);
        }
        assert!(err(&spare, 8).contains("neither one of its voters nor named in `replicas`"));
        assert!(err(&ok, 3).contains("this node (3)"));
        let mut lb = spec("dependent", &[1], &[]);
        lb.look_behind = 3;
        assert!(err(&lb, 1).contains("parallel groups only"));
        assert!(!p.conflict_order, "commit order `any` by default");
        let mut co = ok.clone();
        co.commit_order = "conflicts".into();
        assert!(OooSpec::parse(&co, 1).unwrap().unwrap().conflict_order);
        co.commit_order = "any".into();
        assert!(!OooSpec::parse(&co, 1).unwrap().unwrap().conflict_order);
        co.commit_order = "serial".into();
        assert!(err(&co, 1).contains("commit_order `serial` is not one of any, conflicts"));
        let mut dep = spec("dependent", &[1], &[]);
        dep.commit_order = "conflicts".into();
        assert!(err(&dep, 1).contains("commit_order applies to parallel groups only"));
        let mut learners = ok.clone();
        learners.learners = vec![3];
        assert!(err(&learners, 1).contains("no learners"));
    }

    #[test]
    fn records_are_checked_against_the_mode() {
        let par = Mode::Parallel { span: 2 };
        let r = |s, n| BlockRange::new(s, n).unwrap();
        assert!(check_record(par, &Declared::Blocks(vec![r(0, 2)]), 8192).is_ok());
        assert!(check_record(par, &Declared::Blocks(vec![r(0, 2)]), 4096)
            .unwrap_err()
            .contains("declares 2 blocks"));
        assert!(
            check_record(par, &Declared::Blocks(vec![r(0, 2), r(1, 1)]), 3 * 4096)
                .unwrap_err()
                .contains("overlap")
        );
        assert!(check_record(par, &Declared::Blocks(vec![]), 0).is_err());
        assert!(
            check_record(par, &Declared::Blocks(vec![r(MAX_BLOCKS, 1)]), 4096)
                .unwrap_err()
                .contains("past the volume")
        );
        let txn = |w: Vec<u64>| Declared::Txn {
            read_set: vec![1],
            write_set: w,
        };
        assert!(check_record(Mode::Dependent, &txn(vec![2]), 3).is_ok());
        assert!(check_record(Mode::Dependent, &txn(vec![]), 3).is_err());
        assert!(check_record(par, &txn(vec![2]), 3)
            .unwrap_err()
            .contains("parallel-mode group"));
        assert!(
            check_record(Mode::Dependent, &Declared::Blocks(vec![r(0, 1)]), 4096)
                .unwrap_err()
                .contains("dependent-mode group")
        );
        assert_eq!(parse_blocks("7").unwrap(), r(7, 1));
        assert_eq!(parse_blocks("7+3").unwrap(), r(7, 3));
        assert!(parse_blocks("7+0").is_err());
        assert!(parse_blocks("x").is_err());
    }

    /// A group id an ordered group has on the node is refused for an out-of-order group,
    /// leaving no spec behind; another id works, is found on disk, and reopens.
    #[test]
    fn a_group_whose_id_is_taken_is_refused_and_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let s = settings(dir.path());
        s.env.create_group(5, &[1], &[]).unwrap();
        let groups = OooGroups::open(s.clone()).unwrap();
        let e = groups.create(spec("dependent", &[1], &[])).unwrap_err();
        assert!(matches!(e, OooGroupError::Exists(5)), "{e}");
        assert!(!any_in(&dir.path().join("ooo")));
        assert!(groups.ids().is_empty());
        let mut g = spec("dependent", &[1], &[]);
        g.id = 6;
        groups.create(g.clone()).unwrap();
        groups.create(g.clone()).unwrap(); // same spec: accepted
        let mut other = g.clone();
        other.mode = "parallel".into();
        assert!(matches!(
            groups.create(other),
            Err(OooGroupError::Exists(6))
        ));
        assert!(any_in(&dir.path().join("ooo")));
        groups.shutdown();
        let again = OooGroups::open(s.clone()).unwrap();
        assert_eq!(again.ids(), vec![6]);
        again.shutdown();
        s.env.shutdown();
    }

    /// An out-of-order group stopped by a full disk (`ENOSPC` from its store) is left
    /// alone while the free-space guard says the disk is low, and restarted once there is
    /// room: it recovers its store, its state machine holds what was committed, and it
    /// commits again.
    #[test]
    fn a_group_stopped_by_a_full_disk_restarts_once_there_is_room() {
        use std::time::Instant;
        let dir = tempfile::tempdir().unwrap();
        let disk = chorus_storage::fs::Fillable::new(Arc::new(chorus_storage::fs::RealFs));
        let guard = Arc::new(chorus_runtime::DiskSpace::new(dir.path(), 0));
        let groups = OooGroups::open(OooSettings {
            disk: Some(guard.clone()),
            fs: Some(Arc::new(disk.clone())),
            ..settings(dir.path())
        })
        .unwrap();
        groups.create(spec("dependent", &[1], &[])).unwrap();
        let txn = |k: u64| Declared::Txn {
            read_set: vec![],
            write_set: vec![k],
        };
        let append = |k: u64, v: &[u8]| groups.get(5).unwrap().node.append(txn(k), v.to_vec());
        let end = Instant::now() + Duration::from_secs(20);
        while append(1, b"one").is_err() {
            assert!(Instant::now() < end, "no leader");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(append(2, b"two").is_ok());
        disk.set_full(true);
        let end = Instant::now() + Duration::from_secs(20);
        while !groups.get(5).unwrap().node.stopped_by_full_disk() {
            let _ = append(3, b"on a full disk");
            assert!(Instant::now() < end, "the group never stopped");
            std::thread::sleep(Duration::from_millis(5));
        }
        // Low: left alone. Room: restarted once, then running (nothing to restart).
        guard.set_min_free(u64::MAX - 1);
        assert!(groups.restart_stopped_by_full_disk().is_empty());
        disk.set_full(false);
        guard.set_min_free(0);
        guard.refresh().unwrap();
        assert_eq!(groups.restart_stopped_by_full_disk(), vec![5]);
        assert!(groups.restart_stopped_by_full_disk().is_empty());
        let g = groups.get(5).unwrap();
        assert!(g.node.stopped_reason().is_none());
        let end = Instant::now() + Duration::from_secs(20);
        while append(4, b"four").is_err() {
            assert!(Instant::now() < end, "no leader after the restart");
            std::thread::sleep(Duration::from_millis(20));
        }
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            let got = g.state.get_keys(&[1, 2, 4]).unwrap();
            if got
                == [
                    Some(b"one".to_vec()),
                    Some(b"two".to_vec()),
                    Some(b"four".to_vec()),
                ]
            {
                break;
            }
            assert!(Instant::now() < end, "state after the restart: {got:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
        drop(g);
        assert!(groups
            .settings
            .env
            .render_metrics()
            .contains("chorus_group_restarts_total{node=\"1\"} 1"));
        groups.shutdown();
    }
}
