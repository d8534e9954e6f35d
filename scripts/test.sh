#!/usr/bin/env bash
# Runs every check and every test of tollgate, as CI does.
#
# Installs redis-server and redis-tools from the Debian packages when they are missing;
# the tests spawn their own Redis servers and a 3-node Redis Cluster on free loopback
# ports, so nothing needs to be running beforehand. Installs chromium the same way, for
# the browser check of the simulate report, and python3-grpcio for the stock gRPC client.
set -euo pipefail
cd "$(dirname "$0")/.."

# No incremental caches in a one-shot run: they only take disk.
export CARGO_INCREMENTAL=0

step() { printf '\n==> %s\n' "$*"; }

# Every cargo command's stderr is shown as usual and read: a `warning:` line fails the run.
# Cargo's own warnings (an output filename collision, an unused manifest key, ...) change
# no exit status, and some of them are to become errors in later releases; compiler lints
# are errors already (clippy's -D warnings), so this catches what nothing else does.
export CARGO_TERM_COLOR=never
cargo() {
  local log status=0
  log="$(mktemp)"
  # stderr through tee (kept in $log), stdout untouched; pipefail gives cargo's status.
  { command cargo "$@" 2>&1 1>&3 3>&- | tee "$log" >&2; } 3>&1 || status=$?
  if [ "$status" -eq 0 ] && grep -q '^warning' "$log"; then
    printf '\nerror: `cargo %s` printed warnings, which fail CI:\n' "$*" >&2
    grep '^warning' "$log" >&2
    status=1
  fi
  rm -f "$log"
  return "$status"
}

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
  step "installing redis-server and redis-tools (Debian packages)"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends redis-server redis-tools
fi
redis-server --version

# The browser check of the simulate report (tests/report_browser.rs) needs Chromium.
if ! command -v chromium >/dev/null 2>&1; then
  step "installing chromium (Debian package)"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends chromium
fi

# tests/grpc_streams.rs checks gRPC stream limits with a stock gRPC client: grpcio, gRPC's
# own (C core) client, from Python (tests/support/grpc_stock_client.py).
if ! /usr/bin/python3 -c 'import grpc' >/dev/null 2>&1; then
  step "installing python3-grpcio (Debian package: the stock gRPC client)"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends python3-grpcio
fi

# tests/dashboards.rs starts its own Prometheus on a free loopback port and runs promtool.
# The package's service is not needed (and not started where policy-rc.d forbids it).
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
  step "installing prometheus (Debian package: prometheus and promtool)"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends prometheus
fi
prometheus --version 2>&1 | sed -n 1p

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy, warnings are errors: all features (with the benchmarks), default features, no default features"
cargo clippy --workspace --all-targets --all-features -- -D warnings
cargo clippy --workspace --all-targets -- -D warnings
cargo clippy -p tollgate -p tollgate-tests --all-targets --no-default-features -- -D warnings

step "cargo doc, no broken links: all features, default features, no default features"
RUSTDOCFLAGS="-D warnings" cargo doc -p tollgate --no-deps --all-features
RUSTDOCFLAGS="-D warnings" cargo doc -p tollgate --no-deps
RUSTDOCFLAGS="-D warnings" cargo doc -p tollgate --no-deps --no-default-features

step "each feature on its own"
cargo check -p tollgate --no-default-features
cargo check -p tollgate --no-default-features --features axum
cargo check -p tollgate --no-default-features --features redis
cargo check -p tollgate --no-default-features --features redis-cluster
cargo check -p tollgate --no-default-features --features redis-sentinel
cargo check -p tollgate --no-default-features --features redis-tls
cargo check -p tollgate --no-default-features --features metrics
cargo check -p tollgate --no-default-features --features grpc
cargo check -p tollgate --no-default-features --features audit-sql
cargo check -p tollgate --no-default-features --features rules-sql
cargo check -p tollgate --no-default-features --features rules
cargo check -p tollgate --no-default-features --features calendar
cargo check -p tollgate --no-default-features --features testing
cargo check -p tollgate --no-default-features --features ws

step "build every target (the benchmarks and comparisons of benches/ too)"
cargo build --workspace --all-targets --all-features

step "tests and doctests (all features: real Redis servers and a Redis Cluster)"
cargo test --workspace --all-features

step "tests with default features"
cargo test --workspace

echo
echo "all checks passed"
