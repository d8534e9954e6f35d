# Sourced by the scripts that count instructions under valgrind: installs valgrind
# (Debian package) if it is missing.
#
#   source scripts/valgrind.sh

if ! command -v valgrind >/dev/null 2>&1; then
  echo "==> installing valgrind (Debian package)"
  sudo=""
  if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
  $sudo apt-get install -y -q valgrind >/dev/null
fi
