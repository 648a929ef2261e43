//! The chunk's formats (docs/formats.md, "Chunk replicas"): decoders are total (any
//! bytes give a value or a typed error, never a panic), what is encoded decodes to
//! itself, a flipped byte or a cut file is refused, a file that is sealed right but
//! breaks a rule is refused naming the rule, and version 1 files still read.

use chorus_chunk::image::{self, Image, Part};
use chorus_chunk::map::{MapFile, SnapshotMap};
use chorus_chunk::op::{decode_op, encode_op, op_declared, ChunkOp, OP_BYTES};
use chorus_chunk::{ChunkError, Geometry, SECTOR};
use chorus_core::ooo::parallel::BlockRange;
use chorus_core::ooo::replica::Declared;
use proptest::prelude::*;

const GEO: Geometry = Geometry {
    chunk_bytes: 1 << 20,
    block_bytes: 4096,
};

/// A tiny deterministic generator for shapes a strategy picks by seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// Valid maps built from `seed`: a current map, up to four snapshots sharing some of
/// its slots (and each other's), deleted ids; slots numbered in a scrambled order.
/// Returns the maps and the number of distinct slots they name.
type Maps = (Vec<(u32, u32)>, Vec<SnapshotMap>, Vec<u64>, u32);

fn maps(seed: u64, blocks: u32) -> Maps {
    let mut rng = Rng(seed | 1);
    let mut next_slot = 0u32;
    let mut fresh = || {
        next_slot += 1;
        next_slot - 1
    };
    // block → the slots holding a version of it, newest last.
    let mut versions: Vec<Vec<u32>> = vec![Vec::new(); blocks as usize];
    let mut current = Vec::new();
    for b in 0..blocks {
        if rng.below(3) == 0 {
            let s = fresh();
            versions[b as usize].push(s);
            current.push((b, s));
        }
    }
    let mut snapshots = Vec::new();
    let mut id = 0u64;
    for _ in 0..rng.below(5) {
        id += 1 + rng.below(5);
        let mut entries = Vec::new();
        for b in 0..blocks {
            if rng.below(3) != 0 {
                continue;
            }
            let vs = &mut versions[b as usize];
            let s = if !vs.is_empty() && rng.below(2) == 0 {
                vs[rng.below(vs.len() as u64) as usize]
            } else {
                let s = fresh();
                vs.push(s);
                s
            };
            entries.push((b, s));
        }
        snapshots.push(SnapshotMap { id, entries });
    }
    let mut deleted = Vec::new();
    let mut d = 0u64;
    for _ in 0..rng.below(4) {
        d += 1 + rng.below(4);
        if snapshots.iter().all(|s| s.id != d) {
            deleted.push(d);
        }
    }
    // Scramble the slot numbers: slot s becomes (s × 7 + 3) mod n, n the count
    // rounded up to a number 7 does not divide.
    let mut n = next_slot.max(1);
    while n.is_multiple_of(7) {
        n += 1;
    }
    let scramble = |s: u32| ((s as u64 * 7 + 3) % n as u64) as u32;
    let fix = |e: &mut Vec<(u32, u32)>| e.iter_mut().for_each(|x| x.1 = scramble(x.1));
    fix(&mut current);
    snapshots.iter_mut().for_each(|s| fix(&mut s.entries));
    (current, snapshots, deleted, n)
}

fn map_file() -> impl Strategy<Value = MapFile> {
    (any::<u64>(), any::<u64>(), 0u32..4).prop_map(|(seed, generation, spare)| {
        let (entries, snapshots, deleted, n) = maps(seed, 40);
        MapFile {
            geometry: GEO,
            generation,
            slot_count: n + spare,
            entries,
            snapshots,
            deleted,
        }
    })
}

fn whole_image() -> impl Strategy<Value = Image> {
    any::<u64>().prop_map(|seed| {
        let (current, snapshots, deleted, n) = maps(seed, 12);
        // Only the slots the maps name travel: renumber them densely.
        let mut named: Vec<u32> = current
            .iter()
            .chain(snapshots.iter().flat_map(|s| s.entries.iter()))
            .map(|(_, s)| *s)
            .collect();
        named.sort_unstable();
        named.dedup();
        let _ = n;
        let dense = |s: u32| named.binary_search(&s).expect("named") as u32;
        Image {
            current: current.iter().map(|(b, s)| (*b, dense(*s))).collect(),
            snapshots: snapshots
                .iter()
                .map(|m| SnapshotMap {
                    id: m.id,
                    entries: m.entries.iter().map(|(b, s)| (*b, dense(*s))).collect(),
                })
                .collect(),
            deleted,
            data: (0..named.len())
                .map(|i| vec![i as u8 ^ 0x5a; GEO.block_bytes as usize])
                .collect(),
        }
    })
}

