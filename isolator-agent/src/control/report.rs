//! The events the control stage says, one small function per kind: what a label SLO came
//! to, a service's cycle, a violation starting or ending, a limit or weight decided, and a
//! lasting error.

use crate::{
    config::{LatencyQuantile, ServiceSpec},
    enforcer::EnforceError,
    events::{Event, LabelSloInfo, ViolationInfo},
    measure::{
        character::{Character, CharacterClass},
        metrics::{log2_histogram, percentile},
    },
    policy::{Decision, DeviceCycle, Finding, ServiceLoad},
};

/// A `label_slo` event about `(container name, container id, pod UID when the labels are
/// a pod's)`; its service and SLO come from `service`.
pub(super) fn label_slo(
    outcome: &str,
    (container, container_id, pod_uid): (&str, &str, Option<&str>),
    service: Option<&ServiceSpec>,
    label: Option<String>,
    message: String,
) -> Event {
    Event::LabelSlo(label_slo_info(
        outcome,
        (container, container_id, pod_uid),
        service,
        label,
        message,
    ))
}

/// [`label_slo`]'s fields, for an outcome that adds one (`renamed`).
pub(super) fn label_slo_info(
    outcome: &str,
    (container, container_id, pod_uid): (&str, &str, Option<&str>),
    service: Option<&ServiceSpec>,
    label: Option<String>,
    message: String,
) -> LabelSloInfo {
    LabelSloInfo {
        outcome: outcome.into(),
        container: container.into(),
        container_id: container_id.into(),
        pod_uid: pod_uid.map(str::to_string),
        service: service.map(|s| s.name.clone()),
        slo: service.map(|s| s.class),
        label,
        renamed_from: None,
        message,
    }
}

/// One service on one device this cycle; `dev` is "major:minor", `disk` its kernel name.
pub(super) fn service_stats(
    d: &DeviceCycle,
    s: &ServiceLoad,
    dev: &str,
    disk: Option<String>,
    character: Option<Character>,
) -> Event {
    let state = if s.violating() {
        "violating"
    } else if !s.limit.is_unlimited() {
        "throttled"
    } else {
        "ok"
    };
    Event::ServiceStats(crate::events::ServiceStats {
        cycle: d.cycle,
        service: s.name.clone(),
        character,
        slo: s.class,
        dev: dev.to_string(),
        disk,
        state: state.into(),
        p50_ns: percentile(&s.latency_hist, s.samples, 0.50),
        p999_ns: s.p999_ns,
        slo_latency_ns: other_quantile(s)
            .and_then(|q| percentile(&s.latency_hist, s.samples, q.fraction())),
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
    })
}

/// A service's character class on a device turned into another over its window.
pub(super) fn character_change(
    d: &DeviceCycle,
    s: &ServiceLoad,
    dev: &str,
    disk: Option<String>,
    (from, to): (CharacterClass, CharacterClass),
    character: Character,
) -> Event {
    Event::CharacterChange(crate::events::CharacterChange {
        cycle: d.cycle,
        service: s.name.clone(),
        dev: dev.to_string(),
        disk,
        from: Some(from),
        to: Some(to),
        character,
    })
}

/// A service started (`started`) or stopped violating its SLO on a device.
/// What the policy found and told rather than acted on.
pub(super) fn finding(policy: &str, service_name: String, f: Finding) -> Event {
    match f {
        Finding::SloInfeasible {
            service: _,
            dev,
            cycle,
            latency,
            others_bps,
            action,
            reason,
        } => Event::SloInfeasible(crate::events::SloInfeasible {
            cycle,
            service: service_name,
            dev: crate::identify::disks::dev_text(dev),
            policy: policy.into(),
            latency,
            others_bps,
            action,
            reason,
        }),
        Finding::DiskStall {
            service: _,
            dev,
            cycle,
            latency,
            level_ns,
            others_bps,
            action,
        } => {
            // The level is on the scale the SLO is judged on: its field is the target's.
            let at_p999 = latency.quantile.is_none();
            Event::DiskStall(crate::events::DiskStall {
                cycle,
                service: service_name,
                dev: crate::identify::disks::dev_text(dev),
                policy: policy.into(),
                latency,
                level_p999_ns: level_ns.filter(|_| at_p999),
                level_latency_ns: level_ns.filter(|_| !at_p999),
                others_bps,
                action,
            })
        }
    }
}

pub(super) fn violation(d: &DeviceCycle, s: &ServiceLoad, dev: &str, started: bool) -> Event {
    let info = ViolationInfo {
        cycle: d.cycle,
        service: s.name.clone(),
        dev: dev.to_string(),
        p999_ns: s.judged_latency().and(s.p999_ns),
        latency_ns: other_quantile(s).and(s.judged_latency()),
        slo: s.class,
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
    Event::Decision(crate::events::Decision {
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
        decided: Some(dec.to.into()),
        cause: Some(dec.cause),
    })
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
    let what = ("weight", "configured weight");
    configured(cycle, (service, cgroup, None), what, (old, new), applied)
}

/// A knob the config asks for, written once (no policy decided it): (service, cgroup,
/// disk), (knob, reason).
fn configured(
    cycle: u64,
    (service, cgroup, dev): (&str, &str, Option<u32>),
    (knob, reason): (&str, &str),
    (old, new): (String, String),
    applied: bool,
) -> Event {
    Event::Decision(crate::events::Decision {
        cycle,
        policy: "config".into(),
        service: service.into(),
        cgroups: vec![cgroup.to_string()],
        dev: dev.map(crate::identify::disks::dev_text),
        knob: knob.into(),
        old,
        new,
        applied,
        reason: reason.into(),
        decided: None,
        cause: None,
    })
}

pub(super) fn weight_rejected(service: &str, cgroup: &str, e: &EnforceError) -> Event {
    error(
        "write_rejected",
        format!("weight of service '{service}' on {cgroup}: {e}"),
    )
}

/// iocost enabled on a disk (the root cgroup's io.cost.qos), as `[iocost]` asks: a
/// host-wide knob, of no service.
pub(super) fn iocost_decision(
    cycle: u64,
    dev: u32,
    old: String,
    new: String,
    applied: bool,
) -> Event {
    let what = (
        "iocost",
        "configured: iocost on this disk, so that io.weight acts there",
    );
    configured(cycle, ("", "/", Some(dev)), what, (old, new), applied)
}

pub(super) fn iocost_rejected(dev: u32, e: &EnforceError) -> Event {
    error(
        "write_rejected",
        format!(
            "iocost on disk {}: {e}",
            crate::identify::disks::dev_text(dev)
        ),
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
    Event::Error(crate::events::Notice {
        code: code.into(),
        message,
    })
}

/// A latency SLO's quantile when it is not p99.9: only then do events carry the latency at
/// it, so that a p99.9 service's events read as they did before there was a choice.
fn other_quantile(s: &ServiceLoad) -> Option<LatencyQuantile> {
    Some(s.slo_quantile()).filter(|&q| q != LatencyQuantile::P999)
}
