//! Loads the embedded eBPF object with this kernel's struct offsets and attaches it to the
//! block request tracepoints as BTF tracepoints (tp_btf; no tracefs needed).

use std::{
    os::fd::{AsFd, AsRawFd},
    path::Path,
};

use aya::{
    maps::Array,
    programs::{BtfTracePoint, FExit},
    Btf, Ebpf, EbpfLoader,
};
use isolator_common::{
    KernelOffsets, KeyCounters, KeyHistograms, ProgramSpec, COMPLETE_TRACEPOINT,
    DEFAULT_MAX_HISTOGRAM_KEYS, DEFAULT_MAX_KEYS, ISSUE_TRACEPOINT, MAP_AGENT_STATE, MAP_HISTS,
    MAP_KEYS, OFFSETS_DISK_IN_REQUEST, OFFSETS_GLOBAL, ON_DEMAND_TRACEPOINT, PROGRAMS,
    STATE_COUNT_INFLIGHT, STATE_EARLY_WINDOW, STATE_FIRST_ISSUE_NS, THROTTLE_PROGRAM,
};

use crate::collect::btf::{BtfError, KernelBtf};

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
    #[error("tracepoint {0} has arguments ({1}), expected struct request* first (or struct request_queue*, struct request* before 5.11)")]
    TracepointShape(String, String),
    #[error("loading the eBPF object failed: {0}; run 'isolator check' to see what is missing")]
    Load(String),
    #[error("attaching {0} failed: {1}; run 'isolator check'")]
    Attach(String, String),
}

/// Loaded and attached programs; dropping it detaches everything.
pub struct Probe {
    pub ebpf: Ebpf,
    /// (tracepoint, program) this kernel's tracepoints take.
    programs: Vec<(&'static str, &'static str)>,
    on_demand_attached: bool,
    issue_attached: bool,
    count_inflight: bool,
    /// The traced throttle function, when the throttle program is attached.
    throttle_function: Option<&'static str>,
    /// Why the throttle program is not attached, where the kernel has the function.
    throttle_error: Option<String>,
    pub features: KernelFeatures,
}

/// What the running kernel offers the programs, where kernels differ.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct KernelFeatures {
    /// The request's gendisk is reached through `request.rq_disk` (before 5.15) rather than
    /// `request_queue.disk`.
    pub disk_in_request: bool,
    /// block_rq_issue/insert take `(request_queue, request)` (before 5.11).
    pub queue_first_tracepoints: bool,
    /// The wait a cgroup's I/O limit imposes on a bio (blk-throttle holds it before any
    /// request exists) is in total latency: the kernel has a throttle function to trace
    /// and, once loaded, the program is attached. Without it a service the agent caps
    /// looks faster than its submitter sees.
    pub throttle_wait_timed: bool,
}

/// What a kernel that cannot time the wait in an I/O limit means, and what fixes it: said by
/// `isolator check` and by the agent's `throttle_wait_untimed` warning alike.
pub const THROTTLE_UNTIMED: &str =
    "the wait an I/O limit imposes is not timed: latencies leave it out";
pub const THROTTLE_UNTIMED_FIX: &str = "a kernel with CONFIG_BLK_DEV_THROTTLING that allows fexit programs times it; until then adaptive never caps a latency service";

impl KernelFeatures {
    /// What differs from current kernels, for `isolator check`.
    pub fn describe(&self) -> String {
        let mut v = Vec::new();
        if !self.throttle_wait_timed {
            v.push(THROTTLE_UNTIMED);
        }
        if self.disk_in_request {
            v.push("gendisk from request.rq_disk (no request_queue.disk)");
        }
        if self.queue_first_tracepoints {
            v.push("block_rq_issue/insert take (queue, request)");
        }
        if v.is_empty() {
            "current kernel layout".into()
        } else {
            v.join("; ")
        }
    }
}

