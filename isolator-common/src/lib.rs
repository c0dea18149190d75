//! Types shared by the eBPF programs and the agent. Everything here is plain data with a
//! fixed `#[repr(C)]` layout, so both sides read the same bytes. The histogram bucket
//! layout lives here once: the kernel uses [`latency_bucket`] to count, userspace uses
//! [`bucket_lower_ns`] / [`bucket_representative_ns`] to read back; they cannot drift.
#![cfg_attr(not(test), no_std)]

pub mod histogram;

pub use histogram::{
    bucket_lower_ns, bucket_representative_ns, bucket_width_ns, latency_bucket, HIST_BUCKETS,
    HIST_MAX_EXACT_NS,
};

/// Cgroup id used for requests the kernel charges to no cgroup (no bio, e.g. flushes, or a
/// bio without a blkg).
pub const UNATTRIBUTED_CGROUP: u64 = 0;

/// Operation class of a request (derived from `REQ_OP_*` in `cmd_flags`).
pub const OP_READ: u32 = 0;
pub const OP_WRITE: u32 = 1;
pub const OP_OTHER: u32 = 2;

/// Kernel `REQ_OP_*` values (include/linux/blk_types.h), stable since 4.10.
pub const REQ_OP_MASK: u32 = 0xff;
pub const REQ_OP_READ: u32 = 0;
pub const REQ_OP_WRITE: u32 = 1;
pub const REQ_OP_DRV_IN: u32 = 34;
pub const REQ_OP_DRV_OUT: u32 = 35;

/// Kernel dev_t encoding (MINORBITS = 20).
pub const fn kernel_dev(major: u32, minor: u32) -> u32 {
    (major << 20) | (minor & 0xfffff)
}
pub const fn dev_major(dev: u32) -> u32 {
    dev >> 20
}
pub const fn dev_minor(dev: u32) -> u32 {
    dev & 0xfffff
}

/// Key of every per-request statistic: who the kernel charged, on which disk, which op.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct IoKey {
    /// kernfs id of the blkcg's cgroup (= inode number of its cgroupfs directory in the
    /// hierarchy that holds the io/blkio controller), or [`UNATTRIBUTED_CGROUP`].
    pub cgroup_id: u64,
    /// Kernel dev_t of the whole disk (`major << 20 | first_minor`).
    pub dev: u32,
    /// [`OP_READ`], [`OP_WRITE`] or [`OP_OTHER`].
    pub op: u32,
}

/// Cumulative per-CPU counters for one [`IoKey`]. Never reset by the kernel; the agent
/// diffs successive reads. Histogram counts are u32 and diffed with wrapping arithmetic,
/// which is exact as long as one bucket gets fewer than 2^32 samples per cycle.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IoStats {
    /// Completed requests (final completion only).
    pub ios: u64,
    /// Completed bytes (every completion, partial ones included).
    pub bytes: u64,
    /// Requests with a device-latency sample, and the sum of those samples.
    pub lat_count: u64,
    pub lat_sum_ns: u64,
    /// Requests with a queue-time sample, and the sum of those samples.
    pub queue_count: u64,
    pub queue_sum_ns: u64,
    /// Requests with a total-latency sample (request start -> complete: what the
    /// submitter waits, queueing included), and their sum.
    pub total_count: u64,
    pub total_sum_ns: u64,
    /// Device latency (issue -> complete), [`latency_bucket`] layout.
    pub lat_hist: [u32; HIST_BUCKETS],
    /// Queue time (request start -> issue), [`latency_bucket`] layout.
    pub queue_hist: [u32; HIST_BUCKETS],
    /// Total latency (request start -> complete), [`latency_bucket`] layout.
    pub total_hist: [u32; HIST_BUCKETS],
}

impl IoStats {
    pub const ZERO: IoStats = IoStats {
        ios: 0,
        bytes: 0,
        lat_count: 0,
        lat_sum_ns: 0,
        queue_count: 0,
        queue_sum_ns: 0,
        total_count: 0,
        total_sum_ns: 0,
        lat_hist: [0; HIST_BUCKETS],
        queue_hist: [0; HIST_BUCKETS],
        total_hist: [0; HIST_BUCKETS],
    };
}

