# Sourced by the scripts that count instructions under valgrind: installs valgrind
# (Debian package) if it is missing, and defines `instructions CASE N`, the instructions
# cachegrind counts for one run of "$bin" CASE N (the run's failure ends the script).
#
#   source scripts/valgrind.sh

if ! command -v valgrind >/dev/null 2>&1; then
  echo "==> installing valgrind (Debian package)"
  sudo=""
  if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
  $sudo apt-get install -y -q valgrind >/dev/null
fi

instructions() {
  local out count
  out=$(valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file=/dev/null "$bin" "$1" "$2" 2>&1) || {
    echo "$1: the run failed:" >&2
    echo "$out" >&2
    exit 1
  }
  count=$(awk '/I *refs:/ { gsub(",", "", $NF); print $NF }' <<<"$out")
  if [ -z "$count" ]; then
    echo "$1: no instruction count in valgrind's output" >&2
    exit 1
  fi
  echo "$count"
}
