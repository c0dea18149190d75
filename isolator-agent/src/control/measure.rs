//! The control stage's one aggregation of a cycle's snapshot: each service's I/O on each
//! device, summed over its cgroups' keys, into the [`DeviceCycle`]s the policies decide on.

use std::collections::{BTreeMap, BTreeSet};

use isolator_common::{OP_READ, OP_WRITE};

use super::{membership::Membership, ServiceStates};
use crate::{
    collector::Snapshot,
    metrics::{percentile, HistSum},
    policy::{DeviceCycle, ServiceId, ServiceLoad},
};

/// One service's I/O on one device this cycle.
#[derive(Default)]
pub(super) struct ServiceIo {
    rbytes: u64,
    wbytes: u64,
    rios: u64,
    wios: u64,
    lat_count: u64,
    lat_sum: u64,
    total_count: u64,
    total_sum: u64,
    peak: u64,
    cgroups: BTreeSet<u64>,
    hist: HistSum,
}

/// Each service's I/O this cycle, by (device, service).
pub(super) type ServiceIoByDevice = BTreeMap<(u32, ServiceId), ServiceIo>;

/// Sums the snapshot's keys per (device, service); `service_of` gives a cgroup's service.
/// Keys without requests count only for a service the controller remembers on the device,
/// and every such service is there, I/O or not: one with a limit still gets a say (to be
/// relaxed).
pub(super) fn aggregate(
    snap: &Snapshot,
    service_of: &mut dyn FnMut(u64) -> Option<ServiceId>,
    states: &ServiceStates,
) -> ServiceIoByDevice {
    let mut acc = ServiceIoByDevice::new();
    for d in &snap.deltas {
        let Some(sid) = service_of(d.key.cgroup_id) else {
            continue;
        };
        if !d.had_requests() && !states.contains_key(&(sid, d.key.dev)) {
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
    for &(sid, dev) in states.keys() {
        acc.entry((dev, sid)).or_default();
    }
    acc
}

/// The policy input: per device, each service's rates, latency and the limit in force;
/// `utilization` gives a disk's busy fraction over the cycle.
pub(super) fn device_cycles(
    snap: &Snapshot,
    io: ServiceIoByDevice,
    membership: &Membership,
    states: &ServiceStates,
    utilization: &dyn Fn(u32) -> f64,
) -> Vec<DeviceCycle> {
    let secs = snap.interval_ns as f64 / 1e9;
    let mut by_dev: BTreeMap<u32, Vec<ServiceLoad>> = BTreeMap::new();
    for ((dev, sid), a) in io {
        let Some(spec) = membership.spec(sid) else {
            continue;
        };
        let sparse = a.hist.sparse();
        let samples = a.hist.samples();
        let st = states.get(&(sid, dev)).cloned().unwrap_or_default();
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
