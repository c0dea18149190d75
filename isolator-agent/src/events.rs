//! The event stream: one JSON object per line (NDJSON). Its schema is documented in
//! docs/events.md; bump [`SCHEMA_VERSION`] on any incompatible change.

use std::{io::Write, path::Path, time::SystemTime};

use serde::Serialize;

use crate::{
    cgroupfs::CgroupMode,
    docker::ContainerTable,
    metrics::OpStats,
    naming::{self, QosClass, Runtime, ServiceKind},
    output::{Notice, Output, Target},
    private_file::PrivateFileError,
    stream::{ReplayRole, StreamServer},
};

pub const SCHEMA_VERSION: u32 = 1;

/// A cgroup as the events name it: by id and path, and by what owns it.
#[derive(Debug, Clone, Serialize)]
pub struct CgroupRef {
    /// kernfs id (inode of the cgroup directory); 0 = unattributed.
    pub id: u64,
    /// Path relative to the io/blkio hierarchy root; null when unknown.
    pub path: Option<String>,
    pub kind: ServiceKind,
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    /// The container's image, when Docker knows the container.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime: Option<Runtime>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_qos: Option<QosClass>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
}

impl CgroupRef {
    /// Names a cgroup from its path (see [`crate::naming`]) and, for a Docker container,
    /// by the name Docker gives it.
    pub fn new(id: u64, path: Option<String>, containers: &ContainerTable) -> CgroupRef {
        let named = path.as_deref().map(naming::name_path);
        let kind = named.as_ref().map_or(ServiceKind::Cgroup, |n| n.kind);
        let id_of = |k: ServiceKind| named.as_ref().filter(|n| n.kind == k)?.id.clone();
        let container_id = id_of(ServiceKind::Container);
        let docker = container_id.as_deref().and_then(|c| containers.get(c));
        let name = match (&named, id, docker) {
            (_, _, Some(c)) => c.name.clone(),
            (Some(n), _, None) => n.name.clone(),
            (None, 0, None) => "unattributed".into(),
            (None, _, None) => format!("cgroup {id}"),
        };
        CgroupRef {
            id,
            image: docker.map(|c| c.image.clone()),
            container_id,
            unit: id_of(ServiceKind::Unit),
            runtime: named.as_ref().and_then(|n| n.runtime),
            pod_uid: named
                .as_ref()
                .and_then(|n| Some(n.pod.as_ref()?.uid.clone())),
            pod_qos: named.as_ref().and_then(|n| Some(n.pod.as_ref()?.qos)),
            path,
            kind,
            name,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
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
}

#[derive(Debug, Clone, Serialize)]
pub struct Totals {
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub read_mbps: f64,
    pub write_mbps: f64,
    pub iops: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ViolationInfo {
    pub cycle: u64,
    pub service: String,
    pub dev: String,
    pub p999_ns: Option<u64>,
    pub slo: crate::control::SloRef,
    pub vio: Option<f64>,
    pub rate_bps: f64,
}

/// What became of the SLO a container declares in its `isolator.*` labels.
#[derive(Debug, Clone, Serialize)]
pub struct LabelSloInfo {
    /// `applied`, `overridden` (the config claims the container), `invalid` (a malformed
    /// label; the container is unconfigured) or `released` (container stopped or labels
    /// changed).
    pub outcome: String,
    pub container: String,
    pub container_id: String,
    /// The service that governs the container now (or did, for `released`).
    pub service: Option<String>,
    pub slo: Option<crate::control::SloRef>,
    /// `key=value` of the malformed label (`invalid` only).
    pub label: Option<String>,
    pub message: String,
}

#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    AgentStart {
        version: String,
        host: String,
        pid: u32,
        kernel: String,
        cgroup_mode: CgroupMode,
        cgroup_root: String,
        attach: String,
        interval_s: f64,
        /// Control: the policy, or null when the agent only observes.
        policy: Option<String>,
        config: Option<String>,
        dry_run: bool,
        /// The per-key statistics map: capacity and kernel memory per key.
        stats_map: crate::probe::StatsCapacity,
        /// Where this kernel differs from current ones, as the loader found it.
        kernel_features: crate::probe::KernelFeatures,
    },
    CgroupStats {
        cycle: u64,
        interval_s: f64,
        cgroup: CgroupRef,
        totals: Totals,
        devices: Vec<DeviceStats>,
    },
    CgroupGone {
        cycle: u64,
        cgroup: CgroupRef,
    },
    CycleEnd {
        cycle: u64,
        interval_s: f64,
        cgroups: usize,
        tracked_keys: usize,
        /// Keys that left the maps this cycle (idle for --idle-key-timeout).
        evicted_keys: usize,
        preexisting_completions: u64,
        map_full: u64,
        unsampled_requests: u64,
        missed_events: u64,
        untraced_completions: u64,
        issue_map_timing: bool,
        insert_attached: bool,
        /// block_rq_issue is attached (--count-inflight, or a queue that does not stamp
        /// requests at issue).
        issue_attached: bool,
        collect_us: u64,
        /// Containers Docker reported that exist now (null: Docker off).
        docker_containers: Option<usize>,
        /// Events the output (stdout or --json) did not keep up with and lost, since start.
        events_dropped: u64,
        /// Disks with I/O this cycle and how busy they were.
        disks: Vec<DiskCycle>,
        /// Per-program kernel counters (run counts and time need bpf_stats_enabled).
        programs: Vec<crate::probe::ProgramStats>,
    },
    /// One service on one device, one cycle (only with --config).
    ServiceStats {
        cycle: u64,
        service: String,
        slo: crate::control::SloRef,
        dev: String,
        disk: Option<String>,
        state: String,
        p50_ns: Option<u64>,
        p999_ns: Option<u64>,
        samples: u64,
        /// The samples in power-of-two buckets: (upper bound ns, count), non-empty only.
        latency_log2: Vec<(u64, u64)>,
        /// Ids of the cgroups whose I/O on this device this cycle is the service's.
        cgroups: Vec<u64>,
        mean_latency_ns: Option<u64>,
        read_mbps: f64,
        write_mbps: f64,
        iops: f64,
        mean_inflight: f64,
        peak_inflight: Option<u64>,
        vio: Option<f64>,
        th_dif_mbps: Option<f64>,
        share: f64,
        utilization: f64,
        limit: crate::policy::IoMaxLimit,
    },
    /// A limit the policy (or the config) set, with the numbers behind it.
    Decision {
        cycle: u64,
        policy: String,
        service: String,
        cgroups: Vec<String>,
        dev: Option<String>,
        knob: String,
        old: String,
        new: String,
        applied: bool,
        reason: String,
        cause: Option<crate::policy::Cause>,
    },
    ViolationStart(ViolationInfo),
    ViolationEnd(ViolationInfo),
    /// A knob put back to the value it had before the agent touched it.
    Restore {
        reason: String,
        file: String,
        knob: String,
        value: String,
        result: String,
        /// What the knob held instead (`changed_by_other`): left as it is.
        #[serde(skip_serializing_if = "Option::is_none")]
        current: Option<String>,
    },
    Warning {
        code: String,
        message: String,
    },
    Error {
        code: String,
        message: String,
    },
    AgentStop {
        reason: String,
        cycles: u64,
    },
    /// The Docker daemon answered (at start or after being down).
    DockerConnected {
        socket: String,
        api_version: String,
        containers: usize,
    },
    LabelSlo(LabelSloInfo),
}

impl Event {
    /// What the event is to a new reader of the event socket.
    fn replay_role(&self) -> ReplayRole {
        match self {
            Event::AgentStart { .. } => ReplayRole::Start,
            Event::CgroupStats { .. } | Event::ServiceStats { .. } => ReplayRole::CycleRecord,
            Event::CycleEnd { .. } => ReplayRole::CycleEnd,
            _ => ReplayRole::Action,
        }
    }

