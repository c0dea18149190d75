//! Finds the cgroup hierarchy that holds the io (v2) or blkio (v1) controller and maps
//! cgroup ids (kernfs ids = directory inode numbers on 64-bit) to paths in it.

use std::{
    collections::HashMap,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupMode {
    /// blkio on a cgroup v1 hierarchy (legacy or hybrid hosts).
    V1,
    /// io on the cgroup v2 unified hierarchy.
    #[default]
    V2,
}

impl CgroupMode {
    /// As events spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            CgroupMode::V1 => "v1",
            CgroupMode::V2 => "v2",
        }
    }
}

impl std::fmt::Display for CgroupMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("cannot read {0}: {1}")]
    Read(String, std::io::Error),
    #[error("no cgroup hierarchy with the blkio (v1) or io (v2) controller is mounted; mount one (mount -t cgroup2 none /sys/fs/cgroup) and retry")]
    NoHierarchy,
}

/// The hierarchy the kernel's block cgroup controller is bound to.
#[derive(Debug, Clone, Serialize)]
pub struct IoHierarchy {
    pub mode: CgroupMode,
    pub root: PathBuf,
    /// v2 only: whether "io" is in the root's cgroup.subtree_control (limits need it).
    pub io_enabled: bool,
}

impl IoHierarchy {
    pub fn detect() -> Result<Self, CgroupError> {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
            .map_err(|e| CgroupError::Read("/proc/self/mountinfo".into(), e))?;
        Self::from_mountinfo(&mountinfo, |p| std::fs::read_to_string(p).ok())
    }

    /// `read` reads a cgroupfs file (injected for tests).
    pub fn from_mountinfo(
        mountinfo: &str,
        read: impl Fn(&Path) -> Option<String>,
    ) -> Result<Self, CgroupError> {
        let mut v2_root = None;
        for line in mountinfo.lines() {
            let Some((pre, post)) = line.split_once(" - ") else {
                continue;
            };
            let pre: Vec<&str> = pre.split(' ').collect();
            let post: Vec<&str> = post.split(' ').collect();
            if pre.len() < 5 || post.len() < 3 {
                continue;
            }
            let mount_point = unescape(pre[4]);
            match post[0] {
                // A v1 blkio mount wins: the controller is bound there, not on v2.
                "cgroup" if post[2].split(',').any(|o| o == "blkio") => {
                    return Ok(IoHierarchy {
                        mode: CgroupMode::V1,
                        root: mount_point,
                        io_enabled: true,
                    })
                }
                "cgroup2" if v2_root.is_none() => v2_root = Some(mount_point),
                _ => {}
            }
        }
        let root = v2_root.ok_or(CgroupError::NoHierarchy)?;
        let has = |file: &str| {
            read(&root.join(file))
                .map(|s| s.split_whitespace().any(|c| c == "io"))
                .unwrap_or(false)
        };
        Ok(IoHierarchy {
            mode: CgroupMode::V2,
            io_enabled: has("cgroup.subtree_control"),
            // Without "io" in cgroup.controllers the kernel still charges the v2 root.
            root,
        })
    }

