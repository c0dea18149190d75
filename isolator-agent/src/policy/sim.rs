//! A deterministic simulated disk for the policy tests (and, with the `sim` feature, the
//! policy-cost benchmark). Latency services see a p99.9 that
//! rises with the bandwidth everyone else pushes through the device, shaped after the test
//! machine's measured noisy-neighbor curve (DESIGN.md: 0.43 ms alone; writer at 400 MB/s
//! 3.2 ms, at 800 MB/s 19 ms, uncapped ~2 GB/s 27 ms) and with their own queue depth.
//! Throughput services share what is left of the device's bandwidth. The cycle right after
//! a limit changes is a transition: the services run at their new rates in it, a cut one
//! after a little of its old rate's queue ([`CUT_DRAIN`]).

use super::*;
use crate::config::{Rate, SloClass};

const CAPACITY_BPS: f64 = 2.0e9;
/// In the transition of a cut, the share of the way from the new rate back to the old that
/// the cut service's counters show: the old rate's queue passes in the cycle's first few
/// ms, too few of the others' I/Os to move their p99.9. Measured on the test disk
/// (BENCHMARKS run BU): 0.7-14 %, all but two under 3 %, and the reader's p99.9 in that
/// cycle was the new cap's.
const CUT_DRAIN: f64 = 0.03;
const MB: f64 = 1e6;

/// p99.9 added to a small random read by `others_bps` of other traffic, in ns, on a disk
/// whose knee is at `knee_scale` times the measured one.
fn interference_ns(others_bps: f64, knee_scale: f64) -> f64 {
    let others_bps = others_bps / knee_scale;
    let table = [
        (0.0, 0.0),
        (100.0, 2.47),
        (200.0, 2.47),
        (400.0, 2.77),
        (800.0, 18.57),
        (1200.0, 21.57),
        (2000.0, 26.57),
        (4000.0, 30.0),
    ];
    let x = others_bps / MB;
    for w in table.windows(2) {
        let ((x0, y0), (x1, y1)) = (w[0], w[1]);
        if x <= x1 {
            return (y0 + (y1 - y0) * (x - x0) / (x1 - x0)) * 1e6;
        }
    }
    30.0e6
}

#[derive(Debug, Clone)]
pub struct SimService {
    pub name: &'static str,
    pub class: SloClass,
    pub floor: Option<Rate>,
    /// Latency services: queue depth and I/O size (small random reads).
    pub qd: f64,
    /// Offered load in bytes/s when unthrottled (throughput and best-effort services).
    pub demand_bps: f64,
    /// Cycle from which the service runs.
    pub start: u64,
    /// Runs `on` cycles, then rests `off` cycles, from `start` on (None: always runs).
    pub on_off: Option<(u64, u64)>,
    /// How much a byte of it hurts a small random read, relative to a large sequential
    /// write's byte (a 4 KiB random read costs the device far more per byte).
    pub cost_per_byte: f64,
    pub limit: IoMaxLimit,
    pub changed: Option<u64>,
    /// The share of its first cycle (and of each return's, on/off) it runs in (1: all of
    /// it). Its rate in that cycle averages over the whole cycle, but what it does to others
    /// is its rate while it runs.
    pub arrival_share: f64,
}

impl SimService {
    pub fn latency(name: &'static str, slo_ms: f64, qd: f64) -> Self {
        SimService {
            name,
            class: SloClass::latency_p999((slo_ms * 1e6) as u64),
            floor: None,
            qd,
            demand_bps: 0.0,
            start: 0,
            on_off: None,
            cost_per_byte: 1.0,
            limit: IoMaxLimit::default(),
            changed: None,
            arrival_share: 1.0,
        }
    }
    /// A throughput service with a `rate_mbps` target that would use `demand_mbps` from
    /// cycle 0.
    pub fn throughput(name: &'static str, rate_mbps: f64, demand_mbps: f64) -> Self {
        let rate_bps = (rate_mbps * MB) as u64;
        Self::writer(name, SloClass::Throughput { rate_bps }, demand_mbps, 0)
    }
    pub fn writer(name: &'static str, class: SloClass, demand_mbps: f64, start: u64) -> Self {
        SimService {
            name,
            class,
            floor: None,
            qd: 32.0,
            demand_bps: demand_mbps * MB,
            start,
            on_off: None,
            cost_per_byte: 1.0,
            limit: IoMaxLimit::default(),
            changed: None,
            arrival_share: 1.0,
        }
    }

    /// A 4 KiB random reader at `qd` (best-effort) that wants `demand_mbps`: each of its
    /// bytes hurts others as much as eight bytes of a sequential writer.
    pub fn random_reader(name: &'static str, demand_mbps: f64, start: u64) -> Self {
        SimService {
            cost_per_byte: 8.0,
            qd: 64.0,
            ..Self::writer(name, SloClass::BestEffort, demand_mbps, start)
        }
    }

    fn running(&self, cycle: u64) -> bool {
        cycle >= self.start
            && self
                .on_off
                .is_none_or(|(on, off)| (cycle - self.start) % (on + off) < on)
    }
}

#[derive(Clone)]
pub struct SimDisk {
    pub cycle: u64,
    pub services: Vec<SimService>,
    /// Where the knee is, relative to the measured curve (moves it during a run).
    pub knee_scale: f64,
    /// Seed of the per-cycle p99.9 noise (None: a smooth disk).
    pub noise_seed: Option<u64>,
    /// With a seed: log-normal per-cycle noise of this sigma (of ln p99.9) instead of the
    /// mild default, for the scatter the test disk shows under a random-read scan.
    pub noise_sigma: Option<f64>,
    /// With a seed: bimodal per-cycle noise, as the test disk's reader shows next to a
    /// writer capped under its knee (0.5-0.9 ms most cycles, 3-6 ms in the writer's
    /// bursts): there, this share of cycles are bursts at 0.9-1.1 of the curve, the others
    /// quiet at this fraction of it (0.8-1.2 of the fraction). Over the knee (others over
    /// 600 MB/s) the writer leaves no gaps: every cycle is a burst.
    pub noise_bursts: Option<(f64, f64)>,
    /// A stall of the disk: this much added to every latency service's p99.9 whatever the
    /// load (the device completes nothing for a while; no cap shortens that).
    pub stall_ns: f64,
    /// Instead of the measured curve, a smooth one: others' traffic adds 2.5 ms to the
    /// p99.9 at this many MB/s (times `knee_scale`), rising as a power of it with this
    /// exponent. A curve without the measured one's plateau, on which a search's line
    /// steps shrink as they near the target.
    pub smooth_curve: Option<(f64, f64)>,
    /// The host under a guest's virtual disk: it drains the guest's writes at the first
    /// MB/s, and what it has not drained piles up (its page cache) until, past the second
    /// (MB), its writeback stalls the device for a cycle and the pile is gone. The stall
    /// puts every latency service at 1.5-3 times its target whatever its level (with a
    /// seed; without one at 2 times). So a cap under the drain rate never stalls, and over
    /// it the stalls come more often the higher it is, one or more cycles after the raise
    /// that caused them: no two-cycle probe window sees them. As the v2 guest shows
    /// (BENCHMARKS run CL): static 2000 MB/s broke 1 cycle of 49, static 3000 broke 12, in
    /// pairs every 7-8 cycles; raises to 3443 and 3532 MB/s stalled 16 and 17 cycles later.
    pub host_writeback: Option<(f64, f64)>,
    /// What the host has not drained yet, MB.
    writeback_pile_mb: f64,
    /// The previous cycle's bulk rates, for the transition cycle.
    prev_rates: Vec<f64>,
    /// In the transition of a cut, the share of the way back to the old rate the cut
    /// service's counters show ([`CUT_DRAIN`] unless a test makes the old queue longer).
    pub cut_drain: f64,
}

impl SimDisk {
    pub fn new(services: Vec<SimService>) -> Self {
        let n = services.len();
        SimDisk {
            cycle: 0,
            services,
            knee_scale: 1.0,
            noise_seed: None,
            noise_sigma: None,
            noise_bursts: None,
            stall_ns: 0.0,
            smooth_curve: None,
            host_writeback: None,
            writeback_pile_mb: 0.0,
            prev_rates: vec![0.0; n],
            cut_drain: CUT_DRAIN,
        }
    }

    fn bulk_rates(&self) -> Vec<f64> {
        // Requested rates after caps, then shared out if the device is oversubscribed.
        let want: Vec<f64> = self
            .services
            .iter()
            .map(|s| {
                if !s.running(self.cycle) || s.demand_bps == 0.0 {
                    return 0.0;
                }
                let cap = s.limit.total_bps().map_or(f64::MAX, |c| c as f64);
                s.demand_bps.min(cap)
            })
            .collect();
        let total: f64 = want.iter().sum();
        let scale = if total > CAPACITY_BPS * 0.95 {
            CAPACITY_BPS * 0.95 / total
        } else {
            1.0
        };
        want.iter().map(|w| w * scale).collect()
    }

