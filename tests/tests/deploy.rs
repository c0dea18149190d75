//! Deployment: the `--json` file bounded by rotation (and a full disk under it), the systemd
//! unit (`systemd-analyze verify`, the notify protocol against a fake NOTIFY_SOCKET, the
//! agent observing and controlling with only the unit's capabilities), and the container
//! image running the agent with the DaemonSet's mounts and capabilities.

use std::{
    io::{BufRead, BufReader},
    os::unix::{
        fs::PermissionsExt,
        net::{UnixDatagram, UnixStream},
    },
    path::{Path, PathBuf},
    process::{Child, Command},
    time::{Duration, Instant},
};

use isolator_tests::*;
use serde_json::Value;

/// Bytes the process passed to write(2) and its kin so far (/proc/PID/io `wchar`).
fn written_bytes(pid: i32) -> u64 {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap();
    io.lines()
        .find_map(|l| l.strip_prefix("wchar: "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap()
}

/// `base` and its rotated `base.N` in `dir`, oldest first.
fn rotation_set(dir: &Path, base: &str) -> Vec<PathBuf> {
    let mut numbered: Vec<(u32, PathBuf)> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            if name == base {
                return Some((0, e.path()));
            }
            let n = name.strip_prefix(base)?.strip_prefix('.')?.parse().ok()?;
            Some((n, e.path()))
        })
        .collect();
    numbered.sort_by_key(|(n, _)| std::cmp::Reverse(*n));
    numbered.into_iter().map(|(_, p)| p).collect()
}

fn lines_of(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("{}: not NDJSON ({e}): {l:?}", path.display()))
        })
        .collect()
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

