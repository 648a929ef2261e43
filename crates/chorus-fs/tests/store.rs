//! Metaobjects in memory and on the volume: `mkfs` then a mount's load give the fresh
//! state; transactions' operations apply against a model and roll back exactly; journal
//! records round-trip and damage is refused by name.

use chorus_fs::device::{Device, MemDevice};
use chorus_fs::journal::{At, Op, Record};
use chorus_fs::layout::{Geometry, Superblock};
use chorus_fs::meta::{encode_obj, Dirent, FileKind, Inode, Kind, Meta, MetaId, Tag};
use chorus_fs::mkfs::mkfs;
use chorus_fs::store::MetaStore;
use proptest::prelude::*;

fn geometry() -> Geometry {
    Geometry {
        volume_bytes: 2 << 20,
        chunk_bytes: 1 << 20,
        block_bytes: 64 << 10,
        inodes_per_chunk: 40,
        dirents_per_chunk: 40,
        max_hosts: 4,
        journal_bytes: 64 << 10,
    }
}

#[test]
fn mkfs_then_load_gives_the_fresh_file_system() {
    let dev = MemDevice::new(2 << 20);
    let sb = mkfs(&dev, geometry(), 0xabc, 5).unwrap();
    assert_eq!(Superblock::read(&dev).unwrap(), sb);
    let loaded = MetaStore::load(&dev, sb).unwrap();
    assert_eq!(loaded, MetaStore::fresh(sb, 5));
    match loaded.get(Kind::Inode, MetaId::ROOT) {
        Some(Meta::Inode(i)) => assert_eq!(i.kind, FileKind::Dir),
        m => panic!("root: {m:?}"),
    }
    assert_eq!(
        loaded.count(1, Kind::Tag),
        sb.geometry.data_blocks(1) as usize
    );
    // A volume too small, or a bad geometry, is refused before anything is written.
    let small = MemDevice::new(1 << 20);
    assert!(mkfs(&small, geometry(), 1, 0)
        .unwrap_err()
        .to_string()
        .contains("would cover"));
    assert!(small.snapshot().iter().all(|&b| b == 0));
}

#[test]
fn a_damaged_metaobject_sector_is_named_at_mount() {
    let dev = MemDevice::new(2 << 20);
    let sb = mkfs(&dev, geometry(), 0xabc, 5).unwrap();
    let s = MetaStore::fresh(sb, 5);
    let (offset, _) = s.sector_of(Kind::Dirent, MetaId::new(1, 20));
    dev.flip(offset + 300, 0x10);
    let e = MetaStore::load(&dev, sb).unwrap_err().to_string();
    assert!(e.contains(&format!("offset {offset}")), "{e}");
    // An interrupted mkfs leaves no superblock.
    let dev = MemDevice::new(2 << 20);
    dev.write(0, &[1u8; 10]).unwrap();
    assert!(Superblock::read(&dev).is_err());
}

/// A change drawn for the property test: which slot, and what it becomes.
fn change() -> impl Strategy<Value = (Kind, MetaId, Meta)> {
    let id = (0u32..2, 0u32..20).prop_map(|(c, i)| MetaId::new(c, i));
    prop_oneof![
        (id.clone(), any::<u64>(), any::<bool>()).prop_map(|(i, size, free)| (
            Kind::Inode,
            i,
            if free {
                Meta::Free
            } else {
                Meta::Inode(Inode {
                    kind: FileKind::File,
                    mode: 0o644,
                    size,
                    mtime_ns: 1,
                    ctime_ns: 2,
                    parent: MetaId::NONE,
                })
            }
        )),
        (id.clone(), id.clone(), "[a-z]{1,12}").prop_map(|(i, target, n)| (
            Kind::Dirent,
            i,
            Meta::Dirent(Dirent {
                parent: MetaId::ROOT,
                inode: target,
                name: n.into_bytes()
            })
        )),
        (0u32..2, 0u32..13, id, any::<u16>()).prop_map(|(c, t, owner, fb)| (
            Kind::Tag,
            MetaId::new(c, t),
            Meta::Tag(Tag {
                owner,
                file_block: if owner == MetaId::NONE { 0 } else { fb as u64 },
                dirty: true
            })
        )),
    ]
}

