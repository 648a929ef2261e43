//! The byte formats: commands and images round-trip; decoders are total (every damaged,
//! cut or arbitrary input is an error or a canonical value, never a panic); applying is
//! deterministic.

use chorus_ctrl::{
    Chunk, Command, DecodeError, Meta, MetaError, Move, Node, NodeState, Snapshot, SnapshotState,
    Volume, VolumeState,
};
use proptest::prelude::*;

fn node_state() -> impl Strategy<Value = NodeState> {
    prop_oneof![
        Just(NodeState::Up),
        Just(NodeState::Draining),
        Just(NodeState::Removed)
    ]
}

fn any_chunk() -> impl Strategy<Value = Chunk> {
    (
        any::<u64>(),
        prop::collection::vec(any::<u64>(), 0..5),
        prop::option::of((any::<u64>(), any::<u64>())),
    )
        .prop_map(|(group, replicas, moving)| Chunk {
            group,
            replicas,
            moving: moving.map(|(from, to)| Move { from, to }),
        })
}

fn any_command() -> impl Strategy<Value = Command> {
    let s = || ".{0,12}";
    let chunks = || prop::collection::vec(any_chunk(), 0..4);
    prop_oneof![
        (any::<u64>(), s(), s(), s()).prop_map(|(id, repl_addr, client_addr, rack)| {
            Command::RegisterNode {
                id,
                repl_addr,
                client_addr,
                rack,
            }
        }),
        (any::<u64>(), node_state()).prop_map(|(id, state)| Command::SetNodeState { id, state }),
        (s(), any::<u64>(), any::<u64>(), any::<u32>(), chunks()).prop_map(
            |(name, size_bytes, chunk_bytes, block_bytes, chunks)| Command::CreateVolume {
                name,
                size_bytes,
                chunk_bytes,
                block_bytes,
                chunks,
            }
        ),
        s().prop_map(|name| Command::VolumeReady { name }),
        (s(), any::<u64>(), chunks()).prop_map(|(name, size_bytes, chunks)| {
            Command::GrowVolume {
                name,
                size_bytes,
                chunks,
            }
        }),
        s().prop_map(|name| Command::DeleteVolume { name }),
        s().prop_map(|name| Command::VolumeGone { name }),
        (any::<u64>(), any::<u64>(), any::<u64>())
            .prop_map(|(group, from, to)| Command::StartMove { group, from, to }),
        (any::<u64>(), any::<u64>(), any::<u64>())
            .prop_map(|(group, from, to)| Command::FinishMove { group, from, to }),
        any::<u64>().prop_map(|group| Command::AbortMove { group }),
        (any::<u64>(), any::<u64>())
            .prop_map(|(group, node)| Command::SetPreferredLeader { group, node }),
        (s(), s()).prop_map(|(volume, name)| Command::CreateSnapshot { volume, name }),
        (s(), any::<u64>()).prop_map(|(volume, id)| Command::SnapshotReady { volume, id }),
        (s(), any::<u64>()).prop_map(|(volume, id)| Command::DeleteSnapshot { volume, id }),
        (s(), any::<u64>()).prop_map(|(volume, id)| Command::SnapshotGone { volume, id }),
        (s(), s(), any::<u64>(), chunks()).prop_map(|(name, source, snapshot, chunks)| {
            Command::CloneVolume {
                name,
                source,
                snapshot,
                chunks,
            }
        }),
    ]
}

/// A command to try against the current state, mostly valid: small id spaces, groups
/// from the next free one, moves of existing chunks.
#[derive(Clone, Debug)]
enum Intent {
    Register(u64, usize),
    SetState(u64, NodeState),
    Create(usize, usize, u64, [u64; 3]),
    Ready(usize),
    Grow(usize, usize, [u64; 3]),
    Delete(usize),
    Gone(usize),
    StartMove(usize, usize, u64),
    FinishMove(usize, bool),
    Abort(usize),
    Lead(usize, usize),
    /// Snapshot `SNAPS[.1]` of the volume [`volume_where`] picks with `.0`.
    Snap(usize, usize),
    /// A snapshot that `.1` picks of the volume `.0` picks (see [`snapshot_id`]): mostly
    /// one in the state the command needs.
    SnapReady(usize, usize),
    SnapDelete(usize, usize),
    SnapGone(usize, usize),
    /// Clone `NAMES[.0]` from a snapshot that `.2` picks of the volume `.1` picks.
    Clone(usize, usize, usize, [u64; 3]),
}

const NAMES: [&str; 4] = ["a", "b", "c", "bad name"];
const SNAPS: [&str; 3] = ["s1", "s2", "bad name"];
const RACKS: [&str; 4] = ["", "r1", "r2", "r3"];
const MIB: u64 = 1 << 20;

