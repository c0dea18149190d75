//! Noisy-neighbor control benchmark (root): a 4 KiB QD1 random reader (latency service,
//! p99.9 SLO) and a 1 MiB QD32 O_DIRECT sequential writer (best-effort) in two cgroups on the
//! test disk, run once per mode, all modes in one run:
//!
//! - `none`: the agent observes (`--dry-run`), nothing is limited;
//! - `static N`: the writer capped at N MB/s by hand for the whole run (agent in
//!   `--dry-run`, to measure the same way); the sweep finds the best static cap, the highest
//!   writer rate at which the reader keeps its SLO;
//! - every policy (`pine`, `priority`, `slae`, `ute`, `adaptive`), writing limits.
//!
//! Per-cycle numbers come from the agent's own `service_stats` records, so all modes are
//! measured the same way; the steady phase's p99.9 also comes from fio's own per-I/O log, as
//! the reader saw it. Prints a markdown report.
//!
//!   cargo run --release -p isolator-benches --bin noisy-neighbor -- [--writer-seconds 30]
//!     [--slo-ms 6] [--caps 50,100,150,200,300,400]

use std::{path::Path, process::Command};

use anyhow::{bail, Context, Result};
use isolator::events::{Event, RecordedEvent, ServiceStats};
use isolator_tests::{disk_of, noisy, Agent, Scratch, TestCgroup};

const POLICIES: [&str; 5] = ["pine", "priority", "slae", "ute", "adaptive"];
/// Reader runs alone this long first, so its solo cycles and fio's start-up are behind it.
const SOLO_SECONDS: u64 = 5;
/// Cycles after the writer starts that a controller gets to converge before "steady".
const SETTLE_CYCLES: u64 = 3;

#[derive(Clone, Debug)]
enum Mode {
    None,
    Static(u64),
    Policy(&'static str),
}

impl Mode {
    fn label(&self) -> String {
        match self {
            Mode::None => "no control".into(),
            Mode::Static(m) => format!("static {m} MB/s"),
            Mode::Policy(p) => (*p).into(),
        }
    }
}

/// What one mode's run measured, from the writer's first cycle on.
struct Outcome {
    mode: Mode,
    /// Reader p99.9 of each writer cycle, ms.
    p999_ms: Vec<f64>,
    /// Cycles from the writer's first cycle to the first one within the SLO (None: never).
    cycles_to_slo: Option<u64>,
    /// Violating cycles after the settle period, and how many cycles that period has.
    steady_violations: usize,
    steady_cycles: usize,
    steady_p999_median_ms: f64,
    /// p99.9 of every reader I/O in the steady phase, from fio's per-I/O log.
    fio_steady_p999_ms: f64,
    slo_ms: u64,
    reader_iops: f64,
    writer_mbps_all: f64,
    writer_mbps_steady: f64,
}

/// Writes (or with 0 removes) a write-bandwidth cap on `dev`, in whichever cgroup mode.
fn set_write_cap(cg: &TestCgroup, dev: &str, bytes_per_s: u64) -> Result<()> {
    let (file, line) = if cg.v2 {
        let v = if bytes_per_s == 0 {
            "max".to_string()
        } else {
            bytes_per_s.to_string()
        };
        ("io.max", format!("{dev} wbps={v}"))
    } else {
        (
            "blkio.throttle.write_bps_device",
            format!("{dev} {bytes_per_s}"),
        )
    };
    let path = cg.dir.join(file);
    std::fs::write(&path, line).with_context(|| format!("writing {}", path.display()))
}

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.iter().sum::<f64>() / v.len() as f64
}

struct Setup<'a> {
    scratch: &'a Scratch,
    rfile: &'a Path,
    wfile: &'a Path,
    dev: &'a str,
    slo_ms: u64,
    writer_seconds: u64,
    /// Where each mode's event stream is kept (`--events-dir`), if anywhere.
    events_dir: Option<&'a Path>,
}

