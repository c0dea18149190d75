//! Block request tracing: per (cgroup, disk, op) counters, latency/queue-time histograms
//! and in-flight counts, in maps shared by all CPUs and updated with plain atomic adds (the
//! only atomic BPF has on 5.10). No per-request data leaves the kernel, and no value is
//! kept per CPU: a per-CPU map holds one for every *possible* CPU, which on a 128-CPU host
//! costs 128x a shared one (docs/design/observe-at-scale.md).
//!
//! One program runs per request: at completion, with one hash lookup (HISTS), it counts the
//! request and its bytes and takes its timing from the request's own timestamps:
//! `start_time_ns` (allocated), `io_start_time_ns` (issued), now (completed). The issue
//! program runs only where it is needed: to count requests in flight (`--count-inflight`),
//! and to keep issue times, in a map keyed by request, for devices whose queue does not
//! stamp them (learned at the first completion that lacks one).
//!
//! Attribution: `rq->bio->bi_blkg->blkcg->css.cgroup->kn->id`, the blkcg the kernel
//! charges the request to. Struct offsets come from the running kernel's BTF (OFFSETS).
#![no_std]
#![no_main]
#![feature(core_intrinsics)]
#![allow(internal_features)]

use core::{
    intrinsics::{atomic_xadd, AtomicOrdering::Relaxed},
    ptr::{addr_of, addr_of_mut},
};

use aya_ebpf::{
    helpers::{bpf_get_smp_processor_id, bpf_ktime_get_ns},
    macros::{btf_tracepoint, fexit, map},
    maps::{Array, HashMap, LruHashMap},
    programs::{BtfTracePointContext, FExitContext},
};
use isolator_common::{
    kernel_dev, latency_bucket, size_bucket, CompletionStripe, IoKey, KernelOffsets, KeyCounters,
    KeyHistograms, Latencies, Latency, ThrottleHold, DEFAULT_MAX_HISTOGRAM_KEYS, DEFAULT_MAX_KEYS,
    FALLBACK_DEVS_ENTRIES, HISTS_MAP_FLAGS, HIST_BUCKETS, OFFSETS_DISK_IN_REQUEST,
    OFFSETS_HAVE_BLKCG, OFFSETS_THROTTLE_REPASS, OP_OTHER, OP_READ, OP_WRITE, REQUEST_MAP_ENTRIES,
    REQ_OP_DRV_IN, REQ_OP_DRV_OUT, REQ_OP_MASK, REQ_OP_READ, REQ_OP_WRITE, SEQUENTIAL_GAP_BYTES,
    SIZE_BUCKETS, STATE_COUNT_INFLIGHT, STATE_EARLY_WINDOW, STATE_EPOCH, STATE_FALLBACK_ANY,
    STATE_FIRST_ISSUE_NS, STATE_HOLDS_SEEN, STATE_MAP_FULL, STATE_NEED_INSERT, STATE_PREEXISTING,
    STATE_SLOTS, STATE_UNSAMPLED, STRIPES, THROTTLE_HOLD_ENTRIES, UNATTRIBUTED_CGROUP,
};

#[no_mangle]
static OFFSETS: KernelOffsets = KernelOffsets {
    rq_q: 0,
    rq_bio: 0,
    rq_cmd_flags: 0,
    rq_data_len: 0,
    rq_sector: 0,
    rq_start_time_ns: 0,
    rq_io_start_time_ns: 0,
    q_disk: 0,
    rq_disk: 0,
    disk_major: 0,
    disk_first_minor: 0,
    bio_bi_blkg: 0,
    blkg_blkcg: 0,
    blkcg_css: 0,
    css_cgroup: 0,
    cgroup_kn: 0,
    kn_id: 0,
    bio_bi_sector: 0,
    flags: 0,
};

const BPF_NOEXIST: u64 = 1;

// Map names are literals (`#[map(name)]` takes nothing else); they must match the MAP_*
// consts of isolator-common, which `probe::tests` checks against the built object.

