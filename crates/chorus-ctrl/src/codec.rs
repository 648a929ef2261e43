//! Byte formats: a [`Command`] (one control log entry; layout on [`Command`]) and the
//! whole [`Meta`] image (layout on [`Meta::encode_image`]).
//!
//! Decoders are total: any input gives a [`Command`]/[`Meta`] or a typed [`DecodeError`]
//! naming the field, never a panic, and a count read from the input is checked against
//! the bytes left before anything is allocated for it, so a forged count cannot make a
//! huge allocation.

use crate::meta::{
    Chunk, Command, Meta, MetaError, Move, Node, NodeState, Snapshot, SnapshotState, Volume,
    VolumeState, FIRST_SNAPSHOT,
};

/// A command's magic.
pub const COMMAND_MAGIC: [u8; 4] = *b"CCMD";
/// The command format version this code writes and reads.
pub const COMMAND_VERSION: u8 = 1;
/// An image's magic.
pub const IMAGE_MAGIC: [u8; 4] = *b"CMET";
/// The image format version this code writes. Version 2 added snapshots and clones
/// (PolarFS section 7.2); this code still reads version 1 (see [`Meta::decode_image`]).
pub const IMAGE_VERSION: u8 = 2;
/// The image format version before snapshots, still read.
pub const IMAGE_VERSION_V1: u8 = 1;

/// Bytes in a command or image before its body: magic and version (and, for a command,
/// the kind).
const COMMAND_HEADER: usize = 6;
const IMAGE_HEADER: usize = 5;
/// The trailing CRC32C.
const CRC_BYTES: usize = 4;

/// The fewest bytes an encoded chunk takes: group, replica count, moving flag.
const MIN_ENCODED_CHUNK_BYTES: usize = 8 + 1 + 1;
/// The fewest bytes an encoded node takes: id, three empty strings, state.
const MIN_ENCODED_NODE_BYTES: usize = 8 + 3 * 2 + 1;
/// The fewest bytes an encoded volume takes in an image of version 1: empty name, sizes,
/// version, state, chunk count.
const MIN_ENCODED_VOLUME_BYTES_V1: usize = 2 + 8 + 8 + 4 + 8 + 1 + 4;
/// The same in version 2: also the source flag and the snapshot count.
const MIN_ENCODED_VOLUME_BYTES: usize = MIN_ENCODED_VOLUME_BYTES_V1 + 1 + 4;
/// The fewest bytes an encoded snapshot takes: id, empty name, state.
const MIN_ENCODED_SNAPSHOT_BYTES: usize = 8 + 2 + 1;

/// Why bytes are not a valid command or image. `what` is "command" or "image".
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Shorter than the smallest possible encoding.
    #[error("{what}: {have} bytes, shorter than the {need}-byte minimum")]
    TooShort {
        /// Command or image.
        what: &'static str,
        /// Bytes given.
        have: usize,
        /// The minimum.
        need: usize,
    },
    /// The first four bytes are not the magic.
    #[error("{what}: magic {found:02x?} is not {want:?}")]
    BadMagic {
        /// Command or image.
        what: &'static str,
        /// The bytes found.
        found: [u8; 4],
        /// The magic expected.
        want: &'static str,
    },
    /// A format version this code does not read.
    #[error("{what}: format version {found}; this build reads {want}")]
    BadVersion {
        /// Command or image.
        what: &'static str,
        /// The version found.
        found: u8,
        /// The version this code writes (for images, it reads versions 1 to this).
        want: u8,
    },
    /// The bytes were damaged.
    #[error("{what}: checksum {computed:#010x} does not match the stored {stored:#010x}")]
    BadChecksum {
        /// Command or image.
        what: &'static str,
        /// The checksum stored.
        stored: u32,
        /// The checksum of the bytes.
        computed: u32,
    },
    /// A field runs past the end.
    #[error("{what}: field `{field}` needs {need} bytes, {have} are left")]
    Truncated {
        /// Command or image.
        what: &'static str,
        /// The field.
        field: &'static str,
        /// Bytes it needs.
        need: usize,
        /// Bytes left.
        have: usize,
    },
    /// A string field is not UTF-8.
    #[error("{what}: field `{field}` is not UTF-8")]
    BadUtf8 {
        /// Command or image.
        what: &'static str,
        /// The field.
        field: &'static str,
    },
    /// An enum field holds an unknown code.
    #[error("{what}: field `{field}` holds unknown code {code}")]
    BadCode {
        /// Command or image.
        what: &'static str,
        /// The field.
        field: &'static str,
        /// The code.
        code: u8,
    },
    /// A count is larger than the bytes left could hold.
    #[error(
        "{what}: field `{field}` counts {count} items, more than the {have} bytes left could hold"
    )]
    BadCount {
        /// Command or image.
        what: &'static str,
        /// The field.
        field: &'static str,
        /// The count.
        count: u64,
        /// Bytes left.
        have: usize,
    },
    /// Bytes left over after the last field.
    #[error("{what}: {count} bytes after the last field")]
    TrailingBytes {
        /// Command or image.
        what: &'static str,
        /// How many.
        count: usize,
    },
    /// An image whose fields decode but whose state breaks an invariant.
    #[error("image: {0}")]
    Inconsistent(#[from] MetaError),
}

