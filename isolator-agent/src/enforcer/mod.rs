//! Writes limits into cgroupfs (v1 `blkio.throttle.*` / `blkio.bfq.weight`, v2 `io.max` /
//! `io.weight`) and puts them back. Every knob's original value is journaled before the
//! first write; every value the agent writes is journaled before it is written, so that at
//! the end (stop, the next start after a crash, `isolator restore`) a knob is put back only
//! if it still holds the agent's value: a value someone else set since is theirs and stays.
//! Every file it touches (cgroupfs, sysfs) goes through [`CgroupFiles`] and [`BlockDevices`];
//! the journal stays on real files in its own directory.

#[cfg(test)]
pub(crate) mod fake_host;
mod host_files;
mod host_lock;
mod journal;
mod knob;
mod slice_phase;

use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
    time::Instant,
};

use serde::Serialize;
use thiserror::Error;

use self::slice_phase::SlicePhases;
pub use self::{
    host_files::{BlockDevices, CgroupFiles, HostCgroupFiles, PathEntry, SysfsBlockDevices},
    host_lock::HostLock,
    journal::{boot_id, Journal, JournalEntry, DEFAULT_JOURNAL_DIR},
    knob::KnobRef,
};
use crate::{
    identify::cgroupfs::{CgroupMode, IoHierarchy},
    policy::Knob,
};

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
    /// iocost switched on for a disk (the root cgroup's `io.cost.qos` `enable=1`): a
    /// host-wide change, made only on the config's explicit `[iocost]`, journaled and put
    /// back (to what the journal holds) like a limit.
    IocostOn { dev: u32 },
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
    #[error("{file} ({knob}) was set to {theirs} by someone else after the agent wrote {ours}; it is theirs now: the agent leaves this knob alone until it restarts")]
    ChangedByOther {
        file: PathBuf,
        knob: String,
        ours: String,
        theirs: String,
    },
    #[error("{message}")]
    HostLock { message: String },
    #[error("cannot read {0} ({1}); check permissions and the cgroup controller")]
    Read(PathBuf, std::io::Error),
}

/// Outcome of putting one knob back.
#[derive(Debug, Clone, Serialize)]
pub struct Restored {
    pub file: String,
    pub knob: String,
    /// The original value.
    pub value: String,
    /// "restored"; "changed_by_other" (someone set `current` since: left as it is); "gone"
    /// (the cgroup no longer exists); "recreated" (another cgroup at its path now);
    /// "device_gone"; "other_boot" (a journal from before a reboot); "refused: ..." (a
    /// journal entry naming a file the agent never writes); "failed: ..." (kept, retried).
    pub result: String,
    /// What the knob held when it was looked at, where that explains the result.
    pub current: Option<String>,
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
fn write_line(files: &dyn CgroupFiles, file: &Path, line: &str) -> Result<(), EnforceError> {
    match files.write(file, line) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(missing(files, file)),
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

/// A knob file that is not there: its cgroup is gone, or the kernel does not offer it.
fn missing(files: &dyn CgroupFiles, file: &Path) -> EnforceError {
    let dir = file.parent().unwrap_or(file).to_path_buf();
    if files.inode(&dir).is_some() {
        EnforceError::Unavailable(
            file.to_path_buf(),
            "no such file".into(),
            "this kernel or I/O scheduler does not offer the knob",
        )
    } else {
        EnforceError::CgroupGone(dir)
    }
}

fn read_file(files: &dyn CgroupFiles, file: &Path) -> Result<String, EnforceError> {
    files.read(file).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            missing(files, file)
        } else {
            EnforceError::Read(file.to_path_buf(), e)
        }
    })
}

fn dev_str(dev: u32) -> String {
    crate::identify::disks::dev_text(dev)
}

/// The result of one applied setting.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub file: PathBuf,
    pub old: String,
    pub new: String,
}

/// Where a journaled knob's cgroup is now.
enum Located {
    At(PathBuf),
    Gone,
    /// Another cgroup (another inode) at its path, and it is nowhere else.
    Recreated,
    Refused(String),
}

/// A write planned in [`Enforcer::apply_all`], after its journal entry is persisted.
struct PlannedWrite {
    slot: usize,
    file: PathBuf,
    ino: u64,
}

pub struct Enforcer {
    hierarchy: IoHierarchy,
    pub dry_run: bool,
    journal: Option<Journal>,
    /// Knobs (cgroup inode, knob) someone else changed while the agent held them: theirs,
    /// never written again by this run.
    yielded: HashSet<(u64, KnobRef)>,
    files: Box<dyn CgroupFiles>,
    devices: Box<dyn BlockDevices>,
    /// When each capped cgroup's limits were written, to write the next one on its device
    /// out of phase (see `slice_phase`); None unless asked for
    /// ([`Enforcer::with_slice_phases`]): tests on temporary files should not sleep.
    phases: Option<SlicePhases>,
    /// Held while enforcing; released only after [`Drop`] restored what is left.
    _host: Option<HostLock>,
}

