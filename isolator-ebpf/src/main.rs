//! Block request tracing: per (cgroup, disk, op) latency/queue-time histograms, counts and
//! bytes in per-CPU maps, plus in-flight counters. No per-request data leaves the kernel.
//!
//! Timing reads the request's own timestamps (`io_start_time_ns`, `start_time_ns`) at
//! completion/issue; a timestamp map keyed by request pointer is used only on devices whose
//! queue does not fill them (learned at the first completion that lacks one).
//!
//! Attribution: `rq->bio->bi_blkg->blkcg->css.cgroup->kn->id`, the blkcg the kernel
//! charges the request to. Struct offsets come from the running kernel's BTF (OFFSETS).
#![no_std]
#![no_main]
#![feature(core_intrinsics)]
#![allow(internal_features)]

use core::intrinsics::{
    atomic_cxchg, atomic_xadd, atomic_xchg,
    AtomicOrdering::{Relaxed, SeqCst},
};

use aya_ebpf::{
    helpers::{bpf_get_smp_processor_id, bpf_ktime_get_ns},
    macros::{btf_tracepoint, map},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, PerCpuHashMap},
    programs::BtfTracePointContext,
};
use isolator_common::{
    kernel_dev, latency_bucket, Inflight, IoKey, IoStats, KernelOffsets, SpillSlot, HIST_BUCKETS,
    OFFSETS_HAVE_BLKCG, OP_OTHER, OP_READ, OP_WRITE, REQ_OP_DRV_IN, REQ_OP_DRV_OUT, REQ_OP_MASK,
    REQ_OP_READ, REQ_OP_WRITE, SPILL_CLAIMING, SPILL_FREE, SPILL_OWNED, SPILL_SLOTS_PER_CPU,
    STATE_EPOCH, STATE_FALLBACK_ANY, STATE_FIRST_ISSUE_NS, STATE_MAP_FULL, STATE_NEED_INSERT,
    STATE_PREEXISTING, STATE_SLOTS, STATE_UNSAMPLED, UNATTRIBUTED_CGROUP,
};

#[no_mangle]
static OFFSETS: KernelOffsets = KernelOffsets {
    rq_q: 0,
    rq_bio: 0,
    rq_cmd_flags: 0,
    rq_data_len: 0,
    rq_start_time_ns: 0,
    rq_io_start_time_ns: 0,
    q_disk: 0,
    disk_major: 0,
    disk_first_minor: 0,
    bio_bi_blkg: 0,
    blkg_blkcg: 0,
    blkcg_css: 0,
    css_cgroup: 0,
    cgroup_kn: 0,
    kn_id: 0,
    flags: 0,
};

const MAX_KEYS: u32 = isolator_common::STATS_CAPACITY_KEYS;
const BPF_F_NO_PREALLOC: u32 = 1;
const BPF_NOEXIST: u64 = 1;

#[map(name = "IO_STATS")]
static IO_STATS: PerCpuHashMap<IoKey, IoStats> =
    PerCpuHashMap::with_max_entries(MAX_KEYS, BPF_F_NO_PREALLOC);

/// Source of a zeroed IoStats for inserts (too large for the 512-byte stack).
#[map(name = "ZERO_STATS")]
static ZERO_STATS: PerCpuArray<IoStats> = PerCpuArray::with_max_entries(1, 0);

/// Preallocated (about 1.5 MiB at MAX_KEYS), so an issue never fails to count a request
/// in flight for want of memory.
#[map(name = "INFLIGHT")]
static INFLIGHT: HashMap<IoKey, Inflight> = HashMap::with_max_entries(MAX_KEYS, 0);

/// Per-CPU spill slots for completions whose IO_STATS entry could not be allocated; the
/// loader sizes it to possible CPUs x SPILL_SLOTS_PER_CPU.
#[map(name = "IO_SPILL")]
static IO_SPILL: Array<SpillSlot> = Array::with_max_entries(SPILL_SLOTS_PER_CPU, 0);

/// Fallback issue timestamps, only for devices in FALLBACK_DEVS.
#[map(name = "ISSUE_TS")]
static ISSUE_TS: LruHashMap<u64, u64> = LruHashMap::with_max_entries(65536, 0);

/// Fallback insert timestamps, only for requests whose start_time_ns is not set.
#[map(name = "INSERT_TS")]
static INSERT_TS: LruHashMap<u64, u64> = LruHashMap::with_max_entries(65536, 0);