proptest! {
    /// Transactions of random operations apply like a model map, write home and load
    /// back equal, and a transaction rolled back in reverse leaves the state before it.
    #[test]
    fn transactions_apply_and_roll_back(txns in proptest::collection::vec(
        (proptest::collection::vec(change(), 1..6), any::<bool>()), 1..12)
    ) {
        let dev = MemDevice::new(2 << 20);
        let sb = mkfs(&dev, geometry(), 7, 0).unwrap();
        let mut s = MetaStore::fresh(sb, 0);
        let mut seq = 0;
        for (changes, commit) in txns {
            let before = s.clone();
            let mut ops: Vec<Op> = Vec::new();
            for (k, id, m) in changes {
                let op = s.op(k, id, &m).unwrap();
                s.apply(&op).unwrap();
                prop_assert_eq!(s.get(k, id).unwrap(), &m);
                ops.push(op);
            }
            if commit {
                seq += 1;
                // The record of the transaction round-trips through the journal format.
                let r = Record { generation: 1, seq, prev: At::default(), ops: ops.clone() };
                prop_assert_eq!(Record::decode(&r.encode(7), 0, 7).unwrap(), r);
            } else {
                for op in ops.iter().rev() {
                    s.roll_back(op).unwrap();
                }
                prop_assert_eq!(&s, &before);
            }
        }
        s.write_all(&dev).unwrap();
        prop_assert_eq!(MetaStore::load(&dev, sb).unwrap(), s);
    }
}

#[test]
fn an_operation_made_against_another_state_is_refused() {
    let sb = Superblock {
        geometry: Geometry::new(geometry()).unwrap(),
        uuid: 3,
    };
    let mut s = MetaStore::fresh(sb, 0);
    let id = MetaId::new(1, 4);
    let file = Meta::Inode(Inode {
        kind: FileKind::File,
        mode: 0o600,
        size: 1,
        mtime_ns: 0,
        ctime_ns: 0,
        parent: MetaId::NONE,
    });
    let op = s.op(Kind::Inode, id, &file).unwrap();
    s.apply(&op).unwrap();
    let e = s.apply(&op).unwrap_err();
    assert!(e.contains("old value"), "{e}");
    // A value of the wrong kind, or a slot that does not exist, makes no operation.
    assert!(s.op(Kind::Tag, id, &file).is_none());
    assert!(s.op(Kind::Inode, MetaId::new(9, 0), &Meta::Free).is_none());
    assert_eq!(encode_obj(Kind::Inode, &Meta::Free), [0u8; 256]);
}

#[test]
fn journal_records_refuse_damage_by_name() {
    let op = Op {
        kind: Kind::Tag,
        id: MetaId::new(1, 2),
        old: [0; 256],
        new: [1; 256],
    };
    let r = Record {
        generation: 2,
        seq: 9,
        prev: At {
            host: 1,
            offset: 8192,
        },
        ops: vec![op; 9],
    };
    let b = r.encode(5);
    assert_eq!(b.len() as u64, r.sectors() * 4096);
    assert_eq!(Record::sectors_of(&b, 0, 5).unwrap(), r.sectors());
    assert_eq!(Record::decode(&b, 0, 5).unwrap(), r);
    let mut d = b.clone();
    d[5000] ^= 2;
    let e = Record::decode(&d, 40960, 5).unwrap_err().to_string();
    assert!(e.contains("offset 40960") && e.contains("checksum"), "{e}");
    assert!(Record::decode(&b, 0, 6)
        .unwrap_err()
        .to_string()
        .contains("file system"));
    assert!(Record::decode(&b[..4096], 0, 5).is_err());
    assert!(Record::sectors_of(&[0u8; 4096], 0, 5)
        .unwrap_err()
        .to_string()
        .contains("magic"));
}
