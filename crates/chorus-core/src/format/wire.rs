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
//!                    | u64 base_max_csn | u64 base_pid | u64 committed; base_lsn <= committed
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
/// [`Message::payload_len`]: an [`Message::Append`] carrying a membership of
/// [`MAX_MEMBERS`] voters and as many learners. A sender whose messages carry at most `P`
/// bytes of log fits every frame in a body limit of `P + MAX_MSG_OVERHEAD`.
pub const MAX_MSG_OVERHEAD: usize = 8 + 1 + 49 + 33 + 8 * 2 * MAX_MEMBERS as usize;

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
mod tests {
    use super::*;
    use crate::format::le::put_u64;
    use proptest::prelude::*;

    const MAX: u64 = u64::MAX;

    fn cv(proposal_id: u64, seq: u64) -> ConfigVersion {
        ConfigVersion { proposal_id, seq }
    }

    fn prio(v: u64, priority: u32, id: NodeId) -> Priority {
        Priority {
            config_version: cv(v, v),
            priority,
            id,
        }
    }

    fn pos(lsn: u64, acc: u32) -> LogPos {
        LogPos { lsn, acc }
    }

    fn full_membership() -> Membership {
        Membership {
            version: cv(MAX, MAX),
            voters: (0..MAX_MEMBERS as u64).collect(),
            learners: (0..MAX_MEMBERS as u64).map(|i| MAX - i).collect(),
            barrier_lsn: MAX,
            access_mode: AccessMode::RawWrite,
        }
    }

    /// Every variant, each with low and high edge values.
    fn samples() -> Vec<Message> {
        let mut v = Vec::new();
        for (n, n32, b) in [(0u64, 0u32, false), (MAX, u32::MAX, true)] {
            v.push(Message::Ping {
                prio: prio(n, n32, n),
                max_pid: n,
                leader: None,
                voter: b,
            });
            for leader in [Some(0), Some(MAX)] {
                v.push(Message::Ping {
                    prio: prio(n, n32, n),
                    max_pid: n,
                    leader,
                    voter: !b,
                });
            }
            v.push(Message::Prepare {
                pid: n,
                prio: prio(n, n32, n),
                transfer: b,
                ts: n,
            });
            v.push(Message::PrepareAck {
                pid: n,
                granted: b,
                promised: n,
                end: n,
                last_pid: n,
                committed: n,
                ts: n,
            });
            v.push(Message::Fetch {
                pid: n,
                from: pos(n, n32),
                max_bytes: n32,
            });
            for groups in [vec![], vec![0xAB; 4097]] {
                v.push(Message::FetchResp {
                    pid: n,
                    prev: pos(n, n32),
                    groups: groups.clone(),
                    end: n,
                });
                for config in [
                    None,
                    Some(Membership::default()),
                    Some(Membership {
                        version: cv(3, 1),
                        voters: vec![1, 2, 3],
                        learners: vec![],
                        barrier_lsn: 4096,
                        access_mode: AccessMode::Append,
                    }),
                    Some(Membership {
                        version: cv(3, 2),
                        voters: vec![],
                        learners: vec![0, MAX],
                        barrier_lsn: 0,
                        access_mode: AccessMode::RawWrite,
                    }),
                    Some(full_membership()),
                ] {
                    v.push(Message::Append {
                        pid: n,
                        ts: n,
                        prev: pos(n, n32),
                        groups: groups.clone(),
                        leader_end: n,
                        committed: n,
                        config,
                    });
                }
                for (have, damaged) in [(false, false), (true, false), (false, true), (true, true)]
                {
                    v.push(Message::RepairResp {
                        from: n,
                        to: n,
                        bytes: groups.clone(),
                        have,
                        damaged,
                    });
                }
            }
            v.push(Message::AppendAck {
                pid: n,
                ts: n,
                success: b,
                matched: n,
                hint: n,
                committed: n,
                config_version: cv(n, n),
            });
            v.push(Message::TimeoutNow { pid: n });
            v.push(Message::RepairRequest { from: n, to: n });
            v.push(Message::Rebase {
                pid: n,
                ts: n,
                base: ChainPoint {
                    end_lsn: n / 2,
                    acc_crc: n32,
                    next_group_seq: n,
                    max_csn: n,
                },
                base_pid: n,
                committed: n,
            });
        }
        v
    }

