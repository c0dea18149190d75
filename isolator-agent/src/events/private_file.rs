//! Files the agent creates or writes as root (events, journal, locks): created 0600
//! (directories 0700), never opened through a symbolic link, and only in directories that no
//! other user can change, so nobody can aim root's writes at a file of their choosing, swap
//! the file under it, or read what it writes.

use std::{
    fs::{DirBuilder, File, OpenOptions},
    io,
    os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
};

#[derive(Debug, thiserror::Error)]
pub enum PrivateFileError {
    #[error("{path}: {reason}; {fix}")]
    Unsafe {
        path: PathBuf,
        reason: String,
        fix: &'static str,
    },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

const FIX_DIR: &str =
    "use a directory that only root can write (e.g. /var/log/isolator or /run/isolator)";

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> PrivateFileError + '_ {
    move |source| PrivateFileError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// Checks that no user but root (or this process's user) can add, remove or rename entries
/// in `dir`, and that no unprivileged user can swap a directory above it. Returns `dir`
/// with every link resolved: files are opened through that path, never through links a
/// user could re-point after the check.
///
/// Above `dir`: a sticky world-writable directory (/tmp, /var/tmp) is fine as long as the
/// next one down is ours (the sticky bit keeps others from renaming it), and a root-owned
/// group-writable one is too (Ubuntu's /var/log is 0775 root:syslog: its group is a system
/// daemon's). `dir` itself must be writable by its owner alone: anyone else could plant the
/// file's name first.
pub fn check_dir(dir: &Path) -> Result<PathBuf, PrivateFileError> {
    let real = dir.canonicalize().map_err(io_err(dir))?;
    let me = euid();
    for (depth, d) in real.ancestors().enumerate() {
        let m = std::fs::symlink_metadata(d).map_err(io_err(d))?;
        let shown = if depth == 0 {
            dir.to_path_buf()
        } else {
            d.to_path_buf()
        };
        if !m.is_dir() {
            return Err(PrivateFileError::Unsafe {
                path: shown,
                reason: "is not a directory".into(),
                fix: FIX_DIR,
            });
        }
        if m.uid() != 0 && m.uid() != me {
            return Err(PrivateFileError::Unsafe {
                path: shown,
                reason: format!("is owned by uid {}, who could swap what is in it", m.uid()),
                fix: FIX_DIR,
            });
        }
        let mode = m.mode();
        let sticky = mode & 0o1000 != 0;
        let unsafe_write = if depth == 0 {
            mode & 0o022 != 0
        } else {
            (mode & 0o002 != 0 && !sticky) || (mode & 0o020 != 0 && m.uid() != 0 && !sticky)
        };
        if unsafe_write {
            return Err(PrivateFileError::Unsafe {
                path: shown,
                reason: format!(
                    "is writable by other users (mode {:o}), who could plant a link or file there",
                    mode & 0o7777
                ),
                fix: FIX_DIR,
            });
        }
    }
    Ok(real)
}

/// Creates `dir` (and missing parents) mode 0700, or checks an existing one.
pub fn create_dir(dir: &Path) -> Result<(), PrivateFileError> {
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io_err(dir))?;
    check_dir(dir).map(|_| ())
}