fn intent() -> impl Strategy<Value = Intent> {
    let name = || 0..NAMES.len();
    let reps = || [0..7u64, 0..7u64, 0..7u64];
    prop_oneof![
        3 => (0..7u64, 0..RACKS.len()).prop_map(|(i, r)| Intent::Register(i, r)),
        1 => (0..7u64, prop_oneof![
            2 => Just(NodeState::Up),
            2 => Just(NodeState::Draining),
            1 => Just(NodeState::Removed),
        ])
        .prop_map(|(i, s)| Intent::SetState(i, s)),
        2 => (name(), 0..4usize, 0..MIB, reps()).prop_map(|(n, c, j, r)| Intent::Create(n, c, j, r)),
        3 => name().prop_map(Intent::Ready),
        1 => (name(), 0..3usize, reps()).prop_map(|(n, c, r)| Intent::Grow(n, c, r)),
        1 => name().prop_map(Intent::Delete),
        1 => name().prop_map(Intent::Gone),
        2 => (any::<usize>(), 0..3usize, 0..7u64).prop_map(|(g, f, t)| Intent::StartMove(g, f, t)),
        2 => (any::<usize>(), any::<bool>()).prop_map(|(g, ok)| Intent::FinishMove(g, ok)),
        1 => any::<usize>().prop_map(Intent::Abort),
        1 => (any::<usize>(), 0..3usize).prop_map(|(g, r)| Intent::Lead(g, r)),
        3 => (name(), 0..SNAPS.len()).prop_map(|(n, s)| Intent::Snap(n, s)),
        3 => (name(), 0..3usize).prop_map(|(n, k)| Intent::SnapReady(n, k)),
        1 => (name(), 0..3usize).prop_map(|(n, k)| Intent::SnapDelete(n, k)),
        1 => (name(), 0..3usize).prop_map(|(n, k)| Intent::SnapGone(n, k)),
        2 => (name(), name(), 0..3usize, reps()).prop_map(|(n, s, k, r)| Intent::Clone(n, s, k, r)),
    ]
}

/// For `n` below 3, the name of an existing volume (`n`-th, cyclically) for which `fit`
/// holds, or else of any existing volume, if there is one; else `NAMES[n]`. (Mostly
/// commands that can be accepted: picking among `NAMES` alone would mostly name a
/// volume that does not exist.)
fn volume_where(m: &Meta, n: usize, fit: impl Fn(&Volume) -> bool) -> String {
    let fitting: Vec<&String> = m
        .volumes()
        .values()
        .filter(|v| fit(v))
        .map(|v| &v.name)
        .collect();
    let any: Vec<&String> = m.volumes().keys().collect();
    match (fitting.len(), any.len()) {
        _ if n >= 3 => NAMES[n].to_string(),
        (len, _) if len > 0 => fitting[n % len].clone(),
        (_, len) if len > 0 => any[n % len].clone(),
        _ => NAMES[n].to_string(),
    }
}

/// A volume with a snapshot in `state`, as [`volume_where`] picks it.
fn volume_with(m: &Meta, n: usize, state: SnapshotState) -> String {
    volume_where(m, n, |v| v.snapshots.iter().any(|s| s.state == state))
}

/// For `k` of 0 or 1, the id of a snapshot of volume `name` in `state` if it has one;
/// else the `k`-th snapshot's id, or a made-up id past them (mostly refused).
fn snapshot_id(m: &Meta, name: &str, k: usize, state: SnapshotState) -> u64 {
    let Some(v) = m.volume(name) else {
        return k as u64 + 1;
    };
    let fit: Vec<u64> = v
        .snapshots
        .iter()
        .filter(|s| s.state == state)
        .map(|s| s.id)
        .collect();
    match fit.len() {
        n if n > 0 && k < 2 => fit[k % n],
        _ => v.snapshots.get(k).map_or(k as u64 + 1, |s| s.id),
    }
}

/// The chunk `k` picks among the state's chunks (or a group that does not exist).
fn pick(m: &Meta, k: usize) -> Chunk {
    let all: Vec<&Chunk> = m.chunks().map(|(_, c)| c).collect();
    match all.len() {
        0 => Chunk {
            group: k as u64 % 5,
            replicas: vec![],
            moving: None,
        },
        n => all[k % n].clone(),
    }
}

/// The chunk `k` picks among the moving chunks, or else among all.
fn pick_moving(m: &Meta, k: usize) -> Chunk {
    let moving: Vec<&Chunk> = m
        .chunks()
        .map(|(_, c)| c)
        .filter(|c| c.moving.is_some())
        .collect();
    match moving.len() {
        0 => pick(m, k),
        n => moving[k % n].clone(),
    }
}

/// `count` new chunks from the next free group, on the registered nodes `reps` pick
/// (node ids, if none is registered).
fn new_chunks(m: &Meta, count: usize, reps: [u64; 3]) -> Vec<Chunk> {
    let nodes: Vec<u64> = m
        .nodes()
        .values()
        .filter(|n| n.state != NodeState::Removed)
        .map(|n| n.id)
        .collect();
    (0..count as u64)
        .map(|i| {
            let mut replicas = Vec::new();
            for r in reps {
                let id = match nodes.len() {
                    0 => r,
                    n => nodes[((r + i) as usize) % n],
                };
                if !replicas.contains(&id) {
                    replicas.push(id);
                }
            }
            Chunk {
                group: m.next_group() + i,
                replicas,
                moving: None,
            }
        })
        .collect()
}

