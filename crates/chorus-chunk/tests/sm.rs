//! The chunk's state machine with snapshot operations: operation records in the log take
//! and delete snapshots in log order, among writes; an operation that does not declare
//! the whole chunk is refused; a whole image carries the snapshots to another replica; a
//! partial image is never made for a scope covering the whole chunk, and a follower
//! refuses one made after the leader took a snapshot it has not.

use std::sync::Arc;

use chorus_chunk::image;
use chorus_chunk::op::{encode_op, op_declared, ChunkOp};
use chorus_chunk::{ChunkStateMachine, Geometry, SECTOR};
use chorus_core::ooo::group::Record;
use chorus_core::ooo::parallel::BlockRange;
use chorus_core::ooo::replica::{Declared, Footprint};
use chorus_runtime::ooo::OooStateMachine;
use chorus_storage::fs::RealFs;

const GEO: Geometry = Geometry {
    chunk_bytes: 1 << 20,
    block_bytes: 64 << 10,
};

fn sectors(n: u64, byte: u8) -> Vec<u8> {
    vec![byte; (n * SECTOR) as usize]
}

fn write(sector: u64, n: u64, byte: u8) -> Record {
    Record {
        declared: Declared::Blocks(vec![BlockRange::new(sector, n).unwrap()]),
        data: sectors(n, byte),
    }
}

fn op(o: ChunkOp) -> Record {
    Record {
        declared: op_declared(GEO),
        data: encode_op(o),
    }
}

fn open(dir: &tempfile::TempDir) -> ChunkStateMachine {
    ChunkStateMachine::open(Arc::new(RealFs), dir.path(), GEO).unwrap()
}

fn numbered(records: Vec<Record>) -> Vec<(u32, Record)> {
    records
        .into_iter()
        .enumerate()
        .map(|(i, r)| (i as u32, r))
        .collect()
}

#[test]
fn operation_records_take_and_delete_snapshots_in_log_order() {
    let dir = tempfile::tempdir().unwrap();
    let sm = open(&dir);
    // One slot's group of records: the snapshot holds the write before it, not the one
    // after.
    sm.apply(
        1,
        &numbered(vec![
            write(0, 2, 1),
            op(ChunkOp::Snapshot(5)),
            write(1, 2, 2),
        ]),
    )
    .unwrap();
    sm.apply(2, &numbered(vec![op(ChunkOp::Snapshot(6))]))
        .unwrap();
    sm.apply(3, &numbered(vec![write(0, 1, 3)])).unwrap();
    let st = sm.store();
    assert_eq!(st.snapshots(), vec![5, 6]);
    assert_eq!(
        st.read_snapshot(5, 0, 3 * 4096).unwrap(),
        [sectors(2, 1), vec![0; 4096]].concat()
    );
    assert_eq!(
        st.read_snapshot(6, 0, 3 * 4096).unwrap(),
        [sectors(1, 1), sectors(2, 2)].concat()
    );
    assert_eq!(
        st.read(0, 3 * 4096).unwrap(),
        [sectors(1, 3), sectors(2, 2)].concat()
    );
    // Applied again (a replay): nothing changes.
    sm.apply(2, &numbered(vec![op(ChunkOp::Snapshot(6))]))
        .unwrap();
    assert_eq!(st.read_snapshot(6, 0, 4096).unwrap(), sectors(1, 1));
    sm.apply(4, &numbered(vec![op(ChunkOp::DeleteSnapshot(5))]))
        .unwrap();
    assert_eq!(st.snapshots(), vec![6]);
    // Survives the checkpoint and a restart.
    sm.checkpoint().unwrap();
    assert!(sm.checkpoint_cost() > 0);
    drop(sm);
    let sm = open(&dir);
    assert_eq!(sm.store().snapshots(), vec![6]);
    assert_eq!(
        sm.store().read_snapshot(6, 0, 3 * 4096).unwrap(),
        [sectors(1, 1), sectors(2, 2)].concat()
    );
}

#[test]
fn an_operation_not_declaring_the_whole_chunk_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let sm = open(&dir);
    let sectors_in_chunk = GEO.chunk_bytes / SECTOR;
    for declared in [
        vec![BlockRange::new(0, 1).unwrap()],
        vec![BlockRange::new(0, sectors_in_chunk - 1).unwrap()],
        vec![
            BlockRange::new(0, 10).unwrap(),
            BlockRange::new(10, sectors_in_chunk - 10).unwrap(),
        ],
    ] {
        let rec = Record {
            declared: Declared::Blocks(declared),
            data: encode_op(ChunkOp::Snapshot(1)),
        };
        let e = sm.apply(1, &[(0, rec)]).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("not the whole chunk"), "{e}");
    }
    // A damaged operation is refused too, by name.
    let mut data = encode_op(ChunkOp::Snapshot(1));
    data[4] = 9;
    let e = sm
        .apply(
            1,
            &[(
                0,
                Record {
                    declared: op_declared(GEO),
                    data,
                },
            )],
        )
        .unwrap_err();
    assert!(e.to_string().contains("kind 9"), "{e}");
    assert!(sm.store().snapshots().is_empty());
}

