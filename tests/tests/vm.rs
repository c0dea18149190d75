//! The same static binary on Debian's 5.10, 6.1 and 6.12 kernels with cgroup v2, booted under
//! qemu (tcg): it attaches, and its per-cgroup bytes agree with the kernel's io.stat within
//! 2 %, for O_DIRECT and buffered writes flushed by writeback (charged to the dirtying cgroup on v2) and direct reads in two cgroups at once.
//!
//! The guest is a busybox initramfs with the static `isolator` and `isolator-loadgen`; I/O
//! goes to a null_blk device (no disk is written). The guest prints io.stat and the event
//! stream to the serial console, which this test parses.

use isolator_tests::{
    scenario::{self, Aggressor, Mode, Scenario},
    vm::*,
    vm_scenario::{self, VmDisk},
    *,
};
use serde_json::Value;

/// The guest's init after [`GUEST_PREAMBLE`].
const INIT: &str = r#"# The agent writes events only in a directory no other user can write (tmpfs /tmp is 1777).
mkdir -m 700 /tmp/ev
# Waits (at most 120 s) until the agent writing events to $1 has started.
wait_started() {
  i=0
  while ! grep -q agent_start "$1" 2>/dev/null; do
    i=$((i+1)); [ $i -gt 600 ] && break; sleep 0.2
  done
}
insmod /lib/configfs.ko
insmod /lib/null_blk.ko nr_devices=1 gb=1 bs=4096
echo +io > /sys/fs/cgroup/cgroup.subtree_control
mkdir /sys/fs/cgroup/a /sys/fs/cgroup/b
echo "=== uname $(uname -r)"
echo "=== nullb0 $(cat /sys/block/nullb0/dev)"
/isolator check
echo "=== check rc=$?"
/isolator run --interval 1s --json /tmp/ev/ev.json 2>/tmp/agent.err &
AP=$!
wait_started /tmp/ev/ev.json
L=/loadgen
$L --cgroup /sys/fs/cgroup/a --path /dev/nullb0 --op write --bytes 33554432 --bs 65536 --direct --threads 2 &
P1=$!
$L --cgroup /sys/fs/cgroup/a --path /dev/nullb0 --op randread --bytes 8388608 --bs 4096 --direct &
P2=$!
$L --cgroup /sys/fs/cgroup/b --path /dev/nullb0 --op read --bytes 16777216 --bs 16384 --direct &
P3=$!
sh -c 'echo $$ > /sys/fs/cgroup/b/cgroup.procs; exec /loadgen --path /dev/nullb0 --op write --bytes 8388608 --bs 65536 --offset 536870912 --seconds 60' &
P4=$!
wait $P1 $P2 $P3 $P4
# Buffered writes of b are flushed by writeback, which v2 charges to b.
sync
sleep 3
kill -TERM $AP
wait $AP
echo "=== agent rc=$?"
cat /tmp/agent.err
echo "=== io.stat a"
cat /sys/fs/cgroup/a/io.stat
echo "=== io.stat b"
cat /sys/fs/cgroup/b/io.stat
echo "=== events"
cat /tmp/ev/ev.json
# Enforcement on v2: a ceiling (io.max), a weight (io.weight) and iocost on the disk (the
# root's io.cost.qos, asked by [iocost]), then SIGTERM restores.
mkdir /sys/fs/cgroup/c
printf '[[service]]\nname = "c"\ncgroup = "/c"\nclass = "best-effort"\nceiling = "10MB/s"\nweight = 300\n\n[iocost]\ndisks = ["nullb0"]\n' > /tmp/c.toml
echo "=== io.cost.qos before"
cat /sys/fs/cgroup/io.cost.qos
/isolator run --interval 1s --json /tmp/ev/ev2.json --config /tmp/c.toml --journal-dir /tmp/j 2>/tmp/agent2.err &
AP=$!
wait_started /tmp/ev/ev2.json
$L --cgroup /sys/fs/cgroup/c --path /dev/nullb0 --op randread --bytes 107374182400 --bs 65536 --direct --seconds 6
echo "=== io.max during"
cat /sys/fs/cgroup/c/io.max
echo "=== io.weight during"
cat /sys/fs/cgroup/c/io.weight
echo "=== io.cost.qos during"
cat /sys/fs/cgroup/io.cost.qos
kill -TERM $AP
wait $AP
echo "=== agent2 rc=$?"
cat /tmp/agent2.err
echo "=== io.max after"
cat /sys/fs/cgroup/c/io.max
echo "=== io.weight after"
cat /sys/fs/cgroup/c/io.weight
echo "=== io.cost.qos after"
cat /sys/fs/cgroup/io.cost.qos
echo "=== events2"
cat /tmp/ev/ev2.json
echo "=== end"
poweroff -f
"#;