/// The program for each tracepoint, by the argument list the kernel's BTF declares.
pub fn select_programs(btf: &KernelBtf) -> Result<Vec<(ProgramSpec, &'static str)>, ProbeError> {
    PROGRAMS
        .iter()
        .map(|spec| {
            let tp = spec.tracepoint;
            let params = btf
                .tracepoint_params(tp)
                .ok_or_else(|| ProbeError::NoTracepoint(tp.to_string()))?;
            let shape = || ProbeError::TracepointShape(tp.to_string(), params.join(", "));
            let first = params.first().map(String::as_str);
            // block_rq_complete(rq, error, nr_bytes): the program reads nr_bytes as arg 2.
            if tp == COMPLETE_TRACEPOINT && params.len() != 3 {
                return Err(shape());
            }
            if first == Some("struct request*") {
                return Ok((*spec, spec.program));
            }
            match (spec.program_q_rq, first, params.get(1).map(String::as_str)) {
                (Some(p), Some("struct request_queue*"), Some("struct request*")) => Ok((*spec, p)),
                _ => Err(shape()),
            }
        })
        .collect()
}

impl KernelFeatures {
    fn of(
        offsets: &KernelOffsets,
        chosen: &[(ProgramSpec, &'static str)],
        throttle_function: Option<&str>,
    ) -> Self {
        KernelFeatures {
            disk_in_request: offsets.flags & OFFSETS_DISK_IN_REQUEST != 0,
            queue_first_tracepoints: chosen.iter().any(|(spec, p)| *p != spec.program),
            throttle_wait_timed: throttle_function.is_some(),
        }
    }

    /// What the loader will pick on the kernel `btf` describes.
    pub fn detect(btf: &KernelBtf) -> Result<Self, ProbeError> {
        Ok(KernelFeatures::of(
            &btf.kernel_offsets()?,
            &select_programs(btf)?,
            btf.throttle_function(),
        ))
    }
}

/// Checks the tracepoints the programs need exist with an argument list they handle.
pub fn check_tracepoints(btf: &KernelBtf) -> Result<(), ProbeError> {
    select_programs(btf).map(|_| ())
}

pub fn load_btf(path: &Path) -> Result<KernelBtf, ProbeError> {
    if !path.exists() {
        return Err(ProbeError::NoBtf(path.display().to_string()));
    }
    Ok(KernelBtf::from_file(path)?)
}

/// How many keys the maps may hold: the operator's kernel-memory budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapLimits {
    /// Counters (KEYS, preallocated).
    pub max_keys: u32,
    /// Histograms (HISTS, allocated per key on its first completion).
    pub max_histogram_keys: u32,
}

impl Default for MapLimits {
    fn default() -> Self {
        MapLimits {
            max_keys: DEFAULT_MAX_KEYS,
            max_histogram_keys: DEFAULT_MAX_HISTOGRAM_KEYS,
        }
    }
}

/// Kernel memory of one hash map element: the kernel's `struct htab_elem` header (48 B on
/// 64-bit), the key and the value, each rounded to 8 B.
const fn htab_element_bytes(key: usize, value: usize) -> u64 {
    (48 + key.next_multiple_of(8) + value.next_multiple_of(8)) as u64
}

/// What the per-key statistics maps hold and what they cost. No value is per CPU (the
/// kernel's allocator caches 1-3 free histogram elements per possible CPU on 6.1+).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct StatsCapacity {
    /// Keys the counters map holds; a new key beyond is a counted loss (`map_full`).
    pub capacity_keys: u32,
    /// Keys with histograms at most; beyond, latency samples are counted as unsampled.
    pub capacity_histogram_keys: u32,
    pub possible_cpus: u32,
    /// Kernel memory of the counters map, preallocated at start.
    pub counters_bytes: u64,
    /// Kernel memory a key's histograms take once it has completed a request.
    pub histogram_bytes_per_key: u64,
    /// Both maps full.
    pub max_bytes: u64,
}

impl StatsCapacity {
    pub fn of_this_host(limits: MapLimits) -> Result<StatsCapacity, ProbeError> {
        let key = std::mem::size_of::<isolator_common::IoKey>();
        // With its share of the hash table's buckets (16 B each, one per entry).
        let counters = htab_element_bytes(key, std::mem::size_of::<KeyCounters>()) + 16;
        // Elements above a page come from the page allocator in powers of two (16 KiB).
        let hist =
            htab_element_bytes(key, std::mem::size_of::<KeyHistograms>()).next_power_of_two();
        let counters_bytes = counters * limits.max_keys as u64;
        let histogram_bytes = hist * limits.max_histogram_keys as u64;
        Ok(StatsCapacity {
            capacity_keys: limits.max_keys,
            capacity_histogram_keys: limits.max_histogram_keys,
            possible_cpus: possible_cpus()?,
            counters_bytes,
            histogram_bytes_per_key: hist,
            max_bytes: counters_bytes + histogram_bytes,
        })
    }
}

