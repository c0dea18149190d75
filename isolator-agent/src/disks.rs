//! Whole disks as the agent reports them: their kernel names and how busy they were.

use std::collections::HashMap;

use isolator_common::{dev_major, dev_minor};

/// Names disks by dev_t from /sys/dev/block.
#[derive(Default)]
pub struct DiskNames(HashMap<u32, Option<String>>);

impl DiskNames {
    pub fn name(&mut self, dev: u32) -> Option<String> {
        self.0
            .entry(dev)
            .or_insert_with(|| {
                let link = format!("/sys/dev/block/{}:{}", dev_major(dev), dev_minor(dev));
                std::fs::read_link(link)
                    .ok()
                    .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            })
            .clone()
    }
}

/// Per-disk busy time from /sys/dev/block/M:m/stat (io_ticks, ms), as the fraction of a
/// cycle the disk had requests in flight.
#[derive(Default)]
pub struct DiskBusy {
    /// dev -> (io_ticks at the last sample, cycle of that sample).
    last: HashMap<u32, (u64, u64)>,
}

impl DiskBusy {
    /// The disk's utilization over `cycle` (0 on its first sample); asked once per disk
    /// and cycle.
    pub fn utilization(&mut self, dev: u32, cycle: u64, interval_s: f64) -> f64 {
        let path = format!("/sys/dev/block/{}:{}/stat", dev_major(dev), dev_minor(dev));
        let Some(ticks) = std::fs::read_to_string(path).ok().and_then(|t| {
            t.split_whitespace()
                .nth(9)
                .and_then(|v| v.parse::<u64>().ok())
        }) else {
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
