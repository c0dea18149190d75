//! Interference between services learned from the host's own history: for each ordered
//! pair (victim V, other O) of services on a disk, V's p99.9 and throughput in the cycles
//! where O was active next to it against the cycles where O was idle.
//!
//! Pure: fed `service_stats` events, it answers from them alone.
//!
//! - A service is *active* in a cycle on a disk when it had data requests there
//!   (`samples > 0` or `iops > 0`); a cycle without its `service_stats` on that disk is an
//!   idle one. A cycle where O starts or stops part-way counts as active: the medians below
//!   keep a few such cycles from moving the figures.
//! - V's figures on each side are the *median over cycles* of its per-cycle p99.9 and of
//!   its MB/s (read + write). A median, not a mean: one cycle of a disk's slow spell must
//!   not make a pair look harmful.
//! - Other services than V and O are as they were: each side mixes whatever else ran.
//! - Below [`MIN_CYCLES_PER_SIDE`] cycles on either side no change is claimed; the pair is
//!   left to the guideline penalty of its classes (paper 002), when both are known.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::{
    events::ServiceStats,
    measure::{character::CharacterClass, metrics::median},
};

/// Cycles each side (other active, other idle) needs before a change is claimed.
pub const MIN_CYCLES_PER_SIDE: usize = 5;

/// The victim's p99.9 growing by at least these factors with the other active makes a
/// learned penalty of 1 and 2 (the paper's 0..=2 scale).
pub const P999_RATIO_PENALTY: [f64; 2] = [1.25, 2.0];
/// The victim's throughput falling to at most these fractions makes a penalty of 1 and 2.
pub const MBPS_RATIO_PENALTY: [f64; 2] = [0.8, 0.5];

/// A guideline penalty for two classes (paper 002), 0..=2.
pub type Guideline = fn(CharacterClass, CharacterClass) -> u32;

/// One service on one disk in one cycle, as the estimator keeps it.
#[derive(Debug, Clone, Copy)]
struct Sample {
    active: bool,
    p999_ns: Option<u64>,
    mbps: f64,
}

#[derive(Debug, Default)]
struct DiskHistory {
    disk: Option<String>,
    /// (run, cycle) -> service -> sample. Runs: cycle numbers start over with each agent.
    cycles: BTreeMap<(u32, u64), BTreeMap<String, Sample>>,
    /// Per service, how many of its active cycles had each class.
    classes: BTreeMap<String, BTreeMap<CharacterClass, u64>>,
}

/// Builds the estimates from `service_stats` events, in stream order.
#[derive(Debug, Default)]
pub struct Estimator {
    run: u32,
    disks: BTreeMap<String, DiskHistory>,
}

/// One side of a pair: the victim's figures over a set of cycles.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Side {
    pub cycles: usize,
    /// Median of the victim's per-cycle p99.9; null without a cycle that has one.
    pub p999_ns: Option<u64>,
    /// Median of the victim's per-cycle MB/s (read + write).
    pub mbps: Option<f64>,
}

/// Where a pair's figure comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Basis {
    /// Enough cycles on both sides: the change is measured.
    Measured,
    /// Too few cycles; the paper's penalty for the two classes stands in.
    Guideline,
    /// Too few cycles and a class unknown: nothing is claimed.
    TooLittleData,
}

/// What the other service does to the victim on one disk.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PairEstimate {
    pub dev: String,
    pub disk: Option<String>,
    pub victim: String,
    pub other: String,
    pub victim_class: Option<CharacterClass>,
    pub other_class: Option<CharacterClass>,
    /// Victim active, other idle.
    pub alone: Side,
    /// Victim active, other active.
    pub together: Side,
    /// together / alone of the victim's p99.9 (> 1: the other hurts its latency); only
    /// when measured.
    pub p999_ratio: Option<f64>,
    /// together / alone of the victim's MB/s (< 1: the other takes its throughput).
    pub mbps_ratio: Option<f64>,
    pub basis: Basis,
    /// 0..=2: from the measured change when measured, else the guideline's.
    pub penalty: Option<u32>,
}

impl Estimator {
    /// A new agent run begins (`agent_start`): its cycle numbers start over.
    pub fn start_run(&mut self) {
        self.run += 1;
    }

