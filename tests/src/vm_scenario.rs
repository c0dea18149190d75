//! Scenario 6: a control scenario on cgroup v2 `io.max`, inside a qemu guest (Debian's 6.12
//! kernel) whose virtio disk is a file on the host's disk. The host here runs cgroup v1, so
//! this is where the v2 knob is exercised under load. The guest runs the scenario of
//! [`crate::scenario`] with the static load generator in place of fio (busybox has no fio):
//! the reader logs every I/O's latency in fio's format, and the guest hands its files back
//! as a tar archive written to a second virtio disk (the serial console is too slow and
//! interleaves kernel messages). The run is judged by [`crate::scenario`]'s own rules.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use serde_json::Value;

use crate::{
    make_file, noisy, run_ok,
    scenario::{judged, Mode, Outcome, Scenario},
    vm, whole_lines, Scratch,
};

/// The guest kernel: the newest of the matrix.
const KERNEL: &str = "linux-image-6.12.";

/// The guest disk's size: the reader reads all of it at random, the writer writes it over
/// and over.
const DISK_BYTES: u64 = 1 << 30;

/// The guest's init after [`vm::GUEST_PREAMBLE`]. Its parameters come on the kernel's command line as `iso.NAME=VALUE`
/// (`args`: the agent's arguments, comma-separated; `cap`: the writer's static io.max in
/// bytes/s, 0 for none; `weights`: the reader's and the writer's io.weight under iocost,
/// `V/A`, 0 for none; `qos`: what follows `enable=1` in io.cost.qos, comma-separated, e.g.
/// `ctrl=user,rpct=99.9,rlat=10000`).
const INIT: &str = r#"mkdir -m 700 /tmp/out
insmod /lib/virtio_blk.ko
for x in $(cat /proc/cmdline); do
  case "$x" in iso.*=*) k=${x%%=*}; eval "${k#iso.}='${x#*=}'";; esac
done
args=$(echo "$args" | tr , ' ')
i=0
while [ ! -b /dev/vda ] || [ ! -b /dev/vdb ]; do
  i=$((i+1)); [ $i -gt 100 ] && break; sleep 0.1
done
# Without them nothing can be measured or handed back: the host sees no "out written".
if [ ! -b /dev/vda ] || [ ! -b /dev/vdb ]; then
  echo "=== the virtio disks did not appear"; poweroff -f
fi
DEV=$(cat /sys/block/vda/dev)
echo "=== vda $DEV $(cat /sys/block/vda/queue/scheduler)"
echo +io > /sys/fs/cgroup/cgroup.subtree_control
mkdir /sys/fs/cgroup/db /sys/fs/cgroup/backup
# The scenario's two loads, for SECONDS: the QD1 reader logging each latency to LOG, and the
# 1 MiB QD32 writer.
reader() { /loadgen --cgroup /sys/fs/cgroup/db --path /dev/vda --op randread --bytes 1099511627776 --direct --seconds "$1" --lat-log "$2"; }
writer() { /loadgen --cgroup /sys/fs/cgroup/backup --path /dev/vda --op write --wrap --bytes 1099511627776 --bs 1048576 --direct --threads 32 --seconds "$1"; }
# slo_ms=auto: the reader's SLO from this guest's own latencies just before the run: the
# reader 4 s alone, then 8 s next to the uncapped writer. The SLO is 0.75 of the median of
# its per-second p99.9s next to the writer (the agent judges seconds, and one slow second
# pooled into a p99.9 set the SLO over every second of a CI run), and at least 3x its p99.9
# alone (so a cap can meet it). `scenario::slo_from_cycles` is the same rule on a finished run, in µs.
if [ "$slo_ms" = auto ]; then
  reader 12 /tmp/cal > /tmp/out/cal.out 2>&1 &
  CP=$!
  sleep 4
  writer 8 >> /tmp/out/cal.out 2>&1
  wait $CP
  # At a few hundred reads a second, a second's p99.9 is its slowest read. A second without
  # any prints nothing.
  p999() { sort -n | awk '{a[NR]=$1} END {if (NR) {i=NR*0.999; j=int(i); if (j<i) j++; if (j<1) j=1; print a[j]+0}}'; }
  solo=$(awk -F, '$1 < 4000 {print $2}' /tmp/cal | p999)
  # The writer's first second is its ramp.
  cont=$(for t in 5 6 7 8 9 10 11; do
    awk -F, -v t=$t '$1 >= t*1000 && $1 < (t+1)*1000 {print $2}' /tmp/cal | p999
  done | sort -n | awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]+0}')
  slo_ms=$(awk -v s="$solo" -v c="$cont" 'BEGIN {a=int(3*s/1e6)+1; b=int(0.75*c/1e6); print (a>b)?a:b}')
  echo "calibration $solo $cont $slo_ms" > /tmp/out/calibration
