//! `isolator replay FILE`: runs a policy again over a recorded run (the `policy_input`
//! events of an `isolator run --config --json FILE`) and says where its decisions differ
//! from the recorded ones. The same policy and config reproduce every decision; another
//! policy or SLO answers "what would the agent have done" before enforcement is turned on.
//!
//! What replay cannot know is how the disk would have answered other limits: every cycle's
//! measurements are the recorded ones. The limits the replayed policy sees are its own (as
//! if each of its decisions had been written), so its bookkeeping stays its own.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    fmt::Write as _,
    path::{Path, PathBuf},
};

use crate::{
    config::{self, Rate, SloClass},
    events::{AgentStart, Decision, Event, PolicyInput, ReadError, RecordedEvent},
    identify::disks::dev_text,
    policy::{self, DeviceCycle, IoMaxLimit, Policy, ServiceId},
};

/// `isolator replay`'s options.
#[derive(clap::Args, Debug)]
pub struct ReplayOptions {
    /// A file the agent wrote with `isolator run --config ... --json FILE`.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// The policy to replay (default: the recorded run's).
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(policy::POLICY_NAMES))]
    pub policy: Option<String>,
    /// Another SLO for a service: SERVICE=20ms (latency p99.9), SERVICE=150MB/s
    /// (throughput) or SERVICE=best-effort. Repeatable.
    #[arg(long = "slo", value_name = "SERVICE=VALUE", value_parser = parse_slo_override)]
    pub slo: Vec<SloOverride>,
    /// The `ute` policy's threshold (default: the recorded one, else 0.75).
    #[arg(long, value_name = "FRACTION")]
    pub ute_threshold: Option<f64>,
}

/// `--slo SERVICE=VALUE`.
#[derive(Debug, Clone, PartialEq)]
pub struct SloOverride {
    pub service: String,
    pub slo: SloClass,
}

fn parse_slo_override(s: &str) -> Result<SloOverride, String> {
    let Some((service, value)) = s.split_once('=') else {
        return Err(format!(
            "'{s}' is not SERVICE=VALUE; write e.g. db=10ms, backup=150MB/s or web=best-effort"
        ));
    };
    let (service, value) = (service.trim(), value.trim());
    if service.is_empty() {
        return Err(format!("'{s}' names no service; write e.g. db=10ms"));
    }
    let unknown = || {
        format!(
            "'{value}' is not an SLO; write a p99.9 target (db=10ms), one at another quantile (db=p95:3ms), a rate (backup=150MB/s) or best-effort"
        )
    };
    let slo = if value == "best-effort" {
        SloClass::BestEffort
    } else if value.ends_with("/s") {
        match config::parse_rate(value)? {
            Rate::BytesPerSec(rate_bps) => SloClass::Throughput { rate_bps },
            Rate::IosPerSec(_) => return Err(unknown()),
        }
    } else if value.to_ascii_lowercase().ends_with("iops") {
        // An SLO is a latency or a byte rate; IOPS are for floors and ceilings.
        return Err(unknown());
    } else if value.ends_with('s') && value.starts_with(|c: char| c.is_ascii_digit() || c == '.') {
        SloClass::latency_p999(config::parse_duration_ns(value)?)
    } else if let Some((key, duration)) = value.split_once(':') {
        let quantile = config::LatencyQuantile::ALL
            .into_iter()
            .find(|q| q.field().key() == key.trim())
            .ok_or_else(|| {
                format!("'{key}' in '{value}' is not a quantile; write p999, p99, p95 or p90, e.g. db=p95:3ms")
            })?;
        SloClass::Latency(config::LatencyTarget {
            quantile,
            target_ns: config::parse_duration_ns(duration.trim())?,
        })
    } else {
        return Err(unknown());
    };
    Ok(SloOverride {
        service: service.to_string(),
        slo,
    })
}

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("cannot read {path}: {error}; give a file written by 'isolator run --json FILE'")]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{path} line {line}: {error}")]
    Schema {
        path: PathBuf,
        line: usize,
        error: ReadError,
    },
    #[error("{path} line {line}: a {kind} event that cannot be read ({error}); replay needs every one of them, so it stops here")]
    Unreadable {
        path: PathBuf,
        line: usize,
        kind: String,
        error: ReadError,
    },
    #[error("{path} holds no isolator events; give a file written by 'isolator run --json FILE'")]
    NotARecording { path: PathBuf },
    #[error("{path} records no policy input: the agent ran without --config (or is older than the policy_input event); record a run with 'isolator run --config FILE --json FILE'")]
    NoPolicyInput { path: PathBuf },
    #[error("--slo {service}=...: no service '{service}' in {path}; it records {known}")]
    UnknownService {
        service: String,
        path: PathBuf,
        known: String,
    },
}