impl Command {
    /// The command's kind code (see [`Command`]'s layout).
    fn kind(&self) -> u8 {
        match self {
            Command::RegisterNode { .. } => 1,
            Command::SetNodeState { .. } => 2,
            Command::CreateVolume { .. } => 3,
            Command::VolumeReady { .. } => 4,
            Command::GrowVolume { .. } => 5,
            Command::DeleteVolume { .. } => 6,
            Command::VolumeGone { .. } => 7,
            Command::StartMove { .. } => 8,
            Command::FinishMove { .. } => 9,
            Command::AbortMove { .. } => 10,
            Command::SetPreferredLeader { .. } => 11,
            Command::CreateSnapshot { .. } => 12,
            Command::SnapshotReady { .. } => 13,
            Command::DeleteSnapshot { .. } => 14,
            Command::SnapshotGone { .. } => 15,
            Command::CloneVolume { .. } => 16,
        }
    }

    /// Encodes the command (layout on [`Command`]).
    ///
    /// Every command [`Meta::check`] accepts fits the format. One that does not fit (a
    /// string over 65,535 bytes, a chunk of over 255 replicas) is cut to the format's
    /// limit (a string at a character boundary) rather than panicking; the cut field is
    /// still over `check`'s own limits, so the decoded command is refused just the same.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Vec::with_capacity(64);
        w.extend_from_slice(&COMMAND_MAGIC);
        w.push(COMMAND_VERSION);
        w.push(self.kind());
        match self {
            Command::RegisterNode {
                id,
                repl_addr,
                client_addr,
                rack,
            } => {
                put_u64(&mut w, *id);
                put_str(&mut w, repl_addr);
                put_str(&mut w, client_addr);
                put_str(&mut w, rack);
            }
            Command::SetNodeState { id, state } => {
                put_u64(&mut w, *id);
                w.push(node_state_code(*state));
            }
            Command::CreateVolume {
                name,
                size_bytes,
                chunk_bytes,
                block_bytes,
                chunks,
            } => {
                put_str(&mut w, name);
                put_u64(&mut w, *size_bytes);
                put_u64(&mut w, *chunk_bytes);
                w.extend_from_slice(&block_bytes.to_le_bytes());
                put_chunks(&mut w, chunks);
            }
            Command::VolumeReady { name }
            | Command::DeleteVolume { name }
            | Command::VolumeGone { name } => put_str(&mut w, name),
            Command::GrowVolume {
                name,
                size_bytes,
                chunks,
            } => {
                put_str(&mut w, name);
                put_u64(&mut w, *size_bytes);
                put_chunks(&mut w, chunks);
            }
            Command::StartMove { group, from, to } | Command::FinishMove { group, from, to } => {
                put_u64(&mut w, *group);
                put_u64(&mut w, *from);
                put_u64(&mut w, *to);
            }
            Command::AbortMove { group } => put_u64(&mut w, *group),
            Command::SetPreferredLeader { group, node } => {
                put_u64(&mut w, *group);
                put_u64(&mut w, *node);
            }
            Command::CreateSnapshot { volume, name } => {
                put_str(&mut w, volume);
                put_str(&mut w, name);
            }
            Command::SnapshotReady { volume, id }
            | Command::DeleteSnapshot { volume, id }
            | Command::SnapshotGone { volume, id } => {
                put_str(&mut w, volume);
                put_u64(&mut w, *id);
            }
            Command::CloneVolume {
                name,
                source,
                snapshot,
                chunks,
            } => {
                put_str(&mut w, name);
                put_str(&mut w, source);
                put_u64(&mut w, *snapshot);
                put_chunks(&mut w, chunks);
            }
        }
        seal(&mut w);
        w
    }

    /// Decodes a command (layout on [`Command`]). Only the format is checked here;
    /// whether the command makes sense is [`Meta::check`]'s business.
    pub fn decode(b: &[u8]) -> Result<Command, DecodeError> {
        let what = "command";
        let body = unseal(what, COMMAND_MAGIC, &[COMMAND_VERSION], COMMAND_HEADER, b)?;
        let kind = body[5];
        let mut r = Reader {
            what,
            b: &body[COMMAND_HEADER..],
        };
        let cmd = match kind {
            1 => Command::RegisterNode {
                id: r.u64("id")?,
                repl_addr: r.str("repl_addr")?,
                client_addr: r.str("client_addr")?,
                rack: r.str("rack")?,
            },
            2 => Command::SetNodeState {
                id: r.u64("id")?,
                state: r.node_state("state")?,
            },
            3 => Command::CreateVolume {
                name: r.str("name")?,
                size_bytes: r.u64("size_bytes")?,
                chunk_bytes: r.u64("chunk_bytes")?,
                block_bytes: r.u32("block_bytes")?,
                chunks: r.chunks()?,
            },
            4 => Command::VolumeReady {
                name: r.str("name")?,
            },
            5 => Command::GrowVolume {
                name: r.str("name")?,
                size_bytes: r.u64("size_bytes")?,
                chunks: r.chunks()?,
            },
            6 => Command::DeleteVolume {
                name: r.str("name")?,
            },
            7 => Command::VolumeGone {
                name: r.str("name")?,
            },
            8 => Command::StartMove {
                group: r.u64("group")?,
                from: r.u64("from")?,
                to: r.u64("to")?,
            },
            9 => Command::FinishMove {
                group: r.u64("group")?,
                from: r.u64("from")?,
                to: r.u64("to")?,
            },
            10 => Command::AbortMove {
                group: r.u64("group")?,
            },
            11 => Command::SetPreferredLeader {
                group: r.u64("group")?,
                node: r.u64("node")?,
            },
            12 => Command::CreateSnapshot {
                volume: r.str("volume")?,
                name: r.str("name")?,
            },
            13 => Command::SnapshotReady {
                volume: r.str("volume")?,
                id: r.u64("id")?,
            },
            14 => Command::DeleteSnapshot {
                volume: r.str("volume")?,
                id: r.u64("id")?,
            },
            15 => Command::SnapshotGone {
                volume: r.str("volume")?,
                id: r.u64("id")?,
            },
            16 => Command::CloneVolume {
                name: r.str("name")?,
                source: r.str("source")?,
                snapshot: r.u64("snapshot")?,
                chunks: r.chunks()?,
            },
            code => {
                return Err(DecodeError::BadCode {
                    what,
                    field: "kind",
                    code,
                })
            }
        };
        r.end()?;
        Ok(cmd)
    }
}

