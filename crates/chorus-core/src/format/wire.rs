//! The replication wire format: the frames replicas exchange over a connection (the
//! transport lives in `chorus-runtime`; this module only turns frames into bytes and back).
//!
//! A connection carries frames back to back. Each side first sends one [`Frame::Hello`],
//! then any number of [`Frame::Msg`], each carrying one [`Message`] for one log group.
//!
//! ```text
//! frame = header (20 bytes) | body (body_len bytes)
//!
//! header (little-endian):
//! offset size field
//!  0     4    magic       u32 = 0x5752_4843 ("CHRW" on the wire)
//!  4     2    version     u16 = 1
//!  6     1    kind        u8: 1 Hello, 2 Msg, 3 OooMsg
//!  7     1    flags       u8 = 0 (unknown bits are an error)
//!  8     4    body_len    u32, 0 ..= the receiver's limit (default DEFAULT_MAX_FRAME_BYTES)
//! 12     4    body_crc    u32, CRC32C of the body
//! 16     4    header_crc  u32, CRC32C of header bytes 0..16
//!
//! Hello body:
//!  0     8    cluster_id       u64
//!  8     8    node             u64, the sender's node id
//! 16     1    listen_addr len  u8, A (0 ..= 255)
//! 17     A    listen_addr      UTF-8
//!
//! Msg body (an ordered group's message):
//!  0     8    group            u64, the log group the message is for
//!  8     1    tag              u8, the message kind (below)
//!  9     .    fields           the message's fields in declaration order
//!
//! OooMsg body (an out-of-order group's message; the groups of every mode share a
//! connection):
//!  0     8    group            u64, the log group the message is for
//!  8     .    message          the out-of-order message, to the end of the body
//!                              (docs/formats.md, "Out-of-order groups": messages)
//! ```
//!
//! Field encodings (all little-endian):
//!
//! ```text
//! u32, u64, Lsn, Nanos, pid   as themselves (Lsn, Nanos and proposal ids are u64)
//! bool                        u8, 0 or 1 (any other value is an error)
//! Option<NodeId>              u8 present (0 or 1) | u64 id (0 when absent)
//! Vec<u8>                     u32 length N | N bytes
//! ConfigVersion (16)          u64 proposal_id | u64 seq
//! Priority (28)               ConfigVersion | u32 priority | u64 id
//! LogPos (12)                 u64 lsn | u32 acc
//! Membership (33 + 8(V+L))    ConfigVersion | u64 barrier_lsn | u32 V (<= MAX_MEMBERS)
//!                             | V x u64 voters | u32 L (<= MAX_MEMBERS) | L x u64 learners
//!                             | u8 access_mode (1 Append, 2 RawWrite); no node may be
//!                             listed twice (the meta record's rule)
//! Option<Membership>          u8 present (0 or 1) | Membership when present
//!
//! tag message        fields
//!  1  Ping           Priority prio | u64 max_pid | Option<NodeId> leader | bool voter
//!  2  Prepare        u64 pid | Priority prio | bool transfer | u64 ts
//!  3  PrepareAck     u64 pid | bool granted | u64 promised | u64 end | u64 last_pid
//!                    | u64 committed | u64 ts
//!  4  Fetch          u64 pid | LogPos from | u32 max_bytes
//!  5  FetchResp      u64 pid | LogPos prev | Vec<u8> groups | u64 end
//!  6  Append         u64 pid | u64 ts | LogPos prev | Vec<u8> groups | u64 leader_end
//!                    | u64 committed | Option<Membership> config
//!  7  AppendAck      u64 pid | u64 ts | bool success | u64 matched | u64 hint
//!                    | u64 committed | ConfigVersion config_version
//!  8  TimeoutNow     u64 pid
//!  9  RepairRequest  u64 from | u64 to
//! 10  RepairResp     u64 from | u64 to | Vec<u8> bytes | bool have | bool damaged
//! 11  Rebase         u64 pid | u64 ts | u64 base_lsn | u32 base_acc | u64 base_group_seq
//!                    | u64 base_max_csn | u64 base_pid | u64 committed
//!                    [| bool 1 | Membership config]; base_lsn <= committed; the config
//!                    is written only when present (its absence: the body ends there)
//! ```
//!
//! **Checks.** [`decode_header`] checks, in this order: magic, version (a peer running
//! another version is told so even if that version lays the rest of its header out
//! differently, so later versions must keep bytes 0..6), header checksum, flags, kind, and
//! `body_len` against the receiver's limit, so an oversized frame is refused before its
//! body is read. [`decode_body`] checks the body checksum, then decodes; bytes left over
//! after the message are an error. The two checksums cover every byte of the frame.
//!
//! **Canonical.** Every accepted frame is the encoding of exactly one [`Frame`]: a decoded
//! frame re-encodes to the bytes it came from (the `wire` fuzz target checks it).
//!
//! **Semantics are the receiver's.** The codec checks structure only; whether a message
//! makes sense (a sender in the membership, a `to` above `from`...) is checked by the
//! replica that receives it. The one exception is the membership rule above, which keeps a
//! membership from the wire storable in the meta record.

