//! Kernel memory and agent CPU per cycle against active keys and possible CPUs (root; qemu,
//! as the VM tests): Debian's 6.1 kernel booted with `-smp 2,maxcpus=P`, the agent in a
//! cgroup of its own, N cgroups each reading and writing 4 null_blk disks (8N keys).
//! Prints a markdown table.
//!
//!   cargo run --release -p isolator-benches --bin observe-scale -- [--cpus 2,64,128] [--cgroups 2,12,125,250]
//!       [--kernel linux-image-6.12.]   (a directory prefix under target/vm-kernels)

use isolator_tests::vm::scale_run_on;

fn list(args: &[String], flag: &str, default: &[usize]) -> Vec<usize> {
    match args.iter().position(|a| a == flag) {
        Some(i) => args
            .get(i + 1)
            .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect())
            .unwrap_or_default(),
        None => default.to_vec(),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cpus = list(&args, "--cpus", &[2, 64, 128]);
    let cgroups = list(&args, "--cgroups", &[2, 12, 125, 250]);
    let kernel = args
        .iter()
        .position(|a| a == "--kernel")
        .and_then(|i| args.get(i + 1).cloned())
        .unwrap_or_else(|| "linux-image-6.1.".into());
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    println!("| possible CPUs | keys | agent kernel memory | of it per-CPU | agent RSS | agent CPU per cycle (tcg) | collect per cycle (tcg) |");
    println!("|---|---|---|---|---|---|---|");
    for &n in &cgroups {
        for &p in &cpus {
            let smp = if p == 2 {
                "2".to_string()
            } else {
                format!("2,maxcpus={p}")
            };
            let r = scale_run_on(&kernel, &smp, n, false);
            println!(
                "| {p} | {} | {:.1} MiB | {:.2} MiB | {:.1} MiB | {:.1} ms | {:.1} ms |",
                r.loaded.tracked_keys,
                mib(r.kernel_bytes()),
                mib(r.loaded.agent_percpu),
                mib(r.loaded.rss),
                r.cpu_per_cycle_ns() as f64 / 1e6,
                r.loaded.collect_us as f64 / 1e3,
            );
        }
    }
}