fn resolve(m: &Meta, i: &Intent) -> Command {
    match *i {
        Intent::Register(id, r) => Command::RegisterNode {
            id,
            repl_addr: format!("h{id}:1"),
            client_addr: format!("h{id}:2"),
            rack: RACKS[r].into(),
        },
        Intent::SetState(id, state) => Command::SetNodeState { id, state },
        Intent::Create(n, count, jitter, reps) => Command::CreateVolume {
            name: NAMES[n].into(),
            size_bytes: (count as u64 * MIB).saturating_sub(jitter).max(1),
            chunk_bytes: MIB,
            block_bytes: 64 << 10,
            chunks: new_chunks(m, count.max(1), reps),
        },
        Intent::Ready(n) => Command::VolumeReady {
            name: volume_where(m, n, |v| v.state == VolumeState::Creating),
        },
        Intent::Grow(n, more, reps) => {
            // Whole chunks: the new size needs exactly `more` new chunks.
            let have = m.volume(NAMES[n]).map_or(0, |v| v.chunks.len());
            Command::GrowVolume {
                name: NAMES[n].into(),
                size_bytes: (have + more) as u64 * MIB,
                chunks: new_chunks(m, more, reps),
            }
        }
        Intent::Delete(n) => Command::DeleteVolume {
            name: NAMES[n].into(),
        },
        Intent::Gone(n) => Command::VolumeGone {
            name: NAMES[n].into(),
        },
        Intent::StartMove(k, f, t) => {
            let c = pick(m, k);
            let outside: Vec<u64> = m
                .nodes()
                .keys()
                .copied()
                .filter(|n| !c.replicas.contains(n))
                .collect();
            Command::StartMove {
                group: c.group,
                from: c.replicas.get(f).copied().unwrap_or(1),
                to: match outside.len() {
                    0 => t,
                    n => outside[t as usize % n],
                },
            }
        }
        Intent::FinishMove(k, ok) => {
            let c = pick_moving(m, k);
            let mv = c.moving.unwrap_or(Move { from: 1, to: 2 });
            Command::FinishMove {
                group: c.group,
                from: mv.from,
                to: if ok { mv.to } else { mv.to + 1 },
            }
        }
        Intent::Abort(k) => Command::AbortMove {
            group: pick_moving(m, k).group,
        },
        Intent::Lead(k, r) => {
            let c = pick(m, k);
            Command::SetPreferredLeader {
                group: c.group,
                node: c.replicas.get(r).copied().unwrap_or(3),
            }
        }
        Intent::Snap(n, s) => Command::CreateSnapshot {
            volume: volume_where(m, n, |v| v.state == VolumeState::Ready),
            name: SNAPS[s].into(),
        },
        Intent::SnapReady(n, k) => Command::SnapshotReady {
            id: snapshot_id(
                m,
                &volume_with(m, n, SnapshotState::Creating),
                k,
                SnapshotState::Creating,
            ),
            volume: volume_with(m, n, SnapshotState::Creating),
        },
        Intent::SnapDelete(n, k) => Command::DeleteSnapshot {
            id: snapshot_id(
                m,
                &volume_with(m, n, SnapshotState::Ready),
                k,
                SnapshotState::Ready,
            ),
            volume: volume_with(m, n, SnapshotState::Ready),
        },
        Intent::SnapGone(n, k) => Command::SnapshotGone {
            id: snapshot_id(
                m,
                &volume_with(m, n, SnapshotState::Deleting),
                k,
                SnapshotState::Deleting,
            ),
            volume: volume_with(m, n, SnapshotState::Deleting),
        },
        Intent::Clone(n, src, k, reps) => {
            let source = volume_with(m, src, SnapshotState::Ready);
            let count = m
                .volume(&source)
                .map_or(1, |v| v.size_bytes.div_ceil(v.chunk_bytes) as usize);
            // Mostly a free name.
            let name = (n..n + 3)
                .map(|i| NAMES[i % 3])
                .find(|name| n < 3 && m.volume(name).is_none())
                .unwrap_or(NAMES[n]);
            Command::CloneVolume {
                name: name.into(),
                snapshot: snapshot_id(m, &source, k, SnapshotState::Ready),
                source,
                chunks: new_chunks(m, count, reps),
            }
        }
    }
}