use super::group::ChainPoint;
use super::le::{put_u16, put_u32, u16_at, u32_at};
use super::meta::{AccessMode, ConfigVersion, Membership, NodeId, MAX_MEMBERS};
use super::{crc32c, FormatError, Reader};
use crate::ooo::replica::Msg as OooMsg;
use crate::replica::{LogPos, Message, Priority};

/// Size of the frame header in bytes.
pub const FRAME_HEADER_SIZE: usize = 20;
/// The magic number that starts every frame (`"CHRW"` on the wire).
pub const WIRE_MAGIC: u32 = 0x5752_4843;
/// The frame format version this build writes and reads.
pub const WIRE_VERSION: u16 = 1;
/// The default limit on a frame's body (8 MiB). Receivers refuse a frame whose header
/// announces a longer body, before reading it.
pub const DEFAULT_MAX_FRAME_BYTES: u32 = 8 << 20;
/// Longest [`Frame::Hello`] `listen_addr`, in bytes of UTF-8.
pub const MAX_LISTEN_ADDR_BYTES: usize = 255;
/// Most bytes the body of a [`Frame::Msg`] holds beyond the message's
/// [`Message::payload_len`]: a [`Message::Rebase`] carrying a membership of
/// [`MAX_MEMBERS`] voters and as many learners (61 bytes of fields beside it, where an
/// [`Message::Append`] has 49 besides its log bytes). A sender whose messages carry at
/// most `P` bytes of log fits every frame in a body limit of `P + MAX_MSG_OVERHEAD`.
pub const MAX_MSG_OVERHEAD: usize = 8 + 1 + 61 + 33 + 8 * 2 * MAX_MEMBERS as usize;

const WHAT_HEADER: &str = "wire frame header";
const WHAT_FRAME: &str = "wire frame";
const WHAT_BODY: &str = "wire frame body";

const TAG_PING: u8 = 1;
const TAG_PREPARE: u8 = 2;
const TAG_PREPARE_ACK: u8 = 3;
const TAG_FETCH: u8 = 4;
const TAG_FETCH_RESP: u8 = 5;
const TAG_APPEND: u8 = 6;
const TAG_APPEND_ACK: u8 = 7;
const TAG_TIMEOUT_NOW: u8 = 8;
const TAG_REPAIR_REQUEST: u8 = 9;
const TAG_REPAIR_RESP: u8 = 10;
const TAG_REBASE: u8 = 11;

/// What a frame carries (header byte 6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FrameKind {
    /// A [`Frame::Hello`].
    Hello = 1,
    /// A [`Frame::Msg`].
    Msg = 2,
    /// A [`Frame::OooMsg`].
    OooMsg = 3,
}

