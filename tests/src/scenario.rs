//! Control scenarios on the real disk, shared by the control tests and the `scenarios`
//! benchmark: a 4 KiB QD1 random reader (`db`, latency SLO) runs alone for a few seconds,
//! then an aggressor (`backup`, best-effort) joins it; the run is made with no control,
//! under a static cap on the aggressor, or under a policy, and measured the same way in
//! every mode: per cycle from the agent's `service_stats`, and as the reader saw it from
//! fio's own per-I/O log.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{make_file, noisy, Agent, Scratch, TestCgroup};

/// The aggressor of a scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Aggressor {
    /// 1 MiB QD32 O_DIRECT sequential writes (a backup): bandwidth hurts.
    Writer,
    /// 4 KiB QD64 O_DIRECT random reads (a scan): IOPS, not bandwidth, hurts.
    RandomReader,
}

impl Aggressor {
    pub fn name(self) -> &'static str {
        match self {
            Aggressor::Writer => "writer",
            Aggressor::RandomReader => "random-reader",
        }
    }

    fn command(self, file: &Path, runtime_s: u64, buffers: &noisy::WriterBuffers) -> String {
        match self {
            Aggressor::Writer => noisy::writer(file, runtime_s, buffers),
            // On one CPU of the two: at 80k IOPS its submissions and completions take a
            // whole CPU, and on a shared one the reader would wait for the scheduler, not the
            // disk (a host of 64+ CPUs keeps them apart).
            Aggressor::RandomReader => format!(
                "taskset -c 1 fio --name=scan --filename={} --rw=randread --bs=4k --direct=1 \
                 --ioengine=libaio --iodepth=64 --time_based --runtime={runtime_s} \
                 --output=/dev/null",
                file.display()
            ),
        }
    }

    /// The QD1 reader's command next to this aggressor. Next to the scan it runs on the
    /// other CPU: unpinned, the scheduler woke it on the scan's CPU (where the disk's
    /// interrupt lands and the scan's completions wake the scan) and it waited there for
    /// the scan's fio, about a millisecond (traced: 555 reads in 25 s waited over 1 ms from
    /// completion to running; pinned, 75, mostly behind the guest's kdamond and kworkers).
    /// That wait is the CPU's, which fio's completion latency counts and no I/O limit or
    /// block-layer timing sees; a host of 64+ CPUs does not share one CPU between them.
    fn reader_command(self, file: &Path, runtime_s: u64, prefix: &Path) -> String {
        let reader = noisy::reader(file, runtime_s, prefix);
        match self {
            Aggressor::Writer => reader,
            Aggressor::RandomReader => format!("taskset -c 0 {reader}"),
        }
    }

    /// The v1 throttle file and the v2 io.max key of the direction it uses.
    fn knob(self) -> (&'static str, &'static str) {
        match self {
            Aggressor::Writer => ("blkio.throttle.write_bps_device", "wbps"),
            Aggressor::RandomReader => ("blkio.throttle.read_bps_device", "rbps"),
        }
    }

    /// Its MB/s in one `service_stats` record.
    fn mbps(self, e: &Value) -> f64 {
        let key = match self {
            Aggressor::Writer => "write_mbps",
            Aggressor::RandomReader => "read_mbps",
        };
        e[key].as_f64().unwrap_or(0.0)
    }
}

/// One scenario: the aggressor, the reader's SLO, and when the aggressor runs.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub aggressor: Aggressor,
    /// The reader's p99.9 target, µs: whole milliseconds where it is fixed, finer where a
    /// test sets it from the disk's own latencies ([`slo_from_cycles`]).
    pub slo_us: u64,
    /// The reader alone first, this long.
    pub solo_s: u64,
    /// The aggressor runs `on_s`, rests `off_s`, `times` times.
    pub on_s: u64,
    pub off_s: u64,
    pub times: u32,
}

impl Scenario {
    /// The reader alone for 5 s, then `aggressor` for `seconds`.
    pub fn new(aggressor: Aggressor, slo_ms: u64, seconds: u64) -> Scenario {
        Scenario {
            aggressor,
            slo_us: slo_ms * 1000,
            solo_s: 5,
            on_s: seconds,
            off_s: 0,
            times: 1,
        }
    }
    /// The reader's target in ms.
    pub fn slo_ms(&self) -> f64 {
        self.slo_us as f64 / 1000.0
    }
    /// The aggressor's run repeated `times` times, resting `off_s` in between.
    pub fn on_off(self, off_s: u64, times: u32) -> Scenario {
        Scenario {
            off_s,
            times,
            ..self
        }
    }
}

/// Full cycles after the aggressor starts (each time it starts) before its phase counts as
/// steady: the search for the knee gets them.
pub const STEADY_AFTER_CYCLES: u64 = 10;

/// How a run is controlled.
#[derive(Debug, Clone, PartialEq)]
pub enum Mode {
    /// The agent observes (`--dry-run`), nothing is limited.
    None,
    /// The aggressor capped at this many MB/s by hand, for the whole run (paper 001's mix:
    /// `backup`, with `ingest` at its rate target).
    Static(u64),
    /// Two aggressors capped by hand, the first and the second at these MB/s: paper 001's
    /// mix's `ingest` and `backup`, so its static sweep covers splits of the writers'
    /// bandwidth, not only the backup's share next to the promised rate.
    StaticPair(u64, u64),
    /// A policy writes limits. `policy@REV` runs it in the agent built at another commit,
    /// `target/ab/isolator-REV`, for an A/B of two agents in one run (modes alternated, as
    /// the disk drifts within minutes).
    Policy(String),
    /// Proportional weights by hand for the whole run, no cap: the victim's and the
    /// aggressor's (`io.weight` under iocost in the v2 guest).
    Weights(u32, u32),
}

