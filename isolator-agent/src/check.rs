//! `isolator check`: is this host ready? Each item says what was found and, when it is not
//! ready, what to do.

use std::path::Path;

use crate::{
    collect::probe::{self, Probe},
    identify::cgroupfs::{CgroupMode, IoHierarchy},
    privileges,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ok,
    Warn,
    Fail,
}

#[derive(Debug, Clone)]
pub struct Item {
    pub name: &'static str,
    pub status: Status,
    pub detail: String,
    /// What to do about a warning or failure.
    pub fix: Option<String>,
}

fn item(name: &'static str, status: Status, detail: impl Into<String>, fix: Option<&str>) -> Item {
    Item {
        name,
        status,
        detail: detail.into(),
        fix: fix.map(str::to_string),
    }
}

pub fn run_checks(btf_path: &Path) -> Vec<Item> {
    use Status::*;
    let mut items = Vec::new();

    let release = privileges::kernel_release();
    items.push(match privileges::kernel_version(&release) {
        Some(v) if v >= (5, 10) => item("kernel", Ok, format!("Linux {release}"), None),
        _ => item(
            "kernel",
            Fail,
            format!("Linux {release}"),
            Some("isolator needs Linux >= 5.10 (BTF tracepoints of the block layer, bio blkg); upgrade the kernel"),
        ),
    });

    let caps = privileges::effective_caps();
    let privileged = privileges::can_load_bpf(caps);
    items.push(capabilities_item(
        caps,
        &privileges::missing_capabilities(caps, privileges::kernel_version(&release)),
    ));

    items.push(match privileges::raise_memlock() {
        Result::Ok(()) => item("memlock", Ok, "RLIMIT_MEMLOCK raised", None),
        Err(e) => item(
            "memlock",
            if privileges::memlock_needed(privileges::kernel_version(&release)) {
                Fail
            } else {
                Ok
            },
            format!("cannot raise RLIMIT_MEMLOCK ({e}); not needed on >= 5.11 (memcg accounting)"),
            Some("on kernels < 5.11 run with CAP_SYS_RESOURCE"),
        ),
    });

    items.push(capacity_item(probe::StatsCapacity::of_this_host(
        probe::MapLimits::default(),
    )));

    let btf = match probe::load_btf(btf_path) {
        Result::Ok(b) => b,
        Err(e) => {
            items.push(item("btf", Fail, e.to_string(), Some("see the message")));
            return items;
        }
    };
    let offsets = btf.kernel_offsets();
    match &offsets {
        Result::Ok(o) => items.push(item(
            "btf",
            Ok,
            format!(
                "{}: request.bio@{} .io_start_time_ns@{} .start_time_ns@{}, {}, bio.bi_blkg@{}, kernfs_node.id@{}",
                btf.source(),
                o.rq_bio,
                o.rq_io_start_time_ns,
                o.rq_start_time_ns,
                if o.flags & isolator_common::OFFSETS_DISK_IN_REQUEST != 0 {
                    format!("request.rq_disk@{}", o.rq_disk)
                } else {
                    format!("request_queue.disk@{}", o.q_disk)
                },
                o.bio_bi_blkg,
                o.kn_id
            ),
            None,
        )),
        Err(e) => items.push(item(
            "btf",
            Fail,
            e.to_string(),
            Some("this kernel's block structs are not supported; report the kernel version"),
        )),
    }

    let tracefs = std::fs::read_to_string("/proc/self/mounts")
        .map(|m| m.lines().any(|l| l.split(' ').nth(2) == Some("tracefs")))
        .unwrap_or(false);
    items.push(match probe::check_tracepoints(&btf) {
        Result::Ok(_) => item(
            "tracepoints",
            Ok,
            format!(
                "block_rq_{{insert,issue,complete}} as BTF tracepoints (tp_btf, no tracefs needed; tracefs {})",
                if tracefs { "mounted" } else { "not mounted" }
            ),
            None,
        ),
        Err(e) => item("tracepoints", Fail, e.to_string(), Some("see the message")),
    });
    // What the kernel's BTF promises; when the programs are loaded here, what they got.
    let mut features = probe::KernelFeatures::detect(&btf).ok();
    let mut throttle_error = None;
    if privileged {
        items.push(match Probe::load(btf, probe::MapLimits::default(), true) {
            Result::Ok(p) => {
                features = Some(p.features);
                throttle_error = p.throttle_error().map(str::to_string);
                item(
                    "load",
                    Ok,
                    "programs loaded, verified and attached (then detached)",
                    None,
                )
            }
            Err(e) => item("load", Fail, e.to_string(), Some("see the message")),
        });
    }
    if let Some(features) = features {
        items.push(if features.throttle_wait_timed {
            item(
                "features",
                Ok,
                format!(
                    "{}; the wait I/O limits impose is timed (fexit on the blk-throttle decision)",
                    features.describe()
                ),
                None,
            )
        } else {
            let why = throttle_error.map_or(String::new(), |e| format!(" ({e})"));
            item(
                "features",
                Warn,
                format!("{}{why}", features.describe()),
                Some(probe::THROTTLE_UNTIMED_FIX),
            )
        });
    }

    match IoHierarchy::detect() {
        Result::Ok(h) => {
            let root = h.root.display().to_string();
            let (knobs, fix): (Vec<&str>, _) = match h.mode {
                CgroupMode::V1 => (
                    vec![
                        "blkio.throttle.read_bps_device",
                        "blkio.throttle.write_bps_device",
                        "blkio.throttle.read_iops_device",
                        "blkio.throttle.write_iops_device",
                        "blkio.bfq.weight",
                    ],
                    "mount the blkio controller (mount -t cgroup -o blkio none /sys/fs/cgroup/blkio)",
                ),
                CgroupMode::V2 => (
                    vec!["io.max", "io.weight"],
                    "enable the io controller: echo +io > /sys/fs/cgroup/cgroup.subtree_control",
                ),
            };
            // v2 roots have no io.max: look at a child, if io is enabled for children.
            let probe_dir = match h.mode {
                CgroupMode::V2 if h.io_enabled => std::fs::read_dir(&h.root)
                    .ok()
                    .and_then(|rd| {
                        rd.flatten()
                            .map(|e| e.path())
                            .find(|p| p.join("io.max").exists())
                    })
                    .unwrap_or(h.root.clone()),
                _ => h.root.clone(),
            };
            let mut present = vec![];
            let mut missing = vec![];
            for k in &knobs {
                let p = probe_dir.join(k);
                let writable = std::fs::metadata(&p)
                    .map(|m| !m.permissions().readonly())
                    .unwrap_or(false);
                if writable {
                    present.push(*k)
                } else {
                    missing.push(*k)
                }
            }
            let mode = match h.mode {
                CgroupMode::V1 => "v1 (blkio)",
                CgroupMode::V2 => "v2 (io)",
            };
            items.push(item("cgroup", Ok, format!("{mode} at {root}"), None));
            let status = if present.is_empty() {
                Fail
            } else if missing.is_empty() {
                Ok
            } else {
                Warn
            };
            let mut detail = format!("writable: {}", present.join(", "));
            if !missing.is_empty() {
                detail.push_str(&format!("; absent: {}", missing.join(", ")));
            }
            let fix = match (h.mode, status) {
                (CgroupMode::V1, Warn) => Some("blkio.bfq.weight needs the bfq scheduler on the disk (echo bfq > /sys/block/DISK/queue/scheduler); throttling works without it"),
                (_, Ok) => None,
                _ => Some(fix),
            };
            items.push(item("controller", status, detail, fix));
        }
        Err(e) => items.push(item("cgroup", Fail, e.to_string(), Some("see the message"))),
    }
    items
}

