#!/usr/bin/env bash
# Installs everything isolator needs to build and test on a Debian machine that has
# rustup, cargo and apt. Idempotent: every step checks before it acts.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf 'bootstrap: %s\n' "$*" >&2; }

# Debian packages: fio and bpftrace for tests/benchmarks, qemu + busybox for the VM tests,
# losetup (mount) for loop devices, dockerd and containerd (with ctr) for the container
# tests, protoc for the build (containerd-client compiles containerd's API protos),
# prometheus (with promtool) and curl for the metrics test, which starts its own Prometheus,
# systemd-analyze (systemd) to verify the unit, capsh (libcap2-bin) for the deploy tests'
# capability masks, postgresql (the server, psql, pgbench and the postgres user) for the
# database scenario, which makes its own throwaway cluster.
PKGS=(fio bpftrace qemu-system-x86 busybox-static cpio zstd xz-utils kmod tmux mount docker.io
  containerd protobuf-compiler prometheus curl systemd libcap2-bin postgresql)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  log "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # Some of these start a daemon from their postinst (prometheus, docker.io, containerd)
  # through invoke-rc.d, which asks policy-rc.d: "101" (action forbidden) for the install,
  # so none is left running; the tests start their own. Any policy-rc.d already there is
  # put back afterwards.
  POLICY=/usr/sbin/policy-rc.d
  saved=""
  if [[ -e "$POLICY" ]]; then
    saved=$(mktemp)
    cp -p "$POLICY" "$saved"
  fi
  restore_policy() {
    if [[ -n "$saved" ]]; then mv -f "$saved" "$POLICY"; else rm -f "$POLICY"; fi
  }
  trap restore_policy EXIT
  printf '#!/bin/sh\nexit 101\n' >"$POLICY"
  chmod 755 "$POLICY"
  # postgresql's postinst also creates a `main` cluster on a first install (policy-rc.d
  # keeps it stopped; the service would start it at the next boot). The clusters this
  # install made are dropped below; any that were there before are left alone.
  clusters() { if command -v pg_lsclusters >/dev/null; then pg_lsclusters -h | awk '{print $1, $2}'; fi; }
  clusters_before=$(clusters)
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  restore_policy
  trap - EXIT
  while read -r version cluster; do
    [[ -n "$version" ]] || continue
    grep -qxF "$version $cluster" <<<"$clusters_before" && continue
    log "pg_dropcluster --stop $version $cluster (made by the postgresql install; the tests make their own)"
    pg_dropcluster --stop "$version" "$cluster"
  done <<<"$(clusters)"
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

# Debian 11's 5.10 kernel. bullseye is not in the host's apt sources and is never added:
# a private apt state under target/ (own sources.list, lists, cache, empty dpkg status so
# the host's installed packages don't affect the candidate) resolves and downloads it;
# signatures are checked against the host's debian-archive-keyring. Fetched once.
if ! compgen -G "$KDIR/linux-image-5.10.0-*-amd64/" >/dev/null; then
  ADIR=$PWD/target/apt-bullseye
  KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
  mkdir -p "$ADIR/lists/partial" "$ADIR/cache"
  : >"$ADIR/status"
  {
    echo "deb [arch=amd64 signed-by=$KEYRING] http://deb.debian.org/debian bullseye main"
    echo "deb [arch=amd64 signed-by=$KEYRING] http://deb.debian.org/debian bullseye-updates main"
    echo "deb [arch=amd64 signed-by=$KEYRING] http://deb.debian.org/debian-security bullseye-security main"
  } >"$ADIR/sources.list"
  BAPT=(-o Dir::Etc::SourceList="$ADIR/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o Dir::Etc::Preferences=/dev/null -o Dir::Etc::PreferencesParts=/dev/null
    -o Dir::State::Lists="$ADIR/lists" -o Dir::State::status="$ADIR/status"
    -o Dir::Cache="$ADIR/cache" -o Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false)
  apt-get "${BAPT[@]}" -qq --error-on=any update >"$ADIR/update.log" 2>&1 ||
    { log "cannot fetch bullseye package lists from deb.debian.org (see target/apt-bullseye/update.log)"; exit 1; }
  pkg=$(apt-cache "${BAPT[@]}" depends linux-image-amd64 | awk '/Depends: linux-image-5\.10\.0-/{print $2; exit}')
  [[ -n "$pkg" ]] || { log "cannot resolve bullseye linux-image-amd64 to a 5.10 kernel"; exit 1; }
  log "fetching $pkg"
  rm -rf "$ADIR/download" "$KDIR/$pkg.partial"
  mkdir -p "$ADIR/download"
  # _apt cannot write the root-owned download dir: fetch as root (no "unsandboxed" warning).
  (cd "$ADIR/download" && apt-get "${BAPT[@]}" -o APT::Sandbox::User=root -qq download "$pkg" \
    >"$ADIR/download.log" 2>&1) ||
    { log "cannot download $pkg from deb.debian.org (see target/apt-bullseye/download.log)"; exit 1; }
  dpkg-deb -x "$ADIR/download"/*.deb "$KDIR/$pkg.partial"
  rm -rf "$ADIR/download"
  mv "$KDIR/$pkg.partial" "$KDIR/$pkg"
fi
log "ok"
