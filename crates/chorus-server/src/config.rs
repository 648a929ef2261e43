//! Server configuration: a TOML file, overridden by `CHORUS_*` environment variables,
//! overridden by command-line flags. Every setting, its default and what it accepts is
//! listed in `docs/operations.md`; a bad value is refused naming the setting, the value
//! and what is accepted.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;

use chorus_core::format::meta::AccessMode;
use chorus_core::replica::{CommitMode, ReplicaConfig};
use chorus_runtime::transport::TlsFiles;
use chorus_runtime::EnvConfig;
use chorus_storage::LogOptions;
use serde::{Deserialize, Serialize};

/// Largest `timed_resend` either section takes: a timeout of 16 round trips is longer
/// than the slow copy it is meant to beat on any link we measured.
const MAX_TIMED_RESEND: u32 = 16;

/// A configuration error naming the setting, the value and what is accepted.
#[derive(Debug, thiserror::Error)]
#[error("setting `{setting}`: value `{value}` is not accepted; expected {accepted}")]
pub struct ConfigError {
    /// The setting.
    pub setting: String,
    /// The value given.
    pub value: String,
    /// What is accepted.
    pub accepted: String,
}

fn bad(setting: &str, value: impl ToString, accepted: impl ToString) -> ConfigError {
    ConfigError {
        setting: setting.into(),
        value: value.to_string(),
        accepted: accepted.to_string(),
    }
}

/// A group this node creates at start if it does not exist yet.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct GroupSpec {
    /// Group id (1 or more).
    pub id: u64,
    /// Initial voters (every one of them must list the same).
    pub voters: Vec<u64>,
    /// Initial learners.
    #[serde(default)]
    pub learners: Vec<u64>,
    /// `ordered` (the default: the PALF replica), `parallel` (ParallelRaft: records declare
    /// the blocks they write) or `dependent` (DP-Raft: records declare read and write
    /// sets). Chosen at creation, never changed.
    #[serde(default = "ordered", skip_serializing_if = "is_ordered")]
    pub mode: String,
    /// Out-of-order groups: the replicas besides `voters` that a membership change may
    /// add later (node ids). Every replica is reached at its node's replication address
    /// (`[peers]`): groups of every mode share the node's connections.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replicas: Vec<u64>,
    /// Parallel groups: the look-behind buffer's length N (PolarFS section 5.2; 0 means
    /// the paper's 2).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub look_behind: u32,
    /// Parallel groups: `any` (the default: an entry commits once a majority has it) or
    /// `conflicts` (an entry commits only after every earlier entry overlapping its
    /// blocks: the DP-Raft paper's adaptation of ParallelRaft to transactions).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub commit_order: String,
    /// Ordered groups: `append` (the default: a primary) or `raw-write` (a mirror: it takes
    /// only groups another log committed, `chorus mirror`, until switched with `chorus
    /// group access-mode`; PALF section 5.2). Read at creation only: the mode in force
    /// afterwards is the group's own (`chorus status`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub access_mode: String,
    /// Parallel groups: the chunk's size in bytes (a group is one chunk of a volume,
    /// PolarFS section 3.2; 0 means 10 GiB, the paper's). A positive multiple of
    /// `block_bytes`, at most 1 TiB.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub chunk_bytes: u64,
    /// Parallel groups: the chunk's allocation unit in bytes (PolarFS section 4; 0 means
    /// 64 KiB, the paper's). A power of two from 4 KiB to 16 MiB.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub block_bytes: u32,
}

/// The access mode a group spec or request names (`""` is append).
pub fn parse_access_mode(s: &str) -> Result<AccessMode, String> {
    if s.is_empty() {
        return Ok(AccessMode::Append);
    }
    AccessMode::from_name(s)
        .ok_or_else(|| format!("access_mode `{s}` is not one of append, raw-write"))
}

fn ordered() -> String {
    "ordered".into()
}

