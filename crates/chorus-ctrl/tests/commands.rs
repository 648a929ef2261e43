//! Each command's accepted effect and each of its rejections; a rejection changes nothing
//! but the applied position.

use chorus_ctrl::{Chunk, Command, Meta, MetaError, Move, NodeState, VolumeState};

/// Applies commands in turn at positions after the last, each expected to be accepted.
fn run(m: &mut Meta, cmds: &[Command]) {
    for c in cmds {
        let pos = m.applied() + 1;
        m.apply(pos, c)
            .unwrap_or_else(|e| panic!("{c:?} refused: {e}"));
        m.verify().expect("invariants hold");
    }
}

/// Applies `cmd`, expecting it refused with nothing but `applied` changed, and returns
/// the error.
fn refused(m: &mut Meta, cmd: Command) -> MetaError {
    let before = m.clone();
    assert!(m.check(&cmd).is_err(), "check accepts {cmd:?}");
    let pos = m.applied() + 1;
    let err = m.apply(pos, &cmd).expect_err("command refused");
    assert_eq!(m.applied(), pos);
    assert_eq!(m.nodes(), before.nodes());
    assert_eq!(m.volumes(), before.volumes());
    assert_eq!(m.next_group(), before.next_group());
    assert_eq!(m.next_snapshot(), before.next_snapshot());
    err
}

fn register(id: u64, rack: &str) -> Command {
    Command::RegisterNode {
        id,
        repl_addr: format!("10.0.0.{id}:7000"),
        client_addr: format!("10.0.0.{id}:7001"),
        rack: rack.into(),
    }
}

fn chunk(group: u64, replicas: &[u64]) -> Chunk {
    Chunk {
        group,
        replicas: replicas.to_vec(),
        moving: None,
    }
}

fn create(name: &str, size_bytes: u64, chunks: Vec<Chunk>) -> Command {
    Command::CreateVolume {
        name: name.into(),
        size_bytes,
        chunk_bytes: 1 << 20,
        block_bytes: 64 << 10,
        chunks,
    }
}

const MIB: u64 = 1 << 20;

/// Nodes 1–5 (racks a, b, c, "", a) and volume `db1` (2.5 MiB: chunks 1, 2, 3), ready.
fn cluster() -> Meta {
    let mut m = Meta::new();
    run(
        &mut m,
        &[
            register(1, "a"),
            register(2, "b"),
            register(3, "c"),
            register(4, ""),
            register(5, "a"),
            create(
                "db1",
                5 * MIB / 2,
                vec![
                    chunk(1, &[1, 2, 3]),
                    chunk(2, &[2, 3, 4]),
                    chunk(3, &[3, 4, 1]),
                ],
            ),
            Command::VolumeReady { name: "db1".into() },
        ],
    );
    m
}

fn version(m: &Meta) -> u64 {
    m.volume("db1").expect("db1").version
}

#[test]
fn positions_must_increase() {
    let mut m = cluster();
    let at = m.applied();
    let before = m.clone();
    let err = m.apply(at, &register(9, "z")).unwrap_err();
    assert_eq!(
        err,
        MetaError::Replayed {
            pos: at,
            applied: at
        }
    );
    assert_eq!(m, before);
    assert!(matches!(
        m.apply(1, &register(9, "z")),
        Err(MetaError::Replayed { pos: 1, .. })
    ));
    // A gap is fine: positions need only increase.
    m.apply(at + 10, &register(9, "z")).unwrap();
    assert_eq!(m.applied(), at + 10);
}