impl Enforcer {
    /// `journal` is None only in dry-run mode.
    pub fn new(hierarchy: IoHierarchy, journal: Option<Journal>) -> Enforcer {
        Enforcer {
            hierarchy,
            dry_run: journal.is_none(),
            journal,
            yielded: HashSet::new(),
            files: Box::new(HostCgroupFiles),
            devices: Box::new(SysfsBlockDevices),
            phases: None,
            _host: None,
        }
    }

    /// The same enforcer on other host files (an in-memory host, for tests).
    pub fn with_host_files(
        mut self,
        files: Box<dyn CgroupFiles>,
        devices: Box<dyn BlockDevices>,
    ) -> Enforcer {
        self.files = files;
        self.devices = devices;
        self
    }

    /// The cgroup files this enforcer reads and writes.
    pub fn files(&self) -> &dyn CgroupFiles {
        self.files.as_ref()
    }

    /// Writes limits out of phase with the other throttled cgroups' on their device (see
    /// `slice_phase`): writes wait at most one throttle slice a second in all.
    pub fn with_slice_phases(mut self) -> Enforcer {
        self.phases = Some(SlicePhases::new(Instant::now()));
        self
    }

    /// Holds the host's enforcement lock for as long as this enforcer lives.
    pub fn with_host_lock(mut self, lock: HostLock) -> Enforcer {
        self._host = Some(lock);
        self
    }

    pub fn mode(&self) -> CgroupMode {
        self.hierarchy.mode
    }

    fn value_text(&self, s: Setting) -> String {
        match s {
            Setting::Limit { value: Some(v), .. } => v.to_string(),
            Setting::Limit { value: None, .. } if self.mode() == CgroupMode::V2 => "max".into(),
            Setting::Limit { value: None, .. } => "0".into(),
            Setting::Weight(w) => w.to_string(),
            Setting::IocostOn { .. } => "1".into(),
        }
    }

    /// Applies one setting to one cgroup (a path relative to the hierarchy root).
    pub fn apply(&mut self, cgroup: &str, s: Setting) -> Result<Change, EnforceError> {
        self.apply_all(&[cgroup.to_string()], s)
            .pop()
            .expect("one result per cgroup")
    }

