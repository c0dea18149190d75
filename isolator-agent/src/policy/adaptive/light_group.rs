//! Light aggressors: services that each carry under the twentieth of the device a candidate
//! needs, and together hurt a victim (a host's hundred log shippers, sidecars and cron
//! jobs). One at a time none of them is ever cut: the policy-cost bench's hosts of 100-3000
//! services ran their latency services over target in half the cycles with nothing cut and
//! nothing told. So they are cut as one group (every service that owes nothing and runs
//! over its least cap; see `Adaptive::decide` for when): every member capped at the same
//! fraction (the group's factor) of the rate it ran at when it joined, the factor found by
//! the victim's decisive-cut model over the group's total, and given back as one: doubled
//! while more than four times under its knee (the factor that last broke, or past that
//! memory the members' full rates), then half-way (in log space) toward it, one probe at a
//! time on the device and on probation as a single service's raise is. Within the search's
//! precision of the full rates the group is gone and every member's limits are the ones it
//! had before it joined.

use std::collections::HashMap;

use super::{
    base_cause, cap_bandwidth, class_rank, clears_bar, least_cap_bps, share_of, victim_cause,
    Adaptive, Decision, DeviceCycle, ServiceId, ServiceLoad, SloClass, BAD_MEMORY_CYCLES,
    FAR_FROM_KNEE, KNEE_PRECISION, MAX_BAD_MEMORY_CYCLES, NOISE_WINDOW, PROBE_CYCLES, SAME_KNEE,
};
use crate::policy::{set_limit, IoMaxLimit};

/// The deepest one cut goes: a twentieth of the group's rate stays, as for one aggressor.
const MIN_CUT: f64 = 0.05;
/// The lowest factor: members keep their least caps long before, and a factor of zero
/// would make a joiner's base rate infinite.
const MIN_FACTOR: f64 = 1e-3;

/// One member of a device's light group.
#[derive(Debug, Clone)]
struct Member {
    /// Its rate when it joined (its cap's rate if capped then), bytes/s: the factor's base.
    demand_bps: f64,
    /// Its limits before it joined, restored when the group is given back whole.
    prior: IoMaxLimit,
}

/// The light aggressors cut together on one device.
#[derive(Debug, Clone, Default)]
pub(super) struct LightGroup {
    members: HashMap<ServiceId, Member>,
    /// Every member's cap as a fraction of its `demand_bps`.
    factor: f64,
    /// The cycle of the group's last change.
    changed_at: u64,
    /// While a raise is on probation: the factor to fall back to.
    before_raise: Option<f64>,
    /// The factor last seen to break an SLO, when, and for how many cycles it is trusted.
    bad: Option<(f64, u64, u64)>,
}

