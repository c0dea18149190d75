//! Capability and rlimit checks needed before loading eBPF.

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

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
    "isolator needs root (or CAP_BPF and CAP_PERFMON) to load eBPF programs; run it with sudo";

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
    fn versions() {
        assert_eq!(kernel_version("6.1.0-28-amd64"), Some((6, 1)));
        assert_eq!(kernel_version("6.18.44-fc-v669"), Some((6, 18)));
        assert_eq!(kernel_version("garbage"), None);
    }
}