/// Requests counted in flight during the first moments after attach, when a request's
/// plug-cached `io_start_time_ns` can predate the first issue this program saw.
#[map(name = "EARLY_COUNTED")]
static EARLY_COUNTED: LruHashMap<u64, u8> = LruHashMap::with_max_entries(65536, 0);

/// Completions with `io_start_time_ns` below first_issue + EARLY_CHECK_NS ask EARLY_COUNTED;
/// the issue side records for twice as long, which covers plug timestamps up to
/// EARLY_CHECK_NS stale (the kernel drops a plug's cached time whenever the task sleeps).
const EARLY_CHECK_NS: u64 = 100_000_000;

#[map(name = "FALLBACK_DEVS")]
static FALLBACK_DEVS: HashMap<u32, u8> = HashMap::with_max_entries(256, 0);

#[map(name = "AGENT_STATE")]
static AGENT_STATE: Array<u64> = Array::with_max_entries(STATE_SLOTS, 0);

#[inline(always)]
fn offsets() -> KernelOffsets {
    // SAFETY: read of a frozen read-only global the loader filled in.
    unsafe { core::ptr::read_volatile(&OFFSETS) }
}

/// Reads a field of a kernel object. The programs are BTF tracepoints: the verifier knows
/// the type of every pointer reached from the tracepoint's `struct request *` and turns
/// these loads into fault-safe direct loads, far cheaper than bpf_probe_read_kernel. The
/// offsets are constants (frozen read-only global), so the verifier checks each access
/// against the running kernel's BTF.
#[inline(always)]
unsafe fn read_at<T: Copy>(base: u64, off: u32) -> Option<T> {
    if base == 0 {
        return None;
    }
    Some(core::ptr::read_volatile((base + off as u64) as *const T))
}

struct Request {
    key: IoKey,
    passthrough: bool,
}

#[inline(always)]
unsafe fn describe(o: &KernelOffsets, rq: u64) -> Option<Request> {
    let cmd_flags: u32 = read_at(rq, o.rq_cmd_flags)?;
    let req_op = cmd_flags & REQ_OP_MASK;
    let op = match req_op {
        REQ_OP_READ => OP_READ,
        REQ_OP_WRITE => OP_WRITE,
        _ => OP_OTHER,
    };
    let q: u64 = read_at(rq, o.rq_q)?;
    let disk: u64 = read_at(q, o.q_disk).unwrap_or(0);
    let dev = if disk != 0 {
        let major: i32 = read_at(disk, o.disk_major).unwrap_or(0);
        let minor: i32 = read_at(disk, o.disk_first_minor).unwrap_or(0);
        kernel_dev(major as u32, minor as u32)
    } else {
        0
    };
    Some(Request {
        key: IoKey {
            cgroup_id: charged_cgroup(o, rq),
            dev,
            op,
        },
        passthrough: req_op == REQ_OP_DRV_IN || req_op == REQ_OP_DRV_OUT,
    })
}

/// The cgroup the kernel charges the request to: its first bio's blkg.
#[inline(always)]
unsafe fn charged_cgroup(o: &KernelOffsets, rq: u64) -> u64 {
    if o.flags & OFFSETS_HAVE_BLKCG == 0 {
        return UNATTRIBUTED_CGROUP;
    }
    let Some(bio) = read_at::<u64>(rq, o.rq_bio) else {
        return UNATTRIBUTED_CGROUP;
    };
    let Some(blkg) = read_at::<u64>(bio, o.bio_bi_blkg) else {
        return UNATTRIBUTED_CGROUP;
    };
    let Some(blkcg) = read_at::<u64>(blkg, o.blkg_blkcg) else {
        return UNATTRIBUTED_CGROUP;
    };
    let Some(cgroup) = read_at::<u64>(blkcg, o.blkcg_css + o.css_cgroup) else {
        return UNATTRIBUTED_CGROUP;
    };
    let Some(kn) = read_at::<u64>(cgroup, o.cgroup_kn) else {
        return UNATTRIBUTED_CGROUP;
    };
    read_at::<u64>(kn, o.kn_id).unwrap_or(UNATTRIBUTED_CGROUP)
}