    /// Multiplier of service `i`'s p99.9 this cycle: 1 on a smooth disk; on a noisy one
    /// 0.7-1.15 most cycles and 1.3 one cycle in twenty, as the test disk's per-cycle p99.9
    /// scatters under a fixed cap (DESIGN.md; BENCHMARKS.md's static-cap rows).
    fn noise(&self, i: usize, others_bps: f64) -> f64 {
        let Some(seed) = self.noise_seed else {
            return 1.0;
        };
        // SplitMix64 of (seed, cycle, service), and its next output: two uniforms,
        // deterministic, no dependency.
        let z = seed
            .wrapping_add(self.cycle.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .wrapping_add((i as u64).wrapping_mul(0xD1B5_4A32_D192_ED03));
        let z = splitmix(z);
        let u = unit_interval(z);
        let v = unit_interval(splitmix(z.wrapping_add(0x9E37_79B9_7F4A_7C15)));
        if let Some(sigma) = self.noise_sigma {
            // Box-Muller.
            let normal = (-2.0 * (1.0 - u).ln()).sqrt() * (std::f64::consts::TAU * v).cos();
            return (sigma * normal).exp();
        }
        if let Some((share, quiet)) = self.noise_bursts {
            return if u < share || others_bps / self.knee_scale > 600.0 * MB {
                0.9 + 0.2 * v
            } else {
                quiet * (0.8 + 0.4 * v)
            };
        }
        if u < 0.05 {
            1.3
        } else {
            0.7 + 0.45 * (u - 0.05) / 0.95
        }
    }

    /// Whether the host's writeback stalls this cycle (see [`SimDisk::host_writeback`]), and
    /// how many times their targets it holds latency services at.
    fn host_stall(&mut self, rates: &[f64]) -> Option<f64> {
        let (drain_mbps, pile_mb) = self.host_writeback?;
        let total_mb: f64 = rates.iter().sum::<f64>() / MB;
        self.writeback_pile_mb = (self.writeback_pile_mb + total_mb - drain_mbps).max(0.0);
        if self.writeback_pile_mb <= pile_mb {
            return None;
        }
        self.writeback_pile_mb = 0.0;
        let v = self.noise_seed.map_or(0.5, |seed| {
            unit_interval(splitmix((seed ^ 0x5EED_57A1).wrapping_add(self.cycle)))
        });
        Some(1.5 + 1.5 * v)
    }

    /// Runs one cycle and returns what the policies see.
    pub fn step(&mut self) -> DeviceCycle {
        let rates = self.bulk_rates();
        let host_stall = self.host_stall(&rates);
        // What a service's counters show: in its arrival cycle, only the share it ran.
        let shown = |i: usize| {
            let s = &self.services[i];
            let arriving = self.cycle == s.start
                || (s.running(self.cycle) && !s.running(self.cycle.saturating_sub(1)));
            let drain = if s.changed == Some(self.cycle.wrapping_sub(1)) {
                self.cut_drain * (self.prev_rates[i] - rates[i]).max(0.0)
            } else {
                0.0
            };
            rates[i] * if arriving { s.arrival_share } else { 1.0 } + drain
        };
        let mut loads = vec![];
        for (i, s) in self.services.iter().enumerate() {
            let running = s.running(self.cycle);
            // Other traffic as the equivalent bytes of a sequential writer.
            let others = |r: &[f64]| -> f64 {
                r.iter()
                    .enumerate()
                    .filter(|(j, _)| *j != i)
                    .map(|(j, v)| v * self.services[j].cost_per_byte)
                    .sum()
            };
            let mut l = SimLoadBuilder::default();
            if let SloClass::Latency(_) = s.class {
                if running {
                    let others_bps = others(&rates);
                    // Own queue depth costs 0.1 ms per queued request at the tail.
                    let interference = match self.smooth_curve {
                        Some((at_mbps, exponent)) => {
                            2.5e6 * (others_bps / (at_mbps * MB * self.knee_scale)).powf(exponent)
                        }
                        None => interference_ns(others_bps, self.knee_scale),
                    };
                    let mut p999 = (0.43e6 + interference + (s.qd - 1.0) * 0.1e6)
                        * self.noise(i, others_bps)
                        + self.stall_ns;
                    if let (Some(stalled), SloClass::Latency(t)) = (host_stall, s.class) {
                        p999 = p999.max(stalled * t.target_ns as f64);
                    }
                    let mean = 0.08e6 + p999 / 20.0;
                    let mut iops = s.qd / (mean / 1e9);
                    if let Some(c) = s.limit.riops {
                        iops = iops.min(c as f64);
                    }
                    l.read_iops = iops;
                    l.read_bps = iops * 4096.0;
                    l.p999 = Some(p999 as u64);
                    l.samples = iops as u64;
                    // Most requests near the mean, the slowest 0.2 % at the p99.9.
                    let tail = (l.samples / 500).max(1);
                    let bucket =
                        |ns: f64| isolator_common::histogram::latency_bucket(ns as u64) as u16;
                    l.hist = vec![(bucket(mean), l.samples - tail), (bucket(p999), tail)];
                    l.mean = Some(mean);
                    l.inflight = iops * mean / 1e9;
                }
            } else if running && s.cost_per_byte > 1.0 {
                l.read_bps = shown(i);
                l.read_iops = shown(i) / 4096.0;
                l.mean = Some(0.2e6 * s.qd);
                l.inflight = s.qd;
                l.samples = l.read_iops as u64;
                l.p999 = Some((0.6e6 * s.qd) as u64);
            } else if running {
                l.write_bps = shown(i);
                l.write_iops = shown(i) / (1 << 20) as f64;
                let mean = 0.6e6 * (1.0 + rates.iter().sum::<f64>() / CAPACITY_BPS * 10.0);
                l.inflight = (l.write_iops * mean / 1e9).min(s.qd);
                l.mean = Some(mean);
                l.samples = l.write_iops as u64;
                l.p999 = Some((mean * 3.0) as u64);
            }
            loads.push(ServiceLoad {
                id: i,
                name: s.name.into(),
                class: s.class,
                floor: s.floor,
                ceiling: None,
                read_bps: l.read_bps,
                write_bps: l.write_bps,
                read_iops: l.read_iops,
                write_iops: l.write_iops,
                p999_ns: l.p999,
                samples: l.samples,
                mean_latency_ns: l.mean,
                mean_inflight: l.inflight,
                peak_inflight: Some(l.inflight.ceil() as u64),
                limit: s.limit,
                changed_cycle: s.changed,
                character: Default::default(),
                latency_hist: l.hist,
                cgroup_ids: vec![],
            });
        }
        let util = (rates.iter().sum::<f64>() / CAPACITY_BPS
            + loads
                .iter()
                .filter(|l| l.slo_ns().is_some())
                .map(|l| l.mean_inflight)
                .sum::<f64>())
        .min(1.0);
        self.prev_rates = rates;
        DeviceCycle {
            cycle: self.cycle,
            dev: 1,
            interval_s: 1.0,
            utilization: util,
            services: loads,
            throttle_wait_timed: true,
        }
    }

    /// Applies decisions (as the enforcer would) and advances the clock.
    pub fn apply(&mut self, decisions: &[Decision]) {
        for d in decisions {
            let s = &mut self.services[d.service];
            s.limit.set(d.knob, d.to);
            s.changed = Some(self.cycle);
        }
        self.cycle += 1;
    }

    /// Runs one cycle in which the disk stalls for `stall_ns` under a policy.
    pub fn run_stalled(
        &mut self,
        p: &mut dyn Policy,
        stall_ns: f64,
    ) -> Vec<(DeviceCycle, Vec<Decision>)> {
        self.stall_ns = stall_ns;
        let h = self.run(p, 1);
        self.stall_ns = 0.0;
        h
    }

    /// The first knee scale (in thousandths, in the order given) at which the first
    /// service's p99.9, `ahead` cycles from now under today's caps and loads, falls in
    /// `fraction` of its target: where a test moves the knee to make a cap break by a chosen
    /// amount. The probe disk keeps the curve, not the noise or a stall.
    pub fn knee_scale_for(
        &self,
        per_mille: impl IntoIterator<Item = u32>,
        ahead: u64,
        fraction: std::ops::Range<f64>,
    ) -> Option<f64> {
        self.scale_where(per_mille, fraction, |k| {
            let mut probe = SimDisk::new(self.services.clone());
            probe.smooth_curve = self.smooth_curve;
            probe.cycle = self.cycle + ahead;
            probe.knee_scale = k;
            probe
        })
    }

    /// As [`SimDisk::knee_scale_for`], for the next cycle as this disk will run it: a
    /// transition after a change included (the rates of the cycle before still passing),
    /// the noise and a stall not.
    pub fn knee_scale_for_next(
        &self,
        per_mille: impl IntoIterator<Item = u32>,
        fraction: std::ops::Range<f64>,
    ) -> Option<f64> {
        self.scale_where(per_mille, fraction, |k| {
            let mut probe = self.clone();
            probe.knee_scale = k;
            probe.noise_seed = None;
            probe.stall_ns = 0.0;
            probe
        })
    }

    fn scale_where(
        &self,
        per_mille: impl IntoIterator<Item = u32>,
        fraction: std::ops::Range<f64>,
        probe_at: impl Fn(f64) -> SimDisk,
    ) -> Option<f64> {
        per_mille
            .into_iter()
            .map(|k| f64::from(k) / 1000.0)
            .find(|&k| {
                let first = &probe_at(k).step().services[0];
                let target = first
                    .slo_ns()
                    .expect("the first service has a latency target");
                fraction.contains(&(first.p999_ns.unwrap() as f64 / target as f64))
            })
    }

    /// Runs `n` cycles under a policy; returns every cycle's input and decisions.
    pub fn run(&mut self, p: &mut dyn Policy, n: u64) -> Vec<(DeviceCycle, Vec<Decision>)> {
        (0..n)
            .map(|_| {
                let c = self.step();
                let d = p.decide(&c);
                self.apply(&d);
                (c, d)
            })
            .collect()
    }
}

/// A uniform in [0, 1) from the top 53 bits of `z`.
fn unit_interval(z: u64) -> f64 {
    (z >> 11) as f64 / (1u64 << 53) as f64
}

/// SplitMix64's output function.
fn splitmix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[derive(Default)]
struct SimLoadBuilder {
    read_bps: f64,
    write_bps: f64,
    read_iops: f64,
    write_iops: f64,
    p999: Option<u64>,
    samples: u64,
    mean: Option<f64>,
    inflight: f64,
    hist: Vec<(u16, u64)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noisy_pair(slo_ms: f64) -> SimDisk {
        SimDisk::new(vec![
            SimService::latency("reader", slo_ms, 1.0),
            SimService::writer("writer", SloClass::BestEffort, 2400.0, 5),
        ])
    }

    fn violating_cycles(h: &[(DeviceCycle, Vec<Decision>)], name: &str) -> Vec<u64> {
        h.iter()
            .filter(|(c, _)| c.services.iter().any(|s| s.name == name && s.violating()))
            .map(|(c, _)| c.cycle)
            .collect()
    }

    /// The highest static cap (MB/s, 5 MB/s steps) on service `agg` of `make()`'s disk
    /// under which service 0 violates in at most one cycle in ten from `from` on over
    /// `cycles`: the best static cap as the benchmark judges it.
    fn best_static_cap_mbps(make: &dyn Fn() -> SimDisk, agg: usize, from: u64, cycles: u64) -> f64 {
        let mut best = 0.0;
        for mbps in (5..2400).step_by(5) {
            let mut d = make();
            let cap = (mbps as f64 * MB) as u64;
            if d.services[agg].cost_per_byte > 1.0 {
                d.services[agg].limit.rbps = Some(cap);
            } else {
                d.services[agg].limit.wbps = Some(cap);
            }
            let mut violating = 0;
            for _ in 0..cycles {
                let c = d.step();
                if c.cycle >= from && c.services[0].violating() {
                    violating += 1;
                }
                d.apply(&[]);
            }
            if violating * 10 <= cycles - from {
                best = mbps as f64;
            } else {
                break;
            }
        }
        best
    }

    /// What the benchmark reports of a steady phase `from..to`: violating cycles of service
    /// 0, cycles with a limit change, and service `agg`'s mean rate in MB/s.
    fn steady(
        h: &[(DeviceCycle, Vec<Decision>)],
        agg: usize,
        from: u64,
        to: u64,
    ) -> (usize, usize, f64) {
        let phase: Vec<_> = h
            .iter()
            .filter(|(c, _)| (from..to).contains(&c.cycle))
            .collect();
        let violations = phase
            .iter()
            .filter(|(c, _)| c.services[0].violating())
            .count();
        let changes = phase.iter().filter(|(_, d)| !d.is_empty()).count();
        let mean = phase
            .iter()
            .map(|(c, _)| c.services[agg].bps())
            .sum::<f64>()
            / phase.len() as f64
            / MB;
        (violations, changes, mean)
    }

    /// A latency service's judged latency as a fraction of its target (0 when not judged).
    fn target_fraction(r: &ServiceLoad) -> f64 {
        r.judged_latency().unwrap_or(0) as f64 / r.slo_ns().unwrap_or(1) as f64
    }

    /// With `SIM_TRACE` set, prints each cycle of a run: service 0's p99.9 as a fraction of
    /// its target, service 1's rate and cap, and the decisions' reasons.
    fn trace(label: &str, h: &[(DeviceCycle, Vec<Decision>)]) {
        if std::env::var_os("SIM_TRACE").is_none() {
            return;
        }
        for (c, d) in h {
            println!(
                "{label} c{} f {:.2} agg {:.0} MB/s cap {:?} {:?}",
                c.cycle,
                target_fraction(&c.services[0]),
                c.services[1].bps() / MB,
                c.services[1].limit.total_bps().map(|b| b / 1_000_000),
                d.iter().map(|d| &d.reason).collect::<Vec<_>>()
            );
        }
    }

    /// The targets for one aggressor from cycle 5 on: the SLO met within 3 cycles;
    /// after 20 cycles of search, at most one violating cycle and one change in ten, and at
    /// least 90 % of the best static cap's rate.
    fn assert_finds_the_knee(make: &dyn Fn() -> SimDisk, label: &str) {
        assert_finds_the_knee_at(make, label, 0.9)
    }

    /// [`assert_finds_the_knee`] with the writer at least `share` of the best static cap.
    fn assert_finds_the_knee_at(make: &dyn Fn() -> SimDisk, label: &str, share: f64) {
        let mut disk = make();
        let h = disk.run(&mut Adaptive::default(), 300);
        trace(label, &h);
        let v = violating_cycles(&h, "reader");
        assert_eq!(
            v.first(),
            Some(&5),
            "{label}: the violation starts with the aggressor"
        );
        assert!(
            !v.contains(&7) && !v.contains(&8),
            "{label}: not under the SLO within 3 cycles: {v:?}"
        );
        let best = best_static_cap_mbps(make, 1, 7, 300);
        assert_steady_phase_targets(&h, label, best, share);
    }

