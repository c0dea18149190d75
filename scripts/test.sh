#!/usr/bin/env bash
# The whole test suite: installs what is missing, checks formatting and lints, builds the
# static binaries, runs unit tests and the root integration tests (real eBPF, cgroups,
# disk I/O, qemu VMs). Needs root. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

bash scripts/bootstrap.sh

echo "== fmt"
cargo fmt --all -- --check
rustfmt --edition 2021 --check isolator-ebpf/src/main.rs

echo "== clippy"
cargo clippy --all-targets -- -D warnings

echo "== build (static)"
cargo xtask build

echo "== tests"
# Serial: the integration tests measure the same disk and must not disturb each other.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
cargo test --release --workspace --no-fail-fast -- --test-threads=1 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
passed=$(grep -Eo '^test result: .* ([0-9]+) passed' "$log" | grep -Eo '[0-9]+ passed' | awk '{s+=$1} END {print s+0}')
failed=$(grep -Eo '[0-9]+ failed' "$log" | awk '{s+=$1} END {print s+0}')
echo
echo "isolator: ${passed} passed, ${failed} failed"
exit "$rc"
