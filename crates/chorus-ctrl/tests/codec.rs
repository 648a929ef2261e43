//! The byte formats: commands and images round-trip; decoders are total (every damaged,
//! cut or arbitrary input is an error or a canonical value, never a panic); applying is
//! deterministic.

use chorus_ctrl::{Chunk, Command, DecodeError, Meta, Move, NodeState};
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
}

const NAMES: [&str; 4] = ["a", "b", "c", "bad name"];
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
        1 => name().prop_map(Intent::Ready),
        1 => (name(), 0..3usize, reps()).prop_map(|(n, c, r)| Intent::Grow(n, c, r)),
        1 => name().prop_map(Intent::Delete),
        1 => name().prop_map(Intent::Gone),
        2 => (any::<usize>(), 0..3usize, 0..7u64).prop_map(|(g, f, t)| Intent::StartMove(g, f, t)),
        2 => (any::<usize>(), any::<bool>()).prop_map(|(g, ok)| Intent::FinishMove(g, ok)),
        1 => any::<usize>().prop_map(Intent::Abort),
        1 => (any::<usize>(), 0..3usize).prop_map(|(g, r)| Intent::Lead(g, r)),
    ]
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
            name: NAMES[n].into(),
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
    }
}

/// Resolves intents, after registering nodes 1–4, against a state as it evolves;
/// returns the commands, the state and how many commands it accepted.
fn commands(intents: &[Intent]) -> (Vec<Command>, Meta, usize) {
    let mut m = Meta::new();
    let mut out = Vec::new();
    let mut accepted = 0;
    let prefix = (1..=4).map(|id| Intent::Register(id, id as usize % RACKS.len()));
    let all: Vec<Intent> = prefix.chain(intents.iter().cloned()).collect();
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
        kind in 0..13u8,
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
        let mut img = b"CMET\x01".to_vec();
        img.extend_from_slice(&body);
        img.extend_from_slice(&[0; 4]);
        reseal(&mut img);
        if let Ok(m) = Meta::decode_image(&img) {
            prop_assert_eq!(m.encode_image(), img);
        }
    }

    #[test]
    fn image_round_trips_and_apply_is_deterministic(
        intents in prop::collection::vec(intent(), 1..60),
    ) {
        let (cmds, m, _) = commands(&intents);
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
    let (_, m, accepted) = commands(&runner_intents);
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
    // The volume's version set to 0. From the end: CRC (4), the chunk (group 8, count 1,
    // replica 8, moving 1), the chunk count (4), the state (1), then the version (8).
    let mut b = image.clone();
    let at = b.len() - 4 - 18 - 4 - 1 - 8;
    assert_eq!(&b[at..at + 8], &1u64.to_le_bytes());
    b[at..at + 8].copy_from_slice(&0u64.to_le_bytes());
    reseal(&mut b);
    assert!(matches!(
        Meta::decode_image(&b),
        Err(DecodeError::Inconsistent(_))
    ));
}
