//! An in-memory host for tests: cgroup directories with inodes, knob files that take lines
//! the way the kernel does (io.max merges keys per device, blkio.throttle.* holds one value
//! per device, 0 or "max" clears), block devices, and a log of every write. Clones share
//! one host, so a test keeps a handle on what it gave the enforcer.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    io,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use super::host_files::{BlockDevices, CgroupFiles, PathEntry};
use crate::identify::cgroupfs::{CgroupMode, IoHierarchy};

/// Where the fake hierarchy is mounted; nothing is ever created there.
const ROOT: &str = "/fake-cgroupfs";

#[derive(Default)]
struct Host {
    /// Cgroup directories (absolute) and their inodes.
    dirs: BTreeMap<PathBuf, u64>,
    files: BTreeMap<PathBuf, String>,
    next_ino: u64,
    /// Knob files whose writes the kernel rejects, with the errno.
    rejects: HashMap<PathBuf, i32>,
    writes: Vec<(PathBuf, String)>,
    partitions: BTreeSet<String>,
    gone_devices: BTreeSet<String>,
}

#[derive(Clone)]
pub struct FakeHost {
    mode: CgroupMode,
    host: Arc<Mutex<Host>>,
}

impl FakeHost {
    /// A hierarchy with only its root cgroup; every device exists and is a whole disk.
    pub fn new(mode: CgroupMode) -> FakeHost {
        let f = FakeHost {
            mode,
            host: Arc::new(Mutex::new(Host {
                next_ino: 1000,
                ..Default::default()
            })),
        };
        f.add_cgroup("/");
        f
    }

    pub fn hierarchy(&self) -> IoHierarchy {
        IoHierarchy {
            mode: self.mode,
            root: ROOT.into(),
            io_enabled: true,
        }
    }

    pub fn dir(&self, rel: &str) -> PathBuf {
        self.hierarchy().dir_of(rel)
    }

    fn host(&self) -> std::sync::MutexGuard<'_, Host> {
        self.host.lock().unwrap()
    }

    /// Creates a cgroup (and its parents) with the mode's knob files at their defaults;
    /// returns its inode, new on every creation.
    pub fn add_cgroup(&self, rel: &str) -> u64 {
        let dir = self.dir(rel);
        let mut h = self.host();
        for a in dir.ancestors().collect::<Vec<_>>().into_iter().rev() {
            if a.starts_with(ROOT) && !h.dirs.contains_key(a) {
                h.next_ino += 1;
                let ino = h.next_ino;
                h.dirs.insert(a.to_path_buf(), ino);
                let files: &[(&str, &str)] = match self.mode {
                    CgroupMode::V2 => &[("io.max", ""), ("io.weight", "default 100\n")],
                    CgroupMode::V1 => &[
                        ("blkio.throttle.read_bps_device", ""),
                        ("blkio.throttle.write_bps_device", ""),
                        ("blkio.throttle.read_iops_device", ""),
                        ("blkio.throttle.write_iops_device", ""),
                        ("blkio.bfq.weight", "100\n"),
                    ],
                };
                for (f, text) in files {
                    h.files.insert(a.join(f), text.to_string());
                }
                // iocost's switch lives in the root cgroup only (a kernel built with it).
                if self.mode == CgroupMode::V2 && a == Path::new(ROOT) {
                    h.files.insert(a.join("io.cost.qos"), String::new());
                }
            }
        }
        h.dirs[&dir]
    }

    /// Removes a cgroup and everything below it.
    pub fn remove_cgroup(&self, rel: &str) {
        let dir = self.dir(rel);
        let mut h = self.host();
        h.dirs.retain(|d, _| !d.starts_with(&dir));
        h.files.retain(|f, _| !f.starts_with(&dir));
    }

    /// The cgroup removed and created again at its path: another inode, default knobs.
    pub fn recreate_cgroup(&self, rel: &str) -> u64 {
        self.remove_cgroup(rel);
        self.add_cgroup(rel)
    }

    pub fn ino(&self, rel: &str) -> u64 {
        self.host().dirs[&self.dir(rel)]
    }

    /// Every cgroup path, as a walk of the hierarchy finds them.
    pub fn cgroup_paths(&self) -> Vec<String> {
        self.scan(&self.hierarchy()).into_values().collect()
    }

    pub fn read_knob(&self, rel: &str, file: &str) -> String {
        self.host().files[&self.dir(rel).join(file)].clone()
    }

    /// Someone else writes a knob file (not logged as a write of the agent's).
    pub fn set_knob(&self, rel: &str, file: &str, text: &str) {
        let path = self.dir(rel).join(file);
        self.host().files.insert(path, text.into());
    }

    /// The kernel rejects every write to this knob file with `errno`.
    pub fn reject_writes(&self, rel: &str, file: &str, errno: i32) {
        let path = self.dir(rel).join(file);
        self.host().rejects.insert(path, errno);
    }

    /// Every line written, in order: (file, line).
    pub fn writes(&self) -> Vec<(PathBuf, String)> {
        self.host().writes.clone()
    }

    /// What every knob file holds now.
    pub fn knob_files(&self) -> BTreeMap<PathBuf, String> {
        self.host().files.clone()
    }

    pub fn add_partition(&self, dev: &str) {
        self.host().partitions.insert(dev.into());
    }
}