    pub fn add(&mut self, s: &ServiceStats) {
        let history = self.disks.entry(s.dev.clone()).or_default();
        if history.disk.is_none() {
            history.disk = s.disk.clone();
        }
        let mbps = finite(s.read_mbps) + finite(s.write_mbps);
        let active = s.samples > 0 || finite(s.iops) > 0.0;
        let sample = Sample {
            active,
            p999_ns: s.p999_ns,
            mbps,
        };
        history
            .cycles
            .entry((self.run, s.cycle))
            .or_default()
            .insert(s.service.clone(), sample);
        let classes = history.classes.entry(s.service.clone()).or_default();
        if let Some(class) = s
            .character
            .as_ref()
            .and_then(|c| c.class)
            .filter(|_| active)
        {
            *classes.entry(class).or_default() += 1;
        }
    }

    /// Cycles seen on any disk.
    pub fn cycles(&self) -> usize {
        let all: BTreeSet<&(u32, u64)> =
            self.disks.values().flat_map(|d| d.cycles.keys()).collect();
        all.len()
    }

    /// Disks as (dev, kernel name).
    pub fn disks(&self) -> Vec<(String, Option<String>)> {
        self.disks
            .iter()
            .map(|(dev, h)| (dev.clone(), h.disk.clone()))
            .collect()
    }

    /// Services active on `dev` at least once, with their active cycles there.
    pub fn services(&self, dev: &str) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        if let Some(h) = self.disks.get(dev) {
            for services in h.cycles.values() {
                for (name, _) in services.iter().filter(|(_, s)| s.active) {
                    *out.entry(name.clone()).or_default() += 1;
                }
            }
        }
        out
    }

    /// The class a service had most often on `dev` (ties: the first in
    /// [`CharacterClass::ALL`] order); None when it never had one.
    pub fn class(&self, dev: &str, service: &str) -> Option<CharacterClass> {
        let counts = self.disks.get(dev)?.classes.get(service)?;
        let most = counts.values().max()?;
        counts.iter().find(|(_, n)| *n == most).map(|(c, _)| *c)
    }

    /// Every ordered pair of services active on the same disk, most harmful first:
    /// measured pairs by the victim's p99.9 growth (then its throughput loss), then the
    /// guideline's by penalty, then those with too little data.
    pub fn estimate(&self, guideline: Option<Guideline>) -> Vec<PairEstimate> {
        let mut out = vec![];
        for (dev, history) in &self.disks {
            let services: Vec<String> = self.services(dev).into_keys().collect();
            for victim in &services {
                for other in services.iter().filter(|o| *o != victim) {
                    out.push(self.pair(dev, history, victim, other, guideline));
                }
            }
        }
        out.sort_by(|a, b| {
            harm_order(b)
                .total_cmp(&harm_order(a))
                .then(a.victim.cmp(&b.victim))
        });
        out
    }

    fn pair(
        &self,
        dev: &str,
        history: &DiskHistory,
        victim: &str,
        other: &str,
        guideline: Option<Guideline>,
    ) -> PairEstimate {
        let (mut alone, mut together) = (vec![], vec![]);
        for services in history.cycles.values() {
            let Some(v) = services.get(victim).filter(|s| s.active) else {
                continue;
            };
            match services.get(other).is_some_and(|o| o.active) {
                true => together.push(*v),
                false => alone.push(*v),
            }
        }
        let (alone, together) = (side(&alone), side(&together));
        let (victim_class, other_class) = (self.class(dev, victim), self.class(dev, other));
        let enough = alone.cycles >= MIN_CYCLES_PER_SIDE && together.cycles >= MIN_CYCLES_PER_SIDE;
        let ratio = |t: Option<f64>, a: Option<f64>| match (t, a) {
            (Some(t), Some(a)) if enough && a > 0.0 => Some(t / a),
            _ => None,
        };
        let p999_ratio = ratio(
            together.p999_ns.map(|v| v as f64),
            alone.p999_ns.map(|v| v as f64),
        );
        let mbps_ratio = ratio(together.mbps, alone.mbps);
        let guided = match (guideline, victim_class, other_class) {
            (Some(g), Some(v), Some(o)) => Some(g(v, o)),
            _ => None,
        };
        let (basis, penalty) = if enough && (p999_ratio.is_some() || mbps_ratio.is_some()) {
            (
                Basis::Measured,
                Some(learned_penalty(p999_ratio, mbps_ratio)),
            )
        } else if guided.is_some() {
            (Basis::Guideline, guided)
        } else {
            (Basis::TooLittleData, None)
        };
        PairEstimate {
            dev: dev.to_string(),
            disk: history.disk.clone(),
            victim: victim.to_string(),
            other: other.to_string(),
            victim_class,
            other_class,
            alone,
            together,
            p999_ratio,
            mbps_ratio,
            basis,
            penalty,
        }
    }
}

