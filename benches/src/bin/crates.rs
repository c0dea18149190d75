//! The two crates the design named, measured against the agent's own code (issue 14;
//! the findings are in docs/design/crates.md, the table in BENCHMARKS.md).
//!
//!   cargo run --release -p isolator-benches --features crates --bin crates -- hist [--keys 2000] [--rounds 7]
//!       hdrhistogram 7 against metrics::HistWindow: CPU per key per cycle (window merge and
//!       percentiles), memory, and the percentiles each gives for the same kernel buckets.
//!   cargo run --release -p isolator-benches --features crates --bin crates -- cgroup [--cgroups 1000] [--rounds 7]
//!       cgroups-rs 0.5 against the enforcer's reads and writes and cgroupfs's walk (root):
//!       a scratch cgroup and a loop device over a 16 MiB file in /var/tmp, all removed at
//!       the end.
//!
//! Variants run alternately in every round; a round's figure is one pass, the report is
//! the median of the rounds and their spread (min-max).

use std::{
    alloc::{GlobalAlloc, Layout, System},
    collections::VecDeque,
    io::Write,
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
    sync::atomic::{AtomicUsize, Ordering},
    time::Instant,
};

use hdrhistogram::Histogram;
use isolator::{
    collect::collector::SparseHist,
    enforcer::{Enforcer, Journal, KnobRef, Setting},
    identify::cgroupfs::{CgroupMode, IoHierarchy},
    measure::metrics::{percentile, HistWindow, LatencySummary, MAX_WINDOW_CYCLES, MAX_WINDOW_NS},
    policy::Knob,
};
use isolator_common::{
    bucket_lower_ns, bucket_representative_ns, bucket_width_ns, kernel_dev, latency_bucket,
    HIST_BUCKETS, HIST_MAX_EXACT_NS,
};
use rand::{rngs::StdRng, Rng, SeedableRng};

/// Live heap bytes, to weigh what each representation holds.
struct Counting;
static LIVE: AtomicUsize = AtomicUsize::new(0);
// SAFETY: every method forwards to the system allocator with the caller's own arguments,
// so it keeps GlobalAlloc's contract exactly; the counter is only bookkeeping.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size(), Ordering::Relaxed);
        // SAFETY: the caller's layout, as GlobalAlloc::alloc requires.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
        // SAFETY: `p` came from this allocator (hence System) with layout `l`.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new, Ordering::Relaxed);
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
        // SAFETY: `p` came from System with layout `l`; `new` is the caller's valid size.
        unsafe { System.realloc(p, l, new) }
    }
}
#[global_allocator]
static GLOBAL: Counting = Counting;
fn live() -> usize {
    LIVE.load(Ordering::Relaxed)
}

fn arg(args: &[String], flag: &str, default: usize) -> usize {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// (median, min, max)
fn stats(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("hist") => hist(&args),
        Some("cgroup") => {
            if let Err(e) = cgroup(&args) {
                eprintln!("crates cgroup: {e:#}");
                std::process::exit(1);
            }
        }
        _ => {
            eprintln!("usage: crates hist [--keys N] [--rounds N] | crates cgroup [--cgroups N] [--rounds N]");
            std::process::exit(2);
        }
    }
}

// ---------------------------------------------------------------------------------------
// hdrhistogram

const CYCLE_NS: u64 = 1_000_000_000;

fn lognormal(rng: &mut StdRng, median_ns: f64, sigma: f64) -> u64 {
    let (u1, u2): (f64, f64) = (rng.gen::<f64>().max(1e-300), rng.gen());
    let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
    (median_ns * (sigma * z).exp()) as u64
}

/// One key's traffic class: requests per cycle and a latency distribution. 60 % of keys
/// are light (5-50 per cycle, SSD-like), 30 % medium (100-800, disk-like, wide), 10 % busy
/// (2,000-6,000, fast with a 0.5 % slow mode).
fn sample(rng: &mut StdRng, class: usize) -> Vec<u64> {
    let (n, f): (usize, fn(&mut StdRng) -> u64) = match class {
        0..=5 => (rng.gen_range(5..50), |r| lognormal(r, 250_000.0, 0.6)),
        6..=8 => (rng.gen_range(100..800), |r| lognormal(r, 2_000_000.0, 0.9)),
        _ => (rng.gen_range(2_000..6_000), |r| {
            if r.gen_bool(0.005) {
                lognormal(r, 20_000_000.0, 0.5)
            } else {
                lognormal(r, 100_000.0, 0.3)
            }
        }),
    };
    (0..n).map(|_| f(rng)).collect()
}

