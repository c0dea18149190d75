//! The host files the enforcer touches, behind two small traits so that what the control
//! stage plans and the enforcer writes can be tested on an in-memory host (see
//! `fake_host`): cgroupfs (cgroup directories and their knob files) and sysfs (the block
//! devices limits name). The real ones are [`HostCgroupFiles`] and [`SysfsBlockDevices`].

use std::{
    collections::HashMap,
    io::Write,
    os::unix::fs::{MetadataExt, OpenOptionsExt},
    path::{Path, PathBuf},
};

use crate::identify::cgroupfs::IoHierarchy;

/// What is at a path, links not followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathEntry {
    pub ino: u64,
    pub is_dir: bool,
}

/// cgroupfs as the enforcer uses it: paths are absolute (below the hierarchy's root).
pub trait CgroupFiles: Send {
    /// The inode of what `path` leads to, links followed (a cgroup's kernfs id); None when
    /// nothing is there.
    fn inode(&self, path: &Path) -> Option<u64>;
    /// What is at `path` itself, links not followed.
    fn entry(&self, path: &Path) -> Option<PathEntry>;
    fn canonicalize(&self, path: &Path) -> std::io::Result<PathBuf>;
    /// A knob file's text.
    fn read(&self, file: &Path) -> std::io::Result<String>;
    /// One write(2) of one line to a knob file: the kernel applies or rejects it whole.
    fn write(&self, file: &Path, line: &str) -> std::io::Result<()>;
    /// Every cgroup of the hierarchy: inode -> path relative to its root.
    fn scan(&self, hierarchy: &IoHierarchy) -> HashMap<u64, String>;
}

/// The block devices limits name ("major:minor"), as sysfs lists them.
pub trait BlockDevices: Send {
    fn exists(&self, dev: &str) -> bool;
    /// Limits go on whole disks only.
    fn is_partition(&self, dev: &str) -> bool;
    /// Whether the disk says it is rotational (its blk-throttle slice depends on it); None
    /// when it does not say.
    fn rotational(&self, _dev: &str) -> Option<bool> {
        None
    }
}

/// The mounted cgroupfs.
pub struct HostCgroupFiles;

impl CgroupFiles for HostCgroupFiles {
    fn inode(&self, path: &Path) -> Option<u64> {
        std::fs::metadata(path).ok().map(|m| m.ino())
    }

    fn entry(&self, path: &Path) -> Option<PathEntry> {
        std::fs::symlink_metadata(path).ok().map(|m| PathEntry {
            ino: m.ino(),
            is_dir: m.is_dir(),
        })
    }

    fn canonicalize(&self, path: &Path) -> std::io::Result<PathBuf> {
        path.canonicalize()
    }

    fn read(&self, file: &Path) -> std::io::Result<String> {
        std::fs::read_to_string(file)
    }

    fn write(&self, file: &Path, line: &str) -> std::io::Result<()> {
        // O_TRUNC as a shell's `>` does; kernfs ignores it. Knob files are never links.
        std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(file)
            .and_then(|mut f| f.write_all(line.as_bytes()))
    }

    fn scan(&self, hierarchy: &IoHierarchy) -> HashMap<u64, String> {
        hierarchy.scan()
    }
}

/// /sys/dev/block.
pub struct SysfsBlockDevices;

impl BlockDevices for SysfsBlockDevices {
    fn exists(&self, dev: &str) -> bool {
        Path::new(&format!("/sys/dev/block/{dev}")).exists()
    }

    fn is_partition(&self, dev: &str) -> bool {
        Path::new(&format!("/sys/dev/block/{dev}/partition")).exists()
    }

    fn rotational(&self, dev: &str) -> Option<bool> {
        let text =
            std::fs::read_to_string(format!("/sys/dev/block/{dev}/queue/rotational")).ok()?;
        match text.trim() {
            "1" => Some(true),
            "0" => Some(false),
            _ => None,
        }
    }
}