impl Meta {
    /// Encodes the whole state, for trimming the control log (the image stands for every
    /// entry up to [`Meta::applied`]) and for starting a new control node. All integers
    /// little-endian; `str` and `chunk` as in [`Command`]'s layout:
    ///
    /// ```text
    /// offset  size  field
    ///      0     4  magic "CMET"
    ///      4     1  version (2)
    ///      5     8  applied: log position of the last command applied
    ///     13     8  next_group
    ///     21     8  next_snapshot
    ///     29     4  node count, then that many nodes, ascending by id:
    ///                 u64 id | str repl_addr | str client_addr | str rack
    ///                 | u8 state (0 Up, 1 Draining, 2 Removed)
    ///      …     4  volume count, then that many volumes, ascending by name:
    ///                 str name | u64 size_bytes | u64 chunk_bytes | u32 block_bytes
    ///                 | u64 version | u8 state (0 Creating, 1 Ready, 2 Deleting)
    ///                 | u32 chunk count | that many chunks, in volume order
    ///                 | u8 has_source (0 or 1)
    ///                   [| str source volume | u64 source snapshot id, if 1]
    ///                 | u32 snapshot count | that many snapshots, ascending by id:
    ///                     u64 id | str name | u8 state (0 Creating, 1 Ready, 2 Deleting)
    ///      …     4  CRC32C of every byte before it
    /// ```
    ///
    /// Version 1 (before snapshots and clones, PolarFS section 7.2) lacks
    /// `next_snapshot` (its node count is at offset 21) and each volume's fields from
    /// `has_source` on.
    pub fn encode_image(&self) -> Vec<u8> {
        let mut w = Vec::with_capacity(256);
        w.extend_from_slice(&IMAGE_MAGIC);
        w.push(IMAGE_VERSION);
        put_u64(&mut w, self.applied);
        put_u64(&mut w, self.next_group);
        put_u64(&mut w, self.next_snapshot);
        put_u32(&mut w, clamp_count(self.nodes.len()));
        for n in self.nodes.values().take(u32::MAX as usize) {
            put_u64(&mut w, n.id);
            put_str(&mut w, &n.repl_addr);
            put_str(&mut w, &n.client_addr);
            put_str(&mut w, &n.rack);
            w.push(node_state_code(n.state));
        }
        put_u32(&mut w, clamp_count(self.volumes.len()));
        for v in self.volumes.values().take(u32::MAX as usize) {
            put_str(&mut w, &v.name);
            put_u64(&mut w, v.size_bytes);
            put_u64(&mut w, v.chunk_bytes);
            put_u32(&mut w, v.block_bytes);
            put_u64(&mut w, v.version);
            w.push(volume_state_code(v.state));
            put_chunks(&mut w, &v.chunks);
            match &v.source {
                None => w.push(0),
                Some((source, id)) => {
                    w.push(1);
                    put_str(&mut w, source);
                    put_u64(&mut w, *id);
                }
            }
            let n = clamp_count(v.snapshots.len());
            put_u32(&mut w, n);
            for snap in v.snapshots.iter().take(n as usize) {
                put_u64(&mut w, snap.id);
                put_str(&mut w, &snap.name);
                w.push(snapshot_state_code(snap.state));
            }
        }
        seal(&mut w);
        w
    }

