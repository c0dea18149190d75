//! The noisy-neighbor scenario with a real database as the victim (issue 17, scenario 5).
//!
//! PostgreSQL (Debian's package, binaries from /usr/lib/postgresql/<version>/bin) runs a
//! throwaway cluster whose server and backends sit in a blkio cgroup, the `db` service
//! (class latency), and in a v1 memory cgroup limited to 256 MiB while its data is ~1 GB
//! (`pgbench -i -s 64`, shared_buffers 16 MB): most reads miss the page cache and reach the
//! disk. pgbench (in the same blkio cgroup, outside the memory cgroup; it does no disk I/O
//! of its own) runs the built-in select-only transaction at a fixed rate and logs every
//! transaction; its latency counts from when the transaction was scheduled, so a backlog
//! shows. Next to it, after a solo phase, the backup-like writer of the `noisy` scenario
//! (fio, 1 MiB sequential O_DIRECT writes at QD32) runs in the `backup` cgroup
//! (best-effort, 20 MB/s floor).
//!
//! The agent's target for the `db` service is for its block I/O: a share of the transaction
//! SLO (a transaction waits on more than one read, and queues behind slow ones), measured
//! in the run without control as the reads' median cycle over pgbench's p99.9, at most 0.8
//! (`postgres::IoTargetBasis::Uncapped`). That share is measured far from the SLO and comes
//! out low, which a pass/fail on the SLO can afford; the benchmark, which also judges the
//! writer's share, measures it under its static caps instead (`IoTargetBasis::UnderCap`).
//! The verdict is pgbench's own: the p99.9 of the transactions it scheduled in each of ten
//! 2.5 s windows of the steady phase, which starts where every scenario's does (the 11th
//! cycle after the writer starts; `postgres::PHASES`) and ends with the writer. The SLO is
//! derived from pgbench alone on this disk today (4x its p99.9 in the median of thirteen
//! windows: the calibration's three and the ten of the run alone before the first
//! `adaptive` run; at least 5 ms), never hard-coded: without control (the agent in
//! --dry-run) the writer must push most windows above it, or the scenario proves nothing
//! (a run that does not is measured once more: the host's writeback moves how hard the
//! writer hits within minutes, and the second run must);
//! under `adaptive` at most one window in five may be over, the bar the other scenarios
//! hold the agent's cycles to, plus the windows pgbench alone put over it in a run with no
//! writer just before (`postgres::alone_windows_ms`), and that bar must stay under what no
//! control gave. Some, not none: a stall of the disk's own (seen here: 165 ms with the
//! writer capped at 57 MB/s, a fifteenth of what the disk sustains, and 153 ms at a cap
//! that had held for ten cycles) holds the 32 transactions in flight and sets that window's
//! p99.9, and no I/O limit prevents it; with five 3 s windows, one such stall and one
//! failed probe of the knee search (its one violating cycle, within the one-in-ten budget)
//! failed the test. A stall is also told from the writer's harm by its size: a failing run
//! with a window worse than any the uncapped writer caused (CI saw 90.6 ms where the
//! uncapped writer's worst was 42.8) runs once more, its run alone with it, and that
//! attempt must pass on its own; a failing run without such a window fails at once. pgbench
//! is CPU-bound as much as disk-bound: run on a machine busy with other work (a build), its
//! latency says more about the CPU than about the disk.

use isolator_tests::{
    postgres::{self, Cluster, ModeRun, PHASES, SIZE},
    scenario::Mode,
    *,
};

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

/// Prints what pgbench and the agent saw of one run.
fn print_run(label: &str, m: &ModeRun) {
    let run = &m.run;
    println!("--- {label}: the agent's cycles");
    noisy::print_cycles(&m.events);
    let (solo_us, solo_n) = run.solo_p999_us(postgres::WARMUP_MS);
    let (steady_us, steady_n) = run.writer_p999_us(PHASES.settle_ms);
    let max_lag = run.log.transactions.iter().max_by_key(|t| t.lag_us);
    let (max_lag_us, max_lag_at_s) = max_lag.map_or((0, 0.0), |t| {
        let writer_start_us = run.writer.map_or(run.start_us, |(start, _, _)| start);
        (
            t.lag_us,
            (t.scheduled_us() as f64 - writer_start_us as f64) / 1e6,
        )
    });
    println!(
        "{label}: pgbench p99.9 solo {:.2} ms ({solo_n} tx), next to the writer (steady) {:.2} ms \
         ({steady_n} tx; {:.2} ms without schedule lag); max schedule lag {:.1} ms ({:+.1} s from \
         the writer's start); {}",
        ms(solo_us),
        ms(steady_us),
        ms(run
            .writer_p999_started_us(PHASES.settle_ms)
            .unwrap_or(u64::MAX)),
        ms(max_lag_us),
        max_lag_at_s,
        run.tps_line()
    );
}