    /// The targets for the steady phase of a 300-cycle run `h` (cycles 25-300): at
    /// most one violating cycle and one change in ten, and the aggressor (service 1) at
    /// least `share` of the `best` static cap's MB/s.
    fn assert_steady_phase_targets(
        h: &[(DeviceCycle, Vec<Decision>)],
        label: &str,
        best: f64,
        share: f64,
    ) {
        let v = violating_cycles(h, "reader");
        let (violations, changes, mean) = steady(h, 1, 25, 300);
        println!("{label}: steady violations {violations}/275, changes {changes}, {mean:.0} MB/s vs best static {best} MB/s");
        assert!(
            violations * 10 <= 275,
            "{label}: {violations} violating cycles in 275: {v:?}"
        );
        assert!(
            changes * 10 <= 275,
            "{label}: {changes} changes in 275 steady cycles"
        );
        assert!(
            mean >= share * best,
            "{label}: {mean:.0} MB/s < {:.0} % of best static {best} MB/s",
            share * 100.0
        );
    }

    /// The v2 guest (BENCHMARKS run CL) as the simulator can show it: the writer ramps up
    /// (1000 MB/s for three cycles, then its full rate, which puts the reader just over its
    /// target: 1.00-1.11 in seeds 1-5), and the host under the guest's disk drains 1200 MB/s
    /// and stalls the device for a cycle each time 2000 MB more have piled up (see
    /// [`SimDisk::host_writeback`]).
    fn guest(seed: u64) -> SimDisk {
        let mut d = noisy_pair(5.0);
        d.smooth_curve = Some((814.0, 0.773));
        d.noise_seed = Some(seed);
        d.noise_sigma = Some(0.05);
        d.host_writeback = Some((1200.0, 2000.0));
        d
    }

    /// `guest(seed)` run for 300 cycles (see [`run_ramped`]).
    fn run_guest(seed: u64) -> Vec<(DeviceCycle, Vec<Decision>)> {
        run_ramped(guest(seed), 300)
    }

    /// `disk` run for `cycles` under `adaptive`, its writer (service 1) at 1000 MB/s until
    /// cycle 8 and at its full rate from there: a full load that breaks the reader's
    /// target in a full cycle, not on arrival.
    fn run_ramped(mut disk: SimDisk, cycles: u64) -> Vec<(DeviceCycle, Vec<Decision>)> {
        disk.services[1].demand_bps = 1000.0 * MB;
        let mut p = Adaptive::default();
        let mut h = disk.run(&mut p, 8);
        disk.services[1].demand_bps = 2400.0 * MB;
        h.extend(disk.run(&mut p, cycles - 8));
        h
    }

    /// The highest cap on the writer in cycles `from..to`, MB/s.
    fn highest_cap_mbps(h: &[(DeviceCycle, Vec<Decision>)], from: u64, to: u64) -> f64 {
        h.iter()
            .filter(|(c, _)| (from..to).contains(&c.cycle))
            .filter_map(|(c, _)| c.services[1].limit.total_bps())
            .max()
            .map_or(0.0, |b| b as f64 / MB)
    }

    /// A full load just over its target (1.00-1.11) is probed to two thirds of its rate and
    /// no closer while that knee is trusted: 1267 of 1900 MB/s here, where half-way probes
    /// went on to 1597 (and in the guest to 3443 of 3754 MB/s, where a quarter of the
    /// cycles broke). A full load far over its target is probed past two thirds as before:
    /// its knee is where the probes find it.
    #[test]
    fn a_full_load_at_the_edge_of_its_target_is_probed_to_two_thirds_of_its_rate() {
        for seed in [1, 2, 3, 4, 5] {
            let h = run_guest(seed);
            trace(&format!("guest {seed}"), &h);
            let f = target_fraction(&h[8].0.services[0]);
            assert!((1.0..=1.2).contains(&f), "seed {seed}: full load at {f:.2}");
            let top = highest_cap_mbps(&h, 9, 38);
            assert!(
                (1260.0..=1267.0).contains(&top),
                "seed {seed}: the search went to {top:.0} MB/s of 1900"
            );
        }
        // Full load at 2 times the target, the curve steep over 1500 MB/s.
        for seed in [1, 2, 3] {
            let mut disk = noisy_pair(5.0);
            disk.smooth_curve = Some((1491.0, 5.55));
            disk.noise_seed = Some(seed);
            disk.noise_sigma = Some(0.05);
            let h = run_ramped(disk, 38);
            trace(&format!("steep {seed}"), &h);
            let top = highest_cap_mbps(&h, 9, 38);
            assert!(
                top > 1300.0,
                "steep {seed}: the search stopped at {top:.0} MB/s"
            );
        }
    }

    /// A full load that kept its target for nine cycles and then met a stall of the host
    /// (a cycle at 1.5-3 times the target, after 7000 MB piled up) ran at the edge of
    /// the target, not past a knee: it is probed to two thirds of its rate and no closer,
    /// as in run CO's guest (13-22 clean cycles at the writer's full rate, then 187-365 ms;
    /// the probes climbed to 3449-3678 MB/s of 3868-4124, where a quarter of the cycles
    /// broke).
    #[test]
    fn a_full_load_that_held_nine_cycles_before_a_stall_is_probed_to_two_thirds_of_its_rate() {
        for seed in [1, 2, 3] {
            let mut disk = noisy_pair(5.0);
            disk.smooth_curve = Some((836.0, 0.517));
            disk.noise_seed = Some(seed);
            disk.noise_sigma = Some(0.05);
            disk.host_writeback = Some((1200.0, 7000.0));
            let h = run_ramped(disk, 58);
            trace(&format!("stalled guest {seed}"), &h);
            let v = violating_cycles(&h, "reader");
            assert_eq!(v.first(), Some(&18), "seed {seed}: the first stall: {v:?}");
            let f = target_fraction(&h[18].0.services[0]);
            assert!(f > 1.2, "seed {seed}: the stall at {f:.2}, marginal");
            let top = highest_cap_mbps(&h, 19, 48);
            assert!(
                (1000.0..=1267.0).contains(&top),
                "seed {seed}: the search went to {top:.0} MB/s of 1900"
            );
        }
    }

    /// Under a host's writeback stalls, which come cycles after the raise that caused them,
    /// the SLO is back within 3 cycles of the writer's full load and the steady phase keeps
    /// the budgets of one violating cycle and one change in ten, with the writer at 85 % of
    /// the best static cap or more (1420 MB/s, where a stall comes every tenth cycle; it
    /// gets 1269, 89 %: 9 violating cycles in 275, 8 changes). Before a lone stall was left
    /// out of the scatter model, each stall under a cap trimmed it by 8-25 %, under the
    /// host's drain rate, and the writer got 81-85 %.
    #[test]
    fn under_a_hosts_writeback_stalls_the_budgets_hold() {
        for seed in [1, 2, 3, 4, 5] {
            let label = format!("guest {seed}");
            let h = run_guest(seed);
            trace(&label, &h);
            let v = violating_cycles(&h, "reader");
            assert!(
                !v.contains(&11),
                "{label}: not under the SLO within 3 cycles of the full load: {v:?}"
            );
            let best = best_static_cap_mbps(&|| guest(seed), 1, 10, 300);
            assert_steady_phase_targets(&h, &label, best, 0.85);
        }
    }

    /// A reader whose per-cycle p99.9 is bimodal (quiet cycles at a fifth of the curve,
    /// a third of them bursts on it) measures a scatter no log-normal fits; the near-miss
    /// bar it implies (under half the target) must not fail every probe to a cap a static
    /// one holds.
    #[test]
    fn adaptive_finds_the_knee_of_a_writer_next_to_a_bimodal_reader() {
        for seed in [1, 2, 3] {
            let make = || {
                let mut d = noisy_pair(5.0);
                d.noise_seed = Some(seed);
                d.noise_bursts = Some((0.3, 0.2));
                d
            };
            assert_finds_the_knee(&make, &format!("writer, bimodal noise {seed}"));
        }
    }

    /// A reader on the curve in most cycles and far under it in the others (the writer's
    /// gaps) gets no worse verdict from its quiet cycles: over three seeds, no more changes
    /// than next to the same reader on the curve in every cycle (per seed the two runs draw
    /// different noise: with its bursts judged as bursts, seed 1 probes once more on its way
    /// to 414 MB/s against 406), and in each the writer within the 90 % of what it
    /// gets there. Before the upper-half veto, 10-12 changes against 8 and 81-89 %. Seen on
    /// the test disk (BENCHMARKS run AF, writer repeat 3): three quiet cycles in eleven
    /// widened the scatter model's sigma to 0.86, and a cap none of whose cycles broke the
    /// target was trimmed by a quarter.
    #[test]
    fn quiet_cycles_of_a_bursting_reader_cost_the_writer_nothing() {
        let (mut changes_on, mut changes_most) = (0, 0);
        for seed in [1, 2, 3] {
            let run = |burst_share: f64| {
                let mut d = noisy_pair(5.0);
                d.noise_seed = Some(seed);
                d.noise_bursts = Some((burst_share, 0.2));
                let h = d.run(&mut Adaptive::default(), 300);
                trace(&format!("seed {seed}, bursts {burst_share}"), &h);
                steady(&h, 1, 25, 300)
            };
            let (v_on, c_on, on) = run(1.0);
            let (v_most, c_most, most) = run(0.7);
            println!(
                "seed {seed}: on the curve every cycle {on:.0} MB/s, {c_on} changes, {v_on} violating; \
                 in 7 of 10 {most:.0} MB/s, {c_most} changes, {v_most} violating"
            );
            assert!(
                most >= 0.9 * on,
                "seed {seed}: quiet cycles cost the writer: {most:.0} MB/s against {on:.0}"
            );
            changes_on += c_on;
            changes_most += c_most;
        }
        assert!(
            changes_most <= changes_on,
            "quiet cycles cost changes: {changes_most} against {changes_on} over three seeds"
        );
    }

    /// The first steady cycles (16-34, the benchmark's first 19 after the writer's start at
    /// cycle 5) of 36 writer runs (12 noise seeds, arriving in a full cycle, a third of one
    /// and a twentieth): the probes toward a knee found by a broken probe go where the line
    /// through the two p99.9s reaches the aim, so most of them hold. With half-way alone, 52
    /// raises failed there against 56 probes toward a knee, with 2.6 violating cycles and
    /// 4.6 changes per run; with the line, 28 against 70, 1.6 and 4.4.
    #[test]
    fn probes_toward_a_knee_mostly_hold_in_the_first_steady_cycles() {
        let (mut probes, mut failed, mut runs) = (0, 0, 0);
        let (mut violating, mut changes, mut mbps) = (0, 0, 0.0);
        for share in [1.0, 0.3, 0.05] {
            for seed in 1..=12 {
                let mut d = noisy_pair(5.0);
                d.noise_seed = Some(seed);
                d.services[1].arrival_share = share;
                let h = d.run(&mut Adaptive::default(), 60);
                let first: Vec<_> = h
                    .iter()
                    .filter(|(c, _)| (16..35).contains(&c.cycle))
                    .collect();
                for d in first.iter().flat_map(|(_, d)| d) {
                    probes += usize::from(
                        d.reason.contains("probe toward") || d.reason.contains("probe half-way"),
                    );
                    failed += usize::from(d.reason.starts_with("a raise to"));
                }
                let (v, c, m) = steady(&h, 1, 16, 35);
                (violating, changes, mbps) = (violating + v, changes + c, mbps + m);
                runs += 1;
            }
        }
        let per_run = |n: usize| n as f64 / runs as f64;
        println!(
            "{probes} probes toward a knee, {failed} raises failed; per run {:.2} violating cycles, {:.2} changes, the writer at {:.0} MB/s",
            per_run(violating),
            per_run(changes),
            mbps / runs as f64
        );
        assert!(
            2 * failed <= probes,
            "{failed} raises failed against {probes} probes toward a knee"
        );
        assert!(
            per_run(violating) <= 2.0,
            "{:.2} violating cycles per run",
            per_run(violating)
        );
    }