    /// Decodes an image ([`Meta::encode_image`]) and checks the state's invariants
    /// ([`Meta::verify`]), so that a state from an image is one `apply` could have made.
    /// Nodes must be ascending by id, volumes by name and snapshots by id (as encoded),
    /// so that each state has exactly one image.
    ///
    /// An image of version 1 (written before snapshots) is read too, as a state with no
    /// snapshots or clones and `next_snapshot` 1; it encodes again as version 2.
    pub fn decode_image(b: &[u8]) -> Result<Meta, DecodeError> {
        let what = "image";
        let body = unseal(
            what,
            IMAGE_MAGIC,
            &[IMAGE_VERSION_V1, IMAGE_VERSION],
            IMAGE_HEADER,
            b,
        )?;
        let v1 = body[4] == IMAGE_VERSION_V1;
        let mut r = Reader {
            what,
            b: &body[IMAGE_HEADER..],
        };
        let mut meta = Meta::new();
        meta.applied = r.u64("applied")?;
        meta.next_group = r.u64("next_group")?;
        meta.next_snapshot = if v1 {
            FIRST_SNAPSHOT
        } else {
            r.u64("next_snapshot")?
        };
        let nodes = r.count("nodes", MIN_ENCODED_NODE_BYTES)?;
        for _ in 0..nodes {
            let n = Node {
                id: r.u64("node.id")?,
                repl_addr: r.str("node.repl_addr")?,
                client_addr: r.str("node.client_addr")?,
                rack: r.str("node.rack")?,
                state: r.node_state("node.state")?,
            };
            if meta.nodes.last_key_value().is_some_and(|(&k, _)| k >= n.id) {
                return Err(MetaError::Inconsistent {
                    detail: format!("node {} is out of order", n.id),
                }
                .into());
            }
            meta.nodes.insert(n.id, n);
        }
        let min_volume = if v1 {
            MIN_ENCODED_VOLUME_BYTES_V1
        } else {
            MIN_ENCODED_VOLUME_BYTES
        };
        let volumes = r.count("volumes", min_volume)?;
        for _ in 0..volumes {
            let mut v = Volume {
                name: r.str("volume.name")?,
                size_bytes: r.u64("volume.size_bytes")?,
                chunk_bytes: r.u64("volume.chunk_bytes")?,
                block_bytes: r.u32("volume.block_bytes")?,
                version: r.u64("volume.version")?,
                state: r.volume_state("volume.state")?,
                chunks: r.chunks()?,
                snapshots: Vec::new(),
                source: None,
            };
            if !v1 {
                v.source = match r.u8("volume.has_source")? {
                    0 => None,
                    1 => Some((r.str("volume.source")?, r.u64("volume.source_snapshot")?)),
                    code => {
                        return Err(DecodeError::BadCode {
                            what,
                            field: "volume.has_source",
                            code,
                        })
                    }
                };
                let n = r.count("volume.snapshots", MIN_ENCODED_SNAPSHOT_BYTES)?;
                v.snapshots.reserve_exact(n);
                for _ in 0..n {
                    v.snapshots.push(Snapshot {
                        id: r.u64("snapshot.id")?,
                        name: r.str("snapshot.name")?,
                        state: r.snapshot_state("snapshot.state")?,
                    });
                }
            }
            if meta
                .volumes
                .last_key_value()
                .is_some_and(|(k, _)| *k >= v.name)
            {
                return Err(MetaError::Inconsistent {
                    detail: format!("volume `{}` is out of order", v.name),
                }
                .into());
            }
            meta.volumes.insert(v.name.clone(), v);
        }
        r.end()?;
        meta.verify()?;
        meta.reindex();
        Ok(meta)
    }
}

