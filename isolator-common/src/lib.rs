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

/// The three latencies of a request, from its own timestamps: one value of `T` for each
/// (a histogram bucket's counts, latency sums, a key's per-cycle samples). The kernel
/// values and the agent's deltas use this one type, so every place that handles "the
/// three latencies" names them the same way and a fourth could not be forgotten in one.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Latencies<T> {
    /// Device latency: issue (`io_start_time_ns`) -> completion.
    pub device: T,
    /// Queue time: request start (`start_time_ns`) -> issue.
    pub queue: T,
    /// Total latency: request start -> completion, what the submitter waits.
    pub total: T,
}

/// Which of the three [`Latencies`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Latency {
    Device,
    Queue,
    Total,
}

impl Latency {
    pub const ALL: [Latency; 3] = [Latency::Device, Latency::Queue, Latency::Total];
}

impl<T> Latencies<T> {
    /// One value per latency, computed by `f`.
    #[inline(always)]
    pub fn from_fn(mut f: impl FnMut(Latency) -> T) -> Self {
        Latencies {
            device: f(Latency::Device),
            queue: f(Latency::Queue),
            total: f(Latency::Total),
        }
    }

    #[inline(always)]
    pub fn get(&self, which: Latency) -> &T {
        match which {
            Latency::Device => &self.device,
            Latency::Queue => &self.queue,
            Latency::Total => &self.total,
        }
    }

    #[inline(always)]
    pub fn get_mut(&mut self, which: Latency) -> &mut T {
        match which {
            Latency::Device => &mut self.device,
            Latency::Queue => &mut self.queue,
            Latency::Total => &mut self.total,
        }
    }

    /// A pointer to one latency's value, projected without creating a reference: the
    /// kernel side's values are map memory other CPUs write at the same time.
    ///
    /// # Safety
    /// `this` must point into a live `Latencies<T>` (e.g. a map value).
    #[inline(always)]
    pub unsafe fn field_ptr(this: *mut Self, which: Latency) -> *mut T {
        // SAFETY: the caller guarantees `this` is in bounds of a live value; addr_of_mut!
        // only computes the field's address.
        unsafe {
            match which {
                Latency::Device => core::ptr::addr_of_mut!((*this).device),
                Latency::Queue => core::ptr::addr_of_mut!((*this).queue),
                Latency::Total => core::ptr::addr_of_mut!((*this).total),
            }
        }
    }
}

impl Latencies<u64> {
    pub const ZERO: Latencies<u64> = Latencies {
        device: 0,
        queue: 0,
        total: 0,
    };

    /// Field by field, wrapping (the kernel's sums are cumulative and may wrap).
    pub fn wrapping_add(self, o: Self) -> Self {
        Latencies::from_fn(|w| self.get(w).wrapping_add(*o.get(w)))
    }

    pub fn wrapping_sub(self, o: Self) -> Self {
        Latencies::from_fn(|w| self.get(w).wrapping_sub(*o.get(w)))
    }
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
    pub sum_ns: Latencies<u64>,
    /// Completed requests that started within [`SEQUENTIAL_GAP_BYTES`] of where the key's
    /// previous completed request ended (data requests only).
    pub sequential_ios: u32,
    /// Completed data requests per [`size_bucket`] of their size.
    pub size_ios: [u32; SIZE_BUCKETS],
}

impl CompletionStripe {
    pub const ZERO: CompletionStripe = CompletionStripe {
        ios: 0,
        bytes: 0,
        sum_ns: Latencies::<u64>::ZERO,
        sequential_ios: 0,
        size_ios: [0; SIZE_BUCKETS],
    };