/// As the collector builds a delta: dense counts, then pushed one bucket at a time.
fn sparse_of(samples: &[u64]) -> SparseHist {
    let mut dense = vec![0u64; HIST_BUCKETS];
    for &s in samples {
        dense[latency_bucket(s)] += 1;
    }
    let mut out = Vec::new();
    for (i, &n) in dense.iter().enumerate() {
        if n != 0 {
            out.push((i as u16, n));
        }
    }
    out
}

/// The windows as hdrhistogram would serve them: the cycles' sparse deltas as today (a
/// window of variable length cannot be one running histogram), summed into one reused
/// hdrhistogram, percentiles read from it.
#[derive(Default)]
struct HdrWindow {
    cycles: VecDeque<(u64, SparseHist)>,
}

impl HdrWindow {
    fn push(&mut self, interval_ns: u64, h: SparseHist) {
        self.cycles.push_back((interval_ns, h));
        while self.cycles.len() > MAX_WINDOW_CYCLES {
            self.cycles.pop_front();
        }
    }

    /// The same widening as HistWindow::summary; `map_back` reports the kernel bucket's
    /// representative of hdrhistogram's answer instead of the answer itself.
    fn summary(&self, acc: &mut Histogram<u64>, map_back: bool) -> LatencySummary {
        acc.reset();
        let (mut window_ns, mut cycles, mut top) = (0, 0, None::<u16>);
        for (interval, h) in self.cycles.iter().rev() {
            if cycles > 0 && window_ns + interval > MAX_WINDOW_NS {
                break;
            }
            for &(i, n) in h {
                acc.record_n(bucket_representative_ns(i as usize), n)
                    .expect("hdrhistogram covers every bucket");
            }
            top = top.max(h.last().map(|&(i, _)| i));
            window_ns += interval;
            cycles += 1;
            if acc.len() >= 1000 {
                break;
            }
        }
        let samples = acc.len();
        let mut q = acc.value_at_quantiles([0.5, 0.99, 0.999]);
        let mut next = |min: u64| {
            let v = q.next();
            (samples >= min).then_some(v).flatten().map(|v| {
                if map_back {
                    bucket_representative_ns(latency_bucket(v))
                } else {
                    v
                }
            })
        };
        LatencySummary {
            samples,
            window_s: window_ns as f64 / 1e9,
            window_cycles: cycles,
            p50_ns: next(1),
            p99_ns: next(100),
            p999_ns: next(1000),
            // hdrhistogram's max() is its own bucket's top, below the kernel bucket's: the
            // kernel bucket index is kept for the max, as today.
            max_ns: top.map(|i| bucket_lower_ns(i as usize) + bucket_width_ns(i as usize) - 1),
            mean_ns: None,
        }
    }
}

/// The design an hdrhistogram user would reach for first: one histogram per cycle, the
/// window summed with `add`.
#[derive(Default)]
struct HdrPerCycle {
    cycles: VecDeque<Histogram<u64>>,
}

fn new_hdr() -> Histogram<u64> {
    // 1 ns .. 60 s at 2 significant digits: hdrhistogram's nearest precision at or below
    // the kernel's 1/32 (sigfig 1 gives 1/16).
    Histogram::new_with_bounds(1, 60_000_000_000, 2).unwrap()
}

