//! From the policy's decisions to what each of a service's cgroups gets: a limit split over
//! them (never below the per-cgroup minimum, which the decision then says), written through
//! the enforcer, the service's recorded limit kept to what was written, and each lasting
//! error said once.

use std::collections::HashSet;

use super::{membership::Target, report, DevState};
use crate::{
    enforcer::{EnforceError, Enforcer, Setting},
    events::Event,
    policy::{Decision, DeviceCycle, IoMaxLimit, Knob, ServiceId, MIN_CAP_BPS, MIN_CAP_IOPS},
};

/// A service's limit split evenly over its cgroups, never below the per-cgroup minimum
/// (1 MiB/s, 10 IOPS): a throttled cgroup must still make progress, even when that puts the
/// service's sum above its limit, which the decision then says.
pub(super) struct SplitLimit {
    pub per_cgroup: Option<u64>,
    pub note: Option<String>,
}

pub(super) fn split_limit(knob: Knob, to: Option<u64>, cgroups: usize) -> SplitLimit {
    let Some(total) = to else {
        return SplitLimit {
            per_cgroup: None,
            note: None,
        };
    };
    let n = cgroups.max(1) as u64;
    let (min, unit) = match knob {
        Knob::Rbps | Knob::Wbps => (MIN_CAP_BPS, "B/s"),
        Knob::Riops | Knob::Wiops => (MIN_CAP_IOPS, "IOPS"),
    };
    let even = total / n;
    if even >= min {
        return SplitLimit {
            per_cgroup: Some(even),
            note: None,
        };
    }
    SplitLimit {
        per_cgroup: Some(min),
        note: Some(format!(
            "split over {n} cgroups at the minimum of {min} {unit} each ({} {unit} in all, above the {total} {unit} decided)",
            min * n
        )),
    }
}

/// The enforcer, and the errors it reported that were already said.
pub(super) struct Enforcement {
    enforcer: Enforcer,
    said: HashSet<String>,
}

impl Enforcement {
    pub fn new(enforcer: Enforcer) -> Enforcement {
        Enforcement {
            enforcer,
            said: HashSet::new(),
        }
    }

    pub fn enforcer(&self) -> &Enforcer {
        &self.enforcer
    }

    /// Carries out one decision on `d`'s device on a service's cgroups; `state` is the
    /// service's there. Returns the decision's event first, then its errors.
    pub fn limit(
        &mut self,
        d: &DeviceCycle,
        policy: &str,
        service: &str,
        targets: &[Target],
        state: &mut DevState,
        dec: Decision,
    ) -> Vec<Event> {
        if targets.is_empty() {
            return self.no_targets(service);
        }
        let old = state.limit.get(dec.knob);
        let knob = dec.knob;
        let to = dec.to;
        let (events, ok) = self.write(d.cycle, policy, service, targets, old, dec);
        // The recorded limit follows a decision its cgroups took (a knob someone else took
        // aside): after a rejected write it stays what they still hold.
        if ok {
            state.limit.set(knob, to);
        }
        state.changed_cycle = Some(d.cycle);
        events
    }

    /// Writes the limits a service holds on `dev` again over its cgroups, after some joined
    /// or left it: each cgroup's share changes with their number, and one that joined holds
    /// nothing yet. Not a decision of the policy's: the service's limit as a whole is the
    /// same, and its cycle of last change stays. Its events say `membership` for the
    /// policy and carry no `decided` (replay compares the policy's decisions only).
    pub fn respread(
        &mut self,
        cycle: u64,
        (sid, service): (ServiceId, &str),
        targets: &[Target],
        (dev, limit): (u32, IoMaxLimit),
    ) -> Vec<Event> {
        if targets.is_empty() {
            return self.no_targets(service);
        }
        let mut events = vec![];
        for knob in Knob::ALL {
            let Some(total) = limit.get(knob) else {
                continue;
            };
            let dec = Decision {
                service: sid,
                dev,
                knob,
                to: Some(total),
                reason: format!(
                    "the service's cgroups changed: its limit spread again over the {} it has now",
                    targets.len()
                ),
                cause: Default::default(),
            };
            // A cgroup that refuses it is an error event; the others hold their share, so
            // the service's record stays, and the policy's next decision writes it again.
            let (mut ev, _) = self.write(cycle, "membership", service, targets, Some(total), dec);
            if let Some(Event::Decision(d)) = ev.first_mut() {
                d.decided = None;
                d.cause = None;
            }
            events.extend(ev);
        }
        events
    }

    /// A service without a cgroup to write on: said once.
    fn no_targets(&mut self, service: &str) -> Vec<Event> {
        if self.said.insert(format!("notargets:{service}")) {
            return vec![report::no_cgroup(service)];
        }
        vec![]
    }