    /// Applies one setting to each cgroup: every knob's journal entry (original value, the
    /// value about to be written) is persisted once for all, then each is written with one
    /// write(2). A knob whose value is neither its original nor the agent's is someone
    /// else's: it is not written, now or later in this run.
    pub fn apply_all(
        &mut self,
        cgroups: &[String],
        s: Setting,
    ) -> Vec<Result<Change, EnforceError>> {
        if let Setting::Limit { dev, .. } | Setting::IocostOn { dev } = s {
            if self.devices.is_partition(&dev_str(dev)) {
                return cgroups
                    .iter()
                    .map(|_| Err(EnforceError::Partition { dev: dev_str(dev) }))
                    .collect();
            }
        }
        let knob = KnobRef::of(self.mode(), s);
        let new = self.value_text(s);
        let line = knob.line(&new).expect("the agent's own values are plain");
        let mut results: Vec<Result<Change, EnforceError>> = Vec::with_capacity(cgroups.len());
        let mut planned = vec![];
        let mut journal_changed = false;
        for (slot, rel) in cgroups.iter().enumerate() {
            let dir = self.hierarchy.dir_of(rel);
            let file = knob.path_in(&dir);
            let read = self
                .files
                .inode(&dir)
                .ok_or_else(|| EnforceError::CgroupGone(dir.clone()))
                .and_then(|ino| Ok((ino, knob.parse(&read_file(self.files.as_ref(), &file)?))));
            let (ino, current) = match read {
                Ok(v) => v,
                Err(e) => {
                    results.push(Err(e));
                    continue;
                }
            };
            let change = Change {
                file: file.clone(),
                old: current.clone(),
                new: new.clone(),
            };
            let Some(journal) = self.journal.as_mut() else {
                results.push(Ok(change));
                continue;
            };
            let id = (ino, knob.clone());
            if self.yielded.contains(&id) {
                results.push(Err(EnforceError::ChangedByOther {
                    file,
                    knob: knob.describe(),
                    ours: "a limit".into(),
                    theirs: current,
                }));
                continue;
            }
            // The knob already holds the value: nothing to journal or write.
            let write = current != new;
            match journal.find(ino, &knob) {
                None if write => journal.entries_mut().push(JournalEntry {
                    cgroup: rel.clone(),
                    cgroup_ino: ino,
                    knob: knob.clone(),
                    original: current,
                    written: vec![new.clone()],
                }),
                None => {}
                Some(i) => {
                    let e = &journal.entries()[i];
                    if current != e.original && !e.holds_ours(&current) {
                        let ours = e.written.last().cloned().unwrap_or_default();
                        journal.entries_mut().remove(i);
                        journal_changed = true;
                        self.yielded.insert(id);
                        // Theirs now: its phase is no longer the agent's to keep apart.
                        if let (Some(phases), Setting::Limit { dev, knob, .. }) =
                            (self.phases.as_mut(), s)
                        {
                            phases.record(dev, ino, knob, false, Instant::now());
                        }
                        results.push(Err(EnforceError::ChangedByOther {
                            file,
                            knob: knob.describe(),
                            ours,
                            theirs: current,
                        }));
                        continue;
                    }
                    if write {
                        journal.entries_mut()[i].written = vec![current, new.clone()];
                    }
                }
            }
            if write {
                journal_changed = true;
                planned.push(PlannedWrite { slot, file, ino });
            }
            results.push(Ok(change));
        }
        let Some(journal) = self.journal.as_mut() else {
            return results;
        };
        if journal_changed {
            if let Err(e) = journal.persist() {
                let msg = e.to_string();
                for p in &planned {
                    results[p.slot] = Err(EnforceError::Journal {
                        path: journal.path(),
                        message: msg.clone(),
                    });
                }
                // Nothing was written: the entries describe no write.
                for p in &planned {
                    if let Some(i) = journal.find(p.ino, &knob) {
                        let e = &mut journal.entries_mut()[i];
                        e.written.retain(|w| *w != new);
                        if e.written.is_empty() {
                            journal.entries_mut().remove(i);
                        }
                    }
                }
                return results;
            }
        }
        let mut closed = false;
        for p in planned {
            // Out of phase with the other throttled cgroups' slices (see `slice_phase`).
            let at = match (self.phases.as_mut(), s) {
                (Some(phases), Setting::Limit { dev, knob, value }) => {
                    let devices = &self.devices;
                    phases.plan(
                        (dev, p.ino),
                        (knob, value.is_some()),
                        Instant::now(),
                        || devices.rotational(&dev_str(dev)),
                    )
                }
                _ => None,
            };
            if let Some(at) = at {
                std::thread::sleep(at.saturating_duration_since(Instant::now()));
            }
            if let Err(e) = write_line(self.files.as_ref(), &p.file, &line) {
                results[p.slot] = Err(e);
                continue;
            }
            if let (Some(phases), Setting::Limit { dev, knob, value }) = (self.phases.as_mut(), s) {
                let at = at.unwrap_or_else(Instant::now);
                phases.record(dev, p.ino, knob, value.is_some(), at);
            }
            if let Some(i) = journal.find(p.ino, &knob) {
                let e = &mut journal.entries_mut()[i];
                if e.original == new {
                    // Back where it was: nothing left to restore, the journal stays small.
                    journal.entries_mut().remove(i);
                    closed = true;
                } else {
                    e.written = vec![new.clone()];
                }
            }
        }
        if closed {
            // A stale entry is harmless (its knob holds its original), so a failure here
            // only costs a look at restore time.
            let _ = journal.persist();
        }
        results
    }

    /// Where a journaled knob's cgroup is: at its path, or (v1 cgroups can be renamed)
    /// wherever its inode is now. `walk` is the hierarchy, walked once on first need.
    fn locate(&self, e: &JournalEntry, walk: &mut Option<HashMap<u64, String>>) -> Located {
        let rel = &e.cgroup;
        let clean = rel.starts_with('/')
            && !rel.contains('\0')
            && Path::new(rel).components().all(|c| {
                matches!(
                    c,
                    std::path::Component::RootDir | std::path::Component::Normal(_)
                )
            });
        if !clean || !e.knob.is_valid() {
            return Located::Refused(format!(
                "the journal names {rel} {}, which is not a knob isolator writes",
                e.knob.file
            ));
        }
        let dir = self.hierarchy.dir_of(rel);
        let at_path = self.files.entry(&dir);
        if at_path.is_some_and(|m| m.is_dir && m.ino == e.cgroup_ino) {
            return self.within_root(dir);
        }
        let live = walk.get_or_insert_with(|| self.files.scan(&self.hierarchy));
        match live.get(&e.cgroup_ino) {
            Some(p) => self.within_root(self.hierarchy.dir_of(p)),
            None if at_path.is_some() => Located::Recreated,
            None => Located::Gone,
        }
    }

