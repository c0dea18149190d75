//! The event stream's model: every event the agent writes, as one set of types that the
//! agent serializes and every reader (`isolator top`, `isolator replay`, the benchmarks)
//! deserializes. One JSON object per line (NDJSON); the schema is documented in
//! docs/events.md. A renamed or retyped field is a compile error in every reader; bump
//! [`SCHEMA_VERSION`] on any change an older reader could not take.
//!
//! Readers are lenient where it is safe: a missing field takes its default (an older
//! agent's stream lacks later additions) and an unknown event type is
//! [`Event::Unknown`] (a newer agent's addition within the schema). A field of the wrong
//! type makes the line unreadable, with an error naming it.

pub mod output;
pub mod private_file;
pub mod rotation;
mod sink;
pub mod stream;

use serde::{Deserialize, Serialize};

pub use sink::NdjsonSink;

use crate::{
    collect::probe::{KernelFeatures, ProgramStats, StatsCapacity},
    config::SloClass,
    events::stream::ReplayRole,
    identify::cgroupfs::CgroupMode,
    identify::containers::ContainerTable,
    identify::naming::{self, QosClass, Runtime, ServiceKind},
    measure::character::{Character, CharacterClass},
    measure::metrics::OpStats,
    policy::{Cause, DeviceCycle, IoMaxLimit, LatencyNumbers, ServiceId},
};

pub const SCHEMA_VERSION: u32 = 1;

/// A cgroup as the events name it: by id and path, and by what owns it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CgroupRef {
    /// kernfs id (inode of the cgroup directory); 0 = unattributed.
    pub id: u64,
    /// Path relative to the io/blkio hierarchy root; null when unknown.
    pub path: Option<String>,
    pub kind: ServiceKind,
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    /// The container's image, when its runtime (Docker, containerd) knows the container.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime: Option<Runtime>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_qos: Option<QosClass>,
    /// The pod's namespace, name and (for a container of the pod) the container's name in
    /// the pod spec, as the kubelet's labels say (from containerd).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_namespace: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_container: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
}

impl CgroupRef {
    /// Names a cgroup from its path (see [`crate::identify::naming`]) and, for a container
    /// its runtime knows, by the name the runtime gives it (Docker's name; a pod's
    /// container `namespace/pod/container`). A pod's own cgroup is `namespace/pod` when
    /// containerd knows its sandbox.
    pub fn new(id: u64, path: Option<String>, containers: &ContainerTable) -> CgroupRef {
        let named = path.as_deref().map(naming::name_path);
        let kind = named.as_ref().map_or(ServiceKind::Cgroup, |n| n.kind);
        let id_of = |k: ServiceKind| named.as_ref().filter(|n| n.kind == k)?.id.clone();
        let container_id = id_of(ServiceKind::Container);
        let known = container_id.as_deref().and_then(|c| containers.get(c));
        let path_pod = named.as_ref().and_then(|n| n.pod.as_ref());
        let pod = match known {
            Some(c) => c.pod.as_ref(),
            None => id_of(ServiceKind::Pod)
                .and_then(|uid| containers.sandbox(&uid))
                .and_then(|s| s.pod.as_ref()),
        };
        let name = match (&named, id, known, pod) {
            (_, _, Some(c), _) => c.name.clone(),
            (_, _, None, Some(p)) => format!("{}/{}", p.namespace, p.name),
            (Some(n), _, None, None) => n.name.clone(),
            (None, 0, None, None) => "unattributed".into(),
            (None, _, None, None) => format!("cgroup {id}"),
        };
        CgroupRef {
            id,
            image: known.map(|c| c.image.clone()),
            container_id,
            unit: id_of(ServiceKind::Unit),
            runtime: named
                .as_ref()
                .and_then(|n| n.runtime)
                .or(known.map(|c| c.runtime)),
            pod_uid: path_pod
                .map(|p| p.uid.clone())
                .or_else(|| Some(pod?.uid.clone())),
            pod_qos: path_pod.map(|p| p.qos),
            pod_namespace: pod.map(|p| p.namespace.clone()),
            pod_name: pod.map(|p| p.name.clone()),
            pod_container: pod.and_then(|p| p.container.clone()),
            path,
            kind,
            name,
        }
    }
}

