//! `isolator top`: a top-like view of every service's I/O, SLO state and the agent's actions.
//! It reads a running agent's event socket; with no agent it runs an observe-only collector
//! of its own; with `--replay FILE` it shows a recorded stream. The [`model`], [`app`] and
//! [`replay`] are pure; [`view`] draws; this module owns the terminal and the event sources.

pub mod app;
pub mod model;
pub mod replay;
pub mod view;

use std::{
    io::{self, BufRead, BufReader, Write},
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc::{self, Receiver, Sender, TryRecvError},
    },
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use ratatui::crossterm::event::{self, Event as TermEvent, KeyEventKind};

use crate::{
    agent::{Agent, RunOptions},
    collect::probe,
    events::NdjsonSink,
    privileges,
};
use app::{App, Flow};
use model::StreamError;

/// How often a lost agent is looked for again.
const RECONNECT_EVERY: Duration = Duration::from_secs(2);
/// Longest wait for the agent's first event before the view starts.
const FIRST_EVENT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest wait for a key between two draws.
const IDLE_WAIT: Duration = Duration::from_millis(250);

#[derive(clap::Args)]
pub struct TopOptions {
    /// The running agent's event socket (`isolator run --socket`).
    #[arg(long, value_name = "PATH", default_value = crate::events::stream::DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// Cycle length of the collector top runs itself when no agent serves the socket.
    #[arg(long, default_value = "1s", value_parser = crate::agent::parse_interval)]
    pub interval: Duration,
    /// Kernel BTF, for the collector top runs itself.
    #[arg(long, value_name = "PATH", default_value = probe::DEFAULT_BTF)]
    pub btf: PathBuf,
    /// Docker Engine API socket, for container names in the collector top runs itself.
    #[arg(long, value_name = "PATH", default_value = "/var/run/docker.sock")]
    pub docker_socket: PathBuf,
    /// containerd's API socket, for pod names in the collector top runs itself.
    #[arg(long, value_name = "PATH", default_value = crate::identify::containerd::DEFAULT_SOCKET)]
    pub containerd_socket: PathBuf,
    /// Show a recorded run instead (a file `isolator run --json FILE` wrote): step, play
    /// and jump through its cycles.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["socket", "interval", "btf", "docker_socket", "containerd_socket"])]
    pub replay: Option<PathBuf>,
}

enum Feed {
    Line(String),
    Lost(String),
}

static TERMINATE: AtomicBool = AtomicBool::new(false);

extern "C" fn on_terminate(_: libc::c_int) {
    TERMINATE.store(true, Ordering::Relaxed);
}

fn need_terminal() -> Result<()> {
    use std::io::IsTerminal;
    if !io::stdout().is_terminal() || !io::stdin().is_terminal() {
        bail!("isolator top draws on a terminal and this is not one; run it in a terminal, or read the events with 'isolator run' (NDJSON)");
    }
    Ok(())
}

/// Reads and indexes a recording; every way it can be unusable is one line.
pub fn load_replay(path: &Path) -> Result<replay::Replay> {
    let bytes = std::fs::read(path).map_err(|e| {
        anyhow::anyhow!(
            "cannot read {}: {e}; check the path (a file 'isolator run --json FILE' wrote)",
            path.display()
        )
    })?;
    // Invalid UTF-8 makes broken lines, not the end of the replay.
    let text = match String::from_utf8(bytes) {
        Ok(t) => t,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    };
    let rec =
        replay::Recording::parse(text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok(replay::Replay::new(rec))
}

pub fn run(opts: TopOptions) -> Result<()> {
    if let Some(path) = &opts.replay {
        // The file first: a bad one is said even off a terminal.
        let replay = load_replay(path)?;
        need_terminal()?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| path.display().to_string());
        let mut app = App::replaying(format!("replay {name}"), replay);
        install_signal_handlers();
        let result = match ratatui::try_init() {
            Ok(mut terminal) => event_loop(&mut terminal, &mut app, None),
            Err(e) => Err(anyhow::Error::from(e).context("cannot set up the terminal")),
        };
        ratatui::restore();
        return result;
    }
    need_terminal()?;
    let (tx, rx) = mpsc::channel();
    let (source, own) = match UnixStream::connect(&opts.socket) {
        Ok(stream) => {
            let reader = first_event(stream, &opts.socket, &tx)?;
            let socket = opts.socket.clone();
            std::thread::spawn(move || follow_agent(&socket, Some(reader), tx));
            (format!("agent on {}", opts.socket.display()), None)
        }
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => bail!(
            "cannot read {}: permission denied; the agent's event socket is root-only (mode 0600): run 'sudo isolator top'",
            opts.socket.display()
        ),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
            ) =>
        {
            if !privileges::can_load_bpf(privileges::effective_caps()) {
                bail!(
                    "no agent serves {} and collecting without one needs root; start 'isolator run', or run 'sudo isolator top'",
                    opts.socket.display()
                );
            }
            let own = OwnCollector::start(&opts, tx)?;
            (
                format!(
                    "own collector, observe only (no agent on {})",
                    opts.socket.display()
                ),
                Some(own),
            )
        }
        Err(e) => bail!(
            "cannot connect to {}: {e}; check --socket",
            opts.socket.display()
        ),
    };
    install_signal_handlers();
    let mut app = App::new(source);
    // Restores the terminal on panic too (ratatui's hook).
    let result = match ratatui::try_init() {
        Ok(mut terminal) => event_loop(&mut terminal, &mut app, Some(&rx)),
        Err(e) => Err(anyhow::Error::from(e).context("cannot set up the terminal")),
    };
    ratatui::restore();
    if let Some(own) = own {
        own.stop();
    }
    result
}