/// A policy mode's policy name and the commit whose agent runs it (`adaptive@fb7c3c9`).
pub fn policy_and_rev(mode: &str) -> (&str, Option<&str>) {
    match mode.split_once('@') {
        Some((policy, rev)) => (policy, Some(rev)),
        None => (mode, None),
    }
}

impl Mode {
    /// The agent's arguments for this mode: the policy, or `adaptive` in `--dry-run` when
    /// nothing but the mode's own static caps may limit.
    pub fn agent_args(&self) -> Vec<String> {
        let mut args = vec!["--policy".to_string()];
        match self {
            Mode::Policy(p) => args.push(policy_and_rev(p).0.to_string()),
            _ => args.extend(["adaptive".into(), "--dry-run".into()]),
        }
        args
    }

    /// The agent binary of a `policy@REV` mode (None: the one under test).
    pub fn agent_binary(&self) -> Result<Option<PathBuf>, String> {
        let Mode::Policy(p) = self else {
            return Ok(None);
        };
        let (_, Some(rev)) = policy_and_rev(p) else {
            return Ok(None);
        };
        let bin = crate::workspace_root().join(format!("target/ab/isolator-{rev}"));
        if !bin.is_file() {
            return Err(format!(
                "mode {p}: no agent at {}; build one with `git worktree add /var/tmp/ab-{rev} {rev} && (cd /var/tmp/ab-{rev} && cargo xtask build)` and copy its target/x86_64-unknown-linux-musl/release/isolator there",
                bin.display()
            ));
        }
        Ok(Some(bin))
    }

    /// A cap set by hand for the whole run, not by the agent.
    pub fn is_static(&self) -> bool {
        matches!(self, Mode::Static(_) | Mode::StaticPair(..))
    }

    /// The one aggressor's static cap in MB/s (None: no cap by hand), or why a scenario
    /// with one aggressor cannot run this mode.
    pub fn single_aggressor_cap(&self) -> Result<Option<u64>, String> {
        match self {
            Mode::Static(mbps) => Ok(Some(*mbps)),
            Mode::StaticPair(..) => Err(format!(
                "{}: two caps, but this scenario has one aggressor; only paper-mix has two",
                self.label()
            )),
            _ => Ok(None),
        }
    }

    pub fn label(&self) -> String {
        match self {
            Mode::None => "no control".into(),
            Mode::Static(m) => format!("static {m} MB/s"),
            Mode::StaticPair(a, b) => format!("static {a}+{b} MB/s"),
            Mode::Policy(p) => p.clone(),
            Mode::Weights(v, a) => format!("weights {v}/{a}"),
        }
    }
}

/// The files a scenario reads and writes, made once for all its runs.
pub struct Files {
    reader: PathBuf,
    writer: PathBuf,
    scan: Option<PathBuf>,
}

impl Files {
    /// The reader's and the writer's files, and the scan's if `scan` (1 GiB more to write,
    /// and the disk to settle after it).
    pub fn new(scratch: &Scratch, scan: bool) -> Files {
        let (reader, writer) = noisy::files(scratch);
        let scan = scan.then(|| {
            let f = scratch.path("scan.dat");
            make_file(&f, 1 << 30);
            noisy::wait_for_settled_disk(&reader);
            f
        });
        Files {
            reader,
            writer,
            scan,
        }
    }

    /// The reader's file.
    pub fn reader_file(&self) -> &Path {
        &self.reader
    }

    fn aggressor(&self, a: Aggressor) -> Result<&Path, String> {
        match a {
            Aggressor::Writer => Ok(&self.writer),
            Aggressor::RandomReader => self
                .scan
                .as_deref()
                .ok_or_else(|| "the random-read scenario needs Files::new(.., true)".into()),
        }
    }
}

/// What one run measured.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub mode: Mode,
    /// The reader's target, µs (the scenario's).
    pub slo_us: u64,
    /// Reader p99.9 of each cycle from the aggressor's first to its last, ms.
    pub p999_ms: Vec<f64>,
    /// Per aggressor phase: cycles from its first violating cycle to the next within the
    /// SLO (0: it never violated; None: never back).
    pub cycles_to_slo: Vec<Option<u64>>,
    /// Per aggressor phase: whether the reader violated its SLO in the phase's first 5
    /// cycles (with no control, the aggressor hurts; under a cap, it may not).
    pub hurt: Vec<bool>,
    /// Per rest between phases: cycles from its first quiet cycle until no cap was left
    /// on the aggressor (None: a cap stayed through the rest).
    pub cycles_to_lift: Vec<Option<u64>>,
    /// The steady cycles' budgets; changes are decisions on the aggressor.
    pub steady: SteadyBudget,
    /// p99.9 of the reader's I/Os from its own log (fio's; the load generator's in a VM): alone,
    /// and in the steady phases.
    pub solo_p999_ms: f64,
    /// The median of the reader's per-second p99.9s alone (ms; NaN: none).
    pub solo_second_p999_ms: f64,
    pub steady_client_p999_ms: f64,
    /// The steady phases cut into one-second windows of the reader's own log (a cycle's
    /// length), and how many of them had a p99.9 over the SLO: the per-cycle verdict as the
    /// client saw it.
    pub steady_client_windows: usize,
    pub steady_client_violations: usize,
    /// The aggressor's mean MB/s over the steady cycles, and its MB over the whole run.
    pub aggressor_steady_mbps: f64,
    pub aggressor_total_mb: f64,
    /// The agent's event stream of the run.
    pub events: Vec<Value>,
}

