//! What the metrics endpoint exports, accumulated once per cycle from what the cycle
//! already produced: the collector's deltas (with their fine latency histograms), the
//! cgroups' names from `cgroup_stats`, and the events the cycle emitted (`service_stats`,
//! `decision`, `violation_start`, `cycle_end`, Docker's and containerd's status, warnings and
//! errors).
//! Counters and histograms are cumulative from the moment a series appears.
//!
//! Bounded: a (cgroup, disk) or (service, disk) idle for [`IDLE_CYCLES`] cycles leaves (a
//! gone cgroup at once), and a new one that would take the series over the cap is left out
//! (counted) until an idle one makes room.

use std::collections::{BTreeMap, HashMap};

use isolator_common::OP_OTHER;

use crate::{
    collect::collector::{KeyDelta, Snapshot},
    config::SloClass,
    events::{CgroupRef, CycleEnd, Decision, Event, ServiceStats},
    identify::disks::dev_text,
    identify::naming::ServiceKind,
    measure::character::Character,
    measure::services::slo_latency,
    policy::{IoMaxLimit, Knob},
    prometheus::histogram::{Histogram, SLOTS},
};

/// A (cgroup, disk) or (service, disk) without I/O for this many cycles leaves the
/// exposition (5 minutes at the default 1 s cycle: longer than the scrape intervals and
/// rate() windows commonly used, so a pause in I/O does not break a graph).
pub const IDLE_CYCLES: u32 = 300;

/// Default of `--metrics-max-series`.
pub const DEFAULT_MAX_SERIES: usize = 50_000;

/// Series a (cgroup, disk) may take, reserved against the cap when it is let in: two
/// histograms (the slots, `_sum` and `_count`), requests and bytes by three ops, queue time
/// and its samples, two in-flight gauges.
pub const CGROUP_SERIES: usize = 2 * (SLOTS + 2) + 3 + 3 + 2 + 2;
/// Series a (service, disk) may take: those of a cgroup, p99.9 with its samples and window,
/// three states, four limits, the violations counter and the stalls counter.
pub const SERVICE_SERIES: usize = CGROUP_SERIES + 3 + 3 + 4 + 1 + 1;

/// Most distinct warning/error codes counted; codes beyond are counted as `other` (codes
/// are a fixed set in the agent; this only guards the exposition against a bug).
const MAX_NOTICE_CODES: usize = 64;

/// The op label of [`isolator_common::OP_READ`], `OP_WRITE` and `OP_OTHER`.
pub const OPS: [&str; 3] = ["read", "write", "other"];

/// Label pairs of a series, in the order they are written.
pub type Labels = Vec<(&'static str, String)>;

/// What one cycle gives the model.
pub struct CycleInput<'a> {
    pub snap: &'a Snapshot,
    /// This cycle's `cgroup_stats`: how the cgroups of the deltas are named.
    pub cgroups: &'a [Event],
    /// The other events emitted since the last cycle, in order (see
    /// [`crate::prometheus::wants`]).
    pub events: &'a [Event],
    /// How long reading and diffing the kernel maps took.
    pub collect_ns: u64,
}

/// The I/O of a (cgroup, disk) or (service, disk), cumulative, and its in-flight gauges.
#[derive(Debug, Clone, Default)]
pub struct Io {
    pub device_latency: Histogram,
    pub total_latency: Histogram,
    /// By op (index: OP_READ, OP_WRITE, OP_OTHER).
    pub requests: [u64; 3],
    pub bytes: [u64; 3],
    pub queue_ns: u128,
    pub queued_requests: u64,
    /// Requests in flight at the end of the last cycle (with --count-inflight).
    pub inflight: Option<u64>,
    /// Time-average in flight over the last cycle (device time / cycle length).
    pub mean_inflight: f64,
    /// Ops that did I/O since the series appeared (their counters are written).
    pub ops_seen: [bool; 3],
}

impl Io {
    /// Adds one key's cycle. `slo_latency`: the total histogram is the one the controller
    /// judges (device latency for queues without start times); otherwise total latency.
    fn add(&mut self, d: &KeyDelta, interval_ns: u64, slo: bool) {
        let op = (d.key.op as usize).min(OP_OTHER as usize);
        self.ops_seen[op] = true;
        self.requests[op] += d.ios;
        self.bytes[op] += d.bytes;
        let device = &d.latency.device;
        self.device_latency.add(&device.hist, device.sum_ns);
        let total = if slo {
            slo_latency(d)
        } else {
            &d.latency.total
        };
        self.total_latency.add(&total.hist, total.sum_ns);
        self.queue_ns += d.latency.queue.sum_ns as u128;
        self.queued_requests += d.latency.queue.count;
        if let Some(n) = self.inflight.as_mut() {
            *n += d.inflight_now;
        }
        self.mean_inflight += device.sum_ns as f64 / interval_ns.max(1) as f64;
    }

    /// The gauges start each cycle at zero: a series idle this cycle has nothing in flight.
    fn new_cycle(&mut self, inflight_counted: bool) {
        self.inflight = inflight_counted.then_some(0);
        self.mean_inflight = 0.0;
    }
}

/// One (cgroup, disk).
#[derive(Debug, Clone)]
pub struct CgroupSeries {
    pub labels: Labels,
    pub io: Io,
    idle_cycles: u32,
}

