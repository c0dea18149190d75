//! Reads the eBPF maps once per cycle and diffs them into a [`Snapshot`]: what happened in
//! the cycle per (cgroup, disk, op). Keys of cgroups that no longer exist are removed from
//! the maps so they cannot grow without bound.

use std::collections::{HashMap, HashSet};

use aya::{
    maps::{Array, HashMap as BpfHashMap, MapData, PerCpuHashMap},
    Ebpf,
};
use isolator_common::{
    Inflight, IoKey, IoStats, SpillSlot, HIST_BUCKETS, MAP_AGENT_STATE, MAP_INFLIGHT, MAP_SPILL,
    MAP_STATS, OP_READ, OP_WRITE, SPILL_OWNED, STATE_EPOCH, STATE_FALLBACK_ANY, STATE_MAP_FULL,
    STATE_NEED_INSERT, STATE_PREEXISTING, STATE_UNSAMPLED,
};

use crate::disks::DiskStat;

/// Sparse histogram delta: (bucket index, count), ascending by index.
pub type SparseHist = Vec<(u16, u64)>;

/// What one (cgroup, disk, op) did during one cycle.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KeyDelta {
    pub key: IoKey,
    pub ios: u64,
    pub bytes: u64,
    pub lat_count: u64,
    pub lat_sum_ns: u64,
    pub queue_count: u64,
    pub queue_sum_ns: u64,
    pub lat_hist: SparseHist,
    pub queue_hist: SparseHist,
    pub total_count: u64,
    pub total_sum_ns: u64,
    pub total_hist: SparseHist,
    /// Requests in flight at the end of the cycle (clamped at 0).
    pub inflight_now: u64,
    /// Most requests in flight at once during the cycle.
    pub inflight_peak: u64,
    /// Requests counted in flight whose completion the programs never saw, found
    /// completed this cycle (see [`InflightLedger`]). Not in `ios`, `bytes` or latency.
    pub untraced_completions: u64,
}

impl KeyDelta {
    pub fn is_idle(&self) -> bool {
        !self.had_requests() && self.inflight_peak == 0 && self.untraced_completions == 0
    }

    /// Whether any request was issued or completed in the cycle. In-flight counts are left
    /// out: a completion the programs never saw keeps a key "in flight" until it is reset.
    pub fn had_requests(&self) -> bool {
        self.ios != 0 || self.bytes != 0 || self.queue_count != 0
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
    /// Completions lost because neither a map entry nor a spill slot was free
    /// (cumulative).
    pub map_full: u64,
    /// Requests whose latency or queue-time sample is missing from the histograms because
    /// their map entry could not be allocated at that moment (cumulative); their bytes and
    /// ios are counted.
    pub unsampled: u64,
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

/// Completions counted in a spill slot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpillCounts {
    pub ios: u64,
    pub bytes: u64,
}

impl SpillCounts {
    fn add(&mut self, o: SpillCounts) {
        self.ios = self.ios.wrapping_add(o.ios);
        self.bytes = self.bytes.wrapping_add(o.bytes);
    }
}

/// Bookkeeping of the spill slots (map I/O stays in [`Collector`]): which slots are owned,
/// and the counts of freed slots, which stay part of their key's cumulative totals.
#[derive(Debug, Default)]
pub struct SpillLedger {
    carry: HashMap<IoKey, SpillCounts>,
    /// Slots owned at the last read (index, key).
    owned: Vec<(u32, IoKey)>,
    /// STATE_UNSAMPLED at the last read: a new spill always raises it.
    unsampled: u64,
}

impl SpillLedger {
    /// Slots are read only while some are owned or after a new spill, so a host whose
    /// inserts never fail pays nothing.
    pub fn needs_read(&self, unsampled: u64) -> bool {
        !self.owned.is_empty() || unsampled != self.unsampled
    }