fi
printf '[[service]]\nname = "db"\ncgroup = "/db"\nclass = "latency"\np999 = "%sms"\n\n[[service]]\nname = "backup"\ncgroup = "/backup"\nclass = "best-effort"\nfloor = "20MB/s"\n' "$slo_ms" > /tmp/s.toml
[ "$cap" = 0 ] || echo "$DEV wbps=$cap" > /sys/fs/cgroup/backup/io.max
# Weights under iocost: the guest takes its virtio disk as rotational, and iocost's HDD
# model would throttle the reader alone; as an SSD it gets iocost's SSD model.
if [ "$weights" != 0 ]; then
  echo 0 > /sys/block/vda/queue/rotational
  echo "$DEV enable=1 $(echo "$qos" | tr , ' ')" > /sys/fs/cgroup/io.cost.qos || { echo "=== iocost refused"; poweroff -f; }
  echo "default ${weights%/*}" > /sys/fs/cgroup/db/io.weight
  echo "default ${weights#*/}" > /sys/fs/cgroup/backup/io.weight
  echo "=== iocost $(cat /sys/fs/cgroup/io.cost.qos) model $(cat /sys/fs/cgroup/io.cost.model)"
fi
up() { cut -d' ' -f1 /proc/uptime; }
/isolator run --interval 1s --json /tmp/out/ev.json --config /tmp/s.toml --journal-dir /tmp/j --socket off --docker-socket off $args 2>/tmp/out/agent.err &
AP=$!
i=0
while ! grep -q agent_start /tmp/out/ev.json 2>/dev/null; do
  i=$((i+1)); [ $i -gt 600 ] && break; sleep 0.2
done
# An agent that starts late would take the writer's start for the run's: no run then.
if ! grep -q agent_start /tmp/out/ev.json 2>/dev/null; then
  echo "=== the agent did not start within 120 s"; cat /tmp/out/agent.err; poweroff -f
fi
total=$((solo_s + on_s * times + off_s * (times - 1) + 2))
echo "reader $(up)" > /tmp/out/phases
reader $total /tmp/out/lat > /tmp/out/reader.out 2>&1 &
RP=$!
sleep $solo_s
n=0
while [ $n -lt $times ]; do
  [ $n -gt 0 ] && sleep $off_s
  s=$(up)
  writer $on_s >> /tmp/out/writer.out 2>&1
  rc=$?
  echo "aggressor $s $(up) $rc" >> /tmp/out/phases
  n=$((n+1))
done
wait $RP
echo "reader_rc $?" >> /tmp/out/phases
sleep 2
kill -TERM $AP
wait $AP
echo "agent_rc $?" >> /tmp/out/phases
cat /sys/fs/cgroup/backup/io.max > /tmp/out/io.max.after
tar -cf /dev/vdb -C /tmp out && echo "=== out written"
sync
poweroff -f
"#;

/// The guest's disk: a file on the host's disk, written through once so the reader's reads
/// reach the disk (a hole reads as zeros without any I/O).
pub struct VmDisk {
    image: PathBuf,
}

impl VmDisk {
    pub fn new(scratch: &Scratch) -> VmDisk {
        let image = scratch.path("vm-disk.img");
        make_file(&image, DISK_BYTES);
        VmDisk { image }
    }
}

/// Runs `scenario` in `mode` once in a fresh guest (the aggressor is the writer: scenario 1).
pub fn run(disk: &VmDisk, scenario: &Scenario, mode: &Mode) -> Result<Outcome, String> {
    run_with_qos(disk, scenario, mode, "")
}

