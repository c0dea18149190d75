//! Paper 001's mix on the real disk (issue 17, scenario 3): two latency services with
//! different SLOs and two throughput services, one with a rate target, all at once.
//!
//! - `db`: 4 KiB QD1 random reads, latency, the tighter SLO;
//! - `cache`: 4 KiB QD4 random reads of the same file, latency, a looser SLO;
//! - `ingest`: 1 MiB QD32 O_DIRECT sequential writes, throughput with a rate target;
//! - `backup`: the same writes to a file of its own, best-effort (20 MB/s floor).
//!
//! The readers run alone for a few seconds, then both writers start together. A static
//! mode caps `ingest` at its rate target and `backup` at the mode's rate, by hand (what an
//! operator would set: the promised rate, and what the disk can spare for the rest), or
//! each writer at a rate of its own (`Mode::StaticPair`: `ingest` above its promise); a run
//! keeps its promises when, over the steady cycles, both readers' p99.9 by
//! fio's own logs is within their SLOs, at most one cycle in ten has a service violating,
//! and `ingest` gets its rate. Work conservation is the two writers' bytes together.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{
    noisy,
    scenario::{self, Aggressor, Mode, SteadyBudget, STEADY_AFTER_CYCLES},
    Agent, Scratch, TestCgroup,
};

/// `ingest`'s rate target.
pub const INGEST_RATE_MBPS: u64 = 100;

/// The mix's targets and timing.
#[derive(Debug, Clone)]
pub struct Mix {
    pub db_slo_ms: u64,
    pub cache_slo_ms: u64,
    pub ingest_rate_mbps: u64,
    /// The readers alone first, this long.
    pub solo_s: u64,
    /// Then the writers, this long.
    pub seconds: u64,
}

impl Mix {
    pub fn new(db_slo_ms: u64, seconds: u64) -> Mix {
        Mix {
            db_slo_ms,
            cache_slo_ms: 2 * db_slo_ms,
            ingest_rate_mbps: INGEST_RATE_MBPS,
            solo_s: 5,
            seconds,
        }
    }

    fn config(&self, cg: &Cgroups) -> String {
        format!(
            "[[service]]\nname = \"db\"\ncgroup = \"{}\"\nclass = \"latency\"\np999 = \"{}ms\"\n\n\
             [[service]]\nname = \"cache\"\ncgroup = \"{}\"\nclass = \"latency\"\np999 = \"{}ms\"\n\n\
             [[service]]\nname = \"ingest\"\ncgroup = \"{}\"\nclass = \"throughput\"\nrate = \"{}MB/s\"\n\n\
             [[service]]\nname = \"backup\"\ncgroup = \"{}\"\nclass = \"best-effort\"\nfloor = \"20MB/s\"\n",
            cg.db.rel_path(),
            self.db_slo_ms,
            cg.cache.rel_path(),
            self.cache_slo_ms,
            cg.ingest.rel_path(),
            self.ingest_rate_mbps,
            cg.backup.rel_path(),
        )
    }
}

struct Cgroups {
    db: TestCgroup,
    cache: TestCgroup,
    ingest: TestCgroup,
    backup: TestCgroup,
}

/// The mix's files: the readers' (shared), and one per writer.
pub struct MixFiles {
    reader: PathBuf,
    ingest: PathBuf,
    backup: PathBuf,
}

impl MixFiles {
    pub fn new(scratch: &Scratch) -> MixFiles {
        let (reader, backup) = noisy::files(scratch);
        let ingest = scratch.path("w-ingest.dat");
        crate::run_ok(
            std::process::Command::new("fallocate")
                .arg("-l")
                .arg("4G")
                .arg(&ingest),
        );
        MixFiles {
            reader,
            ingest,
            backup,
        }
    }
}

/// One latency service's verdict over the steady cycles.
#[derive(Debug, Clone)]
pub struct Reader {
    pub slo_ms: u64,
    pub steady_violations: usize,
    /// p99.9 from fio's log: alone, and over the steady cycles.
    pub solo_p999_ms: f64,
    pub steady_p999_ms: f64,
    /// Cycles from its first violating cycle after the writers start to the next within
    /// its SLO, as in [`scenario::Outcome`] (0: it never violated; None: never back).
    pub cycles_to_slo: Option<u64>,
}

/// What one run of the mix measured.
#[derive(Debug, Clone)]
pub struct MixOutcome {
    pub mode: Mode,
    pub db: Reader,
    pub cache: Reader,
    /// The steady cycles' budgets: violating is any service (a reader over its SLO, or
    /// `ingest` backlogged under its rate), changes are decisions on either writer.
    pub steady: SteadyBudget,
    pub ingest_rate_mbps: u64,
    pub ingest_steady_mbps: f64,
    pub backup_steady_mbps: f64,
    pub events: Vec<Value>,
}