#[test]
fn register_node() {
    let mut m = cluster();
    let n = m.node(4).unwrap();
    assert_eq!(n.state, NodeState::Up);
    assert_eq!(n.repl_addr, "10.0.0.4:7000");
    // Re-registering updates addresses and rack, keeps the state.
    run(
        &mut m,
        &[
            Command::SetNodeState {
                id: 4,
                state: NodeState::Draining,
            },
            Command::RegisterNode {
                id: 4,
                repl_addr: "h4:1".into(),
                client_addr: "h4:2".into(),
                rack: "d".into(),
            },
        ],
    );
    let n = m.node(4).unwrap();
    assert_eq!(
        (
            n.repl_addr.as_str(),
            n.client_addr.as_str(),
            n.rack.as_str()
        ),
        ("h4:1", "h4:2", "d")
    );
    assert_eq!(n.state, NodeState::Draining);

    assert!(matches!(
        refused(&mut m, register(0, "a")),
        MetaError::BadNode { id: 0, .. }
    ));
    let mut empty = register(6, "a");
    if let Command::RegisterNode { repl_addr, .. } = &mut empty {
        repl_addr.clear();
    }
    let e = refused(&mut m, empty);
    assert!(e.to_string().contains("repl_addr"), "{e}");
    assert!(matches!(
        refused(&mut m, register(6, &"r".repeat(65))),
        MetaError::BadNode { id: 6, .. }
    ));
    run(
        &mut m,
        &[Command::SetNodeState {
            id: 5,
            state: NodeState::Removed,
        }],
    );
    let e = refused(&mut m, register(5, "a"));
    assert_eq!(e, MetaError::NodeRemoved { id: 5 });
    assert_eq!(e.to_string(), "node 5 is removed");
}

#[test]
fn set_node_state() {
    let mut m = cluster();
    for state in [NodeState::Draining, NodeState::Up, NodeState::Removed] {
        run(&mut m, &[Command::SetNodeState { id: 2, state }]);
        assert_eq!(m.node(2).unwrap().state, state);
    }
    // Removed is final.
    assert_eq!(
        refused(
            &mut m,
            Command::SetNodeState {
                id: 2,
                state: NodeState::Up
            }
        ),
        MetaError::NodeRemoved { id: 2 }
    );
    let e = refused(
        &mut m,
        Command::SetNodeState {
            id: 7,
            state: NodeState::Up,
        },
    );
    assert_eq!(e.to_string(), "node 7 is not registered");
}

#[test]
fn create_volume() {
    let m = cluster();
    let v = m.volume("db1").unwrap();
    assert_eq!(v.version, 1);
    assert_eq!(v.chunks.len(), 3);
    assert_eq!(m.next_group(), 4);
    assert_eq!(
        m.chunk(2).map(|(v, i, _)| (v.name.as_str(), i)),
        Some(("db1", 1))
    );
    assert_eq!(m.load(3), 3);
    assert_eq!(m.load(5), 0);
    assert_eq!(m.leader_load(1), 1);

    let mut fresh = Meta::new();
    run(
        &mut fresh,
        &[register(1, ""), create("x", MIB, vec![chunk(7, &[1])])],
    );
    assert_eq!(fresh.volume("x").unwrap().state, VolumeState::Creating);
    // Groups jump: next_group follows the highest used.
    assert_eq!(fresh.next_group(), 8);
}

