//! When to write a throttle limit: the cgroups capped on one device get their blk-throttle
//! slices out of phase.
//!
//! Why: writing a limit restarts the cgroup's throttle slice (`tg_conf_updated`), and a
//! backlogged cgroup keeps that slice's phase, extending it a slice at a time. Two capped
//! cgroups whose slices start in the same jiffy are released in the same dispatch rounds,
//! and the dispatch work submits their bios interleaved (it takes one from each group in
//! turn) under one plug, which merges a bio only into the last request: every 1 MiB bio
//! becomes its own request. Out of phase, each round holds one group's consecutive bios,
//! which merge up to the disk's request size. Measured on the test disk (two O_DIRECT
//! writers capped at 100 and 60 MB/s, `blkio.throttle` v1, HZ 250, a 100 ms slice): limits
//! written in one instant gave 105-115 requests/s of 1.4 MB; the same limits written again
//! 13 or 50 ms apart gave 50 requests/s of 3.1 MB, 4 ms apart 60, 100 ms apart (in phase
//! again) 112; and a reader next to them waits behind requests, not bytes. The agent writes
//! its limits at cycle boundaries, a whole number of seconds apart, that is in phase, so
//! without this every pair of writers it capped ran in small requests.
//!
//! The slice is 100 ms (HZ/10) on most kernels; kernels from 6.9 until its later removal
//! use 20 ms on non-rotational disks, so phases are spread within 20 ms there (a spread
//! within 20 ms is one within 100 ms too). No kernel interface exposes the slice or its
//! phase, so the phase is the instant the agent wrote the limit: a cgroup whose queue ran
//! empty since starts its next slice with its next bio, wherever that falls.

use std::{
    collections::{HashMap, HashSet},
    time::{Duration, Instant},
};

use crate::policy::Knob;

/// The throttle slice on rotational disks, and on every disk of most kernels.
const SLICE_ROTATIONAL: Duration = Duration::from_millis(100);
/// The shortest slice a kernel uses (non-rotational disks, 6.9 and later).
const SLICE_NON_ROTATIONAL: Duration = Duration::from_millis(20);
/// The widest spacing sought between two cgroups' phases: a few jiffies at HZ 100-1000 (at
/// HZ 250, 4 ms apart gave most of the gain, 13 ms all of it). A write may still wait up to
/// a slice for a phase that far from every other.
const MAX_GAP: Duration = Duration::from_millis(20);
/// The narrowest: under a jiffy at HZ 250 two writes may fall in one tick. Where this many
/// cgroups leave no phase this far from every other, the limit is written at once.
const MIN_GAP: Duration = Duration::from_millis(5);

/// Waiting for phases is bounded per this window, not per write or decision: at most one
/// slice of it a second (the shortest cycle), however many limits a cycle changes, so the
/// cycle that writes them stays well inside its second.
const WAIT_WINDOW: Duration = Duration::from_secs(1);

/// What one cgroup holds on one device: the limits (a bit per [`Knob`]) and when the last
/// write to any of them restarted its slice (a write that lifts one restarts it too).
#[derive(Debug, Clone, Copy)]
struct Held {
    at: Instant,
    knobs: u8,
}

fn bit(knob: Knob) -> u8 {
    1 << knob as u8
}

/// The instant each capped cgroup's limits were last written, per device.
#[derive(Debug)]
pub struct SlicePhases {
    epoch: Instant,
    held: HashMap<u32, HashMap<u64, Held>>,
    /// Each device's slice, looked up once.
    slices: HashMap<u32, Duration>,
    /// The start of the current [`WAIT_WINDOW`] and what was waited in it.
    waited: (Instant, Duration),
}

impl SlicePhases {
    pub fn new(epoch: Instant) -> SlicePhases {
        SlicePhases {
            epoch,
            held: HashMap::new(),
            slices: HashMap::new(),
            waited: (epoch, Duration::ZERO),
        }
    }