fn part() -> impl Strategy<Value = Part> {
    (
        proptest::collection::btree_set(0u64..GEO.chunk_bytes / SECTOR, 1..10),
        any::<u64>(),
    )
        .prop_map(|(starts, ids_seen)| {
            // Ranges of one sector each, at distinct ascending sectors.
            let ranges: Vec<(u64, u64)> = starts.iter().map(|s| (*s, s + 1)).collect();
            let data = (0..ranges.len() as u64 * SECTOR).map(|i| i as u8).collect();
            Part {
                ids_seen,
                ranges,
                data,
            }
        })
}

/// Seals `body` as the chunk's formats end: its CRC32C appended.
fn seal(mut body: Vec<u8>) -> Vec<u8> {
    let crc = crc32c::crc32c(&body);
    body.extend_from_slice(&crc.to_le_bytes());
    body
}

/// The bytes of a version 1 block map (what chunks written before snapshots hold).
fn map_v1(entries: &[(u32, u32)], generation: u64) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(b"CHKM");
    b.extend_from_slice(&1u32.to_le_bytes());
    b.extend_from_slice(&GEO.chunk_bytes.to_le_bytes());
    b.extend_from_slice(&GEO.block_bytes.to_le_bytes());
    b.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    b.extend_from_slice(&generation.to_le_bytes());
    for (bl, s) in entries {
        b.extend_from_slice(&bl.to_le_bytes());
        b.extend_from_slice(&s.to_le_bytes());
    }
    seal(b)
}

/// A rule to break: what the error must say, and how to break it.
type Case<'a, T> = (&'static str, Box<dyn Fn(&mut T) + 'a>);

fn is_corrupt<T>(r: Result<T, ChunkError>) -> bool {
    matches!(r, Err(ChunkError::Corrupt { .. }))
}

fn corrupt_detail<T: std::fmt::Debug>(r: Result<T, ChunkError>) -> String {
    match r {
        Err(ChunkError::Corrupt { detail, .. }) => detail,
        other => panic!("not refused as corrupt: {other:?}"),
    }
}