    /// A knob put back, from the enforcer's report.
    pub fn restore(reason: &str, r: crate::enforcer::Restored) -> Event {
        Event::Restore {
            reason: reason.into(),
            file: r.file,
            knob: r.knob,
            value: r.value,
            result: r.result,
            current: r.current,
        }
    }
}

#[derive(Serialize)]
struct Envelope<'a> {
    schema: u32,
    ts: String,
    #[serde(flatten)]
    event: &'a Event,
}

/// One disk in `cycle_end`.
#[derive(Debug, Clone, Serialize)]
pub struct DiskCycle {
    pub dev: String,
    pub disk: Option<String>,
    /// Fraction of the cycle the disk had requests in flight (io_ticks).
    pub utilization: f64,
}

/// Writes events as NDJSON, and to the readers of the event socket when one is served.
/// Emitting never fails and never blocks: the output has a writer thread of its own (see
/// [`crate::output`]), and what happens to it comes back as warning events.
pub struct NdjsonSink {
    out: Output,
    socket: Option<StreamServer>,
}

impl NdjsonSink {
    pub fn stdout() -> Self {
        NdjsonSink::new(Output::start(Target::Stdout).expect("stdout needs no checks"))
    }

    pub fn to_writer(out: Box<dyn Write + Send>) -> Self {
        NdjsonSink::new(Output::start(Target::Writer(out)).expect("a writer needs no checks"))
    }