    /// Field by field, wrapping (the counters are cumulative).
    pub fn wrapping_add(self, o: Self) -> Self {
        CompletionStripe {
            ios: self.ios.wrapping_add(o.ios),
            bytes: self.bytes.wrapping_add(o.bytes),
            sum_ns: self.sum_ns.wrapping_add(o.sum_ns),
            sequential_ios: self.sequential_ios.wrapping_add(o.sequential_ios),
            size_ios: [
                self.size_ios[0].wrapping_add(o.size_ios[0]),
                self.size_ios[1].wrapping_add(o.size_ios[1]),
                self.size_ios[2].wrapping_add(o.size_ios[2]),
                self.size_ios[3].wrapping_add(o.size_ios[3]),
                self.size_ios[4].wrapping_add(o.size_ios[4]),
            ],
        }
    }
}

/// Request-size buckets of a key's character counters (paper 002 bins workloads by request
/// size): <= 4 KiB, <= 16 KiB, <= 64 KiB, <= 256 KiB, larger.
pub const SIZE_BUCKETS: usize = 5;
/// Upper bounds of all but the last size bucket, in bytes.
pub const SIZE_BUCKET_LIMITS_BYTES: [u64; SIZE_BUCKETS - 1] =
    [4 << 10, 16 << 10, 64 << 10, 256 << 10];

/// The size bucket of a request of `bytes`: the one layout the programs and the agent share.
#[inline(always)]
pub const fn size_bucket(bytes: u64) -> usize {
    let mut i = 0;
    while i < SIZE_BUCKETS - 1 {
        if bytes <= SIZE_BUCKET_LIMITS_BYTES[i] {
            return i;
        }
        i += 1;
    }
    SIZE_BUCKETS - 1
}

/// A request is sequential when it starts within this many bytes of where the previous
/// request of its key (cgroup, disk, op) ended: small enough that random requests over any
/// sizeable file rarely land there, large enough for a stream whose requests complete a few
/// out of order at queue depth.
pub const SEQUENTIAL_GAP_BYTES: u64 = 1 << 20;

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
    /// Byte offset on the disk where the key's last completed data request ended (0: none
    /// yet): the next one is sequential if it starts near it. Shared by every CPU and
    /// stored without atomics: a racing store only misjudges one request.
    pub next_offset_bytes: u64,
    /// Three histograms in [`latency_bucket`] layout, interleaved by bucket: `buckets[i]`
    /// holds bucket `i` of each latency. A request's device and total latency are close,
    /// so their buckets usually share a cache line: one line written instead of two.
    pub buckets: [Latencies<u32>; HIST_BUCKETS],
}

impl KeyHistograms {
    pub const ZERO: KeyHistograms = KeyHistograms {
        stripes: [CompletionStripe::ZERO; STRIPES],
        next_offset_bytes: 0,
        buckets: [Latencies {
            device: 0,
            queue: 0,
            total: 0,
        }; HIST_BUCKETS],
    };

    /// The stripes summed (wrapping, as the counters are cumulative).
    pub fn totals(&self) -> CompletionStripe {
        self.stripes
            .iter()
            .fold(CompletionStripe::ZERO, |t, s| t.wrapping_add(*s))
    }
}

// The kernel values' layout is part of the contract with the eBPF object (and the HISTS
// element must stay within its 16 KiB allocation): pin it.
const _: () = {
    use core::mem::{align_of, size_of};
    assert!(size_of::<Latencies<u32>>() == 12 && align_of::<Latencies<u32>>() == 4);
    assert!(size_of::<Latencies<u64>>() == 24);
    assert!(size_of::<CompletionStripe>() == 64);
    // The offset's 8 bytes round the value up to the stripes' 64-byte alignment.
    assert!(size_of::<KeyHistograms>() == STRIPES * 64 + 64 + HIST_BUCKETS * 12);
    assert!(size_of::<KeyCounters>() == 40);
    assert!(size_of::<IoKey>() == 16);
    assert!(size_of::<KernelOffsets>() == 19 * 4);
    assert!(size_of::<ThrottleHold>() == 32);
};

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
    /// `request.__sector`: where the request starts, in 512-byte sectors.
    pub rq_sector: u32,
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
    /// `bio.bi_iter.bi_sector`: where a bio starts, in 512-byte sectors.
    pub bio_bi_sector: u32,
    /// [`OFFSETS_HAVE_BLKCG`] if the kernel has CONFIG_BLK_CGROUP (bio->bi_blkg exists).
    pub flags: u32,
}