/// A unit on a replication connection. See the module docs for the layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// First frame each side sends on a connection.
    Hello {
        /// The cluster the sender belongs to; a receiver refuses another cluster's node.
        cluster_id: u64,
        /// The sender's node id.
        node: NodeId,
        /// Where the sender accepts connections (at most [`MAX_LISTEN_ADDR_BYTES`] bytes;
        /// may be empty).
        listen_addr: String,
    },
    /// A protocol message for one log group.
    Msg {
        /// The log group the message is for.
        group: u64,
        /// The message.
        msg: Message,
    },
    /// A protocol message for one out-of-order (parallel or dependent) group.
    OooMsg {
        /// The group the message is for.
        group: u64,
        /// The message.
        msg: OooMsg,
    },
}

impl Frame {
    /// The frame's kind.
    pub fn kind(&self) -> FrameKind {
        match self {
            Frame::Hello { .. } => FrameKind::Hello,
            Frame::Msg { .. } => FrameKind::Msg,
            Frame::OooMsg { .. } => FrameKind::OooMsg,
        }
    }
}

/// A decoded and checked frame header: what [`decode_body`] needs to read the body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// What the frame carries.
    pub kind: FrameKind,
    /// Length of the body in bytes (already checked against the receiver's limit).
    pub body_len: u32,
    /// CRC32C of the body.
    pub body_crc: u32,
}

impl FrameHeader {
    fn encode(&self) -> [u8; FRAME_HEADER_SIZE] {
        let mut b = [0u8; FRAME_HEADER_SIZE];
        put_u32(&mut b, 0, WIRE_MAGIC);
        put_u16(&mut b, 4, WIRE_VERSION);
        b[6] = self.kind as u8;
        b[7] = 0;
        put_u32(&mut b, 8, self.body_len);
        put_u32(&mut b, 12, self.body_crc);
        let crc = crc32c(&b[..16]);
        put_u32(&mut b, 16, crc);
        b
    }
}

/// Appends the encoded frame (header and body) to `out`.
///
/// Any frame is written faithfully; one that breaks a rule of [`decode_body`] (more than
/// [`MAX_MEMBERS`] voters, a node listed twice in a membership) is refused by its
/// receiver, and one whose body exceeds the receiver's limit likewise.
///
/// # Panics
///
/// If a length cannot be represented in its field: a `listen_addr` longer than
/// [`MAX_LISTEN_ADDR_BYTES`], or a byte field or the whole body longer than `u32::MAX`.
/// Callers bound these long before (configuration checks, message size limits).
pub fn encode_frame(frame: &Frame, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0u8; FRAME_HEADER_SIZE]);
    match frame {
        Frame::Hello {
            cluster_id,
            node,
            listen_addr,
        } => {
            assert!(
                listen_addr.len() <= MAX_LISTEN_ADDR_BYTES,
                "hello listen_addr is {} bytes, more than {MAX_LISTEN_ADDR_BYTES}",
                listen_addr.len()
            );
            put_u64v(out, *cluster_id);
            put_u64v(out, *node);
            out.push(listen_addr.len() as u8);
            out.extend_from_slice(listen_addr.as_bytes());
        }
        Frame::Msg { group, msg } => {
            put_u64v(out, *group);
            encode_message(msg, out);
        }
        Frame::OooMsg { group, msg } => {
            put_u64v(out, *group);
            crate::format::ooo::encode_msg_into(msg, out);
        }
    }
    let body = &out[start + FRAME_HEADER_SIZE..];
    let body_len = u32::try_from(body.len()).expect("frame body longer than u32::MAX bytes");
    let header = FrameHeader {
        kind: frame.kind(),
        body_len,
        body_crc: crc32c(body),
    }
    .encode();
    out[start..start + FRAME_HEADER_SIZE].copy_from_slice(&header);
}

