//! End-to-end overhead benchmark (root): fio 4 KiB random reads at the disk's maximum
//! IOPS, alternating in one run between no tracer, the cheapest possible program (a
//! bpftrace per-CPU count at block_rq_complete), bpftrace running the classic biolatency
//! histogram, and `isolator run`. Per mode: IOPS, the tracer's CPU, and the kernel's BPF
//! stats of the tracer's own programs (found by id) divided by the requests fio completed:
//! ns per request. kernel.bpf_stats_enabled is 1 for the whole run (every traced mode pays
//! its ~20 ns per program run alike) and put back after. Prints a markdown report.
//!
//!   cargo run --release -p isolator-benches -- [--rounds 4] [--seconds 8]

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use serde_json::Value;

const FLOOR_BT: &str = "tracepoint:block:block_rq_complete { @c = count(); }\n";

const BIOLATENCY_BT: &str = r#"
tracepoint:block:block_rq_issue { @start[args->dev, args->sector] = nsecs; }
tracepoint:block:block_rq_complete /@start[args->dev, args->sector]/ {
  @usecs[args->dev] = hist((nsecs - @start[args->dev, args->sector]) / 1000);
  delete(@start[args->dev, args->sector]);
}
"#;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn isolator() -> PathBuf {
    root().join("target/x86_64-unknown-linux-musl/release/isolator")
}

