//! The qemu VM harness: Debian kernels unpacked by scripts/bootstrap.sh, a busybox
//! initramfs with the static binaries, the guest's serial console as output. Used by the VM
//! tests and the scale benchmark.

use std::{
    io::Read,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::*;

pub fn kernel_dir(prefix: &str) -> PathBuf {
    let base = workspace_root().join("target/vm-kernels");
    let found = std::fs::read_dir(&base).ok().and_then(|rd| {
        rd.flatten()
            .map(|e| e.path())
            .find(|p| p.file_name().unwrap().to_string_lossy().starts_with(prefix))
    });
    found.unwrap_or_else(|| {
        panic!(
            "no {prefix}* kernel under {}: run scripts/bootstrap.sh",
            base.display()
        )
    })
}

/// Copies a module into the initramfs, decompressing .ko.xz.
pub fn add_module(kdir: &Path, rel_glob: &str, dest: &Path) {
    let modules = std::fs::read_dir(kdir.join("lib/modules"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    for ext in ["", ".xz"] {
        let src = modules.join(format!("kernel/{rel_glob}.ko{ext}"));
        if !src.exists() {
            continue;
        }
        if ext.is_empty() {
            std::fs::copy(&src, dest).unwrap();
        } else {
            let status = Command::new("sh")
                .arg("-c")
                .arg(format!("xz -dc '{}' > '{}'", src.display(), dest.display()))
                .status()
                .unwrap();
            assert!(status.success(), "xz -dc {}", src.display());
        }
        return;
    }
    panic!("module {rel_glob} not found in {}", modules.display());
}

pub fn build_initramfs(kdir: &Path, scratch: &Scratch, init: &str) -> PathBuf {
    build_initramfs_with(kdir, scratch, init, &[], &isolator_bin())
}

/// As [`build_initramfs`], with more modules (paths under the kernel's `kernel/`, without
/// `.ko`) in the guest's /lib by their file name, for its init to load in this order, and
/// `agent` as the guest's /isolator (the one under test, or another commit's for an A/B).
pub fn build_initramfs_with(
    kdir: &Path,
    scratch: &Scratch,
    init: &str,
    modules: &[&str],
    agent: &Path,
) -> PathBuf {
    let root = scratch.path("root");
    for d in ["bin", "lib", "proc", "sys", "dev", "tmp", "sys/fs/cgroup"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    std::fs::copy("/bin/busybox", root.join("bin/busybox")).expect("busybox-static");
    std::fs::copy(agent, root.join("isolator"))
        .unwrap_or_else(|e| panic!("{}: {e}", agent.display()));
    std::fs::copy(loadgen_bin(), root.join("loadgen")).unwrap();
    add_module(kdir, "fs/configfs/configfs", &root.join("lib/configfs.ko"));
    add_module(
        kdir,
        "drivers/block/null_blk/null_blk",
        &root.join("lib/null_blk.ko"),
    );
    for m in modules {
        let name = m.rsplit('/').next().unwrap();
        add_module(kdir, m, &root.join(format!("lib/{name}.ko")));
    }
    std::fs::write(root.join("init"), init).unwrap();
    run_ok(Command::new("chmod").args(["+x"]).arg(root.join("init")));
    let initrd = scratch.path("initrd.gz");
    run_ok(Command::new("sh").arg("-c").arg(format!(
        "cd '{}' && find . | cpio -o -H newc --quiet | gzip -1 > '{}'",
        root.display(),
        initrd.display()
    )));
    initrd
}

pub fn boot(kdir: &Path, initrd: &Path, smp: &str) -> String {
    boot_with(kdir, initrd, smp, &[], "")
}

/// What a guest's init prints first: a console without it is a guest whose kernel never
/// reached user space.
pub const INIT_STARTED: &str = "=== init started";

/// Boots a guest whose kernel panics before its init runs at most this many times.
const BOOT_ATTEMPTS: usize = 3;

/// As [`boot`], with more qemu arguments (`qemu_extra`: devices) and more on the kernel's
/// command line (`append_extra`).
///
/// A guest kernel that panics before its init starts is booted again (at most
/// [`BOOT_ATTEMPTS`] times): under multi-threaded TCG the guest's boot-time code patching
/// races the emulator's translated code (a CI run: "Oops: int3" in `sched_clock_cpu` at
/// 1.49 s, in swapper, before init), which says nothing about what the test runs in the
/// guest. Anything that goes wrong after init has started is the test's to judge.
pub fn boot_with(
    kdir: &Path,
    initrd: &Path,
    smp: &str,
    qemu_extra: &[&str],
    append_extra: &str,
) -> String {
    let mut attempt = 1;
    loop {
        let console = boot_once(kdir, initrd, smp, qemu_extra, append_extra);
        if !died_before_init(&console) || attempt == BOOT_ATTEMPTS {
            return console;
        }
        eprintln!(
            "the guest's kernel panicked before its init started (boot {attempt} of at most \
             {BOOT_ATTEMPTS}), booting again; its console:\n{}",
            console_tail(&console)
        );
        attempt += 1;
    }
}

/// Whether a guest's console is that of a kernel that panicked before its init started.
fn died_before_init(console: &str) -> bool {
    !console.contains(INIT_STARTED) && console.contains("Kernel panic - not syncing")
}

/// The last 6,000 characters of a guest's console.
fn console_tail(console: &str) -> String {
    let skip = console.chars().count().saturating_sub(6000);
    console.chars().skip(skip).collect()
}

fn boot_once(
    kdir: &Path,
    initrd: &Path,
    smp: &str,
    qemu_extra: &[&str],
    append_extra: &str,
) -> String {
    let vmlinuz = std::fs::read_dir(kdir.join("boot"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("vmlinuz")
        })
        .expect("vmlinuz");
    let mut child = Command::new("qemu-system-x86_64")
        .args([
            "-accel",
            "tcg",
            "-m",
            "1024",
            "-smp",
            smp,
            "-nographic",
            "-no-reboot",
        ])
        .arg("-kernel")
        .arg(&vmlinuz)
        .arg("-initrd")
        .arg(initrd)
        .arg("-append")
        // no_timer_check: under emulation on a busy host the kernel's IO-APIC timer check
        // can time out and panic at boot ("IO-APIC + timer doesn't work"); the check guards
        // against broken hardware, not against a slow emulator (CI saw it once).
        .arg(format!(
            "console=ttyS0 quiet loglevel=1 panic=-1 no_timer_check rdinit=/init {append_extra}"
        ))
        .args(qemu_extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("qemu-system-x86_64 (run scripts/bootstrap.sh)");
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = stdout.read_to_end(&mut s);
        String::from_utf8_lossy(&s).into_owned()
    });
    // Bounded: a hung guest is killed.
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let out = reader.join().unwrap().replace('\r', "");
            panic!(
                "VM {} did not power off within 600 s; its console ended with:\n{}",
                vmlinuz.display(),
                console_tail(&out)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    reader.join().unwrap().replace('\r', "")
}

/// What every guest's init starts with (a guest's script is this and its own body): busybox,
/// the kernel's filesystems, tmpfs /tmp and cgroup v2.
pub const GUEST_PREAMBLE: &str = r#"#!/bin/busybox sh
echo "=== init started"
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp
mount -t cgroup2 none /sys/fs/cgroup
"#;

/// The guest's whole init: [`GUEST_PREAMBLE`], then `body`.
pub fn guest_init(body: &str) -> String {
    format!("{GUEST_PREAMBLE}{body}")
}

/// The scale run: N cgroups (@CGROUPS@) x 4 null_blk disks x (read, write) = 8N keys, with the
/// agent in a cgroup of its own so the kernel memory its maps take is charged there
/// (memory.current less its anon and file pages); `Percpu:` of /proc/meminfo is read
/// too. With CHURN=1, 10,000 more cgroups follow in 20 waves of 500, each doing one read
/// and removed again.
pub const SCALE_INIT: &str = r#"mkdir -m 700 /tmp/ev
insmod /lib/configfs.ko
insmod /lib/null_blk.ko nr_devices=4 gb=1 bs=4096
# Memory accounting for the agent's cgroup only: per-CPU memcg statistics of thousands of
# workload cgroups would otherwise swamp Percpu: (they are the kernel's, not the agent's).
echo "+io +memory" > /sys/fs/cgroup/cgroup.subtree_control
mkdir /sys/fs/cgroup/agent /sys/fs/cgroup/w
echo "+io" > /sys/fs/cgroup/w/cgroup.subtree_control
CG=/sys/fs/cgroup/w
EV=/tmp/ev/ev.json
echo "=== possible $(cat /sys/devices/system/cpu/possible)"
percpu() { awk '/^Percpu:/{print $2 * 1024}' /proc/meminfo; }
kmem() {
  cur=$(cat /sys/fs/cgroup/agent/memory.current)
  anon=$(awk '$1=="anon"{print $2}' /sys/fs/cgroup/agent/memory.stat)
  file=$(awk '$1=="file"{print $2}' /sys/fs/cgroup/agent/memory.stat)
  echo $((cur - anon - file))
}
cpu_ns() { cat /proc/$AP/task/*/schedstat | awk '{s+=$1} END {printf "%.0f", s}'; }
cycles() { grep -c '"cycle_end"' $EV; }
rss() { awk '/^VmRSS:/{print $2 * 1024}' /proc/$AP/status; }
agent_percpu() { awk '$1=="percpu"{print $2}' /sys/fs/cgroup/agent/memory.stat; }
mark() { echo "=== $1 percpu=$(percpu) agent_percpu=$(agent_percpu) kmem=$(kmem) rss=$(rss) cpu_ns=$(cpu_ns) cycles=$(cycles)"; grep '"cycle_end"' $EV | tail -1; }
echo "=== percpu_before $(percpu)"
sh -c "echo \$\$ > /sys/fs/cgroup/agent/cgroup.procs; exec /isolator run --interval 1s --socket off --docker-socket off --json $EV 2>/tmp/agent.err" &
AP=$!
i=0
while ! grep -q '"cycle_end"' $EV 2>/dev/null; do
  i=$((i+1)); [ $i -gt 600 ] && break; sleep 0.2
done
mark idle
for round in 1 2; do
  for g in $(seq 1 @CGROUPS@); do
    mkdir -p $CG/g$g
    sh -c "echo \$\$ > $CG/g$g/cgroup.procs; for d in 0 1 2 3; do dd if=/dev/nullb\$d of=/dev/null bs=4096 count=1 iflag=direct 2>/dev/null; dd if=/dev/zero of=/dev/nullb\$d bs=4096 count=1 seek=$g oflag=direct conv=notrunc 2>/dev/null; done"
  done
done
sleep 5
mark loaded
if [ "$CHURN" = 1 ]; then
  mkdir $CG/churn
  /loadgen --churn $CG/churn --cgroups 10000 --wave 500 --path /dev/nullb0
  echo "=== churn rc=$?"
  sleep 5
  mark churned
fi
kill -TERM $AP
wait $AP
echo "=== agent rc=$?"
tail -c 2000 /tmp/agent.err
echo "=== end"
poweroff -f
"#;

/// One mark the scale guest printed: its figures, and the agent's last cycle_end.
#[derive(Debug, Clone, Copy)]
pub struct Mark {
    pub percpu: u64,
    pub agent_percpu: u64,
    pub kmem: u64,
    pub rss: u64,
    pub cpu_ns: u64,
    pub cycles: u64,
    pub tracked_keys: u64,
    pub map_full: u64,
    pub unsampled: u64,
    /// The last cycle's collect time (`cycle_end.collect_us`).
    pub collect_us: u64,
}

pub fn mark(out: &str, name: &str) -> Mark {
    let body = out
        .split(&format!("=== {name} "))
        .nth(1)
        .unwrap_or_else(|| panic!("no mark {name} in VM output:\n{out}"));
    let mut lines = body.lines();
    let figures = lines.next().unwrap();
    let field = |k: &str| -> u64 {
        figures
            .split_whitespace()
            .find_map(|f| f.strip_prefix(&format!("{k}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("mark {name}: no {k} in {figures:?}"))
    };
    let cycle_end: Value = serde_json::from_str(lines.next().unwrap_or(""))
        .unwrap_or_else(|e| panic!("mark {name}: cycle_end garbled: {e}\n{out}"));
    Mark {
        percpu: field("percpu"),
        agent_percpu: field("agent_percpu"),
        kmem: field("kmem"),
        rss: field("rss"),
        cpu_ns: field("cpu_ns"),
        cycles: field("cycles"),
        tracked_keys: cycle_end["tracked_keys"].as_u64().unwrap(),
        map_full: cycle_end["map_full"].as_u64().unwrap(),
        unsampled: cycle_end["unsampled_requests"].as_u64().unwrap(),
        collect_us: cycle_end["collect_us"].as_u64().unwrap(),
    }
}

pub struct ScaleRun {
    pub possible: String,
    pub percpu_before: u64,
    pub idle: Mark,
    pub loaded: Mark,
    pub churned: Option<Mark>,
}

impl ScaleRun {
    /// Kernel memory the agent holds at 2,000 keys: what its cgroup was charged beyond its
    /// own pages (maps, per-CPU allocations among them, and the process's kernel
    /// structures). `Percpu:` of the whole host also grows with every cgroup the load
    /// creates (the kernel's per-CPU statistics of each blkg); that is reported, not counted.
    pub fn kernel_bytes(&self) -> u64 {
        self.loaded.kmem
    }

    /// Agent CPU time per cycle while the keys were created and used.
    pub fn cpu_per_cycle_ns(&self) -> u64 {
        (self.loaded.cpu_ns - self.idle.cpu_ns) / (self.loaded.cycles - self.idle.cycles).max(1)
    }
}

/// Boots Debian's 6.1 kernel with `-smp smp` and the scale guest.
pub fn scale_run(smp: &str, cgroups: usize, churn: bool) -> ScaleRun {
    scale_run_on("linux-image-6.1.", smp, cgroups, churn)
}

/// As [`scale_run`], on the unpacked kernel whose directory starts with `kernel`. Before
/// 5.11 BPF maps are charged to RLIMIT_MEMLOCK, not to the memcg: there the kernel memory
/// figure leaves the maps out.
pub fn scale_run_on(kernel: &str, smp: &str, cgroups: usize, churn: bool) -> ScaleRun {
    require_tool("qemu-system-x86_64");
    require_tool("cpio");
    let kdir = kernel_dir(kernel);
    let scratch = Scratch::new();
    let init = guest_init(SCALE_INIT)
        .replace("\"$CHURN\" = 1", if churn { "1 = 1" } else { "1 = 0" })
        .replace("@CGROUPS@", &cgroups.to_string());
    let initrd = build_initramfs(&kdir, &scratch, &init);
    let out = boot(&kdir, &initrd, smp);
    let tail: String = out
        .lines()
        .filter(|l| l.starts_with("==="))
        .collect::<Vec<_>>()
        .join("\n");
    eprintln!("-smp {smp}:\n{tail}");
    assert!(
        out.contains("=== agent rc=0"),
        "agent did not exit 0:\n{out}"
    );
    // The first line may follow the firmware's text on the console.
    let after = |tag: &str| -> String {
        out.split(&format!("=== {tag} "))
            .nth(1)
            .and_then(|r| r.lines().next())
            .unwrap_or_else(|| panic!("no '=== {tag}' in VM output:\n{out}"))
            .trim()
            .to_string()
    };
    let possible = after("possible");
    let percpu_before = after("percpu_before").parse().expect("percpu_before");
    let run = ScaleRun {
        possible,
        percpu_before,
        idle: mark(&out, "idle"),
        loaded: mark(&out, "loaded"),
        churned: churn.then(|| mark(&out, "churned")),
    };
    let l = run.loaded;
    assert!(
        l.tracked_keys >= 8 * cgroups as u64,
        "-smp {smp}: {} keys tracked, expected the {} the load made",
        l.tracked_keys,
        8 * cgroups
    );
    assert_eq!(
        (l.map_full, l.unsampled),
        (0, 0),
        "-smp {smp}: samples lost"
    );
    run
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_panic_before_init_is_booted_again() {
        // The CI run's console, shortened.
        let boot_oops =
            "Booting from ROM...\n[    1.488262] Oops: int3: 0000 [#1] PREEMPT SMP NOPTI\n\
                         [    1.490494] Kernel panic - not syncing: Fatal exception in interrupt\n";
        assert!(died_before_init(boot_oops));
        let after_init = format!("{INIT_STARTED}\n=== agent rc=1\nKernel panic - not syncing: x\n");
        assert!(!died_before_init(&after_init));
        assert!(!died_before_init("Booting from ROM...\n"));
        let guest = guest_init("poweroff -f\n");
        assert!(guest.lines().nth(1) == Some(&format!("echo \"{INIT_STARTED}\"")[..]));
    }
}
