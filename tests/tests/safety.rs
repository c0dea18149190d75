//! Safe to trust with cgroup limits: the agent never overwrites an operator's value, never
//! leaves a limit behind however it ends, never stops controlling because its output broke,
//! never writes through a file an attacker aimed, and only one agent per host enforces.
//! Each test sets a real limit (a best-effort service's ceiling on a cgroup reading the
//! disk) and looks at the kernel's knob, not only at the agent's word.

use std::{
    io::{BufRead, BufReader, Read},
    os::unix::{fs::PermissionsExt, net::UnixStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use isolator_tests::*;
use serde_json::Value;

/// Cgroups under a best-effort service with a 50 MB/s ceiling (split evenly between them),
/// the first one reading a file on the disk, each with the operator's own limit from before
/// the agent starts.
struct Rig {
    scratch: Scratch,
    cgroups: Vec<TestCgroup>,
    dev: String,
    config: PathBuf,
    journal: PathBuf,
    readers: Vec<Child>,
}

const OPERATORS: &str = "987654321";
const CEILING: &str = "50000000";

impl Rig {
    /// `n` cgroups in the service, the first one reading for `seconds`.
    fn new(n: usize, seconds: u64) -> Rig {
        require_root();
        let scratch = Scratch::new();
        let file = scratch.path("r.dat");
        make_file(&file, 64 << 20);
        let dev = disk_of(&file);
        let prefix = unique("iso-safety");
        let cgroups: Vec<TestCgroup> = (0..n).map(|_| TestCgroup::new(&prefix)).collect();
        for c in &cgroups {
            c.set_rbps(&dev, OPERATORS);
        }
        let config = scratch.path("isolator.toml");
        std::fs::write(
            &config,
            format!(
                "[[service]]\nname = \"backup\"\ncgroup = \"/{prefix}-*\"\nclass = \"best-effort\"\nceiling = \"50MB/s\"\n"
            ),
        )
        .unwrap();
        let journal = scratch.path("journal");
        let readers = vec![cgroups[0].spawn(&format!(
            "{} --path {} --op read --bytes 1099511627776 --bs 1048576 --direct --seconds {seconds}",
            loadgen_bin().display(),
            file.display()
        ))];
        Rig {
            scratch,
            cgroups,
            dev,
            config,
            journal,
            readers,
        }
    }

    fn start(&self, extra: &[&str], env: &[(&str, &str)]) -> Agent {
        let mut args = vec![
            "--interval",
            "1s",
            "--config",
            self.config.to_str().unwrap(),
            "--journal-dir",
            self.journal.to_str().unwrap(),
            "--docker-socket",
            "off",
        ];
        args.extend_from_slice(extra);
        Agent::start_with_env(&args, env)
    }

    fn rbps(&self, i: usize) -> String {
        self.cgroups[i].rbps(&self.dev)
    }

    /// Waits until the ceiling is in the kernel's knob of cgroup `i`.
    fn wait_for_ceiling(&self, i: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.rbps(i) != CEILING {
            assert!(
                Instant::now() < deadline,
                "the ceiling never reached the knob (it holds {})",
                self.rbps(i)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        for r in &mut self.readers {
            let _ = r.kill();
            let _ = r.wait();
        }
    }
}

fn restores(events: &[Value]) -> Vec<&Value> {
    events.iter().filter(|e| e["type"] == "restore").collect()
}

#[test]
fn an_operators_value_set_mid_run_is_kept_at_stop() {
    let rig = Rig::new(1, 30);
    let mut agent = rig.start(&[], &[]);
    rig.wait_for_ceiling(0);
    // The operator takes the knob mid-run.
    rig.cgroups[0].set_rbps(&rig.dev, "123456789");
    agent.wait_cycles(2);
    let (status, stderr) = agent.stop();
    assert!(status.success(), "{stderr}");
    assert_eq!(
        rig.rbps(0),
        "123456789",
        "the operator's value was overwritten"
    );
    let events = agent.events();
    let r = restores(&events);
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0]["result"], "changed_by_other", "{r:?}");
    assert_eq!(r[0]["current"], "123456789");
    assert!(!rig.journal.join("journal.json").exists());
}

#[test]
fn sighup_leaves_the_agent_controlling_and_sigterm_restores() {
    let rig = Rig::new(1, 30);
    let mut agent = rig.start(&[], &[]);
    rig.wait_for_ceiling(0);
    agent.signal(libc::SIGHUP);
    agent.wait_cycles(2);
    assert!(agent.running(), "SIGHUP ended the agent");
    assert_eq!(rig.rbps(0), CEILING);
    agent.wait_for(|e| e["code"] == "reopened", Duration::from_secs(10));
    let (status, stderr) = agent.stop();
    assert!(status.success(), "{stderr}");
    assert_eq!(rig.rbps(0), OPERATORS);
}

#[test]
fn sigquit_restores() {
    let rig = Rig::new(1, 30);
    let mut agent = rig.start(&[], &[]);
    rig.wait_for_ceiling(0);
    agent.signal(libc::SIGQUIT);
    let (status, stderr) = agent.wait_exit(Duration::from_secs(30));
    assert!(status.success(), "{stderr}");
    assert_eq!(rig.rbps(0), OPERATORS);
    let events = agent.events();
    let stop = events.iter().find(|e| e["type"] == "agent_stop").unwrap();
    assert_eq!(stop["reason"], "SIGQUIT");
}

#[test]
fn a_panic_restores_every_limit() {
    let rig = Rig::new(1, 30);
    let mut agent = rig.start(&[], &[("ISOLATOR_FAULT_PANIC_AT_CYCLE", "15")]);
    rig.wait_for_ceiling(0);
    let (status, stderr) = agent.wait_exit(Duration::from_secs(60));
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("panicked in cycle"), "{stderr}");
    assert_eq!(rig.rbps(0), OPERATORS, "the panic left the limit");
    let events = agent.events();
    assert!(events.iter().any(|e| e["code"] == "panic"));
    assert_eq!(restores(&events)[0]["result"], "restored");
    let stop = events.iter().find(|e| e["type"] == "agent_stop").unwrap();
    assert_eq!(stop["reason"], "panic");
    assert!(!rig.journal.join("journal.json").exists());
}

/// An agent started by hand: SIGTERMed and reaped if the test fails before it stops it, so
/// that no agent outlives its test (and re-creates its scratch directory for its socket).
struct Reaped(Option<Child>);

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            // SAFETY: plain kill(2) on our child.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let _ = c.wait();
        }
    }
}

