//! The control stage: cgroups -> services (config matchers), per-service per-device cycle
//! stats (the policy input), the policy, the enforcer, and the events that say why.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    os::unix::fs::MetadataExt,
};

use isolator_common::{dev_major, dev_minor, OP_READ, OP_WRITE};
use serde::Serialize;

use crate::{
    cgroupfs::IoHierarchy,
    collector::Snapshot,
    config::{Config, Matcher, Owner, ServiceSpec, SloClass},
    docker::ContainerTable,
    enforcer::{EnforceError, Enforcer, Setting},
    events::Event,
    events::LabelSloInfo,
    labels,
    metrics::{percentile, HistSum},
    naming::ServiceKind,
    policy::{DeviceCycle, IoMaxLimit, Policy, ServiceId, ServiceLoad},
};

/// The SLO a service event carries.
#[derive(Debug, Clone, Serialize)]
pub struct SloRef {
    pub class: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p999_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_bps: Option<u64>,
}

impl SloRef {
    /// `latency p99.9 <= 20ms`, for messages.
    pub fn describe(&self) -> String {
        match (self.p999_ns, self.rate_bps) {
            (Some(ns), _) => format!("{} p99.9 <= {:.3}ms", self.class, ns as f64 / 1e6),
            (_, Some(bps)) => format!("{} rate >= {:.1}MB/s", self.class, bps as f64 / 1e6),
            _ => self.class.to_string(),
        }
    }
}

impl From<SloClass> for SloRef {
    fn from(c: SloClass) -> Self {
        SloRef {
            class: c.name(),
            p999_ns: match c {
                SloClass::Latency { p999_ns } => Some(p999_ns),
                _ => None,
            },
            rate_bps: match c {
                SloClass::Throughput { rate_bps } => Some(rate_bps),
                _ => None,
            },
        }
    }
}

/// A cgroup directory a service's limits go on, with its inode: a container that restarts
/// gets a new cgroup at the same path, which carries none of the old limits.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    path: String,
    ino: u64,
}

/// Which service each cgroup belongs to, and which cgroups carry a service's limits.
struct Membership {
    /// cgroup id -> service (None: unconfigured), cached per id.
    of_cgroup: HashMap<u64, Option<ServiceId>>,
    /// service -> the cgroup directories its matchers take (where limits are written).
    targets: HashMap<ServiceId, Vec<Target>>,
}

/// A `label_slo` event; its service and SLO come from `service`.
fn label_event(
    outcome: &str,
    container: &str,
    container_id: &str,
    service: Option<&ServiceSpec>,
    label: Option<String>,
    message: String,
) -> Event {
    Event::LabelSlo(LabelSloInfo {
        outcome: outcome.into(),
        container: container.into(),
        container_id: container_id.into(),
        service: service.map(|s| s.name.clone()),
        slo: service.map(|s| s.class.into()),
        label,
        message,
    })
}

/// A service declared by a container's `isolator.*` labels.
struct LabelService {
    container_id: String,
    spec: ServiceSpec,
}

#[derive(Default, Clone)]
struct DevState {
    limit: IoMaxLimit,
    changed_cycle: Option<u64>,
    violating: bool,
}

pub struct Controller {
    /// Services of the config file, ids 0..n.
    config: Config,
    /// Services declared by container labels, ids from n on, never reused.
    labelled: BTreeMap<ServiceId, LabelService>,
    next_label_id: ServiceId,
    policy: Box<dyn Policy>,
    enforcer: Enforcer,
    membership: Membership,
    state: HashMap<(ServiceId, u32), DevState>,
    /// Errors already reported, so a persistent one is said once.
    reported: HashSet<String>,
}

impl Controller {
    pub fn new(config: Config, policy: Box<dyn Policy>, enforcer: Enforcer) -> Controller {
        Controller {
            next_label_id: config.services.len(),
            config,
            labelled: BTreeMap::new(),
            policy,
            enforcer,
            membership: Membership {
                of_cgroup: HashMap::new(),
                targets: HashMap::new(),
            },
            state: HashMap::new(),
            reported: HashSet::new(),
        }
    }

