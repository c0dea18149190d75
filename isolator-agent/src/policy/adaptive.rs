//! `adaptive`: find the aggressor, throttle it enough in one step, then give back
//! bandwidth stepwise while every SLO holds, remembering where the knee was.
//!
//! - A victim is a latency service over its p99.9 target (or a backlogged throughput
//!   service short of its rate).
//! - The aggressor is the service that occupies the device (largest device-time share)
//!   among those that owe nothing: best-effort first, then throughput services above
//!   their target, then latency services within theirs. The bytes the victim competes
//!   with are scaled by (SLO/L)^2 (at most half, at least 5 %) and the whole cut is taken
//!   from the aggressor: one decisive cut, because a second cut costs two more cycles.
//! - Only when nobody else loads the device does the victim's own concurrency go down
//!   (PINE eq. 2-3 through Little's law), and only after [`SELF_BLAME_CYCLES`] violating
//!   cycles in a row: capping the service the SLO protects is the one decision that can turn
//!   a slow spell of the disk into an outage of that service.
//! - With every p99.9 under 30 % of its target for two cycles (the change's transition and
//!   one full cycle under it), one capped service is raised x1.5; with every p99.9 at or under
//!   70 % of its target for four cycles, x1.1. Never past half-way to the lowest rate known
//!   to break an SLO (remembered for [`BAD_MEMORY_CYCLES`]); within 20 % of it the cap
//!   holds. A raise followed by a violation, or by a p99.9 above 85 % of its target, before
//!   the cap settled ([`SETTLED_CYCLES`]) goes straight back to the last good cap. A cap that
//!   no longer binds is removed.

use std::collections::HashMap;

use super::{
    base_cause, cap_bandwidth, cap_concurrency, pine_concurrency_step, uncap, victim_cause, Cause,
    Decision, DeviceCycle, Policy, ServiceId, ServiceLoad,
};
use crate::config::SloClass;

/// How long a rate that broke an SLO is remembered before it may be probed again. Each time
/// the same knee (within [`SAME_KNEE`]) is found again, it is trusted twice as long, up to
/// [`MAX_BAD_MEMORY_CYCLES`]: a stable knee is probed ever more rarely, a moved one soon.
pub const BAD_MEMORY_CYCLES: u64 = 60;
const MAX_BAD_MEMORY_CYCLES: u64 = 16 * BAD_MEMORY_CYCLES;
const SAME_KNEE: f64 = 0.15;
/// Relax only when every latency service is at most this fraction of its target.
const RELAX_MARGIN: f64 = 0.7;
const HEALTHY_CYCLES_TO_RELAX: u32 = 4;
/// With every p99.9 at most this fraction of its target, raises are big and quick: the knee
/// of a shared disk is steep (measured: a writer cap x1.5 from a p99.9 at 35-40 % of the
/// target overshot it), so only a p99.9 far below its target says a big step is safe.
const ROOMY: f64 = 0.3;
/// With every SLO under [`ROOMY`], a raise may follow after this many cycles.
const FAST_RAISE_CYCLES: u32 = 2;
/// A cap unchanged this long is settled: a violation under it gets a gentle cut.
const SETTLED_CYCLES: u64 = 4;
/// A settled cap that sees a violation keeps at least this fraction: per-cycle p99.9 on a
/// shared disk has single-cycle spikes, and a real load change gets a decisive cut at the
/// next violation anyway.
const GENTLE_CUT_MIN: f64 = 0.7;
const RAISE_FACTOR: f64 = 1.1;
const FAST_RAISE_FACTOR: f64 = 1.5;
/// Raises stop at this fraction of the lowest rate known to break an SLO.
const KNEE_HOLD: f64 = 0.8;
/// A raise that brings a p99.9 above this fraction of its target before the cap settles is
/// undone without waiting for the violation: near the knee the per-cycle p99.9 straddles
/// the target, and the next cycle would likely break it.
const NEAR_MISS: f64 = 0.85;

/// The lowest total rate (bytes/s) seen to break an SLO (or come close), when, and for how
/// many cycles it is trusted.
#[derive(Debug, Clone, Copy)]
struct Knee {
    rate_bps: u64,
    at_cycle: u64,
    memory_cycles: u64,
}

