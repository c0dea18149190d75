use std::{path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand};
use isolator::{
    advise, agent, check,
    collect::probe::DEFAULT_BTF,
    enforcer::{Enforcer, HostLock, Journal, DEFAULT_JOURNAL_DIR},
    identify::cgroupfs::IoHierarchy,
    replay,
    top::{self, TopOptions},
};

#[derive(Parser)]
#[command(
    name = "isolator",
    version,
    about = "Per-cgroup block I/O latency and throughput, measured with eBPF and kept within SLOs"
)]
struct Cli {
    /// Log level for diagnostics on stderr (error, warn, info, debug, trace).
    #[arg(long, global = true, default_value = "warn")]
    log_level: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the agent: one NDJSON record per active cgroup per cycle; with --config it also
    /// keeps the configured services within their SLOs.
    Run(agent::RunOptions),
    /// Put back every limit a previous agent wrote (from its journal).
    Restore {
        #[arg(long, value_name = "DIR", default_value = DEFAULT_JOURNAL_DIR)]
        journal_dir: PathBuf,
    },
    /// A top-like view of every service's I/O, SLO state and the agent's actions (reads
    /// the running agent's --socket; without an agent it collects, observe-only, itself).
    Top(TopOptions),
    /// Check that this host can run the agent; each failing item says what to do.
    Check {
        #[arg(long, value_name = "PATH", default_value = DEFAULT_BTF)]
        btf: PathBuf,
    },
    /// Run a policy again over a recorded run (--json of 'isolator run --config') and say
    /// where its decisions differ from the recorded ones (another --policy or --slo: what
    /// the agent would have done).
    Replay(replay::ReplayOptions),
    /// Which services hurt each other on a disk, learned from a recorded (or piped live)
    /// event stream, and, with --jobs, batches of jobs per disk that interfere least.
    Advise(advise::command::AdviseOptions),
}

/// clap's errors span several lines; the operator gets one: the cause and the fix.
fn one_line_usage_error(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let first = lines.next().unwrap_or("error: bad arguments").to_string();
    let tip = lines
        .find_map(|l| l.strip_prefix("tip: "))
        .map(|t| format!("; {t}"))
        .unwrap_or_default();
    format!("{first}{tip}; see 'isolator --help'")
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind::*;
            if matches!(
                e.kind(),
                DisplayHelp | DisplayVersion | DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                let _ = e.print();
                return if e.kind() == DisplayHelpOnMissingArgumentOrSubcommand {
                    ExitCode::from(2)
                } else {
                    ExitCode::SUCCESS
                };
            }
            eprintln!("{}", one_line_usage_error(&e));
            return ExitCode::from(2);
        }
    };
    // `top` owns the terminal: no log lines on it. Logs go through a thread of their own
    // and are dropped rather than waited for: a stderr nobody reads (a full pipe, a
    // terminal stopped with Ctrl-S) must not hold up a cycle. The guard flushes them at
    // exit, for at most about a second.
    let mut _log_flush = None;
    if !matches!(cli.command, Command::Top(_)) {
        let filter = tracing_subscriber::EnvFilter::try_new(&cli.log_level)
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
        use std::io::IsTerminal;
        // Logs are rare: 1,024 queued lines is plenty, and the queue is allocated whole
        // (the default, 128,000, cost 4 MiB of RSS).
        let (stderr, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
            .buffered_lines_limit(1024)
            .lossy(true)
            .finish(std::io::stderr());
        _log_flush = Some(guard);
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_ansi(std::io::stderr().is_terminal())
            .with_writer(stderr)
            .init();
    }

    let result = match cli.command {
        Command::Run(opts) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)
            .and_then(|rt| rt.block_on(agent::run(opts))),
        Command::Top(opts) => top::run(opts),
        Command::Replay(opts) => replay::run(&opts).map(|report| print!("{report}")),
        Command::Advise(opts) => advise::command::run(&opts).map(|report| print!("{report}")),
        Command::Restore { journal_dir } => restore(&journal_dir),
        Command::Check { btf } => {
            let items = check::run_checks(&btf);
            print!("{}", check::render(&items));
            if items.iter().any(|i| i.status == check::Status::Fail) {
                return ExitCode::FAILURE;
            }
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let msg = format!("{e:#}").replace('\n', " ");
            eprintln!("error: {msg}");
            ExitCode::FAILURE
        }
    }
}

/// `isolator restore`: one line per knob put back (where it still holds what the agent
/// wrote). Refused while an agent enforces: its limits are its own to put back.
fn restore(dir: &std::path::Path) -> anyhow::Result<()> {
    if !dir.join("journal.json").exists() {
        println!("nothing to restore: no journal in {}", dir.display());
        return Ok(());
    }
    let hierarchy = IoHierarchy::detect()?;
    let lock = HostLock::acquire(&hierarchy.root).map_err(|e| {
        anyhow::anyhow!("{e}; stop the running agent, which restores its limits itself")
    })?;
    let mut enforcer = Enforcer::new(hierarchy, Some(Journal::open(dir)?)).with_host_lock(lock);
    let results = enforcer.recover()?;
    let mut failed = 0;
    for r in &results {
        let now = r
            .current
            .as_deref()
            .map(|c| format!(", left at {c}"))
            .unwrap_or_default();
        println!("{}: {} -> {} ({}{now})", r.file, r.knob, r.value, r.result);
        failed += r.result.starts_with("failed") as usize;
    }
    if failed > 0 {
        anyhow::bail!(
            "{failed} knob(s) could not be restored and stay in {}/journal.json; fix the cause and run 'isolator restore' again",
            dir.display()
        );
    }
    Ok(())
}