    /// Writes one limit over a service's cgroups (`old` is the service's limit before).
    /// Returns the decision's event first, then its errors, and whether every cgroup took
    /// it.
    fn write(
        &mut self,
        cycle: u64,
        policy: &str,
        service: &str,
        targets: &[Target],
        old: Option<u64>,
        dec: Decision,
    ) -> (Vec<Event>, bool) {
        let dev = &crate::identify::disks::dev_text(dec.dev);
        let cgroups: Vec<String> = targets.iter().map(|t| t.path.clone()).collect();
        let split = split_limit(dec.knob, dec.to, cgroups.len());
        let results = self.enforcer.apply_all(
            &cgroups,
            Setting::Limit {
                dev: dec.dev,
                knob: dec.knob,
                value: split.per_cgroup,
            },
        );
        let mut errors = vec![];
        let mut ok = true;
        let mut old_text = None;
        let mut new_text = None;
        for (cg, r) in cgroups.iter().zip(results) {
            match r {
                Ok(c) => {
                    old_text.get_or_insert(c.old);
                    new_text.get_or_insert(c.new);
                }
                // Someone else's knob now: said once, and not a failed decision (the
                // policy would decide it again every cycle).
                Err(EnforceError::ChangedByOther { .. })
                    if !self
                        .said
                        .insert(format!("other:{cg}:{dev}:{}", dec.knob.name())) => {}
                Err(e) => {
                    ok &= matches!(e, EnforceError::ChangedByOther { .. });
                    errors.push(report::limit_failed(service, cg, dev, &dec, &e));
                }
            }
        }
        let mut reason = dec.reason.clone();
        if let Some(note) = split.note {
            reason = format!("{reason}; {note}");
        }
        let text = |v: Option<u64>| v.map_or("max".to_string(), |v| v.to_string());
        let outcome = report::LimitOutcome {
            cgroups,
            old: old_text.unwrap_or_else(|| text(old)),
            new: new_text.unwrap_or_else(|| text(dec.to)),
            applied: ok && !self.enforcer.dry_run,
            reason,
        };
        let mut events = vec![report::limit_decision(
            cycle, policy, service, dev, dec, outcome,
        )];
        events.extend(errors);
        (events, ok)
    }

    /// Writes a configured weight on each of a service's cgroups.
    pub fn weight(
        &mut self,
        cycle: u64,
        service: &str,
        targets: &[Target],
        weight: u32,
    ) -> Vec<Event> {
        // blkio.bfq.weight stops at 1000; io.weight goes to 10000.
        let weight = if self.enforcer.mode() == crate::identify::cgroupfs::CgroupMode::V1 {
            weight.min(1000)
        } else {
            weight
        };
        let applied = !self.enforcer.dry_run;
        targets
            .iter()
            .map(
                |t| match self.enforcer.apply(&t.path, Setting::Weight(weight)) {
                    Ok(c) => {
                        report::weight_decision(cycle, service, &t.path, c.old, c.new, applied)
                    }
                    Err(e) => report::weight_rejected(service, &t.path, &e),
                },
            )
            .collect()
    }

    /// Enables iocost on a disk (the root cgroup's io.cost.qos), as the config asks.
    pub fn iocost(&mut self, cycle: u64, dev: u32) -> Vec<Event> {
        let applied = !self.enforcer.dry_run;
        vec![match self.enforcer.apply("/", Setting::IocostOn { dev }) {
            Ok(c) => report::iocost_decision(cycle, dev, c.old, c.new, applied),
            Err(e) => report::iocost_rejected(dev, &e),
        }]
    }

    /// Cgroups (by inode) that left their service: their knobs are put back where they
    /// still exist, and their journal entries closed where they do not.
    pub fn release(&mut self, cgroup_inos: &[u64]) -> Vec<Event> {
        if cgroup_inos.is_empty() {
            return vec![];
        }
        self.enforcer
            .release(cgroup_inos)
            .into_iter()
            .map(|r| Event::restore("released", r))
            .collect()
    }

    /// Puts back every knob this agent changed; one event per knob.
    pub fn restore_all(&mut self, reason: &str) -> Vec<Event> {
        self.enforcer
            .restore_all()
            .into_iter()
            .map(|r| Event::restore(reason, r))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_split_limit_never_goes_below_the_minimum_per_cgroup() {
        // 10 MB/s over 20 cgroups would be 500 kB/s each.
        let s = split_limit(Knob::Wbps, Some(10_000_000), 20);
        assert_eq!(s.per_cgroup, Some(MIN_CAP_BPS));
        let note = s.note.unwrap();
        assert!(
            note.contains("20 cgroups") && note.contains("minimum"),
            "{note}"
        );
        let s = split_limit(Knob::Riops, Some(100), 20);
        assert_eq!(s.per_cgroup, Some(MIN_CAP_IOPS));
        // An even split above the minimum is exact, and unlimited stays unlimited.
        let s = split_limit(Knob::Rbps, Some(100 << 20), 4);
        assert_eq!((s.per_cgroup, s.note), (Some(25 << 20), None));
        assert_eq!(split_limit(Knob::Rbps, None, 4).per_cgroup, None);
    }
}
