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

/// Cumulative counters of one [`IoKey`] (the KEYS map): one value shared by every CPU,
/// updated with atomic adds. Never reset by the kernel; the agent diffs successive reads
/// with wrapping arithmetic. Small on purpose: it is preallocated for every key the map can
/// hold. It holds the key's requests in flight (with `--count-inflight`) and the bytes and
/// counts of completions that found no [`KeyHistograms`] entry; the key's total is the sum
/// of both maps.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeyCounters {
    /// Completed requests (final completion only).
    pub ios: u64,
    /// Completed bytes (every completion, partial ones included).
    pub bytes: u64,
    /// Requests counted in flight: +1 at a request's first issue, -1 at its completion.
    pub inflight: i64,
    /// Highest `inflight` seen at an issue in cycle `peak_epoch` (a lower bound: read
    /// after the add, racily).
    pub peak: i64,
    pub peak_epoch: u64,
}

/// Counts and latency sums of a key's completions on a subset of the CPUs: one cache line,
/// so CPUs of different stripes never write the same line.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompletionStripe {
    /// Completed requests (final completion only).
    pub ios: u64,
    /// Completed bytes (every completion, partial ones included).
    pub bytes: u64,
    /// Sums of the samples in each histogram, for means.
    pub lat_sum_ns: u64,
    pub queue_sum_ns: u64,
    pub total_sum_ns: u64,
    pub _pad: [u64; 3],
}

/// Stripes of [`KeyHistograms`]: a completion on CPU `c` counts in stripe `c % STRIPES`.
/// A hot key completing on many CPUs at once would otherwise move one counter line from
/// CPU to CPU on every request.
pub const STRIPES: usize = 4;

/// Completions of one [`IoKey`] (the HISTS map): one value shared by every CPU, updated
/// with atomic adds, allocated on the key's first completion, so a completion costs one
/// hash lookup. Its histograms are dense and exact; a sample's count is its bucket. Counts
/// are u32, diffed with wrapping arithmetic, exact while one bucket gets fewer than 2^32
/// samples per cycle.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct KeyHistograms {
    pub stripes: [CompletionStripe; STRIPES],
    /// Three histograms in [`latency_bucket`] layout, interleaved by bucket:
    /// `buckets[i][HIST_LAT]` device latency (issue -> complete), `[HIST_QUEUE]` queue time
    /// (request start -> issue), `[HIST_TOTAL]` total latency (start -> complete: what the
    /// submitter waits). A request's device and total latency are close, so their buckets
    /// usually share a cache line: one line written instead of two.
    pub buckets: [[u32; 3]; HIST_BUCKETS],
}

pub const HIST_LAT: usize = 0;
pub const HIST_QUEUE: usize = 1;
pub const HIST_TOTAL: usize = 2;

impl KeyHistograms {
    pub const ZERO: KeyHistograms = KeyHistograms {
        stripes: [CompletionStripe {
            ios: 0,
            bytes: 0,
            lat_sum_ns: 0,
            queue_sum_ns: 0,
            total_sum_ns: 0,
            _pad: [0; 3],
        }; STRIPES],
        buckets: [[0; 3]; HIST_BUCKETS],
    };

