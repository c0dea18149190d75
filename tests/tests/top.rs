//! `isolator top` as an operator sees it: in a real terminal (tmux), attached to a live
//! agent that is protecting a reader from a noisy writer.

use std::{
    process::Command,
    time::{Duration, Instant},
};

use isolator_tests::*;

/// A private tmux server running one command in a 100x30 pane; killed on drop.
struct Tmux {
    server: String,
}

impl Tmux {
    fn start(cmd: &str) -> Tmux {
        let t = Tmux {
            server: unique("isolator-top"),
        };
        // The shell says how the command ended and how it left the terminal (canonical
        // mode and echo back on), and keeps the pane open to be read.
        let wrapped = format!(
            "{cmd}; echo TOP-EXIT=$?; echo TTY: $(stty -a | tr ' ' '\\n' | grep -x -e icanon -e -icanon -e echo -e -echo); sleep 120"
        );
        t.tmux(&[
            "new-session",
            "-d",
            "-s",
            "top",
            "-x",
            "100",
            "-y",
            "30",
            &wrapped,
        ]);
        t
    }

    fn tmux(&self, args: &[&str]) -> String {
        run_ok(Command::new("tmux").args(["-L", &self.server]).args(args))
    }

    fn pane(&self) -> String {
        self.tmux(&["capture-pane", "-p", "-t", "top"])
    }

    /// Keys as tmux names them (`Enter`, `Escape`) or literal text with `-l`.
    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "top"];
        args.extend_from_slice(keys);
        self.tmux(&args);
    }

    fn type_text(&self, text: &str) {
        self.tmux(&["send-keys", "-t", "top", "-l", text]);
    }

    /// The pane once the command has ended, its lines joined (a one-line message wraps).
    /// Captured with `-J`: without it a space that falls in the last column is trimmed as
    /// trailing and two words join (CI: "socketis", the scratch path's length moving the
    /// wrap).
    fn ended(&self) -> String {
        self.wait_for(
            "the exit",
            |p| p.contains("TOP-EXIT="),
            Duration::from_secs(10),
        );
        self.tmux(&["capture-pane", "-p", "-J", "-t", "top"])
            .replace('\n', "")
    }

    /// The pane once `pred` holds on it; panics with the pane after `timeout`.
    fn wait_for(&self, what: &str, pred: impl Fn(&str) -> bool, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let pane = self.pane();
            if pred(&pane) {
                return pane;
            }
            if Instant::now() > deadline {
                panic!("the pane never showed {what}:\n{pane}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.server, "kill-server"])
            .status();
    }
}

/// The pane line that starts with a row name (the table pads names to their column).
fn row<'a>(pane: &'a str, name: &str) -> Option<&'a str> {
    pane.lines().find(|l| l.starts_with(&format!("{name} ")))
}

fn line_index(pane: &str, name: &str) -> usize {
    pane.lines()
        .position(|l| l.starts_with(&format!("{name} ")))
        .unwrap_or_else(|| panic!("no row {name} in\n{pane}"))
}

