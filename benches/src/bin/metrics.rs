//! The metrics endpoint's cost (issue 15). Two modes, each printing a markdown table:
//!
//! `scrape`: synthetic state through the real module and server, in this process: the
//! exporter is fed cycles of N (cgroup, disk) pairs, sized for about 1,000 and 20,000
//! series, and scraped back to back. Per size: the series and bytes of the exposition, the
//! agent-side work per cycle (adding the cycle and rendering both formats), scrape latency
//! (p50, p99, max) per format, and the server thread's CPU per scrape (its schedstat).
//!
//! `cycle` (root): the real agent (`isolator run --metrics`), its cycle work
//! (`cycle_end.collect_us`) and CPU with no scraper and with a flood of scrapers (back to
//! back, from several threads), alternating; the agent's extra CPU per scrape.
//!
//!   cargo run --release -p isolator-benches --bin metrics -- scrape [--series 1000,20000] [--scrapes 300]
//!   cargo run --release -p isolator-benches --bin metrics -- cycle [--seconds 20] [--rounds 2] [--scrapers 4]

use std::{
    io::{Read, Write},
    net::TcpStream,
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use isolator::{
    collect::collector::{KeyDelta, LatencyDelta, Snapshot},
    events::{CgroupRef, CgroupStats, DeviceStats, Event},
    identify::naming::ServiceKind,
    prometheus::{
        model::{CycleInput, CGROUP_SERIES},
        server::{parse_address, MetricsListener},
        Exporter, Settings,
    },
};
use isolator_common::{kernel_dev, latency_bucket, IoKey, Latencies, OP_READ, OP_WRITE};
use rand::{rngs::StdRng, Rng, SeedableRng};

const OPENMETRICS: &str = "application/openmetrics-text;version=1.0.0";

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let r = match args.first().map(String::as_str) {
        Some("scrape") => scrape_mode(&args),
        Some("cycle") => cycle_mode(&args),
        _ => {
            eprintln!("usage: metrics scrape [--series 1000,20000] [--scrapes N] | metrics cycle [--seconds N] [--rounds N] [--scrapers N]");
            return std::process::ExitCode::from(2);
        }
    };
    match r {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("metrics: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn flag(args: &[String], name: &str) -> Option<String> {
    let i = args.iter().position(|a| a == name)?;
    args.get(i + 1).cloned()
}

fn number(args: &[String], name: &str, default: u64) -> Result<u64> {
    flag(args, name).map_or(Ok(default), |v| {
        v.parse().with_context(|| format!("{name} {v}"))
    })
}

/// One GET /metrics over a fresh connection (the server serves one request per
/// connection), read to the end: the status and the body's length. Hand-written on a
/// plain socket so that the client adds as little as possible to what is measured.
fn get(addr: &str, accept: Option<&str>) -> Result<(u16, usize)> {
    let mut s = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    let accept = accept
        .map(|a| format!("Accept: {a}\r\n"))
        .unwrap_or_default();
    write!(s, "GET /metrics HTTP/1.1\r\nHost: bench\r\n{accept}\r\n")?;
    let mut buf = Vec::with_capacity(1 << 20);
    s.read_to_end(&mut buf)?;
    let head_end = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("no end of headers")?;
    let status = std::str::from_utf8(&buf[..head_end])?
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("no status")?;
    Ok((status, buf.len() - head_end - 4))
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// On-CPU time of this process's thread named `name`, ns (its schedstat).
fn thread_cpu_ns(name: &str) -> Result<u64> {
    for t in std::fs::read_dir("/proc/self/task")? {
        let dir = t?.path();
        if std::fs::read_to_string(dir.join("comm"))?.trim() == name {
            let s = std::fs::read_to_string(dir.join("schedstat"))?;
            return s
                .split_whitespace()
                .next()
                .and_then(|v| v.parse().ok())
                .context("schedstat");
        }
    }
    bail!("no thread named {name}")
}

// ---------------------------------------------------------------------------------------
// scrape: synthetic state through the real exporter

/// A cycle of `pairs` containers, each reading one disk: a few hundred requests with a
/// spread of latencies, so that their histograms fill many buckets.
fn synthetic_cycle(rng: &mut StdRng, cycle: u64, pairs: u64) -> (Snapshot, Vec<Event>) {
    let dev = kernel_dev(259, 0);
    let mut deltas = Vec::new();
    let mut names = Vec::new();
    for i in 0..pairs {
        let id = 10_000 + i;
        let n = rng.gen_range(100..1000);
        let lat = |rng: &mut StdRng, scale: f64| {
            let mut hist: Vec<(u16, u64)> = Vec::new();
            let mut sum = 0;
            for _ in 0..n {
                let ns = (scale * (-(1.0 - rng.gen::<f64>()).ln() + 0.2)) as u64;
                sum += ns;
                hist.push((latency_bucket(ns) as u16, 1));
            }
            hist.sort_unstable();
            hist.dedup_by(|a, b| {
                let same = a.0 == b.0;
                if same {
                    b.1 += a.1;
                }
                same
            });
            LatencyDelta {
                count: n,
                sum_ns: sum,
                hist,
            }
        };
        let device = lat(rng, 300_000.0);
        let queue = lat(rng, 20_000.0);
        let total = lat(rng, 330_000.0);
        deltas.push(KeyDelta {
            key: IoKey {
                cgroup_id: id,
                dev,
                op: if i % 5 == 0 { OP_WRITE } else { OP_READ },
            },
            ios: n,
            bytes: n * 4096,
            latency: Latencies {
                device,
                queue,
                total,
            },
            issued: true,
            ..Default::default()
        });
        let cid = format!("{:064x}", id.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        names.push(Event::CgroupStats(CgroupStats {
            cycle,
            interval_s: 1.0,
            cgroup: CgroupRef {
                id,
                path: Some(format!("/system.slice/docker-{cid}.scope")),
                kind: ServiceKind::Container,
                name: format!("app-{i}"),
                container_id: Some(cid),
                ..Default::default()
            },
            devices: vec![DeviceStats {
                dev: "259:0".into(),
                disk: Some("nvme0n1".into()),
                ..Default::default()
            }],
            ..Default::default()
        }));
    }
    let snap = Snapshot {
        cycle,
        interval_ns: 1_000_000_000,
        deltas,
        ..Default::default()
    };
    (snap, names)
}

struct ScrapeRow {
    pairs: u64,
    series: usize,
    text_bytes: usize,
    om_bytes: usize,
    cycle_ms: f64,
    export_ms: f64,
    /// (format, p50, p99, max latency ms, CPU per scrape us)
    formats: Vec<(&'static str, f64, f64, f64, f64)>,
}

fn scrape_size(target_series: u64, scrapes: u64) -> Result<ScrapeRow> {
    // One op per pair: two histograms, requests, bytes, queue time and count, mean
    // in flight.
    let per_pair = (CGROUP_SERIES - 5) as u64;
    let pairs = (target_series / per_pair).max(1);
    let listener =
        MetricsListener::bind(&parse_address("127.0.0.1:0").map_err(anyhow::Error::msg)?)?;
    let addr = listener.address().to_string();
    let mut exporter = Exporter::start(
        listener,
        Settings {
            max_series: 10_000_000,
            docker: false,
            containerd: false,
            limits: Default::default(),
        },
    )?;
    let mut rng = StdRng::seed_from_u64(15);
    let mut cycle_s = Vec::new();
    for cycle in 1..=10 {
        let (snap, names) = synthetic_cycle(&mut rng, cycle, pairs);
        let started = Instant::now();
        exporter.cycle(&CycleInput {
            snap: &snap,
            cgroups: &names,
            events: &[],
            collect_ns: 0,
        });
        cycle_s.push(started.elapsed().as_secs_f64());
    }
    let x = exporter.exposition();
    let text = std::str::from_utf8(&x.text)?;
    let series = text.lines().filter(|l| !l.starts_with('#')).count();
    let export_ms = text
        .lines()
        .find_map(|l| l.strip_prefix("isolator_metrics_export_duration_seconds "))
        .and_then(|v| v.parse::<f64>().ok())
        .context("no export duration in the exposition")?
        * 1e3;
    let mut formats = Vec::new();
    for (format, accept) in [("text", None), ("OpenMetrics", Some(OPENMETRICS))] {
        let _ = get(&addr, accept)?; // warm
        let cpu0 = thread_cpu_ns("isolator-http")?;
        let mut lat = Vec::new();
        for _ in 0..scrapes {
            let t = Instant::now();
            let (status, _) = get(&addr, accept)?;
            lat.push(t.elapsed().as_secs_f64() * 1e3);
            if status != 200 {
                bail!("scrape answered {status}");
            }
        }
        let cpu = thread_cpu_ns("isolator-http")? - cpu0;
        lat.sort_by(f64::total_cmp);
        formats.push((
            format,
            percentile(&lat, 0.5),
            percentile(&lat, 0.99),
            *lat.last().unwrap_or(&f64::NAN),
            cpu as f64 / scrapes as f64 / 1e3,
        ));
    }
    // The first cycles build the series; the later ones are the steady cost.
    let steady = &cycle_s[2..];
    Ok(ScrapeRow {
        pairs,
        series,
        text_bytes: x.text.len(),
        om_bytes: x.openmetrics.len(),
        cycle_ms: steady.iter().sum::<f64>() / steady.len() as f64 * 1e3,
        export_ms,
        formats,
    })
}

fn scrape_mode(args: &[String]) -> Result<()> {
    let sizes: Vec<u64> = flag(args, "--series")
        .unwrap_or_else(|| "1000,20000".into())
        .split(',')
        .map(|v| v.trim().parse().with_context(|| format!("--series {v}")))
        .collect::<Result<_>>()?;
    let scrapes = number(args, "--scrapes", 300)?.max(1);
    println!("Synthetic state through the real exporter and server; {scrapes} sequential scrapes per format, one connection each.\n");
    println!("| series | pairs | text / OpenMetrics bytes | agent work per cycle (add + render), as timed here | as the agent says | format | scrape p50 | p99 | max | server CPU per scrape |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for target in sizes {
        let r = scrape_size(target, scrapes)?;
        for (f, p50, p99, max, cpu_us) in &r.formats {
            println!(
                "| {} | {} | {} / {} | {:.2} ms | {:.2} ms | {f} | {p50:.2} ms | {p99:.2} ms | {max:.2} ms | {cpu_us:.0} us |",
                r.series, r.pairs, r.text_bytes, r.om_bytes, r.cycle_ms, r.export_ms
            );
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// cycle: the real agent with and without scrapers

fn cpu_ticks(pid: u32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = stat.rsplit(')').next().context("stat")?;
    let f: Vec<&str> = after.split_whitespace().collect();
    Ok(f[11].parse::<u64>()? + f[12].parse::<u64>()?)
}

struct AgentProc {
    child: Child,
    events: std::path::PathBuf,
    _scratch: isolator_tests::Scratch,
}

impl Drop for AgentProc {
    fn drop(&mut self) {
        // SAFETY: plain kill(2) on our child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

/// cycle_end events so far: (cycle, collect_us).
fn cycle_ends(path: &std::path::Path) -> Vec<(u64, u64)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(r#""type":"cycle_end""#))
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| Some((v["cycle"].as_u64()?, v["collect_us"].as_u64()?)))
        .collect()
}

fn cycle_mode(args: &[String]) -> Result<()> {
    isolator_tests::require_root();
    let seconds = number(args, "--seconds", 20)?.max(3);
    let rounds = number(args, "--rounds", 2)?.max(1);
    let scrapers = number(args, "--scrapers", 4)?.max(1);
    let scratch = isolator_tests::Scratch::new();
    let events = scratch.path("events.ndjson");
    let child = Command::new(isolator_tests::isolator_bin())
        .args([
            "run",
            "--metrics",
            "127.0.0.1:0",
            "--socket",
            "off",
            "--json",
        ])
        .arg(&events)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting isolator run")?;
    let agent = AgentProc {
        child,
        events: events.clone(),
        _scratch: scratch,
    };
    let pid = agent.child.id();
    let deadline = Instant::now() + Duration::from_secs(30);
    let addr = loop {
        let text = std::fs::read_to_string(&agent.events).unwrap_or_default();
        if let Some(a) = text
            .lines()
            .find(|l| l.contains(r#""type":"agent_start""#))
            .and_then(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .and_then(|v| v["metrics"].as_str().map(str::to_string))
        {
            break a;
        }
        if Instant::now() > deadline {
            bail!("the agent did not start");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    std::thread::sleep(Duration::from_secs(3));
    let hz = 100.0; // USER_HZ
    println!("The real agent, alternating {seconds} s without a scraper and {seconds} s with {scrapers} scrapers back to back; cycle work is cycle_end.collect_us.\n");
    println!("| round | scrapers | cycles | cycle work mean | p50 | p99 | max | agent CPU | scrapes/s | agent CPU per scrape |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut idle_cpu_per_s = 0.0;
    for round in 1..=rounds {
        for with in [false, true] {
            let first = cycle_ends(&agent.events).last().map_or(0, |c| c.0);
            let cpu0 = cpu_ticks(pid)?;
            let stop = Arc::new(AtomicBool::new(false));
            let done = Arc::new(AtomicU64::new(0));
            let threads: Vec<_> = (0..if with { scrapers } else { 0 })
                .map(|_| {
                    let (stop, done, addr) = (stop.clone(), done.clone(), addr.clone());
                    std::thread::spawn(move || {
                        while !stop.load(Ordering::Relaxed) {
                            if matches!(get(&addr, Some(OPENMETRICS)), Ok((200, _))) {
                                done.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    })
                })
                .collect();
            let t0 = Instant::now();
            std::thread::sleep(Duration::from_secs(seconds));
            stop.store(true, Ordering::Relaxed);
            for t in threads {
                let _ = t.join();
            }
            let elapsed = t0.elapsed().as_secs_f64();
            let cpu_s = (cpu_ticks(pid)? - cpu0) as f64 / hz;
            let mut work: Vec<f64> = cycle_ends(&agent.events)
                .into_iter()
                .filter(|c| c.0 > first)
                .map(|c| c.1 as f64 / 1e3)
                .collect();
            work.sort_by(f64::total_cmp);
            let scrapes = done.load(Ordering::Relaxed);
            let cpu_per_s = cpu_s / elapsed;
            if !with {
                idle_cpu_per_s = cpu_per_s;
            }
            let per_scrape = if scrapes > 0 {
                format!(
                    "{:.0} us",
                    (cpu_per_s - idle_cpu_per_s).max(0.0) * elapsed / scrapes as f64 * 1e6
                )
            } else {
                "-".into()
            };
            println!(
                "| {round} | {} | {} | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms | {:.1} % | {:.0} | {per_scrape} |",
                if with { scrapers } else { 0 },
                work.len(),
                work.iter().sum::<f64>() / work.len().max(1) as f64,
                percentile(&work, 0.5),
                percentile(&work, 0.99),
                work.last().copied().unwrap_or(f64::NAN),
                cpu_per_s * 100.0,
                scrapes as f64 / elapsed,
            );
        }
    }
    Ok(())
}