/// One disk of a cgroup's cycle: its operations' statistics.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DeviceStats {
    /// "major:minor" of the whole disk.
    pub dev: String,
    /// Kernel name of the disk (e.g. "vda"), when known.
    pub disk: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read: Option<OpStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub write: Option<OpStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub other: Option<OpStats>,
    /// The cgroup's I/O character on the disk over its window, and this cycle's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub character: Option<Character>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub character_cycle: Option<Character>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Totals {
    pub read_bytes: u64,
    pub write_bytes: u64,
    #[serde(deserialize_with = "crate::events::f64_or_null")]
    pub read_mbps: f64,
    #[serde(deserialize_with = "crate::events::f64_or_null")]
    pub write_mbps: f64,
    #[serde(deserialize_with = "crate::events::f64_or_null")]
    pub iops: f64,
}

/// `violation_start` and `violation_end`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ViolationInfo {
    pub cycle: u64,
    pub service: String,
    pub dev: String,
    /// The cycle's p99.9, where it had enough samples to judge.
    pub p999_ns: Option<u64>,
    /// The latency at the SLO's quantile when that is not p99.9 (`slo` names it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_ns: Option<u64>,
    pub slo: SloClass,
    pub vio: Option<f64>,
    #[serde(deserialize_with = "crate::events::f64_or_null")]
    pub rate_bps: f64,
}

/// A latency service over its target with nobody else left to cut (no other load on the
/// device, or every other service at its floor): no cap on the others can meet it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SloInfeasible {
    pub cycle: u64,
    pub service: String,
    pub dev: String,
    pub policy: String,
    /// Its latency and target: on the p99.9, or at another quantile it names.
    #[serde(flatten)]
    pub latency: LatencyNumbers,
    /// Everyone else's rate on the device in the cycle.
    #[serde(deserialize_with = "crate::events::f64_or_null")]
    pub others_bps: f64,
    /// What the policy does about it.
    pub action: String,
    pub reason: String,
}

/// A latency service over its target in a cycle the disk stalled: its p99.9 far over the
/// level the same caps gave in the last cycles, with nobody pushing more bytes or IOPS than
/// then. The policy counts the cycle but cuts nothing for it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DiskStall {
    pub cycle: u64,
    pub service: String,
    pub dev: String,
    pub policy: String,
    /// Its latency and target: on the p99.9, or at another quantile it names.
    #[serde(flatten)]
    pub latency: LatencyNumbers,
    /// The worst p99.9 the same or higher caps gave in the last cycles (null for an SLO
    /// at another quantile, whose level is `level_latency_ns`).
    pub level_p999_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub level_latency_ns: Option<u64>,
    /// Everyone else's rate on the device in the cycle.
    #[serde(deserialize_with = "crate::events::f64_or_null")]
    pub others_bps: f64,
    /// What the policy does about it.
    pub action: String,
}

