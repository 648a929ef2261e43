//! The control plane's state: nodes, volumes and where each chunk's replicas live
//! (PolarFS section 3.2.3, PolarCtrl duties 1–3), and the commands that change it.
//!
//! PolarCtrl keeps this in a MySQL instance; Chorus keeps it as [`Command`]s appended to
//! an ordered, replicated log, and every control node replays that log through
//! [`Meta::apply`] to reach the same [`Meta`]. Applying is therefore deterministic: it
//! reads nothing but the state and the command (no clock, no randomness, only ordered
//! maps), and a command it rejects changes nothing but [`Meta::applied`].
//!
//! Besides nodes and volumes, the state names each volume's snapshots and tracks clones
//! being copied from them (PolarFS section 7.2, disk-outage-consistent snapshots); the
//! chunk servers hold the snapshots' data.
//!
//! Validation and the effect of each command are in `apply.rs`; the byte formats of
//! commands and of the whole state (the image) in `codec.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// A chunk server's id, assigned by the operator. 0 is reserved (never a node), so that
/// it can mean "none" in wire formats.
pub type NodeId = u64;

/// A chunk's replication group id: the id of the parallel-mode group that replicates it.
/// 0 is reserved (Chorus servers refuse group 0), so ids start at [`FIRST_GROUP`].
pub type GroupId = u64;

/// The first group id the control plane hands out.
pub const FIRST_GROUP: GroupId = 1;

/// The first snapshot id the control plane hands out; 0 means "no snapshot".
pub const FIRST_SNAPSHOT: u64 = 1;

/// Longest volume name (and snapshot name), in bytes.
pub const MAX_NAME_BYTES: usize = 64;

/// Longest node address (`repl_addr`, `client_addr`), in bytes.
pub const MAX_ADDR_BYTES: usize = 255;

/// Longest rack name, in bytes.
pub const MAX_RACK_BYTES: usize = 64;

/// Most replicas a chunk may have (PolarFS uses three, section 3.2; the command format
/// could hold 255).
pub const MAX_REPLICAS: usize = 16;

/// Smallest block size: one 4 KiB sector, the unit of a chunk write (`chorus_chunk::SECTOR`).
pub const MIN_BLOCK_BYTES: u32 = 4096;

/// Largest block size: 16 MiB, the most a chunk server accepts (`chorus_chunk::Geometry`).
pub const MAX_BLOCK_BYTES: u32 = 16 << 20;

/// What the control plane knows of a chunk server's availability for placement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NodeState {
    /// In service: new replicas may be placed on it.
    Up,
    /// An operator asked to move everything off it; nothing new is placed on it, and
    /// [`crate::place::drain_moves`] plans its replicas' moves (section 3.2.3, duty 1).
    Draining,
    /// Gone for good: never placed on again, and never brought back (a replacement
    /// machine registers under a new id).
    Removed,
}

impl fmt::Display for NodeState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NodeState::Up => "up",
            NodeState::Draining => "draining",
            NodeState::Removed => "removed",
        })
    }
}

/// A registered chunk server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    /// Its id; never 0.
    pub id: NodeId,
    /// Where its replication transport listens (other chunk servers connect here);
    /// 1..=[`MAX_ADDR_BYTES`] bytes.
    pub repl_addr: String,
    /// Where clients (the PolarSwitch role, section 3.2.1) send I/O; 1..=[`MAX_ADDR_BYTES`]
    /// bytes.
    pub client_addr: String,
    /// Its failure domain, at most [`MAX_RACK_BYTES`] bytes. Empty means unknown: such a
    /// node counts as alone in a rack of its own (as if its rack were named after its id,
    /// without colliding with any named rack), so placement neither groups it with other
    /// unknown nodes nor with any named rack.
    pub rack: String,
    /// Whether new replicas may go to it.
    pub state: NodeState,
}

/// A re-replication in progress (section 3.2.3, duty 1: "starting migration of chunk
/// replicas from one server to the others"): `to` is added to the chunk's group as a
/// learner, catches up (section 5.4), is promoted, and `from` is removed. Until
/// [`Command::FinishMove`] the chunk's replicas still list `from`, not `to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Move {
    /// The replica being replaced; one of the chunk's replicas.
    pub from: NodeId,
    /// The node receiving the copy; not one of the chunk's replicas.
    pub to: NodeId,
}

/// One chunk of a volume: the unit of data distribution (section 3.2), replicated by one
/// parallel-mode group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// The group that replicates it; unique across the whole state, never reused.
    pub group: GroupId,
    /// The voters: 1..=[`MAX_REPLICAS`] distinct registered nodes. The first is the
    /// preferred leader (clients try it first, and the group is asked to keep its
    /// leadership there, spreading leaders over nodes).
    pub replicas: Vec<NodeId>,
    /// The re-replication in progress, if any; at most one per chunk.
    pub moving: Option<Move>,
}

/// A volume's lifecycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum VolumeState {
    /// Its chunks' groups are being created on the chunk servers; not yet usable.
    Creating,
    /// In service.
    Ready,
    /// Its groups are being destroyed; gone from the state at [`Command::VolumeGone`].
    Deleting,
}

