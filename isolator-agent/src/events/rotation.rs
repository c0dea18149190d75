//! The `--json` file, bounded by size: when the next line would take it past the limit, it
//! is moved to `PATH.1` (`.1` to `.2`, and so on; the oldest beyond the kept backups goes)
//! and a new one is started, so at most backups + 1 files exist, each created 0600 through
//! [`private_file`]. Lines never straddle two files. Rotating happens in the output's
//! writer thread (see [`crate::events::output`]): it never holds up a cycle.
//!
//! A rotation that fails (a rename refused, no room for a new file) keeps the events in
//! the current file, which grows past the limit until a later rotation works: the failure
//! and the recovery are reported once each ([`RotationNews`]).

use std::{
    fs::File,
    io::{self, Seek, SeekFrom, Write},
    path::{Path, PathBuf},
};

use crate::events::private_file::{self, PrivateFileError};

/// How big the `--json` file may grow, and how many rotated files are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RotationLimits {
    /// 0: never rotated (an external logrotate moves the file and sends SIGHUP).
    pub max_bytes: u64,
    pub backups: u32,
}

/// `--json-max-size`'s default: bounded (600 MiB with the backups) without being small.
pub const DEFAULT_MAX_SIZE: &str = "100MiB";
/// `--json-backups`'s default.
pub const DEFAULT_BACKUPS: u32 = 5;
/// More backups than this is a mistake (and the shifting renames get long).
pub const MAX_BACKUPS: u32 = 1000;
/// A limit below this would rotate every few lines: refused rather than obeyed.
pub const MIN_MAX_BYTES: u64 = 4096;

impl RotationLimits {
    pub const OFF: RotationLimits = RotationLimits {
        max_bytes: 0,
        backups: 0,
    };
}

/// Parses `--json-max-size`: a size with units (`100MiB`, `64M`, `1G`, `500000`; K, M and
/// G are powers of 1024, as logrotate's `size`), or 0 to never rotate.
pub fn parse_max_size(s: &str) -> Result<u64, String> {
    let bytes = parse_size::Config::new()
        .with_binary()
        .parse_size(s.trim())
        .map_err(|e| {
            format!("'{s}' is not a size ({e}); use e.g. 100MiB, 64M or 0 (never rotate)")
        })?;
    if bytes != 0 && bytes < MIN_MAX_BYTES {
        return Err(format!(
            "'{s}' is below {MIN_MAX_BYTES} bytes; use e.g. 100MiB, or 0 to never rotate"
        ));
    }
    Ok(bytes)
}

/// Parses `--json-backups`.
pub fn parse_backups(s: &str) -> Result<u32, String> {
    match s.trim().parse::<u32>() {
        Ok(n) if n <= MAX_BACKUPS => Ok(n),
        _ => Err(format!(
            "'{s}' is not a number of backups in 0..={MAX_BACKUPS}; use e.g. 5"
        )),
    }
}

/// A change in whether rotation works, for the output to report.
#[derive(Debug, Clone, PartialEq)]
pub enum RotationNews {
    /// Rotating failed: the file grows past the limit until it works.
    Failed(String),
    /// A rotation worked again after a failure.
    Recovered,
}

/// The `--json` file, appended to and rotated by size.
pub struct RotatingFile {
    path: PathBuf,
    limits: RotationLimits,
    file: File,
    /// Bytes in the current file.
    size: u64,
    /// The last byte written was not a newline (a write cut short): the line is finished
    /// in this file before any rotation.
    mid_line: bool,
    /// Where the last line written starts: what a torn line is cut back to.
    line_start: u64,
    failing: bool,
    news: Vec<RotationNews>,
}

impl RotatingFile {
    /// Opens (appends to) `path`; an existing file counts toward the limit.
    pub fn open(path: &Path, limits: RotationLimits) -> Result<RotatingFile, PrivateFileError> {
        let (file, size) = open_counted(path)?;
        Ok(RotatingFile {
            path: path.to_path_buf(),
            limits,
            file,
            size,
            mid_line: false,
            line_start: size,
            failing: false,
            news: vec![],
        })
    }

    /// Opens the path again (SIGHUP: logrotate moved the file away).
    pub fn reopen(&mut self) -> Result<(), PrivateFileError> {
        let (file, size) = open_counted(&self.path)?;
        self.file = file;
        self.size = size;
        self.mid_line = false;
        self.line_start = size;
        Ok(())
    }