fn section<'a>(out: &'a str, name: &str) -> &'a str {
    let start = out
        .find(&format!("=== {name}"))
        .unwrap_or_else(|| panic!("no '=== {name}' in VM output:\n{out}"));
    let rest = &out[start..];
    let body_start = rest.find('\n').map(|i| i + 1).unwrap_or(rest.len());
    let body = &rest[body_start..];
    let end = body.find("\n=== ").map(|i| i + 1).unwrap_or(body.len());
    &body[..end]
}

/// The NDJSON the guest printed on its serial console. A record broken by console output
/// (a kernel message in the middle of a line) fails here rather than being skipped, since a
/// skipped record would read as bytes the agent missed.
fn parse_events(text: &str) -> Vec<Value> {
    text.lines()
        .filter(|l| l.contains("\"schema\""))
        .map(|l| {
            serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("event record garbled on the console: {e}: {l}"))
        })
        .collect()
}

/// Each cgroup's read and write bytes on `dev` per cycle, for a failure message.
fn bytes_by_cycle(events: &[Value], dev: &str) -> String {
    let mut out = String::new();
    for e in events.iter().filter(|e| e["type"] == "cgroup_stats") {
        for d in e["devices"].as_array().into_iter().flatten() {
            if d["dev"] == dev {
                out += &format!(
                    "\n  cycle {} {}: read {} write {}",
                    e["cycle"], e["cgroup"]["path"], d["read"]["bytes"], d["write"]["bytes"]
                );
            }
        }
    }
    out
}

fn agent_bytes_by_path(events: &[Value], path: &str, dev: &str) -> (u64, u64) {
    let id = events
        .iter()
        .find(|e| e["type"] == "cgroup_stats" && e["cgroup"]["path"] == path)
        .and_then(|e| e["cgroup"]["id"].as_u64())
        .unwrap_or_else(|| panic!("no cgroup_stats for {path}"));
    agent_bytes(events, id, dev)
}

fn run_vm(prefix: &str, release_prefix: &str) {
    require_tool("qemu-system-x86_64");
    require_tool("cpio");
    let kdir = kernel_dir(prefix);
    let scratch = Scratch::new();
    let initrd = build_initramfs(&kdir, &scratch, &guest_init(INIT));
    let out = boot(&kdir, &initrd, "2");
    eprintln!("{out}");
    let uname = section(&out, "uname");
    assert!(
        out.contains(&format!("=== uname {release_prefix}")),
        "{uname}"
    );
    assert!(
        out.contains("=== check rc=0"),
        "isolator check failed in the VM:\n{out}"
    );
    assert!(
        out.contains("=== agent rc=0"),
        "agent did not exit 0:\n{out}"
    );
    let dev = out
        .lines()
        .find_map(|l| l.strip_prefix("=== nullb0 "))
        .expect("nullb0 dev")
        .trim()
        .to_string();
    let events = parse_events(section(&out, "events"));
    let start = events
        .iter()
        .find(|e| e["type"] == "agent_start")
        .expect("agent_start");
    assert_eq!(start["cgroup_mode"], "v2");
    let last_cycle = events
        .iter()
        .rev()
        .find(|e| e["type"] == "cycle_end")
        .expect("cycle_end");
    eprintln!(
        "{prefix}: issue_map_timing={} insert_attached={} missed_events={} map_full={} unsampled_requests={}",
        last_cycle["issue_map_timing"],
        last_cycle["insert_attached"],
        last_cycle["missed_events"],
        last_cycle["map_full"],
        last_cycle["unsampled_requests"]
    );
    assert_eq!(
        last_cycle["map_full"], 0,
        "{prefix}: completions were lost (no map entry and no spill slot)"
    );
    assert!(start["kernel"]
        .as_str()
        .unwrap()
        .starts_with(release_prefix));
    for (cg, min_r, min_w) in [("a", 8u64 << 20, 32u64 << 20), ("b", 16 << 20, 8 << 20)] {
        let stat = section(&out, &format!("io.stat {cg}"));
        let kernel =
            io_stat_bytes(stat, &dev).unwrap_or_else(|| panic!("no {dev} in io.stat:\n{stat}"));
        let agent = agent_bytes_by_path(&events, &format!("/{cg}"), &dev);
        eprintln!("{prefix} cgroup {cg}: kernel {kernel:?} agent {agent:?}");
        for (what, k, a, min) in [
            ("read", kernel.0, agent.0, min_r),
            ("write", kernel.1, agent.1, min_w),
        ] {
            // The load ran; exact agreement with the kernel is the check below.
            assert!(
                k >= min / 10 * 9,
                "{cg} {what}: kernel counted {k} of {min} bytes: the load did not run"
            );
            let err = (a as f64 - k as f64).abs() / k as f64;
            assert!(
                err <= 0.02,
                "{prefix} {cg} {what}: agent {a} vs kernel {k}; per cycle:{}\n{}",
                bytes_by_cycle(&events, &dev),
                section(&out, "agent rc")
            );
        }
    }
    check_enforcement(prefix, &out, &dev);
}