proptest! {
    #[test]
    fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = MapFile::decode("map", &bytes);
        let _ = image::decode(GEO, &bytes);
        let _ = image::decode_part(GEO, &bytes);
        let _ = decode_op(&bytes);
    }

    /// Sealed garbage after a right header: the checksum passes, the rest must not panic.
    #[test]
    fn sealed_garbage_never_panics(
        counts in proptest::collection::vec(any::<u32>(), 5),
        tail in proptest::collection::vec(any::<u8>(), 0..200),
        v in 1u32..3,
    ) {
        let mut m = Vec::new();
        m.extend_from_slice(b"CHKM");
        m.extend_from_slice(&v.to_le_bytes());
        m.extend_from_slice(&GEO.chunk_bytes.to_le_bytes());
        m.extend_from_slice(&GEO.block_bytes.to_le_bytes());
        m.extend_from_slice(&(counts[0] % 8).to_le_bytes());
        m.extend_from_slice(&7u64.to_le_bytes());
        for c in &counts[1..4] {
            m.extend_from_slice(&(c % 16).to_le_bytes());
        }
        m.extend_from_slice(&tail);
        let _ = MapFile::decode("map", &seal(m));
        let mut i = Vec::new();
        i.extend_from_slice(b"CHKI");
        i.extend_from_slice(&v.to_le_bytes());
        i.extend_from_slice(&GEO.chunk_bytes.to_le_bytes());
        i.extend_from_slice(&GEO.block_bytes.to_le_bytes());
        for c in &counts[..4] {
            i.extend_from_slice(&(c % 4).to_le_bytes());
        }
        i.extend_from_slice(&tail);
        let _ = image::decode(GEO, &seal(i));
        // Counts at their largest must not make the decoders allocate for them.
        let mut big = Vec::new();
        big.extend_from_slice(b"CHKM");
        big.extend_from_slice(&2u32.to_le_bytes());
        big.extend_from_slice(&GEO.chunk_bytes.to_le_bytes());
        big.extend_from_slice(&GEO.block_bytes.to_le_bytes());
        big.extend_from_slice(&counts[0].to_le_bytes());
        big.extend_from_slice(&7u64.to_le_bytes());
        for c in &counts[1..4] {
            big.extend_from_slice(&c.to_le_bytes());
        }
        big.extend_from_slice(&tail);
        prop_assert!(MapFile::decode("map", &seal(big)).is_err() || counts[0] == 0);
    }

    #[test]
    fn a_map_decodes_to_itself_and_a_flipped_byte_or_a_cut_is_refused(
        m in map_file(),
        at in any::<prop::sample::Index>(),
        cut in any::<prop::sample::Index>(),
    ) {
        let bytes = m.encode();
        prop_assert_eq!(MapFile::decode("map", &bytes).unwrap(), m);
        let mut bad = bytes.clone();
        let i = at.index(bad.len());
        bad[i] ^= 0x40;
        prop_assert!(is_corrupt(MapFile::decode("map", &bad)));
        let short = &bytes[..cut.index(bytes.len())];
        prop_assert!(is_corrupt(MapFile::decode("map", short)));
    }

    #[test]
    fn images_decode_to_themselves_and_a_flipped_byte_or_a_cut_is_refused(
        img in whole_image(),
        p in part(),
        at in any::<prop::sample::Index>(),
        cut in any::<prop::sample::Index>(),
    ) {
        img.check(GEO).unwrap();
        let bytes = image::encode(GEO, &img);
        prop_assert_eq!(image::decode(GEO, &bytes).unwrap(), img);
        let mut bad = bytes.clone();
        let i = at.index(bad.len());
        bad[i] ^= 0x40;
        prop_assert!(is_corrupt(image::decode(GEO, &bad)));
        let short = &bytes[..cut.index(bytes.len())];
        prop_assert!(is_corrupt(image::decode(GEO, short)));
        let pb = image::encode_part(GEO, &p);
        prop_assert_eq!(image::decode_part(GEO, &pb).unwrap(), p);
        let mut bad = pb.clone();
        let i = at.index(bad.len());
        bad[i] ^= 0x40;
        prop_assert!(image::decode_part(GEO, &bad).is_err());
    }

    #[test]
    fn an_operation_decodes_to_itself(id in 1u64.., delete in any::<bool>()) {
        let op = if delete { ChunkOp::DeleteSnapshot(id) } else { ChunkOp::Snapshot(id) };
        let bytes = encode_op(op);
        prop_assert_eq!(bytes.len(), OP_BYTES);
        prop_assert_eq!(decode_op(&bytes).unwrap().unwrap(), op);
    }
}

#[test]
fn a_version_1_map_still_reads_and_a_version_2_map_is_written() {
    let entries = [(3, 1), (9, 0), (20, 2)];
    let m = MapFile::decode("map", &map_v1(&entries, 5)).unwrap();
    assert_eq!(m.entries, entries);
    assert_eq!(m.generation, 5);
    assert_eq!(m.slot_count, 3);
    assert!(m.snapshots.is_empty() && m.deleted.is_empty());
    assert_eq!(&m.encode()[4..8], &2u32.to_le_bytes());
    // Version 1's rule stays: its slots are exactly 0..count.
    let d = corrupt_detail(MapFile::decode("map", &map_v1(&[(3, 1), (9, 3)], 5)));
    assert!(d.contains("slot 3 past the 2 slots"), "{d}");
    // An unknown version is refused by number.
    let mut v3 = map_v1(&entries, 5);
    v3[4] = 3;
    let n = v3.len() - 4;
    let d = corrupt_detail(MapFile::decode("map", &seal(v3[..n].to_vec())));
    assert!(d.contains("version 3"), "{d}");
}

