//! Snapshots and clones (PolarFS section 7.2, disk-outage-consistent snapshots): each
//! command's accepted effect and each of its rejections; a rejection changes nothing but
//! the applied position.

use chorus_ctrl::{Chunk, Command, Meta, MetaError, Snapshot, SnapshotState, VolumeState};

const MIB: u64 = 1 << 20;

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

fn chunk(group: u64, replicas: &[u64]) -> Chunk {
    Chunk {
        group,
        replicas: replicas.to_vec(),
        moving: None,
    }
}

/// `count` chunks from group `first` on, on nodes 1–3.
fn chunks(first: u64, count: u64) -> Vec<Chunk> {
    (first..first + count)
        .map(|g| chunk(g, &[1, 2, 3]))
        .collect()
}

fn create(name: &str, size_bytes: u64, chunks: Vec<Chunk>) -> Command {
    Command::CreateVolume {
        name: name.into(),
        size_bytes,
        chunk_bytes: MIB,
        block_bytes: 64 << 10,
        chunks,
    }
}

fn snap(volume: &str, name: &str) -> Command {
    Command::CreateSnapshot {
        volume: volume.into(),
        name: name.into(),
    }
}

fn ready(volume: &str, id: u64) -> Command {
    Command::SnapshotReady {
        volume: volume.into(),
        id,
    }
}

fn delete(volume: &str, id: u64) -> Command {
    Command::DeleteSnapshot {
        volume: volume.into(),
        id,
    }
}

fn gone(volume: &str, id: u64) -> Command {
    Command::SnapshotGone {
        volume: volume.into(),
        id,
    }
}

fn clone(name: &str, source: &str, snapshot: u64, chunks: Vec<Chunk>) -> Command {
    Command::CloneVolume {
        name: name.into(),
        source: source.into(),
        snapshot,
        chunks,
    }
}

/// Nodes 1–3 and volume `db1` (2.5 MiB: chunks 1, 2, 3), ready.
fn cluster() -> Meta {
    let mut m = Meta::new();
    for id in 1..=3 {
        run(
            &mut m,
            &[Command::RegisterNode {
                id,
                repl_addr: format!("10.0.0.{id}:7000"),
                client_addr: format!("10.0.0.{id}:7001"),
                rack: String::new(),
            }],
        );
    }
    run(
        &mut m,
        &[
            create("db1", 5 * MIB / 2, chunks(1, 3)),
            Command::VolumeReady { name: "db1".into() },
        ],
    );
    m
}

/// [`cluster`] with snapshot 1 `s1` of `db1` ready.
fn with_snapshot() -> Meta {
    let mut m = cluster();
    run(&mut m, &[snap("db1", "s1"), ready("db1", 1)]);
    m
}

fn version(m: &Meta, name: &str) -> u64 {
    m.volume(name).expect("volume").version
}

fn snapshots(m: &Meta, name: &str) -> Vec<(u64, String, SnapshotState)> {
    m.volume(name)
        .expect("volume")
        .snapshots
        .iter()
        .map(|s| (s.id, s.name.clone(), s.state))
        .collect()
}

#[test]
fn create_and_ready() {
    let mut m = cluster();
    assert_eq!(m.next_snapshot(), 1);
    assert_eq!(m.snapshot_tag("db1"), 0);
    run(&mut m, &[snap("db1", "s1")]);
    let v = m.volume("db1").unwrap();
    assert_eq!(
        v.snapshots,
        vec![Snapshot {
            id: 1,
            name: "s1".into(),
            state: SnapshotState::Creating
        }]
    );
    assert_eq!(v.version, 2, "clients learn the write tag");
    assert_eq!(v.snapshot(1).map(|s| s.name.as_str()), Some("s1"));
    assert_eq!(v.snapshot_named("s1").map(|s| s.id), Some(1));
    assert!(v.snapshot(2).is_none() && v.snapshot_named("s2").is_none());
    assert_eq!(m.next_snapshot(), 2);
    assert_eq!(m.snapshot_tag("db1"), 1);
    assert_eq!(m.snapshot_tag("nope"), 0);

    run(&mut m, &[ready("db1", 1)]);
    assert_eq!(
        snapshots(&m, "db1"),
        vec![(1, "s1".into(), SnapshotState::Ready)]
    );
    assert_eq!(version(&m, "db1"), 3, "clients learn to stop tagging");
    assert_eq!(m.snapshot_tag("db1"), 0);

    // Ids are unique across volumes: another volume's snapshot gets the next one, and
    // two volumes may each take one at once.
    run(
        &mut m,
        &[
            create("db2", MIB, chunks(4, 1)),
            Command::VolumeReady { name: "db2".into() },
            snap("db2", "s1"),
            snap("db1", "s2"),
        ],
    );
    assert_eq!(m.snapshot_tag("db2"), 2);
    assert_eq!(m.snapshot_tag("db1"), 3);
    assert_eq!(m.next_snapshot(), 4);
    assert_eq!(
        snapshots(&m, "db1"),
        vec![
            (1, "s1".into(), SnapshotState::Ready),
            (3, "s2".into(), SnapshotState::Creating)
        ]
    );
    assert_eq!(SnapshotState::Creating.to_string(), "creating");
    assert_eq!(SnapshotState::Ready.to_string(), "ready");
    assert_eq!(SnapshotState::Deleting.to_string(), "deleting");
}

