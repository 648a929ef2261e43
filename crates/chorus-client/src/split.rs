//! Splitting a volume's I/O at chunk and block boundaries, and putting it back together
//! (PolarFS section 3.2: a volume is a sequence of chunks; a request at any byte offset
//! and length becomes one piece per chunk block it touches, each sent to its chunk).
//!
//! [`split`] is pure arithmetic: the pieces of `len` bytes at volume offset `offset`,
//! in order, each inside one block of one chunk, together covering the range exactly
//! once. [`sector_span`] widens a range to whole sectors, the unit a chunk takes writes
//! in: a write that does not start and end on sector boundaries is a read of the
//! sectors it touches, a change of the bytes asked, and a write of those sectors.

/// One piece of a volume I/O: `len` bytes at `offset` in chunk `chunk`, which are bytes
/// `at..at + len` of the caller's buffer. Invariant: the piece lies inside one block of
/// one chunk, and `len > 0`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// The chunk's index in the volume.
    pub chunk: u64,
    /// Byte offset in the chunk.
    pub offset: u64,
    /// Bytes.
    pub len: u64,
    /// Where the piece's bytes are in the caller's buffer.
    pub at: u64,
}

/// Why a range cannot be split.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SplitError {
    /// The range runs past the volume's end.
    #[error("{len} bytes at offset {offset} run past the volume's {size} bytes")]
    PastEnd {
        /// Start.
        offset: u64,
        /// Length.
        len: u64,
        /// The volume's size.
        size: u64,
    },
    /// The geometry breaks its invariants (a block that does not divide the chunk).
    #[error("block_bytes {block_bytes} does not divide chunk_bytes {chunk_bytes}")]
    Geometry {
        /// Chunk size.
        chunk_bytes: u64,
        /// Block size.
        block_bytes: u64,
    },
}

/// The pieces of `len` bytes at `offset` of a volume of `size` bytes made of chunks of
/// `chunk_bytes` bytes allocated in blocks of `block_bytes` (see the module docs). An
/// empty range has no pieces.
pub fn split(
    offset: u64,
    len: u64,
    size: u64,
    chunk_bytes: u64,
    block_bytes: u64,
) -> Result<Vec<Piece>, SplitError> {
    if block_bytes == 0 || chunk_bytes == 0 || !chunk_bytes.is_multiple_of(block_bytes) {
        return Err(SplitError::Geometry {
            chunk_bytes,
            block_bytes,
        });
    }
    match offset.checked_add(len) {
        Some(end) if end <= size => {}
        _ => return Err(SplitError::PastEnd { offset, len, size }),
    }
    let mut pieces = Vec::new();
    let mut at = 0u64;
    while at < len {
        let pos = offset + at;
        let in_block = block_bytes - pos % block_bytes;
        let n = in_block.min(len - at);
        pieces.push(Piece {
            chunk: pos / chunk_bytes,
            offset: pos % chunk_bytes,
            len: n,
            at,
        });
        at += n;
    }
    Ok(pieces)
}

/// Puts the pieces' bytes back together: `parts[i]` holds `pieces[i].len` bytes read
/// for `pieces[i]`. Returns `None` when a part's length does not match its piece.
pub fn reassemble(pieces: &[Piece], parts: &[Vec<u8>]) -> Option<Vec<u8>> {
    if pieces.len() != parts.len() {
        return None;
    }
    let total: u64 = pieces.iter().map(|p| p.len).sum();
    let mut out = vec![0u8; usize::try_from(total).ok()?];
    for (p, bytes) in pieces.iter().zip(parts) {
        if bytes.len() as u64 != p.len {
            return None;
        }
        let at = p.at as usize;
        out.get_mut(at..at + bytes.len())?.copy_from_slice(bytes);
    }
    Some(out)
}

/// The smallest range of whole sectors (`sector` bytes each) holding `len` bytes at
/// `offset`: `(start, end)`.
pub fn sector_span(offset: u64, len: u64, sector: u64) -> (u64, u64) {
    let start = offset - offset % sector;
    let end = (offset + len).div_ceil(sector) * sector;
    (start, end)
}