/// One agent run in a recording: from its `agent_start` to the next.
#[derive(Debug, Default)]
pub struct RecordedRun {
    pub start: AgentStart,
    /// The file begins in the middle of this run (rotated, or cut at the front): there is
    /// no `agent_start`, and what the policy remembered from before is not in the file.
    pub begins_before_file: bool,
    pub inputs: Vec<PolicyInput>,
    /// The policy's decisions (configured weights left out), in order.
    pub decisions: Vec<Decision>,
    /// Events the agent's output lost during the run (`cycle_end.events_dropped` grew).
    pub events_dropped: u64,
}

impl RecordedRun {
    /// The run's policy: as `agent_start` says, or, for a run the file begins inside of, as
    /// its decisions say.
    pub fn policy(&self) -> Option<&str> {
        self.start.policy.as_deref().or_else(|| {
            self.decisions
                .iter()
                .map(|d| d.policy.as_str())
                .find(|p| *p != "config")
        })
    }
}

/// A recording, read whole.
#[derive(Debug, Default)]
pub struct Recording {
    pub runs: Vec<RecordedRun>,
    /// Lines that are not events of this schema (a torn last line, a log line).
    pub unreadable_lines: usize,
}

impl Recording {
    pub fn read(path: &Path) -> Result<Recording, ReplayError> {
        let text = std::fs::read_to_string(path).map_err(|error| ReplayError::Read {
            path: path.to_path_buf(),
            error,
        })?;
        Recording::parse(path, &text)
    }

    pub fn parse(path: &Path, text: &str) -> Result<Recording, ReplayError> {
        let mut rec = Recording::default();
        let mut events = 0;
        // The first events_dropped of the current run, and the last.
        let mut dropped: Option<(u64, u64)> = None;
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let e = match RecordedEvent::parse(line) {
                Ok(e) => e,
                Err(error @ ReadError::Schema(_)) => {
                    return Err(ReplayError::Schema {
                        path: path.to_path_buf(),
                        line: i + 1,
                        error,
                    })
                }
                Err(error @ ReadError::NotAnEvent(_)) => {
                    // The policy's input and decisions are what replay is made of: losing
                    // one would make every later decision differ for no visible reason.
                    if let Some(kind) =
                        event_type(line).filter(|t| REPLAY_NEEDS.contains(&t.as_str()))
                    {
                        return Err(ReplayError::Unreadable {
                            path: path.to_path_buf(),
                            line: i + 1,
                            kind,
                            error,
                        });
                    }
                    rec.unreadable_lines += 1;
                    continue;
                }
            };
            events += 1;
            if matches!(
                e.event,
                Event::PolicyInput(_) | Event::Decision(_) | Event::CycleEnd(_)
            ) && rec.runs.is_empty()
            {
                rec.runs.push(RecordedRun {
                    begins_before_file: true,
                    ..RecordedRun::default()
                });
            }
            match e.event {
                Event::AgentStart(start) => {
                    rec.close_run(dropped.take());
                    rec.runs.push(RecordedRun {
                        start,
                        ..RecordedRun::default()
                    })
                }
                Event::PolicyInput(p) => {
                    if let Some(run) = rec.runs.last_mut() {
                        run.inputs.push(p);
                    }
                }
                Event::Decision(d) if d.decided.is_some() => {
                    if let Some(run) = rec.runs.last_mut() {
                        run.decisions.push(d);
                    }
                }
                Event::CycleEnd(end) => {
                    let first = dropped.map_or(end.events_dropped, |(f, _)| f);
                    dropped = Some((first, end.events_dropped));
                }
                _ => {}
            }
        }
        rec.close_run(dropped);
        if events == 0 {
            return Err(ReplayError::NotARecording {
                path: path.to_path_buf(),
            });
        }
        Ok(rec)
    }
}

