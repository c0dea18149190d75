//! What `isolator top` shows, built from the agent's event stream alone (no terminal, no
//! kernel): rows are committed at each `cycle_end`, so the view never shows half a cycle.
//! Events are read into the agent's own event types ([`crate::events`]): a field the agent
//! renames is a compile error here, not a blank column.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use crate::{
    config::{LatencyQuantile, SloClass},
    events::{
        AgentStart, CgroupStats, CycleEnd, Decision, Event, LabelSloInfo, RecordedEvent,
        ServiceStats, ViolationInfo, SCHEMA_VERSION,
    },
    measure::{character::Character, metrics::LatencySummary},
    policy::IoMaxLimit,
};

pub use crate::events::ReadError as StreamError;

/// The event schema this view understands.
pub const SCHEMA: u64 = SCHEMA_VERSION as u64;
/// Points of history kept per row: five minutes at the default 1 s cycle.
pub const HISTORY: usize = 300;
/// Actions kept for the action log.
const ACTIONS: usize = 1000;
/// Cycles an idle cgroup keeps its row (so bursty I/O does not make rows blink).
const IDLE_GRACE_CYCLES: u64 = 10;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum State {
    Unconfigured,
    Ok,
    Throttled,
    Violating,
}

impl State {
    pub fn label(self) -> &'static str {
        match self {
            State::Unconfigured => "unconfigured",
            State::Ok => "ok",
            State::Throttled => "throttled",
            State::Violating => "violating",
        }
    }

    fn parse(s: &str) -> State {
        match s {
            "violating" => State::Violating,
            "throttled" => State::Throttled,
            _ => State::Ok,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RowKey {
    Service(String),
    Cgroup(u64),
}

/// One operation class of one cgroup on one disk, for the detail pane.
#[derive(Clone, Debug, PartialEq)]
pub struct OpLatency {
    pub disk: String,
    pub op: String,
    pub latency: LatencySummary,
}

/// One cycle of a row's history.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Point {
    pub p999_ns: Option<u64>,
    pub mbps: f64,
    pub limit_bps: Option<u64>,
}

/// A row's last minutes, one point per cycle, oldest first.
#[derive(Clone, Debug, Default)]
pub struct History(pub VecDeque<Point>);

impl History {
    fn push(&mut self, p: Point) {
        if self.0.len() == HISTORY {
            self.0.pop_front();
        }
        self.0.push_back(p);
    }
}

/// One service (a configured or labelled one) or one unconfigured cgroup.
#[derive(Clone, Debug)]
pub struct Row {
    pub key: RowKey,
    pub name: String,
    /// `container`, `pod`, `unit`, `cgroup`; a service takes its cgroups' kind when they
    /// agree, else `service`.
    pub kind: String,
    pub slo: Option<SloClass>,
    pub p50_ns: Option<u64>,
    pub p999_ns: Option<u64>,
    /// For a latency SLO at another quantile than p99.9: the latency there, the worst over
    /// the service's disks (`service_stats.slo_latency_ns`).
    pub slo_latency_ns: Option<u64>,
    /// Requests behind `p999_ns`.
    pub samples: u64,
    pub read_mbps: f64,
    pub write_mbps: f64,
    pub iops: f64,
    pub inflight: f64,
    pub limit: IoMaxLimit,
    pub state: State,
    pub vio: Option<f64>,
    /// Services: this cycle's latency in power-of-two buckets (upper bound ns, count).
    pub latency_log2: Vec<(u64, u64)>,
    /// Unconfigured cgroups: percentiles per disk and operation.
    pub latency_by_op: Vec<OpLatency>,
    /// Cgroup paths (a service's: those with I/O this cycle).
    pub cgroups: Vec<String>,
    pub disks: Vec<String>,
    /// The I/O character over its window, per disk (disk name, character).
    pub characters: Vec<(String, Character)>,
    pub last_active_cycle: u64,
    pub history: History,
}

impl Row {
    fn new(key: RowKey, name: String) -> Row {
        Row {
            key,
            name,
            kind: String::new(),
            slo: None,
            p50_ns: None,
            p999_ns: None,
            slo_latency_ns: None,
            samples: 0,
            read_mbps: 0.0,
            write_mbps: 0.0,
            iops: 0.0,
            inflight: 0.0,
            limit: IoMaxLimit::default(),
            state: State::Unconfigured,
            vio: None,
            latency_log2: vec![],
            latency_by_op: vec![],
            characters: vec![],
            cgroups: vec![],
            disks: vec![],
            last_active_cycle: 0,
            history: History::default(),
        }
    }

    /// A cycle without I/O: rates are zero, latency unknown; state and limit stay.
    fn idle(&mut self) {
        self.p50_ns = None;
        self.p999_ns = None;
        self.slo_latency_ns = None;
        self.samples = 0;
        self.read_mbps = 0.0;
        self.write_mbps = 0.0;
        self.iops = 0.0;
        self.inflight = 0.0;
        self.vio = None;
        self.latency_log2.clear();
        self.latency_by_op.clear();
        self.characters.clear();
        if self.state == State::Violating {
            self.state = State::Ok;
        }
    }

    pub fn mbps(&self) -> f64 {
        self.read_mbps + self.write_mbps
    }

    /// Words a filter matches against.
    fn matches(&self, needle: &str) -> bool {
        let hay = |s: &str| s.to_lowercase().contains(needle);
        hay(&self.name)
            || hay(&self.kind)
            || hay(self.state.label())
            || self.slo.as_ref().is_some_and(|s| hay(s.name()))
            || self.cgroups.iter().any(|c| hay(c))
            || self.disks.iter().any(|d| hay(d))
    }
}

/// A disk's totals over all cgroups this cycle.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Disk {
    pub dev: String,
    pub name: Option<String>,
    pub utilization: f64,
    pub read_mbps: f64,
    pub write_mbps: f64,
    pub iops: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActionKind {
    Decision,
    ViolationStart,
    ViolationEnd,
    Restore,
    Warning,
    Error,
    Info,
}

/// Something the agent did or said, for the action log.
#[derive(Clone, Debug, PartialEq)]
pub struct Action {
    /// Wall-clock time of the event, HH:MM:SS (UTC, as the agent wrote it).
    pub time: String,
    pub cycle: Option<u64>,
    pub kind: ActionKind,
    pub service: Option<String>,
    pub cgroups: Vec<String>,
    pub text: String,
}

/// Where the events come from and whether they still do.
#[derive(Clone, Debug, PartialEq)]
pub enum Link {
    Connecting,
    Live,
    /// The agent said agent_stop.
    Stopped(String),
    /// The stream broke without agent_stop.
    Lost(String),
}

#[derive(Default, Clone)]
struct Pending {
    cgroups: Vec<CgroupCycle>,
    services: Vec<ServiceStats>,
}

/// What a row shows of one cgroup's cycle, taken from its `cgroup_stats`.
#[derive(Clone)]
struct CgroupCycle {
    id: u64,
    name: String,
    kind: String,
    path: Option<String>,
    read_mbps: f64,
    write_mbps: f64,
    iops: f64,
    inflight: f64,
    ops: Vec<OpLatency>,
    /// dev -> (disk, read MB/s, write MB/s, IOPS)
    by_dev: Vec<(String, Option<String>, f64, f64, f64)>,
    characters: Vec<(String, Character)>,
}

#[derive(Clone)]
pub struct Model {
    /// The running agent's `agent_start` (None before one arrived).
    pub header: Option<AgentStart>,
    pub disks: Vec<Disk>,
    pub cycle: u64,
    pub link: Link,
    pub actions: VecDeque<Action>,
    rows: BTreeMap<RowKey, Row>,
    pending: Pending,
    /// cgroup id -> (kind, path), from cgroup_stats, to name a service's cgroups.
    cgroups: HashMap<u64, (String, Option<String>)>,
}

impl Default for Model {
    fn default() -> Self {
        Model {
            header: None,
            disks: vec![],
            cycle: 0,
            link: Link::Connecting,
            actions: VecDeque::new(),
            rows: BTreeMap::new(),
            pending: Pending::default(),
            cgroups: HashMap::new(),
        }
    }
}

/// One NDJSON line as an event this view understands: JSON, with this schema.
pub fn parse_event(line: &str) -> Result<RecordedEvent, StreamError> {
    RecordedEvent::parse(line)
}

/// A limit as written to the cgroup file, in words: `max` (v2) and `0` (v1) are unlimited,
/// bytes/s are MB/s.
fn knob_value(knob: &str, value: &str) -> String {
    match value.parse::<u64>() {
        _ if value == "max" => "unlimited".into(),
        Ok(0) if knob != "weight" => "unlimited".into(),
        Ok(v) if knob.ends_with("bps") => format!("{:.1} MB/s", v as f64 / 1e6),
        Ok(v) if knob.ends_with("iops") => format!("{v} IOPS"),
        _ => value.to_string(),
    }
}

/// Latency in words for action texts: 812us, 12.3ms, 1.20s.
pub fn latency_words(ns: u64) -> String {
    let ns = ns as f64;
    if ns < 1e6 {
        format!("{:.0}us", ns / 1e3)
    } else if ns < 1e9 {
        format!("{:.1}ms", ns / 1e6)
    } else {
        format!("{:.2}s", ns / 1e9)
    }
}

/// A latency, if any, in at most 7 characters ("-" without one).
pub fn ns(v: Option<u64>) -> String {
    v.map(latency_words).unwrap_or_else(|| "-".into())
}

impl Model {
    /// Takes one NDJSON line from the agent.
    pub fn ingest_line(&mut self, line: &str) -> Result<(), StreamError> {
        let e = parse_event(line)?;
        self.ingest(&e);
        Ok(())
    }

    /// Takes one event of this schema.
    pub fn ingest(&mut self, recorded: &RecordedEvent) {
        let time = recorded.ts.get(11..19).unwrap_or_default().to_string();
        let action = |kind: ActionKind,
                      cycle: Option<u64>,
                      service: Option<String>,
                      cgroups: Vec<String>,
                      text: String| Action {
            time: time.clone(),
            cycle,
            kind,
            service,
            cgroups,
            text,
        };
        match &recorded.event {
            Event::AgentStart(start) => {
                let restarted = self.header.is_some();
                let h = start.clone();
                let text = format!(
                    "agent {} started (pid {}, {}{})",
                    h.version,
                    h.pid,
                    h.policy.as_deref().unwrap_or("observe only"),
                    if h.dry_run { ", dry run" } else { "" }
                );
                if restarted {
                    self.push_action(action(ActionKind::Info, None, None, vec![], text));
                    // Cycle numbers start again from 1.
                    for r in self.rows.values_mut() {
                        r.last_active_cycle = 0;
                    }
                }
                self.header = Some(h);
                self.pending = Pending::default();
                self.link = Link::Live;
            }
            Event::CgroupStats(c) => {
                let c = cgroup_cycle(c);
                self.cgroups.insert(c.id, (c.kind.clone(), c.path.clone()));
                self.pending.cgroups.push(c);
            }
            Event::ServiceStats(s) => self.pending.services.push(s.clone()),
            Event::CycleEnd(end) => self.commit(end),
            Event::CgroupGone(g) => {
                self.rows.remove(&RowKey::Cgroup(g.cgroup.id));
                self.cgroups.remove(&g.cgroup.id);
            }
            Event::Decision(d) => {
                let text = decision_text(d);
                let a = action(
                    ActionKind::Decision,
                    Some(d.cycle),
                    Some(d.service.clone()),
                    d.cgroups.clone(),
                    text,
                );
                self.push_action(a);
            }
            Event::ViolationStart(v) | Event::ViolationEnd(v) => {
                let (kind, what) = match &recorded.event {
                    Event::ViolationStart(_) => (ActionKind::ViolationStart, "violates its SLO"),
                    _ => (ActionKind::ViolationEnd, "meets its SLO again"),
                };
                let text = format!(
                    "{} {what} on {}: {}",
                    v.service,
                    v.dev,
                    violation_numbers(v)
                );
                let a = action(kind, Some(v.cycle), Some(v.service.clone()), vec![], text);
                self.push_action(a);
            }
            Event::Restore(r) => {
                let text = format!(
                    "restored {} {} = {} ({}, {})",
                    r.file, r.knob, r.value, r.result, r.reason
                );
                self.push_action(action(ActionKind::Restore, None, None, vec![], text));
            }
            Event::Warning(n) => {
                let text = format!("warning {}: {}", n.code, n.message);
                self.push_action(action(ActionKind::Warning, None, None, vec![], text));
            }
            Event::Error(n) => {
                let text = format!("error {}: {}", n.code, n.message);
                self.push_action(action(ActionKind::Error, None, None, vec![], text));
            }
            Event::CharacterChange(c) => {
                let name = |k: Option<crate::measure::character::CharacterClass>| {
                    k.map_or("?", |k| k.as_str())
                };
                let text = format!(
                    "{} on {} turned {} -> {} ({:.0} % reads, {:.0} % sequential)",
                    c.service,
                    c.disk.as_deref().unwrap_or(&c.dev),
                    name(c.from),
                    name(c.to),
                    c.character.read_ios_fraction * 100.0,
                    c.character.sequential_fraction * 100.0
                );
                let a = action(
                    ActionKind::Info,
                    Some(c.cycle),
                    Some(c.service.clone()),
                    vec![],
                    text,
                );
                self.push_action(a);
            }
            Event::SloInfeasible(f) => {
                // An SLO at another quantile is said at it (`quantile` set).
                let l = &f.latency;
                let (q, latency, slo) = match l.quantile {
                    Some(q) => (q.label(), l.latency_ns, l.slo_latency_ns),
                    None => ("p99.9", l.p999_ns, l.slo_p999_ns),
                };
                let text = format!(
                    "{} cannot meet its SLO on {}: {q} {} over {}, others at {:.0} MB/s; {} ({})",
                    f.service,
                    f.dev,
                    ns(latency),
                    ns(slo),
                    f.others_bps / 1e6,
                    f.reason,
                    f.action
                );
                let a = action(
                    ActionKind::Warning,
                    Some(f.cycle),
                    Some(f.service.clone()),
                    vec![],
                    text,
                );
                self.push_action(a);
            }
            Event::DiskStall(f) => {
                let l = &f.latency;
                let (q, latency, slo, level) = match l.quantile {
                    Some(q) => (
                        q.label(),
                        l.latency_ns,
                        l.slo_latency_ns,
                        f.level_latency_ns,
                    ),
                    None => ("p99.9", l.p999_ns, l.slo_p999_ns, f.level_p999_ns),
                };
                let text = format!(
                    "{} over its SLO on {} in a stall of the disk: {q} {} over {} where the last cycles gave {}, others at {:.0} MB/s; {}",
                    f.service,
                    f.dev,
                    ns(latency),
                    ns(slo),
                    ns(level),
                    f.others_bps / 1e6,
                    f.action
                );
                let a = action(
                    ActionKind::Warning,
                    Some(f.cycle),
                    Some(f.service.clone()),
                    vec![],
                    text,
                );
                self.push_action(a);
            }
            Event::LabelSlo(l) => {
                // A released service's row goes, and so does a renamed one's old row (its
                // next cycle comes under the new name).
                let gone = match l.outcome.as_str() {
                    "released" => l.service.as_ref(),
                    "renamed" => l.renamed_from.as_ref(),
                    _ => None,
                };
                if let Some(s) = gone {
                    self.rows.remove(&RowKey::Service(s.clone()));
                }
                let text = label_text(l);
                let a = action(ActionKind::Info, None, l.service.clone(), vec![], text);
                self.push_action(a);
            }
            Event::DockerConnected(d) => {
                let text = format!(
                    "Docker answers on {} (API {}, {} containers)",
                    d.socket, d.api_version, d.containers
                );
                self.push_action(action(ActionKind::Info, None, None, vec![], text));
            }
            Event::ContainerdConnected(d) => {
                let text = format!(
                    "containerd {} answers on {} ({} containers in {})",
                    d.version, d.socket, d.containers, d.namespace
                );
                self.push_action(action(ActionKind::Info, None, None, vec![], text));
            }
            Event::AgentStop(stop) => {
                let text = format!(
                    "agent stopped ({}) after {} cycles",
                    stop.reason, stop.cycles
                );
                self.push_action(action(ActionKind::Info, None, None, vec![], text));
                self.link = Link::Stopped(stop.reason.clone());
            }
            // The policy's input is for replay, not for the view; unknown types are a
            // newer agent's additions within the schema.
            Event::PolicyInput(_) | Event::Unknown => {}
        }
    }

    fn push_action(&mut self, a: Action) {
        if self.actions.len() == ACTIONS {
            self.actions.pop_front();
        }
        self.actions.push_back(a);
    }

    /// The stream broke: rows stay as they were, the status says why.
    pub fn lost(&mut self, why: String) {
        if !matches!(self.link, Link::Stopped(_)) {
            self.link = Link::Lost(why);
        }
        self.pending = Pending::default();
    }

    fn commit(&mut self, end: &CycleEnd) {
        // Cycles count from 1: a cycle_end without a number follows the last one.
        let cycle = if end.cycle == 0 {
            self.cycle.saturating_add(1)
        } else {
            end.cycle
        };
        self.cycle = cycle;
        let pending = std::mem::take(&mut self.pending);

        // Disks: utilization from cycle_end, traffic summed over the cgroups.
        let mut disks: BTreeMap<String, Disk> = BTreeMap::new();
        for d in &end.disks {
            disks.insert(
                d.dev.clone(),
                Disk {
                    dev: d.dev.clone(),
                    name: d.disk.clone(),
                    utilization: d.utilization,
                    ..Disk::default()
                },
            );
        }
        for c in &pending.cgroups {
            for (dev, name, r, w, iops) in &c.by_dev {
                let d = disks.entry(dev.clone()).or_insert_with(|| Disk {
                    dev: dev.clone(),
                    name: name.clone(),
                    ..Disk::default()
                });
                d.read_mbps += r;
                d.write_mbps += w;
                d.iops += iops;
            }
        }
        self.disks = disks.into_values().collect();

        let mut touched: BTreeSet<RowKey> = BTreeSet::new();
        let mut claimed: BTreeSet<u64> = BTreeSet::new();
        let mut by_service: BTreeMap<String, Vec<ServiceStats>> = BTreeMap::new();
        for s in pending.services {
            claimed.extend(&s.cgroups);
            by_service.entry(s.service.clone()).or_default().push(s);
        }
        for (name, parts) in by_service {
            let key = RowKey::Service(name.clone());
            let kinds: BTreeSet<&str> = parts
                .iter()
                .flat_map(|p| &p.cgroups)
                .filter_map(|id| self.cgroups.get(id).map(|(k, _)| k.as_str()))
                .collect();
            let paths: BTreeSet<String> = parts
                .iter()
                .flat_map(|p| &p.cgroups)
                .filter_map(|id| self.cgroups.get(id).and_then(|(_, p)| p.clone()))
                .collect();
            let row = self
                .rows
                .entry(key.clone())
                .or_insert_with(|| Row::new(key.clone(), name.clone()));
            aggregate_service(row, &parts);
            match kinds.len() {
                0 if row.kind.is_empty() => row.kind = "service".into(),
                0 => {}
                1 => row.kind = kinds.into_iter().next().unwrap_or("service").into(),
                _ => row.kind = "service".into(),
            }
            if !paths.is_empty() {
                row.cgroups = paths.into_iter().collect();
            }
            if row.samples > 0 || row.mbps() > 0.0 {
                row.last_active_cycle = cycle;
            }
            touched.insert(key);
        }
        for c in pending.cgroups {
            if claimed.contains(&c.id) {
                continue;
            }
            let key = RowKey::Cgroup(c.id);
            let row = self
                .rows
                .entry(key.clone())
                .or_insert_with(|| Row::new(key.clone(), c.name.clone()));
            fill_cgroup(row, c);
            row.last_active_cycle = cycle;
            touched.insert(key);
        }
        // A cgroup now claimed by a service (a label applied) is no longer its own row.
        self.rows
            .retain(|k, _| !matches!(k, RowKey::Cgroup(id) if claimed.contains(id)));
        for (key, row) in self.rows.iter_mut() {
            if !touched.contains(key) {
                row.idle();
            }
            row.history.push(Point {
                p999_ns: row.p999_ns,
                mbps: row.mbps(),
                limit_bps: row.limit.total_bps(),
            });
        }
        // Idle unconfigured cgroups leave after a grace; services stay once seen.
        self.rows.retain(|k, r| {
            matches!(k, RowKey::Service(_))
                || cycle.saturating_sub(r.last_active_cycle) <= IDLE_GRACE_CYCLES
        });
    }

    pub fn rows(&self) -> impl Iterator<Item = &Row> {
        self.rows.values()
    }

    pub fn row(&self, key: &RowKey) -> Option<&Row> {
        self.rows.get(key)
    }

    /// The rows a view shows: filtered (case-insensitive substring of name, kind, class,
    /// state, cgroup path or disk), then sorted.
    pub fn visible(&self, sort: Column, reverse: bool, filter: &str) -> Vec<&Row> {
        let needle = filter.to_lowercase();
        let mut rows: Vec<&Row> = self
            .rows
            .values()
            .filter(|r| needle.is_empty() || r.matches(&needle))
            .collect();
        rows.sort_by(|a, b| {
            let o = sort.compare(a, b);
            let o = if reverse { o.reverse() } else { o };
            o.then_with(|| b.mbps().total_cmp(&a.mbps()))
                .then_with(|| a.name.cmp(&b.name))
        });
        rows
    }

    /// Recent actions concerning one row (its service name or one of its cgroups).
    pub fn actions_of<'a>(&'a self, row: &'a Row) -> impl Iterator<Item = &'a Action> + 'a {
        self.actions.iter().rev().filter(move |a| match &row.key {
            RowKey::Service(s) => a.service.as_deref() == Some(s),
            RowKey::Cgroup(_) => a.cgroups.iter().any(|c| row.cgroups.contains(c)),
        })
    }
}