/// One latency sample into one of IoStats' (count, sum, histogram) triples.
#[inline(always)]
fn record(count: &mut u64, sum_ns: &mut u64, hist: &mut [u32; HIST_BUCKETS], ns: u64) {
    let idx = latency_bucket(ns);
    *count += 1;
    *sum_ns += ns;
    // Always true by construction; the verifier needs to see the bound.
    if idx < HIST_BUCKETS {
        hist[idx] = hist[idx].wrapping_add(1);
    }
}

#[inline(always)]
fn stats_for(key: &IoKey) -> Option<*mut IoStats> {
    if let Some(p) = IO_STATS.get_ptr_mut(key) {
        return Some(p);
    }
    let zero = ZERO_STATS.get_ptr(0)?;
    // SAFETY: ZERO_STATS is never written, so it stays all zeroes.
    // EEXIST from a racing insert on another CPU is fine; ENOMEM (the allocator's per-CPU
    // cache is empty until its irq_work refills it) or a full map leaves no entry.
    let _ = IO_STATS.insert(key, unsafe { &*zero }, BPF_NOEXIST);
    IO_STATS.get_ptr_mut(key)
}

/// Counts a completion of `key` in one of this CPU's spill slots: the one it owns, else a
/// free one. False when every slot of this CPU is owned by another key.
#[inline(always)]
fn spill(key: &IoKey, bytes: u64, last: bool) -> bool {
    // SAFETY: helper without arguments.
    let base = unsafe { bpf_get_smp_processor_id() } * SPILL_SLOTS_PER_CPU;
    for i in 0..SPILL_SLOTS_PER_CPU {
        let Some(slot) = IO_SPILL.get_ptr_mut(base + i) else {
            return false;
        };
        // SAFETY: valid map value pointer. Only this CPU's programs write its slots; the
        // claim is a compare-and-swap because a completion can interrupt another on
        // kernels without per-program recursion protection.
        unsafe {
            let state = core::ptr::read_volatile(&(*slot).state);
            let mine = if state == SPILL_OWNED {
                core::ptr::read_volatile(&(*slot).key) == *key
            } else if state == SPILL_FREE
                && atomic_cxchg::<u64, { SeqCst }, { SeqCst }>(
                    &mut (*slot).state,
                    SPILL_FREE,
                    SPILL_CLAIMING,
                )
                .1
            {
                core::ptr::write_volatile(&mut (*slot).key, *key);
                core::ptr::write_volatile(&mut (*slot).ios, 0);
                core::ptr::write_volatile(&mut (*slot).bytes, 0);
                atomic_xchg::<u64, { SeqCst }>(&mut (*slot).state, SPILL_OWNED);
                true
            } else {
                false
            };
            if mine {
                atomic_xadd::<u64, u64, { Relaxed }>(&mut (*slot).bytes, bytes);
                if last {
                    atomic_xadd::<u64, u64, { Relaxed }>(&mut (*slot).ios, 1);
                }
                return true;
            }
        }
    }
    false
}

#[inline(always)]
fn count_state(slot: u32) {
    if let Some(p) = AGENT_STATE.get_ptr_mut(slot) {
        // SAFETY: valid map value pointer; atomic because the array is shared by all CPUs.
        unsafe { atomic_xadd::<u64, u64, { Relaxed }>(p, 1) };
    }
}

#[inline(always)]
fn inflight_for(key: &IoKey) -> Option<*mut Inflight> {
    if let Some(p) = INFLIGHT.get_ptr_mut(key) {
        return Some(p);
    }
    let _ = INFLIGHT.insert(key, Inflight::default(), BPF_NOEXIST);
    INFLIGHT.get_ptr_mut(key)
}

#[inline(always)]
fn state(slot: u32) -> u64 {
    match AGENT_STATE.get(slot) {
        Some(v) => *v,
        None => 0,
    }
}

#[inline(always)]
fn set_state(slot: u32, v: u64) {
    if let Some(p) = AGENT_STATE.get_ptr_mut(slot) {
        // SAFETY: valid map value pointer.
        unsafe { core::ptr::write_volatile(p, v) };
    }
}

/// Atomically adds `delta` to a shared counter.
#[inline(always)]
fn add_shared(p: *mut i64, delta: i64) {
    // SAFETY: p is a valid map value pointer; the map is shared by all CPUs.
    unsafe { atomic_xadd::<i64, i64, { Relaxed }>(p, delta) };
}