fn run_mode(s: &Setup, mode: Mode) -> Result<Outcome> {
    let db = TestCgroup::new("iso-bench-db");
    let backup = TestCgroup::new("iso-bench-backup");
    let config = s.scratch.path("bench.toml");
    std::fs::write(&config, noisy::config(&db, &backup, s.slo_ms))?;
    if let Mode::Static(mbps) = mode {
        set_write_cap(&backup, s.dev, mbps * 1_000_000)?;
    }
    let journal = s.scratch.path("journal");
    let policy = match mode {
        Mode::Policy(p) => p,
        _ => "adaptive",
    };
    let mut args = vec!["--policy", policy];
    if !matches!(mode, Mode::Policy(_)) {
        args.push("--dry-run");
    }
    let mut agent = Agent::start_controlling(&config, &journal, &args);
    let run = noisy::run_pair(
        s.scratch,
        (&db, &backup),
        (s.rfile, s.wfile),
        SOLO_SECONDS,
        s.writer_seconds,
    );
    agent.wait_cycles(1);
    let (status, stderr) = agent.stop();
    if let Mode::Static(_) = mode {
        set_write_cap(&backup, s.dev, 0)?;
    }
    if !run.writer_ok || !run.reader_ok {
        bail!("{}: fio failed", mode.label());
    }
    if !status.success() {
        bail!("{}: agent failed: {stderr}", mode.label());
    }
    if let Some(dir) = s.events_dir {
        let name = mode.label().replace([' ', '/'], "-");
        std::fs::copy(&agent.events, dir.join(format!("{name}.ndjson")))
            .with_context(|| format!("keeping events in {}", dir.display()))?;
    }
    // About the cycles' steady phase: from (SETTLE_CYCLES + 2) s after the writer started.
    let (fio_p999_ns, _) = run.reader_p999_ns((SETTLE_CYCLES + 2) * 1000);
    let mut o = outcome(mode, &service_stats(&agent.events)?);
    o.fio_steady_p999_ms = fio_p999_ns as f64 / 1e6;
    o.slo_ms = s.slo_ms;
    Ok(o)
}

/// The services' cycles of a run, read in the agent's own event types.
fn service_stats(events_file: &Path) -> Result<Vec<ServiceStats>> {
    let text = std::fs::read_to_string(events_file)
        .with_context(|| format!("reading {}", events_file.display()))?;
    let mut out = vec![];
    // A line the agent was still writing when it was read is not complete.
    for line in text.lines().filter(|l| l.ends_with('}')) {
        let e = RecordedEvent::parse(line)
            .with_context(|| format!("{}: {line:.80}", events_file.display()))?;
        if let Event::ServiceStats(s) = e.event {
            out.push(s);
        }
    }
    Ok(out)
}

fn outcome(mode: Mode, events: &[ServiceStats]) -> Outcome {
    let stats = |name: &str| -> Vec<&ServiceStats> {
        events.iter().filter(|e| e.service == name).collect()
    };
    let cycle = |e: &&ServiceStats| e.cycle;
    let (db, backup) = (stats("db"), stats("backup"));
    // The writer's cycles: any write at all (a deep cap still writes at its floor).
    let writing: Vec<u64> = backup
        .iter()
        .filter(|e| e.write_mbps > 1.0)
        .map(cycle)
        .collect();
    let (first, last) = (
        writing.first().copied().unwrap_or(0),
        writing.last().copied().unwrap_or(0),
    );
    let db_at = |c: u64| db.iter().find(|e| e.cycle == c);
    let p999_ms = |e: &&ServiceStats| e.p999_ns.unwrap_or(0) as f64 / 1e6;
    let violating = |c: u64| db_at(c).is_some_and(|e| e.state == "violating");
    let writer_mbps = |range: std::ops::Range<u64>| -> f64 {
        mean(
            &backup
                .iter()
                .filter(|e| range.contains(&e.cycle))
                .map(|e| e.write_mbps)
                .collect::<Vec<_>>(),
        )
    };
    // Full cycles only: the first and last writer cycles are partial.
    let steady = first + 1 + SETTLE_CYCLES..last;
    let mut steady_p999: Vec<f64> = steady.clone().filter_map(db_at).map(p999_ms).collect();
    Outcome {
        p999_ms: (first..=last).filter_map(db_at).map(p999_ms).collect(),
        cycles_to_slo: (first..=last).find(|&c| !violating(c)).map(|c| c - first),
        steady_violations: steady.clone().filter(|&c| violating(c)).count(),
        steady_cycles: steady.clone().count(),
        steady_p999_median_ms: median(&mut steady_p999),
        fio_steady_p999_ms: f64::NAN,
        slo_ms: 0,
        reader_iops: mean(
            &(first + 1..last)
                .filter_map(db_at)
                .map(|e| e.iops)
                .collect::<Vec<_>>(),
        ),
        writer_mbps_all: writer_mbps(first + 1..last),
        writer_mbps_steady: writer_mbps(steady),
        mode,
    }
}

impl Outcome {
    /// Whether the reader kept its SLO in the steady phase, as the control test judges it:
    /// fio's p99.9 over the phase within the SLO, and at most one violating cycle in five.
    fn keeps_slo(&self) -> bool {
        self.steady_cycles > 0
            && self.fio_steady_p999_ms <= self.slo_ms as f64
            && self.steady_violations * 5 <= self.steady_cycles
    }
}