/// In-flight counts of every key, and the bytes and counts of completions that found no
/// HISTS entry. Preallocated (the loader sizes it, `--max-keys`): an insert fails only when
/// the map is full, never for want of memory, so bytes and counts stay exact up to the
/// capacity.
#[map(name = "KEYS")]
static KEYS: HashMap<IoKey, KeyCounters> = HashMap::with_max_entries(DEFAULT_MAX_KEYS, 0);

/// Counts, bytes and histograms of every key that completed a request; allocated on first
/// use (the loader sizes it, `--max-histogram-keys`).
#[map(name = "HISTS")]
static HISTS: HashMap<IoKey, KeyHistograms> =
    HashMap::with_max_entries(DEFAULT_MAX_HISTOGRAM_KEYS, HISTS_MAP_FLAGS);

/// Source of a zeroed KeyHistograms for inserts (too large for the 512-byte stack).
#[map(name = "ZERO_HISTS")]
static ZERO_HISTS: Array<KeyHistograms> = Array::with_max_entries(1, 0);

/// Fallback issue timestamps, only for devices in FALLBACK_DEVS.
#[map(name = "ISSUE_TS")]
static ISSUE_TS: LruHashMap<u64, u64> = LruHashMap::with_max_entries(REQUEST_MAP_ENTRIES, 0);

/// Fallback insert timestamps, only for requests whose start_time_ns is not set.
#[map(name = "INSERT_TS")]
static INSERT_TS: LruHashMap<u64, u64> = LruHashMap::with_max_entries(REQUEST_MAP_ENTRIES, 0);

/// Requests counted in flight during the first moments after attach, when a request's
/// plug-cached `io_start_time_ns` can predate the attach time.
#[map(name = "EARLY_COUNTED")]
static EARLY_COUNTED: LruHashMap<u64, u8> = LruHashMap::with_max_entries(REQUEST_MAP_ENTRIES, 0);

/// Completions with `io_start_time_ns` below attach + EARLY_CHECK_NS ask EARLY_COUNTED;
/// the issue side records until the agent closes the window (STATE_EARLY_WINDOW), at least
/// twice as long, which covers plug timestamps up to EARLY_CHECK_NS stale (the kernel
/// drops a plug's cached time whenever the task sleeps).
const EARLY_CHECK_NS: u64 = 100_000_000;

/// Bios the cgroup's I/O limit held, by address, until the request they start completes.
#[map(name = "THROTTLE_HOLDS")]
static THROTTLE_HOLDS: LruHashMap<u64, ThrottleHold> =
    LruHashMap::with_max_entries(THROTTLE_HOLD_ENTRIES, 0);

#[map(name = "FALLBACK_DEVS")]
static FALLBACK_DEVS: HashMap<u32, u8> = HashMap::with_max_entries(FALLBACK_DEVS_ENTRIES, 0);

#[map(name = "AGENT_STATE")]
static AGENT_STATE: Array<u64> = Array::with_max_entries(STATE_SLOTS, 0);

/// One field of OFFSETS, read on its own: one load, where copying the whole struct costs
/// a load, shifts and a stack slot per field on every run.
macro_rules! off {
    ($field:ident) => {{
        // SAFETY: OFFSETS is a static, so the pointer is valid and aligned; the loader
        // writes it before load and freezes it (read-only global), so no write races the
        // read. Volatile so the compiler does not fold the zeroes it was compiled with.
        #[allow(unused_unsafe)]
        let v = unsafe { core::ptr::read_volatile(core::ptr::addr_of!(OFFSETS.$field)) };
        v
    }};
}

/// Reads a field of a kernel object. The programs are BTF tracepoints: the verifier knows
/// the type of every pointer reached from the tracepoint's `struct request *` and turns
/// these loads into fault-safe direct loads, far cheaper than bpf_probe_read_kernel. The
/// offsets are constants (frozen read-only global), so the verifier checks each access
/// against the running kernel's BTF.
///
/// # Safety
/// `base` must be a kernel pointer the verifier tracks (a tracepoint argument or a pointer
/// loaded from one), and `off` the offset of a `T`-sized member of its type.
#[inline(always)]
unsafe fn read_at<T: Copy>(base: u64, off: u32) -> Option<T> {
    if base == 0 {
        return None;
    }
    // SAFETY: per the contract above; a NULL base was ruled out, and the verifier rejects
    // the program at load if the offset is not a member of the pointer's BTF type.
    Some(unsafe { core::ptr::read_volatile((base + off as u64) as *const T) })
}