impl Outcome {
    /// The reader's target in ms.
    pub fn slo_ms(&self) -> f64 {
        self.slo_us as f64 / 1000.0
    }
    /// Whether the reader kept its SLO in the steady phases: fio's p99.9 within it, and
    /// at most one violating cycle in ten (the benchmark's verdict).
    pub fn keeps_slo(&self) -> bool {
        self.keeps_slo_with(10)
    }
    /// The same with at most one violating cycle in `n` (the tests use 5 over their
    /// 20-cycle steady phases: the 1-in-10 target with room for a small sample).
    pub fn keeps_slo_with(&self, n: usize) -> bool {
        self.steady.cycles > 0
            && self.steady_client_p999_ms <= self.slo_ms()
            && self.steady.violating * n <= self.steady.cycles
    }
    /// resctl-bench's isolation: the share of steady cycles within the SLO.
    pub fn isolation(&self) -> f64 {
        self.steady.isolation()
    }
    /// resctl-bench's latency impact: the reader's p99.9 over its p99.9 alone.
    pub fn latency_impact(&self) -> f64 {
        self.steady_client_p999_ms / self.solo_p999_ms
    }
}

/// A reader's target from a finished run's own cycles next to the aggressor, µs: 0.75 of
/// their median p99.9 (the aggressor breaks it), at least 3x the reader's p99.9 alone (a cap
/// can meet it), to 10 µs. The guest's calibration (`vm_scenario`'s `slo_ms=auto`) is the
/// same rule in whole ms. On the host, a whole ms was too coarse: the scan held the reader
/// at 1.5-2.2 ms a cycle in one CI run and at 3.0-3.7 ms an hour later, so 3 ms was never
/// broken in the first and 1 ms is a target far under what the contention leaves. Alone,
/// the median of its per-second p99.9s, as next to the aggressor (the agent judges
/// seconds): pooled over the solo phase's three seconds, one slow second set it at 2.03 ms
/// in a CI run, the target at 6.10 ms, and the uncapped scan (4-7 ms a cycle) never broke
/// that in the first cycles of the next two runs.
pub fn slo_from_cycles(o: &Outcome) -> u64 {
    let solo_ms = if o.solo_second_p999_ms.is_finite() {
        o.solo_second_p999_ms
    } else {
        o.solo_p999_ms
    };
    slo_us_from(&o.p999_ms, solo_ms)
}

/// [`slo_from_cycles`]'s rule on per-cycle p99.9s and the p99.9 alone (ms; NaN alone: none).
fn slo_us_from(cycles_ms: &[f64], solo_ms: f64) -> u64 {
    let median_ms = median_cycle_ms(cycles_ms);
    let solo_ms = Some(solo_ms).filter(|x| x.is_finite()).unwrap_or(0.0);
    let us = (0.75 * median_ms).max(3.0 * solo_ms) * 1000.0;
    (us / 10.0).ceil() as u64 * 10
}

/// The median of per-cycle p99.9s (ms; the upper one of an even count, 0 for none).
fn median_cycle_ms(cycles_ms: &[f64]) -> f64 {
    let mut cycles = cycles_ms.to_vec();
    cycles.sort_by(f64::total_cmp);
    cycles.get(cycles.len() / 2).copied().unwrap_or_default()
}

/// How far under the uncapped aggressor's median cycle a calibrated target must sit for
/// the aggressor to break it in most cycles ([`calibrated_slo`]).
const CALIBRATION_CONTRAST: f64 = 0.9;
/// Uncapped runs [`calibrated_slo`] makes, at most.
const CALIBRATION_RUNS: usize = 3;

/// Whether the target `slo_us` sits under [`CALIBRATION_CONTRAST`] of the uncapped run's
/// median cycle, `median_ms`.
fn aggressor_breaks(median_ms: f64, slo_us: u64) -> bool {
    (slo_us as f64 / 1e3) < CALIBRATION_CONTRAST * median_ms
}

/// The reader's target from an uncapped run (`run_uncapped`), as [`slo_from_cycles`] sets
/// it, and that run; again (up to [`CALIBRATION_RUNS`] in all) while the aggressor would
/// not break it, once the reader of `reader_file` alone is fast enough that three times
/// its p99.9 sits under the contention. The floor of three times alone sets the target
/// when the disk is slow for the reader alone, and then a scan's contention may not reach
/// it: seen in CI, the reader alone at 2.29 ms (its seconds' median), the target at 6.87
/// ms, the uncapped scan at a median 5.4 ms a cycle; the next two rounds' scans broke it in
/// none of their first five cycles, and the test proved nothing after 19 minutes.
pub fn calibrated_slo(
    reader_file: &Path,
    mut run_uncapped: impl FnMut() -> Outcome,
) -> Result<(u64, Outcome), String> {
    let mut seen = vec![];
    for run in 1..=CALIBRATION_RUNS {
        let o = run_uncapped();
        let slo_us = slo_from_cycles(&o);
        let median_ms = median_cycle_ms(&o.p999_ms);
        if aggressor_breaks(median_ms, slo_us) {
            return Ok((slo_us, o));
        }
        println!(
            "calibration {run}: the target {:.2} ms (three times the reader alone, {:.2} ms) is not under {CALIBRATION_CONTRAST} of the uncapped aggressor's median cycle, {median_ms:.2} ms: again once the reader alone is faster",
            slo_us as f64 / 1e3,
            o.solo_second_p999_ms,
        );
        seen.push(format!(
            "{:.2} ms against {median_ms:.2}",
            slo_us as f64 / 1e3
        ));
        if run < CALIBRATION_RUNS {
            let bar_ms = CALIBRATION_CONTRAST * median_ms / 3.0;
            noisy::wait_for_reader_alone_under(reader_file, (bar_ms * 1e6) as u64, 3, 120);
        }
    }
    Err(format!(
        "in {CALIBRATION_RUNS} uncapped runs the aggressor did not break the reader's target (targets against the median cycle: {}): the disk is too slow for the reader alone now for the scenario to prove anything; run the test again once it settles",
        seen.join(", ")
    ))
}

