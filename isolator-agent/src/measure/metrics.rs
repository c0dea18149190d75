//! Turns cycle deltas into per-(cgroup, disk, op) statistics: percentiles from the kernel's
//! log-linear histograms over a window that widens until it holds enough samples, rates,
//! and in-flight figures.

use std::collections::{HashMap, VecDeque};

use isolator_common::{
    bucket_lower_ns, bucket_representative_ns, bucket_width_ns, IoKey, Latencies, Latency,
};
use serde::{Deserialize, Serialize};

use crate::collect::collector::{KeyDelta, SparseHist};

/// A p99.9 needs 1000 samples to be anything but the maximum.
pub const P999_MIN_SAMPLES: u64 = 1000;
/// The window never spans more than this many cycles...
pub const MAX_WINDOW_CYCLES: usize = 60;
/// ...nor more than this much time.
pub const MAX_WINDOW_NS: u64 = 60_000_000_000;

/// Percentiles of one histogram window. A percentile is `None` when the window holds too
/// few samples for it to differ from the maximum (p99 needs 100, p99.9 needs 1000).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LatencySummary {
    pub samples: u64,
    #[serde(deserialize_with = "crate::events::f64_or_null")]
    pub window_s: f64,
    pub window_cycles: usize,
    pub p50_ns: Option<u64>,
    pub p99_ns: Option<u64>,
    pub p999_ns: Option<u64>,
    /// Upper bound of the highest occupied bucket (never under-reports the max).
    pub max_ns: Option<u64>,
    /// Exact mean over the current cycle's samples.
    pub mean_ns: Option<u64>,
}

/// The median of per-cycle (or per-run) figures, NaN left out; of an even count, the mean
/// of the middle two, so two figures give neither one alone (None: no figure).
pub fn median(mut v: Vec<f64>) -> Option<f64> {
    v.retain(|x| !x.is_nan());
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len().is_multiple_of(2) {
        (v[mid - 1] + v[mid]) / 2.0
    } else {
        v[mid]
    })
}

/// Nearest-rank percentile over bucket counts (ascending by bucket), reported as the
/// bucket's representative value.
pub fn percentile(hist: &[(u16, u64)], total: u64, q: f64) -> Option<u64> {
    if total == 0 {
        return None;
    }
    let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
    let mut seen = 0;
    for &(idx, n) in hist {
        seen += n;
        if seen >= rank {
            return Some(bucket_representative_ns(idx as usize));
        }
    }
    hist.last()
        .map(|&(idx, _)| bucket_representative_ns(idx as usize))
}

/// Folds a fine histogram into power-of-two buckets: (upper bound ns, count), ascending,
/// non-empty buckets only. For display, where 27 numbers say what 1024 would.
pub fn log2_histogram(hist: &[(u16, u64)]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &(idx, n) in hist {
        let upper = (bucket_lower_ns(idx as usize) + 1).next_power_of_two();
        match out.last_mut() {
            Some((u, c)) if *u == upper => *c += n,
            _ => out.push((upper, n)),
        }
    }
    out
}

fn summarize(merged: &[(u16, u64)], window_ns: u64, window_cycles: usize) -> LatencySummary {
    let samples: u64 = merged.iter().map(|(_, n)| n).sum();
    let need = |min: u64| (samples >= min).then_some(());
    LatencySummary {
        samples,
        window_s: window_ns as f64 / 1e9,
        window_cycles,
        p50_ns: need(1).and_then(|_| percentile(merged, samples, 0.50)),
        p99_ns: need(100).and_then(|_| percentile(merged, samples, 0.99)),
        p999_ns: need(P999_MIN_SAMPLES).and_then(|_| percentile(merged, samples, 0.999)),
        max_ns: merged
            .last()
            .map(|&(i, _)| bucket_lower_ns(i as usize) + bucket_width_ns(i as usize) - 1),
        mean_ns: None,
    }
}

