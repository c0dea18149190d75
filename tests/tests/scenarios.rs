//! The control scenarios of issue 17 on the real disk, shortened: a QD1 reader with a
//! p99.9 SLO next to (1) a sequential writer, (2) a random-read aggressor, (4) a writer that
//! comes and goes. Each test judges the reader by fio's own log (what the client saw over the
//! steady phase) and by its per-cycle p99.9, and holds `adaptive` to a work-conservation
//! floor measured in the same test: a static cap [`ABOVE`] times what `adaptive` gave the
//! aggressor must isolate the reader worse than `adaptive` did (more violating cycles, or
//! fio's p99.9 over the SLO), else `adaptive` left a third of the disk idle for nothing.
//! `adaptive` itself must keep fio's p99.9 within the SLO and at most one violating cycle
//! in five, over three rounds of the modes alternated. The benchmark (`--bin scenarios`)
//! holds it to 90 % of the best static cap, median of 3 runs.

use isolator_tests::{
    disk_of, require_root, require_tool,
    scenario::{self, Aggressor, Files, Mode, Outcome, Scenario},
    Scratch,
};

/// At most one violating steady cycle in this many, for `adaptive` and the static cap alike.
const KEEPS_ONE_IN: usize = 5;

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

/// Rounds of (adaptive, static cap) in each test, alternated: the disk drifts within
/// minutes (seen: a writer's knee at ~480 MB/s, then ~290 MB/s 20 s later), so one static
/// run after one adaptive run judged the disk as much as the control. Three, not two: with
/// two, one round in a slow spell (the scan's cap cut to 96 MB/s while the disk stalled at
/// 10 ms at every cap) decided the pooled verdict.
const ROUNDS: usize = 3;

/// The static cap each round compares against, as a multiple of `adaptive`'s rate: a floor
/// of two thirds of the rate at which a static cap isolates as well. It catches the defect
/// the issue measured (47 % of the best static cap). At 1.25x (a floor of 80 %) one of the
/// three scenarios failed it in 2 of 3 runs on the test disk (a tie in violating cycles, or
/// one round in a slow spell), where the benchmark puts `adaptive` at 82-117 % of the best
/// static cap. The 90 % target is the benchmark's (median of 3, in BENCHMARKS.md),
/// not this test's.
const ABOVE: f64 = 1.5;

/// Whether the runs together kept the SLO: fio's p99.9 over each run's steady phase within
/// it, and at most one violating cycle in [`KEEPS_ONE_IN`] over all their steady cycles
/// (pooled: 20 cycles of one run are a small sample of a one-in-ten rate).
fn kept(runs: &[&Outcome], slo_ms: u64) -> bool {
    let (violations, cycles) = pooled(runs);
    runs.iter().all(|o| o.steady_fio_p999_ms <= slo_ms as f64)
        && cycles > 0
        && violations * KEEPS_ONE_IN <= cycles
}

fn pooled(runs: &[&Outcome]) -> (usize, usize) {
    runs.iter().fold((0, 0), |(v, c), o| {
        (v + o.steady_violations, c + o.steady_cycles)
    })
}

fn describe(runs: &[&Outcome]) -> String {
    runs.iter()
        .map(|o| {
            format!(
                "{}: fio p99.9 {:.2} ms, {}/{} violating, aggressor {:.0} MB/s",
                o.mode.label(),
                o.steady_fio_p999_ms,
                o.steady_violations,
                o.steady_cycles,
                o.aggressor_steady_mbps
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// [`ROUNDS`] rounds of `adaptive`, then a static cap [`ABOVE`] times the rate `adaptive` gave
/// the aggressor in that round. Each adaptive run: the aggressor hurt the reader, and the
/// SLO was back within 3 cycles (plus `each`). Over the rounds: `adaptive` kept the SLO as
/// the reader saw it, and the static caps isolated the reader worse than `adaptive` did
/// (else `adaptive` left a third of the disk idle for nothing).
fn assert_controlled(s: &(Scratch, Files, String), sc: &Scenario, each: impl Fn(&Outcome)) {
    let mut adaptive = vec![];
    let mut fixed = vec![];
    for _ in 0..ROUNDS {
        let o = run(s, sc, Mode::Policy("adaptive".into()));
        assert!(
            o.hurt[0],
            "the aggressor never pushed the reader over its {} ms SLO: the scenario proves nothing on this disk ({:?})",
            sc.slo_ms,
            o.p999_ms
        );
        assert!(
            o.cycles_to_slo.iter().all(|c| c.is_some_and(|c| c <= 3)),
            "not back within the SLO 3 cycles after the aggressor broke it: {:?} ({:?})",
            o.cycles_to_slo,
            o.p999_ms
        );
        each(&o);
        let above = ((o.aggressor_steady_mbps * ABOVE).ceil() as u64).max(2);
        fixed.push(run(s, sc, Mode::Static(above)));
        adaptive.push(o);
    }
    let adaptive: Vec<&Outcome> = adaptive.iter().collect();
    let fixed: Vec<&Outcome> = fixed.iter().collect();
    println!("adaptive: {}", describe(&adaptive));
    println!("static {ABOVE}x: {}", describe(&fixed));
    assert!(
        kept(&adaptive, sc.slo_ms),
        "adaptive did not keep the {} ms SLO in the steady phases (at most 1 violating cycle in {KEEPS_ONE_IN} over the rounds): {}",
        sc.slo_ms,
        describe(&adaptive)
    );
    // Work conservation as a Pareto test: a static cap that gives the aggressor 50 % more
    // must isolate the reader worse (more violating cycles, or fio's p99.9 over the SLO),
    // or `adaptive` gave that bandwidth away for nothing.
    let (adaptive_violations, _) = pooled(&adaptive);
    let (fixed_violations, _) = pooled(&fixed);
    let fixed_as_good = fixed
        .iter()
        .all(|o| o.steady_fio_p999_ms <= sc.slo_ms as f64)
        && fixed_violations <= adaptive_violations;
    assert!(
        !fixed_as_good,
        "static caps {ABOVE}x the rates adaptive gave the aggressor isolated the reader as well \
         ({fixed_violations} violating cycles against adaptive's {adaptive_violations}, fio within the {} ms SLO): \
         adaptive left over a third of the disk idle. {}",
        sc.slo_ms,
        describe(&fixed)
    );
}

#[test]
fn writer_scenario_adaptive_keeps_the_slo_and_the_writer_near_the_knee() {
    let s = setup(false);
    let sc = Scenario::new(Aggressor::Writer, 5, 30);
    assert_controlled(&s, &sc, |_| {});
}

#[test]
fn random_reader_scenario_adaptive_keeps_the_slo_and_the_scan_near_the_knee() {
    let s = setup(true);
    let sc = Scenario::new(Aggressor::RandomReader, 3, 30);
    assert_controlled(&s, &sc, |_| {});
}

#[test]
fn on_off_scenario_adaptive_lifts_the_cap_at_rest_and_is_back_within_3_cycles() {
    let s = setup(false);
    let sc = Scenario::new(Aggressor::Writer, 5, 20).on_off(12, 2);
    assert_controlled(&s, &sc, |o| {
        assert_eq!(o.cycles_to_lift.len(), 1, "phases: {:?}", o.cycles_to_slo);
        assert!(
            o.cycles_to_lift[0].is_some_and(|c| c <= 5),
            "the cap was not lifted within 5 cycles of the writer going quiet: {:?}",
            o.cycles_to_lift
        );
    });
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