/// What became of the SLO a container (or a pod) declares in its `isolator.*` labels.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LabelSloInfo {
    /// `applied`, `overridden` (the config claims the container), `invalid` (a malformed
    /// label; the container is unconfigured), `renamed` (the service follows the
    /// container's new name and keeps its limits) or `released` (container stopped or
    /// labels changed).
    pub outcome: String,
    /// The container's name; for a pod's labels, the pod as `namespace/pod`.
    pub container: String,
    /// The container's id; for a pod's labels, its sandbox's.
    pub container_id: String,
    /// Set when the labels are a pod's (on its sandbox): the pod's UID.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    /// The service that governs the container now (or did, for `released`).
    pub service: Option<String>,
    pub slo: Option<SloClass>,
    /// `key=value` of the malformed label (`invalid` only).
    pub label: Option<String>,
    /// The service's name before the rename (`renamed` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub renamed_from: Option<String>,
    pub message: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AgentStart {
    pub version: String,
    pub host: String,
    pub pid: u32,
    pub kernel: String,
    pub cgroup_mode: CgroupMode,
    pub cgroup_root: String,
    pub attach: String,
    #[serde(deserialize_with = "crate::events::f64_or_null")]
    pub interval_s: f64,
    /// Control: the policy, or null when the agent only observes.
    pub policy: Option<String>,
    /// The `ute` policy's utilization threshold (only with `--policy ute`), for replay.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ute_threshold: Option<f64>,
    pub config: Option<String>,
    pub dry_run: bool,
    /// The per-key statistics map: capacity and kernel memory per key.
    pub stats_map: StatsCapacity,
    /// Where this kernel differs from current ones, as the loader found it.
    pub kernel_features: KernelFeatures,
    /// The address `--metrics` serves, as bound (a port 0 resolved); null without it.
    pub metrics: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CgroupStats {
    pub cycle: u64,
    #[serde(deserialize_with = "crate::events::f64_or_null")]
    pub interval_s: f64,
    pub cgroup: CgroupRef,
    pub totals: Totals,
    pub devices: Vec<DeviceStats>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CgroupGone {
    pub cycle: u64,
    pub cgroup: CgroupRef,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CycleEnd {
    pub cycle: u64,
    #[serde(deserialize_with = "crate::events::f64_or_null")]
    pub interval_s: f64,
    pub cgroups: usize,
    pub tracked_keys: usize,
    /// Keys that left the maps this cycle (idle for --idle-key-timeout).
    pub evicted_keys: usize,
    pub preexisting_completions: u64,
    pub map_full: u64,
    pub unsampled_requests: u64,
    pub missed_events: u64,
    pub untraced_completions: u64,
    pub issue_map_timing: bool,
    pub insert_attached: bool,
    /// block_rq_issue is attached (--count-inflight, or a queue that does not stamp
    /// requests at issue).
    pub issue_attached: bool,
    pub collect_us: u64,
    /// Containers Docker reported that exist now (null: Docker off).
    pub docker_containers: Option<usize>,
    /// Containers containerd reported in namespace k8s.io that exist now (null:
    /// containerd off).
    pub containerd_containers: Option<usize>,
    /// Events the output (stdout or --json) did not keep up with and lost, since start.
    pub events_dropped: u64,
    /// Disks with I/O this cycle and how busy they were.
    pub disks: Vec<DiskCycle>,
    /// Per-program kernel counters (run counts and time need bpf_stats_enabled).
    pub programs: Vec<ProgramStats>,
}

/// One service on one device, one cycle (only with --config).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ServiceStats {
    pub cycle: u64,
    pub service: String,
    /// The service's I/O character on the disk over its window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub character: Option<Character>,
    pub slo: SloClass,
    pub dev: String,
    pub disk: Option<String>,
    /// `ok`, `throttled` or `violating`.
    pub state: String,
    pub p50_ns: Option<u64>,
    pub p999_ns: Option<u64>,
    /// The latency at the SLO's quantile when that is not p99.9 (`slo` names it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slo_latency_ns: Option<u64>,
    pub samples: u64,
    /// The samples in power-of-two buckets: (upper bound ns, count), non-empty only.
    pub latency_log2: Vec<(u64, u64)>,
    /// Ids of the cgroups whose I/O on this device this cycle is the service's.
    pub cgroups: Vec<u64>,
    pub mean_latency_ns: Option<u64>,
    #[serde(deserialize_with = "crate::events::f64_or_null")]
    pub read_mbps: f64,
    #[serde(deserialize_with = "crate::events::f64_or_null")]
    pub write_mbps: f64,
    #[serde(deserialize_with = "crate::events::f64_or_null")]
    pub iops: f64,
    #[serde(deserialize_with = "crate::events::f64_or_null")]
    pub mean_inflight: f64,
    pub peak_inflight: Option<u64>,
    pub vio: Option<f64>,
    pub th_dif_mbps: Option<f64>,
    #[serde(deserialize_with = "crate::events::f64_or_null")]
    pub share: f64,
    #[serde(deserialize_with = "crate::events::f64_or_null")]
    pub utilization: f64,
    pub limit: IoMaxLimit,
}

/// What the policy was given this cycle, every disk of it (only with --config): with the
/// run's policy and config, the decisions follow from these alone, so a recorded run can be
/// replayed (`isolator replay`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PolicyInput {
    pub cycle: u64,
    /// Services whose remembered policy state was dropped before this cycle (they started
    /// over on new cgroups, or left).
    pub forgotten_services: Vec<ServiceId>,
    /// Services that match no cgroup this cycle: nothing can be written for them, so the
    /// agent makes no decision for them whatever the policy says.
    pub untargeted_services: Vec<ServiceId>,
    pub devices: Vec<DeviceCycle>,
}

/// A limit the policy (or the config) set, with the numbers behind it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Decision {
    pub cycle: u64,
    pub policy: String,
    pub service: String,
    pub cgroups: Vec<String>,
    pub dev: Option<String>,
    pub knob: String,
    /// As the knob's file read before and after the write, per cgroup.
    pub old: String,
    pub new: String,
    /// The service-wide value the policy decided (null: no limit; absent for weights).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decided: Option<Limit>,
    pub applied: bool,
    pub reason: String,
    pub cause: Option<Cause>,
}