/// Resolves intents, after registering nodes 1–4 (and, if `seeded`, making volume `a`
/// ready with snapshot `s1` ready, so that snapshot and clone commands are often
/// accepted), against a state as it evolves; returns the commands, the state and how
/// many commands it accepted.
fn commands(intents: &[Intent], seeded: bool) -> (Vec<Command>, Meta, usize) {
    let mut m = Meta::new();
    let mut out = Vec::new();
    let mut accepted = 0;
    let mut prefix: Vec<Intent> = (1..=4)
        .map(|id| Intent::Register(id, id as usize % RACKS.len()))
        .collect();
    if seeded {
        prefix.extend([
            Intent::Create(0, 2, 0, [1, 2, 3]),
            Intent::Ready(0),
            Intent::Snap(0, 0),
            Intent::SnapReady(0, 0),
        ]);
    }
    let all: Vec<Intent> = prefix.into_iter().chain(intents.iter().cloned()).collect();
    for (pos, i) in all.iter().enumerate() {
        let cmd = resolve(&m, i);
        let checked = m.check(&cmd).is_ok();
        let applied = m.apply(pos as u64 + 1, &cmd).is_ok();
        assert_eq!(checked, applied, "check and apply disagree on {cmd:?}");
        if applied {
            accepted += 1;
        }
        m.verify().expect("apply keeps the invariants");
        out.push(cmd);
    }
    (out, m, accepted)
}

/// Recomputes the trailing CRC32C after editing an encoding.
fn reseal(b: &mut [u8]) {
    let n = b.len() - 4;
    let crc = crc32c::crc32c(&b[..n]);
    b[n..].copy_from_slice(&crc.to_le_bytes());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn command_round_trips(cmd in any_command()) {
        let b = cmd.encode();
        prop_assert_eq!(Command::decode(&b), Ok(cmd));
    }

    #[test]
    fn every_damaged_command_is_refused(cmd in any_command(), flip in 1..=255u8) {
        let b = cmd.encode();
        for i in 0..b.len() {
            let mut d = b.clone();
            d[i] ^= flip;
            prop_assert!(Command::decode(&d).is_err(), "byte {} ^ {:#x} accepted", i, flip);
        }
        for n in 0..b.len() {
            prop_assert!(Command::decode(&b[..n]).is_err(), "cut at {} accepted", n);
        }
        let mut longer = b.clone();
        longer.push(0);
        prop_assert!(Command::decode(&longer).is_err());
    }

    #[test]
    fn arbitrary_bytes_never_panic(b in prop::collection::vec(any::<u8>(), 0..64)) {
        prop_assert!(Command::decode(&b).is_err());
        prop_assert!(Meta::decode_image(&b).is_err());
    }

    /// Bodies that pass the header and checksum reach the field decoders: they must give
    /// an error or a value that encodes back to the same bytes.
    #[test]
    fn sealed_arbitrary_bodies_decode_canonically(
        kind in 0..18u8,
        body in prop::collection::vec(any::<u8>(), 0..80),
    ) {
        let mut b = b"CCMD\x01".to_vec();
        b.push(kind);
        b.extend_from_slice(&body);
        b.extend_from_slice(&[0; 4]);
        reseal(&mut b);
        if let Ok(cmd) = Command::decode(&b) {
            prop_assert_eq!(cmd.encode(), b);
        }
        let mut img = b"CMET\x02".to_vec();
        img.extend_from_slice(&body);
        img.extend_from_slice(&[0; 4]);
        reseal(&mut img);
        if let Ok(m) = Meta::decode_image(&img) {
            prop_assert_eq!(m.encode_image(), img.clone());
        }
        // Version 1 re-encodes as version 2, to the same state.
        img[4] = 1;
        reseal(&mut img);
        if let Ok(m) = Meta::decode_image(&img) {
            prop_assert_eq!(Meta::decode_image(&m.encode_image()), Ok(m));
        }
    }

    #[test]
    fn image_round_trips_and_apply_is_deterministic(
        intents in prop::collection::vec(intent(), 1..60),
        seeded in any::<bool>(),
    ) {
        let (cmds, m, _) = commands(&intents, seeded);
        let image = m.encode_image();
        prop_assert_eq!(Meta::decode_image(&image), Ok(m.clone()));
        let replay = |cmds: &[Command]| {
            let mut r = Meta::new();
            for (pos, c) in cmds.iter().enumerate() {
                let _ = r.apply(pos as u64 + 1, c);
            }
            r.encode_image()
        };
        prop_assert_eq!(replay(&cmds), image.clone());
        prop_assert_eq!(replay(&cmds), image.clone());
        // Applying through encoded commands gives the same state.
        let decoded: Vec<Command> = cmds.iter().map(|c| Command::decode(&c.encode()).unwrap()).collect();
        prop_assert_eq!(replay(&decoded), image.clone());
        // A damaged image is refused.
        for i in (0..image.len()).step_by(7) {
            let mut d = image.clone();
            d[i] ^= 0x41;
            prop_assert!(Meta::decode_image(&d).is_err());
        }
    }
}

#[test]
fn the_intent_generator_exercises_accepted_commands() {
    // Guards the proptest above against testing only refusals.
    let runner_intents: Vec<Intent> = (0..40u64)
        .map(|i| match i % 6 {
            0..=2 => Intent::Register(i % 7, (i % 4) as usize),
            3 => Intent::Create((i % 3) as usize, 2, 0, [1, 2, 3]),
            4 => Intent::StartMove(i as usize, 0, 4),
            _ => Intent::FinishMove(i as usize, true),
        })
        .collect();
    let (_, m, accepted) = commands(&runner_intents, false);
    assert!(accepted >= 15, "only {accepted} accepted");
    assert!(!m.volumes().is_empty());
    assert!(
        m.volumes().values().any(|v| v.version > 2),
        "no moves were accepted"
    );
}