/// Writes (or with 0 removes) the bandwidth cap of `a`'s direction on `cg` on `dev`.
pub fn set_cap(cg: &TestCgroup, a: Aggressor, dev: &str, bytes_per_s: u64) -> Result<(), String> {
    let (v1, v2) = a.knob();
    let (file, line) = if cg.v2 {
        let v = if bytes_per_s == 0 {
            "max".to_string()
        } else {
            bytes_per_s.to_string()
        };
        ("io.max", format!("{dev} {v2}={v}"))
    } else {
        (v1, format!("{dev} {bytes_per_s}"))
    };
    let path = cg.dir.join(file);
    std::fs::write(&path, line).map_err(|e| format!("writing {}: {e}", path.display()))
}

/// The p99.9 in ms of latencies in ns (NaN when there are none).
pub fn p999_ms(lat: Vec<u64>) -> f64 {
    noisy::p999_ns(lat).map_or(f64::NAN, |p| p as f64 / 1e6)
}

/// Runs `scenario` in `mode` as [`run_once`] does, again (up to [`SLOW_RUNS`] times in all,
/// after the disk settles) when the reader alone was already slow before the aggressor
/// started (p99.9 over [`SOLO_SHARE`] of its target): that run would judge the disk's slow
/// spell, not the control. Seen in CI after the earlier tests' writes: 20-47 ms for a
/// reader alone for 20 s.
pub fn run(
    scratch: &Scratch,
    files: &Files,
    dev: &str,
    scenario: &Scenario,
    mode: &Mode,
) -> Result<Outcome, String> {
    again_while_slow(
        mode,
        (&files.reader, scenario.slo_ms()),
        || run_once(scratch, files, dev, scenario, mode),
        |o| o.solo_p999_ms,
    )
}

/// How many runs [`again_while_slow`] makes, at most, on a disk slow for the reader alone.
const SLOW_RUNS: usize = 5;

/// The reader alone's p99.9 over the solo phase, at most, as a share of its target, for a
/// run to judge the control. It was half: on the test disk the reader alone's p99.9 over
/// a few seconds moves between 0.4 and 2.7 ms within the hour with nothing else running
/// (2026-12-06, 20:05 and 20:20), and against the random-read scenario's 3.7 ms target five
/// runs in a row came at 1.86-2.73 ms, each after three 1 s probes in a row within half.
/// The agent's cycles and the client are still judged against the whole target.
const SOLO_SHARE: f64 = 0.75;

/// Runs `run` up to [`SLOW_RUNS`] times until the reader of `reader_file` alone had a
/// p99.9 (`solo_ms` of the run) within [`SOLO_SHARE`] of its `slo_ms`. Between runs it
/// waits until three 1 s probes in a row of the reader alone are within that share (for at
/// most 3 minutes).
pub fn again_while_slow<T>(
    mode: &Mode,
    (reader_file, slo_ms): (&Path, f64),
    mut run: impl FnMut() -> Result<T, String>,
    solo_ms: impl Fn(&T) -> f64,
) -> Result<T, String> {
    let mut slow = vec![];
    let bar_ms = slo_ms * SOLO_SHARE;
    for _ in 0..SLOW_RUNS {
        let o = run()?;
        let solo = solo_ms(&o);
        if solo <= bar_ms {
            return Ok(o);
        }
        println!(
            "{}: the reader alone had a p99.9 of {solo:.2} ms before the aggressor started, over {bar_ms:.2} ms: the disk is in a slow spell; again once it settles",
            mode.label(),
        );
        slow.push(solo);
        noisy::wait_for_reader_alone_under(reader_file, (bar_ms * 1e6) as u64, 3, 180);
    }
    Err(format!(
        "{}: the reader alone was slow before the aggressor started in {SLOW_RUNS} runs (p99.9 {slow:.2?} ms, target {slo_ms:.2} ms): the disk never settled",
        mode.label(),
    ))
}

/// Runs `scenario` once in `mode` (an agent of its own, cgroups of its own), on `dev`.
pub fn run_once(
    scratch: &Scratch,
    files: &Files,
    dev: &str,
    scenario: &Scenario,
    mode: &Mode,
) -> Result<Outcome, String> {
    if let Mode::Weights(..) = mode {
        return Err(format!(
            "{}: weights are measured in the v2 guest (vm-writer); this host's v1 weights need BFQ on its system disk (benches/scripts/bfq-vs-cap.sh)",
            mode.label()
        ));
    }
    let db = TestCgroup::new("iso-sc-db");
    let backup = TestCgroup::new("iso-sc-backup");
    let config = scratch.path("scenario.toml");
    std::fs::write(&config, noisy::config_us(&db, &backup, scenario.slo_us))
        .map_err(|e| format!("{}: {e}", config.display()))?;
    let a = scenario.aggressor;
    let cap_mbps = mode.single_aggressor_cap()?;
    if let Some(mbps) = cap_mbps {
        set_cap(&backup, a, dev, mbps * 1_000_000)?;
    }
    let journal = scratch.path("journal");
    let args = mode.agent_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut agent = Agent::start_controlling_as(mode.agent_binary()?, &config, &journal, &args)?;
    let aggressor_file = files.aggressor(a)?;
    let lat_log = scratch.path("reader");
    let on_total = scenario.on_s * u64::from(scenario.times)
        + scenario.off_s * u64::from(scenario.times.saturating_sub(1));
    // Pages for the writer only: the scan's buffers are 4 KiB and need none.
    let buffers = noisy::WriterBuffers::reserve(u64::from(a == Aggressor::Writer))?;
    let t0 = Instant::now();
    let mut reader =
        db.spawn(&a.reader_command(&files.reader, scenario.solo_s + on_total + 2, &lat_log));
    std::thread::sleep(Duration::from_secs(scenario.solo_s));
    let mut phases_ms = vec![];
    let mut aggressor_ok = true;
    for i in 0..scenario.times {
        if i > 0 {
            std::thread::sleep(Duration::from_secs(scenario.off_s));
        }
        let start = t0.elapsed().as_millis() as u64;
        let mut child = backup.spawn(&a.command(aggressor_file, scenario.on_s, &buffers));
        aggressor_ok &= child.wait().is_ok_and(|s| s.success());
        phases_ms.push((start, t0.elapsed().as_millis() as u64));
    }
    let reader_ok = reader.wait().is_ok_and(|s| s.success());
    agent.wait_cycles(1);
    let (status, stderr) = agent.stop();
    if cap_mbps.is_some() {
        set_cap(&backup, a, dev, 0)?;
    }
    if !aggressor_ok || !reader_ok {
        return Err(format!("{}: fio failed", mode.label()));
    }
    if !status.success() {
        return Err(format!("{}: agent failed: {stderr}", mode.label()));
    }
    let events = agent.events();
    let lat = noisy::read_clat_log(&lat_log)?;
    Ok(judged(mode, scenario, &events, &lat, &phases_ms))
}