/// A decision in words: `backup: wbps unlimited -> 115.6 MB/s on 254:0: <reason>`.
fn decision_text(d: &Decision) -> String {
    format!(
        "{}: {} {} -> {}{}{}: {}",
        // A host-wide knob (iocost) is no service's.
        if d.service.is_empty() {
            "host"
        } else {
            &d.service
        },
        d.knob,
        knob_value(&d.knob, &d.old),
        knob_value(&d.knob, &d.new),
        d.dev
            .as_deref()
            .filter(|dev| !dev.is_empty())
            .map(|dev| format!(" on {dev}"))
            .unwrap_or_default(),
        if d.applied { "" } else { " (not applied)" },
        d.reason
    )
}

/// A violation's numbers against its SLO.
fn violation_numbers(v: &ViolationInfo) -> String {
    match v.slo {
        SloClass::Latency(t) if t.quantile == LatencyQuantile::P999 => {
            format!(
                "p99.9 {} vs SLO {}",
                ns(v.p999_ns),
                latency_words(t.target_ns)
            )
        }
        SloClass::Latency(t) => format!(
            "{q} {} vs SLO {q} {}",
            ns(v.latency_ns),
            latency_words(t.target_ns),
            q = t.quantile.label()
        ),
        SloClass::Throughput { rate_bps } => format!(
            "{:.1} MB/s vs SLO {:.1} MB/s",
            v.rate_bps / 1e6,
            rate_bps as f64 / 1e6
        ),
        SloClass::BestEffort => String::new(),
    }
}

