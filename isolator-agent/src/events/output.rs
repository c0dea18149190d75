//! Where the event stream's lines go (stdout, the --json file, or any writer), written by a
//! thread of its own, so that a full disk, a closed pipe or a reader that stopped reading
//! never holds up a cycle, and so never control. Lines the writer cannot take are dropped
//! and counted; a failing output is said once per outage, and again when it recovers.

use std::{
    fs::File,
    io::{self, Write},
    mem::ManuallyDrop,
    os::fd::FromRawFd,
    path::PathBuf,
    sync::{
        atomic::{AtomicUsize, Ordering},
        mpsc, Arc, Mutex, MutexGuard,
    },
    time::Duration,
};

use crate::events::{
    private_file,
    rotation::{RotatingFile, RotationLimits, RotationNews},
};

/// Lines queued for a writer that does not keep up, at most: beyond, they are dropped.
const MAX_QUEUED_BYTES: usize = 16 << 20;

pub enum Target {
    Stdout,
    /// Appended to, created 0600 (see [`private_file`]), rotated by size (see
    /// [`crate::events::rotation`]); reopened on [`Output::reopen`].
    File(PathBuf, RotationLimits),
    Writer(Box<dyn Write + Send>),
}

impl Target {
    fn describe(&self) -> String {
        match self {
            Target::Stdout => "stdout".into(),
            Target::File(p, _) => p.display().to_string(),
            Target::Writer(_) => "the event writer".into(),
        }
    }
}

/// A change in the output's health, for the agent to report.
#[derive(Debug, Clone, PartialEq)]
pub enum Notice {
    /// Writing failed; lines are lost until it works again.
    Failed { output: String, error: String },
    /// The writer did not keep up (a reader that stopped reading): lines dropped.
    Stalled { output: String },
    /// Writing works again after a failure or a stall; `dropped` lines were lost meanwhile.
    Recovered { output: String, dropped: u64 },
    /// The file could not be rotated: it grows past its limit (no line is lost).
    RotateFailed { output: String, error: String },
    /// Rotating works again.
    RotateRecovered { output: String },
}

enum Msg {
    Line(String),
    Reopen,
    Flush(mpsc::SyncSender<()>),
}

#[derive(Default)]
struct Shared {
    queued_bytes: AtomicUsize,
    notices: Mutex<Notices>,
}

#[derive(Default)]
struct Notices {
    queue: Vec<Notice>,
    /// How many times the agent took the queue: a recovery still in it (not taken since)
    /// can be taken back (see `write_lines`).
    taken: u64,
}

impl Shared {
    fn notices(&self) -> MutexGuard<'_, Notices> {
        self.notices.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub struct Output {
    tx: mpsc::Sender<Msg>,
    shared: Arc<Shared>,
    name: String,
    /// Lines dropped in all (never written), and when the current stall began.
    dropped_total: u64,
    dropped_at_stall: u64,
    stalled: bool,
}

impl Output {
    /// Opens the target (a file must be safe to write as root) and starts its writer.
    pub fn start(target: Target) -> Result<Output, private_file::PrivateFileError> {
        let name = target.describe();
        let writer = match target {
            // fd 1 written directly: std's stdout lock must never be held by a writer
            // blocked on a stalled reader while the process exits.
            // SAFETY: fd 1 stays open for the life of the process; ManuallyDrop never closes it.
            Target::Stdout => Writer::Stream(Box::new(StdoutFd(ManuallyDrop::new(unsafe {
                File::from_raw_fd(1)
            })))),
            Target::File(p, limits) => Writer::File(RotatingFile::open(&p, limits)?),
            Target::Writer(w) => Writer::Stream(w),
        };
        let (tx, rx) = mpsc::channel();
        let shared = Arc::new(Shared::default());
        let thread_shared = shared.clone();
        let thread_name = name.clone();
        std::thread::Builder::new()
            .name("isolator-output".into())
            .spawn(move || write_lines(rx, writer, thread_shared, thread_name))
            .map_err(|e| private_file::PrivateFileError::Io {
                path: PathBuf::from(&name),
                source: e,
            })?;
        Ok(Output {
            tx,
            shared,
            name,
            dropped_total: 0,
            dropped_at_stall: 0,
            stalled: false,
        })
    }

