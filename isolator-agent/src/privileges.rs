//! Capability and rlimit checks needed before loading eBPF.

const CAP_DAC_OVERRIDE: u32 = 1;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_SYS_RESOURCE: u32 = 24;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// A capability the agent uses instead of full root, and what for.
#[derive(Debug, PartialEq, Eq)]
pub struct Capability {
    /// As systemd and capsh spell it.
    pub name: &'static str,
    bit: u32,
    pub needed_for: &'static str,
}

/// Everything the agent needs, found by running it with only these (deploy/isolator.service
/// and deploy/daemonset.yaml grant exactly these; docs/deployment.md says why each).
pub const AGENT_CAPABILITIES: [Capability; 4] = [
    Capability {
        name: "CAP_BPF",
        bit: CAP_BPF,
        needed_for: "load the eBPF programs and create their maps",
    },
    Capability {
        name: "CAP_PERFMON",
        bit: CAP_PERFMON,
        needed_for: "attach the programs to the block tracepoints and read kernel structs from them",
    },
    Capability {
        name: "CAP_SYS_RESOURCE",
        bit: CAP_SYS_RESOURCE,
        needed_for: "raise RLIMIT_MEMLOCK for the maps (kernels before 5.11; newer ones charge the memory cgroup)",
    },
    Capability {
        name: "CAP_DAC_OVERRIDE",
        bit: CAP_DAC_OVERRIDE,
        needed_for: "write the limits of cgroups owned by other users, as in delegated subtrees (rootless containers, user sessions)",
    },
];

/// The agent's capabilities that `caps` lacks on a kernel of `version`. CAP_SYS_ADMIN
/// stands in for CAP_BPF and CAP_PERFMON, as the kernel lets it; CAP_SYS_RESOURCE is not
/// needed from 5.11 on.
pub fn missing_capabilities(caps: u64, version: Option<(u32, u32)>) -> Vec<&'static Capability> {
    let has = |c: u32| caps & (1u64 << c) != 0;
    AGENT_CAPABILITIES
        .iter()
        .filter(|c| !has(c.bit))
        .filter(|c| !(has(CAP_SYS_ADMIN) && (c.bit == CAP_BPF || c.bit == CAP_PERFMON)))
        .filter(|c| c.bit != CAP_SYS_RESOURCE || memlock_needed(version))
        .collect()
}

/// Effective capability mask of this process (from /proc/self/status).
pub fn effective_caps() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .unwrap_or(0)
}

/// Loading tracing programs needs CAP_SYS_ADMIN, or CAP_BPF with CAP_PERFMON.
pub fn can_load_bpf(caps: u64) -> bool {
    let has = |c: u32| caps & (1u64 << c) != 0;
    has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON))
}

pub const NEED_PRIVILEGES: &str =
    "isolator needs root (or CAP_BPF and CAP_PERFMON) to load eBPF programs; run it with sudo, or see 'isolator check' for the capabilities it uses";

/// Whether BPF maps count against RLIMIT_MEMLOCK on a kernel of `version`: before 5.11,
/// which charges them to the memory cgroup instead (and on a kernel whose version is not
/// known).
pub fn memlock_needed(version: Option<(u32, u32)>) -> bool {
    version.is_none_or(|v| v < (5, 11))
}

/// Tries to lift RLIMIT_MEMLOCK (needed for BPF maps before kernel 5.11, which charges
/// them to the memory cgroup instead). Returns the error text if it could not.
pub fn raise_memlock() -> Result<(), String> {
    let inf = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: valid pointer to an initialised rlimit.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &inf) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().to_string())
    }
}

/// Kernel release (uname -r).
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// (major, minor) of a release string like "6.1.0-28-amd64".
pub fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut it = release.split(|c: char| !c.is_ascii_digit());
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps() {
        assert!(can_load_bpf(1 << CAP_SYS_ADMIN));
        assert!(can_load_bpf((1 << CAP_BPF) | (1 << CAP_PERFMON)));
        assert!(!can_load_bpf(1 << CAP_BPF));
        assert!(!can_load_bpf(0));
    }

    #[test]
    fn missing_capabilities_by_kernel() {
        let names = |caps: u64, v| -> Vec<&str> {
            missing_capabilities(caps, v)
                .iter()
                .map(|c| c.name)
                .collect()
        };
        let all = AGENT_CAPABILITIES
            .iter()
            .fold(0u64, |m, c| m | (1 << c.bit));
        assert!(names(all, Some((5, 10))).is_empty());
        assert_eq!(
            names(0, Some((6, 1))),
            ["CAP_BPF", "CAP_PERFMON", "CAP_DAC_OVERRIDE"]
        );
        assert_eq!(
            names(1 << CAP_SYS_ADMIN, Some((5, 10))),
            ["CAP_SYS_RESOURCE", "CAP_DAC_OVERRIDE"]
        );
        assert_eq!(
            names(all & !(1 << CAP_SYS_RESOURCE), Some((5, 10))),
            ["CAP_SYS_RESOURCE"]
        );
        assert!(names(all & !(1 << CAP_SYS_RESOURCE), Some((6, 18))).is_empty());
        // Root's full set lacks nothing.
        assert!(names(0x1ff_ffff_ffff, None).is_empty());
    }

    #[test]
    fn versions() {
        assert_eq!(kernel_version("6.1.0-28-amd64"), Some((6, 1)));
        assert_eq!(kernel_version("6.18.44-fc-v669"), Some((6, 18)));
        assert_eq!(kernel_version("garbage"), None);
    }
}