fn install_signal_handlers() {
    // SAFETY: the handlers only store to an atomic.
    unsafe {
        for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::signal(sig, on_terminate as *const () as libc::sighandler_t);
        }
    }
}

/// Reads the agent's first event before the view starts, so an incompatible agent is an
/// error on stderr rather than a broken screen.
fn first_event(
    stream: UnixStream,
    socket: &Path,
    tx: &Sender<Feed>,
) -> Result<BufReader<UnixStream>> {
    stream.set_read_timeout(Some(FIRST_EVENT_TIMEOUT))?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).with_context(|| {
        format!(
            "{} accepted but sent nothing within {} s; is it an isolator agent's --socket?",
            socket.display(),
            FIRST_EVENT_TIMEOUT.as_secs()
        )
    })?;
    match model::parse_event(&line) {
        Ok(_) => {}
        Err(e @ StreamError::Schema(_)) => bail!("{e}"),
        Err(e) => bail!(
            "{} does not speak isolator events ({e}); check --socket",
            socket.display()
        ),
    }
    reader.get_ref().set_read_timeout(None)?;
    let _ = tx.send(Feed::Line(line));
    Ok(reader)
}

/// Forwards the agent's lines; when the agent goes away, says so and reconnects.
fn follow_agent(socket: &Path, mut reader: Option<BufReader<UnixStream>>, tx: Sender<Feed>) {
    loop {
        if let Some(r) = reader.take() {
            let mut why = "the agent closed its event stream".to_string();
            for line in r.lines() {
                match line {
                    Ok(l) => {
                        if tx.send(Feed::Line(l)).is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        why = format!("reading {}: {e}", socket.display());
                        break;
                    }
                }
            }
            if tx.send(Feed::Lost(why)).is_err() {
                return;
            }
        }
        std::thread::sleep(RECONNECT_EVERY);
        match UnixStream::connect(socket) {
            Ok(s) => reader = Some(BufReader::new(s)),
            Err(e) => {
                let why = format!("no agent on {} ({e})", socket.display());
                if tx.send(Feed::Lost(why)).is_err() {
                    return;
                }
            }
        }
    }
}

fn event_loop(
    terminal: &mut ratatui::DefaultTerminal,
    app: &mut App,
    rx: Option<&Receiver<Feed>>,
) -> Result<()> {
    let mut last = Instant::now();
    loop {
        if TERMINATE.load(Ordering::Relaxed) {
            return Ok(());
        }
        let now = Instant::now();
        app.tick(now - last);
        last = now;
        if let Some(rx) = rx {
            take_feed(app, rx);
        }
        terminal.draw(|f| view::render(f, app))?;
        // A playing replay wakes for its next cycle.
        let wait = app
            .until_next()
            .map_or(IDLE_WAIT, |d| d.clamp(Duration::from_millis(1), IDLE_WAIT));
        match wait_for_terminal(wait) {
            TerminalWait::HungUp => return Ok(()),
            TerminalWait::Idle => {}
            // Input is waiting: crossterm reads it, all of it (it buffers what one read
            // brings, which the terminal then no longer reports), without waiting itself.
            TerminalWait::Input => loop {
                match event::poll(Duration::ZERO) {
                    Ok(true) => {
                        if let TermEvent::Key(k) = event::read()? {
                            if k.kind != KeyEventKind::Release && app.key(k) == Flow::Quit {
                                return Ok(());
                            }
                        }
                    }
                    Ok(false) => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => break,
                    Err(e) => return Err(e.into()),
                }
            },
        }
    }
}