/// IOPS and completed requests of one fio run.
fn fio_iops(file: &Path, seconds: u64) -> Result<(f64, u64)> {
    let out = Command::new("fio")
        .args([
            "--name=bench",
            "--rw=randread",
            "--bs=4k",
            "--direct=1",
            "--ioengine=io_uring",
            "--iodepth=64",
            &format!(
                "--numjobs={}",
                std::env::var("BENCH_FIO_JOBS").unwrap_or("2".into())
            ),
            "--group_reporting",
            "--time_based",
            "--size=1g",
            "--output-format=json",
        ])
        .arg(format!("--filename={}", file.display()))
        .arg(format!("--runtime={seconds}"))
        .output()
        .context("running fio")?;
    if !out.status.success() {
        bail!("fio failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let v: Value = serde_json::from_slice(&out.stdout)?;
    let read = &v["jobs"][0]["read"];
    Ok((
        read["iops"].as_f64().context("fio json has no iops")?,
        read["total_ios"]
            .as_u64()
            .context("fio json has no total_ios")?,
    ))
}

use isolator::collect::probe::{loaded_programs as prog_stats, LoadedProgram as ProgStat};

/// Run time and runs per program name of the programs loaded after `first_id`, between two
/// snapshots.
fn prog_delta(before: &[ProgStat], after: &[ProgStat], first_id: u32) -> Vec<(String, u64, u64)> {
    after
        .iter()
        .filter(|p| p.id > first_id)
        .map(|a| {
            let b = before.iter().find(|b| b.id == a.id);
            (
                a.name.clone(),
                a.run_cnt - b.map_or(0, |b| b.run_cnt),
                a.run_time_ns - b.map_or(0, |b| b.run_time_ns),
            )
        })
        .collect()
}

/// utime + stime of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(") ").map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let n = |i: usize| f.get(i).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
    n(11) + n(12)
}

fn status_kib(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

struct Tracer {
    child: Child,
    events: Option<PathBuf>,
}

/// Waits until `path` contains `needle` (a tracer's "ready" line).
fn wait_for_text(path: &Path, needle: &str, timeout: Duration, what: &str) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while !std::fs::read_to_string(path)
        .unwrap_or_default()
        .contains(needle)
    {
        if Instant::now() > deadline {
            bail!("{what} did not start within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// One fio run under a tracer (or none).
struct Measured {
    iops: f64,
    /// The tracer's CPU as a share of one core.
    cpu: f64,
    /// Kernel run time of the tracer's programs per request fio completed.
    ns_per_request: f64,
    /// Per program: (name, runs, ns per run).
    programs: Vec<(String, u64, f64)>,
    rss_kib: u64,
}

fn measure(tracer: Option<Tracer>, first_id: u32, data: &Path, seconds: u64) -> Result<Measured> {
    const USER_HZ: f64 = 100.0; // Linux/x86_64
    let pid = tracer.as_ref().map(|t| t.child.id());
    let c0 = pid.map_or(0, cpu_ticks);
    let p0 = prog_stats();
    let start = Instant::now();
    let (iops, ios) = fio_iops(data, seconds)?;
    let p1 = prog_stats();
    let cpu = pid.map_or(0.0, |p| {
        (cpu_ticks(p) - c0) as f64 / USER_HZ / start.elapsed().as_secs_f64()
    });
    let rss_kib = pid.map_or(0, |p| status_kib(p, "VmRSS:"));
    if let Some(t) = tracer {
        t.stop();
    }
    let delta = prog_delta(&p0, &p1, first_id);
    let total_ns: u64 = delta.iter().map(|d| d.2).sum();
    Ok(Measured {
        iops,
        cpu,
        ns_per_request: total_ns as f64 / ios.max(1) as f64,
        programs: delta
            .into_iter()
            .filter(|d| d.1 > 0)
            .map(|(n, runs, ns)| (n, runs, ns as f64 / runs.max(1) as f64))
            .collect(),
        rss_kib,
    })
}

impl Tracer {
    fn isolator(dir: &Path, binary: &Path) -> Result<Self> {
        let events = dir.join("events.ndjson");
        let _ = std::fs::remove_file(&events);
        let child = Command::new(binary)
            .args(["run", "--interval", "1s", "--json"])
            .arg(&events)
            .stdout(Stdio::null())
            .spawn()
            .context("starting isolator (cargo xtask build first)")?;
        wait_for_text(&events, "agent_start", Duration::from_secs(30), "isolator")?;
        Ok(Tracer {
            child,
            events: Some(events),
        })
    }

    fn bpftrace(dir: &Path, script_text: &str) -> Result<Self> {
        let script = dir.join("tracer.bt");
        std::fs::write(&script, script_text)?;
        let log = dir.join("bpftrace.out");
        let child = Command::new("bpftrace")
            .arg(&script)
            .stdout(std::fs::File::create(&log)?)
            .stderr(Stdio::null())
            .spawn()
            .context("starting bpftrace")?;
        wait_for_text(&log, "Attaching", Duration::from_secs(60), "bpftrace")?;
        std::thread::sleep(Duration::from_millis(500));
        Ok(Tracer {
            child,
            events: None,
        })
    }

    fn stop(mut self) -> Option<PathBuf> {
        // SAFETY: plain kill(2) on our child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let _ = self.child.wait();
        self.events.take()
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

fn main() -> Result<()> {
    let mut rounds = 4;
    let mut seconds = 8;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--rounds" => rounds = it.next().context("--rounds N")?.parse()?,
            "--seconds" => seconds = it.next().context("--seconds N")?.parse()?,
            _ => bail!("usage: isolator-benches [--rounds N] [--seconds N]"),
        }
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the benchmark loads eBPF: run it as root");
    }
    let dir = PathBuf::from("/var/tmp/isolator-bench");
    std::fs::create_dir_all(&dir)?;
    let data = dir.join("data");
    if std::fs::metadata(&data).map(|m| m.len()).unwrap_or(0) < 1 << 30 {
        let ok =
            Command::new(root().join("target/x86_64-unknown-linux-musl/release/isolator-loadgen"))
                .args([
                    "--op",
                    "write",
                    "--bytes",
                    "1073741824",
                    "--bs",
                    "1048576",
                    "--direct",
                    "--threads",
                    "4",
                    "--path",
                ])
                .arg(&data)
                .status()?
                .success();
        if !ok {
            bail!("could not write {}", data.display());
        }
    }
    let mounted_tracefs = !Path::new("/sys/kernel/tracing/events").exists();
    if mounted_tracefs {
        Command::new("mount")
            .args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"])
            .status()?;
    }

    let stats_before = std::fs::read_to_string(STATS_SYSCTL)?;
    std::fs::write(STATS_SYSCTL, "1")?;
    let result = run_modes(&dir, &data, rounds, seconds);
    let _ = std::fs::write(STATS_SYSCTL, stats_before.trim());
    if mounted_tracefs {
        let _ = Command::new("umount").arg("/sys/kernel/tracing").status();
    }
    // The benchmark's data file is 1 GiB: leave nothing behind.
    let _ = std::fs::remove_dir_all(&dir);
    result
}

const STATS_SYSCTL: &str = "/proc/sys/kernel/bpf_stats_enabled";

const MODES: [&str; 5] = [
    "no tracer",
    "floor: bpftrace count()",
    "bpftrace biolatency",
    "isolator",
    "isolator (BENCH_BASELINE_ISOLATOR)",
];

/// An older build of the agent to measure side by side with this one (the baseline mode
/// runs only when it is set).
fn baseline_isolator() -> Option<PathBuf> {
    std::env::var_os("BENCH_BASELINE_ISOLATOR").map(PathBuf::from)
}

/// BENCH_MODES=1,3 runs only those modes (indexes into MODES), for quick comparisons.
fn skip(mode: usize) -> bool {
    (mode == 4 && baseline_isolator().is_none())
        || std::env::var("BENCH_MODES")
            .is_ok_and(|m| !m.split(',').any(|x| x.trim() == mode.to_string()))
}

fn run_modes(dir: &Path, data: &Path, rounds: usize, seconds: u64) -> Result<()> {
    let mut results: Vec<Vec<Measured>> = (0..MODES.len()).map(|_| vec![]).collect();
    let shown: Vec<String> = (0..MODES.len())
        .filter(|&i| !skip(i))
        .map(|i| format!("{} IOPS (ns/request)", MODES[i]))
        .collect();
    println!("| round | {} |", shown.join(" | "));
    println!("|---|{}", "---|".repeat(shown.len()));
    for r in 1..=rounds {
        let mut row = vec![];
        for (i, mode) in MODES.iter().enumerate() {
            if skip(i) {
                results[i].push(Measured {
                    iops: 1.0,
                    cpu: 0.0,
                    ns_per_request: 1.0,
                    programs: vec![],
                    rss_kib: 0,
                });
                continue;
            }
            let first_id = prog_stats().iter().map(|p| p.id).max().unwrap_or(0);
            let tracer = match i {
                0 => None,
                1 => Some(Tracer::bpftrace(dir, FLOOR_BT)?),
                2 => Some(Tracer::bpftrace(dir, BIOLATENCY_BT)?),
                3 => Some(Tracer::isolator(dir, &isolator())?),
                _ => Some(Tracer::isolator(dir, &baseline_isolator().unwrap())?),
            };
            let m = measure(tracer, first_id, data, seconds)
                .with_context(|| format!("round {r}, {mode}"))?;
            row.push(format!("{:.0} ({:.0})", m.iops, m.ns_per_request));
            results[i].push(m);
        }
        println!("| {r} | {} |", row.join(" | "));
    }
    let base = mean(&results[0].iter().map(|m| m.iops).collect::<Vec<_>>());
    let floor = mean(
        &results[1]
            .iter()
            .map(|m| m.ns_per_request)
            .collect::<Vec<_>>(),
    );
    println!();
    println!("| mode | mean IOPS | vs no tracer | ns per request | vs floor | tracer CPU (share of one core) |");
    println!("|---|---|---|---|---|---|");
    for (i, mode) in MODES.iter().enumerate() {
        let iops = mean(&results[i].iter().map(|m| m.iops).collect::<Vec<_>>());
        let ns = mean(
            &results[i]
                .iter()
                .map(|m| m.ns_per_request)
                .collect::<Vec<_>>(),
        );
        let cpu = mean(&results[i].iter().map(|m| m.cpu).collect::<Vec<_>>());
        if skip(i) {
            continue;
        }
        let vs_none = if skip(0) {
            "-".to_string()
        } else {
            format!("{:.1} %", 100.0 * iops / base)
        };
        if i == 0 {
            println!("| {mode} | {iops:.0} | 100.0 % | - | - | - |");
        } else {
            println!(
                "| {mode} | {iops:.0} | {vs_none} | {ns:.0} | {:.2}x | {:.2} % |",
                ns / floor,
                100.0 * cpu
            );
        }
    }
    println!();
    for (i, name) in [(3, "isolator"), (4, "the baseline isolator")] {
        if skip(i) {
            continue;
        }
        programs_table(name, &results[i]);
    }
    let iso = &results[3];
    println!(
        "isolator RSS at the end of a loaded run: {:.1} MiB",
        iso.iter().map(|m| m.rss_kib).max().unwrap_or(0) as f64 / 1024.0
    );
    Ok(())
}

/// Per program of a mode: runs per round and ns per run, means over the rounds.
fn programs_table(name: &str, iso: &[Measured]) {
    println!("{name}'s programs (mean over rounds):");
    println!();
    println!("| program | runs per round | ns per run |");
    println!("|---|---|---|");
    let mut names: Vec<String> = iso
        .iter()
        .flat_map(|m| m.programs.iter().map(|p| p.0.clone()))
        .collect();
    names.sort();
    names.dedup();
    for n in names {
        let runs: Vec<f64> = iso
            .iter()
            .flat_map(|m| m.programs.iter().filter(|p| p.0 == n).map(|p| p.1 as f64))
            .collect();
        let ns: Vec<f64> = iso
            .iter()
            .flat_map(|m| m.programs.iter().filter(|p| p.0 == n).map(|p| p.2))
            .collect();
        println!("| {n} | {:.0} | {:.0} |", mean(&runs), mean(&ns));
    }
    println!();
}
