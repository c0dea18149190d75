//! End-to-end overhead benchmark (root): fio 4 KiB random reads at the disk's maximum
//! IOPS, alternating in one run between no tracer, `isolator run` and bpftrace running the
//! classic per-disk biolatency histogram; then the per-event cost of each eBPF program from
//! the kernel's BPF stats (enabled only for that phase). Prints a markdown report.
//!
//!   cargo run --release -p isolator-benches -- [--rounds 4] [--seconds 8]

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use serde_json::Value;

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

fn fio_iops(file: &Path, seconds: u64) -> Result<f64> {
    let out = Command::new("fio")
        .args([
            "--name=bench",
            "--rw=randread",
            "--bs=4k",
            "--direct=1",
            "--ioengine=io_uring",
            "--iodepth=64",
            "--numjobs=2",
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
    v["jobs"][0]["read"]["iops"]
        .as_f64()
        .context("fio json has no iops")
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

/// One fio run under a tracer: IOPS, and the tracer's own CPU as a share of one core.
fn measure(tracer: Tracer, data: &Path, seconds: u64) -> Result<(f64, f64, Tracer)> {
    const USER_HZ: f64 = 100.0; // Linux/x86_64
    let pid = tracer.child.id();
    let c0 = cpu_ticks(pid);
    let start = Instant::now();
    let iops = fio_iops(data, seconds)?;
    let cpu = (cpu_ticks(pid) - c0) as f64 / USER_HZ / start.elapsed().as_secs_f64();
    Ok((iops, cpu, tracer))
}

impl Tracer {
    fn isolator(dir: &Path) -> Result<Self> {
        let events = dir.join("events.ndjson");
        let _ = std::fs::remove_file(&events);
        let child = Command::new(isolator())
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

    fn bpftrace(dir: &Path) -> Result<Self> {
        let script = dir.join("biolatency.bt");
        std::fs::write(&script, BIOLATENCY_BT)?;
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

    let (mut base, mut iso, mut bt) = (vec![], vec![], vec![]);
    let (mut iso_cpu, mut bt_cpu, mut iso_rss, mut iso_hwm) = (vec![], vec![], 0, 0);
    println!("| round | no tracer IOPS | isolator IOPS | bpftrace biolatency IOPS |");
    println!("|---|---|---|---|");
    for r in 1..=rounds {
        let b = fio_iops(&data, seconds)?;
        let (i, cpu, t) = measure(Tracer::isolator(&dir)?, &data, seconds)?;
        iso_cpu.push(cpu);
        iso_rss = iso_rss.max(status_kib(t.child.id(), "VmRSS:"));
        iso_hwm = iso_hwm.max(status_kib(t.child.id(), "VmHWM:"));
        t.stop();
        let (p, cpu, t) = measure(Tracer::bpftrace(&dir)?, &data, seconds)?;
        bt_cpu.push(cpu);
        t.stop();
        println!("| {r} | {b:.0} | {i:.0} | {p:.0} |");
        base.push(b);
        iso.push(i);
        bt.push(p);
    }
    let (mb, mi, mp) = (mean(&base), mean(&iso), mean(&bt));
    println!();
    println!("| mode | mean IOPS | vs no tracer | tracer CPU (share of one core) |");
    println!("|---|---|---|---|");
    println!("| no tracer | {mb:.0} | 100.0 % | - |");
    println!(
        "| isolator | {mi:.0} | {:.1} % | {:.2} % |",
        100.0 * mi / mb,
        100.0 * mean(&iso_cpu)
    );
    println!(
        "| bpftrace biolatency | {mp:.0} | {:.1} % | {:.2} % |",
        100.0 * mp / mb,
        100.0 * mean(&bt_cpu)
    );
    println!();
    println!(
        "isolator RSS at the end of a loaded run: {:.1} MiB (peak {:.1} MiB)",
        iso_rss as f64 / 1024.0,
        iso_hwm as f64 / 1024.0
    );

    // Per-event program cost: bpf stats on for this phase only (~20 ns per run of cost).
    std::fs::write("/proc/sys/kernel/bpf_stats_enabled", "1")?;
    let t = Tracer::isolator(&dir)?;
    let events_path = t.events.clone().unwrap();
    let cycle_programs = || -> Vec<Value> {
        std::fs::read_to_string(&events_path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|e| e["type"] == "cycle_end")
            .collect()
    };
    std::thread::sleep(Duration::from_millis(1500));
    let before = cycle_programs().last().cloned();
    let iops = fio_iops(&data, seconds)?;
    std::thread::sleep(Duration::from_millis(1500));
    let after = cycle_programs().last().cloned();
    t.stop();
    std::fs::write("/proc/sys/kernel/bpf_stats_enabled", "0")?;
    if mounted_tracefs {
        let _ = Command::new("umount").arg("/sys/kernel/tracing").status();
    }
    // The benchmark's data file is 1 GiB: leave nothing behind.
    let _ = std::fs::remove_dir_all(&dir);
    let (Some(before), Some(after)) = (before, after) else {
        bail!("no cycle_end events with program stats");
    };
    println!();
    println!(
        "Per-event cost (kernel.bpf_stats_enabled=1 during a {seconds} s run at {iops:.0} IOPS):"
    );
    println!();
    println!("| program | runs | ns per run |");
    println!("|---|---|---|");
    let progs = |e: &Value| e["programs"].as_array().cloned().unwrap_or_default();
    for (a, b) in progs(&after).iter().zip(progs(&before).iter()) {
        let runs = a["run_cnt"].as_u64().unwrap_or(0) - b["run_cnt"].as_u64().unwrap_or(0);
        let ns = a["run_time_ns"].as_u64().unwrap_or(0) - b["run_time_ns"].as_u64().unwrap_or(0);
        println!(
            "| {} | {runs} | {:.0} |",
            a["name"].as_str().unwrap_or("?"),
            ns as f64 / runs.max(1) as f64
        );
    }
    Ok(())
}
