//! SLAE and UTE (paper 004). SLAE: when a service misses its SLA, reduce the I/O
//! intensity of the overloading service (the one moving the most bytes). UTE: when the
//! device utilization exceeds a threshold (0.7-0.8 in the paper, 0.75 here), reduce the
//! service with the largest I/O share. The paper reduces by a fixed cut and never relaxes;
//! so do these: each cut halves the service's current rate, never below its floor.

use super::{base_cause, cap_bandwidth, victim_cause, Decision, DeviceCycle, Policy, ServiceLoad};

fn halve(d: &DeviceCycle, s: &ServiceLoad, reason: String, cause: super::Cause) -> Vec<Decision> {
    if !s.can_change(d.cycle) {
        return vec![];
    }
    let current = s
        .limit
        .total_bps()
        .map_or(s.bps(), |c| (c as f64).min(s.bps()));
    let cap = ((current / 2.0) as u64).max(s.floor_bps());
    if s.limit.total_bps().is_some_and(|c| c <= cap) {
        return vec![]; // at its floor
    }
    cap_bandwidth(s, d.dev, cap, reason, cause)
}

#[derive(Debug, Default)]
pub struct Slae;

impl Policy for Slae {
    fn name(&self) -> &'static str {
        "slae"
    }
    fn decide(&mut self, d: &DeviceCycle) -> Vec<Decision> {
        let Some(victim) = d
            .services
            .iter()
            .filter(|s| s.violating())
            .max_by(|a, b| a.vio().unwrap_or(0.0).total_cmp(&b.vio().unwrap_or(0.0)))
        else {
            return vec![];
        };
        let Some(over) = d
            .services
            .iter()
            .filter(|s| s.id != victim.id && s.bps() > 0.0)
            .max_by(|a, b| a.bps().total_cmp(&b.bps()))
        else {
            return vec![];
        };
        let cause = victim_cause(base_cause(d, over), victim);
        halve(
            d,
            over,
            format!(
                "{} misses its SLA: halve the overloading service (SLAE)",
                victim.name
            ),
            cause,
        )
    }
}

#[derive(Debug)]
pub struct Ute {
    pub threshold: f64,
}

impl Policy for Ute {
    fn name(&self) -> &'static str {
        "ute"
    }
    fn decide(&mut self, d: &DeviceCycle) -> Vec<Decision> {
        if d.utilization <= self.threshold {
            return vec![];
        }
        let total: f64 = d.services.iter().map(|s| s.bps()).sum();
        let Some(top) = d
            .services
            .iter()
            .filter(|s| s.bps() > 0.0)
            .max_by(|a, b| a.bps().total_cmp(&b.bps()))
        else {
            return vec![];
        };
        let mut cause = base_cause(d, top);
        cause.share = if total > 0.0 { top.bps() / total } else { 0.0 };
        halve(
            d,
            top,
            format!(
                "device utilization {:.2} over {:.2}: halve the largest I/O share (UTE)",
                d.utilization, self.threshold
            ),
            cause,
        )
    }
}