fn label_text(l: &LabelSloInfo) -> String {
    let what = if l.pod_uid.is_some() {
        "pod"
    } else {
        "container"
    };
    format!(
        "{what} {}: label SLO {}: {}",
        l.container, l.outcome, l.message
    )
}

fn cgroup_cycle(v: &CgroupStats) -> CgroupCycle {
    let mut ops = vec![];
    let mut inflight = 0.0;
    let mut by_dev = vec![];
    let mut characters = vec![];
    for d in &v.devices {
        if let Some(c) = &d.character {
            characters.push((d.disk.clone().unwrap_or_else(|| d.dev.clone()), c.clone()));
        }
        let (mut r, mut w, mut iops) = (0.0, 0.0, 0.0);
        for (op, o) in [("read", &d.read), ("write", &d.write), ("other", &d.other)] {
            let Some(o) = o else { continue };
            match op {
                "read" => r += o.mbps,
                "write" => w += o.mbps,
                _ => {}
            }
            iops += o.iops;
            inflight += o.inflight.mean;
            // What the submitter waits (total); device latency where no start time exists.
            let lat = if o.total.samples > 0 {
                &o.total
            } else {
                &o.latency
            };
            ops.push(OpLatency {
                disk: d.disk.clone().unwrap_or_else(|| d.dev.clone()),
                op: op.into(),
                latency: lat.clone(),
            });
        }
        by_dev.push((d.dev.clone(), d.disk.clone(), r, w, iops));
    }
    CgroupCycle {
        id: v.cgroup.id,
        name: v.cgroup.name.clone(),
        kind: v.cgroup.kind.as_str().into(),
        path: v.cgroup.path.clone(),
        read_mbps: v.totals.read_mbps,
        write_mbps: v.totals.write_mbps,
        iops: v.totals.iops,
        inflight,
        ops,
        by_dev,
        characters,
    }
}