    /// Queues one line (without its newline). Never blocks.
    pub fn send(&mut self, line: String) {
        let len = line.len() + 1;
        let queued = self.shared.queued_bytes.load(Ordering::Relaxed);
        if queued + len > MAX_QUEUED_BYTES {
            if !self.stalled {
                self.stalled = true;
                self.dropped_at_stall = self.dropped_total;
                self.push(Notice::Stalled {
                    output: self.name.clone(),
                });
            }
            self.dropped_total += 1;
            return;
        }
        if self.stalled && queued < MAX_QUEUED_BYTES / 2 {
            self.stalled = false;
            self.push(Notice::Recovered {
                output: self.name.clone(),
                dropped: self.dropped_total - self.dropped_at_stall,
            });
        }
        self.shared.queued_bytes.fetch_add(len, Ordering::Relaxed);
        if self.tx.send(Msg::Line(line)).is_err() {
            // The writer is gone (it cannot be, short of a bug): count, never queue.
            self.shared.queued_bytes.fetch_sub(len, Ordering::Relaxed);
            self.dropped_total += 1;
        }
    }

    fn push(&self, n: Notice) {
        self.shared.notices().queue.push(n);
    }

    /// What happened to the output since the last call (the agent asks once a cycle).
    pub fn notices(&self) -> Vec<Notice> {
        let mut q = self.shared.notices();
        q.taken += 1;
        std::mem::take(&mut q.queue)
    }

    /// Lines never written: dropped while stalled (a write that failed is not counted).
    pub fn dropped(&self) -> u64 {
        self.dropped_total
    }

    /// Opens the file again (after logrotate moved it); stdout and writers stay.
    pub fn reopen(&self) {
        let _ = self.tx.send(Msg::Reopen);
    }