/// The v2 enforcement phase: io.max, io.weight and iocost written, effective, restored.
fn check_enforcement(prefix: &str, out: &str, dev: &str) {
    assert!(
        out.contains("=== agent2 rc=0"),
        "controlling agent did not exit 0:\n{out}"
    );
    let during = section(out, "io.max during");
    assert!(
        during.contains(&format!("{dev} rbps=10000000")),
        "{prefix}: io.max not written: {during}"
    );
    let w = section(out, "io.weight during");
    assert!(
        w.contains("default 300"),
        "{prefix}: io.weight not written: {w}"
    );
    let after = section(out, "io.max after");
    assert!(
        !after.contains("rbps=10000000"),
        "{prefix}: io.max not restored: {after}"
    );
    let w = section(out, "io.weight after");
    assert!(
        w.contains("default 100"),
        "{prefix}: io.weight not restored: {w}"
    );
    // iocost: off before (a disk iocost never saw has no line), on while the agent ran,
    // off again after.
    let on = |name: &str| {
        let qos = section(out, name);
        qos.lines()
            .find(|l| l.split_whitespace().next() == Some(dev))
            .is_some_and(|l| l.split_whitespace().any(|kv| kv == "enable=1"))
    };
    assert!(
        !on("io.cost.qos before"),
        "{prefix}: iocost was on before the agent"
    );
    assert!(
        on("io.cost.qos during"),
        "{prefix}: iocost not enabled: {}",
        section(out, "io.cost.qos during")
    );
    assert!(
        !on("io.cost.qos after"),
        "{prefix}: iocost not put back: {}",
        section(out, "io.cost.qos after")
    );
    let events = parse_events(section(out, "events2"));
    // Effective: once capped, the reader moves at most ~10 MB/s (null_blk does GB/s).
    let rates: Vec<(u64, f64, bool)> = events
        .iter()
        .filter(|e| e["type"] == "service_stats" && e["service"] == "c")
        .map(|e| {
            (
                e["cycle"].as_u64().unwrap(),
                e["read_mbps"].as_f64().unwrap(),
                e["limit"]["rbps"].is_u64(),
            )
        })
        .collect();
    eprintln!("{prefix}: service c (cycle, MB/s, capped): {rates:?}");
    let first_cap = rates.iter().find(|r| r.2).expect("never capped").0;
    let capped: Vec<f64> = rates
        .iter()
        .filter(|r| r.0 >= first_cap + 2 && r.1 > 0.0)
        .map(|r| r.1)
        .collect();
    assert!(
        !capped.is_empty(),
        "{prefix}: no cycle under the cap: {rates:?}"
    );
    assert!(
        capped.iter().all(|&m| m <= 11.0),
        "{prefix}: io.max not effective: {rates:?}"
    );
    // The wait io.max imposes is in the reader's total latency. Its 64 KiB reads at
    // 10 MB/s are held ~6.5 ms each by the throttle, before any request exists; null_blk
    // serves them in microseconds. Timed from the request alone, total would be the device's.
    let start = events
        .iter()
        .find(|e| e["type"] == "agent_start")
        .expect("agent_start");
    assert_eq!(
        start["kernel_features"]["throttle_wait_timed"], true,
        "{prefix}: the throttle program is not attached: {}",
        start["kernel_features"]
    );
    let means: Vec<(u64, f64, f64)> = events
        .iter()
        .filter(|e| e["type"] == "cgroup_stats" && e["cgroup"]["path"] == "/c")
        .filter(|e| e["cycle"].as_u64().unwrap() >= first_cap + 2)
        .filter_map(|e| {
            let d = e["devices"].as_array()?.iter().find(|d| d["dev"] == dev)?;
            let r = &d["read"];
            Some((
                e["cycle"].as_u64().unwrap(),
                r["latency"]["mean_ns"].as_f64()?,
                r["total"]["mean_ns"].as_f64()?,
            ))
        })
        .collect();
    eprintln!("{prefix}: cgroup c capped (cycle, device mean ns, total mean ns): {means:?}");
    assert!(!means.is_empty(), "{prefix}: no capped cycle with reads");
    for &(cycle, device, total) in &means {
        assert!(
            total >= 3e6 && total >= 10.0 * device,
            "{prefix}: cycle {cycle}: total mean {total} ns (device {device} ns) leaves out the ~6.5 ms io.max holds each read: {means:?}"
        );
    }
    assert!(
        events
            .iter()
            .filter(|e| e["type"] == "restore")
            .all(|e| e["result"] == "restored"),
        "{prefix}: restore failed"
    );
    assert!(events.iter().filter(|e| e["type"] == "restore").count() >= 3);
    assert!(
        events
            .iter()
            .any(|e| e["type"] == "decision" && e["knob"] == "iocost" && e["applied"] == true),
        "{prefix}: no iocost decision"
    );
}

