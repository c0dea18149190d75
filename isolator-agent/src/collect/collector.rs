//! Reads the eBPF maps once per cycle and diffs them into a [`Snapshot`]: what happened in
//! the cycle per (cgroup, disk, op). Both maps are read whole each cycle (no value is per
//! CPU, so the cost does not grow with the host's CPUs); a key's histograms are diffed only
//! when it completed requests. Keys idle for `idle_timeout` leave the maps and the agent's
//! tables, as do keys of cgroups that no longer exist, so the maps hold the keys active in
//! the last minute, not every key ever seen.

use std::collections::{HashMap, HashSet};

use aya::{
    maps::{Array, HashMap as BpfHashMap, MapData},
    Ebpf,
};
use isolator_common::{
    IoKey, KeyCounters, KeyHistograms, Latencies, MAP_AGENT_STATE, MAP_HISTS, MAP_KEYS, OP_READ,
    OP_WRITE, SIZE_BUCKETS, STATE_EARLY_WINDOW, STATE_EPOCH, STATE_FALLBACK_ANY,
    STATE_FIRST_ISSUE_NS, STATE_MAP_FULL, STATE_NEED_INSERT, STATE_PREEXISTING, STATE_UNSAMPLED,
};

use crate::identify::disks::DiskStat;

/// Sparse histogram delta: (bucket index, count), ascending by index.
pub type SparseHist = Vec<(u16, u64)>;

/// The samples of one latency in one cycle.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LatencyDelta {
    /// Samples (requests with that latency measured).
    pub count: u64,
    pub sum_ns: u64,
    pub hist: SparseHist,
}

/// What one (cgroup, disk, op) did during one cycle.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KeyDelta {
    pub key: IoKey,
    pub ios: u64,
    pub bytes: u64,
    /// Device, queue and total latency samples of the cycle's completions.
    pub latency: Latencies<LatencyDelta>,
    /// Requests in flight at the end of the cycle (clamped at 0).
    pub inflight_now: u64,
    /// Most requests in flight at once during the cycle.
    pub inflight_peak: u64,
    /// Requests counted in flight whose completion the programs never saw, found
    /// completed this cycle (see [`InflightLedger`]). Not in `ios`, `bytes` or latency.
    pub untraced_completions: u64,
    /// A request of the key was issued this cycle.
    pub issued: bool,
    /// Of `ios`, the data requests that started near where the key's previous one ended
    /// (counted only where the key has histograms; see KeyHistograms).
    pub sequential_ios: u64,
    /// Of `ios`, the data requests per `isolator_common::size_bucket`.
    pub size_ios: [u64; SIZE_BUCKETS],
}

impl KeyDelta {
    pub fn is_idle(&self) -> bool {
        !self.had_requests() && self.inflight_peak == 0 && self.untraced_completions == 0
    }

    /// Whether any request was issued or completed in the cycle. In-flight counts are left
    /// out: a completion the programs never saw keeps a key "in flight" until it is reset.
    pub fn had_requests(&self) -> bool {
        self.ios != 0 || self.bytes != 0 || self.issued
    }
}

/// One cycle's worth of deltas.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub cycle: u64,
    /// Length of the cycle actually measured, in ns (monotonic clock).
    pub interval_ns: u64,
    pub deltas: Vec<KeyDelta>,
    /// Completions of requests issued before the programs were attached (cumulative).
    pub preexisting_completions: u64,
    /// Requests (issues and completions) lost because the counters map was full
    /// (cumulative).
    pub map_full: u64,
    /// Completions whose latency samples are missing from the histograms because the key's
    /// histogram entry could not be allocated (cumulative); their bytes and ios are counted.
    pub unsampled: u64,
    /// Keys that left the maps this cycle: idle for the idle timeout with nothing in
    /// flight.
    pub evicted: Vec<IoKey>,
    /// Requests are counted in flight (`inflight_now`, `inflight_peak` mean something).
    pub inflight_counted: bool,
    /// The programs saw requests without a start time: block_rq_insert is needed.
    pub need_insert: bool,
    /// Some disk's queue does not fill io_start_time_ns: its requests are timed with an
    /// issue-time map instead.
    pub issue_map_timing: bool,
    /// Keys whose in-flight count was taken for completed after 30 s without an issue or
    /// a completion, with the number of requests (the fallback of [`InflightLedger`]).
    pub inflight_resets: Vec<(IoKey, i64)>,
    /// Requests found completed without the programs seeing their completion
    /// (cumulative; per key in [`KeyDelta::untraced_completions`]).
    pub untraced_completions: u64,
}

/// A request cannot stay in flight with no issue and no completion on its key for longer
/// than the block layer's default request timeout (30 s): a count left after that is from a
/// completion the programs did not see.
pub const STALE_INFLIGHT_NS: u64 = 30_000_000_000;

/// How a key's in-flight count ended a cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InflightEnd {
    /// Requests in flight at the end of the cycle.
    pub level: i64,
    /// Requests found completed unseen this cycle.
    pub untraced: i64,
    /// Found by the 30 s rule rather than by the disk's own accounting.
    pub by_timeout: bool,
    /// What the kernel-side count held beyond the level during the cycle: the programs'
    /// peak less this is the cycle's peak level.
    pub offset: i64,
}

/// In-flight bookkeeping on top of the programs' counters.
///
/// On the test machine's 6.18 kernel, about 1 in 1-20k completions (loop and virtio disks)
/// runs neither our `block_rq_complete` program nor bpftrace's, although the disk's own
/// statistics count the request done (no recursion miss, no requeue): the request stays in
/// the kernel-side count for good. The agent never writes that count (a write would race
/// with the programs); it keeps an offset per key of requests known to have completed
/// unseen, and reports the count minus the offset.
///
/// A key's level is taken for completed unseen when the key had no issue and no
/// completion for a whole cycle and its disk, per the kernel's diskstats, had nothing in
/// flight and completed nothing while the key's count was re-read (the kernel counts a
/// request in flight from before its issue to after its completion; kernels that count by
/// request state stop counting a few instructions before the completion tracepoint, so a
/// request in flight for the whole idle cycle that completes right at the check is taken
/// for unseen, and handed back by [`InflightLedger::level`] when its completion lands).
/// Only reads and writes: flushes are not in the disk's in-flight count. Everything else,
/// and disks without iostats, fall back to 30 s without an issue or completion (longer
/// than the block layer's request timeout).
#[derive(Debug, Default)]
pub struct InflightLedger {
    /// Requests counted in flight but known completed, per key.
    offset: HashMap<IoKey, i64>,
    /// Since when a key with requests in flight has seen no issue and no completion.
    idle_since_ns: HashMap<IoKey, u64>,
    untraced_total: u64,
}

impl InflightLedger {
    fn offset(&self, key: IoKey) -> i64 {
        self.offset.get(&key).copied().unwrap_or(0)
    }

    fn set_offset(&mut self, key: IoKey, offset: i64) {
        if offset == 0 {
            self.offset.remove(&key);
        } else {
            self.offset.insert(key, offset);
        }
    }

    /// Whether the key's disk should be asked if it is quiet: requests counted on a key
    /// idle for the whole cycle, of an op the disk's in-flight count covers.
    pub fn suspect(&self, key: IoKey, count: i64, idle: bool) -> bool {
        idle && (key.op == OP_READ || key.op == OP_WRITE) && count > self.offset(key)
    }

