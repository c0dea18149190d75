//! Stage 2, identify: what each cgroup id of a snapshot is. Its path in the hierarchy
//! ([`cgroupfs`]), its owner from the path ([`naming`]) and from the runtimes' APIs
//! ([`containers`], fed by [`docker`] and [`containerd`]), the SLO its container or pod
//! declares ([`labels`]), disk names and busy time ([`disks`]); the [`registry`] keeps what
//! it found for the cgroups in the maps.

pub mod cgroupfs;
pub mod containerd;
pub mod containers;
pub mod disks;
pub mod docker;
pub mod labels;
pub mod naming;
pub mod registry;