    /// Only files below the hierarchy's root are ever written back.
    fn within_root(&self, dir: PathBuf) -> Located {
        let root = self.files.canonicalize(&self.hierarchy.root);
        match (self.files.canonicalize(&dir), root) {
            (Ok(d), Ok(r)) if d.starts_with(&r) => Located::At(d),
            (Ok(d), _) => Located::Refused(format!(
                "{} is outside the cgroup hierarchy {}",
                d.display(),
                self.hierarchy.root.display()
            )),
            (Err(_), _) => Located::Gone,
        }
    }

    /// Puts one knob back if it still holds the agent's value. Returns the outcome and
    /// whether the entry stays in the journal (only a failed write, to be retried).
    fn restore_entry(
        &self,
        e: &JournalEntry,
        walk: &mut Option<HashMap<u64, String>>,
    ) -> (Restored, bool) {
        let dir = match self.locate(e, walk) {
            Located::At(d) => d,
            other => {
                let (result, file) = match other {
                    Located::Gone => ("gone".to_string(), self.hierarchy.dir_of(&e.cgroup)),
                    Located::Recreated => {
                        ("recreated".to_string(), self.hierarchy.dir_of(&e.cgroup))
                    }
                    Located::Refused(why) => (format!("refused: {why}"), PathBuf::from(&e.cgroup)),
                    Located::At(_) => unreachable!(),
                };
                return (restored(e, &e.knob.path_in(&file), result, None), false);
            }
        };
        let file = e.knob.path_in(&dir);
        let done = |result: &str, current: Option<String>| {
            (restored(e, &file, result.to_string(), current), false)
        };
        if let Some(dev) = &e.knob.dev {
            if !self.devices.exists(dev) {
                return done("device_gone", None);
            }
        }
        let current = match read_file(self.files.as_ref(), &file) {
            Ok(t) => e.knob.parse(&t),
            Err(EnforceError::CgroupGone(_)) => return done("gone", None),
            // The knob file itself left (bfq switched off): no limit of ours is in force.
            // Any other read error keeps the entry, to be retried.
            Err(EnforceError::Unavailable(..)) => return done("gone", None),
            Err(err) => return (restored(e, &file, format!("failed: {err}"), None), true),
        };
        if current == e.original {
            return done("restored", None);
        }
        if !e.holds_ours(&current) {
            return done("changed_by_other", Some(current));
        }
        let Some(line) = e.knob.line(&e.original) else {
            return done(
                &format!(
                    "refused: the journal's original value '{}' is not one the kernel printed",
                    e.original
                ),
                None,
            );
        };
        match write_line(self.files.as_ref(), &file, &line) {
            Ok(()) => done("restored", None),
            Err(EnforceError::CgroupGone(_)) => done("gone", None),
            Err(EnforceError::Rejected { ref errno, .. }) if errno == "ENODEV" => {
                done("device_gone", None)
            }
            Err(err) => (restored(e, &file, format!("failed: {err}"), None), true),
        }
    }

    /// Restores the entries `pick` selects, newest first; keeps only those that failed.
    fn restore_where(&mut self, pick: impl Fn(&JournalEntry) -> bool) -> Vec<Restored> {
        let Some(journal) = self.journal.as_ref() else {
            return vec![];
        };
        let mut walk = None;
        let mut out = vec![];
        let mut keep = vec![];
        let mut touched = false;
        for e in journal.entries().iter().rev() {
            if !pick(e) {
                keep.push(e.clone());
                continue;
            }
            touched = true;
            let (r, stays) = self.restore_entry(e, &mut walk);
            if stays {
                keep.push(e.clone());
            }
            out.push(r);
        }
        keep.reverse();
        let journal = self.journal.as_mut().expect("checked above");
        *journal.entries_mut() = keep;
        if touched {
            if let Err(e) = journal.persist() {
                out.push(Restored {
                    file: journal.path().display().to_string(),
                    knob: "journal".into(),
                    value: String::new(),
                    result: format!("failed: {e}"),
                    current: None,
                });
            }
        }
        out
    }

    /// Puts back every knob the agent holds that still holds its value.
    pub fn restore_all(&mut self) -> Vec<Restored> {
        self.restore_where(|_| true)
    }

    /// Cgroups left their service (vanished, re-created, renamed, or no longer matched):
    /// their knobs are put back where they still exist, and closed where they do not.
    pub fn release(&mut self, cgroup_inos: &[u64]) -> Vec<Restored> {
        let inos: HashSet<u64> = cgroup_inos.iter().copied().collect();
        if let Some(phases) = self.phases.as_mut() {
            phases.forget(&inos);
        }
        self.restore_where(|e| inos.contains(&e.cgroup_ino))
    }