    /// A writer that arrives late in a cycle breaks the SLO in a cycle whose counters show a
    /// twentieth of its rate: that rate is no knee, and the search must not stop under it
    /// (seen with PostgreSQL: a writer averaging 124 MB/s in the cycle it arrived in,
    /// 3 GB/s after, and the search held under 124 MB/s where a static 300 held).
    #[test]
    fn adaptive_takes_no_knee_from_a_cycle_the_aggressor_arrived_in() {
        for seed in [None, Some(1), Some(2)] {
            let make = || {
                let mut d = noisy_pair(5.0);
                d.noise_seed = seed;
                d.services[1].arrival_share = 0.05;
                d
            };
            assert_finds_the_knee(&make, &format!("writer arriving late, noise {seed:?}"));
        }
    }

    #[test]
    fn adaptive_finds_the_knee_of_a_writer_on_a_smooth_and_a_noisy_disk() {
        for seed in [None, Some(1), Some(2), Some(3)] {
            let make = || {
                let mut d = noisy_pair(5.0);
                d.noise_seed = seed;
                d
            };
            assert_finds_the_knee(&make, &format!("writer, noise {seed:?}"));
        }
    }

    /// A reader whose SLO is at its p95 is held there as one at its p99.9 is: the target
    /// sits where the simulated reader's p95 (its mean: 0.2 % of its reads form the tail)
    /// is when its p99.9 is 5 ms, so the knee is the same, found from the p95 alone. The
    /// p95 rises more gently than the p99.9 with the writer's rate (the mean carries a
    /// fixed part), so a trim takes more rate for the same excess: 90-97 % of the best
    /// static cap in three seeds, and in seed 1 85 % (a window at 108 % trimmed to 75 % in
    /// cycle 57, probes spaced 11-28 cycles after; the p99.9 reader there gets 90 %), which
    /// is held to its own bar here so that it shows if it gets worse.
    #[test]
    fn adaptive_finds_the_knee_of_a_writer_next_to_a_p95_target() {
        use crate::config::{LatencyQuantile, LatencyTarget};
        for (seed, share) in [(None, 0.9), (Some(1), 0.85), (Some(2), 0.9), (Some(3), 0.9)] {
            let make = || {
                let mut d = noisy_pair(5.0);
                d.services[0].class = SloClass::Latency(LatencyTarget {
                    quantile: LatencyQuantile::P95,
                    target_ns: 330_000,
                });
                d.noise_seed = seed;
                d
            };
            assert_finds_the_knee_at(&make, &format!("writer, p95 target, noise {seed:?}"), share);
        }
    }

    #[test]
    fn adaptive_finds_the_knee_of_a_random_reader() {
        for seed in [None, Some(4), Some(5)] {
            let make = || {
                let mut d = SimDisk::new(vec![
                    SimService::latency("reader", 5.0, 1.0),
                    SimService::random_reader("scan", 320.0, 5),
                ]);
                d.noise_seed = seed;
                d
            };
            assert_finds_the_knee(&make, &format!("random reader, noise {seed:?}"));
        }
    }

    /// A slow spell of the disk during a probe low on the curve records a knee far below
    /// the real one. Under it the reader runs at a third of its target or less: the knee is
    /// doubted and probed again within a few cycles, not trusted for its full memory.
    #[test]
    fn adaptive_doubts_a_knee_found_once_when_the_cap_under_it_runs_far_below_the_target() {
        let mut disk = noisy_pair(10.0);
        let mut p = Adaptive::default();
        let cap = |d: &SimDisk| d.services[1].limit.wbps.unwrap_or(u64::MAX);
        // Up to the first cap at or above 150 MB/s, far below the knee (~570 MB/s).
        while !(150_000_000..u64::MAX).contains(&cap(&disk)) {
            disk.run(&mut p, 1);
            assert!(disk.cycle < 60, "no cap reached 150 MB/s");
        }
        let spell_cap = cap(&disk);
        disk.knee_scale = 0.2;
        let spell = disk.run(&mut p, 3);
        assert!(
            spell.iter().any(|(c, _)| c.services[0].violating()),
            "the spell broke nothing"
        );
        disk.knee_scale = 1.0;
        let after = disk.run(&mut p, crate::policy::adaptive::BAD_MEMORY_CYCLES - 5);
        trace("spell", &spell);
        trace("after the spell", &after);
        let highest = after.iter().map(|(c, _)| cap_of(c)).max().unwrap();
        println!(
            "spell at {} MB/s; highest cap after it {} MB/s",
            spell_cap / 1_000_000,
            highest / 1_000_000
        );
        assert!(
            highest as f64 > 1.2 * spell_cap as f64,
            "the spell's knee at {} MB/s was trusted: highest cap {} MB/s in {} cycles",
            spell_cap / 1_000_000,
            highest / 1_000_000,
            crate::policy::adaptive::BAD_MEMORY_CYCLES - 5
        );
        fn cap_of(c: &DeviceCycle) -> u64 {
            c.services[1].limit.total_bps().unwrap_or(0)
        }
    }

    /// A slow spell of the disk (every cap breaks the SLO for six cycles; the first two
    /// pass as stalls, the next four cut) leaves a knee far under the real one. Once the
    /// reads run far under their target again, the cap climbs back in growing steps: the
    /// writer is back at 85 % of its rate before the spell within 30 cycles of its end, ten
    /// of them the wait out of its violations and six the half-way probes up to the
    /// spell's knee (seen on the test disk, BENCHMARKS run R: a stall set a knee at 51 MB/s where a static 300 held, and
    /// raises of 10-25 % every three cycles with the reads at a fifth of their target left
    /// the writer at 15 % of the best static cap).
    #[test]
    fn adaptive_climbs_back_in_growing_steps_from_a_knee_a_stall_of_the_disk_set() {
        const BACK_WITHIN: u64 = 30;
        for seed in [None, Some(1), Some(2), Some(3)] {
            // A 10 ms target: the reader runs at under a third of it on the curve's plateau.
            let mut disk = noisy_pair(10.0);
            disk.noise_seed = seed;
            let mut p = Adaptive::default();
            let before = disk.run(&mut p, 60);
            let rate = |h: &[(DeviceCycle, Vec<Decision>)]| {
                h.iter().map(|(c, _)| c.services[1].bps()).sum::<f64>() / h.len() as f64
            };
            let settled = rate(&before[40..]);
            disk.knee_scale = 0.05;
            let stall = disk.run(&mut p, 6);
            disk.knee_scale = 1.0;
            let after = disk.run(&mut p, BACK_WITHIN);
            trace("stall", &stall);
            trace("after the stall", &after);
            let low = after
                .iter()
                .map(|(c, _)| c.services[1].bps())
                .fold(f64::MAX, f64::min);
            let high = after
                .iter()
                .map(|(c, _)| c.services[1].bps())
                .fold(0.0, f64::max);
            println!(
                "noise {seed:?}: {:.0} MB/s before the stall, {:.0} after it, {:.0} at most within {BACK_WITHIN} cycles",
                settled / MB,
                low / MB,
                high / MB
            );
            assert!(
                low < 0.8 * settled,
                "noise {seed:?}: the stall cut nothing ({:.0} of {:.0} MB/s)",
                low / MB,
                settled / MB
            );
            assert!(
                high >= 0.85 * settled,
                "noise {seed:?}: {:.0} MB/s at most within {BACK_WITHIN} cycles of the stall, under 85 % of {:.0}",
                high / MB,
                settled / MB
            );
            // Not a probe that fails at once: the cap stays up, and the climb costs at
            // most one violation in ten of the cycles after the stall.
            let later = disk.run(&mut p, 20);
            let held = rate(&later[10..]);
            let violations =
                violating_cycles(&after, "reader").len() + violating_cycles(&later, "reader").len();
            println!(
                "noise {seed:?}: {:.0} MB/s 35-45 cycles after the stall, {violations} violating cycles in 45",
                held / MB
            );
            assert!(
                held >= 0.85 * settled,
                "noise {seed:?}: {:.0} MB/s 35-45 cycles after the stall, under 85 % of {:.0}",
                held / MB,
                settled / MB
            );
            assert!(
                violations * 10 <= 45,
                "noise {seed:?}: {violations} violating cycles in the 45 after the stall"
            );
        }
    }

    /// Stalls of the disk (one or two cycles at 30 ms against a 5 ms target, every ten
    /// cycles, the writer's rate unchanged) are no verdict on the cap: each is counted and
    /// told (`disk_stall`), none is cut for, and the writer keeps its rate through the train
    /// (seen on the test disk, BENCHMARKS run S: PostgreSQL's reads at 145 ms one or two
    /// cycles in every eight, and each second one in ten cut the writer by 30 %, 232 -> 41
    /// MB/s, for stalls as long at 41 as at 232).
    #[test]
    fn adaptive_cuts_nothing_for_stalls_of_the_disk() {
        for seed in [None, Some(1), Some(2), Some(3)] {
            let mut disk = noisy_pair(5.0);
            disk.noise_seed = seed;
            let mut p = Adaptive::default();
            let before = disk.run(&mut p, 100);
            p.findings();
            let rate = |h: &[(DeviceCycle, Vec<Decision>)]| {
                h.iter().map(|(c, _)| c.services[1].bps()).sum::<f64>() / h.len() as f64
            };
            let settled = rate(&before[60..]);
            let mut train = vec![];
            let mut stalled = vec![];
            let mut told = 0;
            for len in [1, 2, 1, 2] {
                disk.stall_ns = 30e6;
                for _ in 0..len {
                    stalled.push(disk.cycle);
                    train.extend(disk.run(&mut p, 1));
                    told += p
                        .findings()
                        .iter()
                        .filter(|f| matches!(f, Finding::DiskStall { .. }))
                        .count();
                }
                disk.stall_ns = 0.0;
                train.extend(disk.run(&mut p, 10 - len));
                assert!(p.findings().is_empty());
            }
            trace(&format!("stalls, noise {seed:?}"), &train);
            let violating = violating_cycles(&train, "reader");
            let others: Vec<_> = violating.iter().filter(|c| !stalled.contains(c)).collect();
            let cut_in_stall = train
                .iter()
                .filter(|(c, d)| stalled.contains(&c.cycle) && !d.is_empty())
                .count();
            println!(
                "noise {seed:?}: {:.0} MB/s before the stalls, {:.0} through them; violations {violating:?}, stalls {stalled:?}, told {told}",
                settled / MB,
                rate(&train) / MB
            );
            assert!(
                stalled.iter().all(|c| violating.contains(c)),
                "noise {seed:?}: a stall broke nothing"
            );
            assert_eq!(
                cut_in_stall, 0,
                "noise {seed:?}: a stall cycle changed a cap"
            );
            assert_eq!(told, stalled.len(), "noise {seed:?}: stalls told");
            assert!(
                others.len() * 10 <= train.len(),
                "noise {seed:?}: violations besides the stalls: {others:?}"
            );
            assert!(
                rate(&train) >= 0.9 * settled,
                "noise {seed:?}: {:.0} MB/s through the stalls, under 90 % of {:.0}",
                rate(&train) / MB,
                settled / MB
            );
        }
    }

