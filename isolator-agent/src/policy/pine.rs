//! PINE (paper 000) and its priority-based extension (paper 001).
//!
//! Throughput services get eq. (1): the bandwidth allocation of the next cycle is the
//! target when the service is below it and its current throughput when above, written as
//! the service's bps cap. Latency services over their p99.9 target get eq. (2)-(3):
//! `P(t+1) = max(min(P(t) * SLO/L, P(t) - 1), 1)`, a concurrency level realised as an
//! IOPS cap via Little's law. PINE adjusts every latency service each cycle; `priority`
//! adjusts only the one with the largest Th_dif (paper 001) and waits for its effect.

use std::collections::HashMap;

use super::{
    base_cause, cap_bandwidth, cap_concurrency, pine_concurrency_step, victim_cause, Decision,
    DeviceCycle, Policy, ServiceId, ServiceLoad,
};
use crate::config::SloClass;

/// Concurrency levels P(t) per (device, service), starting from the measured in-flight.
#[derive(Debug, Default)]
struct Levels(HashMap<(u32, ServiceId), f64>);

impl Levels {
    fn step(&mut self, dev: u32, s: &ServiceLoad) -> Option<(f64, f64)> {
        let slo = s.slo_ns()? as f64;
        let l = s.judged_latency()? as f64;
        let p = *self
            .0
            .entry((dev, s.id))
            .or_insert_with(|| s.mean_inflight.ceil().max(1.0));
        let next = pine_concurrency_step(p, l, slo);
        self.0.insert((dev, s.id), next);
        Some((p, next))
    }
}

fn throughput_allocation(d: &DeviceCycle) -> Vec<Decision> {
    let mut out = vec![];
    for s in &d.services {
        let SloClass::Throughput { rate_bps } = s.class else {
            continue;
        };
        if !s.can_change(d.cycle) {
            continue;
        }
        let th = s.bps();
        let (alloc, why) = if th < rate_bps as f64 {
            (
                rate_bps,
                "below its rate target: allocate the target (PINE eq. 1)",
            )
        } else {
            (
                th as u64,
                "at or above its rate target: allocate what it uses (PINE eq. 1)",
            )
        };
        let cause = victim_cause(base_cause(d, s), s);
        out.extend(cap_bandwidth(s, d.dev, alloc, why.into(), cause));
    }
    out
}

fn concurrency_step(
    levels: &mut Levels,
    d: &DeviceCycle,
    s: &ServiceLoad,
    why: impl FnOnce() -> String,
) -> Vec<Decision> {
    if !s.violating() || !s.can_change(d.cycle) {
        return vec![];
    }
    let Some((p, next)) = levels.step(d.dev, s) else {
        return vec![];
    };
    if next >= p && !s.limit.is_unlimited() {
        return vec![];
    }
    if next >= p {
        // Already at concurrency 1 and unthrottled: an IOPS cap at today's rate would
        // only hurt it later. PINE has nothing left to turn.
        return vec![];
    }
    let cause = victim_cause(base_cause(d, s), s);
    cap_concurrency(
        s,
        d.dev,
        next,
        format!("{}: concurrency {p:.0} -> {next:.2} (PINE eq. 2-3)", why()),
        cause,
    )
}

#[derive(Debug, Default)]
pub struct Pine {
    levels: Levels,
}

impl Policy for Pine {
    fn name(&self) -> &'static str {
        "pine"
    }
    fn forget_service(&mut self, id: ServiceId) {
        self.levels.0.retain(|&(_, s), _| s != id);
    }
    fn decide(&mut self, d: &DeviceCycle) -> Vec<Decision> {
        let mut out = throughput_allocation(d);
        for s in &d.services {
            // Worded only for a decision: this runs for every service every cycle.
            let why = || format!("{} over target", s.slo_quantile().label());
            out.extend(concurrency_step(&mut self.levels, d, s, why));
        }
        out
    }
}

#[derive(Debug, Default)]
pub struct Priority {
    levels: Levels,
}

impl Policy for Priority {
    fn name(&self) -> &'static str {
        "priority"
    }
    fn forget_service(&mut self, id: ServiceId) {
        self.levels.0.retain(|&(_, s), _| s != id);
    }
    fn decide(&mut self, d: &DeviceCycle) -> Vec<Decision> {
        let mut out = throughput_allocation(d);
        // Only one latency service per cycle: the largest impact Th_dif first; and none
        // while the last one changed has not had a full cycle to act.
        if d.services
            .iter()
            .any(|s| s.slo_ns().is_some() && !s.can_change(d.cycle))
        {
            return out;
        }
        let top = d
            .services
            .iter()
            .filter(|s| s.violating() && s.slo_ns().is_some())
            .max_by(|a, b| {
                a.th_dif()
                    .unwrap_or(0.0)
                    .total_cmp(&b.th_dif().unwrap_or(0.0))
            });
        if let Some(s) = top {
            out.extend(concurrency_step(&mut self.levels, d, s, || {
                "largest Th_dif among violators".into()
            }));
        }
        out
    }
}