/// A map sealed right but breaking a rule is refused naming the rule.
#[test]
fn a_map_breaking_a_rule_is_refused_by_name() {
    let snap = |id, entries: Vec<(u32, u32)>| SnapshotMap { id, entries };
    let ok = MapFile {
        geometry: GEO,
        generation: 1,
        slot_count: 4,
        entries: vec![(1, 0), (2, 1)],
        snapshots: vec![snap(3, vec![(1, 0), (2, 2)])],
        deleted: vec![1, 2],
    };
    MapFile::decode("map", &ok.encode()).unwrap();
    let cases: Vec<Case<MapFile>> = vec![
        (
            "past the chunk's 256 blocks",
            Box::new(|m| m.entries[1].0 = 256),
        ),
        ("not above the previous", Box::new(|m| m.entries[1].0 = 1)),
        ("past the 4 slots", Box::new(|m| m.entries[1].1 = 4)),
        (
            "slot 1 holds block 1 here and block 2",
            Box::new(|m| m.snapshots[0].entries[0].1 = 1),
        ),
        (
            "current map entry 1: slot 1 holds block 2 here and block 1",
            Box::new(|m| m.entries[0].1 = 1),
        ),
        ("snapshot id 0", Box::new(|m| m.snapshots[0].id = 0)),
        (
            "not above the previous 3",
            Box::new(|m| m.snapshots.push(snap(3, vec![]))),
        ),
        ("both held and deleted", Box::new(|m| m.deleted = vec![3])),
        (
            "deleted snapshot id 1 not above",
            Box::new(|m| m.deleted = vec![2, 1]),
        ),
        ("deleted snapshot id 0", Box::new(|m| m.deleted = vec![0])),
        (
            "snapshot 3 entry 0: block 300",
            Box::new(|m| m.snapshots[0].entries[0].0 = 300),
        ),
    ];
    for (want, change) in cases {
        let mut m = ok.clone();
        change(&mut m);
        let d = corrupt_detail(MapFile::decode("map", &m.encode()));
        assert!(d.contains(want), "{want:?} not in {d:?}");
    }
    // Counts that claim more than the bytes hold, and bytes past the maps.
    let bytes = ok.encode();
    let body = &bytes[..bytes.len() - 4];
    for (at, v, want) in [
        (20usize, 100u32, "current entries do not fit"),
        (20, u32::MAX, "current entries do not fit"),
        (36, 2, "ends inside snapshot map 1"),
        (36, u32::MAX, "ends inside snapshot map"),
        (40, 3, "deleted ids"),
        (40, 1, "bytes past the maps"),
    ] {
        let mut b = body.to_vec();
        b[at..at + 4].copy_from_slice(&v.to_le_bytes());
        let d = corrupt_detail(MapFile::decode("map", &seal(b)));
        assert!(d.contains(want), "{want:?} not in {d:?}");
    }
    // Another geometry's invariants broken inside the file.
    let mut b = body.to_vec();
    b[16..20].copy_from_slice(&3000u32.to_le_bytes());
    assert!(corrupt_detail(MapFile::decode("map", &seal(b))).contains("power of two"));
    // A header of version 2 cut short, sealed.
    let d = corrupt_detail(MapFile::decode("map", &seal(body[..36].to_vec())));
    assert!(d.contains("shorter than a version 2 header"), "{d}");
}

