//! Writes limits into cgroupfs (v1 `blkio.throttle.*` / `blkio.bfq.weight`, v2 `io.max` /
//! `io.weight`) and journals the original value of every knob before its first write, so
//! that every limit can be restored: on stop, on the next start after a crash, or by
//! `isolator restore`.

use std::{
    fs::{File, OpenOptions},
    io::Write,
    os::{fd::AsRawFd, unix::fs::OpenOptionsExt},
    path::{Path, PathBuf},
};

use isolator_common::{dev_major, dev_minor};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::{cgroupfs::CgroupMode, policy::Knob};

pub const DEFAULT_JOURNAL_DIR: &str = "/run/isolator";
const JOURNAL_FILE: &str = "journal.json";
const JOURNAL_VERSION: u32 = 1;

/// What can be set on a cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setting {
    /// A per-device limit; `None` is unlimited.
    Limit {
        dev: u32,
        knob: Knob,
        value: Option<u64>,
    },
    /// The cgroup's default weight.
    Weight(u32),
}

#[derive(Debug, Error)]
pub enum EnforceError {
    #[error("cgroup {0} is gone")]
    CgroupGone(PathBuf),
    #[error("{file}: the kernel rejected '{line}' ({errno}); {hint}")]
    Rejected {
        file: PathBuf,
        line: String,
        errno: String,
        hint: &'static str,
    },
    #[error("{0}: not available ({1}); {2}")]
    Unavailable(PathBuf, String, &'static str),
    #[error("journal {path}: {message}")]
    Journal { path: PathBuf, message: String },
    #[error("{dev} is a partition; limits go on whole disks only")]
    Partition { dev: String },
}

/// One knob touched, with the line that puts it back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalEntry {
    pub file: PathBuf,
    /// What the knob is, for people: "254:0 wbps", "weight".
    pub knob: String,
    pub original: String,
    /// Written to `file` to restore `original`.
    pub restore: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct JournalFile {
    version: u32,
    pid: u32,
    entries: Vec<JournalEntry>,
}

/// Outcome of restoring one entry.
#[derive(Debug, Clone, Serialize)]
pub struct Restored {
    pub file: String,
    pub knob: String,
    pub value: String,
    /// "restored", "gone" (the cgroup no longer exists) or "failed: ...".
    pub result: String,
}

/// The journal: one JSON file, rewritten atomically (tmp, fsync, rename, fsync dir)
/// before any knob is first written, and a lock so two agents cannot share it.
pub struct Journal {
    dir: PathBuf,
    entries: Vec<JournalEntry>,
    _lock: File,
}

impl Journal {
    /// Takes the lock. Does not read an existing journal: see [`Journal::recover`].
    pub fn open(dir: &Path) -> Result<Journal, EnforceError> {
        let jerr = |message: String| EnforceError::Journal {
            path: dir.to_path_buf(),
            message,
        };
        std::fs::create_dir_all(dir).map_err(|e| {
            jerr(format!(
                "cannot create it ({e}); pick a writable --journal-dir"
            ))
        })?;
        let lock_path = dir.join("lock");
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&lock_path)
            .map_err(|e| {
                jerr(format!(
                    "cannot open the lock ({e}); pick a writable --journal-dir"
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
            entries: vec![],
            _lock: lock,
        })
    }

    pub fn path(&self) -> PathBuf {
        self.dir.join(JOURNAL_FILE)
    }

    /// Reads a journal left behind (by a crash). A corrupt one is an error, never ignored.
    pub fn read_left_behind(&self) -> Result<Option<Vec<JournalEntry>>, EnforceError> {
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
        let j: JournalFile = serde_json::from_str(&text).map_err(|e| EnforceError::Journal {
            path: path.clone(),
            message: format!(
                "is corrupt ({e}); restore the limits it lists by hand, then delete it"
            ),
        })?;
        if j.version != JOURNAL_VERSION {
            return Err(EnforceError::Journal {
                path,
                message: format!(
                    "has version {} (this agent writes {JOURNAL_VERSION}); restore with the isolator that wrote it",
                    j.version
                ),
            });
        }
        Ok(Some(j.entries))
    }

    /// Restores a journal left behind and removes it. Entries that fail stay in it.
    pub fn recover(&mut self) -> Result<Vec<Restored>, EnforceError> {
        let Some(entries) = self.read_left_behind()? else {
            return Ok(vec![]);
        };
        self.entries = entries;
        Ok(self.restore_all())
    }

    fn contains(&self, file: &Path, knob: &str) -> bool {
        self.entries
            .iter()
            .any(|e| e.file == file && e.knob == knob)
    }

    fn record(&mut self, e: JournalEntry) -> Result<(), EnforceError> {
        self.entries.push(e);
        if let Err(err) = self.persist() {
            self.entries.pop();
            return Err(err);
        }
        Ok(())
    }

    fn persist(&self) -> Result<(), EnforceError> {
        let path = self.path();
        let jerr = |e: std::io::Error| EnforceError::Journal {
            path: path.clone(),
            message: format!("cannot write it ({e}); nothing was changed"),
        };
        if self.entries.is_empty() {
            return match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(jerr(e)),
                _ => Ok(()),
            };
        }
        let tmp = self.dir.join(format!("{JOURNAL_FILE}.tmp"));
        let body = serde_json::to_vec_pretty(&JournalFile {
            version: JOURNAL_VERSION,
            pid: std::process::id(),
            entries: self.entries.clone(),
        })
        .expect("journal serializes");
        let mut f = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(jerr)?;
        f.write_all(&body).map_err(jerr)?;
        f.sync_all().map_err(jerr)?;
        std::fs::rename(&tmp, &path).map_err(jerr)?;
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(jerr)?;
        Ok(())
    }