impl MixOutcome {
    /// Every promise kept in the steady cycles: both readers within their SLOs by fio,
    /// at most one violating cycle in ten, `ingest` at its rate (5 % for measurement).
    pub fn keeps_slos(&self) -> bool {
        self.steady.cycles > 0
            && self.steady.violating * 10 <= self.steady.cycles
            && self.keeps_client_bars()
    }
    /// [`MixOutcome::keeps_slos`]'s bars other than the agent's cycles: both readers within
    /// their SLOs by fio, `ingest` at its rate (5 % for measurement).
    pub fn keeps_client_bars(&self) -> bool {
        self.db.steady_p999_ms <= self.db.slo_ms as f64
            && self.cache.steady_p999_ms <= self.cache.slo_ms as f64
            && self.ingest_steady_mbps >= self.ingest_rate_mbps as f64 * 0.95
    }
    /// Both writers' MB/s together over the steady cycles.
    pub fn writers_mbps(&self) -> f64 {
        self.ingest_steady_mbps + self.backup_steady_mbps
    }
    /// resctl-bench's isolation: the share of steady cycles with no service violating.
    pub fn isolation(&self) -> f64 {
        self.steady.isolation()
    }
}

fn cache_reader(file: &Path, runtime_s: u64, prefix: &Path) -> String {
    format!(
        "fio --name=c --filename={} --rw=randread --bs=4k --direct=1 --ioengine=libaio \
         --iodepth=4 --time_based --runtime={runtime_s} --output=/dev/null \
         --write_lat_log={} --log_avg_msec=0",
        file.display(),
        prefix.display()
    )
}

/// Runs the mix in `mode`, again (after the disk settles) when `db` alone was already slow
/// before the writers started: that run would judge a slow spell of the disk, not the
/// control (see [`scenario::again_while_slow`]).
pub fn run(
    scratch: &Scratch,
    files: &MixFiles,
    dev: &str,
    mix: &Mix,
    mode: &Mode,
) -> Result<MixOutcome, String> {
    scenario::again_while_slow(
        mode,
        (&files.reader, mix.db_slo_ms as f64),
        || run_once(scratch, files, dev, mix, mode),
        |o| o.db.solo_p999_ms,
    )
}

fn run_once(
    scratch: &Scratch,
    files: &MixFiles,
    dev: &str,
    mix: &Mix,
    mode: &Mode,
) -> Result<MixOutcome, String> {
    if let Mode::Weights(..) = mode {
        return Err(format!(
            "{}: the paper mix runs on this host, whose v1 weights need BFQ on its system disk",
            mode.label()
        ));
    }
    let cg = Cgroups {
        db: TestCgroup::new("iso-mix-db"),
        cache: TestCgroup::new("iso-mix-cache"),
        ingest: TestCgroup::new("iso-mix-ingest"),
        backup: TestCgroup::new("iso-mix-backup"),
    };
    let config = scratch.path("mix.toml");
    std::fs::write(&config, mix.config(&cg)).map_err(|e| format!("{}: {e}", config.display()))?;
    let static_caps_mbps = match *mode {
        Mode::Static(backup) => Some((mix.ingest_rate_mbps, backup)),
        Mode::StaticPair(ingest, backup) => Some((ingest, backup)),
        _ => None,
    };
    if let Some((ingest, backup)) = static_caps_mbps {
        scenario::set_cap(&cg.ingest, Aggressor::Writer, dev, ingest * 1_000_000)?;
        scenario::set_cap(&cg.backup, Aggressor::Writer, dev, backup * 1_000_000)?;
    }
    let journal = scratch.path("journal");
    let args = mode.agent_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut agent = Agent::start_controlling_as(mode.agent_binary()?, &config, &journal, &args)?;
    let (db_log, cache_log) = (scratch.path("mix-db"), scratch.path("mix-cache"));
    let readers_s = mix.solo_s + mix.seconds + 2;
    let t0 = Instant::now();
    let mut readers = [
        cg.db
            .spawn(&noisy::reader(&files.reader, readers_s, &db_log)),
        cg.cache
            .spawn(&cache_reader(&files.reader, readers_s, &cache_log)),
    ];
    std::thread::sleep(Duration::from_secs(mix.solo_s));
    let start_ms = t0.elapsed().as_millis() as u64;
    let buffers = noisy::WriterBuffers::reserve(2)?;
    let ingest = cg
        .ingest
        .spawn(&noisy::writer(&files.ingest, mix.seconds, &buffers));
    // About half a throttle slice (100 ms here) apart: under static caps each writer's slice
    // starts with its first bio, and two started in one instant run in phase, their bios
    // interleaved and unmerged (2.2x the requests for the same bytes; see the enforcer's
    // `slice_phase`), which set the best static cap by luck (BENCHMARKS run CC: static
    // 150 MB/s at 71 requests/s in two repeats, 189 in the third, which broke). Apart at
    // spawn is not always apart at the first bio (fio's start-up varies): run CD still saw
    // three static runs of twelve locked.
    std::thread::sleep(Duration::from_millis(50));
    let backup = cg
        .backup
        .spawn(&noisy::writer(&files.backup, mix.seconds, &buffers));
    let mut writers = [ingest, backup];
    let writers_ok = writers
        .iter_mut()
        .all(|w| w.wait().is_ok_and(|s| s.success()));
    let end_ms = t0.elapsed().as_millis() as u64;
    let readers_ok = readers
        .iter_mut()
        .all(|r| r.wait().is_ok_and(|s| s.success()));
    agent.wait_cycles(1);
    let (status, stderr) = agent.stop();
    if static_caps_mbps.is_some() {
        for w in [&cg.ingest, &cg.backup] {
            scenario::set_cap(w, Aggressor::Writer, dev, 0)?;
        }
    }
    if !writers_ok || !readers_ok {
        return Err(format!("{}: fio failed", mode.label()));
    }
    if !status.success() {
        return Err(format!("{}: agent failed: {stderr}", mode.label()));
    }
    let events = agent.events();
    let steady_from_ms = start_ms + (STEADY_AFTER_CYCLES + 1) * 1000;
    let fio_p999 = |log: &Path, from: u64, to: u64| -> Result<f64, String> {
        let lat = noisy::read_clat_log(log)?
            .into_iter()
            .filter(|(t, _)| (from..to).contains(t))
            .map(|(_, v)| v)
            .collect();
        Ok(scenario::p999_ms(lat))
    };
    // fio's first second is its start-up.
    let solo = |log: &Path| fio_p999(log, 2000, start_ms);
    let steady = |log: &Path| fio_p999(log, steady_from_ms, end_ms);
    let mut o = outcome(mode.clone(), mix, &events);
    o.db.solo_p999_ms = solo(&db_log)?;
    o.db.steady_p999_ms = steady(&db_log)?;
    o.cache.solo_p999_ms = solo(&cache_log)?;
    o.cache.steady_p999_ms = steady(&cache_log)?;
    Ok(o)
}

