//! Builds the eBPF object (isolator-ebpf, its own nightly workspace) and hands its path to
//! the agent, which embeds it with include_bytes!.
use std::{env, fs, path::PathBuf, process::Command};

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let ebpf_dir = manifest.join("../isolator-ebpf");
    let common_dir = manifest.join("../isolator-common");
    for p in [
        "src",
        "Cargo.toml",
        "rust-toolchain.toml",
        ".cargo/config.toml",
    ] {
        println!("cargo:rerun-if-changed={}", ebpf_dir.join(p).display());
    }
    println!(
        "cargo:rerun-if-changed={}",
        common_dir.join("src").display()
    );
    println!("cargo:rerun-if-env-changed=ISOLATOR_EBPF_OBJ");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("isolator.bpf.o");

    if let Ok(prebuilt) = env::var("ISOLATOR_EBPF_OBJ") {
        fs::copy(&prebuilt, &out).unwrap_or_else(|e| panic!("copy {prebuilt}: {e}"));
        return;
    }

    let toolchain_file = fs::read_to_string(ebpf_dir.join("rust-toolchain.toml"))
        .expect("isolator-ebpf/rust-toolchain.toml");
    let channel = toolchain_file
        .lines()
        .find_map(|l| l.trim().strip_prefix("channel = "))
        .map(|s| s.trim_matches('"').to_string())
        .expect("channel in isolator-ebpf/rust-toolchain.toml");
    let target_dir = manifest.join("../target/ebpf");

    let mut cmd = Command::new("rustup");
    cmd.args([
        "run",
        &channel,
        "cargo",
        "build",
        "--release",
        "--target-dir",
    ])
    .arg(&target_dir)
    .current_dir(&ebpf_dir);
    // The outer cargo's environment (toolchain, wrappers, flags, target) must not leak
    // into the nested bpf build.
    for (k, _) in env::vars() {
        let keep = k == "CARGO_HOME" || k == "RUSTUP_HOME";
        if !keep
            && (k.starts_with("CARGO")
                || k.starts_with("RUSTC")
                || k.starts_with("RUSTFLAGS")
                || k == "RUSTUP_TOOLCHAIN"
                || k == "RUSTDOC"
                || k == "TARGET"
                || k == "HOST"
                || k == "OUT_DIR"
                || k == "PROFILE"
                || k == "OPT_LEVEL"
                || k == "DEBUG"
                || k == "NUM_JOBS")
        {
            cmd.env_remove(&k);
        }
    }
    let status = cmd.status().unwrap_or_else(|e| {
        panic!("cannot run rustup to build the eBPF object ({e}); run scripts/bootstrap.sh")
    });
    if !status.success() {
        panic!("building isolator-ebpf failed; run scripts/bootstrap.sh (nightly {channel} with rust-src, bpf-linker 0.10.3)");
    }
    let obj = target_dir.join("bpfel-unknown-none/release/isolator");
    fs::copy(&obj, &out).unwrap_or_else(|e| panic!("copy {}: {e}", obj.display()));
}
