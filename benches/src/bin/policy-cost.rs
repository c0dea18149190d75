//! The control policy's cost per cycle at host scale: what `decide` takes for one device's
//! cycle when hundreds to thousands of services share the disk and many of them are
//! capped. The policy runs on the simulated disk of its unit tests (isolator's `sim`
//! feature), so every size sees the same deterministic run: a tenth of the services are
//! QD1 readers with a 5 ms p99.9 target, a tenth are writers with a rate target, the rest
//! best-effort writers (half from cycle 0, half arriving at cycle 40 and going on/off,
//! 30 cycles on, 20 off, so caps are cut, probed, lifted and set again). Together the
//! writers offer 3 GB/s, far over the disk's knee: four heavy best-effort writers 80 % of
//! it, the light ones (the rated among them) the rest. Only `decide` and `findings` are timed,
//! not the simulator. Sizes alternate in order round by round (forward, then backward).
//!
//!   cargo run --release -p isolator-benches --bin policy-cost -- \
//!     [--services 10,100,1000,3000] [--cycles 200] [--rounds 3] [--policy adaptive]

use std::time::Instant;

use anyhow::{bail, Context, Result};
use isolator::{
    config::SloClass,
    policy::{
        by_name,
        sim::{SimDisk, SimService},
        Decision,
    },
};

/// All writers together offer this, MB/s: 1.5 times the simulated disk's capacity.
const OFFERED_MBPS: f64 = 3000.0;
const SLO_MS: f64 = 5.0;
const HEAVY_WRITERS: usize = 4;

/// One size's run: per-cycle times and what the policy did.
struct SizeRun {
    cycle_ns: Vec<u64>,
    decisions: usize,
    findings: usize,
    capped_at_end: usize,
    latency_cycles: u64,
    latency_cycles_over: u64,
    /// The services without a latency target, their rate summed per cycle, MB/s.
    others_mbps: Vec<f64>,
}

/// How many services of each kind a size has.
struct Composition {
    latency: usize,
    rated: usize,
    best_effort: usize,
}

impl Composition {
    fn of(n: usize) -> Self {
        let latency = (n / 10).max(1);
        let rated = n / 10;
        Composition {
            latency,
            rated,
            best_effort: n - latency - rated,
        }
    }
}

fn services(n: usize) -> Vec<SimService> {
    // The simulator names services with 'static strs (the tests' literals); a short-lived
    // benchmark process leaks a few thousand names per run.
    let name = |kind: &str, i: usize| -> &'static str {
        Box::leak(format!("{kind}-{i}").into_boxed_str())
    };
    let Composition {
        latency,
        rated,
        best_effort,
    } = Composition::of(n);
    // Four heavy writers offer most of the load; the many light ones share the rest (each
    // under the policy's 5 % bar for a candidate, cut as one group: see BENCHMARKS.md).
    let heavy = best_effort.min(HEAVY_WRITERS);
    let light = best_effort - heavy;
    let heavy_mbps = if light == 0 {
        OFFERED_MBPS
    } else {
        OFFERED_MBPS * 0.8
    };
    let light_mbps = OFFERED_MBPS - heavy_mbps;
    let each_light = light_mbps / (rated + light).max(1) as f64;
    let mut v = Vec::with_capacity(n);
    for i in 0..latency {
        v.push(SimService::latency(name("db", i), SLO_MS, 1.0));
    }
    for i in 0..rated {
        // A rate target under what it offers: it can be met while the others are cut.
        v.push(SimService::throughput(
            name("ingest", i),
            each_light / 2.0,
            each_light,
        ));
    }
    for i in 0..best_effort {
        let arriving = i % 2 == 1;
        let mbps = if i < heavy {
            heavy_mbps / heavy as f64
        } else {
            each_light
        };
        let mut w = SimService::writer(
            name("batch", i),
            SloClass::BestEffort,
            mbps,
            if arriving { 40 } else { 0 },
        );
        if arriving {
            w.on_off = Some((30, 20));
        }
        v.push(w);
    }
    v
}

