//! Whole disks as the agent reports them: their kernel names and how busy they were.

use std::collections::{BTreeMap, HashMap};

use isolator_common::{dev_major, dev_minor, kernel_dev};

/// A disk as events and the kernel's files name it: `major:minor`.
pub fn dev_text(dev: u32) -> String {
    format!("{}:{}", dev_major(dev), dev_minor(dev))
}

/// The whole disk a name (`vda`, under /sys/class/block) or `major:minor` names, as its
/// dev_t; an error says why not and what to give instead.
pub fn whole_disk(name: &str) -> Result<u32, String> {
    let dir = if name.contains(':') {
        std::path::PathBuf::from(format!("/sys/dev/block/{name}"))
    } else {
        std::path::PathBuf::from(format!("/sys/class/block/{name}"))
    };
    let text = std::fs::read_to_string(dir.join("dev")).map_err(|_| {
        format!("disk {name} does not exist ({} has no dev); give a block device name or major:minor that lsblk lists", dir.display())
    })?;
    let dev = parse_dev(&text).ok_or_else(|| {
        format!(
            "{}: {:?} is not major:minor",
            dir.join("dev").display(),
            text.trim()
        )
    })?;
    if dir.join("partition").exists() {
        return Err(format!(
            "{name} is a partition; iocost goes on whole disks: give the disk it is on"
        ));
    }
    Ok(dev)
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

    /// Completed requests of every kind.
    pub fn completed_total(&self) -> u64 {
        self.completed.iter().sum()
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
    /// Baselines every disk of [`whole_disk_stats`] at cycle 0, so a disk's first busy cycle
    /// has a utilization (a disk first seen later reads 0 for its first cycle).
    pub fn at_start(stats: &[(u32, DiskStat)]) -> DiskBusy {
        DiskBusy {
            last: stats
                .iter()
                .map(|(dev, stat)| (*dev, (stat.io_ticks_ms, 0)))
                .collect(),
        }
    }

    /// The disk's utilization over `cycle` (0 on its first sample); asked once per disk
    /// and cycle. `stat` is a read of this cycle already made (see
    /// [`DiskCoverage::stat_before_maps`]); without one the disk is read here.
    pub fn utilization(
        &mut self,
        dev: u32,
        cycle: u64,
        interval_s: f64,
        stat: Option<DiskStat>,
    ) -> f64 {
        let Some(ticks) = stat.or_else(|| DiskStat::read(dev)).map(|s| s.io_ticks_ms) else {
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

/// Requests a disk completed, by its own statistics, that the programs never saw complete.
///
/// Some kernels complete a few requests without running the block tracepoints for them (on
/// the test machine's 6.18, about 1 in 2,000 virtio and loop requests, sometimes a few
/// dozen in a row, bpftrace's programs missing them too, with no recursion miss): their
/// bytes and latencies cannot be in any cgroup's numbers, and only the disk's counters
/// know. This says how many, so an operator can tell a short count from a quiet cgroup.
///
/// A lower bound: the disk's counts are read just before the programs' maps, so what
/// completes between the two reads is traced this cycle and counted by the disk the next;
/// requests the disk does not count (passthrough, the data part of a flush sequence) but
/// the programs do only lower it further.
#[derive(Default)]
pub struct DiskCoverage {
    disks: HashMap<u32, Coverage>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Coverage {
    /// The disk's completed requests when it was first counted.
    baseline: u64,
    /// Its statistics read just before this cycle's maps, if read.
    before_maps: Option<DiskStat>,
    /// Completions the programs saw on it since the baseline.
    traced: u64,
    /// Highest `completed - baseline - traced` yet.
    unseen: u64,
}

impl Coverage {
    fn step(&mut self, traced: u64) -> u64 {
        self.traced += traced;
        if let Some(stat) = &self.before_maps {
            let unseen = stat
                .completed_total()
                .saturating_sub(self.baseline)
                .saturating_sub(self.traced);
            self.unseen = self.unseen.max(unseen);
        }
        self.unseen
    }
}

impl DiskCoverage {
    /// Baselines every disk of [`whole_disk_stats`] that counts its requests (asked once
    /// here, not every cycle): the stats must be read right after the programs' maps are
    /// baselined, so nothing completed in between is taken for unseen.
    pub fn at_start(stats: &[(u32, DiskStat)]) -> DiskCoverage {
        let disks = stats
            .iter()
            .filter(|(dev, _)| DiskStat::accounted(*dev))
            .map(|(dev, stat)| {
                let c = Coverage {
                    baseline: stat.completed_total(),
                    ..Default::default()
                };
                (*dev, c)
            })
            .collect();
        DiskCoverage { disks }
    }

    /// Reads the disks that had traffic: just before the maps are read.
    pub fn before_maps(&mut self) {
        for (dev, c) in self.disks.iter_mut() {
            c.before_maps = if c.traced > 0 {
                DiskStat::read(*dev)
            } else {
                None
            };
        }
    }

    /// This cycle's read of the disk before the maps, for the other figures of the disk.
    pub fn stat_before_maps(&self, dev: u32) -> Option<DiskStat> {
        self.disks.get(&dev).and_then(|c| c.before_maps)
    }

    /// After the maps: each disk's completions the programs saw this cycle (`traced`).
    /// Returns the unseen completions so far of the disks with traffic this cycle, by the
    /// programs or by the disk's own count (None where the disk does not count its
    /// requests). A disk first seen now starts here: what it completed before is not
    /// compared.
    pub fn after_maps(&mut self, traced: &BTreeMap<u32, u64>) -> BTreeMap<u32, Option<u64>> {
        let mut out = BTreeMap::new();
        for (&dev, c) in self.disks.iter_mut() {
            let n = traced.get(&dev).copied().unwrap_or(0);
            let before = c.unseen;
            if c.before_maps.is_none() && n == 0 {
                continue;
            }
            let unseen = c.step(n);
            if n > 0 || unseen != before {
                out.insert(dev, Some(unseen));
            }
        }
        let new: Vec<u32> = traced
            .keys()
            .filter(|d| !self.disks.contains_key(d))
            .copied()
            .collect();
        for dev in new {
            let baseline = DiskStat::accounted(dev)
                .then(|| DiskStat::read(dev))
                .flatten()
                .map(|s| s.completed_total());
            if let Some(baseline) = baseline {
                let c = Coverage {
                    baseline,
                    ..Default::default()
                };
                self.disks.insert(dev, c);
            }
            out.insert(dev, baseline.map(|_| 0));
        }
        out
    }
}

/// Every whole disk in /sys/block with its statistics: read once at start for both
/// [`DiskBusy`] and [`DiskCoverage`].
pub fn whole_disk_stats() -> Vec<(u32, DiskStat)> {
    std::fs::read_dir("/sys/block")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|d| {
            let dev = parse_dev(&std::fs::read_to_string(d.path().join("dev")).ok()?)?;
            Some((dev, DiskStat::read(dev)?))
        })
        .collect()
}

/// "MAJ:MIN" as in /sys/block/*/dev.
fn parse_dev(text: &str) -> Option<u32> {
    let (major, minor) = text.trim().split_once(':')?;
    Some(kernel_dev(major.parse().ok()?, minor.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::{parse_dev, Coverage, DiskStat};

    fn stat(completed: u64) -> Option<DiskStat> {
        Some(DiskStat {
            completed: [completed, 0, 0, 0],
            in_flight: 0,
            io_ticks_ms: 0,
        })
    }

    #[test]
    fn unseen_completions_are_what_the_disk_counted_beyond_the_programs() {
        let mut c = Coverage {
            baseline: 1_000,
            ..Default::default()
        };
        // The disk's count read before the maps; the maps may hold completions after it.
        c.before_maps = stat(1_100);
        assert_eq!(c.step(100), 0);
        c.before_maps = stat(1_150);
        assert_eq!(
            c.step(52),
            0,
            "completions traced after the disk's read are no loss"
        );
        c.before_maps = stat(1_300);
        assert_eq!(c.step(140), 8);
        // A cycle without a read of the disk only counts what was traced.
        c.before_maps = None;
        assert_eq!(c.step(5), 8);
        c.before_maps = stat(1_302);
        assert_eq!(c.step(0), 8, "never lower than a loss already seen");
        c.before_maps = stat(1_390);
        assert_eq!(c.step(85), 8);
        c.before_maps = stat(1_500);
        assert_eq!(c.step(90), 28);
    }

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
