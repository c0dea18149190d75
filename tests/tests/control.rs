//! SLO enforcement on the real disk: the noisy-neighbor scenario under `adaptive`, and
//! restoring every knob after SIGTERM, after SIGKILL + restart and by `isolator restore`.

use std::{process::Command, time::Duration};

use isolator_tests::*;
use serde_json::Value;

fn write_config(scratch: &Scratch, body: &str) -> std::path::PathBuf {
    let p = scratch.path("isolator.toml");
    std::fs::write(&p, body).unwrap();
    p
}

/// The knob's line for `dev` in a v1 throttle file or v2 io.max.
fn knob_line(cg: &TestCgroup, file_v1: &str, dev: &str) -> Option<String> {
    let f = if cg.v2 { "io.max" } else { file_v1 };
    std::fs::read_to_string(cg.dir.join(f))
        .unwrap()
        .lines()
        .find(|l| l.starts_with(&format!("{dev} ")))
        .map(str::to_string)
}

#[test]
fn noisy_neighbor_adaptive_protects_the_reader_and_keeps_the_writer_going() {
    require_root();
    require_tool("fio");
    let scratch = Scratch::new();
    let db = TestCgroup::new("iso-nn-db");
    let backup = TestCgroup::new("iso-nn-backup");
    let (rfile, wfile) = noisy::files(&scratch);
    let dev = disk_of(&scratch.dir);
    let slo_ms = 6;
    let config = write_config(&scratch, &noisy::config(&db, &backup, slo_ms));
    let journal = scratch.path("journal");
    let mut agent = Agent::start_controlling(&config, &journal, &[]);
    // 50 s of writer: the search for the knee costs a probe or two that break (one
    // violating cycle each) whatever the run's length, and the disk's own slow cycles come
    // one in six to ten at every cap near the knee; over 22 steady cycles that left one
    // spell between a controller at its budget and a failed test (CI on 734e992: 5 of 22,
    // three of them the search's).
    let run = noisy::run_pair(&scratch, (&db, &backup), (&rfile, &wfile), 6, 50);
    assert!(run.writer_ok, "writer fio failed");
    assert!(run.reader_ok, "reader fio failed");
    agent.wait_cycles(1);
    let (status, stderr) = agent.stop();
    assert!(status.success(), "agent: {stderr}");
    let events = agent.events();

    // Every knob is back: no limit line for the disk, and the journal is gone.
    assert_eq!(
        knob_line(&backup, "blkio.throttle.write_bps_device", &dev),
        None,
        "limit left behind"
    );
    assert!(
        !journal.join("journal.json").exists(),
        "journal left behind"
    );
    // Put back at stop, or removed by the policy before stop.
    let restored = events
        .iter()
        .any(|e| e["type"] == "restore" && e["result"] == "restored");
    let lifted = noisy::cap_removed_by_policy(&events, "backup");
    assert!(
        restored || lifted,
        "the writer's cap was neither lifted by the policy nor restored at stop"
    );

    noisy::assert_adaptive_control(&events);
    // It stays there as the reader sees it too: fio's own completion latencies over the
    // steady phase (from 5 s after the writer started to its end) have a p99.9 within the
    // SLO.
    let (p999_ns, n) = run.reader_p999_ns(5000);
    println!(
        "reader p99.9 by fio over the steady phase: {:.2} ms ({n} I/Os)",
        p999_ns as f64 / 1e6
    );
    assert!(
        p999_ns <= slo_ms * 1_000_000,
        "reader p99.9 {:.2} ms over the steady phase (fio, {n} I/Os) exceeds the {slo_ms} ms SLO",
        p999_ns as f64 / 1e6
    );
    // Decisions carry their numbers.
    let d = events
        .iter()
        .find(|e| e["type"] == "decision" && e["service"] == "backup")
        .expect("no decision");
    assert_eq!(d["policy"], "adaptive");
    assert_eq!(d["cause"]["victim"], "db");
    assert!(d["cause"]["p999_ns"].as_u64().unwrap() > slo_ms * 1_000_000);
    assert!(events
        .iter()
        .any(|e| e["type"] == "violation_start" && e["service"] == "db"));
    assert!(events
        .iter()
        .any(|e| e["type"] == "violation_end" && e["service"] == "db"));

    // Every event of the controlled run (service_stats, policy_input, decision, violations,
    // restores) is as docs/events.md says.
    events_doc::assert_events_match_docs(&events);
    // The run is recorded: every line reads into the typed model, and replaying it with the
    // same policy and SLO makes every decision it made, and no other.
    assert_events_round_trip(&agent.events);
    let recorded = events
        .iter()
        .filter(|e| e["type"] == "decision" && e["policy"] == "adaptive")
        .count();
    assert!(
        events.iter().any(|e| e["type"] == "policy_input"),
        "no policy_input recorded"
    );
    let file = agent.events.to_str().unwrap();
    let out = run_ok(Command::new(isolator_bin()).args(["replay", file]));
    println!("{out}");
    assert!(
        out.contains(&format!(
            "{recorded} recorded decisions, {recorded} replayed, 0 differ"
        )),
        "{out}"
    );
    assert!(out.contains("no differences"), "{out}");
    // With a looser SLO (100 ms, which db met all along) the writer would not have been
    // capped: the replay says where it parts from the recording.
    let out = run_ok(Command::new(isolator_bin()).args(["replay", file, "--slo", "db=100ms"]));
    println!("{out}");
    assert!(
        out.contains("SLO of db: latency p99.9 <= 100.000ms"),
        "{out}"
    );
    assert!(
        out.contains("backup wbps: recorded") && out.contains("replay leaves it as it was"),
        "{out}"
    );
    assert!(out.contains("difference(s)"), "{out}");
}