    /// Appends to `path`, created 0600, never through a symbolic link (see
    /// [`crate::private_file`]).
    pub fn file(path: &Path) -> Result<Self, PrivateFileError> {
        Ok(NdjsonSink::new(Output::start(Target::File(
            path.to_path_buf(),
        ))?))
    }

    fn new(out: Output) -> Self {
        NdjsonSink { out, socket: None }
    }

    /// The event socket, for a stopping agent to drain.
    pub fn take_socket(&mut self) -> Option<StreamServer> {
        self.socket.take()
    }

    /// Also serve every event on the socket from now on.
    pub fn serve(&mut self, socket: StreamServer) {
        self.socket = Some(socket);
    }

    /// Writes one event. What happens to the output is reported at [`NdjsonSink::flush`],
    /// once per cycle, not looked up per event.
    pub fn emit(&mut self, event: &Event) {
        let env = Envelope {
            schema: SCHEMA_VERSION,
            ts: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            event,
        };
        let line = match serde_json::to_string(&env) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "an event could not be serialized");
                return;
            }
        };
        if let Some(s) = &self.socket {
            s.publish(event.replay_role(), line.as_str().into());
        }
        self.out.send(line);
    }

    /// Says what happened to the output since last time: on stderr, and as an event (to
    /// the socket, and to the output itself, which takes it once it works again).
    fn report_output(&mut self) {
        for n in self.out.notices() {
            let (code, message) = match n {
                Notice::Failed { output, error } => (
                    "output_failed",
                    format!("cannot write events to {output} ({error}); the agent keeps controlling, and says when writing works again"),
                ),
                Notice::Stalled { output } => (
                    "output_stalled",
                    format!("{output} does not take events as fast as they come (a reader that stopped reading?); events are dropped until it does, the agent keeps controlling"),
                ),
                Notice::Recovered { output, dropped } => (
                    "output_recovered",
                    format!("writing events to {output} works again; {dropped} event(s) were lost meanwhile"),
                ),
            };
            tracing::warn!(code, "{message}");
            self.emit(&Event::Warning {
                code: code.into(),
                message,
            });
        }
    }

    /// Lines dropped because the output did not keep up, since start.
    pub fn dropped(&self) -> u64 {
        self.out.dropped()
    }

    /// Reports output faults seen since the last flush; the agent calls it at the end of
    /// start-up and of every cycle.
    pub fn flush(&mut self) {
        self.report_output();
    }

    /// Opens the --json file again (SIGHUP, after logrotate moved it).
    pub fn reopen(&mut self) {
        self.out.reopen();
    }

    /// At stop: waits at most `timeout` for the output to take every event.
    pub fn drain(&mut self, timeout: std::time::Duration) -> bool {
        let ok = self.out.drain(timeout);
        self.report_output();
        ok
    }
}