    /// Folds this cycle's owned slots (`None`: not read) into per-key additions to the
    /// cumulative totals, and returns the slots to free: those whose key already had its
    /// own map entry at the previous read, a cycle ago, so no program can still be
    /// spilling it. Their counts move into the carry.
    pub fn fold(
        &mut self,
        slots: Option<&[(u32, IoKey, SpillCounts)]>,
        had_entry: &HashSet<IoKey>,
        unsampled: u64,
    ) -> (HashMap<IoKey, SpillCounts>, Vec<u32>) {
        let mut adds = self.carry.clone();
        let mut free = Vec::new();
        let Some(slots) = slots else {
            return (adds, free);
        };
        self.unsampled = unsampled;
        self.owned.clear();
        for &(idx, key, counts) in slots {
            adds.entry(key).or_default().add(counts);
            if had_entry.contains(&key) {
                self.carry.entry(key).or_default().add(counts);
                free.push(idx);
            } else {
                self.owned.push((idx, key));
            }
        }
        (adds, free)
    }

    /// Drops a vanished cgroup's carry; returns its slots to free.
    pub fn forget_cgroup(&mut self, cgroup_id: u64) -> Vec<u32> {
        self.carry.retain(|k, _| k.cgroup_id != cgroup_id);
        let (gone, kept): (Vec<_>, Vec<_>) = self
            .owned
            .iter()
            .partition(|(_, k)| k.cgroup_id == cgroup_id);
        self.owned = kept;
        gone.into_iter().map(|(idx, _)| idx).collect()
    }
}

/// Adds one CPU's counters into a running sum (the kernel never resets them; wrapping
/// keeps the per-cycle differences exact).
fn accumulate(sum: &mut IoStats, v: &IoStats) {
    sum.ios = sum.ios.wrapping_add(v.ios);
    sum.bytes = sum.bytes.wrapping_add(v.bytes);
    sum.lat_count = sum.lat_count.wrapping_add(v.lat_count);
    sum.lat_sum_ns = sum.lat_sum_ns.wrapping_add(v.lat_sum_ns);
    sum.queue_count = sum.queue_count.wrapping_add(v.queue_count);
    sum.queue_sum_ns = sum.queue_sum_ns.wrapping_add(v.queue_sum_ns);
    sum.total_count = sum.total_count.wrapping_add(v.total_count);
    sum.total_sum_ns = sum.total_sum_ns.wrapping_add(v.total_sum_ns);
    for i in 0..HIST_BUCKETS {
        sum.lat_hist[i] = sum.lat_hist[i].wrapping_add(v.lat_hist[i]);
        sum.queue_hist[i] = sum.queue_hist[i].wrapping_add(v.queue_hist[i]);
        sum.total_hist[i] = sum.total_hist[i].wrapping_add(v.total_hist[i]);
    }
}

fn hist_delta(now: &[u32; HIST_BUCKETS], prev: &[u32; HIST_BUCKETS]) -> SparseHist {
    now.iter()
        .zip(prev.iter())
        .enumerate()
        .filter_map(|(i, (n, p))| {
            let d = n.wrapping_sub(*p);
            (d != 0).then_some((i as u16, d as u64))
        })
        .collect()
}

fn diff(key: IoKey, now: &IoStats, prev: &IoStats) -> KeyDelta {
    KeyDelta {
        key,
        ios: now.ios.wrapping_sub(prev.ios),
        bytes: now.bytes.wrapping_sub(prev.bytes),
        lat_count: now.lat_count.wrapping_sub(prev.lat_count),
        lat_sum_ns: now.lat_sum_ns.wrapping_sub(prev.lat_sum_ns),
        queue_count: now.queue_count.wrapping_sub(prev.queue_count),
        queue_sum_ns: now.queue_sum_ns.wrapping_sub(prev.queue_sum_ns),
        lat_hist: hist_delta(&now.lat_hist, &prev.lat_hist),
        queue_hist: hist_delta(&now.queue_hist, &prev.queue_hist),
        total_count: now.total_count.wrapping_sub(prev.total_count),
        total_sum_ns: now.total_sum_ns.wrapping_sub(prev.total_sum_ns),
        total_hist: hist_delta(&now.total_hist, &prev.total_hist),
        inflight_now: 0,
        inflight_peak: 0,
        untraced_completions: 0,
    }
}

pub struct Collector {
    stats: PerCpuHashMap<MapData, IoKey, IoStats>,
    inflight: BpfHashMap<MapData, IoKey, Inflight>,
    state: Array<MapData, u64>,
    spill: Array<MapData, SpillSlot>,
    spill_ledger: SpillLedger,
    /// Keys that had an IO_STATS entry at the last read.
    had_entry: HashSet<IoKey>,
    /// Summed counters of each key as last read: the baseline of the next diff.
    prev: HashMap<IoKey, Box<IoStats>>,
    /// In-flight level of each key at the end of the previous cycle.
    prev_inflight: HashMap<IoKey, i64>,
    inflight_ledger: InflightLedger,
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

impl Collector {
    /// Takes the maps out of the loaded object (the programs stay attached in `ebpf`).
    pub fn new(ebpf: &mut Ebpf) -> Result<Self, CollectError> {
        fn take<T>(ebpf: &mut Ebpf, name: &'static str) -> Result<T, CollectError>
        where
            T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>,
        {
            let m = ebpf.take_map(name).ok_or(CollectError::MissingMap(name))?;
            T::try_from(m).map_err(|e| CollectError::Map(name, e))
        }
        let mut c = Collector {
            stats: take(ebpf, MAP_STATS)?,
            inflight: take(ebpf, MAP_INFLIGHT)?,
            state: take(ebpf, MAP_AGENT_STATE)?,
            spill: take(ebpf, MAP_SPILL)?,
            spill_ledger: SpillLedger::default(),
            had_entry: HashSet::new(),
            prev: HashMap::new(),
            prev_inflight: HashMap::new(),
            inflight_ledger: InflightLedger::default(),
            cycle: 0,
            last_read_ns: monotonic_ns(),
        };
        // Baseline: whatever is already counted belongs to no cycle.
        c.collect()?;
        c.cycle = 0;
        c.start_epoch()?;
        Ok(c)
    }

    /// Peaks the programs record from now on belong to the next cycle.
    fn start_epoch(&mut self) -> Result<(), CollectError> {
        self.state
            .set(STATE_EPOCH, self.cycle + 1, 0)
            .map_err(|e| CollectError::Map(MAP_AGENT_STATE, e))
    }

    /// Reads and diffs all maps into the next cycle's snapshot.
    pub fn collect(&mut self) -> Result<Snapshot, CollectError> {
        let now_ns = monotonic_ns();
        let interval_ns = now_ns.saturating_sub(self.last_read_ns).max(1);
        self.last_read_ns = now_ns;
        self.cycle += 1;

        let keys: Vec<IoKey> = self.stats.keys().filter_map(Result::ok).collect();
        let mut totals: HashMap<IoKey, Box<IoStats>> = HashMap::with_capacity(keys.len());
        for key in keys {
            let values = match self.stats.get(&key, 0) {
                Ok(v) => v,
                Err(aya::maps::MapError::KeyNotFound) => continue,
                Err(e) => return Err(CollectError::Map(MAP_STATS, e)),
            };
            let mut now = Box::new(IoStats::ZERO);
            for v in values.iter() {
                accumulate(&mut now, v);
            }
            totals.insert(key, now);
        }
        let had_entry: HashSet<IoKey> = totals.keys().copied().collect();
        let unsampled = self.state.get(&STATE_UNSAMPLED, 0).unwrap_or(0);
        let slots = if self.spill_ledger.needs_read(unsampled) {
            Some(self.owned_spill_slots()?)
        } else {
            None
        };
        let (adds, free) = self
            .spill_ledger
            .fold(slots.as_deref(), &self.had_entry, unsampled);
        self.free_spill_slots(&free)?;
        self.had_entry = had_entry;
        for (key, c) in adds {
            let now = totals.entry(key).or_insert_with(|| Box::new(IoStats::ZERO));
            now.ios = now.ios.wrapping_add(c.ios);
            now.bytes = now.bytes.wrapping_add(c.bytes);
        }

        let mut deltas = Vec::with_capacity(totals.len());
        let mut seen = HashSet::with_capacity(totals.len());
        for (key, now) in totals {
            let prev = self.prev.get(&key).map_or(&IoStats::ZERO, |p| &**p);
            deltas.push(diff(key, &now, prev));
            self.prev.insert(key, now);
            seen.insert(key);
        }
        // Keys removed from the maps (by forget()) drop their baseline too.
        self.prev.retain(|k, _| seen.contains(k));

        // Peaks: the programs restart a key's peak at its first issue in a new epoch.
        let epoch = self.cycle;
        let inflight: HashMap<IoKey, Inflight> =
            self.inflight.iter().filter_map(Result::ok).collect();
        self.start_epoch()?;
        for key in inflight.keys() {
            if !seen.contains(key) {
                // In flight but nothing completed or queued yet: still worth reporting.
                deltas.push(KeyDelta {
                    key: *key,
                    ..Default::default()
                });
            }
        }
        // Idle: no issue (the programs stamp the epoch at a key's first issue in a cycle)
        // and no completion.
        let idle = |d: &KeyDelta, v: &Inflight| !d.had_requests() && v.epoch != epoch;
        let mut suspects: HashMap<u32, Vec<(IoKey, i64)>> = HashMap::new();
        for d in &deltas {
            let v = inflight.get(&d.key).copied().unwrap_or_default();
            if self.inflight_ledger.suspect(d.key, v.count, idle(d, &v)) {
                suspects
                    .entry(d.key.dev)
                    .or_default()
                    .push((d.key, v.count));
            }
        }
        let quiet: HashSet<IoKey> = suspects
            .iter()
            .filter(|(dev, keys)| self.disk_quiet_around(**dev, keys))
            .flat_map(|(_, keys)| keys.iter().map(|(k, _)| *k))
            .collect();
        let mut ends = HashMap::with_capacity(inflight.len());
        let mut inflight_resets = Vec::new();
        for d in &mut deltas {
            let v = inflight.get(&d.key).copied().unwrap_or_default();
            let end = self.inflight_ledger.end_cycle(
                d.key,
                v.count,
                idle(d, &v),
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
            if v.epoch == epoch {
                peak = peak.max(v.peak - end.offset);
            }
            d.inflight_now = now as u64;
            d.inflight_peak = peak.max(0) as u64;
            d.untraced_completions = end.untraced as u64;
            ends.insert(d.key, now);
        }
        self.prev_inflight = ends;
        deltas.sort_by_key(|d| d.key);

        Ok(Snapshot {
            cycle: self.cycle,
            interval_ns,
            deltas,
            preexisting_completions: self.state.get(&STATE_PREEXISTING, 0).unwrap_or(0),
            map_full: self.state.get(&STATE_MAP_FULL, 0).unwrap_or(0),
            unsampled,
            need_insert: self.state.get(&STATE_NEED_INSERT, 0).unwrap_or(0) != 0,
            issue_map_timing: self.state.get(&STATE_FALLBACK_ANY, 0).unwrap_or(0) != 0,
            inflight_resets,
            untraced_completions: self.inflight_ledger.untraced_total(),
        })
    }

    /// Whether `dev` had no request in flight, by the kernel's own accounting, from before
    /// to after a re-read of the suspects' counts, and the counts did not move: then what
    /// they hold completed unseen.
    fn disk_quiet_around(&self, dev: u32, suspects: &[(IoKey, i64)]) -> bool {
        if !DiskStat::accounted(dev) {
            return false;
        }
        let Some(before) = DiskStat::read(dev) else {
            return false;
        };
        if before.in_flight != 0 {
            return false;
        }
        let unchanged = suspects
            .iter()
            .all(|(k, c)| self.inflight.get(k, 0).is_ok_and(|v| v.count == *c));
        let Some(after) = DiskStat::read(dev) else {
            return false;
        };
        unchanged && after.in_flight == 0 && after.completed == before.completed
    }

    /// The spill slots in use: (index, key, counts).
    fn owned_spill_slots(&self) -> Result<Vec<(u32, IoKey, SpillCounts)>, CollectError> {
        let mut owned = Vec::new();
        for idx in 0..self.spill.len() {
            let slot = self
                .spill
                .get(&idx, 0)
                .map_err(|e| CollectError::Map(MAP_SPILL, e))?;
            if slot.state == SPILL_OWNED {
                let counts = SpillCounts {
                    ios: slot.ios,
                    bytes: slot.bytes,
                };
                owned.push((idx, slot.key, counts));
            }
        }
        Ok(owned)
    }

    /// Frees spill slots the ledger has folded: no program writes them any more.
    fn free_spill_slots(&mut self, slots: &[u32]) -> Result<(), CollectError> {
        for &idx in slots {
            self.spill
                .set(idx, SpillSlot::default(), 0)
                .map_err(|e| CollectError::Map(MAP_SPILL, e))?;
        }
        Ok(())
    }

    /// Removes every key of `cgroup_id` from the maps (the cgroup no longer exists). The
    /// keys come from this cycle's read, which saw every key of both maps.
    pub fn forget_cgroup(&mut self, cgroup_id: u64) {
        let slots = self.spill_ledger.forget_cgroup(cgroup_id);
        if let Err(e) = self.free_spill_slots(&slots) {
            tracing::warn!("freeing spill slots of cgroup {cgroup_id}: {e}");
        }
        self.had_entry.retain(|k| k.cgroup_id != cgroup_id);
        let keys: Vec<IoKey> = self
            .prev
            .keys()
            .chain(self.prev_inflight.keys())
            .filter(|k| k.cgroup_id == cgroup_id)
            .copied()
            .collect();
        for k in keys {
            let _ = self.stats.remove(&k);
            let _ = self.inflight.remove(&k);
            self.prev.remove(&k);
            self.prev_inflight.remove(&k);
        }
        self.inflight_ledger.forget_cgroup(cgroup_id);
    }

    /// Number of keys currently held in the stats map.
    pub fn tracked_keys(&self) -> usize {
        self.prev.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diff_wraps_u32_histogram_counters() {
        let mut prev = Box::new(IoStats::ZERO);
        let mut now = Box::new(IoStats::ZERO);
        prev.lat_hist[7] = u32::MAX - 1;
        now.lat_hist[7] = 3; // wrapped: 5 new samples
        now.lat_hist[9] = 2;
        prev.ios = 10;
        now.ios = 17;
        let d = diff(IoKey::default(), &now, &prev);
        assert_eq!(d.lat_hist, vec![(7, 5), (9, 2)]);
        assert_eq!(d.ios, 7);
    }

    fn key(cgroup_id: u64) -> IoKey {
        IoKey {
            cgroup_id,
            dev: 8 << 20,
            op: 0,
        }
    }

    fn counts(ios: u64, bytes: u64) -> SpillCounts {
        SpillCounts { ios, bytes }
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

    #[test]
    fn spill_slots_stay_in_the_totals_after_they_are_freed() {
        let mut ledger = SpillLedger::default();
        let (a, b) = (key(1), key(2));
        assert!(!ledger.needs_read(0), "nothing spilled: no read");
        assert!(ledger.needs_read(3), "a new spill is read");

        // Cycle 1: a spilled on two CPUs, b on one; neither had an entry before.
        let slots = [
            (0, a, counts(2, 8192)),
            (16, a, counts(1, 4096)),
            (1, b, counts(1, 512)),
        ];
        let (adds, free) = ledger.fold(Some(&slots), &HashSet::new(), 3);
        assert_eq!(adds[&a], counts(3, 12288));
        assert_eq!(adds[&b], counts(1, 512));
        assert!(
            free.is_empty(),
            "no key had an entry a cycle ago: slots may still be written"
        );
        assert!(ledger.needs_read(3), "owned slots are read every cycle");

        // Cycle 2: a has had an entry since cycle 1, b has not; b's slot grew.
        let had_entry = HashSet::from([a]);
        let slots = [
            (0, a, counts(2, 8192)),
            (16, a, counts(1, 4096)),
            (1, b, counts(2, 1024)),
        ];
        let (adds, mut free) = ledger.fold(Some(&slots), &had_entry, 3);
        free.sort();
        assert_eq!(free, vec![0, 16]);
        assert_eq!(adds[&a], counts(3, 12288), "cumulative, not counted twice");
        assert_eq!(adds[&b], counts(2, 1024));

        // Cycle 3: a's slots are free, their counts carried; b's slot is still read.
        let slots = [(1, b, counts(2, 1024))];
        let (adds, free) = ledger.fold(Some(&slots), &had_entry, 3);
        assert_eq!(adds[&a], counts(3, 12288));
        assert!(free.is_empty());

        // b's cgroup goes: its slot is freed, and a quiet ledger stops reading.
        assert_eq!(ledger.forget_cgroup(2), vec![1]);
        assert!(!ledger.needs_read(3));
        let (adds, free) = ledger.fold(None, &had_entry, 3);
        assert_eq!(adds.get(&b), None);
        assert_eq!(
            adds[&a],
            counts(3, 12288),
            "the carry counts without a read"
        );
        assert!(free.is_empty());
        assert!(ledger.forget_cgroup(1).is_empty());
        assert_eq!(ledger.fold(None, &had_entry, 3).0.len(), 0);
    }
}