/// Atomically adds `delta` to a shared counter and returns the new value. SeqCst on
/// purpose: LLVM lowers a relaxed fetch-add to BPF's plain atomic add (no BPF_FETCH), whose
/// "result" is the unchanged source register, so the returned value was always 2.
#[inline(always)]
fn fetch_add_shared(p: *mut i64, delta: i64) -> i64 {
    // SAFETY: p is a valid map value pointer; the map is shared by all CPUs.
    unsafe { atomic_xadd::<i64, i64, { SeqCst }>(p, delta) + delta }
}

#[inline(always)]
fn first_issue_ns() -> u64 {
    state(STATE_FIRST_ISSUE_NS)
}

/// block_rq_insert(struct request *rq): only needed when the request has no start time.
#[btf_tracepoint(function = "block_rq_insert")]
pub fn block_rq_insert(ctx: BtfTracePointContext) -> i32 {
    let rq: u64 = ctx.arg(0);
    let o = offsets();
    let start: u64 = unsafe { read_at(rq, o.rq_start_time_ns) }.unwrap_or(0);
    if start == 0 {
        let now = unsafe { bpf_ktime_get_ns() };
        let _ = INSERT_TS.insert(rq, now, 0);
    }
    0
}

/// block_rq_issue(struct request *rq): queue time, in-flight +1, fallback issue time.
///
/// A request can pass here more than once: drivers that return BLK_STS_*RESOURCE get it
/// re-dispatched without a requeue tracepoint. It is counted on its first issue only:
/// `io_start_time_ns` is still 0 then (the kernel sets it right after this tracepoint and
/// zeroes it when the request is allocated); on fallback devices, ISSUE_TS tells.
#[btf_tracepoint(function = "block_rq_issue")]
pub fn block_rq_issue(ctx: BtfTracePointContext) -> i32 {
    let rq: u64 = ctx.arg(0);
    let o = offsets();
    let now = unsafe { bpf_ktime_get_ns() };
    let Some(req) = (unsafe { describe(&o, rq) }) else {
        return 0;
    };
    let mut first = first_issue_ns();
    if first == 0 {
        if let Some(p) = AGENT_STATE.get_ptr_mut(STATE_FIRST_ISSUE_NS) {
            // SAFETY: valid map value pointer; first writer wins.
            let _ = unsafe { atomic_cxchg::<u64, { Relaxed }, { Relaxed }>(p, 0, now) };
        }
        first = first_issue_ns();
    }
    let fallback = state(STATE_FALLBACK_ANY) != 0 && FALLBACK_DEVS.get_ptr(req.key.dev).is_some();
    let first_issue = if fallback {
        let seen = unsafe { ISSUE_TS.get(rq) }.is_some();
        let _ = ISSUE_TS.insert(rq, now, 0);
        !seen
    } else {
        let io_start: u64 = unsafe { read_at(rq, o.rq_io_start_time_ns) }.unwrap_or(0);
        io_start == 0
    };
    if !first_issue {
        return 0;
    }
    if !fallback && now < first + 2 * EARLY_CHECK_NS {
        let _ = EARLY_COUNTED.insert(rq, 1u8, 0);
    }

    let start: u64 = unsafe { read_at(rq, o.rq_start_time_ns) }.unwrap_or(0);
    if start == 0 && !req.passthrough && state(STATE_NEED_INSERT) == 0 {
        // Ask the agent to attach block_rq_insert for queue times on this queue.
        set_state(STATE_NEED_INSERT, 1);
    }
    let queue_ns = if start != 0 && start <= now {
        Some(now - start)
    } else if let Some(t) = unsafe { INSERT_TS.get(rq) } {
        let t = *t;
        let _ = INSERT_TS.remove(rq);
        if t <= now {
            Some(now - t)
        } else {
            None
        }
    } else {
        None
    };

    if let Some(q) = queue_ns {
        if let Some(s) = stats_for(&req.key) {
            // SAFETY: s points at this CPU's value.
            unsafe {
                record(
                    &mut (*s).queue_count,
                    &mut (*s).queue_sum_ns,
                    &mut (*s).queue_hist,
                    q,
                )
            };
        } else {
            count_state(STATE_UNSAMPLED);
        }
    }

    if let Some(v) = inflight_for(&req.key) {
        // SAFETY: v is a valid map value; count is updated atomically, peak/epoch racily
        // (a lost race under-reports a peak by one request at most).
        unsafe {
            let n = fetch_add_shared(&mut (*v).count, 1);
            let epoch = state(STATE_EPOCH);
            if core::ptr::read_volatile(&(*v).epoch) != epoch {
                core::ptr::write_volatile(&mut (*v).epoch, epoch);
                core::ptr::write_volatile(&mut (*v).peak, n);
            } else if n > core::ptr::read_volatile(&(*v).peak) {
                core::ptr::write_volatile(&mut (*v).peak, n);
            }
        }
    }
    0
}