fn node_state_code(s: NodeState) -> u8 {
    match s {
        NodeState::Up => 0,
        NodeState::Draining => 1,
        NodeState::Removed => 2,
    }
}

fn volume_state_code(s: VolumeState) -> u8 {
    match s {
        VolumeState::Creating => 0,
        VolumeState::Ready => 1,
        VolumeState::Deleting => 2,
    }
}

fn snapshot_state_code(s: SnapshotState) -> u8 {
    match s {
        SnapshotState::Creating => 0,
        SnapshotState::Ready => 1,
        SnapshotState::Deleting => 2,
    }
}

fn put_u32(w: &mut Vec<u8>, v: u32) {
    w.extend_from_slice(&v.to_le_bytes());
}

fn put_u64(w: &mut Vec<u8>, v: u64) {
    w.extend_from_slice(&v.to_le_bytes());
}

/// A count as the format's `u32`; a longer list (which cannot arise: it would need
/// billions of items in memory) is written as its first `u32::MAX` items.
fn clamp_count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// `u16 len | bytes`, cut at the last character boundary within 65,535 bytes.
fn put_str(w: &mut Vec<u8>, s: &str) {
    let mut len = s.len().min(u16::MAX as usize);
    while !s.is_char_boundary(len) {
        len -= 1;
    }
    w.extend_from_slice(&(len as u16).to_le_bytes());
    w.extend_from_slice(&s.as_bytes()[..len]);
}

/// `u32 count | chunks`.
fn put_chunks(w: &mut Vec<u8>, chunks: &[Chunk]) {
    let n = clamp_count(chunks.len());
    put_u32(w, n);
    for c in chunks.iter().take(n as usize) {
        put_u64(w, c.group);
        let n = c.replicas.len().min(u8::MAX as usize);
        w.push(n as u8);
        for &r in &c.replicas[..n] {
            put_u64(w, r);
        }
        match c.moving {
            None => w.push(0),
            Some(m) => {
                w.push(1);
                put_u64(w, m.from);
                put_u64(w, m.to);
            }
        }
    }
}

/// Appends the CRC32C of every byte so far.
fn seal(w: &mut Vec<u8>) {
    let crc = crc32c::crc32c(w);
    w.extend_from_slice(&crc.to_le_bytes());
}

/// Checks length, magic, version (one of `versions`, the newest last) and checksum, in
/// that order (so that the error says the most useful thing: "not a command" before
/// "damaged"), and returns the bytes before the checksum (header included).
fn unseal<'a>(
    what: &'static str,
    magic: [u8; 4],
    versions: &[u8],
    header: usize,
    b: &'a [u8],
) -> Result<&'a [u8], DecodeError> {
    if b.len() < header + CRC_BYTES {
        return Err(DecodeError::TooShort {
            what,
            have: b.len(),
            need: header + CRC_BYTES,
        });
    }
    let (body, crc) = b.split_at(b.len() - CRC_BYTES);
    let mut found = [0u8; 4];
    found.copy_from_slice(&body[..4]);
    if found != magic {
        return Err(DecodeError::BadMagic {
            what,
            found,
            want: if magic == COMMAND_MAGIC {
                "CCMD"
            } else {
                "CMET"
            },
        });
    }
    if !versions.contains(&body[4]) {
        return Err(DecodeError::BadVersion {
            what,
            found: body[4],
            want: versions.last().copied().unwrap_or(0),
        });
    }
    let mut stored = [0u8; 4];
    stored.copy_from_slice(crc);
    let stored = u32::from_le_bytes(stored);
    let computed = crc32c::crc32c(body);
    if stored != computed {
        return Err(DecodeError::BadChecksum {
            what,
            stored,
            computed,
        });
    }
    Ok(body)
}