/// A bucket-by-bucket sum of sparse histograms.
#[derive(Debug, Default)]
pub struct HistSum {
    buckets: Vec<u64>,
    samples: u64,
}

impl HistSum {
    pub fn add(&mut self, h: &SparseHist) {
        if self.buckets.is_empty() {
            self.buckets = vec![0; isolator_common::HIST_BUCKETS];
        }
        for &(i, n) in h {
            self.buckets[i as usize] += n;
            self.samples += n;
        }
    }
    pub fn samples(&self) -> u64 {
        self.samples
    }
    pub fn sparse(&self) -> SparseHist {
        self.buckets
            .iter()
            .enumerate()
            .filter(|(_, &n)| n > 0)
            .map(|(i, &n)| (i as u16, n))
            .collect()
    }
}

/// Recent cycles of one histogram, newest last.
#[derive(Debug, Default)]
pub struct HistWindow {
    cycles: VecDeque<(u64, SparseHist)>,
}

impl HistWindow {
    pub fn push(&mut self, interval_ns: u64, h: SparseHist) {
        self.cycles.push_back((interval_ns, h));
        while self.cycles.len() > MAX_WINDOW_CYCLES {
            self.cycles.pop_front();
        }
    }

    /// Summary over the newest cycles: just the last one if it has enough samples for a
    /// p99.9, otherwise widened backwards up to the window limits. Cycles older than the
    /// ones it used are dropped: no later summary can reach them (a later window ends
    /// later, so it has its samples, or its time, by then), and keeping them cost tens of
    /// KiB per key and histogram.
    pub fn summary(&mut self) -> LatencySummary {
        let (summary, used) = self.walk();
        let stale = self.cycles.len() - used;
        self.cycles.drain(..stale);
        summary
    }

    /// The summary, and how many of the newest cycles it took.
    fn walk(&self) -> (LatencySummary, usize) {
        let mut acc = HistSum::default();
        let mut window_ns = 0;
        let mut cycles = 0;
        for (interval, h) in self.cycles.iter().rev() {
            if cycles > 0 && window_ns + interval > MAX_WINDOW_NS {
                break;
            }
            acc.add(h);
            window_ns += interval;
            cycles += 1;
            if acc.samples() >= P999_MIN_SAMPLES {
                break;
            }
        }
        (summarize(&acc.sparse(), window_ns, cycles), cycles)
    }
}

/// Statistics of one (cgroup, disk, op) for one cycle.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct OpStats {
    pub ios: u64,
    pub bytes: u64,
    #[serde(deserialize_with = "crate::events::f64_or_null")]
    pub iops: f64,
    /// Megabytes (10^6 bytes) per second.
    #[serde(deserialize_with = "crate::events::f64_or_null")]
    pub mbps: f64,
    pub latency: LatencySummary,
    pub queue: LatencySummary,
    /// Request start to completion: queueing plus device, what the submitter waits.
    pub total: LatencySummary,
    pub inflight: Inflight,
    /// Requests counted in flight that were found completed without the programs seeing
    /// the completion (not in `ios`, `bytes` or the latency histograms).
    pub untraced_completions: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Inflight {
    /// At the end of the cycle (with `--count-inflight`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub now: Option<u64>,
    /// Most at once during the cycle (with `--count-inflight`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak: Option<u64>,
    /// Time-average over the cycle (Little's law: device busy time of the cycle's
    /// completions / cycle length).
    #[serde(deserialize_with = "crate::events::f64_or_null")]
    pub mean: f64,
}

/// Keeps the histogram windows of every key and turns deltas into [`OpStats`].
#[derive(Default)]
pub struct Metrics {
    windows: HashMap<IoKey, Latencies<HistWindow>>,
}

