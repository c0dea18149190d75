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

/// The fields a latency SLO at another quantile than p99.9 adds are documented with their
/// types: the agent's own typed events (as its sink writes them, envelope added) for a p95
/// service, since the real runs above and the control tests configure p99.9 SLOs.
#[test]
fn fields_of_an_slo_at_another_quantile_match_docs() {
    use isolator::{
        config::{LatencyQuantile, LatencyTarget, SloClass},
        events::{Decision, DiskStall, Event, ServiceStats, SloInfeasible, ViolationInfo},
        policy::{Cause, LatencyNumbers},
    };
    let doc = documented();
    let p95 = SloClass::Latency(LatencyTarget {
        quantile: LatencyQuantile::P95,
        target_ns: 3_000_000,
    });
    let (q, latency, slo) = (Some(LatencyQuantile::P95), Some(9_000_000), Some(3_000_000));
    let numbers = LatencyNumbers {
        p999_ns: Some(30_000_000),
        slo_p999_ns: None,
        quantile: q,
        latency_ns: latency,
        slo_latency_ns: slo,
    };
    let events = [
        Event::ServiceStats(ServiceStats {
            service: "pg".into(),
            slo: p95,
            p999_ns: Some(30_000_000),
            slo_latency_ns: latency,
            ..Default::default()
        }),
        Event::ViolationStart(ViolationInfo {
            service: "pg".into(),
            slo: p95,
            p999_ns: Some(30_000_000),
            latency_ns: latency,
            ..Default::default()
        }),
        Event::Decision(Decision {
            service: "backup".into(),
            cgroups: vec!["/backup".into()],
            cause: Some(Cause {
                victim: Some("pg".into()),
                p999_ns: Some(30_000_000),
                quantile: q,
                latency_ns: latency,
                slo_latency_ns: slo,
                ..Default::default()
            }),
            ..Default::default()
        }),
        Event::SloInfeasible(SloInfeasible {
            service: "pg".into(),
            latency: numbers,
            ..Default::default()
        }),
        Event::DiskStall(DiskStall {
            service: "pg".into(),
            latency: numbers,
            level_latency_ns: Some(2_000_000),
            ..Default::default()
        }),
    ];
    for event in &events {
        let mut e = serde_json::to_value(event).unwrap();
        e["schema"] = 1.into();
        e["ts"] = "2026-12-05T00:00:00.000Z".into();
        validate(&doc, &e);
        // Each carries what only an SLO at another quantile writes, so the check saw it.
        let line = e.to_string();
        assert!(
            line.contains("\"p95_ns\"") || line.contains("\"quantile\":\"p95\""),
            "{line}"
        );
    }
}