#[derive(Debug, Default, Clone)]
struct CapState {
    /// The last knee found, kept after it expires to tell a confirmed knee from a new one.
    knee: Option<Knee>,
    /// The cap before the last raise, to return to if the raise breaks an SLO.
    before_raise: Option<u64>,
}

/// Consecutive cycles, per disk, with every SLO under [`RELAX_MARGIN`] of its target
/// (`margin`) and under [`ROOMY`] (`roomy`).
#[derive(Debug, Default, Clone, Copy)]
struct Streak {
    margin: u32,
    roomy: u32,
}

impl CapState {
    /// The knee, while it is trusted.
    fn bad(&self, cycle: u64) -> Option<u64> {
        self.knee
            .filter(|k| cycle < k.at_cycle + k.memory_cycles)
            .map(|k| k.rate_bps)
    }

    fn remember_bad(&mut self, rate_bps: u64, cycle: u64) {
        let memory_cycles = match self.knee {
            Some(k) if (rate_bps as f64 / k.rate_bps as f64 - 1.0).abs() <= SAME_KNEE => {
                (k.memory_cycles * 2).min(MAX_BAD_MEMORY_CYCLES)
            }
            _ => BAD_MEMORY_CYCLES,
        };
        self.knee = Some(Knee {
            rate_bps,
            at_cycle: cycle,
            memory_cycles,
        });
    }
}

/// Consecutive violating cycles, with nobody else loading the device, before a latency
/// service's own concurrency is cut. Seen on the test disk: a QD1 reader alone hit 250 ms
/// p99.9 for two cycles of a slow spell (nothing a cap on it could help), and a cut after one
/// cycle held it at 10 IOPS.
pub const SELF_BLAME_CYCLES: u32 = 3;

#[derive(Debug, Default)]
pub struct Adaptive {
    caps: HashMap<(u32, ServiceId), CapState>,
    healthy: HashMap<u32, Streak>,
    /// Per device: the victim violating alone, and for how many cycles in a row.
    alone: HashMap<u32, (ServiceId, u32)>,
}

/// Whether a service's last change is old enough to count as settled: a violation before
/// that is blamed on the change (a raise is undone), after it on noise or a load change.
fn is_settled(s: &ServiceLoad, cycle: u64) -> bool {
    s.changed_cycle.is_none_or(|c| cycle >= c + SETTLED_CYCLES)
}

fn class_rank(s: &ServiceLoad) -> Option<u8> {
    match s.class {
        SloClass::BestEffort => Some(0),
        SloClass::Throughput { rate_bps } if s.bps() > rate_bps as f64 * 1.05 => Some(1),
        SloClass::Throughput { .. } => None,
        SloClass::Latency { .. } if !s.violating() => Some(2),
        SloClass::Latency { .. } => None,
    }
}