/// Debian 11's kernel: no `request_queue.disk`, `(queue, request)` issue/insert
/// tracepoints, no BPF atomic fetch or cmpxchg.
#[test]
fn debian_5_10_cgroup_v2() {
    run_vm("linux-image-5.10.", "5.10.");
}

#[test]
fn debian_6_1_cgroup_v2() {
    run_vm("linux-image-6.1.", "6.1.");
}

#[test]
fn debian_6_12_cgroup_v2() {
    run_vm("linux-image-6.12.", "6.12.");
}

/// 2,000 keys on a host with 128 possible CPUs cost at most 64 MiB of kernel memory and
/// at most twice the agent CPU per cycle of the same run with 2 possible CPUs; 10,000
/// short-lived cgroups after them leave memory and keys where they were.
#[test]
fn debian_6_1_128_possible_cpus_2000_keys() {
    let small = scale_run("2", 250, false);
    let big = scale_run("2,maxcpus=128", 250, true);
    assert_eq!(small.possible, "0-1");
    assert_eq!(big.possible, "0-127");
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    for r in [&small, &big] {
        eprintln!(
            "possible {}: agent kernel memory {:.1} MiB at {} keys (idle {:.1} MiB; per-CPU {:.2} MiB of it), host Percpu: +{:.1} MiB, agent RSS {:.1} MiB, CPU {:.2} ms per cycle",
            r.possible,
            mib(r.kernel_bytes()),
            r.loaded.tracked_keys,
            mib(r.idle.kmem),
            mib(r.loaded.agent_percpu),
            mib(r.loaded.percpu.saturating_sub(r.percpu_before)),
            mib(r.loaded.rss),
            r.cpu_per_cycle_ns() as f64 / 1e6
        );
    }
    assert!(
        big.kernel_bytes() <= 64 << 20,
        "128 possible CPUs, 2,000 keys: {:.1} MiB of kernel memory",
        mib(big.kernel_bytes())
    );
    assert!(
        big.loaded.rss < 30 << 20,
        "agent RSS {:.1} MiB at 2,000 keys",
        mib(big.loaded.rss)
    );
    assert!(
        big.cpu_per_cycle_ns() <= 2 * small.cpu_per_cycle_ns(),
        "agent CPU per cycle: {} ns at 128 possible CPUs vs {} ns at 2",
        big.cpu_per_cycle_ns(),
        small.cpu_per_cycle_ns()
    );
    assert!(
        big.loaded.agent_percpu <= 8 << 20,
        "per-CPU memory charged to the agent: {:.1} MiB",
        mib(big.loaded.agent_percpu)
    );
    let churned = big.churned.unwrap();
    eprintln!("after 10,000 short-lived cgroups: {churned:?}");
    assert_eq!(churned.map_full, 0);
    assert!(
        churned.kmem <= big.loaded.kmem + (4 << 20),
        "kernel memory did not return: {:.1} MiB after the churn, {:.1} MiB before",
        mib(churned.kmem),
        mib(big.loaded.kmem)
    );
    // A few keys of the host itself (writeback, the root cgroup) may appear meanwhile.
    assert!(
        churned.tracked_keys <= big.loaded.tracked_keys + 8,
        "keys of removed cgroups stayed: {} after, {} before",
        churned.tracked_keys,
        big.loaded.tracked_keys
    );
}