    /// Writes every original value back, newest first; keeps what failed.
    pub fn restore_all(&mut self) -> Vec<Restored> {
        let mut out = vec![];
        let mut kept = vec![];
        for e in self.entries.iter().rev() {
            let result = match write_line(&e.file, &e.restore) {
                Ok(()) => "restored".to_string(),
                Err(EnforceError::CgroupGone(_)) => "gone".to_string(),
                Err(err) => {
                    kept.push(e.clone());
                    format!("failed: {err}")
                }
            };
            out.push(Restored {
                file: e.file.display().to_string(),
                knob: e.knob.clone(),
                value: e.original.clone(),
                result,
            });
        }
        kept.reverse();
        self.entries = kept;
        self.persist_into(&mut out);
        out
    }

    /// Writes the journal after entries left it; a failure is one more line of the report.
    fn persist_into(&self, out: &mut Vec<Restored>) {
        if let Err(e) = self.persist() {
            out.push(Restored {
                file: self.path().display().to_string(),
                knob: "journal".into(),
                value: String::new(),
                result: format!("failed: {e}"),
            });
        }
    }

    /// Closes the entries of knobs in `dir`, a cgroup that vanished (or was re-created:
    /// the new one never carried our limits). Nothing is written.
    pub fn release(&mut self, dir: &Path) -> Vec<Restored> {
        let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.entries)
            .into_iter()
            .partition(|e| e.file.parent() == Some(dir));
        self.entries = kept;
        let mut out: Vec<Restored> = gone
            .into_iter()
            .map(|e| Restored {
                file: e.file.display().to_string(),
                knob: e.knob,
                value: e.original,
                result: "gone".into(),
            })
            .collect();
        if !out.is_empty() {
            self.persist_into(&mut out);
        }
        out
    }

    pub fn entries(&self) -> &[JournalEntry] {
        &self.entries
    }
}

fn errno_name(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::EINVAL) => "EINVAL".into(),
        Some(libc::ENODEV) => "ENODEV".into(),
        Some(libc::EBUSY) => "EBUSY".into(),
        Some(libc::EPERM) => "EPERM".into(),
        Some(libc::EACCES) => "EACCES".into(),
        _ => e.to_string(),
    }
}

