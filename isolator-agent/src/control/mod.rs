//! Decide, plan and enforce: which cgroups are whose (`membership`), the policy's input
//! from the measure stage's per-service sums (`policy_input`), what the policy decides on
//! it (pure), and what is written where (`plan`, through the enforcer); `report` builds
//! the events that say why.

mod membership;
mod plan;
mod policy_input;
mod report;

use std::collections::HashMap;

use self::{membership::Membership, plan::Enforcement};
use crate::{
    collect::collector::Snapshot,
    config::Config,
    enforcer::Enforcer,
    events::Event,
    identify::cgroupfs::IoHierarchy,
    identify::containers::ContainerTable,
    measure::character::CharacterWindows,
    policy::{DeviceCycle, IoMaxLimit, Policy, ServiceId},
};

/// What the controller remembers of a service on a device.
#[derive(Debug, Default, Clone)]
struct DevState {
    /// The service's limit as a whole, as last decided and taken by its cgroups: a write
    /// they rejected leaves the one before.
    limit: IoMaxLimit,
    /// The cycle of the last decision on it, taken or not.
    changed_cycle: Option<u64>,
    violating: bool,
}

/// By (service, device).
type ServiceStates = HashMap<(ServiceId, u32), DevState>;

pub struct Controller {
    membership: Membership,
    policy: Box<dyn Policy>,
    enforcement: Enforcement,
    states: ServiceStates,
    /// Services the policy forgot since the last policy input was recorded.
    forgotten: Vec<ServiceId>,
    /// Character windows of every (service, disk).
    characters: CharacterWindows<ServiceId>,
    /// The probe times the wait I/O limits impose (kernel_features).
    throttle_wait_timed: bool,
}

impl Controller {
    pub fn new(config: Config, policy: Box<dyn Policy>, enforcer: Enforcer) -> Controller {
        Controller {
            membership: Membership::new(config),
            policy,
            enforcement: Enforcement::new(enforcer),
            states: HashMap::new(),
            forgotten: Vec::new(),
            characters: CharacterWindows::default(),
            throttle_wait_timed: true,
        }
    }

    /// Enables iocost on the `[iocost]` disks (as [`crate::config::Config::iocost_devices`]
    /// found them on this host), once, at start, before the weights, which act only where
    /// it is on; put back with every other knob at stop.
    pub fn apply_iocost(&mut self, cycle: u64, devs: &[u32]) -> Vec<Event> {
        devs.iter()
            .flat_map(|&dev| self.enforcement.iocost(cycle, dev))
            .collect()
    }

    /// Whether the services' latencies include the wait their I/O limits impose, as the
    /// probe found (`KernelFeatures::throttle_wait_timed`); the policy sees it in every
    /// device cycle.
    pub fn set_throttle_wait_timed(&mut self, timed: bool) {
        self.throttle_wait_timed = timed;
    }