impl fmt::Display for VolumeState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            VolumeState::Creating => "creating",
            VolumeState::Ready => "ready",
            VolumeState::Deleting => "deleting",
        })
    }
}

/// A snapshot's lifecycle (PolarFS section 7.2, disk-outage-consistent snapshots).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SnapshotState {
    /// Being taken: routing clients tag their writes with its id (see
    /// [`Meta::snapshot_tag`]) and every chunk of the volume logs a barrier for it; not
    /// yet usable.
    Creating,
    /// Taken: every chunk holds it; it may be cloned ([`Command::CloneVolume`]).
    Ready,
    /// Being dropped by every chunk; gone from the state at [`Command::SnapshotGone`].
    Deleting,
}

impl fmt::Display for SnapshotState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SnapshotState::Creating => "creating",
            SnapshotState::Ready => "ready",
            SnapshotState::Deleting => "deleting",
        })
    }
}

/// A disk-outage-consistent snapshot of a volume (PolarFS section 7.2): the volume's
/// contents as of one point in its write order, kept by each of its chunks (the chunk
/// servers keep it; the control state only names it and tracks its lifecycle).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// Its id: unique across the whole state (not only its volume) and never reused, at
    /// least 1 and below [`Meta::next_snapshot`]. 0 means "no snapshot" in write tags.
    pub id: u64,
    /// Its name: the rules of [`Volume::name`] (1..=[`MAX_NAME_BYTES`] bytes of
    /// `[A-Za-z0-9._-]`); unique among its volume's snapshots.
    pub name: String,
    /// Its lifecycle state.
    pub state: SnapshotState,
}

/// A volume: a named, sized sequence of chunks (section 3.2), one per database instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Volume {
    /// Its name: 1..=[`MAX_NAME_BYTES`] bytes of `[A-Za-z0-9._-]`; unique.
    pub name: String,
    /// Its size; positive. It only grows (section 3.2: "expanded on demand by appending
    /// chunks").
    pub size_bytes: u64,
    /// Bytes per chunk; a positive multiple of `block_bytes`, fixed at creation.
    pub chunk_bytes: u64,
    /// The chunk servers' allocation unit for its chunks: a power of two from
    /// [`MIN_BLOCK_BYTES`] to [`MAX_BLOCK_BYTES`], fixed at creation.
    pub block_bytes: u32,
    /// Its chunks in volume order: chunk `i` holds bytes `i * chunk_bytes ..`.
    /// Invariant: `chunks.len() == ceil(size_bytes / chunk_bytes)`.
    pub chunks: Vec<Chunk>,
    /// The chunk map's version: 1 at creation, +1 with every change to the chunk map
    /// (replicas, their order, a move), the size, the start of its deletion, or the
    /// snapshot being taken ([`Command::CreateSnapshot`], [`Command::SnapshotReady`]:
    /// the write tag, PolarFS section 7.2), so that routing clients can tag their cached
    /// copy with it and tell when it is stale (section 3.2.3, duty 4). Deleting a
    /// snapshot ([`Command::DeleteSnapshot`], [`Command::SnapshotGone`]) changes nothing
    /// a routing client uses and leaves it.
    pub version: u64,
    /// Its lifecycle state.
    pub state: VolumeState,
    /// Its snapshots (PolarFS section 7.2), ascending by id. Invariants: ids unique across
    /// the whole state and below [`Meta::next_snapshot`]; names unique within the volume;
    /// at most one [`SnapshotState::Creating`] (one snapshot is taken at a time); none
    /// while the volume is [`VolumeState::Creating`] (a snapshot needs a ready volume). A
    /// deleting volume keeps its snapshots, in whatever state, until
    /// [`Command::VolumeGone`]: they live in its chunks and go with them.
    pub snapshots: Vec<Snapshot>,
    /// For a clone being copied ([`Command::CloneVolume`]): the source volume's name and
    /// the id of the snapshot its contents are copied from. Invariant: `Some` only while
    /// the volume is [`VolumeState::Creating`], and then the source volume exists, is
    /// another volume, is [`VolumeState::Ready`], has the same `chunk_bytes` and
    /// `block_bytes` and at least this volume's size, and holds that snapshot in
    /// [`SnapshotState::Ready`] (neither may be deleted while the copy runs).
    /// [`Command::VolumeReady`] and [`Command::DeleteVolume`] clear it; `None` for
    /// ordinary volumes.
    pub source: Option<(String, u64)>,
}

impl Volume {
    /// Its snapshot with this id.
    pub fn snapshot(&self, id: u64) -> Option<&Snapshot> {
        self.snapshots.iter().find(|s| s.id == id)
    }

    /// Its snapshot with this name.
    pub fn snapshot_named(&self, name: &str) -> Option<&Snapshot> {
        self.snapshots.iter().find(|s| s.name == name)
    }

    /// Its snapshot being taken, if any.
    pub(crate) fn creating_snapshot(&self) -> Option<&Snapshot> {
        self.snapshots
            .iter()
            .find(|s| s.state == SnapshotState::Creating)
    }
}