/// Event types replay cannot do without.
const REPLAY_NEEDS: [&str; 2] = ["policy_input", "decision"];

/// The `type` of a line that is not a readable event, if it has one.
fn event_type(line: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Head {
        #[serde(rename = "type")]
        ty: String,
    }
    serde_json::from_str::<Head>(line).ok().map(|h| h.ty)
}

impl Recording {
    /// Ends the current run: what its output lost.
    fn close_run(&mut self, dropped: Option<(u64, u64)>) {
        if let (Some(run), Some((first, last))) = (self.runs.last_mut(), dropped) {
            run.events_dropped = last.saturating_sub(first);
        }
    }
}

/// One limit change: which cycle, disk, service and knob, and the value (None: no limit).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DecisionKey {
    pub cycle: u64,
    pub dev: String,
    pub service: String,
    pub knob: String,
}

/// Where the replayed decisions and the recorded ones part.
#[derive(Debug, Clone, PartialEq)]
pub struct Difference {
    pub key: DecisionKey,
    /// None: no decision for this knob in this cycle; Some(None): "no limit".
    pub recorded: Option<Option<u64>>,
    pub replayed: Option<Option<u64>>,
}

/// The replay of one run.
#[derive(Debug, Default)]
pub struct ReplayOutcome {
    pub cycles: usize,
    pub recorded_decisions: usize,
    pub replayed_decisions: usize,
    pub differences: Vec<Difference>,
}

/// A service's limit on a disk as the replayed policy has set it.
#[derive(Default, Clone, Copy)]
struct ReplayedLimit {
    limit: IoMaxLimit,
    changed_cycle: Option<u64>,
}

/// Replays one run with `policy`: each recorded cycle, with the SLOs of `slo` where given.
/// Pure: the same inputs give the same outcome.
///
/// While a service's replayed decisions on a disk match the recorded ones, it sees the
/// limits recorded in the input (what the agent really had, a rejected write included);
/// from its first difference on, the limits the replayed policy set itself.
pub fn replay_run(
    run: &RecordedRun,
    policy: &mut dyn Policy,
    slo: &HashMap<String, SloClass>,
) -> ReplayOutcome {
    let recorded: BTreeMap<DecisionKey, Option<u64>> = run
        .decisions
        .iter()
        .filter_map(|d| {
            Some((
                DecisionKey {
                    cycle: d.cycle,
                    dev: d.dev.clone()?,
                    service: d.service.clone(),
                    knob: d.knob.clone(),
                },
                d.decided?.value(),
            ))
        })
        .collect();
    // The decisions of one service on one disk in one cycle, knob by knob: a range of the
    // map (keys order by cycle, disk, service, knob), not a scan of a day's decisions.
    let of_service = |decisions: &BTreeMap<DecisionKey, Option<u64>>,
                      cycle: u64,
                      dev: &str,
                      service: &str|
     -> Vec<(String, Option<u64>)> {
        let first = DecisionKey {
            cycle,
            dev: dev.to_string(),
            service: service.to_string(),
            knob: String::new(),
        };
        decisions
            .range(first..)
            .take_while(|(k, _)| k.cycle == cycle && k.dev == dev && k.service == service)
            .map(|(k, v)| (k.knob.clone(), *v))
            .collect()
    };
    // An override names a service; it goes by id, so that a container renamed mid-run (its
    // service keeps its id and what the policy learned) keeps the SLO it was given.
    let slo_of_id: HashMap<ServiceId, SloClass> = run
        .inputs
        .iter()
        .flat_map(|input| &input.devices)
        .flat_map(|d| &d.services)
        .filter_map(|s| Some((s.id, *slo.get(&s.name)?)))
        .collect();
    let mut own: HashMap<(ServiceId, u32), ReplayedLimit> = HashMap::new();
    let mut diverged: HashSet<(ServiceId, u32)> = HashSet::new();
    let mut replayed: BTreeMap<DecisionKey, Option<u64>> = BTreeMap::new();
    let mut cycles = BTreeSet::new();
    for input in &run.inputs {
        cycles.insert(input.cycle);
        for &sid in &input.forgotten_services {
            policy.forget_service(sid);
            own.retain(|&(s, _), _| s != sid);
            diverged.retain(|&(s, _)| s != sid);
        }
        for recorded_cycle in &input.devices {
            let mut d: DeviceCycle = recorded_cycle.clone();
            let dev = dev_text(d.dev);
            for s in &mut d.services {
                if let Some(&class) = slo_of_id.get(&s.id) {
                    s.class = class;
                }
                if diverged.contains(&(s.id, d.dev)) {
                    let mine = own.get(&(s.id, d.dev)).copied().unwrap_or_default();
                    s.limit = mine.limit;
                    s.changed_cycle = mine.changed_cycle;
                } else {
                    own.insert(
                        (s.id, d.dev),
                        ReplayedLimit {
                            limit: s.limit,
                            changed_cycle: s.changed_cycle,
                        },
                    );
                }
            }
            let mut decisions = policy::ceilings(&d);
            decisions.extend(policy.decide(&d));
            // Nothing is written, and no decision made, for a service without cgroups.
            decisions.retain(|dec| !input.untargeted_services.contains(&dec.service));
            for dec in decisions {
                let Some(name) = d
                    .services
                    .iter()
                    .find(|s| s.id == dec.service)
                    .map(|s| s.name.clone())
                else {
                    continue;
                };
                let st = own.entry((dec.service, d.dev)).or_default();
                st.limit.set(dec.knob, dec.to);
                st.changed_cycle = Some(d.cycle);
                replayed.insert(
                    DecisionKey {
                        cycle: d.cycle,
                        dev: dev.clone(),
                        service: name,
                        knob: dec.knob.name().to_string(),
                    },
                    dec.to,
                );
            }
            for s in &d.services {
                let mine = of_service(&replayed, d.cycle, &dev, &s.name);
                if mine != of_service(&recorded, d.cycle, &dev, &s.name) {
                    diverged.insert((s.id, d.dev));
                }
            }
        }
    }
    let keys: BTreeSet<&DecisionKey> = recorded.keys().chain(replayed.keys()).collect();
    let differences = keys
        .into_iter()
        .filter_map(|k| {
            let (r, p) = (recorded.get(k).copied(), replayed.get(k).copied());
            (r != p).then(|| Difference {
                key: k.clone(),
                recorded: r,
                replayed: p,
            })
        })
        .collect();
    ReplayOutcome {
        cycles: cycles.len(),
        recorded_decisions: recorded.len(),
        replayed_decisions: replayed.len(),
        differences,
    }
}