/// A decided limit: a number (bytes/s or IOPS, by the knob) or none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Limit {
    Max(MaxWord),
    Value(u64),
}

/// The word `max`: no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MaxWord {
    Max,
}

impl From<Option<u64>> for Limit {
    fn from(v: Option<u64>) -> Limit {
        v.map_or(Limit::Max(MaxWord::Max), Limit::Value)
    }
}

impl Limit {
    pub fn value(self) -> Option<u64> {
        match self {
            Limit::Max(_) => None,
            Limit::Value(v) => Some(v),
        }
    }
}

/// A knob put back to the value it had before the agent touched it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Restore {
    pub reason: String,
    pub file: String,
    pub knob: String,
    pub value: String,
    pub result: String,
    /// What the knob held instead (`changed_by_other`): left as it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current: Option<String>,
}

/// A `warning` or an `error`: a code to match on and a sentence for people.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Notice {
    pub code: String,
    pub message: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AgentStop {
    pub reason: String,
    pub cycles: u64,
}

/// The Docker daemon answered (at start or after being down).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DockerConnected {
    pub socket: String,
    pub api_version: String,
    pub containers: usize,
}

/// containerd answered (at start or after being down).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ContainerdConnected {
    pub socket: String,
    /// The daemon's version.
    pub version: String,
    /// The containerd namespace followed (the kubelet's, `k8s.io`).
    pub namespace: String,
    pub containers: usize,
}

/// One disk in `cycle_end`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DiskCycle {
    pub dev: String,
    pub disk: Option<String>,
    /// Fraction of the cycle the disk had requests in flight (io_ticks).
    #[serde(deserialize_with = "crate::events::f64_or_null")]
    pub utilization: f64,
    /// Requests the disk completed, by its own counts, that the programs never saw complete,
    /// since the agent started (a lower bound; null where the disk does not count them).
    pub unseen_completions: Option<u64>,
}

/// A service's character class on a disk turned into another over its window.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CharacterChange {
    pub cycle: u64,
    pub service: String,
    pub dev: String,
    pub disk: Option<String>,
    pub from: Option<CharacterClass>,
    pub to: Option<CharacterClass>,
    pub character: Character,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    AgentStart(AgentStart),
    CgroupStats(CgroupStats),
    CgroupGone(CgroupGone),
    CycleEnd(CycleEnd),
    ServiceStats(ServiceStats),
    PolicyInput(PolicyInput),
    Decision(Decision),
    ViolationStart(ViolationInfo),
    ViolationEnd(ViolationInfo),
    Restore(Restore),
    Warning(Notice),
    Error(Notice),
    AgentStop(AgentStop),
    DockerConnected(DockerConnected),
    ContainerdConnected(ContainerdConnected),
    LabelSlo(LabelSloInfo),
    CharacterChange(CharacterChange),
    SloInfeasible(SloInfeasible),
    DiskStall(DiskStall),
    /// A type this reader does not know: a newer agent's addition within the schema.
    /// Never written.
    #[serde(other)]
    Unknown,
}