fn is_ordered(m: &String) -> bool {
    m == "ordered" || m.is_empty()
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

impl GroupSpec {
    /// An ordered group.
    pub fn ordered(id: u64, voters: Vec<u64>, learners: Vec<u64>) -> Self {
        Self {
            id,
            voters,
            learners,
            mode: ordered(),
            replicas: Vec::new(),
            look_behind: 0,
            commit_order: String::new(),
            access_mode: String::new(),
            chunk_bytes: 0,
            block_bytes: 0,
        }
    }

    /// Whether the group is ordered (the PALF replica of the main runtime).
    pub fn is_ordered(&self) -> bool {
        is_ordered(&self.mode)
    }
}

/// The storage layer's control plane (PolarFS section 3.2.3, PolarCtrl) and this node's
/// part in it: a node hosting a replica of the control `group` serves the Control
/// service (its leader does the control duties); a node given `endpoints` is a chunk
/// server that heartbeats there and hosts the chunk groups the control plane places on
/// it.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct ControlSection {
    /// The ordered group holding the control plane's state (0: this node is no control
    /// node). Configure it in `groups` on the control nodes, like any ordered group.
    pub group: u64,
    /// Client API addresses (`HOST:PORT`) of the control nodes, where this node sends
    /// its heartbeats (empty: it is no chunk server).
    pub endpoints: Vec<String>,
    /// This node's rack or zone: a chunk's replicas go to distinct racks when there are
    /// enough.
    pub rack: String,
    /// The client API address others reach this node at (default: `api_listen`).
    pub advertise_api: Option<String>,
    /// How often this node heartbeats.
    pub heartbeat_ms: u64,
    /// A node not heard from for this long is down: nothing new is placed on it.
    pub down_after_ms: u64,
    /// A node down for this long has its chunk replicas rebuilt elsewhere.
    pub replace_after_ms: u64,
    /// Chunk size of a volume created without one (the paper's 10 GiB).
    pub chunk_bytes: u64,
    /// Control nodes: how many bytes of chunks per second the scrubber compares across
    /// replicas (PolarFS section 7.3; 0: no scrubbing).
    pub scrub_bytes_per_sec: u64,
}

impl Default for ControlSection {
    fn default() -> Self {
        Self {
            group: 0,
            endpoints: Vec::new(),
            rack: String::new(),
            advertise_api: None,
            heartbeat_ms: 1000,
            down_after_ms: 5000,
            replace_after_ms: 60_000,
            chunk_bytes: chorus_chunk::DEFAULT_CHUNK_BYTES,
            scrub_bytes_per_sec: 16 << 20,
        }
    }
}

/// Settings of out-of-order groups.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct OutOfOrderSection {
    /// Election timeout (randomised up to twice this); heartbeats and resends every sixth.
    pub election_timeout_ms: u64,
    /// Pieces a group's applies run in: each released entry is applied on the node's
    /// apply workers (this many, at least one, shared by every out-of-order group), cut
    /// into at most this many pieces of independent records (0: the group's driver
    /// applies, one entry after another).
    pub apply_threads: usize,
    /// Streaming catch-up to one lagging follower, bytes per second (0: no limit), so a
    /// follower coming back does not take the link from new appends.
    pub catchup_bytes_per_sec: u64,
    /// Checkpoint the state machine and compact a group's entries file once it holds
    /// this many bytes (0: never; the file then grows with the group's whole history).
    pub compact_bytes: u64,
    /// Leaders let appends gather into one group entry while their own log write is in
    /// flight, at most this many microseconds (adaptive group replication, PALF section
    /// 6): less CPU per append at high concurrency, later commit news for followers
    /// (0: pack what each driver round took).
    pub freeze_us: u64,
    /// Leaders resend an uncommitted entry a follower has not acknowledged within this
    /// many of its median round trips (TCP's tail loss probe; 0: off; 0–16).
    pub timed_resend: u32,
}

impl Default for OutOfOrderSection {
    fn default() -> Self {
        Self {
            election_timeout_ms: 1000,
            apply_threads: 2,
            catchup_bytes_per_sec: 64 << 20,
            compact_bytes: 64 << 20,
            freeze_us: 0,
            timed_resend: chorus_core::ooo::replica::TIMED_RESEND,
        }
    }
}

