//! The chunk's formats (docs/formats.md, "Chunk replicas"): decoders are total (any
//! bytes give a value or a typed error, never a panic), what is encoded decodes to
//! itself, and a flipped byte is refused.

use chorus_chunk::image::{self, Part};
use chorus_chunk::map::MapFile;
use chorus_chunk::{Geometry, SECTOR};
use proptest::prelude::*;

const GEO: Geometry = Geometry {
    chunk_bytes: 1 << 20,
    block_bytes: 4096,
};

fn map_file() -> impl Strategy<Value = MapFile> {
    (
        proptest::collection::btree_set(0u32..GEO.blocks(), 0..40),
        any::<u64>(),
    )
        .prop_map(|(blocks, generation)| MapFile {
            geometry: GEO,
            generation,
            // Slots 0..count, in an order that is not the blocks' own.
            entries: blocks
                .iter()
                .enumerate()
                .map(|(i, b)| (*b, (blocks.len() - 1 - i) as u32))
                .collect(),
        })
}

fn part() -> impl Strategy<Value = Part> {
    proptest::collection::btree_set(0u64..GEO.chunk_bytes / SECTOR, 1..10).prop_map(|starts| {
        // Ranges of one sector each, at distinct ascending sectors.
        let ranges: Vec<(u64, u64)> = starts.iter().map(|s| (*s, s + 1)).collect();
        let data = (0..ranges.len() as u64 * SECTOR).map(|i| i as u8).collect();
        Part { ranges, data }
    })
}

proptest! {
    #[test]
    fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = MapFile::decode("map", &bytes);
        let _ = image::decode(GEO, &bytes);
        let _ = image::decode_part(GEO, &bytes);
    }

    #[test]
    fn a_map_decodes_to_itself_and_a_flipped_byte_is_refused(m in map_file(), at in any::<prop::sample::Index>()) {
        let bytes = m.encode();
        prop_assert_eq!(MapFile::decode("map", &bytes).unwrap(), m);
        let mut bad = bytes.clone();
        let i = at.index(bad.len());
        bad[i] ^= 0x40;
        prop_assert!(MapFile::decode("map", &bad).is_err());
    }

    #[test]
    fn images_decode_to_themselves_and_a_flipped_byte_is_refused(
        blocks in proptest::collection::btree_map(0u32..GEO.blocks(), any::<u8>(), 0..8),
        p in part(),
        at in any::<prop::sample::Index>(),
    ) {
        let blocks: Vec<(u32, Vec<u8>)> =
            blocks.into_iter().map(|(b, x)| (b, vec![x; GEO.block_bytes as usize])).collect();
        let img = image::encode(GEO, &blocks);
        prop_assert_eq!(image::decode(GEO, &img).unwrap(), blocks);
        let mut bad = img.clone();
        let i = at.index(bad.len());
        bad[i] ^= 0x40;
        prop_assert!(image::decode(GEO, &bad).is_err());
        let pb = image::encode_part(GEO, &p);
        prop_assert_eq!(image::decode_part(GEO, &pb).unwrap(), p);
        let mut bad = pb.clone();
        let i = at.index(bad.len());
        bad[i] ^= 0x40;
        prop_assert!(image::decode_part(GEO, &bad).is_err());
    }
}