    fn hellos() -> Vec<Frame> {
        ["", "10.0.0.1:7000", "[::1]:7000", "nœud-été.example:7000"]
            .iter()
            .map(|a| a.to_string())
            .chain([
                "a".repeat(MAX_LISTEN_ADDR_BYTES),
                "é".repeat(MAX_LISTEN_ADDR_BYTES / 2),
            ])
            .enumerate()
            .map(|(i, listen_addr)| Frame::Hello {
                cluster_id: if i % 2 == 0 { 0 } else { MAX },
                node: i as u64 * 0x0101_0101_0101_0101,
                listen_addr,
            })
            .collect()
    }

    fn all_frames() -> Vec<Frame> {
        let mut frames = hellos();
        for (i, msg) in samples().into_iter().enumerate() {
            let group = [0, 1, MAX][i % 3];
            frames.push(Frame::Msg { group, msg });
        }
        for (i, msg) in ooo_samples().into_iter().enumerate() {
            let group = [MAX, 0, 7][i % 3];
            frames.push(Frame::OooMsg { group, msg });
        }
        frames
    }

    /// Out-of-order messages (their own encoding is tested with every variant in
    /// `format::ooo`; here they travel in frames).
    fn ooo_samples() -> Vec<OooMsg> {
        use crate::ooo::dependent::VoteLog;
        vec![
            OooMsg::Vote {
                term: 3,
                head: 4,
                log: VoteLog {
                    last_term: 1,
                    last_seq: 2,
                    first_uncommitted: 3,
                    base: 2,
                },
                config: (3, 1),
            },
            OooMsg::Ack {
                term: MAX,
                seqs: vec![(1, 2), (3, 4)],
                head: 5,
                applied: 3,
            },
            OooMsg::TimeoutNow { term: 9 },
            OooMsg::Snapshot {
                term: 2,
                base: 40,
                offset: 0,
                total: 3,
                part: Some(31),
                data: vec![1, 2, 3],
            },
        ]
    }

    fn enc(frame: &Frame) -> Vec<u8> {
        let mut out = Vec::new();
        encode_frame(frame, &mut out);
        out
    }