    /// Ends the cycle of one key: `idle` (no issue, no completion this cycle), `quiet`
    /// (its disk had nothing in flight around a re-read of `count`).
    pub fn end_cycle(
        &mut self,
        key: IoKey,
        count: i64,
        idle: bool,
        quiet: bool,
        now_ns: u64,
    ) -> InflightEnd {
        let offset = self.offset(key);
        // A count below the offset means a completion taken for unseen was seen after all
        // (or one was seen whose issue was not counted): the offset follows the count
        // down, so the level never goes below zero.
        if count < offset {
            self.set_offset(key, count);
        }
        let level = (count - offset).max(0);
        let mut end = InflightEnd {
            level,
            untraced: 0,
            by_timeout: false,
            offset,
        };
        if !idle || level <= 0 {
            self.idle_since_ns.remove(&key);
            return end;
        }
        let since = *self.idle_since_ns.entry(key).or_insert(now_ns);
        let timed_out = now_ns.saturating_sub(since) >= STALE_INFLIGHT_NS;
        if quiet || timed_out {
            self.set_offset(key, count);
            self.idle_since_ns.remove(&key);
            self.untraced_total += level as u64;
            end = InflightEnd {
                level: 0,
                untraced: level,
                by_timeout: !quiet,
                offset,
            };
        }
        end
    }

    pub fn untraced_total(&self) -> u64 {
        self.untraced_total
    }

    pub fn forget_key(&mut self, key: &IoKey) {
        self.offset.remove(key);
        self.idle_since_ns.remove(key);
    }