    /// When to write `knob` on cgroup `ino` on `dev` (`capped`: a limit, not a lift), from
    /// `now`: None when its phase does not matter, else `now` plus [`Self::wait`], or `now`
    /// itself once this window's waiting has reached a slice. `rotational` says the disk's
    /// kind, asked once per device.
    pub fn plan(
        &mut self,
        (dev, ino): (u32, u64),
        (knob, capped): (Knob, bool),
        now: Instant,
        rotational: impl FnOnce() -> Option<bool>,
    ) -> Option<Instant> {
        if !self.matters(dev, ino, knob, capped) {
            return None;
        }
        let slice = *self
            .slices
            .entry(dev)
            .or_insert_with(|| slice_of(rotational()));
        let wait = self.wait(dev, ino, now, slice);
        if now.saturating_duration_since(self.waited.0) >= WAIT_WINDOW {
            self.waited = (now, Duration::ZERO);
        }
        if self.waited.1 + wait > slice {
            return Some(now);
        }
        self.waited.1 += wait;
        Some(now + wait)
    }

    /// Whether a write of `knob` on cgroup `ino` (`capped`: a limit, not a lift) leaves it
    /// throttled on `dev`: then its slice's phase matters.
    fn matters(&self, dev: u32, ino: u64, knob: Knob, capped: bool) -> bool {
        capped
            || self
                .held
                .get(&dev)
                .and_then(|m| m.get(&ino))
                .is_some_and(|h| h.knobs & !bit(knob) != 0)
    }

    /// How long to wait from `now` before writing a limit on cgroup `ino` on `dev`, whose
    /// throttle slice is `slice` (always under `slice`): until the first instant whose phase
    /// is at least a gap away from every other throttled cgroup's there. The gap is
    /// [`MAX_GAP`], or less where that many cgroups leave no room (with k others, a gap of
    /// slice / 2(k+1) always leaves some), but not under [`MIN_GAP`]: no wait when no
    /// phase is that clear.
    fn wait(&self, dev: u32, ino: u64, now: Instant, slice: Duration) -> Duration {
        let slice_ns = slice.as_nanos().max(1);
        let phase = |t: Instant| t.saturating_duration_since(self.epoch).as_nanos() % slice_ns;
        let others: Vec<u128> = self
            .held
            .get(&dev)
            .into_iter()
            .flatten()
            .filter(|(&other, _)| other != ino)
            .map(|(_, h)| phase(h.at))
            .collect();
        if others.is_empty() {
            return Duration::ZERO;
        }
        let gap = MAX_GAP
            .as_nanos()
            .min(slice_ns / (2 * (others.len() as u128 + 1)))
            .max(MIN_GAP.as_nanos());
        let distance = |a: u128, b: u128| {
            let d = a.abs_diff(b);
            d.min(slice_ns - d)
        };
        let clear = |p: u128| others.iter().all(|&o| distance(p, o) >= gap);
        let now_phase = phase(now);
        // The earliest clear phase is now's, or where some other's excluded arc ends.
        let waits = std::iter::once(0).chain(
            others
                .iter()
                .map(|&o| ((o + gap) % slice_ns + slice_ns - now_phase) % slice_ns),
        );
        let wait_ns = waits
            .filter(|&w| clear((now_phase + w) % slice_ns))
            .min()
            .unwrap_or(0);
        Duration::from_nanos(wait_ns as u64)
    }

    /// Cgroups that left their services: their limits are put back, their phases no
    /// constraint.
    pub fn forget(&mut self, inos: &HashSet<u64>) {
        for m in self.held.values_mut() {
            m.retain(|ino, _| !inos.contains(ino));
        }
    }

    /// `knob` on cgroup `ino` on `dev` was written at `at`: a limit (`capped`) or a lift. A
    /// cgroup left with no limit there is no constraint any more.
    pub fn record(&mut self, dev: u32, ino: u64, knob: Knob, capped: bool, at: Instant) {
        let m = self.held.entry(dev).or_default();
        let knobs = m.get(&ino).map_or(0, |h| h.knobs);
        let knobs = if capped {
            knobs | bit(knob)
        } else {
            knobs & !bit(knob)
        };
        if knobs == 0 {
            m.remove(&ino);
        } else {
            m.insert(ino, Held { at, knobs });
        }
    }
}