/// Highest possible CPU id + 1 (reported: a per-CPU map would scale with it).
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

fn program_mut<'a>(ebpf: &'a mut Ebpf, prog: &str) -> Result<&'a mut BtfTracePoint, ProbeError> {
    ebpf.program_mut(prog)
        .ok_or_else(|| ProbeError::Load(format!("program {prog} missing from object")))?
        .try_into()
        .map_err(|e| ProbeError::Load(format!("{prog}: {e}")))
}

/// Loads the throttle program on `function`'s return and attaches it. The link lives in
/// `ebpf`, like the tracepoints'.
fn attach_throttle(ebpf: &mut Ebpf, function: &str, btf: &Btf) -> Result<(), String> {
    let p: &mut FExit = ebpf
        .program_mut(THROTTLE_PROGRAM)
        .ok_or_else(|| format!("program {THROTTLE_PROGRAM} missing from the object"))?
        .try_into()
        .map_err(|e| format!("{THROTTLE_PROGRAM}: {e}"))?;
    p.load(function, btf)
        .map_err(|e| format!("loading: {}", error_chain(&e)))?;
    p.attach()
        .map_err(|e| format!("attaching: {}", error_chain(&e)))?;
    Ok(())
}

impl Probe {
    /// Loads every program and attaches the completion program; the issue program too when
    /// `count_inflight`.
    pub fn load(
        btf: KernelBtf,
        limits: MapLimits,
        count_inflight: bool,
    ) -> Result<Self, ProbeError> {
        let offsets = btf.kernel_offsets()?;
        let chosen = select_programs(&btf)?;
        let throttle_function = btf.throttle_function();
        let mut features = KernelFeatures::of(&offsets, &chosen, throttle_function);
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
            .map_max_entries(MAP_KEYS, limits.max_keys)
            .map_max_entries(MAP_HISTS, limits.max_histogram_keys)
            .load(EBPF_OBJECT)
            .map_err(|e| ProbeError::Load(error_chain(&e)))?;
        let mut programs = Vec::with_capacity(chosen.len());
        for (spec, prog) in chosen {
            let tp = spec.tracepoint;
            let p = program_mut(&mut ebpf, prog)?;
            p.load(tp, &aya_btf)
                .map_err(|e| ProbeError::Load(format!("{prog}: {}", error_chain(&e))))?;
            programs.push((tp, prog));
        }
        // The throttle program is worth having, not worth failing for: without it only the
        // wait a limit imposes is missing from latencies, and the features say so.
        let (throttle_function, throttle_error) = match throttle_function {
            Some(f) => match attach_throttle(&mut ebpf, f, &aya_btf) {
                Ok(()) => (Some(f), None),
                Err(e) => {
                    // Debug only: the caller reports it (the agent's `throttle_wait_untimed`
                    // warning event, `isolator check`'s features row), and a log line too
                    // said it twice.
                    tracing::debug!(function = f, error = %e, "the wait I/O limits impose is not timed");
                    features.throttle_wait_timed = false;
                    (None, Some(format!("fexit on {f}: {e}")))
                }
            },
            None => (None, None),
        };
        let mut probe = Probe {
            ebpf,
            programs,
            on_demand_attached: false,
            issue_attached: false,
            count_inflight,
            throttle_function,
            throttle_error,
            features,
        };
        probe.attach(COMPLETE_TRACEPOINT)?;
        if count_inflight {
            probe.state_set(STATE_COUNT_INFLIGHT, 1)?;
            probe.attach_issue()?;
        }
        Ok(probe)
    }

    /// Why the wait I/O limits impose is not timed, where the kernel has the function to
    /// trace but the program could not be loaded or attached.
    pub fn throttle_error(&self) -> Option<&str> {
        self.throttle_error.as_deref()
    }