/// Opens `path` for writing (append or truncate), creating it 0600, never through a
/// symbolic link, in a directory [`check_dir`] accepts. An existing file must be a regular
/// file of ours with one link (a hard link could point at any file on the host).
pub fn open(path: &Path, append: bool) -> Result<File, PrivateFileError> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let real_parent = check_dir(&parent)?;
    let Some(name) = path.file_name() else {
        return Err(PrivateFileError::Unsafe {
            path: path.to_path_buf(),
            reason: "names a directory, not a file".into(),
            fix: "give the path of a file",
        });
    };
    // O_NONBLOCK: a FIFO planted under the name must not block the open (it is refused
    // below); regular files ignore the flag.
    let f = OpenOptions::new()
        .write(true)
        .append(append)
        .truncate(!append)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NOCTTY | libc::O_NONBLOCK)
        .open(real_parent.join(name))
        .map_err(|e| match e.raw_os_error() {
            // A FIFO without a reader, opened non-blocking.
            Some(libc::ENXIO) => PrivateFileError::Unsafe {
                path: path.to_path_buf(),
                reason: "is not a regular file".into(),
                fix: "remove it, or give another path",
            },
            Some(libc::ELOOP) => PrivateFileError::Unsafe {
                path: path.to_path_buf(),
                reason:
                    "is a symbolic link, which isolator does not follow for files it writes as root"
                        .into(),
                fix: "give the path of the file itself",
            },
            _ => PrivateFileError::Io {
                path: path.to_path_buf(),
                source: e,
            },
        })?;
    let m = f.metadata().map_err(io_err(path))?;
    let unsafe_file = |reason: String| PrivateFileError::Unsafe {
        path: path.to_path_buf(),
        reason,
        fix: "remove it, or give another path",
    };
    if !m.file_type().is_file() {
        return Err(unsafe_file("is not a regular file".into()));
    }
    if m.uid() != euid() {
        return Err(unsafe_file(format!("is owned by uid {}", m.uid())));
    }
    if m.nlink() > 1 {
        return Err(unsafe_file(format!(
            "has {} hard links, so writing it could change another file",
            m.nlink()
        )));
    }
    // A file left by an older version (0644): the events are root's alone.
    if m.permissions().mode() & 0o077 != 0 {
        f.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(io_err(path))?;
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("isolator-pf-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        d
    }

    #[test]
    fn creates_0600_and_refuses_links() {
        let d = scratch("links");
        let f = d.join("events.ndjson");
        open(&f, true).unwrap();
        let mode = std::fs::metadata(&f).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let target = d.join("target");
        std::fs::write(&target, "x").unwrap();
        let link = d.join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = open(&link, true).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        let hard = d.join("hard");
        std::fs::hard_link(&target, &hard).unwrap();
        let e = open(&hard, true).unwrap_err().to_string();
        assert!(e.contains("hard links"), "{e}");
        // A 0644 file of ours is tightened.
        let old = d.join("old");
        std::fs::write(&old, "").unwrap();
        std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o644)).unwrap();
        open(&old, true).unwrap();
        let mode = std::fs::metadata(&old).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn refuses_directories_others_can_write() {
        let d = scratch("dirs");
        let open_dir = d.join("world");
        std::fs::create_dir(&open_dir).unwrap();
        std::fs::set_permissions(&open_dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let e = open(&open_dir.join("e.ndjson"), true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("writable by other users"), "{e}");
        // Below a sticky directory, a directory of ours is fine.
        let mine = open_dir.join("mine");
        create_dir(&mine).unwrap();
        let mode = std::fs::metadata(&mine).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        open(&mine.join("e.ndjson"), true).unwrap();
        // A world-writable, non-sticky ancestor is not; a root-owned group-writable one
        // (Ubuntu's /var/log) is.
        let w = d.join("world-nosticky");
        std::fs::create_dir(&w).unwrap();
        std::fs::create_dir(w.join("sub")).unwrap();
        std::fs::set_permissions(&w, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = open(&w.join("sub/e.ndjson"), true).unwrap_err().to_string();
        assert!(e.contains("writable by other users"), "{e}");
        let g = d.join("group");
        std::fs::create_dir(&g).unwrap();
        std::fs::create_dir(g.join("sub")).unwrap();
        std::fs::set_permissions(&g, std::fs::Permissions::from_mode(0o775)).unwrap();
        open(&g.join("sub/e.ndjson"), true).unwrap();
        // A link in a middle component is resolved once, and the file opened where it led.
        let via = d.join("via");
        std::os::unix::fs::symlink(&mine, &via).unwrap();
        open(&via.join("v.ndjson"), true).unwrap();
        assert!(mine.join("v.ndjson").exists());
        // A FIFO planted under the name is refused, not waited on.
        let fifo = mine.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo on a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = open(&fifo, true).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