pub const OFFSETS_HAVE_BLKCG: u32 = 1;
/// The gendisk is `request.rq_disk` (kernels before 5.15 have no `request_queue.disk`).
pub const OFFSETS_DISK_IN_REQUEST: u32 = 2;
/// A bio the throttle held passes its decision again, unheld, when it is let go (the older
/// `blk_throtl_bio`, which resubmits through the whole check; `__blk_throtl_bio` kernels
/// dispatch it past the check).
pub const OFFSETS_THROTTLE_REPASS: u32 = 4;

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

/// Names of the object's maps. aya-ebpf's `#[map(name = ...)]` takes only a string
/// literal, so the programs spell them again; `probe::tests` checks the embedded object
/// against these (names, types, sizes) so the two cannot drift.
pub const MAP_KEYS: &str = "KEYS";
pub const MAP_HISTS: &str = "HISTS";
pub const MAP_AGENT_STATE: &str = "AGENT_STATE";
/// Maps only the programs use (the agent never opens them).
pub const MAP_ZERO_HISTS: &str = "ZERO_HISTS";
pub const MAP_ISSUE_TS: &str = "ISSUE_TS";
pub const MAP_INSERT_TS: &str = "INSERT_TS";
pub const MAP_EARLY_COUNTED: &str = "EARLY_COUNTED";
pub const MAP_FALLBACK_DEVS: &str = "FALLBACK_DEVS";
pub const MAP_THROTTLE_HOLDS: &str = "THROTTLE_HOLDS";

/// A bio the cgroup's I/O limit (blk-throttle: v1 `blkio.throttle.*`, v2 `io.max`) queued
/// instead of passing on, keyed in THROTTLE_HOLDS by the bio's address until the request
/// it starts completes. The request is allocated only when the throttle lets the bio go,
/// so without this its total latency would leave out the wait the limit imposed: a service
/// the agent caps would look fast to the agent while its submitter waits.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThrottleHold {
    /// When the throttle queued the bio (monotonic ns).
    pub since_ns: u64,
    /// The blkcg the bio is charged to, and where it starts: the completion takes the hold
    /// only if its request matches both, so a stale entry whose address a later bio reuses
    /// (a held bio merged into another request, or split) is never taken.
    pub cgroup_id: u64,
    pub sector: u64,
    /// Non-zero once the throttle let the bio go, on kernels where it passes the decision
    /// again then ([`OFFSETS_THROTTLE_REPASS`]); a second unheld pass at the address is
    /// another bio's.
    pub released: u64,
}

/// Held bios tracked at once, host-wide (LRU; preallocated, 56 B each with the header).
pub const THROTTLE_HOLD_ENTRIES: u32 = 16384;
/// The kernel function that decides whether blk-throttle holds a bio, `bool f(struct bio
/// *)`: `__blk_throtl_bio` on current kernels, `blk_throtl_bio` on older ones. The agent
/// traces its return. Current kernels call it only for bios whose cgroup (or an ancestor)
/// has a limit, so other bios pay nothing; older ones call it for every bio.
pub const THROTTLE_FUNCTIONS: [&str; 2] = ["__blk_throtl_bio", "blk_throtl_bio"];
pub const THROTTLE_PROGRAM: &str = "throttle_exit";