/// A service's state on a disk, as `service_stats` says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Ok,
    Violating,
    Throttled,
}

impl State {
    pub const ALL: [State; 3] = [State::Ok, State::Violating, State::Throttled];
    pub fn as_str(self) -> &'static str {
        match self {
            State::Ok => "ok",
            State::Violating => "violating",
            State::Throttled => "throttled",
        }
    }
    fn parse(s: &str) -> Option<State> {
        State::ALL.into_iter().find(|st| st.as_str() == s)
    }
}

/// One (service, disk).
#[derive(Debug, Clone)]
pub struct ServiceSeries {
    /// service, device.
    pub labels: Labels,
    pub io: Io,
    /// This cycle's judged p99.9, its samples and window; None without `service_stats`
    /// this cycle.
    pub p999_ns: Option<u64>,
    pub samples: u64,
    pub window_s: f64,
    pub state: Option<State>,
    /// In force now: as `service_stats` said at the start of the cycle's decisions, with
    /// the cycle's applied decisions on top.
    pub limit: IoMaxLimit,
    pub violations: u64,
    /// Cycles over its SLO the policy judged stalls of the disk (`disk_stall`).
    pub stalls: u64,
    /// The character over its window, as the last `service_stats` gave it.
    pub character: Option<Character>,
    idle_cycles: u32,
    /// Had `service_stats` this cycle.
    reported: bool,
}

/// Why a limit decision was made, as a label: a bounded set (the events' `reason` is a
/// sentence with numbers).
pub fn decision_reason(d: &Decision, in_force: Option<u64>) -> &'static str {
    if d.knob == "weight" {
        return "weight";
    }
    match d.decided.and_then(|l| l.value()) {
        None => "remove",
        Some(v) if in_force.is_some_and(|old| v > old) => "relax",
        Some(_) if d.cause.as_ref().is_some_and(|c| c.victim.is_some()) => "protect",
        Some(_) => "cap",
    }
}

/// A service, whatever its disks.
#[derive(Debug, Clone, Default)]
pub struct ServiceInfo {
    pub slo: SloClass,
    /// By (device label, "" for weights; knob; reason; applied).
    pub decisions: BTreeMap<(String, &'static str, &'static str, bool), u64>,
    idle_cycles: u32,
}

/// A discovery source (Docker, containerd).
#[derive(Debug, Clone, Default)]
pub struct Discovery {
    pub up: bool,
    pub containers: Option<u64>,
}

/// The agent's own figures.
#[derive(Debug, Clone, Default)]
pub struct AgentFigures {
    pub cycles: u64,
    pub interval_s: f64,
    pub cycle_duration: Histogram,
    pub collect_duration: Histogram,
    pub cgroups: u64,
    pub tracked_keys: u64,
    pub capacity_keys: u64,
    pub capacity_histogram_keys: u64,
    pub map_full: u64,
    pub unsampled: u64,
    pub missed_events: u64,
    pub untraced: u64,
    pub evicted_keys: u64,
    pub events_dropped: u64,
    /// By (level, code).
    pub notices: BTreeMap<(&'static str, String), u64>,
    /// By source (`docker`, `containerd`), for each the agent asks.
    pub discovery: BTreeMap<&'static str, Discovery>,
    /// Disk label -> busy fraction over the last cycle.
    pub disks: BTreeMap<String, f64>,
    /// Disk label -> completions the disk counted and the programs never saw (cumulative).
    pub disks_unseen: BTreeMap<String, u64>,
}

/// The level of a left-out pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Cgroup,
    Service,
}

impl Level {
    pub const ALL: [Level; 2] = [Level::Cgroup, Level::Service];
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Cgroup => "cgroup",
            Level::Service => "service",
        }
    }
}

/// What the exposition holds about itself.
#[derive(Debug, Clone, Default)]
pub struct SelfFigures {
    pub max_series: usize,
    /// Series reserved by the pairs let in.
    pub reserved: usize,
    /// Series of the previous exposition, and how long the previous cycle's export took
    /// (adding the cycle, rendering both formats).
    pub last_series: u64,
    pub last_export_s: f64,
    /// Pairs refused a place, once per stay, by level.
    pub left_out_total: [u64; 2],
    /// Pairs left out and still active, by level.
    pub left_out_now: [u64; 2],
}

/// Everything the endpoint exports.
#[derive(Debug, Default)]
pub struct Model {
    pub version: &'static str,
    /// By (cgroup label, dev_t).
    pub cgroups: BTreeMap<(String, u32), CgroupSeries>,
    /// By (service, dev "major:minor").
    pub services: BTreeMap<(String, String), ServiceSeries>,
    pub service_info: BTreeMap<String, ServiceInfo>,
    pub agent: AgentFigures,
    pub exposition: SelfFigures,
    /// Pairs left out, with their idle cycles.
    left_out_cgroups: HashMap<(String, u32), u32>,
    left_out_services: HashMap<(String, String), u32>,
    inflight_counted: bool,
}

/// The `cgroup` label: the path, or the name for a cgroup without one (id 0, or gone
/// before it was seen).
fn cgroup_label(cg: &CgroupRef) -> &str {
    cg.path.as_deref().unwrap_or(&cg.name)
}

