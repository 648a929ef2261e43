//! Bad input to the replica never panics and never moves it wrongly: random messages with
//! stale or future proposal ids, out-of-range LSNs, forged ids, garbage and truncated group
//! bytes, from members and strangers, interleaved with ticks and flush reports.

use chorus_core::format::group::{encode_group, ChainPoint, SealParams};
use chorus_core::format::meta::{ConfigVersion, Membership, MetaRecord};
use chorus_core::replica::{
    Action, LogPos, Message, Priority, RecoveredLog, Replica, ReplicaConfig, Role,
};
use chorus_core::rng::Rng;

fn replica(seed: u64) -> Replica {
    let meta = MetaRecord {
        log_id: 1,
        block_size: 64 << 10,
        membership: Membership {
            version: ConfigVersion::default(),
            voters: vec![1, 2, 3],
            learners: vec![],
            barrier_lsn: 0,
            ..Membership::default()
        },
        ..MetaRecord::default()
    };
    let cfg = ReplicaConfig {
        id: 1,
        block_size: 64 << 10,
        seed,
        ..ReplicaConfig::default()
    };
    Replica::new(cfg, meta, RecoveredLog::default(), 0)
}

fn random_message(rng: &mut Rng) -> Message {
    let pid = rng.below(6);
    let lsn = rng.below(1 << 20);
    let prio = Priority {
        config_version: ConfigVersion {
            proposal_id: rng.below(3),
            seq: rng.below(3),
        },
        priority: rng.below(3) as u32,
        id: rng.below(6),
    };
    let groups = match rng.below(4) {
        0 => Vec::new(),
        1 => {
            let mut g = vec![0u8; rng.below(300) as usize];
            rng.fill(&mut g);
            g
        }
        2 => {
            // A well-formed group, maybe at a wrong place, maybe truncated.
            let mut out = Vec::new();
            let chain = ChainPoint {
                end_lsn: if rng.chance(1, 2) { 0 } else { lsn },
                ..ChainPoint::default()
            };
            encode_group(
                &mut out,
                &chain,
                SealParams {
                    proposal_id: pid,
                    committed_end_lsn: 0,
                    flags: 0,
                },
                &[(1, b"x")],
            );
            if rng.chance(1, 3) {
                out.truncate(rng.below(out.len() as u64) as usize);
            }
            out
        }
        _ => {
            let mut out = Vec::new();
            encode_group(
                &mut out,
                &ChainPoint::default(),
                SealParams {
                    proposal_id: pid,
                    committed_end_lsn: 0,
                    flags: 0,
                },
                &[(1, b"y")],
            );
            let at = rng.below(out.len() as u64) as usize;
            out[at] ^= 0x40;
            out
        }
    };
    let pos = LogPos {
        lsn,
        acc: rng.next_u64() as u32,
    };
    match rng.below(8) {
        0 => Message::Ping {
            prio,
            max_pid: pid,
            leader: None,
            voter: rng.chance(1, 2),
        },
        1 => Message::Prepare {
            pid,
            prio,
            transfer: rng.chance(1, 4),
            ts: rng.below(1 << 40),
        },
        2 => Message::PrepareAck {
            pid,
            granted: rng.chance(1, 2),
            promised: pid,
            end: lsn,
            last_pid: rng.below(6),
            committed: rng.below(lsn + 1),
            ts: 0,
        },
        3 => Message::Fetch {
            pid,
            from: pos,
            max_bytes: rng.below(1 << 20) as u32,
        },
        4 => Message::FetchResp {
            pid,
            prev: pos,
            groups,
            end: lsn,
        },
        5 => Message::Append {
            pid,
            ts: 0,
            prev: if rng.chance(1, 2) {
                LogPos::default()
            } else {
                pos
            },
            groups,
            leader_end: lsn,
            committed: rng.below(lsn + 1),
            config: None,
        },
        6 => Message::AppendAck {
            pid,
            ts: 0,
            success: rng.chance(1, 2),
            matched: lsn,
            hint: rng.below(lsn + 1),
            committed: rng.below(lsn + 1),
            config_version: ConfigVersion::default(),
        },
        _ => Message::TimeoutNow { pid },
    }
}

/// Members' messages are claims the replica cannot authenticate (that is the transport's
/// job, with mutual TLS): garbage from them must never panic, and where it contradicts the
/// committed log the replica halts with a reason rather than overwrite it.
#[test]
fn random_messages_from_members_never_panic() {
    for seed in 0..40u64 {
        let mut rng = Rng::new(seed);
        let mut r = replica(seed);
        run(&mut r, &mut rng, seed, |rng| rng.range(2, 3));
        assert!(
            r.drops().values().sum::<u64>() > 0,
            "seed {seed}: nothing dropped"
        );
    }
}

/// Messages from strangers (not in the membership, claiming no newer membership) and
/// malformed ones change nothing: no log write, no commit, no role change, no promise.
#[test]
fn strangers_change_nothing() {
    for seed in 0..40u64 {
        let mut rng = Rng::new(seed ^ 0x5757);
        let mut r = replica(seed);
        let actions = run(&mut r, &mut rng, seed, |rng| rng.range(4, 9));
        for a in &actions {
            assert!(
                matches!(
                    a,
                    Action::Dropped { .. } | Action::Send { .. } | Action::Commit { end: 0, .. }
                ),
                "seed {seed}: a stranger caused {a:?}"
            );
        }
        assert_eq!(r.end_lsn(), 0);
        assert_eq!(r.promised(), 0);
        assert_eq!(r.role(), Role::Follower);
        assert!(r.drops().values().sum::<u64>() > 0);
    }
}

fn run(r: &mut Replica, rng: &mut Rng, seed: u64, sender: impl Fn(&mut Rng) -> u64) -> Vec<Action> {
    let mut now = 0u64;
    let mut saved = Vec::new();
    let mut all = Vec::new();
    for _ in 0..2_000 {
        // Ticks stay within one lease so the replica itself does not campaign.
        now += rng.below(1_000_000);
        match rng.below(10) {
            0 => r.tick(now),
            1 => {
                let end = r.end_lsn();
                r.log_flushed(now, end);
            }
            2 => {
                if let Some(seq) = saved.pop() {
                    r.meta_saved(now, seq);
                }
            }
            _ => {
                let from = sender(rng);
                let mut m = random_message(rng);
                if let Message::Prepare { prio, .. } | Message::Ping { prio, .. } = &mut m {
                    prio.id = from;
                    prio.config_version = ConfigVersion::default();
                }
                r.receive(now, from, m);
            }
        }
        for a in r.take_actions() {
            match &a {
                Action::SaveMeta { seq, .. } => saved.push(*seq),
                Action::Write { lsn, bytes } => {
                    assert!(!bytes.is_empty(), "seed {seed}: empty write at {lsn}");
                }
                Action::Halt { reason } => {
                    assert!(!reason.is_empty(), "seed {seed}: halt without a reason");
                }
                _ => {}
            }
            all.push(a);
        }
    }
    all
}