    /// Cuts a line a failed write left half-written out of the file, so that every line
    /// in it stays one whole event for the log shippers that read it (a line cut at a
    /// nested `}` looks whole to a reader that checks the last byte). False when there was
    /// none, or the file could not be cut: the next line then starts on a new line. Some:
    /// the bytes cut.
    pub fn discard_torn_line(&mut self) -> Option<u64> {
        // A rotated file is not opened for append: the next write goes where the cut was.
        if !self.mid_line
            || self.file.set_len(self.line_start).is_err()
            || self.file.seek(SeekFrom::Start(self.line_start)).is_err()
        {
            return None;
        }
        let cut = self.size - self.line_start;
        self.size = self.line_start;
        self.mid_line = false;
        Some(cut)
    }

    /// What changed about rotation since the last call.
    pub fn take_news(&mut self) -> Vec<RotationNews> {
        std::mem::take(&mut self.news)
    }

    /// The path with suffix `.n` (`.0` is the path itself).
    fn numbered(&self, n: u32) -> PathBuf {
        if n == 0 {
            return self.path.clone();
        }
        let mut s = self.path.clone().into_os_string();
        s.push(format!(".{n}"));
        PathBuf::from(s)
    }

    /// Starts a new file: the next one is opened (as `PATH.new`) before anything is moved,
    /// so a failure leaves the current file in place and in use.
    fn rotate(&mut self) -> Result<(), String> {
        let fresh_path = {
            let mut s = self.path.clone().into_os_string();
            s.push(".new");
            PathBuf::from(s)
        };
        // A leftover of a rotation cut short is started afresh.
        let _ = std::fs::remove_file(&fresh_path);
        let fresh = private_file::open(&fresh_path, false).map_err(|e| e.to_string())?;
        let moved = self.shift_backups();
        let placed = moved.and_then(|()| {
            std::fs::rename(&fresh_path, &self.path).map_err(|e| {
                format!(
                    "rename {} to {}: {e}",
                    fresh_path.display(),
                    self.path.display()
                )
            })
        });
        if let Err(e) = placed {
            let _ = std::fs::remove_file(&fresh_path);
            return Err(e);
        }
        self.file = fresh;
        self.size = 0;
        self.line_start = 0;
        Ok(())
    }