impl Event {
    /// What the event is to a new reader of the event socket.
    fn replay_role(&self) -> ReplayRole {
        match self {
            Event::AgentStart(_) => ReplayRole::Start,
            Event::CgroupStats(_) | Event::ServiceStats(_) | Event::PolicyInput(_) => {
                ReplayRole::CycleRecord
            }
            Event::CycleEnd(_) => ReplayRole::CycleEnd,
            _ => ReplayRole::Action,
        }
    }

    pub fn warning(code: impl Into<String>, message: impl Into<String>) -> Event {
        Event::Warning(Notice {
            code: code.into(),
            message: message.into(),
        })
    }

    pub fn error(code: impl Into<String>, message: impl Into<String>) -> Event {
        Event::Error(Notice {
            code: code.into(),
            message: message.into(),
        })
    }

    /// A knob put back, from the enforcer's report.
    pub fn restore(reason: &str, r: crate::enforcer::Restored) -> Event {
        Event::Restore(Restore {
            reason: reason.into(),
            file: r.file,
            knob: r.knob,
            value: r.value,
            result: r.result,
            current: r.current,
        })
    }
}

/// A number a reader takes: the agent's JSON writer spells a non-finite float `null`, and
/// a whole event must not be lost to one such value (NaN, as written).
pub fn f64_or_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// One line of the stream as a reader gets it: the event with its envelope.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedEvent {
    pub schema: u32,
    /// When the agent wrote it (RFC 3339, UTC, milliseconds).
    #[serde(default)]
    pub ts: String,
    #[serde(flatten)]
    pub event: Event,
}

/// Why a line is not an event a reader of this schema can take.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ReadError {
    #[error("the agent speaks event schema {0}, this reader understands schema {SCHEMA_VERSION}; use the isolator of the agent's version")]
    Schema(u64),
    #[error("not an isolator event: {0}")]
    NotAnEvent(String),
}

