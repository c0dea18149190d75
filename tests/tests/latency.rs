//! For a QD1 random-read fio job, the agent's device latency p50 and p99 are within 15 % of
//! fio's completion latency percentiles and never above them (device time is a part of
//! what fio measures).
//!
//! Method, so that both sides look at the same I/Os:
//! - fio reads a loop device (direct I/O over a file) and only that device is compared:
//!   fio's own buffered reads at start and exit (its binary and ~40 libraries, read ahead,
//!   charged to its cgroup, absent from its stats) go to the disk below, not to the loop
//!   device. A warm-up run did not keep them away: up to 2.2 % extra, slower reads showed
//!   up in the same cgroup and disk and pushed the agent's p99 above fio's;
//! - the agent runs with a 10 s cycle and fio runs inside one cycle, so that cycle's
//!   percentiles cover exactly fio's I/Os;
//! - 512 KiB requests, one request each (128 pages: under max_sectors_kb and the disk's 254
//!   segments), through io_uring with registered buffers and file at QD1. fio's latency
//!   also holds work no block-layer timestamp sees: the syscall, mapping the buffer into a
//!   bio, the wake-up after the interrupt. With psync that was ~15 us per I/O plus the page
//!   pinning, which grows with the request (p99 7-18 % above the device's at 256-512 KiB);
//!   registered buffers are pinned once. fio's io_uring `clat` starts only after the
//!   submission returns, when the request is already on the device, so the comparison is
//!   with fio's total latency per I/O (`lat`, submission to completion), the psync
//!   completion latency's equivalent (measured numbers are in BENCHMARKS.md);
//! - fio polls for its completion (`--iodepth_batch_complete_min=0`) instead of sleeping in
//!   the kernel until it is woken: on a busy or overcommitted VM the wake-up added 200-900 us
//!   to fio's p99 and none to the device's (p99 16-28 % apart, p50 5-9 %); polling, fio's
//!   p50 and p99 came within 0-5 % of the device's.
//!
//! Both sides report bucketed percentiles (ours 1/64, fio 1/64 relative resolution), so
//! "never above" is checked to within that resolution.
//!
//! "Never above", the counts and the p50 within 15 % hold on every run. The p99 within
//! 15 % may take up to three runs: on a busy VM the CPU side (the loop device's
//! completion work, the task work that posts fio's completion) now and then adds a tail
//! no block-layer timestamp sees; CI once had fio's p99 at 1.76 ms and the device's at
//! 1.43 ms (19 % apart, p50 2 %) while the same code on a quiet hour was within 0-3 %. An
//! agent that measured the wrong span would miss on every run.
//!
//! Every fio read must be accounted for: completed with a latency sample, or one of the
//! few this kernel completes without running the completion program (found by the agent
//! in the cycle after fio's, once the disk is quiet, as `untraced_completions`). The
//! untraced may not be more than 1 % of the reads, so the percentiles describe at least
//! 99 % of fio's I/Os.

use std::process::Command;

use isolator_tests::*;

const RESOLUTION: f64 = 1.0 / 64.0 + 1.0 / 64.0;

/// One run's p99, fio's and the agent's, in ns.
struct P99 {
    fio: f64,
    agent: f64,
}

impl P99 {
    /// The bound a CPU-side tail can break on a busy VM; `None` when it holds.
    fn more_than_15_percent_below(&self) -> Option<String> {
        (self.agent < 0.85 * self.fio).then(|| {
            format!(
                "p99: agent {} ns more than 15 % below fio {} ns",
                self.agent, self.fio
            )
        })
    }
}

#[test]
fn qd1_randread_percentiles_match_fio() {
    require_root();
    require_tool("fio");
    let scratch = Scratch::new();
    let file = scratch.path("fio-data");
    make_file(&file, 1 << 30);
    let lo = LoopDevice::over(&file);
    let cg = TestCgroup::new("iso-latency");
    let fio = |runtime: u32, output: &std::path::Path| {
        let script = format!(
            "echo $$ > {}/cgroup.procs && exec fio --name=qd1 --filename={} --rw=randread \
             --bs=512k --direct=1 --ioengine=io_uring --fixedbufs --registerfiles --iodepth=1 --iodepth_batch_complete_min=0 --time_based --runtime={runtime} \
             --size=1g --thread --disk_util=0 --lat_percentiles=1 --clat_percentiles=0 --percentile_list=50:99 --output-format=json \
             --output={}",
            cg.dir.display(),
            lo.path.display(),
            output.display()
        );
        run_ok(Command::new("sh").args(["-c", &script]));
    };
    fio(1, &scratch.path("warmup.json"));

    let mut misses = Vec::new();
    for run in 1..=3 {
        let out_json = scratch.path(&format!("fio-{run}.json"));
        let p99 = measure(&lo, &cg, || fio(7, &out_json), &out_json);
        match p99.more_than_15_percent_below() {
            None => return,
            Some(miss) => {
                eprintln!("run {run}: {miss}");
                misses.push(miss);
            }
        }
    }
    panic!("in each of 3 runs: {}", misses.join("; "));
}