fn run_size(policy: &str, n: usize, cycles: u64) -> Result<SizeRun> {
    let mut p = by_name(policy, 0.75).with_context(|| {
        format!(
            "--policy: unknown policy {policy}; use one of {:?}",
            isolator::policy::POLICY_NAMES
        )
    })?;
    let mut disk = SimDisk::new(services(n));
    disk.noise_seed = Some(17);
    let mut run = SizeRun {
        cycle_ns: Vec::with_capacity(cycles as usize),
        decisions: 0,
        findings: 0,
        capped_at_end: 0,
        latency_cycles: 0,
        latency_cycles_over: 0,
        others_mbps: Vec::with_capacity(cycles as usize),
    };
    for _ in 0..cycles {
        let cycle = disk.step();
        for s in cycle.services.iter().filter(|s| s.slo_ns().is_some()) {
            run.latency_cycles += 1;
            run.latency_cycles_over += u64::from(s.violating());
        }
        let others: f64 = cycle
            .services
            .iter()
            .filter(|s| s.slo_ns().is_none())
            .map(|s| s.bps())
            .sum();
        run.others_mbps.push(others / 1e6);
        let t = Instant::now();
        let decisions: Vec<Decision> = p.decide(&cycle);
        let findings = p.findings();
        run.cycle_ns.push(t.elapsed().as_nanos() as u64);
        run.findings += findings.len();
        run.decisions += decisions.len();
        disk.apply(&decisions);
    }
    run.capped_at_end = disk
        .services
        .iter()
        .filter(|s| s.limit != Default::default())
        .count();
    Ok(run)
}

fn positive(v: &str, flag: &str, example: &str) -> Result<usize> {
    v.parse()
        .ok()
        .filter(|&n| n > 0)
        .with_context(|| format!("{flag}: {v:?} is not a positive number; e.g. {flag} {example}"))
}

fn quantile(sorted: &[u64], q: f64) -> u64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn main() -> std::process::ExitCode {
    // One line naming the cause, whatever RUST_BACKTRACE says.
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("policy-cost: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let mut sizes: Vec<usize> = vec![10, 100, 1000, 3000];
    let mut cycles = 200u64;
    let mut rounds = 3usize;
    let mut policy = "adaptive".to_string();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().with_context(|| format!("{a}: missing value"));
        match a.as_str() {
            "--services" => {
                sizes = val()?
                    .split(',')
                    .map(|x| x.trim().parse::<usize>().ok().filter(|&n| n >= 2))
                    .collect::<Option<_>>()
                    .context(
                        "--services: a list of service counts of at least 2, e.g. 10,100,1000",
                    )?
            }
            "--cycles" => cycles = positive(val()?, "--cycles", "200")? as u64,
            "--rounds" => rounds = positive(val()?, "--rounds", "3")?,
            "--policy" => policy = val()?.clone(),
            other => bail!(
                "unknown argument {other}; use --services N,N.. --cycles N --rounds N --policy NAME"
            ),
        }
    }
    let mut pooled: Vec<Vec<u64>> = vec![vec![]; sizes.len()];
    let mut last: Vec<Option<SizeRun>> = (0..sizes.len()).map(|_| None).collect();
    for round in 0..rounds {
        let order: Vec<usize> = if round % 2 == 0 {
            (0..sizes.len()).collect()
        } else {
            (0..sizes.len()).rev().collect()
        };
        for i in order {
            let run = run_size(&policy, sizes[i], cycles)?;
            pooled[i].extend(&run.cycle_ns);
            last[i] = Some(run);
        }
    }
    println!(
        "policy `{policy}`, {cycles} cycles per size, {rounds} rounds pooled; writers offer {OFFERED_MBPS} MB/s\n"
    );
    println!("| services (latency / rated / best-effort) | decide p50 | p99 | max | p50 per service | decisions per run | findings per run | capped at the end | latency services' cycles over the SLO | the others' mean rate |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for (i, &n) in sizes.iter().enumerate() {
        let mut t = std::mem::take(&mut pooled[i]);
        t.sort_unstable();
        let run = last[i].take().expect("every size ran");
        let kinds = Composition::of(n);
        let us = |ns: u64| format!("{:.1} µs", ns as f64 / 1e3);
        println!(
            "| {n} ({} / {} / {}) | {} | {} | {} | {:.0} ns | {} | {} | {} | {:.1} % | {:.0} MB/s |",
            kinds.latency,
            kinds.rated,
            kinds.best_effort,
            us(quantile(&t, 0.5)),
            us(quantile(&t, 0.99)),
            us(*t.last().expect("at least one cycle")),
            quantile(&t, 0.5) as f64 / n as f64,
            run.decisions,
            run.findings,
            run.capped_at_end,
            100.0 * run.latency_cycles_over as f64 / run.latency_cycles.max(1) as f64,
            run.others_mbps.iter().sum::<f64>() / run.others_mbps.len().max(1) as f64,
        );
    }
    Ok(())
}
