//! Workload character (paper 002's bins) measured live: fio jobs of known character, each in
//! its own cgroup on one loop device, are classified right, and their read/write mix,
//! sequential share and request sizes match the job definitions.
//!
//! The jobs submit one request at a time (psync, O_DIRECT), so the block layer has nothing to
//! merge them with, and none is over 512 KiB, so it has nothing to split: every request the
//! disk sees is one of fio's, of exactly its size. (The loop device takes 128 segments; a
//! 1 MiB buffer whose pages are not contiguous in memory is split in two. Seen in CI, with
//! memory fragmented late in the suite: a 1 MiB writer's requests half in the <= 4 KiB bucket.)

use std::process::{Child, Command};

use isolator_tests::*;
use serde_json::Value;

struct Job {
    name: &'static str,
    fio: &'static str,
    class: &'static str,
    read_fraction: f64,
    /// (at least, at most) share of sequential requests.
    sequential: (f64, f64),
    size_bucket: usize,
}

const JOBS: [Job; 5] = [
    Job {
        name: "seqread",
        fio: "--rw=read --bs=128k --offset=0 --size=512m",
        class: "seq-read",
        read_fraction: 1.0,
        sequential: (0.97, 1.0),
        size_bucket: 3,
    },
    Job {
        name: "randread",
        fio: "--rw=randread --bs=4k --offset=0 --size=1g",
        class: "rand-read",
        read_fraction: 1.0,
        sequential: (0.0, 0.03),
        size_bucket: 0,
    },
    Job {
        name: "seqwrite",
        fio: "--rw=write --bs=512k --offset=1g --size=256m",
        class: "seq-write",
        read_fraction: 0.0,
        sequential: (0.97, 1.0),
        size_bucket: 4,
    },
    Job {
        name: "randwrite",
        fio: "--rw=randwrite --bs=16k --offset=1280m --size=512m",
        class: "rand-write",
        read_fraction: 0.0,
        sequential: (0.0, 0.03),
        size_bucket: 1,
    },
    Job {
        name: "mixed",
        fio: "--rw=randrw --rwmixread=70 --bs=8k --offset=0 --size=1g",
        class: "mixed",
        read_fraction: 0.7,
        sequential: (0.0, 0.03),
        size_bucket: 1,
    },
];

fn start_fio(cg: &TestCgroup, device: &std::path::Path, job: &Job, seconds: u32) -> Child {
    let script = format!(
        "echo $$ > {}/cgroup.procs && exec fio --name={} --filename={} {} --direct=1 \
         --ioengine=psync --time_based --runtime={seconds} --randseed=7 --output=/dev/null",
        cg.dir.display(),
        job.name,
        device.display(),
        job.fio
    );
    Command::new("sh").args(["-c", &script]).spawn().unwrap()
}

/// The last window character the agent gave the cgroup on `dev`.
fn last_character(events: &[Value], cgroup_id: u64, dev: &str) -> Option<Value> {
    events
        .iter()
        .filter(|e| e["type"] == "cgroup_stats" && e["cgroup"]["id"].as_u64() == Some(cgroup_id))
        .filter_map(|e| {
            e["devices"]
                .as_array()?
                .iter()
                .find(|d| d["dev"] == dev)
                .map(|d| d["character"].clone())
        })
        .rfind(|c| !c.is_null())
}

#[test]
fn fio_jobs_of_known_character_are_classified_and_measured_right() {
    require_root();
    require_tool("fio");
    let scratch = Scratch::new();
    let file = scratch.path("character.img");
    // Sparse: the writers fill only their own regions.
    run_ok(Command::new("truncate").arg("-s").arg("2g").arg(&file));
    let lo = LoopDevice::over(&file);
    let dev = lo.dev();
    let cgroups: Vec<TestCgroup> = JOBS
        .iter()
        .map(|j| TestCgroup::new(&format!("iso-char-{}", j.name)))
        .collect();
    let agent = Agent::start(&["--interval", "1s"]);
    let mut fios: Vec<Child> = JOBS
        .iter()
        .zip(&cgroups)
        .map(|(j, cg)| start_fio(cg, &lo.path, j, 5))
        .collect();
    for f in &mut fios {
        assert!(f.wait().unwrap().success(), "fio failed");
    }
    agent.wait_cycles(2);
    let events = agent.events();
    let mut failures = vec![];
    for (job, cg) in JOBS.iter().zip(&cgroups) {
        let Some(c) = last_character(&events, cg.id(), &dev) else {
            failures.push(format!("{}: no character in any cgroup_stats", job.name));
            continue;
        };
        eprintln!("{}: {c}", job.name);
        let ios = c["ios"].as_u64().unwrap();
        let read = c["read_ios_fraction"].as_f64().unwrap();
        let seq = c["sequential_fraction"].as_f64().unwrap();
        let sizes: Vec<u64> = c["size_ios"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        let mut want_sizes = vec![0; 5];
        want_sizes[job.size_bucket] = ios;
        if c["class"] != job.class {
            failures.push(format!(
                "{}: class {} (want {})",
                job.name, c["class"], job.class
            ));
        }
        if (read - job.read_fraction).abs() > 0.03 {
            failures.push(format!(
                "{}: read fraction {read:.3} (want {})",
                job.name, job.read_fraction
            ));
        }
        if seq < job.sequential.0 || seq > job.sequential.1 {
            failures.push(format!(
                "{}: sequential fraction {seq:.3} (want {:?})",
                job.name, job.sequential
            ));
        }
        if sizes != want_sizes {
            failures.push(format!(
                "{}: sizes {sizes:?} (want all {ios} in bucket {})",
                job.name, job.size_bucket
            ));
        }
        if ios < 100 {
            failures.push(format!("{}: only {ios} requests measured", job.name));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
