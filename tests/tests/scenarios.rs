//! The control scenarios of issue 17 on the real disk, shortened: a QD1 reader with a
//! p99.9 SLO next to (1) a sequential writer, (2) a random-read aggressor, (4) a writer that
//! comes and goes. Each test judges the reader by fio's own log (what the client saw over the
//! steady phase) and by its per-cycle p99.9, and holds `adaptive` to a work-conservation
//! floor measured in the same test: a static cap [`scenario::ABOVE`] times what `adaptive` gave the
//! aggressor must isolate the reader worse than `adaptive` did (more violating cycles, or
//! fio's p99.9 over the SLO), else `adaptive` left a third of the disk idle for nothing.
//! `adaptive` itself must keep fio's p99.9 within the SLO and at most one violating cycle
//! in five, over three rounds of the modes alternated. The benchmark (`--bin scenarios`)
//! holds it to 90 % of the best static cap, median of 3 runs.

use isolator_tests::{
    disk_of, require_root, require_tool,
    scenario::{self, Aggressor, Files, Mode, Outcome, Scenario, ROUNDS},
    Scratch,
};

fn setup(scan: bool) -> (Scratch, Files, String) {
    require_root();
    require_tool("fio");
    require_tool("taskset");
    let scratch = Scratch::new();
    let files = Files::new(&scratch, scan);
    let dev = disk_of(&scratch.dir);
    (scratch, files, dev)
}

fn run(s: &(Scratch, Files, String), sc: &Scenario, mode: Mode) -> Outcome {
    let o = scenario::run(&s.0, &s.1, &s.2, sc, &mode).unwrap_or_else(|e| panic!("{e}"));
    scenario::print_cycles(&o);
    o
}

#[test]
fn writer_scenario_adaptive_keeps_the_slo_and_the_writer_near_the_knee() {
    let s = setup(false);
    // 60 s, as the benchmark's writer runs. With 30 s the steady phase was 19 cycles, all
    // within the memory of the knees the first probes found (`BAD_MEMORY_CYCLES`, 30). In a
    // fresh-clone run on 9a747ca a near miss at 77 MB/s in the first probe (4.9 ms against
    // 5) and single cycles at 1.2-1.5x the target under 137, 109 and 88 MB/s held `adaptive`
    // at 38-109 MB/s for the whole phase (78-99 MB/s steady, 6 violating cycles), while
    // static caps 1.5x those rates broke 1. At 60 s the knees' memory expires inside the
    // steady phase.
    let sc = Scenario::new(Aggressor::Writer, 5, 60);
    scenario::assert_controlled(|m| run(&s, &sc, m), &sc, ROUNDS, |_| {});
}

/// The reader's target comes from an uncapped run first ([`scenario::calibrated_slo`]): the
/// scan's cost to the reader moves with the disk's state by 2x within an hour (1.5-2.2 ms a
/// cycle in one CI run, 3.0-3.7 ms in the next hour's), where the writer's does not; and
/// the uncapped run is made again while the target it gives is one the scan does not break.
#[test]
fn random_reader_scenario_adaptive_keeps_the_slo_and_the_scan_near_the_knee() {
    let s = setup(true);
    let nominal = Scenario::new(Aggressor::RandomReader, 3, 30);
    let (slo_us, uncapped) =
        scenario::calibrated_slo(s.1.reader_file(), || run(&s, &nominal, Mode::None))
            .unwrap_or_else(|e| panic!("{e}"));
    let sc = Scenario { slo_us, ..nominal };
    println!(
        "the reader's target: {:.2} ms (alone {:.2} ms, its seconds' median {:.2}; next to the uncapped scan {:.2} ms by the client)",
        sc.slo_ms(),
        uncapped.solo_p999_ms,
        uncapped.solo_second_p999_ms,
        uncapped.steady_client_p999_ms
    );
    scenario::assert_controlled(|m| run(&s, &sc, m), &sc, ROUNDS, |_| {});
}

#[test]
fn on_off_scenario_adaptive_lifts_the_cap_at_rest_and_is_back_within_3_cycles() {
    let s = setup(false);
    // On 30 s, as the scenario. With 20 s phases a phase had 9-10 steady cycles,
    // which still held the end of the climb back from a return's deep cut (137 -> 34 MB/s,
    // back at 126 ten cycles later): in a fresh-clone run on 719d2fe adaptive's steady mean
    // was 83-134 MB/s, static caps 1.5x that held, and the two tied on violations, 7 to 7.
    let sc = Scenario::new(Aggressor::Writer, 5, 30).on_off(12, 2);
    scenario::assert_controlled(
        |m| run(&s, &sc, m),
        &sc,
        ROUNDS,
        |o| {
            assert_eq!(o.cycles_to_lift.len(), 1, "phases: {:?}", o.cycles_to_slo);
            assert!(
                o.cycles_to_lift[0].is_some_and(|c| c <= 5),
                "the cap was not lifted within 5 cycles of the writer going quiet: {:?}",
                o.cycles_to_lift
            );
        },
    );
}

/// A QD1 reader alone whose target is below what the disk gives it alone: no cap on anybody
/// can help. The agent says so once (`slo_infeasible`, with the numbers) and limits nothing.
#[test]
fn a_target_below_what_the_reader_gets_alone_is_reported_infeasible_and_nothing_is_capped() {
    use isolator_tests::{events_doc, noisy, Agent, TestCgroup};
    let (scratch, files, _dev) = setup(false);
    let db = TestCgroup::new("iso-sc-alone");
    let config = scratch.path("alone.toml");
    std::fs::write(
        &config,
        format!(
            "[[service]]\nname = \"db\"\ncgroup = \"{}\"\nclass = \"latency\"\np999 = \"20us\"\n",
            db.rel_path()
        ),
    )
    .unwrap();
    let journal = scratch.path("journal");
    let mut agent = Agent::start_controlling(&config, &journal, &[]);
    let mut reader = db.spawn(&noisy::reader(
        files.reader_file(),
        8,
        &scratch.path("alone"),
    ));
    assert!(reader.wait().unwrap().success(), "reader fio failed");
    agent.wait_cycles(1);
    let (status, stderr) = agent.stop();
    assert!(status.success(), "agent: {stderr}");
    let events = agent.events();
    let found: Vec<_> = events
        .iter()
        .filter(|e| e["type"] == "slo_infeasible")
        .collect();
    println!("{found:#?}");
    assert_eq!(found.len(), 1, "one slo_infeasible per violation spell");
    let f = found[0];
    assert_eq!(f["service"], "db");
    assert_eq!(f["slo_p999_ns"], 20_000);
    assert!(f["p999_ns"].as_u64().unwrap() > 20_000);
    assert!(f["reason"].as_str().unwrap().contains("nobody else"), "{f}");
    assert!(f["action"].as_str().unwrap().contains("nothing"), "{f}");
    assert!(
        !events.iter().any(|e| e["type"] == "decision"),
        "a limit was written for a target nobody can meet"
    );
    events_doc::assert_events_match_docs(&events);
}
