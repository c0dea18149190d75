//! Loads the embedded eBPF object with this kernel's struct offsets and attaches it to the
//! block request tracepoints as BTF tracepoints (tp_btf; no tracefs needed).

use std::{
    os::fd::{AsFd, AsRawFd},
    path::Path,
};

use aya::{programs::BtfTracePoint, Btf, Ebpf, EbpfLoader};
use isolator_common::{
    MAP_SPILL, OFFSETS_GLOBAL, ON_DEMAND_PROGRAM, PROGRAMS, SPILL_SLOTS_PER_CPU,
};

use crate::btf::{BtfError, KernelBtf};

/// The eBPF object, built by build.rs from isolator-ebpf.
pub static EBPF_OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/isolator.bpf.o"));

pub const DEFAULT_BTF: &str = "/sys/kernel/btf/vmlinux";

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("kernel BTF not found at {0}; boot a kernel built with CONFIG_DEBUG_INFO_BTF=y or pass --btf PATH to a BTF file for this kernel")]
    NoBtf(String),
    #[error(
        "{0}; this kernel's block layer is not supported (pass --btf with a matching BTF file)"
    )]
    Btf(#[from] BtfError),
    #[error("kernel BTF has no tracepoint {0}: needs a kernel with block tracepoints (CONFIG_BLK_DEV_IO_TRACE or CONFIG_EVENT_TRACING)")]
    NoTracepoint(String),
    #[error("tracepoint {0} has arguments ({1}), expected struct request* first")]
    TracepointShape(String, String),
    #[error("loading the eBPF object failed: {0}; run 'isolator check' to see what is missing")]
    Load(String),
    #[error("attaching {0} failed: {1}; run 'isolator check'")]
    Attach(String, String),
}

/// Loaded and attached programs; dropping it detaches everything.
pub struct Probe {
    pub ebpf: Ebpf,
    on_demand_attached: bool,
}

/// Checks the tracepoints the programs need exist with the expected first argument.
pub fn check_tracepoints(btf: &KernelBtf) -> Result<(), ProbeError> {
    for (_, tp) in PROGRAMS {
        let params = btf
            .tracepoint_params(tp)
            .ok_or_else(|| ProbeError::NoTracepoint(tp.to_string()))?;
        // block_rq_complete(rq, error, nr_bytes): the program reads nr_bytes as arg 2.
        let arity_ok = tp != "block_rq_complete" || params.len() == 3;
        if params.first().map(String::as_str) != Some("struct request*") || !arity_ok {
            return Err(ProbeError::TracepointShape(
                tp.to_string(),
                params.join(", "),
            ));
        }
    }
    Ok(())
}

pub fn load_btf(path: &Path) -> Result<KernelBtf, ProbeError> {
    if !path.exists() {
        return Err(ProbeError::NoBtf(path.display().to_string()));
    }
    Ok(KernelBtf::from_file(path)?)
}

/// What the per-key statistics map can hold, and what one key costs: a per-CPU map keeps a
/// value for every *possible* CPU, online or not.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct StatsCapacity {
    pub capacity_keys: u32,
    pub possible_cpus: u32,
    /// Kernel memory one (cgroup, disk, op) key's values take: its per-CPU values.
    pub bytes_per_key: u64,
}

impl StatsCapacity {
    pub fn of_this_host() -> Result<StatsCapacity, ProbeError> {
        let cpus = possible_cpus()?;
        Ok(StatsCapacity {
            capacity_keys: isolator_common::STATS_CAPACITY_KEYS,
            possible_cpus: cpus,
            bytes_per_key: std::mem::size_of::<isolator_common::IoStats>() as u64 * cpus as u64,
        })
    }
}

/// Highest possible CPU id + 1: the programs index per-CPU spill slots by
/// bpf_get_smp_processor_id().
fn possible_cpus() -> Result<u32, ProbeError> {
    const POSSIBLE: &str = "/sys/devices/system/cpu/possible";
    let text = std::fs::read_to_string(POSSIBLE)
        .map_err(|e| ProbeError::Load(format!("reading {POSSIBLE}: {e}")))?;
    parse_cpu_list(&text)
        .map(|max| max + 1)
        .ok_or_else(|| ProbeError::Load(format!("{POSSIBLE}: not a CPU list: {text:?}")))
}

/// The highest CPU id of a kernel CPU list ("0-3,8,10-11").
fn parse_cpu_list(text: &str) -> Option<u32> {
    text.trim()
        .split(',')
        .map(|part| part.rsplit('-').next().and_then(|n| n.parse::<u32>().ok()))
        .try_fold(0u32, |max, n| n.map(|n| max.max(n)))
}