/// A change to the control plane's state: one entry of the control log.
///
/// Byte format ([`Command::encode`], [`Command::decode`]), all integers little-endian:
///
/// ```text
/// offset  size  field
///      0     4  magic "CCMD"
///      4     1  version (1)
///      5     1  kind: 1 RegisterNode, 2 SetNodeState, 3 CreateVolume, 4 VolumeReady,
///               5 GrowVolume, 6 DeleteVolume, 7 VolumeGone, 8 StartMove,
///               9 FinishMove, 10 AbortMove, 11 SetPreferredLeader,
///               12 CreateSnapshot, 13 SnapshotReady, 14 DeleteSnapshot,
///               15 SnapshotGone, 16 CloneVolume
///      6     …  body, by kind:
///               1  u64 id | str repl_addr | str client_addr | str rack
///               2  u64 id | u8 state (0 Up, 1 Draining, 2 Removed)
///               3  str name | u64 size_bytes | u64 chunk_bytes | u32 block_bytes
///                  | u32 count | count × chunk
///               4, 6, 7  str name
///               5  str name | u64 size_bytes | u32 count | count × chunk
///               8, 9  u64 group | u64 from | u64 to
///               10  u64 group
///               11  u64 group | u64 node
///               12  str volume | str name
///               13, 14, 15  str volume | u64 id
///               16  str name | str source | u64 snapshot | u32 count | count × chunk
///      …     4  CRC32C of every byte before it
///
/// str   = u16 len | len bytes of UTF-8
/// chunk = u64 group | u8 n | n × u64 replica | u8 moving (0 or 1)
///         [| u64 from | u64 to, if moving is 1]
/// ```
///
/// Kinds 12–16 (snapshots and clones, PolarFS section 7.2) were added without changing
/// the version, since no earlier kind changed: every log written before them still
/// decodes. A build without them refuses them as unknown kinds, so every node of a
/// control group must run a build that knows them before any is proposed (otherwise
/// old and new nodes would disagree on the state).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Registers a chunk server as [`NodeState::Up`]; for an already registered node
    /// (a restarted server, whose addresses may have changed) updates its addresses and
    /// rack and keeps its state. Refused for id 0 and for a removed node.
    RegisterNode {
        /// Its id.
        id: NodeId,
        /// See [`Node::repl_addr`].
        repl_addr: String,
        /// See [`Node::client_addr`].
        client_addr: String,
        /// See [`Node::rack`].
        rack: String,
    },
    /// Changes a registered node's state; a removed node's state never changes again.
    SetNodeState {
        /// The node.
        id: NodeId,
        /// Its new state.
        state: NodeState,
    },
    /// Creates a volume in [`VolumeState::Creating`] at version 1, with its chunks
    /// already placed (by [`crate::place::place_chunks`]) and their groups numbered from
    /// [`Meta::next_group`] up.
    CreateVolume {
        /// See [`Volume::name`].
        name: String,
        /// See [`Volume::size_bytes`].
        size_bytes: u64,
        /// See [`Volume::chunk_bytes`].
        chunk_bytes: u64,
        /// See [`Volume::block_bytes`].
        block_bytes: u32,
        /// All `ceil(size_bytes / chunk_bytes)` chunks, none moving.
        chunks: Vec<Chunk>,
    },
    /// A creating volume's groups all exist (and, for a clone, its contents are copied
    /// from the source snapshot): it becomes [`VolumeState::Ready`], and its
    /// [`Volume::source`] is cleared.
    VolumeReady {
        /// The volume.
        name: String,
    },
    /// Grows a ready volume, appending the chunks the new size needs (section 3.2).
    GrowVolume {
        /// The volume.
        name: String,
        /// The new size; larger than the current one.
        size_bytes: u64,
        /// The chunks appended: `ceil(size_bytes / chunk_bytes)` minus the current count
        /// (possibly none, if the last chunk had room), none moving.
        chunks: Vec<Chunk>,
    },
    /// Starts deleting a creating or ready volume; a clone's [`Volume::source`] is
    /// cleared (its copy stops). Its snapshots stay listed, in whatever state, and go
    /// with it at [`Command::VolumeGone`] (they live in its chunks); one being taken is
    /// abandoned (the control leader stops driving it). Refused with
    /// [`MetaError::SnapshotInUse`] while a creating clone is copied from one of its
    /// snapshots (PolarFS section 7.2): delete the clone, or let it become ready, first.
    DeleteVolume {
        /// The volume.
        name: String,
    },
    /// A deleting volume's groups are all destroyed: it leaves the state. Its group ids
    /// are not reused (a slow chunk server may still hold a replica of one).
    VolumeGone {
        /// The volume.
        name: String,
    },
    /// Starts re-replicating one replica of a chunk (see [`Move`]).
    StartMove {
        /// The chunk's group.
        group: GroupId,
        /// The replica to replace.
        from: NodeId,
        /// Where the new replica goes: registered, up, not already a replica.
        to: NodeId,
    },
    /// The move's new replica caught up and was promoted: `to` takes `from`'s place (same
    /// position, so a moved preferred leader's replacement is preferred leader).
    FinishMove {
        /// The chunk's group.
        group: GroupId,
        /// Must match the move in progress.
        from: NodeId,
        /// Must match the move in progress.
        to: NodeId,
    },
    /// Gives up the move in progress; the replicas stay as they were.
    AbortMove {
        /// The chunk's group.
        group: GroupId,
    },
    /// Makes one of a chunk's replicas its preferred leader (position 0; the others keep
    /// their order), for leader balancing.
    SetPreferredLeader {
        /// The chunk's group.
        group: GroupId,
        /// One of its replicas.
        node: NodeId,
    },
    /// Starts a snapshot of a ready volume (PolarFS section 7.2): it gets id
    /// [`Meta::next_snapshot`] (which steps) in [`SnapshotState::Creating`], and the
    /// volume's version steps, so that routing clients learn to tag their writes with
    /// the id ([`Meta::snapshot_tag`]); the control leader then has every chunk of the
    /// volume take it (each chunk's group logs a barrier) and appends
    /// [`Command::SnapshotReady`]. Refused if the volume does not exist or is not ready,
    /// the name breaks [`Snapshot::name`]'s rules or is taken in the volume, or another
    /// snapshot of the volume is being taken (one at a time per volume).
    CreateSnapshot {
        /// The volume.
        volume: String,
        /// See [`Snapshot::name`].
        name: String,
    },
    /// Every chunk of the volume holds the snapshot: it becomes [`SnapshotState::Ready`]
    /// and the volume's version steps (clients stop tagging writes with its id).
    /// Refused unless the volume is ready and the snapshot is creating.
    SnapshotReady {
        /// The volume.
        volume: String,
        /// The snapshot's id.
        id: u64,
    },
    /// Starts dropping a ready snapshot of a ready volume: it becomes
    /// [`SnapshotState::Deleting`] (the version stays). Refused while a creating clone is
    /// copied from it ([`MetaError::SnapshotInUse`]).
    DeleteSnapshot {
        /// The volume.
        volume: String,
        /// The snapshot's id.
        id: u64,
    },
    /// Every chunk dropped the deleting snapshot: it leaves the volume (its id is not
    /// reused; the version stays). Accepted in a deleting volume too: it concludes a
    /// deletion begun legitimately.
    SnapshotGone {
        /// The volume.
        volume: String,
        /// The snapshot's id.
        id: u64,
    },
    /// Creates volume `name` as a clone of a ready snapshot of a ready volume (PolarFS
    /// section 7.2): in [`VolumeState::Creating`] at version 1, with
    /// [`Volume::source`] `Some((source, snapshot))` and the source's `chunk_bytes`,
    /// `block_bytes` and *current* `size_bytes` (the source may have grown since the
    /// snapshot), its own chunks placed like [`Command::CreateVolume`]'s (groups from
    /// [`Meta::next_group`] up, checked alike). The control leader creates its groups
    /// and copies into each chunk what the source's chunk of the same index holds in the
    /// snapshot; chunks the source gained after the snapshot hold no copy of it, so the
    /// clone's chunks there stay zeros. Then [`Command::VolumeReady`] makes it ready.
    /// Refused if the name is bad or taken, the source does not exist or is not ready,
    /// or the snapshot is not the source's or not ready.
    CloneVolume {
        /// The clone's name; see [`Volume::name`].
        name: String,
        /// The source volume.
        source: String,
        /// The id of the source's snapshot to copy.
        snapshot: u64,
        /// All `ceil(size_bytes / chunk_bytes)` chunks of the source's current geometry,
        /// none moving.
        chunks: Vec<Chunk>,
    },
}