    /// Walks the hierarchy: cgroup id -> path relative to the root ("/" for the root).
    pub fn scan(&self) -> HashMap<u64, String> {
        let mut out = HashMap::new();
        let mut stack = vec![(self.root.clone(), String::from("/"))];
        while let Some((dir, rel)) = stack.pop() {
            let Ok(meta) = std::fs::metadata(&dir) else {
                continue; // removed while walking
            };
            out.insert(meta.ino(), rel.clone());
            let Ok(rd) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in rd.flatten() {
                if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    let child_rel = if rel == "/" {
                        format!("/{name}")
                    } else {
                        format!("{rel}/{name}")
                    };
                    stack.push((entry.path(), child_rel));
                }
            }
        }
        out
    }

    /// Absolute directory of a cgroup path relative to the root.
    pub fn dir_of(&self, rel: &str) -> PathBuf {
        self.root.join(rel.trim_start_matches('/'))
    }
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(s: &str) -> PathBuf {
    let mut out = Vec::with_capacity(s.len());
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| c.is_ascii_digit()) {
            let v = u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 4]).unwrap(), 8);
            if let Ok(v) = v {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    PathBuf::from(String::from_utf8_lossy(&out).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
25 1 254:0 / / rw,relatime - ext4 /dev/vda rw
30 25 0:26 / /sys/fs/cgroup ro - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
32 30 0:28 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu
33 30 0:29 / /sys/fs/cgroup/blkio rw - cgroup cgroup rw,blkio
";
    const UNIFIED: &str = "\
25 1 254:0 / / rw,relatime - ext4 /dev/vda rw
31 25 0:27 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate
";

    #[test]
    fn hybrid_host_uses_v1_blkio() {
        let h = IoHierarchy::from_mountinfo(HYBRID, |_| None).unwrap();
        assert_eq!(h.mode, CgroupMode::V1);
        assert_eq!(h.root, PathBuf::from("/sys/fs/cgroup/blkio"));
    }

    #[test]
    fn unified_host_uses_v2() {
        let h = IoHierarchy::from_mountinfo(UNIFIED, |p| {
            Some(if p.ends_with("cgroup.controllers") {
                "cpuset cpu io memory pids".into()
            } else {
                "cpu io".into()
            })
        })
        .unwrap();
        assert_eq!(h.mode, CgroupMode::V2);
        assert!(h.io_enabled);
        assert_eq!(h.root, PathBuf::from("/sys/fs/cgroup"));
    }

    #[test]
    fn no_cgroups_is_an_error() {
        let e = IoHierarchy::from_mountinfo("1 0 0:1 / / rw - ext4 x rw\n", |_| None);
        assert!(matches!(e, Err(CgroupError::NoHierarchy)));
    }

    #[test]
    fn mountinfo_octal_escapes() {
        assert_eq!(unescape(r"/a\040b"), PathBuf::from("/a b"));
        assert_eq!(unescape(r"/a\b"), PathBuf::from(r"/a\b"));
    }

    mod props {
        use proptest::prelude::*;

        use super::super::*;

        /// What the kernel writes for a mount point (show_mountinfo's mangle).
        fn escape(s: &str) -> String {
            s.chars()
                .map(|c| match c {
                    ' ' | '\t' | '\n' | '\\' => format!("\\{:03o}", c as u32),
                    c => c.to_string(),
                })
                .collect()
        }

        /// mountinfo lines, right and wrong: fields of any text, the separator or not,
        /// cgroup and cgroup2 mounts with any options.
        fn mountinfo_line() -> impl Strategy<Value = String> {
            let field = prop_oneof!["\\PC{0,12}", "[ -~]{0,12}", Just(String::new())];
            let fstype = prop::sample::select(vec!["cgroup", "cgroup2", "ext4", "tmpfs", ""]);
            let options = prop_oneof![
                Just("rw,blkio".to_string()),
                Just("rw,cpu".to_string()),
                Just("blkio".to_string()),
                "[a-z,]{0,16}",
            ];
            prop_oneof![
                (
                    prop::collection::vec(field.clone(), 0..8),
                    prop::sample::select(vec![" - ", " -", "- ", " "]),
                    fstype,
                    field.clone(),
                    options,
                    prop::collection::vec(field, 0..3),
                )
                    .prop_map(|(pre, sep, ty, src, opts, rest)| {
                        format!("{}{sep}{ty} {src} {opts} {}", pre.join(" "), rest.join(" "))
                    }),
                any::<String>(),
            ]
        }

        proptest! {
            #![proptest_config(crate::proptest_budget(1000))]

            #[test]
            fn hierarchy_of_any_mountinfo(
                text in any::<String>(),
                controllers in any::<Option<String>>(),
            ) {
                let _ = IoHierarchy::from_mountinfo(&text, |_| controllers.clone());
            }

            #[test]
            fn hierarchy_of_mountinfo_like_text(
                lines in prop::collection::vec(mountinfo_line(), 0..8),
            ) {
                let text = lines.join("\n");
                if IoHierarchy::from_mountinfo(&text, |_| Some("io".into())).is_ok() {
                    // Only a cgroup mount names a hierarchy.
                    prop_assert!(text.lines().any(|l| l.contains(" - cgroup")), "{text}");
                }
            }

            #[test]
            fn unescape_of_any_text(s in any::<String>()) {
                let _ = unescape(&s);
            }

            /// A mount point the kernel escaped comes back as it was.
            #[test]
            fn unescape_undoes_the_kernels_escapes(
                s in prop_oneof!["\\PC{0,24}", "[ \t\n\\\\0-9a]{0,24}"],
            ) {
                prop_assert_eq!(unescape(&escape(&s)), PathBuf::from(&s));
            }
        }
    }
}