    /// Restores what a journal left behind by a crashed agent lists. A journal from another
    /// boot is closed unapplied: its cgroups are gone, and any at the same paths now are
    /// others'.
    pub fn recover(&mut self) -> Result<Vec<Restored>, EnforceError> {
        let Some(journal) = self.journal.as_mut() else {
            return Ok(vec![]);
        };
        let Some(left) = journal.read_left_behind()? else {
            return Ok(vec![]);
        };
        if !left.boot_id.is_empty() && left.boot_id != journal.boot_id() {
            let out = left
                .entries
                .iter()
                .map(|e| {
                    let file = e.knob.path_in(&self.hierarchy.dir_of(&e.cgroup));
                    restored(e, &file, "other_boot".into(), None)
                })
                .collect();
            journal.persist()?;
            return Ok(out);
        }
        *journal.entries_mut() = left.entries;
        Ok(self.restore_all())
    }

    pub fn journal_entries(&self) -> &[JournalEntry] {
        self.journal.as_ref().map_or(&[], |j| j.entries())
    }
}

/// A stopping agent that never got to restore (a panic, a fatal error) does it on the way
/// out; its report goes to the log, as no sink is left.
impl Drop for Enforcer {
    fn drop(&mut self) {
        if self.journal_entries().is_empty() {
            return;
        }
        for r in self.restore_all() {
            tracing::warn!(file = %r.file, knob = %r.knob, value = %r.value, result = %r.result, "restored on exit");
        }
    }
}