struct Request {
    key: IoKey,
    passthrough: bool,
}

/// # Safety
/// `rq` must be the tracepoint's `struct request *`.
#[inline(always)]
unsafe fn describe(rq: u64) -> Option<Request> {
    // Every read_at here and in charged_cgroup starts from `rq` (the caller's contract) or
    // a pointer loaded from it, with an offset from this kernel's BTF for that type.
    let cmd_flags: u32 = read_at(rq, off!(rq_cmd_flags))?;
    let req_op = cmd_flags & REQ_OP_MASK;
    let op = match req_op {
        REQ_OP_READ => OP_READ,
        REQ_OP_WRITE => OP_WRITE,
        _ => OP_OTHER,
    };
    // A constant branch (OFFSETS is frozen): the verifier drops the side this kernel lacks.
    let disk: u64 = if off!(flags) & OFFSETS_DISK_IN_REQUEST != 0 {
        read_at(rq, off!(rq_disk)).unwrap_or(0)
    } else {
        let q: u64 = read_at(rq, off!(rq_q))?;
        read_at(q, off!(q_disk)).unwrap_or(0)
    };
    let dev = if disk != 0 {
        let major: i32 = read_at(disk, off!(disk_major)).unwrap_or(0);
        let minor: i32 = read_at(disk, off!(disk_first_minor)).unwrap_or(0);
        kernel_dev(major as u32, minor as u32)
    } else {
        0
    };
    Some(Request {
        key: IoKey {
            cgroup_id: charged_cgroup(rq),
            dev,
            op,
        },
        passthrough: req_op == REQ_OP_DRV_IN || req_op == REQ_OP_DRV_OUT,
    })
}

/// The cgroup the kernel charges the request to: its first bio's blkg.
///
/// # Safety
/// `rq` must be the tracepoint's `struct request *`.
#[inline(always)]
unsafe fn charged_cgroup(rq: u64) -> u64 {
    if off!(flags) & OFFSETS_HAVE_BLKCG == 0 {
        return UNATTRIBUTED_CGROUP;
    }
    match read_at::<u64>(rq, off!(rq_bio)) {
        Some(bio) => bio_cgroup(bio),
        None => UNATTRIBUTED_CGROUP,
    }
}

/// The cgroup a bio is charged to: its blkg's blkcg.
///
/// # Safety
/// `bio` must be a `struct bio *` the verifier tracks (from a tracepoint, a traced
/// function's argument or a request), and the kernel must have CONFIG_BLK_CGROUP.
#[inline(always)]
unsafe fn bio_cgroup(bio: u64) -> u64 {
    let Some(blkg) = read_at::<u64>(bio, off!(bio_bi_blkg)) else {
        return UNATTRIBUTED_CGROUP;
    };
    let Some(blkcg) = read_at::<u64>(blkg, off!(blkg_blkcg)) else {
        return UNATTRIBUTED_CGROUP;
    };
    let Some(cgroup) = read_at::<u64>(blkcg, off!(blkcg_css) + off!(css_cgroup)) else {
        return UNATTRIBUTED_CGROUP;
    };
    let Some(kn) = read_at::<u64>(cgroup, off!(cgroup_kn)) else {
        return UNATTRIBUTED_CGROUP;
    };
    read_at::<u64>(kn, off!(kn_id)).unwrap_or(UNATTRIBUTED_CGROUP)
}

/// Atomically adds to a counter shared by all CPUs. The result is unused, so LLVM emits
/// BPF's plain atomic add (no BPF_FETCH), which every kernel from 5.10 verifies; a test
/// of the agent scans the object for any other atomic.
///
/// # Safety
/// `p` must point into a map value.
#[inline(always)]
unsafe fn add_u64(p: *mut u64, delta: u64) {
    // SAFETY: `p` is a valid, aligned u64 in a map value (the caller's contract), and map
    // memory is only ever written with atomics or single stores, never through references.
    atomic_xadd::<u64, u64, { Relaxed }>(p, delta);
}