#[test]
fn errors_name_the_field() {
    let cmd = Command::RegisterNode {
        id: 1,
        repl_addr: "a".into(),
        client_addr: "b".into(),
        rack: "r".into(),
    };
    let mut b = cmd.encode();
    // Make repl_addr's bytes invalid UTF-8 and reseal.
    b[16] = 0xff;
    reseal(&mut b);
    let e = Command::decode(&b).unwrap_err();
    assert_eq!(
        e,
        DecodeError::BadUtf8 {
            what: "command",
            field: "repl_addr"
        }
    );
    assert_eq!(e.to_string(), "command: field `repl_addr` is not UTF-8");

    let mut b = Command::SetNodeState {
        id: 1,
        state: NodeState::Up,
    }
    .encode();
    b[14] = 9;
    reseal(&mut b);
    assert!(matches!(
        Command::decode(&b),
        Err(DecodeError::BadCode {
            field: "state",
            code: 9,
            ..
        })
    ));

    let mut b = Command::AbortMove { group: 1 }.encode();
    b[5] = 200;
    reseal(&mut b);
    assert!(matches!(
        Command::decode(&b),
        Err(DecodeError::BadCode {
            field: "kind",
            code: 200,
            ..
        })
    ));

    let mut b = Command::AbortMove { group: 1 }.encode();
    b[4] = 2;
    assert!(matches!(
        Command::decode(&b),
        Err(DecodeError::BadVersion { found: 2, .. })
    ));
    b[0] = b'X';
    assert!(matches!(
        Command::decode(&b),
        Err(DecodeError::BadMagic { .. })
    ));
}

#[test]
fn forged_counts_do_not_allocate() {
    // A CreateVolume claiming 2^32 - 1 chunks in a few bytes.
    let mut b = b"CCMD\x01\x03".to_vec();
    b.extend_from_slice(&1u16.to_le_bytes());
    b.push(b'v');
    b.extend_from_slice(&MIB.to_le_bytes());
    b.extend_from_slice(&MIB.to_le_bytes());
    b.extend_from_slice(&4096u32.to_le_bytes());
    b.extend_from_slice(&u32::MAX.to_le_bytes());
    b.extend_from_slice(&[0; 4]);
    reseal(&mut b);
    assert!(matches!(
        Command::decode(&b),
        Err(DecodeError::BadCount {
            field: "chunks",
            count: 0xffff_ffff,
            ..
        })
    ));
}

#[test]
fn oversized_fields_encode_without_panic_and_stay_refused() {
    let cmd = Command::CreateVolume {
        name: "é".repeat(40_000),
        size_bytes: MIB,
        chunk_bytes: MIB,
        block_bytes: 4096,
        chunks: vec![Chunk {
            group: 1,
            replicas: (1..=300).collect(),
            moving: None,
        }],
    };
    let back = Command::decode(&cmd.encode()).unwrap();
    let Command::CreateVolume { name, chunks, .. } = &back else {
        panic!("kind changed");
    };
    assert_eq!(name.len(), 65_534);
    assert_eq!(chunks[0].replicas.len(), 255);
    assert!(Meta::new().check(&back).is_err());
}

#[test]
fn inconsistent_images_are_refused() {
    let mut m = Meta::new();
    let reg = Command::RegisterNode {
        id: 1,
        repl_addr: "a".into(),
        client_addr: "b".into(),
        rack: String::new(),
    };
    m.apply(1, &reg).unwrap();
    m.apply(
        2,
        &Command::CreateVolume {
            name: "v".into(),
            size_bytes: MIB,
            chunk_bytes: MIB,
            block_bytes: 4096,
            chunks: vec![Chunk {
                group: 1,
                replicas: vec![1],
                moving: None,
            }],
        },
    )
    .unwrap();
    let image = m.encode_image();
    // next_group (offset 13) lowered to 1: chunk group 1 is no longer below it.
    let mut b = image.clone();
    b[13..21].copy_from_slice(&1u64.to_le_bytes());
    reseal(&mut b);
    let e = Meta::decode_image(&b).unwrap_err();
    assert!(matches!(e, DecodeError::Inconsistent(_)), "{e}");
    // The volume's version set to 0. From the end: CRC (4), the snapshot count (4), the
    // source flag (1), the chunk (group 8, count 1, replica 8, moving 1), the chunk
    // count (4), the state (1), then the version (8).
    let mut b = image.clone();
    let at = b.len() - 4 - 4 - 1 - 18 - 4 - 1 - 8;
    assert_eq!(&b[at..at + 8], &1u64.to_le_bytes());
    b[at..at + 8].copy_from_slice(&0u64.to_le_bytes());
    reseal(&mut b);
    assert!(matches!(
        Meta::decode_image(&b),
        Err(DecodeError::Inconsistent(_))
    ));
}