/// Reads events from the agent's socket until `pred` holds.
fn socket_wait(lines: &mut impl Iterator<Item = Value>, pred: impl Fn(&Value) -> bool) -> Value {
    lines
        .find(|e| pred(e))
        .expect("the socket ended before the event came")
}

#[test]
fn a_closed_stdout_does_not_stop_control() {
    let rig = Rig::new(1, 40);
    let socket = rig.scratch.path("isolator.sock");
    let mut child = Reaped(Some(
        Command::new(isolator_bin())
            .args([
                "run",
                "--interval",
                "1s",
                "--docker-socket",
                "off",
                "--config",
            ])
            .arg(&rig.config)
            .arg("--journal-dir")
            .arg(&rig.journal)
            .arg("--socket")
            .arg(&socket)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    ));
    // As `isolator run | head -c1`: one byte, then the reader is gone.
    let mut stdout = child.0.as_mut().unwrap().stdout.take().unwrap();
    let mut one = [0u8; 1];
    stdout.read_exact(&mut one).unwrap();
    drop(stdout);
    let deadline = Instant::now() + Duration::from_secs(30);
    let stream = loop {
        match UnixStream::connect(&socket) {
            Ok(s) => break s,
            Err(e) => assert!(Instant::now() < deadline, "{}: {e}", socket.display()),
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut lines = BufReader::new(stream)
        .lines()
        .map_while(Result::ok)
        .map(|l| serde_json::from_str::<Value>(&l).unwrap());
    // Control goes on: the ceiling lands, and cycles keep coming.
    rig.wait_for_ceiling(0);
    let first = socket_wait(&mut lines, |e| e["type"] == "cycle_end")["cycle"]
        .as_u64()
        .unwrap();
    socket_wait(&mut lines, |e| {
        e["type"] == "cycle_end" && e["cycle"].as_u64() >= Some(first + 5)
    });
    let child = child.0.take().unwrap();
    // SAFETY: plain kill(2) on our child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(rig.rbps(0), OPERATORS, "not restored at stop");
    // Said once, not once a cycle.
    let said = stderr.matches("output_failed").count();
    assert_eq!(said, 1, "{stderr}");
    assert!(stderr.contains("Broken pipe"), "{stderr}");
}

#[test]
fn one_agent_per_host_enforces() {
    let rig = Rig::new(1, 20);
    let mut first = rig.start(&[], &[]);
    let other_journal = rig.scratch.path("journal2");
    let mut second = Command::new(isolator_bin())
        .args([
            "run",
            "--docker-socket",
            "off",
            "--socket",
            "off",
            "--config",
        ])
        .arg(&rig.config)
        .arg("--journal-dir")
        .arg(&other_journal)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // It must refuse at start; one that runs instead is stopped and fails the test.
    let deadline = Instant::now() + Duration::from_secs(20);
    while second.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    if second.try_wait().unwrap().is_none() {
        let _ = second.kill();
    }
    let out = second.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("already enforces") && stderr.contains(&format!("pid {}", first.pid())),
        "{stderr}"
    );
    // A dry run next to it is fine: it writes nothing.
    let dry = Agent::start(&[
        "--config",
        rig.config.to_str().unwrap(),
        "--dry-run",
        "--socket",
        "off",
        "--docker-socket",
        "off",
    ]);
    drop(dry);
    let (status, stderr) = first.stop();
    assert!(status.success(), "{stderr}");
}

#[test]
fn restore_after_a_crash_leaves_what_others_changed() {
    let rig = Rig::new(2, 30);
    let mut agent = rig.start(&["--socket", "off"], &[]);
    // Two cgroups in the service: the ceiling is split between them.
    let deadline = Instant::now() + Duration::from_secs(30);
    while rig.rbps(0) != "25000000" || rig.rbps(1) != "25000000" {
        assert!(Instant::now() < deadline, "{} {}", rig.rbps(0), rig.rbps(1));
        std::thread::sleep(Duration::from_millis(100));
    }
    agent.kill();
    // After the crash, someone sets the second one.
    rig.cgroups[1].set_rbps(&rig.dev, "7777777");
    let out = Command::new(isolator_bin())
        .args(["restore", "--journal-dir"])
        .arg(&rig.journal)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(rig.rbps(0), OPERATORS);
    assert_eq!(rig.rbps(1), "7777777");
    assert!(stdout.contains("(restored)"), "{stdout}");
    assert!(
        stdout.contains("(changed_by_other, left at 7777777)"),
        "{stdout}"
    );
    assert!(!rig.journal.join("journal.json").exists());
}

#[test]
fn a_cgroup_renamed_out_of_its_service_gets_its_limit_back() {
    let mut rig = Rig::new(1, 30);
    let mut agent = rig.start(&[], &[]);
    rig.wait_for_ceiling(0);
    let moved = rig.cgroups[0]
        .dir
        .with_file_name(unique("iso-safety-renamed"));
    std::fs::rename(&rig.cgroups[0].dir, &moved).unwrap();
    rig.cgroups[0].dir = moved;
    // Still there, still reading, no longer in the service: its knob goes back now.
    let deadline = Instant::now() + Duration::from_secs(40);
    while rig.rbps(0) != OPERATORS {
        assert!(
            Instant::now() < deadline,
            "the renamed cgroup kept the limit: {}",
            rig.rbps(0)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let events = agent.events();
    assert!(
        restores(&events)
            .iter()
            .any(|r| r["reason"] == "released" && r["result"] == "restored"),
        "{:?}",
        restores(&events)
    );
    let (status, stderr) = agent.stop();
    assert!(status.success(), "{stderr}");
    assert_eq!(rig.rbps(0), OPERATORS);
}

fn json_error(json: &Path) -> (Option<i32>, String) {
    let out = Command::new(isolator_bin())
        .args(["run", "--socket", "off", "--docker-socket", "off", "--json"])
        .arg(json)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn event_files_are_private_and_never_reached_through_links() {
    require_root();
    let scratch = Scratch::new();
    std::fs::set_permissions(&scratch.dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    // A file of its own: 0600.
    let agent = Agent::start(&["--socket", "off", "--docker-socket", "off"]);
    agent.wait_cycles(1);
    let mode = std::fs::metadata(&agent.events)
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600, "events file mode");
    drop(agent);

    // Another user's link in a sticky world-writable directory, as in /tmp.
    let victim = scratch.path("victim");
    std::fs::write(&victim, "precious\n").unwrap();
    let tmp = scratch.path("tmp");
    std::fs::create_dir(&tmp).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let planted = tmp.join("events.ndjson");
    std::os::unix::fs::symlink(&victim, &planted).unwrap();
    let (code, stderr) = json_error(&planted);
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("writable by other users"), "{stderr}");
    // The same link in a directory only root writes: still not followed.
    let private = scratch.path("private");
    std::fs::create_dir(&private).unwrap();
    let link = private.join("events.ndjson");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let (code, stderr) = json_error(&link);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("symbolic link"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
}