    /// The stripes summed (wrapping, as the counters are cumulative).
    pub fn totals(&self) -> CompletionStripe {
        let mut t = CompletionStripe::default();
        for s in &self.stripes {
            t.ios = t.ios.wrapping_add(s.ios);
            t.bytes = t.bytes.wrapping_add(s.bytes);
            t.lat_sum_ns = t.lat_sum_ns.wrapping_add(s.lat_sum_ns);
            t.queue_sum_ns = t.queue_sum_ns.wrapping_add(s.queue_sum_ns);
            t.total_sum_ns = t.total_sum_ns.wrapping_add(s.total_sum_ns);
        }
        t
    }
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
    /// `request_queue.disk` (5.15 on) or, with [`OFFSETS_DISK_IN_REQUEST`],
    /// `request.rq_disk` (before 5.17): where the request's gendisk is found.
    pub q_disk: u32,
    pub rq_disk: u32,
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
/// The gendisk is `request.rq_disk` (kernels before 5.15 have no `request_queue.disk`).
pub const OFFSETS_DISK_IN_REQUEST: u32 = 2;

/// Name of the global the loader sets with [`KernelOffsets`].
pub const OFFSETS_GLOBAL: &str = "OFFSETS";

/// Keys the KEYS map holds by default (`--max-keys`); a new key beyond is a counted loss
/// (`cycle_end.map_full`). Preallocated: an insert never fails for want of memory.
pub const DEFAULT_MAX_KEYS: u32 = 16384;
/// Keys the HISTS map holds by default (`--max-histogram-keys`); allocated per key on its
/// first completion. A completion without a histogram entry is a counted loss of its
/// latency sample (`cycle_end.unsampled_requests`); its bytes and count are kept. Sized for
/// 2,000 containers each reading and writing on two disks (16 KiB each, 128 MiB at most).
pub const DEFAULT_MAX_HISTOGRAM_KEYS: u32 = 8192;

/// Names of the maps the agent reads (the programs' `#[map(name = ...)]` must match).
pub const MAP_KEYS: &str = "KEYS";
pub const MAP_HISTS: &str = "HISTS";
pub const MAP_AGENT_STATE: &str = "AGENT_STATE";

/// Index of the attach timestamp in the AGENT_STATE array: the agent sets it just before
/// it attaches the issue program; requests issued before it were not counted in flight.
pub const STATE_FIRST_ISSUE_NS: u32 = 0;
/// Count of completions whose request was issued before the programs were attached.
pub const STATE_PREEXISTING: u32 = 1;
/// Count of requests lost because the KEYS map was full: data lost, reported by the agent.
pub const STATE_MAP_FULL: u32 = 2;
/// Current cycle number as userspace last set it; resets per-cycle peaks.
pub const STATE_EPOCH: u32 = 3;
/// Non-zero once some disk's queue does not fill `io_start_time_ns` (FALLBACK_DEVS used).
pub const STATE_FALLBACK_ANY: u32 = 4;
/// Non-zero once a request without `start_time_ns` was seen: block_rq_insert is needed.
pub const STATE_NEED_INSERT: u32 = 5;
/// Count of completions whose latency samples are not in the histograms because the key's
/// HISTS entry could not be allocated (map full, or no memory at that moment).
pub const STATE_UNSAMPLED: u32 = 6;
/// Non-zero when requests are counted in flight (`--count-inflight`): the issue program
/// counts them, the completion program takes them off.
pub const STATE_COUNT_INFLIGHT: u32 = 8;
/// Non-zero while the issue program records requests in EARLY_COUNTED: from before the
/// programs are attached until the agent's first cycle ends.
pub const STATE_EARLY_WINDOW: u32 = 7;
pub const STATE_SLOTS: u32 = 16;

/// A tracepoint and the program attached to it. Before 5.11, block_rq_issue and
/// block_rq_insert took `(struct request_queue *, struct request *)`; the object carries
/// a program for each shape and the loader picks the one the kernel's BTF declares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProgramSpec {
    pub tracepoint: &'static str,
    /// The program for `(struct request *, ...)`.
    pub program: &'static str,
    /// The program for `(struct request_queue *, struct request *)`, if the tracepoint
    /// ever had that shape.
    pub program_q_rq: Option<&'static str>,
}

/// Completion is attached before issue, so no request is counted in flight without a way
/// out.
pub const PROGRAMS: [ProgramSpec; 3] = [
    ProgramSpec {
        tracepoint: "block_rq_complete",
        program: "block_rq_complete",
        program_q_rq: None,
    },
    ProgramSpec {
        tracepoint: "block_rq_issue",
        program: "block_rq_issue",
        program_q_rq: Some("block_rq_issue_q_rq"),
    },
    ProgramSpec {
        tracepoint: "block_rq_insert",
        program: "block_rq_insert",
        program_q_rq: Some("block_rq_insert_q_rq"),
    },
];
/// Attached only when STATE_NEED_INSERT says the queue gives requests no start time.
pub const ON_DEMAND_TRACEPOINT: &str = "block_rq_insert";
/// Attached with `--count-inflight`, or when STATE_FALLBACK_ANY says some queue does not
/// stamp requests at issue (then it keeps their issue times).
pub const ISSUE_TRACEPOINT: &str = "block_rq_issue";

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain #[repr(C)] data without padding-sensitive invariants.
    unsafe impl aya::Pod for super::IoKey {}
    unsafe impl aya::Pod for super::KeyCounters {}
    unsafe impl aya::Pod for super::KeyHistograms {}
    unsafe impl aya::Pod for super::KernelOffsets {}
}