/// Byte offsets of the kernel struct members the programs read, resolved from the running
/// kernel's BTF at load time and handed to the programs as a read-only global. Nothing here
/// is frozen at build time.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelOffsets {
    pub rq_q: u32,
    pub rq_bio: u32,
    pub rq_cmd_flags: u32,
    pub rq_data_len: u32,
    pub rq_start_time_ns: u32,
    pub rq_io_start_time_ns: u32,
    pub q_disk: u32,
    pub disk_major: u32,
    pub disk_first_minor: u32,
    pub bio_bi_blkg: u32,
    pub blkg_blkcg: u32,
    pub blkcg_css: u32,
    pub css_cgroup: u32,
    pub cgroup_kn: u32,
    pub kn_id: u32,
    /// [`OFFSETS_HAVE_BLKCG`] if the kernel has CONFIG_BLK_CGROUP (bio->bi_blkg exists).
    pub flags: u32,
}

pub const OFFSETS_HAVE_BLKCG: u32 = 1;

/// Name of the global the loader sets with [`KernelOffsets`].
pub const OFFSETS_GLOBAL: &str = "OFFSETS";

/// Keys IO_STATS holds at most; a key beyond is a counted loss (`cycle_end.map_full`).
pub const STATS_CAPACITY_KEYS: u32 = 16384;

/// Names of the maps the agent reads (the programs' `#[map(name = ...)]` must match).
pub const MAP_STATS: &str = "IO_STATS";
pub const MAP_INFLIGHT: &str = "INFLIGHT";
pub const MAP_AGENT_STATE: &str = "AGENT_STATE";
pub const MAP_SPILL: &str = "IO_SPILL";

/// Index of the first-issue timestamp in the AGENT_STATE array.
pub const STATE_FIRST_ISSUE_NS: u32 = 0;
/// Count of completions whose request was issued before the programs were attached.
pub const STATE_PREEXISTING: u32 = 1;
/// Count of failed map inserts (map full): data lost, reported by the agent.
pub const STATE_MAP_FULL: u32 = 2;
/// Current cycle number as userspace last set it; resets per-cycle peaks.
pub const STATE_EPOCH: u32 = 3;
/// Non-zero once some disk's queue does not fill `io_start_time_ns` (FALLBACK_DEVS used).
pub const STATE_FALLBACK_ANY: u32 = 4;
/// Non-zero once a request without `start_time_ns` was seen: block_rq_insert is needed.
pub const STATE_NEED_INSERT: u32 = 5;
/// Count of requests whose latency (at completion) or queue-time (at issue) sample is not in
/// the histograms because their IO_STATS entry could not be allocated at that moment.
pub const STATE_UNSAMPLED: u32 = 6;
pub const STATE_SLOTS: u32 = 8;

/// Spill slots per CPU. IO_STATS allocates an entry on a key's first request from the
/// kernel's BPF allocator, whose per-CPU cache is refilled asynchronously (irq_work), so
/// the insert can fail for a moment when several keys appear at once. A completion whose
/// entry cannot be created counts its bytes and ios in a preallocated slot of its CPU
/// instead; the agent folds the slot into the key and frees it once the entry exists.
pub const SPILL_SLOTS_PER_CPU: u32 = 16;
pub const SPILL_FREE: u64 = 0;
pub const SPILL_CLAIMING: u64 = 1;
pub const SPILL_OWNED: u64 = 2;

/// One spill slot (IO_SPILL is an array of `possible CPUs x SPILL_SLOTS_PER_CPU`; a CPU
/// writes only its own slots).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpillSlot {
    /// [`SPILL_FREE`], [`SPILL_CLAIMING`] or [`SPILL_OWNED`].
    pub state: u64,
    pub key: IoKey,
    /// Completed requests (final completion only), as [`IoStats::ios`].
    pub ios: u64,
    /// Completed bytes, as [`IoStats::bytes`].
    pub bytes: u64,
}

/// In-flight requests of one key (shared by all CPUs, updated atomically).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Inflight {
    /// Dispatched and not yet completed.
    pub count: i64,
    /// Highest `count` seen since the first issue in cycle `epoch`.
    pub peak: i64,
    pub epoch: u64,
}

/// Program names (function names in the eBPF object) and their tracepoints. Completion is
/// attached before issue, so no request is counted in flight without a way out.
pub const PROGRAMS: [(&str, &str); 3] = [
    ("block_rq_complete", "block_rq_complete"),
    ("block_rq_issue", "block_rq_issue"),
    ("block_rq_insert", "block_rq_insert"),
];
/// Attached only when STATE_NEED_INSERT says the queue gives requests no start time.
pub const ON_DEMAND_PROGRAM: &str = "block_rq_insert";

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain #[repr(C)] data without padding-sensitive invariants.
    unsafe impl aya::Pod for super::IoKey {}
    unsafe impl aya::Pod for super::IoStats {}
    unsafe impl aya::Pod for super::KernelOffsets {}
    unsafe impl aya::Pod for super::Inflight {}
    unsafe impl aya::Pod for super::SpillSlot {}
}
