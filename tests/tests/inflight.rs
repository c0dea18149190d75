//! The in-flight peak reflects real concurrency. A burst of 8 parallel O_DIRECT readers
//! (direct reads share the inode lock, so they really are concurrent) runs entirely inside
//! one 10 s cycle, so the level is 0 at both ends of the cycle: only the peak the programs
//! record can show the burst. (A relaxed BPF fetch-add once compiled to a plain add and
//! every peak read 2.)

use std::process::Command;

use isolator_tests::*;

#[test]
fn peak_shows_a_burst_inside_the_cycle() {
    require_root();
    let scratch = Scratch::new();
    let data = scratch.path("data");
    make_file(&data, 256 << 20);
    let cg = TestCgroup::new("iso-inflight");
    let agent = Agent::start(&["--interval", "10s", "--count-inflight"]);
    agent.wait_cycles(1);
    // 16384 reads by 8 threads: well under a second here, far inside the 10 s cycle.
    run_ok(Command::new(loadgen_bin()).args([
        "--cgroup",
        cg.dir.to_str().unwrap(),
        "--path",
        data.to_str().unwrap(),
        "--op",
        "randread",
        "--bytes",
        "67108864",
        "--bs",
        "4096",
        "--direct",
        "--threads",
        "8",
    ]));
    agent.wait_cycles(1);
    let reads: Vec<serde_json::Value> = agent
        .events()
        .into_iter()
        .filter(|e| e["type"] == "cgroup_stats" && e["cgroup"]["id"].as_u64() == Some(cg.id()))
        .flat_map(|e| e["devices"].as_array().unwrap().clone())
        .filter_map(|d| d.get("read").cloned())
        .collect();
    assert_eq!(
        reads.len(),
        1,
        "the burst should fall in one cycle: {reads:?}"
    );
    let f = &reads[0]["inflight"];
    let (peak, mean) = (f["peak"].as_u64().unwrap(), f["mean"].as_f64().unwrap());
    assert!(peak as f64 >= mean.floor(), "peak {peak} below mean {mean}");
    assert!(
        peak >= 4,
        "8 concurrent readers, but peak {peak} in flight (mean {mean})"
    );
}