impl Adaptive {
    fn aggressor<'a>(d: &'a DeviceCycle, victim: &ServiceLoad) -> Option<&'a ServiceLoad> {
        d.services
            .iter()
            .filter(|s| s.id != victim.id && d.share(s.id) >= 0.05 && s.bps() > 0.0)
            .filter(|s| {
                // Already pinned at its floor: nothing left to take.
                s.limit.total_bps().is_none_or(|c| c > s.floor_bps())
            })
            .filter_map(|s| class_rank(s).map(|r| (r, s)))
            .min_by(|(ra, a), (rb, b)| ra.cmp(rb).then(d.share(b.id).total_cmp(&d.share(a.id))))
            .map(|(_, s)| s)
    }

    fn throttle(
        &mut self,
        d: &DeviceCycle,
        victim: &ServiceLoad,
        a: &ServiceLoad,
    ) -> Vec<Decision> {
        let cause = victim_cause(base_cause(d, a), victim);
        if self.raise_pending(d, a) {
            let why = format!(
                "the last raise broke {}'s SLO: back to the last good cap",
                victim.name
            );
            return self.undo_raise(d, a, why, cause);
        }
        let st = self.caps.entry((d.dev, a.id)).or_default();
        // Any raise before this cut is history now.
        st.before_raise = None;
        let current = a
            .limit
            .total_bps()
            .map_or(a.bps(), |c| (c as f64).min(a.bps().max(1.0)));
        // A cap that held for a while sits near the knee: a lone violation there is noise
        // or a small load change, so cut gently; a second one cuts decisively.
        let settled = a.limit.total_bps().is_some() && is_settled(a, d.cycle);
        let factor = match victim.class {
            // Squared: tail latency grows much faster than linearly near the knee,
            // and an under-cut costs two more violating cycles.
            SloClass::Latency { p999_ns } => victim
                .judged_p999()
                .map_or(0.5, |l| (p999_ns as f64 / l as f64).powi(2)),
            SloClass::Throughput { rate_bps } => {
                1.0 - (rate_bps as f64 - victim.bps()).max(0.0) / current.max(1.0)
            }
            SloClass::BestEffort => 0.5,
        }
        .clamp(0.05, 0.5);
        let factor = match (settled, victim.slo_ns(), victim.judged_p999()) {
            (true, Some(slo), Some(l)) => (slo as f64 / l as f64).clamp(GENTLE_CUT_MIN, 0.9),
            _ => factor,
        };
        st.remember_bad(current as u64, d.cycle);
        // The victim suffers from everyone else's bytes: scale that total by the
        // factor and take the whole cut from the aggressor.
        let others: f64 = d
            .services
            .iter()
            .filter(|s| s.id != victim.id)
            .map(|s| if s.id == a.id { current } else { s.bps() })
            .sum();
        let cap =
            ((others * factor - (others - current)).max(current * 0.05) as u64).max(a.floor_bps());
        let why = format!(
            "aggressor of {}: largest device share; cap at {:.0} % of its rate",
            victim.name,
            factor * 100.0
        );
        self.healthy.insert(d.dev, Streak::default());
        cap_bandwidth(a, d.dev, cap, why, cause)
    }

    /// Whether `s` was raised and the raise has not settled yet: a violation (or a near
    /// miss) now is the raise's fault.
    fn raise_pending(&self, d: &DeviceCycle, s: &ServiceLoad) -> bool {
        !is_settled(s, d.cycle)
            && self
                .caps
                .get(&(d.dev, s.id))
                .is_some_and(|st| st.before_raise.is_some())
    }

    /// Back to the cap before the last raise, remembering the raised rate as the knee.
    fn undo_raise(
        &mut self,
        d: &DeviceCycle,
        s: &ServiceLoad,
        why: String,
        cause: Cause,
    ) -> Vec<Decision> {
        let st = self.caps.entry((d.dev, s.id)).or_default();
        let Some(prev) = st.before_raise.take() else {
            return vec![];
        };
        if let Some(raised) = s.limit.total_bps() {
            st.remember_bad(raised, d.cycle);
        }
        self.healthy.insert(d.dev, Streak::default());
        cap_bandwidth(s, d.dev, prev.max(s.floor_bps()), why, cause)
    }

    /// A p99.9 close to its target right after a raise: go back to the last good cap before
    /// the raise costs a violating cycle.
    fn undo_near_miss(&mut self, d: &DeviceCycle, worst: f64) -> Vec<Decision> {
        let raised = d.services.iter().find(|s| {
            s.limit.total_bps().is_some() && s.can_change(d.cycle) && self.raise_pending(d, s)
        });
        let Some(s) = raised else {
            return vec![];
        };
        let why = format!(
            "the last raise took a p99.9 to {:.0} % of its target: back to the last good cap",
            worst * 100.0
        );
        self.undo_raise(d, s, why, base_cause(d, s))
    }

    fn relax(&mut self, d: &DeviceCycle) -> Vec<Decision> {
        let no_violation = d.services.iter().all(|s| !s.violating());
        // Worst p99.9 as a fraction of its target over the latency services.
        let worst = d
            .services
            .iter()
            .filter_map(|s| Some(s.judged_p999()? as f64 / s.slo_ns()? as f64))
            .fold(0.0, f64::max);
        let streak = self.healthy.entry(d.dev).or_default();
        if !no_violation || worst > RELAX_MARGIN {
            *streak = Streak::default();
            if no_violation && worst > NEAR_MISS {
                return self.undo_near_miss(d, worst);
            }
            return vec![];
        }
        streak.margin += 1;
        streak.roomy = if worst <= ROOMY { streak.roomy + 1 } else { 0 };
        // Far below every target, a big step after the shortest wait (the change's
        // transition and one full cycle); closer to a target, a small step after a longer
        // one, since per-cycle p99.9 on a shared disk is noisy.
        let factor = if streak.roomy >= FAST_RAISE_CYCLES {
            FAST_RAISE_FACTOR
        } else if streak.margin >= HEALTHY_CYCLES_TO_RELAX {
            RAISE_FACTOR
        } else {
            return vec![];
        };
        // One service per cycle, the most recently untouched first (lowest id as tie).
        let candidate = d
            .services
            .iter()
            .filter(|s| !s.limit.is_unlimited() && s.can_change(d.cycle))
            .min_by_key(|s| (s.changed_cycle.unwrap_or(0), s.id));
        let Some(s) = candidate else {
            return vec![];
        };
        let st = self.caps.entry((d.dev, s.id)).or_default();
        let bad = st.bad(d.cycle);
        let cause = base_cause(d, s);
        let Some(cap) = s.limit.total_bps() else {
            // An IOPS cap on a victim's own concurrency: lift it whole once healthy.
            self.healthy.insert(d.dev, Streak::default());
            return uncap(
                s,
                d.dev,
                "every SLO met: lift the concurrency cap".into(),
                cause,
            );
        };
        let mut next = (cap as f64 * factor) as u64;
        if let Some(bad) = bad {
            // Half-way to the knee, and never into the last 20 % below it: near a steep knee
            // the per-cycle p99.9 straddles the target, and a probe there costs violating
            // cycles for little bandwidth.
            let knee_margin = (bad as f64 * KNEE_HOLD) as u64;
            next = next.min(cap + bad.saturating_sub(cap) / 2).min(knee_margin);
        }
        if let Some(ceiling) = s.ceiling_bps() {
            next = next.min(ceiling);
        }
        // Not binding: it uses well under half its cap and no SLO worry is remembered.
        if bad.is_none() && s.bps() < cap as f64 * 0.5 && s.ceiling_bps().is_none() {
            st.before_raise = None;
            self.healthy.insert(d.dev, Streak::default());
            return uncap(
                s,
                d.dev,
                "every SLO met and the cap no longer binds: remove it".into(),
                cause,
            );
        }
        if next <= cap {
            return vec![]; // at the knee or the ceiling: hold
        }
        self.healthy.insert(d.dev, Streak::default());
        st.before_raise = Some(cap);
        cap_bandwidth(
            s,
            d.dev,
            next,
            format!("every SLO met with margin (worst p99.9 at {:.0} % of its target): give back bandwidth", worst * 100.0),
            cause,
        )
    }
}