    pub fn forget_cgroup(&mut self, cgroup_id: u64) {
        self.offset.retain(|k, _| k.cgroup_id != cgroup_id);
        self.idle_since_ns.retain(|k, _| k.cgroup_id != cgroup_id);
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CollectError {
    #[error("eBPF map {0} missing from the object")]
    MissingMap(&'static str),
    #[error("reading eBPF map {0}: {1}")]
    Map(&'static str, aya::maps::MapError),
}

/// What a key's counters and histograms held at the last read: the baseline of the next
/// diff. Histograms are kept sparse (a busy key fills tens to hundreds of the 3 x 1024
/// buckets), so a baseline costs bytes per sampled bucket, not 12 KiB per key.
#[derive(Debug, Default)]
struct Baseline {
    /// Totals of both maps.
    ios: u64,
    bytes: u64,
    /// HISTS' own count: its histograms moved only if this did.
    hist_ios: u64,
    sums: Latencies<u64>,
    hists: Latencies<Vec<(u16, u32)>>,
    /// HISTS' character counters (u32, wrapping).
    sequential_ios: u32,
    size_ios: [u32; SIZE_BUCKETS],
    /// Monotonic time of the last cycle with an issue or a completion.
    last_active_ns: u64,
}

/// Diffs a cumulative dense histogram (its buckets' counts, in order) against its sparse
/// baseline: the cycle's delta, and `base` becomes the new baseline. Wrapping: exact while
/// a bucket gets fewer than 2^32 samples per cycle.
fn diff_histogram(
    buckets: impl Iterator<Item = u32>,
    base: &mut Vec<(u16, u32)>,
) -> (SparseHist, u64) {
    let mut delta = Vec::new();
    let mut next = Vec::with_capacity(base.len() + 4);
    let mut old = base.iter().peekable();
    let mut count = 0u64;
    for (i, n) in buckets.enumerate() {
        let p = match old.peek() {
            Some(&&(j, v)) if j as usize == i => {
                old.next();
                v
            }
            _ => 0,
        };
        if n != 0 {
            next.push((i as u16, n));
        }
        let d = n.wrapping_sub(p);
        if d != 0 {
            delta.push((i as u16, d as u64));
            count += d as u64;
        }
    }
    *base = next;
    (delta, count)
}

/// The histogram part of a key's cycle: fills `d` from `now` and moves the baseline on.
fn diff_histograms(d: &mut KeyDelta, now: &KeyHistograms, base: &mut Baseline) {
    let sums = now.totals().sum_ns;
    let sum_deltas = sums.wrapping_sub(base.sums);
    d.latency = Latencies::from_fn(|which| {
        let counts = now.buckets.iter().map(|b| *b.get(which));
        let (hist, count) = diff_histogram(counts, base.hists.get_mut(which));
        LatencyDelta {
            count,
            sum_ns: *sum_deltas.get(which),
            hist,
        }
    });
    base.sums = sums;
}

/// Keys idle this long, with nothing in flight, leave the maps: twice the block layer's
/// request timeout, so a key is never dropped under a request that is merely slow.
pub const DEFAULT_IDLE_TIMEOUT_NS: u64 = 60_000_000_000;

/// The programs record requests in EARLY_COUNTED for at least this long after attach
/// (twice the check window of the completion program).
const EARLY_WINDOW_NS: u64 = 200_000_000;

/// What the collector reads and writes outside itself: the programs' maps (KEYS, HISTS,
/// AGENT_STATE), the disks' own statistics and the monotonic clock. [`AyaKernel`] is the
/// loaded object; the tests drive the collector with a fake, so its arithmetic is checked
/// without a kernel.
pub trait KernelStats {
    /// Monotonic time, ns.
    fn now_ns(&self) -> u64;
    /// Visits every entry of KEYS; a key deleted during the walk is skipped.
    fn for_each_counters(&self, f: &mut dyn FnMut(IoKey, KeyCounters)) -> Result<(), CollectError>;
    /// Visits every entry of HISTS; a key deleted during the walk is skipped.
    fn for_each_histograms(
        &self,
        f: &mut dyn FnMut(IoKey, &KeyHistograms),
    ) -> Result<(), CollectError>;
    /// One KEYS entry, read again (None if absent or unreadable).
    fn counters(&self, key: &IoKey) -> Option<KeyCounters>;
    /// Deletes a key from KEYS and HISTS; a key already gone is fine.
    fn remove_key(&mut self, key: &IoKey);
    /// An AGENT_STATE slot (0 if unreadable).
    fn state(&self, slot: u32) -> u64;
    fn set_state(&mut self, slot: u32, value: u64) -> Result<(), CollectError>;
    /// Whether the kernel accounts the disk's requests in its stat file.
    fn disk_accounted(&self, dev: u32) -> bool;
    fn disk_stat(&self, dev: u32) -> Option<DiskStat>;
}

/// [`KernelStats`] of the loaded object: its maps, /sys/dev/block, CLOCK_MONOTONIC.
pub struct AyaKernel {
    keys: BpfHashMap<MapData, IoKey, KeyCounters>,
    hists: BpfHashMap<MapData, IoKey, KeyHistograms>,
    state: Array<MapData, u64>,
}

impl AyaKernel {
    /// Takes the maps out of the loaded object (the programs stay attached in `ebpf`).
    pub fn take(ebpf: &mut Ebpf) -> Result<Self, CollectError> {
        fn take<T>(ebpf: &mut Ebpf, name: &'static str) -> Result<T, CollectError>
        where
            T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>,
        {
            let m = ebpf.take_map(name).ok_or(CollectError::MissingMap(name))?;
            T::try_from(m).map_err(|e| CollectError::Map(name, e))
        }
        Ok(AyaKernel {
            keys: take(ebpf, MAP_KEYS)?,
            hists: take(ebpf, MAP_HISTS)?,
            state: take(ebpf, MAP_AGENT_STATE)?,
        })
    }
}

impl KernelStats for AyaKernel {
    fn now_ns(&self) -> u64 {
        monotonic_ns()
    }

    fn for_each_counters(&self, f: &mut dyn FnMut(IoKey, KeyCounters)) -> Result<(), CollectError> {
        for item in self.keys.iter() {
            match item {
                Ok((k, v)) => f(k, v),
                // Deleted between the key walk and its lookup.
                Err(aya::maps::MapError::KeyNotFound) => continue,
                Err(e) => return Err(CollectError::Map(MAP_KEYS, e)),
            }
        }
        Ok(())
    }

    fn for_each_histograms(
        &self,
        f: &mut dyn FnMut(IoKey, &KeyHistograms),
    ) -> Result<(), CollectError> {
        for item in self.hists.iter() {
            match item {
                Ok((k, v)) => f(k, &v),
                Err(aya::maps::MapError::KeyNotFound) => continue,
                Err(e) => return Err(CollectError::Map(MAP_HISTS, e)),
            }
        }
        Ok(())
    }

    fn counters(&self, key: &IoKey) -> Option<KeyCounters> {
        self.keys.get(key, 0).ok()
    }

    fn remove_key(&mut self, key: &IoKey) {
        let _ = self.keys.remove(key);
        let _ = self.hists.remove(key);
    }

    fn state(&self, slot: u32) -> u64 {
        self.state.get(&slot, 0).unwrap_or(0)
    }

    fn set_state(&mut self, slot: u32, value: u64) -> Result<(), CollectError> {
        self.state
            .set(slot, value, 0)
            .map_err(|e| CollectError::Map(MAP_AGENT_STATE, e))
    }

    fn disk_accounted(&self, dev: u32) -> bool {
        DiskStat::accounted(dev)
    }

    fn disk_stat(&self, dev: u32) -> Option<DiskStat> {
        DiskStat::read(dev)
    }
}

pub struct Collector<K: KernelStats = AyaKernel> {
    kernel: K,
    /// Each key's counters and histograms as last read.
    prev: HashMap<IoKey, Baseline>,
    /// In-flight level of each key at the end of the previous cycle.
    prev_inflight: HashMap<IoKey, i64>,
    inflight_ledger: InflightLedger,
    idle_timeout_ns: u64,
    count_inflight: bool,
    early_window_open: bool,
    cycle: u64,
    last_read_ns: u64,
}

pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out pointer; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl Collector<AyaKernel> {
    /// Takes the maps out of the loaded object (the programs stay attached in `ebpf`).
    pub fn new(
        ebpf: &mut Ebpf,
        idle_timeout_ns: u64,
        count_inflight: bool,
    ) -> Result<Self, CollectError> {
        Collector::with_kernel(AyaKernel::take(ebpf)?, idle_timeout_ns, count_inflight)
    }
}

impl<K: KernelStats> Collector<K> {
    /// Baselines what `kernel` already counts: it belongs to no cycle.
    pub fn with_kernel(
        kernel: K,
        idle_timeout_ns: u64,
        count_inflight: bool,
    ) -> Result<Self, CollectError> {
        let last_read_ns = kernel.now_ns();
        let mut c = Collector {
            kernel,
            prev: HashMap::new(),
            prev_inflight: HashMap::new(),
            inflight_ledger: InflightLedger::default(),
            idle_timeout_ns,
            count_inflight,
            early_window_open: true,
            cycle: 0,
            last_read_ns,
        };
        // Baseline: whatever is already counted belongs to no cycle.
        c.collect()?;
        c.cycle = 0;
        c.start_epoch()?;
        Ok(c)
    }

    /// Peaks the programs record from now on belong to the next cycle.
    fn start_epoch(&mut self) -> Result<(), CollectError> {
        self.kernel.set_state(STATE_EPOCH, self.cycle + 1)
    }

    fn state(&self, slot: u32) -> u64 {
        self.kernel.state(slot)
    }

    /// Closes the attach-time window of the issue program once it has lasted long enough.
    fn close_early_window(&mut self, now_ns: u64) {
        if self.early_window_open
            && now_ns.saturating_sub(self.state(STATE_FIRST_ISSUE_NS)) >= EARLY_WINDOW_NS
            && self.kernel.set_state(STATE_EARLY_WINDOW, 0).is_ok()
        {
            self.early_window_open = false;
        }
    }

    /// Reads and diffs the maps into the next cycle's snapshot.
    pub fn collect(&mut self) -> Result<Snapshot, CollectError> {
        let now_ns = self.kernel.now_ns();
        let interval_ns = now_ns.saturating_sub(self.last_read_ns).max(1);
        self.last_read_ns = now_ns;
        self.cycle += 1;
        let epoch = self.cycle;
        self.close_early_window(now_ns);

        let mut counters: HashMap<IoKey, KeyCounters> = HashMap::with_capacity(self.prev.len());
        self.kernel.for_each_counters(&mut |k, v| {
            counters.insert(k, v);
        })?;
        self.start_epoch()?;

        let mut deltas = Vec::with_capacity(self.prev.len() + 16);
        let mut seen: HashSet<IoKey> = HashSet::with_capacity(self.prev.len() + 16);
        let add = |key: IoKey, c: KeyCounters, h: Option<&KeyHistograms>, base: &mut Baseline| {
            let ht = h.map(KeyHistograms::totals);
            let (ios, bytes) = ht.map_or((c.ios, c.bytes), |t| {
                (c.ios.wrapping_add(t.ios), c.bytes.wrapping_add(t.bytes))
            });
            let mut d = KeyDelta {
                key,
                ios: ios.wrapping_sub(base.ios),
                bytes: bytes.wrapping_sub(base.bytes),
                issued: c.peak_epoch == epoch,
                ..Default::default()
            };
            if let Some(t) = ht {
                d.sequential_ios = t.sequential_ios.wrapping_sub(base.sequential_ios) as u64;
                base.sequential_ios = t.sequential_ios;
                for (i, n) in t.size_ios.iter().enumerate() {
                    d.size_ios[i] = n.wrapping_sub(base.size_ios[i]) as u64;
                    base.size_ios[i] = *n;
                }
            }
            if let (Some(h), Some(t)) = (h, ht) {
                if t.ios != base.hist_ios {
                    diff_histograms(&mut d, h, base);
                    base.hist_ios = t.ios;
                }
            }
            base.ios = ios;
            base.bytes = bytes;
            // A key first seen idle counts as active now: its idle time starts here.
            if d.had_requests() || base.last_active_ns == 0 {
                base.last_active_ns = now_ns;
            }
            d
        };
        self.kernel.for_each_histograms(&mut |key, h| {
            let c = counters.get(&key).copied().unwrap_or_default();
            deltas.push(add(key, c, Some(h), self.prev.entry(key).or_default()));
            seen.insert(key);
        })?;
        for (key, c) in &counters {
            if !seen.contains(key) {
                deltas.push(add(*key, *c, None, self.prev.entry(*key).or_default()));
                seen.insert(*key);
            }
        }
        // Keys removed from the maps (forgotten, evicted) drop their baseline too.
        if self.prev.len() != seen.len() {
            self.prev.retain(|k, _| seen.contains(k));
        }

        let inflight = counters;
        // Idle: no issue and no completion this cycle.
        let idle = |d: &KeyDelta| !d.had_requests();
        let mut suspects: HashMap<u32, Vec<(IoKey, i64)>> = HashMap::new();
        for d in &deltas {
            let count = inflight.get(&d.key).map_or(0, |c| c.inflight);
            if self.inflight_ledger.suspect(d.key, count, idle(d)) {
                suspects.entry(d.key.dev).or_default().push((d.key, count));
            }
        }
        let quiet: HashSet<IoKey> = suspects
            .iter()
            .filter(|(dev, keys)| self.disk_quiet_around(**dev, keys))
            .flat_map(|(_, keys)| keys.iter().map(|(k, _)| *k))
            .collect();
        let mut ends = HashMap::with_capacity(inflight.len());
        let mut inflight_resets = Vec::new();
        let mut evicted = Vec::new();
        for d in &mut deltas {
            let v = inflight.get(&d.key).copied().unwrap_or_default();
            let end = self.inflight_ledger.end_cycle(
                d.key,
                v.inflight,
                idle(d),
                quiet.contains(&d.key),
                now_ns,
            );
            if end.by_timeout {
                inflight_resets.push((d.key, end.untraced));
            }
            let now = end.level;
            // Highest of: level carried in from the last cycle (less what this cycle found
            // had completed unseen before it began: only idle keys find any), level now,
            // and the peak the programs saw after this cycle's first issue (less the offset
            // it held then).
            let carried = self.prev_inflight.get(&d.key).copied().unwrap_or(0) - end.untraced;
            let mut peak = now.max(carried);
            if d.issued {
                peak = peak.max(v.peak - end.offset);
            }
            d.inflight_now = now as u64;
            d.inflight_peak = peak.max(0) as u64;
            d.untraced_completions = end.untraced as u64;
            let idle_since = self.prev.get(&d.key).map_or(now_ns, |b| b.last_active_ns);
            if d.is_idle() && now == 0 && now_ns.saturating_sub(idle_since) >= self.idle_timeout_ns
            {
                evicted.push(d.key);
            } else {
                ends.insert(d.key, now);
            }
        }
        self.prev_inflight = ends;
        if !evicted.is_empty() {
            for key in &evicted {
                self.remove_key(key);
            }
            let gone: HashSet<IoKey> = evicted.iter().copied().collect();
            deltas.retain(|d| !gone.contains(&d.key));
        }
        deltas.sort_by_key(|d| d.key);

        Ok(Snapshot {
            cycle: self.cycle,
            interval_ns,
            deltas,
            preexisting_completions: self.state(STATE_PREEXISTING),
            map_full: self.state(STATE_MAP_FULL),
            unsampled: self.state(STATE_UNSAMPLED),
            evicted,
            inflight_counted: self.count_inflight,
            need_insert: self.state(STATE_NEED_INSERT) != 0,
            issue_map_timing: self.state(STATE_FALLBACK_ANY) != 0,
            inflight_resets,
            untraced_completions: self.inflight_ledger.untraced_total(),
        })
    }

    /// Whether `dev` had no request in flight, by the kernel's own accounting, from before
    /// to after a re-read of the suspects' counts, and the counts did not move: then what
    /// they hold completed unseen.
    fn disk_quiet_around(&self, dev: u32, suspects: &[(IoKey, i64)]) -> bool {
        if !self.kernel.disk_accounted(dev) {
            return false;
        }
        let Some(before) = self.kernel.disk_stat(dev) else {
            return false;
        };
        if before.in_flight != 0 {
            return false;
        }
        let unchanged = suspects
            .iter()
            .all(|(k, c)| self.kernel.counters(k).is_some_and(|v| v.inflight == *c));
        let Some(after) = self.kernel.disk_stat(dev) else {
            return false;
        };
        unchanged && after.in_flight == 0 && after.completed == before.completed
    }

    /// Removes a key from the maps and every table of the collector. A request that lands
    /// on it in the same microseconds starts the key afresh (its in-flight decrement, if it
    /// was counted before, is clamped by the ledger).
    fn remove_key(&mut self, key: &IoKey) {
        self.kernel.remove_key(key);
        self.prev.remove(key);
        self.prev_inflight.remove(key);
        self.inflight_ledger.forget_key(key);
    }

    /// Removes every key of `cgroup_id` from the maps (the cgroup no longer exists). The
    /// keys come from this cycle's read, which saw every key of the maps.
    pub fn forget_cgroup(&mut self, cgroup_id: u64) {
        let keys: Vec<IoKey> = self
            .prev
            .keys()
            .chain(self.prev_inflight.keys())
            .filter(|k| k.cgroup_id == cgroup_id)
            .copied()
            .collect();
        for k in keys {
            self.remove_key(&k);
        }
        self.inflight_ledger.forget_cgroup(cgroup_id);
    }

    /// Number of keys currently held in the maps.
    pub fn tracked_keys(&self) -> usize {
        self.prev.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use isolator_common::{
        latency_bucket, Latency, HIST_BUCKETS, OP_OTHER, STATE_COUNT_INFLIGHT, STATE_SLOTS, STRIPES,
    };
    use std::collections::BTreeMap;

    #[test]
    fn histogram_diff_is_exact_across_wraps_and_keeps_a_sparse_baseline() {
        let mut base = Vec::new();
        let mut all = Box::new(KeyHistograms::ZERO.buckets);
        // Only the queue column is diffed; the others must not leak in.
        all[7].device = 99;
        all[8].total = 98;
        let set = |all: &mut [Latencies<u32>; HIST_BUCKETS], i: usize, v: u32| all[i].queue = v;
        let queue =
            |all: &[Latencies<u32>; HIST_BUCKETS]| all.iter().map(|b| b.queue).collect::<Vec<_>>();
        set(&mut all, 7, u32::MAX - 1);
        set(&mut all, 900, 4);
        let (d, n) = diff_histogram(queue(&all).into_iter(), &mut base);
        assert_eq!(d, vec![(7, (u32::MAX - 1) as u64), (900, 4)]);
        assert_eq!(n, (u32::MAX - 1) as u64 + 4);
        assert_eq!(base, vec![(7, u32::MAX - 1), (900, 4)]);
        // Bucket 7 wraps (5 new samples), 9 is new, 900 is unchanged.
        set(&mut all, 7, 3);
        set(&mut all, 9, 2);
        let (d, n) = diff_histogram(queue(&all).into_iter(), &mut base);
        assert_eq!(d, vec![(7, 5), (9, 2)]);
        assert_eq!(n, 7);
        assert_eq!(base, vec![(7, 3), (9, 2), (900, 4)]);
        // A bucket that wraps to exactly 0 still counts its 2^32 - 3 samples.
        set(&mut all, 7, 0);
        let (d, _) = diff_histogram(queue(&all).into_iter(), &mut base);
        assert_eq!(d, vec![(7, (u32::MAX - 2) as u64)]);
        assert_eq!(base, vec![(9, 2), (900, 4)]);
        let (d, n) = diff_histogram(queue(&all).into_iter(), &mut base);
        assert!(d.is_empty() && n == 0);
    }

    #[test]
    fn key_histograms_diff_into_counts_and_sums() {
        let mut h = Box::new(KeyHistograms::ZERO);
        h.buckets[100].device = 3;
        h.stripes[0].sum_ns.device = 1000;
        h.stripes[3].sum_ns.device = 2000;
        h.buckets[120].total = 3;
        h.stripes[1].sum_ns.total = 9000;
        h.buckets[5].queue = 2;
        h.stripes[2].sum_ns.queue = 10;
        let mut base = Baseline::default();
        let mut d = KeyDelta::default();
        diff_histograms(&mut d, &h, &mut base);
        let l = &d.latency;
        assert_eq!((l.device.count, l.device.sum_ns), (3, 3000));
        assert_eq!((l.total.count, l.total.sum_ns), (3, 9000));
        assert_eq!(
            (l.queue.count, l.queue.sum_ns, l.queue.hist.clone()),
            (2, 10, vec![(5, 2)])
        );
        h.buckets[101].device = 1;
        h.stripes[1].sum_ns.device = 1100;
        let mut d = KeyDelta::default();
        diff_histograms(&mut d, &h, &mut base);
        let l = &d.latency;
        assert_eq!(
            (l.device.count, l.device.sum_ns, l.device.hist.clone()),
            (1, 1100, vec![(101, 1)])
        );
        assert_eq!((l.total.count, l.queue.count), (0, 0));
    }

    fn key(cgroup_id: u64) -> IoKey {
        IoKey {
            cgroup_id,
            dev: 8 << 20,
            op: 0,
        }
    }

    fn op_key(op: u32) -> IoKey {
        IoKey { op, ..key(1) }
    }

    const S: u64 = 1_000_000_000;

    #[test]
    fn unseen_completions_leave_the_level_when_the_disk_is_quiet() {
        let mut l = InflightLedger::default();
        let k = key(1);
        // Cycle 1: busy; 3 counted in flight, of which (unknown yet) one completed unseen.
        assert!(!l.suspect(k, 3, false), "a key with requests is no suspect");
        let e = l.end_cycle(k, 3, false, false, S);
        assert_eq!((e.level, e.untraced), (3, 0));
        // Cycle 2: two complete, one stays: idle from cycle 3 on, the disk not yet quiet.
        assert_eq!(l.end_cycle(k, 1, false, false, 2 * S).level, 1);
        assert!(l.suspect(k, 1, true));
        let e = l.end_cycle(k, 1, true, false, 3 * S);
        assert_eq!((e.level, e.untraced, e.by_timeout), (1, 0, false));
        // Cycle 4: the disk had nothing in flight: the one is untraced.
        let e = l.end_cycle(k, 1, true, true, 4 * S);
        assert_eq!((e.level, e.untraced, e.by_timeout), (0, 1, false));
        assert_eq!(l.untraced_total(), 1);
        // The kernel-side count stays 1 for good; the level is 0 and nothing more is found.
        assert!(!l.suspect(k, 1, true));
        assert_eq!(l.end_cycle(k, 1, true, true, 5 * S).untraced, 0);
        // New requests count from there: 2 in flight on top of the stale one.
        assert_eq!(l.end_cycle(k, 3, false, false, 6 * S).level, 2);
        assert_eq!(l.end_cycle(k, 1, false, false, 7 * S).level, 0);
        assert_eq!(l.untraced_total(), 1);
    }

    #[test]
    fn a_late_completion_takes_the_offset_back() {
        let mut l = InflightLedger::default();
        let k = key(1);
        assert_eq!(l.end_cycle(k, 1, true, true, S).untraced, 1);
        // The completion was only late: the count drops below the offset.
        assert_eq!(l.end_cycle(k, 0, false, false, 2 * S).level, 0);
        assert_eq!(l.end_cycle(k, 1, false, false, 3 * S).level, 1);
        // A completion whose issue was not counted never shows as a negative level.
        let e = l.end_cycle(k, -1, false, false, 4 * S);
        assert_eq!(e.level, 0);
        assert_eq!(
            e.offset, 0,
            "the cycle's peak is the programs' peak, not raised by the negative count"
        );
        assert_eq!(l.end_cycle(k, 0, false, false, 5 * S).level, 1);
    }

    #[test]
    fn without_a_quiet_disk_only_30_s_of_silence_settles_a_count() {
        let mut l = InflightLedger::default();
        let k = op_key(isolator_common::OP_OTHER);
        assert!(
            !l.suspect(k, 2, true),
            "flushes are not in the disk's in-flight count: other ops are never asked"
        );
        assert!(l.suspect(op_key(OP_WRITE), 2, true));
        let e = l.end_cycle(k, 2, true, false, S);
        assert_eq!((e.level, e.untraced), (2, 0));
        // An issue or completion restarts the clock.
        assert_eq!(l.end_cycle(k, 2, false, false, 20 * S).untraced, 0);
        assert_eq!(l.end_cycle(k, 2, true, false, 21 * S).untraced, 0);
        assert_eq!(l.end_cycle(k, 2, true, false, 50 * S).untraced, 0);
        let e = l.end_cycle(k, 2, true, false, 51 * S);
        assert_eq!((e.level, e.untraced, e.by_timeout), (0, 2, true));
        // A vanished cgroup leaves nothing behind.
        l.forget_cgroup(1);
        assert!(l.offset.is_empty() && l.idle_since_ns.is_empty());
        assert_eq!(l.end_cycle(k, 2, false, false, 52 * S).level, 2);
    }

    /// The programs' maps and the host as the collector sees them, driven by the test: the
    /// helpers below count as block_rq_issue / block_rq_complete do.
    struct FakeKernel {
        now_ns: u64,
        keys: BTreeMap<IoKey, KeyCounters>,
        hists: BTreeMap<IoKey, Box<KeyHistograms>>,
        state: [u64; STATE_SLOTS as usize],
        /// Disks whose stat file the kernel keeps (queue/iostats = 1).
        disks: HashMap<u32, DiskStat>,
        /// Keys the collector deleted, in order.
        removed: Vec<IoKey>,
        /// Completions spread over the stripes as over CPUs.
        next_cpu: usize,
    }

    impl Default for FakeKernel {
        fn default() -> Self {
            FakeKernel {
                // A clock that does not start at 0, like CLOCK_MONOTONIC.
                now_ns: 1_000 * S,
                keys: BTreeMap::new(),
                hists: BTreeMap::new(),
                state: [0; STATE_SLOTS as usize],
                disks: HashMap::new(),
                removed: Vec::new(),
                next_cpu: 0,
            }
        }
    }

    impl FakeKernel {
        fn tick(&mut self, ns: u64) {
            self.now_ns += ns;
        }

        /// block_rq_issue of a request's first issue, counting in flight.
        fn issue(&mut self, key: IoKey) {
            let epoch = self.state[STATE_EPOCH as usize];
            let c = self.keys.entry(key).or_default();
            c.inflight += 1;
            if c.peak_epoch != epoch {
                c.peak_epoch = epoch;
                c.peak = c.inflight;
            } else if c.inflight > c.peak {
                c.peak = c.inflight;
            }
        }

        /// A final block_rq_complete with a HISTS entry: one sample of each latency.
        fn complete(&mut self, key: IoKey, bytes: u64, queue_ns: u64, device_ns: u64) {
            let cpu = self.next_cpu;
            self.next_cpu += 1;
            let h = self
                .hists
                .entry(key)
                .or_insert_with(|| Box::new(KeyHistograms::ZERO));
            let s = &mut h.stripes[cpu % STRIPES];
            s.ios += 1;
            s.bytes += bytes;
            let samples = Latencies {
                device: device_ns,
                queue: queue_ns,
                total: queue_ns + device_ns,
            };
            for which in Latency::ALL {
                let ns = *samples.get(which);
                *s.sum_ns.get_mut(which) += ns;
                *h.buckets[latency_bucket(ns)].get_mut(which) += 1;
            }
            self.uncount_inflight(key);
        }

        /// A partial completion: bytes, no request done, no sample.
        fn complete_partially(&mut self, key: IoKey, bytes: u64) {
            let h = self
                .hists
                .entry(key)
                .or_insert_with(|| Box::new(KeyHistograms::ZERO));
            h.stripes[0].bytes += bytes;
        }

        /// A final completion whose key got no HISTS entry (map full): counted in KEYS.
        fn complete_unsampled(&mut self, key: IoKey, bytes: u64) {
            let c = self.keys.entry(key).or_default();
            c.ios += 1;
            c.bytes += bytes;
            self.state[STATE_UNSAMPLED as usize] += 1;
            self.uncount_inflight(key);
        }

        fn uncount_inflight(&mut self, key: IoKey) {
            if self.state[STATE_COUNT_INFLIGHT as usize] != 0 {
                if let Some(c) = self.keys.get_mut(&key) {
                    c.inflight -= 1;
                }
            }
        }
    }

    impl KernelStats for FakeKernel {
        fn now_ns(&self) -> u64 {
            self.now_ns
        }

        fn for_each_counters(
            &self,
            f: &mut dyn FnMut(IoKey, KeyCounters),
        ) -> Result<(), CollectError> {
            self.keys.iter().for_each(|(k, v)| f(*k, *v));
            Ok(())
        }

        fn for_each_histograms(
            &self,
            f: &mut dyn FnMut(IoKey, &KeyHistograms),
        ) -> Result<(), CollectError> {
            self.hists.iter().for_each(|(k, v)| f(*k, v));
            Ok(())
        }

        fn counters(&self, key: &IoKey) -> Option<KeyCounters> {
            self.keys.get(key).copied()
        }

        fn remove_key(&mut self, key: &IoKey) {
            self.keys.remove(key);
            self.hists.remove(key);
            self.removed.push(*key);
        }

        fn state(&self, slot: u32) -> u64 {
            self.state[slot as usize]
        }

        fn set_state(&mut self, slot: u32, value: u64) -> Result<(), CollectError> {
            self.state[slot as usize] = value;
            Ok(())
        }

        fn disk_accounted(&self, dev: u32) -> bool {
            self.disks.contains_key(&dev)
        }

        fn disk_stat(&self, dev: u32) -> Option<DiskStat> {
            self.disks.get(&dev).copied()
        }
    }

    const IDLE_TIMEOUT: u64 = DEFAULT_IDLE_TIMEOUT_NS;

    fn collector(kernel: FakeKernel) -> Collector<FakeKernel> {
        let count_inflight = kernel.state[STATE_COUNT_INFLIGHT as usize] != 0;
        Collector::with_kernel(kernel, IDLE_TIMEOUT, count_inflight).unwrap()
    }

    /// A collector counting in flight, as with `--count-inflight`.
    fn counting_collector() -> Collector<FakeKernel> {
        let mut k = FakeKernel::default();
        k.state[STATE_COUNT_INFLIGHT as usize] = 1;
        collector(k)
    }

    /// The next cycle, `secs` after the last.
    fn cycle(c: &mut Collector<FakeKernel>, secs: u64) -> Snapshot {
        c.kernel.tick(secs * S);
        c.collect().unwrap()
    }

    fn delta(s: &Snapshot, key: IoKey) -> &KeyDelta {
        s.deltas
            .iter()
            .find(|d| d.key == key)
            .unwrap_or_else(|| panic!("no delta of {key:?} in cycle {}", s.cycle))
    }

    fn hist_of(samples: &[u64]) -> SparseHist {
        let mut h = BTreeMap::new();
        for &ns in samples {
            *h.entry(latency_bucket(ns) as u16).or_insert(0) += 1;
        }
        h.into_iter().collect()
    }

    #[test]
    fn what_was_counted_before_the_start_belongs_to_no_cycle() {
        let mut k = FakeKernel::default();
        k.complete(key(1), 1 << 20, 1_000, 50_000);
        k.complete_unsampled(key(2), 4096);
        let mut c = collector(k);
        let s = cycle(&mut c, 1);
        assert_eq!(s.cycle, 1);
        assert_eq!(s.interval_ns, S);
        for d in &s.deltas {
            assert!(d.is_idle(), "{d:?}");
            assert_eq!(d.latency, Latencies::default());
        }
        assert_eq!(c.tracked_keys(), 2);
    }

    #[test]
    fn deltas_are_exact_to_the_byte_from_cycle_to_cycle() {
        let mut c = collector(FakeKernel::default());
        let (a, b) = (key(1), key(2));
        c.kernel.complete(a, 4096, 2_000, 100_000);
        c.kernel.complete(a, 131_072, 3_000, 250_000);
        c.kernel.complete_partially(a, 1_000);
        c.kernel.complete(b, 512, 0, 70);
        let s = cycle(&mut c, 1);
        let d = delta(&s, a);
        assert_eq!((d.ios, d.bytes), (2, 4096 + 131_072 + 1_000));
        let l = &d.latency;
        assert_eq!((l.device.count, l.device.sum_ns), (2, 350_000));
        assert_eq!(l.device.hist, hist_of(&[100_000, 250_000]));
        assert_eq!((l.queue.count, l.queue.sum_ns), (2, 5_000));
        assert_eq!((l.total.count, l.total.sum_ns), (2, 355_000));
        assert_eq!(l.total.hist, hist_of(&[102_000, 253_000]));
        assert_eq!((delta(&s, b).ios, delta(&s, b).bytes), (1, 512));

        // The rest of a's partial request completes; b is idle.
        c.kernel.complete(a, 7_192, 1_000, 90_000);
        let s = cycle(&mut c, 2);
        assert_eq!(s.interval_ns, 2 * S);
        let d = delta(&s, a);
        assert_eq!((d.ios, d.bytes), (1, 7_192));
        assert_eq!(d.latency.device.hist, hist_of(&[90_000]));
        assert_eq!(d.latency.device.sum_ns, 90_000);
        let d = delta(&s, b);
        assert!(d.is_idle() && d.latency == Latencies::default(), "{d:?}");

        // Many requests at once: every byte, whatever the stripes they landed in.
        for i in 0..1000 {
            c.kernel.complete(b, 4096 + i, 10, 1_000 + i);
        }
        let s = cycle(&mut c, 1);
        let d = delta(&s, b);
        assert_eq!(d.ios, 1000);
        assert_eq!(d.bytes, 1000 * 4096 + 999 * 1000 / 2);
        assert_eq!(d.latency.device.sum_ns, 1000 * 1_000 + 999 * 1000 / 2);
        assert_eq!(d.latency.device.count, 1000);
        assert_eq!(
            d.latency.queue.hist,
            vec![(latency_bucket(10) as u16, 1000)]
        );
        assert!(delta(&s, a).is_idle());
    }

    #[test]
    fn histograms_are_diffed_only_when_the_key_completed_requests() {
        let mut c = collector(FakeKernel::default());
        let k = key(1);
        c.kernel.complete(k, 4096, 0, 1_000);
        assert_eq!(delta(&cycle(&mut c, 1), k).latency.device.count, 1);
        // A partial completion moves bytes, not the request count: the histograms are not
        // read (a sample appearing without a completion, which the programs never do,
        // stays unseen until the key's count moves).
        c.kernel.complete_partially(k, 512);
        c.kernel.hists.get_mut(&k).unwrap().buckets[3].queue += 1;
        let d = delta(&cycle(&mut c, 1), k).clone();
        assert_eq!((d.ios, d.bytes), (0, 512));
        assert_eq!(d.latency, Latencies::default());
        // The next completion takes both.
        c.kernel.complete(k, 4096, 0, 2_000);
        let d = delta(&cycle(&mut c, 1), k).clone();
        assert_eq!(d.latency.device.hist, hist_of(&[2_000]));
        assert_eq!(d.latency.queue.hist, vec![(0, 1), (3, 1)]);
        assert_eq!(d.latency.queue.count, 2);
    }

    #[test]
    fn completions_without_a_histograms_entry_are_counted_from_keys() {
        let mut c = collector(FakeKernel::default());
        let k = key(1);
        // HISTS full: the key has only its KEYS counters.
        c.kernel.complete_unsampled(k, 4096);
        c.kernel.complete_unsampled(k, 8192);
        let s = cycle(&mut c, 1);
        let d = delta(&s, k);
        assert_eq!((d.ios, d.bytes), (2, 12_288));
        assert_eq!(d.latency, Latencies::default());
        assert_eq!(s.unsampled, 2);
        // An entry frees up: both maps count the key, and the delta is their sum.
        c.kernel.complete(k, 1_000, 10, 20_000);
        c.kernel.complete_unsampled(k, 3);
        let s = cycle(&mut c, 1);
        let d = delta(&s, k);
        assert_eq!((d.ios, d.bytes), (2, 1_003));
        assert_eq!(d.latency.device.count, 1, "only the sampled completion");
        assert_eq!(s.unsampled, 3, "cumulative, as the kernel counts it");
        let s = cycle(&mut c, 1);
        assert!(delta(&s, k).is_idle());
    }

    #[test]
    fn an_idle_key_leaves_the_maps_after_the_idle_timeout_and_comes_back_whole() {
        let mut c = collector(FakeKernel::default());
        let (idle, other) = (key(1), key(2));
        c.kernel.complete(idle, 4096, 0, 1_000);
        c.kernel.complete(other, 4096, 0, 1_000);
        assert_eq!(delta(&cycle(&mut c, 1), idle).bytes, 4096);
        // Idle from here; `other` stays busy.
        let mut waited = 0;
        while waited + 10 < IDLE_TIMEOUT / S {
            c.kernel.complete(other, 1, 0, 1_000);
            let s = cycle(&mut c, 10);
            waited += 10;
            assert!(s.evicted.is_empty(), "evicted after {waited} s");
            assert!(delta(&s, idle).is_idle());
        }
        c.kernel.complete(other, 1, 0, 1_000);
        let s = cycle(&mut c, IDLE_TIMEOUT / S - waited);
        assert_eq!(s.evicted, vec![idle]);
        assert!(s.deltas.iter().all(|d| d.key != idle));
        assert_eq!(c.kernel.removed, vec![idle]);
        assert!(!c.kernel.keys.contains_key(&idle) && !c.kernel.hists.contains_key(&idle));
        assert_eq!(c.tracked_keys(), 1);
        // The kernel creates the key afresh on its next request: counted from zero.
        c.kernel.complete(idle, 12_345, 0, 1_000);
        c.kernel.complete_unsampled(idle, 5);
        let s = cycle(&mut c, 1);
        let d = delta(&s, idle);
        assert_eq!((d.ios, d.bytes), (2, 12_350));
        assert_eq!(d.latency.device.hist, hist_of(&[1_000]));
    }

    #[test]
    fn a_key_first_seen_idle_gets_the_whole_idle_timeout() {
        let mut c = collector(FakeKernel::default());
        let k = key(1);
        cycle(&mut c, 100);
        // An entry without a count yet (the kernel created it; the request's add is late).
        c.kernel.keys.insert(k, KeyCounters::default());
        let s = cycle(&mut c, 1);
        assert!(delta(&s, k).is_idle() && s.evicted.is_empty());
        let s = cycle(&mut c, IDLE_TIMEOUT / S - 1);
        assert!(s.evicted.is_empty());
        let s = cycle(&mut c, 1);
        assert_eq!(s.evicted, vec![k]);
    }

    #[test]
    fn a_busy_key_is_never_evicted() {
        let mut c = collector(FakeKernel::default());
        let k = key(1);
        for _ in 0..100 {
            c.kernel.complete(k, 4096, 0, 1_000);
            let s = cycle(&mut c, 10);
            assert!(s.evicted.is_empty());
            assert_eq!(delta(&s, k).bytes, 4096);
        }
    }

    #[test]
    fn a_key_with_requests_in_flight_outlives_the_idle_timeout_until_they_are_settled() {
        let mut k = FakeKernel::default();
        k.state[STATE_COUNT_INFLIGHT as usize] = 1;
        let mut c = Collector::with_kernel(k, 5 * S, true).unwrap();
        let k = op_key(OP_OTHER);
        c.kernel.issue(k);
        cycle(&mut c, 1);
        // Idle for longer than the 5 s timeout, but a request is in flight.
        for _ in 0..3 {
            let s = cycle(&mut c, 10);
            assert!(s.evicted.is_empty());
            assert_eq!(delta(&s, k).inflight_now, 1);
        }
        // 30 s without an issue or a completion: taken for completed unseen; the key goes
        // on the next idle cycle.
        let s = cycle(&mut c, 10);
        assert_eq!(s.inflight_resets, vec![(k, 1)]);
        assert!(
            s.evicted.is_empty(),
            "not idle: it found an untraced completion"
        );
        let s = cycle(&mut c, 10);
        assert_eq!(s.evicted, vec![k]);
    }

    #[test]
    fn in_flight_level_and_peak_follow_the_programs_counts() {
        let mut c = counting_collector();
        let k = key(1);
        for _ in 0..3 {
            c.kernel.issue(k);
        }
        c.kernel.complete(k, 4096, 0, 1_000);
        c.kernel.complete(k, 4096, 0, 1_000);
        let s = cycle(&mut c, 1);
        assert!(s.inflight_counted);
        let d = delta(&s, k);
        assert!(d.issued);
        assert_eq!((d.inflight_now, d.inflight_peak), (1, 3));
        // No issue this cycle: the peak is the level carried in.
        c.kernel.complete(k, 4096, 0, 1_000);
        let d = delta(&cycle(&mut c, 1), k).clone();
        assert!(!d.issued);
        assert_eq!((d.inflight_now, d.inflight_peak), (0, 1));
        // Peaks of an earlier epoch are not this cycle's.
        c.kernel.issue(k);
        let d = delta(&cycle(&mut c, 1), k).clone();
        assert_eq!((d.inflight_now, d.inflight_peak), (1, 1));
    }

    #[test]
    fn a_count_no_completion_takes_off_is_reset_after_30_s_of_silence() {
        let mut c = counting_collector();
        // Flushes: never asked of the disk's own accounting, only timed out.
        let k = op_key(OP_OTHER);
        c.kernel.issue(k);
        c.kernel.issue(k);
        c.kernel.complete(k, 0, 0, 1_000);
        let d = delta(&cycle(&mut c, 1), k).clone();
        assert_eq!(d.inflight_now, 1);
        // The second completion never runs the program. Idle from the next cycle on.
        let mut s = cycle(&mut c, 10);
        let idle_from = c.kernel.now_ns;
        while c.kernel.now_ns - idle_from < STALE_INFLIGHT_NS {
            assert!(s.inflight_resets.is_empty());
            assert_eq!(delta(&s, k).inflight_now, 1);
            s = cycle(&mut c, 10);
        }
        assert_eq!(s.inflight_resets, vec![(k, 1)]);
        let d = delta(&s, k);
        // Completed before the cycle began, so not in this cycle's peak either.
        assert_eq!(
            (d.inflight_now, d.inflight_peak, d.untraced_completions),
            (0, 0, 1)
        );
        assert_eq!(s.untraced_completions, 1);
        assert_eq!(
            c.kernel.keys[&k].inflight, 1,
            "the agent never writes the count"
        );
        // New requests count on top of the stale one.
        c.kernel.issue(k);
        let s = cycle(&mut c, 1);
        assert_eq!(delta(&s, k).inflight_now, 1);
        assert_eq!(s.untraced_completions, 1);
    }

    #[test]
    fn a_quiet_disk_settles_an_idle_keys_count_at_once() {
        let mut c = counting_collector();
        let k = key(1);
        let quiet = DiskStat {
            completed: [5, 5, 0, 0],
            in_flight: 0,
            io_ticks_ms: 10,
        };
        c.kernel.disks.insert(k.dev, quiet);
        c.kernel.issue(k);
        // Busy cycle: never a suspect.
        assert_eq!(delta(&cycle(&mut c, 1), k).inflight_now, 1);
        // The disk still has a request in flight: the count stands.
        c.kernel.disks.get_mut(&k.dev).unwrap().in_flight = 1;
        assert_eq!(delta(&cycle(&mut c, 1), k).inflight_now, 1);
        // The disk is quiet: the request completed unseen.
        c.kernel.disks.insert(k.dev, quiet);
        let s = cycle(&mut c, 1);
        assert!(
            s.inflight_resets.is_empty(),
            "found by the disk, not by timeout"
        );
        let d = delta(&s, k);
        assert_eq!((d.inflight_now, d.untraced_completions), (0, 1));
        assert_eq!(s.untraced_completions, 1);
    }

    #[test]
    fn an_in_flight_count_that_goes_below_zero_is_clamped_and_rebased() {
        let mut c = counting_collector();
        let k = key(1);
        // The key was deleted and created afresh by the kernel under a request counted in
        // the old entry: its completion takes the new count below zero.
        c.kernel.keys.insert(
            k,
            KeyCounters {
                inflight: -1,
                ..Default::default()
            },
        );
        c.kernel.complete(k, 4096, 0, 1_000);
        let d = delta(&cycle(&mut c, 1), k).clone();
        assert_eq!((d.inflight_now, d.inflight_peak), (0, 0));
        // The next issue counts from there: one in flight, not zero.
        c.kernel.issue(k);
        let d = delta(&cycle(&mut c, 1), k).clone();
        assert_eq!((d.inflight_now, d.inflight_peak), (1, 1));
        c.kernel.complete(k, 4096, 0, 1_000);
        let d = delta(&cycle(&mut c, 1), k).clone();
        assert_eq!((d.inflight_now, d.inflight_peak), (0, 1));
    }

    #[test]
    fn state_slots_are_reported_and_the_epoch_advances_each_cycle() {
        let mut k = FakeKernel::default();
        k.state[STATE_FIRST_ISSUE_NS as usize] = k.now_ns;
        k.state[STATE_EARLY_WINDOW as usize] = 1;
        k.state[STATE_MAP_FULL as usize] = 7;
        k.state[STATE_PREEXISTING as usize] = 3;
        let mut c = collector(k);
        // Issues from now on belong to cycle 1.
        assert_eq!(c.kernel.state[STATE_EPOCH as usize], 1);
        assert_eq!(
            c.kernel.state[STATE_EARLY_WINDOW as usize], 1,
            "open at the start"
        );
        c.kernel.tick(EARLY_WINDOW_NS / 2);
        let s = c.collect().unwrap();
        assert_eq!(
            c.kernel.state[STATE_EARLY_WINDOW as usize], 1,
            "not yet 200 ms"
        );
        assert_eq!(c.kernel.state[STATE_EPOCH as usize], 2);
        assert_eq!(
            (s.map_full, s.preexisting_completions, s.unsampled),
            (7, 3, 0)
        );
        assert!(!s.need_insert && !s.issue_map_timing);
        c.kernel.state[STATE_MAP_FULL as usize] += 2;
        c.kernel.state[STATE_UNSAMPLED as usize] = 4;
        c.kernel.state[STATE_NEED_INSERT as usize] = 1;
        c.kernel.state[STATE_FALLBACK_ANY as usize] = 1;
        let s = cycle(&mut c, 1);
        assert_eq!(c.kernel.state[STATE_EARLY_WINDOW as usize], 0, "closed");
        assert_eq!(c.kernel.state[STATE_EPOCH as usize], 3);
        assert_eq!(
            (s.map_full, s.preexisting_completions, s.unsampled),
            (9, 3, 4)
        );
        assert!(s.need_insert && s.issue_map_timing);
        assert!(!s.inflight_counted);
        // Closed once: the agent does not write it again.
        c.kernel.state[STATE_EARLY_WINDOW as usize] = 1;
        cycle(&mut c, 1);
        assert_eq!(c.kernel.state[STATE_EARLY_WINDOW as usize], 1);
    }

    #[test]
    fn a_gone_cgroups_keys_leave_the_maps_at_once() {
        let mut c = counting_collector();
        let (gone, kept) = (key(1), key(2));
        c.kernel.issue(gone);
        c.kernel.complete(gone, 4096, 0, 1_000);
        c.kernel.complete(kept, 4096, 0, 1_000);
        cycle(&mut c, 1);
        c.forget_cgroup(gone.cgroup_id);
        // (Once per table that held it: a second delete of a gone key is a no-op.)
        assert!(!c.kernel.removed.is_empty() && c.kernel.removed.iter().all(|k| *k == gone));
        assert_eq!(c.tracked_keys(), 1);
        let s = cycle(&mut c, 1);
        assert!(s.deltas.iter().all(|d| d.key != gone));
        assert!(s.evicted.is_empty(), "forgotten, not evicted");
    }
}
