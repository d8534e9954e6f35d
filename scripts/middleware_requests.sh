# Sourced by scripts/middleware_count.sh and scripts/middleware_profile.sh: installs
# valgrind (scripts/valgrind.sh) if it is missing and builds the middleware benchmark's routers
# (benches/src/bin/middleware_requests.rs), setting $bin to the binary.
#
#   source scripts/middleware_requests.sh   # sets $bin

source scripts/valgrind.sh

cargo build -q -p tollgate-bench --release --bin middleware_requests
bin="${CARGO_TARGET_DIR:-target}/release/middleware_requests"