/// One write(2) of one line: the kernel applies or rejects it whole.
fn write_line(file: &Path, line: &str) -> Result<(), EnforceError> {
    // O_TRUNC as a shell's `>` does; kernfs ignores it.
    let r = OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(file)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    match r {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let dir = file.parent().unwrap_or(file).to_path_buf();
            if dir.exists() {
                Err(EnforceError::Unavailable(
                    file.to_path_buf(),
                    "no such file".into(),
                    "this kernel or I/O scheduler does not offer the knob",
                ))
            } else {
                Err(EnforceError::CgroupGone(dir))
            }
        }
        Err(e) => Err(EnforceError::Rejected {
            file: file.to_path_buf(),
            line: line.trim().to_string(),
            errno: errno_name(&e),
            hint: match e.raw_os_error() {
                Some(libc::ENODEV) => "the device went away or takes no limits",
                Some(libc::EINVAL) => "the value or device is not accepted here",
                Some(libc::EBUSY) => {
                    "the kernel is busy with this knob; it will be retried next cycle"
                }
                _ => "check permissions and the cgroup controller",
            },
        }),
    }
}

fn read_file(file: &Path) -> Result<String, EnforceError> {
    std::fs::read_to_string(file).map_err(|e| {
        let dir = file.parent().unwrap_or(file).to_path_buf();
        if e.kind() == std::io::ErrorKind::NotFound && !dir.exists() {
            EnforceError::CgroupGone(dir)
        } else {
            EnforceError::Unavailable(
                file.to_path_buf(),
                e.to_string(),
                "this kernel or I/O scheduler does not offer the knob",
            )
        }
    })
}

fn dev_str(dev: u32) -> String {
    format!("{}:{}", dev_major(dev), dev_minor(dev))
}

/// The file, the current value and the lines to set a value / restore the current one.
struct KnobIo {
    file: PathBuf,
    name: String,
    current: String,
}

/// The result of one applied setting.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub file: PathBuf,
    pub old: String,
    pub new: String,
}

/// Cgroup-mode specific file names and syntax.
pub struct Enforcer {
    pub mode: CgroupMode,
    pub dry_run: bool,
    journal: Option<Journal>,
}

impl Enforcer {
    /// `journal` is None only in dry-run mode.
    pub fn new(mode: CgroupMode, journal: Option<Journal>) -> Enforcer {
        Enforcer {
            mode,
            dry_run: journal.is_none(),
            journal,
        }
    }

    fn knob_io(&self, cgroup: &Path, s: Setting) -> Result<KnobIo, EnforceError> {
        let v2 = self.mode == CgroupMode::V2;
        match s {
            Setting::Limit { dev, knob, .. } => {
                let d = dev_str(dev);
                let file = if v2 {
                    cgroup.join("io.max")
                } else {
                    cgroup.join(match knob {
                        Knob::Rbps => "blkio.throttle.read_bps_device",
                        Knob::Wbps => "blkio.throttle.write_bps_device",
                        Knob::Riops => "blkio.throttle.read_iops_device",
                        Knob::Wiops => "blkio.throttle.write_iops_device",
                    })
                };
                let text = read_file(&file)?;
                let line = text
                    .lines()
                    .find(|l| l.split_whitespace().next() == Some(d.as_str()));
                let current = if v2 {
                    line.and_then(|l| {
                        l.split_whitespace()
                            .filter_map(|kv| kv.split_once('='))
                            .find(|(k, _)| *k == knob.name())
                            .map(|(_, v)| v.to_string())
                    })
                    .unwrap_or_else(|| "max".into())
                } else {
                    line.and_then(|l| l.split_whitespace().nth(1).map(str::to_string))
                        .unwrap_or_else(|| "0".into())
                };
                Ok(KnobIo {
                    file,
                    name: format!("{d} {}", knob.name()),
                    current,
                })
            }
            Setting::Weight(_) => {
                let file = cgroup.join(if v2 { "io.weight" } else { "blkio.bfq.weight" });
                let text = read_file(&file)?;
                // "default 100" (v2, newer v1) or "100" (older bfq).
                let current = text
                    .lines()
                    .find_map(|l| {
                        let mut it = l.split_whitespace();
                        match (it.next(), it.next()) {
                            (Some("default"), Some(v)) => Some(v.to_string()),
                            (Some(v), None) if v.parse::<u32>().is_ok() => Some(v.to_string()),
                            _ => None,
                        }
                    })
                    .unwrap_or_else(|| "100".into());
                Ok(KnobIo {
                    file,
                    name: "weight".into(),
                    current,
                })
            }
        }
    }

