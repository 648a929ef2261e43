//! An archive segment: a stretch of one ordered group's committed log, whole log groups
//! exactly as the log stores them (PALF section 5.2: what a mirror takes), in one object.
//!
//! ```text
//! offset size field
//!  0     8    magic        b"CHORUSAR"
//!  8     4    version      u32 LE = 1
//! 12     8    group        u64 LE, the log group (stream) archived
//! 20     8    start_lsn    u64 LE, LSN of the first log group's header
//! 28     8    end_lsn      u64 LE, LSN just past the last log group
//! 36     8    max_csn      u64 LE, the last log group's max_csn
//! 44     4    count        u32 LE, log groups in the body (1 or more)
//! 48     4    header_crc   u32 LE, CRC32C of bytes 0..48
//! 52     n    body         the log groups back to back (n = end_lsn - start_lsn), each
//!                          a 64-byte group header and its body (chorus_core::format::group)
//! 52+n   4    body_crc     u32 LE, CRC32C of the body
//! ```
//!
//! A segment is checked whole before anything in it is used: both checksums, and each
//! log group decoded with its own checks ([`decode_group`]), at the LSN the one before it
//! ended, the first at `start_lsn` and the last ending at `end_lsn`.

use chorus_core::format::group::{decode_group, GroupHeader};

/// The segment magic.
pub const MAGIC: &[u8; 8] = b"CHORUSAR";
/// The segment format version this build writes and reads.
pub const VERSION: u32 = 1;
/// Bytes before the body.
pub const HEADER_SIZE: usize = 52;

/// What is wrong with a segment's bytes.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("archive segment {name}: {detail}")]
pub struct SegmentError {
    /// The object's name.
    pub name: String,
    /// What is wrong.
    pub detail: String,
}

/// A checked segment: its header fields and its log groups.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    /// The log group archived.
    pub group: u64,
    /// LSN of the first log group.
    pub start_lsn: u64,
    /// LSN just past the last.
    pub end_lsn: u64,
    /// The last log group's max CSN.
    pub max_csn: u64,
    /// Each log group's header and whole bytes (header and body), in LSN order.
    pub groups: Vec<(GroupHeader, Vec<u8>)>,
}

/// Encodes log groups `groups` (whole, in LSN order, contiguous, at least one) of log
/// group `group` as a segment; returns it with its start, end and max CSN. `Err` names a
/// log group that does not decode or does not follow the one before it.
pub fn encode(group: u64, groups: &[Vec<u8>]) -> Result<(Vec<u8>, u64, u64, u64), String> {
    let mut start = None;
    let mut end = 0u64;
    let mut max_csn = 0u64;
    let body_len: usize = groups.iter().map(Vec::len).sum();
    let mut out = Vec::with_capacity(HEADER_SIZE + body_len + 4);
    out.resize(HEADER_SIZE, 0);
    for g in groups {
        let (h, _) = decode_group(g).map_err(|e| format!("log group to archive: {e}"))?;
        if h.total_len() as usize != g.len() {
            return Err(format!("log group at LSN {}: trailing bytes", h.lsn));
        }
        if start.is_some() && h.lsn != end {
            return Err(format!(
                "log group at LSN {} does not follow the one ending at {end}",
                h.lsn
            ));
        }
        start.get_or_insert(h.lsn);
        end = h.end_lsn();
        max_csn = h.max_csn;
        out.extend_from_slice(g);
    }
    let Some(start) = start else {
        return Err("no log groups to archive".into());
    };
    out[0..8].copy_from_slice(MAGIC);
    out[8..12].copy_from_slice(&VERSION.to_le_bytes());
    out[12..20].copy_from_slice(&group.to_le_bytes());
    out[20..28].copy_from_slice(&start.to_le_bytes());
    out[28..36].copy_from_slice(&end.to_le_bytes());
    out[36..44].copy_from_slice(&max_csn.to_le_bytes());
    out[44..48].copy_from_slice(&(groups.len() as u32).to_le_bytes());
    let hcrc = crc32c::crc32c(&out[0..48]);
    out[48..52].copy_from_slice(&hcrc.to_le_bytes());
    let bcrc = crc32c::crc32c(&out[HEADER_SIZE..]);
    out.extend_from_slice(&bcrc.to_le_bytes());
    Ok((out, start, end, max_csn))
}

