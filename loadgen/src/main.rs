//! A small, static load generator for tests (on the host, in VMs and in containers, where
//! fio is not available). Every run is bounded by bytes and by time.
//!
//!   isolator-loadgen --path FILE --op read|write|randread --bytes N [--bs 4096]
//!                    [--direct] [--fsync] [--wrap] [--threads 1] [--seconds 30]
//!                    [--offset BYTES] [--lat-log FILE]
//!                    [--cgroup DIR]
//!   isolator-loadgen --churn DIR --cgroups N --wave W --path FILE
//!
//! The churn mode creates N cgroups under DIR in waves of W: each one is joined, one
//! 4 KiB O_DIRECT read of FILE is made from it, and the cgroup is left and removed again
//! at the end of its wave (cgroup v2).
//!
//! Prints one line: `ok op=... bytes=N ios=N secs=F`.
//!
//! `--lat-log FILE` writes every I/O's latency as fio's `--write_lat_log` does (lines
//! `ms after the start, latency ns, direction, bs, offset`), so the tests judge the client's
//! own log the same way where fio runs (the host) and where it does not (a VM's busybox).

use std::{
    fs::OpenOptions,
    io::{Seek, SeekFrom, Write},
    os::unix::fs::{FileExt, OpenOptionsExt},
    process::ExitCode,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

struct Args {
    path: String,
    op: String,
    bytes: u64,
    bs: usize,
    direct: bool,
    fsync: bool,
    /// Writes start over at the file's beginning at its end (a preallocated file), so a
    /// long write load never grows the file.
    wrap: bool,
    threads: usize,
    seconds: u64,
    offset: u64,
    cgroup: Option<String>,
    lat_log: Option<String>,
    churn: Option<String>,
    cgroups: usize,
    wave: usize,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        path: String::new(),
        op: String::new(),
        bytes: 0,
        bs: 4096,
        direct: false,
        fsync: false,
        wrap: false,
        threads: 1,
        seconds: 30,
        offset: 0,
        cgroup: None,
        lat_log: None,
        churn: None,
        cgroups: 0,
        wave: 500,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut val = || it.next().ok_or(format!("{k} needs a value"));
        match k.as_str() {
            "--path" => a.path = val()?,
            "--op" => a.op = val()?,
            "--bytes" => a.bytes = val()?.parse().map_err(|e| format!("--bytes: {e}"))?,
            "--bs" => a.bs = val()?.parse().map_err(|e| format!("--bs: {e}"))?,
            "--threads" => a.threads = val()?.parse().map_err(|e| format!("--threads: {e}"))?,
            "--seconds" => a.seconds = val()?.parse().map_err(|e| format!("--seconds: {e}"))?,
            "--cgroup" => a.cgroup = Some(val()?),
            "--lat-log" => a.lat_log = Some(val()?),
            "--offset" => a.offset = val()?.parse().map_err(|e| format!("--offset: {e}"))?,
            "--churn" => a.churn = Some(val()?),
            "--cgroups" => a.cgroups = val()?.parse().map_err(|e| format!("--cgroups: {e}"))?,
            "--wave" => a.wave = val()?.parse().map_err(|e| format!("--wave: {e}"))?,
            "--direct" => a.direct = true,
            "--fsync" => a.fsync = true,
            "--wrap" => a.wrap = true,
            _ => return Err(format!("unknown argument {k}")),
        }
    }
    if a.churn.is_some() {
        if a.path.is_empty() || a.cgroups == 0 || a.wave == 0 {
            return Err("usage: --churn DIR --cgroups N --wave W --path FILE".into());
        }
        return Ok(a);
    }
    if a.path.is_empty() || !["read", "write", "randread"].contains(&a.op.as_str()) {
        return Err("usage: --path FILE --op read|write|randread --bytes N".into());
    }
    if a.bs == 0 || !a.bs.is_multiple_of(512) || a.threads == 0 || a.seconds == 0 {
        return Err("--bs must be a multiple of 512; --threads and --seconds > 0".into());
    }
    Ok(a)
}

/// 4 KiB-aligned buffer for O_DIRECT.
struct Aligned {
    ptr: *mut u8,
    len: usize,
}
unsafe impl Send for Aligned {}
impl Aligned {
    fn new(len: usize) -> Self {
        let layout = std::alloc::Layout::from_size_align(len, 4096).unwrap();
        // SAFETY: non-zero size layout.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        for i in 0..len {
            // SAFETY: in bounds. Non-zero, incompressible-ish content.
            unsafe { *ptr.add(i) = (i * 131 % 251) as u8 };
        }
        Aligned { ptr, len }
    }
    fn buf(&mut self) -> &mut [u8] {
        // SAFETY: allocated with len bytes.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

/// One I/O of the latency log.
struct Sample {
    /// When it was issued, after the start.
    at_ms: u64,
    latency_ns: u64,
    offset: u64,
}

/// Writes `samples` in issue order, in fio's lat log format (direction 0 read, 1 write).
fn write_lat_log(
    path: &str,
    samples: &mut [Sample],
    direction: u8,
    bs: usize,
) -> std::io::Result<()> {
    samples.sort_by_key(|s| s.at_ms);
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    for s in samples.iter() {
        writeln!(
            out,
            "{}, {}, {direction}, {bs}, {}",
            s.at_ms, s.latency_ns, s.offset
        )?;
    }
    out.flush()
}

/// See the module doc: N cgroups, one read each, in waves.
fn churn(dir: &str, a: &Args) -> Result<(), String> {
    let home = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("0::").map(str::to_string))
        })
        .ok_or("not in a cgroup v2 hierarchy")?;
    let join = |cg: &str| {
        std::fs::write(
            format!("{cg}/cgroup.procs"),
            format!("{}\n", std::process::id()),
        )
        .map_err(|e| format!("joining {cg}: {e}"))
    };
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&a.path)
        .map_err(|e| format!("open {}: {e}", a.path))?;
    let mut buf = Aligned::new(4096);
    let mut made = 0;
    while made < a.cgroups {
        let n = a.wave.min(a.cgroups - made);
        let names: Vec<String> = (made..made + n)
            .map(|i| format!("{dir}/churn-{i}"))
            .collect();
        for (i, cg) in names.iter().enumerate() {
            std::fs::create_dir(cg).map_err(|e| format!("mkdir {cg}: {e}"))?;
            join(cg)?;
            let r = file.read_exact_at(buf.buf(), (i as u64 % 1024) * 4096);
            join(&format!("/sys/fs/cgroup{home}"))?;
            r.map_err(|e| format!("read {}: {e}", a.path))?;
        }
        for cg in &names {
            std::fs::remove_dir(cg).map_err(|e| format!("rmdir {cg}: {e}"))?;
        }
        made += n;
    }
    Ok(())
}