/// A limit value in words, exact: `115565885 B/s (115.6 MB/s)`, `900 IOPS`, `no limit`.
fn value_text(knob: &str, v: Option<u64>) -> String {
    match v {
        None => "no limit".into(),
        Some(v) if knob.ends_with("bps") => format!("{v} B/s ({:.1} MB/s)", v as f64 / 1e6),
        Some(v) => format!("{v} IOPS"),
    }
}

fn difference_text(d: &Difference) -> String {
    let k = &d.key;
    let what = match (d.recorded, d.replayed) {
        (Some(r), Some(p)) => format!(
            "recorded {}, replay {}",
            value_text(&k.knob, r),
            value_text(&k.knob, p)
        ),
        (Some(r), None) => format!(
            "recorded {}, replay leaves it as it was",
            value_text(&k.knob, r)
        ),
        (None, Some(p)) => format!("replay {}, not in the recording", value_text(&k.knob, p)),
        (None, None) => "no decision".into(),
    };
    format!(
        "cycle {} {} {} {}: {what}",
        k.cycle, k.dev, k.service, k.knob
    )
}

/// `isolator replay`: the report, as printed.
pub fn run(opts: &ReplayOptions) -> anyhow::Result<String> {
    let rec = Recording::read(&opts.file)?;
    if rec.runs.iter().all(|r| r.inputs.is_empty()) {
        return Err(ReplayError::NoPolicyInput {
            path: opts.file.clone(),
        }
        .into());
    }
    let recorded_services: BTreeSet<&str> = rec
        .runs
        .iter()
        .flat_map(|r| &r.inputs)
        .flat_map(|i| &i.devices)
        .flat_map(|d| &d.services)
        .map(|s| s.name.as_str())
        .collect();
    let mut slo = HashMap::new();
    for o in &opts.slo {
        if !recorded_services.contains(o.service.as_str()) {
            return Err(ReplayError::UnknownService {
                service: o.service.clone(),
                path: opts.file.clone(),
                known: recorded_services
                    .iter()
                    .copied()
                    .collect::<Vec<_>>()
                    .join(", "),
            }
            .into());
        }
        slo.insert(o.service.clone(), o.slo);
    }
    if let Some(t) = opts.ute_threshold {
        if !(t > 0.0 && t < 1.0) {
            anyhow::bail!("--ute-threshold {t} is not a fraction between 0 and 1; use e.g. 0.75");
        }
    }
    let mut out = String::new();
    let mut differ = 0;
    for (i, run) in rec.runs.iter().enumerate() {
        if run.inputs.is_empty() {
            continue;
        }
        let recorded_policy = run.policy().unwrap_or("unknown");
        let Some(name) = opts.policy.as_deref().or(run.policy()) else {
            anyhow::bail!(
                "run {} of {} begins before the file (no agent_start) and no decision names its policy; give --policy",
                i + 1,
                opts.file.display()
            );
        };
        let threshold = opts
            .ute_threshold
            .or(run.start.ute_threshold)
            .unwrap_or(0.75);
        let Some(mut policy) = policy::by_name(name, threshold) else {
            anyhow::bail!(
                "run {} of {} used policy '{recorded_policy}', which this isolator does not have; pick one with --policy",
                i + 1,
                opts.file.display()
            );
        };
        let outcome = replay_run(run, policy.as_mut(), &slo);
        let who = if run.begins_before_file {
            "begins before the file".to_string()
        } else {
            format!(
                "agent {} on {}, pid {}",
                run.start.version, run.start.host, run.start.pid
            )
        };
        let _ = writeln!(
            out,
            "run {} ({who}): {} cycles replayed with policy {name} (recorded: {recorded_policy})",
            i + 1,
            outcome.cycles
        );
        if run.begins_before_file {
            let _ = writeln!(
                out,
                "  note: what the policy remembered from before the file is not in it; its first decisions may differ"
            );
        }
        if run.events_dropped > 0 {
            let _ = writeln!(
                out,
                "  note: the agent's output lost {} event(s) during the run (cycle_end.events_dropped); decisions near them may differ",
                run.events_dropped
            );
        }
        for o in &opts.slo {
            let _ = writeln!(out, "  SLO of {}: {}", o.service, o.slo.describe());
        }
        for d in &outcome.differences {
            let _ = writeln!(out, "  {}", difference_text(d));
        }
        let _ = writeln!(
            out,
            "  {} recorded decisions, {} replayed, {} differ",
            outcome.recorded_decisions,
            outcome.replayed_decisions,
            outcome.differences.len()
        );
        differ += outcome.differences.len();
    }
    if rec.unreadable_lines > 0 {
        let _ = writeln!(
            out,
            "{} line(s) of {} were not events and were skipped",
            rec.unreadable_lines,
            opts.file.display()
        );
    }
    let _ = writeln!(
        out,
        "{}",
        if differ == 0 {
            "no differences: the replay makes every recorded decision and no other".to_string()
        } else {
            format!("{differ} difference(s)")
        }
    );
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::ServiceLoad;

    #[test]
    fn slo_overrides_parse_or_say_what_to_write() {
        assert_eq!(
            parse_slo_override("db=10ms").unwrap(),
            SloOverride {
                service: "db".into(),
                slo: SloClass::latency_p999(10_000_000)
            }
        );
        assert_eq!(
            parse_slo_override("backup=150MB/s").unwrap().slo,
            SloClass::Throughput {
                rate_bps: 150_000_000
            }
        );
        assert_eq!(
            parse_slo_override("web=best-effort").unwrap().slo,
            SloClass::BestEffort
        );
        for bad in [
            "db",
            "=10ms",
            "db=fast",
            "db=10",
            "db=100iops",
            "db=-1ms",
            "db=0ms",
        ] {
            let e = parse_slo_override(bad).unwrap_err();
            assert!(e.contains("write"), "{bad}: {e}");
        }
    }

    fn load(id: ServiceId, name: &str, class: SloClass, p999_ns: u64, bps: f64) -> ServiceLoad {
        ServiceLoad {
            id,
            name: name.into(),
            class,
            floor: None,
            ceiling: None,
            read_bps: 0.0,
            write_bps: bps,
            read_iops: 100.0,
            write_iops: bps / 1e6,
            p999_ns: Some(p999_ns),
            samples: 5000,
            mean_latency_ns: Some(p999_ns as f64 / 4.0),
            mean_inflight: bps / 1e8,
            peak_inflight: None,
            limit: IoMaxLimit::default(),
            latency_hist: vec![],
            cgroup_ids: vec![id as u64 + 100],
            changed_cycle: None,
            character: Default::default(),
        }
    }

    /// A run recorded as the controller records it: the policy's input each cycle, and
    /// its decisions with the limits it set fed back into the next cycle's input.
    fn recorded_run(cycles: u64, slo_ns: u64) -> RecordedRun {
        recorded_run_rejecting(cycles, slo_ns, &[])
    }

    /// As [`recorded_run`], with the writes of the decisions of `rejected` cycles refused
    /// (as the controller does, the limit stays and the decision's cycle is remembered).
    fn recorded_run_rejecting(cycles: u64, slo_ns: u64, rejected: &[u64]) -> RecordedRun {
        let mut policy = policy::by_name("adaptive", 0.75).unwrap();
        let mut run = RecordedRun::default();
        let mut limits: HashMap<ServiceId, (IoMaxLimit, Option<u64>)> = HashMap::new();
        for cycle in 1..=cycles {
            // The writer hurts the reader while it writes more than 200 MB/s.
            let writer_bps = limits
                .get(&1)
                .and_then(|(l, _)| l.total_bps())
                .map_or(800e6, |c| (c as f64).min(800e6));
            let reader_p999 = if writer_bps > 200e6 {
                20_000_000
            } else {
                1_000_000
            };
            let mut services = vec![
                load(0, "db", SloClass::latency_p999(slo_ns), reader_p999, 4e6),
                load(1, "backup", SloClass::BestEffort, 900_000, writer_bps),
            ];
            for s in &mut services {
                if let Some(&(l, c)) = limits.get(&s.id) {
                    s.limit = l;
                    s.changed_cycle = c;
                }
            }
            let d = DeviceCycle {
                cycle,
                dev: (254 << 20) | 16,
                interval_s: 1.0,
                utilization: 0.9,
                services,
                throttle_wait_timed: true,
            };
            let decisions = policy.decide(&d);
            for dec in &decisions {
                let e = limits.entry(dec.service).or_default();
                if !rejected.contains(&cycle) {
                    e.0.set(dec.knob, dec.to);
                }
                e.1 = Some(cycle);
                run.decisions.push(Decision {
                    cycle,
                    policy: "adaptive".into(),
                    service: d.services[dec.service].name.clone(),
                    dev: Some("254:16".into()),
                    knob: dec.knob.name().into(),
                    decided: Some(dec.to.into()),
                    ..Decision::default()
                });
            }
            run.inputs.push(PolicyInput {
                cycle,
                devices: vec![d],
                ..PolicyInput::default()
            });
        }
        run
    }

    #[test]
    fn the_same_policy_and_slo_reproduce_every_decision() {
        let run = recorded_run(30, 5_000_000);
        assert!(
            !run.decisions.is_empty(),
            "the scenario must make decisions"
        );
        let mut policy = policy::by_name("adaptive", 0.75).unwrap();
        let out = replay_run(&run, policy.as_mut(), &HashMap::new());
        assert_eq!(out.differences, vec![]);
        assert_eq!(out.recorded_decisions, run.decisions.len());
        assert_eq!(out.cycles, 30);
    }

    #[test]
    fn a_rejected_write_replays_as_it_happened() {
        let first = recorded_run(30, 5_000_000).decisions[0].cycle;
        // The first cap's write is refused: the agent decides again two cycles on.
        let run = recorded_run_rejecting(30, 5_000_000, &[first]);
        let again = run
            .decisions
            .iter()
            .filter(|d| d.service == "backup")
            .count();
        assert!(again >= 2, "{:?}", run.decisions);
        let mut policy = policy::by_name("adaptive", 0.75).unwrap();
        let out = replay_run(&run, policy.as_mut(), &HashMap::new());
        assert_eq!(out.differences, vec![]);
    }

    #[test]
    fn no_decision_for_a_service_without_cgroups() {
        let mut run = recorded_run(30, 5_000_000);
        // backup matched no cgroup: the agent wrote nothing and decided nothing for it.
        run.decisions.retain(|d| d.service != "backup");
        for input in &mut run.inputs {
            input.untargeted_services = vec![1];
        }
        let mut policy = policy::by_name("adaptive", 0.75).unwrap();
        let out = replay_run(&run, policy.as_mut(), &HashMap::new());
        assert_eq!(out.differences, vec![]);
    }

    #[test]
    fn a_file_that_begins_inside_a_run_replays_with_the_policy_its_decisions_name() {
        let run = recorded_run(30, 5_000_000);
        let mut text = String::new();
        for input in &run.inputs {
            let e = RecordedEvent {
                schema: crate::events::SCHEMA_VERSION,
                ts: String::new(),
                event: Event::PolicyInput(input.clone()),
            };
            text.push_str(&serde_json::to_string(&e).unwrap());
            text.push('\n');
            for d in run.decisions.iter().filter(|d| d.cycle == input.cycle) {
                let e = RecordedEvent {
                    schema: crate::events::SCHEMA_VERSION,
                    ts: String::new(),
                    event: Event::Decision(d.clone()),
                };
                text.push_str(&serde_json::to_string(&e).unwrap());
                text.push('\n');
            }
        }
        let rec = Recording::parse(Path::new("rotated.ndjson"), &text).unwrap();
        assert_eq!(rec.runs.len(), 1);
        let r = &rec.runs[0];
        assert!(r.begins_before_file);
        assert_eq!(r.policy(), Some("adaptive"));
        assert_eq!(
            (r.inputs.len(), r.decisions.len()),
            (30, run.decisions.len())
        );
        let mut policy = policy::by_name("adaptive", 0.75).unwrap();
        assert_eq!(
            replay_run(r, policy.as_mut(), &HashMap::new()).differences,
            vec![]
        );
        // A policy_input the reader cannot take stops replay, naming the line.
        let broken = text.replacen("\"cycle\":3,", "\"cycle\":\"three\",", 1);
        let e = Recording::parse(Path::new("rotated.ndjson"), &broken).unwrap_err();
        assert!(
            e.to_string()
                .contains("policy_input event that cannot be read"),
            "{e}"
        );
    }

    #[test]
    fn a_looser_slo_changes_the_decisions_and_says_where() {
        let run = recorded_run(30, 5_000_000);
        let mut policy = policy::by_name("adaptive", 0.75).unwrap();
        // 50 ms: the reader's 20 ms p99.9 meets it; nothing needs a cap.
        let slo = HashMap::from([("db".to_string(), SloClass::latency_p999(50_000_000))]);
        let out = replay_run(&run, policy.as_mut(), &slo);
        assert!(!out.differences.is_empty());
        assert_eq!(out.replayed_decisions, 0, "{:?}", out.differences);
        let first = &out.differences[0];
        assert_eq!(first.key.service, "backup");
        assert!(first.recorded.is_some() && first.replayed.is_none());
        assert!(difference_text(first).contains("replay leaves it as it was"));
    }

    #[test]
    fn an_slo_given_to_a_service_holds_after_it_is_renamed() {
        // db's container is renamed to db2 at cycle 10: the same service (id 0) from then on.
        let mut run = recorded_run(30, 5_000_000);
        for input in run.inputs.iter_mut().filter(|i| i.cycle >= 10) {
            input.devices[0].services[0].name = "db2".into();
        }
        let mut policy = policy::by_name("adaptive", 0.75).unwrap();
        let slo = HashMap::from([("db".to_string(), SloClass::latency_p999(50_000_000))]);
        let out = replay_run(&run, policy.as_mut(), &slo);
        assert_eq!(out.replayed_decisions, 0, "{:?}", out.differences);
    }

    #[test]
    fn bad_recordings_are_one_line_errors() {
        let p = Path::new("x.ndjson");
        let e = Recording::parse(p, "hello\nworld\n").unwrap_err();
        assert!(e.to_string().contains("holds no isolator events"), "{e}");
        let e = Recording::parse(p, r#"{"schema":9,"type":"agent_start"}"#).unwrap_err();
        assert!(e.to_string().contains("schema 9"), "{e}");
        let rec = Recording::parse(
            p,
            "{\"schema\":1,\"type\":\"agent_start\",\"policy\":null}\ntorn li",
        )
        .unwrap();
        assert_eq!((rec.runs.len(), rec.unreadable_lines), (1, 1));
    }
}