    /// A disk that stalls from the aggressor's first cycles on (one cycle in three to six at 100
    /// ms against a 5 ms target, four times what the uncapped writer does, whatever the writer's rate): the first stalls come before the
    /// scatter under the cap is measured and inflate it, and a rule told only in sigmas of
    /// that scatter never sees a stall again. The writer must still get most of what it gets
    /// on the same disk without stalls (seen on the test disk, BENCHMARKS run V, PostgreSQL
    /// repeat 1: reads at 46-298 ms one cycle in three to five from the writer's arrival on,
    /// the writer held at its 20 MB/s floor for the whole run).
    #[test]
    fn stalls_from_the_aggressors_arrival_on_do_not_pin_it_to_its_floor() {
        for (seed, arrival_share) in [None, Some(1), Some(2), Some(3)]
            .into_iter()
            .flat_map(|s| [(s, 1.0), (s, 0.05)])
        {
            // One cycle in three to six, irregular as on the test disk.
            let mut stall_cycles = vec![];
            let mut c = 7;
            for gap in [4, 6, 3, 5, 4, 5, 6, 3].iter().cycle() {
                if c >= 120 {
                    break;
                }
                stall_cycles.push(c);
                c += gap;
            }
            let run = |stalls: bool| {
                let mut disk = noisy_pair(5.0);
                disk.noise_seed = seed;
                disk.services[1].arrival_share = arrival_share;
                let mut p = Adaptive::default();
                let mut h = vec![];
                let mut told = 0;
                for c in 0..120u64 {
                    disk.stall_ns = if stalls && stall_cycles.contains(&c) {
                        100e6
                    } else {
                        0.0
                    };
                    h.extend(disk.run(&mut p, 1));
                    told += p
                        .findings()
                        .iter()
                        .filter(|f| matches!(f, Finding::DiskStall { .. }))
                        .count();
                }
                (h, told)
            };
            let rate = |h: &[(DeviceCycle, Vec<Decision>)]| {
                h[30..]
                    .iter()
                    .map(|(c, _)| c.services[1].bps())
                    .sum::<f64>()
                    / (h.len() - 30) as f64
                    / MB
            };
            let (smooth, _) = run(false);
            let (stalling, told) = run(true);
            trace(
                &format!("stalls from the arrival, noise {seed:?}"),
                &stalling,
            );
            let stalls = stall_cycles.iter().filter(|&&c| c >= 30).count();
            let others: Vec<u64> = violating_cycles(&stalling, "reader")
                .into_iter()
                .filter(|&c| c >= 30 && !stall_cycles.contains(&c))
                .collect();
            println!(
                "noise {seed:?}: {:.0} MB/s without stalls, {:.0} with them; {told} stalls told; other violations {others:?}",
                rate(&smooth),
                rate(&stalling)
            );
            assert!(
                rate(&stalling) >= 0.9 * rate(&smooth),
                "noise {seed:?}: {:.0} MB/s on the stalling disk, under 90 % of {:.0} without stalls",
                rate(&stalling),
                rate(&smooth)
            );
            assert!(
                told >= stalls,
                "noise {seed:?}: {told} stalls told, {stalls} after cycle 30 alone"
            );
            assert!(
                others.len() * 10 <= 90,
                "noise {seed:?}: violations besides the stalls: {others:?}"
            );
        }
    }

    /// A knee that moves down right after a raise passed its two-cycle window, to where the
    /// raised cap puts the reader at 4.5 times its target (a stall's size, but under what
    /// the scan's full load did, 5.6 times): the raise's harm, not a stall. The cap
    /// is cut by the second violation and no stall is told (seen in CI at 8014f12: a line
    /// probe to 219 MB/s passed, then four cycles of five at 8-9 times the target were
    /// excused as stalls; a static 275 MB/s broke 15 cycles of 19 next).
    #[test]
    fn a_cliff_right_after_a_raise_passed_is_the_raise_s_harm_not_a_stall() {
        const STALL_LEVEL_CYCLES: u64 = 3;
        for seed in [None, Some(4), Some(5)] {
            let mut disk = SimDisk::new(vec![
                SimService::latency("reader", 5.0, 1.0),
                SimService::random_reader("scan", 320.0, 5),
            ]);
            disk.noise_seed = seed;
            let mut p = Adaptive::default();
            let cap = |c: &DeviceCycle| c.services[1].limit.total_bps();
            // Up to three full cycles under a raised cap (its transition not counted), with
            // no change: its window passed, and a stall has the three cycles of level under
            // it that it is judged against.
            let mut raised_at = None;
            loop {
                let h = disk.run(&mut p, 1);
                let (c, d) = &h[0];
                if d.is_empty() {
                    if raised_at.is_some_and(|r| c.cycle == r + 1 + STALL_LEVEL_CYCLES) {
                        break;
                    }
                } else {
                    let raise = d
                        .iter()
                        .any(|d| d.service == 1 && cap(c).is_some_and(|c| d.to > Some(c)));
                    raised_at = raise.then_some(c.cycle);
                }
                assert!(
                    disk.cycle < 200,
                    "noise {seed:?}: no raise passed its window"
                );
            }
            p.findings();
            let raised = disk.services[1].limit.total_bps().unwrap();
            let scale = disk
                .knee_scale_for((10..1000).rev(), 0, 4.5..f64::INFINITY)
                .unwrap_or_else(|| panic!("noise {seed:?}: no slowdown puts the reader at 4.5 times its target under {raised} B/s at cycle {}", disk.cycle));
            disk.knee_scale = scale;
            let h = disk.run(&mut p, 3);
            trace(&format!("cliff after a raise, noise {seed:?}"), &h);
            let stalls = p
                .findings()
                .iter()
                .filter(|f| matches!(f, Finding::DiskStall { .. }))
                .count();
            assert_eq!(
                stalls, 0,
                "noise {seed:?}: the raise's harm told as a stall"
            );
            let cut_at = h
                .iter()
                .position(|(_, d)| d.iter().any(|d| d.to.is_some_and(|to| to < raised)));
            assert!(
                cut_at.is_some_and(|i| i <= 1),
                "noise {seed:?}: {raised} B/s not cut by the second violation: {:?}",
                h.iter().map(|(_, d)| d.clone()).collect::<Vec<_>>()
            );
        }
    }

    /// The noisy pair at a 5 ms target after 60 cycles: the policy, and the writer's cap.
    fn settled_writer() -> (SimDisk, Adaptive, u64) {
        settled_writer_after(60)
    }

    fn settled_writer_after(cycles: u64) -> (SimDisk, Adaptive, u64) {
        let mut disk = noisy_pair(5.0);
        let mut p = Adaptive::default();
        disk.run(&mut p, cycles);
        let cap = disk.services[1].limit.wbps.expect("capped");
        (disk, p, cap)
    }

    /// One cycle per item of `stalls`, those that are true stalled at 120 ms (24 times the
    /// target, beyond what the writer's full load did).
    fn stall_train(
        disk: &mut SimDisk,
        p: &mut Adaptive,
        stalls: impl IntoIterator<Item = bool>,
    ) -> Vec<(DeviceCycle, Vec<Decision>)> {
        let mut train = vec![];
        for stall in stalls {
            disk.stall_ns = if stall { 120e6 } else { 0.0 };
            train.extend(disk.run(p, 1));
        }
        disk.stall_ns = 0.0;
        train
    }

    /// Violations beyond what the writer's full load did that come every other cycle are
    /// not excused for ever: past four in ten they are harm again, and the writer is cut.
    #[test]
    fn stalls_beyond_the_full_load_every_other_cycle_are_harm_by_the_fifth() {
        let (mut disk, mut p, cap) = settled_writer();
        let train = stall_train(&mut disk, &mut p, (0..12).map(|c| c % 2 == 0));
        trace("every other cycle", &train);
        let cut_at = train
            .iter()
            .position(|(_, d)| d.iter().any(|d| d.to < Some(cap)));
        assert!(
            cut_at.is_some_and(|i| i <= 9),
            "not cut by the fifth violation in ten: {:?}",
            train.iter().map(|(_, d)| d.len()).collect::<Vec<_>>()
        );
    }

    /// Stalls beyond what the writer's full load did spend no budget while they are
    /// excused; past their excuse they count against the cap with the violation that
    /// follows: four in ten, then a violation at twice the target, is cut at once as the
    /// cap's fifth violation, not judged as its first.
    #[test]
    fn stalls_beyond_the_full_load_past_their_excuse_count_against_the_cap() {
        let (mut disk, mut p, cap) = settled_writer();
        let pattern = [true, false, true, true, false, true, false, false];
        let mut train = stall_train(&mut disk, &mut p, pattern);
        disk.stall_ns = 7e6;
        let h = disk.run(&mut p, 1);
        disk.stall_ns = 0.0;
        train.extend(h);
        trace("beyond stalls, then a violation", &train);
        assert!(
            train[..8].iter().all(|(_, d)| d.is_empty()),
            "a stall cut: {train:?}"
        );
        let (c, d) = train.last().unwrap();
        let f = c.services[0].p999_ns.unwrap() as f64 / 5e6;
        assert!(
            (1.5..4.0).contains(&f),
            "the last cycle at {f:.2} of the target"
        );
        assert!(
            d.iter().any(|d| d.to.is_some_and(|to| to < cap)
                && d.reason.contains(super::adaptive::BUDGET_CUT_REASON)),
            "the violation after four stalls in ten cut nothing: {d:?}"
        );
    }

    /// A disk that stays slow after two stall-like cycles has a new knee: the third cycle
    /// is judged as harm, the stalls with it, so it is the second violation under the cap
    /// and cuts it.
    #[test]
    fn a_stall_that_lasts_is_judged_as_harm_on_its_third_cycle() {
        for slo_ms in [5.0, 10.0] {
            let mut disk = noisy_pair(slo_ms);
            let mut p = Adaptive::default();
            disk.run(&mut p, 100);
            let cap = disk.services[1].limit.wbps.expect("capped");
            // Five times the target: a stall's size, not a cap's harm.
            disk.stall_ns = 5.0 * slo_ms * 1e6;
            let h = disk.run(&mut p, 3);
            trace(&format!("lasting stall, {slo_ms} ms"), &h);
            let f = h[2].0.services[0].p999_ns.unwrap() as f64 / (slo_ms * 1e6);
            assert!(h.iter().all(|(c, _)| c.services[0].violating()));
            assert!(
                h[..2].iter().all(|(_, d)| d.is_empty()),
                "{slo_ms} ms: {h:?}"
            );
            assert_eq!(p.findings().len(), 2, "{slo_ms} ms: two stalls told");
            let d = &h[2].1;
            assert_eq!(
                d.len(),
                1,
                "{slo_ms} ms: the third cycle ({f:.2} of the target) cut nothing"
            );
            assert!(d[0].to.unwrap() < cap, "{cap} -> {:?}", d[0].to);
            assert!(
                d[0].reason.contains(super::adaptive::BUDGET_CUT_REASON),
                "{slo_ms} ms: {}",
                d[0].reason
            );
        }
    }

    /// A settled cap that meets a wall (on the test disk a writer whose cap held for a
    /// while fills the disk's cache, and the reads jump from a few % of their target to
    /// 1.4-3 times it while the writer keeps its rate): a jump to under four times the
    /// target is the cap's harm, not a stall of the disk: the cap is cut by the second
    /// violation (the first is the one a settled cap may have in ten, unless the scatter
    /// model trims at once), with nothing told as a stall.
    #[test]
    fn a_wall_under_a_settled_cap_is_harm_not_a_stall() {
        for slo_ms in [5.0, 10.0] {
            let mut disk = noisy_pair(slo_ms);
            let mut p = Adaptive::default();
            disk.run(&mut p, 100);
            p.findings();
            let cap = disk.services[1].limit.wbps.expect("capped");
            disk.stall_ns = 2.0 * slo_ms * 1e6;
            let h = disk.run(&mut p, 2);
            trace(&format!("wall, {slo_ms} ms"), &h);
            assert!(h.iter().all(|(c, _)| c.services[0].violating()));
            let stalls = p
                .findings()
                .iter()
                .filter(|f| matches!(f, Finding::DiskStall { .. }))
                .count();
            assert_eq!(stalls, 0, "{slo_ms} ms: a wall told as a stall");
            let cut = h
                .iter()
                .flat_map(|(_, d)| d)
                .any(|d| d.to.is_some_and(|to| to < cap));
            assert!(
                cut,
                "{slo_ms} ms: two violations under {cap} cut nothing: {h:?}"
            );
        }
    }

