//! Real agent output checked against docs/events.md: every field documented with the
//! right type, every `always` field present.

use std::collections::BTreeSet;

use isolator_tests::{
    events_doc::{documented, validate},
    *,
};

#[test]
fn docs_tables_parse() {
    let doc = documented();
    for t in [
        "*",
        "agent_start",
        "cgroup_stats",
        "cgroup_gone",
        "cycle_end",
        "agent_stop",
    ] {
        assert!(doc.contains_key(t), "docs/events.md lacks {t}");
    }
    assert!(doc["cgroup_stats"].contains_key("devices[].write.latency.p999_ns"));
}

#[test]
fn real_output_matches_docs() {
    require_root();
    let doc = documented();
    let scratch = Scratch::new();
    let cg = TestCgroup::new("iso-schema");
    let mut agent = Agent::start(&["--interval", "1s"]);
    run_ok(std::process::Command::new(loadgen_bin()).args([
        "--cgroup",
        cg.dir.to_str().unwrap(),
        "--path",
        scratch.path("w").to_str().unwrap(),
        "--op",
        "write",
        "--bytes",
        "16777216",
        "--bs",
        "65536",
        "--direct",
    ]));
    agent.wait_cycles(2);
    // A cgroup that goes away must be reported and dropped.
    let gone_id = cg.id();
    drop(cg);
    agent.wait_for(
        |e| e["type"] == "cgroup_gone" && e["cgroup"]["id"].as_u64() == Some(gone_id),
        std::time::Duration::from_secs(15),
    );
    let (status, stderr) = agent.stop();
    assert!(status.success(), "agent exit {status:?}: {stderr}");
    let events = agent.events();
    let types: BTreeSet<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    for t in [
        "agent_start",
        "cgroup_stats",
        "cycle_end",
        "cgroup_gone",
        "agent_stop",
    ] {
        assert!(types.contains(t), "no {t} event in {types:?}");
    }
    for e in &events {
        assert_eq!(e["schema"], 1);
        validate(&doc, e);
    }
    assert_events_round_trip(&agent.events);
}
