//! Splitting a volume's I/O at chunk and block boundaries and putting it back together:
//! the pieces cover the range exactly once, in order, each inside one block of one
//! chunk; reads assembled from the pieces equal the volume's bytes; writes through the
//! pieces change exactly the bytes asked; bad ranges are refused by name.

use chorus_client::split::{reassemble, sector_span, split, Piece, SplitError};
use proptest::prelude::*;

#[test]
fn a_range_straddling_chunks_and_blocks_is_cut_at_each_boundary() {
    // Chunks of 1 MiB in 64 KiB blocks; 200 KiB from 10 KiB before the first chunk's end.
    let (cb, bb) = (1 << 20, 64 << 10);
    let p = split((1 << 20) - 10_240, 200 << 10, 4 << 20, cb, bb).unwrap();
    assert_eq!(
        p[0],
        Piece {
            chunk: 0,
            offset: (1 << 20) - 10_240,
            len: 10_240,
            at: 0
        }
    );
    assert_eq!(
        p[1],
        Piece {
            chunk: 1,
            offset: 0,
            len: 65_536,
            at: 10_240
        }
    );
    assert_eq!(p.len(), 4); // 10 KiB, then 64, 64 and 62 KiB of chunk 1
    assert_eq!(p[3].len, 63_488);
    assert_eq!(p[3].offset, 2 * 65_536);
    assert!(split(0, 0, 4 << 20, cb, bb).unwrap().is_empty());
}

#[test]
fn bad_ranges_and_geometries_are_refused_by_name() {
    assert_eq!(
        split(4 << 20, 1, 4 << 20, 1 << 20, 4096),
        Err(SplitError::PastEnd {
            offset: 4 << 20,
            len: 1,
            size: 4 << 20
        })
    );
    assert!(matches!(
        split(u64::MAX, 2, u64::MAX, 1 << 20, 4096),
        Err(SplitError::PastEnd { .. })
    ));
    assert!(matches!(
        split(0, 1, 100, 1000, 300),
        Err(SplitError::Geometry { .. })
    ));
    let e = split(10, 20, 25, 1 << 20, 4096).unwrap_err();
    assert_eq!(
        e.to_string(),
        "20 bytes at offset 10 run past the volume's 25 bytes"
    );
}

#[test]
fn sector_spans_widen_to_whole_sectors() {
    assert_eq!(sector_span(0, 4096, 4096), (0, 4096));
    assert_eq!(sector_span(1, 1, 4096), (0, 4096));
    assert_eq!(sector_span(4095, 2, 4096), (0, 8192));
    assert_eq!(sector_span(8192, 0, 4096), (8192, 8192));
}

proptest! {
    #[test]
    fn pieces_cover_the_range_once_and_reassemble_to_the_volume(
        chunk_blocks in 1u64..6,
        block_pow in 9u32..14,
        offset_frac in 0.0f64..1.0,
        len in 0u64..40_000,
        writes in proptest::collection::vec((0u64..60_000, 0u64..5000, any::<u8>()), 0..6),
    ) {
        let bb = 1u64 << block_pow;
        let cb = bb * chunk_blocks;
        let size = cb * 7;
        let offset = ((size as f64) * offset_frac) as u64;
        let len = len.min(size - offset);
        let pieces = split(offset, len, size, cb, bb).unwrap();
        // In order, contiguous, each inside one block of one chunk.
        let mut next = 0u64;
        for p in &pieces {
            prop_assert_eq!(p.at, next);
            prop_assert!(p.len > 0);
            prop_assert_eq!(p.chunk * cb + p.offset, offset + p.at);
            prop_assert!(p.offset + p.len <= cb);
            prop_assert_eq!(p.offset / bb, (p.offset + p.len - 1) / bb);
            next += p.len;
        }
        prop_assert_eq!(next, len);
        // A volume as chunks; writes through the pieces, then a read reassembled.
        let mut volume: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        let mut chunks: Vec<Vec<u8>> = volume.chunks(cb as usize).map(|c| c.to_vec()).collect();
        for (woff, wlen, byte) in writes {
            let woff = woff.min(size);
            let wlen = wlen.min(size - woff);
            let data = vec![byte; wlen as usize];
            for p in split(woff, wlen, size, cb, bb).unwrap() {
                let c = &mut chunks[p.chunk as usize];
                c[p.offset as usize..(p.offset + p.len) as usize]
                    .copy_from_slice(&data[p.at as usize..(p.at + p.len) as usize]);
            }
            volume[woff as usize..(woff + wlen) as usize].copy_from_slice(&data);
        }
        let parts: Vec<Vec<u8>> = pieces
            .iter()
            .map(|p| chunks[p.chunk as usize][p.offset as usize..(p.offset + p.len) as usize].to_vec())
            .collect();
        let got = reassemble(&pieces, &parts).unwrap();
        prop_assert_eq!(&got[..], &volume[offset as usize..(offset + len) as usize]);
        if let Some(first) = parts.first() {
            let mut short = parts.clone();
            short[0] = first[..first.len() - 1].to_vec();
            prop_assert!(reassemble(&pieces, &short).is_none());
        }
    }
}