    /// A second aggressor that arrives uncapped while a capped one holds its rate is new
    /// load, not a stall, however far over the level the reads jump: it is cut at once.
    #[test]
    fn an_aggressor_arriving_next_to_a_capped_one_is_no_stall() {
        let mut disk = noisy_pair(5.0);
        disk.services.push(SimService::writer(
            "late",
            SloClass::BestEffort,
            2400.0,
            100,
        ));
        let mut p = Adaptive::default();
        disk.run(&mut p, 100);
        assert!(disk.services[1].limit.wbps.is_some());
        let h = disk.run(&mut p, 1);
        assert!(h[0].0.services[0].violating());
        assert!(p.findings().is_empty(), "an arrival told as a stall");
        assert!(
            h[0].1.iter().any(|d| d.service == 2),
            "the arrival was not cut: {:?}",
            h[0].1
        );
    }

    /// The knobs a bandwidth cap sets add up to the cap to the byte, for an existing cap on
    /// one knob or two and for a fresh one split by the cycle's mix: the policy compares
    /// the cap it meant with the one read back (in f64 a gentle cut's cap came back a byte
    /// off for ~6 % of caps over 100 MB/s, was not known as the one it set, and the next
    /// violation under it took a decisive cut instead).
    #[test]
    fn a_bandwidth_cap_is_set_to_the_byte() {
        let mut disk = noisy_pair(5.0);
        disk.cycle = 10;
        let c = disk.step();
        let base = c.services[1].clone();
        let draw = |z: u64| splitmix(z) % 900_000_000 + 100_000_000;
        // The limit once `s`'s decisions for `cap` are applied.
        let capped = |s: &ServiceLoad, cap: u64| {
            let mut after = s.limit;
            for d in cap_bandwidth(s, 1, cap, String::new(), base_cause(&c, s)) {
                after.set(d.knob, d.to);
            }
            after
        };
        for i in 0..3000u64 {
            let (r, w, cap) = (draw(3 * i), draw(3 * i + 1), draw(3 * i + 2));
            let fresh = IoMaxLimit::default();
            let one = IoMaxLimit {
                wbps: Some(w),
                ..fresh
            };
            let two = IoMaxLimit {
                rbps: Some(r),
                ..one
            };
            for limit in [one, two, fresh] {
                let mut s = base.clone();
                s.limit = limit;
                s.read_bps = r as f64;
                s.write_bps = w as f64;
                let after = capped(&s, cap);
                assert_eq!(
                    after.total_bps(),
                    Some(cap),
                    "{limit:?} capped at {cap}: {after:?}"
                );
            }
        }
        // A direction at the floor: the other takes the rest of the cap, to the byte.
        let mut s = base.clone();
        s.limit = IoMaxLimit {
            rbps: Some(2 << 20),
            wbps: Some(300_000_000),
            ..Default::default()
        };
        let after = capped(&s, 100_000_000);
        assert_eq!(after.rbps, Some(MIN_CAP_BPS));
        assert_eq!(after.total_bps(), Some(100_000_000), "{after:?}");
        // A fresh cap on a service reading 3 % of its bytes: the reads stay free, and the
        // writes get the cap less their share.
        s.limit = IoMaxLimit::default();
        s.read_bps = 3e6;
        s.write_bps = 97e6;
        let ds = cap_bandwidth(&s, 1, 100_000_000, String::new(), base_cause(&c, &s));
        assert!(
            matches!(ds.as_slice(), [d] if d.knob == Knob::Wbps && d.to.is_some_and(|w| w.abs_diff(97_000_000) <= 1)),
            "{ds:?}"
        );
    }

    /// An on/off aggressor that returns late in a cycle (its counters there show a
    /// twentieth of its rate) gets the cap that held last time, not a cut from that rate.
    #[test]
    fn an_aggressor_back_in_a_cycle_it_ran_part_of_gets_the_cap_that_held() {
        let mut disk = noisy_pair(5.0);
        disk.services[1].on_off = Some((30, 20));
        disk.services[1].arrival_share = 0.05;
        let h = disk.run(&mut Adaptive::default(), 60);
        // It rests from cycle 35 and is back at 55.
        let held = h[34].0.services[1]
            .limit
            .total_bps()
            .expect("capped while on");
        let back: Vec<&Decision> = h[55..58].iter().flat_map(|(_, d)| d).collect();
        assert!(
            back.first()
                .is_some_and(|d| d.reason.contains("is back") && d.to == Some(held)),
            "on its return: {back:?}, the cap that held {held}"
        );
    }

    #[test]
    fn adaptive_lifts_caps_while_an_on_off_aggressor_rests_and_beats_the_best_static_cap() {
        let make = || {
            let mut d = noisy_pair(5.0);
            d.noise_seed = Some(7);
            d.services[1].on_off = Some((30, 20));
            d
        };
        let mut disk = make();
        let h = disk.run(&mut Adaptive::default(), 155);
        trace("on/off", &h);
        for period in 0..3u64 {
            let on = 5 + period * 50;
            let off = on + 30;
            // Lifted within 5 cycles of going quiet.
            let lifted = (off..off + 5).any(|c| h[c as usize].0.services[1].limit.is_unlimited());
            assert!(
                lifted,
                "cap still on 5 cycles after the aggressor stopped at {off}"
            );
            // Back within 3 cycles once it returns (the first period searches for the knee).
            if period > 0 {
                let late: Vec<u64> = (on + 2..off)
                    .filter(|&c| h[c as usize].0.services[0].violating())
                    .collect();
                assert!(
                    late.len() * 10 <= (off - on - 2) as usize,
                    "period {period}: violations after its first cycles: {late:?}"
                );
            }
        }
        let best = best_static_cap_mbps(&make, 1, 7, 155);
        let bytes: f64 = h.iter().map(|(c, _)| c.services[1].bps()).sum::<f64>() / MB;
        let static_bytes = {
            let mut d = make();
            d.services[1].limit.wbps = Some((best * MB) as u64);
            (0..155)
                .map(|_| {
                    let c = d.step();
                    d.apply(&[]);
                    c.services[1].bps()
                })
                .sum::<f64>()
                / MB
        };
        println!("on/off: {bytes:.0} MB written vs {static_bytes:.0} MB under the best static cap {best} MB/s");
        assert!(
            bytes > static_bytes,
            "{bytes:.0} MB <= best static's {static_bytes:.0} MB"
        );
    }

    /// The knee moves down and then up during a run: each move is found, judged on the
    /// median over five seeds of the noisy disk. One seed's steady mean moves by 5-10 % with
    /// any change to when a probe lands: seed 11 alone gave 241 MB/s against a best static
    /// 255, and 228 once the simulator's cut transitions ran at the new cap, a change that
    /// over seeds 1-16 moved as many means up as down; a budget cut judged in its
    /// transition moved seeds 8-12's median after the rise from 92 to 89 %, and seeds 1-20's
    /// from 90.5 to 90.0 % (the median over 20 seeds is the verdict since). Nor does the
    /// reader violate four cycles in a row anywhere (that change's point: 6 such runs in
    /// these 20 seeds before it, none after).
    #[test]
    fn adaptive_follows_the_knee_when_the_disk_slows_down_and_speeds_up() {
        let noisy = |seed: u64, k: f64| {
            let mut d = noisy_pair(5.0);
            d.noise_seed = Some(seed);
            d.knee_scale = k;
            d
        };
        // Each move: where the knee goes, the cycles run after it, the steady cycles judged.
        let moves = [("down", 0.6, 150, (170, 300)), ("up", 1.5, 250, (450, 550))];
        let mut shares = [vec![], vec![]];
        for seed in 1..=20 {
            let mut disk = noisy(seed, 1.0);
            let mut p = Adaptive::default();
            let mut h = disk.run(&mut p, 150);
            for (i, &(way, k, cycles, (from, to))) in moves.iter().enumerate() {
                disk.knee_scale = k;
                h.extend(disk.run(&mut p, cycles));
                let (v, _, mean) = steady(&h, 1, from, to);
                let best = best_static_cap_mbps(&move || noisy(seed, k), 1, 7, 150);
                let n = to - from;
                println!("seed {seed}, knee moved {way}: {v} violations in {n}, {mean:.0} MB/s vs best static {best}");
                assert!(
                    v as u64 * 10 <= n,
                    "seed {seed}: {v} violations after the knee moved {way}"
                );
                shares[i].push(mean / best);
            }
            let longest = h
                .iter()
                .fold((0, 0), |(run, longest), (c, _)| {
                    let run = if c.services[0].violating() {
                        run + 1
                    } else {
                        0
                    };
                    (run, longest.max(run))
                })
                .1;
            assert!(
                longest < 4,
                "seed {seed}: the reader violated {longest} cycles in a row"
            );
        }
        for ((way, ..), shares) in moves.iter().zip(shares) {
            let median = crate::measure::metrics::median(shares).unwrap_or(0.0);
            assert!(
                median >= 0.9,
                "{:.0} % of the best static cap after the knee moved {way}: the move was not found",
                median * 100.0
            );
        }
    }

    #[test]
    fn adaptive_keeps_a_settled_cap_through_one_violating_cycle_in_ten_and_cuts_at_two() {
        let (mut disk, mut p, cap) = settled_writer_after(100);
        // One slow cycle of the disk (p99.9 over the target, under twice it): the cap holds.
        disk.knee_scale = 0.85;
        let h = disk.run(&mut p, 1);
        assert!(h[0].0.services[0].violating());
        assert!(
            h[0].1.is_empty(),
            "one violating cycle moved the cap: {:?}",
            h[0].1
        );
        disk.knee_scale = 1.0;
        let h = disk.run(&mut p, 4);
        assert!(h.iter().all(|(_, d)| d.is_empty()));
        // A second one within ten cycles: a gentle cut (70-90 %, the cap truncated to bytes).
        disk.knee_scale = 0.85;
        let h = disk.run(&mut p, 1);
        let d = &h[0].1;
        assert_eq!(d.len(), 1, "{d:?}");
        let to = d[0].to.unwrap() as f64;
        assert!(
            (0.7 - 1e-6..=0.9).contains(&(to / cap as f64)),
            "cut {cap} -> {to}"
        );
        assert!(
            d[0].reason
                .contains(&format!("twice{}", super::adaptive::BUDGET_CUT_REASON)),
            "{}",
            d[0].reason
        );
    }

    /// A lasting slowdown that puts the reader at 3.2-3.9 times its target under a settled
    /// cap whose cycles before were clean: its first cycle is the one in ten the budget
    /// allows (one such cycle alone is the disk's, see `adaptive`'s lone jump), the second
    /// cuts, and the reason says so. (From 4 times the stall rule judges it.)
    #[test]
    fn a_settled_cap_is_cut_at_the_second_cycle_of_a_slowdown_far_over_the_target() {
        let (mut disk, mut p, cap) = settled_writer_after(100);
        disk.knee_scale = disk
            .knee_scale_for((200..1000).rev(), 0, 3.2..3.9)
            .expect("a slowdown that puts the reader at 3.2-3.9 times its target");
        let h = disk.run(&mut p, 2);
        for (c, _) in &h {
            let f = c.services[0].p999_ns.unwrap() as f64 / 5e6;
            assert!(f > 3.0, "the cycle at {f:.2} of the target");
        }
        assert!(h[0].1.is_empty(), "{:?}", h[0].1);
        let d = &h[1].1;
        assert_eq!(d.len(), 1, "{d:?}");
        assert!(d[0].to.is_some_and(|to| to < cap), "{d:?}");
        assert!(
            d[0].reason
                .contains(&format!("twice{}", super::adaptive::BUDGET_CUT_REASON)),
            "{}",
            d[0].reason
        );
    }

