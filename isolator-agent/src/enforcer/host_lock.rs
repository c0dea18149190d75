//! One agent per host enforces. The lock is an flock on the root directory of the cgroup
//! hierarchy the limits go into: it is the one thing every agent on the host shares whatever
//! its --journal-dir, and a container that mounts the host's cgroupfs shares it too.

use std::{
    fs::File,
    os::{fd::AsRawFd, unix::fs::MetadataExt},
    path::Path,
};

use super::EnforceError;

pub struct HostLock {
    _dir: File,
}

impl HostLock {
    pub fn acquire(root: &Path) -> Result<HostLock, EnforceError> {
        let dir = File::open(root).map_err(|e| EnforceError::HostLock {
            message: format!("cannot open {} ({e})", root.display()),
        })?;
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(dir.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let holder = dir
                .metadata()
                .ok()
                .and_then(|m| holder_pid(m.dev(), m.ino()))
                .map(|p| format!(" (pid {p})"))
                .unwrap_or_default();
            return Err(EnforceError::HostLock {
                message: format!(
                    "another isolator{holder} already enforces limits on this host (it holds the lock on {}); stop it, or run this one with --dry-run",
                    root.display()
                ),
            });
        }
        Ok(HostLock { _dir: dir })
    }
}

/// The pid holding an flock on the file (`dev`, `ino`), from /proc/locks
/// ("1: FLOCK  ADVISORY  WRITE 1234 00:1d:1 0 EOF": major and minor in hex, inode).
fn holder_pid(dev: u64, ino: u64) -> Option<u32> {
    let want = format!("{:02x}:{:02x}:{ino}", libc::major(dev), libc::minor(dev));
    let text = std::fs::read_to_string("/proc/locks").ok()?;
    text.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let (kind, pid, id) = (f.get(1)?, f.get(4)?, f.get(5)?);
        (*kind == "FLOCK" && *id == want).then(|| pid.parse().ok())?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_and_named() {
        let d = std::env::temp_dir().join(format!("isolator-hostlock-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let first = HostLock::acquire(&d).unwrap();
        let e = HostLock::acquire(&d).err().unwrap().to_string();
        assert!(
            e.contains("already enforces") && e.contains("--dry-run"),
            "{e}"
        );
        assert!(
            e.contains(&format!("pid {}", std::process::id())),
            "names the holder: {e}"
        );
        drop(first);
        HostLock::acquire(&d).unwrap();
        std::fs::remove_dir(&d).unwrap();
    }
}