#[test]
fn the_intent_generator_exercises_snapshots_and_clones() {
    // Guards the proptest above against refusing every snapshot command.
    let intents = [
        Intent::Create(0, 2, 0, [1, 2, 3]),
        Intent::Ready(0),
        Intent::Snap(0, 0),
        Intent::SnapReady(0, 0),
        Intent::Clone(1, 0, 0, [1, 2, 3]),
        Intent::Snap(0, 1),
        Intent::SnapReady(0, 1),
        Intent::SnapDelete(0, 1),
        Intent::SnapGone(0, 1),
        Intent::Ready(1),
        Intent::Snap(1, 0),
    ];
    let (_, m, accepted) = commands(&intents, false);
    assert_eq!(accepted, 4 + intents.len(), "some were refused");
    assert_eq!(m.next_snapshot(), 4);
    assert_eq!(m.snapshot_tag("b"), 3);
    assert_eq!(m.volume("a").unwrap().snapshots.len(), 1);
    assert_eq!(m.volume("b").unwrap().source, None);
}

fn put_str(w: &mut Vec<u8>, s: &str) {
    w.extend_from_slice(&(s.len() as u16).to_le_bytes());
    w.extend_from_slice(s.as_bytes());
}

/// An image written from the layout documented on `Meta::encode_image` (version 2, or
/// version 1 without the snapshot fields), independently of the crate's encoder.
fn image(
    version: u8,
    applied: u64,
    next_group: u64,
    next_snapshot: u64,
    nodes: &[Node],
    volumes: &[Volume],
) -> Vec<u8> {
    let mut w = b"CMET".to_vec();
    w.push(version);
    w.extend_from_slice(&applied.to_le_bytes());
    w.extend_from_slice(&next_group.to_le_bytes());
    if version >= 2 {
        w.extend_from_slice(&next_snapshot.to_le_bytes());
    }
    w.extend_from_slice(&(nodes.len() as u32).to_le_bytes());
    for n in nodes {
        w.extend_from_slice(&n.id.to_le_bytes());
        put_str(&mut w, &n.repl_addr);
        put_str(&mut w, &n.client_addr);
        put_str(&mut w, &n.rack);
        w.push(n.state as u8);
    }
    w.extend_from_slice(&(volumes.len() as u32).to_le_bytes());
    for v in volumes {
        put_str(&mut w, &v.name);
        w.extend_from_slice(&v.size_bytes.to_le_bytes());
        w.extend_from_slice(&v.chunk_bytes.to_le_bytes());
        w.extend_from_slice(&v.block_bytes.to_le_bytes());
        w.extend_from_slice(&v.version.to_le_bytes());
        w.push(v.state as u8);
        w.extend_from_slice(&(v.chunks.len() as u32).to_le_bytes());
        for c in &v.chunks {
            w.extend_from_slice(&c.group.to_le_bytes());
            w.push(c.replicas.len() as u8);
            for r in &c.replicas {
                w.extend_from_slice(&r.to_le_bytes());
            }
            match c.moving {
                None => w.push(0),
                Some(m) => {
                    w.push(1);
                    w.extend_from_slice(&m.from.to_le_bytes());
                    w.extend_from_slice(&m.to.to_le_bytes());
                }
            }
        }
        if version < 2 {
            continue;
        }
        match &v.source {
            None => w.push(0),
            Some((src, id)) => {
                w.push(1);
                put_str(&mut w, src);
                w.extend_from_slice(&id.to_le_bytes());
            }
        }
        w.extend_from_slice(&(v.snapshots.len() as u32).to_le_bytes());
        for s in &v.snapshots {
            w.extend_from_slice(&s.id.to_le_bytes());
            put_str(&mut w, &s.name);
            w.push(s.state as u8);
        }
    }
    w.extend_from_slice(&[0; 4]);
    reseal(&mut w);
    w
}

/// Applies commands in turn, each expected to be accepted.
fn run(m: &mut Meta, cmds: &[Command]) {
    for c in cmds {
        m.apply(m.applied() + 1, c)
            .unwrap_or_else(|e| panic!("{c:?} refused: {e}"));
    }
}

/// Nodes 1–3; `db1` (2 MiB, ready) with snapshots 1 `s1` ready, 2 `s2` deleting, 4 `s4`
/// creating; `db2` (1 MiB, ready) with snapshot 3 `t` ready; `c1` creating, cloned from
/// snapshot 1 of `db1`.
fn rich() -> Meta {
    let mut m = Meta::new();
    for id in 1..=3 {
        run(
            &mut m,
            &[Command::RegisterNode {
                id,
                repl_addr: format!("h{id}:1"),
                client_addr: format!("h{id}:2"),
                rack: format!("r{id}"),
            }],
        );
    }
    let chunk = |group| Chunk {
        group,
        replicas: vec![1, 2, 3],
        moving: None,
    };
    let snap = |volume: &str, name: &str| Command::CreateSnapshot {
        volume: volume.into(),
        name: name.into(),
    };
    let ready = |volume: &str, id| Command::SnapshotReady {
        volume: volume.into(),
        id,
    };
    run(
        &mut m,
        &[
            Command::CreateVolume {
                name: "db1".into(),
                size_bytes: 2 * MIB,
                chunk_bytes: MIB,
                block_bytes: 4096,
                chunks: vec![chunk(1), chunk(2)],
            },
            Command::VolumeReady { name: "db1".into() },
            Command::CreateVolume {
                name: "db2".into(),
                size_bytes: MIB,
                chunk_bytes: MIB,
                block_bytes: 4096,
                chunks: vec![chunk(3)],
            },
            Command::VolumeReady { name: "db2".into() },
            snap("db1", "s1"),
            ready("db1", 1),
            snap("db1", "s2"),
            ready("db1", 2),
            Command::DeleteSnapshot {
                volume: "db1".into(),
                id: 2,
            },
            snap("db2", "t"),
            ready("db2", 3),
            snap("db1", "s4"),
            Command::CloneVolume {
                name: "c1".into(),
                source: "db1".into(),
                snapshot: 1,
                chunks: vec![chunk(4), chunk(5)],
            },
        ],
    );
    m.verify().unwrap();
    m
}