/// A cgroup whose read limit has a non-default original (so that "restored" cannot mean
/// "reset to default"), and a config giving it a 50 MB/s ceiling: the agent writes the
/// read limit on the first cycle with I/O.
struct CeilingCase {
    scratch: Scratch,
    cg: TestCgroup,
    file: std::path::PathBuf,
    dev: String,
    original: String,
    args: Vec<String>,
}

impl CeilingCase {
    fn new(prefix: &str) -> Self {
        let scratch = Scratch::new();
        let cg = TestCgroup::new(prefix);
        let file = scratch.path("f");
        make_file(&file, 16 << 20);
        let dev = disk_of(&scratch.dir);
        let (knob_file, line) = if cg.v2 {
            ("io.max", format!("{dev} rbps=987654321"))
        } else {
            ("blkio.throttle.read_bps_device", format!("{dev} 987654321"))
        };
        std::fs::write(cg.dir.join(knob_file), &line).unwrap();
        let original = knob_line(&cg, "blkio.throttle.read_bps_device", &dev).unwrap();
        let config = write_config(
            &scratch,
            &format!(
                "[[service]]\nname = \"capped\"\ncgroup = \"{}\"\nclass = \"best-effort\"\nceiling = \"50MB/s\"\n",
                cg.rel_path()
            ),
        );
        let args = vec![
            "--config".to_string(),
            config.display().to_string(),
            "--journal-dir".to_string(),
            scratch.path("journal").display().to_string(),
        ];
        CeilingCase {
            scratch,
            cg,
            file,
            dev,
            original,
            args,
        }
    }

    fn start_agent(&self, extra: &[&str]) -> Agent {
        let mut args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        args.extend_from_slice(extra);
        Agent::start(&args)
    }

    fn journal_file(&self) -> std::path::PathBuf {
        self.scratch.path("journal").join("journal.json")
    }

    fn rbps_line(&self) -> String {
        knob_line(&self.cg, "blkio.throttle.read_bps_device", &self.dev).unwrap()
    }

    fn read_some(&self) {
        let mut c = self.cg.spawn(&format!(
            "{} --path {} --op read --bytes 16777216 --bs 65536 --direct",
            loadgen_bin().display(),
            self.file.display()
        ));
        assert!(c.wait().unwrap().success());
    }