fn main() -> ExitCode {
    let a = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("isolator-loadgen: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(dir) = &a.churn {
        return match churn(dir, &a) {
            Ok(()) => {
                println!("ok churn cgroups={}", a.cgroups);
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("isolator-loadgen: churn: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let Some(cg) = &a.cgroup {
        let procs = format!("{cg}/cgroup.procs");
        if let Err(e) = std::fs::write(&procs, format!("{}\n", std::process::id())) {
            eprintln!("isolator-loadgen: cannot join {procs}: {e}");
            return ExitCode::FAILURE;
        }
    }
    let mut opts = OpenOptions::new();
    if a.op == "write" {
        opts.write(true).create(true);
    } else {
        opts.read(true);
    }
    if a.direct {
        opts.custom_flags(libc::O_DIRECT);
    }
    let file = match opts.open(&a.path) {
        Ok(f) => Arc::new(f),
        Err(e) => {
            eprintln!("isolator-loadgen: open {}: {e}", a.path);
            return ExitCode::FAILURE;
        }
    };
    // Block devices report size 0 in metadata; their end is where a seek lands.
    let file_len = match file.metadata().map(|m| m.len()) {
        Ok(0) | Err(_) => (&*file).seek(SeekFrom::End(0)).unwrap_or(0),
        Ok(n) => n,
    };
    if (a.op != "write" || a.wrap) && file_len < a.bs as u64 {
        eprintln!("isolator-loadgen: {} is smaller than one block", a.path);
        return ExitCode::FAILURE;
    }
    let blocks_total = a.bytes / a.bs as u64;
    let next = Arc::new(AtomicU64::new(0));
    let done_bytes = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(a.seconds);
    let start = Instant::now();
    let mut handles = vec![];
    let logging = a.lat_log.is_some();
    for t in 0..a.threads {
        let (file, next, done_bytes) = (file.clone(), next.clone(), done_bytes.clone());
        let (op, bs, base, wrap) = (a.op.clone(), a.bs, a.offset, a.wrap);
        handles.push(std::thread::spawn(
            move || -> std::io::Result<Vec<Sample>> {
                // Kept in memory and written at the end: a write per I/O would be I/O of its own.
                let mut samples = vec![];
                let mut buf = Aligned::new(bs);
                let mut rng = 0x9e3779b97f4a7c15u64 ^ (t as u64 + 1);
                let file_blocks = (file_len / bs as u64).max(1);
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= blocks_total || Instant::now() > deadline {
                        return Ok(samples);
                    }
                    let off = match op.as_str() {
                        "randread" => {
                            rng ^= rng << 13;
                            rng ^= rng >> 7;
                            rng ^= rng << 17;
                            (rng % file_blocks) * bs as u64
                        }
                        "read" => (i % file_blocks) * bs as u64,
                        _ if wrap => (i % file_blocks) * bs as u64,
                        _ => i * bs as u64,
                    };
                    let issued = Instant::now();
                    if op == "write" {
                        file.write_all_at(buf.buf(), base + off)?;
                    } else {
                        file.read_exact_at(buf.buf(), base + off)?;
                    }
                    if logging {
                        samples.push(Sample {
                            at_ms: issued.duration_since(start).as_millis() as u64,
                            latency_ns: issued.elapsed().as_nanos() as u64,
                            offset: base + off,
                        });
                    }
                    done_bytes.fetch_add(bs as u64, Ordering::Relaxed);
                }
            },
        ));
    }
    let mut samples = vec![];
    for h in handles {
        match h.join() {
            Ok(Ok(s)) => samples.extend(s),
            Ok(Err(e)) => {
                eprintln!("isolator-loadgen: I/O error: {e}");
                return ExitCode::FAILURE;
            }
            Err(_) => return ExitCode::FAILURE,
        }
    }
    if a.fsync {
        if let Err(e) = file.sync_all() {
            eprintln!("isolator-loadgen: fsync: {e}");
            return ExitCode::FAILURE;
        }
    }
    if let Some(path) = &a.lat_log {
        let direction = u8::from(a.op == "write");
        if let Err(e) = write_lat_log(path, &mut samples, direction, a.bs) {
            eprintln!("isolator-loadgen: writing {path}: {e}");
            return ExitCode::FAILURE;
        }
    }
    let bytes = done_bytes.load(Ordering::Relaxed);
    let mut out = std::io::stdout();
    let _ = writeln!(
        out,
        "ok op={} bytes={} ios={} secs={:.3}",
        a.op,
        bytes,
        bytes / a.bs as u64,
        start.elapsed().as_secs_f64()
    );
    ExitCode::SUCCESS
}
