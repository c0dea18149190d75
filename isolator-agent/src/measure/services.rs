//! Each service's I/O on each device this cycle, summed over its cgroups' keys: the one
//! per-service aggregation of a snapshot, behind both `service_stats` and the policy's input
//! (the per-cgroup statistics, with their windows, are [`super::metrics`]).

use std::collections::{BTreeMap, BTreeSet};

use isolator_common::{OP_READ, OP_WRITE};

use crate::{
    collect::collector::{KeyDelta, LatencyDelta, Snapshot},
    measure::{character::CharacterCounts, metrics::HistSum},
    policy::ServiceId,
};

/// One service's I/O on one device this cycle.
#[derive(Default)]
pub struct ServiceIo {
    pub rbytes: u64,
    pub wbytes: u64,
    pub rios: u64,
    pub wios: u64,
    pub lat_count: u64,
    pub lat_sum: u64,
    pub total_count: u64,
    pub total_sum: u64,
    pub peak: u64,
    pub cgroups: BTreeSet<u64>,
    pub hist: HistSum,
    pub character: CharacterCounts,
}

/// Each service's I/O this cycle, by (device, service).
pub type ServiceIoByDevice = BTreeMap<(u32, ServiceId), ServiceIo>;

/// The latency a service's SLO is judged on, of one key's cycle: what the submitter waits,
/// queueing plus device time. Keys without start times (no queue timestamps) fall back to
/// device latency.
pub fn slo_latency(d: &KeyDelta) -> &LatencyDelta {
    if d.latency.total.count > 0 {
        &d.latency.total
    } else {
        &d.latency.device
    }
}

/// Sums the snapshot's keys per (device, service); `service_of` gives a cgroup's service.
/// Keys without requests count only for a (service, device) in `remembered` (the ones the
/// controller keeps state for), and every such one is there, I/O or not: a service with a
/// limit still gets a say (to be relaxed).
pub fn aggregate(
    snap: &Snapshot,
    service_of: &mut dyn FnMut(u64) -> Option<ServiceId>,
    remembered: &BTreeSet<(ServiceId, u32)>,
) -> ServiceIoByDevice {
    let mut acc = ServiceIoByDevice::new();
    for d in &snap.deltas {
        let Some(sid) = service_of(d.key.cgroup_id) else {
            continue;
        };
        if !d.had_requests() && !remembered.contains(&(sid, d.key.dev)) {
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
        a.hist.add(&slo_latency(d).hist);
        a.character.add(&CharacterCounts::of_delta(d));
    }
    for &(sid, dev) in remembered {
        acc.entry((dev, sid)).or_default();
    }
    acc
}