/// The run's [`Outcome`]: per cycle from the agent's `events`, and the reader's p99.9 alone
/// and in the steady phases from its own log `lat` (ms after the reader started, latency
/// ns), given when the aggressor's phases ran (`phases_ms`, on the log's clock).
pub(crate) fn judged(
    mode: &Mode,
    scenario: &Scenario,
    events: &[Value],
    lat: &[(u64, u64)],
    phases_ms: &[(u64, u64)],
) -> Outcome {
    let solo_from_ms = 2000; // the reader's first second is its start-up
    let solo_until_ms = phases_ms.first().map_or(u64::MAX, |p| p.0);
    let solo = lat
        .iter()
        .filter(|(t, _)| (solo_from_ms..solo_until_ms).contains(t))
        .map(|&(_, v)| v)
        .collect();
    let steady_client = lat
        .iter()
        .filter(|(t, _)| {
            phases_ms
                .iter()
                .any(|&(s, e)| (s + (STEADY_AFTER_CYCLES + 1) * 1000..e).contains(t))
        })
        .map(|&(_, v)| v)
        .collect();
    let mut o = outcome(mode.clone(), scenario, events);
    o.solo_p999_ms = p999_ms(solo);
    o.solo_second_p999_ms = median_second_p999_ms(lat, solo_from_ms, solo_until_ms);
    o.steady_client_p999_ms = p999_ms(steady_client);
    let windows = client_windows(lat, phases_ms);
    o.steady_client_windows = windows.len();
    o.steady_client_violations = windows.iter().filter(|&&p| p > scenario.slo_ms()).count();
    o
}

/// The p99.9 (ms) of each one-second window of the steady phases in the reader's log `lat`
/// (ms after the reader started, latency ns), phases as in [`judged`]; windows without a
/// sample are left out.
fn client_windows(lat: &[(u64, u64)], phases_ms: &[(u64, u64)]) -> Vec<f64> {
    phases_ms
        .iter()
        .flat_map(|&(start, end)| {
            second_windows(lat, start + (STEADY_AFTER_CYCLES + 1) * 1000, end)
        })
        .collect()
}