impl HdrPerCycle {
    fn push(&mut self, h: &SparseHist) {
        let mut c = if self.cycles.len() >= MAX_WINDOW_CYCLES {
            let mut c = self.cycles.pop_front().unwrap();
            c.reset();
            c
        } else {
            new_hdr()
        };
        for &(i, n) in h {
            c.record_n(bucket_representative_ns(i as usize), n).unwrap();
        }
        self.cycles.push_back(c);
    }
    fn summary(&self, acc: &mut Histogram<u64>) -> (u64, u64, u64) {
        acc.reset();
        for c in self.cycles.iter().rev() {
            acc.add(c).unwrap();
            if acc.len() >= 1000 {
                break;
            }
        }
        let mut q = acc.value_at_quantiles([0.5, 0.99, 0.999]);
        (
            q.next().unwrap_or(0),
            q.next().unwrap_or(0),
            q.next().unwrap_or(0),
        )
    }
}

fn hist(args: &[String]) {
    let keys = arg(args, "--keys", 2000);
    let rounds = arg(args, "--rounds", 7);
    let per_cycle_keys = arg(args, "--per-cycle-keys", 100).min(keys);
    let pool_cycles = MAX_WINDOW_CYCLES + 4;
    println!("# hdrhistogram 7.6 vs metrics::HistWindow: {keys} keys, {MAX_WINDOW_CYCLES}-cycle windows, {rounds} rounds");

    // Traffic, generated once: `pool_cycles` deltas per key.
    let mut rng = StdRng::seed_from_u64(14);
    let t = Instant::now();
    let pool: Vec<Vec<SparseHist>> = (0..keys)
        .map(|k| {
            (0..pool_cycles)
                .map(|_| sparse_of(&sample(&mut rng, k % 10)))
                .collect()
        })
        .collect();
    eprintln!("traffic generated in {:.1}s", t.elapsed().as_secs_f64());

    // Fill the windows with 60 cycles each; weigh today's.
    let before = live();
    let mut cur: Vec<HistWindow> = (0..keys).map(|_| HistWindow::default()).collect();
    for (w, p) in cur.iter_mut().zip(&pool) {
        for h in &p[..MAX_WINDOW_CYCLES] {
            w.push(CYCLE_NS, h.clone());
        }
    }
    let cur_bytes = live() - before;
    let mut hdr: Vec<HdrWindow> = (0..keys).map(|_| HdrWindow::default()).collect();
    for (w, p) in hdr.iter_mut().zip(&pool) {
        for h in &p[..MAX_WINDOW_CYCLES] {
            w.push(CYCLE_NS, h.clone());
        }
    }
    let mut per_cycle: Vec<HdrPerCycle> = (0..per_cycle_keys)
        .map(|_| HdrPerCycle::default())
        .collect();
    for (w, p) in per_cycle.iter_mut().zip(&pool) {
        for h in &p[..MAX_WINDOW_CYCLES] {
            w.push(h);
        }
    }
    let before = live();
    let mut acc = new_hdr();
    let hdr_bytes = live() - before + std::mem::size_of::<Histogram<u64>>();
    let class_bytes = |class: std::ops::RangeInclusive<usize>| {
        let ks: Vec<usize> = (0..keys).filter(|k| class.contains(&(k % 10))).collect();
        let total: usize = ks
            .iter()
            .map(|&k| {
                pool[k][..MAX_WINDOW_CYCLES]
                    .iter()
                    .map(|h| h.capacity() * 16 + 32)
                    .sum::<usize>()
            })
            .sum();
        total / ks.len().max(1)
    };

    // Timed cycles: each variant takes the same next delta for every key.
    let (mut t_cur, mut t_hdr, mut t_pc) = (vec![], vec![], vec![]);
    let mut sink = 0u64;
    // Round 0 warms up and is dropped.
    for round in 0..=rounds {
        let cycle = MAX_WINDOW_CYCLES + round;
        let delta = |k: usize| pool[k][cycle % pool_cycles].clone();
        let mut run = |v: usize, sink: &mut u64| match v {
            0 => {
                let t = Instant::now();
                for (k, w) in cur.iter_mut().enumerate() {
                    w.push(CYCLE_NS, delta(k));
                    *sink += w.summary().p99_ns.unwrap_or(0);
                }
                t_cur.push(t.elapsed().as_nanos() as f64 / keys as f64);
            }
            1 => {
                let t = Instant::now();
                for (k, w) in hdr.iter_mut().enumerate() {
                    w.push(CYCLE_NS, delta(k));
                    *sink += w.summary(&mut acc, true).p99_ns.unwrap_or(0);
                }
                t_hdr.push(t.elapsed().as_nanos() as f64 / keys as f64);
            }
            _ => {
                let t = Instant::now();
                for (k, w) in per_cycle.iter_mut().enumerate() {
                    w.push(&delta(k));
                    *sink += w.summary(&mut acc).1;
                }
                t_pc.push(t.elapsed().as_nanos() as f64 / per_cycle_keys as f64);
            }
        };
        for i in 0..3 {
            run((round + i) % 3, &mut sink);
        }
    }
    std::hint::black_box(sink);
    for t in [&mut t_cur, &mut t_hdr, &mut t_pc] {
        t.remove(0);
    }

    // Accuracy: the final windows, key by key.
    let mut diff = [[0usize; 4]; 2]; // [raw, mapped back][p50, p99, p999, max]
    let mut worst = [0f64; 2];
    let mut compared = [0usize; 4];
    let mut pruned_bytes = 0usize;
    for (c, h) in cur.iter_mut().zip(&hdr) {
        let a = c.summary();
        // Cycles older than the summary's window are never read again (newer cycles only
        // add samples): what a window that dropped them would hold.
        pruned_bytes += h
            .cycles
            .iter()
            .rev()
            .take(a.window_cycles)
            .map(|(_, d)| d.capacity() * 16 + 32)
            .sum::<usize>();
        for (m, map_back) in [false, true].into_iter().enumerate() {
            let b = h.summary(&mut acc, map_back);
            assert_eq!((a.samples, a.window_cycles), (b.samples, b.window_cycles));
            for (j, (x, y)) in [
                (a.p50_ns, b.p50_ns),
                (a.p99_ns, b.p99_ns),
                (a.p999_ns, b.p999_ns),
                (a.max_ns, b.max_ns),
            ]
            .into_iter()
            .enumerate()
            {
                assert_eq!(x.is_some(), y.is_some());
                if let (Some(x), Some(y)) = (x, y) {
                    compared[j] += (m == 0) as usize;
                    if x != y {
                        diff[m][j] += 1;
                        worst[m] = worst[m].max((y as f64 - x as f64).abs() / x as f64);
                    }
                }
            }
        }
    }

    let (m, lo, hi) = stats(t_cur.clone());
    println!();
    println!("| per key per cycle (push + widen + p50/p99/p99.9/max) | median ns | spread (min-max) | vs current |");
    println!("|---|---:|---:|---:|");
    println!("| current: metrics::HistWindow (dense 1,024 u64 sum, then sparse) | {m:.0} | {lo:.0}-{hi:.0} | 1.00x |");
    let (h, hlo, hhi) = stats(t_hdr.clone());
    let ratios: Vec<f64> = t_hdr.iter().zip(&t_cur).map(|(a, b)| a / b).collect();
    let (r, rlo, rhi) = stats(ratios);
    println!("| hdrhistogram: sparse deltas recorded into one reused Histogram<u64> | {h:.0} | {hlo:.0}-{hhi:.0} | {r:.2}x ({rlo:.2}-{rhi:.2}) |");
    let (p, plo, phi) = stats(t_pc.clone());
    let ratios: Vec<f64> = t_pc.iter().zip(&t_cur).map(|(a, b)| a / b).collect();
    let (r, rlo, rhi) = stats(ratios);
    println!("| hdrhistogram: one Histogram<u64> per cycle, window summed with add() ({per_cycle_keys} keys) | {p:.0} | {plo:.0}-{phi:.0} | {r:.2}x ({rlo:.2}-{rhi:.2}) |");
    println!();
    println!("| memory | bytes |");
    println!("|---|---:|");
    println!(
        "| current window, 60 cycles, mean per key (one of the 3 histograms) | {} |",
        cur_bytes / keys
    );
    println!(
        "|   light / medium / busy keys | {} / {} / {} |",
        class_bytes(0..=5),
        class_bytes(6..=8),
        class_bytes(9..=9)
    );
    println!(
        "| (finding) the same window keeping only the cycles its summary read, mean per key | {} |",
        pruned_bytes / keys
    );
    println!(
        "| current summary scratch (HistSum dense, per summary) | {} |",
        HIST_BUCKETS * 8
    );
    for (low, high, sig) in [
        (1, 60_000_000_000u64, 1u8),
        (1, 60_000_000_000, 2),
        (1, HIST_MAX_EXACT_NS, 2),
        (1, 60_000_000_000, 3),
    ] {
        let b = live();
        let h: Histogram<u64> = Histogram::new_with_bounds(low, high, sig).unwrap();
        let bytes = live() - b + std::mem::size_of::<Histogram<u64>>();
        let b32 = {
            let b = live();
            let h32: Histogram<u32> = Histogram::new_with_bounds(low, high, sig).unwrap();
            let n = live() - b + std::mem::size_of::<Histogram<u32>>();
            drop(h32);
            n
        };
        println!(
            "| hdrhistogram {low} ns..{:.1} s sigfig {sig}: {} counters | {bytes} (u32 counts: {b32}) |",
            high as f64 / 1e9,
            h.distinct_values()
        );
    }
    println!(
        "| hdrhistogram per-cycle design: 60 x sigfig-2 histogram per key | {} |",
        60 * hdr_bytes
    );
    println!();
    println!(
        "accuracy over {keys} final windows (answers compared p50/p99/p99.9/max: {:?}):",
        compared
    );
    println!(
        "  hdrhistogram's own answer (top of its bucket): {:?} differ, worst {:.2}%",
        diff[0],
        worst[0] * 100.0
    );
    println!(
        "  mapped back to the kernel bucket's representative: {:?} differ, worst {:.2}%",
        diff[1],
        worst[1] * 100.0
    );
    // Out of range: what the kernel's top buckets hold.
    let top_rep = bucket_representative_ns(HIST_BUCKETS - 1);
    let mut h60 = new_hdr();
    println!(
        "  top kernel bucket's representative {} ns into 1 ns..60 s sigfig 2: {:?}",
        top_rep,
        h60.record(top_rep).map_err(|e| format!("{e:?}"))
    );
    exact_errors();
}