/// [`run`], with the reader's SLO set in the guest from its own latencies just before the
/// run (0.75 of the median of its per-second p99.9s next to the uncapped writer, at least 3x
/// its p99.9 alone; the outcome's `slo_us`) in place of `scenario.slo_us`. Under emulation
/// the reader's p99.9 next to the writer moved between 12 and 32 ms from one run to another
/// (it is mostly the emulated CPU under the writer's threads), so a fixed SLO is sometimes
/// never broken; a benchmark comparing modes keeps one fixed SLO for all of them instead.
pub fn run_calibrated(disk: &VmDisk, scenario: &Scenario, mode: &Mode) -> Result<Outcome, String> {
    run_in_guest(disk, scenario, mode, "", true)
}

/// [`run`], with `qos` after `enable=1` in io.cost.qos where the mode enables iocost
/// (e.g. `ctrl=user rpct=99.9 rlat=10000`: iocost's own latency target; by default it has
/// none, rpct=0, and steers its rate by queue depth alone).
pub fn run_with_qos(
    disk: &VmDisk,
    scenario: &Scenario,
    mode: &Mode,
    qos: &str,
) -> Result<Outcome, String> {
    run_in_guest(disk, scenario, mode, qos, false)
}

fn run_in_guest(
    disk: &VmDisk,
    scenario: &Scenario,
    mode: &Mode,
    qos: &str,
    calibrate: bool,
) -> Result<Outcome, String> {
    let kdir = vm::kernel_dir(KERNEL);
    let run_dir = Scratch::new();
    // `policy@REV` runs another commit's agent in the guest, as on the host.
    let agent = mode.agent_binary()?.unwrap_or_else(crate::isolator_bin);
    let initrd = vm::build_initramfs_with(
        &kdir,
        &run_dir,
        &vm::guest_init(INIT),
        &["drivers/block/virtio_blk"],
        &agent,
    );
    let out_img = run_dir.path("out.img");
    std::fs::File::create(&out_img)
        .and_then(|f| f.set_len(64 << 20))
        .map_err(|e| format!("{}: {e}", out_img.display()))?;
    let cap = mode
        .single_aggressor_cap()?
        .map_or(0, |mbps| mbps * 1_000_000);
    let weights = match mode {
        Mode::Weights(v, a) => format!("{v}/{a}"),
        _ => "0".into(),
    };
    let qos = qos.split_whitespace().collect::<Vec<_>>().join(",");
    let append = format!(
        "iso.slo_ms={} iso.solo_s={} iso.on_s={} iso.off_s={} iso.times={} iso.cap={cap} iso.weights={weights} iso.qos={qos} iso.args={}",
        if calibrate {
            "auto".to_string()
        } else {
            scenario.slo_ms().to_string()
        },
        scenario.solo_s,
        scenario.on_s,
        scenario.off_s,
        scenario.times,
        mode.agent_args().join(",")
    );
    let drive = |file: &Path, extra: &str| {
        format!(
            "file={},if=virtio,format=raw{extra}",
            file.to_str().unwrap()
        )
    };
    // cache=none: the guest's I/O reaches the host's disk (O_DIRECT), not its page cache.
    let (data, out) = (
        drive(&disk.image, ",cache=none,aio=native"),
        drive(&out_img, ""),
    );
    let console = vm::boot_with(
        &kdir,
        &initrd,
        "2",
        &["-drive", &data, "-drive", &out],
        &append,
    );
    let label = mode.label();
    if let Some(l) = console.lines().find(|l| l.contains("=== iocost")) {
        eprintln!("{label}: {}", l.trim());
    }
    if !console.contains("=== out written") {
        return Err(format!(
            "{label}: the guest wrote no results; its console:\n{console}"
        ));
    }
    run_ok(
        Command::new("tar")
            .arg("-xf")
            .arg(&out_img)
            .arg("-C")
            .arg(&run_dir.dir),
    );
    let file = |name: &str| -> Result<String, String> {
        let p = run_dir.path(&format!("out/{name}"));
        std::fs::read_to_string(&p).map_err(|e| format!("{label}: {}: {e}", p.display()))
    };
    let scenario = if calibrate {
        let line = file("calibration")?;
        let slo_ms = parse_calibration(&line).map_err(|e| {
            format!(
                "{label}: the guest's calibration: {e}: {:?}; its load: {}",
                line.trim(),
                file("cal.out").unwrap_or_default()
            )
        })?;
        eprintln!("{label}: {}", line.trim());
        &Scenario {
            slo_us: slo_ms * 1000,
            ..scenario.clone()
        }
    } else {
        scenario
    };
    let phases = file("phases")?;
    let (reader_s, aggressor_s) = parse_phases(&phases).map_err(|e| {
        format!(
            "{label}: {e}; the guest's phases:\n{phases}\nwriter: {}",
            file("writer.out").unwrap_or_default()
        )
    })?;
    for (what, tag) in [("the reader", "reader_rc 0"), ("the agent", "agent_rc 0")] {
        if !phases.lines().any(|l| l == tag) {
            return Err(format!(
                "{label}: {what} failed in the guest:\n{phases}\nagent: {}\nreader: {}",
                file("agent.err").unwrap_or_default(),
                file("reader.out").unwrap_or_default()
            ));
        }
    }
    // The guest's io.max of the writer once the agent had exited: what a static mode set by
    // hand (a refused write would have run the mode uncapped), and nothing a policy wrote
    // (the agent restores what it changed).
    let left = file("io.max.after")?;
    match mode {
        Mode::Policy(_) if left.contains("wbps=") => {
            return Err(format!(
                "{label}: the agent left a cap behind on the writer: {}",
                left.trim()
            ))
        }
        Mode::Static(_) if !left.contains(&format!("wbps={cap} ")) => {
            return Err(format!(
                "{label}: the writer's io.max is not the mode's cap: {:?}",
                left.trim()
            ))
        }
        _ => {}
    }
    let events: Vec<Value> = whole_lines(&file("ev.json")?)
        .map(|l| serde_json::from_str(l).map_err(|e| format!("{label}: event {l}: {e}")))
        .collect::<Result<_, _>>()?;
    let lat = noisy::parse_lat_log(&file("lat")?);
    let to_ms = |s: f64| ((s - reader_s).max(0.0) * 1000.0) as u64;
    let phases_ms: Vec<(u64, u64)> = aggressor_s
        .iter()
        .map(|&(s, e)| (to_ms(s), to_ms(e)))
        .collect();
    eprintln!(
        "{label}: the guest's writer: {}",
        file("writer.out")?.trim().replace('\n', "; ")
    );
    Ok(judged(mode, scenario, &events, &lat, &phases_ms))
}

