//! The control stage: cgroups -> services (config matchers), per-service per-device cycle
//! stats (the policy input), the policy, the enforcer, and the events that say why.

use std::collections::{BTreeMap, HashMap, HashSet};

use isolator_common::{dev_major, dev_minor, OP_READ, OP_WRITE};
use serde::Serialize;

use crate::{
    cgroupfs::IoHierarchy,
    collector::Snapshot,
    config::{Config, SloClass},
    enforcer::{EnforceError, Enforcer, Setting},
    events::Event,
    metrics::{percentile, HistSum},
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

/// Which service each cgroup belongs to, and which cgroups carry a service's limits.
struct Membership {
    /// cgroup id -> service (None: unconfigured), cached per id.
    of_cgroup: HashMap<u64, Option<ServiceId>>,
    /// service -> the cgroup directories its glob matches (where limits are written).
    targets: Vec<Vec<String>>,
}

impl Membership {
    /// A cgroup belongs to the service whose glob matches it or its nearest ancestor.
    fn service_of_path(cfg: &Config, path: &str) -> Option<ServiceId> {
        let mut p = path.to_string();
        loop {
            if let Some(i) = cfg.services.iter().position(|s| s.matches(&p)) {
                return Some(i);
            }
            match p.rfind('/') {
                Some(0) | None => return None,
                Some(i) => p.truncate(i),
            }
        }
    }
}

#[derive(Default, Clone)]
struct DevState {
    limit: IoMaxLimit,
    changed_cycle: Option<u64>,
    violating: bool,
}

/// Per-device busy time from /sys/dev/block/M:m/stat (io_ticks, ms).
#[derive(Default)]
struct Utilization {
    last: HashMap<u32, u64>,
}

impl Utilization {
    fn sample(&mut self, dev: u32, interval_s: f64) -> f64 {
        let path = format!("/sys/dev/block/{}:{}/stat", dev_major(dev), dev_minor(dev));
        let ticks = std::fs::read_to_string(path).ok().and_then(|t| {
            t.split_whitespace()
                .nth(9)
                .and_then(|v| v.parse::<u64>().ok())
        });
        let Some(ticks) = ticks else {
            return 0.0;
        };
        let prev = self.last.insert(dev, ticks);
        match prev {
            Some(p) if interval_s > 0.0 => {
                (ticks.saturating_sub(p) as f64 / 1000.0 / interval_s).min(1.0)
            }
            _ => 0.0,
        }
    }
}

pub struct Controller {
    config: Config,
    policy: Box<dyn Policy>,
    enforcer: Enforcer,
    membership: Membership,
    state: HashMap<(ServiceId, u32), DevState>,
    util: Utilization,
    /// Errors already reported, so a persistent one is said once.
    reported: HashSet<String>,
}

impl Controller {
    pub fn new(config: Config, policy: Box<dyn Policy>, enforcer: Enforcer) -> Controller {
        Controller {
            config,
            policy,
            enforcer,
            membership: Membership {
                of_cgroup: HashMap::new(),
                targets: vec![],
            },
            state: HashMap::new(),
            util: Utilization::default(),
            reported: HashSet::new(),
        }
    }

    pub fn policy_name(&self) -> &'static str {
        self.policy.name()
    }

    /// Which cgroups each glob matches, from a walk of the hierarchy (at start and when
    /// new cgroups appear).
    pub fn refresh_targets(&mut self, all_paths: &[String]) {
        self.membership.targets = self
            .config
            .services
            .iter()
            .map(|s| all_paths.iter().filter(|p| s.matches(p)).cloned().collect())
            .collect();
        self.membership.of_cgroup.clear();
    }

    /// Writes configured weights once, at start.
    pub fn apply_weights(&mut self, hierarchy: &IoHierarchy, cycle: u64) -> Vec<Event> {
        let Controller {
            config,
            membership,
            enforcer,
            ..
        } = self;
        let mut out = vec![];
        for (s, targets) in config.services.iter().zip(&membership.targets) {
            let Some(w) = s.weight else { continue };
            for cg in targets {
                let dir = hierarchy.dir_of(cg);
                let w = if enforcer.mode == crate::cgroupfs::CgroupMode::V1 {
                    w.min(1000)
                } else {
                    w
                };
                out.push(match enforcer.apply(&dir, Setting::Weight(w)) {
                    Ok(c) => Event::Decision {
                        cycle,
                        policy: "config".into(),
                        service: s.name.clone(),
                        cgroups: vec![cg.clone()],
                        dev: None,
                        knob: "weight".into(),
                        old: c.old,
                        new: c.new,
                        applied: !enforcer.dry_run,
                        reason: "configured weight".into(),
                        cause: None,
                    },
                    Err(e) => Event::Error {
                        code: "write_rejected".into(),
                        message: format!("weight of service '{}' on {cg}: {e}", s.name),
                    },
                });
            }
        }
        out
    }

    fn service_of(&mut self, id: u64, path: Option<&str>) -> Option<ServiceId> {
        let cfg = &self.config;
        *self
            .membership
            .of_cgroup
            .entry(id)
            .or_insert_with(|| path.and_then(|p| Membership::service_of_path(cfg, p)))
    }

    /// Per (service, device) stats of this cycle.
    pub fn device_cycles(
        &mut self,
        snap: &Snapshot,
        path_of: &dyn Fn(u64) -> Option<String>,
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
            hist: HistSum,
        }
        let secs = snap.interval_ns as f64 / 1e9;
        let mut acc: BTreeMap<(u32, ServiceId), Acc> = BTreeMap::new();
        for d in &snap.deltas {
            let path = path_of(d.key.cgroup_id);
            let Some(sid) = self.service_of(d.key.cgroup_id, path.as_deref()) else {
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
            a.lat_count += d.lat_count;
            a.lat_sum += d.lat_sum_ns;
            a.total_count += d.total_count;
            a.total_sum += d.total_sum_ns;
            a.peak += d.inflight_peak;
            // The SLO is on what the submitter waits: queueing plus device time. Keys
            // without start times (no queue timestamps) fall back to device latency.
            a.hist.add(if d.total_count > 0 {
                &d.total_hist
            } else {
                &d.lat_hist
            });
        }
        // Services with a limit but no I/O this cycle still get a say (to be relaxed).
        for &(sid, dev) in self.state.keys() {
            acc.entry((dev, sid)).or_default();
        }
        let mut by_dev: BTreeMap<u32, Vec<ServiceLoad>> = BTreeMap::new();
        for ((dev, sid), a) in acc {
            let spec = &self.config.services[sid];
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
                peak_inflight: a.peak,
                limit: st.limit,
                changed_cycle: st.changed_cycle,
            });
        }
        by_dev
            .into_iter()
            .map(|(dev, services)| DeviceCycle {
                cycle: snap.cycle,
                dev,
                interval_s: secs,
                utilization: self.util.sample(dev, secs),
                services,
            })
            .collect()
    }

    /// Runs the policy on each device and enforces its decisions; returns the events.
    pub fn step(
        &mut self,
        hierarchy: &IoHierarchy,
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
                events.extend(self.enforce(hierarchy, d, &dev, dec));
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
            p999_ns: s.p999_ns,
            samples: s.samples,
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

    fn enforce(
        &mut self,
        hierarchy: &IoHierarchy,
        d: &DeviceCycle,
        dev: &str,
        dec: crate::policy::Decision,
    ) -> Vec<Event> {
        let spec = &self.config.services[dec.service];
        let name = spec.name.clone();
        let targets = self
            .membership
            .targets
            .get(dec.service)
            .cloned()
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
        // Split the service's limit evenly over the cgroups its glob matches.
        let per_cgroup = dec.to.map(|v| (v / targets.len() as u64).max(1));
        let mut events = vec![];
        let mut ok = true;
        let mut old_text = None;
        let mut new_text = None;
        for cg in &targets {
            let dir = hierarchy.dir_of(cg);
            match self.enforcer.apply(
                &dir,
                Setting::Limit {
                    dev: d.dev,
                    knob: dec.knob,
                    value: per_cgroup,
                },
            ) {
                Ok(c) => {
                    old_text.get_or_insert(c.old);
                    new_text.get_or_insert(c.new);
                }
                Err(e) => {
                    ok = false;
                    let code = match e {
                        EnforceError::CgroupGone(_) => "cgroup_gone",
                        EnforceError::Journal { .. } => "journal",
                        EnforceError::Partition { .. } => "partition",
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
                reason: dec.reason,
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
