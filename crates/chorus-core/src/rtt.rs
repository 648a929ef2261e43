//! Recent acknowledgement round trips of one follower, for timed resends.
//!
//! Both replicas repair a copy that is late (lost, or stuck behind a slow connection of a
//! link that has several, PolarFS section 5.1) when later copies overtake it: the
//! out-of-order leader when a follower acknowledges slots past a hole
//! (`OooConfig::hole_resend`), the ordered follower when it holds appends past a gap
//! (`ReplicaConfig::gap_resend_after`). Neither fires for the *last* thing sent — a lone
//! writer, or the tail of a burst — where nothing comes later to overtake it, and the
//! append waited for the slow copy itself (up to the link's delay) or the periodic
//! resend. A timed resend covers that tail, as TCP's tail loss probe and RACK do (RFC
//! 8985): a copy not acknowledged within a few typical round trips is sent again.
//!
//! "Typical" is the median of the last [`SAMPLES`] round trips, not a mean: one slow
//! connection out of several gives a bimodal distribution whose mean (and TCP's
//! `srtt + 4 * rttvar`) sits near the slow mode, which is what the resend is meant to beat.
//! Only copies sent once are sampled (Karn's rule): an acknowledgement of a resent copy
//! does not say which copy it answers.

use crate::replica::Nanos;

/// Round trips remembered per follower.
pub const SAMPLES: usize = 16;

/// Round trips needed before a timeout is given: until then nothing is resent on time.
pub const MIN_SAMPLES: usize = 4;

/// The least timeout, whatever the round trips measured: below it a resend would race
/// the acknowledgement already on its way (and the driver's clock ticks about once a
/// millisecond under load anyway).
pub const MIN_TIMEOUT: Nanos = 200_000;

/// The last [`SAMPLES`] acknowledgement round trips of one follower.
#[derive(Clone, Debug, Default)]
pub struct RttWindow {
    samples: [Nanos; SAMPLES],
    /// Samples taken (the ring holds the last `min(n, SAMPLES)`).
    n: u64,
    /// Median of the ring, kept current by [`Self::sample`].
    median: Nanos,
}

impl RttWindow {
    /// Records one round trip: a copy sent once, acknowledged `rtt` after it was sent.
    pub fn sample(&mut self, rtt: Nanos) {
        self.samples[(self.n % SAMPLES as u64) as usize] = rtt;
        self.n += 1;
        let held = (self.n as usize).min(SAMPLES);
        let mut v = self.samples;
        let v = &mut v[..held];
        v.sort_unstable();
        self.median = v[held / 2];
    }

    /// Median of the recent round trips, once [`MIN_SAMPLES`] were taken.
    pub fn median(&self) -> Option<Nanos> {
        (self.n as usize >= MIN_SAMPLES).then_some(self.median)
    }

    /// How long a copy may go unacknowledged before it is sent again: `factor` times the
    /// median round trip, at least [`MIN_TIMEOUT`]; `None` with `factor` 0 (off) or before
    /// enough round trips were measured.
    pub fn timeout(&self, factor: u32) -> Option<Nanos> {
        if factor == 0 {
            return None;
        }
        self.median()
            .map(|m| m.saturating_mul(factor as Nanos).max(MIN_TIMEOUT))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_timeout_until_enough_round_trips_or_when_off() {
        let mut w = RttWindow::default();
        for _ in 0..MIN_SAMPLES - 1 {
            w.sample(1_000_000);
        }
        assert_eq!(w.timeout(2), None);
        w.sample(1_000_000);
        assert_eq!(w.timeout(2), Some(2_000_000));
        assert_eq!(w.timeout(0), None);
    }

    /// One slow connection of four: the median stays with the fast copies, where a mean
    /// would be pulled towards the slow ones.
    #[test]
    fn the_median_follows_the_fast_mode_of_a_bimodal_link() {
        let mut w = RttWindow::default();
        for i in 0..100u64 {
            w.sample(if i % 4 == 3 { 9_000_000 } else { 800_000 + i });
        }
        let m = w.median().expect("enough");
        assert!((800_000..900_000).contains(&m), "{m}");
        assert!(w.timeout(2).expect("on") < 2_000_000);
    }

    #[test]
    fn the_window_forgets_old_round_trips_and_keeps_a_floor() {
        let mut w = RttWindow::default();
        for _ in 0..SAMPLES {
            w.sample(50_000_000);
        }
        for _ in 0..SAMPLES {
            w.sample(10_000);
        }
        assert_eq!(w.median(), Some(10_000));
        assert_eq!(w.timeout(2), Some(MIN_TIMEOUT));
    }
}