impl RecordedEvent {
    /// One NDJSON line as an event of this schema.
    pub fn parse(line: &str) -> Result<RecordedEvent, ReadError> {
        match serde_json::from_str::<RecordedEvent>(line) {
            Ok(e) if e.schema == SCHEMA_VERSION => Ok(e),
            Ok(e) => Err(ReadError::Schema(e.schema.into())),
            Err(e) => {
                // Another schema may not fit these types: say that rather than the field.
                #[derive(Deserialize)]
                struct Head {
                    schema: Option<u64>,
                }
                match serde_json::from_str::<Head>(line) {
                    Ok(Head { schema: Some(v) }) if v != u64::from(SCHEMA_VERSION) => {
                        Err(ReadError::Schema(v))
                    }
                    Ok(Head { schema: None }) => {
                        Err(ReadError::NotAnEvent("no schema field".into()))
                    }
                    _ => Err(ReadError::NotAnEvent(format!("{e}: {line:.80}"))),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::{
        config::Rate,
        policy::{IoMaxLimit, ServiceLoad},
    };

    /// A p99.9 verdict, flattened into the event, reads as the fields always did: both
    /// p99.9 fields present (null when unknown), none of another quantile's.
    #[test]
    fn a_p999_disk_stall_keeps_its_fields() {
        let e = DiskStall {
            service: "db".into(),
            latency: LatencyNumbers {
                p999_ns: Some(9_000_000),
                slo_p999_ns: Some(5_000_000),
                ..Default::default()
            },
            level_p999_ns: Some(2_000_000),
            ..Default::default()
        };
        let v = serde_json::to_value(Event::DiskStall(e.clone())).unwrap();
        assert_eq!(
            (&v["p999_ns"], &v["slo_p999_ns"], &v["level_p999_ns"]),
            (
                &serde_json::json!(9_000_000),
                &serde_json::json!(5_000_000),
                &serde_json::json!(2_000_000)
            )
        );
        for absent in [
            "quantile",
            "latency_ns",
            "slo_latency_ns",
            "level_latency_ns",
            "latency",
        ] {
            assert!(v.get(absent).is_none(), "{absent} in {v}");
        }
        assert_eq!(
            serde_json::from_value::<Event>(v).unwrap(),
            Event::DiskStall(e)
        );
        let v = serde_json::to_value(Event::SloInfeasible(SloInfeasible::default())).unwrap();
        for always in ["p999_ns", "slo_p999_ns"] {
            assert_eq!(v.get(always), Some(&serde_json::Value::Null), "{v}");
        }
    }

    #[test]
    fn cgroups_of_pods_are_named_by_what_containerd_says() {
        use crate::identify::containers::{ContainerInfo, ContainerUpdate, PodMember};
        let uid = "0a1b2c3d-4e5f-6789-abcd-ef0123456789";
        let (sandbox, app) = ("aa".repeat(32), "bb".repeat(32));
        let member = |container: Option<&str>| PodMember {
            namespace: "shop".into(),
            name: "web-1".into(),
            uid: uid.into(),
            container: container.map(str::to_string),
        };
        let info = |id: &str, name: &str, pod: PodMember| ContainerInfo {
            id: id.into(),
            name: name.into(),
            image: "docker.io/library/app:1".into(),
            labels: Default::default(),
            running: true,
            runtime: Runtime::Containerd,
            pod: Some(pod),
        };
        let mut t = ContainerTable::default();
        let pod_dir = format!("/kubepods/burstable/pod{uid}");
        // Before containerd answers: by UID and id, from the path.
        let c = CgroupRef::new(1, Some(pod_dir.clone()), &t);
        assert_eq!(
            (c.kind, c.name.as_str()),
            (ServiceKind::Pod, &*format!("pod-{uid}"))
        );
        assert_eq!(c.pod_namespace, None);
        let c = CgroupRef::new(2, Some(format!("/k8s.io/{app}")), &t);
        assert_eq!(c.name, &app[..12]);
        assert_eq!(c.runtime, None);

        t.apply(&ContainerUpdate::Connected {
            runtime: Runtime::Containerd,
            version: "1.6".into(),
            containers: vec![
                info(&sandbox, "shop/web-1", member(None)),
                info(&app, "shop/web-1/app", member(Some("app"))),
            ],
        });
        let c = CgroupRef::new(1, Some(pod_dir.clone()), &t);
        assert_eq!((c.kind, c.name.as_str()), (ServiceKind::Pod, "shop/web-1"));
        assert_eq!(c.pod_uid.as_deref(), Some(uid));
        assert_eq!(c.pod_qos, Some(QosClass::Burstable));
        assert_eq!(
            (
                c.pod_namespace.as_deref(),
                c.pod_name.as_deref(),
                c.pod_container.as_deref()
            ),
            (Some("shop"), Some("web-1"), None)
        );
        for path in [format!("{pod_dir}/{app}"), format!("/k8s.io/{app}")] {
            let c = CgroupRef::new(2, Some(path.clone()), &t);
            assert_eq!(c.kind, ServiceKind::Container, "{path}");
            assert_eq!(c.name, "shop/web-1/app", "{path}");
            assert_eq!(c.container_id.as_deref(), Some(app.as_str()));
            assert_eq!(c.image.as_deref(), Some("docker.io/library/app:1"));
            assert_eq!(c.runtime, Some(Runtime::Containerd));
            assert_eq!(c.pod_uid.as_deref(), Some(uid), "{path}");
            assert_eq!(
                (
                    c.pod_namespace.as_deref(),
                    c.pod_name.as_deref(),
                    c.pod_container.as_deref()
                ),
                (Some("shop"), Some("web-1"), Some("app"))
            );
        }
        let c = CgroupRef::new(3, Some(format!("/k8s.io/{sandbox}")), &t);
        assert_eq!(c.name, "shop/web-1");
        assert_eq!(c.pod_container, None);
        // The names reach the events as fields a reader (and the metrics) can take.
        let v =
            serde_json::to_value(CgroupRef::new(2, Some(format!("/k8s.io/{app}")), &t)).unwrap();
        assert_eq!(v["pod_namespace"], "shop");
        assert_eq!(v["pod_name"], "web-1");
        assert_eq!(v["pod_container"], "app");
    }

    /// `policy_input` is made of the policy's own types: a field renamed there changes the
    /// recorded stream, so its wire form is pinned here (a change is a schema decision).
    #[test]
    fn policy_input_wire_form_is_pinned() {
        let e = Event::PolicyInput(PolicyInput {
            cycle: 7,
            forgotten_services: vec![2],
            untargeted_services: vec![],
            devices: vec![DeviceCycle {
                cycle: 7,
                dev: (254 << 20) | 16,
                interval_s: 1.0,
                utilization: 0.5,
                services: vec![ServiceLoad {
                    id: 0,
                    name: "db".into(),
                    class: SloClass::latency_p999(5_000_000),
                    floor: Some(Rate::BytesPerSec(1_000_000)),
                    ceiling: None,
                    read_bps: 4e6,
                    write_bps: 0.0,
                    read_iops: 1000.0,
                    write_iops: 0.0,
                    p999_ns: Some(900_000),
                    samples: 1000,
                    mean_latency_ns: Some(250_000.5),
                    mean_inflight: 0.25,
                    peak_inflight: None,
                    limit: IoMaxLimit {
                        wbps: Some(1 << 20),
                        ..IoMaxLimit::default()
                    },
                    latency_hist: vec![(600, 999), (700, 1)],
                    cgroup_ids: vec![42],
                    changed_cycle: Some(5),
                    character: Default::default(),
                }],
                throttle_wait_timed: false,
            }],
        });
        let want = json!({
            "type": "policy_input", "cycle": 7, "forgotten_services": [2],
            "untargeted_services": [],
            "devices": [{
                "cycle": 7, "dev": 266338320u32, "interval_s": 1.0, "utilization": 0.5,
                "services": [{
                    "id": 0, "name": "db", "slo": {"class": "latency", "p999_ns": 5000000},
                    "floor": {"bytes_per_sec": 1000000}, "ceiling": null,
                    "read_bps": 4e6, "write_bps": 0.0, "read_iops": 1000.0, "write_iops": 0.0,
                    "p999_ns": 900000, "samples": 1000, "mean_latency_ns": 250000.5,
                    "mean_inflight": 0.25, "peak_inflight": null,
                    "limit": {"rbps": null, "wbps": 1048576, "riops": null, "wiops": null},
                    "latency_hist": [[600, 999], [700, 1]], "cgroup_ids": [42],
                    "changed_cycle": 5
                }],
                "throttle_wait_timed": false
            }]
        });
        assert_eq!(serde_json::to_value(&e).unwrap(), want);
        // And it reads back as itself.
        let back: Event = serde_json::from_value(want).unwrap();
        assert_eq!(back, e);
    }

    /// A float the writer could only spell `null` (NaN) does not cost the reader the event.
    #[test]
    fn a_null_number_reads_as_nan_not_as_a_lost_event() {
        let line = r#"{"schema":1,"ts":"","type":"cycle_end","cycle":3,"interval_s":null}"#;
        let e = RecordedEvent::parse(line).unwrap();
        match e.event {
            Event::CycleEnd(end) => assert!(end.interval_s.is_nan() && end.cycle == 3),
            other => panic!("{other:?}"),
        }
    }
}