impl Policy for Adaptive {
    fn name(&self) -> &'static str {
        "adaptive"
    }

    fn forget_service(&mut self, id: ServiceId) {
        self.caps.retain(|&(_, s), _| s != id);
        self.alone.retain(|_, &mut (s, _)| s != id);
    }
    fn decide(&mut self, d: &DeviceCycle) -> Vec<Decision> {
        let mut out = vec![];
        let victim = d
            .services
            .iter()
            .filter(|s| s.violating())
            .max_by(|a, b| a.vio().unwrap_or(0.0).total_cmp(&b.vio().unwrap_or(0.0)));
        let Some(victim) = victim else {
            self.alone.remove(&d.dev);
            out.extend(self.relax(d));
            return out;
        };
        self.healthy.insert(d.dev, Streak::default());
        if let Some(a) = Self::aggressor(d, victim) {
            self.alone.remove(&d.dev);
            // Going back to the last good cap is always safe: no need to wait for it.
            if a.can_change(d.cycle) || self.raise_pending(d, a) {
                out.extend(self.throttle(d, victim, a));
            }
            return out;
        }
        // Nobody else to blame: the victim's own queue depth is what hurts it, if that lasts.
        let streak = match self.alone.get(&d.dev) {
            Some(&(id, n)) if id == victim.id => n + 1,
            _ => 1,
        };
        self.alone.insert(d.dev, (victim.id, streak));
        if streak < SELF_BLAME_CYCLES {
            return out;
        }
        if let (Some(slo), Some(l)) = (victim.slo_ns(), victim.judged_p999()) {
            if victim.mean_inflight > 1.5 && victim.can_change(d.cycle) {
                let p = victim.mean_inflight;
                let next = pine_concurrency_step(p, l as f64, slo as f64);
                let cause = victim_cause(base_cause(d, victim), victim);
                out.extend(cap_concurrency(
                    victim,
                    d.dev,
                    next,
                    format!("no other service loads the device: its own concurrency {p:.1} -> {next:.1}"),
                    cause,
                ));
            }
        }
        out
    }
}
