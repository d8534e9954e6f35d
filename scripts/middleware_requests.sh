# Sourced by scripts/middleware_count.sh and scripts/middleware_profile.sh: installs
# valgrind (Debian package) if it is missing and builds the middleware benchmark's routers
# (bench/src/bin/middleware_requests.rs), setting $bin to the binary.
#
#   source scripts/middleware_requests.sh   # sets $bin

if ! command -v valgrind >/dev/null 2>&1; then
  echo "==> installing valgrind (Debian package)"
  sudo=""
  if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
  $sudo apt-get install -y -q valgrind >/dev/null
fi

cargo build -q -p tollgate-bench --release --bin middleware_requests
bin="${CARGO_TARGET_DIR:-target}/release/middleware_requests"