/// # Safety
/// As [`add_u64`].
#[inline(always)]
unsafe fn add_i64(p: *mut i64, delta: i64) {
    // SAFETY: as in add_u64.
    atomic_xadd::<i64, i64, { Relaxed }>(p, delta);
}

/// One latency sample into its sum in the stripe and its bucket of the key's histograms.
///
/// # Safety
/// `s` and `h` must point into map values (`s` a stripe of `h`).
#[inline(always)]
unsafe fn record(s: *mut CompletionStripe, h: *mut KeyHistograms, which: Latency, ns: u64) {
    let idx = latency_bucket(ns);
    // SAFETY: `s` points into a map value (caller); the projection makes no reference.
    unsafe { add_u64(Latencies::field_ptr(addr_of_mut!((*s).sum_ns), which), ns) };
    // Always true by construction; the verifier needs to see the bound.
    if idx < HIST_BUCKETS {
        // SAFETY: `h` points at a map value (caller) and idx is in bounds, so the bucket
        // is inside it; atomic because every CPU adds to it.
        unsafe {
            let bucket = addr_of_mut!((*h).buckets[idx]);
            atomic_xadd::<u32, u32, { Relaxed }>(Latencies::field_ptr(bucket, which), 1);
        }
    }
}

#[inline(always)]
fn count_state(slot: u32) {
    if let Some(p) = AGENT_STATE.get_ptr_mut(slot) {
        // SAFETY: get_ptr_mut checked the index, so p points at a live array slot (array
        // elements are never freed); atomic because every CPU writes the slot.
        unsafe { add_u64(p, 1) };
    }
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
        // SAFETY: get_ptr_mut checked the index, so p points at a live array slot; an
        // aligned 8-byte store is single-copy atomic, and racing setters write the same 1.
        unsafe { core::ptr::write_volatile(p, v) };
    }
}

/// The key's counters, created on its first request. None only when KEYS is full.
#[inline(always)]
fn counters_for(key: &IoKey) -> Option<*mut KeyCounters> {
    if let Some(p) = KEYS.get_ptr_mut(key) {
        return Some(p);
    }
    // EEXIST from a racing insert on another CPU is fine; E2BIG (full) leaves no entry.
    let _ = KEYS.insert(key, KeyCounters::default(), BPF_NOEXIST);
    KEYS.get_ptr_mut(key)
}

/// The key's histograms, created on its first sampled completion.
#[inline(always)]
fn histograms_for(key: &IoKey) -> Option<*mut KeyHistograms> {
    if let Some(p) = HISTS.get_ptr_mut(key) {
        return Some(p);
    }
    let zero = ZERO_HISTS.get_ptr(0)?;
    // SAFETY: `zero` is a live array slot (get_ptr checked the index; array elements are
    // never freed) and ZERO_HISTS is never written, so the reference reads all zeroes and
    // nothing mutates it while borrowed. EEXIST from a racing insert is fine; ENOMEM (the allocator's per-CPU cache is refilled asynchronously) or
    // a full map leaves no entry: the sample is counted as lost.
    let _ = HISTS.insert(key, unsafe { &*zero }, BPF_NOEXIST);
    HISTS.get_ptr_mut(key)
}

/// block_rq_insert: only needed when requests get no start time from their queue.
#[inline(always)]
fn on_insert(rq: u64) {
    // SAFETY: rq is the tracepoint's `struct request *` (read_at's contract) and the
    // offset that of its start_time_ns.
    let start: u64 = unsafe { read_at(rq, off!(rq_start_time_ns)) }.unwrap_or(0);
    if start == 0 {
        // SAFETY: a BPF helper without arguments; nothing to uphold.
        let now = unsafe { bpf_ktime_get_ns() };
        let _ = INSERT_TS.insert(rq, now, 0);
    }
}

/// block_rq_insert(struct request *rq) (5.11 on).
#[btf_tracepoint(function = "block_rq_insert")]
pub fn block_rq_insert(ctx: BtfTracePointContext) -> i32 {
    on_insert(ctx.arg(0));
    0
}