/// Runs fio under an agent with a 10 s cycle and compares the one cycle holding fio's
/// reads with fio's report. Panics unless the counts match and the agent is never above
/// fio and the p50 is within 15 % below it; returns the p99s for their bound.
fn measure(
    lo: &LoopDevice,
    cg: &TestCgroup,
    run_fio: impl Fn(),
    out_json: &std::path::Path,
) -> P99 {
    // In-flight counting lets the agent find completions the kernel ran no tracepoint
    // for (about 1 in 10-20k on this machine's kernel) and say so: the check below
    // accounts for every one of fio's reads.
    let agent = Agent::start(&["--interval", "10s", "--count-inflight"]);
    run_fio();
    // fio's cycle, then an idle one in which untraced completions are found.
    agent.wait_cycles(2);
    let events = agent.events();
    drop(agent);

    let fio: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_json).unwrap()).unwrap();
    let read = &fio["jobs"][0]["read"];
    let lat_pct = &read["lat_ns"]["percentile"];
    let fio_p50 = lat_pct["50.000000"].as_f64().unwrap();
    let fio_p99 = lat_pct["99.000000"].as_f64().unwrap();
    let fio_ios = read["total_ios"].as_u64().unwrap();

    let dev = lo.dev();
    let reads: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["type"] == "cgroup_stats" && e["cgroup"]["id"].as_u64() == Some(cg.id()))
        .filter_map(|e| {
            e["devices"]
                .as_array()?
                .iter()
                .find(|d| d["dev"] == dev.as_str())
                .map(|d| &d["read"])
        })
        .collect();
    let untraced: u64 = reads
        .iter()
        .map(|r| r["untraced_completions"].as_u64().unwrap())
        .sum();
    let cycles: Vec<&&serde_json::Value> = reads
        .iter()
        .filter(|r| r["ios"].as_u64() != Some(0))
        .collect();
    assert_eq!(
        cycles.len(),
        1,
        "fio's run should fall in one 10 s cycle, got {} cycles with reads",
        cycles.len()
    );
    let r = cycles[0];
    let ios = r["ios"].as_u64().unwrap();
    let lat = &r["latency"];
    assert_eq!(
        lat["window_cycles"], 1,
        "percentiles must come from this cycle alone"
    );
    let p50 = lat["p50_ns"].as_f64().unwrap();
    let p99 = lat["p99_ns"].as_f64().unwrap();
    eprintln!(
        "fio: {fio_ios} ios lat p50 {fio_p50} p99 {fio_p99}; agent: {ios} ios + {untraced} untraced, device p50 {p50} p99 {p99}"
    );
    assert!(
        // A few extra reads may come from fio itself.
        ios + untraced >= fio_ios && ios + untraced <= fio_ios + fio_ios / 100,
        "agent counted {ios} reads and {untraced} untraced completions, fio {fio_ios}: not the same I/Os; the agent's loss counters at the end: {}",
        events
            .iter()
            .rev()
            .find(|e| e["type"] == "cycle_end")
            .map(|e| format!(
                "map_full {} unsampled_requests {} missed_events {} preexisting_completions {}",
                e["map_full"], e["unsampled_requests"], e["missed_events"], e["preexisting_completions"]
            ))
            .unwrap_or_default()
    );
    assert!(
        untraced <= fio_ios / 100,
        "{untraced} of {fio_ios} reads completed without the completion program running"
    );
    for (name, agent_v, fio_v) in [("p50", p50, fio_p50), ("p99", p99, fio_p99)] {
        assert!(
            agent_v <= fio_v * (1.0 + RESOLUTION),
            "{name}: agent {agent_v} ns above fio {fio_v} ns"
        );
    }
    // The median is no tail: 15 % below it is the wrong span, on any run.
    assert!(
        p50 >= 0.85 * fio_p50,
        "p50: agent {p50} ns more than 15 % below fio {fio_p50} ns"
    );
    P99 {
        fio: fio_p99,
        agent: p99,
    }
}
