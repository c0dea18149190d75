#!/usr/bin/env bash
# Installs everything isolator needs to build and test on a Debian machine that has
# rustup, cargo and apt. Idempotent: every step checks before it acts.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf 'bootstrap: %s\n' "$*" >&2; }

# Debian packages: fio and bpftrace for tests/benchmarks, qemu + busybox for the VM tests,
# losetup (mount) for loop devices.
PKGS=(fio bpftrace qemu-system-x86 busybox-static cpio zstd xz-utils kmod tmux mount docker.io)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  log "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Rust toolchains: stable (from rust-toolchain.toml) with the musl target for the static
# binary; nightly with rust-src to build the eBPF object (build-std for bpfel).
rustup show active-toolchain >/dev/null
rustup target add x86_64-unknown-linux-musl >/dev/null 2>&1 || rustup target add x86_64-unknown-linux-musl
rustup component add clippy rustfmt >/dev/null
# The nightly is pinned in isolator-ebpf/rust-toolchain.toml (bpf-linker loads its LLVM).
EBPF_NIGHTLY=$(sed -n 's/^channel = "\(.*\)"/\1/p' isolator-ebpf/rust-toolchain.toml)
rustup toolchain install "$EBPF_NIGHTLY" --profile minimal --component rust-src

# bpf-linker 0.10.3 links against the Rust toolchain's own LLVM (see DESIGN.md).
if ! bpf-linker --version 2>/dev/null | grep -q '0.10.3'; then
  log "cargo install bpf-linker@0.10.3"
  cargo +"$EBPF_NIGHTLY" install bpf-linker@0.10.3 --locked
fi

# Debian kernels for the VM tests (cgroup v2, other struct layouts). Downloaded and
# unpacked under target/, never installed into the host's /boot.
KDIR=target/vm-kernels
mkdir -p "$KDIR"
for meta in linux-image-amd64 linux-image-6.12-amd64; do
  pkg=$(apt-cache depends "$meta" | awk '/Depends: linux-image-/{print $2; exit}')
  [[ -n "$pkg" ]] || { log "cannot resolve $meta: run apt-get update"; exit 1; }
  if [[ ! -d "$KDIR/$pkg" ]]; then
    log "fetching $pkg"
    tmp=$(mktemp -d)
    (cd "$tmp" && apt-get download "$pkg" >/dev/null)
    dpkg-deb -x "$tmp"/*.deb "$KDIR/$pkg.partial"
    rm -rf "$tmp"
    mv "$KDIR/$pkg.partial" "$KDIR/$pkg"
  fi
done
log "ok"