/// block_rq_insert(struct request_queue *q, struct request *rq) (before 5.11).
#[btf_tracepoint(function = "block_rq_insert")]
pub fn block_rq_insert_q_rq(ctx: BtfTracePointContext) -> i32 {
    on_insert(ctx.arg(1));
    0
}

/// block_rq_issue: in-flight +1, and the issue time on devices that do not stamp it.
///
/// A request can pass here more than once: drivers that return BLK_STS_*RESOURCE get it
/// re-dispatched without a requeue tracepoint. It is counted on its first issue only:
/// `io_start_time_ns` is still 0 then (the kernel sets it right after this tracepoint and
/// zeroes it when the request is allocated); on fallback devices, ISSUE_TS tells.
#[inline(always)]
fn on_issue(rq: u64) {
    // SAFETY: rq is the tracepoint's `struct request *` (describe's contract).
    let Some(req) = (unsafe { describe(rq) }) else {
        return;
    };
    let fallback = state(STATE_FALLBACK_ANY) != 0 && FALLBACK_DEVS.get_ptr(req.key.dev).is_some();
    let first_issue = if fallback {
        // SAFETY: a BPF helper without arguments; nothing to uphold.
        let now = unsafe { bpf_ktime_get_ns() };
        // SAFETY: get is unsafe because another CPU may change or delete the entry while
        // the reference lives; only its presence is used, the reference is dropped at once.
        let seen = unsafe { ISSUE_TS.get(rq) }.is_some();
        let _ = ISSUE_TS.insert(rq, now, 0);
        !seen
    } else {
        // SAFETY: rq is the tracepoint's `struct request *` (read_at's contract).
        let io_start: u64 = unsafe { read_at(rq, off!(rq_io_start_time_ns)) }.unwrap_or(0);
        io_start == 0
    };
    if !first_issue || state(STATE_COUNT_INFLIGHT) == 0 {
        return;
    }
    if !fallback && state(STATE_EARLY_WINDOW) != 0 {
        // Only as long as completions may ask (twice their window): later entries would
        // never be removed and would push the needed ones out of the LRU.
        // SAFETY: a BPF helper without arguments; nothing to uphold.
        let now = unsafe { bpf_ktime_get_ns() };
        if now < state(STATE_FIRST_ISSUE_NS) + 2 * EARLY_CHECK_NS {
            let _ = EARLY_COUNTED.insert(rq, 1u8, 0);
        }
    }
    let Some(c) = counters_for(&req.key) else {
        count_state(STATE_MAP_FULL);
        return;
    };
    // SAFETY: c points at a KEYS value (from get_ptr_mut), which stays allocated while the
    // program runs (RCU) even if the agent deletes the key meanwhile; fields are reached
    // with addr_of(_mut)! (no references into memory other CPUs write) and are aligned
    // u64s, so the plain loads and stores are single-copy atomic. The peak is read after
    // the add and stored racily: a lower bound, off only when another CPU's completion
    // lands between the two.
    unsafe {
        add_i64(addr_of_mut!((*c).inflight), 1);
        let n = core::ptr::read_volatile(addr_of!((*c).inflight));
        let epoch = state(STATE_EPOCH);
        if core::ptr::read_volatile(addr_of!((*c).peak_epoch)) != epoch {
            core::ptr::write_volatile(addr_of_mut!((*c).peak_epoch), epoch);
            core::ptr::write_volatile(addr_of_mut!((*c).peak), n);
        } else if n > core::ptr::read_volatile(addr_of!((*c).peak)) {
            core::ptr::write_volatile(addr_of_mut!((*c).peak), n);
        }
    }
}

/// block_rq_issue(struct request *rq) (5.11 on).
#[btf_tracepoint(function = "block_rq_issue")]
pub fn block_rq_issue(ctx: BtfTracePointContext) -> i32 {
    on_issue(ctx.arg(0));
    0
}

/// block_rq_issue(struct request_queue *q, struct request *rq) (before 5.11).
#[btf_tracepoint(function = "block_rq_issue")]
pub fn block_rq_issue_q_rq(ctx: BtfTracePointContext) -> i32 {
    on_issue(ctx.arg(1));
    0
}