/// Why a command was refused, or the state found inconsistent.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MetaError {
    /// The log position was already applied (a replay of an applied prefix).
    #[error("log position {pos} is not after the last applied position {applied}")]
    Replayed {
        /// The position given.
        pos: u64,
        /// The last position applied.
        applied: u64,
    },
    /// No volume has this name.
    #[error("volume `{name}` does not exist")]
    NoSuchVolume {
        /// The name.
        name: String,
    },
    /// A volume with this name exists (in any state).
    #[error("volume `{name}` already exists")]
    VolumeExists {
        /// The name.
        name: String,
    },
    /// The name breaks [`Volume::name`]'s rules.
    #[error("volume name `{name}` is invalid: {why}")]
    BadName {
        /// The name.
        name: String,
        /// Which rule.
        why: &'static str,
    },
    /// Sizes break [`Volume`]'s rules.
    #[error("bad volume geometry: {detail}")]
    BadGeometry {
        /// Which rule, with the values.
        detail: String,
    },
    /// A new size is not larger than the current one.
    #[error("volume `{name}` is {size_bytes} bytes; growing it to {requested_bytes} bytes is not growth")]
    NotLarger {
        /// The volume.
        name: String,
        /// Its current size.
        size_bytes: u64,
        /// The size asked for.
        requested_bytes: u64,
    },
    /// A node registration breaks [`Node`]'s rules.
    #[error("node {id}: {detail}")]
    BadNode {
        /// The node.
        id: NodeId,
        /// Which rule.
        detail: String,
    },
    /// No node has this id.
    #[error("node {id} is not registered")]
    NoSuchNode {
        /// The id.
        id: NodeId,
    },
    /// The node was removed for good.
    #[error("node {id} is removed")]
    NodeRemoved {
        /// The id.
        id: NodeId,
    },
    /// The node is registered but not up.
    #[error("node {id} is {state}, not up")]
    NodeNotUp {
        /// The id.
        id: NodeId,
        /// Its state.
        state: NodeState,
    },
    /// No chunk has this group.
    #[error("chunk group {group} does not exist")]
    NoSuchChunk {
        /// The group.
        group: GroupId,
    },
    /// New chunks break [`Chunk`]'s rules.
    #[error("bad chunks: {detail}")]
    BadChunks {
        /// Which rule, naming the chunk.
        detail: String,
    },
    /// The volume is in the wrong state for the command.
    #[error("volume `{name}` is {state}, not {wanted}")]
    WrongState {
        /// The volume.
        name: String,
        /// Its state.
        state: VolumeState,
        /// The state(s) the command needs.
        wanted: &'static str,
    },
    /// The chunk already has a move in progress.
    #[error("chunk group {group} is already moving")]
    Moving {
        /// The group.
        group: GroupId,
    },
    /// The chunk has no move in progress.
    #[error("chunk group {group} is not moving")]
    NotMoving {
        /// The group.
        group: GroupId,
    },
    /// The chunk's move in progress is another one.
    #[error("chunk group {group} is moving {} -> {}, not {from} -> {to}", moving.from, moving.to)]
    MoveMismatch {
        /// The group.
        group: GroupId,
        /// The `from` given.
        from: NodeId,
        /// The `to` given.
        to: NodeId,
        /// The move in progress.
        moving: Move,
    },
    /// The node holds no replica of the chunk.
    #[error("node {node} is not a replica of chunk group {group}")]
    NotAReplica {
        /// The group.
        group: GroupId,
        /// The node.
        node: NodeId,
    },
    /// The node already holds a replica of the chunk.
    #[error("node {node} is already a replica of chunk group {group}")]
    AlreadyReplica {
        /// The group.
        group: GroupId,
        /// The node.
        node: NodeId,
    },
    /// The name breaks [`Snapshot::name`]'s rules.
    #[error("snapshot name `{name}` is invalid: {why}")]
    BadSnapshotName {
        /// The name.
        name: String,
        /// Which rule.
        why: &'static str,
    },
    /// The volume already has a snapshot of this name (in any state).
    #[error("volume `{volume}` already has a snapshot named `{name}`")]
    SnapshotExists {
        /// The volume.
        volume: String,
        /// The name.
        name: String,
    },
    /// The volume has no snapshot of this id.
    #[error("volume `{volume}` has no snapshot {id}")]
    NoSuchSnapshot {
        /// The volume.
        volume: String,
        /// The id.
        id: u64,
    },
    /// A snapshot of the volume is already being taken (one at a time per volume).
    #[error("volume `{volume}` is already taking snapshot {id}")]
    SnapshotInProgress {
        /// The volume.
        volume: String,
        /// The snapshot being taken.
        id: u64,
    },
    /// The snapshot is in the wrong state for the command.
    #[error("snapshot {id} of volume `{volume}` is {state}, not {wanted}")]
    SnapshotWrongState {
        /// The volume.
        volume: String,
        /// The snapshot.
        id: u64,
        /// Its state.
        state: SnapshotState,
        /// The state the command needs.
        wanted: &'static str,
    },
    /// A creating clone is being copied from the snapshot, so neither it nor its volume
    /// may be deleted yet.
    #[error("snapshot {id} of volume `{volume}` is being copied into clone `{clone}`")]
    SnapshotInUse {
        /// The volume.
        volume: String,
        /// The snapshot.
        id: u64,
        /// The clone copied from it.
        clone: String,
    },
    /// Every snapshot id has been handed out (only a forged image can get here: it takes
    /// 2^64 - 2 snapshots).
    #[error("snapshot ids are exhausted")]
    SnapshotIdsExhausted,
    /// A state (decoded from an image) breaks an invariant ([`Meta::verify`]).
    #[error("inconsistent control state: {detail}")]
    Inconsistent {
        /// Which invariant.
        detail: String,
    },
}