#[test]
fn create_rejections() {
    let mut m = with_snapshot();
    assert_eq!(
        refused(&mut m, snap("nope", "s")),
        MetaError::NoSuchVolume {
            name: "nope".into()
        }
    );
    for bad in ["", "has space", "slash/", "ü", &"n".repeat(65)] {
        let e = refused(&mut m, snap("db1", bad));
        assert!(matches!(e, MetaError::BadSnapshotName { .. }), "{bad}: {e}");
        assert!(e.to_string().starts_with("snapshot name"), "{e}");
    }
    // 64 bytes is fine.
    run(&mut m, &[snap("db1", &"n".repeat(64)), ready("db1", 2)]);
    let e = refused(&mut m, snap("db1", "s1"));
    assert_eq!(
        e.to_string(),
        "volume `db1` already has a snapshot named `s1`"
    );
    // A deleting snapshot still holds its name.
    run(&mut m, &[delete("db1", 1)]);
    assert!(matches!(
        refused(&mut m, snap("db1", "s1")),
        MetaError::SnapshotExists { .. }
    ));
    // One at a time per volume.
    run(&mut m, &[snap("db1", "s3")]);
    let e = refused(&mut m, snap("db1", "s4"));
    assert_eq!(
        e,
        MetaError::SnapshotInProgress {
            volume: "db1".into(),
            id: 3
        }
    );
    assert_eq!(e.to_string(), "volume `db1` is already taking snapshot 3");

    // Only of a ready volume.
    run(&mut m, &[create("c", MIB, chunks(4, 1))]);
    let e = refused(&mut m, snap("c", "s"));
    assert_eq!(e.to_string(), "volume `c` is creating, not ready");
    run(&mut m, &[Command::DeleteVolume { name: "c".into() }]);
    let e = refused(&mut m, snap("c", "s"));
    assert_eq!(e.to_string(), "volume `c` is deleting, not ready");
}

#[test]
fn ready_rejections() {
    let mut m = with_snapshot();
    assert!(matches!(
        refused(&mut m, ready("nope", 1)),
        MetaError::NoSuchVolume { .. }
    ));
    assert_eq!(
        refused(&mut m, ready("db1", 9)),
        MetaError::NoSuchSnapshot {
            volume: "db1".into(),
            id: 9
        }
    );
    let e = refused(&mut m, ready("db1", 1));
    assert_eq!(
        e.to_string(),
        "snapshot 1 of volume `db1` is ready, not creating"
    );
    // Another volume's snapshot id is not this volume's.
    run(
        &mut m,
        &[
            create("db2", MIB, chunks(4, 1)),
            Command::VolumeReady { name: "db2".into() },
            snap("db2", "s"),
        ],
    );
    assert_eq!(
        refused(&mut m, ready("db1", 2)),
        MetaError::NoSuchSnapshot {
            volume: "db1".into(),
            id: 2
        }
    );
    // A volume being deleted abandons the snapshot it was taking.
    run(&mut m, &[Command::DeleteVolume { name: "db2".into() }]);
    assert!(matches!(
        refused(&mut m, ready("db2", 2)),
        MetaError::WrongState {
            state: VolumeState::Deleting,
            ..
        }
    ));
}