    /// A frame with the given header fields and body, checksums computed.
    fn raw(kind: u8, flags: u8, version: u16, body: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; FRAME_HEADER_SIZE];
        put_u32(&mut b, 0, WIRE_MAGIC);
        put_u16(&mut b, 4, version);
        b[6] = kind;
        b[7] = flags;
        put_u32(&mut b, 8, body.len() as u32);
        put_u32(&mut b, 12, crc32c(body));
        let crc = crc32c(&b[..16]);
        put_u32(&mut b, 16, crc);
        b.extend_from_slice(body);
        b
    }

    /// The body of an encoded frame.
    fn body_of(frame: &Frame) -> Vec<u8> {
        enc(frame)[FRAME_HEADER_SIZE..].to_vec()
    }

    fn decode(b: &[u8]) -> Result<Frame, FormatError> {
        decode_frame(b, DEFAULT_MAX_FRAME_BYTES).map(|(f, _)| f)
    }

    fn malformed(r: Result<Frame, FormatError>, needle: &str) {
        match r {
            Err(FormatError::Malformed { detail, .. }) => {
                assert!(detail.contains(needle), "{detail:?} lacks {needle:?}")
            }
            other => panic!("expected Malformed ({needle}), got {other:?}"),
        }
    }

    #[test]
    fn layout_is_pinned() {
        let b = enc(&Frame::Hello {
            cluster_id: 0x0807_0605_0403_0201,
            node: 9,
            listen_addr: "h:1".into(),
        });
        let body: &[u8] = &[
            1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 0, 0, 0, 0, 0, 0, 3, b'h', b':', b'1',
        ];
        assert_eq!(&b[0..4], b"CHRW");
        assert_eq!(&b[4..8], &[1, 0, 1, 0]);
        assert_eq!(u32_at(&b, 8), body.len() as u32);
        assert_eq!(u32_at(&b, 12), crc32c(body));
        assert_eq!(u32_at(&b, 16), crc32c(&b[..16]));
        assert_eq!(&b[FRAME_HEADER_SIZE..], body);

        let b = enc(&Frame::Msg {
            group: 7,
            msg: Message::Ping {
                prio: Priority {
                    config_version: cv(2, 3),
                    priority: 4,
                    id: 5,
                },
                max_pid: 6,
                leader: Some(8),
                voter: true,
            },
        });
        assert_eq!(b[6], 2);
        let mut want = 7u64.to_le_bytes().to_vec();
        want.push(1);
        want.extend_from_slice(&2u64.to_le_bytes());
        want.extend_from_slice(&3u64.to_le_bytes());
        want.extend_from_slice(&4u32.to_le_bytes());
        want.extend_from_slice(&5u64.to_le_bytes());
        want.extend_from_slice(&6u64.to_le_bytes());
        want.push(1);
        want.extend_from_slice(&8u64.to_le_bytes());
        want.push(1);
        assert_eq!(&b[FRAME_HEADER_SIZE..], &want[..]);
    }

    #[test]
    fn round_trip_every_variant() {
        let mut tags = std::collections::BTreeSet::new();
        for frame in all_frames() {
            let b = enc(&frame);
            assert_eq!(
                decode_frame(&b, u32::MAX).unwrap(),
                (frame.clone(), b.len())
            );
            let h = decode_header(&b, DEFAULT_MAX_FRAME_BYTES).unwrap();
            assert_eq!(h.kind, frame.kind());
            assert_eq!(h.body_len as usize, b.len() - FRAME_HEADER_SIZE);
            assert_eq!(decode_body(&h, &b[FRAME_HEADER_SIZE..]).unwrap(), frame);
            fuzz_decode(&b);
            if let Frame::Msg { group, msg } = &frame {
                let mut direct = vec![0xAB];
                encode_msg_frame(*group, msg, &mut direct);
                assert_eq!(&direct[1..], &b[..], "encode_msg_frame agrees");
                tags.insert(msg.kind());
                assert!(h.body_len as usize - msg.payload_len() <= MAX_MSG_OVERHEAD);
            }
            if let Frame::OooMsg { group, msg } = &frame {
                let mut direct = vec![0xAB];
                encode_ooo_msg_frame(*group, msg, &mut direct);
                assert_eq!(&direct[1..], &b[..], "encode_ooo_msg_frame agrees");
                assert_eq!(
                    &b[FRAME_HEADER_SIZE + 8..],
                    &crate::format::ooo::encode_msg(msg)[..],
                    "the body is the group and the out-of-order message's own bytes"
                );
            }
        }
        assert_eq!(tags.len(), 11, "every message variant sampled: {tags:?}");
    }

    #[test]
    fn frames_back_to_back_and_appended() {
        let frames = all_frames();
        let mut buf = vec![0xEE; 3];
        for f in &frames {
            encode_frame(f, &mut buf);
        }
        let mut at = 3;
        for f in &frames {
            let (got, used) = decode_frame(&buf[at..], DEFAULT_MAX_FRAME_BYTES).unwrap();
            assert_eq!(&got, f);
            at += used;
        }
        assert_eq!(at, buf.len());
    }

    #[test]
    fn max_overhead_is_exact() {
        let msg = Message::Append {
            pid: MAX,
            ts: MAX,
            prev: pos(MAX, u32::MAX),
            groups: vec![],
            leader_end: MAX,
            committed: MAX,
            config: Some(full_membership()),
        };
        let b = enc(&Frame::Msg { group: MAX, msg });
        assert_eq!(b.len() - FRAME_HEADER_SIZE, MAX_MSG_OVERHEAD);
        assert!(decode(&b).is_ok());
    }

    /// Every single-byte change anywhere in a frame is refused, and the error names the
    /// part that was hit: the two checksums leave no byte uncovered.
    #[test]
    fn every_single_byte_corruption_is_rejected() {
        let frames = [
            hellos()[2].clone(),
            Frame::Msg {
                group: 3,
                msg: samples()[0].clone(),
            },
            Frame::Msg {
                group: 4,
                msg: Message::Append {
                    pid: 5,
                    ts: 6,
                    prev: pos(64, 7),
                    groups: vec![1, 2, 3, 4, 5],
                    leader_end: 128,
                    committed: 64,
                    config: Some(Membership {
                        version: cv(5, 1),
                        voters: vec![1, 2, 3],
                        learners: vec![4],
                        barrier_lsn: 64,
                        access_mode: AccessMode::Append,
                    }),
                },
            },
        ];
        for frame in frames {
            let good = enc(&frame);
            for i in 0..good.len() {
                for x in 1..=255u8 {
                    let mut b = good.clone();
                    b[i] ^= x;
                    let r = decode_frame(&b, DEFAULT_MAX_FRAME_BYTES);
                    let ok = matches!(
                        (i, &r),
                        (0..=3, Err(FormatError::BadMagic { .. }))
                            | (4..=5, Err(FormatError::UnknownVersion { .. }))
                            | (6..=19, Err(FormatError::HeaderChecksum { .. }))
                            | (20.., Err(FormatError::DataChecksum { .. }))
                    );
                    assert!(ok, "byte {i} ^ {x:#x} of {frame:?}: {r:?}");
                }
            }
        }
    }

    #[test]
    fn truncation_at_every_length_is_truncated() {
        for frame in all_frames().into_iter().step_by(3) {
            let b = enc(&frame);
            for n in 0..b.len() {
                let r = decode_frame(&b[..n], DEFAULT_MAX_FRAME_BYTES);
                assert!(
                    matches!(r, Err(FormatError::Truncated { have, .. }) if have == n as u64),
                    "{n} of {}: {r:?}",
                    b.len()
                );
            }
            let h = decode_header(&b, DEFAULT_MAX_FRAME_BYTES).unwrap();
            let body = &b[FRAME_HEADER_SIZE..];
            for n in 0..body.len() {
                assert!(matches!(
                    decode_body(&h, &body[..n]),
                    Err(FormatError::Truncated { .. })
                ));
            }
            let mut long = body.to_vec();
            long.push(0);
            assert!(matches!(
                decode_body(&h, &long),
                Err(FormatError::FieldMismatch {
                    field: "body_len",
                    ..
                })
            ));
        }
    }

    #[test]
    fn oversized_body_is_refused_from_the_header_alone() {
        let b = enc(&Frame::Msg {
            group: 1,
            msg: Message::TimeoutNow { pid: 2 },
        });
        let len = (b.len() - FRAME_HEADER_SIZE) as u32;
        assert!(decode_frame(&b, len).is_ok());
        assert!(matches!(
            decode_frame(&b, len - 1),
            Err(FormatError::LengthOutOfRange {
                field: "body_len",
                value,
                max,
                ..
            }) if value == len as u64 && max == len as u64 - 1
        ));
        // A header announcing a huge body, with nothing after it: refused by the limit,
        // not reported as truncated (the body is never waited for).
        let mut h = raw(2, 0, 1, &[]);
        put_u32(&mut h, 8, u32::MAX);
        let crc = crc32c(&h[..16]);
        put_u32(&mut h, 16, crc);
        for max in [0, DEFAULT_MAX_FRAME_BYTES, u32::MAX - 1] {
            assert!(matches!(
                decode_header(&h, max),
                Err(FormatError::LengthOutOfRange { .. })
            ));
            assert!(matches!(
                decode_frame(&h, max),
                Err(FormatError::LengthOutOfRange { .. })
            ));
        }
        assert!(matches!(
            decode_frame(&h, u32::MAX),
            Err(FormatError::Truncated { .. })
        ));
    }

    #[test]
    fn unknown_version_flags_kind_and_tag_are_refused() {
        let body = body_of(&Frame::Msg {
            group: 1,
            msg: Message::TimeoutNow { pid: 2 },
        });
        assert!(decode(&raw(2, 0, 1, &body)).is_ok());
        for v in [0, 2, u16::MAX] {
            assert!(matches!(
                decode(&raw(2, 0, v, &body)),
                Err(FormatError::UnknownVersion { found, supported: 1, .. }) if found == v
            ));
        }
        for f in [1, 0x80, 0xFF] {
            assert!(matches!(
                decode(&raw(2, f, 1, &body)),
                Err(FormatError::UnknownFlags { found, .. }) if found == f as u32
            ));
        }
        for k in [0, 4, 0xFF] {
            malformed(decode(&raw(k, 0, 1, &body)), "unknown frame kind");
        }
        // An ordered message's body is no out-of-order message, and bytes left over after
        // an out-of-order message are refused.
        assert!(decode(&raw(3, 0, 1, &body)).is_err());
        let mut ooo = body_of(&Frame::OooMsg {
            group: 1,
            msg: OooMsg::TimeoutNow { term: 2 },
        });
        assert!(decode(&raw(3, 0, 1, &ooo)).is_ok());
        ooo.push(0);
        assert!(decode(&raw(3, 0, 1, &ooo)).is_err());
        assert!(decode(&raw(3, 0, 1, &[1, 2, 3])).is_err());
        for t in [0, 12, 0xFF] {
            let mut b = body.clone();
            b[8] = t;
            malformed(decode(&raw(2, 0, 1, &b)), "unknown message tag");
        }
        let mut bad = raw(2, 0, 1, &body);
        put_u32(&mut bad, 0, 0x5752_4844);
        assert!(matches!(decode(&bad), Err(FormatError::BadMagic { .. })));
    }

    #[test]
    fn non_canonical_bodies_are_refused() {
        let ping = |leader, voter| Frame::Msg {
            group: 1,
            msg: Message::Ping {
                prio: prio(1, 2, 3),
                max_pid: 4,
                leader,
                voter,
            },
        };
        // Ping body: group(8) tag(1) prio(28) max_pid(8) present(1) leader(8) voter(1).
        let (present_at, leader_at, voter_at) = (45, 46, 54);
        let good = body_of(&ping(None, false));
        assert_eq!(good.len(), 55);
        assert!(decode(&raw(2, 0, 1, &good)).is_ok());

        let mut b = good.clone();
        put_u64(&mut b, leader_at, 7);
        malformed(
            decode(&raw(2, 0, 1, &b)),
            "ping: leader is 7 but marked absent",
        );
        for p in [2, 0xFF] {
            let mut b = good.clone();
            b[present_at] = p;
            malformed(decode(&raw(2, 0, 1, &b)), "leader present flag");
        }
        for v in [2, 0xFF] {
            let mut b = good.clone();
            b[voter_at] = v;
            malformed(decode(&raw(2, 0, 1, &b)), "ping: voter is");
        }
        let mut b = good.clone();
        b.push(0);
        malformed(decode(&raw(2, 0, 1, &b)), "1 trailing bytes");

        // Hello: trailing bytes, and a listen_addr that is not UTF-8.
        let mut b = body_of(&hellos()[1]);
        b.push(b'x');
        malformed(decode(&raw(1, 0, 1, &b)), "trailing");
        let mut b = body_of(&hellos()[1]);
        b[17] = 0xFF;
        malformed(decode(&raw(1, 0, 1, &b)), "not UTF-8");
        // A length byte past the end of the body.
        let mut b = body_of(&hellos()[1]);
        b[16] += 1;
        assert!(matches!(
            decode(&raw(1, 0, 1, &b)),
            Err(FormatError::Truncated { .. })
        ));

        // Append: config present flag, membership counts, duplicates.
        let append = |config| Frame::Msg {
            group: 1,
            msg: Message::Append {
                pid: 1,
                ts: 2,
                prev: pos(3, 4),
                groups: vec![9; 3],
                leader_end: 5,
                committed: 6,
                config,
            },
        };
        // Append body: group(8) tag(1) pid(8) ts(8) prev(12) len(4) groups(3) leader_end(8)
        // committed(8) present(1) | version(16) barrier(8) V(4) voters L(4) learners.
        let config_at = 8 + 1 + 8 + 8 + 12 + 4 + 3 + 8 + 8;
        let none = body_of(&append(None));
        assert_eq!(none.len(), config_at + 1);
        let mut b = none.clone();
        b[config_at] = 2;
        malformed(
            decode(&raw(2, 0, 1, &b)),
            "append: config present flag is 2",
        );
        let mut b = none.clone();
        b[config_at] = 1;
        assert!(matches!(
            decode(&raw(2, 0, 1, &b)),
            Err(FormatError::Truncated { .. })
        ));
        let m = Membership {
            version: cv(1, 1),
            voters: vec![1, 2],
            learners: vec![3],
            barrier_lsn: 0,
            access_mode: AccessMode::Append,
        };
        let some = body_of(&append(Some(m.clone())));
        let voters_at = config_at + 1 + 16 + 8;
        let learners_at = voters_at + 4 + 16;
        for (at, field) in [(voters_at, "voter count"), (learners_at, "learner count")] {
            let mut b = some.clone();
            put_u32(&mut b, at, MAX_MEMBERS + 1);
            assert!(matches!(
                decode(&raw(2, 0, 1, &b)),
                Err(FormatError::LengthOutOfRange { field: f, value: 256, .. }) if f == field
            ));
        }
        let mut dup = m.clone();
        dup.learners = vec![2];
        malformed(
            decode(&enc(&append(Some(dup)))),
            "node 2 listed twice in the membership",
        );
        let mut dup = m;
        dup.voters = vec![5, 5];
        malformed(decode(&enc(&append(Some(dup)))), "node 5 listed twice");
        let mut over = full_membership();
        over.voters.push(MAX_MEMBERS as u64);
        assert!(matches!(
            decode(&enc(&append(Some(over)))),
            Err(FormatError::LengthOutOfRange { .. })
        ));

        // A byte-field length past the end of the body is Truncated, not an allocation.
        let mut b = body_of(&append(None));
        put_u32(&mut b, 8 + 1 + 8 + 8 + 12, u32::MAX);
        assert!(matches!(
            decode(&raw(2, 0, 1, &b)),
            Err(FormatError::Truncated { .. })
        ));

        // RepairResp booleans.
        let rr = body_of(&Frame::Msg {
            group: 1,
            msg: Message::RepairResp {
                from: 1,
                to: 2,
                bytes: vec![],
                have: false,
                damaged: false,
            },
        });
        for (at, name) in [(rr.len() - 2, "have"), (rr.len() - 1, "damaged")] {
            let mut b = rr.clone();
            b[at] = 3;
            malformed(
                decode(&raw(2, 0, 1, &b)),
                &format!("repair_resp: {name} is 3"),
            );
        }
    }

    #[test]
    #[should_panic(expected = "listen_addr")]
    fn overlong_listen_addr_panics_on_encode() {
        enc(&Frame::Hello {
            cluster_id: 1,
            node: 1,
            listen_addr: "a".repeat(MAX_LISTEN_ADDR_BYTES + 1),
        });
    }

    fn arb_cv() -> impl Strategy<Value = ConfigVersion> {
        (any::<u64>(), any::<u64>()).prop_map(|(p, s)| cv(p, s))
    }

    fn arb_prio() -> impl Strategy<Value = Priority> {
        (arb_cv(), any::<u32>(), any::<u64>()).prop_map(|(config_version, priority, id)| Priority {
            config_version,
            priority,
            id,
        })
    }

    fn arb_pos() -> impl Strategy<Value = LogPos> {
        (any::<u64>(), any::<u32>()).prop_map(|(lsn, acc)| LogPos { lsn, acc })
    }

    fn arb_bytes() -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(any::<u8>(), 0..300)
    }

    fn arb_membership() -> impl Strategy<Value = Membership> {
        (
            arb_cv(),
            proptest::collection::btree_set(any::<u64>(), 0..20),
            any::<prop::sample::Index>(),
            any::<u64>(),
        )
            .prop_map(|(version, ids, split, barrier_lsn)| {
                let ids: Vec<u64> = ids.into_iter().collect();
                let at = split.index(ids.len() + 1);
                Membership {
                    version,
                    voters: ids[..at].to_vec(),
                    learners: ids[at..].to_vec(),
                    barrier_lsn,
                    access_mode: if barrier_lsn % 2 == 0 {
                        AccessMode::Append
                    } else {
                        AccessMode::RawWrite
                    },
                }
            })
    }

    fn arb_message() -> impl Strategy<Value = Message> {
        let u = any::<u64>;
        prop_oneof![
            (arb_prio(), u(), proptest::option::of(u()), any::<bool>()).prop_map(
                |(prio, max_pid, leader, voter)| Message::Ping {
                    prio,
                    max_pid,
                    leader,
                    voter
                }
            ),
            (u(), arb_prio(), any::<bool>(), u()).prop_map(|(pid, prio, transfer, ts)| {
                Message::Prepare {
                    pid,
                    prio,
                    transfer,
                    ts,
                }
            }),
            (u(), any::<bool>(), u(), u(), u(), u(), u()).prop_map(
                |(pid, granted, promised, end, last_pid, committed, ts)| Message::PrepareAck {
                    pid,
                    granted,
                    promised,
                    end,
                    last_pid,
                    committed,
                    ts
                }
            ),
            (u(), arb_pos(), any::<u32>()).prop_map(|(pid, from, max_bytes)| Message::Fetch {
                pid,
                from,
                max_bytes
            }),
            (u(), arb_pos(), arb_bytes(), u()).prop_map(|(pid, prev, groups, end)| {
                Message::FetchResp {
                    pid,
                    prev,
                    groups,
                    end,
                }
            }),
            (
                (u(), u(), arb_pos(), arb_bytes()),
                (u(), u(), proptest::option::of(arb_membership()))
            )
                .prop_map(
                    |((pid, ts, prev, groups), (leader_end, committed, config))| {
                        Message::Append {
                            pid,
                            ts,
                            prev,
                            groups,
                            leader_end,
                            committed,
                            config,
                        }
                    }
                ),
            (u(), u(), any::<bool>(), u(), u(), u(), arb_cv()).prop_map(
                |(pid, ts, success, matched, hint, committed, config_version)| {
                    Message::AppendAck {
                        pid,
                        ts,
                        success,
                        matched,
                        hint,
                        committed,
                        config_version,
                    }
                }
            ),
            u().prop_map(|pid| Message::TimeoutNow { pid }),
            (u(), u()).prop_map(|(from, to)| Message::RepairRequest { from, to }),
            (u(), u(), arb_bytes(), any::<bool>(), any::<bool>()).prop_map(
                |(from, to, bytes, have, damaged)| Message::RepairResp {
                    from,
                    to,
                    bytes,
                    have,
                    damaged
                }
            ),
            (u(), u(), u(), any::<u32>(), u(), u(), u(), u()).prop_map(
                |(pid, ts, a, acc_crc, next_group_seq, max_csn, base_pid, b)| Message::Rebase {
                    pid,
                    ts,
                    base: ChainPoint {
                        end_lsn: a.min(b),
                        acc_crc,
                        next_group_seq,
                        max_csn,
                    },
                    base_pid,
                    committed: a.max(b),
                }
            ),
        ]
    }

    fn arb_frame() -> impl Strategy<Value = Frame> {
        prop_oneof![
            1 => (any::<u64>(), any::<u64>(), "\\PC{0,60}").prop_map(
                |(cluster_id, node, listen_addr)| Frame::Hello {
                    cluster_id,
                    node,
                    listen_addr
                }
            ),
            9 => (any::<u64>(), arb_message()).prop_map(|(group, msg)| Frame::Msg { group, msg }),
        ]
    }

    proptest! {
        #[test]
        fn prop_round_trip(frame in arb_frame(), junk in arb_bytes()) {
            let mut b = enc(&frame);
            let len = b.len();
            let (got, used) = decode_frame(&b, DEFAULT_MAX_FRAME_BYTES).unwrap();
            prop_assert_eq!(&got, &frame);
            prop_assert_eq!(used, len);
            // What follows a frame is not its business.
            b.extend_from_slice(&junk);
            prop_assert_eq!(decode_frame(&b, DEFAULT_MAX_FRAME_BYTES).unwrap(), (frame, len));
            fuzz_decode(&b);
        }

        #[test]
        fn prop_decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            fuzz_decode(&bytes);
        }

        /// Structurally damaged bodies behind valid checksums: decoding must not panic,
        /// and anything accepted must re-encode to the same bytes.
        #[test]
        fn prop_mutated_bodies_are_total(frame in arb_frame(),
                                         edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
                                         cut in any::<prop::sample::Index>()) {
            let mut body = body_of(&frame);
            for (at, v) in edits {
                if !body.is_empty() {
                    let i = at.index(body.len());
                    body[i] = v;
                }
            }
            body.truncate(cut.index(body.len() + 1).max(body.len().saturating_sub(2)));
            fuzz_decode(&raw(frame.kind() as u8, 0, 1, &body));
        }
    }
}