/// Replica timings (milliseconds) and limits.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct ReplicaSection {
    /// Leader lease.
    pub lease_ms: u64,
    /// Leader heartbeat period.
    pub heartbeat_ms: u64,
    /// Election priority ping period.
    pub ping_ms: u64,
    /// Resend unacknowledged log after this long.
    pub resend_ms: u64,
    /// Bound on clock rate difference, parts per million.
    pub max_clock_drift_ppm: u32,
    /// Uncommitted bytes the leader may have in flight.
    pub window_bytes: u64,
    /// Largest group.
    pub max_group_bytes: usize,
    /// Largest replication message.
    pub max_message_bytes: usize,
    /// Freeze interval under high concurrency, microseconds.
    pub freeze_us: u64,
    /// Election priority of this node (higher wins after config version).
    pub priority: u32,
    /// `piggyback`, `sync`, or `async` (the piggyback paper's three modes).
    pub commit_mode: String,
    /// Flush interval of the `async` commit mode.
    pub async_interval_ms: u64,
    /// Leader: resend the oldest message a follower has not acknowledged within this many
    /// of its median round trips (TCP's tail loss probe; 0: off; 0–16).
    pub timed_resend: u32,
}

impl Default for ReplicaSection {
    fn default() -> Self {
        let d = ReplicaConfig::default();
        Self {
            lease_ms: d.lease / 1_000_000,
            heartbeat_ms: d.heartbeat_interval / 1_000_000,
            ping_ms: d.ping_interval / 1_000_000,
            resend_ms: d.resend_interval / 1_000_000,
            max_clock_drift_ppm: d.max_clock_drift_ppm,
            window_bytes: d.window_bytes,
            max_group_bytes: d.max_group_bytes,
            max_message_bytes: d.max_message_bytes,
            freeze_us: d.freeze_interval / 1000,
            priority: d.priority,
            commit_mode: "piggyback".into(),
            async_interval_ms: 10,
            timed_resend: d.timed_resend,
        }
    }
}

/// Log storage settings.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct LogSection {
    /// Bytes per block file.
    pub block_size: u64,
    /// Append with O_DIRECT (falls back to buffered where refused): the ordered log's
    /// tail block and every out-of-order group's entries file.
    pub direct_io: bool,
    /// Bytes of zeros kept written past the end of the tail block file (and of every
    /// out-of-order group's entries file), so most syncs do not grow the file; 0: none.
    pub preallocate: u64,
    /// Leaders refuse appends (RESOURCE_EXHAUSTED, nothing appended) while the file
    /// system holding `data_dir` has fewer bytes than this available, so a full disk does
    /// not stop the node's groups; appends resume once space is freed. 0: no guard.
    pub min_free_bytes: u64,
    /// Pipelined group commit for ordered groups: a group's next batch is written while
    /// its last one syncs, on sync threads (docs/architecture.md, the runtime). Off by
    /// default: on a 2-core machine the hand-off costs more than the overlap saves
    /// (docs/benchmarks.md).
    pub pipelined_sync: bool,
    /// Bytes per second at most that the scrubber reads of the ordered groups' sealed
    /// log blocks, checking every group's checksums and repairing damage from peers; 0
    /// turns it off.
    pub scrub_bytes_per_sec: u64,
    /// Seconds from the start of one scrub pass to the start of the next (the first pass
    /// starts with the node). At least 1.
    pub scrub_interval_secs: u64,
}

impl Default for LogSection {
    fn default() -> Self {
        let d = LogOptions::default();
        Self {
            block_size: d.block_size,
            direct_io: d.direct_io,
            preallocate: d.preallocate,
            min_free_bytes: chorus_runtime::DEFAULT_MIN_FREE_BYTES,
            pipelined_sync: false,
            scrub_bytes_per_sec: chorus_runtime::scrub::DEFAULT_SCRUB_BYTES_PER_SEC,
            scrub_interval_secs: chorus_runtime::scrub::DEFAULT_SCRUB_INTERVAL.as_secs(),
        }
    }
}

