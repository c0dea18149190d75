//! `isolator run`: start-up (everything that can fail on bad input fails here) and the
//! per-cycle loop, which runs the pipeline's stages in order: collect -> identify ->
//! measure -> decide and enforce (with --config) -> emit. A failing optional step is an
//! event and the cycle goes on; a failing cycle is an event and the loop goes on.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use isolator_common::{OP_READ, OP_WRITE};

use tokio::sync::mpsc;

use crate::{
    collect::collector::{Collector, Snapshot},
    collect::probe::{self, Probe},
    config::Config,
    control::Controller,
    enforcer::{Enforcer, HostLock, Journal},
    events::rotation,
    events::stream::{StreamError, StreamServer},
    events::{
        AgentStart, AgentStop, CgroupGone, CgroupStats, ContainerdConnected, CycleEnd, DeviceStats,
        DiskCycle, DockerConnected, Event, NdjsonSink, Notice, Totals,
    },
    identify::cgroupfs::CgroupMode,
    identify::cgroupfs::IoHierarchy,
    identify::containerd,
    identify::containers::{self, ContainerTable, ContainerUpdate},
    identify::disks::{whole_disk_stats, DiskBusy, DiskCoverage, DiskNames},
    identify::docker,
    identify::naming::Runtime,
    identify::registry::Registry,
    measure::{
        character::{Character, CharacterCounts, CharacterWindows},
        metrics::Metrics,
    },
    policy, privileges,
    prometheus::{
        self,
        model::CycleInput,
        server::{MetricsAddr, MetricsListener},
        Exporter,
    },
    systemd::Notifier,
};

/// `isolator run`'s options.
#[derive(clap::Args)]
pub struct RunOptions {
    /// Cycle length, 1s to 10s (e.g. 1s, 2500ms, 5).
    #[arg(long, default_value = "1s", value_parser = parse_interval)]
    pub interval: Duration,
    /// Append events to this file instead of stdout ("off": no NDJSON output; the socket
    /// and --metrics still serve).
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
    /// Rotate the --json file before it grows past this size (e.g. 100MiB, 64M; K, M, G
    /// are powers of 1024); 0: never (an external logrotate moves it and sends SIGHUP).
    #[arg(long, value_name = "SIZE", default_value = rotation::DEFAULT_MAX_SIZE, value_parser = rotation::parse_max_size)]
    pub json_max_size: u64,
    /// Rotated --json files kept: PATH.1 (newest) to PATH.N; at most N+1 files in all.
    #[arg(long, value_name = "N", default_value_t = rotation::DEFAULT_BACKUPS, value_parser = rotation::parse_backups)]
    pub json_backups: u32,
    /// Kernel BTF to resolve struct offsets from.
    #[arg(long, value_name = "PATH", default_value = probe::DEFAULT_BTF)]
    pub btf: PathBuf,
    /// Services and SLOs (TOML, see docs/config.md); without it the agent only observes.
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// Control policy.
    #[arg(long, default_value = "adaptive", value_parser = clap::builder::PossibleValuesParser::new(policy::POLICY_NAMES))]
    pub policy: String,
    /// Device utilization above which the `ute` policy throttles (0..1).
    #[arg(long, default_value_t = 0.75, value_parser = parse_fraction)]
    pub ute_threshold: f64,
    /// Compute and report every action without writing any limit.
    #[arg(long)]
    pub dry_run: bool,
    /// Where the journal of original limit values lives.
    #[arg(long, value_name = "DIR", default_value = crate::enforcer::DEFAULT_JOURNAL_DIR)]
    pub journal_dir: PathBuf,
    /// Docker Engine API socket, for container names, images and labels ("off": do not ask
    /// Docker; containers are named by id).
    #[arg(long, value_name = "PATH", default_value = "/var/run/docker.sock")]
    pub docker_socket: PathBuf,
    /// containerd's API socket, for Kubernetes pods by namespace and name (its namespace
    /// k8s.io, where the kubelet's containers are; "off": do not ask containerd; pods are
    /// named by UID).
    #[arg(long, value_name = "PATH", default_value = containerd::DEFAULT_SOCKET)]
    pub containerd_socket: PathBuf,
    /// Serve the event stream on this unix socket (mode 0600) for `isolator top` ("off":
    /// do not serve).
    #[arg(long, value_name = "PATH", default_value = crate::events::stream::DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// (cgroup, disk, op) keys the kernel counters hold (120 B each, allocated at start); a
    /// request of a key beyond is a counted loss (cycle_end.map_full).
    #[arg(long, value_name = "N", default_value_t = isolator_common::DEFAULT_MAX_KEYS, value_parser = parse_key_count)]
    pub max_keys: u32,
    /// Keys with latency histograms at most (16 KiB each, allocated on a key's first
    /// completion); beyond, samples are counted as unsampled_requests.
    #[arg(long, value_name = "N", default_value_t = isolator_common::DEFAULT_MAX_HISTOGRAM_KEYS, value_parser = parse_key_count)]
    pub max_histogram_keys: u32,
    /// Count each key's requests in flight (inflight.now and .peak in the events) with a
    /// program at issue: a second program run per request. Without it, only the
    /// time-average in flight (from device time, Little's law) is reported.
    #[arg(long)]
    pub count_inflight: bool,
    /// A key idle this long (and with --count-inflight, nothing in flight) leaves the kernel
    /// maps and the agent's tables (1s to 1h).
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_idle_timeout)]
    pub idle_key_timeout: Duration,
    /// Serve Prometheus metrics (docs/metrics.md) on IP:PORT (e.g. 127.0.0.1:9500,
    /// [::1]:9500, 0.0.0.0:9500) or a unix socket (unix:/run/isolator/metrics.sock, mode
    /// 0600); off by default.
    #[arg(long, value_name = "ADDR", value_parser = crate::prometheus::server::parse_address)]
    pub metrics: Option<MetricsAddr>,
    /// Series the per-(cgroup, disk) and per-(service, disk) metrics may take; a new pair
    /// beyond is left out (and counted) until idle ones leave.
    #[arg(long, value_name = "N", default_value_t = crate::prometheus::model::DEFAULT_MAX_SERIES, value_parser = parse_series_limit)]
    pub metrics_max_series: usize,
}

