//! The policy's input: each service's I/O on each device (summed by the measure stage,
//! [`crate::measure::services`]) with its SLO and the limit in force, as the
//! [`DeviceCycle`]s the policies decide on.

use std::collections::BTreeMap;

use super::{membership::Membership, ServiceStates};
use crate::{
    collect::collector::Snapshot,
    measure::metrics::percentile,
    measure::services::ServiceIoByDevice,
    policy::{DeviceCycle, ServiceLoad},
};

/// The policy input: per device, each service's rates, latency and the limit in force;
/// `utilization` gives a disk's busy fraction over the cycle.
pub(super) fn device_cycles(
    snap: &Snapshot,
    io: ServiceIoByDevice,
    membership: &Membership,
    states: &ServiceStates,
    utilization: &dyn Fn(u32) -> f64,
    throttle_wait_timed: bool,
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
            character: a.character,
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
            throttle_wait_timed,
        })
        .collect()
}