#[test]
fn delete_and_gone() {
    let mut m = with_snapshot();
    let v = version(&m, "db1");
    run(&mut m, &[delete("db1", 1)]);
    assert_eq!(
        snapshots(&m, "db1"),
        vec![(1, "s1".into(), SnapshotState::Deleting)]
    );
    assert_eq!(version(&m, "db1"), v, "routing clients are not concerned");
    let e = refused(&mut m, delete("db1", 1));
    assert_eq!(
        e.to_string(),
        "snapshot 1 of volume `db1` is deleting, not ready"
    );
    run(&mut m, &[gone("db1", 1)]);
    assert!(snapshots(&m, "db1").is_empty());
    assert_eq!(version(&m, "db1"), v);
    assert_eq!(m.next_snapshot(), 2);
    assert_eq!(
        refused(&mut m, gone("db1", 1)),
        MetaError::NoSuchSnapshot {
            volume: "db1".into(),
            id: 1
        }
    );
    // The name is free again; the id is not reused.
    run(&mut m, &[snap("db1", "s1")]);
    assert_eq!(
        snapshots(&m, "db1"),
        vec![(2, "s1".into(), SnapshotState::Creating)]
    );
    // Not while being taken, nor gone before being deleted.
    let e = refused(&mut m, delete("db1", 2));
    assert_eq!(
        e.to_string(),
        "snapshot 2 of volume `db1` is creating, not ready"
    );
    let e = refused(&mut m, gone("db1", 2));
    assert_eq!(
        e.to_string(),
        "snapshot 2 of volume `db1` is creating, not deleting"
    );
    run(&mut m, &[ready("db1", 2)]);
    assert!(matches!(
        refused(&mut m, gone("db1", 2)),
        MetaError::SnapshotWrongState {
            state: SnapshotState::Ready,
            ..
        }
    ));
    assert!(matches!(
        refused(&mut m, delete("nope", 2)),
        MetaError::NoSuchVolume { .. }
    ));
    assert!(matches!(
        refused(&mut m, gone("nope", 2)),
        MetaError::NoSuchVolume { .. }
    ));
    assert!(matches!(
        refused(&mut m, delete("db1", 7)),
        MetaError::NoSuchSnapshot { id: 7, .. }
    ));
    // A deleting volume's snapshot may finish going, but none starts going.
    run(
        &mut m,
        &[
            delete("db1", 2),
            Command::DeleteVolume { name: "db1".into() },
        ],
    );
    run(
        &mut m,
        &[gone("db1", 2), Command::VolumeGone { name: "db1".into() }],
    );

    let mut m = with_snapshot();
    run(&mut m, &[Command::DeleteVolume { name: "db1".into() }]);
    assert!(matches!(
        refused(&mut m, delete("db1", 1)),
        MetaError::WrongState {
            state: VolumeState::Deleting,
            ..
        }
    ));
}

#[test]
fn clone_volume() {
    let mut m = with_snapshot();
    // The source grows after the snapshot: the clone takes its current size.
    run(
        &mut m,
        &[Command::GrowVolume {
            name: "db1".into(),
            size_bytes: 4 * MIB,
            chunks: chunks(4, 1),
        }],
    );
    run(&mut m, &[clone("c1", "db1", 1, chunks(5, 4))]);
    let c = m.volume("c1").unwrap();
    assert_eq!(
        (
            c.size_bytes,
            c.chunk_bytes,
            c.block_bytes,
            c.version,
            c.state
        ),
        (4 * MIB, MIB, 64 << 10, 1, VolumeState::Creating)
    );
    assert_eq!(c.source, Some(("db1".into(), 1)));
    assert!(c.snapshots.is_empty());
    assert_eq!(m.next_group(), 9);
    assert_eq!(
        m.chunk(7).map(|(v, i, _)| (v.name.as_str(), i)),
        Some(("c1", 2))
    );
    assert_eq!(m.load(1), 8);

    // While it is copied, neither the snapshot nor its volume may go.
    let in_use = MetaError::SnapshotInUse {
        volume: "db1".into(),
        id: 1,
        clone: "c1".into(),
    };
    let e = refused(&mut m, delete("db1", 1));
    assert_eq!(e, in_use);
    assert_eq!(
        e.to_string(),
        "snapshot 1 of volume `db1` is being copied into clone `c1`"
    );
    assert_eq!(
        refused(&mut m, Command::DeleteVolume { name: "db1".into() }),
        in_use
    );
    // The clone takes no snapshot until ready.
    assert!(matches!(
        refused(&mut m, snap("c1", "s")),
        MetaError::WrongState {
            state: VolumeState::Creating,
            ..
        }
    ));
    // Several clones of one snapshot are fine; the source keeps taking snapshots.
    run(
        &mut m,
        &[
            clone("c2", "db1", 1, chunks(9, 4)),
            snap("db1", "s2"),
            ready("db1", 2),
        ],
    );

    run(&mut m, &[Command::VolumeReady { name: "c1".into() }]);
    let c = m.volume("c1").unwrap();
    assert_eq!(
        (c.state, c.source.clone(), c.version),
        (VolumeState::Ready, None, 1)
    );
    // c2 still copies.
    assert!(matches!(
        refused(&mut m, delete("db1", 1)),
        MetaError::SnapshotInUse { clone, .. } if clone == "c2"
    ));
    // Deleting the clone stops its copy.
    run(&mut m, &[Command::DeleteVolume { name: "c2".into() }]);
    assert_eq!(m.volume("c2").unwrap().source, None);
    run(
        &mut m,
        &[
            delete("db1", 1),
            gone("db1", 1),
            snap("c1", "s"),
            Command::DeleteVolume { name: "db1".into() },
        ],
    );
    assert_eq!(m.snapshot_tag("c1"), 3);
}