/// Decodes and checks segment `bytes` (object `name`, for errors).
pub fn decode(name: &str, bytes: &[u8]) -> Result<Segment, SegmentError> {
    let err = |detail: String| SegmentError {
        name: name.to_string(),
        detail,
    };
    if bytes.len() < HEADER_SIZE + 4 {
        return Err(err(format!(
            "{} bytes, shorter than a header and a checksum ({})",
            bytes.len(),
            HEADER_SIZE + 4
        )));
    }
    let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().expect("4 bytes"));
    let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().expect("8 bytes"));
    if &bytes[0..8] != MAGIC {
        return Err(err("bad magic (not an archive segment)".into()));
    }
    if crc32c::crc32c(&bytes[0..48]) != u32_at(48) {
        return Err(err("header checksum mismatch".into()));
    }
    if u32_at(8) != VERSION {
        return Err(err(format!(
            "format version {} (this build reads {VERSION})",
            u32_at(8)
        )));
    }
    let (group, start, end, max_csn, count) =
        (u64_at(12), u64_at(20), u64_at(28), u64_at(36), u32_at(44));
    let body_len = end.checked_sub(start).ok_or_else(|| {
        err(format!(
            "end LSN {end} below start LSN {start} in the header"
        ))
    })?;
    if bytes.len() as u64 != HEADER_SIZE as u64 + body_len + 4 {
        return Err(err(format!(
            "{} bytes, but its header says {} of log groups (truncated or padded)",
            bytes.len(),
            body_len
        )));
    }
    let body = &bytes[HEADER_SIZE..bytes.len() - 4];
    if crc32c::crc32c(body) != u32_at(bytes.len() - 4) {
        return Err(err("body checksum mismatch".into()));
    }
    let mut groups = Vec::with_capacity(count as usize);
    let (mut at, mut lsn, mut last_csn) = (0usize, start, 0u64);
    while at < body.len() {
        let (h, _) =
            decode_group(&body[at..]).map_err(|e| err(format!("log group at LSN {lsn}: {e}")))?;
        if h.lsn != lsn {
            return Err(err(format!(
                "log group at body offset {at} says LSN {}, expected {lsn}",
                h.lsn
            )));
        }
        let len = h.total_len() as usize;
        groups.push((h, body[at..at + len].to_vec()));
        at += len;
        lsn = h.end_lsn();
        last_csn = h.max_csn;
    }
    if groups.len() != count as usize || last_csn != max_csn {
        return Err(err(format!(
            "header says {count} log groups up to CSN {max_csn}, the body holds {} up to CSN {last_csn}",
            groups.len()
        )));
    }
    Ok(Segment {
        group,
        start_lsn: start,
        end_lsn: end,
        max_csn,
        groups,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use chorus_core::format::group::{encode_group, ChainPoint, SealParams};

    /// Three contiguous log groups of one record each, CSNs 10, 11 and 12.
    pub(crate) fn log_groups() -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut prev = ChainPoint::default();
        for i in 0..3u64 {
            let rec = format!("record {i}");
            let mut buf = Vec::new();
            let h = encode_group(
                &mut buf,
                &prev,
                SealParams {
                    proposal_id: 1,
                    committed_end_lsn: prev.end_lsn,
                    flags: 0,
                },
                &[(10 + i, rec.as_bytes())],
            );
            prev = h.chain_after();
            out.push(buf);
        }
        out
    }

    #[test]
    fn a_segment_round_trips_and_any_flipped_byte_is_named() {
        let groups = log_groups();
        let (bytes, start, end, max_csn) = encode(7, &groups).unwrap();
        assert_eq!((start, max_csn), (0, 12));
        let s = decode("s", &bytes).unwrap();
        assert_eq!(
            (s.group, s.start_lsn, s.end_lsn, s.max_csn),
            (7, 0, end, 12)
        );
        assert_eq!(
            s.groups.iter().map(|g| g.1.clone()).collect::<Vec<_>>(),
            groups
        );
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x10;
            let e = decode("s", &b).unwrap_err();
            assert_eq!(e.name, "s");
        }
        let e = decode("s", &bytes[..bytes.len() - 1]).unwrap_err();
        assert!(e.detail.contains("truncated"), "{e}");
    }

    #[test]
    fn log_groups_out_of_order_are_refused_when_archiving() {
        let mut groups = log_groups();
        groups.swap(0, 1);
        assert!(encode(7, &groups).unwrap_err().contains("does not follow"));
        assert!(encode(7, &[]).is_err());
    }
}