    /// Reads through the service and waits for the ceiling decision.
    fn read_until_capped(&self, agent: &Agent) -> Value {
        self.read_some();
        agent.wait_for(
            |e| e["type"] == "decision" && e["knob"] == "rbps",
            Duration::from_secs(30),
        )
    }
}

#[test]
fn restores_after_sigterm_and_after_sigkill_and_restart() {
    require_root();
    let case = CeilingCase::new("iso-restore");

    // SIGTERM.
    let mut agent = case.start_agent(&[]);
    let d = case.read_until_capped(&agent);
    assert_eq!(d["old"], "987654321");
    assert_eq!(d["new"], "50000000");
    assert_ne!(case.rbps_line(), case.original);
    let (status, _) = agent.stop();
    assert!(status.success());
    assert_eq!(case.rbps_line(), case.original);
    assert!(!case.journal_file().exists());

    // SIGKILL, then a restart restores before anything else.
    let mut agent = case.start_agent(&[]);
    case.read_until_capped(&agent);
    agent.kill();
    assert_ne!(case.rbps_line(), case.original);
    assert!(case.journal_file().exists(), "no journal after SIGKILL");
    let mut agent = case.start_agent(&[]);
    let r = agent.wait_for(
        |e| e["type"] == "restore" && e["reason"] == "recovery",
        Duration::from_secs(15),
    );
    assert_eq!(r["result"], "restored");
    assert_eq!(case.rbps_line(), case.original);
    let (status, _) = agent.stop();
    assert!(status.success());

    // SIGKILL, then `isolator restore` by hand.
    let mut agent = case.start_agent(&[]);
    case.read_until_capped(&agent);
    agent.kill();
    let out = run_ok(
        Command::new(isolator_bin())
            .args(["restore", "--journal-dir"])
            .arg(case.scratch.path("journal")),
    );
    assert!(out.contains("restored"), "{out}");
    assert_eq!(case.rbps_line(), case.original);
    assert!(!case.journal_file().exists());
}

#[test]
fn dry_run_reports_and_writes_nothing() {
    require_root();
    let case = CeilingCase::new("iso-dry");
    let mut agent = case.start_agent(&["--dry-run"]);
    let d = case.read_until_capped(&agent);
    assert_eq!(d["applied"], false);
    assert_eq!(d["new"], "50000000");
    assert_eq!(case.rbps_line(), case.original);
    assert!(!case.journal_file().exists());
    let (status, _) = agent.stop();
    assert!(status.success());
}

#[test]
fn config_errors_stop_the_agent_with_file_and_line() {
    require_root();
    let scratch = Scratch::new();
    let cg = TestCgroup::new("iso-cfg");
    let cases = [
        (
            format!("[[service]]\nname='a'\ncgroup='{}'\nclass='latency'\np999='-3ms'\n", cg.rel_path()),
            ":5: p999",
        ),
        (
            "[[service]]\nname='a'\ncgroup='/no-such-cgroup-here'\nclass='best-effort'\n".to_string(),
            ":3: cgroup glob",
        ),
        (
            format!("[[service]]\nname='a'\ncgroup='{0}'\nclass='best-effort'\n[[service]]\nname='b'\ncgroup='{0}*'\nclass='best-effort'\n", cg.rel_path()),
            "claimed by service 'a'",
        ),
        (
            format!("[[service]]\nname='a'\ncgroup='{}'\nclass='best-effort'\nspeed=3\n", cg.rel_path()),
            ":5: unknown field `speed`",
        ),
    ];
    for (body, needle) in cases {
        let config = write_config(&scratch, &body);
        let out = Command::new(isolator_bin())
            .args(["run", "--config", config.to_str().unwrap(), "--journal-dir"])
            .arg(scratch.path("j"))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "started with a bad config: {body}");
        assert_eq!(stderr.trim().lines().count(), 1, "not one line: {stderr}");
        assert!(stderr.contains(needle), "{stderr} lacks {needle}");
        assert!(stderr.contains("isolator.toml"), "{stderr} names no file");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}
