//! isolator: per-cgroup block I/O observation and SLO enforcement with eBPF.
//!
//! Each cycle is a pipeline, and the folders are its stages (README, "How it works"):
//! kernel -> [`collect`] -> [`identify`] -> [`measure`] -> decide ([`control`], [`policy`])
//! -> plan and enforce ([`control`], [`enforcer`]) -> emit ([`events`], and the metrics
//! endpoint, [`prometheus`]) -> readers ([`top`], [`replay`], [`advise`]). [`agent`] runs the stages in order.

pub mod advise;
pub mod agent;
pub mod check;
pub mod collect;
pub mod config;
pub mod control;
pub mod enforcer;
pub mod events;
pub mod identify;
pub mod measure;
pub mod policy;
pub mod privileges;
pub mod prometheus;
pub mod replay;
pub mod systemd;
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
