//! Access modes and mirror writes on one replica (PALF section 5.2): what a mirror takes
//! and refuses, by name; what it writes (the primary's group at the same LSN, re-sealed
//! under its own proposal id, flagged mirrored); and a failover to append.

use chorus_core::format::group::{
    block_remaining, decode_group, encode_group, encode_padding, ChainPoint, GroupHeader,
    SealParams, FLAG_MIRRORED,
};
use chorus_core::format::meta::{AccessMode, Membership, MetaRecord};
use chorus_core::replica::{
    Action, AppendError, MirrorError, Outcome, RecoveredLog, Replica, ReplicaConfig, Role,
};

const MS: u64 = 1_000_000;
const BLOCK: u64 = 64 << 10;

/// A single-voter replica and a driver that makes every write and meta save durable at
/// once; the log's groups are kept to check what was written.
struct One {
    r: Replica,
    now: u64,
    log: Vec<u8>,
    results: Vec<(u64, Outcome)>,
}

impl One {
    fn new(mode: AccessMode) -> Self {
        let meta = MetaRecord {
            log_id: 1,
            block_size: BLOCK,
            membership: Membership {
                voters: vec![1],
                access_mode: mode,
                ..Membership::default()
            },
            access_mode_version: (mode != AccessMode::Append) as u64,
            ..MetaRecord::default()
        };
        let cfg = ReplicaConfig {
            id: 1,
            block_size: BLOCK,
            max_group_bytes: 16 << 10,
            ..ReplicaConfig::default()
        };
        let mut one = One {
            r: Replica::new(cfg, meta, RecoveredLog::default(), 0),
            now: 0,
            log: Vec::new(),
            results: Vec::new(),
        };
        while one.r.role() != Role::Leader {
            one.now += 10 * MS;
            assert!(one.now < 10_000 * MS, "no leader");
            one.r.tick(one.now);
            one.drive();
        }
        one.settle();
        one
    }

    fn drive(&mut self) {
        loop {
            let actions = self.r.take_actions();
            if actions.is_empty() {
                return;
            }
            for a in actions {
                match a {
                    Action::SaveMeta { seq, .. } => self.r.meta_saved(self.now, seq),
                    Action::Write { lsn, bytes } => {
                        assert_eq!(lsn, self.log.len() as u64);
                        self.log.extend_from_slice(&bytes);
                        self.r.log_flushed(self.now, self.log.len() as u64);
                    }
                    Action::Result { id, outcome, .. } => self.results.push((id, outcome)),
                    _ => {}
                }
            }
        }
    }

    /// A few ticks: the leader's config (and with it the mode) is accepted.
    fn settle(&mut self) {
        for _ in 0..20 {
            self.now += 10 * MS;
            self.r.tick(self.now);
            self.drive();
        }
    }

    fn chain(&self) -> ChainPoint {
        self.r.log_chain()
    }
}

/// The primary's group of `records` after `at`, sealed by the primary's leader 77.
fn primary_group(at: &ChainPoint, records: &[(u64, &[u8])]) -> (GroupHeader, Vec<u8>) {
    let mut out = Vec::new();
    let h = encode_group(
        &mut out,
        at,
        SealParams {
            proposal_id: 77,
            committed_end_lsn: at.end_lsn,
            flags: 0,
        },
        records,
    );
    (h, out)
}

