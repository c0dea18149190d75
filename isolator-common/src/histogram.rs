//! Log-linear latency histogram layout (HDR style): values below 2^SUB_BITS ns get one
//! bucket each; every power of two above is split into 2^SUB_BITS equal buckets. A
//! bucket's width is at most 1/32 of its lower bound, so its midpoint is within 1/64
//! (1.6 %) of any value in it. Values at or above 2^36 ns (~68.7 s) share the last bucket.
//!
//! Written without loops or `leading_zeros` so the BPF verifier accepts it as is.

const SUB_BITS: u32 = 5;
const SUB: u64 = 1 << SUB_BITS;
const MAX_EXP: u32 = 35;

/// Number of buckets of every histogram.
pub const HIST_BUCKETS: usize = ((MAX_EXP - SUB_BITS + 2) as usize) * SUB as usize;

/// Values below this are bucketed with bounded relative error; above, clamped.
pub const HIST_MAX_EXACT_NS: u64 = 1 << (MAX_EXP + 1);

/// floor(log2(v)) for v > 0, by binary search (branches only, verifier-friendly).
#[inline(always)]
const fn floor_log2(mut v: u64) -> u32 {
    let mut r = 0;
    if v >= 1 << 32 {
        v >>= 32;
        r += 32;
    }
    if v >= 1 << 16 {
        v >>= 16;
        r += 16;
    }
    if v >= 1 << 8 {
        v >>= 8;
        r += 8;
    }
    if v >= 1 << 4 {
        v >>= 4;
        r += 4;
    }
    if v >= 1 << 2 {
        v >>= 2;
        r += 2;
    }
    if v >= 1 << 1 {
        r += 1;
    }
    r
}

/// Bucket index of a latency in nanoseconds. Always `< HIST_BUCKETS`.
#[inline(always)]
pub const fn latency_bucket(ns: u64) -> usize {
    if ns < SUB {
        return ns as usize;
    }
    if ns >= HIST_MAX_EXACT_NS {
        return HIST_BUCKETS - 1;
    }
    let e = floor_log2(ns);
    let sub = (ns >> (e - SUB_BITS)) - SUB;
    let idx = ((e - SUB_BITS + 1) as u64) * SUB + sub;
    // Redundant for valid input; keeps the bound obvious to the verifier.
    if idx as usize >= HIST_BUCKETS {
        HIST_BUCKETS - 1
    } else {
        idx as usize
    }
}

/// Smallest value that falls into bucket `idx`.
pub const fn bucket_lower_ns(idx: usize) -> u64 {
    let idx = idx as u64;
    if idx < SUB {
        return idx;
    }
    let e = (idx / SUB) as u32 + SUB_BITS - 1;
    let sub = idx % SUB;
    (SUB + sub) << (e - SUB_BITS)
}

/// Number of distinct nanosecond values in bucket `idx`.
pub const fn bucket_width_ns(idx: usize) -> u64 {
    if (idx as u64) < SUB {
        return 1;
    }
    let e = (idx as u64 / SUB) as u32 + SUB_BITS - 1;
    1 << (e - SUB_BITS)
}

/// The value reported for samples in bucket `idx`: exact for one-value buckets, the
/// midpoint otherwise.
pub const fn bucket_representative_ns(idx: usize) -> u64 {
    let w = bucket_width_ns(idx);
    if w == 1 {
        bucket_lower_ns(idx)
    } else {
        bucket_lower_ns(idx) + w / 2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_contiguous_and_monotonic() {
        assert_eq!(HIST_BUCKETS, 1024);
        for idx in 0..HIST_BUCKETS - 1 {
            assert_eq!(
                bucket_lower_ns(idx) + bucket_width_ns(idx),
                bucket_lower_ns(idx + 1),
                "gap after bucket {idx}"
            );
        }
        assert_eq!(
            bucket_lower_ns(HIST_BUCKETS - 1) + bucket_width_ns(HIST_BUCKETS - 1),
            HIST_MAX_EXACT_NS
        );
    }

    #[test]
    fn every_value_lands_in_its_bucket() {
        let mut v = 0u64;
        while v < HIST_MAX_EXACT_NS {
            let idx = latency_bucket(v);
            assert!(bucket_lower_ns(idx) <= v && v < bucket_lower_ns(idx) + bucket_width_ns(idx));
            v = v * 2 + 1;
        }
        for idx in 0..HIST_BUCKETS {
            let lo = bucket_lower_ns(idx);
            let hi = lo + bucket_width_ns(idx) - 1;
            assert_eq!(latency_bucket(lo), idx);
            assert_eq!(latency_bucket(hi), idx);
        }
        assert_eq!(latency_bucket(u64::MAX), HIST_BUCKETS - 1);
    }

    #[test]
    fn representative_error_is_bounded() {
        for idx in 0..HIST_BUCKETS {
            let lo = bucket_lower_ns(idx);
            let hi = lo + bucket_width_ns(idx) - 1;
            let rep = bucket_representative_ns(idx) as f64;
            for v in [lo, hi] {
                let err = (rep - v as f64).abs() / (v.max(1) as f64);
                assert!(
                    err <= 1.0 / 64.0 + 1e-12,
                    "bucket {idx} value {v} err {err}"
                );
            }
        }
    }
}