fn restored(e: &JournalEntry, file: &Path, result: String, current: Option<String>) -> Restored {
    Restored {
        file: file.display().to_string(),
        knob: e.knob.describe(),
        value: e.original.clone(),
        result,
        current,
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;

    /// A fake hierarchy in a private scratch directory, with one cgroup "/cg".
    struct Fake {
        root: PathBuf,
        mode: CgroupMode,
    }

    impl Fake {
        fn new(mode: CgroupMode) -> Fake {
            use std::sync::atomic::{AtomicU32, Ordering};
            static N: AtomicU32 = AtomicU32::new(0);
            let root = std::env::temp_dir().join(format!(
                "isolator-enforcer-test-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&root);
            std::fs::create_dir_all(root.join("cgroups")).unwrap();
            let f = Fake { root, mode };
            f.cgroup("/cg");
            f
        }

        fn hierarchy(&self) -> IoHierarchy {
            IoHierarchy {
                mode: self.mode,
                root: self.root.join("cgroups"),
                io_enabled: true,
            }
        }

        fn dir(&self, rel: &str) -> PathBuf {
            self.hierarchy().dir_of(rel)
        }

        fn cgroup(&self, rel: &str) -> PathBuf {
            let cg = self.dir(rel);
            std::fs::create_dir_all(&cg).unwrap();
            if self.mode == CgroupMode::V2 {
                std::fs::write(cg.join("io.max"), "").unwrap();
                std::fs::write(cg.join("io.weight"), "default 100\n").unwrap();
            } else {
                for f in ["read_bps", "write_bps", "read_iops", "write_iops"] {
                    std::fs::write(cg.join(format!("blkio.throttle.{f}_device")), "").unwrap();
                }
            }
            cg
        }

        fn journal_dir(&self) -> PathBuf {
            self.root.join("j")
        }

        fn enforcer(&self) -> Enforcer {
            Enforcer::new(
                self.hierarchy(),
                Some(Journal::open(&self.journal_dir()).unwrap()),
            )
        }

        /// What the fake kernel file holds (the fakes keep the last line written).
        fn read(&self, rel: &str, file: &str) -> String {
            std::fs::read_to_string(self.dir(rel).join(file)).unwrap()
        }
    }

    impl Drop for Fake {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }

    /// A whole disk of this host: restore checks that the device still exists.
    fn disk() -> u32 {
        let d = std::fs::read_dir("/sys/dev/block")
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .find(|n| !Path::new(&format!("/sys/dev/block/{n}/partition")).exists())
            .expect("a block device on this host");
        let (a, b) = d.split_once(':').unwrap();
        isolator_common::kernel_dev(a.parse().unwrap(), b.parse().unwrap())
    }

    fn wbps(value: Option<u64>) -> Setting {
        Setting::Limit {
            dev: disk(),
            knob: Knob::Wbps,
            value,
        }
    }

    fn v1_file() -> &'static str {
        "blkio.throttle.write_bps_device"
    }

    #[test]
    fn journals_before_writing_and_restores_in_both_syntaxes() {
        for mode in [CgroupMode::V1, CgroupMode::V2] {
            let f = Fake::new(mode);
            let mut e = f.enforcer();
            let d = dev_str(disk());
            let c = e.apply("/cg", wbps(Some(1000))).unwrap();
            let (file, old) = if mode == CgroupMode::V2 {
                ("io.max", "max")
            } else {
                (v1_file(), "0")
            };
            assert_eq!(c.old, old);
            assert_eq!(c.file, f.dir("/cg").join(file));
            let want = if mode == CgroupMode::V2 {
                format!("{d} wbps=1000\n")
            } else {
                format!("{d} 1000\n")
            };
            assert_eq!(f.read("/cg", file), want);
            // The journal is on disk before anything else happens, private.
            let path = f.journal_dir().join("journal.json");
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(
                text.contains("\"wbps\"") && text.contains("boot_id"),
                "{text}"
            );
            use std::os::unix::fs::PermissionsExt;
            let mode_of = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode_of(&path), 0o600);
            assert_eq!(mode_of(&f.journal_dir()), 0o700);
            // A second write to the same knob keeps the first original.
            e.apply("/cg", wbps(Some(5 << 20))).unwrap();
            assert_eq!(e.journal_entries().len(), 1);
            assert_eq!(e.journal_entries()[0].original, old);
            let r = e.restore_all();
            assert_eq!(r.len(), 1);
            assert_eq!(r[0].result, "restored");
            let want = if mode == CgroupMode::V2 {
                format!("{d} wbps=max\n")
            } else {
                format!("{d} 0\n")
            };
            assert_eq!(f.read("/cg", file), want);
            assert!(!path.exists());
        }
    }

    #[test]
    fn an_operators_change_is_never_overwritten() {
        let f = Fake::new(CgroupMode::V1);
        let d = dev_str(disk());
        std::fs::write(f.dir("/cg").join(v1_file()), format!("{d} 987654321\n")).unwrap();
        let mut e = f.enforcer();
        let c = e.apply("/cg", wbps(Some(50 << 20))).unwrap();
        assert_eq!(c.old, "987654321");
        // The operator sets their own value mid-run.
        std::fs::write(f.dir("/cg").join(v1_file()), format!("{d} 123456789\n")).unwrap();
        // The next write is refused, and so is every later one.
        for _ in 0..2 {
            let err = e.apply("/cg", wbps(Some(40 << 20))).unwrap_err();
            assert!(
                matches!(err, EnforceError::ChangedByOther { ref theirs, .. } if theirs == "123456789"),
                "{err}"
            );
            assert_eq!(f.read("/cg", v1_file()), format!("{d} 123456789\n"));
        }
        assert!(e.journal_entries().is_empty());
        assert!(e.restore_all().is_empty());
        assert_eq!(f.read("/cg", v1_file()), format!("{d} 123456789\n"));
    }

    #[test]
    fn stop_leaves_an_operators_value_and_says_so() {
        let f = Fake::new(CgroupMode::V2);
        let d = dev_str(disk());
        let mut e = f.enforcer();
        e.apply("/cg", wbps(Some(50 << 20))).unwrap();
        std::fs::write(f.dir("/cg").join("io.max"), format!("{d} wbps=123456789\n")).unwrap();
        let r = e.restore_all();
        assert_eq!(r[0].result, "changed_by_other");
        assert_eq!(r[0].current.as_deref(), Some("123456789"));
        assert_eq!(f.read("/cg", "io.max"), format!("{d} wbps=123456789\n"));
        assert!(!f.journal_dir().join("journal.json").exists());
    }

    #[test]
    fn a_limit_lifted_back_to_its_original_leaves_the_journal() {
        let f = Fake::new(CgroupMode::V2);
        let mut e = f.enforcer();
        e.apply("/cg", wbps(Some(50 << 20))).unwrap();
        assert!(f.journal_dir().join("journal.json").exists());
        e.apply("/cg", wbps(None)).unwrap();
        assert!(e.journal_entries().is_empty());
        assert!(!f.journal_dir().join("journal.json").exists());
    }

    #[test]
    fn a_crash_leaves_a_journal_the_next_start_restores() {
        let f = Fake::new(CgroupMode::V2);
        let mut e = f.enforcer();
        e.apply("/cg", Setting::Weight(300)).unwrap();
        // As after SIGKILL: nothing runs on the way out.
        std::mem::forget(e);
        assert_eq!(f.read("/cg", "io.weight"), "default 300\n");
        // The lock died with the "process": release it as the kernel would.
        let mut e = Enforcer::new(f.hierarchy(), Some(reopen_journal(&f)));
        let r = e.recover().unwrap();
        assert_eq!(r[0].result, "restored");
        assert_eq!(f.read("/cg", "io.weight"), "default 100\n");
        assert!(!f.journal_dir().join("journal.json").exists());
    }

    /// The journal of a forgotten enforcer, whose lock fd leaked: drop the lock file so a
    /// new one can be taken.
    fn reopen_journal(f: &Fake) -> Journal {
        std::fs::remove_file(f.journal_dir().join("lock")).unwrap();
        Journal::open(&f.journal_dir()).unwrap()
    }

    fn crash_with_cap(f: &Fake) {
        let mut e = f.enforcer();
        e.apply("/cg", wbps(Some(50 << 20))).unwrap();
        std::mem::forget(e);
    }

    #[test]
    fn a_journal_from_another_boot_is_not_applied() {
        let f = Fake::new(CgroupMode::V2);
        crash_with_cap(&f);
        let path = f.journal_dir().join("journal.json");
        let text = std::fs::read_to_string(&path).unwrap();
        let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
        v["boot_id"] = "00000000-0000-0000-0000-000000000000".into();
        std::fs::write(&path, v.to_string()).unwrap();
        let before = f.read("/cg", "io.max");
        let mut e = Enforcer::new(f.hierarchy(), Some(reopen_journal(&f)));
        let r = e.recover().unwrap();
        assert_eq!(r[0].result, "other_boot");
        assert_eq!(f.read("/cg", "io.max"), before, "nothing written");
        assert!(!path.exists());
    }

    #[test]
    fn a_recreated_cgroup_is_not_given_the_old_ones_value() {
        let f = Fake::new(CgroupMode::V2);
        crash_with_cap(&f);
        // Moved out of the hierarchy, so its inode cannot be reused by the new one.
        std::fs::rename(f.dir("/cg"), f.root.join("old-cg")).unwrap();
        f.cgroup("/cg");
        std::fs::write(f.dir("/cg").join("io.max"), "new owner's\n").unwrap();
        let mut e = Enforcer::new(f.hierarchy(), Some(reopen_journal(&f)));
        let r = e.recover().unwrap();
        assert_eq!(r[0].result, "recreated");
        assert_eq!(f.read("/cg", "io.max"), "new owner's\n");
    }

    #[test]
    fn a_renamed_cgroup_is_restored_where_it_is_now() {
        let f = Fake::new(CgroupMode::V1);
        let d = dev_str(disk());
        crash_with_cap(&f);
        std::fs::rename(f.dir("/cg"), f.dir("/moved")).unwrap();
        let mut e = Enforcer::new(f.hierarchy(), Some(reopen_journal(&f)));
        let r = e.recover().unwrap();
        assert_eq!(r[0].result, "restored", "{r:?}");
        assert!(r[0].file.contains("/moved/"), "{r:?}");
        assert_eq!(f.read("/moved", v1_file()), format!("{d} 0\n"));
    }

    #[test]
    fn journal_entries_are_only_written_to_knobs_under_the_hierarchy() {
        let f = Fake::new(CgroupMode::V2);
        crash_with_cap(&f);
        let victim = f.root.join("victim");
        std::fs::write(&victim, "precious\n").unwrap();
        let path = f.journal_dir().join("journal.json");
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let good = v["entries"][0].clone();
        let mut outside = good.clone();
        outside["cgroup"] = "/../..".into();
        let mut other_file = good.clone();
        other_file["knob"]["file"] = "../victim".into();
        let mut bad_value = good.clone();
        bad_value["original"] = "1\n8:0 wbps=1".into();
        v["entries"] = serde_json::json!([outside, other_file, bad_value]);
        std::fs::write(&path, v.to_string()).unwrap();
        let mut e = Enforcer::new(f.hierarchy(), Some(reopen_journal(&f)));
        let r = e.recover().unwrap();
        assert_eq!(r.len(), 3);
        assert!(r.iter().all(|r| r.result.starts_with("refused")), "{r:?}");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
        assert!(!path.exists(), "refused entries are closed");
    }

    #[test]
    fn a_link_inside_the_hierarchy_never_leads_a_restore_outside_it() {
        let f = Fake::new(CgroupMode::V2);
        crash_with_cap(&f);
        // A directory outside the hierarchy, reached through a link inside it, holding a
        // file named like a knob.
        let outside = f.root.join("outside");
        std::fs::create_dir_all(outside.join("cg")).unwrap();
        std::fs::write(outside.join("cg/io.max"), "precious\n").unwrap();
        std::os::unix::fs::symlink(&outside, f.dir("/evil")).unwrap();
        let path = f.journal_dir().join("journal.json");
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        v["entries"][0]["cgroup"] = "/evil/cg".into();
        v["entries"][0]["cgroup_ino"] = std::fs::metadata(outside.join("cg")).unwrap().ino().into();
        std::fs::write(&path, v.to_string()).unwrap();
        let mut e = Enforcer::new(f.hierarchy(), Some(reopen_journal(&f)));
        let r = e.recover().unwrap();
        assert!(r[0].result.starts_with("refused"), "{r:?}");
        assert!(
            r[0].result.contains("outside the cgroup hierarchy"),
            "{r:?}"
        );
        assert_eq!(
            std::fs::read_to_string(outside.join("cg/io.max")).unwrap(),
            "precious\n"
        );
    }

    #[test]
    fn a_device_that_is_gone_closes_its_entries() {
        let f = Fake::new(CgroupMode::V2);
        let mut e = f.enforcer();
        let gone = Setting::Limit {
            dev: isolator_common::kernel_dev(4094, 4093),
            knob: Knob::Rbps,
            value: Some(1 << 20),
        };
        e.apply("/cg", gone).unwrap();
        let r = e.restore_all();
        assert_eq!(r[0].result, "device_gone");
        assert!(e.journal_entries().is_empty());
    }

    #[test]
    fn corrupt_journal_and_second_agent_are_errors() {
        let f = Fake::new(CgroupMode::V2);
        std::fs::create_dir_all(f.journal_dir()).unwrap();
        std::fs::write(f.journal_dir().join("journal.json"), "{ not json").unwrap();
        let mut e = f.enforcer();
        let err = e.recover().unwrap_err().to_string();
        assert!(err.contains("corrupt") && err.contains("by hand"), "{err}");
        let err = Journal::open(&f.journal_dir()).err().unwrap().to_string();
        assert!(err.contains("another isolator"), "{err}");
    }

    #[test]
    fn a_torn_journal_from_before_this_boot_is_closed_not_an_error() {
        // Not fsynced, a journal written before a power cut may come back torn; its
        // cgroups went with that boot.
        let f = Fake::new(CgroupMode::V2);
        std::fs::create_dir_all(f.journal_dir()).unwrap();
        let path = f.journal_dir().join("journal.json");
        std::fs::write(&path, "").unwrap();
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000))
            .unwrap();
        let mut e = f.enforcer();
        assert!(e.recover().unwrap().is_empty());
        assert!(!path.exists(), "closed");
        assert!(e.journal_entries().is_empty());
    }

    #[test]
    fn a_vanished_cgroup_is_gone_not_a_crash() {
        let f = Fake::new(CgroupMode::V1);
        let mut e = f.enforcer();
        e.apply("/cg", wbps(Some(2 << 20))).unwrap();
        std::fs::remove_dir_all(f.dir("/cg")).unwrap();
        let err = e.apply("/cg", wbps(Some(3 << 20))).unwrap_err();
        assert!(matches!(err, EnforceError::CgroupGone(_)), "{err}");
        let r = e.release(&[e.journal_entries()[0].cgroup_ino]);
        assert_eq!(r[0].result, "gone");
        assert!(e.journal_entries().is_empty());
    }

    #[test]
    fn split_writes_share_one_journal_write() {
        let f = Fake::new(CgroupMode::V2);
        let cgroups: Vec<String> = (0..5).map(|i| format!("/cg{i}")).collect();
        for c in &cgroups {
            f.cgroup(c);
        }
        let mut e = f.enforcer();
        let r = e.apply_all(&cgroups, wbps(Some(1 << 20)));
        assert!(r.iter().all(|r| r.is_ok()));
        assert_eq!(e.journal_entries().len(), 5);
        let r = e.restore_all();
        assert!(r.iter().all(|r| r.result == "restored"), "{r:?}");
    }

    #[test]
    fn dropped_with_limits_restores_them() {
        let f = Fake::new(CgroupMode::V2);
        let d = dev_str(disk());
        {
            let mut e = f.enforcer();
            e.apply("/cg", wbps(Some(50 << 20))).unwrap();
            // Dropped by a panic or a fatal error.
        }
        assert_eq!(f.read("/cg", "io.max"), format!("{d} wbps=max\n"));
        assert!(!f.journal_dir().join("journal.json").exists());
    }

    #[test]
    fn dry_run_writes_nothing() {
        let f = Fake::new(CgroupMode::V2);
        let mut e = Enforcer::new(f.hierarchy(), None);
        let c = e
            .apply(
                "/cg",
                Setting::Limit {
                    dev: disk(),
                    knob: Knob::Riops,
                    value: Some(7),
                },
            )
            .unwrap();
        assert_eq!((c.old.as_str(), c.new.as_str()), ("max", "7"));
        assert_eq!(f.read("/cg", "io.max"), "");
    }
}