/// Was this request counted in flight by block_rq_issue? Requests issued before the
/// programs were attached were not; near the attach time the timestamps cannot tell, and
/// EARLY_COUNTED does.
#[inline(always)]
fn issued_since_attach(rq: u64, issue_ns: u64) -> bool {
    let first = first_issue_ns();
    if first == 0 {
        return false;
    }
    if issue_ns >= first + EARLY_CHECK_NS {
        return true;
    }
    let hit = unsafe { EARLY_COUNTED.get(rq) }.is_some();
    if hit {
        let _ = EARLY_COUNTED.remove(rq);
    }
    hit
}

/// block_rq_complete(struct request *rq, blk_status_t error, unsigned int nr_bytes).
#[btf_tracepoint(function = "block_rq_complete")]
pub fn block_rq_complete(ctx: BtfTracePointContext) -> i32 {
    let rq: u64 = ctx.arg(0);
    let nr_bytes: u64 = ctx.arg::<u64>(2) & 0xffff_ffff;
    let o = offsets();
    let now = unsafe { bpf_ktime_get_ns() };
    let Some(req) = (unsafe { describe(&o, rq) }) else {
        return 0;
    };
    // blk_update_request() traces before it consumes nr_bytes: the request is done when
    // nr_bytes covers what is left of it.
    let remaining: u32 = unsafe { read_at(rq, o.rq_data_len) }.unwrap_or(0);
    let last = nr_bytes >= remaining as u64;

    let mut issue_ns: u64 = 0;
    let mut counted = false;
    if last {
        let io_start: u64 = unsafe { read_at(rq, o.rq_io_start_time_ns) }.unwrap_or(0);
        if io_start != 0 {
            issue_ns = io_start;
            counted = issued_since_attach(rq, io_start);
        } else if !req.passthrough {
            if FALLBACK_DEVS.get_ptr(req.key.dev).is_none() {
                let _ = FALLBACK_DEVS.insert(req.key.dev, 1u8, 0);
                set_state(STATE_FALLBACK_ANY, 1);
            }
            if let Some(t) = unsafe { ISSUE_TS.get(rq) } {
                issue_ns = *t;
                counted = true;
                let _ = ISSUE_TS.remove(rq);
            }
        }
        if !counted {
            count_state(STATE_PREEXISTING);
        }
    }

    let start_ns: u64 = if last {
        unsafe { read_at(rq, o.rq_start_time_ns) }.unwrap_or(0)
    } else {
        0
    };
    if let Some(s) = stats_for(&req.key) {
        // SAFETY: s points at this CPU's value.
        unsafe {
            (*s).bytes += nr_bytes;
            if last {
                (*s).ios += 1;
                if start_ns != 0 && start_ns <= now {
                    record(
                        &mut (*s).total_count,
                        &mut (*s).total_sum_ns,
                        &mut (*s).total_hist,
                        now - start_ns,
                    );
                }
                if issue_ns != 0 && issue_ns <= now {
                    record(
                        &mut (*s).lat_count,
                        &mut (*s).lat_sum_ns,
                        &mut (*s).lat_hist,
                        now - issue_ns,
                    );
                }
            }
        }
    } else {
        // The latency sample is lost; the bytes and the completion are not.
        count_state(STATE_UNSAMPLED);
        if !spill(&req.key, nr_bytes, last) {
            count_state(STATE_MAP_FULL);
        }
    }
    if last && counted {
        if let Some(v) = INFLIGHT.get_ptr_mut(&req.key) {
            // SAFETY: valid map value pointer.
            add_shared(unsafe { &mut (*v).count }, -1);
        }
    }
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[link_section = "license"]
#[no_mangle]
static LICENSE: [u8; 4] = *b"GPL\0";