#[test]
fn image_layout_matches_the_documentation() {
    let m = rich();
    let nodes: Vec<Node> = m.nodes().values().cloned().collect();
    let volumes: Vec<Volume> = m.volumes().values().cloned().collect();
    let b = image(
        2,
        m.applied(),
        m.next_group(),
        m.next_snapshot(),
        &nodes,
        &volumes,
    );
    assert_eq!(m.encode_image(), b);
    assert_eq!(Meta::decode_image(&b), Ok(m));
}

#[test]
fn version_1_images_still_decode() {
    // A state without snapshots, as version 1 wrote it.
    let mut m = rich();
    let nodes: Vec<Node> = m.nodes().values().cloned().collect();
    let mut volumes: Vec<Volume> = m.volumes().values().cloned().collect();
    volumes.retain(|v| v.source.is_none());
    for v in &mut volumes {
        v.snapshots.clear();
    }
    let v1 = image(1, 77, m.next_group(), 0, &nodes, &volumes);
    let back = Meta::decode_image(&v1).unwrap();
    assert_eq!(back.applied(), 77);
    assert_eq!(back.next_snapshot(), 1);
    assert_eq!(back.nodes(), m.nodes());
    assert_eq!(
        back.volumes().values().cloned().collect::<Vec<_>>(),
        volumes
    );
    // It encodes as version 2, and reads back the same.
    let v2 = back.encode_image();
    assert_eq!(v2[4], 2);
    assert_eq!(Meta::decode_image(&v2), Ok(back.clone()));
    // Its state works on: a first snapshot gets id 1.
    let mut back = back;
    run(
        &mut back,
        &[Command::CreateSnapshot {
            volume: "db1".into(),
            name: "x".into(),
        }],
    );
    assert_eq!(back.snapshot_tag("db1"), 1);
    // A version-1 image with version-2 fields is refused, as is an unknown version.
    m = rich();
    let mut b = m.encode_image();
    b[4] = 1;
    reseal(&mut b);
    assert!(Meta::decode_image(&b).is_err());
    for version in [0, 3, 255] {
        b[4] = version;
        reseal(&mut b);
        assert_eq!(
            Meta::decode_image(&b),
            Err(DecodeError::BadVersion {
                what: "image",
                found: version,
                want: 2
            })
        );
    }
}

#[test]
fn damaged_snapshot_fields_are_refused() {
    // One node, volume `v` with snapshot 1 `s` ready: its image ends with
    // `u8 has_source (0) | u32 count (1) | u64 id | u16 len (1) | "s" | u8 state | CRC`.
    let mut m = Meta::new();
    run(
        &mut m,
        &[
            Command::RegisterNode {
                id: 1,
                repl_addr: "a".into(),
                client_addr: "b".into(),
                rack: String::new(),
            },
            Command::CreateVolume {
                name: "v".into(),
                size_bytes: MIB,
                chunk_bytes: MIB,
                block_bytes: 4096,
                chunks: vec![Chunk {
                    group: 1,
                    replicas: vec![1],
                    moving: None,
                }],
            },
            Command::VolumeReady { name: "v".into() },
            Command::CreateSnapshot {
                volume: "v".into(),
                name: "s".into(),
            },
            Command::SnapshotReady {
                volume: "v".into(),
                id: 1,
            },
        ],
    );
    let image = m.encode_image();
    let n = image.len();
    assert_eq!(image[n - 21], 0, "has_source");
    assert_eq!(
        &image[n - 20..n - 16],
        &1u32.to_le_bytes(),
        "snapshot count"
    );
    assert_eq!(image[n - 5], 1, "snapshot state");
    let edit = |at: usize, bytes: &[u8]| {
        let mut b = image.clone();
        b[at..at + bytes.len()].copy_from_slice(bytes);
        reseal(&mut b);
        Meta::decode_image(&b)
    };
    assert!(matches!(
        edit(n - 21, &[2]),
        Err(DecodeError::BadCode {
            field: "volume.has_source",
            code: 2,
            ..
        })
    ));
    // has_source 1 then reads the snapshot count as a name: runs out of bytes.
    assert!(edit(n - 21, &[1]).is_err());
    assert!(matches!(
        edit(n - 5, &[7]),
        Err(DecodeError::BadCode {
            field: "snapshot.state",
            code: 7,
            ..
        })
    ));
    assert!(matches!(
        edit(n - 20, &u32::MAX.to_le_bytes()),
        Err(DecodeError::BadCount {
            field: "volume.snapshots",
            count: 0xffff_ffff,
            ..
        })
    ));
    assert!(matches!(
        edit(n - 20, &2u32.to_le_bytes()),
        Err(DecodeError::BadCount { .. } | DecodeError::Truncated { .. })
    ));
    // The snapshot's name made invalid UTF-8.
    assert!(matches!(
        edit(n - 6, &[0xff]),
        Err(DecodeError::BadUtf8 {
            field: "snapshot.name",
            ..
        })
    ));
    // next_snapshot (offset 21) lowered to 1: snapshot 1 is no longer below it.
    assert!(matches!(
        edit(21, &1u64.to_le_bytes()),
        Err(DecodeError::Inconsistent(_))
    ));
    // Every cut and every flipped byte is refused.
    for i in 0..n {
        assert!(Meta::decode_image(&image[..i]).is_err(), "cut at {i}");
        let mut d = image.clone();
        d[i] ^= 0x5a;
        assert!(Meta::decode_image(&d).is_err(), "byte {i} flipped");
    }
}

