//! The exported latency histograms: a fixed `le` set from 10 us to 10 s, filled from the
//! kernel's fine log-linear buckets ([`isolator_common::histogram`]).
//!
//! No decimal bound falls on a fine bucket's edge (the edges are `(32 + k) << e`), so a fine
//! bucket is counted under the smallest bound at or above its *largest* value. Every sample
//! is then counted under a bound it is at or below: the exported cumulative counts never
//! say a request was faster than it was. A fine bucket that straddles a bound (it is at most
//! 1/32 of the bound wide) is counted one bound up: its samples below the bound are counted
//! as up to 1/32 slower than they were, and none is counted faster.

use isolator_common::{bucket_lower_ns, bucket_width_ns, latency_bucket, HIST_BUCKETS};

/// The `le` bounds, in ns: 1, 2.5, 5 per decade, as Prometheus' defaults, from 10 us to
/// 10 s.
pub const LE_NS: [u64; 19] = [
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
];

/// Buckets of an exported histogram: the bounds and +Inf.
pub const SLOTS: usize = LE_NS.len() + 1;

/// The `le` of each slot, in seconds (the last is +Inf).
pub fn le_seconds(slot: usize) -> f64 {
    LE_NS.get(slot).map_or(f64::INFINITY, |&ns| ns as f64 / 1e9)
}

/// The slot of every fine bucket: the first bound at or above the bucket's largest value.
const SLOT_OF_FINE: [u8; HIST_BUCKETS] = slot_table();

const fn slot_table() -> [u8; HIST_BUCKETS] {
    let mut table = [0u8; HIST_BUCKETS];
    let mut i = 0;
    while i < HIST_BUCKETS {
        let largest = bucket_lower_ns(i) + bucket_width_ns(i) - 1;
        let mut slot = 0;
        while slot < LE_NS.len() && LE_NS[slot] < largest {
            slot += 1;
        }
        table[i] = slot as u8;
        i += 1;
    }
    table
}

/// The slot of a fine bucket.
pub fn slot_of_fine(fine: usize) -> usize {
    SLOT_OF_FINE[fine.min(HIST_BUCKETS - 1)] as usize
}

/// The slot a value in ns is counted in (through its fine bucket, as the kernel's samples
/// are).
pub fn slot_of_ns(ns: u64) -> usize {
    slot_of_fine(latency_bucket(ns))
}

/// A cumulative histogram in the exported buckets (counts per slot, not cumulative over
/// slots), with the exact sum of its samples.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Histogram {
    pub slots: [u64; SLOTS],
    /// u128: a busy disk sums more than u64 nanoseconds can hold within weeks.
    pub sum_ns: u128,
}

impl Histogram {
    /// Adds a cycle's fine histogram (sparse: bucket index, count) and its samples' sum.
    pub fn add(&mut self, fine: &[(u16, u64)], sum_ns: u64) {
        for &(i, n) in fine {
            self.slots[slot_of_fine(i as usize)] += n;
        }
        self.sum_ns += sum_ns as u128;
    }

    /// Adds one sample.
    pub fn observe_ns(&mut self, ns: u64) {
        self.slots[slot_of_ns(ns)] += 1;
        self.sum_ns += ns as u128;
    }

    pub fn count(&self) -> u64 {
        self.slots.iter().sum()
    }

    pub fn sum_seconds(&self) -> f64 {
        self.sum_ns as f64 / 1e9
    }

    /// (le in seconds, count in that slot) for the encoder, which accumulates them.
    pub fn buckets(&self) -> [(f64, u64); SLOTS] {
        std::array::from_fn(|s| (le_seconds(s), self.slots[s]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every fine bucket lies wholly at or below its slot's bound and is not wholly at or
    /// below the bound before: counted once, under the first bound that covers it.
    #[test]
    fn every_fine_bucket_is_under_the_first_bound_that_covers_it() {
        for i in 0..HIST_BUCKETS {
            let lo = bucket_lower_ns(i);
            let hi = lo + bucket_width_ns(i) - 1;
            let s = slot_of_fine(i);
            if s < LE_NS.len() {
                assert!(
                    hi <= LE_NS[s],
                    "bucket {i} [{lo}, {hi}] above le {}",
                    LE_NS[s]
                );
            }
            if s > 0 {
                assert!(
                    hi > LE_NS[s - 1],
                    "bucket {i} [{lo}, {hi}] fits le {}",
                    LE_NS[s - 1]
                );
            }
        }
    }

    /// A bucket counted one bound up straddles that bound, and is at most 1/32 of it wide:
    /// what the conservative mapping costs.
    #[test]
    fn straddling_buckets_are_narrow() {
        for i in 0..HIST_BUCKETS {
            let lo = bucket_lower_ns(i);
            let s = slot_of_fine(i);
            if s > 0 && lo <= LE_NS[s - 1] {
                let bound = LE_NS[s - 1];
                assert!(
                    bucket_width_ns(i) * 32 <= bound,
                    "bucket {i} straddles {bound}"
                );
            }
        }
    }

    #[test]
    fn values_land_at_or_below_their_bound() {
        for ns in [
            0,
            1,
            9_999,
            10_000,
            10_001,
            4_999_999,
            5_000_000,
            9_000_000_000,
        ] {
            let s = slot_of_ns(ns);
            assert!(s == SLOTS - 1 || ns <= LE_NS[s], "{ns} in slot {s}");
        }
        assert_eq!(slot_of_ns(11_000_000_000), SLOTS - 1);
        assert_eq!(slot_of_ns(u64::MAX), SLOTS - 1);
        assert_eq!(slot_of_ns(1_000), 0);
        // Well inside a decade: exact.
        assert_eq!(slot_of_ns(3_000_000), 8);
    }

    #[test]
    fn histogram_adds_fine_buckets_and_sums() {
        let mut h = Histogram::default();
        let fine = [
            (latency_bucket(20_000) as u16, 3),
            (latency_bucket(700_000) as u16, 2),
        ];
        h.add(&fine, 1_460_000);
        h.observe_ns(12_000_000_000);
        assert_eq!(h.count(), 6);
        assert_eq!(h.slots[1], 3); // <= 25 us
        assert_eq!(h.slots[6], 2); // <= 1 ms
        assert_eq!(h.slots[SLOTS - 1], 1);
        assert_eq!(h.sum_ns, 12_001_460_000);
        let b = h.buckets();
        assert_eq!(b[0].0, 1e-5);
        assert!(b[SLOTS - 1].0.is_infinite());
    }
}
