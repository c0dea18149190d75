//! One cgroup knob (a per-device io.max / blkio.throttle.* limit, or a weight) as the
//! journal names it: enough to read its value and write one back, in either cgroup mode.
//! A journal is read back as root, so a knob from it is checked to be one of these files,
//! a device number and a plain value before anything is written.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::Setting;
use crate::{identify::cgroupfs::CgroupMode, policy::Knob};

/// The cgroup files the agent writes, and nothing else.
const FILES: [&str; 8] = [
    "io.max",
    "io.weight",
    "io.cost.qos",
    "blkio.throttle.read_bps_device",
    "blkio.throttle.write_bps_device",
    "blkio.throttle.read_iops_device",
    "blkio.throttle.write_iops_device",
    "blkio.bfq.weight",
];

/// The root cgroup's iocost switch per disk (`MAJ:MIN enable=1 ...`).
const IOCOST_QOS: &str = "io.cost.qos";

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KnobRef {
    /// File name in the cgroup directory.
    pub file: String,
    /// "major:minor" for per-device limits.
    pub dev: Option<String>,
    /// io.max's key ("wbps"), "weight", or io.cost.qos's "enable".
    pub key: String,
}

impl KnobRef {
    pub fn of(mode: CgroupMode, s: Setting) -> KnobRef {
        let v2 = mode == CgroupMode::V2;
        match s {
            Setting::Limit { dev, knob, .. } => KnobRef {
                file: if v2 {
                    "io.max"
                } else {
                    match knob {
                        Knob::Rbps => "blkio.throttle.read_bps_device",
                        Knob::Wbps => "blkio.throttle.write_bps_device",
                        Knob::Riops => "blkio.throttle.read_iops_device",
                        Knob::Wiops => "blkio.throttle.write_iops_device",
                    }
                }
                .into(),
                dev: Some(super::dev_str(dev)),
                key: knob.name().into(),
            },
            Setting::Weight(_) => KnobRef {
                file: if v2 { "io.weight" } else { "blkio.bfq.weight" }.into(),
                dev: None,
                key: "weight".into(),
            },
            Setting::IocostOn { dev } => KnobRef {
                file: IOCOST_QOS.into(),
                dev: Some(super::dev_str(dev)),
                key: "enable".into(),
            },
        }
    }

    /// For people: "254:0 wbps", "weight", "254:0 enable".
    pub fn describe(&self) -> String {
        match &self.dev {
            Some(d) => format!("{d} {}", self.key),
            None => self.key.clone(),
        }
    }

    fn is_limit(&self) -> bool {
        self.file == "io.max" || self.file.starts_with("blkio.throttle.")
    }

    /// Whether a knob read from a journal is one the agent could have written.
    pub fn is_valid(&self) -> bool {
        let dev_ok = |d: &str| {
            d.split_once(':').is_some_and(|(a, b)| {
                !a.is_empty()
                    && !b.is_empty()
                    && a.len() <= 10
                    && b.len() <= 10
                    && a.bytes().chain(b.bytes()).all(|c| c.is_ascii_digit())
            })
        };
        FILES.contains(&self.file.as_str())
            && match (self.is_limit(), &self.dev) {
                (true, Some(d)) => {
                    dev_ok(d) && Knob::ALL.iter().any(|k| k.name() == self.key.as_str())
                }
                (false, None) => self.key == "weight",
                (false, Some(d)) => self.file == IOCOST_QOS && dev_ok(d) && self.key == "enable",
                _ => false,
            }
    }

    /// The value the knob holds, in the form the agent writes ("max" or "0" is unlimited).
    pub fn parse(&self, text: &str) -> String {
        if let Some(d) = &self.dev {
            let line = text
                .lines()
                .find(|l| l.split_whitespace().next() == Some(d.as_str()));
            return if self.file == "io.max" || self.file == IOCOST_QOS {
                line.and_then(|l| {
                    l.split_whitespace()
                        .filter_map(|kv| kv.split_once('='))
                        .find(|(k, _)| *k == self.key)
                        .map(|(_, v)| v.to_string())
                })
                // A disk without a line: io.max unlimited, iocost off.
                .unwrap_or_else(|| if self.file == IOCOST_QOS { "0" } else { "max" }.into())
            } else {
                line.and_then(|l| l.split_whitespace().nth(1).map(str::to_string))
                    .unwrap_or_else(|| "0".into())
            };
        }
        // "default 100" (v2, newer v1) or "100" (older bfq).
        text.lines()
            .find_map(|l| {
                let mut it = l.split_whitespace();
                match (it.next(), it.next()) {
                    (Some("default"), Some(v)) => Some(v.to_string()),
                    (Some(v), None) if v.parse::<u32>().is_ok() => Some(v.to_string()),
                    _ => None,
                }
            })
            .unwrap_or_else(|| "100".into())
    }