impl LightGroup {
    pub(super) fn contains(&self, id: ServiceId) -> bool {
        self.members.contains_key(&id)
    }
    pub(super) fn forget(&mut self, id: ServiceId) {
        self.members.remove(&id);
    }
    pub(super) fn on_probation(&self) -> bool {
        self.before_raise.is_some()
    }
    /// The first full cycle under the group's last change.
    fn window_from(&self) -> u64 {
        self.changed_at + 2
    }
    /// The factor that broke, while trusted; past that the members' full rates (a factor
    /// of one) are the knee a probe goes toward.
    fn knee(&self, cycle: u64) -> f64 {
        self.bad
            .filter(|&(_, at, trusted)| cycle < at + trusted)
            .map_or(1.0, |(f, _, _)| f)
    }
    /// `factor` broke an SLO: trusted twice as long when it is the knee found before, as
    /// a single service's knee is (see `Knee`).
    fn broke(&mut self, factor: f64, cycle: u64) {
        let trusted = match self.bad {
            Some((f, _, t)) if (factor / f).ln().abs() <= SAME_KNEE.ln_1p() => {
                (2 * t).min(MAX_BAD_MEMORY_CYCLES)
            }
            _ => BAD_MEMORY_CYCLES,
        };
        self.bad = Some((factor, cycle, trusted));
    }
    /// Ends a raise on probation that broke: back to the factor it came from, and the raised
    /// one is the knee. Returns (raised, back to).
    fn fall_back(&mut self, cycle: u64) -> Option<(f64, f64)> {
        let prev = self.before_raise.take()?;
        let raised = self.factor;
        self.broke(raised, cycle);
        self.factor = prev;
        self.changed_at = cycle;
        Some((raised, prev))
    }
    /// The decisions that cap the members at the group's factor: every member (a cut), or
    /// only those still capped (a raise or fall-back: one that went quiet had its cap
    /// lifted and keeps it so). Told as `victim`'s when there is one.
    fn decisions(
        &self,
        d: &DeviceCycle,
        every_member: bool,
        why: &str,
        victim: Option<&ServiceLoad>,
    ) -> Vec<Decision> {
        self.caps(d)
            .filter(|(s, _)| every_member || s.limit.total_bps().is_some())
            .flat_map(|(s, cap)| {
                let cause = base_cause(d, s);
                let cause = victim.map_or(cause.clone(), |v| victim_cause(cause, v));
                cap_bandwidth(s, d.dev, cap, why.to_string(), cause)
            })
            .collect()
    }
    /// Each member's cap at the group's factor, never under its least cap; none for a
    /// member that is a victim now (a throughput service short of its target).
    fn caps<'a>(&'a self, d: &'a DeviceCycle) -> impl Iterator<Item = (&'a ServiceLoad, u64)> + 'a {
        d.services.iter().filter_map(move |s| {
            let m = self.members.get(&s.id).filter(|_| !s.violating())?;
            Some((
                s,
                ((m.demand_bps * self.factor) as u64).max(least_cap_bps(s)),
            ))
        })
    }
}

/// Whether `s` may be in a light group cut for `victim`: it owes nothing (best-effort, or a
/// throughput service over its target) and runs over its least cap, with room under its
/// cap (one running under its least cap would get a cap that does not bind).
fn may_join(s: &ServiceLoad, victim: &ServiceLoad) -> bool {
    let least = least_cap_bps(s);
    s.id != victim.id
        && s.bps() > least as f64
        && class_rank(s).is_some_and(|r| r <= 1)
        && s.limit.total_bps().is_none_or(|c| c > least)
}

impl Adaptive {
    /// Whether `id` is in `dev`'s light group (its cap is the group's, not its own search's).
    pub(super) fn in_light_group(&self, dev: u32, id: ServiceId) -> bool {
        self.light.get(&dev).is_some_and(|g| g.contains(id))
    }

    /// Whether `dev`'s light group has a raise on probation.
    pub(super) fn light_probing(&self, dev: u32) -> bool {
        self.light.get(&dev).is_some_and(LightGroup::on_probation)
    }

    /// A violation while the group's raise is on probation (its transition included): the
    /// raised factor broke; back to the one that held.
    pub(super) fn light_fail_raise(
        &mut self,
        d: &DeviceCycle,
        victim: &ServiceLoad,
    ) -> Option<Vec<Decision>> {
        let g = self.light.get_mut(&d.dev)?;
        if !g.on_probation() || d.cycle <= g.changed_at {
            return None;
        }
        let (raised, prev) = g.fall_back(d.cycle)?;
        let why = format!(
            "a raise of the light group to {:.0} % of its members' rates broke {}'s SLO: back to {:.0} %",
            raised * 100.0,
            victim.name,
            prev * 100.0
        );
        Some(g.decisions(d, false, &why, Some(victim)))
    }

