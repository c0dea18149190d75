//! `isolator advise`: reads a recorded (or piped live) event stream, learns the
//! interference between its services ([`crate::advise::interference`]) and prints the
//! pairs that hurt each other most; with `--jobs`, a plan of batches per disk.

use std::{
    fmt::Write as _,
    io::{BufRead, BufReader, Read},
    path::{Path, PathBuf},
};

use serde::Serialize;

use crate::{
    advise::{
        batching::{self, Problem},
        guidelines,
        interference::{Basis, Estimator, PairEstimate, MIN_CYCLES_PER_SIDE},
        jobs::{self, DiskJobs, Unplanned},
    },
    events::{Event, ReadError, RecordedEvent},
};

/// `isolator advise`'s options.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "A live agent's stream can be piped in from its socket for a while, e.g.:\n  \
    timeout 600 socat -u UNIX-CONNECT:/run/isolator/isolator.sock - | isolator advise --input -\n\
    (the agent needs --config naming the services: service_stats are what advise learns from)"
)]
pub struct AdviseOptions {
    /// NDJSON events written by 'isolator run --config FILE --json FILE'; '-' reads stdin
    /// (to its end).
    #[arg(long, value_name = "FILE|-")]
    pub input: PathBuf,
    /// Machine output: one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Services or jobs to plan into batches, one a line: 'NAME [CLASS] [disk=DISK]', NAME a
    /// service of the stream or a class (seq-read, rand-read, seq-write, rand-write, mixed).
    #[arg(long, value_name = "FILE")]
    pub jobs: Option<PathBuf>,
    /// At most this many jobs run together in a batch (default: no limit).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub max_batch: Option<u64>,
    /// Pairs to print, most harmful first (human output; --json has them all).
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub top: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum AdviseError {
    #[error("cannot read {path}: {error}; give a file written by 'isolator run --config FILE --json FILE', or '-' for stdin")]
    Read { path: String, error: std::io::Error },
    #[error("{path} is empty; give a file written by 'isolator run --config FILE --json FILE'")]
    Empty { path: String },
    #[error("{path} is not an isolator event stream (no line is an isolator event); give a file written by 'isolator run --config FILE --json FILE'")]
    NotAStream { path: String },
    #[error("{path} line {line}: {error}")]
    Schema {
        path: String,
        line: usize,
        error: ReadError,
    },
    #[error("{path} has no service_stats events: the agent ran without --config; record with 'isolator run --config FILE --json FILE' naming the services to advise on")]
    NoServices { path: String },
    #[error("--jobs {path}: {error}")]
    Jobs { path: String, error: String },
}

/// What the stream held.
#[derive(Debug, Default)]
pub struct StreamSummary {
    pub events: usize,
    pub service_stats: usize,
    pub unreadable_lines: usize,
}

/// Feeds every `service_stats` of an NDJSON stream to `estimator`.
pub fn read_stream(
    name: &str,
    input: impl Read,
    estimator: &mut Estimator,
) -> Result<StreamSummary, AdviseError> {
    let mut summary = StreamSummary::default();
    let mut lines = 0;
    for (i, line) in BufReader::new(input).lines().enumerate() {
        let line = line.map_err(|error| AdviseError::Read {
            path: name.into(),
            error,
        })?;
        if line.trim().is_empty() {
            continue;
        }
        lines += 1;
        match RecordedEvent::parse(&line) {
            Ok(e) => {
                summary.events += 1;
                match e.event {
                    Event::AgentStart(_) => estimator.start_run(),
                    Event::ServiceStats(s) => {
                        summary.service_stats += 1;
                        estimator.add(&s);
                    }
                    _ => {}
                }
            }
            Err(error @ ReadError::Schema(_)) => {
                return Err(AdviseError::Schema {
                    path: name.into(),
                    line: i + 1,
                    error,
                })
            }
            // A torn last line or a stray log line: advice rests on the rest.
            Err(ReadError::NotAnEvent(_)) => summary.unreadable_lines += 1,
        }
    }
    match (lines, summary.events, summary.service_stats) {
        (0, _, _) => Err(AdviseError::Empty { path: name.into() }),
        (_, 0, _) => Err(AdviseError::NotAStream { path: name.into() }),
        (_, _, 0) => Err(AdviseError::NoServices { path: name.into() }),
        _ => Ok(summary),
    }
}

/// A batch plan of one disk.
#[derive(Debug, Clone, Serialize)]
pub struct DiskPlan {
    #[serde(flatten)]
    pub jobs: DiskJobs,
    /// Job names per batch, in run order.
    pub batches: Vec<Vec<String>>,
    pub total_penalty: u64,
    pub objective: f64,
    /// The solver proved the plan optimal (false: its best within its search budget).
    pub exact: bool,
}

/// `--json`'s object.
#[derive(Debug, Serialize)]
pub struct Advice {
    pub input: String,
    pub cycles: usize,
    pub min_cycles_per_side: usize,
    pub pairs: Vec<PairEstimate>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plans: Option<Vec<DiskPlan>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unplanned: Option<Vec<Unplanned>>,
}

/// Plans the batches of each disk's jobs with paper 002's objective.
fn plan(disks: Vec<DiskJobs>, max_batch: Option<u64>) -> Result<Vec<DiskPlan>, String> {
    disks
        .into_iter()
        .map(|jobs| {
            let n = jobs.jobs.len();
            let problem = Problem {
                penalty: jobs.penalty.clone(),
                // No cap: every job of the disk may share one batch.
                max_batch: max_batch
                    .map_or(n, |m| usize::try_from(m).unwrap_or(n))
                    .max(1),
            };
            let plan = batching::solve(&problem)
                .map_err(|e| format!("disk {}: {e}", jobs.disk.as_deref().unwrap_or(&jobs.dev)))?;
            let batches = plan
                .batches
                .iter()
                .map(|b| b.iter().map(|&i| jobs.jobs[i].name.clone()).collect())
                .collect();
            Ok(DiskPlan {
                jobs,
                batches,
                total_penalty: plan.total_penalty,
                objective: plan.objective,
                exact: plan.exact,
            })
        })
        .collect()
}

pub fn run(opts: &AdviseOptions) -> anyhow::Result<String> {
    let name = opts.input.display().to_string();
    let mut estimator = Estimator::default();
    if opts.input == Path::new("-") {
        read_stream("stdin", std::io::stdin().lock(), &mut estimator)?;
    } else {
        let file = std::fs::File::open(&opts.input).map_err(|error| AdviseError::Read {
            path: name.clone(),
            error,
        })?;
        read_stream(&name, file, &mut estimator)?;
    }
    let pairs = estimator.estimate(Some(guidelines::penalty));
    let (plans, unplanned) = match &opts.jobs {
        None => (None, None),
        Some(path) => {
            let jobs_error = |error: String| AdviseError::Jobs {
                path: path.display().to_string(),
                error,
            };
            let text = std::fs::read_to_string(path).map_err(|e| jobs_error(e.to_string()))?;
            let specs = jobs::parse(&text).map_err(|e| jobs_error(e.to_string()))?;
            let (disks, unplanned) = jobs::place(&specs, &estimator, &pairs, guidelines::penalty)
                .map_err(|e| jobs_error(e.to_string()))?;
            (
                Some(plan(disks, opts.max_batch).map_err(jobs_error)?),
                Some(unplanned),
            )
        }
    };
    let advice = Advice {
        input: name,
        cycles: estimator.cycles(),
        min_cycles_per_side: MIN_CYCLES_PER_SIDE,
        pairs,
        plans,
        unplanned,
    };
    Ok(if opts.json {
        serde_json::to_string(&advice)? + "\n"
    } else {
        render(&advice, opts.top)
    })
}

fn ms(ns: Option<u64>) -> String {
    ns.map_or("-".into(), |v| format!("{:.2} ms", v as f64 / 1e6))
}

fn mbps(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.1} MB/s"))
}