/// Entries of the maps keyed by request (ISSUE_TS, INSERT_TS, EARLY_COUNTED): requests in
/// flight host-wide at once, with room. LRU maps are preallocated: 16,384 entries cost
/// 1 MiB each.
pub const REQUEST_MAP_ENTRIES: u32 = 16384;
/// Disks whose queue does not stamp `io_start_time_ns` (FALLBACK_DEVS) at most.
pub const FALLBACK_DEVS_ENTRIES: u32 = 256;
/// HISTS is allocated per key on its first completion, not preallocated (`BPF_F_NO_PREALLOC`).
pub const HISTS_MAP_FLAGS: u32 = BPF_F_NO_PREALLOC;
pub const BPF_F_NO_PREALLOC: u32 = 1;

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
/// Non-zero once the throttle program recorded a held bio: from then on completions look
/// for their first bio in THROTTLE_HOLDS (hosts without I/O limits never pay the lookup).
pub const STATE_HOLDS_SEEN: u32 = 9;
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
        tracepoint: COMPLETE_TRACEPOINT,
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
/// Always attached: it counts every request.
pub const COMPLETE_TRACEPOINT: &str = "block_rq_complete";
/// Attached only when STATE_NEED_INSERT says the queue gives requests no start time.
pub const ON_DEMAND_TRACEPOINT: &str = "block_rq_insert";
/// Attached with `--count-inflight`, or when STATE_FALLBACK_ANY says some queue does not
/// stamp requests at issue (then it keeps their issue times).
pub const ISSUE_TRACEPOINT: &str = "block_rq_issue";

#[cfg(feature = "user")]
mod pod {
    // SAFETY: aya copies these to and from map memory as bytes. Each is #[repr(C)], Copy,
    // made of integers only (every bit pattern is a valid value) and has no padding (the
    // size asserts above), so no uninitialised byte is read and any bytes are a value.
    unsafe impl aya::Pod for super::IoKey {}
    unsafe impl aya::Pod for super::KeyCounters {}
    unsafe impl aya::Pod for super::KeyHistograms {}
    unsafe impl aya::Pod for super::KernelOffsets {}
    unsafe impl aya::Pod for super::ThrottleHold {}
}

#[cfg(test)]
mod tests {
    #[test]
    fn size_buckets_split_at_their_limits() {
        use super::size_bucket;
        let cases = [
            (512, 0),
            (4096, 0),
            (4097, 1),
            (16384, 1),
            (65536, 2),
            (65537, 3),
            (262144, 3),
            (262145, 4),
            (4 << 20, 4),
        ];
        for (bytes, bucket) in cases {
            assert_eq!(size_bucket(bytes), bucket, "{bytes} bytes");
        }
    }

    use super::*;

    #[test]
    fn stripe_totals_add_every_field_wrapping() {
        let mut h = KeyHistograms::ZERO;
        h.stripes[0] = CompletionStripe {
            ios: u64::MAX,
            bytes: 10,
            sum_ns: Latencies {
                device: 1,
                queue: 2,
                total: u64::MAX,
            },
            sequential_ios: u32::MAX,
            size_ios: [1, 2, 3, 4, u32::MAX],
        };
        h.stripes[3].ios = 2;
        h.stripes[3].sequential_ios = 3;
        h.stripes[3].size_ios = [1, 0, 0, 0, 2];
        h.stripes[3].bytes = 5;
        h.stripes[3].sum_ns = Latencies {
            device: 10,
            queue: 20,
            total: 3,
        };
        let t = h.totals();
        assert_eq!((t.ios, t.bytes), (1, 15));
        assert_eq!((t.sequential_ios, t.size_ios), (2, [2, 2, 3, 4, 1]));
        assert_eq!(
            t.sum_ns,
            Latencies {
                device: 11,
                queue: 22,
                total: 2
            }
        );
        assert_eq!(
            t.sum_ns.wrapping_sub(h.stripes[3].sum_ns),
            h.stripes[0].sum_ns
        );
    }

    #[test]
    fn latencies_are_picked_by_kind_in_declaration_order() {
        let mut l = Latencies::from_fn(|w| w as u32);
        assert_eq!((l.device, l.queue, l.total), (0, 1, 2));
        for (i, w) in Latency::ALL.into_iter().enumerate() {
            assert_eq!(*l.get(w), i as u32);
            *l.get_mut(w) += 10;
            // SAFETY: the pointer comes from a live local.
            assert_eq!(unsafe { *Latencies::field_ptr(&mut l, w) }, i as u32 + 10);
        }
    }
}