#[test]
fn a_whole_image_carries_the_snapshots_to_another_replica() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (leader, follower) = (open(&a), open(&b));
    leader
        .apply(
            1,
            &numbered(vec![
                write(0, 16, 1),
                write(40, 8, 2),
                op(ChunkOp::Snapshot(1)),
                write(0, 1, 3),
                op(ChunkOp::Snapshot(2)),
                write(41, 1, 4),
                op(ChunkOp::DeleteSnapshot(1)),
                op(ChunkOp::Snapshot(3)),
            ]),
        )
        .unwrap();
    follower
        .apply(1, &numbered(vec![write(100, 1, 9)]))
        .unwrap();
    let img = leader.image().unwrap();
    follower.restore(&img).unwrap();
    let all = GEO.chunk_bytes as usize;
    let (l, f) = (leader.store(), follower.store());
    assert_eq!(f.snapshots(), vec![2, 3]);
    assert_eq!(f.read(0, all).unwrap(), l.read(0, all).unwrap());
    for id in [2, 3] {
        assert_eq!(
            f.read_snapshot(id, 0, all).unwrap(),
            l.read_snapshot(id, 0, all).unwrap()
        );
    }
    assert_eq!(f.slots_in_use(), l.slots_in_use());
    // Both then apply the same log alike: a take of the deleted id does nothing on
    // either.
    for sm in [&leader, &follower] {
        sm.apply(2, &numbered(vec![op(ChunkOp::Snapshot(1)), write(0, 1, 5)]))
            .unwrap();
    }
    assert_eq!(f.snapshots(), l.snapshots());
    assert_eq!(f.read(0, all).unwrap(), l.read(0, all).unwrap());
    // A damaged image is refused, and the state kept.
    let mut bad = img.clone();
    bad[40] ^= 1;
    assert!(follower.restore(&bad).is_err());
    assert_eq!(f.snapshots(), vec![2, 3]);
}

#[test]
fn partial_images_stand_in_for_writes_only() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (leader, follower) = (open(&a), open(&b));
    let base = numbered(vec![write(0, 4, 1), op(ChunkOp::Snapshot(1))]);
    leader.apply(1, &base).unwrap();
    follower.apply(1, &base).unwrap();
    let sectors_in_chunk = GEO.chunk_bytes / SECTOR;
    // A scope covering every sector (an operation among the slots): a whole image.
    for blocks in [
        vec![BlockRange::new(0, sectors_in_chunk).unwrap()],
        vec![
            BlockRange::new(0, 7).unwrap(),
            BlockRange::new(5, sectors_in_chunk - 5).unwrap(),
        ],
    ] {
        let scope = Footprint {
            blocks,
            keys: vec![],
        };
        assert!(leader.image_part(&scope).unwrap().is_none());
    }
    // Writes only: a partial image, which the follower installs (copying the block the
    // snapshot shares).
    leader.apply(2, &numbered(vec![write(2, 4, 2)])).unwrap();
    let scope = Footprint {
        blocks: vec![BlockRange::new(2, 4).unwrap()],
        keys: vec![],
    };
    let part = leader.image_part(&scope).unwrap().expect("a partial image");
    assert_eq!(image::decode_part(GEO, &part).unwrap().ids_seen, 1);
    follower.restore_part(&part).unwrap();
    let (l, f) = (leader.store(), follower.store());
    assert_eq!(f.read(0, 8 * 4096).unwrap(), l.read(0, 8 * 4096).unwrap());
    assert_eq!(
        f.read_snapshot(1, 0, 8 * 4096).unwrap(),
        [sectors(4, 1), vec![0; 4 * 4096]].concat()
    );
    // The leader takes a snapshot past the image's base and writes on: a partial image
    // it reads now holds that later write, and the follower, which would take the
    // snapshot after installing it, refuses it (a whole image then follows).
    leader
        .apply(3, &numbered(vec![op(ChunkOp::Snapshot(2)), write(2, 1, 7)]))
        .unwrap();
    let part = leader.image_part(&scope).unwrap().expect("a partial image");
    let e = follower.restore_part(&part).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
    assert!(e.to_string().contains("a whole image is needed"), "{e}");
    assert_eq!(f.read(2 * 4096, 4096).unwrap(), sectors(1, 2), "kept");
    // The whole image brings it level.
    follower.restore(&leader.image().unwrap()).unwrap();
    assert_eq!(f.snapshots(), vec![1, 2]);
    assert_eq!(
        f.read_snapshot(2, 0, 8 * 4096).unwrap(),
        l.read_snapshot(2, 0, 8 * 4096).unwrap()
    );
}