#[test]
fn create_volume_rejections() {
    let mut m = cluster();
    let ok = |name: &str| create(name, MIB, vec![chunk(4, &[1, 2])]);
    let e = refused(&mut m, ok("db1"));
    assert_eq!(e.to_string(), "volume `db1` already exists");
    for bad in ["", "has space", "slash/", "ü", &"n".repeat(65)] {
        assert!(matches!(
            refused(&mut m, ok(bad)),
            MetaError::BadName { .. }
        ));
    }
    let geometry = |size_bytes, chunk_bytes, block_bytes| Command::CreateVolume {
        name: "g".into(),
        size_bytes,
        chunk_bytes,
        block_bytes,
        chunks: vec![chunk(4, &[1])],
    };
    for (size, chunk_bytes, block) in [
        (0, MIB, 4096),            // empty
        (MIB, 0, 4096),            // zero chunk
        (MIB, MIB, 2048),          // block too small
        (MIB, MIB, 12288),         // not a power of two
        (MIB, MIB + 4096, 8192),   // chunk not a multiple of the block
        (MIB, 1 << 50, 4096),      // too many blocks per chunk
        (MIB, 32 << 20, 32 << 20), // block too large
    ] {
        assert!(
            matches!(
                refused(&mut m, geometry(size, chunk_bytes, block)),
                MetaError::BadGeometry { .. }
            ),
            "{size} {chunk_bytes} {block}"
        );
    }
    let chunks = |cs: Vec<Chunk>| create("v", 2 * MIB, cs);
    let cases = vec![
        vec![chunk(4, &[1])],                                 // too few
        vec![chunk(4, &[1]), chunk(5, &[1]), chunk(6, &[1])], // too many
        vec![chunk(3, &[1]), chunk(4, &[1])],                 // group already used
        vec![chunk(4, &[1]), chunk(4, &[2])],                 // group twice
        vec![chunk(4, &[1]), chunk(u64::MAX, &[2])],          // reserved group
        vec![chunk(4, &[]), chunk(5, &[1])],                  // no replicas
        vec![chunk(4, &[1, 1]), chunk(5, &[1])],              // replica twice
        vec![chunk(4, &[1; 17]), chunk(5, &[1])],             // too many replicas
        vec![
            Chunk {
                group: 4,
                replicas: vec![1],
                moving: Some(Move { from: 1, to: 2 }),
            },
            chunk(5, &[1]),
        ],
    ];
    for cs in cases {
        let e = refused(&mut m, chunks(cs.clone()));
        assert!(matches!(e, MetaError::BadChunks { .. }), "{cs:?}: {e}");
    }
    assert_eq!(
        refused(&mut m, chunks(vec![chunk(4, &[1]), chunk(5, &[9])])),
        MetaError::NoSuchNode { id: 9 }
    );
    run(
        &mut m,
        &[Command::SetNodeState {
            id: 5,
            state: NodeState::Removed,
        }],
    );
    assert_eq!(
        refused(&mut m, chunks(vec![chunk(4, &[1]), chunk(5, &[5])])),
        MetaError::NodeRemoved { id: 5 }
    );
    // A draining node may still be named (placement avoids it, the command does not).
    run(
        &mut m,
        &[
            Command::SetNodeState {
                id: 4,
                state: NodeState::Draining,
            },
            chunks(vec![chunk(4, &[4]), chunk(5, &[1])]),
        ],
    );
}

#[test]
fn volume_ready() {
    let mut m = cluster();
    let e = refused(&mut m, Command::VolumeReady { name: "db1".into() });
    assert_eq!(e.to_string(), "volume `db1` is ready, not creating");
    assert_eq!(
        refused(&mut m, Command::VolumeReady { name: "no".into() }),
        MetaError::NoSuchVolume { name: "no".into() }
    );
    assert_eq!(version(&m), 1);
}

#[test]
fn grow_volume() {
    let mut m = cluster();
    // Within the last chunk: no new chunks, the size and version step.
    run(
        &mut m,
        &[Command::GrowVolume {
            name: "db1".into(),
            size_bytes: 3 * MIB,
            chunks: vec![],
        }],
    );
    assert_eq!(version(&m), 2);
    run(
        &mut m,
        &[Command::GrowVolume {
            name: "db1".into(),
            size_bytes: 5 * MIB,
            chunks: vec![chunk(4, &[1, 2, 3]), chunk(5, &[2, 3, 4])],
        }],
    );
    let v = m.volume("db1").unwrap();
    assert_eq!((v.size_bytes, v.chunks.len(), v.version), (5 * MIB, 5, 3));
    assert_eq!(m.chunk(5).map(|(_, i, _)| i), Some(4));
    assert_eq!(m.next_group(), 6);

    let grow = |size_bytes, chunks| Command::GrowVolume {
        name: "db1".into(),
        size_bytes,
        chunks,
    };
    assert_eq!(
        refused(&mut m, grow(5 * MIB, vec![])),
        MetaError::NotLarger {
            name: "db1".into(),
            size_bytes: 5 * MIB,
            requested_bytes: 5 * MIB
        }
    );
    assert!(matches!(
        refused(&mut m, grow(6 * MIB, vec![])),
        MetaError::BadChunks { .. }
    ));
    assert!(matches!(
        refused(&mut m, grow(6 * MIB, vec![chunk(5, &[1])])),
        MetaError::BadChunks { .. }
    ));
    run(&mut m, &[Command::DeleteVolume { name: "db1".into() }]);
    assert!(matches!(
        refused(&mut m, grow(6 * MIB, vec![chunk(6, &[1])])),
        MetaError::WrongState {
            state: VolumeState::Deleting,
            ..
        }
    ));
}