    /// `victim` violates and no single service clears the candidate bar: cut the light
    /// aggressors together, if together they do. None when there is no such group or all of
    /// it is at its least caps (then nobody is left to cut). Empty while the group's last
    /// change is in its transition.
    pub(super) fn light_cut(
        &mut self,
        d: &DeviceCycle,
        victim: &ServiceLoad,
    ) -> Option<Vec<Decision>> {
        let total_bps: f64 = d.services.iter().map(ServiceLoad::bps).sum();
        let total_inflight = d.total_inflight();
        let group = self.light.entry(d.dev).or_default();
        if group.members.is_empty() {
            // What an emptied group knew (its knee, its last change) is not this one's.
            *group = LightGroup::default();
        }
        let joining: Vec<&ServiceLoad> = d
            .services
            .iter()
            .filter(|s| may_join(s, victim) || (group.contains(s.id) && s.id != victim.id))
            .collect();
        let (bps, inflight) = joining
            .iter()
            .fold((0.0, 0.0), |(b, q), s| (b + s.bps(), q + s.mean_inflight));
        let roomy = joining.iter().any(|s| may_join(s, victim));
        if !roomy || !clears_bar(share_of(inflight, total_inflight), bps, total_bps) {
            if group.members.is_empty() {
                self.light.remove(&d.dev);
            }
            return None;
        }
        // Its last change still passing its old rates' queue: not yet measured.
        if !group.members.is_empty() && d.cycle < group.window_from() {
            return Some(vec![]);
        }
        // As one aggressor's decisive cut (see `decisive_cut`): the victim suffers from
        // everyone else's bytes; scale them by (SLO/L)^2 and take the whole cut from the
        // group. From no cap at least half goes.
        let fresh = group.members.is_empty();
        let others: f64 = total_bps - victim.bps();
        let k = match (victim.class, victim.judged_latency()) {
            (SloClass::Latency(t), Some(l)) => {
                let f = (t.target_ns as f64 / l as f64).powi(2);
                (bps - others * (1.0 - f)) / bps.max(1.0)
            }
            (SloClass::Throughput { rate_bps }, _) => {
                1.0 - (rate_bps as f64 - victim.bps()).max(0.0) / bps.max(1.0)
            }
            _ => 0.5,
        }
        .clamp(MIN_CUT, if fresh { 0.5 } else { 0.9 });
        if fresh {
            group.factor = 1.0;
        }
        let known = group.factor;
        for s in &joining {
            // Joining now, or back from a quiet spell with its cap lifted: the factor
            // applies to what it runs at, as if it had run under the group's caps all along.
            if group.contains(s.id) && s.limit.total_bps().is_some() {
                continue;
            }
            let prior = group.members.get(&s.id).map_or(s.limit, |m| m.prior);
            let running = s
                .limit
                .total_bps()
                .map_or(s.bps(), |c| s.bps().min(c as f64));
            group.members.insert(
                s.id,
                Member {
                    demand_bps: running / known,
                    prior,
                },
            );
        }
        // The group's rate now, cut by k, as a factor of the members' demands.
        // The factor they ran at broke the SLO (from no cap: the rates they joined at).
        group.factor = (known * k).max(MIN_FACTOR);
        group.broke(known, d.cycle);
        group.before_raise = None;
        group.changed_at = d.cycle;
        let why = format!(
            "light aggressors of {} cut as one group: {} services, {:.0} MB/s together: each capped at {:.0} % of the rate it joined at",
            victim.name,
            group.members.len(),
            bps / 1e6,
            group.factor * 100.0
        );
        Some(group.decisions(d, true, &why, Some(victim)))
    }

