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

/// The throttle slice on rotational disks, and on every disk of most kernels.
pub const SLICE_ROTATIONAL: Duration = Duration::from_millis(100);
/// The shortest slice a kernel uses (non-rotational disks, 6.9 and later).
pub const SLICE_NON_ROTATIONAL: Duration = Duration::from_millis(20);
/// The most a limit's write is held back for a spread: a few jiffies at HZ 100-1000 (at HZ
/// 250, 4 ms apart gave most of the gain, 13 ms all of it).
const MAX_GAP: Duration = Duration::from_millis(20);

/// The instant each capped cgroup's limit was last written, per device.
#[derive(Debug)]
pub struct SlicePhases {
    epoch: Instant,
    written: HashMap<u32, HashMap<u64, Instant>>,
}

impl SlicePhases {
    pub fn new(epoch: Instant) -> SlicePhases {
        SlicePhases {
            epoch,
            written: HashMap::new(),
        }
    }

    /// How long to wait from `now` before writing a limit on cgroup `ino` on `dev`, whose
    /// throttle slice is `slice`: until the first instant whose phase is at least a gap away
    /// from every other capped cgroup's there. The gap is [`MAX_GAP`], or less where that
    /// many cgroups leave no room: with k others, a gap of slice / 2(k+1) always leaves some.
    pub fn wait(&self, dev: u32, ino: u64, now: Instant, slice: Duration) -> Duration {
        let slice_ns = slice.as_nanos().max(1);
        let phase = |t: Instant| t.saturating_duration_since(self.epoch).as_nanos() % slice_ns;
        let others: Vec<u128> = self
            .written
            .get(&dev)
            .into_iter()
            .flatten()
            .filter(|(&other, _)| other != ino)
            .map(|(_, &t)| phase(t))
            .collect();
        if others.is_empty() {
            return Duration::ZERO;
        }
        let gap = MAX_GAP
            .as_nanos()
            .min(slice_ns / (2 * (others.len() as u128 + 1)));
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
        for m in self.written.values_mut() {
            m.retain(|ino, _| !inos.contains(ino));
        }
    }

    /// `ino` holds a limit on `dev` written at `at` (None: it holds none now).
    pub fn record(&mut self, dev: u32, ino: u64, at: Option<Instant>) {
        match at {
            Some(at) => {
                self.written.entry(dev).or_default().insert(ino, at);
            }
            None => {
                if let Some(m) = self.written.get_mut(&dev) {
                    m.remove(&ino);
                }
            }
        }
    }
}

/// The throttle slice of a disk by its sysfs `queue/rotational` ("1" or "0"); unknown is
/// taken as rotational (the kernels' default slice).
pub fn slice_of(rotational: Option<bool>) -> Duration {
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

    #[test]
    fn the_first_limit_on_a_device_is_written_at_once() {
        let t0 = Instant::now();
        let p = SlicePhases::new(t0);
        assert_eq!(
            p.wait(1, 10, t0 + 1234 * MS, SLICE_ROTATIONAL),
            Duration::ZERO
        );
    }

    #[test]
    fn a_second_limit_a_whole_number_of_seconds_later_waits_out_the_gap() {
        let t0 = Instant::now();
        let mut p = SlicePhases::new(t0);
        p.record(1, 10, Some(t0 + 1000 * MS));
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
        p.record(1, 10, Some(t0));
        assert_eq!(
            p.wait(1, 11, t0 + 1050 * MS, SLICE_ROTATIONAL),
            Duration::ZERO
        );
        // Just before the other's phase comes round again: too close, wait past it.
        let w = p.wait(1, 11, t0 + 1090 * MS, SLICE_ROTATIONAL);
        assert_eq!(w, 30 * MS);
    }

    #[test]
    fn rewriting_a_cgroups_own_limit_ignores_its_own_phase() {
        let t0 = Instant::now();
        let mut p = SlicePhases::new(t0);
        p.record(1, 10, Some(t0));
        assert_eq!(
            p.wait(1, 10, t0 + 2000 * MS, SLICE_ROTATIONAL),
            Duration::ZERO
        );
    }

    #[test]
    fn other_devices_and_lifted_limits_do_not_count() {
        let t0 = Instant::now();
        let mut p = SlicePhases::new(t0);
        p.record(2, 10, Some(t0));
        p.record(1, 12, Some(t0));
        p.record(1, 12, None);
        assert_eq!(
            p.wait(1, 11, t0 + 1000 * MS, SLICE_ROTATIONAL),
            Duration::ZERO
        );
    }

    #[test]
    fn many_cgroups_get_phases_a_gap_apart_within_one_slice_each() {
        let t0 = Instant::now();
        for slice in [SLICE_ROTATIONAL, SLICE_NON_ROTATIONAL] {
            let mut p = SlicePhases::new(t0);
            let mut now = t0 + 5000 * MS;
            for ino in 0..8u64 {
                let w = p.wait(1, ino, now, slice);
                assert!(w < slice, "{ino}: waited {w:?} of a {slice:?} slice");
                now += w;
                p.record(1, ino, Some(now));
                // The next decision comes a whole cycle later: the same phase.
                now += 1000 * MS;
            }
            let mut phases: Vec<u128> = p.written[&1]
                .values()
                .map(|&t| (t - t0).as_nanos() % slice.as_nanos())
                .collect();
            phases.sort_unstable();
            let gaps: Vec<u128> = phases
                .windows(2)
                .map(|w| w[1] - w[0])
                .chain(std::iter::once(
                    phases[0] + slice.as_nanos() - phases[phases.len() - 1],
                ))
                .collect();
            let least = *gaps.iter().min().unwrap();
            assert!(
                least * 16 >= slice.as_nanos(),
                "{slice:?}: phases {phases:?} leave a gap of {least} ns"
            );
        }
    }

    #[test]
    fn a_cgroup_that_left_is_no_constraint() {
        let t0 = Instant::now();
        let mut p = SlicePhases::new(t0);
        p.record(1, 10, Some(t0));
        p.record(2, 10, Some(t0));
        p.forget(&[10].into_iter().collect());
        assert_eq!(
            p.wait(1, 11, t0 + 1000 * MS, SLICE_ROTATIONAL),
            Duration::ZERO
        );
        assert_eq!(
            p.wait(2, 11, t0 + 1000 * MS, SLICE_ROTATIONAL),
            Duration::ZERO
        );
    }

    #[test]
    fn the_slice_follows_the_disks_kind() {
        assert_eq!(slice_of(Some(true)), SLICE_ROTATIONAL);
        assert_eq!(slice_of(Some(false)), SLICE_NON_ROTATIONAL);
        assert_eq!(slice_of(None), SLICE_ROTATIONAL);
    }
}