/// The throttle slice of a disk by its sysfs `queue/rotational` ("1" or "0"); unknown is
/// taken as rotational (the kernels' default slice).
fn slice_of(rotational: Option<bool>) -> Duration {
    match rotational {
        Some(false) => SLICE_NON_ROTATIONAL,
        _ => SLICE_ROTATIONAL,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn phase_ms(p: &SlicePhases, t: Instant, slice: Duration) -> u128 {
        (t - p.epoch).as_nanos() % slice.as_nanos() / MS.as_nanos()
    }

    /// Whether a limit on `ino` on `dev` at `now` goes without waiting.
    fn at_once(p: &SlicePhases, (dev, ino): (u32, u64), now: Instant, slice: Duration) -> bool {
        p.wait(dev, ino, now, slice) == Duration::ZERO
    }

    #[test]
    fn the_first_limit_on_a_device_is_written_at_once() {
        let t0 = Instant::now();
        let p = SlicePhases::new(t0);
        assert!(at_once(&p, (1, 10), t0 + 1234 * MS, SLICE_ROTATIONAL));
    }

    #[test]
    fn a_second_limit_a_whole_number_of_seconds_later_waits_out_the_gap() {
        let t0 = Instant::now();
        let mut p = SlicePhases::new(t0);
        p.record(1, 10, Knob::Wbps, true, t0 + 1000 * MS);
        // Cycles a second apart land in the same phase of a 100 ms slice.
        let now = t0 + 3000 * MS;
        let w = p.wait(1, 11, now, SLICE_ROTATIONAL);
        assert_eq!(w, MAX_GAP);
        assert_eq!(phase_ms(&p, now + w, SLICE_ROTATIONAL), 20);
    }

    #[test]
    fn a_limit_already_out_of_phase_is_written_at_once() {
        let t0 = Instant::now();
        let mut p = SlicePhases::new(t0);
        p.record(1, 10, Knob::Wbps, true, t0);
        assert!(at_once(&p, (1, 11), t0 + 1050 * MS, SLICE_ROTATIONAL));
        // Just before the other's phase comes round again: too close, wait past it.
        let w = p.wait(1, 11, t0 + 1090 * MS, SLICE_ROTATIONAL);
        assert_eq!(w, 30 * MS);
    }

    #[test]
    fn rewriting_a_cgroups_own_limit_ignores_its_own_phase() {
        let t0 = Instant::now();
        let mut p = SlicePhases::new(t0);
        p.record(1, 10, Knob::Wbps, true, t0);
        assert!(at_once(&p, (1, 10), t0 + 2000 * MS, SLICE_ROTATIONAL));
    }

    #[test]
    fn other_devices_and_lifted_limits_do_not_count() {
        let t0 = Instant::now();
        let mut p = SlicePhases::new(t0);
        p.record(2, 10, Knob::Wbps, true, t0);
        p.record(1, 12, Knob::Wbps, true, t0);
        p.record(1, 12, Knob::Wbps, false, t0 + 500 * MS);
        assert!(at_once(&p, (1, 11), t0 + 1000 * MS, SLICE_ROTATIONAL));
    }

    /// Places `n` cgroups' limits one cycle apart (the same phase each time, left alone) and
    /// returns the narrowest gap between their phases, in ns.
    fn narrowest_gap(slice: Duration, n: u64) -> u128 {
        let t0 = Instant::now();
        let mut p = SlicePhases::new(t0);
        let mut now = t0 + 5000 * MS;
        for ino in 0..n {
            now += p.wait(1, ino, now, slice);
            p.record(1, ino, Knob::Wbps, true, now);
            now += 1000 * MS;
        }
        let mut phases: Vec<u128> = p.held[&1]
            .values()
            .map(|h| (h.at - t0).as_nanos() % slice.as_nanos())
            .collect();
        phases.sort_unstable();
        phases
            .windows(2)
            .map(|w| w[1] - w[0])
            .chain(std::iter::once(
                phases[0] + slice.as_nanos() - phases[phases.len() - 1],
            ))
            .min()
            .unwrap()
    }

    #[test]
    fn cgroups_get_phases_a_gap_apart_as_far_as_the_slice_has_room() {
        // 100 ms, 8 cgroups: slice / 16 apart at least.
        assert!(narrowest_gap(SLICE_ROTATIONAL, 8) >= SLICE_ROTATIONAL.as_nanos() / 16);
        // 20 ms: two get the floor gap.
        assert!(narrowest_gap(SLICE_NON_ROTATIONAL, 2) >= MIN_GAP.as_nanos());
    }

    #[test]
    fn with_no_phase_clear_of_the_others_the_limit_is_written_at_once() {
        let t0 = Instant::now();
        let mut p = SlicePhases::new(t0);
        for (ino, ms) in [(1u64, 0u32), (2, 5), (3, 10), (4, 15)] {
            p.record(1, ino, Knob::Wbps, true, t0 + ms * MS);
        }
        assert!(at_once(&p, (1, 9), t0 + 1002 * MS, SLICE_NON_ROTATIONAL));
    }

    #[test]
    fn a_lift_matters_while_the_cgroup_keeps_another_limit_there() {
        let t0 = Instant::now();
        let mut p = SlicePhases::new(t0);
        p.record(1, 10, Knob::Wbps, true, t0);
        p.record(1, 10, Knob::Riops, true, t0 + 40 * MS);
        assert!(p.matters(1, 10, Knob::Wbps, false));
        // Lifting one restarts its slice: the new instant is its phase.
        p.record(1, 10, Knob::Wbps, false, t0 + 70 * MS);
        assert_eq!(p.held[&1][&10].at, t0 + 70 * MS);
        assert!(!p.matters(1, 10, Knob::Riops, false));
        assert!(p.matters(1, 10, Knob::Riops, true));
        p.record(1, 10, Knob::Riops, false, t0 + 90 * MS);
        assert!(!p.held[&1].contains_key(&10));
    }

    #[test]
    fn a_cgroup_that_left_is_no_constraint() {
        let t0 = Instant::now();
        let mut p = SlicePhases::new(t0);
        p.record(1, 10, Knob::Wbps, true, t0);
        p.record(2, 10, Knob::Wbps, true, t0);
        p.forget(&[10].into_iter().collect());
        assert!(at_once(&p, (1, 11), t0 + 1000 * MS, SLICE_ROTATIONAL));
        assert!(at_once(&p, (2, 11), t0 + 1000 * MS, SLICE_ROTATIONAL));
    }

    #[test]
    fn waiting_is_bounded_to_one_slice_a_second_and_lifts_alone_do_not_wait() {
        let t0 = Instant::now();
        let mut p = SlicePhases::new(t0);
        p.record(1, 10, Knob::Wbps, true, t0);
        let rot = || Some(true);
        // Twelve limits decided in one cycle, each in phase with the one before: each waits
        // for its gap...
        let mut at = t0 + 1000 * MS;
        let mut waits = vec![];
        for ino in 11..23u64 {
            let planned = p.plan((1, ino), (Knob::Wbps, true), at, rot).unwrap();
            waits.push(planned - at);
            p.record(1, ino, Knob::Wbps, true, planned);
            at = planned;
        }
        let total: Duration = waits.iter().sum();
        // ... until the cycle's waiting reaches one slice: the rest go at once.
        assert!(total <= SLICE_ROTATIONAL, "{waits:?}");
        assert!(waits.iter().any(|w| w.is_zero()), "{waits:?}");
        // The next second waits again.
        p.record(2, 50, Knob::Wbps, true, at);
        let next = p.plan((2, 51), (Knob::Wbps, true), at + 1000 * MS, rot);
        assert_eq!(next, Some(at + 1000 * MS + MAX_GAP));
        // A lift on a cgroup with no other limit there does not matter.
        assert_eq!(p.plan((1, 99), (Knob::Wbps, false), at, rot), None);
    }

    #[test]
    fn the_slice_follows_the_disks_kind() {
        assert_eq!(slice_of(Some(true)), SLICE_ROTATIONAL);
        assert_eq!(slice_of(Some(false)), SLICE_NON_ROTATIONAL);
        assert_eq!(slice_of(None), SLICE_ROTATIONAL);
    }
}