/// Mutual TLS for replication.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TlsSection {
    /// CA certificate (PEM).
    pub ca: PathBuf,
    /// This node's certificate chain (PEM).
    pub cert: PathBuf,
    /// This node's private key (PEM).
    pub key: PathBuf,
    /// Name in every node's certificate.
    #[serde(default = "default_server_name")]
    pub server_name: String,
}

fn default_server_name() -> String {
    "localhost".into()
}

/// TLS on the client API (`api_listen`), optionally mutual.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ApiTlsSection {
    /// This node's API certificate chain (PEM), presented to clients; also this node's
    /// client certificate when it calls other nodes' APIs (the control plane's agent and
    /// duties, chunk copies).
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
    /// The CA certificate(s) (PEM) that sign every node's API certificate: this node
    /// checks the other nodes' against it when it calls them.
    pub ca: PathBuf,
    /// When set, clients must present a certificate signed by this CA (PEM): mutual TLS.
    /// Unset, any client that trusts the node's certificate may connect.
    #[serde(default)]
    pub client_ca: Option<PathBuf>,
    /// The name every node's API certificate carries, checked when this node calls
    /// another (default: the host of the address called).
    #[serde(default)]
    pub server_name: Option<String>,
}

/// The whole server configuration.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// This node's id (1 or more, unique in the cluster).
    pub node: u64,
    /// Data directory.
    pub data_dir: PathBuf,
    /// Cluster id, checked in every replication handshake.
    pub cluster_id: u64,
    /// Replication listen address.
    pub listen: String,
    /// Address peers dial (defaults to `listen`).
    pub advertise: Option<String>,
    /// gRPC API listen address.
    pub api_listen: String,
    /// Prometheus metrics listen address (`GET /metrics`); empty disables.
    pub metrics_listen: String,
    /// IO worker threads shared by all groups.
    pub io_workers: usize,
    /// Ordered groups one IO worker steps together in a pass (1–4096; 1: each on its own).
    pub pass_groups: usize,
    /// Replication addresses of the other nodes, by node id.
    pub peers: BTreeMap<String, String>,
    /// Groups to create at start if missing.
    pub groups: Vec<GroupSpec>,
    /// Replica settings.
    pub replica: ReplicaSection,
    /// Log storage settings.
    pub log: LogSection,
    /// Mutual TLS for replication.
    pub tls: Option<TlsSection>,
    /// TLS on the client API.
    pub api_tls: Option<ApiTlsSection>,
    /// Who may call the client API (bearer tokens, per group and operation class).
    pub api_auth: Option<crate::auth::ApiAuthSection>,
    /// Settings of out-of-order (parallel and dependent mode) groups.
    pub out_of_order: OutOfOrderSection,
    /// The storage layer's control plane, and this node's part in it.
    pub control: ControlSection,
    /// Archiving the ordered groups this node leads to object storage (PALF section 5.2).
    pub archive: Option<crate::archive::ArchiveSection>,
    /// Log filter (tracing `EnvFilter` syntax), e.g. `info` or `chorus_runtime=debug`.
    pub log_filter: String,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            node: 0,
            data_dir: PathBuf::from("chorus-data"),
            cluster_id: 1,
            listen: "127.0.0.1:7100".into(),
            advertise: None,
            api_listen: "127.0.0.1:7000".into(),
            metrics_listen: String::new(),
            io_workers: 4,
            pass_groups: chorus_runtime::env::DEFAULT_PASS_GROUPS,
            peers: BTreeMap::new(),
            groups: Vec::new(),
            replica: ReplicaSection::default(),
            log: LogSection::default(),
            tls: None,
            api_tls: None,
            api_auth: None,
            out_of_order: OutOfOrderSection::default(),
            control: ControlSection::default(),
            archive: None,
            log_filter: "info".into(),
        }
    }
}