#[test]
fn verify_catches_broken_snapshot_invariants() {
    let m = rich();
    let nodes: Vec<Node> = m.nodes().values().cloned().collect();
    let forged = |f: &dyn Fn(&mut u64, &mut Vec<Volume>)| {
        let mut next = m.next_snapshot();
        let mut volumes: Vec<Volume> = m.volumes().values().cloned().collect();
        f(&mut next, &mut volumes);
        let b = image(2, m.applied(), m.next_group(), next, &nodes, &volumes);
        match Meta::decode_image(&b) {
            Err(DecodeError::Inconsistent(MetaError::Inconsistent { detail })) => detail,
            other => panic!("forged image gives {other:?}"),
        }
    };
    // Volumes in name order: 0 c1, 1 db1, 2 db2.
    type Forge = Box<dyn Fn(&mut u64, &mut Vec<Volume>)>;
    let cases: Vec<(&str, Forge)> = vec![
        ("next_snapshot 0 is below 1", Box::new(|n, _| *n = 0)),
        (
            "snapshot 4 of volume `db1` is outside 1..4",
            Box::new(|n, _| *n = 4),
        ),
        (
            "snapshot 0 of volume `db1` is outside",
            Box::new(|_, v| v[1].snapshots[1].id = 0),
        ),
        ("out of order", Box::new(|_, v| v[1].snapshots.swap(0, 1))),
        (
            "snapshot id 3 appears twice",
            Box::new(|_, v| v[1].snapshots[2].id = 3),
        ),
        (
            "two snapshots named `s1`",
            Box::new(|_, v| v[1].snapshots[1].name = "s1".into()),
        ),
        (
            "snapshot name `a b` is invalid",
            Box::new(|_, v| v[2].snapshots[0].name = "a b".into()),
        ),
        (
            "taking snapshots 1 and 4 at once",
            Box::new(|_, v| {
                v[1].snapshots[0].state = SnapshotState::Creating;
                v[0].source = None;
            }),
        ),
        (
            "creating volume `c1` has snapshots",
            Box::new(|n, v| {
                v[0].snapshots.push(Snapshot {
                    id: *n,
                    name: "x".into(),
                    state: SnapshotState::Ready,
                });
                *n += 1;
            }),
        ),
        (
            "clone `db2` of snapshot 1 of `db1` is ready, not creating",
            Box::new(|_, v| v[2].source = Some(("db1".into(), 1))),
        ),
        (
            "no such source volume",
            Box::new(|_, v| v[0].source = Some(("zz".into(), 1))),
        ),
        (
            "no such source volume",
            Box::new(|_, v| v[0].source = Some(("c1".into(), 1))),
        ),
        (
            "no such snapshot",
            Box::new(|_, v| v[0].source = Some(("db1".into(), 9))),
        ),
        (
            "the snapshot is deleting, not ready",
            Box::new(|_, v| v[0].source = Some(("db1".into(), 2))),
        ),
        (
            "the snapshot is creating, not ready",
            Box::new(|_, v| v[0].source = Some(("db1".into(), 4))),
        ),
        (
            "the source is deleting",
            Box::new(|_, v| v[1].state = VolumeState::Deleting),
        ),
        (
            "does not fit",
            Box::new(|_, v| {
                v[0].source = Some(("db2".into(), 3));
            }),
        ),
        ("does not fit", Box::new(|_, v| v[0].block_bytes = 8192)),
    ];
    for (want, f) in cases {
        let detail = forged(&*f);
        assert!(detail.contains(want), "wanted {want:?}, got {detail:?}");
    }
}