/// The median of [`second_windows`] (NaN: none).
fn median_second_p999_ms(lat: &[(u64, u64)], from_ms: u64, until_ms: u64) -> f64 {
    let mut seconds = second_windows(lat, from_ms, until_ms);
    seconds.sort_by(f64::total_cmp);
    seconds.get(seconds.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The p99.9 (ms) of each whole one-second window of `lat` from `from_ms` up to `until_ms`;
/// windows without a sample are left out.
fn second_windows(lat: &[(u64, u64)], from_ms: u64, until_ms: u64) -> Vec<f64> {
    let mut out = vec![];
    let mut from = from_ms;
    while from.saturating_add(1000) <= until_ms {
        let window: Vec<u64> = lat
            .iter()
            .filter(|(t, _)| (from..from + 1000).contains(t))
            .map(|&(_, v)| v)
            .collect();
        if !window.is_empty() {
            out.push(p999_ms(window));
        }
        from += 1000;
    }
    out
}

/// The aggressor `backup`'s phases as the agent saw them in `events`: runs of cycles
/// with its I/O of kind `a` (first, last).
pub fn aggressor_phases(events: &[Value], a: Aggressor) -> Vec<(u64, u64)> {
    let mut phases: Vec<(u64, u64)> = vec![];
    for e in noisy::service_stats(events, "backup") {
        if a.mbps(e) <= 1.0 {
            continue;
        }
        let c = e["cycle"].as_u64().unwrap_or(0);
        match phases.last_mut() {
            Some((_, last)) if c <= *last + 2 => *last = c,
            _ => phases.push((c, c)),
        }
    }
    phases
}

/// The steady cycles of `phases`: from the [`STEADY_AFTER_CYCLES`]-th full cycle of each
/// on, full cycles only (a phase's first and last cycles are partial).
pub fn steady_cycles(phases: &[(u64, u64)]) -> Vec<u64> {
    phases
        .iter()
        .flat_map(|&(s, e)| s + 1 + STEADY_AFTER_CYCLES..e)
        .collect()
}

/// The per-cycle verdict from the agent's own records (`db` the victim, `backup` the
/// aggressor); the client's p99.9s are left NaN for the caller's client log to fill.
pub fn outcome(mode: Mode, scenario: &Scenario, events: &[Value]) -> Outcome {
    let a = scenario.aggressor;
    let stats = |name: &str| noisy::service_stats(events, name);
    let cycle = |e: &Value| e["cycle"].as_u64().unwrap_or(0);
    let (db, backup) = (stats("db"), stats("backup"));
    let phases = aggressor_phases(events, a);
    let db_at = |c: u64| db.iter().find(|e| cycle(e) == c);
    let violating = |c: u64| db_at(c).is_some_and(|e| e["state"] == "violating");
    let p999 = |e: &Value| e["p999_ns"].as_f64().unwrap_or(0.0) / 1e6;
    let (first, last) = (
        phases.first().map_or(0, |p| p.0),
        phases.last().map_or(0, |p| p.1),
    );
    let steady = steady_cycles(&phases);
    // Only a policy's decisions change caps (the others run the agent with --dry-run).
    let writes = matches!(mode, Mode::Policy(_));
    let decision_cycles: Vec<u64> = events
        .iter()
        .filter(|e| writes && e["type"] == "decision" && e["service"] == "backup")
        .map(&cycle)
        .collect();
    // Whether the agent recorded the aggressor without any limit in cycle c (a cycle
    // without its record says nothing).
    let unlimited_at = |c: u64| {
        backup.iter().find(|e| cycle(e) == c).is_some_and(|e| {
            e["limit"]
                .as_object()
                .is_some_and(|m| m.values().all(Value::is_null))
        })
    };
    let rate_at = |c: u64| {
        backup
            .iter()
            .find(|e| cycle(e) == c)
            .map_or(0.0, |e| a.mbps(e))
    };
    Outcome {
        slo_us: scenario.slo_us,
        p999_ms: (first..=last).filter_map(db_at).map(|e| p999(e)).collect(),
        // From the phase's first violating cycle (its first cycle is partial and may pass)
        // to the next cycle within the SLO.
        cycles_to_slo: phases
            .iter()
            .map(|&(s, e)| match (s..=e).find(|&c| violating(c)) {
                None => Some(0),
                Some(f) => (f + 1..=e).find(|&c| !violating(c)).map(|c| c - f),
            })
            .collect(),
        hurt: phases
            .iter()
            .map(|&(s, _)| (s..s + 5).any(violating))
            .collect(),
        cycles_to_lift: phases
            .windows(2)
            .map(|w| {
                let (quiet, back) = (w[0].1 + 1, w[1].0);
                (quiet..back).find(|&c| unlimited_at(c)).map(|c| c - quiet)
            })
            .collect(),
        steady: SteadyBudget::of(&steady, violating, &decision_cycles),
        solo_p999_ms: f64::NAN,
        solo_second_p999_ms: f64::NAN,
        steady_client_p999_ms: f64::NAN,
        steady_client_windows: 0,
        steady_client_violations: 0,
        aggressor_steady_mbps: steady.iter().map(|&c| rate_at(c)).sum::<f64>()
            / steady.len().max(1) as f64,
        aggressor_total_mb: (first..=last).map(rate_at).sum(),
        events: events.to_vec(),
        mode,
    }
}

/// What the budgets count over a run's steady cycles.
#[derive(Debug, Clone, Copy)]
pub struct SteadyBudget {
    pub cycles: usize,
    /// Steady cycles with an SLO violated.
    pub violating: usize,
    /// Steady cycles with a cap change on an aggressor.
    pub changes: usize,
    /// The most of those in any ten consecutive steady cycles ([`most_in_any_ten`]).
    pub most_changes_in_ten: usize,
}

impl SteadyBudget {
    /// The budgets of the `steady` cycles (ascending), given which violated and the cycles
    /// with a change.
    pub fn of(steady: &[u64], violating: impl Fn(u64) -> bool, changes: &[u64]) -> Self {
        SteadyBudget {
            cycles: steady.len(),
            violating: steady.iter().filter(|&&c| violating(c)).count(),
            changes: steady.iter().filter(|c| changes.contains(c)).count(),
            most_changes_in_ten: most_in_any_ten(steady, changes),
        }
    }
    /// resctl-bench's isolation: the share of steady cycles within every SLO.
    pub fn isolation(&self) -> f64 {
        1.0 - self.violating as f64 / self.cycles.max(1) as f64
    }
}

/// The most of `marked` in any ten consecutive cycles of `cycles` (ascending): "at most
/// once per ten cycles" read as a rate limit, next to the ratio over a whole phase.
pub fn most_in_any_ten(cycles: &[u64], marked: &[u64]) -> usize {
    cycles
        .windows(10.min(cycles.len()).max(1))
        .map(|w| w.iter().filter(|c| marked.contains(c)).count())
        .max()
        .unwrap_or(0)
}

// The control tests' verdict (issue 17): `adaptive` keeps the SLO and leaves no third of
// the disk idle, against a static cap measured in the same test.

/// At most one violating steady cycle in this many, for `adaptive` and the static cap alike.
pub const KEEPS_ONE_IN: usize = 5;

/// Rounds of (adaptive, static cap) in each test, alternated: the disk drifts within
/// minutes (seen: a writer's knee at ~480 MB/s, then ~290 MB/s 20 s later), so one static
/// run after one adaptive run judged the disk as much as the control. Three, not two: with
/// two, one round in a slow spell (the scan's cap cut to 96 MB/s while the disk stalled at
/// 10 ms at every cap) decided the pooled verdict.
pub const ROUNDS: usize = 3;

/// The static cap each round compares against, as a multiple of `adaptive`'s rate: a floor
/// of two thirds of the rate at which a static cap isolates as well. It catches the defect
/// the issue measured (47 % of the best static cap). At 1.25x (a floor of 80 %) one of the
/// three scenarios failed it in 2 of 3 runs on the test disk (a tie in violating cycles, or
/// one round in a slow spell), where the benchmark puts `adaptive` at 82-117 % of the best
/// static cap. The 90 % target is the benchmark's (median of 3, in BENCHMARKS.md),
/// not this test's.
pub const ABOVE: f64 = 1.5;

/// Whether the runs together kept the SLO: the client's p99.9 over each run's steady phase within
/// it, and at most one violating cycle in [`KEEPS_ONE_IN`] over all their steady cycles
/// (pooled: 20 cycles of one run are a small sample of a one-in-ten rate). The seconds of
/// the client's log over the SLO are printed, not judged: a second's p99.9 is its 3rd to
/// 10th slowest read, and on the test machine the guest's own threads on the reader's
/// CPU (kdamond above all; traced, 28 waits of 1-16 ms in 28 s, up to 7 in a second)
/// put seconds over that no I/O limit touches (seen: 7 of 19 seconds over by fio, 1 of
/// 19 cycles by the agent, the whole phase at 1.78 ms; side by side, seconds with 11
/// reads over 3 ms by fio and a block-layer p99.9 of 0.66 ms). Unpinned, the reader also
/// waited for the scan's CPU ([`Aggressor::reader_command`]): 15 of 19 seconds over.
fn kept(runs: &[&Outcome], slo_ms: f64) -> bool {
    let (violations, cycles) = pooled(runs);
    runs.iter().all(|o| o.steady_client_p999_ms <= slo_ms)
        && cycles > 0
        && violations * KEEPS_ONE_IN <= cycles
}

fn pooled(runs: &[&Outcome]) -> (usize, usize) {
    runs.iter().fold((0, 0), |(v, c), o| {
        (v + o.steady.violating, c + o.steady.cycles)
    })
}

fn describe(runs: &[&Outcome]) -> String {
    runs.iter()
        .map(|o| {
            format!(
                "{}: client p99.9 {:.2} ms ({}/{} seconds over), {}/{} violating, aggressor {:.0} MB/s",
                o.mode.label(),
                o.steady_client_p999_ms,
                o.steady_client_violations,
                o.steady_client_windows,
                o.steady.violating,
                o.steady.cycles,
                o.aggressor_steady_mbps
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Runs of `adaptive` one round may take to see its aggressor push the reader over the
/// target in the first phase's first 5 cycles. A run where it did not proves nothing either
/// way: in a fresh-clone suite on e8c7d12 the uncapped writer ran at 4.7-4.9 GB/s for 11
/// cycles with the reader at 3.8-4.8 ms against 5, in one round of three. Such a run is
/// run again, once; a disk that stays that fast fails the test, saying so.
pub const RUNS_TO_HURT: usize = 2;

/// The round's `adaptive` run: the first of [`RUNS_TO_HURT`] whose aggressor hurt the reader.
fn run_until_hurt(run: &mut impl FnMut(Mode) -> Outcome, sc: &Scenario) -> Outcome {
    for attempt in 1..=RUNS_TO_HURT {
        let o = run(Mode::Policy("adaptive".into()));
        if o.hurt.first() == Some(&true) {
            return o;
        }
        println!(
            "run {attempt} of {RUNS_TO_HURT}: the aggressor did not push the reader over its {:.2} ms SLO in its first 5 cycles ({:?}); the run proves nothing",
            sc.slo_ms(),
            o.p999_ms
        );
    }
    panic!(
        "the aggressor never pushed the reader over its {:.2} ms SLO in {RUNS_TO_HURT} runs: the scenario proves nothing on this disk now (its fast minutes; run the test again)",
        sc.slo_ms()
    );
}

/// `rounds` rounds of `adaptive` (in `run`), then a static cap [`ABOVE`] times the rate `adaptive` gave
/// the aggressor in that round. Each adaptive run: the aggressor hurt the reader (a run
/// where it did not is run again, see [`RUNS_TO_HURT`]), and the SLO was back within 3
/// cycles (plus `each`). Over the rounds: `adaptive` kept the SLO as
/// the reader saw it, and the static caps isolated the reader worse than `adaptive` did
/// (else `adaptive` left a third of the disk idle for nothing).
pub fn assert_controlled(
    mut run: impl FnMut(Mode) -> Outcome,
    sc: &Scenario,
    rounds: usize,
    each: impl Fn(&Outcome),
) {
    let mut adaptive = vec![];
    let mut fixed = vec![];
    for _ in 0..rounds {
        let o = run_until_hurt(&mut run, sc);
        assert!(
            o.cycles_to_slo.iter().all(|c| c.is_some_and(|c| c <= 3)),
            "not back within the SLO 3 cycles after the aggressor broke it: {:?} ({:?})",
            o.cycles_to_slo,
            o.p999_ms
        );
        each(&o);
        let above = ((o.aggressor_steady_mbps * ABOVE).ceil() as u64).max(2);
        fixed.push(run(Mode::Static(above)));
        adaptive.push(o);
    }
    let adaptive: Vec<&Outcome> = adaptive.iter().collect();
    let fixed: Vec<&Outcome> = fixed.iter().collect();
    println!("adaptive: {}", describe(&adaptive));
    println!("static {ABOVE}x: {}", describe(&fixed));
    assert!(
        kept(&adaptive, sc.slo_ms()),
        "adaptive did not keep the {:.2} ms SLO in the steady phases (at most 1 violating cycle in {KEEPS_ONE_IN} over the rounds): {}",
        sc.slo_ms(),
        describe(&adaptive)
    );
    // Work conservation as a Pareto test: a static cap that gives the aggressor 50 % more
    // must isolate the reader worse (more violating cycles, or the client's p99.9 over the SLO),
    // or `adaptive` gave that bandwidth away for nothing.
    let (adaptive_violations, _) = pooled(&adaptive);
    let (fixed_violations, _) = pooled(&fixed);
    let fixed_as_good = fixed.iter().all(|o| o.steady_client_p999_ms <= sc.slo_ms())
        && fixed_violations <= adaptive_violations;
    assert!(
        !fixed_as_good,
        "static caps {ABOVE}x the rates adaptive gave the aggressor isolated the reader as well \
         ({fixed_violations} violating cycles against adaptive's {adaptive_violations}, the client within the {:.2} ms SLO): \
         adaptive left over a third of the disk idle. {}",
        sc.slo_ms(),
        describe(&fixed)
    );
}

/// The agent's cycles of a run ([`noisy::print_cycles`]) and its outcome, for a test's
/// output.
pub fn print_cycles(o: &Outcome) {
    noisy::print_cycles(&o.events);
    println!(
        "{}: steady {}/{} violating, {} changes, client p99.9 {:.2} ms (solo {:.2}), aggressor {:.0} MB/s steady, {:.0} MB total, to SLO {:?}, to lift {:?}",
        o.mode.label(),
        o.steady.violating,
        o.steady.cycles,
        o.steady.changes,
        o.steady_client_p999_ms,
        o.solo_p999_ms,
        o.aggressor_steady_mbps,
        o.aggressor_total_mb,
        o.cycles_to_slo,
        o.cycles_to_lift
    );
}

/// Whether the tools the scenarios run are here.
pub fn require_tools() -> Result<(), String> {
    for tool in ["fio", "fallocate", "taskset"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| !o.stdout.is_empty());
        if !found {
            return Err(format!("{tool} not found: run scripts/bootstrap.sh"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(hurt: bool) -> Outcome {
        Outcome {
            mode: Mode::Policy("adaptive".into()),
            slo_us: 5000,
            p999_ms: vec![if hurt { 9.0 } else { 4.0 }],
            cycles_to_slo: vec![Some(1)],
            hurt: vec![hurt],
            cycles_to_lift: vec![],
            steady: SteadyBudget {
                cycles: 0,
                violating: 0,
                changes: 0,
                most_changes_in_ten: 0,
            },
            solo_p999_ms: 0.1,
            solo_second_p999_ms: 0.1,
            steady_client_p999_ms: 1.0,
            steady_client_windows: 0,
            steady_client_violations: 0,
            aggressor_steady_mbps: 0.0,
            aggressor_total_mb: 0.0,
            events: vec![],
        }
    }

    #[test]
    fn a_run_whose_aggressor_did_not_hurt_is_run_again_and_a_second_fails() {
        let sc = Scenario::new(Aggressor::Writer, 5, 60);
        let mut hurts = [false, true].into_iter();
        let mut runs = 0;
        let o = run_until_hurt(
            &mut |_| {
                runs += 1;
                outcome(hurts.next().unwrap())
            },
            &sc,
        );
        assert!(o.hurt[0]);
        assert_eq!(runs, 2);
        let never = std::panic::catch_unwind(|| run_until_hurt(&mut |_| outcome(false), &sc));
        let message = never.expect_err("a disk that never hurt passed");
        assert!(message
            .downcast_ref::<String>()
            .is_some_and(|m| m.contains("proves nothing on this disk")));
    }

    #[test]
    fn most_in_any_ten_reads_the_change_budget_as_a_rate_limit() {
        let steady: Vec<u64> = (16..35).collect();
        // Two changes ten cycles apart: never two in one window of ten.
        assert_eq!(most_in_any_ten(&steady, &[16, 26]), 1);
        // Nine apart: both in the window from 17.
        assert_eq!(most_in_any_ten(&steady, &[17, 26]), 2);
        // A change outside the steady cycles does not count.
        assert_eq!(most_in_any_ten(&steady, &[12, 20, 40]), 1);
        assert_eq!(most_in_any_ten(&steady[..3], &[16, 17]), 2);
        assert_eq!(most_in_any_ten(&[], &[1]), 0);
    }

    /// One slow second among the reader's three alone sets the pooled p99.9, not the
    /// median of the seconds' (which the target takes).
    #[test]
    fn one_slow_second_alone_does_not_set_the_seconds_median() {
        let mut lat: Vec<(u64, u64)> = (2000..5000).map(|t| (t, 500_000)).collect();
        lat.extend((0..5).map(|i| (2100 + i, 9_000_000)));
        lat.sort();
        assert_eq!(second_windows(&lat, 2000, 5000), vec![9.0, 0.5, 0.5]);
        assert_eq!(median_second_p999_ms(&lat, 2000, 5000), 0.5);
        let pooled = p999_ms(lat.iter().map(|&(_, v)| v).collect());
        assert!(pooled > 8.0, "{pooled}");
        assert!(median_second_p999_ms(&lat, 2000, 2500).is_nan());
    }

    #[test]
    fn a_calibrated_target_is_under_the_contention_and_over_three_times_alone() {
        // The CI run the fixed 3 ms missed: the scan at 1.5-2.2 ms a cycle, 0.35 alone.
        let ci = [
            1.29, 1.72, 1.65, 1.92, 2.20, 1.62, 1.56, 1.72, 1.65, 1.52, 0.91,
        ];
        // 0.75 x the median, 1.65 ms.
        assert_eq!(slo_us_from(&ci, 0.35), 1240);
        // A reader slow alone: the floor, 3x its p99.9, rounded up to 10 µs.
        assert_eq!(slo_us_from(&ci, 0.501), 1510);
        // No cycles next to the aggressor and no log alone: 0, which the agent's config
        // refuses ("must be greater than zero"), so the run fails saying so.
        assert_eq!(slo_us_from(&[], f64::NAN), 0);
    }

    #[test]
    fn a_target_the_uncapped_aggressor_does_not_break_calls_for_another_calibration() {
        // The CI run: the scan at a median 5.4 ms a cycle, the reader alone at 2.29 ms.
        let ci = [
            4.10, 5.57, 5.44, 5.70, 5.44, 3.96, 7.41, 5.05, 5.31, 4.92, 6.09,
        ];
        let floor = slo_us_from(&ci, 2.29);
        assert_eq!(floor, 6870);
        assert!(!aggressor_breaks(median_cycle_ms(&ci), floor));
        // The same scan next to a reader alone at 1.2 ms: 3.6 ms, broken in most cycles.
        let fast = slo_us_from(&ci, 1.2);
        assert_eq!(fast, 4080);
        assert!(aggressor_breaks(median_cycle_ms(&ci), fast));
    }
}
