//! The file system's on-volume formats: superblock and metaobject sectors round-trip,
//! and every damage or mismatch is refused by name.

use chorus_fs::layout::{FsError, Geometry, Superblock, SECTOR};
use chorus_fs::meta::{
    decode_obj, decode_sector, encode_obj, encode_sector, Dirent, FileKind, Inode, Kind, Meta,
    MetaId, Tag, NAME_MAX, OBJ, PER_SECTOR,
};
use proptest::prelude::*;

fn geometry() -> Geometry {
    Geometry::new(Geometry {
        volume_bytes: 4 << 20,
        chunk_bytes: 1 << 20,
        block_bytes: 64 << 10,
        inodes_per_chunk: 64,
        dirents_per_chunk: 64,
        max_hosts: 4,
        journal_bytes: 64 << 10,
    })
    .unwrap()
}

#[test]
fn the_layout_puts_metaobjects_before_aligned_data_blocks() {
    let g = geometry();
    assert_eq!(g.chunks(), 4);
    assert_eq!(g.paxos_start(), SECTOR);
    assert_eq!(g.journal_start(), SECTOR * 6);
    assert_eq!(g.journal_area(1), (SECTOR * 6, 16 << 10));
    assert_eq!(g.journal_area(4), (SECTOR * 6 + (48 << 10), 16 << 10));
    assert_eq!(g.meta_start(0), SECTOR * 6 + (64 << 10));
    assert_eq!(g.meta_start(1), 1 << 20);
    // 64 inodes and 64 entries: 5 sectors each; 16 tags: 2 sectors.
    assert_eq!(g.meta_sectors(), [5, 5, 2]);
    for c in 0..4 {
        assert!(g.data_start(c).is_multiple_of(g.block_bytes));
        assert!(g.data_start(c) >= g.meta_start(c) + 12 * SECTOR);
        assert!(g.data_blocks(c) <= g.chunk_bytes / g.block_bytes);
        assert_eq!(
            g.block_offset(c, g.data_blocks(c) - 1) + g.block_bytes,
            g.chunk_start(c) + g.chunk_bytes
        );
    }
    assert_eq!(g.data_blocks(0), 13);
    assert_eq!(g.data_blocks(1), 15);
}

#[test]
fn impossible_geometries_are_refused_by_name() {
    let g = geometry();
    let cases = [
        (
            Geometry {
                block_bytes: 1000,
                ..g
            },
            "block size",
        ),
        (
            Geometry {
                chunk_bytes: 100 << 10,
                ..g
            },
            "chunk size",
        ),
        (
            Geometry {
                volume_bytes: (4 << 20) + 1,
                ..g
            },
            "volume size",
        ),
        (Geometry { max_hosts: 0, ..g }, "max_hosts"),
        (
            Geometry {
                journal_bytes: 100,
                ..g
            },
            "journal",
        ),
        (Geometry { max_hosts: 5, ..g }, "each of the 5 hosts"),
        (
            Geometry {
                inodes_per_chunk: 1,
                ..g
            },
            "inodes",
        ),
        (
            Geometry {
                inodes_per_chunk: 100_000,
                ..g
            },
            "no room",
        ),
    ];
    for (bad, says) in cases {
        let e = Geometry::new(bad).unwrap_err().to_string();
        assert!(e.contains(says), "{e} (expected {says:?})");
    }
}

#[test]
fn the_superblock_round_trips_and_damage_is_refused() {
    let s = Superblock {
        geometry: geometry(),
        uuid: 0xfeed,
    };
    let b = s.encode();
    assert_eq!(Superblock::decode(&b).unwrap(), s);
    let mut d = b.clone();
    d[100] ^= 1;
    assert!(Superblock::decode(&d)
        .unwrap_err()
        .to_string()
        .contains("checksum"));
    let zeros = vec![0u8; SECTOR as usize];
    let e = Superblock::decode(&zeros).unwrap_err().to_string();
    assert!(e.contains("mkfs"), "{e}");
    let mut v = b.clone();
    v[4] = 9;
    let crc = crc32c::crc32c(&v[..4092]);
    v[4092..].copy_from_slice(&crc.to_le_bytes());
    assert!(matches!(
        Superblock::decode(&v),
        Err(FsError::Corrupt { .. })
    ));
    assert!(Superblock::decode(&v)
        .unwrap_err()
        .to_string()
        .contains("version 9"));
}

