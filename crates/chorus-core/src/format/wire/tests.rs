//! Tests of the parent module.

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
            for (have, damaged) in [(false, false), (true, false), (false, true), (true, true)] {
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
        for config in [None, Some(full_membership())] {
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
                config,
            });
        }
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
    let rebase = Message::Rebase {
        pid: MAX,
        ts: MAX,
        base: ChainPoint {
            end_lsn: MAX,
            acc_crc: u32::MAX,
            next_group_seq: MAX,
            max_csn: MAX,
        },
        base_pid: MAX,
        committed: MAX,
        config: Some(full_membership()),
    };
    let b = enc(&Frame::Msg {
        group: MAX,
        msg: rebase,
    });
    assert_eq!(b.len() - FRAME_HEADER_SIZE, MAX_MSG_OVERHEAD);
    assert!(decode(&b).is_ok());
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
    assert_eq!(b.len() - FRAME_HEADER_SIZE, MAX_MSG_OVERHEAD - 12);
    assert!(decode(&b).is_ok());
}

/// A Rebase without a membership ends after its committed end (laid out as before the
/// field existed, so every receiver reads it); one with a membership carries it after a
/// present flag, and a 0 flag there is refused as not canonical.
#[test]
fn a_rebase_carries_a_membership_only_when_it_has_one() {
    let rebase = |config| Message::Rebase {
        pid: 7,
        ts: 8,
        base: ChainPoint {
            end_lsn: 1 << 20,
            acc_crc: 9,
            next_group_seq: 10,
            max_csn: 11,
        },
        base_pid: 6,
        committed: 2 << 20,
        config,
    };
    let bare = body_of(&Frame::Msg {
        group: 1,
        msg: rebase(None),
    });
    assert_eq!(bare.len(), 8 + 1 + 60, "group, tag and the eight fields");
    let full = body_of(&Frame::Msg {
        group: 1,
        msg: rebase(Some(full_membership())),
    });
    assert_eq!(&full[..bare.len()], &bare[..]);
    assert_eq!(full[bare.len()], 1, "the present flag");
    let mut zero = bare.clone();
    zero.push(0);
    malformed(
        decode(&raw(FrameKind::Msg as u8, 0, WIRE_VERSION, &zero)),
        "config present flag is 0",
    );
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
        (
            (u(), u(), u(), any::<u32>(), u(), u(), u(), u()),
            proptest::option::of(arb_membership())
        )
            .prop_map(
                |((pid, ts, a, acc_crc, next_group_seq, max_csn, base_pid, b), config)| {
                    Message::Rebase {
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
                        config,
                    }
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
