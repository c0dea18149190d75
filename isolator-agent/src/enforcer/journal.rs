//! The journal: for every knob the agent holds, what identifies it (cgroup path and inode,
//! file, device, boot), the value it had before, and the values the agent wrote. One JSON
//! file, rewritten atomically (tmp, rename) before each write it covers, in a private
//! directory, under a lock so two agents cannot share it.
//!
//! Not fsynced: what it guards against is the agent dying (the page cache outlives it),
//! not the host (the limits it lists do not outlive a boot). An fsync on the disk the
//! agent is about to throttle waited behind the aggressor's queue: 1.4-1.8 s under a
//! 2 GB/s writer on the test disk, so a cut took effect a whole cycle late.

use std::{
    fs::File,
    io::Write,
    os::fd::AsRawFd,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use super::{knob::KnobRef, EnforceError};
use crate::events::private_file;

pub const DEFAULT_JOURNAL_DIR: &str = "/run/isolator";
pub(super) const JOURNAL_FILE: &str = "journal.json";
/// 2: knobs identified by cgroup inode and boot; compare-and-restore.
const JOURNAL_VERSION: u32 = 2;

/// One knob the agent holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalEntry {
    /// The cgroup, relative to the io/blkio hierarchy root ("/db").
    pub cgroup: String,
    /// Its inode (kernfs id): a cgroup re-created at the same path is another cgroup.
    pub cgroup_ino: u64,
    pub knob: KnobRef,
    /// The value before the agent's first write, put back at the end.
    pub original: String,
    /// Values of the agent's that the knob may hold now: the last one written and, while a
    /// write is under way, the next. Anything else there is someone else's.
    pub written: Vec<String>,
}

impl JournalEntry {
    pub fn holds_ours(&self, current: &str) -> bool {
        self.written.iter().any(|w| w == current)
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct JournalFile {
    version: u32,
    pid: u32,
    /// /proc/sys/kernel/random/boot_id when written: cgroups do not outlive a boot.
    boot_id: String,
    entries: Vec<JournalEntry>,
}

/// A journal left behind by an agent that did not stop cleanly.
pub struct LeftBehind {
    pub boot_id: String,
    pub entries: Vec<JournalEntry>,
}

pub struct Journal {
    dir: PathBuf,
    boot_id: String,
    entries: Vec<JournalEntry>,
    _lock: File,
}

/// This boot's id; empty when the kernel does not say (then every journal looks current).
pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Whether a file was last changed before this boot began (`btime` in /proc/stat).
fn written_before_this_boot(path: &Path) -> bool {
    let Some(btime) = std::fs::read_to_string("/proc/stat").ok().and_then(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("btime ")?.trim().parse::<u64>().ok())
    }) else {
        return false;
    };
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .is_some_and(|t| t.as_secs() < btime)
}

impl Journal {
    /// Creates the directory (0700; an existing one must be root's alone) and takes its
    /// lock. Does not read an existing journal: see [`Journal::take_left_behind`].
    pub fn open(dir: &Path) -> Result<Journal, EnforceError> {
        let jerr = |message: String| EnforceError::Journal {
            path: dir.to_path_buf(),
            message,
        };
        private_file::create_dir(dir)
            .map_err(|e| jerr(format!("{e}; pick another --journal-dir")))?;
        let lock = private_file::open(&dir.join("lock"), true).map_err(|e| {
            jerr(format!(
                "cannot open the lock ({e}); pick another --journal-dir"
            ))
        })?;
        // SAFETY: flock on a file descriptor we own.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(jerr(
                "another isolator holds its lock; stop that agent or give this one another --journal-dir".into(),
            ));
        }
        Ok(Journal {
            dir: dir.to_path_buf(),
            boot_id: boot_id(),
            entries: vec![],
            _lock: lock,
        })
    }

    pub fn path(&self) -> PathBuf {
        self.dir.join(JOURNAL_FILE)
    }

    pub fn boot_id(&self) -> &str {
        &self.boot_id
    }

    /// Reads a journal left behind (by a crash). A corrupt one is an error, never ignored.
    pub fn read_left_behind(&self) -> Result<Option<LeftBehind>, EnforceError> {
        let path = self.path();
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(EnforceError::Journal {
                    path,
                    message: format!("cannot read it ({e})"),
                })
            }
        };
        #[derive(Deserialize)]
        struct Version {
            version: u32,
        }
        let corrupt = |e: serde_json::Error| EnforceError::Journal {
            path: path.clone(),
            message: format!(
                "is corrupt ({e}); restore the limits it lists by hand, then delete it"
            ),
        };
        let v: Version = match serde_json::from_str(&text) {
            Ok(v) => v,
            // Not fsynced, a journal written just before a power cut may come back empty
            // or torn. Its cgroups went with that boot: closed, like any other boot's.
            Err(e) if written_before_this_boot(&path) => {
                tracing::warn!(path = %path.display(), error = %e, "a journal from before this boot does not parse: closed, its cgroups are gone");
                return Ok(Some(LeftBehind {
                    boot_id: "unreadable, from before this boot".into(),
                    entries: vec![],
                }));
            }
            Err(e) => return Err(corrupt(e)),
        };
        if v.version != JOURNAL_VERSION {
            return Err(EnforceError::Journal {
                path,
                message: format!(
                    "has version {} (this agent writes {JOURNAL_VERSION}); restore with the isolator that wrote it",
                    v.version
                ),
            });
        }
        let j: JournalFile = serde_json::from_str(&text).map_err(corrupt)?;
        Ok(Some(LeftBehind {
            boot_id: j.boot_id,
            entries: j.entries,
        }))
    }

    pub fn entries(&self) -> &[JournalEntry] {
        &self.entries
    }

    pub(super) fn entries_mut(&mut self) -> &mut Vec<JournalEntry> {
        &mut self.entries
    }

    pub(super) fn find(&self, ino: u64, knob: &KnobRef) -> Option<usize> {
        self.entries
            .iter()
            .position(|e| e.cgroup_ino == ino && &e.knob == knob)
    }

    /// Writes the journal as it is in memory (removes the file when it is empty).
    pub(super) fn persist(&self) -> Result<(), EnforceError> {
        let path = self.path();
        let jerr = |e: String| EnforceError::Journal {
            path: path.clone(),
            message: format!("cannot write it ({e}); nothing was changed"),
        };
        if self.entries.is_empty() {
            return match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(jerr(e.to_string())),
                _ => Ok(()),
            };
        }
        let tmp = self.dir.join(format!("{JOURNAL_FILE}.tmp"));
        let body = serde_json::to_vec_pretty(&JournalFile {
            version: JOURNAL_VERSION,
            pid: std::process::id(),
            boot_id: self.boot_id.clone(),
            entries: self.entries.clone(),
        })
        .map_err(|e| jerr(e.to_string()))?;
        let mut f = private_file::open(&tmp, false).map_err(|e| jerr(e.to_string()))?;
        f.write_all(&body).map_err(|e| jerr(e.to_string()))?;
        // No fsync: see the module's note.
        std::fs::rename(&tmp, &path).map_err(|e| jerr(e.to_string()))?;
        Ok(())
    }
}
