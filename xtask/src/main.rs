//! Developer tasks: `cargo xtask build` builds the static binaries (the eBPF object is
//! built and embedded by isolator-agent's build.rs); `cargo xtask image` makes the
//! container image from the static binary alone.
use std::{os::unix::fs::PermissionsExt, path::Path, process::Command};

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

/// The image's files: the static binary as /isolator, and the directories it writes (the
/// DaemonSet mounts the host's over them; see deploy/daemonset.yaml). Nothing else: no
/// shell, no libc, no package manager.
fn image_rootfs(bin: &Path, root: &Path) -> Result<()> {
    if root.exists() {
        std::fs::remove_dir_all(root).with_context(|| format!("removing {}", root.display()))?;
    }
    for (dir, mode) in [
        ("etc/isolator", 0o755),
        ("var/lib/isolator", 0o700),
        ("var/log/isolator", 0o700),
        ("run/isolator", 0o700),
        ("tmp", 0o1777),
    ] {
        let d = root.join(dir);
        std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(mode))?;
    }
    let dest = root.join("isolator");
    std::fs::copy(bin, &dest).with_context(|| format!("copying {}", bin.display()))?;
    std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// `cargo xtask image [--tag NAME] [--no-build] [--tar-only]`: a tar of the image's files
/// (target/image/isolator-rootfs.tar, owned by root, reproducible), `docker import`ed as
/// NAME (default isolator:VERSION) with /isolator as its entrypoint. No registry is needed:
/// the daemon is the one DOCKER_HOST names (or the default socket).
fn image(args: &[String]) -> Result<()> {
    let mut tag = format!("isolator:{}", env!("CARGO_PKG_VERSION"));
    let (mut no_build, mut tar_only) = (false, false);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--tag" => tag = it.next().context("--tag needs a NAME")?.clone(),
            "--no-build" => no_build = true,
            "--tar-only" => tar_only = true,
            other => bail!(
                "unknown argument '{other}'; usage: cargo xtask image [--tag NAME] [--no-build] [--tar-only]"
            ),
        }
    }
    if !no_build {
        build()?;
    }
    let bin = Path::new("target").join(MUSL).join("release/isolator");
    if !bin.exists() {
        bail!("{} is missing; run cargo xtask build", bin.display());
    }
    let dir = Path::new("target/image");
    let root = dir.join("rootfs");
    image_rootfs(&bin, &root)?;
    let tar = dir.join("isolator-rootfs.tar");
    let status = Command::new("tar")
        .args([
            "--sort=name",
            "--owner=0",
            "--group=0",
            "--numeric-owner",
            "--mtime=@0",
        ])
        .arg("-C")
        .arg(&root)
        .arg("-cf")
        .arg(&tar)
        .arg(".")
        .status()
        .context("running tar")?;
    if !status.success() {
        bail!("tar of {} failed", root.display());
    }
    println!("built {}", tar.display());
    if tar_only {
        return Ok(());
    }
    let status = Command::new("docker")
        .arg("import")
        .args(["--change", r#"ENTRYPOINT ["/isolator"]"#])
        .args(["--change", r#"CMD ["run"]"#])
        .args([
            "--change",
            &format!(
                "LABEL org.opencontainers.image.title=isolator org.opencontainers.image.version={}",
                env!("CARGO_PKG_VERSION")
            ),
        ])
        .arg(&tar)
        .arg(&tag)
        .status()
        .context("running docker import (is docker installed?)")?;
    if !status.success() {
        bail!("docker import of {} as {tag} failed (is dockerd running? DOCKER_HOST names the daemon)", tar.display());
    }
    println!("imported {tag}");
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("build") => build(),
        Some("image") => image(&args[1..]),
        _ => bail!(
            "usage: cargo xtask build | cargo xtask image [--tag NAME] [--no-build] [--tar-only]"
        ),
    }
}
