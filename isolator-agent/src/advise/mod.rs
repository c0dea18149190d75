//! Stage advise: which services hurt each other on a disk, learned from the host's own
//! recorded events ([`interference`]), and which jobs to run together: paper 002's
//! guidelines ([`guidelines`]) and its batching controller ([`batching`]), with the jobs
//! placed on disks by [`jobs`]; `isolator advise` is [`command`].

pub mod batching;
pub mod command;
pub mod guidelines;
pub mod interference;
pub mod jobs;
