//! `isolator advise --jobs FILE`: the services or jobs to run, and the penalty of running
//! each two of them together on their disk, from what was learned where there is enough
//! of it, else from the paper's guidelines for their classes.
//!
//! The file has one job a line, `#` starts a comment:
//!
//! ```text
//! JOB [CLASS] [disk=DISK]
//! db                    # a service of the recording: its own disk, character and pairs
//! backup seq-write      # a service, or a new job, of this class
//! rand-write disk=vdb   # a job known only by its class, on disk vdb
//! ```
//!
//! JOB is a service name of the recording or a class name (`seq-read`, `rand-read`,
//! `seq-write`, `rand-write`, `mixed`); DISK is a kernel name (`vdb`) or `major:minor`.
//! Without `disk=`, a service goes on the disk it was most active on, and a class on the
//! recording's only disk.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::{
    advise::interference::{Basis, Estimator, Guideline, PairEstimate},
    measure::character::CharacterClass,
};

/// One line of the jobs file.
#[derive(Debug, Clone, PartialEq)]
pub struct JobSpec {
    pub line: usize,
    pub name: String,
    pub class: Option<CharacterClass>,
    pub disk: Option<String>,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum JobsError {
    #[error("line {line}: '{text}': {reason}")]
    BadLine {
        line: usize,
        text: String,
        reason: String,
    },
    #[error("no jobs in it; write one job a line: a service name or a class (seq-read, rand-read, seq-write, rand-write, mixed), optionally a class and disk=DISK")]
    Empty,
}

pub fn parse(text: &str) -> Result<Vec<JobSpec>, JobsError> {
    let mut jobs = vec![];
    for (i, raw) in text.lines().enumerate() {
        let content = raw.split('#').next().unwrap_or("").trim();
        if content.is_empty() {
            continue;
        }
        let bad = |reason: String| JobsError::BadLine {
            line: i + 1,
            text: content.to_string(),
            reason,
        };
        let mut words = content.split_whitespace();
        let name = words.next().unwrap_or_default().to_string();
        let mut job = JobSpec {
            line: i + 1,
            class: CharacterClass::parse(&name),
            name,
            disk: None,
        };
        for word in words {
            if let Some(disk) = word.strip_prefix("disk=") {
                if disk.is_empty() || job.disk.is_some() {
                    return Err(bad(
                        "give one disk=NAME (e.g. disk=vdb or disk=254:16)".into()
                    ));
                }
                job.disk = Some(disk.to_string());
            } else if let Some(class) = CharacterClass::parse(word) {
                job.class = Some(class);
            } else {
                return Err(bad(format!(
                    "'{word}' is neither a class (seq-read, rand-read, seq-write, rand-write, mixed) nor disk=NAME"
                )));
            }
        }
        jobs.push(job);
    }
    if jobs.is_empty() {
        return Err(JobsError::Empty);
    }
    Ok(jobs)
}

/// A job placed on a disk, with the character its penalties use.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlacedJob {
    pub name: String,
    /// The recording's service the job is, if it is one.
    pub service: Option<String>,
    /// None: a service too quiet to classify, planned on its measured pairs alone.
    pub class: Option<CharacterClass>,
}

/// The jobs of one disk and the penalty of each two of them together.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DiskJobs {
    pub dev: String,
    pub disk: Option<String>,
    pub jobs: Vec<PlacedJob>,
    /// Symmetric, 0..=2, zero diagonal.
    pub penalty: Vec<Vec<u32>>,
    /// Where each penalty comes from (`measured` or `guideline`), same layout.
    pub basis: Vec<Vec<Basis>>,
}

/// A job that cannot be planned, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Unplanned {
    pub name: String,
    pub reason: String,
}