fn parse_series_limit(s: &str) -> Result<usize, String> {
    let n: usize = s
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a number of series; use e.g. 50000"))?;
    let least = crate::prometheus::model::SERVICE_SERIES;
    if !(least..=10_000_000).contains(&n) {
        return Err(format!("{n} series is outside {least}..=10000000"));
    }
    Ok(n)
}

fn parse_key_count(s: &str) -> Result<u32, String> {
    let n: u64 = s
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a number of keys; use e.g. 16384"))?;
    if !(16..=1 << 20).contains(&n) {
        return Err(format!("{n} keys is outside 16..=1048576"));
    }
    Ok(n as u32)
}

fn parse_idle_timeout(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s.trim())
        .map_err(|_| format!("'{s}' is not a duration; use e.g. 60s or 5m"))?;
    if d < Duration::from_secs(1) || d > Duration::from_secs(3600) {
        return Err(format!("'{s}' is outside 1s..=1h"));
    }
    Ok(d)
}

impl RunOptions {
    /// `isolator run` without arguments: every default as its flags declare it.
    pub fn defaults() -> Result<RunOptions> {
        use clap::{Args, FromArgMatches};
        let cmd = RunOptions::augment_args(clap::Command::new("run"));
        let matches = cmd
            .try_get_matches_from(["run"])
            .context("the defaults of 'isolator run'")?;
        Ok(RunOptions::from_arg_matches(&matches)?)
    }
}

fn parse_fraction(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v < 1.0 => Ok(v),
        _ => Err(format!(
            "'{s}' is not a fraction between 0 and 1; use e.g. 0.75"
        )),
    }
}

pub fn parse_interval(s: &str) -> Result<Duration, String> {
    let outside = || format!("{s} is outside the allowed 1s..10s; pick a cycle between 1s and 10s");
    let d = if let Ok(secs) = s.parse::<f64>() {
        if secs.is_nan() || secs < 0.0 {
            return Err(format!("'{s}' is not a duration; use e.g. 1s or 2500ms"));
        }
        // Checked before converting: Duration::from_secs_f64 panics past u64::MAX seconds.
        if !(1.0..=10.0).contains(&secs) {
            return Err(outside());
        }
        Duration::from_secs_f64(secs)
    } else {
        humantime::parse_duration(s)
            .map_err(|_| format!("'{s}' is not a duration; use e.g. 1s or 2500ms"))?
    };
    if d < Duration::from_secs(1) || d > Duration::from_secs(10) {
        return Err(outside());
    }
    Ok(d)
}

/// A runtime watcher's channel, and whether its outage was already said.
struct RuntimeLink {
    runtime: Runtime,
    socket: PathBuf,
    updates: mpsc::UnboundedReceiver<ContainerUpdate>,
    down_said: bool,
}

impl RuntimeLink {
    /// Follows the runtime at `socket` ("off": not at all).
    fn start(runtime: Runtime, socket: &std::path::Path) -> Option<RuntimeLink> {
        if socket.as_os_str() == "off" {
            return None;
        }
        let updates = match runtime {
            Runtime::Containerd => containerd::spawn_watcher(socket.to_path_buf()),
            _ => docker::spawn_watcher(socket.to_path_buf()),
        };
        Some(RuntimeLink {
            runtime,
            socket: socket.to_path_buf(),
            updates,
            down_said: false,
        })
    }

    /// The event that says the runtime answers.
    fn connected(&self, version: &str, containers: usize) -> Event {
        let socket = self.socket.display().to_string();
        match self.runtime {
            Runtime::Containerd => Event::ContainerdConnected(ContainerdConnected {
                socket,
                version: version.into(),
                namespace: containerd::NAMESPACE.into(),
                containers,
            }),
            _ => Event::DockerConnected(DockerConnected {
                socket,
                api_version: version.into(),
                containers,
            }),
        }
    }

    /// The warning that says it does not, once per outage.
    fn down(&self, error: &str, retry_in: Duration) -> Event {
        let (code, who, meanwhile) = match self.runtime {
            Runtime::Containerd => (
                "containerd_down",
                "containerd",
                "pods are named by UID and their containers by id",
            ),
            _ => ("docker_down", "Docker", "containers are named by id"),
        };
        Event::Warning(Notice {
            code: code.into(),
            message: format!(
                "{who} is not reachable ({error}); {meanwhile} until it is back (next try in {}s, then backing off to every {}s)",
                retry_in.as_secs(),
                containers::BACKOFF_MAX.as_secs()
            ),
        })
    }
}