    pub fn policy_name(&self) -> &'static str {
        self.policy.name()
    }

    /// Follows the cgroups that exist (`all_paths`, a fresh walk) and what Docker says of
    /// containers: label services come and go, each service's targets are re-matched, and a
    /// service whose cgroups left it, vanished or were re-created starts over (its journal
    /// entries for vanished cgroups are closed: nothing is left to restore there).
    pub fn refresh(
        &mut self,
        hierarchy: &IoHierarchy,
        all_paths: &[String],
        containers: &ContainerTable,
        cycle: u64,
    ) -> Vec<Event> {
        let files = self.enforcement.enforcer().files();
        let ino = |p: &str| files.inode(&hierarchy.dir_of(p)).unwrap_or(0);
        let rematch = self.membership.rematch(all_paths, containers, &ino);
        let mut events = rematch.events;
        // Whatever left a service gets its knobs back where it still exists (renamed away,
        // no longer matched), and its journal entries closed where it does not: all in one
        // pass over the journal, however many cgroups went at once.
        events.extend(self.enforcement.release(&rematch.released));
        for sid in rematch.restarted {
            self.states.retain(|&(s, _), _| s != sid);
            self.policy.forget_service(sid);
            self.forgotten.push(sid);
        }
        // Weights of label services that just appeared (config ones are set at start).
        for sid in rematch.new_label_services {
            events.extend(self.apply_weight(sid, cycle));
        }
        for (sid, joined) in rematch.regrouped {
            events.extend(self.regroup(sid, &joined, cycle));
        }
        events
    }

    /// A service that kept some of its cgroups and gained or lost others: the limits it
    /// holds are spread over its cgroups now, and its weight goes on those that joined.
    fn regroup(&mut self, sid: ServiceId, joined: &[membership::Target], cycle: u64) -> Vec<Event> {
        let Some(spec) = self.membership.spec(sid) else {
            return vec![];
        };
        let mut events = match spec.weight {
            Some(w) if !joined.is_empty() => self.enforcement.weight(cycle, &spec.name, joined, w),
            _ => vec![],
        };
        let mut held: Vec<(u32, IoMaxLimit)> = self
            .states
            .iter()
            .filter(|(&(s, _), st)| s == sid && !st.limit.is_unlimited())
            .map(|(&(_, dev), st)| (dev, st.limit))
            .collect();
        held.sort_unstable_by_key(|&(dev, _)| dev);
        for held in held {
            events.extend(self.enforcement.respread(
                cycle,
                (sid, &spec.name),
                self.membership.targets(sid),
                held,
            ));
        }
        events
    }

    /// Writes configured weights once, at start.
    pub fn apply_weights(&mut self, cycle: u64) -> Vec<Event> {
        self.membership
            .config_services()
            .flat_map(|sid| self.apply_weight(sid, cycle))
            .collect()
    }

    fn apply_weight(&mut self, sid: ServiceId, cycle: u64) -> Vec<Event> {
        let Some(s) = self.membership.spec(sid) else {
            return vec![];
        };
        let Some(w) = s.weight else {
            return vec![];
        };
        self.enforcement
            .weight(cycle, &s.name, self.membership.targets(sid), w)
    }

    /// Per (service, device) stats of this cycle; `utilization` gives a disk's busy
    /// fraction over the cycle.
    pub fn device_cycles(
        &mut self,
        snap: &Snapshot,
        path_of: &dyn Fn(u64) -> Option<String>,
        containers: &ContainerTable,
        utilization: &dyn Fn(u32) -> f64,
    ) -> Vec<DeviceCycle> {
        let membership = &mut self.membership;
        let remembered = self.states.keys().copied().collect();
        let io = crate::measure::services::aggregate(
            snap,
            &mut |id| membership.service_of(id, path_of(id).as_deref(), containers),
            &remembered,
        );
        policy_input::device_cycles(
            snap,
            io,
            &self.membership,
            &self.states,
            utilization,
            self.throttle_wait_timed,
        )
    }

    /// The policy's whole input this cycle, for the record (`policy_input`): what it
    /// forgot since the last record, and the device cycles.
    pub fn policy_input(&mut self, cycle: u64, devices: &[DeviceCycle]) -> Option<Event> {
        if devices.is_empty() && self.forgotten.is_empty() {
            return None;
        }
        let mut forgotten = std::mem::take(&mut self.forgotten);
        forgotten.sort_unstable();
        let untargeted: std::collections::BTreeSet<ServiceId> = devices
            .iter()
            .flat_map(|d| &d.services)
            .map(|s| s.id)
            .filter(|&sid| self.membership.targets(sid).is_empty())
            .collect();
        Some(Event::PolicyInput(crate::events::PolicyInput {
            cycle,
            forgotten_services: forgotten,
            untargeted_services: untargeted.into_iter().collect(),
            devices: devices.to_vec(),
        }))
    }

    /// Runs the policy on each device and enforces its decisions; returns the events.
    pub fn step(
        &mut self,
        cycles: &[DeviceCycle],
        disk_name: &mut dyn FnMut(u32) -> Option<String>,
    ) -> Vec<Event> {
        let mut events = vec![];
        for d in cycles {
            let dev = crate::identify::disks::dev_text(d.dev);
            for s in &d.services {
                let (character, change) = self.characters.push(&s.id, d.dev, d.cycle, s.character);
                if let (Some(change), Some(c)) = (change, &character) {
                    events.push(report::character_change(
                        d,
                        s,
                        &dev,
                        disk_name(d.dev),
                        change,
                        c.clone(),
                    ));
                }
                events.push(report::service_stats(
                    d,
                    s,
                    &dev,
                    disk_name(d.dev),
                    character,
                ));
                let st = self.states.entry((s.id, d.dev)).or_default();
                let now = s.violating();
                if now != st.violating {
                    st.violating = now;
                    events.push(report::violation(d, s, &dev, now));
                }
                // Nothing to remember for an idle service the agent never limited.
                if st.changed_cycle.is_none() && s.samples == 0 && s.bps() == 0.0 {
                    self.states.remove(&(s.id, d.dev));
                }
            }
            let mut decisions = crate::policy::ceilings(d);
            decisions.extend(self.policy.decide(d));
            for f in self.policy.findings() {
                let name = self
                    .membership
                    .spec(f.service())
                    .map_or_else(|| format!("#{}", f.service()), |s| s.name.clone());
                events.push(report::finding(self.policy.name(), name, f));
            }
            for dec in decisions {
                let Some(spec) = self.membership.spec(dec.service) else {
                    continue;
                };
                let state = self.states.entry((dec.service, d.dev)).or_default();
                events.extend(self.enforcement.limit(
                    d,
                    self.policy.name(),
                    &spec.name,
                    self.membership.targets(dec.service),
                    state,
                    dec,
                ));
            }
        }
        events
    }

    /// Puts back every knob this agent changed; one event per knob.
    pub fn restore_all(&mut self, reason: &str) -> Vec<Event> {
        self.enforcement.restore_all(reason)
    }
}

#[cfg(test)]
mod tests;
