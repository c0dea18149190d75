//! Stage 3, measure: per (cgroup, disk, op) statistics over a histogram window
//! ([`metrics`], the `cgroup_stats` events), and per (service, disk) sums of the cycle
//! ([`services`], behind `service_stats` and the policy's input).

pub mod metrics;
pub mod services;