pub struct Agent {
    sink: NdjsonSink,
    collector: Collector,
    metrics: Metrics,
    registry: Registry,
    disks: DiskNames,
    busy: DiskBusy,
    coverage: DiskCoverage,
    /// Character windows of every (cgroup, disk).
    characters: CharacterWindows<u64>,
    control: Option<Controller>,
    docker: Option<RuntimeLink>,
    containerd: Option<RuntimeLink>,
    /// The metrics endpoint (--metrics).
    exporter: Option<Exporter>,
    /// Fault injection for the tests of what a panic leaves behind (nothing): the cycle
    /// of this number panics. Set by ISOLATOR_FAULT_PANIC_AT_CYCLE.
    panic_at_cycle: Option<u64>,
    /// Attaching block_rq_insert / block_rq_issue on demand failed once: said, not retried
    /// every cycle.
    insert_failed: bool,
    issue_failed: bool,
    /// systemd's notify protocol, for `isolator run` under systemd (not for `top`'s agent).
    notifier: Option<Notifier>,
    // Declared last: dropping it detaches the programs after the maps are released.
    probe: Probe,
}

impl Agent {
    /// Everything that can fail on bad input fails here, before the first cycle.
    pub fn start(opts: &RunOptions) -> Result<Self> {
        let sink = match &opts.json {
            // As --socket off and --docker-socket off do, not a file named "off".
            Some(p) if p.as_os_str() == "off" => NdjsonSink::to_writer(Box::new(std::io::sink())),
            Some(p) => NdjsonSink::file(
                p,
                rotation::RotationLimits {
                    max_bytes: opts.json_max_size,
                    backups: opts.json_backups,
                },
            )
            .with_context(|| {
                format!("cannot open --json {}; choose a writable path", p.display())
            })?,
            None => NdjsonSink::stdout(),
        };
        Agent::start_with_sink(opts, sink)
    }