/// The paper's 0..=2 penalty from a measured change: the worse of the latency growth and
/// the throughput loss, by [`P999_RATIO_PENALTY`] and [`MBPS_RATIO_PENALTY`].
pub fn learned_penalty(p999_ratio: Option<f64>, mbps_ratio: Option<f64>) -> u32 {
    let by_latency = p999_ratio.map_or(0, |r| {
        P999_RATIO_PENALTY.iter().filter(|t| r >= **t).count() as u32
    });
    let by_throughput = mbps_ratio.map_or(0, |r| {
        MBPS_RATIO_PENALTY.iter().filter(|t| r <= **t).count() as u32
    });
    by_latency.max(by_throughput)
}

/// Sort key, larger = more harmful: measured pairs above guideline ones above the rest.
fn harm_order(p: &PairEstimate) -> f64 {
    match p.basis {
        Basis::Measured => {
            let latency = p.p999_ratio.unwrap_or(1.0);
            // Throughput loss only orders pairs of equal latency growth.
            let throughput = 1.0 - p.mbps_ratio.unwrap_or(1.0).min(1.0);
            1e6 + latency * 1e3 + throughput
        }
        Basis::Guideline => 1e3 + f64::from(p.penalty.unwrap_or(0)),
        Basis::TooLittleData => 0.0,
    }
}

fn side(samples: &[Sample]) -> Side {
    let p999: Vec<f64> = samples
        .iter()
        .filter_map(|s| s.p999_ns.map(|v| v as f64))
        .collect();
    let mbps: Vec<f64> = samples.iter().map(|s| s.mbps).collect();
    Side {
        cycles: samples.len(),
        p999_ns: median(p999).map(|v| v.round() as u64),
        mbps: median(mbps),
    }
}