#[test]
fn top_in_a_terminal_follows_a_live_agent_through_the_noisy_neighbor() {
    require_root();
    require_tool("fio");
    require_tool("tmux");
    let scratch = Scratch::new();
    let db = TestCgroup::new("iso-top-db");
    let backup = TestCgroup::new("iso-top-backup");
    let (rfile, wfile) = noisy::files(&scratch);
    let config = scratch.path("isolator.toml");
    std::fs::write(&config, noisy::config(&db, &backup, 6)).unwrap();
    let socket = scratch.path("isolator.sock");
    let mut agent = Agent::start_controlling(
        &config,
        &scratch.path("journal"),
        &["--socket", socket.to_str().unwrap()],
    );
    let tmux = Tmux::start(&format!(
        "{} top --socket {}",
        isolator_bin().display(),
        socket.display()
    ));

    std::thread::scope(|s| {
        let workload =
            s.spawn(|| noisy::run_pair(&scratch, (&db, &backup), (&rfile, &wfile), 3, 16));
        // The services and their states, once the agent has acted on the writer.
        let pane = tmux.wait_for(
            "backup throttled",
            |p| row(p, "backup").is_some_and(|l| l.contains("throttled")),
            Duration::from_secs(40),
        );
        assert!(pane.starts_with("isolator top"), "{pane}");
        assert!(pane.contains("policy adaptive"), "{pane}");
        let db_row = row(&pane, "db").unwrap_or_else(|| panic!("no db row:\n{pane}"));
        assert!(
            db_row.contains("6.0ms") && (db_row.contains(" ok ") || db_row.contains("violating")),
            "db row: {db_row}"
        );
        assert!(
            row(&pane, "backup").unwrap().contains(" w"),
            "backup has a write limit:\n{pane}"
        );

        // Sort: by state (worst first) to start with; then by name, backup above db.
        assert!(pane.contains("sort STATE"), "{pane}");
        tmux.keys(&["s", "s"]);
        let pane = tmux.wait_for(
            "sort NAME",
            |p| p.contains("sort NAME"),
            Duration::from_secs(5),
        );
        assert!(
            line_index(&pane, "backup") < line_index(&pane, "db"),
            "{pane}"
        );

        // Resizing redraws: at 80 columns the lesser columns give way, wider they are back.
        let header = |p: &str| {
            p.lines()
                .find(|l| l.starts_with("NAME"))
                .unwrap_or("")
                .to_string()
        };
        assert!(header(&pane).contains("P50"), "{pane}");
        tmux.tmux(&["resize-window", "-t", "top", "-x", "80", "-y", "24"]);
        let pane = tmux.wait_for(
            "the 80-column table",
            |p| header(p).contains("STATE") && !header(p).contains("P50"),
            Duration::from_secs(5),
        );
        assert!(pane.lines().all(|l| l.chars().count() <= 80), "{pane}");
        assert!(
            row(&pane, "db").is_some() && row(&pane, "backup").is_some(),
            "{pane}"
        );
        tmux.tmux(&["resize-window", "-t", "top", "-x", "100", "-y", "30"]);
        tmux.wait_for(
            "the wider table",
            |p| header(p).contains("P50"),
            Duration::from_secs(5),
        );

        // Filter: only db is left.
        tmux.keys(&["/"]);
        tmux.type_text("db");
        tmux.keys(&["Enter"]);
        let pane = tmux.wait_for(
            "filter 'db'",
            |p| p.contains("filter 'db'"),
            Duration::from_secs(5),
        );
        assert!(row(&pane, "db").is_some(), "{pane}");
        assert!(
            row(&pane, "backup").is_none(),
            "backup is filtered out:\n{pane}"
        );

        // Detail of db: its latency histogram and its SLO.
        tmux.keys(&["Enter"]);
        let pane = tmux.wait_for(
            "db's detail",
            |p| p.contains("┌ db") && p.contains("latency this cycle"),
            Duration::from_secs(5),
        );
        assert!(pane.contains("(SLO 6.0ms)"), "{pane}");

        // The action log has the agent's decision on the writer.
        tmux.keys(&["Escape", "Escape", "a"]);
        let pane = tmux.wait_for(
            "the decision on backup",
            |p| p.contains("newest first") && p.contains("backup: wbps"),
            Duration::from_secs(5),
        );
        assert!(pane.contains("on 254:0") || pane.contains(" on "), "{pane}");

        tmux.keys(&["Escape"]);
        let run = workload.join().unwrap();
        assert!(run.reader_ok && run.writer_ok, "fio failed");
    });

    // The agent goes away: top says so, and keeps its last view.
    let (status, stderr) = agent.stop();
    assert!(status.success(), "agent: {stderr}");
    let pane = tmux.wait_for(
        "the agent's stop",
        |p| p.contains("agent stopped (SIGTERM)"),
        Duration::from_secs(10),
    );
    assert!(row(&pane, "db").is_some(), "{pane}");
    tmux.keys(&["q"]);
    let pane = tmux.wait_for("top's exit", |p| p.contains("TTY:"), Duration::from_secs(5));
    assert!(
        pane.contains("TOP-EXIT=0") && pane.contains("TTY: icanon echo"),
        "{pane}"
    );
    let events = agent.events();
    // What the pane showed is what the agent decided.
    assert!(events
        .iter()
        .any(|e| e["type"] == "decision" && e["service"] == "backup" && e["knob"] == "wbps"));
    assert!(!socket.exists(), "the agent removes its socket");

    // The stream this agent just wrote, read by top's own model in this process, in the
    // types the agent writes: every line is an event, and the rows follow the run.
    use isolator::{
        config::SloClass,
        top::model::{ActionKind, Link, Model, RowKey},
    };
    let mut model = Model::default();
    let mut backup_states = std::collections::BTreeSet::new();
    for line in std::fs::read_to_string(&agent.events).unwrap().lines() {
        model
            .ingest_line(line)
            .unwrap_or_else(|e| panic!("top cannot read the agent's line ({e}): {line}"));
        if let Some(r) = model.row(&RowKey::Service("backup".into())) {
            backup_states.insert(r.state.label());
        }
    }
    let db_row = model.row(&RowKey::Service("db".into())).expect("a db row");
    assert_eq!(db_row.slo, Some(SloClass::latency_p999(6_000_000)));
    assert_eq!(db_row.cgroups, [db.rel_path()]);
    assert!(backup_states.contains("throttled"), "{backup_states:?}");
    assert!(model
        .actions
        .iter()
        .any(|a| a.kind == ActionKind::Decision && a.text.starts_with("backup: wbps")));
    assert_eq!(model.link, Link::Stopped("SIGTERM".into()));

    // `isolator top --replay` shows the recorded run: paused at the first cycle, then the
    // last one (the writer capped), then one back.
    let replay = Tmux::start(&format!(
        "{} top --replay {}",
        isolator_bin().display(),
        agent.events.display()
    ));
    let pane = replay.wait_for(
        "the replay's first cycle",
        |p| p.contains("REPLAY") && p.contains("cycle 1/") && p.contains("paused"),
        Duration::from_secs(10),
    );
    let total: u64 = pane
        .split("cycle 1/")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no cycle count in\n{pane}"));
    assert!(total >= 10, "{pane}");
    replay.keys(&["]"]);
    let last = format!("cycle {total}/{total}");
    let pane = replay.wait_for(&last, |p| p.contains(&last), Duration::from_secs(5));
    assert!(row(&pane, "db").is_some(), "{pane}");
    replay.keys(&["T"]);
    let before = format!("cycle {}/{total}", total - 1);
    replay.wait_for(&before, |p| p.contains(&before), Duration::from_secs(5));
    replay.keys(&["q"]);
    let end = replay.ended();
    assert!(end.contains("TOP-EXIT=0"), "{end}");
}

