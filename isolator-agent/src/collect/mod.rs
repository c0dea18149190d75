//! Stage 1, collect: the eBPF programs loaded and attached ([`probe`], with kernel struct
//! offsets from BTF in [`btf`]), and their maps read whole each cycle into a
//! [`collector::Snapshot`] of per-(cgroup, disk, op) deltas.

pub mod btf;
pub mod collector;
pub mod probe;
