//! Developer tasks: `cargo xtask build` builds the static binaries (the eBPF object is
//! built and embedded by isolator-agent's build.rs).
use std::process::Command;

use anyhow::{bail, Context, Result};

pub const MUSL: &str = "x86_64-unknown-linux-musl";

fn cargo(args: &[&str]) -> Result<()> {
    let status = Command::new("cargo")
        .args(args)
        .status()
        .with_context(|| format!("running cargo {}", args.join(" ")))?;
    if !status.success() {
        bail!("cargo {} failed", args.join(" "));
    }
    Ok(())
}

fn build() -> Result<()> {
    cargo(&[
        "build",
        "--release",
        "--target",
        MUSL,
        "-p",
        "isolator-agent",
        "-p",
        "isolator-loadgen",
    ])?;
    for bin in ["isolator", "isolator-loadgen"] {
        let path = format!("target/{MUSL}/release/{bin}");
        let out = Command::new("ldd").arg(&path).output();
        // ldd prints "not a dynamic executable" (or "statically linked") for static files.
        if let Ok(o) = out {
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
            if !(text.contains("not a dynamic executable") || text.contains("statically linked")) {
                bail!("{path} is not static: {text}");
            }
        }
        println!("built {path}");
    }
    Ok(())
}

fn main() -> Result<()> {
    match std::env::args().nth(1).as_deref() {
        Some("build") => build(),
        _ => bail!("usage: cargo xtask build"),
    }
}
