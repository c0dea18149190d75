//! Bad input gets one line naming the cause and the fix, a non-zero exit, no panic; signals
//! stop the agent cleanly.

use std::{
    os::unix::fs::PermissionsExt,
    process::{Command, Output},
    time::Duration,
};

use isolator_tests::*;

fn isolator(args: &[&str]) -> Output {
    Command::new(isolator_bin()).args(args).output().unwrap()
}

/// Exactly one line on stderr, no panic or backtrace, and the expected code.
fn one_line_error(out: &Output, code: i32, must_contain: &[&str]) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(code), "exit code; stderr: {stderr}");
    assert_eq!(
        stderr.trim_end().lines().count(),
        1,
        "not one line: {stderr:?}"
    );
    assert!(
        !stderr.contains("panicked") && !stderr.contains("backtrace"),
        "{stderr}"
    );
    for m in must_contain {
        assert!(stderr.contains(m), "{stderr:?} lacks {m:?}");
    }
    stderr
}

#[test]
fn unknown_flag() {
    one_line_error(
        &isolator(&["run", "--frobnicate"]),
        2,
        &["--frobnicate", "--help"],
    );
    one_line_error(&isolator(&["fly"]), 2, &["fly"]);
}

#[test]
fn interval_out_of_range() {
    for bad in ["500ms", "11s", "0", "soon", "1e20", "inf", "NaN"] {
        one_line_error(&isolator(&["run", "--interval", bad]), 2, &["--interval"]);
    }
    one_line_error(&isolator(&["run", "--interval", "20s"]), 2, &["1s..10s"]);
}

#[test]
fn json_rotation_flags_out_of_range() {
    for bad in ["lots", "-1", "10", "1Q"] {
        one_line_error(
            &isolator(&["run", &format!("--json-max-size={bad}")]),
            2,
            &["--json-max-size", "100MiB"],
        );
    }
    for bad in ["-1", "1001", "many"] {
        one_line_error(
            &isolator(&["run", &format!("--json-backups={bad}")]),
            2,
            &["--json-backups", "0..=1000"],
        );
    }
}

#[test]
fn unwritable_json_path() {
    require_root();
    let e = one_line_error(
        &isolator(&["run", "--json", "/nonexistent-dir/events.ndjson"]),
        1,
        &["/nonexistent-dir/events.ndjson", "writable"],
    );
    assert!(e.starts_with("error: "));
}

#[test]
fn missing_btf() {
    require_root();
    one_line_error(
        &isolator(&["run", "--btf", "/nonexistent/vmlinux"]),
        1,
        &["BTF", "CONFIG_DEBUG_INFO_BTF"],
    );
}

#[test]
fn not_root() {
    require_root();
    require_tool("setpriv");
    // A copy nobody can execute regardless of where the workspace lives.
    let scratch = Scratch::new();
    std::fs::set_permissions(&scratch.dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = scratch.path("isolator");
    std::fs::copy(isolator_bin(), &bin).unwrap();
    let as_nobody = |args: &[&str]| {
        Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "--inh-caps=-all",
            ])
            .arg(&bin)
            .args(args)
            .output()
            .unwrap()
    };
    one_line_error(
        &as_nobody(&["run", "--interval", "1s"]),
        1,
        &["root", "sudo"],
    );
    // `check` reports the same, with the fix, and fails.
    let out = as_nobody(&["check"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("FAIL  privileges") && stdout.contains("fix: run as root"),
        "{stdout}"
    );
}

#[test]
fn check_passes_on_this_host() {
    require_root();
    let out = isolator(&["check"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    for item in [
        "kernel",
        "privileges",
        "btf",
        "tracepoints",
        "load",
        "cgroup",
        "controller",
    ] {
        assert!(stdout.contains(item), "check output lacks {item}: {stdout}");
    }
    assert!(stdout.contains("ok    load"), "{stdout}");
}

#[test]
fn sigterm_and_sigint_stop_within_the_cycle() {
    require_root();
    for sig in [libc::SIGTERM, libc::SIGINT] {
        let scratch = Scratch::new();
        let events = scratch.path("ev.ndjson");
        let mut child = Command::new(isolator_bin())
            .args([
                "run",
                "--interval",
                "10s",
                "--json",
                events.to_str().unwrap(),
            ])
            .spawn()
            .unwrap();
        // Wait for agent_start.
        for _ in 0..300 {
            if std::fs::read_to_string(&events)
                .unwrap_or_default()
                .contains("agent_start")
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        // SAFETY: plain kill(2) on our child.
        unsafe { libc::kill(child.id() as i32, sig) };
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(0), "signal {sig}");
        let text = std::fs::read_to_string(&events).unwrap();
        let last: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
        assert_eq!(last["type"], "agent_stop");
        // Stopped inside the first 10 s cycle: no cycle had ended yet.
        assert_eq!(last["cycles"], 0, "{text}");
        assert!(!text.contains("cycle_end"), "{text}");
    }
}

/// `--json off` means no NDJSON output, as `--socket off` means no socket: nothing on
/// stdout, and no file named "off" where the agent was started.
#[test]
fn json_off_writes_no_events_anywhere() {
    require_root();
    let scratch = Scratch::new();
    let child = Command::new(isolator_bin())
        .current_dir(&scratch.dir)
        .args(["run", "--interval", "1s", "--json", "off"])
        .args(SOCKETS_OFF)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Past load and a first cycle (a failed start exits before this).
    std::thread::sleep(Duration::from_secs(4));
    // SAFETY: plain kill(2) on our child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        out.stdout.is_empty(),
        "events on stdout: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let left: Vec<_> = std::fs::read_dir(&scratch.dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "files made: {left:?}");
}
