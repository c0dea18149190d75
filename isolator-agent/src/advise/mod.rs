//! Stage advise: which services should not share a disk, or should run in different batches
//! (paper 002's guidelines, [`guidelines`], and its batching controller, [`batching`]).

pub mod batching;
pub mod guidelines;