fn finite(v: f64) -> f64 {
    if v.is_finite() {
        v
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::character::Character;

    fn stats(
        cycle: u64,
        service: &str,
        p999_ms: u64,
        mbps: f64,
        class: CharacterClass,
    ) -> ServiceStats {
        ServiceStats {
            cycle,
            service: service.into(),
            dev: "7:3".into(),
            disk: Some("loop3".into()),
            samples: 1000,
            p999_ns: Some(p999_ms * 1_000_000),
            read_mbps: mbps,
            iops: 1000.0,
            character: Some(Character {
                ios: 1000,
                class: Some(class),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// A reader alone for `alone` cycles at 1 ms, then with a writer for `together` cycles
    /// at 20 ms and a third of its throughput; the writer unaffected by the reader.
    fn reader_and_writer(alone: u64, together: u64, writer_alone: u64) -> Estimator {
        let mut e = Estimator::default();
        e.start_run();
        let mut cycle = 0;
        for _ in 0..alone {
            cycle += 1;
            e.add(&stats(cycle, "reader", 1, 30.0, CharacterClass::RandRead));
        }
        for _ in 0..together {
            cycle += 1;
            e.add(&stats(cycle, "reader", 20, 10.0, CharacterClass::RandRead));
            e.add(&stats(cycle, "writer", 50, 400.0, CharacterClass::SeqWrite));
        }
        for _ in 0..writer_alone {
            cycle += 1;
            e.add(&stats(cycle, "writer", 50, 400.0, CharacterClass::SeqWrite));
        }
        e
    }

    fn two(_: CharacterClass, _: CharacterClass) -> u32 {
        2
    }

    #[test]
    fn the_pair_and_its_direction_are_named_with_numbers() {
        let e = reader_and_writer(6, 8, 6);
        let pairs = e.estimate(None);
        assert_eq!(pairs.len(), 2);
        let worst = &pairs[0];
        assert_eq!(
            (worst.victim.as_str(), worst.other.as_str()),
            ("reader", "writer")
        );
        assert_eq!(worst.basis, Basis::Measured);
        assert_eq!((worst.alone.cycles, worst.together.cycles), (6, 8));
        assert_eq!(worst.alone.p999_ns, Some(1_000_000));
        assert_eq!(worst.together.p999_ns, Some(20_000_000));
        assert_eq!(worst.p999_ratio, Some(20.0));
        assert!((worst.mbps_ratio.unwrap() - 1.0 / 3.0).abs() < 1e-9);
        assert_eq!(worst.penalty, Some(2));
        assert_eq!(worst.victim_class, Some(CharacterClass::RandRead));
        assert_eq!(worst.other_class, Some(CharacterClass::SeqWrite));
        // The writer is unaffected: measured, ratio 1, no penalty, ranked after.
        let back = &pairs[1];
        assert_eq!(
            (back.victim.as_str(), back.basis),
            ("writer", Basis::Measured)
        );
        assert_eq!((back.p999_ratio, back.penalty), (Some(1.0), Some(0)));
    }

    #[test]
    fn too_few_cycles_claim_nothing_and_fall_back_to_the_guideline() {
        // 4 cycles alone: one short of the minimum.
        let e = reader_and_writer(MIN_CYCLES_PER_SIDE as u64 - 1, 8, 6);
        let pairs = e.estimate(None);
        let p = pairs.iter().find(|p| p.victim == "reader").unwrap();
        assert_eq!(p.basis, Basis::TooLittleData);
        assert_eq!((p.p999_ratio, p.mbps_ratio, p.penalty), (None, None, None));
        assert_eq!(p.alone.cycles, MIN_CYCLES_PER_SIDE - 1);
        // With a guideline, its penalty for the classes stands in, labelled so.
        let pairs = e.estimate(Some(two));
        let p = pairs.iter().find(|p| p.victim == "reader").unwrap();
        assert_eq!(
            (p.basis, p.penalty, p.p999_ratio),
            (Basis::Guideline, Some(2), None)
        );
        // A measured pair ranks above a guideline one.
        assert_eq!(pairs[0].victim, "writer");
        assert_eq!(pairs[0].basis, Basis::Measured);
    }

    #[test]
    fn a_service_without_data_requests_is_idle_and_cycles_of_runs_stay_apart() {
        let mut e = Estimator::default();
        for run in 0..2 {
            e.start_run();
            // Cycle numbers 1..=6 in both runs: twelve distinct cycles.
            for cycle in 1..=6 {
                e.add(&stats(cycle, "a", 1, 10.0, CharacterClass::RandRead));
                let mut b = stats(cycle, "b", 1, 0.0, CharacterClass::SeqWrite);
                if run == 0 {
                    (b.samples, b.iops, b.character) = (0, 0.0, None);
                }
                e.add(&b);
            }
        }
        assert_eq!(e.cycles(), 12);
        let pairs = e.estimate(None);
        let p = pairs.iter().find(|p| p.victim == "a").unwrap();
        assert_eq!((p.alone.cycles, p.together.cycles), (6, 6));
        assert_eq!(e.services("7:3").get("b"), Some(&6));
    }

    #[test]
    fn medians_resist_a_slow_cycle_and_penalties_follow_the_thresholds() {
        let mut e = reader_and_writer(7, 7, 0);
        // One slow spell while alone: the median stays 1 ms.
        e.add(&stats(100, "reader", 900, 30.0, CharacterClass::RandRead));
        let p = e
            .estimate(None)
            .into_iter()
            .find(|p| p.victim == "reader")
            .unwrap();
        assert_eq!(p.alone.p999_ns, Some(1_000_000));
        assert_eq!(learned_penalty(Some(1.1), Some(0.95)), 0);
        assert_eq!(learned_penalty(Some(1.3), None), 1);
        assert_eq!(learned_penalty(Some(1.0), Some(0.4)), 2);
        assert_eq!(learned_penalty(None, None), 0);
    }

    #[test]
    fn nothing_recorded_gives_no_pairs() {
        let e = Estimator::default();
        assert!(e.estimate(Some(two)).is_empty());
        assert_eq!(e.cycles(), 0);
    }
}