    fn line_for(&self, s: Setting, value: &str) -> String {
        let v2 = self.mode == CgroupMode::V2;
        match s {
            Setting::Limit { dev, knob, .. } if v2 => {
                format!("{} {}={value}\n", dev_str(dev), knob.name())
            }
            Setting::Limit { dev, .. } => format!("{} {value}\n", dev_str(dev)),
            Setting::Weight(_) if v2 => format!("default {value}\n"),
            Setting::Weight(_) => format!("{value}\n"),
        }
    }

    fn value_text(&self, s: Setting) -> String {
        match s {
            Setting::Limit { value: Some(v), .. } => v.to_string(),
            Setting::Limit { value: None, .. } if self.mode == CgroupMode::V2 => "max".into(),
            Setting::Limit { value: None, .. } => "0".into(),
            Setting::Weight(w) => w.to_string(),
        }
    }

    /// Applies one setting to one cgroup directory: journal first, then one write.
    pub fn apply(&mut self, cgroup: &Path, s: Setting) -> Result<Change, EnforceError> {
        if let Setting::Limit { dev, .. } = s {
            let part = PathBuf::from(format!("/sys/dev/block/{}/partition", dev_str(dev)));
            if part.exists() {
                return Err(EnforceError::Partition { dev: dev_str(dev) });
            }
        }
        let io = self.knob_io(cgroup, s)?;
        let new = self.value_text(s);
        let change = Change {
            file: io.file.clone(),
            old: io.current.clone(),
            new: new.clone(),
        };
        if self.dry_run {
            return Ok(change);
        }
        let restore = self.line_for(s, &io.current);
        let line = self.line_for(s, &new);
        let journal = self.journal.as_mut().expect("journal outside dry-run");
        if !journal.contains(&io.file, &io.name) {
            journal.record(JournalEntry {
                file: io.file.clone(),
                knob: io.name.clone(),
                original: io.current.clone(),
                restore,
            })?;
        }
        write_line(&io.file, &line)?;
        Ok(change)
    }

    /// Closes the journal entries of a vanished cgroup directory.
    pub fn release(&mut self, dir: &Path) -> Vec<Restored> {
        self.journal
            .as_mut()
            .map(|j| j.release(dir))
            .unwrap_or_default()
    }

