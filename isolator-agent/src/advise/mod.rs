//! `isolator advise`: which services hurt each other on a disk, learned from the host's
//! own recorded events, and which jobs to run together (paper 002's batches).

pub mod command;
pub mod interference;
pub mod jobs;