/// The guest's `calibration` line (`calibration SOLO_NS CONTENDED_NS SLO_MS`): the SLO it
/// chose, once both p99.9s are there.
fn parse_calibration(line: &str) -> Result<u64, String> {
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().map_err(|e| format!("{x:?}: {e}")))
        .collect::<Result<_, _>>()?;
    match f.as_slice() {
        [solo, contended, slo] if *solo > 0 && *contended > 0 => Ok(*slo),
        _ => Err("the reader logged no latency alone or next to the writer".into()),
    }
}

/// The guest's `phases` file: when the reader started (s of uptime), and each aggressor
/// phase's start and end; an aggressor that failed is an error.
fn parse_phases(text: &str) -> Result<(f64, Vec<(f64, f64)>), String> {
    let mut reader = None;
    let mut aggressor = vec![];
    for l in text.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        let num = |s: &str| s.parse::<f64>().map_err(|e| format!("{l:?}: {e}"));
        match f.as_slice() {
            ["reader", t] => reader = Some(num(t)?),
            ["aggressor", s, e, rc] => {
                if *rc != "0" {
                    return Err(format!("the writer exited with {rc}"));
                }
                aggressor.push((num(s)?, num(e)?));
            }
            _ => {}
        }
    }
    match reader {
        Some(r) if !aggressor.is_empty() => Ok((r, aggressor)),
        _ => Err("no reader start or no aggressor phase".into()),
    }
}