#[test]
fn a_mirror_takes_the_primary_s_groups_and_refuses_the_rest_by_name() {
    let mut m = One::new(AccessMode::RawWrite);
    assert_eq!(m.r.access_mode(), AccessMode::RawWrite);
    assert_eq!(
        m.r.append(m.now, b"x", 0),
        Err(AppendError::AccessMode {
            mode: AccessMode::RawWrite,
            switching: false
        })
    );
    // The primary's log: an empty StartWorking group, then records.
    let (h0, g0) = primary_group(&ChainPoint::default(), &[]);
    let t0 = m.r.mirror(m.now, &g0).unwrap();
    assert_eq!((t0.lsn, t0.csn), (0, 0));
    let (h1, g1) = primary_group(&h0.chain_after(), &[(5, b"one"), (9, b"two")]);
    let t1 = m.r.mirror(m.now, &g1).unwrap();
    assert_eq!((t1.lsn, t1.csn), (h1.lsn, 9));
    m.drive();
    assert!(m.results.contains(&(t1.id, Outcome::Committed)));
    // What the mirror wrote: the primary's group at its LSN, re-sealed as its own.
    let (w, body) = decode_group(&m.log[h1.lsn as usize..]).unwrap();
    assert_eq!(body, &g1[64..]);
    assert_eq!(
        (w.lsn, w.group_seq, w.max_csn, w.entry_count, w.data_crc),
        (
            h1.lsn,
            h1.group_seq,
            h1.max_csn,
            h1.entry_count,
            h1.data_crc
        )
    );
    assert_eq!(w.flags, FLAG_MIRRORED);
    assert_eq!(w.proposal_id, m.r.proposal_id());
    // Refusals, by name, and nothing written.
    let end = m.r.end_lsn();
    assert_eq!(
        m.r.mirror(m.now, &g1),
        Err(MirrorError::Lsn {
            expected: end,
            found: h1.lsn
        })
    );
    let at = m.chain();
    let (_, skipped) = primary_group(
        &ChainPoint {
            next_group_seq: at.next_group_seq + 1,
            ..at
        },
        &[(20, b"x")],
    );
    let e = m.r.mirror(m.now, &skipped).unwrap_err().to_string();
    assert!(e.contains("the logs differ"), "{e}");
    let (_, stale) = primary_group(&at, &[(9, b"csn not above")]);
    let e = m.r.mirror(m.now, &stale).unwrap_err().to_string();
    assert!(e.contains("does not continue this log's CSNs"), "{e}");
    let (_, mut two) = primary_group(&at, &[(20, b"a")]);
    two.extend_from_slice(&two.clone());
    let e = m.r.mirror(m.now, &two).unwrap_err().to_string();
    assert!(e.contains("mirror one group at a time"), "{e}");
    let mut pad = Vec::new();
    encode_padding(&mut pad, &at, 77, 0, block_remaining(at.end_lsn, BLOCK) / 2);
    let e = m.r.mirror(m.now, &pad).unwrap_err().to_string();
    assert!(e.contains("block sizes differ"), "{e}");
    let mut garbage = g1.clone();
    garbage[70] ^= 1;
    assert!(matches!(
        m.r.mirror(m.now, &garbage),
        Err(MirrorError::Invalid(_))
    ));
    assert_eq!(m.r.end_lsn(), end, "a refused write writes nothing");
    // The padding that ends the primary's block is taken whole.
    let mut pad = Vec::new();
    encode_padding(&mut pad, &at, 77, 0, block_remaining(at.end_lsn, BLOCK));
    m.r.mirror(m.now, &pad).unwrap();
    assert_eq!(m.r.end_lsn(), BLOCK);
    m.drive();

    // Failover: while the switch is not accepted neither kind of write is taken; then
    // appends continue the log, CSNs above the primary's.
    m.r.change_access_mode(m.now, AccessMode::Append).unwrap();
    assert_eq!(
        m.r.mirror(m.now, &g0),
        Err(MirrorError::AccessMode {
            mode: AccessMode::Append,
            switching: true
        })
    );
    m.settle();
    let t = m.r.append(m.now, b"after failover", 0).unwrap();
    assert_eq!((t.lsn >= BLOCK, t.csn), (true, 10));
    assert!(matches!(
        m.r.mirror(m.now, &g0),
        Err(MirrorError::AccessMode {
            mode: AccessMode::Append,
            switching: false
        })
    ));
    // Asking for the mode in force changes nothing.
    let v = m.r.change_access_mode(m.now, AccessMode::Append).unwrap();
    assert_eq!(v, m.r.membership().version);
}

#[test]
fn a_primary_refuses_mirror_writes_and_switches_over() {
    let mut p = One::new(AccessMode::Append);
    let (_, g) = primary_group(&p.chain(), &[(100, b"x")]);
    assert_eq!(
        p.r.mirror(p.now, &g),
        Err(MirrorError::AccessMode {
            mode: AccessMode::Append,
            switching: false
        })
    );
    p.r.append(p.now, b"a", 0).unwrap();
    p.drive();
    // Switchover: the primary becomes a mirror at its log end.
    p.r.change_access_mode(p.now, AccessMode::RawWrite).unwrap();
    assert!(matches!(
        p.r.append(p.now, b"b", 0),
        Err(AppendError::AccessMode {
            mode: AccessMode::RawWrite,
            switching: true
        })
    ));
    p.settle();
    let (_, g) = primary_group(&p.chain(), &[(100, b"from the new primary")]);
    let t = p.r.mirror(p.now, &g).unwrap();
    assert_eq!(t.csn, 100);
    assert_eq!(p.r.durable_meta().access_mode_version, 1);
}