#[test]
fn delete_and_gone() {
    let mut m = cluster();
    assert!(matches!(
        refused(&mut m, Command::VolumeGone { name: "db1".into() }),
        MetaError::WrongState { .. }
    ));
    run(&mut m, &[Command::DeleteVolume { name: "db1".into() }]);
    let v = m.volume("db1").unwrap();
    assert_eq!((v.state, v.version), (VolumeState::Deleting, 2));
    assert!(matches!(
        refused(&mut m, Command::DeleteVolume { name: "db1".into() }),
        MetaError::WrongState { .. }
    ));
    run(&mut m, &[Command::VolumeGone { name: "db1".into() }]);
    assert!(m.volume("db1").is_none());
    assert!(m.chunk(1).is_none());
    // Group ids are not reused.
    assert_eq!(m.next_group(), 4);
    assert_eq!(
        refused(&mut m, Command::DeleteVolume { name: "db1".into() }),
        MetaError::NoSuchVolume { name: "db1".into() }
    );
    // A creating volume may be deleted too.
    run(
        &mut m,
        &[
            create("c", MIB, vec![chunk(4, &[1])]),
            Command::DeleteVolume { name: "c".into() },
        ],
    );
}

#[test]
fn moves() {
    let mut m = cluster();
    run(
        &mut m,
        &[Command::StartMove {
            group: 1,
            from: 2,
            to: 5,
        }],
    );
    let c = m.chunk(1).unwrap().2.clone();
    assert_eq!(c.replicas, vec![1, 2, 3]);
    assert_eq!(c.moving, Some(Move { from: 2, to: 5 }));
    assert_eq!(m.load(5), 1, "a move's destination counts");
    assert_eq!(version(&m), 2);
    assert_eq!(
        refused(
            &mut m,
            Command::StartMove {
                group: 1,
                from: 3,
                to: 4
            }
        ),
        MetaError::Moving { group: 1 }
    );
    let e = refused(
        &mut m,
        Command::FinishMove {
            group: 1,
            from: 2,
            to: 4,
        },
    );
    assert_eq!(e.to_string(), "chunk group 1 is moving 2 -> 5, not 2 -> 4");
    run(
        &mut m,
        &[Command::FinishMove {
            group: 1,
            from: 2,
            to: 5,
        }],
    );
    let c = m.chunk(1).unwrap().2;
    assert_eq!((c.replicas.clone(), c.moving), (vec![1, 5, 3], None));
    assert_eq!(version(&m), 3);
    assert_eq!(
        refused(
            &mut m,
            Command::FinishMove {
                group: 1,
                from: 2,
                to: 5
            }
        ),
        MetaError::NotMoving { group: 1 }
    );
    assert_eq!(
        refused(&mut m, Command::AbortMove { group: 1 }),
        MetaError::NotMoving { group: 1 }
    );
    run(
        &mut m,
        &[
            Command::StartMove {
                group: 2,
                from: 2,
                to: 1,
            },
            Command::AbortMove { group: 2 },
        ],
    );
    let c = m.chunk(2).unwrap().2;
    assert_eq!((c.replicas.clone(), c.moving), (vec![2, 3, 4], None));
    assert_eq!(version(&m), 5);
}