/// A knob file's text after the kernel took `line`; None when it would reject it.
fn take_line(file_name: &str, text: &str, line: &str) -> Option<String> {
    let mut words = line.split_whitespace();
    let first = words.next()?;
    let per_device = |merge: &dyn Fn(Option<&str>) -> Option<Option<String>>| {
        let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
        let at = lines
            .iter()
            .position(|l| l.split_whitespace().next() == Some(first));
        let merged = merge(at.map(|i| lines[i].as_str()))?;
        match (at, merged) {
            (Some(i), Some(l)) => lines[i] = l,
            (Some(i), None) => {
                lines.remove(i);
            }
            (None, Some(l)) => lines.push(l),
            (None, None) => {}
        }
        Some(lines.iter().map(|l| format!("{l}\n")).collect())
    };
    match file_name {
        "io.max" => per_device(&|old| {
            let mut keys: BTreeMap<&str, String> = ["rbps", "wbps", "riops", "wiops"]
                .into_iter()
                .map(|k| (k, "max".to_string()))
                .collect();
            for kv in old.into_iter().flat_map(|l| l.split_whitespace().skip(1)) {
                let (k, v) = kv.split_once('=')?;
                let k = *keys.get_key_value(k)?.0;
                keys.insert(k, v.into());
            }
            for kv in line.split_whitespace().skip(1) {
                let (k, v) = kv.split_once('=')?;
                if v != "max" && v.parse::<u64>().is_err() {
                    return None;
                }
                let k = *keys.get_key_value(k)?.0;
                keys.insert(k, v.into());
            }
            if keys.values().all(|v| v == "max") {
                return Some(None);
            }
            let kv = ["rbps", "wbps", "riops", "wiops"].map(|k| format!("{k}={}", keys[k]));
            Some(Some(format!("{first} {}", kv.join(" "))))
        }),
        f if f.starts_with("blkio.throttle.") => per_device(&|_| {
            let v: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some((v != 0).then(|| format!("{first} {v}")))
        }),
        "io.weight" => {
            let v: u32 = line.strip_prefix("default ")?.trim().parse().ok()?;
            Some(format!("default {v}\n"))
        }
        "blkio.bfq.weight" => {
            let v: u32 = first.parse().ok()?;
            Some(format!("{v}\n"))
        }
        // As the kernel: a key given changes that key of the disk's line, the others stay.
        "io.cost.qos" => per_device(&|old| {
            let mut keys: Vec<(String, String)> = [
                ("enable", "0"),
                ("ctrl", "auto"),
                ("rpct", "0.00"),
                ("rlat", "25000"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .to_vec();
            for kv in old.into_iter().flat_map(|l| l.split_whitespace().skip(1)) {
                let (k, v) = kv.split_once('=')?;
                keys.iter_mut().find(|x| x.0 == k)?.1 = v.into();
            }
            for kv in line.split_whitespace().skip(1) {
                let (k, v) = kv.split_once('=')?;
                if k == "enable" && v != "0" && v != "1" {
                    return None;
                }
                keys.iter_mut().find(|x| x.0 == k)?.1 = v.into();
            }
            let kv: Vec<String> = keys.iter().map(|(k, v)| format!("{k}={v}")).collect();
            Some(Some(format!("{first} {}", kv.join(" "))))
        }),
        _ => None,
    }
}

fn not_found() -> io::Error {
    io::Error::from(io::ErrorKind::NotFound)
}

impl CgroupFiles for FakeHost {
    fn inode(&self, path: &Path) -> Option<u64> {
        self.entry(path).map(|e| e.ino)
    }

    fn entry(&self, path: &Path) -> Option<PathEntry> {
        let h = self.host();
        if let Some(&ino) = h.dirs.get(path) {
            return Some(PathEntry { ino, is_dir: true });
        }
        // Knob files' own inodes are never asked for.
        h.files.contains_key(path).then_some(PathEntry {
            ino: 1,
            is_dir: false,
        })
    }

    fn canonicalize(&self, path: &Path) -> io::Result<PathBuf> {
        // No links in the fake hierarchy.
        self.entry(path)
            .map(|_| path.to_path_buf())
            .ok_or_else(not_found)
    }

    fn read(&self, file: &Path) -> io::Result<String> {
        self.host().files.get(file).cloned().ok_or_else(not_found)
    }

    fn write(&self, file: &Path, line: &str) -> io::Result<()> {
        let mut h = self.host();
        if let Some(&errno) = h.rejects.get(file) {
            return Err(io::Error::from_raw_os_error(errno));
        }
        let text = h.files.get(file).ok_or_else(not_found)?;
        let name = file.file_name().unwrap_or_default().to_string_lossy();
        let text = take_line(&name, text, line)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
        h.files.insert(file.to_path_buf(), text);
        h.writes.push((file.to_path_buf(), line.to_string()));
        Ok(())
    }

    fn scan(&self, hierarchy: &IoHierarchy) -> HashMap<u64, String> {
        self.host()
            .dirs
            .iter()
            .filter_map(|(d, &ino)| {
                let rel = d.strip_prefix(&hierarchy.root).ok()?;
                Some((ino, format!("/{}", rel.display())))
            })
            .collect()
    }
}

impl BlockDevices for FakeHost {
    fn exists(&self, dev: &str) -> bool {
        !self.host().gone_devices.contains(dev)
    }

    fn is_partition(&self, dev: &str) -> bool {
        self.host().partitions.contains(dev)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knob_files_take_lines_as_the_kernel_does() {
        let io_max = take_line("io.max", "", "8:0 wbps=1000\n").unwrap();
        assert_eq!(io_max, "8:0 rbps=max wbps=1000 riops=max wiops=max\n");
        let io_max = take_line("io.max", &io_max, "8:0 riops=7\n").unwrap();
        assert_eq!(io_max, "8:0 rbps=max wbps=1000 riops=7 wiops=max\n");
        let io_max = take_line("io.max", &io_max, "8:16 rbps=5\n").unwrap();
        let io_max = take_line("io.max", &io_max, "8:0 wbps=max riops=max\n").unwrap();
        assert_eq!(io_max, "8:16 rbps=5 wbps=max riops=max wiops=max\n");
        assert_eq!(take_line("io.max", "", "8:0 wbps=fast\n"), None);
        let v1 = take_line("blkio.throttle.write_bps_device", "", "8:0 1000\n").unwrap();
        assert_eq!(v1, "8:0 1000\n");
        assert_eq!(
            take_line("blkio.throttle.write_bps_device", &v1, "8:0 0\n").unwrap(),
            ""
        );
        assert_eq!(
            take_line("io.weight", "default 100\n", "default 300\n").unwrap(),
            "default 300\n"
        );
        assert_eq!(take_line("cgroup.procs", "", "1\n"), None);
    }

    #[test]
    fn a_recreated_cgroup_is_another_inode_and_the_walk_finds_it() {
        let f = FakeHost::new(CgroupMode::V2);
        let old = f.add_cgroup("/a/b");
        let new = f.recreate_cgroup("/a/b");
        assert_ne!(old, new);
        let mut paths = f.cgroup_paths();
        paths.sort();
        assert_eq!(paths, ["/", "/a", "/a/b"]);
        assert_eq!(f.read_knob("/a/b", "io.max"), "");
    }
}