/// The control plane's state: the result of applying the control log up to
/// [`Meta::applied`]. Its byte image (for trimming the log and seeding a new control
/// node) is laid out byte by byte on [`Meta::encode_image`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Meta {
    /// Every node ever registered, removed ones included (so that a removed id is never
    /// reused by mistake).
    pub(crate) nodes: BTreeMap<NodeId, Node>,
    /// Every volume not yet gone, by name.
    pub(crate) volumes: BTreeMap<String, Volume>,
    /// The next group id to hand out: above every group ever used, at least
    /// [`FIRST_GROUP`].
    pub(crate) next_group: GroupId,
    /// The next snapshot id to hand out: above every snapshot id ever used, at least 1
    /// (0 means "no snapshot" in write tags). Never goes back, so ids are never reused
    /// (PolarFS section 7.2).
    pub(crate) next_snapshot: u64,
    /// The log position of the last command applied (accepted or rejected); 0 before any.
    pub(crate) applied: u64,
    /// Derived index, rebuilt from `volumes`: each chunk's group to its volume and index.
    pub(crate) groups: BTreeMap<GroupId, (String, usize)>,
}

impl Default for Meta {
    fn default() -> Self {
        Self::new()
    }
}

impl Meta {
    /// The empty state, before the first log entry.
    pub fn new() -> Self {
        Self {
            nodes: BTreeMap::new(),
            volumes: BTreeMap::new(),
            next_group: FIRST_GROUP,
            next_snapshot: FIRST_SNAPSHOT,
            applied: 0,
            groups: BTreeMap::new(),
        }
    }

