//! Stage 3, measure: per (cgroup, disk, op) statistics over a histogram window
//! ([`metrics`], the `cgroup_stats` events). The per (service, disk) aggregation the
//! policy decides on lives with the services it sums, in `control::measure`.

pub mod metrics;