/// Takes what the agent sent; bounded, so a flood of events never starves the keyboard.
fn take_feed(app: &mut App, rx: &Receiver<Feed>) {
    for _ in 0..20_000 {
        match rx.try_recv() {
            Ok(Feed::Line(l)) => match app.ingest_line(&l) {
                Err(e @ StreamError::Schema(_)) => app.live_mut().lost(e.to_string()),
                // A line that is not an event is skipped; the stream goes on.
                Err(StreamError::NotAnEvent(_)) | Ok(()) => {}
            },
            Ok(Feed::Lost(why)) => app.live_mut().lost(why),
            Err(TryRecvError::Empty) => break,
            Err(TryRecvError::Disconnected) => {
                app.live_mut().lost("the collector stopped".into());
                break;
            }
        }
    }
}

enum TerminalWait {
    Input,
    /// Nothing, or a signal interrupted the wait (the loop looks at TERMINATE).
    Idle,
    /// The terminal is gone (closed tmux pane, dropped ssh session).
    HungUp,
}

/// Waits for the terminal (stdin: top refuses to start without one). crossterm's own wait
/// never returns once the terminal hangs up: it spins on the hung-up descriptor and the
/// SIGHUP flag is never looked at. So the wait is done here, and crossterm only reads.
fn wait_for_terminal(timeout: Duration) -> TerminalWait {
    let mut fd = libc::pollfd {
        fd: libc::STDIN_FILENO,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let rc = unsafe { libc::poll(&mut fd, 1, timeout.as_millis() as libc::c_int) };
    if rc <= 0 {
        TerminalWait::Idle
    } else if fd.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
        TerminalWait::HungUp
    } else {
        TerminalWait::Input
    }
}

/// Sends each NDJSON line the in-process agent writes to the view.
struct LineWriter {
    tx: Sender<Feed>,
    buf: Vec<u8>,
}

impl Write for LineWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(data);
        while let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.buf.drain(..=i).collect();
            let text = String::from_utf8_lossy(&line[..i]).into_owned();
            self.tx
                .send(Feed::Line(text))
                .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "top has quit"))?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// An observe-only agent on a thread of its own, for when no agent runs.
struct OwnCollector {
    stop: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl OwnCollector {
    fn start(opts: &TopOptions, tx: Sender<Feed>) -> Result<OwnCollector> {
        let run = RunOptions {
            interval: opts.interval,
            btf: opts.btf.clone(),
            docker_socket: opts.docker_socket.clone(),
            containerd_socket: opts.containerd_socket.clone(),
            // Observe only, and its events are for this view alone.
            config: None,
            socket: "off".into(),
            ..RunOptions::defaults()?
        };
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = ready_tx.send(Err(format!("cannot start a runtime: {e}")));
                    return;
                }
            };
            rt.block_on(async move {
                let sink = NdjsonSink::to_writer(Box::new(LineWriter { tx, buf: vec![] }));
                let agent = match Agent::start_with_sink(&run, sink) {
                    Ok(a) => a,
                    Err(e) => {
                        let _ = ready_tx.send(Err(format!("{e:#}")));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(()));
                let quit = async {
                    let _ = stopped.await;
                    "quit"
                };
                if let Err(e) = agent.run_until(run.interval, quit, None).await {
                    tracing::warn!(error = %format!("{e:#}"), "collector stopped");
                }
            });
        });
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(OwnCollector { stop, thread }),
            Ok(Err(e)) => bail!("{e}"),
            Err(_) => bail!("the collector thread ended before starting"),
        }
    }

    /// Detaches the programs and waits for the thread.
    fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.thread.join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error_of(name: &str, content: Option<&[u8]>) -> String {
        let path = std::env::temp_dir().join(format!("isolator-top-{}-{name}", std::process::id()));
        if let Some(c) = content {
            std::fs::write(&path, c).unwrap();
        }
        let e = load_replay(&path).err().map(|e| format!("{e:#}"));
        let _ = std::fs::remove_file(&path);
        e.unwrap_or_default()
    }

    #[test]
    fn a_file_that_cannot_be_replayed_is_one_line_that_says_why() {
        let missing = error_of("missing", None);
        assert!(
            missing.contains("cannot read") && missing.contains("No such file"),
            "{missing}"
        );
        let garbage = error_of("garbage", Some(b"\xff\xfe binary\nplain text\n"));
        assert!(
            garbage.contains("no isolator events in its 2 lines"),
            "{garbage}"
        );
        let newer = error_of("newer", Some(b"{\"schema\":9,\"type\":\"agent_start\"}\n"));
        assert!(
            newer.contains("line 1: the agent speaks event schema 9"),
            "{newer}"
        );
        for e in [missing, garbage, newer] {
            assert!(!e.contains('\n'), "{e}");
        }
        let rec = crate::top::model::tests::RECORDED;
        assert!(error_of("ok", Some(rec.as_bytes())).is_empty());
    }
}
