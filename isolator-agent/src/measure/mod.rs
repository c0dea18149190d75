//! Stage 3, measure: per (cgroup, disk, op) statistics over a histogram window
//! ([`metrics`], the `cgroup_stats` events), per (service, disk) sums of the cycle
//! ([`services`], behind `service_stats` and the policy's input), and the I/O character of
//! a cgroup or service on a disk ([`character`]).

pub mod character;
pub mod metrics;
pub mod services;