/// Against the exact percentiles of raw samples: today's answer, hdrhistogram's from the
/// kernel buckets, and hdrhistogram's from raw values (which the agent never has).
fn exact_errors() {
    let mut rng = StdRng::seed_from_u64(7);
    println!();
    println!("| distribution (100k samples) | q | current err | hdr from buckets err | hdr from raw values err |");
    println!("|---|---|---:|---:|---:|");
    let dists: Vec<(&str, Vec<u64>)> = vec![
        (
            "log-uniform 1us-30s",
            (0..100_000)
                .map(|_| 10f64.powf(rng.gen_range(3.0..10.5)) as u64)
                .collect(),
        ),
        (
            "SSD lognormal 250us s0.6",
            (0..100_000)
                .map(|_| lognormal(&mut rng, 250_000.0, 0.6))
                .collect(),
        ),
        (
            "bimodal 99.5% 100us / 0.5% 20ms",
            (0..100_000)
                .map(|_| {
                    if rng.gen_bool(0.005) {
                        lognormal(&mut rng, 20_000_000.0, 0.5)
                    } else {
                        lognormal(&mut rng, 100_000.0, 0.3)
                    }
                })
                .collect(),
        ),
    ];
    for (name, mut s) in dists {
        let sparse = sparse_of(&s);
        let mut from_buckets = new_hdr();
        for &(i, n) in &sparse {
            from_buckets
                .record_n(bucket_representative_ns(i as usize), n)
                .unwrap();
        }
        let mut raw: Histogram<u64> = Histogram::new_with_bounds(1, HIST_MAX_EXACT_NS, 2).unwrap();
        for &v in &s {
            raw.record(v.max(1)).unwrap();
        }
        s.sort_unstable();
        for q in [0.5, 0.99, 0.999] {
            let n = s.len() as u64;
            let exact = s[(((q * n as f64).ceil() as u64).clamp(1, n) - 1) as usize] as f64;
            let err = |v: u64| format!("{:+.2}%", (v as f64 - exact) / exact * 100.0);
            println!(
                "| {name} | {q} | {} | {} | {} |",
                err(percentile(&sparse, n, q).unwrap()),
                err(from_buckets.value_at_quantile(q)),
                err(raw.value_at_quantile(q)),
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// cgroups-rs

/// Everything the cgroup benchmark creates, removed on drop (also on a panic).
struct Scratch {
    image: PathBuf,
    loop_dev: Option<String>,
    dirs: Vec<PathBuf>,
    /// The enforcer's journal directory (tmpfs).
    journal: Option<PathBuf>,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        for d in self.dirs.iter().rev() {
            if let Err(e) = std::fs::remove_dir(d) {
                eprintln!("cleanup: rmdir {}: {e}", d.display());
            }
        }
        if let Some(l) = &self.loop_dev {
            let ok = std::process::Command::new("losetup")
                .args(["-d", l])
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if !ok {
                eprintln!("cleanup: losetup -d {l} failed");
            }
        }
        let _ = std::fs::remove_file(&self.image);
        if let Some(j) = &self.journal {
            let _ = std::fs::remove_dir_all(j);
        }
    }
}

impl Scratch {
    fn mkdir(&mut self, d: PathBuf) -> anyhow::Result<()> {
        std::fs::create_dir(&d).map_err(|e| anyhow::anyhow!("mkdir {}: {e}", d.display()))?;
        self.dirs.push(d);
        Ok(())
    }
}

fn write_agent_way(file: &Path, line: &str) -> std::io::Result<()> {
    std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(file)?
        .write_all(line.as_bytes())
}

fn cgroup(args: &[String]) -> anyhow::Result<()> {
    use cgroups_rs::fs::{blkio::BlkIoController, hierarchies, Cgroup};

    let n_cgroups = arg(args, "--cgroups", 1000);
    let rounds = arg(args, "--rounds", 7);
    let iters = arg(args, "--iters", 200);
    let h = IoHierarchy::detect()?;
    let v2 = h.mode == CgroupMode::V2;
    println!(
        "# cgroups-rs 0.5.1 vs isolator::enforcer / cgroupfs: {:?} at {}, {rounds} rounds",
        h.mode,
        h.root.display()
    );
    if v2 && !h.io_enabled {
        anyhow::bail!("the io controller is not enabled in the v2 root's subtree_control");
    }

    let pid = std::process::id();
    let mut s = Scratch {
        image: PathBuf::from(format!("/var/tmp/isolator-crates-bench-{pid}.img")),
        loop_dev: None,
        dirs: vec![],
        journal: None,
    };
    std::fs::File::create(&s.image)?.set_len(16 << 20)?;
    let out = std::process::Command::new("losetup")
        .args(["--find", "--show"])
        .arg(&s.image)
        .output()?;
    anyhow::ensure!(out.status.success(), "losetup failed");
    let loop_dev = String::from_utf8(out.stdout)?.trim().to_string();
    s.loop_dev = Some(loop_dev.clone());
    let name = Path::new(&loop_dev).file_name().unwrap().to_string_lossy();
    let devno = std::fs::read_to_string(format!("/sys/block/{name}/dev"))?;
    let (maj, min) = devno.trim().split_once(':').unwrap();
    let (maj, min): (u32, u32) = (maj.parse()?, min.parse()?);
    println!(
        "loop device {loop_dev} ({maj}:{min}) over {}",
        s.image.display()
    );

    let scratch_rel = format!("isolator-crates-bench-{pid}");
    let scratch = h.root.join(&scratch_rel);
    s.mkdir(scratch.clone())?;
    if v2 {
        std::fs::write(scratch.join("cgroup.subtree_control"), "+io")?;
    }
    let knob_rel = format!("{scratch_rel}/knob");
    let knob_dir = h.root.join(&knob_rel);
    s.mkdir(knob_dir.clone())?;

    // Read + write of one limit (write bps on the loop device), alternating two values
    // so every write is a change.
    let k = KnobRef::of(
        h.mode,
        Setting::Limit {
            dev: kernel_dev(maj, min),
            knob: Knob::Wbps,
            value: Some(1),
        },
    );
    let file = k.path_in(&knob_dir);
    let value = |i: usize| 1_048_576 + (i as u64 % 2) * 4096;
    let dev = format!("{maj}:{min}");
    let crate_read = |c: &BlkIoController| -> Option<u64> {
        // v2: the crate has no reader for io.max; v1: blkio() reads every blkio file.
        (!v2).then(|| {
            c.blkio()
                .throttle
                .write_bps_device
                .iter()
                .find(|d| d.major as u32 == maj && d.minor as u32 == min)
                .map(|d| d.data)
                .unwrap_or(0)
        })
    };
    let cached = BlkIoController::new(knob_dir.clone(), PathBuf::new(), v2);
    // The enforcer gets a cgroup of its own: a value another variant wrote would be
    // someone else's to it.
    let enf_rel = format!("/{scratch_rel}/enforcer");
    s.mkdir(h.dir_of(&enf_rel))?;
    let jdir = PathBuf::from(format!("/dev/shm/isolator-crates-bench-{pid}"));
    s.journal = Some(jdir.clone());
    let mut enforcer = Enforcer::new(h.clone(), Some(Journal::open(&jdir)?));

    // Checks: each reads back what the other wrote.
    write_agent_way(&file, &k.line("777").unwrap())?;
    if !v2 {
        assert_eq!(crate_read(&cached), Some(777));
    }
    cached
        .throttle_write_bps_for_device(maj as u64, min as u64, 888)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    assert_eq!(k.parse(&std::fs::read_to_string(&file)?), "888");

    let names = [
        "agent: read_to_string + KnobRef::parse + one write(2)",
        "agent: Enforcer::apply (read, journal rewritten + fsync on tmpfs, write)",
        "cgroups-rs: BlkIoController held; blkio() read + throttle_write_bps_for_device",
        "cgroups-rs: Cgroup::load per call (V1::new/V2::new) + controller_of + the same",
        "agent: write only",
        "cgroups-rs: write only (held controller)",
    ];
    let mut times: Vec<Vec<f64>> = vec![vec![]; names.len()];
    let mut i = 0usize;
    let mut sink = 0u64;
    // Round 0 warms up and is dropped.
    for round in 0..=rounds {
        for j in 0..names.len() {
            let v = (round + j) % names.len();
            let t = Instant::now();
            for _ in 0..iters {
                i += 1;
                let val = value(i);
                match v {
                    0 => {
                        let cur = k.parse(&std::fs::read_to_string(&file)?);
                        sink += cur.len() as u64;
                        write_agent_way(&file, &k.line(&val.to_string()).unwrap())?;
                    }
                    1 => {
                        enforcer
                            .apply(
                                &enf_rel,
                                Setting::Limit {
                                    dev: kernel_dev(maj, min),
                                    knob: Knob::Wbps,
                                    value: Some(val),
                                },
                            )
                            .map_err(|e| anyhow::anyhow!("{e}"))?;
                    }
                    2 => {
                        sink += crate_read(&cached).unwrap_or(0);
                        cached
                            .throttle_write_bps_for_device(maj as u64, min as u64, val)
                            .map_err(|e| anyhow::anyhow!("{e}"))?;
                    }
                    3 => {
                        let hier: Box<dyn cgroups_rs::fs::Hierarchy> = if v2 {
                            Box::new(hierarchies::V2::new())
                        } else {
                            Box::new(hierarchies::V1::new())
                        };
                        let cg = Cgroup::load(hier, &knob_rel);
                        let c: &BlkIoController = cg.controller_of().expect("blkio controller");
                        sink += crate_read(c).unwrap_or(0);
                        c.throttle_write_bps_for_device(maj as u64, min as u64, val)
                            .map_err(|e| anyhow::anyhow!("{e}"))?;
                    }
                    4 => write_agent_way(&file, &k.line(&val.to_string()).unwrap())?,
                    _ => cached
                        .throttle_write_bps_for_device(maj as u64, min as u64, val)
                        .map_err(|e| anyhow::anyhow!("{e}"))?,
                }
            }
            times[v].push(t.elapsed().as_nanos() as f64 / iters as f64 / 1000.0);
        }
    }
    std::hint::black_box(sink);
    for t in &mut times {
        t.remove(0);
    }
    let restored = enforcer.restore_all();
    assert!(
        restored.iter().all(|r| r.result == "restored"),
        "{restored:?}"
    );
    drop(enforcer);
    let enf_file = k.path_in(&h.dir_of(&enf_rel));
    assert_eq!(k.parse(&std::fs::read_to_string(enf_file)?), k.parse(""));
    write_agent_way(&file, &k.line(&k.parse("")).unwrap())?;

    println!();
    println!("| one limit ({dev} wbps) on a scratch cgroup | median us | spread (min-max) | vs agent read+write |");
    println!("|---|---:|---:|---:|");
    for (v, name) in names.iter().enumerate() {
        let base = if v >= 4 { &times[4] } else { &times[0] };
        let (m, lo, hi) = stats(times[v].clone());
        let (r, rlo, rhi) = stats(times[v].iter().zip(base).map(|(a, b)| a / b).collect());
        println!("| {name} | {m:.1} | {lo:.1}-{hi:.1} | {r:.2}x ({rlo:.2}-{rhi:.2}) |");
    }

    // What the crate writes for a weight, and what the kernel says.
    let weight = cached.set_weight(500).map_err(|e| {
        format!(
            "{e} ({})",
            std::error::Error::source(&e)
                .map(|c| c.to_string())
                .unwrap_or_default()
        )
    });
    println!();
    println!(
        "cgroups-rs set_weight(500) ({}): {weight:?}",
        if v2 { "io.bfq.weight" } else { "blkio.weight" }
    );

    // Hierarchy walk: ~n_cgroups cgroups, 10 parents of n/10 - 1 children.
    let walk_rel = format!("{scratch_rel}/walk");
    s.mkdir(h.root.join(&walk_rel))?;
    let per = (n_cgroups / 10).max(1);
    let mut rels = vec![];
    for a in 0..10 {
        let p = format!("{walk_rel}/p{a}");
        s.mkdir(h.root.join(&p))?;
        rels.push(p.clone());
        for b in 1..per {
            let c = format!("{p}/c{b}");
            s.mkdir(h.root.join(&c))?;
            rels.push(c);
        }
    }
    let sub = IoHierarchy {
        mode: h.mode,
        root: h.root.join(&walk_rel),
        io_enabled: h.io_enabled,
    };
    let (mut t_scan, mut t_load) = (vec![], vec![]);
    let mut found = 0;
    for round in 0..=rounds {
        for j in 0..2 {
            let t = Instant::now();
            if (round + j) % 2 == 0 {
                found = sub.scan().len();
                t_scan.push(t.elapsed().as_secs_f64() * 1e3);
            } else {
                let mut n = 0;
                for r in &rels {
                    let hier: Box<dyn cgroups_rs::fs::Hierarchy> = if v2 {
                        Box::new(hierarchies::V2::new())
                    } else {
                        Box::new(hierarchies::V1::new())
                    };
                    let cg = Cgroup::load(hier, r);
                    n += cg.exists() as usize;
                }
                sink += n as u64;
                t_load.push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
    }
    std::hint::black_box(sink);
    t_scan.remove(0);
    t_load.remove(0);
    println!();
    println!(
        "| {} cgroups | median ms | spread (min-max) |",
        rels.len() + 1
    );
    println!("|---|---:|---:|");
    let (m, lo, hi) = stats(t_scan);
    println!(
        "| agent: IoHierarchy::scan (inode -> path, {found} found) | {m:.2} | {lo:.2}-{hi:.2} |"
    );
    println!("| cgroups-rs: no walk or id lookup; Cgroup::load + exists() per known path | {:.2} | {:.2}-{:.2} |", stats(t_load.clone()).0, stats(t_load.clone()).1, stats(t_load).2);
    drop(s);
    println!();
    println!("cleanup done: scratch cgroups removed, {loop_dev} detached, image deleted");
    Ok(())
}
