//! The agent's per-cgroup bytes agree with the kernel's own per-cgroup counters
//! (blkio.throttle.io_service_bytes on v1, io.stat on v2) within 2 %.

use std::{process::Command, thread, time::Duration};

use isolator_tests::*;

fn within(name: &str, agent: u64, kernel: u64, at_least: u64, diag: &str) {
    assert!(
        kernel >= at_least,
        "{name}: kernel counted {kernel} bytes, expected at least {at_least}: the load did not run"
    );
    assert_bytes_within(name, agent, kernel, 0.02, diag);
}

#[test]
fn per_cgroup_bytes_match_kernel_counters() {
    require_root();
    let scratch = Scratch::new();
    let dev = disk_of(&scratch.dir);
    let a = TestCgroup::new("iso-attr-direct");
    let b = TestCgroup::new("iso-attr-buffered");
    // Both share the v1 queue: starting one cgroup's counters starts the queue's.
    a.start_kernel_counters(&dev);
    let reads = scratch.path("reads");
    make_file(&reads, 64 << 20);

    let agent = Agent::start(&["--interval", "1s"]);
    let lg = loadgen_bin();
    let p = |n: &str| scratch.path(n).to_str().unwrap().to_string();
    let spawn = |args: Vec<String>| {
        Command::new(&lg)
            .args(args)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let (ad, bd) = (a.dir.to_str().unwrap(), b.dir.to_str().unwrap());
    let rp = reads.to_str().unwrap();
    let jobs = vec![
        // A: O_DIRECT writes and reads.
        spawn(s(&[
            "--cgroup",
            ad,
            "--path",
            &p("a-direct"),
            "--op",
            "write",
            "--bytes",
            "134217728",
            "--bs",
            "1048576",
            "--direct",
            "--threads",
            "4",
        ])),
        spawn(s(&[
            "--cgroup", ad, "--path", rp, "--op", "randread", "--bytes", "33554432", "--bs",
            "65536", "--direct",
        ])),
        // B: buffered writes, then fsync (issued from B's context), and direct reads.
        spawn(s(&[
            "--cgroup",
            bd,
            "--path",
            &p("b-buffered"),
            "--op",
            "write",
            "--bytes",
            "100663296",
            "--bs",
            "65536",
            "--fsync",
        ])),
        spawn(s(&[
            "--cgroup", bd, "--path", rp, "--op", "read", "--bytes", "16777216", "--bs", "16384",
            "--direct",
        ])),
    ];
    for j in jobs {
        let out = j.wait_with_output().unwrap();
        assert!(out.status.success(), "load generator failed");
    }
    thread::sleep(Duration::from_millis(200));
    agent.wait_cycles(2);
    let events = agent.events();
    let (ka, kb) = (a.kernel_bytes(&dev), b.kernel_bytes(&dev));
    let (xa, xb) = (
        agent_bytes(&events, a.id(), &dev),
        agent_bytes(&events, b.id(), &dev),
    );
    eprintln!("dev {dev}: A kernel {ka:?} agent {xa:?}; B kernel {kb:?} agent {xb:?}");
    let diag = lost_data_report(&events, &dev, &[a.id(), b.id()]);
    eprintln!("{diag}");
    within("A read (O_DIRECT)", xa.0, ka.0, 32 << 20, &diag);
    within("A write (O_DIRECT)", xa.1, ka.1, 128 << 20, &diag);
    within("B read (O_DIRECT)", xb.0, kb.0, 16 << 20, &diag);
    // fsync writes back in the caller's context, so both v1 and v2 charge B.
    within("B write (buffered + fsync)", xb.1, kb.1, 96 << 20, &diag);
    let last_end = events.iter().rev().find(|e| e["type"] == "cycle_end");
    assert_eq!(
        last_end.map(|e| e["map_full"].clone()),
        Some(0.into()),
        "completions were lost: {diag}"
    );
    assert!(events.iter().any(
        |e| e["type"] == "cgroup_stats" && e["cgroup"]["path"].as_str() == Some(&a.rel_path())
    ));
}

/// Where bytes the agent missed could have gone: the agent's own loss counters and the
/// (read, write) bytes it charged to every other cgroup on the disk.
fn lost_data_report(events: &[serde_json::Value], dev: &str, ours: &[u64]) -> String {
    let last_end = events.iter().rev().find(|e| e["type"] == "cycle_end");
    let counter = |k: &str| last_end.map_or(serde_json::Value::Null, |e| e[k].clone());
    let mut others = std::collections::BTreeMap::<String, (u64, u64)>::new();
    for e in events.iter().filter(|e| e["type"] == "cgroup_stats") {
        let id = e["cgroup"]["id"].as_u64().unwrap_or(0);
        if ours.contains(&id) {
            continue;
        }
        let name = e["cgroup"]["path"].as_str().unwrap_or("?").to_string();
        let (r, w) = agent_bytes(std::slice::from_ref(e), id, dev);
        let t = others.entry(format!("{name} ({id})")).or_default();
        t.0 += r;
        t.1 += w;
    }
    format!(
        "agent loss counters: map_full {} unsampled_requests {} missed_events {} preexisting_completions {}; other cgroups (read, write): {others:?}",
        counter("map_full"),
        counter("unsampled_requests"),
        counter("missed_events"),
        counter("preexisting_completions"),
    )
}