/// Appends a [`Frame::Msg`] for `group` carrying `msg` without taking ownership of the
/// message (the sender keeps it; no copy of its log bytes is made). Byte-identical to
/// `encode_frame(&Frame::Msg { group, msg: msg.clone() }, out)`.
pub fn encode_msg_frame(group: u64, msg: &Message, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0u8; FRAME_HEADER_SIZE]);
    put_u64v(out, group);
    encode_message(msg, out);
    let body = &out[start + FRAME_HEADER_SIZE..];
    let body_len = u32::try_from(body.len()).expect("frame body longer than u32::MAX bytes");
    let header = FrameHeader {
        kind: FrameKind::Msg,
        body_len,
        body_crc: crc32c(body),
    }
    .encode();
    out[start..start + FRAME_HEADER_SIZE].copy_from_slice(&header);
}

/// Appends a [`Frame::OooMsg`] for `group` carrying `msg` without taking ownership of
/// the message. Byte-identical to `encode_frame(&Frame::OooMsg { group, msg: msg.clone() },
/// out)`.
pub fn encode_ooo_msg_frame(group: u64, msg: &OooMsg, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0u8; FRAME_HEADER_SIZE]);
    put_u64v(out, group);
    crate::format::ooo::encode_msg_into(msg, out);
    let body = &out[start + FRAME_HEADER_SIZE..];
    let body_len = u32::try_from(body.len()).expect("frame body longer than u32::MAX bytes");
    let header = FrameHeader {
        kind: FrameKind::OooMsg,
        body_len,
        body_crc: crc32c(body),
    }
    .encode();
    out[start..start + FRAME_HEADER_SIZE].copy_from_slice(&header);
}

/// Decodes and checks a frame header from the start of `header` (which may be longer):
/// magic, version, header checksum, flags, kind, and `body_len <= max_body`. Returns what
/// is needed to read and decode the body (`body_len` bytes follow the header).
pub fn decode_header(header: &[u8], max_body: u32) -> Result<FrameHeader, FormatError> {
    if header.len() < FRAME_HEADER_SIZE {
        return Err(FormatError::Truncated {
            what: WHAT_HEADER,
            need: FRAME_HEADER_SIZE as u64,
            have: header.len() as u64,
        });
    }
    let magic = u32_at(header, 0);
    if magic != WIRE_MAGIC {
        return Err(FormatError::BadMagic {
            what: WHAT_HEADER,
            expected: WIRE_MAGIC as u64,
            found: magic as u64,
        });
    }
    let version = u16_at(header, 4);
    if version != WIRE_VERSION {
        return Err(FormatError::UnknownVersion {
            what: WHAT_HEADER,
            found: version,
            supported: WIRE_VERSION,
        });
    }
    let stored = u32_at(header, 16);
    let computed = crc32c(&header[..16]);
    if stored != computed {
        return Err(FormatError::HeaderChecksum {
            what: WHAT_HEADER,
            expected: stored,
            found: computed,
        });
    }
    let flags = header[7];
    if flags != 0 {
        return Err(FormatError::UnknownFlags {
            what: WHAT_HEADER,
            found: flags as u32,
        });
    }
    let kind = match header[6] {
        1 => FrameKind::Hello,
        2 => FrameKind::Msg,
        3 => FrameKind::OooMsg,
        other => {
            return Err(FormatError::Malformed {
                what: WHAT_HEADER,
                detail: format!("unknown frame kind {other} (1 Hello, 2 Msg, 3 OooMsg)"),
            })
        }
    };
    let body_len = u32_at(header, 8);
    if body_len > max_body {
        return Err(FormatError::LengthOutOfRange {
            what: WHAT_HEADER,
            field: "body_len",
            value: body_len as u64,
            min: 0,
            max: max_body as u64,
        });
    }
    Ok(FrameHeader {
        kind,
        body_len,
        body_crc: u32_at(header, 12),
    })
}