    /// The log position of the last command applied; 0 before any.
    pub fn applied(&self) -> u64 {
        self.applied
    }

    /// Every registered node (removed ones included), by id.
    pub fn nodes(&self) -> &BTreeMap<NodeId, Node> {
        &self.nodes
    }

    /// A registered node.
    pub fn node(&self, id: NodeId) -> Option<&Node> {
        self.nodes.get(&id)
    }

    /// Every volume, by name.
    pub fn volumes(&self) -> &BTreeMap<String, Volume> {
        &self.volumes
    }

    /// A volume.
    pub fn volume(&self, name: &str) -> Option<&Volume> {
        self.volumes.get(name)
    }

    /// The lowest group id a new chunk may use.
    pub fn next_group(&self) -> GroupId {
        self.next_group
    }

    /// The id the next snapshot will get ([`Command::CreateSnapshot`]); 1 at first.
    pub fn next_snapshot(&self) -> u64 {
        self.next_snapshot
    }

    /// The id routing clients tag their writes to `volume` with: that of its snapshot
    /// being taken ([`SnapshotState::Creating`]), or 0 if none is (or there is no such
    /// volume). PolarFS section 7.2: a write tagged with the id reached the client after
    /// the snapshot began, so a chunk that has not yet logged the snapshot's barrier
    /// takes the snapshot before applying the write.
    pub fn snapshot_tag(&self, volume: &str) -> u64 {
        self.volumes
            .get(volume)
            .and_then(Volume::creating_snapshot)
            .map_or(0, |s| s.id)
    }

    /// The first creating clone (in name order) copied from snapshot `id` of `volume`,
    /// if any; with `id` `None`, from any snapshot of `volume`.
    pub(crate) fn clone_copying(&self, volume: &str, id: Option<u64>) -> Option<(&Volume, u64)> {
        self.volumes.values().find_map(|v| match &v.source {
            Some((src, sid)) if src == volume && id.is_none_or(|i| i == *sid) => Some((v, *sid)),
            _ => None,
        })
    }

    /// The chunk of a group: its volume, its index in the volume, and the chunk.
    pub fn chunk(&self, group: GroupId) -> Option<(&Volume, usize, &Chunk)> {
        let (name, index) = self.groups.get(&group)?;
        let volume = self.volumes.get(name)?;
        let chunk = volume.chunks.get(*index)?;
        Some((volume, *index, chunk))
    }

    /// Every chunk with its volume, in volume-name then chunk order.
    pub fn chunks(&self) -> impl Iterator<Item = (&Volume, &Chunk)> {
        self.volumes
            .values()
            .flat_map(|v| v.chunks.iter().map(move |c| (v, c)))
    }

    /// Replicas on `node`, counting a move's destination (it is receiving a full copy),
    /// in volumes of every state (a deleting volume's replicas use space until gone).
    pub fn load(&self, node: NodeId) -> usize {
        self.chunks().filter(|(_, c)| holds(c, node)).count()
    }

    /// Chunks whose preferred leader is `node`, in volumes of every state.
    pub fn leader_load(&self, node: NodeId) -> usize {
        self.chunks()
            .filter(|(_, c)| c.replicas.first() == Some(&node))
            .count()
    }

    /// [`Meta::load`] of every registered node (0 for a node with none) in one pass.
    pub fn loads(&self) -> BTreeMap<NodeId, usize> {
        let mut out: BTreeMap<NodeId, usize> = self.nodes.keys().map(|&n| (n, 0)).collect();
        for (_, c) in self.chunks() {
            for &r in c.replicas.iter().chain(c.moving.as_ref().map(|m| &m.to)) {
                *out.entry(r).or_insert(0) += 1;
            }
        }
        out
    }

    /// [`Meta::leader_load`] of every registered node (0 for a node with none) in one pass.
    pub fn leader_loads(&self) -> BTreeMap<NodeId, usize> {
        let mut out: BTreeMap<NodeId, usize> = self.nodes.keys().map(|&n| (n, 0)).collect();
        for (_, c) in self.chunks() {
            if let Some(&r) = c.replicas.first() {
                *out.entry(r).or_insert(0) += 1;
            }
        }
        out
    }