/// The per-cycle verdict from the agent's own records.
fn outcome(mode: Mode, mix: &Mix, events: &[Value]) -> MixOutcome {
    let cycle = |e: &Value| e["cycle"].as_u64().unwrap_or(0);
    let stats = |name: &str| noisy::service_stats(events, name);
    let (db, cache, ingest, backup) = (
        stats("db"),
        stats("cache"),
        stats("ingest"),
        stats("backup"),
    );
    let write_mbps = |s: &[&Value], c: u64| {
        s.iter()
            .find(|e| cycle(e) == c)
            .map_or(0.0, |e| e["write_mbps"].as_f64().unwrap_or(0.0))
    };
    // The writers' phase as the agent saw it: from the first to the last cycle with their
    // writes; its first and last cycles are partial.
    let busy: Vec<u64> = ingest
        .iter()
        .chain(&backup)
        .filter(|e| e["write_mbps"].as_f64().unwrap_or(0.0) > 1.0)
        .map(|e| cycle(e))
        .collect();
    let (first, last) = (
        busy.iter().copied().min().unwrap_or(0),
        busy.iter().copied().max().unwrap_or(0),
    );
    let steady: Vec<u64> = (first + 1 + STEADY_AFTER_CYCLES..last).collect();
    let violating =
        |s: &[&Value], c: u64| s.iter().any(|e| cycle(e) == c && e["state"] == "violating");
    let reader = |s: &[&Value], slo_ms: u64| Reader {
        slo_ms,
        steady_violations: steady.iter().filter(|&&c| violating(s, c)).count(),
        solo_p999_ms: f64::NAN,
        steady_p999_ms: f64::NAN,
        cycles_to_slo: match (first..=last).find(|&c| violating(s, c)) {
            None => Some(0),
            Some(f) => (f + 1..=last).find(|&c| !violating(s, c)).map(|c| c - f),
        },
    };
    let writes = matches!(mode, Mode::Policy(_));
    let changes: Vec<u64> = events
        .iter()
        .filter(|e| {
            writes
                && e["type"] == "decision"
                && (e["service"] == "ingest" || e["service"] == "backup")
        })
        .map(cycle)
        .collect();
    let mean = |s: &[&Value]| {
        steady.iter().map(|&c| write_mbps(s, c)).sum::<f64>() / steady.len().max(1) as f64
    };
    MixOutcome {
        db: reader(&db, mix.db_slo_ms),
        cache: reader(&cache, mix.cache_slo_ms),
        steady: SteadyBudget::of(
            &steady,
            |c| violating(&db, c) || violating(&cache, c) || violating(&ingest, c),
            &changes,
        ),
        ingest_rate_mbps: mix.ingest_rate_mbps,
        ingest_steady_mbps: mean(&ingest),
        backup_steady_mbps: mean(&backup),
        events: events.to_vec(),
        mode,
    }
}