/// Decodes the body that follows a header checked by [`decode_header`]: checks that
/// `body` is exactly `header.body_len` bytes and matches `header.body_crc`, then decodes
/// the frame. Bytes left over after the frame's fields are an error.
pub fn decode_body(header: &FrameHeader, body: &[u8]) -> Result<Frame, FormatError> {
    let len = header.body_len as u64;
    if (body.len() as u64) < len {
        return Err(FormatError::Truncated {
            what: WHAT_BODY,
            need: len,
            have: body.len() as u64,
        });
    }
    if body.len() as u64 != len {
        return Err(FormatError::FieldMismatch {
            what: WHAT_BODY,
            field: "body_len",
            expected: len,
            found: body.len() as u64,
        });
    }
    let crc = crc32c(body);
    if crc != header.body_crc {
        return Err(FormatError::DataChecksum {
            what: WHAT_BODY,
            expected: header.body_crc,
            found: crc,
        });
    }
    let mut r = Reader::new(
        body,
        WHAT_BODY,
        match header.kind {
            FrameKind::Hello => "hello",
            FrameKind::Msg => "msg",
            FrameKind::OooMsg => "out-of-order msg",
        },
    );
    let frame = match header.kind {
        FrameKind::Hello => {
            let cluster_id = r.u64()?;
            let node = r.u64()?;
            let n = r.u8()? as usize;
            let addr = r.take(n)?;
            let listen_addr =
                String::from_utf8(addr.to_vec()).map_err(|e| FormatError::Malformed {
                    what: WHAT_BODY,
                    detail: format!(
                        "hello: listen_addr is not UTF-8 (valid up to byte {})",
                        e.utf8_error().valid_up_to()
                    ),
                })?;
            Frame::Hello {
                cluster_id,
                node,
                listen_addr,
            }
        }
        FrameKind::Msg => {
            let group = r.u64()?;
            let msg = decode_message(&mut r)?;
            Frame::Msg { group, msg }
        }
        FrameKind::OooMsg => {
            let group = r.u64()?;
            // The out-of-order message takes the rest of the body and checks that it
            // leaves nothing over.
            let rest = r.take(body.len() - 8)?;
            let msg = crate::format::ooo::decode_msg(rest)?;
            Frame::OooMsg { group, msg }
        }
    };
    r.done()?;
    Ok(frame)
}

/// Decodes one whole frame from the start of `buf` (which may hold more), refusing a body
/// longer than `max_body`. Returns the frame and the bytes it took (header and body).
pub fn decode_frame(buf: &[u8], max_body: u32) -> Result<(Frame, usize), FormatError> {
    let header = decode_header(buf, max_body)?;
    let total = FRAME_HEADER_SIZE as u64 + header.body_len as u64;
    if (buf.len() as u64) < total {
        return Err(FormatError::Truncated {
            what: WHAT_FRAME,
            need: total,
            have: buf.len() as u64,
        });
    }
    let total = total as usize;
    let frame = decode_body(&header, &buf[FRAME_HEADER_SIZE..total])?;
    Ok((frame, total))
}

/// The body of the `wire` cargo-fuzz target. Decodes a frame from the start of `data` and,
/// if it decodes, checks that re-encoding gives the same bytes. Then, because the
/// checksums stop a fuzzer at the header, does the same with `data[1..]` as the body of a
/// frame with valid checksums (kind Hello, Msg or OooMsg as `data[0] % 3` is 0, 1 or 2), so that
/// the body decoder is fuzzed too.
pub fn fuzz_decode(data: &[u8]) {
    fn check(frame_bytes: &[u8]) {
        if let Ok((frame, used)) = decode_frame(frame_bytes, DEFAULT_MAX_FRAME_BYTES) {
            let mut again = Vec::new();
            encode_frame(&frame, &mut again);
            assert_eq!(again, &frame_bytes[..used], "wire frame re-encode differs");
        }
    }
    check(data);
    if let Some((&k, body)) = data.split_first() {
        let Ok(body_len) = u32::try_from(body.len()) else {
            return;
        };
        let kind = match k % 3 {
            0 => FrameKind::Hello,
            1 => FrameKind::Msg,
            _ => FrameKind::OooMsg,
        };
        let mut framed = FrameHeader {
            kind,
            body_len,
            body_crc: crc32c(body),
        }
        .encode()
        .to_vec();
        framed.extend_from_slice(body);
        check(&framed);
    }
}