/// Was this request counted in flight by the issue program? Requests issued before it was
/// attached were not; near the attach time the timestamps cannot tell, and EARLY_COUNTED
/// does.
#[inline(always)]
fn issued_since_attach(rq: u64, issue_ns: u64) -> bool {
    let first = state(STATE_FIRST_ISSUE_NS);
    if first == 0 {
        return false;
    }
    if issue_ns >= first + EARLY_CHECK_NS {
        return true;
    }
    // SAFETY: get is unsafe because another CPU may change or delete the entry while the
    // reference lives; only its presence is used, the reference is dropped at once.
    let hit = unsafe { EARLY_COUNTED.get(rq) }.is_some();
    if hit {
        let _ = EARLY_COUNTED.remove(rq);
    }
    hit
}

/// This CPU's stripe of a key's completion counters.
///
/// # Safety
/// `h` must point at a map value.
#[inline(always)]
unsafe fn stripe(h: *mut KeyHistograms) -> *mut CompletionStripe {
    // SAFETY: a BPF helper without arguments; nothing to uphold.
    let i = unsafe { bpf_get_smp_processor_id() } as usize % STRIPES;
    // Always true; the verifier needs to see the bound.
    let i = if i < STRIPES { i } else { 0 };
    // SAFETY: `h` points at a map value (caller) and i is in bounds; no reference made.
    unsafe { addr_of_mut!((*h).stripes[i]) }
}

/// A data request's character (paper 002's bins): sequential or not, and its size bucket.
///
/// # Safety
/// `h` must point at a HISTS value, `s` at one of its stripes.
#[inline(always)]
unsafe fn count_character(h: *mut KeyHistograms, s: *mut CompletionStripe, sector: u64, size: u64) {
    let start = sector << 9;
    // SAFETY: `h` points at a map value (caller); a plain aligned load and store: a race
    // with another CPU's completion only misjudges one request.
    let sequential = unsafe {
        let next = addr_of_mut!((*h).next_offset_bytes);
        let prev_end = core::ptr::read_volatile(next);
        core::ptr::write_volatile(next, start + size);
        prev_end != 0
            && start + SEQUENTIAL_GAP_BYTES >= prev_end
            && start <= prev_end + SEQUENTIAL_GAP_BYTES
    };
    // SAFETY: `s` points into a map value (caller); atomic adds through raw pointers.
    unsafe {
        if sequential {
            atomic_xadd::<u32, u32, { Relaxed }>(addr_of_mut!((*s).sequential_ios), 1);
        }
        let b = size_bucket(size);
        // Always true by construction; the verifier needs to see the bound.
        if b < SIZE_BUCKETS {
            atomic_xadd::<u32, u32, { Relaxed }>(addr_of_mut!((*s).size_ios[b]), 1);
        }
    }
}

/// Counts a completion in KEYS: for keys whose HISTS entry could not be allocated.
#[inline(always)]
fn count_without_histograms(key: &IoKey, nr_bytes: u64, last: bool) {
    let Some(c) = counters_for(key) else {
        count_state(STATE_MAP_FULL);
        return;
    };
    // SAFETY: c points at a KEYS value (from get_ptr_mut), live for the program's run
    // (RCU); atomic adds because every CPU writes it.
    unsafe {
        add_u64(addr_of_mut!((*c).bytes), nr_bytes);
        if last {
            add_u64(addr_of_mut!((*c).ios), 1);
        }
    }
}