    /// PATH.(n-1) -> PATH.n ... PATH -> PATH.1 (with no backups, PATH goes). A missing
    /// file is skipped: the last rotation may have stopped half-way.
    fn shift_backups(&self) -> Result<(), String> {
        let gone = |e: &io::Error| e.kind() == io::ErrorKind::NotFound;
        if self.limits.backups == 0 {
            return match std::fs::remove_file(&self.path) {
                Err(e) if !gone(&e) => Err(format!("remove {}: {e}", self.path.display())),
                _ => Ok(()),
            };
        }
        for n in (0..self.limits.backups).rev() {
            let (from, to) = (self.numbered(n), self.numbered(n + 1));
            match std::fs::rename(&from, &to) {
                Err(e) if !gone(&e) => {
                    return Err(format!(
                        "rename {} to {}: {e}",
                        from.display(),
                        to.display()
                    ))
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// How much of `buf` goes into the current file, rotating first when the next whole
    /// line would not fit in it.
    fn next_chunk(&mut self, buf: &[u8]) -> usize {
        let line_end = |from: &[u8]| from.iter().position(|&b| b == b'\n').map(|i| i + 1);
        if self.limits.max_bytes == 0 {
            return buf.len();
        }
        if self.mid_line {
            return line_end(buf).unwrap_or(buf.len());
        }
        // All of it, or the whole lines of it, that fit in what is left of the limit.
        let max_bytes = self.limits.max_bytes;
        let fitting = |size: u64| {
            let room = max_bytes.saturating_sub(size) as usize;
            if room >= buf.len() {
                return buf.len();
            }
            let window = &buf[..room];
            window
                .iter()
                .rposition(|&b| b == b'\n')
                .map_or(0, |i| i + 1)
        };
        let n = fitting(self.size);
        if n > 0 {
            return n;
        }
        if self.size > 0 {
            match self.rotate() {
                Ok(()) => {
                    if std::mem::take(&mut self.failing) {
                        self.news.push(RotationNews::Recovered);
                    }
                }
                Err(e) => {
                    if !self.failing {
                        self.failing = true;
                        self.news.push(RotationNews::Failed(e));
                    }
                    // Kept in this file; the next batch tries again.
                    return buf.len();
                }
            }
        }
        match fitting(self.size) {
            // A line longer than the limit has a file of its own.
            0 => line_end(buf).unwrap_or(buf.len()),
            n => n,
        }
    }
}

impl Write for RotatingFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let chunk = self.next_chunk(buf);
        let n = self.file.write(&buf[..chunk])?;
        if let Some(i) = buf[..n].iter().rposition(|&b| b == b'\n') {
            self.line_start = self.size + i as u64 + 1;
        }
        self.size += n as u64;
        if n > 0 {
            self.mid_line = buf[n - 1] != b'\n';
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

fn open_counted(path: &Path) -> Result<(File, u64), PrivateFileError> {
    let f = private_file::open(path, true)?;
    let size = f
        .metadata()
        .map_err(|source| PrivateFileError::Io {
            path: path.to_path_buf(),
            source,
        })?
        .len();
    Ok((f, size))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("isolator-rot-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        d
    }

    fn files(d: &Path) -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = std::fs::read_dir(d)
            .unwrap()
            .flatten()
            .map(|e| {
                (
                    e.file_name().to_string_lossy().into_owned(),
                    std::fs::read_to_string(e.path()).unwrap(),
                )
            })
            .collect();
        v.sort();
        v
    }

    fn line(n: usize) -> String {
        // 10 bytes with the newline.
        format!("{{\"n\":{n:03}}}\n")
    }

    #[test]
    fn keeps_at_most_backups_plus_one_files_of_whole_lines() {
        let d = scratch("bound");
        let p = d.join("events.ndjson");
        let mut f = RotatingFile::open(
            &p,
            RotationLimits {
                max_bytes: 35,
                backups: 2,
            },
        )
        .unwrap();
        // Written in batches of two lines, as the writer thread batches them.
        for n in (0..20).step_by(2) {
            f.write_all(format!("{}{}", line(n), line(n + 1)).as_bytes())
                .unwrap();
        }
        let got = files(&d);
        let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            ["events.ndjson", "events.ndjson.1", "events.ndjson.2"]
        );
        for (name, text) in &got {
            assert!(text.len() <= 35, "{name}: {text:?}");
            assert!(text.ends_with('\n') && !text.is_empty(), "{name}: {text:?}");
            let mode = std::fs::metadata(d.join(name))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{name}");
        }
        // The newest lines, in order, oldest file first: 3 whole lines (30 bytes) per full file.
        let text: String = [&got[2].1, &got[1].1, &got[0].1]
            .into_iter()
            .cloned()
            .collect();
        let want: String = (12..20).map(line).collect();
        assert_eq!(text, want);
        assert!(f.take_news().is_empty());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn no_backups_starts_over_and_zero_never_rotates() {
        let d = scratch("zero");
        let p = d.join("e");
        let mut f = RotatingFile::open(
            &p,
            RotationLimits {
                max_bytes: 25,
                backups: 0,
            },
        )
        .unwrap();
        for n in 0..7 {
            f.write_all(line(n).as_bytes()).unwrap();
        }
        assert_eq!(files(&d), [("e".into(), line(6))]);
        let mut f = RotatingFile::open(&d.join("off"), RotationLimits::OFF).unwrap();
        for n in 0..7 {
            f.write_all(line(n).as_bytes()).unwrap();
        }
        assert_eq!(
            std::fs::read_to_string(d.join("off")).unwrap().len(),
            70,
            "never rotated"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_line_longer_than_the_limit_gets_a_file_of_its_own() {
        let d = scratch("long");
        let p = d.join("e");
        let mut f = RotatingFile::open(
            &p,
            RotationLimits {
                max_bytes: 15,
                backups: 3,
            },
        )
        .unwrap();
        let long = format!("{{\"x\":\"{}\"}}\n", "y".repeat(30));
        f.write_all(format!("{}{long}{}", line(1), line(2)).as_bytes())
            .unwrap();
        assert_eq!(
            files(&d),
            [
                ("e".into(), line(2)),
                ("e.1".into(), long.clone()),
                ("e.2".into(), line(1)),
            ]
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn an_existing_file_counts_and_a_line_cut_short_is_finished_first() {
        let d = scratch("cut");
        let p = d.join("e");
        std::fs::write(&p, line(0)).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        let mut f = RotatingFile::open(
            &p,
            RotationLimits {
                max_bytes: 20,
                backups: 1,
            },
        )
        .unwrap();
        // Half a line (a write the disk cut short), then the rest: one file.
        let l = line(1);
        f.write_all(&l.as_bytes()[..4]).unwrap();
        f.write_all(&l.as_bytes()[4..]).unwrap();
        assert_eq!(files(&d), [("e".into(), format!("{}{}", line(0), line(1)))]);
        f.write_all(line(2).as_bytes()).unwrap();
        assert_eq!(
            files(&d),
            [
                ("e".into(), line(2)),
                ("e.1".into(), format!("{}{}", line(0), line(1)))
            ]
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A write that failed part-way leaves half a line; the writer cuts it off, so the
    /// file holds whole lines only (here one cut at a nested `}`, which a reader checking
    /// the last byte would take for whole), and the size limit counts what is left.
    #[test]
    fn a_torn_line_is_cut_off_and_the_next_starts_where_it_was() {
        let d = scratch("torn");
        let p = d.join("e");
        let limits = RotationLimits {
            max_bytes: 40,
            backups: 1,
        };
        let mut f = RotatingFile::open(&p, limits).unwrap();
        assert_eq!(f.discard_torn_line(), None, "nothing torn yet");
        let torn = "{\"a\":{\"b\":1},\"c\":2}\n";
        f.write_all(format!("{}{}", line(0), &torn[..15]).as_bytes())
            .unwrap();
        assert_eq!(f.discard_torn_line(), Some(15));
        assert_eq!(files(&d), [("e".into(), line(0))]);
        assert_eq!(f.discard_torn_line(), None, "cut once");
        // 10 bytes in the file (25 with the torn part): three more lines fit in 40, the
        // fourth starts the next file.
        for n in 1..5 {
            f.write_all(line(n).as_bytes()).unwrap();
        }
        let kept: String = (0..4).map(line).collect();
        assert_eq!(
            files(&d),
            [("e".into(), line(4)), ("e.1".into(), kept.clone())]
        );
        // In the file a rotation opened (not for append), the next line goes where the cut
        // was, with no hole before it.
        f.write_all(format!("{}{}", line(5), &torn[..7]).as_bytes())
            .unwrap();
        assert_eq!(f.discard_torn_line(), Some(7));
        f.write_all(line(6).as_bytes()).unwrap();
        let now = format!("{}{}{}", line(4), line(5), line(6));
        assert_eq!(files(&d), [("e".into(), now), ("e.1".into(), kept)]);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_failed_rotation_keeps_writing_and_is_said_once_then_its_recovery() {
        let d = scratch("fail");
        let p = d.join("e");
        let mut f = RotatingFile::open(
            &p,
            RotationLimits {
                max_bytes: 15,
                backups: 1,
            },
        )
        .unwrap();
        f.write_all(line(0).as_bytes()).unwrap();
        // A directory where the first backup goes: the rename is refused.
        std::fs::create_dir(d.join("e.1")).unwrap();
        std::fs::write(d.join("e.1/x"), "").unwrap();
        for n in 1..4 {
            f.write_all(line(n).as_bytes()).unwrap();
        }
        let news = f.take_news();
        assert!(
            matches!(&news[..], [RotationNews::Failed(e)] if e.contains("e.1")),
            "{news:?}"
        );
        let kept: String = (0..4).map(line).collect();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), kept);
        assert!(!d.join("e.new").exists(), "the new file is cleaned up");
        std::fs::remove_dir_all(d.join("e.1")).unwrap();
        f.write_all(line(4).as_bytes()).unwrap();
        assert_eq!(f.take_news(), [RotationNews::Recovered]);
        assert_eq!(std::fs::read_to_string(&p).unwrap(), line(4));
        assert_eq!(std::fs::read_to_string(d.join("e.1")).unwrap(), kept);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn reopen_follows_a_file_moved_away() {
        let d = scratch("reopen");
        let p = d.join("e");
        let mut f = RotatingFile::open(
            &p,
            RotationLimits {
                max_bytes: 100,
                backups: 1,
            },
        )
        .unwrap();
        f.write_all(line(0).as_bytes()).unwrap();
        std::fs::rename(&p, d.join("moved")).unwrap();
        f.reopen().unwrap();
        f.write_all(line(1).as_bytes()).unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), line(1));
        assert_eq!(std::fs::read_to_string(d.join("moved")).unwrap(), line(0));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn sizes_and_backups_parse_with_clear_errors() {
        assert_eq!(parse_max_size("100MiB"), Ok(100 << 20));
        assert_eq!(parse_max_size("64M"), Ok(64 << 20));
        assert_eq!(parse_max_size("1G"), Ok(1 << 30));
        assert_eq!(parse_max_size("500000"), Ok(500_000));
        assert_eq!(parse_max_size("0"), Ok(0));
        assert_eq!(parse_max_size(DEFAULT_MAX_SIZE), Ok(100 << 20));
        assert!(parse_max_size("10").unwrap_err().contains("below 4096"));
        for s in ["", "-1", "lots", "1Q", "1e400"] {
            assert!(parse_max_size(s).unwrap_err().contains("not a size"), "{s}");
        }
        assert_eq!(parse_backups("5"), Ok(5));
        assert_eq!(parse_backups("0"), Ok(0));
        for s in ["-1", "1001", "x", ""] {
            assert!(parse_backups(s).unwrap_err().contains("0..=1000"), "{s}");
        }
    }
}
