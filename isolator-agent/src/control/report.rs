//! The events the control stage says, one small function per kind: what a label SLO came
//! to, a service's cycle, a violation starting or ending, a limit or weight decided, and a
//! lasting error.

use serde::Serialize;

use crate::{
    config::{ServiceSpec, SloClass},
    enforcer::EnforceError,
    events::{Event, LabelSloInfo, ViolationInfo},
    metrics::{log2_histogram, percentile},
    policy::{Decision, DeviceCycle, ServiceLoad},
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

/// A `label_slo` event; its service and SLO come from `service`.
pub(super) fn label_slo(
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

/// One service on one device this cycle; `dev` is "major:minor", `disk` its kernel name.
pub(super) fn service_stats(
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
        latency_log2: log2_histogram(&s.latency_hist),
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

/// A service started (`started`) or stopped violating its SLO on a device.
pub(super) fn violation(d: &DeviceCycle, s: &ServiceLoad, dev: &str, started: bool) -> Event {
    let info = ViolationInfo {
        cycle: d.cycle,
        service: s.name.clone(),
        dev: dev.to_string(),
        p999_ns: s.judged_p999(),
        slo: s.class.into(),
        vio: s.vio(),
        rate_bps: s.bps(),
    };
    if started {
        Event::ViolationStart(info)
    } else {
        Event::ViolationEnd(info)
    }
}

/// What a limit decision came to on the service's cgroups.
pub(super) struct LimitOutcome {
    pub cgroups: Vec<String>,
    /// The knob's value before and after, as the first cgroup written showed them.
    pub old: String,
    pub new: String,
    pub applied: bool,
    /// The policy's reason, with what the split added.
    pub reason: String,
}

/// A limit the policy (or a configured ceiling) set on a device.
pub(super) fn limit_decision(
    cycle: u64,
    policy: &str,
    service: &str,
    dev: &str,
    dec: Decision,
    outcome: LimitOutcome,
) -> Event {
    Event::Decision {
        cycle,
        policy: policy.into(),
        service: service.into(),
        cgroups: outcome.cgroups,
        dev: Some(dev.to_string()),
        knob: dec.knob.name().into(),
        old: outcome.old,
        new: outcome.new,
        applied: outcome.applied,
        reason: outcome.reason,
        cause: Some(dec.cause),
    }
}

/// A configured weight written on one cgroup.
pub(super) fn weight_decision(
    cycle: u64,
    service: &str,
    cgroup: &str,
    old: String,
    new: String,
    applied: bool,
) -> Event {
    Event::Decision {
        cycle,
        policy: "config".into(),
        service: service.into(),
        cgroups: vec![cgroup.to_string()],
        dev: None,
        knob: "weight".into(),
        old,
        new,
        applied,
        reason: "configured weight".into(),
        cause: None,
    }
}

pub(super) fn weight_rejected(service: &str, cgroup: &str, e: &EnforceError) -> Event {
    error(
        "write_rejected",
        format!("weight of service '{service}' on {cgroup}: {e}"),
    )
}

/// A limit the enforcer could not write on one of the service's cgroups.
pub(super) fn limit_failed(
    service: &str,
    cgroup: &str,
    dev: &str,
    dec: &Decision,
    e: &EnforceError,
) -> Event {
    let code = match e {
        EnforceError::CgroupGone(_) => "cgroup_gone",
        EnforceError::Journal { .. } => "journal",
        EnforceError::Partition { .. } => "partition",
        EnforceError::ChangedByOther { .. } => "changed_by_other",
        _ => "write_rejected",
    };
    error(
        code,
        format!(
            "service '{service}', cgroup {cgroup}, {dev} {}: {e}",
            dec.knob.name()
        ),
    )
}

pub(super) fn no_cgroup(service: &str) -> Event {
    error(
        "no_cgroup",
        format!("service '{service}' matches no cgroup any more; nothing to throttle"),
    )
}

fn error(code: &str, message: String) -> Event {
    Event::Error {
        code: code.into(),
        message,
    }
}