#[test]
fn move_rejections() {
    let mut m = cluster();
    let start = |group, from, to| Command::StartMove { group, from, to };
    assert_eq!(
        refused(&mut m, start(9, 1, 5)),
        MetaError::NoSuchChunk { group: 9 }
    );
    assert_eq!(
        refused(&mut m, start(1, 4, 5)),
        MetaError::NotAReplica { group: 1, node: 4 }
    );
    assert_eq!(
        refused(&mut m, start(1, 1, 2)),
        MetaError::AlreadyReplica { group: 1, node: 2 }
    );
    assert_eq!(
        refused(&mut m, start(1, 1, 1)),
        MetaError::AlreadyReplica { group: 1, node: 1 }
    );
    assert_eq!(
        refused(&mut m, start(1, 1, 8)),
        MetaError::NoSuchNode { id: 8 }
    );
    run(
        &mut m,
        &[Command::SetNodeState {
            id: 5,
            state: NodeState::Draining,
        }],
    );
    let e = refused(&mut m, start(1, 1, 5));
    assert_eq!(e.to_string(), "node 5 is draining, not up");
    // A destination removed mid-move cannot become a voter; the move is aborted instead.
    run(
        &mut m,
        &[
            start(1, 1, 4),
            Command::SetNodeState {
                id: 4,
                state: NodeState::Removed,
            },
        ],
    );
    assert_eq!(
        refused(
            &mut m,
            Command::FinishMove {
                group: 1,
                from: 1,
                to: 4
            }
        ),
        MetaError::NodeRemoved { id: 4 }
    );
    run(&mut m, &[Command::AbortMove { group: 1 }]);
    // No new moves in a deleting volume; a started one may still finish.
    run(
        &mut m,
        &[start(2, 4, 1), Command::DeleteVolume { name: "db1".into() }],
    );
    assert!(matches!(
        refused(&mut m, start(3, 3, 2)),
        MetaError::WrongState { .. }
    ));
    run(
        &mut m,
        &[Command::FinishMove {
            group: 2,
            from: 4,
            to: 1,
        }],
    );
}

#[test]
fn set_preferred_leader() {
    let mut m = cluster();
    run(&mut m, &[Command::SetPreferredLeader { group: 2, node: 4 }]);
    assert_eq!(m.chunk(2).unwrap().2.replicas, vec![4, 2, 3]);
    assert_eq!(version(&m), 2);
    // Already preferred: accepted, no change, no version step.
    run(&mut m, &[Command::SetPreferredLeader { group: 2, node: 4 }]);
    assert_eq!(version(&m), 2);
    assert_eq!(
        refused(&mut m, Command::SetPreferredLeader { group: 2, node: 1 }),
        MetaError::NotAReplica { group: 2, node: 1 }
    );
    assert_eq!(
        refused(&mut m, Command::SetPreferredLeader { group: 99, node: 1 }),
        MetaError::NoSuchChunk { group: 99 }
    );
    run(&mut m, &[Command::DeleteVolume { name: "db1".into() }]);
    assert!(matches!(
        refused(&mut m, Command::SetPreferredLeader { group: 2, node: 2 }),
        MetaError::WrongState { .. }
    ));
}

#[test]
fn image_round_trip_and_forged_images() {
    let mut m = cluster();
    run(
        &mut m,
        &[Command::StartMove {
            group: 3,
            from: 4,
            to: 2,
        }],
    );
    let image = m.encode_image();
    let back = Meta::decode_image(&image).unwrap();
    assert_eq!(back, m);
    assert_eq!(back.chunk(3).map(|(_, i, _)| i), Some(2));
    assert_eq!(
        Meta::decode_image(&Meta::new().encode_image()).unwrap(),
        Meta::new()
    );
}
