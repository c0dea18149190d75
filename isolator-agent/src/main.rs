use std::{path::PathBuf, process::ExitCode, time::Duration};

use clap::{Parser, Subcommand};
use isolator::{agent, check, probe::DEFAULT_BTF};

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
    },
    /// Check that this host can run the agent; each failing item says what to do.
    Check {
        #[arg(long, value_name = "PATH", default_value = DEFAULT_BTF)]
        btf: PathBuf,
    },
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
        } => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)
            .and_then(|rt| {
                rt.block_on(agent::run(agent::RunOptions {
                    interval,
                    json,
                    btf,
                }))
            }),
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