#[test]
fn top_says_what_is_wrong_on_stderr_before_drawing() {
    require_root();
    require_tool("tmux");
    let scratch = Scratch::new();
    let top = |socket: &std::path::Path| {
        let out = Command::new(isolator_bin())
            .args(["top", "--socket", socket.to_str().unwrap()])
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // Not a terminal: a message, not escape codes.
    let (code, err) = top(&scratch.path("none.sock"));
    assert_eq!(code, Some(1));
    assert!(
        err.starts_with("error: isolator top draws on a terminal"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");

    // In a terminal: a root-only socket for a user, and an agent of another schema.
    let mut agent = Agent::start(&["--socket", scratch.path("a.sock").to_str().unwrap()]);
    let nobody = Tmux::start(&format!(
        "setpriv --reuid=65534 --regid=65534 --clear-groups {} top --socket {}",
        isolator_bin().display(),
        scratch.path("a.sock").display()
    ));
    let pane = nobody.ended();
    assert!(
        pane.contains("permission denied; the agent's event socket is root-only"),
        "{pane}"
    );
    assert!(pane.contains("TOP-EXIT=1"), "{pane}");
    agent.stop();

    let fake = scratch.path("future.sock");
    let listener = std::os::unix::net::UnixListener::bind(&fake).unwrap();
    let server = std::thread::spawn(move || {
        use std::io::Write;
        let (mut c, _) = listener.accept().unwrap();
        c.write_all(b"{\"schema\":2,\"type\":\"agent_start\"}\n")
            .unwrap();
        std::thread::sleep(Duration::from_millis(500));
    });
    let future = Tmux::start(&format!(
        "{} top --socket {}",
        isolator_bin().display(),
        fake.display()
    ));
    let pane = future.ended();
    assert!(pane.contains("the agent speaks event schema 2"), "{pane}");
    assert!(pane.contains("TOP-EXIT=1"), "{pane}");
    server.join().unwrap();
}

#[test]
fn without_an_agent_top_collects_itself_and_sigterm_restores_the_terminal() {
    require_root();
    require_tool("tmux");
    let scratch = Scratch::new();
    let pid_file = scratch.path("top.pid");
    let tmux = Tmux::start(&format!(
        "sh -c 'echo $$ > {}; exec {} top --socket {}'",
        pid_file.display(),
        isolator_bin().display(),
        scratch.path("no-agent.sock").display()
    ));
    // Its own collector sees I/O done now.
    make_file(&scratch.path("f.dat"), 64 << 20);
    let pane = tmux.wait_for(
        "the own collector's view",
        |p| p.contains("own collector, observe only") && p.contains("unconf"),
        Duration::from_secs(20),
    );
    assert!(pane.contains("policy observe only"), "{pane}");
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // SAFETY: plain kill(2) on the process the pane runs.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let pane = tmux.wait_for(
        "top's exit",
        |p| p.contains("TTY:"),
        Duration::from_secs(10),
    );
    assert!(
        pane.contains("TOP-EXIT=0") && pane.contains("TTY: icanon echo"),
        "{pane}"
    );
    assert!(
        !pane.contains("isolator top  "),
        "the view is gone from the screen:\n{pane}"
    );
}

/// A closed pane (or a dropped ssh session) hangs up top's terminal. crossterm's own wait
/// spun on the hung-up terminal at 100 % CPU and never looked at SIGHUP, so top, with its
/// own collector's programs attached, outlived its terminal.
#[test]
fn top_ends_when_its_terminal_hangs_up() {
    require_root();
    require_tool("tmux");
    let scratch = Scratch::new();
    let pid_file = scratch.path("top.pid");
    let tmux = Tmux::start(&format!(
        "sh -c 'echo $$ > {}; exec {} top --socket {}'",
        pid_file.display(),
        isolator_bin().display(),
        scratch.path("no-agent.sock").display()
    ));
    tmux.wait_for(
        "the own collector's view",
        |p| p.contains("own collector, observe only"),
        Duration::from_secs(20),
    );
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    drop(tmux);
    // Gone, or a zombie waiting for init to reap it.
    let state = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                s.rsplit(") ")
                    .next()
                    .map(|r| r.chars().next().unwrap_or('?'))
            })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while state().is_some_and(|s| s != 'Z') && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    let left = state().filter(|&s| s != 'Z');
    if left.is_some() {
        // SAFETY: plain kill(2) on the process the pane ran, so the test leaves nothing.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    assert_eq!(
        left, None,
        "top (pid {pid}) still running 10 s after its terminal hung up"
    );
}