    /// As `start`, writing events to `sink` instead of `--json` or stdout.
    pub fn start_with_sink(opts: &RunOptions, mut sink: NdjsonSink) -> Result<Self> {
        if !privileges::can_load_bpf(privileges::effective_caps()) {
            bail!(privileges::NEED_PRIVILEGES);
        }
        // Said after agent_start, so that bad input below is the only thing a failed start
        // prints.
        let mut early_events = vec![];
        let release = privileges::kernel_release();
        if let Err(e) = privileges::raise_memlock() {
            // Before 5.11 the maps may fail to load without it; after, the kernel charges
            // BPF memory to the memory cgroup (`check` calls it ok), nothing to warn about.
            if privileges::memlock_needed(privileges::kernel_version(&release)) {
                early_events.push(Event::Warning(Notice {
                    code: "memlock".into(),
                    message: format!(
                        "cannot raise RLIMIT_MEMLOCK ({e}); kernels before 5.11 need it for the \
                         maps: run with CAP_SYS_RESOURCE or LimitMEMLOCK=infinity"
                    ),
                }));
            } else {
                tracing::debug!("cannot raise RLIMIT_MEMLOCK ({e}); not needed on {release}");
            }
        }
        // Bound before anything is loaded: an address in use is bad input.
        let metrics = opts
            .metrics
            .as_ref()
            .map(MetricsListener::bind)
            .transpose()?;
        if metrics.is_some() {
            sink.keep(prometheus::wants);
        }
        let hierarchy = IoHierarchy::detect()?;
        // The config is checked before anything is locked, recovered or written; the
        // disks of its [iocost] too (resolved on this host, enabled at start).
        let (config, iocost_disks) = match &opts.config {
            None => (None, vec![]),
            Some(path) => {
                let cfg = Config::load(path)?;
                let paths: Vec<String> = hierarchy.scan().into_values().collect();
                let file = path.display().to_string();
                cfg.check_against(&file, &paths)?;
                let iocost = cfg.iocost_devices(
                    &file,
                    hierarchy.mode == CgroupMode::V2,
                    &hierarchy.root,
                    &crate::identify::disks::whole_disk,
                )?;
                let policy = policy::by_name(&opts.policy, opts.ute_threshold)
                    .with_context(|| format!("unknown policy '{}'", opts.policy))?;
                (Some((cfg, policy)), iocost)
            }
        };
        // One agent per host enforces; a journal left by a crashed run is restored (where
        // its knobs still hold what it wrote) before anything else.
        let enforcer = if opts.config.is_some() && !opts.dry_run {
            let lock = HostLock::acquire(&hierarchy.root)?;
            let mut e = Enforcer::new(hierarchy.clone(), Some(Journal::open(&opts.journal_dir)?))
                .with_host_lock(lock)
                .with_slice_phases();
            for r in e.recover()? {
                early_events.push(Event::restore("recovery", r));
            }
            e
        } else {
            if opts.journal_dir.join("journal.json").exists() {
                // Only where no agent enforces: a journal is restored by one agent at a time.
                let recovered = HostLock::acquire(&hierarchy.root).and_then(|lock| {
                    let j = Journal::open(&opts.journal_dir)?;
                    Enforcer::new(hierarchy.clone(), Some(j))
                        .with_host_lock(lock)
                        .recover()
                });
                match recovered {
                    Ok(rs) => {
                        early_events.extend(rs.into_iter().map(|r| Event::restore("recovery", r)))
                    }
                    Err(e) => early_events.push(Event::Warning(Notice {
                        code: "journal".into(),
                        message: format!("{e}; run 'isolator restore' once it is free"),
                    })),
                }
            }
            Enforcer::new(hierarchy.clone(), None)
        };
        let control = match config {
            None => None,
            Some((cfg, policy)) => {
                let paths: Vec<String> = hierarchy.scan().into_values().collect();
                let mut c = Controller::new(cfg, policy, enforcer);
                early_events.extend(c.refresh(&hierarchy, &paths, &ContainerTable::default(), 0));
                Some(c)
            }
        };
        let limits = probe::MapLimits {
            max_keys: opts.max_keys,
            max_histogram_keys: opts.max_histogram_keys,
        };
        let stats_map = probe::StatsCapacity::of_this_host(limits)?;
        let btf = probe::load_btf(&opts.btf)?;
        let mut probe = Probe::load(btf, limits, opts.count_inflight)?;
        let mut control = control;
        if let Some(c) = control.as_mut() {
            c.set_throttle_wait_timed(probe.features.throttle_wait_timed);
        }
        if !probe.features.throttle_wait_timed {
            // A pipeline that filters on warnings learns it too, not only a reader of
            // agent_start's features.
            // Either the kernel refused the program, or it has no blk-throttle decision to
            // trace (built without CONFIG_BLK_DEV_THROTTLING: then no limit waits either).
            let why = probe.throttle_error().map_or_else(
                || "the kernel's BTF has no blk-throttle decision function".to_string(),
                str::to_string,
            );
            early_events.push(Event::Warning(Notice {
                code: "throttle_wait_untimed".into(),
                message: format!(
                    "{} ({why}); {}",
                    probe::THROTTLE_UNTIMED,
                    probe::THROTTLE_UNTIMED_FIX
                ),
            }));
        }
        let collector = Collector::new(
            &mut probe.ebpf,
            opts.idle_key_timeout.as_nanos() as u64,
            opts.count_inflight,
        )?;
        if opts.socket.as_os_str() != "off" {
            match StreamServer::bind(&opts.socket) {
                Ok(s) => sink.serve(s),
                // Another agent (say, a dry run next to the real one) keeps its readers.
                Err(e @ StreamError::InUse(_)) => early_events.push(Event::Warning(Notice {
                    code: "socket".into(),
                    message: e.to_string(),
                })),
                Err(e) => return Err(e.into()),
            }
        }
        sink.emit(&Event::AgentStart(AgentStart {
            version: env!("CARGO_PKG_VERSION").into(),
            host: std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_string())
                .unwrap_or_default(),
            pid: std::process::id(),
            kernel: release,
            cgroup_mode: hierarchy.mode,
            cgroup_root: hierarchy.root.display().to_string(),
            attach: "btf_tracepoint".into(),
            interval_s: opts.interval.as_secs_f64(),
            policy: control.as_ref().map(|c| c.policy_name().to_string()),
            ute_threshold: (control.is_some() && opts.policy == "ute")
                .then_some(opts.ute_threshold),
            config: opts.config.as_ref().map(|p| p.display().to_string()),
            dry_run: opts.dry_run,
            stats_map,
            kernel_features: probe.features,
            metrics: metrics.as_ref().map(|l| l.address().to_string()),
        }));
        for e in &early_events {
            // The stream may go to a file or a pipeline: what start-up found missing (the
            // memlock rlimit, untimed waits, the socket taken) also reaches the terminal.
            if let Event::Warning(n) = e {
                tracing::warn!(code = %n.code, "{}", n.message);
            }
            sink.emit(e);
        }
        if let Some(c) = control.as_mut() {
            // iocost first: the weights act only where it is on.
            for e in c
                .apply_iocost(0, &iocost_disks)
                .into_iter()
                .chain(c.apply_weights(0))
            {
                sink.emit(&e);
            }
        }
        sink.flush();
        let exporter = match metrics {
            None => None,
            Some(listener) => {
                let shown = listener.address().to_string();
                let settings = prometheus::Settings {
                    max_series: opts.metrics_max_series,
                    docker: opts.docker_socket.as_os_str() != "off",
                    containerd: opts.containerd_socket.as_os_str() != "off",
                    limits: Default::default(),
                };
                Some(
                    Exporter::start(listener, settings)
                        .with_context(|| format!("cannot serve metrics on {shown}"))?,
                )
            }
        };
        // After the collector's baseline: see DiskCoverage.
        let disk_stats = whole_disk_stats();
        Ok(Agent {
            exporter,
            sink,
            collector,
            metrics: Metrics::default(),
            registry: Registry::new(hierarchy),
            docker: RuntimeLink::start(Runtime::Docker, &opts.docker_socket),
            containerd: RuntimeLink::start(Runtime::Containerd, &opts.containerd_socket),
            disks: DiskNames::default(),
            busy: DiskBusy::at_start(&disk_stats),
            coverage: DiskCoverage::at_start(&disk_stats),
            characters: CharacterWindows::default(),
            control,
            panic_at_cycle: std::env::var("ISOLATOR_FAULT_PANIC_AT_CYCLE")
                .ok()
                .and_then(|v| v.parse().ok()),
            insert_failed: false,
            issue_failed: false,
            notifier: None,
            probe,
        })
    }

    /// Tells systemd (when it started the agent) that the agent is ready once `run_until`
    /// begins, alive after every cycle, and stopping.
    pub fn notifying(mut self, notifier: Notifier) -> Self {
        self.notifier = notifier.enabled().then_some(notifier);
        self
    }

    /// Ready: the programs are attached (start succeeded). What start said (agent_start
    /// first) is written out before systemd hears it, for at most a second: whatever
    /// systemd starts after this unit finds it in the output.
    fn announce_ready(&mut self, interval: Duration) {
        let Some(mut n) = self.notifier.take() else {
            return;
        };
        if let Some(w) = n.watchdog_too_short(interval) {
            self.sink.emit(&Event::warning("watchdog", w));
        }
        self.sink.drain(OUTPUT_DRAIN_TIMEOUT);
        let status = match &self.control {
            Some(c) => format!("controlling with policy {}", c.policy_name()),
            None => "observing".to_string(),
        };
        n.ready(&status);
        self.notifier = Some(n);
    }

    /// Takes what the runtime watchers reported since the last cycle (never waiting on
    /// them). Returns whether the container table changed.
    fn follow_runtimes(&mut self) -> bool {
        let mut changed = false;
        for link in [self.docker.as_mut(), self.containerd.as_mut()]
            .into_iter()
            .flatten()
        {
            while let Ok(u) = link.updates.try_recv() {
                match &u {
                    ContainerUpdate::Connected {
                        version,
                        containers,
                        ..
                    } => {
                        link.down_said = false;
                        self.sink.emit(&link.connected(version, containers.len()));
                    }
                    // Said once per outage; the watcher keeps retrying with backoff.
                    ContainerUpdate::Down { error, retry_in } if !link.down_said => {
                        link.down_said = true;
                        self.sink.emit(&link.down(error, *retry_in));
                    }
                    _ => {}
                }
                changed |= self.registry.apply_containers(&u);
            }
        }
        changed
    }

    /// One cycle: the pipeline's stages in order, each a method below with one job.
    pub fn cycle(&mut self) -> Result<()> {
        let started = Instant::now();
        let snap = self.collect()?;
        let collect_ns = started.elapsed().as_nanos() as u64;
        self.identify(&snap);
        let records = self.measure(&snap);
        let busy = self.sample_disks(&snap);
        self.decide_and_enforce(&snap, &busy);
        self.end_cycle(&snap, busy, records.len(), started);
        self.export(&snap, &records, collect_ns);
        Ok(())
    }

    /// Export (--metrics): the cycle's deltas, its `cgroup_stats` and the events kept since
    /// the last cycle, rendered once for every scrape until the next cycle.
    fn export(&mut self, snap: &Snapshot, records: &[Event], collect_ns: u64) {
        let Some(exporter) = self.exporter.as_mut() else {
            return;
        };
        let events = self.sink.take_kept();
        exporter.cycle(&CycleInput {
            snap,
            cgroups: records,
            events: &events,
            collect_ns,
        });
    }

    /// Collect: the maps' deltas since the last cycle. Programs a queue turns out to need
    /// are attached on demand; that is optional, so a failure is said once and the cycle
    /// goes on without it.
    fn collect(&mut self) -> Result<Snapshot> {
        // The disks' own counts first: see DiskCoverage.
        self.coverage.before_maps();
        let snap = self.collector.collect()?;
        if self.panic_at_cycle == Some(snap.cycle) {
            panic!(
                "fault injected at cycle {} (ISOLATOR_FAULT_PANIC_AT_CYCLE)",
                snap.cycle
            );
        }
        if snap.need_insert && !self.insert_failed {
            // Without it queue time is unknown on such queues.
            let r = self.probe.attach_insert();
            self.insert_failed = report_attach(
                &mut self.sink,
                r,
                "insert",
                "a queue gives requests no start time; block_rq_insert attached to time their queueing",
                "queue time stays unknown on queues that give requests no start time",
            );
        }
        if snap.issue_map_timing && !self.issue_failed {
            // A queue does not stamp requests at issue: the issue program keeps their issue
            // times. Without it their device latency stays unknown.
            let r = self.probe.attach_issue();
            self.issue_failed = report_attach(
                &mut self.sink,
                r,
                "issue",
                "a queue does not stamp requests at issue; block_rq_issue attached to time them",
                "device latency stays unknown on queues that do not stamp requests at issue",
            );
        }
        Ok(snap)
    }

    /// Identify: every cgroup of the snapshot named (registry, Docker, containerd), and the services
    /// following the cgroups and containers that exist.
    fn identify(&mut self, snap: &Snapshot) {
        let containers_changed = self.follow_runtimes();
        let active: BTreeSet<u64> = snap.deltas.iter().map(|d| d.key.cgroup_id).collect();
        let walk = self.registry.update(&active);
        let Some(c) = self.control.as_mut() else {
            return;
        };
        // Services follow new cgroups and containers: on the registry's walk, when a
        // runtime reports a change, or every 30 cycles for cgroups without I/O yet.
        let walk = walk.or_else(|| {
            (containers_changed || snap.cycle.is_multiple_of(30))
                .then(|| self.registry.hierarchy.scan())
        });
        if let Some(live) = walk {
            let paths: Vec<String> = live.into_values().collect();
            let registry = &self.registry;
            for e in c.refresh(
                &registry.hierarchy,
                &paths,
                &registry.containers,
                snap.cycle,
            ) {
                self.sink.emit(&e);
            }
        }
    }

    /// Measure: one `cgroup_stats` per cgroup with I/O; cgroups that are gone and idle
    /// leave every table (`cgroup_gone`). Returns the `cgroup_stats` written.
    fn measure(&mut self, snap: &Snapshot) -> Vec<Event> {
        for (key, count) in &snap.inflight_resets {
            let cgroup = self.registry.cgroup(key.cgroup_id);
            self.sink.emit(&Event::warning(
                "inflight_reset",
                format!(
                    "{count} request(s) counted in flight for cgroup {} ({}) on {} taken for completed unseen: no issue or completion for 30 s (the disk's own statistics could not tell sooner)",
                    cgroup.path.as_deref().unwrap_or("?"),
                    key.cgroup_id,
                    crate::identify::disks::dev_text(key.dev)
                ),
            ));
        }
        for key in &snap.evicted {
            self.metrics.forget_key(key);
        }
        let records = self.records(snap);
        for r in &records {
            self.sink.emit(r);
        }
        // Cgroups that are gone and saw no request this cycle: drop their keys so the maps
        // stay bounded. A stale in-flight count (an unseen completion) must not keep them.
        let mut idle_by_cgroup: BTreeMap<u64, bool> = BTreeMap::new();
        for d in &snap.deltas {
            let e = idle_by_cgroup.entry(d.key.cgroup_id).or_insert(true);
            *e &= !d.had_requests();
        }
        for (id, idle) in idle_by_cgroup {
            if idle && self.registry.is_gone(id) {
                let cgroup = self.registry.cgroup(id);
                self.collector.forget_cgroup(id);
                self.metrics.forget_cgroup(id);
                self.characters.forget(&id);
                self.registry.forget(id);
                self.sink.emit(&Event::CgroupGone(CgroupGone {
                    cycle: snap.cycle,
                    cgroup,
                }));
            }
        }
        records
    }

    /// Each disk with a key in the maps, sampled once: for the controller and cycle_end.
    fn sample_disks(&mut self, snap: &Snapshot) -> BTreeMap<u32, DiskSample> {
        let interval_s = snap.interval_ns as f64 / 1e9;
        let mut traced: BTreeMap<u32, u64> = BTreeMap::new();
        for d in &snap.deltas {
            *traced.entry(d.key.dev).or_default() += d.ios;
        }
        // Disks with completions this cycle, seen or not.
        self.coverage
            .after_maps(&traced)
            .into_iter()
            .map(|(dev, unseen_completions)| {
                let sample = DiskSample {
                    utilization: self.busy.utilization(
                        dev,
                        snap.cycle,
                        interval_s,
                        self.coverage.stat_before_maps(dev),
                    ),
                    unseen_completions,
                };
                (dev, sample)
            })
            .collect()
    }

    /// Decide, plan and enforce (with --config): the services' cycle (recorded as
    /// `policy_input`), the policy's decisions, and the limits written.
    fn decide_and_enforce(&mut self, snap: &Snapshot, busy: &BTreeMap<u32, DiskSample>) {
        let Some(c) = self.control.as_mut() else {
            return;
        };
        let registry = &self.registry;
        let cycles = c.device_cycles(
            snap,
            &|id| registry.path(id),
            &registry.containers,
            &|dev| busy.get(&dev).map_or(0.0, |s| s.utilization),
        );
        if let Some(input) = c.policy_input(snap.cycle, &cycles) {
            self.sink.emit(&input);
        }
        let disks = &mut self.disks;
        for e in c.step(&cycles, &mut |dev| disks.name(dev)) {
            self.sink.emit(&e);
        }
    }

    /// Emit: `cycle_end`, with what the cycle cost and lost.
    fn end_cycle(
        &mut self,
        snap: &Snapshot,
        busy: BTreeMap<u32, DiskSample>,
        cgroups: usize,
        started: Instant,
    ) {
        let interval_s = snap.interval_ns as f64 / 1e9;
        let disks = busy
            .into_iter()
            .map(|(dev, s)| DiskCycle {
                dev: crate::identify::disks::dev_text(dev),
                disk: self.disks.name(dev),
                utilization: s.utilization,
                unseen_completions: s.unseen_completions,
            })
            .collect();
        let programs = self.probe.program_stats();
        self.sink.emit(&Event::CycleEnd(CycleEnd {
            cycle: snap.cycle,
            interval_s,
            cgroups,
            tracked_keys: self.collector.tracked_keys(),
            evicted_keys: snap.evicted.len(),
            preexisting_completions: snap.preexisting_completions,
            map_full: snap.map_full,
            unsampled_requests: snap.unsampled,
            missed_events: programs.iter().map(|p| p.recursion_misses).sum(),
            untraced_completions: snap.untraced_completions,
            issue_map_timing: snap.issue_map_timing,
            insert_attached: self.probe.insert_attached(),
            issue_attached: self.probe.issue_attached(),
            collect_us: started.elapsed().as_micros() as u64,
            docker_containers: self
                .docker
                .as_ref()
                .map(|_| self.registry.containers.count(Runtime::Docker)),
            containerd_containers: self
                .containerd
                .as_ref()
                .map(|_| self.registry.containers.count(Runtime::Containerd)),
            events_dropped: self.sink.dropped(),
            disks,
            programs,
        }));
        self.sink.flush();
    }

    fn records(&mut self, snap: &Snapshot) -> Vec<Event> {
        let interval_s = snap.interval_ns as f64 / 1e9;
        // Every (cgroup, disk) with a key adds a cycle to its character window, idle or
        // not, so the window spans time.
        let mut counts: BTreeMap<(u64, u32), CharacterCounts> = BTreeMap::new();
        for d in &snap.deltas {
            counts
                .entry((d.key.cgroup_id, d.key.dev))
                .or_default()
                .add(&CharacterCounts::of_delta(d));
        }
        let mut characters: BTreeMap<(u64, u32), (Option<Character>, Option<Character>)> =
            BTreeMap::new();
        for ((id, dev), c) in counts {
            let (window, _) = self.characters.push(&id, dev, snap.cycle, c);
            characters.insert((id, dev), (window, c.character(1)));
        }
        // cgroup -> dev -> DeviceStats
        let mut by_cgroup: BTreeMap<u64, BTreeMap<u32, DeviceStats>> = BTreeMap::new();
        for d in &snap.deltas {
            let Some(stats) = self
                .metrics
                .observe(d, snap.interval_ns, snap.inflight_counted)
            else {
                continue;
            };
            let dev = by_cgroup
                .entry(d.key.cgroup_id)
                .or_default()
                .entry(d.key.dev)
                .or_insert_with(|| {
                    let (character, character_cycle) = characters
                        .get(&(d.key.cgroup_id, d.key.dev))
                        .cloned()
                        .unwrap_or_default();
                    DeviceStats {
                        dev: crate::identify::disks::dev_text(d.key.dev),
                        disk: self.disks.name(d.key.dev),
                        read: None,
                        write: None,
                        other: None,
                        character,
                        character_cycle,
                    }
                });
            match d.key.op {
                OP_READ => dev.read = Some(stats),
                OP_WRITE => dev.write = Some(stats),
                _ => dev.other = Some(stats),
            }
        }
        by_cgroup
            .into_iter()
            .map(|(id, devs)| {
                let devices: Vec<DeviceStats> = devs.into_values().collect();
                let sum = |f: &dyn Fn(&DeviceStats) -> u64| devices.iter().map(f).sum::<u64>();
                let read_bytes = sum(&|d| d.read.as_ref().map_or(0, |s| s.bytes));
                let write_bytes = sum(&|d| d.write.as_ref().map_or(0, |s| s.bytes));
                let ios = sum(&|d| {
                    [&d.read, &d.write, &d.other]
                        .iter()
                        .filter_map(|s| s.as_ref())
                        .map(|s| s.ios)
                        .sum()
                });
                Event::CgroupStats(CgroupStats {
                    cycle: snap.cycle,
                    interval_s,
                    cgroup: self.registry.cgroup(id),
                    totals: Totals {
                        read_bytes,
                        write_bytes,
                        read_mbps: read_bytes as f64 / interval_s / 1e6,
                        write_mbps: write_bytes as f64 / interval_s / 1e6,
                        iops: ios as f64 / interval_s,
                    },
                    devices,
                })
            })
            .collect()
    }

    /// Puts back every limit this agent wrote (where it still holds the agent's value), says
    /// `agent_stop`, and gives the output a moment to take the last events: an output that
    /// does not (a stalled reader) cannot keep the agent from stopping.
    pub fn stop(&mut self, reason: &str, cycles: u64) {
        if let Some(n) = self.notifier.as_mut() {
            n.stopping();
        }
        let restores = self
            .control
            .as_mut()
            .map(|c| c.restore_all("stop"))
            .unwrap_or_default();
        for e in &restores {
            self.sink.emit(e);
        }
        self.sink.emit(&Event::AgentStop(AgentStop {
            reason: reason.into(),
            cycles,
        }));
        if !self.sink.drain(OUTPUT_DRAIN_TIMEOUT) {
            tracing::warn!(
                "the event output did not take the last events within {}s; stopping anyway",
                OUTPUT_DRAIN_TIMEOUT.as_secs()
            );
            // What was put back must be said somewhere.
            for e in &restores {
                if let Event::Restore(r) = e {
                    tracing::warn!(file = %r.file, knob = %r.knob, value = %r.value, result = %r.result, "restore");
                }
            }
        }
    }
}