/// Reads fields off the front of a body.
struct Reader<'a> {
    /// Command or image, for errors.
    what: &'static str,
    /// The bytes not yet read.
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, field: &'static str, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.b.len() < n {
            return Err(DecodeError::Truncated {
                what: self.what,
                field,
                need: n,
                have: self.b.len(),
            });
        }
        let (head, rest) = self.b.split_at(n);
        self.b = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], DecodeError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(field, N)?);
        Ok(out)
    }

    fn u8(&mut self, field: &'static str) -> Result<u8, DecodeError> {
        Ok(self.array::<1>(field)?[0])
    }

    fn u32(&mut self, field: &'static str) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }

    fn u64(&mut self, field: &'static str) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }

    fn str(&mut self, field: &'static str) -> Result<String, DecodeError> {
        let len = u16::from_le_bytes(self.array(field)?) as usize;
        let bytes = self.take(field, len)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| DecodeError::BadUtf8 {
            what: self.what,
            field,
        })
    }

    /// A `u32` count of items of at least `min_item_bytes` each, refused if the bytes
    /// left could not hold that many (before anything is allocated for them).
    fn count(&mut self, field: &'static str, min_item_bytes: usize) -> Result<usize, DecodeError> {
        let count = self.u32(field)?;
        let have = self.b.len();
        match usize::try_from(count) {
            Ok(n)
                if n.checked_mul(min_item_bytes)
                    .is_some_and(|need| need <= have) =>
            {
                Ok(n)
            }
            _ => Err(DecodeError::BadCount {
                what: self.what,
                field,
                count: u64::from(count),
                have,
            }),
        }
    }

    fn node_state(&mut self, field: &'static str) -> Result<NodeState, DecodeError> {
        match self.u8(field)? {
            0 => Ok(NodeState::Up),
            1 => Ok(NodeState::Draining),
            2 => Ok(NodeState::Removed),
            code => Err(DecodeError::BadCode {
                what: self.what,
                field,
                code,
            }),
        }
    }

    fn volume_state(&mut self, field: &'static str) -> Result<VolumeState, DecodeError> {
        match self.u8(field)? {
            0 => Ok(VolumeState::Creating),
            1 => Ok(VolumeState::Ready),
            2 => Ok(VolumeState::Deleting),
            code => Err(DecodeError::BadCode {
                what: self.what,
                field,
                code,
            }),
        }
    }

    fn snapshot_state(&mut self, field: &'static str) -> Result<SnapshotState, DecodeError> {
        match self.u8(field)? {
            0 => Ok(SnapshotState::Creating),
            1 => Ok(SnapshotState::Ready),
            2 => Ok(SnapshotState::Deleting),
            code => Err(DecodeError::BadCode {
                what: self.what,
                field,
                code,
            }),
        }
    }

    /// `u32 count | chunks`.
    fn chunks(&mut self) -> Result<Vec<Chunk>, DecodeError> {
        let n = self.count("chunks", MIN_ENCODED_CHUNK_BYTES)?;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let group = self.u64("chunk.group")?;
            let count = self.u8("chunk.replicas")? as usize;
            // At most 255 × 8 bytes: no cap needed beyond the u8.
            let mut replicas = Vec::with_capacity(count);
            for _ in 0..count {
                replicas.push(self.u64("chunk.replica")?);
            }
            let moving = match self.u8("chunk.moving")? {
                0 => None,
                1 => Some(Move {
                    from: self.u64("chunk.moving.from")?,
                    to: self.u64("chunk.moving.to")?,
                }),
                code => {
                    return Err(DecodeError::BadCode {
                        what: self.what,
                        field: "chunk.moving",
                        code,
                    })
                }
            };
            out.push(Chunk {
                group,
                replicas,
                moving,
            });
        }
        Ok(out)
    }

    /// Refuses bytes left over.
    fn end(&self) -> Result<(), DecodeError> {
        if self.b.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::TrailingBytes {
                what: self.what,
                count: self.b.len(),
            })
        }
    }
}