    #[test]
    fn adaptive_trims_a_settled_cap_whose_window_p999_runs_close_to_the_target() {
        let (mut disk, mut p, cap) = settled_writer_after(100);
        // The disk slows a little: every cycle's p99.9 at 90-100 % of the target, none
        // over it.
        let scale = disk
            .knee_scale_for(800..1000, 0, 0.92..0.98)
            .expect("a slowdown that puts the p99.9 at 92-98 % of the target");
        disk.knee_scale = scale;
        let h = disk.run(&mut p, 12);
        assert!(h.iter().all(|(c, _)| !c.services[0].violating()));
        // Trimmed first (then the search may probe back up to where the window is at
        // 80 % of the target at most).
        let cuts: Vec<&Decision> = h.iter().flat_map(|(_, d)| d).collect();
        assert!(!cuts.is_empty(), "not trimmed");
        let to = cuts[0].to.unwrap() as f64 / cap as f64;
        assert!((0.8..=0.92).contains(&to), "trimmed to {to}");
        assert!(cuts[0].reason.contains("trim"), "{}", cuts[0].reason);
        // Not before the window had 5 cycles under the cap.
        let at = h.iter().position(|(_, d)| !d.is_empty()).unwrap();
        assert!(at >= 4, "trimmed after {} cycles", at + 1);
    }

    /// One cycle's burst of slow reads (BENCHMARKS run AF, PostgreSQL repeat 2: 109 reads over
    /// 0.9 of the target in one cycle, none in the nine before) is the one violating cycle in
    /// ten the budget allows: it fills a pooled window's tail alone, and trims nothing.
    #[test]
    fn a_burst_of_slow_reads_in_one_cycle_of_a_full_window_trims_nothing() {
        let (mut disk, mut p, cap, window) = settled_for_a_full_window();
        let c = slow_reads_in_next_cycle(&mut disk, 109);
        assert!(c.services[0].violating());
        let d = p.decide(&c);
        disk.apply(&d);
        assert!(d.is_empty(), "one violating cycle moved the cap: {d:?}");
        let mut window: Vec<DeviceCycle> = window.into_iter().skip(1).collect();
        window.push(c);
        let after = disk.run(&mut p, 9);
        // The burst alone puts the window's p99.9 over the trim's bar: a pooled window that
        // kept it would trim.
        let pooled = pooled_p999(window.iter().map(|c| &c.services[0]));
        assert!(
            pooled as f64 > 0.9 * SLOW_READS_TARGET_NS as f64,
            "pooled p99.9 {pooled} ns"
        );
        assert!(after.iter().all(|(c, _)| !c.services[0].violating()));
        let moved: Vec<&Decision> = after.iter().flat_map(|(_, d)| d).collect();
        assert!(
            moved.is_empty(),
            "the burst trimmed the cap {cap}: {moved:?}"
        );
        assert_eq!(disk.services[1].limit.wbps, Some(cap));
    }

    /// The noisy pair's writer settled under its cap for a full noise window: the policy,
    /// the cap, and that window's cycles.
    fn settled_for_a_full_window() -> (SimDisk, Adaptive, u64, Vec<DeviceCycle>) {
        let (mut disk, mut p, _) = settled_writer_after(100);
        let h = disk.run(&mut p, crate::policy::adaptive::NOISE_WINDOW);
        assert!(
            h.iter().all(|(_, d)| d.is_empty()),
            "not settled: {:?}",
            h.iter().flat_map(|(_, d)| d).collect::<Vec<_>>()
        );
        let cap = disk.services[1].limit.wbps.expect("capped");
        (disk, p, cap, h.into_iter().map(|(c, _)| c).collect())
    }

    /// The noisy pair's reader target.
    const SLOW_READS_TARGET_NS: u64 = 5_000_000;

    /// The next cycle of `disk` with a twentieth of its reader's I/Os at `percent` of the
    /// target, and its p99.9 there.
    fn slow_reads_in_next_cycle(disk: &mut SimDisk, percent: u64) -> DeviceCycle {
        let mut c = disk.step();
        let r = &mut c.services[0];
        let slow = r.samples / 20;
        let at_ns = SLOW_READS_TARGET_NS * percent / 100;
        let at = isolator_common::histogram::latency_bucket(at_ns) as u16;
        r.latency_hist = vec![(r.latency_hist[0].0, r.samples - slow), (at, slow)];
        r.p999_ns = Some(at_ns);
        c
    }

    /// The p99.9 of every I/O of `services`' cycles together.
    fn pooled_p999<'a>(services: impl Iterator<Item = &'a ServiceLoad>) -> u64 {
        let mut sum = crate::measure::metrics::HistSum::default();
        for s in services {
            sum.add(&s.latency_hist);
        }
        crate::measure::metrics::percentile(&sum.sparse(), sum.samples(), 0.999).unwrap()
    }

    /// A tail spread over a full window is the cap's, not a burst: with its worst cycle left
    /// out, slow reads in two cycles (none of them over the target) still trim.
    #[test]
    fn a_tail_in_two_cycles_of_a_full_window_still_trims() {
        let (mut disk, mut p, cap, _) = settled_for_a_full_window();
        let mut trims = vec![];
        for _ in 0..2 {
            let c = slow_reads_in_next_cycle(&mut disk, 95);
            assert!(!c.services[0].violating());
            let d = p.decide(&c);
            disk.apply(&d);
            trims.extend(d);
        }
        assert_eq!(trims.len(), 1, "{trims:?}");
        let to = trims[0].to.unwrap() as f64 / cap as f64;
        assert!((0.75..=0.92).contains(&to), "trimmed to {to}");
        assert!(
            trims[0].reason.contains("its worst cycle left out"),
            "{}",
            trims[0].reason
        );
    }

    #[test]
    fn adaptive_says_when_no_cap_can_meet_an_slo_and_keeps_floors() {
        // A QD1 reader alone whose target is below what it gets alone: told, nothing cut.
        let mut disk = SimDisk::new(vec![SimService::latency("reader", 0.3, 1.0)]);
        let mut p = Adaptive::default();
        let mut findings = vec![];
        for _ in 0..20 {
            let c = disk.step();
            let d = p.decide(&c);
            assert!(d.is_empty(), "{d:?}");
            findings.extend(p.findings());
            disk.apply(&d);
        }
        assert_eq!(findings.len(), 1, "{findings:?}");
        let Finding::SloInfeasible {
            cycle,
            latency,
            others_bps,
            ref reason,
            ref action,
            ..
        } = findings[0]
        else {
            panic!("not slo_infeasible: {findings:?}");
        };
        assert_eq!(cycle, u64::from(adaptive::SELF_BLAME_CYCLES) - 1);
        // Nobody else: +0.0, not the -0.0 an empty f64 sum gives (the event printed it).
        assert!(
            others_bps == 0.0 && others_bps.is_sign_positive(),
            "{others_bps}"
        );
        assert_eq!(latency.slo_p999_ns, Some(300_000));
        assert!(latency.p999_ns.unwrap() > 300_000);
        assert!(reason.contains("nobody else"), "{reason}");
        assert!(action.contains("nothing left"), "{action}");
        // A writer with a floor above what the target allows: capped at its floor, then
        // the reader is told.
        let mut disk = noisy_pair(1.0);
        disk.services[1].floor = Some(Rate::BytesPerSec(900_000_000));
        let mut p = Adaptive::default();
        let mut findings = vec![];
        for _ in 0..40 {
            let c = disk.step();
            let d = p.decide(&c);
            for x in &d {
                assert!(x.to.is_none_or(|v| v >= 900_000_000), "{x:?}");
            }
            findings.extend(p.findings());
            disk.apply(&d);
        }
        assert_eq!(findings.len(), 1, "{findings:?}");
        let Finding::SloInfeasible { ref reason, .. } = findings[0] else {
            panic!("not slo_infeasible: {findings:?}");
        };
        assert!(reason.contains("floor"), "{reason}");
    }

    #[test]
    fn adaptive_many_services_like_paper_001() {
        for n in 2..=6usize {
            // Latency services with different SLOs, throughput services with targets and
            // one best-effort bulk writer; the bulk load starts at cycle 5.
            let mut svcs = vec![SimService::latency("l-a", 6.0, 1.0)];
            if n >= 3 {
                svcs.push(SimService::latency("l-b", 8.0, 2.0));
            }
            if n >= 4 {
                svcs.push(SimService::throughput("t-a", 20.0, 25.0));
            }
            if n >= 5 {
                svcs.push(SimService::latency("l-c", 10.0, 1.0));
            }
            if n >= 6 {
                svcs.push(SimService::throughput("t-b", 40.0, 60.0));
            }
            svcs.push(SimService::writer("bulk", SloClass::BestEffort, 2400.0, 5));
            assert_eq!(svcs.len(), n);
            let mut disk = SimDisk::new(svcs);
            let h = disk.run(&mut Adaptive::default(), 400);
            for name in ["l-a", "l-b", "l-c"] {
                let v = violating_cycles(&h, name);
                if v.is_empty() {
                    continue;
                }
                assert!(
                    !v.contains(&(v[0] + 2)),
                    "{n} services: {name} still violating 3 cycles after {}: {v:?}",
                    v[0]
                );
                let late = v.iter().filter(|&&c| c >= 60).count();
                assert!(
                    late * 10 <= 340,
                    "{n} services: {name} late violations {v:?}"
                );
            }
            // Throughput services keep their targets.
            for (c, _) in &h[100..] {
                for s in c.services.iter().filter(|s| s.slo_ns().is_none()) {
                    assert!(
                        !s.violating(),
                        "{n} services: {} violating at {}",
                        s.name,
                        c.cycle
                    );
                }
            }
            // Once the knee is found, at most one change in ten cycles (re-probes).
            let changes = h[60..].iter().filter(|(_, d)| !d.is_empty()).count();
            assert!(
                changes * 10 <= 340,
                "{n} services: {changes} changes in 340 cycles"
            );
        }
    }

    #[test]
    fn adaptive_turns_the_victims_own_concurrency_only_when_alone() {
        // A deep-queue latency service alone on the disk: nobody else to throttle.
        let mut disk = SimDisk::new(vec![SimService::latency("deep", 1.0, 16.0)]);
        let mut a = Adaptive::default();
        // Not on the evidence of one or two cycles (a slow spell of the disk looks the same).
        for _ in 1..adaptive::SELF_BLAME_CYCLES {
            let c = disk.step();
            assert!(a.decide(&c).is_empty(), "cut after cycle {}", c.cycle);
        }
        let c = disk.step();
        let d = a.decide(&c);
        assert!(!d.is_empty());
        assert!(d.iter().all(|x| x.service == 0 && x.knob == Knob::Riops));
        let p = d[0].cause.concurrency.unwrap();
        assert!(p < c.services[0].mean_inflight && p >= 1.0, "P {p}");
        // With a bulk writer present, the writer is throttled instead.
        let mut disk = noisy_pair(5.0);
        disk.cycle = 6;
        let c = disk.step();
        let d = Adaptive::default().decide(&c);
        assert!(
            d.iter().all(|x| x.service == 1 && x.knob == Knob::Wbps),
            "{d:?}"
        );
        assert_eq!(d[0].cause.victim.as_deref(), Some("reader"));
    }