/// Which of the agent's capabilities the process lacks (its effective set), each with what
/// it is for: without CAP_BPF or CAP_PERFMON nothing loads (fail); without the others some
/// hosts work and some do not (warn).
fn capabilities_item(caps: u64, missing: &[&privileges::Capability]) -> Item {
    if missing.is_empty() {
        return item(
            "privileges",
            Status::Ok,
            format!("CapEff {caps:#x}: every capability the agent uses"),
            None,
        );
    }
    let names: Vec<&str> = missing.iter().map(|c| c.name).collect();
    let detail = format!(
        "CapEff {caps:#x} lacks {}",
        missing
            .iter()
            .map(|c| format!("{} (to {})", c.name, c.needed_for))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let status = if privileges::can_load_bpf(caps) {
        Status::Warn
    } else {
        Status::Fail
    };
    Item {
        name: "privileges",
        status,
        detail,
        fix: Some(format!(
            "run as root, or grant {}: systemd AmbientCapabilities= (deploy/isolator.service), docker run --cap-add, Kubernetes securityContext.capabilities.add (deploy/daemonset.yaml)",
            names.join(" ")
        )),
    }
}

/// Kernel memory the statistics maps may take at most above which the host is warned.
const KEYS_MEMORY_WARN_BYTES: u64 = 256 << 20;

fn capacity_item(cap: Result<probe::StatsCapacity, probe::ProbeError>) -> Item {
    let cap = match cap {
        Ok(c) => c,
        Err(e) => return item("capacity", Status::Fail, e.to_string(), None),
    };
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let detail = format!(
        "defaults: counters for up to {} (cgroup, disk, op) keys ({:.1} MiB, allocated at start), histograms for up to {} keys ({} KiB each, {:.1} MiB at most); no value per CPU ({} possible CPUs): {:.1} MiB per 1,000 active keys",
        cap.capacity_keys,
        mib(cap.counters_bytes),
        cap.capacity_histogram_keys,
        cap.histogram_bytes_per_key >> 10,
        mib(cap.histogram_bytes_per_key * cap.capacity_histogram_keys as u64),
        cap.possible_cpus,
        mib(cap.histogram_bytes_per_key * 1000 + cap.counters_bytes / cap.capacity_keys.max(1) as u64 * 1000),
    );
    if cap.max_bytes > KEYS_MEMORY_WARN_BYTES {
        item(
            "capacity",
            Status::Warn,
            detail,
            Some("lower --max-histogram-keys (16 KiB of kernel memory each) or --max-keys"),
        )
    } else {
        item("capacity", Status::Ok, detail, None)
    }
}

pub fn render(items: &[Item]) -> String {
    let mut s = String::new();
    for i in items {
        let tag = match i.status {
            Status::Ok => "ok  ",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
        };
        s.push_str(&format!("{tag}  {:<12} {}\n", i.name, i.detail));
        if i.status != Status::Ok {
            if let Some(f) = &i.fix {
                s.push_str(&format!("      {:<12} fix: {f}\n", ""));
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_capabilities_are_named_with_the_fix() {
        let missing = privileges::missing_capabilities(0, Some((6, 18)));
        let i = capabilities_item(0, &missing);
        assert_eq!(i.status, Status::Fail);
        assert!(
            i.detail.contains("CAP_BPF (to load")
                && i.detail.contains("CAP_PERFMON")
                && i.detail.contains("CAP_DAC_OVERRIDE"),
            "{}",
            i.detail
        );
        let fix = i.fix.unwrap();
        assert!(
            fix.starts_with("run as root, or grant CAP_BPF CAP_PERFMON CAP_DAC_OVERRIDE"),
            "{fix}"
        );
        // Loading works without CAP_DAC_OVERRIDE: a warning.
        let caps = (1 << 39) | (1 << 38);
        let missing = privileges::missing_capabilities(caps, Some((6, 18)));
        let i = capabilities_item(caps, &missing);
        assert_eq!(i.status, Status::Warn);
        assert!(
            i.detail
                .contains("CAP_DAC_OVERRIDE (to write the limits of cgroups owned by other users"),
            "{}",
            i.detail
        );
        let all = capabilities_item(u64::MAX, &[]);
        assert_eq!(all.status, Status::Ok);
    }

    #[test]
    fn capacity_is_stated_and_warns_only_past_the_budget() {
        let at = |hist_keys: u32| {
            capacity_item(probe::StatsCapacity::of_this_host(probe::MapLimits {
                max_keys: 16384,
                max_histogram_keys: hist_keys,
            }))
        };
        let default = at(4096);
        assert_eq!(default.status, Status::Ok, "{}", default.detail);
        assert!(
            default.detail.contains("16 KiB each, 64.0 MiB at most"),
            "{}",
            default.detail
        );
        assert!(
            default.detail.contains("1.9 MiB, allocated"),
            "{}",
            default.detail
        );
        let big = at(65536);
        assert_eq!(big.status, Status::Warn, "{}", big.detail);
        assert!(big.fix.unwrap().contains("--max-histogram-keys"));
    }
}