/// How long a stopping agent waits for its output.
const OUTPUT_DRAIN_TIMEOUT: Duration = Duration::from_secs(1);

/// Waits for the signal, or forever without one.
/// Says what attaching an optional program on demand did (`<what>_attached`, or
/// `<what>_attach_failed` with its consequence); returns whether it failed, so it is said
/// once and not retried every cycle.
/// A disk as one cycle sampled it.
struct DiskSample {
    utilization: f64,
    /// See DiskCoverage: None where the disk does not count its requests.
    unseen_completions: Option<u64>,
}

fn report_attach(
    sink: &mut NdjsonSink,
    result: Result<bool, crate::collect::probe::ProbeError>,
    what: &str,
    attached: &str,
    without: &str,
) -> bool {
    match result {
        Ok(true) => sink.emit(&Event::Warning(Notice {
            code: format!("{what}_attached"),
            message: attached.into(),
        })),
        Ok(false) => {}
        Err(e) => {
            sink.emit(&Event::Warning(Notice {
                code: format!("{what}_attach_failed"),
                message: format!("{e:#}; {without}"),
            }));
            return true;
        }
    }
    false
}

async fn next_signal(s: &mut Option<tokio::signal::unix::Signal>) {
    match s {
        Some(s) => {
            s.recv().await;
        }
        None => std::future::pending().await,
    }
}