    /// Waits, at most `timeout`, until every line queued so far is written. Returns false
    /// when the writer did not get there (it is blocked).
    pub fn drain(&self, timeout: Duration) -> bool {
        let (ack, done) = mpsc::sync_channel(1);
        self.tx.send(Msg::Flush(ack)).is_ok() && done.recv_timeout(timeout).is_ok()
    }
}

/// write_all that says how much it wrote before an error.
fn write_counted(w: &mut dyn Write, buf: &[u8]) -> (usize, io::Result<()>) {
    let mut done = 0;
    while done < buf.len() {
        match w.write(&buf[done..]) {
            Ok(0) => return (done, Err(io::ErrorKind::WriteZero.into())),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return (done, Err(e)),
        }
    }
    (done, Ok(()))
}

struct StdoutFd(ManuallyDrop<File>);

/// What the writer thread writes to: the file can be reopened and rotates.
enum Writer {
    Stream(Box<dyn Write + Send>),
    File(RotatingFile),
}

impl Writer {
    fn as_write(&mut self) -> &mut dyn Write {
        match self {
            Writer::Stream(w) => &mut **w,
            Writer::File(f) => f,
        }
    }
}

impl Write for StdoutFd {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The writer thread: batches what is queued into one write, notes failures and
/// recoveries. A closed pipe (EPIPE) never comes back: it stops writing.
fn write_lines(rx: mpsc::Receiver<Msg>, mut w: Writer, shared: Arc<Shared>, name: String) {
    let notice = |n: Notice| shared.notices().queue.push(n);
    let mut failing = false;
    let mut closed = false;
    // A write that failed part-way left half a line: in a file it is cut off; in a stream
    // the next write starts a new line, so every line but that one stays valid NDJSON.
    let mut torn = false;
    // Room the cut of a torn line gave back on a failing disk: a write that fits in it
    // says nothing of the disk, and is no recovery (on a disk that stays full, each cut
    // would otherwise take one batch and say "works again" every other cycle).
    let mut cut_room: u64 = 0;
    let mut lost: u64 = 0;
    // The recovery last said (the queue it went into, by how many times the agent had
    // taken one, and its place there): if writing fails again before the agent takes it,
    // it is the same outage, said once.
    let mut recovery: Option<(u64, usize)> = None;
    let mut batch = Vec::with_capacity(64 << 10);
    while let Ok(first) = rx.recv() {
        let mut acks = vec![];
        let mut reopen = false;
        let mut lines = 0u64;
        let mut take = |m: Msg, batch: &mut Vec<u8>| match m {
            Msg::Line(l) => {
                shared
                    .queued_bytes
                    .fetch_sub(l.len() + 1, Ordering::Relaxed);
                batch.extend_from_slice(l.as_bytes());
                batch.push(b'\n');
                lines += 1;
            }
            Msg::Reopen => reopen = true,
            Msg::Flush(a) => acks.push(a),
        };
        // A batch ends at a reopen: what was sent after it (the agent's `reopened` warning
        // first) belongs in the new file, not the one logrotate moved away.
        let mut reopening = matches!(first, Msg::Reopen);
        take(first, &mut batch);
        while batch.len() < (1 << 20) && !reopening {
            match rx.try_recv() {
                Ok(m) => {
                    reopening = matches!(m, Msg::Reopen);
                    take(m, &mut batch)
                }
                Err(_) => break,
            }
        }
        if !batch.is_empty() && !closed {
            if torn {
                batch.insert(0, b'\n');
            }
            let (written, r) = write_counted(w.as_write(), &batch);
            if written > 0 {
                torn = batch[written - 1] != b'\n';
            }
            // A file is cut back to its last whole line; a stream cannot be.
            let mut cut = 0;
            if let (true, Writer::File(f)) = (torn && r.is_err(), &mut w) {
                if let Some(bytes) = f.discard_torn_line() {
                    torn = false;
                    cut = bytes;
                }
            }
            if let Writer::File(f) = &mut w {
                for news in f.take_news() {
                    notice(match news {
                        RotationNews::Failed(error) => Notice::RotateFailed {
                            output: name.clone(),
                            error,
                        },
                        RotationNews::Recovered => Notice::RotateRecovered {
                            output: name.clone(),
                        },
                    });
                }
            }
            match r.and_then(|()| w.as_write().flush()) {
                Ok(()) if failing && (written as u64) <= cut_room => {
                    cut_room -= written as u64;
                }
                Ok(()) if failing => {
                    cut_room = 0;
                    failing = false;
                    let mut q = shared.notices();
                    recovery = Some((q.taken, q.queue.len()));
                    q.queue.push(Notice::Recovered {
                        output: name.clone(),
                        dropped: lost,
                    });
                    lost = 0;
                }
                Ok(()) => {}
                Err(e) => {
                    lost += lines;
                    // What this write put on the disk came out of the room a cut gave.
                    cut_room = cut_room.saturating_sub(written as u64) + cut;
                    closed = e.kind() == io::ErrorKind::BrokenPipe;
                    // (Not a reader gone for good: that is news of its own.)
                    let taken_back = !failing
                        && !closed
                        && recovery.take().is_some_and(|(taken, at)| {
                            let mut q = shared.notices();
                            // Not taken, and nothing queued after it: still the last one.
                            if q.taken != taken || q.queue.len() != at + 1 {
                                return false;
                            }
                            if let Some(Notice::Recovered { dropped, .. }) = q.queue.pop() {
                                lost += dropped;
                            }
                            true
                        });
                    if !failing && !taken_back {
                        let error = if closed {
                            format!("{e}: the reader went away; nothing more is written there")
                        } else {
                            e.to_string()
                        };
                        notice(Notice::Failed {
                            output: name.clone(),
                            error,
                        });
                    }
                    failing = true;
                }
            }
        } else if closed {
            lost += lines;
        }
        batch.clear();
        if reopen {
            if let Writer::File(f) = &mut w {
                match f.reopen() {
                    // A new file starts with a new line.
                    Ok(()) => torn = false,
                    Err(e) => notice(Notice::Failed {
                        output: name.clone(),
                        error: format!("reopen: {e}"),
                    }),
                }
            }
        }
        for a in acks {
            let _ = a.send(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer that fails (as a full disk) while `fail` is set.
    struct Flaky {
        fail: Arc<std::sync::atomic::AtomicBool>,
        got: Arc<Mutex<Vec<u8>>>,
    }

    impl Write for Flaky {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if self.fail.load(Ordering::Relaxed) {
                return Err(io::Error::from_raw_os_error(libc::ENOSPC));
            }
            self.got.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_failing_output_is_said_once_and_its_recovery_too() {
        let fail = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let got = Arc::new(Mutex::new(vec![]));
        let mut o = Output::start(Target::Writer(Box::new(Flaky {
            fail: fail.clone(),
            got: got.clone(),
        })))
        .unwrap();
        for i in 0..5 {
            o.send(format!("{{\"n\":{i}}}"));
            assert!(o.drain(Duration::from_secs(5)));
        }
        let n = o.notices();
        assert_eq!(n.len(), 1, "{n:?}");
        assert!(matches!(&n[0], Notice::Failed { error, .. } if error.contains("No space")));
        fail.store(false, Ordering::Relaxed);
        o.send("{\"n\":5}".into());
        assert!(o.drain(Duration::from_secs(5)));
        assert_eq!(
            o.notices(),
            [Notice::Recovered {
                output: "the event writer".into(),
                dropped: 5
            }]
        );
        assert_eq!(&*got.lock().unwrap(), b"{\"n\":5}\n");
    }

    /// An output that works for one batch between two failures, all before the agent asks,
    /// is one outage: one failure said, and one recovery with every line lost in it.
    #[test]
    fn a_recovery_that_fails_again_before_it_is_said_is_the_same_outage() {
        let fail = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let mut o = Output::start(Target::Writer(Box::new(Flaky {
            fail: fail.clone(),
            got: Arc::new(Mutex::new(vec![])),
        })))
        .unwrap();
        let send = |o: &mut Output, n: usize, failing: bool| {
            fail.store(failing, Ordering::Relaxed);
            for i in 0..n {
                o.send(format!("{{\"n\":{i}}}"));
                assert!(o.drain(Duration::from_secs(5)));
            }
        };
        send(&mut o, 2, true);
        send(&mut o, 1, false);
        send(&mut o, 3, true);
        let n = o.notices();
        assert_eq!(n.len(), 1, "{n:?}");
        assert!(matches!(&n[0], Notice::Failed { .. }), "{n:?}");
        send(&mut o, 1, false);
        assert_eq!(
            o.notices(),
            [Notice::Recovered {
                output: "the event writer".into(),
                dropped: 5
            }]
        );
        // Once the recovery was said, the next failure is a new outage.
        send(&mut o, 1, true);
        let n = o.notices();
        assert!(matches!(&n[..], [Notice::Failed { .. }]), "{n:?}");
    }

    /// A writer that takes `room` bytes, then fails (a disk filling up mid-line).
    struct Filling {
        room: Arc<AtomicUsize>,
        got: Arc<Mutex<Vec<u8>>>,
    }

    impl Write for Filling {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let room = self.room.load(Ordering::Relaxed);
            if room == 0 {
                return Err(io::Error::from_raw_os_error(libc::ENOSPC));
            }
            let n = buf.len().min(room);
            self.room.fetch_sub(n, Ordering::Relaxed);
            self.got.lock().unwrap().extend_from_slice(&buf[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_line_torn_by_a_full_disk_does_not_swallow_the_next() {
        let room = Arc::new(AtomicUsize::new(12));
        let got = Arc::new(Mutex::new(vec![]));
        let mut o = Output::start(Target::Writer(Box::new(Filling {
            room: room.clone(),
            got: got.clone(),
        })))
        .unwrap();
        o.send("{\"n\":1}".into()); // 8 bytes
        assert!(o.drain(Duration::from_secs(5)));
        o.send("{\"n\":2,\"x\":1}".into()); // only 4 bytes of it fit
        assert!(o.drain(Duration::from_secs(5)));
        room.store(1 << 20, Ordering::Relaxed);
        o.send("{\"n\":3}".into());
        assert!(o.drain(Duration::from_secs(5)));
        let text = String::from_utf8(got.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines, ["{\"n\":1}", "{\"n\"", "{\"n\":3}"]);
    }

    #[test]
    fn the_file_rotates_in_the_writer_and_a_failed_rotation_is_a_notice() {
        use std::os::unix::fs::PermissionsExt;
        let d = std::env::temp_dir().join(format!("isolator-out-rot-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        let p = d.join("e.ndjson");
        let limits = RotationLimits {
            max_bytes: 4096,
            backups: 2,
        };
        let mut o = Output::start(Target::File(p.clone(), limits)).unwrap();
        let line = format!("{{\"x\":\"{}\"}}", "y".repeat(1000));
        for _ in 0..20 {
            o.send(line.clone());
            assert!(o.drain(Duration::from_secs(5)));
        }
        assert!(o.notices().is_empty());
        let mut names: Vec<String> = std::fs::read_dir(&d)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["e.ndjson", "e.ndjson.1", "e.ndjson.2"]);
        // A directory under a backup's name: rotating fails, writing goes on.
        std::fs::remove_file(d.join("e.ndjson.1")).unwrap();
        std::fs::create_dir_all(d.join("e.ndjson.1/busy")).unwrap();
        for _ in 0..5 {
            o.send(line.clone());
            assert!(o.drain(Duration::from_secs(5)));
        }
        let n = o.notices();
        assert!(
            matches!(&n[..], [Notice::RotateFailed { error, .. }] if error.contains("e.ndjson.1")),
            "{n:?}"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A writer that blocks until released, as stdout with a reader that stopped reading.
    struct Stalled(Arc<(Mutex<bool>, std::sync::Condvar)>);

    impl Write for Stalled {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let (lock, cv) = &*self.0;
            let mut open = lock.lock().unwrap();
            while !*open {
                open = cv.wait(open).unwrap();
            }
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_stalled_writer_never_blocks_the_sender() {
        let gate = Arc::new((Mutex::new(false), std::sync::Condvar::new()));
        let mut o = Output::start(Target::Writer(Box::new(Stalled(gate.clone())))).unwrap();
        let line = "x".repeat(4096);
        // Far more than the queue holds: every send returns at once.
        for _ in 0..(2 * MAX_QUEUED_BYTES / 4096) {
            o.send(line.clone());
        }
        assert!(o.dropped() > 0);
        assert!(
            !o.drain(Duration::from_millis(200)),
            "the writer is blocked"
        );
        assert!(matches!(o.notices()[..], [Notice::Stalled { .. }]));
        let (lock, cv) = &*gate;
        *lock.lock().unwrap() = true;
        cv.notify_all();
        assert!(o.drain(Duration::from_secs(30)));
        o.send(line);
        assert!(matches!(o.notices()[..], [Notice::Recovered { .. }]));
    }

    #[test]
    fn what_follows_a_reopen_goes_to_the_new_file() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("isolator-reopen-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let path = dir.join("events.ndjson");
        let file = RotatingFile::open(&path, RotationLimits::OFF).unwrap();
        // All queued before the writer runs: one batch would take them all.
        let (tx, rx) = mpsc::channel();
        tx.send(Msg::Line("before".into())).unwrap();
        let moved = dir.join("moved.ndjson");
        tx.send(Msg::Reopen).unwrap();
        tx.send(Msg::Line("after".into())).unwrap();
        drop(tx);
        // logrotate moved the file before the writer reopened it.
        std::fs::rename(&path, &moved).unwrap();
        write_lines(
            rx,
            Writer::File(file),
            Arc::new(Shared::default()),
            "test".into(),
        );
        assert_eq!(std::fs::read_to_string(&moved).unwrap(), "before\n");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "after\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