fn put_u64v(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_u32v(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_bool(out: &mut Vec<u8>, v: bool) {
    out.push(v as u8);
}

fn put_opt_id(out: &mut Vec<u8>, v: Option<NodeId>) {
    out.push(v.is_some() as u8);
    put_u64v(out, v.unwrap_or(0));
}

fn put_bytes(out: &mut Vec<u8>, v: &[u8]) {
    let n = u32::try_from(v.len()).expect("message byte field longer than u32::MAX bytes");
    put_u32v(out, n);
    out.extend_from_slice(v);
}

fn put_config_version(out: &mut Vec<u8>, v: &ConfigVersion) {
    put_u64v(out, v.proposal_id);
    put_u64v(out, v.seq);
}

fn put_prio(out: &mut Vec<u8>, p: &Priority) {
    put_config_version(out, &p.config_version);
    put_u32v(out, p.priority);
    put_u64v(out, p.id);
}

fn put_pos(out: &mut Vec<u8>, p: &LogPos) {
    put_u64v(out, p.lsn);
    put_u32v(out, p.acc);
}

fn put_membership(out: &mut Vec<u8>, m: &Membership) {
    put_config_version(out, &m.version);
    put_u64v(out, m.barrier_lsn);
    for list in [&m.voters, &m.learners] {
        let n = u32::try_from(list.len()).expect("membership longer than u32::MAX");
        put_u32v(out, n);
        for id in list {
            put_u64v(out, *id);
        }
    }
    out.push(m.access_mode as u8);
}

fn encode_message(msg: &Message, out: &mut Vec<u8>) {
    match msg {
        Message::Ping {
            prio,
            max_pid,
            leader,
            voter,
        } => {
            out.push(TAG_PING);
            put_prio(out, prio);
            put_u64v(out, *max_pid);
            put_opt_id(out, *leader);
            put_bool(out, *voter);
        }
        Message::Prepare {
            pid,
            prio,
            transfer,
            ts,
        } => {
            out.push(TAG_PREPARE);
            put_u64v(out, *pid);
            put_prio(out, prio);
            put_bool(out, *transfer);
            put_u64v(out, *ts);
        }
        Message::PrepareAck {
            pid,
            granted,
            promised,
            end,
            last_pid,
            committed,
            ts,
        } => {
            out.push(TAG_PREPARE_ACK);
            put_u64v(out, *pid);
            put_bool(out, *granted);
            put_u64v(out, *promised);
            put_u64v(out, *end);
            put_u64v(out, *last_pid);
            put_u64v(out, *committed);
            put_u64v(out, *ts);
        }
        Message::Fetch {
            pid,
            from,
            max_bytes,
        } => {
            out.push(TAG_FETCH);
            put_u64v(out, *pid);
            put_pos(out, from);
            put_u32v(out, *max_bytes);
        }
        Message::FetchResp {
            pid,
            prev,
            groups,
            end,
        } => {
            out.push(TAG_FETCH_RESP);
            put_u64v(out, *pid);
            put_pos(out, prev);
            put_bytes(out, groups);
            put_u64v(out, *end);
        }
        Message::Append {
            pid,
            ts,
            prev,
            groups,
            leader_end,
            committed,
            config,
        } => {
            out.push(TAG_APPEND);
            put_u64v(out, *pid);
            put_u64v(out, *ts);
            put_pos(out, prev);
            put_bytes(out, groups);
            put_u64v(out, *leader_end);
            put_u64v(out, *committed);
            put_bool(out, config.is_some());
            if let Some(m) = config {
                put_membership(out, m);
            }
        }
        Message::AppendAck {
            pid,
            ts,
            success,
            matched,
            hint,
            committed,
            config_version,
        } => {
            out.push(TAG_APPEND_ACK);
            put_u64v(out, *pid);
            put_u64v(out, *ts);
            put_bool(out, *success);
            put_u64v(out, *matched);
            put_u64v(out, *hint);
            put_u64v(out, *committed);
            put_config_version(out, config_version);
        }
        Message::TimeoutNow { pid } => {
            out.push(TAG_TIMEOUT_NOW);
            put_u64v(out, *pid);
        }
        Message::RepairRequest { from, to } => {
            out.push(TAG_REPAIR_REQUEST);
            put_u64v(out, *from);
            put_u64v(out, *to);
        }
        Message::RepairResp {
            from,
            to,
            bytes,
            have,
            damaged,
        } => {
            out.push(TAG_REPAIR_RESP);
            put_u64v(out, *from);
            put_u64v(out, *to);
            put_bytes(out, bytes);
            put_bool(out, *have);
            put_bool(out, *damaged);
        }
        Message::Rebase {
            pid,
            ts,
            base,
            base_pid,
            committed,
            config,
        } => {
            out.push(TAG_REBASE);
            put_u64v(out, *pid);
            put_u64v(out, *ts);
            put_u64v(out, base.end_lsn);
            put_u32v(out, base.acc_crc);
            put_u64v(out, base.next_group_seq);
            put_u64v(out, base.max_csn);
            put_u64v(out, *base_pid);
            put_u64v(out, *committed);
            // Written only when present, so that a Rebase without it is laid out as
            // before the field existed and every receiver reads it.
            if let Some(m) = config {
                put_bool(out, true);
                put_membership(out, m);
            }
        }
    }
}

fn decode_message(r: &mut Reader<'_>) -> Result<Message, FormatError> {
    // Struct expressions evaluate their fields in the order written, which is the
    // declaration order, which is the wire order.
    let tag = r.u8()?;
    let msg = match tag {
        TAG_PING => {
            r.ctx = "ping";
            Message::Ping {
                prio: r.prio()?,
                max_pid: r.u64()?,
                leader: r.opt_id("leader")?,
                voter: r.flag("voter")?,
            }
        }
        TAG_PREPARE => {
            r.ctx = "prepare";
            Message::Prepare {
                pid: r.u64()?,
                prio: r.prio()?,
                transfer: r.flag("transfer")?,
                ts: r.u64()?,
            }
        }
        TAG_PREPARE_ACK => {
            r.ctx = "prepare_ack";
            Message::PrepareAck {
                pid: r.u64()?,
                granted: r.flag("granted")?,
                promised: r.u64()?,
                end: r.u64()?,
                last_pid: r.u64()?,
                committed: r.u64()?,
                ts: r.u64()?,
            }
        }
        TAG_FETCH => {
            r.ctx = "fetch";
            Message::Fetch {
                pid: r.u64()?,
                from: r.log_pos()?,
                max_bytes: r.u32()?,
            }
        }
        TAG_FETCH_RESP => {
            r.ctx = "fetch_resp";
            Message::FetchResp {
                pid: r.u64()?,
                prev: r.log_pos()?,
                groups: r.bytes()?,
                end: r.u64()?,
            }
        }
        TAG_APPEND => {
            r.ctx = "append";
            Message::Append {
                pid: r.u64()?,
                ts: r.u64()?,
                prev: r.log_pos()?,
                groups: r.bytes()?,
                leader_end: r.u64()?,
                committed: r.u64()?,
                config: if r.flag("config present flag")? {
                    Some(r.membership()?)
                } else {
                    None
                },
            }
        }
        TAG_APPEND_ACK => {
            r.ctx = "append_ack";
            Message::AppendAck {
                pid: r.u64()?,
                ts: r.u64()?,
                success: r.flag("success")?,
                matched: r.u64()?,
                hint: r.u64()?,
                committed: r.u64()?,
                config_version: r.config_version()?,
            }
        }
        TAG_TIMEOUT_NOW => {
            r.ctx = "timeout_now";
            Message::TimeoutNow { pid: r.u64()? }
        }
        TAG_REPAIR_REQUEST => {
            r.ctx = "repair_request";
            Message::RepairRequest {
                from: r.u64()?,
                to: r.u64()?,
            }
        }
        TAG_REPAIR_RESP => {
            r.ctx = "repair_resp";
            Message::RepairResp {
                from: r.u64()?,
                to: r.u64()?,
                bytes: r.bytes()?,
                have: r.flag("have")?,
                damaged: r.flag("damaged")?,
            }
        }
        TAG_REBASE => {
            r.ctx = "rebase";
            let m = Message::Rebase {
                pid: r.u64()?,
                ts: r.u64()?,
                base: ChainPoint {
                    end_lsn: r.u64()?,
                    acc_crc: r.u32()?,
                    next_group_seq: r.u64()?,
                    max_csn: r.u64()?,
                },
                base_pid: r.u64()?,
                committed: r.u64()?,
                // Absent is written as nothing, so a 0 flag is not canonical.
                config: if r.pos == r.buf.len() {
                    None
                } else if r.flag("config present flag")? {
                    Some(r.membership()?)
                } else {
                    return Err(r.malformed(
                        "config present flag is 0 (an absent config is written as nothing)".into(),
                    ));
                },
            };
            if let Message::Rebase {
                base, committed, ..
            } = &m
            {
                if base.end_lsn > *committed {
                    return Err(FormatError::Malformed {
                        what: WHAT_BODY,
                        detail: format!(
                            "rebase: base LSN {} is above the committed end {committed}",
                            base.end_lsn
                        ),
                    });
                }
            }
            m
        }
        other => {
            return Err(FormatError::Malformed {
                what: WHAT_BODY,
                detail: format!("unknown message tag {other} (1 ..= 11)"),
            })
        }
    };
    Ok(msg)
}

/// Field readers of the replication frames, on the shared [`Reader`].
impl Reader<'_> {
    fn opt_id(&mut self, field: &str) -> Result<Option<NodeId>, FormatError> {
        let present = self.u8()?;
        let id = self.u64()?;
        match present {
            // Canonical form: an absent id is sent as 0, so every message has one encoding.
            0 if id != 0 => Err(self.malformed(format!("{field} is {id} but marked absent"))),
            0 => Ok(None),
            1 => Ok(Some(id)),
            other => Err(self.malformed(format!("{field} present flag is {other}, not 0 or 1"))),
        }
    }

    fn config_version(&mut self) -> Result<ConfigVersion, FormatError> {
        Ok(ConfigVersion {
            proposal_id: self.u64()?,
            seq: self.u64()?,
        })
    }

    fn prio(&mut self) -> Result<Priority, FormatError> {
        Ok(Priority {
            config_version: self.config_version()?,
            priority: self.u32()?,
            id: self.u64()?,
        })
    }

    fn log_pos(&mut self) -> Result<LogPos, FormatError> {
        Ok(LogPos {
            lsn: self.u64()?,
            acc: self.u32()?,
        })
    }

    fn membership(&mut self) -> Result<Membership, FormatError> {
        let version = self.config_version()?;
        let barrier_lsn = self.u64()?;
        let voters = self.ids("voter count")?;
        let learners = self.ids("learner count")?;
        let mut all: Vec<NodeId> = voters.iter().chain(&learners).copied().collect();
        all.sort_unstable();
        if let Some(w) = all.windows(2).find(|w| w[0] == w[1]) {
            return Err(FormatError::Malformed {
                what: WHAT_BODY,
                detail: format!("{}: node {} listed twice in the membership", self.ctx, w[0]),
            });
        }
        let mode = self.u8()?;
        let Some(access_mode) = AccessMode::from_byte(mode) else {
            return Err(
                self.malformed(format!("unknown access mode {mode} (1 Append, 2 RawWrite)"))
            );
        };
        Ok(Membership {
            version,
            voters,
            learners,
            barrier_lsn,
            access_mode,
        })
    }
}

#[cfg(test)]
mod tests;