/// Runs until SIGINT, SIGTERM or SIGQUIT; then restores, detaches and returns (exit 0).
/// SIGHUP reopens the --json file (logrotate) and the agent goes on: a daemon outlives the
/// terminal that started it, and its limits are never left behind by one closing.
pub async fn run(opts: RunOptions) -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut sigint = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    let mut sigquit = signal(SignalKind::quit()).context("installing SIGQUIT handler")?;
    let sighup = signal(SignalKind::hangup()).context("installing SIGHUP handler")?;
    let agent = Agent::start(&opts)?.notifying(Notifier::from_env());
    agent
        .run_until(
            opts.interval,
            async {
                tokio::select! {
                    _ = sigint.recv() => "SIGINT",
                    _ = sigterm.recv() => "SIGTERM",
                    _ = sigquit.recv() => "SIGQUIT",
                }
            },
            Some(sighup),
        )
        .await
}

impl Agent {
    /// Runs a cycle every `interval` until `stop` yields the reason; then restores what it
    /// wrote, says `agent_stop` and detaches the programs. `reopen` (SIGHUP) reopens the
    /// --json file. A panic in a cycle restores every limit and ends the agent with an
    /// error (a service manager restarts it); a failing cycle is an event, and it goes on.
    pub async fn run_until(
        mut self,
        interval: Duration,
        stop: impl std::future::Future<Output = &'static str>,
        mut reopen: Option<tokio::signal::unix::Signal>,
    ) -> Result<()> {
        tokio::pin!(stop);
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await; // the first tick is immediate
        self.announce_ready(interval);
        let mut cycles = 0u64;
        let reason = loop {
            tokio::select! {
                _ = tick.tick() => {
                    let cycle = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.cycle()));
                    match cycle {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => {
                            tracing::warn!(error = %format!("{e:#}"), "cycle failed");
                            self.sink.emit(&Event::Error(Notice { code: "cycle".into(), message: format!("{e:#}") }));
                        }
                        Err(panic) => {
                            let what = panic
                                .downcast_ref::<&str>()
                                .map(|s| s.to_string())
                                .or_else(|| panic.downcast_ref::<String>().cloned())
                                .unwrap_or_else(|| "unknown".into());
                            self.sink.emit(&Event::Error(Notice {
                                code: "panic".into(),
                                message: format!("the agent panicked in cycle {} ({what}); every limit it wrote is put back and it stops", cycles + 1),
                            }));
                            self.stop("panic", cycles);
                            if let Some(socket) = self.sink.take_socket() {
                                socket.shutdown().await;
                            }
                            bail!("panicked in cycle {} ({what}); limits restored; please report this bug", cycles + 1);
                        }
                    }
                    cycles += 1;
                    if let Some(n) = self.notifier.as_mut() {
                        n.alive();
                    }
                }
                _ = next_signal(&mut reopen) => {
                    self.sink.reopen();
                    self.sink.emit(&Event::Warning(Notice {
                        code: "reopened".into(),
                        message: "SIGHUP: the event file is reopened; the agent goes on (SIGTERM stops it)".into(),
                    }));
                }
                reason = &mut stop => break reason,
            }
        };
        self.stop(reason, cycles);
        if let Some(socket) = self.sink.take_socket() {
            socket.shutdown().await;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_flags_defaults() {
        let d = RunOptions::defaults().unwrap();
        assert_eq!(d.interval, Duration::from_secs(1));
        assert_eq!(d.policy, "adaptive");
        assert_eq!(
            d.socket,
            PathBuf::from(crate::events::stream::DEFAULT_SOCKET)
        );
        assert!(d.config.is_none() && !d.dry_run);
    }

    #[test]
    fn interval_bounds() {
        assert_eq!(parse_interval("1s").unwrap(), Duration::from_secs(1));
        assert_eq!(
            parse_interval("2500ms").unwrap(),
            Duration::from_millis(2500)
        );
        assert_eq!(parse_interval("10").unwrap(), Duration::from_secs(10));
        assert!(parse_interval("500ms").unwrap_err().contains("1s..10s"));
        assert!(parse_interval("11s").is_err());
        assert!(parse_interval("-1").is_err());
        assert!(parse_interval("fast")
            .unwrap_err()
            .contains("not a duration"));
        // Numbers Duration cannot hold, or that are not numbers: errors, never a panic.
        for s in ["1e20", "18446744073709551616", "1e-300", "1e400", "inf"] {
            assert!(parse_interval(s).unwrap_err().contains("1s..10s"), "{s}");
        }
        for s in ["-inf", "NaN", "-0.5"] {
            assert!(
                parse_interval(s).unwrap_err().contains("not a duration"),
                "{s}"
            );
        }
        assert!(parse_interval("18446744073709551616s").is_err());
    }

    #[test]
    fn ute_threshold_is_a_fraction() {
        assert_eq!(parse_fraction("0.75"), Ok(0.75));
        for s in ["0", "1", "NaN", "inf", "-0.5", "1e400", "x"] {
            assert!(
                parse_fraction(s).unwrap_err().contains("between 0 and 1"),
                "{s}"
            );
        }
    }

    mod props {
        use proptest::prelude::*;

        use super::super::{parse_fraction, parse_interval};

        proptest! {
            #![proptest_config(crate::proptest_budget(2000))]

            /// Any text: an interval in 1s..=10s or an error, never a panic.
            #[test]
            fn interval_of_any_text(s in any::<String>()) {
                if let Ok(d) = parse_interval(&s) {
                    prop_assert!(d.as_secs_f64() >= 1.0 && d.as_secs_f64() <= 10.0, "{s}: {d:?}");
                }
            }

            /// Numbers of every magnitude, bare or with a unit.
            #[test]
            fn interval_of_any_number(
                v in prop_oneof![any::<f64>(), 0.0..20.0f64, Just(f64::MAX), Just(u64::MAX as f64)],
                unit in prop::sample::select(vec!["", "s", "ms", "us", "ns", "m", "h", "y", "e3"]),
            ) {
                let s = format!("{v}{unit}");
                if let Ok(d) = parse_interval(&s) {
                    prop_assert!(d >= std::time::Duration::from_secs(1), "{s}");
                    prop_assert!(d <= std::time::Duration::from_secs(10), "{s}");
                }
            }

            #[test]
            fn fraction_of_any_text(s in prop_oneof![any::<String>(), any::<f64>().prop_map(|v| v.to_string())]) {
                if let Ok(v) = parse_fraction(&s) {
                    prop_assert!(v > 0.0 && v < 1.0, "{s}: {v}");
                }
            }
        }
    }
}