fn class(c: Option<crate::measure::character::CharacterClass>) -> &'static str {
    c.map_or("unknown", |c| c.as_str())
}

/// The human report.
pub fn render(a: &Advice, top: usize) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{}: {} cycles. OTHER -> VICTIM: the victim's medians per cycle with the other idle -> active ({} cycles a side at least)",
        a.input, a.cycles, a.min_cycles_per_side
    );
    if a.pairs.is_empty() {
        let _ = writeln!(
            out,
            "no two services were active on the same disk: nothing to say about interference yet"
        );
    }
    if !a.pairs.iter().any(|p| p.basis == Basis::Measured) && !a.pairs.is_empty() {
        let _ = writeln!(
            out,
            "too little data: no pair has {} cycles with the other active and {} with it idle; figures below are not measured",
            a.min_cycles_per_side, a.min_cycles_per_side
        );
    }
    for p in a.pairs.iter().take(top) {
        let disk = p.disk.clone().unwrap_or_else(|| p.dev.clone());
        let cycles = format!(
            "{} cycles idle / {} active",
            p.alone.cycles, p.together.cycles
        );
        let head = format!(
            "{} ({}) -> {} ({}) on {disk}",
            p.other,
            class(p.other_class),
            p.victim,
            class(p.victim_class)
        );
        let line = match p.basis {
            Basis::Measured => format!(
                "{head}: p99.9 {} -> {} (x{:.2}), {} -> {} (x{:.2}); {cycles}; penalty {}",
                ms(p.alone.p999_ns),
                ms(p.together.p999_ns),
                p.p999_ratio.unwrap_or(f64::NAN),
                mbps(p.alone.mbps),
                mbps(p.together.mbps),
                p.mbps_ratio.unwrap_or(f64::NAN),
                p.penalty.unwrap_or(0),
            ),
            Basis::Guideline => format!(
                "{head}: too little data ({cycles}); guideline penalty {}",
                p.penalty.unwrap_or(0),
            ),
            Basis::TooLittleData => {
                format!("{head}: too little data ({cycles}) and a class unknown: nothing claimed",)
            }
        };
        let _ = writeln!(out, "  {line}");
    }
    if a.pairs.len() > top {
        let _ = writeln!(
            out,
            "  ({} more pairs; --top N or --json)",
            a.pairs.len() - top
        );
    }
    for plan in a.plans.iter().flatten() {
        let disk = plan
            .jobs
            .disk
            .clone()
            .unwrap_or_else(|| plan.jobs.dev.clone());
        let _ = writeln!(
            out,
            "plan for {disk}: {} batches, total penalty {}{}",
            plan.batches.len(),
            plan.total_penalty,
            if plan.exact {
                ""
            } else {
                " (best found, not proven optimal)"
            }
        );
        for (i, batch) in plan.batches.iter().enumerate() {
            let _ = writeln!(out, "  batch {}: {}", i + 1, batch.join(", "));
        }
    }
    for u in a.unplanned.iter().flatten() {
        let _ = writeln!(out, "not planned: {}: {}", u.name, u.reason);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> Result<StreamSummary, AdviseError> {
        read_stream("events.ndjson", text.as_bytes(), &mut Estimator::default())
    }

    #[test]
    fn an_empty_or_foreign_input_is_a_one_line_error_naming_it() {
        for (text, want) in [
            ("", "events.ndjson is empty"),
            ("\n\n", "events.ndjson is empty"),
            (
                "hello\n{\"a\":1}\n",
                "events.ndjson is not an isolator event stream",
            ),
            (
                "{\"schema\":1,\"type\":\"cycle_end\",\"cycle\":1}\n",
                "events.ndjson has no service_stats events",
            ),
            (
                "{\"schema\":9,\"type\":\"cycle_end\"}\n",
                "events.ndjson line 1: the agent speaks event schema 9",
            ),
        ] {
            let e = read(text).unwrap_err().to_string();
            assert!(e.starts_with(want), "{text:?}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn jobs_are_planned_into_batches_by_name() {
        use crate::{
            events::ServiceStats,
            measure::character::{Character, CharacterClass},
        };
        let stats = |cycle: u64, service: &str, p999_ms: u64, class: CharacterClass| ServiceStats {
            cycle,
            service: service.into(),
            dev: "7:3".into(),
            samples: 100,
            p999_ns: Some(p999_ms * 1_000_000),
            read_mbps: 10.0,
            character: Some(Character {
                ios: 100,
                class: Some(class),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut e = Estimator::default();
        e.start_run();
        for c in 1..=6 {
            e.add(&stats(c, "db", 1, CharacterClass::RandRead));
            e.add(&stats(c + 10, "backup", 50, CharacterClass::SeqWrite));
            e.add(&stats(c + 20, "db", 30, CharacterClass::RandRead));
            e.add(&stats(c + 20, "backup", 50, CharacterClass::SeqWrite));
        }
        let pairs = e.estimate(Some(guidelines::penalty));
        let specs = jobs::parse("db\nbackup\nseq-read\nrand-read\n").unwrap();
        let (disks, unplanned) = jobs::place(&specs, &e, &pairs, guidelines::penalty).unwrap();
        assert!(unplanned.is_empty());
        let plans = plan(disks, Some(2)).unwrap();
        let p = &plans[0];
        let mut names: Vec<&str> = p.batches.iter().flatten().map(String::as_str).collect();
        names.sort_unstable();
        assert_eq!(names, ["backup", "db", "rand-read", "seq-read"]);
        assert!(p.batches.iter().all(|b| b.len() <= 2), "{:?}", p.batches);
        // The total penalty is that of the pairs sharing a batch, by the matrix.
        let index = |n: &str| p.jobs.jobs.iter().position(|j| j.name == n).unwrap();
        let mut total = 0;
        for b in &p.batches {
            for (k, x) in b.iter().enumerate() {
                for y in &b[k + 1..] {
                    total += u64::from(p.jobs.penalty[index(x)][index(y)]);
                }
            }
        }
        assert_eq!(p.total_penalty, total);
        let out = render(
            &Advice {
                input: "x".into(),
                cycles: e.cycles(),
                min_cycles_per_side: MIN_CYCLES_PER_SIDE,
                pairs,
                plans: Some(plans),
                unplanned: None,
            },
            10,
        );
        assert!(out.contains("plan for 7:3: "), "{out}");
        assert!(out.contains("  batch 1: "), "{out}");
    }

    #[test]
    fn a_stream_with_too_little_data_says_so() {
        let line = |cycle: u64, service: &str| {
            format!(
                "{{\"schema\":1,\"type\":\"service_stats\",\"cycle\":{cycle},\"service\":\"{service}\",\"dev\":\"7:3\",\"samples\":100,\"p999_ns\":1000000,\"read_mbps\":1.0}}\n"
            )
        };
        let text: String = (1..=3).map(|c| line(c, "a") + &line(c, "b")).collect();
        let mut e = Estimator::default();
        let s = read_stream("x", format!("{text}torn{{").as_bytes(), &mut e).unwrap();
        assert_eq!((s.service_stats, s.unreadable_lines), (6, 1));
        let advice = Advice {
            input: "x".into(),
            cycles: e.cycles(),
            min_cycles_per_side: MIN_CYCLES_PER_SIDE,
            pairs: e.estimate(None),
            plans: None,
            unplanned: None,
        };
        let out = render(&advice, 10);
        assert!(out.contains("too little data: no pair has"), "{out}");
        assert!(
            out.contains(
                "b (unknown) -> a (unknown) on 7:3: too little data (0 cycles idle / 3 active)"
            ),
            "{out}"
        );
    }
}