/// Scenario 6 of issue 17, the control path: the writer scenario inside a 6.12 guest on
/// cgroup v2, where the agent's knob is `io.max` (the host is v1), on a virtio disk that is a
/// file on the host's disk. `adaptive` must see the writer push the reader over its SLO, cap
/// the writer through io.max, bring the reader back within its SLO, keep the writer above
/// its floor, and leave no cap behind when it exits (`vm_scenario::run` fails a run that does).
///
/// Back within 6 cycles, not the host scenarios' 3: the guest's uncapped writer may run at
/// more than 8x the rate that keeps the reader within its SLO (CI at f651366: 2164 MB/s, the
/// reader over 15 ms until the cap was under 263), a ratio no host disk showed (knees at
/// 17-60 % of a writer alone). From no cap `adaptive` cuts at least half, then three quarters
/// of a cap that did not hold, and judges each cut in the cycle after its transition: three
/// cuts, up to 32x, in six cycles. That CI run took all three (2164 -> 1082 -> 263 -> 66
/// MB/s), the reader back at the fifth cycle; run G's repeats took 3, 3 and 1.
///
/// How well it controls is the benchmark's question (BENCHMARKS run G, median of 3), not this
/// test's: under emulation the reader's p99.9 rests on 400-1,500 I/Os a cycle and the guest's
/// knee moved from about 400 to over 1,000 MB/s between two runs 40 minutes apart, so the
/// host tests' verdict (client p99.9 within the SLO, a static cap 1.5x as fast isolating
/// worse) passed one run of it and failed the next (15.22 and 16.80 ms against 15) with
/// nothing changed in between.
#[test]
fn cgroup_v2_io_max_control_in_a_vm_caps_the_writer_and_restores() {
    require_tool("qemu-system-x86_64");
    require_tool("cpio");
    require_tool("tar");
    let scratch = Scratch::new();
    let disk = VmDisk::new(&scratch);
    // The SLO is the guest's (`run_calibrated`): 15 ms, run G's, was never broken in a CI
    // run where the writer held the reader at 12-14 ms.
    let sc = Scenario::new(Aggressor::Writer, 15, 30);
    let adaptive = Mode::Policy("adaptive".into());
    let mut o =
        vm_scenario::run_calibrated(&disk, &sc, &adaptive).unwrap_or_else(|e| panic!("{e}"));
    scenario::print_cycles(&o);
    if o.hurt.first() != Some(&true) {
        // The emulated contention moved between the calibration and the run (a CI run: 29 ms
        // pooled in the calibration, 12-18 ms a cycle in the run), so the run could not test
        // control. Once more, with the SLO from the run's own cycles next to the writer.
        let slo_us = scenario::slo_from_cycles(&o);
        eprintln!(
            "the writer did not break the calibrated {:.2} ms SLO: again at {:.2} ms",
            o.slo_ms(),
            slo_us as f64 / 1000.0
        );
        let sc = Scenario { slo_us, ..sc };
        o = vm_scenario::run(&disk, &sc, &adaptive).unwrap_or_else(|e| panic!("{e}"));
        scenario::print_cycles(&o);
    }
    let start = o
        .events
        .iter()
        .find(|e| e["type"] == "agent_start")
        .expect("agent_start");
    assert_eq!(start["cgroup_mode"], "v2");
    assert!(
        o.hurt.first() == Some(&true),
        "the writer never pushed the reader over its {:.2} ms SLO in the guest: the run proves nothing ({:?})",
        o.slo_ms(), o.p999_ms
    );
    assert!(
        o.events.iter().any(|e| e["type"] == "decision"
            && e["service"] == "backup"
            && e["knob"] == "wbps"
            && e["applied"] == true),
        "adaptive wrote no io.max cap on the writer"
    );
    assert!(
        o.cycles_to_slo[0].is_some_and(|c| c <= 6),
        "the reader was not back within its SLO 6 cycles after the writer broke it: {:?} ({:?})",
        o.cycles_to_slo,
        o.p999_ms
    );
    assert!(
        o.aggressor_steady_mbps >= 20.0,
        "the writer was held under its 20 MB/s floor: {:.0} MB/s",
        o.aggressor_steady_mbps
    );
}
