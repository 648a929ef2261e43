//! Reading ranges for peers: what `read_range` returns, the chain point it starts from,
//! and how many reads it costs (a leader reads range after range for a lagging follower
//! inside its round).

mod common;

use chorus_core::format::group::ChainPoint;
use chorus_core::rng::Rng;
use chorus_storage::LogStorage;
use common::*;

/// Appends groups of one record each (small groups, as a lightly loaded leader seals)
/// until the log reaches `until`; returns every group boundary with its chain point.
fn small_groups(log: &mut LogStorage, rng: &mut Rng, until: u64) -> Vec<ChainPoint> {
    let mut points = vec![log.chain()];
    while log.end_lsn() < until {
        let g = next_groups(rng, &log.chain(), 1);
        log.append(&g).unwrap();
        points.push(log.chain());
    }
    log.sync().unwrap();
    // A padding group may have gone in before a group: its boundary too.
    let mut all = Vec::new();
    let mut c = points[0];
    all.push(c);
    for g in log.iter_from(c.end_lsn) {
        let (h, _) = g.unwrap();
        c = h.chain_after();
        all.push(c);
    }
    assert_eq!(all.last(), points.last());
    all
}

/// The bytes of the log from `from` to `to`, group by group.
fn bytes_between(log: &LogStorage, from: u64, to: u64) -> Vec<u8> {
    let mut out = Vec::new();
    for g in log.iter_from(from) {
        let (h, body) = g.unwrap();
        if h.lsn >= to {
            break;
        }
        out.extend_from_slice(&h.encode());
        out.extend_from_slice(&body);
    }
    out
}

/// Reads the log from `from` to its end in ranges of `max` bytes, checking each against
/// the groups and the chain points; returns the most reads one range took.
fn read_through(
    fs: &chorus_storage::fs::SimFs,
    log: &LogStorage,
    points: &[ChainPoint],
    from: u64,
    max: usize,
) -> u64 {
    let mut at = from;
    let mut most = 0;
    while at < log.end_lsn() {
        let before = fs.stats().reads;
        let (chain, bytes) = log.read_range(at, max).unwrap();
        most = most.max(fs.stats().reads - before);
        let want = points.iter().find(|c| c.end_lsn == at).expect("a boundary");
        assert_eq!(&chain, want, "the chain point at {at}");
        assert!(!bytes.is_empty());
        let end = at + bytes.len() as u64;
        assert!(
            points.iter().any(|c| c.end_lsn == end),
            "range from {at} ends at {end}, not a boundary"
        );
        assert!(
            bytes.len() <= max || bytes_between(log, at, at + 1).len() == bytes.len(),
            "range from {at} of {} bytes is over {max} and more than one group",
            bytes.len()
        );
        assert_eq!(bytes, bytes_between(log, at, end), "bytes from {at}");
        at = end;
    }
    most
}

#[test]
fn ranges_read_in_turn_cost_a_few_reads_each_and_match_the_groups() {
    let (fs, dyn_fs, dir) = sim();
    let mut log = LogStorage::create(dyn_fs, &dir, opts(), LOG_ID).unwrap();
    let mut rng = Rng::new(11);
    let points = small_groups(&mut log, &mut rng, 5 * BS + BS / 3);
    assert!(points.len() > 500, "{} groups", points.len());
    // From a boundary in the middle of the second block, in ranges of 8 KiB (about 20
    // groups): the first walks headers from the block's start, reading them in chunks
    // (a 64 KiB block is one chunk, where one read per header would be hundreds); every
    // later one starts where the last ended, so it costs one header read and one read per
    // block spanned.
    let mid = points
        .iter()
        .find(|c| c.end_lsn > BS + BS / 2)
        .unwrap()
        .end_lsn;
    let before = fs.stats().reads;
    log.chain_at(mid).unwrap();
    let walk = fs.stats().reads - before;
    assert!(
        (1..=2).contains(&walk),
        "the first walk took {walk} reads for half a block of headers"
    );
    let most = read_through(&fs, &log, &points, mid, 8 << 10);
    assert!(most <= 3, "a range took {most} reads");
    // A walk to a point in a block read before starts from the nearest point kept.
    let later = points
        .iter()
        .find(|c| c.end_lsn > 3 * BS + BS / 2 + 1000)
        .unwrap()
        .end_lsn;
    let before = fs.stats().reads;
    assert_eq!(
        Some(&log.chain_at(later).unwrap()),
        points.iter().find(|c| c.end_lsn == later)
    );
    let walk = fs.stats().reads - before;
    assert!(walk <= 2, "a walk from a kept point took {walk} reads");
    // One range of everything, and ranges of one byte (one group each).
    read_through(&fs, &log, &points, points[0].end_lsn, usize::MAX);
    read_through(&fs, &log, &points, points[0].end_lsn, 1);
}

#[test]
fn points_kept_past_a_truncation_or_below_a_trim_are_forgotten() {
    let (fs, dyn_fs, dir) = sim();
    let mut log = LogStorage::create(dyn_fs, &dir, opts(), LOG_ID).unwrap();
    let mut rng = Rng::new(12);
    let points = small_groups(&mut log, &mut rng, 4 * BS);
    // Read everything in small ranges: points are kept all along the log.
    read_through(&fs, &log, &points, points[0].end_lsn, 2 << 10);
    // Cut in the middle of the third block and write other groups after the cut: the
    // points kept past it are no longer boundaries, or not with those chains.
    let cut = points
        .iter()
        .find(|c| c.end_lsn > 2 * BS + BS / 3)
        .unwrap()
        .end_lsn;
    log.truncate(cut).unwrap();
    let mut rng = Rng::new(99);
    let mut points: Vec<ChainPoint> = points.into_iter().filter(|c| c.end_lsn <= cut).collect();
    points.extend(small_groups(&mut log, &mut rng, 5 * BS).into_iter().skip(1));
    read_through(&fs, &log, &points, points[0].end_lsn, 3 << 10);
    let past = points
        .iter()
        .find(|c| c.end_lsn > cut + 5000)
        .unwrap()
        .end_lsn;
    read_through(&fs, &log, &points, past, 1);
    // Trimmed below the fourth block: the points below it are gone with it, and reads
    // from the new start still find their chain.
    log.trim(3 * BS + 10).unwrap();
    assert_eq!(log.start_lsn(), 3 * BS);
    let from = points.iter().find(|c| c.end_lsn >= 3 * BS).unwrap().end_lsn;
    read_through(&fs, &log, &points, from, 5 << 10);
}