/// A service over its disks: the worst state and p99.9, summed traffic, the tightest limit.
fn aggregate_service(row: &mut Row, parts: &[ServiceStats]) {
    row.slo = parts.first().map(|p| p.slo);
    row.state = parts
        .iter()
        .map(|p| State::parse(&p.state))
        .max()
        .unwrap_or(State::Ok);
    let worst = parts
        .iter()
        .filter(|p| p.p999_ns.is_some())
        .max_by_key(|p| p.p999_ns);
    row.p999_ns = worst.and_then(|p| p.p999_ns);
    row.slo_latency_ns = parts.iter().filter_map(|p| p.slo_latency_ns).max();
    row.p50_ns = worst.and_then(|p| p.p50_ns);
    row.samples = worst
        .map(|p| p.samples)
        .unwrap_or_else(|| parts.iter().fold(0, |n, p| n.saturating_add(p.samples)));
    row.read_mbps = parts.iter().map(|p| p.read_mbps).sum();
    row.write_mbps = parts.iter().map(|p| p.write_mbps).sum();
    row.iops = parts.iter().map(|p| p.iops).sum();
    row.inflight = parts.iter().map(|p| p.mean_inflight).sum();
    row.vio = parts.iter().filter_map(|p| p.vio).reduce(f64::max);
    row.limit = parts
        .iter()
        .map(|p| p.limit)
        .fold(IoMaxLimit::default(), IoMaxLimit::tightest);
    let mut log2: BTreeMap<u64, u64> = BTreeMap::new();
    for p in parts {
        for &(upper, n) in &p.latency_log2 {
            // Counts are the agent's word: a wrong one must not overflow the view.
            let count = log2.entry(upper).or_default();
            *count = count.saturating_add(n);
        }
    }
    row.latency_log2 = log2.into_iter().collect();
    row.disks = parts
        .iter()
        .map(|p| p.disk.clone().unwrap_or_else(|| p.dev.clone()))
        .collect();
    row.characters = parts
        .iter()
        .filter_map(|p| {
            let disk = p.disk.clone().unwrap_or_else(|| p.dev.clone());
            p.character.clone().map(|c| (disk, c))
        })
        .collect();
}