/// A cgroup's labels, as Prometheus users name things.
fn cgroup_labels<'a>(
    cg: &'a CgroupRef,
    service: Option<&'a str>,
    device: &'a str,
) -> Vec<(&'static str, &'a str)> {
    let mut l = vec![("cgroup", cgroup_label(cg)), ("kind", cg.kind.as_str())];
    // A pod's container is `container` by its name in the pod (its full name,
    // `namespace/pod/container`, would repeat the two labels below).
    match (&cg.pod_container, cg.kind) {
        (Some(c), _) => l.push(("container", c.as_str())),
        (None, ServiceKind::Container) => l.push(("container", cg.name.as_str())),
        _ => {}
    }
    // Pods named through containerd; without it a pod is known by its UID only.
    if let Some(ns) = &cg.pod_namespace {
        l.push(("namespace", ns));
    }
    if let Some(pod) = &cg.pod_name {
        l.push(("pod", pod));
    }
    if let Some(uid) = &cg.pod_uid {
        l.push(("pod_uid", uid));
    }
    if let Some(unit) = &cg.unit {
        l.push(("unit", unit));
    }
    if let Some(s) = service {
        l.push(("service", s));
    }
    l.push(("device", device));
    l
}

fn same_labels(stored: &Labels, fresh: &[(&'static str, &str)]) -> bool {
    stored.len() == fresh.len()
        && stored
            .iter()
            .zip(fresh)
            .all(|((k, v), (fk, fv))| k == fk && v == fv)
}

fn owned(fresh: &[(&'static str, &str)]) -> Labels {
    fresh.iter().map(|&(k, v)| (k, v.to_string())).collect()
}

impl Model {
    pub fn new(version: &'static str, max_series: usize, docker: bool, containerd: bool) -> Model {
        let mut m = Model {
            version,
            exposition: SelfFigures {
                max_series,
                ..Default::default()
            },
            ..Default::default()
        };
        if containerd {
            m.agent.discovery.insert("containerd", Discovery::default());
        }
        if docker {
            m.agent.discovery.insert("docker", Discovery::default());
        }
        m
    }

    /// Adds one cycle.
    pub fn apply(&mut self, input: &CycleInput) {
        let snap = input.snap;
        self.inflight_counted = snap.inflight_counted;
        self.agent.collect_duration.observe_ns(input.collect_ns);
        // Who the cycle's cgroups are, what their disks are called, and whose service each
        // (cgroup, disk) is.
        let mut names: HashMap<u64, &CgroupRef> = HashMap::new();
        let mut disks: HashMap<&str, &str> = HashMap::new();
        for e in input.cgroups {
            if let Event::CgroupStats(s) = e {
                names.insert(s.cgroup.id, &s.cgroup);
                for d in &s.devices {
                    if let Some(n) = &d.disk {
                        disks.insert(&d.dev, n);
                    }
                }
            }
        }
        let mut member: HashMap<(u64, &str), &str> = HashMap::new();
        for e in input.events {
            if let Event::ServiceStats(s) = e {
                if let Some(n) = &s.disk {
                    disks.insert(&s.dev, n);
                }
                for &id in &s.cgroups {
                    member.insert((id, &s.dev), &s.service);
                }
            }
        }
        for c in self.cgroups.values_mut() {
            c.io.new_cycle(snap.inflight_counted);
            c.idle_cycles += 1;
        }
        for s in self.services.values_mut() {
            s.io.new_cycle(snap.inflight_counted);
            s.idle_cycles += 1;
            s.reported = false;
            s.p999_ns = None;
            s.state = None;
            s.limit = IoMaxLimit::default();
        }
        for s in self.service_info.values_mut() {
            s.idle_cycles += 1;
        }
        for n in self.left_out_cgroups.values_mut() {
            *n += 1;
        }
        for n in self.left_out_services.values_mut() {
            *n += 1;
        }

        let mut devs: HashMap<u32, String> = HashMap::new();
        for d in snap.deltas.iter().filter(|d| !d.is_idle()) {
            let dev = devs.entry(d.key.dev).or_insert_with(|| dev_text(d.key.dev));
            let device = disks.get(dev.as_str()).copied().unwrap_or(dev);
            let unnamed;
            let cg = match names.get(&d.key.cgroup_id) {
                Some(cg) => *cg,
                None => {
                    unnamed = CgroupRef {
                        id: d.key.cgroup_id,
                        name: format!("cgroup {}", d.key.cgroup_id),
                        ..Default::default()
                    };
                    &unnamed
                }
            };
            let service = member.get(&(d.key.cgroup_id, dev.as_str())).copied();
            let fresh = cgroup_labels(cg, service, device);
            if let Some(c) = self.cgroup_series(cgroup_label(cg), d.key.dev, &fresh) {
                c.io.add(d, snap.interval_ns, false);
            }
            if let Some(name) = service {
                if let Some(s) = self.service_series(name, dev, device) {
                    s.io.add(d, snap.interval_ns, true);
                }
            }
        }

        for e in input.events {
            self.apply_event(e, snap.interval_ns);
        }
        self.forget_idle();
    }

    /// The (cgroup, disk)'s series, let in if the cap allows (else counted left out);
    /// relabelled in place when its names changed (a container named by Docker later, a
    /// cgroup moved to another service): its counts go on under the new labels.
    fn cgroup_series(
        &mut self,
        label: &str,
        dev: u32,
        fresh: &[(&'static str, &str)],
    ) -> Option<&mut CgroupSeries> {
        let key = (label.to_string(), dev);
        if !self.cgroups.contains_key(&key) {
            if !self.admit(CGROUP_SERIES) {
                self.left_out_cgroup(key);
                return None;
            }
            self.left_out_cgroups.remove(&key);
            self.cgroups.insert(
                key.clone(),
                CgroupSeries {
                    labels: owned(fresh),
                    io: Io {
                        inflight: self.inflight_counted.then_some(0),
                        ..Default::default()
                    },
                    idle_cycles: 0,
                },
            );
        }
        let c = self.cgroups.get_mut(&key)?;
        if !same_labels(&c.labels, fresh) {
            c.labels = owned(fresh);
        }
        c.idle_cycles = 0;
        Some(c)
    }

    /// The (service, disk)'s series, let in if the cap allows.
    fn service_series(
        &mut self,
        service: &str,
        dev: &str,
        device: &str,
    ) -> Option<&mut ServiceSeries> {
        let key = (service.to_string(), dev.to_string());
        if !self.services.contains_key(&key) {
            if !self.admit(SERVICE_SERIES) {
                self.left_out_service(key);
                return None;
            }
            self.left_out_services.remove(&key);
            self.services.insert(
                key.clone(),
                ServiceSeries {
                    labels: vec![("service", service.into()), ("device", device.into())],
                    io: Io {
                        inflight: self.inflight_counted.then_some(0),
                        ..Default::default()
                    },
                    p999_ns: None,
                    samples: 0,
                    window_s: 0.0,
                    state: None,
                    limit: IoMaxLimit::default(),
                    violations: 0,
                    stalls: 0,
                    character: None,
                    idle_cycles: 0,
                    reported: false,
                },
            );
        }
        let s = self.services.get_mut(&key)?;
        if s.labels[1].1 != device {
            s.labels[1].1 = device.into();
        }
        s.idle_cycles = 0;
        if let Some(info) = self.service_info.get_mut(service) {
            info.idle_cycles = 0;
        }
        Some(s)
    }

    fn admit(&mut self, series: usize) -> bool {
        let fits = self.exposition.reserved + series <= self.exposition.max_series;
        if fits {
            self.exposition.reserved += series;
        }
        fits
    }

    /// Remembers a pair left out (active again: its idle count starts over); counted once
    /// per stay.
    fn left_out_cgroup(&mut self, key: (String, u32)) {
        if self.left_out_cgroups.insert(key, 0).is_none() {
            self.exposition.left_out_total[0] += 1;
        }
    }

    fn left_out_service(&mut self, key: (String, String)) {
        if self.left_out_services.insert(key, 0).is_none() {
            self.exposition.left_out_total[1] += 1;
        }
    }

    fn apply_event(&mut self, e: &Event, interval_ns: u64) {
        match e {
            Event::AgentStart(a) => {
                self.agent.interval_s = a.interval_s;
                self.agent.capacity_keys = a.stats_map.capacity_keys.into();
                self.agent.capacity_histogram_keys = a.stats_map.capacity_histogram_keys.into();
            }
            Event::ServiceStats(s) => self.service_stats(s, interval_ns),
            Event::Decision(d) => self.decision(d),
            Event::ViolationStart(v) => {
                if let Some(s) = self.services.get_mut(&(v.service.clone(), v.dev.clone())) {
                    s.violations += 1;
                }
            }
            Event::DiskStall(st) => {
                if let Some(s) = self.services.get_mut(&(st.service.clone(), st.dev.clone())) {
                    s.stalls += 1;
                }
            }
            Event::CgroupGone(g) => {
                let label = cgroup_label(&g.cgroup).to_string();
                let gone: Vec<(String, u32)> = self
                    .cgroups
                    .range((label.clone(), 0)..=(label.clone(), u32::MAX))
                    .map(|(k, _)| k.clone())
                    .collect();
                for k in gone {
                    self.cgroups.remove(&k);
                    self.exposition.reserved -= CGROUP_SERIES;
                }
                self.left_out_cgroups.retain(|(l, _), _| *l != label);
            }
            Event::DockerConnected(c) => {
                let d = self.agent.discovery.entry("docker").or_default();
                d.up = true;
                d.containers = Some(c.containers as u64);
            }
            Event::ContainerdConnected(c) => {
                let d = self.agent.discovery.entry("containerd").or_default();
                d.up = true;
                d.containers = Some(c.containers as u64);
            }
            Event::Warning(n) | Event::Error(n) => {
                let level = if matches!(e, Event::Warning(_)) {
                    "warning"
                } else {
                    "error"
                };
                match n.code.as_str() {
                    "docker_down" => self.agent.discovery.entry("docker").or_default().up = false,
                    "containerd_down" => {
                        self.agent.discovery.entry("containerd").or_default().up = false
                    }
                    _ => {}
                }
                let notices = &mut self.agent.notices;
                let key = (level, n.code.clone());
                let key = if notices.contains_key(&key) || notices.len() < MAX_NOTICE_CODES {
                    key
                } else {
                    (level, "other".to_string())
                };
                *notices.entry(key).or_default() += 1;
            }
            Event::CycleEnd(c) => self.cycle_end(c),
            _ => {}
        }
    }

    fn service_stats(&mut self, st: &ServiceStats, interval_ns: u64) {
        self.service_info.entry(st.service.clone()).or_default().slo = st.slo;
        let device = st.disk.as_deref().unwrap_or(&st.dev);
        let Some(s) = self.service_series(&st.service, &st.dev, device) else {
            return;
        };
        s.reported = true;
        s.p999_ns = st.p999_ns;
        s.samples = st.samples;
        s.window_s = interval_ns as f64 / 1e9;
        s.state = State::parse(&st.state);
        s.limit = st.limit;
        s.character = st.character.clone();
    }

    fn decision(&mut self, d: &Decision) {
        // A host-wide knob (iocost on a disk) belongs to no service: the event stream has
        // it, and a service series named "" would only mislead.
        if d.service.is_empty() {
            return;
        }
        let knob = Knob::ALL.into_iter().find(|k| k.name() == d.knob);
        let dev = d.dev.clone().unwrap_or_default();
        let series = self.services.get_mut(&(d.service.clone(), dev.clone()));
        let in_force = match (&series, knob) {
            (Some(s), Some(k)) => s.limit.get(k),
            _ => None,
        };
        let reason = decision_reason(d, in_force);
        let device = series
            .as_ref()
            .map_or(dev.clone(), |s| s.labels[1].1.clone());
        if let (Some(s), Some(k), true) = (series, knob, d.applied) {
            s.limit.set(k, d.decided.and_then(|l| l.value()));
        }
        let knob_label = knob.map_or(
            if d.knob == "weight" {
                "weight"
            } else {
                "other"
            },
            |k| k.name(),
        );
        let info = self.service_info.entry(d.service.clone()).or_default();
        info.idle_cycles = 0;
        *info
            .decisions
            .entry((device, knob_label, reason, d.applied))
            .or_default() += 1;
    }

    fn cycle_end(&mut self, c: &CycleEnd) {
        let a = &mut self.agent;
        a.cycles = c.cycle;
        a.cycle_duration
            .observe_ns(c.collect_us.saturating_mul(1000));
        a.cgroups = c.cgroups as u64;
        a.tracked_keys = c.tracked_keys as u64;
        a.evicted_keys += c.evicted_keys as u64;
        // Cumulative in the event already.
        a.map_full = c.map_full;
        a.unsampled = c.unsampled_requests;
        a.missed_events = c.missed_events;
        a.untraced = c.untraced_completions;
        a.events_dropped = c.events_dropped;
        if let (Some(n), Some(d)) = (c.docker_containers, a.discovery.get_mut("docker")) {
            d.containers = Some(n as u64);
        }
        if let (Some(n), Some(d)) = (c.containerd_containers, a.discovery.get_mut("containerd")) {
            d.containers = Some(n as u64);
        }
        for v in a.disks.values_mut() {
            *v = 0.0;
        }
        for d in &c.disks {
            let label = d.disk.clone().unwrap_or_else(|| d.dev.clone());
            if let Some(n) = d.unseen_completions {
                a.disks_unseen.insert(label.clone(), n);
            }
            a.disks.insert(label, d.utilization);
        }
    }

    /// Idle pairs leave after [`IDLE_CYCLES`] and free their reservation; so do services
    /// with no disk left, and left-out pairs that went idle.
    fn forget_idle(&mut self) {
        let before = self.cgroups.len();
        self.cgroups.retain(|_, c| c.idle_cycles <= IDLE_CYCLES);
        self.exposition.reserved -= (before - self.cgroups.len()) * CGROUP_SERIES;
        let before = self.services.len();
        self.services.retain(|_, s| s.idle_cycles <= IDLE_CYCLES);
        self.exposition.reserved -= (before - self.services.len()) * SERVICE_SERIES;
        let services = &self.services;
        self.service_info.retain(|name, i| {
            i.idle_cycles <= IDLE_CYCLES || services.keys().any(|(s, _)| s == name)
        });
        self.left_out_cgroups.retain(|_, idle| *idle <= IDLE_CYCLES);
        self.left_out_services
            .retain(|_, idle| *idle <= IDLE_CYCLES);
        // "Now": left out and active this cycle.
        self.exposition.left_out_now = [
            self.left_out_cgroups.values().filter(|&&i| i == 0).count() as u64,
            self.left_out_services.values().filter(|&&i| i == 0).count() as u64,
        ];
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use isolator_common::{latency_bucket, IoKey, Latencies, OP_READ, OP_WRITE};

    use super::*;
    use crate::{
        collect::collector::LatencyDelta,
        events::{CgroupGone, CgroupStats, DeviceStats, Limit},
        policy::Cause,
    };

    pub const VDA: u32 = isolator_common::kernel_dev(254, 0);

    /// A key's cycle: `n` requests of `bytes` each, every one `device_ns` at the device
    /// and `queue_ns` in the queue.
    pub fn delta(cgroup: u64, op: u32, n: u64, device_ns: u64, queue_ns: u64) -> KeyDelta {
        let lat = |ns: u64| LatencyDelta {
            count: n,
            sum_ns: n * ns,
            hist: vec![(latency_bucket(ns) as u16, n)],
        };
        KeyDelta {
            key: IoKey {
                cgroup_id: cgroup,
                dev: VDA,
                op,
            },
            ios: n,
            bytes: n * 4096,
            latency: Latencies {
                device: lat(device_ns),
                queue: lat(queue_ns),
                total: lat(device_ns + queue_ns),
            },
            issued: n > 0,
            ..Default::default()
        }
    }

    pub fn named(id: u64, path: &str) -> Event {
        Event::CgroupStats(CgroupStats {
            cgroup: CgroupRef {
                id,
                path: Some(path.into()),
                name: path.rsplit('/').next().unwrap().into(),
                ..Default::default()
            },
            devices: vec![DeviceStats {
                dev: "254:0".into(),
                disk: Some("vda".into()),
                ..Default::default()
            }],
            ..Default::default()
        })
    }

    fn snap(cycle: u64, deltas: Vec<KeyDelta>) -> Snapshot {
        Snapshot {
            cycle,
            interval_ns: 1_000_000_000,
            deltas,
            ..Default::default()
        }
    }

    fn stats(service: &str, cgroups: &[u64], state: &str, limit: IoMaxLimit) -> Event {
        Event::ServiceStats(ServiceStats {
            service: service.into(),
            slo: SloClass::latency_p999(5_000_000),
            dev: "254:0".into(),
            disk: Some("vda".into()),
            state: state.into(),
            p999_ns: Some(700_000),
            samples: 1000,
            cgroups: cgroups.to_vec(),
            limit,
            ..Default::default()
        })
    }

    fn decision(service: &str, knob: &str, to: Option<u64>, applied: bool, victim: bool) -> Event {
        Event::Decision(Decision {
            service: service.into(),
            dev: Some("254:0".into()),
            knob: knob.into(),
            decided: Some(Limit::from(to)),
            applied,
            cause: Some(Cause {
                victim: victim.then(|| "db".into()),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    fn step(m: &mut Model, cycle: u64, deltas: Vec<KeyDelta>, cgroups: &[Event], events: &[Event]) {
        m.apply(&CycleInput {
            snap: &snap(cycle, deltas),
            cgroups,
            events,
            collect_ns: 1_000_000,
        });
    }

    fn cgroup<'a>(m: &'a Model, path: &str) -> &'a CgroupSeries {
        &m.cgroups[&(path.to_string(), VDA)]
    }

    #[test]
    fn counts_and_histograms_accumulate_per_cgroup_and_disk() {
        let mut m = Model::new("test", DEFAULT_MAX_SERIES, false, false);
        let names = [named(7, "/db")];
        for c in 1..=3 {
            let deltas = vec![
                delta(7, OP_READ, 100, 200_000, 30_000),
                delta(7, OP_WRITE, 10, 3_000_000, 0),
            ];
            step(&mut m, c, deltas, &names, &[]);
        }
        let s = cgroup(&m, "/db");
        assert_eq!(s.io.requests, [300, 30, 0]);
        assert_eq!(s.io.bytes, [300 * 4096, 30 * 4096, 0]);
        assert_eq!(s.io.device_latency.count(), 330);
        assert_eq!(s.io.device_latency.slots[4], 300); // <= 250 us
        assert_eq!(s.io.device_latency.slots[8], 30); // <= 5 ms
        assert_eq!(s.io.total_latency.slots[4], 300); // 230 us
        assert_eq!(
            s.io.device_latency.sum_ns,
            3 * (100 * 200_000 + 10 * 3_000_000)
        );
        assert_eq!(s.io.queued_requests, 330);
        assert_eq!(s.io.queue_ns, 3 * 100 * 30_000);
        assert!(
            s.io.inflight.is_none(),
            "not counted without --count-inflight"
        );
        // Little's law over the last cycle: 100 x 0.2 ms + 10 x 3 ms in 1 s.
        assert!((s.io.mean_inflight - 0.05).abs() < 1e-9);
        let labels: Vec<_> = s.labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
        assert_eq!(
            labels,
            [("cgroup", "/db"), ("kind", "cgroup"), ("device", "vda")]
        );
        assert_eq!(m.agent.collect_duration.count(), 3);
    }

    #[test]
    fn services_sum_their_cgroups_and_follow_their_events() {
        let mut m = Model::new("test", DEFAULT_MAX_SERIES, false, false);
        let names = [named(7, "/db-a"), named(8, "/db-b"), named(9, "/backup")];
        let limit = IoMaxLimit {
            wbps: Some(100 << 20),
            ..Default::default()
        };
        let events = [
            stats("db", &[7, 8], "violating", IoMaxLimit::default()),
            stats("backup", &[9], "throttled", limit),
            decision("backup", "wbps", Some(50 << 20), true, true),
            Event::ViolationStart(crate::events::ViolationInfo {
                service: "db".into(),
                dev: "254:0".into(),
                ..Default::default()
            }),
            Event::DiskStall(crate::events::DiskStall {
                service: "db".into(),
                dev: "254:0".into(),
                ..Default::default()
            }),
        ];
        let deltas = vec![
            delta(7, OP_READ, 100, 200_000, 0),
            delta(8, OP_READ, 50, 400_000, 0),
            delta(9, OP_WRITE, 20, 8_000_000, 1_000_000),
        ];
        step(&mut m, 1, deltas, &names, &events);
        let db = &m.services[&("db".to_string(), "254:0".to_string())];
        assert_eq!(db.io.requests[OP_READ as usize], 150);
        assert_eq!(db.io.total_latency.count(), 150);
        assert_eq!(
            (db.p999_ns, db.samples, db.window_s),
            (Some(700_000), 1000, 1.0)
        );
        assert_eq!(db.state, Some(State::Violating));
        assert_eq!(db.violations, 1);
        assert_eq!(db.stalls, 1);
        // The cgroups carry their service.
        assert!(cgroup(&m, "/db-b")
            .labels
            .contains(&("service", "db".into())));
        let backup = &m.services[&("backup".to_string(), "254:0".to_string())];
        // The decision of the cycle is in force on top of what service_stats said.
        assert_eq!(backup.limit.wbps, Some(50 << 20));
        let info = &m.service_info["backup"];
        assert_eq!(
            info.decisions.get(&("vda".into(), "wbps", "protect", true)),
            Some(&1)
        );
        assert_eq!(m.service_info["db"].slo, SloClass::latency_p999(5_000_000));

        // Next cycle: nothing in force any more (the controller forgot it), no I/O.
        step(
            &mut m,
            2,
            vec![],
            &[],
            &[stats("backup", &[], "ok", IoMaxLimit::default())],
        );
        let backup = &m.services[&("backup".to_string(), "254:0".to_string())];
        assert_eq!(backup.limit, IoMaxLimit::default());
        let db = &m.services[&("db".to_string(), "254:0".to_string())];
        assert_eq!(
            (db.p999_ns, db.state),
            (None, None),
            "no service_stats, no p99.9"
        );
        assert_eq!(db.io.requests[OP_READ as usize], 150, "counters stay");
    }

    #[test]
    fn decision_reasons_are_a_fixed_set() {
        let reason = |e: Event, in_force| match e {
            Event::Decision(d) => decision_reason(&d, in_force),
            _ => unreachable!(),
        };
        assert_eq!(
            reason(decision("b", "wbps", Some(10), true, true), Some(20)),
            "protect"
        );
        assert_eq!(
            reason(decision("b", "wbps", Some(10), true, true), None),
            "protect"
        );
        assert_eq!(
            reason(decision("b", "wbps", Some(10), true, false), None),
            "cap"
        );
        assert_eq!(
            reason(decision("b", "wbps", Some(30), true, true), Some(20)),
            "relax"
        );
        assert_eq!(
            reason(decision("b", "wbps", None, true, false), Some(20)),
            "remove"
        );
        let mut w = decision("b", "weight", None, true, false);
        if let Event::Decision(d) = &mut w {
            d.decided = None;
        }
        assert_eq!(reason(w, None), "weight");
    }

    #[test]
    fn a_host_wide_decision_makes_no_service_series() {
        let mut m = Model::new("test", DEFAULT_MAX_SERIES, false, false);
        let mut e = decision("", "iocost", None, true, false);
        if let Event::Decision(d) = &mut e {
            d.decided = None;
            d.cause = None;
        }
        step(&mut m, 1, vec![], &[], &[e]);
        assert!(m.service_info.is_empty(), "{:?}", m.service_info.keys());
    }

    #[test]
    fn idle_pairs_leave_and_gone_cgroups_leave_at_once() {
        let mut m = Model::new("test", DEFAULT_MAX_SERIES, false, false);
        let names = [named(7, "/a"), named(8, "/b")];
        step(
            &mut m,
            1,
            vec![delta(7, OP_READ, 1, 1000, 0), delta(8, OP_READ, 1, 1000, 0)],
            &names,
            &[],
        );
        assert_eq!(m.exposition.reserved, 2 * CGROUP_SERIES);
        let gone = Event::CgroupGone(CgroupGone {
            cycle: 2,
            cgroup: CgroupRef {
                id: 8,
                path: Some("/b".into()),
                ..Default::default()
            },
        });
        step(&mut m, 2, vec![], &[], &[gone]);
        assert!(!m.cgroups.contains_key(&("/b".to_string(), VDA)));
        for c in 3..=IDLE_CYCLES as u64 + 1 {
            step(&mut m, c, vec![], &[], &[]);
        }
        assert!(
            m.cgroups.contains_key(&("/a".to_string(), VDA)),
            "idle {IDLE_CYCLES}: stays"
        );
        step(&mut m, IDLE_CYCLES as u64 + 2, vec![], &[], &[]);
        assert!(m.cgroups.is_empty(), "idle longer: leaves");
        assert_eq!(m.exposition.reserved, 0);
    }

    #[test]
    fn the_series_cap_leaves_new_pairs_out_counted_once_until_room() {
        let mut m = Model::new("test", 2 * CGROUP_SERIES, false, false);
        let names = [named(1, "/a"), named(2, "/b"), named(3, "/c")];
        let all = || {
            vec![
                delta(1, OP_READ, 1, 1000, 0),
                delta(2, OP_READ, 1, 1000, 0),
                delta(3, OP_READ, 1, 1000, 0),
            ]
        };
        step(&mut m, 1, all(), &names, &[]);
        step(&mut m, 2, all(), &names, &[]);
        assert_eq!(m.cgroups.len(), 2);
        assert!(!m.cgroups.contains_key(&("/c".to_string(), VDA)));
        assert_eq!(m.exposition.left_out_total, [1, 0], "counted once per stay");
        assert_eq!(m.exposition.left_out_now, [1, 0]);
        // /a goes: /c gets its place at its next I/O.
        let gone = Event::CgroupGone(CgroupGone {
            cycle: 3,
            cgroup: CgroupRef {
                id: 1,
                path: Some("/a".into()),
                ..Default::default()
            },
        });
        step(&mut m, 3, vec![], &[], &[gone]);
        step(&mut m, 4, vec![delta(3, OP_READ, 1, 1000, 0)], &names, &[]);
        assert!(m.cgroups.contains_key(&("/c".to_string(), VDA)));
        assert_eq!(m.exposition.left_out_now, [0, 0]);
        assert!(m.exposition.reserved <= m.exposition.max_series);
    }

    #[test]
    fn a_renamed_cgroup_keeps_its_counts_under_its_new_labels() {
        let mut m = Model::new("test", DEFAULT_MAX_SERIES, false, false);
        let mut ev = named(7, "/docker/abc");
        if let Event::CgroupStats(s) = &mut ev {
            s.cgroup.kind = ServiceKind::Container;
            s.cgroup.name = "abc".into();
        }
        step(
            &mut m,
            1,
            vec![delta(7, OP_READ, 5, 1000, 0)],
            &[ev.clone()],
            &[],
        );
        if let Event::CgroupStats(s) = &mut ev {
            s.cgroup.name = "web".into();
        }
        step(&mut m, 2, vec![delta(7, OP_READ, 5, 1000, 0)], &[ev], &[]);
        let c = cgroup(&m, "/docker/abc");
        assert!(c.labels.contains(&("container", "web".into())));
        assert_eq!(c.io.requests[0], 10);
        assert_eq!(m.cgroups.len(), 1);
    }

    #[test]
    fn a_pods_container_is_labelled_by_namespace_pod_and_container() {
        let cg = CgroupRef {
            id: 9,
            kind: ServiceKind::Container,
            name: "shop/web/nginx".into(),
            pod_uid: Some("u1".into()),
            pod_namespace: Some("shop".into()),
            pod_name: Some("web".into()),
            pod_container: Some("nginx".into()),
            ..Default::default()
        };
        let l = cgroup_labels(&cg, Some("frontend"), "vda");
        for want in [
            ("container", "nginx"),
            ("namespace", "shop"),
            ("pod", "web"),
            ("pod_uid", "u1"),
            ("service", "frontend"),
            ("device", "vda"),
        ] {
            assert!(l.contains(&want), "{want:?} missing from {l:?}");
        }
    }

    #[test]
    fn containerd_discovery_follows_its_events() {
        let mut m = Model::new("test", DEFAULT_MAX_SERIES, false, true);
        assert!(!m.agent.discovery["containerd"].up);
        m.apply_event(
            &Event::ContainerdConnected(crate::events::ContainerdConnected {
                containers: 3,
                ..Default::default()
            }),
            1_000_000_000,
        );
        assert!(m.agent.discovery["containerd"].up);
        assert_eq!(m.agent.discovery["containerd"].containers, Some(3));
        m.apply_event(&Event::warning("containerd_down", "x"), 1_000_000_000);
        assert!(!m.agent.discovery["containerd"].up);
        assert!(!m.agent.discovery.contains_key("docker"));
    }

    #[test]
    fn agent_figures_follow_cycle_end_docker_and_notices() {
        let mut m = Model::new("test", DEFAULT_MAX_SERIES, true, false);
        assert!(!m.agent.discovery["docker"].up);
        let end = Event::CycleEnd(CycleEnd {
            cycle: 4,
            tracked_keys: 12,
            evicted_keys: 2,
            map_full: 3,
            collect_us: 1500,
            docker_containers: Some(5),
            disks: vec![crate::events::DiskCycle {
                dev: "254:0".into(),
                disk: Some("vda".into()),
                utilization: 0.5,
                unseen_completions: Some(7),
            }],
            ..Default::default()
        });
        let events = [
            Event::DockerConnected(crate::events::DockerConnected {
                containers: 4,
                ..Default::default()
            }),
            Event::warning("docker_down", "x"),
            Event::warning("docker_down", "x"),
            end.clone(),
        ];
        step(&mut m, 4, vec![], &[], &events);
        step(&mut m, 5, vec![], &[], &[end]);
        let a = &m.agent;
        assert_eq!(
            (a.cycles, a.tracked_keys, a.evicted_keys, a.map_full),
            (4, 12, 4, 3)
        );
        assert_eq!(a.cycle_duration.count(), 2);
        assert!(!a.discovery["docker"].up);
        assert_eq!(a.discovery["docker"].containers, Some(5));
        assert_eq!(a.notices[&("warning", "docker_down".to_string())], 2);
        assert_eq!(a.disks["vda"], 0.5);
        assert_eq!(a.disks_unseen["vda"], 7);
    }
}