    /// Checks every invariant stated on the fields of [`Meta`], [`Node`], [`Volume`],
    /// [`Chunk`], [`Move`] and [`Snapshot`] (snapshots and clones: PolarFS section 7.2). [`Meta::apply`] keeps them; this is for a state from
    /// elsewhere ([`Meta::decode_image`]) and for tests.
    pub fn verify(&self) -> Result<(), MetaError> {
        let bad = |detail: String| Err(MetaError::Inconsistent { detail });
        if self.next_group < FIRST_GROUP {
            return bad(format!(
                "next_group {} is below {FIRST_GROUP}",
                self.next_group
            ));
        }
        for (&id, n) in &self.nodes {
            if id != n.id {
                return bad(format!("node {} is filed under id {id}", n.id));
            }
            if let Err(e) = check_node_fields(id, &n.repl_addr, &n.client_addr, &n.rack) {
                return bad(e.to_string());
            }
        }
        if self.next_snapshot < FIRST_SNAPSHOT {
            return bad(format!(
                "next_snapshot {} is below {FIRST_SNAPSHOT}",
                self.next_snapshot
            ));
        }
        let mut seen = BTreeSet::new();
        let mut snapshot_ids = BTreeSet::new();
        for (key, v) in &self.volumes {
            if *key != v.name {
                return bad(format!("volume `{}` is filed under `{key}`", v.name));
            }
            if let Err(e) = check_name(&v.name)
                .and_then(|()| check_geometry(v.size_bytes, v.chunk_bytes, v.block_bytes))
            {
                return bad(e.to_string());
            }
            if v.chunks.len() as u64 != v.size_bytes.div_ceil(v.chunk_bytes) {
                return bad(format!(
                    "volume `{}` has {} chunks for {} bytes in chunks of {}",
                    v.name,
                    v.chunks.len(),
                    v.size_bytes,
                    v.chunk_bytes
                ));
            }
            if v.version == 0 {
                return bad(format!("volume `{}` has version 0", v.name));
            }
            for c in &v.chunks {
                if c.group < FIRST_GROUP || c.group >= self.next_group {
                    return bad(format!(
                        "chunk group {} is outside {FIRST_GROUP}..{}",
                        c.group, self.next_group
                    ));
                }
                if !seen.insert(c.group) {
                    return bad(format!("chunk group {} appears twice", c.group));
                }
                if let Err(e) = self.check_replicas(c) {
                    return bad(e.to_string());
                }
                if let Some(m) = c.moving {
                    if !c.replicas.contains(&m.from) || c.replicas.contains(&m.to) {
                        return bad(format!(
                            "chunk group {} moves {} -> {} against replicas {:?}",
                            c.group, m.from, m.to, c.replicas
                        ));
                    }
                    if !self.nodes.contains_key(&m.to) {
                        return bad(format!(
                            "chunk group {} moves to unregistered node {}",
                            c.group, m.to
                        ));
                    }
                }
            }
            self.verify_snapshots(v, &mut snapshot_ids)?;
        }
        Ok(())
    }

    /// Checks [`Volume::snapshots`]' and [`Volume::source`]'s invariants for one volume
    /// (PolarFS section 7.2); `ids` collects the snapshot ids seen in earlier volumes.
    fn verify_snapshots(&self, v: &Volume, ids: &mut BTreeSet<u64>) -> Result<(), MetaError> {
        let bad = |detail: String| Err(MetaError::Inconsistent { detail });
        if v.state == VolumeState::Creating && !v.snapshots.is_empty() {
            return bad(format!("creating volume `{}` has snapshots", v.name));
        }
        let mut names = BTreeSet::new();
        let mut creating = None;
        let mut last = 0;
        for snap in &v.snapshots {
            if snap.id < FIRST_SNAPSHOT || snap.id >= self.next_snapshot {
                return bad(format!(
                    "snapshot {} of volume `{}` is outside {FIRST_SNAPSHOT}..{}",
                    snap.id, v.name, self.next_snapshot
                ));
            }
            if snap.id <= last {
                return bad(format!(
                    "snapshot {} of volume `{}` is out of order",
                    snap.id, v.name
                ));
            }
            last = snap.id;
            if !ids.insert(snap.id) {
                return bad(format!("snapshot id {} appears twice", snap.id));
            }
            if let Err(e) = check_snapshot_name(&snap.name) {
                return bad(format!("volume `{}`: {e}", v.name));
            }
            if !names.insert(snap.name.as_str()) {
                return bad(format!(
                    "volume `{}` has two snapshots named `{}`",
                    v.name, snap.name
                ));
            }
            if snap.state == SnapshotState::Creating {
                if let Some(other) = creating.replace(snap.id) {
                    return bad(format!(
                        "volume `{}` is taking snapshots {other} and {} at once",
                        v.name, snap.id
                    ));
                }
            }
        }
        let Some((src, id)) = &v.source else {
            return Ok(());
        };
        let from = format!("clone `{}` of snapshot {id} of `{src}`", v.name);
        if v.state != VolumeState::Creating {
            return bad(format!("{from} is {}, not creating", v.state));
        }
        let Some(s) = self.volumes.get(src).filter(|s| s.name != v.name) else {
            return bad(format!("{from}: no such source volume"));
        };
        if s.state != VolumeState::Ready {
            return bad(format!("{from}: the source is {}, not ready", s.state));
        }
        if (s.chunk_bytes, s.block_bytes) != (v.chunk_bytes, v.block_bytes)
            || s.size_bytes < v.size_bytes
        {
            return bad(format!(
                "{from}: its geometry ({} bytes in chunks of {}, blocks of {}) does not fit the \
                 source's ({} bytes in chunks of {}, blocks of {})",
                v.size_bytes,
                v.chunk_bytes,
                v.block_bytes,
                s.size_bytes,
                s.chunk_bytes,
                s.block_bytes
            ));
        }
        match s.snapshot(*id) {
            None => bad(format!("{from}: no such snapshot")),
            Some(snap) if snap.state != SnapshotState::Ready => {
                bad(format!("{from}: the snapshot is {}, not ready", snap.state))
            }
            Some(_) => Ok(()),
        }
    }