fn main() -> std::process::ExitCode {
    // One line, no backtrace, whatever RUST_BACKTRACE says: these are usage and set-up errors.
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("noisy-neighbor: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let mut writer_seconds = 30;
    let mut slo_ms = 6;
    let mut caps: Vec<u64> = vec![50, 100, 150, 200, 300, 400];
    let mut only: Option<Vec<String>> = None;
    let mut events_dir: Option<std::path::PathBuf> = None;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().context("missing value");
        match a.as_str() {
            "--writer-seconds" => writer_seconds = val()?.parse()?,
            "--slo-ms" => slo_ms = val()?.parse()?,
            "--modes" => only = Some(val()?.split(',').map(str::to_string).collect()),
            "--events-dir" => events_dir = Some(val()?.into()),
            "--caps" => {
                caps = val()?
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<_, _>>()
                    .context("--caps: comma-separated MB/s values")?
            }
            _ => bail!(
                "usage: noisy-neighbor [--writer-seconds N] [--slo-ms N] [--caps 25,50,...] \
                 [--modes none,static,pine,priority,slae,ute,adaptive] [--events-dir DIR]"
            ),
        }
    }
    if let Some(o) = &only {
        for m in o {
            if m != "none" && m != "static" && !POLICIES.contains(&m.as_str()) {
                bail!("--modes: unknown mode {m}; use none, static or a policy name");
            }
        }
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the benchmark loads eBPF and writes cgroup limits: run it as root");
    }
    for tool in ["fio", "fallocate"] {
        if Command::new("sh")
            .arg("-c")
            .arg(format!("command -v {tool}"))
            .output()?
            .stdout
            .is_empty()
        {
            bail!("{tool} not found: run scripts/bootstrap.sh");
        }
    }
    let scratch = Scratch::new();
    let (rfile, wfile) = noisy::files(&scratch);
    let dev = disk_of(&scratch.dir);
    let setup = Setup {
        scratch: &scratch,
        rfile: &rfile,
        wfile: &wfile,
        dev: &dev,
        slo_ms,
        writer_seconds,
        events_dir: events_dir.as_deref(),
    };
    if let Some(dir) = &events_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }

    let wanted = |name: &str| only.as_ref().is_none_or(|o| o.iter().any(|m| m == name));
    let mut modes = vec![];
    if wanted("none") {
        modes.push(Mode::None);
    }
    if wanted("static") {
        modes.extend(caps.iter().map(|&c| Mode::Static(c)));
    }
    modes.extend(
        POLICIES
            .iter()
            .filter(|p| wanted(p))
            .map(|&p| Mode::Policy(p)),
    );
    let mut outcomes = Vec::new();
    for m in modes {
        eprintln!("running {}", m.label());
        let o = run_mode(&setup, m)?;
        eprintln!(
            "  p99.9 ms {:?}; writer {:.0} MB/s steady",
            o.p999_ms
                .iter()
                .map(|v| (v * 10.0).round() / 10.0)
                .collect::<Vec<_>>(),
            o.writer_mbps_steady
        );
        outcomes.push(o);
    }
    report(&outcomes, slo_ms, &dev, writer_seconds);
    Ok(())
}

fn report(outcomes: &[Outcome], slo_ms: u64, dev: &str, writer_seconds: u64) {
    let best_static = outcomes
        .iter()
        .filter(|o| matches!(o.mode, Mode::Static(_)) && o.keeps_slo())
        .max_by(|a, b| a.writer_mbps_steady.total_cmp(&b.writer_mbps_steady));
    let none = outcomes.iter().find(|o| matches!(o.mode, Mode::None));
    println!(
        "Disk {dev}, reader SLO p99.9 <= {slo_ms} ms, writer runs {writer_seconds} s, 1 s cycles; \
         steady = from the {}th full writer cycle on.",
        SETTLE_CYCLES + 1
    );
    println!();
    println!(
        "| mode | reader p99.9 per cycle (ms) | cycles to SLO | steady violations | steady p99.9 (median) | vs no control | steady p99.9 by fio | reader IOPS | writer MB/s (all / steady) | writer share of best static |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for o in outcomes {
        let per_cycle: Vec<String> = o.p999_ms.iter().map(|v| format!("{v:.1}")).collect();
        let vs_none = none.map_or(String::from("-"), |n| {
            format!(
                "{:+.0} %",
                100.0 * (o.steady_p999_median_ms / n.steady_p999_median_ms - 1.0)
            )
        });
        let share = best_static.map_or(String::from("-"), |b| {
            format!(
                "{:.0} %",
                100.0 * o.writer_mbps_steady / b.writer_mbps_steady
            )
        });
        println!(
            "| {} | {} | {} | {}/{} | {:.2} ms | {} | {:.2} ms | {:.0} | {:.0} / {:.0} | {} |",
            o.mode.label(),
            per_cycle.join(" "),
            o.cycles_to_slo.map_or("never".into(), |c| c.to_string()),
            o.steady_violations,
            o.steady_cycles,
            o.steady_p999_median_ms,
            vs_none,
            o.fio_steady_p999_ms,
            o.reader_iops,
            o.writer_mbps_all,
            o.writer_mbps_steady,
            share
        );
    }
    println!();
    match best_static {
        Some(b) => println!(
            "Best static cap: {} (the highest writer rate whose steady phase kept the SLO: fio's p99.9 within it, at most 1 violating cycle in 5).",
            b.mode.label()
        ),
        None => println!("No static cap of the sweep kept the SLO."),
    }
}