/// A deliberately broken replica, in test builds only (`--features broken`): the
/// real-process fault tests (`chorus-nemesis`) must catch it. `CHORUS_BROKEN` names it:
/// `skip-reconfirmation` or `ack-before-fsync` (replicas), or `flushed-before-sync` or
/// `skip-fsync` (the ordered driver step reports writes durable before it syncs them, or
/// no group, ordered or out-of-order, ever syncs its log; read by the runtime); unset,
/// the node is correct.
#[cfg(feature = "broken")]
fn broken_from_env() -> Result<chorus_core::replica::Broken, ConfigError> {
    use chorus_core::replica::Broken;
    match std::env::var("CHORUS_BROKEN").as_deref() {
        Err(_) | Ok("") => Ok(Broken::None),
        Ok(
            b @ ("skip-reconfirmation" | "ack-before-fsync" | "flushed-before-sync" | "skip-fsync"),
        ) => {
            eprintln!("chorus: a DELIBERATELY BROKEN node ({b}): for testing the tests only");
            Ok(match b {
                "ack-before-fsync" => Broken::AckBeforeFsync,
                "skip-reconfirmation" => Broken::SkipReconfirmation,
                // The runtime's driver step is the broken part.
                _ => Broken::None,
            })
        }
        Ok(other) => Err(bad(
            "CHORUS_BROKEN",
            other,
            "skip-reconfirmation, ack-before-fsync, flushed-before-sync or skip-fsync",
        )),
    }
}

/// Parses `a=b` pairs of a `--peer` flag or `CHORUS_PEERS`.
pub fn parse_peer(s: &str) -> Result<(String, String), ConfigError> {
    let (id, addr) = s
        .split_once('=')
        .ok_or_else(|| bad("peers", s, "NODE_ID=HOST:PORT"))?;
    Ok((id.trim().to_string(), addr.trim().to_string()))
}

/// Parses `ID:V1,V2,V3` of a `--group` flag or `CHORUS_GROUPS` (`;`-separated).
pub fn parse_group(s: &str) -> Result<GroupSpec, ConfigError> {
    let accepted = "GROUP_ID:VOTER,VOTER,... (e.g. 1:1,2,3)";
    let (id, voters) = s
        .split_once(':')
        .ok_or_else(|| bad("groups", s, accepted))?;
    let id = id.trim().parse().map_err(|_| bad("groups", s, accepted))?;
    let voters: Result<Vec<u64>, _> = voters.split(',').map(|v| v.trim().parse()).collect();
    let voters = voters.map_err(|_| bad("groups", s, accepted))?;
    Ok(GroupSpec::ordered(id, voters, vec![]))
}

impl ServerConfig {
    /// Reads a TOML file (a missing `path` gives the defaults).
    pub fn load(path: Option<&std::path::Path>) -> Result<Self, ConfigError> {
        let Some(path) = path else {
            return Ok(Self::default());
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| bad("--config", path.display(), format!("a readable file ({e})")))?;
        toml::from_str(&text).map_err(|e| ConfigError {
            setting: format!("config file {}", path.display()),
            value: e.message().to_string(),
            accepted: format!(
                "valid TOML with the settings listed in docs/operations.md{}",
                e.span()
                    .map(|s| format!(" (at byte {})", s.start))
                    .unwrap_or_default()
            ),
        })
    }

    /// Applies `CHORUS_*` environment variables from `vars`.
    pub fn apply_env(
        &mut self,
        vars: impl Iterator<Item = (String, String)>,
    ) -> Result<(), ConfigError> {
        for (k, v) in vars {
            let Some(key) = k.strip_prefix("CHORUS_") else {
                continue;
            };
            let num = |setting: &str| {
                v.parse::<u64>()
                    .map_err(|_| bad(setting, &v, "a non-negative integer"))
            };
            match key {
                "NODE" => self.node = num("CHORUS_NODE")?,
                "DATA_DIR" => self.data_dir = PathBuf::from(&v),
                "CLUSTER_ID" => self.cluster_id = num("CHORUS_CLUSTER_ID")?,
                "LISTEN" => self.listen = v,
                "ADVERTISE" => self.advertise = Some(v),
                "API_LISTEN" => self.api_listen = v,
                "METRICS_LISTEN" => self.metrics_listen = v,
                "IO_WORKERS" => self.io_workers = num("CHORUS_IO_WORKERS")? as usize,
                "PASS_GROUPS" => self.pass_groups = num("CHORUS_PASS_GROUPS")? as usize,
                "LOG" => self.log_filter = v,
                "PEERS" => {
                    for p in v.split(',').filter(|s| !s.is_empty()) {
                        let (id, addr) = parse_peer(p)?;
                        self.peers.insert(id, addr);
                    }
                }
                "GROUPS" => {
                    for g in v.split(';').filter(|s| !s.is_empty()) {
                        self.groups.push(parse_group(g)?);
                    }
                }
                _ => {} // Other CHORUS_ variables belong to other tools (e.g. CHORUS_SIM_TRACE).
            }
        }
        Ok(())
    }