#[test]
fn clone_rejections() {
    let mut m = with_snapshot();
    let e = refused(&mut m, clone("db1", "db1", 1, chunks(4, 3)));
    assert_eq!(e.to_string(), "volume `db1` already exists");
    assert!(matches!(
        refused(&mut m, clone("bad name", "db1", 1, chunks(4, 3))),
        MetaError::BadName { .. }
    ));
    assert_eq!(
        refused(&mut m, clone("c", "nope", 1, chunks(4, 3))),
        MetaError::NoSuchVolume {
            name: "nope".into()
        }
    );
    assert_eq!(
        refused(&mut m, clone("c", "db1", 9, chunks(4, 3))),
        MetaError::NoSuchSnapshot {
            volume: "db1".into(),
            id: 9
        }
    );
    // Chunks checked as CreateVolume's: count, groups, nodes.
    for cs in [
        chunks(4, 2),
        chunks(4, 4),
        chunks(3, 3),
        vec![chunk(4, &[1]), chunk(5, &[1]), chunk(6, &[9])],
    ] {
        let e = refused(&mut m, clone("c", "db1", 1, cs.clone()));
        assert!(
            matches!(
                e,
                MetaError::BadChunks { .. } | MetaError::NoSuchNode { id: 9 }
            ),
            "{cs:?}: {e}"
        );
    }
    // Not of a snapshot being taken or deleted.
    run(&mut m, &[snap("db1", "s2")]);
    let e = refused(&mut m, clone("c", "db1", 2, chunks(4, 3)));
    assert_eq!(
        e.to_string(),
        "snapshot 2 of volume `db1` is creating, not ready"
    );
    run(&mut m, &[ready("db1", 2), delete("db1", 2)]);
    assert!(matches!(
        refused(&mut m, clone("c", "db1", 2, chunks(4, 3))),
        MetaError::SnapshotWrongState {
            state: SnapshotState::Deleting,
            ..
        }
    ));
    // Not of another volume's snapshot.
    run(
        &mut m,
        &[
            create("db2", MIB, chunks(4, 1)),
            Command::VolumeReady { name: "db2".into() },
        ],
    );
    assert!(matches!(
        refused(&mut m, clone("c", "db2", 1, chunks(5, 1))),
        MetaError::NoSuchSnapshot { id: 1, .. }
    ));
    // Not of a volume being deleted.
    run(&mut m, &[Command::DeleteVolume { name: "db1".into() }]);
    assert!(matches!(
        refused(&mut m, clone("c", "db1", 1, chunks(5, 3))),
        MetaError::WrongState {
            state: VolumeState::Deleting,
            ..
        }
    ));
}

#[test]
fn deleting_a_volume_takes_its_snapshots() {
    let mut m = with_snapshot();
    run(&mut m, &[snap("db1", "s2")]);
    // Allowed while a snapshot is being taken: the control leader abandons it.
    run(&mut m, &[Command::DeleteVolume { name: "db1".into() }]);
    assert_eq!(
        snapshots(&m, "db1"),
        vec![
            (1, "s1".into(), SnapshotState::Ready),
            (2, "s2".into(), SnapshotState::Creating)
        ]
    );
    run(&mut m, &[Command::VolumeGone { name: "db1".into() }]);
    assert!(m.volume("db1").is_none());
    assert_eq!(m.snapshot_tag("db1"), 0);
    assert_eq!(m.next_snapshot(), 3, "ids are never reused");
}

#[test]
fn image_round_trip_with_snapshots_and_clones() {
    let mut m = with_snapshot();
    run(
        &mut m,
        &[
            clone("c1", "db1", 1, chunks(4, 3)),
            snap("db1", "s2"),
            ready("db1", 2),
            delete("db1", 2),
            snap("db1", "s3"),
        ],
    );
    let image = m.encode_image();
    let back = Meta::decode_image(&image).unwrap();
    assert_eq!(back, m);
    assert_eq!(back.next_snapshot(), 4);
    assert_eq!(back.snapshot_tag("db1"), 3);
    assert_eq!(back.volume("c1").unwrap().source, Some(("db1".into(), 1)));
    assert_eq!(back.encode_image(), image);
}