impl Metrics {
    /// Adds the cycle to the key's windows; returns its statistics unless the key was idle
    /// (an idle cycle still counts: it narrows what the window can cover).
    pub fn observe(
        &mut self,
        d: &KeyDelta,
        interval_ns: u64,
        inflight_counted: bool,
    ) -> Option<OpStats> {
        let windows = self.windows.entry(d.key).or_default();
        for which in Latency::ALL {
            windows
                .get_mut(which)
                .push(interval_ns, d.latency.get(which).hist.clone());
        }
        if d.is_idle() {
            return None;
        }
        let secs = interval_ns as f64 / 1e9;
        let [latency, q, t] = Latency::ALL.map(|which| {
            let delta = d.latency.get(which);
            let mut summary = windows.get_mut(which).summary();
            summary.mean_ns = (delta.count > 0).then(|| delta.sum_ns / delta.count);
            summary
        });
        Some(OpStats {
            ios: d.ios,
            bytes: d.bytes,
            iops: d.ios as f64 / secs,
            mbps: d.bytes as f64 / secs / 1e6,
            latency,
            queue: q,
            total: t,
            inflight: Inflight {
                now: inflight_counted.then_some(d.inflight_now),
                peak: inflight_counted.then_some(d.inflight_peak),
                mean: d.latency.device.sum_ns as f64 / interval_ns as f64,
            },
            untraced_completions: d.untraced_completions,
        })
    }

    pub fn forget_cgroup(&mut self, cgroup_id: u64) {
        self.windows.retain(|k, _| k.cgroup_id != cgroup_id);
    }