fn scrub(id: u64, first: u64, count: u64) -> Record {
    Record {
        declared: chorus_chunk::op::scrub_declared(GEO, first, count).unwrap(),
        data: encode_op(ChunkOp::Scrub(id)),
    }
}

#[test]
fn scrub_points_checksum_pieces_where_the_log_puts_them_and_find_a_damaged_replica() {
    use chorus_chunk::op::{scrub_pieces, SCRUB_PIECE};
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = (open(&da), open(&db));
    let log = vec![
        write(0, 40, 7),
        scrub(1, 0, 2),
        write(3, 1, 9),
        scrub(2, 0, 8),
    ];
    for sm in [&a, &b] {
        sm.apply(1, &numbered(log.clone())).unwrap();
    }
    // The first point saw the first write only; both replicas agree.
    let one = a.scrub_result(1).unwrap();
    assert_eq!(one.first, 0);
    assert_eq!(
        one.crcs,
        vec![
            crc32c::crc32c(&sectors(32, 7)),
            crc32c::crc32c(&[sectors(8, 7), vec![0; 24 * 4096]].concat())
        ]
    );
    assert_eq!(b.scrub_result(1), Some(one));
    assert_eq!(a.scrub_result(2), b.scrub_result(2));
    assert_eq!(a.scrub_result(3), None);
    // Damage one replica's bytes on disk: the next scrub point tells it apart, in the
    // piece that holds the damage only.
    let data = b.store().data_path();
    let mut bytes = std::fs::read(&data).unwrap();
    bytes[4096 * 3 + 10] ^= 0xff;
    std::fs::write(&data, bytes).unwrap();
    for sm in [&a, &b] {
        sm.apply(2, &numbered(vec![scrub(3, 0, 8)])).unwrap();
    }
    let (ra, rb) = (a.scrub_result(3).unwrap(), b.scrub_result(3).unwrap());
    let differ: Vec<usize> = (0..8).filter(|&i| ra.crcs[i] != rb.crcs[i]).collect();
    assert_eq!(differ, vec![0]);
    // Scrub ranges are whole pieces inside the chunk; others are refused.
    assert_eq!(scrub_pieces(GEO), (1 << 20) / SCRUB_PIECE);
    assert!(chorus_chunk::op::scrub_declared(GEO, 7, 2).is_err());
    assert!(chorus_chunk::op::scrub_declared(GEO, 0, 0).is_err());
    let bad = Record {
        declared: Declared::Blocks(vec![BlockRange::new(1, 31).unwrap()]),
        data: encode_op(ChunkOp::Scrub(4)),
    };
    assert!(a.apply(3, &numbered(vec![bad])).is_err());
}

/// A replica killed after applying a write past a scrub point it had not checkpointed
/// replays the point over a store that already holds the later write: its checksum there
/// would differ from every other replica's and convict a healthy replica. Replayed scrub
/// points are not kept; a live one after the restart is.
#[test]
fn a_scrub_point_replayed_after_a_restart_is_not_reported() {
    let dir = tempfile::tempdir().unwrap();
    let log = |slot: u64| match slot {
        1 => vec![write(0, 8, 1)],
        2 => vec![scrub(7, 0, 1)],
        3 => vec![write(0, 8, 2)],
        _ => unreachable!(),
    };
    let before = {
        let sm = open(&dir);
        sm.apply(1, &numbered(log(1))).unwrap();
        sm.checkpoint().unwrap();
        sm.apply(2, &numbered(log(2))).unwrap();
        sm.apply(3, &numbered(log(3))).unwrap();
        sm.scrub_result(7).unwrap()
        // Dropped without a checkpoint: a kill after the applies.
    };
    // Restarted from the checkpoint at slot 2, the log holding slots 2 and 3.
    let sm = open(&dir);
    sm.replaying_below(4);
    // The store already holds slot 3's write: the replayed point would see it.
    assert_eq!(sm.store().read(0, 4096).unwrap(), sectors(1, 2));
    for slot in 2..4 {
        sm.apply(slot, &numbered(log(slot))).unwrap();
    }
    assert_eq!(sm.scrub_result(7), None, "a replayed point is not reported");
    // Without the replay bound it would have been reported, and wrongly.
    let naive = open(&dir);
    naive.apply(2, &numbered(log(2))).unwrap();
    assert_ne!(naive.scrub_result(7), Some(before.clone()));
    // A point logged after the restart is reported.
    sm.apply(4, &numbered(vec![scrub(8, 0, 1)])).unwrap();
    assert_eq!(
        sm.scrub_result(8).unwrap().crcs,
        vec![crc32c::crc32c(
            &[sectors(8, 2), vec![0; 24 * 4096]].concat()
        )]
    );
}