fn fill_cgroup(row: &mut Row, c: CgroupCycle) {
    row.name = c.name;
    row.kind = c.kind;
    row.state = State::Unconfigured;
    row.read_mbps = c.read_mbps;
    row.write_mbps = c.write_mbps;
    row.iops = c.iops;
    row.inflight = c.inflight;
    // The row shows its slowest operation's tail; without any p99.9, its busiest one.
    let shown = c
        .ops
        .iter()
        .map(|o| &o.latency)
        .filter(|l| l.p999_ns.is_some())
        .max_by_key(|l| l.p999_ns)
        .or_else(|| c.ops.iter().map(|o| &o.latency).max_by_key(|l| l.samples));
    row.p50_ns = shown.and_then(|l| l.p50_ns);
    row.p999_ns = shown.and_then(|l| l.p999_ns);
    row.samples = shown.map(|l| l.samples).unwrap_or(0);
    row.disks = c
        .by_dev
        .iter()
        .map(|(dev, disk, ..)| disk.clone().unwrap_or_else(|| dev.clone()))
        .collect();
    row.latency_by_op = c.ops;
    row.characters = c.characters;
    row.cgroups = c.path.into_iter().collect();
}

/// The table's columns, in display order; each can be the sort key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Column {
    Name,
    Kind,
    Class,
    Slo,
    P50,
    P999,
    Samples,
    Read,
    Write,
    Iops,
    Inflight,
    Limit,
    State,
    Vio,
}

impl Column {
    pub const ALL: [Column; 14] = [
        Column::Name,
        Column::Kind,
        Column::Class,
        Column::Slo,
        Column::P50,
        Column::P999,
        Column::Samples,
        Column::Read,
        Column::Write,
        Column::Iops,
        Column::Inflight,
        Column::Limit,
        Column::State,
        Column::Vio,
    ];