fn id() -> impl Strategy<Value = MetaId> {
    (0u32..4, 0u32..100).prop_map(|(c, i)| MetaId::new(c, i))
}

fn name() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(1u8..=255, 1..=NAME_MAX)
        .prop_map(|n| {
            n.into_iter()
                .map(|c| if c == b'/' { b'_' } else { c })
                .collect()
        })
        .prop_filter("not . or ..", |n: &Vec<u8>| chorus_fs::meta::valid_name(n))
}

fn meta(kind: Kind) -> BoxedStrategy<Meta> {
    match kind {
        Kind::Inode => prop_oneof![
            Just(Meta::Free),
            (
                any::<bool>(),
                any::<u32>(),
                any::<u64>(),
                any::<i64>(),
                any::<i64>(),
                id()
            )
                .prop_map(|(dir, mode, size, m, c, parent)| Meta::Inode(Inode {
                    kind: if dir { FileKind::Dir } else { FileKind::File },
                    mode,
                    size,
                    mtime_ns: m,
                    ctime_ns: c,
                    parent,
                })),
        ]
        .boxed(),
        Kind::Dirent => prop_oneof![
            Just(Meta::Free),
            (id(), id(), name()).prop_map(|(parent, inode, name)| Meta::Dirent(Dirent {
                parent,
                inode,
                name
            })),
        ]
        .boxed(),
        Kind::Tag => prop_oneof![
            any::<bool>().prop_map(|dirty| Meta::Tag(Tag {
                owner: MetaId::NONE,
                file_block: 0,
                dirty
            })),
            (
                id().prop_filter("owned", |i| *i != MetaId::NONE),
                any::<u64>(),
                any::<bool>()
            )
                .prop_map(|(owner, file_block, dirty)| Meta::Tag(Tag {
                    owner,
                    file_block,
                    dirty
                })),
        ]
        .boxed(),
    }
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![Just(Kind::Inode), Just(Kind::Dirent), Just(Kind::Tag)]
}

proptest! {
    #[test]
    fn metaobject_sectors_round_trip(
        (k, records) in kind().prop_flat_map(|k| (Just(k), proptest::collection::vec(meta(k), 0..=PER_SECTOR))),
        chunk in any::<u32>(),
        first in any::<u32>(),
        uuid in any::<u64>(),
    ) {
        let b = encode_sector(uuid, k, chunk, first, &records);
        let got = decode_sector(&b, 4096, uuid, k, chunk, first, records.len()).unwrap();
        prop_assert_eq!(got, records);
    }

    /// Any single flipped bit is caught, named with the sector's offset.
    #[test]
    fn a_flipped_bit_is_caught(at in 0usize..4096, bit in 0u8..8) {
        let r = vec![Meta::Tag(Tag { owner: MetaId::new(1, 3), file_block: 9, dirty: true })];
        let mut b = encode_sector(7, Kind::Tag, 2, 30, &r);
        b[at] ^= 1 << bit;
        let e = decode_sector(&b, 8192, 7, Kind::Tag, 2, 30, 1).unwrap_err().to_string();
        prop_assert!(e.contains("offset 8192"), "{}", e);
    }

    /// Records that break their kind's invariants are refused, never panic.
    #[test]
    fn arbitrary_records_never_panic(k in kind(), bytes in proptest::collection::vec(any::<u8>(), OBJ)) {
        if let Ok(m) = decode_obj(k, &bytes) {
            prop_assert_eq!(encode_obj(k, &m).to_vec(), bytes);
        }
    }
}

#[test]
fn a_sector_of_another_place_or_file_system_is_refused() {
    let r = vec![Meta::Free; 3];
    let b = encode_sector(7, Kind::Inode, 1, 15, &r);
    for (uuid, kind, chunk, first, says) in [
        (8, Kind::Inode, 1, 15, "of file system 0x7"),
        (7, Kind::Dirent, 1, 15, "Inode records"),
        (7, Kind::Inode, 2, 15, "chunk 1"),
        (7, Kind::Inode, 1, 0, "from 15"),
    ] {
        let e = decode_sector(&b, 0, uuid, kind, chunk, first, 3)
            .unwrap_err()
            .to_string();
        assert!(e.contains(says), "{e} (expected {says:?})");
    }
    // A zeroed (never formatted) sector.
    let e = decode_sector(&[0u8; 4096], 0, 7, Kind::Inode, 1, 15, 3)
        .unwrap_err()
        .to_string();
    assert!(e.contains("magic"), "{e}");
}