/// Return of the throttle's decision, `bool f(struct bio *)` (THROTTLE_FUNCTIONS; the
/// loader picks the name this kernel has). A bio it held is recorded with the time and
/// where it starts; one it let pass drops any record left at its address, so a reused
/// address never carries an old hold. Where a held bio passes again when let go
/// (OFFSETS_THROTTLE_REPASS), that first unheld pass of the same bio marks the record
/// released instead.
#[fexit(function = "__blk_throtl_bio")]
pub fn throttle_exit(ctx: FExitContext) -> i32 {
    let bio: u64 = ctx.arg(0);
    // fexit: the return value follows the arguments; a bool in the low byte.
    let held = ctx.arg::<u64>(1) & 0xff != 0;
    // SAFETY: bio is the traced function's `struct bio *` argument (read_at's contract);
    // blk-throttle exists only with CONFIG_BLK_CGROUP, so bi_blkg does too. Read only
    // where needed: most bios a limit lets pass have no record.
    let whose = || unsafe {
        (
            bio_cgroup(bio),
            read_at::<u64>(bio, off!(bio_bi_sector)).unwrap_or(0),
        )
    };
    if !held {
        // A lookup first: remove takes the bucket's lock even when there is nothing.
        let Some(p) = THROTTLE_HOLDS.get_ptr_mut(&bio) else {
            return 0;
        };
        if off!(flags) & OFFSETS_THROTTLE_REPASS != 0 {
            let (cgroup_id, sector) = whose();
            // SAFETY: p points at a live map value (RCU for the program's run); plain
            // aligned loads and a store: only this bio's passes touch its record.
            let fresh = unsafe {
                let h = *p;
                h.released == 0 && h.cgroup_id == cgroup_id && h.sector == sector
            };
            if fresh {
                // SAFETY: as above.
                unsafe { core::ptr::write_volatile(addr_of_mut!((*p).released), 1) };
                return 0;
            }
        }
        let _ = THROTTLE_HOLDS.remove(&bio);
        return 0;
    }
    let (cgroup_id, sector) = whose();
    // SAFETY: a BPF helper without arguments; nothing to uphold.
    let now = unsafe { bpf_ktime_get_ns() };
    let hold = ThrottleHold {
        since_ns: now,
        cgroup_id,
        sector,
        released: 0,
    };
    let _ = THROTTLE_HOLDS.insert(&bio, &hold, 0);
    if state(STATE_HOLDS_SEEN) == 0 {
        set_state(STATE_HOLDS_SEEN, 1);
    }
    0
}

/// When the cgroup's limit began to hold the request's first bio, if it did: the
/// submitter's wait starts there, before the request existed. The record is taken (and
/// dropped) only if it is this request's: same cgroup, same start.
///
/// # Safety
/// `rq` must be the tracepoint's `struct request *`.
#[inline(always)]
unsafe fn held_since(rq: u64, cgroup_id: u64, sector: u64) -> Option<u64> {
    // SAFETY: rq is the tracepoint's `struct request *` (read_at's contract).
    let bio: u64 = unsafe { read_at(rq, off!(rq_bio)) }?;
    // SAFETY: get is unsafe because another CPU may change or delete the entry while the
    // reference lives; the value is copied out at once and the reference dropped.
    let hold = *unsafe { THROTTLE_HOLDS.get(&bio) }?;
    if hold.cgroup_id != cgroup_id || hold.sector != sector {
        return None;
    }
    let _ = THROTTLE_HOLDS.remove(&bio);
    Some(hold.since_ns)
}