    /// Checks a chunk's replica list: 1..=[`MAX_REPLICAS`] distinct registered nodes.
    /// (Whether they may be removed is up to the caller: a new chunk may not use one, an
    /// existing chunk may still list one until it is moved off.)
    pub(crate) fn check_replicas(&self, c: &Chunk) -> Result<(), MetaError> {
        let bad = |detail: String| Err(MetaError::BadChunks { detail });
        if c.replicas.is_empty() || c.replicas.len() > MAX_REPLICAS {
            return bad(format!(
                "chunk group {} has {} replicas, not 1..={MAX_REPLICAS}",
                c.group,
                c.replicas.len()
            ));
        }
        let mut seen = BTreeSet::new();
        for &r in &c.replicas {
            if !seen.insert(r) {
                return bad(format!("chunk group {} lists node {r} twice", c.group));
            }
            if !self.nodes.contains_key(&r) {
                return Err(MetaError::NoSuchNode { id: r });
            }
        }
        Ok(())
    }

    /// Rebuilds the derived group index from the volumes.
    pub(crate) fn reindex(&mut self) {
        self.groups = self
            .volumes
            .values()
            .flat_map(|v| {
                v.chunks
                    .iter()
                    .enumerate()
                    .map(move |(i, c)| (c.group, (v.name.clone(), i)))
            })
            .collect();
    }
}

/// Whether `node` holds or is receiving a replica of `c`.
pub(crate) fn holds(c: &Chunk, node: NodeId) -> bool {
    c.replicas.contains(&node) || c.moving.is_some_and(|m| m.to == node)
}

/// Checks [`Volume::name`]'s rules.
pub(crate) fn check_name(name: &str) -> Result<(), MetaError> {
    name_rule(name).map_err(|why| MetaError::BadName {
        name: name.to_string(),
        why,
    })
}

/// Checks [`Snapshot::name`]'s rules (those of [`Volume::name`]).
pub(crate) fn check_snapshot_name(name: &str) -> Result<(), MetaError> {
    name_rule(name).map_err(|why| MetaError::BadSnapshotName {
        name: name.to_string(),
        why,
    })
}

/// The name rules of volumes and snapshots: which one `name` breaks, if any.
fn name_rule(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("it is empty");
    }
    if name.len() > MAX_NAME_BYTES {
        return Err("it is longer than 64 bytes");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err("only A-Z, a-z, 0-9, '.', '_' and '-' are allowed");
    }
    Ok(())
}

/// Checks [`Volume`]'s size rules. The block rules are the chunk servers' own
/// (`chorus_chunk::Geometry::check`), so that no volume is created whose chunks the
/// servers would refuse.
pub(crate) fn check_geometry(
    size_bytes: u64,
    chunk_bytes: u64,
    block_bytes: u32,
) -> Result<(), MetaError> {
    let bad = |detail: String| Err(MetaError::BadGeometry { detail });
    if size_bytes == 0 {
        return bad("size_bytes is 0".into());
    }
    if !block_bytes.is_power_of_two() || !(MIN_BLOCK_BYTES..=MAX_BLOCK_BYTES).contains(&block_bytes)
    {
        return bad(format!(
            "block_bytes {block_bytes} is not a power of two from {MIN_BLOCK_BYTES} to {MAX_BLOCK_BYTES}"
        ));
    }
    let bb = u64::from(block_bytes);
    if chunk_bytes == 0 || !chunk_bytes.is_multiple_of(bb) {
        return bad(format!(
            "chunk_bytes {chunk_bytes} is not a positive multiple of block_bytes {block_bytes}"
        ));
    }
    if chunk_bytes / bb >= u64::from(u32::MAX) {
        return bad(format!(
            "chunk_bytes {chunk_bytes} holds {} blocks, more than a chunk server's 2^32 - 1",
            chunk_bytes / bb
        ));
    }
    Ok(())
}

/// Checks [`Node`]'s field rules.
pub(crate) fn check_node_fields(
    id: NodeId,
    repl_addr: &str,
    client_addr: &str,
    rack: &str,
) -> Result<(), MetaError> {
    let bad = |detail: String| Err(MetaError::BadNode { id, detail });
    if id == 0 {
        return bad("id 0 is reserved".into());
    }
    for (field, addr) in [("repl_addr", repl_addr), ("client_addr", client_addr)] {
        if addr.is_empty() || addr.len() > MAX_ADDR_BYTES {
            return bad(format!(
                "{field} is {} bytes, not 1..={MAX_ADDR_BYTES}",
                addr.len()
            ));
        }
    }
    if rack.len() > MAX_RACK_BYTES {
        return bad(format!(
            "rack is {} bytes, more than {MAX_RACK_BYTES}",
            rack.len()
        ));
    }
    Ok(())
}
