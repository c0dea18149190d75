//! isolator: per-cgroup block I/O observation (and, later, SLO enforcement) with eBPF.
//!
//! Data flows one way: kernel -> [`probe`]/[`collector`] -> registry ([`cgroupfs`]) ->
//! [`metrics`] -> [`events`] sinks.

pub mod agent;
pub mod btf;
pub mod cgroupfs;
pub mod check;
pub mod collector;
pub mod config;
pub mod control;
pub mod disks;
pub mod docker;
pub mod enforcer;
pub mod events;
pub mod labels;
pub mod metrics;
pub mod naming;
pub mod output;
pub mod policy;
pub mod private_file;
pub mod privileges;
pub mod probe;
pub mod replay;
pub mod stream;
pub mod top;

/// The property tests' budget: a fixed number of cases, and no failure files written into
/// the tree, so the suite's run is bounded and leaves nothing.
#[cfg(test)]
pub(crate) fn proptest_budget(cases: u32) -> proptest::prelude::ProptestConfig {
    proptest::prelude::ProptestConfig {
        cases,
        failure_persistence: None,
        ..Default::default()
    }
}