    pub fn policy_name(&self) -> &'static str {
        self.policy.name()
    }

    fn spec(&self, sid: ServiceId) -> Option<&ServiceSpec> {
        self.config
            .services
            .get(sid)
            .or_else(|| Some(&self.labelled.get(&sid)?.spec))
    }

    /// Every service, config first (its services win a cgroup over labels).
    fn specs(&self) -> impl Iterator<Item = (ServiceId, &ServiceSpec)> {
        self.config
            .services
            .iter()
            .enumerate()
            .chain(self.labelled.iter().map(|(&id, l)| (id, &l.spec)))
    }

    /// A cgroup belongs to the service that matches it or its nearest ancestor.
    fn service_of_path(&self, path: &str, containers: &ContainerTable) -> Option<ServiceId> {
        let mut p = path.to_string();
        loop {
            if let Some((sid, _)) = self.specs().find(|(_, s)| s.matches(&p, containers)) {
                return Some(sid);
            }
            match p.rfind('/') {
                Some(0) | None => return None,
                Some(i) => p.truncate(i),
            }
        }
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
        // Each cgroup is named once, then matched against every service.
        let owners: Vec<Owner> = all_paths.iter().map(|p| Owner::of(p, containers)).collect();
        let mut events = self.sync_label_services(&owners, containers);
        let ino = |p: &str| {
            std::fs::metadata(hierarchy.dir_of(p))
                .map(|m| m.ino())
                .unwrap_or(0)
        };
        let new_targets: HashMap<ServiceId, Vec<Target>> = self
            .specs()
            .map(|(sid, s)| {
                let t = owners
                    .iter()
                    .filter(|o| s.matches_owner(o))
                    .map(|o| Target {
                        path: o.path.to_string(),
                        ino: ino(o.path),
                    })
                    .collect();
                (sid, t)
            })
            .collect();
        let mut restart = vec![];
        let mut released = vec![];
        for (sid, old) in &self.membership.targets {
            let new = new_targets.get(sid);
            // A cgroup renamed within the service (same inode) is not lost.
            let lost: Vec<&Target> = old
                .iter()
                .filter(|t| new.is_none_or(|n| !n.iter().any(|n| n.ino == t.ino)))
                .collect();
            // A service that is gone (a label service let go) starts over too.
            if lost.is_empty() && new.is_some() {
                continue;
            }
            released.extend(lost.iter().map(|t| t.ino));
            restart.push(*sid);
        }
        // Whatever left a service gets its knobs back where it still exists (renamed away,
        // no longer matched), and its journal entries closed where it does not: all in one
        // pass over the journal, however many cgroups went at once.
        if !released.is_empty() {
            for r in self.enforcer.release(&released) {
                events.push(Event::restore("released", r));
            }
        }
        for sid in restart {
            self.state.retain(|&(s, _), _| s != sid);
            self.policy.forget_service(sid);
        }
        let added: Vec<ServiceId> = new_targets
            .keys()
            .filter(|sid| !self.membership.targets.contains_key(sid))
            .copied()
            .collect();
        self.membership.targets = new_targets;
        self.membership.of_cgroup.clear();
        // Weights of label services that just appeared (config ones are set at start).
        for sid in added {
            if sid >= self.config.services.len() {
                events.extend(self.apply_weight(sid, cycle));
            }
        }
        events
    }

    /// Adds a service per labelled running container, unless the config claims its cgroup
    /// (the config wins, and says so); drops those whose container stopped or lost its
    /// labels (their state goes in [`Controller::refresh`], with their targets). Every
    /// outcome is an event, said once.
    fn sync_label_services(&mut self, owners: &[Owner], containers: &ContainerTable) -> Vec<Event> {
        let mut events = vec![];
        // Containers with a cgroup now.
        let running: HashMap<&str, &Owner> = owners
            .iter()
            .filter(|o| o.named.kind == ServiceKind::Container)
            .filter_map(|o| Some((o.named.id.as_deref()?, o)))
            .collect();
        let mut wanted: HashMap<&str, ServiceSpec> = HashMap::new();
        for c in containers.iter() {
            let labels = match labels::slo_from_labels(&c.labels, &self.config.labels) {
                Ok(Some(slo)) => slo,
                Ok(None) => continue,
                Err(e) => {
                    let label = format!("{}={}", e.label, e.value);
                    if self.reported.insert(format!("label:{}:{label}", c.id)) {
                        let message = format!(
                            "container '{}': {e}; the container is treated as unconfigured",
                            c.name
                        );
                        events.push(label_event(
                            "invalid",
                            &c.name,
                            &c.id,
                            None,
                            Some(label),
                            message,
                        ));
                    }
                    continue;
                }
            };
            // Docker says a container stopped before its cgroup is gone: its word first.
            let Some(&owner) = running.get(c.id.as_str()).filter(|_| c.running) else {
                continue;
            };
            if let Some(claimed) = self.config.services.iter().find(|s| s.matches_owner(owner)) {
                if self.reported.insert(format!("overridden:{}", c.id)) {
                    let message = format!(
                        "container '{}' declares {} in its labels, but the config's service '{}' (line {}) claims it: the config wins",
                        c.name,
                        SloRef::from(labels.class).describe(),
                        claimed.name,
                        claimed.line
                    );
                    events.push(label_event(
                        "overridden",
                        &c.name,
                        &c.id,
                        Some(claimed),
                        None,
                        message,
                    ));
                }
                continue;
            }
            let spec = ServiceSpec {
                name: c.name.clone(),
                matchers: vec![Matcher::Container(
                    glob::Pattern::new(&glob::Pattern::escape(&c.id))
                        .expect("an escaped id is a valid glob"),
                )],
                class: labels.class,
                floor: labels.floor,
                ceiling: labels.ceiling,
                weight: labels.weight,
                line: 0,
                match_line: 0,
            };
            wanted.insert(&c.id, spec);
        }
        // Gone or changed: released (a changed one comes back below with a new id).
        let stale: Vec<ServiceId> = self
            .labelled
            .iter()
            .filter(|(_, l)| wanted.get(l.container_id.as_str()) != Some(&l.spec))
            .map(|(&id, _)| id)
            .collect();
        for sid in stale {
            let l = self.labelled.remove(&sid).expect("listed above");
            let container = containers
                .get(&l.container_id)
                .map_or(l.spec.name.as_str(), |c| c.name.as_str());
            let message = format!(
                "service '{}' let go: its container stopped or its labels changed",
                l.spec.name
            );
            events.push(label_event(
                "released",
                container,
                &l.container_id,
                Some(&l.spec),
                None,
                message,
            ));
        }
        let have: HashSet<&str> = self
            .labelled
            .values()
            .map(|l| l.container_id.as_str())
            .collect();
        let mut new: Vec<(&str, ServiceSpec)> = wanted
            .into_iter()
            .filter(|(id, _)| !have.contains(id))
            .collect();
        new.sort_by(|a, b| a.0.cmp(b.0));
        for (container_id, spec) in new {
            let message = format!(
                "container '{}' governed by its labels: {}",
                spec.name,
                SloRef::from(spec.class).describe()
            );
            events.push(label_event(
                "applied",
                &spec.name,
                container_id,
                Some(&spec),
                None,
                message,
            ));
            let sid = self.next_label_id;
            self.next_label_id += 1;
            let container_id = container_id.to_string();
            self.labelled
                .insert(sid, LabelService { container_id, spec });
        }
        events
    }

    /// Writes configured weights once, at start.
    pub fn apply_weights(&mut self, cycle: u64) -> Vec<Event> {
        (0..self.config.services.len())
            .flat_map(|sid| self.apply_weight(sid, cycle))
            .collect()
    }

    fn apply_weight(&mut self, sid: ServiceId, cycle: u64) -> Vec<Event> {
        let Some(s) = self.spec(sid) else {
            return vec![];
        };
        let Some(w) = s.weight else {
            return vec![];
        };
        let name = s.name.clone();
        let targets = self
            .membership
            .targets
            .get(&sid)
            .cloned()
            .unwrap_or_default();
        let w = if self.enforcer.mode() == crate::cgroupfs::CgroupMode::V1 {
            w.min(1000)
        } else {
            w
        };
        let mut out = vec![];
        for t in targets {
            out.push(match self.enforcer.apply(&t.path, Setting::Weight(w)) {
                Ok(c) => Event::Decision {
                    cycle,
                    policy: "config".into(),
                    service: name.clone(),
                    cgroups: vec![t.path.clone()],
                    dev: None,
                    knob: "weight".into(),
                    old: c.old,
                    new: c.new,
                    applied: !self.enforcer.dry_run,
                    reason: "configured weight".into(),
                    cause: None,
                },
                Err(e) => Event::Error {
                    code: "write_rejected".into(),
                    message: format!("weight of service '{name}' on {}: {e}", t.path),
                },
            });
        }
        out
    }

    fn service_of(
        &mut self,
        id: u64,
        path: Option<&str>,
        containers: &ContainerTable,
    ) -> Option<ServiceId> {
        if let Some(&s) = self.membership.of_cgroup.get(&id) {
            return s;
        }
        let s = path.and_then(|p| self.service_of_path(p, containers));
        self.membership.of_cgroup.insert(id, s);
        s
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
        #[derive(Default)]
        struct Acc {
            rbytes: u64,
            wbytes: u64,
            rios: u64,
            wios: u64,
            lat_count: u64,
            lat_sum: u64,
            total_count: u64,
            total_sum: u64,
            peak: u64,
            cgroups: std::collections::BTreeSet<u64>,
            hist: HistSum,
        }
        let secs = snap.interval_ns as f64 / 1e9;
        let mut acc: BTreeMap<(u32, ServiceId), Acc> = BTreeMap::new();
        for d in &snap.deltas {
            let path = path_of(d.key.cgroup_id);
            let Some(sid) = self.service_of(d.key.cgroup_id, path.as_deref(), containers) else {
                continue;
            };
            if !d.had_requests() && !self.state.contains_key(&(sid, d.key.dev)) {
                continue;
            }
            let a = acc.entry((d.key.dev, sid)).or_default();
            match d.key.op {
                OP_READ => {
                    a.rbytes += d.bytes;
                    a.rios += d.ios;
                }
                OP_WRITE => {
                    a.wbytes += d.bytes;
                    a.wios += d.ios;
                }
                _ => {}
            }
            a.lat_count += d.latency.device.count;
            a.lat_sum += d.latency.device.sum_ns;
            a.total_count += d.latency.total.count;
            a.total_sum += d.latency.total.sum_ns;
            a.peak += d.inflight_peak;
            a.cgroups.insert(d.key.cgroup_id);
            // The SLO is on what the submitter waits: queueing plus device time. Keys
            // without start times (no queue timestamps) fall back to device latency.
            a.hist.add(if d.latency.total.count > 0 {
                &d.latency.total.hist
            } else {
                &d.latency.device.hist
            });
        }
        // Services with a limit but no I/O this cycle still get a say (to be relaxed).
        for &(sid, dev) in self.state.keys() {
            acc.entry((dev, sid)).or_default();
        }
        let mut by_dev: BTreeMap<u32, Vec<ServiceLoad>> = BTreeMap::new();
        for ((dev, sid), a) in acc {
            let Some(spec) = self.spec(sid) else {
                continue;
            };
            let sparse = a.hist.sparse();
            let samples = a.hist.samples();
            let st = self.state.get(&(sid, dev)).cloned().unwrap_or_default();
            by_dev.entry(dev).or_default().push(ServiceLoad {
                id: sid,
                name: spec.name.clone(),
                class: spec.class,
                floor: spec.floor,
                ceiling: spec.ceiling,
                read_bps: a.rbytes as f64 / secs,
                write_bps: a.wbytes as f64 / secs,
                read_iops: a.rios as f64 / secs,
                write_iops: a.wios as f64 / secs,
                p999_ns: percentile(&sparse, samples, 0.999),
                samples,
                mean_latency_ns: if a.total_count > 0 {
                    Some(a.total_sum as f64 / a.total_count as f64)
                } else {
                    (a.lat_count > 0).then(|| a.lat_sum as f64 / a.lat_count as f64)
                },
                // Device occupancy (Little's law over device time): the share that hurts
                // others.
                mean_inflight: a.lat_sum as f64 / snap.interval_ns.max(1) as f64,
                peak_inflight: snap.inflight_counted.then_some(a.peak),
                limit: st.limit,
                changed_cycle: st.changed_cycle,
                latency_hist: sparse,
                cgroup_ids: a.cgroups.into_iter().collect(),
            });
        }
        by_dev
            .into_iter()
            .map(|(dev, services)| DeviceCycle {
                cycle: snap.cycle,
                dev,
                interval_s: secs,
                utilization: utilization(dev),
                services,
            })
            .collect()
    }

    /// Runs the policy on each device and enforces its decisions; returns the events.
    pub fn step(
        &mut self,
        cycles: &[DeviceCycle],
        disk_name: &mut dyn FnMut(u32) -> Option<String>,
    ) -> Vec<Event> {
        let mut events = vec![];
        for d in cycles {
            let dev = format!("{}:{}", dev_major(d.dev), dev_minor(d.dev));
            for s in &d.services {
                events.push(self.service_event(d, s, &dev, disk_name(d.dev)));
                let st = self.state.entry((s.id, d.dev)).or_default();
                let now = s.violating();
                if now != st.violating {
                    st.violating = now;
                    let ev = crate::events::ViolationInfo {
                        cycle: d.cycle,
                        service: s.name.clone(),
                        dev: dev.clone(),
                        p999_ns: s.judged_p999(),
                        slo: s.class.into(),
                        vio: s.vio(),
                        rate_bps: s.bps(),
                    };
                    events.push(if now {
                        Event::ViolationStart(ev)
                    } else {
                        Event::ViolationEnd(ev)
                    });
                }
                // Nothing to remember for an idle service the agent never limited.
                if st.changed_cycle.is_none() && s.samples == 0 && s.bps() == 0.0 {
                    self.state.remove(&(s.id, d.dev));
                }
            }
            let mut decisions = crate::policy::ceilings(d);
            decisions.extend(self.policy.decide(d));
            for dec in decisions {
                events.extend(self.enforce(d, &dev, dec));
            }
        }
        events
    }

    fn service_event(
        &self,
        d: &DeviceCycle,
        s: &ServiceLoad,
        dev: &str,
        disk: Option<String>,
    ) -> Event {
        let state = if s.violating() {
            "violating"
        } else if !s.limit.is_unlimited() {
            "throttled"
        } else {
            "ok"
        };
        Event::ServiceStats {
            cycle: d.cycle,
            service: s.name.clone(),
            slo: s.class.into(),
            dev: dev.to_string(),
            disk,
            state: state.into(),
            p50_ns: percentile(&s.latency_hist, s.samples, 0.50),
            p999_ns: s.p999_ns,
            samples: s.samples,
            latency_log2: crate::metrics::log2_histogram(&s.latency_hist),
            cgroups: s.cgroup_ids.clone(),
            mean_latency_ns: s.mean_latency_ns.map(|v| v as u64),
            read_mbps: s.read_bps / 1e6,
            write_mbps: s.write_bps / 1e6,
            iops: s.iops(),
            mean_inflight: s.mean_inflight,
            peak_inflight: s.peak_inflight,
            vio: s.vio(),
            th_dif_mbps: s.th_dif().map(|v| v / 1e6),
            share: d.share(s.id),
            utilization: d.utilization,
            limit: s.limit,
        }
    }

    fn enforce(&mut self, d: &DeviceCycle, dev: &str, dec: crate::policy::Decision) -> Vec<Event> {
        let Some(spec) = self.spec(dec.service) else {
            return vec![];
        };
        let name = spec.name.clone();
        let targets: Vec<String> = self
            .membership
            .targets
            .get(&dec.service)
            .map(|t| t.iter().map(|t| t.path.clone()).collect())
            .unwrap_or_default();
        let st = self.state.entry((dec.service, d.dev)).or_default();
        let old = st.limit.get(dec.knob);
        if targets.is_empty() {
            let key = format!("notargets:{name}");
            if self.reported.insert(key) {
                return vec![Event::Error {
                    code: "no_cgroup".into(),
                    message: format!(
                        "service '{name}' matches no cgroup any more; nothing to throttle"
                    ),
                }];
            }
            return vec![];
        }
        let split = split_limit(dec.knob, dec.to, targets.len());
        let mut events = vec![];
        let mut ok = true;
        let mut old_text = None;
        let mut new_text = None;
        let results = self.enforcer.apply_all(
            &targets,
            Setting::Limit {
                dev: d.dev,
                knob: dec.knob,
                value: split.per_cgroup,
            },
        );
        for (cg, r) in targets.iter().zip(results) {
            match r {
                Ok(c) => {
                    old_text.get_or_insert(c.old);
                    new_text.get_or_insert(c.new);
                }
                // Someone else's knob now: said once, and not a failed decision (the
                // policy would decide it again every cycle).
                Err(EnforceError::ChangedByOther { .. })
                    if !self
                        .reported
                        .insert(format!("other:{cg}:{dev}:{}", dec.knob.name())) => {}
                Err(e) => {
                    ok &= matches!(e, EnforceError::ChangedByOther { .. });
                    let code = match e {
                        EnforceError::CgroupGone(_) => "cgroup_gone",
                        EnforceError::Journal { .. } => "journal",
                        EnforceError::Partition { .. } => "partition",
                        EnforceError::ChangedByOther { .. } => "changed_by_other",
                        _ => "write_rejected",
                    };
                    events.push(Event::Error {
                        code: code.into(),
                        message: format!(
                            "service '{name}', cgroup {cg}, {dev} {}: {e}",
                            dec.knob.name()
                        ),
                    });
                }
            }
        }
        let mut reason = dec.reason;
        if let Some(note) = split.note {
            reason = format!("{reason}; {note}");
        }
        if ok {
            st.limit.set(dec.knob, dec.to);
        }
        st.changed_cycle = Some(d.cycle);
        let fmt = |v: Option<u64>| v.map_or("max".to_string(), |v| v.to_string());
        events.insert(
            0,
            Event::Decision {
                cycle: d.cycle,
                policy: self.policy.name().into(),
                service: name,
                cgroups: targets,
                dev: Some(dev.to_string()),
                knob: dec.knob.name().into(),
                old: old_text.unwrap_or_else(|| fmt(old)),
                new: new_text.unwrap_or_else(|| fmt(dec.to)),
                applied: ok && !self.enforcer.dry_run,
                reason,
                cause: Some(dec.cause),
            },
        );
        events
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

/// A service's limit split evenly over its cgroups, never below the per-cgroup minimum
/// (1 MiB/s, 10 IOPS): a throttled cgroup must still make progress, even when that puts the
/// service's sum above its limit, which the decision then says.
struct SplitLimit {
    per_cgroup: Option<u64>,
    note: Option<String>,
}

fn split_limit(knob: crate::policy::Knob, to: Option<u64>, cgroups: usize) -> SplitLimit {
    use crate::policy::{Knob, MIN_CAP_BPS, MIN_CAP_IOPS};
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        cgroupfs::CgroupMode,
        docker::{ContainerInfo, DockerUpdate},
    };

    fn outcomes(events: &[Event]) -> Vec<(String, String)> {
        events
            .iter()
            .filter_map(|e| match e {
                Event::LabelSlo(l) => Some((l.outcome.clone(), l.container.clone())),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn label_services_follow_what_docker_says() {
        // A dry-run controller over a hierarchy that does not exist: nothing is written.
        let hierarchy = IoHierarchy {
            mode: CgroupMode::V1,
            root: "/nonexistent-isolator-test".into(),
            io_enabled: true,
        };
        let config = Config::parse(
            "c.toml",
            "[[service]]\nname='web'\ncontainer='web'\nclass='best-effort'\n",
        )
        .unwrap();
        let policy = crate::policy::by_name("adaptive", 0.75).unwrap();
        let mut c = Controller::new(config, policy, Enforcer::new(hierarchy.clone(), None));
        let id = |n: u8| format!("{n:064x}");
        let info = |n: u8, name: &str, labels: &[(&str, &str)], running: bool| ContainerInfo {
            id: id(n),
            name: name.into(),
            image: "img".into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            running,
        };
        let slo = [("isolator.class", "latency"), ("isolator.p999", "20ms")];
        let mut table = ContainerTable::default();
        table.apply(&DockerUpdate::Connected {
            api_version: "1.41".into(),
            containers: vec![
                info(1, "db", &slo, true),
                info(2, "web", &slo, true),
                info(3, "bad", &[("isolator.class", "fast")], true),
            ],
        });
        let paths: Vec<String> = (1..=3).map(|n| format!("/docker/{}", id(n))).collect();
        let ev = c.refresh(&hierarchy, &paths, &table, 1);
        let mut got = outcomes(&ev);
        got.sort();
        assert_eq!(
            got,
            [
                ("applied".to_string(), "db".to_string()),
                ("invalid".into(), "bad".into()),
                ("overridden".into(), "web".into()),
            ]
        );
        // Said once: the same refresh again says nothing.
        assert!(outcomes(&c.refresh(&hierarchy, &paths, &table, 2)).is_empty());

        // Docker says db stopped while its cgroup is still there: let go now.
        table.apply(&DockerUpdate::Upsert(info(1, "db", &slo, false)));
        let ev = c.refresh(&hierarchy, &paths, &table, 3);
        assert_eq!(outcomes(&ev), [("released".to_string(), "db".to_string())]);
        assert!(c.labelled.is_empty());
        assert!(
            c.membership.targets.keys().all(|&s| s < 1),
            "only 'web' left"
        );

        // Started again: a new service (ids are never reused).
        table.apply(&DockerUpdate::Upsert(info(1, "db", &slo, true)));
        let ev = c.refresh(&hierarchy, &paths, &table, 4);
        assert_eq!(outcomes(&ev), [("applied".to_string(), "db".to_string())]);
        assert_eq!(c.labelled.keys().copied().collect::<Vec<_>>(), [2]);
    }

    #[test]
    fn a_split_limit_never_goes_below_the_minimum_per_cgroup() {
        use crate::policy::{Knob, MIN_CAP_BPS, MIN_CAP_IOPS};
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