/// Places the jobs on disks and fills their penalties: a pair of the recording's services
/// with a measured estimate (either direction; the worse) takes the learned penalty, any
/// other pair the guideline's for the two classes. A job that would need a guideline and
/// whose class is unknown is not planned: the advice says so rather than guess.
pub fn place(
    specs: &[JobSpec],
    estimator: &Estimator,
    pairs: &[PairEstimate],
    guideline: Guideline,
) -> Result<(Vec<DiskJobs>, Vec<Unplanned>), JobsError> {
    let disks = estimator.disks();
    let mut by_dev: BTreeMap<String, (Option<String>, Vec<PlacedJob>)> = BTreeMap::new();
    let mut unplanned = vec![];
    for spec in specs {
        let bad = |reason: String| JobsError::BadLine {
            line: spec.line,
            text: spec.name.clone(),
            reason,
        };
        let is_service = disks
            .iter()
            .any(|(dev, _)| estimator.services(dev).contains_key(&spec.name));
        let (dev, disk) = match &spec.disk {
            Some(d) => disks
                .iter()
                .find(|(dev, name)| dev == d || name.as_deref() == Some(d.as_str()))
                .cloned()
                .unwrap_or((d.clone(), None)),
            None if is_service => disks
                .iter()
                .max_by_key(|(dev, _)| estimator.services(dev).get(&spec.name).copied())
                .cloned()
                .expect("a service is on a disk"),
            None => match disks.as_slice() {
                [one] => one.clone(),
                [] => {
                    return Err(bad(
                        "the recording has no disk with services; add disk=NAME".into(),
                    ))
                }
                _ => {
                    let names: Vec<String> = disks
                        .iter()
                        .map(|(dev, n)| n.clone().unwrap_or_else(|| dev.clone()))
                        .collect();
                    return Err(bad(format!(
                        "the recording has several disks ({}); add disk=NAME",
                        names.join(", ")
                    )));
                }
            },
        };
        let service = estimator
            .services(&dev)
            .contains_key(&spec.name)
            .then(|| spec.name.clone());
        let class = spec
            .class
            .or_else(|| estimator.class(&dev, service.as_deref()?));
        if class.is_none() && service.is_none() {
            let reason = if is_service {
                "it was never active on that disk; give its class, e.g. 'NAME rand-read'"
            } else {
                "it is neither a service of the recording nor a class; give its class, e.g. 'NAME rand-read'"
            };
            unplanned.push(Unplanned {
                name: spec.name.clone(),
                reason: reason.into(),
            });
            continue;
        }
        let entry = by_dev.entry(dev).or_insert((disk, vec![]));
        let mut name = spec.name.clone();
        // Two lines of one class are two jobs: names stay distinct.
        let same = entry
            .1
            .iter()
            .filter(|j| j.name == name || j.name.starts_with(&format!("{name}#")))
            .count();
        if same > 0 {
            name = format!("{name}#{}", same + 1);
        }
        entry.1.push(PlacedJob {
            name,
            service,
            class,
        });
    }
    let planned = by_dev
        .into_iter()
        .map(|(dev, (disk, mut jobs))| {
            let measured = |x: &PlacedJob, y: &PlacedJob| match (&x.service, &y.service) {
                (Some(a), Some(b)) => pairs
                    .iter()
                    .filter(|p| p.dev == dev && p.basis == Basis::Measured)
                    .filter(|p| (&p.victim, &p.other) == (a, b) || (&p.victim, &p.other) == (b, a))
                    .filter_map(|p| p.penalty)
                    .max(),
                _ => None,
            };
            // A job without a class can go only where every pair of it is measured.
            let unknown: Vec<usize> = (0..jobs.len())
                .filter(|&i| jobs[i].class.is_none())
                .filter(|&i| {
                    (0..jobs.len()).any(|j| j != i && measured(&jobs[i], &jobs[j]).is_none())
                })
                .collect();
            for &i in unknown.iter().rev() {
                let job = jobs.remove(i);
                unplanned.push(Unplanned {
                    name: job.name,
                    reason: "its character is unknown (too few requests to classify) and not all its pairs with the other jobs are measured; give its class, e.g. 'NAME rand-read'".into(),
                });
            }
            let n = jobs.len();
            let mut penalty = vec![vec![0; n]; n];
            let mut basis = vec![vec![Basis::Guideline; n]; n];
            for i in 0..n {
                for j in (i + 1)..n {
                    let (p, b) = match (measured(&jobs[i], &jobs[j]), jobs[i].class, jobs[j].class) {
                        (Some(p), _, _) => (p, Basis::Measured),
                        (None, Some(a), Some(b)) => (guideline(a, b), Basis::Guideline),
                        (None, _, _) => unreachable!("jobs without a class have only measured pairs"),
                    };
                    (penalty[i][j], penalty[j][i]) = (p, p);
                    (basis[i][j], basis[j][i]) = (b, b);
                }
            }
            DiskJobs {
                dev,
                disk,
                jobs,
                penalty,
                basis,
            }
        })
        .collect();
    Ok((planned, unplanned))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{events::ServiceStats, measure::character::Character};

    #[test]
    fn lines_name_a_job_a_class_and_a_disk() {
        let jobs = parse("# plan\ndb\nbackup seq-write\n\nrand-write disk=vdb # x\n").unwrap();
        assert_eq!(jobs.len(), 3);
        assert_eq!(
            (jobs[0].name.as_str(), jobs[0].class, jobs[0].line),
            ("db", None, 2)
        );
        assert_eq!(jobs[1].class, Some(CharacterClass::SeqWrite));
        assert_eq!(jobs[2].class, Some(CharacterClass::RandWrite));
        assert_eq!(jobs[2].disk.as_deref(), Some("vdb"));
        assert_eq!(parse("# nothing\n\n"), Err(JobsError::Empty));
        let e = parse("db fast\n").unwrap_err().to_string();
        assert!(
            e.starts_with("line 1: 'db fast': 'fast' is neither a class"),
            "{e}"
        );
    }

    fn stats(
        cycle: u64,
        service: &str,
        p999_ms: u64,
        class: Option<CharacterClass>,
    ) -> ServiceStats {
        ServiceStats {
            cycle,
            service: service.into(),
            dev: "7:3".into(),
            disk: Some("loop3".into()),
            samples: 100,
            p999_ns: Some(p999_ms * 1_000_000),
            read_mbps: 10.0,
            character: class.map(|c| Character {
                ios: 100,
                class: Some(c),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn one(_: CharacterClass, _: CharacterClass) -> u32 {
        1
    }

    #[test]
    fn measured_pairs_take_the_learned_penalty_and_others_the_guideline() {
        let mut e = Estimator::default();
        e.start_run();
        for c in 1..=6 {
            e.add(&stats(c, "db", 1, Some(CharacterClass::RandRead)));
            e.add(&stats(c + 10, "backup", 50, Some(CharacterClass::SeqWrite)));
            e.add(&stats(c + 20, "db", 30, Some(CharacterClass::RandRead)));
            e.add(&stats(c + 20, "backup", 50, Some(CharacterClass::SeqWrite)));
            e.add(&stats(c + 30, "quiet", 1, None));
        }
        let pairs = e.estimate(Some(one));
        let specs = parse("db\nbackup\nrand-write\nrand-write\nquiet\nghost\n").unwrap();
        let (disks, unplanned) = place(&specs, &e, &pairs, one).unwrap();
        assert_eq!(disks.len(), 1);
        let d = &disks[0];
        let names: Vec<&str> = d.jobs.iter().map(|j| j.name.as_str()).collect();
        assert_eq!(names, ["db", "backup", "rand-write", "rand-write#2"]);
        assert_eq!((d.penalty[0][1], d.basis[0][1]), (2, Basis::Measured));
        assert_eq!(d.penalty[1][0], 2);
        assert_eq!((d.penalty[0][2], d.basis[0][2]), (1, Basis::Guideline));
        assert_eq!(d.penalty[2][2], 0);
        let why: Vec<&str> = unplanned.iter().map(|u| u.name.as_str()).collect();
        assert_eq!(why, ["ghost", "quiet"]);
        assert!(unplanned[0].reason.contains("neither a service"));
        assert!(unplanned[1].reason.contains("character is unknown"));
    }

    #[test]
    fn a_service_without_a_class_is_planned_on_measured_pairs_alone() {
        let mut e = Estimator::default();
        e.start_run();
        for c in 1..=6 {
            e.add(&stats(c, "db", 1, None));
            e.add(&stats(c + 10, "backup", 50, None));
            e.add(&stats(c + 20, "db", 30, None));
            e.add(&stats(c + 20, "backup", 50, None));
        }
        let pairs = e.estimate(Some(one));
        let (disks, unplanned) = place(&parse("db\nbackup\n").unwrap(), &e, &pairs, one).unwrap();
        assert!(unplanned.is_empty(), "{unplanned:?}");
        assert_eq!(disks[0].penalty, [[0, 2], [2, 0]]);
        assert_eq!(disks[0].jobs[0].class, None);
        // A class job next to them needs their classes: they are left out, saying why.
        let (disks, unplanned) =
            place(&parse("db\nbackup\nseq-read\n").unwrap(), &e, &pairs, one).unwrap();
        assert_eq!(disks[0].jobs.len(), 1);
        assert_eq!(unplanned.len(), 2);
    }
}