    /// No SLO is violated: confirm the group's raise on probation, or raise it, or give it
    /// back whole. Empty when it waits.
    pub(super) fn light_raise(&mut self, d: &DeviceCycle) -> Vec<Decision> {
        let Some(g) = self.light.get(&d.dev) else {
            return vec![];
        };
        // Every member went quiet and had its cap lifted: nothing left to give back.
        let capped = |s: &ServiceLoad| g.contains(s.id) && s.limit.total_bps().is_some();
        if !d.services.iter().any(capped) {
            self.light.remove(&d.dev);
            return vec![];
        }
        let Some(h) = self.devices.get(&d.dev) else {
            return vec![];
        };
        let from = g.window_from();
        if d.cycle + 1 < from + PROBE_CYCLES {
            return vec![];
        }
        if g.on_probation() {
            // A near miss in its window: it did not hold with the budget's margin, unless
            // the factor it was raised from ran as close (that is the device's scatter).
            let near = h.harm_since(from) && !h.held_cap_ran_as_close(g.changed_at, from);
            let g = self.light.get_mut(&d.dev).expect("looked up above");
            if !near {
                g.before_raise = None;
                return vec![];
            }
            let Some((raised, prev)) = g.fall_back(d.cycle) else {
                return vec![];
            };
            let why = format!(
                "a raise of the light group to {:.0} % of its members' rates ran a latency service close to its target: back to {:.0} %",
                raised * 100.0,
                prev * 100.0
            );
            return g.decisions(d, false, &why, None);
        }
        // Far under the knee a raise steps after a clean probe window (doubling while a
        // quarter under it, then half-way in log space); near it only after a clean budget
        // window: a change at most once in ten cycles there.
        let knee = g.knee(d.cycle);
        let room = knee / g.factor;
        let wait = if room >= FAR_FROM_KNEE {
            PROBE_CYCLES
        } else {
            NOISE_WINDOW
        };
        if d.cycle + 1 < from + wait || !h.clean_since(d.cycle + 1 - wait) {
            return vec![];
        }
        if room <= KNEE_PRECISION && knee < 1.0 {
            return vec![];
        }
        // Within the search's precision of the full rates, with nothing under them known to
        // break: the group is given back.
        if room <= KNEE_PRECISION {
            let g = self.light.remove(&d.dev).expect("looked up above");
            let why = format!(
                "every SLO held with the light group at {:.0} % of its members' rates: each gets its own limits back",
                g.factor * 100.0
            );
            return d
                .services
                .iter()
                .filter_map(|s| Some((s, g.members.get(&s.id)?)))
                .flat_map(|(s, m)| set_limit(s, d.dev, m.prior, why.clone(), base_cause(d, s)))
                .collect();
        }
        let to = if room > 4.0 {
            g.factor * 2.0
        } else {
            (g.factor * knee).sqrt()
        };
        let g = self.light.get_mut(&d.dev).expect("looked up above");
        let prev = g.factor;
        g.before_raise = Some(prev);
        g.factor = to;
        g.changed_at = d.cycle;
        let why = format!(
            "every SLO held with the light group at {:.0} % of its members' rates: probe {:.0} %{}",
            prev * 100.0,
            to * 100.0,
            if room > 4.0 {
                String::new()
            } else {
                format!(", half-way to the knee at {:.0} %", knee * 100.0)
            }
        );
        g.decisions(d, false, &why, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::sim::{SimDisk, SimService};
    use crate::policy::{Finding, Policy};

    const MB: f64 = 1e6;
    const LIGHT: usize = 100;
    const EACH_MBPS: f64 = 6.0;
    const START: u64 = 5;

    /// A QD1 reader with a 5 ms target, then `readers - 1` more, next to `n` best-effort
    /// writers of `each_mbps` each from cycle `start` (the reader's p99.9 rises past its
    /// target at ~445 MB/s of others' traffic).
    fn light_writers(readers: usize, n: usize, each_mbps: f64, start: u64) -> SimDisk {
        let name = |kind: &str, i: usize| -> &'static str {
            Box::leak(format!("{kind}-{i}").into_boxed_str())
        };
        let mut v: Vec<SimService> = (0..readers)
            .map(|i| SimService::latency(name("db", i), 5.0, 1.0))
            .collect();
        for i in 0..n {
            v.push(SimService::writer(
                name("sidecar", i),
                SloClass::BestEffort,
                each_mbps,
                start,
            ));
        }
        let mut disk = SimDisk::new(v);
        disk.noise_seed = Some(3);
        disk
    }

    fn others_mbps(c: &DeviceCycle) -> f64 {
        c.services
            .iter()
            .filter(|s| s.slo_ns().is_none())
            .map(ServiceLoad::bps)
            .sum::<f64>()
            / MB
    }

    fn violating(c: &DeviceCycle) -> bool {
        c.services.iter().any(ServiceLoad::violating)
    }

    /// The highest static cap (MB/s, 0.1 MB/s steps) on every light writer under which the
    /// readers violate in at most one cycle in ten from `from` on over `cycles`, and the
    /// writers' mean total under it: the best static cap as the benchmark judges it.
    fn best_static_total_mbps(
        make: &dyn Fn() -> SimDisk,
        each_mbps: f64,
        from: u64,
        cycles: u64,
    ) -> f64 {
        let mut best = 0.0;
        for tenth in 10..(each_mbps * 10.0) as u64 {
            let mut d = make();
            for s in d.services.iter_mut().filter(|s| s.demand_bps > 0.0) {
                s.limit.wbps = Some(tenth * 100_000);
            }
            let (mut violations, mut total, mut n) = (0, 0.0, 0.0);
            for _ in 0..cycles {
                let c = d.step();
                if c.cycle >= from {
                    violations += usize::from(violating(&c));
                    total += others_mbps(&c);
                    n += 1.0;
                }
                d.apply(&[]);
            }
            if violations * 10 > n as usize {
                break;
            }
            best = total / n;
        }
        best
    }

    #[test]
    fn light_aggressors_none_of_which_clears_the_bar_are_cut_together_near_their_knee() {
        let make = || light_writers(1, LIGHT, EACH_MBPS, START);
        let mut disk = make();
        let mut p = Adaptive::default();
        let h = disk.run(&mut p, 200);
        let arrival = &h[START as usize].0;
        assert!(
            arrival.services[1..]
                .iter()
                .all(|s| arrival.share(s.id) < 0.05 && s.bps() < 0.05 * others_mbps(arrival) * MB),
            "a writer cleared the candidate bar alone: the test is not about light aggressors"
        );
        assert!(
            violating(arrival),
            "{LIGHT} writers at {EACH_MBPS} MB/s broke no SLO"
        );
        // Cut at once, as one aggressor is: every writer capped in the arrival's cycle.
        assert_eq!(
            h[START as usize]
                .1
                .iter()
                .filter(|d| d.to.is_some())
                .count(),
            LIGHT,
            "{:?}",
            h[START as usize].1.first()
        );
        let back = h
            .iter()
            .position(|(c, _)| c.cycle > START && !violating(c))
            .unwrap() as u64;
        assert!(back < START + 3, "the SLO came back at cycle {back}");
        // The steady phase: at most one violating cycle and one change in ten, and at
        // least 90 % of the best static cap's throughput.
        let steady = &h[20..];
        let violations = steady.iter().filter(|(c, _)| violating(c)).count();
        let changes = steady.iter().filter(|(_, d)| !d.is_empty()).count();
        assert!(
            violations * 10 <= steady.len(),
            "{violations} violating cycles"
        );
        assert!(
            changes * 10 <= steady.len(),
            "{changes} cycles with changes"
        );
        let mean = steady.iter().map(|(c, _)| others_mbps(c)).sum::<f64>() / steady.len() as f64;
        let best = best_static_total_mbps(&make, EACH_MBPS, 20, 200);
        assert!(
            mean >= 0.9 * best,
            "the writers got {mean:.0} MB/s, under 90 % of the best static caps' {best:.0}"
        );
    }

    #[test]
    fn a_light_group_that_goes_quiet_has_every_cap_lifted_within_five_cycles() {
        let mut disk = light_writers(1, LIGHT, EACH_MBPS, START);
        for s in disk.services.iter_mut().skip(1) {
            s.on_off = Some((40, 30));
        }
        let mut p = Adaptive::default();
        let h = disk.run(&mut p, START + 40 + 10);
        let quiet = START + 40;
        assert!(
            h[quiet as usize - 1].0.services[1..]
                .iter()
                .any(|s| s.limit.total_bps().is_some()),
            "nothing was capped while the writers ran"
        );
        let lifted = &h[quiet as usize + 5].0;
        assert!(
            lifted
                .services
                .iter()
                .all(|s| s.limit == IoMaxLimit::default()),
            "caps left 5 cycles after the writers went quiet: {:?}",
            lifted
                .services
                .iter()
                .find(|s| s.limit != IoMaxLimit::default())
        );
    }

    #[test]
    fn a_light_group_is_cut_again_when_the_disk_slows_and_holds_the_slo_after() {
        let mut disk = light_writers(1, LIGHT, EACH_MBPS, START);
        let mut p = Adaptive::default();
        let mut h = disk.run(&mut p, 100);
        let before = h[60..].iter().map(|(c, _)| others_mbps(c)).sum::<f64>() / 40.0;
        disk.knee_scale = 0.6;
        h.extend(disk.run(&mut p, 150));
        assert!(violating(&h[100].0), "the slower disk broke no SLO");
        let back = h[100..].iter().position(|(c, _)| !violating(c)).unwrap();
        assert!(
            back <= 3,
            "the SLO came back {back} cycles after the disk slowed"
        );
        let steady = &h[120..];
        let violations = steady.iter().filter(|(c, _)| violating(c)).count();
        assert!(
            violations * 10 <= steady.len(),
            "{violations} violating cycles"
        );
        let after = steady.iter().map(|(c, _)| others_mbps(c)).sum::<f64>() / steady.len() as f64;
        // The knee moved to 0.6 of where it was: the group found it, not the floor.
        assert!(
            after >= 0.5 * before && after < before,
            "{before:.0} MB/s before the disk slowed, {after:.0} after"
        );
    }

    #[test]
    fn light_aggressors_under_the_least_cap_are_told_infeasible_whichever_reader_is_worst() {
        // 600 writers at 0.9 MB/s, each under the 1 MiB/s least cap the policy sets, and ten
        // readers taking turns as the worst: no cap would bind, so none is set, and the
        // readers are told after SELF_BLAME_CYCLES violating cycles, not when one of them
        // happens to be the worst that many cycles in a row.
        let mut disk = light_writers(10, 600, 0.9, START);
        let mut p = Adaptive::default();
        let mut told = vec![];
        let mut worst = vec![];
        for _ in 0..START + 10 {
            let c = disk.step();
            let d = p.decide(&c);
            assert!(d.is_empty(), "a cap that does not bind: {:?}", d.first());
            disk.apply(&d);
            worst.extend(
                c.services
                    .iter()
                    .filter(|s| s.violating())
                    .max_by_key(|s| s.judged_latency())
                    .map(|s| s.id),
            );
            told.extend(p.findings().into_iter().filter_map(|f| match f {
                Finding::SloInfeasible {
                    service, reason, ..
                } => Some((c.cycle, service, reason)),
                _ => None,
            }));
        }
        // Where a streak of one reader would not reach 3 (the old count, which told nothing).
        let mut first = worst[..3].to_vec();
        first.sort();
        first.dedup();
        assert!(
            first.len() >= 2,
            "one reader was the worst from the start: {worst:?}"
        );
        assert_eq!(
            told.first().map(|t| t.0),
            Some(START + u64::from(super::super::SELF_BLAME_CYCLES) - 1),
            "{told:?}"
        );
        assert!(told.iter().all(|t| t.2.contains("least cap")), "{told:?}");
        let mut services: Vec<_> = told.iter().map(|t| t.1).collect();
        services.sort();
        services.dedup();
        assert_eq!(services.len(), told.len(), "a reader told twice: {told:?}");
    }

    #[test]
    fn a_reader_within_its_slo_is_cut_only_after_the_light_group() {
        // Two readers (the sim times the wait in a cap: a reader within its SLO may be
        // cut, as the last resort) hold most of the device's time next to 100 light
        // writers: the group goes first.
        let mut disk = light_writers(2, LIGHT, EACH_MBPS, START);
        disk.services[1].class = SloClass::latency_p999(50_000_000);
        let mut p = Adaptive::default();
        let h = disk.run(&mut p, 60);
        assert!(violating(&h[START as usize].0));
        let readers_capped: Vec<_> = h
            .iter()
            .flat_map(|(_, ds)| ds.iter())
            .filter(|d| d.service < 2 && d.to.is_some())
            .collect();
        assert!(readers_capped.is_empty(), "{:?}", readers_capped.first());
        let back = h[START as usize..]
            .iter()
            .position(|(c, _)| !violating(c))
            .unwrap();
        assert!(
            back <= 2,
            "the SLO came back {back} cycles after the writers came"
        );
    }
}
