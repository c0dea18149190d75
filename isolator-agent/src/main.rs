use std::{path::PathBuf, process::ExitCode, time::Duration};

use clap::{Parser, Subcommand};
use isolator::{
    agent, check,
    enforcer::{Journal, DEFAULT_JOURNAL_DIR},
    policy::POLICY_NAMES,
    probe::DEFAULT_BTF,
};

#[derive(Parser)]
#[command(
    name = "isolator",
    version,
    about = "Per-cgroup block I/O latency and throughput, measured with eBPF"
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
    /// Run the agent: one NDJSON record per active cgroup per cycle.
    Run {
        /// Cycle length, 1s to 10s (e.g. 1s, 2500ms, 5).
        #[arg(long, default_value = "1s", value_parser = parse_interval)]
        interval: Duration,
        /// Append events to this file instead of stdout.
        #[arg(long, value_name = "PATH")]
        json: Option<PathBuf>,
        /// Kernel BTF to resolve struct offsets from.
        #[arg(long, value_name = "PATH", default_value = DEFAULT_BTF)]
        btf: PathBuf,
        /// Services and SLOs (TOML, see docs/config.md); without it the agent only observes.
        #[arg(long, value_name = "PATH")]
        config: Option<PathBuf>,
        /// Control policy.
        #[arg(long, default_value = "adaptive", value_parser = clap::builder::PossibleValuesParser::new(POLICY_NAMES))]
        policy: String,
        /// Device utilization above which the `ute` policy throttles (0..1).
        #[arg(long, default_value_t = 0.75, value_parser = parse_fraction)]
        ute_threshold: f64,
        /// Compute and report every action without writing any limit.
        #[arg(long)]
        dry_run: bool,
        /// Where the journal of original limit values lives.
        #[arg(long, value_name = "DIR", default_value = DEFAULT_JOURNAL_DIR)]
        journal_dir: PathBuf,
    },
    /// Put back every limit a previous agent wrote (from its journal).
    Restore {
        #[arg(long, value_name = "DIR", default_value = DEFAULT_JOURNAL_DIR)]
        journal_dir: PathBuf,
    },
    /// Check that this host can run the agent; each failing item says what to do.
    Check {
        #[arg(long, value_name = "PATH", default_value = DEFAULT_BTF)]
        btf: PathBuf,
    },
}

fn parse_fraction(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v < 1.0 => Ok(v),
        _ => Err(format!(
            "'{s}' is not a fraction between 0 and 1; use e.g. 0.75"
        )),
    }
}

fn parse_interval(s: &str) -> Result<Duration, String> {
    let d = if let Ok(secs) = s.parse::<f64>() {
        if !secs.is_finite() || secs < 0.0 {
            return Err(format!("'{s}' is not a duration; use e.g. 1s or 2500ms"));
        }
        Duration::from_secs_f64(secs)
    } else {
        humantime::parse_duration(s)
            .map_err(|_| format!("'{s}' is not a duration; use e.g. 1s or 2500ms"))?
    };
    if d < Duration::from_secs(1) || d > Duration::from_secs(10) {
        return Err(format!(
            "{s} is outside the allowed 1s..10s; pick a cycle between 1s and 10s"
        ));
    }
    Ok(d)
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
    let filter = tracing_subscriber::EnvFilter::try_new(&cli.log_level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();

    let result = match cli.command {
        Command::Run {
            interval,
            json,
            btf,
            config,
            policy,
            ute_threshold,
            dry_run,
            journal_dir,
        } => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)
            .and_then(|rt| {
                rt.block_on(agent::run(agent::RunOptions {
                    interval,
                    json,
                    btf,
                    config,
                    policy,
                    ute_threshold,
                    dry_run,
                    journal_dir,
                }))
            }),
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

/// `isolator restore`: one line per knob put back.
fn restore(dir: &std::path::Path) -> anyhow::Result<()> {
    if !dir.join("journal.json").exists() {
        println!("nothing to restore: no journal in {}", dir.display());
        return Ok(());
    }
    let mut j = Journal::open(dir)?;
    let results = j.recover()?;
    let mut failed = 0;
    for r in &results {
        println!("{}: {} -> {} ({})", r.file, r.knob, r.value, r.result);
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

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}