    fn state_set(&mut self, slot: u32, value: u64) -> Result<(), ProbeError> {
        let map = self
            .ebpf
            .map_mut(MAP_AGENT_STATE)
            .ok_or_else(|| ProbeError::Load(format!("map {MAP_AGENT_STATE} missing")))?;
        let mut state: Array<_, u64> = Array::try_from(map)
            .map_err(|e| ProbeError::Load(format!("{MAP_AGENT_STATE}: {e}")))?;
        state
            .set(slot, value, 0)
            .map_err(|e| ProbeError::Load(format!("{MAP_AGENT_STATE}: {e}")))
    }

    fn attach(&mut self, tracepoint: &str) -> Result<(), ProbeError> {
        let prog = self
            .programs
            .iter()
            .find(|(tp, _)| *tp == tracepoint)
            .map(|(_, p)| *p)
            .ok_or_else(|| ProbeError::Load(format!("{tracepoint} not loaded")))?;
        program_mut(&mut self.ebpf, prog)?
            .attach()
            .map_err(|e| ProbeError::Attach(tracepoint.to_string(), error_chain(&e)))?;
        Ok(())
    }

    pub fn issue_attached(&self) -> bool {
        self.issue_attached
    }

    /// Attaches block_rq_issue: for in-flight counts, or for queues that do not stamp
    /// requests at issue. Idempotent.
    pub fn attach_issue(&mut self) -> Result<bool, ProbeError> {
        if self.issue_attached {
            return Ok(false);
        }
        if self.count_inflight {
            // Requests issued from here on are counted in flight; completions of those
            // issued before are told apart by their issue time (and, near this moment, by
            // EARLY_COUNTED, open until the agent's first cycle).
            self.state_set(STATE_EARLY_WINDOW, 1)?;
            self.state_set(
                STATE_FIRST_ISSUE_NS,
                crate::collect::collector::monotonic_ns(),
            )?;
        }
        self.attach(ISSUE_TRACEPOINT)?;
        self.issue_attached = true;
        Ok(true)
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
        self.attach(ON_DEMAND_TRACEPOINT)?;
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
    // aya ends the error with "Verifier output: " and the log, which is empty where the
    // kernel refuses a program type outright (EPERM for fexit): nothing to point at then.
    let s = match s.trim_end().strip_suffix("Verifier output:") {
        Some(head) => head.trim_end().trim_end_matches('.').to_string(),
        None => s,
    };
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
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct ProgramStats {
    pub name: String,
    /// Runs and total run time; only counted while kernel.bpf_stats_enabled=1.
    pub run_cnt: u64,
    pub run_time_ns: u64,
    /// Runs the kernel skipped because the program was already running on that CPU
    /// (e.g. a hardirq completion nested in a softirq one): events lost to the agent.
    pub recursion_misses: u64,
}

// Offsets in the kernel's struct bpf_prog_info (uapi, append-only).
const INFO_NAME: usize = 64;
const INFO_RUN_TIME_NS: usize = 192;
const INFO_RUN_CNT: usize = 200;
const INFO_RECURSION_MISSES: usize = 208;
const INFO_LEN: usize = 232;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_PROG_GET_NEXT_ID: libc::c_long = 11;
const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;

/// A program loaded on the host (by anyone), with its kernel statistics.
#[derive(Debug, Clone)]
pub struct LoadedProgram {
    pub id: u32,
    /// The kernel's name for it (at most 15 bytes).
    pub name: String,
    pub run_cnt: u64,
    pub run_time_ns: u64,
}

/// Every BPF program loaded on the host, by id (needs CAP_SYS_ADMIN): for comparing the
/// programs' cost with other tracers' (the overhead benchmark).
pub fn loaded_programs() -> Vec<LoadedProgram> {
    let bpf_id = |cmd: libc::c_long, id: u32| -> i64 {
        // start_id/prog_id, next_id, open_flags: the bpf_attr prefix of both commands.
        let mut attr = [id, 0u32, 0u32, 0u32];
        // SAFETY: attr is a zero-padded bpf_attr prefix for these commands.
        let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), 16) };
        if cmd == BPF_PROG_GET_NEXT_ID {
            if rc == 0 {
                attr[1] as i64
            } else {
                -1
            }
        } else {
            rc
        }
    };
    let u64_at =
        |b: &[u8; INFO_LEN], off: usize| u64::from_ne_bytes(b[off..off + 8].try_into().unwrap());
    let mut out = vec![];
    let mut id = 0u32;
    loop {
        let next = bpf_id(BPF_PROG_GET_NEXT_ID, id);
        if next < 0 {
            return out;
        }
        id = next as u32;
        let fd = bpf_id(BPF_PROG_GET_FD_BY_ID, id);
        if fd < 0 {
            continue;
        }
        let info = prog_info(fd as i32);
        // SAFETY: fd is ours to close.
        unsafe { libc::close(fd as i32) };
        let Some(info) = info else { continue };
        let name = &info[INFO_NAME..INFO_NAME + 16];
        let end = name.iter().position(|&b| b == 0).unwrap_or(16);
        out.push(LoadedProgram {
            id,
            name: String::from_utf8_lossy(&name[..end]).into_owned(),
            run_cnt: u64_at(&info, INFO_RUN_CNT),
            run_time_ns: u64_at(&info, INFO_RUN_TIME_NS),
        });
    }
}

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
        let throttle = self.throttle_function.and_then(|f| {
            let p: &FExit = self.ebpf.program(THROTTLE_PROGRAM)?.try_into().ok()?;
            Some((f, p.fd().ok()?.as_fd().as_raw_fd()))
        });
        self.programs
            .iter()
            .filter_map(|&(name, prog)| {
                let p: &BtfTracePoint = self.ebpf.program(prog)?.try_into().ok()?;
                Some((name, p.fd().ok()?.as_fd().as_raw_fd()))
            })
            .chain(throttle)
            .filter_map(|(name, fd)| {
                let info = prog_info(fd)?;
                Some(ProgramStats {
                    name: name.to_string(),
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
    use std::{
        collections::{BTreeMap, BTreeSet},
        mem::size_of,
    };

    use aya_obj::{generated::bpf_map_type, EbpfSectionKind, ProgramSection};
    use isolator_common::{
        IoKey, KernelOffsets, KeyCounters, KeyHistograms, ThrottleHold, DEFAULT_MAX_HISTOGRAM_KEYS,
        DEFAULT_MAX_KEYS, FALLBACK_DEVS_ENTRIES, HISTS_MAP_FLAGS, ISSUE_TRACEPOINT,
        MAP_AGENT_STATE, MAP_EARLY_COUNTED, MAP_FALLBACK_DEVS, MAP_HISTS, MAP_INSERT_TS,
        MAP_ISSUE_TS, MAP_KEYS, MAP_THROTTLE_HOLDS, MAP_ZERO_HISTS, OFFSETS_GLOBAL,
        ON_DEMAND_TRACEPOINT, PROGRAMS, REQUEST_MAP_ENTRIES, STATE_SLOTS, THROTTLE_FUNCTIONS,
        THROTTLE_HOLD_ENTRIES, THROTTLE_PROGRAM,
    };
    use object::{Object as _, ObjectSection as _, ObjectSymbol as _};

    use super::{error_chain, parse_cpu_list, EBPF_OBJECT};

    #[derive(Debug)]
    struct Refused(&'static str);
    impl std::fmt::Display for Refused {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }
    impl std::error::Error for Refused {}

    #[test]
    fn an_empty_verifier_log_is_not_named() {
        let e = Refused("the BPF_PROG_LOAD syscall returned Operation not permitted (os error 1). Verifier output: ");
        assert_eq!(
            error_chain(&e),
            "the BPF_PROG_LOAD syscall returned Operation not permitted (os error 1)"
        );
        let e = Refused("the BPF_PROG_LOAD syscall returned Invalid argument. Verifier output: 0: r1 = 0\n1: exit");
        assert_eq!(
            error_chain(&e),
            "the BPF_PROG_LOAD syscall returned Invalid argument. Verifier output: 0: r1 = 0 (verifier log in --log-level debug)"
        );
    }

    /// A map as the object must define it.
    #[derive(Debug, PartialEq, Eq)]
    struct MapDef {
        map_type: u32,
        key_size: u32,
        value_size: u32,
        max_entries: u32,
        flags: u32,
    }

    fn def<K, V>(map_type: bpf_map_type, max_entries: u32, flags: u32) -> MapDef {
        MapDef {
            map_type: map_type as u32,
            key_size: size_of::<K>() as u32,
            value_size: size_of::<V>() as u32,
            max_entries,
            flags,
        }
    }

    /// The kernel/user contract, checked on the object the agent embeds: every map with the
    /// name, type and sizes the agent (or the programs' own use) expects, every program of
    /// PROGRAMS on its tracepoint, the OFFSETS global the loader overrides, and nothing
    /// else. The eBPF side spells map and program names as literals; this is what keeps
    /// them and the isolator-common types from drifting apart.
    #[test]
    fn the_embedded_object_matches_the_agents_maps_programs_and_types() {
        use bpf_map_type::*;
        let obj = aya_obj::Object::parse(EBPF_OBJECT).expect("aya parses the object");
        let elf = object::File::parse(EBPF_OBJECT).expect("an ELF object");

        // The agent sizes KEYS and HISTS at load (MapLimits); the defaults in the object are
        // those of MapLimits::default. HISTS must not be preallocated: StatsCapacity counts
        // its memory per active key.
        let expected: BTreeMap<&str, MapDef> = [
            (
                MAP_KEYS,
                def::<IoKey, KeyCounters>(BPF_MAP_TYPE_HASH, DEFAULT_MAX_KEYS, 0),
            ),
            (
                MAP_HISTS,
                def::<IoKey, KeyHistograms>(
                    BPF_MAP_TYPE_HASH,
                    DEFAULT_MAX_HISTOGRAM_KEYS,
                    HISTS_MAP_FLAGS,
                ),
            ),
            (
                MAP_AGENT_STATE,
                def::<u32, u64>(BPF_MAP_TYPE_ARRAY, STATE_SLOTS, 0),
            ),
            (
                MAP_ZERO_HISTS,
                def::<u32, KeyHistograms>(BPF_MAP_TYPE_ARRAY, 1, 0),
            ),
            (
                MAP_ISSUE_TS,
                def::<u64, u64>(BPF_MAP_TYPE_LRU_HASH, REQUEST_MAP_ENTRIES, 0),
            ),
            (
                MAP_INSERT_TS,
                def::<u64, u64>(BPF_MAP_TYPE_LRU_HASH, REQUEST_MAP_ENTRIES, 0),
            ),
            (
                MAP_EARLY_COUNTED,
                def::<u64, u8>(BPF_MAP_TYPE_LRU_HASH, REQUEST_MAP_ENTRIES, 0),
            ),
            (
                MAP_FALLBACK_DEVS,
                def::<u32, u8>(BPF_MAP_TYPE_HASH, FALLBACK_DEVS_ENTRIES, 0),
            ),
            (
                MAP_THROTTLE_HOLDS,
                def::<u64, ThrottleHold>(BPF_MAP_TYPE_LRU_HASH, THROTTLE_HOLD_ENTRIES, 0),
            ),
        ]
        .into_iter()
        .collect();
        let mut found = BTreeMap::new();
        let mut data = BTreeSet::new();
        for (name, m) in &obj.maps {
            match m.section_kind() {
                EbpfSectionKind::Maps | EbpfSectionKind::BtfMaps => {
                    let d = MapDef {
                        map_type: m.map_type(),
                        key_size: m.key_size(),
                        value_size: m.value_size(),
                        max_entries: m.max_entries(),
                        flags: m.map_flags(),
                    };
                    found.insert(name.as_str(), d);
                }
                _ => {
                    data.insert(name.as_str());
                }
            }
        }
        assert_eq!(found, expected, "maps (name -> definition)");

        // The one global the programs read, which the loader overrides by name.
        assert_eq!(
            data,
            BTreeSet::from([".rodata"]),
            "data sections (globals) besides .rodata: a new global the agent does not set?"
        );
        let offsets = elf
            .symbols()
            .find(|s| s.name() == Ok(OFFSETS_GLOBAL))
            .expect("the OFFSETS global");
        let section = elf
            .section_by_index(offsets.section_index().unwrap())
            .unwrap();
        assert_eq!(section.name(), Ok(".rodata"));
        assert_eq!(offsets.size(), size_of::<KernelOffsets>() as u64);

        // Every program the loader may pick, on its tracepoint; nothing else.
        let mut expected_programs = BTreeMap::new();
        for spec in PROGRAMS {
            for p in std::iter::once(spec.program).chain(spec.program_q_rq) {
                expected_programs.insert(p, spec.tracepoint);
            }
        }
        for tp in [ISSUE_TRACEPOINT, ON_DEMAND_TRACEPOINT] {
            assert!(PROGRAMS.iter().any(|s| s.tracepoint == tp), "{tp}");
        }
        let mut programs = BTreeMap::new();
        for (name, p) in &obj.programs {
            if name == THROTTLE_PROGRAM {
                // Loaded on whichever of THROTTLE_FUNCTIONS the kernel has; the section
                // names the first.
                assert!(
                    matches!(p.section, ProgramSection::FExit { .. }),
                    "{name}: {:?}, expected fexit",
                    p.section
                );
            } else {
                assert!(
                    matches!(p.section, ProgramSection::BtfTracePoint),
                    "{name}: {:?}, expected a BTF tracepoint",
                    p.section
                );
            }
            let section = elf
                .section_by_index(object::SectionIndex(p.section_index))
                .unwrap();
            programs.insert(name.as_str(), section.name().unwrap().to_string());
        }
        let want: BTreeMap<&str, String> = expected_programs
            .iter()
            .map(|(p, tp)| (*p, format!("tp_btf/{tp}")))
            .chain([(THROTTLE_PROGRAM, format!("fexit/{}", THROTTLE_FUNCTIONS[0]))])
            .collect();
        assert_eq!(programs, want, "programs (name -> section)");
    }

    /// The executable sections of an ELF64 little-endian object: (name offset, bytes).
    fn code_sections(elf: &[u8]) -> Vec<&[u8]> {
        let u16_at = |o: usize| u16::from_le_bytes(elf[o..o + 2].try_into().unwrap()) as usize;
        let u64_at = |o: usize| u64::from_le_bytes(elf[o..o + 8].try_into().unwrap()) as usize;
        assert_eq!(&elf[..4], b"\x7fELF");
        let (shoff, shentsize, shnum) = (u64_at(0x28), u16_at(0x3a), u16_at(0x3c));
        const SHF_EXECINSTR: usize = 0x4;
        (0..shnum)
            .map(|i| shoff + i * shentsize)
            .filter(|&h| u64_at(h + 8) & SHF_EXECINSTR != 0)
            .map(|h| &elf[u64_at(h + 24)..u64_at(h + 24) + u64_at(h + 32)])
            .collect()
    }

    /// Kernels before 5.12 verify only the plain atomic add (BPF_XADD): any fetch, xchg or
    /// cmpxchg in the object would make it fail to load on 5.10.
    #[test]
    fn the_object_uses_only_plain_atomic_adds() {
        const BPF_STX: u8 = 0x03;
        const BPF_ATOMIC: u8 = 0xc0;
        const BPF_LD_IMM64: u8 = 0x18;
        let mut adds = 0;
        for code in code_sections(EBPF_OBJECT) {
            let mut i = 0;
            while i + 8 <= code.len() {
                let op = code[i];
                let imm = i32::from_le_bytes(code[i + 4..i + 8].try_into().unwrap());
                if op & 0x07 == BPF_STX && op & 0xe0 == BPF_ATOMIC {
                    assert_eq!(
                        imm, 0,
                        "atomic instruction {op:#x} with imm {imm:#x} (not a plain add) at byte {i}"
                    );
                    adds += 1;
                }
                // A 64-bit immediate load takes two slots.
                i += if op == BPF_LD_IMM64 { 16 } else { 8 };
            }
        }
        assert!(
            adds >= 6,
            "only {adds} atomic adds found: is the object empty?"
        );
    }

    #[test]
    fn cpu_list_gives_the_highest_id() {
        assert_eq!(parse_cpu_list("0\n"), Some(0));
        assert_eq!(parse_cpu_list("0-1\n"), Some(1));
        assert_eq!(parse_cpu_list("0-3,8,10-11"), Some(11));
        assert_eq!(parse_cpu_list(""), None);
        assert_eq!(parse_cpu_list("0-x"), None);
    }
}
