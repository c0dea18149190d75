//! Whole disks as the agent reports them: their kernel names and how busy they were.

use std::collections::HashMap;

use isolator_common::{dev_major, dev_minor, kernel_dev};

/// A disk as events and the kernel's files name it: `major:minor`.
pub fn dev_text(dev: u32) -> String {
    format!("{}:{}", dev_major(dev), dev_minor(dev))
}

/// Names disks by dev_t from /sys/dev/block.
#[derive(Default)]
pub struct DiskNames(HashMap<u32, Option<String>>);

impl DiskNames {
    pub fn name(&mut self, dev: u32) -> Option<String> {
        self.0
            .entry(dev)
            .or_insert_with(|| {
                let link = format!("/sys/dev/block/{}", dev_text(dev));
                std::fs::read_link(link)
                    .ok()
                    .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            })
            .clone()
    }
}

/// One read of a disk's /sys/dev/block/M:m/stat (Documentation/block/stat.rst).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskStat {
    /// Completed requests: reads, writes, discards, flushes (the last two are absent on
    /// kernels before 4.18 and 5.5: 0).
    pub completed: [u64; 4],
    /// Requests the kernel counts in flight (started, not yet accounted done).
    pub in_flight: u64,
    /// Milliseconds with requests in flight.
    pub io_ticks_ms: u64,
}

impl DiskStat {
    pub fn read(dev: u32) -> Option<DiskStat> {
        let path = format!("/sys/dev/block/{}/stat", dev_text(dev));
        DiskStat::parse(&std::fs::read_to_string(path).ok()?)
    }

    fn parse(text: &str) -> Option<DiskStat> {
        let f: Vec<u64> = text
            .split_whitespace()
            .map(|v| v.parse().ok())
            .collect::<Option<_>>()?;
        let at = |i: usize| f.get(i).copied().unwrap_or(0);
        (f.len() >= 11).then(|| DiskStat {
            completed: [at(0), at(4), at(11), at(15)],
            in_flight: at(8),
            io_ticks_ms: at(9),
        })
    }

    /// Whether the kernel counts the disk's requests in this file at all
    /// (queue/iostats; the block layer skips accounting when it is 0).
    pub fn accounted(dev: u32) -> bool {
        let path = format!("/sys/dev/block/{}/queue/iostats", dev_text(dev));
        std::fs::read_to_string(path).is_ok_and(|v| v.trim() == "1")
    }
}

/// Per-disk busy time from the disk's stat (io_ticks), as the fraction of a cycle the disk
/// had requests in flight.
#[derive(Default)]
pub struct DiskBusy {
    /// dev -> (io_ticks at the last sample, cycle of that sample).
    last: HashMap<u32, (u64, u64)>,
}

impl DiskBusy {
    /// Baselines every disk in /sys/block at cycle 0, so a disk's first busy cycle has a
    /// utilization (a disk first seen later reads 0 for its first cycle).
    pub fn at_start() -> DiskBusy {
        let mut busy = DiskBusy::default();
        let disks = std::fs::read_dir("/sys/block")
            .into_iter()
            .flatten()
            .flatten();
        for d in disks {
            let Some(dev) = std::fs::read_to_string(d.path().join("dev"))
                .ok()
                .and_then(|t| parse_dev(&t))
            else {
                continue;
            };
            if let Some(stat) = DiskStat::read(dev) {
                busy.last.insert(dev, (stat.io_ticks_ms, 0));
            }
        }
        busy
    }

    /// The disk's utilization over `cycle` (0 on its first sample); asked once per disk
    /// and cycle.
    pub fn utilization(&mut self, dev: u32, cycle: u64, interval_s: f64) -> f64 {
        let Some(ticks) = DiskStat::read(dev).map(|s| s.io_ticks_ms) else {
            return 0.0;
        };
        match self.last.insert(dev, (ticks, cycle)) {
            // A disk idle for some cycles was not sampled: its ticks span them all.
            Some((p, c)) if interval_s > 0.0 => {
                let cycles = cycle.saturating_sub(c).max(1) as f64;
                (ticks.saturating_sub(p) as f64 / 1000.0 / (interval_s * cycles)).min(1.0)
            }
            _ => 0.0,
        }
    }
}

/// "MAJ:MIN" as in /sys/block/*/dev.
fn parse_dev(text: &str) -> Option<u32> {
    let (major, minor) = text.trim().split_once(':')?;
    Some(kernel_dev(major.parse().ok()?, minor.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::{parse_dev, DiskStat};

    #[test]
    fn dev_numbers_from_sysfs() {
        assert_eq!(
            parse_dev("254:0\n"),
            Some(isolator_common::kernel_dev(254, 0))
        );
        assert_eq!(parse_dev("7:3"), Some((7 << 20) | 3));
        assert_eq!(parse_dev("7"), None);
        assert_eq!(parse_dev("a:b"), None);
    }

    #[test]
    fn stat_fields_by_kernel_generation() {
        // 6.x: 17 fields.
        let s = DiskStat::parse(
            "  14379  0 14721024  6794  12  3  120  40  1  7210  6834  5  0  80  2  9  4\n",
        )
        .unwrap();
        assert_eq!(s.completed, [14379, 12, 5, 9]);
        assert_eq!((s.in_flight, s.io_ticks_ms), (1, 7210));
        // 4.x before discard fields: 11.
        let s = DiskStat::parse("1 0 8 0 2 0 16 0 0 3 0").unwrap();
        assert_eq!(s.completed, [1, 2, 0, 0]);
        assert!(DiskStat::parse("1 2 3").is_none());
        assert!(DiskStat::parse("1 x 3 4 5 6 7 8 9 10 11").is_none());
    }
}