    /// Puts every touched knob back.
    pub fn restore_all(&mut self) -> Vec<Restored> {
        self.journal
            .as_mut()
            .map(|j| j.restore_all())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_cgroup(mode: CgroupMode) -> (tempdir::Dir, PathBuf) {
        let t = tempdir::Dir::new();
        let cg = t.0.join("cg");
        std::fs::create_dir_all(&cg).unwrap();
        if mode == CgroupMode::V2 {
            std::fs::write(cg.join("io.max"), "").unwrap();
            std::fs::write(cg.join("io.weight"), "default 100\n").unwrap();
        } else {
            for f in ["read_bps", "write_bps", "read_iops", "write_iops"] {
                std::fs::write(cg.join(format!("blkio.throttle.{f}_device")), "").unwrap();
            }
        }
        (t, cg)
    }

    mod tempdir {
        pub struct Dir(pub std::path::PathBuf);
        impl Dir {
            pub fn new() -> Dir {
                use std::sync::atomic::{AtomicU32, Ordering};
                static N: AtomicU32 = AtomicU32::new(0);
                let p = std::env::temp_dir().join(format!(
                    "isolator-enforcer-test-{}-{}",
                    std::process::id(),
                    N.fetch_add(1, Ordering::Relaxed)
                ));
                std::fs::create_dir_all(&p).unwrap();
                Dir(p)
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    #[test]
    fn journals_before_writing_and_restores_in_both_syntaxes() {
        for mode in [CgroupMode::V1, CgroupMode::V2] {
            let (t, cg) = fake_cgroup(mode);
            let j = Journal::open(&t.0.join("j")).unwrap();
            let mut e = Enforcer::new(mode, Some(j));
            let dev = isolator_common::kernel_dev(254, 0);
            let s = Setting::Limit {
                dev,
                knob: Knob::Wbps,
                value: Some(1000),
            };
            let c = e.apply(&cg, s).unwrap();
            let (file, old) = if mode == CgroupMode::V2 {
                ("io.max", "max")
            } else {
                ("blkio.throttle.write_bps_device", "0")
            };
            assert_eq!(c.old, old);
            assert_eq!(c.file, cg.join(file));
            let written = std::fs::read_to_string(cg.join(file)).unwrap();
            let want = if mode == CgroupMode::V2 {
                "254:0 wbps=1000\n"
            } else {
                "254:0 1000\n"
            };
            assert_eq!(written, want);
            // The journal is on disk before anything else happens.
            let text = std::fs::read_to_string(t.0.join("j/journal.json")).unwrap();
            assert!(text.contains("254:0 wbps"), "{text}");
            // A second write to the same knob keeps the first original.
            e.apply(
                &cg,
                Setting::Limit {
                    dev,
                    knob: Knob::Wbps,
                    value: Some(5),
                },
            )
            .unwrap();
            assert_eq!(e.journal.as_ref().unwrap().entries().len(), 1);
            let r = e.restore_all();
            assert_eq!(r.len(), 1);
            assert_eq!(r[0].result, "restored");
            let back = std::fs::read_to_string(cg.join(file)).unwrap();
            let want = if mode == CgroupMode::V2 {
                "254:0 wbps=max\n"
            } else {
                "254:0 0\n"
            };
            assert_eq!(back, want);
            assert!(!t.0.join("j/journal.json").exists());
        }
    }

    #[test]
    fn a_crash_leaves_a_journal_the_next_start_restores() {
        let (t, cg) = fake_cgroup(CgroupMode::V2);
        let dir = t.0.join("j");
        {
            let mut e = Enforcer::new(CgroupMode::V2, Some(Journal::open(&dir).unwrap()));
            e.apply(&cg, Setting::Weight(300)).unwrap();
            // Dropped without restore: as after SIGKILL.
        }
        assert_eq!(
            std::fs::read_to_string(cg.join("io.weight")).unwrap(),
            "default 300\n"
        );
        let mut j = Journal::open(&dir).unwrap();
        let r = j.recover().unwrap();
        assert_eq!(r[0].result, "restored");
        assert_eq!(
            std::fs::read_to_string(cg.join("io.weight")).unwrap(),
            "default 100\n"
        );
        assert!(!dir.join("journal.json").exists());
    }

    #[test]
    fn corrupt_journal_and_second_agent_are_errors() {
        let t = tempdir::Dir::new();
        let dir = t.0.join("j");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("journal.json"), "{ not json").unwrap();
        let mut j = Journal::open(&dir).unwrap();
        let e = j.recover().unwrap_err().to_string();
        assert!(e.contains("corrupt") && e.contains("by hand"), "{e}");
        let e = Journal::open(&dir).err().unwrap().to_string();
        assert!(e.contains("another isolator"), "{e}");
    }

    #[test]
    fn a_vanished_cgroup_is_gone_not_a_crash() {
        let (t, cg) = fake_cgroup(CgroupMode::V1);
        let mut e = Enforcer::new(CgroupMode::V1, Some(Journal::open(&t.0.join("j")).unwrap()));
        let dev = isolator_common::kernel_dev(254, 0);
        e.apply(
            &cg,
            Setting::Limit {
                dev,
                knob: Knob::Rbps,
                value: Some(1),
            },
        )
        .unwrap();
        std::fs::remove_dir_all(&cg).unwrap();
        let err = e
            .apply(
                &cg,
                Setting::Limit {
                    dev,
                    knob: Knob::Wbps,
                    value: Some(1),
                },
            )
            .unwrap_err();
        assert!(matches!(err, EnforceError::CgroupGone(_)), "{err}");
        let r = e.restore_all();
        assert_eq!(r[0].result, "gone");
    }

    #[test]
    fn dry_run_writes_nothing() {
        let (_t, cg) = fake_cgroup(CgroupMode::V2);
        let mut e = Enforcer::new(CgroupMode::V2, None);
        let dev = isolator_common::kernel_dev(254, 0);
        let c = e
            .apply(
                &cg,
                Setting::Limit {
                    dev,
                    knob: Knob::Riops,
                    value: Some(7),
                },
            )
            .unwrap();
        assert_eq!((c.old.as_str(), c.new.as_str()), ("max", "7"));
        assert_eq!(std::fs::read_to_string(cg.join("io.max")).unwrap(), "");
    }
}