    pub fn forget_key(&mut self, key: &IoKey) {
        self.windows.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use isolator_common::latency_bucket;
    use rand::{rngs::StdRng, Rng, SeedableRng};

    #[test]
    fn log2_histogram_folds_buckets_by_power_of_two() {
        let fine = hist_of(&[
            900, 900, 1500, 1500, 1500, 1900, 70_000, 70_000, 70_000, 70_000,
        ]);
        assert_eq!(
            log2_histogram(&fine),
            vec![(1024, 2), (2048, 4), (131072, 4)]
        );
        assert!(log2_histogram(&[]).is_empty());
    }

    fn hist_of(samples: &[u64]) -> Vec<(u16, u64)> {
        let mut acc = vec![0u64; isolator_common::HIST_BUCKETS];
        for &s in samples {
            acc[latency_bucket(s)] += 1;
        }
        acc.iter()
            .enumerate()
            .filter(|(_, &n)| n > 0)
            .map(|(i, &n)| (i as u16, n))
            .collect()
    }

    fn exact(sorted: &[u64], q: f64) -> u64 {
        let n = sorted.len() as u64;
        let rank = ((q * n as f64).ceil() as u64).clamp(1, n);
        sorted[(rank - 1) as usize]
    }

    fn check(name: &str, mut samples: Vec<u64>) {
        let h = hist_of(&samples);
        samples.sort_unstable();
        for q in [0.5, 0.99, 0.999] {
            let want = exact(&samples, q) as f64;
            let got = percentile(&h, samples.len() as u64, q).unwrap() as f64;
            let err = (got - want).abs() / want.max(1.0);
            assert!(
                err <= 0.03,
                "{name}: q={q} exact={want} histogram={got} err={:.2}%",
                err * 100.0
            );
        }
    }

    #[test]
    fn percentiles_within_3_percent_random() {
        let mut rng = StdRng::seed_from_u64(7);
        // Uniform, log-uniform, exponential-ish and normal-ish latencies.
        check(
            "uniform",
            (0..100_000)
                .map(|_| rng.gen_range(1_000..50_000_000))
                .collect(),
        );
        check(
            "log-uniform",
            (0..100_000)
                .map(|_| 10f64.powf(rng.gen_range(3.0..10.5)) as u64)
                .collect(),
        );
        check(
            "exponential",
            (0..100_000)
                .map(|_| (-(1.0 - rng.gen::<f64>()).ln() * 80_000.0) as u64 + 20_000)
                .collect(),
        );
        check(
            "normal",
            (0..100_000)
                .map(|_| {
                    let s: f64 = (0..12).map(|_| rng.gen::<f64>()).sum::<f64>() - 6.0;
                    (250_000.0 + s * 20_000.0) as u64
                })
                .collect(),
        );
    }

    #[test]
    fn percentiles_within_3_percent_adversarial() {
        use isolator_common::{bucket_lower_ns, bucket_width_ns};
        // Every sample on a bucket's lower edge, then on its upper edge.
        let lows: Vec<u64> = (40..900).map(bucket_lower_ns).collect();
        check("lower-edges", lows.repeat(3));
        let highs: Vec<u64> = (40..900)
            .map(|i| bucket_lower_ns(i) + bucket_width_ns(i) - 1)
            .collect();
        check("upper-edges", highs.repeat(3));
        // Powers of two and their neighbours (octave boundaries).
        let mut pow = Vec::new();
        for e in 5..35 {
            pow.extend([(1u64 << e) - 1, 1 << e, (1 << e) + 1]);
        }
        check("octave-boundaries", pow.repeat(50));
        // Bimodal: 99.85 % fast, 0.15 % very slow (the p99.9 sits in the slow mode).
        let mut bi = vec![90_000u64; 99_850];
        bi.extend(std::iter::repeat_n(31_000_000u64, 150));
        check("bimodal", bi);
        // All identical; tiny values (exact linear buckets); a single sample.
        check("constant", vec![123_457; 5000]);
        check("tiny", (0..31).cycle().take(10_000).collect());
        check("single", vec![4_242_424]);
    }

    #[test]
    fn window_widens_until_p999_has_samples() {
        let mut w = HistWindow::default();
        for _ in 0..5 {
            w.push(1_000_000_000, vec![(500, 300)]);
        }
        let s = w.summary();
        assert_eq!(s.samples, 1200);
        assert_eq!(s.window_cycles, 4);
        assert!(s.p999_ns.is_some());
        // A busy cycle is enough on its own.
        w.push(1_000_000_000, vec![(600, 5000)]);
        let s = w.summary();
        assert_eq!((s.samples, s.window_cycles), (5000, 1));
    }

    #[test]
    fn too_few_samples_give_no_tail_percentile() {
        let mut w = HistWindow::default();
        w.push(1_000_000_000, vec![(500, 50)]);
        let s = w.summary();
        assert!(s.p50_ns.is_some());
        assert_eq!(s.p99_ns, None);
        assert_eq!(s.p999_ns, None);
        assert!(s.max_ns.unwrap() >= s.p50_ns.unwrap());
    }

    /// Dropping the cycles a summary did not use changes no later summary: a window that
    /// drops them and one that keeps everything agree at every step.
    #[test]
    fn dropping_unused_cycles_changes_no_summary() {
        let mut rng = StdRng::seed_from_u64(11);
        for _ in 0..200 {
            let mut pruned = HistWindow::default();
            let mut whole = HistWindow::default();
            for _ in 0..rng.gen_range(1..150) {
                let interval = [1_000_000_000, 2_500_000_000, 10_000_000_000][rng.gen_range(0..3)];
                let h: Vec<(u16, u64)> = match rng.gen_range(0..4) {
                    0 => vec![],
                    1 => vec![(rng.gen_range(0..900), rng.gen_range(1..50))],
                    2 => vec![(300, rng.gen_range(1..400)), (700, rng.gen_range(1..20))],
                    _ => vec![(rng.gen_range(0..900), rng.gen_range(500..3000))],
                };
                pruned.push(interval, h.clone());
                whole.push(interval, h);
                // Summaries are taken on busy cycles only, as Metrics::observe does.
                if rng.gen_bool(0.7) {
                    assert_eq!(pruned.summary(), whole.walk().0);
                    assert!(pruned.cycles.len() <= whole.cycles.len());
                }
            }
        }
    }

    #[test]
    fn window_is_bounded_in_time() {
        let mut w = HistWindow::default();
        for _ in 0..100 {
            w.push(10_000_000_000, vec![(10, 1)]);
        }
        let s = w.summary();
        assert_eq!(s.window_cycles, 6);
        assert_eq!(s.samples, 6);
    }
}