#[test]
fn an_image_breaking_a_rule_is_refused_by_name() {
    let bb = GEO.block_bytes as usize;
    let ok = Image {
        current: vec![(1, 0), (2, 1)],
        snapshots: vec![SnapshotMap {
            id: 4,
            entries: vec![(1, 0), (2, 2)],
        }],
        deleted: vec![2],
        data: vec![vec![1; bb], vec![2; bb], vec![3; bb]],
    };
    image::decode(GEO, &image::encode(GEO, &ok)).unwrap();
    let cases: Vec<Case<Image>> = vec![
        (
            "slot 2 is named by no map",
            Box::new(|i| i.snapshots.clear()),
        ),
        ("past the 3 slots", Box::new(|i| i.current[0].1 = 3)),
        (
            "holds block 2 here and block 1",
            Box::new(|i| i.current[1].1 = 0),
        ),
        ("both held and deleted", Box::new(|i| i.deleted = vec![4])),
        ("not above the previous", Box::new(|i| i.current[1].0 = 0)),
    ];
    for (want, change) in cases {
        let mut i = ok.clone();
        change(&mut i);
        let d = corrupt_detail(image::decode(GEO, &image::encode(GEO, &i)));
        assert!(d.contains(want), "{want:?} not in {d:?}");
    }
    let mut short = ok.clone();
    short.data[1].pop();
    assert!(corrupt_detail(short.check(GEO)).contains("slot 1 has 4095 bytes"));
    // Lengths: more slots than the bytes hold, a count past the maps.
    let bytes = image::encode(GEO, &ok);
    let body = &bytes[..bytes.len() - 4];
    for (at, v, want) in [
        (20usize, 4u32, "do not fit"),
        (20, u32::MAX, "do not fit"),
        (24, 9, "current entries"),
        (28, 2, "inside snapshot map 1"),
        (32, 0, "bytes between the maps"),
    ] {
        let mut b = body.to_vec();
        b[at..at + 4].copy_from_slice(&v.to_le_bytes());
        let d = corrupt_detail(image::decode(GEO, &seal(b)));
        assert!(d.contains(want), "{want:?} not in {d:?}");
    }
    // Another geometry's image.
    let other = Geometry {
        chunk_bytes: 2 << 20,
        block_bytes: 4096,
    };
    assert!(corrupt_detail(image::decode(other, &bytes)).contains("not of this chunk's"));
    // A checksum that does not match.
    let mut bad = bytes.clone();
    let n = bad.len();
    bad[n - 1] ^= 1;
    assert!(corrupt_detail(image::decode(GEO, &bad)).contains("checksum"));
}

#[test]
fn a_version_1_image_still_reads() {
    let bb = GEO.block_bytes as usize;
    let mut b = Vec::new();
    b.extend_from_slice(b"CHKI");
    b.extend_from_slice(&1u32.to_le_bytes());
    b.extend_from_slice(&GEO.chunk_bytes.to_le_bytes());
    b.extend_from_slice(&GEO.block_bytes.to_le_bytes());
    b.extend_from_slice(&2u32.to_le_bytes());
    for (block, byte) in [(5u32, 7u8), (9, 8)] {
        b.extend_from_slice(&block.to_le_bytes());
        b.extend(std::iter::repeat_n(byte, bb));
    }
    let img = image::decode(GEO, &seal(b)).unwrap();
    assert_eq!(
        img,
        Image::from_blocks(vec![(5, vec![7; bb]), (9, vec![8; bb])])
    );
}

#[test]
fn a_version_1_partial_image_still_reads_as_no_ids_seen() {
    let mut b = Vec::new();
    b.extend_from_slice(b"CHKP");
    b.extend_from_slice(&1u32.to_le_bytes());
    b.extend_from_slice(&GEO.chunk_bytes.to_le_bytes());
    b.extend_from_slice(&GEO.block_bytes.to_le_bytes());
    b.extend_from_slice(&1u32.to_le_bytes());
    b.extend_from_slice(&3u64.to_le_bytes());
    b.extend_from_slice(&4u64.to_le_bytes());
    b.extend(std::iter::repeat_n(9u8, SECTOR as usize));
    let p = image::decode_part(GEO, &seal(b)).unwrap();
    assert_eq!(p.ids_seen, 0);
    assert_eq!(p.ranges, vec![(3, 4)]);
}

#[test]
fn operations_are_refused_by_name_and_writes_are_not_operations() {
    let mut b = encode_op(ChunkOp::Snapshot(9));
    b[4] = 7;
    let d = corrupt_detail(decode_op(&b).expect("an operation"));
    assert!(d.contains("kind 7"), "{d}");
    let mut b = encode_op(ChunkOp::DeleteSnapshot(9));
    b[8..16].copy_from_slice(&0u64.to_le_bytes());
    assert!(corrupt_detail(decode_op(&b).expect("an operation")).contains("id 0"));
    // Not 16 bytes, or not the magic: a write's data.
    assert!(decode_op(&[0; 16]).is_none());
    assert!(decode_op(&vec![0; SECTOR as usize]).is_none());
    let mut long = encode_op(ChunkOp::Snapshot(1));
    long.push(0);
    assert!(decode_op(&long).is_none());
    assert_eq!(&encode_op(ChunkOp::Snapshot(1))[..8], b"CHOP\x01\0\0\0");
    assert_eq!(
        op_declared(GEO),
        Declared::Blocks(vec![BlockRange {
            start: 0,
            end: GEO.chunk_bytes / SECTOR
        }])
    );
}
