//! What decides a latency service's per-cycle verdict under a capped aggressor: read from
//! recorded events (`--json` files, e.g. the scenario benchmark's `--events-dir`).
//!
//! A cycle's p99.9 over N requests is its ceil(N/1000)-th slowest. When the victim's slow
//! requests come in a cluster (one per burst the throttle lets through), the verdict is
//! whether the cluster's size reached that rank, not how far its latency is from the
//! target. Per rate the aggressor (the busiest service without a latency target) ran at,
//! in 50 MB/s bins, this prints the victim's requests at or over its target per cycle, the
//! rank, the share of cycles over, and the share a Poisson count of that mean would put
//! over (a count steadier than Poisson is overpredicted). By rate, not by cap: a static
//! cap set by hand (the benchmark's `static` mode) is not in the agent's records.
//!
//!   cargo run --release -p isolator-benches --bin tail-count -- FILE.ndjson...

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use isolator::config::{LatencyQuantile, SloClass};
use isolator::replay::Recording;
use isolator_common::histogram::bucket_lower_ns;

const BIN_MBPS: u64 = 50;
/// Rates from here up are one bin: an uncapped aggressor's.
const TOP_BIN_MBPS: u64 = 1000;

#[derive(Default)]
struct Bin {
    cycles: u64,
    over_target: u64,
    rank: u64,
    cycles_over: u64,
    poisson_over: f64,
}

/// P(X >= k) for X ~ Poisson(mean).
fn poisson_at_least(mean: f64, k: u64) -> f64 {
    let (mut below, mut term) = (0.0, (-mean).exp());
    for j in 0..k {
        below += term;
        term *= mean / (j + 1) as f64;
    }
    (1.0 - below).max(0.0)
}

fn main() -> anyhow::Result<()> {
    let files: Vec<String> = std::env::args().skip(1).collect();
    if files.is_empty() {
        anyhow::bail!("no events file: give one or more --json files, e.g. /var/tmp/runBW/writer-adaptive-run1.ndjson");
    }
    // Per (victim, target in ms, rate bin): the sums, and each cycle's rank, for the
    // Poisson share from the bin's mean once all cycles are in.
    let mut bins: BTreeMap<(String, u64, u64), (Bin, Vec<u64>)> = BTreeMap::new();
    for file in &files {
        let rec = Recording::read(Path::new(file)).with_context(|| format!("reading {file}"))?;
        for input in rec.runs.iter().flat_map(|r| &r.inputs) {
            for d in &input.devices {
                let Some(aggressor_bps) = d
                    .services
                    .iter()
                    .filter(|s| !matches!(s.class, SloClass::Latency(_)))
                    .map(|s| s.bps() as u64)
                    .max()
                    .filter(|&bps| bps > 0)
                else {
                    continue;
                };
                for v in &d.services {
                    // The rank below is the p99.9's.
                    let SloClass::Latency(target) = v.class else {
                        continue;
                    };
                    if target.quantile != LatencyQuantile::P999 {
                        continue;
                    }
                    if v.samples == 0 {
                        continue;
                    }
                    let over: u64 = v
                        .latency_hist
                        .iter()
                        .filter(|&&(b, _)| bucket_lower_ns(b as usize) >= target.target_ns)
                        .map(|&(_, n)| n)
                        .sum();
                    let rank = v.samples.div_ceil(1000);
                    let key = (
                        v.name.clone(),
                        target.target_ns / 1_000_000,
                        (aggressor_bps / 1_000_000 / BIN_MBPS * BIN_MBPS).min(TOP_BIN_MBPS),
                    );
                    let (bin, ranks) = bins.entry(key).or_default();
                    bin.cycles += 1;
                    bin.over_target += over;
                    bin.rank += rank;
                    bin.cycles_over += u64::from(over >= rank);
                    ranks.push(rank);
                }
            }
        }
    }
    println!("| victim (target) | aggressor's rate, MB/s | cycles | requests at or over the target per cycle | p99.9's rank | cycles over | Poisson's share over |");
    println!("|---|---|---|---|---|---|---|");
    for ((victim, target_ms, mbps), (bin, ranks)) in &mut bins {
        let mean = bin.over_target as f64 / bin.cycles as f64;
        bin.poisson_over = ranks
            .iter()
            .map(|&r| poisson_at_least(mean, r))
            .sum::<f64>()
            / bin.cycles as f64;
        let rates = if *mbps == TOP_BIN_MBPS {
            format!("{TOP_BIN_MBPS} and more")
        } else {
            format!("{mbps}-{}", *mbps + BIN_MBPS)
        };
        println!(
            "| {victim} ({target_ms} ms) | {rates} | {} | {mean:.1} | {:.1} | {:.0} % | {:.0} % |",
            bin.cycles,
            bin.rank as f64 / bin.cycles as f64,
            100.0 * bin.cycles_over as f64 / bin.cycles as f64,
            100.0 * bin.poisson_over,
        );
    }
    Ok(())
}