    #[test]
    fn pine_follows_equations_exactly() {
        // Eq. (2)-(3): P=16, L=2*SLO -> min(8, 15) = 8.
        assert_eq!(pine_concurrency_step(16.0, 2.0, 1.0), 8.0);
        // Small violation: the step is at least one.
        assert_eq!(pine_concurrency_step(16.0, 1.01, 1.0), 15.0);
        assert_eq!(pine_concurrency_step(1.0, 9.0, 1.0), 1.0);
        assert_eq!(pine_concurrency_step(4.0, 0.5, 1.0), 4.0);
        let mut disk = SimDisk::new(vec![
            SimService::latency("deep", 1.0, 16.0),
            SimService::throughput("tf-low", 100.0, 50.0),
            SimService::throughput("tf-high", 100.0, 300.0),
        ]);
        let c = disk.step();
        let d = Pine::default().decide(&c);
        // Eq. (1): below target -> allocate the target; above -> allocate what it uses.
        let low = d.iter().find(|x| x.service == 1).unwrap();
        assert_eq!((low.knob, low.to), (Knob::Wbps, Some(100_000_000)));
        let high = d.iter().find(|x| x.service == 2).unwrap();
        assert_eq!(high.to, Some(c.services[2].write_bps as u64));
        // The latency service's concurrency goes 16 -> max(min(16*SLO/L, 15), 1).
        let lat = d.iter().find(|x| x.service == 0).unwrap();
        let s = &c.services[0];
        let want = pine_concurrency_step(16.0, s.p999_ns.unwrap() as f64, 1e6);
        assert_eq!(lat.cause.concurrency, Some(want));
        let iops = want / (s.mean_latency_ns.unwrap() / 1e9);
        assert_eq!(lat.to, Some(iops as u64));
        // PINE cannot help a QD1 reader against a best-effort writer: it has nothing to turn.
        let mut disk = noisy_pair(5.0);
        let h = disk.run(&mut Pine::default(), 30);
        assert!(h.iter().all(|(_, d)| d.is_empty()));
        assert!(violating_cycles(&h, "reader").len() >= 20);
    }

    #[test]
    fn priority_adjusts_only_the_highest_impact_service_per_cycle() {
        let mut disk = SimDisk::new(vec![
            SimService::latency("l-a", 0.6, 8.0),
            SimService::latency("l-b", 0.8, 16.0),
            SimService::latency("l-c", 1.0, 4.0),
        ]);
        let mut p = Priority::default();
        let c = disk.step();
        let th: Vec<f64> = c.services.iter().map(|s| s.th_dif().unwrap()).collect();
        let top = (0..3).max_by(|&a, &b| th[a].total_cmp(&th[b])).unwrap();
        let d = p.decide(&c);
        assert!(!d.is_empty());
        assert!(
            d.iter().all(|x| x.service == top),
            "{d:?} vs top {top} of {th:?}"
        );
        disk.apply(&d);
        // Next cycle: the change has not had a full cycle yet: nobody is touched.
        let c = disk.step();
        assert!(p.decide(&c).is_empty());
        // Th_dif follows paper 001 eq. (2).
        let s = &c.services[1];
        let (l, slo) = (s.p999_ns.unwrap() as f64, 0.8e6);
        let vio = (l - slo) / slo;
        assert!((s.th_dif().unwrap() - vio / (l / slo) * s.bps()).abs() < 1e-6);
    }

    #[test]
    fn slae_throttles_the_overloading_service_when_an_sla_is_missed() {
        let mut disk = noisy_pair(5.0);
        let h = disk.run(&mut Slae, 5);
        assert!(
            h.iter().all(|(_, d)| d.is_empty()),
            "no SLA miss, no action"
        );
        let c = disk.step();
        let d = Slae.decide(&c);
        assert_eq!(d.len(), 1);
        assert_eq!((d[0].service, d[0].knob), (1, Knob::Wbps));
        assert_eq!(d[0].to, Some((c.services[1].write_bps / 2.0) as u64));
        // It keeps halving while the SLA is missed and never relaxes.
        disk.apply(&d);
        let h = disk.run(&mut Slae, 60);
        let caps: Vec<u64> = h
            .iter()
            .filter_map(|(c, _)| c.services[1].limit.wbps)
            .collect();
        assert!(
            caps.windows(2).all(|w| w[1] <= w[0]),
            "SLAE relaxed: {caps:?}"
        );
        assert!(!h.last().unwrap().0.services[0].violating());
    }

    #[test]
    fn ute_throttles_the_top_consumer_above_the_threshold() {
        let mut disk = SimDisk::new(vec![
            SimService::writer("small", SloClass::BestEffort, 100.0, 0),
            SimService::writer("big", SloClass::BestEffort, 1500.0, 0),
        ]);
        let mut p = Ute { threshold: 0.75 };
        let c = disk.step();
        assert!(c.utilization > 0.75);
        let d = p.decide(&c);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].service, 1);
        disk.apply(&d);
        let h = disk.run(&mut p, 30);
        let last = &h.last().unwrap().0;
        assert!(last.utilization <= 0.75 + 1e-9 || h.last().unwrap().1.is_empty());
        // Below the threshold it does nothing.
        let mut quiet = SimDisk::new(vec![SimService::writer(
            "w",
            SloClass::BestEffort,
            200.0,
            0,
        )]);
        let c = quiet.step();
        assert!(c.utilization < 0.75);
        assert!(p.decide(&c).is_empty());
    }

    /// Hundreds of services on one disk, as on a host with a container per tenant: the
    /// reader (5 ms), twenty latency services with a looser target (10 ms), 240 small
    /// best-effort writers at 0.5 MB/s each, 38 cgroups with no I/O, and the bulk writer
    /// from cycle 5 to 200. The targets hold as with two services, only the bulk
    /// writer is ever capped, and its cap is lifted once it goes quiet.
    #[test]
    fn adaptive_among_three_hundred_services_caps_only_the_aggressor() {
        const STOP: u64 = 200;
        let make = || {
            let mut svcs = vec![
                SimService::latency("reader", 5.0, 1.0),
                SimService::writer("bulk", SloClass::BestEffort, 2400.0, 5),
            ];
            svcs[1].on_off = Some((STOP - 5, 1000));
            svcs.extend((0..20).map(|_| SimService::latency("tenant-db", 10.0, 1.0)));
            svcs.extend(
                (0..240).map(|_| SimService::writer("tenant-log", SloClass::BestEffort, 0.5, 0)),
            );
            svcs.extend(
                (0..38).map(|_| SimService::writer("tenant-idle", SloClass::BestEffort, 0.0, 0)),
            );
            let mut d = SimDisk::new(svcs);
            d.noise_seed = Some(7);
            d
        };
        assert_eq!(make().services.len(), 300);
        let h = make().run(&mut Adaptive::default(), STOP + 20);
        trace("300 services", &h);
        let touched: std::collections::BTreeSet<&str> = h
            .iter()
            .flat_map(|(c, d)| d.iter().map(|d| c.services[d.service].name.as_str()))
            .collect();
        assert_eq!(
            touched,
            ["bulk"].into(),
            "only the bulk writer may be capped"
        );
        for name in ["reader", "tenant-db"] {
            let v = violating_cycles(&h, name);
            assert!(
                v.first().is_none_or(|&c| c >= 5) && !v.contains(&7) && !v.contains(&8),
                "{name}: not under its SLO within 3 cycles of the bulk writer's arrival: {v:?}"
            );
        }
        let (violations, changes, mean) = steady(&h, 1, 25, STOP);
        let best = best_static_cap_mbps(&make, 1, 7, STOP);
        println!(
            "300 services: steady violations {violations}/175, changes {changes}, {mean:.0} MB/s vs best static {best} MB/s"
        );
        assert!(
            violations * 10 <= 175,
            "{violations} violating cycles in 175"
        );
        assert!(
            changes * 10 <= 175,
            "{changes} changes in 175 steady cycles"
        );
        assert!(
            mean >= 0.9 * best,
            "{mean:.0} MB/s < 90 % of best static {best} MB/s"
        );
        let lifted = h
            .iter()
            .find(|(c, _)| c.cycle > STOP && c.services[1].limit.is_unlimited())
            .map(|(c, _)| c.cycle);
        assert!(
            lifted.is_some_and(|c| c <= STOP + 5),
            "the bulk writer's cap lifted at {lifted:?}, not within 5 cycles of its stop at {STOP}"
        );
    }

    /// A writer at its floor with the reader's window close to the target (0.96 of it) has
    /// nothing left to trim: no knee is learnt at the floor, so when the disk gets twice as
    /// fast the writer is raised within a few cycles.
    #[test]
    fn a_cap_at_its_floor_learns_no_knee_from_a_trim_it_cannot_make() {
        let mut disk = noisy_pair(5.0);
        disk.services[1].floor = Some(Rate::BytesPerSec(440_000_000));
        let mut p = Adaptive::default();
        let before = disk.run(&mut p, 40);
        trace("at the floor", &before);
        assert_eq!(
            disk.services[1].limit.wbps,
            Some(440_000_000),
            "at its floor"
        );
        disk.knee_scale = 2.0;
        let after = disk.run(&mut p, 15);
        trace("faster", &after);
        assert!(
            disk.services[1].limit.wbps > Some(440_000_000),
            "not raised from its floor within 15 cycles of the disk getting faster"
        );
    }

    #[test]
    fn floors_are_never_crossed() {
        let mut disk = noisy_pair(1.0);
        disk.services[1].floor = Some(Rate::BytesPerSec(900_000_000));
        for p in POLICY_NAMES {
            let mut d = noisy_pair(1.0);
            d.services[1].floor = Some(Rate::BytesPerSec(900_000_000));
            let h = d.run(by_name(p, 0.75).unwrap().as_mut(), 40);
            for (_, ds) in &h {
                for x in ds.iter().filter(|x| x.service == 1) {
                    if let Some(v) = x.to {
                        assert!(v >= 900_000_000 || x.knob == Knob::Rbps, "{p}: {x:?}");
                    }
                }
            }
        }
        let _ = disk.step();
    }

    /// The disk slows until the reader alone sits at its target (BENCHMARKS run DM, the
    /// random reader, repeat 3: 2.9-3.4 ms against 3 with the scan at 117 MB/s and at 20):
    /// cuts move the reader's p99.9 by little and never under the target. They stop once
    /// they have shown that (two cuts, half the rate), and the reader is told
    /// `slo_infeasible`: the writer keeps about half the cap it had, not the least cap.
    #[test]
    fn cuts_that_move_nothing_stop_and_the_victim_is_told_infeasible() {
        for seed in [Some(1), Some(2), Some(3)] {
            let mut disk = noisy_pair(5.0);
            disk.noise_seed = seed;
            let mut p = Adaptive::default();
            let before = disk.run(&mut p, 100);
            p.findings();
            let cap = before.last().unwrap().0.services[1]
                .limit
                .total_bps()
                .unwrap() as f64;
            // The writer's harm a tenth of the measured curve's, the disk's own 4.5 ms.
            disk.knee_scale = 10.0;
            disk.stall_ns = 4.5e6;
            let slow = disk.run(&mut p, 60);
            trace(&format!("slow disk, noise {seed:?}"), &slow);
            let told = p
                .findings()
                .iter()
                .filter(|f| matches!(f, Finding::SloInfeasible { .. }))
                .count();
            let lowest = slow
                .iter()
                .filter_map(|(c, _)| c.services[1].limit.total_bps())
                .min()
                .unwrap_or(u64::MAX) as f64;
            println!(
                "noise {seed:?}: cap {:.0} MB/s before, {:.0} at the lowest, told {told}",
                cap / MB,
                lowest / MB
            );
            assert!(told >= 1, "noise {seed:?}: the reader was not told");
            assert!(
                lowest >= 0.45 * cap,
                "noise {seed:?}: cut to {:.0} of {:.0} MB/s for nothing",
                lowest / MB,
                cap / MB
            );
        }
    }

    #[test]
    fn decisions_replay_identically() {
        let run = || {
            let mut d = noisy_pair(5.0);
            d.run(&mut Adaptive::default(), 80)
        };
        assert_eq!(run(), run());
    }
}