#[test]
fn postgres_p999_within_slo_under_control_and_above_without() {
    require_root();
    require_tool("fio");
    let t0 = std::time::Instant::now();
    let cluster = Cluster::create(SIZE);
    println!(
        "cluster: {:.0} MiB of data, page cache limited to {} MiB (memcg usage now {:.0} MiB), \
         created in {:.1} s",
        cluster.data_bytes() as f64 / (1 << 20) as f64,
        SIZE.cache_limit_bytes >> 20,
        cluster.memory.usage_bytes() as f64 / (1 << 20) as f64,
        t0.elapsed().as_secs_f64()
    );
    assert!(
        cluster.data_bytes() > 2 * SIZE.cache_limit_bytes,
        "the data must be well over the page cache its cgroup may hold"
    );
    let scratch = Scratch::new();
    let backup = TestCgroup::new("iso-pg-backup");
    let wfile = noisy::writer_file(&scratch);
    let dev = disk_of(&wfile);

    // pgbench alone: what this disk gives it today (more windows of it come before the
    // first `adaptive` run, and the SLO is taken from them all).
    let cal = postgres::calibrate(&cluster, &scratch).unwrap_or_else(|e| panic!("{e}"));
    println!(
        "calibration: pgbench alone p99.9 per window {:.2?} ms ({})",
        cal.windows_ms, cal.tps_line
    );
    let config = scratch.path("isolator.toml");
    std::fs::write(
        &config,
        noisy::config(&cluster.blkio, &backup, cal.io_slo_ms),
    )
    .unwrap();

    let run = |mode: Mode| {
        let m = postgres::run_in_mode(
            &cluster,
            (&backup, &wfile),
            &config,
            (&dev, &mode),
            PHASES,
            &scratch,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        print_run(&mode.label(), &m);
        m
    };
    let without = run(Mode::None);
    // pgbench alone over the steady phase's windows (what the disk does on its own just
    // before the run under control).
    let alone = |i: usize| {
        let alone = postgres::alone_windows_ms(&cluster, PHASES, &scratch, &format!("alone-{i}"))
            .unwrap_or_else(|e| panic!("{e}"));
        println!("pgbench alone, the steady phase's windows: {alone:.2?} ms");
        alone
    };
    let first_alone = alone(0);
    let cal = cal.with_windows_alone(&first_alone);
    let slo_ms = cal.slo_ms;
    println!(
        "pgbench alone p99.9 {:.2} ms (the median of {} windows alone): SLO {slo_ms} ms",
        cal.solo_p999_ms,
        cal.windows_ms.len()
    );
    let windows = PHASES.windows as usize;
    // Most windows over the SLO without control, or the scenario shows no noisy neighbor.
    // How hard the writer hits depends on the host's writeback of the guest's disk, which
    // moves within minutes: CI saw the uncapped writer at 5.8 GB/s raise pgbench's p99.9 to
    // only 3.8x its run alone (1 window of 10 over a 16 ms SLO) where a run minutes later
    // raised it to 15-260 ms. So a run without one is measured once more, and that run must
    // show it; pgbench alone is measured again after it, so the run alone the budget counts
    // is still the one just before `adaptive` (the SLO stays the first's).
    let shows_neighbor = |m: &ModeRun| 2 * m.windows_over(PHASES, slo_ms) > windows;
    let (without, alone_before) = if shows_neighbor(&without) {
        (without, first_alone)
    } else {
        println!(
            "without control the writer pushed pgbench over the {slo_ms} ms SLO in only {} \
             of {windows} windows ({:.2?} ms), a writer that hurt little this time; no \
             control runs once more",
            without.windows_over(PHASES, slo_ms),
            without.windows_ms(PHASES)
        );
        let again = run(Mode::None);
        (again, alone(1))
    };
    // The agent's target for db's reads, from what they and the transactions did next to
    // the uncapped writer on this disk today (`postgres::IoTarget`).
    let target = cal
        .measure_io_target(&without)
        .unwrap_or_else(|e| panic!("{e}"));
    println!("the agent's target for db's block I/O: {target}");
    std::fs::write(&config, target.config(&cluster.blkio, &backup)).unwrap();
    let (without_us, without_n) = without.run.writer_p999_us(PHASES.settle_ms);
    let (without_windows, without_over) = (
        without.windows_ms(PHASES),
        without.windows_over(PHASES, slo_ms),
    );
    let worst_without_ms = without_windows.iter().copied().fold(0.0, f64::max);
    // Each attempt: pgbench alone over the same windows (what the disk does on its own just
    // before), then under `adaptive`. The budget is one window in five plus the windows the
    // disk put over the SLO with no writer at all: no cap prevents those.
    let attempt = |alone: Vec<f64>| {
        let alone_over = alone.iter().filter(|&&ms| ms > slo_ms as f64).count();
        println!("pgbench alone: {alone_over} of {windows} windows over the {slo_ms} ms SLO");
        let m = run(Mode::Policy("adaptive".into()));
        let (w, over) = (m.windows_ms(PHASES), m.windows_over(PHASES, slo_ms));
        Attempt {
            alone,
            alone_over,
            with: m,
            windows: w,
            over,
        }
    };
    let budget = |a: &Attempt| windows / 5 + a.alone_over;
    let mut a = attempt(alone_before);
    // A window worse than anything the uncapped writer did is the disk's own stall: no cap
    // causes it, and none prevents it. A failing run with such a window runs once more, and
    // that run must pass alone; a failing run without one fails the test.
    let stalled = a
        .windows
        .iter()
        .find(|&&ms| ms > slo_ms as f64 && ms > worst_without_ms)
        .copied();
    let mut first_attempt = None;
    if a.over > budget(&a) {
        if let Some(stall_ms) = stalled {
            println!(
                "under adaptive {} of {windows} windows were over ({:.2?} ms), one at \
                 {stall_ms:.2} ms where the uncapped writer's worst was {worst_without_ms:.2} \
                 ms: the disk stalled on its own; adaptive runs once more",
                a.over, a.windows
            );
            first_attempt = Some(format!("{:.2?} ms", a.windows));
            a = attempt(alone(2));
        }
    }
    let (with_us, with_n) = a.with.run.writer_p999_us(PHASES.settle_ms);
    println!(
        "pgbench p99.9 over the steady phase: alone {:.2} ms, SLO {slo_ms} ms, without control \
         {:.2} ms ({without_n} tx; per window {without_windows:.2?} ms, {without_over} of \
         {windows} over), alone again {:.2?} ms ({} over), under adaptive {:.2} ms ({with_n} \
         tx; per window {:.2?} ms, {} of {windows} over, {} allowed); test took {:.0} s",
        cal.solo_p999_ms,
        ms(without_us),
        a.alone,
        a.alone_over,
        ms(with_us),
        a.windows,
        a.over,
        budget(&a),
        t0.elapsed().as_secs_f64()
    );
    assert!(
        shows_neighbor(&without),
        "without control the writer pushed pgbench's p99.9 over the {slo_ms} ms SLO in only \
         {without_over} of {windows} windows ({without_windows:.2?} ms): on this disk the \
         scenario shows no noisy neighbor, so it proves nothing"
    );
    assert!(
        budget(&a) < without_over,
        "pgbench alone was over its {slo_ms} ms SLO in {} of {windows} windows ({:.2?} ms): \
         with {} allowed under control, no more than without it ({without_over}), the disk \
         stalls too often on its own today for the scenario to tell control from none; run \
         it again when the disk is calmer",
        a.alone_over,
        a.alone,
        budget(&a)
    );
    assert!(
        a.over <= budget(&a),
        "under adaptive pgbench's p99.9 was over its {slo_ms} ms SLO in {} of {windows} \
         windows of the steady phase ({:.2?} ms{}); at most one in five may be, plus the {} \
         the disk put over it alone ({:.2?} ms)",
        a.over,
        a.windows,
        first_attempt.map_or(String::new(), |w| format!(
            "; the run before it, on a stalling disk: {w}"
        )),
        a.alone_over,
        a.alone
    );
}

/// pgbench alone over the steady phase's windows, then under `adaptive`.
struct Attempt {
    alone: Vec<f64>,
    alone_over: usize,
    with: postgres::ModeRun,
    windows: Vec<f64>,
    over: usize,
}