/// block_rq_complete(struct request *rq, blk_status_t error, unsigned int nr_bytes).
#[btf_tracepoint(function = "block_rq_complete")]
pub fn block_rq_complete(ctx: BtfTracePointContext) -> i32 {
    let rq: u64 = ctx.arg(0);
    let nr_bytes: u64 = ctx.arg::<u64>(2) & 0xffff_ffff;
    // SAFETY: rq is the tracepoint's `struct request *` (describe's contract).
    let Some(req) = (unsafe { describe(rq) }) else {
        return 0;
    };
    let h = histograms_for(&req.key);
    // blk_update_request() traces before it consumes nr_bytes: the request is done when
    // nr_bytes covers what is left of it.
    // SAFETY: rq is the tracepoint's `struct request *` (read_at's contract).
    let remaining: u32 = unsafe { read_at(rq, off!(rq_data_len)) }.unwrap_or(0);
    if nr_bytes < remaining as u64 {
        match h {
            // SAFETY: h points at a HISTS value (from get_ptr_mut), live for the program's
            // run (RCU) even if the agent deletes the key; the add is atomic.
            Some(h) => unsafe { add_u64(addr_of_mut!((*stripe(h)).bytes), nr_bytes) },
            None => count_without_histograms(&req.key, nr_bytes, false),
        }
        return 0;
    }

    // SAFETY: a BPF helper without arguments; nothing to uphold.
    let now = unsafe { bpf_ktime_get_ns() };
    let counting = state(STATE_COUNT_INFLIGHT) != 0;
    // SAFETY: rq is the tracepoint's `struct request *` (read_at's contract).
    let mut issue_ns: u64 = unsafe { read_at(rq, off!(rq_io_start_time_ns)) }.unwrap_or(0);
    let mut counted = false;
    if issue_ns != 0 {
        counted = counting && issued_since_attach(rq, issue_ns);
    } else if !req.passthrough {
        if FALLBACK_DEVS.get_ptr(req.key.dev).is_none() {
            // Ask the agent to attach the issue program to time this queue's requests.
            let _ = FALLBACK_DEVS.insert(req.key.dev, 1u8, 0);
            set_state(STATE_FALLBACK_ANY, 1);
        }
        // SAFETY: get is unsafe because another CPU may change or delete the entry while
        // the reference lives; the u64 is copied out at once (an aligned load) and the
        // reference dropped.
        if let Some(t) = unsafe { ISSUE_TS.get(rq) } {
            issue_ns = *t;
            counted = counting;
            let _ = ISSUE_TS.remove(rq);
        }
    }
    if counting && !counted {
        count_state(STATE_PREEXISTING);
    }
    // SAFETY: rq is the tracepoint's `struct request *` (read_at's contract).
    let mut start_ns: u64 = unsafe { read_at(rq, off!(rq_start_time_ns)) }.unwrap_or(0);
    if start_ns == 0 && !req.passthrough {
        if state(STATE_NEED_INSERT) == 0 {
            // Ask the agent to attach block_rq_insert for start times on this queue.
            set_state(STATE_NEED_INSERT, 1);
        }
        // SAFETY: as for ISSUE_TS above: the u64 is copied out at once.
        if let Some(t) = unsafe { INSERT_TS.get(rq) } {
            start_ns = *t;
            let _ = INSERT_TS.remove(rq);
        }
    }
    // SAFETY: rq is the tracepoint's `struct request *` (read_at's contract).
    let sector: u64 = unsafe { read_at(rq, off!(rq_sector)) }.unwrap_or(0);
    // Total latency runs from submission: from the hold when the cgroup's limit held the
    // request's first bio, else from the request's allocation.
    let mut submit_ns = start_ns;
    if state(STATE_HOLDS_SEEN) != 0 {
        // SAFETY: rq is the tracepoint's `struct request *` (held_since's contract).
        if let Some(since) = unsafe { held_since(rq, req.key.cgroup_id, sector) } {
            if start_ns == 0 || since < start_ns {
                submit_ns = since;
            }
        }
    }

    match h {
        // SAFETY: h points at a HISTS value (from get_ptr_mut), live for the program's run
        // (RCU) even if the agent deletes the key; s is a stripe of it; every write is an
        // atomic add through a raw pointer.
        Some(h) => unsafe {
            let s = stripe(h);
            if issue_ns != 0 && issue_ns <= now {
                record(s, h, Latency::Device, now - issue_ns);
            }
            if submit_ns != 0 && submit_ns <= now {
                record(s, h, Latency::Total, now - submit_ns);
            }
            if start_ns != 0 && start_ns <= now && issue_ns >= start_ns {
                record(s, h, Latency::Queue, issue_ns - start_ns);
            }
            add_u64(addr_of_mut!((*s).bytes), nr_bytes);
            add_u64(addr_of_mut!((*s).ios), 1);
            if req.key.op != OP_OTHER {
                // At the final completion what is left of the request is its size.
                count_character(h, s, sector, remaining as u64);
            }
        },
        None => {
            // The latency samples are lost; the bytes and the completion are not.
            if issue_ns != 0 || start_ns != 0 {
                count_state(STATE_UNSAMPLED);
            }
            count_without_histograms(&req.key, nr_bytes, true);
        }
    }
    if counted {
        if let Some(c) = KEYS.get_ptr_mut(&req.key) {
            // SAFETY: c points at a KEYS value (from get_ptr_mut), live for the program's
            // run (RCU); the add is atomic.
            unsafe { add_i64(addr_of_mut!((*c).inflight), -1) };
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
