//! The control plane's state: nodes, volumes and where each chunk's replicas live
//! (PolarFS section 3.2.3, PolarCtrl duties 1–3), and the commands that change it.
//!
//! PolarCtrl keeps this in a MySQL instance; Chorus keeps it as [`Command`]s appended to
//! an ordered, replicated log, and every control node replays that log through
//! [`Meta::apply`] to reach the same [`Meta`]. Applying is therefore deterministic: it
//! reads nothing but the state and the command (no clock, no randomness, only ordered
//! maps), and a command it rejects changes nothing but [`Meta::applied`].
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

/// Longest volume name, in bytes.
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
    /// (replicas, their order, a move) or the size, so that routing clients can tag
    /// their cached copy with it and tell when it is stale (section 3.2.3, duty 4).
    pub version: u64,
    /// Its lifecycle state.
    pub state: VolumeState,
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
///               9 FinishMove, 10 AbortMove, 11 SetPreferredLeader
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
///      …     4  CRC32C of every byte before it
///
/// str   = u16 len | len bytes of UTF-8
/// chunk = u64 group | u8 n | n × u64 replica | u8 moving (0 or 1)
///         [| u64 from | u64 to, if moving is 1]
/// ```
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
    /// A creating volume's groups all exist: it becomes [`VolumeState::Ready`].
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
    /// Starts deleting a creating or ready volume.
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
    /// [`Chunk`] and [`Move`]. [`Meta::apply`] keeps them; this is for a state from
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
        let mut seen = BTreeSet::new();
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
        }
        Ok(())
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
    let bad = |why| {
        Err(MetaError::BadName {
            name: name.to_string(),
            why,
        })
    };
    if name.is_empty() {
        return bad("it is empty");
    }
    if name.len() > MAX_NAME_BYTES {
        return bad("it is longer than 64 bytes");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return bad("only A-Z, a-z, 0-9, '.', '_' and '-' are allowed");
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