    /// The line that sets `value`; None for a value the agent would never write.
    pub fn line(&self, value: &str) -> Option<String> {
        let plain =
            !value.is_empty() && value.len() <= 20 && value.bytes().all(|c| c.is_ascii_digit());
        if !(plain || (value == "max" && self.file == "io.max")) {
            return None;
        }
        Some(match (&self.dev, self.file.as_str()) {
            (Some(d), "io.max" | IOCOST_QOS) => format!("{d} {}={value}\n", self.key),
            (Some(d), _) => format!("{d} {value}\n"),
            (None, "io.weight") => format!("default {value}\n"),
            (None, _) => format!("{value}\n"),
        })
    }

    pub fn path_in(&self, cgroup_dir: &Path) -> std::path::PathBuf {
        cgroup_dir.join(&self.file)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_knobs_are_checked() {
        let dev = isolator_common::kernel_dev(254, 0);
        for mode in [CgroupMode::V1, CgroupMode::V2] {
            for s in [
                Setting::Limit {
                    dev,
                    knob: Knob::Wiops,
                    value: Some(5),
                },
                Setting::Weight(10),
            ] {
                assert!(KnobRef::of(mode, s).is_valid());
            }
        }
        let bad = |file: &str, dev: Option<&str>, key: &str| KnobRef {
            file: file.into(),
            dev: dev.map(str::to_string),
            key: key.into(),
        };
        assert!(!bad("../../etc/passwd", Some("254:0"), "rbps").is_valid());
        assert!(!bad("cgroup.procs", None, "weight").is_valid());
        assert!(!bad("io.max", Some("254:0\n1:1"), "rbps").is_valid());
        assert!(!bad("io.max", Some("254:0"), "rbps=1 wbps").is_valid());
        assert!(!bad("io.weight", Some("254:0"), "weight").is_valid());
        let k = KnobRef::of(
            CgroupMode::V2,
            Setting::Limit {
                dev,
                knob: Knob::Rbps,
                value: None,
            },
        );
        assert_eq!(k.line("max").unwrap(), "254:0 rbps=max\n");
        assert_eq!(k.line("1000\n254:0 wbps=1"), None);
        assert_eq!(
            k.parse("254:0 rbps=1000 wbps=max riops=max wiops=max\n"),
            "1000"
        );
        assert_eq!(k.parse(""), "max");
    }

    #[test]
    fn the_iocost_switch_is_one_key_of_one_disk_line() {
        let dev = isolator_common::kernel_dev(254, 0);
        let k = KnobRef::of(CgroupMode::V2, Setting::IocostOn { dev });
        assert!(k.is_valid());
        assert_eq!(k.describe(), "254:0 enable");
        assert_eq!(k.line("1").unwrap(), "254:0 enable=1\n");
        let qos = "8:0 enable=1 ctrl=auto rpct=0.00 rlat=250000\n254:0 enable=0 ctrl=auto rpct=0.00 rlat=25000\n";
        assert_eq!(k.parse(qos), "0");
        // A disk iocost has never seen has no line: off.
        assert_eq!(k.parse("8:0 enable=1 ctrl=auto\n"), "0");
        // Only the enable key of io.cost.qos, never its other parameters or another file.
        let bad = |file: &str, key: &str| KnobRef {
            file: file.into(),
            dev: Some("254:0".into()),
            key: key.into(),
        };
        assert!(!bad("io.cost.qos", "rlat").is_valid());
        assert!(!bad("io.cost.model", "enable").is_valid());
    }
}