impl Probe {
    pub fn load(btf: KernelBtf) -> Result<Self, ProbeError> {
        let offsets = btf.kernel_offsets()?;
        check_tracepoints(&btf)?;
        // aya's own (much larger) model of the kernel BTF, for the programs' attach targets;
        // ours is dropped first so the two never coexist in memory.
        let raw = btf.into_raw();
        let aya_btf = Btf::parse(&raw, aya::Endianness::default())
            .map_err(|e| ProbeError::Load(format!("kernel BTF: {e}")))?;
        drop(raw);
        let mut ebpf = EbpfLoader::new()
            // The programs use no CO-RE relocations; offsets come in OFFSETS.
            .btf(None)
            .override_global(OFFSETS_GLOBAL, &offsets, true)
            .map_max_entries(MAP_SPILL, possible_cpus()? * SPILL_SLOTS_PER_CPU)
            .load(EBPF_OBJECT)
            .map_err(|e| ProbeError::Load(error_chain(&e)))?;
        for (prog, tp) in PROGRAMS {
            let p: &mut BtfTracePoint = ebpf
                .program_mut(prog)
                .ok_or_else(|| ProbeError::Load(format!("program {prog} missing from object")))?
                .try_into()
                .map_err(|e| ProbeError::Load(format!("{prog}: {e}")))?;
            p.load(tp, &aya_btf)
                .map_err(|e| ProbeError::Load(format!("{prog}: {}", error_chain(&e))))?;
            if prog != ON_DEMAND_PROGRAM {
                p.attach()
                    .map_err(|e| ProbeError::Attach(tp.to_string(), error_chain(&e)))?;
            }
        }
        Ok(Probe {
            ebpf,
            on_demand_attached: false,
        })
    }

    pub fn insert_attached(&self) -> bool {
        self.on_demand_attached
    }

    /// Attaches block_rq_insert, which only queues without request start times need
    /// (it would otherwise run on every request for nothing). Idempotent.
    pub fn attach_insert(&mut self) -> Result<bool, ProbeError> {
        if self.on_demand_attached {
            return Ok(false);
        }
        let p: &mut BtfTracePoint = self
            .ebpf
            .program_mut(ON_DEMAND_PROGRAM)
            .ok_or_else(|| ProbeError::Load(format!("{ON_DEMAND_PROGRAM} missing")))?
            .try_into()
            .map_err(|e| ProbeError::Load(format!("{ON_DEMAND_PROGRAM}: {e}")))?;
        p.attach()
            .map_err(|e| ProbeError::Attach(ON_DEMAND_PROGRAM.to_string(), error_chain(&e)))?;
        self.on_demand_attached = true;
        Ok(true)
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        let cs = c.to_string();
        if !s.contains(&cs) {
            s.push_str(": ");
            s.push_str(&cs);
        }
        src = c.source();
    }
    // Verifier logs are multi-line; keep the error one line and the log in debug output.
    if let Some(first) = s.lines().next() {
        if s.lines().count() > 1 {
            tracing::debug!(log = %s, "full eBPF load error");
            return format!("{first} (verifier log in --log-level debug)");
        }
    }
    s
}

/// Kernel statistics of one attached program (`bpf_prog_info`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ProgramStats {
    pub name: &'static str,
    /// Runs and total run time; only counted while kernel.bpf_stats_enabled=1.
    pub run_cnt: u64,
    pub run_time_ns: u64,
    /// Runs the kernel skipped because the program was already running on that CPU
    /// (e.g. a hardirq completion nested in a softirq one): events lost to the agent.
    pub recursion_misses: u64,
}

// Offsets in the kernel's struct bpf_prog_info (uapi, append-only).
const INFO_RUN_TIME_NS: usize = 192;
const INFO_RUN_CNT: usize = 200;
const INFO_RECURSION_MISSES: usize = 208;
const INFO_LEN: usize = 232;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;

fn prog_info(fd: i32) -> Option<[u8; INFO_LEN]> {
    #[repr(C)]
    struct InfoAttr {
        bpf_fd: u32,
        info_len: u32,
        info: u64,
    }
    let mut buf = [0u8; INFO_LEN];
    let mut attr = InfoAttr {
        bpf_fd: fd as u32,
        info_len: INFO_LEN as u32,
        info: buf.as_mut_ptr() as u64,
    };
    // SAFETY: attr points at a valid buffer of info_len bytes.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_OBJ_GET_INFO_BY_FD,
            &mut attr as *mut InfoAttr,
            std::mem::size_of::<InfoAttr>(),
        )
    };
    (rc == 0).then_some(buf)
}

impl Probe {
    pub fn program_stats(&self) -> Vec<ProgramStats> {
        let u64_at = |b: &[u8; INFO_LEN], off: usize| {
            u64::from_ne_bytes(b[off..off + 8].try_into().unwrap())
        };
        PROGRAMS
            .iter()
            .filter_map(|(name, _)| {
                let p: &BtfTracePoint = self.ebpf.program(name)?.try_into().ok()?;
                let fd = p.fd().ok()?.as_fd().as_raw_fd();
                let info = prog_info(fd)?;
                Some(ProgramStats {
                    name,
                    run_cnt: u64_at(&info, INFO_RUN_CNT),
                    run_time_ns: u64_at(&info, INFO_RUN_TIME_NS),
                    recursion_misses: u64_at(&info, INFO_RECURSION_MISSES),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::parse_cpu_list;

    #[test]
    fn cpu_list_gives_the_highest_id() {
        assert_eq!(parse_cpu_list("0\n"), Some(0));
        assert_eq!(parse_cpu_list("0-1\n"), Some(1));
        assert_eq!(parse_cpu_list("0-3,8,10-11"), Some(11));
        assert_eq!(parse_cpu_list(""), None);
        assert_eq!(parse_cpu_list("0-x"), None);
    }
}