    /// Checks every value and builds the runtime configuration.
    pub fn to_env_config(
        &self,
    ) -> Result<(EnvConfig, SocketAddr, Option<SocketAddr>), ConfigError> {
        if self.node == 0 {
            return Err(bad("node", self.node, "a node id from 1 to 2^64-1"));
        }
        let addr = |setting: &str, v: &str| -> Result<SocketAddr, ConfigError> {
            v.parse()
                .map_err(|_| bad(setting, v, "an IP address and port, e.g. 127.0.0.1:7000"))
        };
        let listen = addr("listen", &self.listen)?;
        let api = addr("api_listen", &self.api_listen)?;
        let metrics = if self.metrics_listen.is_empty() {
            None
        } else {
            Some(addr("metrics_listen", &self.metrics_listen)?)
        };
        let mut peers = HashMap::new();
        for (id, a) in &self.peers {
            let id: u64 = id
                .parse()
                .ok()
                .filter(|i| *i != 0)
                .ok_or_else(|| bad("peers", id, "node ids (1 or more) as keys"))?;
            if a.rsplit_once(':')
                .and_then(|(_, p)| p.parse::<u16>().ok())
                .is_none()
            {
                return Err(bad(&format!("peers.{id}"), a, "HOST:PORT"));
            }
            peers.insert(id, a.clone());
        }
        for g in &self.groups {
            if g.id == 0 {
                return Err(bad("groups.id", 0, "a group id from 1"));
            }
            if g.voters.is_empty() || g.voters.contains(&0) {
                return Err(bad(
                    &format!("groups[{}].voters", g.id),
                    format!("{:?}", g.voters),
                    "a non-empty list of node ids (1 or more)",
                ));
            }
        }
        let r = &self.replica;
        let ms = 1_000_000u64;
        if r.lease_ms < 100 || r.lease_ms > 600_000 {
            return Err(bad("replica.lease_ms", r.lease_ms, "100 to 600000"));
        }
        if r.heartbeat_ms == 0 || r.heartbeat_ms * 3 > r.lease_ms {
            return Err(bad(
                "replica.heartbeat_ms",
                r.heartbeat_ms,
                format!("1 to a third of the lease ({})", r.lease_ms / 3),
            ));
        }
        if r.ping_ms == 0 || r.ping_ms * 3 > r.lease_ms {
            return Err(bad(
                "replica.ping_ms",
                r.ping_ms,
                format!("1 to a third of the lease ({})", r.lease_ms / 3),
            ));
        }
        if r.resend_ms == 0 {
            return Err(bad("replica.resend_ms", r.resend_ms, "1 or more"));
        }
        if r.max_clock_drift_ppm > 100_000 {
            return Err(bad(
                "replica.max_clock_drift_ppm",
                r.max_clock_drift_ppm,
                "0 to 100000",
            ));
        }
        if !(1 << 20..=1 << 34).contains(&r.window_bytes) {
            return Err(bad(
                "replica.window_bytes",
                r.window_bytes,
                "1 MiB to 16 GiB",
            ));
        }
        if !(64 << 10..=16 << 20).contains(&r.max_group_bytes) {
            return Err(bad(
                "replica.max_group_bytes",
                r.max_group_bytes,
                "64 KiB to 16 MiB",
            ));
        }
        if r.max_message_bytes < r.max_group_bytes || r.max_message_bytes > 64 << 20 {
            return Err(bad(
                "replica.max_message_bytes",
                r.max_message_bytes,
                "at least replica.max_group_bytes and at most 64 MiB",
            ));
        }
        if r.freeze_us == 0 || r.freeze_us > 1_000_000 {
            return Err(bad("replica.freeze_us", r.freeze_us, "1 to 1000000"));
        }
        if r.timed_resend > MAX_TIMED_RESEND {
            return Err(bad("replica.timed_resend", r.timed_resend, "0 (off) to 16"));
        }
        if self.out_of_order.timed_resend > MAX_TIMED_RESEND {
            return Err(bad(
                "out_of_order.timed_resend",
                self.out_of_order.timed_resend,
                "0 (off) to 16",
            ));
        }
        let commit_mode = match r.commit_mode.as_str() {
            "piggyback" => CommitMode::Piggyback,
            "sync" => CommitMode::Sync,
            "async" => {
                if r.async_interval_ms == 0 {
                    return Err(bad("replica.async_interval_ms", 0, "1 or more"));
                }
                CommitMode::Async {
                    interval: r.async_interval_ms * ms,
                }
            }
            other => {
                return Err(bad(
                    "replica.commit_mode",
                    other,
                    "piggyback, sync or async",
                ));
            }
        };
        if !self.log.block_size.is_multiple_of(4096)
            || !(64 << 10..=4 << 30).contains(&self.log.block_size)
        {
            return Err(bad(
                "log.block_size",
                self.log.block_size,
                "a multiple of 4096 from 65536 to 4294967296",
            ));
        }
        if !self.log.preallocate.is_multiple_of(4096)
            || self.log.preallocate > chorus_storage::log::MAX_PREALLOCATE
        {
            return Err(bad(
                "log.preallocate",
                self.log.preallocate,
                "0 or a multiple of 4096 up to 67108864",
            ));
        }
        if self.log.block_size < r.max_group_bytes as u64 * 2 {
            return Err(bad(
                "log.block_size",
                self.log.block_size,
                "at least twice replica.max_group_bytes",
            ));
        }
        let replica = ReplicaConfig {
            priority: r.priority,
            block_size: self.log.block_size,
            lease: r.lease_ms * ms,
            max_clock_drift_ppm: r.max_clock_drift_ppm,
            heartbeat_interval: r.heartbeat_ms * ms,
            ping_interval: r.ping_ms * ms,
            resend_interval: r.resend_ms * ms,
            window_bytes: r.window_bytes,
            max_group_bytes: r.max_group_bytes,
            max_message_bytes: r.max_message_bytes,
            freeze_interval: r.freeze_us * 1000,
            commit_mode,
            timed_resend: r.timed_resend,
            ..EnvConfig::new(1, "", "127.0.0.1:0".parse().expect("address")).replica
        };
        #[cfg(feature = "broken")]
        let replica = ReplicaConfig {
            broken: broken_from_env()?,
            ..replica
        };
        let mut env = EnvConfig::new(self.node, self.data_dir.clone(), listen);
        env.cluster_id = self.cluster_id;
        env.advertise = self.advertise.clone();
        env.peers = peers;
        env.io_workers = self.io_workers;
        env.pass_groups = self.pass_groups;
        // The node's apply workers, shared by its out-of-order groups: as many as a
        // group may cut an entry into, and at least one.
        env.apply_threads = self.out_of_order.apply_threads.clamp(1, 64);
        env.replica = replica;
        env.log = LogOptions {
            block_size: self.log.block_size,
            direct_io: self.log.direct_io,
            preallocate: self.log.preallocate,
        };
        env.min_free_bytes = self.log.min_free_bytes;
        env.pipelined_sync = self.log.pipelined_sync;
        env.scrub = chorus_runtime::ScrubOptions {
            bytes_per_sec: self.log.scrub_bytes_per_sec,
            interval: std::time::Duration::from_secs(self.log.scrub_interval_secs.max(1)),
        };
        // The node's out-of-order groups: hosted, opened and restarted by its
        // environment, with the server's state machines.
        let o = &self.out_of_order;
        env.ooo = chorus_runtime::env::OooGroupSettings {
            election_timeout: std::time::Duration::from_millis(o.election_timeout_ms.max(10)),
            apply_threads: o.apply_threads.min(64),
            catchup_rate: o.catchup_bytes_per_sec,
            compact_bytes: o.compact_bytes,
            hole_resend: chorus_core::ooo::replica::HOLE_RESEND,
            timed_resend: o.timed_resend,
            freeze_interval: std::time::Duration::from_micros(o.freeze_us),
            preallocate: self.log.preallocate,
            direct_io: self.log.direct_io,
        };
        env.state_machines = Some(std::sync::Arc::new(crate::ooo::Machines));
        env.max_frame_bytes = (r.max_message_bytes as u32).saturating_add(1 << 20);
        env.tls = self.tls.as_ref().map(|t| TlsFiles {
            ca: t.ca.clone(),
            cert: t.cert.clone(),
            key: t.key.clone(),
            server_name: t.server_name.clone(),
        });
        Ok((env, api, metrics))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(toml: &str) -> Result<EnvConfig, ConfigError> {
        let c: ServerConfig = toml::from_str(toml).map_err(|e| ConfigError {
            setting: "toml".into(),
            value: e.to_string(),
            accepted: String::new(),
        })?;
        c.to_env_config().map(|x| x.0)
    }

    #[test]
    fn defaults_need_only_a_node_id() {
        let e = with("node = 3").unwrap();
        assert_eq!(e.node, 3);
        assert_eq!(e.replica.lease, 2_000_000_000);
    }

    #[test]
    fn bad_values_name_the_setting_the_value_and_what_is_accepted() {
        let e = with("node = 1\n[replica]\nlease_ms = 5").unwrap_err();
        assert_eq!(e.setting, "replica.lease_ms");
        assert_eq!(e.value, "5");
        assert!(e.accepted.contains("100"));
        let e = with("node = 1\nlisten = \"nowhere\"").unwrap_err();
        assert_eq!(e.setting, "listen");
        let e = with("node = 1\n[replica]\ncommit_mode = \"fast\"").unwrap_err();
        assert_eq!(e.setting, "replica.commit_mode");
        assert!(e.accepted.contains("piggyback"));
        let e = with("node = 0").unwrap_err();
        assert_eq!(e.setting, "node");
        let e = with("node = 1\n[log]\nblock_size = 5000").unwrap_err();
        assert_eq!(e.setting, "log.block_size");
        let e = with("node = 1\n[log]\npreallocate = 1000").unwrap_err();
        assert_eq!(e.setting, "log.preallocate");
        assert!(with("node = 1\n[log]\npreallocate = 0").is_ok());
        let e = with("node = 1\n[replica]\ntimed_resend = 17").unwrap_err();
        assert_eq!(
            (e.setting.as_str(), e.value.as_str()),
            ("replica.timed_resend", "17")
        );
        let e = with("node = 1\n[out_of_order]\ntimed_resend = 99").unwrap_err();
        assert_eq!(e.setting, "out_of_order.timed_resend");
        assert!(e.accepted.contains("16"));
        let env = with("node = 1\n[replica]\ntimed_resend = 0").unwrap();
        assert_eq!(env.replica.timed_resend, 0, "0 turns it off");
        let env = with("node = 1").unwrap();
        assert_eq!(
            env.replica.timed_resend,
            ReplicaConfig::default().timed_resend
        );
        assert!(with("node = 1\nnot_a_setting = 2").is_err());
    }

    #[test]
    fn environment_overrides_the_file() {
        let mut c: ServerConfig = toml::from_str("node = 1\nlisten = \"127.0.0.1:1\"").unwrap();
        c.apply_env(
            [
                ("CHORUS_NODE".to_string(), "2".to_string()),
                ("CHORUS_PEERS".into(), "1=127.0.0.1:9,3=127.0.0.1:10".into()),
                ("CHORUS_GROUPS".into(), "1:1,2,3".into()),
                ("PATH".into(), "/bin".into()),
            ]
            .into_iter(),
        )
        .unwrap();
        assert_eq!(c.node, 2);
        assert_eq!(c.peers.len(), 2);
        assert_eq!(c.groups[0].voters, vec![1, 2, 3]);
        let e = c
            .apply_env([("CHORUS_NODE".to_string(), "two".to_string())].into_iter())
            .unwrap_err();
        assert_eq!(e.setting, "CHORUS_NODE");
    }
}