    pub fn title(self) -> &'static str {
        match self {
            Column::Name => "NAME",
            Column::Kind => "KIND",
            Column::Class => "CLASS",
            Column::Slo => "SLO",
            Column::P50 => "P50",
            Column::P999 => "P99.9",
            Column::Samples => "N",
            Column::Read => "RD MB/s",
            Column::Write => "WR MB/s",
            Column::Iops => "IOPS",
            Column::Inflight => "INFL",
            Column::Limit => "LIMIT",
            Column::State => "STATE",
            Column::Vio => "VIO",
        }
    }

    pub fn next(self) -> Column {
        let i = Column::ALL.iter().position(|&c| c == self).unwrap_or(0);
        Column::ALL[(i + 1) % Column::ALL.len()]
    }

    pub fn prev(self) -> Column {
        let i = Column::ALL.iter().position(|&c| c == self).unwrap_or(0);
        Column::ALL[(i + Column::ALL.len() - 1) % Column::ALL.len()]
    }

    /// Largest, worst or most first; names A to Z.
    fn compare(self, a: &Row, b: &Row) -> std::cmp::Ordering {
        let desc = |x: f64, y: f64| y.total_cmp(&x);
        let opt = |x: Option<u64>, y: Option<u64>| y.cmp(&x);
        match self {
            Column::Name => a.name.cmp(&b.name),
            Column::Kind => a.kind.cmp(&b.kind),
            Column::Class => {
                let c = |r: &Row| r.slo.as_ref().map(|s| s.name()).unwrap_or("~");
                c(a).cmp(c(b))
            }
            Column::Slo => {
                let t = |r: &Row| match r.slo {
                    Some(SloClass::Latency(t)) => Some(t.target_ns),
                    Some(SloClass::Throughput { rate_bps }) => Some(rate_bps),
                    _ => None,
                };
                opt(t(a), t(b))
            }
            Column::P50 => opt(a.p50_ns, b.p50_ns),
            Column::P999 => opt(a.p999_ns, b.p999_ns),
            Column::Samples => b.samples.cmp(&a.samples),
            Column::Read => desc(a.read_mbps, b.read_mbps),
            Column::Write => desc(a.write_mbps, b.write_mbps),
            Column::Iops => desc(a.iops, b.iops),
            Column::Inflight => desc(a.inflight, b.inflight),
            // Tightest limit first; unlimited last.
            Column::Limit => {
                let l = |r: &Row| r.limit.total_bps().unwrap_or(u64::MAX);
                l(a).cmp(&l(b))
            }
            Column::State => b.state.cmp(&a.state),
            Column::Vio => desc(
                a.vio.unwrap_or(f64::NEG_INFINITY),
                b.vio.unwrap_or(f64::NEG_INFINITY),
            ),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use serde_json::Value;

    use super::*;

    /// A real agent's stream (`isolator run --config`, 1 s cycles): `db` (latency, p99.9 <=
    /// 6 ms, QD1 4 KiB random reads) alone for 4 s, then `backup` (best-effort, QD32 1 MiB
    /// O_DIRECT writes) next to it for 10 s; the agent caps backup's wbps at cycle 7.
    pub const RECORDED: &str = include_str!("testdata/noisy-neighbor.ndjson");

    /// The model after the recorded stream's cycle `upto` has ended.
    pub fn recorded_until(upto: u64) -> Model {
        let mut m = Model::default();
        for line in RECORDED.lines() {
            m.ingest_line(line).unwrap();
            if line.contains("\"type\":\"cycle_end\"") && m.cycle == upto {
                break;
            }
        }
        m
    }

    fn names(rows: &[&Row]) -> Vec<String> {
        rows.iter().map(|r| r.name.clone()).collect()
    }

    #[test]
    fn recorded_stream_rows_and_states() {
        let m = recorded_until(6);
        let h = m.header.as_ref().unwrap();
        assert_eq!((h.host.as_str(), h.cgroup_mode.as_str()), ("vm", "v1"));
        assert_eq!(h.policy.as_deref(), Some("adaptive"));
        let db = m.row(&RowKey::Service("db".into())).unwrap();
        assert_eq!(db.state, State::Ok);
        assert_eq!(db.slo, Some(SloClass::latency_p999(6_000_000)));
        assert_eq!(db.cgroups, ["/rec-db"]);
        assert_eq!((db.p999_ns, db.samples), (Some(153_600), 17_227));
        // The service's cgroups are not rows of their own.
        assert!(m.rows().all(|r| r.cgroups != ["/rec-db"] || r.name == "db"));

        // Cycle 7: the writer hurts the reader.
        let m = recorded_until(7);
        let db = m.row(&RowKey::Service("db".into())).unwrap();
        assert_eq!(db.state, State::Violating);
        assert_eq!(db.p999_ns, Some(20_709_376));
        assert!(db.vio.unwrap() > 2.0);
        let backup = m.row(&RowKey::Service("backup".into())).unwrap();
        assert_eq!(backup.slo, Some(SloClass::BestEffort));
        assert!(backup.write_mbps > 1000.0, "{}", backup.write_mbps);
        assert!(m.actions.iter().any(|a| a.kind == ActionKind::Decision
            && a.service.as_deref() == Some("backup")
            && a.text == "backup: wbps unlimited -> 115.6 MB/s on 254:0: aggressor of db: largest device share; cap at 8 % of its rate"));

        // Cycle 8: the cap is in force.
        let m = recorded_until(8);
        let backup = m.row(&RowKey::Service("backup".into())).unwrap();
        assert_eq!(backup.state, State::Throttled);
        assert_eq!(backup.limit.wbps, Some(115_565_885));
        assert_eq!(
            backup.history.0.back().map(|p| p.limit_bps),
            Some(Some(115_565_885))
        );
        // Unclaimed cgroups are unconfigured rows: the root and the unattributed requests.
        let other: Vec<&Row> = m
            .rows()
            .filter(|r| r.state == State::Unconfigured)
            .collect();
        assert!(other.iter().any(|r| r.key == RowKey::Cgroup(0)));
        assert!(other.iter().any(|r| r.cgroups == ["/"]));
        assert_eq!(m.disks.len(), 1);
        assert_eq!(m.disks[0].name.as_deref(), Some("vda"));
        assert!(m.disks[0].utilization > 0.5);
        assert!(m.disks[0].write_mbps > 600.0);

        // Cycle 9: db meets its SLO again.
        let m = recorded_until(9);
        assert_eq!(
            m.row(&RowKey::Service("db".into())).unwrap().state,
            State::Ok
        );
        assert!(m
            .actions
            .iter()
            .any(|a| a.kind == ActionKind::ViolationEnd && a.text.contains("meets its SLO")));

        // The end: limits restored, the agent said it stopped.
        let m = recorded_until(u64::MAX);
        assert_eq!(m.link, Link::Stopped("SIGTERM".into()));
        assert!(m.actions.iter().any(|a| a.kind == ActionKind::Restore
            && a.text
                .contains("rec-backup/blkio.throttle.write_bps_device")));
        let db = m.row(&RowKey::Service("db".into())).unwrap();
        assert_eq!(db.history.0.len() as u64, m.cycle - 1);
    }

    #[test]
    fn sorting_by_each_column_and_reversed() {
        let m = recorded_until(8);
        let services = |rows: Vec<&Row>| -> Vec<String> {
            names(&rows)
                .into_iter()
                .filter(|n| n == "db" || n == "backup")
                .collect()
        };
        // Worst state first: violating db, throttled backup, then the unconfigured.
        let rows = m.visible(Column::State, false, "");
        assert_eq!(names(&rows)[..2], ["db", "backup"]);
        assert!(rows[2..].iter().all(|r| r.state == State::Unconfigured));
        for (column, reverse, order) in [
            (Column::Write, false, ["backup", "db"]),
            (Column::Name, false, ["backup", "db"]),
            (Column::Name, true, ["db", "backup"]),
            (Column::P999, false, ["backup", "db"]),
            (Column::Vio, false, ["db", "backup"]),
            (Column::Limit, false, ["backup", "db"]),
            (Column::Samples, false, ["db", "backup"]),
        ] {
            assert_eq!(
                services(m.visible(column, reverse, "")),
                order,
                "{column:?} reverse {reverse}"
            );
        }
        // Every column sorts without losing rows.
        for c in Column::ALL {
            assert_eq!(m.visible(c, false, "").len(), m.rows().count(), "{c:?}");
        }
        let mut c = Column::Name;
        for _ in 0..Column::ALL.len() {
            c = c.next();
        }
        assert_eq!(c, Column::Name);
        assert_eq!(Column::Name.prev(), Column::Vio);
    }

    #[test]
    fn filtering_by_name_state_class_and_cgroup() {
        let m = recorded_until(8);
        assert_eq!(names(&m.visible(Column::Name, false, "BACK")), ["backup"]);
        assert_eq!(
            names(&m.visible(Column::Name, false, "throttled")),
            ["backup"]
        );
        assert_eq!(names(&m.visible(Column::Name, false, "latency")), ["db"]);
        assert_eq!(names(&m.visible(Column::Name, false, "rec-db")), ["db"]);
        assert!(m.visible(Column::Name, false, "unconfigured").len() >= 2);
        assert!(m.visible(Column::Name, false, "no such thing").is_empty());
    }

    fn line(v: Value) -> String {
        let mut v = v;
        v["schema"] = SCHEMA.into();
        v["ts"] = "2026-11-23T10:00:00.000Z".into();
        v.to_string()
    }

    fn cgroup_stats(cycle: u64, id: u64, path: &str, write_mbps: f64) -> String {
        line(serde_json::json!({
            "type": "cgroup_stats", "cycle": cycle,
            "cgroup": {"id": id, "path": path, "kind": "container", "name": path.trim_start_matches('/')},
            "totals": {"read_mbps": 0.0, "write_mbps": write_mbps, "iops": 10.0},
            "devices": [{"dev": "254:0", "disk": "vda", "write": {"ios": 10, "bytes": 1, "iops": 10.0, "mbps": write_mbps,
                "total": {"samples": 10, "p50_ns": 1000, "p99_ns": null, "p999_ns": null, "max_ns": 2000},
                "inflight": {"now": 0, "peak": 1, "mean": 0.5}}}]
        }))
    }

    fn cycle_end(cycle: u64) -> String {
        line(serde_json::json!({"type": "cycle_end", "cycle": cycle,
            "disks": [{"dev": "254:0", "disk": "vda", "utilization": 0.25}]}))
    }

    #[test]
    fn unconfigured_cgroups_come_and_go() {
        let mut m = Model::default();
        m.ingest_line(&cgroup_stats(1, 7, "/web", 3.0)).unwrap();
        // Nothing shows before the cycle is complete.
        assert_eq!(m.rows().count(), 0);
        m.ingest_line(&cycle_end(1)).unwrap();
        let r = m.row(&RowKey::Cgroup(7)).unwrap();
        assert_eq!(
            (r.state, r.kind.as_str(), r.name.as_str()),
            (State::Unconfigured, "container", "web")
        );
        assert_eq!((r.p50_ns, r.p999_ns, r.samples), (Some(1000), None, 10));
        assert_eq!(m.disks[0].utilization, 0.25);
        // Idle cycles: zero rates, kept for a grace period, then dropped.
        for c in 2..=1 + IDLE_GRACE_CYCLES {
            m.ingest_line(&cycle_end(c)).unwrap();
        }
        assert_eq!(m.row(&RowKey::Cgroup(7)).unwrap().write_mbps, 0.0);
        m.ingest_line(&cycle_end(2 + IDLE_GRACE_CYCLES)).unwrap();
        assert!(m.row(&RowKey::Cgroup(7)).is_none());
        // A removed cgroup leaves at once.
        m.ingest_line(&cgroup_stats(20, 8, "/batch", 1.0)).unwrap();
        m.ingest_line(&cycle_end(20)).unwrap();
        m.ingest_line(&line(
            serde_json::json!({"type": "cgroup_gone", "cycle": 21,
            "cgroup": {"id": 8, "path": "/batch", "kind": "cgroup", "name": "/batch"}}),
        ))
        .unwrap();
        assert!(m.row(&RowKey::Cgroup(8)).is_none());
    }

    /// A model of the recording's first 40 lines, db's row in it.
    fn model_with_db_row() -> Model {
        let mut m = Model::default();
        for l in RECORDED.lines().take(40) {
            m.ingest_line(l).unwrap();
        }
        assert!(m.row(&RowKey::Service("db".into())).is_some());
        m
    }

    #[test]
    fn a_released_label_service_leaves_and_a_restarted_agent_is_said() {
        let mut m = model_with_db_row();
        m.ingest_line(&line(
            serde_json::json!({"type": "label_slo", "outcome": "released",
            "container": "db", "container_id": "ab", "service": "db", "slo": null,
            "label": null, "message": "stopped"}),
        ))
        .unwrap();
        assert!(m.row(&RowKey::Service("db".into())).is_none());
        let start = RECORDED
            .lines()
            .find(|l| l.contains("agent_start"))
            .unwrap();
        m.ingest_line(start).unwrap();
        assert!(m
            .actions
            .back()
            .unwrap()
            .text
            .starts_with("agent 0.1.0 started"));
    }

    #[test]
    fn a_renamed_label_service_leaves_its_old_row() {
        let mut m = model_with_db_row();
        m.ingest_line(&line(
            serde_json::json!({"type": "label_slo", "outcome": "renamed",
            "container": "db2", "container_id": "ab", "service": "db2", "slo": null,
            "label": null, "renamed_from": "db", "message": "renamed"}),
        ))
        .unwrap();
        assert!(m.row(&RowKey::Service("db".into())).is_none());
        assert!(m.actions.back().unwrap().text.contains("label SLO renamed"));
    }

    #[test]
    fn another_schema_or_garbage_is_an_error_not_a_panic() {
        let mut m = Model::default();
        assert_eq!(
            m.ingest_line(r#"{"schema":2,"type":"agent_start"}"#),
            Err(StreamError::Schema(2))
        );
        assert!(StreamError::Schema(2).to_string().contains("schema 2"));
        assert!(matches!(
            m.ingest_line("HTTP/1.1 400 Bad Request"),
            Err(StreamError::NotAnEvent(_))
        ));
        assert!(matches!(
            m.ingest_line(r#"{"type":"agent_start"}"#),
            Err(StreamError::NotAnEvent(_))
        ));
        // Unknown event types of the same schema are ignored.
        m.ingest_line(r#"{"schema":1,"type":"from_the_future","x":1}"#)
            .unwrap();
        // Fields of the wrong type make the line unreadable (typed events: the error names
        // the field), never a panic, and the model is as it was.
        let e = m
            .ingest_line(r#"{"schema":1,"type":"service_stats","service":3,"samples":"x","latency_log2":[[1],"a"]}"#)
            .unwrap_err();
        assert!(
            matches!(&e, StreamError::NotAnEvent(why) if why.contains("invalid type")),
            "{e}"
        );
        assert!(matches!(
            m.ingest_line(r#"{"schema":1,"type":"cycle_end","cycle":"one"}"#),
            Err(StreamError::NotAnEvent(_))
        ));
        assert_eq!((m.cycle, m.rows().count()), (0, 0));
        // Missing fields take their defaults (an older agent's stream).
        m.ingest_line(r#"{"schema":1,"type":"cycle_end"}"#).unwrap();
        assert_eq!(m.cycle, 1);
        m.lost("gone".into());
        assert_eq!(m.link, Link::Lost("gone".into()));
    }

    #[test]
    fn numbers_at_the_extremes_do_not_overflow() {
        let mut m = Model::default();
        let max = u64::MAX;
        // Two disks of one service: their counts add up.
        for disk in ["vda", "vdb"] {
            m.ingest_line(&line(
                serde_json::json!({"type": "service_stats", "cycle": max,
                "service": "s", "disk": disk, "samples": max, "latency_log2": [[1024, max]],
                "limit": {"rbps": max, "wbps": max}}),
            ))
            .unwrap();
        }
        m.ingest_line(&line(
            serde_json::json!({"type": "cycle_end", "cycle": max}),
        ))
        .unwrap();
        let s = m.row(&RowKey::Service("s".into())).unwrap();
        assert_eq!(s.samples, max);
        assert_eq!(s.latency_log2, [(1024, max)]);
        assert_eq!(s.limit.total_bps(), Some(max));
        // The next cycle_end without a number follows u64::MAX.
        m.ingest_line(&line(serde_json::json!({"type": "cycle_end"})))
            .unwrap();
        assert_eq!(m.cycle, max);
    }

    /// Generators of event lines for the property tests of `isolator top`'s reader side
    /// (here and in the view): any JSON with the stream's own keys, and the recorded stream
    /// with values replaced or bytes cut.
    pub mod arb {
        use std::{collections::BTreeSet, sync::OnceLock};

        use proptest::prelude::*;
        use serde_json::{Map, Number, Value};

        use super::RECORDED;

        /// Every key and event type the recorded stream uses, and a few it does not. Read
        /// once: prop_recursive builds its strategy anew for every value.
        fn vocabulary() -> &'static [String] {
            static WORDS: OnceLock<Vec<String>> = OnceLock::new();
            WORDS.get_or_init(read_vocabulary)
        }

        fn read_vocabulary() -> Vec<String> {
            fn walk(v: &Value, out: &mut BTreeSet<String>) {
                match v {
                    Value::Object(m) => {
                        for (k, v) in m {
                            out.insert(k.clone());
                            walk(v, out);
                        }
                    }
                    Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
                    Value::String(s) if s.len() < 24 => {
                        out.insert(s.clone());
                    }
                    _ => {}
                }
            }
            let mut out = BTreeSet::new();
            for l in RECORDED.lines() {
                walk(
                    &serde_json::from_str(l).expect("recorded lines are JSON"),
                    &mut out,
                );
            }
            for w in [
                "label_slo",
                "cgroup_gone",
                "docker_connected",
                "error",
                "released",
                "latency",
                "throughput",
                "best-effort",
                "max",
                "0",
                "weight",
                "riops",
                "wiops",
                "vio",
                "latency_log2",
                "limit",
                "slo",
                "class",
                "p999_ns",
                "rate_bps",
            ] {
                out.insert(w.to_string());
            }
            out.into_iter().collect()
        }

        fn word() -> impl Strategy<Value = String> {
            prop_oneof![
                4 => prop::sample::select(vocabulary()),
                1 => "\\PC{0,12}",
            ]
        }

        /// A JSON scalar, with the extremes: u64::MAX, negative, huge and tiny floats.
        fn leaf() -> impl Strategy<Value = Value> {
            prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::from),
                any::<u64>().prop_map(Value::from),
                prop::sample::select(vec![0, 1, u64::MAX, u64::MAX - 1, 1 << 53])
                    .prop_map(Value::from),
                any::<i64>().prop_map(Value::from),
                any::<f64>().prop_map(|f| Number::from_f64(f).map_or(Value::Null, Value::Number)),
                word().prop_map(Value::from),
            ]
        }

        /// Any JSON value, keys mostly the stream's own.
        pub fn json() -> impl Strategy<Value = Value> {
            leaf().prop_recursive(4, 48, 6, |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                    prop::collection::vec((word(), inner), 0..6)
                        .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
                ]
            })
        }

        /// An event of schema 1 (mostly) with a type the view knows (mostly) and any
        /// fields.
        pub fn event() -> impl Strategy<Value = String> {
            (json(), word(), prop::bool::weighted(0.9)).prop_map(|(body, ty, schema)| {
                let mut m = match body {
                    Value::Object(m) => m,
                    other => Map::from_iter([("x".to_string(), other)]),
                };
                m.insert("type".into(), ty.into());
                if schema {
                    m.insert("schema".into(), 1.into());
                }
                Value::Object(m).to_string()
            })
        }

        /// Replaces the value at the `path` walk (indices modulo each level's size) with
        /// `new`, or removes it.
        fn replace(v: &mut Value, path: &[usize], new: Option<Value>) {
            let Some((&i, rest)) = path.split_first() else {
                return;
            };
            let child = match v {
                Value::Object(m) if !m.is_empty() => {
                    let k = m.keys().nth(i % m.len()).cloned().unwrap_or_default();
                    if rest.is_empty() || !m[&k].is_object() && !m[&k].is_array() {
                        match new {
                            Some(n) => m[&k] = n,
                            None => {
                                m.remove(&k);
                            }
                        }
                        return;
                    }
                    m.get_mut(&k)
                }
                Value::Array(a) if !a.is_empty() => {
                    let n = a.len();
                    if rest.is_empty() || !a[i % n].is_object() && !a[i % n].is_array() {
                        match new {
                            Some(v) => a[i % n] = v,
                            None => {
                                a.remove(i % n);
                            }
                        }
                        return;
                    }
                    a.get_mut(i % n)
                }
                _ => None,
            };
            if let Some(c) = child {
                replace(c, rest, new);
            }
        }

        /// One way to break a line.
        #[derive(Debug, Clone)]
        pub enum Mutation {
            /// A value somewhere in the event replaced (None: removed).
            Value(Vec<usize>, Option<Value>),
            /// The line cut at a byte.
            Truncate(usize),
            /// Text inserted at a byte.
            Insert(usize, String),
            /// Every number in the event set to one value (u64::MAX: sums overflow).
            Extremes(Value),
        }

        fn set_numbers(v: &mut Value, to: &Value) {
            match v {
                Value::Number(_) => *v = to.clone(),
                Value::Array(a) => a.iter_mut().for_each(|v| set_numbers(v, to)),
                Value::Object(m) => m.values_mut().for_each(|v| set_numbers(v, to)),
                _ => {}
            }
        }

        fn mutation() -> impl Strategy<Value = Mutation> {
            prop_oneof![
                6 => (
                    prop::collection::vec(any::<usize>(), 1..6),
                    prop::option::weighted(0.85, json()),
                )
                    .prop_map(|(p, v)| Mutation::Value(p, v)),
                1 => any::<usize>().prop_map(Mutation::Truncate),
                1 => (
                    any::<usize>(),
                    prop_oneof!["\\PC{0,6}", Just("\"".to_string()), Just("}".to_string())],
                )
                    .prop_map(|(i, s)| Mutation::Insert(i, s)),
                1 => extreme().prop_map(Mutation::Extremes),
            ]
        }

        fn extreme() -> impl Strategy<Value = Value> {
            prop::sample::select(vec![
                Value::from(u64::MAX),
                Value::from(0),
                Value::from(-1),
                Value::from(f64::MAX),
                Value::from(5e-324),
            ])
        }

        /// The byte at or before `i % len` that starts a character.
        fn boundary(line: &str, i: usize) -> usize {
            let mut i = i % (line.len() + 1);
            while !line.is_char_boundary(i) {
                i -= 1;
            }
            i
        }

        pub fn apply(line: &str, m: &Mutation) -> String {
            match m {
                Mutation::Value(path, new) => {
                    // A line already cut is not JSON: it stays as it is.
                    let Ok(mut v) = serde_json::from_str::<Value>(line) else {
                        return line.to_string();
                    };
                    replace(&mut v, path, new.clone());
                    v.to_string()
                }
                Mutation::Extremes(to) => {
                    let Ok(mut v) = serde_json::from_str::<Value>(line) else {
                        return line.to_string();
                    };
                    set_numbers(&mut v, to);
                    // The schema stays, so that the event is read.
                    if v.get("schema").is_some() {
                        v["schema"] = super::SCHEMA.into();
                    }
                    v.to_string()
                }
                Mutation::Truncate(i) => line[..boundary(line, *i)].to_string(),
                Mutation::Insert(i, s) => {
                    let mut l = line.to_string();
                    l.insert_str(boundary(line, *i), s);
                    l
                }
            }
        }

        /// The recorded stream with a few of its lines broken.
        pub fn mutated_stream() -> impl Strategy<Value = Vec<String>> {
            let lines: Vec<&'static str> = RECORDED.lines().collect();
            let n = lines.len();
            prop::collection::vec((0..n, mutation()), 1..12).prop_map(move |ms| {
                let mut out: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
                for (i, m) in ms {
                    out[i] = apply(&out[i], &m);
                }
                out
            })
        }

        /// The recorded stream, up to a line, with every number one extreme value.
        pub fn extreme_stream() -> impl Strategy<Value = Vec<String>> {
            let lines: Vec<&'static str> = RECORDED.lines().collect();
            let n = lines.len();
            (extreme(), 1..=n).prop_map(move |(to, upto)| {
                let m = Mutation::Extremes(to);
                lines[..upto].iter().map(|l| apply(l, &m)).collect()
            })
        }

        /// One recorded line, broken.
        pub fn mutated_line() -> impl Strategy<Value = String> {
            let lines: Vec<&'static str> = RECORDED.lines().collect();
            (
                prop::sample::select(lines),
                prop::collection::vec(mutation(), 1..4),
            )
                .prop_map(|(l, ms)| ms.iter().fold(l.to_string(), |l, m| apply(&l, m)))
        }
    }

    mod props {
        use proptest::prelude::*;

        use super::{super::*, arb};

        /// The model after `lines`: every line taken or refused, never a panic; then every
        /// way of looking at it.
        fn ingest_all<'a>(
            lines: impl IntoIterator<Item = &'a str>,
        ) -> Result<Model, TestCaseError> {
            let mut m = Model::default();
            for l in lines {
                match m.ingest_line(l) {
                    Ok(()) => {}
                    Err(StreamError::Schema(v)) => prop_assert_ne!(v, SCHEMA),
                    Err(StreamError::NotAnEvent(_)) => {}
                }
            }
            for c in Column::ALL {
                let rows = m.visible(c, true, "a");
                for r in rows {
                    let _ = m.actions_of(r).count();
                }
            }
            prop_assert!(m.actions.len() <= ACTIONS);
            Ok(m)
        }

        proptest! {
            #![proptest_config(crate::proptest_budget(500))]

            #[test]
            fn any_lines(lines in prop::collection::vec(any::<String>(), 0..8)) {
                ingest_all(lines.iter().map(String::as_str))?;
            }

            /// Events of this schema with any fields, as a sequence (commits included).
            #[test]
            fn any_events(lines in prop::collection::vec(arb::event(), 1..12)) {
                ingest_all(lines.iter().map(String::as_str))?;
            }

            #[test]
            fn broken_real_lines(lines in prop::collection::vec(arb::mutated_line(), 1..6)) {
                ingest_all(lines.iter().map(String::as_str))?;
            }
        }

        proptest! {
            // The whole recorded stream per case: fewer cases.
            #![proptest_config(crate::proptest_budget(100))]

            #[test]
            fn a_recorded_stream_with_broken_lines(lines in arb::mutated_stream()) {
                ingest_all(lines.iter().map(String::as_str))?;
            }
        }
    }
}
