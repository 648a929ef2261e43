//! The follower apply gap: for each record, the time from its apply on the leader to its
//! apply on a follower, both read from `CLOCK_MONOTONIC` (one clock for every process of
//! the machine on Linux).

use std::collections::HashMap;

/// `CLOCK_MONOTONIC` in nanoseconds: comparable across the processes of one machine.
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we pass; CLOCK_MONOTONIC always
    // exists on Linux.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Summary of a set of gaps, in microseconds.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct GapStats {
    /// Records matched on the leader and the follower(s).
    pub count: usize,
    /// Median.
    pub median_us: f64,
    /// 99th percentile (nearest rank).
    pub p99_us: f64,
    /// Mean.
    pub mean_us: f64,
    /// Largest.
    pub max_us: f64,
}

/// Gaps (ns, follower − leader; negative if a follower applied first) of the records the
/// leader applied inside `[from, to)`, matched by record id. Records a follower applied
/// that the leader did not (or outside the window) are ignored, as are ids seen twice on
/// the follower beyond the first.
pub fn gaps(leader: &HashMap<u64, u64>, follower: &[(u64, u64)], from: u64, to: u64) -> Vec<i64> {
    let mut seen = std::collections::HashSet::with_capacity(follower.len());
    follower
        .iter()
        .filter(|(id, _)| seen.insert(*id))
        .filter_map(|(id, tf)| {
            let tl = *leader.get(id)?;
            (from..to).contains(&tl).then_some(*tf as i64 - tl as i64)
        })
        .collect()
}

/// The nearest-rank `q` quantile of sorted values.
fn quantile(sorted: &[i64], q: f64) -> i64 {
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// Median, p99, mean and max of `gaps_ns`; `None` when empty.
pub fn stats(gaps_ns: &mut [i64]) -> Option<GapStats> {
    if gaps_ns.is_empty() {
        return None;
    }
    gaps_ns.sort_unstable();
    let us = |ns: i64| ns as f64 / 1e3;
    let sum: i128 = gaps_ns.iter().map(|&g| g as i128).sum();
    Some(GapStats {
        count: gaps_ns.len(),
        median_us: us(quantile(gaps_ns, 0.5)),
        p99_us: us(quantile(gaps_ns, 0.99)),
        mean_us: sum as f64 / gaps_ns.len() as f64 / 1e3,
        max_us: us(*gaps_ns.last().expect("non-empty")),
    })
}

/// Encodes `(id, ns)` pairs as little-endian u64 pairs (what a replica process writes).
pub fn encode(v: &[(u64, u64)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len() * 16);
    for (a, b) in v {
        out.extend_from_slice(&a.to_le_bytes());
        out.extend_from_slice(&b.to_le_bytes());
    }
    out
}

/// Decodes what [`encode`] wrote.
pub fn decode(b: &[u8]) -> Result<Vec<(u64, u64)>, String> {
    if !b.len().is_multiple_of(16) {
        return Err(format!(
            "apply record file of {} bytes, not pairs of u64",
            b.len()
        ));
    }
    Ok(b.chunks_exact(16)
        .map(|c| {
            (
                u64::from_le_bytes(c[..8].try_into().expect("8")),
                u64::from_le_bytes(c[8..].try_into().expect("8")),
            )
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_match_ids_inside_the_window_only() {
        let leader: HashMap<u64, u64> = [(1, 100), (2, 200), (3, 300), (4, 1_000)].into();
        // 5 is unknown to the leader, 4 is outside the window, 2 appears twice.
        let follower = vec![(2, 260), (1, 150), (2, 999), (5, 10), (4, 1_100), (3, 290)];
        let mut g = gaps(&leader, &follower, 0, 500);
        g.sort_unstable();
        assert_eq!(g, vec![-10, 50, 60]);
    }

    #[test]
    fn stats_use_nearest_rank_percentiles() {
        let mut g: Vec<i64> = (1..=100).rev().map(|i| i * 1000).collect();
        let s = stats(&mut g).unwrap();
        assert_eq!(s.count, 100);
        assert_eq!(s.median_us, 50.0);
        assert_eq!(s.p99_us, 99.0);
        assert_eq!(s.max_us, 100.0);
        assert!((s.mean_us - 50.5).abs() < 1e-9);
        assert_eq!(stats(&mut []), None);
        let one = stats(&mut [7_000]).unwrap();
        assert_eq!((one.median_us, one.p99_us), (7.0, 7.0));
    }

    #[test]
    fn apply_records_round_trip_and_bad_lengths_are_refused() {
        let v = vec![(1, 2), (u64::MAX, 0), (42, 1 << 40)];
        assert_eq!(decode(&encode(&v)).unwrap(), v);
        assert!(decode(&[0u8; 17]).unwrap_err().contains("17 bytes"));
    }

    #[test]
    fn the_monotonic_clock_moves_forward() {
        let a = mono_ns();
        let b = mono_ns();
        assert!(b >= a && a > 0);
    }
}