/// A reader of a 64 MiB file (random 4 KiB direct reads) for at most `seconds`: every
/// cycle has cgroup_stats to write.
fn reader(scratch: &Scratch, seconds: u64) -> Child {
    let file = scratch.path("r.dat");
    if !file.exists() {
        make_file(&file, 64 << 20);
    }
    Command::new(loadgen_bin())
        .args(["--path", file.to_str().unwrap()])
        .args(["--op", "randread", "--bs", "4096", "--direct"])
        .args([
            "--bytes",
            "1099511627776",
            "--seconds",
            &seconds.to_string(),
        ])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const LIMIT: u64 = 4096;
const BACKUPS: usize = 2;

#[test]
fn json_rotation_keeps_at_most_n_plus_one_private_files_of_valid_ndjson() {
    require_root();
    let io = Scratch::new();
    let load = Reaped(reader(&io, 120));
    let mut agent = Agent::start(&[
        "--interval",
        "1s",
        "--json-max-size",
        &LIMIT.to_string(),
        "--json-backups",
        &BACKUPS.to_string(),
        "--socket",
        "off",
        "--docker-socket",
        "off",
    ]);
    let dir = agent.dir().to_path_buf();
    // Without --config, --socket or Docker, the agent writes nothing but its events (and
    // stderr, which is counted off below): more than 3x the limit goes through the file.
    let deadline = Instant::now() + Duration::from_secs(120);
    while written_bytes(agent.pid()) < 4 * LIMIT {
        assert!(Instant::now() < deadline, "the agent wrote too little");
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(load);
    // logrotate's way too: move the file away and SIGHUP; the agent writes a new one.
    let moved = dir.join("moved-by-logrotate.ndjson");
    std::fs::rename(&agent.events, &moved).unwrap();
    // The last cycle any file of the set holds (the current file may have just rotated).
    let last_cycle = || {
        rotation_set(&dir, "events.ndjson")
            .iter()
            .flat_map(|f| {
                std::fs::read_to_string(f)
                    .unwrap_or_default()
                    .lines()
                    .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                    .filter(|e| e["type"] == "cycle_end")
                    .filter_map(|e| e["cycle"].as_u64())
                    .collect::<Vec<_>>()
            })
            .max()
            .unwrap_or(0)
    };
    agent.signal(libc::SIGHUP);
    // The warning lands in the reopened file, which the next cycle or two may already have
    // rotated (4 KiB is about a cycle): looked for in the whole set.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !rotation_set(&dir, "events.ndjson").iter().any(|f| {
        std::fs::read_to_string(f)
            .unwrap_or_default()
            .lines()
            .any(|l| l.contains(r#""type":"warning""#) && l.contains(r#""code":"reopened""#))
    }) {
        assert!(
            Instant::now() < deadline,
            "no 'reopened' warning after SIGHUP"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // One more cycle into the reopened file.
    let reopened_at = last_cycle();
    while last_cycle() <= reopened_at {
        assert!(
            Instant::now() < deadline + Duration::from_secs(20),
            "no cycle after SIGHUP"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let written = written_bytes(agent.pid());
    let (status, stderr) = agent.stop();
    assert!(status.success(), "{stderr}");
    assert!(
        written - stderr.len() as u64 > 3 * LIMIT,
        "{written} bytes written"
    );

    let set = rotation_set(&dir, "events.ndjson");
    assert_eq!(
        set.len(),
        BACKUPS + 1,
        "more than 3x the limit written: the file and {BACKUPS} backups, no more: {set:?}"
    );
    let mut cycles = vec![];
    for f in set.iter().chain([&moved]) {
        assert_eq!(mode(f), 0o600, "{}", f.display());
        let len = std::fs::metadata(f).unwrap().len();
        assert!(len > 0 && len <= LIMIT, "{}: {len} bytes", f.display());
        // Every line is NDJSON the typed model reads and writes back as it was.
        assert_events_round_trip(f);
        cycles.extend(
            lines_of(f)
                .iter()
                .filter(|e| e["type"] == "cycle_end")
                .map(|e| e["cycle"].as_u64().unwrap()),
        );
    }
    assert!(
        !dir.join("events.ndjson.new").exists(),
        "a rotation left its new file"
    );
    // No line was lost or written twice at a rotation: the cycles kept are consecutive.
    cycles.sort();
    let first = cycles[0];
    let want: Vec<u64> = (first..first + cycles.len() as u64).collect();
    assert_eq!(cycles, want, "cycles kept across the files");
    let last = lines_of(set.last().unwrap());
    assert_eq!(last.last().unwrap()["type"], "agent_stop");
}

/// A tmpfs of `kib` KiB mounted on `dir` (mode 0700), unmounted on drop.
struct SmallDisk {
    dir: PathBuf,
}

impl SmallDisk {
    fn mount(dir: PathBuf, kib: u64) -> SmallDisk {
        std::fs::create_dir_all(&dir).unwrap();
        run_ok(
            Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={kib}k,mode=0700")])
                .arg("isolator-test")
                .arg(&dir),
        );
        SmallDisk { dir }
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir).status();
    }
}

/// A best-effort service with a 50 MB/s ceiling over the cgroups `/PREFIX-*`, split evenly
/// among them; the first cgroup reads a file.
struct CeilingRig {
    scratch: Scratch,
    prefix: String,
    cgroups: Vec<TestCgroup>,
    dev: String,
    config: PathBuf,
    journal: PathBuf,
    _reader: Reaped,
}

impl CeilingRig {
    fn new() -> CeilingRig {
        let scratch = Scratch::new();
        let file = scratch.path("r.dat");
        make_file(&file, 64 << 20);
        let dev = disk_of(&file);
        let prefix = unique("iso-deploy");
        let cgroup = TestCgroup::new(&prefix);
        let config = scratch.path("isolator.toml");
        std::fs::write(
            &config,
            format!("[[service]]\nname = \"backup\"\ncgroup = \"/{prefix}-*\"\nclass = \"best-effort\"\nceiling = \"50MB/s\"\n"),
        )
        .unwrap();
        let reader = Reaped(cgroup.spawn(&format!(
            "{} --path {} --op read --bytes 1099511627776 --bs 1048576 --direct --seconds 120",
            loadgen_bin().display(),
            file.display()
        )));
        CeilingRig {
            journal: scratch.path("journal"),
            scratch,
            prefix,
            cgroups: vec![cgroup],
            dev,
            config,
            _reader: reader,
        }
    }

    /// The agent's arguments, serving its events on `socket` ("off": not).
    fn args(&self, socket: &str) -> Vec<String> {
        [
            "--interval",
            "1s",
            "--config",
            self.config.to_str().unwrap(),
            "--journal-dir",
            self.journal.to_str().unwrap(),
            "--docker-socket",
            "off",
            "--socket",
            socket,
        ]
        .map(String::from)
        .to_vec()
    }

    /// Another cgroup of the service, idle (made before the agent starts, which finds it
    /// in its first walk of the hierarchy).
    fn add_cgroup(&mut self) -> usize {
        self.cgroups.push(TestCgroup::new(&self.prefix));
        self.cgroups.len() - 1
    }

    /// Waits until cgroup `i`'s read limit is `want`.
    fn wait_for_rbps(&self, i: usize, want: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.cgroups[i].rbps(&self.dev) != want {
            assert!(
                Instant::now() < deadline,
                "cgroup {i}'s limit never became {want} (it is {}; processes in it: {:?})",
                self.cgroups[i].rbps(&self.dev),
                std::fs::read_to_string(self.cgroups[i].dir.join("cgroup.procs"))
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[test]
fn a_full_disk_under_the_event_files_is_an_error_and_control_goes_on() {
    require_root();
    let rig = CeilingRig::new();
    let disk = SmallDisk::mount(rig.scratch.path("events"), 64);
    let events = disk.dir.join("events.ndjson");
    let socket = rig.scratch.path("isolator.sock");
    let mut args = rig.args(socket.to_str().unwrap());
    args.extend(["--json-max-size", "16KiB", "--json-backups", "1"].map(String::from));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut agent = Agent::spawn_writing(Scratch::new(), events.clone(), &[], &args, &[]);
    agent.wait_for(|e| e["type"] == "agent_start", Duration::from_secs(30));
    rig.wait_for_rbps(0, "50000000");
    // The socket carries every event, also while none can be written to the file.
    let stream = UnixStream::connect(&socket).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut live = BufReader::new(stream)
        .lines()
        .map(|l| serde_json::from_str::<Value>(&l.expect("the socket ended")).unwrap());
    let mut next = |what: &str, pred: &dyn Fn(&Value) -> bool| -> Value {
        live.find(|e| pred(e))
            .unwrap_or_else(|| panic!("the socket ended before {what}"))
    };
    // The disk fills up (with a file that is not the agent's).
    let free = {
        // SAFETY: a zeroed statvfs is a valid out-parameter.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        let c = std::ffi::CString::new(disk.dir.to_str().unwrap()).unwrap();
        // SAFETY: statvfs on a NUL-terminated path into a struct we own.
        assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
        st.f_bavail * st.f_bsize
    };
    let filler = disk.dir.join("filler");
    let _ = std::fs::write(&filler, vec![0u8; free as usize + 4096]);
    let failed = next("output_failed", &|e| e["code"] == "output_failed");
    assert_eq!(failed["type"], "error", "{failed}");
    assert!(
        failed["message"]
            .as_str()
            .unwrap()
            .contains("No space left"),
        "{failed}"
    );
    // Control goes on while nothing reaches the file: cycles, the service held at its
    // ceiling (the kernel's knob says so too).
    let at = next("a cycle", &|e| e["type"] == "cycle_end")["cycle"]
        .as_u64()
        .unwrap();
    let held = next("3 more cycles of control", &|e| {
        e["type"] == "service_stats"
            && e["cycle"].as_u64() >= Some(at + 3)
            && e["limit"]["rbps"] == 50_000_000
    });
    assert_eq!(held["state"], "throttled", "{held}");
    assert_eq!(rig.cgroups[0].rbps(&rig.dev), "50000000");
    std::fs::remove_file(&filler).unwrap();
    agent.wait_for(
        |e| e["type"] == "warning" && e["code"] == "output_recovered",
        Duration::from_secs(30),
    );
    let (status, stderr) = agent.stop();
    assert!(status.success(), "{stderr}");
    // Said once for the outage, as an error, on stderr too.
    assert_eq!(
        stderr.matches("output_failed").count(),
        1,
        "stderr: {stderr}"
    );
    assert!(stderr.contains("ERROR"), "{stderr}");
    let set = rotation_set(&disk.dir, "events.ndjson");
    assert!(!set.is_empty() && set.len() <= 2, "{set:?}");
    for f in &set {
        assert_eq!(mode(f), 0o600);
        let text = std::fs::read_to_string(f).unwrap();
        // A line the full disk cut short is cut off again: every line is a whole event.
        assert!(
            text.is_empty() || text.ends_with('\n'),
            "{f:?} ends mid-line"
        );
        for l in whole_lines(&text) {
            serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("{l}: {e}"));
        }
    }
    assert_eq!(rig.cgroups[0].rbps(&rig.dev), rig.cgroups[0].unlimited());
    drop(disk);
}

/// The values of `key=` lines in the shipped unit, split on whitespace.
fn unit_values(key: &str) -> Vec<String> {
    let unit = std::fs::read_to_string(workspace_root().join("deploy/isolator.service")).unwrap();
    unit.lines()
        .filter_map(|l| l.strip_prefix(&format!("{key}=")))
        .flat_map(|v| v.split_whitespace().map(String::from))
        .collect()
}

/// Runs `systemd-analyze verify` on `unit` (a file's text) installed as isolator.service
/// in a scratch root holding the host's own unit directory, the built binary where
/// ExecStart wants it and /usr/bin/kill: the shipped file is checked as it is, and nothing
/// is installed on the host. Returns verify's output (empty when clean) and its status.
fn verify_unit(unit: &str) -> (bool, String) {
    let root = Scratch::new();
    let r = |p: &str| root.dir.join(p);
    for d in [
        "usr/bin",
        "usr/local/bin",
        "usr/lib/systemd",
        "etc/systemd/system",
    ] {
        std::fs::create_dir_all(r(d)).unwrap();
    }
    std::os::unix::fs::symlink("usr/bin", r("bin")).unwrap();
    std::os::unix::fs::symlink("usr/lib", r("lib")).unwrap();
    run_ok(
        Command::new("cp")
            .args(["-r", "/usr/lib/systemd/system"])
            .arg(r("usr/lib/systemd/")),
    );
    std::fs::copy(isolator_bin(), r("usr/local/bin/isolator")).unwrap();
    std::fs::copy("/usr/bin/kill", r("usr/bin/kill")).unwrap();
    std::fs::write(r("etc/systemd/system/isolator.service"), unit).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(format!("--root={}", root.dir.display()))
        .arg("isolator.service")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn the_systemd_unit_passes_systemd_analyze_verify() {
    require_root();
    require_tool("systemd-analyze");
    let unit = std::fs::read_to_string(workspace_root().join("deploy/isolator.service")).unwrap();
    let (ok, said) = verify_unit(&unit);
    assert!(
        ok && said.trim().is_empty(),
        "systemd-analyze verify: {said}"
    );
    // verify warns (and exits 0) on a directive it does not know: a broken copy must be
    // caught by the same check.
    let broken = unit.replace("WatchdogSec=", "WatchdogSecs=");
    let (_, said) = verify_unit(&broken);
    assert!(said.contains("WatchdogSecs"), "{said}");
    // What the unit promises, as the agent needs it.
    assert_eq!(unit_values("Type"), ["notify"]);
    assert_eq!(unit_values("Restart"), ["on-failure"]);
    assert!(!unit_values("WatchdogSec").is_empty());
    assert_eq!(
        unit_values("CapabilityBoundingSet"),
        unit_values("AmbientCapabilities")
    );
}

/// The unit's capabilities as setpriv spells them ("+bpf,+perfmon,...").
fn setpriv_caps(caps: &[String]) -> String {
    caps.iter()
        .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_lowercase()))
        .collect::<Vec<_>>()
        .join(",")
}

/// setpriv's arguments for root's uid with only `caps` (as CapabilityBoundingSet= leaves
/// root), and none to pass on.
fn only_caps(caps: &[String]) -> Vec<String> {
    vec![
        "setpriv".into(),
        "--bounding-set".into(),
        format!("-all,{}", setpriv_caps(caps)),
        "--inh-caps".into(),
        "-all".into(),
    ]
}

/// Receives the notify socket's datagrams until one has `what`, for at most `timeout`.
fn recv_until(sock: &UnixDatagram, what: &str, timeout: Duration, seen: &mut Vec<String>) {
    let deadline = Instant::now() + timeout;
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "no {what} from the agent; got {seen:?}");
        sock.set_read_timeout(Some(left)).unwrap();
        if let Ok(n) = sock.recv(&mut buf) {
            let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
            let found = msg.lines().any(|l| l == what);
            seen.push(msg);
            if found {
                return;
            }
        }
    }
}

#[test]
fn readiness_watchdog_and_stopping_reach_a_fake_notify_socket() {
    require_root();
    let scratch = Scratch::new();
    let path = scratch.path("notify.sock");
    let sock = UnixDatagram::bind(&path).unwrap();
    let notify = path.to_str().unwrap();
    let mut agent = Agent::spawn(
        &[],
        &[
            "--interval",
            "1s",
            "--socket",
            "off",
            "--docker-socket",
            "off",
        ],
        &[("NOTIFY_SOCKET", notify), ("WATCHDOG_USEC", "3000000")],
    );
    let mut seen = vec![];
    recv_until(&sock, "READY=1", Duration::from_secs(30), &mut seen);
    // Ready only after the programs are attached, and agent_start is out first.
    let events = agent.events();
    assert_eq!(
        events.first().map(|e| e["type"].clone()),
        Some("agent_start".into()),
        "READY=1 came before agent_start was written: {events:?}"
    );
    assert!(
        seen.last().unwrap().contains("STATUS=observing"),
        "{seen:?}"
    );
    // Keep-alives come (counted against the cycles below).
    for _ in 0..3 {
        recv_until(&sock, "WATCHDOG=1", Duration::from_secs(10), &mut seen);
    }
    // 3 s is two cycles and more: no warning.
    assert!(!agent
        .events()
        .iter()
        .any(|e| e["type"] == "warning" && e["code"] == "watchdog"));
    agent.signal(libc::SIGTERM);
    recv_until(&sock, "STOPPING=1", Duration::from_secs(10), &mut seen);
    let (status, stderr) = agent.wait_exit(Duration::from_secs(30));
    assert!(status.success(), "{stderr}");
    let stop = agent.events().last().unwrap().clone();
    assert_eq!(stop["type"], "agent_stop");
    // One keep-alive per cycle, and one READY=1.
    sock.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 4096];
    while let Ok(n) = sock.recv(&mut buf) {
        seen.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    let count = |what: &str| seen.iter().filter(|m| m.lines().any(|l| l == what)).count();
    assert_eq!(
        count("WATCHDOG=1") as u64,
        stop["cycles"].as_u64().unwrap(),
        "{seen:?}"
    );
    assert_eq!(count("READY=1"), 1);
    let stopping = seen.iter().position(|m| m.contains("STOPPING=1")).unwrap();
    assert!(
        seen[stopping + 1..]
            .iter()
            .all(|m| !m.contains("WATCHDOG=1")),
        "{seen:?}"
    );

    // A watchdog shorter than two cycles is said, with the least value that works.
    let agent = Agent::start_with_env(
        &[
            "--interval",
            "1s",
            "--socket",
            "off",
            "--docker-socket",
            "off",
        ],
        &[("NOTIFY_SOCKET", notify), ("WATCHDOG_USEC", "1500000")],
    );
    let w = agent.wait_for(
        |e| e["type"] == "warning" && e["code"] == "watchdog",
        Duration::from_secs(10),
    );
    assert!(
        w["message"].as_str().unwrap().contains("at least 2s"),
        "{w}"
    );
}

#[test]
fn the_units_capabilities_are_enough_to_observe_and_control() {
    require_root();
    require_tool("setpriv");
    let caps = unit_values("CapabilityBoundingSet");
    assert!(caps.len() >= 2, "{caps:?}");
    let mut rig = CeilingRig::new();
    // A cgroup owned by another user (a delegated subtree): its knobs are not root's.
    let other = rig.add_cgroup();
    let dir = &rig.cgroups[other].dir;
    for p in std::iter::once(dir.clone())
        .chain(std::fs::read_dir(dir).unwrap().flatten().map(|e| e.path()))
    {
        std::os::unix::fs::chown(&p, Some(65534), Some(65534)).unwrap();
    }
    let wrapper = only_caps(&caps);
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    let args = rig.args("off");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut agent = Agent::start_wrapped(&wrapper, &args, &[]);
    // Observes: the reader's cgroup, named.
    let path = rig.cgroups[0].rel_path();
    agent.wait_for(
        |e| e["type"] == "cgroup_stats" && e["cgroup"]["path"] == path.as_str(),
        Duration::from_secs(30),
    );
    // Controls: the ceiling, split over both cgroups, the other user's too.
    rig.wait_for_rbps(0, "25000000");
    rig.wait_for_rbps(other, "25000000");
    let (status, stderr) = agent.stop();
    assert!(status.success(), "{stderr}");
    assert!(
        !agent.events().iter().any(|e| e["type"] == "error"),
        "{:?}",
        agent.events()
    );
    for i in [0, other] {
        assert_eq!(rig.cgroups[i].rbps(&rig.dev), rig.cgroups[i].unlimited());
    }

    // `isolator check` with the unit's capabilities: nothing missing.
    let check = |caps: &[String]| {
        let w = only_caps(caps);
        let out = Command::new(&w[0])
            .args(&w[1..])
            .arg(isolator_bin())
            .arg("check")
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (ok, said) = check(&caps);
    assert!(ok, "{said}");
    assert!(said.contains("ok    privileges"), "{said}");
    // Each one is needed: without CAP_DAC_OVERRIDE the other user's cgroup cannot be
    // limited (said by check, and seen in the kernel), without CAP_PERFMON nothing loads.
    let without = |c: &str| -> Vec<String> { caps.iter().filter(|x| *x != c).cloned().collect() };
    let (_, said) = check(&without("CAP_DAC_OVERRIDE"));
    assert!(
        said.contains("warn  privileges")
            && said.contains(
                "lacks CAP_DAC_OVERRIDE (to write the limits of cgroups owned by other users"
            ),
        "{said}"
    );
    let wrapper = only_caps(&without("CAP_DAC_OVERRIDE"));
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    let agent = Agent::start_wrapped(&wrapper, &args, &[]);
    agent.wait_for(
        |e| {
            e["type"] == "error"
                && e["code"] == "write_rejected"
                && e["message"].as_str().unwrap().contains("EACCES")
        },
        Duration::from_secs(30),
    );
    drop(agent);
    let (ok, said) = check(&without("CAP_PERFMON"));
    assert!(
        !ok && said.contains("FAIL  privileges") && said.contains("CAP_PERFMON"),
        "{said}"
    );
}

/// One volume of the DaemonSet's pod.
enum Volume {
    Host(String),
    ConfigMap(String),
}

/// The DaemonSet's isolator container as `docker run` arguments and its own arguments.
struct PodAsDocker {
    docker_args: Vec<String>,
    args: Vec<String>,
    /// The capabilities it adds, as Kubernetes spells them (`BPF`).
    caps: Vec<String>,
}

/// Reads deploy/daemonset.yaml and turns the isolator container into `docker run`
/// arguments: hostPID, the user, the capabilities, no privilege escalation, the read-only
/// root, the memory limit, and every volume mounted where the pod mounts it. Host paths
/// under /sys are the host's own (the kernel's cgroups and BTF); the Docker socket is the
/// test daemon's; every other host path (journal, events, sockets, containerd's directory)
/// is a directory of `scratch`, so the test leaves nothing on the host. ConfigMap volumes
/// hold the ConfigMap's files, written into `scratch`.
fn daemonset_as_docker(scratch: &Scratch, docker_socket: &Path) -> PodAsDocker {
    use yaml_rust2::{Yaml, YamlLoader};
    let text = std::fs::read_to_string(workspace_root().join("deploy/daemonset.yaml")).unwrap();
    let docs = YamlLoader::load_from_str(&text).expect("deploy/daemonset.yaml is YAML");
    let of_kind = |kind: &str| -> Vec<&Yaml> {
        docs.iter()
            .filter(|d| d["kind"].as_str() == Some(kind))
            .collect()
    };
    let ds = of_kind("DaemonSet");
    assert_eq!(ds.len(), 1, "one DaemonSet");
    let pod = &ds[0]["spec"]["template"]["spec"];
    let container = pod["containers"]
        .as_vec()
        .unwrap()
        .iter()
        .find(|c| c["name"].as_str() == Some("isolator"))
        .expect("a container named isolator");
    let strs = |y: &Yaml| -> Vec<String> {
        y.as_vec()
            .map(|v| v.iter().map(|s| s.as_str().unwrap().to_string()).collect())
            .unwrap_or_default()
    };
    let mut docker_args: Vec<String> = vec![];
    let mut arg = |a: String| docker_args.push(a);
    if pod["hostPID"].as_bool() == Some(true) {
        arg("--pid=host".into());
    }
    let sc = &container["securityContext"];
    assert_ne!(sc["privileged"].as_bool(), Some(true), "not privileged");
    if let Some(uid) = sc["runAsUser"].as_i64() {
        arg(format!("--user={uid}"));
    }
    if sc["allowPrivilegeEscalation"].as_bool() == Some(false) {
        arg("--security-opt=no-new-privileges".into());
    }
    if sc["readOnlyRootFilesystem"].as_bool() == Some(true) {
        arg("--read-only".into());
    }
    for c in strs(&sc["capabilities"]["drop"]) {
        arg(format!("--cap-drop={c}"));
    }
    let caps = strs(&sc["capabilities"]["add"]);
    for c in &caps {
        arg(format!("--cap-add={c}"));
    }
    if let Some(m) = container["resources"]["limits"]["memory"].as_str() {
        arg(format!(
            "--memory={}",
            m.replace("Mi", "m").replace("Gi", "g")
        ));
    }
    let volumes: Vec<(String, Volume)> = pod["volumes"]
        .as_vec()
        .unwrap()
        .iter()
        .map(|v| {
            let name = v["name"].as_str().unwrap().to_string();
            let vol = if let Some(p) = v["hostPath"]["path"].as_str() {
                Volume::Host(p.to_string())
            } else if let Some(cm) = v["configMap"]["name"].as_str() {
                Volume::ConfigMap(cm.to_string())
            } else {
                panic!("volume {name}: only hostPath and configMap are known here")
            };
            (name, vol)
        })
        .collect();
    for m in container["volumeMounts"].as_vec().unwrap() {
        let name = m["name"].as_str().unwrap();
        let target = m["mountPath"].as_str().unwrap();
        let (_, vol) = volumes
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("mount {name} has no volume"));
        let source = match vol {
            Volume::Host(p) if p.starts_with("/sys/") => PathBuf::from(p),
            Volume::Host(p) if p.ends_with("docker.sock") => docker_socket.to_path_buf(),
            Volume::Host(p) => {
                let d = scratch.path(&format!("host{}", p.replace('/', "-")));
                std::fs::create_dir_all(&d).unwrap();
                d
            }
            Volume::ConfigMap(cm) => {
                let map = of_kind("ConfigMap")
                    .into_iter()
                    .find(|d| d["metadata"]["name"].as_str() == Some(cm))
                    .unwrap_or_else(|| panic!("no ConfigMap {cm}"));
                let d = scratch.path(&format!("configmap-{cm}"));
                std::fs::create_dir_all(&d).unwrap();
                for (k, v) in map["data"].as_hash().unwrap() {
                    std::fs::write(d.join(k.as_str().unwrap()), v.as_str().unwrap()).unwrap();
                }
                d
            }
        };
        let ro = if m["readOnly"].as_bool() == Some(true) {
            ",readonly"
        } else {
            ""
        };
        arg(format!(
            "--mount=type=bind,source={},target={target}{ro}",
            source.display()
        ));
    }
    PodAsDocker {
        docker_args,
        args: strs(&container["args"]),
        caps,
    }
}

/// The capability mask of `names` (Kubernetes spelling: `BPF`), as /proc shows CapEff.
fn cap_mask(names: &[String]) -> u64 {
    names
        .iter()
        .map(|n| {
            let out = Command::new("capsh")
                .arg(format!("--explain=cap_{}", n.to_lowercase()))
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            // "cap_bpf (39) [/proc/self/status:CapXXX: 0x0000008000000000]"
            let bit: u32 = text
                .split_once('(')
                .and_then(|(_, r)| r.split_once(')'))
                .and_then(|(n, _)| n.parse().ok())
                .unwrap_or_else(|| panic!("capsh does not know {n}: {text}"));
            1u64 << bit
        })
        .fold(0, |m, b| m | b)
}

#[test]
fn the_image_runs_the_agent_with_the_daemonsets_mounts_and_capabilities() {
    require_root();
    require_tool("capsh");
    let d = Dockerd::start();
    let scratch = Scratch::new();
    // The image, built the way the README says, into the test's daemon.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(&cargo)
        .current_dir(workspace_root())
        .args(["xtask", "image", "--no-build", "--tag", "isolator:test"])
        .env("DOCKER_HOST", format!("unix://{}", d.socket.display()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo xtask image: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let pod = daemonset_as_docker(&scratch, &d.socket);
    // The DaemonSet's arguments, less what this test reads another way: events on stdout
    // (not --json), and no limits written on the host (--dry-run).
    let mut args: Vec<String> = pod
        .args
        .iter()
        .filter(|a| !a.starts_with("--json"))
        .cloned()
        .collect();
    let metrics_port = args
        .iter()
        .find_map(|a| a.strip_prefix("--metrics="))
        .and_then(|a| a.rsplit_once(':'))
        .map(|(_, port)| port.to_string())
        .expect("the DaemonSet serves --metrics=ADDR:PORT");
    args.push("--dry-run".into());
    let run = |docker_args: &[String]| {
        let mut run = vec!["run", "-d", "--name", "isolator-agent", "--network", "none"];
        run.extend(docker_args.iter().map(String::as_str));
        run.push("isolator:test");
        run.extend(args.iter().map(String::as_str));
        Command::new("docker")
            .arg("-H")
            .arg(format!("unix://{}", d.socket.display()))
            .args(&run)
            .output()
            .unwrap()
    };
    // A capability this test process cannot have (its own bounding set: this sandbox
    // lacks CAP_SYS_RESOURCE, see DESIGN.md) no container it starts can have either.
    let bounding = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("CapBnd:"))
        .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
        .unwrap();
    let (mut caps, beyond): (Vec<String>, Vec<String>) = pod
        .caps
        .iter()
        .cloned()
        .partition(|c| cap_mask(std::slice::from_ref(c)) & bounding != 0);
    if !beyond.is_empty() {
        eprintln!("not granted, beyond this test's own bounding set: {beyond:?}");
    }
    let pod_docker_args: Vec<String> = pod
        .docker_args
        .iter()
        .filter(|a| !beyond.iter().any(|c| **a == format!("--cap-add={c}")))
        .cloned()
        .collect();
    let mut out = run(&pod_docker_args);
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() && said.contains("unknown capability") {
        // Debian 12's dockerd (20.10) predates CAP_BPF and CAP_PERFMON and refuses them;
        // the kernel accepts CAP_SYS_ADMIN in their place. The exact set is tested with
        // setpriv (the_units_capabilities_are_enough_to_observe_and_control), and the
        // DaemonSet's set is the unit's (the_daemonset_grants_the_units_capabilities).
        eprintln!(
            "this dockerd does not know CAP_BPF/CAP_PERFMON ({}): CAP_SYS_ADMIN stands in",
            said.trim()
        );
        d.docker(&["rm", "-f", "isolator-agent"]);
        caps.retain(|c| c != "BPF" && c != "PERFMON");
        caps.push("SYS_ADMIN".into());
        let docker_args: Vec<String> = pod_docker_args
            .iter()
            .filter(|a| *a != "--cap-add=BPF" && *a != "--cap-add=PERFMON")
            .cloned()
            .chain(["--cap-add=SYS_ADMIN".to_string()])
            .collect();
        out = run(&docker_args);
    }
    assert!(
        out.status.success(),
        "docker run: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let logs = || {
        let out = Command::new("docker")
            .arg("-H")
            .arg(format!("unix://{}", d.socket.display()))
            .args(["logs", "isolator-agent"])
            .output()
            .unwrap();
        let events: Vec<Value> = whole_lines(&String::from_utf8_lossy(&out.stdout))
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
            .collect();
        (events, String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let wait = |what: &str, pred: &dyn Fn(&Value) -> bool| -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (events, stderr) = logs();
            if let Some(e) = events.iter().find(|e| pred(e)) {
                return e.clone();
            }
            let state = d.docker(&["inspect", "-f", "{{.State.Status}}", "isolator-agent"]);
            assert!(
                Instant::now() < deadline && state == "running",
                "no {what} from the agent in its container ({state}); stderr: {stderr}; events: {events:?}"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    };
    wait("agent_start", &|e| e["type"] == "agent_start");
    wait("docker_connected", &|e| e["type"] == "docker_connected");
    // It runs with the DaemonSet's capabilities (or the stand-in) and no others.
    let pid = d.docker(&["inspect", "-f", "{{.State.Pid}}", "isolator-agent"]);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let cap_eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
        .unwrap();
    assert_eq!(cap_eff, cap_mask(&caps), "CapEff of the agent");
    // A container next to it doing I/O: observed and named.
    let data = format!("{}:/data", scratch.dir.display());
    make_file(&scratch.path("r.dat"), 64 << 20);
    let id = d.run_loadgen("io-neighbor", &data, &[], &container_reader_args("60"));
    let seen = wait("the neighbor's I/O", &|e| {
        e["type"] == "cgroup_stats"
            && e["cgroup"]["kind"] == "container"
            && e["cgroup"]["container_id"] == id.as_str()
    });
    assert_eq!(seen["cgroup"]["name"], "io-neighbor", "{seen}");
    assert_eq!(seen["cgroup"]["image"], LOADGEN_IMAGE, "{seen}");
    assert!(seen["totals"]["read_bytes"].as_u64() > Some(0), "{seen}");
    // The metrics port answers in the container's network namespace (the probe's view),
    // with the neighbour's series by its container name.
    require_tool("nsenter");
    let url = format!("http://127.0.0.1:{metrics_port}/metrics");
    let deadline = Instant::now() + Duration::from_secs(30);
    let scrape = loop {
        let out = Command::new("nsenter")
            .args([
                "-t",
                pid.as_str(),
                "-n",
                "curl",
                "-sf",
                "--max-time",
                "5",
                url.as_str(),
            ])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() && text.contains(r#"container="io-neighbor""#) {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "no io-neighbor series from {url} in the agent's container: {}{text}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(scrape.contains("isolator_build_info"), "{scrape}");
    let (events, stderr) = logs();
    assert!(
        !events.iter().any(|e| e["type"] == "error"),
        "{stderr} {events:?}"
    );
    // SIGTERM (docker stop) ends it cleanly.
    d.docker(&["stop", "isolator-agent"]);
    let code = d.docker(&["inspect", "-f", "{{.State.ExitCode}}", "isolator-agent"]);
    assert_eq!(code, "0", "{}", logs().1);
    assert_eq!(logs().0.last().unwrap()["type"], "agent_stop");
}

#[test]
fn the_daemonset_grants_the_units_capabilities() {
    let scratch = Scratch::new();
    let pod = daemonset_as_docker(&scratch, Path::new("/nonexistent/docker.sock"));
    let mut k8s: Vec<String> = pod.caps.iter().map(|c| format!("CAP_{c}")).collect();
    let mut unit = unit_values("CapabilityBoundingSet");
    k8s.sort();
    unit.sort();
    assert_eq!(
        k8s, unit,
        "deploy/daemonset.yaml and deploy/isolator.service"
    );
    assert!(pod.docker_args.contains(&"--cap-drop=ALL".to_string()));
}

/// The guest of the systemd test: the host's own root file system (its systemd, its shell
/// and tools), exported read-only over 9p with a tmpfs overlay on top, the agent, the
/// shipped unit and the probe put in, and systemd started as PID 1 with the probe's target.
const SYSTEMD_INIT: &str = r#"#!/bin/busybox sh
echo "=== init started"
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for m in $(cat /modlist); do insmod /lib/$m.ko || echo "=== insmod $m failed"; done
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144 hostroot /lower || { echo "=== 9p failed"; poweroff -f; }
mount -t tmpfs -o size=256m tmpfs /upper; mkdir /upper/u /upper/w
mount -t overlay overlay -o lowerdir=/lower,upperdir=/upper/u,workdir=/upper/w /newroot || { echo "=== overlay failed"; poweroff -f; }
mkdir -p /newroot/usr/local/bin /newroot/etc/systemd/system
cp /payload/isolator /payload/loadgen /payload/probe.sh /newroot/usr/local/bin/
cp /payload/isolator.service /payload/isolator-probe.service /payload/isolator-test.target /newroot/etc/systemd/system/
rm -f /newroot/etc/default/isolator
exec switch_root /newroot /lib/systemd/systemd systemd.unit=isolator-test.target
"#;

const PROBE_TARGET: &str = "[Unit]
Description=isolator unit test
Requires=basic.target
After=basic.target
Wants=isolator.service isolator-probe.service
AllowIsolate=yes
";

const PROBE_SERVICE: &str = "[Unit]
Description=probe isolator.service
After=isolator.service
[Service]
Type=oneshot
ExecStart=/bin/sh /usr/local/bin/probe.sh
StandardOutput=tty
StandardError=tty
TTYPath=/dev/ttyS0
";

/// Prints `=== key: value` lines for the test to judge; every wait is bounded.
const PROBE: &str = r#"say() { echo "=== $1: $2"; }
show() { systemctl show isolator -p "$1" --value; }
until_ok() { i=0; until eval "$1"; do i=$((i+1)); [ $i -gt 120 ] && break; sleep 0.5; done; }
EV=/var/log/isolator/events.ndjson
say started "$(show ActiveState)/$(show SubState) $(show StatusText)"
P=$(show MainPID)
say caps "$(awk '/^CapEff/{print $2}' /proc/$P/status) $(awk '/^CapBnd/{print $2}' /proc/$P/status)"
say uid_nnp "$(awk '/^Uid/{print $2}' /proc/$P/status) $(awk '/^NoNewPrivs/{print $2}' /proc/$P/status)"
say modes "$(stat -c %a /run/isolator) $(stat -c %a /run/isolator/isolator.sock) $(stat -c %a /var/log/isolator) $(stat -c %a $EV)"
dd if=/dev/nullb0 of=/dev/null bs=4096 count=20000 iflag=direct 2>/dev/null
until_ok 'grep -q "\"disk\":\"nullb0\"" $EV'
say observed "$(grep -c '"disk":"nullb0"' $EV)"
W1=$(show WatchdogTimestampMonotonic)
until_ok '[ "$(show WatchdogTimestampMonotonic)" != "$W1" ]'
say watchdog "$(show WatchdogUSec) $W1 $(show WatchdogTimestampMonotonic)"
echo "+io" > /sys/fs/cgroup/cgroup.subtree_control
mkdir -p /sys/fs/cgroup/iso-unit-a
sh -c 'echo $$ > /sys/fs/cgroup/iso-unit-a/cgroup.procs; exec /usr/local/bin/loadgen --path /dev/nullb0 --op read --bytes 1099511627776 --bs 1048576 --direct --seconds 300' >/dev/null 2>&1 &
mkdir -p /etc/isolator
printf '[[service]]\nname = "backup"\ncgroup = "/iso-unit-*"\nclass = "best-effort"\nceiling = "50MB/s"\n' > /etc/isolator/isolator.toml
echo 'ISOLATOR_OPTS="--config /etc/isolator/isolator.toml"' > /etc/default/isolator
systemctl restart isolator
say restarted "$(show ActiveState)/$(show SubState) $(show StatusText)"
until_ok 'grep -q rbps=50000000 /sys/fs/cgroup/iso-unit-a/io.max'
say limited "$(cat /sys/fs/cgroup/iso-unit-a/io.max)"
systemctl reload isolator
until_ok 'grep -q "\"code\":\"reopened\"" $EV'
say reopened "$(grep -c '"code":"reopened"' $EV)"
kill -9 $(show MainPID)
until_ok '[ "$(show NRestarts)" = 1 ] && [ "$(show SubState)" = running ] && grep -q "\"reason\":\"recovery\"" $EV'
say crashed "$(show NRestarts) $(show ActiveState)/$(show SubState) recovery=$(grep -c '"reason":"recovery"' $EV)"
until_ok 'grep -q rbps=50000000 /sys/fs/cgroup/iso-unit-a/io.max'
say limited_again "$(cat /sys/fs/cgroup/iso-unit-a/io.max)"
systemctl stop isolator
say stopped "$(show ActiveState) $(show Result) io.max=[$(cat /sys/fs/cgroup/iso-unit-a/io.max)]"
say last "$(tail -1 $EV)"
kill $(cat /sys/fs/cgroup/iso-unit-a/cgroup.procs) 2>/dev/null
say end "probe"
systemctl poweroff -f
"#;

#[test]
fn the_unit_under_systemd_in_a_vm_notifies_controls_restarts_and_restores() {
    use isolator_tests::vm;
    require_root();
    require_tool("qemu-system-x86_64");
    require_tool("cpio");
    assert!(
        Path::new("/lib/systemd/systemd").exists(),
        "/lib/systemd/systemd is missing: run scripts/bootstrap.sh (installs systemd)"
    );
    let kdir = vm::kernel_dir("linux-image-6.1.");
    let scratch = Scratch::new();
    let root = scratch.path("root");
    for d in [
        "bin", "lib", "proc", "sys", "dev", "lower", "upper", "newroot", "payload",
    ] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    std::fs::copy("/bin/busybox", root.join("bin/busybox")).expect("busybox-static");
    let modules = [
        "drivers/virtio/virtio_ring",
        "drivers/virtio/virtio",
        "drivers/virtio/virtio_pci_modern_dev",
        "drivers/virtio/virtio_pci_legacy_dev",
        "drivers/virtio/virtio_pci",
        "net/9p/9pnet",
        "net/9p/9pnet_virtio",
        "fs/netfs/netfs",
        "fs/fscache/fscache",
        "fs/9p/9p",
        "fs/overlayfs/overlay",
        "fs/configfs/configfs",
        "drivers/block/null_blk/null_blk",
    ];
    let mut list = String::new();
    for m in modules {
        let name = m.rsplit('/').next().unwrap();
        vm::add_module(&kdir, m, &root.join(format!("lib/{name}.ko")));
        list.push_str(name);
        list.push('\n');
    }
    std::fs::write(root.join("modlist"), list).unwrap();
    let payload = root.join("payload");
    std::fs::copy(isolator_bin(), payload.join("isolator")).unwrap();
    std::fs::copy(loadgen_bin(), payload.join("loadgen")).unwrap();
    std::fs::copy(
        workspace_root().join("deploy/isolator.service"),
        payload.join("isolator.service"),
    )
    .unwrap();
    std::fs::write(payload.join("isolator-test.target"), PROBE_TARGET).unwrap();
    std::fs::write(payload.join("isolator-probe.service"), PROBE_SERVICE).unwrap();
    std::fs::write(payload.join("probe.sh"), PROBE).unwrap();
    std::fs::write(root.join("init"), SYSTEMD_INIT).unwrap();
    std::fs::set_permissions(root.join("init"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let initrd = scratch.path("initrd.gz");
    run_ok(Command::new("sh").arg("-c").arg(format!(
        "cd '{}' && find . | cpio -o -H newc --quiet | gzip -1 > '{}'",
        root.display(),
        initrd.display()
    )));
    let out = vm::boot_with(
        &kdir,
        &initrd,
        "2",
        &[
            "-virtfs",
            "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
        ],
        "systemd.unit=isolator-test.target systemd.show_status=0",
    );
    let said = |key: &str| -> String {
        out.lines()
            .find_map(|l| l.strip_prefix(&format!("=== {key}: ")))
            .unwrap_or_else(|| panic!("the guest did not say {key}:\n{out}"))
            .trim()
            .to_string()
    };
    assert_eq!(said("end"), "probe", "{out}");
    // Type=notify: started (READY=1) with its status; only the unit's capabilities.
    assert_eq!(said("started"), "active/running observing");
    let caps: Vec<String> = unit_values("CapabilityBoundingSet")
        .iter()
        .map(|c| c.trim_start_matches("CAP_").to_string())
        .collect();
    let mask = format!("{:016x}", cap_mask(&caps));
    assert_eq!(said("caps"), format!("{mask} {mask}"), "CapEff CapBnd");
    assert_eq!(said("uid_nnp"), "0 1");
    // The directories systemd made for it and the files the agent made: root's alone.
    assert_eq!(said("modes"), "700 600 700 600");
    assert!(said("observed").parse::<u64>().unwrap() > 0);
    // The watchdog is armed and pinged.
    let w: Vec<String> = said("watchdog").split(' ').map(String::from).collect();
    assert_eq!(w[0], "30s");
    assert_ne!(w[1], w[2], "no keep-alive reached systemd");
    // With --config from /etc/default/isolator: controls, through ProtectSystem=strict.
    assert_eq!(
        said("restarted"),
        "active/running controlling with policy adaptive"
    );
    assert!(said("limited").contains("rbps=50000000"), "{out}");
    assert!(said("reopened").parse::<u64>().unwrap() >= 1);
    // SIGKILL: restarted by Restart=on-failure, the journal in /run/isolator (kept across
    // the restart) restored first, and the ceiling set again.
    let crashed = said("crashed");
    assert!(
        crashed.starts_with("1 active/running recovery=") && !crashed.ends_with("=0"),
        "{crashed}"
    );
    assert!(said("limited_again").contains("rbps=50000000"));
    // systemctl stop: SIGTERM, limits put back, exit 0.
    assert_eq!(said("stopped"), "inactive success io.max=[]");
    let last: Value = serde_json::from_str(&said("last")).unwrap();
    assert_eq!(last["type"], "agent_stop");
    assert_eq!(last["reason"], "SIGTERM");
}
